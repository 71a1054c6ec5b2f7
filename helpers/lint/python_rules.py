"""Rules for Python training scripts: stdlib :mod:`ast` + :mod:`tokenize`, with a rank-taint pass.

A value is *rank-dependent* when it comes from ``RANK``/``LOCAL_RANK``/``SLURM_PROCID`` in the
environment, ``dist.get_rank()``, ``args.local_rank``, ``accelerator.is_main_process`` /
``is_local_main_process`` / ``process_index``, ``trainer.is_world_process_zero()``... or from a
name assigned from one (propagated through assignments, per function and module).  A comparison
of a rank with ``-1`` only ("launched distributed or not") is the same on every rank and is not
rank-dependent.

A *collective* is a call every rank must make: ``barrier``, ``all_reduce``, ``all_gather``,
``broadcast``, ``reduce_scatter``..., DeepSpeed ``save_checkpoint``/``load_checkpoint``
(Gilbreth 7.5 issue 3) and ZeRO-3's ``zero.GatheredParameters`` (entering it all-gathers the partitioned
parameters; DeepSpeed's own engine enters it on every rank and gates only the write), FSDP full state-dict gathers, ``accelerator.gather`` /
``gather_for_metrics`` / ``wait_for_everyone`` / ``save_state``, ``gather_object``, DCP
``save``/``load``, torchmetrics ``compute()``; and a call of a function of the same file that
makes one (helpers are followed a few levels deep).

Suppress a finding on a line with a comment ``# runbook-lint: disable=RULE[,RULE]`` (read with
:mod:`tokenize`).
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from helpers.checks import Check
from helpers.inputs import InputError
from helpers.lint.contract_ast import forget_subtrees, method_named, subtree
from helpers.lint.findings import finding
from helpers.lint.wrappers import BUFFER_FREE_LAYERS, WrapperFlow, accelerator_shards, assign_targets, flat_targets, unbound_after_wrap

RANK_ENV = {"RANK", "LOCAL_RANK", "SLURM_PROCID", "SLURM_LOCALID", "GROUP_RANK", "NODE_RANK", "OMPI_COMM_WORLD_RANK",
            "OMPI_COMM_WORLD_LOCAL_RANK", "PMI_RANK", "GLOBAL_RANK", "SLURM_NODEID"}
GLOBAL_RANK_ENV = {"RANK", "SLURM_PROCID", "OMPI_COMM_WORLD_RANK", "PMI_RANK", "GLOBAL_RANK"}
RANK_ATTRS = {"local_rank", "rank", "global_rank", "is_main_process", "is_local_main_process", "process_index",
              "local_process_index", "is_global_zero", "is_master", "is_main", "is_rank_zero", "master_process",
              "is_world_process_zero", "is_local_process_zero", "node_rank", "dp_rank"}
RANK_NAMES = RANK_ATTRS | {"is_main_process_flag", "main_process", "is_rank0", "rank0", "gpu_id", "local_gpu_id",
                            "gpu_rank", "device_rank", "global_rank", "world_rank", "proc_rank", "process_rank"}
RANK_CALLS = {"get_rank", "get_local_rank", "get_global_rank", "is_main_process", "is_rank_0", "is_rank0",
              "is_master", "is_world_process_zero", "is_local_process_zero", "get_node_local_rank", "is_primary",
              "is_local_main_process", "get_data_parallel_rank", "get_coordinate"}
GLOBAL_RANK_CALLS = {"get_rank", "get_global_rank"}
GLOBAL_RANK_ATTRS = {"global_rank", "process_index"}
"""Attributes that hold the global rank itself (``process_index``: Accelerate's ``Accelerator`` / ``PartialState``)."""
MAIN_ATTR = re.compile(r"^_?is_(?:global_|local_|node_|world_|subgroup_)?(?:main|master|chief|primary)"
                       r"(?:_process|_proc|_rank|_node)?$")
"""An attribute (or a function, called) that says "this is the main process" of the job, of a node or of a subgroup
(``is_global_main``, ``is_local_master``, ``is_main_process``, dinov3's ``is_subgroup_main_process()``): one rank
answers True, the rest False, whatever the object holding it (rtg's ``distr``, a trainer, a config).
Rank-dependent by its name, as ``rank`` is."""
MESH_COORD = re.compile(r"(?:^|_)coord(?:s|inate)?$")
"""An attribute holding this rank's coordinate in a device mesh (cosmos-rl's ``parallel_dims.dp_replicate_coord``,
what ``DeviceMesh.get_coordinate()`` returns): it differs per rank, as a rank does."""
_PL_TRAINER_SRC = "https://github.com/Lightning-AI/pytorch-lightning/blob/master/src/lightning/pytorch/trainer/trainer.py"
"""Lightning's Trainer, whose ``log_dir`` property ends in ``self.strategy.broadcast(dirpath)``."""

STRONG_COLLECTIVES = {"barrier", "all_reduce", "all_gather", "all_gather_object", "all_gather_into_tensor",
                      "reduce_scatter", "reduce_scatter_tensor", "all_to_all", "all_to_all_single",
                      "broadcast_object_list", "monitored_barrier", "wait_for_everyone", "gather_for_metrics",
                      "save_checkpoint", "load_checkpoint", "gather_object", "full_optim_state_dict",
                      "sharded_optim_state_dict", "summon_full_params", "get_model_state_dict",
                      "get_optimizer_state_dict", "consolidate_state_dict", "wait_for_everybody", "reduce_tensor",
                      "sync_across_processes", "all_gather_multigpu", "reduce_mean", "GatheredParameters"}
_LOGGER_RECEIVER = re.compile(r"(?i)logger|writer|tracker|wandb|mlflow|tensorboard|comet|neptune|checkpoint_io")
"""Receivers whose ``save_checkpoint`` uploads or writes a file (experiment trackers; Lightning's ``CheckpointIO``
plugin, ``strategy.checkpoint_io.save_checkpoint(state, path)``, which writes what it is given), not a collective."""
WEAK_COLLECTIVES = {"gather", "reduce", "broadcast", "scatter", "save_state", "load_state", "pad_across_processes",
                    "get_state_dict", "optim_state_dict", "save", "load", "compute", "sync"}
WEAK_RECEIVERS = re.compile(r"^(dist|torch\.distributed|xm|accelerator|.*accelerator|self\.accelerator|hvd|dcp|"
                            r"dist_cp|torch\.distributed\.checkpoint|FSDP|FullyShardedDataParallel|trainer|"
                            r"distributed_state|state|self\.state|metric|.*metric.*|.*_metric)$", re.IGNORECASE)
_MODEL_ATTR = re.compile(r"(?:^|_)(?:model|unet|text_encoder|transformer|policy|critic)(?:_|$)")
"""``self`` attributes that hold a model (``model``, ``ref_model``, ``unet``, ``text_encoder_one``...)."""
WRITE_CALLS = {"save_pretrained", "to_csv", "to_json", "savefig", "save_model", "write_text", "write_bytes", "push_to_hub"}
TRACKER_RUNS = {("wandb", "init"), ("mlflow", "start_run"), ("neptune", "init_run"), ("Task", "init"),
                ("comet_ml", "Experiment")}
"""Calls that start an experiment-tracker run: one per process unless gated (W&B's distributed guide, method 1: "only
rank 0 calls wandb.init"; ``group=`` is its documented one-run-per-process method 2,
https://docs.wandb.ai/guides/track/log/distributed-training/)."""
FINISHING = (ast.Return, ast.Break, ast.Continue, ast.Raise)
DELETES = {("shutil", "rmtree"), ("os", "remove"), ("os", "unlink"), ("os", "rmdir"), ("shutil", "move"),
           ("os", "rename"), ("os", "replace")}
"""Calls that remove or move a path: run by every rank on a shared output directory, N processes delete the same
checkpoint folders at once (``FileNotFoundError`` on all but the first, or the wrong folders kept:
huggingface/diffusers#5340 gated its checkpoint pruning on ``accelerator.is_main_process``)."""
COPIES = frozenset({"copyfile", "copy", "copy2", "copytree", "move"})
"""``shutil``'s copies: they write the file or tree named by their second argument, ``dst``
(https://docs.python.org/3/library/shutil.html#shutil.copyfile)."""
FILE_SAVES = {("torch", "save"), ("OmegaConf", "save")}
"""(receiver, call) pairs that write a file named by their second argument or ``f=``: ``torch.save(obj, f)``
(https://docs.pytorch.org/docs/stable/generated/torch.save.html), ``OmegaConf.save(config, f, resolve=False)``
(https://omegaconf.readthedocs.io/en/latest/usage.html#save-load-yaml-file)."""
INHERITED_SAVE = re.compile(r"^_?save_(?:\w+_)?(?:checkpoint|ckpt|snapshot)s?$")
"""A checkpoint-saving method by its name (``save_checkpoint``, ``save_best_checkpoint``, ``_save_snapshot``): checked
where the file calls it on ``self`` but defines it elsewhere (a base class not in the linted set)."""
WRAPS_DDP = r"DistributedDataParallel|\bDDP\(|init_process_group|FullyShardedDataParallel"
"""A file that sets up data parallelism itself (a library file next to it runs on every rank too)."""


RankSeeds = tuple[set[str], dict[str, set["str | int"]], dict[str, str]]
"""What other linted files tell one file (``helpers.lint._across_scripts``): their functions that return a rank value,
the parameters of this file's functions and classes they pass one to (name -> positions / keywords), and their
functions that call a collective (name -> the collective)."""


@dataclass
class PyFacts:
    """What a script says that the config rules need (cross-file checks)."""

    path: str
    raw_ds_init: bool = False               # deepspeed.initialize called directly
    ds_init_line: int = 0
    ds_client_optimizer: bool = False       # an optimizer passed to deepspeed.initialize
    uses_accelerate: bool = False
    uses_hf_trainer: bool = False
    accelerator_grad_accum: tuple[int, object] | None = None   # (line, value) of Accelerator(gradient_accumulation_steps=)
    float_inputs: list[int] = field(default_factory=list)      # torch.randn/rand without dtype
    distributed: bool = False
    contract: object = None                 # helpers.lint.contract_rules.ScriptContract (launch-facing facts)
    wraps_ddp: bool = False                 # the file builds DDP/FSDP or calls init_process_group itself
    defines: set[str] = field(default_factory=set)              # module-level functions of the file
    ddp_passed: dict[str, set[int | str]] = field(default_factory=dict)  # imported function -> args (positions, keywords) given a DDP module
    ddp_returns: dict[str, set[int | None]] = field(default_factory=dict)  # module-level function -> what it returns wrapped (None: all; tuple positions)
    rank_funcs: set[str] = field(default_factory=set)           # module-level functions that return a rank value
    rank_passed: dict[str, set[str | int]] = field(default_factory=dict)  # callee not defined here -> rank args
    classes: set[str] = field(default_factory=set)              # module-level classes of the file
    collective_funcs: dict[str, str] = field(default_factory=dict)  # module-level function -> the collective it calls
    deferred: list[Check] = field(default_factory=list)        # findings that hold when another linted file wraps DDP
    saves_model: bool = False               # trainer.save_model / accelerator.get_state_dict / save_model
    unwrapped_save: int = 0                 # line of accelerator.unwrap_model(m).save_pretrained(...) with no state_dict=
    device_params: dict[str, set[int]] = field(default_factory=dict)  # function -> params used as a CUDA device
    dist_batch_params: dict[str, set[int | str]] = field(default_factory=dict)  # function -> params (index, name) used as a DistributedSampler loader's batch_size
    world_scaled_args: list[tuple[str, int | str, int, str]] = field(default_factory=list)  # (imported fn, arg index or keyword, line, x * world_size)
    global_rank_args: list[tuple[str, int, int, str]] = field(default_factory=list)  # (imported fn, arg, line, src)
    uninit_rank_funcs: set[str] = field(default_factory=set)  # functions that answer rank 0 before init (cross_rules)
    rank_before_init: list[tuple[str, int, int, str]] = field(default_factory=list)  # (fn, line, init line, init call)
    collective_params: dict[str, set[int]] = field(default_factory=dict)  # function -> params handed to a collective
    cpu_tensor_args: list[tuple[str, int, int, str]] = field(default_factory=list)  # (imported fn, arg, line, src)
    mentions_nccl: bool = False
    saves_16bit: bool = False               # a DeepSpeed engine's save_16bit_model / save_fp16_model
    own_scheduler_line: int = 0             # a real LR scheduler built in code (not accelerate's DummyScheduler)
    rank_attrs: set[str] = field(default_factory=set)  # attributes given a rank value (flags.seed = seeds[local_rank])
    unsharded_iterables: dict[str, int] = field(default_factory=dict)  # IterableDataset subclass -> line: split by worker only
    constructs: dict[str, int] = field(default_factory=dict)  # names this file calls -> first line (classes, functions)
    trains_data_parallel: bool = False      # DDP / FSDP / Fabric / Accelerate / DeepSpeed: ranks that split data
    download_funcs: dict[str, int] = field(default_factory=dict)  # functions that download with no rank-first guard
    calls_set_epoch: bool = False           # some sampler's set_epoch is called in the file
    epoch_loop: bool = False                # the file has a loop over epochs
    shuffling_sampler: int = 0              # line of a shuffling DistributedSampler in a file with no epoch loop
    raw_wandb_logs: list[int] = field(default_factory=list)  # ungated wandb.log lines (checkpoint_rules.rule_raw_wandb_log)
    starts_rank0_run: bool = False          # WandbLogger( / accelerator.init_trackers(: a W&B run on the main process only
    calls_wandb_init: bool = False
    rank_samplers: dict[str, int] = field(default_factory=dict)  # Sampler subclasses that shard by rank -> line
    loader_samplers: list[tuple[str, int]] = field(default_factory=list)  # (class given to DataLoader(sampler=), line)
    lightning_trainer: int = 0              # line of a Lightning Trainer(...); -1: one sets use_distributed_sampler
    iterable_epoch_classes: dict[str, int] = field(default_factory=dict)  # IterableDataset with set_epoch -> line
    unseeded_dataset_draws: dict[str, int] = field(default_factory=dict)  # Dataset picking contents by global RNG
    writing_callables: set[str] = field(default_factory=set)  # module-level functions / classes (__init__) that write
    setup_calls: list[tuple[str, int, str]] = field(default_factory=list)  # (callee, line, src) in DataModule.setup
    seeds_global_rng: bool = False          # seed_everything / manual_seed / random.seed / set_seed in the file
    splits_by_sampler: bool = False         # a DistributedSampler is made in the file
    lightning_loop: bool = False            # a LightningModule subclass or a Lightning Trainer(...) in the file
    sets_epoch_from_outside: bool = False   # some x.set_epoch(...) call whose receiver is not self
    ungated_calls: dict[str, int] = field(default_factory=dict)  # names called outside rank gates and rank-first guards
    sampler_seed_attrs: list[tuple[str, int, str]] = field(default_factory=list)  # (attr, line, src) of seed=args.attr
    clock_paths: dict[str, int] = field(default_factory=dict)  # names/attrs of paths built from the clock -> line
    listing_dir_funcs: dict[str, int] = field(default_factory=dict)  # functions numbering a new dir by a listing count
    rank_only_args: list[tuple[str, str | int, int, str]] = field(default_factory=list)  # (callee, kw/pos, line, how)
    class_fields: dict[str, list[str]] = field(default_factory=dict)  # class -> its fields / __init__ params, in order
    unguarded_uses: dict[str, dict[str, tuple[int, str]]] = field(default_factory=dict)  # class -> param -> (line, src)
    save_dir_names: dict[str, int] = field(default_factory=dict)  # names an every-rank save's directory is built from
    set_device_funcs: set[str] = field(default_factory=set)  # functions whose body binds the GPU (set_device)
    cuda_before_calls: list[tuple[str, int, str, int]] = field(default_factory=list)  # (callee, line, src, call line)
    env_none_parsed: list[tuple[str, int, str]] = field(default_factory=list)  # (key, line, src): int(environ.get(K))
    env_unset_handled: set[str] = field(default_factory=set)  # launcher variables read with a default or a guard


def _names_monitored(key: ast.AST | None, monitored: set[str]) -> bool:
    """The logged name ``key`` (a constant, or an f-string whose fields may be anything: ``f"{stage}/loss"``) may be
    one of the ``monitored`` names."""
    if isinstance(key, ast.Constant):
        return key.value in monitored
    if isinstance(key, ast.JoinedStr):
        pattern = "".join(re.escape(v.value) if isinstance(v, ast.Constant) else ".+" for v in key.values)
        return any(re.fullmatch(pattern, m) for m in monitored)
    return False

def _gate_text(gate: ast.AST) -> str:
    """The condition of a rank gate as the user wrote it (60 characters)."""
    if isinstance(gate, (ast.FunctionDef, ast.AsyncFunctionDef)):
        return f"@rank_zero_only def {gate.name}"
    return _src(getattr(gate, "test", None) or getattr(gate, "iter", gate))[:60]


def _src(node: ast.AST) -> str:
    try:
        return ast.unparse(node)
    except Exception:  # noqa: BLE001 - unparse of odd nodes
        return ""


def _dotted(node: ast.AST) -> str:
    """``a.b.c`` for a Name/Attribute chain (cheap), else the unparsed source."""
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return ".".join([node.id, *reversed(parts)])
    return _src(node) + ("." + ".".join(reversed(parts)) if parts else "")


_NAMES: dict[int, tuple[ast.Call, str, str]] = {}
"""A memo of :func:`_call_name` keyed by ``id(call)``; each entry holds its node, so the id cannot be reused by
another file's node while the entry lives (an id-only key made ``lint a.py b.py`` lose findings of b.py that
``lint b.py`` reports).  Emptied by each :class:`PythonLinter` (:func:`_forget_names`)."""


def _forget_names() -> None:
    _NAMES.clear()
    forget_subtrees()


def _call_name(call: ast.Call) -> tuple[str, str]:
    """(receiver source, function name) of a call: ``dist.barrier()`` -> ("dist", "barrier")."""
    f = call.func
    if isinstance(f, ast.Attribute):
        got = _NAMES.get(id(call))
        if got is None or got[0] is not call:
            got = _NAMES[id(call)] = (call, _dotted(f.value), f.attr)
        return got[1], got[2]
    if isinstance(f, ast.Name):
        return "", f.id
    return "", ""


def _env_key(node: ast.AST) -> str | None:
    """``"RANK"`` for ``os.environ["RANK"]``, ``os.environ.get("RANK")``, ``os.getenv("RANK", ...)``."""
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str) \
            and _dotted(node.value) in ("os.environ", "environ"):
        return node.slice.value
    if isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) \
            and isinstance(node.args[0].value, str):
        recv, name = _call_name(node)
        if (recv in ("os.environ", "environ") and name in ("get", "setdefault")) or (recv == "os" and name == "getenv") \
                or (not recv and name == "getenv"):
            return node.args[0].value
    return None


def _launch_check(test: ast.Compare) -> bool:
    """``test`` compares with ``-1`` only (``local_rank != -1``, ``int(os.environ.get("RANK", -1)) != -1``) or with
    ``None`` by identity (``os.environ.get("RANK") is not None``): whether the program was launched distributed, the
    same answer on every rank (not a rank gate, not a rank value)."""
    if all(isinstance(op, (ast.Is, ast.IsNot)) for op in test.ops) and all(
            isinstance(c, ast.Constant) and c.value is None for c in test.comparators):
        return True  # os.environ.get("RANK") is not None: set by the launcher for every process, or for none
    vals: list[ast.AST] = []
    for c in test.comparators:
        vals += c.elts if isinstance(c, (ast.List, ast.Tuple, ast.Set)) else [c]
    return bool(vals) and all(isinstance(v, ast.UnaryOp) and isinstance(v.op, ast.USub) and
                              isinstance(v.operand, ast.Constant) and v.operand.value == 1 for v in vals)


def _local_emptiness(test: ast.AST) -> bool:
    """``x.numel() == 0``, ``len(x) == 0``, ``x.numel() < 1``, ``not x.numel()``: a test on how much of this rank's own
    data there is (each rank holds a different shard, so it can hold on one rank and not on another)."""
    def size(node: ast.AST) -> bool:
        return isinstance(node, ast.Call) and (
            isinstance(node.func, ast.Attribute) and node.func.attr == "numel" and not node.args
            or isinstance(node.func, ast.Name) and node.func.id == "len" and len(node.args) == 1)

    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return size(test.operand)
    if isinstance(test, ast.Compare) and len(test.ops) == 1 and size(test.left) and \
            isinstance(test.comparators[0], ast.Constant):
        op, value = test.ops[0], test.comparators[0].value
        return isinstance(op, (ast.Eq, ast.LtE)) and value == 0 or isinstance(op, ast.Lt) and value == 1
    return False


def _exits(body: list[ast.stmt]) -> list[ast.stmt]:
    """The statements of ``body`` that leave it for the code after the enclosing statement: ``return``/``raise``
    anywhere (not inside a nested function or class), ``break``/``continue`` not inside a nested loop.  A ``break``
    under a further condition (``if rank == 0: ... if stopper.is_stop(): break``) still leaves on the gated rank
    only.  Returns them in source order (a direct child first when there is one)."""
    direct = [s for s in body if isinstance(s, FINISHING)]
    found: list[ast.stmt] = []
    todo: list[tuple[ast.AST, bool]] = [(s, False) for s in body]
    while todo:
        node, in_loop = todo.pop()
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda)):
            continue
        if isinstance(node, (ast.Return, ast.Raise)) or isinstance(node, (ast.Break, ast.Continue)) and not in_loop:
            found.append(node)
            continue
        loop = in_loop or isinstance(node, (ast.For, ast.While, ast.AsyncFor))
        todo.extend((c, loop if c not in getattr(node, "orelse", ()) else in_loop)
                    for c in ast.iter_child_nodes(node) if isinstance(c, ast.stmt))
    return direct + sorted((s for s in found if s not in direct), key=lambda s: (s.lineno, s.col_offset))


def _written_paths(call: ast.Call) -> list[ast.expr]:
    """The arguments of a writing call (:meth:`PythonLinter._write_kind`) that name the file: the second on for
    ``torch.save(obj, f)`` / ``json.dump(obj, f)``, the first for ``open(path, "w")``, ``x.save_pretrained(dir)``..."""
    recv, name = _call_name(call)
    if name in COPIES and recv in ("shutil", ""):
        return call.args[1:2] or [k.value for k in call.keywords if k.arg == "dst"]
    if name == "save" and len(call.args) == 1 and recv not in ("torch", "torch.jit", "jit", "OmegaConf"):
        return call.args[:1]  # scripted.save(f): the module is the receiver, the one argument the file
    return call.args[1:] if name in ("save", "dump") else call.args[:1]


def _literals(test: ast.expr, holds: bool) -> set[tuple[str, bool]]:
    """The conditions ``test`` being ``holds`` implies, as ``(source, polarity)`` pairs: ``a and not b`` holding
    gives ``{("a", True), ("b", False)}``; a test that is not a conjunction is one literal."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        return _literals(test.operand, not holds)
    if holds and isinstance(test, ast.BoolOp) and isinstance(test.op, ast.And):
        return set().union(*(_literals(v, True) for v in test.values))
    if not holds and isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or):
        return set().union(*(_literals(v, False) for v in test.values))
    return {(_src(test), holds)}


def _error_exit(stmt: ast.stmt, parents: dict[ast.AST, ast.AST]) -> bool:
    """``stmt`` (an early ``return``) ends an error path: its block reports an error (``print("Error ...")``,
    ``logger.error(...)``) or it returns a negative status.  The run is stopping there with a message, which is what
    the author meant; the rank that leaves is not skipping a collective it should have joined."""
    if isinstance(stmt, ast.Return) and isinstance(stmt.value, ast.UnaryOp) and isinstance(stmt.value.op, ast.USub):
        return True
    block = parents.get(stmt)
    body = next((getattr(block, f) for f in ("body", "orelse", "handlers", "finalbody")
                 if stmt in getattr(block, f, ())), [])
    for s in body:
        for c in ast.walk(s):
            if isinstance(c, ast.Call):
                recv, name = _call_name(c)
                if name in ("error", "critical", "fatal", "exception") and recv:
                    return True
                if name == "print" and any(isinstance(a, ast.Constant) and isinstance(a.value, str) and
                                           re.match(r"\s*(error|fatal)\b", a.value, re.I) for a in c.args):
                    return True
    return False


def _epoch_loop(node: ast.AST) -> bool:
    """``node`` is a ``for`` loop over epochs (``epoch`` in its target or its iterable)."""
    return isinstance(node, ast.For) and ("epoch" in _src(node.target).lower() or "epoch" in _src(node.iter).lower())


_PATHLIKE = re.compile(r"(?i)^(?:['\"f].*|.*(?:path|file|ckpt|checkpoint|fname|filename)\w*|os\.path\.join\(.*)$")
"""An argument's source that names a file (a string, an f-string, a ``*path`` / ``*file`` / ``ckpt*`` name, a join)."""
_STARTERS = frozenset({"spawn", "start_processes", "Process", "Thread", "Pool", "submit", "map", "apply_async",
                       "elastic_launch", "launch", "notebook_launcher", "run"})
