"""Contract rules on device binding: which GPU each rank binds (``set_device``, ``LOCAL_RANK`` against the global
rank, ``CUDA_VISIBLE_DEVICES``), what is created on the default device before binding, a model moved after it is
wrapped, checkpoints loaded without ``map_location``, world sizes taken from one node's GPU count
(https://docs.pytorch.org/docs/stable/elastic/run.html, https://docs.pytorch.org/docs/stable/notes/cuda.html).
Run by :func:`helpers.lint.contract_rules.run`."""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

from helpers.lint.contract_ast import ancestors, kwarg, src_env_key, subtree
from helpers.lint.contracts import _DDP, _DIST, _INIT, _TORCHRUN
from helpers.lint.wrappers import assign_targets

if TYPE_CHECKING:
    from helpers.lint.contract_rules import ScriptContract
    from helpers.lint.python_rules import PythonLinter


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
        device = kwarg(c, "device")
        if device is not None and not (isinstance(device, ast.Constant) and device.value in ("", None)) and \
                not isinstance(device, ast.IfExp):
            continue
        if isinstance(device, ast.IfExp) and not any(isinstance(b, ast.Constant) and b.value in ("", None)
                                                     for b in (device.body, device.orelse)):
            continue
        model = c.args[0].id
        fn = lt._enclosing_function(c) or lt.tree
        moved = sorted((m for m in subtree(fn) if isinstance(m, ast.Call) and m.lineno > c.lineno and
                        isinstance(m.func, ast.Attribute) and m.func.attr in ("to", "cuda") and
                        isinstance(m.func.value, ast.Name) and m.func.value.id == model), key=lambda m: m.lineno)
        if not moved or any(isinstance(m, ast.Call) and isinstance(m.func, ast.Attribute) and
                            m.func.attr in ("to", "cuda") and isinstance(m.func.value, ast.Name) and
                            m.func.value.id == model and m.lineno < c.lineno for m in subtree(fn)):
            continue  # never moved after, or already on its device before the copy
        lt.add("ema-before-to-device", "warning", c,
               f"{_call_name(c)[1]}({model}, ...) copies the model here, before {ast.unparse(moved[0])[:40]} (line "
               f"{moved[0].lineno}) moves it to the GPU: the EMA copy stays on the CPU (updates mix CPU and CUDA "
               "tensors, or average on the CPU)",
               f"create it after {ast.unparse(moved[0])[:40]}, or give it device=", _TIMM_EMA)


def _binds_device(lt: PythonLinter, stmts: list[ast.stmt]) -> bool:
    """``stmts`` bind this process's GPU on every path through them: ``torch.cuda.set_device(...)``, a
    ``CUDA_VISIBLE_DEVICES`` assignment, or a helper named for the device given the local rank
    (fairchem's ``assign_device_for_local_rank(cpu, local_rank)``); an ``if`` binds when both branches do."""
    from helpers.lint.python_rules import _call_name

    for st in stmts:
        if isinstance(st, ast.If):
            if _binds_device(lt, st.body) and _binds_device(lt, st.orelse):
                return True
            continue
        if isinstance(st, (ast.With, ast.Try)):
            if _binds_device(lt, st.body):
                return True
            continue
        if isinstance(st, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            continue
        for c in (n for n in subtree(st) if isinstance(n, ast.Call)):
            name = _call_name(c)[1]
            if name == "set_device" or "device" in name.lower() and any(
                    re.search(r"local_rank|LOCAL_RANK", ast.unparse(a)) for a in c.args):
                return True
        if "CUDA_VISIBLE_DEVICES" in ast.unparse(st) and isinstance(st, ast.Assign):
            return True
    return False


def _init_path_unbound(lt: PythonLinter) -> None:
    """An ``init_process_group`` on a path that reads the local rank and binds no GPU, in a file whose other init path
    does bind it (``torch.cuda.set_device(local_rank)`` before the SLURM path's init, nothing on the torchrun path's:
    FAIR-Chem/fairchem#931): the author's own set-up shows the binding is needed, and on this path every rank of a
    node stays on cuda:0 for NCCL's communicator and the object collectives."""
    from helpers.lint.python_rules import _call_name

    inits = [c for c in lt._calls() if _call_name(c)[1] == "init_process_group"]
    if len(inits) < 2:
        return
    paths = []
    for c in inits:
        before: list[ast.stmt] = []
        child, p = c, lt.parents.get(c)
        while p is not None and not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
            for field in ("body", "orelse", "finalbody"):
                block = getattr(p, field, None)
                if isinstance(block, list) and child in block:
                    before += block[:block.index(child)]
            child, p = p, lt.parents.get(p)
        if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)) and child in p.body:
            before += p.body[:p.body.index(child)]
        backend = kwarg(c, "backend") or (c.args[0] if c.args else None)
        gloo = isinstance(backend, ast.Constant) and backend.value == "gloo"
        paths.append((c, _binds_device(lt, before), gloo, any(
            re.search(r"LOCAL_RANK|local_rank", ast.unparse(st)) for st in before)))
    if not any(bound for _c, bound, _g, _l in paths):
        return
    for c, bound, gloo, reads_local in paths:
        if not bound and not gloo and reads_local:
            lt.add("nccl-no-device-binding", "warning", c,
                   "this init_process_group path reads the local rank but binds no GPU, while the file's other init "
                   "path calls torch.cuda.set_device first: here every rank of a node stays on cuda:0 (NCCL's "
                   "communicator, barrier() and the object collectives run on GPU 0)",
                   "torch.cuda.set_device(local_rank) on this path too, before init_process_group",
                   _DIST + "#torch.distributed.all_gather_object")
            return


