"""Contract rules on the model wrappers' ordering and surface: FSDP's optimizer after wrapping, backward through the
engine, SyncBatchNorm under DDP, ``.module`` on what may not be wrapped, FSDP under ``inference_mode``, a 2-D mesh
without a group, attributes the wrapper does not have (https://docs.pytorch.org/docs/stable/fsdp.html,
https://docs.pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html).  Run by
:func:`helpers.lint.contract_rules.run`."""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

from helpers.lint.contract_ast import ancestors, kwarg, last_assignment, method_named, subtree
from helpers.lint.contracts import _ACC, _DDP, _FABRIC, _FSDP
from helpers.lint.wrappers import accelerator_prepare, assign_targets, call_name, prepare_bindings

if TYPE_CHECKING:
    from helpers.lint.python_rules import PythonLinter


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


_HF_TRAINING_STEP = "https://github.com/huggingface/transformers/blob/main/src/transformers/trainer.py"


def rule_trainer_step_raw_backward(lt: PythonLinter) -> None:
    """``wrapper-raw-backward`` in a transformers ``Trainer`` subclass whose ``training_step`` calls ``loss.backward()``:
    the Trainer prepares the model and optimizer through its Accelerator, and its own ``training_step`` ends in
    ``self.accelerator.backward(loss)`` (``_HF_TRAINING_STEP``), which runs the DeepSpeed engine's backward under a
    DeepSpeed config (ZeRO's gradient partitioning and hooks) and the loss scaling under fp16; the override skips
    both (THUDM/GLM-4's finetune under ZeRO-3)."""
    for cls in (n for n in lt.nodes if isinstance(n, ast.ClassDef)):
        if not any(ast.unparse(b).split(".")[-1].endswith("Trainer") for b in cls.bases):
            continue
        step = next((m for m in cls.body if isinstance(m, ast.FunctionDef) and m.name == "training_step"), None)
        if step is None:
            continue
        for c in (n for n in ast.walk(step) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                  and n.func.attr == "backward" and not n.args):
            recv = ast.unparse(c.func.value)
            if "accelerator" in recv or "scaler" in recv or "engine" in recv.lower():
                continue
            lt.add("wrapper-raw-backward", "warning", c,
                   f"{recv}.backward() in {cls.name}.training_step: the Trainer trains through its Accelerator, and its "
                   "own training_step calls self.accelerator.backward(loss) (the DeepSpeed engine's backward under a "
                   "DeepSpeed config, the loss scaling under fp16); this backward skips them",
                   f"self.accelerator.backward({recv})", _HF_TRAINING_STEP)
            break


def rule_fsdp_meta_without_sync(lt: PythonLinter) -> None:
    """``fsdp-meta-without-sync``: the model is built on the meta device on some ranks only (``if rank == 0: model =
    ...; else: with torch.device("meta"): model = ...``, or ``init_empty_weights()`` under a rank gate) and wrapped in
    ``FullyShardedDataParallel`` without ``sync_module_states=True``: the meta ranks materialise empty storage
    (``param_init_fn`` / ``to_empty``) and only ``sync_module_states`` broadcasts rank 0's real weights ("each FSDP
    module will broadcast module parameters and buffers from rank 0 to ensure that they are replicated across
    ranks", https://docs.pytorch.org/docs/stable/fsdp.html), so the other ranks train on uninitialised values
    (aws-samples/awsome-distributed-training's FSDP example).  A ``sync_module_states=`` given any value but ``False``
    is taken as set."""
    if "meta" not in lt.text and "init_empty_weights" not in lt.text:
        return
    meta_on_some = next((w for w in lt.nodes if isinstance(w, ast.With) and any(
        re.search(r"['\"]meta['\"]|init_empty_weights", ast.unparse(i.context_expr)) for i in w.items)
        and lt._rank_gate(w) is not None), None)
    if meta_on_some is None:
        return
    for c in lt._calls():
        if ast.unparse(c.func).split(".")[-1] not in ("FSDP", "FullyShardedDataParallel"):
            continue
        sync = next((k.value for k in c.keywords if k.arg == "sync_module_states"), None)
        if sync is not None and not (isinstance(sync, ast.Constant) and sync.value is False):
            continue
        lt.add("fsdp-meta-without-sync", "error", c,
               f"the model is built on the meta device on some ranks only (line {meta_on_some.lineno}) and this FSDP "
               "wrap has no sync_module_states=True: those ranks get empty storage and nothing copies rank 0's "
               "weights to them, so they train on uninitialised parameters",
               "FSDP(..., sync_module_states=True) (rank 0 holds the real weights and broadcasts them)", _FSDP)
        return


def rule_state_dict_of_submodule(lt: PythonLinter) -> None:
    """``zero3-state-dict-submodule``: ``accelerator.get_state_dict(model.base_model)`` given a submodule of a model the
    script prepared: Accelerate's ``get_state_dict(model)`` takes "A PyTorch model sent through Accelerator.prepare()"
    (``_ACC``), and under DeepSpeed ZeRO-3 it asks that model, the engine, for its consolidated 16-bit state dict
    (``_zero3_consolidated_16bit_state_dict``); a submodule of it is a plain module holding only this rank's partitions
    (CarperAI/trlx's PPO trainer saved empty weights)."""
    if "get_state_dict" not in lt.text or ".prepare(" not in lt.text:
        return
    prepared = {ast.unparse(t) for call, t, _a in prepare_bindings(lt.nodes) if isinstance(call.func, ast.Attribute)}
    for c in lt._calls():
        if not (isinstance(c.func, ast.Attribute) and c.func.attr == "get_state_dict" and c.args
                and isinstance(c.args[0], ast.Attribute)):
            continue
        holder = ast.unparse(c.args[0].value)
        if holder in prepared:
            lt.add("zero3-state-dict-submodule", "warning", c,
                   f"get_state_dict({ast.unparse(c.args[0])}) is given a submodule of {holder}, the model "
                   "accelerator.prepare returned: Accelerate gathers the state dict through the prepared model (the "
                   "DeepSpeed engine under ZeRO-3); a submodule holds only this rank's partitions (empty weights)",
                   f"sd = accelerator.get_state_dict({holder}), then keep the submodule's keys",
                   _ACC + "#accelerate.Accelerator.get_state_dict")
            return


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


_DATAPARALLEL = "https://docs.pytorch.org/docs/stable/generated/torch.nn.DataParallel.html"


def _torch_dataparallel(lt: PythonLinter, c: ast.Call) -> bool:
    """``c`` calls torch's ``nn.DataParallel`` (by its dotted name or an imported one), not a project's own."""
    func = ast.unparse(c.func)
    origin = lt.import_origins.get(func, "") if isinstance(c.func, ast.Name) else func
    return re.match(r"(torch\.)?nn\.(parallel\.)?DataParallel$|torch\.nn\.(parallel\.(data_parallel\.)?)?"
                    r"DataParallel$", origin) is not None