"""Calls that start processes or threads with a function: not callback sites (:meth:`PythonLinter._callback_sites`)."""
_CONFIG_NAME = re.compile(r"(?i)(?:vars\(|asdict\()?(?:\w+_)?(args|cfg|config|conf|params|hparams|opt|options)"
                          r"(?:_dict)?(?:\.__dict__)?\)?")
"""Names of a run's configuration object (what a script dumps beside its checkpoints): ``args``, ``vars(args)``,
``args_dict`` (HunyuanDiT), ``train_config.__dict__``."""


def _hf_process_flag(node: ast.Attribute) -> bool:
    """``args.should_save`` / ``training_args.should_log``: transformers' ``TrainingArguments`` properties that hold on
    the main process only (the local main with ``save_on_each_node`` / ``log_on_each_node``;
    https://huggingface.co/docs/transformers/en/main_classes/trainer#transformers.TrainingArguments.should_save).  Only
    on a receiver named for the arguments: a trainer's own ``should_save`` may be a step test."""
    return node.attr in ("should_save", "should_log") and bool(re.search(r"(?:^|[._])(?:training_)?args$",
                                                                           _src(node.value)))


class _Taint:
    """Names that hold rank-dependent values (any rank) and global-rank values (for D3)."""

    def __init__(self, spawned_params: set[str]):
        self.rank: set[str] = set()
        self.global_rank: set[str] = set()
        self.rank_attrs: set[str] = set()
        self.rank_funcs: set[str] = set()   # local functions that return a rank-dependent value
        self.global_rank_funcs: set[str] = set()  # local functions that return the global rank itself
        self.own_rank_calls: set[str] = set()  # names of GLOBAL_RANK_CALLS this file defines, not returning one
        self.global_rank_attrs: set[str] = set()  # self.<attr> assigned the global rank (self.rank = dist.get_rank())
        self.other_attrs: set[str] = set()  # self.<attr> assigned anything else somewhere (then not known global)
        self.spawned_params = spawned_params
        self.sites: dict[str, list[ast.AST]] = {}  # name -> the assignments that made it rank-dependent
        self.parents: dict[ast.AST, ast.AST] = {}  # set by PythonLinter: for the flow check of _late
        self.rank_arg_is_local = False  # set by PythonLinter: argparse's --rank is also spelled --local_rank

    def _late(self, read: ast.Name) -> bool:
        """Whether ``read`` cannot see a rank value: it reads a local of its function (not a parameter, not
        ``global``) whose rank-dependent assignments in that function all come after it, outside any loop there.
        ``if seed is None: seed = broadcast(...)`` followed later by ``seed += local_rank`` reads the seed before it
        depends on the rank (torchtitan's set_determinism)."""
        fn, loop, p = None, False, self.parents.get(read)
        while p is not None:
            if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)):
                fn = p
                break
            loop = loop or isinstance(p, (ast.For, ast.While, ast.AsyncFor))
            p = self.parents.get(p)
        if fn is None or loop or read.id in {a.arg for a in ast.walk(fn.args) if isinstance(a, ast.arg)}:
            return False
        if any(isinstance(n, (ast.Global, ast.Nonlocal)) and read.id in n.names for n in subtree(fn)):
            return False
        mine = [s for s in self.sites.get(read.id, ()) if self._function_of(s) is fn]
        return bool(mine) and all(s.lineno > read.lineno for s in mine)

    def _function_of(self, node: ast.AST) -> ast.AST | None:
        p = self.parents.get(node)
        while p is not None and not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)):
            p = self.parents.get(p)
        return p

    def is_rank(self, node: ast.AST) -> bool:
        for sub in ast.walk(node):
            if isinstance(sub, ast.Name) and (sub.id in RANK_NAMES or sub.id in self.rank and not self._late(sub)):
                return True
            if isinstance(sub, ast.Attribute) and (sub.attr in RANK_ATTRS or sub.attr in self.rank_attrs
                                                   or sub.attr.lstrip("_") in RANK_ATTRS or MAIN_ATTR.match(sub.attr)
                                                   or MESH_COORD.search(sub.attr) or _hf_process_flag(sub)):
                return True
            if isinstance(sub, ast.Call):
                _, name = _call_name(sub)
                if name in RANK_CALLS or name in self.rank_funcs or MAIN_ATTR.match(name):
                    return True
            key = _env_key(sub)
            if key in RANK_ENV:
                return True
            if isinstance(sub, ast.Subscript) and isinstance(sub.slice, ast.Constant) and \
                    sub.slice.value in RANK_ATTRS:
                return True  # config["rank"]: a run's settings holding the rank (ParallelWaveGAN's trainer)
        return False

    def is_rank_value(self, node: ast.AST | None) -> bool:
        """The value itself is rank-dependent (not merely built with a rank somewhere inside, like DDP(model, device_ids=[r]))."""
        todo = [node]  # a work list, not recursion: a 332-term "a" + "a" + ... overflowed the stack
        while todo:
            node = todo.pop()
            if node is None:
                continue
            if isinstance(node, ast.Name):
                if node.id in self.rank or node.id in RANK_NAMES:
                    return True
                continue
            if isinstance(node, ast.Attribute):
                if (node.attr in RANK_ATTRS or node.attr in self.rank_attrs or node.attr.lstrip("_") in RANK_ATTRS
                        or MAIN_ATTR.match(node.attr) or MESH_COORD.search(node.attr) or _hf_process_flag(node)):
                    return True
                continue
            key = _env_key(node)
            if key is not None:
                if key in RANK_ENV:
                    return True
                continue
            if isinstance(node, ast.Call):
                _, name = _call_name(node)
                if name in RANK_CALLS or name in self.rank_funcs or MAIN_ATTR.match(name):
                    return True
                if name in ("int", "str", "float", "bool") and node.args:
                    todo.append(node.args[0])
                continue
            if isinstance(node, ast.Compare) and _launch_check(node):
                continue  # `int(os.environ.get("RANK", -1)) != -1`: launched or not, the same on every rank
            if isinstance(node, (ast.Compare, ast.BoolOp, ast.BinOp, ast.UnaryOp, ast.IfExp, ast.JoinedStr,
                                 ast.FormattedValue, ast.Tuple)):
                todo.extend(c for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr))
        return False

    def is_global_rank(self, node: ast.AST) -> bool:
        """A value that is the global rank itself (not ``rank % ngpus``, not ``local_rank``)."""
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Mod, ast.FloorDiv)):
            return False
        if isinstance(node, ast.IfExp):  # `index if torch.cuda.is_available() else "cpu"`
            return self.is_global_rank(node.body) or self.is_global_rank(node.orelse)
        if isinstance(node, ast.Call):
            _recv, name = _call_name(node)
            if name in GLOBAL_RANK_CALLS and not (not _recv and name in self.own_rank_calls) or \
                    name in self.global_rank_funcs:
                return True  # (not the file's own get_rank() that returns LOCAL_RANK: OminiControl's trainer)
            if name in ("int", "str") and node.args:
                return self.is_global_rank(node.args[0])
            key = _env_key(node)
            return key in GLOBAL_RANK_ENV
        key = _env_key(node)
        if key is not None:
            return key in GLOBAL_RANK_ENV
        if isinstance(node, ast.Name):
            return node.id in self.global_rank or (node.id in ("global_rank",))
        if isinstance(node, ast.Attribute):
            # Accelerate's ``process_index`` is "the index of the current process" across all nodes;
            # ``local_process_index`` the one on this node (https://huggingface.co/docs/accelerate/package_reference/accelerator)
            return node.attr in GLOBAL_RANK_ATTRS or (node.attr == "rank" and not self.rank_arg_is_local and
                                                      _src(node.value) in ("args", "self.args", "cfg", "config", "opt")) \
                or (isinstance(node.value, ast.Name) and node.value.id == "self" and node.attr in self.global_rank_attrs
                    and node.attr not in self.other_attrs)
        if isinstance(node, ast.JoinedStr):
            return any(isinstance(v, ast.FormattedValue) and self.is_global_rank(v.value) for v in node.values)
        return False

    def learn(self, tree: ast.AST | list[ast.AST]) -> None:
        """Propagate taint through assignments (a few passes: order-insensitive)."""
        assigns = [n for n in (tree if isinstance(tree, list) else subtree(tree)) if isinstance(n, (ast.Assign, ast.AnnAssign, ast.AugAssign)) and n.value]
        for _ in range(3):
            for n in assigns:
                targets = assign_targets(n)
                if len(targets) == 1 and isinstance(targets[0], ast.Tuple) and isinstance(n.value, ast.Tuple) and \
                        len(targets[0].elts) == len(n.value.elts):
                    # `rank, world = dist.get_rank(), dist.get_world_size()`: element by element
                    for t, v in zip(targets[0].elts, n.value.elts):
                        if isinstance(t, ast.Name) and self.is_rank_value(v):
                            self.rank.add(t.id)
                            if n not in self.sites.setdefault(t.id, []):
                                self.sites[t.id].append(n)
                        if isinstance(t, ast.Name) and self.is_global_rank(v):
                            self.global_rank.add(t.id)
                    continue
                names = [t.id for t in targets if isinstance(t, ast.Name)]
                attrs = [t.attr for t in targets if isinstance(t, ast.Attribute)]
                if attrs and self.is_rank_value(n.value):
                    self.rank_attrs.update(attrs)
                self_attrs = [t.attr for t in targets if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)
                              and t.value.id == "self"]
                if self_attrs:
                    (self.global_rank_attrs if self.is_global_rank(n.value) else self.other_attrs).update(self_attrs)
                names += [e.id for t in targets if isinstance(t, ast.Tuple) for e in t.elts if isinstance(e, ast.Name)]
                if not names:
                    continue
                if self.is_rank_value(n.value):
                    self.rank.update(names)
                    for name in names:
                        if n not in self.sites.setdefault(name, []):
                            self.sites[name].append(n)
                if self.is_global_rank(n.value):
                    self.global_rank.update(names)

    def rank_test(self, test: ast.AST) -> bool:
        """A branch condition that differs between ranks (a rank compared with -1 only does not)."""
        if isinstance(test, ast.BoolOp):
            return any(self.rank_test(v) for v in test.values)
        if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
            return self.rank_test(test.operand)
        if isinstance(test, ast.Compare) and self.is_rank(test.left) and _launch_check(test):
            return False
        return self.is_rank(test)


def _complementary(a: ast.expr, b: ast.expr) -> bool:
    """Two tests that hold on complementary sets of ranks: ``x == v`` / ``x != v``, ``X`` / ``not X``, and for a
    rank (never negative) ``x == 0`` / ``x > 0`` or ``x >= 1``."""
    for p, q in ((a, b), (b, a)):
        if isinstance(p, ast.UnaryOp) and isinstance(p.op, ast.Not) and ast.dump(p.operand) == ast.dump(q):
            return True
    if not (isinstance(a, ast.Compare) and isinstance(b, ast.Compare) and len(a.ops) == len(b.ops) == 1):
        return False
    if ast.dump(a.left) != ast.dump(b.left):
        return False
    ra, rb = ast.dump(a.comparators[0]), ast.dump(b.comparators[0])
    ops = {type(a.ops[0]), type(b.ops[0])}
    if ra == rb and ops == {ast.Eq, ast.NotEq}:
        return True
    zero, one = ast.dump(ast.Constant(0)), ast.dump(ast.Constant(1))
    pairs = {(ast.Eq, zero), (ast.Gt, zero)}, {(ast.Eq, zero), (ast.GtE, one)}
    return {(type(a.ops[0]), ra), (type(b.ops[0]), rb)} in pairs