def rule_nccl_no_device_binding(lt: PythonLinter, sc: ScriptContract) -> None:
    """nccl with no per-rank device: every rank of a node computes (and talks NCCL) on cuda:0.  Also where
    ``init_process_group()`` names no backend: c10d then uses the backend registered for the detected accelerator,
    nccl for CUDA (``_DIST``: "If neither backend nor device_id is provided, c10d will detect the accelerator on the
    run-time machine"), and the rule still needs the script's own CUDA use ('cuda', ``.cuda()``)."""
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
    if (sc.backend != "nccl" and not sc.extra.get("default_backend")) or sc.spawns:
        return  # a script that names no backend gets nccl for its CUDA tensors (the check below needs CUDA use)
    if binds:
        if own and not trainer:
            _init_path_unbound(lt)
        return  # the device is bound (or a framework binds it)
    bare = re.search(r"\.cuda\(\)|\.to\(\s*['\"]cuda['\"]\s*\)|device\s*=\s*['\"]cuda['\"]|"
                     r"torch\.device\(\s*['\"]cuda['\"]\s*\)", text)
    per_rank = re.search(r"f['\"]cuda:\{[^}]+\}['\"]|torch\.device\(\s*['\"]cuda['\"]\s*,\s*\w*local_rank",
                         text)  # f"cuda:{local_rank}", guided-diffusion's f"cuda:{MPI...Get_rank() % GPUS_PER_NODE}"
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


def _plain_cuda_names(lt: PythonLinter, scope: ast.AST) -> set[str]:
    """Names ``scope`` assigns only the current CUDA device with no index: ``device = torch.device("cuda")``,
    ``device = "cuda"`` (``.to(device)`` then puts the tensor on whatever device is current: cuda:0 before
    ``set_device``; SageMaker's smddp MNIST example)."""
    from helpers.lint.python_rules import _call_name

    def plain(v: ast.AST) -> bool:
        if isinstance(v, ast.Constant) and v.value == "cuda":
            return True
        return isinstance(v, ast.Call) and _call_name(v)[1] == "device" and len(v.args) == 1 and not v.keywords and \
            isinstance(v.args[0], ast.Constant) and v.args[0].value == "cuda"
    sets: dict[str, list[bool]] = {}
    for n in subtree(scope):
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            sets.setdefault(n.targets[0].id, []).append(plain(n.value))
    return {name for name, kinds in sets.items() if all(kinds)}


def _default_cuda(call: ast.Call) -> bool:
    """``call`` puts something on the current CUDA device without naming one: ``device="cuda"``, ``.cuda()``."""
    if isinstance(call.func, ast.Attribute) and call.func.attr == "cuda" and not call.args and not call.keywords:
        return True
    return any(k.arg == "device" and (isinstance(k.value, ast.Constant) and k.value.value == "cuda" or
                                      isinstance(k.value, ast.JoinedStr) and ast.unparse(k.value) in ("f'cuda'", 'f"cuda"'))
               for k in call.keywords)


def _cuda_before_call_facts(lt: PythonLinter) -> None:
    """Facts for :func:`helpers.lint.cross_rules.cuda_before_set_device_across`: the module-level functions whose own
    body binds the GPU (``torch.cuda.set_device``), and, in each block, default-device CUDA work
    (``device="cuda"``, ``.cuda()``) before a statement that calls a function by its bare name (an imported one:
    OminiControl's ``OminiModel(device="cuda")`` and then ``train(...)``, whose first lines bind the GPU)."""
    from helpers.lint.python_rules import _call_name

    facts = lt.facts
    for fn in getattr(lt.tree, "body", []):
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and any(
                isinstance(st, (ast.Expr, ast.Assign)) and any(_call_name(c)[1] == "set_device" and "cuda" in
                                                               _call_name(c)[0] for c in lt._calls(st))
                for st in fn.body):
            facts.set_device_funcs.add(fn.name)
    if not re.search(r"""device\s*=\s*f?['"]cuda['"]|\.cuda\(\)""", lt.text):
        return
    for node in lt.nodes:
        block = getattr(node, "body", None)
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) or not isinstance(block, list):
            continue
        hit = None
        for st in block:
            if not isinstance(st, (ast.Expr, ast.Assign)):
                continue
            if hit is None and any(_call_name(c)[1] == "set_device" for c in lt._calls(st)):
                break  # bound here first
            if hit is not None:
                for c in lt._calls(st):
                    if isinstance(c.func, ast.Name) and c.func.id not in lt.functions:
                        facts.cuda_before_calls.append((c.func.id, hit.lineno, ast.unparse(hit)[:50], c.lineno))
            hit = hit or next((c for c in lt._calls(st) if _default_cuda(c)), None)


