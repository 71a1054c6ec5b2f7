"""Keyword arguments checked against the signatures of the APIs themselves (``api-unknown-kwarg``).

A keyword an API does not take is a ``TypeError: __init__() got an unexpected keyword argument`` when the line runs
(kohya sd-scripts passed ``offload_optimizer=`` to Accelerate's ``DeepSpeedPlugin``, whose field is
``offload_optimizer_device``).  The accepted names are not written here: :data:`SIGNATURES` holds
``inspect.signature`` of each API of :data:`APIS` as the installed torch, Accelerate and DeepSpeed define it
(``helpers/data/api_signatures.json``; :func:`generate` rewrites it and a test keeps it equal to the installed
packages), so the linter needs none of them imported.

A keyword far from every accepted name may belong to another release of the package (a renamed or newer parameter):
it is left alone.  One a slip away from an accepted name (``difflib`` ratio >= 0.8) is the finding, with the name
meant.
"""

from __future__ import annotations

import ast
import difflib
import json
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from helpers.lint.contract_ast import subtree

if TYPE_CHECKING:
    from helpers.lint.python_rules import PythonLinter

SIGNATURES = Path(__file__).resolve().parents[1] / "data" / "api_signatures.json"
APIS: dict[str, str] = {
    "accelerate.Accelerator": "accelerate.Accelerator",
    "accelerate.AcceleratorState": "accelerate.state.AcceleratorState",
    "accelerate.PartialState": "accelerate.state.PartialState",
    "accelerate.DeepSpeedPlugin": "accelerate.utils.DeepSpeedPlugin",
    "accelerate.FullyShardedDataParallelPlugin": "accelerate.utils.FullyShardedDataParallelPlugin",
    "accelerate.DistributedDataParallelKwargs": "accelerate.utils.DistributedDataParallelKwargs",
    "accelerate.InitProcessGroupKwargs": "accelerate.utils.InitProcessGroupKwargs",
    "accelerate.ProjectConfiguration": "accelerate.utils.ProjectConfiguration",
    "accelerate.GradientAccumulationPlugin": "accelerate.utils.GradientAccumulationPlugin",
    "accelerate.DataLoaderConfiguration": "accelerate.utils.DataLoaderConfiguration",
    "torch.DistributedDataParallel": "torch.nn.parallel.DistributedDataParallel",
    "torch.FullyShardedDataParallel": "torch.distributed.fsdp.FullyShardedDataParallel",
    "torch.DataLoader": "torch.utils.data.DataLoader",
    "torch.DistributedSampler": "torch.utils.data.distributed.DistributedSampler",
    "torch.init_process_group": "torch.distributed.init_process_group",
    "torch.new_group": "torch.distributed.new_group",
    "deepspeed.initialize": "deepspeed.initialize",
    "deepspeed.init_distributed": "deepspeed.init_distributed",
    "deepspeed.GatheredParameters": "deepspeed.runtime.zero.partition_parameters.GatheredParameters",
    "deepspeed.Init": "deepspeed.runtime.zero.partition_parameters.Init",
}
"""``package.Name`` (how a call is matched: its top-level package and its last name) -> the object whose signature is
taken (the public path).  The distributed-training APIs whose keywords scripts set most."""


_DOCS = {"accelerate": "https://huggingface.co/docs/accelerate/en/package_reference/utilities",
         "torch": "https://docs.pytorch.org/docs/stable/distributed.html",
         "deepspeed": "https://deepspeed.readthedocs.io/en/latest/initialize.html"}


ATTRIBUTE_APIS = {"accelerate.Accelerator": (), "accelerate.AcceleratorState": ("accelerate.PartialState",),
                  "accelerate.PartialState": (), "accelerate.DeepSpeedPlugin": ()}
"""The classes whose instance attributes are recorded too (``"attributes"``), each with the classes whose attributes
its instances also carry (an ``AcceleratorState`` shares ``PartialState``'s state dict: accelerate/state.py)."""


def _attributes(cls: type) -> list[str]:
    """The public names an instance of ``cls`` can answer: ``dir(cls)`` and every ``self.X = ...`` in the source of the
    classes of its MRO that belong to the same package (instance attributes set in ``__init__`` and methods)."""
    import inspect
    import textwrap

    out = set(dir(cls))
    package = cls.__module__.split(".")[0]
    for klass in cls.__mro__:
        if not klass.__module__.startswith(package):
            continue
        try:
            tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        except (OSError, TypeError, SyntaxError):
            continue
        out.update(n.attr for n in subtree(tree) if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)
                   and isinstance(n.value, ast.Name) and n.value.id == "self")
    return sorted(a for a in out if not a.startswith("_"))  # public names only: the rule skips private ones


