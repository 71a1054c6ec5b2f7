"""AST look-ups the contract rules share (:mod:`helpers.lint.contract_rules` and the rule modules it runs): a
call's keyword, a constant's value, a name's single assignment, a node's ancestors.  Standard library only."""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Iterator

    from helpers.lint.python_rules import PythonLinter


_SUBTREES: dict[int, tuple[ast.AST, list[ast.AST]]] = {}
"""id(node) -> (node, its walk); emptied for each file (:func:`forget_subtrees`)."""


def subtree(node: ast.AST) -> list[ast.AST]:
    """``list(ast.walk(node))``, in the same breadth-first order, computed once per node and file.  Many rules walk
    every function of the file; keeping the walk makes that a list scan (``benchmarks/bench_lint.py``: the walks
    were about a third of the time).  The list is shared: read it, do not change it.  Rules never change the tree,
    so a kept walk stays right for the file's life; the identity check guards an ``id`` reused by a later node."""
    got = _SUBTREES.get(id(node))
    if got is None or got[0] is not node:
        got = _SUBTREES[id(node)] = (node, list(ast.walk(node)))
    return got[1]


def forget_subtrees() -> None:
    """Empty :func:`subtree`'s store (at the start of each file: the nodes of the last one are no longer needed)."""
    _SUBTREES.clear()


def const(node: ast.AST | None) -> object:
    """The value of a literal constant (``"nccl"``, ``2``, ``None``...); None for anything else (or no node)."""
    return node.value if isinstance(node, ast.Constant) else None


def kwarg(call: ast.Call, name: str) -> ast.AST | None:
    """The value given to keyword ``name`` in ``call`` (``init_process_group(backend=...)``), or None when absent."""
    return next((k.value for k in call.keywords if k.arg == name), None)


def statement_blocks(lt: PythonLinter) -> Iterator[list[ast.stmt]]:
    """Every list of statements in the file (each ``body`` and ``orelse``), for rules that read one block's statements
    in order."""
    for node in lt.nodes:
        for fld in ("body", "orelse"):
            block = getattr(node, fld, None)
            if isinstance(block, list):
                yield block


def under_if(lt: PythonLinter, node: ast.AST, top: ast.AST) -> bool:
    """``node`` sits in an ``if`` (or its ``else``) below ``top``: it runs only on some paths (``if resume:``)."""
    p = lt.parents.get(node)
    while p is not None and p is not top:
        if isinstance(p, ast.If):
            return True
        p = lt.parents.get(p)
    return False


def assigned_once(lt: PythonLinter, name: str, at: ast.AST, before: int | None = None) -> ast.Assign | None:
    """The one assignment to ``name`` in the function holding ``at`` (the module for module-level code), or None when
    there is none or more than one; ``before``: count only assignments above that line."""
    fn = lt._enclosing_function(at) or lt.tree
    sets = [n for n in subtree(fn) if isinstance(n, ast.Assign) and (before is None or n.lineno < before)
            and any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]
    return sets[0] if len(sets) == 1 else None


def last_assignment(lt: PythonLinter, name: str, at: ast.AST) -> ast.Assign | None:
    """The last assignment to ``name`` above the line of ``at`` in the function holding ``at`` (the module for
    module-level code), or None."""
    fn = lt._enclosing_function(at) or lt.tree
    line = getattr(at, "lineno", 0)
    return max((n for n in subtree(fn) if isinstance(n, ast.Assign) and n.lineno < line and
                any(isinstance(t, ast.Name) and t.id == name for t in n.targets)), key=lambda n: n.lineno, default=None)


def moved(lt: PythonLinter, name: str, at: ast.AST) -> bool:
    """``name.cuda()`` or ``name.to(...)`` is called in the function holding ``at``."""
    fn = lt._enclosing_function(at) or lt.tree
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in ("cuda", "to")
               and isinstance(n.func.value, ast.Name) and n.func.value.id == name for n in subtree(fn))


def method_named(cls: ast.ClassDef, name: str) -> ast.FunctionDef | None:
    """The method ``name`` defined in the body of ``cls`` (``__init__``, ``setup``, ``compute``), or None."""
    return next((m for m in cls.body if isinstance(m, ast.FunctionDef) and m.name == name), None)


def ancestors(lt: PythonLinter, node: ast.AST) -> list[ast.AST]:
    """The nodes that hold ``node``, innermost first, up to the module."""
    out, p = [], lt.parents.get(node)
    while p is not None:
        out.append(p)
        p = lt.parents.get(p)
    return out


def src_env_key(target: ast.Subscript) -> str | None:
    """The key of ``os.environ["KEY"]`` (or ``environ["KEY"]``) as an assignment target; None for anything else."""
    if ast.unparse(target.value) not in ("os.environ", "environ"):
        return None
    key = target.slice
    return key.value if isinstance(key, ast.Constant) and isinstance(key.value, str) else None


__all__ = ["ancestors", "assigned_once", "const", "kwarg", "last_assignment", "moved", "src_env_key", "statement_blocks", "under_if"]
