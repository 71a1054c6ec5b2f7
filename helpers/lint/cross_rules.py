"""Contracts between files: the launch line (or batch script) and the training script it starts.

* what the launcher passes and the script must accept: ``torch.distributed.launch`` passes ``--local-rank=N``
  (PyTorch >= 2.0, https://docs.pytorch.org/docs/stable/distributed.html#launch-utility), the ``deepspeed``
  launcher ``--local_rank=N`` (deepspeed/launcher/launch.py), torchrun nothing (``LOCAL_RANK`` in the
  environment); the arguments written after the script must be options its argparse parser defines;
* what the launcher sets and the script reads: ``init_process_group(env://)`` needs RANK/WORLD_SIZE/MASTER_*,
  which a bare ``python train.py`` does not set;
* what the allocation has and the script uses: ``nccl`` on an allocation with no GPU request, a Lightning
  ``Trainer(devices=, num_nodes=)`` that differs from ``--ntasks-per-node`` / ``--nodes``.

Every rule here decides only when both sides are read (the script's basename is the launch line's script).
"""

from __future__ import annotations

import os
import re
from collections.abc import Collection, Sequence
from typing import Any

from helpers import launch_parse
from helpers.checks import Check
from helpers.launch_traps import LaunchSpec
from helpers.lint.contract_rules import ScriptContract
from helpers.lint.contracts import _DS_LAUNCH, _INIT, _LAUNCH, _PL_SLURM, _TORCHRUN
from helpers.lint.findings import finding

_PY_LINE = re.compile(r"^[ \t]*(?:[A-Za-z_]\w*=\S*\s+)*(?:\S*/)?python[0-9.]*\s+(?:-u\s+)?([^\s-]\S*\.py)\b", re.M)


def _script(facts: Sequence[object], name: str) -> tuple[str, ScriptContract] | None:
    base = os.path.basename(name or "")
    for f in facts:
        sc = getattr(f, "contract", None)
        if sc is not None and base and os.path.basename(str(sc.extra.get("script", f.path))) == base:  # type: ignore[attr-defined]
            return f.path, sc  # type: ignore[attr-defined]
    return None


def _line_of(text: str, pattern: str) -> int:
    m = re.search(pattern, text, re.M)
    return text.count("\n", 0, m.start()) + 1 if m else 1


def lint_cross(facts: Sequence[object], launches: Sequence[tuple[str, str, LaunchSpec | None]]) -> list[Check]:
    """The launch <-> script findings.

    Args:
        facts: the linted scripts' :class:`helpers.lint.python_rules.PyFacts` (with ``contract``).
        launches: ``(path, text, spec)`` of each launch file and of ``--command`` (``spec`` None: no launch
            line the parser reads).
    """
    out: list[Check] = []
    for path, text, spec in launches:
        for m in _PY_LINE.finditer(text):
            got = _script(facts, m.group(1))
            if got is None or not got[1].env_init or got[1].spawns or not got[1].init_line or \
                    got[1].extra.get("checks_launch"):
                continue  # (a script that checks for a launcher runs as one process under plain python)
            if re.search(r"^\s*(export\s+)?(RANK|WORLD_SIZE)=", text, re.M):
                continue
            out.append(finding(
                "env-init-without-launcher", "error", path, text.count("\n", 0, m.start()) + 1,
                f"{m.group(1)} is started by plain python, one process with no RANK/WORLD_SIZE/MASTER_ADDR, and "
                f"init_process_group ({got[0]}:{got[1].init_line}) reads them from the environment: 'environment "
                "variable RANK expected, but not set'", "start it with torchrun --nproc-per-node=N (or srun + "
                "torchrun)", _INIT))
        if spec is None:
            continue
        got = _script(facts, spec.script)
        if got is None:
            continue
        script, sc = got
        if sc.options is None and sc.extra.get("options_from"):  # the parser lives in a linted module it imports
            parser = next(((f.path, f.contract) for f in facts if getattr(f, "contract", None) is not None  # type: ignore[attr-defined]
                           and f.contract.options is not None and  # type: ignore[attr-defined]
                           os.path.basename(f.path) == f"{sc.extra['options_from']}.py"), None)  # type: ignore[attr-defined]
            if parser is not None:
                script, sc = parser
        line = launch_parse.launch_line(text) or 1
        legacy = bool(re.search(r"torch\.distributed\.launch\b", text)) and not re.search(r"--use[-_]env", text)
        if legacy and sc.options is not None and "--local-rank" not in sc.options:
            had = "--local_rank" in sc.options
            out.append(finding(
                "local-rank-arg-under-launcher", "error", script, sc.options_line,
                "python -m torch.distributed.launch passes --local-rank=N (dashed since PyTorch 2.0) and this "
                f"parser defines {'only --local_rank' if had else 'no --local-rank'}: 'error: unrecognized "
                "arguments: --local-rank=0'",
                'parser.add_argument("--local-rank", "--local_rank", type=int), or switch to torchrun and read '
                "LOCAL_RANK", _LAUNCH))
        elif legacy and sc.options is not None and "--local_rank" not in sc.options:
            out.append(finding(
                "local-rank-arg-under-launcher", "warning", script, sc.options_line,
                "python -m torch.distributed.launch passes --local_rank=N (underscored) before PyTorch 2.0 and "
                "--local-rank=N since; this parser defines only --local-rank (argparse does not equate the two): "
                "'error: unrecognized arguments: --local_rank=0' on torch 1.x",
                'parser.add_argument("--local-rank", "--local_rank", type=int) (both spellings), or switch to '
                "torchrun and read LOCAL_RANK", _LAUNCH))
        elif spec.kind == "deepspeed" and "--no_local_rank" not in text and "--no-local-rank" not in text and \
                sc.options is not None and "--local_rank" not in sc.options:
            out.append(finding(
                "local-rank-arg-under-launcher", "error", script, sc.options_line,
                "the deepspeed launcher passes --local_rank=N to the script and this parser does not define it: "
                "'error: unrecognized arguments: --local_rank=0'",
                'parser.add_argument("--local_rank", type=int, default=-1) (or deepspeed --no_local_rank)',
                _DS_LAUNCH))
        elif spec.kind in ("torchrun", "srun+torchrun", "sbatch") and not legacy and sc.local_rank_arg and \
                sc.uses_args_local_rank and not sc.reads_local_rank_env:
            out.append(finding(
                "local-rank-arg-under-launcher", "error", script, sc.options_line,
                "torchrun passes no --local-rank (it sets LOCAL_RANK in the environment) and the script takes its "
                "device from args.local_rank: every rank keeps the default (all on one GPU, or not distributed)",
                "local_rank = int(os.environ['LOCAL_RANK'])", _TORCHRUN))
        given = [a.split("=", 1)[0] for a in spec.script_args]
        if sc.extra.get("ds_config_in_call") and ({"--deepspeed_config", "--deepscale_config"} & set(given)):
            out.append(finding(
                "ds-config-twice", "error", script, sc.extra["ds_config_in_call"],
                f"deepspeed.initialize(args=args, config=...) here, and {path} passes --deepspeed_config: with both, "
                "DeepSpeed stops with 'Not sure how to proceed, we were given deepspeed configs in the deepspeed "
                "arguments and deepspeed.initialize() function call'",
                "give the config once: drop config= from deepspeed.initialize, or --deepspeed_config from the launch "
                "line", "https://github.com/deepspeedai/DeepSpeed/blob/master/deepspeed/__init__.py"))
        if sc.options is not None:
            out += _unknown_args(path, line, spec, sc, script)
            out += _missing_args(path, line, spec, sc, script)
        fixed = sc.extra.get("const_device")
        if fixed and spec.nproc_per_node > 1 and "CUDA_VISIBLE_DEVICES" not in text and \
                not sc.extra.get("sets_visible_devices"):
            out.append(finding(
                "same-device-every-rank", "error", script, fixed[0],  # type: ignore[index]
                f"{fixed[1]} on every rank, and {path} starts {spec.nproc_per_node} ranks per node that all see the "  # type: ignore[index]
                "node's GPUs (the launcher sets LOCAL_RANK, not CUDA_VISIBLE_DEVICES): they all run on that one GPU "
                "('Duplicate GPU detected' with nccl)", "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))",
                "https://docs.pytorch.org/docs/stable/elastic/run.html#environment-variables"))
        if spec.kind == "sbatch" and spec.gpus_per_node == 0 and sc.backend == "nccl":
            out.append(finding(
                "nccl-without-gpus", "error", script, sc.init_line,
                f"init_process_group(backend='nccl') but {path} requests no GPU (no --gpus-per-node / --gres=gpu): "
                "'ProcessGroupNCCL is only supported with GPUs, no GPUs found!'",
                "request GPUs (#SBATCH --gpus-per-node=N) or use backend='gloo' on CPU nodes", _INIT))
    out += _scheduler_rank_under_torchrun(facts, launches)
    out += _lightning(facts, launches)
    out += nccl_unbound_across_files(facts)
    out += set_epoch_across_files(facts)
    out += raw_wandb_across_files(facts)
    out += lightning_sampler_replaced(facts)
    out += env_required_across(facts, launches)
    return out


def env_required_across(facts: Sequence[object], launches: Sequence[tuple[str, str, LaunchSpec | None]]) -> list[Check]:
    """A launch text that passes an option some linted Python file refuses to run with unless an environment variable
    holds a value (:func:`helpers.lint.contract_rules._env_requirements`: Megatron-LM raises "Using sequence
    parallelism requires setting the environment variable CUDA_DEVICE_MAX_CONNECTIONS to 1" for
    ``--sequence-parallel``), where the launch text never sets that variable: the job stops at argument parsing on
    every rank.  The program's own check is the contract."""
    needs = [(f.path, req) for f in facts  # type: ignore[attr-defined]
             for req in (getattr(getattr(f, "contract", None), "extra", {}) or {}).get("env_required", [])]
    out: list[Check] = []
    for path, text, _spec in launches:
        for where, (var, value, option, line, msg) in needs:
            spelled = {option, "--" + option[2:].replace("-", "_")}
            used = next((o for o in spelled if re.search(rf"(?<![\w-]){re.escape(o)}(?![\w-])", text)), None)
            if used is None or re.search(rf"\b{re.escape(var)}=", text):
                continue
            out.append(finding(
                "script-env-required", "error", path, _line_of(text, rf"(?<![\w-]){re.escape(used)}(?![\w-])"),
                f"{used} is passed, and {os.path.basename(where)}:{line} raises unless {var}={value}"
                f"{(': ' + repr(msg)) if msg else ''}; this script never sets {var}, so every rank stops there",
                f"export {var}={value} before the launch line", f"{where}:{line}"))
    return out


