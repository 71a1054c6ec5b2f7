"""Measure this host for the allocation check (check 5): network interfaces, ``/dev/shm``, TCP ports.

The measuring functions (:func:`interfaces`, :func:`shm_info`, :func:`port_free`, :func:`free_port`,
:func:`free_ports`, :func:`port_holders`, :func:`build_locks`, :func:`nic_speed_mbps`, :func:`memcpy_gbps`) look at the real host and return plain data.  Grading
them into :class:`helpers.checks.Check` records is :func:`helpers.allocation.local.host_checks`'s job
(:func:`host_checks` here forwards to it for one release); the ``*_SOCKET_IFNAME`` rules are
:mod:`helpers.ifnames`'.  Nothing runs at import.

Facts measured on this project's machines (torch 2.13 CPU, Linux 6.x; the tests in
tests/unit/test_hostinfo.py re-check them) are marked "measured"; the rest cite their source.
"""

from __future__ import annotations

import contextlib
import errno
import glob
import os
import re
import shutil
import socket
import subprocess
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

import psutil

from helpers.validate import positive_int, tcp_port

if TYPE_CHECKING:
    pass


def interfaces() -> list[dict[str, Any]]:
    """Every network interface of the current network namespace, from ``ip -j addr show``; where ``ip`` is not
    installed (GPU container images often lack iproute2: seen on this project's H200 machine), from the kernel's
    ``/sys/class/net`` and psutil's addresses (:func:`interfaces_from_sysfs`, same fields).

    Why iproute2's JSON and not ``psutil.net_if_stats``/``net_if_addrs``: psutil reports only
    ``isup`` (the IFF_UP admin flag), not the kernel's operstate (``UP``/``DOWN``/``UNKNOWN``/
    ``LOWERLAYERDOWN``), nor the LOOPBACK flag or the link type (``ether``/``infiniband``), and gives
    netmasks instead of prefix lengths.  ``ip`` is also what the runbook tells users to run (MN4:
    ``ip link show``), so the numbers printed here are the ones they will see; and it works
    unchanged under ``ip netns exec``.

    Returns:
        One dict per interface, in kernel order, as :func:`parse_ip_addr` gives them.

    Raises:
        RuntimeError: ``ip`` fails, hangs (10 s), or prints something that is not JSON; or ``ip`` is not installed and
            ``/sys/class/net`` cannot be read either.
    """
    ip = shutil.which("ip")
    if ip is None:
        try:
            return interfaces_from_sysfs()
        except OSError as exc:
            raise RuntimeError(f"`ip` (iproute2) not found on PATH and /sys/class/net unreadable ({exc}): install "
                               "iproute2 (apt-get install iproute2 / dnf install iproute)") from exc
    try:
        proc = subprocess.run([ip, "-j", "addr", "show"], capture_output=True, text=True, timeout=10, check=False)
    except subprocess.TimeoutExpired as exc:
        raise RuntimeError("`ip -j addr show` did not answer within 10 s") from exc
    if proc.returncode != 0:
        raise RuntimeError(f"`ip -j addr show` failed (rc={proc.returncode}): {proc.stderr.strip()}")
    try:
        return parse_ip_addr(proc.stdout)
    except ValueError as exc:
        raise RuntimeError(f"`ip -j addr show` printed no JSON (iproute2 too old for -j?): {exc}") from exc


# struct net_device flags as /sys/class/net/*/flags shows them (include/uapi/linux/if.h), named and ordered as
# iproute2's print_link_flags prints them (ip/ipaddress.c; NO-CARRIER first, LOWER_UP after UP).
_IFF_NAMES = ((0x8, "LOOPBACK"), (0x2, "BROADCAST"), (0x10, "POINTOPOINT"), (0x1000, "MULTICAST"), (0x80, "NOARP"),
              (0x1, "UP"))
# ARPHRD_* link types (include/uapi/linux/if_arp.h) under iproute2's names.
_ARPHRD_NAMES = {1: "ether", 32: "infiniband", 512: "ppp", 768: "ipip", 772: "loopback", 776: "sit", 778: "gre",
                 65534: "none"}


