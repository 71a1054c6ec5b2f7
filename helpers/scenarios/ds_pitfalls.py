"""D17, D18 and Gilbreth 7.5: DeepSpeed config and API pitfalls, each run wrong then right.

Every case builds a fresh MLP and a fresh DeepSpeed engine on every rank, in ``bug`` mode (the
mistake) and then in ``fix`` mode (the correction), and prints one line per mode::

    [rank R] case NAME bug: raised AssertionError: zero stage 1 requires an optimizer
    [rank R] case NAME fix: ok {"optimizer_steps": 1, ...}

Cases (``--cases``, comma-separated, default all):

* ``no-optimizer`` (7.5 issue 1): ZeRO-1 config without an ``optimizer`` section.
* ``fp32-input`` (7.5 issue 2): float32 inputs into the bf16 engine.
* ``batch-mismatch`` (7.5 / 7.4): ``train_batch_size`` != micro x accumulation x world size.
* ``auto-values`` (D18): a Hugging Face style JSON with ``"auto"`` given to plain ``deepspeed.initialize``.
* ``auto-stage`` (D18): ``"zero_optimization": {"stage": "auto"}``.
* ``auto-clip`` (D18): ``"gradient_clipping": "auto"``.
* ``typo-top`` (D17): a misspelt top-level key (``gradient_clip``).
* ``typo-zero`` (D17): a misspelt key inside ``zero_optimization`` (``offload_optimiser``).
* ``double-accum`` (D18): accumulation in the JSON *and* in the training loop.
* ``plain-backward-z0`` / ``plain-backward-z2`` (D18): ``loss.backward()`` instead of
  ``engine.backward(loss)`` at ZeRO-0 and at ZeRO-2 (with 2 accumulation steps).
* ``module-attr`` (7.7): ``model.module`` (the DDP habit) vs ``engine.module``.
* ``zero3-state-dict`` (7.7): ``engine.module.state_dict()`` under ZeRO-3 vs gathered parameters.
* ``fp16-plain-backward`` (D18, GPU only, not in the default list): ``loss.backward()`` with fp16
  loss scaling.
* ``fused-adam`` (7.9, GPU only): the optimizer DeepSpeed builds without (``bug``) and with
  (``fix``) ``"torch_adam": true``, and how long ``initialize`` took (FusedAdam's JIT build).

To save the ~12 s start-up of a DeepSpeed job per case, all cases run in one job: the exception
a ``bug`` mode raises is caught on each rank, printed with its traceback (stderr) and recorded,
and the next case starts.  Every case fails (or not) identically on all ranks and before any
collective mismatch, so the ranks stay in step.  With ``--strict`` nothing is caught: the first
exception ends the rank with exit status 1, exactly as it would end your job.

Rank 0 writes ``--out`` (JSON: case -> mode -> rank -> outcome).

Example::

    deepspeed --num_gpus 2 helpers/scenarios/ds_pitfalls.py --out build/05_pitfalls.json
    deepspeed --num_gpus 2 helpers/scenarios/ds_pitfalls.py --cases no-optimizer --modes bug --strict --out x.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import traceback
from collections.abc import Callable
from typing import Any

from helpers.scenarios import _common, smoke_deepspeed

HIDDEN = 64
MICRO = 4


def base_config(stage: int = 1, **top: Any) -> dict[str, Any]:
    """A working CPU config (ZeRO ``stage``, bf16, torch AdamW, micro batch 4), with top-level overrides."""
    cfg: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": MICRO,
        "gradient_accumulation_steps": 1,
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-3, "torch_adam": True}},
        "zero_optimization": {"stage": stage},
        "bf16": {"enabled": True},
        "steps_per_print": 10**9,
    }
    cfg.update(top)
    return cfg


class Ctx:
    """What every case needs: deepspeed, torch, the world size and a model/engine factory."""

    def __init__(self, deepspeed: Any, torch: Any, world: int, rank: int) -> None:
        self.ds, self.torch, self.world, self.rank = deepspeed, torch, world, rank

    def model(self) -> Any:
        """A fresh seeded MLP (hidden 64)."""
        self.torch.manual_seed(0)
        return smoke_deepspeed.make_model(HIDDEN)

    def engine(self, config: dict[str, Any], model: Any = None) -> Any:
        """``deepspeed.initialize`` on a fresh model; returns the engine."""
        model = model if model is not None else self.model()
        engine, _, _, _ = self.ds.initialize(model=model, model_parameters=model.parameters(), config=config)
        return engine

    def batch(self, engine: Any, step: int, dtype: Any = "engine") -> tuple[Any, Any]:
        """A deterministic (x, y) batch for ``step`` on this rank, in the engine's dtype unless given."""
        torch = self.torch
        gen = torch.Generator().manual_seed(1000 * step + self.rank)
        if dtype == "engine":
            dtype = next(engine.module.parameters()).dtype
        x = torch.randn(MICRO, HIDDEN, generator=gen).to(dtype=dtype, device=engine.device)
        y = torch.randn(MICRO, HIDDEN, generator=gen).to(dtype=next(engine.module.parameters()).dtype,
                                                          device=engine.device)
        return x, y

    def train(self, engine: Any, steps: int, plain_backward: bool = False) -> float:
        """``steps`` micro-batches of forward/backward/step; returns the last loss."""
        loss = None
        for step in range(steps):
            x, y = self.batch(engine, step)
            loss = self.torch.nn.functional.mse_loss(engine(x), y)
            if plain_backward:
                loss.backward()
            else:
                engine.backward(loss)
            engine.step()
        return float(loss.item())

    def params_digest(self, engine: Any) -> str:
        """SHA-256 of every module parameter's bytes (bit-exact comparison of two runs)."""
        h = hashlib.sha256()
        for name, p in engine.module.named_parameters():
            h.update(name.encode())
            h.update(p.detach().cpu().contiguous().view(self.torch.uint8).numpy().tobytes())
        return h.hexdigest()[:16]


