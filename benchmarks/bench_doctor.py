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

3. Flight Recorder (issue 13): the same stall-to-verdict time for a script *without* the trace, the verdict
   coming from the ranks' Flight Recorder dumps (requested by the runner, SIGUSR2) and stacks; and the
   recorder's cost: the DDP toy step with ``TORCH_FR_BUFFER_SIZE=0`` vs ``2000`` (runs interleaved), and per
   collective call (1-rank gloo group, in a subprocess per setting, since torch reads the variable once).

Run: ``.venv/bin/python benchmarks/bench_doctor.py`` (``--only fr`` for the Flight Recorder figures).
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


def fr_verdict_latency(stall_s: float) -> tuple[float, float, str]:
    """(seconds beyond the stall window until the Flight Recorder verdict, seconds the dump request took, first line)."""
    r = jobs.run_job(SCEN / "toy_job.py", ["--mode", "hang", "--steps", "1000", "--step-s", "0.05"],
                     nproc=2, timeout_s=120, stall_s=stall_s, heartbeat=r"step \d+", verbose=False)
    verdict = doctor.diagnose_job_dir(r.job_dir)
    printed = time.time()
    last_line = max(p.stat().st_mtime for p in (r.job_dir / "ranks").glob("rank*.stdout"))
    dumped = max(p.stat().st_mtime for p in (r.job_dir / "fr").glob("rank[0-9]"))
    assert verdict.diverged == [1] and verdict.group == "0", verdict.text
    return printed - last_line - stall_s, dumped - (r.stopped_at or dumped), verdict.text.splitlines()[0]


_FR_CALL = """
import os, sys, tempfile, time, torch, torch.distributed as dist
tmp = tempfile.mkdtemp(dir=os.environ.get("TMPDIR"))
dist.init_process_group("gloo", store=dist.FileStore(tmp + "/store", 1), rank=0, world_size=1)
x = torch.ones(1)
def timed(n=5000):
    t0 = time.perf_counter()
    for _ in range(n):
        dist.all_reduce(x)
    return (time.perf_counter() - t0) / n
timed()
print(min(timed() for _ in range(3)))
dist.destroy_process_group()
"""


def fr_per_call_s(size: int) -> float:
    """Seconds per 1-rank gloo all_reduce with ``TORCH_FR_BUFFER_SIZE=size`` (fresh interpreter)."""
    import os
    import subprocess

    env = dict(os.environ, TORCH_FR_BUFFER_SIZE=str(size))
    out = subprocess.run([sys.executable, "-c", _FR_CALL], env=env, capture_output=True, text=True, timeout=300, check=True)
    return float(out.stdout.strip().splitlines()[-1])


def step_time(trace: bool, out: Path, steps: int, env: dict | None = None) -> float:
    """Median DDP step time (s) of one 2-rank run."""
    args = ["--out", str(out), "--steps", str(steps)] + (["--trace"] if trace else [])
    r = jobs.run_job(SCEN / "ddp_step.py", args, nproc=2, timeout_s=300, verbose=False, env=env)
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
    parser.add_argument("--only", choices=("all", "fr"), default="all")
    args = parser.parse_args()
    out = jobs.build_dir() / "bench"
    out.mkdir(exist_ok=True)
    fr_lat = [fr_verdict_latency(args.stall_s) for _ in range(args.repeats)]
    print(f"Flight Recorder verdict {statistics.median(x for x, _, _ in fr_lat):.2f} s after the stall window of "
          f"{args.stall_s:g} s (runs: {', '.join(f'{x:.2f}' for x, _, _ in fr_lat)}; dumps written "
          f"{1e3 * statistics.median(d for _, d, _ in fr_lat):.0f} ms after the stall was declared; target <= 5 s)")
    print(f"  {fr_lat[0][2]}")
    off, on = [], []
    for _ in range(args.repeats):
        off.append(step_time(False, out / "fr_off.json", args.steps, env={"TORCH_FR_BUFFER_SIZE": "0"}))
        on.append(step_time(False, out / "fr_on.json", args.steps, env={"TORCH_FR_BUFFER_SIZE": "2000"}))
    p0, p1 = statistics.median(off), statistics.median(on)
    pairs = [(fr_per_call_s(0), fr_per_call_s(2000)) for _ in range(4)]  # alternated: load drifts on a shared box
    c0, c1 = min(a for a, _ in pairs), min(b for _, b in pairs)
    print(f"Flight Recorder cost per collective call: {(c1 - c0) * 1e6:.1f} us = {100 * (c1 - c0) / p0:.3f} % of a "
          f"{p0 * 1e3:.2f} ms DDP step ({c0 * 1e6:.1f} vs {c1 * 1e6:.1f} us per 1-rank all_reduce)")
    print(f"DDP toy step: {p0 * 1e3:.2f} ms without, {p1 * 1e3:.2f} ms with the Flight Recorder: {100 * (p1 - p0) / p0:+.1f} % "
          f"(runs {[round(x * 1e3, 2) for x in off]} vs {[round(x * 1e3, 2) for x in on]} ms)")
    if args.only == "fr":
        return
    lat = [verdict_latency(args.stall_s) for _ in range(args.repeats)]
    print(f"verdict {statistics.median(x for x, _ in lat):.2f} s after the stall window of {args.stall_s:g} s "
          f"(runs: {', '.join(f'{x:.2f}' for x, _ in lat)}; target <= 5 s; default timeouts 1800 s gloo, 600 s NCCL)")
    print(f"  {lat[0][1]}")
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
