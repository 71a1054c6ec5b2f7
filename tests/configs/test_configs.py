"""Every configs/ds_*.json is validated by DeepSpeed's own config class at world size 2, and names its command."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import pytest
from support import ROOT

from helpers.scenarios import ds_config_check

DS_CONFIGS = sorted((ROOT / "configs").glob("ds_*.json"))
WORLD_SIZE = 2


def ds_config(source: dict | str | Path, world_size: int = WORLD_SIZE):
    """DeepSpeed's own config object, built as ``deepspeed.initialize`` builds it on ``world_size`` ranks."""
    config = ds_config_check.check_config(str(source) if isinstance(source, Path) else source, world_size)
    assert config.world_size == world_size
    return config


def test_there_are_configs():
    names = {p.name for p in DS_CONFIGS}
    assert {"ds_zero0_cpu.json", "ds_zero1_cpu.json", "ds_zero2_cpu.json", "ds_zero3_cpu.json",
            "ds_zero3_offload_cpu.json", "ds_zero1_gpu.json"} <= names


@pytest.mark.parametrize("path", DS_CONFIGS, ids=lambda p: p.name)
def test_config_is_valid_for_deepspeed(path):
    raw = json.loads(path.read_text())  # plain JSON, readable by every tool (DeepSpeed itself uses hjson)
    config = ds_config(path)
    stage = int(re.search(r"zero(\d)", path.name).group(1))
    assert config.zero_optimization_stage == stage
    assert config.bfloat16_config.enabled and not config.float16_config.enabled
    derived = config.train_micro_batch_size_per_gpu * config.gradient_accumulation_steps * WORLD_SIZE
    assert config.train_batch_size == raw.get("train_batch_size", derived) == derived
    assert config.gradient_clipping == raw["gradient_clipping"]
    assert config.optimizer_name == "adamw"
    if path.name.endswith("_cpu.json"):
        assert config.optimizer_params.get("torch_adam") is True, "CPU configs avoid the ~50 s FusedAdam JIT build"
    if "offload" in path.name:
        assert config.zero_config.offload_optimizer.device == "cpu"
        assert config.zero_config.offload_param.device == "cpu"


@pytest.mark.parametrize("path", DS_CONFIGS, ids=lambda p: p.name)
def test_comment_names_the_command_that_uses_it(path):
    comment = json.loads(path.read_text()).get("_comment", "")
    m = re.search(r"((?:deepspeed --num_gpus \d+|torchrun [^ ]+) (helpers/scenarios/\w+\.py)[^.;(]*)", comment)
    assert m, f"{path.name}: _comment must name the launch command, got {comment!r}"
    assert (ROOT / m.group(2)).is_file(), f"{path.name}: {m.group(2)} does not exist"
    shlex.split(m.group(1))  # a well-formed command line


def test_validation_can_fail():
    """The checks above are real: a misspelt zero_optimization key or bad batch arithmetic is rejected."""
    import pydantic

    good = json.loads((ROOT / "configs" / "ds_zero2_cpu.json").read_text())
    bad = dict(good, zero_optimization=dict(good["zero_optimization"], offload_optimiser={"device": "cpu"}))
    with pytest.raises(pydantic.ValidationError, match="extra_forbidden"):
        ds_config(bad)
    with pytest.raises(AssertionError, match=r"64 != 32 \* 1 \* 4"):
        ds_config(dict(good, train_batch_size=64), world_size=4)
    # ...while an unknown top-level key is silently ignored (D17), and gradient_clipping keeps its default.
    typo = {k: v for k, v in good.items() if k != "gradient_clipping"} | {"gradient_clip": 0.0}
    assert ds_config(typo).gradient_clipping == 1.0


