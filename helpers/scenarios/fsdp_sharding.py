"""D13: FSDP sharding strategies, measured per rank: bytes of params / grads / optimizer state and collective bytes per step.

FSDP2 (``fully_shard``) spells FSDP1's ``ShardingStrategy`` names this way (torch docs,
https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html):

* ``full_shard``: ``reshard_after_forward=True`` on a 1-D mesh (FULL_SHARD, ZeRO-3);
* ``shard_grad_op``: ``reshard_after_forward=False`` (SHARD_GRAD_OP, ZeRO-2: the unsharded
  parameters stay from forward to backward);
* ``no_shard``: a 2-D mesh ``(world_size, 1)``, i.e. every rank replicates (NO_SHARD, DDP-like:
  gradients are all-reduced);
* ``hybrid_shard``: a 2-D mesh ``(nodes, ranks_per_node)``: shard within a node, replicate
  across nodes (HYBRID_SHARD).  Needs ``world_size`` divisible by ``LOCAL_WORLD_SIZE``; run it
  as a two-node job (two torchrun agents) so the replica groups really span "nodes".

Every rank wraps the same model (``_fsdp.make_model``, each block its own unit), trains
``--steps`` Adam steps (fp32) and, on the last one, records ``_fsdp.model_state_bytes`` after
forward, after backward and after the optimizer step, and the collectives of the whole step
from a ``torch.profiler`` trace (op, dtype, nccl-tests size, bytes sent per rank).

Rank 0 writes ``--out`` (JSON: per strategy, per rank, per moment, bytes by component; the
collectives; the mesh).

Example::

    torchrun --standalone --nproc-per-node 2 helpers/scenarios/fsdp_sharding.py --out build/04_sharding.json
"""

from __future__ import annotations

import argparse
import gc
import sys
from typing import Any

from helpers.scenarios import _common, _fsdp

STRATEGIES = ("full_shard", "shard_grad_op", "no_shard", "hybrid_shard")


def build_parser() -> argparse.ArgumentParser:
    """Command-line parser (module docstring = what it measures)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--strategies", default="full_shard,shard_grad_op,no_shard",
                   help=f"comma-separated, from {', '.join(STRATEGIES)}")
    p.add_argument("--hidden", type=int, default=256, help="block width h (default 256)")
    p.add_argument("--blocks", type=int, default=4, help="number of blocks (default 4)")
    p.add_argument("--batch", type=int, default=8, help="batch per rank (default 8)")
    p.add_argument("--steps", type=int, default=2, help="Adam steps, >= 2 so optimizer state exists (default 2)")
    _common.add_dist_args(p, timeout_s=60)
    p.add_argument("--out", default=None, help="JSON result path (written by rank 0)")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and validate ``argv`` (exit status 2 naming the flag on a bad value)."""
    p = build_parser()
    args = p.parse_args(argv)
    args.strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    bad = [s for s in args.strategies if s not in STRATEGIES]
    if bad or not args.strategies:
        p.error(f"--strategies: {bad or args.strategies!r} not in {', '.join(STRATEGIES)}")
    if args.steps < 2:
        p.error(f"--steps must be >= 2, got {args.steps}")
    for flag in ("hidden", "blocks", "batch"):
        if getattr(args, flag) <= 0:
            p.error(f"--{flag} must be > 0")
    return args


def mesh_for(strategy: str, device: Any, world: int) -> tuple[Any, tuple[int, ...], int]:
    """The device mesh for ``strategy``: returns (mesh, its shape, all-reduce group size)."""
    from torch.distributed.device_mesh import init_device_mesh

    if strategy in ("full_shard", "shard_grad_op"):
        return init_device_mesh(device.type, (world,)), (world,), world
    if strategy == "no_shard":
        shape = (world, 1)
    else:
        local = _common.env_int("LOCAL_WORLD_SIZE", world)
        if world % local or world == local:
            raise ValueError(f"strategy=hybrid_shard needs several nodes: WORLD_SIZE={world}, LOCAL_WORLD_SIZE={local} "
                             "(launch two torchrun agents, --nnodes 2)")
        shape = (world // local, local)
    return init_device_mesh(device.type, shape, mesh_dim_names=("replicate", "shard")), shape, shape[0]


def run_strategy(strategy: str, args: argparse.Namespace, device: Any, world: int) -> dict[str, Any]:
    """Train ``args.steps`` steps under ``strategy``; return this rank's measurements."""
    import torch
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = _fsdp.make_model(args.hidden, args.blocks).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    mesh, shape, ar_group = mesh_for(strategy, device, world)
    reshard = strategy != "shard_grad_op"
    for block in model:
        fully_shard(block, mesh=mesh, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, reshard_after_forward=reshard)
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1 + torch.distributed.get_rank())
    moments: dict[str, Any] = {}
    trace = None
    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch, args.hidden, generator=gen).to(device)
        last = step == args.steps
        if last:
            trace = _fsdp.CollectiveTrace(world, allreduce_group_size=ar_group).__enter__()
        loss = model(x).pow(2).mean()
        if last:
            moments["after_forward"] = _fsdp.model_state_bytes(model, opt)
        loss.backward()
        if last:
            moments["after_backward"] = _fsdp.model_state_bytes(model, opt)
        opt.step()
        if last:
            moments["after_step"] = _fsdp.model_state_bytes(model, opt)
            trace.__exit__(None, None, None)
        opt.zero_grad(set_to_none=False)
        _common.log(f"{strategy} step {step} loss {loss.item():.5f}")
    result = {"strategy": strategy, "n_params": n_params, "mesh": list(shape), "reshard_after_forward": reshard,
              "collectives": trace.summary() if trace else {}, **moments}
    _common.log(f"{strategy}: mesh {shape}, after backward {moments['after_backward']}, "
                f"collectives {result['collectives']}")
    del model, opt
    gc.collect()
    return result


def main(argv: list[str] | None = None) -> int:
    """Measure every strategy in ``--strategies`` on this rank; rank 0 writes the JSON."""
    args = parse_args(argv)
    backend, device = _common.init_distributed(args.backend, args.timeout_s)
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    mine = [run_strategy(s, args, device, world) for s in args.strategies]
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, mine)
    if rank == 0 and args.out:
        out = [{"strategy": s, "n_params": everyone[0][i]["n_params"], "mesh": everyone[0][i]["mesh"],
                "ranks": {r: everyone[r][i] for r in range(world)}} for i, s in enumerate(args.strategies)]
        _common.write_json_atomic(args.out, {"world_size": world, "backend": backend, "hidden": args.hidden,
                                             "blocks": args.blocks, "strategies": out,
                                             "local_world_size": _common.env_int("LOCAL_WORLD_SIZE", world),
                                             "versions": {"torch": torch.__version__}})
        _common.log(f"wrote {args.out}")
    _common.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
