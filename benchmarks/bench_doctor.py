"""Figures for the hang doctor (issue: chapters 01-03).  Prints, asserts nothing.

1. Time from a stall to the printed verdict: a rank stops calling collectives; the runner
   declares the job hung after ``stall_s`` without a heartbeat, py-spies every rank, and the
   doctor prints its verdict.  Reported: seconds from the last line any rank wrote to the
   verdict, minus ``stall_s``.  Target <= 5 s, against torch's default collective timeouts
   (1800 s gloo, 600 s NCCL).
2. Tracing overhead: median DDP step time of ``helpers/scenarios/ddp_step.py`` with and
   without ``--trace`` (runs interleaved), and, since that difference drowns in the
   run-to-run noise of a 2-core box, the wrapper's own cost per collective call (1-rank
   group, in-process) as a share of the step time.  Target <= 2 %.

Run: ``.venv/bin/python benchmarks/bench_doctor.py``.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import doctor, jobs  # noqa: E402

SCEN = jobs.project_root() / "helpers" / "scenarios"


def verdict_latency(stall_s: float) -> tuple[float, str]:
    """(seconds beyond the stall window until the verdict, the verdict's first line)."""
    r = jobs.run_job(SCEN / "toy_job.py", ["--mode", "hang", "--steps", "1000", "--step-s", "0.05", "--trace"],
                     nproc=2, timeout_s=120, stall_s=stall_s, heartbeat=r"step \d+", verbose=False)
    verdict = doctor.diagnose_job(r)
    printed = time.time()
    last_line = max(p.stat().st_mtime for p in (r.job_dir / "ranks").glob("rank*.stdout"))
    return printed - last_line - stall_s, verdict.text.splitlines()[0]


def step_time(trace: bool, out: Path, steps: int) -> float:
    """Median DDP step time (s) of one 2-rank run."""
    args = ["--out", str(out), "--steps", str(steps)] + (["--trace"] if trace else [])
    r = jobs.run_job(SCEN / "ddp_step.py", args, nproc=2, timeout_s=300, verbose=False)
    assert r.ok, r.summary()
    return json.loads(out.read_text())["median_step_s"]


def per_call_overhead_s(calls: int = 5000) -> float:
    """Seconds the trace adds to one collective call: a 1-rank gloo group in this process, timed
    untraced then traced (a world of one moves no data, so the wrapper's cost is what differs)."""
    import tempfile

    import torch
    import torch.distributed as dist

    from helpers import collective_trace

    with tempfile.TemporaryDirectory(dir=jobs.build_dir()) as tmp:
        dist.init_process_group("gloo", store=dist.FileStore(f"{tmp}/store", 1), rank=0, world_size=1)
        x = torch.ones(1)

        def timed() -> float:
            t0 = time.perf_counter()
            for _ in range(calls):
                dist.all_reduce(x)
            return (time.perf_counter() - t0) / calls

        timed()
        plain = min(timed() for _ in range(3))
        collective_trace.enable(tmp, rank=0)
        traced = min(timed() for _ in range(3))
        collective_trace.disable()
        dist.destroy_process_group()
    return traced - plain


def main() -> None:
    """Measure and print both figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--stall-s", type=float, default=5.0)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    lat = [verdict_latency(args.stall_s) for _ in range(args.repeats)]
    print(f"verdict {statistics.median(x for x, _ in lat):.2f} s after the stall window of {args.stall_s:g} s "
          f"(runs: {', '.join(f'{x:.2f}' for x, _ in lat)}; target <= 5 s; default timeouts 1800 s gloo, 600 s NCCL)")
    print(f"  {lat[0][1]}")
    out = jobs.build_dir() / "bench"
    out.mkdir(exist_ok=True)
    plain, traced = [], []
    for _ in range(args.repeats):
        plain.append(step_time(False, out / "plain.json", args.steps))
        traced.append(step_time(True, out / "traced.json", args.steps))
    p, t = statistics.median(plain), statistics.median(traced)
    extra = per_call_overhead_s()
    print(f"trace cost per collective call: {extra * 1e6:.1f} us = {100 * extra / p:.3f} % of a {p * 1e3:.2f} ms "
          "DDP step with one traced collective (target <= 2 %)")
    print(f"DDP toy step: {p * 1e3:.2f} ms untraced, {t * 1e3:.2f} ms traced: overhead {100 * (t - p) / p:+.1f} % "
          f"(target <= 2 %; runs {[round(x * 1e3, 2) for x in plain]} vs {[round(x * 1e3, 2) for x in traced]} ms)")


if __name__ == "__main__":
    main()
