"""Flakiness check for whole chapters: execute a notebook N times in a row with papermill.

Every reproduction in a chapter asserts on its own run, so one clean execution means every
reproduction gave its expected verdict; N clean executions in a row mean they did so N times.
Prints one line per execution (wall time, or the failing cell's error) and a summary; exits 1
if any execution failed.

Run: ``.venv/bin/python benchmarks/flaky_notebooks.py 01_launchers.ipynb 02_ddp.ipynb --repeats 10``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> int:
    """Execute each named notebook ``--repeats`` times; report."""
    import papermill

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("notebooks", nargs="+", help="file names under notebooks/")
    parser.add_argument("--repeats", type=int, default=10)
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
            try:
                papermill.execute_notebook(str(src), str(out), cwd=str(src.parent), kernel_name="python3",
                                           progress_bar=False, execution_timeout=900)
                walls.append(time.monotonic() - t0)
                print(f"{name} run {i + 1}: ok in {walls[-1]:.0f} s", flush=True)
            except papermill.PapermillExecutionError as exc:
                failed += 1
                print(f"{name} run {i + 1}: FAILED in cell {exc.exec_count}: {exc.ename}: {exc.evalue[:300]}",
                      flush=True)
        print(f"{name}: {len(walls)}/{args.repeats} clean executions"
              + (f", median {sorted(walls)[len(walls) // 2]:.0f} s" if walls else ""), flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