_DDP_SRC = "https://github.com/pytorch/pytorch/blob/main/torch/nn/parallel/distributed.py"


def nccl_unbound_across_files(facts: Sequence[object]) -> list[Check]:
    """The nccl process group, the DDP wrapper and the device in different files of one case, and no file binds the
    device: ``dist.init_process_group("nccl")`` in ``main.py``, ``DDP(model, device_ids=[LOCAL_RANK])`` in
    ``training.py``, tensors sent to ``cuda:{LOCAL_RANK}`` explicitly, ``torch.cuda.set_device`` nowhere.  DDP's
    contract: "spawn up N processes, ensuring that each process exclusively works on a single GPU from 0 to N-1.
    This can be done by either setting CUDA_VISIBLE_DEVICES for every process or by calling
    torch.cuda.set_device(i)" (the class docstring, torch/nn/parallel/distributed.py, ``_DDP_SRC``); without it the
    current device of every rank stays cuda:0, so the NCCL communicator, object collectives ("the device used is
    given by torch.cuda.current_device()", ``_INIT`` all_gather_object) and implicit CUDA work put a context on GPU 0
    for every rank (deepmodeling/deepmd-kit: GPU 0 runs out of memory first).  Only where the linted files hold both
    the nccl ``init_process_group`` and a ``DistributedDataParallel(device_ids=...)`` (the whole set-up is in view)
    and none binds the device; a single file with a bare ``'cuda'`` is the error ``nccl-no-device-binding`` of
    :func:`helpers.lint.device_rules.rule_nccl_no_device_binding` already.  A warning: a launcher may set
    ``CUDA_VISIBLE_DEVICES`` per process."""
    contracts = [(f.path, f.contract) for f in facts if getattr(f, "contract", None) is not None]  # type: ignore[attr-defined]
    if len(contracts) < 2 or any(sc.extra.get("binds_device") or sc.spawns for _p, sc in contracts):
        return []
    if any(sc.extra.get("calls_trainer") for _p, sc in contracts) and \
            not any(sc.extra.get("defines_trainer") for _p, sc in contracts):
        return []  # a framework Trainer (Lightning, HF) binds the device; a Trainer class of the case's own does not
    inits = [(p, sc) for p, sc in contracts if sc.backend == "nccl" and sc.init_line]
    ddp = [(p, sc.extra["ddp_device_ids"]) for p, sc in contracts if sc.extra.get("ddp_device_ids")]
    if not inits or not ddp or all(p == inits[0][0] for p, _line in ddp):
        return []
    path, sc = inits[0]
    where = ", ".join(f"{os.path.basename(p)}:{line}" for p, line in ddp)
    return [finding("nccl-no-device-binding", "warning", path, sc.init_line,
                    f"init_process_group('nccl') here and DistributedDataParallel(device_ids=...) at {where}, but no "
                    "linted file calls torch.cuda.set_device(local_rank): every rank's current device stays cuda:0, "
                    "so NCCL and implicit CUDA work put a context and buffers of every rank on GPU 0",
                    "torch.cuda.set_device(local_rank) before init_process_group (or "
                    "init_process_group(..., device_id=torch.device('cuda', local_rank)))", _DDP_SRC)]


def _scheduler_rank_under_torchrun(facts: Sequence[object],
                                   launches: Sequence[tuple[str, str, LaunchSpec | None]]) -> list[Check]:
    """A torchrun / ``torch.distributed.launch`` line starting several processes, while the linted code that calls
    ``init_process_group(rank=..., world_size=...)`` takes the rank only from a scheduler's variables
    (``SLURM_PROCID``, ``PMI_RANK``, ``OMPI_COMM_WORLD_RANK``) and never reads ``RANK`` / ``LOCAL_RANK``: torchrun gives
    each process its rank in ``RANK`` / ``LOCAL_RANK`` / ``WORLD_SIZE`` (``_TORCHRUN``, environment variables), the
    scheduler's variables are absent (or hold srun's task index), so every process takes the default (rank 0 of
    world size 1) and they collide on one rendezvous port ("Address already in use"; SAFECount's dist_helper)."""
    def several(text: str, sp: LaunchSpec) -> bool:  # a count given by a variable ($1, $NGPU) is not one process
        count = re.search(r"--nproc[-_]per[-_]node[= ]\s*(\S+)", text)
        return sp.nproc_per_node != 1 or sp.nnodes != 1 or (count is not None and count.group(1) != "1")

    runs = [(p, t, sp) for p, t, sp in launches if sp is not None and sp.kind == "torchrun" and several(t, sp)]
    if not runs:
        return []
    out: list[Check] = []
    for f in facts:
        sc = getattr(f, "contract", None)
        line = sc.extra.get("rank_from_scheduler_only") if sc is not None else None
        if line:
            path = runs[0][0]
            out.append(finding(
                "launcher-env-ignored", "error", f.path, line,  # type: ignore[attr-defined]
                f"init_process_group takes its rank and world size from SLURM/MPI variables only, while "
                f"{os.path.basename(path)} starts several processes with torchrun, which "
                "sets RANK, LOCAL_RANK and WORLD_SIZE instead: every process becomes rank 0 of 1 (the processes "
                "collide on the rendezvous port: 'Address already in use')",
                "read RANK / WORLD_SIZE / LOCAL_RANK first (int(os.environ['RANK'])), falling back to the scheduler's "
                "variables", _TORCHRUN + "#environment-variables"))
    return out


def set_epoch_across_files(facts: Sequence[object]) -> list[Check]:
    """A shuffling ``DistributedSampler`` made in one file (a loader factory) and the epoch loop in another, and no
    linted file calls ``set_epoch``: the sampler's order is seeded by its epoch, so every epoch replays the first one's
    order (D22; the sampler's docs: "calling the set_epoch() method at the beginning of each epoch before creating the
    DataLoader iterator is necessary to make shuffling work properly across multiple epochs").  The single-file form
    is :meth:`helpers.lint.python_rules.PythonLinter.rule_sampler_set_epoch`."""
    if any(getattr(f, "calls_set_epoch", False) for f in facts):
        return []
    makers = [f for f in facts if getattr(f, "shuffling_sampler", 0)]
    loops = [f for f in facts if getattr(f, "epoch_loop", False)]
    if not makers or not loops:
        return []
    maker = makers[0]
    return [finding("sampler-no-set-epoch", "warning", maker.path, maker.shuffling_sampler,  # type: ignore[attr-defined]
                    f"DistributedSampler shuffles with a seed fixed by its epoch; the epoch loop is in "
                    f"{os.path.basename(loops[0].path)} and no linted file calls set_epoch: every epoch "  # type: ignore[attr-defined]
                    "sees the same order (silent)",
                    "call loader.sampler.set_epoch(epoch) at the start of each epoch", "D22")]


def lightning_sampler_replaced(facts: Sequence[object]) -> list[Check]:
    """A DataLoader given a sampler class of the linted files that shards by rank itself (not a
    ``DistributedSampler`` subclass), under a Lightning ``Trainer`` that leaves ``use_distributed_sampler`` at its
    default: Lightning then wraps any sampler that is not a ``DistributedSampler`` in its
    ``DistributedSamplerWrapper`` (``_requires_distributed_sampler``: "not isinstance(dataloader.sampler,
    DistributedSampler)"), which shards what the sampler already sharded: each rank gets 1/N of its share, the epoch
    is N times shorter and the step counts differ from the sampler's length (RVC-Boss/GPT-SoVITS set
    ``use_distributed_sampler=False`` for its bucket sampler).  Lightning's docs: "If you want to disable this logic,
    you can pass False and add your own distributed sampler"
    (https://lightning.ai/docs/pytorch/stable/common/trainer.html#use-distributed-sampler)."""
    trainers = [getattr(f, "lightning_trainer", 0) for f in facts]
    if not any(t > 0 for t in trainers) or any(t < 0 for t in trainers):
        return []
    own = {name: (f.path, line) for f in facts for name, line in getattr(f, "rank_samplers", {}).items()}  # type: ignore[attr-defined]
    for f in facts:
        for cls, line in getattr(f, "loader_samplers", []):
            if cls in own:
                return [finding("lightning-sampler-replaced", "warning", f.path, line,  # type: ignore[attr-defined]
                                f"DataLoader(sampler={cls}(...)): {cls} ({os.path.basename(own[cls][0])}:{own[cls][1]}) "
                                "splits the data by rank itself, and the Lightning Trainer keeps "
                                "use_distributed_sampler=True, so Lightning wraps it in a DistributedSamplerWrapper "
                                "that splits it again: each rank sees 1/N of its share",
                                "Trainer(..., use_distributed_sampler=False) (the sampler already shards)",
                                "https://lightning.ai/docs/pytorch/stable/common/trainer.html#use-distributed-sampler")]
    return []


def iterable_epoch_never_set(facts: Sequence[object]) -> list[Check]:
    """An ``IterableDataset`` of the linted files that shuffles by ``self.epoch`` and has a ``set_epoch``, trained by
    a Lightning loop, and no linted file calls ``set_epoch`` on it (or on anything but ``self``): Lightning's fit loop
    calls ``set_epoch`` only on the loader's ``sampler`` and ``batch_sampler`` (``_set_sampler_epoch``,
    lightning/fabric/utilities/data.py), never on the dataset, and an iterable dataset has neither, so its epoch
    stays at its start value and every epoch replays the same order.  A bump inside ``__iter__`` does not help once
    ``num_workers > 0``: each worker iterates its own copy of the dataset ("each worker process gets a different copy
    of the dataset object", https://docs.pytorch.org/docs/stable/data.html#multi-process-data-loading; cellarium-ml#40
    added an ``on_train_epoch_start`` that calls it)."""
    if not any(getattr(f, "lightning_loop", False) for f in facts) or \
            any(getattr(f, "sets_epoch_from_outside", False) or getattr(f, "uses_hf_trainer", False) for f in facts):
        return []
    return _at_first_recorded(facts, "iterable_epoch_classes", "sampler-no-set-epoch",
                              "{name} shuffles by self.epoch and has set_epoch, but no linted file calls it and "
                              "Lightning sets the epoch of a loader's sampler only, not of an iterable dataset: every "
                              "epoch sees the same order (a bump inside __iter__ happens in a worker's copy)",
                              "call it from the LightningModule: def on_train_epoch_start(self): "
                              "self.trainer.train_dataloader.dataset.set_epoch(self.current_epoch)",
                              "https://docs.pytorch.org/docs/stable/data.html#multi-process-data-loading")


