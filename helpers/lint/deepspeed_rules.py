"""Rules for DeepSpeed JSON configs (D17, D18, Gilbreth 7.4, Gilbreth 7.5).

Sub-sections are validated with DeepSpeed's own pydantic models (``DeepSpeedZeroConfig`` for
``zero_optimization``, imported only when a config is linted); the top level is checked here,
since DeepSpeed silently ignores unknown top-level keys.  ``"auto"`` values are dropped before
validation (the HF integration fills them in; a raw ``deepspeed.initialize`` does not, D18).
"""

from __future__ import annotations

import contextlib
import io
import re
from typing import Any

from helpers import inputs
from helpers.checks import Check
from helpers.lint.findings import finding

TOP_LEVEL = {
    "train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps", "optimizer", "scheduler",
    "fp16", "bf16", "bfloat16", "amp", "zero_optimization", "gradient_clipping", "prescale_gradients",
    "gradient_predivide_factor", "sparse_gradients", "steps_per_print", "wall_clock_breakdown", "dump_state",
    "disable_allgather", "communication_data_type", "seq_parallel_communication_data_type", "zero_allow_untested_optimizer",
    "zero_force_ds_cpu_optimizer", "activation_checkpointing", "flops_profiler", "tensorboard", "wandb", "csv_monitor",
    "comet", "comms_logger", "autotuning", "elasticity", "aio", "nvme", "checkpoint", "data_types", "compression_training",
    "data_efficiency", "curriculum_learning", "sparse_attention", "pipeline", "progressive_layer_drop", "eigenvalue",
    "quantize_training", "dataloader_drop_last", "memory_breakdown", "hybrid_engine", "compile", "weight_quantization",
    "graph_harvesting", "use_data_before_expert_parallelism", "timers", "torch_autocast", "tensor_parallel",
    "nebula", "mics_shard_size", "mics_hierarchical_params_gather", "vocabulary_size", "load_universal_checkpoint",
    "use_node_local_storage", "zero_quantized_weights", "zero_quantized_gradients", "monitor_config", "gradient_checkpointing",
    "fp8", "domino", "moe", "expert_parallel", "deepcompile", "use_unified_checkpoint", "sequence_parallel_size",
}
ZERO_KEYS = {"stage", "offload_optimizer", "offload_param", "overlap_comm", "contiguous_gradients", "reduce_bucket_size",
             "allgather_bucket_size", "reduce_scatter", "allgather_partitions", "stage3_prefetch_bucket_size",
             "stage3_param_persistence_threshold", "stage3_max_live_parameters", "stage3_max_reuse_distance",
             "stage3_gather_16bit_weights_on_model_save", "sub_group_size", "round_robin_gradients", "cpu_offload"}
SECTION_KEYS = {"lr": "optimizer.params", "betas": "optimizer.params", "eps": "optimizer.params",
                "weight_decay": "optimizer.params", "loss_scale": "fp16", "initial_scale_power": "fp16",
                "warmup_num_steps": "scheduler.params", "warmup_max_lr": "scheduler.params"}


def _line(text: str, key: str) -> int:
    m = re.search(r'"' + re.escape(key) + r'"\s*:', text)
    return text.count("\n", 0, m.start()) + 1 if m else 1


def _drop_auto(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _drop_auto(v) for k, v in value.items() if v != "auto"}
    return value


def _has_auto(value: Any, path: str = "") -> list[str]:
    if isinstance(value, dict):
        out: list[str] = []
        for k, v in value.items():
            out += _has_auto(v, f"{path}.{k}" if path else k)
        return out
    return [path] if value == "auto" else []


def load(text: str, path: str = "<json>") -> dict[str, Any]:
    """Parse a DeepSpeed JSON config through :func:`helpers.inputs.load_json` (nesting bounded, BOM dropped).

    Raises:
        helpers.inputs.InputError: not JSON (line and column named), nested too deeply, or not a JSON object.
    """
    data = inputs.load_json(text, path, allow_nan=True)
    if not isinstance(data, dict):
        raise inputs.InputError(path, "not valid JSON for a DeepSpeed config: it is a JSON object ({...})")
    return data


