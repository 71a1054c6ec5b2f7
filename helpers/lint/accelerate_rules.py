"""Rules for Accelerate YAML configs (D5, D17, D18, Gilbreth 4.3 / Gilbreth 8.12 failure mode 3).

The file is validated with Accelerate's own ``ClusterConfig`` (``SageMakerConfig`` for a SageMaker one, as ``accelerate launch`` does; unknown keys and bad values are
its errors), its ``fsdp_config`` with Accelerate's own ``FullyShardedDataParallelPlugin`` (given the environment
``accelerate launch`` would give it); the cross-field rules are checked here.
"""

from __future__ import annotations

import re
from typing import Any

from helpers import inputs
from helpers.checks import Check
from helpers.lint.findings import finding

DS_FILE_IGNORES = ("gradient_accumulation_steps", "gradient_clipping", "zero_stage", "offload_optimizer_device",
                   "offload_param_device", "zero3_save_16bit_model", "mixed_precision")


_ACC_LAUNCH = "https://github.com/huggingface/accelerate/blob/main/src/accelerate/commands/launch.py"
"""``_validate_launch_command``: a config's ``distributed_type`` NO leaves ``multi_gpu`` off, then ``num_processes > 1``
with several GPUs visible sets it on with the warning quoted in :func:`lint_accelerate`."""


_FSDP_ENV: dict[str, tuple[str, bool]] = {
    "fsdp_version": ("FSDP_VERSION", False), "fsdp_sharding_strategy": ("FSDP_SHARDING_STRATEGY", False),
    "fsdp_reshard_after_forward": ("FSDP_RESHARD_AFTER_FORWARD", True),
    "fsdp_offload_params": ("FSDP_OFFLOAD_PARAMS", True), "fsdp_min_num_params": ("FSDP_MIN_NUM_PARAMS", False),
    "fsdp_auto_wrap_policy": ("FSDP_AUTO_WRAP_POLICY", False),
    "fsdp_transformer_layer_cls_to_wrap": ("FSDP_TRANSFORMER_CLS_TO_WRAP", False),
    "fsdp_backward_prefetch": ("FSDP_BACKWARD_PREFETCH", False), "fsdp_state_dict_type": ("FSDP_STATE_DICT_TYPE", False),
    "fsdp_forward_prefetch": ("FSDP_FORWARD_PREFETCH", True), "fsdp_use_orig_params": ("FSDP_USE_ORIG_PARAMS", True),
    "fsdp_cpu_ram_efficient_loading": ("FSDP_CPU_RAM_EFFICIENT_LOADING", True),
    "fsdp_sync_module_states": ("FSDP_SYNC_MODULE_STATES", True),
    "fsdp_activation_checkpointing": ("FSDP_ACTIVATION_CHECKPOINTING", True),
}
"""``fsdp_config`` key -> (the environment variable ``accelerate launch`` sets for the script, lower-cased or not):
accelerate/utils/launch.py ``prepare_multi_gpu_env`` (``str(args.fsdp_x)``, ``.lower()`` for the booleans).  The
script's ``FullyShardedDataParallelPlugin`` reads them back in its ``__post_init__``."""


def _fsdp_plugin_error(fsdp: dict[str, Any]) -> str | None:
    """What Accelerate's ``FullyShardedDataParallelPlugin`` raises (its ``ValueError`` text) when a script launched
    with this ``fsdp_config`` builds it, or None when it accepts it (or Accelerate is not installed).

    The plugin is built under the environment ``accelerate launch`` would set (:data:`_FSDP_ENV`).  Its
    ``sync_module_states`` branch asks for the current GPU, which the machine running the linter need not have: the
    device look-up is answered with device 0 for the duration of the check (it only builds a closure over it), so
    the values after it are still checked."""
    import os
    from unittest import mock

    try:
        import torch
        from accelerate.utils import FullyShardedDataParallelPlugin
        from accelerate.utils import dataclasses as acc_dataclasses
    except ImportError:
        return None
    env = {k: v for k, v in os.environ.items() if not k.startswith("FSDP_")}
    env["ACCELERATE_USE_FSDP"] = "true"
    for key, value in fsdp.items():
        key = key if key.startswith("fsdp") else "fsdp_" + key  # as _validate_launch_command copies them
        if key in _FSDP_ENV and value is not None:
            var, lower = _FSDP_ENV[key]
            env[var] = str(value).lower() if lower else str(value)
    try:
        with mock.patch.dict(os.environ, env, clear=True), \
                mock.patch.object(acc_dataclasses, "is_cuda_available", lambda: True), \
                mock.patch.object(torch.cuda, "current_device", lambda: 0):
            FullyShardedDataParallelPlugin()
    except ValueError as exc:
        return str(exc)
    except Exception:  # noqa: BLE001 - anything else is about this machine, not the file
        return None
    return None


