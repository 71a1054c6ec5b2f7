"""Fault injection into a lab (each one a real kernel state, not a simulation) and fault timing.

:class:`FaultsMixin` gives :class:`helpers.netlab.Lab` its fault methods (``lab.set_mtu``,
``lab.add_decoy``, ``lab.rename_data_iface``, ``lab.cut_link`` / ``lab.restore_link``,
``lab.kill_node``, ``lab.rate_limit``, ``lab.set_sysctl`` / ``lab.get_sysctl``, ``lab.set_host_entry``,
``lab.throttle_cpu``): MN2-MN4, PF-netns-nodes; a node whose CPU share is capped (issue 22: the straggler score).

:func:`inject_when` fires a fault while a job runs, at the moment one of its ranks prints a
line matching a pattern (e.g. chapter 06 pulls a cable once the ranks are at ``step 3``); :func:`inject_when_joined`
once a node's ranks of a job across nodes have joined.
Nothing runs at import.
"""

from __future__ import annotations

import ipaddress
import os
import re
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any

from helpers import jobs, procs
from helpers.jobdir import JobDir

SIDES = ("node", "bridge")
_IFNAME_RX = re.compile(r"[A-Za-z0-9_.-]{1,15}")
_SYSCTL_RX = re.compile(r"net\.[A-Za-z0-9_.\-]+")
DECOY_NET = ipaddress.ip_network("172.17.0.0/16")  # Docker's default bridge network: where decoys live
DATA_IFACE = "eth0"  # every node's lab interface (a veth end) until renamed