def rule_cuda_before_set_device(lt: PythonLinter) -> None:
    """CUDA work on the default device (``device="cuda"``, ``.cuda()``) in the same block before ``torch.cuda.set_device``
    binds this rank's GPU: every rank of the node is still on cuda:0 then, so each creates a CUDA context (hundreds of
    MB) and its tensors on GPU 0 ("it is the user's responsibility to ensure ... each rank has an individual GPU, via
    torch.cuda.set_device()", ``_DIST``); modded-nanogpt's import-time warm-up tensor, moved below the binding
    (KellerJordan/modded-nanogpt#161)."""
    from helpers.lint.python_rules import _call_name

    _cuda_before_call_facts(lt)
    if "set_device" not in lt.text or not re.search(r"""device\s*=\s*f?['"]cuda['"]|\.cuda\(\)|device\(\s*['"]cuda['"]\s*\)""",
                                                    lt.text):
        return
    for node in lt.nodes:
        block = getattr(node, "body", None)
        if not isinstance(block, list):
            continue
        at = next((i for i, st in enumerate(block) if isinstance(st, (ast.Expr, ast.Assign)) and any(
            _call_name(c)[1] == "set_device" and "cuda" in _call_name(c)[0] for c in lt._calls(st))), None)
        if not at:
            continue
        plain = _plain_cuda_names(lt, node)
        for stmt in block[:at]:
            if not isinstance(stmt, (ast.Expr, ast.Assign)):
                continue
            hit = next((c for c in lt._calls(stmt) if _default_cuda(c) or
                        _call_name(c)[1] == "to" and len(c.args) == 1 and isinstance(c.args[0], ast.Name)
                        and c.args[0].id in plain), None)
            if hit is not None:
                lt.add("cuda-before-set-device", "warning", hit,
                       f"{ast.unparse(hit)[:50]} runs on the current CUDA device before torch.cuda.set_device (line "
                       f"{block[at].lineno}): every rank of the node is still on cuda:0 then, so each creates a CUDA "
                       "context and this tensor on GPU 0", "bind the device first (torch.cuda.set_device(local_rank)), "
                       "then allocate", _DIST)
                break


def _placed(c: ast.Call) -> bool:
    return kwarg(c, "map_location") is not None or len(c.args) > 1


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
        if name not in _CHECKPOINT_LOADERS or kwarg(c, "map_location") is not None or len(c.args) > 1:
            continue
        lt.add("load-without-map-location", "warning", c,
               f"{ast.unparse(c)[:60]} without map_location in a program of one process per GPU that never calls "
               "torch.cuda.set_device: each process restores the checkpoint onto GPU 0 (out of memory, or every "
               "process on one GPU)", f"{name}(..., map_location=f'cuda:{{rank}}') or map_location='cpu' (then "
               ".to(rank)); or torch.cuda.set_device(rank) first", _CHECKPOINT_LOADERS[name])