class PythonLinter:
    """Lint one Python file: :meth:`run` returns the findings; :attr:`facts` the cross-file facts."""

    def __init__(self, path: str, text: str, ddp_params: dict[str, set[int | str]] | None = None,
                 rank_seeds: RankSeeds | None = None, ddp_returns: dict[str, set[int | None]] | None = None):
        """``ddp_params``: functions of this file that another linted file calls with a DDP-wrapped module, and at
        which argument positions or keywords (:attr:`PyFacts.ddp_passed` of that file); ``ddp_returns``: functions
        of other linted files that return one (:attr:`PyFacts.ddp_returns` of those files)."""
        self.path, self.text = path, text
        _forget_names()
        self.tree = ast.parse(text, filename=path)
        self.findings: list[Check] = []
        self.facts = PyFacts(path)
        self.imports_tdist = bool(re.search(r"from\s+torch\.distributed\s+import|from\s+accelerate\.utils\s+import", text))
        self.uses_torchmetrics = "torchmetrics" in text
        self.uses_fsdp = bool(re.search(r"FullyShardedDataParallel|\bFSDP\b|fully_shard", text))
        self.parents: dict[ast.AST, ast.AST] = {}
        self.nodes: list[ast.AST] = [self.tree]
        self._all_calls: list[ast.Call] | None = None
        self._gating: set[ast.AST | None] | None = None
        self._single_flags: set[str] | None = None
        self._scripted_names: set[str] | None = None
        self._lines: list[str] | None = None
        self._name_sets: dict[int, dict[str, list[ast.Assign]]] = {}
        self._spawn_lines: dict[int, list[int]] = {}  # function -> lines of its mp.spawn / start_processes calls
        self._shards_models = accelerator_shards(self.tree, text)
        for node in self.nodes:  # one breadth-first pass: the node list and each node's parent
            for child in ast.iter_child_nodes(node):
                self.parents[child] = node
                self.nodes.append(child)
        self.module_aliases: set[str] = set()
        self.import_origins: dict[str, str] = {}  # local name -> what it names: dist -> torch.distributed
        for node in self.nodes:
            if isinstance(node, ast.Import):
                self.module_aliases.update((a.asname or a.name).split(".")[0] for a in node.names)
                self.import_origins.update((a.asname, a.name) if a.asname else (a.name.split(".")[0],) * 2
                                           for a in node.names)
            elif isinstance(node, ast.ImportFrom):
                self.module_aliases.update(a.asname or a.name for a in node.names)
                if node.module and not node.level:
                    self.import_origins.update((a.asname or a.name, f"{node.module}.{a.name}") for a in node.names)
        spawned = set()
        for call in self._calls():
            _recv, name = _call_name(call)
            target = call.args[0] if call.args else next((k.value for k in call.keywords if k.arg == "fn"), None)
            if name in ("spawn", "start_processes") and isinstance(target, ast.Name):
                spawned.add(target.id)  # mp.spawn(worker, ...) or stylegan3's torch.multiprocessing.spawn(fn=...)
        self.spawned_funcs = spawned
        self.taint = _Taint(set())
        self.taint.parents = self.parents
        self._callbacks: dict[str, list[ast.Call]] | None = None  # see _callback_sites
        # parser.add_argument("--rank", "--local_rank", ...): the launcher's --local_rank lands in args.rank
        self.taint.rank_arg_is_local = bool(re.search(
            r"add_argument\(\s*['\"]--rank['\"]\s*,\s*['\"]--local[-_]rank['\"]|"
            r"add_argument\(\s*['\"]--local[-_]rank['\"]\s*,\s*['\"]--rank['\"]", text))
        self.functions: dict[str, ast.FunctionDef | ast.AsyncFunctionDef] = {}
        for node in self.nodes:
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                self.functions.setdefault(node.name, node)
        # a bare call f(...) never reaches a method (a class body is no enclosing scope of its methods' code)
        self.plain_functions = {n.name for n in self.nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
                                and not isinstance(self.parents.get(n), ast.ClassDef)}
        self._seed_rank_from_other_files(rank_seeds)
        self._learn_across_functions()
        self.wrappers = WrapperFlow(self.tree, text, self.parents, self.functions, ddp_params, ddp_returns)
        self.lightning = bool(re.search(r"LightningModule", text))
        self.collective_funcs: dict[str, str] = {}
        self._find_collective_functions()
        self.suppressed = self._suppressions()

    def _seed_rank_from_other_files(self, seeds: RankSeeds | None) -> None:
        """What other linted files say of rank values (``helpers.lint._across_scripts``): functions of theirs that
        return one (``dist.is_visualizer()`` when ``dist.py`` says ``return __rank == 0``), and the parameters of this
        file's functions and classes they call with one (``VARTrainer(is_visualizer=dist.is_visualizer())`` makes
        ``__init__``'s ``is_visualizer`` rank-dependent, and ``self.is_visualizer`` with it)."""
        self.imported_collectives: dict[str, str] = {}
        if not seeds:
            return
        funcs, passed, collectives = seeds
        self.imported_collectives = dict(collectives)
        self.taint.rank_funcs.update(funcs)
        for name, which in passed.items():
            target = self.functions.get(name) if name in self.plain_functions else next(
                (m for c in self.nodes if isinstance(c, ast.ClassDef) and c.name == name
                 if (m := method_named(c, "__init__")) is not None), None)
            if target is None:
                continue
            params = [a.arg for a in target.args.args if a.arg not in ("self", "cls")]
            for w in which:
                if isinstance(w, int) and w < len(params):
                    self.taint.rank.add(params[w])
                elif isinstance(w, str) and w in params + [a.arg for a in target.args.kwonlyargs]:
                    self.taint.rank.add(w)

    def _learn_across_functions(self) -> None:
        """Rank taint through assignments and across the file's functions (a few rounds, to a fixed point):

        * ``mp.spawn(fn, ...)``: ``fn``'s first parameter is the process index (rank-dependent);
        * a call ``f(x)`` with a rank-dependent ``x`` taints ``f``'s parameter at that position (or keyword);
        * a function that returns a rank-dependent value (``def is_main(): return dist.get_rank() == 0``)
          makes its calls rank-dependent; one that returns the global rank itself (``return
          Accelerator().process_index``) makes its calls global-rank values (D3's device choice).

        Names are not scoped (a name tainted in one function is tainted in all): the over-approximation the
        assignment pass already makes.
        """
        taint = self.taint
        for name in self.spawned_funcs:
            fn = self.functions.get(name)
            if fn is not None and fn.args.args:
                taint.rank.add(fn.args.args[0].arg)
        calls = [c for c in self._calls() if isinstance(c.func, (ast.Name, ast.Attribute))]
        returns = {name: [n.value for n in subtree(fn) if isinstance(n, ast.Return) and n.value is not None]
                   for name, fn in self.functions.items()}
        taint.own_rank_calls = {name for name, fn in self.functions.items() if name in GLOBAL_RANK_CALLS and
                                returns.get(name) and all(self._local_rank_value(fn, v) for v in returns[name])}
        for _ in range(3):
            before = (len(taint.rank), len(taint.rank_funcs), len(taint.rank_attrs), len(taint.global_rank_funcs))
            taint.learn(self.nodes)
            for call in calls:
                recv, name = _call_name(call)
                fn = self.functions.get(name)
                if fn is None or recv not in ("", "self", "cls"):
                    continue
                params = [a.arg for a in fn.args.args]
                if params and params[0] in ("self", "cls"):  # (a bare call of a same-named method: not its self)
                    params = params[1:]
                for i, arg in enumerate(call.args):
                    if i < len(params) and taint.is_rank_value(arg):
                        taint.rank.add(params[i])
                for kw in call.keywords:
                    if kw.arg and kw.arg in params and taint.is_rank_value(kw.value):
                        taint.rank.add(kw.arg)
            for name, values in returns.items():
                if name not in taint.rank_funcs and values and any(taint.is_rank_value(v) for v in values):
                    taint.rank_funcs.add(name)
                if name not in taint.global_rank_funcs and any(self._returns_global_rank(self.functions[name], v)
                                                                 for v in values):
                    taint.global_rank_funcs.add(name)
            if (len(taint.rank), len(taint.rank_funcs), len(taint.rank_attrs), len(taint.global_rank_funcs)) == before:
                break

    def _local_rank_value(self, fn: ast.AST, value: ast.AST) -> bool:
        """``value``, returned by ``fn``, is LOCAL_RANK or a constant: read from the environment directly, or a name
        that ``fn`` assigns only such values (``try: rank = int(os.environ.get("LOCAL_RANK")) except: rank = 0``)."""
        def local(v: ast.AST) -> bool:
            if isinstance(v, ast.Call) and _call_name(v)[1] == "int" and v.args:
                v = v.args[0]
            return isinstance(v, ast.Constant) or _env_key(v) == "LOCAL_RANK"
        if not isinstance(value, ast.Name):
            return local(value)
        sets = [n.value for n in subtree(fn) if isinstance(n, ast.Assign) and
                any(isinstance(t, ast.Name) and t.id == value.id for t in n.targets)]
        return bool(sets) and all(local(v) for v in sets)

    def _returns_global_rank(self, fn: ast.AST, value: ast.AST, seen: frozenset[str] = frozenset()) -> bool:
        """Whether ``return value`` in ``fn`` returns the global rank, judged within ``fn``: a returned name must be
        assigned a global-rank value in ``fn`` itself (names are not scoped elsewhere, and a ``rank`` of another
        function must not make ``def get_local_rank(): ... return int(rank)`` a global rank)."""
        if isinstance(value, ast.IfExp):
            return self._returns_global_rank(fn, value.body, seen) or self._returns_global_rank(fn, value.orelse, seen)
        if isinstance(value, ast.Call) and _call_name(value)[1] in ("int", "str") and value.args:
            return self._returns_global_rank(fn, value.args[0], seen)
        if isinstance(value, ast.Name):
            if value.id in seen:  # x = x + 1, or a = b; b = a
                return False
            return any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == value.id for t in n.targets)
                       and self._returns_global_rank(fn, n.value, seen | {value.id}) for n in subtree(fn))
        return self.taint.is_global_rank(value)

    # --- helpers -------------------------------------------------------------------------
    def source_lines(self, node: ast.AST) -> str:
        """The file's lines ``node`` spans, comments removed: for substring tests on a whole function, a slice
        where ``ast.unparse`` rebuilt the text (``benchmarks/bench_lint.py``: the unparse of every function was a
        tenth of the time).  The spacing is the author's, not unparse's normalised one."""
        if self._lines is None:
            self._lines = self.text.splitlines()
        start, end = getattr(node, "lineno", 1), getattr(node, "end_lineno", None) or len(self._lines)
        return re.sub(r"#.*", "", "\n".join(self._lines[start - 1:end]))

    def _calls(self, node: ast.AST | None = None) -> list[ast.Call]:
        if node is None:
            if self._all_calls is None:
                self._all_calls = [n for n in self.nodes if isinstance(n, ast.Call)]
            return self._all_calls
        return [n for n in subtree(node) if isinstance(n, ast.Call)]

    def _suppressions(self) -> dict[int, set[str]]:
        out: dict[int, set[str]] = {}
        if "runbook-lint" not in self.text:
            return out
        try:
            for tok in tokenize.generate_tokens(io.StringIO(self.text).readline):
                if tok.type == tokenize.COMMENT:
                    m = re.search(r"runbook-lint:\s*disable=([\w,-]+)", tok.string)
                    if m:
                        out.setdefault(tok.start[0], set()).update(m.group(1).split(","))
        except (tokenize.TokenError, IndentationError):
            pass
        return out

    def add(self, rule: str, severity: str, node: ast.AST | int, message: str, fix: str, seed: str,
            deferred: bool = False) -> None:
        """Record a finding at ``node``'s line unless suppressed there; ``deferred``: it holds only if the program is
        distributed, which another linted file may show (:attr:`PyFacts.deferred`, settled by ``lint_texts``)."""
        line = node if isinstance(node, int) else getattr(node, "lineno", 0)
        if rule in self.suppressed.get(line, set()) or "all" in self.suppressed.get(line, set()):
            return
        if any(f.id == rule and f.line_no == line for f in [*self.findings, *self.facts.deferred]):
            return
        (self.facts.deferred if deferred else self.findings).append(finding(rule, severity, self.path, line, message,
                                                                            fix, seed))

    def _syncbn_forward(self, call: ast.Call) -> bool:
        """``call`` runs the forward of a model this file converted with ``SyncBatchNorm.convert_sync_batchnorm``
        outside DDP's own forward (``de_parallel(model)(x)``, ``model.module(x)``, ``torch.jit.trace(de_parallel(model),
        x)``), with no ``model.eval()`` before it in its function: SyncBatchNorm's training-mode forward all-gathers the
        batch mean and variance over the process group (torch/nn/modules/batchnorm.py, ``sync_batch_norm.apply``;
        https://docs.pytorch.org/docs/stable/generated/torch.nn.SyncBatchNorm.html), so it is a collective
        (ultralytics/yolov5#4615: the TensorBoard graph traced on rank 0 hung the others)."""
        names = getattr(self, "_syncbn_names", None)
        if names is None:
            names = {t.id for n in self.nodes if isinstance(n, ast.Assign) and "convert_sync_batchnorm" in _src(n.value)
                     for t in n.targets if isinstance(t, ast.Name)}
            self._syncbn_names = names
        if not names:
            return False

        def inner(e: ast.AST) -> str | None:  # model.module / de_parallel(model) / unwrap(model) -> "model"
            if isinstance(e, ast.Attribute) and e.attr == "module" and isinstance(e.value, ast.Name):
                return e.value.id
            if isinstance(e, ast.Call) and len(e.args) == 1 and isinstance(e.args[0], ast.Name) and \
                    re.search(r"(?i)de_?parallel|unwrap", _call_name(e)[1]):
                return e.args[0].id
            return None

        target = inner(call.func)
        if target is None and _call_name(call) == ("torch.jit", "trace") and call.args:
            target = inner(call.args[0]) or (call.args[0].id if isinstance(call.args[0], ast.Name) else None)
        if target not in names:
            return False
        fn = self._enclosing_function(call) or self.tree
        return not any(isinstance(n, ast.Call) and _call_name(n)[1] == "eval" and n.lineno <= call.lineno
                       and target in _src(n.func) for n in subtree(fn))

    def collective_name(self, call: ast.Call, depth: int = 0) -> str | None:
        """The collective this call is or implies (``dist.barrier``, ``helper() -> barrier``), else None."""
        recv, name = _call_name(call)
        if name in ("send", "recv", "isend", "irecv"):
            return None
        if self.wrappers.forward(call):
            return f"{_src(call.func)}(...) (the DistributedDataParallel forward broadcasts the module's buffers)"
        if self._syncbn_forward(call):
            return (f"{_src(call)[:50]} (a forward of the SyncBatchNorm model: in training mode each SyncBatchNorm "
                    "layer all-gathers the batch statistics)")
        if name in ("DistributedDataParallel", "DDP") and name not in self.functions and call.args:
            # DDP.__init__ checks every rank's parameter shapes (_verify_param_shape_across_processes, an all-gather)
            # and broadcasts rank 0's parameters and buffers (_sync_module_states): torch/nn/parallel/distributed.py
            return f"{name}(...) (its constructor all-gathers the parameter shapes and broadcasts rank 0's weights)"
        if name == "prepare" and "accelerator" in recv.lower() and any(
                isinstance(a, ast.Name) and _MODEL_ATTR.search(a.id) for a in call.args):
            return (f"{recv}.prepare(model) (under several processes it wraps the model in DistributedDataParallel, "
                    "whose constructor broadcasts rank 0's weights)")
        if name in ("save_model", "push_to_hub") and re.search(r"(?i)trainer$", recv) and recv not in self.module_aliases:
            # transformers' Trainer.save_model gathers the model through accelerator.get_state_dict under DeepSpeed
            # ZeRO-3 and FSDP (transformers/trainer.py save_model), and push_to_hub calls save_model: a collective
            # there, as save_state is, decided by the config (huggingface/alignment-handbook#88)
            return f"{recv}.{name}"
        if recv in self.module_aliases and name in self.imported_collectives:
            return f"{recv}.{name}() -> {self.imported_collectives[name]}"  # another linted file's helper
        if not recv and name in self.module_aliases and name in self.imported_collectives and name not in self.functions:
            return f"{name}() -> {self.imported_collectives[name]}"  # imported by name from another linted file
        if self.lightning and recv == "self" and name in ("log", "log_dict") and name not in self.functions and \
                not any(k.arg == "rank_zero_only" and isinstance(k.value, ast.Constant) and k.value.value is True
                        for k in call.keywords):
            return f"self.{name} (Lightning: called from every process unless rank_zero_only=True)"
        if not recv and name in self.functions and name not in self.plain_functions:
            # a method's name called bare: an imported function of that name (mmengine's FSDPStrategy.save_checkpoint
            # calls mmengine.runner.checkpoint.save_checkpoint, a file writer); an engine's save/load_checkpoint
            # collective is a method call, never a bare one here
            if name in ("save_checkpoint", "load_checkpoint"):
                return None
        elif (not recv or recv in ("self", "cls")) and name in self.functions:
            if name in self.collective_funcs and depth < 3:
                return f"{name}() -> {self.collective_funcs[name]}"
            return None
        if name in ("save_checkpoint", "load_checkpoint") and (recv in self.module_aliases and recv != "deepspeed" or
                                                             not recv and name in self.module_aliases):
            return None  # a module's own save_checkpoint function (through its module or imported by name:
            # physicsnemo.launch.utils.save_checkpoint), not an engine method
        if name in ("save_checkpoint", "load_checkpoint") and recv and _LOGGER_RECEIVER.search(recv):
            return None  # a tracker's own checkpoint upload (wandb_logger.save_checkpoint), not an engine's
        if name in STRONG_COLLECTIVES and not (not recv and name in self.plain_functions):
            return f"{recv + '.' if recv else ''}{name}"
        if name in WEAK_COLLECTIVES:
            if name == "compute":
                return f"{recv}.compute" if self.uses_torchmetrics and recv and "metric" in recv.lower() else None
            if name in ("save", "load"):
                return f"{recv}.{name}" if recv in ("dcp", "dist_cp", "torch.distributed.checkpoint") else None
            if name in ("get_state_dict", "optim_state_dict"):
                return f"{recv}.{name}" if recv and ("accelerator" in recv or recv in ("FSDP", "FullyShardedDataParallel")) \
                    else None
            if recv and WEAK_RECEIVERS.match(recv) and name != "sync":
                return f"{recv}.{name}"
            if not recv and self.imports_tdist and name in ("gather", "reduce", "broadcast", "scatter") and name not in self.functions:
                return name
            return None
        if name == "state_dict" and self.uses_fsdp and self._under_full_state_dict_ctx(call):
            return f"{recv}.state_dict (FULL_STATE_DICT gather)"
        target = None
        if not recv and name in self.plain_functions or recv in ("self", "cls") and name in self.functions:
            target = name
        if target and target in self.collective_funcs and depth < 3:
            return f"{target}() -> {self.collective_funcs[target]}"
        return None

    def _under_full_state_dict_ctx(self, node: ast.AST) -> bool:
        p = self.parents.get(node)
        while p is not None:
            if isinstance(p, (ast.With, ast.AsyncWith)):
                for item in p.items:
                    s = _src(item.context_expr)
                    if "state_dict_type" in s and ("FULL_STATE_DICT" in s or "full" in s.lower()):
                        return True
            p = self.parents.get(p)
        return False

    def _find_collective_functions(self) -> None:
        calls = {name: self._calls(fn) for name, fn in self.functions.items()}
        for _ in range(3):  # a helper calling a helper calling a collective (bounded depth)
            changed = False
            for name, fn in self.functions.items():
                if name in self.collective_funcs:
                    continue
                for call in calls[name]:
                    c = self.collective_name(call, depth=1)
                    if c and not self._gated_within(call, fn):
                        self.collective_funcs[name] = c
                        changed = True
                        break
            if not changed:
                break

    def _gated_within(self, node: ast.AST, stop: ast.AST) -> bool:
        p, child = self.parents.get(node), node
        while p is not None and p is not stop:
            if isinstance(p, ast.If) and child is not p.test and self.taint.rank_test(p.test):
                return True
            child, p = p, self.parents.get(p)
        return False

    def _rank_gate(self, node: ast.AST) -> ast.If | ast.While | ast.IfExp | None:
        """The innermost rank-dependent branch containing ``node`` (inside its own function), or that function when it
        is decorated ``@rank_zero_only`` (Lightning: the body runs on global rank 0 only)."""
        p, child = self.parents.get(node), node
        while p is not None and not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            if isinstance(p, (ast.If, ast.While, ast.IfExp)) and child is not p.test and self.taint.rank_test(p.test):
                return p
            if isinstance(p, (ast.For, ast.AsyncFor)) and child is not p.iter and isinstance(p.iter, ast.Call) and \
                    _call_name(p.iter)[1] == "range" and any(self.taint.is_rank_value(a) for a in p.iter.args):
                return p  # type: ignore[return-value]  # a trip count that differs between ranks
            if isinstance(p, (ast.BoolOp,)) and child is not p.values[0] and self.taint.is_rank(p.values[0]) and \
                    self.taint.rank_test(p.values[0]):
                return p  # type: ignore[return-value]
            child, p = p, self.parents.get(p)
        if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)) and child not in p.decorator_list and \
                any(_src(d).endswith("rank_zero_only") for d in p.decorator_list):
            return p  # type: ignore[return-value]  # Lightning's @rank_zero_only: the body runs on global rank 0 only
        return None

    def rank_branch_at(self, line: int) -> int | None:
        """The line of the innermost rank-dependent branch (``if``/``while``/``and`` on a rank value, within its
        function) around the statement that starts at ``line``; ``None`` if there is none.  Used by the hang
        doctor (:mod:`helpers.doctor`) to tell which of two ranks took a rank-only path."""
        for node in self.nodes:
            if isinstance(node, ast.stmt) and getattr(node, "lineno", None) == line:
                gate = self._rank_gate(node)
                if gate is not None:
                    return gate.lineno
        return None

    # --- rules ---------------------------------------------------------------------------
    def run(self, extra_rules: Sequence[Callable[[PythonLinter], None]] = ()) -> list[Check]:
        """Run every rule, then ``extra_rules`` (each called with this linter: the contract rules of
        :mod:`helpers.lint.contract_rules`, which read this linter's tree and add to :attr:`findings`); return the
        findings (also kept in :attr:`findings`).  Passed in, not imported here: the contract rules import this module."""
        self.rule_rank_gated_collectives()
        self.rule_rank_early_exit()
        self.rule_rank_nested_continue()
        self.rule_device_from_global_rank()
        self.rule_sampler_set_epoch()
        self.rule_rank_sliced_data()
        self.rule_deepspeed_engine()
        self.rule_ddp_fsdp_options()
        self.rule_writes_on_every_rank()
        self.rule_master_port_and_timeout()
        self.rule_ddp_wrapper_attribute()
        self.rule_amp_initialize_after_ddp()
        self.rule_unbound_after_ddp_branch()
        self.rule_lightning_epoch_log_not_synced()
        self.rule_metric_not_reduced()
        self.rule_rank_gated_model_change()
        self.rule_rank_gated_object_used()
        self.rule_trainer_log_dir_gated()
        for rule in extra_rules:
            rule(self)
        self.collect_facts()
        return sorted(self.findings, key=lambda f: f.line_no)

    def _balanced(self, gate: ast.AST, coll: str) -> bool:
        """True when the other branch, or a sibling rank-dependent ``if``, makes the same collective
        (``if rank == 0: broadcast(x) else: broadcast(y)``; the main-process-first pair of barriers)."""
        short = coll.split("->")[-1].strip().split(".")[-1]
        if isinstance(gate, ast.If):
            other = [self.collective_name(c) for c in self._calls(ast.Module(body=gate.orelse, type_ignores=[]))]
            if any(o and o.split("->")[-1].strip().split(".")[-1] == short for o in other):
                return True
            parent = self.parents.get(gate)
            siblings = []
            for fld in ("body", "orelse", "finalbody"):
                block = getattr(parent, fld, None)
                if isinstance(block, list) and gate in block:
                    siblings = block
            for s in siblings:
                if s is gate or not isinstance(s, ast.If) or not self.taint.rank_test(s.test):
                    continue
                calls = [self.collective_name(c) for c in self._calls(ast.Module(body=s.body, type_ignores=[]))]
                if any(o and o.split("->")[-1].strip().split(".")[-1] == short for o in calls):
                    return True
        return False

    def rule_rank_gated_collectives(self) -> None:
        """D21 (and Gilbreth 7.5 issue 3): a collective only some ranks reach."""
        for call in self._calls():
            coll = self.collective_name(call)
            if not coll:
                continue
            gate = self._rank_gate(call)
            if gate is None or self._balanced(gate, coll):
                continue
            if coll.endswith(("save_state", "load_state", "save_model", "push_to_hub")) and \
                    not re.search(r"(?i)deepspeed|fsdp|zero3|zero_stage", self.text):
                # under DDP Accelerator.save_state gathers nothing (get_state_dict = state_dict; the accelerator state
                # is written by the calling process): the diffusers pattern `if is_main_process: save_state()` is
                # right there; it hangs only under DeepSpeed / FSDP, which the accelerate config (not this file) picks:
                # said as info (huggingface/diffusers#7917)
                what = coll.rsplit(".", 1)[-1]
                self.add("rank-gated-collective", "info", call,
                         f"{coll} is reached only when `{_gate_text(gate)}` holds: fine under DDP (the calling process "
                         f"writes), a hang under a DeepSpeed ZeRO-3 or FSDP config, where {what} gathers the sharded "
                         "state and every process must call it",
                         "let every process call it when the config shards the model: `if accelerator.is_main_process "
                         "or accelerator.distributed_type == DistributedType.DEEPSPEED:`", "D21")
                continue
            if coll.endswith(("save_state", "load_state", "save_model", "push_to_hub")) and \
                    re.search(r"DEEPSPEED|FSDP|is_fsdp|is_deepspeed", _src(getattr(gate, "test", gate))):
                # Accelerator.save_state is a collective under DeepSpeed and FSDP (engine.save_checkpoint, sharded
                # state dicts; accelerate/accelerator.py save_state): a gate that lets every rank in for those types
                # (`is_main_process or distributed_type == DistributedType.DEEPSPEED`) is the documented fix
                continue
            if coll.endswith("save_checkpoint") and re.search(r"(?i)checkpointer$", _call_name(call)[0]) and \
                    self._gathered_before(call, gate):
                # a checkpointer object handed a state dict every rank gathered before the gate (torchtune's
                # recipes: gather_cpu_state_dict on all ranks, then `if self._is_rank_zero:
                # self._checkpointer.save_checkpoint(...)`) writes files; one given nothing gathered may be a
                # DeepSpeed checkpointer whose save is the engine's collective (allennlp#4693)
                continue
            if self._sharded_lets_all_in(gate):
                # `if fsdp_enabled or is_master: save_checkpoint(...)`: every rank enters under the sharded setup,
                # where gathering a state dict is a collective; under DDP only the writer needs the state dict
                continue
            if re.search(r"(?i)collective$", _call_name(call)[0].rsplit(".", 1)[-1]):
                # a method of a collective object made for some ranks (Fabric's TorchCollective over a subgroup):
                # its members are decided where it is made (Lightning's decoupled RL example: `if global_rank == 1:
                # player_trainer_collective.broadcast_object_list(...)`); a `group=` argument alone is not enough
                # (a rank of the group may still take the other arm: issue_hangs.py's subgroup_mismatch)
                continue
            if self._init_in_same_branch(gate, call):
                # `if is_ddp: init_process_group(); barrier()`: the ranks that skip the branch have no process
                # group at all, so there is nobody for them to leave waiting
                continue
            seed = "Gilbreth 7.5" if "->" not in coll and coll.endswith(("save_checkpoint", "load_checkpoint")) else "D21"
            fix = "call the collective on every rank; gate only the side effect (print, file write) on rank 0"
            if "rank_zero_only=True" in coll:
                seed = "https://lightning.ai/docs/pytorch/stable/visualize/logging_advanced.html#rank-zero-only"
                fix = "self.log(..., rank_zero_only=True) for a value logged from rank 0 only (or log on every rank)"
            elif "DistributedDataParallel forward" in coll:
                seed = "https://docs.pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html"
                fix = "run a rank-0-only evaluation on the unwrapped model (model.module), or evaluate on every rank"
            self.add("rank-gated-collective", "error", call,
                     f"{coll} is reached only when `{_gate_text(gate)}` holds: the ranks that skip it "
                     f"never join, the others wait in it forever (hang)", fix, seed)

    def rule_trainer_log_dir_gated(self) -> None:
        """Lightning's ``Trainer.log_dir`` is a property that broadcasts the directory from rank 0 (``dirpath =
        self.strategy.broadcast(dirpath)`` in lightning/pytorch/trainer/trainer.py; ``broadcast_object_list`` under
        DDP): read under ``if trainer.is_global_zero:`` (or after the other ranks returned, or in a
        ``@rank_zero_only`` function), rank 0 waits in the broadcast for ranks that never join (hepattn's metadata
        callback).  Reported once per function."""
        if "log_dir" not in self.text or not re.search(r"\b(?:pytorch_)?lightning\b", self.text):
            return
        done: set[ast.AST | None] = set()
        for node in self.nodes:
            if not (isinstance(node, ast.Attribute) and node.attr == "log_dir" and isinstance(node.ctx, ast.Load)
                    and re.search(r"(?:^|\.)trainer$", _src(node.value))):
                continue
            fn = self._enclosing_function(node)
            if fn in done:
                continue
            gate = self._rank_gate(node)
            if gate is not None:
                done.add(fn)
                self.add("rank-gated-collective", "error", node,
                         f"{_src(node)} is read only when `{_gate_text(gate)}` holds, and Lightning's Trainer.log_dir "
                         "broadcasts the directory from rank 0 (strategy.broadcast): the other ranks never join, so "
                         "rank 0 waits in it (hang)", "read trainer.log_dir on every rank (before the gate) and gate "
                         "only what uses it", _PL_TRAINER_SRC)
            elif self._after_rank_exit(node):
                done.add(fn)
                self.add("rank-early-exit-collective", "error", node,
                         f"{_src(node)} comes after a rank-dependent early exit, and Lightning's Trainer.log_dir "
                         "broadcasts the directory from rank 0 (strategy.broadcast): the ranks that left never join, "
                         "so rank 0 waits in it (hang)", "read trainer.log_dir on every rank before the exit",
                         _PL_TRAINER_SRC)

    def _sharded_lets_all_in(self, gate: ast.AST) -> bool:
        """The gate is an ``or`` with an operand that is not rank-dependent and names a sharded setup (FSDP,
        DeepSpeed, ZeRO): every rank passes it whenever the model is sharded."""
        test = getattr(gate, "test", None)
        if not (isinstance(test, ast.BoolOp) and isinstance(test.op, ast.Or)):
            return False
        return any(not self.taint.rank_test(v) and re.search(r"(?i)fsdp|deepspeed|zero_?3|sharded", _src(v))
                   for v in test.values)

    def _init_in_same_branch(self, gate: ast.AST, call: ast.Call) -> bool:
        """``init_process_group`` is called, before ``call``, in the branch of ``gate`` that holds ``call``."""
        if not isinstance(gate, ast.If):
            return False
        branch = gate.body if any(call in ast.walk(s) for s in gate.body) else gate.orelse
        return any(isinstance(c, ast.Call) and _call_name(c)[1] == "init_process_group" and c.lineno <= call.lineno
                   for st in branch for c in subtree(st))

    def _exclusive_paths(self, exit_test: ast.expr, call: ast.AST, stop: ast.AST) -> bool:
        """The early exit's condition and the branches around ``call`` (up to ``stop``) cannot both hold: the exit
        needs ``not use_fsdp_eval and not is_rank0`` and the collective sits under ``if use_fsdp_eval:``."""
        need = _literals(exit_test, True)
        p, child = self.parents.get(call), call
        while p is not None and p is not stop:
            if isinstance(p, ast.If) and child is not p.test:
                holds = child in p.body
                if holds or not (isinstance(p.test, ast.BoolOp) and isinstance(p.test.op, ast.And)):
                    if any((src, not pol) in need for src, pol in _literals(p.test, holds)):
                        return True
            child, p = p, self.parents.get(p)
        return False

    def _mapping_tested(self, stmt: ast.If) -> bool:
        """The emptiness test reads a mapping (``len(data) == 0`` where the function calls ``data.values()`` /
        ``.keys()`` / ``.items()``): a dict of named statistics has the same keys on every rank (fairseq's
        ``all_reduce_dict``), unlike a shard of the batch, so its emptiness is not this rank's own."""
        names = {n.id for n in ast.walk(stmt.test) if isinstance(n, ast.Name) and n.id != "len"}
        scope = self._enclosing_function(stmt) or self.tree
        return bool(names) and any(
            isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr in ("values", "keys", "items")
            and isinstance(c.func.value, ast.Name) and c.func.value.id in names for c in subtree(scope))

    def rule_rank_early_exit(self) -> None:
        """D21/D20: ``if rank ...: return/break/continue`` before a collective in the same block."""
        for node in self.nodes:
            for fld in ("body", "orelse"):
                block = getattr(node, fld, None)
                if not isinstance(block, list):
                    continue
                for i, stmt in enumerate(block):
                    if not isinstance(stmt, ast.If):
                        continue
                    local = not self.taint.rank_test(stmt.test)  # else a test on this rank's own data, or nothing
                    if local and (not _local_emptiness(stmt.test) or self._mapping_tested(stmt)):
                        continue
                    exits = _exits(stmt.body)
                    if not exits or isinstance(exits[0], ast.Raise) or _error_exit(exits[0], self.parents):
                        continue
                    rest = ast.Module(body=block[i + 1:], type_ignores=[])
                    if isinstance(exits[0], (ast.Break, ast.Continue)) and not self._in_loop(stmt):
                        continue
                    kind = type(exits[0]).__name__.lower()
                    for call in self._calls(rest):
                        coll = self.collective_name(call)
                        if not coll or self._rank_gate(call) is not None or \
                                self._exclusive_paths(stmt.test, call, node):
                            continue
                        if local:
                            self.add("rank-early-exit-collective", "warning", call,
                                     f"{coll} comes after an early {kind} taken when this rank's own data is empty "
                                     f"(line {stmt.lineno}: `{_src(stmt.test)[:50]}`): each rank holds a different "
                                     "batch, so a rank with nothing left leaves while the others wait in the "
                                     "collective (hang)",
                                     "let every rank reach the collective with an empty (or padded) tensor, or decide "
                                     "the exit from a value all ranks share (all_reduce the count first)", "D21")
                        else:
                            self.add("rank-early-exit-collective", "error", call,
                                     f"{coll} comes after a rank-dependent early {kind} (line {stmt.lineno}): the ranks "
                                     f"that leave never reach it, the others hang in it",
                                     "let every rank reach the collective (move the exit after it, or make the exit "
                                     "condition the same on all ranks)", "D21")
                        break

    def rule_rank_nested_continue(self) -> None:
        """D21: a ``continue`` / ``break`` nested anywhere under a rank gate inside a loop skips every collective that
        comes later in that loop's body on the ranks that take it (VLMEvalKit: ``if rank == 0:`` holds several
        ``continue`` statements, and the end-of-iteration ``dist.barrier()`` after the ``try`` block then waits for a
        rank that already went on to the next dataset).  A ``break`` leaves the loop on those ranks, so every
        collective of the body, earlier lines included, waits for them in the next iteration (ultralytics/yolov5#4576:
        the early stop under ``if RANK in [-1, 0]:``).  The direct case (the exit and the collective in one block)
        is :meth:`rule_rank_early_exit`."""
        for node in self.nodes:
            if not isinstance(node, (ast.Continue, ast.Break)):
                continue
            loop, gate = None, None
            p = self.parents.get(node)
            while p is not None and not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)):
                if isinstance(p, (ast.For, ast.While, ast.AsyncFor)):
                    loop = p
                    break
                if gate is None and isinstance(p, ast.If) and self.taint.rank_test(p.test):
                    gate = p
                p = self.parents.get(p)
            if loop is None or gate is None or _error_exit(node, self.parents):
                continue
            inside = {id(n) for n in ast.walk(gate)}
            leaves = isinstance(node, ast.Break)  # the others go on to the next iteration: all of the body follows
            for call in self._calls(ast.Module(body=loop.body, type_ignores=[])):
                if (call.lineno <= node.lineno and not leaves) or id(call) in inside:
                    continue
                coll = self.collective_name(call)
                if not coll or self._rank_gate(call) is not None:
                    continue
                kind = type(node).__name__.lower()
                if leaves and call.lineno < node.lineno:
                    self.add("rank-early-exit-collective", "error", call,
                             f"{coll} is in the loop that the break at line {node.lineno}, under the rank-dependent "
                             f"`if {_src(gate.test)[:40]}` (line {gate.lineno}), leaves on those ranks only: the others "
                             "go on to the next iteration and wait in it (hang)",
                             "decide the exit on every rank (broadcast the stop flag from rank 0, then break on all)",
                             "D21")
                    break
                self.add("rank-early-exit-collective", "error", call,
                         f"{coll} comes later in the loop than a {kind} (line {node.lineno}) under the rank-dependent "
                         f"`if {_src(gate.test)[:40]}` (line {gate.lineno}): the ranks that take it skip this "
                         "collective for that iteration while the others wait in it (hang, or the collectives pair up "
                         "across iterations)", f"let every rank reach it: replace the {kind} under the rank gate "
                         "with a flag checked after the collective, or move the collective before the gate", "D21")
                break

    def _in_loop(self, node: ast.AST) -> bool:
        p = self.parents.get(node)
        while p is not None and not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if isinstance(p, (ast.For, ast.While, ast.AsyncFor)):
                return True
            p = self.parents.get(p)
        return False

    def _enclosing_function(self, node: ast.AST) -> ast.AST | None:
        p = self.parents.get(node)
        while p is not None and not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)):
            p = self.parents.get(p)
        return p

    def _global_rank_value(self, node: ast.AST) -> bool:
        """``node`` holds the global rank where it is read.  A name whose last assignment before the read, in the same
        function, is not a global rank (``rank = int(os.environ["LOCAL_RANK"])`` before ``rank = dist.get_rank()``
        further down: torchrec's nvt example) is not, whatever the name holds later."""
        if isinstance(node, ast.Name):
            fn = self._enclosing_function(node)
            if id(fn) not in self._name_sets:  # each function's assignments to plain names, computed once
                table: dict[str, list[ast.Assign]] = {}
                for n in subtree(fn or self.tree):
                    if isinstance(n, ast.Assign) and self._enclosing_function(n) is fn:
                        for t in n.targets:
                            if isinstance(t, ast.Name):
                                table.setdefault(t.id, []).append(n)
                self._name_sets[id(fn)] = table
            before = [n for n in self._name_sets[id(fn)].get(node.id, []) if n.lineno < node.lineno]
            if before:
                last = max(before, key=lambda n: n.lineno)
                text = ast.unparse(last.value)
                if not self.taint.is_global_rank(last.value) and re.search(r"LOCAL_RANK|local_rank|LOCALID", text) \
                        and not re.search(r"(?i)node_?(?:rank|id)\b.*\*|NODEID.*\*|\*.*node_?(?:rank|id)\b", text):
                    return False  # (node * ranks_per_node + local_rank is the global rank: WeatherGenerator's SLURM path)
        if isinstance(node, ast.Name) and node.id in ("rank",):
            fn = self._enclosing_function(node)
            if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and fn.name in self.spawned_funcs:
                return False  # mp.spawn's index is the local process index
            if node.id not in self.taint.global_rank:
                return bool(isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and not self.spawned_funcs
                            and any(a.arg == "rank" for a in fn.args.args) and self._rank_param_from_env(fn))
        return self.taint.is_global_rank(node)

    def _rank_param_from_env(self, fn: ast.AST) -> bool:
        """A ``rank`` parameter whose callers pass the global rank (``RANK``/``get_rank()``)."""
        name = getattr(fn, "name", "")
        for call in self._calls():
            _, n = _call_name(call)
            if n == name and call.args and self.taint.is_global_rank(call.args[0]):
                return True
        return False

    def rule_device_from_global_rank(self) -> None:
        """D3: the GPU chosen from the global rank (right on one node only)."""
        for call in self._calls():
            recv, name = _call_name(call)
            args: list[ast.AST] = []
            if name == "set_device" and ("cuda" in recv or recv.endswith("get_accelerator()")) or \
                    name == "set_device_index" and "accelerator" in recv:
                # DeepSpeed's accelerator abstraction: get_accelerator().set_device(device_index) is
                # torch.cuda.set_device on CUDA (deepspeed/accelerator/cuda_accelerator.py set_device); torch 2.6's
                # torch.accelerator.set_device_index(index) is the device-neutral form
                args = call.args[:1]
            elif name == "device" and recv == "torch" and call.args:
                if len(call.args) >= 2:
                    args = [call.args[1]]
                elif isinstance(call.args[0], ast.JoinedStr):
                    args = [v.value for v in call.args[0].values if isinstance(v, ast.FormattedValue)]
            elif name in ("DistributedDataParallel", "DDP"):
                for kw in call.keywords:
                    if kw.arg == "device_ids" and isinstance(kw.value, ast.List):
                        args = kw.value.elts[:1]
                    if kw.arg == "output_device":
                        args.append(kw.value)
            for kw in call.keywords:
                if kw.arg == "device_id" and name in ("FullyShardedDataParallel", "FSDP"):
                    args.append(kw.value)
            if name == "to" and isinstance(call.func, ast.Attribute) and len(call.args) == 1 and not call.keywords:
                args.append(call.args[0])  # module.to(index): an int is a CUDA device index (Module.to, Tensor.to)
            if any(self._global_rank_value(a) for a in args):
                self.add("device-from-global-rank", "error", call,
                         f"{_src(call)[:70]} picks the GPU from the global rank: on the second node RANK is 8..15 and "
                         "cuda:RANK does not exist ('invalid device ordinal') or ranks collide",
                         "use LOCAL_RANK: torch.cuda.set_device(int(os.environ['LOCAL_RANK']))", "D3")
        for node in self.nodes:  # a device string f"cuda:{index}" built anywhere (returned, assigned, passed)
            if not (isinstance(node, ast.JoinedStr) and node.values and isinstance(node.values[0], ast.Constant) and
                    str(node.values[0].value).endswith("cuda:")):
                continue
            if isinstance(self.parents.get(node), ast.Call) and _call_name(self.parents[node])[1] == "device":
                continue  # torch.device(f"cuda:{...}"): read above
            idx = [v.value for v in node.values if isinstance(v, ast.FormattedValue)]
            if any(self._global_rank_value(a) or self._global_rank_on_some_path(a) for a in idx):
                self.add("device-from-global-rank", "error", node,
                         f"{_src(node)[:70]} names the GPU by the global rank (on the path where the process group "
                         "is initialised): on the second node that index does not exist ('invalid device ordinal') "
                         "or ranks collide", "use the local rank: LOCAL_RANK (or dist.get_node_local_rank())", "D3")
        for node in self.nodes:  # device_map={"": index}: the whole model on that device (Accelerate's big-model API)
            if isinstance(node, ast.Dict) and len(node.keys) == 1 and isinstance(node.keys[0], ast.Constant) \
                    and node.keys[0].value == "" and self._global_rank_value(node.values[0]):
                self.add("device-from-global-rank", "error", node,
                         f"{_src(node)[:70]} puts the whole model on the device numbered by the global rank: on the "
                         "second node that index does not exist ('invalid device ordinal') or ranks share a GPU",
                         "use the local index: device_map={'': accelerator.local_process_index} (or LOCAL_RANK)", "D3")

    def _global_rank_on_some_path(self, node: ast.AST) -> bool:
        """``node`` is a name that some assignment in its function gives the global rank (``local_rank =
        torch.distributed.get_rank()`` in one branch, LOCAL_RANK in the other: sentence-transformers#3373)."""
        if not isinstance(node, ast.Name):
            return False
        scope = self._enclosing_function(node) or self.tree
        return any(isinstance(a, ast.Assign) and any(isinstance(t, ast.Name) and t.id == node.id for t in a.targets)
                   and isinstance(a.value, ast.Call) and _call_name(a.value)[1] in GLOBAL_RANK_CALLS
                   for a in subtree(scope))

    def rule_sampler_set_epoch(self) -> None:
        """D22: a shuffling DistributedSampler in an epoch loop without ``set_epoch``, or with ``set_epoch`` called only
        once (a constant epoch, or a call before the epoch loop of its own function and outside every loop): the
        sampler's docs, "calling the set_epoch() method at the beginning of each epoch before creating the DataLoader
        iterator is necessary to make shuffling work properly across multiple epochs"."""
        set_epochs = [c for c in self._calls() if _call_name(c)[1] == "set_epoch"]
        if set_epochs and not all(self._set_epoch_once(c) for c in set_epochs):
            return
        classes = {"DistributedSampler"}
        for node in self.nodes:  # sampler_cls = RandomSampler if ... else DistributedSampler
            if isinstance(node, ast.Assign) and not isinstance(node.value, ast.Call) and \
                    any(isinstance(n, ast.Name) and n.id == "DistributedSampler" for n in ast.walk(node.value)):
                classes.update(t.id for t in node.targets if isinstance(t, ast.Name))
        samplers = [c for c in self._calls() if _call_name(c)[1] in classes
                    and not any(k.arg == "shuffle" and isinstance(k.value, ast.Constant) and k.value.value is False
                                for k in c.keywords)]
        epoch_loop = any(_epoch_loop(n) for n in self.nodes)
        self.facts.calls_set_epoch, self.facts.epoch_loop = bool(set_epochs), epoch_loop
        if not samplers or self._sampler_handed_on(samplers):
            return
        if not epoch_loop and not set_epochs:
            self.facts.shuffling_sampler = samplers[0].lineno  # the loop may be in another file (cross_rules)
        if epoch_loop and set_epochs:
            self.add("sampler-no-set-epoch", "warning", set_epochs[0],
                     f"{_src(set_epochs[0])[:60]} runs once, before the epoch loop: the sampler's seed is fixed by "
                     "the epoch it was last given, so every epoch sees the same order (silent)",
                     "call sampler.set_epoch(epoch) inside the epoch loop, before iterating the loader", "D22")
        elif epoch_loop:
            self.add("sampler-no-set-epoch", "warning", samplers[0],
                     "DistributedSampler shuffles with a seed fixed by its epoch, and set_epoch is never called: every "
                     "epoch sees the same order (silent)",
                     "call sampler.set_epoch(epoch) at the start of each epoch", "D22")

    def _sampler_handed_on(self, samplers: list[ast.Call]) -> bool:
        """A sampler made here is passed to a function this file does not define (``train(..., sampler=sampler1)``
        imported from a utility module, pytorch/examples' FSDP T5): that function may call its ``set_epoch``, which this
        file cannot see."""
        names = {t.id for n in self.nodes if isinstance(n, ast.Assign) and n.value in samplers
                 for t in n.targets if isinstance(t, ast.Name)}
        imported = {a.asname or a.name.split(".")[0] for n in self.nodes if isinstance(n, (ast.Import, ast.ImportFrom))
                    for a in n.names}
        for c in self._calls():
            recv, name = _call_name(c)
            outside = (isinstance(c.func, ast.Name) and name in imported) or \
                (isinstance(c.func, ast.Attribute) and isinstance(c.func.value, ast.Name) and recv in imported)
            if not outside or name in ("DataLoader", "BatchSampler"):
                continue  # a method of a local object (loader_args.update(...)), or the loader itself
            if any(isinstance(a, ast.Name) and a.id in names for a in [*c.args, *(k.value for k in c.keywords)]):
                return True
        return False

    def _set_epoch_once(self, call: ast.Call) -> bool:
        """``call`` (a ``set_epoch``) runs once per run: its epoch is a constant, or it sits outside every loop in a
        function (or module) whose epoch loop starts after it."""
        if call.args and isinstance(call.args[0], ast.Constant):
            return True
        node: ast.AST | None = call
        while node is not None and not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
            if isinstance(node, (ast.For, ast.While, ast.AsyncFor, ast.ListComp, ast.GeneratorExp)):
                return False
            node = self.parents.get(node)
        scope = node if node is not None else self.tree
        return any(_epoch_loop(n) and n.lineno > call.lineno for n in subtree(scope))

    def rule_rank_sliced_data(self) -> None:
        """D9/D22: each rank slices its own share (uneven lengths) without a sampler or Join."""
        if "Join(" in self.text:
            return
        for node in self.nodes:
            if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Slice):
                parts = [p for p in (node.slice.lower, node.slice.upper, node.slice.step) if p is not None]
                if parts and any(self.taint.is_rank(p) for p in parts) and self._in_loop_scope_with_collective() \
                        and any(self._loop_reaches_collective(loop) for loop in self._iterated(node)):
                    self.add("rank-sliced-data", "warning", node,
                             f"{_src(node)[:60]}: each rank slices its own share; when the data does not divide evenly "
                             "one rank runs fewer steps and the others hang in its missing collective",
                             "use DistributedSampler (same length on every rank), or wrap the loop in "
                             "torch.distributed.algorithms.join.Join", "D22")

    def _iterated(self, node: ast.AST) -> list[ast.For | ast.comprehension]:
        """The loops over the sliced value: a for loop or comprehension whose iterable holds it, the name it is
        assigned to, or a name assigned from an expression holding one of those (``batches = [mine[i:i + b] for i in
        range(0, len(mine), b)]``, then ``for batch in batches``; two steps)."""
        parent = self.parents.get(node)
        names = {t.id for t in getattr(parent, "targets", []) if isinstance(t, ast.Name)} if isinstance(parent, ast.Assign) else set()
        for _step in range(2):
            names |= {t.id for n in self.nodes if isinstance(n, ast.Assign)
                      and any(isinstance(x, ast.Name) and x.id in names for x in ast.walk(n.value))
                      for t in n.targets if isinstance(t, ast.Name)}
        loops: list[ast.For | ast.comprehension] = []
        for loop in self.nodes:
            it = loop.iter if isinstance(loop, (ast.For, ast.comprehension)) else None
            if it is None:
                continue
            if node in set(ast.walk(it)) or any(isinstance(n, ast.Name) and n.id in names for n in ast.walk(it)):
                loops.append(loop)
        return loops

    def _loop_reaches_collective(self, loop: ast.For | ast.comprehension) -> bool:
        """Each pass of ``loop`` reaches a collective (``dist.*``, a local function that makes one, a forward of the
        DistributedDataParallel wrapper) or a ``backward()`` in a file that wraps with DDP (its gradient all-reduce):
        a rank with fewer passes leaves the others waiting.  A loop that only computes (BLIP's and ALBEF's retrieval
        scoring over ``sims_matrix[start:end]``, gathered once after the loop) does not hang however the shares
        differ."""
        body = loop.body if isinstance(loop, ast.For) else [self.parents.get(loop)] if self.parents.get(loop) else []
        ddp = "DistributedDataParallel" in self.text or "DDP(" in self.text
        for stmt in body:
            for c in ast.walk(stmt):
                if isinstance(c, ast.Call) and (self.collective_name(c) or
                                                (ddp and _call_name(c)[1] == "backward")):
                    return True
        return False

    def _in_loop_scope_with_collective(self) -> bool:
        return any(self.collective_name(c) for c in self._calls()) or "DistributedDataParallel" in self.text \
            or "DDP(" in self.text

    def rule_deepspeed_engine(self) -> None:
        """D18: ``loss.backward()`` / ``optimizer.step()`` next to a raw ``deepspeed.initialize`` engine."""
        engines: set[str] = set()
        optims: set[str] = set()
        for node in self.nodes:
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and self._deepspeed_initialize(node.value):
                t = node.targets[0]
                elts = t.elts if isinstance(t, ast.Tuple) else [t]
                if elts and isinstance(elts[0], (ast.Name, ast.Attribute)):
                    engines.add(_src(elts[0]))
                if len(elts) > 1 and isinstance(elts[1], (ast.Name, ast.Attribute)):
                    optims.add(_src(elts[1]))
                for kw in node.value.keywords:
                    if kw.arg == "optimizer" and isinstance(kw.value, ast.Name):
                        optims.add(kw.value.id)
        if not engines:
            return
        for call in self._calls():
            recv, name = _call_name(call)
            if name == "backward" and recv and recv not in engines and not recv.endswith("accelerator") \
                    and recv not in ("torch.autograd", "autograd", "scaler") and not call.args \
                    and not self._outside_deepspeed_branch(call):
                self.add("deepspeed-raw-backward", "error", call,
                         f"{recv}.backward() under a DeepSpeed engine ({', '.join(sorted(engines))}): DeepSpeed 0.19 "
                         "hooks the engine's output and raises 'Direct calls to tensor.backward() are not supported in "
                         "this configuration' under ZeRO stage 0 (the default), or 'Loss scaling is required ... "
                         "backward() was called directly' with fp16 under ZeRO; only ZeRO 1-3 without a loss scaler "
                         "runs it through the engine's hooks",
                         f"{min(engines)}.backward(loss); {min(engines)}.step()", "D18")
            if name == "step" and recv in engines and (gate := self._accumulation_gate(call, recv)) is not None:
                self.add("ds-manual-accumulation", "warning", call,
                         f"{recv}.step() runs only when `{_src(gate.test)}` holds while {recv}.backward() runs on every "
                         "micro-batch: the engine counts micro-steps itself and takes the accumulation boundary from "
                         "gradient_accumulation_steps (engine.is_gradient_accumulation_boundary), so the steps it skips "
                         "are not accumulated as intended (with gradient_accumulation_steps 1 every backward is a "
                         "boundary: ZeRO reduces and clears the gradients each micro-batch)",
                         f"call {recv}.backward(loss) and {recv}.step() on every micro-batch and set "
                         "gradient_accumulation_steps in the DeepSpeed config to the accumulation count",
                         "https://www.deepspeed.ai/getting-started/#training")
            if name == "step" and recv in optims and recv not in engines and not self._outside_deepspeed_branch(call):
                self.add("deepspeed-raw-backward", "error", call,
                         f"{recv}.step() bypasses {min(engines)}.step(): the gradient accumulation boundary, "
                         "gradient clipping, the lr scheduler and the step counter live in the engine's step "
                         "(DeepSpeed runtime/engine.py step -> _take_model_step), so the weights update on every "
                         "micro-batch", f"{min(engines)}.step()", "D18")

    def _outside_deepspeed_branch(self, node: ast.AST) -> bool:
        """``node`` runs on the path where the engine is not DeepSpeed: the ``else`` of ``if train_engine ==
        "deepspeed":`` (wenet's batch_backward), or the body of a test that says it is not DeepSpeed (``!=``, ``not``)."""
        child, p = node, self.parents.get(node)
        while p is not None and not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if isinstance(p, ast.If) and re.search(r"(?i)deepspeed", _src(p.test)):
                negated = bool(re.search(r"!=|\bnot\b", _src(p.test)))
                if (child in p.orelse) != negated:
                    return True
            child, p = p, self.parents.get(p)
        return False

    def _deepspeed_initialize(self, call: ast.Call) -> bool:
        """``call`` is DeepSpeed's ``initialize``: ``deepspeed.initialize`` (or an alias of the module), or a bare
        ``initialize`` imported from deepspeed; a file's own ``def initialize`` (ignite's examples) is not."""
        func = call.func
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name) and func.attr == "initialize":
            return self.import_origins.get(func.value.id, func.value.id) == "deepspeed"
        return isinstance(func, ast.Name) and func.id == "initialize" and \
            self.import_origins.get("initialize", "").startswith("deepspeed")

    def _accumulation_gate(self, step: ast.Call, engine: str) -> ast.If | None:
        """The ``if <counter> % <n> ...:`` that holds ``engine.step()`` inside a loop whose body also calls
        ``engine.backward(...)`` outside that ``if`` (manual gradient accumulation around a DeepSpeed engine)."""
        node: ast.AST | None = self.parents.get(step)
        gate = None
        while node is not None and not isinstance(node, (ast.For, ast.While, ast.AsyncFor, ast.FunctionDef)):
            if isinstance(node, ast.If) and gate is None and any(isinstance(b, ast.BinOp) and isinstance(b.op, ast.Mod)
                                                                 for b in ast.walk(node.test)):
                gate = node
            node = self.parents.get(node)
        if gate is None or not isinstance(node, (ast.For, ast.While, ast.AsyncFor)):
            return None
        gated = {id(c) for c in self._calls(gate)}
        backward = any(_call_name(c) == (engine, "backward") and id(c) not in gated for c in self._calls(node))
        return gate if backward else None

    def _loads_only_under(self, ctx: ast.Call) -> bool:
        """``with FSDP.state_dict_type(model, FULL_STATE_DICT):`` whose body only loads (``optim_state_dict_to_load``,
        ``load_state_dict``): nothing is gathered there, the config's rank0_only/offload_to_cpu concern
        ``state_dict()`` (mmengine's FSDPStrategy converts a loaded optimizer state this way)."""
        w = self.parents.get(ctx)
        if not isinstance(w, ast.withitem):
            w = self.parents.get(w) if w is not None else None
        block = self.parents.get(w) if isinstance(w, ast.withitem) else w
        if not isinstance(block, (ast.With, ast.AsyncWith)):
            return False
        names = {_call_name(n)[1] for st in block.body for n in subtree(st) if isinstance(n, ast.Call)}
        return bool(names & {"optim_state_dict_to_load", "load_state_dict"}) and not (
            names & {"state_dict", "optim_state_dict", "full_optim_state_dict", "get_state_dict"})

    def rule_ddp_fsdp_options(self) -> None:
        """D8, D10, D12, D14, D15: DDP/FSDP constructor options."""
        calls = self._calls()
        fsdp_calls = [c for c in calls if _call_name(c)[1] in ("FullyShardedDataParallel", "FSDP")]
        fully_shard = [c for c in calls if _call_name(c)[1] == "fully_shard"]
        for c in calls:
            _recv, name = _call_name(c)
            kws = {k.arg: k.value for k in c.keywords if k.arg}
            if name in ("DistributedDataParallel", "DDP") or "DistributedDataParallelKwargs" in name:
                v = kws.get("find_unused_parameters")
                if isinstance(v, ast.Constant) and v.value is True:
                    self.add("find-unused-parameters", "info", c,
                             "find_unused_parameters=True walks the autograd graph every step (slower); needed only "
                             "when some parameters really get no gradient",
                             "keep it only if DDP reports unused parameters without it", "D8")
            if name == "MixedPrecision" and not any(k.arg is None for k in c.keywords):
                # D14: param and reduce dtypes decided together.  FSDP's MixedPrecision: reduce_dtype None with a
                # param_dtype "takes on the param_dtype value, still running gradient reduction in low precision";
                # buffer_dtype None keeps buffers as they are (not cast), FSDP's documented default, so a config
                # that sets param and reduce dtypes and leaves buffers alone is not reported (LlamaGen's FSDP trainer)
                missing = [k for k in ("param_dtype", "reduce_dtype") if k not in kws]
                if len(missing) == 1:
                    self.add("fsdp-partial-mixed-precision", "warning", c,
                             f"MixedPrecision sets {'reduce_dtype' if missing[0] == 'param_dtype' else 'param_dtype'} "
                             f"but not {missing[0]}: "
                             + ("gradients are reduced in the low parameter dtype (reduce_dtype takes param_dtype)"
                                if missing[0] == "reduce_dtype" else "parameters stay fp32 while gradients are "
                                "reduced in the dtype set"),
                             "set param_dtype and reduce_dtype together (bf16 params with fp32 reduction is the safe "
                             "default), and buffer_dtype where buffers must follow", "D14")
            # an option left out defaults to False, one set at run time may be False; a literal False is the author's
            # choice (accelerate's peak-memory example gathers on every rank on purpose) and is not flagged
            if name == "FullStateDictConfig" and any(not isinstance(kws.get(k), ast.Constant) or kws[k].value is None
                                                     for k in ("rank0_only", "offload_to_cpu")):
                self.add("fsdp-full-state-dict-all-ranks", "warning", c,
                         "a full state dict without rank0_only=True, offload_to_cpu=True is gathered on every rank's "
                         "GPU: N copies of the whole model (OOM)",
                         "FullStateDictConfig(offload_to_cpu=True, rank0_only=True)", "D15")
            if name == "StateDictOptions":
                fsd = kws.get("full_state_dict")
                # broadcast_from_rank0=True makes the options a load's (rank 0 holds the full state dict and
                # broadcasts it; torch.distributed.checkpoint.state_dict.StateDictOptions): nothing is gathered
                loads = isinstance(kws.get("broadcast_from_rank0"), ast.Constant) and kws["broadcast_from_rank0"].value
                if isinstance(fsd, ast.Constant) and fsd.value is True and not loads and not (
                        isinstance(kws.get("cpu_offload"), ast.Constant) and kws["cpu_offload"].value is True):
                    self.add("fsdp-full-state-dict-all-ranks", "warning", c,
                             "StateDictOptions(full_state_dict=True) without cpu_offload=True gathers the whole model "
                             "on every GPU", "add cpu_offload=True", "D15")
            if name == "state_dict_type" and any("FULL_STATE_DICT" in _src(a) for a in c.args) and len(c.args) < 3 \
                    and "state_dict_config" not in kws and not self._loads_only_under(c):
                self.add("fsdp-full-state-dict-all-ranks", "warning", c,
                         "FULL_STATE_DICT with the default config gathers the whole model on every rank's GPU",
                         "pass FullStateDictConfig(offload_to_cpu=True, rank0_only=True)", "D15")
        # D12 is a cost, not an error: one unit gathers the whole model at once, which fits or not depending on the
        # model's size and the GPU's memory (fully_shard docs: "User should apply fully_shard in a bottom-up manner",
        # https://docs.pytorch.org/docs/stable/distributed.fsdp.fully_shard.html).  A model already split by tensor
        # parallelism (parallelize_module) wrapped whole over the data-parallel mesh is the documented 2-D recipe
        # (https://docs.pytorch.org/tutorials/intermediate/TP_tutorial.html): no finding.
        tensor_parallel = bool(re.search(r"\bparallelize_module\(", self.text))
        if len(fsdp_calls) == 1 and not self._in_loop(fsdp_calls[0]) and not tensor_parallel and \
                not re.search(r"auto_wrap_policy|enable_wrap|\bwrap\(", self.text):
            self.add("fsdp-no-wrap-policy", "info", fsdp_calls[0],
                     "FSDP without auto_wrap_policy makes the whole model one unit: it all-gathers every parameter "
                     "at once (little memory saved; fine while the whole model fits on one GPU)",
                     "auto_wrap_policy=functools.partial(transformer_auto_wrap_policy, transformer_layer_cls={Block})",
                     "D12")
        if len(fully_shard) == 1 and not self._in_loop(fully_shard[0]) and not tensor_parallel:
            self.add("fsdp-no-wrap-policy", "info", fully_shard[0],
                     "fully_shard is applied to the root only: one unit, all parameters gathered at once (fine while "
                     "the whole model fits on one GPU)",
                     "call fully_shard(block) for each transformer block first, then on the root", "D12")
        if re.search(r"BatchNorm[123]d\(", self.text) and re.search(r"DistributedDataParallel|\bDDP\(", self.text) and \
                "SyncBatchNorm" not in self.text:
            line = next((i for i, ln in enumerate(self.text.splitlines(), 1) if re.search(r"BatchNorm[123]d\(", ln)), 0)
            self.add("batchnorm-without-syncbn", "info", line,
                     "BatchNorm under DDP computes its statistics per rank (buffers are not all-reduced)",
                     "model = nn.SyncBatchNorm.convert_sync_batchnorm(model) before DDP, if the per-GPU batch is small",
                     "D10")

    def _function_only_called_gated(self, fn: ast.AST, depth: int = 0) -> bool:
        """Every call of ``fn`` in this file is rank-gated: under a rank branch, after a rank-dependent early exit,
        or inside a function that is itself only called gated (followed three levels: ``upload_to_s3`` called by
        ``_save_snapshot``, called under ``if local_rank == 0``)."""
        name = getattr(fn, "name", None)
        sites = [c for c in self._calls() if _call_name(c)[1] == name and _call_name(c)[0] in ("", "self", "cls")]
        sites += self._callback_sites(name)
        if not sites:
            return False
        for c in sites:
            if self._rank_gate(c) is not None or self._after_rank_exit(c):
                continue
            caller = self._enclosing_function(c)
            if depth < 3 and caller is not None and caller is not fn and \
                    self._function_only_called_gated(caller, depth + 1):
                continue
            return False
        return True

    def _callback_sites(self, name: str | None) -> list[ast.Call]:
        """The calls that hand the local function ``name`` to another function as a value (``save_on_epoch_end(args,
        save_func, ...)``): the callee runs it, so it runs where that call runs.  Process and thread starters
        (``mp.spawn(worker)``, ``Process(target=...)``, executors) are not such sites: each started process is a rank of
        its own.  A hook given to Accelerate's ``register_save_state_pre_hook`` / ``register_load_state_pre_hook`` runs
        inside ``save_state`` / ``load_state`` ("registers a pre hook to be run before save_state is called"), so its
        sites are those calls (the diffusers scripts' ``save_model_hook``, saved under ``is_main_process``)."""
        if not name:
            return []
        if self._callbacks is None:  # name -> the calls that pass it as a value, built once per file
            self._callbacks = {}
            runs_in = {"register_save_state_pre_hook": "save_state", "register_load_state_pre_hook": "load_state"}
            for c in self._calls():
                if _call_name(c)[1] in _STARTERS:
                    continue
                sites = [c]
                if _call_name(c)[1] in runs_in:
                    sites = [x for x in self._calls() if _call_name(x)[1] == runs_in[_call_name(c)[1]]] or sites
                for a in {a.id for a in [*c.args, *(k.value for k in c.keywords)] if isinstance(a, ast.Name)}:
                    self._callbacks.setdefault(a, []).extend(sites)
        return self._callbacks.get(name, [])

    def _in_memory(self, node: ast.AST, call: ast.Call) -> bool:
        """``node`` names an in-memory buffer (``io.BytesIO()`` / ``io.StringIO()``) assigned in the function of
        ``call``: each process writes its own memory, no shared file (torch.save accepts any file-like object,
        https://docs.pytorch.org/docs/stable/generated/torch.save.html)."""
        if isinstance(node, ast.Call):
            return _call_name(node)[1] in ("BytesIO", "StringIO")
        if not isinstance(node, ast.Name):
            return False
        scope = self._enclosing_function(call) or self.tree
        return any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == node.id for t in n.targets)
                   and isinstance(n.value, ast.Call) and _call_name(n.value)[1] in ("BytesIO", "StringIO")
                   for n in subtree(scope))

    def _truncate_only(self, call: ast.Call) -> bool:
        """``call`` is ``open(path, "w")`` in a ``with`` whose body writes nothing (``pass``, a docstring): it only
        truncates the file, so N ranks doing it leave the same empty file (open(2) with O_TRUNC is idempotent); no
        rank's content can be lost or interleaved, unlike a write (https://man7.org/linux/man-pages/man2/open.2.html,
        O_TRUNC)."""
        item = self.parents.get(call)
        stmt = self.parents.get(item) if isinstance(item, ast.withitem) else None
        return isinstance(stmt, (ast.With, ast.AsyncWith)) and "a" not in str(getattr(call.args[1], "value", "a")) \
            and all(isinstance(b, ast.Pass) or isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant)
                    for b in stmt.body)

    def _preceded_by_exit(self, node: ast.AST, test: Callable[[ast.expr], bool],
                          exits: tuple[type, ...] = (ast.Return, ast.Continue, ast.Break)) -> bool:
        """An ``if`` whose test satisfies ``test`` and whose body leaves (one of ``exits``) precedes ``node`` in its
        block or an enclosing one, up to and including its function's body."""
        child, p = node, self.parents.get(node)
        while p is not None:
            for fld in ("body", "orelse"):
                block = getattr(p, fld, None)
                if isinstance(block, list) and child in block:
                    for stmt in block[:block.index(child)]:
                        if isinstance(stmt, ast.If) and test(stmt.test) and \
                                any(isinstance(s, exits) for s in stmt.body):
                            return True
            if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)):
                break
            child, p = p, self.parents.get(p)
        return False

    def _after_rank_exit(self, node: ast.AST) -> bool:
        """True when a rank-dependent early return/continue/break precedes ``node`` in an enclosing block."""
        return self._preceded_by_exit(node, self.taint.rank_test)

    def _under_rank_only_object(self, node: ast.AST) -> bool:
        """``node`` sits under ``if x is not None:`` (or ``if x:``) where ``x`` is made on some ranks only
        (:meth:`_rank_only_objects`): ``ema = None`` then ``if is_main_process(): ema = EMAModel(...)``, so only that
        rank enters the branch (lerobot's EMA push)."""
        fn = self._enclosing_function(node)
        made = self._rank_only_objects()
        p = self.parents.get(node)
        while p is not None and p is not (fn or self.tree):
            if isinstance(p, ast.If):
                t = p.test
                name = t.id if isinstance(t, ast.Name) else (
                    t.left.id if isinstance(t, ast.Compare) and isinstance(t.left, ast.Name) and len(t.ops) == 1 and
                    isinstance(t.ops[0], ast.IsNot) and isinstance(t.comparators[0], ast.Constant) and
                    t.comparators[0].value is None else None)
                if name and (fn, name) in made:
                    return True
            p = self.parents.get(p)
        return False

    def _write_kind(self, call: ast.Call) -> str:
        """What ``call`` writes: ``"tracker"`` (starts an experiment-tracker run, :data:`TRACKER_RUNS`), ``"file"``
        (``torch.save``, ``OmegaConf.save``, ``json.dump``, ``open(p, "w"/"a")``, :data:`WRITE_CALLS`, ``shutil``'s
        copies), ``"delete"``
        (:data:`DELETES`, not of a temporary path) or ``""``."""
        recv, name = _call_name(call)
        if (recv, name) in TRACKER_RUNS and not any(k.arg == "group" for k in call.keywords):
            return "tracker"
        if name == "SummaryWriter" and not re.search(r"rank|node|proc", _src(call)) and \
                self._logged_beyond_main(call):
            # TensorBoard's SummaryWriter opens an event file of its own (events.out.tfevents.<time>.<host>.<pid>) in
            # log_dir: one per process, read by TensorBoard as one run with every rank's curves interleaved (a log_dir
            # named by the rank is a run per rank: not this)
            return "tracker"
        if (recv, name) in DELETES or name in ("remove", "rmtree", "unlink", "delete") and call.args and \
                re.search(r"(?:^|[._])(?:file_client|backend|storage|fs|filesystem)$", recv):
            # a storage client's remove (mmengine's FileClient / get_file_backend: the same path on every rank)
            return "" if call.args and re.search(r"te?mp", _src(call.args[0]), re.I) else "delete"
        if name == "save_model" and (recv in self.module_aliases or recv.lower().endswith("trainer") or
                                     not recv and name in self.module_aliases and name not in self.functions):
            # a project module's save_model, called through its module or imported by name (its body, not linted
            # here, decides who writes: MAE's misc.save_model calls save_on_master, wenet's train_utils.save_model
            # tests the rank) or transformers' Trainer.save_model, which every process must call and which
            # writes from the main process only (Trainer.save_model: "Will only save from the main process")
            return ""
        if name == "save_weights" and recv and call.args and _PATHLIKE.search(_src(call.args[0])):
            return "file"  # model.save_weights(ckpt_file, ...) (Keras, sd-scripts' LoRA network); a bridge's
            # save_weights(models, dir) of sharded weights is a collective save, not this
        if name == "save_pretrained" and self._shards_models:
            # a model sharded by FSDP/DeepSpeed through Accelerate: save_pretrained gathers the shards (DTensor
            # full_tensor, a collective), so every rank calls it (accelerate's nd_parallel example)
            return ""
        if name == "push_to_hub" and re.search(r"(?i)trainer$", recv):
            return ""  # transformers' Trainer.push_to_hub returns on every process but the main one
        if name == "save" and isinstance(call.func, ast.Attribute) and call.args and self._scripted(call.func.value):
            return "file"  # ScriptModule.save(f): wenet's torch.jit.script(model).save(init.zip) on every rank
        if name in COPIES and (recv == "shutil" or not recv and self.import_origins.get(name, "").startswith("shutil")):
            return "file"  # shutil.copyfile(src, dst): icefall copied the best checkpoint on every rank
        if (recv, name) in FILE_SAVES or name in WRITE_CALLS or (recv == "json" and name == "dump") or \
                (not recv and name == "open" and len(call.args) > 1 and isinstance(call.args[1], ast.Constant)
                 and isinstance(call.args[1].value, str) and any(m in call.args[1].value for m in "wa")):
            return "file"
        return ""

    def _scripted(self, expr: ast.AST) -> bool:
        """``expr`` is a TorchScript module: ``torch.jit.script(m)`` / ``trace`` / ``freeze``, or a name bound to
        one (https://docs.pytorch.org/docs/stable/generated/torch.jit.ScriptModule.html#torch.jit.ScriptModule.save)."""
        def made(v: ast.AST) -> bool:
            return isinstance(v, ast.Call) and _call_name(v)[1] in ("script", "trace", "freeze") and \
                "jit" in _call_name(v)[0]
        if made(expr):
            return True
        if self._scripted_names is None:  # computed once per file: _write_kind asks for every save call
            self._scripted_names = {t.id for n in self.nodes if isinstance(n, ast.Assign) and made(n.value)
                                    for t in n.targets if isinstance(t, ast.Name)}
        return isinstance(expr, ast.Name) and expr.id in self._scripted_names

    def _before_own_spawn(self, node: ast.AST) -> bool:
        """``node`` runs in the launching process: its function (not itself a spawned worker) starts the workers
        further down with ``mp.spawn`` / ``start_processes`` (stylegan3's ``launch_training`` writes the run's options,
        then ``torch.multiprocessing.spawn(fn=subprocess_fn, ...)``): one process runs it, before any rank exists."""
        fn = self._enclosing_function(node)
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) or fn.name in self.spawned_funcs:
            return False
        if id(fn) not in self._spawn_lines:  # the lines of the function's process starts, read once per function
            self._spawn_lines[id(fn)] = [
                c.lineno for c in subtree(fn) if isinstance(c, ast.Call) and
                _call_name(c)[1] in ("spawn", "start_processes") and (
                    "multiprocessing" in _call_name(c)[0] or
                    "multiprocessing" in self.import_origins.get(_call_name(c)[0].split(".")[0], ""))]
        return any(line > getattr(node, "lineno", 0) for line in self._spawn_lines[id(fn)])

    def _single_process_only(self, node: ast.AST) -> bool:
        """``node`` runs only on a path the file forbids in a distributed run: yolov5's ``if LOCAL_RANK != -1: assert
        not opt.evolve`` makes everything under ``opt.evolve`` (``else`` of ``if not opt.evolve``) a one-process path.
        The flags are the ``assert not <flag>`` statements under an ``if`` whose test reads a rank or the world size."""
        if self._single_flags is None:
            flags: set[str] = set()
            for a in self.nodes:
                if isinstance(a, ast.Assert) and isinstance(a.test, ast.UnaryOp) and isinstance(a.test.op, ast.Not):
                    p = self.parents.get(a)
                    while p is not None and not isinstance(p, ast.If):
                        p = self.parents.get(p)
                    if p is not None and re.search(r"RANK|WORLD_SIZE|rank|world_size|distributed", _src(p.test)):
                        flags.add(_src(a.test.operand))
            self._single_flags = flags
        if not self._single_flags:
            return False
        child, p = node, self.parents.get(node)
        while p is not None:
            if isinstance(p, ast.If):
                test = p.test
                if child in p.body and _src(test) in self._single_flags or child in p.orelse and isinstance(
                        test, ast.UnaryOp) and isinstance(test.op, ast.Not) and _src(test.operand) in self._single_flags:
                    return True
            child, p = p, self.parents.get(p)
        return False

    def _functions_with_collectives(self) -> set[ast.AST]:
        """The functions that call a collective outside any rank gate (``dcp.save``, ``all_reduce``...): every rank
        must call such a function (a collective waits for all of them), so a write in its body with no gate of its
        own runs on every rank too (NVIDIA-NeMo/RL#3504: ``tokenizer.save_pretrained`` beside ``dcp.save``)."""
        out: set[ast.AST] = set()
        for call in self._calls():
            fn = self._enclosing_function(call)
            if fn is None or fn in out or self._rank_gate(call) is not None or self._after_rank_exit(call):
                continue
            if _call_name(call)[1] in STRONG_COLLECTIVES | {"save", "load"} and self.collective_name(call):
                out.add(fn)
        return out

    def _gates_its_writes(self) -> bool:
        """The file rank-gates a write of its own (``if is_main_process(): OmegaConf.save(...)``, ``if not
        is_main_process(): return`` before a save, ``if comm.is_main_process(): self.save_checkpoint(...)``): it runs
        on every rank of a distributed job and its author gates I/O there, even when the process group and the DDP
        wrapper are set up in another file."""
        return bool(self._gating_functions())

    def _gating_functions(self) -> set[ast.AST | None]:
        """The functions (``None``: module level) that hold a rank-gated write (:meth:`_gates_its_writes`)."""
        if self._gating is None:
            self._gating = {self._enclosing_function(c) for c in self._calls()
                            if (self._write_kind(c) or INHERITED_SAVE.match(_call_name(c)[1]))
                            and (self._rank_gate(c) is not None or self._after_rank_exit(c))}
        return self._gating

    def _inherited_saves_every_rank(self) -> None:
        """``self.save_best_checkpoint()`` on every rank while the same file gates ``self.save_checkpoint(epoch)``
        under ``comm.is_main_process()``: both are checkpoint writers of a base class that is not linted (so their
        bodies cannot be read), and the file's own gate on one says they write a shared file; the ungated one is
        written by every process at once (kakaobrain/scrl#5: a corrupt checkpoint_best.pth).  Collective savers
        (DeepSpeed's ``save_checkpoint``, Accelerate's ``save_state``: every rank must call them) are methods of an
        engine, not of ``self``, and are skipped: only ``self.<name>()`` with a name the file does not define."""
        sites = [c for c in self._calls() if _call_name(c)[0] == "self" and INHERITED_SAVE.match(_call_name(c)[1])
                 and _call_name(c)[1] not in self.functions]
        gated = {_call_name(c)[1] for c in sites if self._rank_gate(c) is not None or self._after_rank_exit(c)}
        if not gated:
            return
        for call in sites:
            name = _call_name(call)[1]
            if name in gated or self._rank_gate(call) is not None or self._after_rank_exit(call):
                continue
            fn = self._enclosing_function(call)
            if fn is not None and self._function_only_called_gated(fn):
                continue
            self.add("write-on-every-rank", "warning", call,
                     f"self.{name}() runs on every rank, while this file calls self.{sorted(gated)[0]}() only under a "
                     "rank gate: every process writes the same checkpoint file at once (a corrupt or truncated "
                     "checkpoint)",
                     f"gate it like the other save: if <main process>: self.{name}()", "D23")

    def rule_writes_on_every_rank(self) -> None:
        """D23: a file written by every rank to the same path (a race), with no rank gate.

        Runs in a file that sets up the distributed job itself (a Lightning Trainer given a distributed strategy, or
        transformers' TrainingArguments given a DeepSpeed config, included), or that rank-gates another write of its own (:meth:`_gates_its_writes`: the same file then leaves
        one write ungated)."""
        collective_fns = self._functions_with_collectives()
        defer = not re.search(r"init_process_group|DistributedDataParallel|deepspeed\.initialize|Accelerator\(|"
                              r"FullyShardedDataParallel|DDPStrategy|FSDPStrategy|DeepSpeedStrategy|"
                              r"strategy\s*=\s*['\"](?:ddp|fsdp|deepspeed)|\bdeepspeed\s*=\s*[\w'\"]", self.text) \
            and not self._gates_its_writes() and not collective_fns
        # (a Lightning Trainer given a distributed strategy runs the module's hooks on every process); a file that
        # shows nothing distributed itself keeps its findings for lint_texts, which releases them when a linted
        # launch starts it on several processes or another linted file sets up data parallelism (PyFacts.deferred)
        if not defer:
            self._inherited_saves_every_rank()
        hooks = self._trainer_callback_hooks()
        for call in self._calls():
            recv, name = _call_name(call)
            kind = self._write_kind(call)
            tracker = kind == "tracker"
            if not kind:
                continue
            if any(k.arg in ("is_main_process", "save_function") for k in call.keywords) or any(
                    k.arg in ("only_rank0", "rank0_only", "main_process_only") and isinstance(k.value, ast.Constant)
                    and k.value.value is True for k in call.keywords):
                continue  # the callee is told who writes (ColossalAI's strategy.save_model(..., only_rank0=True))
            path_args = _written_paths(call)
            if any(self.taint.is_rank(a) or self._rank_in_name(a, call)
                   for a in [*path_args, *(k.value for k in call.keywords if k.arg in ("f", "file"))]):
                continue  # a per-rank file name
            if path_args and isinstance(path_args[0], ast.Name) and self._opened_per_rank(path_args[0], call):
                continue  # torch.save(data, f) into `with open(f"{name}.{rankstr()}.pth", "wb") as f`
            if name == "dump" and call.args and _CONFIG_NAME.fullmatch(_src(call.args[0])) or \
                    name == "open" and self._config_dump_only(call):
                continue  # the run's configuration dumped: the same bytes from every rank, the last leaves the same file
            if path_args and self._in_memory(path_args[0], call):
                continue  # torch.save(obj, io.BytesIO()): this process's memory, not a shared file
            if name == "open" and self._truncate_only(call):
                continue  # `with open(log, "w"): pass` empties the file: every rank leaves the same empty file
            if self._rank_gate(call) is not None or self._after_rank_exit(call) or self._single_process_only(call) \
                    or self._under_rank_only_object(call) or self._before_own_spawn(call):
                continue
            fn = self._enclosing_function(call)
            hook = fn is not None and fn in hooks
            if fn is not None and not hook and fn not in self._gating_functions() and fn not in collective_fns and \
                    not any(_call_name(c)[1] == getattr(fn, "name", "") for c in self._calls()) and \
                    not self._callback_sites(getattr(fn, "name", None)) and not self._sets_up_job(fn):
                continue  # a library function never called here: its callers decide (unless it gates other writes
                # or calls a collective itself, which every rank must reach, or sets up the distributed job itself:
                # a trainer's __init__ that builds its Accelerator runs on every process)
            if fn is not None and (self._function_only_called_gated(fn) or getattr(fn, "name", "") in self.spawned_funcs
                                   and False):
                continue
            if fn is not None and getattr(fn, "name", "").startswith(("_save_on_master", "save_on_master")):
                continue
            if tracker:
                self.add("write-on-every-rank", "warning", call,
                         f"{_src(call)[:60]} runs on every rank: each process starts its own tracker run (N runs "
                         "for one job, each logging its own rank's values)",
                         f"call {recv}.{name} on rank 0 only, after init_process_group (or pass group= to log one run "
                         "per process on purpose: https://docs.wandb.ai/guides/track/log/distributed-training/)", "D23",
                         deferred=defer and not hook)
                continue
            if kind == "delete":
                self.add("write-on-every-rank", "warning", call,
                         f"{_src(call)[:60]} runs on every rank: N processes remove the same path at once "
                         "(FileNotFoundError on all but the first, or the wrong checkpoints left)",
                         "gate it: if <main process>: ... (then a barrier on every rank before the next save)", "D23",
                         deferred=defer and not hook)
                continue
            self.add("write-on-every-rank", "warning", call,
                     f"{_src(call)[:60]} runs on every rank: N processes write the same file at once (corrupt or "
                     "truncated checkpoint, garbled log)",
                     "gate the write: if rank == 0: ... (and dist.barrier() on every rank before others read it)", "D23",
                     deferred=defer and not hook)

    def _trainer_callback_hooks(self) -> set[ast.AST]:
        """The ``on_*`` methods of the file's ``transformers.TrainerCallback`` subclasses: the Trainer calls them on
        every process, and its own callbacks gate on ``state.is_world_process_zero`` / ``is_local_process_zero``
        (https://huggingface.co/docs/transformers/en/main_classes/callback: "if state.is_local_process_zero:
        print(logs)"), so a write in one is every rank's (hiyouga/ChatGLM-Efficient-Tuning's trainer_log.jsonl)."""
        return {m for c in self.nodes if isinstance(c, ast.ClassDef) and any(_src(b).endswith("TrainerCallback")
                                                                            for b in c.bases)
                for m in c.body if isinstance(m, ast.FunctionDef) and m.name.startswith("on_")}

    def _logged_beyond_main(self, call: ast.Call) -> bool:
        """The writer ``call`` makes (``writer = SummaryWriter(...)``) is logged to outside a gate on the one main
        process: with no gate, or under a per-node one (``is_local_main_process``, ``local_rank == 0``).  A writer
        made everywhere and used on rank 0 only leaves the others' event files empty."""
        target = self.parents.get(call)
        if not (isinstance(target, ast.Assign) and len(target.targets) == 1):
            return True
        held = _src(target.targets[0])
        uses = [c for c in self._calls() if isinstance(c.func, ast.Attribute) and _src(c.func.value) == held
                and c.func.attr.startswith("add_")]
        for use in uses:
            gate = self._rank_gate(use)
            if gate is None or re.search(r"(?i)local", _src(getattr(gate, "test", gate))):
                return True
        return not uses

    @staticmethod
    def _sets_up_job(fn: ast.AST) -> bool:
        """``fn`` sets up the distributed job (builds an ``Accelerator``, calls ``init_process_group``,
        ``deepspeed.initialize``, wraps in DDP): every process runs it, whoever calls it."""
        return bool(re.search(r"\bAccelerator\(|init_process_group\(|deepspeed\.initialize\(|"
                              r"DistributedDataParallel\(", ast.unparse(fn)))

    def _config_dump_only(self, call: ast.Call) -> bool:
        """``with open(path, "w") as f: yaml.dump(args, f)`` (the block only dumps the run's configuration), or
        ``yaml.dump(config, open(path, "w"))`` (the file opened as the dump's own argument)."""
        dumping = self.parents.get(call)
        if isinstance(dumping, ast.Call) and _call_name(dumping)[1] == "dump":
            return bool(dumping.args) and bool(_CONFIG_NAME.fullmatch(_src(dumping.args[0])))
        w = self.parents.get(dumping)
        if not isinstance(w, ast.With) or not w.body:
            return False
        return all(isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and _call_name(st.value)[1] == "dump"
                   and st.value.args and _CONFIG_NAME.fullmatch(_src(st.value.args[0])) for st in w.body)

    def _opened_per_rank(self, handle: ast.Name, at: ast.AST) -> bool:
        """``handle`` is the ``as`` target of a ``with ...open(path, ...)`` around ``at`` whose path is per rank."""
        p = self.parents.get(at)
        while p is not None and not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if isinstance(p, (ast.With, ast.AsyncWith)):
                for item in p.items:
                    if isinstance(item.optional_vars, ast.Name) and item.optional_vars.id == handle.id and \
                            isinstance(item.context_expr, ast.Call) and item.context_expr.args:
                        return self._rank_in_name(item.context_expr.args[0], at)
            p = self.parents.get(p)
        return False

    def _branch_tests(self, node: ast.AST) -> set[tuple[str, bool]]:
        """The ``if`` tests that hold ``node`` in its function, as (test source, in the body), for matching two
        statements on the same path (boltz: the temporary checkpoint is named and removed under the same flag)."""
        out, child, p = set(), node, self.parents.get(node)
        while p is not None and not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
            if isinstance(p, ast.If) and child is not p.test:
                out.add((_src(p.test), any(child is st for st in p.body)))
            child, p = p, self.parents.get(p)
        return out

    def _rank_in_name(self, arg: ast.AST, at: ast.AST) -> bool:
        """The path is an f-string with a rank in it (``f"optim_{step}_rank{rank:d}.pt"``), or with a value unique to the
        process (``uuid4()``, ``os.getpid()``: icefall's ``f"{exp_dir}/batch-{uuid4()}.pt"``; ``str(datetime.now())``,
        down to the microsecond; a draw of Python's ``random`` or ``secrets`` where the file seeds neither), directly or
        through the last assignments (before ``at``, on ``at``'s own branch where there are several) of the names it
        is built from, a few deep: each rank has its own file."""
        fn = self._enclosing_function(at) or self.tree
        todo, seen = [arg], set()
        while todo and len(seen) < 8:  # through a few assignments: save_file = join(dir, basename); basename = f"..."
            value = todo.pop()
            if any(isinstance(f, ast.FormattedValue) and re.search(r"(?i)rank|\buuid\d?\b|uuid[14]\(|getpid\(",
                                                                   _src(f.value)) for f in ast.walk(value)):
                return True
            if any(isinstance(c, ast.Call) and _call_name(c)[1] == "now" and not re.search(r"strftime|date\(\)",
                                                                                          _src(value))
                   for c in ast.walk(value)) and re.search(r"\bstr\(|\.isoformat\(", _src(value)):
                return True  # str(datetime.now()): microseconds, one name per process (dlrm's profile files)
            if any(isinstance(c, ast.Call) and (_call_name(c)[0] in ("random", "secrets") or
                                                _call_name(c)[1] in ("token_hex", "token_urlsafe"))
                   for c in ast.walk(value)) and not re.search(r"seed_everything|random\.seed\(|set_seed\(", self.text):
                return True  # random.choices(...) from Python's unseeded generator: a name per process (boltz's
                # temporary checkpoint); seeded alike on every rank, the ranks draw the same name
            for name in {n.id for n in ast.walk(value) if isinstance(n, ast.Name)} - seen:
                seen.add(name)
                sets = [n for n in subtree(fn) if isinstance(n, ast.Assign) and getattr(n, "lineno", 0) < at.lineno
                        and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]
                tests = self._branch_tests(at)  # on the path `at` is on: `if flag:` made it, `if flag:` reads it
                best = max((len(self._branch_tests(n) & tests) for n in sets), default=0)
                same = [n for n in sets if len(self._branch_tests(n) & tests) == best] if best else sets
                todo.extend(st.value for st in same[-1:])
        return False

    def rule_ddp_wrapper_attribute(self) -> None:
        """An attribute stored on the model before ``DistributedDataParallel`` wrapped it, read through the wrapper:
        ``nn.Module.__getattr__`` finds only the wrapper's own parameters, buffers and submodules, so
        ``AttributeError: 'DistributedDataParallel' object has no attribute 'names'`` (helpers.lint.wrappers).
        Also a Hugging Face model returned by ``accelerator.prepare`` (:func:`helpers.lint.wrappers.prepared_models`):
        any attribute DDP itself lacks (``unet.config``, ``model.generate``), read directly or by peft's
        ``get_peft_model_state_dict``, fails under several processes."""
        self._prepared_model_attributes()
        self._prepared_self_models()
        self._wrapper_type_tests()
        flagged = self._ddp_foreign_attributes()
        if not self.wrappers.w.stored:
            return
        for node in self.nodes:
            if not isinstance(node, ast.Attribute) or id(node) in flagged:
                continue
            stored = self.wrappers.wrapper_attribute(node)
            if stored:
                self.add("ddp-wrapper-attribute", "error", node,
                         f"{_src(node)} reads '{node.attr}' through the DistributedDataParallel wrapper, but it was set "
                         f"on the model itself (line {stored}) before wrapping: 'AttributeError: "
                         f"'DistributedDataParallel' object has no attribute '{node.attr}'' (under DDP only)",
                         f"{_src(node.value)}.module.{node.attr} (or keep a reference to the unwrapped model)",
                         "https://docs.pytorch.org/docs/stable/generated/torch.nn.Module.html")

    def _wrapper_type_tests(self) -> None:
        """``type(model) in [CLIP, CustomTextCLIP]`` / ``isinstance(model, CLIP)`` on a value that holds the
        DistributedDataParallel wrapper (:class:`helpers.lint.wrappers.WrapperFlow`, across the file's calls and the
        linted files that pass it in): the wrapper's type is DistributedDataParallel, so the test is False under DDP
        and the model's own branch never runs (open_clip's is_clip, mlfoundations/open_clip: the tuple output went
        unconverted).  Not a test against a wrapper or module class (DDP, FSDP, nn.Module)."""
        if not self.wrappers.w.params and not self.wrappers.w.assigns:
            return
        for node in self.nodes:
            subject = classes = None
            if isinstance(node, ast.Call) and _call_name(node) == ("", "isinstance") and len(node.args) == 2:
                subject, classes = node.args
            elif isinstance(node, ast.Compare) and len(node.ops) == 1 and isinstance(
                    node.ops[0], (ast.In, ast.Eq, ast.Is)) and isinstance(node.left, ast.Call) and \
                    _call_name(node.left) == ("", "type") and len(node.left.args) == 1:
                subject, classes = node.left.args[0], node.comparators[0]
            if not isinstance(subject, ast.Name) or not self.wrappers.state(subject, node)[0]:
                continue
            names = [_src(c) for c in (classes.elts if isinstance(classes, (ast.List, ast.Tuple, ast.Set))
                                       else [classes])]
            if not names or any(re.search(r"DistributedDataParallel|DDP|FSDP|FullyShard|Module|Parallel", n)
                                for n in names):
                continue
            self.add("ddp-wrapper-attribute", "error", node,
                     f"{_src(node)[:70]} tests the type of {subject.id}, which holds the DistributedDataParallel "
                     "wrapper here: its type is DistributedDataParallel, so the test is False under DDP and the "
                     f"{names[0]} branch never runs", f"test the wrapped model: {subject.id}.module (or unwrap it "
                     "first)", "https://docs.pytorch.org/docs/stable/generated/torch.nn.parallel."
                     "DistributedDataParallel.html")
            return

    def rule_rank_gated_model_change(self) -> None:
        """A module replaced on a model under a rank gate (``if accelerator.is_main_process: unet.conv_in =
        nn.Conv2d(8, ...)``) before the model is wrapped (``DistributedDataParallel(...)`` / ``accelerator.prepare``):
        the ranks build different models, and DDP's constructor checks that they match ("DDP expects same model
        across all ranks", ``_verify_param_shape_across_processes``; huggingface/diffusers#2978)."""
        wraps = [c for c in self._calls() if _call_name(c)[1] in ("DistributedDataParallel", "DDP", "prepare")]
        if not wraps:
            return

        layers: set[str] = set()

        def layer(value: ast.AST) -> bool:
            if isinstance(value, ast.Call):
                recv, name = _call_name(value)
                return recv in ("nn", "torch.nn") or name in BUFFER_FREE_LAYERS
            return isinstance(value, ast.Name) and value.id in layers

        layers.update(t.id for n in self.nodes if isinstance(n, ast.Assign) and layer(n.value)
                      for t in n.targets if isinstance(t, ast.Name))
        for node in self.nodes:
            if not (isinstance(node, ast.Assign) and layer(node.value)):
                continue
            for t in node.targets:
                if not (isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name)):
                    continue
                model = t.value.id
                gate = self._rank_gate(node)
                if gate is None:
                    continue
                later = next((c for c in wraps if c.lineno > node.lineno and any(
                    isinstance(a, ast.Name) and a.id == model for a in c.args)), None)
                if later is not None:
                    self.add("rank-gated-model-change", "error", node,
                             f"{_src(t)} is replaced only when `{_gate_text(gate)}` holds, and {model} is wrapped on "
                             f"every rank at line {later.lineno}: the ranks hold different models (DDP: 'DDP expects "
                             "same model across all ranks'; the other ranks keep the old layer)",
                             "change the model on every rank (gate only the logging), before it is wrapped",
                             "https://docs.pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html")
                    break

    def _prepared_self_models(self) -> None:
        """:meth:`_prepared_model_attributes` for a model kept on ``self``: ``(self.model, ...) =
        self.accelerator.prepare(self.model, ...)`` in one method, ``self.model.save_pretrained(...)`` in another
        (huggingface/trl#157).  Only names that hold a model (:data:`_MODEL_ATTR`), in a class that never binds
        them again after the prepare, and never where the file shards its models (:func:`accelerator_shards`); a
        name the class reads ``.parameters()`` of is a model too (muse-maskgit's ``self.vae``).
        Likewise ``self.model = DistributedDataParallel(self.model)`` (any attribute name: the wrap says it is a
        model), read for an attribute DDP lacks after the wrap in its method or in another method than ``__init__``
        (nequip's ``self.model.unscale(...)``), unless the read dispatches on the wrapper itself
        (:meth:`_dispatched_on`)."""
        from helpers.lint.wrappers import DDP_PUBLIC, accelerator_prepare

        accelerate = not self._shards_models and "prepare(" in self.text
        ddp = bool(re.search(r"DistributedDataParallel|\bDDP\(", self.text))
        if not accelerate and not ddp:
            return
        for cls in (n for n in self.nodes if isinstance(n, ast.ClassDef)):
            prepared: dict[str, ast.Assign] = {}
            wrapped: set[str] = set()
            modules = {n.func.value.attr for n in ast.walk(cls) if isinstance(n, ast.Call) and  # self.vae.parameters()
                       isinstance(n.func, ast.Attribute) and n.func.attr == "parameters" and
                       isinstance(n.func.value, ast.Attribute) and isinstance(n.func.value.value, ast.Name) and
                       n.func.value.value.id == "self"} if accelerate else set()
            for n in ast.walk(cls):
                if accelerate and accelerator_prepare(n):
                    for t in flat_targets(n):
                        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self" \
                                and (_MODEL_ATTR.search(t.attr) or t.attr in modules):
                            prepared[t.attr] = n
                elif ddp and isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and \
                        _call_name(n.value)[1] in ("DistributedDataParallel", "DDP") and len(n.targets) == 1:
                    t = n.targets[0]
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        prepared[t.attr] = n
                        wrapped.add(t.attr)
            if not prepared:
                continue
            for n in ast.walk(cls):  # bound again after the prepare (unwrapped, replaced): not followed
                if isinstance(n, (ast.Assign, ast.AnnAssign)) and n not in prepared.values():
                    for t in flat_targets(n):
                        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self" \
                                and t.attr in prepared and n.lineno > prepared[t.attr].lineno:
                            prepared.pop(t.attr)
                            wrapped.discard(t.attr)
            body = ast.unparse(cls) if wrapped else ""
            for name in [w for w in wrapped if f"self.{w}.module" in body]:
                prepared.pop(name)  # the class reaches through the wrapper itself somewhere: its own dispatch
            said: set[tuple[str, str]] = set()
            for n in ast.walk(cls):
                if not (isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and isinstance(n.value, ast.Attribute)
                        and isinstance(n.value.value, ast.Name) and n.value.value.id == "self"):
                    continue
                name, attr = n.value.attr, n.attr
                at = prepared.get(name)
                if at is None or attr in DDP_PUBLIC or attr.startswith("_") or (name, attr) in said:
                    continue
                fn = self._enclosing_function(n)
                if fn is self._enclosing_function(at) and n.lineno <= at.lineno:
                    continue  # before the prepare, in the method that prepares
                if name in wrapped and (getattr(fn, "name", "") == "__init__" and fn is not self._enclosing_function(at)
                                        or self._dispatched_on(n, f"self.{name}")):
                    continue
                said.add((name, attr))
                if name in wrapped:
                    self.add("ddp-wrapper-attribute", "error", n,
                             f"self.{name}.{attr} after self.{name} was wrapped in DistributedDataParallel (line "
                             f"{at.lineno}): a DDP instance has no '{attr}' of its own, and nn.Module.__getattr__ "
                             "looks only in the wrapper's parameters, buffers and submodules ('AttributeError: "
                             f"'DistributedDataParallel' object has no attribute '{attr}'', under DDP only)",
                             f"self.{name}.module.{attr} when wrapped (or keep the bare model on another attribute)",
                             "https://docs.pytorch.org/docs/stable/generated/torch.nn.Module.html")
                    continue
                self.add("ddp-wrapper-attribute", "error", n,
                         f"self.{name}.{attr} on the model accelerator.prepare returned (line {at.lineno}): under several "
                         "processes without DeepSpeed/FSDP that is a DistributedDataParallel wrapper: 'AttributeError: "
                         f"'DistributedDataParallel' object has no attribute '{attr}''",
                         f"self.accelerator.unwrap_model(self.{name}).{attr}",
                         "https://huggingface.co/docs/accelerate/en/package_reference/accelerator")

    def _rank_only_objects(self) -> dict[tuple[ast.AST | None, str], tuple[int, str, bool]]:
        """Names made on some ranks only, per function: ``{(function or None, name): (line, how, conditional)}`` --
        a value of a ``@rank_zero_only`` function (None on the other ranks), ``x = A if <rank test> else None``
        (``conditional``), or an assignment under a rank gate with no assignment on the other ranks (not in the
        gate's ``else``, not under a complementary gate, not elsewhere on every rank).  The one table behind
        :meth:`rule_rank_gated_object_used` (uses outside the gate) and :meth:`_under_rank_only_object` (branches
        only those ranks enter).  Computed once per file."""
        cached = getattr(self, "_rank_only_cache", None)
        if cached is not None:
            return cached
        made: dict[tuple[ast.AST | None, str], tuple[int, str, bool]] = {}  # (line, how, a conditional expression)
        plain: set[tuple[ast.AST | None, str]] = set()
        gated_tests: dict[tuple[ast.AST | None, str], list[ast.expr]] = {}
        for node in self.nodes:
            if not isinstance(node, ast.Assign):
                continue
            scope = self._enclosing_function(node)
            for t in node.targets:
                if not isinstance(t, ast.Name):
                    continue
                v = node.value
                if isinstance(v, ast.Call) and self._rank_zero_only_call(v):
                    # Lightning's @rank_zero_only returns the function's value on global rank 0 and None elsewhere
                    # (lightning_utilities rank_zero_only: `return default` on the other ranks); NeMo's
                    # get_base_model
                    made[(scope, t.id)] = (node.lineno, f"{_src(v.func)}() is @rank_zero_only, None on the others",
                                           True)
                elif isinstance(v, ast.IfExp) and self.taint.rank_test(v.test) and any(
                        isinstance(b, ast.Constant) and b.value is None for b in (v.body, v.orelse)):
                    made[(scope, t.id)] = (node.lineno, f"{_src(v)[:60]}", True)
                elif (gate := self._rank_gate(node)) is not None and not (isinstance(v, ast.Constant) and v.value is None):
                    both = isinstance(gate, ast.If) and all(
                        any(isinstance(a, ast.Assign) and any(isinstance(x, ast.Name) and x.id == t.id for x in a.targets)
                            for st in branch for a in subtree(st)) for branch in (gate.body, gate.orelse))
                    if both:  # made on the gated ranks and, in the else branch, on the others
                        plain.add((scope, t.id))
                    else:
                        made.setdefault((scope, t.id), (node.lineno, f"only under `{_gate_text(gate)}`", False))
                        if isinstance(gate, ast.If):
                            gated_tests.setdefault((scope, t.id), []).append(gate.test)
                elif not (isinstance(v, ast.Constant) and v.value is None):  # `x = None` first: made nowhere yet
                    plain.add((scope, t.id))
        # `if rank == 0: x = ...` then `if rank != 0: x = ...` (download on one rank, then read on the others: PyG's
        # distributed examples) makes x on every rank
        plain.update(k for k, tests in gated_tests.items()
                     if any(_complementary(a, b) for i, a in enumerate(tests) for b in tests[i + 1:]))
        # a name also bound on every rank elsewhere is made everywhere, unless its rank-only value is the
        # `x if rank... else None` of one assignment (that assignment overrides the others on the ranks it gives None)
        made = {k: v for k, v in made.items() if k not in plain or v[2]}
        self._rank_only_cache: dict[tuple[ast.AST | None, str], tuple[int, str, bool]] = made
        return made

    def rule_rank_gated_object_used(self) -> None:
        """An object made only on some ranks, used on all of them: ``ema = ModelEMA(model) if rank in [-1, 0] else
        None`` then ``ema.updates = ...`` (ultralytics/yolov5#775), or ``wandb_logger = WandbLogger(...)`` inside ``if
        rank in [-1, 0]:`` then ``wandb_logger.wandb`` outside it (#2574): the other ranks hold None
        (``AttributeError: 'NoneType' object has no attribute ...``) or nothing (NameError).  A use counts when it
        reads an attribute of the name (or calls a method) outside any rank gate, after the assignment, in the same
        function, and under no test of the name itself (``if ema:``, ``ema and ...``)."""
        made = self._rank_only_objects()
        self._class_field_uses()
        self._rank_only_self_attributes()
        if not made:
            return
        self._rank_only_passed(made)
        self._made_on_main_used_on_local_main(made)
        seen: set[tuple[ast.AST | None, str]] = set()
        for node in self.nodes:
            if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)):
                continue
            key = (self._enclosing_function(node), node.value.id)
            if key not in made or key in seen or node.lineno <= made[key][0] or self._rank_gate(node) is not None:
                continue
            if self._under_test_of(node, node.value.id, or_rank=True) or \
                    self._after_exit_on_test_of(node, node.value.id):
                continue
            seen.add(key)
            line, how, _ = made[key]
            self.add("rank-gated-object-used", "error", node,
                     f"{_src(node)[:50]} runs on every rank, but {node.value.id} is made only on some (line {line}: "
                     f"{how}): on the others it is None or unset ('NoneType' object has no attribute "
                     f"'{node.attr}', or NameError)",
                     f"gate the use like the creation (if {node.value.id} is not None: / if <main rank>:), or make it "
                     "on every rank", "D21")

    def _rank_only_self_attributes(self) -> None:
        """:meth:`rule_rank_gated_object_used` for an attribute of ``self``: ``self.ema_model = EMA(...)`` only in the
        body of a rank gate (``if self.is_main:``, nothing set in its ``else`` nor anywhere else in the class), then
        ``self.ema_model.<attr>`` read in another method outside any rank gate and under no test of it
        (``hasattr(self, "ema_model")``, ``if self.ema_model is not None``): on the other ranks the attribute does
        not exist (AttributeError; e2-tts' ``load_checkpoint``, which every process runs on resume)."""
        for cls in (n for n in self.nodes if isinstance(n, ast.ClassDef)):
            sets: dict[str, list[ast.Assign]] = {}
            for n in ast.walk(cls):
                if isinstance(n, (ast.Assign, ast.AnnAssign)):
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                            sets.setdefault(t.attr, []).append(n)  # type: ignore[arg-type]
            text = ""  # the class's source, made once when an attribute qualifies
            for attr, where in sets.items():
                gates = [self._rank_gate(n) for n in where]
                if not all(isinstance(g, ast.If) and any(n in subtree(st) for st in g.body)
                           for g, n in zip(gates, where)):
                    continue  # set on every rank somewhere, or in a gate's else
                first = where[0]
                home = self._enclosing_function(first)
                text = text or ast.unparse(cls)
                if re.search(rf"""hasattr\(self,\s*['"]{attr}['"]|getattr\(self,\s*['"]{attr}['"]""", text):
                    continue
                for node in ast.walk(cls):
                    if not (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load) and
                            isinstance(node.value, ast.Attribute) and isinstance(node.value.value, ast.Name) and
                            node.value.value.id == "self" and node.value.attr == attr):
                        continue
                    fn = self._enclosing_function(node)
                    if fn is home or self._rank_gate(node) is not None or \
                            self._under_test_of(node, attr, attribute=True, or_rank=True):
                        continue
                    self.add("rank-gated-object-used", "error", node,
                             f"{_src(node)[:50]} runs on every rank, but self.{attr} is set only under "
                             f"`{_src(gates[0].test)[:40]}` (line {first.lineno}): on the other ranks the attribute "
                             f"does not exist ('{cls.name}' object has no attribute '{attr}')",
                             f"gate the use like the creation, or set self.{attr} = None on the other ranks and test it",
                             "D21")
                    break

    def _rank_only_passed(self, made: dict[tuple[ast.AST | None, str], tuple[int, str, bool]]) -> None:
        """Record (``facts.rank_only_args``) each call that hands a rank-only name (:meth:`_rank_only_objects`) to a
        class or function by keyword or position: another linted file may use it on every rank
        (:func:`helpers.lint.cross_rules.rank_only_object_across`)."""
        for c in self._calls():
            name = _call_name(c)[1]
            scope = self._enclosing_function(c)
            if not name or self._rank_gate(c) is not None:
                continue
            args: list[tuple[str | int, ast.AST]] = [(i, a) for i, a in enumerate(c.args)]
            args += [(k.arg, k.value) for k in c.keywords if k.arg]
            for key, a in args:
                if isinstance(a, ast.Name) and (scope, a.id) in made and c.lineno > made[(scope, a.id)][0]:
                    line, how, _ = made[(scope, a.id)]
                    self.facts.rank_only_args.append((name, key, c.lineno, f"{a.id} (line {line}: {how})"))

    def _class_field_uses(self) -> None:
        """For each module-level class: its fields in order (an attrs/dataclass class's annotated names, else its
        ``__init__`` parameters) and, per field kept as ``self.<field>``, the first use of an attribute of it outside
        any test of it, any early exit on such a test and any rank gate (``facts.class_fields``,
        ``facts.unguarded_uses``)."""
        for cls in (n for n in getattr(self.tree, "body", []) if isinstance(n, ast.ClassDef)):
            init = method_named(cls, "__init__")
            if init is not None:
                fields = [a.arg for a in init.args.args[1:] + init.args.kwonlyargs]
            else:
                fields = [st.target.id for st in cls.body if isinstance(st, ast.AnnAssign)
                          and isinstance(st.target, ast.Name)]
            if not fields:
                continue
            self.facts.class_fields[cls.name] = fields
            uses: dict[str, tuple[int, str]] = {}
            for node in ast.walk(cls):
                if not (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
                        and isinstance(node.value, ast.Attribute) and isinstance(node.value.value, ast.Name)
                        and node.value.value.id == "self" and node.value.attr in fields
                        and node.value.attr not in uses):
                    continue
                held = node.value.attr
                if self._under_test_of(node, held, attribute=True) or self._rank_gate(node) is not None or \
                        self._after_exit_on_test_of(node, held, attribute=True):
                    continue
                uses[held] = (node.lineno, _src(node)[:50])
            if uses:
                self.facts.unguarded_uses[cls.name] = uses

    def _under_test_of(self, node: ast.AST, name: str, attribute: bool = False, or_rank: bool = False) -> bool:
        """``node`` sits under a test (``if``, a conditional expression, ``while``, ``and``/``or``) of ``name`` (an
        attribute of that name with ``attribute``; any test that mentions a rank too with ``or_rank``), in its
        function: ``if ema: ema.update(model)``, ``self.logger and self.logger.log(...)``."""
        p = self.parents.get(node)
        while p is not None and not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)):
            test = p.test if isinstance(p, (ast.If, ast.IfExp, ast.While)) else p if isinstance(p, ast.BoolOp) else None
            if test is not None and (any((isinstance(n, ast.Attribute) and n.attr == name) if attribute else
                                         (isinstance(n, ast.Name) and n.id == name) for n in ast.walk(test))
                                     or (or_rank and re.search(r"(?i)rank", _src(test)))):
                return True
            p = self.parents.get(p)
        return False

    def _after_exit_on_test_of(self, node: ast.AST, name: str, attribute: bool = False) -> bool:
        """``node`` follows, in its block or an enclosing one of the same function, an ``if`` that tests ``name`` (an
        attribute of that name with ``attribute``) and leaves (``if not writer: continue``; ``if self.logger is None:
        return``): only the ranks that hold it get here."""
        def tests(t: ast.expr) -> bool:
            return any((isinstance(n, ast.Attribute) and n.attr == name) if attribute else
                       (isinstance(n, ast.Name) and n.id == name) for n in ast.walk(t))

        return self._preceded_by_exit(node, tests, (ast.Return, ast.Continue, ast.Break, ast.Raise))

    def _gathered_before(self, call: ast.Call, gate: ast.AST) -> bool:
        """The function around ``call`` gathers a state dict on every rank before ``gate`` (a call whose name says
        gather or state dict, outside any rank gate, on an earlier line)."""
        fn = self._enclosing_function(call) or self.tree
        return any(isinstance(n, ast.Call) and n.lineno < gate.lineno and self._rank_gate(n) is None
                   and re.search(r"(?i)gather|state_dict", _call_name(n)[1]) for n in subtree(fn))

    def _rank_zero_only_call(self, call: ast.Call) -> bool:
        """``call`` calls a function of this file decorated ``@rank_zero_only`` (bare, or a method through self)."""
        f = call.func
        name = f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) and \
            isinstance(f.value, ast.Name) and f.value.id in ("self", "cls") else None
        fn = self.functions.get(name) if name else None
        return fn is not None and any(_src(d).endswith("rank_zero_only") for d in fn.decorator_list)

    def _made_on_main_used_on_local_main(self, made: dict[tuple[ast.AST | None, str], tuple[int, str, bool]]) -> None:
        """A name made only on the main process (``if accelerator.is_main_process:``, ``rank == 0``) and read under
        a local-main test (``is_local_main_process``, ``local_rank == 0``): that test holds on the first process of
        every node, so on the other nodes it reads a name never assigned (NameError), or None
        (crowsonkb/k-diffusion: the metrics file opened on the main process, written on each node's local main;
        https://huggingface.co/docs/accelerate/en/package_reference/state#accelerate.PartialState.is_local_main_process)."""
        local = re.compile(r"(?i)is_local_main_process|local_rank\s*==\s*0|LOCAL_RANK|is_local_master|local_process_index\s*==\s*0")
        seen: set[tuple[ast.AST | None, str]] = set()
        made_names = {name for _scope, name in made}
        for node in self.nodes:
            if not (isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load) and node.id in made_names):
                continue
            scope: ast.AST | None = self._enclosing_function(node)
            key = (scope, node.id)
            while key not in made and scope is not None and not any(  # a closure reads its outer function's name
                    isinstance(a, ast.Assign) and any(isinstance(t, ast.Name) and t.id == node.id for t in a.targets)
                    for a in subtree(scope)):
                scope = self._enclosing_function(scope)
                key = (scope, node.id)
            entry = made.get(key)
            if entry is None or key in seen or node.lineno <= entry[0] or entry[2] or local.search(entry[1]):
                continue
            gate = self._rank_gate(node)
            if gate is None or not local.search(_gate_text(gate)):
                continue
            seen.add(key)
            self.add("rank-gated-object-used", "error", node,
                     f"{node.id} is read under `{_gate_text(gate)}`, which holds on the first process of every node, "
                     f"but it is made only {entry[1]} (line {entry[0]}), on one process of the job: on the other "
                     "nodes it was never assigned (NameError)",
                     "gate both the same way (is_main_process for one file per job, is_local_main_process for one "
                     "per node)", "https://huggingface.co/docs/accelerate/en/package_reference/state")

    def _ddp_foreign_attributes(self) -> set[int]:
        """A name bound to ``DistributedDataParallel(model)`` read for an attribute a DDP instance does not have
        (:data:`helpers.lint.wrappers.DDP_PUBLIC`: its class's public names and what its ``__init__`` sets):
        ``nn.Module.__getattr__`` looks only in the wrapper's own parameters, buffers and submodules (just
        ``module``), so ``model.stride`` / ``model.model[-1]`` raise AttributeError under DDP, whatever the inner
        model holds (ultralytics/yolov5#683, #5332).  A read under an ``if`` / conditional expression whose test names
        the same variable (``model.module.stride if is_parallel(model) else model.stride``) is the author's own
        dispatch and is left alone.  Returns the ids of the nodes reported, so the stored-attribute reading does not
        report them twice."""
        from helpers.lint.wrappers import DDP_PUBLIC

        out: set[int] = set()
        if not re.search(r"DistributedDataParallel|\bDDP\(", self.text) and not self.wrappers.returned_in:
            return out  # (nothing here wraps, and no other linted file's function returns a wrapper to this one)
        for node in self.nodes:
            if not (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and
                    isinstance(node.ctx, ast.Load)) or node.attr in DDP_PUBLIC or node.attr.startswith("_"):
                continue
            if node.value.id in ("self", "cls") or not self.wrappers.state(node.value, node)[0]:
                continue
            if self._dispatched_on(node, node.value.id) or self._other_branch_wraps(node) or self._under_deepspeed(node):
                continue
            out.add(id(node))
            self.add("ddp-wrapper-attribute", "error", node,
                     f"{_src(node)} reads '{node.attr}' on {node.value.id}, which holds the DistributedDataParallel "
                     f"wrapper here: a DDP instance has no '{node.attr}' of its own, and nn.Module.__getattr__ looks only "
                     f"in the wrapper's parameters, buffers and submodules ('AttributeError: 'DistributedDataParallel' "
                     f"object has no attribute '{node.attr}'')",
                     f"{node.value.id}.module.{node.attr} (or read it from the model before wrapping)",
                     "https://docs.pytorch.org/docs/stable/generated/torch.nn.Module.html")
        return out

    def _under_deepspeed(self, node: ast.AST) -> bool:
        """``node`` is in the body of an ``if`` whose test asks for DeepSpeed (``if cfg.environment.use_deepspeed:
        model.backward(loss)``): there the value is a DeepSpeed engine, whose ``__getattr__`` falls back to the
        wrapped module's attributes, not a DistributedDataParallel wrapper (deepspeed/runtime/engine.py)."""
        child, p = node, self.parents.get(node)
        while p is not None and not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)):
            body = p.body if isinstance(p, ast.If) else [p.body] if isinstance(p, ast.IfExp) else []
            if any(child is b for b in body) and re.search(r"(?i)deepspeed", _src(p.test)):  # type: ignore[attr-defined]
                return True
            child, p = p, self.parents.get(p)
        return False

    def _dispatched_on(self, node: ast.AST, name: str) -> bool:
        """``node`` sits under an ``if`` / ``while`` / conditional expression whose test asks about ``name`` by a call
        or its ``.module`` (``m.module.config if hasattr(m, "module") else m.config``, ``if is_parallel(model)``):
        the author's own dispatch between the wrapper and the bare model (a bare ``if m`` / ``m is None`` is not); or
        under a branch whose other side reads ``name.module`` (``if accelerator.num_processes > 1:
        x.module.get_input_embeddings() else: x.get_input_embeddings()``, diffusers' custom_diffusion).  Not for ``node`` in the test itself (``if
        unet.config.in_channels == 8:`` reads through the wrapper).  ``name`` may be dotted (``self.model``)."""
        def is_name(n: ast.AST) -> bool:
            return isinstance(n, ast.Name) and n.id == name or "." in name and isinstance(n, ast.Attribute) and \
                _src(n) == name

        def module_of_name(n: ast.AST) -> bool:  # name.module
            return isinstance(n, ast.Attribute) and n.attr == "module" and is_name(n.value)

        child, p = node, self.parents.get(node)
        while p is not None and not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if isinstance(p, (ast.If, ast.IfExp, ast.While)) and child is not p.test and any(
                    isinstance(n, ast.Call) and any(is_name(a) for a in n.args) or
                    module_of_name(n) for n in ast.walk(p.test)):
                return True
            if isinstance(p, (ast.If, ast.IfExp)) and child is not p.test:
                here = p.body if child in (p.body if isinstance(p.body, list) else [p.body]) else p.orelse
                other = p.orelse if here is p.body else p.body
                if any(module_of_name(n) for st in (other if isinstance(other, list) else [other])
                       for n in subtree(st)):
                    return True  # if accelerator.num_processes > 1: x.module.f() / else: x.f()
            child, p = p, self.parents.get(p)
        return False

    def _other_branch_wraps(self, node: ast.Attribute) -> bool:
        """The DDP wrap of ``node``'s variable sits in another branch of an ``if`` that holds ``node`` (``if
        distributed: model = DDP(model)`` / ``elif cuda: model.features ...``): the two never run together."""
        from helpers.lint.wrappers import DDP_CTOR

        name = node.value.id  # type: ignore[attr-defined]
        child, p = node, self.parents.get(node)
        while p is not None and not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if isinstance(p, ast.If):
                other = p.orelse if child in p.body else p.body if child in p.orelse else []
                if any(isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and
                       DDP_CTOR.match(_call_name(a.value)[1] or "") and
                       any(isinstance(t, ast.Name) and t.id == name for t in a.targets)
                       for stmt in other for a in ast.walk(stmt)):
                    return True
            child, p = p, self.parents.get(p)
        return False

    def _under_other_distributed_type(self, node: ast.AST) -> bool:
        """``node`` sits under ``if accelerator.distributed_type == DistributedType.XLA:`` (or DEEPSPEED, FSDP,
        MEGATRON_LM, NO): on that path ``prepare`` does not wrap the model in DistributedDataParallel."""
        p = self.parents.get(node)
        while p is not None and not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)):
            if isinstance(p, ast.If) and re.search(r"distributed_type\s*==\s*\w*\.?(?:XLA|TPU|DEEPSPEED|FSDP|MEGATRON_LM|NO)\b",
                                                  _src(p.test)) and node in [n for st in p.body for n in subtree(st)]:
                return True
            p = self.parents.get(p)
        return False

    def _prepared_model_attributes(self) -> None:
        """:meth:`rule_ddp_wrapper_attribute` for the models ``accelerator.prepare`` returns (in the same function,
        after the prepare line, before the name is bound again)."""
        from helpers.lint.wrappers import DDP_PUBLIC, STATE_DICT_READERS, prepared_models

        models = [] if self._shards_models else prepared_models(self.tree)
        if not models:
            return
        binds: dict[str, list[int]] = {}
        for node in self.nodes:
            if isinstance(node, (ast.Assign, ast.AnnAssign, ast.AugAssign)):
                for t in flat_targets(node):
                    if isinstance(t, ast.Name):
                        binds.setdefault(t.id, []).append(node.lineno)

        scopes = {id(at): self._enclosing_function(at) for _model, at in models}

        def through_wrapper(name: ast.Name) -> int:
            for model, at in models:
                line = at.lineno
                if name.id == model and name.lineno > line and \
                        not any(line < b < name.lineno for b in binds.get(model, ())) and \
                        self._enclosing_function(name) is scopes[id(at)]:
                    return line
            return 0

        for node in self.nodes:
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and isinstance(node.ctx, ast.Load) \
                    and node.attr not in DDP_PUBLIC and not node.attr.startswith("_"):
                line = through_wrapper(node.value)
                if line and not self._under_other_distributed_type(node) and \
                        not self._dispatched_on(node, node.value.id):
                    self.add("ddp-wrapper-attribute", "error", node,
                             f"{_src(node)} reads '{node.attr}' on the model accelerator.prepare returned (line {line}): "
                             "under several processes without DeepSpeed/FSDP that is a DistributedDataParallel "
                             f"wrapper: 'AttributeError: 'DistributedDataParallel' object has no attribute "
                             f"'{node.attr}''",
                             f"accelerator.unwrap_model({node.value.id}).{node.attr}",
                             "https://huggingface.co/docs/accelerate/en/package_reference/accelerator")
            elif isinstance(node, ast.Call) and _call_name(node)[1] in STATE_DICT_READERS and node.args \
                    and isinstance(node.args[0], ast.Name):
                line = through_wrapper(node.args[0])
                if line:
                    attr = STATE_DICT_READERS[_call_name(node)[1]]
                    self.add("ddp-wrapper-attribute", "error", node,
                             f"{_src(node)[:60]} is given the model accelerator.prepare returned (line {line}); it "
                             f"reads .{attr}, which the DistributedDataParallel wrapper does not have (AttributeError "
                             "under several processes)",
                             f"{_call_name(node)[1]}(accelerator.unwrap_model({node.args[0].id}))",
                             "https://huggingface.co/docs/accelerate/en/package_reference/accelerator")

    def rule_unbound_after_ddp_branch(self) -> None:
        """A name bound only in the non-DDP branch of ``if ddp: model = DDP(model) else: ...`` and read after it:
        ``UnboundLocalError`` on the DDP path only (:func:`helpers.lint.wrappers.unbound_after_wrap`; Python's name
        resolution, https://docs.python.org/3/reference/executionmodel.html#resolution-of-names)."""
        if not re.search(r"DistributedDataParallel|\bDDP\b|DistributedSampler|is_initialized|init_process_group",
                         self.text):
            return
        for read, branch in unbound_after_wrap(self.tree, self.parents):
            if not branch.orelse:
                self.add("unbound-after-ddp-branch", "warning", read,
                         f"'{read.id}' is read here but bound only under `{_src(branch.test)[:50]}` (line "
                         f"{branch.lineno}), which holds in a distributed run alone: one process (no group, world "
                         f"size 1) never assigns it (UnboundLocalError: cannot access local variable '{read.id}')",
                         f"add else: {read.id} = None (or bind it before the if)",
                         "https://docs.python.org/3/reference/executionmodel.html#resolution-of-names")
                continue
            self.add("unbound-after-ddp-branch", "warning", read,
                     f"'{read.id}' is read here but bound only in the branch of line {branch.lineno} that does not "
                     "wrap the model in DistributedDataParallel: under DDP it is never assigned "
                     f"(UnboundLocalError: cannot access local variable '{read.id}')",
                     f"bind {read.id} in the DDP branch too (e.g. {read.id} = model.module) or before the if",
                     "https://docs.python.org/3/reference/executionmodel.html#resolution-of-names")

    def _rank0_helpers(self) -> set[str]:
        """Functions of the file whose whole body runs under one rank gate (``def print0(*a): if RANK == 0:
        print(*a)``): calling one is logging on the main process only."""
        out = set()
        for name, fn in self.functions.items():
            body = [b for b in fn.body if not (isinstance(b, ast.Expr) and isinstance(b.value, ast.Constant))]
            if len(body) == 1 and isinstance(body[0], ast.If) and not body[0].orelse and \
                    self.taint.rank_test(body[0].test):
                out.add(name)
        return out

    def rule_metric_not_reduced(self) -> None:
        """A loss summed from ``loss.item()`` in a loop (``lossf += loss.item()``) and logged on the main process only, with no
        collective over it anywhere in the file: under DDP each rank's loss is that of its own shard of the batch
        (DistributedDataParallel averages the *gradients*, "During the backwards pass, gradients from each node are
        averaged", torch/nn/parallel/distributed.py), so the printed "train loss" is rank 0's shard, not the job's
        mean (karpathy/llm.c#551: "our PyTorch losses were not reduced that caused us to think we have a divergence").
        The reference practice all-reduces before logging (pytorch/examples imagenet/main.py ``AverageMeter.all_reduce``,
        https://github.com/pytorch/examples/blob/main/imagenet/main.py).  Info: rank 0's shard is often accepted as an
        estimate on purpose; the finding says which number is printed."""
        if not re.search(WRAPS_DDP, self.text) or "item()" not in self.text:
            return
        accumulated: dict[str, list[tuple[ast.AST, str]]] = {}
        for n in self.nodes:
            if isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Add) and self._in_loop(n):
                targets = [n.target]
                for c in ast.walk(n.value):
                    if isinstance(c, ast.Call) and _call_name(c)[1] == "item" and isinstance(c.func, ast.Attribute) \
                            and "loss" in _src(c.func.value).lower():
                        for t in targets:
                            if isinstance(t, ast.Name):
                                root = next((x.id for x in ast.walk(c.func.value) if isinstance(x, ast.Name)), "")
                                accumulated.setdefault(t.id, []).append((n, root))
        if not accumulated:
            return
        reduced: set[str] = set()
        for c in self._calls():
            name = _call_name(c)[1]
            if "reduce" in name or "gather" in name or name in ("broadcast", "all_to_all"):
                reduced.update(x.id for a in [*c.args, *(k.value for k in c.keywords)] for x in ast.walk(a)
                               if isinstance(x, ast.Name))
        for _ in range(2):  # `t = torch.tensor(lossf); dist.all_reduce(t)` reduces lossf too
            for n in self.nodes:
                if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id in reduced for t in n.targets):
                    reduced.update(x.id for x in ast.walk(n.value) if isinstance(x, ast.Name))
        helpers = self._rank0_helpers()
        for var, sources in accumulated.items():
            if var in reduced or any(root in reduced for _n, root in sources):
                continue  # reduced, or also assigned from a reduced tensor (`li = reduced.item()` under DDP)
            node, root = min(sources, key=lambda s: s[0].lineno)
            for c in self._calls():
                gated = _call_name(c)[1] in helpers or self._rank_gate(c) is not None
                if not gated or not any(isinstance(x, ast.Name) and x.id == var
                                        for a in [*c.args, *(k.value for k in c.keywords)] for x in ast.walk(a)):
                    continue
                self.add("metric-not-reduced", "info", c,
                         f"'{var}' (summed from {root}.item() at line {node.lineno}) is logged on the main process "
                         "only and never reduced across ranks: under DDP it is rank 0's shard loss, not the mean "
                         "over the job",
                         f"all-reduce before logging: t = torch.tensor({var}, device=device); "
                         "dist.all_reduce(t, op=dist.ReduceOp.AVG)",
                         "https://github.com/karpathy/llm.c/pull/551")
                break

    def rule_lightning_epoch_log_not_synced(self) -> None:
        """``self.log(name, value, on_epoch=True)`` in a LightningModule without ``sync_dist=True``, where ``value`` is a
        tensor computed in the step (not a torchmetrics ``Metric`` object, which syncs itself): at the epoch's end each
        process averages only its own batches, and the value logged (and monitored by ``ModelCheckpoint`` /
        ``EarlyStopping``) is the logging process's shard.  Lightning's own warning when it sees this in validation or
        test: "It is recommended to use `self.log(..., sync_dist=True)` when logging on epoch level in distributed
        setting to accumulate the metric across devices" (lightning/pytorch/trainer/connectors/logger_connector/
        result.py; https://lightning.ai/docs/pytorch/stable/extensions/logging.html#automatic-logging).  In
        ``validation_step`` / ``test_step`` ``on_epoch`` is True by default; in ``training_step`` only when written.
        A warning where a monitor may read the name (:meth:`_monitored_names`: the ranks then checkpoint, stop or
        lower the learning rate on different numbers), a note where nothing in the file monitors it."""
        if "LightningModule" not in self.text or "self.log(" not in self.text:
            return
        monitored = self._monitored_names()
        for cls in (n for n in self.nodes if isinstance(n, ast.ClassDef)
                    and any(_src(b).endswith("LightningModule") for b in n.bases)):
            methods = {b.name: b for b in cls.body if isinstance(b, ast.FunctionDef)}
            steps = {name: name != "training_step" for name in ("training_step", "validation_step", "test_step")
                     if name in methods}
            for name in list(steps):  # helpers the steps call (self._log_metrics(loss, ..., stage))
                for c in ast.walk(methods[name]):
                    if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and _src(c.func.value) == "self" \
                            and c.func.attr in methods and c.func.attr not in steps:
                        steps[c.func.attr] = steps.get(c.func.attr, True) and steps[name]
            for fn_name, step in steps.items():
                fn = methods[fn_name]
                for c in (x for x in subtree(fn) if isinstance(x, ast.Call) and _src(x.func) == "self.log"):
                    kws = {k.arg: k.value for k in c.keywords if k.arg}
                    on_epoch = kws.get("on_epoch")
                    epoch = (isinstance(on_epoch, ast.Constant) and on_epoch.value is True) or \
                        (step and on_epoch is None)
                    sync = kws.get("sync_dist")
                    if not epoch or (sync is not None and not (isinstance(sync, ast.Constant) and sync.value is False)):
                        continue
                    value = c.args[1] if len(c.args) > 1 else kws.get("value")
                    if not isinstance(value, ast.Name):
                        continue  # self.val_acc (a Metric object), a dict, a literal: not a per-process tensor
                    key = c.args[0] if c.args else kws.get("name")
                    watched = monitored is None or _names_monitored(key, monitored)
                    self.add("metric-not-reduced", "warning" if watched else "info", c,
                             f"{_src(c)[:60]} logs an epoch-level value without sync_dist=True: each process averages "
                             "only its own batches, so the logged number is one process's shard" + (
                                 ", and a monitor (ModelCheckpoint / EarlyStopping / ReduceLROnPlateau) reads it: the "
                                 "processes decide on different numbers" if watched else
                                 " (nothing in this file monitors it; Lightning warns about it at run time)"),
                             "self.log(..., sync_dist=True), or log a torchmetrics Metric object (it syncs itself)",
                             "https://lightning.ai/docs/pytorch/stable/extensions/logging.html#automatic-logging")
                    return

    def _monitored_names(self) -> set[str] | None:
        """The metric names this file gives a monitor (``ModelCheckpoint(monitor="val_loss")``, ``EarlyStopping``, the
        ``"monitor"`` entry of ``configure_optimizers``' scheduler dict, ``cfg["monitor"] = ...``): every string
        constant inside the monitor's value.  None when some monitor's value is not a constant in this file
        (``monitor=args.monitor``): any logged name may be the one it reads."""
        values: list[ast.AST] = []
        for n in self.nodes:
            if isinstance(n, ast.keyword) and n.arg == "monitor":
                values.append(n.value)
            elif isinstance(n, ast.Dict):
                values += [v for k, v in zip(n.keys, n.values) if isinstance(k, ast.Constant) and k.value == "monitor"]
            elif isinstance(n, ast.Assign) and any(isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)
                                                   and t.slice.value == "monitor" for t in n.targets):
                values.append(n.value)
        names: set[str] = set()
        for v in values:
            found = {x.value for x in ast.walk(v) if isinstance(x, ast.Constant) and isinstance(x.value, str)}
            if not found and not (isinstance(v, ast.Constant) and v.value is None):
                return None
            names |= found
        return names

    def rule_amp_initialize_after_ddp(self) -> None:
        """``amp.initialize(model, ...)`` given a model already wrapped in ``DistributedDataParallel``: apex refuses it,
        "Incoming model is an instance of torch.nn.parallel.DistributedDataParallel. Parallel wrappers should only be
        applied to the model(s) AFTER the model(s) have been returned from amp.initialize." (apex/amp/_initialize.py
        ``check_models``; apex docs https://nvidia.github.io/apex/amp.html: "amp.initialize should be called after you
        have finished constructing your model(s) and optimizer(s), but before you send your model through any
        DistributedDataParallel wrapper")."""
        if "amp" not in self.text or not self.wrappers.w.assigns:
            return
        for call in self._calls():
            recv, name = _call_name(call)
            if name != "initialize" or not recv.endswith("amp") or not call.args:
                continue
            models = call.args[0].elts if isinstance(call.args[0], (ast.List, ast.Tuple)) else [call.args[0]]
            if any(self.wrappers.state(m, call)[0] for m in models):
                self.add("amp-initialize-after-ddp", "error", call,
                         f"{_src(call)[:60]} receives a model already wrapped in DistributedDataParallel: 'RuntimeError: "
                         "Incoming model is an instance of torch.nn.parallel.DistributedDataParallel. Parallel wrappers "
                         "should only be applied to the model(s) AFTER the model(s) have been returned from "
                         "amp.initialize.'",
                         "build the optimizer, call model, optimizer = amp.initialize(model, optimizer, ...), then wrap "
                         "the returned model in DistributedDataParallel", "https://nvidia.github.io/apex/amp.html")

    def rule_master_port_and_timeout(self) -> None:
        """D4 (hard-coded MASTER_PORT) and MN3 (init_process_group without timeout)."""
        for node in self.nodes:
            if isinstance(node, ast.Assign) and len(node.targets) == 1 and _env_key(node.targets[0]) == "MASTER_PORT" \
                    and isinstance(node.value, ast.Constant):
                self.add("hardcoded-master-port", "warning", node,
                         f"MASTER_PORT is fixed to {node.value.value}: a second job on the same node fails with "
                         "EADDRINUSE (or joins the first job's store)",
                         "let the launcher choose (torchrun --standalone / --rdzv-endpoint=localhost:0) or take a free "
                         "port per job", "D4")
        waits = None
        for call in self._calls():
            _recv, name = _call_name(call)
            if name == "init_process_group":
                for kw in call.keywords:
                    if kw.arg == "init_method" and isinstance(kw.value, ast.Constant) and \
                            re.match(r"tcp://[^:]+:\d+$", str(kw.value.value)):
                        self.add("hardcoded-master-port", "warning", call,
                                 f"init_method={kw.value.value} fixes the rendezvous port: a second job on the node "
                                 "fails with EADDRINUSE", "init_method='env://' under torchrun", "D4")
                given = next((k.value for k in call.keywords if k.arg == "timeout"), None)
                seconds = _timedelta_seconds(given) if given is not None else None
                if seconds is not None and seconds <= SHORT_INIT_TIMEOUT_S:
                    waits = self._rank_first_section() if waits is None else waits
                    if waits:
                        self.add("init-timeout-short", "warning", call,
                                 f"{waits}, and init_process_group's timeout is {seconds:g} s (the default is 10 "
                                 "minutes): the ranks that wait are aborted once the first rank's step (evaluation, "
                                 "download, dataset check) runs longer ('Watchdog caught collective operation timeout')",
                                 "raise the timeout above the longest first-rank step (or leave the default), e.g. "
                                 "timeout=datetime.timedelta(minutes=30)",
                                 "https://docs.pytorch.org/docs/stable/distributed.html#torch.distributed.init_process_group")
                    else:
                        self.add("init-timeout-short", "warning", call,
                                 f"init_process_group's timeout is {seconds:g} s (the default is 10 minutes): too short "
                                 "for real collectives, since NCCL connects each peer pair at its first collective and "
                                 "ranks drift apart by seconds to minutes (model loading, compilation, a checkpoint); "
                                 "the watchdog aborts waits that would have ended",
                                 "leave the default or give minutes (timeout=datetime.timedelta(minutes=30))",
                                 "https://docs.pytorch.org/docs/stable/distributed.html#torch.distributed.init_process_group")
                if not any(k.arg == "timeout" or k.arg is None for k in call.keywords):
                    waits = self._rank_first_section() if waits is None else waits
                    if waits:
                        self.add("init-without-timeout", "info", call,
                                 f"{waits}: init_process_group has no timeout, so that wait is bounded by the default "
                                 "(10 min for nccl, 30 min for the other backends); a longer first-rank step ends the "
                                 "job ('Watchdog caught collective operation timeout')",
                                 "init_process_group(..., timeout=datetime.timedelta(minutes=N)) sized to the longest "
                                 "first-rank step (or prepare the data before the distributed run)",
                                 "MN3; https://docs.pytorch.org/docs/stable/distributed.html#torch.distributed.init_process_group")

    _FIRST_CONTEXTS = re.compile(r"(^|_)(zero|main_process|local_main_process|rank_zero|master|local_zero)_first$")

    def _rank_first_section(self) -> str:
        """Where some ranks wait in a collective while one rank works first, else "" (what the default collective
        timeout bounds: MN3).  ``with main_process_first():`` (Accelerator / TrainingArguments), yolov5's
        ``torch_distributed_zero_first``, a barrier pair around a rank-0 block, or a rank-gated block followed by a
        barrier in the same block.  Every init_process_group has the default timeout; only where ranks wait for one
        rank's work is it worth a line (an info on every script was noise)."""
        for node in self.nodes:
            if isinstance(node, (ast.With, ast.AsyncWith)):
                for item in node.items:
                    ctx = item.context_expr
                    name = _call_name(ctx)[1] if isinstance(ctx, ast.Call) else ""
                    if self._FIRST_CONTEXTS.search(name):
                        return f"line {node.lineno} runs `with {name}(...)`: the other ranks wait in a barrier while " \
                               "the first one works"
            for fld in ("body", "orelse"):
                block = getattr(node, fld, None)
                if not isinstance(block, list):
                    continue
                for i, stmt in enumerate(block):
                    if not (isinstance(stmt, ast.If) and self.taint.rank_test(stmt.test)) or \
                            any(isinstance(s, FINISHING) for s in stmt.body):
                        continue
                    gated = next((c for c in self._calls(stmt) if _call_name(c)[1] in ("barrier", "wait_for_everyone")),
                                 None)
                    if gated is not None and self._balanced(stmt, "barrier"):
                        return f"lines {stmt.lineno}-: a barrier pair lets one rank work while the others wait in " \
                               f"{_src(gated.func)} (line {gated.lineno})"
                    for later in block[i + 1:]:
                        hit = next((c for c in self._calls(later) if _call_name(c)[1] in
                                    ("barrier", "wait_for_everyone", "monitored_barrier")), None)
                        if hit is not None and self._rank_gate(hit) is None:
                            return f"line {stmt.lineno} runs a rank-dependent block while the other ranks wait in " \
                                   f"{_src(hit.func)} (line {hit.lineno})"
        return ""

    def collect_facts(self) -> None:
        """Fill :attr:`facts` for the cross-file rules."""
        f = self.facts
        f.distributed = bool(re.search(r"init_process_group|deepspeed|Accelerator|DistributedDataParallel", self.text))
        f.wraps_ddp = bool(re.search(WRAPS_DDP, self.text))
        f.defines = {n.name for n in getattr(self.tree, "body", []) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))}
        f.ddp_passed = self.wrappers.w.passed_out
        f.ddp_returns = {k: v for k, v in self.wrappers.returns.items() if k in f.defines}
        f.classes = {n.name for n in getattr(self.tree, "body", []) if isinstance(n, ast.ClassDef)}
        f.rank_funcs = self.taint.rank_funcs & f.defines
        f.collective_funcs = {k: v for k, v in self.collective_funcs.items() if k in f.defines}
        for c in self._calls():
            recv, name = _call_name(c)
            if not name or name in self.functions or name in f.classes or recv in ("self", "cls"):
                continue
            which: set[str | int] = {i for i, a in enumerate(c.args) if self.taint.is_rank_value(a)}
            which |= {k.arg for k in c.keywords if k.arg and self.taint.is_rank_value(k.value)}
            if which:
                f.rank_passed.setdefault(name, set()).update(which)
        f.uses_accelerate = "Accelerator(" in self.text
        f.uses_hf_trainer = bool(re.search(r"\bTrainer\(|SFTTrainer|Seq2SeqTrainer|TrainingArguments", self.text))
        f.saves_model = bool(re.search(r"\.save_model\(|\.get_state_dict\(", self.text)) and \
            (f.uses_hf_trainer or "Accelerator(" in self.text)
        f.saves_16bit = bool(re.search(r"\.save_(16bit|fp16)_model\(", self.text))
        f.unwrapped_save = next((c.lineno for c in self._calls() if _call_name(c)[1] == "save_pretrained" and
                                 isinstance(c.func, ast.Attribute) and isinstance(c.func.value, ast.Call) and
                                 _call_name(c.func.value)[1] == "unwrap_model" and
                                 not any(k.arg in ("state_dict", None) for k in c.keywords)), 0)
        if "DummyScheduler" not in self.text:  # a scheduler built in code and handed to accelerator.prepare
            prepared = {a.id for c in self._calls() if _call_name(c)[1] == "prepare" and "accelerator" in
                        _call_name(c)[0].lower() for a in c.args if isinstance(a, ast.Name)}
            f.own_scheduler_line = next((n.lineno for n in self.nodes if isinstance(n, ast.Assign) and
                                         isinstance(n.value, ast.Call) and (_call_name(n.value)[1] == "get_scheduler"
                                                                            or _call_name(n.value)[0].endswith("lr_scheduler"))
                                         and any(isinstance(t, ast.Name) and t.id in prepared for t in n.targets)), 0)
        self._device_facts()
        for call in self._calls():
            recv, name = _call_name(call)
            # deepspeed.initialize, imported bare, or reached through another name (self.ds.initialize): its
            # model_parameters= keyword is DeepSpeed's own (deepspeed/__init__.py initialize)
            if name == "initialize" and (recv == "deepspeed" or (not recv and "deepspeed" in self.text) or
                                         any(k.arg == "model_parameters" for k in call.keywords)):
                f.raw_ds_init = True
                f.ds_init_line = f.ds_init_line or call.lineno
                if any(k.arg == "optimizer" for k in call.keywords) or len(call.args) >= 4:
                    f.ds_client_optimizer = True
            if name == "Accelerator":
                for k in call.keywords:
                    if k.arg == "gradient_accumulation_steps":
                        f.accelerator_grad_accum = (call.lineno, _src(k.value))
            parent = self.parents.get(call)
            cast = isinstance(parent, ast.Attribute) and parent.attr in ("to", "half", "bfloat16", "type", "double")
            if recv == "torch" and name in ("randn", "rand", "zeros", "ones", "empty", "full") and not cast and \
                    not any(k.arg == "dtype" for k in call.keywords):
                f.float_inputs.append(call.lineno)

    def _device_facts(self) -> None:
        """:attr:`PyFacts.device_params` (this file's module-level functions whose parameter becomes a CUDA device:
        ``torch.cuda.set_device(p)``, ``device_ids=[p]``, ``torch.device("cuda", p)``) and
        :attr:`PyFacts.global_rank_args` (calls of functions defined elsewhere given the global rank), for
        :func:`helpers.lint.cross_rules.device_from_global_rank_across`."""
        f = self.facts
        for fn in getattr(self.tree, "body", []):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            params = [a.arg for a in fn.args.args]
            used: set[int] = set()
            for c in (n for n in subtree(fn) if isinstance(n, ast.Call)):
                recv, name = _call_name(c)
                args: list[ast.AST] = []
                if name == "set_device":
                    args += c.args[:1]
                if name == "device" and recv == "torch":
                    args += c.args[1:2]
                for k in c.keywords:
                    if k.arg == "device_ids" and isinstance(k.value, (ast.List, ast.Tuple)):
                        args += k.value.elts
                used.update(params.index(a.id) for a in args if isinstance(a, ast.Name) and a.id in params)
            if used:
                f.device_params[fn.name] = used
        for call in self._calls():
            _recv, name = _call_name(call)
            if name in self.functions or not name:
                continue
            for i, a in enumerate(call.args):
                if self.taint.is_global_rank(a):
                    f.global_rank_args.append((name, i, call.lineno, _src(a)))
        self._rank_init_facts()

    def _rank_init_facts(self) -> None:
        """:attr:`PyFacts.uninit_rank_funcs` (module-level functions that return constants while
        ``torch.distributed.is_initialized()`` is False and ``get_rank()`` after) and :attr:`PyFacts.rank_before_init`
        (a rank taken from a function call, then the process group initialised later in the same function), for
        :func:`helpers.lint.cross_rules.rank_before_init_across`."""
        f = self.facts
        for fn in getattr(self.tree, "body", []):
            if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
                continue
            body = self.source_lines(fn)
            if "is_initialized()" in body and "get_rank()" in body and any(
                    isinstance(n, ast.If) and "is_initialized()" in ast.unparse(n.test) and
                    any(isinstance(r, ast.Return) and r.value is not None and all(
                        isinstance(e, ast.Constant) for e in (r.value.elts if isinstance(r.value, ast.Tuple) else [r.value]))
                        for r in n.body) for n in subtree(fn)):
                f.uninit_rank_funcs.add(fn.name)
        for fn in self.functions.values():
            inits = [c for c in subtree(fn) if isinstance(c, ast.Call) and _PG_INIT.search(_call_name(c)[1] or "")]
            if not inits:
                continue
            first = min(inits, key=lambda c: c.lineno)
            for node in subtree(fn):
                if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)) or node.lineno >= first.lineno:
                    continue
                names = [t.id for t in flat_targets(node) if isinstance(t, ast.Name)]
                if any("rank" in n.lower() for n in names):
                    f.rank_before_init.append((_call_name(node.value)[1], node.lineno, first.lineno, _src(first)[:60]))