class FaultsMixin:
    """The fault methods of :class:`helpers.netlab.Lab` (see the module docstring)."""

    if TYPE_CHECKING:  # provided by Lab
        nodes: int
        switch_ns: str

        def ns(self, node: int | str) -> str: ...
        def hostname(self, node: int | str) -> str: ...
        def port_name(self, node: int | str) -> str: ...
        def index(self, node: int | str) -> int: ...
        def data_iface(self, node: int | str) -> str: ...
        def node_pids(self, node: int | str) -> list[int]: ...
        def hosts_file(self, node: int | str) -> Path: ...
        def _nodes_arg(self, node: int | str) -> list[int]: ...
        def _ip_batch(self, ns: str, cmds: Sequence[str]) -> None: ...
        def _nsexec(self, ns: str, argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]: ...
        def _host_path(self, path: Path) -> Path: ...

    def set_mtu(self, node: int | str, mtu: int, side: str = "node") -> None:
        """Set the MTU of ``node``'s lab link (MN4).

        Args:
            node: index, hostname, or ``"all"``.
            mtu: bytes, 576..65535.
            side: ``"node"``: the node's own interface (``eth0``: what the node claims);
                ``"bridge"``: the veth end on the bridge (``pI``), i.e. the switch port; the bridge
                device follows the smallest port MTU by itself (kernel auto-adjust).
                The black hole (PF-mtu-blackhole) needs BOTH endpoints at 9000 while the bridge
                side stays at 1500 (the default): ``set_mtu("all", 9000)``.

        Raises:
            ValueError: bad node, mtu or side.
        """
        if isinstance(mtu, bool) or not isinstance(mtu, int) or not 576 <= mtu <= 65535:
            raise ValueError(f"mtu={mtu!r}: must be an integer in 576..65535 bytes")
        if side not in SIDES:
            raise ValueError(f"side={side!r}: accepted values are {', '.join(SIDES)}")
        for i in self._nodes_arg(node):
            if side == "node":
                self._ip_batch(self.ns(i), [f"link set dev {self.data_iface(i)} mtu {mtu}"])
            else:
                self._ip_batch(self.switch_ns, [f"link set dev {self.port_name(i)} mtu {mtu}"])

    def add_decoy(self, node: int | str = "all", name: str = "docker0", addr: str = "172.17.0.1/16") -> None:
        """Add an empty bridge ``name`` with ``addr`` on ``node`` (or ``"all"``): a docker0-like decoy NIC (MN2).

        An empty bridge has no carrier and leads nowhere; with the same address on every node,
        a peer that connects to it reaches itself (gloo: ``Connection refused``).  This kernel has
        no ``dummy`` driver, hence a bridge (PF-wrong-nic).

        Raises:
            ValueError: bad node, interface name, or an address outside 172.17.0.0/16.
        """
        if not isinstance(name, str) or not _IFNAME_RX.fullmatch(name) or name in (DATA_IFACE, "lo"):
            raise ValueError(f"name={name!r}: an interface name of 1-15 letters, digits, '_', '.', '-' "
                             f"(not {DATA_IFACE} or lo)")
        try:
            iface = ipaddress.ip_interface(addr)
        except ValueError:
            raise ValueError(f"addr={addr!r}: not an address/prefix such as 172.17.0.1/16") from None
        if iface.version != 4 or iface.ip not in DECOY_NET or iface.network.prefixlen < DECOY_NET.prefixlen:
            raise ValueError(f"addr={addr!r}: the decoy must stay inside {DECOY_NET}")
        for i in self._nodes_arg(node):
            self._ip_batch(self.ns(i), [f"link add {name} type bridge", f"addr add {iface} dev {name}",
                                        f"link set {name} up"])

    def rename_data_iface(self, node: int | str, new_name: str) -> None:
        """Rename ``node``'s lab interface (e.g. ``ibp65s0`` on node0, ``ibp161s0`` on node1), keeping its address.

        Reproduces "the interface name differs between nodes" (Gilbreth 4.2): an
        ``*_SOCKET_IFNAME`` naming one node's interface does not exist on the other.

        Raises:
            ValueError: bad node or interface name.
        """
        if not isinstance(new_name, str) or not _IFNAME_RX.fullmatch(new_name) or new_name == "lo":
            raise ValueError(f"new_name={new_name!r}: an interface name of 1-15 letters, digits, '_', '.', '-'")
        i = self.index(node)
        old = self.data_iface(i)
        if old == new_name:
            return
        self._ip_batch(self.ns(i), [f"link set dev {old} down", f"link set dev {old} name {new_name}",
                                    f"link set dev {new_name} up"])

    def cut_link(self, node: int | str) -> None:
        """Pull ``node``'s cable: its switch port (``pI``) goes down; the node sees no carrier."""
        for i in self._nodes_arg(node):
            self._ip_batch(self.switch_ns, [f"link set dev {self.port_name(i)} down"])

    def restore_link(self, node: int | str) -> None:
        """Plug ``node``'s cable back (its switch port up)."""
        for i in self._nodes_arg(node):
            self._ip_batch(self.switch_ns, [f"link set dev {self.port_name(i)} up"])

    def rate_limit(self, node: int | str, rate_mbit: float | None) -> None:
        """Cap ``node``'s switch port (``pI``, traffic towards the node) at ``rate_mbit`` Mb/s with a ``tc`` tbf; ``None`` removes it.

        A slow node or a throttled link (issue 11: one node's link rate-limited to a tenth): every
        pair with that node is slow, pairs without it are not.

        Raises:
            ValueError: bad node, or a rate that is not a number > 0.
        """
        if rate_mbit is not None and (isinstance(rate_mbit, bool) or not isinstance(rate_mbit, (int, float))
                                      or not rate_mbit > 0):
            raise ValueError(f"rate_mbit={rate_mbit!r}: a rate in Mb/s > 0, or None to remove the limit")
        for i in self._nodes_arg(node):
            port = self.port_name(i)
            self._nsexec(self.switch_ns, ["tc", "qdisc", "del", "dev", port, "root"], check=False)
            if rate_mbit is not None:
                self._nsexec(self.switch_ns, ["tc", "qdisc", "add", "dev", port, "root", "tbf", "rate",
                                              f"{rate_mbit}mbit", "burst", "64kb", "latency", "100ms"])

    def throttle_cpu(self, node: int | str, fraction: float | None) -> str:
        """Cap the CPU time of ``node``'s processes at ``fraction`` of one CPU (CFS bandwidth control); ``None`` lifts it.

        The node's processes (its ``slurmd`` among them: job steps fork from it and stay in its cgroup, the lab's SLURM
        uses ``proctrack/linuxproc``) move into a cgroup of their own with ``cpu.max = "<fraction x 100000> 100000"``
        (cgroup v2), or ``cpu.cfs_quota_us`` / ``cpu.cfs_period_us`` where the cpu controller is still on cgroup v1
        (this machine's hybrid layout): the same kernel mechanism, https://docs.kernel.org/scheduler/sched-bwc.html.
        :meth:`down` removes the cgroup (:func:`remove_cpu_cgroups`).

        Returns:
            The cgroup's path.

        Raises:
            ValueError: a fraction that is not a number in (0, 1].
            RuntimeError: a rootless lab, or no writable cpu controller (names the paths tried).
        """
        if fraction is not None and (isinstance(fraction, bool) or not isinstance(fraction, (int, float))
                                     or not 0 < fraction <= 1):
            raise ValueError(f"fraction={fraction!r}: a share of one CPU in (0, 1], or None to lift the cap")
        if getattr(self, "rootless", False):
            raise RuntimeError("throttle_cpu needs a root lab: cgroups are the host's")
        path = cpu_cgroup_path(self.name, self._member(node))
        pids = self.node_pids(node)
        if fraction is None:
            remove_cpu_cgroups(self.name, only=path)
            return str(path)
        path.mkdir(exist_ok=True)
        period = 100_000
        quota = max(1000, int(fraction * period))
        if (path / "cpu.max").exists():
            (path / "cpu.max").write_text(f"{quota} {period}\n")
        else:
            (path / "cpu.cfs_period_us").write_text(f"{period}\n")
            (path / "cpu.cfs_quota_us").write_text(f"{quota}\n")
        for pid in pids:
            try:
                (path / "cgroup.procs").write_text(f"{pid}\n")
            except ProcessLookupError:
                pass
        return str(path)

    def rate_limit_link(self, a: int | str, b: int | str, rate_mbit: float) -> None:
        """Cap the traffic between ``a`` and ``b`` only at ``rate_mbit`` Mb/s, both ways: a slow link, not a slow node.

        On each of the two switch ports an ``htb`` root (default class unlimited, 10 Gb/s) and a class at
        ``rate_mbit`` that a ``u32`` filter on the other node's source address selects; ``rate_limit(node, None)``
        removes it.  Every other pair keeps its full rate (issue 23: the localisation's link fault).

        Raises:
            ValueError: bad or equal nodes, or a rate that is not a number > 0.
        """
        if isinstance(rate_mbit, bool) or not isinstance(rate_mbit, (int, float)) or not rate_mbit > 0:
            raise ValueError(f"rate_mbit={rate_mbit!r}: a rate in Mb/s > 0")
        ia, ib = self.index(a), self.index(b)
        if ia == ib:
            raise ValueError(f"a={a!r}, b={b!r}: a link needs two different nodes")
        for here, peer in ((ia, ib), (ib, ia)):
            port, cls = self.port_name(here), f"1:{100 + peer}"
            self._nsexec(self.switch_ns, ["tc", "qdisc", "add", "dev", port, "root", "handle", "1:", "htb", "default", "1"],
                         check=False)  # already there when the node has another slow link
            self._nsexec(self.switch_ns, ["tc", "class", "replace", "dev", port, "parent", "1:", "classid", "1:1", "htb",
                                          "rate", "10gbit"])
            self._nsexec(self.switch_ns, ["tc", "class", "replace", "dev", port, "parent", "1:", "classid", cls, "htb",
                                          "rate", f"{rate_mbit}mbit", "ceil", f"{rate_mbit}mbit", "burst", "64kb"])
            self._nsexec(self.switch_ns, ["tc", "filter", "add", "dev", port, "parent", "1:", "protocol", "ip", "prio", "1",
                                          "u32", "match", "ip", "src", f"{self.address(peer)}/32", "flowid", cls])

    def kill_node(self, node: int | str, sig: int = signal.SIGKILL) -> list[int]:
        """Kill every process in ``node``'s network namespace with ``sig`` (a node crash); return their pids."""
        pids = []
        for i in self._nodes_arg(node):
            pids += self.node_pids(i)
        for pid in pids:
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                pass
        procs.wait_gone([p for p in (procs.process_or_none(pid) for pid in pids) if p], timeout_s=2.0)
        return pids

    def set_sysctl(self, node: int | str, key: str, value: str | int) -> str:
        """Set a ``net.*`` sysctl inside ``node`` only (e.g. ``net.ipv4.tcp_mtu_probing``); return the old value.

        Only ``net.*`` keys: they are per network namespace, so the host keeps its own value.

        Raises:
            ValueError: a key outside ``net.*`` or with ``..``; RuntimeError: the kernel refused it.
        """
        if not isinstance(key, str) or not _SYSCTL_RX.fullmatch(key) or ".." in key:
            raise ValueError(f"key={key!r}: only per-namespace net.* sysctls, e.g. net.ipv4.tcp_mtu_probing")
        path = "/proc/sys/" + key.replace(".", "/")
        old = ""
        for i in self._nodes_arg(node):
            proc = self._nsexec(self.ns(i), ["sh", "-c", 'cat "$0" && printf "%s\\n" "$1" > "$0"', path, str(value)],
                                check=False)
            if proc.returncode != 0:
                raise RuntimeError(f"node {self.hostname(i)}: cannot set {key}={value}: {proc.stderr.strip()}")
            old = proc.stdout.strip()
        return old

    def get_sysctl(self, node: int | str, key: str) -> str:
        """Read a ``net.*`` sysctl inside ``node``.

        Raises:
            ValueError: a key outside ``net.*``.
        """
        if not isinstance(key, str) or not _SYSCTL_RX.fullmatch(key) or ".." in key:
            raise ValueError(f"key={key!r}: only per-namespace net.* sysctls")
        return self._nsexec(self.ns(node), ["cat", "/proc/sys/" + key.replace(".", "/")]).stdout.strip()

    def set_host_entry(self, node: int | str, host: str, addr: str | None) -> None:
        """Make ``host`` resolve to ``addr`` in ``node``'s ``/etc/hosts`` only (``None`` removes it).

        A stale or hand-edited ``/etc/hosts`` on one node: ``MASTER_ADDR`` then names a different
        machine there than on the others.  The file is rewritten in place (a bind mount follows
        the inode, so it must not be replaced).

        Raises:
            ValueError: bad node, host name, or address.
        """
        if not isinstance(host, str) or not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9.-]{0,62}", host):
            raise ValueError(f"host={host!r}: not a host name")
        if addr is not None:
            try:
                ipaddress.ip_address(addr)
            except ValueError:
                raise ValueError(f"addr={addr!r}: not an IP address") from None
        for i in self._nodes_arg(node):
            path = self._host_path(self.hosts_file(i))
            lines = [ln for ln in path.read_text().splitlines() if host not in ln.split()[1:]]
            if addr is not None:
                lines.append(f"{addr}\t{host}")
            with open(path, "r+") as fh:  # in place: same inode
                fh.seek(0)
                fh.write("\n".join(lines) + "\n")
                fh.truncate()