def _at_first_recorded(facts: Sequence[object], attr: str, rule: str, title: str, fix: str, url: str) -> list[Check]:
    """One ``rule`` warning at the first entry of the ``{name: line}`` fact ``attr`` over the linted files (``title``
    with ``{name}`` filled in), or none when no file recorded one."""
    for f in facts:
        for name, line in getattr(f, attr, {}).items():
            return [finding(rule, "warning", f.path, line, title.format(name=name), fix, url)]  # type: ignore[attr-defined]
    return []


def unseeded_dataset_draw(facts: Sequence[object]) -> list[Check]:
    """A ``Dataset`` whose ``__init__`` picks its contents with the global random state (``random.shuffle(files)``
    then a slice), split across ranks by a ``DistributedSampler``, and no linted file seeds the global random state:
    Python seeds ``random`` "from the current system time or an operating system source" in each process
    (https://docs.python.org/3/library/random.html#random.seed), so every rank builds a different list, and the
    sampler's index slices, computed over equal lengths, pick from different lists: samples repeat across ranks and
    others are never seen (facebookresearch/fastMRI#63 added seed_everything).  The sampler's contract assumes one
    dataset: "It is especially useful in conjunction with DistributedDataParallel.  In such a case, each process can
    pass a DistributedSampler instance as a DataLoader sampler, and load a subset of the original dataset that is
    exclusive to it" (https://docs.pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler)."""
    if any(getattr(f, "seeds_global_rng", False) for f in facts) or \
            not any(getattr(f, "splits_by_sampler", False) for f in facts):
        return []
    return _at_first_recorded(facts, "unseeded_dataset_draws", "rank-split-differs",
                              "{name}.__init__ chooses its contents with the unseeded global random state and a "
                              "DistributedSampler splits it across ranks: each process draws its own list, so the "
                              "ranks' index slices pick from different lists (repeats, samples never seen)",
                              "seed every process alike before building the dataset (seed_everything(seed) / "
                              "random.seed(seed)), or draw with random.Random(seed)",
                              "https://docs.python.org/3/library/random.html#random.seed")


def setup_writes_every_rank(facts: Sequence[object]) -> list[Check]:
    """A ``LightningDataModule.setup`` that calls, outside any rank gate, a function or class of the linted files that
    writes a file (a dataset whose constructor converts its inputs to one HDF5 file): Lightning runs ``setup`` "on
    every process" and ``prepare_data`` on one ("prepare_data is called from the main process ... setup is called from
    every process across all the nodes", https://lightning.ai/docs/pytorch/stable/data/datamodule.html#setup), so
    every rank writes the same file at once (torchmd/torchmd-net: the HDF5 conversion, later moved behind rank 0 and
    a barrier)."""
    writers = {name: f.path for f in facts for name in getattr(f, "writing_callables", set())}  # type: ignore[attr-defined]
    for f in facts:
        for callee, line, src in getattr(f, "setup_calls", []):
            if callee in writers:
                return [finding("write-on-every-rank", "warning", f.path, line,  # type: ignore[attr-defined]
                                f"{src} runs in LightningDataModule.setup, which Lightning calls on every process, "
                                f"and {callee} ({os.path.basename(writers[callee])}) writes a file: every rank writes "
                                "the same file at once", "do the writing in prepare_data (one process per node, or "
                                "per job with prepare_data_per_node=False), or on rank 0 followed by a barrier",
                                "https://lightning.ai/docs/pytorch/stable/data/datamodule.html#setup")]
    return []


def raw_backward_by_config(findings: list[Check], ds_files: Sequence[tuple[str, str, dict]]) -> list[Check]:
    """``deepspeed-raw-backward`` (``loss.backward()`` beside a DeepSpeed engine) settled by the linted DeepSpeed
    config: DeepSpeed supports a direct ``tensor.backward()`` since v0.18.3 ("Starting from v0.18.3, DeepSpeed also
    supports direct calls to tensor.backward()", https://deepspeed.readthedocs.io/en/latest/training.html) through
    the ZeRO optimizer's hooks, so with a config whose ZeRO stage is 1-3 and that leaves fp16 off the finding is
    dropped; with stage 0 or fp16 it stays an error; with no DeepSpeed config among the linted files it is a warning
    that says what it depends on."""
    if not any(f.id == "deepspeed-raw-backward" for f in findings):
        return findings
    stages = []
    for _path, _text, data in ds_files:
        zero = data.get("zero_optimization") if isinstance(data.get("zero_optimization"), dict) else {}
        stage = zero.get("stage", 0)
        fp16 = isinstance(data.get("fp16"), dict) and data["fp16"].get("enabled") in (True, "true")
        stages.append(isinstance(stage, int) and stage >= 1 and not fp16)
    out = []
    for f in findings:
        if f.id == "deepspeed-raw-backward":
            if stages and all(stages):
                continue  # every linted config runs a direct backward through ZeRO's hooks
            if not stages:
                f.status = "WARN"
                f.title += " (no DeepSpeed config among the linted files: fine with ZeRO 1-3 and fp16 off)"
        out.append(f)
    return out


def raw_wandb_across_files(facts: Sequence[object]) -> list[Check]:
    """A ``wandb.log`` on every rank in one file (a LightningModule) while another file starts the W&B run on the
    main process only (``WandbLogger`` passed to the Trainer, ``accelerator.init_trackers``) and no linted file calls
    ``wandb.init``: the case-wide form of :func:`helpers.lint.checkpoint_rules.rule_raw_wandb_log`."""
    from helpers.lint.checkpoint_rules import RAW_WANDB_FIX, RAW_WANDB_MESSAGE

    if any(getattr(f, "calls_wandb_init", False) for f in facts) or \
            not any(getattr(f, "starts_rank0_run", False) for f in facts):
        return []
    logs = [(f.path, line) for f in facts for line in getattr(f, "raw_wandb_logs", [])[:1]]  # type: ignore[attr-defined]
    return [finding("main-process-object-every-rank", "error", path, line, RAW_WANDB_MESSAGE, RAW_WANDB_FIX,
                    "https://docs.wandb.ai/guides/track/log/distributed-training/") for path, line in logs[:1]]


def _nodes(spec: LaunchSpec | None, text: str) -> int:
    """The nodes a launch file starts its script on (the spec's, else the batch header's ``--nodes``)."""
    nodes = spec.nnodes if spec is not None else 1
    header = launch_parse.sbatch_header(text).get("--nodes", "")
    return max(nodes, int(header) if header.isdigit() else 1)


_NANOTRON_PARALLEL = "https://github.com/huggingface/nanotron/blob/main/src/nanotron/parallel/context.py"


def parallel_sizes(data: object) -> tuple[int, str, int] | None:
    """``(product, what, line key)`` of a training config's model-parallel layout that fixes the world size: nanotron's
    ``parallelism: {dp, tp, pp}`` and its context-parallel size (its ParallelContext asserts
    "TP*CP*DP*PP == WORLD_SIZE", ``_NANOTRON_PARALLEL``); None for any other file."""
    par = data.get("parallelism") if isinstance(data, dict) else None
    if not isinstance(par, dict) or not all(isinstance(par.get(k), int) for k in ("dp", "tp", "pp")):
        return None
    cp = next((par[k] for k in ("cp", "context_parallel_size") if isinstance(par.get(k), int)), 1)
    product = par["dp"] * par["tp"] * par["pp"] * cp
    return product, f"dp={par['dp']} x tp={par['tp']} x pp={par['pp']}" + (f" x cp={cp}" if cp != 1 else ""), 0


def parallelism_vs_world_size(launches: Sequence[tuple[str, str, LaunchSpec | None]],
                              configs: Sequence[tuple[str, str, dict]]) -> list[Check]:
    """``nnodes-mismatch`` between a launch line and the parallel layout of the config it passes (by file name):
    nanotron needs ``dp * tp * pp`` processes exactly (:func:`parallel_sizes`), and ``torchrun --nproc_per_node 2``
    with a config of 2 x 2 x 2 stops at start-up (nanotron's tiny-llama example)."""
    out: list[Check] = []
    for cpath, ctext, data in configs:
        sizes = parallel_sizes(data)
        if sizes is None:
            continue
        product, what, _ = sizes
        base = os.path.basename(cpath)
        for lpath, ltext, spec in launches:
            if spec is None or not any(os.path.basename(str(a)) == base for a in spec.script_args):
                continue
            world = spec.nnodes * spec.nproc_per_node
            if world == product:
                continue
            out.append(finding(
                "nnodes-mismatch", "error", lpath, _line_of(ltext, re.escape(base)),
                f"this launch starts {world} processes ({spec.nnodes} node(s) x {spec.nproc_per_node}) and passes "
                f"{base}, whose parallelism asks for {what} = {product}: the ranks do not fill the layout and the "
                "run stops at start-up", f"launch {product} processes (--nproc_per_node x --nnodes), or change the "
                "config's dp/tp/pp to multiply to the process count", _NANOTRON_PARALLEL))
    return out


