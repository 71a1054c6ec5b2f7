"""Figures for the job runner (issue: foundation).  Prints, asserts nothing.

1. Overhead: wall time of ``helpers.jobs.run_job`` over a bare ``torchrun`` of the same
   trivial 2-rank job (init, one all_reduce per step, destroy).  Target <= 10 %.
2. Stall detection latency: from a rank's last output line to the runner declaring the
   job hung, for a given ``stall_s``.  Target <= stall_s + 2 s.

Run: ``make bench`` or ``.venv/bin/python benchmarks/bench_runner.py [--repeats 5]``.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import jobs, procs  # noqa: E402

TOY = jobs.project_root() / "helpers" / "scenarios" / "toy_job.py"


def bare_torchrun(log_dir: str) -> float:
    """Seconds for a plain ``torchrun`` of the toy job, output discarded."""
    exe = procs.find_tool("torchrun")
    t0 = time.monotonic()
    subprocess.run([exe, "--standalone", "--nproc-per-node=2", f"--log-dir={log_dir}", str(TOY), "--steps", "1"],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=120,
                   env=dict(os.environ, TMPDIR=log_dir))
    return time.monotonic() - t0


def runner() -> float:
    """Seconds for the same job through the runner (shim, per-rank logs, monitoring, teardown)."""
    t0 = time.monotonic()
    result = jobs.run_job(TOY, ["--steps", "1"], nproc=2, timeout_s=120, verbose=False)
    assert result.ok, result.summary()
    return time.monotonic() - t0


def stall_latency(stall_s: float) -> float:
    """Seconds from the last line any rank wrote to the runner's hung verdict."""
    result = jobs.run_job(TOY, ["--mode", "hang", "--bad-rank", "1", "--steps", "1000", "--step-s", "0.05"],
                          nproc=2, timeout_s=120, stall_s=stall_s, heartbeat=r"step \d+", verbose=False)
    assert result.hung and result.stopped_at, result.summary()
    last_line = max(p.stat().st_mtime for p in (result.job_dir / "ranks").glob("rank*.stdout"))
    return result.stopped_at - last_line


def main() -> None:
    """Measure and print both figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--stall-s", type=float, default=5.0)
    args = parser.parse_args()
    bare, ours = [], []
    with tempfile.TemporaryDirectory(dir=jobs.build_dir()) as tmp:
        bare_torchrun(tmp)  # warm the page cache once
        for _ in range(args.repeats):  # interleave so drift hits both alike
            bare.append(bare_torchrun(tmp))
            ours.append(runner())
    b, o = statistics.median(bare), statistics.median(ours)
    print(f"trivial 2-rank job, median of {args.repeats}: bare torchrun {b:.2f} s, runner {o:.2f} s, "
          f"overhead {100 * (o - b) / b:+.1f} % (target <= 10 %)")
    lat = [stall_latency(args.stall_s) for _ in range(3)]
    print(f"stall declared {statistics.median(lat):.2f} s after the last line (runs: "
          f"{', '.join(f'{x:.2f}' for x in lat)}), stall_s = {args.stall_s:g} s "
          f"(target <= {args.stall_s + 2:g} s)")


if __name__ == "__main__":
    main()