def rule_dataparallel_per_process(lt: PythonLinter) -> None:
    """``DataParallel(model, device_ids=[local_rank])`` in a process of a multi-process job: DataParallel is one
    process driving several GPUs by threads (:data:`_DATAPARALLEL`: "use DistributedDataParallel, instead of this
    class, to do multi-GPU training"), so given one device per process it only forwards to that GPU and nothing
    averages the gradients between the processes: each rank trains its own copy (thu-coai/CDial-GPT#21).  Reported
    where the device list is this process's rank, or where the file makes a process group and wraps nothing in
    DistributedDataParallel / FSDP / DeepSpeed / Accelerate; not where the file all-reduces the gradients itself
    (``dist.all_reduce(p.grad)``: the processes' copies are then averaged by hand)."""
    from helpers.lint.python_rules import _call_name

    if "DataParallel(" not in lt.text or re.search(r"all_reduce\([^)]*\.grad\b", lt.text):
        return  # (a file that all-reduces the gradients itself averages them across the processes)
    multi = "init_process_group" in lt.text and not re.search(
        r"DistributedDataParallel|DDP\(|FullyShardedDataParallel|fully_shard|deepspeed\.initialize|\.prepare\(",
        lt.text)  # (yolov5's smart_DDP is a DDP too)
    for c in lt._calls():
        if _call_name(c)[1] != "DataParallel":
            continue
        if not _torch_dataparallel(lt, c):
            continue  # a project's own DataParallel (picotron's bucketed one) is not torch's
        ids = kwarg(c, "device_ids")
        one = isinstance(ids, ast.List) and len(ids.elts) == 1 and lt.taint.is_rank(ids.elts[0])
        if not (one or multi and lt._rank_gate(c) is None) or any(
                isinstance(a, ast.If) and re.search(r"==\s*-1|world_size\s*==\s*1|not\s+\w*distributed",
                                                    ast.unparse(a.test)) for a in ancestors(lt, c)):
            continue  # (under `RANK == -1`: the one-process path)
        lt.add("dataparallel-under-launcher", "error", c,
               f"{ast.unparse(c)[:70]} in a process of a multi-process job: DataParallel runs threads inside one "
               "process and averages nothing across processes, so each rank trains its own copy of the model",
               "model = DistributedDataParallel(model, device_ids=[local_rank], output_device=local_rank)",
               _DATAPARALLEL)
        return


def _stored_names(node: ast.AST) -> set[str]:
    """The names ``node`` assigns (``Name`` nodes in a store context anywhere inside it)."""
    return {x.id for x in ast.walk(node) if isinstance(x, ast.Name) and isinstance(x.ctx, ast.Store)}


_LIGHTNING_STRATEGY = "https://lightning.ai/docs/pytorch/stable/extensions/strategy.html"
_HAS_MODULE = re.compile(r"(?i)ema|averaged|dataparallel|ddp|fsdp|wrap|swa")
"""Constructors whose object has a ``module`` attribute of its own (timm's ModelEmaV2, AveragedModel, DataParallel)."""


def _lightning_submodule_module(lt: PythonLinter) -> None:
    """``self.model.module`` inside a LightningModule: Lightning's strategy wraps the LightningModule itself
    (``DistributedDataParallel(module=lightning_module)``, ``_LIGHTNING_STRATEGY``), so an attribute assigned a plain
    model in the class stays that model on every strategy and has no ``module`` (Latte's train_pl.py saved
    ``self.model.module.state_dict()``).  Not for an attribute the class assigns a wrapper with a ``module`` of its own
    (an EMA, AveragedModel, DataParallel: :data:`_HAS_MODULE`), nor under a ``hasattr``/``isinstance`` test."""
    from helpers.lint.python_rules import _call_name

    for cls in (n for n in lt.nodes if isinstance(n, ast.ClassDef)):
        if not any(ast.unparse(b).endswith("LightningModule") for b in cls.bases):
            continue
        assigned: dict[str, list[ast.AST]] = {}
        for n in ast.walk(cls):
            if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None:
                for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                        assigned.setdefault(t.attr, []).append(n.value)
        for node in ast.walk(cls):
            if not (isinstance(node, ast.Attribute) and node.attr == "module" and isinstance(node.ctx, ast.Load) and
                    isinstance(node.value, ast.Attribute) and isinstance(node.value.value, ast.Name) and
                    node.value.value.id == "self" and node.value.attr in assigned):
                continue
            values = assigned[node.value.attr]
            if not all(isinstance(v, ast.Call) and not _HAS_MODULE.search(_call_name(v)[1]) for v in values) or \
                    _HAS_MODULE.search(node.value.attr):
                continue
            if any(isinstance(a, (ast.If, ast.IfExp)) and re.search(r"hasattr|isinstance|module", ast.unparse(a.test))
                   or isinstance(a, ast.Call) and _call_name(a)[1] in ("hasattr", "getattr")
                   for a in ancestors(lt, node)):
                continue
            lt.add("module-attr-without-ddp", "warning", node,
                   f"{ast.unparse(node)}: {cls.name} is a LightningModule, and Lightning's strategy wraps the "
                   f"LightningModule itself, not self.{node.value.attr} (assigned a plain model here): "
                   "AttributeError 'module' on every run", f"self.{node.value.attr}.state_dict()", _LIGHTNING_STRATEGY)
            return


def rule_module_attr_without_ddp(lt: PythonLinter) -> None:
    """``model.module`` read on a model ``accelerator.prepare`` returned, with no test that it is wrapped: under one
    process (a single-GPU run, a debug run) ``prepare`` returns the model itself, which has no ``module`` attribute
    ("AttributeError: ... object has no attribute 'module'"); Accelerate's documented way to reach the model under any
    wrapper is ``accelerator.unwrap_model(model)`` ("unwraps the model from the additional layer possible added by
    prepare()", ``_ACC``; PixArt-sigma's train.py logged ``model.module.h``).  Not under an ``if`` / conditional that
    tests ``hasattr``, ``isinstance``, ``module`` or the process count."""
    from helpers.lint.python_rules import _call_name

    if ".module" in lt.text and "LightningModule" in lt.text:
        _lightning_submodule_module(lt)
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
    for name, (scope, line) in list(prepared.items()):  # wrapped by the script itself before prepare (LightningDiT's
        # model = DDP(model.to(device), device_ids=[rank]): prepare hands the DDP module back, .module exists)
        if any(isinstance(a, ast.Assign) and a.lineno < line and name in _stored_names(a) and
               isinstance(a.value, ast.Call) and _call_name(a.value)[1] in ("DDP", "DistributedDataParallel")
               for a in ast.walk(scope or lt.tree)):
            del prepared[name]
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
                any(isinstance(a, (ast.Assign, ast.AugAssign)) and name in _stored_names(a) for a in subtree(fn)) and \
                not any(isinstance(g, ast.Global) and name in g.names for g in subtree(fn)):
            continue  # the function has a local of that name
        guards = [a for a in ancestors(lt, node) if isinstance(a, (ast.If, ast.IfExp, ast.While))]
        if any(re.search(r"hasattr|isinstance|type\(|DDP|DistributedDataParallel|module|num_processes|distributed|"
                         r"world_size|DistributedType",
                         ast.unparse(g.test)) for g in guards):
            continue
        if any(isinstance(a, ast.Call) and _call_name(a)[1] in ("hasattr", "getattr") for a in ancestors(lt, node)):
            continue
        lt.add("module-attr-without-ddp", "warning", node,
               f"{node.value.id}.module: {node.value.id} is what accelerator.prepare returned (line {line}), which is "
               "the model itself under one process: AttributeError 'module' on a single-GPU run",
               f"accelerator.unwrap_model({node.value.id})", _ACC + "#accelerate.Accelerator.unwrap_model")
        return