def settle(findings: list[Check], facts: Sequence[object],
           launches: Sequence[tuple[str, str, LaunchSpec | None]]) -> list[Check]:
    """Findings one file raises that another file decides.

    * ``srun-tasks-per-node`` for ``srun python X.py`` (field ``direct:X.py``) is dropped when the linted ``X.py``
      starts its own processes (``mp.spawn``: one task per node is then right);
    * ``launcher-option-after-script`` (field ``script_args:--opt``) is dropped when the linted script the launch
      starts defines ``--opt`` itself;
    * ``local-rank-as-global-rank`` becomes an error when a linted launch starts that script on several nodes (the
      local rank repeats on every node: torchrun docs, ``_TORCHRUN``).
    """
    spawning = {os.path.basename(f.path) for f in facts  # type: ignore[attr-defined]
                if getattr(getattr(f, "contract", None), "spawns", False)}
    defined: dict[str, set[str]] = {}  # launch file -> the options its linted script writes out
    for path, _text, spec in launches:
        got = _script(facts, spec.script) if spec is not None else None
        if got is not None:
            defined[path] = {o.replace("_", "-") for o in got[1].extra.get("literal_options", ())}  # type: ignore[union-attr]
    multinode = {os.path.basename(spec.script) for _p, text, spec in launches if spec is not None and
                 _nodes(spec, text) > 1}
    out = []
    for f in findings:
        if f.id == "srun-tasks-per-node" and f.field.startswith("direct:") and f.field[7:] in spawning:
            continue
        if f.id == "launcher-option-after-script" and f.field[12:].replace("_", "-") in defined.get(f.file, ()):
            continue  # the script defines that option itself: it is the script's
        if f.id == "local-rank-as-global-rank" and f.status == "WARN" and os.path.basename(f.file) in multinode:
            f.status = "FAIL"
            f.title += " (the launch here starts it on several nodes)"
        out.append(f)
    return out


def _stray_positional(spec: LaunchSpec, sc: ScriptContract) -> str | None:
    """The first word of the launch line's script arguments that argparse would take as a positional argument, when
    the parser defines none (``train.py prompts.csv --strategy x`` for a parser of options only): argparse stops with
    "error: unrecognized arguments: prompts.csv".  Each option's arity comes from its ``action`` / ``nargs``; an option
    of variable arity, a custom action, an unknown option or a shell expansion ends the walk (undecided)."""
    arity = sc.extra.get("arity")
    if sc.extra.get("positionals") or not isinstance(arity, dict):
        return None
    args = list(spec.script_args)
    i = 0
    while i < len(args):
        a = args[i]
        if re.fullmatch(r"\d*[<>].*|&?\|{1,2}|&&|;|&", a):
            return None  # a redirection or a pipe: the script's arguments ended
        if a == "--" or "$" in a or "{" in a or "`" in a:
            return None
        if a.startswith("-") and not re.fullmatch(r"-\d.*", a):
            name = a.split("=", 1)[0]
            if name not in arity or arity[name] is None:
                return None
            i += 1 + (arity[name] if "=" not in a else 0)
            continue
        return a
    return None


def _names_option(given: str, options: Collection[str]) -> bool:
    """The option word ``given`` (``--lr``, ``--data``) names one of ``options``: itself, or a prefix of a long option
    (argparse's ``allow_abbrev``, on by default: https://docs.python.org/3/library/argparse.html#allow-abbrev)."""
    return given in options or (given.startswith("--") and any(o.startswith(given) for o in options
                                                                if o.startswith("--")))


def _unknown_args(path: str, line: int, spec: LaunchSpec, sc: ScriptContract, script: str) -> list[Check]:
    options = sc.options or set()
    stray = _stray_positional(spec, sc)
    if stray is not None:
        return [finding("script-arg-unknown", "error", path, line,
                        f"the launch line passes {stray!r} to {os.path.basename(script)} as a positional argument, and "
                        f"its argparse parser ({script}:{sc.options_line}) defines none: 'error: unrecognized "
                        f"arguments: {stray}'", "pass it through the option the script defines for it "
                        "(--prompt_path FILE ...)", _TORCHRUN)]
    for arg in spec.script_args:
        if arg == "--":
            break
        if not arg.startswith("-") or re.fullmatch(r"-\d.*", arg) or "$" in arg or "{" in arg:
            continue
        name = arg.split("=", 1)[0]
        if _names_option(name, options):
            continue
        return [finding("script-arg-unknown", "error", path, line,
                        f"the launch line passes {name} to {os.path.basename(script)}, whose argparse parser "
                        f"({script}:{sc.options_line}) does not define it: 'error: unrecognized arguments: {arg}'",
                        f"add parser.add_argument('{name}', ...) or drop it from the launch line", _TORCHRUN)]
    return []


_ARGPARSE = "https://docs.python.org/3/library/argparse.html#required"


def _missing_args(path: str, line: int, spec: LaunchSpec, sc: ScriptContract, script: str) -> list[Check]:
    """An option the script's parser declares ``required=True`` that the launch line does not pass: argparse stops
    every rank with "error: the following arguments are required: --x" (``_ARGPARSE``).  A long option may be given
    by a unique prefix (``allow_abbrev``).  Not decided where an argument the shell expands could hold options (a
    ``$ARGS`` or ``"$@"`` that is not an option's value), nor for ``--local_rank`` (the launcher passes it)."""
    args = list(spec.script_args)
    for i, arg in enumerate(args):
        if "$" in arg and not (i and args[i - 1].startswith("-") and "=" not in args[i - 1]) and \
                not (arg.startswith("-") and "=" in arg and "$" not in arg.split("=", 1)[0]):
            return []  # the expansion may hold the options themselves
    given = [g for g in (a.split("=", 1)[0] for a in args if a.startswith("-") and not re.fullmatch(r"-\d.*", a))
             if g != "--"]  # a bare "--" names no option
    for names, decl in sc.extra.get("required_options", ()):  # type: ignore[attr-defined]
        if any("local_rank" in n or "local-rank" in n for n in names):
            continue
        if any(_names_option(g, names) for g in given):
            continue
        return [finding("script-arg-missing", "error", path, line,
                        f"{os.path.basename(script)} declares {names[-1]} required ({script}:{decl}) and the launch "
                        f"line does not pass it: every rank stops with 'error: the following arguments are required: "
                        f"{'/'.join(names)}'", f"pass {names[-1]} <value> on the launch line (after the script)",
                        _ARGPARSE)]
    return []


