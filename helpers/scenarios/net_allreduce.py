"""All-reduce over the network between nodes, size by size, saying which interface carries it (MN1-MN4).

The rank script of chapter 06 (MN1-MN4, Gilbreth 4, Gilbreth 8.12).
Every rank:

1. prints where its backend will listen before the process group forms: the interface and
   address ``GLOO_SOCKET_IFNAME`` names (gloo), or what its hostname resolves to (gloo's
   default), and ``NCCL_SOCKET_IFNAME`` when set (NCCL prints its own choice with
   ``NCCL_DEBUG=INFO``);
2. initialises the default process group with ``--timeout-s`` (``0`` = torch's default, 30 min
   for gloo) and prints how long that took (``init done in S s``);
3. prints the TCP connections the backend really opened to its peers (local address ->
   peer address, and the local interface), read from the kernel with psutil;
4. runs ``--steps`` steps; each step all-reduces one float32 tensor of every size of ``--sizes``
   (``4KiB,64MiB``...), checks the sum exactly, and prints ``step N all_reduce SIZE ok in S s``
   (the heartbeat).  ``--interval-s`` sleeps between steps, so that a fault can be injected
   into a running job (a killed node, a pulled cable).

A collective that fails prints ``step N all_reduce SIZE FAILED after S s: <error>`` and the
rank exits 1 with the traceback, so the time from the start of the collective to the first
error is in the rank's own log.  ``--out`` writes one JSON record per rank (directory).

Example (two lab nodes, one rank each; see helpers/netlab/)::

    torchrun --nnodes 2 --nproc-per-node 1 --rdzv-backend c10d --rdzv-endpoint node0:29500 \\
        helpers/scenarios/net_allreduce.py --sizes 4KiB,64MiB --timeout-s 5
"""

from __future__ import annotations

import argparse
import os
import re
import socket
import sys
import time

from helpers.scenarios import _common

_UNITS = {"": 1, "B": 1, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30, "KB": 10**3, "MB": 10**6, "GB": 10**9}
_SIZE_RX = re.compile(r"(\d+)\s*([KMG]?i?B?)", re.IGNORECASE)
MAX_BYTES = 2**30


def parse_size(text: str) -> int:
    """Bytes from ``"4096"``, ``"4KiB"``, ``"64MiB"``, ``"1GB"`` (binary units: KiB/MiB/GiB).

    Raises:
        ValueError: not a size, zero, not a multiple of 4 (float32 elements) or above 1 GiB;
            the message names ``--sizes``.
    """
    m = _SIZE_RX.fullmatch(text.strip())
    unit = m.group(2).upper() if m else ""
    if not m or unit not in _UNITS:
        raise ValueError(f"--sizes: {text!r} is not a size (accepted: bytes, or a number with B, KiB, MiB, GiB, KB, MB, GB)")
    size = int(m.group(1)) * _UNITS[unit]
    if size <= 0 or size % 4 or size > MAX_BYTES:
        raise ValueError(f"--sizes: {text!r} = {size} bytes: must be a positive multiple of 4 (float32), at most 1 GiB")
    return size


def parse_sizes(text: str) -> list[int]:
    """Sizes in bytes from a comma-separated list (see :func:`parse_size`).

    Raises:
        ValueError: an empty list or a bad entry (names ``--sizes``).
    """
    parts = [p for p in text.split(",") if p.strip()]
    if not parts:
        raise ValueError("--sizes: give at least one size, e.g. 4KiB,64MiB")
    return [parse_size(p) for p in parts]


_LINE = re.compile(r"^\[rank \d+\] (.*)$")
_RESULT = re.compile(r"^step (\d+) all_reduce (\S+) (ok|WRONG SUM|FAILED) (?:in|after) ([\d.]+) s")


