"""Python-script rules taken from the APIs' documented preconditions (helpers.lint.contracts), and the facts the
cross-file contract rules (:mod:`helpers.lint.cross_rules`) need: the script's argparse options, its backend,
how it learns its rank and device.

Each rule names the documentation URL it comes from (the ``source`` of the finding).  They run on a
:class:`helpers.lint.python_rules.PythonLinter` after its own rules (same tree, parents, taint and suppressions).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from helpers.lint import agreement_rules, engine_args_rules, grad_sync_rules, signature_rules
from helpers.lint.contracts import _ACC, _COLL, _DATA, _DDP, _DIST, _FABRIC, _FSDP, _INIT, _SBATCH_ENV, _TORCHRUN
from helpers.lint.wrappers import accelerator_prepare, assign_targets

if TYPE_CHECKING:
    from helpers.lint.python_rules import PythonLinter

DEEPSPEED_ARGS = {"--deepspeed", "--deepspeed_config", "--deepscale", "--deepscale_config"}
"""What ``deepspeed.add_config_arguments(parser)`` adds (deepspeed/__init__.py ``_add_core_arguments``)."""


_NO_VALUE_ACTIONS = {"store_true", "store_false", "store_const", "append_const", "count", "help", "version",
                     "BooleanOptionalAction"}
"""argparse actions that take no value on the command line (https://docs.python.org/3/library/argparse.html#action)."""


@dataclass
class ScriptContract:
    """What a script declares about how it is launched (for the launch line <-> script rules).

    Attributes:
        options: argparse option strings the script accepts (``--lr``, ``--local_rank``...); ``None`` when the
            script does not parse with a plain ``argparse.ArgumentParser().parse_args()`` (unknown: no rule).
        options_line: the line of ``parse_args()`` (0: none).
        local_rank_arg: the script defines ``--local_rank`` / ``--local-rank``.
        reads_local_rank_env: the script reads ``LOCAL_RANK`` (or a launcher's per-process variable) itself.
        uses_args_local_rank: ``args.local_rank`` (or ``opt.local_rank``...) is read.
        backend: the ``init_process_group`` backend when written as a constant (``nccl``, ``gloo``), else "".
        init_line: the line of ``init_process_group`` (0: none).
        env_init: ``init_process_group`` reads its rank and world size from the environment (no ``rank=``,
            ``world_size=``, no ``tcp://`` / ``file://`` method, no store) and the script does not set them.
        spawns: the script starts its own processes (``mp.spawn``, ``start_processes``, ``Process``).
        trainer: ``(line, devices, num_nodes)`` of a Lightning ``Trainer(...)`` with integer constants.
    """

    options: set[str] | None = None
    options_line: int = 0
    local_rank_arg: bool = False
    reads_local_rank_env: bool = False
    uses_args_local_rank: bool = False
    backend: str = ""
    init_line: int = 0
    env_init: bool = False
    spawns: bool = False
    trainer: tuple[int, int | None, int | None] | None = None
    extra: dict[str, object] = field(default_factory=dict)


def _const(node: ast.AST | None) -> object:
    return node.value if isinstance(node, ast.Constant) else None


def _kw(call: ast.Call, name: str) -> ast.AST | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def script_contract(lt: PythonLinter) -> ScriptContract:
    """The launch-facing facts of the script ``lt`` lints."""
    from helpers.lint.python_rules import _call_name

    sc = ScriptContract()
    text = lt.text
    calls = lt._calls()
    names = [(_call_name(c), c) for c in calls]
    plain_argparse = "ArgumentParser(" in text and not re.search(
        r"parse_args_into_dataclasses|add_subparsers|parents\s*=|fromfile_prefix_chars|jsonargparse|"
        r"LightningCLI|hydra|fire\.Fire|typer|click|tyro|simple_parsing|OmegaConf\.from_cli|absl", text)
    # parse_known_args() keeps unknown arguments, so the script accepts anything, unless its leftovers go on to a
    # strict parse_args(rest) (timm's config-file pre-parser: `cfg, rest = config_parser.parse_known_args()` then
    # `parser.parse_args(rest)`), which rejects what neither parser defines
    # (https://docs.python.org/3/library/argparse.html#partial-parsing)
    leftovers = {t.elts[1].id for n in lt.nodes if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                 and _call_name(n.value)[1] == "parse_known_args" for t in n.targets
                 if isinstance(t, ast.Tuple) and len(t.elts) == 2 and isinstance(t.elts[1], ast.Name)}
    known_only = "parse_known_args" in text
    options: set[str] = set()
    defaults: dict[str, str] = {}
    required: list[tuple[tuple[str, ...], int]] = []
    positionals = 0
    arity: dict[str, int | None] = {}
    dynamic = False
    for (recv, name), c in names:
        if name == "add_argument":
            strs = [a.value for a in c.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if len(strs) != len(c.args):
                dynamic = True
            options.update(s for s in strs if s.startswith("-"))
            default = _const(_kw(c, "default"))
            longs = [x for x in strs if x.startswith("--")]
            if _const(_kw(c, "required")) is True and strs and all(s.startswith("-") for s in strs):
                required.append((tuple(strs), c.lineno))
            if strs and not strs[0].startswith("-"):
                positionals += 1
            action, nargs = _const(_kw(c, "action")), _kw(c, "nargs")
            takes: int | None = 0 if action in _NO_VALUE_ACTIONS else 1 if nargs is None else None
            if _kw(c, "action") is not None and action is None:
                takes = None  # a custom Action class: its arity is its own
            arity.update({s: takes for s in strs if s.startswith("-")})
            if isinstance(default, str) and longs:
                defaults[longs[0][2:].replace("-", "_")] = default
        elif name == "add_config_arguments":
            options.update(DEEPSPEED_ARGS)
        elif name in ("parse_args",) and not sc.options_line and (
                (not c.args and not known_only) or
                (len(c.args) == 1 and isinstance(c.args[0], ast.Name) and c.args[0].id in leftovers)):
            sc.options_line = c.lineno
        elif name in ("add_argument_group", "add_mutually_exclusive_group", "set_defaults"):
            pass
        elif name == "init_process_group":
            sc.init_line = sc.init_line or c.lineno
            backend = _kw(c, "backend") or (c.args[0] if c.args else None)
            if isinstance(backend, ast.Name):  # backend = 'nccl' once at the top (nanoGPT's config block)
                one = _assigned_once(lt, backend.id, c)
                backend = one.value if one is not None else backend
            if isinstance(_const(backend), str):
                sc.backend = str(_const(backend)).lower()
            method = _const(_kw(c, "init_method"))
            explicit = any(k.arg in ("store",) or k.arg is None for k in c.keywords) or len(c.args) > 1 or \
                (isinstance(method, str) and not method.startswith("env://")) or \
                (_kw(c, "init_method") is not None and method is None)
            sc.env_init = not explicit  # env:// reads MASTER_ADDR/MASTER_PORT (and RANK/WORLD_SIZE unless given)
            if isinstance(backend, ast.Attribute) and not sc.backend:
                sc.extra["backend_attr"] = backend.attr
        elif name in ("spawn", "start_processes", "Process", "launch", "elastic_launch", "notebook_launcher"):
            sc.spawns = True
        elif name == "set_device" and "cuda" in recv and c.args:
            # the same GPU on every rank of a node, unless the call sits in a branch on the rank (-1: not launched)
            fixed = isinstance(_const(c.args[0]), int) and not _under_rank_test(lt, c)
            sc.extra.setdefault("const_device", (c.lineno, ast.unparse(c)) if fixed else None)
            if not fixed:
                sc.extra["const_device"] = None
        elif name == "Trainer" and "lightning" in text:
            dev, nodes = _const(_kw(c, "devices")), _const(_kw(c, "num_nodes"))
            sc.trainer = (c.lineno, dev if isinstance(dev, int) else None, nodes if isinstance(nodes, int) else None)
    if sc.env_init and re.search(r"environ\[\s*['\"](RANK|WORLD_SIZE|MASTER_ADDR)['\"]\s*\]\s*=|"
                                 r"environ\.setdefault\(\s*['\"](RANK|MASTER_ADDR)|"
                                 r"SLURM_PROCID|OMPI_COMM_WORLD_RANK|PMI_RANK|MPI\.COMM_WORLD|mpi4py|"
                                 r"environ\.update\(", text):
        sc.env_init = False  # the script supplies RANK / WORLD_SIZE itself
    if not sc.backend and sc.extra.get("backend_attr") in defaults:
        sc.backend = defaults[str(sc.extra["backend_attr"])].lower()  # backend=args.dist_backend, default 'nccl'
    sc.extra["sets_visible_devices"] = "CUDA_VISIBLE_DEVICES" in text
    sc.local_rank_arg = bool({"--local_rank", "--local-rank"} & options)
    sc.extra["literal_options"] = frozenset(options)  # the option strings written out, even where others are added
    if plain_argparse and "HfArgumentParser" in text and sc.options_line:
        # HfArgumentParser is an ArgumentParser whose options come from dataclasses: read only a parse_args() whose
        # parser was last bound to a plain ArgumentParser (Firefly: argparse for --train_args_file, then
        # HfArgumentParser(...).parse_json_file)
        call = next(c for (_r, n), c in names if n == "parse_args" and c.lineno == sc.options_line)
        recv = call.func.value if isinstance(call.func, ast.Attribute) else None
        binds = [a for a in lt.nodes if isinstance(a, ast.Assign) and a.lineno < call.lineno and isinstance(recv, ast.Name)
                 and any(isinstance(x, ast.Name) and x.id == recv.id for x in a.targets)
                 and isinstance(a.value, ast.Call)]
        last = max(binds, key=lambda a: a.lineno, default=None)
        plain_argparse = last is not None and _call_name(last.value)[1] == "ArgumentParser"
    if plain_argparse and sc.options_line and not dynamic:
        sc.options = options
        sc.extra["required_options"] = tuple(required)
        sc.extra["positionals"] = positionals
        sc.extra["arity"] = arity
    sc.reads_local_rank_env = bool(re.search(r"['\"](LOCAL_RANK|SLURM_LOCALID|OMPI_COMM_WORLD_LOCAL_RANK|MPI_LOCALRANKID)"
                                             r"['\"]", text))
    sc.uses_args_local_rank = bool(re.search(r"\b(args|opt|opts|cfg|config|hparams|params)\.local_rank\b", text))
    if "raise" in text and "environ" in text or "getenv" in text:
        sc.extra["env_required"] = _env_requirements(lt)
    return sc


def _env_requirements(lt: PythonLinter) -> list[tuple[str, str, str, int, str]]:
    """What the script itself refuses to run without: a ``raise`` under both a test of an environment variable against
    a constant (``os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS') != "1"``) and a test of an option
    (``args.sequence_parallel``), as Megatron-LM's arguments.py does.  ``[(variable, value, --option, line, message)]``
    for :func:`helpers.lint.cross_rules.env_required_across`, which checks the launch scripts that pass the option."""
    from helpers.lint.python_rules import _env_key

    out: list[tuple[str, str, str, int, str]] = []
    for node in lt.nodes:
        if not isinstance(node, ast.Raise):
            continue
        env: tuple[str, str] | None = None
        option = ""
        p = lt.parents.get(node)
        while p is not None and not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
            tests = [p.test] if isinstance(p, ast.If) else []
            for t in tests:
                parts = t.values if isinstance(t, ast.BoolOp) and isinstance(t.op, ast.And) else [t]
                for part in parts:
                    if isinstance(part, ast.Compare) and len(part.ops) == 1 and isinstance(part.ops[0], ast.NotEq) \
                            and isinstance(part.comparators[0], ast.Constant) and (key := _env_key(part.left)):
                        env = (key, str(part.comparators[0].value))
                    elif isinstance(part, ast.Attribute) and isinstance(part.value, ast.Name) and not option:
                        option = "--" + part.attr.replace("_", "-")
            p = lt.parents.get(p)
        if env and option:
            msg = " ".join(str(a.value) for a in ast.walk(node) if isinstance(a, ast.Constant) and isinstance(a.value, str))
            out.append((env[0], env[1], option, node.lineno, msg[:160]))
    return out


def _under_rank_test(lt: PythonLinter, node: ast.AST) -> bool:
    """``node`` sits in a branch whose test reads a rank (``if local_rank == -1:`` included)."""
    p = lt.parents.get(node)
    while p is not None and not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if isinstance(p, (ast.If, ast.IfExp)) and lt.taint.is_rank(p.test):
            return True
        p = lt.parents.get(p)
    return False


def rule_dataloader_sampler_and_shuffle(lt: PythonLinter) -> None:
    """DataLoader(sampler=..., shuffle=True): 'sampler option is mutually exclusive with shuffle' (ValueError)."""
    from helpers.lint.python_rules import _call_name

    for c in lt._calls():
        if _call_name(c)[1] != "DataLoader":
            continue
        sampler, shuffle = _kw(c, "sampler"), _kw(c, "shuffle")
        if sampler is None or isinstance(sampler, ast.Constant):
            continue  # no sampler, or sampler=None
        if sampler is not None and _const(shuffle) is True:
            lt.add("dataloader-sampler-and-shuffle", "error", c,
                   "DataLoader(sampler=..., shuffle=True): 'ValueError: sampler option is mutually exclusive with "
                   "shuffle' (the DistributedSampler shuffles)", "drop shuffle=True; pass shuffle= to the sampler",
                   _DATA + "#torch.utils.data.DataLoader")


def rule_init_contract(lt: PythonLinter, sc: ScriptContract) -> None:
    """init_process_group: rank/world_size with tcp:// or a store; nothing distributed before it."""
    from helpers.lint.python_rules import _call_name

    for c in lt._calls():
        if _call_name(c)[1] != "init_process_group":
            continue
        method = _const(_kw(c, "init_method"))
        uses_store = _kw(c, "store") is not None
        if (isinstance(method, str) and method.startswith(("tcp://", "file://")) or uses_store) and \
                not any(k.arg is None for k in c.keywords) and len(c.args) <= 2:
            missing = [k for k in ("rank", "world_size") if _kw(c, k) is None]
            if missing:
                lt.add("init-missing-rank-world-size", "error", c,
                       f"init_process_group({'store' if uses_store else method}) without {' and '.join(missing)}: "
                       "with a tcp:// or file:// method or a store, rank and world_size must be given "
                       "('ValueError: ... rank ... world_size ... required')",
                       "pass rank=int(os.environ['RANK']), world_size=int(os.environ['WORLD_SIZE']), or use "
                       "init_method='env://' under torchrun", _INIT)
    _collective_before_init(lt)
    _collective_without_group_on_one_process(lt)


_NEEDS_GROUP = {"get_rank", "get_world_size", "barrier", "all_reduce", "all_gather", "broadcast", "reduce",
                "DistributedDataParallel", "DDP", "DistributedSampler", "new_group", "all_gather_object"}


def _collective_before_init(lt: PythonLinter) -> None:
    """A statement before ``init_process_group`` in the same block that needs the default group."""
    from helpers.lint.python_rules import _call_name

    for node in lt.nodes:
        for fld in ("body", "orelse"):
            block = getattr(node, fld, None)
            if not isinstance(block, list):
                continue
            init_at = next((i for i, s in enumerate(block) if isinstance(s, (ast.Expr, ast.Assign)) and
                            isinstance(s.value, ast.Call) and _call_name(s.value)[1] == "init_process_group"), None)
            if not init_at:
                continue
            for stmt in block[:init_at]:
                if not isinstance(stmt, (ast.Expr, ast.Assign, ast.AnnAssign, ast.AugAssign)):
                    continue  # a branch may guard it (if dist.is_initialized())
                for c in (n for n in ast.walk(stmt) if isinstance(n, ast.Call)):
                    recv, name = _call_name(c)
                    if name not in _NEEDS_GROUP or (name in ("reduce", "broadcast", "all_reduce", "barrier")
                                                    and recv not in ("dist", "torch.distributed")):
                        continue
                    if name == "DistributedSampler" and _kw(c, "num_replicas") is not None:
                        continue
                    if name in lt.functions and recv in ("", "self", "cls"):
                        continue  # the file's own get_rank() (one that reads RANK from the environment), not dist's
                    lt.add("collective-before-init", "error", c,
                           f"{(recv + '.') if recv else ''}{name}() runs before init_process_group (line "
                           f"{block[init_at].lineno}): 'Default process group has not been initialized, please make "
                           "sure to call init_process_group'", "call init_process_group first", _INIT)
                    break


_INIT_HELPER = re.compile(r"(?i)^(init_process_group|setup_dist\w*|init_dist\w*|dist_init\w*|setup_ddp|"
                          r"init_distributed\w*|setup_distributed\w*)$")
_MULTI_TEST = re.compile(r"(?i)world_size|distributed|is_initialized|\bddp\b|use_ddp|n_?gpus?\b|num_gpus|"
                         r"gpu_count|device_count|parallel|multi_?gpu|num_processes")
_GROUP_COLLECTIVES = {"barrier", "all_reduce", "all_gather", "broadcast", "reduce", "gather", "scatter",
                      "all_gather_object", "broadcast_object_list", "gather_object", "reduce_scatter", "all_to_all"}


def _under_multi_test(lt: PythonLinter, node: ast.AST) -> bool:
    """``node`` runs only when several processes run: in the body of ``if world_size > 1:`` (``if args.distributed``,
    ``if dist.is_initialized()``...), or in the ``else`` of its negation (``if world_size == 1: ... else:``)."""
    child, p = node, lt.parents.get(node)
    while p is not None:
        if isinstance(p, (ast.If, ast.IfExp, ast.While)) and _MULTI_TEST.search(ast.unparse(p.test)):
            inverted = bool(re.search(r"^not\b|==\s*1\b|<=\s*1\b|<\s*2\b", ast.unparse(p.test)))
            in_body = child is p.body or (isinstance(p.body, list) and child in p.body)
            in_else = child is p.orelse or (isinstance(p.orelse, list) and child in p.orelse)
            if (in_body and not inverted) or (in_else and inverted):
                return True
        child, p = p, lt.parents.get(p)
    return False


def _reached_unguarded(lt: PythonLinter, fn: ast.AST, depth: int = 0) -> bool:
    """Some call of the function ``fn`` in this file (``fn(...)``, ``obj.fn(...)``) runs under no test of the process
    count, directly or through a caller that is itself so reached (three levels); False when nothing here calls it."""
    from helpers.lint.python_rules import _call_name

    name = getattr(fn, "name", None)
    for c in lt._calls():
        if _call_name(c)[1] != name or c in ast.walk(fn):
            continue
        if _under_multi_test(lt, c):
            continue
        caller = lt._enclosing_function(c)
        if caller is None or depth >= 3 or _reached_unguarded(lt, caller, depth + 1):
            return True
    return False


def _collective_without_group_on_one_process(lt: PythonLinter) -> None:
    """The group is made only for several processes (``if world_size > 1: setup_dist(...)``, no ``else``) and a
    ``torch.distributed`` collective elsewhere in the file runs under no such test: the one-process run (``run(rank=0,
    world_size=1)``) reaches it with no default group and stops with "Default process group has not been
    initialized" (``_INIT``; lifeiteng/vall-e: ``torch.distributed.barrier()`` after each checkpoint, fixed by
    ``if world_size > 1:``).  One finding, at the first such collective."""
    from helpers.lint.python_rules import _call_name

    def count_test(test: ast.AST) -> bool:  # a test of the process count; `if not is_initialized()` is an
        src = ast.unparse(test)               # init-once guard, not one
        return bool(_MULTI_TEST.search(src)) and not re.search(r"not\s+[\w.]*is_initialized\(", src)

    conditional = [n for n in lt.nodes if isinstance(n, ast.If) and count_test(n.test)
                   and not n.orelse and any(isinstance(c, ast.Call) and _INIT_HELPER.match(_call_name(c)[1])
                                            for s in n.body for c in ast.walk(s))]
    if not conditional or any(isinstance(c, ast.Call) and _INIT_HELPER.match(_call_name(c)[1]) and
                              not any(isinstance(a, ast.If) and count_test(a.test) for a in _ancestors(lt, c))
                              for c in lt._calls()):
        return  # the group is made unconditionally somewhere too
    for c in lt._calls():
        recv, name = _call_name(c)
        if name not in _GROUP_COLLECTIVES or recv not in ("dist", "torch.distributed"):
            continue
        if _under_multi_test(lt, c):
            continue
        fn = lt._enclosing_function(c)
        if fn is not None and any(isinstance(s, ast.If) and s.lineno < c.lineno and
                                  _MULTI_TEST.search(ast.unparse(s.test)) and
                                  any(isinstance(b, (ast.Return, ast.Raise)) for b in s.body) for s in ast.walk(fn)):
            continue  # an early return for the one-process case
        if fn is not None and not _reached_unguarded(lt, fn):
            continue  # called only under a process-count test (`if args.distributed: top1.all_reduce()`), or not here
        init = conditional[0]
        lt.add("collective-before-init", "error", c,
               f"{recv}.{name}() runs under no test of the process count, while the group is made only under `"
               f"{ast.unparse(init.test)[:40]}` (line {init.lineno}): the one-process run reaches it with no group "
               "('Default process group has not been initialized, please make sure to call init_process_group')",
               f"guard it like the set-up: if {ast.unparse(init.test)[:40]}: {recv}.{name}()", _INIT)
        return


_EMA_CTORS = {"ModelEma", "ModelEmaV2", "ModelEmaV3", "AveragedModel", "EMAModel"}
_TIMM_EMA = "https://github.com/huggingface/pytorch-image-models/blob/main/timm/utils/model_ema.py"


def rule_ema_before_to_device(lt: PythonLinter) -> None:
    """An EMA copy of the model (timm's ``ModelEma*``, ``torch.optim.swa_utils.AveragedModel``, diffusers'
    ``EMAModel``) made before the model is moved to its GPU (``model.to(device)`` / ``model.cuda()`` later in the
    same function), with no device of its own: the copy is taken where the model is then (the CPU) and stays there,
    so each update mixes CPU and CUDA tensors, or the average runs on the CPU.  timm's ModelEma: "create EMA model
    after cuda(), DP wrapper, and AMP but before SyncBN and DDP wrapper" (``_TIMM_EMA``); AveragedModel deep-copies
    the module onto ``device`` only when given one.  Not where the constructor is given a device that is set
    (a ``device=''`` or ``None`` is no device)."""
    from helpers.lint.python_rules import _call_name

    if not any(name in lt.text for name in _EMA_CTORS):
        return
    for c in lt._calls():
        if _call_name(c)[1] not in _EMA_CTORS or not c.args or not isinstance(c.args[0], ast.Name):
            continue
        device = _kw(c, "device")
        if device is not None and not (isinstance(device, ast.Constant) and device.value in ("", None)) and \
                not isinstance(device, ast.IfExp):
            continue
        if isinstance(device, ast.IfExp) and not any(isinstance(b, ast.Constant) and b.value in ("", None)
                                                     for b in (device.body, device.orelse)):
            continue
        model = c.args[0].id
        fn = lt._enclosing_function(c) or lt.tree
        moved = sorted((m for m in ast.walk(fn) if isinstance(m, ast.Call) and m.lineno > c.lineno and
                        isinstance(m.func, ast.Attribute) and m.func.attr in ("to", "cuda") and
                        isinstance(m.func.value, ast.Name) and m.func.value.id == model), key=lambda m: m.lineno)
        if not moved or any(isinstance(m, ast.Call) and isinstance(m.func, ast.Attribute) and
                            m.func.attr in ("to", "cuda") and isinstance(m.func.value, ast.Name) and
                            m.func.value.id == model and m.lineno < c.lineno for m in ast.walk(fn)):
            continue  # never moved after, or already on its device before the copy
        lt.add("ema-before-to-device", "warning", c,
               f"{_call_name(c)[1]}({model}, ...) copies the model here, before {ast.unparse(moved[0])[:40]} (line "
               f"{moved[0].lineno}) moves it to the GPU: the EMA copy stays on the CPU (updates mix CPU and CUDA "
               "tensors, or average on the CPU)",
               f"create it after {ast.unparse(moved[0])[:40]}, or give it device=", _TIMM_EMA)


def rule_nccl_no_device_binding(lt: PythonLinter, sc: ScriptContract) -> None:
    """nccl with no per-rank device: every rank of a node computes (and talks NCCL) on cuda:0."""
    from helpers.lint.python_rules import _call_name
    from helpers.lint.wrappers import DDP_CTOR

    text = re.sub(r"#.*", "", lt.text)  # what the code does, not what its comments say
    own = bool(re.search(r"set_device|torch\.cuda\.device\(|device_id\s*=|CUDA_VISIBLE_DEVICES|Accelerator\(|"
                         r"deepspeed\.initialize|init_device_mesh|Fabric\(", text))
    trainer = bool(re.search(r"Trainer\(", text))  # Lightning's / HF's Trainer binds it (not a class of the case's own)
    binds = own or trainer
    # for the case-wide form (cross_rules.nccl_unbound_across_files)
    sc.extra["binds_device"] = own
    sc.extra["calls_trainer"] = trainer and bool(re.search(r"(?<!class )\bTrainer\(", text))
    sc.extra["defines_trainer"] = "Trainer" in lt.functions or any(
        isinstance(n, ast.ClassDef) and n.name == "Trainer" for n in lt.nodes)
    sc.extra["ddp_device_ids"] = next((c.lineno for c in lt._calls() if DDP_CTOR.match(_call_name(c)[1])
                                       and any(k.arg == "device_ids" for k in c.keywords)), 0)
    if sc.backend != "nccl" or sc.spawns:
        return
    if binds:
        return  # the device is bound (or a framework binds it)
    bare = re.search(r"\.cuda\(\)|\.to\(\s*['\"]cuda['\"]\s*\)|device\s*=\s*['\"]cuda['\"]|"
                     r"torch\.device\(\s*['\"]cuda['\"]\s*\)", text)
    per_rank = re.search(r"f['\"]cuda:\{[^}]*local_rank[^}]*\}['\"]|torch\.device\(\s*['\"]cuda['\"]\s*,\s*\w*local_rank",
                         text)
    if per_rank:  # 'cuda' elsewhere is then the one-process default the rank's device replaces
        # the tensors go to cuda:<local_rank>, the current device stays cuda:0: what NCCL runs on the current
        # device (barrier, the object collectives, which move their pickles to torch.cuda.current_device())
        # runs on GPU 0 from every rank of the node (karpathy/nanoGPT#116 added the set_device)
        lt.add("nccl-no-device-binding", "warning", text.count("\n", 0, per_rank.start()) + 1,
               f"'{per_rank.group(0)}' places the tensors, but nothing sets the current CUDA device "
               "(torch.cuda.set_device / device_id=): under nccl, barrier() and the object collectives "
               "(all_gather_object, broadcast_object_list) use torch.cuda.current_device(), which is cuda:0 on "
               "every rank of a node",
               "torch.cuda.set_device(device) right after choosing it, before init_process_group (or "
               "init_process_group(..., device_id=device))", _DIST + "#torch.distributed.all_gather_object")
        return
    if not bare:
        return
    lt.add("nccl-no-device-binding", "error", text.count("\n", 0, bare.start()) + 1,
           f"'{bare.group(0)}' under the nccl backend with no torch.cuda.set_device(local_rank) (nor device_id=) "
           "anywhere: 'cuda' is cuda:0 on every rank of a node, so NCCL binds them all to GPU 0 ('Duplicate GPU "
           "detected', or a hang in the first collective)",
           "local_rank = int(os.environ['LOCAL_RANK']); torch.cuda.set_device(local_rank) before "
           "init_process_group", _DIST + "#torch.distributed.all_gather_object")


_BINDS = re.compile(r"set_device|device_id\s*=|CUDA_VISIBLE_DEVICES|torch\.cuda\.device\(")


def _collective_before_engine_binds(lt: PythonLinter) -> None:
    """``deepspeed.init_distributed()`` (nccl on CUDA: ``get_accelerator().communication_backend_name()``), then a
    collective in the same block (``if get_rank() != 0: dist.barrier()``, rank 0 downloading first) before
    ``deepspeed.initialize``, with no device bound anywhere in the file: the engine binds each rank's GPU only inside
    ``initialize`` (``get_accelerator().set_device(local_rank)``), so that collective runs while every rank's current
    device is cuda:0 and each rank builds its NCCL communicator there (deepspeedai/DeepSpeedExamples#931 added
    ``get_accelerator().set_device(local_rank)`` before ``init_distributed``)."""
    from helpers.lint.python_rules import _call_name

    if "init_distributed" not in lt.text or _BINDS.search(re.sub(r"#.*", "", lt.text)):
        return
    for n in lt.nodes:
        block = getattr(n, "body", None)
        if not isinstance(block, list):
            continue
        init = next((i for i, s in enumerate(block) if isinstance(s, ast.Expr) and isinstance(s.value, ast.Call)
                     and _call_name(s.value)[1] == "init_distributed" and "deepspeed" in _call_name(s.value)[0]
                     and not any(k.arg in ("dist_backend",) and ast.unparse(k.value) not in ("'nccl'", '"nccl"')
                                 for k in s.value.keywords)), None)
        if init is None:
            continue
        for stmt in block[init + 1:]:
            calls = lt._calls(stmt)
            if any(_call_name(c)[1] == "initialize" and "deepspeed" in _call_name(c)[0] for c in calls):
                break
            if isinstance(stmt, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                continue
            hit = next((c for c in calls if lt.collective_name(c)), None)
            if hit is not None:
                lt.add("collective-before-set-device", "warning", hit,
                       f"{lt.collective_name(hit)} runs after deepspeed.init_distributed() (line {block[init].lineno}) "
                       "and before deepspeed.initialize binds each rank's GPU: every rank's current device is still "
                       "cuda:0, so each builds its NCCL communicator and buffers on GPU 0",
                       "get_accelerator().set_device(local_rank) (or torch.cuda.set_device) before init_distributed",
                       _DIST + "#torch.distributed.all_gather_object")
                return


def rule_collective_before_set_device(lt: PythonLinter) -> None:
    """A collective earlier in the same block than ``torch.cuda.set_device``, in a file that uses nccl: the collective
    runs while every rank's current device is still cuda:0, so NCCL sets up its communicator and buffers there (the
    docs: "the device used is given by torch.cuda.current_device() and it is the user's responsibility to ensure that
    this is set so that each rank has an individual GPU, via torch.cuda.set_device()", ``_DIST`` all_gather_object;
    allenai/OLMo#720 measured the extra memory on GPU 0)."""
    from helpers.lint.python_rules import _call_name

    _collective_before_engine_binds(lt)
    if "nccl" not in lt.text or "set_device" not in lt.text:
        return

    def sets_device(s: ast.AST) -> bool:
        return any(_call_name(c)[1] == "set_device" and "cuda" in _call_name(c)[0] for c in lt._calls(s))

    blocks = [b for b in (getattr(n, "body", None) for n in lt.nodes) if isinstance(b, list)]
    for block in blocks:  # the device is bound before the group exists: every later collective uses it
        init = next((i for i, s in enumerate(block) if any(_call_name(c)[1] == "init_process_group"
                                                           for c in lt._calls(s))), None)
        if init is not None and any(sets_device(s) for s in block[:init + 1]
                                    if not isinstance(s, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))):
            return
    for block in blocks:
        at = next((i for i, s in enumerate(block) if sets_device(s)), None)
        if not at:
            continue
        for stmt in block[:at]:
            if not isinstance(stmt, (ast.Expr, ast.Assign)):
                continue  # a branch may run it only when not launched
            hit = next((c for c in lt._calls(stmt) if lt.collective_name(c)), None)
            if hit is not None:
                lt.add("collective-before-set-device", "warning", hit,
                       f"{lt.collective_name(hit)} runs before torch.cuda.set_device (line {block[at].lineno}): under "
                       "nccl the collective uses each rank's current device, still cuda:0, so every rank of the node "
                       "builds its NCCL communicator and buffers on GPU 0 (extra memory there, or 'Duplicate GPU "
                       "detected')", "call torch.cuda.set_device(local_rank) before init_process_group and the first "
                       "collective", _DIST + "#torch.distributed.all_gather_object")
                break


_MEAN_NAME = re.compile(r"(?i)loss|acc|metric|err|score|ppl|perplexity")
_WORLD_WORDS = re.compile(r"world_size|get_world_size|num_processes|num_replicas|n_gpus|ngpus|nranks|size\(\)")


def rule_allreduce_sum_not_averaged(lt: PythonLinter) -> None:
    """A loss or metric all-reduced with the default ``ReduceOp.SUM`` and then used (logged, printed, compared) with no
    division by the world size: ``all_reduce``'s op defaults to SUM ("op (optional): One of the values from
    torch.distributed.ReduceOp", SUM by default, ``_COLL``), so the value is N times the mean (NERSC's sc22 tutorial
    logged the step-0 losses world_size times too large).  Not reported when the tensor is divided after the call, or
    the op is AVG / MAX / MIN."""
    from helpers.lint.python_rules import _call_name

    if "all_reduce" not in lt.text:
        return
    tdist = {"torch.distributed"} | {n for n, o in lt.import_origins.items() if o == "torch.distributed"}
    for c in lt._calls():
        recv, fname = _call_name(c)
        if fname != "all_reduce" or recv not in tdist or not c.args or not isinstance(c.args[0], ast.Name) or \
                not _MEAN_NAME.search(c.args[0].id):
            continue  # torch.distributed's own all_reduce (Fabric's and others' default to a mean)
        op = next((k.value for k in c.keywords if k.arg == "op"), c.args[1] if len(c.args) > 1 else None)
        if op is not None and not ast.unparse(op).endswith("SUM"):
            continue
        name = c.args[0].id
        scope = lt._enclosing_function(c) or lt.tree
        if any(isinstance(n, ast.Call) and _call_name(n)[1] == "all_reduce" and n.args and
               re.search(r"(?i)count|num|total|tokens|samples|\bn_", ast.unparse(n.args[0])) for n in ast.walk(scope)):
            continue  # a global count is summed beside it: a sum normalised by the job's count, not by the ranks
        later = sorted((n for n in ast.walk(scope) if getattr(n, "lineno", 0) > c.lineno),
                       key=lambda n: (n.lineno, getattr(n, "col_offset", 0)))
        divided = any(isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Div) and ast.unparse(n.target) == name or
                      isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) and name in ast.unparse(n.left)
                      for n in later)
        if divided or _WORLD_WORDS.search(" ".join(ast.unparse(n) for n in later if isinstance(n, ast.Assign) and
                                                   name in ast.unparse(n))):
            continue
        used = next((n for n in later if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)), None)
        if used is None:
            continue
        lt.add("allreduce-sum-not-averaged", "warning", c,
               f"{ast.unparse(c)[:50]} sums {name} over the ranks (all_reduce's default op is SUM) and line "
               f"{used.lineno} uses it with no division by the world size: the value is N times the mean",
               f"divide after the sum ({name} /= dist.get_world_size()) or reduce with op=dist.ReduceOp.AVG (nccl)",
               _COLL)


