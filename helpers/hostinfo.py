"""Host checks of the allocation check (check 5): rendezvous port, ``/dev/shm``, NICs, ``*_SOCKET_IFNAME``.

The measuring functions (:func:`interfaces`, :func:`shm_info`, :func:`port_free`, :func:`free_port`,
:func:`port_holders`) look at the real host and return plain data; :func:`host_checks` grades
them into check records (``id``, ``title``, ``status``, ``values``, ``remediation``, ``source``:
the fields of :class:`helpers.report.Check`).  Nothing runs at import.

Facts measured on this project's machines (torch 2.13 CPU, Linux 6.x; the tests in
tests/test_hostinfo.py re-check them) are marked "measured"; the rest cite their source.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import socket
import subprocess
from collections.abc import Mapping
from typing import Any

import psutil

from helpers.launchers import tcp_port

MIB = 1024**2
GIB = 1024**3
SHM_FAIL_BYTES = 64 * MIB  # Docker's default --shm-size: https://docs.docker.com/reference/cli/docker/container/run/
SHM_WARN_BYTES = 1 * GIB  # NCCL's advice --shm-size=1g (URL below)
NCCL_SHM_URL = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting/runtime_and_mpi_issues.html#shared-memory"
NCCL_IFNAME_URL = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-socket-ifname"
FLAVORS = ("nccl", "gloo")
IFNAME_VARS = {"NCCL_SOCKET_IFNAME": "nccl", "GLOO_SOCKET_IFNAME": "gloo"}
_IFNAME_ERRORS = {"nccl": "Bootstrap : no socket interface found", "gloo": "Unable to find address for: {name}"}


def interfaces() -> list[dict[str, Any]]:
    """Every network interface of the current network namespace, from ``ip -j addr show``.

    Why iproute2's JSON and not ``psutil.net_if_stats``/``net_if_addrs``: psutil reports only
    ``isup`` (the IFF_UP admin flag), not the kernel's operstate (``UP``/``DOWN``/``UNKNOWN``/
    ``LOWERLAYERDOWN``), nor the LOOPBACK flag or the link type (``ether``/``infiniband``), and gives
    netmasks instead of prefix lengths.  ``ip`` is also what the runbook tells users to run (MN4:
    ``ip link show``), so the numbers printed here are the ones they will see; and it works
    unchanged under ``ip netns exec``.

    Returns:
        One dict per interface, in kernel order: ``name`` (str), ``state`` (operstate as the kernel
        reports it: ``UP``, ``DOWN``, ``UNKNOWN`` (e.g. ``lo``), ``LOWERLAYERDOWN``...), ``mtu``
        (int, bytes), ``flags`` (list[str]), ``link_type`` (str), ``loopback`` (bool), ``up``
        (bool: admin-up and operstate ``UP``/``UNKNOWN``), ``ipv4`` and ``ipv6`` (lists of
        ``"addr/prefix"``).

    Raises:
        RuntimeError: ``ip`` is not installed, fails, hangs (10 s), or prints something that is not JSON.
    """
    ip = shutil.which("ip")
    if ip is None:
        raise RuntimeError("`ip` (iproute2) not found on PATH: install it (apt-get install iproute2 / dnf install iproute)")
    try:
        proc = subprocess.run([ip, "-j", "addr", "show"], capture_output=True, text=True, timeout=10, check=False)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError("`ip -j addr show` did not answer within 10 s") from exc
    if proc.returncode != 0:
        raise RuntimeError(f"`ip -j addr show` failed (rc={proc.returncode}): {proc.stderr.strip()}")
    try:
        links = json.loads(proc.stdout or "[]")
    except json.JSONDecodeError as exc:
        raise RuntimeError(f"`ip -j addr show` printed no JSON (iproute2 too old for -j?): {exc}") from exc
    out: list[dict[str, Any]] = []
    for link in links:
        if "ifname" not in link:
            continue
        flags = list(link.get("flags", []))
        state = str(link.get("operstate", "UNKNOWN"))
        addrs = link.get("addr_info", [])
        out.append({
            "name": link["ifname"],
            "state": state,
            "mtu": int(link.get("mtu", 0)),
            "flags": flags,
            "link_type": str(link.get("link_type", "")),
            "loopback": "LOOPBACK" in flags,
            "up": "UP" in flags and state in ("UP", "UNKNOWN"),
            "ipv4": [f"{a['local']}/{a['prefixlen']}" for a in addrs if a.get("family") == "inet"],
            "ipv6": [f"{a['local']}/{a['prefixlen']}" for a in addrs if a.get("family") == "inet6"],
        })
    return out


def shm_info(path: str = "/dev/shm") -> dict[str, Any]:
    """Size of the shared-memory filesystem at ``path`` (``os.statvfs``).

    Returns:
        ``{"path": str, "total_bytes": int, "free_bytes": int}``; free is what an unprivileged
        process can still allocate (``f_bavail``).

    Raises:
        OSError: ``path`` does not exist or cannot be stat'ed (e.g. ``FileNotFoundError``).
    """
    st = os.statvfs(path)
    return {"path": path, "total_bytes": st.f_blocks * st.f_frsize, "free_bytes": st.f_bavail * st.f_frsize}


def port_free(port: int, host: str = "0.0.0.0") -> bool:
    """Whether the c10d TCPStore could bind TCP ``port`` on ``host`` now.

    Binds a TCP socket with ``SO_REUSEADDR`` **on**, exactly as the TCPStore server does (libuv
    backend: ``uv__tcp_bind`` sets it; legacy backend: ``enableAddressReuse``).  Measured with
    torch 2.13: a port left in TIME_WAIT by a previous TCPStore is bound again by a new TCPStore,
    so it is reported free here (with SO_REUSEADDR off it would read busy: a false alarm).  A port
    with a listener, or a bound socket, or a TIME_WAIT from a socket without SO_REUSEADDR, is busy
    for both.  ``host`` ``"0.0.0.0"`` (default) matches the TCPStore server's wildcard bind.

    Args:
        port: TCP port, 1..65535.
        host: local address to bind (``"::"``-style hosts use IPv6).

    Returns:
        True when the bind succeeds; False on EADDRINUSE, or EACCES (a port below 1024 without
        privileges is unusable too).

    Raises:
        ValueError: ``port`` is not an integer in 1..65535 (message names ``port``).
        OSError: any other bind error (e.g. EADDRNOTAVAIL: ``host`` is not a local address).
    """
    tcp_port(port, "port")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError as exc:
            if exc.errno in (errno.EADDRINUSE, errno.EACCES):
                return False
            raise
    return True


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port the kernel hands out as free on ``host`` (bind to port 0, read it, close).

    Another process may take it before you use it: pass it on at once, or better let the
    launcher pick (``--rdzv-endpoint=localhost:0``, D4).

    Raises:
        OSError: no ephemeral port can be bound (range exhausted, ``host`` not local).
    """
    return free_ports(1, host)[0]


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """``count`` distinct TCP ports the kernel hands out as free on ``host``.

    All ``count`` sockets are bound before any is closed, so the ports differ from each other
    (two calls of :func:`free_port` may, rarely, return the same one).  The caveat of
    :func:`free_port` holds: pass them on at once.

    Raises:
        ValueError: ``count`` is not an integer >= 1.
        OSError: not enough ephemeral ports can be bound, or ``host`` is not local.
    """
    if isinstance(count, bool) or not isinstance(count, int) or count < 1:
        raise ValueError(f"count={count!r}: must be an integer >= 1")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(family, socket.SOCK_STREAM)) for _ in range(count)]
        for sock in socks:
            sock.bind((host, 0))
        return [int(sock.getsockname()[1]) for sock in socks]


