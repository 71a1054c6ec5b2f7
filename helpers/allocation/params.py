"""The allocation check's notebook parameters (``runbook diagnose -p NAME VALUE``), checked before any job starts.

A bad value is an input error, not an allocation FAIL: ``runbook diagnose -p MAX_BYTES -5`` used to run
for 46 s and report ``collectives job did not finish`` (issue 11).  :func:`validate` raises
``ValueError`` naming the parameter and its accepted range (the CLI exits 2 with it).
"""

from __future__ import annotations

import ast
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from helpers.slurm import RUNNERS
from helpers.validate import positive_float, positive_int, tcp_port

SMOKES = ("01", "02", "03")
MULTI_STEPS = ("nodes", "job", "smoke", "preflight", "localise")
BACKENDS = ("auto", "gloo", "nccl")


def notebook_defaults(path: str | Path) -> dict[str, Any]:
    """The literals of the notebook's ``parameters`` cell: ``{NAME: default}``.

    Raises:
        ValueError: the notebook has no cell tagged ``parameters``.
    """
    import json

    nb = json.loads(Path(path).read_text())
    for cell in nb["cells"]:
        if "parameters" in cell.get("metadata", {}).get("tags", []):
            tree = ast.parse("".join(cell["source"]))
            return {t.id: ast.literal_eval(n.value) for n in tree.body if isinstance(n, ast.Assign)
                    for t in n.targets if isinstance(t, ast.Name)}
    raise ValueError(f"{path}: no cell tagged 'parameters'")


def _csv_subset(value: object, name: str, choices: tuple[str, ...]) -> None:
    if not isinstance(value, str):
        raise ValueError(f"{name}={value!r}: a comma-separated subset of {','.join(choices)} (may be empty)")
    bad = [w for w in value.split(",") if w and w not in choices]
    if bad:
        raise ValueError(f"{name}={value!r}: {bad[0]!r} is not one of {','.join(choices)}")


def validate(params: Mapping[str, Any], defaults: Mapping[str, Any] | None = None) -> None:
    """Check every parameter of ``params`` that the allocation check knows (types and ranges).

    Args:
        params: ``{NAME: value}`` as papermill would inject them.
        defaults: the notebook's parameters (:func:`notebook_defaults`); when given, a name not
            among them is an error listing the accepted names.

    Raises:
        ValueError: ``NAME=value: must be ...`` for the first bad parameter.
    """
    if defaults is not None:
        unknown = sorted(set(params) - set(defaults))
        if unknown:
            raise ValueError(f"{unknown[0]}: not a parameter of the allocation check; accepted: {', '.join(sorted(defaults))}")
    p = dict(params)
    ints = {"NPROC": 1, "CHECK_ELEMENTS": 1, "SMOKE_STEPS": 1, "SMOKE_HIDDEN": 1, "SMOKE_BATCH": 1,
            "MIN_BYTES": 4, "MAX_BYTES": 4, "CORRUPT_RANK": -1, "RANKS_PER_NODE": 0, "GPUS_PER_NODE": -1}
    for name, low in ints.items():
        if name in p:
            positive_int(p[name], name, low)
    for name in ("TIMEOUT_S", "JOIN_TIMEOUT_S"):
        if name in p:
            positive_float(p[name], name)
    if "DCGM_LEVEL" in p and (isinstance(p["DCGM_LEVEL"], bool) or p["DCGM_LEVEL"] not in (0, 1, 2)):
        raise ValueError(f"DCGM_LEVEL={p['DCGM_LEVEL']!r}: accepted values are 0 (off), 1 (dcgmi diag -r 1), 2 (-r 2)")
    if "MIN_BUSBW_GBPS" in p and (isinstance(p["MIN_BUSBW_GBPS"], bool) or not isinstance(p["MIN_BUSBW_GBPS"], (int, float))
                                  or p["MIN_BUSBW_GBPS"] < 0):
        raise ValueError(f"MIN_BUSBW_GBPS={p['MIN_BUSBW_GBPS']!r}: must be a number >= 0 (GB/s; 0 disables)")
    if "MIN_BYTES" in p and "MAX_BYTES" in p and p["MAX_BYTES"] < p["MIN_BYTES"]:
        raise ValueError(f"MAX_BYTES={p['MAX_BYTES']!r}: must be >= MIN_BYTES={p['MIN_BYTES']!r}")
    if "MASTER_PORT" in p:
        tcp_port(p["MASTER_PORT"], "MASTER_PORT")
    if "BACKEND" in p and p["BACKEND"] not in BACKENDS:
        raise ValueError(f"BACKEND={p['BACKEND']!r}: accepted values are {', '.join(BACKENDS)}")
    if "PREFLIGHT_RUNNER" in p and p["PREFLIGHT_RUNNER"] not in RUNNERS:
        raise ValueError(f"PREFLIGHT_RUNNER={p['PREFLIGHT_RUNNER']!r}: accepted values are {', '.join(RUNNERS)}")
    if "RUN_SMOKE" in p:
        _csv_subset(p["RUN_SMOKE"], "RUN_SMOKE", SMOKES)
    if "MULTI_STEPS" in p:
        _csv_subset(p["MULTI_STEPS"], "MULTI_STEPS", MULTI_STEPS)
    for name in ("PREFLIGHT_NODES", "PREFLIGHT_LAB", "REPORT_DIR"):
        if name in p and not isinstance(p[name], str):
            raise ValueError(f"{name}={p[name]!r}: must be a string")
