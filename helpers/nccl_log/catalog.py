"""What the reader knows about messages: the hand-written failure catalog and the catalog generated from the sources.

Two layers, one home:

- ``helpers/data/nccl_catalog.yaml`` (:func:`load_catalog`): known failure messages whose cause a maintainer or
  the reporter confirmed in a public issue (``shm-full``, ``duplicate-gpu``, ``ib-acs-gdr``...): each names the
  cause, the command that confirms it and the fix.
- ``helpers/data/nccl_sites.json`` (:func:`load_sites`), written by :mod:`helpers.nccl_log.generate` from the
  sources of NCCL (every release tag from 2.18 on), its network plugins and PyTorch's c10d: every message they can
  print, with its regex, subsystem and releases.  What a message means, its fix and whether it states a cause or
  names a suspect come from :data:`KNOWLEDGE` (rules over the subsystem and the message's words, written from
  the code around the sites and NCCL's documentation), so every site gets a reading.
- ``helpers/data/nccl_versions.yaml`` (:func:`load_versions`): known NCCL bugs by affected and fixing release.

Nothing runs at import; PyYAML and the JSON file are read on first use.
"""

from __future__ import annotations

import json
import re
from functools import lru_cache
from itertools import groupby
from pathlib import Path
from typing import Any

from helpers.nccl_log.model import SEVERITIES

DATA = Path(__file__).resolve().parents[1] / "data"
CATALOG_PATH = DATA / "nccl_catalog.yaml"
"""The hand-written catalog of known failure messages with confirmed causes (package data, YAML)."""
SITES_PATH = DATA / "nccl_sites.json"
"""The catalog generated from the sources by :mod:`helpers.nccl_log.generate` (package data, JSON)."""
VERSIONS_PATH = DATA / "nccl_versions.yaml"
"""Known NCCL bugs by affected and fixing release (package data, YAML)."""

_CATALOG_FIELDS = ("id", "status", "pattern", "cause", "fix", "source")
_CATALOG_OPTIONAL = {"kind": "cause", "subsystem": "nccl", "explained_by": "", "last_resort": ""}
# Cheap substring filter: a line is matched against the catalog only if it holds one of these ("ras": the frames of
# NCCL's RAS functions in a crash backtrace, rasMsgHandlePeersUpdate).
_CATALOG_KEYS = ("WARN", "rror", "ailure", "ailed", "detected", "initialized", "violation", "mismatch", "checked in",
                 "AF_INET", "wrong type", "vendor err", "NVLS", "nvls", "timeout", "timed out", "Heartbeat", "got stuck",
                 "dump signal", "exitcode", "SIGKILL", "out of memory", "in use", "GPUs found", "clients joined",
                 "Some NCCL operations", "Timeout at NCCL work", "libuv", "mismatch between collectives",
                 "open files", "Unable to find address", "compiled with NCCL", "...", "…", "snip", "truncated",
                 "Unable to resolve", "gloo", "Gloo", "refused", "compute device", "signal dumping", "No CUDA GPUs", "xception", "envoy", "istio-proxy", "pilot-agent",
                 "MEMBER: ", "processes registered", "main_process_first", "ras")


def _yaml_loader(yaml: Any) -> type:
    """PyYAML's safe loader, the libyaml one (``CSafeLoader``) when PyYAML was built with it: the same documents,
    ten times faster (30 ms of the catalog's load at every start of ``nccl-log``)."""
    return getattr(yaml, "CSafeLoader", yaml.SafeLoader)


@lru_cache(maxsize=4)
def load_catalog(path: str | None = None) -> tuple[dict[str, str], ...]:
    """The hand-written catalog entries, in file order (the first entry whose pattern matches a line wins).

    Args:
        path: a YAML file with a list of entries; None: :data:`CATALOG_PATH`.
    Returns:
        A tuple of dicts with the keys ``id, status, kind, subsystem, explained_by, pattern, cause, fix, source``
        (``kind`` defaults to ``cause``, ``subsystem`` to ``nccl``; ``explained_by``: comma-separated ids of the entries
        whose lines name the failing call this entry's line only reports, default ""; ``last_resort``: "True" for an
        entry that reads a line only when no other entry matches it anywhere, default "").
    Raises:
        ValueError: the file is not a list of entries with those keys, a status is not one of
            :data:`SEVERITIES`, a kind is not cause/suspect/context, a pattern does not compile, or an id repeats
            (names the entry).
    """
    import yaml  # only when a log is interpreted

    data = yaml.load(Path(path or CATALOG_PATH).read_text(encoding="utf-8"), Loader=_yaml_loader(yaml))
    if not isinstance(data, list):
        raise ValueError(f"{path or CATALOG_PATH}: expected a list of catalog entries")
    seen: set[str] = set()
    out = []
    for n, entry in enumerate(data):
        missing = [k for k in _CATALOG_FIELDS if not isinstance(entry, dict) or not entry.get(k)]
        if missing:
            raise ValueError(f"catalog entry {n}: missing {', '.join(missing)}; each entry needs {', '.join(_CATALOG_FIELDS)}")
        if entry["status"] not in SEVERITIES:
            raise ValueError(f"catalog entry {entry['id']}: status={entry['status']!r}; accepted values are "
                             f"{', '.join(SEVERITIES)}")
        if entry.get("kind", "cause") not in KINDS:
            raise ValueError(f"catalog entry {entry['id']}: kind={entry['kind']!r}; accepted values are {', '.join(KINDS)}")
        if entry["id"] in seen:
            raise ValueError(f"catalog entry {entry['id']}: id repeats")
        try:
            re.compile(entry["pattern"])
        except re.error as exc:
            raise ValueError(f"catalog entry {entry['id']}: pattern does not compile ({exc})") from exc
        unknown = {x.strip() for x in str(entry.get("explained_by") or "").split(",") if x.strip()} - {
            e.get("id") for e in data if isinstance(e, dict)}
        if unknown:
            raise ValueError(f"catalog entry {entry['id']}: explained_by names unknown ids {', '.join(sorted(unknown))}")
        seen.add(entry["id"])
        record = {k: str(entry[k]) for k in _CATALOG_FIELDS}
        record.update({k: str(entry.get(k, default)) for k, default in _CATALOG_OPTIONAL.items()})
        out.append(record)
    return tuple(out)


@lru_cache(maxsize=4)
def _catalog_regex(path: str | None = None, last_resort: bool = True) -> re.Pattern[str]:
    """All catalog patterns as one alternation; the named group that matched is ``g<index>`` (the index in
    :func:`load_catalog`).  The leftmost match wins, so an entry marked ``last_resort`` (a pattern that matches from the
    line's start, such as a Python exception line) would hide a specific entry that matches later in the same line:
    ``last_resort=False`` leaves those entries out, for the second search :meth:`_Parser._memo` makes when a
    last-resort entry matched."""
    return re.compile("|".join(f"(?P<g{i}>{e['pattern']})" for i, e in enumerate(load_catalog(path))
                               if last_resort or not e["last_resort"]))


