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
MN1, MN2, Gilbreth 4.1, Gilbreth 6.3, Gilbreth 8.3, Gilbreth 8.12, Gilbreth 9.2, Gilbreth 9.4 (docs/sources.md).

Known failure messages (``/dev/shm`` full, ``Duplicate GPU detected``, NVLS/fabric manager, CUDA
802, ``AF_INET`` family errors, IB completion errors, ``wrong type 4 != 3``...) come from a catalog
in data, ``helpers/data/nccl_catalog.yaml`` (:func:`load_catalog`), each entry backed by a public
issue whose cause was confirmed; cross-host verdicts compare networks, net plugins, announced and
dialled addresses, hostnames (hosts are told apart by host + pid + bootstrap address) and
``NCCL_HOSTID``.  Inputs are streamed (``-`` is stdin) with bounded memory; an unreadable input is
reported in one line while the others are read (issue 15; docs/nccl-log.md has the scored corpus).

Nothing runs at import; the standard library only, plus PyYAML when the catalog is first loaded.
"""

from __future__ import annotations

import io
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from functools import lru_cache
from pathlib import Path
from typing import IO, Any

from helpers import ifnames
from helpers.checks import NOT_OK, Check

SEVERITIES = ("FAIL", "WARN", "INFO", "OK")
TOPOLOGIES = ("single-node", "multi-node", "unknown")

# Stages of communicator setup a rank's log can reach, in order (used to find the rank
# that stopped first, seed MN1).
STAGES = ("none", "bootstrap", "network", "init-start", "channels", "init-complete")
_STAGE_INDEX = {name: i for i, name in enumerate(STAGES)}

GILBRETH_SINGLE_NODE_FIX = ("export NCCL_IB_DISABLE=1 NCCL_NET_DISABLE=1 NCCL_P2P_LEVEL=NVL NCCL_SHM_DISABLE=0 "
                            "for single-node jobs (Gilbreth 6.3, also Gilbreth 4.1 and Gilbreth 9.2); channels then "
                            "read 'via SHM/direct/direct' or 'via P2P/...'")
"""The single-node fix exactly as the Gilbreth guide gives it (§6.3 "Required Environment
Variables").  Note: ``NCCL_NET_DISABLE`` is not in NCCL's documented variable list
(https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html); the guide sets it and we
quote the guide verbatim."""

_EVIDENCE_MAX = 6
_LINE_MAX = 400          # evidence lines are cut to this many characters
_SCAN_MAX = 4000         # regexes look at most at this many characters of a message
_READ_MAX = 20000        # input lines are cut to this many characters
_KEEP_MAX = 20           # per rank, at most this many lines of each kind are kept (counters count all)
_CHANNELS_MAX = 4096     # distinct channel lines kept per rank
_MEMO_MAX = 50000        # entries per memo table of the parser
_VERDICT_LIST_MAX = 32   # ranks/hosts a verdict lists (values ranks_total/hosts_total count them all)

_ANSI = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")
_MARK = re.compile(r"\bNCCL (INFO|WARN|TRACE|ABORT)\b ?")
# NCCL <= 2.3 printed WARN lines without the NCCL marker: "include/socket.h:344 WARN Socket creation failed"
_OLD_WARN = re.compile(r"(?:^|\s)[\w/.\-]+\.(?:cc|cu|h|c|cpp):\d+ WARN ")
_RECONSTRUCTED = "  # reconstructed"
_PREFIX = re.compile(r"(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] (?:(?P<src>\S+:\d+) )?$")
_BARE_HEAD = re.compile(
    r"(?:(?<=\s)|(?<=:)|^)(?:Bootstrap ?: |NET/[\w.\-]+ ?: |(?:Channel|Ring) \d+(?:/\d+)? : \d+\[|"
    r"(?:\w+ )?comm \S+ rank \d+ n[Rr]anks \d+|NCCL version \d|socket\w+: |Call to connect |"
    r"Mismatched NCCL version )")
_PREFIX_ANY = re.compile(r"(?P<host>[^\s:\[\]]+):(?P<pid>\d+):(?P<tid>\d+) \[(?P<dev>\d+)\] ")
_LABEL_RANK = re.compile(r"\[rank(\d+)\]:|\[rank (\d+)\]")
_LABEL_LOCAL = re.compile(r"\[(default\d+)\]:")
_LABEL_HOST = re.compile(r"(?:^|\s)([A-Za-z][\w.\-]*): *$")

_VERSION = re.compile(r"NCCL version (\d+\.\d+\.\d+(?:\+[\w.]+)?)")
_DRIVER = re.compile(r"^cudaDriverVersion (\d+)")
_ENV = re.compile(r"^(NCCL_\w+) set by environment to (\S+?)\.?$")
_BOOTSTRAP = re.compile(r"^Bootstrap ?: Using (.+)$")
_NET_USING = re.compile(r"^NET/(?P<net>[\w.\-]+) ?: Using (?!interface )(?P<devs>.+)$")
_OLD_SIDEBAND = re.compile(r"^NET/IB ?: Using interface (\S+) for sideband")
_OLD_NET_IFACE = re.compile(r"^NET ?: Using interface (\S+)")
_OLD_INTERNAL = re.compile(r"^Using internal Network (\w+)")
_PLUGIN_OK = re.compile(r"^NET/Plugin ?: ?(?:Loaded|Plugin loaded|Using) (?!internal)|^Using network (?:IBext|AWS|Libfabric|COLLNET)")
_PLUGIN_NONE = re.compile(r"^NET/Plugin ?: ?(?:No plugin found|Plugin load \(?\S*\)? ?returned|Failed to find|dlerror)")
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
_NO_IFACE = re.compile(r"Socket creation failed : Address family not supported|Bootstrap ?: no socket interface found|NET/Socket ?: No usable listening interface found|"
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
    Source: NCCL transport/p2p.cc, shm.cc, net.cc connection messages; Gilbreth 9.4.
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
        init_complete_count: ``Init COMPLETE`` lines seen (``init_complete`` keeps the first few).
        warn_count: WARN lines seen (``warns`` and the other line lists keep the first few only, so a
            200 MB log stays in bounded memory); net_plugin: True when a net plugin (``libnccl-net.so``,
            IBext) was loaded, False when NCCL said none was found, None when not printed.
        catalog: catalog id -> lines of this rank that matched it (see :func:`load_catalog`).
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
            "catalog": self.catalog, "stage": self.stage_name, "lines": self.lines, "last_line": self.last_line,
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
        catalog: catalog id -> :class:`CatalogHit` (every input line a catalog pattern matched,
            NCCL-prefixed or not: ``Last error:`` quotes and nccl-tests CUDA errors count too).
        problems: one line per input that could not be read (``parse_files(..., problems=[])``).
        reconstructed: lines that carried the corpus's ``  # reconstructed`` marker (stripped).
    """

    ranks: dict[str, RankInfo] = field(default_factory=dict)
    unattributed: RankInfo = field(default_factory=lambda: RankInfo(key="?"))
    lines_seen: int = 0
    nccl_lines: int = 0
    unparsed_count: int = 0
    sources: list[str] = field(default_factory=list)
    catalog: dict[str, CatalogHit] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    reconstructed: int = 0

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
        Single-node: one host and none of that, or ``nNodes 1``.  Unknown: no host information
        (bare excerpts) and no ``nNodes``.
        """
        infos = list(self.ranks.values())
        n_nodes = max((r.n_nodes for r in infos if r.n_nodes), default=None)
        hosts = self.hosts
        if len(hosts) > 1 or (n_nodes or 0) > 1 or self.machine_count() > 1:
            return "multi-node"
        # a NET connection to a rank this log does not show: the peer lives on another node
        known = {r.rank for r in infos if r.rank is not None}
        if any(ch.kind == "NET" and not {ch.src, ch.dst} <= known for r in infos for ch in r.channels):
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
class CatalogHit:
    """Lines of a log that matched one catalog entry.

    Attributes:
        entry: the catalog entry (``id``, ``severity``, ``pattern``, ``cause``, ``fix``, ``source``).
        count: matching lines; evidence: the first few of them; keys: rank keys (``?`` when none);
        hosts: their hosts.
    """

    entry: dict[str, str]
    count: int = 0
    evidence: list[str] = field(default_factory=list)
    keys: list[str] = field(default_factory=list)
    hosts: list[str] = field(default_factory=list)


CATALOG_PATH = Path(__file__).parent / "data" / "nccl_catalog.yaml"
"""The catalog of known NCCL/CUDA failure messages (package data, YAML)."""

_CATALOG_FIELDS = ("id", "severity", "pattern", "cause", "fix", "source")
# Cheap substring filter: a line is matched against the catalog only if it holds one of these.
_CATALOG_KEYS = ("WARN", "rror", "ailure", "ailed", "detected", "initialized", "violation", "mismatch", "checked in",
                 "AF_INET", "wrong type", "vendor err", "NVLS", "nvls")


@lru_cache(maxsize=4)
def load_catalog(path: str | None = None) -> tuple[dict[str, str], ...]:
    """The catalog entries, in file order (the first entry whose pattern matches a line wins).

    Args:
        path: a YAML file with a list of entries; None: :data:`CATALOG_PATH`.
    Returns:
        A tuple of dicts with the keys ``id, severity, pattern, cause, fix, source``.
    Raises:
        ValueError: the file is not a list of entries with those keys, a severity is not one of
            :data:`SEVERITIES`, a pattern does not compile, or an id repeats (names the entry).
    """
    import yaml  # only when a log is interpreted

    data = yaml.safe_load(Path(path or CATALOG_PATH).read_text(encoding="utf-8"))
    if not isinstance(data, list):
        raise ValueError(f"{path or CATALOG_PATH}: expected a list of catalog entries")
    seen: set[str] = set()
    out = []
    for n, entry in enumerate(data):
        missing = [k for k in _CATALOG_FIELDS if not isinstance(entry, dict) or not entry.get(k)]
        if missing:
            raise ValueError(f"catalog entry {n}: missing {', '.join(missing)}; each entry needs {', '.join(_CATALOG_FIELDS)}")
        if entry["severity"] not in SEVERITIES:
            raise ValueError(f"catalog entry {entry['id']}: severity={entry['severity']!r}; accepted values are "
                             f"{', '.join(SEVERITIES)}")
        if entry["id"] in seen:
            raise ValueError(f"catalog entry {entry['id']}: id repeats")
        try:
            re.compile(entry["pattern"])
        except re.error as exc:
            raise ValueError(f"catalog entry {entry['id']}: pattern does not compile ({exc})") from exc
        seen.add(entry["id"])
        out.append({k: str(entry[k]) for k in _CATALOG_FIELDS})
    return tuple(out)


@lru_cache(maxsize=4)
def _catalog_regex(path: str | None = None) -> re.Pattern[str]:
    """All catalog patterns as one alternation; the named group that matched is ``g<index>``."""
    return re.compile("|".join(f"(?P<g{i}>{e['pattern']})" for i, e in enumerate(load_catalog(path))))


class Verdict(Check):
    """One finding of the interpreter: a :class:`helpers.checks.Check` built with the log's words.

    The constructor keeps the interpreter's historical keywords; the record is a plain ``Check``
    (``status``/``title``/``remediation``; aliases ``severity``/``message``/``fix``), so it goes into
    any report of the project unchanged.

    Args:
        id: stable identifier (``bad-interface``, ``connect-failed``, a catalog id such as ``shm-full``...).
        severity: ``FAIL`` (the job cannot work), ``WARN`` (works badly / suspect), ``INFO`` or ``OK``.
        message: one line naming the cause (the check's ``title``).
        ranks: keys of the :class:`RankInfo` involved; hosts: their hosts (the WARN/FAIL ``faulty`` nodes).
        evidence: log lines that show it (a few, cut to 400 characters).
        fix: the command that confirms the cause on the node, then the change (``remediation``).
        source: URL or seed id the rule comes from.
        values: extra measured values (counts...).
    Raises:
        ValueError: ``severity`` not one of :data:`SEVERITIES` (names the accepted values), or an empty id.
    """

    def __init__(self, id: str, severity: str, message: str, ranks: Sequence[str] | None = None,
                 hosts: Sequence[str] | None = None, evidence: Sequence[str] | None = None, fix: str = "",
                 source: str = "", values: dict[str, Any] | None = None) -> None:
        if severity not in SEVERITIES:
            raise ValueError(f"severity={severity!r}: accepted values are {', '.join(SEVERITIES)}")
        all_ranks, all_hosts = list(ranks or []), list(hosts or [])
        self.ranks = all_ranks[:_VERDICT_LIST_MAX]
        self.hosts = all_hosts[:_VERDICT_LIST_MAX]
        vals = {"ranks": self.ranks, "hosts": self.hosts, **(values or {})}
        if len(all_ranks) > len(self.ranks) or len(all_hosts) > len(self.hosts):
            vals.update(ranks_total=len(all_ranks), hosts_total=len(all_hosts))
        super().__init__(id=id, title=message, status=severity, values=vals, remediation=fix, source=source,
                         evidence=list(evidence or []), node=self.hosts[0] if len(self.hosts) == 1 else "",
                         faulty=list(self.hosts) if severity in NOT_OK else [])

    def to_dict(self) -> dict[str, Any]:
        """The Check's JSON form plus the interpreter's keys (``severity``, ``message``, ``fix``, ``ranks``, ``hosts``)."""
        out = super().to_dict()
        out.update(severity=self.status, message=self.title, fix=self.remediation, ranks=self.ranks, hosts=self.hosts)
        return out


# ----------------------------------------------------------------------------------------- parsing

def bad_interface_reason(iface: Iface) -> str | None:
    """Why ``iface`` cannot carry traffic between nodes, or None: :func:`helpers.ifnames.node_local_reason`.

    The one list the command builder, the pre-flight and this interpreter share (loopback, Docker,
    libvirt and CNI bridges, veth pairs; seed MN2).
    """
    return ifnames.node_local_reason(iface.name, iface.ip)


def _ifaces(text: str) -> list[Iface]:
    """Interfaces of a ``[0]eth0:10.0.0.1<0> [1]ib0:...`` or ``eth0:10.0.0.1<0>`` list."""
    out = []
    for m in _IFACE.finditer(text):
        out.append(Iface(m["name"], m["addr"], int(m["idx"]) if m["idx"] is not None else None))
    return out


def _keep(bucket: list[str], line: str) -> None:
    """Append ``line`` unless ``bucket`` already holds ``_KEEP_MAX`` lines (bounded memory)."""
    if len(bucket) < _KEEP_MAX:
        bucket.append(line)


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
        # memo tables (bounded): big logs repeat the same heads and messages millions of times
        self._heads: dict[str, tuple] = {}
        self._hits: dict[str, tuple[int | None, tuple[str, str, bool] | None, list[tuple]]] = {}
        # head ("host:pid:tid [dev] ", with any label) -> its rank, for heads whose attribution never changes
        # (NCCL's prefix, no torchrun local label); cleared by finish(), which merges records
        self._rank_of: dict[str, RankInfo] = {}

    def _info(self, key: str | None, host: str | None = None, pid: int | None = None,
              dev: int | None = None) -> RankInfo:
        if key is None:
            return self.log.unattributed
        info = self.log.ranks.get(key)
        if info is None:
            info = self.log.ranks[key] = RankInfo(key=key, host=host, pid=pid, cuda_dev=dev)
        return info

    def feed(self, lines: Iterable[str], source: str) -> int:
        """Read ``lines`` one at a time (a file object streams); return how many were NCCL or catalog lines.

        Lines longer than ``_READ_MAX`` characters are cut; nothing but counters and a few
        examples per kind is kept, so memory stays bounded on a log of any size.  The loop is the
        hot path of a 200 MB log (2.4 M lines): what depends only on the text after the
        ``host:pid:tid [dev] `` prefix (catalog hit, NCCL split, events) is worked out once per
        distinct text (``_hits``), a head seen before maps straight to its rank (:meth:`_line`), and the
        per-line work is slicing and dict lookups.
        """
        self.log.sources.append(source)
        previous: str | None = None
        count = nccl = seen = 0
        catalog = _catalog_regex()
        log = self.log
        hits = self._hits
        on_line = self._line
        try:
            for raw in lines:
                seen += 1
                line = (raw if len(raw) <= _READ_MAX else raw[:_READ_MAX]).rstrip()
                if "\x1b" in line:
                    line = _ANSI.sub("", line).rstrip()
                if not line:
                    continue
                first = line[0]
                if first == "#" or (first in " \t" and line.lstrip().startswith("#")):
                    continue
                if _RECONSTRUCTED in line:
                    line = line.split(_RECONSTRUCTED, 1)[0].rstrip()
                    log.reconstructed += 1
                k = line.find("] ", 0, 200)
                if k >= 0:
                    pre = line[:k]
                    if "NCCL" in pre or " : " in pre or " [" not in pre:
                        k = -1      # not a "host:pid:tid [dev] " prefix (a bare "Channel 00 : 0[0] -> ..." line)
                ckey = line[k + 2:k + 2 + _SCAN_MAX] if k >= 0 else line[:_SCAN_MAX]
                memo = hits.get(ckey)
                if memo is None:
                    memo = self._memo(ckey, catalog)
                hit, rel, events = memo
                if rel is None:
                    if hit is not None:
                        count += 1
                        pm = _PREFIX_ANY.search(line[:300])
                        info = (self._info(f"{pm['host']}:{pm['pid']}[{pm['dev']}]", pm["host"], int(pm["pid"]),
                                           int(pm["dev"])) if pm else log.unattributed)
                        info.lines += 1
                        info.last_line = _cut(line)
                        self._catalog_hit(hit, line, info)
                    continue
                count += 1
                nccl += 1
                previous, info = on_line(line, (line[:k + 2] + rel[0]) if k >= 0 else rel[0], events, previous, rel[2])
                if hit is not None:
                    self._catalog_hit(hit, line, info)
        finally:
            log.lines_seen += seen
            log.nccl_lines += nccl
        return count

    def _memo(self, ckey: str, catalog: re.Pattern[str]) -> tuple:
        """``(catalog entry index or None, NCCL split of ckey or None, events of its message)``, memoised (bounded)."""
        hit = None
        if any(word in ckey for word in _CATALOG_KEYS):
            m = catalog.search(ckey)
            hit = int(m.lastgroup[1:]) if m and m.lastgroup else None
        rel = None
        if "NCCL" in ckey or "WARN " in ckey or _BARE_HEAD.search(ckey[:600]):
            rel = self._split(ckey)
        events = _classify(rel[1][:_SCAN_MAX]) if rel is not None else []
        if len(self._hits) >= _MEMO_MAX:
            self._hits.clear()
        memo = self._hits[ckey] = (hit, rel, events)
        return memo

    def _catalog_hit(self, index: int, line: str, info: RankInfo) -> None:
        entry = load_catalog()[index]
        hit = self.log.catalog.get(entry["id"])
        if hit is None:
            hit = self.log.catalog[entry["id"]] = CatalogHit(entry)
        hit.count += 1
        info.catalog[entry["id"]] = info.catalog.get(entry["id"], 0) + 1
        if len(hit.evidence) < _EVIDENCE_MAX and _cut(line) not in hit.evidence:
            hit.evidence.append(_cut(line))
        if info.key not in hit.keys and len(hit.keys) < _KEEP_MAX:
            hit.keys.append(info.key)
        if info.host and info.host not in hit.hosts and len(hit.hosts) < _KEEP_MAX:
            hit.hosts.append(info.host)

    @staticmethod
    def _split(line: str) -> tuple[str, str, bool] | None:
        """(text before the message, the message, is-a-WARN) or None when the line is not NCCL output."""
        m = _MARK.search(line)
        if m:
            return line[:m.start()], line[m.end():].strip(), m.group(1) == "WARN"
        o = _OLD_WARN.search(line[:300])
        if o:
            cut = o.end() - len("WARN ")
            return line[:cut], line[o.end():].strip(), True
        b = _BARE_HEAD.search(line[:600])
        if b:
            return line[:b.start()], line[b.start():].strip(), False
        return None

    def _line(self, line: str, head: str, events: list[tuple], previous: str | None,
              warn: bool = False) -> tuple[str | None, RankInfo]:
        """Attribute one NCCL line to a rank and record its ``events`` (:func:`_classify` of its message).

        A head (``host:pid:tid [dev] `` with any label) seen before maps straight to its rank
        (``_rank_of``); otherwise :meth:`_attribute` works it out.  Returns the key used and its record.
        """
        info = self._rank_of.get(head)
        if info is None:
            key, info = self._attribute(head, events, previous)
        else:
            key = info.key
        info.lines += 1
        cut = line if len(line) <= _LINE_MAX else _cut(line)
        info.last_line = cut
        if warn:
            info.warn_count += 1
            if len(info.warns) < _KEEP_MAX:
                info.warns.append(cut)
        if not events:
            self.log.unparsed_count += 1
        for event in events:
            self._apply(info, event, cut)
        return key, info

    def _attribute(self, head: str, events: list[tuple], previous: str | None) -> tuple[str | None, RankInfo]:
        """The key and record of the rank a line with this ``head`` belongs to (labels, prefix, content, the previous line).

        Heads whose attribution never changes (NCCL's prefix, no torchrun local label) are remembered in ``_rank_of``.
        """
        tail = head[-300:]
        parsed = self._heads.get(tail)
        if parsed is None:
            parsed = _parse_head(tail)
            if len(self._heads) >= _MEMO_MAX:
                self._heads.clear()
            self._heads[tail] = parsed
        pm, label_rank, ll, lh, pkey = parsed
        host = pid = dev = None
        content_rank: int | None = None
        if pm:
            host, pid, dev = pm
            key: str | None = pkey
            if label_rank is not None:
                self._label_to_key.setdefault(label_rank, key)
            if ll:
                self._local_label_last[ll] = key
        elif label_rank is not None:
            key = self._label_to_key.get(label_rank, f"rank{label_rank}")
        elif ll:
            # torchrun's [defaultN] is a local rank, repeated on every node: a line without
            # NCCL's prefix goes to the process that last printed under the same label.
            key = self._local_label_last.get(ll, ll)
        elif lh:
            host = key = lh
        else:
            key = _content_key(events)
            if key is not None:
                content_rank = int(key[4:])
            elif any(e[0] == "version" for e in events):
                key = previous
        info = self.log.ranks.get(key) if key is not None else None
        if info is None:
            info = self._info(key, host, pid, dev)
        if content_rank is not None and info.rank is None:
            info.rank = content_rank
        if label_rank is not None:
            info.rank = label_rank
            info.label = info.label or f"rank{label_rank}"
            self._rank_from_label[info.key] = label_rank
        elif ll and info.label is None:
            info.label = ll
        if pm and not ll:
            if len(self._rank_of) >= _MEMO_MAX:
                self._rank_of.clear()
            self._rank_of[head] = info
        return key, info

    def _stage(self, info: RankInfo, name: str) -> None:
        stage = _STAGE_INDEX[name]
        if stage > info.stage:
            info.stage = stage

    def _set_rank(self, info: RankInfo, rank: int, nranks: int) -> None:
        if info.key in self._rank_from_label:
            return
        if nranks > self._best_nranks.get(info.key, 0):
            self._best_nranks[info.key] = nranks
            info.rank = rank

    def _apply(self, info: RankInfo, event: tuple, line: str) -> None:
        """Record one event of a line (``line`` already cut to ``_LINE_MAX``)."""
        kind = event[0]
        cut = line
        if kind == "channel":  # the most frequent kind in a big log: tested first
            ch: Channel = event[1]
            ckey = (ch.channel, ch.conn, ch.src, ch.dst, ch.direction, ch.via)
            if ckey not in info._channel_keys and len(info._channel_keys) < _CHANNELS_MAX:
                info._channel_keys.add(ckey)
                info.channels.append(Channel(ch.channel, ch.conn, ch.src, ch.dst, ch.direction, ch.via, cut))
            self._stage(info, "channels")
        elif kind == "version":
            info.nccl_version = event[1]
            self._stage(info, "bootstrap")
        elif kind == "driver":
            info.cuda_driver = event[1]
        elif kind == "env":
            info.env[event[1]] = event[2]
            if event[1] == "NCCL_SOCKET_IFNAME":
                info.socket_ifname_env = event[2]
            _keep(info.evidence_lines, cut)
        elif kind == "bootstrap":
            info.bootstrap = event[1]
            _keep(info.evidence_lines, cut)
            self._stage(info, "bootstrap")
        elif kind == "net":
            _, net, devs, oob = event
            info.net = net
            info.net_devices = devs
            info.oob = oob
            info.socket_ifaces = _ifaces(" ".join(devs)) if net == "Socket" else []
            _keep(info.evidence_lines, cut)
            self._stage(info, "network")
        elif kind == "ib_nodev":
            info.ib_no_device = True
            _keep(info.evidence_lines, cut)
        elif kind == "network":
            info.network = event[1]
            _keep(info.evidence_lines, cut)
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
            info.init_complete_count += 1
            if len(info.init_complete) < _KEEP_MAX:
                info.init_complete.append(done)
            self._set_rank(info, done.rank, done.nranks)
            info.nranks = max(info.nranks or 0, done.nranks)
            if done.local_ranks:
                info.local_ranks = max(info.local_ranks or 0, done.local_ranks)
            if done.n_nodes:
                info.n_nodes = max(info.n_nodes or 0, done.n_nodes)
            self._stage(info, "init-complete")
        elif kind == "connect":
            _keep(info.connect_errors, cut)
        elif kind == "no_iface":
            _keep(info.iface_errors, cut)
        elif kind == "mismatch":
            _keep(info.mismatch_lines, cut)
        elif kind == "ibverbs":
            _keep(info.ibverbs_lines, cut)
        elif kind == "abort":
            info.aborts += 1
        elif kind == "plugin":
            info.net_plugin = bool(info.net_plugin) or event[1]
        elif kind == "oob":
            info.oob = event[1]
            _keep(info.evidence_lines, cut)
        elif kind == "old_iface":
            if not info.bootstrap:
                info.bootstrap = event[1]
            _keep(info.evidence_lines, cut)

    def finish(self) -> NcclLog:
        """Merge duplicate keys of one rank, then return the log.

        Lines of one rank that lack NCCL's prefix (``[rank1]:NCCL version ...``) fold into the
        prefixed key with the same label; a process's keys for another cudaDev that carry only
        pre-init lines (printed before ``torch.cuda.set_device``) fold into its main key.
        """
        self._rank_of.clear()
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


def _parse_head(tail: str) -> tuple:
    """(``(host, pid, dev)`` or None, label rank or None, torchrun local label or None, host label or None)."""
    pm = _PREFIX.search(tail)
    label_part = tail[:pm.start()] if pm else tail
    lr = _LABEL_RANK.search(label_part)
    label_rank = int(lr.group(1) or lr.group(2)) if lr else None
    ll = _LABEL_LOCAL.search(label_part)
    lh = None if (pm or lr or ll) else _LABEL_HOST.search(label_part)
    prefix = (pm["host"], int(pm["pid"]), int(pm["dev"])) if pm else None
    key = f"{pm['host']}:{int(pm['pid'])}[{int(pm['dev'])}]" if pm else None
    return prefix, label_rank, ll.group(1) if ll else None, lh.group(1) if lh else None, key


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
    into.warn_count += other.warn_count
    into.init_complete_count += other.init_complete_count
    if other.net_plugin is not None:
        into.net_plugin = bool(into.net_plugin) or other.net_plugin
    for cid, n in other.catalog.items():
        into.catalog[cid] = into.catalog.get(cid, 0) + n
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
    if m := _OLD_SIDEBAND.match(msg):
        oob = _ifaces(m.group(1)) or [Iface(m.group(1).split(":", 1)[0], "")]
        events.append(("oob", oob[0]))
    if m := _OLD_NET_IFACE.match(msg):
        events.append(("old_iface", _ifaces(m.group(1))))
    if m := _OLD_INTERNAL.match(msg):
        events.append(("network", m.group(1)))
    if _PLUGIN_OK.search(msg):
        events.append(("plugin", True))
    elif _PLUGIN_NONE.search(msg):
        events.append(("plugin", False))
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
        ValueError: ``text`` is not a str, or holds no NCCL line and no catalog line (names ``source``).
    """
    if not isinstance(text, str):
        raise ValueError(f"text: expected the log as str, got {type(text).__name__}")
    parser = _Parser()
    if parser.feed(io.StringIO(text), source) == 0:
        raise ValueError(f"{source}: no NCCL lines found (was the job run with NCCL_DEBUG=INFO? "
                         f"NCCL lines look like 'host:pid:tid [dev] NCCL INFO ...')")
    return parser.finish()


def _open_problem(path: str) -> str | None:
    """Why ``path`` cannot be read as a text log (missing, a directory, empty, gzip, binary), or None."""
    p = Path(path)
    if not p.exists():
        return f"{path}: cannot read the log (no such file)"
    if p.is_dir():
        return f"{path}: cannot read the log (a directory; give the log files inside it)"
    try:
        with p.open("rb") as fh:
            head = fh.read(8192)
    except OSError as exc:
        return f"{path}: cannot read the log ({exc.strerror or exc})"
    if not head:
        return f"{path}: empty file (no NCCL lines)"
    if head[:2] == b"\x1f\x8b":
        return f"{path}: gzip-compressed; decompress it first (zcat {path} | runbook nccl-log -)"
    if b"\x00" in head:
        return f"{path}: binary file, not a text log"
    return None


def _feed_one(parser: _Parser, path: str | Path, stdin: IO[str] | None) -> str | None:
    """Feed one input (``-`` = ``stdin``) to ``parser``; return its problem line or None."""
    name = str(path)
    if name == "-":
        stream = stdin if stdin is not None else sys.stdin
        return None if parser.feed(stream, "<stdin>") else "<stdin>: no NCCL lines found (was the job run with NCCL_DEBUG=INFO?)"
    problem = _open_problem(name)
    if problem:
        return problem
    try:
        with open(name, encoding="utf-8", errors="replace") as fh:
            if parser.feed(fh, name) == 0:
                return f"{name}: no NCCL lines found (was the job run with NCCL_DEBUG=INFO?)"
    except OSError as exc:
        return f"{name}: cannot read the log ({exc.strerror or exc})"
    return None


def parse_files(paths: Sequence[str | Path], problems: list[str] | None = None,
                stdin: IO[str] | None = None) -> NcclLog:
    """Parse several log files (one per node, say) into one :class:`NcclLog`, streaming each file.

    Args:
        paths: log files; ``-`` reads ``stdin`` (default ``sys.stdin``).
        problems: when a list is given, an unreadable input (missing, directory, empty, gzip, binary,
            no NCCL line) appends one line naming it and the other inputs are still read; when None
            the first such input raises.
        stdin: the stream ``-`` reads (tests pass a StringIO).

    Returns:
        The parsed log; its :attr:`NcclLog.problems` holds the problem lines too.

    Raises:
        ValueError: no path given; with ``problems=None``, an input that cannot be read; with a
            list, every input could not be read (names them).
    """
    if not paths:
        raise ValueError("paths: give at least one log file (or - for stdin)")
    parser = _Parser()
    found: list[str] = []
    for path in paths:
        problem = _feed_one(parser, path, stdin)
        if problem:
            if problems is None:
                raise ValueError(problem)
            found.append(problem)
            problems.append(problem)
    if len(found) == len(paths):
        raise ValueError("; ".join(found))
    log = parser.finish()
    log.problems = found
    return log


# ---------------------------------------------------------------------------------------- verdicts

_WHO_MAX = 6


def _names(items: Sequence[str]) -> str:
    """``a, b, c`` for at most :data:`_WHO_MAX` items, then ``and N more``."""
    more = len(items) - _WHO_MAX
    return ", ".join(items[:_WHO_MAX]) + (f" and {more} more" if more > 0 else "")


def _who(infos: Iterable[RankInfo]) -> str:
    infos = list(infos)
    more = len(infos) - _WHO_MAX
    parts = []
    for r in infos[:_WHO_MAX]:
        if r.key == "?":
            parts.append("lines naming no rank")
            continue
        parts.append(f"rank {r.rank} ({r.key})" if r.rank is not None and r.key != f"rank{r.rank}" else
                     (f"rank {r.rank}" if r.rank is not None else r.key))
    return ", ".join(parts) + (f" and {more} more" if more > 0 else "")


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
    """IP address -> hosts whose bootstrap / socket / OOB interface has it (:func:`interpret` works it out once)."""
    owners: dict[str, set[str]] = {}
    for info in log.ranks.values():
        for iface in info.bootstrap + info.socket_ifaces + ([info.oob] if info.oob else []):
            if info.host:
                owners.setdefault(iface.ip, set()).add(info.host)
    return owners


def _check_interfaces(log: NcclLog, topology: str, owners: Mapping[str, set[str]]) -> list[Verdict]:
    """Bootstrap / NET/Socket / IB OOB bound to lo, docker0, virbr*, br-*, veth* (seed MN2)."""
    found: list[tuple[RankInfo, str, Iface, str]] = []
    shared = {ip: hosts for ip, hosts in owners.items() if len(hosts) > 1}
    for info in log.all_infos():
        used = [("bootstrap", i) for i in info.bootstrap] + [("NET/Socket", i) for i in info.socket_ifaces]
        if info.oob is not None:
            used.append(("NET/IB OOB", info.oob))
        for role, iface in used:
            reason = bad_interface_reason(iface)
            if reason is not None and iface.ip in shared:
                reason += f"), ({iface.ip} is advertised by {len(shared[iface.ip])} hosts"
            if reason:
                found.append((info, role, iface, reason))
    if not found:
        return []
    infos = list({id(f[0]): f[0] for f in found}.values())
    names = {iface.name for _, _, iface, _ in found}
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
           f"names that NIC (MN2)")
    evidence = _evidence(line for i in infos for line in i.evidence_lines
                         if "NCCL_SOCKET_IFNAME" in line or any(f"{n}:" in line for n in names))
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
               f"collective then times out (Gilbreth 6.3, Gilbreth 9.4)")
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
    message = ("NCCL loaded the IB network on a job with no inter-node traffic; Gilbreth 6.3 lists "
               "'Using network IB' as its incorrect single-node output: harmless if collectives complete")
    evidence = _evidence(line for i in infos for line in i.evidence_lines if "Using network" in line)
    fix = "only if collectives hang after Init COMPLETE: " + GILBRETH_SINGLE_NODE_FIX
    return [Verdict("single-node-ib-loaded", "INFO", message, [i.key for i in infos if i.key != "?"],
                    _hosts(infos), evidence, fix)]


def _is_ib(info: RankInfo) -> bool:
    return bool((info.net or "").startswith("IB") or (info.network or "").startswith("IB")
                or any("/IB" in d or "/RoCE" in d for d in info.net_devices))


def _ib_expected(log: NcclLog) -> str:
    """Evidence that an IB device or plugin was expected (a line to quote), or "" when none.

    Evidence: some rank uses IB/IBext or lists IB/RoCE devices, a net plugin was loaded,
    ``NCCL_IB_HCA`` is set or ``NCCL_IB_DISABLE=0`` is set explicitly, or the bootstrap/OOB
    interface is an IPoIB one (``ib*``).  Without it, ``NET/IB : No device found`` is the normal
    path of an Ethernet-only cluster (issue 15: the note fired on most logs).
    """
    for info in log.all_infos():
        if _is_ib(info):
            return f"{info.key} uses {info.net or info.network} ({', '.join(info.net_devices[:2])})"
        if info.net_plugin:
            return f"{info.key} loaded a net plugin"
        for name in ("NCCL_IB_HCA", "NCCL_IB_DISABLE"):
            if name in info.env and not (name == "NCCL_IB_DISABLE" and info.env[name] != "0"):
                return f"{info.key}: {name}={info.env[name]} set by environment"
        for iface in info.bootstrap[:1] + ([info.oob] if info.oob else []):
            if re.match(r"ib", iface.name):
                return f"{info.key} bootstraps on the IPoIB interface {iface.name}"
    return ""


def _check_ib_fallback(log: NcclLog, topology: str) -> list[Verdict]:
    """``NET/IB : No device found.`` then ``NET/Socket : Using``: TCP instead of InfiniBand (MN2)."""
    infos = [i for i in log.all_infos()
             if (i.ib_no_device or i.ibverbs_lines) and (i.net == "Socket" or i.network == "Socket")]
    expected = _ib_expected(log)
    if not infos or not expected:
        return []
    ifaces = sorted({f.name for i in infos for f in i.socket_ifaces})
    severity = _by_topology(topology, "WARN", "WARN", "INFO")
    message = (f"NET/IB found no usable device on {_names(_hosts(infos)) or _who(infos)}; NCCL fell back to TCP "
               f"sockets{' on ' + ', '.join(ifaces) if ifaces else ''}: inter-node collectives run over TCP, "
               f"often ~10x slower than InfiniBand (MN2)")
    fix = ("if the nodes have InfiniBand/RoCE, make the HCA visible (ibv_devinfo lists it; in containers pass "
           "/dev/infiniband and install libibverbs) and pin NCCL_IB_HCA=mlx5; if they are TCP-only, "
           "export NCCL_IB_DISABLE=1 to skip the IB probe (MN2)")
    evidence = _evidence([expected] + [line for i in infos for line in i.ibverbs_lines + i.evidence_lines
                                       if "NET/" in line or "libibverbs" in line])
    return [Verdict("ib-fallback-socket", severity, message, [i.key for i in infos if i.key != "?"],
                    _hosts(infos), evidence, fix)]


def _check_connect(log: NcclLog, owners: Mapping[str, set[str]]) -> list[Verdict]:
    """``Connection refused`` / ``No route to host`` / ``connect ... failed`` / timed out."""
    infos = [i for i in log.all_infos() if i.connect_errors]
    if not infos:
        return []
    lines = [line for i in infos for line in i.connect_errors]
    reasons = [r for r in _CONNECT_REASONS if any(r in line for line in lines)] or ["connect failed"]
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
    where = _names(_hosts(infos)) or "this host"
    listening = any("listening" in line or "same subnet" in line for i in infos for line in i.iface_errors)
    if envs:
        message = f"NCCL_SOCKET_IFNAME={','.join(envs)} matches no interface on {where}: NCCL cannot bootstrap"
    else:
        message = f"NCCL found no usable socket interface on {where}: it cannot bootstrap"
    fix = ("unset NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME so NCCL auto-detects (interface names differ per "
           "node, e.g. ibp65s0 vs ibp161s0), or use a prefix present on every node "
           "(Gilbreth 8.12 failure mode 2, Gilbreth 9.2)")
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
           "GPU errors; restart the service or relaunch without that node (MN1)")
    if done and stuck:
        stages = sorted({r.stage_name for r in stuck})
        message = (f"{_who(stuck)} on {_names(_hosts(stuck)) or 'unknown host'} stopped before Init COMPLETE "
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
    if len(by_host) >= 2 and len(set(by_host.values())) > 1 and max(by_host.values()) >= STAGES.index("init-start"):
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
                    "check for 'Init COMPLETE' per rank (Gilbreth 9.3, Gilbreth 9.4); rerun with NCCL_DEBUG=INFO "
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
    parts = [f"{v} on {_names(_hosts(infos)) or _who(infos)}" for v, infos in sorted(versions.items())]
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
    extra = 0
    for info in log.all_infos():
        consumed = set(info.connect_errors + info.iface_errors + info.mismatch_lines + info.ibverbs_lines)
        mine = [(info, line) for line in info.warns if line not in used and line not in consumed]
        rest += mine
        if mine:
            extra += max(0, info.warn_count - len(info.warns) - sum(info.catalog.values()))
    if not rest:
        return []
    infos = list({id(i): i for i, _ in rest}.values())
    return [Verdict("other-warnings", "INFO", f"{len(rest) + extra} other NCCL WARN line(s) from {_who(infos)}",
                    [i.key for i in infos if i.key != "?"], _hosts(infos), _evidence(line for _, line in rest),
                    "read them in full; search the message in https://github.com/NVIDIA/nccl/issues")]


def _check_catalog(log: NcclLog) -> list[Verdict]:
    """One verdict per catalog entry some line matched: its cause, the confirming command and fix."""
    out = []
    for cid, hit in log.catalog.items():
        e = hit.entry
        keys = [k for k in hit.keys if k != "?"]
        where = f" on {', '.join(hit.hosts)}" if hit.hosts else ""
        message = f"{e['cause']} ({hit.count} line(s){where})"
        out.append(Verdict(cid, e["severity"], message, keys, hit.hosts, hit.evidence, e["fix"], e["source"],
                           {"lines": hit.count}))
    return out


def _check_cross_host(log: NcclLog, owners: Mapping[str, set[str]]) -> list[Verdict]:
    """Compare hosts: network (IB vs sockets), net plugin, hostname collisions, shared addresses, NCCL_HOSTID.

    Sources: https://github.com/NVIDIA/nccl-tests/issues/188 (IB on one node, sockets on the other),
    https://github.com/NVIDIA/nccl/issues/879 (NCCL_HOSTID shared by two nodes),
    https://github.com/NVIDIA/nccl/issues/324 (containers of one host seen as two nodes).
    """
    out: list[Verdict] = []
    ranks = list(log.ranks.values())
    nets: dict[str, set[str]] = {}
    for r in ranks:
        if r.host and (r.net or r.network):
            nets.setdefault("IB" if _is_ib(r) else (r.net or r.network or "?"), set()).add(r.host)
    if "IB" in nets and "Socket" in nets and nets["IB"] != nets["Socket"]:
        ib, sock = sorted(nets["IB"] - nets["Socket"]), sorted(nets["Socket"] - nets["IB"])
        if ib and sock:
            both = set(ib) | set(sock)
            out.append(Verdict(
                "mixed-network", "FAIL",
                f"{_names(ib)} use InfiniBand while {_names(sock)} use TCP sockets: the hosts cannot connect "
                f"(NCCL fails with 'wrong type' or hangs)", [r.key for r in ranks if r.host in both],
                ib + sock, _evidence(line for r in ranks for line in r.evidence_lines if "Using network" in line
                                     or "NET/" in line),
                "confirm with 'ibv_devinfo' on every node (same HCAs, PORT_ACTIVE, devices visible in the container); "
                "make IB work on all nodes, or export NCCL_IB_DISABLE=1 on every node", "https://github.com/NVIDIA/nccl-tests/issues/188"))
    loaded = sorted({r.host for r in ranks if r.host and r.net_plugin})
    missing = sorted({r.host for r in ranks if r.host and r.net_plugin is False} - set(loaded))
    if loaded and missing:
        out.append(Verdict(
            "net-plugin-partial", "WARN",
            f"a net plugin (libnccl-net.so / IBext) is loaded on {_names(loaded)} but not on {_names(missing)}: "
            f"the hosts run different network code", [r.key for r in ranks if r.host in set(loaded) | set(missing)],
            loaded + missing, _evidence(r.last_line for r in ranks if r.host in missing),
            "confirm with 'ldconfig -p | grep nccl-net' and 'echo $LD_LIBRARY_PATH' on each node (or the container image); "
            "install the same plugin everywhere or set NCCL_NET_PLUGIN=none everywhere", "https://github.com/NVIDIA/nccl/issues/1412"))
    for host, ips in sorted(log.machines().items()):
        if len(ips) > 1:
            out.append(Verdict(
                "hostname-collision", "INFO",
                f"hostname {host} is used by {len(ips)} machines ({', '.join(sorted(ips))}): they are told apart by "
                f"bootstrap address, and the job counts as multi-node", [r.key for r in ranks if r.host == host], [host],
                _evidence(line for r in ranks if r.host == host for line in r.evidence_lines if "Bootstrap" in line),
                "give each machine its own hostname (hostnamectl set-hostname) so logs and NCCL's host hash tell them apart",
                "issue 15"))
    bad_ips = {i.ip for r in ranks for i in r.bootstrap if bad_interface_reason(i)}
    for ip, hosts in sorted(owners.items()):
        if len(hosts) > 1 and ip not in bad_ips:
            out.append(Verdict(
                "containers-share-host", "INFO",
                f"{', '.join(sorted(hosts))} announce the same address {ip}: containers sharing one machine's network; "
                f"NCCL treats them as separate nodes (NET instead of P2P/SHM) unless they share /dev/shm and NCCL_HOSTID",
                [r.key for r in ranks if r.host in hosts], sorted(hosts),
                _evidence(line for r in ranks if r.host in hosts for line in r.evidence_lines if ip in line),
                "confirm with 'hostname -I' and 'cat /proc/sys/kernel/random/boot_id' in each container; to use NVLink "
                "across them run them with --ipc=host --pid=host and the same NCCL_HOSTID", "https://github.com/NVIDIA/nccl/issues/324"))
    hostids: dict[str, list[RankInfo]] = {}
    for r in ranks:
        if "NCCL_HOSTID" in r.env:
            hostids.setdefault(r.env["NCCL_HOSTID"], []).append(r)
    for value, members in hostids.items():
        ips = {i.ip for r in members for i in r.bootstrap[:1]}
        if len(ips) > 1:
            hosts = _hosts(members)
            out.append(Verdict(
                "hostid-shared", "FAIL",
                f"NCCL_HOSTID={value} is set on {len(ips)} machines ({', '.join(sorted(ips))}): NCCL takes them for one "
                f"host and tries P2P/SHM between them", [r.key for r in members], hosts,
                _evidence(line for r in members for line in r.evidence_lines if "NCCL_HOSTID" in line or "Bootstrap" in line),
                "confirm with 'cat /proc/sys/kernel/random/boot_id' on each machine (they differ); unset NCCL_HOSTID, or "
                "give each machine its own value", "https://github.com/NVIDIA/nccl/issues/879"))
    known = {ip for ip, hosts in owners.items() if hosts}
    if len(log.hosts) >= 2 and known:
        dialled = []
        for r in log.all_infos():
            for line in r.connect_errors:
                m = _DIALED.search(line)
                if m and m.group(1) not in known and m.group(1) not in dialled:
                    dialled.append(m.group(1))
        if dialled:
            out.append(Verdict(
                "dialled-unknown-address", "WARN",
                f"ranks dialled {', '.join(dialled[:3])}, an address no host announced in its Bootstrap/NET line: a second "
                f"NIC on the same subnet answers for the peer, or the peer's log is missing", [], log.hosts,
                _evidence(line for r in log.all_infos() for line in r.connect_errors if any(d in line for d in dialled)),
                f"confirm with 'ip -br addr' on every node (who owns {dialled[0]}) and 'ip route get {dialled[0]}' on the "
                f"dialling node; pin NCCL_SOCKET_IFNAME to one NIC per subnet", "issue 15"))
    return out


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
    owners = _address_owners(log)
    verdicts = (_check_catalog(log) + _check_cross_host(log, owners) +
                _check_interfaces(log, topology, owners) + _check_no_interface(log) + _check_connect(log, owners) +
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


_JSON_RANKS_MAX = 64


def to_json(log: NcclLog, verdicts: Sequence[Verdict]) -> dict:
    """The machine-readable form of :func:`render` (what ``--json`` prints), bounded in size.

    Counts plus a few examples per kind: each rank's summary keeps 3 WARN lines and the counters,
    at most 64 ranks are listed (``ranks_omitted`` counts the rest), each verdict keeps at most
    6 evidence lines, and ``catalog`` gives the line count per catalog id.
    """
    keys = list(log.ranks)[:_JSON_RANKS_MAX]
    return {"sources": log.sources, "problems": log.problems, "topology": log.topology(),
            "hosts": log.hosts[:_JSON_RANKS_MAX], "hosts_total": len(log.hosts),
            "lines_seen": log.lines_seen, "nccl_lines": log.nccl_lines, "unparsed_count": log.unparsed_count,
            "reconstructed_lines": log.reconstructed,
            "catalog": {cid: hit.count for cid, hit in log.catalog.items()},
            "ranks": {k: log.ranks[k].summary() for k in keys}, "ranks_omitted": len(log.ranks) - len(keys),
            "unattributed": log.unattributed.summary() if log.unattributed.lines else None,
            "verdicts": [v.to_dict() for v in verdicts]}


_JOB_LOG_SUFFIXES = (".log", ".txt", ".out", ".err")


def checks_for_job(job: str | Path | Sequence[str | Path]) -> list[Check]:
    """The interpreter's verdicts for a job's NCCL logs, as :class:`helpers.checks.Check` records.

    For the allocation check (notebook 00) and chapter 06 to attach to their report when the
    backend is NCCL.

    Args:
        job: a job directory (its ``*.log``, ``*.txt``, ``*.out``, ``*.err`` files, recursively) or a
            list of log paths.
    Returns:
        The verdicts (FAIL first); ``[]`` when no file holds an NCCL line (NCCL_DEBUG was not INFO).
        An unreadable file becomes one ``nccl-log.input`` INFO check naming it.
    Raises:
        ValueError: ``job`` is neither an existing directory nor a non-empty list of paths.
    """
    if isinstance(job, (str, Path)):
        root = Path(job)
        if not root.is_dir():
            raise ValueError(f"job: {job} is not a directory; give the job directory or a list of log files")
        paths: list[str | Path] = sorted(p for p in root.rglob("*") if p.is_file() and p.suffix in _JOB_LOG_SUFFIXES)
    else:
        paths = list(job)
        if not paths:
            raise ValueError("job: give the job directory or a non-empty list of log files")
    problems: list[str] = []
    try:
        log = parse_files(paths, problems=problems) if paths else None
    except ValueError:
        return []
    if log is None:
        return []
    checks: list[Check] = list(interpret(log))
    checks += [Check(id="nccl-log.input", title=line, status="INFO", source="issue 15") for line in problems
               if "no NCCL lines" not in line]
    return checks


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m helpers.nccl_log FILE...``: the same as ``runbook nccl-log FILE...`` (:func:`helpers.cli.nccl_log`)."""
    from helpers import cli

    return cli.main(["nccl-log", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