# --------------------------------------------------------------------------- faults at a point of a running job

CGROUP_ROOTS = (Path("/sys/fs/cgroup"), Path("/sys/fs/cgroup/cpu"))
"""Where a cpu controller may live: the cgroup v2 root (``cpu`` in its ``cgroup.controllers``), or v1's ``cpu``."""


def _cpu_root() -> Path:
    v2 = CGROUP_ROOTS[0] / "cgroup.controllers"
    if v2.exists() and "cpu" in v2.read_text().split():
        return CGROUP_ROOTS[0]
    if (CGROUP_ROOTS[1] / "cpu.cfs_quota_us").exists():
        return CGROUP_ROOTS[1]
    raise RuntimeError(f"no cpu controller found (tried {v2} and {CGROUP_ROOTS[1]}/cpu.cfs_quota_us)")


def cpu_cgroup_path(lab: str, node: str) -> Path:
    """The cgroup :meth:`FaultsMixin.throttle_cpu` makes for ``node`` of lab ``lab``: ``<cpu root>/runbook-lab-<lab>-<node>``."""
    return _cpu_root() / f"runbook-lab-{lab}-{node}"


def cpu_cgroups(lab: str) -> list[Path]:
    """The throttling cgroups of lab ``lab`` that exist ([] when none, or no cpu controller)."""
    try:
        root = _cpu_root()
    except RuntimeError:
        return []
    return sorted(root.glob(f"runbook-lab-{lab}-*"))