def port_holders(port: int) -> list[dict[str, Any]]:
    """Local TCP sockets on ``port`` (``psutil.net_connections``): who holds it.

    Returns:
        ``[{"pid": int | None, "name": str | None, "status": str, "laddr": "ip:port"}]``;
        ``pid``/``name`` are None for TIME_WAIT entries and for other users' sockets when not
        root.  An empty list when psutil is denied access.

    Raises:
        ValueError: ``port`` is not an integer in 1..65535.
    """
    tcp_port(port, "port")
    try:
        conns = psutil.net_connections(kind="tcp")
    except (psutil.AccessDenied, PermissionError):
        return []
    holders = []
    for conn in conns:
        if not conn.laddr or conn.laddr.port != port:
            continue
        name = None
        if conn.pid is not None:
            try:
                name = psutil.Process(conn.pid).name()
            except (psutil.NoSuchProcess, psutil.AccessDenied):
                pass
        holders.append({"pid": conn.pid, "name": name, "status": conn.status, "laddr": f"{conn.laddr.ip}:{port}"})
    return holders


def parse_socket_ifname(value: str, flavor: str) -> dict[str, Any]:
    """Parse ``NCCL_SOCKET_IFNAME`` (``flavor="nccl"``) or ``GLOO_SOCKET_IFNAME`` (``"gloo"``).

    NCCL (``NCCL_IFNAME_URL``; ``src/misc/socket.cc`` ``findInterfaces``): a comma-separated list
    of name *prefixes*; a leading ``^`` excludes them, a leading ``=`` makes them exact names,
    ``^=`` both; ``:port`` suffixes are dropped; a value of one character or less is ignored
    (``strlen(env) > 1``) and NCCL auto-detects.  Gloo as torch passes it (measured, torch 2.13):
    comma-separated *exact* names, each of which must exist; no ``^``/``=`` (``^docker0`` fails
    with ``Unable to find address for: ^docker0``); a one-character value is ignored; a trailing
    comma is ignored, an empty entry elsewhere fails.  Neither strips spaces.

    Returns:
        ``{"exclude": bool, "exact": bool, "names": list[str], "supported": bool, "note": str}``;
        ``names == []`` means the library auto-detects.  For unsupported gloo syntax ``names``
        holds what gloo will literally look up (e.g. ``["^docker0"]``).

    Raises:
        ValueError: ``flavor`` is not one of ``nccl``, ``gloo`` (message names ``flavor``).
    """
    if flavor not in FLAVORS:
        raise ValueError(f"flavor={flavor!r}: accepted values are {', '.join(FLAVORS)}")
    if len(value) <= 1:
        return {"exclude": False, "exact": flavor == "gloo", "names": [], "supported": True,
                "note": f"{value!r} is ignored (one character or less): {flavor} auto-detects"}
    notes: list[str] = []
    if flavor == "nccl":
        rest = value
        exclude = rest.startswith("^")
        rest = rest[1:] if exclude else rest
        exact = rest.startswith("=")
        rest = rest[1:] if exact else rest
        names = [n for n in (entry.split(":")[0] for entry in rest.split(",")) if n]
        supported = True
        notes.append(f"{'all interfaces except those' if exclude else 'interfaces'} {'named' if exact else 'starting with'} "
                     + " or ".join(names))
    else:
        exclude, exact = False, True
        names = value.split(",")
        if names[-1] == "":
            names.pop()
        supported = not value.startswith(("^", "=")) and "" not in names
        if value.startswith(("^", "=")):
            notes.append(f"{value[0]!r} is NCCL syntax; gloo takes exact names only and fails with "
                         f"'Unable to find address for: {names[0]}'")
        if "" in names:
            notes.append("empty entry: gloo fails with \"interface or hostname can't be empty\"")
        if supported:
            notes.append("gloo opens a device on every listed interface: each one must exist")
    if any(n != n.strip() for n in names):
        notes.append("names contain spaces, which are not stripped")
    return {"exclude": exclude, "exact": exact, "names": names, "supported": supported, "note": "; ".join(notes)}