def _line(text: str, key: str) -> int:
    m = re.search(r"^\s*(?:-\s+)?" + re.escape(key) + r"\s*:", text, re.MULTILINE)
    return text.count("\n", 0, m.start()) + 1 if m else 1


def load(text: str, path: str = "<yaml>") -> dict[str, Any]:
    """Parse the YAML through :func:`helpers.inputs.load_yaml` (safe loader; nesting and alias expansion bounded).

    Raises:
        helpers.inputs.InputError: not YAML, nested too deeply, an alias bomb, or not a mapping.
    """
    import yaml
    try:
        data = inputs.load_yaml(text, path)
    except yaml.YAMLError as exc:  # PyYAML's reader refuses control characters before load_yaml's own handler
        raise inputs.InputError(path, f"not valid YAML: {getattr(exc, 'reason', None) or exc}") from None
    if not isinstance(data, dict):
        raise inputs.InputError(path, "not valid YAML for an Accelerate config: it is a mapping (key: value)")
    return data


def from_env_report(text: str) -> dict[str, Any] | None:
    """The config in ``accelerate env``'s report (``- num_processes: 1`` lines, what issue templates ask for), or
    None when ``text`` is not one (fewer than three such lines, or no ``distributed_type``/``num_processes``)."""
    import yaml

    pairs = re.findall(r"^[ \t]*-[ \t]+([a-z_]+):[ \t]*(.*?)[ \t]*$", text, re.M)
    keys = {k for k, _ in pairs}
    if len(pairs) < 3 or not {"distributed_type", "num_processes"} & keys:
        return None
    data: dict[str, Any] = {}
    for key, value in pairs:
        try:
            data[key] = yaml.safe_load(value) if value else None
        except yaml.YAMLError:
            data[key] = value
    return data


def is_accelerate_config(data: dict[str, Any]) -> bool:
    """True when the YAML looks like an Accelerate config."""
    return bool({"distributed_type", "compute_environment", "num_processes"} & set(data))


