"""Flakiness check for chapter 03: each reproduction N times in a row must give the same verdict.

For every hang case of ``helpers/scenarios/hangs.py`` the verdict is (diverged ranks, the
collective the others wait in, its sequence number); for the cases that end on their own it
is (ok, failed ranks).  Prints one line per case with the distinct verdicts seen; exits 1
if any case gave more than one.

Flight Recorder (issue 13): ``--set fr`` runs, without ``--trace``, the two-rank versions of the hangs and the
eight hangs of ``helpers/scenarios/issue_hangs.py`` (2-4 ranks, from public issues); each verdict is (diverged
ranks from the Flight Recorder alone, from dumps + stacks) and must equal the expected rank(s): a wrong verdict
counts like a flaky one.  ``--set all`` runs both sets.

Two-rank ties (issue 26): ``--set ties`` runs the two-rank version of every hang: chapter 03's (``hangs.py``, with
``--trace``; ``slow_eval`` also with a busy evaluation), the eight of ``issue_hangs.py`` and the toy job's (the jobs tests').
Each run gives three verdicts: the Flight Recorder alone, dumps + stacks (what ``runbook doctor --job-dir`` prints) and
stacks + trace (chapter 03's ``diagnose_job``; stacks alone where the script has no trace).  A verdict is right only
when it names the expected rank and is not ``undecided``; the first two count for every case, the third for the traced
ones (untraced stacks-only verdicts are printed, not counted).  Also printed: the seconds from the end of the stall
window to the last verdict (median, max), and the load average before and after.

``--set fr`` also runs the hung 2-node SLURM job of chapter 08 (lab ``fh``; ``runbook doctor --slurm-job`` on the
head node, then the dumps alone) and prints the time from the stall window's end to the verdict.

Run: ``.venv/bin/python benchmarks/flaky_hangs.py --repeats 10`` (about 10 minutes on 2 cores; ``--set fr``
about 8 minutes at 2 repeats; ``--set ties`` about 3 minutes per repeat).
"""

from __future__ import annotations

import argparse
import statistics
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


ISSUE_HANGS = jobs.project_root() / "helpers" / "scenarios" / "issue_hangs.py"
# (label, script, args, nproc, expected diverged ranks): no --trace, the evidence is torch's Flight Recorder
FR_CASES = [("mismatch/2", HANGS, ["--case", "mismatch"], 2, (1,)), ("stuck/2", HANGS, ["--case", "stuck"], 2, (1,)),
            ("rank0_save/2", HANGS, ["--case", "rank0_save"], 2, (0,)),
            ("uneven/2", HANGS, ["--case", "uneven", "--samples", "9"], 2, (1,)),
            ("mismatch/4", HANGS, ["--case", "mismatch"], 4, (3,)), ("rank0_save/4", HANGS, ["--case", "rank0_save"], 4, (0,)),
            ("uneven/3", HANGS, ["--case", "uneven"], 3, (2,))]


def fr_verdict(script: Path, args: list[str], nproc: int) -> tuple:
    """Run one case once (no trace); return (diverged from the Flight Recorder alone, from dumps + stacks)."""
    r = jobs.run_job(script, [*args, "--timeout-s", "60"], nproc=nproc, timeout_s=90, stall_s=STALL_S,
                     heartbeat=r"step \d+", env={"RUNBOOK_BACKEND": "gloo"}, verbose=False)
    if not r.hung:
        return ("not hung", r.ok)
    alone = doctor.diagnose_fr(doctor.load_fr(r.job_dir / "fr"))
    both = doctor.diagnose_job_dir(r.job_dir)
    return (tuple(alone.diverged), tuple(both.diverged))


def fr_cases() -> list[tuple[str, Path, list[str], int, tuple[int, ...]]]:
    """:data:`FR_CASES` plus every case of ``issue_hangs.py``."""
    from helpers.scenarios.issue_hangs import CASES as ISSUES

    return FR_CASES + [(f"{c}/{n}", ISSUE_HANGS, ["--case", c], n, tuple(want)) for c, (_url, n, want) in ISSUES.items()]


TOY = jobs.project_root() / "helpers" / "scenarios" / "toy_job.py"


def tie_cases() -> list[tuple[str, Path, list[str], tuple[int, ...], bool]]:
    """The two-rank hangs of issue 26: (label, script, args, expected diverged ranks, traced)."""
    from helpers.scenarios.issue_hangs import CASES as ISSUES
    from helpers.scenarios.issue_hangs import expected

    ch03 = [("mismatch", ["--case", "mismatch"], (1,)), ("stuck", ["--case", "stuck"], (1,)),
            ("rank0_save", ["--case", "rank0_save"], (0,)), ("uneven", ["--case", "uneven", "--samples", "9"], (1,)),
            ("slow_eval", ["--case", "slow_eval", "--eval-s", "30"], (0,)),
            ("slow_eval busy", ["--case", "slow_eval", "--eval-s", "30", "--eval-busy"], (0,))]
    toy = ["--steps", "50", "--step-s", "0.1", "--trace"]
    return ([(f"{label}/2", HANGS, [*a, "--trace"], want, True) for label, a, want in ch03]
            + [(f"{c}/2", ISSUE_HANGS, ["--case", c], tuple(expected(c, 2)), False) for c in ISSUES]
            + [("toy hang/2", TOY, ["--mode", "hang", *toy], (1,), True), ("toy mismatch/2", TOY, ["--mode", "mismatch", *toy], (1,), True)])


