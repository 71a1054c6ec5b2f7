"""Fixtures shared by every layer, and the layer markers.

Every test must leave no launcher, rank, listener or temp dir behind (``no_leftovers``).  Each test gets
the marker of its folder (``tests/unit/`` -> ``unit``, ...; see ``LAYERS``), so ``pytest -m unit`` selects
a layer.  Plain helpers (``execute_notebook``, ``SCENARIOS``...) are in ``support.py``; tests/README.md says
what each layer checks and how to run it.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
import uuid
from pathlib import Path

import psutil
import pytest
from support import ROOT, lab_status

# folder under tests/ -> marker (registered in pyproject.toml's [tool.pytest.ini_options] markers)
LAYERS = {"unit": "unit", "jobs": "jobs", "lab": "lab", "scenarios": "scenarios", "configs": "configs",
          "notebooks": "notebook", "browser": "browser"}


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark each test with its layer, taken from the folder it lives in (``tests/<layer>/test_*.py``); run ``last`` tests last.

    A test elsewhere that builds the lab carries the ``lab`` marker itself (chapters 06 and 08, chapter 00's run
    across lab nodes), so ``-m lab`` selects every test that needs the lab: ``make test`` runs those in one pytest
    process and the rest in another, at the same time.  A test marked ``last`` (the book's,
    ``tests/browser/test_book_pages.py``) reads what the notebook layer wrote, so it moves after every other test,
    keeping its own order (``make test`` runs it alone, after both).
    """
    tests_dir = Path(__file__).resolve().parent
    for item in items:
        try:
            folder = item.path.resolve().relative_to(tests_dir).parts[0]
        except ValueError:
            continue
        if folder in LAYERS:
            item.add_marker(LAYERS[folder])
    items[:] = sorted(items, key=lambda item: item.get_closest_marker("last") is not None)


def pytest_runtest_setup(item: pytest.Item) -> None:
    """Skip a test marked ``needs_lab`` (``support.needs_lab``) where the network lab cannot be built, saying why."""
    if item.get_closest_marker("needs_lab"):
        available, why = lab_status()
        if not available:
            pytest.skip(f"network lab unavailable: {why}")


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
def no_leftovers(monkeypatch, tmp_path_factory):
    """Assert that the test's jobs left no process (hence no port listener), and remove the temp folders they made.

    Only what this test created is blamed: its processes carry ``RUNBOOK_TEST_ID`` (a token of this test), and
    its temp folders go to a ``TMPDIR`` of its own (under pytest's base temp, so on the shared filesystem when
    ``make test`` puts ``TMPDIR`` in ``build/``), which is removed at the end: torchrun's ``torchelastic_*`` log
    folders, which torch never deletes, included.  A ``torchrun`` that something else starts meanwhile, with its
    ``/tmp/torchelastic_*``, is none of this test's business (the old check counted those and failed the suite).
    """
    test_id = uuid.uuid4().hex
    monkeypatch.setenv("RUNBOOK_TEST_ID", test_id)
    private_tmp = tmp_path_factory.mktemp("tmpdir")
    monkeypatch.setenv("TMPDIR", str(private_tmp))
    monkeypatch.setattr(tempfile, "tempdir", None)  # tempfile re-reads TMPDIR
    yield
    leftovers = job_processes(test_id)
    for proc in leftovers:  # clean up so one failure does not cascade, then fail
        proc.kill()
    shutil.rmtree(private_tmp, ignore_errors=True)
    assert not leftovers, f"processes left behind: {[p.pid for p in leftovers]}"


def pytest_sessionstart(session: pytest.Session) -> None:
    """Note the ``/dev/shm`` segments present when the run starts."""
    session.config.stash[_SHM_AT_START] = shm_segments()


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Fail the run when it left ``/dev/shm`` segments behind that no process maps any more; remove those.

    Checked once for the whole run rather than per test, and only for segments nobody maps: ``make test`` runs two
    pytest processes at once, and a segment that appears meanwhile may belong to a live job of the other one.
    """
    if _SHM_AT_START not in session.config.stash:  # the session failed before it started
        return
    left = sorted(shm_segments() - session.config.stash[_SHM_AT_START] - shm_segments_in_use())
    for name in left:
        Path("/dev/shm", name).unlink(missing_ok=True)
    if left:
        session.config.get_terminal_writer().line(f"FAILED: /dev/shm segments left behind by this run: {left}", red=True)
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


def shm_segments_in_use() -> set[str]:
    """Names under ``/dev/shm`` that some process maps (from ``/proc/<pid>/maps``; psutil's ``memory_maps`` reads the
    larger ``smaps`` of every process, far slower for this one question)."""
    used = set()
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            text = maps.read_text()
        except OSError:
            continue
        used.update(line.rsplit("/dev/shm/", 1)[1].split(" (deleted)")[0] for line in text.splitlines()
                    if "/dev/shm/" in line)
    return used


_SHM_AT_START = pytest.StashKey[set]()

SHM_PREFIXES = ("deepspeed_allreduce_buffer_", "nccl-", "torch_")
"""``/dev/shm`` names that a job of this project can create: DeepSpeed's CPU all-reduce buffers, NCCL's SHM transport
segments, torch's shared tensors."""


def shm_segments() -> set[str]:
    """Names in ``/dev/shm`` that a job could have left (:data:`SHM_PREFIXES`); empty where there is no /dev/shm."""
    try:
        return {n for n in os.listdir("/dev/shm") if n.startswith(SHM_PREFIXES)}
    except OSError:
        return set()


@pytest.fixture(autouse=True)
def _python_path(monkeypatch):
    """Run tools from this interpreter's venv even when PATH does not name it."""
    monkeypatch.setenv("PATH", f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")


@pytest.fixture
def run_env(tmp_path: Path, no_leftovers: None) -> dict[str, str]:
    """Environment of a launch: TMPDIR under the test's tmp dir, DeepSpeed's JIT cache under build/; the launch is
    checked by ``no_leftovers`` (its processes; the run's /dev/shm segments by ``pytest_sessionfinish``)."""
    env = dict(os.environ)
    tmpdir = tmp_path / "tmp"
    tmpdir.mkdir()
    ext_dir = ROOT / "build" / "torch_extensions"
    ext_dir.mkdir(parents=True, exist_ok=True)
    env.update(TMPDIR=str(tmpdir), TORCH_EXTENSIONS_DIR=str(ext_dir), PYTHONUNBUFFERED="1")
    return env
