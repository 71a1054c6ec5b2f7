"""The network pre-flight check: before a multi-node launch, test what the job's network needs, on every node.

Per node (through a :class:`helpers.slurm.SlurmClient`'s ``on_node``, so the same code checks the network lab, real nodes
under ``srun -w HOST --overlap`` or this machine alone):

* ``net.node.<node>``: the interfaces, with MTU, state and addresses (``ip -j addr``);
* ``net.<VAR>.<node>`` for ``NCCL_SOCKET_IFNAME`` / ``GLOO_SOCKET_IFNAME`` (when set): the value
  selects, on that node, an existing interface that is up with an address, with each library's
  own rules (NCCL: comma-separated name prefixes, ``^`` excludes, ``=`` exact, only running
  interfaces, the first match carries the bootstrap; gloo: exact names only, no ``^``), and the
  addresses it selects on the nodes are distinct and reach the master's (MN2);
* ``net.hostname.<node>``: the node's own hostname resolves, on that node, to a non-loopback
  address of its own (gloo without ``GLOO_SOCKET_IFNAME`` and c10d's rendezvous use it);
* ``net.master.<node>``: ``MASTER_ADDR`` resolves on that node, to the same address as on the
  master, not to loopback, to an address the master really has, and answers a ping;
* ``net.port.<master>``: ``MASTER_PORT`` has no listener on the master (D4);
* ``net.mtu.<node>``: the path from the node to the master carries the MTU both interfaces
  claim: ``ping -M do -s MTU-28`` and ``-s 1472`` (MN4; black hole = the large one lost, the
  small one through).

Each check is a :class:`helpers.checks.Check` with ``node`` set (``Check`` is its old name):
``id``, ``title``, ``status`` OK/WARN/FAIL, ``values`` (what was measured), ``remediation`` (names
the faulty node and the fix), ``source``, ``faulty`` (:func:`faulty_nodes` collects them).  The
interface-selection rules are :func:`helpers.ifnames.select`.  The measuring is two shell scripts per node (one
inventory, one batch of pings run in parallel), so a check costs ~0.1 s per node plus 1 s per
lost ping (``-W 1``), nodes in parallel.

Sources: MN2, MN4, MN-checklist,
PF-netns-nodes; NCCL's interface selection ``ncclFindInterfaces`` /
``ncclOsFindInterfaces`` (https://github.com/NVIDIA/nccl, ``src/misc/socket.cc``) and
https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-socket-ifname.
"""

from __future__ import annotations

import ipaddress
import json
import shlex
import subprocess
from collections.abc import Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from helpers import ifnames, sources
from helpers.checks import Check, worst
from helpers.hostinfo import parse_ip_addr
from helpers.ifnames import IFNAME_VARS
from helpers.launchers import DEFAULT_MASTER_PORT
from helpers.slurm import SlurmClient, slurm_errors
from helpers.validate import tcp_port

ICMP_PROBE = Path(__file__).resolve().parent / "scenarios" / "icmp_probe.py"
"""The raw-socket ping each node runs without iputils-ping (the project folder is on the shared filesystem)."""
SMALL_PING = 1472  # 1500 - 20 (IPv4) - 8 (ICMP): the payload that fits a standard frame
SRC_MN2 = sources.cite("MN2")
SRC_MN4 = sources.cite("MN4", "PF-mtu-blackhole")
SRC_MASTER = sources.cite("D1", "D4", "PF-hostname-loopback")

# Phase 1, one per node: what the node has.  $1 = MASTER_ADDR, $2 = MASTER_PORT.
_INVENTORY = r"""
echo "@@hostname"; uname -n
echo "@@addr"; ip -j -d addr show
echo "@@master"; getent ahostsv4 "$1" | awk 'NR==1{print $1}'
echo "@@self"; getent ahostsv4 "$(uname -n)" | awk 'NR==1{print $1}'
M=$(getent ahostsv4 "$1" | awk 'NR==1{print $1}')
echo "@@route"; if [ -n "$M" ]; then ip -j route get "$M"; fi
echo "@@listen"; if command -v ss >/dev/null 2>&1; then ss -Hltnp "sport = :$2"; echo "@@ss ok"; fi
echo "@@ping"; command -v ping || true
echo "@@python"; command -v python3 || true
echo "@@end"
"""
# Phase 2: the pings of one node, in parallel; each prints one line "@@ping ID RC OUTPUT".
_PING_FN = ('p() { id=$1; shift; o=$("$@" 2>&1); rc=$?; '
            'o=$(printf %s "$o" | tr "\\n" " " | cut -c1-240); echo "@@ping $id $rc $o"; }')
