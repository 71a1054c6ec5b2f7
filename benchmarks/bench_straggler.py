"""The straggler score on the SLURM lab (issue 22): a CPU-throttled node named in N of N runs, a healthy lab quiet in
N of N, and the seconds the measurement adds.  Prints, asserts nothing.

Each run builds a fresh 2-node lab (``al``) and runs the job across nodes only
(``helpers.allocation.across.run_allocation(steps=["nodes", "job"])``, 2 ranks per node).  Throttled runs cap node1's
processes at a twentieth of one CPU (:meth:`helpers.netlab.Lab.throttle_cpu`: cgroup ``cpu.max``, or the v1 CFS quota
on this machine's hybrid cgroups) as soon as node1's ranks have joined the process group
(:func:`helpers.netlab.inject_when_joined`; capped from the start, torch's import alone outlasts the join timeout: the
node is then named "never joined", which is another check's verdict).  SIGTERM stops it cleanly (the lab comes down).  Also recorded for the bandwidth grade (issue 22, step 4): each healthy run's
inter-node and intra-node plateau busbw as a fraction of its envelope (min(NIC line rate, memory copy)).

Run (root, slurm-wlm + munge): ``flock /work/lab.lock .venv/bin/python benchmarks/bench_straggler.py --repeats 10``;
the results also go to ``build/bench/straggler.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import jobs, netlab  # noqa: E402
from helpers.allocation import across  # noqa: E402

NAME = "al"


def one_run(throttled: bool, out: Path, nproc: int, fraction: float) -> dict:
    """One lab run: the straggler record, the seconds its measurement took, the envelope fractions, the drain list."""
    with netlab.Lab(2, name=NAME, slurm=True) as lab:
        stop = (netlab.inject_when_joined(out / "job", "node1", nproc, lambda: lab.throttle_cpu("node1", fraction))
                if throttled else None)
        t0 = time.monotonic()
        checks, ev = across.run_allocation(lab.hostnames, out, runner="lab", lab=NAME, steps=["nodes", "job"],
                                           nproc=nproc, log=lambda _: None)
        wall = time.monotonic() - t0
        if stop is not None:
            stop.set()
        left = lab.slurm(["squeue", "-h", "-t", "PD,CF,R,S"], timeout_s=20).stdout.strip()
    by_id = {c.id: c for c in checks}
    ranks = by_id.get("job.straggler.ranks")
    env = {cid: {"fraction": c.values.get("fraction") or c.values.get("ratio") or (
                round(c.values["plateau_GBps"] / c.values["envelope_GBps"], 4) if c.values.get("envelope_GBps") else None),
                 "plateau_GBps": c.values.get("plateau_GBps"), "status": c.status}
           for cid, c in by_id.items() if cid.startswith("envelope.")}
    return {"status": ranks.status if ranks else "missing", "faulty": ranks.faulty if ranks else [],
            "scores": {f"{r['host']}/{r['local_rank']}": r["score"] for r in (ranks.values["ranks"] if ranks else [])},
            "measure_s": ranks.values.get("seconds") if ranks else None, "wall_s": round(wall, 1), "envelope": env,
            "not_ok": [c.id for c in checks if c.status in ("WARN", "FAIL")], "drain": ev["drain"]["nodes"], "left": left}


def main() -> int:
    """Run the plan of the module docstring and print the figures."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=10, help="runs of each case (default 10)")
    p.add_argument("--nproc", type=int, default=2, help="ranks per node (default 2)")
    p.add_argument("--fraction", type=float, default=0.05, help="node1's CPU cap, share of one CPU (default 0.05)")
    p.add_argument("--only", choices=("healthy", "throttled"), default=None)
    args = p.parse_args()

    def stop(*_: object) -> None:
        raise KeyboardInterrupt  # through the Lab's context manager: nothing left behind

    signal.signal(signal.SIGTERM, stop)
    tmp = Path(tempfile.mkdtemp(prefix="bench-straggler-", dir=jobs.build_dir()))
    results: dict[str, list[dict]] = {"healthy": [], "throttled": []}
    load = os.getloadavg()[0]
    for i in range(args.repeats):
        for case in ("healthy", "throttled"):
            if args.only and case != args.only:
                continue
            r = one_run(case == "throttled", tmp / f"{case}-{i}", args.nproc, args.fraction)
            r["load"] = round(os.getloadavg()[0], 1)
            results[case].append(r)
            print(case, i, json.dumps(r), flush=True)
    print(f"\nload average at start {load:.1f}, at end {os.getloadavg()[0]:.1f}; {os.cpu_count()} CPUs")
    h, t = results["healthy"], results["throttled"]
    if h:
        quiet = sum(r["status"] == "OK" for r in h)
        print(f"healthy   quiet {quiet}/{len(h)}; lowest score per run {[min(r['scores'].values(), default=None) for r in h]}")
    if t:
        named = sum(r["status"] == "FAIL" and r["faulty"] == ["node1"] for r in t)
        print(f"throttled named {named}/{len(t)} (FAIL, faulty == [node1]); node1 scores {[max(v for k, v in r['scores'].items() if k.startswith('node1')) if r['scores'] else None for r in t]}")
    secs = [r["measure_s"] for r in h + t if r["measure_s"]]
    if secs:
        print(f"seconds the measurement adds: median {statistics.median(secs):.1f}, max {max(secs):.1f}")
    out = jobs.build_dir() / "bench" / "straggler.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"load_start": load, "repeats": args.repeats, "nproc": args.nproc,
                               "fraction": args.fraction, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
