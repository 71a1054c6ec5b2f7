"""``runbook lint``: the failure modes of the seeds, caught before launch, in a script, its configs and its sbatch file together.

:func:`lint_paths` reads Python training scripts (:mod:`helpers.lint.python_rules`), DeepSpeed JSON
(:mod:`helpers.lint.deepspeed_rules`), Accelerate YAML (:mod:`helpers.lint.accelerate_rules`) and
sbatch/shell launch scripts (:mod:`helpers.lint.shell_rules`), plus an optional pasted launch
command, and runs the cross-file rules: the world size from the launch files checks the DeepSpeed
batch arithmetic (Gilbreth 7.4), a raw ``deepspeed.initialize`` in a script makes
``"auto"`` and a missing optimizer errors (D18, §7.5 issue 1), bf16 in the JSON with float32
inputs in the script is §7.5 issue 2, accumulation set in two files is D18.
Each finding is a :class:`helpers.checks.Check` (built by :func:`helpers.lint.findings.finding`).
See docs/lint.md.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable, Sequence

from helpers import inputs
from helpers.checks import Check
from helpers.lint.findings import finding

UNREADABLE = "input-unreadable"

RULES: dict[str, str] = {
    # meta: an input the linter cannot read or parse
    UNREADABLE: "runbook lint",
    "config-unparsable": "D5, D17",
    "command-unparsable": "D7",
    "python-syntax": "runbook lint",
    # helpers.lint.python_rules
    "rank-gated-collective": "D21; Gilbreth 7.5",
    "rank-early-exit-collective": "D21",
    "rank-gated-object-used": "D21",
    "device-from-global-rank": "D3",
    "sampler-no-set-epoch": "D22",
    "rank-sliced-data": "D9, D22",
    "deepspeed-raw-backward": "D18",
    "find-unused-parameters": "D8",
    "batchnorm-without-syncbn": "D10",
    "fsdp-no-wrap-policy": "D12",
    "fsdp-partial-mixed-precision": "D14",
    "fsdp-full-state-dict-all-ranks": "D15",
    "write-on-every-rank": "D23",
    "hardcoded-master-port": "D4",
    "init-without-timeout": "MN3",
    "init-timeout-short": "https://docs.pytorch.org/docs/stable/distributed.html#torch.distributed.init_process_group",
    # cross-file (lint_texts)
    "half-config-float32-inputs": "Gilbreth 7.5",
    # helpers.lint.contract_rules (the APIs' documented preconditions, helpers.lint.contracts)
    "dataloader-sampler-and-shuffle": "https://docs.pytorch.org/docs/stable/data.html#torch.utils.data.DataLoader",
    "init-missing-rank-world-size": "https://docs.pytorch.org/docs/stable/distributed.html",
    "collective-before-init": "https://docs.pytorch.org/docs/stable/distributed.html",
    "nccl-no-device-binding": "https://docs.pytorch.org/docs/stable/distributed.html",
    "collective-before-set-device": "https://docs.pytorch.org/docs/stable/distributed.html",
    "fsdp-optimizer-before-wrap": "https://docs.pytorch.org/docs/stable/fsdp.html",
    "fsdp-optimizer-incompatible": "https://docs.pytorch.org/docs/stable/fsdp.html#torch.distributed.fsdp.CPUOffload",
    "wrapper-raw-backward": "https://huggingface.co/docs/accelerate/en/package_reference/accelerator",
    "syncbn-without-ddp": "https://docs.pytorch.org/docs/stable/generated/torch.nn.SyncBatchNorm.html",
    "load-without-map-location": "https://docs.pytorch.org/docs/stable/generated/torch.load.html",
    "nccl-cpu-tensor": "https://docs.pytorch.org/docs/stable/distributed.html",
    "gather-variable-shape": "https://github.com/huggingface/accelerate/blob/main/src/accelerate/utils/operations.py",
    "gathered-labels-without-rank-offset": "https://github.com/mlfoundations/open_clip/blob/main/src/open_clip/loss.py",
    "environ-getattr": "https://docs.python.org/3/library/os.html#os.environ",
    "rank-zero-falsy": "https://docs.python.org/3/library/stdtypes.html#truth-value-testing",
    "rank-seed-before-model-init": "https://docs.pytorch.org/docs/stable/fsdp.html",
    "fsdp-mesh-without-group": "https://docs.pytorch.org/tutorials/intermediate/TP_tutorial.html",
    "visible-devices-as-ordinal": "https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#cuda-environment-variables",
    "collective-result-discarded": "https://huggingface.co/docs/accelerate/en/package_reference/accelerator",
    "world-size-as-local": "https://docs.pytorch.org/docs/stable/elastic/run.html#environment-variables",
    "resume-skip-every-epoch": "https://huggingface.co/docs/accelerate/en/usage_guides/checkpoint",
    "grad-accum-from-device-count": "https://docs.pytorch.org/docs/stable/elastic/run.html",
    "undefined-attribute": "https://docs.python.org/3/reference/datamodel.html",
    "local-rank-as-global-rank": "https://docs.pytorch.org/docs/stable/elastic/run.html#environment-variables",
    "same-device-every-rank": "https://docs.pytorch.org/docs/stable/distributed.html#backends",
    "lr-steps-from-dataset-length": "https://github.com/huggingface/accelerate/blob/main/src/accelerate/scheduler.py",
    "same-seed-every-rank": "https://docs.pytorch.org/docs/stable/data.html#randomness-in-multi-process-data-loading",
    # helpers.lint.agreement_rules (what every rank computes alike; one default process group)
    # helpers.lint.signature_rules (keywords against the installed APIs' signatures)
    "api-unknown-attribute": "https://huggingface.co/docs/accelerate/en/package_reference/utilities",
    "api-unknown-kwarg": "https://huggingface.co/docs/accelerate/en/package_reference/utilities",
    "dist-api-unknown": "https://docs.pytorch.org/docs/stable/distributed.html",
    "env-int-parse": "https://slurm.schedmd.com/sbatch.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES",
    "rank-split-differs": "https://docs.pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler",
    "hash-per-process": "https://docs.python.org/3/reference/datamodel.html#object.__hash__",
    "clock-gated-collective": "https://docs.pytorch.org/docs/stable/distributed.html#collective-functions",
    "init-twice": "https://github.com/pytorch/pytorch/blob/main/torch/distributed/distributed_c10d.py",
    "world-size-from-device-count": "https://docs.pytorch.org/docs/stable/distributed.html#torch.distributed.init_process_group",
    "slurm-var-unknown": "https://slurm.schedmd.com/sbatch.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES",
    "slurm-env-misuse": "https://slurm.schedmd.com/sbatch.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES",
    "barrier-every-step": "https://huggingface.co/docs/accelerate/en/package_reference/accelerator",
    "main-process-object-every-rank": "https://huggingface.co/docs/accelerate/en/package_reference/accelerator",
    "ds-manual-accumulation": "https://www.deepspeed.ai/getting-started/#training",
    "rank-overwritten-on-resume": "https://docs.pytorch.org/docs/stable/elastic/run.html#environment-variables",
    "master-port-random-per-node": "https://docs.pytorch.org/docs/stable/distributed.html#environment-variable-initialization",
    # helpers.lint.python_rules with helpers.lint.wrappers (the DistributedDataParallel wrapper's data flow)
    "ddp-wrapper-attribute": "https://docs.pytorch.org/docs/stable/generated/torch.nn.Module.html",
    "amp-initialize-after-ddp": "https://nvidia.github.io/apex/amp.html",
    "metric-not-reduced": "https://github.com/karpathy/llm.c/pull/551",
    "collective-same-tensor-twice": "https://docs.pytorch.org/docs/stable/distributed.html#collective-functions",
    "unbound-after-ddp-branch": "https://docs.python.org/3/reference/executionmodel.html#resolution-of-names",
    # helpers.lint.grad_sync_rules (DDP's require_backward_grad_sync / no_sync contract)
    "sync-flag-after-forward": "https://docs.pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html",
    "no-sync-backward-only": "https://docs.pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html",
    "no-sync-misaligned": "https://docs.pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html",
    "ddp-bypassed": "https://docs.pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html",
    "backward-through-all-reduce": "https://docs.pytorch.org/docs/stable/distributed.html#autograd-enabled-communication-primitives",
    # helpers.lint.cross_rules (launch line <-> script)
    "env-init-without-launcher": "https://docs.pytorch.org/docs/stable/distributed.html",
    "rank-before-init": "https://docs.pytorch.org/docs/stable/distributed.html",
    "local-rank-arg-under-launcher": "https://docs.pytorch.org/docs/stable/elastic/run.html",
    "script-arg-unknown": "https://docs.pytorch.org/docs/stable/elastic/run.html",
    "script-arg-missing": "https://docs.python.org/3/library/argparse.html#required",
    "config-path-missing": "https://github.com/huggingface/accelerate/blob/main/src/accelerate/utils/deepspeed.py",
    "nccl-without-gpus": "https://docs.pytorch.org/docs/stable/distributed.html",
    "lightning-slurm-mismatch": "https://lightning.ai/docs/pytorch/stable/clouds/cluster_advanced.html",
    # helpers.lint.deepspeed_rules
    "ds-unknown-key": "D17",
    "ds-misplaced-key": "D17",
    "ds-invalid-section": "D17",
    "ds-zero-without-optimizer": "Gilbreth 7.5",
    "ds-batch-mismatch": "Gilbreth 7.4",
    "ds-batch-not-positive": "Gilbreth 7.4",
    "ds-offload-needs-stage": "https://www.deepspeed.ai/docs/config-json/",
    "ds-invalid-value": "https://www.deepspeed.ai/docs/config-json/",
    "ds-args-mismatch": "https://huggingface.co/docs/transformers/en/deepspeed",
    "ds-scheduler-overrides": "https://huggingface.co/docs/transformers/en/deepspeed#scheduler",
    "ds-zero3-save-without-gather": "https://www.deepspeed.ai/docs/config-json/#zero-optimizations-for-fp16-training",
    "ds-auto-raw-initialize": "D18",
    "ds-fp16-and-bf16": "D17",
    "zero-grad-in-accumulate": "https://github.com/huggingface/accelerate/blob/main/src/accelerate/optimizer.py",
    "optimizer-state-not-restored": "https://docs.pytorch.org/docs/stable/distributed.checkpoint.html",
    "state-overwritten-after-load": "https://docs.pytorch.org/tutorials/beginner/saving_loading_models.html",
    "scheduler-not-checkpointed": "https://docs.pytorch.org/docs/stable/optim.html",
    "shadowed-import-called": "https://docs.python.org/3/reference/executionmodel.html#resolution-of-names",
    "fsdp-meta-without-sync": "https://docs.pytorch.org/docs/stable/fsdp.html",
    "sbatch-option-unknown": "https://slurm.schedmd.com/sbatch.html",
    "sbatch-tasks-fewer-than-nodes": "https://slurm.schedmd.com/sbatch.html#OPT_nodes",
    "loader-not-prepared": "https://huggingface.co/docs/accelerate/en/package_reference/accelerator",
    "loader-not-preparable": "https://huggingface.co/docs/accelerate/en/package_reference/accelerator#accelerate.Accelerator.prepare",
    "zero3-state-dict-submodule": "https://huggingface.co/docs/accelerate/en/package_reference/accelerator",
    "clock-dependent-path": "https://deepspeed.readthedocs.io/en/latest/model-checkpointing.html",
    "ds-precision-mismatch": "https://www.deepspeed.ai/docs/config-json/#bfloat16-training-options",
    # helpers.lint.accelerate_rules
    "acc-invalid-config": "D5",
    "acc-ds-file-overrides": "D17",
    "acc-accumulation-twice": "D18",
    "acc-processes-not-divisible": "D5",
    "acc-processes-without-distribution": "https://github.com/huggingface/accelerate/blob/main/src/accelerate/commands/launch.py",
    "acc-multinode-ssh-launcher": "Gilbreth 4.3, 8.12",
    # helpers.lint.shell_rules (text only)
    "master-addr-not-exported": "Gilbreth 4.3",
    "nnodes-mismatch": "https://docs.pytorch.org/docs/stable/elastic/run.html",
    "shell-default-expansion": "https://www.gnu.org/software/bash/manual/html_node/Shell-Parameter-Expansion.html",
    "launcher-program-not-script": "https://docs.pytorch.org/docs/stable/elastic/run.html",
    # helpers.lint.engine_args_rules (what deepspeed.initialize is given)
    "ds-plateau-scheduler": "https://deepspeed.readthedocs.io/en/latest/initialize.html",
    "ds-iterable-training-data": "https://deepspeed.readthedocs.io/en/latest/initialize.html",
    "module-attr-without-ddp": "https://huggingface.co/docs/accelerate/en/package_reference/accelerator#accelerate.Accelerator.unwrap_model",
    "collective-in-sampler": "https://docs.pytorch.org/docs/stable/distributed.html#collective-functions",
    "ema-before-to-device": "https://github.com/huggingface/pytorch-image-models/blob/main/timm/utils/model_ema.py",
    "gather-not-for-metrics": "https://huggingface.co/docs/accelerate/en/package_reference/accelerator#accelerate.Accelerator.gather_for_metrics",
    "launcher-option-after-script": "https://docs.pytorch.org/docs/stable/elastic/run.html",
    "launcher-option-unknown": "https://docs.pytorch.org/docs/stable/elastic/run.html",
    "srun-no-script": "https://slurm.schedmd.com/srun.html#OPT_input",
    "fsdp-clip-grad-norm": "https://docs.pytorch.org/docs/stable/fsdp.html",
    "ddp-no-trainable-params": "https://github.com/pytorch/pytorch/blob/main/torch/nn/parallel/distributed.py",
    "launcher-env-ignored": "https://docs.pytorch.org/docs/stable/elastic/run.html#environment-variables",
    "lightning-sampler-replaced": "https://lightning.ai/docs/pytorch/stable/common/trainer.html#use-distributed-sampler",
    "sampler-seed-per-rank": "https://docs.pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler",
    "sampler-rng-differs": "https://github.com/pytorch/pytorch/blob/main/torch/utils/data/distributed.py",
    "eval-shard-unreduced": "https://docs.pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler",
    "metric-state-reduce": "https://lightning.ai/docs/torchmetrics/stable/pages/implement.html",
    "argparse-duplicate-option": "https://docs.python.org/3/library/argparse.html#conflict-handler",
    "compile-state-dict-prefix": "https://github.com/pytorch/pytorch/blob/main/torch/_dynamo/eval_frame.py",
    "ddp-state-dict-prefix": "https://docs.pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.state_dict",
    "collective-in-data-dependent-branch": "D21",
    "scheduler-steps-per-microbatch": "https://huggingface.co/docs/accelerate/en/usage_guides/gradient_accumulation",
    "ddp-buffer-after-wrap": "https://docs.pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html",
    "rank-gated-data-setup": "https://huggingface.co/docs/accelerate/en/package_reference/accelerator",
    "exception-skips-collective": "D21",
    "loader-wrapped-before-prepare": "https://huggingface.co/docs/accelerate/en/package_reference/accelerator",
    "ds-config-twice": "https://github.com/deepspeedai/DeepSpeed/blob/master/deepspeed/__init__.py",
    "shell-var-unset": "https://www.shellcheck.net/wiki/SC2153",
    "mpirun-count-flags": "https://www.open-mpi.org/doc/v4.1/man1/mpirun.1.php",
    "allreduce-sum-not-averaged": "https://docs.pytorch.org/docs/stable/distributed.html#collective-functions",
    "download-every-rank": "https://docs.pytorch.org/vision/stable/datasets.html",
    "cuda-before-set-device": "https://docs.pytorch.org/docs/stable/distributed.html",
    "env-str-as-number": "https://docs.python.org/3/library/os.html#os.environ",
    "undefined-name": "https://docs.python.org/3/reference/executionmodel.html#resolution-of-names",
    "ddp-before-to-device": "https://docs.pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html",
    "ddp-meta-module": "https://docs.pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html",
    "trained-module-not-wrapped": "https://docs.pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html",
    "spawn-result-used": "https://docs.pytorch.org/docs/stable/multiprocessing.html",
    "fsdp-wrap-class-mismatch": "https://huggingface.co/docs/transformers/main/en/fsdp",
    "rank-shard-unused": "https://docs.pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler",
    "iterable-not-sharded": "https://docs.pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset",
    "script-env-required": "https://github.com/NVIDIA/Megatron-LM/blob/main/megatron/training/arguments.py",
    "shell-syntax-error": "https://www.gnu.org/software/bash/manual/html_node/The-Set-Builtin.html",
    "srun-payload-split": "https://www.gnu.org/software/bash/manual/html_node/Lists.html",
    "shell-var-literal": "https://www.gnu.org/software/bash/manual/html_node/Quoting.html",
    "shell-positional-twice": "https://www.gnu.org/software/bash/manual/html_node/Special-Parameters.html",
    "shell-broken-continuation": "https://www.shellcheck.net/wiki/SC1101",
    "shell-c-without-command": "https://www.gnu.org/software/bash/manual/html_node/Invoking-Bash.html",
    "set-device-after-init": "https://docs.pytorch.org/docs/stable/distributed.html#torch.distributed.init_process_group",
    "launcher-env-unset": "https://docs.pytorch.org/docs/stable/elastic/run.html#environment-variables",
    "rank-gated-model-change": "https://docs.pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html",
    "sampler-not-distributed": "https://docs.pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler",
    "rank-split-drops": "https://docs.pytorch.org/docs/stable/generated/torch.split.html",
    "sampler-no-shuffle": "https://docs.pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler",
    "sampler-shuffle-ignored": "https://docs.pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler",
    "lightning-prepare-data-state": "https://lightning.ai/docs/pytorch/stable/data/datamodule.html#prepare-data",
    "node-index-formula": "https://docs.pytorch.org/docs/stable/distributed.html#launch-utility",
    "padding-formula": "https://docs.pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler",
    "sampler-positions-not-indices": "https://docs.pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler",
    "input-device-differs-from-model": "https://docs.pytorch.org/docs/stable/notes/cuda.html#cuda-semantics",
    "object-collective-unpicklable": "https://docs.pytorch.org/docs/stable/distributed.html#torch.distributed.all_gather_object",
    "lightning-readonly-property": "https://github.com/Lightning-AI/pytorch-lightning/blob/master/src/lightning/pytorch/core/module.py",
    "bucket-by-python-type": "https://pytorch.org/blog/pytorch-0_4_0-migration-guide/",
    "clip-inside-accumulation": "https://docs.pytorch.org/docs/stable/notes/amp_examples.html#gradient-accumulation",
    "frozen-policy-assigned": "https://docs.pytorch.org/docs/stable/distributed.fsdp.fully_shard.html#torch.distributed.fsdp.MixedPrecisionPolicy",
    "mesh-get-group-without-dim": "https://docs.pytorch.org/docs/stable/distributed.html#torch.distributed.device_mesh.DeviceMesh.get_group",
    "rank-function-not-called": "https://docs.python.org/3/library/stdtypes.html#truth-value-testing",
    "allreduce-accumulated-twice": "https://docs.pytorch.org/docs/stable/distributed.html#torch.distributed.all_reduce",
    "zero3-init-nested": "https://huggingface.co/docs/transformers/main/en/deepspeed#zero-3",
    "nproc-ignores-visible-devices": "https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#cuda-environment-variables",
    "unwrap-model-not-a-model": "https://huggingface.co/docs/accelerate/en/package_reference/accelerator#accelerate.Accelerator.unwrap_model",
    "spawn-args-not-tuple": "https://docs.pytorch.org/docs/stable/multiprocessing.html#spawning-subprocesses",
    "batch-size-not-int": "https://docs.pytorch.org/docs/stable/data.html#torch.utils.data.DataLoader",
    "dataset-len-not-sharded": "https://docs.pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset",
    "batch-times-world-size": "https://docs.pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler",
    "dataparallel-under-launcher": "https://docs.pytorch.org/docs/stable/generated/torch.nn.DataParallel.html",
    "wrong-collective-src-rank": "https://docs.pytorch.org/docs/stable/distributed.html#collective-functions",
    "gather-order-differs": "https://docs.pytorch.org/docs/stable/distributed.html#torch.distributed.all_gather",
    "quantized-model-no-device-map": "https://huggingface.co/docs/trl/en/sft_trainer#multi-gpu-training",
    "fsdp-inference-mode": "https://docs.pytorch.org/docs/stable/generated/torch.autograd.grad_mode.inference_mode.html",
    "launcher-var-unset": "https://www.gnu.org/software/bash/manual/html_node/Shell-Parameter-Expansion.html",
    # helpers.launch_traps.find_traps (sbatch/shell files and --command, through shell_rules.traps_as_findings)
    "standalone-multinode": "D2",
    "master-addr-missing": "D1",
    "master-addr-loopback": "D1, MN1",
    "master-addr-login-node": "https://slurm.schedmd.com/sbatch.html#OPT_SLURM_SUBMIT_HOST",
    "default-port-shared": "D4",
    "port-in-use": "D4",
    "nproc-exceeds-gpus": "D3",
    "accelerate-cpu-one-process": "D5",
    "deepspeed-ssh": "D6, Gilbreth 4.3, 8.12",
    "script-in-tmp": "Gilbreth 8.12",
    "args-in-tmp": "Gilbreth 8.12",
    "srun-tasks-per-node": "Gilbreth 8.2",
    "node-rank-fixed": "Gilbreth 4.3",
    "srun-export-none": "Gilbreth 8.12",
    "gloo-nccl-syntax": "MN2",
    "ifname-loopback": "Gilbreth 4.1, 4.2, MN2",
    "ifname-bridge": "MN2",
    "ifname-node-specific": "Gilbreth 8.12, MN2",
    "nccl-exclude-keeps-lo": "MN2",
    "single-node-net-transport": "Gilbreth 6.3",
    "nccl-net-disable-ignored": "Gilbreth 4.1",
    "multinode-ib-disabled": "Gilbreth 4.2, 8.3",
    "deprecated-async-error-handling": "MN3",
    "async-error-handling-off": "MN3",
}
"""Every rule id ``runbook lint`` (and :func:`helpers.launch_traps.find_traps`) can emit -> its seed (docs/lint.md).

