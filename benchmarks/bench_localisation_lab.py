"""The localisation with real group tests on the SLURM lab (issue 23): each fault named in N runs, rounds, tests, seconds.

For each scenario, one lab of ``--nodes`` nodes (real slurmctld/slurmd, ``Lab(..., slurm=True)``); each of the
``--repeats`` runs injects the fault on nodes drawn at random (seeded), runs the ``localise`` step of
:func:`helpers.allocation.across.run_allocation` (one SLURM step of group-test workers, one round per call of the
oracle), removes the fault.  Scenarios:

* ``healthy``: no fault (a drained node here is a false drain);
* ``slow_node``: the node's switch port capped at 20 Mb/s (``tc tbf``);
* ``slow_link``: the traffic between two nodes only capped at 5 Mb/s (``tc htb`` + ``u32`` on source address);
  5, not 20: an all_to_all over k nodes sends 1/k of its buffer over each link, so a link's slowdown is diluted
  k-fold in a group of k;
* ``collective``: the node's profile (``BASH_ENV``) exports ``GLOO_SOCKET_IFNAME=ens9``, which it does not have:
  its rank fails every collective at once;
* ``mtu``: every endpoint at 9000, every switch port at 9000 but the node's (1500): an MTU black hole there;
* ``pair``: a slow node and a collective-failing node at once.

Per scenario it prints: faults named / runs, false drains, rounds (max, and the bound ceil(log2 N) + 3), tests
(mean, against the N(N-1)/2 pairs), seconds (worker start, rounds, whole step).  ``--prolog`` adds the prolog
tier's seconds per node, ``--quick`` one ``runbook diagnose --tier quick`` over the healthy lab.

Run (root, slurm-wlm + munge; the lab lock is the caller's: one scenario per lock, so others get a turn)::

    for s in healthy slow_node slow_link collective mtu pair; do
        flock /work/lab.lock .venv/bin/python benchmarks/bench_localisation_lab.py --nodes 8 --repeats 10 --scenario $s
    done

Results are appended to ``build/bench/localisation_lab.jsonl`` (one JSON line per scenario).  Prints, asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers import jobs, netlab  # noqa: E402
from helpers.allocation import across  # noqa: E402
from helpers.allocation.localise import round_bound  # noqa: E402

NAME = "lz"
PROFILE = "/tmp/runbook_node_profile.sh"  # node-local (/tmp is private per lab node), read through BASH_ENV
SCENARIOS = ("healthy", "slow_node", "slow_link", "collective", "mtu", "pair")


def inject(lab: netlab.Lab, kind: str, nodes: list[str]) -> None:
    """Put fault ``kind`` on ``nodes`` (one node; two for a link)."""
    if kind == "slow_node":
        lab.rate_limit(nodes[0], 20)
    elif kind == "slow_link":
        lab.rate_limit_link(nodes[0], nodes[1], 5)
    elif kind == "collective":
        lab.run(nodes[0], ["bash", "-c", f"cat > {PROFILE}"], input_text="export GLOO_SOCKET_IFNAME=ens9\n")
    elif kind == "mtu":
        lab.set_mtu("all", 9000)
        for n in lab.hostnames:
            if n != nodes[0]:
                lab.set_mtu(n, 9000, side="bridge")


def clear(lab: netlab.Lab, kind: str, nodes: list[str]) -> None:
    """Remove what :func:`inject` put."""
    if kind in ("slow_node", "slow_link"):
        for n in nodes:
            lab.rate_limit(n, None)
    elif kind == "collective":
        lab.run(nodes[0], ["rm", "-f", PROFILE])
    elif kind == "mtu":
        lab.set_mtu("all", 1500, side="bridge")
        lab.set_mtu("all", 1500)


def one_run(lab: netlab.Lab, out: Path) -> dict:
    """One ``localise`` step over the lab's nodes: what it named and what it cost."""
    t0 = time.monotonic()
    checks, ev = across.run_allocation(lab.hostnames, out, runner="lab", lab=NAME, steps=["localise"], log=lambda _: None)
    loc = (ev.get("localise") or {})
    res = loc.get("localisation") or {}
    return {"nodes": res.get("nodes", []), "links": [tuple(p) for p in res.get("links", [])], "verdict": res.get("verdict"),
            "rounds": res.get("rounds"), "tests": res.get("tests"), "start_s": loc.get("start_s"),
            "rounds_s": round(sum(loc.get("round_wall_s") or []), 1), "step_s": loc.get("wall_s"),
            "wall_s": round(time.monotonic() - t0, 1), "floor_GBps": loc.get("floor_GBps"),
            "not_ok": [c.line().splitlines()[0] for c in checks if not c.ok]}