def case_no_optimizer(c: Ctx, mode: str) -> dict[str, Any]:
    """7.5 issue 1: ZeRO-1 needs an optimizer (in the JSON or passed to initialize)."""
    cfg = base_config(1)
    if mode == "bug":
        del cfg["optimizer"]
    engine = c.engine(cfg)
    return {"zero_stage": engine.zero_optimization_stage(), "loss": c.train(engine, 1),
            "basic_optimizer": type(engine.basic_optimizer).__name__}


def case_fp32_input(c: Ctx, mode: str) -> dict[str, Any]:
    """7.5 issue 2: bf16 weights, float32 inputs."""
    engine = c.engine(base_config(1))
    x, y = c.batch(engine, 0, dtype=c.torch.float32 if mode == "bug" else "engine")
    out = engine(x)
    engine.backward(c.torch.nn.functional.mse_loss(out, y))
    engine.step()
    return {"input_dtype": str(x.dtype), "module_dtype": str(next(engine.module.parameters()).dtype)}


def case_batch_mismatch(c: Ctx, mode: str) -> dict[str, Any]:
    """7.4/7.5: train_batch_size must equal micro x accumulation x world size."""
    tbs = 16 if mode == "bug" else MICRO * 1 * c.world
    engine = c.engine(base_config(1, train_batch_size=tbs))
    return {"train_batch_size": engine.train_batch_size(), "micro": engine.train_micro_batch_size_per_gpu(),
            "gradient_accumulation_steps": engine.gradient_accumulation_steps(), "world_size": c.world}


def case_auto_values(c: Ctx, mode: str) -> dict[str, Any]:
    """D18: "auto" is a placeholder for the HF Trainer/Accelerate to fill, not a DeepSpeed value."""
    if mode == "bug":
        cfg = base_config(2, train_batch_size="auto", train_micro_batch_size_per_gpu="auto",
                          gradient_accumulation_steps="auto", gradient_clipping="auto")
    else:
        cfg = base_config(2, gradient_accumulation_steps=1, gradient_clipping=1.0)
    engine = c.engine(cfg)
    return {"train_batch_size": engine.train_batch_size(), "loss": c.train(engine, 1)}


def case_auto_stage(c: Ctx, mode: str) -> dict[str, Any]:
    """D18: "auto" inside a pydantic-modelled section is dropped, so the field takes its default."""
    engine = c.engine(base_config("auto" if mode == "bug" else 2))  # type: ignore[arg-type]
    return {"zero_stage": int(engine.zero_optimization_stage()), "optimizer": type(engine.optimizer).__name__}


def case_auto_clip(c: Ctx, mode: str) -> dict[str, Any]:
    """D18: "gradient_clipping": "auto" reaches the engine as the string "auto"."""
    engine = c.engine(base_config(2, gradient_clipping="auto" if mode == "bug" else 1.0))
    return {"gradient_clipping": engine.gradient_clipping(), "loss": c.train(engine, 1)}


def case_typo_top(c: Ctx, mode: str) -> dict[str, Any]:
    """D17: an unknown top-level key is ignored without a word (here: meant to turn clipping off)."""
    key = "gradient_clip" if mode == "bug" else "gradient_clipping"
    engine = c.engine(base_config(2, **{key: 0.0}))
    return {"key": key, "gradient_clipping": engine.gradient_clipping()}