SHORT_INIT_TIMEOUT_S = 60.0
"""A process-group timeout of at most this many seconds is shorter than the work one rank does while the others wait
(an evaluation, a download, a checkpoint take minutes; NCCL also connects lazily at the first collective), the same
bound the NCCL log reader uses for a watchdog timeout (``helpers.nccl_log.rules.SHORT_TIMEOUT_MS``); PyTorch's default
is 10 minutes for nccl (https://docs.pytorch.org/docs/stable/distributed.html#torch.distributed.init_process_group)."""
_TIMEDELTA_UNITS = {"days": 86400.0, "seconds": 1.0, "microseconds": 1e-6, "milliseconds": 1e-3, "minutes": 60.0,
                    "hours": 3600.0, "weeks": 604800.0}


def _timedelta_seconds(expr: ast.AST) -> float | None:
    """Seconds of ``timedelta(seconds=60)`` / ``datetime.timedelta(minutes=5)`` / ``timedelta(0, 60)`` written with
    numbers only, else None (a value computed at run time)."""
    if not (isinstance(expr, ast.Call) and _call_name(expr)[1] == "timedelta"):
        return None
    total = 0.0
    order = ("days", "seconds", "microseconds", "milliseconds", "minutes", "hours", "weeks")
    for unit, arg in [*zip(order, expr.args), *((k.arg, k.value) for k in expr.keywords)]:
        if unit not in _TIMEDELTA_UNITS or not (isinstance(arg, ast.Constant) and isinstance(arg.value, (int, float))):
            return None
        total += _TIMEDELTA_UNITS[unit] * arg.value
    return total