def _default_cuda(call: ast.Call) -> bool:
    """``call`` puts something on the current CUDA device without naming one: ``device="cuda"``, ``.cuda()``."""
    if isinstance(call.func, ast.Attribute) and call.func.attr == "cuda" and not call.args and not call.keywords:
        return True
    return any(k.arg == "device" and isinstance(k.value, ast.Constant) and k.value.value == "cuda"
               for k in call.keywords)


def rule_cuda_before_set_device(lt: PythonLinter) -> None:
    """CUDA work on the default device (``device="cuda"``, ``.cuda()``) in the same block before ``torch.cuda.set_device``
    binds this rank's GPU: every rank of the node is still on cuda:0 then, so each creates a CUDA context (hundreds of
    MB) and its tensors on GPU 0 ("it is the user's responsibility to ensure ... each rank has an individual GPU, via
    torch.cuda.set_device()", ``_DIST``); modded-nanogpt's import-time warm-up tensor, moved below the binding
    (KellerJordan/modded-nanogpt#161)."""
    from helpers.lint.python_rules import _call_name

    if "set_device" not in lt.text or not re.search(r"""device\s*=\s*['"]cuda['"]|\.cuda\(\)""", lt.text):
        return
    for node in lt.nodes:
        block = getattr(node, "body", None)
        if not isinstance(block, list):
            continue
        at = next((i for i, st in enumerate(block) if isinstance(st, (ast.Expr, ast.Assign)) and any(
            _call_name(c)[1] == "set_device" and "cuda" in _call_name(c)[0] for c in lt._calls(st))), None)
        if not at:
            continue
        for stmt in block[:at]:
            if not isinstance(stmt, (ast.Expr, ast.Assign)):
                continue
            hit = next((c for c in lt._calls(stmt) if _default_cuda(c)), None)
            if hit is not None:
                lt.add("cuda-before-set-device", "warning", hit,
                       f"{ast.unparse(hit)[:50]} runs on the current CUDA device before torch.cuda.set_device (line "
                       f"{block[at].lineno}): every rank of the node is still on cuda:0 then, so each creates a CUDA "
                       "context and this tensor on GPU 0", "bind the device first (torch.cuda.set_device(local_rank)), "
                       "then allocate", _DIST)
                break


def rule_fsdp_optimizer_before_wrap(lt: PythonLinter) -> None:
    """The optimizer built from ``model.parameters()`` before ``model = FSDP(model)`` / ``fully_shard(model)``."""
    from helpers.lint.python_rules import _call_name

    if not re.search(r"FullyShardedDataParallel|\bFSDP\(|fully_shard\(", lt.text):
        return
    for node in lt.nodes:
        body = getattr(node, "body", None)
        if not isinstance(body, list):
            continue
        opt_from: dict[str, ast.stmt] = {}
        for stmt in body:
            for c in (n for n in ast.walk(stmt) if isinstance(n, ast.Call)):
                recv, name = _call_name(c)
                if (recv.startswith(("torch.optim", "optim")) or name in ("AdamW", "Adam", "SGD")) and c.args:
                    m = re.match(r"^(\w+)\.parameters\(\)$", ast.unparse(c.args[0]) if c.args else "")
                    if m:
                        opt_from.setdefault(m.group(1), stmt)
                if name == "configure_optimizers" and re.fullmatch(r"\w+", recv):
                    opt_from.setdefault(recv, stmt)  # model.configure_optimizers(): built from model.parameters()
                if name in ("FullyShardedDataParallel", "FSDP", "fully_shard") and c.args and \
                        isinstance(c.args[0], ast.Name) and c.args[0].id in opt_from:
                    lt.add("fsdp-optimizer-before-wrap", "error", c,
                           f"the optimizer (line {opt_from[c.args[0].id].lineno}) was built from "
                           f"{c.args[0].id}.parameters() before {name} replaced them: it updates the unsharded "
                           "originals, not the parameters FSDP trains (FSDP docs: build the optimizer after wrapping)",
                           "create the optimizer after FSDP(...) / fully_shard(...)", _FSDP)


def rule_wrapper_raw_backward(lt: PythonLinter) -> None:
    """``loss.backward()`` in a script whose training goes through ``Accelerator.prepare`` / ``Fabric.setup``."""
    from helpers.lint.python_rules import _call_name

    wrappers: dict[str, str] = {}
    for node in lt.nodes:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and len(node.targets) == 1:
            name = _call_name(node.value)[1]
            target = ast.unparse(node.targets[0])
            if name in ("Accelerator", "Fabric"):
                wrappers[target] = name
    if not wrappers:
        return
    calls = [(_call_name(c), c) for c in lt._calls()]
    prepared = {recv for (recv, name), _ in calls if recv in wrappers and name in ("prepare", "setup", "setup_module")}
    if not prepared or any(recv in wrappers and name == "backward" for (recv, name), _ in calls):
        return
    for (recv, name), c in calls:
        if name != "backward" or not recv or recv in wrappers or c.args or recv.endswith(("accelerator", "fabric")) \
                or recv in ("torch.autograd", "autograd") or "engine" in recv.lower() or "scaler" in recv:
            continue
        w = sorted(prepared)[0]
        kind = wrappers[w]
        lt.add("wrapper-raw-backward", "warning", c,
               f"{recv}.backward() in a script trained through {kind} ({w}): {kind}'s backward applies the loss "
               "scaling (fp16), the DeepSpeed engine's backward and gradient accumulation; a plain backward skips "
               "them (DeepSpeed raises, fp16 gradients overflow)",
               f"{w}.backward({recv})", _ACC + "#accelerate.Accelerator.backward" if kind == "Accelerator"
               else _FABRIC + "#backward")


def rule_syncbn_without_ddp(lt: PythonLinter) -> None:
    """SyncBatchNorm under single-process DataParallel (SyncBatchNorm docs: DDP with one GPU per process only)."""
    text = lt.text
    m = re.search(r"convert_sync_batchnorm|SyncBatchNorm\(", text)
    # a DDP wrap anywhere (DDP(...), or a wrapper named for it: yolov5's smart_DDP) means the SyncBatchNorm branch is
    # the distributed one and DataParallel the single-process one
    if m and re.search(r"\bDataParallel\(", text) and not re.search(r"DistributedDataParallel|DDP\(", text):
        lt.add("syncbn-without-ddp", "error", text.count("\n", 0, m.start()) + 1,
               "SyncBatchNorm with nn.DataParallel: SyncBatchNorm works only inside DistributedDataParallel with one "
               "GPU per process ('SyncBatchNorm expected input tensor to be on GPU' / 'Default process group has not "
               "been initialized')", "use DistributedDataParallel (torchrun, one process per GPU), or plain "
               "BatchNorm under DataParallel", "https://docs.pytorch.org/docs/stable/generated/torch.nn.SyncBatchNorm.html")


def _placed(c: ast.Call) -> bool:
    return _kw(c, "map_location") is not None or len(c.args) > 1


_CHECKPOINT_LOADERS = {"load_from_checkpoint": "https://lightning.ai/docs/pytorch/stable/common/checkpointing_basic.html",
                       "restore_from": "https://docs.nvidia.com/nemo-framework/user-guide/latest/nemotoolkit/core/core.html"}


def _load_from_checkpoint_unplaced(lt: PythonLinter) -> None:
    """``Model.load_from_checkpoint(path)`` (Lightning: ``map_location`` "The behaviour is the same as in torch.load()")
    or NeMo's ``Model.restore_from(path)`` (``map_location`` None: "a GPU if available", the current device) in a
    process started per GPU (``mp.spawn`` / ``torch.multiprocessing`` workers, DDP) that never calls
    ``torch.cuda.set_device``: every process's copy lands on GPU 0 before any ``.to(rank)``."""
    from helpers.lint.python_rules import WRAPS_DDP, _call_name

    if not re.search(WRAPS_DDP + r"|\bspawn\(|start_processes\(", lt.text) or "set_device" in lt.text:
        return
    for c in lt._calls():
        name = _call_name(c)[1]
        if name not in _CHECKPOINT_LOADERS or _kw(c, "map_location") is not None or len(c.args) > 1:
            continue
        lt.add("load-without-map-location", "warning", c,
               f"{ast.unparse(c)[:60]} without map_location in a program of one process per GPU that never calls "
               "torch.cuda.set_device: each process restores the checkpoint onto GPU 0 (out of memory, or every "
               "process on one GPU)", f"{name}(..., map_location=f'cuda:{{rank}}') or map_location='cpu' (then "
               ".to(rank)); or torch.cuda.set_device(rank) first", _CHECKPOINT_LOADERS[name])