def rule_load_without_map_location(lt: PythonLinter) -> None:
    """``torch.load(path)`` with no ``map_location`` in a multi-GPU program: every rank loads onto the saving GPU.

    Each such call is a finding, unless one rank only makes it (a rank gate, a function only called under one) or the
    other branch of its ``if`` (or the ``try``/``except`` around it) loads with a ``map_location``: the script chose the placement per case (pytorch/examples imagenet: no map_location only when
    no GPU index is given).  A file that does not itself set up DDP/FSDP (a checkpoint helper module) gets the finding
    when a file linted with it does (:attr:`PyFacts.deferred`).  Not in a file that saves its checkpoints from CPU
    copies (``offload_to_cpu=True``): what it loads back is on the CPU.
    """
    from helpers.lint.python_rules import WRAPS_DDP, _call_name

    here = bool(re.search(WRAPS_DDP, lt.text))
    _load_from_checkpoint_unplaced(lt)
    if re.search(r"offload_to_cpu\s*=\s*True", lt.text) and "torch.save(" in lt.text:
        return  # the file writes its checkpoints from CPU copies (FullStateDictConfig(offload_to_cpu=True)): they load
        # back onto the CPU (pytorch/examples' FSDP checkpoint handler)
    for c in lt._calls():
        if _call_name(c) != ("torch", "load") or _placed(c):
            continue
        if c.args and lt._rank_in_name(c.args[0], c):
            continue  # f"model_rank_{rank}.pt": each rank reads back what it saved from its own device
        fn = lt._enclosing_function(c)
        if lt._rank_gate(c) is not None or fn is not None and lt._function_only_called_gated(fn):
            continue  # one rank loads (PixArt-sigma's validation, called under is_main_process): the others' GPUs
            # stay free
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

    def _beside_global_rank(self, node: ast.AST) -> bool:
        """``node`` (a ``rank`` name) is a parameter of a function that also takes ``global_rank``
        (``def worker(global_rank, rank, world_size)``: there ``rank`` is the one that is not global)."""
        fn = self.lt._enclosing_function(node)
        params = {a.arg for a in fn.args.args + fn.args.kwonlyargs} if isinstance(
            fn, (ast.FunctionDef, ast.AsyncFunctionDef)) else set()
        return "rank" in params and "global_rank" in params

    def is_local(self, node: ast.AST | None) -> bool:
        if isinstance(node, ast.Name) and node.id == "rank" and self._beside_global_rank(node):
            return True
        if isinstance(node, ast.Name):
            return node.id in self.names or node.id in ("local_rank", "localrank", "local_rank_id")
        if isinstance(node, ast.Attribute):
            return node.attr in _LOCAL_ATTRS
        if isinstance(node, (ast.Subscript, ast.Call)):
            key = self._env_key(node)
            if key is not None:
                return key in _LOCAL_ENV
        if isinstance(node, ast.Call):
            recv, name = self._call_name(node)
            if name in ("get_local_rank", "get_node_local_rank"):
                # DeviceMesh.get_local_rank("dp") is the rank along a mesh dimension, not within the node
                return name == "get_node_local_rank" or not (node.args or node.keywords or "mesh" in recv.lower())
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
    here; an error when a linted launch starts this script on several nodes (cross_rules.settle).  Not where the
    same function points MASTER_ADDR at the loopback address (:func:`_one_node_master`): only one node can join.
    """
    from helpers.lint.python_rules import _call_name

    if not re.search(r"local_rank|LOCAL_RANK|LOCALID|LOCALRANKID|local_process_index|get_local_rank|global_rank",
                     lt.text):
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
                                                          {"num_replicas", "world_size"} & set(kws)) and \
                not _one_node_master(lt, c):
            hits.append((c, f"{name}(..., rank={ast.unparse(rank)})"))
        if name == "shard" and "index" in kws and local.is_local(kws["index"]):
            hits.append((c, f"{recv}.shard(..., index={ast.unparse(kws['index'])})"))
    for n in lt.nodes:  # os.environ["RANK"] = str(local_rank): what init_process_group then reads as the global rank
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Subscript) and src_env_key(t) == "RANK"
                                             for t in n.targets) and local.is_local(n.value) and \
                not _one_node_master(lt, n):
            hits.append((n, f"os.environ['RANK'] = {ast.unparse(n.value)}"))
    indexed = [n for n in lt.nodes if isinstance(n, ast.Subscript) and local.is_local(n.slice)]
    sized = {ast.unparse(n.args[0]) for n in lt.nodes if indexed and isinstance(n, ast.Compare) and _world_size(n)
             for n in ast.walk(n) if isinstance(n, ast.Call) and _call_name(n)[1] == "len" and n.args}
    for n in indexed:
        if ast.unparse(n.value) in sized:
            hits.append((n, f"{ast.unparse(n)} (len({ast.unparse(n.value)}) is checked against the world size)"))
    hits += _local_times_share(lt, local)
    hits += _rank_from_either(lt, local)
    for node, what in hits:
        lt.add("local-rank-as-global-rank", "warning", node,
               f"{what} uses the node-local rank where the global rank is meant: on one node they are equal, on "
               "several every node repeats local ranks 0..N-1, so processes of different nodes take the same "
               "shard (duplicated data, a wrongly assembled model) and the rest is never used",
               "use the global rank: int(os.environ['RANK']) / dist.get_rank(); keep LOCAL_RANK for the device only",
               _TORCHRUN + "#environment-variables")


def _core(value: ast.AST) -> ast.AST:
    """``int(os.environ.get("RANK") or 0)`` -> ``os.environ.get("RANK")``: the value under casts and an ``or``
    default."""
    while True:
        if isinstance(value, ast.Call) and isinstance(value.func, ast.Name) and value.func.id in ("int", "str") \
                and value.args:
            value = value.args[0]
        elif isinstance(value, ast.BoolOp) and isinstance(value.op, ast.Or):
            value = value.values[0]
        else:
            return value


def _env_read(node: ast.AST) -> bool:
    """``os.environ.get("X")`` / ``os.getenv("X")`` / ``os.environ["X"]``."""
    return isinstance(node, ast.Call) and re.match(r"os\.(environ\.get|getenv)$", ast.unparse(node.func)) is not None \
        or isinstance(node, ast.Subscript) and ast.unparse(node.value) == "os.environ"


def _rank_from_either(lt: PythonLinter, local: _Local) -> list[tuple[ast.AST, str]]:
    """One name given the global rank in one branch of an ``if`` and a node-local rank in the other (DGL's
    ``get_proc_info``: ``OMPI_COMM_WORLD_RANK`` under Open MPI, ``MPI_LOCALRANKID`` under MPICH, returned as "Rank of
    the current process"): under the second launcher the value repeats on every node.  The local branch is the
    finding; only where both values are launcher variables (icefall's ``local_rank = rank`` on one node is not)."""
    out: list[tuple[ast.AST, str]] = []
    for node in lt.nodes:
        if not (isinstance(node, ast.If) and node.orelse) or \
                isinstance(lt.parents.get(node), ast.If) and lt.parents[node].orelse == [node]:
            continue  # (an elif is read with the chain it continues)
        blocks, branch = [node.body], node
        while len(branch.orelse) == 1 and isinstance(branch.orelse[0], ast.If):
            branch = branch.orelse[0]
            blocks.append(branch.body)
        blocks.append(branch.orelse)
        assigned: dict[str, list[ast.Assign]] = {}
        for block in blocks:
            for st in block:
                if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Name):
                    assigned.setdefault(st.targets[0].id, []).append(st)
        for name, values in assigned.items():  # both read from launcher variables (not icefall's `rank` argument)
            envs = [a for a in values if _env_read(_core(a.value))]
            glob = next((a for a in envs if lt.taint.is_global_rank(_core(a.value))), None)
            loc = next((a for a in envs if local.is_local(_core(a.value))), None)
            if glob is not None and loc is not None and not _one_node_master(lt, loc):
                out.append((loc, f"{name} = {ast.unparse(loc.value)[:50]} (the global rank in another branch, "
                                 f"line {glob.lineno})"))
    return out


def _local_times_share(lt: PythonLinter, local: _Local) -> list[tuple[ast.AST, str]]:
    """``local_rank * per_rank`` where ``per_rank`` is a count divided by the world size (``per_rank, rest =
    divmod(n, world_size)``, ``n // world_size``): a partition of the job's items into world-size parts, indexed by
    the rank within the node (mosaicml/diffusion's generate_images: ``start = dist.get_local_rank() *
    samples_per_rank``), so processes of different nodes take the same part."""
    def share(value: ast.AST) -> bool:  # a division by the world size
        if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "divmod" and len(value.args) == 2:
            return _world_size(value.args[1])
        return isinstance(value, ast.BinOp) and isinstance(value.op, (ast.FloorDiv, ast.Div)) and \
            _world_size(value.right) or isinstance(value, ast.Call) and getattr(value.func, "attr", "") == "ceil" \
            and bool(value.args) and share(value.args[0])

    shares: set[str] = set()
    for n in lt.nodes:
        if isinstance(n, ast.Assign) and share(n.value):
            for t in n.targets:
                first = t.elts[0] if isinstance(t, ast.Tuple) and t.elts else t
                if isinstance(first, (ast.Name, ast.Attribute)):
                    shares.add(ast.unparse(first))
    out: list[tuple[ast.AST, str]] = []
    for n in lt.nodes:
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult):
            for a, b in ((n.left, n.right), (n.right, n.left)):
                if local.is_local(a) and (ast.unparse(b) in shares or share(b)) and not _one_node_master(lt, n):
                    out.append((n, f"{ast.unparse(n)[:60]} (a share of the world size's parts)"))
                    break
    return out


