"""Shared fixtures: every test must leave no launcher, rank, listener or temp dir behind."""

from __future__ import annotations

import glob
import os
import sys
import uuid
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "helpers" / "scenarios"


def job_processes(test_id: str) -> list[psutil.Process]:
    """Processes started by the job runner during test ``test_id``.

    The fixture puts ``RUNBOOK_TEST_ID`` in the environment; the runner passes the environment on,
    so exactly this test's launchers and ranks carry it (jobs of other sessions are never touched).
    """
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.pid != os.getpid() and proc.environ().get("RUNBOOK_TEST_ID") == test_id:
                found.append(proc)
        except psutil.Error:
            continue
    return found


@pytest.fixture
def no_leftovers(monkeypatch):
    """Assert that the test's jobs left no process (hence no port listener) and no /tmp/torchelastic_*."""
    test_id = uuid.uuid4().hex
    monkeypatch.setenv("RUNBOOK_TEST_ID", test_id)
    before_tmp = set(glob.glob("/tmp/torchelastic_*"))
    yield
    leftovers = job_processes(test_id)
    for proc in leftovers:  # clean up so one failure does not cascade, then fail
        proc.kill()
    assert not leftovers, f"processes left behind: {[p.pid for p in leftovers]}"
    assert set(glob.glob("/tmp/torchelastic_*")) <= before_tmp


@pytest.fixture(autouse=True)
def _python_path(monkeypatch):
    """Run tools from this interpreter's venv even when PATH does not name it."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")


def execute_notebook(name: str, parameters: dict | None = None, timeout_s: float = 600) -> Path:
    """Execute ``notebooks/<name>`` with papermill into ``build/executed/`` and return the executed copy.

    Raises papermill's ``PapermillExecutionError`` when a cell fails (the test then fails with
    the cell's error).  The source notebook is never written to.
    """
    import papermill

    out = ROOT / "build" / "executed" / name
    out.parent.mkdir(parents=True, exist_ok=True)
    papermill.execute_notebook(str(ROOT / "notebooks" / name), str(out), parameters=parameters or {},
                               cwd=str(ROOT / "notebooks"), kernel_name="python3", progress_bar=False,
                               execution_timeout=timeout_s)
    return out


def notebook_outputs(path: Path) -> tuple[list[str], str]:
    """``(error names, all text output)`` of an executed notebook's code cells."""
    import nbformat

    nb = nbformat.read(path, as_version=4)
    outputs = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])]
    errors = [o.get("ename", "") for o in outputs if o.get("output_type") == "error"]
    return errors, "".join(o.get("text", "") for o in outputs)