def rule_load_without_map_location(lt: PythonLinter) -> None:
    """``torch.load(path)`` with no ``map_location`` in a multi-GPU program: every rank loads onto the saving GPU.

    Each such call is a finding, unless the other branch of its ``if`` (or the ``try``/``except`` around it) loads with
    a ``map_location``: the script chose the placement per case (pytorch/examples imagenet: no map_location only when
    no GPU index is given).  A file that does not itself set up DDP/FSDP (a checkpoint helper module) gets the finding
    when a file linted with it does (:attr:`PyFacts.deferred`).
    """
    from helpers.lint.python_rules import WRAPS_DDP, _call_name

    here = bool(re.search(WRAPS_DDP, lt.text))
    _load_from_checkpoint_unplaced(lt)
    for c in lt._calls():
        if _call_name(c) != ("torch", "load") or _placed(c):
            continue
        if c.args and lt._rank_in_name(c.args[0], c):
            continue  # f"model_rank_{rank}.pt": each rank reads back what it saved from its own device
        p, child, chosen = lt.parents.get(c), c, False
        while p is not None and not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)) and not chosen:
            if isinstance(p, ast.If):
                other = p.orelse if child in p.body else p.body
                chosen = any(_call_name(n) == ("torch", "load") and _placed(n) for s in other for n in ast.walk(s)
                             if isinstance(n, ast.Call))
            elif isinstance(p, ast.Try):
                chosen = any(_call_name(n) == ("torch", "load") and _placed(n) for n in ast.walk(p)
                             if isinstance(n, ast.Call))
            child, p = p, lt.parents.get(p)
        if chosen:
            continue
        lt.add("load-without-map-location", "warning", c,
               f"{ast.unparse(c)[:60]} without map_location: torch.load puts each tensor back on the device it was "
               "saved from (cuda:0), so every rank fills GPU 0 (out of memory, or all ranks on one GPU)",
               "torch.load(path, map_location=f'cuda:{local_rank}') (or 'cpu')",
               "https://docs.pytorch.org/docs/stable/generated/torch.load.html", deferred=not here)


_LOCAL_ENV = {"LOCAL_RANK", "SLURM_LOCALID", "OMPI_COMM_WORLD_LOCAL_RANK", "MPI_LOCALRANKID", "MV2_COMM_WORLD_LOCAL_RANK"}
_LOCAL_ATTRS = {"local_rank", "local_process_index"}
_WORLD = re.compile(r"^(world_size|num_replicas|nranks|num_processes|world)$")


class _Local:
    """Names holding the node-local rank (``LOCAL_RANK``, ``args.local_rank``, ``get_local_rank()``), through
    assignments and calls of the file's functions; a name also assigned a global rank is not one."""

    def __init__(self, lt: PythonLinter) -> None:
        from helpers.lint.python_rules import _call_name, _env_key

        self._call_name, self._env_key, self.lt = _call_name, _env_key, lt
        self.names: set[str] = set()
        global_names: set[str] = set()
        assigns = [n for n in lt.nodes if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None]
        calls = [(c, lt.functions[_call_name(c)[1]]) for c in lt._calls() if _call_name(c)[1] in lt.functions
                 and _call_name(c)[0] in ("", "self", "cls") and (c.args or c.keywords)]
        for _ in range(3):
            before = len(self.names)
            for n in assigns:
                targets = [t.id for t in assign_targets(n)
                           if isinstance(t, ast.Name)]
                if self.is_local(n.value):
                    self.names.update(targets)
                elif lt.taint.is_global_rank(n.value):
                    global_names.update(targets)
            for call, fn in calls:
                params = [a.arg for a in fn.args.args]
                if params and params[0] in ("self", "cls") and _call_name(call)[0]:
                    params = params[1:]
                for i, arg in enumerate(call.args):
                    if i < len(params) and self.is_local(arg):
                        self.names.add(params[i])
                for kw in call.keywords:
                    if kw.arg in params and self.is_local(kw.value):
                        self.names.add(kw.arg)
            if len(self.names) == before:
                break
        self.names -= global_names

    def is_local(self, node: ast.AST | None) -> bool:
        if isinstance(node, ast.Name):
            return node.id in self.names or node.id in ("local_rank", "localrank", "local_rank_id")
        if isinstance(node, ast.Attribute):
            return node.attr in _LOCAL_ATTRS
        if isinstance(node, (ast.Subscript, ast.Call)):
            key = self._env_key(node)
            if key is not None:
                return key in _LOCAL_ENV
        if isinstance(node, ast.Call):
            name = self._call_name(node)[1]
            if name in ("get_local_rank", "get_node_local_rank"):
                return True
            return name in ("int", "str") and bool(node.args) and self.is_local(node.args[0])
        return False


def _world_size(node: ast.AST) -> bool:
    from helpers.lint.python_rules import _call_name, _env_key

    for n in ast.walk(node):
        if isinstance(n, ast.Name) and _WORLD.match(n.id) or isinstance(n, ast.Attribute) and _WORLD.match(n.attr):
            return True
        if isinstance(n, ast.Call) and (_call_name(n)[1] == "get_world_size" or _env_key(n) == "WORLD_SIZE"):
            return True
        if isinstance(n, ast.Subscript) and _env_key(n) == "WORLD_SIZE":
            return True
    return False


def rule_local_rank_as_global_rank(lt: PythonLinter) -> None:
    """The node-local rank where the global rank is meant: ``DistributedSampler(rank=local_rank)`` (its ``rank`` is
    the "Rank of the current process within num_replicas", ``_SAMPLER``), ``init_process_group(rank=local_rank)``,
    ``ds.shard(num_shards=world, index=local_rank)``, or ``items[local_rank]`` where ``len(items)`` is compared with the
    world size.  On one node they coincide; on two, LOCAL_RANK repeats 0..N-1 on each node (torchrun: "LOCAL_RANK -
    The local rank", "RANK - The global rank", ``_TORCHRUN``), so two processes take the same shard.  A warning
    here; an error when a linted launch starts this script on several nodes (cross_rules.settle)."""
    from helpers.lint.python_rules import _call_name

    if not re.search(r"local_rank|LOCAL_RANK|SLURM_LOCALID|local_process_index|get_local_rank", lt.text):
        return
    local = _Local(lt)
    hits: list[tuple[ast.AST, str]] = []
    for c in lt._calls():
        recv, name = _call_name(c)
        kws = {k.arg: k.value for k in c.keywords if k.arg}
        rank = kws.get("rank")
        if name == "DistributedSampler" and rank is None and len(c.args) > 2:
            rank = c.args[2]
        if rank is not None and local.is_local(rank) and (name in ("DistributedSampler", "init_process_group") or
                                                          {"num_replicas", "world_size"} & set(kws)):
            hits.append((c, f"{name}(..., rank={ast.unparse(rank)})"))
        if name == "shard" and "index" in kws and local.is_local(kws["index"]):
            hits.append((c, f"{recv}.shard(..., index={ast.unparse(kws['index'])})"))
    for n in lt.nodes:  # os.environ["RANK"] = str(local_rank): what init_process_group then reads as the global rank
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Subscript) and _src_env_key(t) == "RANK"
                                             for t in n.targets) and local.is_local(n.value) and \
                not _one_node_master(lt, n):
            hits.append((n, f"os.environ['RANK'] = {ast.unparse(n.value)}"))
    indexed = [n for n in lt.nodes if isinstance(n, ast.Subscript) and local.is_local(n.slice)]
    sized = {ast.unparse(n.args[0]) for n in lt.nodes if indexed and isinstance(n, ast.Compare) and _world_size(n)
             for n in ast.walk(n) if isinstance(n, ast.Call) and _call_name(n)[1] == "len" and n.args}
    for n in indexed:
        if ast.unparse(n.value) in sized:
            hits.append((n, f"{ast.unparse(n)} (len({ast.unparse(n.value)}) is checked against the world size)"))
    for node, what in hits:
        lt.add("local-rank-as-global-rank", "warning", node,
               f"{what} uses the node-local rank where the global rank is meant: on one node they are equal, on "
               "several every node repeats local ranks 0..N-1, so processes of different nodes take the same "
               "shard (duplicated data, a wrongly assembled model) and the rest is never used",
               "use the global rank: int(os.environ['RANK']) / dist.get_rank(); keep LOCAL_RANK for the device only",
               _TORCHRUN + "#environment-variables")


_MAIN_NAME = re.compile(r"^_?(?:(?:if_|is_)(?:main|master|primary|chief)|(?:if_|is_)?(?:main_process|main_proc|"
                        r"master_process|rank_?0|rank_zero|global_zero))$", re.IGNORECASE)
"""A function whose name promises the one process of the whole job (``is_main_process``, ``if_main_process``,
``is_master``, ``is_rank_0``; not ``main``, the entry point), as opposed to one per node (``is_local_main_process``, ``is_local_rank_zero``)."""


def rule_main_process_by_local_rank(lt: PythonLinter) -> None:
    """A "main process" test decided by the node-local rank: ``def if_main_process(): return
    int(os.environ["LOCAL_RANK"]) == 0``.  LOCAL_RANK repeats 0..N-1 on every node (torchrun: "LOCAL_RANK - The
    local rank", "RANK - The global rank", ``_TORCHRUN``), so with two nodes two processes pass the test, and what it
    guards (data preparation, checkpoint and log writes, ``run_on_main``) runs once per node on the same shared files.
    Accelerate keeps the two apart for this reason: ``is_main_process`` is "True for one process only",
    ``is_local_main_process`` "True for one process per server" (``_ACC``).  Flagged where a function named for the
    job's main process (:data:`_MAIN_NAME`, without "local"/"node") compares a local rank with 0 and reads no global
    rank (``RANK``, ``get_rank()``) or node rank; a warning (an error under a multi-node launch, cross_rules.settle)."""
    if not re.search(r"local_rank|LOCAL_RANK|SLURM_LOCALID|get_local_rank", lt.text):
        return
    local = _Local(lt)
    for name, fn in lt.functions.items():
        if not _MAIN_NAME.match(name):
            continue
        nodes = list(ast.walk(fn))
        if any(lt.taint.is_global_rank(n) or _node_rank(n) for n in nodes):
            continue
        for n in nodes:
            if isinstance(n, ast.Compare) and len(n.ops) == 1 and isinstance(n.ops[0], (ast.Eq, ast.NotEq)) and \
                    any(local.is_local(x) for x in (n.left, n.comparators[0])) and \
                    any(isinstance(x, ast.Constant) and x.value in (0, "0") for x in (n.left, n.comparators[0])):
                lt.add("local-rank-as-global-rank", "warning", n,
                       f"{name}() decides the main process by {ast.unparse(n)[:60]}: every node has a local rank 0, "
                       f"so on several nodes {name}() is true once per node and what it guards (file writes, data "
                       "preparation) runs on each node at once",
                       "compare the global rank: dist.get_rank() == 0 / int(os.environ['RANK']) == 0 (keep the "
                       "local-rank test for once-per-node work, under a name that says so)",
                       _TORCHRUN + "#environment-variables")
                break
    _local_gated_writes(lt, local)


def _local_gated_writes(lt: PythonLinter, local: _Local) -> None:
    """A file write (``torch.save``, a method of this file that writes) under ``if <local rank> == 0`` in a file that
    also reads the global rank: the author had both and gated a job-wide write per node, so on several nodes every
    node's local rank 0 writes the same path at once (pytorch/examples#1357: multinode.py saved its snapshot under
    ``self.local_rank == 0``).  A per-node write to node-local disk is what the local gate is for: a warning that
    says so."""
    from helpers.lint.python_rules import _call_name, _src

    if not any(lt.taint.is_global_rank(n) for n in lt.nodes):
        return
    for node in lt.nodes:
        if not isinstance(node, ast.If):
            continue
        tests = node.test.values if isinstance(node.test, ast.BoolOp) and isinstance(node.test.op, ast.And) else [node.test]
        gate = next((t for t in tests if isinstance(t, ast.Compare) and len(t.ops) == 1 and isinstance(t.ops[0], ast.Eq)
                     and local.is_local(t.left) and isinstance(t.comparators[0], ast.Constant)
                     and t.comparators[0].value in (0, "0")), None)
        if gate is None:
            continue
        writes: list[ast.Call] = []
        for c in lt._calls(ast.Module(body=node.body, type_ignores=[])):
            recv, name = _call_name(c)
            fn = lt.functions.get(name) if recv in ("", "self", "cls") else None
            if lt._write_kind(c) == "file":
                writes.append(c)
            elif fn is not None:  # a method of this file that writes (self._save_snapshot(epoch))
                writes += [w for w in lt._calls(fn) if lt._write_kind(w) == "file"]
        body = ast.Module(body=node.body, type_ignores=[])
        if writes and all(_call_name(w)[1] == "open" for w in writes) and all(
                isinstance(a, ast.Constant) for c in lt._calls(body) if _call_name(c)[1] == "write" for a in c.args):
            continue  # every node writes the same constant bytes (composer's 'local rank zero done' signal file)
        if writes:
            lt.add("local-rank-as-global-rank", "warning", gate,
                   f"`{ast.unparse(gate)}` gates a write ({_src(writes[0])[:50]}) by the node-local rank while this "
                   "file reads the global rank too: on several nodes each node's local rank 0 writes the same path at "
                   "once (a shared filesystem: a corrupt or interleaved file)",
                   "gate job-wide writes by the global rank (int(os.environ['RANK']) == 0 / dist.get_rank() == 0); keep "
                   "the local-rank gate for what each node writes to its own disk", _TORCHRUN + "#environment-variables")



def _node_rank(node: ast.AST) -> bool:
    """``node`` reads the node's index (``NODE_RANK``/``GROUP_RANK``/``SLURM_NODEID``, ``node_rank``)."""
    from helpers.lint.python_rules import _env_key

    if isinstance(node, ast.Name):
        return node.id in ("node_rank", "group_rank", "node_id")
    if isinstance(node, ast.Attribute):
        return node.attr in ("node_rank", "group_rank")
    return isinstance(node, (ast.Subscript, ast.Call)) and _env_key(node) in ("NODE_RANK", "GROUP_RANK", "SLURM_NODEID")


_SEED_CALLS = {"seed_everything", "manual_seed", "set_seed", "seed", "manual_seed_all"}
_WEIGHTS_LOADED = {"load_state_dict", "from_pretrained", "load_checkpoint", "load_model", "load"}


def _under_if(lt: PythonLinter, node: ast.AST, top: ast.AST) -> bool:
    """``node`` sits in an ``if`` (or its ``else``) below ``top``: it runs only on some paths (``if resume:``)."""
    p = lt.parents.get(node)
    while p is not None and p is not top:
        if isinstance(p, ast.If):
            return True
        p = lt.parents.get(p)
    return False
_FSDP_SYNC = "https://docs.pytorch.org/docs/stable/fsdp.html"


def _seeding_functions(lt: PythonLinter) -> set[str]:
    """Functions of this file that seed a generator from one of their parameters (``def random_seed(seed, rank):
    torch.manual_seed(seed + rank)``): a call of one with a rank argument seeds per rank."""
    from helpers.lint.python_rules import _call_name

    out: set[str] = set()
    for name, fn in lt.functions.items():
        params = {a.arg for a in fn.args.args}
        if any(isinstance(c, ast.Call) and _call_name(c)[1] in _SEED_CALLS and c.args and
               any(isinstance(n, ast.Name) and n.id in params for n in ast.walk(c.args[0])) for c in ast.walk(fn)):
            out.add(name)
    return out


def rule_rank_seed_before_model_init(lt: PythonLinter) -> None:
    """A seed that differs per rank (``seed_everything(1337 + fabric.global_rank)``) set before the model is built, in a
    file that shards the model with FSDP.  DDP broadcasts rank 0's parameters when it wraps a module; FSDP does not
    unless ``sync_module_states=True`` ("broadcast module parameters and buffers from rank 0", :data:`_FSDP_SYNC`):
    each rank keeps the shard of its own random initialisation, so the assembled model mixes N different ones.  The
    model is built after the seed in the same function (an ``init_module`` block, or ``model = ...(...)``)."""
    from helpers.lint.python_rules import _call_name

    if not re.search(r"FSDP|FullyShardedDataParallel|fully_shard|strategy\s*=\s*['\"]fsdp", lt.text) or \
            re.search(r"sync_module_states\s*=\s*True", lt.text):
        return
    seeders = _seeding_functions(lt)
    meta = bool(re.search(r"""device\(\s*['"]meta['"]|['"]meta['"]\s+if\b|init_empty_weights|device=['"]meta['"]""",
                          lt.text))
    for c in lt._calls():
        name = _call_name(c)[1]
        if name in _SEED_CALLS:
            if not c.args or not lt.taint.is_rank(c.args[0]):
                continue
        elif not (name in seeders and any(lt.taint.is_rank(a) for a in [*c.args, *(k.value for k in c.keywords)])):
            continue
        fn = lt._enclosing_function(c) or lt.tree
        built = None
        for n in ast.walk(fn):
            if getattr(n, "lineno", 0) <= c.lineno:
                continue
            if meta and isinstance(n, ast.Call) and _call_name(n)[1] in ("FSDP", "FullyShardedDataParallel",
                                                                          "fully_shard"):
                built = n  # built on the meta device: FSDP materialises and initialises the parameters when it wraps
                break
            if isinstance(n, ast.With) and any("init_module" in ast.unparse(i.context_expr) for i in n.items) or \
                    isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and any(
                        isinstance(t, ast.Name) and "model" in t.id.lower() for t in n.targets) and \
                    isinstance(n.value.func, ast.Name) and n.value.func.id[:1].isupper() and \
                    n.value.func.id not in ("FSDP", "DDP", "FullyShardedDataParallel", "DistributedDataParallel"):
                built = n
                break
        if built is None or any(isinstance(n, ast.Call) and _call_name(n)[1] in _WEIGHTS_LOADED and
                                getattr(n, "lineno", 0) > built.lineno and not _under_if(lt, n, fn)
                                for n in ast.walk(fn)):
            continue  # no model built here, or its initialisation is always replaced by loaded weights
        lt.add("rank-seed-before-model-init", "warning", c,
               f"{ast.unparse(c)[:60]} gives each rank its own seed before the model is built (line {built.lineno}) "
               "and FSDP shards it without sync_module_states: every rank keeps its shard of a different random "
               "initialisation", "seed the same on every rank before building the model, then reseed per rank "
               "(seed + rank) for data and dropout; or pass sync_module_states=True", _FSDP_SYNC)


def rule_same_seed_every_rank(lt: PythonLinter) -> None:
    """A DataLoader over a ``DistributedSampler`` given ``generator=g`` with ``g.manual_seed(<no rank>)``: the workers'
    seeds come from that generator ("base_seed is a long generated by main process using its RNG ... or a specified
    generator", https://docs.pytorch.org/docs/stable/data.html#randomness-in-multi-process-data-loading), so every rank's
    workers draw the same random stream and apply the same augmentations to their different samples (Lightning seeds
    workers from the global rank for this reason: ``pl_worker_init_function``)."""
    from helpers.lint.python_rules import _call_name

    if "DistributedSampler" not in lt.text or "manual_seed" not in lt.text:
        return
    for c in lt._calls():
        kws = {k.arg: k.value for k in c.keywords if k.arg}
        gen, sampler = kws.get("generator"), kws.get("sampler")
        if not isinstance(gen, ast.Name) or sampler is None:
            continue
        scope = lt._enclosing_function(c) or lt.tree
        if not _distributed_sampler(lt, sampler, scope):
            continue
        for n in ast.walk(scope):
            if not (isinstance(n, ast.Call) and _call_name(n)[1] == "manual_seed" and n.args):
                continue
            target = n.func.value if isinstance(n.func, ast.Attribute) else None
            assigned = isinstance(lt.parents.get(n), ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == gen.id for t in lt.parents[n].targets)  # type: ignore[attr-defined]
            if (isinstance(target, ast.Name) and target.id == gen.id or assigned) and not lt.taint.is_rank(n.args[0]):
                lt.add("same-seed-every-rank", "warning", n,
                       f"{ast.unparse(n)[:50]} seeds the DataLoader generator (line {c.lineno}) the same on every rank: "
                       "the workers' seeds derive from it, so all ranks apply the same random augmentations to their "
                       "shards (less diversity than one GPU: the DDP accuracy drop of ultralytics/yolov5#9545)",
                       f"{ast.unparse(n.func)}(seed + rank) with the global rank",
                       "https://docs.pytorch.org/docs/stable/data.html#randomness-in-multi-process-data-loading")
                break


_STEP_KWARGS = ("num_training_steps", "total_steps", "T_max", "total_iters")


def _per_process(node: ast.AST) -> bool:
    """``node`` divides by the process count (``len(dl) / accelerator.num_processes``: the sharded length)."""
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Div, ast.FloorDiv)) and
               "num_processes" in ast.unparse(n.right) for n in ast.walk(node))


def _len_of_unprepared(lt: PythonLinter, stmt: ast.Assign, scope: ast.AST) -> None:
    """``self.train_dataloader = accelerator.prepare(train_dataloader)`` then ``total_steps = epochs *
    len(train_dataloader)``: the name still holds the unprepared loader, whose length counts every process's
    batches; each process iterates the prepared one, about ``1 / num_processes`` of it, so the step budget and the
    schedule built from it are ``num_processes`` times too long (CarperAI/trlx's SFT trainer).  Only a length that
    goes into a step count (an assignment to a name with ``step``, ``iters`` or ``total`` in it)."""
    from helpers.lint.python_rules import _call_name

    prep = stmt.value
    if len(stmt.targets) != 1 or not isinstance(prep, ast.Call):
        return
    target = stmt.targets[0]
    outs = target.elts if isinstance(target, ast.Tuple) else [target]
    if len(outs) != len(prep.args):
        return
    moved = {a.id: ast.unparse(o) for a, o in zip(prep.args, outs) if isinstance(a, ast.Name) and ast.unparse(o) != a.id
             and "loader" in a.id.lower()}
    for n in ast.walk(scope):
        if not (isinstance(n, ast.Assign) and n.lineno > prep.lineno and
                re.search(r"(?i)step|iters|total", " ".join(ast.unparse(x) for x in n.targets))):
            continue
        for c in (x for x in ast.walk(n.value) if isinstance(x, ast.Call) and _call_name(x)[1] == "len" and x.args):
            arg = c.args[0]
            if isinstance(arg, ast.Name) and arg.id in moved and not any(
                    isinstance(a, ast.Assign) and prep.lineno < a.lineno < n.lineno and
                    any(isinstance(x, ast.Name) and x.id == arg.id for x in a.targets) for a in ast.walk(scope)):
                lt.add("lr-steps-from-dataset-length", "warning", c,
                       f"len({arg.id}) is the unprepared loader's length: accelerator.prepare (line {prep.lineno}) "
                       f"returned the sharded one as {moved[arg.id]}, which each process iterates (about 1 / "
                       "num_processes of it), so this step count is num_processes times too large",
                       f"len({moved[arg.id]})", "https://huggingface.co/docs/accelerate/en/basic_tutorials/migration")
                return


