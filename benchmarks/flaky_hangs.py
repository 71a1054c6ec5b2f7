"""Flakiness check for chapter 03: each reproduction N times in a row must give the same verdict.

For every hang case of ``helpers/scenarios/hangs.py`` the verdict is (diverged ranks, the
collective the others wait in, its sequence number); for the cases that end on their own it
is (ok, failed ranks).  Prints one line per case with the distinct verdicts seen; exits 1
if any case gave more than one.

Run: ``.venv/bin/python benchmarks/flaky_hangs.py --repeats 10`` (about 10 minutes on 2 cores).
"""

from __future__ import annotations

import argparse
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import doctor, jobs  # noqa: E402

HANGS = jobs.project_root() / "helpers" / "scenarios" / "hangs.py"
TIMEOUT_S, STALL_S = 6, 3  # chapter 03's parameters cell
# (case, mode, nproc, stall_s, extra env) as chapter 03 runs them.  Here one at a time; the chapter runs
# each section's cases side by side (jobs.run_together), which benchmarks/flaky_notebooks.py checks.
CASES = [("mismatch", "bug", 2, STALL_S, None), ("mismatch", "bug", 2, None, {"TORCH_DISTRIBUTED_DEBUG": "DETAIL"}),
         ("crash", "bug", 2, STALL_S, None), ("stuck", "bug", 2, STALL_S, None), ("rank0_save", "bug", 4, STALL_S, None),
         ("rank0_save", "fix", 4, STALL_S, None), ("uneven", "bug", 3, STALL_S, None), ("uneven", "fix", 3, STALL_S, None),
         ("slow_eval", "bug", 2, 2.5, None), ("ckpt_read", "bug", 2, None, None), ("ckpt_read", "fix", 2, None, None)]


def verdict(case: str, mode: str, nproc: int, stall_s: float | None, env: dict | None) -> tuple:
    """Run one case once and reduce its outcome to a comparable tuple."""
    r = jobs.run_job(HANGS, ["--case", case, "--mode", mode, "--timeout-s", str(TIMEOUT_S), "--trace"], nproc=nproc,
                     timeout_s=60, stall_s=stall_s, heartbeat=r"step \d+", env=env, verbose=False)
    if r.hung:
        v = doctor.diagnose_job(r)
        return ("hung", tuple(v.diverged), v.collective, v.seq)
    # What chapter 03 asserts: who failed, the rank that raised (crash, ckpt_read) and, under
    # DETAIL, the mismatch text.  Which rank reports a DETAIL mismatch first is a race the
    # chapter does not assert on, so it is not part of the verdict.
    first = r.first_failure.rank if r.first_failure and case in ("crash", "ckpt_read") else None
    detail = any("OpType=ALLREDUCE" in line and "OpType=BROADCAST" in line
                 for line in r.grep("Detected mismatch between collectives"))
    return ("ended", r.ok, tuple(r.failed_ranks), first, detail)


def main() -> int:
    """Run every case ``--repeats`` times; print the verdicts; exit 1 on any disagreement."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--cases", default="", help="comma-separated case/mode labels to run (default: all)")
    args = parser.parse_args()
    flaky = 0
    t0 = time.monotonic()
    chosen = [c for c in CASES if not args.cases or f"{c[0]}/{c[1]}" + (" DETAIL" if c[4] else "")
              in args.cases.split(",")]
    for case in chosen:
        seen = Counter(verdict(*case) for _ in range(args.repeats))
        flaky += len(seen) > 1
        label = f"{case[0]}/{case[1]}" + (" DETAIL" if case[4] else "")
        print(f"{'FLAKY' if len(seen) > 1 else 'same '} {label:22s} {dict(seen)}", flush=True)
    print(f"{len(chosen) - flaky}/{len(chosen)} cases gave one verdict in {args.repeats} runs "
          f"({time.monotonic() - t0:.0f} s)")
    return 1 if flaky else 0


if __name__ == "__main__":
    sys.exit(main())
