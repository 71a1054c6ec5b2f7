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
from typing import TYPE_CHECKING

from helpers.lint.contracts import _ACC, _DATA, _DIST, _FABRIC, _FSDP, _INIT

if TYPE_CHECKING:
    from helpers.lint.python_rules import PythonLinter

DEEPSPEED_ARGS = {"--deepspeed", "--deepspeed_config", "--deepscale", "--deepscale_config"}
"""What ``deepspeed.add_config_arguments(parser)`` adds (deepspeed/__init__.py ``_add_core_arguments``)."""


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
        r"HfArgumentParser|parse_known_args|add_subparsers|parents\s*=|fromfile_prefix_chars|jsonargparse|"
        r"LightningCLI|hydra|fire\.Fire|typer|click|tyro|simple_parsing|OmegaConf\.from_cli|absl", text)
    options: set[str] = set()
    defaults: dict[str, str] = {}
    dynamic = False
    for (recv, name), c in names:
        if name == "add_argument":
            strs = [a.value for a in c.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
            if len(strs) != len(c.args):
                dynamic = True
            options.update(s for s in strs if s.startswith("-"))
            default = _const(_kw(c, "default"))
            longs = [x for x in strs if x.startswith("--")]
            if isinstance(default, str) and longs:
                defaults[longs[0][2:].replace("-", "_")] = default
        elif name == "add_config_arguments":
            options.update(DEEPSPEED_ARGS)
        elif name in ("parse_args",) and not c.args and not sc.options_line:
            sc.options_line = c.lineno
        elif name in ("add_argument_group", "add_mutually_exclusive_group", "set_defaults"):
            pass
        elif name == "init_process_group":
            sc.init_line = sc.init_line or c.lineno
            backend = _kw(c, "backend") or (c.args[0] if c.args else None)
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
    sc.local_rank_arg = bool({"--local_rank", "--local-rank"} & options)
    if plain_argparse and sc.options_line and not dynamic:
        sc.options = options
    sc.reads_local_rank_env = bool(re.search(r"['\"](LOCAL_RANK|SLURM_LOCALID|OMPI_COMM_WORLD_LOCAL_RANK|MPI_LOCALRANKID)"
                                             r"['\"]", text))
    sc.uses_args_local_rank = bool(re.search(r"\b(args|opt|opts|cfg|config|hparams|params)\.local_rank\b", text))
    return sc


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
                    lt.add("collective-before-init", "error", c,
                           f"{(recv + '.') if recv else ''}{name}() runs before init_process_group (line "
                           f"{block[init_at].lineno}): 'Default process group has not been initialized, please make "
                           "sure to call init_process_group'", "call init_process_group first", _INIT)
                    break


def rule_nccl_no_device_binding(lt: PythonLinter, sc: ScriptContract) -> None:
    """nccl with no per-rank device: every rank of a node computes (and talks NCCL) on cuda:0."""
    text = re.sub(r"#.*", "", lt.text)  # what the code does, not what its comments say
    if sc.backend != "nccl" or sc.spawns:
        return
    if re.search(r"set_device|torch\.cuda\.device\(|device_id\s*=|CUDA_VISIBLE_DEVICES|Accelerator\(|"
                 r"deepspeed\.initialize|init_device_mesh|Fabric\(|Trainer\(", text):
        return  # the device is bound (or a framework binds it)
    bare = re.search(r"\.cuda\(\)|\.to\(\s*['\"]cuda['\"]\s*\)|device\s*=\s*['\"]cuda['\"]|"
                     r"torch\.device\(\s*['\"]cuda['\"]\s*\)", text)
    if not bare:
        return
    lt.add("nccl-no-device-binding", "error", text.count("\n", 0, bare.start()) + 1,
           f"'{bare.group(0)}' under the nccl backend with no torch.cuda.set_device(local_rank) (nor device_id=) "
           "anywhere: 'cuda' is cuda:0 on every rank of a node, so NCCL binds them all to GPU 0 ('Duplicate GPU "
           "detected', or a hang in the first collective)",
           "local_rank = int(os.environ['LOCAL_RANK']); torch.cuda.set_device(local_rank) before "
           "init_process_group", _DIST + "#torch.distributed.all_gather_object")


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
    if m and re.search(r"\bDataParallel\(", text) and not re.search(r"DistributedDataParallel|\bDDP\(", text):
        lt.add("syncbn-without-ddp", "error", text.count("\n", 0, m.start()) + 1,
               "SyncBatchNorm with nn.DataParallel: SyncBatchNorm works only inside DistributedDataParallel with one "
               "GPU per process ('SyncBatchNorm expected input tensor to be on GPU' / 'Default process group has not "
               "been initialized')", "use DistributedDataParallel (torchrun, one process per GPU), or plain "
               "BatchNorm under DataParallel", "https://docs.pytorch.org/docs/stable/generated/torch.nn.SyncBatchNorm.html")


def rule_load_without_map_location(lt: PythonLinter) -> None:
    """``torch.load(path)`` with no ``map_location`` in a multi-GPU script: every rank loads onto the saving GPU."""
    from helpers.lint.python_rules import _call_name

    if not re.search(r"DistributedDataParallel|\bDDP\(|init_process_group|FullyShardedDataParallel", lt.text):
        return
    loads = [c for c in lt._calls() if _call_name(c) == ("torch", "load")]
    if any(_kw(c, "map_location") is not None or len(c.args) > 1 for c in loads):
        return  # the script places its loads itself
    for c in loads:
        lt.add("load-without-map-location", "warning", c,
               f"{ast.unparse(c)[:60]} without map_location: torch.load puts each tensor back on the device it was "
               "saved from (cuda:0), so every rank fills GPU 0 (out of memory, or all ranks on one GPU)",
               "torch.load(path, map_location=f'cuda:{local_rank}') (or 'cpu')",
               "https://docs.pytorch.org/docs/stable/generated/torch.load.html")


_TENSOR_CTORS = {"FloatTensor", "LongTensor", "IntTensor", "DoubleTensor", "tensor", "zeros", "ones", "empty",
                 "full", "as_tensor", "from_numpy", "Tensor"}


def rule_nccl_cpu_tensor(lt: PythonLinter, sc: ScriptContract) -> None:
    """A CPU tensor passed to a collective under nccl ('Tensors must be CUDA and dense')."""
    from helpers.lint.python_rules import _call_name

    if sc.backend != "nccl":
        return
    for call in lt._calls():
        recv, name = _call_name(call)
        if name not in ("all_reduce", "broadcast", "reduce", "all_gather_into_tensor", "reduce_scatter_tensor") or \
                recv not in ("dist", "torch.distributed") or not call.args or not isinstance(call.args[0], ast.Name):
            continue
        var = call.args[0].id
        fn = lt._enclosing_function(call) or lt.tree
        made = [n for n in ast.walk(fn) if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == var
                                                                             for t in n.targets)]
        if len(made) != 1 or not isinstance(made[0].value, ast.Call):
            continue
        ctor = made[0].value
        crecv, cname = _call_name(ctor)
        if crecv != "torch" or cname not in _TENSOR_CTORS or _kw(ctor, "device") is not None:
            continue
        moved = any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("cuda", "to")
                    and isinstance(n.func.value, ast.Name) and n.func.value.id == var for n in ast.walk(fn))
        if not moved:
            lt.add("nccl-cpu-tensor", "error", call,
                   f"{var} (torch.{cname}(...), line {made[0].lineno}) is a CPU tensor and the backend is nccl: "
                   "'Tensors must be CUDA and dense'", f"create it on the GPU: torch.{cname}(..., device='cuda') or "
                   f"{var}.cuda()", _DIST + "#backends")


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
                    for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Name)}
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


def run(lt: PythonLinter) -> ScriptContract:
    """Run the single-file contract rules on ``lt``; return the script's :class:`ScriptContract`."""
    sc = script_contract(lt)
    rule_dataloader_sampler_and_shuffle(lt)
    rule_init_contract(lt, sc)
    rule_nccl_no_device_binding(lt, sc)
    rule_fsdp_optimizer_before_wrap(lt)
    rule_wrapper_raw_backward(lt)
    rule_syncbn_without_ddp(lt)
    rule_load_without_map_location(lt)
    rule_nccl_cpu_tensor(lt, sc)
    rule_grad_accum_from_device_count(lt)
    rule_undefined_attribute(lt)
    lt.facts.contract = sc
    return sc


__all__ = ["DEEPSPEED_ARGS", "ScriptContract", "run", "script_contract"]
