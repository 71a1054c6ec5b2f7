"""The straggler score: every rank's speed as a ratio to the best rank, and every node's from the pair matrix.

Pure functions: measured data in, :class:`~helpers.checks.Check` out.  The measurement runs inside the job that
already runs on every rank (``helpers/scenarios/_speed.py``, called by ``allocation_job.py`` across nodes and
``collectives.py`` on one node).

Anchors:

* nvidia-resiliency-ext's straggler detection: "Relative performance score: the best-performing rank in the
  workload is used as a reference", 0.0 (worst) to 1.0 (best); "if the relative performance score is 0.5, ... a
  rank is twice as slow as the fastest rank"
  (https://nvidia.github.io/nvidia-resiliency-ext/straggler_det/usage_guide.html); its usual threshold is 0.7,
  which is :data:`FAIL_BELOW` here.
* gpu-fryer: a GPU whose TFLOPS are not within ``--tflops-tolerance`` (default 10 %) of the best GPU fails
  (https://github.com/huggingface/gpu-fryer, README "Usage"): :data:`WARN_BELOW` = 0.9.

A rank's score is the lower of its two ratios (matrix multiply, memory copy); a node's score is its slowest rank's.
On CPU (gloo) the thresholds are :data:`CPU_WARN_BELOW` / :data:`CPU_FAIL_BELOW`, measured on the lab.
"""

from __future__ import annotations

import statistics
from collections.abc import Mapping, Sequence
from typing import Any

from helpers.checks import Check

WARN_BELOW = 0.9
"""A rank below 0.9 of the best rank: WARN (gpu-fryer's default 10 % tolerance)."""
FAIL_BELOW = 0.7
"""A rank below 0.7 of the best rank: FAIL (nvidia-resiliency-ext's straggler threshold)."""
CPU_WARN_BELOW = 0.4
"""On CPU (gloo, no GPU on any rank): WARN below 0.4 of the best rank.  The GPU anchors assume each rank owns its
device; on CPU the ranks share cores with whatever else runs, and on the SLURM lab every node shares one 2-core
machine.  Measured there (benchmarks/bench_straggler.py, 2 nodes x 2 ranks, 10 healthy and 10 throttled runs at load
1.4-8.3): healthy ranks scored 0.516-1.0 (lowest 0.516), the ranks of a node capped at a twentieth of one CPU
0.028-0.128 (highest 0.128).  The CPU thresholds split that gap with about 0.12 of margin on each side."""
CPU_FAIL_BELOW = 0.25
"""On CPU (gloo): FAIL below 0.25 of the best rank (see :data:`CPU_WARN_BELOW`)."""
SRC = ("https://nvidia.github.io/nvidia-resiliency-ext/straggler_det/usage_guide.html (relative score, 0.7); "
       "https://github.com/huggingface/gpu-fryer (10 % tolerance to the best GPU)")
SRC_CPU = "CPU thresholds measured on the SLURM lab: benchmarks/bench_straggler.py (straggler.CPU_WARN_BELOW)"
METRICS = ("matmul_gflops", "memcpy_gbps")


def status_of(score: float, warn_below: float = WARN_BELOW, fail_below: float = FAIL_BELOW) -> str:
    """OK at or above ``warn_below`` (default :data:`WARN_BELOW`), WARN from ``fail_below``, FAIL below."""
    return "OK" if score >= warn_below else "WARN" if score >= fail_below else "FAIL"


def thresholds(speed: Sequence[Mapping[str, Any]]) -> tuple[float, float, str]:
    """``(warn_below, fail_below, source)``: the GPU anchors when a rank has a GPU, else the CPU figures."""
    if any(r.get("gpu") for r in speed):
        return WARN_BELOW, FAIL_BELOW, SRC
    return CPU_WARN_BELOW, CPU_FAIL_BELOW, SRC_CPU


