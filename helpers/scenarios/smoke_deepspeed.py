"""Smoke test 03: DeepSpeed ZeRO stage 1 with bf16 on 2 ranks, with a collective checkpoint round trip.

Reproduces test 03 of the Gilbreth HPC guide (gilbreth-hpc-guide.md section 7), following
the script structure of section 7.7 and the three fixes of section 7.5:

1. ``deepspeed.init_distributed(dist_backend=..., timeout=...)`` (the device bound by
   ``LOCAL_RANK`` first on NCCL); the model is built on the CPU and handed to
   ``deepspeed.initialize(model=..., model_parameters=..., config=<json>)``, which moves it
   to the device, casts it to bf16 and builds the ZeRO-1 optimizer from the config's
   ``optimizer`` section (issue 1: ZeRO-1 without one fails with
   ``zero stage 1 requires an optimizer``);
2. inputs and targets are created in the module's dtype, ``torch.bfloat16`` under the
   shipped configs (issue 2: float32 inputs fail with ``mat1 and mat2 must have the same
   dtype, but got Float and BFloat16``);
3. ``engine.backward(loss)`` and ``engine.step()`` for ``--steps`` steps;
4. ``engine.save_checkpoint(dir, tag=...)`` and ``engine.load_checkpoint(dir, tag=...)`` on
   ALL ranks (issue 3: they are collectives; calling them on rank 0 only hangs).  Between the
   two the module parameters are overwritten with garbage, so that the exact comparison with
   the pre-save copies afterwards proves the load restored them (a no-op load would fail).

The model is the MLP of section 5.3 (the same as tests 01 and 02, so the three are
comparable); section 7.6 used a wider 6-layer MLP (~805M parameters) to show ZeRO-1's
memory saving, which does not fit a CPU smoke test.

The DeepSpeed config comes from ``--deepspeed-config`` (default ``configs/ds_zero1_cpu.json``
at the repository root; ``configs/ds_zero1_gpu.json`` has the guide's GPU values).  When
``--batch`` differs from its ``train_micro_batch_size_per_gpu``, the script passes DeepSpeed
a copy with the micro batch replaced and ``train_batch_size`` dropped (DeepSpeed then derives
it as micro x accumulation x world size); otherwise the file's path is passed unchanged and
DeepSpeed checks ``train_batch_size`` against the world size itself (section 7.4).

Rank 0 writes ``--out``; every rank exits 0 when the test passed everywhere, 1 when a check
failed on any rank.  The ``--local_rank=N`` argument that the ``deepspeed`` launcher appends
is accepted (``LOCAL_RANK`` from the environment wins when both are set).

Example (section 7.8)::

    deepspeed --num_gpus 2 helpers/scenarios/smoke_deepspeed.py \\
        --ckpt-dir build/ckpt --out build/03.json

On a CPU box DeepSpeed JIT-builds a shared-memory comm op on first use (~35 s); point
``TORCH_EXTENSIONS_DIR`` at a directory that persists so later runs reuse it.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Any

from helpers.scenarios import _common

TEST_NAME = "03_deepspeed_zero1"
LOG_EVERY = 25  # the guide's progress cadence (section 7.9 "Loss Progression")
REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_CONFIG = os.path.join(REPO_ROOT, "configs", "ds_zero1_cpu.json")


def build_parser() -> argparse.ArgumentParser:
    """Return the command-line parser: the common smoke-test CLI plus the DeepSpeed arguments."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=100, help="training steps (default 100, as in the guide)")
    parser.add_argument("--hidden", type=int, default=256, help="MLP hidden size h (default 256; 1024 on a GPU)")
    parser.add_argument("--batch", type=int, default=32,
                        help="samples per step per rank (default 32, the configs' train_micro_batch_size_per_gpu)")
    _common.add_dist_args(parser, timeout_s=60)
    parser.add_argument("--ckpt-dir", required=True, help="directory every rank writes its checkpoint shards to")
    parser.add_argument("--out", required=True, help="path of the JSON result (written by rank 0)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the model init and the data (default 0)")
    parser.add_argument("--deepspeed-config", "--deepspeed_config", dest="deepspeed_config", default=DEFAULT_CONFIG,
                        help="DeepSpeed JSON config (default: configs/ds_zero1_cpu.json of this repository)")
    parser.add_argument("--local_rank", "--local-rank", dest="local_rank", type=int, default=None,
                        help="appended by the deepspeed launcher; LOCAL_RANK from the environment is preferred")
    return parser


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and validate ``argv``; exits with status 2 naming the flag when a value is invalid."""
    parser = build_parser()
    args = parser.parse_args(argv)
    for flag in ("steps", "hidden", "batch"):
        if getattr(args, flag) <= 0:
            parser.error(f"--{flag} must be > 0, got {getattr(args, flag)}")
    if args.timeout_s <= 0:
        parser.error(f"--timeout-s must be > 0, got {args.timeout_s}")
    if not os.path.isfile(args.deepspeed_config):
        parser.error(f"--deepspeed-config: no such file: {args.deepspeed_config}")
    return args


def make_model(hidden: int) -> Any:
    """Build the smoke-test MLP (gilbreth-hpc-guide.md section 5.3) with hidden size ``hidden``.

    Linear(h, 4h), GELU, Linear(4h, 4h), GELU, Linear(4h, h): 1,575,168 parameters at the
    CPU default h=256.  Returns an ``nn.Sequential`` in float32 on the CPU; per section 7.7
    it is not moved to a device here, ``deepspeed.initialize`` does that (and the bf16 cast).
    """
    from torch import nn

    return nn.Sequential(
        nn.Linear(hidden, hidden * 4),
        nn.GELU(),
        nn.Linear(hidden * 4, hidden * 4),
        nn.GELU(),
        nn.Linear(hidden * 4, hidden),
    )


def prefer_env_ninja() -> bool:
    """Put this interpreter's ``bin`` directory first on ``PATH`` when it holds a ``ninja``.

    torch's JIT extension builder runs whichever ``ninja`` comes first on ``PATH``.  Two ninja
    versions hash build commands differently (measured here: the venv's pip ninja 1.13.2 and
    /usr/bin/ninja 1.11.1), so a ``TORCH_EXTENSIONS_DIR`` shared by runs with and without the
    venv on ``PATH`` gets "command line changed" from the other version and rebuilds DeepSpeed's
    CPU comm op (~30 s) every time the caller alternates.  Pinning the venv's ninja makes every
    run of this script agree.  Returns True when ``PATH`` was changed.
    """
    bin_dir = os.path.dirname(sys.executable)
    if not os.access(os.path.join(bin_dir, "ninja"), os.X_OK):
        return False
    path = os.environ.get("PATH", "")
    if path.split(os.pathsep)[0] == bin_dir:
        return False
    os.environ["PATH"] = bin_dir + os.pathsep + path
    return True


def init_deepspeed(backend: str, timeout_s: float, local_rank: int | None = None) -> tuple[Any, str]:
    """Start DeepSpeed's process group the way every DeepSpeed script here does (gilbreth 7.7).

    Pins the venv's ninja (:func:`prefer_env_ninja`) before DeepSpeed JIT-loads its comm op,
    binds the GPU by ``LOCAL_RANK`` on NCCL (seed D3), then ``deepspeed.init_distributed``.

    Args:
        backend: ``auto``, ``gloo`` or ``nccl``; timeout_s: collective timeout in seconds;
        local_rank: fallback when ``LOCAL_RANK`` is unset (the launcher's ``--local_rank``).

    Returns:
        ``(deepspeed module, backend used)``.
    """
    from datetime import timedelta

    prefer_env_ninja()
    import deepspeed
    import torch

    chosen = _common.resolve_backend(backend)
    if chosen == "nccl":
        torch.cuda.set_device(_common.env_int("LOCAL_RANK", local_rank if local_rank is not None else 0))
    deepspeed.init_distributed(dist_backend=chosen, timeout=timedelta(seconds=timeout_s))
    return deepspeed, chosen


def load_config(path: str, batch: int) -> tuple[Any, dict[str, Any]]:
    """Read the DeepSpeed JSON config at ``path`` and reconcile it with ``--batch``.

    Returns:
        ``(config, values)``: ``config`` is ``path`` itself when its
        ``train_micro_batch_size_per_gpu`` equals ``batch``, else (different or absent) a dict
        copy with the micro batch set to ``batch`` and ``train_batch_size`` removed, so that
        DeepSpeed derives it from the world size (section 7.4: train_batch_size = micro x
        GPUs x accumulation); ``values`` is the parsed dict (override applied), for reporting.

    Raises:
        OSError: the file cannot be read.  json.JSONDecodeError: it is not plain JSON (DeepSpeed
        itself parses with hjson, which would also accept comments; these configs stay plain
        JSON so that every other tool can read them).
    """
    with open(path) as fh:
        values = json.load(fh)
    if values.get("train_micro_batch_size_per_gpu") == batch:
        return path, values
    values = dict(values, train_micro_batch_size_per_gpu=batch)
    values.pop("train_batch_size", None)
    return values, values


def main(argv: list[str] | None = None) -> int:
    """Run smoke test 03 on this rank; rank 0 writes the JSON result.

    Returns:
        0 when every rank ran every step, the averaged final loss is finite and the reloaded
        module parameters equal the pre-save ones exactly on every rank; 1 otherwise.  Real
        errors (bad config, failed collective, timeout) propagate as exceptions.
    """
    args = parse_args(argv)

    deepspeed, backend = init_deepspeed(args.backend, args.timeout_s, args.local_rank)
    import torch
    import torch.distributed as dist
    from torch import nn

    rank = dist.get_rank()
    world_size = dist.get_world_size()

    config, config_values = load_config(args.deepspeed_config, args.batch)
    if not isinstance(config, str):
        _common.log(f"--batch {args.batch} overrides train_micro_batch_size_per_gpu of {args.deepspeed_config}")
    torch.manual_seed(args.seed)
    model = make_model(args.hidden)
    n_params = sum(p.numel() for p in model.parameters())
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config=config)
    device = engine.device if isinstance(engine.device, torch.device) else torch.device(engine.device)
    param_dtype = next(engine.module.parameters()).dtype
    zero_stage = int(engine.zero_optimization_stage())
    _common.log(f"test {TEST_NAME}: backend {backend}, device {device}, world size {world_size}, "
                f"ZeRO stage {zero_stage}, module dtype {param_dtype}")

    criterion = nn.MSELoss()
    data_gen = torch.Generator(device=device)
    data_gen.manual_seed(args.seed + 1 + rank)  # data parallel: each rank its own samples
    _common.reset_peak_memory(device)
    _common.synchronize(device)
    dist.barrier()
    steps_done = 0
    loss = torch.tensor(float("nan"), device=device)
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        # Section 7.5 issue 2: the inputs take the module's dtype (bf16), not torch.randn's float32.
        x = torch.randn(args.batch, args.hidden, device=device, dtype=param_dtype, generator=data_gen)
        y = torch.randn(args.batch, args.hidden, device=device, dtype=param_dtype, generator=data_gen)
        loss = criterion(engine(x), y)
        engine.backward(loss)
        engine.step()
        steps_done = step
        if step % LOG_EVERY == 0 or step == args.steps:
            _common.log(f"step {step}/{args.steps} loss {loss.item():.4f}")
    _common.synchronize(device)
    train_s = time.perf_counter() - start
    peak = _common.peak_memory(device)  # the training peak, read before the checkpoint reload

    # Section 7.5 issue 3: save and load are collectives, called on every rank.
    before = {name: p.detach().clone() for name, p in engine.module.named_parameters()}
    tag = f"step{steps_done}"
    engine.save_checkpoint(args.ckpt_dir, tag=tag)
    if rank == 0:
        _common.log(f"checkpoint saved: {os.path.join(args.ckpt_dir, tag)}")
    with torch.no_grad():
        for p in engine.module.parameters():
            p.fill_(7.0)  # garbage, so that only a real load can pass the comparison below
    load_path, _ = engine.load_checkpoint(args.ckpt_dir, tag=tag)
    after = dict(engine.module.named_parameters())
    reload_local = load_path is not None and before.keys() == after.keys() and all(
        torch.equal(before[name], after[name].detach()) for name in before)
    _common.log(f"checkpoint reload: {'SUCCESS' if reload_local else 'MISMATCH'} (from {load_path})")

    # Combine over ranks: loss averaged, peak memory max, success flags min (all must hold).
    loss_sum = loss.detach().float().reshape(1).clone()
    dist.all_reduce(loss_sum, op=dist.ReduceOp.SUM)
    final_loss = float(loss_sum.item()) / world_size
    peak_t = torch.tensor([peak["bytes"]], dtype=torch.int64, device=device)
    dist.all_reduce(peak_t, op=dist.ReduceOp.MAX)
    flags = torch.tensor([int(reload_local), int(steps_done == args.steps)], dtype=torch.int64, device=device)
    dist.all_reduce(flags, op=dist.ReduceOp.MIN)
    reload_ok, all_steps = bool(flags[0].item()), bool(flags[1].item())
    passed = all_steps and reload_ok and math.isfinite(final_loss)
    steps_per_s = steps_done / train_s if train_s > 0 else float("inf")
    dist.barrier()  # every rank's shards are on disk before rank 0 sizes them

    if rank == 0:
        tag_dir = os.path.join(args.ckpt_dir, tag)
        files = [os.path.join(root, f) for root, _, names in os.walk(tag_dir) for f in names]
        latest = os.path.join(args.ckpt_dir, "latest")
        if os.path.isfile(latest):
            files.append(latest)
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
            "zero_stage": zero_stage,
            "dtype": str(param_dtype),
            "deepspeed_config": args.deepspeed_config if isinstance(config, str) else config_values,
            "train_batch_size": int(engine.train_batch_size()),
            "checkpoint_path": tag_dir,
            "checkpoint_files": sorted(os.path.relpath(f, args.ckpt_dir) for f in files),
            "checkpoint_reload": reload_ok,
            "checkpoint_bytes": sum(os.path.getsize(f) for f in files),
            "passed": passed,
            "versions": {"torch": torch.__version__, "deepspeed": deepspeed.__version__,
                         "python": sys.version.split()[0]},
        }
        _common.write_json_atomic(args.out, result)
        _common.log(f"SMOKE TEST {TEST_NAME}: {'PASSED' if passed else 'FAILED'} "
                    f"({steps_per_s:.1f} steps/s, final loss {final_loss:.4f})")
    # Not in a ``finally``: a rank that fails mid-collective must exit at once so that the
    # launcher sees the failure, rather than block in a teardown its peers never join.
    del engine
    _common.finish()
    return 0 if passed else 1


if __name__ == "__main__":
    sys.exit(main())
