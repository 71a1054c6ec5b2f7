"""Figures for the allocation check across nodes on the SLURM lab (issue 11).  Prints, asserts nothing.

1. The full check (``runbook diagnose --nodes ... --runner lab``): 2 nodes x 2 ranks (target <= 3 min on
   2 cores, idle machine) and 4 nodes x 1 rank (target <= 4 min); healthy: every check OK (the only WARN
   allowed is ``across.host``: the lab's orchestrator is not a node), in N runs out of N.
2. Each fault of tests/lab/test_allocation_faults.py, ``--repeats`` times, with only the steps that must
   catch it: named = the expected node is the one the drain list names.
3. Time from launch to the FAIL for a dead node (link cut, then its processes killed) (target <= 90 s).

Run: ``.venv/bin/python benchmarks/bench_allocation.py --repeats 10`` (root, slurm-wlm + munge installed);
the results also go to ``build/bench/allocation.json``.  Labs are named ``al``.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import jobs, netlab  # noqa: E402
from helpers.allocation import across  # noqa: E402

NAME = "al"
PROFILE = "/tmp/runbook_node_profile.sh"  # node-local (/tmp is private per lab node), read through BASH_ENV


def full_check(nodes: int, nproc: int, out: Path) -> dict:
    """One ``runbook diagnose`` over a fresh lab: wall seconds, exit status, the WARN/FAIL check ids (INFO, e.g. "no GPU on this node", is not a finding)."""
    with netlab.Lab(nodes, name=NAME, slurm=True) as lab:
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "helpers.cli", "diagnose", "--nodes", ",".join(lab.hostnames),
                               "--runner", "lab", "--lab-name", NAME, "--ranks-per-node", str(nproc), "--out-dir", str(out)],
                              cwd=jobs.project_root(), capture_output=True, text=True, timeout=900)
        wall = time.monotonic() - t0
    report = max(out.glob("*/report.json"), key=lambda p: p.stat().st_mtime, default=None)
    data = json.loads(report.read_text()) if report else {"checks": []}
    bad = [c["id"] for c in data["checks"] if c["status"] in ("WARN", "FAIL") and c["id"] != "across.host"]
    return {"wall_s": round(wall, 1), "rc": proc.returncode, "not_ok": bad, "all_ok": proc.returncode == 0 and not bad}


def _profile(lab: netlab.Lab, node: str, text: str) -> None:
    lab.run(node, ["bash", "-c", f"cat > {PROFILE}"], input_text=text)


FAULTS: dict[str, tuple[int, Callable[[netlab.Lab], None], list[str], dict, dict]] = {
    # name: (nodes, inject, steps, run_allocation kwargs, extra environment)
    "slow_node": (3, lambda lab: lab.rate_limit("node2", 50), ["job"], {"nproc": 1}, {}),
    "mtu_black_hole": (2, lambda lab: (lab.set_mtu("all", 9000), lab.set_mtu("node0", 9000, side="bridge")),
                       ["preflight"], {}, {}),
    "ifname_one_node": (2, lambda lab: lab.rename_data_iface("node1", "ens9"), ["nodes"], {},
                        {"GLOO_SOCKET_IFNAME": "eth0"}),
    "env_one_node": (2, lambda lab: _profile(lab, "node1", "export NCCL_ALGO=Ring\n"), ["job"], {"nproc": 1},
                     {"BASH_ENV": PROFILE}),
    "never_joins": (2, lambda lab: _profile(lab, "node1", "sleep 600\n"), ["job"], {"nproc": 1, "join_timeout_s": 40},
                    {"BASH_ENV": PROFILE}),
    "node_lost": (2, lambda lab: (lab.cut_link("node1"), lab.kill_node("node1")), ["nodes", "job"], {"nproc": 1}, {}),
}
EXPECTED = {"slow_node": "node2", "mtu_black_hole": "node1", "ifname_one_node": "node1", "env_one_node": "node1",
            "never_joins": "node1", "node_lost": "node1"}


def fault_run(name: str, out: Path) -> dict:
    """One run of fault ``name``: the nodes the drain list names, seconds from launch to the verdict, jobs left."""
    nodes, inject, steps, kwargs, env = FAULTS[name]
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        with netlab.Lab(nodes, name=NAME, slurm=True) as lab:
            inject(lab)
            t0 = time.monotonic()
            checks, ev = across.run_allocation(lab.hostnames, out, runner="lab", lab=NAME, steps=steps,
                                                   log=lambda _: None, **kwargs)
            took = time.monotonic() - t0
            # pending/running only: a job on a dead node stays COMPLETING until slurmctld marks the node DOWN
            left = lab.slurm(["squeue", "-h", "-t", "PD,CF,R,S"], timeout_s=20).stdout.strip()
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    drained = ev["drain"]["nodes"]
    # The MTU black hole is on the path node1 <-> master: the pre-flight's record is net.mtu.node1 and it names both
    # ends faulty (node1 first), as on main; every other fault must name exactly the expected node.
    named = drained[:1] == [EXPECTED[name]] if name == "mtu_black_hole" else drained == [EXPECTED[name]]
    return {"named": named, "drain": drained, "s": round(took, 1), "left": left}


def main() -> int:
    """Run the figures of the module docstring and print them."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--repeats", type=int, default=10, help="runs of each healthy check and of each fault")
    p.add_argument("--only", default="", help="comma-separated subset: healthy2x2, healthy4x1, and fault names")
    args = p.parse_args()
    only = {w for w in args.only.split(",") if w}
    results: dict[str, list[dict]] = {}
    tmp = Path(tempfile.mkdtemp(prefix="bench-alloc-", dir=jobs.build_dir()))
    plan = [("healthy2x2", lambda i: full_check(2, 2, tmp / f"h22-{i}")),
            ("healthy4x1", lambda i: full_check(4, 1, tmp / f"h41-{i}"))]
    plan += [(name, lambda i, name=name: fault_run(name, tmp / f"{name}-{i}")) for name in FAULTS]
    load = os.getloadavg()[0]
    for name, fn in plan:
        if only and name not in only:
            continue
        for i in range(args.repeats):
            r = fn(i)
            results.setdefault(name, []).append(r)
            print(name, i, json.dumps(r), f"load {os.getloadavg()[0]:.1f}", flush=True)
    print(f"\nload average at start {load:.1f}, at end {os.getloadavg()[0]:.1f}; {os.cpu_count()} CPUs")
    for name, runs in results.items():
        ok = sum(r.get("all_ok", r.get("named", False)) for r in runs)
        times = [r.get("wall_s", r.get("s")) for r in runs]
        print(f"{name:16} {ok}/{len(runs)} {'all OK' if name.startswith('healthy') else 'named'}; "
              f"s: median {statistics.median(times):.1f}, max {max(times):.1f}")
    out = jobs.build_dir() / "bench" / "allocation.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"load_start": load, "repeats": args.repeats, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
