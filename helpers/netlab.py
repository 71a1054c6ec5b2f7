"""The network lab: N "nodes" on one machine, each a network namespace behind one bridge.

Why: multi-node failure modes (MN1-MN4 in seeds/multinode.md: a node that never joins, the wrong
NIC, a dead peer, an MTU black hole) need two machines with a network between them.  Network
namespaces give each "node" its own interfaces, addresses, routes, sysctls and ports, so a
two-node ``torchrun`` on one box behaves like one on two boxes (platform-facts.md, "Network
namespaces as nodes").

Layout (``name="rb"``, 2 nodes)::

    netns rb-sw:     br0 (bridge) -- p0, p1             (veth ends, TSO/GSO off)
    netns rb-node0:  eth0 10.77.0.10/24, lo, hostname node0, /etc/hosts lists node0..nodeN
    netns rb-node1:  eth0 10.77.0.11/24, lo, hostname node1, ...

* The bridge lives in a namespace of its own: the host's network is never touched (every ``ip``
  command here runs with ``-n <lab namespace>``).
* Each node also has its own UTS namespace (hostname ``nodeI``) and mount namespace (its own
  ``/etc/hosts``, optionally a private ``/tmp``).  Both are kept by bind-mounting the namespace
  files under ``/run/runbook-lab/<name>/``, so the lab outlives the Python process that built
  it (``runbook lab up`` returns and the lab stays) and any process can enter a node with
  :meth:`Lab.node_argv`.  Never run ``hostname`` under plain ``ip netns exec``: that renames the
  real host (platform-facts.md).
* The whole state is recoverable from the system: the namespaces named ``<name>-sw`` /
  ``<name>-nodeI`` (``ip netns list``) and the folder ``/run/runbook-lab/<name>/``.
* Root, or rootless where unprivileged user namespaces work (:func:`lab_available`): rootless,
  all of the above lives inside one user + mount + network namespace held by a process whose
  last argument is ``runbook-lab-holder-<name>`` (its ``/run`` is a private tmpfs), and
  :meth:`Lab.node_argv` enters that user namespace first.  Processes in the nodes then run as
  "root" mapped to your own uid.

Fault injection (each one is a real kernel state, not a simulation): :meth:`Lab.set_mtu`,
:meth:`Lab.add_decoy`, :meth:`Lab.rename_data_iface`, :meth:`Lab.cut_link` /
:meth:`Lab.restore_link`, :meth:`Lab.kill_node`, :meth:`Lab.set_sysctl`,
:meth:`Lab.set_host_entry`.

Multi-node jobs: :meth:`Lab.torchrun_commands` builds one ``torchrun`` per node (c10d or static
rendezvous, seed D2) and :meth:`Lab.launch` runs them through :func:`helpers.jobs.run_commands`.

Needs iproute2 and util-linux; ethtool when present (a Python ioctl does the same otherwise).
Nothing runs at import.
"""

from __future__ import annotations

import argparse
import fcntl
import ipaddress
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import psutil

from helpers import jobs, procs
from helpers.launchers import DEFAULT_MASTER_PORT, positive_int, tcp_port

LAB_ROOT = Path("/run/runbook-lab")
NETNS_DIR = Path("/run/netns")
HOLDER_PREFIX = "runbook-lab-holder-"
DEFAULT_NAME = "rb"
DEFAULT_SUBNET = "10.77.0.0/24"
MAX_NODES = 4
FIRST_HOST = 10  # node I gets <subnet> + 10 + I (10.77.0.10, 10.77.0.11, ...)
BRIDGE = "br0"
DATA_IFACE = "eth0"
DECOY_NET = ipaddress.ip_network("172.17.0.0/16")  # Docker's default bridge network
FORMS = ("c10d", "static")
SIDES = ("node", "bridge")
_NAME_RX = re.compile(r"[a-z][a-z0-9]{0,11}")
_IFNAME_RX = re.compile(r"[A-Za-z0-9_.-]{1,15}")
_SYSCTL_RX = re.compile(r"net\.[A-Za-z0-9_.\-]+")
_CMD_TIMEOUT_S = 10.0
_HOLDERS_STARTED: list[subprocess.Popen[str]] = []
# TSO/GSO off on the veths: with offloads on, the MTU black hole is flaky (platform-facts.md).  Without
# ethtool, the legacy ioctls ETHTOOL_STSO/SGSO do it (they clear IPv4/IPv6 TSO and GSO; kernel 6.18's
# tx-tcp-accecn-segmentation stays on, which plain IPv4 TCP does not use).
_ETHTOOL_FALLBACK = r"""
import array, fcntl, socket, struct, sys
SIOCETHTOOL, STSO, SGSO = 0x8946, 0x1f, 0x24
s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
for dev in sys.argv[1:]:
    for cmd in (STSO, SGSO):
        buf = array.array("B", struct.pack("II", cmd, 0))
        ifr = struct.pack("16sP", dev.encode(), buf.buffer_info()[0])
        fcntl.ioctl(s.fileno(), SIOCETHTOOL, ifr)
"""


# --------------------------------------------------------------------------- availability

def _run(argv: Sequence[str], *, timeout_s: float = _CMD_TIMEOUT_S, check: bool = True,
         input_text: str | None = None) -> subprocess.CompletedProcess[str]:
    """Run a short system command; raise RuntimeError naming it when it fails and ``check``."""
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
    platform-facts.md).  Probed in a throwaway namespace, ~10 ms.  Unprivileged user namespaces
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
        probe = _run(["unshare", "--user", "--map-root-user", "--net", "--mount", "sh", "-c", probe_net], check=False)
        if probe.returncode != 0:
            return False, (f"not root (euid {os.geteuid()}) and unprivileged user namespaces do not work here "
                           f"({probe.stderr.strip() or 'exit ' + str(probe.returncode)}; common on HPC login nodes): "
                           "run as root, or enable them (sysctl user.max_user_namespaces / "
                           "kernel.unprivileged_userns_clone)")
        return True, "rootless: unprivileged user namespaces work (unshare --user --map-root-user --net --mount)"
    probe = _run(["unshare", "--net", "sh", "-c", probe_net], check=False)
    if probe.returncode != 0:
        return False, f"cannot create a bridge and a veth pair in a network namespace: {probe.stderr.strip()}"
    return True, "root: ip, nsenter, unshare present; veth+bridge OK"


