"""Plain helpers the test files import (``from support import ...``); fixtures live in ``conftest.py``.

pytest puts ``tests/`` on ``sys.path`` (``pythonpath`` in ``pyproject.toml``), so every layer folder can import this module.
"""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "helpers" / "scenarios"

needs_lab = pytest.mark.needs_lab
"""Marks a test that builds the network lab; ``conftest.py`` skips it, with the reason, where the lab cannot be built."""


@functools.cache
def lab_status() -> tuple[bool, str]:
    """``netlab.lab_available()`` once per session: ``(available, why)``; ``why`` names the missing piece when not available."""
    from helpers import netlab

    return netlab.lab_available()


def lab_leftovers(name: str) -> list[str]:
    """Everything of lab ``name`` still on the system: namespaces, mounts, the state folder, a rootless holder."""
    from helpers import netlab

    return netlab.Lab(1, name=name).leftovers()


def execute_notebook(name: str, parameters: dict | None = None, timeout_s: float = 600) -> Path:
    """Execute ``notebooks/<name>`` with papermill into ``build/executed/`` and return the executed copy.

    The copy is stamped with where and when it ran (``helpers.provenance``: the book prints it), also when a
    cell failed.  Raises papermill's ``PapermillExecutionError`` when a cell fails (the test then fails with
    the cell's error).  The source notebook is never written to.
    """
    import papermill

    out = ROOT / "build" / "executed" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    try:
        papermill.execute_notebook(str(ROOT / "notebooks" / name), str(out), parameters=parameters or {},
                                   cwd=str(ROOT / "notebooks"), kernel_name="python3", progress_bar=False,
                                   execution_timeout=timeout_s)
    finally:
        if out.exists():
            stamp_run(out)
    return out


def stamp_run(executed: Path) -> None:
    """Stamp an executed chapter with this machine and the test that ran it (``PYTEST_CURRENT_TEST``'s file)."""
    import os

    from helpers import provenance

    test = os.environ.get("PYTEST_CURRENT_TEST", "").split("::")[0]
    provenance.stamp(executed, f"pytest {test}" if test else "pytest")


def assert_outputs_reproduce(executed: Path) -> None:
    """The chapter's deterministic cells printed what their committed reference holds (nbval's comparison).

    ``helpers.reference_outputs`` compares the strict cells of this fresh run with
    ``tests/notebooks/reference/<chapter>.json``; no second execution.  Fails with nbval's report of each
    differing cell (and how to update the reference when the change is intended).
    """
    from helpers import reference_outputs

    result = reference_outputs.compare(executed)
    print(result.render().splitlines()[0])
    assert result.ok and not result.skipped, result.render()


def notebook_outputs(path: Path) -> tuple[list[str], str]:
    """``(error names, all text output)`` of an executed notebook's code cells."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    errors = [o.get("ename", "") for o in outputs if o.get("output_type") == "error"]
    return errors, "".join(o.get("text", "") for o in outputs)


def run(cmd: list[str], env: dict[str, str], timeout: float) -> subprocess.CompletedProcess:
    """Run ``cmd`` in the repository root, capturing its output as text."""
    return subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=timeout)


def by_id(checks: Sequence[Any]) -> dict[str, Any]:
    """Check records (anything with an ``id``, e.g. a pre-flight ``Check``) by id."""
    return {c.id: c for c in checks}


def not_ok(checks: Sequence[Any]) -> dict[str, Any]:
    """The check records whose ``status`` is not ``"OK"``, by id."""
    return {c.id: c for c in checks if c.status != "OK"}


def record_by_id(records: Sequence[Any]) -> dict[str, dict[str, Any]]:
    """Check records (:class:`helpers.checks.Check`, e.g. from ``local.host_checks``) as dicts, by id."""
    return {r.id: r.to_dict() for r in records}