def interfaces_from_sysfs(root: str | os.PathLike[str] = "/sys/class/net",
                          addrs: Mapping[str, Sequence[Any]] | None = None) -> list[dict[str, Any]]:
    """The interfaces of :func:`interfaces` without iproute2: the kernel's ``/sys/class/net/<if>/{ifindex,operstate,
    flags,carrier,mtu,type}`` (Documentation/ABI/testing/sysfs-class-net) and psutil's ``net_if_addrs`` for the
    addresses.  ``flags`` holds the administrative IFF bits ``ip`` prints plus ``LOWER_UP`` / ``NO-CARRIER`` from
    ``carrier`` (the kernel computes IFF_RUNNING, so the sysfs ``flags`` file never shows it) and ``M-DOWN`` when the
    ``iflink`` device (a veth's peer) is down; ``kind`` is None (as ``ip`` without ``-d``).  One difference from ``ip``
    is possible: a peer in another namespace whose ifindex is also a down device here is marked ``M-DOWN`` (sysfs
    does not say which namespace ``iflink`` is in); the checks read ``UP``, ``NO-CARRIER`` and ``LOOPBACK`` only.
    Why not psutil alone: :func:`interfaces`' docstring.

    Args:
        root: the ``class/net`` folder (tests give a copy).
        addrs: ``psutil.net_if_addrs()``-shaped addresses per name (None: this host's).

    Returns:
        The dicts of :func:`parse_ip_addr`, in ifindex order.

    Raises:
        OSError: ``root`` cannot be listed.
    """
    import ipaddress

    def read(d: Path, name: str) -> str:
        try:
            return (d / name).read_text().strip()
        except (OSError, ValueError):  # carrier of a DOWN device: EINVAL
            return ""

    def iff(flags: str) -> int:
        try:
            return int(flags or "0", 16)
        except ValueError:
            return 0

    addrs = psutil.net_if_addrs() if addrs is None else addrs
    devices = {d: {k: read(d, k) for k in ("ifindex", "iflink", "flags", "operstate", "carrier", "mtu", "type")}
               for d in sorted(Path(root).iterdir())}  # each file read once
    flags_by_index = {a["ifindex"]: iff(a["flags"]) for a in devices.values()}
    rows = []
    for d, a in devices.items():
        idx, mtu, typ, link, bits = a["ifindex"], a["mtu"], a["type"], a["iflink"], iff(a["flags"])
        state = (a["operstate"] or "unknown").upper()
        carrier = a["carrier"] == "1"
        flags = ["NO-CARRIER"] if bits & 0x1 and not carrier else []
        flags += [n for bit, n in _IFF_NAMES if bits & bit] + (["LOWER_UP"] if bits & 0x1 and carrier else [])
        if link != idx and link in flags_by_index and not flags_by_index[link] & 0x1:
            flags.append("M-DOWN")  # ip's mark for a lower / peer device that is down (a peer in this namespace)
        v4, v6 = [], []
        for addr in addrs.get(d.name, ()):
            if addr.family == socket.AF_INET and addr.netmask:
                v4.append(f"{addr.address}/{ipaddress.IPv4Network(f'0.0.0.0/{addr.netmask}').prefixlen}")
            elif addr.family == socket.AF_INET6 and addr.netmask:
                v6.append(f"{addr.address.split('%')[0]}/{bin(int(ipaddress.IPv6Address(addr.netmask))).count('1')}")
        rows.append((int(idx) if idx.isdigit() else 1 << 30, {
            "name": d.name, "state": state, "mtu": int(mtu) if mtu.isdigit() else 0, "flags": flags,
            "link_type": _ARPHRD_NAMES.get(int(typ), typ) if typ.isdigit() else typ, "kind": None,
            "loopback": "LOOPBACK" in flags, "up": "UP" in flags and state in ("UP", "UNKNOWN"),
            "running": "UP" in flags and "NO-CARRIER" not in flags, "ipv4": v4, "ipv6": v6}))
    return [r for _, r in sorted(rows, key=lambda r: (r[0], r[1]["name"]))]


