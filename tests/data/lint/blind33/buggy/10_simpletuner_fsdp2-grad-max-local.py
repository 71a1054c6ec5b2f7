import ast
import copy
import glob
import hashlib
import importlib.util
import inspect
import json
import logging
import math
import os
import random
import re
import shlex
import shutil
import signal
import subprocess

try:
    import psutil  # type: ignore
except Exception:
    psutil = None
import sys
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from enum import Enum
from pathlib import Path
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence
from unittest import mock as unittest_mock

import huggingface_hub
import wandb
from torch.distributed.fsdp.api import ShardedOptimStateDictConfig, ShardedStateDictConfig
from torch.distributed.fsdp.fully_sharded_data_parallel import StateDictType

from simpletuner.helpers import log_format  # noqa
from simpletuner.helpers.caching.memory import reclaim_memory
from simpletuner.helpers.caching.text_embeds import TextEmbeddingCache
from simpletuner.helpers.configuration.cli_utils import mapping_to_cli_args
from simpletuner.helpers.configuration.loader import load_config
from simpletuner.helpers.data_backend.dataset_types import DatasetType, ensure_dataset_type
from simpletuner.helpers.data_backend.factory import (
    BatchFetcher,
    configure_multi_databackend,
    run_distillation_cache_generation,
)
from simpletuner.helpers.data_backend.runtime import random_dataloader_iterator
from simpletuner.helpers.data_backend.runtime.context_parallel_sync import ContextParallelBatchSynchronizer
from simpletuner.helpers.data_backend.runtime.schedule import normalize_start_epoch, normalize_start_step
from simpletuner.helpers.distillation.registry import DistillationRegistry
from simpletuner.helpers.distillation.requirements import EMPTY_PROFILE, DistillerRequirementProfile
from simpletuner.helpers.models.registry import ModelRegistry
from simpletuner.helpers.publishing import PublishingManager
from simpletuner.helpers.publishing.huggingface import HubManager
from simpletuner.helpers.publishing.providers.s3 import S3PublishingProvider
from simpletuner.helpers.ramtorch import profiling as ramtorch_profile
from simpletuner.helpers.scheduled_sampling.rollout import apply_scheduled_sampling_rollout
from simpletuner.helpers.training import _flatten_parameters, trainable_parameter_count
from simpletuner.helpers.training.attention_backend import AttentionBackendController, AttentionPhase
from simpletuner.helpers.training.custom_schedule import PeRFlowScheduler, get_lr_scheduler
from simpletuner.helpers.training.deepspeed import prepare_model_for_deepspeed
from simpletuner.helpers.training.deepspeed_optimizers import DEFAULT_OPTIMIZER as DS_DEFAULT_OPTIMIZER
from simpletuner.helpers.training.deepspeed_optimizers import sanitize_optimizer_block
from simpletuner.helpers.training.default_settings.safety_check import safety_check
from simpletuner.helpers.training.dynamo import install_cudagraph_workarounds, mark_cudagraph_step_begin
from simpletuner.helpers.training.evaluation import ModelEvaluator
from simpletuner.helpers.training.exceptions import GPUHealthError
from simpletuner.helpers.training.gpu_circuit_breaker import get_current_gpu_index, get_gpu_circuit_breaker, is_cuda_error
from simpletuner.helpers.training.iteration_tracker import IterationTracker
from simpletuner.helpers.training.min_snr_gamma import compute_snr
from simpletuner.helpers.training.multi_process import _get_rank as get_rank
from simpletuner.helpers.training.multi_process import broadcast_object_from_main, should_log
from simpletuner.helpers.training.optimizer_param import (
    cpu_offload_optimizer,
    create_optimizer_with_param_groups,
    determine_optimizer_class_with_config,
    determine_params_to_optimize,
    is_bitsandbytes_available,
    is_lr_schedulefree,
    is_lr_scheduler_disabled,
    patch_prodigy_for_fsdp2_dtensor,
)
from simpletuner.helpers.training.optimizers.adamw_bfloat16 import AdamWBF16
from simpletuner.helpers.training.peft_init import init_lokr_network_with_perturbed_normal
from simpletuner.helpers.training.quantisation import (
    MANUAL_FP8_NATIVE_PRESETS,
    MANUAL_TRANSFORMERENGINE_PRESETS,
    PIPELINE_ONLY_PRESETS,
    PIPELINE_QUANTIZATION_PRESETS,
    mark_fp8_native_ddp_ignore_params,
    mark_torchao_ddp_ignore_params,
    mark_transformerengine_ddp_ignore_params,
)
from simpletuner.helpers.training.script_runner import run_hook_script
from simpletuner.helpers.training.state_tracker import StateTracker
from simpletuner.helpers.training.validation import Validation, prepare_validation_prompt_list
from simpletuner.helpers.training.wrappers import unwrap_model
from simpletuner.helpers.utils import ramtorch as ramtorch_utils
from simpletuner.helpers.utils.checkpoint_manager import (
    CHECKPOINT_GUARD_FILENAME,
    CHECKPOINT_MANIFEST_FILENAME,
    CheckpointManager,
)
from simpletuner.helpers.webhooks.events import (
    attach_timestamp,
    checkpoint_event,
    error_event,
    gpu_fault_event,
    lifecycle_stage_event,
    notification_event,
    training_status_event,
)
from simpletuner.simpletuner_sdk.api_state import APIState
from simpletuner.simpletuner_sdk.server.services.webhook_defaults import get_default_callback_url


def _webui_callback_exclusions() -> Optional[set[str]]:
    """Return callback URLs to exclude when sending webhooks to avoid duplicates.

    When running under the WebUI (process keeper), we exclude the WebUI's own
    callback URL since errors are surfaced via direct webhook from train.py.
    """
    if not os.environ.get("SIMPLETUNER_PARENT_PID"):
        return None
    callback_url = get_default_callback_url()
    if not callback_url:
        return None
    return {callback_url}


def _setup_logger(name: str, *, env_var: str | None = None, default_level: str = "INFO") -> logging.Logger:
    if hasattr(log_format, "ensure_custom_handlers"):
        log_format.ensure_custom_handlers()

    level_value = (
        os.environ.get(env_var, os.environ.get("SIMPLETUNER_LOG_LEVEL", default_level))
        if env_var
        else os.environ.get("SIMPLETUNER_LOG_LEVEL", default_level)
    )
    try:
        numeric_level = logging._nameToLevel.get(level_value.upper(), None)
        if numeric_level is None:
            numeric_level = int(level_value)
    except Exception:
        numeric_level = logging.INFO

    logger_instance = logging.getLogger(name)
    logger_instance.setLevel(numeric_level)
    # Don't add handlers - let the logger propagate to the root logger
    # which has the properly configured handlers from log_format.py
    logger_instance.propagate = True
    return logger_instance


logger = _setup_logger("SimpleTuner")
filelock_logger = _setup_logger("filelock", default_level="WARNING")
connection_logger = _setup_logger("urllib3.connectionpool", default_level="WARNING")
training_logger = _setup_logger("training-loop", env_var="SIMPLETUNER_TRAINING_LOOP_LOG_LEVEL")


import accelerate
import diffusers
import torch
import torch.nn.functional as F
import transformers
from accelerate import Accelerator, DeepSpeedPlugin, FullyShardedDataParallelPlugin
from accelerate.tracking import GeneralTracker
from accelerate.utils import (
    DistributedDataParallelKwargs,
    DistributedType,
    DynamoBackend,
    ParallelismConfig,
    TorchContextParallelConfig,
    TorchDynamoPlugin,
    set_seed,
)
from torch.distributions import Beta

from simpletuner.configure import model_classes, model_labels
from simpletuner.helpers.configuration.sanitization import sanitize_cli_args_for_public_logging
from simpletuner.helpers.training.context_parallel import (
    ContextParallelTopology,
    apply_standalone_context_parallel,
    build_context_parallel_topology,
    configure_cp_only_accelerator,
    normalize_context_parallel_size,
    normalize_context_parallel_strategy,
    resolve_context_parallel_world_size,
)

try:
    from lycoris import LycorisNetwork
except:
    print("[ERROR] Lycoris not available. Please install.")

try:
    from peft_singlora import update_singlora_global_step
except:
    pass
from diffusers import (
    ControlNetModel,
    DDIMScheduler,
    DDPMScheduler,
    EulerAncestralDiscreteScheduler,
    EulerDiscreteScheduler,
    UniPCMultistepScheduler,
)
from diffusers.utils import check_min_version, convert_state_dict_to_diffusers
from diffusers.utils import logging as diffusers_logging
from diffusers.utils.import_utils import is_xformers_available
from peft.utils import get_peft_model_state_dict
from tqdm.auto import tqdm

from simpletuner.helpers.models.common import ImageModelFoundation, PredictionTypes, VideoModelFoundation
from simpletuner.helpers.training.ema import EMAModel

is_optimi_available = False
try:
    from optimi import prepare_for_gradient_release

    is_optimi_available = True
except:
    pass

# Will error if the minimal version of diffusers is not installed. Remove at your own risks.
check_min_version("0.27.0.dev0")

SCHEDULER_NAME_MAP = {
    "euler": EulerDiscreteScheduler,
    "euler-a": EulerAncestralDiscreteScheduler,
    "unipc": UniPCMultistepScheduler,
    "ddim": DDIMScheduler,
    "ddpm": DDPMScheduler,
    "perflow": PeRFlowScheduler,
}
logging.basicConfig(
    format="%(asctime)s - %(levelname)s - %(name)s - %(message)s",
    datefmt="%m/%d/%Y %H:%M:%S",
    level=logging.INFO,
)
if hasattr(transformers.utils, "logging"):
    transformers.utils.logging.set_verbosity_warning()
if hasattr(diffusers_logging, "set_verbosity_warning"):
    diffusers_logging.set_verbosity_warning()

# Configure third-party loggers after imports
if hasattr(log_format, "configure_third_party_loggers"):
    log_format.configure_third_party_loggers()