def lab_names() -> list[str]:
    """Names of the labs of this user on this machine.

    As root: from ``ip netns list`` and ``/run/runbook-lab``; rootless: from the holder processes.
    """
    if os.geteuid() != 0:
        return sorted({h[len(HOLDER_PREFIX):] for h in _holders()})
    names = set()
    for ns in _netns_list():
        m = re.fullmatch(r"([a-z][a-z0-9]{0,11})-(sw|node\d+)", ns)
        if m:
            names.add(m.group(1))
    if LAB_ROOT.is_dir():
        names.update(p.name for p in LAB_ROOT.iterdir() if p.is_dir() and _NAME_RX.fullmatch(p.name))
    return sorted(names)


def _holders() -> dict[str, int]:
    """Rootless labs of this user: holder marker -> pid."""
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


def _netns_list(netns_dir: Path = NETNS_DIR) -> list[str]:
    """Names of the persistent network namespaces (the entries of ``/run/netns``)."""
    try:
        return sorted(p.name for p in netns_dir.iterdir())
    except (FileNotFoundError, PermissionError):
        return []


def _mounts_under(path: Path, mountinfo: str = "/proc/self/mountinfo") -> list[str]:
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


def _ns_inode(path: str | os.PathLike[str]) -> int | None:
    try:
        return os.stat(path).st_ino
    except OSError:
        return None


# --------------------------------------------------------------------------- the lab

