"""The whole course as a test suite on the SLURM lab: ``configs/slurm/course.sbatch`` over every chapter (issue 12).

Builds a 2-node SLURM lab (``cb``), submits the course batch script (its ``# EDIT`` lines filled in for the lab:
:func:`helpers.course.lab_sbatch`) with every chapter, waits for it, and prints the job's state, its wall time and
the per-chapter summary ``helpers.course`` wrote (passed / failed, seconds, tiers ran / skipped, skip reasons).
Chapters 06 and 08 build a lab of their own from inside the job's first node.  Prints, asserts nothing; exit 1 when
the job did not complete or a chapter failed.

Run: ``.venv/bin/python benchmarks/bench_course.py [--chapters 00,08] [--timeout-s 3600]`` (root, slurm-wlm + munge).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import course, netlab, slurm  # noqa: E402
from helpers import slurm_cases as sc  # noqa: E402


def main() -> int:
    """Submit the course to the lab, wait, print the summary."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--chapters", default="", help="comma-separated chapter prefixes (default: every chapter)")
    p.add_argument("--timeout-s", type=float, default=3600.0)
    args = p.parse_args()
    work = sc.ROOT / "build" / "course"
    work.mkdir(parents=True, exist_ok=True)
    text = course.lab_sbatch((sc.ROOT / "configs" / "slurm" / "course.sbatch").read_text())
    text = text.replace("#SBATCH --time=02:00:00", f"#SBATCH --time={int(args.timeout_s // 60) + 5}")
    # the chapters' own labs get names of their own: a test run or another benchmark may hold "ch"/"ch06" meanwhile
    env = {**sc.job_env(work), "COURSE_ARGS": "-p 06:LAB_NAME=cb6 -p 08:LAB_NAME=cb8 -p 08:OUT_DIR=build/cb08",
           **({"COURSE_CHAPTERS": args.chapters} if args.chapters else {})}
    load = os.getloadavg()[0]
    with netlab.Lab(2, name="cb", subnet="10.77.15.0/24", slurm=True) as lab:
        t0 = time.monotonic()
        job = slurm.submit(lab, text, sc.ROOT / "build" / "bench-course", name="course", env=env, cwd=sc.ROOT)
        state = slurm.wait_job(lab, job, timeout_s=args.timeout_s, poll_s=5)
        wall = time.monotonic() - t0
    print(f"{state.summary()}; wall {wall:.0f} s; load average {load:.1f} at start, {os.getloadavg()[0]:.1f} at end")
    summary_path = work / job / "summary.json"
    if not summary_path.exists():
        print("no summary written:", state.out()[-1500:], state.err()[-3000:], sep="\n")
        return 1
    rows = json.loads(summary_path.read_text())
    for r in rows:
        tiers = ", ".join(f"{t} {v['ran']} ran/{v['skipped']} skipped" for t, v in sorted(r["tiers"].items()))
        print(f"{r['chapter']:32} {r['status']:7} {r['seconds']:6.0f} s  {tiers}")
        for tier, why in r.get("skips", [])[:3]:
            print(f"{'':34}[SKIP {tier}] {why[:150]}")
    print((work / job / "summary.md").read_text().splitlines()[-1] if (work / job / "summary.md").exists() else "")
    return 0 if state.state == "COMPLETED" and all(r["status"] == "passed" for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