KINDS = ("cause", "suspect", "context")
"""What a reading claims: ``cause`` (the message decides), ``suspect`` (the likeliest reading, to confirm with the
command of its fix), ``context`` (a consequence or a fact worth knowing, not a failure by itself)."""


# ------------------------------------------------------------------------------------ generated sites

@lru_cache(maxsize=2)
def load_sites(path: str | None = None) -> dict:
    """The generated catalog: ``{"header": {...}, "entries": [...], "skipped": [...]}`` (:mod:`helpers.nccl_log.generate`).

    Each entry gains ``index`` (its position); ``sites`` keeps the first two URLs (``site_count`` counts them all) so
    the reader's memory stays small.  What an entry means is :func:`site_knowledge`, worked out when first asked
    (a log hits a few dozen of the ~2,100 entries; reading them all at load was ~0.15 s of every command's start).

    Raises:
        ValueError: the file is not the generator's JSON (names the missing key).
    """
    data = json.loads(Path(path or SITES_PATH).read_text(encoding="utf-8"))
    for key in ("header", "entries"):
        if key not in data:
            raise ValueError(f"{path or SITES_PATH}: missing {key!r}; regenerate it with python -m helpers.nccl_log.generate")
    for i, e in enumerate(data["entries"]):
        e["index"] = i
        e["sites"] = e["sites"][:2]      # the file keeps up to 8 per format; verdicts cite the first ones
    data.pop("skipped", None)
    return data


@lru_cache(maxsize=2)
def _site_index(path: str | None = None) -> tuple[dict[str, tuple[int, ...]], tuple[int, ...]]:
    """``({word: entry indices}, indices without a word)``: each entry filed under every word of its anchor.

    A message is then checked only against the entries filed under one of its own words (a dict lookup per word)
    instead of all ~2,000 entries.  Every word counts, not only the longest: a word next to a conversion
    (``Using%s``) may be glued to the printed value.
    """
    entries = load_sites(path)["entries"]
    by_word: dict[str, list[int]] = {}
    loose: list[int] = []
    for e in sorted(entries, key=lambda e: -len(e["anchor"])):
        if len(e["anchor"]) < MIN_ANCHOR:
            continue
        words = set(_WORD.findall(e["anchor"]))
        for word in words:
            by_word.setdefault(word, []).append(e["index"])
        if not words:
            loose.append(e["index"])
    return {w: tuple(v) for w, v in by_word.items()}, tuple(loose)


_WORD = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")


MIN_ANCHOR = 3
"""A format whose longest literal piece is shorter than this (``"%s"``) cannot be told from any other text: it is
not matched (and counts as not covered)."""


_SITE_RE: dict[int, re.Pattern[str]] = {}


def match_site(message: str, level: str | None = None, path: str | None = None) -> dict | None:
    """The generated entry whose format printed ``message`` (see :func:`_match_site_index`), or None."""
    index = _match_site_index(message, level, path)
    return None if index is None else load_sites(path)["entries"][index]


@lru_cache(maxsize=8192)
def _match_site_index(message: str, level: str | None = None, path: str | None = None) -> int | None:
    """The index of the generated entry whose format printed ``message`` (the text after ``NCCL WARN``), or None.

    Memoised (bounded): a log repeats its messages.  Entries are tried longest literal anchor first; an entry
    matches when its anchor is in ``message`` and its regex matches from the start (a message cut short still
    matches when the anchor is there).

    Args:
        message: one message, prefix removed; level: ``WARN`` / ``INFO`` / ``ERROR`` to try only those entries.
    """
    entries = load_sites(path)["entries"]
    by_word, loose = _site_index(path)
    candidates = {i for w in set(_WORD.findall(message)) for i in by_word.get(w, ())}
    # Ties (anchors of one length): a format that matches the whole message before one that matches only its start
    # ("Retrieve %s failed with %d" also matches the start of "Retrieve X version 2 failed with 1 status 0"), then
    # entry order, NCCL's own sites before the plugins' copies of its socket code (the same format, the same message);
    # a set's order would make the choice vary with the hash seed.
    def anchor_len(i: int) -> int:
        return len(entries[i]["anchor"])

    ordered = (sorted(candidates, key=lambda i: (-anchor_len(i), i)), sorted(loose))
    for group in (list(g) for part in ordered for _, g in groupby(part, key=anchor_len)):
        prefix = None
        for i in group:
            e = entries[i]
            if e["anchor"] not in message or (level is not None and e["level"] != level):
                continue
            rx = _SITE_RE.get(i)
            if rx is None:
                rx = _SITE_RE[i] = re.compile(e["regex"])
            m = rx.match(message)
            if m and m.end() == len(message):
                return i
            if m and prefix is None:
                prefix = i
        if prefix is not None:
            return prefix
    return None


# ------------------------------------------------------------------------------------------ knowledge

