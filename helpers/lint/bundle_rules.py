"""MONAI bundle configs (JSON or YAML): their ``$`` expressions are Python, linted by the script rules.

A MONAI bundle's config is "a JSON or YAML file" whose string values starting with ``$`` are "Python expressions
evaluated" when the config is parsed, whose ``@id`` references name other items of the same config (``#`` separating
nested ids), and whose ``_target_`` items are instantiated (https://docs.monai.io/en/stable/config_syntax.html).  A
multi-GPU bundle (``multi_gpu_train.json``) holds the distributed set-up itself: ``"device": "$torch.device(...)"``,
``"$torch.cuda.set_device(@device)"``, a ``DistributedDataParallel`` target given ``"device_ids": ["@device"]``.

:func:`as_python` writes those expressions as a Python text, each on its config line (an item with an identifier for
a key becomes an assignment to it; references become names), and :func:`lint_bundle` runs the script rules on it and
keeps the device-binding findings, placed in the config.  Written here rather than through MONAI's own
``ConfigParser``: that resolves the references by evaluating the expressions (importing torch, calling
``dist.get_rank()``), which a linter must not do.
"""

from __future__ import annotations

import ast
import json
import re
from collections.abc import Iterator
from typing import Any

from helpers.checks import Check

BUNDLE_SYNTAX = "https://docs.monai.io/en/stable/config_syntax.html"
KEPT_RULES = frozenset({"device-from-global-rank", "local-rank-as-global-rank", "same-device-every-rank",
                        "visible-devices-as-ordinal"})
"""The script rules whose findings hold for a bundle's expressions (which GPU each rank binds): the others need the
script's control flow, which a config does not have."""
_REF = re.compile(r"@([A-Za-z_][\w#]*)")


def _strings(data: Any, key: str = "") -> Iterator[tuple[str, str]]:
    """``(key, value)`` of every string in ``data``, with the key of the mapping that holds it ('' in a list)."""
    if isinstance(data, dict):
        for k, v in data.items():
            yield from _strings(v, str(k))
    elif isinstance(data, list):
        for v in data:
            yield from _strings(v, "")
    elif isinstance(data, str):
        yield key, data


def is_bundle(data: Any) -> bool:
    """Whether a parsed config reads as a MONAI bundle: a ``_target_`` item and at least one ``$`` expression."""
    strings = list(_strings(data))
    return any(v.startswith("$") for _k, v in strings) and '"_target_"' in json.dumps(data)


def _name(ref: str) -> str:
    return re.sub(r"\W", "_", ref.replace("#", "_"))


def as_python(text: str, data: Any) -> str:
    """The bundle's ``$`` expressions as Python, each on the line of the config that holds it (blank lines between);
    ``"key": "$expr"`` becomes ``key = expr`` when the key (``#`` read as ``_``) is an identifier, ``@ref`` becomes the
    name ``ref``.  An expression that does not parse is left out."""
    lines: dict[int, list[str]] = {}
    for key, value in _strings(data):
        if not value.startswith("$"):
            continue
        expr = _REF.sub(lambda m: _name(m.group(1)), value[1:])
        try:
            ast.parse(expr)
        except SyntaxError:
            continue
        target = _name(key)
        stmt = expr if expr.startswith(("import ", "from ")) or not target.isidentifier() \
            else f"{target} = {expr}"
        where = text.find(json.dumps(value)[1:-1]) if json.dumps(value)[1:-1] in text else text.find(value)
        line = text.count("\n", 0, where) + 1 if where >= 0 else 1
        lines.setdefault(line, []).append(stmt)
    if not lines:
        return ""
    return "\n".join("; ".join(lines.get(i, [])) for i in range(1, max(lines) + 1)) + "\n"


def lint_bundle(path: str, text: str, data: Any) -> list[Check]:
    """The device-binding findings (:data:`KEPT_RULES`) of a MONAI bundle's expressions, placed in ``path``."""
    from helpers.lint import contract_rules, python_rules

    source = as_python(text, data)
    if not source:
        return []
    got, _facts = python_rules.lint_python(path, source, (contract_rules.run,))
    return [f for f in got if f.id in KEPT_RULES]


__all__ = ["BUNDLE_SYNTAX", "KEPT_RULES", "as_python", "is_bundle", "lint_bundle"]