class Trainer:
    # Provide safe defaults so tests that bypass __init__ via object.__new__ still have attributes resolved.
    sidecar_optimizer = None
    sidecar_lr_scheduler = None
    sidecar_lr = None
    sidecar_is_schedulefree = False
    sidecar_scheduler_disabled = False
    publishing_manager = None
    _cleanup_invoked = False

    def __init__(
        self,
        config: dict = None,
        disable_accelerator: bool = False,
        job_id: str = None,
        exit_on_error: bool = False,
    ):
        if job_id in (None, ""):
            job_id_env = os.environ.get("SIMPLETUNER_JOB_ID")
            if job_id_env:
                job_id = job_id_env

        self.accelerator = None
        self.model = None
        self.checkpoint_manager = None
        self.lycoris_wrapped_network = None
        self.lycoris_config = None
        self.lr_scheduler = None
        self.webhook_handler = None
        self.custom_tracker = None
        self.publishing_manager = None
        self.should_abort = False
        self._external_abort_checker = None
        self._manual_validation_consumer: Optional[Callable[[], bool]] = None
        self._manual_checkpoint_consumer: Optional[Callable[[], bool]] = None
        self.ema_model = None
        self.job_id = job_id
        self._cleanup_invoked = False
        self.sidecar_optimizer = None
        self.sidecar_lr_scheduler = None
        self.sidecar_lr = None
        self.sidecar_is_schedulefree = False
        self.sidecar_scheduler_disabled = False
        self._tlora_active = False
        self._tlora_config = {}
        self._attention_max_logits: Optional[Dict[str, torch.Tensor]] = None
        self._ramtorch_zero_state: Optional[dict] = None
        self._context_parallel_topology: Optional[ContextParallelTopology] = None
        self._hub_upload_executor: ThreadPoolExecutor | None = None
        self._hub_upload_futures: deque[tuple[str, Future]] = deque()
        StateTracker.set_job_id(job_id)
        try:
            self.parse_arguments(
                args=config,
                disable_accelerator=disable_accelerator,
                exit_on_error=exit_on_error,
            )
        except Exception as e:
            self._send_webhook_msg(f"Error: {e}", message_level="critical")
            raise e

        if getattr(self, "config", None) is not None:
            logger.info(
                f"Trainer.__init__: model_type={getattr(self.config, 'model_type', 'NOT_SET')!r}, lora_type={getattr(self.config, 'lora_type', 'NOT_SET')!r}"
            )

        if getattr(self, "config", None) is not None and self.config.model_family in ModelRegistry.model_families().keys():
            self.model = ModelRegistry.model_families()[self.config.model_family](self.config, self.accelerator)
            self.model.check_user_config()
            StateTracker.set_model(self.model)
            if getattr(self.config, "optimizer", None) == "muon":
                if not getattr(self.model, "SUPPORTS_MUON_CLIP", False):
                    raise ValueError(
                        f"Optimizer 'muon' is not supported by model family {self.config.model_family}. "
                        "Choose a supported optimizer or enable MuonClip explicitly on the model."
                    )
                if hasattr(self.model, "enable_muon_clip_logging"):
                    self.model.enable_muon_clip_logging()
        if self.webhook_handler and isinstance(self.model, VideoModelFoundation) and not self.webhook_handler.send_video:
            self.configure_webhook(send_startup_message=False)
        self._misc_init()
        self.validation = None
        self.distiller_requirement_profile: DistillerRequirementProfile = EMPTY_PROFILE
        # this updates self.config further, so we will run it here.
        self.init_noise_schedule()
        AttentionBackendController.register_attention_logit_consumer(self.record_attention_max_logits)

    def _config_to_obj(self, config):
        if not config:
            return None
        return type("Config", (object,), config)

    def register_manual_validation_trigger(self, consumer: Callable[[], bool]) -> None:
        """Register a callable that returns True once per manual validation request."""
        self._manual_validation_consumer = consumer

    def _consume_manual_validation_request(self) -> bool:
        if self._manual_validation_consumer is None:
            return False
        return bool(self._manual_validation_consumer())

    def register_manual_checkpoint_trigger(self, consumer: Callable[[], bool]) -> None:
        """Register a callable that returns True once per manual checkpoint request."""
        self._manual_checkpoint_consumer = consumer

    def _consume_manual_checkpoint_request(self) -> bool:
        if self._manual_checkpoint_consumer is None:
            return False
        return bool(self._manual_checkpoint_consumer())

    def _ramtorch_enabled(self) -> bool:
        return bool(getattr(self.config, "ramtorch", False))

    def _ramtorch_sync_enabled(self) -> bool:
        return self._ramtorch_enabled() and torch.cuda.is_available()

    def _ramtorch_distributed(self) -> bool:
        try:
            return self._ramtorch_enabled() and getattr(self.accelerator, "num_processes", 1) > 1
        except Exception:
            return False

    def _distributed_collectives_ready(self) -> bool:
        try:
            num_processes = int(getattr(self.accelerator, "num_processes", 1) or 1)
        except (TypeError, ValueError):
            num_processes = 1
        return num_processes > 1 and torch.distributed.is_available() and torch.distributed.is_initialized()

    def _any_rank_reached_epoch_end(self, reached_epoch_end: bool) -> bool:
        if not self._distributed_collectives_ready():
            return reached_epoch_end

        device = getattr(self.accelerator, "device", None)
        if device is None:
            device = torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")
        local_flag = torch.tensor(1 if reached_epoch_end else 0, device=device, dtype=torch.int32)
        torch.distributed.all_reduce(local_flag, op=torch.distributed.ReduceOp.MAX)
        return bool(local_flag.item())

    def _register_optimizer_attention_params(self, optimizer) -> None:
        try:
            from simpletuner.helpers.training.optimizers.muon import MuonClip
        except Exception:
            return

        if not isinstance(optimizer, MuonClip):
            return

        trained_component = None
        if hasattr(self.model, "get_trained_component"):
            trained_component = self.model.get_trained_component(unwrap_model=False)

        optimizer.register_attention_params_from_model(trained_component, name_filter=self._muon_attention_param_filter)

    @staticmethod
    def _muon_attention_param_filter(name: str) -> bool:
        lowered = name.lower()
        if "attn" not in lowered and "attention" not in lowered:
            return False
        return any(token in lowered for token in ("to_q", "to_k", "q_proj", "k_proj", "wq", "wk"))

    def record_attention_max_logits(self, attention_max_logits: Dict[str, torch.Tensor]) -> None:
        """Allow attention backends to supply per-head max logits for QK-Clip."""
        if not attention_max_logits:
            return
        if self._attention_max_logits is None:
            self._attention_max_logits = {}
        for name, logits in attention_max_logits.items():
            if logits is None:
                continue
            cached = self._attention_max_logits.get(name)
            if cached is None:
                self._attention_max_logits[name] = logits.detach().clone()
                continue
            if cached.shape != logits.shape:
                self._attention_max_logits[name] = logits.detach().clone()
                continue
            if cached.device != logits.device or cached.dtype != logits.dtype:
                logits = logits.to(device=cached.device, dtype=cached.dtype)
            self._attention_max_logits[name] = torch.maximum(cached, logits)

    def _resolve_tracker_identifiers(self) -> tuple[str, str]:
        """Return sanitized (project_name, run_name) pairs with sensible defaults."""
        project_raw = getattr(self.config, "tracker_project_name", None)
        run_raw = getattr(self.config, "tracker_run_name", None)
        project_name = ""
        run_name = ""
        if isinstance(project_raw, str):
            project_name = project_raw.strip()
        elif project_raw:
            project_name = str(project_raw)
        if isinstance(run_raw, str):
            run_name = run_raw.strip()
        elif run_raw:
            run_name = str(run_raw)

        if not project_name:
            project_name = "simpletuner-training"
        if not run_name:
            run_name = "simpletuner-training-run"

        return project_name, run_name

    def _load_custom_tracker(self, module_name: str, run_name: str, logging_dir: Optional[str]) -> GeneralTracker:
        """
        Load a GeneralTracker subclass from simpletuner/custom-trackers/<module_name>.py.
        """
        if not module_name or not str(module_name).strip():
            raise ValueError("A custom tracker module name must be provided when --report_to=custom-tracker.")

        normalized_name = str(module_name).strip()
        if not re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", normalized_name):
            raise ValueError(
                f"Invalid custom tracker module name {module_name!r}. "
                "Use a valid Python identifier without path separators."
            )

        tracker_root = Path(__file__).resolve().parents[2] / "custom-trackers"
        module_path = tracker_root / f"{normalized_name}.py"
        module_path = module_path.resolve()
        tracker_root_resolved = tracker_root.resolve()
        if not module_path.is_relative_to(tracker_root_resolved):
            raise ValueError(
                f"Custom tracker path resolves outside the allowed directory. "
                f"Expected under {tracker_root_resolved}, got {module_path}"
            )
        if not module_path.is_file():
            raise FileNotFoundError(
                f"Custom tracker module not found at {module_path}. "
                "Place your tracker under simpletuner/custom-trackers/<name>.py."
            )

        spec = importlib.util.spec_from_file_location(f"simpletuner.custom_trackers.{normalized_name}", module_path)
        if spec is None or spec.loader is None:
            raise ImportError(f"Could not load custom tracker spec from {module_path}.")

        module = importlib.util.module_from_spec(spec)
        sys.modules[spec.name] = module
        spec.loader.exec_module(module)

        tracker_classes = [
            obj
            for obj in module.__dict__.values()
            if inspect.isclass(obj)
            and issubclass(obj, GeneralTracker)
            and obj is not GeneralTracker
            and obj.__module__ == module.__name__
        ]

        if not tracker_classes:
            raise ValueError(
                f"No GeneralTracker subclass found in {module_path}. "
                "Ensure the module defines exactly one tracker class derived from accelerate.tracking.GeneralTracker."
            )
        if len(tracker_classes) > 1:
            raise ValueError(
                f"Multiple GeneralTracker subclasses found in {module_path}. "
                "Expose only one tracker class per module so it can be loaded unambiguously."
            )

        tracker_cls = tracker_classes[0]
        init_signature = inspect.signature(tracker_cls.__init__)
        accepts_kwargs = any(param.kind == inspect.Parameter.VAR_KEYWORD for param in init_signature.parameters.values())
        accepts_logging_dir = "logging_dir" in init_signature.parameters or accepts_kwargs
        needs_logging_dir = bool(getattr(tracker_cls, "requires_logging_directory", False))

        if needs_logging_dir and not logging_dir:
            raise ValueError(
                f"Custom tracker '{normalized_name}' requires a logging directory but none was provided."
                " Set --logging_dir to a writable path."
            )
        if needs_logging_dir and not accepts_logging_dir:
            raise TypeError(
                f"Custom tracker '{normalized_name}' declares requires_logging_directory=True but its __init__"
                " does not accept a logging_dir argument."
            )

        tracker_kwargs: Dict[str, object] = {}
        if logging_dir and accepts_logging_dir:
            tracker_kwargs["logging_dir"] = logging_dir

        try:
            tracker_instance = tracker_cls(run_name, **tracker_kwargs)
        except TypeError as exc:
            expected = "(run_name)" if not tracker_kwargs else "(run_name, logging_dir)"
            raise TypeError(
                f"Failed to instantiate custom tracker '{normalized_name}'. "
                f"Ensure its __init__ signature matches {expected}."
            ) from exc

        if not isinstance(tracker_instance, GeneralTracker):
            raise TypeError(
                f"Loaded tracker from {module_path} is not a GeneralTracker instance (got {type(tracker_instance)})."
            )

        return tracker_instance

    def _update_grad_metrics(
        self,
        target_logs: Dict[str, float],
        *,
        require_value_method: bool = False,
        clone_norm_value: bool = False,
        is_regularisation_data: bool = False,
    ):
        if self.grad_norm is None:
            return

        prefix = "regularisation_" if is_regularisation_data else ""
        if self.config.grad_clip_method == "norm":
            grad_value = self.grad_norm
            if clone_norm_value:
                grad_value = float(self.grad_norm.clone().detach())
            target_logs[f"{prefix}grad_norm"] = grad_value
        elif (
            not require_value_method or self.config.grad_clip_method == "value"
        ) and not self.config.use_deepspeed_optimizer:
            target_logs[f"{prefix}grad_absmax"] = self.grad_norm

    def _config_uses_bitsandbytes(self) -> bool:
        if not getattr(self, "config", None):
            return False

        def _contains_bnb(value: object) -> bool:
            if isinstance(value, str):
                return "bnb" in value.lower()
            if isinstance(value, dict):
                return any(_contains_bnb(item) for item in value.values())
            if isinstance(value, (list, tuple, set)):
                return any(_contains_bnb(item) for item in value)
            return False

        for attr_value in vars(self.config).values():
            try:
                if _contains_bnb(attr_value):
                    return True
            except Exception:
                continue
        return False

    def _init_publishing_manager(self):
        publishing_config = getattr(self.config, "publishing_config", None)
        if publishing_config in (None, "", [], {}, "None"):
            return

        is_main_process = True
        if getattr(self, "accelerator", None) is not None:
            is_main_process = getattr(self.accelerator, "is_main_process", True)
        if not is_main_process:
            logger.debug("Skipping publishing manager initialisation on non-main process.")
            return

        try:
            self.publishing_manager = PublishingManager(publishing_config)
            logger.info("Publishing manager initialised with %s provider(s).", len(self.publishing_manager.providers))
        except Exception as exc:
            logger.error("Failed to initialise publishing providers: %s", exc)
            self.publishing_manager = None

    def _enable_dynamo_dynamic_output_capture(self) -> None:
        try:
            import torch._dynamo as torch_dynamo
        except Exception as exc:
            logger.warning("Unable to configure Torch Dynamo dynamic output capture: %s", exc)
            return

        config_obj = getattr(torch_dynamo, "config", None)
        if config_obj is None:
            logger.debug("Torch Dynamo config unavailable; skipping dynamic output capture configuration.")
            return
        if not hasattr(config_obj, "capture_dynamic_output_shape_ops"):
            logger.debug(
                "Torch Dynamo config lacks capture_dynamic_output_shape_ops; skipping dynamic output capture configuration."
            )
            return
        if not getattr(config_obj, "capture_dynamic_output_shape_ops", False):
            config_obj.capture_dynamic_output_shape_ops = True
            logger.info("Torch Dynamo capture_dynamic_output_shape_ops enabled for dynamic output shape support.")

        if hasattr(config_obj, "force_parameter_static_shapes") and getattr(
            config_obj, "force_parameter_static_shapes", True
        ):
            config_obj.force_parameter_static_shapes = False
            logger.info("Torch Dynamo force_parameter_static_shapes disabled for dynamic parameter shape support.")

    def _disable_dynamo_lru_cache_for_checkpointing(self) -> None:
        eval_frame = getattr(getattr(torch._C, "_dynamo", None), "eval_frame", None)
        set_lru_cache = getattr(eval_frame, "_set_lru_cache", None)
        if set_lru_cache is None:
            logger.debug("Torch Dynamo eval_frame._set_lru_cache unavailable; skipping LRU cache configuration.")
            return

        set_lru_cache(False)
        logger.info("Torch Dynamo LRU cache disabled for compiled gradient checkpointing.")

    def _configure_inductor_dynamic_training_passes(self, dynamo_backend: str) -> None:
        if dynamo_backend != "inductor":
            return

        disabled_passes = [
            candidate.strip()
            for candidate in os.environ.get("TORCHINDUCTOR_DISABLED_PASSES", "").split(",")
            if candidate.strip()
        ]
        if not any(candidate.upper() == "PASS_PATTERN_1" for candidate in disabled_passes):
            disabled_passes.append("PASS_PATTERN_1")
            os.environ["TORCHINDUCTOR_DISABLED_PASSES"] = ",".join(disabled_passes)

        try:
            import torch._inductor.config as inductor_config
        except Exception as exc:
            logger.warning("Unable to configure TorchInductor pass disables: %s", exc)
            return

        if getattr(inductor_config, "disabled_passes", "") != os.environ["TORCHINDUCTOR_DISABLED_PASSES"]:
            inductor_config.disabled_passes = os.environ["TORCHINDUCTOR_DISABLED_PASSES"]
        logger.info(
            "TorchInductor disabled passes for compiled training: %s",
            os.environ["TORCHINDUCTOR_DISABLED_PASSES"],
        )

    def parse_arguments(self, args=None, disable_accelerator: bool = False, exit_on_error: bool = False):
        skip_config_fallback = False
        args_payload = args
        self.config = None

        if isinstance(args, dict):
            args_payload = dict(args)
        elif hasattr(args, "__dict__"):
            args_payload = dict(vars(args))

        if isinstance(args_payload, dict):
            skip_config_fallback = bool(args_payload.pop("__skip_config_fallback__", False))
            # Strip any internal metadata entries that shouldn't be forwarded to the CLI parser.
            metadata_keys = [key for key in list(args_payload.keys()) if isinstance(key, str) and key.startswith("__")]
            for key in metadata_keys:
                args_payload.pop(key, None)

        self.configure_webhook(raw_config=args_payload if isinstance(args_payload, dict) else args)
        try:
            self.config = load_config(args_payload, exit_on_error=True)
        except Exception as exc:
            logger.error("Failed to parse training configuration from provided arguments.", exc_info=exc)
            if not skip_config_fallback:
                logger.info("Attempting to load persisted configuration as fallback after parse failure.")
                try:
                    self.config = load_config(None, exit_on_error=True)
                except Exception:
                    # Preserve the original parser failure as the primary error.
                    raise exc
            if self.config is None:
                # Preserve the original parser failure as the primary error.
                raise exc

        if self.config is None and args_payload and not skip_config_fallback:
            # Fallback to the user's persisted defaults when ad-hoc CLI args are incomplete.
            # This mirrors historical behaviour where we would silently load the active
            # environment when parsing failed, while still surfacing an explicit failure if
            # no configuration can be resolved at all.
            self.config = load_config(None, exit_on_error=True)

        if self.config is None:
            config_source = "provided arguments" if args_payload else "file-based configuration"
            raise ValueError(
                f"Training configuration could not be parsed from {config_source}. "
                "Check that your configuration file exists and is valid, or that command-line arguments are correctly formatted."
            )

        accelerate_config_path = getattr(self.config, "accelerate_config", None)
        if accelerate_config_path not in (None, "", "None"):
            os.environ["ACCELERATE_CONFIG_PATH"] = os.path.expanduser(str(accelerate_config_path))

        accelerate_extra_args = getattr(self.config, "accelerate_extra_args", None)
        if accelerate_extra_args not in (None, ""):
            os.environ["ACCELERATE_EXTRA_ARGS"] = str(accelerate_extra_args)

        num_processes_value = getattr(self.config, "num_processes", None)
        if num_processes_value not in (None, ""):
            os.environ["TRAINING_NUM_PROCESSES"] = str(num_processes_value)

        num_machines_value = getattr(self.config, "num_machines", None)
        if num_machines_value not in (None, ""):
            os.environ["TRAINING_NUM_MACHINES"] = str(num_machines_value)

        def _resolve_dynamo_backend(candidate: object) -> DynamoBackend | None:
            if isinstance(candidate, DynamoBackend):
                return candidate
            if candidate is None:
                return None
            raw_was_string_like = isinstance(candidate, (str, bytes))
            if isinstance(candidate, bytes):
                try:
                    text = candidate.decode("utf-8", "strict").strip()
                except UnicodeDecodeError:
                    logger.debug(
                        "Unable to decode Torch Dynamo backend bytes value %r; defaulting to no dynamo.",
                        candidate,
                    )
                    return None
            else:
                text = str(candidate).strip()
            if not text:
                return None
            normalised = text.replace("-", "_").upper()
            if normalised in {"DISABLED", "NONE"}:
                normalised = "NO"
            try:
                return DynamoBackend[normalised]
            except KeyError as exc:
                if raw_was_string_like:
                    raise ValueError(f"Unsupported Torch Dynamo backend '{candidate}'.") from exc
                logger.debug(
                    "Ignoring non-string Torch Dynamo backend value %r (%s); defaulting to no dynamo.",
                    candidate,
                    type(candidate).__name__,
                )
                return None

        def _coerce_flag(value: object) -> bool:
            if isinstance(value, bool):
                return value
            if isinstance(value, (int, float)):
                return value != 0
            if isinstance(value, str):
                return value.strip().lower() in {"1", "true", "yes", "on"}
            return False

        dynamo_backend_value = getattr(self.config, "dynamo_backend", None)
        try:
            resolved_dynamo_backend = _resolve_dynamo_backend(dynamo_backend_value)
        except ValueError:
            raise

        dynamo_backend_env = "no"
        if resolved_dynamo_backend and resolved_dynamo_backend != DynamoBackend.NO:
            dynamo_backend_env = resolved_dynamo_backend.value.lower()
        elif isinstance(dynamo_backend_value, str) and dynamo_backend_value.strip():
            dynamo_backend_env = dynamo_backend_value.strip().lower()
        os.environ["TRAINING_DYNAMO_BACKEND"] = dynamo_backend_env
        self._configure_inductor_dynamic_training_passes(dynamo_backend_env)
        install_cudagraph_workarounds(self.config)

        report_to_value = getattr(self.config, "report_to", None)
        if isinstance(report_to_value, unittest_mock.Mock):
            report_to_value = None
        if report_to_value is None or (isinstance(report_to_value, str) and not report_to_value.strip()):
            report_to_value = "none"
            setattr(self.config, "report_to", report_to_value)

        custom_tracker_name = getattr(self.config, "custom_tracker", None)
        if isinstance(custom_tracker_name, unittest_mock.Mock):
            custom_tracker_name = None
        if isinstance(custom_tracker_name, str):
            custom_tracker_name = custom_tracker_name.strip()
        elif custom_tracker_name is not None:
            custom_tracker_name = str(custom_tracker_name).strip()
        if custom_tracker_name == "":
            custom_tracker_name = None
        setattr(self.config, "custom_tracker", custom_tracker_name)

        _, tracker_run_name = self._resolve_tracker_identifiers()
        logging_dir_value = getattr(self.config, "logging_dir", None)

        custom_tracker_instance: Optional[GeneralTracker] = None

        def _ensure_custom_tracker() -> GeneralTracker:
            nonlocal custom_tracker_instance
            if custom_tracker_instance is not None:
                return custom_tracker_instance
            if custom_tracker_name is None:
                raise ValueError("--custom_tracker must be provided when --report_to=custom-tracker.")
            custom_tracker_instance = self._load_custom_tracker(custom_tracker_name, tracker_run_name, logging_dir_value)
            self.custom_tracker = custom_tracker_instance
            return custom_tracker_instance

        checkpoint_step_interval_value = getattr(self.config, "checkpoint_step_interval", None)
        if checkpoint_step_interval_value in (None, "", "None", 0):
            legacy_checkpoint_steps = getattr(self.config, "checkpointing_steps", None)
            if legacy_checkpoint_steps not in (None, "", "None", 0):
                setattr(self.config, "checkpoint_step_interval", legacy_checkpoint_steps)
                checkpoint_step_interval_value = legacy_checkpoint_steps
        else:
            legacy_checkpoint_steps = getattr(self.config, "checkpointing_steps", None)
            if legacy_checkpoint_steps in (None, "", "None", 0):
                setattr(self.config, "checkpointing_steps", checkpoint_step_interval_value)

        checkpoint_epoch_interval_value = getattr(self.config, "checkpoint_epoch_interval", None)
        if checkpoint_epoch_interval_value in ("", "None", 0):
            setattr(self.config, "checkpoint_epoch_interval", None)

        if isinstance(report_to_value, str):
            normalized_report = report_to_value.strip().lower()
            if normalized_report == "none":
                report_to = None
            elif normalized_report == "custom-tracker":
                report_to = _ensure_custom_tracker()
            else:
                report_to = report_to_value.strip()
        elif isinstance(report_to_value, (list, tuple)):
            resolved_trackers: List[object] = []
            for entry in report_to_value:
                if isinstance(entry, str) and entry.strip().lower() == "custom-tracker":
                    resolved_trackers.append(_ensure_custom_tracker())
                else:
                    resolved_trackers.append(entry)
            report_to = resolved_trackers
        else:
            report_to = report_to_value

        if custom_tracker_name is not None:
            custom_tracker_requested = False
            if isinstance(report_to_value, str):
                custom_tracker_requested = report_to_value.strip().lower() == "custom-tracker"
            elif isinstance(report_to_value, (list, tuple)):
                custom_tracker_requested = any(
                    isinstance(entry, str) and entry.strip().lower() == "custom-tracker" for entry in report_to_value
                )
            if not custom_tracker_requested:
                raise ValueError(
                    "--custom_tracker was provided but --report_to is not set to 'custom-tracker'. "
                    "Set --report_to=custom-tracker to enable your custom tracker."
                )
        if not disable_accelerator:
            accelerator_custom_config = [self.config.process_group_kwargs]
            if self.config.mixed_precision == "fp8":
                # we'll set up a TorchAO config for Accelerator, since otherwise it uses MS-AMP which
                # is clunky and proprietary third party accelerator that is typically unavailable.
                from accelerate.utils import AORecipeKwargs

                accelerator_custom_config.append(AORecipeKwargs())

            should_override_bf16 = self._should_force_bf16_override()
            if should_override_bf16:
                logging.getLogger("SimpleTuner").info("Applying Accelerate bf16 capability override for this platform.")
                self._enable_bf16_override()

            will_create_dynamo_plugin = resolved_dynamo_backend and resolved_dynamo_backend != DynamoBackend.NO

            accelerator_kwargs = dict(
                gradient_accumulation_steps=self.config.gradient_accumulation_steps,
                mixed_precision=self.config.mixed_precision,
                log_with=report_to,
                project_config=self.config.accelerator_project_config,
                kwargs_handlers=accelerator_custom_config,
            )

            find_unused_parameters = self._resolve_ddp_find_unused_parameters()
            if find_unused_parameters is not None:
                accelerator_custom_config.append(
                    DistributedDataParallelKwargs(find_unused_parameters=find_unused_parameters)
                )

            if not will_create_dynamo_plugin and dynamo_backend_env != "no":
                accelerator_kwargs["dynamo_backend"] = dynamo_backend_env

            fsdp_plugin = None
            if getattr(self.config, "fsdp_enable", False):
                fsdp_plugin = self._load_fsdp_plugin()
            deepspeed_plugin = None
            if fsdp_plugin is None and hasattr(self.config, "deepspeed_config"):
                deepspeed_plugin = self._load_deepspeed_plugin()
            if fsdp_plugin is not None and deepspeed_plugin is not None:
                raise ValueError("Cannot enable both FSDP and DeepSpeed in the same run.")
            if fsdp_plugin is not None:
                fsdp_plugin = self._prepare_fsdp_plugin_for_accelerator(fsdp_plugin)
                accelerator_kwargs["fsdp_plugin"] = fsdp_plugin
            if deepspeed_plugin is not None:
                accelerator_kwargs["deepspeed_plugin"] = deepspeed_plugin

            dynamo_plugin = None
            if will_create_dynamo_plugin:
                if (is_bitsandbytes_available and self._config_uses_bitsandbytes()) or _coerce_flag(
                    getattr(self.config, "dynamo_dynamic", None)
                ):
                    self._enable_dynamo_dynamic_output_capture()
                if _coerce_flag(getattr(self.config, "gradient_checkpointing", None)):
                    self._disable_dynamo_lru_cache_for_checkpointing()

                plugin_kwargs: Dict[str, object] = {"backend": resolved_dynamo_backend}

                mode_value = getattr(self.config, "dynamo_mode", None)
                if isinstance(mode_value, str):
                    mode_text = mode_value.strip().lower()
                    if mode_text and mode_text not in {"auto", "default"}:
                        plugin_kwargs["mode"] = mode_text
                    elif mode_text == "default":
                        plugin_kwargs["mode"] = "default"
                elif mode_value:
                    plugin_kwargs["mode"] = str(mode_value)

                if _coerce_flag(getattr(self.config, "dynamo_fullgraph", None)):
                    plugin_kwargs["fullgraph"] = True
                if _coerce_flag(getattr(self.config, "dynamo_dynamic", None)):
                    plugin_kwargs["dynamic"] = True
                if _coerce_flag(getattr(self.config, "dynamo_use_regional_compilation", None)):
                    plugin_kwargs["use_regional_compilation"] = True

                dynamo_plugin = TorchDynamoPlugin(**plugin_kwargs)
                accelerator_kwargs["dynamo_plugin"] = dynamo_plugin

                flag_details = []
                if "mode" in plugin_kwargs:
                    flag_details.append(f"mode={plugin_kwargs['mode']}")
                if plugin_kwargs.get("fullgraph"):
                    flag_details.append("fullgraph")
                if plugin_kwargs.get("dynamic"):
                    flag_details.append("dynamic")
                if plugin_kwargs.get("use_regional_compilation"):
                    flag_details.append("regional")
                extras = f" ({', '.join(flag_details)})" if flag_details else ""
                logger.info("Torch Dynamo enabled (backend=%s)%s.", resolved_dynamo_backend.value.lower(), extras)

            context_parallel_size = normalize_context_parallel_size(getattr(self.config, "context_parallel_size", None))
            if context_parallel_size is not None:
                setattr(self.config, "context_parallel_size", context_parallel_size)
            context_parallel_strategy = normalize_context_parallel_strategy(
                getattr(self.config, "context_parallel_comm_strategy", None)
            )
            setattr(self.config, "context_parallel_comm_strategy", context_parallel_strategy)

            enable_context_parallel = context_parallel_size is not None and context_parallel_size > 1
            self._context_parallel_topology = None
            if enable_context_parallel:
                world_size = resolve_context_parallel_world_size(self.config)
                self._context_parallel_topology = build_context_parallel_topology(
                    self.config,
                    world_size=world_size,
                    cp_size=context_parallel_size,
                    strategy=context_parallel_strategy,
                )
                if self._context_parallel_topology.dp_shard_size > 1:
                    if fsdp_plugin is None:
                        raise ValueError("Context parallelism with FSDP sharding requires FSDP2.")
                    accelerator_kwargs["parallelism_config"] = ParallelismConfig(
                        dp_shard_size=self._context_parallel_topology.dp_shard_size,
                        cp_size=self._context_parallel_topology.cp_size,
                        cp_backend="torch",
                        cp_handler=TorchContextParallelConfig(cp_comm_strategy=context_parallel_strategy),
                    )
                    logger.info(
                        "FSDP2 context parallelism enabled (size=%s, rotation=%s, dp_shard_size=%s).",
                        self._context_parallel_topology.cp_size,
                        context_parallel_strategy,
                        self._context_parallel_topology.dp_shard_size,
                    )

            def _report_active_dynamo_plugin() -> None:
                if will_create_dynamo_plugin and should_log():
                    active_plugin = getattr(getattr(self.accelerator, "state", None), "dynamo_plugin", None)
                    if active_plugin is None:
                        logger.warning("Torch Dynamo was requested, but no TorchDynamoPlugin is active on Accelerator.")
                    else:
                        message = f"Torch Dynamo active on Accelerator: {active_plugin}"
                        print(message)
                        logger.info(message)

            try:
                self.accelerator = Accelerator(**accelerator_kwargs)
                _report_active_dynamo_plugin()
            except ValueError as err:
                if "dynamo_plugin and dynamo_backend" in str(err):
                    has_backend = "dynamo_backend" in accelerator_kwargs
                    has_plugin = "dynamo_plugin" in accelerator_kwargs
                    backend_val = accelerator_kwargs.get("dynamo_backend", "not set")
                    plugin_val = "set" if has_plugin else "not set"
                    raise ValueError(
                        f"Conflicting Torch Dynamo configuration detected. "
                        f"Cannot pass both dynamo_plugin and dynamo_backend to Accelerator. "
                        f"Current state: dynamo_backend={backend_val} (present={has_backend}), "
                        f"dynamo_plugin={plugin_val} (present={has_plugin}). "
                        f"Original error: {err}"
                    ) from err
                elif not should_override_bf16 and self._should_force_bf16_override(err):
                    logging.getLogger("SimpleTuner").warning(
                        "Retrying Accelerator initialisation with bf16 capability override."
                    )
                    self._enable_bf16_override()
                    self.accelerator = Accelerator(**accelerator_kwargs)
                    _report_active_dynamo_plugin()
                else:
                    raise
            if (
                self._context_parallel_topology is not None
                and self._context_parallel_topology.cp_size > 1
                and self._context_parallel_topology.dp_shard_size == 1
            ):
                configure_cp_only_accelerator(self.accelerator, self._context_parallel_topology)
            if self.accelerator:
                os.environ["RANK"] = str(self.accelerator.process_index)
                os.environ["WORLD_SIZE"] = str(self.accelerator.num_processes)
            self._setup_accelerator_barrier_guard()
            # Clean up any handlers that Accelerate or DeepSpeed may have added
            if hasattr(log_format, "ensure_custom_handlers"):
                log_format.ensure_custom_handlers()
        fsdp_active = False
        if self.accelerator and hasattr(self.accelerator, "state"):
            fsdp_active = getattr(self.accelerator.state, "fsdp_plugin", None) is not None
        setattr(self.config, "use_fsdp", fsdp_active)
        safety_check(args=self.config, accelerator=self.accelerator)

        if self.config.lr_scale:
            lr_cur = self.config.learning_rate
            lr_scale_bsz = self.config.train_batch_size
            lr_scale_ga = self.config.gradient_accumulation_steps
            lr_scale_np = getattr(self.accelerator, "num_processes", 1)
            lr_scale_mul = lr_scale_ga * lr_scale_bsz * lr_scale_np
            lr_new = lr_cur * (math.sqrt(lr_scale_mul) if self.config.lr_scale_sqrt else lr_scale_mul)
            logger.info(
                f"Scaling learning rate from {lr_cur:.1e} to {lr_new:.1e}"
                f" due to {'--lr-scale and --lr-scale-sqrt' if self.config.lr_scale_sqrt else '--lr-scale'}"
                f" (bsz: {lr_scale_bsz}, ga: {lr_scale_ga}, nprocs: {lr_scale_np})"
            )
            self.config.learning_rate = lr_new

        StateTracker.set_accelerator(self.accelerator)
        StateTracker.set_args(self.config)
        StateTracker.set_weight_dtype(self.config.weight_dtype)
        self.set_model_family()

    def _should_force_bf16_override(self, error: Exception | None = None) -> bool:
        if self.config.mixed_precision != "bf16":
            return False

        if torch.backends.mps.is_available():
            return True

        if error is None:
            return False

        return "bf16 mixed precision requires" in str(error).lower()

    def _resolve_ddp_find_unused_parameters(self) -> bool | None:
        find_unused_cfg = getattr(self.config, "find_unused_parameters", None)
        if find_unused_cfg is not None:
            return bool(find_unused_cfg)

        model_family = getattr(self.config, "model_family", None)
        model_family_cls = ModelRegistry.get(model_family) if model_family else None
        if model_family_cls is None:
            return None

        if bool(getattr(model_family_cls, "DDP_FIND_UNUSED_PARAMETERS", False)):
            return True

        return None

    @staticmethod
    def _enable_bf16_override() -> None:
        def _always_true(*_args, **_kwargs):
            return True

        try:
            import accelerate.accelerator as accelerate_accelerator
            import accelerate.utils as accelerate_utils

            accelerate_utils.is_bf16_available = _always_true
            accelerate_accelerator.is_bf16_available = _always_true
        except ImportError:
            logger.warning("Failed to patch Accelerate bf16 guard; proceeding without override.")

    def _setup_accelerator_barrier_guard(self) -> None:
        if not self.accelerator:
            return

        if getattr(self.accelerator, "_simpletuner_safe_wait_installed", False):
            return

        original_wait_for_everyone = self.accelerator.wait_for_everyone

        def _safe_wait_for_everyone(*fn_args, **fn_kwargs):
            state = getattr(self.accelerator, "state", None)
            distributed_type = getattr(state, "distributed_type", None)
            if distributed_type in (
                DistributedType.MULTI_GPU,
                DistributedType.MULTI_MLU,
                DistributedType.MULTI_SDAA,
                DistributedType.MULTI_MUSA,
                DistributedType.MULTI_NPU,
                DistributedType.MULTI_XPU,
                DistributedType.MULTI_CPU,
                DistributedType.MULTI_HPU,
                DistributedType.DEEPSPEED,
                DistributedType.FSDP,
            ):
                if not (torch.distributed.is_available() and torch.distributed.is_initialized()):
                    logger.debug("Skipping accelerator.wait_for_everyone(); distributed process group not initialised.")
                    return
            return original_wait_for_everyone(*fn_args, **fn_kwargs)

        self.accelerator.wait_for_everyone = _safe_wait_for_everyone
        setattr(self.accelerator, "_simpletuner_safe_wait_installed", True)

    def _load_fsdp_plugin(self):
        if not getattr(self.config, "fsdp_enable", False):
            return None

        deepspeed_config = getattr(self.config, "deepspeed_config", None)
        if deepspeed_config not in (None, "", "None", False):
            raise ValueError("FSDP and DeepSpeed cannot be enabled simultaneously.")

        fsdp_version = getattr(self.config, "fsdp_version", 2) or 2
        reshard_after_forward = getattr(self.config, "fsdp_reshard_after_forward", True)
        cpu_ram_efficient_loading = getattr(self.config, "fsdp_cpu_ram_efficient_loading", False)
        limit_all_gathers = getattr(self.config, "fsdp_limit_all_gathers", True)
        cpu_offload = getattr(self.config, "fsdp_cpu_offload", False)
        activation_checkpointing = getattr(self.config, "fsdp_activation_checkpointing", False)
        state_dict_type = getattr(self.config, "fsdp_state_dict_type", None)
        auto_wrap_policy = getattr(self.config, "fsdp_auto_wrap_policy", None)
        transformer_cls = getattr(self.config, "fsdp_transformer_layer_cls_to_wrap", None)
        if isinstance(transformer_cls, str) and transformer_cls.strip() == "":
            transformer_cls = None

        if activation_checkpointing and getattr(self.config, "gradient_checkpointing", False):
            logger.info(
                "FSDP activation checkpointing enabled; disabling model-level gradient checkpointing to avoid conflicts."
            )
            setattr(self.config, "gradient_checkpointing", False)

        plugin_kwargs = {
            "fsdp_version": fsdp_version,
            "reshard_after_forward": reshard_after_forward,
            "cpu_ram_efficient_loading": cpu_ram_efficient_loading,
            "limit_all_gathers": bool(limit_all_gathers),
        }

        if cpu_offload is not None:
            plugin_kwargs["cpu_offload"] = cpu_offload
        if activation_checkpointing:
            plugin_kwargs["activation_checkpointing"] = True

        resolved_state_dict_display = None
        if state_dict_type:
            state_dict_mapping = {
                "SHARDED_STATE_DICT": "sharded_state_dict",
                "FULL_STATE_DICT": "full_state_dict",
            }
            resolved_state_dict = state_dict_mapping.get(state_dict_type.upper(), state_dict_type)
            resolved_state_dict_display = resolved_state_dict
            plugin_kwargs["state_dict_type"] = resolved_state_dict

        if auto_wrap_policy:
            plugin_kwargs["auto_wrap_policy"] = auto_wrap_policy

        parsed_transformer_cls = None
        if transformer_cls:
            if isinstance(transformer_cls, str):
                parsed_transformer_cls = [name.strip() for name in transformer_cls.split(",") if name.strip()]
            elif isinstance(transformer_cls, (list, tuple, set)):
                parsed_transformer_cls = [str(name).strip() for name in transformer_cls if str(name).strip()]
            else:
                parsed_transformer_cls = [str(transformer_cls).strip()]
            if parsed_transformer_cls:
                plugin_kwargs["transformer_cls_names_to_wrap"] = parsed_transformer_cls

        logger.info(
            "FSDP v%s configuration detected (%s); enabling FullyShardedDataParallelPlugin%s.",
            fsdp_version,
            ", ".join(f"{k}={v}" for k, v in plugin_kwargs.items()),
            f" (reshard_after_forward={reshard_after_forward})" if fsdp_version >= 2 else "",
        )
        plugin = FullyShardedDataParallelPlugin(**plugin_kwargs)

        def _normalize_candidate_names(raw_names: Any) -> Optional[List[str]]:
            if not raw_names:
                return None
            if isinstance(raw_names, str):
                raw_names = [raw_names]
            try:
                iterator = list(raw_names)
            except TypeError:
                iterator = [str(raw_names)]
            normalized: List[str] = []
            for name in iterator:
                candidate = str(name).strip()
                if candidate and candidate not in normalized:
                    normalized.append(candidate)
            return normalized or None

        original_plugin_names = _normalize_candidate_names(getattr(plugin, "transformer_cls_names_to_wrap", None))
        plugin_names = original_plugin_names
        plugin_names_origin = "config" if parsed_transformer_cls else None

        model_instance = getattr(self, "model", None)
        model_family = getattr(self.config, "model_family", None)
        model_family_cls = ModelRegistry.get(model_family) if model_family else None

        component = None
        candidate_names: Optional[List[str]] = None
        candidate_source = None

        if model_instance is not None:
            component = model_instance.get_trained_component(unwrap_model=False)
            candidate_names = _normalize_candidate_names(getattr(component, "_no_split_modules", None))
            if candidate_names:
                candidate_source = "instance"
            else:
                candidate_names = _normalize_candidate_names(getattr(model_instance, "_no_split_modules", None))
                if candidate_names:
                    candidate_source = "instance"

        if candidate_names is None and model_family_cls is not None:
            class_level_candidates = _normalize_candidate_names(getattr(model_family_cls, "_no_split_modules", None))
            if not class_level_candidates:
                transformer_cls = getattr(model_family_cls, "MODEL_CLASS", None)
                if transformer_cls is not None:
                    class_level_candidates = _normalize_candidate_names(getattr(transformer_cls, "_no_split_modules", None))
                    if class_level_candidates is None:
                        try:
                            transformer_instance = transformer_cls()  # type: ignore[call-arg]
                        except Exception:
                            transformer_instance = None
                        else:
                            class_level_candidates = _normalize_candidate_names(
                                getattr(transformer_instance, "_no_split_modules", None)
                            )
                        finally:
                            transformer_instance = None
            if class_level_candidates:
                candidate_names = class_level_candidates
                candidate_source = "class"

        def _collect_excluded_candidates() -> List[str]:
            excluded: List[str] = []
            sources = [
                component,
                model_instance,
                model_family_cls,
                getattr(model_family_cls, "MODEL_CLASS", None) if model_family_cls else None,
            ]
            for source in sources:
                if source is None:
                    continue
                source_exclusions = _normalize_candidate_names(getattr(source, "_fsdp_exclude_auto_wrap_modules", None))
                if not source_exclusions:
                    continue
                for name in source_exclusions:
                    if name not in excluded:
                        excluded.append(name)
            return excluded

        excluded_candidates = _collect_excluded_candidates()

        if excluded_candidates and getattr(plugin, "cpu_ram_efficient_loading", False):
            logger.warning(
                "Disabling FSDP cpu_ram_efficient_loading because some modules must remain unsharded: %s",
                ", ".join(excluded_candidates),
            )
            plugin.cpu_ram_efficient_loading = False
            setattr(self.config, "fsdp_cpu_ram_efficient_loading", False)

        def _apply_exclusions(names: Optional[List[str]], origin: str) -> Optional[List[str]]:
            if not names or not excluded_candidates:
                return names
            filtered = [name for name in names if name not in excluded_candidates]
            removed = [name for name in names if name in excluded_candidates]
            if removed:
                logger.info(
                    "Removing FSDP auto-wrap candidates excluded by %s: %s",
                    origin,
                    ", ".join(removed),
                )
            return filtered or None

        candidate_names = _apply_exclusions(candidate_names, "model configuration")
        plugin_names = _apply_exclusions(plugin_names, "model configuration")
        plugin.transformer_cls_names_to_wrap = plugin_names
        if plugin_names:
            setattr(self.config, "fsdp_transformer_layer_cls_to_wrap", ",".join(plugin_names))
        else:
            setattr(self.config, "fsdp_transformer_layer_cls_to_wrap", None)

        base_component_name = "<uninitialized>"
        if component is not None:
            base_component_name = component.__class__.__name__
        elif model_family_cls is not None:
            transformer_cls = getattr(model_family_cls, "MODEL_CLASS", None)
            if transformer_cls is not None:
                base_component_name = transformer_cls.__name__

        logger.info("FSDP base component: %s", base_component_name)

        if getattr(plugin, "auto_wrap_policy", None) is not None:
            if candidate_names:
                source_label = f"model family '{model_family}'" if candidate_source == "class" and model_family else "model"
                logger.info(
                    "FSDP auto-wrap candidates from %s: %s",
                    source_label,
                    ", ".join(candidate_names),
                )
            else:
                logger.info("FSDP auto-wrap candidates from model: <none>")

            if not candidate_names and component is not None:
                # As a fallback, scan module types to surface potential block classes.
                # The default limit of 8 is chosen to avoid excessive auto-detection in very large models.
                # You can override this limit by setting 'fsdp_max_auto_detect_candidates' in self.config.
                max_auto_candidates = getattr(self.config, "fsdp_max_auto_detect_candidates", 8)
                auto_candidates: List[str] = []
                for module in component.children():
                    cls_name = module.__class__.__name__
                    if cls_name not in auto_candidates and sum(p.numel() for p in module.parameters(recurse=False)) > 0:
                        auto_candidates.append(cls_name)
                        if len(auto_candidates) >= max_auto_candidates:
                            break
                if auto_candidates:
                    logger.info(
                        "FSDP auto-detected candidate classes: %s",
                        ", ".join(auto_candidates),
                    )
                    candidate_names = _apply_exclusions(auto_candidates, "auto-detected modules")
                    candidate_source = "auto"
                    setattr(component, "_no_split_modules", tuple(auto_candidates))

            if candidate_names and plugin_names:
                missing_from_plugin = [name for name in candidate_names if name and name not in plugin_names]
                if missing_from_plugin:
                    logger.info(
                        "Extending FSDP transformer classes to wrap with model hints: %s",
                        ", ".join(missing_from_plugin),
                    )
                    plugin_names = plugin_names + missing_from_plugin
                    plugin.transformer_cls_names_to_wrap = plugin_names
                    setattr(self.config, "fsdp_transformer_layer_cls_to_wrap", ",".join(plugin_names))

            if component is not None and plugin_names:
                try:
                    from accelerate.utils.dataclasses import get_module_class_from_name
                except ImportError:
                    get_module_class_from_name = None  # type: ignore
                if get_module_class_from_name and plugin_names_origin == "config":
                    valid_names: List[str] = []
                    invalid_names: List[str] = []
                    for name in plugin_names:
                        if get_module_class_from_name(component, name) is None:
                            invalid_names.append(name)
                        else:
                            valid_names.append(name)
                    if invalid_names:
                        logger.warning(
                            "Removing unknown FSDP transformer classes that are not present in the current model: %s",
                            ", ".join(invalid_names),
                        )
                        plugin_names = valid_names or None
                        plugin.transformer_cls_names_to_wrap = plugin_names
                        if plugin_names:
                            setattr(self.config, "fsdp_transformer_layer_cls_to_wrap", ",".join(plugin_names))
                        else:
                            setattr(self.config, "fsdp_transformer_layer_cls_to_wrap", None)

        if getattr(plugin, "transformer_cls_names_to_wrap", None) is None and candidate_names:
            names_list = [name for name in candidate_names if name]
            if names_list:
                logger.info(
                    "Using model-provided _no_split_modules for FSDP wrapping: %s",
                    ", ".join(names_list),
                )
                plugin.transformer_cls_names_to_wrap = names_list
                plugin_names = names_list
                plugin_names_origin = "model"
                current_cls_setting = getattr(self.config, "fsdp_transformer_layer_cls_to_wrap", None)
                if current_cls_setting is None:
                    setattr(self.config, "fsdp_transformer_layer_cls_to_wrap", ",".join(names_list))

        logger.info(
            "Resolved FSDP transformer classes to wrap: %s",
            (
                ", ".join(plugin.transformer_cls_names_to_wrap or [])
                if getattr(plugin, "transformer_cls_names_to_wrap", None)
                else "<none>"
            ),
        )

        if getattr(plugin, "cpu_ram_efficient_loading", False) and not getattr(
            plugin, "transformer_cls_names_to_wrap", None
        ):
            logger.warning(
                "Disabling FSDP cpu_ram_efficient_loading because no transformer blocks were wrapped. "
                "CPU RAM efficient loading requires per-layer sharding."
            )
            plugin.cpu_ram_efficient_loading = False
            setattr(self.config, "fsdp_cpu_ram_efficient_loading", False)
        if resolved_state_dict_display:
            setattr(plugin, "_state_dict_type_enum", plugin.state_dict_type)
            setattr(plugin, "state_dict_type_display", resolved_state_dict_display)
            plugin.state_dict_type = resolved_state_dict_display

        if auto_wrap_policy and callable(getattr(plugin, "auto_wrap_policy", None)):
            setattr(plugin, "_auto_wrap_policy_callable", plugin.auto_wrap_policy)
            setattr(plugin, "auto_wrap_policy_display", auto_wrap_policy)
            plugin.auto_wrap_policy = auto_wrap_policy

        return plugin

    @staticmethod
    def _prepare_fsdp_plugin_for_accelerator(fsdp_plugin: FullyShardedDataParallelPlugin) -> FullyShardedDataParallelPlugin:
        if hasattr(fsdp_plugin, "_state_dict_type_enum"):
            fsdp_plugin.state_dict_type = getattr(fsdp_plugin, "_state_dict_type_enum")
        elif isinstance(getattr(fsdp_plugin, "state_dict_type", None), str):
            fsdp_plugin.set_state_dict_type(fsdp_plugin.state_dict_type)

        if hasattr(fsdp_plugin, "_auto_wrap_policy_callable"):
            fsdp_plugin.auto_wrap_policy = getattr(fsdp_plugin, "_auto_wrap_policy_callable")

        state_dict_type = getattr(fsdp_plugin, "state_dict_type", None)
        if state_dict_type in (StateDictType.SHARDED_STATE_DICT, "sharded_state_dict"):
            fsdp_plugin.state_dict_config = ShardedStateDictConfig(
                offload_to_cpu=True,
                _use_dtensor=False,
            )
            fsdp_plugin.optim_state_dict_config = ShardedOptimStateDictConfig(
                offload_to_cpu=True,
                _use_dtensor=False,
            )

        return fsdp_plugin

    def _finalize_deepspeed_config_auto_values(self, model) -> None:
        if not self.accelerator or model is None:
            return

        if getattr(self.accelerator.state, "distributed_type", None) != DistributedType.DEEPSPEED:
            return

        deepspeed_plugin = getattr(self.accelerator.state, "deepspeed_plugin", None)
        if not deepspeed_plugin:
            return

        hidden_size_keys = (
            "zero_optimization.reduce_bucket_size",
            "zero_optimization.stage3_prefetch_bucket_size",
            "zero_optimization.stage3_param_persistence_threshold",
        )
        pending_auto_keys = [key for key in hidden_size_keys if deepspeed_plugin.is_auto(key)]
        if not pending_auto_keys:
            return

        inferred_hidden_size = self._infer_model_hidden_size(model)
        if not inferred_hidden_size or inferred_hidden_size <= 0:
            keys_text = ", ".join(pending_auto_keys)
            raise ValueError(
                "Unable to infer a representative hidden size from the training model's configuration. "
                "Please populate the DeepSpeed config with explicit numeric values for "
                f"{keys_text} or ensure the model config exposes a hidden-size attribute."
            )

        zero_config = deepspeed_plugin.deepspeed_config.setdefault("zero_optimization", {})
        if deepspeed_plugin.is_auto("zero_optimization.reduce_bucket_size"):
            zero_config["reduce_bucket_size"] = int(inferred_hidden_size * inferred_hidden_size)
        if deepspeed_plugin.is_auto("zero_optimization.stage3_prefetch_bucket_size"):
            zero_config["stage3_prefetch_bucket_size"] = int(0.9 * inferred_hidden_size * inferred_hidden_size)
        if deepspeed_plugin.is_auto("zero_optimization.stage3_param_persistence_threshold"):
            zero_config["stage3_param_persistence_threshold"] = int(10 * inferred_hidden_size)

    @staticmethod
    def _normalize_numeric_candidate(value):
        if isinstance(value, (int, float)):
            return int(value)
        if isinstance(value, (list, tuple, set)):
            numeric_values = [int(v) for v in value if isinstance(v, (int, float))]
            return max(numeric_values) if numeric_values else None
        if isinstance(value, dict):
            numeric_values = [int(v) for v in value.values() if isinstance(v, (int, float))]
            return max(numeric_values) if numeric_values else None
        return None

    def _infer_model_hidden_size(self, model) -> Optional[int]:
        if model is None:
            return None

        config = getattr(model, "config", None)
        if config is not None:
            candidate_attributes = (
                "hidden_size",
                "hidden_sizes",
                "encoder_hidden_sizes",
                "d_model",
                "model_dim",
                "embed_dim",
                "embedding_dim",
                "cross_attention_dim",
                "encoder_embed_dim",
                "inner_dim",
                "projection_dim",
                "block_out_channels",
                "channels",
            )
            for attr in candidate_attributes:
                if hasattr(config, attr):
                    candidate = self._normalize_numeric_candidate(getattr(config, attr))
                    if candidate and candidate > 0:
                        return candidate

            # Some configs expose dimensions via dict-style access
            if hasattr(config, "to_dict"):
                config_dict = config.to_dict()
            elif hasattr(config, "__dict__"):
                config_dict = config.__dict__
            else:
                config_dict = {}
            if isinstance(config_dict, dict):
                for attr in candidate_attributes:
                    if attr in config_dict:
                        candidate = self._normalize_numeric_candidate(config_dict[attr])
                        if candidate and candidate > 0:
                            return candidate

        direct_attributes = (
            "hidden_size",
            "d_model",
            "model_dim",
            "embed_dim",
            "inner_dim",
        )
        for attr in direct_attributes:
            if hasattr(model, attr):
                candidate = self._normalize_numeric_candidate(getattr(model, attr))
                if candidate and candidate > 0:
                    return candidate

        try:
            first_param = next(model.parameters())
            if first_param is not None and hasattr(first_param, "shape"):
                dims = [int(dim) for dim in first_param.shape if isinstance(dim, int) and dim > 1]
                if dims:
                    return max(dims)
        except (StopIteration, TypeError, AttributeError):
            pass

        return None

    def _load_deepspeed_plugin(self):
        raw_config = getattr(self.config, "deepspeed_config", None)
        if raw_config in (None, "", "None", False):
            return None

        try:
            normalized = self._normalize_deepspeed_config(raw_config)
        except ValueError as error:
            logger.error(str(error))
            raise

        if normalized is None:
            return None

        normalized, fallback_optimizer = sanitize_optimizer_block(normalized)
        if fallback_optimizer:
            logger.warning(
                "Unsupported DeepSpeed optimizer '%s'; replacing with '%s'.",
                fallback_optimizer,
                DS_DEFAULT_OPTIMIZER,
            )
        self._apply_deepspeed_overrides(normalized)
        self.config.deepspeed_config = normalized

        plugin_kwargs = {
            "hf_ds_config": normalized,
            "gradient_accumulation_steps": getattr(self.config, "gradient_accumulation_steps", 1),
        }

        zero_stage = self._extract_zero_stage(normalized)
        if zero_stage is not None:
            plugin_kwargs["zero_stage"] = zero_stage

        offload_param_path = getattr(self.config, "offload_param_path", None)
        if offload_param_path:
            expanded_offload_path = os.path.abspath(os.path.expanduser(str(offload_param_path)))
            self._cleanup_deepspeed_offload_artifacts(expanded_offload_path, zero_stage)
            zero_config = normalized.get("zero_optimization")
            if isinstance(zero_config, dict):
                if self._uses_nvme(zero_config.get("offload_param")):
                    plugin_kwargs.setdefault("offload_param_nvme_path", expanded_offload_path)
                if self._uses_nvme(zero_config.get("offload_optimizer")):
                    plugin_kwargs.setdefault("offload_optimizer_nvme_path", expanded_offload_path)

        logger.info(
            "DeepSpeed configuration detected; enabling DeepSpeedPlugin%s.",
            f" (ZeRO stage {zero_stage})" if zero_stage is not None else "",
        )
        return DeepSpeedPlugin(**plugin_kwargs)

    @staticmethod
    def _uses_nvme(section):
        if not isinstance(section, dict):
            return False
        device = section.get("device")
        if isinstance(device, str):
            return device.lower() == "nvme"
        return False

    def _apply_deepspeed_overrides(self, config_dict: dict) -> None:
        if not isinstance(config_dict, dict):
            return

        if "deepspeed_config_file" in config_dict:
            # User is delegating configuration to an external DeepSpeed JSON file.
            # Respect their settings and avoid mutating the inline dictionary.
            return

        train_batch_size = getattr(self.config, "train_batch_size", None)
        if train_batch_size is not None and "train_micro_batch_size_per_gpu" not in config_dict:
            config_dict["train_micro_batch_size_per_gpu"] = train_batch_size

        grad_accum = getattr(self.config, "gradient_accumulation_steps", None)
        if grad_accum is not None and "gradient_accumulation_steps" not in config_dict:
            config_dict["gradient_accumulation_steps"] = grad_accum

        offload_param_path = getattr(self.config, "offload_param_path", None)
        if not offload_param_path:
            return

        zero_config = config_dict.get("zero_optimization")
        if not isinstance(zero_config, dict):
            return

        expanded_path = os.path.expanduser(str(offload_param_path))
        for key in ("offload_param", "offload_optimizer"):
            section = zero_config.get(key)
            if isinstance(section, dict) and self._uses_nvme(section):
                section.setdefault("nvme_path", expanded_path)

    def _cleanup_deepspeed_offload_artifacts(self, offload_root: str, zero_stage: Optional[int]) -> None:
        """Remove stale DeepSpeed offload swap directories to avoid corrupted resume state."""

        if not offload_root:
            return
        try:
            resolved_root = os.path.abspath(offload_root)
        except Exception:
            logger.debug("Unable to resolve DeepSpeed offload path %s", offload_root, exc_info=True)
            return

        try:
            if not os.path.isdir(resolved_root):
                return

            candidates: List[str] = []
            if zero_stage is not None:
                candidates.append(os.path.join(resolved_root, f"zero_stage_{zero_stage}"))
            else:
                for entry in os.listdir(resolved_root):
                    if entry.startswith("zero_stage_"):
                        candidates.append(os.path.join(resolved_root, entry))

            for candidate in candidates:
                if not os.path.isdir(candidate):
                    continue
                try:
                    if os.path.commonpath([resolved_root, candidate]) != resolved_root:
                        logger.debug("Skipping DeepSpeed offload cleanup outside root: %s", candidate)
                        continue
                except Exception:
                    logger.debug("Failed to validate DeepSpeed offload path %s", candidate, exc_info=True)
                    continue
                try:
                    shutil.rmtree(candidate, ignore_errors=True)
                    logger.info("Cleared DeepSpeed offload artefacts at %s", candidate)
                except Exception:
                    logger.debug("Failed to clear DeepSpeed offload directory %s", candidate, exc_info=True)
        except Exception:
            logger.debug("Unexpected error while cleaning DeepSpeed offload path %s", resolved_root, exc_info=True)

    @staticmethod
    def _extract_zero_stage(config_dict: dict) -> Optional[int]:
        if not isinstance(config_dict, dict):
            return None

        candidates = []
        if "zero_stage" in config_dict:
            candidates.append(config_dict.get("zero_stage"))

        zero_config = config_dict.get("zero_optimization")
        if isinstance(zero_config, dict):
            candidates.append(zero_config.get("stage"))

        for candidate in candidates:
            if candidate is None:
                continue
            try:
                return int(candidate)
            except (TypeError, ValueError):
                continue

        return None

    @staticmethod
    def _normalize_deepspeed_config(raw_config):
        if raw_config in (None, "", "None", False):
            return None

        if isinstance(raw_config, (dict, list)):
            return raw_config

        if isinstance(raw_config, Path):
            raw_config = str(raw_config)

        if isinstance(raw_config, str):
            candidate = raw_config.strip()
            if not candidate:
                return None

            if candidate.startswith("{") or candidate.startswith("["):
                try:
                    return json.loads(candidate)
                except json.JSONDecodeError as json_error:
                    try:
                        return ast.literal_eval(candidate)
                    except (ValueError, SyntaxError) as ast_error:
                        raise ValueError(f"Could not parse --deepspeed_config JSON payload: {ast_error}") from ast_error

            expanded_path = os.path.expanduser(candidate)
            if os.path.isfile(expanded_path):
                try:
                    with open(expanded_path, "r", encoding="utf-8") as handle:
                        return json.load(handle)
                except json.JSONDecodeError as file_error:
                    raise ValueError(f"DeepSpeed config at {expanded_path} is invalid JSON: {file_error}") from file_error

            raise ValueError(f"DeepSpeed config value '{raw_config}' is neither valid JSON nor an existing file.")

        raise ValueError(f"Unsupported type for --deepspeed_config: {type(raw_config)}")

    def run(self):
        try:
            self._exit_on_signal()
            # Initialize essential configurations and schedules
            self.init_noise_schedule()
            self._exit_on_signal()
            self.init_seed()
            self._exit_on_signal()
            self.init_huggingface_hub()
            self._exit_on_signal()
            self.init_preprocessing_models()
            self._exit_on_signal()
            self.init_precision(preprocessing_models_only=True)

            # Core initialization steps with signal checks after each step
            self._initialize_components_with_signal_check(
                [
                    self.init_data_backend,
                    self.init_validation_prompts,
                    self.init_unload_text_encoder,
                    self.init_unload_vae,
                    self.init_load_base_model,
                    self.init_delete_model_caches,
                    self.init_precision,
                    self.init_controlnet_model,
                    self.init_tread_model,
                    self.init_gligen_layers,
                    self.init_freeze_models,
                    self.init_trainable_peft_adapter,
                    self.init_lyrics_embedder_training,
                ]
            )

            # Model movement and validation setup
            self.move_models(destination="accelerator")
            self._exit_on_signal()
            self.init_distillation()
            self._exit_on_signal()
            self.init_validations()
            self._exit_on_signal()
            AttentionBackendController.apply(self.config, AttentionPhase.EVAL)
            self.init_benchmark_base_model()
            AttentionBackendController.apply(self.config, AttentionPhase.TRAIN)
            self._exit_on_signal()
            self.resume_and_prepare()
            self._exit_on_signal()
            self.init_trackers()

            # Start the training process
            self.train()

        except Exception as e:
            import traceback

            logger.error(f"Failed to run training: {e}, traceback: {traceback.format_exc()}")

            # Ensure webhook handler is configured before sending error message
            if not self.webhook_handler:
                logger.warning("Webhook handler not initialized, attempting to configure it now")
                try:
                    self.configure_webhook(send_startup_message=False)
                except Exception as webhook_err:
                    logger.error(f"Failed to configure webhook handler: {webhook_err}")

            self._send_webhook_msg(
                message=f"Failed to run training: {e}",
            )
            event = error_event(
                message=f"Failed to run training: {e}",
                title="Fatal Error",
                job_id=self.job_id,
                data={"status": "error"},
            )
            self._emit_event(event, message_level="critical")

            status_event = training_status_event(
                status="failed",
                message=f"Training failed: {e}",
                job_id=self.job_id,
                severity="error",
            )
            self._emit_event(status_event, message_level="critical")

            raise e
        finally:
            self._finish_hub_uploads()
            try:
                self.cleanup()
            except Exception as cleanup_error:
                logger.error("Trainer cleanup failed: %s", cleanup_error, exc_info=True)

    def _initialize_components_with_signal_check(self, initializers):
        """
        Runs a list of initializer functions with signal checks after each.

        Args:
            initializers (list): A list of initializer functions to run sequentially.
        """
        for initializer in initializers:
            initializer()
            self._exit_on_signal()

    def _get_noise_schedule(self):
        self.config, scheduler = self.model.setup_training_noise_schedule()

        return scheduler

    def init_noise_schedule(self):
        if self.model is None:
            return
        from simpletuner.helpers.models.common import PredictionTypes

        if not self.model.uses_noise_schedule():
            self.config.flow_matching = False
            self.noise_scheduler = None
            return
        self.config.flow_matching = True if self.model.PREDICTION_TYPE is PredictionTypes.FLOW_MATCHING else False
        self.noise_scheduler = self._get_noise_schedule()
        self.lr = 0.0

    def configure_webhook(self, send_startup_message: bool = True, raw_config: str = None):
        if raw_config is not None:
            # Handle both dict and argparse.Namespace
            if hasattr(raw_config, "get"):
                webhook_config = raw_config.get("webhook_config", raw_config.get("--webhook_config", None))
            else:
                # argparse.Namespace - use getattr
                webhook_config = getattr(raw_config, "webhook_config", getattr(raw_config, "__webhook_config", None))
            logging.debug(f"Creating webhook: {webhook_config}")
        else:
            webhook_config = getattr(getattr(self, "config", None), "webhook_config", None)
        if webhook_config is None:
            return

        # Only reset webhook_handler if we have a valid config to replace it with
        self.webhook_handler = None

        # Handle string webhook_config (file path or JSON string)
        if isinstance(webhook_config, str):
            import json
            import os

            if webhook_config.startswith("{") or webhook_config.startswith("["):
                # Parse as JSON string
                try:
                    parsed_config = json.loads(webhook_config)
                    # Normalize single dict to list for consistency
                    if isinstance(parsed_config, dict):
                        webhook_config = [parsed_config]
                    elif isinstance(parsed_config, list):
                        webhook_config = parsed_config
                    else:
                        logging.error(f"webhook_config must be dict or list, got {type(parsed_config)}")
                        raise ValueError(f"Invalid webhook_config type: {type(parsed_config)}")
                    logging.info("Parsed webhook config from JSON string")
                except json.JSONDecodeError as e:
                    logging.error(f"Could not load webhook_config (invalid JSON): {e}")
                    raise
            else:
                # Try to load from file
                if os.path.isfile(webhook_config):
                    try:
                        with open(webhook_config, "r") as f:
                            loaded_config = json.load(f)
                            # Normalize single dict to list for consistency
                            if isinstance(loaded_config, dict):
                                webhook_config = [loaded_config]
                            elif isinstance(loaded_config, list):
                                webhook_config = loaded_config
                            else:
                                logging.error(f"webhook_config must be dict or list, got {type(loaded_config)}")
                                raise ValueError(f"Invalid webhook_config type: {type(loaded_config)}")
                        logging.info(f"Loaded webhook config from file: {webhook_config}")
                    except Exception as e:
                        logging.error(f"Could not load webhook_config from file: {e}")
                        raise
                else:
                    logging.error(f"Could not find webhook_config file: {webhook_config}")
                    raise ValueError(f"webhook_config file not found: {webhook_config}")
        elif isinstance(webhook_config, dict):
            # Normalize single dict to list for consistency
            webhook_config = [webhook_config]
        # list is already in the correct format

        from simpletuner.helpers.webhooks.handler import WebhookHandler

        send_video_flag = self._infer_send_video_flag(raw_config)
        video_framerate = self._infer_video_framerate(raw_config)
        if send_video_flag and video_framerate is None:
            candidate = getattr(self, "config", None)
            if candidate is not None:
                fallback = getattr(candidate, "framerate", None)
                if fallback not in (None, "", "None"):
                    try:
                        video_framerate = int(float(fallback))
                    except (ValueError, TypeError):
                        video_framerate = None
        if send_video_flag and video_framerate is None:
            video_framerate = 30

        self.webhook_handler = WebhookHandler(
            self.accelerator,
            (
                f"{getattr(self.config, 'tracker_project_name', 'unknown')} {getattr(self.config, 'tracker_run_name', 'unknown')}"
                if hasattr(self, "config")
                else "unknown"
            ),
            send_video=send_video_flag,
            video_framerate=video_framerate,
            webhook_config=webhook_config,
        )
        StateTracker.set_webhook_handler(self.webhook_handler)
        # Initialize GPU circuit breaker for hardware fault detection
        self.gpu_circuit_breaker = get_gpu_circuit_breaker(
            webhook_handler=self.webhook_handler,
            job_id=self.job_id,
        )
        if send_startup_message:
            self._send_webhook_msg(
                message="SimpleTuner has launched. Hold onto your butts!",
                store_response=True,
            )
        event = notification_event(
            message="Training job has started, configuration has begun.",
            job_id=self.job_id,
        )
        self._emit_event(event)

    def _extract_config_value(self, source, *keys):
        if source is None:
            return None
        if hasattr(source, "get"):
            for key in keys:
                if key in source and source[key] not in (None, "", "None"):
                    return source[key]
        for key in keys:
            if hasattr(source, key):
                value = getattr(source, key)
                if value not in (None, "", "None"):
                    return value
            if hasattr(source, "__dict__"):
                raw_dict = getattr(source, "__dict__", {})
                if key in raw_dict and raw_dict[key] not in (None, "", "None"):
                    return raw_dict[key]
        return None

    def _infer_send_video_flag(self, raw_config):
        if isinstance(self.model, VideoModelFoundation):
            return True
        candidate_family = None
        if getattr(self, "config", None) is not None:
            candidate_family = getattr(self.config, "model_family", None)
        if not candidate_family and raw_config is not None:
            candidate_family = self._extract_config_value(raw_config, "model_family", "--model_family")
        if candidate_family:
            candidate_family = str(candidate_family).strip()
            model_cls = ModelRegistry.model_families().get(candidate_family)
            if model_cls:
                # Handle LazyModelClass by resolving to real class
                if not inspect.isclass(model_cls) and hasattr(model_cls, "get_real_class"):
                    model_cls = model_cls.get_real_class()
                if inspect.isclass(model_cls) and issubclass(model_cls, VideoModelFoundation):
                    return True
        return False

    def _infer_video_framerate(self, raw_config):
        framerate = None
        if getattr(self, "config", None) is not None:
            framerate = getattr(self.config, "framerate", None)
        if framerate in (None, "", "None") and raw_config is not None:
            framerate = self._extract_config_value(raw_config, "framerate", "--framerate")
        if framerate in (None, "", "None"):
            return None
        try:
            return int(float(framerate))
        except (ValueError, TypeError):
            return None

    def _push_to_hub_background_enabled(self) -> bool:
        return (
            bool(getattr(self.config, "push_to_hub_background", False))
            and bool(getattr(self.config, "push_to_hub", False))
            and (not self.accelerator or self.accelerator.is_main_process)
        )

    def _get_hub_executor(self) -> ThreadPoolExecutor | None:
        if not self._push_to_hub_background_enabled():
            return None
        if self._hub_upload_executor is None:
            self._hub_upload_executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="hf_push_")
        return self._hub_upload_executor

    def _run_post_checkpoint_script(self, *, local_path: str | None = None) -> None:
        script_template = getattr(self.config, "post_checkpoint_script", None)
        if script_template in (None, "", "None"):
            return
        if hasattr(self, "accelerator") and hasattr(self.accelerator, "is_main_process"):
            if not self.accelerator.is_main_process:
                return
        current_step = None
        if isinstance(getattr(self, "state", None), dict):
            current_step = self.state.get("global_step")
        run_hook_script(
            script_template,
            config=self.config,
            local_path=local_path,
            remote_path=None,
            global_step=current_step,
        )

    def _run_post_upload_script(self, *, local_path: str | None = None, remote_path: str | None = None) -> None:
        script_template = getattr(self.config, "post_upload_script", None)
        if script_template in (None, "", "None"):
            return
        current_step = None
        if isinstance(getattr(self, "state", None), dict):
            current_step = self.state.get("global_step")
        run_hook_script(
            script_template,
            config=self.config,
            local_path=local_path,
            remote_path=remote_path,
            global_step=current_step,
        )

    def _drain_hub_upload_futures(self, wait: bool = False) -> None:
        if not self._hub_upload_futures:
            return
        remaining: deque[tuple[str, Future]] = deque()
        while self._hub_upload_futures:
            description, future = self._hub_upload_futures.popleft()
            if wait or future.done():
                try:
                    future.result()
                except Exception as exc:
                    logger.error("Hugging Face upload task '%s' failed: %s", description, exc, exc_info=True)
                    if self.webhook_handler:
                        self.webhook_handler.send(
                            message=f"Hugging Face upload failed for {description}: {exc}",
                            message_level="error",
                        )
            else:
                remaining.append((description, future))
        self._hub_upload_futures = remaining

    def _schedule_hub_upload(self, description: str, upload_fn: Callable[[], object]) -> None:
        executor = self._get_hub_executor()

        def _wrapped_upload():
            result = upload_fn()
            remote_path = None
            local_path = None
            if isinstance(result, tuple):
                if len(result) >= 1:
                    remote_path = result[0]
                if len(result) >= 2:
                    local_path = result[1]
                # If third value looks like a repo URL and remote path is missing, use it
                if remote_path in (None, "") and len(result) >= 3:
                    remote_path = result[2]
            self._run_post_upload_script(local_path=local_path, remote_path=remote_path)
            return result

        if executor is None:
            _wrapped_upload()
            return
        self._drain_hub_upload_futures(wait=False)
        future = executor.submit(_wrapped_upload)
        self._hub_upload_futures.append((description, future))
        logger.info("Scheduled background Hugging Face upload: %s", description)

    def _finish_hub_uploads(self) -> None:
        self._drain_hub_upload_futures(wait=True)
        if self._hub_upload_executor is not None:
            self._hub_upload_executor.shutdown(wait=True)
            self._hub_upload_executor = None

    def _misc_init(self):
        """things that do not really need an order."""
        torch.set_num_threads(self.config.torch_num_threads)
        self.state = {}
        self.state["lr"] = 0.0
        # Initialize CheckpointManager with output directory
        self.checkpoint_manager = None
        if hasattr(self, "config") and getattr(self.config, "output_dir", None):
            self.checkpoint_manager = CheckpointManager(self.config.output_dir)
        # Global step represents the most recently *completed* optimization step, which means it
        #  takes into account the number of gradient_accumulation_steps. If we use 1 gradient_accumulation_step,
        #  then global_step and step will be the same throughout training. However, if we use
        #  2 gradient_accumulation_steps, then global_step will be twice as large as step, and so on.
        self.state["global_step"] = 0
        self.state["global_resume_step"] = 0
        self.state["first_epoch"] = 1
        self.state["args"] = self.config.__dict__
        self.timesteps_buffer = []
        self.twinflow_traj_buffer = []
        self._timesteps_scatter_table = None
        self._timesteps_scatter_logged = False
        self._twinflow_traj_table = None
        self._twinflow_traj_logged = False
        self.guidance_values_list = []
        self.train_loss = 0.0
        self.train_diffusion_loss = 0.0
        self.bf = None
        self.grad_norm = None
        self.extra_lr_scheduler_kwargs = {}
        self.iteration_tracker = IterationTracker()
        StateTracker.set_global_step(self.state["global_step"])
        self._init_publishing_manager()
        self.config.use_deepspeed_optimizer, self.config.use_deepspeed_scheduler = prepare_model_for_deepspeed(
            self.accelerator, self.config
        )
        self.config.base_weight_dtype = self.config.weight_dtype
        base_model_precision = getattr(self.config, "base_model_precision", "no_change") or "no_change"
        quantization_config_present = getattr(self.config, "quantization_config", None) not in (None, "", "None")
        quantize_via_pipeline = getattr(self.config, "quantize_via", "accelerator") == "pipeline"
        base_paths = [
            getattr(self.config, "pretrained_model_name_or_path", None),
            getattr(self.config, "pretrained_unet_model_name_or_path", None),
            getattr(self.config, "pretrained_transformer_model_name_or_path", None),
        ]

        def _is_gguf_path(candidate: object) -> bool:
            return isinstance(candidate, str) and candidate.endswith(".gguf")

        gguf_requested = any(_is_gguf_path(path) for path in base_paths if path)
        pipeline_only_precision = base_model_precision in PIPELINE_ONLY_PRESETS
        pipeline_capable_precision = base_model_precision in PIPELINE_QUANTIZATION_PRESETS
        base_pipeline_precision = pipeline_only_precision or (quantize_via_pipeline and pipeline_capable_precision)
        self.config.is_quanto = False
        self.config.is_torchao = False
        self.config.is_fp8_native = False
        self.config.is_transformerengine = False
        self.config.is_sdnq = False
        self.config.is_bnb = False
        self.config.pipeline_quantization = bool(
            quantize_via_pipeline or quantization_config_present or base_pipeline_precision or gguf_requested
        )
        self.config.pipeline_quantization_base = bool(base_pipeline_precision or gguf_requested)
        if "bnb" in base_model_precision:
            self.config.is_bnb = True
        if not base_pipeline_precision:
            if "quanto" in base_model_precision:
                self.config.is_quanto = True
            elif base_model_precision in MANUAL_FP8_NATIVE_PRESETS:
                self.config.is_fp8_native = True
            elif base_model_precision in MANUAL_TRANSFORMERENGINE_PRESETS:
                self.config.is_transformerengine = True
            elif "torchao" in base_model_precision:
                self.config.is_torchao = True
            elif "sdnq" in base_model_precision:
                self.config.is_sdnq = True
        # if text_encoder_1_precision -> text_encoder_4_precision has quanto we'll mark that as well
        for i in range(1, 5):
            if isinstance(getattr(self.config, f"text_encoder_{i}_precision", None), str) and getattr(
                self.config, f"text_encoder_{i}_precision", None
            ):
                if "quanto" in getattr(self.config, f"text_encoder_{i}_precision"):
                    if self.config.is_torchao:
                        raise ValueError(
                            "Cannot enable Quanto and TorchAO together. One quant engine must be used for all precision levels."
                        )
                    self.config.is_quanto = True
                elif "torchao" in getattr(self.config, f"text_encoder_{i}_precision"):
                    if self.config.is_quanto:
                        raise ValueError(
                            "Cannot enable Quanto and TorchAO together. One quant engine must be used for all precision levels."
                        )
                    self.config.is_torchao = True
                elif getattr(self.config, f"text_encoder_{i}_precision") in MANUAL_FP8_NATIVE_PRESETS:
                    self.config.is_fp8_native = True
                elif getattr(self.config, f"text_encoder_{i}_precision") in MANUAL_TRANSFORMERENGINE_PRESETS:
                    self.config.is_transformerengine = True
                elif "sdnq" in getattr(self.config, f"text_encoder_{i}_precision"):
                    self.config.is_sdnq = True
                elif "bnb" in getattr(self.config, f"text_encoder_{i}_precision"):
                    self.config.is_bnb = True
        if (
            self.config.is_quanto
            or self.config.is_torchao
            or self.config.is_fp8_native
            or self.config.is_transformerengine
            or self.config.is_sdnq
        ):
            from simpletuner.helpers.training.quantisation import quantise_model

            self.quantise_model = quantise_model

    def set_model_family(self, model_family: str = None):
        model_family = getattr(self.config, "model_family", model_family)
        if model_family not in model_classes["full"]:
            raise ValueError(f"Invalid model family specified: {model_family}")

        model_implementation = ModelRegistry.model_families().get(model_family)
        StateTracker.set_model_family(model_family)
        label = getattr(model_implementation, "NAME", None)
        if not label:
            label = model_labels.get(model_family, model_family.replace("_", " ").title())
        self.config.model_type_label = label
        if StateTracker.is_sdxl_refiner():
            self.config.model_type_label = "SDXL Refiner"

    def init_clear_backend_cache(self):
        if self.config.output_dir is not None:
            os.makedirs(self.config.output_dir, exist_ok=True)
        if self.config.preserve_data_backend_cache:
            return
        if not self.accelerator.is_local_main_process:
            return
        StateTracker.delete_cache_files(preserve_data_backend_cache=self.config.preserve_data_backend_cache)

    def init_seed(self):
        if self.config.seed is not None and self.config.seed != 0:
            set_seed(self.config.seed, self.config.seed_for_each_device)

    def init_huggingface_hub(self, access_token: str = None):
        # Handle the repository creation
        self.hub_manager = None
        if not self.accelerator.is_main_process:
            return
        if access_token is None:
            access_token = getattr(self, "hf_access_token", None)
        if access_token:
            huggingface_hub.login(token=access_token)
        self.hub_manager = HubManager(config=self.config, model=self.model)
        if self.config.push_to_hub:
            try:
                StateTracker.set_hf_user(huggingface_hub.whoami())
                logger.info(f"Logged into Hugging Face Hub as '{StateTracker.get_hf_username()}'")
            except Exception as e:
                logger.error(f"Failed to log into Hugging Face Hub: {e}")
                raise e

    def init_preprocessing_models(self, move_to_accelerator: bool = True):
        # Suppress verbose transformers/diffusers logging before loading models
        if hasattr(log_format, "configure_third_party_loggers"):
            log_format.configure_third_party_loggers()

        # image embeddings
        self.init_vae(move_to_accelerator=move_to_accelerator)
        # text embeds
        self.init_text_encoder(move_to_accelerator=move_to_accelerator)

    def init_vae(self, move_to_accelerator: bool = True):
        if getattr(self.model, "AUTOENCODER_CLASS", None) is None:
            logger.debug(f"Model {self.model.NAME} does not have a VAE.")
            return
        logger.info(f"Load VAE: {self.config.pretrained_vae_model_name_or_path}")
        self.model.load_vae(move_to_device=move_to_accelerator)
        StateTracker.set_vae_dtype(self.model.vae.dtype)
        StateTracker.set_vae(self.model.vae)

    @contextmanager
    def _disable_fsdp_cpu_ram_efficient_loading_for_text_encoder(self):
        accelerator = getattr(self, "accelerator", None)
        state = getattr(accelerator, "state", None)
        distributed_type = getattr(state, "distributed_type", getattr(accelerator, "distributed_type", None))
        fsdp_plugin = getattr(state, "fsdp_plugin", None)
        if distributed_type != DistributedType.FSDP or not getattr(fsdp_plugin, "cpu_ram_efficient_loading", False):
            yield
            return

        env_name = "FSDP_CPU_RAM_EFFICIENT_LOADING"
        previous_value = os.environ.get(env_name)
        os.environ[env_name] = "False"
        try:
            yield
        finally:
            if previous_value is None:
                os.environ.pop(env_name, None)
            else:
                os.environ[env_name] = previous_value

    def init_text_encoder(self, move_to_accelerator: bool = True):
        with self._disable_fsdp_cpu_ram_efficient_loading_for_text_encoder():
            self.model.load_text_encoder(move_to_device=move_to_accelerator)

    def init_freeze_models(self):
        self.model.freeze_components()
        self.accelerator.wait_for_everyone()
        self._report_cuda_usage_if_requested("after_freeze_components")

    def init_load_base_model(self):
        # Suppress verbose transformers/diffusers logging before loading models
        if hasattr(log_format, "configure_third_party_loggers"):
            log_format.configure_third_party_loggers()

        webhook_msg = f"Loading model: `{self.config.pretrained_model_name_or_path}`..."
        # Send to Discord but don't emit event (lifecycle event below will handle that)
        self._send_webhook_msg(message=webhook_msg, emit_event=False)
        self._emit_event(
            lifecycle_stage_event(
                key="init_load_base_model",
                label="Loading base model",
                status="running",
                message=webhook_msg,
                job_id=self.job_id,
            )
        )
        self.model.load_model(move_to_device=False)
        self.accelerator.wait_for_everyone()
        self._report_cuda_usage_if_requested("after_base_model_load")
        self._emit_event(
            lifecycle_stage_event(
                key="init_load_base_model",
                label="Loading base model",
                status="completed",
                message="Base model has loaded.",
                current=1,
                total=1,
                percent=100,
                job_id=self.job_id,
            ),
        )

    def init_data_backend(self):
        try:
            self.init_clear_backend_cache()
            # Send to Discord but don't emit event (lifecycle event below will handle that)
            self._send_webhook_msg(message="Configuring data backends... (this may take a while!)", emit_event=False)
            self._emit_event(
                lifecycle_stage_event(
                    key="init_data_backend",
                    label="Configuring data backends",
                    status="running",
                    message="Configuring data backends... (this may take a while!)",
                    job_id=self.job_id,
                )
            )
            distiller_profile = self._resolve_distiller_profile()
            configure_multi_databackend(
                self.config,
                accelerator=self.accelerator,
                text_encoders=self.model.text_encoders,
                tokenizers=self.model.tokenizers,
                model=self.model,
                distiller_profile=distiller_profile,
                distillation_method=getattr(self.config, "distillation_method", None),
            )
            self._emit_event(
                lifecycle_stage_event(
                    key="init_data_backend",
                    label="Configuring data backends",
                    status="completed",
                    message="Completed configuring data backends.",
                    current=1,
                    total=1,
                    percent=100,
                    job_id=self.job_id,
                )
            )
        except Exception as e:
            import traceback

            logger.error(f"{e}, traceback: {traceback.format_exc()}")

            # Ensure webhook handler is configured before sending error message
            if not self.webhook_handler:
                logger.warning("Webhook handler not initialized, attempting to configure it now")
                try:
                    self.configure_webhook(send_startup_message=False)
                except Exception as webhook_err:
                    logger.error(f"Failed to configure webhook handler: {webhook_err}")

            self._send_webhook_msg(
                message=f"Failed to load data backends: {e}",
                message_level="critical",
            )
            self._emit_event(
                lifecycle_stage_event(
                    key="init_data_backend",
                    label="Configuring data backends",
                    status="failed",
                    message=f"Failed to load data backends: {e}",
                    job_id=self.job_id,
                ),
                message_level="critical",
            )

            raise e

        try:
            self.init_validation_prompts()
        except Exception as e:
            logger.error("Could not generate validation prompts.")

            logger.exception("Could not generate validation prompts")
            raise e

        # We calculate the number of steps per epoch by dividing the number of images by the effective batch divisor.
        # Gradient accumulation steps mean that we only update the model weights every /n/ steps.
        collected_data_backend_keys = list(StateTracker.get_data_backends().keys())
        if self.hub_manager is not None and self.accelerator.is_main_process:
            self.hub_manager.collected_data_backend_str = collected_data_backend_keys
            validation_prompt_metadata = self.validation_prompt_metadata if self.validation_prompt_metadata else {}
            self.hub_manager.set_validation_prompts(validation_prompt_metadata)
            logger.debug(f"Collected validation prompts: {validation_prompt_metadata}")
        self._recalculate_training_steps()
        logger.info(f"Collected the following data backends: {collected_data_backend_keys}")
        # Send to Discord but don't emit event (notification event below will handle that)
        self._send_webhook_msg(
            message=f"Collected the following data backends: {collected_data_backend_keys}", emit_event=False
        )
        self._emit_event(
            notification_event(
                message=f"Collected the following data backends: {collected_data_backend_keys}",
                severity="info",
                job_id=self.job_id,
            )
        )
        self.accelerator.wait_for_everyone()

    def init_validation_prompts(self):
        if (
            hasattr(self.accelerator, "state")
            and hasattr(self.accelerator.state, "deepspeed_plugin")
            and getattr(self.accelerator.state.deepspeed_plugin, "deepspeed_config", {})
            .get("zero_optimization", {})
            .get("stage")
            == 3
        ):
            logger.warning("Cannot run validations with DeepSpeed ZeRO stage 3. Disabling validation.")
            self.config.validation_disable = True

        if self.config.validation_disable:
            self.validation_prompt_metadata = None
            self.validation_shortnames = None
            self.validation_negative_prompt_embeds = None
            self.validation_negative_pooled_embeds = None
            StateTracker.set_validation_sample_images([])
            self.accelerator.wait_for_everyone()
            return

        validation_metadata = None
        if self.accelerator.is_main_process:
            validation_metadata = prepare_validation_prompt_list(
                args=self.config,
                embed_cache=StateTracker.get_default_text_embed_cache(),
                model=self.model,
            )
        validation_metadata = broadcast_object_from_main(validation_metadata)
        if validation_metadata is None:
            StateTracker.set_validation_sample_images([])
        else:
            StateTracker.set_validation_sample_images(validation_metadata.get("validation_sample_images") or [])
        self.validation_prompt_metadata = validation_metadata
        if validation_metadata is None:
            self.validation_shortnames = None
            self.validation_negative_prompt_embeds = None
            self.validation_negative_pooled_embeds = None
        self.accelerator.wait_for_everyone()

    def stats_memory_used(self):
        # Grab GPU memory used:
        if torch.cuda.is_available():
            curent_memory_allocated = torch.cuda.memory_allocated() / 1024**3
        elif torch.backends.mps.is_available():
            curent_memory_allocated = torch.mps.current_allocated_memory() / 1024**3
        else:
            logger.warning("CUDA, ROCm, or Apple MPS not detected here. We cannot report VRAM reductions.")
            curent_memory_allocated = 0

        return curent_memory_allocated

    def _report_cuda_usage(self, label: str):
        """Report which components still hold CUDA tensors to pinpoint leaks."""
        if not torch.cuda.is_available():
            return

        def _tensor_storage_bytes(tensor: torch.Tensor) -> int:
            tensor_data_names = getattr(tensor, "tensor_data_names", None)
            if tensor_data_names:
                total = 0
                for attr_name in tensor_data_names:
                    payload = getattr(tensor, attr_name, None)
                    if torch.is_tensor(payload) and payload.device.type == "cuda":
                        total += payload.numel() * payload.element_size()
                return total
            return tensor.numel() * tensor.element_size()

        def _bytes_and_devices(obj) -> tuple[int, dict[str, int]]:
            total = 0
            devices: dict[str, int] = {}
            if obj is None:
                return total, devices
            tensors = []
            try:
                if hasattr(obj, "parameters"):
                    tensors.extend(list(obj.parameters()))
                if hasattr(obj, "buffers"):
                    tensors.extend(list(obj.buffers()))
            except Exception:
                return total, devices
            for t in tensors:
                if not torch.is_tensor(t) or t.device.type != "cuda":
                    continue
                size = _tensor_storage_bytes(t)
                total += size
                devices[str(t.device)] = devices.get(str(t.device), 0) + 1
            return total, devices

        allocated = torch.cuda.memory_allocated() / (1024**3)
        reserved = torch.cuda.memory_reserved() / (1024**3)
        peak_allocated = torch.cuda.max_memory_allocated() / (1024**3)
        logger.warning(
            "[%s] CUDA memory allocated=%.2f GB, reserved=%.2f GB, peak_allocated=%.2f GB",
            label,
            allocated,
            reserved,
            peak_allocated,
        )

        components: list[tuple[str, object]] = []
        components.append(("model", getattr(self.model, "model", None)))
        components.append(("vae", getattr(self.model, "vae", None)))
        components.append(("controlnet", getattr(self.model, "controlnet", None)))
        components.append(("text_encoders", getattr(self.model, "text_encoders", None)))
        components.append(("active_pipeline", getattr(self.model, "pipeline", None)))
        if hasattr(self.model, "pipelines") and isinstance(getattr(self.model, "pipelines"), dict):
            for k, v in getattr(self.model, "pipelines").items():
                components.append((f"cached_pipeline[{k}]", v))
        seen_caches: set[int] = set()
        try:
            for backend_id, backend in StateTracker.get_data_backends().items():
                cache = backend.get("text_embed_cache") if isinstance(backend, dict) else None
                if cache is None:
                    continue
                seen_caches.add(id(cache))
                components.append((f"text_embed_cache[{backend_id}].pipeline", getattr(cache, "pipeline", None)))
                encs = getattr(cache, "text_encoders", None)
                if encs:
                    for idx, enc in enumerate(encs):
                        components.append((f"text_embed_cache[{backend_id}].te{idx+1}", enc))
        except Exception:
            pass
        try:
            for idx, cache in enumerate(TextEmbeddingCache.active_caches()):
                if cache is None or id(cache) in seen_caches:
                    continue
                seen_caches.add(id(cache))
                components.append((f"text_embed_cache[registry-{idx}].pipeline", getattr(cache, "pipeline", None)))
                encs = getattr(cache, "text_encoders", None)
                if encs:
                    for enc_idx, enc in enumerate(encs):
                        components.append((f"text_embed_cache[registry-{idx}].te{enc_idx+1}", enc))
        except Exception:
            pass

        for name, obj in components:
            # Handle lists of encoders explicitly
            if isinstance(obj, (list, tuple)):
                for idx, item in enumerate(obj):
                    total, devices = _bytes_and_devices(item)
                    if total > 0:
                        gb = total / (1024**3)
                        logger.warning("[%s] %s[%s] holds %.2f GB on %s", label, name, idx, gb, devices)
                continue

            total, devices = _bytes_and_devices(obj)
            if total > 0:
                gb = total / (1024**3)
                logger.warning("[%s] %s holds %.2f GB on %s", label, name, gb, devices)

    def _report_cuda_usage_if_requested(self, label: str):
        if os.environ.get("SIMPLETUNER_LOG_CUDA_USAGE", "0") == "1":
            self._report_cuda_usage(label)

    def _clear_pipeline_caches(self):
        """Drop cached pipelines and cache-held pipelines to release VRAM before training."""
        try:
            if hasattr(self.model, "pipelines") and getattr(self.model, "pipelines"):
                self.model.pipelines.clear()
            if hasattr(self.model, "pipeline"):
                self.model.pipeline = None
        except Exception:
            logger.debug("Failed to clear model pipeline caches.", exc_info=True)

        try:
            for backend in StateTracker.get_data_backends().values():
                cache = backend.get("text_embed_cache") if isinstance(backend, dict) else None
                if cache is None:
                    continue
                if hasattr(cache, "pipeline"):
                    cache.pipeline = None
        except Exception:
            logger.debug("Failed to clear text embed cache pipelines.", exc_info=True)

    def init_unload_text_encoder(self):
        if self.config.model_type != "full" and self.config.train_text_encoder:
            return
        if (
            getattr(self.config, "text_cache_ondemand", False)
            or getattr(self.config, "text_cache_disable", False)
            or StateTracker.any_text_cache_uses_ondemand()
        ):
            logger.info("Keeping text encoders loaded for on-demand text embedding.")
            return
        memory_before_unload = self.stats_memory_used()
        if self.accelerator.is_main_process:
            logger.info("Unloading text encoders, as they are not being trained.")
        self._report_cuda_usage("pre_text_encoder_unload")
        self.model.unload_text_encoder()

        # Clear text encoder cache paths now that they're unloaded
        # This allows delete_all_model_caches to skip these components
        for i in range(1, 10):  # Support up to 10 text encoders
            StateTracker.clear_model_snapshot_path(f"text_encoder_{i}")

        caches_seen: set[int] = set()
        caches_to_clear: list[object] = []
        try:
            for backend in StateTracker.get_data_backends().values():
                cache = backend.get("text_embed_cache") if isinstance(backend, dict) else None
                if cache is None:
                    continue
                cache_id = id(cache)
                if cache_id in caches_seen:
                    continue
                caches_seen.add(cache_id)
                caches_to_clear.append(cache)
        except Exception:
            logger.debug("Failed to collect text embed caches from StateTracker during unload.", exc_info=True)

        try:
            for cache in TextEmbeddingCache.active_caches():
                if cache is None:
                    continue
                cache_id = id(cache)
                if cache_id in caches_seen:
                    continue
                caches_seen.add(cache_id)
                caches_to_clear.append(cache)
        except Exception:
            logger.debug("Failed to collect text embed caches from registry during unload.", exc_info=True)

        for cache in caches_to_clear:
            if hasattr(cache, "text_encoders"):
                cache.text_encoders = None
            if hasattr(cache, "pipeline"):
                cache.pipeline = None
            # Also clear the model reference which may hold text encoders
            if hasattr(cache, "model"):
                cache.model = None
        self._clear_pipeline_caches()
        reclaim_memory()
        self._report_cuda_usage("post_text_encoder_unload")

        # Scan for any CUDA tensors that might be leaked
        if torch.cuda.is_available():
            import gc

            gc.collect()
            cuda_tensor_count = 0
            cuda_tensor_bytes = 0
            for obj in gc.get_objects():
                try:
                    if torch.is_tensor(obj) and obj.device.type == "cuda":
                        cuda_tensor_count += 1
                        cuda_tensor_bytes += obj.numel() * obj.element_size()
                except Exception:
                    pass
            # Check if VAE is still loaded (expected at this point)
            vae_loaded = getattr(self.model, "vae", None) is not None
            if cuda_tensor_bytes > 1024**3:  # Only log if > 1GB
                if vae_loaded:
                    logger.debug(
                        "Found %d CUDA tensors totaling %.2f GB (VAE still loaded, will be unloaded next)",
                        cuda_tensor_count,
                        cuda_tensor_bytes / (1024**3),
                    )
                else:
                    logger.warning(
                        "Found %d CUDA tensors totaling %.2f GB that may be leaked",
                        cuda_tensor_count,
                        cuda_tensor_bytes / (1024**3),
                    )

        memory_after_unload = self.stats_memory_used()
        memory_saved = memory_after_unload - memory_before_unload
        logger.info(f"After nuking text encoders from orbit, we freed {abs(round(memory_saved, 2))} GB of VRAM.")

    def init_precision(self, preprocessing_models_only: bool = False, ema_only: bool = False):
        self.config.enable_adamw_bf16 = True if self.config.weight_dtype == torch.bfloat16 else False
        quantize_via = getattr(self.config, "quantize_via", "accelerator")
        quantization_device = "cpu" if quantize_via == "cpu" else self.accelerator.device
        pipeline_base_quantization = bool(getattr(self.config, "pipeline_quantization_base", False))

        if "bnb" in self.config.base_model_precision or pipeline_base_quantization:
            # can't cast or move bitsandbytes models
            return

        if not self.config.disable_accelerator and self.config.is_quantized:
            if self.config.base_model_default_dtype == "fp32":
                self.config.base_weight_dtype = torch.float32
                self.config.enable_adamw_bf16 = False
            elif self.config.base_model_default_dtype == "bf16":
                self.config.base_weight_dtype = torch.bfloat16
                self.config.enable_adamw_bf16 = True
            elif self.config.base_model_default_dtype == "fp16":
                raise ValueError("fp16 mixed precision training is not supported.")
            if not preprocessing_models_only:
                logger.info(
                    f"Moving {self.model.MODEL_TYPE.value} to dtype={self.config.base_weight_dtype}, device={quantization_device}"
                )
                self.model.model.to(quantization_device, dtype=self.config.base_weight_dtype)
                if self.config.controlnet:
                    logger.info(f"Moving ControlNet to dtype={self.config.base_weight_dtype}, device={quantization_device}")
                    self.model.controlnet.to(quantization_device, dtype=self.config.base_weight_dtype)
        if self.config.is_quanto:
            with self.accelerator.local_main_process_first():
                if ema_only:
                    if not pipeline_base_quantization:
                        self.quantise_model(ema=self.ema_model, args=self.config)
                    return
                self.quantise_model(
                    model=(
                        None
                        if preprocessing_models_only or pipeline_base_quantization
                        else self.model.unwrap_model(model=self.model.model)
                    ),
                    text_encoders=None,
                    controlnet=None,
                    ema=self.ema_model if not pipeline_base_quantization else None,
                    args=self.config,
                )

                self.quantise_model(
                    model=(
                        None
                        if preprocessing_models_only or pipeline_base_quantization
                        else self.model.get_trained_component()
                    ),
                    text_encoders=self.model.text_encoders,
                    controlnet=None,
                    ema=None,
                    args=self.config,
                )
        elif self.config.is_torchao:
            with self.accelerator.local_main_process_first():
                if ema_only:
                    if not pipeline_base_quantization:
                        self.ema_model = self.quantise_model(ema=self.ema_model, args=self.config, return_dict=True)["ema"]

                    return
                (
                    q_model,
                    self.model.text_encoders,
                    self.controlnet,
                    self.ema_model,
                ) = self.quantise_model(
                    model=(
                        None
                        if preprocessing_models_only or pipeline_base_quantization
                        else self.model.get_trained_component(base_model=True)
                    ),
                    text_encoders=self.model.text_encoders,
                    controlnet=None,
                    ema=self.ema_model,
                    args=self.config,
                )
                self.model.set_prepared_model(q_model, base_model=True)
                if self.config.controlnet:
                    (
                        q_model,
                        _,
                        _,
                        _,
                    ) = self.quantise_model(
                        model=(
                            None
                            if preprocessing_models_only or pipeline_base_quantization
                            else self.model.get_trained_component(base_model=False)
                        ),
                        args=self.config,
                    )
                    self.model.set_prepared_model(q_model, base_model=False)
                self._report_cuda_usage_if_requested("after_torchao_quantization")
        elif self.config.is_fp8_native:
            with self.accelerator.local_main_process_first():
                if ema_only:
                    if not pipeline_base_quantization:
                        self.ema_model = self.quantise_model(ema=self.ema_model, args=self.config, return_dict=True)["ema"]

                    return
                (
                    q_model,
                    self.model.text_encoders,
                    self.controlnet,
                    self.ema_model,
                ) = self.quantise_model(
                    model=(
                        None
                        if preprocessing_models_only or pipeline_base_quantization
                        else self.model.get_trained_component(base_model=True)
                    ),
                    text_encoders=self.model.text_encoders,
                    controlnet=None,
                    ema=self.ema_model,
                    args=self.config,
                )
                self.model.set_prepared_model(q_model, base_model=True)
                if self.config.controlnet:
                    (
                        q_model,
                        _,
                        _,
                        _,
                    ) = self.quantise_model(
                        model=(
                            None
                            if preprocessing_models_only or pipeline_base_quantization
                            else self.model.get_trained_component(base_model=False)
                        ),
                        args=self.config,
                    )
                    self.model.set_prepared_model(q_model, base_model=False)
                self._report_cuda_usage_if_requested("after_fp8_native_quantization")
        elif self.config.is_transformerengine:
            with self.accelerator.local_main_process_first():
                if ema_only:
                    if not pipeline_base_quantization:
                        self.ema_model = self.quantise_model(ema=self.ema_model, args=self.config, return_dict=True)["ema"]

                    return
                (
                    q_model,
                    self.model.text_encoders,
                    self.controlnet,
                    self.ema_model,
                ) = self.quantise_model(
                    model=(
                        None
                        if preprocessing_models_only or pipeline_base_quantization
                        else self.model.get_trained_component(base_model=True)
                    ),
                    text_encoders=self.model.text_encoders,
                    controlnet=None,
                    ema=self.ema_model,
                    args=self.config,
                )
                self.model.set_prepared_model(q_model, base_model=True)
                if self.config.controlnet:
                    (
                        q_model,
                        _,
                        _,
                        _,
                    ) = self.quantise_model(
                        model=(
                            None
                            if preprocessing_models_only or pipeline_base_quantization
                            else self.model.get_trained_component(base_model=False)
                        ),
                        args=self.config,
                    )
                    self.model.set_prepared_model(q_model, base_model=False)
                self._report_cuda_usage_if_requested("after_transformerengine_quantization")
        elif self.config.is_sdnq:
            with self.accelerator.local_main_process_first():
                if ema_only:
                    if not pipeline_base_quantization:
                        self.ema_model = self.quantise_model(ema=self.ema_model, args=self.config, return_dict=True)["ema"]

                    return
                (
                    q_model,
                    self.model.text_encoders,
                    self.controlnet,
                    self.ema_model,
                ) = self.quantise_model(
                    model=(
                        None
                        if preprocessing_models_only or pipeline_base_quantization
                        else self.model.get_trained_component(base_model=True)
                    ),
                    text_encoders=self.model.text_encoders,
                    controlnet=None,
                    ema=self.ema_model,
                    args=self.config,
                )
                self.model.set_prepared_model(q_model, base_model=True)
                if self.config.controlnet:
                    (
                        q_model,
                        _,
                        _,
                        _,
                    ) = self.quantise_model(
                        model=(
                            None
                            if preprocessing_models_only or pipeline_base_quantization
                            else self.model.get_trained_component(base_model=False)
                        ),
                        args=self.config,
                    )
                    self.model.set_prepared_model(q_model, base_model=False)

        if not preprocessing_models_only and not ema_only:
            self.model.post_quantization_setup()

        if (
            getattr(self.config, "ramtorch", False)
            and not preprocessing_models_only
            and not ema_only
            and hasattr(self.model, "_ramtorch_base_deferred_until_after_quantization")
            and self.model._ramtorch_base_deferred_until_after_quantization()
        ):
            applied = self.model.apply_ramtorch_to_transformer()
            if applied:
                logger.info("Applied deferred RamTorch to %s base model layers after quantization.", applied)

        # After quantization, re-move non-ramtorch layers to GPU
        # Quantization may have moved the model to CPU, leaving normalization weights there
        if getattr(self.config, "ramtorch", False) and not preprocessing_models_only:
            from simpletuner.helpers.utils import ramtorch as ramtorch_utils

            model = self.model.unwrap_model(model=self.model.model)
            if model is not None:
                moved = ramtorch_utils.move_embeddings_to_device(model, self.accelerator.device)
                if moved:
                    logger.debug(f"Post-quantization: moved {moved} non-ramtorch params to GPU")

    def init_controlnet_model(self):
        if not self.config.controlnet:
            return
        self.model.controlnet_init()
        if getattr(self.config, "ramtorch", False) and getattr(self.config, "ramtorch_controlnet", False):
            self.model.apply_ramtorch_to_controlnet()
        self.accelerator.wait_for_everyone()

    def init_tread_model(self):
        if not self.config.tread_config:
            return
        self.model.tread_init()
        self.accelerator.wait_for_everyone()

    def init_gligen_layers(self):
        """Inject GLIGEN grounding layers into the model after it has been loaded."""
        if not self.model.supports_grounding():
            return

        from simpletuner.helpers.training.grounding.gligen_layers import _extract_block_dims, inject_gligen_layers

        component = self.model.get_trained_component(base_model=True)
        if component is None:
            logger.warning("GLIGEN: get_trained_component(base_model=True) returned None, skipping injection")
            return

        model_config = getattr(component, "config", None)
        cross_attention_dim = getattr(model_config, "cross_attention_dim", None)
        if cross_attention_dim is None:
            cross_attention_dim = getattr(model_config, "joint_attention_dim", None)
        if isinstance(cross_attention_dim, (list, tuple)):
            cross_attention_dim = cross_attention_dim[0]

        if cross_attention_dim is None:
            for module in component.modules():
                dims = _extract_block_dims(module)
                if dims is not None:
                    cross_attention_dim = dims[0]
                    break

        if cross_attention_dim is None:
            logger.warning(
                "GLIGEN: could not determine cross_attention_dim from %s, skipping injection",
                type(component).__name__,
            )
            return

        grounding_model_path = getattr(self.config, "pretrained_grounding_model_name_or_path", None)
        feature_type = "text-image" if grounding_model_path else "text-only"

        inject_gligen_layers(
            model=component,
            positive_len=cross_attention_dim,
            cross_attention_dim=cross_attention_dim,
            feature_type=feature_type,
        )
        logger.info("GLIGEN layers injected into model")
        self.accelerator.wait_for_everyone()

    def init_trainable_peft_adapter(self):
        if "lora" not in self.config.model_type:
            return
        if "standard" == self.config.lora_type.lower():
            lora_info_msg = f"Using LoRA training mode (rank={self.config.lora_rank})"
            logger.info(lora_info_msg)
            self._send_webhook_msg(message=lora_info_msg)
            addkeys, misskeys = self.model.add_lora_adapter()
            if addkeys:
                logger.warning(
                    "The following keys were found in %s, but are not part of the model and are ignored:\n %s.\nThis is most likely an error"
                    % (self.config.init_lora, str(addkeys))
                )
            if misskeys:
                logger.warning(
                    "The following keys were part of the model but not found in %s:\n %s.\nThese keys will be initialized according to the lora weight initialisation. This could be an error, or intended behaviour in case a lora is finetuned with additional keys."
                    % (self.config.init_lora, str(misskeys))
                )

            logger.info(
                f"LoRA network has been initialized with {trainable_parameter_count(self._get_trainable_parameters())} parameters"
            )
            trainable_non_lora = [
                name
                for name, param in self.model.get_trained_component(unwrap_model=False).named_parameters()
                if param.requires_grad
                and ".lora_" not in name
                and "lora_magnitude_vector" not in name
                and ".modules_to_save." not in name
            ]
            if trainable_non_lora:
                logger.warning(
                    "LoRA setup left %s non-LoRA parameter%s trainable; first entries: %s",
                    len(trainable_non_lora),
                    "" if len(trainable_non_lora) == 1 else "s",
                    ", ".join(trainable_non_lora[:10]),
                )
            self._report_cuda_usage_if_requested("after_lora_adapter_init")
            if hasattr(self.model, "configure_assistant_lora_for_training"):
                self.model.configure_assistant_lora_for_training()
            if self.config.base_model_precision in MANUAL_TRANSFORMERENGINE_PRESETS:
                ignored = mark_transformerengine_ddp_ignore_params(self.model.get_trained_component(unwrap_model=False))
                if ignored:
                    logger.info("Marking %s TransformerEngine FP8 tensors to ignore for DDP after LoRA init.", ignored)
        elif "lycoris" == self.config.lora_type.lower():
            from lycoris import create_lycoris

            with open(self.config.lycoris_config, "r") as f:
                self.lycoris_config = json.load(f)

            if self.lycoris_config.get("algo") == "tlora":
                from simpletuner.helpers.training.lycoris import TLORA_AVAILABLE

                if not TLORA_AVAILABLE:
                    raise ImportError(
                        "algo='tlora' requires a LyCORIS version with T-LoRA support. "
                        "Please upgrade LyCORIS to a version that includes lycoris.modules.tlora."
                    )
                if isinstance(self.model, VideoModelFoundation):
                    logger.warning(
                        "T-LoRA with video models may produce subpar results due to "
                        "temporal compression blending frames across timestep boundaries."
                    )

            multiplier = int(self.lycoris_config.get("multiplier", 1))
            linear_dim = int(self.lycoris_config.get("linear_dim", 4))
            linear_alpha = int(self.lycoris_config.get("linear_alpha", 1))
            tlora_min_rank = int(self.lycoris_config.get("tlora_min_rank", 1))
            tlora_alpha = float(self.lycoris_config.get("tlora_alpha", 1.0))
            apply_preset = self.lycoris_config.get("apply_preset", None)
            if apply_preset is not None and apply_preset != {}:
                if self.model.supports_grounding() and getattr(self.model, "_data_has_grounding", False):
                    gligen_targets = self.model.GLIGEN_LYCORIS_TARGET
                    apply_preset["target_module"] = gligen_targets
                    if "module_algo_map" in apply_preset:
                        algo_settings = next(iter(apply_preset["module_algo_map"].values()), {})
                        apply_preset["module_algo_map"] = {t: dict(algo_settings) for t in gligen_targets}
                    logger.info(f"GLIGEN: overriding LyCORIS target_module to {gligen_targets}")
                LycorisNetwork.apply_preset(apply_preset)

            # Remove the positional arguments we extracted.
            keys_to_remove = ["multiplier", "linear_dim", "linear_alpha", "tlora_min_rank", "tlora_alpha"]
            for key in keys_to_remove:
                if key in self.lycoris_config:
                    del self.lycoris_config[key]

            logger.info("Using lycoris training mode")
            self._send_webhook_msg(message="Using lycoris training mode.")

            if "bypass_mode" not in self.lycoris_config:
                from simpletuner.helpers.models.ideogram.quantized_loading import Fp8Linear

                component = self.model.get_trained_component()
                if any(isinstance(module, Fp8Linear) for module in component.modules()):
                    logger.info("Enabling LyCORIS bypass_mode for Ideogram FP8 Linear layers.")
                    self.lycoris_config["bypass_mode"] = True

            if self.model.supports_grounding() and getattr(self.model, "_data_has_grounding", False):
                component = self.model.get_trained_component()
                from diffusers.models.attention import GatedSelfAttentionDense

                gligen_count = sum(1 for m in component.modules() if isinstance(m, GatedSelfAttentionDense))
                logger.info(f"GLIGEN: {gligen_count} fuser layers found on model before LyCORIS init")
                if gligen_count == 0:
                    logger.warning("GLIGEN: no fuser layers found — injecting now (post-hoc)")
                    from simpletuner.helpers.training.grounding.gligen_layers import (
                        _extract_block_dims,
                        inject_gligen_layers,
                    )

                    model_config = getattr(component, "config", None)
                    cross_attention_dim = getattr(model_config, "cross_attention_dim", None)
                    if cross_attention_dim is None:
                        cross_attention_dim = getattr(model_config, "joint_attention_dim", None)
                    if isinstance(cross_attention_dim, (list, tuple)):
                        cross_attention_dim = cross_attention_dim[0]
                    if cross_attention_dim is None:
                        for module in component.modules():
                            dims = _extract_block_dims(module)
                            if dims is not None:
                                cross_attention_dim = dims[0]
                                break
                    if cross_attention_dim is not None:
                        grounding_model_path = getattr(self.config, "pretrained_grounding_model_name_or_path", None)
                        feature_type = "text-image" if grounding_model_path else "text-only"
                        inject_gligen_layers(
                            model=component,
                            positive_len=cross_attention_dim,
                            cross_attention_dim=cross_attention_dim,
                            feature_type=feature_type,
                        )
                        gligen_count = sum(1 for m in component.modules() if isinstance(m, GatedSelfAttentionDense))
                        logger.info(f"GLIGEN: post-hoc injection complete, {gligen_count} fuser layers")

            if self.config.init_lora is not None:
                from lycoris import create_lycoris_from_weights

                self.lycoris_wrapped_network = create_lycoris_from_weights(
                    multiplier,
                    self.config.init_lora,
                    self.model.get_trained_component(),
                    weights_sd=None,
                    **self.lycoris_config,
                )[0]
            else:
                self.lycoris_wrapped_network = create_lycoris(
                    self.model.get_trained_component(),
                    multiplier,
                    linear_dim,
                    linear_alpha,
                    **self.lycoris_config,
                )

                if self.config.init_lokr_norm is not None:
                    init_lokr_network_with_perturbed_normal(
                        self.lycoris_wrapped_network,
                        scale=self.config.init_lokr_norm,
                    )

            self.lycoris_wrapped_network.apply_to()
            if self.lycoris_config.get("algo") == "tlora":
                self._tlora_active = True
                self._tlora_config = {
                    "max_rank": linear_dim,
                    "min_rank": tlora_min_rank,
                    "alpha": tlora_alpha,
                }
            setattr(
                self.accelerator,
                "_lycoris_wrapped_network",
                self.lycoris_wrapped_network,
            )
            setattr(self.accelerator, "_tlora_active", self._tlora_active)
            setattr(self.accelerator, "_tlora_config", self._tlora_config)
            logger.info(
                f"LyCORIS network has been initialized with {trainable_parameter_count(self.lycoris_wrapped_network.parameters())} parameters"
            )
            if self.config.base_model_precision in MANUAL_TRANSFORMERENGINE_PRESETS:
                ignored = mark_transformerengine_ddp_ignore_params(self.model.get_trained_component(unwrap_model=False))
                if ignored:
                    logger.info(
                        "Marking %s TransformerEngine FP8 tensors to ignore for DDP after LyCORIS init.",
                        ignored,
                    )
        self.accelerator.wait_for_everyone()

    def init_lyrics_embedder_training(self):
        """
        Enable training for the ACE-Step lyrics embedder when requested.
        """
        if not getattr(self.config, "lyrics_embedder_train", False):
            return
        modules_fn = getattr(self.model, "get_lyrics_embedder_modules", None)
        if not callable(modules_fn):
            logger.warning("lyrics_embedder_train enabled, but model does not expose lyrics embedder modules.")
            return

        modules = modules_fn(unwrap=False) or []
        if not modules:
            logger.warning("lyrics_embedder_train enabled, but no lyrics embedder modules were found to unfreeze.")
            return

        enabled = []
        enable_fn = getattr(self.model, "enable_lyrics_embedder_training", None)
        if callable(enable_fn):
            enabled = enable_fn() or []
        else:
            for name, module in modules:
                if module is None:
                    continue
                module.requires_grad_(True)
                module.train()
                enabled.append(name)

        if enabled:
            logger.info("Enabled training for lyrics embedder modules: %s", ", ".join(enabled))

    def init_post_load_freeze(self):
        if self.config.layer_freeze_strategy == "bitfit":
            from simpletuner.helpers.training.model_freeze import apply_bitfit_freezing

            if self.model.get_trained_component() is not None:
                logger.info(f"Applying BitFit freezing strategy to the {self.model.MODEL_TYPE.value}.")
                self.model.model = apply_bitfit_freezing(unwrap_model(self.accelerator, self.model.model), self.config)
        model_specific_freeze = getattr(self.model, "apply_model_specific_freeze", None)
        if callable(model_specific_freeze):
            model_specific_freeze()
        self.enable_gradient_checkpointing()

    def _resolve_distiller_profile(self) -> DistillerRequirementProfile:
        """Return and cache the active distiller requirement profile."""
        method = getattr(self.config, "distillation_method", None)
        if not method:
            StateTracker.set_distiller_profile(None, EMPTY_PROFILE)
            self.distiller_requirement_profile = EMPTY_PROFILE
            return EMPTY_PROFILE

        profile = DistillationRegistry.get_requirement_profile(method)
        self.distiller_requirement_profile = profile
        StateTracker.set_distiller_profile(method, profile)
        return profile

    def init_distillation(self):
        """Initialize distillation using the factory pattern."""
        from simpletuner.helpers.distillation.factory import DistillerFactory

        self.distiller = None

        if self.config.distillation_method is None:
            return

        # Get prediction type from model
        prediction_type = None
        if hasattr(self.model, "PREDICTION_TYPE"):
            prediction_type = self.model.PREDICTION_TYPE.value

        try:
            # Create distiller using factory
            self.distiller = DistillerFactory.create_distiller(
                method=self.config.distillation_method,
                teacher_model=self.model,
                noise_scheduler=self.noise_scheduler,
                config=vars(self.config),  # Convert config object to dict
                model_type=self.config.model_type,
                model_family=getattr(self.config, "model_family", None),
                prediction_type=prediction_type,
                student_model=None,  # Set this if using separate student model
            )

            if self.distiller:
                logger.info(f"Successfully initialized {self.config.distillation_method.upper()} distiller")
                run_distillation_cache_generation(self.distiller)
        except Exception as e:
            logger.error(f"Failed to initialize distillation: {e}")
            raise

    def enable_gradient_checkpointing(self):
        if self.config.gradient_checkpointing:
            fsdp_plugin = getattr(getattr(self.accelerator, "state", None), "fsdp_plugin", None)
            if fsdp_plugin and getattr(self.config, "fsdp_activation_checkpointing", False):
                logger.info("Skipping model-level gradient checkpointing because FSDP activation checkpointing is active.")
                return
            logger.debug("Enabling gradient checkpointing.")
            if hasattr(self.model.get_trained_component(), "enable_gradient_checkpointing"):
                unwrap_model(self.accelerator, self.model.get_trained_component()).enable_gradient_checkpointing()
            if hasattr(self.config, "train_text_encoder") and self.config.train_text_encoder:
                for text_encoder in self.model.text_encoders:
                    if text_encoder is not None:
                        unwrap_model(self.accelerator, text_encoder).gradient_checkpointing_enable()

    def disable_gradient_checkpointing(self):
        if self.config.gradient_checkpointing:
            logger.debug("Disabling gradient checkpointing.")
            if hasattr(self.model.get_trained_component(), "disable_gradient_checkpointing"):
                unwrap_model(
                    self.accelerator, self.model.get_trained_component(base_model=True)
                ).disable_gradient_checkpointing()
            if self.config.controlnet:
                unwrap_model(self.accelerator, self.model.get_trained_component()).disable_gradient_checkpointing()
            if hasattr(self.config, "train_text_encoder") and self.config.train_text_encoder:
                unwrap_model(self.accelerator, self.text_encoder_1).gradient_checkpointing_disable()
                unwrap_model(self.accelerator, self.text_encoder_2).gradient_checkpointing_disable()

    def _get_trainable_parameters(self):
        # Return just a list of the currently trainable parameters.
        if self.config.model_type == "lora":
            if self.config.lora_type == "lycoris":
                return self.lycoris_wrapped_network.parameters()
        return [param for param in self.model.get_trained_component(unwrap_model=False).parameters() if param.requires_grad]

    def _get_slider_tuner_layers(self):
        """Return cached list of (id, module) for BaseTunerLayer modules that have scaling dicts."""
        if hasattr(self, "_slider_tuner_layers_cache"):
            return self._slider_tuner_layers_cache

        from peft.tuners.tuners_utils import BaseTunerLayer

        result = []
        for name, module in self.model.get_trained_component().named_modules():
            if isinstance(module, BaseTunerLayer) and hasattr(module, "scaling"):
                result.append((id(module), module))
        self._slider_tuner_layers_cache = result
        return result

    def _ensure_parameter_dtype(self, parameters, target_dtype: torch.dtype, optimizer_name: str | None = None):
        converted = 0
        for param_or_group in parameters:
            if isinstance(param_or_group, dict):
                cand_params = param_or_group.get("params", [])
            else:
                cand_params = [param_or_group]

            for param in cand_params:
                if not hasattr(param, "data") or getattr(param, "is_meta", False):
                    continue
                tensor = param.data
                if tensor is None or tensor.dtype == target_dtype:
                    continue
                param.data = tensor.to(dtype=target_dtype)
                converted += 1

        if converted > 0:
            name_fragment = optimizer_name or getattr(self.config, "optimizer", "optimizer")
            logger.info(
                "Converted %s parameter%s to %s for %s compatibility.",
                converted,
                "" if converted == 1 else "s",
                target_dtype,
                name_fragment,
            )

    def _recalculate_training_steps(self):
        # Scheduler and math around the number of training steps.
        if not hasattr(self.config, "overrode_max_train_steps"):
            self.config.overrode_max_train_steps = False
        total_num_batches = 0
        initial_num_batches = 0
        initial_active_ids: list[str] = []

        caption_batches_supported = False
        distiller = getattr(self, "distiller", None)
        if distiller is not None:
            try:
                caption_batches_supported = bool(getattr(distiller, "consumes_caption_batches", lambda: False)())
            except Exception:
                caption_batches_supported = False
        if not caption_batches_supported:
            method = getattr(self.config, "distillation_method", None)
            if method:
                try:
                    profile = DistillationRegistry.get_requirement_profile(method)
                    caption_batches_supported = profile.requires_dataset_type(DatasetType.CAPTION)
                except Exception:
                    caption_batches_supported = False

        training_dataset_types = {
            DatasetType.IMAGE,
            DatasetType.VIDEO,
            DatasetType.AUDIO,
            DatasetType.CONDITIONING,
            DatasetType.GROUNDING,
        }
        if caption_batches_supported:
            training_dataset_types.add(DatasetType.CAPTION)

        for backend_id, backend in StateTracker.get_data_backends().items():
            backend_type = ensure_dataset_type(backend.get("dataset_type"), default=DatasetType.IMAGE)
            if backend_type is DatasetType.EVAL:
                continue
            if backend_type not in training_dataset_types:
                continue
            backend_config = backend.get("config", {}) if isinstance(backend, dict) else {}
            probability = backend_config.get("probability", 1.0)
            if probability is None:
                probability_value = 1.0
            else:
                try:
                    probability_value = float(probability)
                except (TypeError, ValueError) as exc:
                    raise ValueError(
                        f"Dataset {backend_id} has invalid probability={probability!r}; must be a number."
                    ) from exc
            if probability_value <= 0:
                continue
            try:
                dataset_batches = len(backend["metadata_backend"] if "metadata_backend" in backend else [])
            except Exception:
                dataset_batches = 0
            total_num_batches += dataset_batches

            schedule = StateTracker.get_dataset_schedule(backend_id) or {}
            start_epoch = normalize_start_epoch(schedule.get("start_epoch", backend.get("config", {}).get("start_epoch", 1)))
            start_step = normalize_start_step(schedule.get("start_step", backend.get("config", {}).get("start_step", 0)))
            if start_epoch <= 1 and start_step <= 1:
                initial_num_batches += dataset_batches
                initial_active_ids.append(backend_id)

        if initial_num_batches <= 0:
            raise ValueError(
                "No datasets are active at the start of training. "
                "Ensure at least one dataset has start_epoch<=1 and start_step<=1."
            )

        self.config.total_num_batches = total_num_batches
        self.config.initial_num_batches = initial_num_batches

        # Build epoch schedule map: epoch -> cumulative batches added at that epoch
        # This allows dynamic calculation of steps per epoch based on current epoch
        epoch_batches_map: dict[int, int] = {}
        for backend_id, backend in StateTracker.get_data_backends().items():
            backend_type = ensure_dataset_type(backend.get("dataset_type"), default=DatasetType.IMAGE)
            if backend_type is DatasetType.EVAL or backend_type not in training_dataset_types:
                continue
            backend_config = backend.get("config", {}) if isinstance(backend, dict) else {}
            probability = backend_config.get("probability", 1.0)
            if probability is None:
                probability_value = 1.0
            else:
                try:
                    probability_value = float(probability)
                except (TypeError, ValueError):
                    probability_value = 0.0
            if probability_value <= 0:
                continue
            try:
                dataset_batches = len(backend["metadata_backend"] if "metadata_backend" in backend else [])
            except Exception:
                dataset_batches = 0
            schedule = StateTracker.get_dataset_schedule(backend_id) or {}
            start_epoch = normalize_start_epoch(schedule.get("start_epoch", backend_config.get("start_epoch", 1)))
            # Accumulate batches by start_epoch
            epoch_batches_map[start_epoch] = epoch_batches_map.get(start_epoch, 0) + dataset_batches

        # Store the schedule for dynamic steps_per_epoch calculation
        self.config.epoch_batches_schedule = epoch_batches_map

        if initial_num_batches < total_num_batches:
            logger.info(
                f"Dataset scheduling detected: {initial_num_batches} batches available at start, "
                f"{total_num_batches} once all schedules begin. Progress estimates may shift after activation."
            )

        # Calculate initial steps per epoch (used during first epoch(s) before scheduled datasets activate)
        grad_accum = max(self.config.gradient_accumulation_steps or 1, 1)
        self.config.initial_num_update_steps_per_epoch = math.ceil(initial_num_batches / grad_accum)

        # Full steps per epoch (used after all datasets are active)
        self.config.num_update_steps_per_epoch = math.ceil(total_num_batches / grad_accum)
        steps_per_epoch = max(self.config.num_update_steps_per_epoch, 1)
        target_epochs = float(self.config.num_train_epochs or 0)
        max_train_steps_was_unset = self.config.max_train_steps is None or self.config.max_train_steps == 0
        if max_train_steps_was_unset and not self.config.strict_epoch_limit:
            logger.info(
                "Enabling strict_epoch_limit because --max_train_steps is unset; "
                "epoch-driven runs stop at --num_train_epochs."
            )
            self.config.strict_epoch_limit = True
        if getattr(self.config, "overrode_max_train_steps", False):
            self.config.max_train_steps = int(math.ceil(target_epochs * steps_per_epoch))
            # Afterwards we recalculate our number of training epochs
            self.config.num_train_epochs = math.ceil(self.config.max_train_steps / steps_per_epoch)
            logger.info(
                "After removing any undesired samples and updating cache entries, we have settled on"
                f" {self.config.num_train_epochs} epochs and {self.config.num_update_steps_per_epoch} steps per epoch."
            )
        if self.config.max_train_steps is None or self.config.max_train_steps == 0:
            if target_epochs == 0:
                raise ValueError("You must specify either --max_train_steps or --num_train_epochs with a value > 0")
            self.config.max_train_steps = int(math.ceil(target_epochs * steps_per_epoch))
            logger.info(
                f"Calculated our maximum training steps at {self.config.max_train_steps} because we have"
                f" {self.config.num_train_epochs} epochs and {self.config.num_update_steps_per_epoch} steps per epoch."
            )
            self.config.overrode_max_train_steps = True
        elif self.config.num_train_epochs is None or self.config.num_train_epochs == 0:
            if self.config.max_train_steps is None or self.config.max_train_steps == 0:
                raise ValueError("You must specify either --max_train_steps or --num_train_epochs with a value > 0")
            self.config.num_train_epochs = math.ceil(
                self.config.max_train_steps / max(self.config.num_update_steps_per_epoch, 1)
            )
            logger.info(
                f"Calculated our maximum training steps at {self.config.max_train_steps} because we have"
                f" {self.config.num_train_epochs} epochs and {self.config.num_update_steps_per_epoch} steps per epoch."
            )

        max_epochs = getattr(self.config, "num_train_epochs", None)
        max_steps = getattr(self.config, "max_train_steps", None)
        for dataset_id, backend in StateTracker.get_data_backends().items():
            backend_type = ensure_dataset_type(backend.get("dataset_type"), default=DatasetType.IMAGE)
            if backend_type not in {
                DatasetType.IMAGE,
                DatasetType.VIDEO,
                DatasetType.AUDIO,
                DatasetType.CONDITIONING,
                DatasetType.GROUNDING,
            }:
                continue
            schedule = StateTracker.get_dataset_schedule(dataset_id) or {}
            start_epoch = normalize_start_epoch(schedule.get("start_epoch", backend.get("config", {}).get("start_epoch", 1)))
            start_step = normalize_start_step(schedule.get("start_step", backend.get("config", {}).get("start_step", 0)))
            if max_epochs not in (None, 0) and start_epoch > max_epochs:
                logger.warning(
                    f"Dataset {dataset_id} is scheduled to start at epoch {start_epoch}, "
                    f"but training ends at epoch {max_epochs}. It will never sample."
                )
            if max_steps not in (None, 0) and start_step > max_steps:
                logger.warning(
                    f"Dataset {dataset_id} is scheduled to start at step {start_step}, "
                    f"but training stops at step {max_steps}. It will never sample."
                )
        if self.lr_scheduler is not None and hasattr(self.lr_scheduler, "num_update_steps_per_epoch"):
            self.lr_scheduler.num_update_steps_per_epoch = self.config.num_update_steps_per_epoch
        self.config.total_batch_size = (
            self.config.train_batch_size * self.accelerator.num_processes * self.config.gradient_accumulation_steps
        )

    def get_steps_per_epoch_for_epoch(self, epoch: int) -> int:
        """
        Calculate the number of steps per epoch for a specific epoch.

        When datasets have different start_epoch values, the number of steps
        per epoch varies. This method computes the correct value for a given epoch.

        Args:
            epoch: The epoch number (1-indexed) to calculate steps for.

        Returns:
            The number of update steps for that epoch.
        """
        epoch_batches_schedule = getattr(self.config, "epoch_batches_schedule", None)
        if epoch_batches_schedule is None:
            # No schedule, use the cached value
            return getattr(self.config, "num_update_steps_per_epoch", 1) or 1

        # Calculate total batches for this epoch by summing all datasets
        # that have start_epoch <= epoch
        active_batches = 0
        for start_epoch, batches in epoch_batches_schedule.items():
            if start_epoch <= epoch:
                active_batches += batches

        if active_batches <= 0:
            # Fallback to cached value if no batches (shouldn't happen)
            return getattr(self.config, "num_update_steps_per_epoch", 1) or 1

        grad_accum = max(self.config.gradient_accumulation_steps or 1, 1)
        return max(math.ceil(active_batches / grad_accum), 1)

    def _setup_ramtorch_zero_state(self):
        if not self._ramtorch_distributed():
            self._ramtorch_zero_state = None
            return

        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            logger.warning(
                "RamTorch distributed support requested but torch.distributed is not initialised; skipping RamTorch sharding hooks."
            )
            self._ramtorch_zero_state = None
            return

        try:
            broadcast_zero_params, create_zero_param_groups, setup_grad_sharding_hooks = ramtorch_utils.ramtorch_zero_utils()
        except ImportError:
            raise

        param_groups = getattr(self.optimizer, "param_groups", None)
        if not param_groups:
            self._ramtorch_zero_state = None
            return

        world_size = getattr(self.accelerator, "num_processes", dist.get_world_size())
        try:
            rank = get_rank()
        except Exception:
            rank = None
        if rank is None or rank < 0:
            try:
                rank = dist.get_rank()
            except Exception:
                rank = 0

        rank_param_groups = create_zero_param_groups(param_groups, world_size)
        grad_hook_handles = setup_grad_sharding_hooks(rank_param_groups, rank)
        self._ramtorch_zero_state = {
            "rank_param_groups": rank_param_groups,
            "grad_hook_handles": grad_hook_handles,
            "broadcast_zero_params": broadcast_zero_params,
        }
        logger.info("RamTorch ZeRO hooks enabled for %s ranks (rank %s).", world_size, rank)

    def _broadcast_ramtorch_parameters(self):
        if not self._ramtorch_zero_state:
            return

        broadcast_fn = self._ramtorch_zero_state.get("broadcast_zero_params")
        rank_param_groups = self._ramtorch_zero_state.get("rank_param_groups")
        if broadcast_fn is None or rank_param_groups is None:
            return

        broadcast_fn(rank_param_groups)

    def init_optimizer(self):
        logger.info(f"Learning rate: {self.config.learning_rate}")
        self.sidecar_optimizer = None
        self.sidecar_lr = None
        self.sidecar_is_schedulefree = False
        self.sidecar_scheduler_disabled = False

        def _normalize_lr(value):
            if value in (None, "", "None"):
                return None
            try:
                return float(value)
            except (TypeError, ValueError):
                logger.warning("Could not parse learning rate override %r; ignoring.", value)
                return None

        extra_optimizer_args = {"lr": self.config.learning_rate}
        embedder_params: list[torch.nn.Parameter] = []
        embedder_param_ids: set[int] = set()
        embedder_lr_value = _normalize_lr(getattr(self.config, "lyrics_embedder_lr", None))
        text_encoder_lr_value = _normalize_lr(getattr(self.config, "text_encoder_lr", None))
        if getattr(self.config, "lyrics_embedder_train", False):
            embedder_param_fn = getattr(self.model, "get_lyrics_embedder_parameters", None)
            if callable(embedder_param_fn):
                embedder_params = embedder_param_fn(require_grad_only=True, unwrap=False)
                embedder_param_ids = {id(p) for p in embedder_params}
            else:
                logger.warning("lyrics_embedder_train enabled but model does not expose embedder parameters.")

        lyrics_optimizer_override = getattr(self.config, "lyrics_embedder_optimizer", None) not in (
            None,
            "",
            "None",
        )
        lyrics_scheduler_override = getattr(self.config, "lyrics_embedder_lr_scheduler", None) not in (
            None,
            "",
            "None",
        )
        if lyrics_scheduler_override and not lyrics_optimizer_override:
            logger.info(
                "A lyrics embedder LR scheduler was provided without a custom optimizer; a separate embedder optimizer "
                "will reuse the primary optimizer type."
            )
        use_separate_lyrics_opt = lyrics_optimizer_override or lyrics_scheduler_override
        use_separate_lyrics_opt = use_separate_lyrics_opt and bool(embedder_params)

        if use_separate_lyrics_opt and self.config.use_deepspeed_optimizer:
            logger.warning(
                "Separate lyrics embedder optimizers are not supported with DeepSpeed optimizers; falling back to the "
                "primary optimizer."
            )
            use_separate_lyrics_opt = False
        if self.config.use_deepspeed_optimizer and embedder_lr_value is not None:
            logger.warning("lyrics_embedder_lr will be ignored when using DeepSpeed optimizers.")
            embedder_lr_value = None
        if self.config.use_deepspeed_optimizer and text_encoder_lr_value is not None:
            logger.warning("text_encoder_lr will be ignored when using DeepSpeed optimizers.")
            text_encoder_lr_value = None
        text_encoder_params: list[torch.nn.Parameter] = []
        text_encoder_param_ids: set[int] = set()
        if getattr(self.config, "train_text_encoder", False):
            for text_encoder in self.model.text_encoders:
                if text_encoder is None:
                    continue
                if "t5" in str(text_encoder.__class__).lower():
                    logger.warning(f"{text_encoder.__class__} does not support finetuning, skipping model.")
                    continue
                text_encoder_params.extend([p for p in text_encoder.parameters() if p.requires_grad])
            text_encoder_param_ids = {id(p) for p in text_encoder_params}

        # Initialize the optimizer
        optimizer_args_from_config, optimizer_class = determine_optimizer_class_with_config(
            args=self.config,
            use_deepspeed_optimizer=self.config.use_deepspeed_optimizer,
            is_quantized=self.config.is_quantized,
            enable_adamw_bf16=self.config.enable_adamw_bf16,
        )
        extra_optimizer_args.update(optimizer_args_from_config)

        self.params_to_optimize = determine_params_to_optimize(
            args=self.config,
            model=self.model,
            model_type_label=self.config.model_type_label,
            lycoris_wrapped_network=self.lycoris_wrapped_network,
        )

        def _filter_params(exclude_param_ids: set[int], params):
            filtered = []
            for entry in params:
                if isinstance(entry, dict):
                    group_params = entry.get("params", [])
                    if not isinstance(group_params, (list, tuple, set)):
                        group_params = [group_params]
                    retained = [p for p in group_params if id(p) not in exclude_param_ids]
                    if retained:
                        new_group = dict(entry)
                        new_group["params"] = retained
                        filtered.append(new_group)
                else:
                    if id(entry) not in exclude_param_ids:
                        filtered.append(entry)
            return filtered

        if use_separate_lyrics_opt and embedder_param_ids:
            self.params_to_optimize = _filter_params(embedder_param_ids, self.params_to_optimize)

        if text_encoder_lr_value is not None and text_encoder_params:
            self.params_to_optimize = _filter_params(text_encoder_param_ids, self.params_to_optimize)
            if self.params_to_optimize and not isinstance(self.params_to_optimize[0], dict):
                self.params_to_optimize = [{"params": self.params_to_optimize}]
            self.params_to_optimize.append({"params": text_encoder_params, "lr": text_encoder_lr_value})
        elif text_encoder_lr_value is not None and not text_encoder_params:
            logger.warning("text_encoder_lr provided but no trainable text encoder parameters were found.")

        if embedder_lr_value is not None and embedder_params and not use_separate_lyrics_opt:
            self.params_to_optimize = _filter_params(embedder_param_ids, self.params_to_optimize)
            if self.params_to_optimize and not isinstance(self.params_to_optimize[0], dict):
                self.params_to_optimize = [{"params": self.params_to_optimize}]
            self.params_to_optimize.append({"params": embedder_params, "lr": embedder_lr_value})
        # Ensure embedder parameters are still optimized when training is enabled without custom LR/optimizer.
        if embedder_params and not use_separate_lyrics_opt and embedder_lr_value is None:
            current_param_ids = {id(p) for p in _flatten_parameters(self.params_to_optimize)}
            missing = [p for p in embedder_params if id(p) not in current_param_ids]
            if missing:
                if self.params_to_optimize and isinstance(self.params_to_optimize[0], dict):
                    self.params_to_optimize.append({"params": missing})
                else:
                    self.params_to_optimize.extend(missing)

        AttentionBackendController.attach_parameter_sink(self.params_to_optimize)
        logger.info(f"Connecting optimizer to {trainable_parameter_count(self.params_to_optimize)} trainable parameters")

        if optimizer_class is AdamWBF16:
            if getattr(self.config, "weight_dtype", None) != torch.bfloat16:
                logger.warning(
                    "AdamW_BF16 requires bf16 weights. Adjusting weight dtype from %s to torch.bfloat16.",
                    getattr(self.config, "weight_dtype", None),
                )
                self.config.weight_dtype = torch.bfloat16
            self._ensure_parameter_dtype(self.params_to_optimize, torch.bfloat16, optimizer_name="adamw_bf16")

        if self.config.use_deepspeed_optimizer:
            logger.info(
                f"DeepSpeed Optimizer arguments, weight_decay={self.config.adam_weight_decay} eps={self.config.adam_epsilon}, extra_arguments={extra_optimizer_args}"
            )
            self.optimizer = create_optimizer_with_param_groups(
                self.model.get_trained_component(unwrap_model=False),
                optimizer_class,
                optimizer_parameters={
                    **extra_optimizer_args,
                    "weight_decay": self.config.adam_weight_decay,
                    "eps": self.config.adam_epsilon,
                },  # Not sure which should have priority
                use_parameter_groups=True,  # Enable weight decay separation
                cpu_offload_config=(
                    {"offload_mechanism": self.config.optimizer_offload_mechanism}
                    if hasattr(self.config, "optimizer_offload_mechanism") and self.config.optimizer_offload_mechanism
                    else None
                ),
            )
        else:
            logger.info(f"Optimizer arguments={extra_optimizer_args}")
            self.optimizer = cpu_offload_optimizer(
                params_to_optimize=self.params_to_optimize,
                optimizer_cls=optimizer_class,
                optimizer_parameters=extra_optimizer_args,
                fused=self.config.fuse_optimizer,
                offload_gradients=self.config.optimizer_offload_gradients,
                offload_mechanism=self.config.optimizer_cpu_offload_method,
            )

        patch_prodigy_for_fsdp2_dtensor(self.optimizer, self.config)
        self._register_optimizer_attention_params(self.optimizer)
        AttentionBackendController.bind_optimizer(self.optimizer)
        if is_optimi_available and self.config.optimizer_release_gradients and "optimi" in self.config.optimizer:
            logger.warning(
                "Marking model for gradient release. This feature is experimental, and may use more VRAM or not work."
            )
            prepare_for_gradient_release(self.model.get_trained_component(), self.optimizer)

        if use_separate_lyrics_opt and embedder_params:
            lyrics_optimizer_name = getattr(self.config, "lyrics_embedder_optimizer", None) or self.config.optimizer
            lyrics_lr = embedder_lr_value if embedder_lr_value is not None else self.config.learning_rate
            lyrics_config = copy.copy(self.config)
            lyrics_config.optimizer = lyrics_optimizer_name
            lyrics_config.learning_rate = lyrics_lr
            lyrics_config.is_schedulefree = is_lr_schedulefree(lyrics_optimizer_name)
            lyrics_optimizer_args, lyrics_optimizer_class = determine_optimizer_class_with_config(
                args=lyrics_config,
                use_deepspeed_optimizer=False,
                is_quantized=self.config.is_quantized,
                enable_adamw_bf16=self.config.enable_adamw_bf16,
            )
            lyrics_extra_args = {"lr": lyrics_lr}
            lyrics_extra_args.update(lyrics_optimizer_args)
            if lyrics_optimizer_class is AdamWBF16 and getattr(self.config, "weight_dtype", None) != torch.bfloat16:
                logger.warning("Casting lyrics embedder parameters to bf16 for AdamWBF16 compatibility.")
                self._ensure_parameter_dtype(embedder_params, torch.bfloat16, optimizer_name="lyrics_embedder_adamw_bf16")
            self.sidecar_optimizer = cpu_offload_optimizer(
                params_to_optimize=embedder_params,
                optimizer_cls=lyrics_optimizer_class,
                optimizer_parameters=lyrics_extra_args,
                fused=self.config.fuse_optimizer,
                offload_gradients=self.config.optimizer_offload_gradients,
                offload_mechanism=self.config.optimizer_cpu_offload_method,
            )
            patch_prodigy_for_fsdp2_dtensor(self.sidecar_optimizer, lyrics_config)
            self.sidecar_is_schedulefree = is_lr_schedulefree(lyrics_optimizer_name)
            logger.info(
                "Configured lyrics embedder optimizer with %s parameters",
                trainable_parameter_count(embedder_params),
            )

        if self._ramtorch_enabled():
            self._setup_ramtorch_zero_state()

    def init_lr_scheduler(self):
        self.sidecar_lr_scheduler = None
        self.sidecar_scheduler_disabled = False
        self.config.is_schedulefree = is_lr_schedulefree(self.config.optimizer)
        self.config.is_lr_scheduler_disabled = (
            is_lr_scheduler_disabled(self.config.optimizer) or self.config.use_deepspeed_scheduler
        )
        if self.config.is_schedulefree:
            logger.info("Using experimental ScheduleFree optimiser..")

        def _init_lyrics_scheduler():
            if self.sidecar_optimizer is None:
                return
            lyrics_scheduler_name = getattr(self.config, "lyrics_embedder_lr_scheduler", None) or getattr(
                self.config, "lr_scheduler", None
            )
            lyrics_optimizer_name = getattr(self.config, "lyrics_embedder_optimizer", None) or getattr(
                self.config, "optimizer", None
            )
            self.sidecar_is_schedulefree = is_lr_schedulefree(lyrics_optimizer_name)
            lyrics_config = copy.copy(self.config)
            lyrics_config.optimizer = lyrics_optimizer_name
            lyrics_config.lr_scheduler = lyrics_scheduler_name
            lyrics_config.is_schedulefree = self.sidecar_is_schedulefree
            self.sidecar_scheduler_disabled = (
                is_lr_scheduler_disabled(lyrics_optimizer_name) or self.config.use_deepspeed_scheduler
            )
            if self.sidecar_is_schedulefree:
                logger.info("Using experimental ScheduleFree optimiser for lyrics embedder..")
            if self.sidecar_scheduler_disabled:
                logger.info("Disabling lyrics embedder LR scheduler.")
                if torch.backends.mps.is_available():
                    self.sidecar_lr_scheduler = None
                else:
                    self.sidecar_lr_scheduler = accelerate.utils.DummyScheduler(
                        self.sidecar_optimizer,
                        total_num_steps=self.config.max_train_steps,
                        warmup_num_steps=self.config.lr_warmup_steps,
                    )
                return
            self.sidecar_lr_scheduler = get_lr_scheduler(
                lyrics_config,
                self.sidecar_optimizer,
                self.accelerator,
                logger,
                global_step=self.state["global_step"],
                use_deepspeed_scheduler=False,
            )
            if hasattr(self.sidecar_lr_scheduler, "num_update_steps_per_epoch"):
                self.sidecar_lr_scheduler.num_update_steps_per_epoch = self.config.num_update_steps_per_epoch
            if hasattr(self.sidecar_lr_scheduler, "last_step"):
                self.sidecar_lr_scheduler.last_step = self.state.get("global_resume_step", 0)

        if self.config.is_lr_scheduler_disabled:
            # we don't use LR schedulers with schedulefree optimisers
            logger.info("Optimiser cannot use an LR scheduler, so we are disabling it.")
            lr_scheduler = None
            logger.info(f"Using dummy learning rate scheduler")
            if torch.backends.mps.is_available():
                lr_scheduler = None
            else:
                lr_scheduler = accelerate.utils.DummyScheduler(
                    self.optimizer,
                    total_num_steps=self.config.max_train_steps,
                    warmup_num_steps=self.config.lr_warmup_steps,
                )
            _init_lyrics_scheduler()
            return lr_scheduler

        logger.info(
            f"Loading {self.config.lr_scheduler} learning rate scheduler with {self.config.lr_warmup_steps} warmup steps"
        )
        lr_scheduler = get_lr_scheduler(
            self.config,
            self.optimizer,
            self.accelerator,
            logger,
            global_step=self.state["global_step"],
            use_deepspeed_scheduler=False,
        )
        if hasattr(lr_scheduler, "num_update_steps_per_epoch"):
            lr_scheduler.num_update_steps_per_epoch = self.config.num_update_steps_per_epoch
        if hasattr(lr_scheduler, "last_step"):
            lr_scheduler.last_step = self.state.get("global_resume_step", 0)

        _init_lyrics_scheduler()
        return lr_scheduler

    def init_ema_model(self):
        # Create EMA for the model.
        self.ema_model = None
        if not self.config.use_ema:
            return
        # this runs on all processes to ensure shapes are aligned.
        self.model.pre_ema_creation()
        fsdp_version = getattr(self.config, "fsdp_version", 1)
        fsdp_enabled = getattr(self.config, "fsdp_enable", False) or getattr(self.config, "use_fsdp", False)
        is_fsdp2_run = fsdp_enabled and fsdp_version == 2 and self.accelerator.distributed_type == DistributedType.FSDP

        if is_fsdp2_run and getattr(self.config, "ema_cpu_only", False):
            raise RuntimeError(
                "ema_cpu_only is not supported with FSDP2. "
                "FSDP2 EMA shadows are DTensors and must remain on the accelerator."
            )
        if is_fsdp2_run and getattr(self.config, "ema_device", "cpu") != "accelerator":
            logger.warning(
                "FSDP2 EMA shadows are DTensors and must remain on the accelerator. " "Using ema_device='accelerator'."
            )
            self.config.ema_device = "accelerator"

        should_log = self.accelerator.is_main_process
        # TwinFlow requires EMA on all ranks for teacher passes; create EMA everywhere when enabled.
        twinflow_requires_full_rank = bool(getattr(self.config, "twinflow_enabled", False))
        instantiate_on_rank = should_log or is_fsdp2_run or twinflow_requires_full_rank
        if should_log:
            logger.info("Using EMA. Creating EMAModel.")

        ema_model_cls = None
        ema_model_config = None
        if self.config.controlnet:
            ema_model_cls = self.controlnet.__class__
            ema_model_config = self.controlnet.config
        elif self.model.get_trained_component() is not None:
            ema_model_cls = self.model.get_trained_component().__class__
            ema_model_config = self.model.get_trained_component().config
        else:
            raise ValueError(
                f"Please open a bug report or disable EMA. Unknown EMA model family: {self.config.model_family}"
            )

        if instantiate_on_rank:
            self.ema_model = EMAModel(
                self.config,
                self.accelerator,
                parameters=self._get_trainable_parameters(),
                model_cls=ema_model_cls,
                model_config=ema_model_config,
                decay=self.config.ema_decay,
                foreach=not self.config.ema_foreach_disable,
            )
            if should_log:
                logger.info(f"EMA model creation completed with {self.ema_model.parameter_count():,} parameters")

        self.accelerator.wait_for_everyone()
        # same about running on all processes to ensure alignment.
        # Pass EMA model reference to the model for TwinFlow teacher access
        self.model.ema_model = self.ema_model
        self.model.post_ema_creation()
        self._place_ema_model(is_fsdp2_run=is_fsdp2_run)

    def _place_ema_model(self, *, is_fsdp2_run: bool) -> None:
        if self.ema_model is None or is_fsdp2_run:
            return

        if self.config.ema_device == "accelerator":
            logger.info("Moving EMA model weights to accelerator...")
        self.ema_model.to(
            (self.accelerator.device if self.config.ema_device == "accelerator" else "cpu"),
            dtype=self.config.weight_dtype,
        )

        if self.config.ema_device == "cpu" and not self.config.ema_cpu_only:
            logger.info("Pinning EMA model weights to CPU...")
            try:
                self.ema_model.pin_memory()
            except Exception as e:
                self._emit_event(
                    notification_event(
                        message=f"Failed to pin EMA to CPU: {e}",
                        severity="warning",
                        job_id=self.job_id,
                    )
                )
                logger.error(f"Failed to pin EMA model to CPU: {e}")

    def init_hooks(self):
        from simpletuner.helpers.training.save_hooks import SaveHookManager

        self.model_hooks = SaveHookManager(
            args=self.config,
            model=self.model,
            ema_model=self.ema_model,
            accelerator=self.accelerator,
            use_deepspeed_optimizer=self.config.use_deepspeed_optimizer,
        )
        self.accelerator.register_save_state_pre_hook(self.model_hooks.save_model_hook)
        self.accelerator.register_load_state_pre_hook(self.model_hooks.load_model_hook)

    def init_prepare_models(self, lr_scheduler):
        # Prepare everything with our `accelerator`.
        logger.info("Preparing models..")

        # TODO: Review if this is still required - added January 2024 as temporary solution.
        self.train_dataloaders = []
        for _, backend in StateTracker.get_data_backends().items():
            if "train_dataloader" not in backend:
                continue
            self.train_dataloaders.append(backend["train_dataloader"])
            break
        if len(self.train_dataloaders) == 0:
            logger.error("For some reason, no dataloaders were configured.")
            sys.exit(0)
        if self.config.disable_accelerator:
            logger.warning("Because SIMPLETUNER_DISABLE_ACCELERATOR is set, we will not prepare the accelerator.")
            return
        logger.info("Loading our accelerator...")
        if torch.backends.mps.is_available():
            self.accelerator.native_amp = False
        # Send to Discord but don't emit event (lifecycle event below will handle that)
        self._send_webhook_msg(message="Preparing model components...", emit_event=False)
        self._emit_event(
            lifecycle_stage_event(
                key="init_prepare_models",
                label="Preparing model components",
                status="running",
                message="Preparing model components",
                job_id=self.job_id,
            )
        )
        primary_model = self.model.get_trained_component(unwrap_model=False)
        if hasattr(self.model, "before_accelerator_prepare"):
            self.model.before_accelerator_prepare()
        apply_standalone_context_parallel(self.accelerator, primary_model, self._context_parallel_topology)
        attach_shared_ramtorch_parameters = None
        if self._ramtorch_distributed() and primary_model is not None:
            ramtorch_utils.ensure_available()
            from simpletuner.helpers.ramtorch.utils import (
                attach_shared_ramtorch_parameters as attach_shared_ramtorch_parameters,
            )

            ignored = ramtorch_utils.mark_ddp_ignore_params(primary_model)
            if ignored:
                logger.info("Marking %s RamTorch parameters to ignore for DDP.", ignored)
            attached = attach_shared_ramtorch_parameters(primary_model)
            if attached:
                logger.info("Attached %s shared RamTorch parameters across ranks.", attached)
        if primary_model is not None and "torchao" in str(getattr(self.config, "base_model_precision", "")):
            ignored = mark_torchao_ddp_ignore_params(primary_model)
            if ignored:
                logger.info("Marking %s frozen TorchAO tensors to ignore for DDP.", ignored)
        if primary_model is not None and getattr(self.config, "base_model_precision", "") in MANUAL_FP8_NATIVE_PRESETS:
            ignored = mark_fp8_native_ddp_ignore_params(primary_model)
            if ignored:
                logger.info("Marking %s native FP8 buffers to ignore for DDP.", ignored)
        if (
            primary_model is not None
            and getattr(self.config, "base_model_precision", "") in MANUAL_TRANSFORMERENGINE_PRESETS
        ):
            ignored = mark_transformerengine_ddp_ignore_params(primary_model)
            if ignored:
                logger.info("Marking %s TransformerEngine FP8 tensors to ignore for DDP.", ignored)
        if getattr(self.config, "use_fsdp", False):
            moved_param_count = 0
            for param in primary_model.parameters():
                if param.device.type != "cpu":
                    param.data = param.data.to("cpu")
                    if param.grad is not None:
                        param.grad = None
                    moved_param_count += 1
            if moved_param_count:
                logger.info(
                    "Moved %s parameters back to CPU before Accelerator.prepare for FSDP sharding.", moved_param_count
                )
        try:
            first_param = next(primary_model.parameters())
            logger.info("Primary model param device before Accelerator.prepare: %s", first_param.device)
        except StopIteration:
            logger.warning("Primary model has no parameters when preparing accelerator.")
        self.lr_scheduler = lr_scheduler
        self._finalize_deepspeed_config_auto_values(primary_model)
        self._report_cuda_usage_if_requested("before_accelerator_prepare")
        prepare_targets = [primary_model]
        prepared_labels = ["primary_model"]
        if lr_scheduler is not None:
            prepare_targets.append(lr_scheduler)
            prepared_labels.append("lr_scheduler")
        prepare_targets.append(self.optimizer)
        prepared_labels.append("optimizer")
        if self.sidecar_optimizer is not None:
            prepare_targets.append(self.sidecar_optimizer)
            prepared_labels.append("sidecar_optimizer")
        if self.sidecar_lr_scheduler is not None:
            prepare_targets.append(self.sidecar_lr_scheduler)
            prepared_labels.append("sidecar_lr_scheduler")
        prepare_targets.append(self.train_dataloaders[0])
        prepared_labels.append("train_dataloader")

        # Determine if we should skip automatic device placement for the model.
        # This is necessary when using memory optimization techniques that keep
        # parts of the model on CPU (block swap, ramtorch, group offload).
        musubi_block_swap_active = (getattr(self.config, "musubi_blocks_to_swap", 0) or 0) > 0
        ramtorch_enabled = getattr(self.config, "ramtorch", False)
        group_offload_requested = bool(getattr(self.config, "enable_group_offload", False))
        skip_model_device_placement = musubi_block_swap_active or ramtorch_enabled or group_offload_requested
        if skip_model_device_placement:
            logger.info(
                "Skipping automatic device placement for primary model during accelerator.prepare() "
                "(musubi_block_swap=%s, ramtorch=%s, group_offload=%s)",
                musubi_block_swap_active,
                ramtorch_enabled,
                group_offload_requested,
            )
        # DeepSpeed handles device placement internally
        standalone_cp_prepare_config = None
        accelerator_state = getattr(self.accelerator, "state", None)
        hide_standalone_cp_from_accelerate_prepare = (
            self._context_parallel_topology is not None
            and self._context_parallel_topology.cp_size > 1
            and self._context_parallel_topology.dp_shard_size == 1
            and accelerator_state is not None
        )
        if hide_standalone_cp_from_accelerate_prepare:
            standalone_cp_prepare_config = getattr(accelerator_state, "parallelism_config", None)
            accelerator_state.parallelism_config = None
        try:
            if self.accelerator.distributed_type == DistributedType.DEEPSPEED:
                results = self.accelerator.prepare(*prepare_targets)
            else:
                device_placement = [
                    (False if label == "primary_model" and skip_model_device_placement else True)
                    for label in prepared_labels
                ]
                results = self.accelerator.prepare(*prepare_targets, device_placement=device_placement)
        finally:
            if hide_standalone_cp_from_accelerate_prepare:
                accelerator_state.parallelism_config = standalone_cp_prepare_config
        for label, prepared in zip(prepared_labels, results):
            if label == "primary_model":
                self.model.set_prepared_model(prepared)
                # If we skipped device placement for block swap, move the model incrementally
                if musubi_block_swap_active:
                    self._move_model_with_block_swap(prepared)
            elif label == "lr_scheduler":
                self.lr_scheduler = prepared
            elif label == "optimizer":
                self.optimizer = prepared
            elif label == "sidecar_optimizer":
                self.sidecar_optimizer = prepared
            elif label == "sidecar_lr_scheduler":
                self.sidecar_lr_scheduler = prepared
            elif label == "train_dataloader":
                self.train_dataloaders = [prepared]
        self._report_cuda_usage_if_requested("after_accelerator_prepare")

        idx_count = 0
        for _, backend in StateTracker.get_data_backends().items():
            if idx_count == 0 or "train_dataloader" not in backend:
                continue
            self.train_dataloaders.append(self.accelerator.prepare(backend["train_dataloader"]))
        idx_count = 0

        if "lora" in self.config.model_type and self.config.train_text_encoder:
            logger.info("Preparing text encoders for training.")
            if self.config.model_family == "sd3":
                logger.info("NOTE: The third text encoder is not trained for SD3.")
            if attach_shared_ramtorch_parameters is not None:
                for idx, encoder in enumerate((self.text_encoder_1, self.text_encoder_2), start=1):
                    if encoder is None:
                        continue
                    ignored = ramtorch_utils.mark_ddp_ignore_params(encoder)
                    if ignored:
                        logger.info("Marking %s RamTorch parameters to ignore for DDP on text_encoder_%s.", ignored, idx)
                    attached = attach_shared_ramtorch_parameters(encoder)
                    if attached:
                        logger.info("Attached %s shared RamTorch parameters across ranks on text_encoder_%s.", attached, idx)
            self.text_encoder_1, self.text_encoder_2 = self.accelerator.prepare(self.text_encoder_1, self.text_encoder_2)
        self._recalculate_training_steps()
        self.accelerator.wait_for_everyone()
        self._emit_event(
            lifecycle_stage_event(
                key="init_prepare_models",
                label="Preparing model components",
                status="completed",
                message="Completed preparing model components",
                current=1,
                total=1,
                percent=100,
                job_id=self.job_id,
            )
        )

    def prepare_model_for_inference(self) -> None:
        """Register the trained component with Accelerator without training state."""
        primary_model = self.model.get_trained_component(unwrap_model=False)
        if primary_model is None:
            raise ValueError("No trained model component is available for inference.")
        if hasattr(self.model, "before_accelerator_prepare"):
            self.model.before_accelerator_prepare()

        prepared_model = self.accelerator.prepare_model(primary_model, evaluation_mode=True)
        self.model.set_prepared_model(prepared_model)
        prepared_model.eval()

    def init_unload_vae(self):
        if (
            self.config.keep_vae_loaded
            or self.config.vae_cache_ondemand
            or getattr(self.config, "vae_cache_disable", False)
            or StateTracker.any_vae_cache_uses_ondemand()
        ):
            return
        memory_before_unload = self.stats_memory_used()
        self.model.unload_vae()
        for _, backend in StateTracker.get_data_backends().items():
            if "vaecache" in backend:
                backend["vaecache"].vae = None
        reclaim_memory()
        memory_after_unload = self.stats_memory_used()
        memory_saved = memory_after_unload - memory_before_unload
        logger.info(f"After nuking the VAE from orbit, we freed {abs(round(memory_saved, 2)) * 1024} MB of VRAM.")

    def init_delete_model_caches(self):
        """Delete model caches from disk after all models are loaded."""
        from simpletuner.helpers.models.common import delete_all_model_caches

        delete_all_model_caches(self.accelerator)

    def init_validations(self, preserve_text_encoders: bool = False):
        if (
            hasattr(self.accelerator, "state")
            and hasattr(self.accelerator.state, "deepspeed_plugin")
            and getattr(self.accelerator.state.deepspeed_plugin, "deepspeed_config", {})
            .get("zero_optimization", {})
            .get("stage")
            == 3
        ):
            logger.warning("Cannot run validations with DeepSpeed ZeRO stage 3. Disabling validation.")
            self.config.validation_disable = True
        # FSDP validation is now supported - we pass FSDP-wrapped models directly to pipelines
        # which transparently handle all-gather/reshard on each forward pass
        self.evaluation = None
        if self.config.validation_disable:
            return
        eval_step_interval = getattr(self.config, "eval_steps_interval", None)
        eval_epoch_interval = getattr(self.config, "eval_epoch_interval", None)

        def _normalize_interval(raw_value, cast):
            if raw_value in (None, "", "None"):
                return None
            try:
                value = cast(raw_value)
            except (TypeError, ValueError):
                return None
            return value if value > 0 else None

        eval_loss_disable = getattr(self.config, "eval_loss_disable", False)
        has_eval_schedule = bool(
            not eval_loss_disable
            and (_normalize_interval(eval_step_interval, int) or _normalize_interval(eval_epoch_interval, float))
        )
        if has_eval_schedule:
            from simpletuner.helpers.training.validation import Evaluation

            self.evaluation = Evaluation(accelerator=self.accelerator)
        model_evaluator = ModelEvaluator.from_config(args=self.config)
        weight_dtype = getattr(self.config, "weight_dtype", torch.float32)
        use_deepspeed_optimizer = getattr(self.config, "use_deepspeed_optimizer", False)
        self.validation = Validation(
            trainable_parameters=self._get_trainable_parameters,
            accelerator=self.accelerator,
            model=self.model,
            distiller=self.distiller,
            args=self.config,
            validation_prompt_metadata=self.validation_prompt_metadata,
            vae_path=getattr(self.config, "vae_path", None),
            weight_dtype=weight_dtype,
            embed_cache=StateTracker.get_default_text_embed_cache(),
            ema_model=getattr(self, "ema_model", None),
            model_evaluator=model_evaluator,
            is_deepspeed=use_deepspeed_optimizer,
            is_fsdp=self.config.use_fsdp,
            publishing_manager=self.publishing_manager,
        )
        if not preserve_text_encoders and not self.config.train_text_encoder and self.validation is not None:
            self.validation.clear_text_encoders()
        self.init_benchmark_base_model()
        self.accelerator.wait_for_everyone()

    def init_benchmark_base_model(self):
        if self.config.disable_benchmark or self.validation is None or self.validation.benchmark_exists("base_model"):
            # if we've disabled it or the benchmark exists, we will not do it again.
            # deepspeed zero3 can't do validations at all.
            return
        if self.config.validation_multigpu != "batch-parallel" and not self.accelerator.is_main_process:
            return
        logger.info("Benchmarking base model for comparison. Supply `--disable_benchmark: true` to disable this behaviour.")
        self._emit_event(
            lifecycle_stage_event(
                key="benchmark_base_model",
                label="Benchmarking base model",
                status="running",
                message="Base model benchmark begins",
                job_id=self.job_id,
            )
        )
        # we'll run validation on base model if it hasn't already.
        self.validation.run_validations(validation_type="base_model", step=0)
        self.validation.save_benchmark("base_model")
        self._emit_event(
            lifecycle_stage_event(
                key="benchmark_base_model",
                label="Benchmarking base model",
                status="completed",
                message="Base model benchmark completed",
                current=1,
                total=1,
                percent=100,
                job_id=self.job_id,
            )
        )

    def _publishing_config_has_s3(self) -> bool:
        publishing_config = getattr(self.config, "publishing_config", None)
        if publishing_config in (None, "", [], {}, "None"):
            return False
        if isinstance(publishing_config, dict):
            configs = [publishing_config]
        elif isinstance(publishing_config, (list, tuple)):
            configs = list(publishing_config)
        else:
            return False
        for entry in configs:
            if not isinstance(entry, dict):
                continue
            provider_name = str(entry.get("provider") or entry.get("type") or "").strip().lower()
            if provider_name in {"s3", "s3-compatible", "backblaze_b2", "b2"}:
                return True
        return False

    def _resume_path_is_remote(self, resume_path: str) -> bool:
        if not resume_path or resume_path in ("", "None", "latest"):
            return False
        if not self._publishing_config_has_s3():
            return False
        candidate = resume_path.strip()
        if candidate.startswith(("s3://", "r2://", "http://", "https://")):
            return True
        if candidate.startswith("/"):
            return not os.path.exists(candidate)
        if "/" in candidate:
            output_dir = getattr(self.config, "output_dir", None)
            if output_dir and os.path.exists(os.path.join(output_dir, candidate)):
                return False
            return True
        return False

    def _select_s3_provider_for_resume(self, resume_path: str) -> tuple[S3PublishingProvider, str]:
        publishing_config = getattr(self.config, "publishing_config", None)
        if publishing_config in (None, "", [], {}, "None"):
            raise ValueError("resume_from_checkpoint requires publishing_config for S3 access.")

        manager = self.publishing_manager or PublishingManager(publishing_config)
        providers = [provider for provider in manager.providers if isinstance(provider, S3PublishingProvider)]
        if not providers:
            raise ValueError("resume_from_checkpoint requires an S3 publishing provider.")

        candidate = resume_path.strip()
        is_relative = not candidate.startswith(("s3://", "r2://", "http://", "https://"))
        if is_relative and len(providers) > 1:
            raise ValueError("resume_from_checkpoint is relative but multiple S3 providers exist; use a full URI.")

        for provider in providers:
            try:
                key_prefix = provider.resolve_key_prefix(candidate)
            except ValueError:
                continue
            return provider, key_prefix

        raise ValueError("resume_from_checkpoint does not match any configured S3 provider.")

    def _validate_resume_manifest(self, manifest: dict[str, Any] | None) -> None:
        if not manifest or not isinstance(manifest, dict):
            return
        metadata = manifest.get("metadata")
        if not isinstance(metadata, dict):
            metadata = {}

        expected_family = str(getattr(self.config, "model_family", "") or "").strip().lower()
        expected_type = str(getattr(self.config, "model_type", "") or "").strip().lower()
        expected_flavour = (
            str(getattr(self.config, "model_flavour", getattr(self.config, "model_flavor", "")) or "").strip().lower()
        )
        expected_arch = None
        if getattr(self, "model_hooks", None) is not None:
            expected_arch = self.model_hooks.get_modelspec_architecture()

        manifest_family = str(metadata.get("model_family", "") or "").strip().lower()
        manifest_type = str(metadata.get("model_type", "") or "").strip().lower()
        manifest_flavour = str(metadata.get("model_flavour", metadata.get("model_flavor", "")) or "").strip().lower()
        manifest_arch = str(metadata.get("modelspec_architecture", metadata.get("modelspec.architecture", "")) or "").strip()

        if expected_family and manifest_family and expected_family != manifest_family:
            raise ValueError(f"Checkpoint model_family mismatch (expected {expected_family}, got {manifest_family}).")
        if expected_type and manifest_type and expected_type != manifest_type:
            raise ValueError(f"Checkpoint model_type mismatch (expected {expected_type}, got {manifest_type}).")
        if expected_flavour and manifest_flavour and expected_flavour != manifest_flavour:
            raise ValueError(f"Checkpoint model_flavour mismatch (expected {expected_flavour}, got {manifest_flavour}).")
        if expected_arch and manifest_arch and expected_arch != manifest_arch:
            raise ValueError(f"Checkpoint architecture mismatch (expected {expected_arch}, got {manifest_arch}).")
        if expected_arch and not manifest_arch:
            logger.warning("Checkpoint manifest missing architecture metadata; skipping architecture validation.")

    def _download_remote_checkpoint(self, resume_path: str) -> str:
        if not getattr(self.config, "output_dir", None):
            raise ValueError("output_dir is required to download remote checkpoints.")

        provider, key_prefix = self._select_s3_provider_for_resume(resume_path)
        checkpoint_name = os.path.basename(key_prefix.rstrip("/"))
        if not checkpoint_name:
            raise ValueError("resume_from_checkpoint must include a checkpoint directory name.")

        local_dir = os.path.join(self.config.output_dir, checkpoint_name)
        manifest = None
        if os.path.exists(os.path.join(local_dir, CHECKPOINT_MANIFEST_FILENAME)) and self.checkpoint_manager:
            manifest = self.checkpoint_manager.load_manifest(local_dir)
        if manifest is None:
            manifest = provider.download_checkpoint(
                key_prefix=key_prefix,
                local_dir=local_dir,
                manifest_filename=CHECKPOINT_MANIFEST_FILENAME,
            )
        manager = self.checkpoint_manager or CheckpointManager(self.config.output_dir)
        is_valid, error_message = manager.validate_checkpoint(checkpoint_name)
        if not is_valid:
            raise ValueError(f"Downloaded checkpoint is invalid: {error_message}")
        self._validate_resume_manifest(manifest)
        return local_dir

    def _build_checkpoint_manifest_metadata(self) -> dict[str, Any]:
        metadata = {
            "model_family": getattr(self.config, "model_family", None),
            "model_type": getattr(self.config, "model_type", None),
            "model_flavour": getattr(self.config, "model_flavour", getattr(self.config, "model_flavor", None)),
        }
        if getattr(self, "model_hooks", None) is not None:
            metadata["modelspec_architecture"] = self.model_hooks.get_modelspec_architecture()
        return {key: value for key, value in metadata.items() if value not in (None, "")}

    def _checkpoint_dir_is_in_output_dir(self, checkpoint_dir: str) -> bool:
        output_dir = getattr(self.config, "output_dir", None)
        if not output_dir:
            return False
        try:
            return os.path.commonpath([os.path.abspath(output_dir), os.path.abspath(checkpoint_dir)]) == os.path.abspath(
                output_dir
            )
        except ValueError:
            return False

    def _checkpoint_has_guard(self, checkpoint_name: str, checkpoint_dir: str) -> bool:
        if self.checkpoint_manager and self._checkpoint_dir_is_in_output_dir(checkpoint_dir):
            return self.checkpoint_manager.has_guard(checkpoint_name)
        return os.path.exists(os.path.join(checkpoint_dir, CHECKPOINT_GUARD_FILENAME))

    def _delete_invalid_resume_checkpoint(self, checkpoint_dir: str, reason: str) -> bool:
        checkpoint_name = os.path.basename(checkpoint_dir.rstrip(os.sep))
        if not checkpoint_name.startswith("checkpoint-"):
            logger.warning(f"Refusing to delete invalid resume path outside checkpoint naming: {checkpoint_dir}")
            return False
        if not self._checkpoint_dir_is_in_output_dir(checkpoint_dir):
            logger.warning(f"Refusing to delete invalid checkpoint outside output_dir: {checkpoint_dir}")
            return False

        logger.warning(f"Deleting invalid checkpoint {checkpoint_dir}: {reason}")
        self.checkpoint_state_remove(self.config.output_dir, checkpoint_name)
        return True

    def _delete_unguarded_latest_checkpoint(self, checkpoint_name: str, checkpoint_dir: str) -> bool:
        if self._checkpoint_has_guard(checkpoint_name, checkpoint_dir):
            return False
        latest_guarded = (
            self.checkpoint_manager.get_latest_checkpoint(require_guard=True) if self.checkpoint_manager else None
        )
        if latest_guarded in (None, checkpoint_name):
            return False
        return self._delete_invalid_resume_checkpoint(
            checkpoint_dir,
            f"missing checkpoint completion guard {CHECKPOINT_GUARD_FILENAME}",
        )

    def init_resume_checkpoint(self, lr_scheduler):
        # Potentially load in the weights and states from a previous save
        self.config.total_steps_remaining_at_start = self.config.max_train_steps
        self.state["current_epoch"] = self.state["first_epoch"]
        self.state["global_resume_step"] = self.state["global_step"] = StateTracker.get_global_step()
        StateTracker.set_global_resume_step(self.state["global_resume_step"])
        if not self.config.resume_from_checkpoint:
            logger.info(f"Not resuming from checkpoint.")
            return lr_scheduler
        resume_value = str(self.config.resume_from_checkpoint)
        delete_invalid_value = getattr(self.config, "delete_invalid_checkpoints", False)
        if isinstance(delete_invalid_value, unittest_mock.Mock):
            delete_invalid_value = False
        delete_invalid_checkpoints = bool(delete_invalid_value)
        resume_latest = resume_value == "latest"
        deleted_checkpoint_names: set[str] = set()

        while True:
            checkpoint_dir = None
            if resume_value != "latest" and self._resume_path_is_remote(resume_value):
                checkpoint_dir = self._download_remote_checkpoint(resume_value)
                path = os.path.basename(checkpoint_dir.rstrip("/"))
            elif resume_value != "latest":
                path = os.path.basename(resume_value.rstrip("/"))
            else:
                # Get the most recent checkpoint
                path = self.checkpoint_state_latest(self.config.output_dir)
                logger.info(f"Checking {path} for latest checkpoint.")

            if path is None:
                logger.info(
                    f"Checkpoint '{self.config.resume_from_checkpoint}' does not exist. Starting a new training run."
                )
                event = lifecycle_stage_event(
                    key="init_resume_checkpoint",
                    label="Resume Checkpoint",
                    status="completed",
                    message="No model to resume. Beginning fresh training run.",
                    job_id=self.job_id,
                )
                self._emit_event(event)

                self.config.resume_from_checkpoint = None
                return lr_scheduler

            if path in deleted_checkpoint_names:
                raise RuntimeError(f"Invalid checkpoint {path} was not removed; refusing to retry it.")

            if checkpoint_dir is None:
                checkpoint_dir = os.path.join(self.config.output_dir, path)

            if (
                delete_invalid_checkpoints
                and resume_latest
                and self._delete_unguarded_latest_checkpoint(path, checkpoint_dir)
            ):
                deleted_checkpoint_names.add(path)
                continue

            logger.info(f"Resuming from checkpoint {checkpoint_dir}")
            try:
                self.accelerator.load_state(checkpoint_dir)
            except Exception as exc:
                if not delete_invalid_checkpoints:
                    raise
                if not self._delete_invalid_resume_checkpoint(checkpoint_dir, str(exc)):
                    raise
                deleted_checkpoint_names.add(path)
                if resume_latest:
                    logger.warning("Trying the next latest checkpoint after deleting the invalid checkpoint.")
                    continue
                raise
            break

        # Re-apply block swap device placement after checkpoint load
        # (checkpoint may have restored model to GPU, overwriting our block swap setup)
        musubi_block_swap_active = (getattr(self.config, "musubi_blocks_to_swap", 0) or 0) > 0
        if musubi_block_swap_active:
            prepared_model = self.model.get_trained_component(unwrap_model=False)
            if prepared_model is not None:
                logger.info("Re-applying block swap device placement after checkpoint load")
                self._move_model_with_block_swap(prepared_model)

        AttentionBackendController.on_load_checkpoint(checkpoint_dir)
        if getattr(self, "distiller", None) is not None:
            logger.info(f"Loading DCM checkpoint states..")
            self.distiller.on_load_checkpoint(checkpoint_dir)
        try:
            if "constant" == self.config.lr_scheduler and not self.config.is_schedulefree:
                for g in self.optimizer.param_groups:
                    if "lr" in g:
                        g["lr"] = self.config.learning_rate
                for k, v in lr_scheduler.state_dict().items():
                    if k in ("base_lrs", "_last_lr"):
                        v[0] = self.config.learning_rate
        except Exception as e:
            event = notification_event(
                message="Could not update learning rate scheduler LR value.",
                severity="warning",
                job_id=self.job_id,
            )
            self._emit_event(event)
            logger.error(
                f"Could not update lr_scheduler {self.config.lr_scheduler} learning rate to {self.config.learning_rate} upon resume: {e}"
            )

        event = lifecycle_stage_event(
            key="init_resume_checkpoint",
            label="Resume Checkpoint",
            status="running",
            message=f"Resuming model: {path}",
            job_id=self.job_id,
        )
        self._emit_event(event)
        training_state_filename = f"training_state.json"
        if get_rank() > 0:
            training_state_filename = f"training_state-{get_rank()}.json"
        for _, backend in StateTracker.get_data_backends().items():
            if "sampler" in backend:
                backend["sampler"].load_states(
                    state_path=os.path.join(
                        self.config.output_dir,
                        path,
                        training_state_filename,
                    ),
                )
        self.state["global_resume_step"] = self.state["global_step"] = StateTracker.get_global_step()
        StateTracker.set_global_resume_step(self.state["global_resume_step"])
        if hasattr(self.model, "load_flow_custom_timestep_state"):
            self.model.load_flow_custom_timestep_state(
                checkpoint_dir,
                fallback_global_step=self.state["global_resume_step"],
            )
        elif hasattr(self.model, "reset_flow_custom_timestep_cursor"):
            self.model.reset_flow_custom_timestep_cursor(self.state["global_resume_step"])
        training_state_in_ckpt = StateTracker.get_training_state()
        event = lifecycle_stage_event(
            key="init_resume_checkpoint",
            label="Resume Checkpoint",
            status="completed",
            message=f"Resumed from global_step {self.state['global_resume_step']}",
            job_id=self.job_id,
            extra=training_state_in_ckpt,
        )
        self._emit_event(event)
        logger.debug(f"Training state inside checkpoint: {training_state_in_ckpt}")
        if hasattr(lr_scheduler, "last_step"):
            lr_scheduler.last_step = self.state["global_resume_step"]
        logger.info(f"Resuming from global_step {self.state['global_resume_step']}.")

        # Log the current state of each data backend.
        for _, backend in StateTracker.get_data_backends().items():
            if "sampler" in backend:
                backend["sampler"].log_state()
        # We store the number of dataset resets that have occurred inside the checkpoint.
        self.state["first_epoch"] = StateTracker.get_epoch()
        if self.state["first_epoch"] > 1 or self.state["global_resume_step"] > 1:
            self.config.total_steps_remaining_at_start -= self.state["global_resume_step"]
            logger.debug(
                f"Resuming from epoch {self.state['first_epoch']}, which leaves us with {self.config.total_steps_remaining_at_start}."
            )
        self.state["current_epoch"] = self.state["first_epoch"]
        StateTracker.set_epoch(self.state["current_epoch"])
        if hasattr(lr_scheduler, "last_epoch"):
            lr_scheduler.last_epoch = (
                training_state_in_ckpt.get("epoch_step", self.state.get("global_resume_step", 1))
                * self.accelerator.num_processes
            )

        if self.state["current_epoch"] > self.config.num_train_epochs + 1 and self.config.strict_epoch_limit:
            logger.info(
                f"Reached the end ({self.state['current_epoch']} epochs) of our training run ({self.config.num_train_epochs} epochs). This run will do zero steps."
            )
        self.accelerator.wait_for_everyone()

        if self.optimizer is not None and self.config.optimizer == "prodigy":
            # fix the device assignment for the prodigy optimizer parameters
            # use getattr with default False to handle optimizers without split_groups attribute
            split_groups = getattr(self.optimizer.optimizer, "split_groups", False)
            for group in self.optimizer.param_groups if split_groups else self.optimizer.param_groups[:1]:
                p = group["params"][0]
                group["running_d_numerator"] = group["running_d_numerator"].to(p.device)
                group["running_d_denom"] = group["running_d_denom"].to(p.device)
                if "use_focus" not in group:
                    group["use_focus"] = False

        # Emit completion event for resume checkpoint stage
        if self.config.resume_from_checkpoint:
            completion_event = lifecycle_stage_event(
                key="init_resume_checkpoint",
                label="Resuming checkpoint",
                status="completed",
                percent=100,
                current=1,
                total=1,
                job_id=self.job_id,
                severity="info",
            )
            self._emit_event(completion_event, message_level="info")

        return lr_scheduler

    def _build_init_tracker_kwargs(self, tracker_run_name: str, public_args_hash: str) -> Dict[str, Dict[str, object]]:
        """Prepare tracker-specific init kwargs for the active logging backends."""
        loggers = getattr(self.accelerator, "log_with", None)
        if not loggers:
            return {}

        tracker_names = set()
        if not isinstance(loggers, (list, tuple, set)):
            loggers = [loggers]

        for tracker in loggers:
            if isinstance(tracker, GeneralTracker):
                continue
            candidate = None
            if isinstance(tracker, str):
                candidate = tracker
            elif hasattr(tracker, "value") and isinstance(tracker.value, str):
                candidate = tracker.value
            elif hasattr(tracker, "name") and isinstance(tracker.name, str):
                candidate = tracker.name
            if candidate:
                normalized = candidate.strip().lower()
                if normalized:
                    tracker_names.add(normalized)

        init_kwargs: Dict[str, Dict[str, object]] = {}
        if "wandb" in tracker_names:
            init_kwargs["wandb"] = {
                "name": tracker_run_name,
                "id": f"{public_args_hash}",
                "resume": "allow",
                "allow_val_change": True,
            }
        if "swanlab" in tracker_names:
            init_kwargs["swanlab"] = {
                "experiment_name": tracker_run_name,
                "id": f"{public_args_hash}",
                "resume": "allow",
            }
        return init_kwargs

    def _serialize_pipeline_quantization_config(self, payload: Any, _seen: set[int]) -> dict[str, Any]:
        serialized: dict[str, Any] = {
            "quant_backend": getattr(payload, "quant_backend", None),
            "quant_kwargs": self._sanitize_for_json(getattr(payload, "quant_kwargs", None), _seen),
            "components_to_quantize": self._sanitize_for_json(getattr(payload, "components_to_quantize", None), _seen),
        }
        quant_mapping = getattr(payload, "quant_mapping", None)
        if quant_mapping is not None:
            serialized["quant_mapping"] = self._sanitize_for_json(quant_mapping, _seen)
        return serialized

    def _sanitize_for_json(self, payload: Any, _seen: set[int] | None = None) -> Any:
        if _seen is None:
            _seen = set()

        if payload is None or isinstance(payload, (str, int, float, bool)):
            return payload

        if isinstance(payload, Path):
            return str(payload)

        if isinstance(payload, Enum):
            return payload.value

        if isinstance(payload, torch.dtype):
            return str(payload)

        if isinstance(payload, torch.device):
            return str(payload)

        obj_id = id(payload)
        if obj_id in _seen:
            return f"<cycle:{payload.__class__.__name__}>"
        _seen.add(obj_id)

        if isinstance(payload, Mapping):
            return {str(key): self._sanitize_for_json(value, _seen) for key, value in payload.items()}

        if isinstance(payload, (list, tuple, set)):
            return [self._sanitize_for_json(item, _seen) for item in payload]

        if payload.__class__.__name__ == "PipelineQuantizationConfig":
            return self._serialize_pipeline_quantization_config(payload, _seen)

        if hasattr(payload, "to_dict") and callable(payload.to_dict):
            return self._sanitize_for_json(payload.to_dict(), _seen)

        if hasattr(payload, "__dict__"):
            try:
                return self._sanitize_for_json(vars(payload), _seen)
            except TypeError:
                pass

        raise TypeError(f"Object of type {payload.__class__.__name__} is not JSON serializable")

    def init_trackers(self):
        # We need to initialize the trackers we use, and also store our configuration.
        # The trackers initializes automatically on the main process.
        self.guidance_values_table = None
        if self.accelerator.is_main_process:
            # Copy args into public_args:
            public_args = copy.deepcopy(self.config)
            delattr(public_args, "accelerator_project_config")
            delattr(public_args, "process_group_kwargs")
            delattr(public_args, "webhook_config")
            if hasattr(public_args, "publishing_config"):
                delattr(public_args, "publishing_config")
            delattr(public_args, "weight_dtype")
            delattr(public_args, "base_weight_dtype")
            if hasattr(public_args, "vae_kwargs"):
                delattr(public_args, "vae_kwargs")
            if hasattr(public_args, "sana_complex_human_instruction"):
                delattr(public_args, "sana_complex_human_instruction")

            public_args_payload = self._sanitize_for_json(vars(public_args))
            # Hash the contents of public_args to reflect a deterministic ID for a single set of params:
            public_args_hash = hashlib.md5(json.dumps(public_args_payload, sort_keys=True).encode("utf-8")).hexdigest()
            project_name, tracker_run_name = self._resolve_tracker_identifiers()
            try:
                init_kwargs = self._build_init_tracker_kwargs(tracker_run_name, public_args_hash)
                self.accelerator.init_trackers(
                    project_name,
                    config=public_args_payload,
                    init_kwargs=init_kwargs,
                )
            except Exception as e:
                if "Object has no attribute 'disabled'" in repr(e):
                    logger.warning("WandB is disabled, and Accelerate was not quite happy about it.")
                    self.accelerator.trackers = []
                else:
                    logger.error(f"Could not initialize trackers: {e}")
                    event = error_event(
                        message=f"Could not initialize trackers. Continuing without. {e}",
                        job_id=self.job_id,
                    )
                    self._emit_event(event)
            event = notification_event(
                message="Training configuration initialized",
                title="Training Config",
                job_id=self.job_id,
                data=public_args_payload,
            )
            self._emit_event(event)

    def resume_and_prepare(self):
        self.init_optimizer()
        lr_scheduler = self.init_lr_scheduler()
        self.init_hooks()
        self.init_prepare_models(lr_scheduler=lr_scheduler)
        self.init_ema_model()
        if self.model_hooks is not None:
            self.model_hooks.ema_model = self.ema_model
        if getattr(self, "validation", None) is not None:
            self.validation.ema_model = self.ema_model
        lr_scheduler = self.init_resume_checkpoint(lr_scheduler=lr_scheduler)
        self.init_post_load_freeze()

    def enable_sageattention_inference(self):
        AttentionBackendController.apply(self.config, AttentionPhase.EVAL)

    def disable_sageattention_inference(self):
        AttentionBackendController.apply(self.config, AttentionPhase.TRAIN)

    def enable_sageattention(self):
        AttentionBackendController.apply(self.config, AttentionPhase.TRAIN)

    def disable_sageattention(self):
        AttentionBackendController.restore_default()

    def _move_model_with_block_swap(self, wrapped_model):
        """
        Move model to GPU incrementally while respecting block swap configuration.
        This avoids OOM by moving modules one at a time and immediately offloading
        managed blocks to CPU.
        """
        target_device = self.accelerator.device
        blocks_to_swap = getattr(self.config, "musubi_blocks_to_swap", 0) or 0

        # Unwrap the model to get the actual transformer
        model = wrapped_model
        while hasattr(model, "module"):
            model = model.module

        # Get the block swap manager if it exists
        block_swap_manager = getattr(model, "_musubi_block_swap", None)

        # Collect all transformer blocks in the same order as the musubi manager
        # For Kandinsky: text_transformer_blocks + visual_transformer_blocks
        # For Flux: transformer_blocks + single_transformer_blocks
        # For ERNIE/Z-Image-style single stream models: layers
        text_blocks = list(getattr(model, "text_transformer_blocks", []) or [])
        visual_blocks = list(getattr(model, "visual_transformer_blocks", []) or [])
        # For Flux-style: double blocks first, then single blocks (matching combined_blocks order)
        double_blocks = list(getattr(model, "transformer_blocks", []) or [])
        single_blocks = list(getattr(model, "single_transformer_blocks", []) or [])
        layer_blocks = list(getattr(model, "layers", []) or [])

        all_blocks = text_blocks + visual_blocks + double_blocks + single_blocks + layer_blocks
        total_blocks = len(all_blocks)

        # Determine which block indices are managed by block swap
        managed_indices = set()
        if block_swap_manager is not None:
            managed_indices = block_swap_manager.block_indices
        elif blocks_to_swap > 0 and total_blocks > 0:
            # If no manager yet, compute which blocks would be managed
            # Block swap typically manages the last N blocks
            managed_indices = set(range(max(0, total_blocks - blocks_to_swap), total_blocks))

        logger.info(
            "Moving model to %s with block swap: %d total blocks, %d managed (staying on CPU)",
            target_device,
            total_blocks,
            len(managed_indices),
        )

        # Move non-block children first (embeddings, projections, output layers, etc.)
        block_module_names = {
            "text_transformer_blocks",
            "visual_transformer_blocks",
            "single_transformer_blocks",
            "transformer_blocks",
            "layers",
        }
        for name, child in model.named_children():
            if name not in block_module_names:
                child.to(target_device)
                torch.cuda.empty_cache()

        # Move non-managed blocks to GPU, keep managed blocks on CPU
        for idx, block in enumerate(all_blocks):
            if idx in managed_indices:
                # Keep on CPU - block swap will stream it in during forward
                logger.debug("Block %d: keeping on CPU (managed by block swap)", idx)
            else:
                block.to(target_device)
                torch.cuda.empty_cache()

        logger.info("Model moved to %s with block swap active", target_device)

    def move_models(self, destination: str = "accelerator"):
        is_accelerator_target = destination == "accelerator"
        fsdp_active = bool(getattr(self.config, "use_fsdp", False))
        fsdp_version = None
        pipeline_base_quantization = bool(getattr(self.config, "pipeline_quantization_base", False))
        if self.accelerator and hasattr(self.accelerator, "state"):
            fsdp_plugin = getattr(self.accelerator.state, "fsdp_plugin", None)
            if fsdp_plugin is not None:
                fsdp_active = True
                fsdp_version = getattr(fsdp_plugin, "fsdp_version", None)

        if is_accelerator_target and fsdp_active:
            version_note = f" (v{fsdp_version})" if fsdp_version is not None else ""
            logger.info(
                "FSDP%s detected; skipping manual model move so Accelerator.prepare can shard from the host device.",
                version_note,
            )
            return

        if is_accelerator_target:
            if not self.accelerator:
                raise RuntimeError(
                    "Accelerator is not initialised but move_models(destination='accelerator') was requested."
                )
            target_device = self.accelerator.device
        else:
            target_device = destination

        group_offload_requested = bool(getattr(self.config, "enable_group_offload", False))
        group_offload_configured = getattr(self.model, "group_offload_configured", False)
        musubi_block_swap_active = getattr(self.config, "musubi_blocks_to_swap", 0) or 0 > 0
        ramtorch_enabled = getattr(self.config, "ramtorch", False)
        if self.model.get_trained_component() is not None:
            should_move_trained_component = (
                not any(
                    [
                        fsdp_active,
                        group_offload_requested,
                        group_offload_configured,
                        musubi_block_swap_active,
                        ramtorch_enabled,
                    ]
                )
                and is_accelerator_target
                and not pipeline_base_quantization
            )
            if should_move_trained_component:
                logger.info(
                    f"Moving the {str(self.model.get_trained_component().__class__)} to {target_device} in {self.config.weight_dtype if not self.config.is_quantized else self.config.base_model_precision} precision."
                )
                if self.config.is_quantized:
                    self.model.get_trained_component(unwrap_model=False).to(target_device)
                else:
                    self.model.get_trained_component(unwrap_model=False).to(target_device, dtype=self.config.weight_dtype)
                self._report_cuda_usage_if_requested("after_move_trained_component")
        if getattr(self.accelerator, "_lycoris_wrapped_network", None) is not None:
            self.accelerator._lycoris_wrapped_network = self.accelerator._lycoris_wrapped_network.to(
                target_device, dtype=self.config.weight_dtype
            )

        if group_offload_requested and is_accelerator_target:
            self.model.configure_group_offload()

        AttentionBackendController.apply(self.config, AttentionPhase.TRAIN)
        if self.config.attention_mechanism == "xformers":
            if is_xformers_available():
                import xformers  # type: ignore # noqa

                if hasattr(
                    self.model.get_trained_component(),
                    "enable_xformers_memory_efficient_attention",
                ):
                    logger.info("Enabling xformers memory-efficient attention.")
                    self.model.get_trained_component().enable_xformers_memory_efficient_attention()
                else:
                    self.config.enable_xformers_memory_efficient_attention = False
                    self.config.attention_mechanism = "diffusers"
                    logger.warning(
                        "xformers is not enabled, as it is incompatible with this model type."
                        " Falling back to diffusers attention mechanism (Pytorch SDPA)."
                        " Alternatively, provide --attention_mechanism=sageattention for a more efficient option on CUDA systems."
                    )
            else:
                raise ValueError("xformers is not available. Make sure it is installed correctly")

        if self.config.controlnet:
            self.model.get_trained_component(unwrap_model=False).train()
            if not pipeline_base_quantization:
                if self.config.is_quantized:
                    self.model.unwrap_model(self.model.model).to(device=target_device)
                else:
                    self.model.unwrap_model(self.model.model).to(device=target_device, dtype=self.config.weight_dtype)
            if self.config.train_text_encoder:
                logger.warning("Unknown results will occur when finetuning the text encoder alongside ControlNet.")

    def mark_optimizer_train(self):
        if is_lr_schedulefree(self.config.optimizer) and hasattr(self.optimizer, "train"):
            # we typically have to call train() on the optim for schedulefree.
            logger.debug("Setting optimiser into train() mode.")
            self.optimizer.train()
        if getattr(self, "sidecar_is_schedulefree", False) and hasattr(getattr(self, "sidecar_optimizer", None), "train"):
            logger.debug("Setting sidecar optimiser into train() mode.")
            self.sidecar_optimizer.train()

    def mark_optimizer_eval(self):
        if is_lr_schedulefree(self.config.optimizer) and hasattr(self.optimizer, "eval"):
            # we typically have to call eval() on the optim for schedulefree before saving or running validations.
            logger.debug("Setting optimiser into eval() mode.")
            self.optimizer.eval()
        if getattr(self, "sidecar_is_schedulefree", False) and hasattr(getattr(self, "sidecar_optimizer", None), "eval"):
            logger.debug("Setting sidecar optimiser into eval() mode.")
            self.sidecar_optimizer.eval()

    def _checkpoint_step_interval(self) -> int | None:
        raw_value = getattr(self.config, "checkpoint_step_interval", None)
        if raw_value in (None, "", "None", 0):
            raw_value = getattr(self.config, "checkpointing_steps", None)
        try:
            interval = int(raw_value)
        except (TypeError, ValueError):
            return None
        return interval if interval > 0 else None

    def _checkpoint_epoch_interval(self) -> int | None:
        raw_value = getattr(self.config, "checkpoint_epoch_interval", None)
        if raw_value in (None, "", "None"):
            return None
        try:
            interval = int(raw_value)
        except (TypeError, ValueError):
            return None
        return interval if interval > 0 else None

    def _should_checkpoint_epoch(self, epoch: int) -> bool:
        interval = self._checkpoint_epoch_interval()
        if interval is None or epoch is None:
            return False
        return epoch > 0 and epoch % interval == 0

    def _write_checkpoint_epoch(self, checkpoint_dir: str, epoch_value: int) -> None:
        """
        Update the persisted training_state.json inside the checkpoint with the provided epoch.
        """
        training_state_filename = getattr(self.model_hooks, "training_state_path", "training_state.json")
        training_state_path = os.path.join(checkpoint_dir, training_state_filename)
        try:
            training_state = {}
            if os.path.exists(training_state_path):
                with open(training_state_path, "r") as f:
                    training_state = json.load(f) or {}
            else:
                training_state = StateTracker.get_training_state()
            training_state["epoch"] = epoch_value
            with open(training_state_path, "w") as f:
                json.dump(training_state, f)
        except Exception as err:  # pragma: no cover - best-effort persistence
            logger.warning(f"Failed to write epoch {epoch_value} to {training_state_path}: {err}")

    def _run_standard_checkpoint(self, webhook_message: str | None, parent_loss, epoch: int, *, upload_to_hub: bool = False):
        if webhook_message:
            self._send_webhook_msg(
                message=f"Checkpoint: `{webhook_message}`",
                message_level="info",
            )
        # Also send structured progress update at checkpoint time
        progress_kwargs, current_state = self._prepare_training_progress_payload(
            epoch=epoch,
            parent_loss=parent_loss,
        )
        event = training_status_event(
            status="running",
            job_id=self.job_id,
            extra={
                "final_epoch": self.config.num_train_epochs,
                **current_state,
            },
            **progress_kwargs,
        )
        self._emit_event(event)
        if self.accelerator.is_main_process and self.config.checkpoints_total_limit is not None:
            self.checkpoint_state_cleanup(
                self.config.output_dir,
                self.config.checkpoints_total_limit,
            )

        save_path = None
        if self.accelerator.is_main_process or self.config.use_deepspeed_optimizer or self.config.fsdp_enable:
            save_path = self.checkpoint_state_save(self.config.output_dir)

        hub_upload_planned = upload_to_hub and self.hub_manager is not None
        if hub_upload_planned:
            if self.accelerator.is_main_process:
                validation_images = getattr(self.validation, "validation_images") if self.validation is not None else None
                captured_step = self.state["global_step"]
                captured_epoch = self.state["current_epoch"]

                def _upload_latest_checkpoint():
                    remote_path, local_path, repo_url = self.hub_manager.upload_latest_checkpoint(
                        validation_images=validation_images,
                        webhook_handler=self.webhook_handler,
                        global_step=captured_step,
                        epoch=captured_epoch,
                    )
                    return remote_path, local_path, repo_url

                description = f"checkpoint step {self.state.get('global_step')}"
                try:
                    self._schedule_hub_upload(description, _upload_latest_checkpoint)
                except Exception as e:
                    logger.error(f"Error uploading to hub: {e}, continuing training.")
        else:
            if save_path:
                self._run_post_upload_script(local_path=save_path, remote_path=None)
        return save_path

    def _send_webhook_msg(
        self, message: str, message_level: str = "info", store_response: bool = False, emit_event: bool = True
    ):
        if type(message) is not str:
            logger.error(f"_send_webhook_msg received {type(message)} type message instead of str.")
            return False
        if self.webhook_handler is None or not self.webhook_handler:
            return
        self.webhook_handler.send(message=message, message_level=message_level, store_response=store_response)
        # Only emit event if requested (to avoid duplicates when a structured event is also being sent)
        if emit_event:
            event = notification_event(message=message, severity=message_level, job_id=self.job_id)
            self._emit_event(event, message_level=message_level)

    def _emit_event(self, event: dict, message_level: str = "info"):
        if not isinstance(event, dict):
            logger.error(f"_emit_event expected dict payload, received {type(event)}.")
            return False
        if not self.webhook_handler:
            return False
        if self.job_id and event.get("job_id") is None:
            event["job_id"] = self.job_id
        attach_timestamp(event)
        if "severity" not in event:
            event["severity"] = message_level
        self.webhook_handler.send_raw(event, message_level=message_level, job_id=self.job_id)
        return True

    @staticmethod
    def _normalize_metric_value(value: Any) -> float | None:
        if value is None:
            return None
        if isinstance(value, (int, float)):
            return float(value)
        if hasattr(value, "item"):
            try:
                return float(value.item())
            except Exception:
                return None
        try:
            return float(value)
        except (TypeError, ValueError):
            return None

    def _compose_training_progress_metrics(
        self,
        *,
        epoch: int | None = None,
        parent_loss: Any = None,
        extra_metrics: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        metrics: dict[str, Any] = {}
        if self.state.get("global_step", 0) > 0:
            loss_value = self._normalize_metric_value(getattr(self, "train_loss", None))
            if loss_value is not None:
                metrics["loss"] = loss_value
            parent_loss_value = self._normalize_metric_value(parent_loss)
            if parent_loss_value is not None:
                metrics["parent_loss"] = parent_loss_value
            learning_rate_value = self._normalize_metric_value(getattr(self, "lr", None))
            if learning_rate_value is not None:
                metrics["learning_rate"] = learning_rate_value
        if epoch is not None:
            metrics["epoch"] = epoch
        batch_size_value = self._normalize_metric_value(getattr(self.config, "total_batch_size", None))
        if batch_size_value is not None:
            metrics.setdefault("effective_batch_size", batch_size_value)
            metrics.setdefault("total_batch_size", batch_size_value)
        metrics.update(self.iteration_tracker.iteration_metrics())
        # Add gradient metrics (same logic as _update_grad_metrics but for webhook payload)
        self._update_grad_metrics(metrics, clone_norm_value=True, is_regularisation_data=parent_loss is not None)
        if extra_metrics:
            for key, value in extra_metrics.items():
                if value is None:
                    continue
                metrics[key] = value
        return metrics

    def _prepare_training_progress_payload(
        self,
        *,
        label: str | None = None,
        epoch: int | None = None,
        parent_loss: Any = None,
        extra_metrics: Mapping[str, Any] | None = None,
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        current_state = self.state.copy()
        current_state.pop("args", None)
        try:
            current_step = float(current_state.get("global_step", 0))
        except (TypeError, ValueError):
            current_step = 0.0
        total_value = current_state.get("total_num_steps")
        if total_value in (None, "", "None"):
            total_value = getattr(self.config, "max_train_steps", None)
        total_numeric = self._normalize_metric_value(total_value)
        capped_step = current_step
        if total_numeric is not None:
            capped_step = min(current_step, total_numeric)
        percent = None
        if total_numeric and total_numeric > 0:
            percent = (capped_step / total_numeric) * 100
        eta_seconds = self.iteration_tracker.estimate_eta(capped_step, total_numeric)
        metrics = self._compose_training_progress_metrics(
            epoch=epoch,
            parent_loss=parent_loss,
            extra_metrics=extra_metrics,
        )
        current_display = capped_step
        if isinstance(current_display, float) and current_display.is_integer():
            current_display = int(current_display)
        total_display = total_numeric
        if isinstance(total_display, float) and total_display.is_integer():
            total_display = int(total_display)
        progress_kwargs = {
            "label": label,
            "current": current_display,
            "total": total_display,
            "percent": percent,
            "eta_seconds": eta_seconds,
            "metrics": metrics if metrics else None,
        }
        return progress_kwargs, current_state

    def _train_initial_msg(self):
        initial_msg = "\n***** Running training *****"
        initial_msg += f"\n-  Trainable parameters: {trainable_parameter_count(self._get_trainable_parameters())}"
        initial_msg += f"\n-  Num batches = {self.config.total_num_batches}"
        initial_msg += f"\n-  Num Epochs = {self.config.num_train_epochs}"
        initial_msg += f"\n  - Current Epoch = {self.state['first_epoch']}"
        initial_msg += (
            f"\n-  Total train batch size (w. parallel, distributed & accumulation) = {self.config.total_batch_size}"
        )
        initial_msg += f"\n  - Instantaneous batch size per device = {self.config.train_batch_size}"
        initial_msg += f"\n  - Gradient Accumulation steps = {self.config.gradient_accumulation_steps}"
        initial_msg += f"\n-  Total optimization steps = {self.config.max_train_steps}"
        if self.state["global_step"] > 1:
            initial_msg += f"\n  - Steps completed: {self.state['global_step']}"
        steps_remaining_at_start = max(
            0, getattr(self.config, "total_steps_remaining_at_start", self.config.max_train_steps)
        )
        initial_msg += f"\n-  Total optimization steps remaining = {steps_remaining_at_start}"
        self.state["steps_remaining_at_start"] = steps_remaining_at_start
        self.state["total_num_steps"] = self.config.max_train_steps
        logger.info(initial_msg)
        # Send to Discord webhook but don't emit as event (to avoid cluttering event dock)
        if self.webhook_handler is not None:
            self.webhook_handler.send(message=initial_msg, message_level="info")
        # Cap global_step to max_train_steps in case of resume on already-completed environment
        progress_kwargs, current_state = self._prepare_training_progress_payload(
            label="Training initialisation",
            epoch=self.state["first_epoch"],
            extra_metrics={"total_epochs": self.config.num_train_epochs},
        )
        status_event = training_status_event(
            status="running",  # Changed from "starting" - all initialization is complete
            message=initial_msg,
            job_id=self.job_id,
            severity="info",
            extra={
                "total_num_batches": self.config.total_num_batches,
                "total_num_epochs": self.config.num_train_epochs,
                "total_num_steps": self.config.max_train_steps,
                "current_epoch": self.state["first_epoch"],
                "total_batch_size": self.config.total_batch_size,
                "micro_batch_size": self.config.train_batch_size,
                "global_step": self.state["global_step"],
                "remaining_num_steps": steps_remaining_at_start,
                **current_state,
            },
            **progress_kwargs,
        )
        self._emit_event(status_event)

    def _epoch_rollover(self, epoch):
        # Always update epoch tracking state first, before any early return.
        # This ensures checkpoints always save the correct epoch value.
        self.state["current_epoch"] = epoch
        StateTracker.set_epoch(epoch)

        # Update steps per epoch for the current epoch based on active datasets.
        # This handles dynamic dataset scheduling where datasets have different start_epoch values.
        new_steps_per_epoch = self.get_steps_per_epoch_for_epoch(epoch)
        old_steps_per_epoch = getattr(self.config, "num_update_steps_per_epoch", new_steps_per_epoch)
        if new_steps_per_epoch != old_steps_per_epoch:
            logger.info(
                f"Steps per epoch changed from {old_steps_per_epoch} to {new_steps_per_epoch} "
                f"due to dataset scheduling (epoch {epoch})."
            )
        self.config.num_update_steps_per_epoch = new_steps_per_epoch

        if self.state["first_epoch"] == epoch:
            return
        logger.debug(
            f"Just completed epoch {self.state['current_epoch'] - 1}. Beginning epoch {epoch}. Starting epoch was {self.state['first_epoch']}. Final epoch will be {self.config.num_train_epochs}"
        )
        for backend_id, backend in StateTracker.get_data_backends().items():
            backend_config = StateTracker.get_data_backend_config(backend_id)
            if (
                backend_config.get("crop")
                and backend_config.get("crop_aspect") == "random"
                and "metadata_backend" in backend
                and not self.config.aspect_bucket_disable_rebuild
            ) or (backend_config.get("vae_cache_clear_each_epoch") and "vaecache" in backend):
                # when the aspect ratio is random, we need to shuffle the dataset on each epoch.
                if self.accelerator.is_main_process:
                    # we only compute the aspect ratio indices on the main process.
                    # we have to set read_only to False since we're generating a new, un-split list.
                    # otherwise, we can't actually save the new cache to disk.
                    backend["metadata_backend"].read_only = False
                    # this will generate+save the new cache to the storage backend.
                    backend["metadata_backend"].compute_aspect_ratio_bucket_indices(ignore_existing_cache=True)
                self.accelerator.wait_for_everyone()
                logger.info(f"Reloading cache for backend {backend_id}")
                backend["metadata_backend"].reload_cache(set_config=False)
                logger.info("Waiting for other threads to finish..")
                self.accelerator.wait_for_everyone()
                # we'll have to split the buckets between GPUs again now, so that the VAE cache distributes properly.
                logger.info("Splitting buckets across GPUs")
                backend["metadata_backend"].split_buckets_between_processes(
                    gradient_accumulation_steps=self.config.gradient_accumulation_steps
                )
                # we have to rebuild the VAE cache if it exists.
                if "vaecache" in backend:
                    logger.info("Rebuilding VAE cache..")
                    backend["vaecache"].rebuild_cache()
                # no need to manually call metadata_backend.save_cache() here.
        if self.config.lr_scheduler == "cosine_with_restarts":
            self.extra_lr_scheduler_kwargs["epoch"] = epoch

    def _exit_on_signal(self):
        external_abort = False
        if callable(getattr(self, "_external_abort_checker", None)):
            try:
                external_abort = bool(self._external_abort_checker())
            except Exception:
                external_abort = False

        if external_abort and not self.should_abort:
            self.abort()

        if self.should_abort:
            event = lifecycle_stage_event(
                key="training_abort",
                label="Training Aborted",
                status="completed",
                message="Aborting training run.",
                job_id=self.job_id,
            )
            self._emit_event(event)
            raise StopIteration("Training run received abort signal.")

    def abort(self):
        logger.info("Aborting training run.")
        if self.bf is not None:
            self.bf.stop_fetching()
        # we should set should_abort = True on each data backend's vae cache, metadata, and text backend
        for _, backend in StateTracker.get_data_backends().items():
            if "vaecache" in backend:
                logger.debug(f"Aborting VAE cache")
                backend["vaecache"].should_abort = True
            if "metadata_backend" in backend:
                logger.debug(f"Aborting metadata backend")
                backend["metadata_backend"].should_abort = True
            if "text_backend" in backend:
                logger.debug(f"Aborting text backend")
                backend["text_backend"].should_abort = True
            if "sampler" in backend:
                logger.debug(f"Aborting sampler")
                backend["sampler"].should_abort = True
        self.should_abort = True

    def cleanup(self) -> None:
        """Release GPU resources and background workers."""
        if self._cleanup_invoked:
            return
        self._cleanup_invoked = True

        try:
            if getattr(self, "gpu_circuit_breaker", None) is not None:
                self.gpu_circuit_breaker.stop_monitoring()
        except Exception as exc:
            logger.debug("Failed to stop GPU health monitor during cleanup: %s", exc, exc_info=True)

        try:
            if getattr(self, "bf", None) is not None:
                self.bf.stop_fetching()
        except Exception as exc:
            logger.debug("Failed to stop batch fetcher during cleanup: %s", exc, exc_info=True)

        try:
            if getattr(self, "model", None) is not None and hasattr(self.model, "unload"):
                self.model.unload()
        except Exception as exc:
            logger.warning("Failed to unload model components during cleanup: %s", exc, exc_info=True)

        try:
            reclaim_memory()
        except Exception as exc:
            logger.debug("Failed to reclaim accelerator memory during cleanup: %s", exc, exc_info=True)

    def model_predict(
        self,
        prepared_batch,
        custom_timesteps: list = None,
    ):
        if custom_timesteps is not None:
            prepared_batch = self._prepare_custom_timestep_batch(prepared_batch, custom_timesteps)
        if self.model.uses_noise_schedule():
            prepared_batch = apply_scheduled_sampling_rollout(
                self.model,
                prepared_batch,
                self.noise_scheduler,
                self.config,
            )

        if self._tlora_active:
            from simpletuner.helpers.training.lycoris import apply_tlora_timestep_mask, clear_tlora_mask

            apply_tlora_timestep_mask(
                timesteps=prepared_batch["timesteps"],
                max_timestep=self.noise_scheduler.config.num_train_timesteps,
                max_rank=self._tlora_config["max_rank"],
                min_rank=self._tlora_config["min_rank"],
                alpha=self._tlora_config["alpha"],
            )

        try:
            if not self.config.disable_accelerator:
                mark_cudagraph_step_begin(self.config)
                if self.config.controlnet:
                    model_pred = self.model.controlnet_predict(
                        prepared_batch=prepared_batch,
                    )
                else:
                    model_pred = self.model.model_predict(
                        prepared_batch=prepared_batch,
                    )

            else:
                # Dummy model prediction for debugging.
                if not self.model.uses_noise_schedule():
                    raise ValueError("disable_accelerator debug path is not supported for autoregressive models.")
                model_pred = torch.randn_like(prepared_batch["noisy_latents"])
        finally:
            if self._tlora_active:
                clear_tlora_mask()

        # x-prediction requires that we now subtract the noise residual from the prediction to get the target sample.
        if (
            self.model.uses_noise_schedule()
            and hasattr(self.noise_scheduler, "config")
            and hasattr(self.noise_scheduler.config, "prediction_type")
            and self.noise_scheduler.config.prediction_type == "sample"
        ):
            model_pred = model_pred - prepared_batch["noise"]

        return model_pred

    def _prepare_custom_timestep_batch(self, prepared_batch: dict, custom_timesteps):
        overridden_batch = dict(prepared_batch)
        reference_timesteps = prepared_batch.get("timesteps")
        reference_device = None
        reference_dtype = torch.float32
        if torch.is_tensor(reference_timesteps):
            reference_device = reference_timesteps.device
            reference_dtype = reference_timesteps.dtype
        elif "noisy_latents" in prepared_batch and torch.is_tensor(prepared_batch["noisy_latents"]):
            reference_device = prepared_batch["noisy_latents"].device

        custom_timesteps_tensor = torch.as_tensor(
            custom_timesteps,
            device=reference_device if reference_device is not None else self.accelerator.device,
            dtype=reference_dtype,
        )
        overridden_batch["timesteps"] = custom_timesteps_tensor

        if not self.model.uses_noise_schedule():
            return overridden_batch

        latents = prepared_batch.get("latents")
        noise = prepared_batch.get("input_noise", prepared_batch.get("noise"))
        if not (torch.is_tensor(latents) and torch.is_tensor(noise)):
            return overridden_batch

        if self.model.PREDICTION_TYPE is PredictionTypes.FLOW_MATCHING:
            sigma_values = custom_timesteps_tensor.to(device=latents.device, dtype=latents.dtype)
            max_timestep = float(getattr(self.noise_scheduler.config, "num_train_timesteps", 1000) or 1000)
            if torch.max(sigma_values) > 1.0:
                sigma_values = sigma_values / max_timestep
            sigma_values = sigma_values.clamp(0.0, 1.0)

            reference_sigmas = prepared_batch.get("sigmas")
            if torch.is_tensor(reference_sigmas) and reference_sigmas.ndim > sigma_values.ndim:
                sigma_for_model = sigma_values
                while sigma_for_model.ndim < reference_sigmas.ndim:
                    sigma_for_model = sigma_for_model.unsqueeze(-1)
                sigma_for_model = sigma_for_model.to(device=latents.device, dtype=latents.dtype).expand_as(
                    reference_sigmas.to(device=latents.device, dtype=latents.dtype)
                )
            else:
                sigma_for_model = sigma_values

            sigma_for_noise = sigma_values
            while sigma_for_noise.ndim < latents.ndim:
                sigma_for_noise = sigma_for_noise.unsqueeze(-1)
            sigma_for_noise = sigma_for_noise.to(device=latents.device, dtype=latents.dtype)

            overridden_batch["sigmas"] = sigma_for_model.to(device=latents.device, dtype=latents.dtype)
            overridden_batch["noisy_latents"] = (1 - sigma_for_noise) * latents + sigma_for_noise * noise

            audio_latents = prepared_batch.get("audio_latents")
            if torch.is_tensor(audio_latents):
                audio_noise = prepared_batch.get("audio_input_noise", prepared_batch.get("audio_noise"))
                if not torch.is_tensor(audio_noise):
                    return overridden_batch
                audio_sigma_reference = prepared_batch.get("audio_sigmas")
                audio_sigma_values = sigma_values.to(device=audio_latents.device, dtype=audio_latents.dtype)
                if torch.is_tensor(audio_sigma_reference) and audio_sigma_reference.ndim > audio_sigma_values.ndim:
                    audio_sigma_for_model = audio_sigma_values
                    while audio_sigma_for_model.ndim < audio_sigma_reference.ndim:
                        audio_sigma_for_model = audio_sigma_for_model.unsqueeze(-1)
                    audio_sigma_for_model = audio_sigma_for_model.to(
                        device=audio_latents.device, dtype=audio_latents.dtype
                    ).expand_as(audio_sigma_reference.to(device=audio_latents.device, dtype=audio_latents.dtype))
                else:
                    audio_sigma_for_model = audio_sigma_values

                audio_sigma_for_noise = audio_sigma_values
                while audio_sigma_for_noise.ndim < audio_latents.ndim:
                    audio_sigma_for_noise = audio_sigma_for_noise.unsqueeze(-1)
                audio_sigma_for_noise = audio_sigma_for_noise.to(device=audio_latents.device, dtype=audio_latents.dtype)
                overridden_batch["audio_sigmas"] = audio_sigma_for_model
                overridden_batch["audio_timesteps"] = custom_timesteps_tensor.to(
                    device=audio_latents.device,
                    dtype=(
                        prepared_batch.get("audio_timesteps", custom_timesteps_tensor).dtype
                        if torch.is_tensor(prepared_batch.get("audio_timesteps"))
                        else torch.float32
                    ),
                )
                overridden_batch["audio_noisy_latents"] = (1 - audio_sigma_for_noise) * audio_latents + (
                    audio_sigma_for_noise * audio_noise
                )
            return overridden_batch

        timestep_values = custom_timesteps_tensor
        if timestep_values.ndim == 0:
            timestep_values = timestep_values.expand(latents.shape[0])
        elif timestep_values.ndim != 1:
            raise ValueError(
                f"Custom timesteps for scheduler-based evaluation must be scalar or 1D batch tensors, got {tuple(timestep_values.shape)}."
            )
        overridden_batch["timesteps"] = timestep_values.to(device=latents.device, dtype=torch.long)
        overridden_batch["noisy_latents"] = self.noise_scheduler.add_noise(
            latents.float(),
            noise.float(),
            overridden_batch["timesteps"],
        ).to(device=latents.device, dtype=latents.dtype)
        return overridden_batch

    def _max_grad_value(self):
        max_grad_value = float("-inf")  # Start with a very small number
        for param in self._get_trainable_parameters():
            if param.grad is not None:
                max_grad_value = max(max_grad_value, param.grad.abs().max().item())

        return max_grad_value

    def prepare_batch(self, batch: dict):
        """
        Prepare a batch for the model prediction.

        Args:
            batch (dict): Batch from iterator_fn.

        Returns:
            batch (dict): Prepared batch.
        """
        if not batch:
            training_logger.debug(f"No batch was returned by the iterator_fn, returning {batch}")
            return batch

        dataset_type = self._detect_batch_dataset_type(batch)
        if dataset_type is DatasetType.CAPTION:
            return self._prepare_caption_generated_batch(batch)

        prepared_batch = self.model.prepare_batch(batch, state=self.state)

        if getattr(self, "distiller", None) is not None:
            prepared_batch = self.distiller.prepare_batch(prepared_batch, self.model, self.state)

        return prepared_batch

    def _detect_batch_dataset_type(self, batch: dict) -> Optional[DatasetType]:
        if not isinstance(batch, dict):
            return None
        raw_type = batch.get("dataset_type")
        if raw_type is None:
            return None
        try:
            return ensure_dataset_type(raw_type)
        except ValueError:
            return None

    def _prepare_caption_generated_batch(self, batch: dict) -> Dict[str, Any]:
        backend_id = batch.get("data_backend_id", "<caption>")
        distiller = getattr(self, "distiller", None)
        if distiller is None:
            raise ValueError(
                f"Caption dataset '{backend_id}' cannot be used without a distiller that generates training batches."
            )
        if not getattr(distiller, "consumes_caption_batches", lambda: False)():
            raise ValueError(
                f"Distiller {distiller.__class__.__name__} does not support caption-only batches "
                f"(required for backend '{backend_id}')."
            )
        prepared_batch = distiller.prepare_caption_batch(batch, self.model, self.state)
        if not isinstance(prepared_batch, dict):
            raise ValueError(
                f"Distiller {distiller.__class__.__name__} returned an invalid caption batch payload "
                f"for backend '{backend_id}'. Expected a dict."
            )
        return prepared_batch

    def get_prediction_target(self, prepared_batch: dict):
        return self.model.get_prediction_target(prepared_batch)

    def checkpoint_state_remove(self, output_dir, checkpoint):
        if self.checkpoint_manager:
            self.checkpoint_manager.remove_checkpoint(checkpoint)
        else:
            # Fallback to original implementation
            removing_checkpoint = os.path.join(output_dir, checkpoint)
            try:
                logger.debug(f"Removing {removing_checkpoint}")
                shutil.rmtree(removing_checkpoint, ignore_errors=True)
            except Exception as e:
                logger.error(f"Failed to remove directory: {removing_checkpoint}")
                print(e)

    def checkpoint_state_filter(self, output_dir, suffix=None):
        if self.checkpoint_manager:
            return self.checkpoint_manager._filter_checkpoints(suffix)
        else:
            # Fallback to original implementation
            checkpoints_keep = []
            checkpoints = os.listdir(output_dir)
            for checkpoint in checkpoints:
                cs = checkpoint.split("-")
                base = cs[0]
                sfx = None
                if len(cs) < 2:
                    continue
                elif len(cs) > 2:
                    sfx = cs[2]

                if base != "checkpoint":
                    continue
                if suffix and sfx and suffix != sfx:
                    continue
                if (suffix and not sfx) or (sfx and not suffix):
                    continue

                checkpoints_keep.append(checkpoint)

            return checkpoints_keep

    def checkpoint_state_cleanup(self, output_dir, limit, suffix=None):
        if self.checkpoint_manager:
            self.checkpoint_manager.cleanup_checkpoints(limit, suffix)
        else:
            # Fallback to original implementation
            # remove any left over temp checkpoints (partially written, etc)
            checkpoints = self.checkpoint_state_filter(output_dir, "tmp")
            for removing_checkpoint in checkpoints:
                self.checkpoint_state_remove(output_dir, removing_checkpoint)

            # now remove normal checkpoints past the limit
            checkpoints = self.checkpoint_state_filter(output_dir, suffix)
            checkpoints = sorted(checkpoints, key=lambda x: int(x.split("-")[1]))

            # before we save the new checkpoint, we need to have at _most_ `limit - 1` checkpoints
            if len(checkpoints) < limit:
                return

            num_to_remove = len(checkpoints) - limit + 1
            removing_checkpoints = checkpoints[0:num_to_remove]
            logger.debug(f"{len(checkpoints)} checkpoints already exist, removing {len(removing_checkpoints)} checkpoints")
            logger.debug(f"removing checkpoints: {', '.join(removing_checkpoints)}")

            for removing_checkpoint in removing_checkpoints:
                self.checkpoint_state_remove(output_dir, removing_checkpoint)

    def _check_disk_space_before_checkpoint(self) -> None:
        """Check disk space before saving a checkpoint."""
        threshold_str = getattr(self.config, "disk_low_threshold", None)
        if threshold_str in (None, "", "None"):
            return

        if not self.accelerator.is_main_process:
            return

        from simpletuner.helpers.training.disk_space import DiskLowAction, check_disk_space, parse_size_threshold

        threshold_bytes = parse_size_threshold(threshold_str)
        if threshold_bytes is None:
            return

        action = getattr(self.config, "disk_low_action", DiskLowAction.STOP)
        if isinstance(action, str):
            action = DiskLowAction.from_raw(action)

        script_path = getattr(self.config, "disk_low_script", None)
        output_dir = self.config.output_dir

        check_disk_space(
            output_dir=output_dir,
            threshold_bytes=threshold_bytes,
            action=action,
            script_path=script_path,
        )

    def checkpoint_state_save(self, output_dir, suffix=None):
        self._check_disk_space_before_checkpoint()
        print("\n")

        save_path = os.path.join(
            output_dir,
            f"checkpoint-{self.state['global_step']}",
        )
        if suffix:
            save_path = f"{save_path}-{suffix}"

        # A temporary directory should be used so that saving state is an atomic operation.
        save_path_tmp = f"{save_path}-tmp" if self.config.checkpointing_use_tempdir else save_path

        # schedulefree optim needs the optimizer to be in eval mode to save the state (and then back to train after)
        event = lifecycle_stage_event(
            key="checkpoint_save",
            label="Saving Checkpoint",
            status="running",
            message=f"Saving checkpoint to {save_path}",
            job_id=self.job_id,
        )
        self._emit_event(event)
        self.mark_optimizer_eval()

        try:
            model_descriptions = [f"#{idx}:{type(model).__name__}" for idx, model in enumerate(self.accelerator._models)]
            logger.debug(
                "[Rank %s] Accelerator models registered for save_state: %s",
                getattr(self.accelerator, "process_index", "?"),
                ", ".join(model_descriptions) or "<none>",
            )
        except Exception as describe_err:  # pragma: no cover - defensive logging
            logger.warning("Unable to describe registered models before checkpoint: %s", describe_err)

        plugin = getattr(getattr(self.accelerator, "state", None), "fsdp_plugin", None)
        distributed_type = getattr(self.accelerator, "distributed_type", DistributedType.NO)
        fsdp_v2_run = distributed_type == DistributedType.FSDP and getattr(plugin, "fsdp_version", 1) == 2
        is_main_process = getattr(self.accelerator, "is_main_process", True)
        all_processes_saving = bool(
            getattr(self.config, "use_deepspeed_optimizer", False) or getattr(self.config, "fsdp_enable", False)
        )
        if fsdp_v2_run:
            logger.info("FSDP v2 detected; saving with sharded state dict (_use_dtensor disabled for NCCL compatibility).")
        if is_main_process:
            try:
                os.remove(os.path.join(save_path_tmp, CHECKPOINT_GUARD_FILENAME))
            except FileNotFoundError:
                pass
        self.accelerator.save_state(save_path_tmp)
        if hasattr(self.model, "save_flow_custom_timestep_state"):
            self.model.save_flow_custom_timestep_state(save_path_tmp)
        AttentionBackendController.on_save_checkpoint(
            save_path_tmp,
            is_main_process=getattr(self.accelerator, "is_main_process", True),
        )
        event = lifecycle_stage_event(
            key="checkpoint_save",
            label="Saving Checkpoint",
            status="completed",
            message=f"Saved checkpoint to {save_path}",
            job_id=self.job_id,
        )
        self._emit_event(event)
        if getattr(self, "distiller", None) is not None:
            event = lifecycle_stage_event(
                key="checkpoint_save_distiller",
                label="Saving Distillation States",
                status="running",
                message=f"Saving distillation states to {save_path_tmp}",
                job_id=self.job_id,
            )
            self._emit_event(event)
            self.distiller.on_save_checkpoint(self.state["global_step"], save_path_tmp)
            event = lifecycle_stage_event(
                key="checkpoint_save_distiller",
                label="Saving Distillation States",
                status="completed",
                message=f"Saved distillation states to {save_path_tmp}",
                job_id=self.job_id,
            )
            self._emit_event(event)
        self.mark_optimizer_train()
        for _, backend in StateTracker.get_data_backends().items():
            if "sampler" in backend:
                logger.debug(f"Backend: {backend}")
                backend["sampler"].save_state(
                    state_path=os.path.join(
                        save_path_tmp,
                        self.model_hooks.training_state_path,
                    ),
                )
        if self.accelerator is not None and distributed_type != DistributedType.NO and all_processes_saving:
            self.accelerator.wait_for_everyone()
        if is_main_process:
            checkpoint_manager = self.checkpoint_manager or CheckpointManager(output_dir)
            checkpoint_manager.write_manifest(
                save_path_tmp,
                metadata=self._build_checkpoint_manifest_metadata(),
            )
            checkpoint_manager.write_guard(save_path_tmp)
        if self.accelerator is not None and distributed_type != DistributedType.NO and all_processes_saving:
            self.accelerator.wait_for_everyone()
        if save_path != save_path_tmp and is_main_process:
            os.rename(save_path_tmp, save_path)
        if self.accelerator is not None and distributed_type != DistributedType.NO and all_processes_saving:
            self.accelerator.wait_for_everyone()
        event = checkpoint_event(
            path=save_path,
            label=f"Checkpoint saved to {save_path}",
            job_id=self.job_id,
        )
        self._emit_event(event)
        self._run_post_checkpoint_script(local_path=save_path)
        return save_path

    def _populate_checkpoint_assets(self, checkpoint_path: str) -> None:
        """Copy validation images/videos from this step to the checkpoint's assets folder."""
        if not checkpoint_path or not os.path.exists(checkpoint_path):
            return

        checkpoint_name = os.path.basename(checkpoint_path)
        match = re.search(r"checkpoint-(\d+)", checkpoint_name)
        if not match:
            return
        checkpoint_step = int(match.group(1))

        validation_dir = os.path.join(self.config.output_dir, "validation_images")
        if not os.path.exists(validation_dir):
            return

        step_pattern = f"step_{checkpoint_step}_"
        supported_extensions = {".png", ".jpg", ".jpeg", ".webp", ".gif", ".mp4", ".avi", ".mov", ".webm"}

        matching_files = []
        for filename in os.listdir(validation_dir):
            if step_pattern in filename:
                ext = os.path.splitext(filename)[1].lower()
                if ext in supported_extensions:
                    matching_files.append(filename)

        if not matching_files:
            return

        assets_dir = os.path.join(checkpoint_path, "assets")
        try:
            os.makedirs(assets_dir, exist_ok=True)
            for idx, filename in enumerate(sorted(matching_files)):
                src = os.path.join(validation_dir, filename)
                ext = os.path.splitext(filename)[1]
                dst = os.path.join(assets_dir, f"image_{idx}{ext}")
                shutil.copy2(src, dst)
            logger.debug(f"Copied {len(matching_files)} validation assets to {assets_dir}")
        except Exception as e:
            logger.warning(f"Failed to copy validation assets to checkpoint: {e}")

    def checkpoint_state_latest(self, output_dir):
        if self.checkpoint_manager:
            return self.checkpoint_manager.get_latest_checkpoint()
        else:
            # Fallback to original implementation
            # both checkpoint-[0-9]+ and checkpoint-[0-9]-rolling are candidates
            dirs = os.listdir(output_dir)
            dirs = [d for d in dirs if d.startswith("checkpoint") and not d.endswith("tmp")]
            dirs = sorted(dirs, key=lambda x: int(x.split("-")[1]))
            return dirs[-1] if len(dirs) > 0 else None

    def _run_intermediary_validation(
        self,
        step: int,
        *,
        manual_validation_requested: bool = False,
        epoch_end: bool = False,
    ) -> bool:
        if self.validation is None:
            return False

        should_validate = manual_validation_requested or self.validation.would_validate(step=step, epoch_end=epoch_end)
        if should_validate:
            self.mark_optimizer_eval()
            AttentionBackendController.apply(self.config, AttentionPhase.EVAL)
            self.disable_gradient_checkpointing()

        try:
            self.validation.run_validations(
                validation_type="intermediary",
                step=step,
                force_evaluation=manual_validation_requested,
                epoch_end=epoch_end,
            )
        except Exception as error:
            from simpletuner.helpers.training.validation import ValidationAbortedException

            if isinstance(error, ValidationAbortedException):
                raise
            root_logger = logging.getLogger()
            root_logger.exception(f"Validation run failed at step {step}: {error}")

        if should_validate:
            AttentionBackendController.apply(self.config, AttentionPhase.TRAIN)
            self.enable_gradient_checkpointing()
            self.mark_optimizer_train()

        return should_validate

    def _create_torch_profiler(self):
        trace_dir = os.environ.get("SIMPLETUNER_TORCH_PROFILER_DIR")
        if not trace_dir:
            return None

        try:
            from torch.profiler import ProfilerActivity, profile, schedule, tensorboard_trace_handler
        except ImportError:
            raise RuntimeError("SIMPLETUNER_TORCH_PROFILER_DIR was set, but torch.profiler could not be imported.")

        activities = [ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(ProfilerActivity.CUDA)

        rank_trace_dir = Path(trace_dir) / f"rank-{get_rank()}"
        rank_trace_dir.mkdir(parents=True, exist_ok=True)
        wait = int(os.environ.get("SIMPLETUNER_TORCH_PROFILER_WAIT", "1"))
        warmup = int(os.environ.get("SIMPLETUNER_TORCH_PROFILER_WARMUP", "1"))
        active = int(os.environ.get("SIMPLETUNER_TORCH_PROFILER_ACTIVE", "3"))
        repeat = int(os.environ.get("SIMPLETUNER_TORCH_PROFILER_REPEAT", "1"))
        profiler = profile(
            activities=activities,
            schedule=schedule(wait=wait, warmup=warmup, active=active, repeat=repeat),
            on_trace_ready=tensorboard_trace_handler(str(rank_trace_dir)),
            record_shapes=os.environ.get("SIMPLETUNER_TORCH_PROFILER_RECORD_SHAPES", "1") != "0",
            profile_memory=os.environ.get("SIMPLETUNER_TORCH_PROFILER_MEMORY", "1") != "0",
            with_stack=os.environ.get("SIMPLETUNER_TORCH_PROFILER_WITH_STACK", "0") == "1",
        )
        logger.info(
            "Torch profiler enabled: trace_dir=%s, wait=%s, warmup=%s, active=%s, repeat=%s",
            rank_trace_dir,
            wait,
            warmup,
            active,
            repeat,
        )
        return profiler

    def train(self):
        self.init_trackers()
        self._train_initial_msg()
        self.mark_optimizer_train()
        if ramtorch_profile.profile_enabled():
            ramtorch_profile.reset_for_new_run()
        torch_profiler = self._create_torch_profiler()
        if torch_profiler is not None:
            torch_profiler.start()
        # Start GPU health monitoring
        if hasattr(self, "gpu_circuit_breaker") and self.gpu_circuit_breaker is not None:
            self.gpu_circuit_breaker.start_monitoring()

        # Only show the progress bar once on each machine.
        show_progress_bar = True
        if not self.accelerator.is_local_main_process:
            show_progress_bar = False
        progress_bar = tqdm(
            range(0, int(self.config.max_train_steps)),
            disable=not show_progress_bar,
            initial=self.state["global_step"],
            desc=f"Epoch {self.state['first_epoch']}/{self.config.num_train_epochs} Steps",
            dynamic_ncols=True,
        )
        self.accelerator.wait_for_everyone()
        self.iteration_tracker.mark_start()

        # Some values that are required to be initialised later.
        step = self.state["global_step"]
        current_epoch_step = None
        self.bf, fetch_thread = None, None
        iterator_fn = random_dataloader_iterator
        # Context-parallel batch synchronization: ensures all ranks in a CP group
        # receive the same batch data before it's split along the sequence dimension
        cp_batch_synchronizer = ContextParallelBatchSynchronizer(self.accelerator)
        num_epochs_to_track = int(math.ceil(self.config.num_train_epochs)) + 1
        if not self.config.strict_epoch_limit:
            num_epochs_to_track += 1000000
        for epoch in range(self.state["first_epoch"], num_epochs_to_track):
            if self.state["current_epoch"] > self.config.num_train_epochs + 1 and self.config.strict_epoch_limit:
                # This might immediately end training, but that's useful for simply exporting the model.
                logger.info(
                    f"Training run is complete ({self.config.num_train_epochs}/{self.config.num_train_epochs} epochs, {self.state['global_step']}/{self.config.max_train_steps} steps)."
                )
                break
            self._epoch_rollover(epoch)
            self.model.get_trained_component(unwrap_model=False).train()
            training_models = [self.model.get_trained_component(unwrap_model=False)]
            if (
                "lora" in self.config.model_type
                and self.config.train_text_encoder
                and "standard" in self.config.lora_type.lower()
            ):
                for text_encoder in self.text_encoders:
                    if "t5" in str(text_encoder.__class__):
                        continue
                    text_encoder.train()
                    training_models.append(text_encoder)

            epoch_checkpoint_pending = False
            epoch_validation_boundary_reached = False
            last_step_saved_checkpoint = False

            if current_epoch_step is not None:
                # We are resetting to the next epoch, if it is not none.
                current_epoch_step = 0
            else:
                # If it's None, we need to calculate the current epoch step based on the current global step.
                current_epoch_step = self.state["global_step"] % self.config.num_update_steps_per_epoch
            train_backends = {}
            for backend_id, backend in StateTracker.get_data_backends().items():
                if StateTracker.backend_status(backend_id) or "train_dataloader" not in backend:
                    # Exclude exhausted backends.
                    logger.debug(
                        f"Excluding backend: {backend_id}, as it is exhausted? {StateTracker.backend_status(backend_id)} or not found {('train_dataloader' not in backend)}"
                    )
                    continue
                if self.config.eval_dataset_id is not None:
                    # skip eval splits.
                    if isinstance(self.config.eval_dataset_id, str) and backend_id == self.config.eval_dataset_id:
                        continue
                    elif isinstance(self.config.eval_dataset_id, list) and backend_id in self.config.eval_dataset_id:
                        continue
                train_backends[backend_id] = backend["train_dataloader"]
            # Begin dataloader prefetch, if enabled.
            # With CP enabled, only the CP-local leader prefetches; batches are broadcast via CP sync.
            iterator_args = [train_backends]
            prefetch_on_rank = not cp_batch_synchronizer.is_cp_enabled or cp_batch_synchronizer.is_cp_leader
            should_prefetch = self.config.dataloader_prefetch and prefetch_on_rank
            if should_prefetch:
                iterator_args = []
                if self.bf is not None:
                    self.bf.stop_fetching()
                self.bf = BatchFetcher(
                    datasets=train_backends,
                    max_size=self.config.dataloader_prefetch_qlen,
                    step=step,
                )
                if fetch_thread is not None:
                    fetch_thread.join()
                fetch_thread = self.bf.start_fetching()
                iterator_fn = self.bf.next_response

            while True:
                checkpoint_saved_this_step = False
                step_checkpoint_path = None
                self._exit_on_signal()
                step += 1
                # Fetch the batch with CP-aware sampling. When context parallelism is
                # enabled, only the CP leader samples; non-leaders receive via broadcast.
                # This ensures all ranks in a CP group receive the same batch before the
                # model's _cp_plan splits it along the sequence dimension.
                raw_batch = cp_batch_synchronizer.fetch_batch(iterator_fn, step, *iterator_args)
                prepared_batch = self.prepare_batch(raw_batch)
                training_logger.debug(f"Iterator: {iterator_fn}")
                if self.config.lr_scheduler == "cosine_with_restarts":
                    self.extra_lr_scheduler_kwargs["step"] = self.state["global_step"]

                if self.accelerator.is_main_process:
                    progress_bar.set_description(
                        f"Epoch {self.state['current_epoch']}/{self.config.num_train_epochs}, Steps"
                    )

                local_epoch_end = prepared_batch is False
                epoch_end_reached = self._any_rank_reached_epoch_end(local_epoch_end)
                # If any rank receives False from the enumerator, all ranks must leave the step loop together.
                if epoch_end_reached:
                    if not local_epoch_end:
                        training_logger.debug("Reached the end of epoch because another rank exhausted its dataloader.")
                    epoch_validation_boundary_reached = True
                    if (
                        self._should_checkpoint_epoch(epoch)
                        and not last_step_saved_checkpoint
                        and self.state["global_step"] > self.state["global_resume_step"]
                    ):
                        epoch_checkpoint_pending = True
                    logger.debug(f"Reached the end of epoch {epoch}")
                    break

                if prepared_batch is None:
                    import traceback

                    raise ValueError(
                        f"Received a None batch, which is not a good thing. Traceback: {traceback.format_exc()}"
                    )

                if getattr(self, "distiller", None) is not None:
                    self.distiller.pre_training_step(self.model, step)
                # Check GPU circuit breaker before training step
                if hasattr(self, "gpu_circuit_breaker") and self.gpu_circuit_breaker is not None:
                    if self.gpu_circuit_breaker.is_open:
                        raise GPUHealthError(
                            message="GPU circuit breaker is open due to hardware fault",
                            fault_type="circuit_open",
                            gpu_index=self.gpu_circuit_breaker._state.last_failure_gpu_index,
                        )
                with self.accelerator.accumulate(*training_models):
                    if self.model.uses_noise_schedule():
                        batch_label = "latents"
                        bsz = prepared_batch["latents"].shape[0]
                        training_logger.debug("Sending latent batch to GPU.")
                    else:
                        batch_label = "tokens"
                        bsz = prepared_batch["tokens"].shape[0]
                        training_logger.debug("Sending token batch to GPU.")

                    if int(bsz) != int(self.config.train_batch_size):
                        logger.error(
                            f"Received {bsz} {batch_label}, but expected {self.config.train_batch_size}. "
                            "Processing short batch."
                        )
                    training_logger.debug(f"Working on batch size: {bsz}")
                    # Prepare the data for the scatter plot
                    if self.model.uses_noise_schedule():
                        timesteps_for_logging = prepared_batch["timesteps"]
                        if torch.is_tensor(timesteps_for_logging) and timesteps_for_logging.ndim > 1:
                            reduce_dims = tuple(range(1, timesteps_for_logging.ndim))
                            timesteps_for_logging = timesteps_for_logging.detach().float().mean(dim=reduce_dims)
                        for timestep in timesteps_for_logging.tolist():
                            self.timesteps_buffer.append((self.state["global_step"], timestep))
                        if getattr(self.config, "twinflow_enabled", False):
                            sigmas = prepared_batch.get("sigmas")
                            tt = prepared_batch.get("twinflow_tt")
                            time_sign = prepared_batch.get("twinflow_time_sign")
                            if sigmas is not None and tt is not None:
                                try:
                                    sigma_mean = float(sigmas.detach().float().mean().item())
                                    tt_mean = float(tt.detach().float().mean().item())
                                    sign_val = (
                                        float(time_sign.detach().float().mean().item())
                                        if time_sign is not None
                                        else float(torch.sign(sigmas.detach().float()).mean().item())
                                    )
                                    self.twinflow_traj_buffer.append(
                                        (self.state["global_step"], sigma_mean, tt_mean, sign_val)
                                    )
                                except Exception:
                                    training_logger.debug("TwinFlow trajectory logging skipped due to tensor shape issues.")

                    if "encoder_hidden_states" in prepared_batch:
                        encoder_hidden_states = prepared_batch["encoder_hidden_states"]
                        training_logger.debug(f"Encoder hidden states: {encoder_hidden_states.shape}")

                    if "add_text_embeds" in prepared_batch:
                        add_text_embeds = prepared_batch["add_text_embeds"]
                        training_logger.debug(
                            f"Pooled embeds: {add_text_embeds.shape if add_text_embeds is not None else None}"
                        )

                    # Predict the noise residual and compute loss
                    is_regularisation_data = prepared_batch.get("is_regularisation_data", False)
                    if is_regularisation_data and self.config.model_type == "lora" and self.model.uses_noise_schedule():
                        training_logger.debug("Predicting parent model residual.")
                        with torch.no_grad():
                            if self.config.lora_type.lower() == "lycoris":
                                training_logger.debug("Detaching LyCORIS adapter for parent prediction.")
                                self.accelerator._lycoris_wrapped_network.set_multiplier(0.0)
                            else:
                                self.model.get_trained_component().disable_lora()
                            prepared_batch["target"] = self.model_predict(
                                prepared_batch=prepared_batch,
                            )["model_prediction"]
                            if self.config.lora_type.lower() == "lycoris":
                                training_logger.debug("Attaching LyCORIS adapter for student prediction.")
                                self.accelerator._lycoris_wrapped_network.set_multiplier(1.0)
                            else:
                                self.model.get_trained_component().enable_lora()

                    # slider
                    raw_strength = prepared_batch.get("slider_strength", 1.0)
                    try:
                        strength = float(raw_strength)
                    except (TypeError, ValueError):
                        strength = 1.0

                    slider_original_scaling = None
                    if self.config.model_type == "lora" and strength != 1.0:
                        with torch.no_grad():
                            if self.config.lora_type.lower() == "lycoris":
                                self.accelerator._lycoris_wrapped_network.set_multiplier(strength)
                            else:
                                tuner_layers = self._get_slider_tuner_layers()
                                slider_original_scaling = {}
                                for layer_id, module in tuner_layers:
                                    saved = {}
                                    for key, val in module.scaling.items():
                                        saved[key] = val
                                        module.scaling[key] = val * strength
                                    slider_original_scaling[layer_id] = (module, saved)

                    training_logger.debug("Predicting.")
                    model_pred = self.model_predict(
                        prepared_batch=prepared_batch,
                    )
                    loss, loss_logs = self.model.loss_with_logs(
                        prepared_batch=prepared_batch,
                        model_output=model_pred,
                        apply_conditioning_mask=True,
                    )
                    diffusion_loss = loss.clone()
                    loss, aux_loss_logs = self.model.auxiliary_loss(
                        prepared_batch=prepared_batch,
                        model_output=model_pred,
                        loss=loss,
                    )
                    distill_logs = {}
                    if self.config.distillation_method is not None:
                        loss, distill_logs = self.distiller.compute_distill_loss(prepared_batch, model_pred, loss)
                        loss, gen_logs = self.distiller.generator_loss_step(prepared_batch, model_pred, loss)
                        distill_logs.update(gen_logs)
                    parent_loss = None
                    if is_regularisation_data:
                        parent_loss = loss
                    if not torch.isfinite(loss.detach()).all():
                        batch_filepaths = prepared_batch.get("filepaths")
                        batch_backend_id = prepared_batch.get("data_backend_id")
                        loss_logs_context = {k: v for k, v in (loss_logs or {}).items()}
                        raise RuntimeError(
                            "Non-finite training loss detected "
                            f"(loss={loss.detach().item()}, data_backend_id={batch_backend_id}, "
                            f"filepaths={batch_filepaths}, loss_logs={loss_logs_context})."
                        )

                    # Gather the losses across all processes for logging (if using distributed training)
                    avg_loss = self.accelerator.gather(loss.repeat(self.config.train_batch_size)).mean()
                    self.train_loss += avg_loss.item() / self.config.gradient_accumulation_steps
                    if aux_loss_logs is not None:
                        avg_diffusion_loss = self.accelerator.gather(
                            diffusion_loss.repeat(self.config.train_batch_size)
                        ).mean()
                        self.train_diffusion_loss += avg_diffusion_loss.item() / self.config.gradient_accumulation_steps
                    # Backpropagate
                    self.grad_norm = None
                    if not self.config.disable_accelerator:
                        training_logger.debug("Backwards pass.")
                        if self._ramtorch_sync_enabled():
                            torch.cuda.synchronize()
                        self.accelerator.backward(loss)
                        if self._ramtorch_sync_enabled():
                            torch.cuda.synchronize()

                        if self.config.optimizer != "adam_bfloat16" and self.config.gradient_precision == "fp32":
                            # After backward, convert gradients to fp32 for stable accumulation
                            for param in _flatten_parameters(
                                [self.params_to_optimize, getattr(self.sidecar_optimizer, "param_groups", None)]
                            ):
                                if param.grad is not None:
                                    param.grad.data = param.grad.data.to(torch.float32)

                        self.grad_norm = self._max_grad_value()
                        if (
                            self.accelerator.sync_gradients
                            and self.config.optimizer not in ["optimi-stableadamw", "prodigy"]
                            and self.config.max_grad_norm > 0
                        ):
                            # StableAdamW/Prodigy do not need clipping, similar to Adafactor.
                            if self.config.fsdp_enable:
                                # For FSDP, handle FSDP1/FSDP2 separately and surface failures instead of crashing.
                                if self.config.grad_clip_method == "norm":
                                    fsdp_model = self.model.get_trained_component(unwrap_model=False)
                                    is_fsdp2 = bool(getattr(self.accelerator, "is_fsdp2", False))
                                    # Ensure gradients are unscaled before clipping when using AMP.
                                    self.accelerator.unscale_gradients()
                                    # When training LyCORIS adapters under FSDP, make sure we clip the
                                    # trainable adapter parameters instead of the frozen base model weights.
                                    is_lycoris = self.config.model_type == "lora" and self.config.lora_type == "lycoris"
                                    lycoris_params = None
                                    if is_lycoris:
                                        lycoris_params = getattr(self, "lycoris_wrapped_network", None)
                                        if lycoris_params is None:
                                            logger.warning(
                                                "LyCORIS training configured but lycoris_wrapped_network is None; "
                                                "falling back to base model parameters for gradient clipping."
                                            )
                                        else:
                                            lycoris_params = lycoris_params.parameters()
                                    try:
                                        if is_fsdp2:
                                            params_to_clip = lycoris_params or fsdp_model.parameters()
                                            self.grad_norm = torch.nn.utils.clip_grad_norm_(
                                                params_to_clip,
                                                self.config.max_grad_norm,
                                            )
                                        else:
                                            if lycoris_params is not None:
                                                self.grad_norm = torch.nn.utils.clip_grad_norm_(
                                                    lycoris_params,
                                                    self.config.max_grad_norm,
                                                )
                                            else:
                                                self.grad_norm = fsdp_model.clip_grad_norm_(self.config.max_grad_norm)
                                    except Exception as exc:
                                        if is_fsdp2:
                                            logger.warning(
                                                "FSDP2 gradient clipping failed (%s); skipping clipping.",
                                                exc,
                                            )
                                            self.grad_norm = None
                                        else:
                                            raise
                                elif self.config.grad_clip_method == "value":
                                    logger.warning(
                                        "FSDP does not support grad_clip_method='value'. Skipping gradient clipping."
                                    )
                                else:
                                    raise ValueError(
                                        f"Unknown grad clip method: {self.config.grad_clip_method}. Supported methods: value, norm"
                                    )
                            elif self.config.grad_clip_method == "norm":
                                self.grad_norm = self.accelerator.clip_grad_norm_(
                                    self._get_trainable_parameters(),
                                    self.config.max_grad_norm,
                                )
                            elif self.config.use_deepspeed_optimizer:
                                # deepspeed can only do norm clipping (internally)
                                pass
                            elif self.config.grad_clip_method == "value":
                                self.accelerator.clip_grad_value_(
                                    self._get_trainable_parameters(),
                                    self.config.max_grad_norm,
                                )
                            else:
                                raise ValueError(
                                    f"Unknown grad clip method: {self.config.grad_clip_method}. Supported methods: value, norm"
                                )
                        training_logger.debug("Stepping components forward.")
                        if self.config.optimizer_release_gradients:
                            step_offset = 0  # simpletuner indexes steps from 1.
                            should_not_release_gradients = (
                                step + step_offset
                            ) % self.config.gradient_accumulation_steps != 0
                            training_logger.debug(
                                f"step: {step}, should_not_release_gradients: {should_not_release_gradients}, self.config.optimizer_release_gradients: {self.config.optimizer_release_gradients}"
                            )
                            self.optimizer.optimizer_accumulation = should_not_release_gradients
                            if self.sidecar_optimizer is not None:
                                self.sidecar_optimizer.optimizer_accumulation = should_not_release_gradients
                        else:
                            attention_kwargs = {}
                            try:
                                from simpletuner.helpers.training.optimizers.muon import MuonClip
                            except Exception:
                                MuonClip = None
                            if MuonClip is not None and isinstance(self.optimizer, MuonClip):
                                attention_kwargs["attention_max_logits"] = self._attention_max_logits
                                self._attention_max_logits = None
                            self.optimizer.step(**attention_kwargs)
                            if self.sidecar_optimizer is not None:
                                self.sidecar_optimizer.step()
                        if self._ramtorch_zero_state and self.accelerator.sync_gradients:
                            self._broadcast_ramtorch_parameters()

                        if self._ramtorch_enabled():
                            trained_component = self.model.get_trained_component(unwrap_model=False)
                            if trained_component is not None:
                                trained_component.zero_grad(set_to_none=True)
                            if self.sidecar_optimizer is not None:
                                self.sidecar_optimizer.zero_grad(set_to_none=True)
                            # RamTorch clears gradients at module level; optimizer zeroing is not required here.
                        else:
                            self.optimizer.zero_grad(set_to_none=self.config.set_grads_to_none)
                            if self.sidecar_optimizer is not None:
                                self.sidecar_optimizer.zero_grad(set_to_none=self.config.set_grads_to_none)
                        if (
                            getattr(self, "distiller", None) is not None
                            and self.accelerator.sync_gradients  # run once per global step
                        ):
                            self.distiller.discriminator_step(prepared_batch=prepared_batch)
                            self.distiller.post_training_step(self.model, step)
                    if self.config.model_type == "lora" and strength != 1:
                        with torch.no_grad():
                            if self.config.lora_type.lower() == "lycoris":
                                self.accelerator._lycoris_wrapped_network.set_multiplier(1.0)
                            elif slider_original_scaling is not None:
                                for module, saved in slider_original_scaling.values():
                                    for key, val in saved.items():
                                        module.scaling[key] = val

                # Checks if the accelerator has performed an optimization step behind the scenes
                wandb_logs = {}
                if self.accelerator.sync_gradients:
                    try:
                        if self.config.peft_lora_mode == "singlora":
                            update_singlora_global_step(
                                model=self.model.get_trained_component(unwrap_model=True),
                                global_step=self.state["global_step"],
                            )
                        if "prodigy" in self.config.optimizer:
                            self.lr_scheduler.step(**self.extra_lr_scheduler_kwargs)
                            self.lr = self.optimizer.param_groups[0]["d"]
                            # Log Prodigy's adaptive step-size for diagnostics
                            _pg = self.optimizer.param_groups[0]
                            _prodigy_d = float(_pg.get("d", 0.0))
                            _prodigy_elr = float(_prodigy_d * _pg.get("lr", 1.0))
                            wandb_logs["prodigy_d"] = _prodigy_d
                            wandb_logs["prodigy_effective_lr"] = _prodigy_elr
                        elif self.config.is_lr_scheduler_disabled:
                            # Alternative method for retrieving LR from accelerated optimizers
                            self.lr = StateTracker.get_last_lr()
                        else:
                            self.lr_scheduler.step(**self.extra_lr_scheduler_kwargs)
                            self.lr = self.lr_scheduler.get_last_lr()[0]
                    except Exception as e:
                        logger.error(f"Failed to get the last learning rate from the scheduler. Error: {e}")
                    try:
                        if self.sidecar_optimizer is not None:
                            if self.sidecar_lr_scheduler is not None and not self.sidecar_scheduler_disabled:
                                sidecar_step_kwargs = {}
                                sidecar_sched_name = getattr(self.config, "lyrics_embedder_lr_scheduler", None) or getattr(
                                    self.config, "lr_scheduler", None
                                )
                                if sidecar_sched_name == getattr(self.config, "lr_scheduler", None):
                                    sidecar_step_kwargs = dict(self.extra_lr_scheduler_kwargs)
                                self.sidecar_lr_scheduler.step(**sidecar_step_kwargs)
                                self.sidecar_lr = self.sidecar_lr_scheduler.get_last_lr()[0]
                            else:
                                self.sidecar_lr = self.sidecar_optimizer.param_groups[0].get("lr")
                    except Exception as e:
                        logger.error(f"Failed to update lyrics embedder learning rate: {e}")
                    wandb_logs.update(
                        {
                            "train_loss": self.train_loss,
                            "optimization_loss": loss,
                            "learning_rate": self.lr,
                            "epoch": epoch,
                        }
                    )
                    if self.sidecar_lr is not None:
                        wandb_logs["lyrics_embedder_learning_rate"] = self.sidecar_lr
                    if distill_logs is not None:
                        wandb_logs.update(distill_logs)
                    if parent_loss is not None:
                        wandb_logs["regularisation_loss"] = parent_loss
                    if aux_loss_logs is not None:
                        for key, value in aux_loss_logs.items():
                            wandb_logs[f"aux_loss/{key}"] = value
                        wandb_logs["diffusion_loss"] = self.train_diffusion_loss
                    if loss_logs is not None:
                        wandb_logs.update(loss_logs)
                    self._update_grad_metrics(wandb_logs, is_regularisation_data=is_regularisation_data)
                    if self.validation is not None and hasattr(self.validation, "evaluation_result"):
                        eval_result = self.validation.get_eval_result()
                        if eval_result is not None and type(eval_result) == dict:
                            # add the dict to wandb_logs
                            self.validation.clear_eval_result()
                            wandb_logs.update(eval_result)

                    progress_bar.update(1)
                    self.state["global_step"] += 1
                    current_epoch_step += 1
                    StateTracker.set_global_step(self.state["global_step"])
                    self.iteration_tracker.record_step(self.state["global_step"])
                    if ramtorch_profile.profile_enabled():
                        ramtorch_profile.record_train_step(
                            self.state["global_step"],
                            self.iteration_tracker.latest_step_duration,
                        )

                    ema_decay_value = "None (EMA not in use)"
                    if self.config.use_ema:
                        if self.ema_model is not None:
                            self.ema_model.step(
                                parameters=self._get_trainable_parameters(),
                                global_step=self.state["global_step"],
                            )
                            wandb_logs["ema_decay_value"] = self.ema_model.get_decay()
                            ema_decay_value = wandb_logs["ema_decay_value"]
                        self.accelerator.wait_for_everyone()

                    # Log scatter plot to wandb
                    if self.config.report_to == "wandb" and self.accelerator.is_main_process:
                        # Prepare the data for the scatter plot
                        if self.timesteps_buffer:
                            if self._timesteps_scatter_table is None:
                                self._timesteps_scatter_table = wandb.Table(columns=["global_step", "timestep"])
                            for iteration, timestep in self.timesteps_buffer:
                                self._timesteps_scatter_table.add_data(iteration, timestep)
                            if not self._timesteps_scatter_logged:
                                wandb_logs["timesteps_scatter"] = wandb.plot.scatter(
                                    self._timesteps_scatter_table,
                                    "global_step",
                                    "timestep",
                                    title="Timestep distribution by step",
                                )
                                self._timesteps_scatter_logged = True
                            else:
                                wandb_logs["timesteps_scatter_table"] = self._timesteps_scatter_table
                        # Experimental TwinFlow trajectory map (theory may be inaccurate; for debugging only).
                        if getattr(self.config, "twinflow_enabled", False) and self.twinflow_traj_buffer:
                            if self._twinflow_traj_table is None:
                                self._twinflow_traj_table = wandb.Table(columns=["global_step", "sigma", "tt", "time_sign"])
                            for step_id, sigma_val, tt_val, sign_val in self.twinflow_traj_buffer:
                                self._twinflow_traj_table.add_data(step_id, sigma_val, tt_val, sign_val)
                            if not self._twinflow_traj_logged:
                                wandb_logs["twinflow_traj_map"] = wandb.plot.scatter(
                                    self._twinflow_traj_table,
                                    "sigma",
                                    "tt",
                                    title="TwinFlow trajectory map (experimental/theory unverified)",
                                )
                                self._twinflow_traj_logged = True
                            else:
                                wandb_logs["twinflow_traj_table"] = self._twinflow_traj_table

                    # Clear buffers
                    self.timesteps_buffer = []
                    self.twinflow_traj_buffer = []

                    logger.debug(
                        f"Step {self.state['global_step']} of {self.config.max_train_steps}: loss {loss.item()}, lr {self.lr}, epoch {epoch}/{self.config.num_train_epochs}, ema_decay_value {ema_decay_value}, train_loss {self.train_loss}"
                    )
                    webhook_pending_msg = f"Step {self.state['global_step']} of {self.config.max_train_steps}: loss {round(loss.item(), 4)}, lr {self.lr}, epoch {epoch}/{self.config.num_train_epochs}, ema_decay_value {ema_decay_value}, train_loss {round(self.train_loss, 4)}"

                    if self.webhook_handler is not None:
                        progress_kwargs, current_state = self._prepare_training_progress_payload(
                            epoch=epoch,
                            parent_loss=parent_loss,
                        )
                        event = training_status_event(
                            status="running",
                            job_id=self.job_id,
                            extra={
                                "final_epoch": self.config.num_train_epochs,
                                **current_state,
                            },
                            **progress_kwargs,
                        )
                        self._emit_event(event)

                    checkpoint_step_interval = self._checkpoint_step_interval()
                    upload_to_hub = (
                        self.hub_manager is not None
                        and step % self.config.gradient_accumulation_steps == 0
                        and self.state["global_step"] > self.state["global_resume_step"]
                    )
                    manual_checkpoint_requested = self._consume_manual_checkpoint_request()
                    scheduled_checkpoint_due = (
                        checkpoint_step_interval and self.state["global_step"] % checkpoint_step_interval == 0
                    )
                    step_checkpoint_path = None
                    if manual_checkpoint_requested or scheduled_checkpoint_due:
                        checkpoint_message = (
                            f"Manual checkpoint requested. {webhook_pending_msg}"
                            if manual_checkpoint_requested
                            else webhook_pending_msg
                        )
                        step_checkpoint_path = self._run_standard_checkpoint(
                            webhook_message=checkpoint_message,
                            parent_loss=parent_loss,
                            epoch=epoch,
                            upload_to_hub=upload_to_hub,
                        )
                        checkpoint_saved_this_step = True
                    elif (
                        self.config.checkpointing_rolling_steps
                        and self.state["global_step"] % self.config.checkpointing_rolling_steps == 0
                    ):
                        self._send_webhook_msg(
                            message=f"Checkpoint: `{webhook_pending_msg}`",
                            message_level="info",
                        )
                        # Also send structured progress update at checkpoint time
                        progress_kwargs, current_state = self._prepare_training_progress_payload(
                            epoch=epoch,
                            parent_loss=parent_loss,
                        )
                        event = training_status_event(
                            status="running",
                            job_id=self.job_id,
                            extra={
                                "final_epoch": self.config.num_train_epochs,
                                **current_state,
                            },
                            **progress_kwargs,
                        )
                        self._emit_event(event)
                        if self.accelerator.is_main_process and self.config.checkpoints_rolling_total_limit is not None:
                            # _before_ saving state, check if this save would set us over the `checkpoints_rolling_total_limit`
                            self.checkpoint_state_cleanup(
                                self.config.output_dir,
                                self.config.checkpoints_rolling_total_limit,
                                "rolling",
                            )

                        if self.accelerator.is_main_process or self.config.use_deepspeed_optimizer:
                            self.checkpoint_state_save(self.config.output_dir, "rolling")

                    if (
                        self.config.accelerator_cache_clear_interval is not None
                        and self.config.accelerator_cache_clear_interval > 0
                        and self.state["global_step"] % self.config.accelerator_cache_clear_interval == 0
                    ):
                        reclaim_memory()

                    # here we might run eval loss calculations.
                    if self.evaluation is not None and self.evaluation.would_evaluate(self.state):
                        self.mark_optimizer_eval()
                        all_accumulated_losses = self.evaluation.execute_eval(
                            prepare_batch=self.prepare_batch,
                            model_predict=self.model_predict,
                            calculate_loss=self.model.loss,
                            get_prediction_target=self.get_prediction_target,
                            noise_scheduler=self._get_noise_schedule(),
                        )
                        if all_accumulated_losses:
                            tracker_table = self.evaluation.generate_tracker_table(
                                all_accumulated_losses=all_accumulated_losses
                            )
                            logger.debug(f"Tracking information: {tracker_table}")
                            wandb_logs.update(tracker_table)
                        self.mark_optimizer_train()

                    try:
                        self.accelerator.log(
                            wandb_logs,
                            step=self.state["global_step"],
                        )
                    except Exception as e:
                        logger.error(f"Failed to log to accelerator; ignoring error: {e}")

                    # Reset some values for the next go.
                    self.train_loss = 0.0
                    self.train_diffusion_loss = 0.0
                    last_step_saved_checkpoint = checkpoint_saved_this_step

                logs = {
                    "step_loss": loss.detach().item(),
                    "lr": float(self.lr),
                }
                progress_logs = dict(logs)
                if "prodigy" in self.config.optimizer:
                    _pg = self.optimizer.param_groups[0]
                    _d_val = float(_pg.get("d", 0.0))
                    _elr_val = round(float(_d_val * _pg.get("lr", 1.0)), 8)
                    logs["prodigy_d"] = round(_d_val, 6)
                    logs["prodigy_effective_lr"] = _elr_val
                    progress_logs["prodigy_d"] = round(_d_val, 6)
                    progress_logs["prodigy_effective_lr"] = _elr_val
                if loss_logs is not None:
                    logs.update(loss_logs)
                    if "video_loss" in loss_logs:
                        progress_logs["v_loss"] = loss_logs["video_loss"]
                    if "audio_loss" in loss_logs:
                        progress_logs["a_loss"] = loss_logs["audio_loss"]
                    if "audio_loss_weighted" in loss_logs:
                        progress_logs["a_w"] = loss_logs["audio_loss_weighted"]
                if aux_loss_logs is not None:
                    logs_to_print = {}
                    for key, value in aux_loss_logs.items():
                        logs_to_print[f"aux_loss/{key}"] = value
                    training_logger.debug(f"Aux loss: {logs_to_print}")
                self._update_grad_metrics(
                    logs,
                    require_value_method=True,
                    clone_norm_value=True,
                    is_regularisation_data=is_regularisation_data,
                )

                progress_bar.set_postfix(**progress_logs)

                if self.validation is not None:
                    manual_validation_requested = self._consume_manual_validation_request()
                    self._run_intermediary_validation(
                        step,
                        manual_validation_requested=manual_validation_requested,
                    )
                    if step_checkpoint_path:
                        self._populate_checkpoint_assets(step_checkpoint_path)
                self.accelerator.wait_for_everyone()
                if torch_profiler is not None:
                    torch_profiler.step()

                if self.state["global_step"] >= self.config.max_train_steps or (
                    epoch > self.config.num_train_epochs and self.config.strict_epoch_limit
                ):
                    logger.info(
                        f"Training has completed."
                        f"\n -> global_step = {self.state['global_step']}, max_train_steps = {self.config.max_train_steps}, epoch = {epoch}, num_train_epochs = {self.config.num_train_epochs}",
                    )
                    # Note: training_complete event is emitted after final validation and model save
                    break
            epoch_checkpoint_dir = None
            if epoch_checkpoint_pending:
                epoch_message = f"Epoch {epoch} completed at step {self.state['global_step']}"
                epoch_upload_to_hub = self.hub_manager is not None and (
                    self.state["global_step"] > self.state["global_resume_step"]
                )
                epoch_checkpoint_dir = self._run_standard_checkpoint(
                    webhook_message=epoch_message,
                    parent_loss=parent_loss,
                    epoch=epoch,
                    upload_to_hub=epoch_upload_to_hub,
                )
                if epoch_checkpoint_dir:
                    self._write_checkpoint_epoch(epoch_checkpoint_dir, epoch + 1)
            if epoch_validation_boundary_reached:
                self._run_intermediary_validation(step, epoch_end=True)
            if epoch_checkpoint_dir:
                self._populate_checkpoint_assets(epoch_checkpoint_dir)

            if self.state["global_step"] >= self.config.max_train_steps or (
                epoch > self.config.num_train_epochs and self.config.strict_epoch_limit
            ):
                logger.info(
                    f"Exiting training loop. Beginning model unwind at epoch {epoch}, step {self.state['global_step']}"
                )
                # Note: training_complete event is emitted after final validation and model save
                break

        # Create the pipeline using the trained modules and save it.
        self.accelerator.wait_for_everyone()
        if torch_profiler is not None:
            torch_profiler.stop()
            logger.info("Torch profiler stopped.")
        validation_images = None
        final_lora_save_kwargs = None
        if "lora" in self.config.model_type and "standard" == self.config.lora_type.lower():
            from simpletuner.helpers.training.save_hooks import _materialize_state_dict_for_save

            trained_component = unwrap_model(self.accelerator, self.model.get_trained_component(unwrap_model=False))
            final_lora_save_kwargs = {
                "save_directory": self.config.output_dir,
                f"{self.model.MODEL_TYPE.value}_lora_layers": _materialize_state_dict_for_save(
                    get_peft_model_state_dict(trained_component)
                ),
            }

            if self.config.train_text_encoder:
                if self.model.get_text_encoder(0) is not None:
                    self.text_encoder_1 = self.accelerator.unwrap_model(self.model.get_text_encoder(0))
                    final_lora_save_kwargs["text_encoder_lora_layers"] = _materialize_state_dict_for_save(
                        convert_state_dict_to_diffusers(get_peft_model_state_dict(self.text_encoder_1))
                    )
                if self.model.get_text_encoder(1) is not None:
                    self.text_encoder_2 = self.accelerator.unwrap_model(self.model.get_text_encoder(1))
                    final_lora_save_kwargs["text_encoder_2_lora_layers"] = _materialize_state_dict_for_save(
                        convert_state_dict_to_diffusers(get_peft_model_state_dict(self.text_encoder_2))
                    )
                    if self.model.get_text_encoder(2) is not None:
                        self.text_encoder_3 = self.accelerator.unwrap_model(self.model.get_text_encoder(2))

            if self.config.fsdp_enable:
                self.accelerator.wait_for_everyone()

        if self.accelerator.is_main_process:
            event = lifecycle_stage_event(
                key="model_save",
                label="Saving Final Model",
                status="running",
                message=f"Finalizing model and saving to {self.config.output_dir}",
                job_id=self.job_id,
            )
            self._emit_event(event)
            self.mark_optimizer_eval()
            if self.validation is not None:
                AttentionBackendController.apply(self.config, AttentionPhase.EVAL)
                self.disable_gradient_checkpointing()
                # Emit validation start lifecycle event for final validations
                validation_start_event = lifecycle_stage_event(
                    key="final_validation",
                    label="Running Final Validations",
                    status="running",
                    message="Generating final validation images...",
                    job_id=self.job_id,
                )
                self._emit_event(validation_start_event)
                validation_images = self.validation.run_validations(
                    validation_type="final",
                    step=self.state["global_step"],
                    force_evaluation=True,
                    skip_execution=True,
                ).validation_images
                # Emit validation completed lifecycle event
                validation_completed_event = lifecycle_stage_event(
                    key="final_validation",
                    label="Running Final Validations",
                    status="completed",
                    message="Final validation images completed",
                    job_id=self.job_id,
                )
                self._emit_event(validation_completed_event)
                # we don't have to do this but we will anyway.
                AttentionBackendController.apply(self.config, AttentionPhase.TRAIN)
            if self.model.get_trained_component() is not None:
                self.model.model = unwrap_model(self.accelerator, self.model.model)
            if "lora" in self.config.model_type and "standard" == self.config.lora_type.lower():
                if final_lora_save_kwargs is None:
                    raise RuntimeError("Final LoRA save kwargs were not materialized before the main-process save.")
                self.model.save_lora_weights(
                    **final_lora_save_kwargs,
                )
                del final_lora_save_kwargs
                reclaim_memory()
            elif "lora" in self.config.model_type and "lycoris" == self.config.lora_type.lower():
                if self.accelerator.is_main_process or self.config.use_deepspeed_optimizer:
                    logger.info(f"Saving final LyCORIS checkpoint to {self.config.output_dir}")
                    # Save final LyCORIS checkpoint.
                    if getattr(self.accelerator, "_lycoris_wrapped_network", None) is not None:
                        from simpletuner.helpers.publishing.huggingface import LORA_SAFETENSORS_FILENAME

                        self.accelerator._lycoris_wrapped_network.save_weights(
                            os.path.join(self.config.output_dir, LORA_SAFETENSORS_FILENAME),
                            list(self.accelerator._lycoris_wrapped_network.parameters())[0].dtype,
                            {"lycoris_config": json.dumps(self.lycoris_config)},  # metadata
                        )
                        shutil.copy2(
                            self.config.lycoris_config,
                            os.path.join(self.config.output_dir, "lycoris_config.json"),
                        )

            elif self.config.use_ema:
                if self.model.get_trained_component() is not None:
                    self.ema_model.copy_to(self.model.get_trained_component().parameters())

            if self.config.model_type == "full":
                if self.config.save_text_encoder:
                    self.model.load_text_encoder()
                self.model.load_vae()
                pipeline = self.model.get_pipeline()
                pipeline.save_pretrained(
                    os.path.join(self.config.output_dir, "pipeline"),
                    safe_serialization=True,
                )
                logger.info(f"Wrote pipeline to disk: {self.config.output_dir}/pipeline")

            if self.hub_manager is not None and self.accelerator.is_main_process:
                captured_step = self.state["global_step"]
                captured_epoch = self.state["current_epoch"]

                def _upload_final_model():
                    repo_url = self.hub_manager.upload_model(
                        validation_images,
                        self.webhook_handler,
                        global_step=captured_step,
                        epoch=captured_epoch,
                    )
                    return repo_url, self.config.output_dir, repo_url

                try:
                    self._schedule_hub_upload("final model upload", _upload_final_model)
                except Exception as e:
                    logger.error(f"Error uploading final model to hub: {e}")
                self._finish_hub_uploads()
            else:
                self._run_post_upload_script(local_path=self.config.output_dir, remote_path=None)
            # Mark model_save as completed
            event = lifecycle_stage_event(
                key="model_save",
                label="Saving Final Model",
                status="completed",
                message=f"Model saved to {self.config.output_dir}",
                job_id=self.job_id,
            )
            self._emit_event(event)
        self.accelerator.end_training()
        # Emit training_complete event after all model saving and validation is complete
        event = lifecycle_stage_event(
            key="training_complete",
            label="Training Complete",
            status="completed",
            message="Training run complete.",
            job_id=self.job_id,
            percent=100,
            metrics={
                "loss": round(self.train_loss, 4),
                "learning_rate": self.lr,
                "epoch": self.state.get("current_epoch", 0),
            },
            extra={
                "state": self.state,
                "final_epoch": self.config.num_train_epochs,
            },
        )
        self._emit_event(event)


def _terminate_accelerate_process(process: subprocess.Popen) -> None:
    try:
        if process.poll() is None:
            if os.name != "nt" and getattr(process, "pid", None):
                try:
                    os.killpg(os.getpgid(process.pid), signal.SIGTERM)
                    return
                except Exception:
                    pass
            process.terminate()
    except Exception as exc:
        logging.getLogger("SimpleTuner").warning("Failed to terminate accelerate process cleanly: %s", exc)


def _kill_accelerate_process(process: subprocess.Popen) -> None:
    try:
        if process.poll() is None:
            if os.name != "nt" and getattr(process, "pid", None):
                try:
                    os.killpg(os.getpgid(process.pid), signal.SIGKILL)
                    return
                except Exception:
                    pass
            process.kill()
    except Exception as exc:
        logging.getLogger("SimpleTuner").warning("Failed to kill accelerate process: %s", exc)


def run_trainer_job(config):
    """Create a Trainer from the provided config and execute the full run loop."""

    job_id = None
    should_abort_callable = None
    manual_validation_consumer = None
    manual_checkpoint_consumer = None

    if hasattr(config, "__dict__"):
        attrs = vars(config).copy()
        should_abort_callable = attrs.pop("should_abort", None)
        manual_validation_consumer = attrs.pop("consume_manual_validation_request", None)
        manual_checkpoint_consumer = attrs.pop("consume_manual_checkpoint_request", None)
        job_id = attrs.pop("__job_id__", None) or attrs.pop("job_id", None)
        config_payload = attrs
    elif isinstance(config, dict):
        config_payload = dict(config)
        job_id = config_payload.pop("__job_id__", None) or config_payload.pop("job_id", None)
        should_abort_callable = config_payload.pop("should_abort", None)
        manual_validation_consumer = config_payload.pop("consume_manual_validation_request", None)
        manual_checkpoint_consumer = config_payload.pop("consume_manual_checkpoint_request", None)
    else:
        config_payload = config

    def _extract_value(mapping: Dict[str, object], *keys: str, default=None):
        for key in keys:
            if key in mapping:
                value = mapping[key]
                if isinstance(value, str) and value.strip() == "":
                    continue
                if value not in (None, "==SUPPRESS=="):
                    return value
        return default

    def _safe_int(value: object, fallback: int) -> int:
        try:
            return int(value)
        except (TypeError, ValueError):
            return fallback

    accelerate_config_path = None
    accelerate_extra_args = None
    requested_processes = None
    requested_machines = None
    requested_dynamo_backend = None
    mixed_precision_value = "bf16"
    main_process_ip_value = "127.0.0.1"
    main_process_port_value = 29500
    machine_rank_value = 0
    same_network_value = True

    selected_device_ids: Optional[List[str]] = None

    if isinstance(config_payload, dict):
        accelerate_config_path = _extract_value(config_payload, "accelerate_config", "--accelerate_config")
        accelerate_extra_args = _extract_value(
            config_payload,
            "accelerate_extra_args",
            "--accelerate_extra_args",
        )
        requested_processes = _extract_value(config_payload, "num_processes", "--num_processes")
        requested_machines = _extract_value(config_payload, "num_machines", "--num_machines")
        requested_dynamo_backend = _extract_value(
            config_payload,
            "dynamo_backend",
            "--dynamo_backend",
            "training_dynamo_backend",
            "--training_dynamo_backend",
        )
        mixed_precision_value = _extract_value(
            config_payload, "mixed_precision", "--mixed_precision", default=mixed_precision_value
        )
        main_process_ip_value = _extract_value(
            config_payload,
            "main_process_ip",
            "--main_process_ip",
            default=main_process_ip_value,
        )
        main_process_port_value = _extract_value(
            config_payload,
            "main_process_port",
            "--main_process_port",
            default=main_process_port_value,
        )
        machine_rank_value = _extract_value(
            config_payload,
            "machine_rank",
            "--machine_rank",
            default=machine_rank_value,
        )
        same_network_value = _extract_value(
            config_payload,
            "same_network",
            "--same_network",
            default=same_network_value,
        )
        if isinstance(same_network_value, str):
            same_network_value = same_network_value.strip().lower() in {"1", "true", "yes", "on"}

        accelerate_visible_devices = _extract_value(
            config_payload,
            "accelerate_visible_devices",
            "--accelerate_visible_devices",
        )
        if isinstance(accelerate_visible_devices, str):
            tokens = [token.strip() for token in accelerate_visible_devices.split(",") if token.strip()]
            if tokens:
                selected_device_ids = tokens
        elif isinstance(accelerate_visible_devices, (list, tuple, set)):
            tokens: List[str] = []
            for item in accelerate_visible_devices:
                if isinstance(item, str):
                    stripped = item.strip()
                    if stripped:
                        tokens.append(stripped)
                else:
                    try:
                        tokens.append(str(int(item)))
                    except (TypeError, ValueError):
                        continue
            if tokens:
                selected_device_ids = tokens

    def _normalize_visible_device_list(value: Optional[str]) -> Optional[str]:
        if not isinstance(value, str):
            return None
        tokens = [token.strip() for token in value.split(",") if token.strip()]
        if not tokens:
            return None
        if len(tokens) == 1 and tokens[0].lower() in {"all", "none", "void"}:
            return None
        return ",".join(tokens)

    def _resolve_hf_token() -> Optional[str]:
        possible_env_vars = (
            "HUGGINGFACEHUB_API_TOKEN",
            "HUGGINGFACE_HUB_TOKEN",
            "HF_TOKEN",
            "HF_API_TOKEN",
        )
        for env_var in possible_env_vars:
            token = os.environ.get(env_var)
            if token:
                return token
        try:
            from huggingface_hub import get_token as hf_get_token

            token = hf_get_token()
            if token:
                return token
        except Exception:
            pass
        return None

    hf_token = _resolve_hf_token()

    def _launch_with_accelerate() -> Optional[int]:
        import json
        import logging
        import os
        import shlex
        import shutil
        import subprocess
        import tempfile
        import threading
        import time
        from pathlib import Path

        import simpletuner.helpers.log_format  # noqa: F401
        from simpletuner.helpers.configuration.sanitization import sanitize_cli_args_for_public_logging

        launch_logger = logging.getLogger("SimpleTuner")
        use_accelerate = False
        psutil_module = globals().get("psutil", None)

        # Shared storage for child PIDs collected before termination signals are sent.
        # This ensures we can kill children even after the parent exits and they get reparented to init.
        _collected_child_pids: list[int] = []

        def _terminate_process(proc: subprocess.Popen) -> None:
            """
            Local terminate helper so we don't depend on outer-scope bindings when used in subprocess contexts.
            Collects child PIDs before sending signals to ensure descendants are terminated even if they're
            in different process groups (common with accelerate/torch distributed workers).
            """
            try:
                if proc.poll() is None:
                    pid = getattr(proc, "pid", None)
                    # Collect child PIDs BEFORE sending any signals - this is critical because
                    # if the parent dies first, children get reparented to init and we lose them
                    if psutil_module is not None and pid:
                        try:
                            parent = psutil_module.Process(pid)
                            for child in parent.children(recursive=True):
                                try:
                                    if child.pid not in _collected_child_pids:
                                        _collected_child_pids.append(child.pid)
                                except Exception:
                                    pass
                        except Exception:
                            pass

                    # Send SIGTERM to process group
                    if os.name != "nt" and pid:
                        try:
                            os.killpg(os.getpgid(pid), signal.SIGTERM)
                        except Exception:
                            pass
                    else:
                        proc.terminate()

                    # Also send SIGTERM to collected children (handles different process groups)
                    for child_pid in _collected_child_pids:
                        try:
                            os.kill(child_pid, signal.SIGTERM)
                        except ProcessLookupError:
                            pass
                        except Exception:
                            pass
            except Exception as exc:
                launch_logger.warning("Failed to terminate accelerate process cleanly: %s", exc)

        def _kill_process(proc: subprocess.Popen) -> None:
            """Force-kill helper paired with _terminate_process."""
            try:
                pid = getattr(proc, "pid", None)
                # Try to collect any additional children (may find fewer if parent died)
                if psutil_module is not None and pid:
                    try:
                        parent = psutil_module.Process(pid)
                        for child in parent.children(recursive=True):
                            try:
                                if child.pid not in _collected_child_pids:
                                    _collected_child_pids.append(child.pid)
                            except Exception:
                                pass
                    except Exception:
                        pass

                # Send SIGKILL to process group if parent still alive
                if proc.poll() is None:
                    if os.name != "nt" and pid:
                        try:
                            os.killpg(os.getpgid(pid), signal.SIGKILL)
                        except Exception:
                            pass
                    else:
                        proc.kill()

                # Kill all collected children with SIGKILL (handles orphaned processes)
                for child_pid in _collected_child_pids:
                    try:
                        os.kill(child_pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                    except Exception:
                        pass
            except Exception as exc:
                launch_logger.warning("Failed to kill accelerate process: %s", exc)

        nonlocal accelerate_config_path, main_process_port_value, machine_rank_value

        config_candidate = accelerate_config_path
        if isinstance(config_candidate, str) and config_candidate.strip():
            use_accelerate = True

        extra_candidate = accelerate_extra_args
        if isinstance(extra_candidate, str) and extra_candidate.strip():
            use_accelerate = True

        proc_count = _safe_int(requested_processes, 1)
        machine_count = _safe_int(requested_machines, 1)
        if proc_count > 1 or machine_count > 1:
            use_accelerate = True

        dyn_backend_normalized = (requested_dynamo_backend or "").strip().lower()
        if dyn_backend_normalized and dyn_backend_normalized not in {"no", "none", ""}:
            use_accelerate = True

        if selected_device_ids:
            use_accelerate = True

        if not use_accelerate:
            return None

        signal_dir: Optional[Path] = None
        signal_file_path: Optional[Path] = None
        signal_thread: Optional[threading.Thread] = None
        signal_stop_event = threading.Event()
        signal_counts = {"manual_validation": 0, "manual_checkpoint": 0}
        signal_lock = threading.Lock()
        relay_error_logged = False

        def _persist_signal_counts() -> None:
            if not signal_file_path:
                return
            payload: dict[str, int] = {}
            with signal_lock:
                if signal_counts["manual_validation"]:
                    payload["manual_validation"] = signal_counts["manual_validation"]
                if signal_counts["manual_checkpoint"]:
                    payload["manual_checkpoint"] = signal_counts["manual_checkpoint"]
            try:
                target_path = signal_file_path
                tmp_path = signal_file_path.with_suffix(".tmp")
                with tmp_path.open("w", encoding="utf-8") as handle:
                    json.dump(payload, handle)
                    handle.flush()
                    os.fsync(handle.fileno())
                os.replace(tmp_path, target_path)
            except Exception as exc:
                launch_logger.debug("Failed to write accelerate trigger file: %s", exc)

        def _prepare_signal_file() -> None:
            nonlocal signal_dir, signal_file_path
            if not (callable(manual_validation_consumer) or callable(manual_checkpoint_consumer)):
                return
            try:
                signal_dir = Path(tempfile.mkdtemp(prefix="simpletuner_accel_signals_"))
                signal_file_path = signal_dir / "triggers.json"
                with signal_file_path.open("w", encoding="utf-8") as handle:
                    json.dump({}, handle)
                    handle.flush()
                    os.fsync(handle.fileno())
            except Exception as exc:
                launch_logger.warning("Could not set up manual trigger relay for accelerate: %s", exc)
                signal_dir = None
                signal_file_path = None

        def _start_signal_relay() -> None:
            nonlocal signal_thread, relay_error_logged  # noqa: F824
            if not signal_file_path:
                return

            def _relay_triggers() -> None:
                nonlocal relay_error_logged
                while not signal_stop_event.is_set():
                    triggered = False
                    try:
                        if callable(manual_validation_consumer) and manual_validation_consumer():
                            with signal_lock:
                                signal_counts["manual_validation"] += 1
                            triggered = True
                        if callable(manual_checkpoint_consumer) and manual_checkpoint_consumer():
                            with signal_lock:
                                signal_counts["manual_checkpoint"] += 1
                            triggered = True
                        relay_error_logged = False
                    except Exception as exc:
                        if not relay_error_logged:
                            launch_logger.warning("Manual trigger relay failed: %s", exc)
                            relay_error_logged = True
                    if triggered:
                        _persist_signal_counts()
                    signal_stop_event.wait(0.25)

            signal_thread = threading.Thread(target=_relay_triggers, daemon=True)
            signal_thread.start()

        def _cleanup_signal_relay() -> None:
            signal_stop_event.set()
            if signal_thread is not None:
                signal_thread.join(timeout=1.5)
            if signal_dir is not None:
                try:
                    shutil.rmtree(signal_dir, ignore_errors=True)
                except Exception:
                    pass

        launch_env = os.environ.copy()

        # Don't force colors in subprocess - stdout is piped so colorized output
        # would leak escape codes into debug.log and webhook messages.
        # Preserve SIMPLETUNER_WEB_MODE/SIMPLETUNER_DISABLE_COLORS from parent env.
        launch_env.pop("FORCE_COLOR", None)
        launch_env.pop("CLICOLOR_FORCE", None)

        if job_id:
            launch_env["SIMPLETUNER_JOB_ID"] = job_id
        if hf_token:
            for var in ("HUGGINGFACEHUB_API_TOKEN", "HUGGINGFACE_HUB_TOKEN", "HF_TOKEN", "HF_API_TOKEN"):
                launch_env.setdefault(var, hf_token)

        if selected_device_ids:
            launch_env["CUDA_VISIBLE_DEVICES"] = ",".join(selected_device_ids)
        elif not _normalize_visible_device_list(launch_env.get("CUDA_VISIBLE_DEVICES")):
            provider_visible_devices = _normalize_visible_device_list(launch_env.get("NV_GPU"))
            if provider_visible_devices is None:
                provider_visible_devices = _normalize_visible_device_list(launch_env.get("NVIDIA_VISIBLE_DEVICES"))
            if provider_visible_devices is not None:
                launch_env["CUDA_VISIBLE_DEVICES"] = provider_visible_devices

        config_backend_value: Optional[str] = None
        config_env_value: Optional[str] = None
        if isinstance(config_payload, dict):
            config_backend_value = _extract_value(
                config_payload,
                "config_backend",
                "--config_backend",
                "CONFIG_BACKEND",
                "SIMPLETUNER_CONFIG_BACKEND",
            )
            config_env_value = _extract_value(
                config_payload,
                "config_environment",
                "--config_environment",
                "config_env",
                "--config_env",
                "environment",
                "--environment",
                "env",
                "--env",
            )
        if config_backend_value:
            backend_text = str(config_backend_value).strip()
            if backend_text:
                launch_env["SIMPLETUNER_CONFIG_BACKEND"] = backend_text
                launch_env["CONFIG_BACKEND"] = backend_text
        if config_env_value:
            env_text = str(config_env_value).strip()
            if env_text:
                launch_env.setdefault("SIMPLETUNER_ENVIRONMENT", env_text)
                launch_env.setdefault("SIMPLETUNER_ENV", env_text)
                launch_env.setdefault("ENV", env_text)

        # Normalise accelerate config path if provided
        config_file_arg = None
        if isinstance(accelerate_config_path, str) and accelerate_config_path.strip():
            expanded_path = os.path.expanduser(accelerate_config_path.strip())
            accelerate_config_path = expanded_path
            if os.path.isfile(expanded_path):
                config_file_arg = expanded_path
            else:
                launch_logger.warning(
                    "Accelerate config file not found at %s; falling back to CLI parameters", expanded_path
                )

        if mixed_precision_value:
            launch_env["MIXED_PRECISION"] = str(mixed_precision_value)
        launch_env.setdefault("MIXED_PRECISION", "bf16")

        if proc_count:
            launch_env["TRAINING_NUM_PROCESSES"] = str(proc_count)
        if machine_count:
            launch_env["TRAINING_NUM_MACHINES"] = str(machine_count)
        if dyn_backend_normalized:
            launch_env["TRAINING_DYNAMO_BACKEND"] = dyn_backend_normalized

        if accelerate_extra_args:
            launch_env["ACCELERATE_EXTRA_ARGS"] = str(accelerate_extra_args)

        if machine_count > 1:
            if not main_process_ip_value:
                raise ValueError(
                    "Main process IP is required when launching across multiple machines. "
                    "Provide it under Hardware > Accelerate settings or supply an accelerate config file."
                )
            if not main_process_port_value:
                raise ValueError(
                    "Main process port is required when launching across multiple machines. "
                    "Provide it under Hardware > Accelerate settings or supply an accelerate config file."
                )
            if machine_rank_value is None:
                raise ValueError(
                    "Machine rank must be specified for multi-node launches. "
                    "Set it under Hardware > Accelerate settings for each node."
                )

            main_process_port_int = _safe_int(main_process_port_value, 29500)
            if main_process_port_int <= 0:
                raise ValueError("Main process port must be a positive integer.")
            machine_rank_int = _safe_int(machine_rank_value, 0)
            if machine_rank_int < 0:
                raise ValueError("Machine rank must be zero or greater.")
            main_process_port_value = main_process_port_int
            machine_rank_value = machine_rank_int

        _prepare_signal_file()
        if signal_file_path:
            launch_env["SIMPLETUNER_ACCELERATE_SIGNAL_FILE"] = str(signal_file_path)

        extra_args = []
        if accelerate_extra_args:
            try:
                extra_args = shlex.split(str(accelerate_extra_args))
            except ValueError:
                launch_logger.warning("Failed to parse accelerate extra args; using raw string")
                extra_args = [str(accelerate_extra_args)]

        def _has_accelerate_distributed_selector(args: list[str]) -> bool:
            selectors = {
                "--multi_gpu",
                "--cpu",
                "--tpu",
                "--use_deepspeed",
                "--use_fsdp",
                "--use_megatron_lm",
            }
            for arg in args:
                option = arg.split("=", 1)[0]
                if option in selectors:
                    return True
            return False

        cmd = ["accelerate", "launch"]

        if config_file_arg:
            cmd.append(f"--config_file={config_file_arg}")
        else:
            if proc_count > 1 and not _has_accelerate_distributed_selector(extra_args):
                cmd.append("--multi_gpu")
            cmd.extend(
                [
                    f"--mixed_precision={launch_env.get('MIXED_PRECISION', 'bf16')}",
                    f"--num_processes={launch_env.get('TRAINING_NUM_PROCESSES', '1')}",
                    f"--num_machines={launch_env.get('TRAINING_NUM_MACHINES', '1')}",
                    f"--dynamo_backend={launch_env.get('TRAINING_DYNAMO_BACKEND', 'no')}",
                ]
            )
            if machine_count > 1:
                cmd.append(f"--main_process_ip={main_process_ip_value}")
                cmd.append(f"--main_process_port={main_process_port_value}")
                cmd.append(f"--machine_rank={machine_rank_value}")
                if same_network_value:
                    cmd.append("--same_network")

        if extra_args:
            cmd.extend(extra_args)

        import simpletuner

        train_py = simpletuner._get_package_dir() / "train.py"
        cmd.append(str(train_py))

        cli_args: list[str] = []
        if isinstance(config_payload, dict):
            train_cli_payload = dict(config_payload)
            metadata_keys = [key for key in list(train_cli_payload.keys()) if isinstance(key, str) and key.startswith("__")]
            for key in metadata_keys:
                train_cli_payload.pop(key, None)
            for accel_key in {
                "accelerate_config",
                "--accelerate_config",
                "accelerate_extra_args",
                "--accelerate_extra_args",
                "accelerate_visible_devices",
                "--accelerate_visible_devices",
                "accelerate_strategy",
                "--accelerate_strategy",
                "main_process_ip",
                "--main_process_ip",
                "main_process_port",
                "--main_process_port",
                "machine_rank",
                "--machine_rank",
                "same_network",
                "--same_network",
            }:
                train_cli_payload.pop(accel_key, None)
            for config_key in (
                "--webhook_config",
                "webhook_config",
                "--publishing_config",
                "publishing_config",
            ):
                webhook_value = train_cli_payload.get(config_key)
                if isinstance(webhook_value, (dict, list)):
                    try:
                        train_cli_payload[config_key] = json.dumps(webhook_value)
                    except Exception:
                        train_cli_payload.pop(config_key, None)
            from simpletuner.helpers.configuration.cli_utils import mapping_to_cli_args

            # Debug: log model_type and lora_type before converting to CLI args
            launch_logger.info(
                "run_trainer_job: config_payload contains model_type=%r, lora_type=%r",
                train_cli_payload.get("model_type") or train_cli_payload.get("--model_type"),
                train_cli_payload.get("lora_type") or train_cli_payload.get("--lora_type"),
            )

            cli_args = mapping_to_cli_args(train_cli_payload)
        if cli_args:
            launch_env.setdefault("CONFIG_BACKEND", "cmd")
            cmd.extend(cli_args)

        launch_logger.info(
            "Launching training via accelerate: %s",
            shlex.join(sanitize_cli_args_for_public_logging(cmd)),
        )

        popen_kwargs = {
            "env": launch_env,
            "stdout": subprocess.PIPE,
            "stderr": subprocess.STDOUT,
            "text": True,
            "bufsize": 1,
        }
        if os.name != "nt":
            popen_kwargs["preexec_fn"] = os.setsid
        try:
            process = subprocess.Popen(cmd, **popen_kwargs)
        except Exception:
            _cleanup_signal_relay()
            raise

        _start_signal_relay()

        output_lock = threading.Lock()
        import sys as _sys
        from collections import deque as _deque

        from simpletuner.helpers.log_format import strip_ansi as _strip_ansi

        recent_lines = _deque(maxlen=400)

        def _forward_output():
            if not process.stdout:
                return
            try:
                for line in iter(process.stdout.readline, ""):
                    if not line:
                        break
                    recent_lines.append(line.rstrip("\n"))
                    with output_lock:
                        try:
                            _sys.stdout.write(line)
                            _sys.stdout.flush()
                        except Exception:
                            # Fallback: print to stderr with ANSI codes stripped
                            # to avoid double-formatting and escape codes in logs/webhooks
                            print(_strip_ansi(line.rstrip()), file=_sys.stderr)
            except ValueError:
                # File handle was closed while the reader thread was still active
                return

        reader_thread = threading.Thread(target=_forward_output, daemon=True)
        reader_thread.start()

        try:
            while process.poll() is None:
                if callable(should_abort_callable) and should_abort_callable():
                    launch_logger.info("Abort requested; terminating accelerate launcher")
                    _terminate_process(process)
                    try:
                        process.wait(timeout=15)
                    except subprocess.TimeoutExpired:
                        launch_logger.warning("Accelerate process unresponsive; forcing kill")
                        _kill_process(process)
                    break
                time.sleep(0.5)
        except KeyboardInterrupt:
            launch_logger.info("Keyboard interrupt received; terminating accelerate launcher")
            _terminate_process(process)
            raise
        finally:
            reader_thread.join(timeout=2)
            if process.stdout:
                try:
                    process.stdout.close()
                except Exception:
                    pass
            if process.poll() is None:
                _terminate_process(process)
                try:
                    process.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    launch_logger.warning("Accelerate process still alive; forcing kill")
                    _kill_process(process)

        returncode = process.wait()
        _cleanup_signal_relay()
        if returncode != 0:
            # Extract error from stdout
            cleaned = [_strip_ansi(line.rstrip("\n")) for line in recent_lines]
            excerpt_lines = [line.strip() for line in cleaned[-80:] if line.strip()]
            excerpt = "\n".join(excerpt_lines) if excerpt_lines else None

            # Find the real exception, not subprocess.CalledProcessError wrapper
            best_line = None
            for line in reversed(excerpt_lines):
                lowered = line.lower()
                # Skip wrapper exceptions
                if "subprocess.calledprocesserror" in lowered or "accelerate" in lowered:
                    continue
                # Look for actual exceptions
                if any(x in line for x in ["Error:", "Exception:", "ValueError:", "RuntimeError:", "OSError:"]):
                    best_line = line
                    break

            summary = f"Accelerate launch exited with status {returncode}"
            if best_line:
                summary = f"{best_line[:400]}"
            elif excerpt_lines:
                # Last resort: use last non-wrapper line
                for line in reversed(excerpt_lines):
                    if "subprocess.calledprocesserror" not in line.lower():
                        summary = f"{summary}: {line[:200]}"
                        break

            launch_error = RuntimeError(summary[:512])
            if excerpt:
                setattr(launch_error, "_simpletuner_log_excerpt", excerpt)
            if recent_lines:
                setattr(launch_error, "_simpletuner_recent_log_lines", list(recent_lines))
            raise launch_error
        return returncode

    try:
        accelerate_result = _launch_with_accelerate()
    except Exception as exc:
        webhook_handler = StateTracker.get_webhook_handler()
        if webhook_handler is not None:
            webhook_handler.send(
                message=f"Training job failed to start: {exc}",
                message_level="error",
            )
            payload = {"status": "training_failed", "error": str(exc)}
            excerpt = getattr(exc, "_simpletuner_log_excerpt", None)
            if excerpt:
                payload["log_excerpt"] = excerpt
            try:
                import traceback

                payload["traceback"] = traceback.format_exc()
            except Exception:
                pass
            exclude_urls = _webui_callback_exclusions()
            webhook_handler.send_raw(
                structured_data=payload,
                message_type="training.status",
                message_level="error",
                job_id=StateTracker.get_job_id(),
                exclude_webhook_urls=exclude_urls,
            )
            try:
                APIState.set_state("training_status", "failed")
                APIState.set_state("current_job_id", None)
            except Exception:
                pass
        APIState.set_state("training_status", "failed")
        raise

    if accelerate_result is not None:
        return accelerate_result

    if hf_token:
        for var in ("HUGGINGFACEHUB_API_TOKEN", "HUGGINGFACE_HUB_TOKEN", "HF_TOKEN", "HF_API_TOKEN"):
            os.environ.setdefault(var, hf_token)

    try:
        trainer = Trainer(config=config_payload, job_id=job_id)

        if hf_token:
            trainer.hf_access_token = hf_token
        if callable(manual_validation_consumer):
            trainer.register_manual_validation_trigger(manual_validation_consumer)
        if callable(manual_checkpoint_consumer):
            trainer.register_manual_checkpoint_trigger(manual_checkpoint_consumer)

    except Exception as e:
        webhook_handler = StateTracker.get_webhook_handler()
        if webhook_handler is not None:
            webhook_handler.send(
                message=f"Training job failed to start: {e}",
                message_level="error",
            )
            payload = {"status": "training_failed", "error": str(e)}
            try:
                import traceback

                payload["traceback"] = traceback.format_exc()
            except Exception:
                pass
            exclude_urls = _webui_callback_exclusions()
            webhook_handler.send_raw(
                structured_data=payload,
                message_type="training.status",
                message_level="error",
                job_id=StateTracker.get_job_id(),
                exclude_webhook_urls=exclude_urls,
            )
            try:
                APIState.set_state("training_status", "failed")
                APIState.set_state("current_job_id", None)
            except Exception:
                pass
        raise e

    def _abort_monitor():
        import time

        if not callable(should_abort_callable):
            return
        while not trainer.should_abort:
            try:
                if should_abort_callable():
                    trainer.abort()
                    return
            except Exception:
                return
            time.sleep(0.5)

    if callable(should_abort_callable):
        trainer._external_abort_checker = should_abort_callable
        threading.Thread(target=_abort_monitor, daemon=True).start()

    trainer.run()
    return {"status": "completed"}