def _has_address(iface: Mapping[str, Any]) -> bool:
    # NCCL skips interfaces without an IPv4/IPv6 address and IPv6 loopback; gloo fails on them too
    # (measured: a bridge with no address gives "Unable to find address for: <name>").
    return bool(iface["ipv4"]) or any(not a.startswith("::1/") for a in iface["ipv6"])


def match_ifname(spec: Mapping[str, Any], ifaces: list[dict[str, Any]], require_address: bool = True) -> list[str]:
    """Names of the interfaces in ``ifaces`` (from :func:`interfaces`) that ``spec`` selects.

    Prefix match unless ``spec["exact"]``; ``spec["exclude"]`` inverts; an empty ``names`` list
    selects everything (NCCL's ``matchIfList``) for a non-exact spec and nothing for gloo.  With
    ``require_address`` (default) only interfaces carrying an address count, as in NCCL's and
    gloo's own lookup (``getifaddrs``).

    Raises:
        KeyError: ``spec`` lacks ``names``/``exact``/``exclude`` or an interface lacks ``name``.
    """
    names = spec["names"]
    selected = []
    for iface in ifaces:
        if require_address and not _has_address(iface):
            continue
        if not names:
            hit = not spec["exact"]
        elif spec["exact"]:
            hit = iface["name"] in names
        else:
            hit = any(iface["name"].startswith(n) for n in names)
        if hit != bool(spec["exclude"]):
            selected.append(iface["name"])
    return selected