_PG_INIT = re.compile(r"^(?:init_process_group|init_from_env|init_distributed\w*|initialize_distributed|"
                      r"setup_distributed|init_dist\w*|setup_ddp|ddp_setup|dist_init)$")
"""Calls that create the default process group (``torch.distributed.init_process_group`` and the usual wrappers:
torchtune's ``init_from_env``, ``init_distributed_mode``, ``setup_ddp``...)."""

_MAX_REPAIRS = 200


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" "))


_PAIRS = {"(": ")", "[": "]", "{": "}"}


def _close_brackets(lines: list[str], n: int) -> bool:
    """Close the brackets still open before line ``n`` (an excerpt cut inside a call) at the end of the last code
    line above it; True when something was closed.  Strings and comments are skipped roughly (no triple quotes)."""
    stack: list[str] = []
    last = -1
    for i in range(n):
        code = re.sub(r"#.*", "", re.sub(r"'(?:\\.|[^'\\])*'|\"(?:\\.|[^\"\\])*\"", "''", lines[i]))
        if code.strip():
            last = i
        for ch in code:
            if ch in _PAIRS:
                stack.append(_PAIRS[ch])
            elif ch in ")]}" and stack:
                stack.pop()
    if not stack or last < 0:
        return False
    lines[last] = lines[last].rstrip() + "".join(reversed(stack))
    return True