_MAIN_NAME = re.compile(r"^_?(?:(?:if_|is_)(?:main|master|primary|chief)|(?:if_|is_)?(?:main_process|main_proc|"
                        r"master_process|rank_?0|rank_zero|global_zero))$", re.IGNORECASE)
"""A function whose name promises the one process of the whole job (``is_main_process``, ``if_main_process``,
``is_master``, ``is_rank_0``; not ``main``, the entry point), as opposed to one per node (``is_local_main_process``, ``is_local_rank_zero``)."""


_SHARED_EFFECT = re.compile(r"(?i)wandb|mlflow|neptune|comet|tensorboard|SummaryWriter|push_to_hub|upload|"
                            r"log_artifact|save|makedirs|mkdir|download|remove|rmtree|write|dump|init\b")
"""Calls whose effect is shared by the job (a tracker run, a file, the hub), as opposed to a print: what a per-node
"main process" flag must not guard."""


_WRITER_FLAG = re.compile(r"(?i)^_?(?:save|write|log|checkpoint)\w*$")
"""A flag named for who writes (maskrcnn-benchmark's ``save_to_disk = local_rank == 0``, handed to its
checkpointer): a job-wide write, whatever the flag's name says about the main process."""


def rule_main_process_by_local_rank(lt: PythonLinter) -> None:
    """A "main process" test decided by the node-local rank: ``def if_main_process(): return
    int(os.environ["LOCAL_RANK"]) == 0``.  LOCAL_RANK repeats 0..N-1 on every node (torchrun: "LOCAL_RANK - The
    local rank", "RANK - The global rank", ``_TORCHRUN``), so with two nodes two processes pass the test, and what it
    guards (data preparation, checkpoint and log writes, ``run_on_main``) runs once per node on the same shared files.
    Accelerate keeps the two apart for this reason: ``is_main_process`` is "True for one process only",
    ``is_local_main_process`` "True for one process per server" (``_ACC``).  Flagged where a function named for the
    job's main process (:data:`_MAIN_NAME`, without "local"/"node") compares a local rank with 0 and reads no global
    rank (``RANK``, ``get_rank()``) or node rank; a warning (an error under a multi-node launch, cross_rules.settle).
    Also a flag so named, or named for writing (:data:`_WRITER_FLAG`), assigned that test (``self.is_master =
    local_rank == 0``; PrimeIntellect's prime-rl monitor started a W&B run per node)."""
    if not re.search(r"local_rank|LOCAL_RANK|SLURM_LOCALID|get_local_rank", lt.text):
        return
    local = _Local(lt)
    for name, fn in lt.functions.items():
        if not _MAIN_NAME.match(name):
            continue
        nodes = list(subtree(fn))
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
    for n in lt.nodes:  # self.is_master = local_rank == 0: a flag named for the job's main process
        if not (isinstance(n, ast.Assign) and isinstance(n.value, ast.Compare) and len(n.value.ops) == 1
                and isinstance(n.value.ops[0], ast.Eq)):
            continue
        named = next((t for t in n.targets if (lambda x: _MAIN_NAME.match(x) or _WRITER_FLAG.match(x))(
            t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else "")), None)
        sides = (n.value.left, n.value.comparators[0])
        if named is None or not any(local.is_local(x) for x in sides) or \
                not any(isinstance(x, ast.Constant) and x.value in (0, "0") for x in sides):
            continue
        scope = lt._enclosing_function(n) or lt.tree
        if any(lt.taint.is_global_rank(x) or _node_rank(x) for x in subtree(scope)):
            continue
        flag = ast.unparse(named)
        home = scope
        if flag.startswith("self."):  # a flag on the object: read by every method of its class
            while home is not None and not isinstance(home, ast.ClassDef):
                home = lt.parents.get(home)
            home = home or scope
        guarded: list[ast.Call] = []
        for g in ast.walk(home):
            if not (isinstance(g, ast.If) and flag in ast.unparse(g.test)):
                continue
            guarded += [c for st in g.body for c in subtree(st) if isinstance(c, ast.Call)]
            if any(isinstance(x, (ast.Return, ast.Raise)) for st in g.body for x in subtree(st)):
                fn = lt._enclosing_function(g) or lt.tree  # `if not self.is_master: return`: the rest is gated
                guarded += [c for c in subtree(fn) if isinstance(c, ast.Call) and c.lineno > g.end_lineno]
        if guarded and not any(lt._write_kind(c) or _SHARED_EFFECT.search(ast.unparse(c.func)) for c in guarded):
            continue  # it gates prints and evaluation only (TabPFN's fine-tuning example): once per node is harmless
        lt.add("local-rank-as-global-rank", "warning", n,
               f"{ast.unparse(named)} = {ast.unparse(n.value)[:50]} picks the process that does the job's shared "
               f"work (the main process, the writer) by the node-local rank: every node has a local rank 0, so on several nodes {ast.unparse(named)} is true once per node "
               "and what it guards (a tracker run, file writes) runs on each node",
               "compare the global rank: int(os.environ['RANK']) == 0 / dist.get_rank() == 0",
               _TORCHRUN + "#environment-variables")
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


