"""Collective correctness and a bandwidth sweep, the way nccl-tests measures them.

Correctness: each rank fills its input with small integers that depend on the rank and the
element index (exact in float32), runs all_reduce (sum), all_gather, reduce_scatter (sum)
and broadcast (from the first and the last rank), and compares every output element with
the value it must have, exactly (``torch.equal``).  ``--corrupt-rank R`` makes rank R
contribute one wrong element, as a rank with silent data corruption would, so that the
check can be seen to fail.

Sweep: for each op and each size from ``--min-bytes`` to ``--max-bytes`` (doubling),
time ``iters`` back-to-back calls after a warm-up; ``iters`` is chosen on rank 0 so that
a size takes about ``--budget-s`` and broadcast to all ranks.  The time kept is the
slowest rank's (all_reduce MAX).  Sizes follow nccl-tests: the all_gather size is the
gathered output, the reduce_scatter size is the full input
(https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md).  Only times and
sizes are written; algbw/busbw are computed by ``helpers.busbw``.

Example::

    torchrun --standalone --nproc-per-node 2 helpers/scenarios/collectives.py --out coll.json
"""

from __future__ import annotations

import argparse
import sys
import time

from helpers.scenarios import _common, _speed

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast")


def _fill(count: int, rank: int, offset: int = 0):  # noqa: ANN202 - torch imported lazily
    """Rank-dependent small integers (0..63) as float32: sums stay exact."""
    import torch

    idx = torch.arange(offset, offset + count, dtype=torch.int64)
    return ((idx * 7 + rank * 13) % 64).to(torch.float32)


def _ops(dist):  # noqa: ANN001, ANN202
    """The tensor forms of all_gather / reduce_scatter (renamed ``*_single`` in torch 2.13)."""
    gather = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    scatter = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
    return gather, scatter


def check_correctness(count: int, corrupt_rank: int, device) -> list[dict]:  # noqa: ANN001
    """Run each op once on known data; return one record per op with wrong-element counts per rank."""
    import torch
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    all_gather, reduce_scatter = _ops(dist)
    count -= count % n

    def mine(c: int, offset: int = 0):  # noqa: ANN202
        x = _fill(c, rank, offset)
        if rank == corrupt_rank:
            x[0] += 1.0
        return x.to(device)

    cases = []
    x = mine(count)
    dist.all_reduce(x)
    cases.append(("all_reduce", x, sum(_fill(count, r) for r in range(n))))
    per = count // n
    out = torch.empty(count, device=device)
    all_gather(out, mine(per))
    cases.append(("all_gather", out, torch.cat([_fill(per, r) for r in range(n)])))
    out = torch.empty(per, device=device)
    reduce_scatter(out, mine(count))
    cases.append(("reduce_scatter", out, sum(_fill(count, r) for r in range(n))[rank * per:(rank + 1) * per]))
    for root in sorted({0, n - 1}):
        x = mine(count)
        dist.broadcast(x, src=root)
        cases.append((f"broadcast(root={root})", x, _fill(count, root)))
    records = []
    for name, got, want in cases:
        got = got.cpu()
        wrong = (got != want).nonzero().flatten()
        counts = torch.tensor([wrong.numel()], dtype=torch.int64, device=device)
        gathered = [torch.zeros_like(counts) for _ in range(n)]
        dist.all_gather(gathered, counts)
        first = None
        if wrong.numel():
            i = int(wrong[0])
            first = {"index": i, "got": float(got[i]), "want": float(want[i])}
        records.append({"op": name, "elements": int(want.numel()), "exact": bool(torch.equal(got, want)),
                        "wrong_per_rank": [int(c.item()) for c in gathered], "first_mismatch_rank0": first})
    return records