# (class id, regex over the format, subsystems it applies to or "" for any, status, kind, meaning, fix, source)
KNOWLEDGE: tuple[tuple[str, str, str, str, str, str, str, str], ...] = (
    # NET/Socket never has GPU Direct RDMA (src/transport/net_socket.cc sets ptrSupport to host memory only), so topo.cc's
    # "NET/Socket : GPU Direct RDMA Disabled for HCA" says nothing about the node (seen on a one-GPU H200 machine).
    ("gdr-disabled", r"^(?!NET/Socket\b).*GPU Direct RDMA Disabled", "", "WARN", "suspect",
     "GPU Direct RDMA is off for the HCAs: NCCL found no peer-memory module (nvidia_peermem / nv_peer_mem) or "
     "DMA-BUF support, so network transfers bounce through host memory (several times slower); NCCL up to 2.22.3 "
     "only looks for the old nv_peer_mem module (2.23.4 release notes: 'Add new check for nvidia peermem')",
     "lsmod | grep -E 'nvidia_peermem|nv_peer_mem' and cat /sys/module/nvidia_peermem/version on that node; "
     "modprobe nvidia-peermem; with nvidia_peermem loaded and NCCL <= 2.22.3, upgrade NCCL to 2.23.4 or later",
     "https://github.com/NVIDIA/nccl/releases/tag/v2.23.4-1"),
    ("ib-qp-transition", r"ibv_modify_qp|modify_qp", "", "FAIL", "suspect",
     "moving an InfiniBand/RoCE queue pair to ready-to-receive/send failed: the peer NIC is not reachable with this "
     "addressing (on RoCE a GID index that selects a non-routable GID such as the IPv6 link-local fe80:: one, or the "
     "wrong RoCE version; on a rail-optimised fabric a NIC paired with a peer NIC on a rail it is not routed to), or "
     "the HCA port is down ('No such device')",
     "ibv_devinfo -v and show_gids on both nodes: set NCCL_IB_GID_INDEX to the RoCE v2 GID of the routable IPv4 "
     "address; NCCL_CROSS_NIC=0 on fabrics without cross-rail routing; NCCL_IB_HCA=^<hca> to leave out a port that is "
     "down; ib_write_bw between the two NICs", "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-ib-gid-index"),
    ("topo-xml-file", r"Attribute \S+ of node \S+ not found|XML Import|NCCL_TOPO_FILE|NCCL_GRAPH_FILE|[Gg]raph file|"
     r"topology file", "", "FAIL", "suspect",
     "an XML topology file or graph file given to NCCL (NCCL_TOPO_FILE / NCCL_GRAPH_FILE, also set from /etc/nccl.conf or "
     "~/.nccl.conf, or installed by a network plugin such as aws-ofi-nccl) lacks what this NCCL reads (such as a CPU "
     "node's arch/vendor/model) or describes another machine",
     "grep -E 'TOPO_FILE|GRAPH_FILE' /etc/nccl.conf ~/.nccl.conf and the 'set by environment' lines; unset them to let "
     "NCCL detect the topology, or upgrade the plugin that installs the file",
     "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-topo-file"),
    ("topology-path", r"reverse path|[Cc]ould not find a path|no path", "", "FAIL", "suspect",
     "NCCL could not find a path between two devices of the topology it detected: the NCCL release is likely too old "
     "for the machine (a GPU, NVSwitch or NIC layout it does not know), or a topology file describes another machine", "nvidia-smi topo -m; try a newer NCCL (a newer torch wheel bundles one) and unset NCCL_TOPO_FILE",
     "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-topo-file"),
    ("ofi-register", r"NET/OFI .*(?:[Rr]egister memory|register_mr|reg_mr)", "", "FAIL", "suspect",
     "libfabric (EFA) could not register a buffer with the NIC: an EFA installer / libfabric too old for the buffers "
     "this NCCL allocates (cuMem), or the locked-memory limit",
     "fi_info --version and the EFA installer version on the node; upgrade the EFA installer (libfabric), ulimit -l "
     "unlimited; see aws-ofi-nccl's release notes for the libfabric it needs", "https://github.com/aws/aws-ofi-nccl"),
    ("ibverbs-missing", r"Failed to open libibverbs|libibverbs", "", "INFO", "context",
     "libibverbs is not installed or not found: NCCL's IB transport is off (normal on an Ethernet-only node; on an "
     "InfiniBand node NCCL falls back to TCP sockets)",
     "ldconfig -p | grep libibverbs; install rdma-core (libibverbs) in the image when the node has InfiniBand",
     "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-ib-disable"),
    ("setting-adjusted", r"setting to|defaulting to|, ignoring|[Ii]gnoring|using default|[Ff]alling back|fallback", "", "INFO", "context",
     "NCCL found a setting out of range or unusable and continues with another value (printed once, not a failure)",
     "check the NCCL_* variable the line names against https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html",
     "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"),
    ("same-gpu", r"same GPU|Duplicate GPU", "", "FAIL", "cause",
     "two ranks of one communicator use the same GPU",
     "torch.cuda.set_device(LOCAL_RANK) before init_process_group; nvidia-smi --query-compute-apps=pid,gpu_bus_id --format=csv",
     "https://github.com/NVIDIA/nccl/blob/master/src/init.cc"),
    ("version-skew", r"not backwards compatible|compiled with NCCL version|is different from|does not match the parent|"
     r"mixed .* across ranks|across ranks|[Vv]ersion mismatch|[Mm]ismatched NCCL version", "", "FAIL", "cause",
     "ranks or components disagree: different NCCL builds (the application was compiled against another NCCL), or "
     "ranks configured differently (network devices, NCCL_* settings)",
     "print the NCCL version on every node (python -c 'import torch; print(torch.cuda.nccl.version())') and diff the "
     "NCCL_* environment of the ranks the line names; run one image everywhere",
     "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html"),
    ("mnnvl-imex", r"MNNVL|IMEX|cliqueSize|[Ff]abric handle|CU_MEM_HANDLE_TYPE_FABRIC", "", "FAIL", "suspect",
     "multi-node NVLink (MNNVL) is not usable: the IMEX service or its channel (/dev/nvidia-caps-imex-channels) is "
     "missing or misconfigured",
     "systemctl status nvidia-imex and ls /dev/nvidia-caps-imex-channels on every node of the NVLink domain; "
     "NCCL_MNNVL_ENABLE=0 as a stop-gap", "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-mnnvl-enable"),
    ("sysfs-path", r"real path|/sys/|sysfs|NUMA|numa|[Cc]ould not find (?:NET|CPU|node|id|DEV|NIC)|hostHash|busId|"
     r"could not find CPU|could not find DEV|KV Convert|Attribute \S+ of node", "", "WARN", "suspect",
     "NCCL could not read the node's PCI/NUMA topology from /sys (a container without /sys, a virtual NIC or GPU "
     "without a PCI path) or could not place a device in it",
     "ls -l /sys/class/net/*/device and nvidia-smi topo -m in the container (mount /sys, or give NCCL_TOPO_FILE)",
     "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-topo-file"),
    ("memory-manager", r"MemManager|[Ss]uspend|[Rr]esume|offload|CPU backup|shadow pool", "", "WARN", "cause",
     "NCCL's memory manager (communicator suspend/resume and memory offload) refused or failed an operation: the "
     "application used the API in a state or configuration that does not support it",
     "check the ncclCommSuspend/ncclCommResume calls of the application against NCCL's API documentation",
     "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/api.html"),
    ("bootstrap-truncated", r"[Tt]runcated|bytes instead of", "bootstrap", "FAIL", "suspect",
     "a bootstrap message had another size than expected: the ranks run different NCCL versions, another process "
     "(another job, a scanner) connected to this rank's bootstrap port, or the 2.19-2.20 regression that reorders "
     "bootstrap messages (fixed in 2.21.5)",
     "compare the NCCL version of every rank (the 'NCCL version' lines); give each job its own MASTER_PORT / NCCL_COMM_ID; "
     "on 2.19.x-2.20.x upgrade to 2.21.5 or later", "https://github.com/NVIDIA/nccl/releases/tag/v2.21.5-1"),
    ("size-mismatch", r"truncated|bytes instead of|[Ss]ize mismatch|collective mismatch|Mismatched collective", "", "FAIL", "suspect",
     "two ranks disagree on the size of a transfer: they called different collectives, in a different order or with "
     "different sizes (a program bug), or they run different NCCL versions or protocol settings",
     "compare the calls of the two ranks (TORCH_DISTRIBUTED_DEBUG=DETAIL reports the mismatching collective) and their "
     "NCCL versions and NCCL_* settings", "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html"),
    ("ib-completion", r"Got completion (?:from peer|with error)|completion with error|wc_status|wc\.status", "net-ib,net-plugin", "FAIL", "suspect",
     "an InfiniBand/RoCE work request completed with an error: the status number names it (12: transport retry "
     "exceeded, the peer NIC is unreachable; 4: local protection, usually PCIe ACS/IOMMU breaking GPU Direct RDMA; "
     "5: flushed, a consequence of an earlier error on the same queue pair; 13: receiver not ready)",
     "ibv_devinfo on both nodes (PORT_ACTIVE, same active_mtu), ib_write_bw between the two GIDs the line names; for "
     "status 4: sudo lspci -vvv | grep ACSCtl and a rerun with NCCL_NET_GDR_LEVEL=0", "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html"),
    ("ib-memory-registration", r"ibv_reg_mr|reg_mr|ibv_reg_dmabuf_mr|register memory|Memory registration|regMr", "", "FAIL", "suspect",
     "registering a buffer with the NIC failed: the locked-memory limit is too low, or GPU memory cannot be "
     "registered (no nvidia-peermem / DMA-BUF support)",
     "ulimit -l on that node (must be unlimited: limits.conf or the container's --ulimit memlock=-1); "
     "lsmod | grep nvidia_peermem; NCCL_NET_GDR_LEVEL=0 as a stop-gap", "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html"),
    ("ib-verbs-call", r"(?:Call to )?ibv_\w+|mlx5dv_\w+|MLX5|DOCA|Unable to open device|Unable to query|ibvwrap|IB device|port state|NET/IB", "", "FAIL", "suspect",
     "an IB verbs call failed: the HCA, its port or the verbs library is not usable from this process",
     "ibv_devinfo (port PORT_ACTIVE, link_layer) and ls /dev/infiniband in the container (pass the devices and "
     "--cap-add IPC_LOCK; ulimit -l unlimited); NCCL_IB_HCA to pick the right ports", "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html"),
    ("ofi-provider", r"fi_getinfo|provider|No eligible|EFA|efa|libfabric|fi_\w+|protocol that worked", "net-plugin:aws-ofi", "FAIL", "suspect",
     "the AWS OFI plugin could not use libfabric (no EFA provider: the EFA device is not passed to the container, the "
     "libfabric/EFA installer is missing or too old, or the instance has no EFA)",
     "fi_info -p efa on that node; pass /dev/infiniband/uverbs* to the container, install the EFA software, and keep "
     "FI_PROVIDER=efa", "https://github.com/aws/aws-ofi-nccl"),
    ("verbs-symbol", r"dlvsym failed", "", "WARN", "suspect",
     "a versioned symbol is missing from the verbs library NCCL loads (libibverbs / libmlx5 of rdma-core): printed as "
     "INFO, an optional feature is off (DMA-BUF registration, Data Direct) and NCCL carries on; as WARN, the library is "
     "older than this NCCL's InfiniBand path needs, so that path is off (src/misc/ibvsymbols.cc, mlx5dvsymbols.cc: "
     "LOAD_SYM warns, LOAD_SYM_VERSION only informs)",
     "dpkg -l rdma-core libibverbs1 (rpm -q rdma-core) and ldconfig -p | grep -E 'libibverbs|libmlx5' on that node; "
     "update rdma-core (or MLNX_OFED / DOCA) to a release that has the symbol",
     "https://github.com/NVIDIA/nccl/blob/master/src/misc/mlx5dvsymbols.cc"),
    ("plugin-load", r"[Pp]lugin|dlopen|[Dd]lsym|Failed to find \w+ symbol|libnccl-net", "", "WARN", "suspect",
     "a plugin (network, tuner, profiler) could not be loaded or lacks a symbol: NCCL falls back to its internal "
     "code, or the plugin and NCCL versions do not match",
     "ldconfig -p | grep nccl-net and echo $NCCL_NET_PLUGIN $LD_LIBRARY_PATH; install the plugin built for this NCCL "
     "version, or NCCL_NET_PLUGIN=none", "https://github.com/NVIDIA/nccl/tree/master/plugins/net"),
    ("socket-no-interface", r"no socket interface found|no device found (?:matching|after excluding)|OOB_NET_IFNAME|No usable listening interface|no interface found|No interface found in the same subnet|interface not found", "", "FAIL", "cause",
     "no network interface matches NCCL_SOCKET_IFNAME (or none is up with an address), so NCCL cannot bootstrap",
     "ip -br addr on that node; set NCCL_SOCKET_IFNAME to a prefix present on every node, or unset it",
     "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-socket-ifname"),
    ("socket-peer-closed", r"[Cc]onnection closed by remote peer|remote process exited|[Cc]onnection reset|socket closed|closed by peer|Broken pipe|recv.*\b0 bytes|Net : Connection closed", "", "WARN", "context",
     "the peer closed the connection: another rank died or aborted first (this line is a consequence)",
     "find the first rank to fail (its first WARN or its launcher's exit code) and read its log; dmesg on its node",
     "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html"),
    ("socket-connect", r"[Cc]onnect to|[Cc]onnect(?:ion)? (?:failed|refused|timed out)|ncclSocketConnect|No route to host|[Nn]etwork is unreachable|connect returned|socketConnect|Connection refused|Call to connect", "", "FAIL", "suspect",
     "a TCP connection between ranks failed: the peer is not listening (it died or announced a wrong address), the "
     "address is not routable from here, or a firewall drops NCCL's ports",
     "nc -zv PEER PORT from this node and ip route get PEER; pin NCCL_SOCKET_IFNAME to the data-plane NIC that every node "
     "shares; open the port range between the nodes", "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html"),
    ("socket-timeout", r"[Tt]imeout|timed out|[Tt]imed out", "socket,bootstrap,net-socket", "FAIL", "suspect",
     "a socket operation timed out: a peer never answered (it did not start, it is stuck, or packets are dropped)",
     "check that every rank started (the launcher's output per node), then nc -zv between the nodes on the ports the "
     "log names", "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html"),
    ("bootstrap-rendezvous", r"[Bb]ootstrap|unique ?[Ii]d|commId|NCCL_COMM_ID|magic|[Rr]oot", "bootstrap", "FAIL", "suspect",
     "the bootstrap rendezvous failed: ranks do not agree on the unique id / root address, a rank connected to the "
     "wrong job, or the root is unreachable",
     "every rank must get the same unique id (one init_process_group per job, same MASTER_ADDR/PORT); nc -zv between "
     "the nodes; NCCL_SOCKET_IFNAME on the shared network", "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html"),
    ("shm", r"/dev/shm|shm_open|[Ss]hared memory|fallocate|failed to extend|shmutils|\bshm\b|SHM", "", "FAIL", "suspect",
     "a shared-memory segment under /dev/shm could not be created, sized or attached (a container's small /dev/shm, "
     "ranks in different IPC namespaces, or stale segments)",
     "df -h /dev/shm in each rank's container; docker --shm-size=8g or --ipc=host; NCCL_SHM_DISABLE=1 only as a "
     "stop-gap", "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html#docker"),
    ("nvls", r"NVLS|[Mm]ulticast|cuMulticast|NVLink SHARP|nvls", "", "FAIL", "suspect",
     "NVLink SHARP (NVLS) / multicast setup failed: on NVSwitch systems usually the fabric manager (not running, "
     "restarted without a GPU reset, or a version different from the driver)",
     "systemctl status nvidia-fabricmanager and nvidia-smi -q | grep -A2 Fabric; NCCL_NVLS_ENABLE=0 as a stop-gap",
     "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-nvls-enable"),
    ("p2p-ipc", r"P2P|cudaIpc|IPC|UDS|[Ii]pc|failed to peer|cuMemImport|cuMemExport|peer access|CUMEM|cuMem\w+FromShareableHandle|pidfd", "", "FAIL", "suspect",
     "GPU-to-GPU (P2P/IPC) setup between processes failed: the ranks are in different containers or PID/IPC "
     "namespaces, P2P is not supported between these GPUs, or PCIe ACS/IOMMU blocks it",
     "nvidia-smi topo -p2p r; run the ranks' containers with --ipc=host --pid=host; NCCL_P2P_DISABLE=1 as a test",
     "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html#pci-access-control-services-acs"),
    # src/include/alloc.h: ncclCudaCalloc/ncclCudaCallocAsync/ncclCudaMalloc WARN "Failed to CUDA calloc %ld bytes" when
    # cudaMalloc (or cuMem) left the pointer null: the device allocation failed; NCCL allocates a communicator's
    # buffers when torch creates it, at the first collective on each process group unless eagerly initialised.
    ("cuda-alloc-failed", r"^Failed to CUDA (?:calloc|malloc|host alloc)", "", "FAIL", "suspect",
     "NCCL could not allocate the device (or pinned host) memory for a communicator's buffers: the GPU was out of "
     "memory at that moment, usually because the communicator was created lazily at its first collective, at the "
     "training's memory peak (another CUDA error, when there is one, is on the 'Cuda failure' line before it)",
     "confirm with torch.cuda.memory_summary() / nvidia-smi at that step (rerun with NCCL_DEBUG=WARN to see the CUDA "
     "error); create the communicators before the peak (a warm-up collective on every process group, or "
     "init_process_group(device_id=...) for eager init), or lower the memory per GPU",
     "https://github.com/NVIDIA/nccl/blob/v2.30.7-1/src/include/alloc.h"),
    ("cuda-failure", r"Cuda failure|CUDA failure|cuda\w* failed|CUDA error|cudaError|CUDA driver|cu\w+ failed|Cuda|CUDA", "", "FAIL", "suspect",
     "a CUDA call inside NCCL failed; the quoted CUDA error names the cause (out of memory, driver too old, a GPU "
     "fault, fabric manager...)",
     "read the CUDA error string in the line; nvidia-smi and dmesg | grep -i xid on that node", "https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html"),
    ("out-of-memory", r"[Oo]ut of memory|Allocation failed|returned null|[Ff]ailed to (?:CUDA )?(?:c|m|re)alloc|alloc(?:ation)? failed|ENOMEM|[Cc]annot allocate", "", "FAIL", "cause",
     "memory ran out (GPU memory for NCCL's buffers, host memory, or pinned/locked memory)",
     "nvidia-smi (memory used per process) and free -g on that node; lower the model's memory or NCCL's buffers "
     "(NCCL_BUFFSIZE, fewer channels), and ulimit -l unlimited for pinned memory", "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-buffsize"),
    ("version-mismatch", r"[Mm]ismatch|version|Version", "init,bootstrap,net-plugin,plugin,nvml,cuda", "FAIL", "suspect",
     "two components disagree on a version (NCCL between ranks, NCCL and its plugin, the CUDA driver and runtime)",
     "print the versions on every node (python -c 'import torch; print(torch.cuda.nccl.version())', nvidia-smi) and "
     "run the same build everywhere", "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html"),
    ("duplicate-gpu", r"Duplicate GPU", "", "FAIL", "cause",
     "two ranks of one communicator use the same GPU",
     "torch.cuda.set_device(LOCAL_RANK) before init_process_group; nvidia-smi --query-compute-apps=pid,gpu_bus_id --format=csv",
     "https://github.com/NVIDIA/nccl/blob/master/src/init.cc"),
    ("usage-error", r"[Ii]nvalid|must be|should not|[Nn]ot in a group|improper usage|must pass|before the previous "
     r"operation|revoked|without a matching|must either|needs to be valid|not within valid range|is not in the valid|"
     r"begins with sm|does not support|only supports|[Nn]o GIN-capable|not found\.?$|mismatchs? with|differs from rank|"
     r"identical|does not match type|not a valid pointer|is not a member|NULL user pointer|did not request|is disabled|"
     r"already been destroyed|is being ignored|should be a diviser|is less than|Both \S+ and \S+ are set|Invalig|"
     r"plane IDs?|non-connected|already connected|unknown state|Unsupported|extends beyond|No suitable space|"
     r"should not use|operator is a NCCL builtin|No algorithm/protocol available|GIN|[Cc]annot create|must be provided|not supported|unsupported|garbage|[Nn]ot allowed|illegal|[Uu]nknown|cannot be|out of range|exceeds|too (?:many|large|small)|requires", "arguments,enqueue,group,init,registration,symmetric,gin,rma,device-runtime,ce-collectives,misc,net-ib,collnet,"
     "bootstrap,memory,net,p2p,shm,nvls", "FAIL", "cause",
     "the calling program used NCCL wrongly (an invalid argument, a call in the wrong state, a feature this build or "
     "setup does not support); the line names the argument",
     "fix the call the line names (torch: the collective's tensors, device and group); NCCL_DEBUG=WARN prints the "
     "argument check", "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/api.html"),
    ("topology", r"XML|xml|topo|Topo|sysfs|/sys/|PCI|pci|busId|NUMA|[Pp]ath|graph|NIC|[Rr]ing|[Tt]ree|channel", "topology", "WARN", "suspect",
     "NCCL could not read or make sense of the node's topology (PCI tree in /sys, an NCCL_TOPO_FILE, a GPU or NIC it "
     "cannot place)", "nvidia-smi topo -m; in containers mount /sys read-only; check NCCL_TOPO_FILE / NCCL_TOPO_DUMP_FILE",
     "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-topo-file"),
    ("nvml", r"NVML|nvml", "", "WARN", "suspect",
     "an NVML call failed: the driver and its NVML library differ (a driver update without reboot), or the container "
     "lacks the driver's libraries", "nvidia-smi on that node ('Driver/library version mismatch' means reboot or reload the driver)",
     "https://docs.nvidia.com/deploy/nvml-api/"),
    ("gdrcopy", r"gdr|GDR|gdrcopy|GDRCOPY", "", "WARN", "suspect",
     "GDRCopy (CPU access to GPU memory) could not be used: the gdrdrv module is missing or its version differs",
     "lsmod | grep gdrdrv; NCCL_GDRCOPY_ENABLE=0 turns the optional path off", "https://github.com/NVIDIA/gdrcopy"),
    ("collnet", r"CollNet|collNet|SHARP|[Ss]harp", "", "WARN", "suspect",
     "CollNet (in-network reduction, SHARP) could not be set up", "NCCL_COLLNET_ENABLE=0 to run without it; check the SHARP daemon (sharp_am) and plugin",
     "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-collnet-enable"),
    ("proxy", r".", "proxy", "FAIL", "context",
     "NCCL's proxy thread (which drives network transfers) hit an error: usually the consequence of a network or "
     "peer failure reported just before", "read the first WARN line of the same rank and of its peers",
     "https://github.com/NVIDIA/nccl/blob/master/src/proxy.cc"),
    ("windows", r".", "os-windows", "WARN", "context",
     "a Windows-only code path (not printed on Linux)", "none on Linux", "https://github.com/NVIDIA/nccl/tree/master/src/os"),
    ("ras", r".", "ras", "INFO", "context",
     "NCCL's RAS subsystem (reliability and serviceability: it tracks peers and answers ncclras queries) reports a "
     "peer problem; a witness of another rank's failure", "ncclras on a node of the job lists the dead or unreachable peers",
     "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting/ras.html"),
    ("internal", r"[Ii]nternal|[Aa]ssert|[Uu]nexpected|[Cc]orrupt|[Bb]ug|is NULL|pass NULL|not ready|not initialized|"
     r"does not exist|invalid socket|socket is invalid|[Cc]ould not find handle|No allocation found|ran out of|"
     r"progress error|unable to allocate|[Nn]ot enough space|failed to join|string is null|No valid|deregister|"
     r"Deregister|reqSize is|[Dd]uplicate registration|[Ff]ailed to determine|creation failed|sync deviceStream|"
     r"cleanup comm|destroys proxy|sets state|[Cc]ould not find|not found|fatal error|[Ee]rror detected|job error|"
     r"error %d|[Uu]nrecoverable|respSize is|[Dd]uplicate", "", "FAIL", "suspect",
     "NCCL reached a state it does not expect (an internal error): often a known bug of this release",
     "compare the release with the known-bug table (runbook nccl-log shows it) and try the newest NCCL", "https://github.com/NVIDIA/nccl/issues"),
    ("timeout", r"[Tt]imeout|timed out|[Tt]imed out", "", "FAIL", "suspect",
     "an NCCL operation timed out waiting for a peer", "check that every rank reached the same call; test the network between the nodes",
     "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html"),
    ("system-call", r"Call to \S+ failed|errno|strerror|: [A-Z][a-z]+ [a-z ]+ \(\d+\)|%m|[Tt]hread|sched_\w+|"
     r"failed with|[Ff]ailed to open|[Aa]ccept failed|[Bb]inding|[Rr]eceiving data|[Ss]ocket creation|dlvsym|"
     r"[Rr]etrieve \S+ failed|failure %d|random_device|failed : %s", "", "FAIL", "suspect",
     "a system call failed; the error text in the line names it", "read the errno text; strace -f -e trace=network,ipc the failing rank if it repeats",
     "https://man7.org/linux/man-pages/man3/errno.3.html"),
)
"""The readings of the generated sites: the first class whose regex matches a format (and whose subsystem list,
when given, holds the site's subsystem) gives its meaning, fix, status and kind.  Written from the code around the
sites (the calls they follow) and NCCL's documentation (the URLs); the order goes from the most to the least
specific."""