def _record(cid: str, title: str, status: str, values: dict[str, Any], remediation: str, source: str) -> dict[str, Any]:
    return {"id": cid, "title": title, "status": status, "values": values,
            "remediation": "" if status == "OK" else remediation, "source": source}


def _worst(statuses: list[str]) -> str:
    order = ("OK", "WARN", "FAIL")
    return max(statuses, key=order.index, default="OK")


def _check_port(env: Mapping[str, str], master_port: int) -> dict[str, Any]:
    src = "D4 (seeds/distributed-launch.md); https://github.com/pytorch/pytorch/issues/85604"
    raw = env.get("MASTER_PORT", "").strip()
    values: dict[str, Any] = {"port_from": "MASTER_PORT" if raw else "argument"}
    try:
        port = tcp_port(int(raw), "MASTER_PORT") if raw else master_port
    except ValueError:
        return _record("host.port", f"MASTER_PORT={raw!r} is not a port", "FAIL", {**values, "raw": raw},
                       "set MASTER_PORT to an integer in 1..65535 (torchrun --master-port)", src)
    values["port"] = port
    values["free"] = port_free(port)
    values["holders"] = [] if values["free"] else port_holders(port)
    try:
        values["ephemeral_port"] = free_port()
    except OSError as exc:
        values["ephemeral_port"] = None
        return _record("host.port", f"cannot bind an ephemeral port: {exc}", "FAIL", values,
                       "the ephemeral range is exhausted or loopback is down: check `ss -s` and `ip addr show lo`", src)
    if values["free"]:
        return _record("host.port", f"port {port} free; ephemeral bind OK", "OK", values, "", src)
    who = ", ".join(f"{h['name'] or '?'} (pid {h['pid']}, {h['status']})" for h in values["holders"]) or "unknown process"
    return _record("host.port", f"port {port} is busy: held by {who}", "WARN", values,
                   f"a torchrun on port {port} would die with 'Address already in use' (errno 98): give each job on "
                   "this node its own --master-port (e.g. 29600), or let torchrun pick one with "
                   "--rdzv-endpoint=localhost:0 (single node); or stop the holder", src)


