"""Read ``NCCL_DEBUG=INFO`` logs: one summary per rank, then verdicts that name the culprit and the fix.

``parse(text)`` turns the interleaved output of any number of ranks and hosts into one
:class:`RankInfo` per process (and GPU): host, NCCL version, bootstrap interface, network
(IB or sockets) and its devices, the transport of every channel connection, ``Init COMPLETE``
and the WARN lines.  ``interpret(log)`` turns that into :class:`Verdict` objects (severity,
ranks and hosts involved, evidence lines, one-line fix); ``render`` prints both as text; the
``nccl-log FILE [FILE...] [--json]`` command does all three (exit 1 when a verdict is FAIL).

Lines it reads (prefixes and timestamps before them are ignored, except these labels):

* NCCL's own prefix ``host:pid:tid [cudaDev] [file.cc:line] NCCL INFO|WARN msg``; a rank is
  keyed ``host:pid[cudaDev]``.
* torchrun's ``[rank3]:`` / ``[default0]:`` labels, the project's ``[rank 3] `` (helpers.jobs),
  and ``host: `` labels (pdsh/srun style, as in the Gilbreth guide's 8.9 excerpt).
* Excerpts without any prefix (``NCCL INFO Channel 00 : 0[0] -> 1[1] via SHM/direct/direct``,
  as the Gilbreth guide quotes them): keyed ``rank0`` from the rank the line names (for a
  channel line, the sender, or the receiver of a ``[receive]`` line); known NCCL messages
  without ``NCCL INFO`` (``Bootstrap : no socket interface found`` as torch's "Last error:"
  quotes it) are read too.  A bare ``NCCL version 2.x`` line (NCCL 2.19+ prints it without a
  prefix) goes to the rank of the line before it; other lines that name no rank go to
  :attr:`NcclLog.unattributed`.
* Lines starting with ``#`` are comments (the sample logs under tests/data/nccl/ use them).

Formats follow NCCL's source (https://github.com/NVIDIA/nccl: ``src/bootstrap.cc`` prints
``Bootstrap : Using%s`` and warns ``Bootstrap : no socket interface found`` /
``NET/Socket : No usable listening interface found``; ``src/init.cc`` prints the three
``... - Init COMPLETE`` forms of 2.1x (``comm %p rank %d nranks %d cudaDev %d busId %lx``),
2.18-2.20 (``... nvmlDev %d busId %lx commId 0x%llx``) and 2.21+ (``ncclCommInitRank comm ...``
/ ``ncclCommSplit comm ...``), ``comm %p rank %d nRanks %d nNodes %d localRanks %d localRank %d
MNNVL %d`` and ``Mismatched NCCL version detected : rank %d version %d rank %d version %d``;
``NET/IB : No device found.`` comes from the IB transport) and real logs quoted in
https://github.com/NVIDIA/nccl/issues/286, /issues/952, /issues/1053, /issues/1504,
/issues/1609, /issues/1814, https://github.com/NVIDIA/nccl-tests/issues/273,
https://github.com/pytorch/pytorch/issues/68893, https://github.com/sgl-project/sglang/issues/3820
and https://github.com/espnet/espnet/issues/1940.  Verdicts and fixes cite the seeds
``multinode.md`` MN1/MN2 and ``gilbreth-hpc-guide.md`` sections 4.1, 6.3, 8.3, 8.12, 9.2, 9.4.

Nothing runs at import; the standard library only.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

SEVERITIES = ("FAIL", "WARN", "INFO")
TOPOLOGIES = ("single-node", "multi-node", "unknown")

# Stages of communicator setup a rank's log can reach, in order (used to find the rank
# that stopped first, seed MN1).
STAGES = ("none", "bootstrap", "network", "init-start", "channels", "init-complete")

GILBRETH_SINGLE_NODE_FIX = ("export NCCL_IB_DISABLE=1 NCCL_NET_DISABLE=1 NCCL_P2P_LEVEL=NVL NCCL_SHM_DISABLE=0 "
                            "for single-node jobs (gilbreth-hpc-guide §6.3, also §4.1 and §9.2); channels then "
                            "read 'via SHM/direct/direct' or 'via P2P/...'")
"""The single-node fix exactly as the Gilbreth guide gives it (§6.3 "Required Environment
Variables").  Note: ``NCCL_NET_DISABLE`` is not in NCCL's documented variable list
(https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html); the guide sets it and we
quote the guide verbatim."""

_EVIDENCE_MAX = 6
_LINE_MAX = 400          # evidence lines are cut to this many characters
_SCAN_MAX = 4000         # regexes look at most at this many characters of a message

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_MARK = re.compile(r"\bNCCL (INFO|WARN|TRACE|ABORT)\b ?")
_PREFIX = re.compile(r"(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] (?:(?P<src>\S+:\d+) )?$")
_BARE_HEAD = re.compile(
    r"(?:(?<=\s)|(?<=:)|^)(?:Bootstrap ?: |NET/[\w.\-]+ ?: |(?:Channel|Ring) \d+(?:/\d+)? : \d+\[|"
    r"(?:\w+ )?comm \S+ rank \d+ n[Rr]anks \d+|NCCL version \d|socket\w+: |Call to connect |"
    r"Mismatched NCCL version )")
_LABEL_RANK = re.compile(r"\[rank(\d+)\]:|\[rank (\d+)\]")
_LABEL_LOCAL = re.compile(r"\[(default\d+)\]:")
_LABEL_HOST = re.compile(r"(?:^|\s)([A-Za-z][\w.\-]*): *$")

_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+(?:\+[\w.]+)?)")
_DRIVER = re.compile(r"^cudaDriverVersion (\d+)")
_ENV = re.compile(r"^(NCCL_\w+) set by environment to (\S+?)\.?$")
_BOOTSTRAP = re.compile(r"^Bootstrap ?: Using (.+)$")
_NET_USING = re.compile(r"^NET/(?P<net>[\w.\-]+) ?: Using (?P<devs>.+)$")
_IB_NODEV = re.compile(r"^NET/IB ?: No device found")
_NETWORK = re.compile(r"^Using network (\S+)")
_IFACE = re.compile(r"(?<!\S)(?:\[(?P<idx>\d+)\])?(?P<name>[^\s:\[\];]+):(?P<addr>\S+)")
_INIT = re.compile(r"(?:^|\s)comm (?P<comm>\S+) rank (?P<rank>\d+) nranks (?P<nranks>\d+)\b(?P<rest>.*?)"
                   r"- Init (?P<what>COMPLETE|START)", re.IGNORECASE)
_TOPO = re.compile(r"(?:^|\s)comm (?P<comm>\S+) rank (?P<rank>\d+) nRanks (?P<nranks>\d+) nNodes (?P<nnodes>\d+) "
                   r"localRanks (?P<local>\d+)")
_CUDADEV = re.compile(r"\bcudaDev (\d+)")
_LOCALRANKS = re.compile(r"\blocalRanks (\d+)")
_NNODES = re.compile(r"\bnNodes (\d+)")
_CHANNEL = re.compile(r"^(?:Channel|Ring) (?P<ch>\d+)(?:/(?P<conn>\d+))? : (?P<src>\d+)\[(?P<sdev>[0-9a-fA-F]+)\] -> "
                      r"(?P<dst>\d+)\[(?P<ddev>[0-9a-fA-F]+)\](?: \[(?P<dir>send|receive)\])? via (?P<via>.+)$")
_MISMATCH = re.compile(r"Mismatched NCCL version detected : rank (\d+) version (\d+) rank (\d+) version (\d+)")
_CONNECT_REASONS = ("Connection refused", "No route to host", "Network is unreachable", "Connection timed out",
                    "Software caused connection abort")
_CONNECT_ANY = re.compile("|".join(re.escape(r) for r in _CONNECT_REASONS) + r"|[Cc]onnect to \S+ failed")
_DIALED = re.compile(r"[Cc]onnect to (\S+?)<(\d+)>")
_NO_IFACE = re.compile(r"Bootstrap ?: no socket interface found|NET/Socket ?: No usable listening interface found|"
                       r"NET/Socket ?: no interface found|No interface found in the same subnet")
_IBVERBS = re.compile(r"Failed to open libibverbs")
_ABORT = re.compile(r"Abort COMPLETE")


@dataclass(frozen=True)
class Iface:
    """A network interface as NCCL prints it: ``[0]eth0:10.0.0.1<0>``.

    Attributes:
        name: interface name (``eth0``, ``ibp65s0``, ``docker0``, ``lo``).
        address: what follows the colon (``10.0.0.1<0>``; for IB devices ``1/IB``: port/link).
        index: the ``[i]`` index NCCL gives it in a list, None when printed alone.
    """

    name: str
    address: str
    index: int | None = None

    @property
    def ip(self) -> str:
        """The address without NCCL's ``<port>`` suffix (``10.0.0.1``)."""
        return self.address.split("<", 1)[0]

    def __str__(self) -> str:
        return f"{self.name}:{self.address}"


@dataclass(frozen=True)
class Channel:
    """One ``Channel NN/c : a[d] -> b[d] [send|receive] via TRANSPORT`` line.

    Attributes:
        channel: channel number; conn: connection index after the slash (None in old NCCL).
        src, dst: communicator ranks of the two ends (the rank numbers the line gives).
        direction: ``send``/``receive`` (NET lines) or None (P2P/SHM lines, printed by the sender).
        via: the transport text after ``via`` (``P2P/CUMEM/read``, ``SHM/direct/direct``,
            ``NET/IB/0/GDRDMA``, ``NET/Socket/0``, ``P2P/direct pointer``).
        line: the log line, for evidence.
    Source: NCCL transport/p2p.cc, shm.cc, net.cc connection messages; gilbreth-hpc-guide §9.4.
    """

    channel: int
    conn: int | None
    src: int
    dst: int
    direction: str | None
    via: str
    line: str = ""

    @property
    def kind(self) -> str:
        """First component of the transport: ``P2P``, ``SHM``, ``NET``, ``COLLNET``..."""
        return self.via.split("/", 1)[0].split()[0]

    @property
    def short(self) -> str:
        """Transport without the device index: ``NET/IB``, ``P2P/CUMEM``, ``SHM/direct``."""
        parts = self.via.split()[0].split("/")
        return "/".join(parts[:2])

    @property
    def own_rank(self) -> int:
        """The rank that printed the line: the receiver for ``[receive]`` lines, else the sender."""
        return self.dst if self.direction == "receive" else self.src


@dataclass(frozen=True)
class InitComplete:
    """One ``... comm 0x... rank R nranks N ... - Init COMPLETE`` line (any NCCL 2.1x-2.2x form).

    Attributes:
        comm: communicator pointer as printed (``0x5581...``; ``0x...`` in the Gilbreth excerpts).
        rank, nranks: the rank in that communicator and its size.
        cuda_dev, local_ranks, n_nodes: when the line prints them, else None.
        line: the log line.
    """

    comm: str
    rank: int
    nranks: int
    cuda_dev: int | None = None
    local_ranks: int | None = None
    n_nodes: int | None = None
    line: str = ""


@dataclass
class RankInfo:
    """What the log says about one rank (one process and GPU).

    Attributes:
        key: ``host:pid[cudaDev]`` from NCCL's prefix, else ``rankN`` (torchrun/project label or
            the rank a bare line names), ``defaultN`` (torchrun local label) or a ``host:`` label.
        host, pid, cuda_dev: from the prefix when printed.
        rank: global rank (label, else the largest communicator the rank completed or started).
        label: the torchrun/project label seen (``rank3``, ``default0``), if any.
        nccl_version: ``2.21.5+cuda12.4`` (NCCL prints it for a communicator's rank 0 only).
        cuda_driver: ``cudaDriverVersion`` value.
        socket_ifname_env: ``NCCL_SOCKET_IFNAME`` as NCCL reports it was set, if it says so.
        env: every ``NCCL_X set by environment to V`` line, ``{"NCCL_X": "V"}``.
        bootstrap: interfaces of the ``Bootstrap : Using`` line.
        net: the network module of the ``NET/<net> : Using`` line (``IB``, ``Socket``, ``IBext``...).
        net_devices: its devices as printed (``mlx5_0:1/IB``; for Socket ``eth0:10.0.0.1<0>``).
        socket_ifaces: interfaces of a ``NET/Socket : Using`` line; oob: IB's ``OOB`` interface.
        network: the ``Using network X`` value.
        ib_no_device: ``NET/IB : No device found.`` was printed.
        channels: every channel connection line; init_starts: ``Init START`` count.
        init_complete: ``Init COMPLETE`` lines; nranks/n_nodes/local_ranks: largest values seen.
        warns: ``NCCL WARN`` lines; connect_errors / iface_errors / mismatch_lines / ibverbs_lines:
            lines of those kinds (INFO or WARN); aborts: ``Abort COMPLETE`` count (§9.4: normal
            cleanup).
        stage: furthest index in :data:`STAGES` the log reached; lines: NCCL lines of this rank;
        last_line: the last of them; evidence_lines: bootstrap/network lines kept for verdicts.
    """

    key: str
    host: str | None = None
    pid: int | None = None
    cuda_dev: int | None = None
    rank: int | None = None
    label: str | None = None
    nccl_version: str | None = None
    cuda_driver: str | None = None
    socket_ifname_env: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    bootstrap: list[Iface] = field(default_factory=list)
    net: str | None = None
    net_devices: list[str] = field(default_factory=list)
    socket_ifaces: list[Iface] = field(default_factory=list)
    oob: Iface | None = None
    network: str | None = None
    ib_no_device: bool = False
    channels: list[Channel] = field(default_factory=list)
    init_starts: int = 0
    init_complete: list[InitComplete] = field(default_factory=list)
    nranks: int | None = None
    n_nodes: int | None = None
    local_ranks: int | None = None
    warns: list[str] = field(default_factory=list)
    connect_errors: list[str] = field(default_factory=list)
    iface_errors: list[str] = field(default_factory=list)
    mismatch_lines: list[str] = field(default_factory=list)
    ibverbs_lines: list[str] = field(default_factory=list)
    aborts: int = 0
    stage: int = 0
    lines: int = 0
    last_line: str = ""
    evidence_lines: list[str] = field(default_factory=list)

    @property
    def completed(self) -> bool:
        """True when at least one ``Init COMPLETE`` line belongs to this rank."""
        return bool(self.init_complete)

    @property
    def stage_name(self) -> str:
        """Name of :attr:`stage` (``bootstrap``, ..., ``init-complete``)."""
        return STAGES[self.stage]

    def connections(self) -> dict[tuple[int, int], list[str]]:
        """Transports per connection: ``{(src, dst): ["NET/IB/0/GDRDMA", ...]}`` (distinct, sorted)."""
        out: dict[tuple[int, int], set[str]] = {}
        for ch in self.channels:
            out.setdefault((ch.src, ch.dst), set()).add(ch.via)
        return {k: sorted(v) for k, v in sorted(out.items())}

    def transports(self) -> list[str]:
        """Distinct short transports this rank's channels use (``NET/IB``, ``P2P/CUMEM``), sorted."""
        return sorted({ch.short for ch in self.channels})

    def summary(self) -> dict:
        """A JSON-ready summary (channels condensed to :meth:`connections`)."""
        return {
            "key": self.key, "host": self.host, "pid": self.pid, "cuda_dev": self.cuda_dev, "rank": self.rank,
            "label": self.label, "nccl_version": self.nccl_version, "cuda_driver": self.cuda_driver,
            "socket_ifname_env": self.socket_ifname_env, "env": self.env, "bootstrap": [str(i) for i in self.bootstrap],
            "net": self.net, "net_devices": self.net_devices, "oob": str(self.oob) if self.oob else None,
            "network": self.network, "ib_no_device": self.ib_no_device,
            "connections": {f"{a}->{b}": v for (a, b), v in self.connections().items()},
            "init_starts": self.init_starts, "init_complete": [asdict(c) for c in self.init_complete],
            "nranks": self.nranks, "n_nodes": self.n_nodes, "local_ranks": self.local_ranks,
            "warns": self.warns, "stage": self.stage_name, "lines": self.lines, "last_line": self.last_line,
        }


@dataclass
class NcclLog:
    """A parsed log.

    Attributes:
        ranks: :class:`RankInfo` per key (see :attr:`RankInfo.key`), in order of first appearance.
        unattributed: facts from NCCL lines that name no rank or host (key ``?``); verdicts read it
            but it is not a rank (it never counts as a rank stuck in init).
        lines_seen: input lines read (all files); nccl_lines: those recognised as NCCL output.
        unparsed_count: NCCL lines none of the patterns above used (topology dumps, tuning...).
        sources: names of the inputs (file paths, or ``<text>``).
    """

    ranks: dict[str, RankInfo] = field(default_factory=dict)
    unattributed: RankInfo = field(default_factory=lambda: RankInfo(key="?"))
    lines_seen: int = 0
    nccl_lines: int = 0
    unparsed_count: int = 0
    sources: list[str] = field(default_factory=list)

    def all_infos(self) -> list[RankInfo]:
        """The ranks plus :attr:`unattributed` when it holds anything."""
        extra = [self.unattributed] if self.unattributed.lines else []
        return list(self.ranks.values()) + extra

    @property
    def hosts(self) -> list[str]:
        """Distinct hosts named by the ranks, sorted."""
        return sorted({r.host for r in self.ranks.values() if r.host})

    def topology(self) -> str:
        """``single-node``, ``multi-node`` or ``unknown``, from what the lines prove.

        Multi-node: more than one host, or ``nNodes`` > 1, or (one host in this file) a
        communicator larger than the ranks this host shows (one node's log of a bigger job).
        Single-node: one host and none of that, or ``nNodes 1``.  Unknown: no host information
        (bare excerpts) and no ``nNodes``.
        """
        infos = list(self.ranks.values())
        n_nodes = max((r.n_nodes for r in infos if r.n_nodes), default=None)
        hosts = self.hosts
        if len(hosts) > 1 or (n_nodes or 0) > 1:
            return "multi-node"
        if n_nodes == 1:
            return "single-node"
        if len(hosts) == 1:
            on_host = [r for r in infos if r.host]
            world = max((c.nranks for r in infos for c in r.init_complete), default=0)
            local = max((r.local_ranks for r in infos if r.local_ranks), default=None)
            if (local is not None and world > local) or world > len(on_host):
                return "multi-node"
            return "single-node"
        return "unknown"


@dataclass
class Verdict:
    """One finding.

    Attributes:
        id: stable identifier (``bad-interface``, ``single-node-net-transport``, ``ib-fallback-socket``,
            ``connect-failed``, ``no-interface``, ``init-incomplete``, ``mixed-nccl-version``,
            ``single-node-ib-loaded``, ``no-init-complete``, ``other-warnings``).
        severity: ``FAIL`` (the job cannot work), ``WARN`` (works badly / suspect), ``INFO``.
        message: one line saying what the log shows.
        ranks: keys of the :class:`RankInfo` involved; hosts: their hosts.
        evidence: log lines that show it (at most a few, cut to 400 characters).
        fix: one line: what to change, with the source.
    Raises:
        ValueError: ``severity`` not one of :data:`SEVERITIES`.
    """

    id: str
    severity: str
    message: str
    ranks: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    evidence: list[str] = field(default_factory=list)
    fix: str = ""

    def __post_init__(self) -> None:
        if self.severity not in SEVERITIES:
            raise ValueError(f"severity={self.severity!r}: accepted values are {', '.join(SEVERITIES)}")


# ----------------------------------------------------------------------------------------- parsing

def bad_interface_reason(iface: Iface) -> str | None:
    """Why ``iface`` cannot carry traffic between nodes, or None if its name/address looks fine.

    Loopback (``lo``, 127.x, ``::1``), Docker bridges (``docker*``, ``br-<id>``), libvirt
    bridges (``virbr*``) and container veth pairs (``veth*``) are node-local: NCCL bound to one
    of them hangs or fails multi-node (seed MN2; https://github.com/NVIDIA/nccl/issues/1053,
    https://github.com/pytorch/pytorch/issues/68893).
    """
    name, ip = iface.name, iface.ip
    if name == "lo" or re.fullmatch(r"lo\d*", name) or ip.startswith("127.") or ip == "::1":
        return "loopback"
    if name.startswith("docker") or re.fullmatch(r"br-[0-9a-f]+", name):
        return "Docker bridge"
    if name.startswith("virbr"):
        return "libvirt bridge"
    if name.startswith("veth"):
        return "container veth pair"
    return None


def _ifaces(text: str) -> list[Iface]:
    """Interfaces of a ``[0]eth0:10.0.0.1<0> [1]ib0:...`` or ``eth0:10.0.0.1<0>`` list."""
    out = []
    for m in _IFACE.finditer(text):
        out.append(Iface(m["name"], m["addr"], int(m["idx"]) if m["idx"] is not None else None))
    return out


def _cut(line: str) -> str:
    return line if len(line) <= _LINE_MAX else line[:_LINE_MAX] + "..."


def _version_code(code: int) -> str:
    """NCCL_VERSION_CODE (``22105``) as ``2.21.5``; codes below 10000 use the pre-2.9 scheme."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def _base_version(version: str) -> str:
    return version.split("+", 1)[0]


class _Parser:
    """Accumulates lines of one or more inputs into an :class:`NcclLog`."""

    def __init__(self) -> None:
        self.log = NcclLog()
        self._rank_from_label: dict[str, int] = {}
        self._label_to_key: dict[int, str] = {}
        self._local_label_last: dict[str, str] = {}
        self._best_nranks: dict[str, int] = {}

    def _info(self, key: str | None, host: str | None = None, pid: int | None = None,
              dev: int | None = None) -> RankInfo:
        if key is None:
            return self.log.unattributed
        info = self.log.ranks.get(key)
        if info is None:
            info = self.log.ranks[key] = RankInfo(key=key, host=host, pid=pid, cuda_dev=dev)
        return info

    def feed(self, text: str, source: str) -> int:
        """Read ``text``; return how many of its lines were NCCL lines."""
        self.log.sources.append(source)
        previous: str | None = None
        count = 0
        for raw in text.splitlines():
            self.log.lines_seen += 1
            line = _ANSI.sub("", raw).rstrip()
            if not line or line.lstrip().startswith("#"):
                continue
            if "NCCL" not in line and not _BARE_HEAD.search(line[:600]):
                continue
            split = self._split(line)
            if split is None:
                continue
            head, msg = split
            count += 1
            self.log.nccl_lines += 1
            previous = self._line(line, head, msg[:_SCAN_MAX], previous)
        return count

    @staticmethod
    def _split(line: str) -> tuple[str, str] | None:
        """(text before the message, the message) or None when the line is not NCCL output."""
        m = _MARK.search(line)
        if m:
            return line[:m.start()], line[m.end():].strip()
        b = _BARE_HEAD.search(line[:600])
        if b:
            return line[:b.start()], line[b.start():].strip()
        return None

    def _line(self, line: str, head: str, msg: str, previous: str | None) -> str | None:
        """Attribute one NCCL line to a rank and record what it says; return the key used."""
        tail = head[-300:]
        pm = _PREFIX.search(tail)
        label_part = tail[:pm.start()] if pm else tail
        lr = _LABEL_RANK.search(label_part)
        label_rank = int(lr.group(1) or lr.group(2)) if lr else None
        ll = _LABEL_LOCAL.search(label_part)
        lh = None if (pm or lr or ll) else _LABEL_HOST.search(label_part)
        events = _classify(msg)
        host = pid = dev = None
        content_rank: int | None = None
        if pm:
            host, pid, dev = pm["host"], int(pm["pid"]), int(pm["dev"])
            key: str | None = f"{host}:{pid}[{dev}]"
            if label_rank is not None:
                self._label_to_key.setdefault(label_rank, key)
            if ll:
                self._local_label_last[ll.group(1)] = key
        elif label_rank is not None:
            key = self._label_to_key.get(label_rank, f"rank{label_rank}")
        elif ll:
            # torchrun's [defaultN] is a local rank, repeated on every node: a line without
            # NCCL's prefix goes to the process that last printed under the same label.
            key = self._local_label_last.get(ll.group(1), ll.group(1))
        elif lh:
            host = key = lh.group(1)
        else:
            key = _content_key(events)
            if key is not None:
                content_rank = int(key[4:])
            elif any(e[0] == "version" for e in events):
                key = previous
        info = self._info(key, host, pid, dev)
        if content_rank is not None and info.rank is None:
            info.rank = content_rank
        if label_rank is not None:
            info.rank = label_rank
            info.label = info.label or f"rank{label_rank}"
            self._rank_from_label[info.key] = label_rank
        elif ll and info.label is None:
            info.label = ll.group(1)
        info.lines += 1
        info.last_line = _cut(line)
        level = _MARK.search(line)
        if level and level.group(1) == "WARN":
            info.warns.append(_cut(line))
        if not events:
            self.log.unparsed_count += 1
        for event in events:
            self._apply(info, event, line)
        return key

    def _stage(self, info: RankInfo, name: str) -> None:
        info.stage = max(info.stage, STAGES.index(name))

    def _set_rank(self, info: RankInfo, rank: int, nranks: int) -> None:
        if info.key in self._rank_from_label:
            return
        if nranks > self._best_nranks.get(info.key, 0):
            self._best_nranks[info.key] = nranks
            info.rank = rank

    def _apply(self, info: RankInfo, event: tuple, line: str) -> None:
        kind = event[0]
        cut = _cut(line)
        if kind == "version":
            info.nccl_version = event[1]
            self._stage(info, "bootstrap")
        elif kind == "driver":
            info.cuda_driver = event[1]
        elif kind == "env":
            info.env[event[1]] = event[2]
            if event[1] == "NCCL_SOCKET_IFNAME":
                info.socket_ifname_env = event[2]
            info.evidence_lines.append(cut)
        elif kind == "bootstrap":
            info.bootstrap = event[1]
            info.evidence_lines.append(cut)
            self._stage(info, "bootstrap")
        elif kind == "net":
            _, net, devs, oob = event
            info.net = net
            info.net_devices = devs
            info.oob = oob
            info.socket_ifaces = _ifaces(" ".join(devs)) if net == "Socket" else []
            info.evidence_lines.append(cut)
            self._stage(info, "network")
        elif kind == "ib_nodev":
            info.ib_no_device = True
            info.evidence_lines.append(cut)
        elif kind == "network":
            info.network = event[1]
            info.evidence_lines.append(cut)
            self._stage(info, "network")
        elif kind == "init_start":
            info.init_starts += 1
            self._set_rank(info, event[1], event[2])
            info.nranks = max(info.nranks or 0, event[2])
            self._stage(info, "init-start")
        elif kind == "topo":
            _, rank, nranks, nnodes, local = event
            self._set_rank(info, rank, nranks)
            info.nranks = max(info.nranks or 0, nranks)
            info.n_nodes = max(info.n_nodes or 0, nnodes)
            info.local_ranks = max(info.local_ranks or 0, local)
            self._stage(info, "init-start")
        elif kind == "complete":
            done: InitComplete = event[1]
            done = InitComplete(done.comm, done.rank, done.nranks, done.cuda_dev, done.local_ranks, done.n_nodes, cut)
            info.init_complete.append(done)
            self._set_rank(info, done.rank, done.nranks)
            info.nranks = max(info.nranks or 0, done.nranks)
            if done.local_ranks:
                info.local_ranks = max(info.local_ranks or 0, done.local_ranks)
            if done.n_nodes:
                info.n_nodes = max(info.n_nodes or 0, done.n_nodes)
            self._stage(info, "init-complete")
        elif kind == "channel":
            ch: Channel = event[1]
            info.channels.append(Channel(ch.channel, ch.conn, ch.src, ch.dst, ch.direction, ch.via, cut))
            self._stage(info, "channels")
        elif kind == "connect":
            info.connect_errors.append(cut)
        elif kind == "no_iface":
            info.iface_errors.append(cut)
        elif kind == "mismatch":
            info.mismatch_lines.append(cut)
        elif kind == "ibverbs":
            info.ibverbs_lines.append(cut)
        elif kind == "abort":
            info.aborts += 1

    def finish(self) -> NcclLog:
        """Merge duplicate keys of one rank, then return the log.

        Lines of one rank that lack NCCL's prefix (``[rank1]:NCCL version ...``) fold into the
        prefixed key with the same label; a process's keys for another cudaDev that carry only
        pre-init lines (printed before ``torch.cuda.set_device``) fold into its main key.
        """
        for label_rank, full_key in self._label_to_key.items():
            bare = self.log.ranks.get(f"rank{label_rank}")
            if bare is not None and bare.host is None and full_key in self.log.ranks:
                _merge(self.log.ranks[full_key], bare)
                del self.log.ranks[bare.key]
        groups: dict[tuple[str, int], list[RankInfo]] = {}
        for info in self.log.ranks.values():
            if info.host is not None and info.pid is not None:
                groups.setdefault((info.host, info.pid), []).append(info)
        for members in groups.values():
            if len(members) < 2:
                continue
            main = max(members, key=lambda r: (r.stage, len(r.channels), r.lines))
            for other in members:
                if other is main or other.init_starts or other.init_complete or other.channels:
                    continue
                _merge(main, other)
                del self.log.ranks[other.key]
        return self.log


def _merge(into: RankInfo, other: RankInfo) -> None:
    """Fold everything ``other`` recorded into ``into`` (both describe the same rank)."""
    into.env = {**other.env, **into.env}
    for name in ("rank", "label", "nccl_version", "cuda_driver", "socket_ifname_env", "net", "oob", "network",
                 "nranks", "n_nodes", "local_ranks"):
        if getattr(into, name) is None and getattr(other, name) is not None:
            setattr(into, name, getattr(other, name))
    for name in ("bootstrap", "net_devices", "socket_ifaces"):
        if not getattr(into, name):
            setattr(into, name, getattr(other, name))
    into.ib_no_device = into.ib_no_device or other.ib_no_device
    for name in ("channels", "init_complete", "warns", "connect_errors", "iface_errors", "mismatch_lines",
                 "ibverbs_lines", "evidence_lines"):
        getattr(into, name).extend(getattr(other, name))
    into.init_starts += other.init_starts
    into.aborts += other.aborts
    into.lines += other.lines
    into.stage = max(into.stage, other.stage)


def _classify(msg: str) -> list[tuple]:
    """The facts one NCCL message carries, as ``(kind, ...)`` tuples (empty: not understood)."""
    events: list[tuple] = []
    m = _VERSION.search(msg)
    if m:
        events.append(("version", m.group(1)))
    if m := _DRIVER.match(msg):
        events.append(("driver", m.group(1)))
    if m := _ENV.match(msg):
        events.append(("env", m.group(1), m.group(2)))
    if m := _BOOTSTRAP.match(msg):
        events.append(("bootstrap", _ifaces(m.group(1))))
    if (m := _NET_USING.match(msg)) and m["net"] != "Plugin":
        devs_text, _, oob_text = m["devs"].partition("; OOB ")
        devs = [d for d in re.findall(r"\[\d+\]\S+", devs_text)] or devs_text.split()
        oob = _ifaces(oob_text)
        events.append(("net", m["net"], [d for d in devs if d != "[RO]"], oob[0] if oob else None))
    if _IB_NODEV.match(msg):
        events.append(("ib_nodev",))
    if m := _NETWORK.match(msg):
        events.append(("network", m.group(1)))
    if m := _TOPO.search(msg):
        events.append(("topo", int(m["rank"]), int(m["nranks"]), int(m["nnodes"]), int(m["local"])))
    elif m := _INIT.search(msg):
        if m["what"].upper() == "COMPLETE":
            rest = m["rest"]
            dev, local, nodes = _CUDADEV.search(rest), _LOCALRANKS.search(rest), _NNODES.search(rest)
            events.append(("complete", InitComplete(
                m["comm"], int(m["rank"]), int(m["nranks"]), int(dev.group(1)) if dev else None,
                int(local.group(1)) if local else None, int(nodes.group(1)) if nodes else None)))
        else:
            events.append(("init_start", int(m["rank"]), int(m["nranks"])))
    if m := _CHANNEL.match(msg):
        events.append(("channel", Channel(int(m["ch"]), int(m["conn"]) if m["conn"] is not None else None,
                                          int(m["src"]), int(m["dst"]), m["dir"], m["via"].strip())))
    if _CONNECT_ANY.search(msg):
        events.append(("connect",))
    if _NO_IFACE.search(msg):
        events.append(("no_iface",))
    if _MISMATCH.search(msg):
        events.append(("mismatch",))
    if _IBVERBS.search(msg):
        events.append(("ibverbs",))
    if _ABORT.search(msg):
        events.append(("abort",))
    return events


def _content_key(events: list[tuple]) -> str | None:
    """``rankN`` for a bare line that names its own rank (init, topology or channel line)."""
    for event in events:
        if event[0] in ("init_start", "topo"):
            return f"rank{event[1]}"
        if event[0] == "complete":
            return f"rank{event[1].rank}"
        if event[0] == "channel":
            return f"rank{event[1].own_rank}"
    return None


def parse(text: str, source: str = "<text>") -> NcclLog:
    """Parse ``NCCL_DEBUG=INFO`` output of any number of ranks and hosts.

    Args:
        text: the log (ranks interleaved; torchrun/project/host labels and timestamps allowed).
        source: name used in error messages (a file path).

    Returns:
        An :class:`NcclLog`.

    Raises:
        ValueError: ``text`` is not a str, or holds no NCCL line (names ``source``).
    """
    if not isinstance(text, str):
        raise ValueError(f"text: expected the log as str, got {type(text).__name__}")
    parser = _Parser()
    if parser.feed(text, source) == 0:
        raise ValueError(f"{source}: no NCCL lines found (was the job run with NCCL_DEBUG=INFO? "
                         f"NCCL lines look like 'host:pid:tid [dev] NCCL INFO ...')")
    return parser.finish()


def parse_files(paths: Sequence[str | Path]) -> NcclLog:
    """Parse several log files (one per node, say) into one :class:`NcclLog`.

    Raises:
        ValueError: no path given, a file cannot be read, or a file has no NCCL line (names it).
    """
    if not paths:
        raise ValueError("paths: give at least one log file")
    parser = _Parser()
    for path in paths:
        try:
            text = Path(path).read_text(encoding="utf-8", errors="replace")
        except OSError as exc:
            raise ValueError(f"{path}: cannot read the log ({exc.strerror or exc})") from exc
        if parser.feed(text, str(path)) == 0:
            raise ValueError(f"{path}: no NCCL lines found (was the job run with NCCL_DEBUG=INFO?)")
    return parser.finish()


# ---------------------------------------------------------------------------------------- verdicts

def _who(infos: Iterable[RankInfo]) -> str:
    parts = []
    for r in infos:
        if r.key == "?":
            parts.append("lines naming no rank")
            continue
        parts.append(f"rank {r.rank} ({r.key})" if r.rank is not None and r.key != f"rank{r.rank}" else
                     (f"rank {r.rank}" if r.rank is not None else r.key))
    return ", ".join(parts)


def _hosts(infos: Iterable[RankInfo]) -> list[str]:
    return sorted({r.host for r in infos if r.host})


def _evidence(lines: Iterable[str]) -> list[str]:
    out: list[str] = []
    for line in lines:
        if line not in out:
            out.append(line)
        if len(out) >= _EVIDENCE_MAX:
            break
    return out


def _by_topology(topology: str, multi: str, unknown: str, single: str) -> str:
    return {"multi-node": multi, "unknown": unknown, "single-node": single}[topology]


def _address_owners(log: NcclLog) -> dict[str, set[str]]:
    """IP address -> hosts whose bootstrap / socket / OOB interface has it."""
    owners: dict[str, set[str]] = {}
    for info in log.ranks.values():
        for iface in info.bootstrap + info.socket_ifaces + ([info.oob] if info.oob else []):
            if info.host:
                owners.setdefault(iface.ip, set()).add(info.host)
    return owners


def _check_interfaces(log: NcclLog, topology: str) -> list[Verdict]:
    """Bootstrap / NET/Socket / IB OOB bound to lo, docker0, virbr*, br-*, veth* (seed MN2)."""
    found: list[tuple[RankInfo, str, Iface, str]] = []
    shared = {ip: hosts for ip, hosts in _address_owners(log).items() if len(hosts) > 1}
    for info in log.all_infos():
        used = [("bootstrap", i) for i in info.bootstrap] + [("NET/Socket", i) for i in info.socket_ifaces]
        if info.oob is not None:
            used.append(("NET/IB OOB", info.oob))
        for role, iface in used:
            reason = bad_interface_reason(iface)
            if reason is None and iface.ip in shared:
                reason = f"{iface.ip} is advertised by {len(shared[iface.ip])} hosts: node-local"
            if reason:
                found.append((info, role, iface, reason))
    if not found:
        return []
    infos = list({id(f[0]): f[0] for f in found}.values())
    what = sorted({f"{role} on {iface.name} ({reason})" for _, role, iface, reason in found})
    envs = sorted({i.socket_ifname_env for i in infos if i.socket_ifname_env})
    severity = _by_topology(topology, "FAIL", "WARN", "INFO")
    scope = {"multi-node": "this multi-node job cannot reach the other nodes through it",
             "unknown": "node-local: fine on one node, unreachable from other nodes",
             "single-node": "harmless on one node, but the same settings will fail across nodes"}[topology]
    message = f"NCCL uses {', '.join(what)} for {_who(infos)}: {scope} (MN2)"
    env_note = (f"NCCL_SOCKET_IFNAME is set to {', '.join(envs)} by the environment: replace it; "
                if envs else "")
    fix = (f"{env_note}export NCCL_SOCKET_IFNAME=<data-plane iface prefix, e.g. eth/ens/ib> or "
           f"NCCL_SOCKET_IFNAME=^docker0,lo identically on every node, then check each rank's Bootstrap/NET line "
           f"names that NIC (multinode.md MN2)")
    evidence = _evidence(line for i in infos for line in i.evidence_lines
                         if "NCCL_SOCKET_IFNAME" in line or any(f"{iface.name}:" in line for _, _, iface, _ in found))
    return [Verdict("bad-interface", severity, message, [i.key for i in infos], _hosts(infos), evidence, fix)]


def _check_single_node_net(log: NcclLog, topology: str) -> list[Verdict]:
    """All ranks on one host but channels ``via NET/...``: the Gilbreth single-node trap (§6.3, §9.4)."""
    infos = [i for i in log.all_infos() if any(ch.kind == "NET" for ch in i.channels)]
    if topology != "single-node" or not infos:
        return []
    net_channels = [ch for i in infos for ch in i.channels if ch.kind == "NET"]
    pairs = sorted({(ch.src, ch.dst) for ch in net_channels})
    completed = [i for i in log.ranks.values() if i.completed]
    host = ", ".join(log.hosts) or "one host"
    disabled = sorted({f"{k}={v}" for i in log.all_infos() for k, v in i.env.items()
                       if k in ("NCCL_P2P_DISABLE", "NCCL_SHM_DISABLE") and v == "1"})
    host += f" ({', '.join(disabled)} set)" if disabled else ""
    message = (f"all ranks are on {host} yet {len(pairs)} connection(s) go via "
               f"{', '.join(sorted({ch.short for ch in net_channels}))} (e.g. {pairs[0][0]} -> {pairs[0][1]}): "
               f"the Gilbreth single-node trap, where {len(completed)} rank(s) print Init COMPLETE and the first "
               f"collective then times out (gilbreth-hpc-guide §6.3, §9.4)")
    evidence = _evidence([ch.line for ch in net_channels[:3]] +
                         [line for i in infos for line in i.evidence_lines if "Using network" in line][:1] +
                         [c.line for i in completed for c in i.init_complete][:2])
    return [Verdict("single-node-net-transport", "FAIL", message, [i.key for i in infos], _hosts(infos), evidence,
                    GILBRETH_SINGLE_NODE_FIX)]


def _check_ib_loaded(log: NcclLog, topology: str) -> list[Verdict]:
    """One node, ``Using network IB``, no NET channel: the start of the guide's 'incorrect' output (§6.3)."""
    if topology == "multi-node" or any(ch.kind == "NET" for i in log.all_infos() for ch in i.channels):
        return []
    infos = [i for i in log.all_infos() if (i.network or "").startswith("IB")]
    if not infos:
        return []
    message = ("NCCL loaded the IB network on a job with no inter-node traffic; gilbreth-hpc-guide §6.3 lists "
               "'Using network IB' as its incorrect single-node output: harmless if collectives complete")
    evidence = _evidence(line for i in infos for line in i.evidence_lines if "Using network" in line)
    fix = "only if collectives hang after Init COMPLETE: " + GILBRETH_SINGLE_NODE_FIX
    return [Verdict("single-node-ib-loaded", "INFO", message, [i.key for i in infos if i.key != "?"],
                    _hosts(infos), evidence, fix)]


def _check_ib_fallback(log: NcclLog, topology: str) -> list[Verdict]:
    """``NET/IB : No device found.`` then ``NET/Socket : Using``: TCP instead of InfiniBand (MN2)."""
    infos = [i for i in log.all_infos()
             if (i.ib_no_device or i.ibverbs_lines) and (i.net == "Socket" or i.network == "Socket")]
    if not infos:
        return []
    ifaces = sorted({f.name for i in infos for f in i.socket_ifaces})
    severity = _by_topology(topology, "WARN", "WARN", "INFO")
    message = (f"NET/IB found no usable device on {', '.join(_hosts(infos)) or _who(infos)}; NCCL fell back to TCP "
               f"sockets{' on ' + ', '.join(ifaces) if ifaces else ''}: inter-node collectives run over TCP, "
               f"often ~10x slower than InfiniBand (MN2)")
    fix = ("if the nodes have InfiniBand/RoCE, make the HCA visible (ibv_devinfo lists it; in containers pass "
           "/dev/infiniband and install libibverbs) and pin NCCL_IB_HCA=mlx5; if they are TCP-only, "
           "export NCCL_IB_DISABLE=1 to skip the IB probe (multinode.md MN2)")
    evidence = _evidence(line for i in infos for line in i.ibverbs_lines + i.evidence_lines
                         if "NET/" in line or "libibverbs" in line)
    return [Verdict("ib-fallback-socket", severity, message, [i.key for i in infos if i.key != "?"],
                    _hosts(infos), evidence, fix)]


def _check_connect(log: NcclLog) -> list[Verdict]:
    """``Connection refused`` / ``No route to host`` / ``connect ... failed`` / timed out."""
    infos = [i for i in log.all_infos() if i.connect_errors]
    if not infos:
        return []
    lines = [line for i in infos for line in i.connect_errors]
    reasons = [r for r in _CONNECT_REASONS if any(r in line for line in lines)] or ["connect failed"]
    owners = _address_owners(log)
    bad_ips = {iface.ip for info in log.all_infos()
               for iface in info.bootstrap + info.socket_ifaces + ([info.oob] if info.oob else [])
               if bad_interface_reason(iface) or len(owners.get(iface.ip, ())) > 1}
    dialed = []
    for line in lines:
        m = _DIALED.search(line)
        if m:
            addr = f"{m.group(1)}:{m.group(2)}"
            hosts = sorted(owners.get(m.group(1), ()))
            note = f" (advertised by {' and '.join(hosts)})" if hosts else ""
            note += " (node-local: see bad-interface)" if m.group(1) in bad_ips else ""
            if addr + note not in dialed:
                dialed.append(addr + note)
    hard = [i for i in infos if not i.completed or any(" NCCL WARN " in line for line in i.connect_errors)]
    severity = "FAIL" if hard or any(i.key == "?" for i in infos) else "WARN"
    transient = "" if severity == "FAIL" else " then connected (Init COMPLETE followed): transient"
    target = f" to {', '.join(dialed[:3])}" if dialed else ""
    message = f"{_who(infos)} could not connect{target}: {', '.join(reasons)}{transient}"
    if "Connection refused" in reasons:
        fix = ("nothing listens at that address: the peer died, or it advertised an address that is not its own "
               "on this network (docker0/lo, MN2); read the peer's log and Bootstrap line, and test the port with "
               "'nc -l PORT' there and 'nc IP PORT' here (NVIDIA/nccl-tests#162)")
    else:
        fix = ("this host cannot reach that address: the peer advertised a NIC not routable from here or a "
               "firewall drops the ports; pin NCCL_SOCKET_IFNAME to the shared data-plane network (MN2) and test "
               "with 'nc -l PORT' there and 'nc IP PORT' here (NVIDIA/nccl-tests#162)")
    return [Verdict("connect-failed", severity, message, [i.key for i in infos if i.key != "?"], _hosts(infos),
                    _evidence(lines), fix)]


def _check_no_interface(log: NcclLog) -> list[Verdict]:
    """``Bootstrap : no socket interface found`` / ``NET/Socket : No usable listening interface found``."""
    infos = [i for i in log.all_infos() if i.iface_errors]
    if not infos:
        return []
    envs = sorted({i.socket_ifname_env for i in infos if i.socket_ifname_env})
    where = ", ".join(_hosts(infos)) or "this host"
    listening = any("listening" in line or "same subnet" in line for i in infos for line in i.iface_errors)
    if envs:
        message = f"NCCL_SOCKET_IFNAME={','.join(envs)} matches no interface on {where}: NCCL cannot bootstrap"
    else:
        message = f"NCCL found no usable socket interface on {where}: it cannot bootstrap"
    fix = ("unset NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME so NCCL auto-detects (interface names differ per "
           "node, e.g. ibp65s0 vs ibp161s0), or use a prefix present on every node "
           "(gilbreth-hpc-guide §8.12 Failure Mode 2, §9.2)")
    if listening:
        message += "; no local interface is in the subnet of the NCCL_COMM_ID address"
        fix += "; point NCCL_COMM_ID/MASTER_ADDR at an address on this node's network"
    evidence = _evidence([line for i in infos for line in i.evidence_lines if "NCCL_SOCKET_IFNAME" in line] +
                         [line for i in infos for line in i.iface_errors])
    return [Verdict("no-interface", "FAIL", message, [i.key for i in infos if i.key != "?"], _hosts(infos),
                    evidence, fix)]


def _check_init(log: NcclLog, explained_hosts: set[str] = frozenset()) -> list[Verdict]:
    """A rank whose log stops before Init COMPLETE while others completed: its host is the culprit (MN1)."""
    ranks = list(log.ranks.values())
    done = [r for r in ranks if r.completed]
    stuck = [r for r in ranks if not r.completed]
    fix = ("on that host: systemctl status nvidia-fabricmanager (must be active, version = driver), nvidia-smi for "
           "GPU errors; restart the service or relaunch without that node (multinode.md MN1)")
    if done and stuck:
        stages = sorted({r.stage_name for r in stuck})
        message = (f"{_who(stuck)} on {', '.join(_hosts(stuck)) or 'unknown host'} stopped before Init COMPLETE "
                   f"(last stage: {', '.join(stages)}) while {len(done)} rank(s) completed: "
                   f"that host is the culprit (MN1)")
        evidence = _evidence([f"last line of {r.key}: {r.last_line}" for r in stuck] +
                             [done[0].init_complete[0].line])
        return [Verdict("init-incomplete", "FAIL", message, [r.key for r in stuck], _hosts(stuck), evidence, fix)]
    if not ranks or done:
        return []
    by_host: dict[str, int] = {}
    for r in ranks:
        if r.host:
            by_host[r.host] = max(by_host.get(r.host, 0), r.stage)
    if len(by_host) >= 2 and len(set(by_host.values())) > 1:
        low = min(by_host.values())
        first = sorted(h for h, s in by_host.items() if s == low)
        high = STAGES[max(by_host.values())]
        culprits = [r for r in ranks if r.host in first]
        if set(first) <= explained_hosts:
            return []
        message = (f"no rank reached Init COMPLETE; {', '.join(first)} stopped earliest (stage {STAGES[low]}) while "
                   f"other hosts reached {high}: the host whose log stops first is the suspect (MN1)")
        evidence = _evidence(f"last line of {r.key}: {r.last_line}" for r in culprits)
        return [Verdict("init-incomplete", "WARN", message, [r.key for r in culprits], first, evidence, fix)]
    return [Verdict("no-init-complete", "INFO",
                    f"no rank printed Init COMPLETE ({len(ranks)} rank(s) seen): the log is cut short, or every rank "
                    f"stopped in init (see the other verdicts)", [r.key for r in ranks], _hosts(ranks),
                    _evidence(f"last line of {r.key}: {r.last_line}" for r in ranks[:3]),
                    "check for 'Init COMPLETE' per rank (gilbreth-hpc-guide §9.3, §9.4); rerun with NCCL_DEBUG=INFO "
                    "to the end of init")]


def _check_versions(log: NcclLog) -> list[Verdict]:
    """Different NCCL versions across ranks (version lines or NCCL's own mismatch warning)."""
    versions: dict[str, list[RankInfo]] = {}
    for info in log.all_infos():
        if info.nccl_version:
            versions.setdefault(_base_version(info.nccl_version), []).append(info)
    mismatch = [i for i in log.all_infos() if i.mismatch_lines]
    if len(versions) < 2 and not mismatch:
        return []
    parts = [f"{v} on {', '.join(_hosts(infos)) or _who(infos)}" for v, infos in sorted(versions.items())]
    pairs: set[tuple[tuple[int, str], ...]] = set()
    for info in mismatch:
        for line in info.mismatch_lines:
            m = _MISMATCH.search(line)
            if m:
                pairs.add(tuple(sorted([(int(m.group(1)), _version_code(int(m.group(2)))),
                                        (int(m.group(3)), _version_code(int(m.group(4))))])))
    parts += [", ".join(f"rank {r} runs {v}" for r, v in pair) for pair in sorted(pairs)]
    involved = list({id(i): i for i in [i for v in versions.values() for i in v] + mismatch}.values())
    message = f"mixed NCCL versions: {'; '.join(parts[:4])}: every rank must run the same NCCL"
    fix = ("run one NCCL build everywhere: the same container image or torch wheel on every node (compare "
           "python -c 'import torch; print(torch.cuda.nccl.version())' per node; NVIDIA/nccl#286)")
    evidence = _evidence([i.last_line for i in involved if i.nccl_version and "version" in i.last_line] +
                         [line for i in mismatch for line in i.mismatch_lines] +
                         [f"{i.key}: NCCL version {i.nccl_version}" for i in involved if i.nccl_version])
    return [Verdict("mixed-nccl-version", "FAIL", message, [i.key for i in involved if i.key != "?"],
                    _hosts(involved), evidence, fix)]


def _check_other_warns(log: NcclLog, verdicts: list[Verdict]) -> list[Verdict]:
    """WARN lines no verdict above used, listed as INFO so none is lost."""
    used = {line for v in verdicts for line in v.evidence}
    rest: list[tuple[RankInfo, str]] = []
    for info in log.all_infos():
        consumed = set(info.connect_errors + info.iface_errors + info.mismatch_lines + info.ibverbs_lines)
        rest += [(info, line) for line in info.warns if line not in used and line not in consumed]
    if not rest:
        return []
    infos = list({id(i): i for i, _ in rest}.values())
    return [Verdict("other-warnings", "INFO", f"{len(rest)} other NCCL WARN line(s) from {_who(infos)}",
                    [i.key for i in infos if i.key != "?"], _hosts(infos), _evidence(line for _, line in rest),
                    "read them in full; search the message in https://github.com/NVIDIA/nccl/issues")]


def interpret(log: NcclLog) -> list[Verdict]:
    """Verdicts for a parsed log, FAIL first, then WARN, then INFO.

    A healthy multi-node log (IB found, P2P/SHM within a node, NET/IB across nodes, every rank
    at Init COMPLETE, one NCCL version, data-plane interfaces) yields no FAIL or WARN.

    Raises:
        ValueError: ``log`` is not an :class:`NcclLog`.
    """
    if not isinstance(log, NcclLog):
        raise ValueError(f"log: expected an NcclLog from parse(), got {type(log).__name__}")
    topology = log.topology()
    verdicts = (_check_interfaces(log, topology) + _check_no_interface(log) + _check_connect(log) +
                _check_single_node_net(log, topology) + _check_ib_fallback(log, topology) + _check_versions(log))
    explained = {h for v in verdicts if v.severity == "FAIL" for h in v.hosts}
    verdicts += _check_init(log, explained) + _check_ib_loaded(log, topology)
    verdicts += _check_other_warns(log, verdicts)
    return sorted(verdicts, key=lambda v: SEVERITIES.index(v.severity))


# ------------------------------------------------------------------------------------------ output

def render(log: NcclLog, verdicts: Sequence[Verdict]) -> str:
    """Human summary: a header, one table row per rank, then ``[SEV] id: message -> fix`` lines.

    Each verdict line is followed by its evidence, indented with ``    | ``.
    """
    header = (f"nccl-log: {len(log.ranks)} rank(s) on {len(log.hosts) or 'unknown'} host(s), {log.topology()}; "
              f"{log.lines_seen} lines read, {log.nccl_lines} NCCL, {log.unparsed_count} not interpreted")
    columns = ("key", "rank", "host", "nccl", "bootstrap", "net", "transports", "init")
    rows = []
    for r in log.ranks.values():
        init = (f"COMPLETE x{len(r.init_complete)}" if r.completed else f"stopped at {r.stage_name}")
        net = r.net or r.network or "-"
        if r.net and r.net_devices:
            net += " " + " ".join(r.net_devices[:2]) + (" ..." if len(r.net_devices) > 2 else "")
        rows.append((r.key, "-" if r.rank is None else str(r.rank), r.host or "-", r.nccl_version or "-",
                     " ".join(str(i) for i in r.bootstrap[:2]) or "-", net, ",".join(r.transports()) or "-", init))
    widths = [max([len(c)] + [len(row[k]) for row in rows]) for k, c in enumerate(columns)]
    out = [header, "  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    out += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows]
    if not rows:
        out.append("(no line names a rank or host)")
    out.append("")
    if not verdicts:
        out.append("[OK] no finding")
    for v in verdicts:
        out.append(f"[{v.severity}] {v.id}: {v.message} -> {v.fix}")
        out += [f"    | {line}" for line in v.evidence]
    return "\n".join(out) + "\n"


def to_json(log: NcclLog, verdicts: Sequence[Verdict]) -> dict:
    """The machine-readable form of :func:`render` (what ``--json`` prints)."""
    return {"sources": log.sources, "topology": log.topology(), "hosts": log.hosts, "lines_seen": log.lines_seen,
            "nccl_lines": log.nccl_lines, "unparsed_count": log.unparsed_count,
            "ranks": {k: r.summary() for k, r in log.ranks.items()},
            "unattributed": log.unattributed.summary() if log.unattributed.lines else None,
            "verdicts": [asdict(v) for v in verdicts]}


def _add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("files", nargs="+", metavar="FILE", help="NCCL_DEBUG=INFO log(s); several = one job")
    parser.add_argument("--json", action="store_true", help="print JSON (ranks and verdicts) instead of text")


def _run(args: argparse.Namespace) -> int:
    """Parse, interpret and print; return 1 on a FAIL verdict, 2 on unreadable input, else 0."""
    try:
        log = parse_files(args.files)
    except ValueError as exc:
        print(f"nccl-log: {exc}", file=sys.stderr)
        return 2
    verdicts = interpret(log)
    if args.json:
        print(json.dumps(to_json(log, verdicts), indent=2))
    else:
        print(render(log, verdicts), end="")
    return 1 if any(v.severity == "FAIL" for v in verdicts) else 0


def add_cli(subparsers: argparse._SubParsersAction) -> None:
    """Register the ``nccl-log`` sub-command on an argparse sub-parsers object.

    The sub-command sets ``func`` to a callable taking the parsed namespace and returning
    the exit status (the convention of ``helpers.cli``).
    """
    p = subparsers.add_parser("nccl-log", help="interpret NCCL_DEBUG=INFO logs: per-rank table and verdicts",
                              description=__doc__.split("\n\n")[0])
    _add_arguments(p)
    p.set_defaults(func=_run)


def main(argv: Sequence[str] | None = None) -> int:
    """``nccl-log FILE [FILE...] [--json]``: exit 1 on any FAIL verdict, 2 on unreadable input, else 0."""
    parser = argparse.ArgumentParser(prog="nccl-log", description=__doc__.split("\n\n")[0])
    _add_arguments(parser)
    return _run(parser.parse_args(list(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    sys.exit(main())