def tie_verdict(script: Path, args: list[str], want: tuple[int, ...], traced: bool) -> tuple[tuple, float, str]:
    """Run one two-rank case once; return ((FR alone, dumps + stacks, stacks [+ trace]) each as diverged ranks or
    'undecided'/'WRONG ...', the seconds from the end of the stall window to the last verdict, the verdict's class)."""
    r = jobs.run_job(script, [*args, "--timeout-s", "60"], nproc=2, timeout_s=90, stall_s=STALL_S,
                     heartbeat=r"step \d+", env={"RUNBOOK_BACKEND": "gloo"}, verbose=False)
    if not r.hung:
        return ("not hung", r.ok), 0.0, ""
    verdicts = [doctor.diagnose_fr(doctor.load_fr(r.job_dir / "fr")), doctor.diagnose_job_dir(r.job_dir),
                doctor.diagnose_job_dir(r.job_dir, use_fr=False)]
    delay = time.time() - (r.stopped_at or time.time())

    def mark(v: doctor.HangVerdict) -> object:
        return "undecided" if v.evidence == "undecided" else (tuple(v.diverged) if tuple(v.diverged) == want
                                                             else f"WRONG {tuple(v.diverged)}")
    return tuple(mark(v) for v in verdicts), delay, f"{verdicts[1].kind}/{verdicts[1].evidence}"


TWO_NODE = "mismatch/2 nodes"  # chapter 08 section 10 and tests/lab/test_fr_doctor_lab.py, on the SLURM lab


def two_node_verdicts(repeats: int) -> Counter:
    """The hung 2-node SLURM job ``repeats`` times on one lab ``fh``: (diverged from the dumps alone, from
    ``runbook doctor --slurm-job`` run on the head node, i.e. stacks + dumps of every node), and the seconds
    from the stall window's end to that verdict."""
    import re

    from helpers import hostinfo, netlab, slurm
    from helpers import slurm_cases as sc

    seen: Counter = Counter()
    delays = []
    with netlab.Lab(2, name="fh", subnet="10.77.14.0/24", slurm=True) as lab:
        for i in range(repeats):
            work = jobs.new_job_dir(f"fr-2node-{i}")
            env = sc.job_env(work)
            job_id = slurm.submit(lab, sc.hang_script(work, "hung", port=hostinfo.free_port()), work, name="hung", env=env,
                                  sbatch_args=["--job-name=hung"])
            try:
                _, last = slurm.wait_stalled(lab, job_id, STALL_S)
                out = lab.slurm([sys.executable, "-m", "helpers.cli", "doctor", "--slurm-job", job_id], env=env, timeout_s=90)
                delays.append(time.time() - last - STALL_S)
            finally:
                lab.slurm(["scancel", job_id], timeout_s=10)
                slurm.wait_job(lab, job_id, timeout_s=30)
            m = re.search(r"rank\(s\) \[([\d, ]+)\] diverged", out.stdout)
            both = tuple(int(x) for x in m.group(1).split(",")) if m else ("no verdict", out.returncode)
            alone = tuple(doctor.diagnose_fr(doctor.load_fr(sc.hang_fr_dir(work, "hung"))).diverged)
            seen[(alone, both)] += 1
    print(f"  two nodes: verdict {statistics.median(delays):.2f} s (median), {max(delays):.2f} s (max) after the stall window")
    return seen


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
    parser.add_argument("--set", choices=("trace", "fr", "ties", "all"), default="trace",
                        help="trace: chapter 03's runs (default); fr: Flight Recorder verdicts (issue 13); ties: two-rank "
                        "ties (issue 26); all: every set")
    args = parser.parse_args()
    flaky = 0
    t0 = time.monotonic()
    if args.set in ("ties", "all"):
        import os

        print(f"load average before: {os.getloadavg()}", flush=True)
        chosen_ties = [c for c in tie_cases() if not args.cases or c[0] in args.cases.split(",")]
        delays: list[float] = []
        for label, script, cargs, want, traced in chosen_ties:
            seen: Counter = Counter()
            classes: Counter = Counter()
            for _ in range(args.repeats):
                got, delay, kind = tie_verdict(script, cargs, want, traced)
                seen[got] += 1
                classes[kind] += 1
                delays.append(delay)
            counted = [g[:3] if traced else g[:2] for g in seen]
            bad = any(x != want for g in counted for x in g)
            flaky += bad
            print(f"{'WRONG' if bad else 'right'} {label:22s} expect {want} (FR, FR+stacks, stacks{'+trace' if traced else ''}): "
                  f"{dict(seen)} class/evidence {dict(classes)}", flush=True)
        print(f"{len(chosen_ties) - flaky}/{len(chosen_ties)} two-rank cases right in {args.repeats} runs "
              f"({time.monotonic() - t0:.0f} s); verdict {statistics.median(delays):.2f} s (median), {max(delays):.2f} s "
              f"(max) after the stall window; load average after: {os.getloadavg()}", flush=True)
        if args.set == "ties":
            return 1 if flaky else 0
    if args.set in ("fr", "all"):
        chosen_fr = [c for c in fr_cases() if not args.cases or c[0] in args.cases.split(",")]
        if not args.cases or TWO_NODE in args.cases.split(","):
            chosen_fr.append((TWO_NODE, None, [], 2, (1,)))
        for label, script, cargs, nproc, want in chosen_fr:
            if label == TWO_NODE:
                seen = two_node_verdicts(args.repeats)
            else:
                seen = Counter(fr_verdict(script, cargs, nproc) for _ in range(args.repeats))
            bad = len(seen) > 1 or next(iter(seen)) != (want, want)
            flaky += bad
            print(f"{'WRONG' if bad else 'right'} {label:22s} expect {want}: {dict(seen)}", flush=True)
        print(f"{len(chosen_fr) - flaky}/{len(chosen_fr)} FR cases right in {args.repeats} runs ({time.monotonic() - t0:.0f} s)")
        if args.set == "fr":
            return 1 if flaky else 0
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