def _lightning(facts: Sequence[object], launches: Sequence[tuple[str, str, LaunchSpec | None]]) -> list[Check]:
    """A Lightning Trainer's devices / num_nodes against the batch script that starts it: Lightning expects one SLURM
    task per device ("You set devices=N in Lightning, but the number of tasks per node configured in SLURM ... does
    not match", ``_PL_SLURM``); the tasks per node come from ``--ntasks-per-node`` or ``--ntasks`` over the nodes, the
    devices from the Trainer call or, for ``gpus=args.gpus``, from the option on the launch line (CSC's
    ``--ntasks=1`` with ``--gpus=4``: one process waits for three that SLURM never starts)."""
    out: list[Check] = []
    for path, text, _spec in launches:
        header = launch_parse.sbatch_header(text)
        if not header:
            continue
        tasks, nodes = header.get("--ntasks-per-node", ""), header.get("--nodes", "")
        if not tasks and header.get("--ntasks", "").isdigit() and (not nodes or nodes.isdigit()):
            tasks = str(int(header["--ntasks"]) // max(1, int(nodes or 1)))  # --ntasks=1 on one node: 1 per node
        for f in facts:
            sc = getattr(f, "contract", None)
            if sc is None or sc.trainer is None:
                continue
            tline, devices, num_nodes = sc.trainer
            option = sc.extra.get("trainer_devices_option")
            if devices is None and option and os.path.basename(f.path) in text:  # type: ignore[attr-defined]
                m = re.search(rf"{re.escape(str(option))}(?:=|\s+)(\d+)\b", text)  # srun python x.py --gpus=4
                devices = int(m.group(1)) if m else None
            if devices is not None and tasks.isdigit() and int(tasks) != devices:
                out.append(finding(
                    "lightning-slurm-mismatch", "error", f.path, tline,  # type: ignore[attr-defined]
                    f"Trainer(devices={devices}) but {path} sets --ntasks-per-node={tasks}: 'You set devices="
                    f"{devices} in Lightning, but the number of tasks per node configured in SLURM "
                    f"--ntasks-per-node={tasks} does not match'", f"devices={tasks} (one task per GPU)", _PL_SLURM))
            if num_nodes is not None and nodes.isdigit() and int(nodes) != num_nodes:
                out.append(finding(
                    "lightning-slurm-mismatch", "error", f.path, tline,  # type: ignore[attr-defined]
                    f"Trainer(num_nodes={num_nodes}) but {path} allocates --nodes={nodes}: the ranks wait for "
                    "nodes that are not there (or some nodes are idle)", f"num_nodes={nodes}", _PL_SLURM))
    return out


HF_MATCHED = (("train_micro_batch_size_per_gpu", "per_device_train_batch_size", 8),
              ("gradient_accumulation_steps", "gradient_accumulation_steps", 1),
              ("gradient_clipping", "max_grad_norm", 1.0),
              ("optimizer.params.lr", "learning_rate", 5e-5),
              ("optimizer.params.eps", "adam_epsilon", 1e-8),
              ("optimizer.params.weight_decay", "weight_decay", 0.0),
              ("scheduler.params.warmup_max_lr", "learning_rate", 5e-5),
              ("scheduler.params.warmup_num_steps", "warmup_steps", 0),
              ("fp16.enabled", "fp16", False),
              ("bf16.enabled", "bf16", False))
"""DeepSpeed key <-> HF ``TrainingArguments`` field and its default, as ``HfTrainerDeepSpeedConfig.trainer_config_process``
(transformers/integrations/deepspeed.py) matches them with ``fill_match``: a value that is not ``"auto"`` must equal
the argument (``fp16.enabled`` against ``fp16 or fp16_full_eval``, ``bf16.enabled`` against ``bf16 or
bf16_full_eval``)."""
_HF_DOCS = "https://huggingface.co/docs/transformers/en/deepspeed#deepspeed-and-trainer-parameter-summary"
_HF_KEYS = {hf for _ds, hf, _d in HF_MATCHED}


_HF_ARGS_SRC = "https://github.com/huggingface/transformers/blob/main/src/transformers/training_args.py"
_DS_CONFIG_SRC = "https://github.com/huggingface/accelerate/blob/main/src/accelerate/utils/deepspeed.py"
_LAUNCHER_FILES = {
    "deepspeed": ("hostfile", "DeepSpeed's launcher warns 'Unable to find hostfile, will proceed with training with "
                  "local resources only' and starts every rank on this node",
                  "https://github.com/deepspeedai/DeepSpeed/blob/master/deepspeed/launcher/runner.py"),
    "accelerate": ("config_file", "accelerate launch stops: 'The passed configuration file ... does not exist'",
                   "https://github.com/huggingface/accelerate/blob/main/src/accelerate/commands/config/config_args.py"),
}
"""Launcher options naming a file the launcher opens, with what happens when it is missing (each launcher's source)."""
_PATH = re.compile(r"[\w./+-]+")


def _file_named(value: str, bases: set[str], linted: Sequence[str]) -> bool:
    """Whether the relative path ``value`` exists under one of ``bases``, or a linted file has its name."""
    return any(os.path.exists(os.path.join(b, value)) for b in bases) or \
        any(os.path.basename(p) == os.path.basename(value) for p in linted)


def config_path_missing(launches: Sequence[tuple[str, str, LaunchSpec | None]], facts: Sequence[object],
                        linted: Sequence[str]) -> list[Check]:
    """``config-path-missing``: a launch names a file that is not there: a config handed to the script
    (``--deepspeed ds.json``, ``--deepspeed_config``, ``--fsdp_config``), or a file the launcher opens (deepspeed
    ``--hostfile``, accelerate ``--config_file``).

    Accelerate's ``HfDeepSpeedConfig`` (what the HF Trainer's ``deepspeed=`` builds) opens a path that exists, else
    reads the string as JSON or base64 and raises "Expected a string path to an existing deepspeed config, or a
    dictionary, or a base64 encoded string" (:data:`_DS_CONFIG_SRC`); DeepSpeed's own ``DeepSpeedConfig`` does the same;
    ``TrainingArguments.__post_init__`` opens a string ``fsdp_config`` with ``open()`` (:data:`_HF_ARGS_SRC`); the
    launchers' cases are in :data:`_LAUNCHER_FILES`.  Decided only where the layout is known: the launch file is on
    disk (not a README's block) and the script it runs is linted with it.  The path counts as present when it exists
    relative to the working directory, the launch file's folder or any folder above it, or the script's folder, when a
    linted file has its name (files given to the linter may have been copied out of their tree), or when the launch
    file names it twice (a file it writes first); a value with a shell variable is left.
    """
    out: list[Check] = []
    for path, text, spec in launches:
        if spec is None or path.endswith(".md") or (path != "<command>" and not os.path.isfile(path)):
            continue  # (a README's block is run from a folder it does not say)
        got = _script(facts, spec.script)
        if got is None:
            continue
        start = os.path.dirname(os.path.abspath(path)) if path != "<command>" else os.getcwd()
        bases = {os.getcwd()}
        while True:
            bases.add(start)
            if os.path.dirname(start) == start:
                break
            start = os.path.dirname(start)
        named: list[tuple[str, str, str, str]] = []  # (option, value, what happens, source)
        bases.add(os.path.dirname(os.path.abspath(got[0])))
        cli = _cli(spec.script_args)
        named += [(o, cli.get(o, ""), "'Expected a string path to an existing deepspeed config' when "
                       f"{os.path.basename(spec.script)} builds its arguments", _DS_CONFIG_SRC)
                  for o in ("deepspeed", "deepspeed_config")]
        named.append(("fsdp_config", cli.get("fsdp_config", ""), "TrainingArguments opens it as JSON when "
                      f"{os.path.basename(spec.script)} parses its arguments: FileNotFoundError", _HF_ARGS_SRC))
        if spec.kind in _LAUNCHER_FILES:
            option, what, src = _LAUNCHER_FILES[spec.kind]
            for _n, line in launch_parse.join_continuations(text):
                m = re.search(rf"\b{spec.kind}\b.*?--{option}(?:=|\s+)['\"]?([^\s'\"]+)", line)
                if m:
                    named.append((option, m.group(1), what, src))
        for option, value, what, src in named:
            if not re.fullmatch(r"[\w./+-]+\.(json|ya?ml|txt)|[\w./+-]*hostfile\w*", value) or \
                    _file_named(value, bases, linted) or len(re.findall(re.escape(value), text)) > 1:
                continue  # (a path the launch file also names elsewhere is one it writes, copies or tests)
            out.append(finding(
                "config-path-missing", "error", path, _line_of(text, re.escape(value)),
                f"the launch passes --{option} {value}, and no such file exists next to "
                f"{os.path.basename(path) if path != '<command>' else 'the working directory'} or in the folders "
                f"above it: {what}", "point the option at the file that exists (or commit the file)", src))
    return out


def _cli(args: Sequence[str]) -> dict[str, str]:
    out: dict[str, str] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if a.startswith("--"):
            key, eq, val = a[2:].partition("=")
            key = key.replace("-", "_")
            if not eq and i + 1 < len(args) and not args[i + 1].startswith("--"):
                val, i = args[i + 1], i + 1
            out[key] = val if (eq or val) else "true"
        i += 1
    return out


def _get(data: dict, dotted: str) -> object:
    cur: object = data
    for part in dotted.split("."):
        if not isinstance(cur, dict) or part not in cur:
            return None
        cur = cur[part]
    return cur


def _number(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def _flag(text: str) -> bool | None:
    low = text.strip().strip("'\"").lower()
    return True if low in ("true", "1", "yes") else (False if low in ("false", "0", "no") else None)


def training_arguments(data: object) -> dict[str, str] | None:
    """The HF ``TrainingArguments`` a YAML recipe holds, as ``{field: text}`` (booleans as ``"true"``/``"false"``):
    the mapping itself, or one of its top-level sections (``training:``), when it names ``output_dir`` and at least one
    field the DeepSpeed integration matches (:data:`HF_MATCHED`).  ``None`` when it holds none (any other YAML)."""
    if not isinstance(data, dict):
        return None
    for part in [data] + [v for v in data.values() if isinstance(v, dict)]:
        if "output_dir" in part and _HF_KEYS & set(part):
            return {str(k): (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in part.items()
                    if v is not None and not isinstance(v, (dict, list))}
    return None


def _differs(ds_val: object, hf_text: str | None, default: object) -> tuple[bool, object]:
    """Whether the DeepSpeed value ``ds_val`` differs from the argument (its text, or its default); and that value."""
    if isinstance(default, bool):
        hf_bool = _flag(hf_text) if hf_text is not None else default
        return (hf_bool is not None and isinstance(ds_val, bool) and ds_val != hf_bool), hf_bool
    hf_val = _number(hf_text) if hf_text is not None else default
    if hf_val is None or not isinstance(ds_val, (int, float)) or isinstance(ds_val, bool):
        return False, hf_val
    return float(ds_val) != float(hf_val), hf_val  # type: ignore[arg-type]


def ds_args_mismatch(launches: Sequence[tuple[str, str, LaunchSpec | None]],
                     ds_files: Sequence[tuple[str, str, dict]], acc_files: Sequence[tuple[str, str, dict]],
                     recipes: Sequence[tuple[str, str, dict]] = ()) -> list[Check]:
    """``ds-args-mismatch``: a DeepSpeed value (JSON via ``--deepspeed``, or an Accelerate YAML's ``deepspeed_config``)
    that differs from the HF ``TrainingArguments`` the launch line passes (or their defaults), which the HF
    integration refuses ('Please correct the following DeepSpeed config values that mismatch TrainingArguments').

    ``recipes`` are YAML files of TrainingArguments (:func:`training_arguments`): one that names its DeepSpeed file
    (``deepspeed: ds.json``) is matched against it; one that names none, against every DeepSpeed JSON linted with it
    (they were passed together), and then as a warning: the script may pick another file.
    """
    out: list[Check] = []
    sources: list[tuple[dict[str, str], str, bool]] = []  # (arguments, where they come from, certain link)
    for path, _text, spec in launches:
        if spec is not None:
            cli = _cli(spec.script_args)
            if "output_dir" in cli:  # HF TrainingArguments
                sources.append((cli, f"the launch in {os.path.basename(path)}", True))
    for path, _text, data in recipes:
        args = training_arguments(data)
        if args is not None:
            sources.append((args, os.path.basename(path), "deepspeed" in args))
    for args, where, certain in sources:
        ds_name = os.path.basename(args.get("deepspeed", ""))
        targets = [(p, t, d, True) for p, t, d in ds_files
                   if (os.path.basename(p) == ds_name if ds_name else not certain)]
        if certain:
            targets += [(p, t, d.get("deepspeed_config"), False) for p, t, d in acc_files
                        if isinstance(d.get("deepspeed_config"), dict) and str(d.get("distributed_type")) == "DEEPSPEED"]
        for path, text, data, json_file in targets:
            for ds_key, hf_key, default in HF_MATCHED:
                ds_val = _get(data, ds_key)
                if ds_val is None or ds_val == "auto" or (not json_file and hf_key not in args):
                    continue
                if isinstance(default, bool) and not ({"fp16", "bf16", "deepspeed"} & set(args)):
                    continue  # precision compared only where the arguments name one or pass TrainingArguments'
                    # own --deepspeed field (a custom parser with --output_dir and --deepspeed_config is not the Trainer)
                hf_text = args.get(hf_key)
                differs, hf_val = _differs(ds_val, hf_text, default)
                if not differs:
                    continue
                key = ds_key.split(".")[-1] if not ds_key.endswith(".enabled") else ds_key.split(".")[0]
                m = re.search(r'^\s*"?' + re.escape(key) + r'"?\s*:', text, re.M)
                line = text.count("\n", 0, m.start()) + 1 if m else 1
                shown = hf_text if hf_text is not None else f"{default} (its default)"
                out.append(finding(
                    "ds-args-mismatch", "error" if certain else "warning", path, line,
                    f"{ds_key}={ds_val!r} here but {where} sets {hf_key}={shown} for the HF Trainer: 'Please "
                    f"correct the following DeepSpeed config values that mismatch TrainingArguments values: - ds "
                    f"{ds_key}={ds_val} vs hf {hf_key}={hf_val}'", f'"{ds_key}": "auto" (the Trainer fills it in), '
                    f"or set {hf_key} to {ds_val}", _HF_DOCS))
    return out


_FSDP_CPU_OFFLOAD = "https://pytorch.org/docs/stable/fsdp.html#torch.distributed.fsdp.CPUOffload"


def _bnb_optimizer(name: str) -> bool:
    """Whether an HF ``optim`` / axolotl ``optimizer`` name is a bitsandbytes optimizer (transformers'
    ``OptimizerNames``: adamw_bnb_8bit, adamw_8bit, paged_adamw_8bit/32bit, lion_8bit, paged_lion_*, rmsprop_bnb*,
    ademamix_8bit...); torchao's ``adamw_torch_4bit`` / ``adamw_torch_8bit`` are not."""
    low = name.strip().strip("'\"").lower()
    return "torch" not in low and ("bnb" in low or low.endswith(("8bit", "32bit")) or low.startswith("paged_"))


def _offloads_params(args: dict, fsdp_config: object) -> bool:
    """Whether FSDP parameter offload is on: TrainingArguments' ``fsdp`` words (``full_shard auto_wrap offload``) or an
    ``fsdp_config`` with ``fsdp_offload_params`` / ``offload_params`` true (Accelerate's and axolotl's spelling)."""
    words = args.get("fsdp", "")
    if "offload" in str(words).lower().split() or "offload" in str(words).lower():
        return True
    if isinstance(fsdp_config, dict):
        return any(_flag(str(fsdp_config.get(k, ""))) for k in ("fsdp_offload_params", "offload_params"))
    return False


def fsdp_offload_bnb(launches: Sequence[tuple[str, str, LaunchSpec | None]], recipes: Sequence[tuple[str, str, dict]],
                     acc_files: Sequence[tuple[str, str, dict]]) -> list[Check]:
    """``fsdp-optimizer-incompatible``: a bitsandbytes optimizer (``optim`` / ``optimizer``: paged_adamw_8bit,
    adamw_bnb_8bit...) with FSDP parameter offload.  PyTorch's contract for ``CPUOffload(offload_params=True)``: it
    'offloads gradients to CPU as well, meaning that the optimizer step runs on CPU'
    (https://pytorch.org/docs/stable/fsdp.html#torch.distributed.fsdp.CPUOffload); bitsandbytes' optimizers ran on
    CUDA/XPU tensors only until bitsandbytes PR #1901 (2026-03), and its 8-bit states under FSDP are an open issue
    (bitsandbytes#89).  Sources: a recipe YAML (HF TrainingArguments or axolotl: ``fsdp`` + ``fsdp_config``), or a
    launch line's ``--optim`` with ``--fsdp ... offload`` or an Accelerate config linted with it whose
    ``fsdp_config.fsdp_offload_params`` is true."""
    out: list[Check] = []
    acc_offload = next((p for p, _t, d in acc_files if str(d.get("distributed_type")) == "FSDP"
                        and _offloads_params({}, d.get("fsdp_config"))), None)
    items: list[tuple[str, str, dict, object]] = []
    for path, text, data in recipes:
        part = next((p for p in [data] + [v for v in data.values() if isinstance(v, dict)]
                     if isinstance(p, dict) and ("optim" in p or "optimizer" in p)), None)
        if part is not None:
            items.append((path, text, part, part.get("fsdp_config")))
    for path, text, spec in launches:
        if spec is not None:
            cli = _cli(spec.script_args)
            if "optim" in cli or "optimizer" in cli:
                items.append((path, text, cli, None))
    for path, text, args, fsdp_config in items:
        name = str(args.get("optim") or args.get("optimizer") or "")
        if not _bnb_optimizer(name):
            continue
        own = _offloads_params(args, fsdp_config)
        if not own and not acc_offload:
            continue
        where = "" if own else str(acc_offload)
        m = re.search(r"(optim(izer)?\b\W*)" + re.escape(name), text)
        line = text.count("\n", 0, m.start()) + 1 if m else 1
        out.append(finding(
            "fsdp-optimizer-incompatible", "warning", path, line,
            f"{name} is a bitsandbytes optimizer and FSDP offloads the parameters to CPU"
            f"{' (' + os.path.basename(where) + ')' if where else ''}: with offload_params 'the optimizer step runs on "
            "CPU', and bitsandbytes' optimizers run on CUDA tensors (CPU support only since bitsandbytes PR #1901; "
            "8-bit states under FSDP: bitsandbytes#89)",
            "use a torch optimizer (adamw_torch / adamw_torch_fused) with offload, or keep the 8-bit optimizer and "
            "turn FSDP offload_params off", _FSDP_CPU_OFFLOAD))
    return out


def zero3_unwrapped_save(facts: Sequence[object], ds_files: Sequence[tuple[str, str, dict]],
                         acc_files: Sequence[tuple[str, str, dict]]) -> list[Check]:
    """``ds-zero3-save-without-gather`` at a script's ``accelerator.unwrap_model(model).save_pretrained(dir)`` with no
    ``state_dict=``, where a linted config runs ZeRO stage 3 (a DeepSpeed JSON's ``zero_optimization.stage`` or an
    Accelerate config's ``deepspeed_config.zero_stage``): under stage 3 each rank holds only its partition, so the
    unwrapped module's parameters are empty placeholders and save_pretrained writes them as they are.  Accelerate's
    documented ZeRO-3 save passes the gathered weights: ``save_pretrained(dir, is_main_process=...,
    save_function=accelerator.save, state_dict=accelerator.get_state_dict(model))``
    (https://huggingface.co/docs/accelerate/en/usage_guides/deepspeed#saving-and-loading; CarperAI/trlx)."""
    def field(data: object, section: str, key: str) -> str:  # a value of a config that may hold anything
        inner = data.get(section) if isinstance(data, dict) else None
        return str(inner.get(key)) if isinstance(inner, dict) else ""

    stage3 = next((p for p, _t, d in ds_files if field(d, "zero_optimization", "stage") == "3"), None) \
        or next((p for p, _t, d in acc_files if isinstance(d, dict) and str(d.get("distributed_type")) == "DEEPSPEED"
                 and field(d, "deepspeed_config", "zero_stage") == "3"), None)
    if stage3 is None:
        return []
    return [finding("ds-zero3-save-without-gather", "warning", f.path, f.unwrapped_save,  # type: ignore[attr-defined]
                    f"unwrap_model(...).save_pretrained(...) with no state_dict=, and {os.path.basename(stage3)} runs "
                    "ZeRO stage 3: each rank holds only its partition, so the unwrapped model's parameters are "
                    "empty placeholders and the saved model has no weights",
                    "save_pretrained(dir, is_main_process=accelerator.is_main_process, save_function=accelerator.save, "
                    "state_dict=accelerator.get_state_dict(model))",
                    "https://huggingface.co/docs/accelerate/en/usage_guides/deepspeed#saving-and-loading")
            for f in facts if getattr(f, "unwrapped_save", 0)]


def ds_scheduler_overrides(launches: Sequence[tuple[str, str, LaunchSpec | None]],
                           ds_files: Sequence[tuple[str, str, dict]], facts: Sequence[object]) -> list[Check]:
    """``ds-scheduler-overrides``: a ``"scheduler"`` section in the DeepSpeed JSON next to a scheduler chosen in code.

    * HF Trainer: with a scheduler in the config the Trainer builds none (transformers ``deepspeed_optim_sched``:
      ``if "scheduler" in config: lr_scheduler = DummyScheduler(optimizer)``), so the launch line's
      ``--lr_scheduler_type`` is ignored (https://huggingface.co/docs/transformers/en/deepspeed#scheduler);
    * Accelerate: a real scheduler passed to ``prepare`` next to a config scheduler raises 'You cannot specify a
      scheduler in the config file and in the code at the same time' (accelerate/accelerator.py
      ``_prepare_deepspeed``; https://huggingface.co/docs/accelerate/en/usage_guides/deepspeed).
    """
    out: list[Check] = []
    with_scheduler = [(p, t, d) for p, t, d in ds_files if isinstance(d.get("scheduler"), dict)]
    if not with_scheduler:
        return out
    for _path, _text, spec in launches:
        if spec is None:
            continue
        cli = _cli(spec.script_args)
        if "output_dir" not in cli or "lr_scheduler_type" not in cli:
            continue
        ds_name = os.path.basename(cli.get("deepspeed", ""))
        for path, text, data in with_scheduler:
            if ds_name and os.path.basename(path) == ds_name:
                out.append(finding(
                    "ds-scheduler-overrides", "warning", path, _line_of(text, r'"scheduler"\s*:'),
                    f"the DeepSpeed config defines a {data['scheduler'].get('type', '')} scheduler, so the HF Trainer "
                    f"builds none and the launch line's --lr_scheduler_type {cli['lr_scheduler_type']} is ignored "
                    "(WarmupLR, for one, stays at the peak rate after warm-up)",
                    'remove "scheduler" from the JSON (the Trainer then builds --lr_scheduler_type), or choose the '
                    "schedule in the JSON and drop --lr_scheduler_type", "https://huggingface.co/docs/transformers/en/"
                    "deepspeed#scheduler"))
    for f in facts:
        line = getattr(f, "own_scheduler_line", 0)
        if line and getattr(f, "uses_accelerate", False):
            path, text, data = with_scheduler[0]
            out.append(finding(
                "ds-scheduler-overrides", "error", f.path, line,  # type: ignore[attr-defined]
                f"this scheduler goes to accelerator.prepare while {path} defines a {data['scheduler'].get('type', '')} "
                "scheduler: 'ValueError: You cannot specify a scheduler in the config file and in the code at the same "
                "time'", "accelerate.utils.DummyScheduler(optimizer, ...) in the code, or remove the JSON's scheduler",
                "https://huggingface.co/docs/accelerate/en/usage_guides/deepspeed"))
    if out:
        return out  # the scheduler is already placed against the launch line or the code that names one
    launched = {os.path.basename(_cli(spec.script_args).get("deepspeed", "")) for _p, _t, spec in launches if spec}
    for path, text, data in with_scheduler:
        params = data["scheduler"].get("params") or {}
        if os.path.basename(path) in launched or not (
                isinstance(params, dict) and "auto" in params.values()):
            continue  # a linted launch of this config sets no lr_scheduler_type: nothing is overridden
        # "auto" values are filled by the HF integration (Trainer, Accelerate): a config made for it, whose schedule
        # then replaces the one the Trainer's own settings name (--lr_scheduler_type, axolotl's lr_scheduler)
        out.append(finding(
            "ds-scheduler-overrides", "info", path, _line_of(text, r'"scheduler"\s*:'),
            f"this config (its 'auto' values are for the HF Trainer / Accelerate integration) defines a "
            f"{data['scheduler'].get('type', '')} scheduler: the Trainer then builds none, so any lr_scheduler_type set "
            "elsewhere (launch line, a training YAML) is ignored", 'remove "scheduler" from the JSON to let the '
            "Trainer's lr_scheduler_type decide", "https://huggingface.co/docs/transformers/en/deepspeed#scheduler"))
    return out


def usage_contract(path: str, text: str) -> object | None:
    """The :class:`helpers.lint.python_rules.PyFacts` of a script known only by its ``--help`` output (``usage: x.py
    [-h] [--lr LR] ...``, argparse's format): its options, for the launch <-> script rules; None when ``text`` holds
    no argparse usage line."""
    from helpers.lint.python_rules import PyFacts

    m = re.search(r"^usage: (\S+\.py)\b(.*(?:\n[ \t]+.*)*)", text, re.M)
    if not m:
        return None
    options = set(re.findall(r"(?<![\w-])(--?[A-Za-z][\w-]*)", m.group(2)))
    facts = PyFacts(path)
    facts.contract = ScriptContract(options=options, options_line=text.count("\n", 0, m.start()) + 1,
                                    local_rank_arg=bool({"--local_rank", "--local-rank"} & options),
                                    extra={"script": m.group(1)})
    return facts


def _arguments_reaching(facts: Sequence[object], params: str, args: str) -> list[tuple[object, str, Any, int, str, str]]:
    """Calls recorded in one linted file (the facts' ``args`` list: ``(function, argument index or keyword, line,
    source)``) whose
    argument lands on a parameter that another linted file's function of that name uses in a given way (the facts'
    ``params`` mapping: ``function -> parameter indexes``).  Returns ``(facts of the calling file, function, argument
    index, line, source, path of the defining file)``; the first file that defines a name wins."""
    where: dict[str, tuple[str, set[Any]]] = {}
    for f in facts:
        for name, pos in getattr(f, params, {}).items():
            where.setdefault(name, (f.path, pos))  # type: ignore[attr-defined]
    out = []
    for f in facts:
        for name, pos, line, src in getattr(f, args, []):
            hit = where.get(name)
            if hit is not None and hit[0] != f.path and pos in hit[1]:  # type: ignore[attr-defined]
                out.append((f, name, pos, line, src, hit[0]))
    return out


def device_from_global_rank_across(facts: Sequence[object]) -> list[Check]:
    """A call in one linted file that passes the global rank to a function of another linted file that uses that
    parameter as the CUDA device (``set_device``, ``device_ids=[...]``, ``torch.device('cuda', i)``): on every node but
    the first the rank exceeds the node's GPU count ("invalid device ordinal"), and ranks of one node do not map onto
    its GPUs (torchrun's contract: LOCAL_RANK is the device index, RANK the global one,
    https://docs.pytorch.org/docs/stable/elastic/run.html#environment-variables; ultralytics/yolov5#5114 passed RANK to
    torch_distributed_zero_first(local_rank), whose barrier uses it as device_ids)."""
    return [finding("device-from-global-rank", "error", f.path, line,  # type: ignore[attr-defined]
                    f"{name}(...) gets the global rank ({src}) as argument {pos + 1}, which "
                    f"{os.path.basename(defined)} uses as the CUDA device: on a second node the rank exceeds "
                    "the node's GPU count (invalid device ordinal)",
                    f"pass the local rank (LOCAL_RANK) to {name}", "https://docs.pytorch.org/docs/stable/"
                    "elastic/run.html#environment-variables")
            for f, name, pos, line, src, defined in _arguments_reaching(facts, "device_params", "global_rank_args")]


def batch_times_world_size_across(facts: Sequence[object]) -> list[Check]:
    """A call in one linted file that passes ``x * world_size`` to a parameter that another linted file's function
    gives a DataLoader with a DistributedSampler as its ``batch_size`` (:attr:`PyFacts.dist_batch_params`): the
    batch size is per process there, so the global batch is world-size times the intended one (geoelements/gns:
    ``batch_size=flags["batch_size"] * world_size`` into its distributed loader;
    https://docs.pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler)."""
    return [finding("batch-times-world-size", "warning", f.path, line,  # type: ignore[attr-defined]
                    f"{name}(...) gets {src} as {'argument ' + str(pos + 1) if isinstance(pos, int) else pos}, which "
                    f"{os.path.basename(defined)} gives a DataLoader with a DistributedSampler as its batch_size: that "
                    "is per process, so the global batch becomes world-size times the intended one",
                    "pass the per-process batch (the global batch // world_size)",
                    "https://docs.pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler")
            for f, name, pos, line, src, defined in _arguments_reaching(facts, "dist_batch_params", "world_scaled_args")]


def rank_before_init_across(facts: Sequence[object]) -> list[Check]:
    """A rank taken from a function that answers rank 0 until the process group exists, before the process group is
    created: ``world_size, rank = get_world_size_and_rank()`` then ``init_from_env()`` (meta-pytorch/torchtune#193).
    ``torch.distributed.get_rank`` needs an initialised default group (is_initialized(),
    https://docs.pytorch.org/docs/stable/distributed.html), so helpers guard it with ``if not is_initialized(): return
    1, 0``: called first, every process gets rank 0 (the same seed, the same shard, every process "the main one").
    The helper may be defined in the same file or in another linted file (:attr:`PyFacts.uninit_rank_funcs`)."""
    helpers: dict[str, str] = {}
    for f in facts:
        for name in getattr(f, "uninit_rank_funcs", set()):
            helpers.setdefault(name, f.path)  # type: ignore[attr-defined]
    out: list[Check] = []
    for f in facts:
        for name, line, init_line, init_src in getattr(f, "rank_before_init", []):
            if name not in helpers:
                continue
            out.append(finding("rank-before-init", "error", f.path, line,  # type: ignore[attr-defined]
                               f"{name}() is called before the process group exists ({init_src}, line {init_line}), "
                               f"and {os.path.basename(helpers[name])} makes it return rank 0 while "
                               "torch.distributed is not initialised: every process gets rank 0 here",
                               f"initialise first ({init_src.split('(')[0]}), then call {name}(); or read RANK from "
                               "the environment the launcher sets", "https://docs.pytorch.org/docs/stable/distributed.html"))
    return out


def cpu_tensor_to_collective_across(facts: Sequence[object]) -> list[Check]:
    """``ddp_all_reduce(torch.tensor(count), ReduceOp.SUM)`` where ``ddp_all_reduce`` (another linted file) hands its
    first parameter to ``torch.distributed.all_reduce``: the tensor is made on the CPU (no ``device=``), and the nccl
    backend takes CUDA tensors only ('No backend type associated with device type cpu' / 'Tensors must be CUDA and
    dense', https://docs.pytorch.org/docs/stable/distributed.html#backends; speechbrain/speechbrain#2934).  Reported
    where one of the linted files names nccl."""
    if not any(getattr(f, "mentions_nccl", False) for f in facts):
        return []
    return [finding("nccl-cpu-tensor", "warning", f.path, line,  # type: ignore[attr-defined]
                    f"{name}(...) gets {src} (a CPU tensor) as argument {pos + 1}, which "
                    f"{os.path.basename(defined)} hands to a torch.distributed collective: under nccl "
                    "('No backend type associated with device type cpu')",
                    f"make it on the process's GPU: {src.split('(')[0]}(..., device=<this rank's device>)",
                    "https://docs.pytorch.org/docs/stable/distributed.html#backends")
            for f, name, pos, line, src, defined in _arguments_reaching(facts, "collective_params", "cpu_tensor_args")]


def sampler_seed_across(facts: Sequence[object]) -> list[Check]:
    """A ``DistributedSampler(seed=flags.seed)`` in one linted file whose ``flags.seed`` another linted file sets to a
    rank value (``flags.seed = worker_seeds[local_rank]``): the sampler's seed must be the same on every rank (its
    documented contract, https://docs.pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler;
    mlcommons/training#625).  The same file's case is :func:`helpers.lint.agreement_rules.rule_sampler_seed_per_rank`."""
    setters: dict[str, str] = {}
    for f in facts:
        for attr in getattr(f, "rank_attrs", set()):
            setters.setdefault(attr, f.path)  # type: ignore[attr-defined]
    out: list[Check] = []
    for f in facts:
        for attr, line, src in getattr(f, "sampler_seed_attrs", []):
            where = setters.get(attr)
            if where is None or where == f.path:  # type: ignore[attr-defined]
                continue
            out.append(finding("sampler-seed-per-rank", "error", f.path, line,  # type: ignore[attr-defined]
                               f"DistributedSampler(seed={src}): {os.path.basename(where)} sets .{attr} to a per-rank "
                               "value, so every rank shuffles the index list with its own seed and takes its slice of "
                               "a different permutation (shards overlap, samples missed)",
                               f"keep one seed for the sampler on every rank (the run's base seed); give the per-rank "
                               f"streams another attribute than .{attr}",
                               "https://docs.pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler"))
    return out


def _used_in_data_parallel_file(facts: Sequence[object], defined_attr: str,
                                used_attr: str) -> list[tuple[object, str, int, tuple[str, int]]]:
    """``(facts, name, line, (defining path, line))``: a name that one linted file records in ``defined_attr``
    (``{name: line}``) and another file, one that trains data parallel, uses at ``line`` (``used_attr``, ``{name:
    line}``).  The shared walk of the cross-file rules below."""
    defined = {name: (f.path, line) for f in facts  # type: ignore[attr-defined]
               for name, line in getattr(f, defined_attr, {}).items()}
    out = []
    for f in facts:
        if not getattr(f, "trains_data_parallel", False):
            continue
        for name, line in getattr(f, used_attr, {}).items():
            where = defined.get(name)
            if where is not None and where[0] != f.path:  # type: ignore[attr-defined]
                out.append((f, name, line, where))
    return out


def iterable_not_sharded_across(facts: Sequence[object]) -> list[Check]:
    """A linted file that trains data parallel and builds another linted file's ``IterableDataset`` subclass that splits
    its stream by worker only (:func:`helpers.lint.agreement_rules.rule_iterable_not_sharded`, which reports the case
    of one file): every rank reads the same samples."""
    return [finding("iterable-not-sharded", "warning", f.path, line,  # type: ignore[attr-defined]
                    f"{name}(...) is an IterableDataset ({os.path.basename(where[0])}:{where[1]}) that "
                    "splits its stream by DataLoader worker only, and this file trains data parallel: every "
                    "rank reads the same samples (no sampler shards an iterable dataset)",
                    f"give {name} the rank and world size and keep every world_size-th shard after the "
                    "worker split", "https://docs.pytorch.org/docs/stable/data.html#torch.utils.data.IterableDataset")
            for f, name, line, where in _used_in_data_parallel_file(facts, "unsharded_iterables", "constructs")]


def rank_only_object_across(facts: Sequence[object]) -> list[Check]:
    """``rank-gated-object-used`` across files: one linted file hands a value made on some ranks only (``logger =
    get_logger(...) if rank == 0 else None``) to a class of another (``ConditionalTrainer(logger=logger)``), whose
    methods read an attribute of that field with no test of it (``self.logger.report_scalar(...)``): on the other ranks
    it is None ('NoneType' object has no attribute ..., llm-random).  The within-file rule has the contract
    (:meth:`helpers.lint.python_rules.PythonLinter.rule_rank_gated_object_used`)."""
    out: list[Check] = []
    classes = {name: f for f in facts for name in getattr(f, "class_fields", {})}
    for f in facts:
        for callee, key, line, how in getattr(f, "rank_only_args", []):
            g = classes.get(callee)
            if g is None or g is f:
                continue
            fields = g.class_fields[callee]  # type: ignore[attr-defined]
            param = key if isinstance(key, str) else (fields[key] if key < len(fields) else None)
            use = g.unguarded_uses.get(callee, {}).get(param) if param else None  # type: ignore[attr-defined]
            if use is None:
                continue
            out.append(finding(
                "rank-gated-object-used", "error", g.path, use[0],  # type: ignore[attr-defined]
                f"{use[1]} runs on every rank with no test of self.{param}, but {os.path.basename(f.path)}:{line} "  # type: ignore[attr-defined]
                f"passes {callee} {param}={how}: on the other ranks it is None ('NoneType' object has no attribute)",
                f"test it where it is used (if self.{param} is not None:) or make it on every rank", "D21"))
    return out


def clock_path_across(facts: Sequence[object]) -> list[Check]:
    """``clock-dependent-path`` across files: a file that trains data parallel saves on every rank into a directory
    built from a name another linted file derives from the clock (a config class's ``output_dir`` default from
    ``datetime.now()``; :func:`helpers.lint.agreement_rules.rule_clock_dependent_path` has the contract)."""
    return [finding("clock-dependent-path", "warning", f.path, line,  # type: ignore[attr-defined]
                    f"this save's directory comes from {name}, which {os.path.basename(where[0])}:{where[1]} builds "
                    "from each process's clock: ranks started across a tick name different directories and the "
                    "checkpoint's per-rank files land apart", "decide the directory on rank 0 and broadcast it "
                    "(accelerate.utils.broadcast_object_list / dist.broadcast_object_list), or name it from the "
                    "config / job id", "https://deepspeed.readthedocs.io/en/latest/model-checkpointing.html")
            for f, name, line, where in _used_in_data_parallel_file(facts, "clock_paths", "save_dir_names")]


_EXPORT = "https://www.gnu.org/software/bash/manual/html_node/Bourne-Shell-Builtins.html#index-export"


def unexported_to_child_script(launches: Sequence[tuple[str, str, LaunchSpec | None]]) -> list[Check]:
    """``launcher-var-unset`` across shell files: a script sets ``GPUNUM`` (an assignment or a ``for GPUNUM in``
    loop) without exporting it and runs another linted script with ``bash ./run.sh`` (a new shell, which gets only
    exported variables: "export: mark each name to be passed to child processes in the environment", :data:`_EXPORT`),
    and that script reads ``$GPUNUM`` without setting it first (or only as its own default ``${GPUNUM:-1}``): the
    child always sees it unset (hpcaitech/ColossalAI's GPT benchmark ran every configuration on one GPU).  Not where
    the caller exports it, runs ``set -a``, or passes it on the command (``GPUNUM=4 bash run.sh``)."""
    shells = {os.path.basename(p): (p, t) for p, t, _s in launches if p != "<command>" and not p.endswith(".md")}
    out: list[Check] = []
    for path, text, _spec in launches:
        if path == "<command>" or path.endswith(".md") or re.search(r"^\s*set\s+-[a-z]*a", text, re.M):
            continue
        exported = set(re.findall(r"^\s*(?:export|declare\s+-x)\s+([A-Za-z_]\w*)", text, re.M))
        assigned = set(re.findall(r"^\s*([A-Za-z_]\w*)=", text, re.M)) | \
            set(re.findall(r"^\s*for\s+([A-Za-z_]\w*)\s+in\b", text, re.M))
        local = assigned - exported
        if not local:
            continue
        for number, line in launch_parse.join_continuations(text):
            m = re.match(r"\s*((?:[A-Za-z_]\w*=\S*\s+)*)(?:bash|sh)\s+(\S+\.sh)\b|\s*((?:[A-Za-z_]\w*=\S*\s+)*)"
                         r"(\./\S+\.sh)\b", line)
            if not m:
                continue
            prefix = m.group(1) or m.group(3) or ""
            child = shells.get(os.path.basename(m.group(2) or m.group(4)))
            if child is None or child[0] == path:
                continue
            passed = set(re.findall(r"([A-Za-z_]\w*)=", prefix))
            ctext = child[1]
            lost = []
            for var in sorted(local - passed):
                read = re.search(rf"\$\{{?{var}\b", ctext)
                if read is None:
                    continue
                upto = ctext[:read.start()] + ctext[read.start():].split("\n", 1)[0]
                own = re.search(rf"^\s*(?:export\s+)?{var}=(.*)$", upto, re.M)
                if own is not None and not re.search(rf"\$\{{?{var}\b", own.group(1)):
                    continue  # the child sets it itself before reading it
                lost.append(var)
            if lost:
                names = ", ".join(lost)
                out.append(finding(
                    "launcher-var-unset", "warning", path, number,
                    f"{names} {'is' if len(lost) == 1 else 'are'} set in {os.path.basename(path)} but not exported, "
                    f"and {os.path.basename(child[0])} (started here in a new shell) reads "
                    f"{'it' if len(lost) == 1 else 'them'}: the child sees {'it' if len(lost) == 1 else 'them'} unset "
                    "(or takes its own default), whatever this script set",
                    f"export {lost[0]} (or pass it on the command: {lost[0]}=${lost[0]} bash {m.group(2) or m.group(4)})",
                    _EXPORT))
    return out


def cuda_before_set_device_across(facts: Sequence[object]) -> list[Check]:
    """``cuda-before-set-device`` across files: default-device CUDA work (``Model(device="cuda")``, ``.cuda()``) in one
    linted file before it calls another linted file's function that binds the GPU first thing
    (``torch.cuda.set_device(rank)``): every rank of the node puts that work on cuda:0 (OminiControl loaded the whole
    FLUX pipeline on GPU 0 from every rank; the contract is
    :func:`helpers.lint.device_rules.rule_cuda_before_set_device`'s)."""
    from helpers.lint.contracts import _DIST

    out: list[Check] = []
    for f in facts:
        for callee, line, src, at in getattr(f, "cuda_before_calls", []):
            other = next((g for g in facts if g is not f and callee in getattr(g, "set_device_funcs", set())), None)
            if other is None or any(x.line_no == line and x.file == f.path for x in out):  # type: ignore[attr-defined]
                continue
            out.append(finding("cuda-before-set-device", "warning", f.path, line,  # type: ignore[attr-defined]
                               f"{src} runs on the current CUDA device before {callee}() (line {at}) binds the GPU "
                               f"with torch.cuda.set_device ({os.path.basename(other.path)}): every rank of the node is "  # type: ignore[attr-defined]
                               "still on cuda:0 here, so each puts this on GPU 0 (and a CUDA context there)",
                               "bind the device first (torch.cuda.set_device(local_rank) at the top of main), then "
                               "create the model", _DIST))
    return out


def env_none_parsed_across(facts: Sequence[object]) -> list[Check]:
    """``env-int-parse`` across files: ``int(os.environ.get("LOCAL_RANK"))`` with no default in one linted file, while
    another reads the same launcher variable with a default or under a guard (OminiControl: ``trainer.py``'s
    ``get_rank`` falls back to 0, ``train_subject.py`` parses it bare and dies under a one-process launch); the
    contract is in :func:`helpers.lint.env_rules._env_none_parsed`."""
    from helpers.lint.env_rules import _GETENV, env_none_fix, env_none_message

    out: list[Check] = []
    for f in facts:
        for key, line, src in getattr(f, "env_none_parsed", []):
            if key in f.env_unset_handled:  # type: ignore[attr-defined]
                continue  # reported by the file itself
            other = next((g for g in facts if g is not f and key in getattr(g, "env_unset_handled", set())), None)
            if other is not None:
                out.append(finding("env-int-parse", "warning", f.path, line,  # type: ignore[attr-defined]
                                   env_none_message(key, src, os.path.basename(other.path)),  # type: ignore[attr-defined]
                                   env_none_fix(key), _GETENV))
    return out


def listing_dir_across(facts: Sequence[object]) -> list[Check]:
    """``write-on-every-rank`` across files: a file that trains data parallel calls, outside any rank gate, another
    linted file's function that numbers a new run directory by counting the output folder
    (:func:`helpers.lint.agreement_rules.rule_listing_numbered_dir` has the contract)."""
    from helpers.lint.agreement_rules import LISTING_FIX, OPEN_SORA, listing_message

    return [finding("write-on-every-rank", "warning", f.path, line,  # type: ignore[attr-defined]
                    listing_message(name, f"{os.path.basename(where[0])}:{where[1]}"), LISTING_FIX, OPEN_SORA)
            for f, name, line, where in _used_in_data_parallel_file(facts, "listing_dir_funcs", "ungated_calls")]


def download_every_rank_across(facts: Sequence[object]) -> list[Check]:
    """A data parallel file that calls, outside any rank gate or rank-first guard, another linted file's function that
    downloads a dataset with no guard of its own (:func:`helpers.lint.agreement_rules.rule_download_every_rank`): every
    rank downloads into the same root at once (pytorch-ignite/code-generator#60)."""
    return [finding("download-every-rank", "warning", f.path, line,  # type: ignore[attr-defined]
                    f"{name}(...) downloads a dataset ({os.path.basename(where[0])}:{where[1]}, download=True) "
                    "and every rank calls it here at once: the processes race on the same archive and files",
                    "download on one rank first (if rank != 0: barrier(); ...; if rank == 0: barrier(), or "
                    "idist.one_rank_first() / accelerator.main_process_first())",
                    "https://docs.pytorch.org/vision/stable/datasets.html")
            for f, name, line, where in _used_in_data_parallel_file(facts, "download_funcs", "ungated_calls")]
