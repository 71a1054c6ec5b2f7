"""Flight Recorder dump on request, for ranks started by the rank shim (``helpers.rankshim``).

Python imports ``sitecustomize`` at start-up from ``sys.path``; the shim puts this folder first on the
rank's ``PYTHONPATH`` when ``RUNBOOK_FR_DIR`` is set, so the user's script is not changed.  At start-up
it blocks ``SIGUSR2`` and starts a daemon thread that waits for it (``signal.sigwait``).  On the signal the
thread writes ``torch._C._distributed_c10d._dump_fr_trace()`` (the pickle NCCL writes on a timeout) to
``$RUNBOOK_FR_DIR/rank<RANK>`` atomically; ``rank<RANK>.ready`` (its pid) tells the runner it may signal.  A thread, not a Python signal handler: a hung rank's main
thread sits in C++ (gloo's wait) and Python handlers only run when it returns to the interpreter.
Torch's Flight Recorder must be on (``TORCH_FR_BUFFER_SIZE``, set by the runner) for the dump to hold
entries.  Stdlib only until the signal comes; a ``sitecustomize`` found later on the path still runs.
"""

from __future__ import annotations

import importlib
import os
import signal
import sys
import threading

_HERE = os.path.dirname(os.path.abspath(__file__))


def _dump(directory: str, rank: str) -> None:
    """Write this rank's Flight Recorder pickle to ``directory/rank<rank>`` (nothing if torch is not imported)."""
    if "torch" not in sys.modules:
        return
    try:
        from torch._C._distributed_c10d import _dump_fr_trace

        data = _dump_fr_trace(includeStackTraces=False)  # with stacks the first dump takes ~5 s (symbolizer)
    except Exception as exc:  # noqa: BLE001 - report and keep the rank running
        print(f"[runbook fr] rank {rank}: no Flight Recorder dump: {exc}", file=sys.stderr)
        return
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"rank{rank}")
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)


def _wait(directory: str, rank: str) -> None:
    while True:
        signal.sigwait({signal.SIGUSR2})
        _dump(directory, rank)


def _install() -> None:
    directory, rank = os.environ.get("RUNBOOK_FR_DIR"), os.environ.get("RANK") or os.environ.get("RUNBOOK_RANK")
    if not directory or rank is None or os.environ.get("RUNBOOK_FR_PID") not in (None, str(os.getpid())):
        return
    os.environ["RUNBOOK_FR_PID"] = str(os.getpid())  # child processes (data loader workers) do not dump
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGUSR2})
    threading.Thread(target=_wait, args=(directory, rank), name="runbook-fr-dump", daemon=True).start()
    try:  # the runner signals only a pid named here (SIGUSR2's default action would kill the rank)
        os.makedirs(directory, exist_ok=True)
        with open(os.path.join(directory, f"rank{rank}.ready"), "w") as fh:
            fh.write(str(os.getpid()))
    except OSError:
        pass


def _chain() -> None:
    """Run the next ``sitecustomize`` on the path, if any (this one must not hide it)."""
    mod = sys.modules.pop(__name__, None)
    saved = list(sys.path)
    sys.path[:] = [p for p in sys.path if os.path.abspath(p or ".") != _HERE]
    try:
        importlib.import_module("sitecustomize")
    except ImportError:
        pass
    finally:
        sys.path[:] = saved
        if mod is not None:
            sys.modules.setdefault(__name__, mod)


_install()
_chain()