def remove_cpu_cgroups(lab: str, only: Path | None = None) -> list[str]:
    """Move the processes of lab ``lab``'s throttling cgroups back to the root cgroup and remove the cgroups.

    Returns:
        The paths removed.
    """
    removed = []
    for path in cpu_cgroups(lab):
        if only is not None and path != only:
            continue
        root = path.parent
        for _ in range(3):
            try:
                pids = [p for p in (path / "cgroup.procs").read_text().split() if p]
            except OSError:
                pids = []
            for pid in pids:
                try:
                    (root / "cgroup.procs").write_text(f"{pid}\n")
                except OSError:
                    pass
            try:
                path.rmdir()
                removed.append(str(path))
                break
            except OSError:
                time.sleep(0.1)
    return removed


def _job_dirs(name: str) -> set[Path]:
    """Job directories of jobs named ``name`` (the layout of :func:`helpers.jobs.new_job_dir`; the one place to change)."""
    return {p for p in (jobs.build_dir() / "jobs").glob(f"{name}-*") if p.is_dir()}


def _rank_logs(job_dir: Path) -> list[Path]:
    """The per-rank stdout files the rank shim writes (:meth:`helpers.jobdir.JobDir.rank_stdouts`)."""
    return JobDir(job_dir).rank_stdouts()