def parse_ip_addr(text: str) -> list[dict[str, Any]]:
    """Interfaces from ``ip -j [-d] addr show`` output (this host's, or a node's through a runner).

    Returns:
        One dict per interface, kernel order: ``name``, ``state`` (operstate: ``UP``, ``DOWN``,
        ``UNKNOWN`` (e.g. ``lo``), ``LOWERLAYERDOWN``...), ``mtu`` (int, bytes), ``flags`` (list[str]),
        ``link_type``, ``kind`` (``veth``, ``bridge``... with ``-d``, else None), ``loopback`` (bool),
        ``up`` (admin up and operstate ``UP``/``UNKNOWN``), ``running`` (admin up and carrier: ``UP``
        without ``NO-CARRIER``, what NCCL's ``IFF_RUNNING`` test accepts), ``ipv4`` / ``ipv6``
        (``"addr/prefix"`` lists).

    Raises:
        ValueError: the text is not ``ip -j`` JSON (nesting bounded, :func:`helpers.inputs.load_json`), or a field
            the check uses has the wrong type (named).
    """
    from helpers import inputs

    links = inputs.load_json(text or "[]", "ip -j addr output", max_depth=16)
    if not isinstance(links, list):
        raise ValueError(f"ip -j addr output: a JSON list of interfaces expected, got {type(links).__name__}")
    out: list[dict[str, Any]] = []
    for i, link in enumerate(links):
        if not isinstance(link, dict) or "ifname" not in link:
            continue
        where = f"ip -j addr output: interface {i}"
        flags, addrs, info = link.get("flags", []), link.get("addr_info", []), link.get("linkinfo") or {}
        mtu = link.get("mtu", 0)
        if not isinstance(link["ifname"], str) or not link["ifname"]:
            raise ValueError(f"{where}: ifname = {str(link['ifname'])[:40]!r}: must be a name")
        if not isinstance(flags, list) or not all(isinstance(f, str) for f in flags):
            raise ValueError(f"{where} ({link['ifname']}): flags must be a list of strings")
        if not isinstance(mtu, int) or isinstance(mtu, bool) or not 0 <= mtu < 2**32:
            raise ValueError(f"{where} ({link['ifname']}): mtu = {str(mtu)[:40]!r}: must be an integer in 0..2^32-1")
        if not isinstance(addrs, list) or not isinstance(info, dict):
            raise ValueError(f"{where} ({link['ifname']}): addr_info must be a list and linkinfo an object")
        good = [a for a in addrs if isinstance(a, dict) and isinstance(a.get("local"), str)
                and isinstance(a.get("prefixlen"), int) and not isinstance(a.get("prefixlen"), bool)]
        if len(good) != len(addrs):
            raise ValueError(f"{where} ({link['ifname']}): each addr_info entry needs 'local' (str) and 'prefixlen' (int)")
        state = str(link.get("operstate", "UNKNOWN"))
        out.append({
            "name": link["ifname"], "state": state, "mtu": mtu, "flags": flags,
            "link_type": str(link.get("link_type", "")), "kind": info.get("info_kind"),
            "loopback": "LOOPBACK" in flags, "up": "UP" in flags and state in ("UP", "UNKNOWN"),
            "running": "UP" in flags and "NO-CARRIER" not in flags,
            "ipv4": [f"{a['local']}/{a['prefixlen']}" for a in good if a.get("family") == "inet"],
            "ipv6": [f"{a['local']}/{a['prefixlen']}" for a in good if a.get("family") == "inet6"],
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


def extension_roots(environ: Mapping[str, str] | None = None) -> list[str]:
    """The folders torch JIT-builds C++ extensions in (DeepSpeed's ops among them): ``$TORCH_EXTENSIONS_DIR``
    when set, and torch's default ``$XDG_CACHE_HOME/torch_extensions`` (``~/.cache/torch_extensions``), the
    path of ``torch.utils.cpp_extension.get_default_build_root`` on Linux, worked out here without importing torch.

    Returns the existing folders only, each once.
    """
    env = os.environ if environ is None else environ
    cache = env.get("XDG_CACHE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"), ".cache")
    roots = [env.get("TORCH_EXTENSIONS_DIR") or "", os.path.join(cache, "torch_extensions")]
    return list(dict.fromkeys(os.path.realpath(r) for r in roots if r and os.path.isdir(r)))


def build_locks(roots: Sequence[str]) -> list[dict[str, Any]]:
    """Every JIT build lock under ``roots`` (:func:`extension_roots`): the file ``lock`` that torch's ``FileBaton`` keeps
    in an extension's build folder while one process builds it (``<root>/<op>/lock``, or ``<root>/<py>_<acc>/<op>/lock``
    under the default root).

    torch removes the file when the build ends; a builder killed meanwhile leaves it, and every later load waits for
    it forever (PF-jit-lock; https://github.com/pytorch/pytorch/issues/189245).  A build in progress runs ninja and the
    compiler in that folder: ``builders`` lists the local processes whose working directory it is.

    Returns:
        ``[{"path": str, "age_s": float (seconds since the file was last changed), "builders": [pid, ...]}]``.
    """
    now = time.time()
    found: list[dict[str, Any]] = []
    for root in (os.path.realpath(r) for r in roots):
        for pattern in ("*/lock", "*/*/lock"):
            for path in sorted(glob.glob(os.path.join(root, pattern))):
                with contextlib.suppress(OSError):
                    found.append({"path": path, "age_s": round(now - os.stat(path).st_mtime, 1), "builders": []})
    if found:
        folders = {os.path.dirname(f["path"]): f for f in found}
        for proc in psutil.process_iter(["pid"]):
            with contextlib.suppress(psutil.Error, OSError):
                cwd = proc.cwd()
                if cwd in folders:
                    folders[cwd]["builders"].append(proc.pid)
    return found


def nic_speed_mbps(iface: str) -> tuple[float | None, str]:
    """Line rate of ``iface`` in Mb/s and where it came from (sysfs ``speed``, ``ethtool``, ``ibstat``)."""
    try:
        value = int(Path(f"/sys/class/net/{iface}/speed").read_text().strip())
        if value > 0:
            return float(value), f"/sys/class/net/{iface}/speed"
    except (OSError, ValueError):
        pass
    for argv, rx, unit in ((["ethtool", iface], r"Speed:\s*(\d+)\s*Mb/s", 1.0), (["ibstat"], r"Rate:\s*(\d+)", 1000.0)):
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        m = re.search(rx, out)
        if m:
            return float(m.group(1)) * unit, " ".join(argv)
    return None, "unknown (no sysfs speed, ethtool or ibstat)"


def infiniband_ports(root: str | os.PathLike[str] = "/sys/class/infiniband") -> list[dict[str, Any]]:
    """The active InfiniBand / RoCE ports of this host, from sysfs: ``[{"device", "port", "rate_gbps", "link_layer"}]``.

    Reads ``<root>/<dev>/ports/<n>/state`` (``4: ACTIVE``), ``rate`` (``400 Gb/sec (4X NDR)``) and ``link_layer``
    (``InfiniBand`` / ``Ethernet`` for RoCE), as ``ibstat`` prints them (Linux ``Documentation/ABI/stable/sysfs-class-infiniband``).
    ``[]`` when the folder does not exist (no RDMA NIC, or a CPU box).
    """
    ports = []
    for state in sorted(Path(root).glob("*/ports/*/state")):
        try:
            if "ACTIVE" not in state.read_text():
                continue
            rate = re.search(r"(\d+(?:\.\d+)?)\s*Gb/sec", (state.parent / "rate").read_text())
            layer = (state.parent / "link_layer").read_text().strip() if (state.parent / "link_layer").exists() else ""
        except OSError:
            continue
        ports.append({"device": state.parents[2].name, "port": state.parent.name,
                      "rate_gbps": float(rate.group(1)) if rate else None, "link_layer": layer})
    return ports


def memcpy_gbps(nbytes: int = 64 << 20, repeats: int = 5) -> float:
    """This host's memory-copy bandwidth, GB/s (best of ``repeats`` copies of ``nbytes``, read + write counted once)."""
    import torch

    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9


def cpu_pressure_us(path: str = "/proc/pressure/cpu") -> int | None:
    """The kernel's CPU pressure stall counter: microseconds during which at least one runnable task waited for a CPU
    (the ``some ... total=`` field of ``/proc/pressure/cpu``, Linux PSI, kernel 4.20+).

    Two readings around a job give the share of its wall time the host's CPUs were contended
    (:func:`cpu_contention`).  Read from the file, not through a library: psutil does not expose PSI.

    Returns:
        The counter (µs, monotonic since boot), or None where the kernel has no PSI (file absent or unreadable,
        ``psi=0`` on the kernel command line).

    Source: https://docs.kernel.org/accounting/psi.html
    """
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    m = re.search(r"^some\b.*\btotal=(\d+)", text, re.M)
    return int(m.group(1)) if m else None


def cpu_contention(start_us: int | None, wall_s: float, path: str = "/proc/pressure/cpu") -> float | None:
    """Share of the last ``wall_s`` seconds (0-1) during which some runnable task on this host waited for a CPU: the
    PSI stall time since ``start_us`` (:func:`cpu_pressure_us`, read before) over the wall time.  None without PSI
    or without a start reading.  It counts every task on the host, the measured job's own included.

    Source: https://docs.kernel.org/accounting/psi.html ("some": at least one task stalled).
    """
    end = cpu_pressure_us(path)
    if start_us is None or end is None or wall_s <= 0:
        return None
    return max(0.0, min(1.0, (end - start_us) / 1e6 / wall_s))


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


def free_port(host: str = "127.0.0.1", *, outside_ephemeral: bool = False) -> int:
    """A TCP port the kernel hands out as free on ``host`` (bind to port 0, read it, close).

    Another process may take it before you use it: pass it on at once, or better let the
    launcher pick (``--rdzv-endpoint=localhost:0``, D4).  ``outside_ephemeral``: :func:`free_ports`.

    Raises:
        OSError: no ephemeral port can be bound (range exhausted, ``host`` not local).
    """
    return free_ports(1, host, outside_ephemeral=outside_ephemeral)[0]


def ephemeral_range() -> tuple[int, int]:
    """The kernel's ephemeral port range, ``(low, high)`` inclusive, from ``/proc/sys/net/ipv4/ip_local_port_range``
    (Linux's default 32768-60999 where it cannot be read)."""
    try:
        low, high = (int(x) for x in Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split())
        return low, high
    except (OSError, ValueError):
        return 32768, 60999


def free_ports(count: int, host: str = "127.0.0.1", *, outside_ephemeral: bool = False) -> list[int]:
    """``count`` distinct TCP ports the kernel hands out as free on ``host``.

    All ``count`` sockets are bound before any is closed, so the ports differ from each other
    (two calls of :func:`free_port` may, rarely, return the same one).  The caveat of
    :func:`free_port` holds: pass them on at once.

    ``outside_ephemeral``: ports below the kernel's ephemeral range (:func:`ephemeral_range`), from 20000 up, tried
    from a random start.  For a rendezvous port on a SLURM node: srun listens on ephemeral ports unless the site sets
    ``SrunPortRange`` (https://slurm.schedmd.com/slurm.conf.html#OPT_SrunPortRange), and so does any program in that
    network namespace, so an ephemeral port chosen elsewhere can be taken there before torchrun binds it (then
    torchrun's c10d agent connects to srun's socket as a client and fails with "Failed to recv, got 0 bytes").

    Raises:
        ValueError: ``count`` is not an integer >= 1.
        OSError: not enough ports can be bound, or ``host`` is not local.
    """
    positive_int(count, "count")
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with contextlib.ExitStack() as stack:
        socks = [stack.enter_context(socket.socket(family, socket.SOCK_STREAM)) for _ in range(count)]
        if not outside_ephemeral:
            for sock in socks:
                sock.bind((host, 0))
            return [int(sock.getsockname()[1]) for sock in socks]
        import random

        low = 20000
        high = max(low + count, ephemeral_range()[0])  # exclusive
        start = random.randrange(low, high)
        candidates = iter([*range(start, high), *range(low, start)])
        for sock in socks:
            for port in candidates:
                try:
                    sock.bind((host, port))
                    break
                except OSError as exc:
                    if exc.errno != errno.EADDRINUSE:
                        raise
            else:
                raise OSError(errno.EADDRINUSE, f"no free TCP port in {low}..{high - 1} on {host}")
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