def rule_undefined_attribute(lt: PythonLinter) -> None:
    """``self.X`` read as a value (not called; an augmented assignment ``self.X //= n`` reads it first) in a class with
    an ``__init__`` and no base classes, that never assigns ``X`` nor defines it: AttributeError at run time."""
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
        augmented = {id(n.target) for n in ast.walk(cls) if isinstance(n, ast.AugAssign)}  # x += 1 reads x first
        for n in ast.walk(cls):
            if isinstance(n, ast.Attribute) and isinstance(n.value, ast.Name) and n.value.id == "self":
                if id(n) in augmented:
                    reads.append(n)
                elif isinstance(n.ctx, (ast.Store, ast.Del)):
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
        calls = [c for c in subtree(fn) if isinstance(c, ast.Call)]
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


def rule_fsdp_clip_grad_norm(lt: PythonLinter) -> None:
    """``torch.nn.utils.clip_grad_norm_(m.parameters(), ...)`` where ``m`` holds a ``FullyShardedDataParallel``
    (FSDP1) module: each rank holds only its shard of the gradients, so the norm torch's utility computes is the
    local shard's and every rank clips by a different factor.  FSDP's own method is the contract:
    ``FullyShardedDataParallel.clip_grad_norm_``, "the default torch util is not applicable here, because each rank
    only has a partial view of all the grads in the model, so calling it for FSDP models would lead to different
    scaling being applied per subset of model parameters" (``_FSDP``).  Not for ``NO_SHARD``, and not for FSDP2's
    ``fully_shard`` (DTensor gradients: torch's utility is the documented way there).  A plain name is matched in
    the function that wrapped it (another function's ``model`` may be the DDP one: wenet's per-engine branches); a
    ``self.`` attribute in the whole class."""
    from helpers.lint.python_rules import _call_name

    if "clip_grad_norm_" not in lt.text or not re.search(r"\bFSDP\(|FullyShardedDataParallel\(", lt.text):
        return
    wrapped: dict[tuple[str, ast.AST | None], int] = {}  # (name, its function; None for a self. attribute)
    for node in lt.nodes:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                _call_name(node.value)[1] in ("FSDP", "FullyShardedDataParallel") and \
                "NO_SHARD" not in ast.unparse(node.value):
            for t in node.targets:
                attr = isinstance(t, ast.Attribute) and ast.unparse(t).startswith("self.")
                wrapped.setdefault((ast.unparse(t), None if attr else lt._enclosing_function(node)), node.lineno)
    for c in lt._calls():
        recv, name = _call_name(c)
        if name != "clip_grad_norm_" or recv not in ("torch.nn.utils", "nn.utils", "utils", "") or not c.args:
            continue
        arg = c.args[0]
        if not (isinstance(arg, ast.Call) and isinstance(arg.func, ast.Attribute) and arg.func.attr == "parameters"):
            continue
        held = ast.unparse(arg.func.value)
        key = (held, None if held.startswith("self.") else lt._enclosing_function(c))
        if key in wrapped:
            lt.add("fsdp-clip-grad-norm", "warning", c,
                   f"torch.nn.utils.clip_grad_norm_({held}.parameters(), ...) on the FSDP module made at line "
                   f"{wrapped[key]}: each rank sees only its shard of the gradients, so each computes a different "
                   "norm and clips by a different factor (the reported norm is a shard's)",
                   f"{held}.clip_grad_norm_(max_norm) (FullyShardedDataParallel's own, which reduces the norm "
                   "across ranks)", _FSDP + "#torch.distributed.fsdp.FullyShardedDataParallel.clip_grad_norm_")


def _freezes_all(node: ast.AST, model: str) -> bool:
    """``node`` sets ``requires_grad`` off for every parameter of ``model``: ``for p in model.parameters():
    p.requires_grad = False`` or ``model.requires_grad_(False)``."""
    if isinstance(node, ast.For) and ast.unparse(node.iter) == f"{model}.parameters()" and \
            isinstance(node.target, ast.Name):
        return any(isinstance(s, ast.Assign) and any(ast.unparse(t) == f"{node.target.id}.requires_grad"
                                                     for t in s.targets)
                   and isinstance(s.value, ast.Constant) and s.value.value is False for s in node.body)
    if isinstance(node, ast.Call) and (ast.unparse(node.func) == f"{model}.freeze" and not node.args or
                                       re.match(r"(?i)^freeze(?:_(?:model|module|module_params|params|parameters|all|weights))?$",
                                                call_name(node)) and node.args and
                                       ast.unparse(node.args[0]) == model):
        return True  # Lightning's LightningModule.freeze() ("Freeze all params for inference"), or a project helper
        # named for it given the model (torchdistill's module_util.freeze_module_params(teacher_model))
    return isinstance(node, ast.Call) and ast.unparse(node.func) == f"{model}.requires_grad_" and \
        bool(node.args) and isinstance(node.args[0], ast.Constant) and node.args[0].value is False


def rule_ddp_frozen_model(lt: PythonLinter) -> None:
    """``DistributedDataParallel(model)`` when every parameter of ``model`` has ``requires_grad`` off: DDP's
    constructor refuses it ("DistributedDataParallel is not needed when a module doesn't have any parameter that
    requires a gradient", torch/nn/parallel/distributed.py ``__init__``).  Found where the whole model is frozen
    (``for p in model.parameters(): p.requires_grad = False`` / ``model.requires_grad_(False)``) above the wrap in
    the same function, or after it in the same loop (the next pass wraps the frozen model: ACEsuit/mace evaluated
    its second-stage model that way), and nothing in that function turns ``requires_grad`` back on."""
    from helpers.lint.python_rules import _call_name
    from helpers.lint.wrappers import DDP_CTOR

    if "requires_grad" not in lt.text and "freeze" not in lt.text:
        return
    for c in lt._calls():
        if not (DDP_CTOR.match(_call_name(c)[1]) and c.args and isinstance(c.args[0], ast.Name)):
            continue
        model = c.args[0].id
        fn = lt._enclosing_function(c) or lt.tree
        if re.search(r"requires_grad\s*=\s*True|requires_grad_\((True)?\)", ast.unparse(fn)):
            continue
        freezes = [n for n in subtree(fn) if _freezes_all(n, model)]
        loops = {id(a) for a in ancestors(lt, c) if isinstance(a, (ast.For, ast.While))}
        hit = next((f for f in freezes if f.lineno < c.lineno or
                    any(id(a) in loops for a in ancestors(lt, f))), None)
        if hit is None:
            continue
        where = "above" if hit.lineno < c.lineno else "later in the same loop, so the next pass wraps it frozen"
        lt.add("ddp-no-trainable-params", "error", c,
               f"DistributedDataParallel({model}) with every parameter of {model} frozen (line {hit.lineno}, {where}):"
               " the constructor raises 'DistributedDataParallel is not needed when a module doesn't have any "
               "parameter that requires a gradient'",
               f"wrap {model} before freezing it, or evaluate the frozen model unwrapped (no DDP for inference)",
               "https://github.com/pytorch/pytorch/blob/main/torch/nn/parallel/distributed.py")