def rule_lr_steps_from_dataset_length(lt: PythonLinter) -> None:
    """A scheduler length ``steps * accelerator.num_processes`` whose ``steps`` come from ``len(dataloader)`` before
    ``accelerator.prepare`` shards that dataloader.

    Two documented behaviours meet here: ``prepare`` shards a dataloader, so each process iterates about
    ``len / num_processes`` batches (https://huggingface.co/docs/accelerate/en/basic_tutorials/migration), and the
    prepared scheduler steps ``num_processes`` times per optimizer step (accelerate/scheduler.py
    ``AcceleratedScheduler.step``: "the training dataloader batch size was multiplied by num_processes, so we need to
    do num_processes steps per training step").  A length counted on the unsharded loader already holds every
    process's batches; multiplying it by ``num_processes`` counts them twice: the schedule is ``num_processes`` times
    too long and the learning rate never decays as set (huggingface/diffusers#8312).
    """
    from helpers.lint.python_rules import _call_name

    for stmt in lt.nodes:
        if accelerator_prepare(stmt):
            _len_of_unprepared(lt, stmt, lt._enclosing_function(stmt) or lt.tree)  # type: ignore[arg-type]
    if "num_processes" not in lt.text or ".prepare(" not in lt.text:
        return
    for prep in lt._calls():
        recv, name = _call_name(prep)
        if name != "prepare" or "accelerator" not in recv.lower():
            continue
        loaders = {a.id for a in prep.args if isinstance(a, ast.Name)}
        scope = lt._enclosing_function(prep) or lt.tree
        assigns: dict[str, list[ast.Assign | ast.AugAssign]] = {}
        for n in ast.walk(scope):
            if isinstance(n, (ast.Assign, ast.AugAssign)) and n.lineno < prep.lineno:
                for t in assign_targets(n):
                    assigns.setdefault(ast.unparse(t), []).append(n)

        def above(node: ast.AST, at: ast.AST) -> bool:  # node's block encloses at (it runs on every path to at)
            p = lt.parents.get(node)
            q: ast.AST | None = at
            while q is not None and q is not p:
                q = lt.parents.get(q)
            return q is not None

        def reaching(src: str, at: ast.AST) -> list[ast.AST]:
            """The assignments of ``src`` that can reach ``at``: above it, not in a branch that excludes it, and not
            overwritten on every path between (a later assignment whose block encloses ``at``)."""
            before = [a for a in assigns.get(src, ()) if a.lineno < at.lineno and not _exclusive(lt, a, at)]  # type: ignore[attr-defined]
            return [a for a in before if not any(a.lineno < b.lineno and above(b, at) for b in before)]  # type: ignore[attr-defined]

        def kind(expr: ast.AST, at: ast.AST, depth: int = 0) -> str:
            """"sharded" (divided by the process count), "whole" (counted on the unsharded loader), or ""."""
            if _per_process(expr):
                return "sharded"
            out = ""
            todo = [expr]
            while todo:
                n = todo.pop()
                if isinstance(n, ast.Call) and _call_name(n)[1] == "len" and n.args and \
                        isinstance(n.args[0], ast.Name) and n.args[0].id in loaders:
                    out = "whole"
                elif isinstance(n, (ast.Name, ast.Attribute)) and depth < 6:
                    for a in reaching(ast.unparse(n), at):
                        k = kind(a.value, a, depth + 1)  # type: ignore[attr-defined]
                        out = "whole" if k == "whole" else out
                else:
                    todo.extend(ast.iter_child_nodes(n))
            return out

        for c in (n for n in ast.walk(scope) if isinstance(n, ast.Call) and n.lineno < prep.lineno):
            for kw in c.keywords:
                if kw.arg not in _STEP_KWARGS:
                    continue
                values: list[tuple[ast.AST, ast.AST]] = [(kw.value, c)]
                if isinstance(kw.value, (ast.Name, ast.Attribute)):
                    values = [(a.value, a) for a in reaching(ast.unparse(kw.value), c)]  # type: ignore[attr-defined]
                if not any(isinstance(v, ast.BinOp) and isinstance(v.op, ast.Mult) and
                           any("num_processes" in ast.unparse(x) for x in (v.left, v.right)) and
                           any(kind(x, at) == "whole" for x in (v.left, v.right) if "num_processes" not in ast.unparse(x))
                           for v, at in values):
                    continue
                lt.add("lr-steps-from-dataset-length", "warning", c,
                       f"{kw.arg}={ast.unparse(kw.value)[:60]} counts steps on the dataloader before "
                       f"accelerator.prepare (line {prep.lineno}) shards it, then multiplies by num_processes: the "
                       "prepared scheduler already steps num_processes times per step, so the schedule is "
                       "num_processes times too long (the learning rate never decays as set)",
                       "count steps on the sharded length: ceil(len(loader) / accelerator.num_processes), then "
                       "multiply by num_processes (huggingface/diffusers#8312)",
                       "https://github.com/huggingface/accelerate/blob/main/src/accelerate/scheduler.py")


def _exclusive(lt: PythonLinter, a: ast.AST, b: ast.AST) -> bool:
    """``a`` and ``b`` sit in different branches of one ``if`` (never both run)."""
    chain: dict[ast.AST, ast.AST] = {}
    child, p = a, lt.parents.get(a)
    while p is not None:
        chain[p] = child
        child, p = p, lt.parents.get(p)
    child, p = b, lt.parents.get(b)
    while p is not None:
        if p in chain:
            if isinstance(p, ast.If):
                ca = chain[p]
                return (ca in p.body and child in p.orelse) or (ca in p.orelse and child in p.body)
            return False
        child, p = p, lt.parents.get(p)
    return False


def _distributed_sampler(lt: PythonLinter, sampler: ast.AST, scope: ast.AST) -> bool:
    """``sampler`` is (or names a value built from) a DistributedSampler."""
    from helpers.lint.python_rules import _call_name

    def has(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Call) and _call_name(n)[1] == "DistributedSampler" for n in ast.walk(node))

    if has(sampler):
        return True
    if isinstance(sampler, ast.Name):
        return any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == sampler.id for t in n.targets)
                   and has(n.value) for n in ast.walk(scope))
    return False


def rule_same_device_every_rank(lt: PythonLinter) -> None:
    """``os.environ["CUDA_VISIBLE_DEVICES"] = "6"`` (one fixed device, no rank in it) in a distributed script: every
    process of a node sees the same single GPU, so its ranks share it (NCCL needs one GPU per rank: 'Duplicate GPU
    detected'), ``_DIST`` backends.  The value the last assignment of its block leaves is the one that counts."""
    from helpers.lint.python_rules import _env_key

    if not re.search(r"init_process_group|DistributedDataParallel|deepspeed|Accelerator\(", lt.text):
        return
    for node in lt.nodes:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and
                _env_key(node.targets[0]) == "CUDA_VISIBLE_DEVICES"):
            continue
        v = node.value
        text = v.value if isinstance(v, ast.Constant) and isinstance(v.value, (str, int)) else \
            "".join(str(x.value) for x in v.values) if isinstance(v, ast.JoinedStr) and \
            all(isinstance(x, ast.Constant) for x in v.values) else None
        if text is None or not re.fullmatch(r"\s*\d+\s*,?\s*", str(text)) or lt._rank_gate(node) is not None:
            continue
        block = next((getattr(lt.parents.get(node), f) for f in ("body", "orelse", "finalbody")
                      if node in (getattr(lt.parents.get(node), f, None) or [])), [node])
        later = block[block.index(node) + 1:]
        if any(isinstance(x, ast.Assign) and any(_env_key(t) == "CUDA_VISIBLE_DEVICES" for t in x.targets) for x in later):
            continue
        lt.add("same-device-every-rank", "warning", node,
               f"CUDA_VISIBLE_DEVICES is set to {str(text).strip()!r} with no rank in it: every process of a node "
               "sees only that one GPU, so all its ranks run on it ('Duplicate GPU detected' with nccl, or out of "
               "memory)", "derive it from the local rank (str(local_rank)), or leave CUDA_VISIBLE_DEVICES to the "
               "launcher and call torch.cuda.set_device(local_rank)", _DIST + "#backends")


_TENSOR_CTORS = {"FloatTensor", "LongTensor", "IntTensor", "DoubleTensor", "tensor", "zeros", "ones", "empty",
                 "full", "as_tensor", "from_numpy", "Tensor"}


_ACC_GATHERS = {"gather", "gather_for_metrics", "reduce"}
_ACC_OPERATIONS = "https://github.com/huggingface/accelerate/blob/main/src/accelerate/utils/operations.py"


_GATHER_FOR_METRICS = ("https://huggingface.co/docs/accelerate/en/package_reference/accelerator"
                       "#accelerate.Accelerator.gather_for_metrics")
_EVAL_LOADER = re.compile(r"(?i)\b\w*(eval|val|valid|validation|test|dev)\w*(loader|_dl|dataloader)\w*")


def rule_gather_not_for_metrics(lt: PythonLinter) -> None:
    """``accelerator.gather(preds)`` in a loop over an evaluation loader, its result kept for a metric: a prepared
    loader gives every process the same number of batches by repeating samples from the start of the dataset to
    fill the last one (``even_batches=True``, the default), so the gathered predictions hold those duplicates and the
    metric is computed on a few samples twice; ``gather_for_metrics`` drops them ("Gathers input_data and potentially
    drops duplicates in the last batch if on a distributed system. Should be used for gathering the inputs and
    targets for metric calculation", ``_GATHER_FOR_METRICS``; huggingface/peft#327).  Not where the function trims the
    duplicates itself (``samples_seen``, a slice by ``len(...dataset)``, the pre-0.12 Accelerate examples)."""
    from helpers.lint.python_rules import _call_name

    if "gather(" not in lt.text or "accelerator" not in lt.text.lower():
        return
    for c in lt._calls():
        recv, name = _call_name(c)
        if name != "gather" or "accelerator" not in recv.lower() or not c.args:
            continue
        loop = next((a for a in _ancestors(lt, c) if isinstance(a, (ast.For, ast.AsyncFor))), None)
        if loop is None or not _EVAL_LOADER.search(ast.unparse(loop.iter)):
            continue
        fn = lt._enclosing_function(c) or lt.tree
        src = ast.unparse(fn)
        if "samples_seen" in src or re.search(r"len\(\s*\w+(\.\w+)*\.dataset\s*\)", src) or "even_batches" in lt.text:
            continue
        lt.add("gather-not-for-metrics", "warning", c,
               f"{ast.unparse(c)[:60]} gathers evaluation outputs over {ast.unparse(loop.iter)[:40]}: the prepared "
               "loader pads its last batch with repeated samples so that every process has one, and gather keeps "
               "them: the metric counts those samples twice",
               f"{recv}.gather_for_metrics({ast.unparse(c.args[0])[:30]}) (drops the duplicates)", _GATHER_FOR_METRICS)


def _assigned_once(lt: PythonLinter, name: str, at: ast.AST, before: int | None = None) -> ast.Assign | None:
    """The one assignment to ``name`` in the function holding ``at`` (the module for module-level code), or None when
    there is none or more than one; ``before``: count only assignments above that line."""
    fn = lt._enclosing_function(at) or lt.tree
    sets = [n for n in ast.walk(fn) if isinstance(n, ast.Assign) and (before is None or n.lineno < before)
            and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]
    return sets[0] if len(sets) == 1 else None


def _moved(lt: PythonLinter, name: str, at: ast.AST) -> bool:
    """``name.cuda()`` or ``name.to(...)`` is called in the function holding ``at``."""
    fn = lt._enclosing_function(at) or lt.tree
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("cuda", "to")
               and isinstance(n.func.value, ast.Name) and n.func.value.id == name for n in ast.walk(fn))


def _cpu_ctor(expr: ast.AST) -> str | None:
    """The constructor's name when ``expr`` is ``torch.<ctor>(...)`` (:data:`_TENSOR_CTORS`) without ``device=``: a
    tensor made on the CPU."""
    from helpers.lint.python_rules import _call_name

    if not isinstance(expr, ast.Call):
        return None
    crecv, cname = _call_name(expr)
    return cname if crecv == "torch" and cname in _TENSOR_CTORS and _kw(expr, "device") is None else None


def _accelerator_cpu_tensor(lt: PythonLinter) -> None:
    """``accelerator.gather_for_metrics(torch.tensor(n))``: Accelerate's gather / reduce hand the tensor to
    ``torch.distributed`` as it is (``_gpu_gather_one``: ``all_gather_into_tensor``; utils/operations.py,
    :data:`_ACC_OPERATIONS`), and a multi-GPU run uses nccl, which takes CUDA tensors only ('No backend type associated
    with device type cpu').  A ``torch.tensor(...)``-like constructor without ``device=``, inline or assigned once in
    the same function and never moved, is a CPU tensor; on a CPU (gloo) run it works, so a warning."""
    from helpers.lint.python_rules import _call_name

    for call in lt._calls():
        recv, name = _call_name(call)
        if name not in _ACC_GATHERS or "accelerator" not in recv.lower() or not call.args:
            continue
        arg, made = call.args[0], None
        if isinstance(arg, ast.Name):
            made = _assigned_once(lt, arg.id, call)
            if made is None or _moved(lt, arg.id, call):
                continue
            arg = made.value
        cname = _cpu_ctor(arg)
        if cname is None:
            continue
        where = f" (line {made.lineno})" if made is not None else ""
        lt.add("nccl-cpu-tensor", "warning", call,
               f"{recv}.{name}() is given a CPU tensor, torch.{cname}(...){where}: Accelerate passes it to "
               "torch.distributed unchanged, and a multi-GPU run's nccl backend takes CUDA tensors only ('No backend "
               "type associated with device type cpu')",
               f"create it on the process's device: torch.{cname}(..., device={recv}.device)", _ACC_OPERATIONS)


def rule_nccl_cpu_tensor(lt: PythonLinter, sc: ScriptContract) -> None:
    """A CPU tensor passed to a collective under nccl ('Tensors must be CUDA and dense'); for Accelerate's gathers see
    :func:`_accelerator_cpu_tensor`."""
    from helpers.lint.python_rules import _call_name

    _accelerator_cpu_tensor(lt)
    if sc.backend != "nccl":
        return
    for call in lt._calls():
        recv, name = _call_name(call)
        if name not in ("all_reduce", "broadcast", "reduce", "all_gather_into_tensor", "reduce_scatter_tensor") or \
                recv not in ("dist", "torch.distributed") or not call.args or not isinstance(call.args[0], ast.Name):
            continue
        var = call.args[0].id
        made = _assigned_once(lt, var, call)
        if made is None:
            continue
        cname = _cpu_ctor(made.value)
        if cname is not None and not _moved(lt, var, call):
            lt.add("nccl-cpu-tensor", "error", call,
                   f"{var} (torch.{cname}(...), line {made.lineno}) is a CPU tensor and the backend is nccl: "
                   "'Tensors must be CUDA and dense'", f"create it on the GPU: torch.{cname}(..., device='cuda') or "
                   f"{var}.cuda()", _DIST + "#backends")


_TENSOR_GATHERS = {"gather", "gather_for_metrics", "all_gather", "all_gather_into_tensor"}
_DATA_SIZED = {"masked_select", "nonzero", "unique", "unique_consecutive", "argwhere"}


def _data_sized(expr: ast.AST) -> str | None:
    """Why ``expr`` has a size that depends on the data (so on the rank), or None: boolean-mask indexing
    (``x[mask]``, ``x[mask.bool()]``, ``x[x > 0]``) or ``masked_select`` / ``nonzero`` / ``unique``; method calls that
    keep the size (``.float()``, ``.to(...)``, ``.detach()``) are looked through."""
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and \
            expr.func.attr in ("float", "half", "bfloat16", "to", "detach", "contiguous", "cpu", "cuda", "clone"):
        expr = expr.func.value
    if isinstance(expr, ast.Subscript):
        index = expr.slice
        if isinstance(index, ast.Compare) or (isinstance(index, ast.Call) and isinstance(index.func, ast.Attribute)
                                              and index.func.attr == "bool") or \
                (isinstance(index, (ast.Name, ast.Attribute)) and "mask" in ast.unparse(index).lower()):
            return f"boolean-mask indexing {ast.unparse(expr)[:50]}"
    if isinstance(expr, ast.Call):
        name = expr.func.attr if isinstance(expr.func, ast.Attribute) else getattr(expr.func, "id", "")
        if name in _DATA_SIZED:
            return f"{name}() {ast.unparse(expr)[:50]}"
    return None


def rule_gather_variable_shape(lt: PythonLinter) -> None:
    """A tensor whose length depends on the rank's data, gathered as it is.

    ``all_gather`` / ``all_gather_into_tensor`` need the same size on every rank (torch.distributed: the output holds
    world_size equal chunks), and Accelerate's ``gather`` / ``gather_for_metrics`` call them unchanged; its documented
    way for tensors of different lengths is ``pad_across_processes`` first (:data:`_ACC_OPERATIONS`).  Ranks whose masks
    keep different numbers of elements then fail with a size mismatch or hang.  The gathered value is the expression
    itself or a name assigned once from it in the same function; a ``pad_across_processes`` of that name clears it."""
    from helpers.lint.python_rules import _call_name

    for call in lt._calls():
        recv, name = _call_name(call)
        if name not in _TENSOR_GATHERS or not call.args or not (
                "accelerator" in recv.lower() and name in ("gather", "gather_for_metrics")
                or recv in ("dist", "torch.distributed") and name in ("all_gather", "all_gather_into_tensor")):
            continue
        arg = call.args[1] if name in ("all_gather", "all_gather_into_tensor") and len(call.args) > 1 else call.args[0]
        why = _data_sized(arg)
        if why is None and isinstance(arg, ast.Name):
            fn = lt._enclosing_function(call) or lt.tree
            made = _assigned_once(lt, arg.id, call)
            padded = any(isinstance(n, ast.Call) and _call_name(n)[1] == "pad_across_processes" for n in ast.walk(fn))
            if made is not None and not padded:
                why = _data_sized(made.value)
                why = f"{arg.id} = {why} (line {made.lineno})" if why else None
        if why is None:
            continue
        lt.add("gather-variable-shape", "warning", call,
               f"{recv}.{name}() gathers a tensor whose length depends on each rank's data ({why}): the ranks' "
               "tensors differ in size, which all_gather does not allow (a size mismatch error or a hang)",
               f"pad first: {recv}.pad_across_processes(t, dim=0) (then drop the padding), or gather the per-rank "
               "counts and values of a fixed size" if "accelerator" in recv.lower() else
               "all_gather the sizes first, pad every rank's tensor to the largest, gather, then trim", _ACC_OPERATIONS)


_RANK_ENV = re.compile(r"['\"](?:RANK|LOCAL_RANK|NODE_RANK|GROUP_RANK|SLURM_PROCID|SLURM_NODEID|SLURM_LOCALID|"
                       r"OMPI_COMM_WORLD_RANK|OMPI_COMM_WORLD_LOCAL_RANK|PMI_RANK)['\"]")
_TRUTH = "https://docs.python.org/3/library/stdtypes.html#truth-value-testing"


def rule_rank_zero_falsy(lt: PythonLinter) -> None:
    """``rank = get_envint("RANK", None)`` then ``if rank:`` as "is RANK set": an integer 0 is false (Python's truth
    value testing, :data:`_TRUTH`), so the main process (rank 0) takes the "not set" path; ``return rank == 0`` inside
    ``if rank:`` can never be true (NVIDIA/NeMo#3374).  The value must be an integer read of a rank variable (a call
    whose name says int, or ``int(...)``): ``os.environ.get("RANK")`` is the string "0", which is true."""
    for node in lt.nodes:
        if not isinstance(node, ast.If):
            continue
        test = node.test.operand if isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not) else node.test
        if not isinstance(test, ast.Name):
            continue
        made = _assigned_once(lt, test.id, node, before=node.lineno)
        if made is None or not isinstance(made.value, ast.Call):
            continue
        value = made.value
        called = ast.unparse(value.func).lower()
        if "int" not in called or not _RANK_ENV.search(ast.unparse(value)) or \
                not any(isinstance(b, ast.Return) for b in node.body):
            continue  # only "if rank: return <from it>": the other paths may fall back to the same 0
        dead = any(isinstance(c, ast.Compare) and isinstance(c.left, ast.Name) and c.left.id == test.id and
                   len(c.ops) == 1 and isinstance(c.ops[0], ast.Eq) and isinstance(c.comparators[0], ast.Constant) and
                   c.comparators[0].value == 0 for b in node.body for c in ast.walk(b)) and test is node.test
        lt.add("rank-zero-falsy", "warning", node,
               f"'if {ast.unparse(node.test)}:' tests {test.id} (line {made.lineno}: {ast.unparse(value)[:50]}) for "
               f"truth: rank 0 is false, so the main process reads as 'not set'" +
               (f"; '{test.id} == 0' inside it can never be true" if dead else ""),
               f"if {test.id} is not None:", _TRUTH)