_FSTRING_START = re.compile(r"(?<![\w'\"])(?:[rR][fF]|[fF][rR]?)(['\"])")
PEP701 = "f-string in Python 3.12 syntax (PEP 701)"
"""The message :func:`repair` records for a line whose f-strings it blanked: quotes of the f-string's own kind, or
backslashes, inside its replacement fields (valid since Python 3.12, https://peps.python.org/pep-0701/)."""


def _blank_fstrings(line: str) -> str:
    """``line`` with each one-line f-string replaced by ``""``, read by PEP 701's rules (a replacement field may hold
    quotes of the f-string's own kind and backslashes: it ends at the closing quote met outside any ``{...}``), so
    that a parser older than Python 3.12 reads the rest of the line.  Triple-quoted f-strings are left as they are."""
    out, i = [], 0
    while True:
        m = _FSTRING_START.search(line, i)
        if m is None or line[m.end():m.end() + 2] == m.group(1) * 2:
            out.append(line[i:])
            return "".join(out)
        quote, j, depth = m.group(1), m.end(), 0
        while j < len(line):
            ch = line[j]
            if depth == 0 and ch == "\\":
                j += 2
                continue
            if ch == "{":
                depth = depth + 1 if not (depth == 0 and line[j + 1:j + 2] == "{") else depth
                j += 1 if depth else 2
                continue
            if ch == "}" and depth:
                depth -= 1
            elif ch == quote and depth == 0:
                break
            j += 1
        if j >= len(line):
            out.append(line[i:])
            return "".join(out)
        out.append(line[i:m.start()] + '""')
        i = j + 1


