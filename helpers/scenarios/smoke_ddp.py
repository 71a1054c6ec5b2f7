"""Smoke test 02: DistributedDataParallel on 2+ ranks, with an exact checkpoint round trip.

Reproduces test 02 of the Gilbreth HPC guide (Gilbreth 6), following
the script structure of section 6.5:

1. ``init_process_group`` with an explicit timeout (``--timeout-s``, section 6.10 point 3),
   the device bound by ``LOCAL_RANK`` before the group forms on NCCL;
2. ``synchronize`` + ``barrier`` before and after building the model, then the DDP wrap;
3. ``--steps`` steps of MSELoss / AdamW lr=1e-4 on the MLP of section 5.3/6.4 (every rank
   draws its own random batch, as data-parallel ranks do), gradients all-reduced by DDP;
4. ``barrier``, rank 0 saves ``model.module.state_dict()`` and the optimizer state with
   ``torch.save`` (section 6.5 step 8), ``barrier``;
5. EVERY rank loads that file into a fresh model and optimizer and compares it with its
   own replica using ``torch.equal`` (bit-exact).  DDP keeps the replicas identical, so a
   pass on every rank also shows that the replicas agree with rank 0's.

The reported ``final_loss`` is the last step's loss averaged over the ranks (all_reduce),
``peak_memory`` the maximum over the ranks.  Rank 0 writes ``--out``; every rank exits 0
when the test passed everywhere, 1 when a check failed on any rank.

The guide's NCCL settings for a single Gilbreth node (section 6.3: ``NCCL_IB_DISABLE=1``,
``NCCL_P2P_LEVEL=NVL``...; configs/nccl_single_node.env) belong in the environment of the launch, not in this script.

Example (section 6.6)::

    torchrun --standalone --nproc-per-node 2 --log-dir build/torchrun-logs \\
        helpers/scenarios/smoke_ddp.py --ckpt-dir build/ckpt --out build/02.json
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any

from helpers.scenarios import _common

TEST_NAME = "02_ddp"
CKPT_NAME = "smoke_2gpu_ddp.pt"  # the guide's file name (section 6.7)
LOG_EVERY = 25  # the guide's progress cadence (section 6.7 "Loss Progression")


def build_parser() -> argparse.ArgumentParser:
    """Return the command-line parser of this smoke test (the common smoke-test CLI)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100, help="training steps (default 100, as in the guide)")
    parser.add_argument("--hidden", type=int, default=256, help="MLP hidden size h (default 256; 1024 on a GPU)")
    parser.add_argument("--batch", type=int, default=32, help="samples per step per rank (default 32)")
    _common.add_dist_args(parser, timeout_s=60)
    parser.add_argument("--ckpt-dir", required=True, help="directory rank 0 writes the checkpoint to")
    parser.add_argument("--out", required=True, help="path of the JSON result (written by rank 0)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model init and the data (default 0)")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and validate ``argv``; exits with status 2 naming the flag when a size is not positive."""
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag in ("steps", "hidden", "batch"):
        if getattr(args, flag) <= 0:
            parser.error(f"--{flag} must be > 0, got {getattr(args, flag)}")
    if args.timeout_s <= 0:
        parser.error(f"--timeout-s must be > 0, got {args.timeout_s}")
    return args


def make_model(hidden: int) -> Any:
    """Build the guide's test MLP (Gilbreth 5.3 and Gilbreth 6.4) with hidden size ``hidden``.

    Linear(h, 4h), GELU, Linear(4h, 4h), GELU, Linear(4h, h): 100,681,728 parameters at the
    guide's h=2048 and 1,575,168 at the CPU default h=256.  Returns an ``nn.Sequential`` on the CPU.
    """
    from torch import nn

    return nn.Sequential(
        nn.Linear(hidden, hidden * 4),
        nn.GELU(),
        nn.Linear(hidden * 4, hidden * 4),
        nn.GELU(),
        nn.Linear(hidden * 4, hidden),
    )


def tensors_equal(a: Any, b: Any) -> bool:
    """Return True when two (nested) state structures hold exactly equal tensors.

    Walks dicts, lists and tuples; tensors are compared with ``torch.equal`` after moving
    to the CPU (same dtype, shape and every element bit-equal, no tolerance), other leaves with ``==``.
    """
    import torch

    if isinstance(a, torch.Tensor) or isinstance(b, torch.Tensor):
        return isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor) and a.dtype == b.dtype \
            and torch.equal(a.cpu(), b.cpu())
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(tensors_equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return len(a) == len(b) and all(tensors_equal(x, y) for x, y in zip(a, b))
    return a == b


def main(argv: list[str] | None = None) -> int:
    """Run smoke test 02 on this rank; rank 0 writes the JSON result.

    Returns:
        0 when every rank ran every step, the averaged final loss is finite and every rank's
        reload was exact; 1 otherwise.  Real errors (a failed collective, a timeout)
        propagate as exceptions: the rank exits non-zero and torchrun stops the others.
    """
    args = parse_args(argv)

    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    # Step 1 (section 6.5): explicit timeout; set_device(LOCAL_RANK) happens inside on NCCL.
    backend, device = _common.init_distributed(args.backend, args.timeout_s)
    rank = dist.get_rank()
    world_size = dist.get_world_size()
    _common.log(f"test {TEST_NAME}: backend {backend}, device {device}, world size {world_size}")

    # Steps 4-5: synchronise, build the model (same seed on every rank), synchronise, wrap.
    _common.synchronize(device)
    dist.barrier()
    torch.manual_seed(args.seed)
    model = make_model(args.hidden).to(device)
    n_params = sum(p.numel() for p in model.parameters())
    _common.synchronize(device)
    dist.barrier()
    model = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    criterion = nn.MSELoss()
    data_gen = torch.Generator(device=device)
    data_gen.manual_seed(args.seed + 1 + rank)  # data parallel: each rank its own samples

    # Step 6: the training loop; DDP all-reduces the gradients inside backward().
    _common.reset_peak_memory(device)
    _common.synchronize(device)
    dist.barrier()
    steps_done = 0
    loss = torch.tensor(float("nan"), device=device)
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch, args.hidden, device=device, generator=data_gen)
        y = torch.randn(args.batch, args.hidden, device=device, generator=data_gen)
        optimizer.zero_grad(set_to_none=True)
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        steps_done = step
        if step % LOG_EVERY == 0 or step == args.steps:
            _common.log(f"step {step}/{args.steps} loss {loss.item():.4f}")
    _common.synchronize(device)
    train_s = time.perf_counter() - start
    peak = _common.peak_memory(device)  # the training peak, read before the checkpoint reload

    # Step 7-8: barrier, rank 0 saves the unwrapped module (model.module) + optimizer, barrier.
    dist.barrier()
    ckpt_path = os.path.join(args.ckpt_dir, CKPT_NAME)
    if rank == 0:
        os.makedirs(args.ckpt_dir, exist_ok=True)
        torch.save({"model_state_dict": model.module.state_dict(), "optimizer_state_dict": optimizer.state_dict(),
                    "step": steps_done, "world_size": world_size}, ckpt_path)
        _common.log(f"checkpoint saved: {ckpt_path}")
    dist.barrier()

    # Every rank reloads rank 0's file into fresh objects and compares with its own replica.
    fresh_model = make_model(args.hidden).to(device)
    fresh_opt = torch.optim.AdamW(fresh_model.parameters(), lr=1e-4)
    state = torch.load(ckpt_path, map_location=device, weights_only=True)
    fresh_model.load_state_dict(state["model_state_dict"])
    fresh_opt.load_state_dict(state["optimizer_state_dict"])
    params_exact = tensors_equal(model.module.state_dict(), fresh_model.state_dict())
    optim_exact = tensors_equal(optimizer.state_dict(), fresh_opt.state_dict())
    _common.log(f"checkpoint reload: {'SUCCESS' if params_exact and optim_exact else 'MISMATCH'} "
                f"(params exact {params_exact}, optimizer state exact {optim_exact})")

    # Combine over ranks: loss averaged, peak memory max, success flags min (all must hold).
    loss_sum = loss.detach().float().reshape(1).clone()
    dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM)
    final_loss = float(loss_sum.item()) / world_size
    peak_t = torch.tensor([peak["bytes"]], dtype=torch.int64, device=device)
    dist.all_reduce(peak_t, op=dist.ReduceOp.MAX)
    flags = torch.tensor([int(params_exact and optim_exact), int(steps_done == args.steps)],
                         dtype=torch.int64, device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MIN)
    reload_ok, all_steps = bool(flags[0].item()), bool(flags[1].item())
    passed = all_steps and reload_ok and math.isfinite(final_loss)
    steps_per_s = steps_done / train_s if train_s > 0 else float("inf")

    if rank == 0:
        result = {
            "test": TEST_NAME,
            "world_size": world_size,
            "backend": backend,
            "device": str(device),
            "hidden": args.hidden,
            "batch": args.batch,
            "steps": steps_done,
            "train_s": train_s,
            "steps_per_s": steps_per_s,
            "samples_per_s": steps_per_s * args.batch * world_size,
            "final_loss": final_loss,
            "params": n_params,
            "peak_memory": {"bytes": int(peak_t.item()), "kind": peak["kind"]},
            "checkpoint_path": ckpt_path,
            "checkpoint_reload": reload_ok,
            "checkpoint_bytes": os.path.getsize(ckpt_path),
            "passed": passed,
            "versions": {"torch": torch.__version__, "python": sys.version.split()[0]},
        }
        _common.write_json_atomic(args.out, result)
        _common.log(f"SMOKE TEST {TEST_NAME}: {'PASSED' if passed else 'FAILED'} "
                    f"({steps_per_s:.1f} steps/s, final loss {final_loss:.4f})")
    # Step 9. Not in a ``finally``: a rank that fails mid-collective must exit at once so
    # that torchrun sees the failure, rather than block in a teardown its peers never join.
    del model, optimizer
    _common.finish()
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