def case_typo_zero(c: Ctx, mode: str) -> dict[str, Any]:
    """D17: an unknown key inside zero_optimization is rejected by its pydantic model."""
    key = "offload_optimiser" if mode == "bug" else "offload_optimizer"
    cfg = base_config(2)
    cfg["zero_optimization"] = {"stage": 2, key: {"device": "cpu"}}
    engine = c.engine(cfg)
    return {"key": key, "cpu_offload": bool(engine.zero_cpu_offload()), "loss": c.train(engine, 1)}


def case_double_accum(c: Ctx, mode: str) -> dict[str, Any]:
    """D18: accumulation set in the JSON (4) and again by hand in the loop (every 4th step())."""
    accum, micro_batches = 4, 16
    engine = c.engine(base_config(2, gradient_accumulation_steps=accum))
    for i in range(micro_batches):
        x, y = c.batch(engine, i)
        loss = c.torch.nn.functional.mse_loss(engine(x), y)
        if mode == "bug":  # the hand-written accumulation loop, on top of the JSON's
            engine.backward(loss / accum)
            if (i + 1) % accum == 0:
                engine.step()
        else:  # DeepSpeed accumulates: step() after every micro-batch
            engine.backward(loss)
            engine.step()
    return {"micro_batches": micro_batches, "json_gradient_accumulation_steps": accum,
            "optimizer_steps": int(engine.global_steps), "samples_per_optimizer_step":
            engine.train_batch_size() * (accum if mode == "bug" else 1)}


def case_plain_backward_z0(c: Ctx, mode: str) -> dict[str, Any]:
    """D18: loss.backward() at ZeRO stage 0."""
    engine = c.engine(base_config(0))
    return {"loss": c.train(engine, 2, plain_backward=mode == "bug"), "params": c.params_digest(engine)}


def case_plain_backward_z2(c: Ctx, mode: str) -> dict[str, Any]:
    """D18: loss.backward() at ZeRO stage 2 with 2 accumulation steps; compare with engine.backward."""
    engine = c.engine(base_config(2, gradient_accumulation_steps=2))
    loss = c.train(engine, 4, plain_backward=mode == "bug")
    return {"loss": loss, "optimizer_steps": int(engine.global_steps), "params": c.params_digest(engine)}


def case_module_attr(c: Ctx, mode: str) -> dict[str, Any]:
    """7.7: under DDP the wrapper has .module; DeepSpeed's engine has it, your model does not."""
    model = c.model()
    engine = c.engine(base_config(1), model=model)
    inner = model.module if mode == "bug" else engine.module
    return {"engine_module_is_model": engine.module is model, "type": type(inner).__name__}


def case_zero3_state_dict(c: Ctx, mode: str) -> dict[str, Any]:
    """7.7: under ZeRO-3 engine.module holds placeholders; gather before reading the weights."""
    cfg = base_config(3)
    cfg["zero_optimization"]["stage3_param_persistence_threshold"] = 0  # else params < 1e5 elements stay whole
    engine = c.engine(cfg)
    c.train(engine, 1)
    if mode == "bug":
        sd = engine.module.state_dict()
    else:
        with c.ds.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None):
            sd = {k: v.detach().clone() for k, v in engine.module.state_dict().items()}
    return {"numel": int(sum(v.numel() for v in sd.values())), "shapes": {k: list(v.shape) for k, v in sd.items()}}


def case_fp16_plain_backward(c: Ctx, mode: str) -> dict[str, Any]:
    """D18 (GPU only: fp16 needs CUDA): loss.backward() skips the engine's loss scaling."""
    cfg = base_config(2)
    cfg.pop("bf16")
    cfg["fp16"] = {"enabled": True}
    engine = c.engine(cfg)
    return {"loss": c.train(engine, 2, plain_backward=mode == "bug"), "params": c.params_digest(engine)}


def case_fused_adam(c: Ctx, mode: str) -> dict[str, Any]:
    """GPU only: without "torch_adam" DeepSpeed builds FusedAdam (JIT-compiled on first use, 7.9)."""
    import time

    cfg = base_config(1)
    cfg["optimizer"]["params"]["torch_adam"] = mode == "fix"
    t0 = time.perf_counter()
    engine = c.engine(cfg)
    return {"basic_optimizer": type(engine.basic_optimizer).__name__, "initialize_s": round(time.perf_counter() - t0, 1),
            "loss": c.train(engine, 1)}