SUBSYSTEM_MEANING: dict[str, str] = {
    "net-ib": "NCCL's InfiniBand/RoCE transport", "net-socket": "NCCL's TCP socket transport",
    "socket": "NCCL's socket layer (bootstrap and socket transport)", "bootstrap": "the bootstrap rendezvous of a communicator",
    "init": "communicator setup", "enqueue": "launching a collective", "arguments": "the argument checks of the API",
    "group": "group calls (ncclGroupStart/End)", "topology": "topology detection and graph search",
    "proxy": "the proxy thread that drives network transfers", "memory": "NCCL's memory management",
    "cuda": "a CUDA call", "nvml": "NVML (the driver's management library)", "gdr": "GDRCopy",
    "shm": "the shared-memory transport", "p2p": "the GPU peer-to-peer transport", "nvls": "NVLink SHARP",
    "collnet": "CollNet / SHARP", "net": "the network transport", "net-plugin": "the network plugin interface",
    "plugin": "plugin loading", "tuner-plugin": "the tuner plugin", "profiler-plugin": "the profiler plugin",
    "registration": "user buffer registration", "ras": "the RAS subsystem", "gin": "GPU-initiated networking",
    "rma": "one-sided RMA", "os": "OS services", "os-windows": "Windows OS services", "misc": "NCCL utilities",
    "symmetric": "symmetric memory", "device-runtime": "the device API runtime", "ce-collectives": "copy-engine collectives",
    "transport": "transport setup",
}
"""What each subsystem of :func:`helpers.nccl_log.generate.subsystem_of` is, for readings no class above covers."""