_STRIPS_MODULE = re.compile(r"""\[\s*(?:len\(\s*['"]module\.['"]\s*\)|7)\s*:\s*\]|\.replace\(\s*['"]module\.['"]\s*,\s*['"]{2}|"""
                            r"""\.removeprefix\(\s*['"]module\.['"]|\.lstrip\(\s*['"]module\.['"]""")
"""A key rewrite that drops DDP's ``module.`` prefix (``k[len("module."):]``, ``k[7:]``, ``k.replace("module.", "")``,
``k.removeprefix("module.")``)."""


def rule_stripped_state_dict_into_wrapper(lt: PythonLinter) -> None:
    """``model.load_state_dict(sd)`` on a model that holds the DistributedDataParallel wrapper here (the wrap in this
    function, or a parameter the caller passes the wrapper to), with ``sd`` built by dropping the ``module.`` prefix
    from its keys: the wrapper's own keys are ``module.<name>`` (DDP registers the model as its submodule ``module``;
    https://docs.pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.state_dict), so the strict load
    stops with "Missing key(s) in state_dict: "module.…" / Unexpected key(s) …" (mlfoundations/open_lm#138: resume
    after the wrap)."""
    if "load_state_dict" not in lt.text or "module." not in lt.text or not lt.wrappers.w.assigns and \
            not lt.wrappers.w.params:
        return
    for c in lt._calls():
        f = c.func
        if not (isinstance(f, ast.Attribute) and f.attr == "load_state_dict" and isinstance(f.value, ast.Name)
                and c.args and isinstance(c.args[0], ast.Name)) or not lt.wrappers.state(f.value, c)[0]:
            continue
        if any(k.arg == "strict" and isinstance(k.value, ast.Constant) and k.value.value is False for k in c.keywords) \
                or lt._dispatched_on(c, f.value.id):
            continue  # (the author's branch: `elif args.distributed: model.module.load_state_dict(sd)`)
        fn = lt._enclosing_function(c) or lt.tree
        sd = c.args[0].id
        stripped = next((a for a in subtree(fn) if isinstance(a, ast.Assign) and a.lineno < c.lineno
                         and any(isinstance(t, ast.Name) and t.id == sd for t in a.targets)
                         and _STRIPS_MODULE.search(ast.unparse(a.value))), None)
        if stripped is None:
            continue
        lt.add("ddp-state-dict-prefix", "error", c,
               f"{ast.unparse(c)[:50]} loads keys stripped of 'module.' (line {stripped.lineno}) into "
               f"{f.value.id}, which holds the DistributedDataParallel wrapper here: the wrapper's keys are "
               "'module.<name>', so the strict load fails ('Missing key(s) in state_dict: \"module.…\"')",
               f"{f.value.id}.module.load_state_dict({sd}) (the inner model), or load before wrapping",
               "https://docs.pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.state_dict")


def rule_compiled_state_dict_prefix(lt: PythonLinter) -> None:
    """A checkpoint saved from the model ``torch.compile`` returned and loaded, on resume, into the model before it
    is compiled: the compiled ``OptimizedModule`` holds the original as its submodule ``_orig_mod``, so its
    ``state_dict()`` keys read ``_orig_mod.<name>`` (torch/_dynamo/eval_frame.py ``OptimizedModule.__init__``), and
    the plain model's strict ``load_state_dict`` rejects them ("Unexpected key(s) in state_dict: "_orig_mod.…"";
    karpathy/nanoGPT strips the prefix on load since).  Not where the file handles ``_orig_mod`` itself."""
    if "compile(" not in lt.text or "load_state_dict" not in lt.text or "_orig_mod" in lt.text:
        return
    compiled: dict[str, int] = {}
    for n in lt.nodes:
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and ast.unparse(n.value.func) == "torch.compile":
            for t in n.targets:
                if isinstance(t, ast.Name):
                    compiled.setdefault(t.id, n.lineno)
    if not compiled:
        return
    first = min(compiled.values())
    for n in sorted((x for x in lt.nodes if isinstance(x, ast.Assign)), key=lambda x: x.lineno):
        if n.lineno > first and any(isinstance(x, ast.Name) and x.id in compiled for x in ast.walk(n.value)) and \
                isinstance(n.value, (ast.Name, ast.IfExp, ast.Attribute)):
            compiled.update({t.id: n.lineno for t in n.targets if isinstance(t, ast.Name) and t.id not in compiled})
    saves = [c for c in lt._calls() if isinstance(c.func, ast.Attribute) and c.func.attr == "state_dict"
             and isinstance(c.func.value, ast.Name) and c.func.value.id in compiled and c.lineno > first]
    if not saves:
        return
    for c in lt._calls():
        f = c.func
        if isinstance(f, ast.Attribute) and f.attr == "load_state_dict" and isinstance(f.value, ast.Name) and \
                f.value.id in compiled and c.lineno < first and not any(
                    k.arg == "strict" and isinstance(k.value, ast.Constant) and k.value.value is False
                    for k in c.keywords):
            lt.add("compile-state-dict-prefix", "error", c,
                   f"{ast.unparse(c)[:50]} loads, before torch.compile (line {first}), a checkpoint that line "
                   f"{saves[0].lineno} saves from the compiled model ({ast.unparse(saves[0])}): its keys read "
                   "'_orig_mod.<name>', so the resume fails ('Unexpected key(s) in state_dict: \"_orig_mod.…\"')",
                   "save the model before compiling (keep a reference to it), or strip the '_orig_mod.' prefix from "
                   "the keys before loading", "https://github.com/pytorch/pytorch/blob/main/torch/_dynamo/eval_frame.py")
            return


_REGISTERS = frozenset({"register_buffer", "register_parameter", "add_module", "register_module"})


def rule_ddp_buffer_after_wrap(lt: PythonLinter) -> None:
    """``model.register_buffer(...)`` (or ``register_parameter`` / ``add_module``) on a model after
    ``DistributedDataParallel`` or ``accelerator.prepare`` wrapped it: DDP's contract, "This module assumes all
    parameters are registered in the model by the time it is created. No parameters should be added nor removed
    later. Same applies to buffers" (``_DDP``); the new tensor is not in DDP's bookkeeping (and is created on the CPU:
    the next buffer broadcast fails, xiuqhou/Salience-DETR).  Register it before wrapping."""
    from helpers.lint.python_rules import _call_name

    if not any(r in lt.text for r in _REGISTERS):
        return
    for c in lt._calls():
        if _call_name(c)[1] not in _REGISTERS or not isinstance(c.func, ast.Attribute):
            continue
        holder = c.func.value
        if isinstance(holder, ast.Attribute) and holder.attr == "module":
            holder = holder.value  # model.module.register_buffer(...): the module inside the wrapper
        if not isinstance(holder, (ast.Name, ast.Attribute)):
            continue
        wrapped = lt.wrappers.state(holder, c)[0]
        if not wrapped:
            src = ast.unparse(holder)
            wrapped = any(accelerator_prepare(n) and n.lineno < c.lineno and any(
                ast.unparse(t) == src for t in assign_targets(n) for t in
                (t.elts if isinstance(t, ast.Tuple) else [t])) for n in lt.nodes)
        if wrapped:
            lt.add("ddp-buffer-after-wrap", "error", c,
                   f"{ast.unparse(c.func)}(...) after {ast.unparse(holder)} was wrapped for data parallelism: DDP "
                   "assumes every parameter and buffer is registered when it is created ('No parameters should be "
                   "added nor removed later. Same applies to buffers'); this one is outside its bookkeeping (a CPU "
                   "tensor its next buffer broadcast trips on)",
                   "register it on the model before DistributedDataParallel(...) / accelerator.prepare(...)", _DDP)


