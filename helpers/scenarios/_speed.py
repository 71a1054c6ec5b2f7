"""How fast this rank computes and copies memory: the per-rank measurement behind the straggler score.

Run inside a job that already runs on every rank (``allocation_job.py`` across nodes, ``collectives.py`` on one
node); :mod:`helpers.allocation.straggler` turns the gathered numbers into scores against the best rank.

* matrix multiply: ``torch.mm`` of two ``n x n`` matrices (float32 on CPU, bfloat16 on GPU as gpu-fryer does
  by default where supported), GFLOP/s = 2 n^3 per product (https://github.com/huggingface/gpu-fryer);
* memory copy: ``dst.copy_(src)``, GB/s = bytes copied / s (read + write counted once, as
  :func:`helpers.hostinfo.memcpy_gbps`).

Each figure is the best of ``windows`` windows of ``window_s`` seconds: the best resists a moment of noise from
other processes, while a rank held down all the time (a throttled GPU, a CPU share capped by the cgroup's
``cpu.max``) stays slow in every window.  A window is longer than the CFS bandwidth period (100 ms by default,
https://docs.kernel.org/scheduler/sched-bwc.html), so a ``cpu.max`` quota cannot hide inside one window.
On CPU the measurement uses one thread: ranks that share a host's cores would otherwise measure each other.
Stdlib at import (torch inside the function), like :mod:`helpers.scenarios._common`.
"""

from __future__ import annotations

import os
import socket
import time
from typing import Any

MODES = ("auto", "concurrent", "sequential", "off")
"""How the ranks take turns: all at once, one after the other, or not at all."""
SEQUENTIAL_MAX = 8
"""``auto`` has the ranks take turns on gloo up to this many ranks, else measures all at once."""


def _best_rate(step: Any, units_per_step: float, windows: int, window_s: float, sync: Any) -> float:
    best = 0.0
    for _ in range(windows):
        sync()
        n = 0
        t0 = time.perf_counter()
        while True:
            step()
            n += 1
            if n % 4 == 0:
                sync()
                elapsed = time.perf_counter() - t0
                if elapsed >= window_s:
                    break
        best = max(best, units_per_step * n / elapsed)
    return best


def measure(device: Any, *, windows: int = 5, window_s: float = 0.2, matmul_n: int = 0,
            copy_bytes: int = 0, turn: Any = None) -> dict[str, Any]:
    """This rank's matmul throughput and memory-copy bandwidth.

    Args:
        device: the rank's ``torch.device`` (``cpu`` or ``cuda:<local_rank>``).
        windows: timed windows per figure (the best is kept).
        window_s: seconds per window (>= 0.2: longer than the CFS period).
        matmul_n: matrix size (0: 256 on CPU, 8192 on GPU, gpu-fryer's size).
        copy_bytes: bytes per copy (0: 16 MiB on CPU, 1 GiB on GPU).
        turn: called before each window (a barrier dance: :func:`gather` interleaves the ranks' windows so that a
            busy moment of the host falls on every rank alike); ``None``: no waiting.

    Returns:
        ``{"matmul_gflops", "memcpy_gbps", "matmul_n", "copy_bytes", "dtype", "threads", "seconds"}``.

    Raises:
        ValueError: ``windows`` < 1 or ``window_s`` < 0.2.
    """
    if windows < 1 or window_s < 0.2:
        raise ValueError(f"windows={windows!r}, window_s={window_s!r}: need >= 1 window of >= 0.2 s "
                         "(longer than the CFS period, 100 ms)")
    import torch

    t_start = time.perf_counter()
    cuda = getattr(device, "type", str(device)) == "cuda"
    threads = torch.get_num_threads()
    if not cuda:
        torch.set_num_threads(1)
    try:
        n = matmul_n or (8192 if cuda else 256)
        dtype = torch.bfloat16 if cuda and torch.cuda.is_bf16_supported() else torch.float32
        a = torch.randn(n, n, device=device, dtype=dtype)
        b = torch.randn(n, n, device=device, dtype=dtype)
        out = torch.empty(n, n, device=device, dtype=dtype)
        nbytes = copy_bytes or ((1 << 30) if cuda else (16 << 20))
        src = torch.ones(nbytes // 4, device=device)
        dst = torch.empty_like(src)

        def sync() -> None:
            if cuda:
                torch.cuda.synchronize(device)

        gflops = gbps = 0.0
        for _ in range(windows):
            if turn is not None:
                turn()
            gflops = max(gflops, _best_rate(lambda: torch.mm(a, b, out=out), 2.0 * n ** 3 / 1e9, 1, window_s, sync))
            gbps = max(gbps, _best_rate(lambda: dst.copy_(src), nbytes / 1e9, 1, window_s, sync))
    finally:
        torch.set_num_threads(threads)
    return {"matmul_gflops": round(gflops, 3), "memcpy_gbps": round(gbps, 3), "matmul_n": n, "copy_bytes": nbytes,
            "dtype": str(dtype).replace("torch.", ""), "threads": 1 if not cuda else None, "windows": windows,
            "window_s": window_s, "seconds": round(time.perf_counter() - t_start, 3)}


def gather(mode: str, backend: str, device: Any) -> list[dict[str, Any]]:
    """Every rank's :func:`measure`, gathered on every rank: ``[{"rank", "host", "local_rank", "gpu", "mode", ...}]``.

    Args:
        mode: one of :data:`MODES`.  ``auto``: all ranks at once on NCCL (each GPU is its own, and measuring them
            together loads the node's power and cooling as training does, like gpu-fryer); one rank after the other on
            gloo up to :data:`SEQUENTIAL_MAX` ranks, window by window (ranks on CPU share the host's cores, and the
            network lab's nodes share one machine's: measured together they would measure each other; taking turns
            window by window spreads the host's busy moments over every rank); ``off``: ``[]``.
        backend: the process group's backend (``nccl`` / ``gloo``).
        device: this rank's device.

    Raises:
        ValueError: ``mode`` not in :data:`MODES`.
    """
    if mode not in MODES:
        raise ValueError(f"mode={mode!r}: accepted values are {', '.join(MODES)}")
    import torch
    import torch.distributed as dist

    if mode == "off":
        return []
    rank, world = dist.get_rank(), dist.get_world_size()
    if mode == "auto":
        mode = "concurrent" if backend == "nccl" or world > SEQUENTIAL_MAX else "sequential"
    if mode == "concurrent":
        dist.barrier()
        mine = measure(device)
    else:
        def my_turn() -> None:  # the ranks take turns window by window: rank 0's window k, rank 1's, ..., then k+1
            for _ in range(rank + 1):
                dist.barrier()

        def after() -> None:
            for _ in range(world - rank - 1):
                dist.barrier()

        def turn() -> None:
            if getattr(turn, "started", False):
                after()
            turn.started = True  # type: ignore[attr-defined]
            my_turn()

        mine = measure(device, turn=turn)
        after()
    gpu = None
    if getattr(device, "type", "cpu") == "cuda":
        props = torch.cuda.get_device_properties(device)
        gpu = {"index": device.index if device.index is not None else torch.cuda.current_device(), "name": props.name,
               "pci_bus_id": f"{getattr(props, 'pci_domain_id', 0):04x}:{getattr(props, 'pci_bus_id', 0):02x}:"
                             f"{getattr(props, 'pci_device_id', 0):02x}"}
    mine.update(rank=rank, host=socket.gethostname(), local_rank=int(os.environ.get("LOCAL_RANK", "0")), gpu=gpu, mode=mode)
    out: list[Any] = [None] * world
    dist.all_gather_object(out, mine)
    return out
