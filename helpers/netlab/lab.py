"""The :class:`Lab`: naming, up/down/attach/status, entering a node (``node_argv``, ``run``, ``runner``).

Faults come from :class:`helpers.netlab.faults.FaultsMixin` and multi-node ``torchrun`` from
:class:`helpers.netlab.multinode.MultiNodeMixin`; where the lab lives (root or rootless) is the
mode object of :mod:`helpers.netlab._host`.  See the package docstring for the layout.
Nothing runs at import.
"""

from __future__ import annotations

import ipaddress
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from helpers import envvars, jobs, procs
from helpers.netlab import faults, slurmlab
from helpers.netlab._host import LAB_ROOT, NAME_RX, NETNS_DIR, host_for, lab_available, lab_names, run_cmd
from helpers.netlab.faults import DATA_IFACE, DECOY_NET, FaultsMixin
from helpers.netlab.multinode import MultiNodeMixin
from helpers.netlab.slurmlab import HEAD
from helpers.slurm import SlurmClient

DEFAULT_NAME = "rb"
DEFAULT_SUBNET = "10.77.0.0/24"
MAX_NODES = 8  # the 2-core machine holds 8 SLURM nodes (the localisation is measured on 8; ~250 MB per idle worker)
FIRST_HOST = 10  # node I gets <subnet> + 10 + I (10.77.0.10, 10.77.0.11, ...)
BRIDGE = "br0"
# TSO/GSO off on the veths: with offloads on, the MTU black hole is flaky (PF-mtu-blackhole).  Without
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