_OPTIMIZERS = re.compile(r"^(?:SGD|Adam|AdamW|Adamax|Adagrad|Adadelta|RMSprop|NAdam|RAdam|LBFGS|Lion|Adafactor|"
                         r"FusedAdam|FusedLAMB|LAMB|Lamb|Muon|AdamW8bit|Adam8bit)$")
_WRAPPING = re.compile(r"(?i)prepare|setup|wrap|ddp|parallel|shard|initialize|fsdp")


def rule_trained_module_not_wrapped(lt: PythonLinter) -> None:
    """``trained-module-not-wrapped``: a function wraps some models in ``DistributedDataParallel`` and builds an
    optimizer over the parameters of another (``optim_dur_disc = AdamW(net_dur_disc.parameters())``) that nothing in
    the file wraps nor hands to a wrapping helper: DDP averages the gradients of the modules it wraps only ("This
    container provides data parallelism by synchronizing gradients across each model replica", ``_DDP``), so this
    one's replicas train on their own shard's gradients and drift apart (wetts' VITS2 duration discriminator).  Not
    for a name passed to ``prepare`` / ``setup`` / a ``*wrap*`` / ``*parallel*`` / ``*shard*`` helper (Accelerate,
    Fabric, FSDP, a model-parallel head)."""
    if not re.search(r"DistributedDataParallel|\bDDP\(", lt.text):
        return
    handed = {a.id for c in lt._calls() if _WRAPPING.search(call_name(c)) for a in ast.walk(c)
              if isinstance(a, ast.Name)}
    handed |= {t.id for n in lt.nodes if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
               and _WRAPPING.search(call_name(n.value)) for t in n.targets if isinstance(t, ast.Name)}
    # (the wrapper itself: ddp_model = DDP(model), then AdamW(ddp_model.parameters()))
    for fn in (n for n in lt.nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        calls = [c for c in subtree(fn) if isinstance(c, ast.Call)]
        wrapped = {c.args[0].id for c in calls if call_name(c) in ("DistributedDataParallel", "DDP") and c.args
                   and isinstance(c.args[0], ast.Name)}
        if not wrapped:
            continue
        for c in calls:
            if not _OPTIMIZERS.match(call_name(c)):
                continue
            trained = {x.func.value.id for x in ast.walk(c) if isinstance(x, ast.Call) and call_name(x) == "parameters"
                       and isinstance(x.func, ast.Attribute) and isinstance(x.func.value, ast.Name)}
            left = sorted(trained - wrapped - handed)
            if not left:
                continue
            lt.add("trained-module-not-wrapped", "warning", c,
                   f"{call_name(c)}(...) trains {left[0]}, which is never wrapped in DistributedDataParallel while "
                   f"{sorted(wrapped)[0]} is (line {next(x.lineno for x in calls if call_name(x) in ('DistributedDataParallel', 'DDP'))}): "
                   f"DDP averages the gradients of the modules it wraps only, so each rank's copy of {left[0]} "
                   "steps on its own shard's gradients and the copies drift apart",
                   f"{left[0]} = DDP({left[0]}, device_ids=[local_rank]) like the others (or all-reduce its gradients)",
                   _DDP)
            break


def rule_ddp_wrapper_unused(lt: PythonLinter) -> None:
    """``ddp-bypassed`` for a wrapper stored where nothing reads it: ``self.mode = DDP(self.model, ...)`` (a typo for
    ``self.model``) while the training calls ``self.model(...)``: the forward never goes through the wrapper, whose
    hooks are what average the gradients ("This container provides data parallelism by synchronizing gradients",
    ``_DDP``), so each rank trains its own copy (wenwenyu/PICK-pytorch).  The stored name is a plain name of the
    function or a ``self`` attribute read nowhere in the file; the wrapped module is called somewhere."""
    if not re.search(r"DistributedDataParallel|\bDDP\(", lt.text):
        return
    loaded_self = {n.attr for n in lt.nodes if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load)
                   and isinstance(n.value, ast.Name) and n.value.id == "self"}
    for node in lt.nodes:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.value, ast.Call) and
                call_name(node.value) in ("DistributedDataParallel", "DDP") and node.value.args):
            continue
        target, inner = node.targets[0], ast.unparse(node.value.args[0])
        if ast.unparse(target) == inner:
            continue
        if isinstance(target, ast.Attribute) and isinstance(target.value, ast.Name) and target.value.id == "self":
            unread = target.attr not in loaded_self
        elif isinstance(target, ast.Name):
            scope = lt._enclosing_function(node) or lt.tree
            unread = not any(isinstance(n, ast.Name) and n.id == target.id and isinstance(n.ctx, ast.Load)
                             for n in subtree(scope))
        else:
            continue
        called = next((c for c in lt._calls() if ast.unparse(c.func) == inner and c.lineno > node.lineno), None)
        if not unread or called is None:
            continue
        lt.add("ddp-bypassed", "error", node,
               f"the DistributedDataParallel wrapper of {inner} is stored in {ast.unparse(target)}, which nothing "
               f"reads, while {inner}(...) runs the forward (line {called.lineno}): the wrapper's hooks never run, "
               "so no gradient is averaged and each rank trains its own copy",
               f"{inner} = DistributedDataParallel({inner}, ...) (and call the wrapper)", _DDP)


_PL_READONLY = frozenset({"global_rank", "local_rank", "current_epoch", "global_step", "on_gpu", "logger", "loggers",
                          "device", "dtype", "device_mesh"})
"""LightningModule properties without a working setter: lightning/pytorch/core/module.py defines ``global_rank``,
``local_rank``, ``current_epoch``, ``global_step``, ``on_gpu``, ``logger``, ``loggers``, ``device_mesh`` with a getter
only, and lightning/fabric/utilities/device_dtype_mixin.py ``device`` with none and ``dtype`` with one that raises
("Cannot set the dtype explicitly")."""
_PL_MODULE_SRC = "https://github.com/Lightning-AI/pytorch-lightning/blob/master/src/lightning/pytorch/core/module.py"


def rule_lightning_readonly_property(lt: PythonLinter) -> None:
    """``lightning-readonly-property``: ``self.local_rank = torch.distributed.get_rank()`` in a LightningModule:
    ``local_rank`` (like ``global_rank``, ``device``, ``current_epoch``...) is a property of LightningModule with no
    setter, so the assignment raises AttributeError when the module is built (ACE-Step's trainer, which also meant
    the global rank there); read the property instead, it already holds this process's value (:data:`_PL_READONLY`)."""
    if "LightningModule" not in lt.text:
        return
    for cls in (n for n in lt.nodes if isinstance(n, ast.ClassDef)):
        if not any(ast.unparse(b).endswith("LightningModule") for b in cls.bases):
            continue
        for node in ast.walk(cls):
            if not isinstance(node, (ast.Assign, ast.AnnAssign)):
                continue
            for t in (node.targets if isinstance(node, ast.Assign) else [node.target]):
                if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self" and \
                        t.attr in _PL_READONLY:
                    lt.add("lightning-readonly-property", "error", node,
                           f"self.{t.attr} = ... in the LightningModule {cls.name}: {t.attr} is a LightningModule "
                           "property without a setter, so this raises AttributeError when the module is built",
                           f"read self.{t.attr} (Lightning sets it per process), or store the value under another "
                           "name", _PL_MODULE_SRC)