CASES: dict[str, Callable[[Ctx, str], dict[str, Any]]] = {
    "no-optimizer": case_no_optimizer,
    "fp32-input": case_fp32_input,
    "batch-mismatch": case_batch_mismatch,
    "auto-values": case_auto_values,
    "auto-stage": case_auto_stage,
    "auto-clip": case_auto_clip,
    "typo-top": case_typo_top,
    "typo-zero": case_typo_zero,
    "double-accum": case_double_accum,
    "plain-backward-z0": case_plain_backward_z0,
    "plain-backward-z2": case_plain_backward_z2,
    "module-attr": case_module_attr,
    "zero3-state-dict": case_zero3_state_dict,
    "fp16-plain-backward": case_fp16_plain_backward,
    "fused-adam": case_fused_adam,
}
GPU_ONLY = ("fp16-plain-backward", "fused-adam")


def raised_where(exc: BaseException) -> str:
    """``file.py:function`` of the innermost frame outside pydantic/torch internals that raised ``exc``."""
    frames = traceback.extract_tb(exc.__traceback__)
    library = [f for f in frames if "site-packages" in f.filename and "pydantic" not in f.filename
               and "/torch/" not in f.filename]
    frame = (library or frames)[-1]
    return f"{os.path.basename(frame.filename)}:{frame.name}"


def build_parser() -> argparse.ArgumentParser:
    """Command-line parser (module docstring = the cases)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--cases", default=",".join(c for c in CASES if c not in GPU_ONLY),
                   help=f"comma-separated case names (default: all but the GPU-only {', '.join(GPU_ONLY)})")
    p.add_argument("--modes", default="bug,fix", help="bug, fix or bug,fix (default)")
    p.add_argument("--strict", action="store_true", help="do not catch: the first exception ends the rank (exit 1)")
    _common.add_dist_args(p, timeout_s=60)
    p.add_argument("--out", required=True, help="JSON result path (rank 0)")
    p.add_argument("--local_rank", "--local-rank", dest="local_rank", type=int, default=None,
                   help="appended by the deepspeed launcher; LOCAL_RANK from the environment is preferred")
    return p


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and validate ``argv`` (exit status 2 naming the flag on a bad value)."""
    p = build_parser()
    args = p.parse_args(argv)
    args.cases = [x.strip() for x in args.cases.split(",") if x.strip()]
    args.modes = [x.strip() for x in args.modes.split(",") if x.strip()]
    bad = [x for x in args.cases if x not in CASES]
    if bad or not args.cases:
        p.error(f"--cases: unknown {bad}; accepted: {', '.join(CASES)}")
    if not args.modes or any(m not in ("bug", "fix") for m in args.modes):
        p.error(f"--modes: {args.modes}: accepted values are bug, fix")
    return args


def main(argv: list[str] | None = None) -> int:
    """Run the cases on this rank; rank 0 writes the JSON.  Exit 0 (or 1 at the first error with --strict)."""
    args = parse_args(argv)
    deepspeed, backend = smoke_deepspeed.init_deepspeed(args.backend, args.timeout_s)
    import torch
    import torch.distributed as dist
    rank, world = dist.get_rank(), dist.get_world_size()
    ctx = Ctx(deepspeed, torch, world, rank)
    results: dict[str, dict[str, Any]] = {}
    for step, name in enumerate(args.cases, start=1):
        for mode in args.modes:
            try:
                obs = CASES[name](ctx, mode)
            except Exception as exc:  # noqa: BLE001 - recorded and printed, see the module docstring
                if args.strict:
                    raise
                text = str(exc)
                where = raised_where(exc)
                results.setdefault(name, {})[mode] = {"outcome": "raised", "type": type(exc).__name__,
                                                      "message": text, "where": where}
                _common.log(f"case {name} {mode}: raised {type(exc).__name__} in {where}: "
                            f"{' | '.join(text.splitlines())}")
                print(f"[case {name} {mode}]\n{traceback.format_exc()}", file=sys.stderr, flush=True)
            else:
                results.setdefault(name, {})[mode] = {"outcome": "ok", **obs}
                _common.log(f"case {name} {mode}: ok {json.dumps(obs, sort_keys=True, default=str)}")
        _common.log(f"step {step} done: {name}")
    everyone: list[Any] = [None] * world
    dist.all_gather_object(everyone, results)
    if rank == 0:
        merged = {name: {mode: {r: everyone[r][name][mode] for r in range(world)} for mode in args.modes}
                  for name in args.cases}
        _common.write_json_atomic(args.out, {"world_size": world, "backend": backend, "cases": merged,
                                             "versions": {"torch": torch.__version__,
                                                          "deepspeed": deepspeed.__version__}})
    _common.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