_INFO_KEEPS = {"gdr-disabled"}
"""Classes that keep their status when NCCL prints them as INFO (it continues, but on a slow path)."""


def site_knowledge(entry: dict) -> dict[str, str]:
    """The reading of one generated entry of :func:`load_sites` (:func:`knowledge_for` of its format, subsystem and
    level; memoised there).

    Raises:
        KeyError: ``entry`` is not a generated entry (the placeholder of a WARN line no site matched).
    """
    return knowledge_for(entry["format"], entry["subsystem"], entry["level"])


@lru_cache(maxsize=1)
def _knowledge_compiled() -> tuple[tuple[tuple[str, ...], tuple[str, ...], re.Pattern[str]], ...]:
    """:data:`KNOWLEDGE` with each class's subsystems split and its regex compiled, once (``load_sites`` asks
    :func:`knowledge_for` about each of its ~2,100 formats: through ``re.search`` that was ~0.15 s of start-up)."""
    return tuple((k, tuple(k[2].split(",")) if k[2] else (), re.compile(k[1])) for k in KNOWLEDGE)


@lru_cache(maxsize=4096)
def knowledge_for(fmt: str, subsystem: str, level: str) -> dict[str, str]:
    """The reading of one message format: ``{"class", "status", "kind", "meaning", "fix", "source", "specific"}``.

    ``specific`` is ``"yes"`` when a class of :data:`KNOWLEDGE` matched, ``"no"`` when only the subsystem is known
    (then the meaning names the subsystem and the fix asks to read the message).  INFO sites keep their class but
    read as ``context`` (NCCL printed them on a path it continued).
    """
    base = subsystem.split(":", 1)[0]
    for (cid, _, _, status, kind, meaning, fix, source), allowed, rx in _knowledge_compiled():
        if allowed and subsystem not in allowed and base not in allowed:
            continue
        if rx.search(fmt):
            if level == "INFO" and cid not in _INFO_KEEPS:
                status, kind = "INFO", "context"
            return {"class": cid, "status": status, "kind": kind, "meaning": meaning, "fix": fix, "source": source,
                    "specific": "yes"}
    where = SUBSYSTEM_MEANING.get(base, base)
    if subsystem.startswith("net-plugin:"):
        where = f"the {subsystem.split(':', 1)[1]} network plugin"
    return {"class": f"other-{base}", "status": "WARN" if level != "INFO" else "INFO", "kind": "context",
            "meaning": f"{where} reported a problem", "fix": "read the message and the WARN lines around it",
            "source": "https://github.com/NVIDIA/nccl", "specific": "no"}


