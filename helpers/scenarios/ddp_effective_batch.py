"""D11: the DDP gradient is the gradient of the global batch (per-rank batch x world_size).

A fixed global batch of ``--per-rank-batch * --world`` samples is drawn from a seeded
generator, and the same seeded model computes gradients of it in one of two ways:

* ``--mode ddp`` (under a launcher, ``world_size`` ranks): rank ``r`` takes rows
  ``[r*b, (r+1)*b)`` of the global batch, runs forward/backward under DDP (which averages the
  gradients across ranks with all-reduce);
* ``--mode single`` (one plain process, no process group): forward/backward on the whole
  global batch.

Each is done twice, with ``reduction="mean"`` and with ``reduction="sum"`` in the MSE loss.
Rank 0 (or the single process) writes the flattened gradients, per reduction, to ``--out``;
in DDP mode every rank's gradient checksum is written too (all equal after the all-reduce).
With ``mean``, the DDP gradient equals the single-process gradient of the global batch; with
``sum``, it is that gradient divided by world_size (DDP averages, it does not sum).
Source: seed D11; https://pytorch.org/docs/stable/notes/ddp.html

Example::

    torchrun --standalone --nproc-per-node 2 helpers/scenarios/ddp_effective_batch.py --mode ddp --out ddp.json
    python helpers/scenarios/ddp_effective_batch.py --mode single --world 2 --out single.json
"""

from __future__ import annotations

import argparse
import gc
import sys

from helpers.scenarios import _common

REDUCTIONS = ("mean", "sum")


def global_batch(per_rank_batch: int, world: int, features: int):
    """The fixed global batch ``(x, y)`` of ``per_rank_batch * world`` rows (seeded, identical everywhere)."""
    import torch

    g = torch.Generator().manual_seed(1234)
    n = per_rank_batch * world
    return torch.randn(n, features, generator=g), torch.randn(n, 1, generator=g)


def make_model(features: int):
    """The seeded model (identical initial weights in every process)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(features, 32), nn.Tanh(), nn.Linear(32, 1))


def main() -> int:
    """Compute and write the gradients for ``--mode`` (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("ddp", "single"), required=True)
    parser.add_argument("--per-rank-batch", type=int, default=8)
    parser.add_argument("--world", type=int, default=None,
                        help="world size the global batch is built for (single mode; ddp mode uses WORLD_SIZE)")
    parser.add_argument("--features", type=int, default=16)
    parser.add_argument("--out", required=True, help="JSON written by rank 0 / the single process")
    _common.add_dist_args(parser, timeout_s=30)
    args = parser.parse_args()
    if args.mode == "single" and not args.world:
        parser.error("--mode single needs --world (the world size whose global batch to reproduce)")
    if args.per_rank_batch < 1:
        parser.error("--per-rank-batch must be >= 1")

    import torch
    from torch import nn

    grads: dict[str, list[float]] = {}
    if args.mode == "single":
        world, rank = args.world, 0
        model = make_model(args.features)
        x, y = global_batch(args.per_rank_batch, world, args.features)
        net = model
    else:
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel as DDP

        _, device = _common.init_distributed(args.backend, args.timeout_s)
        world, rank = dist.get_world_size(), dist.get_rank()
        model = make_model(args.features).to(device)
        net = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        gx, gy = global_batch(args.per_rank_batch, world, args.features)
        rows = slice(rank * args.per_rank_batch, (rank + 1) * args.per_rank_batch)
        x, y = gx[rows].to(device), gy[rows].to(device)
    _common.log(f"step 1: {len(x)} local samples of a global batch of {args.per_rank_batch * world}")
    checksums = {}
    for reduction in REDUCTIONS:
        model.zero_grad(set_to_none=True)
        nn.functional.mse_loss(net(x), y, reduction=reduction).backward()
        flat = torch.cat([p.grad.detach().reshape(-1).cpu() for p in model.parameters()])
        grads[reduction] = flat.tolist()
        checksums[reduction] = float(flat.double().sum())
    record = {"mode": args.mode, "world_size": world, "per_rank_batch": args.per_rank_batch,
              "global_batch": args.per_rank_batch * world, "local_batch": len(x), "grads": grads}
    if args.mode == "ddp":
        import torch.distributed as dist

        everyone: list = [None] * world
        dist.all_gather_object(everyone, checksums)
        record["rank_checksums"] = everyone
        if rank == 0:
            _common.write_json_atomic(args.out, record)
        # Free DDP (its reducer holds gloo work and tensors) while the interpreter is fully alive: gloo
        # threads that touch Python objects during interpreter shutdown abort a rank with "terminate
        # called without an active exception" (pytorch/pytorch#179291); we saw it ~1 in 50 DDP jobs.
        del net, model
        gc.collect()
        _common.finish()
    else:
        _common.write_json_atomic(args.out, record)
    return 0


if __name__ == "__main__":
    sys.exit(main())
