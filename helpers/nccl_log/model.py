"""The model of a parsed log: :class:`RankInfo` per rank, :class:`NcclLog` for the whole job, and the limits.

Standard library only (plus :mod:`helpers.ifnames` for node-local interfaces); nothing runs at import.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import lru_cache

from helpers import ifnames
from helpers.checks import STATUSES

SEVERITIES = tuple(reversed(STATUSES))
TOPOLOGIES = ("single-node", "multi-node", "unknown")

# Stages of communicator setup a rank's log can reach, in order (used to find the rank
# that stopped first, seed MN1).
STAGES = ("none", "bootstrap", "network", "init-start", "channels", "init-complete")
_STAGE_INDEX = {name: i for i, name in enumerate(STAGES)}

GILBRETH_SINGLE_NODE_FIX = ("confirm with 'env | grep -E \"NCCL_(P2P|SHM)_DISABLE\"' (a leftover =1 forces NET between GPUs of "
                            "one node); unset NCCL_P2P_DISABLE and NCCL_SHM_DISABLE, export NCCL_IB_DISABLE=1 "
                            "NCCL_NET_DISABLE_INTRA=1 NCCL_P2P_LEVEL=NVL NCCL_SHM_DISABLE=0 for single-node jobs "
                            "(Gilbreth 6.3); channels then read 'via P2P/...' or 'via SHM/direct/direct'")
"""The single-node fix of the Gilbreth guide (§6.3 "Required Environment Variables"), corrected against NCCL's
source: the guide also sets ``NCCL_NET_DISABLE=1``, a variable NCCL never reads (no ``NET_DISABLE`` parameter in
any release since 2.18; ``helpers/data/nccl_sites.json`` lists the variables NCCL reads); the one that keeps NET
off between GPUs of one node is ``NCCL_NET_DISABLE_INTRA`` (``NCCL_PARAM(NetDisableIntra, "NET_DISABLE_INTRA", 0)``
in ``src/graph/paths.cc``: ``ncclTopoCheckNet`` then never picks NET inside a node)."""

_EVIDENCE_MAX = 6
_LINE_MAX = 400          # evidence lines are cut to this many characters
_SCAN_MAX = 4000         # regexes look at most at this many characters of a message
_READ_MAX = 20000        # input lines are cut to this many characters
_KEEP_MAX = 20           # per rank, at most this many lines of each kind are kept (counters count all)
_CHANNELS_MAX = 4096     # distinct channel lines kept per rank
_MEMO_MAX = 50000        # entries per memo table of the parser
_VERDICT_LIST_MAX = 32   # ranks/hosts a verdict lists (values ranks_total/hosts_total count them all)

@dataclass(frozen=True, slots=True)
class Iface:
    """A network interface as NCCL prints it: ``[0]eth0:10.0.0.1<0>``.

    Attributes:
        name: interface name (``eth0``, ``ibp65s0``, ``docker0``, ``lo``).
        address: what follows the colon (``10.0.0.1<0>``; for IB devices ``1/IB``: port/link).
        index: the ``[i]`` index NCCL gives it in a list, None when printed alone.
        ip: the address without NCCL's ``<port>`` suffix (``10.0.0.1``), worked out once (verdicts read it for
            every rank of a big log).
    """

    name: str
    address: str
    index: int | None = None
    ip: str = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "ip", self.address.split("<", 1)[0])

    def __str__(self) -> str:
        return f"{self.name}:{self.address}"


@dataclass(frozen=True, slots=True)
class Channel:
    """One ``Channel NN/c : a[d] -> b[d] [send|receive] via TRANSPORT`` line.

    Attributes:
        channel: channel number; conn: connection index after the slash (None in old NCCL).
        src, dst: communicator ranks of the two ends (the rank numbers the line gives).
        direction: ``send``/``receive`` (NET lines) or None (P2P/SHM lines, printed by the sender).
        via: the transport text after ``via`` (``P2P/CUMEM/read``, ``SHM/direct/direct``,
            ``NET/IB/0/GDRDMA``, ``NET/Socket/0``, ``P2P/direct pointer``).
        line: the log line, for evidence.
        src_dev, dst_dev: the device the line gives in brackets for each end, as printed: the NVML (physical)
            index in NCCL 2.4 and 2.18+, the PCI busId in hex in 2.5-2.17, the CUDA device in 2.3
            (``src/transport/p2p.cc`` at each release tag); "" when not printed.
    Source: NCCL transport/p2p.cc, shm.cc, net.cc connection messages; Gilbreth 9.4.
    """

    channel: int
    conn: int | None
    src: int
    dst: int
    direction: str | None
    via: str
    line: str = ""
    src_dev: str = ""
    dst_dev: str = ""

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


@dataclass(frozen=True, slots=True)
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


@dataclass(slots=True)
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
        init_complete_count: ``Init COMPLETE`` lines seen (``init_complete`` keeps the first few).
        warn_count: WARN lines seen (``warns`` and the other line lists keep the first few only, so a
            200 MB log stays in bounded memory); net_plugin: True when a net plugin (``libnccl-net.so``,
            IBext) was loaded, False when NCCL said none was found, None when not printed.
        catalog: catalog id -> lines of this rank that matched it (see :func:`load_catalog`).
        error_chain: the source files (``bootstrap``, ``init``, ``socket``...) of NCCL's error-return lines
            (``bootstrap.cc:701 -> 6``) this rank printed, in order: where a failure propagated.
        gids: RoCE GIDs its queue pairs use, from ``NET/IB: ... GID %ld (%lX/%lX)`` (``net_ib.cc``; RoCE only):
            ``(gid index, subnet prefix, interface id)``, both halves as printed (hex of the raw GID bytes read as
            a little-endian uint64: ``80FE`` is ``fe80::``); gid_lines: those lines (a few).
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
    warn_count: int = 0
    init_complete_count: int = 0
    net_plugin: bool | None = None
    catalog: dict[str, int] = field(default_factory=dict)
    error_chain: list[str] = field(default_factory=list)
    gids: list[tuple[int, str, str]] = field(default_factory=list)
    gid_lines: list[str] = field(default_factory=list)
    _channel_keys: set[tuple] = field(default_factory=set, repr=False, compare=False)

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
            "init_starts": self.init_starts, "init_complete": [asdict(c) for c in self.init_complete[:3]],
            "init_complete_count": self.init_complete_count,
            "nranks": self.nranks, "n_nodes": self.n_nodes, "local_ranks": self.local_ranks,
            "warns": self.warns[:3], "warn_count": self.warn_count, "net_plugin": self.net_plugin,
            "catalog": self.catalog, "error_chain": self.error_chain, "stage": self.stage_name, "lines": self.lines, "last_line": self.last_line,
        }


@dataclass(slots=True)
class NcclLog:
    """A parsed log.

    Attributes:
        ranks: :class:`RankInfo` per key (see :attr:`RankInfo.key`), in order of first appearance.
        unattributed: facts from NCCL lines that name no rank or host (key ``?``); verdicts read it
            but it is not a rank (it never counts as a rank stuck in init).
        lines_seen: input lines read (all files); nccl_lines: those recognised as NCCL output.
        unparsed_count: NCCL lines none of the patterns above used (topology dumps, tuning...).
        sources: names of the inputs (file paths, or ``<text>``).
        sites: generated-site index -> :class:`CatalogHit` (NCCL WARN lines, and INFO lines that report a failure or a
            hint, each matched to the source site that prints it; -1 gathers WARN lines no site matches).
        catalog: catalog id -> :class:`CatalogHit` (every input line a catalog pattern matched,
            NCCL-prefixed or not: ``Last error:`` quotes and nccl-tests CUDA errors count too).
        problems: one line per input that could not be read (``parse_files(..., problems=[])``).
        nccl_tests_summaries: ``# Avg bus bandwidth`` lines (one per nccl-tests run; several in one run: processes
            that ran alone).
        reconstructed: lines that carried the corpus's ``  # reconstructed`` marker (stripped).
        nccl_tests_ranks: rank -> host from nccl-tests' device table (``#  Rank  0 Group  0 Pid ... on HOST device``):
            every rank of the job, printed by rank 0.
    """

    ranks: dict[str, RankInfo] = field(default_factory=dict)
    unattributed: RankInfo = field(default_factory=lambda: RankInfo(key="?"))
    lines_seen: int = 0
    nccl_lines: int = 0
    unparsed_count: int = 0
    sources: list[str] = field(default_factory=list)
    catalog: dict[str, CatalogHit] = field(default_factory=dict)
    sites: dict[int, CatalogHit] = field(default_factory=dict)
    nccl_tests_summaries: int = 0
    problems: list[str] = field(default_factory=list)
    reconstructed: int = 0
    nccl_tests_ranks: dict[int, str] = field(default_factory=dict)

    def all_infos(self) -> list[RankInfo]:
        """The ranks plus :attr:`unattributed` when it holds anything."""
        extra = [self.unattributed] if self.unattributed.lines else []
        return list(self.ranks.values()) + extra

    @property
    def hosts(self) -> list[str]:
        """Distinct hosts named by the ranks, sorted."""
        return sorted({r.host for r in self.ranks.values() if r.host})

    def machines(self) -> dict[str, set[str]]:
        """Hostname -> the distinct routable bootstrap addresses its ranks announced.

        Two machines can share a hostname (both called ``user``): their ranks differ by bootstrap
        address, so a hostname with two addresses is two machines (issue 15).  Node-local
        interfaces (:func:`bad_interface_reason`) do not count.
        """
        out: dict[str, set[str]] = {}
        for r in self.ranks.values():
            if r.host:
                ips = {i.ip for i in r.bootstrap[:1] if not bad_interface_reason(i)}
                out.setdefault(r.host, set()).update(ips)
        return out

    def machine_count(self) -> int:
        """Distinct machines: hostnames, counting a hostname announced from several addresses once per address."""
        return sum(max(1, len(ips)) for ips in self.machines().values())

    def topology(self) -> str:
        """``single-node``, ``multi-node`` or ``unknown``, from what the lines prove.

        Multi-node: more than one host, or ``nNodes`` > 1, or (one host in this file) a
        communicator larger than the ranks this host shows (one node's log of a bigger job).
        Single-node: one host and none of that, or ``nNodes 1``, or nccl-tests' device table (every rank of the job)
        on one host.  Unknown: no host information
        (bare excerpts) and no ``nNodes``.
        """
        infos = list(self.ranks.values())
        n_nodes = max((r.n_nodes for r in infos if r.n_nodes), default=None)
        hosts = self.hosts
        tested = set(self.nccl_tests_ranks.values())
        if len(hosts) > 1 or (n_nodes or 0) > 1 or self.machine_count() > 1 or len(tested) > 1:
            return "multi-node"
        # a NET connection to a rank this log does not show: the peer lives on another node
        known = {r.rank for r in infos if r.rank is not None}
        if any(ch.kind == "NET" and not {ch.src, ch.dst} <= known for r in infos for ch in r.channels):
            return "multi-node"
        if n_nodes == 1 or tested and (not hosts or set(hosts) <= tested):
            return "single-node"  # nccl-tests' device table lists every rank of the job: all on one host
        if len(hosts) == 1:
            on_host = [r for r in infos if r.host]
            world = max((c.nranks for r in infos for c in r.init_complete), default=0)
            local = max((r.local_ranks for r in infos if r.local_ranks), default=None)
            if (local is not None and world > local) or world > len(on_host):
                return "multi-node"
            return "single-node"
        return "unknown"


@dataclass(slots=True)
class CatalogHit:
    """Lines of a log that matched one catalog entry.

    Attributes:
        entry: the catalog entry (``id``, ``severity``, ``pattern``, ``cause``, ``fix``, ``source``).
        count: matching lines; evidence: the first few of them; keys: rank keys (``?`` when none);
        hosts: their hosts; first: the input line number (1-based, counted over all inputs) of the first matching
        line, and firsts the same per rank key of ``keys``, so verdicts can tell which failure a rank printed first.
    """

    entry: dict[str, str]
    count: int = 0
    evidence: list[str] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)
    first: int = 0
    firsts: dict[str, int] = field(default_factory=dict)



# ----------------------------------------------------------------------------------------- parsing

def bad_interface_reason(iface: Iface) -> str | None:
    """Why ``iface`` cannot carry traffic between nodes, or None: :func:`helpers.ifnames.node_local_reason`.

    The one list the command builder, the pre-flight and this interpreter share (loopback, Docker,
    libvirt and CNI bridges, veth pairs; seed MN2).  Worked out once per distinct name and address (the verdicts
    ask it for every rank of a big log).
    """
    return _node_local_reason(iface.name, iface.ip)


@lru_cache(maxsize=8192)
def _node_local_reason(name: str, ip: str) -> str | None:
    return ifnames.node_local_reason(name, ip)


def _cut(line: str) -> str:
    return line if len(line) <= _LINE_MAX else line[:_LINE_MAX] + "..."


def _version_code(code: int) -> str:
    """NCCL_VERSION_CODE (``22105``) as ``2.21.5``; codes below 10000 use the pre-2.9 scheme."""
    if code >= 10000:
        return f"{code // 10000}.{code % 10000 // 100}.{code % 100}"
    return f"{code // 1000}.{code % 1000 // 100}.{code % 100}"


def _base_version(version: str) -> str:
    return version.split("+", 1)[0]