def scenario(name: str, n: int, repeats: int, rng: random.Random, out: Path) -> dict:
    """``repeats`` runs of scenario ``name`` on one ``n``-node lab."""
    runs = []
    with netlab.Lab(n, name=NAME, slurm=True) as lab:
        for r in range(repeats):
            picks = rng.sample(lab.hostnames, 2)
            faults = {"healthy": [], "slow_node": [("slow_node", picks[:1])], "slow_link": [("slow_link", picks)],
                      "collective": [("collective", picks[:1])], "mtu": [("mtu", picks[:1])],
                      "pair": [("slow_node", picks[:1]), ("collective", picks[1:])]}[name]
            for kind, nodes in faults:
                inject(lab, kind, nodes)
            try:
                run = one_run(lab, out / f"{name}-{r}")
            finally:
                for kind, nodes in faults:
                    clear(lab, kind, nodes)
            want_nodes = sorted(ns[0] for k, ns in faults if k != "slow_link")
            want_links = [tuple(sorted(ns, key=lab.hostnames.index)) for k, ns in faults if k == "slow_link"]
            run.update(injected=faults, named=sorted(run["nodes"]) == want_nodes and sorted(run["links"]) == sorted(want_links),
                       false_drains=sorted(set(run["nodes"]) - set(want_nodes)))
            print(f"  {name} run {r + 1}: injected {faults} -> nodes {run['nodes']} links {run['links']} "
                  f"({run['verdict']}, {run['tests']} tests, {run['rounds']} rounds, start {run['start_s']} s, "
                  f"rounds {run['rounds_s']} s)", flush=True)
            runs.append(run)
    return {"scenario": name, "nodes": n, "runs": repeats, "named": sum(r["named"] for r in runs),
            "false_drains": sum(len(r["false_drains"]) for r in runs),
            "rounds_max": max(r["rounds"] or 0 for r in runs), "bound": round_bound(n),
            "tests_mean": round(statistics.mean(r["tests"] or 0 for r in runs), 1), "pairs": n * (n - 1) // 2,
            "start_s_median": round(statistics.median(r["start_s"] or 0 for r in runs), 1),
            "rounds_s_median": round(statistics.median(r["rounds_s"] for r in runs), 1),
            "step_s_median": round(statistics.median(r["step_s"] or 0 for r in runs), 1),
            "step_s_max": max(r["step_s"] or 0 for r in runs), "detail": runs}


def prolog_seconds(n: int, contract: dict) -> dict:
    """The prolog tier (``runbook health-check``) on every node of a fresh lab: seconds per node, exit statuses."""
    with tempfile.TemporaryDirectory(dir=jobs.build_dir()) as tmp:
        path = Path(tmp) / "contract.json"
        path.write_text(json.dumps(contract))
        with netlab.Lab(n, name=NAME, slurm=True) as lab:
            per = {}
            for node in lab.hostnames:
                t0 = time.monotonic()
                proc = lab.run(node, [sys.executable, "-m", "helpers.cli", "health-check", "--contract", str(path)],
                               timeout_s=60, cwd=jobs.project_root())
                per[node] = {"s": round(time.monotonic() - t0, 2), "rc": proc.returncode,
                             "last": (proc.stdout.strip().splitlines() or [""])[-1]}
    return {"prolog_s_per_node": per, "prolog_s_max": max(v["s"] for v in per.values())}


