"""D15: FSDP state dicts: full on rank 0 vs sharded with DCP, a world-size change, and the rank-0-only save that hangs.

Modes (``--mode``):

* ``save``: every rank wraps the model with FSDP2 (one unit per block), trains ``--steps``
  Adam steps, then writes (1) a sharded checkpoint with ``torch.distributed.checkpoint``
  (DCP: one ``__<rank>_0.distcp`` file per rank plus ``.metadata``) of model AND optimizer
  state, from ``get_state_dict``; and (2) a full state dict of both, gathered by every rank
  with ``StateDictOptions(full_state_dict=True, cpu_offload=True)`` and written by rank 0
  only (``full.pt``, atomically: temp file + rename).
* ``load``: run with a different world size (e.g. one rank): builds the model WITHOUT FSDP,
  loads the sharded checkpoint with ``dcp.load`` (DCP reshards on load) and compares every
  parameter and every Adam state tensor with ``full.pt`` exactly; prints the max difference.
* ``load-naive``: what D15's symptom describes: each rank ``torch.save`` d its own shard
  (``naive_rank<R>.pt``, written by ``save``); loading rank 0's file into the model on one
  rank fails on every sharded tensor's shape.
* ``rank0-only``: the bug of D15/D23: ``if rank == 0: get_model_state_dict(full_state_dict=True)``.
  Gathering a full state dict is a collective (an all-gather per FSDP unit); the other ranks
  never enter it and wait in the next collective (a barrier) instead.
* ``fsdp1-offload``: FSDP1's full state dict with
  ``FullStateDictConfig(offload_to_cpu=True, rank0_only=True)``, the setting D15 recommends for
  GPUs, run on CPU (``--fsdp1-offload false`` uses ``offload_to_cpu=False``).

Sources: https://pytorch.org/docs/stable/distributed.checkpoint.html and
https://pytorch.org/tutorials/recipes/distributed_checkpoint_recipe.html (DCP, ``get_state_dict``,
``StateDictOptions``); seed D15.

Example::

    torchrun --standalone --nproc-per-node 2 helpers/scenarios/fsdp_checkpoint.py --mode save --ckpt-dir build/04_ckpt
    torchrun --standalone --nproc-per-node 1 helpers/scenarios/fsdp_checkpoint.py --mode load --ckpt-dir build/04_ckpt
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from typing import Any

from helpers.scenarios import _common, _fsdp

MODES = ("save", "load", "load-naive", "rank0-only", "fsdp1-offload")


def build_parser() -> argparse.ArgumentParser:
    """Command-line parser (module docstring = what it shows)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=MODES, required=True, help="what to run (see above)")
    p.add_argument("--ckpt-dir", required=True, help="checkpoint directory (sharded/ and full.pt)")
    p.add_argument("--hidden", type=int, default=128, help="block width h (default 128)")
    p.add_argument("--blocks", type=int, default=2, help="number of blocks (default 2)")
    p.add_argument("--steps", type=int, default=3, help="Adam steps before saving (default 3)")
    p.add_argument("--fsdp1-offload", choices=("true", "false"), default="true",
                   help="fsdp1-offload mode: FullStateDictConfig(offload_to_cpu=...) (default true)")
    _common.add_dist_args(p, timeout_s=60)
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and validate ``argv`` (exit status 2 naming the flag on a bad value)."""
    p = build_parser()
    args = p.parse_args(argv)
    for flag in ("hidden", "blocks", "steps"):
        if getattr(args, flag) <= 0:
            p.error(f"--{flag} must be > 0")
    return args


def train(model: Any, args: argparse.Namespace, device: Any) -> Any:
    """``args.steps`` Adam steps on rank-seeded random data; returns the optimizer."""
    import torch

    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    gen = torch.Generator().manual_seed(1 + torch.distributed.get_rank())
    for step in range(1, args.steps + 1):
        loss = model(torch.randn(8, args.hidden, generator=gen).to(device)).pow(2).mean()
        loss.backward()
        opt.step()
        opt.zero_grad()
        _common.log(f"step {step} loss {loss.item():.5f}")
    return opt


def fsdp2_model(args: argparse.Namespace, device: Any) -> Any:
    """The chapter's model with one FSDP2 unit per block."""
    import torch
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = _fsdp.make_model(args.hidden, args.blocks).to(device)
    for block in model:
        fully_shard(block)
    return fully_shard(model)