def read_log(text: str) -> dict:
    """What one rank's stdout (this script's log) says, for notebooks and tests.

    Returns:
        ``{"host": hostname or None, "binding": the planned-binding line, "init_s": seconds init took
        (None if it did not finish), "failed_after": seconds from the start of the failing init or
        collective to its error (None if nothing failed), "error": that error line, "results":
        {size label: {"status": "ok"/"WRONG SUM"/"FAILED", "seconds": float, "step": int}} (the last
        step of each size), "transport": [connection lines], "done": bool, "last": the last
        progress line (init/all_reduce/done) or ""}``.
    """
    out: dict = {"host": None, "binding": None, "init_s": None, "failed_after": None, "error": None,
                 "results": {}, "transport": [], "done": False, "last": ""}
    for raw in (text or "").splitlines():
        m = _LINE.match(raw.strip())
        line = m.group(1) if m else raw.strip()
        if line.startswith("host ") and out["host"] is None:
            out["host"], _, out["binding"] = line[5:].partition(": ")
        elif line.startswith("init done in "):
            out["init_s"] = float(line.split()[3])
            out["last"] = line
        elif line.startswith("init FAILED after "):
            out["failed_after"] = float(line.split()[3])
            out["error"] = line.split(": ", 1)[-1]
            out["last"] = line
        elif (r := _RESULT.match(line)):
            out["results"][r.group(2)] = {"status": r.group(3), "seconds": float(r.group(4)), "step": int(r.group(1))}
            out["last"] = line
            if r.group(3) == "FAILED":
                out["failed_after"] = float(r.group(4))
                out["error"] = line.split(": ", 1)[-1]
        elif " transport: " in line:
            out["transport"] = line.split(" transport: ", 1)[1].split("; ")
        elif line == "done":
            out["done"] = True
            out["last"] = line
    return out


def iface_of(address: str) -> str | None:
    """The name of this node's interface that carries IPv4 ``address`` (None if none does)."""
    import psutil

    for name, addrs in psutil.net_if_addrs().items():
        if any(a.family == socket.AF_INET and a.address == address for a in addrs):
            return name
    return None


def planned_binding(backend: str) -> str:
    """Where the backend will listen, from the environment, before ``init_process_group`` (one line)."""
    import psutil

    host = socket.gethostname()
    if backend == "nccl":
        value = os.environ.get("NCCL_SOCKET_IFNAME")
        return (f"NCCL_SOCKET_IFNAME={value!r} (NCCL prints its choice: 'Bootstrap : Using ...' with NCCL_DEBUG=INFO)"
                if value is not None else "NCCL_SOCKET_IFNAME unset: NCCL auto-detects (ib*, then any but docker*/lo)")
    value = os.environ.get("GLOO_SOCKET_IFNAME")
    if value is not None and len(value) > 1:
        found = []
        for name in value.split(","):
            addrs = [a.address for a in psutil.net_if_addrs().get(name, []) if a.family == socket.AF_INET]
            found.append(f"{name} -> {addrs[0] if addrs else 'NO SUCH INTERFACE/ADDRESS'}")
        return f"GLOO_SOCKET_IFNAME={value!r}: {', '.join(found)}"
    try:
        addr = socket.gethostbyname(host)
    except OSError as exc:
        return f"GLOO_SOCKET_IFNAME unset: gloo uses hostname {host!r}, which does not resolve ({exc})"
    return f"GLOO_SOCKET_IFNAME unset: gloo uses hostname {host!r} -> {addr} ({iface_of(addr) or 'not a local address'})"


def peer_connections(store_port: int) -> list[str]:
    """This process's established TCP connections except those of the rendezvous store (``store_port``).

    Returns lines ``local_ip:port (iface) -> peer_ip:port``, sorted: the backend's transport.
    """
    import psutil

    lines = set()
    for c in psutil.Process().net_connections(kind="tcp"):
        if c.status != psutil.CONN_ESTABLISHED or not c.raddr:
            continue
        if store_port in (c.laddr.port, c.raddr.port) or c.laddr.ip == c.raddr.ip:
            continue
        lines.add(f"{c.laddr.ip} ({iface_of(c.laddr.ip) or '?'}) -> {c.raddr.ip}")
    return sorted(lines)


