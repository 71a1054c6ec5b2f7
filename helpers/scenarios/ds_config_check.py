"""D17: validate DeepSpeed JSON configs with DeepSpeed's own config class, and show the knobs that matter.

For each file, ``deepspeed.runtime.config.DeepSpeedConfig`` is built as ``deepspeed.initialize``
builds it on ``--world-size`` data-parallel ranks (no process group needed), then the values
DeepSpeed will really use are printed, each marked ``file`` (set by the file) or ``default``:
``zero_optimization.stage``, ``offload_optimizer``/``offload_param`` devices, ``bf16``/``fp16``,
``train_micro_batch_size_per_gpu``, ``gradient_accumulation_steps``, ``train_batch_size``,
``gradient_clipping``.

One line per file::

    [OK]   the config is valid;
    [WARN] valid, but a top-level key looks like a misspelt knob (DeepSpeed ignores unknown
           top-level keys without a word, so the knob silently keeps its default), or a value
           is ``"auto"`` (D18: filled in only by the HF Trainer / Accelerate);
    [FAIL] DeepSpeed rejects it (e.g. an unknown key inside ``zero_optimization``:
           pydantic ``extra_forbidden``; batch arithmetic; ``"auto"`` values), with its message.

Exit status: 0 when no file failed (1 with ``--strict`` when one warned), 1 when one failed.

Example (runs on a login node, no GPU or process group)::

    python helpers/scenarios/ds_config_check.py configs/ds_zero2_cpu.json configs/ds_zero3_cpu.json --world-size 8
"""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from typing import Any
from unittest import mock

KNOBS = ("zero_optimization", "bf16", "fp16", "optimizer", "train_batch_size", "train_micro_batch_size_per_gpu",
         "gradient_accumulation_steps", "gradient_clipping", "scheduler", "steps_per_print")


class _DataParallelWorld:
    """The ``mpu`` interface DeepSpeedConfig asks for the data-parallel world size."""

    def __init__(self, size: int) -> None:
        self.size = size

    def get_data_parallel_world_size(self) -> int:
        return self.size


def check_config(source: str | dict[str, Any], world_size: int) -> Any:
    """Build DeepSpeed's config object for ``source`` (a path or a dict) on ``world_size`` ranks.

    DeepSpeedConfig takes the world size from ``dist.get_rank()`` + ``mpu``; without a process
    group ``get_rank`` raises and it silently falls back to world size 1, so the rank query is
    answered here (rank 0) and ``mpu`` reports ``world_size``.

    Returns:
        ``deepspeed.runtime.config.DeepSpeedConfig``.

    Raises:
        ValueError: ``world_size`` < 1.  Whatever DeepSpeed raises for an invalid config
        (``pydantic.ValidationError``, ``AssertionError``, ``TypeError``...).
    """
    if world_size < 1:
        raise ValueError(f"world_size={world_size}: must be >= 1")
    from deepspeed.runtime.config import DeepSpeedConfig

    with mock.patch("deepspeed.runtime.config.dist.get_rank", return_value=0):
        return DeepSpeedConfig(source, mpu=_DataParallelWorld(world_size))