CUDA_ERRORS: tuple[tuple[str, str, str, str], ...] = (
    ("out of memory", "cause", "the GPU is out of memory when NCCL allocates its buffers",
     "nvidia-smi on that GPU (other processes on it?); lower the model's memory, NCCL_BUFFSIZE or the number of communicators"),
    ("driver version is insufficient", "cause", "the CUDA driver is older than the CUDA runtime this NCCL/torch was built with",
     "nvidia-smi (driver's CUDA version) vs python -c 'import torch; print(torch.version.cuda)'; update the driver or use a build for the older CUDA"),
    ("API call is not supported in the installed CUDA driver", "cause",
     "the CUDA driver is older than the CUDA toolkit NCCL (or the program) was built with and lacks a call it makes "
     "(cudaErrorCallRequiresNewerDriver, CUDA error 36): a driver-vs-runtime mismatch, not a usage error; NCCL 2.9.x "
     "built with CUDA 11.3 called cudaStreamGetCaptureInfo_v2 on R460 drivers, and 2.9.9 checks the driver version first",
     "nvidia-smi (the driver's CUDA version, top right) vs the CUDA version of the build (python -c 'import torch; "
     "print(torch.version.cuda, torch.cuda.nccl.version())'); update the driver to one of that CUDA version, or use a "
     "build for the driver's CUDA (for NCCL 2.9.x: 2.9.9 or later)"),
    ("unsupported display driver / cuda driver combination", "cause",
     "the kernel driver and the user-space CUDA driver library (libcuda) are different versions "
     "(cudaErrorSystemDriverMismatch, CUDA error 803): a driver update without a reboot, or a container whose libcuda "
     "comes from another driver or a cuda-compat package",
     "nvidia-smi ('Driver/library version mismatch') and cat /proc/driver/nvidia/version vs the libcuda.so.* the "
     "process loads (ldconfig -p | grep libcuda, LD_LIBRARY_PATH); reboot or reload the driver, or drop the mismatched "
     "libcuda from the container"),
    ("forward compatibility was attempted on non supported HW", "cause",
     "a CUDA forward-compatibility libcuda (cuda-compat) is loaded on a GPU that does not support it "
     "(cudaErrorCompatNotSupportedOnDevice, CUDA error 804): the driver is older than the build's CUDA",
     "ldconfig -p | grep libcuda and LD_LIBRARY_PATH (a compat/ directory); remove cuda-compat from the path and update "
     "the driver, or use a build for the driver's CUDA"),
    ("system not yet initialized", "cause", "CUDA 802: on an NVSwitch node the fabric manager is not running or its version differs from the driver",
     "systemctl status nvidia-fabricmanager; install the fabric manager matching the driver and enable it"),
    ("peer access is not supported", "cause", "CUDA P2P between these GPUs is not supported (PCIe topology, IOMMU, consumer GPUs)",
     "nvidia-smi topo -p2p r; NCCL_P2P_DISABLE=1 (NCCL then uses shared memory)"),
    ("peer mapping resources exhausted", "cause", "too many P2P mappings (more than 8 peers per GPU under the legacy IPC path)",
     "NCCL_P2P_LEVEL=NVL or fewer ranks per node"),
    ("named symbol not found", "cause", "NCCL's kernels were not built for this GPU's architecture (a source build "
     "without this GPU's -gencode): the kernel it launches does not exist",
     "nvidia-smi --query-gpu=compute_cap --format=csv; rebuild NCCL with NVCC_GENCODE including that architecture, or use "
     "a release build"),
    ("no kernel image is available", "cause", "the binary has no kernel for this GPU's architecture (built without its "
     "-gencode, or a GPU newer than the build)", "nvidia-smi --query-gpu=compute_cap --format=csv; install a build for it"),
    ("invalid resource handle", "suspect", "a CUDA handle (stream, event) of another device or context was used: the "
     "current device is not set per rank (torch.cuda.set_device), or an old NCCL (< 2.13) runs under a newer torch",
     "call torch.cuda.set_device(LOCAL_RANK) before init_process_group and the first collective; use the NCCL the torch "
     "wheel ships (old NCCL < 2.13 with torch >= 2.3 fails this way)"),
    ("invalid device ordinal", "cause", "a rank asked for a GPU index that does not exist (LOCAL_RANK >= visible GPUs, or CUDA_VISIBLE_DEVICES too short)",
     "compare --nproc-per-node with nvidia-smi -L and CUDA_VISIBLE_DEVICES on that node"),
    ("illegal memory access", "suspect", "a kernel accessed invalid memory (cudaErrorIllegalAddress, CUDA error 700): "
     "a bug in a kernel or in the values it was given (indices, sizes, a weight layout), usually the program's own; the "
     "error is sticky and asynchronous, so a later call (NCCL's, the watchdog's) reports it; more rarely a GPU fault",
     "rerun with CUDA_LAUNCH_BLOCKING=1 and compute-sanitizer on one rank to find the faulting kernel; dmesg | grep -i "
     "xid on that node (Xid 13/31: a fault; one node only: drain it); compare with the last revision of the code that "
     "worked"),
    ("device-side assert", "cause", "a device-side assertion in the program's own kernels (an index out of range) fired; NCCL only reports it",
     "rerun with CUDA_LAUNCH_BLOCKING=1 to see the failing op"),
    ("uncorrectable ECC", "cause", "the GPU hit an uncorrectable ECC error (hardware)",
     "nvidia-smi -q -d ECC and dmesg | grep -i xid; drain the node and reset or replace the GPU"),
    ("busy or unavailable", "cause", "the GPU is in exclusive-process mode and already used, or unavailable",
     "nvidia-smi -q | grep 'Compute Mode' and the processes on it"),
    ("no CUDA-capable device", "cause", "no GPU is visible to the process", "nvidia-smi -L; CUDA_VISIBLE_DEVICES and the container's --gpus"),
    ("operation not supported", "suspect", "the driver or the container does not support the CUDA feature NCCL used (cuMem / fabric handles)",
     "update the driver; NCCL_CUMEM_ENABLE=0 as a test"),
    ("operation not permitted when stream is capturing", "cause",
     "a CUDA call that a stream capture forbids ran while a CUDA graph was being captured (cudaErrorStreamCaptureUnsupported, "
     "CUDA error 900); when the NCCL watchdog thread reports it, the capture began while the watchdog was still "
     "querying the events of earlier collectives (warm-up steps): the program's capture timing, not the network or NCCL",
     "let the earlier collectives finish before capturing: torch.cuda.synchronize() and a short wait (longer than the "
     "watchdog's poll) after the warm-up steps, then capture; capture on a side stream with "
     "torch.cuda.graph(...) as torch's CUDA graph notes describe (https://docs.pytorch.org/docs/stable/notes/cuda.html#cuda-graphs)"),
    ("operation would make the legacy stream depend on a capturing blocking stream", "cause",
     "a call on the default (legacy) stream ran while another stream was being captured into a CUDA graph "
     "(cudaErrorStreamCaptureImplicit, CUDA error 906)",
     "capture on a non-default stream (torch.cuda.graph uses a side stream) and keep other work off the default stream "
     "during the capture"),
    ("operation not permitted on an event last recorded in a capturing stream", "cause",
     "an event recorded inside a CUDA graph capture was queried or synchronised outside it (cudaErrorCapturedEvent, "
     "CUDA error 907): a watchdog or a timer touched an event of the capture",
     "do not query or synchronise events recorded during the capture until it ends; let earlier collectives finish "
     "before capturing"),
    ("operation failed due to a previous error during capture", "suspect",
     "the CUDA graph capture was invalidated by an earlier error inside it (cudaErrorStreamCaptureInvalidated, CUDA "
     "error 901): the first error of the capture is the cause", "find the first CUDA error of that capture (rerun with "
     "CUDA_LAUNCH_BLOCKING=1 and without graphs to see it)"),
    ("unspecified launch failure", "suspect", "a kernel crashed (a GPU fault or a program bug)", "dmesg | grep -i xid; rerun with CUDA_LAUNCH_BLOCKING=1"),
    ("launch timed out", "suspect", "a kernel ran too long (display watchdog or a hang)", "nvidia-smi -q | grep -i 'Display Mode'"),
)
"""CUDA error strings (``cudaGetErrorString``; https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html)
and what they mean inside an NCCL ``Cuda failure`` line: ``(words, kind, meaning, fix)``.  The stream-capture ones
(900, 901, 906, 907) are CUDA graph capture rules (CUDA Programming Guide, "Prohibited and unhandled operations"),
reported by whichever thread made the forbidden call (often the NCCL watchdog's event queries).  The driver ones (35, 36,
803, 804) say the driver and the CUDA the build targets do not fit together; 36's NCCL case is
https://github.com/NVIDIA/nccl/blob/v2.9.8-1/src/enqueue.cc#L802 (``cudaStreamGetCaptureInfo_v2`` called
unconditionally; v2.9.9-1 first compares ``comm->driverVersion`` with 11030)."""