def repair(text: str) -> str | None:
    """A truncated or hand-edited JSON excerpt made parseable: trailing commas dropped, the brackets left open at
    the end closed (strings skipped).  None when that is not enough.  The result is for analysis only: the file
    still gets its ``config-unparsable`` error."""
    body = re.sub(r",\s*([}\]])", r"\1", text.rstrip().rstrip(","))
    stack: list[str] = []
    in_str = esc = False
    for ch in body:
        if in_str:
            esc, in_str = (False, in_str) if esc else (ch == "\\", ch != '"')
            continue
        if ch == '"':
            in_str = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]" and stack:
            stack.pop()
    if in_str:
        return None
    fixed = body.rstrip().rstrip(",") + "".join(reversed(stack))
    try:
        data = inputs.load_json(fixed, "<repair>", allow_nan=True)
    except ValueError:
        return None
    return fixed if isinstance(data, dict) else None


def is_deepspeed_config(data: dict[str, Any]) -> bool:
    """True when the JSON looks like a DeepSpeed config: one of its own keys (``zero_optimization``, the batch sizes,
    ``gradient_accumulation_steps`` outside a TrainingArguments JSON), or a section in DeepSpeed's shape (``"optimizer": {"type": ...}``, ``"fp16":
    {"enabled": ...}``).  A config of another tool that merely has an ``optimizer`` item (a MONAI bundle's
    ``{"_target_": "torch.optim.Adam"}``, a Hydra node) is not one."""
    if {"zero_optimization", "train_batch_size", "train_micro_batch_size_per_gpu"} & set(data):
        return True
    if "gradient_accumulation_steps" in data and not ({"output_dir", "per_device_train_batch_size",
                                                       "num_train_epochs", "learning_rate"} & set(data)):
        return True  # (a JSON of transformers' TrainingArguments, read by HfArgumentParser.parse_json_file, has
        # gradient_accumulation_steps too, among its own fields: llm2vec's training configs)
    opt = data.get("optimizer")
    return (isinstance(opt, dict) and "type" in opt and "_target_" not in opt) or any(
        isinstance(data.get(k), dict) and "enabled" in data[k] for k in ("fp16", "bf16"))


def enabled(section: Any) -> bool:
    """``{"enabled": true}`` (``"auto"`` is not enabled here)."""
    return isinstance(section, dict) and section.get("enabled") is True