_ENVIRON = "https://docs.python.org/3/library/os.html#os.environ"


def rule_environ_getattr(lt: PythonLinter) -> None:
    """``getattr(os.environ, "WORLD_SIZE", 1)``: ``os.environ`` is a mapping (:data:`_ENVIRON`); its keys are not
    attributes, so the default comes back whatever the launcher set: world size 1 and rank -1 on every process
    (ultralytics/yolov5#3680: ``os.environ.get`` was meant)."""
    from helpers.lint.python_rules import _call_name

    for c in lt._calls():
        if _call_name(c) != ("", "getattr") or len(c.args) < 2 or _src_of(c.args[0]) not in ("os.environ", "environ"):
            continue
        key = c.args[1].value if isinstance(c.args[1], ast.Constant) else _src_of(c.args[1])
        lt.add("environ-getattr", "error", c,
               f"getattr(os.environ, {key!r}, ...) looks for an attribute of the os.environ mapping, not the "
               f"variable: it always returns the default, whatever {key} the launcher set",
               f"os.environ.get({key!r}, ...)", _ENVIRON)


def _src_of(node: ast.AST) -> str:
    return ast.unparse(node)


_DS_ARGS = "https://github.com/deepspeedai/DeepSpeed/blob/master/deepspeed/launcher/launch.py"


_LOCAL_RANK_SPELLINGS = (
    # (what the script is made for, that launcher, the spelling it passes, the one the parser lacks, source)
    (r"add_config_arguments", "the deepspeed launcher (deepspeed.add_config_arguments), which", "--local_rank",
     "--local-rank", _DS_ARGS),
    (r"torch\.distributed\.launch\b", "torch.distributed.launch, which since PyTorch 2.0", "--local-rank",
     "--local_rank", "https://docs.pytorch.org/docs/stable/distributed.html#launch-utility"),
)
"""Launchers that pass the local rank as an argument, and the spelling each passes.  The deepspeed launcher appends
``--local_rank={local_rank}`` to every worker's command (deepspeed/launcher/launch.py, unless ``--no_local_rank``;
deepspeedai/Megatron-DeepSpeed#192); ``python -m torch.distributed.launch`` passes ``--local-rank=N`` since PyTorch 2.0
("Changed in version 2.0.0: The launcher will pass the --local-rank=<rank> argument to your script";
speechbrain#1951).  A script made for the deepspeed launcher is that launcher's case even when it also names
torch.distributed.launch."""


def rule_local_rank_spelling(lt: PythonLinter, sc: ScriptContract) -> None:
    """A script made for a launcher that passes the local rank as an argument (:data:`_LOCAL_RANK_SPELLINGS`) whose
    parser defines the other spelling only: argparse matches option strings exactly, so every worker stops with
    'unrecognized arguments: --local_rank=0' (or ``--local-rank=0``)."""
    written = sc.extra.get("literal_options") or frozenset()
    for marker, launcher, passes, has, source in _LOCAL_RANK_SPELLINGS:
        if not re.search(marker, lt.text):
            continue
        if has in written and passes not in written:
            where = next((c.lineno for c in lt._calls() if c.args and isinstance(c.args[0], ast.Constant)
                          and c.args[0].value == has), sc.options_line or 1)
            lt.add("local-rank-arg-under-launcher", "error", where,
                   f"the parser defines {has} but not {passes}, and this script is made for {launcher} passes "
                   f"{passes}=N: 'error: unrecognized arguments: {passes}=0'",
                   'add_argument("--local-rank", "--local_rank", dest="local_rank", type=int)', source)
        return  # the first launcher the script is made for decides


_LOCAL_WORLD = "https://docs.pytorch.org/docs/stable/elastic/run.html#environment-variables"


def rule_world_size_as_local(lt: PythonLinter) -> None:
    """``os.cpu_count() // dist.get_world_size()``: the node's CPUs shared out by the number of ranks in the whole job.

    ``os.cpu_count()`` counts this machine's CPUs; the processes that share them are the ranks on this node,
    torchrun's ``LOCAL_WORLD_SIZE`` (:data:`_LOCAL_WORLD`), not ``WORLD_SIZE``.  On several nodes each rank gets
    nodes-times too few threads (0 once the job has more ranks than a node has CPUs)."""
    world = re.compile(r"get_world_size\(|\bworld_size\b|['\"]WORLD_SIZE['\"]|num_processes\b")
    for node in lt.nodes:
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.FloorDiv, ast.Div))):
            continue
        left, right = ast.unparse(node.left), ast.unparse(node.right)
        if "cpu_count(" not in left or not world.search(right) or "local" in right.lower():
            continue
        lt.add("world-size-as-local", "warning", node,
               f"{ast.unparse(node)[:70]}: the CPUs of this node are divided by the ranks of the whole job; only "
               "the ranks on this node share them (fewer threads than the node has, 0 on a big job)",
               "divide by the ranks on this node: int(os.environ['LOCAL_WORLD_SIZE']) (torchrun), or "
               "torch.cuda.device_count() when every GPU runs one rank", _LOCAL_WORLD)


_ACC_RESUME = "https://huggingface.co/docs/accelerate/en/usage_guides/checkpoint"


def rule_resume_skip_every_epoch(lt: PythonLinter) -> None:
    """``train_dataloader = accelerator.skip_first_batches(train_dataloader, n)`` inside the epoch loop, guarded only by
    "resuming": the skip is meant for the first epoch after a resume (Accelerate's checkpoint guide and its examples:
    ``if resume and epoch == starting_epoch``, :data:`_ACC_RESUME`); run in every epoch it drops the first ``n``
    batches of each, and reassigning the loop's own loader makes the next epochs iterate the skipping one."""
    from helpers.lint.python_rules import _call_name

    for call in lt._calls():
        if _call_name(call)[1] != "skip_first_batches":
            continue
        node: ast.AST | None = call
        loop, tests = None, []
        while node is not None:
            parent = lt.parents.get(node)
            if isinstance(parent, ast.If) and node in parent.body:
                tests.append(parent.test)
            if isinstance(parent, (ast.For, ast.While)) and node in parent.body:
                loop = parent
                break
            node = parent
        if not isinstance(loop, ast.For) or not isinstance(loop.target, ast.Name):
            continue
        epoch = loop.target.id
        if any(epoch in {n.id for n in ast.walk(t) if isinstance(n, ast.Name)} for t in tests):
            continue
        stmt = lt.parents.get(call)
        reassigns = isinstance(stmt, ast.Assign) and call.args and isinstance(call.args[0], ast.Name) and any(
            isinstance(t, ast.Name) and t.id == call.args[0].id for t in stmt.targets)
        lt.add("resume-skip-every-epoch", "warning", call,
               f"skip_first_batches runs in every pass of 'for {epoch} in ...' (no test of {epoch}): every epoch "
               "drops its first batches, not only the epoch the checkpoint stopped in" +
               (f", and {call.args[0].id} itself is replaced by the skipping loader" if reassigns else ""),
               f"skip only when resuming into the first epoch: if resume and {epoch} == starting_epoch: active = "
               f"accelerator.skip_first_batches(loader, resume_step) else: active = loader", _ACC_RESUME)


def collect_cpu_tensor_facts(lt: PythonLinter) -> None:
    """:attr:`PyFacts.collective_params` (module-level functions that pass a parameter as the tensor of
    ``dist.all_reduce`` / ``all_gather`` / ``broadcast`` / ``reduce``), :attr:`PyFacts.cpu_tensor_args` (calls of
    functions defined elsewhere given an inline ``torch.tensor(...)`` without ``device=``: a CPU tensor) and
    :attr:`PyFacts.mentions_nccl`, for :func:`helpers.lint.cross_rules.cpu_tensor_to_collective_across`."""
    from helpers.lint.python_rules import _call_name, _src

    f = lt.facts
    f.mentions_nccl = "nccl" in lt.text
    for fn in getattr(lt.tree, "body", []):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        params = [a.arg for a in fn.args.args]
        used = {params.index(c.args[0].id) for c in ast.walk(fn) if isinstance(c, ast.Call)
                and _call_name(c)[0] in ("dist", "torch.distributed") and _call_name(c)[1] in
                ("all_reduce", "broadcast", "reduce", "all_gather_into_tensor") and c.args
                and isinstance(c.args[0], ast.Name) and c.args[0].id in params}
        if used:
            f.collective_params[fn.name] = used
    for call in lt._calls():
        recv, name = _call_name(call)
        if recv or name in lt.functions or not name:
            continue
        for i, a in enumerate(call.args):
            if _cpu_ctor(a) is not None:
                f.cpu_tensor_args.append((name, i, call.lineno, _src(a)[:50]))


def rule_grad_accum_from_device_count(lt: PythonLinter) -> None:
    """Accumulation or batch split by ``torch.cuda.device_count()`` (GPUs on this node) instead of the world size."""
    if "init_process_group" not in lt.text:
        return
    for node in lt.nodes:
        if isinstance(node, (ast.Assign, ast.AugAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names = " ".join(ast.unparse(t) for t in targets).lower()
            if ("accum" in names or "batch" in names) and "device_count()" in ast.unparse(node.value):
                lt.add("grad-accum-from-device-count", "warning", node,
                       f"{ast.unparse(node)[:70]}: torch.cuda.device_count() counts this node's GPUs, not the ranks "
                       "(several nodes, or fewer ranks than GPUs): the global batch is not the one intended",
                       "divide by the world size: int(os.environ['WORLD_SIZE']) / dist.get_world_size()",
                       "https://docs.pytorch.org/docs/stable/elastic/run.html#environment-variables")


_SPAWNS = {"spawn", "start_processes", "Process", "Pool"}


def _device_count_names(lt: PythonLinter) -> set[str]:
    """Names assigned a value built from ``torch.cuda.device_count()`` (plain and annotated assignments)."""
    names: set[str] = set()
    for n in lt.nodes:
        if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None and _has_device_count(n.value, names):
            names.update(t.id for t in assign_targets(n)
                         if isinstance(t, ast.Name))
    return names


def _has_device_count(node: ast.AST, names: set[str]) -> bool:
    from helpers.lint.python_rules import _call_name

    return any(isinstance(x, ast.Call) and _call_name(x)[1] == "device_count" or isinstance(x, ast.Name) and
               x.id in names for x in ast.walk(node))


def rule_world_size_from_device_count(lt: PythonLinter) -> None:
    """``init_process_group(world_size=torch.cuda.device_count())`` (or ``WORLD_SIZE`` set from it) in a script that
    does not start its own processes: the world size is the number of processes that join ("world_size: Number of
    processes participating in the job", ``_INIT``), which a launcher decides (torchrun: WORLD_SIZE = nnodes x
    nproc-per-node, ``_TORCHRUN``), not the GPUs this node has.  With fewer processes than GPUs
    (``--nproc-per-node=2`` on 8 GPUs) the group never fills and init_process_group hangs; on several nodes it is
    too small.  A script that spawns one process per GPU itself (``mp.spawn(nprocs=device_count())``) is right on
    one node and is not reported."""
    from helpers.lint.python_rules import _call_name, _env_key

    if "device_count" not in lt.text or "init_process_group" not in lt.text and "WORLD_SIZE" not in lt.text:
        return
    if any(_call_name(c)[1] in _SPAWNS for c in lt._calls()):
        return
    names = _device_count_names(lt)
    hits: list[tuple[ast.AST, str]] = []
    for c in lt._calls():
        if _call_name(c)[1] != "init_process_group":
            continue
        ws = _kw(c, "world_size") or (c.args[3] if len(c.args) > 3 else None)
        if ws is not None and _has_device_count(ws, names):
            hits.append((c, f"init_process_group(..., world_size={ast.unparse(ws)})"))
    for n in lt.nodes:
        if isinstance(n, ast.Assign) and any(_env_key(t) == "WORLD_SIZE" for t in n.targets) and \
                _has_device_count(n.value, names):
            hits.append((n, ast.unparse(n)[:80]))
    for node, what in hits:
        lt.add("world-size-from-device-count", "error", node,
               f"{what} takes the world size from torch.cuda.device_count(), the GPUs this node has, but the "
               "processes are started by a launcher (this script spawns none): with fewer processes than GPUs the "
               "group never fills and init_process_group hangs; on several nodes it is too small",
               "let init_process_group read env:// (or pass world_size=int(os.environ['WORLD_SIZE']), "
               "rank=int(os.environ['RANK']))", _INIT)


_SLURM_ROLES: dict[str, str] = {
    "SLURM_PROCID": "the global task rank",
    "SLURM_LOCALID": "the task's rank on its node",
    "SLURM_NODEID": "the node's index in the job",
    "SLURM_NTASKS": "the job's number of tasks", "SLURM_NPROCS": "the job's number of tasks",
    "SLURM_STEP_NUM_TASKS": "the job's number of tasks",
    "SLURM_JOB_NUM_NODES": "the number of nodes", "SLURM_NNODES": "the number of nodes",
    "SLURM_STEP_NUM_NODES": "the number of nodes",
    "SLURM_NTASKS_PER_NODE": "the tasks per node",
}
"""What a Slurm output variable holds (sbatch/srun OUTPUT ENVIRONMENT VARIABLES: SLURM_PROCID "The MPI rank (or
relative process ID) of the current process", SLURM_LOCALID "Node local task ID for the process within a job",
SLURM_NODEID "ID of the nodes allocated" (the relative node ID of the current node, srun), SLURM_NTASKS/NPROCS the
number of tasks, SLURM_JOB_NUM_NODES/NNODES "Total number of nodes in the job's resource allocation",
SLURM_NTASKS_PER_NODE "Number of tasks requested per node"; ``_SBATCH_ENV``)."""

_SLOT_ROLES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^(node_rank|machine_rank|node_id|node_idx|node_index|group_rank)$"), "the node's index in the job"),
    (re.compile(r"^(local_world_size|local_size|nproc_per_node|nprocs_per_node|procs_per_node|tasks_per_node|"
                r"ntasks_per_node|local_world)$"), "the tasks per node"),
    (re.compile(r"^(num_nodes|nnodes|n_nodes|num_machines|node_count|nodes)$"), "the number of nodes"),
    (re.compile(r"^(local_rank|localrank|local_rank_id)$"), "the task's rank on its node"),
    (re.compile(r"^(world_size|num_processes|num_replicas|ntasks)$"), "the job's number of tasks"),
    (re.compile(r"^(rank|global_rank|world_rank|proc_rank|process_rank)$"), "the global task rank"),
)
"""A name that promises one of those quantities (torchrun's --node-rank/--nproc-per-node/--nnodes, accelerate's
--machine_rank/--num_machines, init_process_group's rank/world_size, LOCAL_RANK, LOCAL_WORLD_SIZE)."""


def _slurm_read(node: ast.AST | None) -> tuple[ast.AST, str] | None:
    """``(node, "SLURM_X")`` when ``node`` reads a Slurm/PMI variable: ``os.environ["SLURM_X"]``,
    ``os.getenv("SLURM_X")``, or a helper of the script that takes the name first (``get_int_env("SLURM_X", env)``),
    through ``int()``/``str()``."""
    from helpers.lint.python_rules import _call_name, _env_key

    while isinstance(node, ast.Call) and _call_name(node)[1] in ("int", "str") and node.args:
        node = node.args[0]
    if node is None:
        return None
    key = _env_key(node)
    if key is None and isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) and \
            isinstance(node.args[0].value, str) and "env" in "".join(_call_name(node)).lower():
        key = node.args[0].value
    if key is None and isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
            node.func.attr == "get" and node.args and isinstance(node.args[0], ast.Constant) and \
            "env" in _dotted_lower(node.func.value):
        key = node.args[0].value
    if isinstance(key, str) and key.startswith(("SLURM_", "SLURMD_")):
        return node, key
    return None


def _dotted_lower(node: ast.AST) -> str:
    return ast.unparse(node).lower()


def _slurm_known(key: str) -> str | None:
    """``None`` when Slurm sets ``key``; else the documented name it most likely meant (``SLURM_JOB_NUMNODES`` ->
    ``SLURM_JOB_NUM_NODES``: the same without underscores, or a close spelling), or ``""`` when none is close."""
    import difflib

    from helpers import envnames

    known = envnames.slurm_env_vars()
    if key in known or not key.startswith(("SLURM_", "SLURMD_")):
        return None
    squeezed = {k.replace("_", ""): k for k in known}
    if key.replace("_", "") in squeezed:
        return squeezed[key.replace("_", "")]
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.9)
    return close[0] if close else ""


def rule_slurm_env(lt: PythonLinter) -> None:
    """Slurm's output variables read for what they are not (``_SBATCH_ENV``, srun's OUTPUT ENVIRONMENT VARIABLES).

    * ``slurm-var-unknown``: a ``SLURM_*`` name Slurm neither documents nor sets (``helpers/data/slurm_env_vars.txt``,
      :func:`helpers.envnames.slurm_env_vars`) that is one spelling away from one it does (``SLURM_JOB_NUMNODES``):
      ``os.environ[...]`` raises KeyError, ``.get`` returns its default on every node.  A name far from every Slurm
      name (a site's own) is left alone.
    * ``slurm-env-misuse``: a variable assigned to, or passed as, a name that promises another quantity: the node
      rank torchrun/accelerate take from ``SLURM_PROCID`` (the task rank: right only with one task per node, out of
      range or repeated with more), a per-node process count from the node count, a global rank from
      ``SLURM_LOCALID``...
    """
    if "SLURM" not in lt.text:
        return
    seen: set[int] = set()
    for n in lt.nodes:
        read = _slurm_read(n) if isinstance(n, (ast.Subscript, ast.Call)) else None
        if read is None or id(read[0]) in seen:
            continue
        seen.add(id(read[0]))
        meant = _slurm_known(read[1])
        if meant:
            lt.add("slurm-var-unknown", "warning", n,
                   f"{read[1]} is not a variable Slurm sets (sbatch/srun OUTPUT ENVIRONMENT VARIABLES); {meant} is: "
                   "os.environ[...] raises KeyError, .get() returns its default on every node",
                   f"read {meant}", _SBATCH_ENV)
    slots: list[tuple[ast.AST, str, ast.AST]] = []
    for n in lt.nodes:
        if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None:
            for t in assign_targets(n):
                name = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else None
                if name:
                    slots.append((n, name, n.value))
        elif isinstance(n, ast.keyword) and n.arg:
            slots.append((n.value, n.arg, n.value))
    for at, name, value in slots:
        want = next((role for pat, role in _SLOT_ROLES if pat.match(name.lower().lstrip("_"))), None)
        parts = value.values if isinstance(value, ast.BoolOp) else [value.body, value.orelse] \
            if isinstance(value, ast.IfExp) else [value]
        for part in parts:
            read = _slurm_read(part)
            if want is None or read is None:
                continue
            key = _slurm_known(read[1]) or read[1]
            has = _SLURM_ROLES.get(key)
            if has is None or has == want:
                continue
            lt.add("slurm-env-misuse", "error", at,
                   f"{name} (meant: {want}) is taken from {read[1]}, which holds {has}: "
                   + ("right only with one Slurm task per node; with more, node ranks repeat or go out of range "
                      "and the launch fails" if key == "SLURM_PROCID" and "node" in want else
                      "the value differs from the intended one as soon as the job has several nodes or several "
                      "tasks per node"),
                   f"read the variable that holds {want}: " + next(
                       (k for k, r in _SLURM_ROLES.items() if r == want), "see the sbatch/srun output variables"),
                   _SBATCH_ENV)
            break


_NOT_NUMBERS = {
    "SLURM_TASKS_PER_NODE": "'8(x2)' on two nodes of 8 tasks, '2,1' when they differ",
    "SLURM_STEP_TASKS_PER_NODE": "'8(x2)' on two nodes of 8 tasks",
    "SLURM_JOB_CPUS_PER_NODE": "'72(x2)' on two nodes of 72 CPUs",
    "SLURM_JOB_NODELIST": "a host list such as 'gpu[01-04]'", "SLURM_NODELIST": "a host list such as 'gpu[01-04]'",
    "SLURM_STEP_NODELIST": "a host list such as 'gpu[01-04]'", "SLURM_JOB_GPUS": "a list such as '0,1,2,3'",
    "SLURM_STEP_GPUS": "a list such as '0,1,2,3'",
    "MASTER_ADDR": "a host name or IP address", "MASTER_ADDRESS": "a host name or IP address",
}
"""Variables whose documented value is not a number (sbatch / srun OUTPUT ENVIRONMENT VARIABLES, ``_SBATCH_ENV``:
SLURM_TASKS_PER_NODE "Number of tasks to be initiated on each node. Values are comma separated ... If two or more
consecutive nodes are to have the same task count, that count is followed by "(x#)"..."; torch's env:// rendezvous:
MASTER_ADDR, the address of the rank 0 node), with an example of what ``int()`` then meets."""


def rule_env_not_a_number(lt: PythonLinter) -> None:
    """``env-int-parse``: ``int()`` / ``float()`` of a variable whose documented value is not a number
    (:data:`_NOT_NUMBERS`), directly or through one assignment: a ValueError as soon as the job has several nodes
    (``int('8(x2)')``, InternImage's ``SLURM_TASKS_PER_NODE``) or at once (``int(os.getenv('MASTER_ADDRESS'))``)."""
    from helpers.lint.python_rules import _call_name, _env_key

    if not re.search("|".join(_NOT_NUMBERS), lt.text):
        return
    env_names: dict[str, str] = {}  # a name assigned from a read: addr = os.environ["MASTER_ADDR"]
    for n in lt.nodes:
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            key = _env_key(n.value)
            if key in _NOT_NUMBERS:
                env_names[n.targets[0].id] = key
    for c in lt._calls():
        if _call_name(c) not in (("", "int"), ("", "float")) or not c.args:
            continue
        arg = c.args[0]
        key = _env_key(arg) or (env_names.get(arg.id) if isinstance(arg, ast.Name) else None)
        if key not in _NOT_NUMBERS:
            continue
        lt.add("env-int-parse", "error", c,
               f"{ast.unparse(c)[:60]}: {key} is {_NOT_NUMBERS[key]}, not a number, so {_call_name(c)[1]}() raises "
               "ValueError" + (" as soon as the job spans several nodes" if key.startswith("SLURM") else ""),
               "read the number from a variable that holds one (SLURM_NTASKS_PER_NODE, SLURM_NNODES, SLURM_NTASKS, "
               "SLURM_GPUS_ON_NODE), or parse the list (scontrol show hostnames); keep an address a string",
               _SBATCH_ENV)