def repair(text: str) -> tuple[str, list[tuple[int, str]]]:
    """``text`` made parseable line by line, for excerpts (a snippet pasted from an issue, pseudo-code around it).

    Leading tabs become 4 spaces, code lines are dedented by their common indentation (comment lines do not
    count), and each line the parser rejects is re-indented (``unexpected indent``, ``unindent does not
    match``, ``expected an indented block``) or replaced, at its indentation, by ``pass`` (``if True:`` when it
    opens a block), up to 200 times.  Line numbers are kept, so findings point at the user's lines.

    Why home-made: no parser in the standard library or on PyPI recovers from errors and still gives the
    :mod:`ast` tree the rules walk (parso recovers, but into its own tree).

    Returns:
        ``(the text, [(line, the parser's message) for each line changed]``; the first entry is the original
        error.  ``ast.parse`` of the returned text succeeds, or raises after 200 repairs.
    """
    lines = [re.sub(r"^[ \t]+", lambda m: m.group(0).expandtabs(4), ln) for ln in text.split("\n")]
    code = [_indent(ln) for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]
    base = min(code) if code else 0
    lines = [ln[base:] if ln.strip() and not ln.lstrip().startswith("#") else ln for ln in lines]
    changed: list[tuple[int, str]] = []
    for _ in range(_MAX_REPAIRS):
        try:
            ast.parse("\n".join(lines))
            return "\n".join(lines), changed
        except SyntaxError as exc:
            n = (exc.lineno or 1) - 1
            if n >= len(lines):
                n = len(lines) - 1
            msg = str(exc.msg)
            changed.append((n + 1, msg))
            prev = next((lines[i] for i in range(n - 1, -1, -1) if lines[i].strip() and
                         not lines[i].lstrip().startswith("#")), "")
            line = lines[n]
            body = line.strip()
            if _close_brackets(lines, n):
                continue
            blanked = _blank_fstrings(line)
            if blanked != line and not any(m == PEP701 for k, m in changed[:-1] if k == n + 1):
                lines[n] = blanked
                changed[-1] = (n + 1, PEP701)
                continue
            if "unexpected indent" in msg:
                lines[n] = " " * _indent(prev) + body
            elif "expected an indented block" in msg:
                lines[n] = " " * (_indent(prev) + 4) + body
            elif "unindent does not match" in msg:
                levels = [_indent(lines[i]) for i in range(n) if lines[i].strip() and not lines[i].lstrip().startswith("#")]
                lines[n] = " " * max([lv for lv in levels if lv < _indent(line)] or [0]) + body
            elif body in ("pass", "if True:"):  # the error is elsewhere (an open bracket above): drop the line
                lines[n] = ""
            else:
                lines[n] = " " * _indent(line) + ("if True:" if body.endswith(":") else "pass")
    raise SyntaxError(f"more than {_MAX_REPAIRS} lines do not parse")