def _call(runner: SlurmClient, node: str, argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
    try:
        return runner.on_node(node, argv, timeout_s)
    except Exception as exc:  # a runner must never take the whole check down
        return subprocess.CompletedProcess(list(argv), 255, "", f"runner error: {type(exc).__name__}: {exc}")


# --------------------------------------------------------------------------- parsing

def parse_inventory(text: str) -> dict[str, Any]:
    """Split the phase-1 script's output into its sections (see ``_INVENTORY``).

    Returns:
        ``{"hostname", "ifaces" (parse_ip_addr), "master_addr", "self_addr", "route" ({"dev",
        "prefsrc"} or None), "listeners" (lines, or None when ``ss`` is missing), "ping" (path
        or ""), "python" (path or "")}``.

    Raises:
        ValueError: the output is incomplete (no ``@@end``) or ``ip -j`` printed no JSON.
    """
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        if line.startswith("@@"):
            current = line[2:].strip()
            sections.setdefault(current, [])
        elif current is not None:
            sections[current].append(line)
    if "end" not in sections:
        raise ValueError("inventory output is incomplete (no @@end marker)")

    def first(key: str) -> str:
        lines = [ln.strip() for ln in sections.get(key, []) if ln.strip()]
        return lines[0] if lines else ""

    route = None
    raw_route = "\n".join(sections.get("route", [])).strip()
    if raw_route:
        try:
            entry = json.loads(raw_route)[0]
            route = {"dev": entry.get("dev"), "prefsrc": entry.get("prefsrc"), "dst": entry.get("dst")}
        except (json.JSONDecodeError, IndexError, KeyError, TypeError):
            route = None
    return {"hostname": first("hostname"), "ifaces": parse_ip_addr("\n".join(sections.get("addr", []))),
            "master_addr": first("master") or None, "self_addr": first("self") or None, "route": route,
            "listeners": [ln for ln in sections.get("listen", []) if ln.strip()] if "ss ok" in sections else None,
            "ping": first("ping"), "python": first("python")}


def _local_ips(ifaces: Sequence[Mapping[str, Any]]) -> set[str]:
    return {a.split("/")[0] for i in ifaces for a in i["ipv4"] + i["ipv6"]}


def _iface_of(ifaces: Sequence[Mapping[str, Any]], ip: str | None) -> dict[str, Any] | None:
    for iface in ifaces:
        if ip and ip in {a.split("/")[0] for a in iface["ipv4"] + iface["ipv6"]}:
            return dict(iface)
    return None


def _by_name(ifaces: Sequence[Mapping[str, Any]], name: str | None) -> dict[str, Any] | None:
    return next((dict(i) for i in ifaces if i["name"] == name), None)


def _is_loopback(ip: str | None) -> bool:
    try:
        return bool(ip) and ipaddress.ip_address(ip).is_loopback  # type: ignore[arg-type]
    except ValueError:
        return False


def _describe(iface: Mapping[str, Any]) -> str:
    addrs = ",".join(iface["ipv4"] + iface["ipv6"]) or "no address"
    carrier = " NO-CARRIER" if "NO-CARRIER" in iface["flags"] else ""
    return f"{iface['name']} {addrs} mtu {iface['mtu']} {iface['state']}{carrier}"


# --------------------------------------------------------------------------- interface selection



# --------------------------------------------------------------------------- the check

def _env_value(env: Mapping[str, str], key: str) -> str | None:
    value = env.get(key)
    return None if value is None else str(value)


def run_preflight(nodes: Sequence[str], runner: SlurmClient, env: Mapping[str, str] | None = None, *,
                  master: str | None = None, timeout_s: float = 15.0) -> list[Check]:
    """Check the network of an allocation of ``nodes`` before launching on it.

    Args:
        nodes: node names as ``runner`` knows them (lab hostnames, SLURM node names...).
        runner: the :class:`helpers.slurm.SlurmClient` whose ``on_node(node, argv, timeout_s)`` runs ``argv`` on
            ``node``: a :class:`helpers.netlab.Lab` (directly in the node), :class:`helpers.slurm.LocalSlurm`
            (``srun -w NODE -N1 -n1 --overlap``), :class:`helpers.slurm.ThisHost` (here, one node).
            The nodes need ``sh``, ``ip``, ``getent``, ``awk`` and ``ping`` (or ``python3``:
            a raw-socket ICMP probe replaces ping), and ``ss`` for the port check.
        env: the job's variables: ``MASTER_ADDR`` (default: ``master``), ``MASTER_PORT``
            (default 29500), ``NCCL_SOCKET_IFNAME``, ``GLOO_SOCKET_IFNAME`` (checked when set).
        master: the node that hosts rank 0 / the rendezvous (default ``nodes[0]``).
        timeout_s: limit per runner call, seconds.

    Returns:
        The :class:`Check` records (see the module docstring), node by node.

    Raises:
        ValueError: no nodes, duplicate nodes, ``master`` not among them, or a bad MASTER_PORT.
    """
    nodes = [str(n) for n in nodes]
    if not nodes or len(set(nodes)) != len(nodes):
        raise ValueError(f"nodes={nodes!r}: give at least one node, each once")
    master = nodes[0] if master is None else str(master)
    if master not in nodes:
        raise ValueError(f"master={master!r}: must be one of the nodes {nodes}")
    env = dict(env or {})
    master_addr = _env_value(env, "MASTER_ADDR") or master
    raw_port = _env_value(env, "MASTER_PORT") or str(DEFAULT_MASTER_PORT)
    try:
        port = tcp_port(int(raw_port), "MASTER_PORT")
    except ValueError:
        raise ValueError(f"MASTER_PORT={raw_port!r}: must be an integer in 1..65535") from None

    # Phase 1: inventory, all nodes in parallel.
    with ThreadPoolExecutor(max_workers=len(nodes)) as pool:
        answers = dict(zip(nodes, pool.map(
            lambda n: _call(runner, n, ["sh", "-c", _INVENTORY, "sh", master_addr, str(port)], timeout_s), nodes)))
    facts: dict[str, dict[str, Any]] = {}
    checks: list[Check] = []
    for node in nodes:
        ans = answers[node]
        try:
            facts[node] = parse_inventory(ans.stdout)
        except ValueError as exc:
            slurm = slurm_errors((ans.stderr or "") + (ans.stdout or ""))
            err = [slurm[0]["line"]] if slurm else (ans.stderr or "").strip().splitlines()[-1:] or [str(exc)]
            blamed = [e["node"] for e in slurm if e["node"]] or [node]
            fix = (f"SLURM itself cannot reach {', '.join(blamed)} (its slurmd): a network or daemon fault on that node; "
                   f"leave it out (--exclude={','.join(blamed)}) and report it (scontrol show node {blamed[0]})"
                   if slurm else
                   f"{node}: the runner could not run `sh`/`ip -j addr` there (exit {ans.returncode}"
                   f"{', timed out: busy or unreachable node' if ans.returncode == 124 else ''}): "
                   "check that the node is up and reachable by the runner (srun/ssh), and that iproute2 is installed")
            checks.append(Check("net.node." + node, f"{node}: cannot inspect the node: {err[0]}", "FAIL",
                                    {"returncode": ans.returncode, "stderr": (ans.stderr or "")[-500:],
                                     "slurm_errors": slurm}, fix, sources.cite("MN1"), node=node, faulty=blamed))
    alive = [n for n in nodes if n in facts]
    multi = len(nodes) > 1
    for node in alive:
        checks.append(_inventory_check(node, facts[node]))
    if master not in facts:
        return checks  # nothing below can be judged without the master

    # What each IFNAME variable selects on every node.
    selections = {var: {n: ifnames.select(var, env[var], facts[n]["ifaces"]) for n in alive}
                  for var in IFNAME_VARS if var in env}

    # Phase 2: pings from every other node to the master, in parallel.
    plans = {n: _ping_plan(n, facts, master, selections) for n in alive if n != master}
    with ThreadPoolExecutor(max_workers=max(1, len(plans))) as pool:
        futures = {n: pool.submit(_run_pings, runner, n, plan, facts[n], timeout_s) for n, plan in plans.items()}
        pings = {n: f.result() for n, f in futures.items()}

    for var, sel in selections.items():
        checks += _ifname_checks(var, sel, facts, pings, master, multi)
    if multi:
        checks += [_hostname_check(n, facts[n], "GLOO_SOCKET_IFNAME" in env) for n in alive]
    checks += [_master_check(n, facts, pings.get(n, {}), master, master_addr, multi) for n in alive]
    checks.append(_port_check(master, facts[master], port))
    checks += [_mtu_check(n, facts, pings.get(n, {}), master, plans[n]) for n in alive if n != master]
    order = {n: i for i, n in enumerate(nodes)}
    checks.sort(key=lambda c: order.get(c.node, 0))
    return checks


def _inventory_check(node: str, f: Mapping[str, Any]) -> Check:
    ifaces = f["ifaces"]
    listing = "; ".join(_describe(i) for i in ifaces)
    values = {"hostname": f["hostname"], "interfaces": ifaces, "route_to_master": f["route"],
              "ping_tool": f["ping"] or ("python3 icmp probe" if f["python"] else None)}
    if not f["ping"] and not f["python"]:
        return Check("net.node." + node, f"{node} ({f['hostname']}): {listing}; no ping and no python3", "WARN",
                         values, f"{node}: install iputils-ping (apt-get install iputils-ping) so reachability and "
                         "MTU can be measured", SRC_MN4, node=node)
    return Check("net.node." + node, f"{node} ({f['hostname']}): {listing}", "OK", values, "", SRC_MN4, node=node)


def _ping_argv(f: Mapping[str, Any], dst: str, size: int | None, src: str | None) -> list[str]:
    if f["ping"]:
        argv = ["ping", "-n", "-q", "-c", "1", "-W", "1"]
        argv += ["-M", "do", "-s", str(size)] if size is not None else []
        argv += ["-I", src] if src else []
        return argv + [dst]
    # the same probe in Python, for nodes without iputils-ping (raw ICMP socket; needs root/CAP_NET_RAW)
    return ["python3", str(ICMP_PROBE), dst, str(size if size is not None else 56), "1" if size else "0", src or "-"]


def df_ping(runner: SlurmClient, node: str, dst: str, size: int, timeout_s: float = 10.0) -> tuple[int, str, str]:
    """One "don't fragment" ping of ``size`` payload bytes from ``node`` to ``dst`` (MN4's path test).

    Uses ``ping -n -c 1 -W 1 -M do -s SIZE DST`` where iputils-ping is installed on the node, else
    the same probe from Python (a raw ICMP socket with ``IP_PMTUDISC_DO``; needs root or
    CAP_NET_RAW), so the check works on minimal images.  A payload of MTU - 28 bytes (20 of IPv4
    header, 8 of ICMP) fills one frame exactly: 8972 for MTU 9000, 1472 for 1500.

    Args:
        runner: how to run a command on ``node`` (a :class:`helpers.slurm.SlurmClient`, see :func:`run_preflight`).
        node: the node to ping from.
        dst: the IPv4 address to ping.
        size: ICMP payload in bytes (>= 0).
        timeout_s: bound on the whole command, seconds.

    Returns:
        ``(returncode, command, said)``: 0 when the echo came back (1 lost, 2 a local error such
        as ``message too long``, 127 no tool), the command as a shell line (the Python probe is
        shown as ``python3 <icmp probe> ...``) and the tool's summary lines.

    Raises:
        ValueError: ``size`` is negative.
    """
    if size < 0:
        raise ValueError(f"size: must be >= 0 bytes, got {size}")
    have = _call(runner, node, ["sh", "-c", "command -v ping || true"], timeout_s).stdout.strip()
    facts = {"ping": have or None, "python": "python3"}
    argv = _ping_argv(facts, dst, size, None)
    shown = shlex.join(argv) if have else f"python3 <icmp probe> {dst} {size} df=1"
    ans = _call(runner, node, argv, timeout_s)
    said = " | ".join(line.strip() for line in (ans.stdout + ans.stderr).splitlines()
                      if "packet" in line or line.startswith(("ping:", "local error")))
    return ans.returncode, shown, said


def _ping_plan(node: str, facts: Mapping[str, Mapping[str, Any]], master: str,
               selections: Mapping[str, Mapping[str, Mapping[str, Any]]]) -> dict[str, dict[str, Any]]:
    """The pings ``node`` runs towards the master: ``{id: {"dst", "size", "src"}}``."""
    f = facts[node]
    plan: dict[str, dict[str, Any]] = {}
    dst = f["master_addr"]
    if dst and dst not in _local_ips(f["ifaces"]):
        plan["reach"] = {"dst": dst, "size": None, "src": None}
        mine = _by_name(f["ifaces"], (f["route"] or {}).get("dev"))
        theirs = _iface_of(facts[master]["ifaces"], dst)
        if mine:
            lowest = min(mine["mtu"], theirs["mtu"]) if theirs else mine["mtu"]
            sizes = {mine["mtu"] - 28, lowest - 28}
            if lowest >= 1500:
                sizes.add(SMALL_PING)
            for size in sorted(sizes, reverse=True):
                plan[f"mtu{size}"] = {"dst": dst, "size": size, "src": None}
    for var, sel in selections.items():
        mine_sel, master_sel = sel.get(node, {}), sel.get(master, {})
        src, peer = mine_sel.get("address"), master_sel.get("address")
        if (src and peer and peer not in _local_ips(f["ifaces"]) and not mine_sel.get("problem")
                and not master_sel.get("problem")):
            plan[f"if-{var}"] = {"dst": peer, "size": None, "src": src}
    return plan


def _run_pings(runner: SlurmClient, node: str, plan: Mapping[str, Mapping[str, Any]], f: Mapping[str, Any],
               timeout_s: float) -> dict[str, dict[str, Any]]:
    if not plan or (not f["ping"] and not f["python"]):
        return {}
    lines = [_PING_FN]
    for pid, p in plan.items():
        lines.append(f"p {pid} {shlex.join(_ping_argv(f, p['dst'], p['size'], p['src']))} &")
    lines.append("wait")
    ans = _call(runner, node, ["sh", "-c", "\n".join(lines)], timeout_s)
    out: dict[str, dict[str, Any]] = {}
    for line in ans.stdout.splitlines():
        parts = line.split(" ", 3)
        if len(parts) >= 3 and parts[0] == "@@ping":
            out[parts[1]] = {"ok": parts[2] == "0", "rc": int(parts[2]) if parts[2].lstrip("-").isdigit() else None,
                             "output": parts[3] if len(parts) > 3 else "", **plan.get(parts[1], {})}
    for pid, p in plan.items():
        out.setdefault(pid, {"ok": False, "rc": None, "output": f"no answer from the runner: {ans.stderr.strip()[-200:]}",
                             **p})
    return out


def _blame(failing: Sequence[str], others: Sequence[str], master: str) -> list[str]:
    """Who to name when pings towards the master fail: the failing nodes, or the master when all of several fail."""
    if len(others) >= 2 and set(failing) == set(others):
        return [master]
    return list(failing)


def _unreachable_cause(node: str, facts: Mapping[str, Mapping[str, Any]], master: str) -> tuple[str, list[str]]:
    """Why ``node`` gets no answer from the master's address, and which node(s) to fix."""
    f, fm = facts[node], facts[master]
    addr = f["master_addr"]
    dev = _by_name(f["ifaces"], (f["route"] or {}).get("dev"))
    mdev = _iface_of(fm["ifaces"], addr)
    if dev and not dev["running"]:
        return f"{node}'s {dev['name']} has no carrier ({dev['state']}): cable or switch port", [node]
    if fm["master_addr"] and addr != fm["master_addr"]:
        return f"MASTER_ADDR resolves to {addr} on {node} but to {fm['master_addr']} on {master}", [node]
    if mdev is None:
        return f"{addr} is not an address of {master}", [master]
    if not mdev["running"]:
        return f"{master}'s {mdev['name']} has no carrier ({mdev['state']}): cable or switch port", [master]
    return "no answer (firewall, routing, or a switch port down on the path)", [node, master]


def _ifname_checks(var: str, sel: Mapping[str, Mapping[str, Any]], facts: Mapping[str, Mapping[str, Any]],
                   pings: Mapping[str, Mapping[str, Mapping[str, Any]]], master: str, multi: bool) -> list[Check]:
    checks = []
    value = next(iter(sel.values()))["value"] if sel else ""
    flavor = "NCCL" if var.startswith("NCCL") else "gloo"
    by_addr: dict[str, list[str]] = {}
    for n, s in sel.items():
        if s["address"] and not s["problem"]:
            by_addr.setdefault(s["address"], []).append(n)
    non_master = [n for n in sel if n != master]
    unreachable = [n for n in non_master if not pings.get(n, {}).get(f"if-{var}", {"ok": True})["ok"]]
    for n, s in sel.items():
        values = {"value": value, "selected": s["selected"], "first": s["first"], "address": s["address"],
                  "spec": s["spec"], "library_error": s["error"] or None}
        cid = f"net.{var}.{n}"
        if not s["problem"] and not s["selected"]:
            checks.append(Check(cid, f"{n}: {var}={value!r} is ignored (one character or less): "
                                    f"{flavor} auto-detects", "OK", values, "", SRC_MN2, node=n))
            continue
        fix_any = (f"set {var} to the data-plane interface that exists, is up and carries the node's routable "
                   f"address on EVERY node (names differ? use a common prefix for NCCL, e.g. 'ib' or 'eth'; "
                   f"gloo needs the exact name on each node, so export it per node), or unset it to auto-detect")
        if s["problem"]:
            err = f" ({flavor} fails with '{s['error']}')" if s["error"] else ""
            fix = {"loopback": f"on {n}: exclude lo too (e.g. NCCL_SOCKET_IFNAME=^docker0,lo) or name the data-plane "
                               "interface (prefix) instead",
                   "no-carrier": f"on {n}: the interface is selected but has no link: check its cable / switch port "
                                 f"(`ip -br link` on {n}), or {fix_any}"}.get(s["kind"], f"on {n}: {fix_any}")
            checks.append(Check(cid, f"{n}: {var}={value!r}: {s['problem']}{err}", "FAIL",
                                    {**values, "problem": s["kind"]}, fix, SRC_MN2, node=n))
            continue
        dupes = [m for m in by_addr.get(s["address"], []) if m != n] if multi and s["address"] else []
        if dupes:
            checks.append(Check(
                cid, f"{n}: {var}={value!r} selects {s['first']} {s['address']}, the same address as on "
                f"{', '.join(dupes)}: a host-local bridge (docker0-like), not the data network", "FAIL",
                {**values, "same_address_on": dupes},
                f"on {n} and {', '.join(dupes)}: {s['first']} carries {s['address']} on every node, so a peer that "
                f"connects to it reaches itself (gloo: 'Connection refused', NCCL: hang); {fix_any}", SRC_MN2, node=n,
                faulty=sorted([n, *dupes])))
            continue
        ping = pings.get(n, {}).get(f"if-{var}")
        if ping is not None and not ping["ok"]:
            who = _blame(unreachable, non_master, master)
            checks.append(Check(
                cid, f"{n}: {s['first']} {s['address']} cannot reach {master}'s {sel[master]['first']} "
                f"{sel[master]['address']} ({var}={value!r})", "FAIL", {**values, "ping": ping},
                f"faulty: {', '.join(who)}; the interfaces {var} selects are not on one network: check cabling/switch "
                f"port and addresses of {', '.join(who)} (`ip -br addr`), or {fix_any}", SRC_MN2, node=n, faulty=who))
            continue
        checks.append(Check(cid, f"{n}: {var}={value!r} -> {s['first']} {s['address']}"
                                + (f", reaches {master}" if ping else ""), "OK", {**values, "ping": ping}, "",
                                SRC_MN2, node=n))
    return checks


def _hostname_check(node: str, f: Mapping[str, Any], gloo_pinned: bool) -> Check:
    host, addr = f["hostname"], f["self_addr"]
    values = {"hostname": host, "resolves_to": addr, "local": addr in _local_ips(f["ifaces"]) if addr else None}
    cid = "net.hostname." + node
    fix = (f"on {node}: map {host!r} to the node's data-plane address in /etc/hosts (not 127.0.x.1), "
           f"or pin the address: torchrun --local-addr=<data-plane address> and GLOO_SOCKET_IFNAME=<interface>")
    if not addr:
        return Check(cid, f"{node}: its hostname {host!r} does not resolve there", "FAIL", values,
                         fix, SRC_MASTER, node=node)
    if _is_loopback(addr):
        effect = ("c10d advertises it" if gloo_pinned
                  else "gloo (no GLOO_SOCKET_IFNAME) binds to it and c10d advertises it")
        return Check(cid, f"{node}: its hostname {host!r} resolves to loopback {addr}: {effect}, so peers "
                         "connect to themselves ('Connection refused' to 127.0.0.1, RendezvousConnectionError)",
                         "FAIL", values, fix, SRC_MASTER, node=node)
    if not values["local"]:
        return Check(cid, f"{node}: its hostname {host!r} resolves to {addr}, which is not one of its addresses",
                         "FAIL", values, fix, SRC_MASTER, node=node)
    return Check(cid, f"{node}: hostname {host!r} -> {addr}", "OK", values, "", SRC_MASTER, node=node)


def _master_check(node: str, facts: Mapping[str, Mapping[str, Any]], pings: Mapping[str, Mapping[str, Any]],
                  master: str, master_addr: str, multi: bool) -> Check:
    f, fm = facts[node], facts[master]
    addr, on_master = f["master_addr"], fm["master_addr"]
    cid = "net.master." + node
    values: dict[str, Any] = {"MASTER_ADDR": master_addr, "resolves_to": addr, "on_master": on_master,
                              "route": f["route"], "ping": pings.get("reach")}
    fix_env = (f"export the same MASTER_ADDR on every node: a name every node resolves (the same /etc/hosts or DNS) "
               f"to {master}'s data-plane address, or that address itself")
    if not addr:
        return Check(cid, f"{node}: MASTER_ADDR={master_addr!r} does not resolve there", "FAIL", values,
                         f"on {node}: add {master_addr!r} to /etc/hosts or DNS; {fix_env}", SRC_MASTER, node=node)
    if multi and _is_loopback(addr):
        return Check(cid, f"{node}: MASTER_ADDR={master_addr!r} resolves to loopback {addr}: every node would "
                         "talk to itself", "FAIL", values, f"on {node}: {fix_env}", SRC_MASTER, node=node)
    if node == master:
        if addr not in _local_ips(f["ifaces"]):
            return Check(cid, f"{node} (master): MASTER_ADDR={master_addr!r} -> {addr} is not an address of "
                             f"{master}: the store would not be where the ranks look", "FAIL", values,
                             f"on {master}: MASTER_ADDR must name the node that runs rank 0; its addresses are "
                             f"{', '.join(sorted(_local_ips(f['ifaces'])))}; {fix_env}", SRC_MASTER, node=node)
        return Check(cid, f"{node} (master): MASTER_ADDR={master_addr!r} -> {addr} (its own)", "OK", values, "",
                         SRC_MASTER, node=node)
    if on_master and addr != on_master:
        return Check(cid, f"{node}: MASTER_ADDR={master_addr!r} resolves to {addr} there but to {on_master} on "
                         f"{master}", "FAIL", values,
                         f"on {node}: its resolver (/etc/hosts, DNS) gives a stale or wrong address for "
                         f"{master_addr!r}: fix that entry on {node}; {fix_env}", SRC_MASTER, node=node)
    ping = pings.get("reach")
    if ping is not None and not ping["ok"]:
        cause, who = _unreachable_cause(node, facts, master)
        if who == [master] and cause.startswith(addr):
            fix = (f"faulty: {master}: MASTER_ADDR={master_addr!r} ({addr}) is not {master}'s address; {fix_env}")
        else:
            fix = (f"faulty: {' and '.join(who)}; check `ip -br link` and the cabling on {' and '.join(who)}, then "
                   f"`ping {addr}` from {node}")
        return Check(cid, f"{node}: cannot reach MASTER_ADDR={master_addr!r} ({addr}): {cause}", "FAIL",
                         values, fix, SRC_MASTER, node=node, faulty=who)
    return Check(cid, f"{node}: MASTER_ADDR={master_addr!r} -> {addr}, reachable", "OK", values, "",
                     SRC_MASTER, node=node)


def _port_check(master: str, f: Mapping[str, Any], port: int) -> Check:
    cid = "net.port." + master
    values = {"port": port, "listeners": f["listeners"]}
    if f["listeners"] is None:
        return Check(cid, f"{master}: cannot tell whether port {port} is free (no `ss`)", "WARN", values,
                         f"on {master}: install iproute2's ss, or check with `ss -ltnp 'sport = :{port}'`",
                         sources.cite("D4"), node=master)
    if f["listeners"]:
        return Check(cid, f"{master}: port {port} is already in use: {f['listeners'][0].strip()}", "FAIL", values,
                         f"on {master}: another process listens on {port} (the rendezvous would fail with "
                         f"EADDRINUSE, or join that job's store): pick another MASTER_PORT / --rdzv-endpoint port, "
                         "or stop that process", sources.cite("D4", "PF-port-collision"), node=master)
    return Check(cid, f"{master}: port {port} free", "OK", values, "", sources.cite("D4"),
                     node=master)


def _mtu_check(node: str, facts: Mapping[str, Mapping[str, Any]], pings: Mapping[str, Mapping[str, Any]],
               master: str, plan: Mapping[str, Mapping[str, Any]]) -> Check:
    f, fm = facts[node], facts[master]
    cid = "net.mtu." + node
    dst = f["master_addr"]
    mine = _by_name(f["ifaces"], (f["route"] or {}).get("dev"))
    theirs = _iface_of(fm["ifaces"], dst)
    sizes = sorted((p["size"] for p in plan.values() if p["size"] is not None), reverse=True)
    results = {s: pings.get(f"mtu{s}", {}) for s in sizes}
    values = {"to": master, "dst": dst, "node_iface": mine and {k: mine[k] for k in ("name", "mtu")},
              "master_iface": theirs and {k: theirs[k] for k in ("name", "mtu")},
              "pings": {s: {"ok": r.get("ok"), "output": r.get("output")} for s, r in results.items()}}
    if not mine or not sizes:
        why = ("no ping tool" if not f["ping"] and not f["python"] and dst
               else f"MASTER_ADDR does not lead from {node} to {master}")
        return Check(cid, f"{node} -> {master}: MTU not measured ({why})", "WARN", values,
                         f"fix net.master.{node} first, then re-run", SRC_MN4, node=node)
    reach = pings.get("reach", {})
    if not any(r.get("ok") for r in results.values()):
        if not reach.get("ok"):
            _, who = _unreachable_cause(node, facts, master)
            return Check(cid, f"{node} -> {master}: MTU not measured: MASTER_ADDR ({dst}) does not answer", "WARN",
                             values, f"fix reachability first (net.master.{node}); faulty: {' and '.join(who)}",
                             SRC_MN4, node=node, faulty=who)
        return Check(cid, f"{node} -> {master}: small pings pass but no DF ping of {', '.join(map(str, sizes))} "
                         "bytes does", "FAIL", values,
                         f"a hop between {node} and {master} drops even standard frames: lower the MTU on both ends "
                         f"until `ping -M do -s <MTU-28>` passes, then fix the hop", SRC_MN4, node=node,
                         faulty=[node, master])
    claimed = mine["mtu"]
    master_mtu = theirs["mtu"] if theirs else None
    big = claimed - 28
    passed = max(s for s, r in results.items() if r.get("ok"))
    lost = [s for s, r in results.items() if not r.get("ok")]
    if master_mtu is not None and master_mtu != claimed:
        status = "WARN" if results.get(min(claimed, master_mtu) - 28, {}).get("ok") else "FAIL"
        return Check(
            cid, f"{node} -> {master}: MTU differs: {node} {mine['name']} {claimed}, {master} {theirs['name']} "
            f"{master_mtu}; largest DF ping through: {passed} bytes", status, values,
            f"set one MTU on both ends: `ip link set {mine['name']} mtu {master_mtu}` on {node} or "
            f"`ip link set {theirs['name']} mtu {claimed}` on {master} (TCP's MSS negotiation hides a mismatch of "
            f"the endpoints, but anything that does not negotiate breaks; MN4)", SRC_MN4, node=node,
            faulty=[node] if claimed > master_mtu else [master])
    if lost:
        where = f"between {node} and {master}"
        return Check(
            cid, f"{node} -> {master}: MTU black hole: {big}-byte DF ping lost, {passed}-byte one passes, although "
            f"both ends claim {claimed}", "FAIL", values,
            f"a hop {where} (switch port, bridge, host veth) drops frames above {passed + 28} bytes: raise that hop to "
            f"{claimed}, or set `ip link set {mine['name']} mtu {passed + 28}` on {node} AND `ip link set "
            f"{theirs['name'] if theirs else '<iface>'} mtu {passed + 28}` on {master} (uniform smaller MTU works, "
            "a mismatch does not; MN4)", SRC_MN4, node=node, faulty=[node, master])
    return Check(cid, f"{node} -> {master}: MTU {claimed} carried end to end ({big}-byte DF ping through)", "OK",
                     values, "", SRC_MN4, node=node)


# --------------------------------------------------------------------------- output and CLI

def format_checks(checks: Sequence[Check]) -> str:
    """One ``[STATUS] id: title`` line per check (remediation under non-OK ones), then the verdict."""
    lines = [c.line() for c in checks]
    counts = {s: sum(c.status == s for c in checks) for s in ("OK", "WARN", "FAIL")}
    lines.append(f"{worst(checks)}: {counts['OK']} OK, {counts['WARN']} WARN, {counts['FAIL']} FAIL")
    return "\n".join(lines)