_CONVERSIONS = frozenset({"int", "float", "bool", "str", "eval", "literal_eval", "strtobool", "Path"})
_STRING_SINKS = frozenset({"print", "info", "warning", "debug", "error", "format", "join", "append", "get",
                           "setdefault", "write", "log"})


def rule_env_str_as_number(lt: PythonLinter) -> None:
    """``env-str-as-number``: ``os.environ.get(K, 3600)`` (or ``os.getenv``) with a number as its default, used without
    a conversion: unset, the value is that number; set, it is a string ("os.environ: a mapping object where keys and
    values are strings", https://docs.python.org/3/library/os.html#os.environ), so the same line fails only when
    someone sets the variable (``timedelta(seconds=os.environ.get('DIST_TIMEOUT', 3600))``: TypeError, VLMEvalKit)."""
    from helpers.lint.python_rules import _call_name, _env_key

    if "environ" not in lt.text and "getenv" not in lt.text:
        return
    for c in lt._calls():
        key = _env_key(c)
        default = c.args[1] if len(c.args) > 1 else next((k.value for k in c.keywords if k.arg == "default"), None)
        if key is None or not (isinstance(default, ast.Constant) and type(default.value) in (int, float)):
            continue
        parent = lt.parents.get(c)
        if isinstance(parent, ast.Call) and _call_name(parent)[1] in _CONVERSIONS | _STRING_SINKS:
            continue
        if not (isinstance(parent, (ast.Call, ast.keyword, ast.BinOp, ast.Compare, ast.AugAssign)) or
                isinstance(parent, ast.keyword)):
            continue
        lt.add("env-str-as-number", "error", c,
               f"{ast.unparse(c)[:60]}: the default is a number but a set {key} is a string, and it is used as a "
               "number here without a conversion: the line works until someone sets the variable (TypeError, or a "
               "string comparison)", f"convert it: int({ast.unparse(c)})", "https://docs.python.org/3/library/os.html#os.environ")


TORCH_DISTRIBUTED_NAMES = Path(__file__).resolve().parents[1] / "data" / "torch_distributed_names.txt"


@lru_cache(maxsize=1)
def torch_distributed_names() -> frozenset[str]:
    """The lowercase names ``torch.distributed`` has (:data:`TORCH_DISTRIBUTED_NAMES`, taken from the installed torch;
    a test keeps them equal)."""
    return frozenset(line.strip() for line in TORCH_DISTRIBUTED_NAMES.read_text().splitlines()
                     if line.strip() and not line.startswith("#"))


def rule_distributed_api_unknown(lt: PythonLinter) -> None:
    """``dist-api-unknown``: ``dist.<name>`` where ``dist`` is ``torch.distributed`` (``import torch.distributed as
    dist``, ``from torch import distributed as dist``, or spelled out) and the name is none torch.distributed has
    (:func:`torch_distributed_names`) but one a slip away from a name it has (``get_`` left out, or a close spelling):
    ``AttributeError: module 'torch.distributed' has no attribute ...`` when that line runs (icefall's ``dist.rank()``
    for ``dist.get_rank()``).  A name far from every known one may be an API of a newer torch (torchtitan calls
    ``set_timeout``) and is left alone, as are capitalised names (classes such as ``ProcessGroupNCCL``, present only
    in some builds) and a name the file assigns to the module."""
    aliases = {"torch.distributed"} | {name for name, origin in lt.import_origins.items()
                                       if origin == "torch.distributed" and name != "torch"}
    aliases -= {t.id for n in lt.nodes if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    if len(aliases) == 1 and "torch.distributed" not in lt.text:
        return
    import difflib

    known = torch_distributed_names()
    for n in lt.nodes:
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and n.attr[:1].islower() and \
                not n.attr.startswith("_") and n.attr not in known and ast.unparse(n.value) in aliases:
            meant = f"get_{n.attr}" if f"get_{n.attr}" in known else next(
                iter(difflib.get_close_matches(n.attr, known, n=1, cutoff=0.85)), None)
            if meant is None:
                continue  # far from every name: an API of a newer torch (torchtitan's set_timeout), not a slip
            lt.add("dist-api-unknown", "error", n,
                   f"{ast.unparse(n)}: torch.distributed has no '{n.attr}'; '{meant}' is what it has (AttributeError "
                   "when this line runs)", f"{ast.unparse(n.value)}.{meant}",
                   "https://docs.pytorch.org/docs/stable/distributed.html")


_BARRIERS = {"barrier", "wait_for_everyone", "monitored_barrier", "wait_for_everybody"}
_STEP_CALLS = {"backward", "step"}


def _own_calls(loop: ast.For | ast.While | ast.AsyncFor) -> list[ast.Call]:
    """The calls one iteration of ``loop`` makes itself (not inside a nested loop, function or class)."""
    out: list[ast.Call] = []
    todo: list[ast.AST] = list(loop.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.For, ast.While, ast.AsyncFor, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                             ast.Lambda)):
            continue
        if isinstance(node, ast.Call):
            out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out


_DATA_BASES = re.compile(r"(?:^|\.)(?:Sampler|BatchSampler|DistributedSampler|IterableDataset|Dataset)$")


def _stored_names(node: ast.AST) -> set[str]:
    """The names ``node`` assigns (``Name`` nodes in a store context anywhere inside it)."""
    return {x.id for x in ast.walk(node) if isinstance(x, ast.Name) and isinstance(x.ctx, ast.Store)}


def rule_module_attr_without_ddp(lt: PythonLinter) -> None:
    """``model.module`` read on a model ``accelerator.prepare`` returned, with no test that it is wrapped: under one
    process (a single-GPU run, a debug run) ``prepare`` returns the model itself, which has no ``module`` attribute
    ("AttributeError: ... object has no attribute 'module'"); Accelerate's documented way to reach the model under any
    wrapper is ``accelerator.unwrap_model(model)`` ("unwraps the model from the additional layer possible added by
    prepare()", ``_ACC``; PixArt-sigma's train.py logged ``model.module.h``).  Not under an ``if`` / conditional that
    tests ``hasattr``, ``isinstance``, ``module`` or the process count."""
    from helpers.lint.python_rules import _call_name

    if ".module" not in lt.text or ".prepare(" not in lt.text:
        return
    prepared: dict[str, tuple[ast.AST | None, int]] = {}  # name -> (the function that bound it, line)
    for n in lt.nodes:
        if accelerator_prepare(n):
            for tgt in n.targets:  # type: ignore[attr-defined]
                for x in (tgt.elts if isinstance(tgt, ast.Tuple) else [tgt]):
                    if isinstance(x, ast.Name) and "model" in x.id.lower() or isinstance(x, ast.Name) and \
                            any(isinstance(a, ast.Name) and a.id == x.id for a in n.value.args[:1]):
                        prepared[x.id] = (lt._enclosing_function(n), n.lineno)
    if not prepared:
        return
    for node in lt.nodes:
        if not (isinstance(node, ast.Attribute) and node.attr == "module" and isinstance(node.value, ast.Name)
                and node.value.id in prepared and isinstance(node.ctx, ast.Load)):
            continue
        scope, line = prepared[node.value.id]
        fn = lt._enclosing_function(node)
        if scope is not None and (fn is not scope or node.lineno < line):
            continue  # bound in a function: only its own later reads
        name = node.value.id
        if scope is None and fn is not None and \
                any(isinstance(a, (ast.Assign, ast.AugAssign)) and name in _stored_names(a) for a in ast.walk(fn)) and \
                not any(isinstance(g, ast.Global) and name in g.names for g in ast.walk(fn)):
            continue  # the function has a local of that name
        guards = [a for a in _ancestors(lt, node) if isinstance(a, (ast.If, ast.IfExp, ast.While))]
        if any(re.search(r"hasattr|isinstance|type\(|DDP|DistributedDataParallel|module|num_processes|distributed|"
                         r"world_size|DistributedType",
                         ast.unparse(g.test)) for g in guards):
            continue
        if any(isinstance(a, ast.Call) and _call_name(a)[1] in ("hasattr", "getattr") for a in _ancestors(lt, node)):
            continue
        lt.add("module-attr-without-ddp", "warning", node,
               f"{node.value.id}.module: {node.value.id} is what accelerator.prepare returned (line {line}), which is "
               "the model itself under one process: AttributeError 'module' on a single-GPU run",
               f"accelerator.unwrap_model({node.value.id})", _ACC + "#accelerate.Accelerator.unwrap_model")
        return


def rule_collective_in_sampler(lt: PythonLinter) -> None:
    """A collective (``dist.barrier()``, ``accelerator.wait_for_everyone()``, an all-reduce) inside the ``__iter__`` /
    ``__getitem__`` / ``__next__`` of a Sampler or Dataset class: it runs once per batch or sample this rank's data
    yields, and each rank's sampler decides that from its own data (buckets exhausted, uneven shards), so the ranks
    call it a different number of times and the last ones wait forever ("Every rank of the group calls the same
    collectives in the same order", ``_COLL``); in DataLoader workers (num_workers > 0) there is no process group at all
    (bghira/SimpleTuner removed the per-batch wait_for_everyone from its MultiAspectSampler)."""
    for cls in (n for n in lt.nodes if isinstance(n, ast.ClassDef)
                and any(_DATA_BASES.search(ast.unparse(b)) for b in n.bases)):
        for fn in (b for b in cls.body if isinstance(b, ast.FunctionDef)
                   and b.name in ("__iter__", "__getitem__", "__next__", "__getitems__")):
            hit = next((c for c in ast.walk(fn) if isinstance(c, ast.Call) and lt.collective_name(c)), None)
            if hit is None:
                continue
            lt.add("collective-in-sampler", "warning", hit,
                   f"{lt.collective_name(hit)} runs in {cls.name}.{fn.name}: once per item this rank's data yields, "
                   "which differs between ranks (and in a DataLoader worker no process group exists): the ranks "
                   "reach it a different number of times and hang",
                   "synchronise in the training loop (once per step or epoch), not inside the sampler or dataset",
                   _COLL)
            return


def rule_barrier_every_step(lt: PythonLinter) -> None:
    """A barrier (``dist.barrier()``, ``accelerator.wait_for_everyone()``) as a plain statement of the training-step
    loop (the loop whose own iteration calls ``backward``/``optimizer.step``), under no condition: every step waits
    for the slowest rank ("This collective blocks processes until the whole group enters this function", ``_DIST``
    barrier; Accelerate's wait_for_everyone "Will stop the execution of the current process until every other process
    has reached that point ... Useful to do before saving a model", ``_ACC``).  The gradient all-reduce already
    synchronises the step; the extra barrier stalls every rank on every step (multi-node utilisation drops).  Keep it
    in the branch that saves or evaluates."""
    from helpers.lint.python_rules import _call_name

    if not any(b in lt.text for b in _BARRIERS):
        return
    for c in lt._calls():
        if _call_name(c)[1] not in _BARRIERS:
            continue
        stmt = lt.parents.get(c)
        loop = lt.parents.get(stmt) if isinstance(stmt, ast.Expr) else None
        if not isinstance(loop, (ast.For, ast.While, ast.AsyncFor)) or stmt not in loop.body:
            continue
        steps = sorted((x for x in _own_calls(loop) if _call_name(x)[1] in _STEP_CALLS
                        and "sched" not in _call_name(x)[0].lower()),  # a scheduler may step once an epoch
                       key=lambda x: (_call_name(x)[1] != "backward", x.lineno))
        if not steps:
            continue
        lt.add("barrier-every-step", "warning", c,
               f"{ast.unparse(c)} runs on every iteration of the training loop (line {loop.lineno}, "
               f"{ast.unparse(steps[0].func)} at line {steps[0].lineno}): every step waits for the slowest rank, "
               "on top of the gradient all-reduce",
               "call it only where it is needed: inside the save/evaluation branch (if step % save_steps == 0: "
               "wait_for_everyone(); save on the main process)", _ACC)


BLANK_TRACKER = frozenset({"finish", "log", "main_process_only", "start", "store_init_configuration"})
"""What the stand-in tracker answers: ``Accelerator.get_tracker`` returns ``GeneralTracker(_blank=True)`` on every
process that holds no tracker ("Handle tracker only made on main process", accelerate/accelerator.py get_tracker;
W&B, TensorBoard, MLflow ... trackers are made on the main process only, ``main_process_only = True`` in
accelerate/tracking.py); ``dir()`` of that object in accelerate 1.15 is this set."""


def rule_tracker_on_every_rank(lt: PythonLinter) -> None:
    """``accelerator.get_tracker("wandb").run`` (or ``.tracker``, ``.log_images`` ...) outside a main-process gate:
    on the other processes ``get_tracker`` returns a blank ``GeneralTracker`` without the run, so they stop with
    ``AttributeError: 'GeneralTracker' object has no attribute 'run'`` (allenai/open-instruct#1539 moved its
    ``wandb_tracker.run.url`` reads under ``accelerator.is_main_process``)."""
    from helpers.lint.python_rules import _call_name

    if "get_tracker" not in lt.text:
        return
    tracker_names: set[str] = set()
    for node in lt.nodes:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and _call_name(node.value)[1] == "get_tracker":
            tracker_names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    for node in lt.nodes:
        if not isinstance(node, ast.Attribute) or node.attr in BLANK_TRACKER or node.attr.startswith("_"):
            continue
        v = node.value
        direct = isinstance(v, ast.Call) and _call_name(v)[1] == "get_tracker"
        if not (direct or isinstance(v, ast.Name) and v.id in tracker_names):
            continue
        if lt._rank_gate(node) is not None or lt._after_rank_exit(node):
            continue
        fn = lt._enclosing_function(node)
        if fn is not None and lt._function_only_called_gated(fn):
            continue
        lt.add("main-process-object-every-rank", "error", node,
               f"{ast.unparse(node)[:70]} runs on every process, but only the main process holds the tracker: the "
               f"others get a blank GeneralTracker, which has no '{node.attr}' (AttributeError on every rank but 0)",
               "read it under `if accelerator.is_main_process:` (or keep the value from the main process)",
               _ACC + "#accelerate.Accelerator.get_tracker")


_MULTI_NODE = re.compile(r"\b(?:num_machines|machine_rank|node_rank|nnodes|num_nodes|NODE_RANK)\b")


def rule_master_port_per_node(lt: PythonLinter) -> None:
    """``MASTER_PORT`` set from a port this machine finds free (a function that binds port 0, or one named for it),
    in a launcher that handles several machines, outside a ``machine_rank == 0`` branch: every node picks its own
    port, but env:// needs the one port rank 0's store listens on, on every node ("MASTER_PORT - required; has to be
    a free port on machine with rank 0", ``_DIST`` environment-variable initialization).  The other nodes connect to
    a port nobody listens on and the rendezvous times out (Megvii-BaseDetection/YOLOX#240)."""
    from helpers.lint.python_rules import _call_name, _dotted

    if not _MULTI_NODE.search(lt.text) or not re.search(r"MASTER_PORT|master_port|main_process_port", lt.text):
        return
    finders = {f.name for f in lt.nodes if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
        re.search(r"(free|available|open|unused)_port", f.name) or any(isinstance(c, ast.Call) and _call_name(c)[1] == "bind" and c.args and
                                     isinstance(c.args[0], ast.Tuple) and len(c.args[0].elts) == 2 and
                                     isinstance(c.args[0].elts[1], ast.Constant) and c.args[0].elts[1].value == 0
                                     for c in ast.walk(f)))}
    if not finders:
        return
    picked = {t.id for node in lt.nodes if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
              and _call_name(node.value)[1] in finders for t in node.targets if isinstance(t, ast.Name)}
    for node in lt.nodes if "MASTER_PORT" in lt.text else []:
        if not (isinstance(node, ast.Assign) and any(isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)
                                                     and t.slice.value == "MASTER_PORT" for t in node.targets)):
            continue
        src = [n for n in ast.walk(node.value) if isinstance(n, ast.Name) and n.id in picked or
               isinstance(n, ast.Call) and _call_name(n)[1] in finders]
        fn = lt._enclosing_function(node)
        if not src or fn is None or not _MULTI_NODE.search(ast.unparse(fn)):
            continue
        gated = any(isinstance(a, ast.If) and re.search(r"(machine|node)_rank\s*==\s*0", ast.unparse(a.test))
                    for a in _ancestors(lt, node))
        if gated:
            continue
        lt.add("master-port-random-per-node", "error", node,
               f"MASTER_PORT comes from a port this machine finds free ({ast.unparse(node.value)[:40]}) in a launcher "
               f"for several machines ({_dotted(node.targets[0].value)}): each node picks its own, the other nodes "
               "connect to a port rank 0's store does not listen on (the rendezvous times out)",
               "choose the port on machine 0 and give the same value to every node (a fixed --master-port, or share "
               "it with the address)", _DIST + "#environment-variable-initialization")
    # a per-node launch command built in a loop over the hosts, its master port probed anew in every iteration
    for node in lt.nodes:
        if not (isinstance(node, ast.keyword) and node.arg in ("master_port", "main_process_port", "port") and
                isinstance(node.value, ast.Call) and _call_name(node.value)[1] in finders):
            continue
        loop = next((a for a in _ancestors(lt, node) if isinstance(a, ast.For)), None)
        if loop is None or not re.search(r"(?i)host|node|machine|worker", ast.unparse(loop.iter)):
            continue
        lt.add("master-port-random-per-node", "error", node.value,
               f"{node.arg}={ast.unparse(node.value)[:40]} is probed again for every node of `for ... in "
               f"{ast.unparse(loop.iter)[:30]}`: each node's launcher gets its own port, and the nodes after the "
               "first connect to a port rank 0's store does not listen on (the rendezvous times out)",
               "probe the port once, before the loop, and give every node the same value",
               _DIST + "#environment-variable-initialization")


_RANK_FIELDS = frozenset({"local_rank", "global_rank", "rank", "node_rank"})
"""Per-process option fields (the world size is the same in every process: reloading it loses nothing of this one)."""


def _attr_targets(node: ast.Assign, name: str) -> set[str]:
    """``{attr}`` of every ``name.attr`` the assignment sets, tuple targets included."""
    from helpers.lint.wrappers import flat_targets

    return {t.attr for t in flat_targets(node)
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == name}


_LOADERS = frozenset({"load", "safe_load", "full_load", "loads"})


def rule_rank_overwritten_on_resume(lt: PythonLinter) -> None:
    """Options reloaded from a saved file (``opt = argparse.Namespace(**yaml.load(f))``, ``args = torch.load(...)
    ["args"]``) after the process's rank was put in them, and the rank read again afterwards: the file was written
    by one process (rank 0) of an earlier run, so every process now carries rank 0's ``local_rank``/``global_rank``
    (torchrun sets RANK/LOCAL_RANK/WORLD_SIZE for each process at each start, ``_TORCHRUN`` environment variables;
    ultralytics/yolov5#1810: after --resume every rank called set_device(0))."""
    from helpers.lint.python_rules import _call_name

    if not re.search(r"\b(?:local_rank|global_rank)\b", lt.text):
        return
    by_scope: dict[ast.AST | None, list[ast.Assign]] = {}  # each function's own assignments (None: module level)
    for n in lt.nodes:
        if isinstance(n, ast.Assign):
            by_scope.setdefault(lt._enclosing_function(n), []).append(n)
    for scope, stmts in by_scope.items():
        fn = lt.tree if scope is None else scope
        for node in stmts:
            if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name):
                continue
            name = node.targets[0].id
            if not any(isinstance(c, ast.Call) and _call_name(c)[1] in _LOADERS for c in ast.walk(node.value)):
                continue
            before = {a for n in stmts if n.lineno < node.lineno for a in _attr_targets(n, name)} & _RANK_FIELDS
            if not before:
                continue  # the rank was never put in these options: nothing of this process is lost
            again = {a for n in stmts if n.lineno > node.lineno for a in _attr_targets(n, name)}
            reads = [a for a in ast.walk(fn) if isinstance(a, ast.Attribute) and isinstance(a.ctx, ast.Load)
                     and isinstance(a.value, ast.Name) and a.value.id == name and a.attr in before - again
                     and a.lineno > node.lineno]
            if reads:
                lt.add("rank-overwritten-on-resume", "error", node,
                       f"{name} is replaced from a saved file here after this process's {', '.join(sorted(before))} "
                       f"was put in it, and {name}.{reads[0].attr} is read again (line {reads[0].lineno}): the file "
                       "holds the values of the process that wrote it (rank 0), so every process now has them",
                       f"keep the process's own values across the reload (save {name}.local_rank and "
                       f"{name}.global_rank before it and set them again after)", _TORCHRUN + "#environment-variables")
                break


def _ancestors(lt: PythonLinter, node: ast.AST) -> list[ast.AST]:
    """The nodes that hold ``node``, innermost first, up to the module."""
    out, p = [], lt.parents.get(node)
    while p is not None:
        out.append(p)
        p = lt.parents.get(p)
    return out