def _fixed_device(v: ast.AST | None) -> str | None:
    """The one GPU a ``device_map`` value names for the whole model (``{"": 0}``, ``0``, ``"cuda:0"``), else None."""
    if isinstance(v, ast.Dict) and len(v.values) == 1:
        v = v.values[0]
    if isinstance(v, ast.Constant) and (isinstance(v.value, int) and not isinstance(v.value, bool) or
                                        isinstance(v.value, str) and re.fullmatch(r"cuda:\d+", v.value)):
        return repr(v.value)
    return None


def rule_fixed_device_map(lt: PythonLinter) -> None:
    """``from_pretrained(..., device_map={"": 0})`` (or a name holding it) in a script that runs on several processes:
    every process loads its whole replica onto GPU 0, and a quantized model refuses to train on another device than
    the one it was placed on ("You can't train a model that has been loaded in 8-bit precision on a different
    device"), so the ranks share one GPU.  TRL's multi-GPU recipe: ``device_map={"": PartialState().process_index}``
    (``_BNB_DEVICE``; huggingface/trl#725 fixed its examples)."""
    from helpers.lint.python_rules import _call_name

    if "device_map" not in lt.text or not re.search(
            r"Accelerator|PartialState|Trainer\(|accelerate launch|LOCAL_RANK|local_rank|init_process_group", lt.text):
        return
    for c in lt._calls():
        if _call_name(c)[1] != "from_pretrained" or lt._rank_gate(c) is not None:
            continue
        given = next((k.value for k in c.keywords if k.arg == "device_map"), None)
        values = [given]
        if isinstance(given, ast.Name):
            fn = lt._enclosing_function(c) or lt.tree
            values = [a.value for a in subtree(fn) if isinstance(a, ast.Assign) and a.lineno < c.lineno
                      and any(isinstance(t, ast.Name) and t.id == given.id for t in a.targets)]
        fixed = next((f for v in values if (f := _fixed_device(v))), None)
        if fixed is None:
            continue
        lt.add("same-device-every-rank", "warning", c,
               f"from_pretrained(..., device_map={ast.unparse(given)[:30]}) puts the whole model on GPU {fixed} in every "
               "process: under a multi-process launch all ranks load onto that one GPU",
               "device_map={'': PartialState().process_index} (or Accelerator().local_process_index)", _BNB_DEVICE)


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
        if isinstance(node.right, ast.Name) and _counts_local_devices(lt, node.right):
            continue  # world_size = len(devices) of this node (DGL's mp.spawn examples): the node's ranks indeed
        lt.add("world-size-as-local", "warning", node,
               f"{ast.unparse(node)[:70]}: the CPUs of this node are divided by the ranks of the whole job; only "
               "the ranks on this node share them (fewer threads than the node has, 0 on a big job)",
               "divide by the ranks on this node: int(os.environ['LOCAL_WORLD_SIZE']) (torchrun), or "
               "torch.cuda.device_count() when every GPU runs one rank", _LOCAL_WORLD)


def _counts_local_devices(lt: PythonLinter, name: ast.Name) -> bool:
    """Every assignment of ``name`` in its function counts this node's GPUs (``len(devices)``, ``len(gpus)``,
    ``torch.cuda.device_count()``): a one-node job, whose world size is the node's rank count."""
    scope = lt._enclosing_function(name) or lt.tree
    values = [a.value for a in subtree(scope) if isinstance(a, ast.Assign) and
              any(isinstance(t, ast.Name) and t.id == name.id for t in a.targets)]
    return bool(values) and all(re.search(r"device_count\(|len\(\s*\w*(?:device|gpu)", ast.unparse(v), re.I)
                                for v in values)


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
        ws = kwarg(c, "world_size") or (c.args[3] if len(c.args) > 3 else None)
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


def _one_node_master(lt: PythonLinter, node: ast.AST) -> bool:
    """The function around ``node`` sets ``os.environ["MASTER_ADDR"]`` to a loopback literal (``localhost``,
    ``127.0.0.1``): a one-node spawn, where the local rank is the global rank (sam2's single_proc_run)."""
    scope = lt._enclosing_function(node) or lt.tree
    return any(isinstance(a, ast.Assign) and isinstance(a.value, ast.Constant) and
               a.value.value in ("localhost", "127.0.0.1") and
               any(isinstance(t, ast.Subscript) and src_env_key(t) == "MASTER_ADDR" for t in a.targets)
               for a in subtree(scope))


_QUANTIZED = ("load_in_4bit", "load_in_8bit", "quantization_config")
_BNB_DEVICE = "https://huggingface.co/docs/trl/en/sft_trainer#multi-gpu-training"


_DDP_NAMES = ("DistributedDataParallel", "DDP", "DistributedDataParallelCPU")


