"""D16: measure the bytes each rank really holds in parameters, gradients and optimizer states, per ZeRO stage.

For every stage named in ``--stages`` the script builds the same MLP (the smoke-test MLP of
Gilbreth 5.3, ``--hidden`` wide), wraps it with
``deepspeed.initialize`` using ``configs/ds_zero<stage>_cpu.json`` (stage ``3-offload`` uses
``configs/ds_zero3_offload_cpu.json``; ``1-accum2`` is ZeRO-1 with
``gradient_accumulation_steps=2``; ``2-offload`` is ZeRO-2 with ``offload_optimizer`` to the
CPU), trains ``--steps`` optimizer steps, and measures at these moments of the last step:

* ``after_backward``: after ``engine.backward(loss)``, before ``engine.step()``, when
  parameters, gradients and optimizer states are all live (the moment the ZeRO paper's
  accounting describes);
* ``in_step``: inside the wrapped torch optimizer's ``step`` (a step pre-hook), where DeepSpeed
  has built the fp32 gradients the optimizer consumes;
* ``mid_accumulation`` (only with gradient accumulation): after the backward of the first
  micro-batch, before the accumulation boundary.

For ZeRO-1/2 it also records ``grad_elements_in_partition``: the elements of every parameter
that overlaps this rank's partition (``optimizer.params_in_partition``), the size of the
gradient buffer DeepSpeed keeps at the boundary.

Each tensor storage is counted once, in the first category that reaches it (DeepSpeed 0.19.8's
own structures, read from its source: ``deepspeed/runtime/fp16/unfused_optimizer.py``,
``runtime/zero/stage_1_and_2.py``, ``runtime/zero/stage3.py``):

* ``moments``: the torch optimizer's ``state`` (Adam ``exp_avg``, ``exp_avg_sq``, ``step``);
* ``master``: the fp32 master copy the torch optimizer updates (``fp32_groups`` at stage 0,
  ``single_partition_of_fp32_groups`` at 1/2, ``fp32_partitioned_groups_flat`` at 3, which
  ZeRO-3 puts into the optimizer's ``param_groups`` only while it steps);
  ``fp32_grads``: their ``.grad``;
* ``params``: every module parameter's data and, under ZeRO-3, its ``ds_tensor`` partition;
* ``grads``: the module parameters' ``.grad``, ZeRO-1/2's ``averaged_gradients`` /
  ``grads_in_partition``, ZeRO-3's ``grad_partitions_flat_buffer``;
* ``buffers``: the reduction buckets (``ipg_buckets[*].buffer``, ZeRO-3's ``ipg_buffer``).

At ``after_backward``, a sweep of every tensor the garbage collector can see adds ``other``:
tensors not reached above that did not exist before ``deepspeed.initialize`` of this stage
(e.g. the batch, transfer buffers); ``other_largest`` names the three largest.  Bytes are
``untyped_storage().nbytes()``: what the allocator holds.

Rank 0 writes ``--out`` (JSON: per stage, per rank, per moment, bytes by category, plus the
parameter count and world size); every rank exits 0 when all stages ran.

Example::

    deepspeed --num_gpus 2 helpers/scenarios/ds_zero_memory.py --stages 0,1,2,3 --out build/05_zero.json
"""

from __future__ import annotations

import argparse
import gc
import os
import sys
import time
import warnings
from typing import Any

from helpers.scenarios import _common, smoke_deepspeed  # smoke_deepspeed: make_model, prefer_env_ninja, load_config

CONFIGS = os.path.join(smoke_deepspeed.REPO_ROOT, "configs")
STAGES = ("0", "1", "2", "3", "1-accum2", "2-offload", "3-offload")
CATEGORIES = ("params", "grads", "master", "moments", "fp32_grads", "buffers", "other")


def build_parser() -> argparse.ArgumentParser:
    """Command-line parser (module docstring = what it measures)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--stages", default="0,1,2,3", help=f"comma-separated, from {', '.join(STAGES)} (default 0,1,2,3)")
    p.add_argument("--hidden", type=int, default=256, help="MLP hidden size h (default 256: 1,575,168 parameters)")
    p.add_argument("--batch", type=int, default=8, help="micro batch per rank (default 8)")
    p.add_argument("--steps", type=int, default=2, help="training steps per stage, >= 2 so Adam state exists (default 2)")
    _common.add_dist_args(p, timeout_s=60)
    p.add_argument("--out", required=True, help="JSON result path (written by rank 0)")
    p.add_argument("--local_rank", "--local-rank", dest="local_rank", type=int, default=None,
                   help="appended by the deepspeed launcher; LOCAL_RANK from the environment is preferred")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and validate ``argv`` (exit status 2 naming the flag on a bad value)."""
    p = build_parser()
    args = p.parse_args(argv)
    stages = [s.strip() for s in args.stages.split(",") if s.strip()]
    bad = [s for s in stages if s not in STAGES]
    if bad or not stages:
        p.error(f"--stages: {bad or stages!r} not in {', '.join(STAGES)}")
    args.stages = stages
    if args.steps < 2:
        p.error(f"--steps must be >= 2 (Adam state exists after the first step), got {args.steps}")
    for flag in ("hidden", "batch"):
        if getattr(args, flag) <= 0:
            p.error(f"--{flag} must be > 0")
    return args


