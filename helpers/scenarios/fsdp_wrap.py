"""D12: one FSDP unit around the whole model vs one unit per block, measured per rank.

For each wrapping in ``--wraps`` the script builds the same model (``_fsdp.make_model``:
``--blocks`` residual MLP blocks of width ``--hidden``) and wraps it:

* ``fsdp2-whole``: ``fully_shard(model)`` only: the whole model is one unit, so forward
  all-gathers every parameter at once (seed D12's symptom);
* ``fsdp2-per-block``: ``fully_shard(block)`` for each block, then ``fully_shard(model)``
  (the FSDP2 form of D12's fix: only one block is gathered at a time);
* ``fsdp1-whole`` / ``fsdp1-per-block``: FSDP1 ``FullyShardedDataParallel`` without and with
  ``auto_wrap_policy=ModuleWrapPolicy({Block})`` (the ``transformer_auto_wrap_policy`` role),
  with ``device_id=torch.device("cpu")`` on CPU (``--no-device-id`` leaves it out, to show
  the error FSDP1 raises then).

It then runs one forward, measuring at every block's forward pre- and post-hook:

* ``gathered_param_bytes`` (FSDP2): bytes of unsharded parameters registered on modules at that
  moment (what the all-gathers materialised); ``resident_param_bytes``: the rank's parameter
  shards, held all the time;
* ``live_bytes``: every tensor storage the garbage collector sees (on CUDA also
  ``torch.cuda.memory_allocated``), whose peak minus the value before forward is the forward's
  peak increase.

Rank 0 writes ``--out`` (JSON: per wrapping, per rank, the numbers above, the number of FSDP
units and the all-gathers the forward issued).

Example::

    torchrun --standalone --nproc-per-node 2 helpers/scenarios/fsdp_wrap.py --out build/04_wrap.json
"""

from __future__ import annotations

import argparse
import gc
import sys
from typing import Any

from helpers.scenarios import _common, _fsdp

WRAPS = ("fsdp2-whole", "fsdp2-per-block", "fsdp1-whole", "fsdp1-per-block")


def build_parser() -> argparse.ArgumentParser:
    """Command-line parser (module docstring = what it measures)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--wraps", default="fsdp2-whole,fsdp2-per-block", help=f"comma-separated, from {', '.join(WRAPS)}")
    p.add_argument("--hidden", type=int, default=256, help="block width h (default 256)")
    p.add_argument("--blocks", type=int, default=8, help="number of blocks (default 8: 4.2 M parameters at h=256)")
    p.add_argument("--batch", type=int, default=8, help="batch per rank (default 8)")
    p.add_argument("--no-device-id", action="store_true", help="FSDP1: leave device_id out (the CPU error)")
    _common.add_dist_args(p, timeout_s=60)
    p.add_argument("--out", default=None, help="JSON result path (written by rank 0)")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and validate ``argv`` (exit status 2 naming the flag on a bad value)."""
    p = build_parser()
    args = p.parse_args(argv)
    args.wraps = [w.strip() for w in args.wraps.split(",") if w.strip()]
    bad = [w for w in args.wraps if w not in WRAPS]
    if bad or not args.wraps:
        p.error(f"--wraps: {bad or args.wraps!r} not in {', '.join(WRAPS)}")
    for flag in ("hidden", "blocks", "batch"):
        if getattr(args, flag) <= 0:
            p.error(f"--{flag} must be > 0")
    return args


def wrap(kind: str, model: Any, device: Any, device_id: bool) -> tuple[Any, int]:
    """Apply wrapping ``kind`` to ``model``; return (wrapped model, number of FSDP units)."""
    import torch

    if kind.startswith("fsdp2"):
        from torch.distributed.fsdp import fully_shard

        units = 0
        if kind == "fsdp2-per-block":
            for block in model:
                fully_shard(block)
                units += 1
        return fully_shard(model), units + 1
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    kwargs: dict[str, Any] = {}
    if device_id:
        kwargs["device_id"] = device if device.type == "cuda" else torch.device("cpu")
    if kind == "fsdp1-per-block":
        kwargs["auto_wrap_policy"] = ModuleWrapPolicy({type(model[0])})
    wrapped = FSDP(model, **kwargs)
    return wrapped, len(FSDP.fsdp_modules(wrapped))


def measure_forward(kind: str, args: argparse.Namespace, device: Any, world: int) -> dict[str, Any]:
    """Wrap, run one forward with hooks on every block, and return this rank's numbers."""
    import torch

    torch.manual_seed(0)
    model = _fsdp.make_model(args.hidden, args.blocks).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    blocks = list(model)
    model, units = wrap(kind, model, device, device_id=not args.no_device_id)
    resident = _fsdp.storage_bytes(list(model.parameters()))
    samples: list[dict[str, Any]] = []

    def sample(where: str) -> None:
        rec = {"where": where, "live_bytes": _fsdp.live_tensor_bytes(collect=False)}
        if kind.startswith("fsdp2"):
            rec["gathered_param_bytes"] = _fsdp.storage_bytes([p for p in model.parameters() if not _fsdp.is_dtensor(p)])
        if device.type == "cuda":
            rec["cuda_allocated"] = int(torch.cuda.memory_allocated(device))
        samples.append(rec)

    handles = []
    for i, block in enumerate(blocks):
        handles.append(block.register_forward_pre_hook(lambda m, a, i=i: sample(f"block{i}.pre")))
        handles.append(block.register_forward_hook(lambda m, a, o, i=i: sample(f"block{i}.post")))
    x = torch.randn(args.batch, args.hidden, device=device)
    before = _fsdp.live_tensor_bytes()
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    with _fsdp.CollectiveTrace(world) as trace:
        out = model(x)
    for h in handles:
        h.remove()
    result = {"wrap": kind, "n_params": n_params, "units": units, "resident_param_bytes": resident,
              "live_before_forward": before, "peak_live_bytes": max(s["live_bytes"] for s in samples),
              "peak_gathered_param_bytes": max((s.get("gathered_param_bytes", 0) for s in samples), default=0),
              "all_gathers": trace.summary(), "samples": samples}
    result["forward_peak_increase"] = result["peak_live_bytes"] - before
    if device.type == "cuda":
        result["cuda_max_allocated"] = int(torch.cuda.max_memory_allocated(device))
    _common.log(f"{kind}: {units} FSDP unit(s), resident params {resident} B, "
                f"peak gathered params {result['peak_gathered_param_bytes']} B, "
                f"forward peak increase {result['forward_peak_increase']} B, output {tuple(out.shape)}")
    del out
    gc.collect()
    return result


def main(argv: list[str] | None = None) -> int:
    """Measure every wrapping in ``--wraps`` on this rank; rank 0 writes the JSON."""
    args = parse_args(argv)
    backend, device = _common.init_distributed(args.backend, args.timeout_s)
    import torch
    import torch.distributed as dist

    rank, world = dist.get_rank(), dist.get_world_size()
    mine = [measure_forward(kind, args, device, world) for kind in args.wraps]
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, mine)
    if rank == 0 and args.out:
        wraps = [{"wrap": kind, "ranks": {r: everyone[r][i] for r in range(world)}} for i, kind in enumerate(args.wraps)]
        _common.write_json_atomic(args.out, {"world_size": world, "backend": backend, "hidden": args.hidden,
                                             "blocks": args.blocks, "batch": args.batch, "wraps": wraps,
                                             "versions": {"torch": torch.__version__}})
        _common.log(f"wrote {args.out}")
    _common.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