def cuda_reading(line: str) -> tuple[str, str, str, str] | None:
    """``(class, kind, meaning, fix)`` for the CUDA error a ``Cuda failure`` line quotes (class ``cuda-<words>``), or
    None when the error is not in :data:`CUDA_ERRORS`."""
    low = line.lower()
    for words, kind, meaning, fix in CUDA_ERRORS:
        if words.lower() in low:
            name = _CUDA_CLASS_NAMES.get(words) or re.sub(r"\W+", "-", words.lower()).strip("-")
            return "cuda-" + name, kind, meaning, fix
    return None


_CUDA_CLASS_NAMES = {"unsupported display driver / cuda driver combination": "system-driver-mismatch",
                     "forward compatibility was attempted on non supported HW": "compat-not-supported-on-device"}
"""Classes named after the CUDA enum (cudaErrorSystemDriverMismatch, cudaErrorCompatNotSupportedOnDevice) where CUDA's
own words mislead: the "display driver" of error 803 is the kernel driver, not a display (X server) problem."""


# ------------------------------------------------------------------------------------------- versions

@lru_cache(maxsize=2)
def load_versions(path: str | None = None) -> tuple[dict, ...]:
    """Known NCCL bugs: ``({"id", "affected": [first, last], "fixed", "pattern", "summary", "workaround", "source"}, ...)``,
    optionally ``version_from_pattern`` (bool) and ``explains`` (verdict ids: the bug's symptoms).

    Raises:
        ValueError: an entry lacks a key or a pattern does not compile (names the entry).
    """
    import yaml

    data = yaml.load(Path(path or VERSIONS_PATH).read_text(encoding="utf-8"), Loader=_yaml_loader(yaml))
    if not isinstance(data, list):
        raise ValueError(f"{path or VERSIONS_PATH}: expected a list of bug entries")
    keys = ("id", "affected", "fixed", "summary", "workaround", "source")
    out = []
    for n, e in enumerate(data):
        missing = [k for k in keys if not isinstance(e, dict) or k not in e]
        if missing:
            raise ValueError(f"versions entry {n}: missing {', '.join(missing)}; each needs {', '.join(keys)}")
        if not (isinstance(e["affected"], list) and len(e["affected"]) == 2):
            raise ValueError(f"versions entry {e['id']}: affected must be [first, last] releases")
        if e.get("pattern"):
            try:
                re.compile(e["pattern"])
            except re.error as exc:
                raise ValueError(f"versions entry {e['id']}: pattern does not compile ({exc})") from exc
        if not isinstance(e.get("explains", []), list):
            raise ValueError(f"versions entry {e['id']}: explains must be a list of verdict ids")
        out.append(dict(e))
    return tuple(out)


