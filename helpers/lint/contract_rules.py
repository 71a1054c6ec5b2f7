"""The facts the cross-file contract rules (:mod:`helpers.lint.cross_rules`) need from a script (its argparse options,
its backend, how it learns its rank and device: :class:`ScriptContract`), and :func:`run`, which runs the Python-script
rules taken from the APIs' documented preconditions (:mod:`helpers.lint.contracts`).  The rules live by the API they
check: :mod:`helpers.lint.collective_rules` (process groups and collectives), :mod:`helpers.lint.device_rules` (device
binding), :mod:`helpers.lint.env_rules` (the launcher's environment), :mod:`helpers.lint.data_rules` (data and seeds
across ranks), :mod:`helpers.lint.checkpoint_rules` (files every rank shares), :mod:`helpers.lint.wrapper_rules`
(DDP / FSDP / engine ordering), plus the modules named in :func:`run`.

Each rule names the documentation URL it comes from (the ``source`` of the finding).  They run on a
:class:`helpers.lint.python_rules.PythonLinter` after its own rules (same tree, parents, taint and suppressions).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from helpers.lint import (
    agreement_rules,
    checkpoint_rules,
    collective_rules,
    data_rules,
    device_rules,
    engine_args_rules,
    env_rules,
    grad_sync_rules,
    scope_rules,
    signature_rules,
    wrapper_rules,
)
from helpers.lint.contract_ast import assigned_once, const, kwarg, last_assignment, subtree

if TYPE_CHECKING:
    from helpers.lint.python_rules import PythonLinter


DEEPSPEED_ARGS = {"--deepspeed", "--deepspeed_config", "--deepscale", "--deepscale_config"}
"""What ``deepspeed.add_config_arguments(parser)`` adds (deepspeed/__init__.py ``_add_core_arguments``)."""


_NO_VALUE_ACTIONS = {"store_true", "store_false", "store_const", "append_const", "count", "help", "version",
                     "BooleanOptionalAction"}
"""argparse actions that take no value on the command line (https://docs.python.org/3/library/argparse.html#action)."""


_TORCH_RANK_READ = re.compile(r"""(?:environ\.get|getenv|environ\.setdefault)\(\s*['"](?:LOCAL_|GROUP_)?RANK['"]|"""
                              r"""environ\[\s*['"](?:LOCAL_)?RANK['"]\s*\](?!\s*=[^=])|local_rank|(?:dist|distributed)\.get_rank\(""")
"""A read of the rank torchrun gives a process (``RANK`` / ``LOCAL_RANK`` from the environment, not an assignment to
them; ``args.local_rank``; a rank asked of a process group)."""


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
            default = const(kwarg(c, "default"))
            longs = [x for x in strs if x.startswith("--")]
            if const(kwarg(c, "required")) is True and strs and all(s.startswith("-") for s in strs):
                required.append((tuple(strs), c.lineno))
            if strs and not strs[0].startswith("-"):
                positionals += 1
            action, nargs = const(kwarg(c, "action")), kwarg(c, "nargs")
            takes: int | None = 0 if action in _NO_VALUE_ACTIONS else 1 if nargs is None else None
            if kwarg(c, "action") is not None and action is None:
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
            backend = kwarg(c, "backend") or (c.args[0] if c.args else None)
            if isinstance(backend, ast.Name):  # backend = 'nccl' once at the top (nanoGPT's config block)
                one = assigned_once(lt, backend.id, c)
                backend = one.value if one is not None else backend
            if isinstance(backend, ast.IfExp) and "is_available" in ast.unparse(backend.test) and \
                    "nccl" in (const(backend.body), const(backend.orelse)):
                backend = ast.Constant("nccl")  # "gloo" if not cuda.is_available() else "nccl": nccl on a GPU node
            if isinstance(const(backend), str):
                sc.backend = str(const(backend)).lower()
            if backend is None and kwarg(c, "device_id") is None and not any(k.arg is None for k in c.keywords):
                # no backend: c10d picks the one registered for the accelerator it detects, nccl for CUDA (both
                # gloo and nccl before 2.6) -- _DIST, init_process_group's ``backend``
                sc.extra["default_backend"] = True
            method = const(kwarg(c, "init_method"))
            explicit = any(k.arg in ("store",) or k.arg is None for k in c.keywords) or len(c.args) > 1 or \
                (isinstance(method, str) and not method.startswith("env://")) or \
                (kwarg(c, "init_method") is not None and method is None)
            sc.env_init = not explicit  # env:// reads MASTER_ADDR/MASTER_PORT (and RANK/WORLD_SIZE unless given)
            if isinstance(backend, ast.Attribute) and not sc.backend:
                sc.extra["backend_attr"] = backend.attr
        elif name == "initialize" and recv.endswith("deepspeed") and kwarg(c, "args") is not None and \
                (kwarg(c, "config") is not None or kwarg(c, "config_params") is not None):
            sc.extra["ds_config_in_call"] = c.lineno  # lint_cross: and --deepspeed_config on the launch line
        elif name in ("spawn", "start_processes", "Process", "launch", "elastic_launch", "notebook_launcher"):
            sc.spawns = True
        elif name == "set_device" and "cuda" in recv and c.args:
            # the same GPU on every rank of a node, unless the call sits in a branch on the rank (-1: not launched)
            fixed = isinstance(const(c.args[0]), int) and not _under_rank_test(lt, c)
            sc.extra.setdefault("const_device", (c.lineno, ast.unparse(c)) if fixed else None)
            if not fixed:
                sc.extra["const_device"] = None
        elif name == "Trainer" and "lightning" in text:
            given = kwarg(c, "devices") if kwarg(c, "devices") is not None else kwarg(c, "gpus")  # gpus=: before 2.0
            dev, nodes = const(given), const(kwarg(c, "num_nodes"))
            sc.trainer = (c.lineno, dev if isinstance(dev, int) else None, nodes if isinstance(nodes, int) else None)
            if isinstance(given, ast.Attribute) and isinstance(given.value, ast.Name):  # gpus=args.gpus: the launch's
                sc.extra["trainer_devices_option"] = "--" + given.attr
    if sc.env_init and re.search(r"environ\[\s*['\"](RANK|WORLD_SIZE|MASTER_ADDR)['\"]\s*\]\s*=|"
                                 r"environ\.setdefault\(\s*['\"](RANK|MASTER_ADDR)|"
                                 r"SLURM_PROCID|OMPI_COMM_WORLD_RANK|PMI_RANK|MPI\.COMM_WORLD|mpi4py|"
                                 r"environ\.update\(", text):
        sc.env_init = False  # the script supplies RANK / WORLD_SIZE itself
    # the script asks whether a launcher started it (RANK read with a -1 / None default, `"RANK" in os.environ`,
    # torch's is_torchelastic_launched()): run with plain python it takes its one-process path, no process group
    sc.extra["checks_launch"] = bool(re.search(
        r"""environ\.get\(\s*['"](?:LOCAL_|GLOBAL_)?RANK['"]\s*,\s*['"]?-1|['"](?:LOCAL_)?RANK['"]\s+(?:not\s+)?in\s+"""
        r"""os\.environ|environ\.get\(\s*['"](?:LOCAL_)?RANK['"]\s*\)\s+is\s+(?:not\s+)?None|"""
        r"""is_torchelastic_launched\(""", text))
    if not sc.backend and sc.extra.get("backend_attr") in defaults:
        sc.backend = defaults[str(sc.extra["backend_attr"])].lower()  # backend=args.dist_backend, default 'nccl'
    sc.extra["sets_visible_devices"] = "CUDA_VISIBLE_DEVICES" in text
    if sc.init_line and not sc.env_init and re.search(r"SLURM_PROCID|PMI_RANK|MV2_COMM_WORLD_RANK|OMPI_COMM_WORLD_RANK",
                                                      text) and not _TORCH_RANK_READ.search(text):
        sc.extra["rank_from_scheduler_only"] = sc.init_line  # lint_cross: wrong under torchrun
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
    elif not options:  # args = parse_args(), imported: the parser of another file
        for (_recv, name), c in names:
            origin = lt.import_origins.get(name, "")
            if "parse" in name and "." in origin and not c.args:
                sc.extra["options_from"] = origin.rsplit(".", 2)[-2]  # cn_clip.training.params.parse_args -> params
                break
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


_SELF = re.compile(r"__file__|sys\.argv\[0\]")


def rule_self_launch(lt: PythonLinter, sc: ScriptContract) -> None:
    """A script that starts itself through a launcher (``cmd = ["deepspeed", f"--num_gpus={n}", script_path] +
    args`` with ``script_path = os.path.abspath(__file__)``, run by ``subprocess``): the command is a launch line
    like any other, checked against the launcher's own parser (:func:`helpers.script_traps.launcher_rejects`:
    ``launcher-option-unknown``), and against this script's parser: the ``deepspeed`` launcher appends
    ``--local_rank=N`` to the script's arguments (unless ``--no_local_rank``), which a plain ``parse_args()`` without
    that option rejects ("unrecognized arguments: --local_rank=0"; ``local-rank-arg-under-launcher``; Roblox/FAI-RL).
    The list's non-literal words (f-strings, names) stand in as placeholders; only its literal options are read."""
    from helpers.script_traps import launcher_rejects

    if not _SELF.search(lt.text):
        return
    selfs = {t.id for n in lt.nodes if isinstance(n, ast.Assign) and _SELF.search(ast.unparse(n.value))
             for t in n.targets if isinstance(t, ast.Name)}
    for node in lt.nodes:
        if not (isinstance(node, ast.List) and node.elts and isinstance(node.elts[0], ast.Constant)):
            continue
        kind = {"deepspeed": "deepspeed", "torchrun": "torchrun"}.get(str(node.elts[0].value))
        if kind is None:
            continue
        at = next((i for i, e in enumerate(node.elts) if isinstance(e, ast.Name) and e.id in selfs or
                   _SELF.search(ast.unparse(e))), None)
        if at is None:
            continue
        words: list[str] = []
        for e in node.elts[1:at]:
            if isinstance(e, ast.Constant) and isinstance(e.value, str):
                words.append(e.value)
            elif isinstance(e, ast.JoinedStr):
                words.append("".join(v.value if isinstance(v, ast.Constant) else "1" for v in e.values))
            else:
                words.append("value")
        problem = launcher_rejects(kind, [*words, "script.py"])
        if problem:
            lt.add("launcher-option-unknown", "error", node,
                   f"this script starts itself with {kind} {' '.join(words)} <script>: {kind}'s own parser rejects "
                   f"it before the script ('{problem}'), so no rank starts",
                   f"put the launcher's options before the script and the script's own after it ({kind} --help lists "
                   "the launcher's)", "https://docs.pytorch.org/docs/stable/elastic/run.html" if kind == "torchrun" else
                   "https://www.deepspeed.ai/getting-started/")
        elif kind == "deepspeed" and "--no_local_rank" not in words and "--no-local-rank" not in words and \
                sc.options is not None and "--local_rank" not in sc.options:
            lt.add("local-rank-arg-under-launcher", "error", node,
                   "this script starts itself with the deepspeed launcher, which appends --local_rank=N to its "
                   "arguments, and its parser does not define --local_rank: every rank stops with 'unrecognized "
                   "arguments: --local_rank=0'", 'parser.add_argument("--local_rank", type=int, default=-1) (or pass '
                   "--no_local_rank to deepspeed)", "https://www.deepspeed.ai/getting-started/#launching-deepspeed-training")


def rule_spawn_args_not_tuple(lt: PythonLinter) -> None:
    """``spawn-args-not-tuple``: ``mp.spawn(main, nprocs=n, args=(cfg))`` -- the parentheses make no tuple, so
    ``args`` is ``cfg`` itself.  ``torch.multiprocessing.spawn`` takes ``args`` as "Arguments passed to fn" and calls
    ``fn(i, *args)`` (https://docs.pytorch.org/docs/stable/multiprocessing.html#spawning-subprocesses): a config
    object is unpacked into its keys or fields (or a TypeError when it is not iterable), so every worker starts with
    the wrong arguments (guochengqian/PointNeXt).  Reported where ``args`` is a literal, an attribute, a call or a
    name last bound to something that is not a tuple or list (a parameter, whose value is unknown, is left alone)."""
    from helpers.lint.python_rules import _call_name

    if "spawn(" not in lt.text:
        return
    for c in lt._calls():
        recv, name = _call_name(c)
        if name not in ("spawn", "start_processes") or not (
                re.search(r"(?:^|\.)(?:mp|multiprocessing)$", recv) or
                lt.import_origins.get(recv or name, "").startswith("torch.multiprocessing")):
            continue
        given = kwarg(c, "args")
        if given is None and len(c.args) > 1:
            given = c.args[1]
        if given is None or isinstance(given, (ast.Tuple, ast.List, ast.Starred)):
            continue
        value: ast.AST | None = given
        if isinstance(given, ast.Name):
            last = last_assignment(lt, given.id, c)
            value = last.value if last is not None else None
        if value is None or isinstance(value, (ast.Tuple, ast.List)) or isinstance(value, ast.Call) and \
                _call_name(value)[1] in ("tuple", "list") or isinstance(value, (ast.BinOp, ast.IfExp)):
            continue
        lt.add("spawn-args-not-tuple", "error", c,
               f"args={ast.unparse(given)[:40]} is not a tuple (parentheses around one value make none): spawn calls "
               f"fn(i, *args), so the workers get the parts of {ast.unparse(given)[:30]} as their arguments",
               f"args=({ast.unparse(given)[:30]},) -- a one-element tuple needs the comma",
               "https://docs.pytorch.org/docs/stable/multiprocessing.html#spawning-subprocesses")


def rule_spawn_result_used(lt: PythonLinter) -> None:
    """``spawn-result-used``: ``res = mp.spawn(fn, nprocs=n)`` (``join=True``, the default) then ``res`` read (returned,
    indexed, passed on): ``torch.multiprocessing.spawn`` returns "None if join is True, ProcessContext if join is
    False" (https://docs.pytorch.org/docs/stable/multiprocessing.html#spawning-subprocesses); the workers' return
    values are dropped, so the caller gets None where it expects the run's results (RecBole's run_recboles: results
    must come back through a queue or a file)."""
    from helpers.lint.python_rules import _call_name

    if "spawn(" not in lt.text:
        return
    for n in lt.nodes:
        if not (isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and _call_name(n.value)[1] == "spawn"
                and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)):
            continue
        recv = _call_name(n.value)[0]
        if not re.search(r"(?:^|\.)(?:mp|multiprocessing|torch\.multiprocessing)$", recv) and \
                lt.import_origins.get(recv, "") not in ("torch.multiprocessing",):
            continue
        join = next((k.value for k in n.value.keywords if k.arg == "join"), None)
        if isinstance(join, ast.Constant) and join.value is False:
            continue  # a ProcessContext: .join() on it is the documented use
        name = n.targets[0].id
        scope = lt._enclosing_function(n) or lt.tree
        read = next((x for x in subtree(scope) if isinstance(x, ast.Name) and x.id == name and
                     isinstance(x.ctx, ast.Load) and x.lineno > n.lineno), None)
        if read is None:
            continue
        lt.add("spawn-result-used", "error", read,
               f"{name} holds what mp.spawn returned (line {n.lineno}), which is None with join=True: the workers' "
               "return values are not passed back, so this reads None where the run's results were meant",
               "send the results back through a torch.multiprocessing Queue / SimpleQueue (or a file rank 0 writes) "
               "and read them after spawn returns", "https://docs.pytorch.org/docs/stable/multiprocessing.html")