def _check_shm() -> dict[str, Any]:
    src = f"{NCCL_SHM_URL}; Docker default 64 MiB: https://docs.docker.com/reference/cli/docker/container/run/"
    try:
        info = shm_info()
    except OSError as exc:
        return _record("host.shm", f"/dev/shm unavailable: {exc}", "FAIL", {"path": "/dev/shm"},
                       "NCCL's SHM transport and DataLoader workers need /dev/shm: mount a tmpfs there "
                       "(docker: --shm-size=1g --ulimit memlock=-1, or --ipc=host)", src)
    total, free = info["total_bytes"], info["free_bytes"]
    title = f"/dev/shm {total / GIB:.2f} GiB, {free / GIB:.2f} GiB free"
    fix = ("NCCL creates ~4 MiB segments per peer there and fails with 'failed to extend /dev/shm/nccl-... ' when short; "
           "restart the container with --shm-size=1g --ulimit memlock=-1 (or --ipc=host)")
    if total < SHM_FAIL_BYTES:
        return _record("host.shm", title + " (below Docker's 64 MiB default)", "FAIL", info, fix, src)
    if total < SHM_WARN_BYTES:
        return _record("host.shm", title + " (below the 1 GiB NCCL recommends)", "WARN", info, fix, src)
    if free < SHM_WARN_BYTES:
        return _record("host.shm", title + " (almost full)", "WARN", info,
                       "stale segments fill /dev/shm: list them with `ls -la /dev/shm` and remove those of dead jobs "
                       "(nccl-*, torch_*)", src)
    return _record("host.shm", title, "OK", info, "", src)


def _check_interfaces(ifaces: list[dict[str, Any]]) -> dict[str, Any]:
    src = "MN4 (seeds/multinode.md)"
    carriers = [i for i in ifaces if i["up"] and not i["loopback"] and i["ipv4"]]
    by_type: dict[str, dict[str, int]] = {}
    for iface in carriers:
        by_type.setdefault(iface["link_type"], {})[iface["name"]] = iface["mtu"]
    mixed = {t: m for t, m in by_type.items() if len(set(m.values())) > 1}
    values = {"interfaces": [{k: i[k] for k in ("name", "state", "mtu", "ipv4", "ipv6")} for i in ifaces],
              "mtu_mismatch": mixed,
              "note": "MTU must also match end to end across nodes (MN4): that comparison is the multi-node preflight's job"}
    problems, fixes = [], []
    if not carriers:
        problems.append("no UP non-loopback interface has an IPv4 address: multi-node is impossible")
        fixes.append("bring up the data-plane NIC (`ip link set DEV up`, DHCP) or ask the provider for a routable interface")
    if mixed:
        problems.append("UP interfaces of one link type differ in MTU: " + "; ".join(
            ", ".join(f"{n}={m}" for n, m in mtus.items()) for mtus in mixed.values()))
        fixes.append("make sure the NIC the job uses has the same MTU on every node and switch hop; "
                     "test with `ping -M do -s <MTU-28> <peer>` (MN4)")
    names = ", ".join(f"{i['name']}({i['mtu']})" for i in ifaces)
    if problems:
        return _record("host.interfaces", "; ".join(problems), "WARN", values, "; ".join(fixes), src)
    return _record("host.interfaces", f"interfaces (mtu): {names}", "OK", values, "", src)


def _multi_node(env: Mapping[str, str]) -> str:
    """Evidence that the job spans nodes ("" when none)."""
    def num(key: str) -> int:
        try:
            return int(env.get(key, ""))
        except ValueError:
            return 0
    for key in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        if num(key) > 1:
            return f"{key}={num(key)}"
    if num("WORLD_SIZE") > num("LOCAL_WORLD_SIZE") > 0:
        return f"WORLD_SIZE={num('WORLD_SIZE')} > LOCAL_WORLD_SIZE={num('LOCAL_WORLD_SIZE')}"
    return ""


