"""Shared fixtures: every test must leave no launcher, rank, listener or temp dir behind."""

from __future__ import annotations

import glob
import os
import sys
from pathlib import Path

import psutil
import pytest

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "helpers" / "scenarios"


def job_processes() -> list[psutil.Process]:
    """Processes started by the job runner (they carry ``RUNBOOK_JOB_DIR`` in their environment)."""
    found = []
    for proc in psutil.process_iter(["pid"]):
        try:
            if proc.pid != os.getpid() and "RUNBOOK_JOB_DIR" in proc.environ():
                found.append(proc)
        except psutil.Error:
            continue
    return found


def listening_ports() -> set[int]:
    """TCP ports with a listener on this host."""
    return {c.laddr.port for c in psutil.net_connections(kind="tcp") if c.status == psutil.CONN_LISTEN}


@pytest.fixture
def no_leftovers():
    """Assert that the test left no job process, new listener or /tmp/torchelastic_* behind."""
    before_ports = listening_ports()
    before_tmp = set(glob.glob("/tmp/torchelastic_*"))
    yield
    leftovers = job_processes()
    for proc in leftovers:  # clean up so one failure does not cascade, then fail
        proc.kill()
    assert not leftovers, f"processes left behind: {[p.pid for p in leftovers]}"
    assert listening_ports() <= before_ports, f"new listeners: {listening_ports() - before_ports}"
    assert set(glob.glob("/tmp/torchelastic_*")) <= before_tmp


@pytest.fixture(autouse=True)
def _python_path(monkeypatch):
    """Run tools from this interpreter's venv even when PATH does not name it."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