def stage_config(stage: str, batch: int) -> dict[str, Any]:
    """The DeepSpeed config dict for ``stage`` (from ``configs/``), with the micro batch set to ``batch``."""
    name = {"3-offload": "ds_zero3_offload_cpu.json", "1-accum2": "ds_zero1_cpu.json",
            "2-offload": "ds_zero2_cpu.json"}.get(stage, f"ds_zero{stage}_cpu.json")
    _, values = smoke_deepspeed.load_config(os.path.join(CONFIGS, name), batch)
    values = {k: v for k, v in values.items() if k != "_comment"}
    if stage == "1-accum2":
        values["gradient_accumulation_steps"] = 2
        values.pop("train_batch_size", None)
    if stage == "2-offload":
        values["zero_optimization"] = dict(values["zero_optimization"],
                                           offload_optimizer={"device": "cpu", "pin_memory": False})
    return values


class Ledger:
    """Counts each tensor storage once, in the first category that reaches it."""

    def __init__(self, baseline: set[int] | None = None) -> None:
        self.baseline = baseline or set()
        self.seen: dict[int, str] = {}
        self.bytes: dict[str, int] = {c: 0 for c in CATEGORIES}
        self.largest_other: list[tuple[int, str]] = []

    def add(self, category: str, obj: Any) -> None:
        """Count ``obj`` (a tensor, or a list/tuple/dict of them, nested) under ``category``."""
        import torch

        if obj is None:
            return
        if isinstance(obj, torch.Tensor):
            storage = obj.untyped_storage()
            ptr, nbytes = storage.data_ptr(), storage.nbytes()
            if nbytes == 0 or ptr in self.seen or (category == "other" and ptr in self.baseline):
                return
            self.seen[ptr] = category
            self.bytes[category] += nbytes
            if category == "other":
                self.largest_other.append((nbytes, f"{tuple(obj.shape)} {str(obj.dtype).replace('torch.', '')}"))
        elif isinstance(obj, dict):
            for value in obj.values():
                self.add(category, value)
        elif isinstance(obj, (list, tuple)):
            for value in obj:
                self.add(category, value)


def _tensors(obj: Any) -> list[Any]:
    """The tensors in ``obj`` (a tensor or nested lists/tuples of them), flattened."""
    import torch

    if isinstance(obj, torch.Tensor):
        return [obj]
    if isinstance(obj, (list, tuple)):
        return [t for item in obj for t in _tensors(item)]
    return []


def _gc_tensors() -> list[Any]:
    """Every CPU/GPU tensor the garbage collector can see (after a collection)."""
    import torch

    gc.collect()
    found = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # isinstance() on deprecated torch aliases warns
        for obj in gc.get_objects():
            try:
                if isinstance(obj, torch.Tensor) and obj.device.type != "meta":
                    found.append(obj)
            except Exception:  # noqa: BLE001 - objects being torn down; skip them
                continue
    return found


def live_storages() -> set[int]:
    """Data pointers of every tensor storage the garbage collector can see now."""
    return {t.untyped_storage().data_ptr() for t in _gc_tensors()}


def measure(engine: Any, baseline: set[int], sweep: bool = True) -> dict[str, Any]:
    """Bytes held by this rank, by category (see the module docstring for what each one walks).

    ``sweep=False`` skips the garbage-collector sweep (``other`` stays 0): ~0.3 s saved.
    """
    ledger = Ledger(baseline)
    opt, basic = engine.optimizer, engine.basic_optimizer
    for state in basic.state.values():
        ledger.add("moments", state)
    masters = [p for group in basic.param_groups for p in group["params"]]
    for attr in ("fp32_groups", "single_partition_of_fp32_groups", "fp32_partitioned_groups_flat"):
        masters += _tensors(getattr(opt, attr, None))
    for p in masters:
        ledger.add("master", p)
        ledger.add("fp32_grads", p.grad)
    for p in engine.module.parameters():
        ledger.add("params", p.data)
        ledger.add("params", getattr(p, "ds_tensor", None))
    for p in engine.module.parameters():
        ledger.add("grads", p.grad)
    for attr in ("averaged_gradients", "grads_in_partition", "grad_partitions_flat_buffer",
                 "_DeepSpeedZeroOptimizer_Stage3__param_id_to_grad_partition"):
        ledger.add("grads", getattr(opt, attr, None))
    for bucket in getattr(opt, "ipg_buckets", {}).values():
        ledger.add("buffers", getattr(bucket, "buffer", None))
    ledger.add("buffers", getattr(opt, "ipg_buffer", None))
    for t in _gc_tensors() if sweep else []:
        ledger.add("other", t)
    top = sorted(ledger.largest_other, reverse=True)[:3]
    return {**ledger.bytes, "other_largest": [f"{desc}: {n} B" for n, desc in top]}