def generate() -> dict[str, dict[str, object]]:
    """The signatures of :data:`APIS` from the installed packages: ``{key: {"params": [...], "varkw": bool,
    "version": "x.y"}}``, with ``"attributes"`` for :data:`ATTRIBUTE_APIS` (imports torch, Accelerate and DeepSpeed:
    seconds)."""
    import importlib
    import inspect

    out: dict[str, dict[str, object]] = {}
    classes: dict[str, type] = {}
    for key, path in APIS.items():
        module, _, name = path.rpartition(".")
        obj = getattr(importlib.import_module(module), name)
        params = inspect.signature(obj).parameters.values()
        package = importlib.import_module(path.split(".")[0])
        out[key] = {"params": sorted(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)),
                    "varkw": any(p.kind == p.VAR_KEYWORD for p in params),
                    "version": str(getattr(package, "__version__", "?"))}
        classes[key] = obj
    for key, shared in ATTRIBUTE_APIS.items():
        out[key]["attributes"] = sorted(set(_attributes(classes[key])).union(*(_attributes(classes[s]) for s in shared)))
    return out


@lru_cache(maxsize=1)
def signatures() -> dict[str, dict[str, object]]:
    """:data:`SIGNATURES`, read once."""
    return json.loads(SIGNATURES.read_text())


def _api_key(call: ast.Call, names: dict[str, str]) -> str | None:
    """``package.Name`` of the API ``call`` calls, when it is one of :data:`APIS`."""
    parts: list[str] = []
    f: ast.AST = call.func
    while isinstance(f, ast.Attribute):
        parts.insert(0, f.attr)
        f = f.value
    if not isinstance(f, ast.Name):
        return None
    dotted = ".".join([names.get(f.id, f.id), *parts])
    key = f"{dotted.split('.')[0]}.{dotted.rsplit('.', 1)[-1]}"
    return key if key in APIS and (f.id in names or f.id in ("torch", "accelerate", "deepspeed")) else None


def rule_api_unknown_kwarg(lt: PythonLinter) -> None:
    """``api-unknown-kwarg``: a keyword argument of a call to one of :data:`APIS` that its signature does not take and
    that is one slip from a name it does take (module docstring)."""
    if not any(p in lt.text for p in ("accelerate", "torch", "deepspeed")):
        return
    names = lt.import_origins
    sigs = signatures()
    for c in lt._calls():
        if not c.keywords:
            continue
        key = _api_key(c, names)
        sig = sigs.get(key) if key else None
        if not sig or sig["varkw"]:
            continue
        params = sig["params"]
        for k in c.keywords:
            if k.arg is None or k.arg in params:
                continue
            meant = next(iter(difflib.get_close_matches(k.arg, params, n=1, cutoff=0.8)), None)
            if meant is None:
                continue  # far from every parameter: another release's name, not a slip
            lt.add("api-unknown-kwarg", "error", c,
                   f"{ast.unparse(c.func)}(..., {k.arg}=...): {key.split('.', 1)[1]} takes no '{k.arg}' (its "
                   f"parameter is '{meant}'; {key.split('.')[0]} {sig['version']}): TypeError when the line runs",
                   f"{meant}=...", _DOCS[key.split(".")[0]])


_INSTANCE_OF = {"Accelerator": "accelerate.Accelerator", "AcceleratorState": "accelerate.AcceleratorState",
                "PartialState": "accelerate.PartialState"}


def _accelerate_instances(lt: PythonLinter) -> dict[str, str]:
    """Source of an expression (``accelerator``, ``self.accelerator``, ``state``) -> the Accelerate class it holds:
    bound from ``Accelerator(...)`` / ``AcceleratorState()`` / ``PartialState()`` in the file, and ``accelerator`` /
    ``self.accelerator`` (the name every Accelerate example gives it)."""
    from helpers.lint.python_rules import _call_name

    out: dict[str, str] = {"accelerator": "accelerate.Accelerator", "self.accelerator": "accelerate.Accelerator"}
    for n in lt.nodes:
        if not isinstance(n, ast.Assign):
            continue
        values = [n.value.body, n.value.orelse] if isinstance(n.value, ast.IfExp) else [n.value]
        made = next((_call_name(v)[1] for v in values if isinstance(v, ast.Call) and _call_name(v)[1] in _INSTANCE_OF),
                    None)  # `state = AcceleratorState() if is_initialized() else None`: the state when not None
        if made is not None:
            for tgt in n.targets:
                out[ast.unparse(tgt)] = _INSTANCE_OF[made]
    return out


_STDLIB = ("os", "os.path", "shutil", "sys", "json", "pickle", "time", "math", "glob", "socket", "subprocess")
"""Standard-library modules whose attributes this Python's own modules answer for (stable across 3.x releases)."""


