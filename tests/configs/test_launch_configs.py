"""The launch configs checked by the libraries that own them: the Accelerate DDP YAMLs (Accelerate's loader and
launch validation), the DeepSpeed hostfile (DeepSpeed's parser) and the smoke tests' DeepSpeed JSONs (DeepSpeedConfig)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest
from support import ROOT

YAMLS = {"cpu": ROOT / "configs" / "accelerate_ddp_cpu.yaml", "gpu": ROOT / "configs" / "accelerate_ddp_gpu.yaml"}


@pytest.mark.parametrize("which", sorted(YAMLS))
def test_accelerate_yaml_loads_with_accelerate(which):
    from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
    from accelerate.utils import DistributedType

    path = YAMLS[which]
    cfg = ClusterConfig.from_yaml_file(yaml_file=str(path))  # raises ValueError on unknown keys
    assert isinstance(load_config_from_file(str(path)), ClusterConfig)
    assert cfg.distributed_type == DistributedType.MULTI_GPU and cfg.num_machines == 1 and cfg.machine_rank == 0
    if which == "cpu":
        assert cfg.use_cpu is True and cfg.num_processes == 2 and cfg.mixed_precision == "no"
    else:
        assert cfg.use_cpu is False and cfg.num_processes >= 2 and cfg.mixed_precision == "bf16"
    text = path.read_text()
    header = [line for line in text.splitlines() if line.startswith("#")][:6]
    assert any(f"accelerate launch --config_file configs/{path.name}" in line for line in header)
    assert re.search(r"^num_processes: \d+ +# EDIT", text, re.M)


@pytest.mark.parametrize("which, nproc", [("cpu", 2), ("gpu", 8)])
def test_accelerate_yaml_selects_the_multi_process_launcher(which, nproc):
    """What `accelerate launch --config_file X` decides, without launching (accelerate's own validation)."""
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    args = launch_command_parser().parse_args(["--config_file", str(YAMLS[which]), "train.py"])
    args, _, _ = _validate_launch_command(args)
    assert args.multi_gpu and not args.cpu and args.num_processes == nproc  # torchrun path: N processes (D5)


def test_accelerate_loader_rejects_unknown_keys(tmp_path: Path):
    from accelerate.commands.config.config_args import ClusterConfig

    bad = tmp_path / "bad.yaml"
    bad.write_text(YAMLS["cpu"].read_text() + "multi_cpu: true\n")
    with pytest.raises(ValueError, match="unknown keys"):
        ClusterConfig.from_yaml_file(yaml_file=str(bad))


def test_hostfile_example_parses_with_deepspeed():
    from deepspeed.launcher.runner import _parse_hostfile

    text = (ROOT / "configs" / "hostfile.example").read_text()
    assert _parse_hostfile(text.splitlines()) == {"worker-1": 8, "worker-2": 8}
    assert "deepspeed --hostfile=configs/hostfile.example" in text and text.count("# EDIT") == 2
    with pytest.raises(ValueError, match="bad entry"):
        _parse_hostfile(["worker-1 gpus=8"])


@pytest.mark.parametrize("name", ["ds_zero1_cpu.json", "ds_zero1_gpu.json"])
def test_deepspeed_configs(name: str) -> None:
    """The shipped configs: plain JSON, section 7.4's invariants, and accepted by DeepSpeedConfig.

    They leave ``train_batch_size`` out, so DeepSpeed derives it for any world size (micro x
    accumulation x world size, section 7.4) and the allocation check runs on 2 or 8 ranks alike.
    The pydantic sections (zero_optimization, bf16) reject unknown keys, the top level ignores
    them (hence the ``_comment`` key works).
    """
    cfg = json.loads((ROOT / "configs" / name).read_text())
    micro, gas = cfg["train_micro_batch_size_per_gpu"], cfg["gradient_accumulation_steps"]
    assert "train_batch_size" not in cfg and gas == 1
    assert micro == 32  # the smoke scripts' --batch default
    assert cfg["zero_optimization"]["stage"] == 1
    assert cfg["bf16"]["enabled"] is True
    assert cfg["optimizer"]["type"] == "AdamW"  # ZeRO-1 needs one (section 7.5 issue 1)
    assert cfg["optimizer"]["params"].get("torch_adam", False) is (name == "ds_zero1_cpu.json")
    assert "deepspeed" in cfg["_comment"]

    from deepspeed.runtime.config import DeepSpeedConfig

    checked = DeepSpeedConfig(cfg)
    assert checked.zero_optimization_stage == 1
    assert checked.bfloat16_config.enabled