def rule_attribute_unwrapped_elsewhere(lt: PythonLinter) -> None:
    """``ddp-wrapper-attribute`` for a model attribute the class itself unwraps under its DDP flag (``if
    self.params.use_ddp: self.network.module.save_network(...)``) and reads directly elsewhere, outside such a test
    (``self.network.params``): the author's own branch shows ``self.network`` is the DistributedDataParallel wrapper
    when that flag is on, and the wrapper has only its own attributes and Module's (``DDP_PUBLIC``), so the plain read
    raises AttributeError in the DDP run only (MALA's predictor, wrapped by its trainer in another module)."""
    from helpers.lint.wrappers import DDP_PUBLIC, WRAPPER_OWN

    if ".module." not in lt.text or not re.search(r"(?i)ddp|distributed", lt.text):
        return
    unwrapped: dict[str, ast.If] = {}
    for n in lt.nodes:
        if isinstance(n, ast.Attribute) and n.attr == "module" and isinstance(n.value, ast.Attribute) and \
                isinstance(n.value.value, ast.Name) and n.value.value.id == "self":
            gate = next((p for p in ancestors(lt, n) if isinstance(p, ast.If) and
                         re.search(r"(?i)ddp|distributed", ast.unparse(p.test)) and
                         any(n is x for st in p.body for x in subtree(st))), None)
            if gate is not None:
                unwrapped.setdefault(n.value.attr, gate)
    for name, gate in unwrapped.items():
        for n in lt.nodes:
            if not (isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and isinstance(n.value, ast.Attribute)
                    and n.value.attr == name and isinstance(n.value.value, ast.Name) and n.value.value.id == "self"):
                continue
            if n.attr in DDP_PUBLIC or n.attr in WRAPPER_OWN or n.attr.startswith("_"):
                continue
            if any(isinstance(p, (ast.If, ast.IfExp)) and re.search(r"(?i)ddp|distributed|isinstance|hasattr",
                                                                     ast.unparse(p.test)) for p in ancestors(lt, n)):
                continue
            lt.add("ddp-wrapper-attribute", "error", n,
                   f"self.{name}.{n.attr}: this class reaches self.{name} through .module under "
                   f"`{ast.unparse(gate.test)[:40]}` (line {gate.lineno}), so there it is the DistributedDataParallel "
                   f"wrapper, which has no attribute '{n.attr}': the DDP run raises AttributeError here",
                   f"self.{name}.module.{n.attr} under the same test (or keep the unwrapped model in its own attribute)",
                   _DDP)
            break


_PL_HOOKS = "https://lightning.ai/docs/pytorch/stable/data/datamodule.html#prepare-data"
_PL_SETUP = "https://lightning.ai/docs/pytorch/stable/common/lightning_module.html#setup"
_GROUP_READS = re.compile(r"\b(?:get_world_size|get_rank|is_initialized)\(")


def rule_lightning_hook_order(lt: PythonLinter) -> None:
    """Two of Lightning's hook contracts that only the multi-GPU run breaks.  ``lightning-prepare-data-state``: an
    attribute set on ``self`` in ``prepare_data`` and read in ``setup`` (or another hook) of a LightningDataModule or
    LightningModule: "prepare_data is called from the main process. It is not recommended to assign state here (e.g.
    self.x = y) since it is called on a single process and if you assign states here then they won't be available for
    other processes" (``_PL_HOOKS``), so on every other rank ``setup`` raises AttributeError (MassSpecGym's split).
    ``rank-before-init``: ``torch.distributed.get_world_size()`` / ``get_rank()`` / ``is_initialized()`` read in a
    LightningModule's ``__init__``: the module is built before ``Trainer.fit`` starts the processes and creates the
    process group, so the value is the one-process one (``is_initialized()`` is False: a world size of 1) on every
    rank; ``setup`` runs after it, and ``self.trainer.world_size`` holds it (``_PL_SETUP``; nequip's loss scaling)."""
    if "Lightning" not in lt.text and "pl." not in lt.text:
        return
    for cls in (n for n in lt.nodes if isinstance(n, ast.ClassDef)):
        bases = [ast.unparse(b) for b in cls.bases]
        if not any(b.endswith(("LightningDataModule", "LightningModule")) for b in bases):
            continue
        prep = method_named(cls, "prepare_data")
        if prep is not None:
            set_here = {t.attr: n for n in subtree(prep) if isinstance(n, (ast.Assign, ast.AnnAssign))
                        for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                        if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self"}
            init = method_named(cls, "__init__")
            made_in_init = {t.attr for n in (subtree(init) if init is not None else [])
                            if isinstance(n, (ast.Assign, ast.AnnAssign))
                            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
                            if isinstance(t, ast.Attribute)}
            for hook in (m for m in cls.body if isinstance(m, ast.FunctionDef) and m.name not in ("prepare_data",
                                                                                                  "__init__")):
                read = next((a for a in subtree(hook) if isinstance(a, ast.Attribute) and isinstance(a.ctx, ast.Load)
                             and isinstance(a.value, ast.Name) and a.value.id == "self" and a.attr in set_here
                             and a.attr not in made_in_init and not any(
                                 isinstance(t, ast.Attribute) and t.attr == a.attr and isinstance(n, ast.Assign)
                                 and n.lineno < a.lineno for n in subtree(hook) if isinstance(n, ast.Assign)
                                 for t in n.targets)), None)
                if read is not None:
                    lt.add("lightning-prepare-data-state", "error", set_here[read.attr],
                           f"self.{read.attr} is set in prepare_data and read in {hook.name} (line {read.lineno}): "
                           "Lightning calls prepare_data on the main process only, so on the other ranks "
                           f"self.{read.attr} was never set (AttributeError in {hook.name})",
                           f"set self.{read.attr} in setup() (it runs on every process); keep prepare_data for "
                           "downloads and files", _PL_HOOKS)
                    break
        init = method_named(cls, "__init__")
        if init is not None and any(b.endswith("LightningModule") for b in bases):
            hit = next((c for c in subtree(init) if isinstance(c, ast.Call) and
                        _GROUP_READS.search(ast.unparse(c.func) + "(") and
                        re.search(r"distributed|dist\b", ast.unparse(c.func))), None)
            if hit is not None:
                lt.add("rank-before-init", "warning", hit,
                       f"{ast.unparse(hit)[:50]} in {cls.name}.__init__: the LightningModule is built before "
                       "Trainer.fit starts the processes and makes the process group, so this reads the one-process "
                       "value (no group yet: a world size of 1, rank 0) on every rank",
                       "read it in setup() (or use self.trainer.world_size / self.global_rank there)", _PL_SETUP)


_FSDP2_API = "https://docs.pytorch.org/docs/stable/distributed.fsdp.fully_shard.html#torch.distributed.fsdp.MixedPrecisionPolicy"


def rule_fsdp2_policy_assigned(lt: PythonLinter) -> None:
    """``frozen-policy-assigned``: a field of FSDP2's ``MixedPrecisionPolicy`` set after it is made
    (``policy = deepcopy(POLICIES[dtype]); policy.reduce_dtype = torch.float32``): the class is
    ``@dataclass(frozen=True)`` (torch/distributed/fsdp/_fully_shard/_fsdp_api.py), so the assignment raises
    ``FrozenInstanceError`` (IBM/dolomite-engine's communication dtype).  FSDP1's ``MixedPrecision`` is not frozen and
    is not reported.  The policy is a call of the class (by any imported name), an item of a module-level dict of such
    calls, or a copy of either."""
    if "MixedPrecisionPolicy" not in lt.text:
        return
    ctors = {n for n, o in lt.import_origins.items() if o.endswith(".MixedPrecisionPolicy")} | {"MixedPrecisionPolicy"}

    def is_ctor(v: ast.AST) -> bool:
        return isinstance(v, ast.Call) and call_name(v) in ctors

    containers = {t.id for n in getattr(lt.tree, "body", []) if isinstance(n, ast.Assign) and
                  isinstance(n.value, ast.Dict) and n.value.values and all(is_ctor(v) for v in n.value.values)
                  for t in n.targets if isinstance(t, ast.Name)}

    def is_policy(v: ast.AST) -> bool:
        if is_ctor(v):
            return True
        if isinstance(v, ast.Subscript) and isinstance(v.value, ast.Name):
            return v.value.id in containers
        return isinstance(v, ast.Call) and call_name(v) in ("deepcopy", "copy") and len(v.args) == 1 and \
            is_policy(v.args[0])

    for fn in (n for n in lt.nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module))):
        policies: dict[str, int] = {}
        for n in sorted((x for x in subtree(fn) if isinstance(x, ast.Assign)), key=lambda x: x.lineno):
            for tgt in n.targets:
                if isinstance(tgt, ast.Name):
                    if is_policy(n.value):
                        policies[tgt.id] = n.lineno
                    else:
                        policies.pop(tgt.id, None)
                elif isinstance(tgt, ast.Attribute) and isinstance(tgt.value, ast.Name) and \
                        tgt.value.id in policies and (lt._enclosing_function(n) or lt.tree) is fn:
                    lt.add("frozen-policy-assigned", "error", n,
                           f"{ast.unparse(tgt)} = ... sets a field of FSDP2's MixedPrecisionPolicy (made line "
                           f"{policies[tgt.value.id]}), a frozen dataclass: this raises FrozenInstanceError",
                           f"build a new one: dataclasses.replace({tgt.value.id}, {tgt.attr}=...) (or "
                           f"MixedPrecisionPolicy(..., {tgt.attr}=...))", _FSDP2_API)


