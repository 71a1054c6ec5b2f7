"""Smoke test 01: one process trains a small MLP, checkpoints it, and reloads it exactly.

Reproduces test 01 of the Gilbreth HPC guide (gilbreth-hpc-guide.md section 5): the
3-layer MLP of section 5.3 (Linear(h,4h) GELU Linear(4h,4h) GELU Linear(4h,h)), MSELoss
on random inputs and targets, AdamW lr=1e-4, ``--steps`` steps (100 in the guide), then a
``torch.save`` checkpoint (model + optimizer state dicts, section 5.5 "Checkpoint
Verification") that is loaded into a fresh model and optimizer and compared tensor by
tensor with ``torch.equal``: the reload must be bit-exact, not merely close.

Runs on ``cuda:0`` when CUDA is available, on the CPU otherwise.  The defaults are sized
for a CPU (``--hidden 256``); the guide's GPU run used ``--hidden 1024`` (25,175,040
parameters, ~95 steps/s on one A100, section 5.5).

Rank 0 (the only rank) writes ``--out``, a JSON result; the exit code is 0 when the test
passed and 1 when a check failed.

Example::

    python helpers/scenarios/smoke_single.py --ckpt-dir build/ckpt --out build/01.json
"""

from __future__ import annotations

import argparse
import math
import os
import sys
import time
from typing import Any

from helpers.scenarios import _common

TEST_NAME = "01_single"
CKPT_NAME = "smoke_1gpu.pt"  # the guide's file name (section 5.5)
LOG_EVERY = 25  # the guide's progress cadence (section 5.5 "Loss Progression")


def build_parser() -> argparse.ArgumentParser:
    """Return the command-line parser of this smoke test (the common CLI, without ``--backend``)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100, help="training steps (default 100, as in the guide)")
    parser.add_argument("--hidden", type=int, default=256, help="MLP hidden size h (default 256; 1024 on a GPU)")
    parser.add_argument("--batch", type=int, default=32, help="samples per step (default 32)")
    parser.add_argument("--timeout-s", type=float, default=60.0,
                        help="accepted for a common CLI; a single process has no collective to time out")
    parser.add_argument("--ckpt-dir", required=True, help="directory the checkpoint is written to")
    parser.add_argument("--out", required=True, help="path of the JSON result")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model init and the data (default 0)")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and validate ``argv``; exits with status 2 naming the flag when a size is not positive."""
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag in ("steps", "hidden", "batch"):
        if getattr(args, flag) <= 0:
            parser.error(f"--{flag} must be > 0, got {getattr(args, flag)}")
    return args


def make_model(hidden: int) -> Any:
    """Build the guide's test MLP (gilbreth-hpc-guide.md section 5.3) with hidden size ``hidden``.

    Linear(h, 4h), GELU, Linear(4h, 4h), GELU, Linear(4h, h): 25,175,040 parameters at
    h=1024 and 1,575,168 at the CPU default h=256.  Returns an ``nn.Sequential`` on the CPU.
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

    Walks dicts, lists and tuples; tensors are compared with ``torch.equal`` (same shape
    and every element bit-equal, no tolerance), other leaves with ``==``.
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
    """Run smoke test 01 and write its JSON result.

    Returns:
        0 when every step ran, the final loss is finite and the reload was exact; 1 otherwise
        (the JSON is written in both cases).  Real errors propagate as exceptions.
    """
    args = parse_args(argv)

    import torch
    from torch import nn

    device = torch.device("cuda:0" if torch.cuda.is_available() else "cpu")
    torch.manual_seed(args.seed)
    model = make_model(args.hidden).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    criterion = nn.MSELoss()
    data_gen = torch.Generator(device=device)
    data_gen.manual_seed(args.seed + 1)
    n_params = sum(p.numel() for p in model.parameters())
    _common.log(f"test {TEST_NAME}: device {device}, hidden {args.hidden}, params {n_params:,}")

    _common.reset_peak_memory(device)
    _common.synchronize(device)
    steps_done = 0
    loss = torch.tensor(float("nan"))
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
    final_loss = float(loss.item())

    # Checkpoint (section 5.5): model + optimizer state, then reload into fresh objects.
    os.makedirs(args.ckpt_dir, exist_ok=True)
    ckpt_path = os.path.join(args.ckpt_dir, CKPT_NAME)
    torch.save({"model_state_dict": model.state_dict(), "optimizer_state_dict": optimizer.state_dict(),
                "step": steps_done}, ckpt_path)
    ckpt_bytes = os.path.getsize(ckpt_path)
    _common.log(f"checkpoint saved: {ckpt_path} ({ckpt_bytes} bytes)")

    fresh_model = make_model(args.hidden).to(device)
    fresh_opt = torch.optim.AdamW(fresh_model.parameters(), lr=1e-4)
    state = torch.load(ckpt_path, map_location=device, weights_only=True)
    fresh_model.load_state_dict(state["model_state_dict"])
    fresh_opt.load_state_dict(state["optimizer_state_dict"])
    params_exact = all(torch.equal(a, b) for a, b in zip(model.state_dict().values(),
                                                         fresh_model.state_dict().values()))
    optim_exact = tensors_equal(optimizer.state_dict(), fresh_opt.state_dict())
    reload_ok = params_exact and optim_exact
    _common.log(f"checkpoint reload: {'SUCCESS' if reload_ok else 'MISMATCH'} "
                f"(params exact {params_exact}, optimizer state exact {optim_exact})")

    passed = steps_done == args.steps and math.isfinite(final_loss) and reload_ok
    steps_per_s = steps_done / train_s if train_s > 0 else float("inf")
    result = {
        "test": TEST_NAME,
        "world_size": 1,
        "backend": None,
        "device": str(device),
        "hidden": args.hidden,
        "batch": args.batch,
        "steps": steps_done,
        "train_s": train_s,
        "steps_per_s": steps_per_s,
        "samples_per_s": steps_per_s * args.batch,
        "final_loss": final_loss,
        "params": n_params,
        "peak_memory": peak,
        "checkpoint_path": ckpt_path,
        "checkpoint_reload": reload_ok,
        "checkpoint_bytes": ckpt_bytes,
        "passed": passed,
        "versions": {"torch": torch.__version__, "python": sys.version.split()[0]},
    }
    _common.write_json_atomic(args.out, result)
    _common.log(f"SMOKE TEST {TEST_NAME}: {'PASSED' if passed else 'FAILED'} "
                f"({steps_per_s:.1f} steps/s, final loss {final_loss:.4f})")
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
