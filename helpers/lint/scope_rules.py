"""Python's name resolution where it breaks set-up code: an imported helper rebound inside a function.

"If a name is bound in a block, it is a local variable of that block" and "all uses of the name within the block
refer to" that binding (https://docs.python.org/3/reference/executionmodel.html#resolution-of-names).  A function
that assigns to the name of a module-level import (``hsdp_device_mesh = None``) and also calls that name reads its
local: ``UnboundLocalError`` before the assignment, or a call of the value given (``'NoneType' object is not
callable``) after it.  Run by :func:`helpers.lint.contract_rules.run`.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from helpers.lint.contract_ast import subtree

if TYPE_CHECKING:
    from helpers.lint.python_rules import PythonLinter

_NAMES = "https://docs.python.org/3/reference/executionmodel.html#resolution-of-names"


def _imported(tree: ast.AST) -> set[str]:
    """Names a module-level ``import`` / ``from ... import`` binds."""
    out: set[str] = set()
    for node in getattr(tree, "body", []):
        if isinstance(node, (ast.Import, ast.ImportFrom)):
            out.update((a.asname or a.name).split(".")[0] for a in node.names if a.name != "*")
    return out


def rule_shadowed_import_called(lt: PythonLinter) -> None:
    """``shadowed-import-called``: a function assigns to the name of a module-level import and calls that name
    (meta-llama/llama-recipes: ``hsdp_device_mesh = None`` then ``hsdp_device_mesh(replica_group_size=...)``, so the
    hybrid-sharding mesh is never built).  Not where the function declares it ``global`` / ``nonlocal``."""
    imported = _imported(lt.tree)
    if not imported:
        return
    for fn in (n for n in lt.nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        declared = {x for n in subtree(fn) if isinstance(n, (ast.Global, ast.Nonlocal)) for x in n.names}
        body = [n for st in fn.body for n in subtree(st)]
        nested = {id(n) for st in fn.body for d in subtree(st)
                  if isinstance(d, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef))
                  for n in ast.walk(d) if n is not d}
        bound: dict[str, int] = {}
        for n in body:
            if id(n) not in nested and isinstance(n, (ast.Assign, ast.AnnAssign)):
                for t in (n.targets if isinstance(n, ast.Assign) else [n.target]):
                    if isinstance(t, ast.Name):
                        bound[t.id] = min(bound.get(t.id, t.lineno), t.lineno)
        for name in sorted((set(bound) & imported) - declared):
            call = next((c for c in body if id(c) not in nested and isinstance(c, ast.Call)
                         and isinstance(c.func, ast.Name) and c.func.id == name), None)
            if call is None:
                continue
            lt.add("shadowed-import-called", "error", call,
                   f"{name}(...) calls the name this function assigns (line {bound[name]}), not the imported {name}: "
                   "a name bound anywhere in a function is local to all of it, so this raises UnboundLocalError or "
                   "calls the value assigned ('NoneType' object is not callable)",
                   f"give the local another name ({name}_result = {name}(...))", _NAMES)
            return


__all__ = ["rule_shadowed_import_called"]