_MESH = "https://docs.pytorch.org/docs/stable/distributed.html#torch.distributed.device_mesh.DeviceMesh.get_group"


def _multi_dim_mesh(lt: PythonLinter) -> ast.Call | None:
    """The file's first ``init_device_mesh`` call whose mesh has more than one dimension (a ``mesh_shape`` tuple or
    ``mesh_dim_names`` of two or more), else None."""
    for c in lt._calls():
        if call_name(c) != "init_device_mesh":
            continue
        shape = kwarg(c, "mesh_shape") or (c.args[1] if len(c.args) > 1 else None)
        names = kwarg(c, "mesh_dim_names")
        if any(isinstance(v, (ast.Tuple, ast.List)) and len(v.elts) > 1 for v in (shape, names)):
            return c
    return None


def rule_mesh_get_group_without_dim(lt: PythonLinter) -> None:
    """``mesh-get-group-without-dim``: ``mesh.get_group()`` with no ``mesh_dim`` in a file that builds a mesh of two
    or more dimensions (HSDP's ``(replicate, shard)``): ``DeviceMesh.get_group`` raises "Found the DeviceMesh have 2
    dimensions ... Optional kwarg `mesh_dim` needs to be specified when device_mesh.ndim > 1"
    (torch/distributed/device_mesh.py; NovaSky-AI/SkyRL's broadcast over a DTensor's ``device_mesh`` under HSDP)."""
    if "get_group()" not in lt.text:
        return
    made = _multi_dim_mesh(lt)
    if made is None:
        return

    def whole_mesh(v: ast.AST, at: ast.AST) -> bool:  # the full mesh, not a one-dimension slice mesh["dp"]
        if isinstance(v, ast.Attribute):
            return v.attr == "device_mesh"
        if isinstance(v, ast.Call):
            return v is made
        if isinstance(v, ast.Name):
            last = last_assignment(lt, v.id, at)
            return last is not None and whole_mesh(last.value, last)
        return False

    for c in lt._calls():
        if call_name(c) == "get_group" and not c.args and not c.keywords and isinstance(c.func, ast.Attribute) and \
                whole_mesh(c.func.value, c):
            lt.add("mesh-get-group-without-dim", "error", c,
                   f"{ast.unparse(c)} names no mesh_dim, and this file builds a {ast.unparse(made)[:50]}... mesh of "
                   f"more than one dimension (line {made.lineno}): on it get_group() raises 'Found the DeviceMesh have "
                   "N dimensions'", f"{ast.unparse(c.func)}(mesh_dim=...) for the dimension the collective runs over "
                   "(or the flattened group)", _MESH)


_HF_ZERO3 = "https://huggingface.co/docs/transformers/main/en/deepspeed#zero-3"


def rule_zero3_init_nested(lt: PythonLinter) -> None:
    """``zero3-init-nested``: ``from_pretrained`` inside a ``deepspeed.zero.Init`` context of the script's own (``with
    ContextManagers([deepspeed.zero.Init(...)]): Model.from_pretrained(...)``) in a file that asks
    ``is_deepspeed_zero3_enabled()``: when that is true, transformers' ``from_pretrained`` builds the model under its
    own ``deepspeed.zero.Init`` (modeling_utils: "Detected DeepSpeed ZeRO-3: activating zero.init() for this model";
    :data:`_HF_ZERO3`), so the parameters are partitioned by two nested contexts and the checkpoint is loaded into
    the wrong shapes or not at all (alibaba/Pai-Megatron-Patch's llama2 example).  Later transformers releases skip
    their own context when one is already active (``_is_ds_init_called``), so this is a note, not an error.  Building
    from a config (``Model(config)``) inside the context is the documented use and is not reported."""
    if "zero.Init" not in lt.text or "is_deepspeed_zero3_enabled" not in lt.text or "from_pretrained" not in lt.text:
        return

    def holds_init(expr: ast.AST, at: ast.AST, depth: int = 0) -> bool:
        if "zero.Init" in ast.unparse(expr):
            return True
        names = {n.id for n in ast.walk(expr) if isinstance(n, ast.Name)}
        fn = lt._enclosing_function(at) or lt.tree
        return depth < 2 and any(isinstance(a, (ast.Assign, ast.AugAssign)) and any(
            isinstance(t, ast.Name) and t.id in names for t in (a.targets if isinstance(a, ast.Assign) else [a.target]))
            and holds_init(a.value, a, depth + 1) for a in subtree(fn))

    for w in (n for n in lt.nodes if isinstance(n, (ast.With, ast.AsyncWith))):
        if not any(holds_init(item.context_expr, w) for item in w.items):
            continue
        call = next((c for st in w.body for c in subtree(st) if isinstance(c, ast.Call) and
                     call_name(c) == "from_pretrained"), None)
        if call is None:
            continue
        lt.add("zero3-init-nested", "info", call,
               f"{ast.unparse(call.func)}(...) runs inside this file's deepspeed.zero.Init context (line {w.lineno}), "
               "and under ZeRO-3 from_pretrained partitions the model under its own zero.Init: transformers releases "
               "that do not check for an enclosing one (the later _is_ds_init_called test) partition it twice, and "
               "in any release the outer context is redundant", "call from_pretrained outside the context (it handles "
               "ZeRO-3 itself); keep zero.Init for a model built from its config", _HF_ZERO3)


