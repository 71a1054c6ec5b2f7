"""D9: DDP with uneven inputs: one rank runs out of batches and the others wait in all-reduce.

The dataset is split into per-rank shards of ``--shards`` samples (default ``13,8``: rank 0
gets 13 samples, rank 1 gets 8, as when each rank reads its own file of a sharded
dataset), batched by ``--batch`` (default 2: 7 and 4 batches).  Each step prints
``step N`` (1-based) and trains a small MLP under DDP, whose backward all-reduces the
gradients.

* ``--mode bug``: each rank loops over its own shard.  The short rank finishes after 4
  steps and then does ``--linger-s`` seconds of local work (an evaluation, a checkpoint
  write: here a sleep in :func:`local_work_after_loop`); the long rank's 5th backward
  waits in DDP's all-reduce for a peer that never joins, until the collective timeout
  (``--timeout-s``) ends it with ``Timed out waiting ...ms for recv operation to complete``.
* ``--mode join``: the same shards, the loop inside ``with Join([ddp_model]):``
  (``torch.distributed.algorithms.join``): a rank that runs out of data shadows the
  others' all-reduces until every rank is done.
* ``--mode sampler``: the whole dataset through ``DistributedSampler`` (``--drop-last``
  or not), which gives every rank the same number of samples, hence of batches.

Rank 0 writes ``--out`` (join/sampler): each rank's steps, sampler and loader lengths and
a checksum of its parameters (equal on every rank when the replicas stayed in sync).
Source: seed D9; https://docs.pytorch.org/tutorials/advanced/generic_join.html

Example::

    torchrun --standalone --nproc-per-node 2 helpers/scenarios/ddp_uneven.py --mode bug --timeout-s 5
    torchrun --standalone --nproc-per-node 2 helpers/scenarios/ddp_uneven.py --mode join --out d9.json
"""

from __future__ import annotations

import argparse
import gc
import sys
import time

from helpers.scenarios import _common

MODES = ("bug", "join", "sampler")


def parse_shards(text: str) -> list[int]:
    """Parse ``--shards`` (comma-separated sample counts, one per rank, each >= 1).

    Raises:
        ValueError: not a comma-separated list of positive integers (names the field).
    """
    try:
        counts = [int(p) for p in text.split(",")]
    except ValueError:
        raise ValueError(f"shards={text!r}: expected comma-separated positive integers, e.g. 13,8") from None
    if not counts or min(counts) < 1:
        raise ValueError(f"shards={text!r}: every count must be >= 1")
    return counts


def local_work_after_loop(seconds: float) -> None:
    """What the short rank does once its data is exhausted: local work, no collective (a sleep here)."""
    _common.log(f"out of data: local work for {seconds:g} s (no collective)")
    time.sleep(seconds)


def main() -> int:
    """Run ``--mode`` (see the module docstring) and return the exit status."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=MODES, default="bug")
    parser.add_argument("--shards", default="13,8", help="samples per rank, comma-separated, one per rank")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--drop-last", action="store_true", help="DistributedSampler(drop_last=True) (--mode sampler)")
    parser.add_argument("--linger-s", type=float, default=8.0, help="short rank's local work after its loop (bug)")
    parser.add_argument("--out", default=None, help="JSON written by rank 0 (join, sampler)")
    _common.add_dist_args(parser, timeout_s=10)
    args = parser.parse_args()
    try:
        shards = parse_shards(args.shards)
    except ValueError as exc:
        parser.error(str(exc))
    _common.log("start")

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader, DistributedSampler, Subset, TensorDataset

    _common.log("torch imported")
    _, device = _common.init_distributed(args.backend, args.timeout_s)
    rank, world = dist.get_rank(), dist.get_world_size()
    if len(shards) != world:
        raise ValueError(f"shards={args.shards!r}: needs one count per rank (world_size={world})")
    g = torch.Generator().manual_seed(0)
    total = sum(shards)
    data = TensorDataset(torch.randn(total, 16, generator=g), torch.randn(total, 1, generator=g))
    sampler = None
    sampler_len = {str(d): len(DistributedSampler(data, num_replicas=world, rank=rank, drop_last=d)) for d in (False, True)}
    if args.mode == "sampler":
        sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=False, drop_last=args.drop_last)
        loader = DataLoader(data, batch_size=args.batch, sampler=sampler)
    else:
        start = sum(shards[:rank])
        loader = DataLoader(Subset(data, range(start, start + shards[rank])), batch_size=args.batch)
    _common.log(f"{len(loader)} batches ({len(sampler) if sampler else shards[rank]} samples)")

    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 1)).to(device))
    opt = torch.optim.SGD(model.parameters(), lr=0.05)

    def train() -> int:
        steps = 0
        for x, y in loader:
            steps += 1
            _common.log(f"step {steps}")
            loss = nn.functional.mse_loss(model(x.to(device)), y.to(device))
            opt.zero_grad()
            loss.backward()
            opt.step()
        return steps

    if args.mode == "join":
        with Join([model]):
            steps = train()
    else:
        steps = train()
    _common.log(f"loop done after {steps} steps")
    if args.mode == "bug":
        local_work_after_loop(args.linger_s)
    checksum = float(sum(p.detach().double().sum() for p in model.parameters()))
    mine = {"steps": steps, "loader_len": len(loader), "samples": len(sampler) if sampler else shards[rank],
            "param_checksum": checksum, "sampler_len_by_drop_last": sampler_len}
    everyone: list = [None] * world
    dist.all_gather_object(everyone, mine)
    if rank == 0 and args.out:
        _common.write_json_atomic(args.out, {"mode": args.mode, "drop_last": args.drop_last, "shards": shards,
                                             "dataset_size": total, "batch": args.batch, "ranks": everyone})
    # Free DDP (its reducer holds gloo work and tensors) while the interpreter is fully alive: gloo
    # threads that touch Python objects during interpreter shutdown abort a rank with "terminate
    # called without an active exception" (pytorch/pytorch#179291); we saw it ~1 in 50 DDP jobs.
    del model, opt, train
    gc.collect()
    _common.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
