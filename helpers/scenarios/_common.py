"""Small utilities shared by the rank scripts in ``helpers/scenarios``.

Stdlib-only at import time: torch is imported inside the functions that need it,
so ``--help`` of every scenario answers without paying torch's ~2 s import.
"""

from __future__ import annotations

import json
import os
import resource
import sys
import tempfile
import time
from datetime import timedelta
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import argparse

BACKENDS = ("auto", "gloo", "nccl")


def env_int(name: str, default: int) -> int:
    """Return environment variable ``name`` as an int, or ``default`` when unset.

    Raises:
        ValueError: the variable is set but is not an integer (names it).
    """
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None


def add_dist_args(parser: argparse.ArgumentParser, *, timeout_s: float, backend: str | None = "auto") -> None:
    """Add the flags every distributed scenario shares: ``--backend`` and ``--timeout-s``.

    Args:
        parser: the script's parser.
        timeout_s: default of ``--timeout-s``, seconds (the process group's and the
            rendezvous' timeout, passed to :func:`init_distributed`).
        backend: default of ``--backend`` when ``$RUNBOOK_BACKEND`` (set by the job runner's
            ``backend=``) is unset; ``None`` adds no ``--backend`` flag.

    Raises:
        ValueError: ``timeout_s`` <= 0, or ``backend`` not one of :data:`BACKENDS` (or ``None``).
    """
    if not timeout_s > 0:
        raise ValueError(f"timeout_s={timeout_s!r}: must be > 0 seconds")
    if backend is not None:
        if backend not in BACKENDS:
            raise ValueError(f"backend={backend!r}: accepted values are {', '.join(BACKENDS)}")
        parser.add_argument("--backend", choices=BACKENDS, default=os.environ.get("RUNBOOK_BACKEND", backend),
                            help="process-group backend; auto = nccl when every local rank has a GPU, else gloo "
                                 f"(default: $RUNBOOK_BACKEND, else {backend})")
    parser.add_argument("--timeout-s", type=float, default=float(timeout_s),
                        help=f"process-group (collective and rendezvous) timeout, seconds (default {timeout_s:g})")


def resolve_backend(backend: str) -> str:
    """Turn ``auto`` into ``nccl`` or ``gloo`` for this rank.

    ``auto`` is NCCL when CUDA is available and this node has at least
    ``LOCAL_WORLD_SIZE`` GPUs (one per rank, seed D3), gloo otherwise.

    Raises:
        ValueError: ``backend`` is not one of ``auto``, ``gloo``, ``nccl``.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend={backend!r}: accepted values are {', '.join(BACKENDS)}")
    if backend != "auto":
        return backend
    import torch

    local_world = env_int("LOCAL_WORLD_SIZE", 1)
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_world:
        return "nccl"
    return "gloo"


def init_distributed(backend: str, timeout_s: float) -> tuple[str, Any]:
    """Initialise the default process group from the launcher's env contract (D1).

    Binds the device by ``LOCAL_RANK`` (never ``RANK``, seed D3) before the group
    forms when the backend is NCCL.

    Args:
        backend: ``auto``, ``gloo`` or ``nccl``.
        timeout_s: collective timeout in seconds, passed to ``init_process_group``.

    Returns:
        ``(backend, device)``: the backend actually used and the ``torch.device``
        this rank computes on (``cuda:LOCAL_RANK`` or ``cpu``).
    """
    import torch
    import torch.distributed as dist

    chosen = resolve_backend(backend)
    if chosen == "nccl":
        device = torch.device("cuda", env_int("LOCAL_RANK", 0))
        torch.cuda.set_device(device)
        dist.init_process_group("nccl", timeout=timedelta(seconds=timeout_s), device_id=device)
    else:
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timedelta(seconds=timeout_s))
    return chosen, device


def synchronize(device: Any) -> None:
    """Wait for queued GPU work on ``device`` (no-op on CPU), so timings are real."""
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def reset_peak_memory(device: Any) -> None:
    """Reset the CUDA peak-allocation counter (no-op on CPU, where peak RSS is used)."""
    import torch

    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: Any) -> dict[str, Any]:
    """Peak memory of this rank in bytes, and which counter it came from.

    On CUDA: ``torch.cuda.max_memory_allocated`` (tensor bytes on the GPU).
    On CPU: the process's peak resident set size (``getrusage`` ``ru_maxrss``,
    which Linux reports in KiB), which includes the interpreter and torch (~220 MB).
    """
    import torch

    if device.type == "cuda":
        return {"bytes": int(torch.cuda.max_memory_allocated(device)), "kind": "cuda_max_allocated"}
    return {"bytes": int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024, "kind": "cpu_peak_rss"}


def write_json_atomic(path: str, obj: Any) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (temp file in the same dir, fsync, rename).

    A reader never sees a half-written file: either the old content or the new.
    """
    directory = os.path.dirname(os.path.abspath(path)) or "."
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=".json", dir=directory)
    try:
        with os.fdopen(fd, "w") as fh:
            json.dump(obj, fh, indent=2, sort_keys=True, default=str)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise


def log(msg: str) -> None:
    """Print one line prefixed with this rank's id, flushed at once (visible before a hang)."""
    rank = os.environ.get("RANK", "?")
    print(f"[rank {rank}] {msg}", flush=True, file=sys.stdout)


def finish() -> None:
    """Tear the process group down safely: drop what holds it, collect, barrier, destroy, collect.

    DDP's reducer (and DeepSpeed's engine) keep a reference to the process group, so
    ``destroy_process_group`` alone may leave gloo's backend alive until interpreter
    finalization, where freeing it aborts the rank with ``terminate called without an active
    exception`` (SIGABRT; seen here in ~0.5 % of DDP jobs; pytorch/pytorch#179291 describes the
    finalization race).  Callers pass nothing and ``del`` their DDP/engine objects first; the
    collections here break the reference cycles those objects sit in.  The barrier keeps a
    rank that finishes first from tearing down while a peer's last collective is in flight.
    """
    import gc

    import torch.distributed as dist

    gc.collect()
    if dist.is_initialized():
        dist.barrier()  # every peer has mapped this rank's DeepSpeed buffer by now: unlinking it is safe
        from helpers.jobdir import remove_deepspeed_shm

        remove_deepspeed_shm(dist.get_rank())
        dist.destroy_process_group()
    gc.collect()


def spin(seconds: float) -> None:
    """Compute (hold the CPU, pure Python) for ``seconds``: a rank busy outside any collective, as py-spy sees it
    (``active``), where ``time.sleep`` shows ``idle``."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        sum(k * k for k in range(10_000))
