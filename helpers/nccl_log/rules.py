"""The verdicts: rules over the parsed log (:func:`interpret`), each finding a plain :class:`helpers.checks.Check`.

A verdict is built by :func:`verdict` (the interpreter's words: ranks and hosts go into ``values``, the single
host into ``node``, the WARN/FAIL hosts into ``faulty``).  Whether it states a cause or names a suspect is in
``values["kind"]`` (``cause`` / ``suspect``) and in the title (``suspect:``).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

from helpers.checks import NOT_OK, STATUSES, Check
from helpers.nccl_log.catalog import (
    bugs_for,
    cuda_reading,
    features_of,
    fixes_after,
    knowledge_for,
    load_catalog,
    site_knowledge,
    version_tuple,
)
from helpers.nccl_log.model import (
    _EVIDENCE_MAX,
    _VERDICT_LIST_MAX,
    GILBRETH_SINGLE_NODE_FIX,
    SEVERITIES,
    STAGES,
    Iface,
    NcclLog,
    RankInfo,
    _base_version,
    _version_code,
    bad_interface_reason,
)
from helpers.nccl_log.reading import _CONNECT_REASONS, _DIALED, _MISMATCH, _PREFIX_ANY


def verdict(id: str, status: str, title: str, ranks: Sequence[str] | None = None, hosts: Sequence[str] | None = None,
            evidence: Sequence[str] | None = None, remediation: str = "", source: str = "",
            values: dict[str, Any] | None = None, kind: str = "cause") -> Check:
    """One finding of the interpreter as a plain :class:`helpers.checks.Check`.

    Args:
        id: stable identifier (``bad-interface``, ``connect-failed``, a catalog id such as ``shm-full``...).
        status: ``FAIL`` (the job cannot work), ``WARN`` (works badly / suspect), ``INFO`` or ``OK``.
        title: one line naming the cause (or the suspect).
        ranks: keys of the ranks involved; hosts: their hosts (``values["ranks"]`` / ``values["hosts"]``, at most
            32 each, ``ranks_total`` / ``hosts_total`` when cut); one host becomes ``node``, and the hosts of a
            WARN/FAIL verdict its ``faulty`` nodes.
        evidence: log lines that show it (a few, cut to 400 characters).
        remediation: the command that confirms the cause on the node, then the change.
        source: URL or seed id the rule comes from.
        values: extra measured values (counts...).
        kind: ``cause`` (the evidence decides), ``suspect`` (the likeliest explanation, to confirm with the command
            given) or ``context`` (worth knowing, not a failure); a suspect's title starts with ``suspect:``.
    Returns:
        The check.
    Raises:
        ValueError: ``status`` not one of :data:`helpers.checks.STATUSES`, ``kind`` not one of :data:`KINDS`,
            or an empty id.
    """
    if status not in STATUSES:
        raise ValueError(f"status={status!r}: accepted values are {', '.join(STATUSES)}")
    if kind not in KINDS:
        raise ValueError(f"kind={kind!r}: accepted values are {', '.join(KINDS)}")
    all_ranks, all_hosts = list(ranks or []), list(hosts or [])
    kept_ranks, kept_hosts = all_ranks[:_VERDICT_LIST_MAX], all_hosts[:_VERDICT_LIST_MAX]
    vals: dict[str, Any] = {"ranks": kept_ranks, "hosts": kept_hosts, "kind": kind, **(values or {})}
    if len(all_ranks) > len(kept_ranks) or len(all_hosts) > len(kept_hosts):
        vals.update(ranks_total=len(all_ranks), hosts_total=len(all_hosts))
    if kind == "suspect" and not title.startswith("suspect:"):
        title = "suspect: " + title
    return Check(id=id, title=title, status=status, values=vals, remediation=remediation, source=source,
                 evidence=list(evidence or []), node=kept_hosts[0] if len(kept_hosts) == 1 else "",
                 faulty=list(kept_hosts) if status in NOT_OK else [])


KINDS = ("cause", "suspect", "context")
"""What a verdict claims: ``cause`` (the evidence decides), ``suspect`` (to confirm with the command it gives),
``context`` (worth knowing, not a failure)."""



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


def _check_interfaces(log: NcclLog, topology: str, owners: Mapping[str, set[str]]) -> list[Check]:
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
    bad_ips = {iface.ip for _, _, iface, _ in found if iface.ip}
    dialled_bad = [line for i in log.all_infos() for line in i.connect_errors
                   if (m := _DIALED.search(line)) and m.group(1) in bad_ips]
    if dialled_bad:
        severity, topology = "FAIL", "multi-node"  # a rank dialled that address and failed: the evidence decides
    scope = {"multi-node": "this multi-node job cannot reach the other nodes through it",
             "unknown": "node-local: fine on one node, unreachable from other nodes",
             "single-node": "harmless on one node, but the same settings will fail across nodes"}[topology]
    message = f"NCCL uses {', '.join(what)} for {_who(infos)}: {scope} (MN2)"
    env_note = (f"NCCL_SOCKET_IFNAME is set to {', '.join(envs)} by the environment: replace it; "
                if envs else "")
    fix = (f"{env_note}export NCCL_SOCKET_IFNAME=<data-plane iface prefix, e.g. eth/ens/ib> or "
           f"NCCL_SOCKET_IFNAME=^docker0,lo identically on every node, then check each rank's Bootstrap/NET line "
           f"names that NIC (MN2)")
    evidence = _evidence([line for i in infos for line in i.evidence_lines
                          if "NCCL_SOCKET_IFNAME" in line or any(f"{n}:" in line for n in names)] + dialled_bad[:2])
    return [verdict("bad-interface", severity, message, [i.key for i in infos], _hosts(infos), evidence, fix)]


def _check_single_node_net(log: NcclLog, topology: str) -> list[Check]:
    """All ranks on one host but channels ``via NET/...``: the Gilbreth single-node trap (§6.3, §9.4)."""
    if topology != "single-node":
        return []
    infos = [i for i in log.all_infos() if any(ch.kind == "NET" for ch in i.channels)]
    if not infos:
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
    return [verdict("single-node-net-transport", "FAIL", message, [i.key for i in infos], _hosts(infos), evidence,
                    GILBRETH_SINGLE_NODE_FIX)]


def _check_ib_loaded(log: NcclLog, topology: str) -> list[Check]:
    """One node, ``Using network IB``, no NET channel: the start of the guide's 'incorrect' output (§6.3)."""
    if topology == "multi-node" or any(ch.kind == "NET" for i in log.all_infos() for ch in i.channels):
        return []
    infos = [i for i in log.all_infos() if (i.network or "").startswith("IB")]
    if not infos:
        return []
    message = ("NCCL loaded the IB network on a job with no inter-node traffic; Gilbreth 6.3 lists "
               "'Using network IB' as its incorrect single-node output: harmless if collectives complete")
    evidence = _evidence(line for i in infos for line in i.evidence_lines if "Using network" in line)
    fix = ("only if collectives hang after Init COMPLETE: with channels 'via NET/...' " + GILBRETH_SINGLE_NODE_FIX +
           "; with channels 'via P2P/...' suspect PCIe ACS / the IOMMU instead: nvidia-smi topo -p2p r, "
           "sudo lspci -vvv | grep ACSCtl, and a rerun with NCCL_P2P_DISABLE=1 (" + ACS_DOCS + ")")
    return [verdict("single-node-ib-loaded", "INFO", message, [i.key for i in infos if i.key != "?"],
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


def _check_ib_fallback(log: NcclLog, topology: str) -> list[Check]:
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
    return [verdict("ib-fallback-socket", severity, message, [i.key for i in infos if i.key != "?"],
                    _hosts(infos), evidence, fix)]


def _check_connect(log: NcclLog, owners: Mapping[str, set[str]]) -> list[Check]:
    """``Connection refused`` / ``No route to host`` / ``connect ... failed`` / timed out."""
    infos = [i for i in log.all_infos() if i.connect_errors]
    if not infos:
        return []
    lines = [line for i in infos for line in i.connect_errors]
    reasons = [r for r in _CONNECT_REASONS if any(r in line for line in lines)] or ["connect failed"]
    used = [iface for info in log.all_infos() for iface in info.bootstrap + info.socket_ifaces + ([info.oob] if info.oob else [])]
    node_local = {iface.ip for iface in used if bad_interface_reason(iface)}
    bad_ips = node_local | {iface.ip for iface in used if len(owners.get(iface.ip, ())) > 1}
    dialed, dialled_ips = [], []
    for line in lines:
        m = _DIALED.search(line)
        if m:
            dialled_ips.append(m.group(1))
            addr = f"{m.group(1)}:{m.group(2)}"
            hosts = sorted(owners.get(m.group(1), ()))
            note = f" (advertised by {' and '.join(hosts)})" if hosts else ""
            note += " (node-local: see bad-interface)" if m.group(1) in bad_ips else ""
            if addr + note not in dialed:
                dialed.append(addr + note)
    hard = [i for i in infos if not i.completed or any(" NCCL WARN " in line for line in i.connect_errors)]
    severity = "FAIL" if hard or any(i.key == "?" for i in infos) else "WARN"
    if dialled_ips and all(ip in node_local for ip in dialled_ips):
        # every address dialled is one bad-interface names: that verdict is the cause, this one its consequence
        # (an address several hosts announce is only context there, containers-share-host: not folded)
        return [verdict("connect-failed", "INFO", f"{_who(infos)} could not connect to {', '.join(dialed[:3])} "
                        f"({', '.join(reasons)}): the consequence of the node-local address NCCL chose (bad-interface)",
                        [i.key for i in infos if i.key != "?"], _hosts(infos), _evidence(lines), "see bad-interface",
                        "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-socket-ifname",
                        kind="context")]
    transient = "" if severity == "FAIL" else " then connected (Init COMPLETE followed): transient"
    target = f" to {', '.join(dialed[:3])}" if dialed else ""
    suspects = []
    if "Connection refused" in reasons:
        suspects.append("nothing listens at that address and port (the peer died or has not started, or the address "
                        "it announced belongs to another host)")
    if {"No route to host", "Network is unreachable"} & set(reasons):
        suspects.append("the address/interface pair NCCL chose (NCCL_SOCKET_IFNAME: a NIC whose network this host "
                        "does not reach, common on multi-homed nodes)"
                        + (", or a firewall rejecting the port (it reads the same)" if "No route to host" in reasons
                           else ""))
    if "Software caused connection abort" in reasons:
        suspects.append("the connection was torn down while it was set up (the peer process or its node failed, "
                        "or a network fault between the two)")
    if {"Connection timed out", "connect failed"} & set(reasons) or not suspects:
        suspects.append("packets to that address are dropped (a firewall, or an address not reachable from here: "
                        "NCCL_SOCKET_IFNAME)")
    message = (f"{'; or '.join(suspects)}: {_who(infos)} could not connect{target} "
               f"({', '.join(reasons)}){transient}")
    fix = ("confirm from the failing node: 'ip route get <address>' (no route, or a route through another NIC: pin "
           "NCCL_SOCKET_IFNAME to the interface on the network every node shares), 'nc -zv <address> <port>' while the "
           "peer runs (refused: nothing listens there; no answer: a firewall drops it; 'No route to host' with a route "
           "present: a firewall rejects it), and the peer's own Bootstrap/NET line (the address it announced; MN2; "
           "NVIDIA/nccl-tests#162)")
    return [verdict("connect-failed", severity, message, [i.key for i in infos if i.key != "?"], _hosts(infos),
                    _evidence(lines), fix,
                    "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-socket-ifname",
                    kind="suspect")]


def _check_no_interface(log: NcclLog) -> list[Check]:
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
    return [verdict("no-interface", "FAIL", message, [i.key for i in infos if i.key != "?"], _hosts(infos),
                    evidence, fix)]


def _check_init(log: NcclLog, explained_hosts: set[str] = frozenset()) -> list[Check]:
    """A rank whose log stops before Init COMPLETE while others completed: its host is the culprit (MN1)."""
    ranks = list(log.ranks.values())
    done = [r for r in ranks if r.completed]
    stuck = [r for r in ranks if not r.completed]
    fix = ("on that host: systemctl status nvidia-fabricmanager (must be active, version = driver), nvidia-smi for "
           "GPU errors; restart the service or relaunch without that node (MN1)")
    if done and stuck and "excerpt-elided" in log.catalog:
        message = (f"suspect: {_who(stuck)} on {_names(_hosts(stuck)) or 'unknown host'} shows no Init COMPLETE while "
                   f"{len(done)} rank(s) completed, but the log is an excerpt with lines left out: the line may only "
                   "be missing from it")
        return [verdict("init-incomplete", "WARN", message, [r.key for r in stuck], _hosts(stuck),
                        _evidence([f"last line of {r.key}: {r.last_line}" for r in stuck]),
                        "read the whole log of that rank first; " + fix, kind="suspect")]
    if done and stuck:
        stages = sorted({r.stage_name for r in stuck})
        message = (f"{_who(stuck)} on {_names(_hosts(stuck)) or 'unknown host'} stopped before Init COMPLETE "
                   f"(last stage: {', '.join(stages)}) while {len(done)} rank(s) completed: "
                   f"that host is the culprit (MN1)")
        evidence = _evidence([f"last line of {r.key}: {r.last_line}" for r in stuck] +
                             [done[0].init_complete[0].line])
        return [verdict("init-incomplete", "FAIL", message, [r.key for r in stuck], _hosts(stuck), evidence, fix)]
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
        return [verdict("init-incomplete", "WARN", message, [r.key for r in culprits], first, evidence, fix)]
    absent = _ranks_never_started(ranks)
    if absent:
        return [absent]
    return [verdict("no-init-complete", "INFO",
                    f"no rank printed Init COMPLETE ({len(ranks)} rank(s) seen): the log is cut short, or every rank "
                    f"stopped in init (see the other verdicts)", [r.key for r in ranks], _hosts(ranks),
                    _evidence(f"last line of {r.key}: {r.last_line}" for r in ranks[:3]),
                    "check for 'Init COMPLETE' per rank (Gilbreth 9.3, Gilbreth 9.4); rerun with NCCL_DEBUG=INFO "
                    "to the end of init")]


def _ranks_never_started(ranks: Sequence[RankInfo]) -> Check | None:
    """Ranks of a communicator that never printed ``Init START`` while the others wait in it (a dead or late rank).

    ``ncclCommInitRank`` cannot pass its bootstrap until every rank of the communicator has called it
    (src/bootstrap.cc: the root gathers one address per rank), so ranks that printed ``Init START ... nranks N``
    and nothing later wait for the ranks missing from that line's count.  Reported when every rank seen stopped at
    ``Init START``, all for communicators of one size N, and fewer than N distinct ranks printed it.  A rank that
    reached the topology or channel lines got past the bootstrap, so every rank had joined: no verdict then.  The
    missing ranks' output may only be absent from the log (another node's file), so it is a suspect.
    """
    started = [r for r in ranks if r.init_starts and r.rank is not None]
    sizes = {r.nranks for r in started}
    if (not started or len(started) != len(ranks) or len(sizes) != 1
            or any(r.stage > STAGES.index("init-start") for r in started)):
        return None
    size = sizes.pop() or 0
    seen = sorted({r.rank for r in started if r.rank is not None})
    missing = [k for k in range(size) if k not in seen]
    if not missing or len(seen) >= size:
        return None
    shown = ", ".join(str(k) for k in missing[:8]) + (f" ... ({len(missing)} in all)" if len(missing) > 8 else "")
    message = (f"suspect: a communicator of {size} ranks: rank(s) {', '.join(str(k) for k in seen[:8])} printed Init "
               f"START and wait in NCCL's bootstrap, while rank(s) {shown} never appear: they did not reach "
               f"init_process_group (crashed or stuck before it, or started late), or their output is not in this "
               f"log; a blocking NCCL init waits for them without a time limit")
    fix = ("find the missing ranks' own output first (their node's log, the launcher's 'exitcode' lines, dmesg for an "
           "OOM kill); py-spy dump --pid on a missing rank that is still alive shows where it stands; a waiting rank "
           "shows only ncclCommInitRank")
    # the waiting ranks and their hosts are not at fault: no ranks or hosts, so no node is named faulty
    return verdict("ranks-never-started", "WARN", message, [], [],
                   _evidence(f"last line of {r.key}: {r.last_line}" for r in started[:3]), fix,
                   "https://github.com/NVIDIA/nccl/blob/v2.28.9-1/src/bootstrap.cc", values={"missing_ranks": missing[:_VERDICT_LIST_MAX], "missing_total": len(missing),
                           "waiting_ranks": seen[:_VERDICT_LIST_MAX]}, kind="suspect")


_MEMBER = re.compile(r"GLOBAL_RANK: (\d+), MEMBER: (\d+)/(\d+)")


_NO_RANKS = re.compile(r"root should be in the 0\.\.-\d+ range|\brank -1 nranks -1\b")
_ARGCHECK = "https://github.com/NVIDIA/nccl/blob/v2.30.7-1/src/misc/argcheck.cc"


def _check_comm_never_initialized(log: NcclLog, verdicts: list[Check]) -> list[Check]:
    """``verdicts`` plus a reading of a collective on a communicator whose init never completed: its root range ends
    below 0 (``invalid root 0 (root should be in the 0..-1 range)``: argcheck.cc prints ``comm->nRanks``, at least 1
    once init completed) or NCCL prints it as ``rank -1 nranks -1`` when it aborts it (init.cc's ``Abort COMPLETE``
    line, with the fields init never filled).  The collective's error follows from the failed init: the call's
    arguments are not the fault, the init's first error (or an NCCL other than the one the framework was built
    against) is, so the site readings of those lines (``nccl.usage-error``) become INFO context.  When another verdict
    states a cause (a CUDA driver too old for the build), the failed init is its consequence: INFO."""
    lines = [line for hit in log.sites.values() for line in hit.evidence if _NO_RANKS.search(line)]
    if not lines:
        return verdicts
    caused = any(v.status == "FAIL" and v.values.get("kind") == "cause" and
                 not all(_NO_RANKS.search(x) for x in v.evidence) for v in verdicts)
    if caused:
        return verdicts + [verdict(
            "comm-never-initialized", "INFO", "the communicator never finished its init (rank -1, nranks -1; a root "
            "range of 0..-1): the collective errors that follow are a consequence of the failure named above",
            [], [], _evidence(lines)[:2], "see the verdict above", _ARGCHECK, kind="context")]
    infos = [i for i in log.all_infos() if any(_NO_RANKS.search(x) for x in i.warns + [i.last_line])]
    versions = sorted({i.nccl_version for i in log.all_infos() if i.nccl_version})
    on = f" on NCCL {', '.join(versions)}" if versions else ""
    quiet = [_as_context(v) if v.status in NOT_OK and v.evidence and all(_NO_RANKS.search(x) for x in v.evidence)
             else v for v in verdicts]
    return quiet + [verdict(
        "comm-never-initialized", "FAIL",
        f"suspect: communicator initialisation failed{on}: the communicator still has no ranks when it is used or "
        "aborted (rank -1, nranks -1; a root range of 0..-1), so the collective errors that follow (invalid root, "
        "invalid usage) come from the failed init, not from the call's arguments",
        [i.key for i in infos if i.key != "?"], _hosts(infos), _evidence(lines),
        "find the init's first error (NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=INIT, the lines before the first collective); "
        "check that every node loads the NCCL the framework was built against (horovodrun --check-build, python -c "
        "'import torch; print(torch.cuda.nccl.version())', ldd on the framework's library | grep nccl): a build "
        "against another NCCL release fails its init this way", _ARGCHECK, kind="suspect")]


def _check_lightning_members(log: NcclLog) -> list[Check]:
    """Fewer Lightning processes announced themselves than the world size, and none got further.

    Lightning's ``_init_dist_connection`` (lightning/fabric/utilities/distributed.py) logs ``Initializing distributed:
    GLOBAL_RANK: r, MEMBER: r+1/N`` in each process just before ``init_process_group``, and rank 0 logs ``All
    distributed processes registered. Starting with N processes`` once that call returns on every rank.  A log with
    k < N MEMBER lines, no such line and no rank past NCCL's init shows ranks waiting for N - k processes that never
    called it: under SLURM, the usual reason is a job started without ``srun`` or with fewer tasks than
    ``num_nodes x devices`` (Lightning's SLURM contract,
    https://lightning.ai/docs/pytorch/stable/clouds/cluster_advanced.html).  A suspect: another node's log may hold
    the missing lines.
    """
    hit = log.catalog.get("lightning-member")
    if hit is None or "lightning-all-registered" in log.catalog:
        return []
    found = [m for m in map(_MEMBER.search, hit.evidence) if m]
    sizes = {int(m.group(3)) for m in found}
    if len(sizes) != 1 or any(i.completed or i.channels for i in log.all_infos()):
        return []
    size = sizes.pop()
    ranks = sorted({int(m.group(1)) for m in found})
    count = len(ranks) if len(hit.evidence) < _EVIDENCE_MAX else hit.count
    if count >= size:
        return []
    shown = ", ".join(map(str, ranks)) + (" ..." if count > len(ranks) else "")
    message = (f"suspect: {count} of {size} Lightning processes announced themselves (MEMBER lines of rank(s) {shown}) "
               f"and no rank got past init_process_group: the others never started, so the ones that did wait for "
               f"them (or their lines are in another node's log)")
    fix = ("under SLURM start the script with srun and one task per device (#SBATCH --ntasks-per-node equal to "
           "Trainer(devices=...), --nodes equal to num_nodes); with torchrun, --nnodes x --nproc-per-node must equal "
           "num_nodes x devices; confirm with each node's log: one MEMBER line per rank")
    return [verdict("lightning-ranks-missing", "WARN", message, [], [], hit.evidence[:3], fix,
                    "https://lightning.ai/docs/pytorch/stable/clouds/cluster_advanced.html",
                    values={"announced": count, "world_size": size}, kind="suspect")]


def _check_requested_plugin(log: NcclLog) -> list[Check]:
    """``NCCL_NET_PLUGIN`` names a plugin that no library on the host provides, so NCCL runs its internal transports.

    NCCL tries ``<name>`` and ``libnccl-net-<name>.so`` and prints ``NET/Plugin: Could not find: ...`` (2.2x-2.28:
    ``No plugin found`` / ``Plugin load returned``) before falling back to its internal IB and Socket code
    (src/plugin/plugin_open.cc, src/plugin/net.cc).  On a fabric that needs the plugin (AWS EFA through aws-ofi-nccl,
    Google's TCPX/TCPXO/gIB) that fallback is the slow path or a failure, and the user asked for the plugin: WARN.
    ``NCCL_NET_PLUGIN=none`` (no plugin wanted) and the default name are left alone.
    """
    infos = [i for i in log.all_infos() if i.net_plugin is False
             and i.env.get("NCCL_NET_PLUGIN", "none").strip().lower() not in ("", "none", "libnccl-net.so")]
    if not infos:
        return []
    names = sorted({i.env["NCCL_NET_PLUGIN"] for i in infos})
    message = (f"NCCL_NET_PLUGIN={','.join(names)} was not found on {_names(_hosts(infos)) or 'this host'}: NCCL runs "
               f"its internal IB/Socket transports instead of the plugin asked for (on EFA or TCPX fabrics, the slow "
               f"path or a failure)")
    evidence = _evidence([line for i in infos for line in i.evidence_lines
                          if "NCCL_NET_PLUGIN" in line or "Plugin" in line])
    fix = ("confirm with ldconfig -p | grep nccl-net and ls $(dirname of the plugin)/libnccl-net-*.so beside "
           "echo $LD_LIBRARY_PATH on that node; install the plugin built for this NCCL, add its folder to "
           "LD_LIBRARY_PATH, or unset NCCL_NET_PLUGIN (none) where no plugin is wanted")
    return [verdict("net-plugin-not-found", "WARN", message, [i.key for i in infos if i.key != "?"], _hosts(infos),
                    evidence, fix, "https://github.com/NVIDIA/nccl/blob/v2.28.9-1/src/plugin/plugin_open.cc")]


def _check_versions(log: NcclLog) -> list[Check]:
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
    return [verdict("mixed-nccl-version", "FAIL", message, [i.key for i in involved if i.key != "?"],
                    _hosts(involved), evidence, fix)]


_QUIET_INFO = {"plugin-load", "ibverbs-missing", "verbs-symbol", "version-mismatch", "topology", "nvml", "gdrcopy", "collnet", "ras",
               "usage-error", "internal"}
"""Classes of INFO sites that are NCCL's normal path (no plugin, no libibverbs, a fallback it took): no verdict."""

_VAGUE = {"system-call", "timeout", "internal", "cuda-failure"}
"""Site classes that say little when the format hides the failing call: the printed message is read too."""


def _message(line: str) -> str:
    """The message of an NCCL line (after ``NCCL WARN`` / ``NCCL INFO``), or the line."""
    for mark in ("NCCL WARN ", "NCCL INFO "):
        if mark in line:
            return line.split(mark, 1)[1]
    return line


_NOT_EXPLAINING = {"init-incomplete", "connect-failed", "no-init-complete", "torch-async-abort", "torch-dump-signal",
                   "torch-dump-self",
                   "torch-desync-seq", "gdr-not-used", "nccl-ib-hca-syntax", "nccl-socket-ifname-syntax"}
"""Verdicts that say where a job stopped but not why: the site readings keep their status next to them."""


def _check_sites(log: NcclLog, verdicts: list[Check]) -> list[Check]:
    """WARN lines (and failure INFO lines) no verdict above used, read through the catalog generated from the sources.

    Lines are grouped by the reading of the site that printed them (:func:`helpers.nccl_log.catalog.knowledge_for`):
    one verdict per class, ``nccl.<class>``, with the class's meaning, fix, status and kind (a suspect says so).  A
    ``Cuda failure`` line is read through the CUDA error it quotes (:data:`helpers.nccl_log.catalog.CUDA_ERRORS`).
    INFO sites and consequence classes (a peer closed the connection, the proxy failed) stay INFO, and so does
    every site reading when a verdict above already names a failure (the first cause explains the later lines).  WARN lines no
    site matches go to ``other-warnings`` (INFO), so none is lost.
    """
    used = {line for v in verdicts for line in v.evidence}
    explained = any(v.status in NOT_OK and v.id not in _NOT_EXPLAINING | _GENERIC for v in verdicts)
    groups: dict[str, dict[str, Any]] = {}
    unmatched: list[tuple[list[str], list[str], list[str]]] = []
    for index, hit in sorted(log.sites.items()):
        lines = [line for line in hit.evidence if line not in used]
        if not lines:
            continue
        if index < 0:
            unmatched.append((lines, hit.keys, hit.hosts))
            continue
        e = hit.entry
        for k, part, count, keys, order in _site_readings(e, hit, lines):
            if e["level"] == "INFO" and (k["class"] in _QUIET_INFO or k["class"].startswith("other-")):
                continue
            if k["class"] == "socket-peer-closed" and any("bootstrap" in r.error_chain for r in log.all_infos()):
                k = dict(k, **{"class": "bootstrap-peer-closed", "status": "WARN", "kind": "suspect", "meaning": (
                    "a connection closed during bootstrap (the error returns through bootstrap.cc): a peer rank died "
                    "while connecting, or another program (a port scanner, a health check) opened a stray connection to "
                    "NCCL's bootstrap port; NCCL before 2.27.3 fails on such a connection (release notes 2.27.3: accept() "
                    "retries when reading the magic fails)"), "fix": (
                    "check that every rank is alive (the launcher's exit codes) and whether a scanner or health check "
                    "probes the nodes' ports; upgrade to NCCL 2.27.3 or later")})
            if k["status"] in NOT_OK and (k["kind"] == "context" or explained):
                k["status"] = "INFO"
            g = groups.setdefault(k["class"], {"k": k, "lines": [], "keys": [], "hosts": [], "count": 0, "sites": [],
                                               "releases": [], "order": {}, "after": None})
            g["lines"] += part
            g["count"] += count
            g["keys"] += [x for x in keys if x != "?" and x not in g["keys"]]
            g["hosts"] += [x for x in hit.hosts if x not in g["hosts"]]
            g["sites"] += e["sites"][:1]
            g["releases"].append(f"{e['first']}..{e['last']}")
            for key, when in order.items():
                g["order"][key] = min(g["order"].get(key, when), when)
    _after_first_failure(groups)
    out = []
    for cid, g in groups.items():
        k = g["k"]
        where = f" on {', '.join(g['hosts'][:4])}" if g["hosts"] else ""
        after = (f"; printed after nccl.{g['after']}, the first failure of the same rank(s): a consequence"
                 if g["after"] else "")
        title = f"{k['meaning']} ({g['count']} line(s){where}{after})"
        values = {"lines": g["count"], "sites": g["sites"][:4], "releases": sorted(set(g["releases"]))[:4],
                  "reference": k["source"]}
        if g["after"]:
            values["after_first_failure"] = f"nccl.{g['after']}"
        out.append(verdict(f"nccl.{cid}", k["status"], title, g["keys"], g["hosts"], _evidence(g["lines"]),
                           k["fix"], g["sites"][0] if g["sites"] else k["source"], values,
                           kind=k["kind"] if k["kind"] in KINDS else "suspect"))
    if unmatched:
        lines = [line for ls, _, _ in unmatched for line in ls]
        keys = [k for _, ks, _ in unmatched for k in ks if k != "?"]
        hosts = sorted({h for _, _, hs in unmatched for h in hs})
        out.append(verdict("other-warnings", "INFO", f"{len(lines)} NCCL WARN line(s) that no source site of the "
                           f"catalog matches (an older or patched NCCL, or a plugin not in the catalog)", keys, hosts,
                           _evidence(lines), "read them in full; search the message in https://github.com/NVIDIA/nccl/issues",
                           kind="context"))
    return out


def _site_readings(e: dict, hit: Any, lines: list[str]) -> list[tuple[dict, list[str], int, list[str], dict]]:
    """The readings of one site's unused evidence ``lines``: ``[(knowledge, lines, count, rank keys, order)]``.

    One reading per site, except ``Cuda failure '%s'``: one site prints every CUDA error, so its lines are read one by
    one through the error each quotes (:func:`helpers.nccl_log.catalog.cuda_reading`) and grouped by it; the lines
    not kept as evidence count with the first group.  ``order`` maps each rank key to ``(input line of the site's
    first line from that rank, position of the group's first line among the evidence)``: which failure a rank
    printed first.
    """
    k = dict(site_knowledge(e))
    if k["class"] in _VAGUE or k["class"].startswith("other-"):
        # the format hides what failed ("Call to %s failed"): read the printed message itself
        printed = knowledge_for(_message(lines[0]), e["subsystem"], e["level"])
        if printed["specific"] == "yes" and printed["class"] not in _VAGUE:
            k = dict(printed)
    if k["class"] != "cuda-failure":
        return [(k, lines, hit.count, list(hit.keys), {key: (hit.firsts.get(key, hit.first), 0) for key in hit.keys})]
    parts: dict[str, tuple[dict, list[str], int]] = {}
    for pos, line in enumerate(lines):
        reading = cuda_reading(line)
        kk = dict(k)
        if reading:
            kk.update({"class": reading[0], "kind": reading[1], "meaning": reading[2], "fix": reading[3],
                       "specific": "yes"})
        if kk["class"] not in parts:
            parts[kk["class"]] = (kk, [], pos)
        parts[kk["class"]][1].append(line)
    out = []
    for n, (kk, part, pos) in enumerate(parts.values()):
        count = len(part) + (hit.count - len(lines) if n == 0 else 0)
        keys = [key for key in hit.keys if any(_line_key(line) == key for line in part)] or list(hit.keys)
        out.append((kk, part, count, keys, {key: (hit.firsts.get(key, hit.first), pos) for key in keys}))
    return out


def _line_key(line: str) -> str | None:
    """The rank key (``host:pid[dev]``) of a line with NCCL's prefix, or None."""
    m = _PREFIX_ANY.search(line[:300])
    return f"{m['host']}:{int(m['pid'])}[{int(m['dev'])}]" if m else None


def _after_first_failure(groups: dict[str, dict[str, Any]]) -> None:
    """Turn the site readings a rank printed after its first stated failure into INFO context (in place).

    NCCL returns an error up the stack after its first failure, and the program then tears the communicator down
    (or calls it again), so what one rank prints after a decided cause follows from it: CUDA calls on a communicator
    whose setup failed, argument checks on a destroyed one (``invalid root 0 (root should be in the 0..-1 range)``:
    ``nRanks`` is 0), ``cudaSetDevice`` in ``commDestroy``.  The maintainers read the first WARN of a rank
    (https://github.com/NVIDIA/nccl/issues/328: "the only thing we can tell is that a call to shm_open failed").
    A later reading is demoted only when every rank that printed it printed the earlier FAIL cause first.
    """
    acting = sorted((g for g in groups.values() if g["k"]["status"] in NOT_OK and g["keys"]),
                    key=lambda g: min(g["order"].values(), default=(0, 0)))
    for first in acting:
        if first["after"] or first["k"]["status"] != "FAIL" or first["k"]["kind"] != "cause":
            continue
        for later in acting:
            if later is first or later["after"]:
                continue
            if all(key in first["order"] and first["order"][key] < later["order"].get(key, (0, 0))
                   for key in later["keys"]):
                later["after"] = first["k"]["class"]
                later["k"] = dict(later["k"], status="INFO", kind="context")


def _check_catalog(log: NcclLog) -> list[Check]:
    """One verdict per hand-written catalog entry some line matched: its cause, the confirming command and fix.

    An entry whose ``explained_by`` entries matched too gives no verdict of its own: its lines go with the first of
    them (``Error while creating shared memory segment`` follows the call that failed, which names the cause).
    """
    out = []
    folded: dict[str, list[Any]] = {}
    for cid, hit in log.catalog.items():
        by = [x.strip() for x in hit.entry.get("explained_by", "").split(",") if x.strip() in log.catalog]
        if by:
            folded.setdefault(by[0], []).append(hit)
    for cid, hit in log.catalog.items():
        e = hit.entry
        if any(x.strip() in log.catalog for x in e.get("explained_by", "").split(",") if x.strip()):
            continue
        extra = folded.get(cid, [])
        keys = [k for k in hit.keys if k != "?"]
        keys += [k for h in extra for k in h.keys if k != "?" and k not in keys]
        hosts = hit.hosts + [x for h in extra for x in h.hosts if x not in hit.hosts]
        where = f" on {', '.join(hosts)}" if hosts else ""
        cause, fix, kind, vid = e["cause"], e["fix"], e["kind"], cid
        reading = cuda_reading(" ".join(hit.evidence)) if cid in _READ_CUDA else None
        if reading and reading[0] in _CUDA_TO_CATALOG:
            e = next(x for x in load_catalog() if x["id"] == _CUDA_TO_CATALOG[reading[0]])
            vid, kind, cause, fix = e["id"], e["kind"], e["cause"], e["fix"]
        elif reading:
            vid, kind, cause, fix = f"nccl.{reading[0]}", reading[1], reading[2], reading[3]
        count = hit.count + sum(h.count for h in extra)
        sent = foreign_bytes(" ".join(hit.evidence)) if cid == "nccl-foreign-connection" else ""
        if sent:
            cause = f"the client sent {sent!r} where NCCL expects its magic: {cause}"
        raised = _EXCEPTION.match(hit.evidence[0]) if cid == "rank-python-exception" and hit.evidence else None
        if raised:
            who = f"rank {raised['rank']}" if raised["rank"] else "a rank"
            cause = f"{who} raised {raised['what'][:200]}: {cause}"
        message = f"{cause} ({count} line(s){where})"
        evidence = _evidence(hit.evidence + [line for h in extra for line in h.evidence])
        out.append(verdict(vid, e["status"], message, keys, hosts, evidence, fix, e["source"],
                           {"lines": count, "subsystem": e["subsystem"]}, kind=kind))
    return out


_MAGIC = re.compile(r"wrong magic ([0-9a-fA-F]{1,16}) != ")
_EXCEPTION = re.compile(r"^(?:\[(?:rank|default)(?P<rank>\d+)\]:\s*)?(?P<what>\S.*)$")


def foreign_bytes(text: str) -> str:
    """What a non-NCCL client sent, from ``socketFinalizeAccept: wrong magic <received> != <expected>``: NCCL prints
    the 8 received bytes as one uint64 in hex (``%lx``, misc/socket.cc), so on a little-endian host the text the
    client sent is that number's bytes, lowest first (``74656d2f20544547`` -> ``GET /met``).  "" when the line has no
    such number or its bytes are not printable ASCII."""
    m = _MAGIC.search(text)
    if not m:
        return ""
    raw = int(m.group(1), 16).to_bytes(8, "little").rstrip(b"\0")
    return raw.decode("ascii") if raw and all(32 <= b < 127 for b in raw) else ""


_READ_CUDA = {"nccl-tests-cuda-failure", "torch-cuda-error"}
"""Catalog entries whose line quotes a CUDA error string: read through :data:`helpers.nccl_log.catalog.CUDA_ERRORS`."""
_CUDA_TO_CATALOG = {"cuda-system-not-yet-initialized": "cuda-802-fabric-manager"}
"""A CUDA error the hand-written catalog already reads: its entry is used."""


_GLOO_LOOPBACK_PEER = re.compile(r"(?:remote=|connect\s*)\[?(127\.\d+\.\d+\.\d+)\]?")
_GLOO_DEVICE = "https://github.com/pytorch/pytorch/blob/v2.13.0/torch/csrc/distributed/c10d/GlooDeviceFactory.cpp"


def _check_gloo_loopback(log: NcclLog) -> list[Check]:
    """A gloo pair that fails to connect to a peer at a loopback address (``remote=[127.0.0.1]``, ``connect
    [127.0.1.1]:3210``), or after the warning that gloo bound the loopback address: the peer advertised its
    hostname's address, which is loopback (Debian/Ubuntu map the hostname to 127.0.1.1 in /etc/hosts; a pod on the
    host network can resolve it to 127.0.0.1), so ranks on other hosts connect to themselves and are refused.

    PyTorch's gloo device takes the address the hostname resolves to, else loopback with the warning "Unable to
    resolve hostname to a (local) address. Using the loopback address as fallback. Manually set the network
    interface to bind to with GLOO_SOCKET_IFNAME." (:data:`_GLOO_DEVICE`, ``makeDeviceForHostname``)."""
    failed = log.catalog.get("gloo-connect-failed")
    if failed is None:
        return []
    text = " ".join(failed.evidence)
    peer = _GLOO_LOOPBACK_PEER.search(text)
    fallback = log.catalog.get("gloo-loopback-fallback")
    if not peer and fallback is None:
        return []
    why = (f"a gloo rank connected to a peer at {peer.group(1)}, a loopback address" if peer else
           "gloo bound the loopback address (its hostname resolved to no usable address) and a gloo pair then "
           "failed to connect")
    keys = [k for k in failed.keys + (fallback.keys if fallback else []) if k != "?"]
    hosts = sorted(set(failed.hosts) | set(fallback.hosts if fallback else []))
    evidence = _evidence((fallback.evidence[:1] if fallback else []) + failed.evidence)
    return [verdict("gloo-loopback-address", "FAIL",
                    f"{why}: the peer advertised the address its hostname resolves to, which is loopback (127.0.1.1 in "
                    "Debian/Ubuntu's /etc/hosts, 127.0.0.1 in a host-network pod), so ranks on other hosts cannot "
                    "reach it (Connection refused / timed out)", keys, hosts, evidence,
                    "confirm with getent hosts $(hostname) on each node (a 127.x answer is the fault); set "
                    "GLOO_SOCKET_IFNAME to the data interface (ip -br addr) on every node, or map the hostname to the "
                    "node's data-plane address in /etc/hosts", _GLOO_DEVICE)]


def _check_nvls_stall(log: NcclLog) -> list[Check]:
    """A rank whose log stops on an NVLS setup line, with no Init COMPLETE: NVLS setup hangs (a suspect).

    NCCL prints ``NVLS Bind mem ...`` / ``NVLS multicast support ...`` while it binds NVLink SHARP multicast memory;
    a log that ends there without ``Init COMPLETE`` stalled in that step (the fabric manager / NVSwitch path).
    """
    stuck = [r for r in log.all_infos() if not r.completed and "NVLS" in r.last_line]
    if not stuck:
        return []
    return [verdict("nvls-setup-stalled", "WARN",
                    f"{_who(stuck)} stopped while setting up NVLink SHARP (NVLS) multicast memory, before Init COMPLETE",
                    [r.key for r in stuck if r.key != "?"], _hosts(stuck), _evidence(r.last_line for r in stuck),
                    "confirm with a rerun with NCCL_NVLS_ENABLE=0 (init then completes); systemctl status "
                    "nvidia-fabricmanager and nvidia-smi -q | grep -A2 Fabric on that node",
                    "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-nvls-enable", kind="suspect")]


def _check_nccl_tests_separate(log: NcclLog) -> list[Check]:
    """One nccl-tests run that printed its summary several times: each MPI process ran a test of its own.

    nccl-tests prints ``# Avg bus bandwidth`` once per test run; built without ``MPI=1`` every process that mpirun
    starts runs its own single-process test (nccl-tests README, "MPI support"), so one log holds several summaries
    and no cross-node traffic happened.
    """
    if log.nccl_tests_summaries < 2 or len(log.sources) != 1:
        return []
    return [verdict("nccl-tests-without-mpi", "FAIL",
                    f"nccl-tests printed its result summary {log.nccl_tests_summaries} times in one run: each MPI "
                    f"process ran a separate single-process test (nccl-tests built without MPI=1), so the ranks never "
                    f"talked to each other", [], [], [],
                    "confirm with ldd ./build/all_reduce_perf | grep -i mpi (no libmpi: built without MPI); make clean "
                    "and rebuild with make MPI=1 MPI_HOME=<mpi prefix>, then launch with mpirun",
                    "https://github.com/NVIDIA/nccl-tests#mpi", kind="cause")]


IB_HINTS = "https://github.com/NVIDIA/nccl/blob/v2.30.7-1/src/transport/net_ib/common.h"


def _check_ib_remote_error(log: NcclLog) -> list[Check]:
    """A remote/network error on a job that uses InfiniBand, with no WARN line that names it: NCCL's own IB hints.

    When an IB work request fails NCCL prints three hints (``src/transport/net_ib/common.h``): PCIe ACS breaking
    GPU Direct RDMA (confirm with NCCL_NET_GDR_LEVEL=0), NICs of the fabric that cannot reach each other, and an
    NCCL_IB_TIMEOUT too short.  A log that only shows the remote error gets those suspects, with the commands that
    tell them apart.
    """
    remote = log.catalog.get("torch-nccl-remote-error")
    ib = [r for r in log.all_infos() if _is_ib(r) or any(i.name.startswith("ib") for i in r.bootstrap[:1])]
    if remote is None or not ib or any(r.warns for r in log.all_infos()):
        return []
    return [verdict("ib-network-error", "WARN",
                    "a remote/network error on an InfiniBand job, with no WARN line naming it: NCCL's IB hints name "
                    "PCIe ACS breaking GPU Direct RDMA, a faulty node or link in the IB fabric (NICs that cannot reach "
                    "each other), or NCCL_IB_TIMEOUT too short", [r.key for r in ib if r.key != "?"], _hosts(ib),
                    _evidence(remote.evidence[:2] + [line for r in ib for line in r.evidence_lines][:2]),
                    "rerun with NCCL_DEBUG=INFO NCCL_DEBUG_SUBSYS=NET to get the completion error; then: sudo lspci -vvv "
                    "| grep ACSCtl and a rerun with NCCL_NET_GDR_LEVEL=0 (works: ACS), ibv_devinfo and ib_write_bw "
                    "between the nodes (one pair fails: that node or link), NCCL_IB_TIMEOUT=22 (works: timeout)",
                    IB_HINTS, kind="suspect")]


def _check_ipoib_bootstrap_stall(log: NcclLog) -> list[Check]:
    """No rank got past the network setup, and NCCL bootstraps over an IPoIB interface (``ib*``): a suspect.

    NCCL picks ``ib*`` interfaces first when NCCL_SOCKET_IFNAME is not set (NCCL's environment documentation,
    NCCL_SOCKET_IFNAME); IPoIB addresses are often not reachable from containers or between partitions, and the
    bootstrap then waits.  Only when no rank reached Init START and no other verdict explains it.
    """
    ranks = list(log.ranks.values())
    if not ranks or any(r.stage >= STAGES.index("init-start") for r in ranks):
        return []
    users = [r for r in ranks if r.bootstrap and r.bootstrap[0].name.startswith("ib")]
    if not users or any(r.socket_ifname_env for r in users):
        return []
    names = sorted({r.bootstrap[0].name for r in users})
    return [verdict("bootstrap-ipoib", "INFO",
                    f"if the job hangs here: the log stops before init while NCCL bootstraps over the IPoIB interface {', '.join(names)} "
                    f"(chosen first when NCCL_SOCKET_IFNAME is unset): IPoIB is often not reachable from containers "
                    f"or between nodes", [r.key for r in users], _hosts(users),
                    _evidence(line for r in users for line in r.evidence_lines if "Bootstrap" in line),
                    "confirm with ping -I <ipoib iface> <peer's IPoIB address> from inside the container; set "
                    "NCCL_SOCKET_IFNAME to the Ethernet NIC every node shares (IB can still carry the data)",
                    "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-socket-ifname",
                    kind="suspect")]


ACS_DOCS = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting.html#pci-access-control-services-acs"


def _check_p2p_hang(log: NcclLog, topology: str, verdicts: list[Check]) -> list[Check]:
    """One node, P2P channels, ``Init COMPLETE``, then a collective timeout: the PCIe ACS / IOMMU suspect.

    NCCL's troubleshooting guide ("PCI Access Control Services (ACS)"): with ACS or the IOMMU redirecting PCIe
    peer-to-peer traffic to the root complex, P2P transfers between GPUs are slow or hang; init completes (nothing
    fails during setup) and the first collective never finishes.  Gilbreth 6.3 shows this log on PCIe A100s.
    The commands tell it apart: ``nvidia-smi topo -p2p r`` (P2P reads supported?), ``lspci -vvv | grep ACSCtl``
    (SrcValid+ / ReqRedir+ on the bridges above the GPUs), and a rerun with ``NCCL_P2P_DISABLE=1`` (completes:
    P2P was the problem).
    """
    timed_out = {"torch-watchdog-timeout", "torch-heartbeat-timeout"} & set(log.catalog)
    if topology != "single-node" or not timed_out:
        return []
    p2p = [i for i in log.all_infos() if any(ch.kind == "P2P" for ch in i.channels)]
    net = any(ch.kind == "NET" for i in log.all_infos() for ch in i.channels)
    if not p2p or net or not any(i.completed for i in log.ranks.values()):
        return []
    if any(v.status == "FAIL" and v.values.get("kind") == "cause" for v in verdicts):
        return []
    vias = sorted({ch.short for i in p2p for ch in i.channels if ch.kind == "P2P"})
    evidence = _evidence([ch.line for i in p2p for ch in i.channels if ch.kind == "P2P"][:2] +
                         [c.line for i in p2p for c in i.init_complete][:1] +
                         [line for cid in sorted(timed_out) for line in log.catalog[cid].evidence][:2])
    title = (f"one node, GPUs connected via {', '.join(vias)}, Init COMPLETE, then a collective timed out: PCIe "
             f"ACS or the IOMMU redirecting peer-to-peer traffic (P2P transfers stall; NCCL troubleshooting, "
             f"'PCI Access Control Services'; Gilbreth 6.3)")
    fix = ("confirm on that node: nvidia-smi topo -p2p r (P2P reads between the GPUs), sudo lspci -vvv | grep ACSCtl "
           "(SrcValid+ / ReqRedir+ on PCIe bridges means ACS is on), and a rerun with NCCL_P2P_DISABLE=1 (it completes "
           "when P2P is the problem); then disable ACS in the BIOS (or setpci at boot) and boot with iommu=pt / "
           "intel_iommu=off; keep NCCL_P2P_DISABLE=1 (slower, via SHM) until then")
    return [verdict("p2p-acs-hang", "FAIL", title, [i.key for i in p2p if i.key != "?"], _hosts(p2p), evidence, fix,
                    ACS_DOCS, {"transports": vias}, kind="suspect")]


SHORT_TIMEOUT_MS = 60_000
"""A process group timeout below this (ms) is too short for real collectives: NCCL connects lazily at the first
collective of each peer pair and algorithm (seconds), a checkpoint or an evaluation on one rank takes minutes;
PyTorch's default is 10 minutes for NCCL (``init_process_group``'s ``timeout``,
https://docs.pytorch.org/docs/stable/distributed.html#torch.distributed.init_process_group)."""

CERTAIN_TIMEOUT_MS = 1_000
"""Below this (ms) the timeout alone explains the abort: no collective fits in it with the first connection setup of
its peers (NCCL connects lazily at the first collective: seconds).  From it up to :data:`SHORT_TIMEOUT_MS` the timeout
is a suspect: short enough to abort an ordinary wait, but a collective one rank never calls ends the same way."""

_WORK_TIMEOUT = re.compile(r"Timeout\(ms\)=(\d+)\).*?ran for (\d+) milliseconds")


def _check_short_timeout(log: NcclLog) -> list[Check]:
    """A watchdog timeout whose configured ``Timeout(ms)`` is below :data:`SHORT_TIMEOUT_MS`: the timeout is the cause.

    ``WorkNCCL::checkTimeout`` (torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp) prints the work's own timeout
    (``Timeout(ms)=N``) and how long it ran; with a timeout of seconds or less, a collective that merely waits for a
    peer's ordinary work (or NCCL's lazy connection setup) is aborted, and the hang the watchdog suggests is not there.
    """
    hit = log.catalog.get("torch-watchdog-timeout")
    if hit is None:
        return []
    found = [(int(m.group(1)), int(m.group(2)), line) for line in hit.evidence
             for m in [_WORK_TIMEOUT.search(line)] if m and int(m.group(1)) < SHORT_TIMEOUT_MS]
    if not found:
        return []
    timeout_ms, ran_ms, _ = min(found)
    fix = ("confirm with grep -rn 'timeout' where the process group is created (init_process_group(timeout=...), "
           "Accelerate's InitProcessGroupKwargs(timeout=...), deepspeed.init_distributed(timeout=...), a launcher or config "
           "setting in seconds read as milliseconds); raise it to minutes (timedelta(minutes=10) is the NCCL default)")
    src = "https://github.com/pytorch/pytorch/blob/v2.13.0/torch/csrc/distributed/c10d/ProcessGroupNCCL.cpp"
    evidence, values = [line for *_, line in found][:2], {"timeout_ms": timeout_ms, "ran_ms": ran_ms}
    if timeout_ms >= CERTAIN_TIMEOUT_MS:
        # seconds: short enough to abort an ordinary wait, long enough that a real hang (a rank that never calls the
        # collective) ends the same way: the line cannot tell which
        title = (f"suspect: the process group's collective timeout is {timeout_ms} ms, far below PyTorch's default of "
                 f"10 minutes: the watchdog aborts waits that would have ended (NCCL's first connection setup, a "
                 f"slower rank) as well as a real hang; raise it to tell them apart")
        return [verdict("short-collective-timeout", "WARN", title, [], [], evidence,
                        fix + "; if the collective still times out, read which rank never joined it (the desync "
                        "report, the Flight Recorder dumps)", src, values, kind="suspect")]
    title = (f"the process group's collective timeout is {timeout_ms} ms (Timeout(ms)={timeout_ms}), far below "
             f"PyTorch's default of 10 minutes: a collective that ran {ran_ms} ms was aborted by the watchdog; a "
             f"timeout this short fails on ordinary waits (NCCL's first connection setup, a slower rank)")
    return [verdict("short-collective-timeout", "FAIL", title, [], [], evidence, fix, src, values)]


def _check_known_bugs(log: NcclLog, verdicts: Sequence[Check] = ()) -> list[Check]:
    """The known NCCL bugs (``helpers/data/nccl_versions.yaml``) of the log's NCCL versions whose pattern the log shows.

    A log without a version line still gets the bugs whose message only the affected releases print
    (``version_from_pattern``).  A bug that ``explains`` an acting verdict of ``verdicts`` is WARN (the caller turns
    that verdict into context); the others are INFO.
    """
    versions = sorted({_base_version(i.nccl_version) for i in log.all_infos() if i.nccl_version}) or [""]
    text = "\n".join([line for hit in log.catalog.values() if hit.entry["status"] in NOT_OK for line in hit.evidence] +
                      [line for hit in log.sites.values() for line in hit.evidence] +
                      [line for i in log.all_infos() for line in i.warns])
    acting = {v.id for v in verdicts if v.status in NOT_OK}
    out = []
    for version in versions:
        for bug in bugs_for(version, text):
            explains = sorted(acting & set(bug.get("explains") or []))
            lo, hi = bug["affected"]
            head = (f"NCCL {version} is in the affected range of a known bug ({lo}..{hi}, fixed in {bug['fixed']})"
                    if version else
                    f"the log shows a message only NCCL {lo}..{hi} prints, and a known NCCL bug of those releases "
                    f"(fixed in {bug['fixed']})")
            values = {"nccl_version": version or f"{lo}..{hi} (from the message)", "fixed": bug["fixed"]}
            if explains:
                values["explains"] = explains
            out.append(verdict(
                f"known-bug.{bug['id']}", "WARN" if explains else "INFO", f"{head}: {bug['summary']}", [], [], [],
                bug["workaround"], bug["source"], values, kind="suspect"))
    return out


_HANG_IDS = frozenset({"torch-watchdog-timeout", "torch-heartbeat-timeout"})
_CRASH_IDS = frozenset({"process-crash-signal", "nccl-ras-crash"})


def failure_profile(log: NcclLog) -> tuple[set[str], frozenset[str]]:
    """What kind of failure the log shows and which specific NCCL features its failure lines name.

    Returns:
        ``(symptoms, features)``: symptoms among ``hang`` (PyTorch's watchdog or heartbeat timed out), ``crash`` (a
        fatal signal, a crash in NCCL's RAS code), ``error`` (NCCL printed a WARN line the generated site list
        knows); features: :func:`helpers.nccl_log.catalog.features_of` the WARN lines and the failure lines the
        hand-written catalog matched.
    """
    symptoms: set[str] = set()
    if _HANG_IDS & set(log.catalog):
        symptoms.add("hang")
    if _CRASH_IDS & set(log.catalog):
        symptoms.add("crash")
    lines = []
    for hit in log.sites.values():
        if hit.entry.get("level") == "WARN":
            symptoms.add("error")
            lines += hit.evidence
    lines += [line for hit in log.catalog.values() if hit.entry["status"] in NOT_OK for line in hit.evidence]
    return symptoms, features_of("\n".join(lines))


def _check_release_fixes(log: NcclLog) -> list[Check]:
    """The fixes of later NCCL releases (their release notes) for the same kind of failure of the same NCCL feature
    (``NVLS``, ``UDS``, ``shared memory``...: :data:`helpers.nccl_log.catalog.FIX_FEATURES`).

    Needs the log's NCCL version; lists at most 4 fixes per version, newest fixing release last.  Always INFO and a
    suspect: a release note's wording says what was repaired, not which log it repairs, so an upgrade is a test, never
    the named cause.  Source: the release notes, https://github.com/NVIDIA/nccl/releases.
    """
    versions = sorted({_base_version(i.nccl_version) for i in log.all_infos() if i.nccl_version})
    if not versions:
        return []
    symptoms, features = failure_profile(log)
    out = []
    for version in versions:
        fixes = fixes_after(version, symptoms, features)
        if not fixes:
            continue
        kinds = sorted({f["symptom"] for f in fixes})
        parts = sorted({p for f in fixes for p in f["features"] if p in features})
        newest = fixes[-1]["release"]
        article = {"error": "an error", "hang": "a hang", "crash": "a crash", "corruption": "a data corruption"}
        title = (f"suspect: NCCL {version} predates {len(fixes)} later fix{'es' if len(fixes) > 1 else ''} for "
                 f"{' or '.join(article[k] for k in kinds)} with {', '.join(parts)} (release notes of "
                 f"{', '.join(sorted({f['release'] for f in fixes}, key=version_tuple))}), the NCCL feature this "
                 f"log's failure names: a bug fixed since is a suspect; upgrading NCCL to {newest} or later tests it")
        evidence = [f"NCCL {f['release']} release notes: {f['text']}" for f in fixes[:4]]
        out.append(verdict(
            "release-fixes", "INFO", title, [], [], evidence,
            f"confirm with the NCCL version every rank loads (NCCL_DEBUG=VERSION) and rerun on NCCL {newest} or later "
            "(pip install -U nvidia-nccl-cu12, or LD_PRELOAD a newer libnccl.so.2); if the failure stays, the cause "
            "is elsewhere", f"https://github.com/NVIDIA/nccl/releases/tag/{fixes[0]['tag']}",
            {"nccl_version": version, "fixes": [f"{f['release']}: {f['text']}" for f in fixes],
             "symptoms": kinds, "features": parts}, kind="suspect"))
    return out


def _explained_by_bugs(verdicts: list[Check]) -> list[Check]:
    """Turn the verdicts a known-bug verdict ``explains`` into INFO context (they are that bug's symptom)."""
    explained = {x: v.id for v in verdicts if v.id.startswith("known-bug.") for x in v.values.get("explains", [])}
    out = []
    for v in verdicts:
        if v.id in explained and v.status in NOT_OK:
            v = _as_context(v, explained_by=explained[v.id])
        out.append(v)
    return out


def _check_cross_host(log: NcclLog, owners: Mapping[str, set[str]]) -> list[Check]:
    """Compare hosts: network (IB vs sockets), net plugin, hostname collisions, shared addresses, NCCL_HOSTID.

    Sources: https://github.com/NVIDIA/nccl-tests/issues/188 (IB on one node, sockets on the other),
    https://github.com/NVIDIA/nccl/issues/879 (NCCL_HOSTID shared by two nodes),
    https://github.com/NVIDIA/nccl/issues/324 (containers of one host seen as two nodes).
    """
    out: list[Check] = []
    ranks = list(log.ranks.values())
    nets: dict[str, set[str]] = {}
    for r in ranks:
        if r.host and (r.net or r.network):
            nets.setdefault("IB" if _is_ib(r) else (r.net or r.network or "?"), set()).add(r.host)
    if "IB" in nets and "Socket" in nets and nets["IB"] != nets["Socket"]:
        ib, sock = sorted(nets["IB"] - nets["Socket"]), sorted(nets["Socket"] - nets["IB"])
        if ib and sock:
            both = set(ib) | set(sock)
            out.append(verdict(
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
        out.append(verdict(
            "net-plugin-partial", "WARN",
            f"a net plugin (libnccl-net.so / IBext) is loaded on {_names(loaded)} but not on {_names(missing)}: "
            f"the hosts run different network code", [r.key for r in ranks if r.host in set(loaded) | set(missing)],
            loaded + missing, _evidence(r.last_line for r in ranks if r.host in missing),
            "confirm with 'ldconfig -p | grep nccl-net' and 'echo $LD_LIBRARY_PATH' on each node (or the container image); "
            "install the same plugin everywhere or set NCCL_NET_PLUGIN=none everywhere", "https://github.com/NVIDIA/nccl/issues/1412"))
    for host, ips in sorted(log.machines().items()):
        if len(ips) > 1:
            out.append(verdict(
                "hostname-collision", "INFO",
                f"hostname {host} is used by {len(ips)} machines ({', '.join(sorted(ips))}): they are told apart by "
                f"bootstrap address, and the job counts as multi-node", [r.key for r in ranks if r.host == host], [host],
                _evidence(line for r in ranks if r.host == host for line in r.evidence_lines if "Bootstrap" in line),
                "give each machine its own hostname (hostnamectl set-hostname) so logs and NCCL's host hash tell them apart",
                "issue 15"))
    bad_ips = {i.ip for r in ranks for i in r.bootstrap if bad_interface_reason(i)}
    for ip, hosts in sorted(owners.items()):
        if len(hosts) > 1 and ip not in bad_ips:
            out.append(verdict(
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
            out.append(verdict(
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
            out.append(verdict(
                "dialled-unknown-address", "WARN",
                f"ranks dialled {', '.join(dialled[:3])}, an address no host announced in its Bootstrap/NET line: a second "
                f"NIC on the same subnet answers for the peer, or the peer's log is missing", [], log.hosts,
                _evidence(line for r in log.all_infos() for line in r.connect_errors if any(d in line for d in dialled)),
                f"confirm with 'ip -br addr' on every node (who owns {dialled[0]}) and 'ip route get {dialled[0]}' on the "
                f"dialling node; pin NCCL_SOCKET_IFNAME to one NIC per subnet", "issue 15"))
    return out


_GENERIC = {"init-incomplete", "torch-nccl-system-error", "torch-nccl-cuda-error", "torch-nccl-invalid-usage", "torch-nccl-remote-error",
            "torch-watchdog-timeout", "torch-heartbeat-timeout"}
"""Verdicts that say *that* NCCL failed or timed out, not why: INFO context once a specific verdict names a failure."""


def _as_context(v: Check, title: str | None = None, **values: Any) -> Check:
    """``v`` as INFO context: a consequence of a failure another verdict names (no faulty node, ``kind`` context, the
    extra ``values`` added; ``title`` replaces the title when given)."""
    return dataclasses.replace(v, status="INFO", faulty=[], title=v.title if title is None else title,
                               values={**v.values, "kind": "context", **values})


def _demote_generic(verdicts: list[Check]) -> list[Check]:
    """Turn the :data:`_GENERIC` verdicts into INFO context when another FAIL/WARN verdict names the failure."""
    specific = any(v.status in NOT_OK and v.id not in _GENERIC | _NOT_EXPLAINING and not v.id.startswith("known-bug.")
                   for v in verdicts)
    if not specific:
        return verdicts
    named = [v.id for v in verdicts if v.status in NOT_OK and v.id not in _GENERIC | _NOT_EXPLAINING]
    out = []
    for v in verdicts:
        if v.id in _GENERIC and v.status in NOT_OK:
            title = v.title
            if v.id in _GENERIC_SHORT:
                title = f"{_GENERIC_SHORT[v.id]}: the failure {', '.join(named[:3])} names above"
            v = _as_context(v, title=title, explained_by_other_verdicts=True)
        out.append(v)
    return out


def _demote_exception(verdicts: list[Check]) -> list[Check]:
    """A rank's own Python exception (``rank-python-exception``) becomes INFO context when another FAIL verdict names
    a specific failure (an NCCL, CUDA or network cause): the exception is then more likely its consequence."""
    if not any(v.status == "FAIL" and v.id != "rank-python-exception" and v.id not in _GENERIC | _NOT_EXPLAINING
               for v in verdicts):
        return verdicts
    return [_as_context(v) if v.id == "rank-python-exception" and v.status in NOT_OK else v for v in verdicts]


_GENERIC_SHORT = {"torch-nccl-system-error": "NCCL returned ncclSystemError",
                  "torch-nccl-cuda-error": "NCCL returned ncclUnhandledCudaError",
                  "torch-nccl-invalid-usage": "NCCL returned ncclInvalidUsage",
                  "torch-nccl-remote-error": "NCCL returned ncclRemoteError",
                  "torch-watchdog-timeout": "a collective timed out",
                  "torch-heartbeat-timeout": "the watchdog stopped making progress"}
"""What a :data:`_GENERIC` verdict reports, in a few words: its title once another verdict names the failure (the
long reading of the code is for a log that holds nothing else)."""


def interpret(log: NcclLog) -> list[Check]:
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
    verdicts = (_check_catalog(log) + _check_cross_host(log, owners) + _check_same_gpu_one_node(log) +
                _check_roce_gid(log) + _check_nccl_lists(log) + _check_gdr_unused(log, topology) +
                _check_interfaces(log, topology, owners) + _check_no_interface(log) + _check_connect(log, owners) +
                _check_single_node_net(log, topology) + _check_ib_fallback(log, topology) + _check_versions(log) +
                _check_short_timeout(log) + _check_gloo_loopback(log) + _check_requested_plugin(log) +
                _check_lightning_members(log))
    explained = {h for v in verdicts if v.status == "FAIL" for h in v.values["hosts"]}
    verdicts += _check_init(log, explained) + _check_ib_loaded(log, topology)
    verdicts += _check_sites(log, verdicts)
    verdicts = _check_comm_never_initialized(log, verdicts)
    verdicts += _check_p2p_hang(log, topology, verdicts)
    if not any(v.status == "FAIL" for v in verdicts):
        verdicts += _check_nvls_stall(log)
    verdicts += _check_ib_remote_error(log) + _check_nccl_tests_separate(log)
    if not any(v.status in NOT_OK for v in verdicts):
        verdicts += _check_ipoib_bootstrap_stall(log)
    verdicts += _check_known_bugs(log, verdicts) + _check_release_fixes(log)
    verdicts = _demote_generic(_demote_exception(_explained_by_bugs(verdicts)))
    return sorted(verdicts, key=lambda v: SEVERITIES.index(v.status))



# ------------------------------------------------------------------------------ settings and choices NCCL prints

IB_GID_DOCS = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-ib-gid-index"


def gid_text(spn: str, iid: str) -> str:
    """The GID NCCL printed as ``(%lX/%lX)`` (the two 8-byte halves of ``union ibv_gid`` read as little-endian
    uint64s, ``net_ib.cc``) in IPv6 notation: ``("80FE", "1A8A41FEFF21A75E")`` -> ``fe80::5ea7:21ff:fe41:8a1a``.

    Raises:
        ValueError: a half is not hex or longer than 16 digits.
    """
    raw = b"".join(int(h, 16).to_bytes(8, "little") for h in (spn, iid))
    import ipaddress  # stdlib; only when a RoCE GID is shown

    address = ipaddress.IPv6Address(raw)
    return f"::ffff:{address.ipv4_mapped}" if address.ipv4_mapped else str(address)


def _gid_problem(spn: str, iid: str) -> str | None:
    """Why NCCL's own GID selection would never pick this GID, or None.

    ``src/transport/net_ib.cc`` (v2.21.5-1, lines 215-233): ``validGid`` = ``configuredGid`` (not all zero, not a bare
    ``fe80::``) and not ``linkLocalGid`` (first 8 bytes ``fe80:0000:0000:0000``); ``ncclIbGetGidIndex`` skips invalid
    GIDs when NCCL_IB_GID_INDEX is unset (2.21 and later; before 2.21 the index defaulted to 0).
    """
    try:
        prefix, ident = int(spn, 16), int(iid, 16)
    except ValueError:
        return None
    if prefix == 0 and ident == 0:
        return "an empty GID (::, no address behind it)"
    if prefix == 0x80FE:
        return "the IPv6 link-local GID (fe80::/64: valid on one Ethernet segment only, never routed)"
    return None


def _check_roce_gid(log: NcclLog) -> list[Check]:
    """RoCE queue pairs on a GID NCCL's own selection rejects (link-local ``fe80::`` or empty): NCCL_IB_GID_INDEX.

    NCCL prints the GID of every RoCE queue pair (``NET/IB: ... GID %ld (%lX/%lX)``, ``net_ib.cc``; NCCL_DEBUG_SUBSYS
    NET).  A link-local GID is what GID index 0 usually holds (RoCE v1, derived from the MAC); NCCL before 2.21 used
    index 0 unless NCCL_IB_GID_INDEX said otherwise, and from 2.21 picks a routable RoCE v2 GID of NCCL_IB_ADDR_FAMILY
    itself (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-ib-gid-index).  A suspect: two
    nodes on one Ethernet segment can still talk over it.
    """
    found: list[tuple[RankInfo, int, str, str]] = []
    for info in log.all_infos():
        for index, spn, iid in info.gids:
            problem = _gid_problem(spn, iid)
            if problem:
                found.append((info, index, gid_text(spn, iid), problem))
    if not found:
        return []
    infos = list({id(f[0]): f[0] for f in found}.values())
    indexes = sorted({f[1] for f in found})
    envs = sorted({i.env["NCCL_IB_GID_INDEX"] for i in log.all_infos() if "NCCL_IB_GID_INDEX" in i.env})
    versions = sorted({_base_version(i.nccl_version) for i in log.all_infos() if i.nccl_version})
    if envs:
        why = f"chosen by NCCL_IB_GID_INDEX={','.join(envs)} set in the environment"
    elif versions and all(version_tuple(v) < (2, 21) for v in versions):
        why = f"the default index of NCCL {', '.join(versions)} (before 2.21 NCCL used GID index 0 unless told otherwise)"
    else:
        why = "set by NCCL_IB_GID_INDEX or an old NCCL's default of 0"
    failed = any(i.warns for i in log.all_infos()) or any(h.entry["status"] == "FAIL" for h in log.catalog.values())
    title = (f"RoCE queue pairs of {_who(infos)} use GID index {', '.join(map(str, indexes))} ({found[0][2]}), "
             f"{found[0][3]}, {why}: NCCL's own GID selection never picks such a GID, and peers on another segment "
             f"cannot reach it")
    fix = ("confirm with show_gids (or ibv_devinfo -v | grep GID and cat /sys/class/infiniband/<hca>/ports/1/gid_attrs/"
           "types/<index>) on each node: set NCCL_IB_GID_INDEX to the RoCE v2 GID of the node's routable address "
           "(::ffff:a.b.c.d for IPv4), the same index on every node, or unset it on NCCL >= 2.21, which selects that "
           "GID itself (NCCL_IB_ADDR_FAMILY / NCCL_IB_ROCE_VERSION_NUM)")
    evidence = _evidence([line for i in infos for line in i.evidence_lines if "NCCL_IB_GID_INDEX" in line] +
                         [line for i in infos for line in i.gid_lines])
    return [verdict("roce-gid-link-local", "FAIL" if failed else "WARN", title, [i.key for i in infos if i.key != "?"],
                    _hosts(infos), evidence, fix, IB_GID_DOCS, {"gid_index": indexes, "gid": found[0][2]},
                    kind="suspect")]


GDR_SOURCE = "https://github.com/NVIDIA/nccl/blob/v2.30.7-1/src/graph/paths.cc#L467"


def _check_gdr_unused(log: NcclLog, topology: str) -> list[Check]:
    """InfiniBand/RoCE channels and not one of them uses GPU Direct RDMA (no ``/GDRDMA`` suffix), receive side included.

    NCCL appends ``/GDRDMA`` to a NET channel when ``ncclTopoCheckGdr`` (``src/graph/paths.cc``) enables it: the HCA
    must be able to access GPU memory (the plugin's ``ptrSupport`` flag for CUDA pointers, a C constant, not a
    variable NCCL reads: the nvidia-peermem module, or DMA-BUF with a
    recent driver and kernel; ``src/graph/topo.cc`` prints ``GPU Direct RDMA Enabled/Disabled for HCA``), and the GPU
    must sit within NCCL_NET_GDR_LEVEL of the NIC (PXB by default).  Sends of pre-Ampere GPUs without NVLink skip it
    on purpose (``NCCL_NET_GDR_READ``), receives never do: so only a log whose receive channels lack it too counts.
    Without GDRDMA every inter-node byte is copied through host memory (several times less bandwidth).  A suspect
    (WARN): the log cannot tell a missing module from a GPU-NIC distance; the command can.
    """
    if topology == "single-node":
        return []
    ib_via: dict[str, bool] = {}       # a job's channels share a few transports: each one tested once
    ib = []
    for i in log.all_infos():
        for ch in i.channels:
            via = ch.via
            is_ib = ib_via.get(via)
            if is_ib is None:
                is_ib = ib_via[via] = (via[:3] == "NET" and ch.kind == "NET" and len(via.split("/")) > 1
                                       and via.split("/")[1].startswith("IB"))
            if is_ib:
                ib.append((i, ch))
    if not ib or any("GDRDMA" in ch.via for _, ch in ib) or not any(ch.direction == "receive" for _, ch in ib):
        return []
    if any(site_knowledge(hit.entry)["class"] == "gdr-disabled" for hit in log.sites.values()):
        return []      # NCCL's own "GPU Direct RDMA Disabled for HCA" line is read by the site reading
    off = sorted({f"{k}={v}" for i in log.all_infos() for k, v in i.env.items()
                  if k == "NCCL_NET_GDR_LEVEL" and v.upper() in ("0", "LOC")})
    infos = list({id(i): i for i, _ in ib}.values())
    example = next(ch for _, ch in ib if ch.direction == "receive")
    if off:
        return [verdict("gdr-not-used", "INFO", f"no NET/IB channel uses GPU Direct RDMA: turned off by {', '.join(off)}",
                        [i.key for i in infos if i.key != "?"], _hosts(infos), [example.line],
                        "unset it to let NCCL use GPU Direct RDMA where the HCA supports it",
                        "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-net-gdr-level",
                        kind="context")]
    title = (f"none of the {len(ib)} InfiniBand/RoCE channel(s) uses GPU Direct RDMA (e.g. '{example.via}' without "
             f"/GDRDMA, receive side included): inter-node data is staged through host memory; the HCA cannot reach "
             f"GPU memory (nvidia-peermem not loaded, no DMA-BUF support) or the GPUs sit beyond NCCL_NET_GDR_LEVEL "
             f"from the NICs")
    fix = ("confirm on a node: lsmod | grep -E 'nvidia_peermem|nv_peer_mem' and a rerun with NCCL_DEBUG=INFO "
           "NCCL_DEBUG_SUBSYS=INIT,NET: 'GPU Direct RDMA Disabled for HCA' means no peer-memory module or DMA-BUF "
           "(sudo modprobe nvidia-peermem, or a DMA-BUF capable driver and kernel; NCCL <= 2.22.3 looks only for "
           "nv_peer_mem), 'Enabled' means the GPUs and NICs are too far apart (nvidia-smi topo -m: SYS/PHB between them; "
           "NCCL_NET_GDR_LEVEL); in VMs and on bare metal keep PCIe ACS off for GPU Direct RDMA")
    return [verdict("gdr-not-used", "WARN", title, [i.key for i in infos if i.key != "?"], _hosts(infos),
                    _evidence(ch.line for _, ch in ib), fix, GDR_SOURCE,
                    {"channels": len(ib)}, kind="suspect")]


DEVICE_LIST_VARS = {"NCCL_IB_HCA": ("HCA", "https://github.com/NVIDIA/nccl/blob/v2.30.7-1/src/transport/net_ib/init.cc#L317"),
              "NCCL_SOCKET_IFNAME": ("interface", "https://github.com/NVIDIA/nccl/blob/v2.30.7-1/src/os/linux.cc#L385")}
"""Variables NCCL parses as a device list with a leading ``^`` (exclude) and ``=`` (exact names), and where."""


def nccl_list(value: str) -> tuple[bool, bool, list[str]]:
    """``(exclude, exact, entries)`` as NCCL reads a device list such as NCCL_IB_HCA or NCCL_SOCKET_IFNAME.

    NCCL strips one leading ``^`` (the list excludes), then one leading ``=`` (names match exactly, not as prefixes),
    then splits the rest at commas, each entry ``name[:port]``; empty names are skipped (``parseStringList`` in
    https://github.com/NVIDIA/nccl/blob/v2.30.7-1/src/misc/utils.cc#L189 and the callers in ``DEVICE_LIST_VARS``).
    ``entries`` are the names (ports dropped) exactly as NCCL compares them, spaces and stray ``^``/``=`` included.
    """
    exclude = value.startswith("^")
    rest = value[1:] if exclude else value
    exact = rest.startswith("=")
    rest = rest[1:] if exact else rest
    names = [entry.split(":", 1)[0] for entry in rest.split(",")]
    return exclude, exact, [n for n in names if n]


def _check_nccl_lists(log: NcclLog) -> list[Check]:
    """NCCL_IB_HCA / NCCL_SOCKET_IFNAME values whose entries NCCL reads as names no device has (:func:`nccl_list`).

    A ``^`` or ``=`` inside the list (``^=mlx5_8,^=mlx5_14``) or a space next to a comma is taken literally, so that
    entry matches nothing: an exclusion that excludes nothing, or a device that is never selected.  NCCL's
    documentation: "The ^ symbol at the beginning of the list excludes ... = at the beginning ... exact"
    (https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-ib-hca).
    """
    values: dict[tuple[str, str], list[RankInfo]] = {}
    for info in log.all_infos():
        for name in DEVICE_LIST_VARS:
            if name in info.env:
                values.setdefault((name, info.env[name]), []).append(info)
    out = []
    for (name, value), infos in sorted(values.items(), key=lambda kv: kv[0]):
        exclude, exact, entries = nccl_list(value)
        bad = [e for e in entries if e[:1] in "^=" or e != e.strip()]
        if not bad:
            continue
        what, source = DEVICE_LIST_VARS[name]
        meant = [e.strip().lstrip("^=") for e in bad]
        verb = ("stays", "is") if len(meant) == 1 else ("stay", "are")
        effect = (f"{', '.join(meant)} {verb[0]} in use (not excluded)"
                  if exclude or any(e.strip().startswith("^") for e in bad) else f"{', '.join(meant)} {verb[1]} not used")
        clean = [e.strip().lstrip("^=") for e in entries]
        prefix = ("^" if exclude or any(e.strip().startswith("^") for e in bad) else "") + \
                 ("=" if exact or any("=" in e.strip()[:2] for e in bad) else "")
        title = (f"{name}='{value}' does not do what it says: NCCL reads '^' (exclude) and '=' (exact names) only once, "
                 f"at the start of the whole list, and takes each entry literally, so {', '.join(repr(b) for b in bad)} "
                 f"match{'es' if len(bad) == 1 else ''} no {what}: {effect}")
        fix = (f"write the prefix once for the whole list: {name}={prefix}{','.join(clean)} (no spaces), then check the "
               f"'NET/IB : Using' / 'NET/Socket : Using' line of each rank lists the {what}s you meant")
        out.append(verdict(f"{name.lower().replace('_', '-')}-syntax", "WARN", title,
                           [i.key for i in infos if i.key != "?"], _hosts(infos),
                           _evidence(line for i in infos for line in i.evidence_lines if name in line), fix, source,
                           {"variable": name, "value": value, "entries_matching_nothing": bad}))
    return out


def _check_same_gpu_one_node(log: NcclLog) -> list[Check]:
    """Two ranks on the same GPU joined by a P2P channel, on a host whose ranks use several GPUs: two machines that
    NCCL took for one node (a host-hash collision), or one GPU given to two ranks.

    P2P lines print each end's physical GPU (the NVML index in NCCL 2.4 and 2.18+, the PCI busId in 2.5-2.17:
    ``src/transport/p2p.cc`` at those tags), and NCCL picks P2P only between ranks whose host hash is equal
    (``p2pCanConnect``: "Rule out different nodes").  The host hash was the hostname cut at the first '.' up to
    NCCL 2.4.2 (``getHostName`` in ``src/misc/utils.cu`` at v2.4.2-1; release notes 2.4.6: "Fix hostname hashing issue.
    GithubIssue#187"), the full hostname plus ``/proc/sys/kernel/random/boot_id`` later, replaced by NCCL_HOSTID when
    set (``getHostHash`` in ``src/misc/utils.cc``).  From 2.5.6 on NCCL refuses two ranks with one busId and one host
    hash before any channel line ("Duplicate GPU detected", ``src/init.cc`` at v2.5.6-1), so only the ``Ring`` lines of
    older releases can show it.  A suspect: the command tells the two readings apart.
    """
    by_host: dict[str | None, list[RankInfo]] = {}
    devs_of: dict[str | None, dict[int, set[str]]] = {}
    lines: dict[tuple[str | None, int], str] = {}
    for info in log.ranks.values():
        if not info.channels or "Ring " not in info.channels[0].line:
            continue            # NCCL >= 2.5 stops at "Duplicate GPU detected" before any channel line
        for ch in info.channels:
            via = ch.via
            if not (via[:3] == "P2P" and via[3:4] in ("/", " ", "")) or not ch.src_dev or not ch.dst_dev:
                continue        # Channel.kind == "P2P", spelled out: this loop sees every channel of every rank
            devs = devs_of.get(info.host)
            if devs is None:
                devs = devs_of[info.host] = {}
                by_host[info.host] = []
            if not by_host[info.host] or by_host[info.host][-1] is not info:
                by_host[info.host].append(info)
            for rank, dev in ((ch.src, ch.src_dev), (ch.dst, ch.dst_dev)):
                devs.setdefault(rank, set()).add(dev.lower().lstrip("0") or "0")
                lines.setdefault((info.host, rank), ch.line)
    out = []
    for host, devs in devs_of.items():
        one = {rank: next(iter(d)) for rank, d in devs.items() if len(d) == 1}
        if len(set(one.values())) < 2 or len(set(one.values())) == len(one):
            continue      # one device for all (per-rank CUDA_VISIBLE_DEVICES: nothing to compare), or no clash
        ranks_of: dict[str, list[int]] = {}
        for rank, dev in sorted(one.items()):
            ranks_of.setdefault(dev, []).append(rank)
        clash = {dev: ranks for dev, ranks in ranks_of.items() if len(ranks) > 1}
        infos = by_host[host]
        dev, ranks = sorted(clash.items())[0]
        vias = sorted({ch.short for i in infos for ch in i.channels if ch.kind == "P2P"})
        failed = any(not i.completed for i in infos) or bool(log.catalog.get("torch-nccl-cuda-error"))
        where = f"on {host}" if host else "in this log"
        title = (f"two machines taken for one node {where}: ranks {' and '.join(map(str, ranks))} both use GPU {dev} (as "
                 f"the P2P lines print it) yet NCCL joins them with {', '.join(vias)}, a transport it picks only for "
                 f"ranks of one host hash: the hosts share a host hash (NCCL <= 2.4.2 hashed the hostname cut at the "
                 f"first '.', later releases hostname + boot_id, or NCCL_HOSTID when set), or two ranks got one GPU")
        fix = ("confirm on each node: hostname (the full name: do they share the part before the first '.'?), cat "
               "/proc/sys/kernel/random/boot_id and env | grep NCCL_HOSTID, and nvidia-smi -L against the ranks' GPUs; "
               "then upgrade NCCL (2.4.6 and later hash the full hostname), give the nodes distinct hostnames, or unset "
               "a shared NCCL_HOSTID")
        evidence = _evidence([lines[(host, r)] for r in ranks if (host, r) in lines])
        out.append(verdict("host-hash-collision", "FAIL" if failed else "WARN", title,
                           [i.key for i in infos], [host] if host else [], evidence, fix,
                           "https://github.com/NVIDIA/nccl/releases/tag/v2.4.6-1", {"gpu": dev, "ranks": ranks},
                           kind="suspect"))
    return sorted(out, key=lambda v: v.node)