``port-in-use`` comes only from ``find_traps(check_port=True)`` (the command builder), not from the
linter.  tests/unit/test_lint_summary_tables.py checks this table against the ids written in the
rule modules, so a new rule must be added here too.
"""
_SHELL_EXT = (".sh", ".sbatch", ".slurm", ".bash", ".job")


def _kind(path: str, text: str) -> str:
    low = path.lower()
    if low.endswith(".py"):
        return "python"
    if low.endswith((".md", ".markdown")):
        return "markdown"
    if low.endswith(".json"):
        return "json"
    if low.endswith((".yaml", ".yml")):
        return "yaml"
    if low.endswith(_SHELL_EXT) or text.startswith("#!") and ("sh" in text.splitlines()[0]) or "#SBATCH" in text:
        return "shell"
    if text.lstrip().startswith("{"):
        return "json"
    return "shell"


_FENCE = re.compile(r"^\s*(```+|~~~+)\s*([\w+-]*)")
_SHELL_INFO = {"", "bash", "sh", "shell", "console", "zsh", "shellsession"}


def markdown_shell(text: str) -> list[str]:
    """The shell code blocks of a Markdown file (a README with its launch lines), each as a text whose line numbers are
    the README's (the lines before it blank): the fenced blocks whose info string is empty or a shell (``bash``,
    ``sh``, ``console``...), a ``$ `` prompt dropped.  The prose and the other languages' blocks are not shell and are
    not linted; each block is its own launch (a README shows several ways to start the same script)."""
    blocks: list[str] = []
    lines: list[str] | None = None
    fence = ""
    shell = False
    for number, line in enumerate(text.splitlines()):
        m = _FENCE.match(line)
        if lines is None and m:
            fence, shell, lines = m.group(1), m.group(2).lower() in _SHELL_INFO, [""] * (number + 1)
        elif lines is not None and line.strip().startswith(fence):
            if shell and any(x.strip() for x in lines):
                blocks.append("\n".join(lines) + "\n")
            lines = None
        elif lines is not None:
            lines.append(re.sub(r"^(\s*)\$ ", r"\1", line))
    return blocks


def _unreadable(path: str, exc: BaseException) -> Check:
    """The ``input-unreadable`` finding for ``path``: one line, the reason (the CLI prints it and exits 2)."""
    if isinstance(exc, inputs.InputError):
        reason = exc.reason
    elif isinstance(exc, (RecursionError, MemoryError)):
        reason = "too deeply nested to analyse"
    else:
        reason = " ".join(str(exc).split())
    return finding(UNREADABLE, "error", path, 0, f"{path}: {reason}", "fix the input (or leave it out of the lint)",
                   "runbook lint")


def lint_texts(files: Sequence[tuple[str, str]], command: str | None = None) -> list[Check]:
    """Lint already-read files ``[(path, text), ...]`` together (and ``command``, shown as ``<command>``).

    A file that cannot be analysed (a launch line with an impossible value, nesting too deep for the parser,
    a config that is not JSON/YAML at all) gives one ``input-unreadable`` finding for that file; the
    others are still linted.

    Returns:
        The findings, sorted by file and line.
    """
    from helpers import launch_parse
    from helpers.lint import accelerate_rules, bundle_rules, contract_rules, cross_rules, deepspeed_rules, python_rules, shell_rules

    findings: list[Check] = []
    facts: list[python_rules.PyFacts] = []
    scripts: dict[str, tuple[str, list[Check], python_rules.PyFacts]] = {}
    ds_files: list[tuple[str, str, dict]] = []
    acc_files: list[tuple[str, str, dict]] = []
    recipes: list[tuple[str, str, dict]] = []  # YAML files of HF TrainingArguments
    layouts: list[tuple[str, str, dict]] = []  # YAML files that fix the parallel layout (nanotron)
    specs = []
    launches: list[tuple[str, str, object]] = []
    for path, text in files:
        try:
            kind = _kind(path, text)
            if kind == "python":
                got, fact = python_rules.lint_python(path, text, (contract_rules.run,))
                scripts[path] = (text, got, fact)
            elif kind in ("json", "yaml"):
                rules = deepspeed_rules if kind == "json" else accelerate_rules
                try:
                    data = rules.load(text, path)
                except inputs.InputError as exc:
                    if not exc.reason.startswith("not valid"):
                        raise
                    findings.append(finding("config-unparsable", "error", path, 1, exc.reason,
                                            "fix the JSON" if kind == "json" else "fix the YAML",
                                            "D17" if kind == "json" else "D5"))
                    fixed = deepspeed_rules.repair(text) if kind == "json" else None
                    if fixed is None:
                        continue
                    data = rules.load(fixed, path)  # an excerpt: analyse what it holds
                if kind == "json" and deepspeed_rules.is_deepspeed_config(data):
                    ds_files.append((path, text, data))
                elif kind == "yaml" and accelerate_rules.is_accelerate_config(data):
                    acc_files.append((path, text, data))
                elif cross_rules.training_arguments(data) is not None:  # YAML, or JSON for parse_json_file
                    recipes.append((path, text, data))
                elif kind == "yaml" and cross_rules.parallel_sizes(data) is not None:
                    layouts.append((path, text, data))
                elif bundle_rules.is_bundle(data):
                    findings += bundle_rules.lint_bundle(path, text, data)
            elif kind == "markdown":
                for block in markdown_shell(text):
                    got, spec = shell_rules.lint_shell(path, block)
                    # blocks are excerpts, not a script, and their $VARIABLES are the reader's to set
                    findings += [f for f in got if f.id not in ("shell-syntax-error", "launcher-var-unset",
                                                                "shell-var-unset")]
                    launches.append((path, block, spec))
                    if spec is not None:
                        specs.append(spec)
            elif accelerate_rules.from_env_report(text) is not None:  # `accelerate env` output (- key: value)
                acc_files.append((path, text, accelerate_rules.from_env_report(text)))
            else:
                usage = cross_rules.usage_contract(path, text)  # a script's --help output: its options
                if usage is not None:
                    facts.append(usage)  # type: ignore[arg-type]
                got, spec = shell_rules.lint_shell(path, text)
                findings += got
                launches.append((path, text, spec))
                if spec is not None:
                    specs.append(spec)
        except (ValueError, RecursionError, MemoryError) as exc:  # InputError is a ValueError
            findings.append(_unreadable(path, exc))
    several = {os.path.basename(sp.script) for _p, _t, sp in launches if sp is not None and sp.script and  # type: ignore[attr-defined]
               (sp.nproc_per_node != 1 or sp.nnodes != 1 or sp.kind == "deepspeed")}  # type: ignore[attr-defined]
    for got, fact in _across_scripts(scripts, several):
        findings += got
        facts.append(fact)
    findings += cross_rules.device_from_global_rank_across(facts)
    findings += cross_rules.rank_before_init_across(facts)
    findings += cross_rules.batch_times_world_size_across(facts)
    findings += cross_rules.cpu_tensor_to_collective_across(facts)
    findings += cross_rules.sampler_seed_across(facts)
    findings += cross_rules.iterable_epoch_never_set(facts)
    findings += cross_rules.unseeded_dataset_draw(facts)
    findings += cross_rules.setup_writes_every_rank(facts)
    findings += cross_rules.iterable_not_sharded_across(facts)
    findings += cross_rules.download_every_rank_across(facts)
    findings += cross_rules.listing_dir_across(facts)
    findings += cross_rules.env_none_parsed_across(facts)
    findings += cross_rules.cuda_before_set_device_across(facts)
    findings += cross_rules.clock_path_across(facts)
    findings += cross_rules.rank_only_object_across(facts)
    if command:
        try:
            got, spec = shell_rules.lint_shell("<command>", command)
            findings += got
            if spec is None:
                launch_parse.parse_command(command)  # raises NoLaunch, naming what it accepts
            specs.append(spec)
            launches.append(("<command>", command, spec))
        except ValueError as exc:
            findings.append(finding("command-unparsable", "error", "<command>", 1, str(exc),
                                         "paste the whole launch line", "D7"))
    findings = cross_rules.settle(findings, facts, launches)  # type: ignore[arg-type]
    findings += cross_rules.lint_cross(facts, launches)  # type: ignore[arg-type]
    findings += cross_rules.config_path_missing(launches, facts, [p for p, _t in files])  # type: ignore[arg-type]
    findings += cross_rules.unexported_to_child_script(launches)  # type: ignore[arg-type]
    world = next((s.nnodes * s.nproc_per_node for s in specs), None)
    if world is None:
        world = next((accelerate_rules.world_size(d) for _, _, d in acc_files if accelerate_rules.world_size(d)), None)
    raw = [f for f in facts if f.raw_ds_init]
    raw_init: bool | None = True if raw else (False if any(f.uses_accelerate or f.uses_hf_trainer for f in facts)
                                               else (False if facts else None))
    client_opt = any(f.ds_client_optimizer for f in raw)
    where = f"{raw[0].path}:{raw[0].ds_init_line}" if raw else ""
    saved_by = next((f"{f.path} (HF Trainer / Accelerate)" for f in facts if f.saves_model), "") or \
        next((f"{f.path} (engine.save_16bit_model)" for f in facts if f.saves_16bit), "")
    for path, text, data in ds_files:
        try:
            findings += deepspeed_rules.lint_deepspeed(path, text, data, world_size=world, raw_init=raw_init,
                                                       client_optimizer=client_opt, init_where=where,
                                                       saved_by=saved_by)
        except (ValueError, RecursionError, MemoryError) as exc:
            findings.append(_unreadable(path, exc))
            continue
        half = deepspeed_rules.enabled(data.get("bf16")) or deepspeed_rules.enabled(data.get("fp16"))
        for f in raw:
            if half and f.float_inputs and not any(x.id == "half-config-float32-inputs" and x.file == f.path
                                                   for x in findings):
                findings.append(finding(
                    "half-config-float32-inputs", "warning", f.path, f.float_inputs[0],
                    f"{path} enables bf16/fp16, so the engine's weights are half precision, but this tensor is built "
                    "float32: 'mat1 and mat2 must have the same dtype, but got Float and BFloat16'",
                    "create inputs with dtype=torch.bfloat16 (or cast the batch: x.to(model_engine.dtype))",
                    "Gilbreth 7.5"))
    findings = cross_rules.raw_backward_by_config(findings, ds_files)
    findings += cross_rules.ds_args_mismatch(launches, ds_files, acc_files, recipes)  # type: ignore[arg-type]
    findings += cross_rules.fsdp_offload_bnb(launches, recipes, acc_files)  # type: ignore[arg-type]
    findings += cross_rules.parallelism_vs_world_size(launches, layouts)  # type: ignore[arg-type]
    findings += cross_rules.ds_scheduler_overrides(launches, ds_files, facts)  # type: ignore[arg-type]
    findings += cross_rules.zero3_unwrapped_save(facts, ds_files, acc_files)  # type: ignore[arg-type]
    accel = next(((f.path, f.accelerator_grad_accum[0], str(f.accelerator_grad_accum[1])) for f in facts
                  if f.accelerator_grad_accum), None)
    ds_gas = next(((p, d.get("gradient_accumulation_steps")) for p, _, d in ds_files), None)
    sets_precision = any(spec is not None and spec.kind == "accelerate" and re.search(r"--mixed[-_]precision\b", text)
                         for _p, text, spec in launches)
    for path, text, data in acc_files:
        try:
            findings += accelerate_rules.lint_accelerate(path, text, data, accelerator_grad_accum=accel, ds_gas=ds_gas,
                                                         saved_by=saved_by, launch_sets_precision=sets_precision)
        except (ValueError, RecursionError, MemoryError) as exc:
            findings.append(_unreadable(path, exc))
    return sorted((_advice(f) for f in findings), key=lambda f: (f.file, f.line_no, f.id))


def _across_scripts(scripts: dict[str, tuple[str, list[Check], object]],
                    launched: frozenset[str] | set[str] = frozenset()) -> list[tuple[list[Check], object]]:
    """Each script's ``(findings, facts)``, after the facts one script gives another: a file that another linted
    file calls with a DistributedDataParallel-wrapped model (``evaluate(model)``, ``evaluate`` defined here) is linted
    again knowing which parameter holds the wrapper (helpers.lint.wrappers), and a file that calls another file's
    function returning one (``model, optimizer, ... = wrap_model_distributed(...)``) knowing what it returns; a file that calls another file's function
    returning a rank value, or whose functions and classes another file calls with one, is linted again knowing it
    (:meth:`helpers.lint.python_rules.PythonLinter._seed_rank_from_other_files`; two rounds, so a rank test made in
    ``dist.py``, passed by ``train.py`` to a constructor in ``trainer.py``, reaches ``trainer.py``); a finding that
    holds only in a distributed program (:attr:`helpers.lint.python_rules.PyFacts.deferred`) is kept when some linted
    file sets up data parallelism, or when a linted launch starts that script on several processes (``launched``:
    their file names)."""
    from helpers.lint import contract_rules, python_rules

    passed: dict[str, set[int | str]] = {}
    returned: dict[str, set[int | None]] = {}
    for _text, _got, fact in scripts.values():
        for name, positions in fact.ddp_passed.items():  # type: ignore[attr-defined]
            passed.setdefault(name, set()).update(positions)
        for name, at in fact.ddp_returns.items():  # type: ignore[attr-defined]
            returned.setdefault(name, set()).update(at)
    wraps = any(fact.wraps_ddp for _t, _g, fact in scripts.values())  # type: ignore[attr-defined]
    state = {path: (got, fact) for path, (_text, got, fact) in scripts.items()}
    used: dict[str, str] = {path: "" for path in scripts}
    for _round in range(2):
        facts = [f for _g, f in state.values()]
        funcs = set().union(*(f.rank_funcs for f in facts))  # type: ignore[attr-defined]
        colls = {k: v for f in facts for k, v in f.collective_funcs.items()}  # type: ignore[attr-defined]
        for path, (text, _got, _fact) in scripts.items():
            fact = state[path][1]
            mine = {name: pos for name, pos in passed.items() if name in fact.defines}  # type: ignore[attr-defined]
            theirs = {n for n in funcs - fact.defines if re.search(rf"\b{re.escape(n)}\s*\(", text)}  # type: ignore[attr-defined]
            given: dict[str, set[str | int]] = {}
            for other in facts:
                if other is fact:
                    continue
                for name, which in other.rank_passed.items():  # type: ignore[attr-defined]
                    if name in fact.defines | fact.classes:  # type: ignore[attr-defined]
                        given.setdefault(name, set()).update(which)
            called = {k: v for k, v in colls.items() if k not in fact.defines  # type: ignore[attr-defined]
                      and re.search(rf"(?:\.|(?<![\w.])){re.escape(k)}\s*\(", text)}  # mod.f( or f( imported by name
            seeds = (theirs, given, called) if theirs or given or called else None
            wrappers_in = {name: at for name, at in returned.items() if name not in fact.defines  # type: ignore[attr-defined]
                           and re.search(rf"(?:\.|(?<![\w.])){re.escape(name)}\s*\(", text)}
            key = repr((sorted(mine.items()), sorted(theirs), sorted((k, sorted(map(str, v))) for k, v in given.items()),
                        sorted(called), sorted((k, sorted(map(str, v))) for k, v in wrappers_in.items())))
            if (not mine and seeds is None and not wrappers_in) or key == used[path]:
                continue
            used[path] = key
            try:
                state[path] = python_rules.lint_python(path, text, (contract_rules.run,), ddp_params=mine or None,
                                                       rank_seeds=seeds, ddp_returns=wrappers_in or None)
            except (ValueError, RecursionError, MemoryError) as exc:
                state[path] = ([_unreadable(path, exc)], fact)
    return [(got + (fact.deferred if wraps or os.path.basename(path) in launched else []), fact)  # type: ignore[attr-defined]
            for path, (got, fact) in state.items()]


def _advice(check: Check) -> Check:
    """A WARN from a rule that only checks undecidable preconditions becomes INFO (``runbook lint``'s policy).

    ``default-port-shared`` and ``hardcoded-master-port`` are risks, not errors: whether another job holds the
    port is known only on that node at that time (helpers.lint.contracts marks them undecidable).  The command
    builder and ``build --check`` keep them as WARN (they run where the job will start).
    """
    from helpers.lint.contracts import advisory_rules

    if check.status == "WARN" and check.id in advisory_rules():
        check.status = "INFO"
    return check


def lint_paths(paths: Iterable[str | os.PathLike[str]], command: str | None = None) -> list[Check]:
    """Lint the files at ``paths`` together, plus an optional pasted launch ``command``.

    Every file is read through :func:`helpers.inputs.read_text` (regular files only, size and line length
    bounded, BOM dropped).  A file that cannot be read gives an ``input-unreadable`` error finding naming it
    (the CLI exits 2); the other files are still linted.

    Returns:
        The findings (:class:`~helpers.checks.Check`), sorted by file and line.
    """
    files, errors = inputs.read_each(paths)
    bad = [_unreadable(e.path, e) for e in errors]
    return bad + lint_texts(files, command)


__all__ = ["RULES", "UNREADABLE", "lint_paths", "lint_texts", "markdown_shell"]