def version_tuple(version: str) -> tuple[int, ...]:
    """``2.21.5+cuda12.4`` -> ``(2, 21, 5)``; ``()`` when no number."""
    return tuple(int(x) for x in re.findall(r"\d+", version.split("+", 1)[0])[:3])


def bugs_for(version: str, text: str = "") -> list[dict]:
    """The known bugs whose affected range holds ``version``; those with a ``pattern`` only when ``text`` matches it.

    ``version`` "" (the log prints none): the bugs marked ``version_from_pattern`` (their message is printed only by
    the affected releases) whose pattern ``text`` matches.
    """
    if not version:
        return [e for e in load_versions() if e.get("version_from_pattern") and e.get("pattern")
                and re.search(e["pattern"], text)]
    v = version_tuple(version)
    if not v:
        return []
    out = []
    for e in load_versions():
        lo, hi = version_tuple(str(e["affected"][0])), version_tuple(str(e["affected"][1]))
        if lo <= v <= hi and (not e.get("pattern") or re.search(e["pattern"], text)):
            out.append(e)
    return out


# ------------------------------------------------------------------------------------------- coverage

def coverage(origin: str = "nccl", level: str = "WARN", latest_only: bool = True) -> dict[str, dict[str, int]]:
    """Sites the reader recognises, per subsystem: ``{subsystem: {"sites", "recognised", "specific"}}`` plus ``"all"``.

    A site (one call in the source; ``site_count`` per format) is *recognised* when the message printf makes of
    its format (:func:`helpers.nccl_log.generate.sample_message`) is matched back by :func:`match_site` to an
    entry with the same reading; it is *specific* when that reading comes from a class of :data:`KNOWLEDGE` (or,
    for ``Cuda failure`` formats, from :data:`CUDA_ERRORS` at run time) rather than the subsystem alone.

    Args:
        origin: ``nccl`` or a plugin name (``aws-ofi``...); level: ``WARN``, ``INFO`` or ``ERROR``;
        latest_only: count only the formats the newest walked release still prints.
    """
    from helpers.nccl_log.generate import sample_message

    out: dict[str, dict[str, int]] = {}
    for e in load_sites()["entries"]:
        if e["origin"] != origin or e["level"] != level or (latest_only and not e["in_latest"]):
            continue
        n = e["site_count"]
        back = match_site(sample_message(e["format"]), level)
        # the same format at another site (a plugin's copy of NCCL's socket code) prints the same message: the
        # reader cannot tell them apart and gives the other site's reading, which is then the one that counts
        ok = back is not None and (site_knowledge(back)["class"] == site_knowledge(e)["class"]
                                   or back["format"] == e["format"])
        for key in (e["subsystem"], "all"):
            row = out.setdefault(key, {"sites": 0, "recognised": 0, "specific": 0})
            row["sites"] += n
            row["recognised"] += n if ok else 0
            row["specific"] += n if ok and site_knowledge(back)["specific"] == "yes" else 0
    return out