def run_stage(stage: str, args: argparse.Namespace, deepspeed: Any, torch: Any) -> dict[str, Any]:
    """Train ``args.steps`` steps at ``stage`` and return this rank's measurements."""
    from torch import nn

    torch.manual_seed(0)
    model = smoke_deepspeed.make_model(args.hidden)
    n_params = sum(p.numel() for p in model.parameters())
    t0 = time.perf_counter()
    baseline = live_storages()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=stage_config(stage, args.batch))
    dtype = torch.bfloat16 if engine.bfloat16_enabled() else torch.float32
    gas = engine.gradient_accumulation_steps()
    seen: dict[str, dict[str, Any]] = {}
    last = {"on": False}

    def pre_step(optimizer: Any, *_: Any) -> None:
        if last["on"]:
            seen["in_step"] = measure(engine, baseline, sweep=False)

    handle = engine.basic_optimizer.register_step_pre_hook(pre_step)
    gen = torch.Generator().manual_seed(1 + engine.global_rank)
    for step in range(1, args.steps + 1):
        for micro in range(1, gas + 1):
            x = torch.randn(args.batch, args.hidden, dtype=dtype, generator=gen).to(engine.device)
            y = torch.randn(args.batch, args.hidden, dtype=dtype, generator=gen).to(engine.device)
            loss = nn.functional.mse_loss(engine(x), y)
            engine.backward(loss)
            if step == args.steps and micro == 1 and gas > 1:
                seen["mid_accumulation"] = measure(engine, baseline, sweep=False)
            if step == args.steps and micro == gas:
                seen["after_backward"] = measure(engine, baseline)
                last["on"] = True
            engine.step()  # a real optimizer step only at the accumulation boundary
        _common.log(f"stage {stage} step {step} loss {loss.item():.4f}")
    handle.remove()
    in_partition = getattr(engine.optimizer, "params_in_partition", None)
    result = {"stage": stage, "n_params": n_params, "zero_stage": int(engine.zero_optimization_stage()),
              "gradient_accumulation_steps": gas, "optimizer_steps": int(engine.global_steps),
              "optimizer": type(engine.optimizer).__name__, "basic_optimizer": type(engine.basic_optimizer).__name__,
              "grad_elements_in_partition": (sum(p.numel() for group in in_partition for p in group)
                                             if in_partition is not None else None),
              "largest_param": max(p.ds_numel if hasattr(p, "ds_numel") else p.numel()
                                   for p in engine.module.parameters()),
              "config": stage_config(stage, args.batch), **seen}
    engine.destroy()
    del engine, model
    gc.collect()
    result["seconds"] = round(time.perf_counter() - t0, 2)
    return result


def main(argv: list[str] | None = None) -> int:
    """Measure every stage in ``--stages`` on this rank; rank 0 writes the JSON."""
    args = parse_args(argv)
    deepspeed, backend = smoke_deepspeed.init_deepspeed(args.backend, args.timeout_s)
    import torch
    import torch.distributed as dist
    rank, world = dist.get_rank(), dist.get_world_size()
    mine = [run_stage(stage, args, deepspeed, torch) for stage in args.stages]
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, mine)
    if rank == 0:
        stages = []
        for i, stage in enumerate(args.stages):
            moments = ("after_backward", "in_step", "mid_accumulation")
            entry = {k: v for k, v in everyone[0][i].items() if k not in moments and k != "grad_elements_in_partition"}
            entry["ranks"] = {r: {m: everyone[r][i][m] for m in moments if m in everyone[r][i]} for r in range(world)}
            entry["grad_elements_in_partition"] = {r: everyone[r][i]["grad_elements_in_partition"] for r in range(world)}
            stages.append(entry)
        _common.write_json_atomic(args.out, {"world_size": world, "backend": backend, "hidden": args.hidden,
                                             "batch": args.batch, "steps": args.steps, "stages": stages,
                                             "versions": {"torch": torch.__version__,
                                                          "deepspeed": deepspeed.__version__}})
        _common.log(f"wrote {args.out}")
    _common.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