def run(args: argparse.Namespace, sizes: list[tuple[str, int]]) -> int:
    """Initialise, all-reduce every ``(label, bytes)`` size for ``args.steps`` steps, report; return the exit status."""
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    backend = _common.resolve_backend(args.backend)
    rank = _common.env_int("RANK", 0)
    port = _common.env_int("MASTER_PORT", 29500)
    _common.log(f"host {socket.gethostname()}: {planned_binding(backend)}")
    timeout = "torch default (gloo: 1800 s)" if args.timeout_s == 0 else f"{args.timeout_s:g} s"
    _common.log(f"init_process_group({backend}) MASTER_ADDR={os.environ.get('MASTER_ADDR')} "
                f"MASTER_PORT={port} timeout {timeout}")
    t0 = time.monotonic()
    if backend == "nccl":
        device = torch.device("cuda", _common.env_int("LOCAL_RANK", 0))
        torch.cuda.set_device(device)
        kw = {"device_id": device}
    else:
        device = torch.device("cpu")
        kw = {}
    if args.timeout_s:
        kw["timeout"] = timedelta(seconds=args.timeout_s)
    try:
        dist.init_process_group(backend, **kw)
    except Exception as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        _common.log(f"init FAILED after {time.monotonic() - t0:.2f} s: {type(exc).__name__}: {first[:300]}")
        raise
    world = dist.get_world_size()
    _common.log(f"init done in {time.monotonic() - t0:.2f} s: rank {rank} of {world}")
    record = {"rank": rank, "host": socket.gethostname(), "backend": backend, "world_size": world, "results": []}
    for step in range(args.steps):
        for label, size in sizes:
            x = torch.full((size // 4,), float(rank + 1), device=device)
            start = time.monotonic()
            try:
                dist.all_reduce(x)
                _common.synchronize(device)
            except Exception as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                _common.log(f"step {step} all_reduce {label} FAILED after {time.monotonic() - start:.2f} s: "
                            f"{type(exc).__name__}: {first}")
                raise
            took = time.monotonic() - start
            want = world * (world + 1) / 2
            ok = bool(torch.all(x == want))
            record["results"].append({"step": step, "bytes": size, "seconds": round(took, 4), "exact": ok})
            _common.log(f"step {step} all_reduce {label} {'ok' if ok else 'WRONG SUM'} in {took:.3f} s")
            if step == 0 and (label, size) == sizes[0]:
                conns = peer_connections(port)
                record["connections"] = conns
                _common.log(f"{backend} transport: {'; '.join(conns) or 'no peer TCP connection (same host?)'}")
            if not ok:
                return 1
        if args.interval_s and step < args.steps - 1:
            time.sleep(args.interval_s)
    if args.out:
        _common.write_json_atomic(os.path.join(args.out, f"rank{rank}.json"), record)
    _common.finish()
    _common.log("done")
    return 0


def main(argv: list[str] | None = None) -> int:
    """Parse arguments and run; bad input exits 2 with the flag named."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sizes", default="4KiB", help="comma-separated all_reduce sizes: 4KiB,1MiB,64MiB (default 4KiB)")
    parser.add_argument("--steps", type=int, default=1, help="how many times to all_reduce every size (default 1)")
    parser.add_argument("--interval-s", type=float, default=0.0, help="sleep between steps, seconds (default 0)")
    parser.add_argument("--timeout-s", type=float, default=10.0,
                        help="init_process_group timeout, seconds; 0 = torch's default (default 10)")
    parser.add_argument("--backend", choices=_common.BACKENDS, default=os.environ.get("RUNBOOK_BACKEND", "auto"))
    parser.add_argument("--out", default=None, help="directory for one rank<R>.json per rank")
    args = parser.parse_args(argv)
    try:
        sizes = list(zip((p.strip() for p in args.sizes.split(",") if p.strip()), parse_sizes(args.sizes)))
    except ValueError as exc:
        parser.error(str(exc))
    if args.steps < 1:
        parser.error(f"--steps={args.steps}: must be >= 1")
    if args.interval_s < 0:
        parser.error(f"--interval-s={args.interval_s}: must be >= 0 seconds")
    if args.timeout_s < 0:
        parser.error(f"--timeout-s={args.timeout_s}: must be >= 0 seconds (0 = torch's default)")
    return run(args, sizes)


if __name__ == "__main__":
    sys.exit(main())