def lint_python(path: str, text: str, extra_rules: Sequence[Callable[[PythonLinter], None]] = (),
                ddp_params: dict[str, set[int | str]] | None = None,
                rank_seeds: RankSeeds | None = None,
                ddp_returns: dict[str, set[int | None]] | None = None) -> tuple[list[Check], PyFacts]:
    """Lint one Python file (``extra_rules``: see :meth:`PythonLinter.run`; ``ddp_params``, ``rank_seeds``,
    ``ddp_returns``: see
    :class:`PythonLinter` and :meth:`PythonLinter._seed_rank_from_other_files`).

    Returns:
        ``(findings, facts)``; a file that does not parse gives one ``python-syntax`` error finding.

    Raises:
        helpers.inputs.InputError: the file is nested too deeply to parse or analyse (the parser's
            ``MemoryError`` / ``RecursionError``, "too many nested parentheses").
    """
    try:
        try:
            linter = PythonLinter(path, text, ddp_params, rank_seeds, ddp_returns)
            return linter.run(extra_rules), linter.facts
        except SyntaxError as exc:
            if "too many nested" in str(exc.msg) or "too complex" in str(exc.msg):
                raise
            fixed, changed = repair(text)
            linter = PythonLinter(path, fixed, ddp_params, rank_seeds, ddp_returns)
            linter.text = text  # the regex-based checks read the user's text
            if changed and all(msg == PEP701 for _line, msg in changed):
                return linter.run(extra_rules), linter.facts  # valid Python 3.12 the running parser cannot read
            note = finding("python-syntax", "error", path, exc.lineno or 0,
                           f"cannot parse: {exc.msg}; {len(changed)} line(s) re-indented or skipped to analyse the "
                           "rest (an excerpt?)", "fix the syntax error", "https://docs.python.org/3/library/ast.html")
            return [note, *linter.run(extra_rules)], linter.facts
    except SyntaxError as exc:
        if "too many nested" in str(exc.msg) or "too complex" in str(exc.msg):
            raise InputError(path, f"too deeply nested to analyse (Python's parser: {exc.msg})") from None
        return [finding("python-syntax", "error", path, exc.lineno or 0, f"cannot parse: {exc.msg}",
                        "fix the syntax error", "https://docs.python.org/3/library/ast.html")], PyFacts(path)
    except (RecursionError, MemoryError):
        raise InputError(path, "too deeply nested to analyse (an expression or block nested deeper than the parser "
                         "or the analysis can follow)") from None