def _other_branches(lt: PythonLinter, a: ast.AST, b: ast.AST) -> bool:
    """``a`` and ``b`` sit in different branches of one ``if`` (body and ``elif`` / ``else``): never both run."""
    for anc in ancestors(lt, a):
        if isinstance(anc, ast.If):
            in_body = any(a is n for st in anc.body for n in subtree(st))
            other = anc.orelse if in_body else anc.body
            if any(b is n for st in other for n in subtree(st)):
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
        for c in subtree(scope):
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


_META_CONTEXT = re.compile(r"^(?:torch\.)?device\(\s*['\"]meta['\"]\s*\)$|(?:^|\.)init_empty_weights\(")
_MATERIALIZE = ("to_empty", "materialize", "load_state_dict")


def rule_ddp_meta_module(lt: PythonLinter) -> None:
    """``ddp-meta-module``: a model built under ``with torch.device("meta"):`` (or accelerate's
    ``init_empty_weights()``) handed to ``DistributedDataParallel`` before anything gives it real storage
    (``to_empty``, a ``load_state_dict(..., assign=True)``): DDP's constructor reads and broadcasts the parameters,
    which meta tensors do not hold ("Tensor.item() cannot be called on meta tensors", reproduced on torch 2.13 with one
    gloo process).  FSDP / ``fully_shard`` accept meta modules and are not this rule (:data:`_DDP`: DDP broadcasts
    the module's state from rank 0 in its constructor)."""
    from helpers.lint.python_rules import _call_name

    for w in lt.nodes:
        if not isinstance(w, ast.With) or not any(_META_CONTEXT.search(ast.unparse(i.context_expr))
                                                  for i in w.items):
            continue
        names = {t.id for n in w.body for t in getattr(n, "targets", []) if isinstance(t, ast.Name)}
        scope = lt._enclosing_function(w) or lt.tree
        for c in subtree(scope):
            if not (isinstance(c, ast.Call) and _call_name(c)[1] in _DDP_NAMES and c.args and
                    isinstance(c.args[0], ast.Name) and c.args[0].id in names and c.lineno > w.end_lineno):
                continue
            name = c.args[0].id
            made = any(isinstance(m, ast.Call) and isinstance(m.func, ast.Attribute) and
                       m.func.attr in _MATERIALIZE and ast.unparse(m.func.value).split(".")[0] == name and
                       w.end_lineno < m.lineno < c.lineno for m in subtree(scope))
            if made:
                continue
            lt.add("ddp-meta-module", "error", c,
                   f"{name} is built under `{ast.unparse(w.items[0].context_expr)[:40]}` (line {w.lineno}) and "
                   f"wrapped in {_call_name(c)[1]} with its parameters still on the meta device: the constructor "
                   "reads and broadcasts them ('Tensor.item() cannot be called on meta tensors')",
                   f"give it storage first ({name}.to_empty(device=device), then initialise or load the weights), "
                   "or shard it with FSDP / fully_shard, which accept meta modules", _DDP)
            break


def rule_quantized_model_no_device_map(lt: PythonLinter) -> None:
    """``from_pretrained(..., load_in_4bit=True / quantization_config=...)`` without ``device_map`` in a script that
    runs on several processes, before anything binds the process's GPU (``set_device``, ``Accelerator()``,
    ``PartialState()``): transformers then places the quantized weights on ``torch.cuda.current_device()`` (its
    bitsandbytes quantizer: "The device_map was not initialized. Setting device_map to {'':
    torch.cuda.current_device()}"), which is GPU 0 on every rank, and training refuses a quantized model on
    another device.  TRL's multi-GPU recipe passes ``device_map={"": PartialState().process_index}`` (``_BNB_DEVICE``;
    huggingface/trl#1353).  Not for FSDP-QLoRA, which sets ``bnb_4bit_quant_storage`` and leaves device_map out on
    purpose (https://huggingface.co/docs/peft/accelerate/fsdp#use-peft-qlora-and-fsdp-for-finetuning-large-models-on-multiple-gpus)."""
    from helpers.lint.python_rules import _call_name

    if not re.search(r"load_in_4bit|load_in_8bit|BitsAndBytesConfig", lt.text) or not re.search(
            r"Accelerator|PartialState|Trainer\(|accelerate|LOCAL_RANK|local_rank|init_process_group", lt.text) or \
            "bnb_4bit_quant_storage" in lt.text:
        return  # (FSDP-QLoRA: the 4-bit weights are stored as a float type FSDP shards, with no device_map)
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


_SEMANTICS = "https://docs.pytorch.org/docs/stable/notes/cuda.html#cuda-semantics"


