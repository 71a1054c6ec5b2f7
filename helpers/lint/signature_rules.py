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

if TYPE_CHECKING:
    from helpers.lint.python_rules import PythonLinter

SIGNATURES = Path(__file__).resolve().parents[1] / "data" / "api_signatures.json"
APIS: dict[str, str] = {
    "accelerate.Accelerator": "accelerate.Accelerator",
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
}
"""``package.Name`` (how a call is matched: its top-level package and its last name) -> the object whose signature is
taken (the public path).  The distributed-training APIs whose keywords scripts set most."""


_DOCS = {"accelerate": "https://huggingface.co/docs/accelerate/en/package_reference/utilities",
         "torch": "https://docs.pytorch.org/docs/stable/distributed.html",
         "deepspeed": "https://deepspeed.readthedocs.io/en/latest/initialize.html"}


def generate() -> dict[str, dict[str, object]]:
    """The signatures of :data:`APIS` from the installed packages: ``{key: {"params": [...], "varkw": bool,
    "version": "x.y"}}`` (imports torch, Accelerate and DeepSpeed: seconds)."""
    import importlib
    import inspect

    out: dict[str, dict[str, object]] = {}
    for key, path in APIS.items():
        module, _, name = path.rpartition(".")
        obj = getattr(importlib.import_module(module), name)
        params = inspect.signature(obj).parameters.values()
        package = importlib.import_module(path.split(".")[0])
        out[key] = {"params": sorted(p.name for p in params if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)),
                    "varkw": any(p.kind == p.VAR_KEYWORD for p in params),
                    "version": str(getattr(package, "__version__", "?"))}
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


__all__ = ["APIS", "SIGNATURES", "generate", "rule_api_unknown_kwarg", "signatures"]