def _check_socket_ifname(env: Mapping[str, str], ifaces: list[dict[str, Any]]) -> dict[str, Any]:
    src = f"gilbreth-hpc-guide.md 4.2 and 8.12 (failure mode 2); MN2 (seeds/multinode.md); {NCCL_IFNAME_URL}"
    multi = _multi_node(env)
    by_name = {i["name"]: i for i in ifaces}
    usable = [i["name"] for i in ifaces if _has_address(i)]
    auto = "unset it so that NCCL/gloo auto-detect (interface names vary by node: Gilbreth guide 4.2, 8.12)"
    values: dict[str, Any] = {"multi_node": multi or None}
    statuses, problems, fixes = [], [], []
    for var, flavor in IFNAME_VARS.items():
        if var not in env:
            continue
        raw = env[var]
        spec = parse_socket_ifname(raw, flavor)
        matched = match_ifname(spec, ifaces) if len(raw) > 1 else []  # ignored value: auto-detect
        values[var] = {"value": raw, "spec": spec, "matched": matched}
        missing = [n for n in spec["names"] if n not in matched] if flavor == "gloo" else []
        status, problem = "OK", ""
        if len(raw) <= 1:
            pass  # ignored by both libraries: auto-detect
        elif not spec["supported"]:
            status, problem = "FAIL", f"{var}={raw!r} is not valid for gloo ({spec['note']})"
        elif not matched or missing:
            err = _IFNAME_ERRORS[flavor].format(name=(missing or spec["names"])[0])
            status, problem = "FAIL", f"{var}={raw!r} selects no usable interface here (expect '{err}')"
        elif all(not by_name[n]["up"] for n in matched):
            status, problem = "WARN", f"{var}={raw!r} selects only DOWN interfaces: {', '.join(matched)}"
        elif multi and all(by_name[n]["loopback"] for n in matched):
            status, problem = "WARN", f"{var}={raw!r} selects only loopback while the job is multi-node ({multi})"
        statuses.append(status)
        if problem:
            problems.append(problem)
            fixes.append(f"{var}: {auto}, or set it to interfaces present on every node (here: {', '.join(usable)})")
    status = _worst(statuses)
    if not statuses:
        title = "NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME unset: auto-detect"
    else:
        title = "; ".join(problems) or "; ".join(f"{v}={values[v]['value']!r} -> {values[v]['matched'] or 'auto'}"
                                                 for v in IFNAME_VARS if v in values)
    return _record("host.socket_ifname", title, status, values, "; ".join(fixes), src)


def host_checks(environ: Mapping[str, str] | None = None, master_port: int = 29500) -> list[dict[str, Any]]:
    """Measure this host and grade it: the records ``host.port``, ``host.shm``, ``host.interfaces``,
    ``host.socket_ifname`` (each ``{"id", "title", "status", "values", "remediation", "source"}``,
    ``status`` in OK/WARN/FAIL, ``remediation`` empty when OK, sizes in bytes).

    Thresholds and their sources: ``host.port`` WARN when the rendezvous port is busy (D4);
    ``host.shm`` FAIL below 64 MiB (Docker's default, already too small for NCCL on 8 GPUs), WARN
    below 1 GiB total or free (NCCL troubleshooting, Docker section: ``--shm-size=1g``,
    ``NCCL_SHM_URL``); ``host.interfaces`` WARN on no IPv4 data-plane interface or on differing
    MTUs between UP interfaces of one link type (MN4; the cross-node comparison is the multi-node
    preflight's); ``host.socket_ifname`` FAIL when a set ``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME``
    selects no interface with an address or uses syntax gloo lacks, WARN when it selects only DOWN
    interfaces or only loopback on a multi-node job (Gilbreth guide 4.2, 8.12; MN2).

    Args:
        environ: the environment to judge (``os.environ`` when None); ``MASTER_PORT`` there
            overrides ``master_port``.
        master_port: rendezvous port to test when ``MASTER_PORT`` is unset (TCP, 1..65535).

    Raises:
        ValueError: ``master_port`` is not an integer in 1..65535 (message names ``master_port``).
    """
    tcp_port(master_port, "master_port")
    env = os.environ if environ is None else environ
    records = [_check_port(env, master_port), _check_shm()]
    try:
        ifaces = interfaces()
    except (RuntimeError, OSError) as exc:
        for cid in ("host.interfaces", "host.socket_ifname"):
            records.append(_record(cid, f"cannot list interfaces: {exc}", "FAIL", {}, "install iproute2 (`ip`)",
                                   "MN2, MN4 (seeds/multinode.md)"))
        return records
    records += [_check_interfaces(ifaces), _check_socket_ifname(env, ifaces)]
    return records