def rule_undefined_attribute(lt: PythonLinter) -> None:
    """``self.X`` read as a value (not called) in a class with an ``__init__`` and no base classes, that never
    assigns ``X`` nor defines it: AttributeError at run time."""
    for cls in (n for n in lt.nodes if isinstance(n, ast.ClassDef)):
        if cls.bases or cls.keywords or cls.decorator_list:
            continue
        src = ast.unparse(cls)
        if re.search(r"setattr|__getattr__|__dict__|__slots__", src) or \
                not any(isinstance(n, ast.FunctionDef) and n.name == "__init__" for n in cls.body):
            continue
        called = {id(n.func) for n in ast.walk(cls) if isinstance(n, ast.Call)}  # self.method(): maybe cut from an excerpt
        defined = {n.name for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef))}
        defined |= {t.id for n in cls.body if isinstance(n, (ast.Assign, ast.AnnAssign))
                    for t in assign_targets(n) if isinstance(t, ast.Name)}
        reads = []
        for n in ast.walk(cls):
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
                if isinstance(n.ctx, (ast.Store, ast.Del)):
                    defined.add(n.attr)
                elif id(n) not in called:
                    reads.append(n)
        for n in (t for node in ast.walk(cls) if isinstance(node, (ast.Tuple, ast.List)) for t in node.elts):
            if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store):
                defined.add(n.attr)
        for n in reads:
            if n.attr not in defined and not n.attr.startswith("__"):
                lt.add("undefined-attribute", "error", n,
                       f"self.{n.attr} is read in {cls.name} but never assigned there: AttributeError: '{cls.name}' "
                       f"object has no attribute '{n.attr}'", f"assign self.{n.attr} in __init__ (or use the attribute "
                       "the class does set)", "https://docs.python.org/3/reference/datamodel.html#object.__getattr__")
                break


def rule_set_device_after_init(lt: PythonLinter) -> None:
    """``init_process_group("nccl")`` without ``device_id``, then ``torch.cuda.set_device`` later in the same block:
    the group is made while every rank's current device is still cuda:0, and what the group does before the
    binding (an eager init, a barrier, which guesses the device from the rank when none was used: "using GPU N to
    perform barrier as devices used by this process are currently unknown ... call init_process_group() with a
    device_id", ProcessGroupNCCL) starts on the wrong GPU.  The docs ask for the binding first: "it is the user's
    responsibility to ensure that this is set so that each rank has an individual GPU, via torch.cuda.set_device()"
    (``_DIST``; pytorch/examples#1285 moved set_device before init_process_group).  Info: a script whose first use of
    the group comes after the binding works."""
    from helpers.lint.python_rules import _call_name

    if "set_device" not in lt.text or "nccl" not in lt.text:
        return
    for node in lt.nodes:
        block = getattr(node, "body", None)
        if not isinstance(block, list):
            continue
        init = next(((i, c) for i, st in enumerate(block) if isinstance(st, (ast.Expr, ast.Assign))
                     for c in lt._calls(st) if _call_name(c)[1] == "init_process_group"), None)
        if init is None:
            continue
        i, call = init
        kws = {k.arg for k in call.keywords}
        backend = next((a for a in [*call.args[:1], *(k.value for k in call.keywords if k.arg == "backend")]), None)
        if "device_id" in kws or not (isinstance(backend, ast.Constant) and backend.value == "nccl"):
            continue
        later = next((c for st in block[i + 1:] if isinstance(st, (ast.Expr, ast.Assign))
                      for c in lt._calls(st) if _call_name(c)[1] == "set_device"), None)
        if later is not None:
            # info: with the lazy init (the default) nothing runs on the group before the binding in most scripts
            # (nanoGPT, llm.c bind right after init_process_group and work)
            lt.add("set-device-after-init", "info", later,
                   f"torch.cuda.set_device comes after init_process_group('nccl') (line {call.lineno}), which has no "
                   "device_id: the group is created while every rank's current device is cuda:0 (a barrier or an eager "
                   "init before the binding runs on GPU 0)",
                   "call torch.cuda.set_device(local_rank) before init_process_group (or pass "
                   "device_id=torch.device('cuda', local_rank))", _DIST + "#torch.distributed.init_process_group")


_LAUNCHER_SET = re.compile(r"^(?:ACCELERATE_\w+|FSDP_\w+|LOCAL_RANK|RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK|"
                           r"MASTER_ADDR|MASTER_PORT|TORCHELASTIC_\w+|SLURM_\w+|OMPI_COMM_WORLD_\w+|PMI_\w+)$")
"""Variables a launcher sets for the processes it starts (torchrun's contract, ``accelerate launch``'s
``ACCELERATE_*``/``FSDP_*`` from its config, srun's ``SLURM_*``): unset under another launcher, or none."""


def rule_launcher_env_unset(lt: PythonLinter) -> None:
    """``os.environ.get("ACCELERATE_USE_FSDP").lower()``: ``get`` without a default returns None when the variable is
    unset, and a launcher sets its variables only for the processes it starts and the configurations that need them
    (``accelerate launch`` exports ``ACCELERATE_USE_FSDP`` for an FSDP config only; torchrun's ``_TORCHRUN``
    environment), so the method call raises ``AttributeError: 'NoneType' object has no attribute ...`` under any
    other launch (huggingface/peft#2454)."""
    from helpers.lint.python_rules import _env_key

    for node in lt.nodes:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        got = node.func.value
        if not (isinstance(got, ast.Call) and len(got.args) == 1 and not got.keywords):
            continue
        key = _env_key(got)
        if key is None or not _LAUNCHER_SET.match(key) or isinstance(got.func, ast.Subscript):
            continue
        lt.add("launcher-env-unset", "warning", node,
               f"{ast.unparse(got)}.{node.func.attr}(): {key} is set only by some launchers (and configurations); "
               f"unset, get() returns None and .{node.func.attr}() raises AttributeError: 'NoneType' object has no "
               f"attribute '{node.func.attr}'", f"give it a default: {ast.unparse(got)[:-1]}, \"...\").{node.func.attr}()",
               _TORCHRUN + "#environment-variables")


def _src_env_key(target: ast.Subscript) -> str | None:
    """The key of ``os.environ["KEY"]`` (or ``environ["KEY"]``) as an assignment target; None for anything else."""
    if ast.unparse(target.value) not in ("os.environ", "environ"):
        return None
    key = target.slice
    return key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None


def _one_node_master(lt: PythonLinter, node: ast.AST) -> bool:
    """The function around ``node`` sets ``os.environ["MASTER_ADDR"]`` to a loopback literal (``localhost``,
    ``127.0.0.1``): a one-node spawn, where the local rank is the global rank (sam2's single_proc_run)."""
    scope = lt._enclosing_function(node) or lt.tree
    return any(isinstance(a, ast.Assign) and isinstance(a.value, ast.Constant) and
               a.value.value in ("localhost", "127.0.0.1") and
               any(isinstance(t, ast.Subscript) and _src_env_key(t) == "MASTER_ADDR" for t in a.targets)
               for a in ast.walk(scope))


_PLAIN_SAMPLERS = frozenset({"SequentialSampler", "RandomSampler"})


def rule_sampler_not_distributed(lt: PythonLinter) -> None:
    """A sampler name given a ``DistributedSampler`` (in a branch) and then, unconditionally in the same block, a
    ``SequentialSampler``/``RandomSampler`` before the DataLoader reads it: the distributed one is dead on every rank,
    so each rank goes through the whole dataset (``DistributedSampler``: "restricts data loading to a subset of the
    dataset", ``_DATA``; deepspeedai/DeepSpeedExamples#804: every rank evaluated the whole eval set)."""
    from helpers.lint.python_rules import _call_name

    if "DistributedSampler" not in lt.text:
        return
    for node in lt.nodes:
        for fld in ("body", "orelse"):
            block = getattr(node, fld, None)
            if not isinstance(block, list):
                continue
            distributed: dict[str, int] = {}
            for stmt in block:
                if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call) and \
                        _call_name(stmt.value)[1] in _PLAIN_SAMPLERS:
                    for t in (t for t in stmt.targets if isinstance(t, ast.Name) and t.id in distributed):
                        lt.add("sampler-not-distributed", "warning", stmt,
                               f"{t.id} = {_call_name(stmt.value)[1]}(...) replaces the DistributedSampler assigned at "
                               f"line {distributed[t.id]} on every rank: each rank then loads the whole dataset "
                               "(duplicated work, metrics over N copies)",
                               "keep the distributed sampler (drop this assignment, or put it in the branch that "
                               "runs without a process group)", _DATA + "#torch.utils.data.distributed.DistributedSampler")
                        del distributed[t.id]
                    continue
                for n in ast.walk(stmt):
                    if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and \
                            _call_name(n.value)[1] == "DistributedSampler":
                        distributed.update({t.id: n.lineno for t in n.targets if isinstance(t, ast.Name)})
                    elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in distributed and \
                            not isinstance(stmt, ast.If):
                        distributed.pop(n.id, None)  # read before it is replaced: used as it was meant


_QUANTIZED = ("load_in_4bit", "load_in_8bit", "quantization_config")
_BNB_DEVICE = "https://huggingface.co/docs/trl/en/sft_trainer#multi-gpu-training"


_SHARDS_ITSELF = re.compile(r"\.prepare\(|prepare_data_loader|auto_dataloader|setup_dataloaders|lightning|Lightning|"
                            r"DistributedSampler|DistributedBatchSampler|ElasticDistributedSampler|split_dataset_by_node|"
                            r"NeighborLoader|IterableDataset|wds\.|webdataset|horovod|hvd\.")
"""What shards a loader's data across ranks without a DistributedSampler in the DataLoader call (Accelerate's and
ignite's loader wrappers, Lightning, datasets' split_dataset_by_node, iterable datasets, PyG loaders, Horovod)."""


_DDP_NAMES = ("DistributedDataParallel", "DDP", "DistributedDataParallelCPU")


_DIST_SETUP = frozenset({"DistributedSampler", "DistributedDataParallel", "DDP", "init_process_group", "set_device",
                         "FullyShardedDataParallel", "FSDP"})


def _undefined_names(text: str) -> dict[tuple[int, str], int]:
    """``{(line, name): column}`` of the names ruff's pyflakes check F821 finds undefined in ``text`` (a NameError
    when that line runs).  ruff is the analyser (a project dependency, the linter of this code base); ``{}`` when it
    cannot run."""
    import json
    import subprocess

    from helpers import procs

    ruff = procs.find_tool("ruff")
    if ruff is None:
        return {}
    try:
        proc = subprocess.run([ruff, "check", "--no-cache", "--isolated", "--select", "F821", "--output-format", "json",
                               "--stdin-filename", "x.py", "-"], input=text, capture_output=True, text=True, timeout=10,
                              check=False)
        found = json.loads(proc.stdout or "[]")
    except (OSError, subprocess.SubprocessError, ValueError):
        return {}
    out: dict[tuple[int, str], int] = {}
    for f in found:
        m = re.search(r"`([^`]+)`", f.get("message", ""))
        if m:
            out[(f["location"]["row"], m.group(1))] = f["location"]["column"]
    return out


def rule_undefined_distributed_flag(lt: PythonLinter) -> None:
    """A name that decides the distributed set-up (``DistributedSampler(ds) if distributed else None``, ``if
    distributed: model = DDP(model)``) but is defined nowhere the code can see it: that line raises ``NameError``
    when it runs (ruff's F821 finds the undefined name; NERSC's sc22 tutorial read ``distributed`` in a function
    whose caller set ``params.distributed``); also an undefined name read in the branch that does the set-up (FunASR's
    FSDP wrap policy read ``unwrapped_params``): that branch runs only in the distributed job, so a single-process
    try never reaches it.  Other undefined names are left to a general linter."""
    from helpers.lint.python_rules import _call_name

    if not any(k in lt.text for k in _DIST_SETUP):
        return
    undefined = None
    for node in lt.nodes:
        if isinstance(node, ast.IfExp):
            test, branches = node.test, [node.body, node.orelse]
        elif isinstance(node, ast.If):
            test, branches = node.test, node.body + node.orelse
        else:
            continue
        if not any(isinstance(c, ast.Call) and _call_name(c)[1] in _DIST_SETUP for b in branches for c in ast.walk(b)):
            continue
        names = list(ast.walk(test))
        if isinstance(node, ast.If):  # and the branch that does the set-up, run only in the distributed case
            for branch in (node.body, node.orelse):
                if any(isinstance(c, ast.Call) and _call_name(c)[1] in _DIST_SETUP for s in branch for c in ast.walk(s)) \
                        and not (len(branch) == 1 and isinstance(branch[0], ast.If)):  # an elif: its own If
                    inside = [n for s in branch for n in ast.walk(s)]
                    undefined = _undefined_names(lt.text) if undefined is None else undefined
                    spans = {(n.lineno, n.id) for n in inside if isinstance(n, ast.Name)}
                    if set(undefined) <= spans:  # a whole file: nothing undefined outside the branch (an excerpt
                        names += inside         # leaves its globals undefined everywhere)
        for n in names:
            if not (isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)) or \
                    isinstance(lt.parents.get(n), ast.Attribute):
                continue  # `args.distributed` with no `args` here is an excerpt's global, not this bug
            undefined = _undefined_names(lt.text) if undefined is None else undefined
            if (n.lineno, n.id) in undefined:
                lt.add("undefined-name", "error", n,
                       f"{n.id} {'decides' if any(n is x for x in ast.walk(test)) else 'is read in'} the distributed "
                       "set-up here but is not defined in this scope (nor globally): "
                       f"the line raises NameError: name '{n.id}' is not defined",
                       f"pass it in or read it where it is set (params.{n.id}, args.{n.id})",
                       "https://docs.python.org/3/reference/executionmodel.html#resolution-of-names")
                return


def _other_branches(lt: PythonLinter, a: ast.AST, b: ast.AST) -> bool:
    """``a`` and ``b`` sit in different branches of one ``if`` (body and ``elif`` / ``else``): never both run."""
    for anc in _ancestors(lt, a):
        if isinstance(anc, ast.If):
            in_body = any(a is n for st in anc.body for n in ast.walk(st))
            other = anc.orelse if in_body else anc.body
            if any(b is n for st in other for n in ast.walk(st)):
                return True
    return False


def rule_ddp_before_to_device(lt: PythonLinter) -> None:
    """The model moved (``.to(device)``, ``.cuda()``) or cast after it was wrapped in ``DistributedDataParallel``: the
    constructor registers its gradient hooks and buckets on the parameters it was given ("you should not try to change
    the model's parameters after wrapping up your model with DistributedDataParallel ... gradient reduction functions
    no longer match the correct set of parameters", :data:`_DDP` warning), so move the module first, then wrap it
    (narumiruna/pytorch-distributed-example#3)."""
    from helpers.lint.python_rules import _call_name

    for node in lt.nodes:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and
                isinstance(node.value, ast.Call) and _call_name(node.value)[1] in _DDP_NAMES):
            continue
        name = node.targets[0].id
        scope = lt._enclosing_function(node) or lt.tree
        for c in ast.walk(scope):
            if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and \
                    isinstance(c.func.value, ast.Name) and c.func.value.id == name and \
                    c.func.attr in ("to", "cuda", "half", "bfloat16") and c.lineno > node.lineno and \
                    not _other_branches(lt, node, c):
                lt.add("ddp-before-to-device", "warning", c,
                       f"{name}.{c.func.attr}(...) after {name} was wrapped in {_call_name(node.value)[1]} (line "
                       f"{node.lineno}): DDP registered its gradient hooks on the parameters as they were, and moving "
                       "or casting them afterwards leaves the reduction out of step with the parameters that train",
                       f"move the model first ({name}.{c.func.attr}(...) on the plain module), then wrap it: "
                       "DistributedDataParallel(model, device_ids=[local_rank])", _DDP)
                break


def _dict_keys(lt: PythonLinter, name: str, depth: int = 2) -> dict[str, ast.expr]:
    """The constant keys (and values) a dict held by ``name`` gets anywhere in the file: ``name = {...}`` literals and
    ``name.update(other)`` of a literal or of another such name (``train_kwargs.update(cuda_kwargs)``)."""
    out: dict[str, ast.expr] = {}
    if depth < 0:
        return out
    for node in lt.nodes:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets) and \
                isinstance(node.value, ast.Dict):
            out.update((k.value, v) for k, v in zip(node.value.keys, node.value.values)
                       if isinstance(k, ast.Constant) and isinstance(k.value, str))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update" and \
                isinstance(node.func.value, ast.Name) and node.func.value.id == name and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Dict):
                out.update((k.value, v) for k, v in zip(arg.keys, arg.values)
                           if isinstance(k, ast.Constant) and isinstance(k.value, str))
            elif isinstance(arg, ast.Name):
                out.update(_dict_keys(lt, arg.id, depth - 1))
    return out


def rule_loader_without_distributed_sampler(lt: PythonLinter) -> None:
    """Data parallel training whose loader gives every rank the whole dataset: the file wraps its model in
    ``DistributedDataParallel`` and builds a ``DataLoader(..., shuffle=True)`` with no ``sampler=`` while nothing in
    the file shards the data (no DistributedSampler, no loader wrapper of a library: :data:`_SHARDS_ITSELF`); or it
    makes a ``DistributedSampler`` that no DataLoader reads.  DDP averages gradients but splits no data: "It is up to
    the user to ... split the data" is DistributedSampler's job ("restricts data loading to a subset of the dataset",
    ``_DATA``), so each rank trains on every sample, N times the work per epoch (kubeflow/trainer#2012, torchft#74)."""
    from helpers.lint.python_rules import _call_name

    if "DistributedDataParallel" not in lt.text and not re.search(r"\bDDP\(", lt.text):
        return
    loads = {n.id for n in lt.nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    for node in lt.nodes:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and
                _call_name(node.value)[1].endswith("DistributedSampler")):
            continue
        for t in (t for t in node.targets if isinstance(t, ast.Name) and t.id not in loads):
            lt.add("sampler-not-distributed", "warning", node,
                   f"{t.id} = {_call_name(node.value)[1]}(...) is never read: no DataLoader gets it (sampler=), so "
                   "each rank loads the whole dataset while DDP averages the gradients",
                   f"DataLoader(..., sampler={t.id}) and drop shuffle=True (the sampler shuffles; call "
                   f"{t.id}.set_epoch(epoch) every epoch)", _DATA + "#torch.utils.data.distributed.DistributedSampler")
    if _SHARDS_ITSELF.search(lt.text):
        return
    for node in lt.nodes:
        if not (isinstance(node, ast.Call) and _call_name(node)[1] == "DataLoader"):
            continue
        origin = lt.import_origins.get(node.func.id, "torch") if isinstance(node.func, ast.Name) else "torch"
        if not origin.startswith("torch"):   # dgl.dataloading.DataLoader(use_ddp=...) and other libraries' loaders
            continue
        kws = {k.arg: k.value for k in node.keywords}
        for k in node.keywords:  # DataLoader(ds, **train_kwargs): the keys of the dicts that name holds
            if k.arg is None and isinstance(k.value, ast.Name):
                kws.update((key, v) for key, v in _dict_keys(lt, k.value.id).items() if key not in kws)
        shuffle = kws.get("shuffle")
        if "sampler" in kws or "batch_sampler" in kws or "use_ddp" in kws or \
                not (isinstance(shuffle, ast.Constant) and shuffle.value is True):
            continue
        lt.add("sampler-not-distributed", "warning", node,
               "DataLoader(..., shuffle=True) without a DistributedSampler in a file that trains under "
               "DistributedDataParallel: DDP splits no data, so every rank goes through the whole dataset (N times the "
               "work per epoch, each sample N times)",
               "sampler = DistributedSampler(dataset) (shuffles itself; sampler.set_epoch(epoch) every epoch) and "
               "DataLoader(dataset, sampler=sampler, shuffle=False)", _DATA + "#torch.utils.data.distributed.DistributedSampler")
        return


_IN_PLACE_REDUCE = frozenset({"all_reduce", "reduce"})


def rule_collective_same_tensor_twice(lt: PythonLinter) -> None:
    """The same tensor all-reduced twice in one block with nothing assigned to it between the calls: ``all_reduce``
    works in place ("the final result ... will be in tensor"; ``_COLL``), so the second call reduces the first one's
    sum (N x N times one rank's value after a SUM); it is usually a copy-paste where another tensor was meant, which is
    then never reduced (pyg-team/pytorch_geometric#9896: train_acc reduced three times, val_acc and test_acc never)."""
    from helpers.lint.python_rules import _call_name

    for node in lt.nodes:
        for fld in ("body", "orelse"):
            block = getattr(node, fld, None)
            if not isinstance(block, list):
                continue
            seen: dict[str, int] = {}
            for stmt in block:
                call = stmt.value if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) else None
                if call is not None and lt.collective_name(call) and _call_name(call)[1] in _IN_PLACE_REDUCE and call.args:
                    key = ast.unparse(call.args[0])
                    if key in seen:
                        lt.add("collective-same-tensor-twice", "warning", stmt,
                               f"{ast.unparse(call)[:60]} reduces {key} again (first at line {seen[key]}) with nothing "
                               f"assigned to it between: {_call_name(call)[1]} works in place, so the second call "
                               "reduces the first one's result; another tensor was likely meant, and it is never reduced",
                               f"reduce each tensor once: {_call_name(call)[1]}(<the other tensor>)", _COLL)
                        del seen[key]
                        continue
                    seen[key] = stmt.lineno
                    continue
                if not seen:
                    continue  # nothing reduced yet in this block: no assignment to look for
                written = {ast.unparse(t) for n in ast.walk(stmt) if isinstance(n, (ast.Assign, ast.AugAssign))
                           for t in (n.targets if isinstance(n, ast.Assign) else [n.target])}
                seen = {k: v for k, v in seen.items() if not any(k == w or k.startswith(w + ".") or
                                                                 k.startswith(w + "[") for w in written)}


