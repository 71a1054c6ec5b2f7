"""Process trees and Python stacks: py-spy for stacks, psutil for trees and kills (by tree, by session, by namespace)."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import psutil

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def find_tool(name: str) -> str | None:
    """Path of executable ``name``: next to this interpreter first (the venv's ``bin``), then ``PATH``.

    Returns ``None`` when it is found nowhere.
    """
    beside = Path(sys.executable).parent / name
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    return shutil.which(name)


def py_spy_dump(pid: int, *, native: bool = False, timeout_s: float = 10.0) -> str:
    """Return the Python stack of every thread of process ``pid``, as printed by ``py-spy dump``.

    py-spy reads the target's memory from outside (``process_vm_readv``), so it works on
    a rank stuck in a C++ collective, where in-process tools such as faulthandler would need
    the GIL or a signal handler.  Measured here: 0.02-0.04 s per process as root.  As non-root
    under Yama ``ptrace_scope=1`` the kernel refuses the attach; the message then names that
    cause and its fix (:func:`ptrace_hint`) instead of a bare failure.

    Args:
        pid: process id of a Python process.
        native: also show C/C++ frames (``--native``), e.g. ``c10d::Work::wait``.
        timeout_s: seconds to wait for py-spy before giving up.

    Returns:
        py-spy's text; on failure a one-line ``py-spy failed: ...`` message (a rank that
        exits meanwhile, or missing ptrace permission, must not break the caller).
    """
    exe = find_tool("py-spy")
    if exe is None:
        return "py-spy failed: py-spy is not installed (pip install py-spy)"
    cmd = [exe, "dump", "--pid", str(pid)]
    if native:
        cmd.append("--native")
    # Jupyter kernels export FORCE_COLOR/CLICOLOR_FORCE; py-spy then writes ANSI colours.
    env = {k: v for k, v in os.environ.items() if k not in ("FORCE_COLOR", "CLICOLOR_FORCE", "CLICOLOR")}
    env["NO_COLOR"] = "1"
    try:
        out = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False, env=env)
    except subprocess.TimeoutExpired:
        return f"py-spy failed: no answer from pid {pid} within {timeout_s} s"
    if out.returncode != 0:
        text = (out.stderr or out.stdout).strip()
        return f"py-spy failed (exit {out.returncode}): {text}{ptrace_hint(text)}"
    return _ANSI.sub("", out.stdout)


def ptrace_hint(error: str, scope_file: str = "/proc/sys/kernel/yama/ptrace_scope") -> str:
    """Cause and fix when py-spy's error is a ptrace refusal (Yama ``ptrace_scope`` >= 1), else ``""``.

    Under Yama ``ptrace_scope=1`` (Ubuntu's default) a non-root process may attach only to its
    own descendants; py-spy is a sibling of the ranks, not their ancestor, so it gets
    "Operation not permitted" (EPERM).  Source: the kernel's Yama documentation
    (https://www.kernel.org/doc/html/latest/admin-guide/LSM/Yama.html) and py-spy's README
    ("Permission denied" on Linux).

    Args:
        error: py-spy's stderr/stdout.
        scope_file: where the kernel exposes the Yama setting (a parameter for tests).
    """
    if not re.search(r"Operation not permitted|Permission denied|os error 1\b|EPERM", error):
        return ""
    try:
        scope = Path(scope_file).read_text().strip()
    except OSError:
        scope = "unknown"
    return (f" [cause: ptrace refused (kernel.yama.ptrace_scope={scope}; non-root py-spy may attach only to its own "
            "descendants); fix: run `runbook doctor` / py-spy as root or with sudo, or give py-spy CAP_SYS_PTRACE "
            "(sudo setcap cap_sys_ptrace+ep $(which py-spy)), or ask the admins for "
            "`sysctl kernel.yama.ptrace_scope=0`; in a container add --cap-add SYS_PTRACE]")


def descendants(pids: Iterable[int]) -> list[psutil.Process]:
    """The processes ``pids`` and all their living descendants (parents first)."""
    seen: dict[int, psutil.Process] = {}
    for pid in pids:
        try:
            proc = psutil.Process(pid)
            for p in [proc, *proc.children(recursive=True)]:
                seen.setdefault(p.pid, p)
        except psutil.NoSuchProcess:
            continue
    return list(seen.values())


def same_session(sid: int) -> list[psutil.Process]:
    """Every living process whose session id is ``sid`` (catches orphans re-parented to init)."""
    found = []
    for proc in psutil.process_iter():
        try:
            if os.getsid(proc.pid) == sid:
                found.append(proc)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return found


def kill_tree(root_pids: Iterable[int], *, sessions: Iterable[int] = (), grace_s: float = 2.0) -> list[int]:
    """Stop process trees: SIGTERM, wait up to ``grace_s`` seconds, then SIGKILL what is left.

    The tree is snapshotted before any signal (a dead parent's children are re-parented and
    would be lost), and every process in ``sessions`` (session ids; the runner starts each
    launcher with ``start_new_session``) is added, so grandchildren that escaped the tree
    are caught too.

    Args:
        root_pids: pids of the launcher processes.
        sessions: session ids whose members must all die.
        grace_s: seconds between SIGTERM and SIGKILL.

    Returns:
        pids that needed SIGKILL.
    """
    sessions = list(sessions)
    procs = {p.pid: p for p in descendants(root_pids)}
    for sid in sessions:
        procs.update({p.pid: p for p in same_session(sid)})
    procs.pop(os.getpid(), None)
    for proc in procs.values():
        try:
            proc.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    _, alive = psutil.wait_procs(list(procs.values()), timeout=grace_s)
    # Anything started during the grace period (a launcher restarting a worker) dies too.
    late = {p.pid: p for sid in sessions for p in same_session(sid)}
    late.update({p.pid: p for p in alive})
    late.pop(os.getpid(), None)
    for proc in late.values():
        try:
            proc.kill()
        except psutil.Error:
            pass
    psutil.wait_procs(list(late.values()), timeout=5)
    return sorted(late)


def stop_session(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """Stop ``proc`` (started with ``start_new_session=True``) politely: SIGTERM to its session, then SIGKILL.

    SIGTERM first because an ``srun``/``salloc`` cancels its step or job on it (nothing left pending
    in SLURM); SIGKILL after ``grace_s`` seconds for whatever did not stop.
    """
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def run_bounded(argv: Sequence[str], timeout_s: float, *, env: Mapping[str, str] | None = None,
                cwd: str | os.PathLike[str] | None = None) -> subprocess.CompletedProcess[str]:
    """Run ``argv`` in a session of its own, output captured, and wait at most ``timeout_s`` seconds.

    The one stop-on-timeout routine of the project (the SLURM clients and the network pre-flight use it):
    on expiry the whole session is stopped (:func:`stop_session`) and the result has returncode 124
    (``timeout(1)``'s) with ``[runbook] stopped after N s`` appended to stderr.  ``subprocess.run``'s own
    timeout kills only the child, which leaves an ``srun``'s step or a shell's children running.

    Args:
        argv: the command.
        timeout_s: seconds to wait.
        env: the whole environment of the command (default: this process's).
        cwd: its working directory (default: this process's).

    Returns:
        ``CompletedProcess`` with text ``stdout`` / ``stderr``.

    Raises:
        OSError: ``argv[0]`` cannot be started (not found, not executable).
    """
    argv = [str(a) for a in argv]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, errors="replace",
                            stdin=subprocess.DEVNULL, env=dict(env) if env is not None else None, cwd=cwd,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return subprocess.CompletedProcess(argv, proc.returncode, out, err)
    except subprocess.TimeoutExpired:
        stop_session(proc)
        out, err = proc.communicate()
        return subprocess.CompletedProcess(argv, 124, out or "", (err or "") + f"\n[runbook] stopped after {timeout_s:g} s\n")


# --------------------------------------------------------------------------- processes by namespace
# (the network lab's killer: every process inside a lab node, whatever its parent or session)

def process_or_none(pid: int) -> psutil.Process | None:
    """``psutil.Process(pid)``, or None when it is gone or not visible."""
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def wait_gone(victims: Sequence[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait up to ``timeout_s`` seconds until each process has exited (a zombie counts); return those still alive.

    Unlike ``psutil.wait_procs`` this never reaps: a caller's ``Popen`` keeps its child's real
    exit status (e.g. ``-9``).
    """
    deadline = time.monotonic() + timeout_s
    alive = list(victims)
    while alive:
        still = []
        for p in alive:
            try:
                if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                    still.append(p)
            except psutil.Error:
                pass
        alive = still
        if not alive or time.monotonic() >= deadline:
            break
        time.sleep(0.02)
    return alive


def ns_inode(path: str | os.PathLike[str]) -> int | None:
    """Inode of a namespace file (``/proc/PID/ns/net``, ``/run/netns/X``): the namespace's id; None if unreadable."""
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


def pids_in_namespaces(inodes: Mapping[str, set[int]]) -> set[int]:
    """Pids of the processes in any of the given namespaces, this process excluded.

    Args:
        inodes: namespace inodes by kind, e.g. ``{"net": {ino}, "mnt": {...}, "uts": {...}}``
            (the kinds of ``/proc/PID/ns/``).
    """
    found = set()
    me = os.getpid()
    for pid in psutil.pids():
        if pid == me:
            continue
        for kind, inos in inodes.items():
            if inos and ns_inode(f"/proc/{pid}/ns/{kind}") in inos:
                found.add(pid)
                break
    return found


def kill_in_namespaces(inodes: Mapping[str, set[int]], grace_s: float) -> list[int]:
    """SIGTERM every process in the namespaces, SIGKILL the survivors (and late arrivals) after ``grace_s`` seconds.

    Args:
        inodes: see :func:`pids_in_namespaces`.
        grace_s: seconds between SIGTERM and SIGKILL.

    Returns:
        Every pid signalled, sorted.
    """
    pids = pids_in_namespaces(inodes)
    if not pids:
        return []
    victims = [p for p in (process_or_none(pid) for pid in pids) if p]
    for p in victims:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    alive = wait_gone(victims, grace_s)
    late = alive + [p for p in (process_or_none(pid) for pid in pids_in_namespaces(inodes) - pids) if p]
    for p in late:
        try:
            p.kill()
        except psutil.Error:
            pass
    wait_gone(late, 3.0)
    return sorted(pids | {p.pid for p in late})