class Lab(FaultsMixin, MultiNodeMixin, SlurmClient):
    """A lab of ``nodes`` network-namespace nodes behind one bridge (see :mod:`helpers.netlab`).

    Args:
        nodes: number of nodes, 1..4.
        subnet: IPv4 network of the lab; node I gets host address ``10 + I`` in it.
        name: lab name (lowercase letter then up to 11 lowercase letters/digits); prefixes every
            namespace (``<name>-sw``, ``<name>-node0``...), so several labs can coexist.
        private_tmp: give each node its own tmpfs on ``/tmp`` (the project, build and venv
            folders stay visible even when they live under ``/tmp``), so that a file written to
            ``/tmp`` on one node is absent on the others (Gilbreth guide 8.12, failure mode 1).
        slurm: also run a real SLURM cluster (:mod:`helpers.netlab.slurmlab`): a head node
            ``head`` (host ``.9`` of the subnet) with munged + slurmctld, one slurmd per
            node; implies ``private_tmp`` (node-local ``/tmp``, shared project folder).

    Raises:
        ValueError: a bad argument, naming it.

    Use as a context manager (``with Lab(2) as lab: ...``: up on enter, down on exit) or call
    :meth:`up` / :meth:`down`.  Source: PF-netns-nodes, PF-hostname-loopback.
    """

    def __init__(self, nodes: int = 2, subnet: str = DEFAULT_SUBNET, name: str = DEFAULT_NAME,
                 private_tmp: bool = False, slurm: bool = False) -> None:
        if isinstance(nodes, bool) or not isinstance(nodes, int) or not 1 <= nodes <= MAX_NODES:
            raise ValueError(f"nodes={nodes!r}: must be an integer in 1..{MAX_NODES}")
        if not isinstance(name, str) or not NAME_RX.fullmatch(name):
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
        self.has_slurm = bool(slurm)
        self.private_tmp = bool(private_tmp) or self.has_slurm
        self.state_dir = LAB_ROOT / name  # as seen from the lab's side (inside the holder when rootless)
        self.host = host_for(name)

    # ------------------------------------------------------------------ naming

    def __repr__(self) -> str:
        return (f"Lab(nodes={self.nodes}, subnet={str(self.subnet)!r}, name={self.name!r}, private_tmp={self.private_tmp}"
                f"{', slurm=True' if self.has_slurm else ''})")

    @property
    def rootless(self) -> bool:
        """True when the lab lives inside a user namespace of its own (not root)."""
        return self.host.mode == "rootless"

    @property
    def switch_ns(self) -> str:
        """Name of the namespace holding the bridge (``<name>-sw``)."""
        return f"{self.name}-sw"

    def ns(self, node: int | str) -> str:
        """Network namespace name of ``node`` (``<name>-nodeI``; ``<name>-head`` for a SLURM lab's head node)."""
        return f"{self.name}-{self._member(node)}"

    @property
    def members(self) -> list[int | str]:
        """Every machine of the lab: the node indexes, then ``"head"`` for a SLURM lab."""
        return [*range(self.nodes), *([HEAD] if self.has_slurm else [])]

    def _member(self, node: int | str) -> str:
        """``"nodeI"``, or ``"head"`` (SLURM labs only): the name of a machine in hostnames and file names."""
        return HEAD if self.has_slurm and node == HEAD else f"node{self.index(node)}"

    @property
    def hostnames(self) -> list[str]:
        """Hostnames of the nodes, in index order: ``["node0", "node1", ...]``."""
        return [f"node{i}" for i in range(self.nodes)]

    def hostname(self, node: int | str) -> str:
        """Hostname of ``node`` (``nodeI``, or ``head``)."""
        return self._member(node)

    def address(self, node: int | str) -> str:
        """IPv4 address of ``node`` on the lab network, without prefix (``10.77.0.10`` for node 0, ``.9`` for head)."""
        offset = -1 if self._member(node) == HEAD else self.index(node)
        return str(self.subnet.network_address + FIRST_HOST + offset)

    def port_name(self, node: int | str) -> str:
        """Name of ``node``'s veth end on the bridge side, in the switch namespace (``pI``, ``ph`` for head)."""
        return "ph" if self._member(node) == HEAD else f"p{self.index(node)}"

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

    def _lab_namespaces(self, present: Iterable[str], kinds: str = r"sw|node\d+|head") -> list[str]:
        """The names in ``present`` that belong to this lab (``<name>-sw``, ``<name>-nodeI``, ``<name>-head``)."""
        return [n for n in present if re.fullmatch(rf"{re.escape(self.name)}-({kinds})", n)]

    def _uts_file(self, i: int | str) -> Path:
        return self.state_dir / f"{self._member(i)}.uts"

    def _mnt_file(self, i: int | str) -> Path:
        return self.state_dir / f"{self._member(i)}.mnt"

    def hosts_file(self, node: int | str) -> Path:
        """The file bind-mounted on ``/etc/hosts`` inside ``node`` (edit it in place, never replace it)."""
        return self.state_dir / f"hosts-{self._member(node)}"

    def hosts_text(self) -> str:
        """The ``/etc/hosts`` every node starts with: localhost, then every node's lab address."""
        lines = ["127.0.0.1\tlocalhost", f"# runbook network lab {self.name!r}: every node, by its lab address"]
        lines += [f"{self.address(i)}\t{self.hostname(i)}" for i in self.members]
        return "\n".join(lines) + "\n"

    # ------------------------------------------------------------------ the mode object, under the old names

    def holder_pid(self) -> int | None:
        """Rootless mode: pid of the process holding the lab's user/mount/net namespaces (None as root or if absent)."""
        return self.host.holder_pid()

    def _host_path(self, path: Path) -> Path:
        """``path`` of the lab's side (``/run/...``) as this process can open it."""
        return self.host.path(path)

    def _sys(self, argv: Sequence[str]) -> list[str]:
        return self.host.argv(argv)

    def _netns(self) -> list[str]:
        return self.host.netns()

    def _mounts(self, path: Path) -> list[str]:
        return self.host.mounts(path)

    # ------------------------------------------------------------------ lifecycle

    def __enter__(self) -> "Lab":
        self.up()
        return self

    def __exit__(self, *exc: object) -> None:
        self.down()

    def _spec(self) -> dict[str, Any]:
        spec = {"nodes": self.nodes, "subnet": str(self.subnet), "private_tmp": self.private_tmp,
                "shared_dirs": self._shared_dirs() if self.private_tmp else []}
        return {**spec, "slurm": True} if self.has_slurm else spec

    def up(self) -> "Lab":
        """Build the lab, idempotently; return ``self``.

        A complete lab with the same spec (nodes, subnet, private_tmp) is left as it is (faults
        injected into it stay); anything else carrying this lab's name (a half-built lab from a
        crashed run, or one of another size) is torn down first, then the lab is rebuilt.
        Measured here: ~0.1-0.3 s for 2-4 nodes (budget 10 s); with ``slurm=True`` see
        :func:`helpers.netlab.slurmlab.start`.

        Raises:
            RuntimeError: :func:`lab_available` says no (the reason is in the message), or a
                system command failed (named, with its stderr); the half-built lab is removed.
        """
        ok, why = lab_available()
        if not ok:
            raise RuntimeError(f"cannot build the network lab: {why}")
        ok, why = slurmlab.slurm_available() if self.has_slurm else (True, "")
        if not ok:
            raise RuntimeError(f"cannot start SLURM on the lab: {why}")
        with self.host.lock():
            if self._complete():
                return self
            self._down_locked()
            try:
                self.host.start()
                self._build()
                if self.has_slurm:
                    slurmlab.start(self)
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
        wanted = {self.switch_ns, *(self.ns(i) for i in self.members)}
        extra = set(self._lab_namespaces(present, r"node\d+")) - wanted
        if not wanted <= present or extra:
            return False
        mounts = set(self._mounts(self.state_dir))
        for i in self.members:
            if not {str(self._uts_file(i)), str(self._mnt_file(i))} <= mounts:
                return False
        links = self._links(self.switch_ns)
        if BRIDGE not in links or any(self.port_name(i) not in links for i in self.members):
            return False
        if self.has_slurm and not self.node_pids(HEAD):  # slurmctld and munged live on the head node
            return False
        for i in self.members:
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
        names = [self.switch_ns, *(self.ns(i) for i in self.members)]
        run_cmd(self._sys(["ip", "-batch", "-"]), input_text="".join(f"netns add {n}\n" for n in names))
        for ns in names:  # no IPv6 at all: only lab-subnet (and decoy) addresses inside the lab
            self._nsexec(ns, ["sh", "-c", "echo 1 > /proc/sys/net/ipv6/conf/default/disable_ipv6; "
                                          "echo 1 > /proc/sys/net/ipv6/conf/all/disable_ipv6"], check=False)
        cmds = [f"link add {BRIDGE} type bridge", f"link set {BRIDGE} up", "link set lo up"]
        for i in self.members:
            p = self.port_name(i)
            cmds += [f"link add {p} type veth peer name {DATA_IFACE} netns {self.ns(i)}",
                     f"link set {p} master {BRIDGE}", f"link set {p} up"]
        self._ip_batch(self.switch_ns, cmds)
        for i in self.members:
            self._ip_batch(self.ns(i), ["link set lo up",
                                        f"addr add {self.address(i)}/{self.subnet.prefixlen} dev {DATA_IFACE}",
                                        f"link set {DATA_IFACE} up"])
        for i in self.members:
            self._offloads_off(self.ns(i), [DATA_IFACE])
        self._offloads_off(self.switch_ns, [self.port_name(i) for i in self.members])
        for i in self.members:
            self._make_node_namespaces(i)
        self._host_path(self.state_dir / "lab.json").write_text(json.dumps(self._spec(), indent=1))

    def _make_state_dir(self) -> None:
        run_cmd(self._sys(["mkdir", "-p", str(self.state_dir)]))
        # Namespace files can only be bind-mounted on a mount that is not shared (unshare(1)):
        # make the state folder a private mount of its own (a no-op for the host's other mounts).
        if str(self.state_dir) not in self._mounts(self.state_dir):
            run_cmd(self._sys(["mount", "--bind", str(self.state_dir), str(self.state_dir)]))
        run_cmd(self._sys(["mount", "--make-private", str(self.state_dir)]))

    def _make_node_namespaces(self, i: int | str) -> None:
        hosts = self.hosts_file(i)
        self._host_path(hosts).write_text(self.hosts_text())
        for f in (self._uts_file(i), self._mnt_file(i)):
            self._host_path(f).touch()
        q = shlex.quote
        script = ["set -e", f"hostname {q(self.hostname(i))}", f"mount --bind {q(str(hosts))} /etc/hosts"]
        if self.private_tmp:
            stage = self.state_dir / f"stage-{self._member(i)}"
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
        argv = self._sys([*self.host.pin(), "unshare", f"--uts={self._uts_file(i)}", f"--mount={self._mnt_file(i)}",
                          "--propagation", "private", "sh", "-c", "\n".join(script)])
        for _ in range(5):  # see RootlessHost.pin(): a refused bind leaves nothing behind, so try a fresh namespace
            proc = run_cmd(argv, check=False)
            if proc.returncode == 0:
                return
            if "Invalid argument" not in proc.stderr:
                break
        raise RuntimeError(f"{self._member(i)}: creating its UTS/mount namespaces failed: {proc.stderr.strip()}")

    def down(self) -> dict[str, Any]:
        """Remove everything of this lab: processes, namespaces (and so the bridge and veths), mounts, files.

        Works on whatever exists under this lab's name (also a lab built by another process or
        half-built by a crashed one).  Every process whose network, mount or UTS namespace is a
        lab namespace gets SIGTERM, then SIGKILL after 1 s (:func:`helpers.procs.kill_in_namespaces`).
        Measured here: ~0.05-0.2 s without processes (budget 5 s).

        Returns:
            ``{"killed": [pids], "namespaces": [names removed], "seconds": float}``.
        """
        with self.host.lock():
            return self._down_locked()

    def _down_locked(self) -> dict[str, Any]:
        t0 = time.monotonic()
        namespaces = self._lab_namespaces(self._netns())
        killed = procs.kill_in_namespaces(self._ns_inodes(namespaces), grace_s=1.0)
        faults.remove_cpu_cgroups(self.name)  # a node's CPU cap (throttle_cpu), emptied by the kill above
        self.host.teardown(self.state_dir, namespaces)
        slurmlab.remove(self.name)  # config, key, socket, state, spool, logs (the daemons died with the namespaces)
        return {"killed": killed, "namespaces": namespaces, "seconds": round(time.monotonic() - t0, 3)}

    def leftovers(self) -> list[str]:
        """Whatever of this lab still exists: namespaces, mounts, the state folder, a rootless holder ([] after down())."""
        left = self._lab_namespaces(self._netns())
        left += self._mounts(self.state_dir)
        left += [str(self.state_dir)] if self._host_path(self.state_dir).exists() else []
        left += [str(slurmlab.slurm_dir(self.name))] if slurmlab.slurm_dir(self.name).exists() else []
        left += [str(p) for p in faults.cpu_cgroups(self.name)]
        return left + self.host.leftovers()

    def _ns_inodes(self, namespaces: Iterable[str]) -> dict[str, set[int]]:
        """Inodes of this lab's namespaces, by kind (``net``, ``mnt``, ``uts``)."""
        out: dict[str, set[int]] = {"net": set(), "mnt": set(), "uts": set()}
        mounts = self._mounts(self.state_dir)
        for n in namespaces:
            ino = procs.ns_inode(self._host_path(NETNS_DIR / n))
            if ino:
                out["net"].add(ino)
        for kind in ("mnt", "uts"):
            for f in mounts:
                if f.endswith(f".{kind}"):
                    ino = procs.ns_inode(self._host_path(Path(f)))
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
            return cls(spec["nodes"], spec["subnet"], name, spec["private_tmp"], spec.get("slurm", False))
        except (OSError, json.JSONDecodeError, KeyError):
            pass
        count = len(probe._lab_namespaces(probe._netns(), r"node\d+"))
        if not count:
            raise ValueError(f"name={name!r}: no lab of that name on this machine (labs: {lab_names() or 'none'})")
        return cls(min(count, MAX_NODES), name=name)

    # ------------------------------------------------------------------ inspection

    def _ip_batch(self, ns: str, cmds: Sequence[str]) -> None:
        run_cmd(self._sys(["ip", "-n", ns, "-batch", "-"]), input_text="\n".join(cmds) + "\n")

    def _nsexec(self, ns: str, argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` in network namespace ``ns`` only (no UTS/mount change): for ip/ethtool/sysctl."""
        return run_cmd(self._sys(["nsenter", f"--net={NETNS_DIR / ns}", "--", *argv]), check=check)

    def _offloads_off(self, ns: str, devs: Sequence[str]) -> None:
        if shutil.which("ethtool"):
            for dev in devs:
                self._nsexec(ns, ["ethtool", "-K", dev, "tso", "off", "gso", "off"])
        else:  # ethtool not installed: the same two legacy ioctls from Python
            self._nsexec(ns, [sys.executable, "-c", _ETHTOOL_FALLBACK, *devs])

    def _ip_json(self, ns: str, what: str) -> list[dict[str, Any]]:
        """``ip -n ns -j -d <what> show`` parsed ([] when the lab is not reachable or the output is not JSON)."""
        if not self.host.ready():
            return []
        proc = run_cmd(self._sys(["ip", "-n", ns, "-j", "-d", what, "show"]), check=False)
        try:
            return json.loads(proc.stdout or "[]")
        except json.JSONDecodeError:
            return []

    def _links(self, ns: str) -> dict[str, dict[str, Any]]:
        return {link["ifname"]: link for link in self._ip_json(ns, "link")}

    def _addrs(self, ns: str) -> list[dict[str, Any]]:
        return self._ip_json(ns, "addr")

    def data_iface(self, node: int | str) -> str:
        """Current name of ``node``'s lab interface (``eth0`` unless renamed): its veth end."""
        ns = self.ns(node)
        for name, link in self._links(ns).items():
            if (link.get("linkinfo") or {}).get("info_kind") == "veth":
                return name
        raise RuntimeError(f"node {self.hostname(node)}: no veth in namespace {ns} (is the lab up?)")

    def node_pids(self, node: int | str) -> list[int]:
        """Pids of the processes whose network namespace is ``node``'s."""
        ino = procs.ns_inode(self._host_path(NETNS_DIR / self.ns(node)))
        return sorted(procs.pids_in_namespaces({"net": {ino}} if ino else {}))

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
        count = max([self.nodes] + [int(n.rsplit("node", 1)[1]) + 1 for n in self._lab_namespaces(present, r"node\d+")])
        wide = Lab(min(count, MAX_NODES), str(self.subnet), self.name, self.private_tmp)  # names nodes beyond self.nodes
        for i in range(wide.nodes):
            ns = wide.ns(i)
            if ns not in present:
                continue
            entry: dict[str, Any] = {"index": i, "namespace": ns, "hostname": wide.hostname(i), "iface": None,
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
            port = sw_links.get(wide.port_name(i), {})
            entry["bridge_port"] = {"name": wide.port_name(i), "mtu": port.get("mtu"), "state": port.get("operstate")}
            ino = procs.ns_inode(self._host_path(NETNS_DIR / ns))
            entry["pids"] = len(procs.pids_in_namespaces({"net": {ino}})) if ino else 0
            nodes.append(entry)
        return {"name": self.name, "up": self._complete(), "subnet": str(self.subnet), "private_tmp": self.private_tmp,
                "state_dir": str(self.state_dir) if self._host_path(self.state_dir).exists() else None,
                "mode": self.host.mode, "holder_pid": self.holder_pid(),
                "switch": {"namespace": self.switch_ns if self.switch_ns in present else None,
                           "bridge_mtu": sw_links.get(BRIDGE, {}).get("mtu")},
                "nodes": nodes,
                "slurm": slurmlab.status(self) if self.has_slurm and self.ns(HEAD) in present else None}

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

        On a SLURM lab, ``SLURM_CONF`` is set too, so ``srun``/``sbatch``/``scontrol`` work on
        every node (and ``node`` may be ``"head"``), and the caller's other ``SLURM_*`` variables (those of an
        outer SLURM job this process runs in) are unset.

        Args:
            node: index or hostname.
            argv: the command.
            cwd: working directory inside the node (default: this process's current directory).

        Raises:
            ValueError: unknown node, or empty ``argv``.
            RuntimeError: rootless lab not up.
        """
        argv = [str(a) for a in argv]
        if not argv:
            raise ValueError("argv: give the command to run inside the node")
        prefix = self.host.enter_argv(NETNS_DIR / self.ns(node), self._uts_file(node), self._mnt_file(node))
        conf: list[str] = []
        if self.has_slurm:
            # the lab is a cluster of its own: the variables of an outer SLURM job this process may run in (the
            # course as a batch job on a real allocation) would point srun at that job ("Unable to confirm allocation")
            conf = [f"--unset={k}" for k in sorted(os.environ) if k.startswith("SLURM_") and k != "SLURM_CONF"]
            conf.append(f"SLURM_CONF={slurmlab.conf_path(self.name)}")
        return [*prefix, "env", f"--chdir={os.fspath(cwd) if cwd is not None else os.getcwd()}", *conf, *argv]

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
        cmd = self.node_argv(node, argv, cwd=cwd)
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                env=envvars.apply(os.environ, env),
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

    def slurm(self, argv: Sequence[str], timeout_s: float = 60.0, *,
                  env: Mapping[str, str | None] | None = None,
                  cwd: str | os.PathLike[str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run a SLURM client command (``sbatch``, ``srun``, ``squeue``, ``sinfo``, ``scancel``, ``scontrol``...) on the head node.

        As a user on a cluster's login node would: ``SLURM_CONF`` set, working directory the
        project root (the shared filesystem) unless ``cwd`` is given.  See :meth:`run` for
        ``timeout_s`` and ``env``.

        Raises:
            ValueError: this lab was made without ``slurm=True``.
        """
        if not self.has_slurm:
            raise ValueError(f"lab {self.name!r}: made without slurm=True, it has no SLURM (Lab(..., slurm=True))")
        return self.run(HEAD, argv, timeout_s, env=env, cwd=jobs.project_root() if cwd is None else cwd)

    # --- the SlurmClient interface: client commands on the head node, nodes reached directly (nsenter)

    def client_argv(self, argv: Sequence[str]) -> list[str]:
        """``argv`` as a SLURM client command on the head node, in the project folder (the shared filesystem)."""
        return self.node_argv(HEAD, [str(a) for a in argv], cwd=jobs.project_root())

    @property
    def in_allocation(self) -> bool:
        """False: the lab's client commands run on its head node, outside any allocation."""
        return False

    def on_node(self, node: str, argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` inside ``node`` (by hostname; no SLURM needed: see :meth:`run`)."""
        return self.run(node, argv, timeout_s)


# --------------------------------------------------------------------------- module API (the CLI's verbs)

def up(nodes: int = 2, name: str = DEFAULT_NAME, subnet: str = DEFAULT_SUBNET, private_tmp: bool = False,
       slurm: bool = False) -> Lab:
    """Build (or keep) the lab ``name`` (with a SLURM cluster when ``slurm``); see :meth:`Lab.up`."""
    return Lab(nodes, subnet, name, private_tmp, slurm).up()


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
    slurm = st.get("slurm")
    if slurm:
        nodes = ", ".join(f"{node} {state}" for node, state in slurm["nodes"].items()) or "slurmctld does not answer"
        lines.append(f"  SLURM (head node, SLURM_CONF={slurm['conf']}): {nodes}; {len(slurm['queue'])} job(s) queued")
        lines += [f"    {job}" for job in slurm["queue"]]
    return "\n".join(lines)