def save_atomic(obj: Any, path: str) -> None:
    """``torch.save`` to a temp file in the same directory, fsync, then rename over ``path``."""
    import torch

    fd, tmp = tempfile.mkstemp(prefix=".tmp-", dir=os.path.dirname(os.path.abspath(path)))
    try:
        with os.fdopen(fd, "wb") as fh:
            torch.save(obj, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def do_save(args: argparse.Namespace, device: Any) -> None:
    """Train, then write the sharded DCP checkpoint and the rank-0 full state dict."""
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model = fsdp2_model(args, device)
    opt = train(model, args, device)
    model_sd, optim_sd = get_state_dict(model, opt)
    sharded = os.path.join(args.ckpt_dir, "sharded")
    dcp.save({"model": model_sd, "optim": optim_sd}, checkpoint_id=sharded)
    _common.log(f"DCP saved {sharded}: {sorted(os.listdir(sharded))}")
    # What D15's symptom describes: every rank torch.saves its own shard.
    naive = {k: (v.to_local() if _fsdp.is_dtensor(v) else v) for k, v in model.state_dict().items()}
    save_atomic(naive, os.path.join(args.ckpt_dir, f"naive_rank{dist.get_rank()}.pt"))
    # Every rank takes part in the gather; only rank 0 gets (and writes) the tensors.
    full_model, full_optim = get_state_dict(model, opt, options=StateDictOptions(full_state_dict=True,
                                                                                 cpu_offload=True))
    if dist.get_rank() == 0:
        save_atomic({"model": full_model, "optim": full_optim}, os.path.join(args.ckpt_dir, "full.pt"))
        _common.log(f"rank 0 wrote full.pt: {len(full_model)} tensors, "
                    f"{sum(v.numel() for v in full_model.values())} parameters")
    else:
        _common.log(f"full state dict on this rank: {len(full_model)} entries (rank0 gets them, cpu_offload=True)")
    del model, opt


def do_load(args: argparse.Namespace, device: Any) -> None:
    """Load the sharded checkpoint on this world size (no FSDP) and compare it with full.pt exactly."""
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    torch.manual_seed(123)  # different init: only the checkpoint can make the weights equal
    model = _fsdp.make_model(args.hidden, args.blocks).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model_sd, optim_sd = get_state_dict(model, opt)  # initialises Adam's state so DCP can fill it
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, checkpoint_id=os.path.join(args.ckpt_dir, "sharded"))
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    full = torch.load(os.path.join(args.ckpt_dir, "full.pt"), weights_only=True)
    worst, compared = 0.0, 0
    for name, ref in full["model"].items():
        worst = max(worst, float((model.state_dict()[name].cpu() - ref).abs().max()))
        compared += 1
    _, loaded_optim = get_state_dict(model, opt)
    for key, ref_state in full["optim"]["state"].items():
        for field, ref in ref_state.items():
            worst = max(worst, float((loaded_optim["state"][key][field].cpu().float() - ref.float()).abs().max()))
            compared += 1
    steps = sorted({float(s["step"]) for s in loaded_optim["state"].values()})
    _common.log(f"loaded on world_size={dist.get_world_size()}: compared {compared} tensors "
                f"(params + Adam exp_avg/exp_avg_sq/step), max abs diff {worst}, Adam step {steps}")


def do_load_naive(args: argparse.Namespace, device: Any) -> None:
    """Load rank 0's own ``torch.save`` of its shard into the unsharded model (D15's symptom)."""
    import torch

    model = _fsdp.make_model(args.hidden, args.blocks).to(device)
    shard = torch.load(os.path.join(args.ckpt_dir, "naive_rank0.pt"), weights_only=True)
    _common.log(f"naive_rank0.pt: 0.fc1.weight {tuple(shard['0.fc1.weight'].shape)}, "
                f"model wants {tuple(model[0].fc1.weight.shape)}")
    model.load_state_dict(shard)


def do_rank0_only(args: argparse.Namespace, device: Any) -> None:
    """The bug: only rank 0 asks for the full state dict (a collective)."""
    import torch.distributed as dist
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

    model = fsdp2_model(args, device)
    train(model, args, device)
    if dist.get_rank() == 0:
        _common.log("rank 0: get_model_state_dict(full_state_dict=True) ...")
        full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        save_atomic(full, os.path.join(args.ckpt_dir, "rank0_only.pt"))
        _common.log("rank 0: saved")
    _common.log("waiting in dist.barrier()")
    dist.barrier()
    _common.log("past the barrier")


def do_fsdp1_offload(args: argparse.Namespace, device: Any) -> None:
    """FSDP1 FULL_STATE_DICT with FullStateDictConfig(offload_to_cpu=..., rank0_only=True)."""
    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    torch.manual_seed(0)
    model = _fsdp.make_model(args.hidden, args.blocks)
    model = FSDP(model, auto_wrap_policy=ModuleWrapPolicy({type(model[0])}),
                 device_id=device if device.type == "cuda" else torch.device("cpu"))
    train(model, args, device)
    offload = args.fsdp1_offload == "true"
    config = FullStateDictConfig(offload_to_cpu=offload, rank0_only=True)
    _common.log(f"FSDP1 FULL_STATE_DICT, offload_to_cpu={offload}, rank0_only=True")
    with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, config):
        full = model.state_dict()
    if dist.get_rank() == 0:
        save_atomic(full, os.path.join(args.ckpt_dir, "fsdp1_full.pt"))
    _common.log(f"full state dict: {len(full)} entries on this rank")


def main(argv: list[str] | None = None) -> int:
    """Run ``--mode`` on this rank."""
    args = parse_args(argv)
    os.makedirs(args.ckpt_dir, exist_ok=True)
    _, device = _common.init_distributed(args.backend, args.timeout_s)
    {"save": do_save, "load": do_load, "load-naive": do_load_naive, "rank0-only": do_rank0_only, "fsdp1-offload": do_fsdp1_offload}[args.mode](
        args, device)
    _common.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