class FaultWatch:
    """A running :func:`inject_when`: a thread that fires ``fault`` once, when a rank prints ``pattern``.

    Attributes:
        fired_at: ``time.time()`` just before the fault was called (None: never fired).
        line: the rank's line that matched (None: never fired).
        error: the exception the fault raised, if any (re-raised by :meth:`stop`).
        job_dir: the job directory being watched (None until it appears, for a job name).
    """

    def __init__(self, job_or_dir: str | os.PathLike[str], pattern: str, fault: Callable[[], Any],
                 timeout_s: float, poll_s: float = 0.05) -> None:
        self._name: str | None = None
        self.job_dir: Path | None = None
        if isinstance(job_or_dir, str) and re.fullmatch(r"[A-Za-z0-9_.-]+", job_or_dir):
            self._name = job_or_dir
            self._old = _job_dirs(job_or_dir)
        elif isinstance(job_or_dir, (str, os.PathLike)):
            self.job_dir = Path(job_or_dir)
        else:
            raise ValueError(f"job_or_dir={job_or_dir!r}: give a job name (letters, digits, '.', '_', '-') "
                             "or a job directory")
        if not callable(fault):
            raise ValueError(f"fault={fault!r}: give a callable taking no arguments (e.g. lambda: lab.cut_link(1))")
        if isinstance(timeout_s, bool) or not isinstance(timeout_s, (int, float)) or not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s!r}: must be a positive number of seconds")
        self.pattern = re.compile(pattern)
        self.fault = fault
        self.timeout_s = float(timeout_s)
        self.poll_s = poll_s
        self.fired_at: float | None = None
        self.line: str | None = None
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._offsets: dict[Path, int] = {}
        self._thread = threading.Thread(target=self._watch, name="netlab-inject-when", daemon=True)
        self._thread.start()

    def _find_job_dir(self) -> Path | None:
        if self.job_dir is None and self._name is not None:
            new = sorted(_job_dirs(self._name) - self._old, key=lambda p: p.stat().st_mtime)
            self.job_dir = new[0] if new else None
        return self.job_dir

    def _new_lines(self) -> list[str]:
        """Complete lines appended to the rank logs since the last call."""
        job_dir = self._find_job_dir()
        lines: list[str] = []
        for path in _rank_logs(job_dir) if job_dir else []:
            try:
                with open(path, "rb") as fh:
                    fh.seek(self._offsets.get(path, 0))
                    chunk = fh.read()
            except OSError:
                continue
            end = chunk.rfind(b"\n") + 1  # a half-written line waits for the next poll
            self._offsets[path] = self._offsets.get(path, 0) + end
            lines += chunk[:end].decode(errors="replace").splitlines()
        return lines

    def _watch(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while not self._stop.is_set() and time.monotonic() < deadline:
            hit = next((ln for ln in self._new_lines() if self.pattern.search(ln)), None)
            if hit is not None:
                self.line, self.fired_at = hit, time.time()
                try:
                    self.fault()
                except BaseException as exc:  # handed to the caller by stop()
                    self.error = exc
                return
            self._stop.wait(self.poll_s)

    @property
    def fired(self) -> bool:
        """True once the fault has been called."""
        return self.fired_at is not None

    def stop(self) -> "FaultWatch":
        """Stop watching (a fault being injected finishes first); return ``self``.

        Raises:
            Exception: whatever the fault raised.
        """
        self._stop.set()
        self._thread.join()
        if self.error is not None:
            raise self.error
        return self

    def __enter__(self) -> "FaultWatch":
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        self._thread.join()
        if exc_type is None and self.error is not None:
            raise self.error


def inject_when_joined(job_dir: str | os.PathLike[str], node: str, nproc: int, fault: Callable[[], Any],
                       timeout_s: float = 300.0) -> threading.Event:
    """Fire ``fault()`` once every rank of ``node`` wrote its ``joined`` marker in ``job_dir`` (the job across nodes of
    :func:`helpers.allocation.across.run_job_across`: ``ranks/joined-<node>-<local_rank>``, :class:`helpers.jobdir.JobDir`).

    A CPU cap from the start would make the node miss the join deadline (torch's import alone outlasts it at a tenth
    of a CPU); capped once it joined, the node runs the job slowly: the straggler score's case (issue 22).

    Returns:
        An event: set it to stop watching (the watcher also stops after ``timeout_s`` or once it fired).
    """
    stop = threading.Event()
    jd = JobDir(job_dir)
    want = {(node, r) for r in range(nproc)}

    def watch() -> None:
        deadline = time.monotonic() + timeout_s
        while not stop.is_set() and time.monotonic() < deadline:
            if jd.ranks_dir.exists() and want <= jd.node_markers("joined"):
                fault()
                return
            time.sleep(0.2)

    threading.Thread(target=watch, name=f"inject-when-joined-{node}", daemon=True).start()
    return stop


def inject_when(job_or_dir: str | os.PathLike[str], pattern: str, fault: Callable[[], Any],
                timeout_s: float = 120.0) -> FaultWatch:
    """Call ``fault()`` once, as soon as a rank of a running job prints a line matching ``pattern``.

    Starts a watcher thread at once and returns it; start the job after this call (in the same
    thread: ``lab.launch`` blocks until the job ends), and leave the ``with`` block (or call
    :meth:`FaultWatch.stop`) when it is over::

        with netlab.inject_when("mn3-cut", r"step 3 ", lambda: lab.cut_link(1)) as watch:
            result = lab.launch(script, args, name="mn3-cut")
        watch.fired_at   # time.time() of the fault; compare with result.ranks[r].end

    Args:
        job_or_dir: a job name (the first job directory of that name created after this call
            is watched: :func:`helpers.jobs.new_job_dir` names it ``<name>-<stamp>-...``) or a
            job directory (a path).
        pattern: regular expression searched in each complete line of ``ranks/rank*.stdout``
            (what the rank shim records).
        fault: called with no arguments from the watcher thread, e.g. ``lambda: lab.kill_node(1)``.
        timeout_s: seconds to watch before giving up (the fault then never fires).

    Returns:
        The :class:`FaultWatch` (``fired_at``, ``line``, ``error``, ``job_dir``).

    Raises:
        ValueError: bad ``job_or_dir``, ``pattern`` (not a regular expression), ``fault`` or ``timeout_s``.
    """
    try:
        re.compile(pattern)
    except (re.error, TypeError) as exc:
        raise ValueError(f"pattern={pattern!r}: not a regular expression ({exc})") from None
    return FaultWatch(job_or_dir, pattern, fault, timeout_s)
