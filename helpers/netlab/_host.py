"""Where the lab lives: root or rootless, as one mode object (:class:`Host`).

As root the lab's namespaces, mounts and state folder are the host's own (``/run/netns``,
``/run/runbook-lab``).  Rootless, all of them live inside one user + mount + network namespace
held by a "holder" process whose last argument is ``runbook-lab-holder-<name>`` (its ``/run`` is
a private tmpfs); every system command enters it first and every path is read through
``/proc/<holder>/root``.  :class:`Host` (root) and :class:`RootlessHost` answer the same
questions (lock folder, path translation, ``nsenter`` argv, mounts, the holder, teardown), so
:class:`helpers.netlab.lab.Lab` has no ``if rootless`` branch.  Source: PF-netns-nodes,
PF-netns-rootless.

Also the probes that need no lab: :func:`lab_available`, :func:`lab_names`.  Nothing runs at import.
"""

from __future__ import annotations

import fcntl
import os
import re
import shlex
import shutil
import subprocess
from collections.abc import Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import psutil

from helpers import procs

LAB_ROOT = Path("/run/runbook-lab")
NETNS_DIR = Path("/run/netns")
HOLDER_PREFIX = "runbook-lab-holder-"
NAME_RX = re.compile(r"[a-z][a-z0-9]{0,11}")
_CMD_TIMEOUT_S = 10.0
_HOLDERS_STARTED: list[subprocess.Popen[str]] = []