def rule_argparse_duplicate_option(lt: PythonLinter) -> None:
    """One parser given the same option string twice (``parser.add_argument("--local_rank", ...)`` at two places):
    argparse's default ``conflict_handler="error"`` raises "argparse.ArgumentError: argument --local_rank:
    conflicting option string: --local_rank" while the parser is built, so no process starts, under any launcher
    (https://docs.python.org/3/library/argparse.html#conflict-handler; Dreambooth-Anything's inpainting script).
    Per receiver, in one function; not for a parser made with ``conflict_handler="resolve"``."""
    from helpers.lint.python_rules import _call_name

    if "add_argument" not in lt.text or 'conflict_handler' in lt.text:
        return
    seen: dict[tuple[ast.AST | None, str, str], ast.Call] = {}
    for c in lt._calls():
        recv, name = _call_name(c)
        if name != "add_argument" or not recv:
            continue
        scope = lt._enclosing_function(c)
        for a in c.args:
            if not (isinstance(a, ast.Constant) and isinstance(a.value, str) and a.value.startswith("-")):
                continue
            key = (scope, recv, a.value)
            if key in seen and not device_rules._other_branches(lt, seen[key], c):  # noqa: SLF001 - one helper
                lt.add("argparse-duplicate-option", "error", c,
                       f"{recv}.add_argument('{a.value}', ...) again (first at line {seen[key].lineno}): argparse stops "
                       f"building the parser with 'ArgumentError: argument {a.value}: conflicting option string: "
                       f"{a.value}', so the script exits before any rank starts",
                       f"keep one add_argument('{a.value}', ...) (or give the second option another name)",
                       "https://docs.python.org/3/library/argparse.html#conflict-handler")
                break
            seen.setdefault(key, c)


