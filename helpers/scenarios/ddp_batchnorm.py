"""D10: BatchNorm running statistics under DDP: per-rank, rank 0's, or global.

The model starts with ``BatchNorm1d(--features)`` on its input, so a BN layer's
``running_mean`` is simply the (exponential moving) mean of the data that rank saw.
Rank ``r`` draws its batches from ``N(r * --shift, 1)``: the shards differ (as when a
dataset is sharded by source), so per-rank statistics differ visibly; the global mean is
``shift * (world_size - 1) / 2``.

* ``--mode bug``: trains the same model twice, with ``broadcast_buffers=False`` and with the
  default ``broadcast_buffers=True``, and records each rank's ``running_mean`` and
  ``running_var`` after training, then again after one more forward through DDP in eval
  mode (where DDP's pre-forward buffer broadcast from rank 0 may run).
* ``--mode syncbn``: ``nn.SyncBatchNorm.convert_sync_batchnorm`` then DDP.  On CPU it first
  calls the SyncBN model without DDP (the error is logged) and then wraps it in DDP, which
  raises ``ValueError: SyncBatchNorm layers only work with GPU modules``.  On GPUs (NCCL) it
  trains and records the statistics, which are then global.
* ``--mode fix``: ``broadcast_buffers=False``, and every ``--sync-every`` steps and once after
  training the BN buffers are averaged across ranks with ``all_reduce`` (:func:`average_bn_buffers`).

Rank 0 writes every rank's statistics and the data means to ``--out``.
Source: seed D10; https://pytorch.org/docs/stable/generated/torch.nn.SyncBatchNorm.html

Example::

    torchrun --standalone --nproc-per-node 2 helpers/scenarios/ddp_batchnorm.py --mode bug --out d10.json
"""

from __future__ import annotations

import argparse
import gc
import sys

from helpers.scenarios import _common

MODES = ("bug", "syncbn", "fix")


def average_bn_buffers(model) -> int:
    """All-reduce (average) the ``running_mean`` and ``running_var`` of every BatchNorm layer of ``model``.

    Call it on every rank at the same point (it is a collective).  ``num_batches_tracked``
    is left alone (it is equal on every rank).

    Args:
        model: an ``nn.Module`` (or the ``.module`` of a DDP model).

    Returns:
        The number of BatchNorm layers averaged.
    """
    import torch
    import torch.distributed as dist

    world = dist.get_world_size()
    layers = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)
              and m.track_running_stats]
    for bn in layers:
        for buf in (bn.running_mean, bn.running_var):
            dist.all_reduce(buf, op=dist.ReduceOp.SUM)
            buf.div_(world)
    return len(layers)


def bn_stats(model) -> dict:
    """The first BatchNorm layer's ``running_mean`` and ``running_var`` as lists of floats."""
    import torch

    bn = next(m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm))
    return {"running_mean": bn.running_mean.tolist(), "running_var": bn.running_var.tolist()}


def main() -> int:
    """Run ``--mode`` (see the module docstring) and return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=MODES, default="bug")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=16, help="per-rank batch size")
    parser.add_argument("--features", type=int, default=4)
    parser.add_argument("--shift", type=float, default=2.0, help="rank r's data has mean r * shift")
    parser.add_argument("--sync-every", type=int, default=10, help="average BN buffers every N steps (fix)")
    parser.add_argument("--out", default=None, help="JSON written by rank 0")
    _common.add_dist_args(parser, timeout_s=30)
    args = parser.parse_args()
    if args.steps < 1 or args.sync_every < 1:
        parser.error("--steps and --sync-every must be >= 1")

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    _, device = _common.init_distributed(args.backend, args.timeout_s)
    rank, world = dist.get_rank(), dist.get_world_size()
    gen = torch.Generator().manual_seed(1000 + rank)
    batches = [(torch.randn(args.batch, args.features, generator=gen) + rank * args.shift).to(device)
               for _ in range(args.steps)]
    seen = torch.cat(batches)

    def new_model():
        torch.manual_seed(0)
        return nn.Sequential(nn.BatchNorm1d(args.features), nn.Linear(args.features, 8), nn.ReLU(),
                             nn.Linear(8, 1)).to(device)

    def train(ddp, label: str, sync_every: int | None = None) -> None:
        opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
        ddp.train()
        for step, x in enumerate(batches, 1):
            _common.log(f"step {step} ({label})")
            loss = ddp(x).pow(2).mean()
            opt.zero_grad()
            loss.backward()
            opt.step()
            if sync_every and step % sync_every == 0:
                average_bn_buffers(ddp.module)

    def eval_forward(ddp) -> None:
        ddp.eval()
        with torch.no_grad():
            ddp(batches[0])

    result: dict = {}
    if args.mode == "bug":
        for bb in (False, True):
            ddp = DDP(new_model(), broadcast_buffers=bb)
            train(ddp, f"broadcast_buffers={bb}")
            after_train = bn_stats(ddp.module)
            eval_forward(ddp)
            result[f"broadcast_buffers={bb}"] = {"after_training": after_train, "after_eval_forward": bn_stats(ddp.module)}
    elif args.mode == "syncbn":
        model = nn.SyncBatchNorm.convert_sync_batchnorm(new_model())
        if device.type == "cpu":
            try:
                model(batches[0])
            except ValueError as exc:
                _common.log(f"SyncBatchNorm forward without DDP on CPU: ValueError: {exc}")
        ddp = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
        train(ddp, "syncbn")
        result["syncbn"] = {"after_training": bn_stats(ddp.module)}
    else:
        ddp = DDP(new_model(), broadcast_buffers=False)
        train(ddp, "fix", sync_every=args.sync_every)
        average_bn_buffers(ddp.module)  # once more before evaluation / saving
        result["fix"] = {"after_training": bn_stats(ddp.module)}
    mine = {"result": result, "data_mean": seen.mean(0).tolist(), "data_var": seen.var(0).tolist()}
    everyone: list = [None] * world
    dist.all_gather_object(everyone, mine)
    if rank == 0 and args.out:
        means = torch.tensor([r["data_mean"] for r in everyone])
        within = torch.tensor([r["data_var"] for r in everyone]).mean(0)
        # equal sample counts per rank: total variance = mean within-rank variance + variance of the rank means
        _common.write_json_atomic(args.out, {"mode": args.mode, "world_size": world, "shift": args.shift,
                                             "steps": args.steps, "ranks": everyone,
                                             "global_data_mean": means.mean(0).tolist(),
                                             "global_data_var": (within + means.var(0, unbiased=False)).tolist()})
    # Free DDP (its reducer holds gloo work and tensors) while the interpreter is fully alive: gloo
    # threads that touch Python objects during interpreter shutdown abort a rank with "terminate
    # called without an active exception" (pytorch/pytorch#179291); we saw it ~1 in 50 DDP jobs.
    del ddp
    gc.collect()
    _common.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