def lint_deepspeed(path: str, text: str, data: dict[str, Any], *, world_size: int | None, raw_init: bool | None,
                   client_optimizer: bool, init_where: str = "", saved_by: str = "") -> list[Check]:
    """Lint one DeepSpeed config.

    Args:
        path, text, data: the file, its text and parsed JSON.
        world_size: ranks in the launch (from the launch files), or None when unknown.
        raw_init: True when a linted script calls ``deepspeed.initialize`` directly, False when the
            scripts use HF Trainer/Accelerate, None when no script was given.
        client_optimizer: a script passes its own optimizer to ``deepspeed.initialize``.
        init_where: ``file:line`` of that call, for messages.
        saved_by: what saves the whole model in a linted script (``"the HF Trainer / Accelerate"``,
            ``"engine.save_16bit_model"``), "" when nothing does: with ZeRO-3 it needs the 16-bit gather.
    """
    out: list[Check] = []

    def add(rule: str, sev: str, key: str, msg: str, fix: str, seed: str) -> None:
        out.append(finding(rule, sev, path, _line(text, key) if key else 1, msg, fix, seed))

    for key in data:
        if key.startswith("_") or key in TOP_LEVEL:
            continue
        if key in ZERO_KEYS:
            add("ds-misplaced-key", "error", key, f'"{key}" belongs inside "zero_optimization": at the top level '
                "DeepSpeed ignores it silently" + (" (ZeRO stays at stage 0)" if key == "stage" else ""),
                f'move it into "zero_optimization": {{"{key}": ...}}', "D17")
        elif key in SECTION_KEYS:
            add("ds-misplaced-key", "error", key, f'"{key}" belongs inside "{SECTION_KEYS[key]}": at the top level it is '
                "ignored", f'move it into "{SECTION_KEYS[key]}"', "D17")
        else:
            add("ds-unknown-key", "warning", key, f'"{key}" is not a DeepSpeed config key: DeepSpeed ignores it without a '
                "word (a typo keeps the default)", "fix the spelling (see https://www.deepspeed.ai/docs/config-json/)",
                "D17")
    zero = data.get("zero_optimization")
    if isinstance(zero, dict):
        try:
            with contextlib.redirect_stdout(io.StringIO()):  # DeepSpeed logs to stdout: keep --json output clean
                from deepspeed.runtime.zero.config import DeepSpeedZeroConfig
                DeepSpeedZeroConfig(**_drop_auto(zero))
        except ImportError:
            pass
        except Exception as exc:  # noqa: BLE001 - pydantic ValidationError, reported with its own words
            errors = getattr(exc, "errors", None)
            items = errors() if callable(errors) else [{"loc": (), "msg": str(exc)}]
            for e in items[:5]:
                loc = ".".join(str(x) for x in e.get("loc", ()))
                add("ds-invalid-section", "error", loc.split(".")[0] if loc else "zero_optimization",
                    f"zero_optimization.{loc}: {e.get('msg')} (DeepSpeed's DeepSpeedZeroConfig rejects it at initialize)",
                    "fix or remove the key (https://www.deepspeed.ai/docs/config-json/#zero-optimizations-for-fp16-training)",
                    "D17")
    stage = zero.get("stage", 0) if isinstance(zero, dict) else 0
    if isinstance(zero, dict) and isinstance(stage, int):
        for key, need, ok in (("offload_param", "3", stage == 3), ("offload_optimizer", "1, 2 or 3", stage >= 1)):
            section = zero.get(key)
            device = section.get("device") if isinstance(section, dict) else None
            if device not in (None, "none") and not ok:
                add("ds-offload-needs-stage", "warning", key,
                    f"zero_optimization.{key} (device {device}) with ZeRO stage {stage}: DeepSpeed documents it as "
                    f"valid only with stage {need}, and nothing is offloaded", f"set \"stage\": {need[-1]} or remove "
                    f"{key}", "https://www.deepspeed.ai/docs/config-json/#parameter-offloading")
    if isinstance(stage, int) and stage in (1, 2) and "optimizer" not in data and not client_optimizer and \
            raw_init is not False:
        # DeepSpeed's own assertion (runtime/engine.py _configure_zero_optimizer, stages 1-2 only): 'zero stage {}
        # requires an optimizer'.  Stage 3 without one builds the inference-only DeepSpeedZeRoOffload; the HF Trainer
        # and Accelerate pass their own optimizer when the section is absent
        # (https://huggingface.co/docs/transformers/en/deepspeed#optimizer).  So the script decides: an error next to
        # a raw deepspeed.initialize without optimizer=, nothing next to HF Trainer / Accelerate scripts, and an info
        # for the config alone (an engine built without an optimizer, such as a DPO reference model prepared with
        # the training config, still asserts: hiyouga/LlamaFactory#1243).
        if raw_init:
            add("ds-zero-without-optimizer", "error", "zero_optimization",
                f"ZeRO stage {stage} with no \"optimizer\" section and no optimizer passed to deepspeed.initialize "
                f"({init_where}): 'AssertionError: zero stage {stage} requires an optimizer'",
                'add "optimizer": {"type": "AdamW", "params": {...}} or pass optimizer= to deepspeed.initialize',
                "Gilbreth 7.5")
        else:
            add("ds-zero-without-optimizer", "info", "zero_optimization",
                f"ZeRO stage {stage} with no \"optimizer\" section: right for the HF Trainer and Accelerate (they pass "
                "their own optimizer); an engine initialized without one (a raw deepspeed.initialize, a reference "
                f"model prepared with this config) stops with 'AssertionError: zero stage {stage} requires an optimizer'",
                'lint it with its training script; for an engine without an optimizer add "optimizer": {...} or use '
                "stage 0 for that engine", "Gilbreth 7.5")
    gather = zero.get("stage3_gather_16bit_weights_on_model_save") if isinstance(zero, dict) else None
    if stage == 3 and saved_by and gather is not True and gather != "auto":
        # engine.save_16bit_model: 'Did not save the model ... because stage3_gather_16bit_weights_on_model_save is
        # False'; Accelerate's get_state_dict raises; the HF Trainer saves only the shards
        add("ds-zero3-save-without-gather", "warning",
            "stage3_gather_16bit_weights_on_model_save" if gather is not None else "zero_optimization",
            f"ZeRO stage 3 with stage3_gather_16bit_weights_on_model_save {gather if gather is not None else 'unset (false)'}"
            f" and the model saved by {saved_by}: the partitioned weights are not gathered, so no loadable model is "
            "written ('Did not save the model ... because stage3_gather_16bit_weights_on_model_save is False'; "
            "Accelerate: 'Cannot get 16bit model weights'; the HF Trainer writes only the DeepSpeed shards)",
            '"stage3_gather_16bit_weights_on_model_save": true (or convert the shards with zero_to_fp32.py)',
            "https://www.deepspeed.ai/docs/config-json/#zero-optimizations-for-fp16-training")
    if enabled(data.get("fp16")) and enabled(data.get("bf16") or data.get("bfloat16")):
        add("ds-fp16-and-bf16", "error", "bf16", "fp16 and bf16 are both enabled: DeepSpeed refuses to start "
            "('bf16 and fp16 modes cannot be simultaneously enabled')", "enable one of them (bf16 on A100/H100)", "D17")
    autos = _has_auto(data)
    if autos and raw_init:
        add("ds-auto-raw-initialize", "error", autos[0].split(".")[-1],
            f'"auto" in {", ".join(autos[:4])}: only the HF Trainer/Accelerate integration fills "auto" in; a raw '
            f"deepspeed.initialize ({init_where}) reads the string ('>' not supported between 'str' and 'int')",
            'write the numbers, or launch through the HF Trainer/Accelerate', "D18")
    for key in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps",
                "gradient_clipping", "steps_per_print"):
        value = data.get(key)
        if isinstance(value, str) and value != "auto":
            add("ds-invalid-value", "error", key,
                f'{key} is the string "{value}": the config documents a number, and DeepSpeed compares and multiplies '
                f"it as one (the HF integration reports 'ds {key}={value} vs hf ...', DeepSpeed's own check "
                "'>' not supported between 'str' and 'int')", f'{key}: {value} (no quotes), or "auto" under the HF '
                "Trainer/Accelerate", "https://www.deepspeed.ai/docs/config-json/#batch-size-related-parameters")
    offload = zero.get("offload_optimizer") if isinstance(zero, dict) else None
    if isinstance(offload, dict) and isinstance(offload.get("ratio"), (int, float)) and offload["ratio"] < 1 and \
            offload.get("device") not in (None, "cpu"):
        add("ds-invalid-section", "error", "ratio",
            f"zero_optimization.offload_optimizer.ratio {offload['ratio']} (partial offload) with device "
            f"{offload.get('device')}: the ratio is the share offloaded to CPU Adam (config docs), and ZeRO-3's hybrid "
            "optimizer asserts 'Hybrid Optimizer Only Supports DeepSpeedCPUAdam'", 'device "cpu", or drop "ratio"',
            "https://www.deepspeed.ai/docs/config-json/#optimizer-offloading")
    tb, mb, ga = (data.get(k) for k in ("train_batch_size", "train_micro_batch_size_per_gpu", "gradient_accumulation_steps"))
    for key, value in (("train_batch_size", tb), ("train_micro_batch_size_per_gpu", mb),
                       ("gradient_accumulation_steps", ga)):
        if isinstance(value, int) and not isinstance(value, bool) and value <= 0:
            add("ds-batch-not-positive", "error", key,
                f"{key} = {value}: DeepSpeed's batch assertion requires it to be greater than 0 "
                f"('AssertionError: ... {value} has to be greater than 0')", f"{key} >= 1, or drop it", "Gilbreth 7.4")
            return out
    if isinstance(tb, int) and isinstance(mb, int):
        gas = ga if isinstance(ga, int) else 1
        if world_size and tb != mb * gas * world_size and (isinstance(ga, int) or "gradient_accumulation_steps" not in data):
            add("ds-batch-mismatch", "error", "train_batch_size",
                f"train_batch_size {tb} != micro {mb} x accumulation {gas} x world size {world_size} (from the launch "
                "files): 'AssertionError: Check batch related parameters'",
                f"train_batch_size = {mb * gas * world_size}, or drop it and let DeepSpeed compute it", "Gilbreth 7.4")
        elif isinstance(ga, int) and tb % (mb * ga):
            add("ds-batch-mismatch", "error", "train_batch_size",
                f"train_batch_size {tb} is not a multiple of micro {mb} x accumulation {ga}: no world size fits",
                "make train_batch_size = micro x accumulation x world size", "Gilbreth 7.4")
    return out