def knob_report(raw: dict[str, Any], config: Any) -> list[tuple[str, Any, str]]:
    """``(knob, value DeepSpeed uses, "file"/"default"/"derived")`` for the load-bearing keys of D17."""
    zero = raw.get("zero_optimization", {}) if isinstance(raw.get("zero_optimization"), dict) else {}
    zc = config.zero_config

    def src(present: bool, value: Any = None) -> str:
        if value == "auto":
            return "'auto' in the file: DeepSpeed dropped it and used its default"
        return "file" if present else "default"

    off_opt = getattr(zc.offload_optimizer.device, "value", zc.offload_optimizer.device) if zc.offload_optimizer else "none"
    off_par = getattr(zc.offload_param.device, "value", zc.offload_param.device) if zc.offload_param else "none"
    return [
        ("zero_optimization.stage", int(config.zero_optimization_stage), src("stage" in zero, zero.get("stage"))),
        ("zero_optimization.offload_optimizer.device", off_opt, src("offload_optimizer" in zero)),
        ("zero_optimization.offload_param.device", off_par, src("offload_param" in zero)),
        ("bf16.enabled", bool(config.bfloat16_config.enabled), src("bf16" in raw)),
        ("fp16.enabled", bool(config.float16_config.enabled), src("fp16" in raw)),
        ("train_micro_batch_size_per_gpu", config.train_micro_batch_size_per_gpu,
         src("train_micro_batch_size_per_gpu" in raw)),
        ("gradient_accumulation_steps", config.gradient_accumulation_steps, src("gradient_accumulation_steps" in raw)),
        ("train_batch_size", config.train_batch_size, "file" if "train_batch_size" in raw else
         f"derived: {config.train_micro_batch_size_per_gpu} x {config.gradient_accumulation_steps} x {config.world_size}"),
        ("gradient_clipping", config.gradient_clipping, src("gradient_clipping" in raw)),
    ]


def misspelt_keys(raw: dict[str, Any]) -> list[tuple[str, str]]:
    """Top-level keys that are not a D17 knob but look like one: ``[(key, knob it resembles)]``."""
    found = []
    for key in raw:
        if key in KNOBS or key.startswith("_"):
            continue
        close = difflib.get_close_matches(key, KNOBS, n=1, cutoff=0.75)
        if close:
            found.append((key, close[0]))
    return found


def auto_values(raw: Any, prefix: str = "") -> list[str]:
    """Dotted paths of every ``"auto"`` value in ``raw`` (nested dicts)."""
    found = []
    if isinstance(raw, dict):
        for key, value in raw.items():
            path = f"{prefix}{key}"
            if value == "auto":
                found.append(path)
            else:
                found += auto_values(value, path + ".")
    return found


def check_file(path: str, world_size: int) -> tuple[str, list[str]]:
    """Check one file; returns ``(status, lines)`` with status ``OK``, ``WARN`` or ``FAIL``."""
    try:
        with open(path) as fh:
            raw = json.load(fh)
        config = check_config(path, world_size)
    except Exception as exc:  # noqa: BLE001 - any rejection is the answer
        text = " | ".join(str(exc).splitlines())
        return "FAIL", [f"[FAIL] {path}: {type(exc).__name__}: {text}"]
    typos = misspelt_keys(raw)
    autos = auto_values(raw)
    status = "WARN" if typos or autos else "OK"
    lines = [f"[{status}]{' ' * (5 - len(status))}{path} (world size {world_size})"]
    for knob, value, source in knob_report(raw, config):
        lines.append(f"       {knob:<44} {str(value):<8} ({source})")
    for key in autos:
        lines.append(f"       {key} is \"auto\": only the HF Trainer / Accelerate fill it in; plain "
                     "deepspeed.initialize either fails on it or silently uses the default")
    for key, knob in typos:
        lines.append(f"       top-level key {key!r} looks like {knob!r}: DeepSpeed ignores unknown top-level keys, "
                     f"so {knob} keeps the value above")
    return status, lines


def main(argv: list[str] | None = None) -> int:
    """Check every file named on the command line; print one block per file."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("configs", nargs="+", help="DeepSpeed JSON config files")
    p.add_argument("--world-size", type=int, default=2, help="data-parallel ranks (GPUs in the job), default 2")
    p.add_argument("--strict", action="store_true", help="exit 1 on a warning too")
    args = p.parse_args(argv)
    if args.world_size < 1:
        p.error(f"--world-size must be >= 1, got {args.world_size}")
    statuses = []
    for path in args.configs:
        status, lines = check_file(path, args.world_size)
        statuses.append(status)
        print("\n".join(lines), flush=True)
    failed = "FAIL" in statuses or (args.strict and "WARN" in statuses)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
