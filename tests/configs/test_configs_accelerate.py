"""The Accelerate FSDP and DeepSpeed YAMLs in configs/, checked with Accelerate's own loader, launcher and plugins."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FSDP_YAML = ROOT / "configs" / "accelerate_fsdp_gpu.yaml"
DS_YAML = ROOT / "configs" / "accelerate_deepspeed_gpu.yaml"


def _validated(path: Path):
    from accelerate.commands.launch import _validate_launch_command, launch_command_parser

    args = launch_command_parser().parse_args(["--config_file", str(path), "train.py"])
    args, _, _ = _validate_launch_command(args)
    return args


@pytest.mark.parametrize("path", [FSDP_YAML, DS_YAML], ids=lambda p: p.name)
def test_yaml_loads_and_names_its_command(path):
    from accelerate.commands.config.config_args import ClusterConfig

    cfg = ClusterConfig.from_yaml_file(yaml_file=str(path))  # ValueError on unknown keys
    assert cfg.num_processes == 8 and cfg.use_cpu is False
    header = [line for line in path.read_text().splitlines() if line.startswith("#")][:4]
    assert any(f"accelerate launch --config_file configs/{path.name}" in line for line in header)


def test_fsdp_yaml_becomes_the_fsdp2_plugin_chapter_04_teaches(monkeypatch):
    """What `accelerate launch` hands the script (FSDP_* variables) builds FSDP2, per-block wrapping, DCP (D12-D15)."""
    import torch
    from accelerate.utils import FullyShardedDataParallelPlugin
    from accelerate.utils.launch import prepare_multi_gpu_env
    from torch.distributed.fsdp import StateDictType
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy

    args = _validated(FSDP_YAML)
    assert args.use_fsdp and not args.use_deepspeed and args.num_processes == 8
    env = prepare_multi_gpu_env(args)
    for key, value in env.items():
        if key.startswith(("FSDP_", "ACCELERATE_")):
            monkeypatch.setenv(key, value)
    plugin = FullyShardedDataParallelPlugin()
    assert plugin.fsdp_version == 2 and plugin.reshard_after_forward is True
    assert plugin.auto_wrap_policy is transformer_auto_wrap_policy  # per block, not one unit (D12)
    assert plugin.state_dict_type == StateDictType.SHARDED_STATE_DICT  # DCP (D15)
    assert env["ACCELERATE_MIXED_PRECISION"] == "bf16"
    # what AcceleratorState does with it (state.py: fsdp_plugin.set_mixed_precision): bf16 reductions too (D14);
    # the config comment must say so, and a policy given in code is what keeps fp32 reductions
    plugin.set_mixed_precision(env["ACCELERATE_MIXED_PRECISION"])
    assert plugin.mixed_precision_policy.reduce_dtype == torch.bfloat16
    assert "reduce-scatters in bf16" in FSDP_YAML.read_text()
    fp32 = FullyShardedDataParallelPlugin(mixed_precision_policy={"param_dtype": torch.bfloat16, "output_dtype": torch.bfloat16,
                                                                  "reduce_dtype": torch.float32})
    fp32.set_mixed_precision("bf16")
    assert fp32.mixed_precision_policy.reduce_dtype == torch.float32


def test_deepspeed_yaml_points_at_a_valid_ds_config():
    from accelerate.commands.config.config_args import ClusterConfig
    from accelerate.utils import DeepSpeedPlugin, DistributedType

    cfg = ClusterConfig.from_yaml_file(yaml_file=str(DS_YAML))
    assert cfg.distributed_type == DistributedType.DEEPSPEED
    json_path = ROOT / cfg.deepspeed_config["deepspeed_config_file"]
    assert json_path.is_file()
    args = _validated(DS_YAML)
    assert args.use_deepspeed and args.deepspeed_multinode_launcher == "standard"
    plugin = DeepSpeedPlugin(hf_ds_config=str(json_path))
    assert plugin.zero_stage == 1


def test_accelerate_rejects_a_bad_fsdp_value(monkeypatch):
    """The checks can fail: an unknown sharding strategy is refused by Accelerate's plugin."""
    from accelerate.utils import FullyShardedDataParallelPlugin

    monkeypatch.setenv("FSDP_VERSION", "1")
    monkeypatch.setenv("FSDP_SHARDING_STRATEGY", "SHARD_EVERYTHING")
    with pytest.raises(KeyError, match="SHARD_EVERYTHING"):
        FullyShardedDataParallelPlugin()