class Lab:
    """A lab of ``nodes`` network-namespace nodes behind one bridge (see the module docstring).

    Args:
        nodes: number of nodes, 1..4.
        subnet: IPv4 network of the lab; node I gets host address ``10 + I`` in it.
        name: lab name (lowercase letter then up to 11 lowercase letters/digits); prefixes every
            namespace (``<name>-sw``, ``<name>-node0``...), so several labs can coexist.
        private_tmp: give each node its own tmpfs on ``/tmp`` (the project, build and venv
            folders stay visible even when they live under ``/tmp``), so that a file written to
            ``/tmp`` on one node is absent on the others (Gilbreth guide 8.12, failure mode 1).

    Raises:
        ValueError: a bad argument, naming it.

    Use as a context manager (``with Lab(2) as lab: ...``: up on enter, down on exit) or call
    :meth:`up` / :meth:`down`.  Source: platform-facts.md "Network namespaces as nodes".
    """

    def __init__(self, nodes: int = 2, subnet: str = DEFAULT_SUBNET, name: str = DEFAULT_NAME,
                 private_tmp: bool = False) -> None:
        if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= MAX_NODES:
            raise ValueError(f"nodes={nodes!r}: must be an integer in 1..{MAX_NODES}")
        if not isinstance(name, str) or not _NAME_RX.fullmatch(name):
            raise ValueError(f"name={name!r}: use a lowercase letter then up to 11 lowercase letters or digits")
        try:
            net = ipaddress.ip_network(subnet, strict=True)
        except ValueError as exc:
            raise ValueError(f"subnet={subnet!r}: not an IPv4 network in CIDR form ({exc})") from None
        if net.version != 4 or net.num_addresses < FIRST_HOST + nodes + 2:
            raise ValueError(f"subnet={subnet!r}: must be IPv4 with room for hosts .{FIRST_HOST}..."
                             f"{FIRST_HOST + nodes - 1} (a /28 or larger)")
        if net.overlaps(DECOY_NET):
            raise ValueError(f"subnet={subnet!r}: overlaps the decoy network {DECOY_NET}")
        self.nodes = nodes
        self.subnet = net
        self.name = name
        self.private_tmp = bool(private_tmp)
        self.state_dir = LAB_ROOT / name  # as seen from the lab's side (inside the holder when rootless)
        self.rootless = os.geteuid() != 0
        self._holder: int | None = None

    # ------------------------------------------------------------------ naming

    def __repr__(self) -> str:
        return f"Lab(nodes={self.nodes}, subnet={str(self.subnet)!r}, name={self.name!r}, private_tmp={self.private_tmp})"

    @property
    def switch_ns(self) -> str:
        """Name of the namespace holding the bridge (``<name>-sw``)."""
        return f"{self.name}-sw"

    def ns(self, node: int | str) -> str:
        """Network namespace name of ``node`` (``<name>-nodeI``)."""
        return f"{self.name}-node{self.index(node)}"

    @property
    def hostnames(self) -> list[str]:
        """Hostnames of the nodes, in index order: ``["node0", "node1", ...]``."""
        return [f"node{i}" for i in range(self.nodes)]

    def hostname(self, node: int | str) -> str:
        """Hostname of ``node`` (``nodeI``)."""
        return f"node{self.index(node)}"

    def address(self, node: int | str) -> str:
        """IPv4 address of ``node`` on the lab network, without prefix (``10.77.0.10`` for node 0)."""
        return str(self.subnet.network_address + FIRST_HOST + self.index(node))

    def port_name(self, node: int | str) -> str:
        """Name of ``node``'s veth end on the bridge side, in the switch namespace (``pI``)."""
        return f"p{self.index(node)}"

    def index(self, node: int | str) -> int:
        """Node index from an index, a hostname (``node1``) or a namespace name (``rb-node1``).

        Raises:
            ValueError: not a node of this lab.
        """
        if isinstance(node, bool):
            raise ValueError(f"node={node!r}: give an index 0..{self.nodes - 1} or a hostname node0..")
        match = re.fullmatch(rf"(?:{re.escape(self.name)}-)?node(\d+)", node) if isinstance(node, str) else None
        if isinstance(node, int):
            idx = node
        elif match:
            idx = int(match.group(1))
        else:
            raise ValueError(f"node={node!r}: give an index 0..{self.nodes - 1} or a hostname node0..node{self.nodes - 1}")
        if not 0 <= idx < self.nodes:
            raise ValueError(f"node={node!r}: this lab has nodes 0..{self.nodes - 1}")
        return idx

    def _nodes_arg(self, node: int | str) -> list[int]:
        return list(range(self.nodes)) if node == "all" else [self.index(node)]

    def _uts_file(self, i: int) -> Path:
        return self.state_dir / f"node{i}.uts"

    def _mnt_file(self, i: int) -> Path:
        return self.state_dir / f"node{i}.mnt"

    def hosts_file(self, node: int | str) -> Path:
        """The file bind-mounted on ``/etc/hosts`` inside ``node`` (edit it in place, never replace it)."""
        return self.state_dir / f"hosts-node{self.index(node)}"

    def hosts_text(self) -> str:
        """The ``/etc/hosts`` every node starts with: localhost, then every node's lab address."""
        lines = ["127.0.0.1\tlocalhost", f"# runbook network lab {self.name!r}: every node, by its lab address"]
        lines += [f"{self.address(i)}\t{self.hostname(i)}" for i in range(self.nodes)]
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> "Lab":
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    @contextmanager
    def _lock(self) -> Iterator[None]:
        """One lock for every lab of this user: up/down are short (~0.1 s), and one file does not pile up."""
        lock_dir = Path(f"/tmp/runbook-lab-{os.getuid()}") if self.rootless else LAB_ROOT
        lock_dir.mkdir(parents=True, exist_ok=True)
        with open(lock_dir / ".lock", "w") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    # ------------------------------------------------------------------ root or rootless

    @property
    def holder_marker(self) -> str:
        """Rootless mode: the last argument of the holder process (how it is found again)."""
        return HOLDER_PREFIX + self.name

    def holder_pid(self) -> int | None:
        """Rootless mode: pid of the process holding the lab's user/mount/net namespaces (None as root or if absent)."""
        if not self.rootless:
            return None
        if self._holder is not None:
            try:
                proc = psutil.Process(self._holder)
                if proc.cmdline()[-1:] == [self.holder_marker] and proc.status() != psutil.STATUS_ZOMBIE:
                    return self._holder
            except (psutil.Error, IndexError):
                pass
        self._holder = _holders().get(self.holder_marker)
        return self._holder

    def _host_path(self, path: Path) -> Path:
        """``path`` of the lab's side (``/run/...``) as this process can open it."""
        if not self.rootless:
            return path
        holder = self.holder_pid()
        base = Path(f"/proc/{holder}/root") if holder else Path("/nonexistent-runbook-lab")
        return base / path.relative_to("/")

    def _sys(self, argv: Sequence[str]) -> list[str]:
        """``argv`` run where the lab lives: as is (root), or inside the holder's namespaces (rootless)."""
        if not self.rootless:
            return list(argv)
        holder = self.holder_pid()
        if holder is None:
            raise RuntimeError(f"rootless lab {self.name!r}: its holder process is gone (run up() again)")
        return ["nsenter", "-t", str(holder), "-U", "-m", "-n", "--preserve-credentials", "--", *argv]

    def _netns(self) -> list[str]:
        return _netns_list(self._host_path(NETNS_DIR))

    def _mounts(self, path: Path) -> list[str]:
        if not self.rootless:
            return _mounts_under(path)
        holder = self.holder_pid()
        return _mounts_under(path, f"/proc/{holder}/mountinfo") if holder else []

    def _start_holder(self) -> None:
        """Rootless mode: start the process whose user + mount + network namespaces hold the lab."""
        script = ("mount -t tmpfs -o mode=755 runbook-lab /run && mkdir -p /run/netns && echo ready && "
                  "exec >/dev/null 2>&1 </dev/null && while :; do sleep 3600; done")
        proc = subprocess.Popen([*self._pin(), "unshare", "--user", "--map-root-user", "--mount", "--net",
                                 "--propagation", "private", "sh", "-c", script, self.holder_marker],
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

    def _pin(self) -> list[str]:
        """Rootless mode: ``taskset -c CPU`` so that the holder and every node namespace are created on one CPU.

        Binding a mount-namespace file is refused (EINVAL, the kernel's loop check) unless the bound
        namespace is newer than the binder's; namespace ids come in per-CPU batches, so a node
        namespace created on another CPU than the holder's can look older.  Measured here (kernel
        6.18, 2 CPUs): unpinned, ~1 in 3 binds failed; pinned, 12 of 12 passed.
        """
        if not self.rootless or not shutil.which("taskset"):
            return []
        return ["taskset", "-c", str(min(os.sched_getaffinity(0)))]

    def _spec(self) -> dict[str, Any]:
        return {"nodes": self.nodes, "subnet": str(self.subnet), "private_tmp": self.private_tmp,
                "shared_dirs": self._shared_dirs() if self.private_tmp else []}

    def up(self) -> "Lab":
        """Build the lab, idempotently; return ``self``.

        A complete lab with the same spec (nodes, subnet, private_tmp) is left as it is (faults
        injected into it stay); anything else carrying this lab's name (a half-built lab from a
        crashed run, or one of another size) is torn down first, then the lab is rebuilt.
        Measured here: ~0.1-0.3 s for 2-4 nodes (budget 10 s).

        Raises:
            RuntimeError: :func:`lab_available` says no (the reason is in the message), or a
                system command failed (named, with its stderr); the half-built lab is removed.
        """
        ok, why = lab_available()
        if not ok:
            raise RuntimeError(f"cannot build the network lab: {why}")
        with self._lock():
            if self._complete():
                return self
            self._down_locked()
            try:
                if self.rootless:
                    self._start_holder()
                self._build()
            except BaseException:
                self._down_locked()
                raise
        return self

    def _complete(self) -> bool:
        """True when every piece of this lab exists with the recorded spec."""
        try:
            spec = json.loads(self._host_path(self.state_dir / "lab.json").read_text())
        except (OSError, json.JSONDecodeError):
            return False
        if spec != self._spec():
            return False
        present = set(self._netns())
        wanted = {self.switch_ns, *(self.ns(i) for i in range(self.nodes))}
        extra = {n for n in present if re.fullmatch(rf"{re.escape(self.name)}-node\d+", n)} - wanted
        if not wanted <= present or extra:
            return False
        mounts = set(self._mounts(self.state_dir))
        for i in range(self.nodes):
            if not {str(self._uts_file(i)), str(self._mnt_file(i))} <= mounts:
                return False
        links = self._links(self.switch_ns)
        if BRIDGE not in links or any(self.port_name(i) not in links for i in range(self.nodes)):
            return False
        for i in range(self.nodes):
            addrs = [a for link in self._addrs(self.ns(i)) for a in link.get("addr_info", [])]
            if not any(a.get("local") == self.address(i) for a in addrs):
                return False
        return True

    def _shared_dirs(self) -> list[str]:
        """Folders under /tmp that must stay visible on a node with a private /tmp."""
        dirs = {str(jobs.project_root()), str(jobs.build_dir()), str(Path(sys.prefix).resolve())}
        tmpdir = os.environ.get("TMPDIR")
        if tmpdir:
            dirs.add(str(Path(tmpdir).resolve()))
        return sorted(d for d in dirs if d == "/tmp" or d.startswith("/tmp/"))

    def _build(self) -> None:
        self._make_state_dir()
        names = [self.switch_ns, *(self.ns(i) for i in range(self.nodes))]
        _run(self._sys(["ip", "-batch", "-"]), input_text="".join(f"netns add {n}\n" for n in names))
        for ns in names:  # no IPv6 at all: only lab-subnet (and decoy) addresses inside the lab
            self._nsexec(ns, ["sh", "-c", "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6; "
                                          "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6"], check=False)
        cmds = [f"link add {BRIDGE} type bridge", f"link set {BRIDGE} up", "link set lo up"]
        for i in range(self.nodes):
            p = self.port_name(i)
            cmds += [f"link add {p} type veth peer name {DATA_IFACE} netns {self.ns(i)}",
                     f"link set {p} master {BRIDGE}", f"link set {p} up"]
        self._ip_batch(self.switch_ns, cmds)
        for i in range(self.nodes):
            self._ip_batch(self.ns(i), ["link set lo up",
                                        f"addr add {self.address(i)}/{self.subnet.prefixlen} dev {DATA_IFACE}",
                                        f"link set {DATA_IFACE} up"])
        for i in range(self.nodes):
            self._offloads_off(self.ns(i), [DATA_IFACE])
        self._offloads_off(self.switch_ns, [self.port_name(i) for i in range(self.nodes)])
        for i in range(self.nodes):
            self._make_node_namespaces(i)
        self._host_path(self.state_dir / "lab.json").write_text(json.dumps(self._spec(), indent=1))

    def _make_state_dir(self) -> None:
        _run(self._sys(["mkdir", "-p", str(self.state_dir)]))
        # Namespace files can only be bind-mounted on a mount that is not shared (unshare(1)):
        # make the state folder a private mount of its own (a no-op for the host's other mounts).
        if str(self.state_dir) not in self._mounts(self.state_dir):
            _run(self._sys(["mount", "--bind", str(self.state_dir), str(self.state_dir)]))
        _run(self._sys(["mount", "--make-private", str(self.state_dir)]))

    def _make_node_namespaces(self, i: int) -> None:
        hosts = self.hosts_file(i)
        self._host_path(hosts).write_text(self.hosts_text())
        for f in (self._uts_file(i), self._mnt_file(i)):
            self._host_path(f).touch()
        q = shlex.quote
        script = ["set -e", f"hostname {q(self.hostname(i))}", f"mount --bind {q(str(hosts))} /etc/hosts"]
        if self.private_tmp:
            stage = self.state_dir / f"stage-node{i}"
            self._host_path(stage).mkdir(exist_ok=True)
            script += [f"mount --rbind /tmp {q(str(stage))}",
                       "mount -t tmpfs -o mode=1777,size=1g runbook-lab-tmp /tmp"]
            for d in self._shared_dirs():
                rel = os.path.relpath(d, "/tmp")
                if rel == ".":
                    continue
                script += [f"mkdir -p {q(d)}", f"mount --rbind {q(str(stage / rel))} {q(d)}"]
            script.append(f"umount -l {q(str(stage))}")
        # Hide the other nodes' namespace files inside this node (no cross references).
        script.append(f"umount -l {q(str(self.state_dir))}")
        argv = self._sys([*self._pin(), "unshare", f"--uts={self._uts_file(i)}", f"--mount={self._mnt_file(i)}",
                          "--propagation", "private", "sh", "-c", "\n".join(script)])
        for _ in range(5):  # see _pin(): a refused bind leaves nothing behind, so try a fresh namespace
            proc = _run(argv, check=False)
            if proc.returncode == 0:
                return
            if "Invalid argument" not in proc.stderr:
                break
        raise RuntimeError(f"node{i}: creating its UTS/mount namespaces failed: {proc.stderr.strip()}")

    def down(self) -> dict[str, Any]:
        """Remove everything of this lab: processes, namespaces (and so the bridge and veths), mounts, files.

        Works on whatever exists under this lab's name (also a lab built by another process or
        half-built by a crashed one).  Every process whose network, mount or UTS namespace is a
        lab namespace gets SIGTERM, then SIGKILL after 1 s.  Measured here: ~0.05-0.2 s without
        processes (budget 5 s).

        Returns:
            ``{"killed": [pids], "namespaces": [names removed], "seconds": float}``.
        """
        with self._lock():
            return self._down_locked()

    def _down_locked(self) -> dict[str, Any]:
        t0 = time.monotonic()
        namespaces = [n for n in self._netns() if re.fullmatch(rf"{re.escape(self.name)}-(sw|node\d+)", n)]
        killed = _kill_in_namespaces(self._ns_inodes(namespaces), grace_s=1.0)
        if self.rootless:
            holder = self.holder_pid()
            if holder:  # its namespaces, /run tmpfs, lab namespaces and mounts all go with it; nothing to save
                top = _proc(holder)
                found = {p.pid: p for p in ([top, *_children(top)] if top else []) + procs.same_session(holder)}
                found.pop(os.getpid(), None)
                victims = list(found.values())
                for p in victims:
                    try:
                        p.kill()
                    except psutil.Error:
                        pass
                _wait_gone(victims, 2.0)
            self._holder = None
        else:
            for target in self._mounts(self.state_dir):
                _run(["umount", "-l", target], check=False)
            if namespaces:
                _run(["ip", "-force", "-batch", "-"], input_text="".join(f"netns del {n}\n" for n in namespaces),
                     check=False)
            shutil.rmtree(self.state_dir, ignore_errors=True)
        return {"killed": killed, "namespaces": namespaces, "seconds": round(time.monotonic() - t0, 3)}

    def leftovers(self) -> list[str]:
        """Whatever of this lab still exists: namespaces, mounts, the state folder, a rootless holder ([] after down())."""
        left = [n for n in self._netns() if re.fullmatch(rf"{re.escape(self.name)}-(sw|node\d+)", n)]
        left += self._mounts(self.state_dir)
        left += [str(self.state_dir)] if self._host_path(self.state_dir).exists() else []
        left += [f"holder pid {self.holder_pid()}"] if self.holder_pid() else []
        return left

    def _ns_inodes(self, namespaces: Iterable[str]) -> dict[str, set[int]]:
        """Inodes of this lab's namespaces, by kind (``net``, ``mnt``, ``uts``)."""
        out: dict[str, set[int]] = {"net": set(), "mnt": set(), "uts": set()}
        mounts = self._mounts(self.state_dir)
        for n in namespaces:
            ino = _ns_inode(self._host_path(NETNS_DIR / n))
            if ino:
                out["net"].add(ino)
        for kind in ("mnt", "uts"):
            for f in mounts:
                if f.endswith(f".{kind}"):
                    ino = _ns_inode(self._host_path(Path(f)))
                    if ino:
                        out[kind].add(ino)
        return out

    def is_up(self) -> bool:
        """True when the lab is complete (all namespaces, links, addresses and node namespaces)."""
        return self._complete()

    @classmethod
    def attach(cls, name: str = DEFAULT_NAME) -> "Lab":
        """The :class:`Lab` object for a lab that exists on this machine (built by any process).

        Reads the spec recorded in ``/run/runbook-lab/<name>/lab.json``; without it, counts the
        ``<name>-nodeI`` namespaces.

        Raises:
            ValueError: ``name`` is invalid, or no lab of that name exists.
        """
        probe = cls(1, name=name)
        try:
            spec = json.loads(probe._host_path(probe.state_dir / "lab.json").read_text())
            return cls(spec["nodes"], spec["subnet"], name, spec["private_tmp"])
        except (OSError, json.JSONDecodeError, KeyError):
            pass
        count = len([n for n in probe._netns() if re.fullmatch(rf"{re.escape(name)}-node\d+", n)])
        if not count:
            raise ValueError(f"name={name!r}: no lab of that name on this machine (labs: {lab_names() or 'none'})")
        return cls(min(count, MAX_NODES), name=name)

    # ------------------------------------------------------------------ inspection

    def _ip_batch(self, ns: str, cmds: Sequence[str]) -> None:
        _run(self._sys(["ip", "-n", ns, "-batch", "-"]), input_text="\n".join(cmds) + "\n")

    def _nsexec(self, ns: str, argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in network namespace ``ns`` only (no UTS/mount change): for ip/ethtool/sysctl."""
        return _run(self._sys(["nsenter", f"--net={NETNS_DIR / ns}", "--", *argv]), check=check)

    def _offloads_off(self, ns: str, devs: Sequence[str]) -> None:
        if shutil.which("ethtool"):
            for dev in devs:
                self._nsexec(ns, ["ethtool", "-K", dev, "tso", "off", "gso", "off"])
        else:  # ethtool not installed: the same two legacy ioctls from Python
            self._nsexec(ns, [sys.executable, "-c", _ETHTOOL_FALLBACK, *devs])

    def _links(self, ns: str) -> dict[str, dict[str, Any]]:
        if self.rootless and not self.holder_pid():
            return {}
        proc = _run(self._sys(["ip", "-n", ns, "-j", "-d", "link", "show"]), check=False)
        try:
            return {link["ifname"]: link for link in json.loads(proc.stdout or "[]")}
        except json.JSONDecodeError:
            return {}

    def _addrs(self, ns: str) -> list[dict[str, Any]]:
        if self.rootless and not self.holder_pid():
            return []
        proc = _run(self._sys(["ip", "-n", ns, "-j", "-d", "addr", "show"]), check=False)
        try:
            return json.loads(proc.stdout or "[]")
        except json.JSONDecodeError:
            return []

    def data_iface(self, node: int | str) -> str:
        """Current name of ``node``'s lab interface (``eth0`` unless renamed): its veth end."""
        ns = self.ns(node)
        for name, link in self._links(ns).items():
            if (link.get("linkinfo") or {}).get("info_kind") == "veth":
                return name
        raise RuntimeError(f"node {self.hostname(node)}: no veth in namespace {ns} (is the lab up?)")

    def node_pids(self, node: int | str) -> list[int]:
        """Pids of the processes whose network namespace is ``node``'s."""
        ino = _ns_inode(self._host_path(NETNS_DIR / self.ns(node)))
        return sorted(_pids_in({"net": {ino}} if ino else {}))

    def status(self) -> dict[str, Any]:
        """What exists now, read from the system (works for a lab built by another process).

        Returns:
            ``{"name", "up" (complete), "subnet", "private_tmp", "switch": {"namespace", "bridge_mtu",
            "ports": {pI: {"mtu", "state"}}}, "nodes": [{"index", "namespace", "hostname", "iface",
            "address", "mtu", "state", "bridge_port": {...}, "other_ifaces": [...], "pids": int}]}``.
        """
        present = set(self._netns())
        sw_links = self._links(self.switch_ns) if self.switch_ns in present else {}
        nodes = []
        count = max([self.nodes] + [int(m.group(1)) + 1 for n in present
                                    if (m := re.fullmatch(rf"{re.escape(self.name)}-node(\d+)", n))])
        for i in range(min(count, MAX_NODES)):
            ns = f"{self.name}-node{i}"
            if ns not in present:
                continue
            entry: dict[str, Any] = {"index": i, "namespace": ns, "hostname": f"node{i}", "iface": None,
                                     "address": None, "mtu": None, "state": None, "other_ifaces": []}
            for link in self._addrs(ns):
                addrs = [f"{a['local']}/{a['prefixlen']}" for a in link.get("addr_info", [])]
                kind = (link.get("linkinfo") or {}).get("info_kind")
                if kind == "veth":
                    entry.update(iface=link["ifname"], address=addrs[0] if addrs else None, mtu=link.get("mtu"),
                                 state=link.get("operstate"))
                elif link["ifname"] != "lo":
                    entry["other_ifaces"].append({"name": link["ifname"], "kind": kind, "addresses": addrs,
                                                  "mtu": link.get("mtu"), "state": link.get("operstate")})
            port = sw_links.get(f"p{i}", {})
            entry["bridge_port"] = {"name": f"p{i}", "mtu": port.get("mtu"), "state": port.get("operstate")}
            ino = _ns_inode(self._host_path(NETNS_DIR / ns))
            entry["pids"] = len(_pids_in({"net": {ino}})) if ino else 0
            nodes.append(entry)
        return {"name": self.name, "up": self._complete(), "subnet": str(self.subnet), "private_tmp": self.private_tmp,
                "state_dir": str(self.state_dir) if self._host_path(self.state_dir).exists() else None,
                "mode": "rootless" if self.rootless else "root", "holder_pid": self.holder_pid(),
                "switch": {"namespace": self.switch_ns if self.switch_ns in present else None,
                           "bridge_mtu": sw_links.get(BRIDGE, {}).get("mtu")},
                "nodes": nodes}

    # ------------------------------------------------------------------ running things on a node

    def node_argv(self, node: int | str, argv: Sequence[str], cwd: str | os.PathLike[str] | None = None) -> list[str]:
        """The command line that runs ``argv`` inside ``node``: its network, UTS and mount namespaces.

        ``nsenter --net=/run/netns/<ns> --uts=<...> --mount=<...> -- env --chdir=<cwd> argv``
        (rootless: ``--user=/proc/<holder>/ns/user`` first, paths through ``/proc/<holder>/root``):
        the process sees the node's interfaces, hostname (``nodeI``), ``/etc/hosts`` and ``/tmp``,
        keeps the caller's environment, and can be a long-lived daemon (slurmd) as well as a
        one-shot command.  Everything it starts stays in the node.

        The working directory is entered by path *inside* the node (``env --chdir``), not
        inherited: an inherited directory lives on the host's mount, where ``os.replace`` between
        a relative and an absolute path fails with ``EXDEV`` (measured: ``nsenter --wd=.`` broke
        ``write_json_atomic`` with ``Invalid cross-device link``).

        Args:
            node: index or hostname.
            argv: the command.
            cwd: working directory inside the node (default: this process's current directory).

        Raises:
            ValueError: unknown node, or empty ``argv``.
            RuntimeError: rootless lab not up.
        """
        i = self.index(node)
        argv = [str(a) for a in argv]
        if not argv:
            raise ValueError("argv: give the command to run inside the node")
        argv = ["env", f"--chdir={os.fspath(cwd) if cwd is not None else os.getcwd()}", *argv]
        if self.rootless:  # enter the holder's user namespace first, then the node's (paths via /proc/<holder>/root)
            holder = self.holder_pid()
            if holder is None:
                raise RuntimeError(f"rootless lab {self.name!r} is not up (no holder process): call up() first")
            return ["nsenter", f"--user=/proc/{holder}/ns/user", "--preserve-credentials",
                    f"--net={self._host_path(NETNS_DIR / self.ns(i))}", f"--uts={self._host_path(self._uts_file(i))}",
                    f"--mount={self._host_path(self._mnt_file(i))}", "--", *argv]
        return ["nsenter", f"--net={NETNS_DIR / self.ns(i)}", f"--uts={self._uts_file(i)}",
                f"--mount={self._mnt_file(i)}", "--", *argv]

    def run(self, node: int | str, argv: Sequence[str], timeout_s: float = 30.0, *,
            env: Mapping[str, str | None] | None = None, input_text: str | None = None,
            cwd: str | os.PathLike[str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside ``node`` and wait, bounded; return the ``CompletedProcess`` (text stdout/stderr).

        Args:
            node: index or hostname.
            argv: the command.
            timeout_s: seconds; on expiry the whole process tree is killed and ``returncode`` is
                124 (as with ``timeout(1)``), ``stderr`` says so.
            env: variables to set (``None`` removes one) on top of this process's environment.
            input_text: text fed to stdin.
            cwd: working directory inside the node (default: the current one).
        """
        full_env = dict(os.environ)
        for key, value in (env or {}).items():
            if value is None:
                full_env.pop(key, None)
            else:
                full_env[key] = str(value)
        cmd = self.node_argv(node, argv, cwd=cwd)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=full_env,
                                stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
                                start_new_session=True)
        try:
            out, err = proc.communicate(input=input_text, timeout=timeout_s)
            rc = proc.returncode
        except subprocess.TimeoutExpired:
            procs.kill_tree([proc.pid], sessions=[proc.pid], grace_s=0.5)
            out, err = proc.communicate()
            rc = 124
            err = (err or "") + f"\n[netlab] killed after {timeout_s:g} s\n"
        return subprocess.CompletedProcess(cmd, rc, out, err)

    def runner(self) -> Callable[[str, Sequence[str], float], subprocess.CompletedProcess[str]]:
        """A ``runner(node, argv, timeout_s)`` for :func:`helpers.preflight.run_preflight` (nodes by hostname)."""
        def run(node: str, argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
            return self.run(node, argv, timeout_s)
        return run

    # ------------------------------------------------------------------ faults

    def set_mtu(self, node: int | str, mtu: int, side: str = "node") -> None:
        """Set the MTU of ``node``'s lab link (MN4).

        Args:
            node: index, hostname, or ``"all"``.
            mtu: bytes, 576..65535.
            side: ``"node"``: the node's own interface (``eth0``: what the node claims);
                ``"bridge"``: the veth end on the bridge (``pI``), i.e. the switch port; the bridge
                device follows the smallest port MTU by itself (kernel auto-adjust).
                The black hole (platform-facts.md) needs BOTH endpoints at 9000 while the bridge
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
        no ``dummy`` driver, hence a bridge (platform-facts.md).

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

        Reproduces "the interface name differs between nodes" (gilbreth-hpc-guide.md 4.2): an
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
        _wait_gone([p for p in (_proc(pid) for pid in pids) if p], timeout_s=2.0)
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

    # ------------------------------------------------------------------ multi-node torchrun

    def torchrun_commands(self, script: str | os.PathLike[str], args: Sequence[str] = (), nproc_per_node: int = 1,
                          form: str = "c10d", master_node: int | str = 0, nodes: Sequence[int | str] | None = None,
                          rdzv_conf: str | None = None, extra_args: Sequence[str] = (), port: int = DEFAULT_MASTER_PORT,
                          rdzv_id: str = "runbook-lab", log_dir: str | os.PathLike[str] | None = None,
                          cwd: str | os.PathLike[str] | None = None) -> list[list[str]]:
        """One ``torchrun`` command per node, each wrapped by :meth:`node_argv` (rank script under the rank shim).

        Args:
            script, args: the rank script and its arguments.
            nproc_per_node: ranks per node.
            form: ``"c10d"`` (``--rdzv-backend=c10d --rdzv-endpoint=<master>:<port> --rdzv-id``;
                node ranks assigned at rendezvous) or ``"static"`` (``--master-addr --master-port
                --node-rank=I``), seed D2.
            master_node: the node whose hostname is the endpoint / MASTER_ADDR.
            nodes: the nodes to start (default all); ``--nnodes`` is always the lab size, so
                starting fewer reproduces a node that never joins (MN1).
            rdzv_conf: ``--rdzv-conf`` value (c10d), e.g. ``"join_timeout=20"``.
            extra_args: more torchrun flags (before the script).
            port: rendezvous / master port.
            rdzv_id: c10d job id.
            log_dir: torchrun ``--log-dir`` base; each node gets ``<log_dir>/nodeI``.
            cwd: working directory inside the nodes (default: the project root, as
                :func:`helpers.jobs.run_commands` uses).

        Returns:
            ``[argv of node a, argv of node b, ...]`` in the order of ``nodes``.

        Raises:
            ValueError: bad form, node, nproc_per_node or port; ``script`` missing.
        """
        if form not in FORMS:
            raise ValueError(f"form={form!r}: accepted values are {', '.join(FORMS)}")
        positive_int(nproc_per_node, "nproc_per_node")
        tcp_port(port, "port")
        if not Path(script).is_file():
            raise ValueError(f"script={str(script)!r}: file not found")
        master = self.hostname(master_node)
        chosen = [self.index(n) for n in (range(self.nodes) if nodes is None else nodes)]
        if not chosen or len(set(chosen)) != len(chosen):
            raise ValueError(f"nodes={nodes!r}: give distinct nodes of this lab, at least one")
        cmds = []
        for i in chosen:
            if form == "c10d":
                rdzv = ["--rdzv-backend=c10d", f"--rdzv-endpoint={master}:{port}", f"--rdzv-id={rdzv_id}"]
                rdzv += [f"--rdzv-conf={rdzv_conf}"] if rdzv_conf else []
            else:
                if rdzv_conf:
                    raise ValueError("rdzv_conf: only the c10d form takes --rdzv-conf")
                rdzv = [f"--master-addr={master}", f"--master-port={port}", f"--node-rank={i}"]
            launcher = jobs.launcher_argv("torchrun", Path(script).resolve(), args, nproc=nproc_per_node,
                                          nnodes=self.nodes, launcher_args=[*rdzv, *map(str, extra_args)],
                                          standalone=False,
                                          log_dir=Path(log_dir) / f"node{i}" if log_dir else None)[0]
            cmds.append(self.node_argv(i, launcher, cwd=jobs.project_root() if cwd is None else cwd))
        return cmds

    def launch(self, script: str | os.PathLike[str], args: Sequence[str] = (), *, nproc_per_node: int = 1,
               form: str = "c10d", master_node: int | str = 0, nodes: Sequence[int | str] | None = None,
               rdzv_conf: str | None = None, extra_args: Sequence[str] = (), port: int = DEFAULT_MASTER_PORT,
               timeout_s: float = 60.0, stall_s: float | None = None, env: Mapping[str, str | None] | None = None,
               per_node_env: Mapping[int | str, Mapping[str, str | None]] | None = None, name: str = "lab-job",
               heartbeat: str | None = None, echo: bool = False, verbose: bool = True) -> jobs.JobResult:
        """Run a multi-node ``torchrun`` job on the lab through :func:`helpers.jobs.run_commands`.

        One command per started node (see :meth:`torchrun_commands`).  Each node's launcher
        output is also copied to ``<job_dir>/nodes/nodeI.stdout`` and ``.stderr`` (the runner's
        ``launcher.stdout``/``.stderr`` hold all nodes merged; read one node with
        :func:`node_output`); torchrun's own logs go to ``<job_dir>/torchrun/nodeI``.  Ranks are
        global (``ranks[r]``), whatever node they ran on.

        Args:
            script, args, nproc_per_node, form, master_node, nodes, rdzv_conf, extra_args, port:
                see :meth:`torchrun_commands`.
            timeout_s, stall_s, env, heartbeat, echo, verbose: see :func:`helpers.jobs.run_commands`.
            per_node_env: extra variables per node, keyed by index or hostname.
            name: job name.

        Returns:
            The :class:`helpers.jobs.JobResult`; ``result.commands[k]`` is node ``nodes[k]``.

        Raises:
            RuntimeError: the lab is not up.  ValueError: bad arguments (see above).
        """
        if not self._complete():
            raise RuntimeError(f"lab {self.name!r} is not up: call up() first (or `runbook lab up`)")
        chosen = [self.index(n) for n in (range(self.nodes) if nodes is None else nodes)]
        job_dir = jobs.new_job_dir(name)
        try:
            cmds = self.torchrun_commands(script, args, nproc_per_node, form, master_node, chosen, rdzv_conf,
                                          extra_args, port, rdzv_id=job_dir.name, log_dir=job_dir / "torchrun")
        except ValueError:
            shutil.rmtree(job_dir, ignore_errors=True)
            raise
        (job_dir / "nodes").mkdir()
        wrapped = []
        for i, cmd in zip(chosen, cmds):
            out, err = job_dir / "nodes" / f"node{i}.stdout", job_dir / "nodes" / f"node{i}.stderr"
            tee = ('set -o pipefail; "$@" 2> >(tee -a ' + shlex.quote(str(err)) + " >&2) | tee -a "
                   + shlex.quote(str(out)))
            wrapped.append(["bash", "-c", tee, "lab-node", *cmd])
        per_env = None
        if per_node_env:
            keyed = {self.index(k): v for k, v in per_node_env.items()}
            per_env = [dict(keyed.get(i, {})) for i in chosen]
        if verbose:
            print(f"[{name}] lab {self.name!r}: nodes {', '.join(self.hostname(i) for i in chosen)} of {self.nodes}, "
                  f"{nproc_per_node} rank(s) each, {form} rendezvous at {self.hostname(master_node)}:{port}; "
                  f"per-node logs {job_dir / 'nodes'}/nodeI.stdout|.stderr")
        return jobs.run_commands(wrapped, timeout_s=timeout_s, stall_s=stall_s, env=env, name=name, job_dir=job_dir,
                                 per_process_env=per_env, heartbeat=heartbeat, echo=echo, verbose=verbose)


def node_output(result: jobs.JobResult, node: int | str) -> str:
    """The launcher output (stdout then stderr) of one node of a :meth:`Lab.launch` job ("" if it did not run)."""
    i = int(node) if isinstance(node, int) else int(re.sub(r"^.*node", "", str(node)))
    base = result.job_dir / "nodes" / f"node{i}"
    return "".join(p.read_text(errors="replace") for p in (base.with_suffix(".stdout"), base.with_suffix(".stderr"))
                   if p.exists())


# --------------------------------------------------------------------------- processes

def _proc(pid: int) -> psutil.Process | None:
    try:
        return psutil.Process(pid)
    except psutil.Error:
        return None


def _children(proc: psutil.Process) -> list[psutil.Process]:
    try:
        return proc.children(recursive=True)
    except psutil.Error:
        return []


def _wait_gone(victims: Sequence[psutil.Process], timeout_s: float) -> list[psutil.Process]:
    """Wait until each process has exited (a zombie counts as exited); return those still alive.

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


def _pids_in(inodes: Mapping[str, set[int]]) -> set[int]:
    """Pids of the processes in any of the given namespaces (``{"net": {ino}, "mnt": {...}, "uts": {...}}``)."""
    found = set()
    me = os.getpid()
    for pid in psutil.pids():
        if pid == me:
            continue
        for kind, inos in inodes.items():
            if inos and _ns_inode(f"/proc/{pid}/ns/{kind}") in inos:
                found.add(pid)
                break
    return found


def _kill_in_namespaces(inodes: Mapping[str, set[int]], grace_s: float) -> list[int]:
    """SIGTERM every process in the namespaces, SIGKILL the survivors after ``grace_s``; return all pids."""
    pids = _pids_in(inodes)
    if not pids:
        return []
    victims = [p for p in (_proc(pid) for pid in pids) if p]
    for p in victims:
        try:
            p.send_signal(signal.SIGTERM)
        except psutil.Error:
            pass
    alive = _wait_gone(victims, grace_s)
    late = alive + [p for p in (_proc(pid) for pid in _pids_in(inodes) - pids) if p]
    for p in late:
        try:
            p.kill()
        except psutil.Error:
            pass
    _wait_gone(late, 3.0)
    return sorted(pids | {p.pid for p in late})


# --------------------------------------------------------------------------- module API for the CLI

def up(nodes: int = 2, name: str = DEFAULT_NAME, subnet: str = DEFAULT_SUBNET, private_tmp: bool = False) -> Lab:
    """Build (or keep) the lab ``name``; see :meth:`Lab.up`."""
    return Lab(nodes, subnet, name, private_tmp).up()


def down(name: str = DEFAULT_NAME) -> dict[str, Any]:
    """Remove the lab ``name`` whatever its size; see :meth:`Lab.down`."""
    return Lab(1, name=name).down()


def status(name: str = DEFAULT_NAME) -> dict[str, Any]:
    """The lab's state as :meth:`Lab.status` reports it (``{"up": False, "nodes": []}`` when absent)."""
    try:
        lab = Lab.attach(name)
    except ValueError:
        lab = Lab(1, name=name)
    return lab.status()


def format_status(st: Mapping[str, Any]) -> str:
    """A few lines for people from :func:`status`'s dict."""
    if not st["nodes"] and not st["switch"]["namespace"]:
        return f"lab {st['name']!r}: down (nothing exists)"
    head = (f"lab {st['name']!r}: {'up' if st['up'] else 'INCOMPLETE'} ({st['mode']}), subnet {st['subnet']}, "
            f"bridge mtu {st['switch']['bridge_mtu']}, private /tmp {'on' if st['private_tmp'] else 'off'}")
    lines = [head]
    for n in st["nodes"]:
        port = n["bridge_port"]
        extra = "".join(f"; {o['name']} ({o['kind']}) {','.join(o['addresses']) or '-'} {o['state']}"
                        for o in n["other_ifaces"])
        lines.append(f"  {n['hostname']:6} ns {n['namespace']:10} {n['iface']} {n['address']} mtu {n['mtu']} "
                     f"{n['state']} | bridge port {port['name']} mtu {port['mtu']} {port['state']} | "
                     f"{n['pids']} process(es){extra}")
    return "\n".join(lines)