def rule_stdlib_attribute_unknown(lt: PythonLinter) -> None:
    """``api-unknown-attribute`` for a call of a standard-library module's function that the module does not have
    (``os.join(save_dir, "model.pt")``: AttributeError, module 'os' has no attribute 'join'), checked against the
    running Python's modules (:data:`_STDLIB`).  In a training script such a line usually sits on a path that only one
    rank or only the end of the run takes (SageMaker's MNIST example saved under ``if rank == 0`` with ``os.join``:
    rank 0 died after training while the others waited), so the first one-GPU try never reaches it."""
    import importlib

    for c in lt._calls():
        if not isinstance(c.func, ast.Attribute):
            continue
        owner = ast.unparse(c.func.value)
        origin = lt.import_origins.get(owner.split(".")[0])
        if origin is None or owner.split(".")[0] != origin or owner not in _STDLIB:
            continue  # `os` bound to the os module by `import os` (not an alias of something else)
        try:
            module = importlib.import_module(owner)
        except ImportError:
            continue
        if hasattr(module, c.func.attr) or any(isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store) and
                                               ast.unparse(n) == ast.unparse(c.func) for n in lt.nodes):
            continue
        lt.add("api-unknown-attribute", "error", c,
               f"{ast.unparse(c.func)}(): module '{owner}' has no attribute '{c.func.attr}' (AttributeError when the "
               "line runs; a line on rank 0's path only, or at the end of the run, is not reached by a short "
               "one-process try)", "the function this meant (os.path.join for os.join)",
               f"https://docs.python.org/3/library/{owner}.html")


def rule_api_unknown_attribute(lt: PythonLinter) -> None:
    """``api-unknown-attribute``: an attribute an Accelerate object does not have, by the installed classes
    (:data:`ATTRIBUTE_APIS`: ``dir()`` plus every ``self.X =`` of their source).  ``getattr(accelerator, "rank", 0)``
    always answers the default (Accelerate's name is ``process_index``: every process takes rank 0; bghira/SimpleTuner
    wrote every rank's training state to one file); ``AcceleratorState().zero3_init_context_manager`` reads a
    ``DeepSpeedPlugin`` attribute on the state (AttributeError; huggingface/diffusers#3410).  A plain read is reported
    only when the name belongs to another of these classes or is one slip from one of the object's own (a name far
    from all may be another release's)."""
    if "ccelerat" not in lt.text:
        return
    sigs = signatures()
    instances = _accelerate_instances(lt)
    stored = {n.attr for n in lt.nodes if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Store)} | \
        {c.args[1].value for c in lt.nodes if isinstance(c, ast.Call) and isinstance(c.func, ast.Name) and
         c.func.id == "setattr" and len(c.args) > 1 and isinstance(c.args[1], ast.Constant)}
    for node in lt.nodes:
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "getattr" and \
                len(node.args) == 3 and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str):
            key = instances.get(ast.unparse(node.args[0]))
            attrs = sigs.get(key, {}).get("attributes") if key else None
            name = node.args[1].value
            if attrs and name not in attrs and not name.startswith("_") and name not in stored:  # a project's own
                # attribute set on the object (accelerator._lycoris_wrapped_network = ...) is not Accelerate's
                meant = next(iter(difflib.get_close_matches(name, attrs, n=1, cutoff=0.6)), None)
                lt.add("api-unknown-attribute", "warning", node,
                       f"{ast.unparse(node)[:60]}: {key.split('.')[1]} has no '{name}' (accelerate "
                       f"{sigs[key]['version']}), so this always answers the default"
                       + (f"; its attribute is '{meant}'" if meant else ""),
                       f"{ast.unparse(node.args[0])}.{meant or '<the attribute meant>'}", _DOCS["accelerate"])
                return
        if not (isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)):
            continue
        base = node.value
        key = _INSTANCE_OF.get(base.func.id) if isinstance(base, ast.Call) and isinstance(base.func, ast.Name) and \
            not base.args else instances.get(ast.unparse(base))
        attrs = sigs.get(key, {}).get("attributes") if key else None
        if not attrs or node.attr in attrs or node.attr.startswith("_") or node.attr in stored:
            continue
        owner = next((k for k, v in sigs.items() if k != key and node.attr in v.get("attributes", ())), None)
        meant = next(iter(difflib.get_close_matches(node.attr, attrs, n=1, cutoff=0.85)), None)
        if owner is None and meant is None:
            continue
        where = f"it is {owner.split('.')[1]}'s" if owner else f"its attribute is '{meant}'"
        lt.add("api-unknown-attribute", "error", node,
               f"{ast.unparse(node)[:60]}: {key.split('.')[1]} has no '{node.attr}' ({where}; accelerate "
               f"{sigs[key]['version']}): AttributeError when the line runs",
               "AcceleratorState().deepspeed_plugin." + node.attr if owner == "accelerate.DeepSpeedPlugin"
               else f"{ast.unparse(base)}.{meant or '<the attribute meant>'}", _DOCS["accelerate"])
        return


__all__ = ["rule_stdlib_attribute_unknown", "APIS", "ATTRIBUTE_APIS", "SIGNATURES", "generate", "rule_api_unknown_attribute", "rule_api_unknown_kwarg",
           "signatures"]