def sweep(ops: list[str], sizes: list[int], warmup: int, max_iters: int, budget_s: float, device) -> list[dict]:  # noqa: ANN001
    """Time each op at each size (bytes, float32); return one record per (op, size)."""
    import torch
    import torch.distributed as dist

    rank, n = dist.get_rank(), dist.get_world_size()
    all_gather, reduce_scatter = _ops(dist)
    rows = []
    for op in ops:
        for size in sizes:
            count = max(n, size // 4 - (size // 4) % n)
            if op == "all_gather":
                send, recv = torch.ones(count // n, device=device), torch.empty(count, device=device)
                call = lambda: all_gather(recv, send)  # noqa: E731
            elif op == "reduce_scatter":
                send, recv = torch.ones(count, device=device), torch.empty(count // n, device=device)
                call = lambda: reduce_scatter(recv, send)  # noqa: E731
            elif op == "all_reduce":
                buf = torch.ones(count, device=device)
                call = lambda: dist.all_reduce(buf)  # noqa: E731
            else:
                buf = torch.ones(count, device=device)
                call = lambda: dist.broadcast(buf, src=0)  # noqa: E731
            for _ in range(warmup):
                call()
            _common.synchronize(device)
            t = time.perf_counter()
            call()
            _common.synchronize(device)
            iters = torch.tensor([min(max_iters, max(1, int(budget_s / max(time.perf_counter() - t, 1e-6))))],
                                 device=device)
            dist.broadcast(iters, src=0)
            dist.barrier()
            t0 = time.perf_counter()
            for _ in range(int(iters.item())):
                call()
            _common.synchronize(device)
            elapsed = torch.tensor([(time.perf_counter() - t0) / int(iters.item())], dtype=torch.float64,
                                   device=device)
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
            rows.append({"op": op, "bytes": count * 4, "count": count, "iters": int(iters.item()),
                         "time_s": float(elapsed.item())})
            if rank == 0:
                _common.log(f"{op} {count * 4} B x{int(iters.item())}: {elapsed.item() * 1e6:.1f} us")
    return rows


def main() -> int:
    """Run the correctness check and the sweep; rank 0 writes ``--out``; exit 1 on a wrong element."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON file rank 0 writes")
    _common.add_dist_args(parser, timeout_s=60)
    parser.add_argument("--ops", default=",".join(OPS), help=f"comma-separated subset of {','.join(OPS)}")
    parser.add_argument("--check-elements", type=int, default=1 << 20, help="elements per correctness check")
    parser.add_argument("--min-bytes", type=int, default=32 << 10)
    parser.add_argument("--max-bytes", type=int, default=256 << 20)
    parser.add_argument("--warmup", type=int, default=1, help="untimed calls per size")
    parser.add_argument("--max-iters", type=int, default=20, help="most timed calls per size")
    parser.add_argument("--budget-s", type=float, default=0.2, help="target seconds of timed calls per size")
    parser.add_argument("--corrupt-rank", type=int, default=-1, help="rank that contributes a wrong element")
    parser.add_argument("--speed", choices=_speed.MODES, default="auto",
                        help="per-rank matmul / memory-copy measurement for the straggler score (default auto)")
    args = parser.parse_args()
    ops = [o for o in args.ops.split(",") if o]
    bad = [o for o in ops if o not in OPS]
    if bad:
        parser.error(f"--ops: unknown {bad}; accepted values are {', '.join(OPS)}")
    if not 0 < args.min_bytes <= args.max_bytes:
        parser.error("--min-bytes and --max-bytes must satisfy 0 < min <= max")
    for flag in ("check_elements", "max_iters"):
        if getattr(args, flag) < 1:
            parser.error(f"--{flag.replace('_', '-')} must be >= 1")

    import torch.distributed as dist

    backend, device = _common.init_distributed(args.backend, args.timeout_s)
    sizes = []
    size = args.min_bytes
    while size <= args.max_bytes:
        sizes.append(size)
        size *= 2
    speed = _speed.gather(args.speed, backend, device)
    correctness = check_correctness(args.check_elements, args.corrupt_rank, device)
    rows = sweep(ops, sizes, args.warmup, args.max_iters, args.budget_s, device) if ops else []
    if dist.get_rank() == 0:
        _common.write_json_atomic(args.out, {"backend": backend, "world_size": dist.get_world_size(),
                                             "device": str(device), "correctness": correctness, "sweep": rows,
                                             "speed": speed})
    _common.finish()
    return 0 if all(c["exact"] for c in correctness) else 1


if __name__ == "__main__":
    sys.exit(main())
