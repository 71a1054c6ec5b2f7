"""Flakiness check for whole chapters: execute a notebook N times in a row with papermill.

Every reproduction in a chapter asserts on its own run, so one clean execution means every
reproduction gave its expected verdict; N clean executions in a row mean they did so N times.
Prints one line per execution (wall time, or the failing cell's error) and a summary; exits 1
if any execution failed.

Run: ``.venv/bin/python benchmarks/flaky_notebooks.py 01_launchers.ipynb 02_ddp.ipynb --repeats 10``.
Chapters that build a lab (06, 08): ``--lab ch`` tears lab ``ch`` down after every execution (a failed run
must not leave its namespaces and daemons to the next one) and counts a run that left any as failed:
``benchmarks/flaky_notebooks.py 08_slurm.ipynb --lab ch --repeats 10``.  Each line carries the load average.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _lab_leftovers(name: str | None) -> list[str]:
    """What lab ``name`` left behind (namespaces, mounts, state, SLURM folder), after tearing it down; [] without a lab."""
    if not name:
        return []
    from helpers import netlab

    if not netlab.lab_available()[0]:
        return []
    left = netlab.Lab(1, name=name, slurm=True).leftovers()
    netlab.down(name)
    return left


def main() -> int:
    """Execute each named notebook ``--repeats`` times; report."""
    import papermill

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="+", help="file names under notebooks/")
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--lab", default=None, help="network/SLURM lab name the notebooks build (LAB_NAME): torn down after each run")
    args = parser.parse_args()
    failed = 0
    for name in args.notebooks:
        src = ROOT / "notebooks" / name
        if not src.is_file():
            parser.error(f"notebooks: {name!r} not found under notebooks/")
        walls = []
        for i in range(args.repeats):
            out = ROOT / "build" / "executed" / f"flaky-{i}-{name}"
            t0 = time.monotonic()
            load = f"load {os.getloadavg()[0]:.1f}"
            try:
                papermill.execute_notebook(str(src), str(out), cwd=str(src.parent), kernel_name="python3",
                                           progress_bar=False, execution_timeout=900,
                                           parameters={"LAB_NAME": args.lab} if args.lab else {})
                left = _lab_leftovers(args.lab)
                if left:
                    failed += 1
                    print(f"{name} run {i + 1}: FAILED: lab {args.lab} left behind: {left[:3]} ({load})", flush=True)
                    continue
                walls.append(time.monotonic() - t0)
                print(f"{name} run {i + 1}: ok in {walls[-1]:.0f} s ({load})", flush=True)
            except papermill.PapermillExecutionError as exc:
                failed += 1
                _lab_leftovers(args.lab)
                print(f"{name} run {i + 1}: FAILED in cell {exc.exec_count}: {exc.ename}: {exc.evalue[:300]} ({load})",
                      flush=True)
        print(f"{name}: {len(walls)}/{args.repeats} clean executions"
              + (f", median {sorted(walls)[len(walls) // 2]:.0f} s" if walls else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