def run(lt: PythonLinter) -> ScriptContract:
    """Run the single-file contract rules on ``lt``; return the script's :class:`ScriptContract`."""
    sc = script_contract(lt)
    rule_argparse_duplicate_option(lt)
    data_rules.rule_dataloader_sampler_and_shuffle(lt)
    data_rules.rule_sampler_shuffle_ignored(lt)
    data_rules.rule_rank_arithmetic(lt)
    data_rules.rule_sampler_over_index_list(lt)
    rule_spawn_result_used(lt)
    rule_spawn_args_not_tuple(lt)
    rule_self_launch(lt, sc)
    collective_rules.rule_init_contract(lt, sc)
    device_rules.rule_nccl_no_device_binding(lt, sc)
    device_rules.rule_collective_before_set_device(lt)
    wrapper_rules.rule_fsdp_optimizer_before_wrap(lt)
    wrapper_rules.rule_wrapper_raw_backward(lt)
    wrapper_rules.rule_trainer_step_raw_backward(lt)
    wrapper_rules.rule_stripped_state_dict_into_wrapper(lt)
    wrapper_rules.rule_compiled_state_dict_prefix(lt)
    wrapper_rules.rule_fsdp_meta_without_sync(lt)
    wrapper_rules.rule_state_dict_of_submodule(lt)
    wrapper_rules.rule_syncbn_without_ddp(lt)
    wrapper_rules.rule_dataparallel_per_process(lt)
    wrapper_rules.rule_ddp_wrapper_unused(lt)
    wrapper_rules.rule_lightning_readonly_property(lt)
    wrapper_rules.rule_lightning_hook_order(lt)
    wrapper_rules.rule_attribute_unwrapped_elsewhere(lt)
    wrapper_rules.rule_fsdp2_policy_assigned(lt)
    wrapper_rules.rule_mesh_get_group_without_dim(lt)
    wrapper_rules.rule_zero3_init_nested(lt)
    wrapper_rules.rule_dataparallel_attribute(lt)
    wrapper_rules.rule_unwrap_model_not_a_model(lt)
    device_rules.rule_load_without_map_location(lt)
    device_rules.rule_local_rank_as_global_rank(lt)
    device_rules.rule_main_process_by_local_rank(lt)
    device_rules.rule_same_device_every_rank(lt)
    device_rules.rule_inputs_on_other_device(lt)
    device_rules.rule_bare_cuda_beside_device(lt)
    data_rules.rule_same_seed_every_rank(lt)
    data_rules.rule_seed_everything_without_workers(lt)
    data_rules.rule_rank_seed_before_model_init(lt)
    wrapper_rules.rule_fsdp_mesh_without_group(lt)
    checkpoint_rules.rule_rank_gated_directory(lt)
    checkpoint_rules.rule_makedirs_race(lt)
    checkpoint_rules.rule_rank_gated_file_read(lt)
    checkpoint_rules.rule_save_hook_every_rank(lt)
    checkpoint_rules.rule_metric_init_writes(lt)
    device_rules.rule_visible_devices_as_ordinal(lt)
    collective_rules.rule_collective_result_discarded(lt)
    collective_rules.rule_object_collective_unpicklable(lt)
    collective_rules.rule_bucket_by_python_type(lt)
    collective_rules.rule_rank_function_not_called(lt)
    collective_rules.rule_allreduce_accumulated_twice(lt)
    collective_rules.rule_collective_helper_unguarded(lt)
    collective_rules.rule_nonfinite_loss_break(lt)
    collective_rules.rule_local_used_after_gather(lt)
    collective_rules.rule_gathered_labels_without_rank_offset(lt)
    collective_rules.rule_metric_list_state_after_sync(lt)
    collective_rules.rule_collective_in_filesystem_branch(lt)
    collective_rules.rule_collective_under_poll(lt)
    collective_rules.rule_exception_skips_collective(lt)
    data_rules.rule_lr_steps_from_dataset_length(lt)
    data_rules.rule_lr_steps_given_per_step(lt, sc.options)
    data_rules.rule_lr_steps_times_world_size(lt)
    data_rules.rule_raw_scheduler_in_accumulate(lt)
    data_rules.rule_scheduler_outside_conditional_step(lt)
    collective_rules.rule_nccl_cpu_tensor(lt, sc)
    collective_rules.rule_gather_variable_shape(lt)
    device_rules.rule_world_size_as_local(lt)
    env_rules.rule_environ_getattr(lt)
    env_rules.rule_local_rank_spelling(lt, sc)
    env_rules.rule_local_rank_required(lt)
    env_rules.rule_rank_zero_falsy(lt)
    data_rules.rule_resume_skip_every_epoch(lt)
    device_rules.rule_grad_accum_from_device_count(lt)
    device_rules.rule_world_size_from_device_count(lt)
    env_rules.rule_slurm_env(lt)
    env_rules.rule_env_not_a_number(lt)
    env_rules.rule_launcher_env_overwritten(lt)
    collective_rules.rule_distributed_api_unknown(lt)
    collective_rules.rule_barrier_every_step(lt)
    collective_rules.rule_collective_in_sampler(lt)
    wrapper_rules.rule_module_attr_without_ddp(lt)
    collective_rules.rule_gather_not_for_metrics(lt)
    device_rules.rule_ema_before_to_device(lt)
    engine_args_rules.rule_engine_args(lt)
    engine_args_rules.rule_precision_branch_swapped(lt)
    checkpoint_rules.rule_tracker_on_every_rank(lt)
    checkpoint_rules.rule_raw_wandb_log(lt)
    env_rules.rule_master_port_per_node(lt)
    checkpoint_rules.rule_rank_overwritten_on_resume(lt)
    checkpoint_rules.rule_rank_overwritten_by_setattr_loop(lt)
    checkpoint_rules.rule_dcp_load_raw_optimizer_state(lt)
    checkpoint_rules.rule_state_overwritten_after_load(lt)
    checkpoint_rules.rule_scheduler_not_checkpointed(lt)
    scope_rules.rule_shadowed_import_called(lt)
    wrapper_rules.rule_undefined_attribute(lt)
    data_rules.rule_sampler_not_distributed(lt)
    data_rules.rule_loader_not_prepared(lt)
    data_rules.rule_loader_not_preparable(lt)
    data_rules.rule_loader_without_distributed_sampler(lt)
    data_rules.rule_per_rank_outputs_from_whole_loader(lt)
    data_rules.collect_sampler_facts(lt)
    data_rules.rule_batch_size_not_int(lt)
    data_rules.rule_dataset_len_not_sharded(lt)
    data_rules.rule_batch_times_world_size(lt)
    data_rules.rule_sampler_rng_differs(lt)
    data_rules.rule_shard_read_on_one_rank(lt)
    data_rules.rule_rank_slice_results_on_one_rank(lt)
    data_rules.rule_rank_gated_data_setup(lt)
    data_rules.rule_rank_split_drops(lt)
    data_rules.rule_trainer_loader_override_unsharded(lt)
    data_rules.rule_distributed_sampler_unshuffled(lt)
    data_rules.rule_loader_wrapped_before_prepare(lt)
    collective_rules.rule_collective_same_tensor_twice(lt)
    collective_rules.rule_group_root_as_group_rank(lt)
    collective_rules.rule_strided_shard_gathered_rank_major(lt)
    device_rules.rule_ddp_before_to_device(lt)
    device_rules.rule_ddp_meta_module(lt)
    collective_rules.rule_undefined_distributed_flag(lt)
    env_rules.rule_env_str_as_number(lt)
    device_rules.rule_cuda_before_set_device(lt)
    collective_rules.rule_allreduce_sum_not_averaged(lt)
    env_rules.rule_launcher_env_unset(lt)
    device_rules.rule_set_device_after_init(lt)
    device_rules.rule_quantized_model_no_device_map(lt)
    device_rules.rule_fixed_device_map(lt)
    wrapper_rules.rule_fsdp_inference_mode(lt)
    wrapper_rules.rule_fsdp_clip_grad_norm(lt)
    wrapper_rules.rule_ddp_frozen_model(lt)
    wrapper_rules.rule_trained_module_not_wrapped(lt)
    wrapper_rules.rule_ddp_buffer_after_wrap(lt)
    grad_sync_rules.run(lt)
    agreement_rules.run(lt)
    signature_rules.rule_api_unknown_kwarg(lt)
    signature_rules.rule_api_unknown_attribute(lt)
    signature_rules.rule_stdlib_attribute_unknown(lt)
    collective_rules.collect_cpu_tensor_facts(lt)
    lt.facts.contract = sc
    return sc


__all__ = ["DEEPSPEED_ARGS", "ScriptContract", "run", "script_contract"]