def lint_accelerate(path: str, text: str, data: dict[str, Any], *, accelerator_grad_accum: tuple[str, int, str] | None,
                    ds_gas: tuple[str, Any] | None, saved_by: str = "", launch_sets_precision: bool = False) -> list[Check]:
    """Lint one Accelerate config.

    Args:
        accelerator_grad_accum: ``(file, line, value)`` of ``Accelerator(gradient_accumulation_steps=...)`` in a script.
        ds_gas: ``(file, value)`` of ``gradient_accumulation_steps`` in a linted DeepSpeed JSON.
        saved_by: what saves the whole model in a linted script (as for :func:`helpers.lint.deepspeed_rules.lint_deepspeed`);
            empty when no linted script does, or none was given: then an unsaved ZeRO-3 gather is info, not a warning.
        launch_sets_precision: a linted ``accelerate launch`` line passes ``--mixed_precision`` itself; then a
            top-level ``mixed_precision`` in the YAML is not read, and is no clash with ``deepspeed_config_file``.
    """
    out: list[Check] = []

    def add(rule: str, sev: str, key: str, msg: str, fix: str, seed: str) -> None:
        out.append(finding(rule, sev, path, _line(text, key) if key else 1, msg, fix, seed))

    try:
        from accelerate.commands.config.config_args import ClusterConfig, SageMakerConfig

        # load_config_from_file: a compute_environment other than LOCAL_MACHINE is read by SageMakerConfig
        config_cls = ClusterConfig if str(data.get("compute_environment", "LOCAL_MACHINE")) == "LOCAL_MACHINE" \
            else SageMakerConfig
        fields = set(config_cls.__dataclass_fields__)
        unknown = sorted(set(data) - fields)
        if unknown:
            add("acc-invalid-config", "error", unknown[0], f"unknown key(s) {', '.join(unknown)}: accelerate launch stops "
                "with 'The config file at ... had unknown keys'", "remove or fix them (accelerate config writes valid "
                "files)", "D5")
        else:
            known = {k: v for k, v in data.items() if k in fields}
            for key, default in (("mixed_precision", "no"), ("use_cpu", False), ("debug", False),
                                 ("compute_environment", "LOCAL_MACHINE"), ("distributed_type", "NO")):
                known.setdefault(key, default)  # the defaults ClusterConfig.from_yaml_file fills in
            config_cls(**known)
    except ImportError:
        pass
    except (TypeError, ValueError) as exc:
        add("acc-invalid-config", "error", "", f"Accelerate's ClusterConfig rejects it: {exc}", "fix the value", "D5")
    ds = data.get("deepspeed_config") or {}
    dist_type = str(data.get("distributed_type", ""))
    fsdp = data.get("fsdp_config")
    if dist_type == "FSDP" and isinstance(fsdp, dict) and not out:
        error = _fsdp_plugin_error(fsdp)
        if error:
            bad = next((k for k in fsdp if not isinstance(fsdp[k], bool) and str(fsdp[k]) in error), "fsdp_config")
            add("acc-invalid-config", "error", bad, f"Accelerate's FullyShardedDataParallelPlugin rejects fsdp_config "
                f"when the script builds it under accelerate launch: {error}", "fix the value (accelerate config "
                "writes valid files)", "D5")
    if isinstance(ds, dict) and ds.get("deepspeed_config_file"):
        clash = [k for k in DS_FILE_IGNORES if k in ds]
        if data.get("mixed_precision") is not None and dist_type == "DEEPSPEED" and not launch_sets_precision:
            # accelerate/commands/launch.py: a config's mixed_precision (any value, 'no' included) read because the
            # command line gave none sets mp_from_config_flag, which adds "mixed_precision" to
            # ACCELERATE_CONFIG_DS_FIELDS; DeepSpeedPlugin._deepspeed_config_checks then raises the ValueError below.
            clash.append("mixed_precision")
        if clash:
            add("acc-ds-file-overrides", "error", clash[0],
                f"{', '.join(clash)} set next to deepspeed_config_file: 'When using `deepspeed_config_file`, the "
                "following accelerate config variables will be ignored' (accelerate launch raises ValueError)",
                "set them in the DeepSpeed JSON only and remove them here", "D17")
        if data.get("fsdp_config"):
            add("acc-ds-file-overrides", "warning", "fsdp_config", "fsdp_config is ignored: the DeepSpeed config file "
                "decides sharding", "remove fsdp_config (or drop DeepSpeed)", "D17")
    yaml_gas = ds.get("gradient_accumulation_steps") if isinstance(ds, dict) else None
    places = []
    if yaml_gas not in (None, "auto"):
        places.append(f"{path} deepspeed_config.gradient_accumulation_steps={yaml_gas}")
    if ds_gas and ds_gas[1] not in (None, "auto") and dist_type == "DEEPSPEED":
        places.append(f"{ds_gas[0]} gradient_accumulation_steps={ds_gas[1]}")
    if accelerator_grad_accum and dist_type == "DEEPSPEED":
        places.append(f"{accelerator_grad_accum[0]}:{accelerator_grad_accum[1]} Accelerator(gradient_accumulation_steps="
                      f"{accelerator_grad_accum[2]})")
    if len(places) > 1:
        add("acc-accumulation-twice", "warning", "deepspeed_config", "gradient accumulation is set in "
            f"{len(places)} places ({'; '.join(places)}): one silently overrides the other, or they multiply",
            'set it in one place: "auto" in the JSON and the value in Accelerator(...) or the YAML', "D18")
    if dist_type == "DEEPSPEED" and isinstance(ds, dict) and not ds.get("deepspeed_config_file") and \
            str(ds.get("zero_stage")) == "3" and ds.get("zero3_save_16bit_model") is not True:
        # DeepSpeedPlugin.zero3_save_16bit_model defaults to false (ACCELERATE_DEEPSPEED_ZERO3_SAVE_16BIT_MODEL) and
        # becomes stage3_gather_16bit_weights_on_model_save; Accelerator.get_state_dict then raises 'Cannot get
        # 16bit model weights because ...' and Trainer.save_model writes only the sharded DeepSpeed checkpoint
        # a warning when a linted script saves the whole model; alone, the config says nothing of how the model is
        # saved (a trainer that writes DeepSpeed's own checkpoint and converts it later is fine): info
        add("ds-zero3-save-without-gather", "warning" if saved_by else "info",
            "zero3_save_16bit_model" if "zero3_save_16bit_model" in ds else "zero_stage",
            f"ZeRO stage 3 with zero3_save_16bit_model {ds.get('zero3_save_16bit_model', 'unset (false)')}"
            f"{' and the model saved by ' + saved_by if saved_by else ''}: the "
            "weights stay partitioned at save time, so accelerator.get_state_dict / save_model raise 'Cannot get "
            "16bit model weights because `stage3_gather_16bit_weights_on_model_save` in DeepSpeed config is False' "
            "and Trainer.save_model writes only the DeepSpeed shards (no loadable model without zero_to_fp32.py)",
            "zero3_save_16bit_model: true (and zero3_init_flag: true for large models)",
            "https://huggingface.co/docs/accelerate/en/usage_guides/deepspeed#saving-and-loading")
    procs, machines = data.get("num_processes"), data.get("num_machines", 1)
    if dist_type == "NO" and isinstance(procs, int) and procs > 1 and not data.get("use_cpu"):
        add("acc-processes-without-distribution", "warning", "num_processes",
            f"distributed_type: NO with num_processes: {procs}: on a node with more than one GPU accelerate launch "
            "turns multi-GPU on anyway ('More than one GPU was found, enabling multi-GPU training') and starts "
            f"{procs} processes; on one GPU it starts one: the file does not say which run it is",
            "num_processes: 1 for a one-process config; distributed_type: MULTI_GPU for a multi-GPU one",
            _ACC_LAUNCH)
    if isinstance(procs, int) and isinstance(machines, int) and machines > 0 and procs > 0 and procs % machines:
        add("acc-processes-not-divisible", "error", "num_processes",
            f"num_processes={procs} is the TOTAL over num_machines={machines} and does not divide: the machines cannot "
            "get equal shares", f"num_processes = {machines} x processes per machine", "D5")
    if dist_type == "DEEPSPEED" and isinstance(machines, int) and machines > 1 and isinstance(ds, dict):
        launcher = ds.get("deepspeed_multinode_launcher", "pdsh")
        if launcher in ("pdsh", "openmpi", "mvapich", "mpich", None):
            add("acc-multinode-ssh-launcher", "warning", "deepspeed_multinode_launcher" if "deepspeed_multinode_launcher"
                in ds else "num_machines",
                f"multi-node DeepSpeed with the {launcher} launcher starts the other nodes over ssh: where compute nodes "
                "refuse ssh it dies with 'ssh exited with exit code 2'",
                "deepspeed_multinode_launcher: standard, and start accelerate launch on every node (srun)",
                "Gilbreth 4.3; Gilbreth 8.12")
    return out


def world_size(data: dict[str, Any]) -> int | None:
    """``num_processes`` when it is a positive integer."""
    n = data.get("num_processes")
    return n if isinstance(n, int) and n > 0 else None
