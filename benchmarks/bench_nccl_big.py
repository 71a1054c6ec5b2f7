"""Time and memory of ``runbook nccl-log`` on a large synthetic log built from the real corpus.

Builds ``build/nccl_big.log`` (default 200 MB) by repeating the lines of tests/data/nccl/real/*.log
and tests/data/nccl/healthy_multinode_ib.log with fresh host names every block (a job of many
nodes), then runs ``python -m helpers.cli nccl-log FILE --json`` (what ``runbook nccl-log`` runs) in a child process and reports its wall
time, its peak RSS (``resource.getrusage(RUSAGE_CHILDREN).ru_maxrss``, the figure ``/usr/bin/time -v``
prints as "Maximum resident set size") and the size of the JSON output.  Targets (issue 15):
<= 10 s, <= 200 MB peak, bounded JSON.

Usage: ``python benchmarks/bench_nccl_big.py [--mb 200] [--keep]``; exit 1 when a target is missed.
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "nccl"


def build(path: Path, megabytes: int) -> int:
    """Write a ``megabytes`` MB log at ``path``; return its size in bytes."""
    lines = [line for f in sorted((DATA / "real").glob("*.log")) + [DATA / "healthy_multinode_ib.log"]
             for line in f.read_text().splitlines() if line and not line.startswith("#")]
    block = "\n".join(lines) + "\n"
    target = megabytes * 1024 * 1024
    written = 0
    n = 0
    with path.open("w") as fh:
        while written < target:
            text = block.replace("gpu-a01", f"gpu-a{n:04d}").replace("gpu-a02", f"gpu-b{n:04d}")
            fh.write(text)
            written += len(text)
            n += 1
    return path.stat().st_size


def main(argv: list[str] | None = None) -> int:
    """Build the log, run the interpreter on it, print the figures."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--mb", type=int, default=200, help="size of the synthetic log in MB (default 200)")
    parser.add_argument("--keep", action="store_true", help="keep build/nccl_big.log afterwards")
    args = parser.parse_args(argv)
    path = ROOT / "build" / "nccl_big.log"
    path.parent.mkdir(exist_ok=True)
    size = build(path, args.mb)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    t0 = time.monotonic()
    proc = subprocess.run([sys.executable, "-m", "helpers.cli", "nccl-log", str(path), "--json"], capture_output=True,
                          text=True, env=env, check=False)
    wall = time.monotonic() - t0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    peak_mb, cpu = usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime
    if not args.keep:
        path.unlink()
    print(f"log {size / 2**20:.0f} MB: exit {proc.returncode}, {wall:.1f} s wall, {cpu:.1f} s CPU, peak RSS {peak_mb:.0f} MB, "
          f"--json output {len(proc.stdout) / 1024:.0f} KiB")
    if proc.returncode not in (0, 1):
        print(proc.stderr[-2000:])
        return 1
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs (wall time grows with the load)")
    return 0 if wall <= 10 and peak_mb <= 200 else 1


if __name__ == "__main__":
    sys.exit(main())