def rule_inputs_on_other_device(lt: PythonLinter) -> None:
    """In one function, the model moved to the device the function was given or chose (``self.model.to(device)``)
    and then called on inputs moved to another device (``inputs = tokenizer.pad(...).to(self.device)``;
    ``self.model(**inputs)``): a module's parameters and its inputs must share a device ("operations ... between
    tensors on different devices" raise, :data:`_SEMANTICS`), so in a multi-device run, one worker per GPU, every
    worker but the one whose device equals the other expression fails with 'Expected all tensors to be on the same
    device' (FlagEmbedding's encode_single_device).  Not when the inputs' device is read from the model
    (``model.device``) or is the same expression."""
    from helpers.lint.python_rules import _call_name

    if ".to(" not in lt.text:
        return
    moves: dict[ast.AST, dict[str, tuple[str, int]]] = {}  # function -> model expression -> (device, line)
    for st in lt.nodes:  # statements `m.to(d)` (a module moved in place), d a parameter of their function
        if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and _call_name(st.value)[1] == "to"):
            continue
        c = st.value
        fn = lt._enclosing_function(st)
        if not (isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and isinstance(c.func, ast.Attribute) and
                len(c.args) == 1 and isinstance(c.args[0], ast.Name) and
                c.args[0].id in {a.arg for a in [*fn.args.args, *fn.args.kwonlyargs]}):
            continue
        moves.setdefault(fn, {}).setdefault(ast.unparse(c.func.value), (c.args[0].id, c.lineno))
    for fn, moved in moves.items():
        sets: dict[str, list[ast.Assign]] = {}
        for a in (n for n in subtree(fn) if isinstance(n, ast.Assign) and len(n.targets) == 1 and
                  isinstance(n.targets[0], ast.Name)):
            sets.setdefault(a.targets[0].id, []).append(a)  # type: ignore[union-attr]
        for call in (n for n in subtree(fn) if isinstance(n, ast.Call)):
            model = ast.unparse(call.func)
            if model not in moved or call.lineno <= moved[model][1]:
                continue
            device = moved[model][0]
            for arg in [*call.args, *(k.value for k in call.keywords)]:
                if not isinstance(arg, ast.Name):
                    continue
                last = max((a for a in sets.get(arg.id, ()) if a.lineno < call.lineno), key=lambda a: a.lineno,
                           default=None)
                v = last.value if last is not None else None
                if not (isinstance(v, ast.Call) and _call_name(v)[1] == "to" and len(v.args) == 1):
                    continue
                other = ast.unparse(v.args[0])
                if other == device or model in other or "device" not in other or \
                        any(isinstance(n, ast.Name) and n.id == device for n in ast.walk(v.args[0])):
                    continue
                lt.add("input-device-differs-from-model", "error", v,
                       f"{arg.id} is moved to {other} and fed to {model}, which this function moved to {device} "
                       f"(line {moved[model][1]}): where the two differ (a worker given another GPU) the forward "
                       "fails with 'Expected all tensors to be on the same device'",
                       f"move the inputs to the model's device: .to({device})", _SEMANTICS)
                break


def _device_of_param(value: ast.AST, params: set[str]) -> str | None:
    """The parameter a CUDA device expression is built from: ``f"cuda:{device_id}"``, ``torch.device("cuda", i)``,
    ``torch.device(f"cuda:{i}")``; else None."""
    from helpers.lint.python_rules import _call_name

    if isinstance(value, ast.Call) and _call_name(value)[1] == "device" and value.args:
        if len(value.args) > 1 and isinstance(value.args[1], ast.Name) and value.args[1].id in params:
            return value.args[1].id
        value = value.args[0]
    if isinstance(value, ast.JoinedStr) and value.values and isinstance(value.values[0], ast.Constant) and \
            str(value.values[0].value).startswith("cuda:"):
        names = [f.value.id for f in value.values if isinstance(f, ast.FormattedValue) and
                 isinstance(f.value, ast.Name) and f.value.id in params]
        return names[0] if names else None
    return None


def rule_bare_cuda_beside_device(lt: PythonLinter) -> None:
    """A worker function given its GPU (``device = f"cuda:{device_id}"`` from a parameter) that also moves something
    with a bare ``.cuda()``, with no ``torch.cuda.set_device`` anywhere: ``.cuda()`` with no device uses "the current
    CUDA device", which stays GPU 0 unless set (:data:`_SEMANTICS`), so every worker puts that part on GPU 0 --
    mixed devices in one forward, or every worker's copy crowding GPU 0 (bytedance/LatentSync's visual-quality filter:
    one process per GPU started with its device index)."""
    from helpers.lint.python_rules import _call_name

    if ".cuda()" not in lt.text or "set_device" in lt.text:
        return
    for fn in (n for n in lt.nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        params = {a.arg for a in [*fn.args.args, *fn.args.kwonlyargs]}
        made = next(((a, d) for a in subtree(fn) if isinstance(a, ast.Assign) and
                     (d := _device_of_param(a.value, params)) is not None), None)
        if made is None:
            continue
        bare = next((c for c in subtree(fn) if isinstance(c, ast.Call) and _call_name(c)[1] == "cuda" and
                     isinstance(c.func, ast.Attribute) and not c.args and not c.keywords and c.lineno > made[0].lineno),
                    None)
        if bare is None:
            continue
        lt.add("same-device-every-rank", "warning", bare,
               f"{ast.unparse(bare)[:50]} moves to the current CUDA device, GPU 0 in every worker (nothing calls "
               f"set_device), while this function's device is cuda:{{{made[1]}}} (line {made[0].lineno}): the "
               "workers' tensors meet on different GPUs, or all crowd GPU 0",
               f".to(device) like the rest, or torch.cuda.set_device({made[1]}) at the start of the worker", _SEMANTICS)


__all__ = ["rule_collective_before_set_device", "rule_bare_cuda_beside_device", "rule_inputs_on_other_device", "rule_cuda_before_set_device", "rule_ddp_before_to_device", "rule_ddp_meta_module", "rule_ema_before_to_device", "rule_fixed_device_map", "rule_grad_accum_from_device_count", "rule_load_without_map_location", "rule_local_rank_as_global_rank", "rule_main_process_by_local_rank", "rule_nccl_no_device_binding", "rule_quantized_model_no_device_map", "rule_same_device_every_rank", "rule_set_device_after_init", "rule_visible_devices_as_ordinal", "rule_world_size_as_local", "rule_world_size_from_device_count"]