def run_cmd(argv: Sequence[str], *, timeout_s: float = _CMD_TIMEOUT_S, check: bool = True,
            input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a short system command and return its ``CompletedProcess`` (text).

    Raises:
        RuntimeError: naming the command, when it fails and ``check``, times out after
            ``timeout_s`` seconds, or is not installed.
    """
    try:
        proc = subprocess.run(list(argv), capture_output=True, text=True, timeout=timeout_s, check=False,
                              input=input_text, stdin=None if input_text is not None else subprocess.DEVNULL)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError(f"`{shlex.join(argv)}` did not finish within {timeout_s:g} s") from exc
    except FileNotFoundError as exc:
        raise RuntimeError(f"`{argv[0]}` is not installed: {exc}") from exc
    if check and proc.returncode != 0:
        raise RuntimeError(f"`{shlex.join(argv)}` failed (exit {proc.returncode}): "
                           f"{(proc.stderr or proc.stdout).strip()}")
    return proc


def lab_available() -> tuple[bool, str]:
    """Whether this machine can build the lab, and why not.

    Needs iproute2's ``ip``, util-linux's ``nsenter``/``unshare``, a kernel with veth and bridge
    support, and either root (``CAP_SYS_ADMIN`` + ``CAP_NET_ADMIN``) or unprivileged user
    namespaces (rootless mode: the lab then lives inside a user + mount + network namespace of
    its own, held by a ``sleep`` loop; ``unshare --user --map-root-user --net --mount``,
    PF-netns-rootless).  Probed in a throwaway namespace, ~10 ms.  Unprivileged user namespaces
    are often disabled on HPC login nodes (``kernel.unprivileged_userns_clone=0``,
    ``user.max_user_namespaces=0``, AppArmor's ``apparmor_restrict_unprivileged_userns``).

    Returns:
        ``(True, "root: ...")`` / ``(True, "rootless: ...")`` or ``(False, reason)``, the reason
        being printable as a skip message.
    """
    missing = [tool for tool in ("ip", "nsenter", "unshare") if shutil.which(tool) is None]
    if missing:
        return False, f"missing tools: {', '.join(missing)} (apt-get install iproute2 util-linux)"
    probe_net = "ip link add rbprobe0 type bridge && ip link add rbprobe1 type veth peer name rbprobe2"
    if os.geteuid() != 0:
        probe = run_cmd(["unshare", "--user", "--map-root-user", "--net", "--mount", "sh", "-c", probe_net], check=False)
        if probe.returncode != 0:
            return False, (f"not root (euid {os.geteuid()}) and unprivileged user namespaces do not work here "
                           f"({probe.stderr.strip() or 'exit ' + str(probe.returncode)}; common on HPC login nodes): "
                           "run as root, or enable them (sysctl user.max_user_namespaces / "
                           "kernel.unprivileged_userns_clone)")
        return True, "rootless: unprivileged user namespaces work (unshare --user --map-root-user --net --mount)"
    probe = run_cmd(["unshare", "--net", "sh", "-c", probe_net], check=False)
    if probe.returncode != 0:
        return False, f"cannot create a bridge and a veth pair in a network namespace: {probe.stderr.strip()}"
    return True, "root: ip, nsenter, unshare present; veth+bridge OK"


def lab_names() -> list[str]:
    """Names of the labs of this user on this machine.

    As root: from ``ip netns list`` and ``/run/runbook-lab``; rootless: from the holder processes.
    """
    if os.geteuid() != 0:
        return sorted({h[len(HOLDER_PREFIX):] for h in holders()})
    names = set()
    for ns in netns_list():
        m = re.fullmatch(r"([a-z][a-z0-9]{0,11})-(sw|node\d+)", ns)
        if m:
            names.add(m.group(1))
    if LAB_ROOT.is_dir():
        names.update(p.name for p in LAB_ROOT.iterdir() if p.is_dir() and NAME_RX.fullmatch(p.name))
    return sorted(names)


def holders() -> dict[str, int]:
    """Rootless labs of this user: holder marker (``runbook-lab-holder-<name>``) -> pid."""
    found = {}
    for proc in psutil.process_iter(["cmdline", "uids"]):
        try:
            cmd = proc.info["cmdline"] or []
            if (cmd and cmd[-1].startswith(HOLDER_PREFIX) and proc.info["uids"].real == os.getuid()
                    and proc.status() != psutil.STATUS_ZOMBIE):
                found[cmd[-1]] = proc.pid
        except psutil.Error:
            continue
    return found


def netns_list(netns_dir: Path = NETNS_DIR) -> list[str]:
    """Names of the persistent network namespaces (the entries of ``/run/netns``)."""
    try:
        return sorted(p.name for p in netns_dir.iterdir())
    except (FileNotFoundError, PermissionError):
        return []


def mounts_under(path: Path, mountinfo: str = "/proc/self/mountinfo") -> list[str]:
    """Mount points at or below ``path`` in a mount namespace (this one by default), deepest first."""
    prefix = str(path)
    found = []
    try:
        with open(mountinfo) as fh:
            lines = fh.readlines()
    except OSError:
        return []
    for line in lines:
        target = line.split()[4].replace("\\040", " ")
        if target == prefix or target.startswith(prefix + "/"):
            found.append(target)
    return sorted(set(found), key=lambda t: (-t.count("/"), t))


def host_for(name: str) -> "Host":
    """The mode object for lab ``name``: :class:`Host` as root, :class:`RootlessHost` otherwise."""
    return Host(name) if os.geteuid() == 0 else RootlessHost(name)


class Host:
    """Root mode: the lab's namespaces, mounts and files are the host's own; nothing to translate.

    Args:
        name: the lab name (already validated by :class:`helpers.netlab.lab.Lab`).
    """

    mode = "root"
    lock_dir = LAB_ROOT

    def __init__(self, name: str) -> None:
        self.name = name

    @contextmanager
    def lock(self) -> Iterator[None]:
        """One lock for every lab of this user: up/down are short (~0.1 s), and one file does not pile up."""
        self.lock_dir.mkdir(parents=True, exist_ok=True)
        with open(self.lock_dir / ".lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def ready(self) -> bool:
        """Whether system commands can reach the lab's side now (always, as root)."""
        return True

    def holder_pid(self) -> int | None:
        """Pid of the rootless holder process (None as root)."""
        return None

    def path(self, path: Path) -> Path:
        """``path`` of the lab's side (``/run/...``) as this process can open it."""
        return path

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run where the lab lives (as is, as root)."""
        return list(argv)

    def mounts(self, path: Path) -> list[str]:
        """Mount points at or below ``path`` on the lab's side, deepest first."""
        return mounts_under(path)

    def netns(self) -> list[str]:
        """Names of the network namespaces on the lab's side."""
        return netns_list(self.path(NETNS_DIR))

    def pin(self) -> list[str]:
        """A CPU-pinning prefix for namespace creation ([] as root; see :meth:`RootlessHost.pin`)."""
        return []

    def enter_argv(self, net: Path, uts: Path, mnt: Path) -> list[str]:
        """``nsenter`` prefix entering a node's network, UTS and mount namespaces (paths of the lab's side).

        Raises:
            RuntimeError: rootless lab not up (no holder).
        """
        return ["nsenter", f"--net={net}", f"--uts={uts}", f"--mount={mnt}", "--"]

    def start(self) -> None:
        """Prepare the place for a new lab (nothing as root; rootless: start the holder)."""

    def teardown(self, state_dir: Path, namespaces: Sequence[str]) -> None:
        """Remove the lab's mounts, network namespaces and state folder (its processes are already dead)."""
        for target in self.mounts(state_dir):
            run_cmd(["umount", "-l", target], check=False)
        if namespaces:
            run_cmd(["ip", "-force", "-batch", "-"], input_text="".join(f"netns del {n}\n" for n in namespaces),
                    check=False)
        shutil.rmtree(state_dir, ignore_errors=True)

    def leftovers(self) -> list[str]:
        """What of the mode itself remains ([] as root; rootless: the holder)."""
        return []


class RootlessHost(Host):
    """Rootless mode: everything lives inside the holder's user + mount + network namespaces.

    The holder is ``unshare --user --map-root-user --mount --net sh -c '... sleep loop'
    runbook-lab-holder-<name>``, with a private tmpfs on ``/run``; it is found again by that
    last argument, so another process can attach to the lab.
    """

    mode = "rootless"

    def __init__(self, name: str) -> None:
        super().__init__(name)
        self.lock_dir = Path(f"/tmp/runbook-lab-{os.getuid()}")
        self._holder: int | None = None

    @property
    def marker(self) -> str:
        """The last argument of the holder process (how it is found again)."""
        return HOLDER_PREFIX + self.name

    def holder_pid(self) -> int | None:
        """Pid of the process holding the lab's user/mount/net namespaces (None if absent)."""
        if self._holder is not None:
            try:
                proc = psutil.Process(self._holder)
                if proc.cmdline()[-1:] == [self.marker] and proc.status() != psutil.STATUS_ZOMBIE:
                    return self._holder
            except (psutil.Error, IndexError):
                pass
        self._holder = holders().get(self.marker)
        return self._holder

    def ready(self) -> bool:
        """Whether the holder is alive (system commands have somewhere to run)."""
        return self.holder_pid() is not None

    def _need_holder(self) -> int:
        holder = self.holder_pid()
        if holder is None:
            raise RuntimeError(f"rootless lab {self.name!r} is not up (no holder process): call up() first")
        return holder

    def path(self, path: Path) -> Path:
        """``path`` of the lab's side seen through ``/proc/<holder>/root`` (a path that cannot exist without a holder)."""
        holder = self.holder_pid()
        base = Path(f"/proc/{holder}/root") if holder else Path("/nonexistent-runbook-lab")
        return base / path.relative_to("/")

    def argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run inside the holder's user, mount and network namespaces.

        Raises:
            RuntimeError: the holder is gone.
        """
        return ["nsenter", "-t", str(self._need_holder()), "-U", "-m", "-n", "--preserve-credentials", "--", *argv]

    def mounts(self, path: Path) -> list[str]:
        """Mount points at or below ``path`` in the holder's mount namespace ([] without a holder)."""
        holder = self.holder_pid()
        return mounts_under(path, f"/proc/{holder}/mountinfo") if holder else []

    def pin(self) -> list[str]:
        """``taskset -c CPU`` so that the holder and every node namespace are created on one CPU.

        Binding a mount-namespace file is refused (EINVAL, the kernel's loop check) unless the bound
        namespace is newer than the binder's; namespace ids come in per-CPU batches, so a node
        namespace created on another CPU than the holder's can look older.  Measured here (kernel
        6.18, 2 CPUs): unpinned, ~1 in 3 binds failed; pinned, 12 of 12 passed.
        """
        if not shutil.which("taskset"):
            return []
        return ["taskset", "-c", str(min(os.sched_getaffinity(0)))]

    def enter_argv(self, net: Path, uts: Path, mnt: Path) -> list[str]:
        """The holder's user namespace first, then the node's namespaces (paths via ``/proc/<holder>/root``)."""
        holder = self._need_holder()
        return ["nsenter", f"--user=/proc/{holder}/ns/user", "--preserve-credentials", f"--net={self.path(net)}",
                f"--uts={self.path(uts)}", f"--mount={self.path(mnt)}", "--"]

    def start(self) -> None:
        """Start the holder process.

        Raises:
            RuntimeError: it did not print ``ready`` (its stderr is in the message).
        """
        script = ("mount -t tmpfs -o mode=755 runbook-lab /run && mkdir -p /run/netns && echo ready && "
                  "exec >/dev/null 2>&1 </dev/null && while :; do sleep 3600; done")
        proc = subprocess.Popen([*self.pin(), "unshare", "--user", "--map-root-user", "--mount", "--net",
                                 "--propagation", "private", "sh", "-c", script, self.marker],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, text=True,
                                start_new_session=True)
        line = proc.stdout.readline().strip() if proc.stdout else ""
        if line != "ready":
            proc.kill()
            raise RuntimeError(f"rootless lab: the holder did not start: {(proc.stderr.read() if proc.stderr else '')}")
        for pipe in (proc.stdout, proc.stderr):
            if pipe:
                pipe.close()
        _HOLDERS_STARTED.append(proc)  # keep the Popen: dropping a running one warns (ResourceWarning)
        self._holder = proc.pid

    def teardown(self, state_dir: Path, namespaces: Sequence[str]) -> None:
        """Kill the holder: its namespaces, ``/run`` tmpfs, lab namespaces and mounts all go with it."""
        holder = self.holder_pid()
        if holder:
            found = {p.pid: p for p in procs.descendants([holder]) + procs.same_session(holder)}
            found.pop(os.getpid(), None)
            victims = list(found.values())
            for p in victims:
                try:
                    p.kill()
                except psutil.Error:
                    pass
            procs.wait_gone(victims, 2.0)
        self._holder = None

    def leftovers(self) -> list[str]:
        """``["holder pid N"]`` while the holder lives."""
        holder = self.holder_pid()
        return [f"holder pid {holder}"] if holder else []