def quick_seconds(n: int, out: Path) -> dict:
    """One ``runbook diagnose --tier quick`` over a healthy ``n``-node lab (1 rank per node): wall, exit, non-OK ids."""
    with netlab.Lab(n, name=NAME, slurm=True) as lab:
        t0 = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "helpers.cli", "diagnose", "--nodes", ",".join(lab.hostnames),
                               "--runner", "lab", "--lab-name", NAME, "--ranks-per-node", "1", "--tier", "quick",
                               "--out-dir", str(out)], cwd=jobs.project_root(), capture_output=True, text=True, timeout=1200)
        wall = time.monotonic() - t0
    report = max(out.glob("*/report.json"), key=lambda p: p.stat().st_mtime, default=None)
    data = json.loads(report.read_text()) if report else {"checks": []}
    return {"quick_s": round(wall, 1), "quick_rc": proc.returncode,
            "quick_not_ok": [c["id"] for c in data["checks"] if c["status"] != "OK"], "tail": proc.stdout[-1500:]}


def main(argv: list[str] | None = None) -> int:
    """Parse the flags, run the scenarios, print and append the figures."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", type=int, default=8, help="lab nodes (default 8)")
    parser.add_argument("--repeats", type=int, default=10, help="runs per scenario (default 10)")
    parser.add_argument("--scenario", action="append", choices=SCENARIOS, help="repeatable; default every scenario")
    parser.add_argument("--prolog", action="store_true", help="also time the prolog tier on every node")
    parser.add_argument("--quick", action="store_true", help="also time one runbook diagnose --tier quick")
    parser.add_argument("--seed", type=int, default=23)
    args = parser.parse_args(argv)
    if args.nodes < 3 or args.repeats < 1:
        parser.error("--nodes must be >= 3 and --repeats >= 1")
    os.environ["BASH_ENV"] = PROFILE  # the nodes' bash reads the node-local profile (empty unless a fault wrote it)
    rng = random.Random(args.seed)
    out = jobs.build_dir() / "bench" / f"localisation-{int(time.time())}"
    results = []
    load = os.getloadavg()
    for name in args.scenario or ([] if args.prolog or args.quick else SCENARIOS):
        res = scenario(name, args.nodes, args.repeats, rng, out)
        res["load"] = [round(x, 1) for x in load]
        print(f"{name}: named {res['named']}/{res['runs']}, false drains {res['false_drains']}, rounds max "
              f"{res['rounds_max']} (bound {res['bound']}), tests mean {res['tests_mean']} (pairs {res['pairs']}), "
              f"seconds median: start {res['start_s_median']}, rounds {res['rounds_s_median']}, step "
              f"{res['step_s_median']} (max {res['step_s_max']}); load {res['load']}", flush=True)
        results.append(res)
    if args.prolog:
        res = prolog_seconds(args.nodes, {"iface": "eth0", "mtu": 1500, "mtu_peer": "10.77.0.9",
                                          "mounts": [str(jobs.project_root())], "versions": {"python": "3.11"}})
        print(f"prolog tier: max {res['prolog_s_max']} s per node: {res['prolog_s_per_node']}", flush=True)
        results.append({"scenario": "prolog", "nodes": args.nodes, **res})
    if args.quick:
        res = quick_seconds(args.nodes, out / "quick")
        print(f"quick tier: {res['quick_s']} s, exit {res['quick_rc']}, not OK {res['quick_not_ok']}", flush=True)
        results.append({"scenario": "quick", "nodes": args.nodes, **res})
    dest = jobs.build_dir() / "bench" / "localisation_lab.jsonl"
    dest.parent.mkdir(parents=True, exist_ok=True)
    with dest.open("a") as fh:
        for res in results:
            fh.write(json.dumps(res) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
