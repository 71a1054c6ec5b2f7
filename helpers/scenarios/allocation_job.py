"""One job across every node of the allocation: env contract, collectives, intra/inter-node busbw, node pairs.

Started once per node by ``srun --ntasks-per-node=1 ... torchrun`` (Gilbreth 4.3); every
rank writes ``<out_dir>/ranks/started-<host>-<local_rank>`` before the rendezvous and
``joined-<host>-<local_rank>`` after it, so the orchestrator (:mod:`helpers.allocation.across`) can name a
node whose ranks never joined.  Rank 0 then writes ``<out_dir>/allocation_job.json``:

* ``records``: every rank's :func:`env_report.collect` record plus ``SLURM_NODEID``;
* ``correctness``: :func:`collectives.check_correctness` over all ranks of all nodes;
* ``inter``: all_reduce sweep over every rank (crosses the network);
* ``intra``: ``{host: rows}``, all_reduce sweep inside each node's ranks (all nodes at once);
* ``pairs``: one rank per node (local rank 0), disjoint node pairs at once (round-robin rounds),
  ``[{"a", "b", "bytes", "time_s"}]``: busbw of a 2-rank all_reduce = algbw (nccl-tests factor 1);
* ``speed``: every rank's matmul GFLOP/s and memory-copy GB/s (:func:`helpers.scenarios._speed.measure`), for the
  straggler score (:mod:`helpers.allocation.straggler`), with its host, local rank and GPU; measured by all ranks at
  once on NCCL (each GPU is its own), one rank after the other on gloo (:func:`helpers.scenarios._speed.gather`);
* ``cpu_contention``: ``{host: share}``, the share (0-1) of the bandwidth sweeps' wall time during which some task on
  that node waited for a CPU (Linux PSI, :func:`helpers.hostinfo.cpu_contention`; the highest of its ranks' readings,
  None without PSI): on gloo a contended node is not graded (:data:`helpers.allocation.grades.CPU_CONTENDED`).

Bandwidth rows are ``{"op": "all_reduce", "bytes", "time_s", "ranks"}``; the orchestrator applies the
nccl-tests definitions (:mod:`helpers.busbw`).

Example (inside an allocation)::

    srun -N2 --ntasks-per-node=1 bash -c 'torchrun --nnodes 2 --nproc-per-node 2 --node-rank $SLURM_NODEID \\
        --master-addr node0 --master-port 29500 helpers/scenarios/allocation_job.py --out-dir build/x'
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

from helpers import hostinfo
from helpers.jobdir import JobDir
from helpers.scenarios import _common, _speed, collectives, env_report


def round_robin(n: int, max_rounds: int = 0) -> list[list[tuple[int, int]]]:
    """Rounds of disjoint pairs covering every pair of ``n`` items once (circle method); ``max_rounds`` > 0 keeps the first ones."""
    items = list(range(n)) + ([-1] if n % 2 else [])
    m = len(items)
    rounds = []
    for _ in range(m - 1):
        pairs = [(min(items[i], items[m - 1 - i]), max(items[i], items[m - 1 - i])) for i in range(m // 2)]
        rounds.append([p for p in pairs if p[0] >= 0])
        items = [items[0], items[-1], *items[1:-1]]
    return rounds[:max_rounds] if max_rounds > 0 else rounds


def _time_all_reduce(size: int, group, device, iters: int) -> float:  # noqa: ANN001
    """Median seconds of one all_reduce of ``size`` bytes (float32) in ``group`` after one warm-up."""
    import torch
    import torch.distributed as dist

    buf = torch.ones(max(1, size // 4), device=device)
    dist.all_reduce(buf, group=group)
    _common.synchronize(device)
    times = []
    for _ in range(iters):
        t = time.perf_counter()
        dist.all_reduce(buf, group=group)
        _common.synchronize(device)
        times.append(time.perf_counter() - t)
    return sorted(times)[len(times) // 2]


def _max_over(value: float, group, device) -> float:  # noqa: ANN001
    import torch
    import torch.distributed as dist

    t = torch.tensor([value], dtype=torch.float64, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX, group=group)
    return float(t.item())


def _touch(path: str | os.PathLike[str]) -> None:
    with open(path, "w") as fh:
        fh.write(f"{time.time()}\n")


def main() -> int:
    """Run the steps of the module docstring; rank 0 writes the JSON."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", required=True, help="shared folder for markers and the result")
    parser.add_argument("--backend", choices=_common.BACKENDS, default="auto")
    parser.add_argument("--timeout-s", type=float, default=60.0, help="collective timeout (seconds)")
    parser.add_argument("--check-elements", type=int, default=1 << 18)
    parser.add_argument("--sizes", default="1048576,4194304,16777216", help="sweep sizes in bytes, comma-separated")
    parser.add_argument("--pair-bytes", type=int, default=8 << 20, help="all_reduce size of each node pair")
    parser.add_argument("--iters", type=int, default=3, help="timed calls per size (median)")
    parser.add_argument("--max-rounds", type=int, default=0, help="pair rounds to run (0: all, round-robin)")
    parser.add_argument("--speed", choices=_speed.MODES, default="auto",
                        help="per-rank matmul / memory-copy measurement for the straggler score (default auto)")
    args = parser.parse_args()

    import torch.distributed as dist

    host, local = os.environ.get("SLURMD_NODENAME") or socket.gethostname(), int(os.environ.get("LOCAL_RANK", "0"))
    job = JobDir(args.out_dir)
    job.ranks_dir.mkdir(parents=True, exist_ok=True)
    _touch(job.node_marker("started", host, local))
    backend, device = _common.init_distributed(args.backend, args.timeout_s)
    _touch(job.node_marker("joined", host, local))
    rank, world = dist.get_rank(), dist.get_world_size()
    record = env_report.collect(backend, device)
    records: list = [None] * world
    dist.all_gather_object(records, record)
    speed = _speed.gather(args.speed, backend, device)
    correctness = collectives.check_correctness(args.check_elements, -1, device)
    sizes = [int(s) for s in args.sizes.split(",") if s]
    psi0, t0 = hostinfo.cpu_pressure_us(), time.monotonic()
    inter = [{"op": "all_reduce", "bytes": s, "ranks": world,
              "time_s": _max_over(_time_all_reduce(s, None, device, args.iters), None, device)} for s in sizes]
    hosts = list(dict.fromkeys(r["hostname"] for r in records))
    node_ranks = {h: [i for i, r in enumerate(records) if r["hostname"] == h] for h in hosts}
    node_groups = {h: dist.new_group(rs) for h, rs in node_ranks.items()}  # every rank creates every group
    mine = node_groups[socket.gethostname()]
    here = socket.gethostname()
    intra_local = [{"op": "all_reduce", "bytes": s, "ranks": len(node_ranks[here]),
                    "time_s": _max_over(_time_all_reduce(s, mine, device, args.iters), mine, device)}
                   for s in sizes] if len(node_ranks[here]) > 1 else []
    contention = hostinfo.cpu_contention(psi0, time.monotonic() - t0)
    intra_all: list = [None] * world
    dist.all_gather_object(intra_all, (here, intra_local, contention))
    per_node = {h: max((c for h2, _, c in intra_all if h2 == h and c is not None), default=None) for h, _, _ in intra_all}
    leaders = [rs[0] for rs in node_ranks.values()]
    rounds = round_robin(len(hosts), args.max_rounds)
    pair_groups = {(a, b): dist.new_group([leaders[a], leaders[b]]) for rnd in rounds for a, b in rnd}
    pairs = []
    for rnd in rounds:
        dist.barrier()
        for a, b in rnd:
            if rank in (leaders[a], leaders[b]):
                g = pair_groups[(a, b)]
                t = _max_over(_time_all_reduce(args.pair_bytes, g, device, args.iters), g, device)
                if rank == leaders[a]:
                    pairs.append({"a": hosts[a], "b": hosts[b], "bytes": args.pair_bytes, "time_s": t})
    pairs_all: list = [None] * world
    dist.all_gather_object(pairs_all, pairs)
    if rank == 0:
        result = {"world_size": world, "backend": backend, "hosts": hosts, "records": records,
                  "correctness": correctness, "inter": inter,
                  "intra": {h: rows for h, rows, _ in intra_all if rows}, "cpu_contention": per_node,
                  "pairs": [p for ps in pairs_all for p in ps], "rounds": len(rounds), "speed": speed}
        _common.write_json_atomic(os.path.join(args.out_dir, "allocation_job.json"), result)
        _common.log(f"wrote {os.path.join(args.out_dir, 'allocation_job.json')}: {json.dumps(result['pairs'])}")
    _common.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