_DATAPARALLEL_OWN = frozenset({"module", "device_ids", "output_device", "dim", "src_device_obj", "replicate",
                               "parallel_apply", "gather", "scatter"})
"""What ``nn.DataParallel`` defines beyond ``nn.Module`` (torch/nn/parallel/data_parallel.py)."""


def rule_dataparallel_attribute(lt: PythonLinter) -> None:
    """``ddp-wrapper-attribute`` for torch's ``DataParallel``: ``model = torch.nn.DataParallel(model)`` (on a machine
    with several GPUs), kept as ``args.model = model``, and ``args.model.encode(...)`` read elsewhere: DataParallel is
    an ``nn.Module`` whose ``__getattr__`` finds only its own parameters, buffers and submodules (``module``), so a
    method of the wrapped model raises AttributeError exactly when there are several GPUs (dbiir/UER-py's
    text2text evaluation).  Reads under the file's own dispatch (``hasattr(args.model, "module")``) are left alone."""
    from helpers.lint.wrappers import DDP_PUBLIC

    if "DataParallel(" not in lt.text:
        return
    slots: dict[str, int] = {}  # a name of the wrapping function or a dotted slot (args.model) -> line of the wrap
    scopes: dict[str, ast.AST] = {}  # a plain name -> the function it is local to
    for c in lt._calls():
        if call_name(c) != "DataParallel" or not _torch_dataparallel(lt, c):
            continue
        a = lt.parents.get(c)
        if not (isinstance(a, ast.Assign) and len(a.targets) == 1 and isinstance(a.targets[0], ast.Name)):
            continue
        name, fn = a.targets[0].id, lt._enclosing_function(a) or lt.tree
        slots[name] = a.lineno
        scopes[name] = fn
        for s in subtree(fn):  # args.model = model after the wrap: the wrapper lives on in that slot
            if isinstance(s, ast.Assign) and s.lineno > a.lineno and isinstance(s.value, ast.Name) and \
                    s.value.id == name and len(s.targets) == 1 and isinstance(s.targets[0], ast.Attribute) and \
                    isinstance(s.targets[0].value, ast.Name):
                slots[ast.unparse(s.targets[0])] = a.lineno
    if not slots:
        return
    stored = {(ast.unparse(n.value), n.attr) for n in lt.nodes if isinstance(n, ast.Attribute) and
              isinstance(n.ctx, ast.Store)}  # (model.class_weights = ...: set on the wrapper itself, read back fine)
    done: set[str] = set()
    for node in lt.nodes:
        if not (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)) or node.attr in DDP_PUBLIC or \
                node.attr in _DATAPARALLEL_OWN or node.attr.startswith("_"):
            continue
        key = ast.unparse(node.value)
        if (key, node.attr) in stored:
            continue
        if key not in slots or key in done or key in scopes and (
                node.lineno <= slots[key] or (lt._enclosing_function(node) or lt.tree) is not scopes[key]) or \
                lt._dispatched_on(node, key):
            continue  # (a plain name: read later in the same function; a dotted slot: anywhere in the file)
        done.add(key)
        lt.add("ddp-wrapper-attribute", "error", node,
               f"{ast.unparse(node)} reads '{node.attr}' through {key}, which holds the torch.nn.DataParallel wrapper "
               f"(line {slots[key]}): the wrapper has no '{node.attr}', so this raises AttributeError whenever "
               "several GPUs are used", f"{key}.module.{node.attr} (or unwrap it: getattr({key}, 'module', {key}))",
               "https://docs.pytorch.org/docs/stable/generated/torch.nn.DataParallel.html")


def rule_unwrap_model_not_a_model(lt: PythonLinter) -> None:
    """``unwrap-model-not-a-model``: ``accelerator.unwrap_model(self.optimizer)`` (or a scheduler): ``unwrap_model``
    takes "model (torch.nn.Module) -- The model to unwrap" (:data:`_ACC`) and walks the module's wrappers, so given
    the prepared optimizer it fails in current Accelerate releases ('AcceleratedOptimizer' object has no attribute
    '_modules'; SWivid/F5-TTS's checkpoint save and load).  The optimizer's own ``state_dict()`` is what to save.
    Reported where the argument is named as an optimizer or scheduler, or is a name bound to ``torch.optim``'s."""
    if "unwrap_model(" not in lt.text:
        return
    optimizers = {ast.unparse(t) for n in lt.nodes if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                  and _OPTIMIZERS.match(call_name(n.value)) for t in n.targets}
    for c in lt._calls():
        if call_name(c) != "unwrap_model" or not c.args:
            continue
        arg = ast.unparse(c.args[0])
        leaf = arg.rsplit(".", 1)[-1]
        if not (re.fullmatch(r"(?i)\w*(?:optim|optimizer|opt|scheduler|lr_scheduler|sched)", leaf) or arg in optimizers):
            continue
        lt.add("unwrap-model-not-a-model", "error", c,
               f"{ast.unparse(c)[:60]} gives unwrap_model an optimizer or scheduler: it unwraps models (it walks the "
               "module's wrappers) and fails on the prepared optimizer ('AcceleratedOptimizer' object has no "
               "attribute '_modules')", f"{arg}.state_dict() / {arg}.load_state_dict(...) directly (the prepared "
               "optimizer forwards them)", _ACC + "#accelerate.Accelerator.unwrap_model")


__all__ = ["rule_attribute_unwrapped_elsewhere", "rule_lightning_hook_order", "rule_compiled_state_dict_prefix", "rule_unwrap_model_not_a_model", "rule_dataparallel_attribute", "rule_zero3_init_nested", "rule_mesh_get_group_without_dim", "rule_fsdp2_policy_assigned", "rule_lightning_readonly_property", "rule_ddp_wrapper_unused", "rule_stripped_state_dict_into_wrapper", "rule_ddp_buffer_after_wrap", "rule_state_dict_of_submodule", "rule_fsdp_meta_without_sync", "rule_trainer_step_raw_backward", "rule_dataparallel_per_process", "rule_ddp_frozen_model", "rule_trained_module_not_wrapped", "rule_fsdp_clip_grad_norm", "rule_fsdp_inference_mode", "rule_fsdp_mesh_without_group", "rule_fsdp_optimizer_before_wrap", "rule_module_attr_without_ddp", "rule_syncbn_without_ddp", "rule_undefined_attribute", "rule_wrapper_raw_backward"]