def score_ranks(speed: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Each rank's ratios to the best rank per metric and its score (the lower ratio), slowest first.

    Args:
        speed: ``allocation_job.py``'s ``speed`` rows (``rank``, ``host``, ``local_rank``, ``gpu``, and the
            :data:`METRICS`).

    Returns:
        ``[{"rank", "host", "local_rank", "gpu", "matmul_gflops", "memcpy_gbps", "matmul_ratio", "memcpy_ratio",
        "score", "status"}]``.

    Raises:
        ValueError: a row lacks a metric, or a metric is not > 0 on every rank (names the rank).
    """
    warn, fail, _ = thresholds(speed)
    best = {}
    for m in METRICS:
        for r in speed:
            if not isinstance(r.get(m), (int, float)) or not r[m] > 0:
                raise ValueError(f"speed row of rank {r.get('rank')}: {m}={r.get(m)!r}, expected a number > 0")
        best[m] = max(r[m] for r in speed)
    rows = []
    for r in speed:
        ratios = {m.split("_")[0] + "_ratio": round(r[m] / best[m], 3) for m in METRICS}
        score = min(ratios.values())
        rows.append({"rank": r.get("rank"), "host": r.get("host"), "local_rank": r.get("local_rank"), "gpu": r.get("gpu"),
                     **{m: r[m] for m in METRICS}, **ratios, "score": score, "status": status_of(score, warn, fail)})
    return sorted(rows, key=lambda x: (x["score"], x["rank"] if x["rank"] is not None else 0))


def _where(row: Mapping[str, Any]) -> str:
    gpu = row.get("gpu") or {}
    dev = f"GPU {gpu.get('index')} ({gpu.get('pci_bus_id')})" if gpu else f"local rank {row.get('local_rank')} (CPU)"
    return f"rank {row['rank']} on {row['host']}, {dev}"


def grade_ranks(speed: Sequence[Mapping[str, Any]], check_id: str = "straggler.ranks", *,
                contention: float | None = None) -> Check:
    """``straggler.ranks``: the slowest rank's score against :data:`WARN_BELOW` / :data:`FAIL_BELOW`, naming its node
    and GPU; ``faulty`` = the nodes with a rank below :data:`WARN_BELOW`.  One rank: INFO (no peer to compare).

    ``contention``: the share of the wall time the host's tasks waited for a CPU while the ranks were measured (Linux
    PSI, :func:`helpers.hostinfo.cpu_contention`; the one-node job's ranks all share that host).  Above
    :data:`helpers.allocation.grades.CPU_CONTENDED`, a CPU rank below the OK ratio is INFO, not graded: its speed then
    measures the scheduler, not the node (the rule the bandwidth grade follows), and no node is drained for it."""
    if len(speed) < 2:
        return Check(check_id, f"{len(speed)} rank measured: no peer to compare with", "INFO", {"ranks": list(speed)},
                     "", SRC)
    rows = score_ranks(speed)
    warn, fail, source = thresholds(speed)
    worst = rows[0]
    status = worst["status"]
    values = {"ranks": rows, "warn_below": warn, "fail_below": fail,
              "best": {m: max(r[m] for r in rows) for m in METRICS}, "mode": speed[0].get("mode"),
              "seconds": max((r.get("seconds") or 0) for r in speed)}
    if status == "OK":
        return Check(check_id, f"{len(rows)} ranks at {warn:g} of the best or more (slowest: {_where(worst)}, "
                     f"score {worst['score']:.2f})", "OK", values, "", source)
    from helpers.allocation.grades import CPU_CONTENDED

    if contention is not None and contention > CPU_CONTENDED and not any(r.get("gpu") for r in rows):
        values["cpu_contention"] = round(contention, 3)
        return Check(check_id, f"not graded: the slowest CPU rank ({_where(worst)}) at {worst['score']:.2f} of the best, "
                     f"measured while the host's CPUs were contended (tasks waited {contention:.0%} of the time, above "
                     f"{CPU_CONTENDED:.0%}): the ranks' speeds then measure the scheduler", "INFO", values,
                     "rerun on an idle node to grade it (top: what else runs there)", source)
    slow = [r for r in rows if r["status"] != "OK"]
    nodes = list(dict.fromkeys(r["host"] for r in slow))
    metric = "matmul" if worst["matmul_ratio"] <= worst["memcpy_ratio"] else "memory copy"
    title = (f"straggler: {_where(worst)} at {worst['score']:.2f} of the best rank ({metric}: "
             f"{worst['matmul_gflops']:.1f} GFLOP/s, {worst['memcpy_gbps']:.2f} GB/s); {len(slow)} rank(s) below "
             f"{warn:g}")
    fix = (f"drain {', '.join(nodes)} (--exclude={','.join(nodes)}) or find why it is slow: GPU clocks held down "
           "(gpu.throttle, nvidia-smi -q -d PERFORMANCE), a power cap (gpu.power), another job on its GPU or CPUs "
           "(nvidia-smi, top), a CPU share capped by its cgroup (cat /sys/fs/cgroup/.../cpu.max)")
    return Check(check_id, title, status, values, fix, source, faulty=nodes)


def node_pair_scores(matrix: Mapping[str, Mapping[str, float]]) -> dict[str, float]:
    """Each node's median pair busbw as a ratio to the best node's median (``{node: ratio}``); 3 or more nodes.

    A slow node is slow in every pair of its own, so its median is low; a slow link lowers one pair of two nodes
    whose other pairs keep their medians up (the bisection of :func:`helpers.allocation.grades.grade_pairs`).
    """
    medians = {n: statistics.median(row.values()) for n, row in matrix.items() if row}
    if len(medians) < 3:
        return {}
    best = max(medians.values())
    return {n: round(v / best, 3) if best > 0 else 0.0 for n, v in medians.items()}


def grade_nodes(matrix: Mapping[str, Mapping[str, float]], check_id: str = "straggler.nodes", *,
                warn_below: float = WARN_BELOW, fail_below: float = FAIL_BELOW, source: str = SRC) -> Check:
    """``straggler.nodes``: each node's score from the node-pair matrix (:func:`node_pair_scores`), graded like a
    rank (``warn_below`` / ``fail_below``: :func:`thresholds` of the job's ranks, so gloo pairs on CPU are graded with
    the CPU thresholds); with 2 nodes there is one pair, which cannot tell the nodes apart: INFO.

    A relative score names a straggler only when most nodes are not one: when half the nodes or more fall below
    ``warn_below`` the spread is the fabric's or the machines' load, not a node's, and the record is a WARN that names
    no node to drain (on the 8-node lab, 2 cores shared by 8 nodes, healthy pair medians spread from 0.59 to 1.0 of
    the best: graded against the GPU anchors they drained 6 of 8 healthy nodes).
    """
    scores = node_pair_scores(matrix)
    if not scores:
        return Check(check_id, f"{len(matrix)} node(s): one pair or none, no node score from the pair matrix", "INFO",
                     {"matrix": matrix}, "", source)
    worst = min(scores, key=scores.__getitem__)
    status = status_of(scores[worst], warn_below, fail_below)
    values = {"scores": scores, "warn_below": warn_below, "fail_below": fail_below}
    if status == "OK":
        return Check(check_id, f"{len(scores)} nodes within {1 - warn_below:.0%} of the best in the pair matrix "
                     f"(lowest {worst}: {scores[worst]:.2f})", "OK", values, "", source)
    slow = [n for n, s in sorted(scores.items(), key=lambda kv: kv[1]) if status_of(s, warn_below, fail_below) != "OK"]
    if 2 * len(slow) >= len(scores):
        return Check(check_id, f"{len(slow)} of {len(scores)} nodes below {warn_below:.2f} of the best node's pair "
                     f"busbw (lowest {worst}: {scores[worst]:.2f}): a spread across most nodes, not one straggler",
                     "WARN", values, "no node to drain on this record: compare pairs.bandwidth and the envelope, and "
                     "rerun on an idle allocation", source)
    return Check(check_id, f"straggler node {worst}: its pairs' median busbw is {scores[worst]:.2f} of the best node's",
                 status, values, f"drain {', '.join(slow)} (--exclude={','.join(slow)}); see pairs.bandwidth for the link",
                 source, faulty=slow)


def checks_for_job(data: Mapping[str, Any], matrix: Mapping[str, Mapping[str, float]] | None = None,
                   prefix: str = "", *, contention: float | None = None) -> list[Check]:
    """The straggler records of a job's JSON (``speed`` rows; the node-pair ``matrix`` when given): ``[]`` when the job
    measured no speed (``--speed off``).  Ids ``<prefix>straggler.ranks`` / ``<prefix>straggler.nodes``: the one-node
    collectives job uses no prefix, the job across nodes ``job.`` (both run inside an allocation: one report).
    ``contention``: the one-node job's host CPU contention (:func:`grade_ranks`)."""
    out = []
    if data.get("speed"):
        out.append(grade_ranks(data["speed"], f"{prefix}straggler.ranks", contention=contention))
    if matrix is not None:
        warn, fail, source = thresholds(data.get("speed") or [])
        out.append(grade_nodes(matrix, f"{prefix}straggler.nodes", warn_below=warn, fail_below=fail, source=source))
    return out
