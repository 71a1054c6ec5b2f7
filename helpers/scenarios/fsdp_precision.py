"""D14: FSDP mixed precision: which dtypes parameters, gradient reduction and buffers really use.

For each policy in ``--policies`` every rank wraps the same model (``_fsdp.make_model``, one
FSDP2 unit per block) and runs one forward/backward on the same data:

* ``implicit``: no ``mp_policy`` (everything fp32);
* ``param-bf16``: ``MixedPrecisionPolicy(param_dtype=bfloat16)`` with ``reduce_dtype`` left
  implicit, so gradients are reduced in bf16 too (seed D14's trap);
* ``bf16-reduce-fp32``: ``MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)``,
  D14's recommended setting.

It records, from the run itself: the dtype of ``fc1.weight`` as the block's forward sees it
(a forward pre-hook), the dtype of the block's buffer ``scale`` at that moment, the dtype of
the block's output, the dtype of the sharded parameter and of its gradient (what the
optimizer updates), and the dtype of the reduce-scatters/all-reduces the backward issued
(``torch.profiler`` trace).  It then compares each policy's reduced gradient with the
``bf16-reduce-fp32`` one (same bf16 compute, fp32 reduction): the max absolute difference is
what reducing in bf16 costs.

Rank 0 writes ``--out`` (JSON).  FSDP2's ``MixedPrecisionPolicy`` has no ``buffer_dtype``
(FSDP1's ``MixedPrecision`` has): buffers keep the dtype you give them.

Example::

    torchrun --standalone --nproc-per-node 2 helpers/scenarios/fsdp_precision.py --out build/04_precision.json
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from helpers.scenarios import _common, _fsdp

POLICIES = ("implicit", "param-bf16", "bf16-reduce-fp32")
REFERENCE = "bf16-reduce-fp32"


def build_parser() -> argparse.ArgumentParser:
    """Command-line parser (module docstring = what it shows)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--policies", default=",".join(POLICIES), help=f"comma-separated, from {', '.join(POLICIES)}")
    p.add_argument("--hidden", type=int, default=128, help="block width h (default 128)")
    p.add_argument("--blocks", type=int, default=2, help="number of blocks (default 2)")
    p.add_argument("--batch", type=int, default=64, help="batch per rank (default 64)")
    _common.add_dist_args(p, timeout_s=60)
    p.add_argument("--out", default=None, help="JSON result path (written by rank 0)")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and validate ``argv`` (exit status 2 naming the flag on a bad value)."""
    p = build_parser()
    args = p.parse_args(argv)
    args.policies = [s.strip() for s in args.policies.split(",") if s.strip()]
    bad = [s for s in args.policies if s not in POLICIES]
    if bad or not args.policies:
        p.error(f"--policies: {bad or args.policies!r} not in {', '.join(POLICIES)}")
    for flag in ("hidden", "blocks", "batch"):
        if getattr(args, flag) <= 0:
            p.error(f"--{flag} must be > 0")
    return args


def policy_for(name: str) -> Any:
    """The ``MixedPrecisionPolicy`` for ``name`` (``None`` for ``implicit``)."""
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    if name == "implicit":
        return None
    if name == "param-bf16":
        return MixedPrecisionPolicy(param_dtype=torch.bfloat16)
    return MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)


def run_policy(name: str, args: argparse.Namespace, device: Any, world: int) -> tuple[dict[str, Any], Any]:
    """One forward/backward under policy ``name``; return (dtypes seen, the gradient shard of fc1.weight)."""
    import torch
    from torch.distributed.fsdp import fully_shard

    def dt(t: Any) -> str:
        return str(t.dtype).replace("torch.", "")

    torch.manual_seed(0)
    model = _fsdp.make_model(args.hidden, args.blocks).to(device)
    policy = policy_for(name)
    kwargs = {"mp_policy": policy} if policy is not None else {}
    for block in model:
        fully_shard(block, **kwargs)
    fully_shard(model, **kwargs)
    seen: dict[str, Any] = {}
    first = model[0]

    def pre(module: Any, inputs: Any) -> None:
        seen.update(param_in_forward=dt(module.fc1.weight), buffer_in_forward=dt(module.scale),
                    input_in_forward=dt(inputs[0]))

    def post(module: Any, inputs: Any, output: Any) -> None:
        seen["block_output"] = dt(output)

    first.register_forward_pre_hook(pre)
    first.register_forward_hook(post)
    gen = torch.Generator().manual_seed(1 + torch.distributed.get_rank())
    x = torch.randn(args.batch, args.hidden, generator=gen).to(device)
    with _fsdp.CollectiveTrace(world) as trace:
        loss = model(x).float().pow(2).mean()
        loss.backward()
    weight = first.fc1.weight
    seen.update(policy=name, sharded_param=dt(weight.to_local()), sharded_grad=dt(weight.grad.to_local()),
                loss=float(loss), reductions={op: v["dtypes"] for op, v in trace.summary().items()
                                              if "reduce" in op})
    _common.log(f"{name}: {seen}")
    return seen, weight.grad.to_local().detach().float().clone()


def main(argv: list[str] | None = None) -> int:
    """Run every policy on this rank; rank 0 writes the JSON."""
    args = parse_args(argv)
    backend, device = _common.init_distributed(args.backend, args.timeout_s)
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    results, grads = {}, {}
    for name in args.policies:
        results[name], grads[name] = run_policy(name, args, device, world)
    if REFERENCE in grads:
        for name, grad in grads.items():
            results[name]["grad_max_abs_diff_vs_fp32_reduce"] = float((grad - grads[REFERENCE]).abs().max())
            results[name]["grad_max_abs"] = float(grad.abs().max())
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, results)
    if rank == 0 and args.out:
        _common.write_json_atomic(args.out, {"world_size": world, "backend": backend, "policies": args.policies,
                                             "ranks": {r: everyone[r] for r in range(world)},
                                             "versions": {"torch": torch.__version__}})
        _common.log(f"wrote {args.out}")
    _common.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