def rule_quantized_model_no_device_map(lt: PythonLinter) -> None:
    """``from_pretrained(..., load_in_4bit=True / quantization_config=...)`` without ``device_map`` in a script that
    runs on several processes, before anything binds the process's GPU (``set_device``, ``Accelerator()``,
    ``PartialState()``): transformers then places the quantized weights on ``torch.cuda.current_device()`` (its
    bitsandbytes quantizer: "The device_map was not initialized. Setting device_map to {'':
    torch.cuda.current_device()}"), which is GPU 0 on every rank, and training refuses a quantized model on
    another device.  TRL's multi-GPU recipe passes ``device_map={"": PartialState().process_index}`` (``_BNB_DEVICE``;
    huggingface/trl#1353)."""
    from helpers.lint.python_rules import _call_name

    if not re.search(r"load_in_4bit|load_in_8bit|BitsAndBytesConfig", lt.text) or not re.search(
            r"Accelerator|PartialState|Trainer\(|accelerate|LOCAL_RANK|local_rank|init_process_group", lt.text):
        return
    binds = [c.lineno for c in lt._calls() if _call_name(c)[1] in ("set_device", "Accelerator", "PartialState")]
    for c in lt._calls():
        if _call_name(c)[1] != "from_pretrained":
            continue
        kws = {k.arg: k.value for k in c.keywords if k.arg}
        if "device_map" in kws or None in {k.arg for k in c.keywords}:  # device_map given, or **kwargs may hold it
            continue
        q = next((k for k in _QUANTIZED if k in kws and not (isinstance(kws[k], ast.Constant) and kws[k].value in
                                                               (False, None))), None)
        if q is None or any(b < c.lineno for b in binds):
            continue
        lt.add("quantized-model-no-device-map", "warning", c,
               f"from_pretrained(..., {q}=...) without device_map, before this process's GPU is bound: transformers "
               "puts the quantized weights on torch.cuda.current_device(), GPU 0 on every rank ('You can't train a "
               "model that has been loaded in 8-bit precision on a different device')",
               "device_map={'': PartialState().process_index} (or Accelerator().local_process_index)", _BNB_DEVICE)


_INFERENCE_MODE = "https://docs.pytorch.org/docs/stable/generated/torch.autograd.grad_mode.inference_mode.html"


def rule_fsdp_inference_mode(lt: PythonLinter) -> None:
    """A function under ``@torch.inference_mode()`` (or a ``with torch.inference_mode():`` block) in a file that trains
    with FSDP: tensors made in inference mode "cannot be used in autograd later" (``_INFERENCE_MODE``), and FSDP
    keeps the parameters it unshards during that forward, so the next training step fails
    (Lightning-AI/litgpt#703 replaced it with torch.no_grad() for FSDP)."""
    if not re.search(r"FSDPStrategy|FullyShardedDataParallel|fully_shard|strategy=[\"']fsdp", lt.text) or \
            "inference_mode" not in lt.text:
        return
    for node in lt.nodes:
        sites: list[ast.AST] = []
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            sites = [d for d in node.decorator_list if "inference_mode" in ast.unparse(d)]
        elif isinstance(node, ast.With):
            sites = [i.context_expr for i in node.items if "inference_mode" in ast.unparse(i.context_expr)]
        for site in sites[:1]:
            if isinstance(site, ast.Call) and any(isinstance(a, ast.Constant) and a.value is False for a in site.args):
                continue  # inference_mode(False): autograd on
            lt.add("fsdp-inference-mode", "warning", site,
                   "torch.inference_mode() around a model that FSDP shards: the parameters FSDP gathers there become "
                   "inference tensors, which autograd refuses later ('Inference tensors cannot be saved for backward')",
                   "use torch.no_grad() for evaluation under FSDP", _INFERENCE_MODE)


def rule_rank_gated_directory(lt: PythonLinter) -> None:
    """A directory created under a rank gate (``if rank == 0: os.makedirs(ckpt_dir)``) and written into on every
    rank later in the same function, with no barrier between: the other ranks may get there before rank 0 made it,
    or run on a node that never makes it (a node-local disk), and fail with FileNotFoundError
    (karpathy/nanochat: every rank saves its optimizer shard into the directory rank 0 creates).  ``os.makedirs``'s
    ``exist_ok=True`` makes it safe on every rank (https://docs.python.org/3/library/os.html#os.makedirs)."""
    from helpers.lint.python_rules import _call_name, _written_paths

    if "makedirs" not in lt.text and "mkdir" not in lt.text:
        return
    for c in lt._calls():
        recv, name = _call_name(c)
        if name not in ("makedirs", "mkdir") or lt._rank_gate(c) is None:
            continue
        target = c.args[0] if c.args and name == "makedirs" else c.func.value if isinstance(c.func, ast.Attribute) \
            and recv not in ("os",) else None
        if not isinstance(target, ast.Name):
            continue
        fn = lt._enclosing_function(c) or lt.tree
        names = {target.id}
        for n in ast.walk(fn):  # paths built from it: p = os.path.join(d, ...), d / "x", f"{d}/x"
            if isinstance(n, ast.Assign) and n.lineno > c.lineno and any(
                    isinstance(x, ast.Name) and x.id in names for x in ast.walk(n.value)):
                names.update(t.id for t in n.targets if isinstance(t, ast.Name))
        if any(_call_name(n)[1] in ("makedirs", "mkdir") and lt._rank_gate(n) is None for n in ast.walk(fn)
               if isinstance(n, ast.Call)):
            continue  # made on every rank too
        later = sorted((n for n in ast.walk(fn) if isinstance(n, ast.Call) and getattr(n, "lineno", 0) > c.lineno),
                       key=lambda n: n.lineno)
        for w in later:
            wname = _call_name(w)[1]
            if wname == "barrier":
                break
            if lt._write_kind(w) != "file" or lt._rank_gate(w) is not None:
                continue  # what writes a file: the one list of python_rules (torch.save, open(p, "w"), ...)
            if not any(isinstance(x, ast.Name) and x.id in names for a in _written_paths(w) for x in ast.walk(a)):
                continue
            lt.add("rank-gated-object-used", "warning", w,
                   f"{ast.unparse(w)[:60]} runs on every rank and writes into {target.id}, which only "
                   f"`{ast.unparse(getattr(lt._rank_gate(c), 'test', c))[:40]}` creates (line {c.lineno}), with no "
                   "barrier between: another rank can get there first, or run on a node where it was never made "
                   "(FileNotFoundError)",
                   f"create it on every rank (os.makedirs({target.id}, exist_ok=True) is safe to repeat), or "
                   "barrier() after rank 0 creates it", "https://docs.python.org/3/library/os.html#os.makedirs")
            break


def _path_names(lt: PythonLinter, expr: ast.AST) -> set[str]:
    """The names a path expression is built from, an attribute chain kept whole (``args.results_dir``, not ``args``:
    two fields of one namespace are two paths)."""
    out: set[str] = set()
    for x in ast.walk(expr):
        if isinstance(x, ast.Attribute) and isinstance(lt.parents.get(x), ast.Attribute):
            continue  # part of a longer chain
        if isinstance(x, ast.Attribute) and not isinstance(lt.parents.get(x), ast.Call) or \
                isinstance(x, ast.Attribute) and lt.parents[x].func is not x:  # type: ignore[attr-defined]
            out.add(ast.unparse(x))
        elif isinstance(x, ast.Name) and not isinstance(lt.parents.get(x), ast.Attribute):
            out.add(x.id)
    return out


def _path_leaf(expr: ast.AST) -> str | None:
    """The file name a path expression ends in when it is written out (``d / "stats.txt"``,
    ``os.path.join(d, "ckpt.pt")``, ``f"{d}/log.txt"``, ``"out/a.json"``), else None."""
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div):
        expr = expr.right
    elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "join" and expr.args:
        expr = expr.args[-1]
    elif isinstance(expr, ast.JoinedStr) and expr.values and isinstance(expr.values[-1], ast.Constant):
        tail = str(expr.values[-1].value)
        return tail.rsplit("/", 1)[-1] or None if "/" in tail or len(expr.values) == 1 else None
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str) and expr.value:
        return expr.value.rstrip("/").rsplit("/", 1)[-1] or None
    return None


_READS_PATH = {"from_pretrained": None, "load": 0, "open": 0, "read_csv": 0, "read_json": 0, "load_file": 0}
"""Calls that read a file or directory, and which argument names it (None: any argument, as in
``PeftModel.from_pretrained(base, adapter_dir)``); ``open`` only without a write mode."""


def rule_rank_gated_file_read(lt: PythonLinter) -> None:
    """A file written under a rank gate (``if is_main_process: model.save_pretrained(adapter_dir)``) and read right
    after on every rank, with no barrier between: the other ranks may read before rank 0 has written it (an older
    copy, or FileNotFoundError), the race ``dist.barrier()`` after the gated write removes (openvla/openvla: every
    rank loaded the LoRA adapter rank 0 was still saving).  The write and the read are in the same block."""
    from helpers.lint.python_rules import _call_name, _written_paths

    for node in lt.nodes:
        for fld in ("body", "orelse"):
            block = getattr(node, fld, None)
            if not isinstance(block, list):
                continue
            for i, stmt in enumerate(block):
                if not (isinstance(stmt, ast.If) and lt.taint.rank_test(stmt.test)):
                    continue
                names: set[str] = set()
                leaves: set[str | None] = set()
                for c in (n for st in stmt.body for n in ast.walk(st) if isinstance(n, ast.Call)):
                    if lt._write_kind(c) == "file":
                        names.update(x for a in _written_paths(c) for x in _path_names(lt, a))
                        leaves.update(_path_leaf(a) for a in _written_paths(c))
                for a in (n for st in stmt.body for n in ast.walk(st) if isinstance(n, ast.Assign)):
                    if any(isinstance(t, ast.Name) and t.id in names for t in a.targets):
                        names.update(_path_names(lt, a.value))
                if not names:
                    continue
                hit = None
                for later in block[i + 1:]:
                    for c in (n for n in ast.walk(later) if isinstance(n, ast.Call)):
                        recv, name = _call_name(c)
                        if name == "barrier" or name == "wait_for_everyone":
                            hit = False
                            break
                        if name not in _READS_PATH or lt._rank_gate(c) is not None:
                            continue
                        if name == "open" and any(isinstance(m, ast.Constant) and isinstance(m.value, str) and
                                                  set(m.value) & set("wax") for m in c.args[1:2]):
                            continue
                        if name == "load" and recv not in ("torch", "json", "yaml", "np", "numpy", "pickle"):
                            continue
                        at = _READS_PATH[name]
                        args = c.args if at is None else c.args[at:at + 1]
                        if any(x in names for a in args for x in _path_names(lt, a)) and \
                                not (None not in leaves and all(_path_leaf(a) not in leaves | {None} for a in args)):
                            hit = c  # (not where both name their files and the names differ: stats.txt, checkpoint.pth)
                            break
                    if hit is not None:
                        break
                if hit:
                    lt.add("rank-gated-object-used", "warning", hit,
                           f"{ast.unparse(hit)[:60]} runs on every rank and reads what only `"
                           f"{ast.unparse(stmt.test)[:40]}` writes (line {stmt.lineno}), with no barrier between: "
                           "the other ranks can read it before it is written (an old copy, or FileNotFoundError)",
                           "call dist.barrier() (accelerator.wait_for_everyone()) after the gated write, before "
                           "the read", _DIST + "#torch.distributed.barrier")


def rule_save_hook_every_rank(lt: PythonLinter) -> None:
    """A function registered with ``accelerator.register_save_state_pre_hook`` that writes (``save_pretrained``,
    ``torch.save``) with no main-process test: Accelerate calls the hook from ``save_state`` in every process that
    calls it, and under DeepSpeed or FSDP every process must (``save_state`` gathers the sharded state), so each
    writes the same files (huggingface/diffusers#4929 put the hooks' writes under ``accelerator.is_main_process``;
    https://huggingface.co/docs/accelerate/en/package_reference/accelerator#accelerate.Accelerator.register_save_state_pre_hook)."""
    from helpers.lint.python_rules import _call_name

    if "register_save_state_pre_hook" not in lt.text:
        return
    hooks = {c.args[0].id for c in lt._calls() if _call_name(c)[1] == "register_save_state_pre_hook" and c.args
             and isinstance(c.args[0], ast.Name)}
    for node in lt.nodes:
        if not (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in hooks):
            continue
        for c in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
            recv, name = _call_name(c)
            if not (name == "save_pretrained" or name == "save" and recv in ("torch", "safetensors.torch")):
                continue
            if lt._rank_gate(c) is not None or lt._after_rank_exit(c):
                break
            lt.add("write-on-every-rank", "warning", c,
                   f"{ast.unparse(c)[:60]} in the save_state hook {node.name} runs in every process that calls "
                   "save_state, which under DeepSpeed or FSDP is every process: N processes write the same files",
                   "write under `if accelerator.is_main_process:` inside the hook (still pop the weights on every "
                   "process)", _ACC + "#accelerate.Accelerator.register_save_state_pre_hook")
            break


_CUDA_ENV = "https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#cuda-environment-variables"


def rule_visible_devices_as_ordinal(lt: PythonLinter) -> None:
    """A GPU number read from ``CUDA_VISIBLE_DEVICES`` used as this process's device index (``device_id =
    visible[local_rank]``): CUDA makes only the listed GPUs visible and numbers them from 0 in the listed order
    (:data:`_CUDA_ENV`), so with ``CUDA_VISIBLE_DEVICES=4,5,6,7`` rank 0 asks for device 4 of four ('invalid device
    ordinal'), or lands on another rank's GPU (plemeri/InSPyReNet#6 used ``local_rank`` itself)."""
    if "CUDA_VISIBLE_DEVICES" not in lt.text:
        return
    lists: set[str] = set()
    for n in lt.nodes:
        if isinstance(n, ast.Assign) and "CUDA_VISIBLE_DEVICES" in ast.unparse(n.value) and "split" in ast.unparse(n.value):
            lists.update(t.id for t in n.targets if isinstance(t, ast.Name))
    for n in lt.nodes:
        if not (isinstance(n, ast.Assign) and isinstance(n.value, ast.Subscript) and isinstance(n.value.value, ast.Name)
                and n.value.value.id in lists):
            continue
        names = [ast.unparse(t) for t in n.targets]
        if not any(re.search(r"(?i)device|gpu", t) for t in names) or not lt.taint.is_rank(n.value.slice):
            continue
        lt.add("visible-devices-as-ordinal", "error", n,
               f"{ast.unparse(n)[:60]} takes a GPU number from CUDA_VISIBLE_DEVICES as this process's device index, "
               "but CUDA renumbers the visible GPUs from 0: with CUDA_VISIBLE_DEVICES=4,5,6,7 rank 0 asks for "
               "device 4 of 4 ('invalid device ordinal') or takes another rank's GPU",
               f"use the local rank itself as the index: {names[0]} = local_rank", _CUDA_ENV)


_GATHERS_RETURNING = {"gather_for_metrics", "collect_results", "collect_results_gpu", "collect_results_cpu",
                      "pad_across_processes"}
"""Collectives that return what they gathered (Accelerate's ``gather_for_metrics`` / ``pad_across_processes``,
mmengine's ``collect_results``), unlike ``torch.distributed.all_gather``, which fills the list it is given."""


def rule_collective_result_discarded(lt: PythonLinter) -> None:
    """A gathering call whose result is thrown away (an expression statement): every rank joins the collective and
    then keeps its own unmerged data (open-mmlab/mmengine#1208: ``collect_results(self.results, size, 'gpu')`` on a
    line of its own).  ``accelerator.gather`` / ``accelerator.reduce`` count too (they return the result:
    :data:`_ACC`)."""
    from helpers.lint.python_rules import _call_name

    for n in lt.nodes:
        if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)):
            continue
        recv, name = _call_name(n.value)
        if not (name in _GATHERS_RETURNING or name in ("gather", "reduce") and recv.endswith("accelerator")):
            continue
        lt.add("collective-result-discarded", "error", n,
               f"{ast.unparse(n)[:60]}: the gathered result is thrown away; every rank joins the collective and "
               "then goes on with its own part only",
               f"keep it: results = {ast.unparse(n.value)[:50]}", _ACC + "#accelerate.Accelerator.gather_for_metrics")


_TP_TUTORIAL = "https://docs.pytorch.org/tutorials/intermediate/TP_tutorial.html"


def _two_dim_mesh(node: ast.AST) -> bool:
    """``init_device_mesh("cuda", (dp, tp), ...)`` / ``DeviceMesh("cuda", torch.arange(n).view(-1, tp))``: a mesh
    of two (or more) dimensions."""
    from helpers.lint.python_rules import _call_name

    if not isinstance(node, ast.Call):
        return False
    name = _call_name(node)[1]
    if name == "init_device_mesh":
        shape = node.args[1] if len(node.args) > 1 else next((k.value for k in node.keywords if k.arg == "mesh_shape"),
                                                              None)
        return isinstance(shape, (ast.Tuple, ast.List)) and len(shape.elts) >= 2
    if name == "DeviceMesh" and len(node.args) > 1:
        return any(isinstance(c, ast.Call) and _call_name(c)[1] in ("view", "reshape") and len(c.args) >= 2
                   for c in ast.walk(node.args[1]))
    return False


def rule_fsdp_mesh_without_group(lt: PythonLinter) -> None:
    """FSDP wraps a model that tensor parallelism already split over one dimension of a 2-D device mesh, without
    being told the other dimension (``device_mesh=mesh["dp"]`` / ``process_group=`` / ``fully_shard(mesh=...)``): it
    shards and reduces over the whole world, TP peers included, instead of over the data-parallel ranks only
    (pytorch/examples#1160 passed the data-parallel group; the 2-D recipe in :data:`_TP_TUTORIAL` gives FSDP the
    ``dp`` sub-mesh).  Reported for a function that builds a 2-D mesh, calls ``parallelize_module`` and then wraps."""
    from helpers.lint.python_rules import _call_name

    if "parallelize_module" not in lt.text:
        return
    for fn in [n for n in lt.nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))] + [lt.tree]:
        calls = [c for c in ast.walk(fn) if isinstance(c, ast.Call)]
        if not any(_two_dim_mesh(c) for c in calls) or not any(_call_name(c)[1] == "parallelize_module" for c in calls):
            continue
        for c in calls:
            name = _call_name(c)[1]
            if name not in ("FSDP", "FullyShardedDataParallel", "fully_shard"):
                continue
            if any(k.arg in ("device_mesh", "process_group", "mesh") or k.arg is None for k in c.keywords) or \
                    (name == "fully_shard" and len(c.args) > 1):
                continue
            lt.add("fsdp-mesh-without-group", "warning", c,
                   f"{ast.unparse(c)[:60]} wraps a model that parallelize_module split over a 2-D device mesh, but "
                   "names no mesh or group: FSDP shards and all-reduces over the whole world, the tensor-parallel "
                   "peers included, not over the data-parallel dimension",
                   f"pass the data-parallel part: {name}(model, device_mesh=mesh['dp'])"
                   if name != "fully_shard" else "fully_shard(model, mesh=mesh['dp'])", _TP_TUTORIAL)
            break


def run(lt: PythonLinter) -> ScriptContract:
    """Run the single-file contract rules on ``lt``; return the script's :class:`ScriptContract`."""
    sc = script_contract(lt)
    rule_dataloader_sampler_and_shuffle(lt)
    rule_init_contract(lt, sc)
    rule_nccl_no_device_binding(lt, sc)
    rule_collective_before_set_device(lt)
    rule_fsdp_optimizer_before_wrap(lt)
    rule_wrapper_raw_backward(lt)
    rule_syncbn_without_ddp(lt)
    rule_load_without_map_location(lt)
    rule_local_rank_as_global_rank(lt)
    rule_main_process_by_local_rank(lt)
    rule_same_device_every_rank(lt)
    rule_same_seed_every_rank(lt)
    rule_rank_seed_before_model_init(lt)
    rule_fsdp_mesh_without_group(lt)
    rule_rank_gated_directory(lt)
    rule_rank_gated_file_read(lt)
    rule_save_hook_every_rank(lt)
    rule_visible_devices_as_ordinal(lt)
    rule_collective_result_discarded(lt)
    rule_lr_steps_from_dataset_length(lt)
    rule_nccl_cpu_tensor(lt, sc)
    rule_gather_variable_shape(lt)
    rule_world_size_as_local(lt)
    rule_environ_getattr(lt)
    rule_local_rank_spelling(lt, sc)
    rule_rank_zero_falsy(lt)
    rule_resume_skip_every_epoch(lt)
    rule_grad_accum_from_device_count(lt)
    rule_world_size_from_device_count(lt)
    rule_slurm_env(lt)
    rule_env_not_a_number(lt)
    rule_distributed_api_unknown(lt)
    rule_barrier_every_step(lt)
    rule_collective_in_sampler(lt)
    rule_module_attr_without_ddp(lt)
    rule_gather_not_for_metrics(lt)
    rule_ema_before_to_device(lt)
    engine_args_rules.rule_engine_args(lt)
    rule_tracker_on_every_rank(lt)
    rule_master_port_per_node(lt)
    rule_rank_overwritten_on_resume(lt)
    rule_undefined_attribute(lt)
    rule_sampler_not_distributed(lt)
    rule_loader_without_distributed_sampler(lt)
    rule_collective_same_tensor_twice(lt)
    rule_ddp_before_to_device(lt)
    rule_undefined_distributed_flag(lt)
    rule_env_str_as_number(lt)
    rule_cuda_before_set_device(lt)
    rule_allreduce_sum_not_averaged(lt)
    rule_launcher_env_unset(lt)
    rule_set_device_after_init(lt)
    rule_quantized_model_no_device_map(lt)
    rule_fsdp_inference_mode(lt)
    grad_sync_rules.run(lt)
    agreement_rules.run(lt)
    signature_rules.rule_api_unknown_kwarg(lt)
    signature_rules.rule_api_unknown_attribute(lt)
    collect_cpu_tensor_facts(lt)
    lt.facts.contract = sc
    return sc


__all__ = ["DEEPSPEED_ARGS", "ScriptContract", "run", "script_contract"]
