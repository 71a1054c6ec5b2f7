"""Opt-in per-rank trace of the collectives a script calls, for the hang doctor.

Two lines in a training script::

    from helpers import collective_trace
    collective_trace.enable()          # before the first collective

Each call to a ``torch.distributed`` collective then appends two JSON lines to
``<dir>/rank<R>.jsonl``: ``enter`` (sequence number, op, tensor shape/dtype, the caller's
``file:line``) before the call and ``exit`` after it.  A rank stuck in a collective has an
``enter`` without its ``exit``; a rank that skipped one has a lower sequence number.  The
file is line-buffered, so it is complete up to the moment a rank hangs or dies.

The hang doctor's first evidence is torch's Flight Recorder, which needs no change to the script
(:mod:`helpers.flight_recorder`, docs/hang-doctor.md).  This trace stays only for what the Flight
Recorder does not give: on gloo its entries carry no call site (``frames`` is ``None``) and no
completion (``state`` stays ``scheduled``), so the *line* that called each collective, and whether a
rank left it, come from here.  It costs two small writes per collective (see benchmarks/).

What ``exit`` means, per backend:

* gloo: the collective returns when it has finished, so ``exit`` is written after the data
  arrived and a rank stuck in it has ``enter`` without ``exit``.
* NCCL: every collective is asynchronous: the Python call returns once the kernel is *queued*
  on the NCCL stream (torch's ``ProcessGroupNCCL.hpp``: "All NCCL functions provided by this
  class are asynchronous"), so without help every rank would "exit" the collective that hangs
  and block later, at the next sync point (``.item()``, a barrier, ``destroy_process_group``).
  Two things make the trace truthful there, at the cost of blocking collectives (slower: the
  trace is a debugging aid):

  1. :func:`enable` sets ``TORCH_NCCL_BLOCKING_WAIT=1`` (unless already set) when no process
     group exists yet; ProcessGroupNCCL reads it when the group is created
     (``ProcessGroupNCCL.hpp``: "Control whether or not wait() is blocking"), so the collective's
     own ``work.wait()`` blocks the CPU and a hung rank's py-spy stack sits *in* the collective
     (``distributed_c10d.py``), where the doctor looks.  Call :func:`enable` before
     ``init_process_group`` (every scenario here does).
  2. Whenever an argument is a CUDA tensor, the current CUDA stream of its device is
     synchronized before ``exit`` is written (this also covers a group created before
     :func:`enable`; the hung rank's stack then shows ``synchronize`` under this module).

  A call with ``async_op=True`` is not synchronized (the caller waits on the returned work
  later); its ``exit`` record carries ``"async_op": true`` and means "queued".
  Not run on a GPU here: these statements come from torch's source (issue 17, docs/gpu-path.md).

Only Python-level calls are traced: DDP's gradient all-reduce runs inside its C++ reducer
and appears in py-spy stacks as ``backward`` instead.
"""

from __future__ import annotations

import functools
import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import IO, Any

from helpers.jobdir import JOB_DIR_ENV, TRACE_DIR_ENV, JobDir

OPS = ("all_reduce", "broadcast", "all_gather", "all_gather_object", "all_gather_into_tensor", "all_gather_single",
       "reduce_scatter", "reduce_scatter_tensor", "reduce_scatter_single", "reduce", "barrier", "monitored_barrier",
       "all_to_all", "all_to_all_single", "gather", "scatter", "send", "recv", "broadcast_object_list",
       "gather_object", "scatter_object_list", "all_reduce_coalesced")
_SKIP = (os.sep + "torch" + os.sep, os.path.abspath(__file__))
_state: dict[str, Any] = {"file": None, "seq": 0, "originals": {}}


def trace_dir() -> Path:
    """Where traces go: ``$RUNBOOK_TRACE_DIR``, else ``$RUNBOOK_JOB_DIR/trace`` (set by the job runner), else ``./trace``."""
    explicit = os.environ.get(TRACE_DIR_ENV)
    if explicit:
        return Path(explicit)
    return JobDir(os.environ.get(JOB_DIR_ENV, ".")).trace_dir


def _call_site() -> str:
    """``file:line`` of the innermost frame outside torch and this module (the user's line)."""
    frame = sys._getframe(2)
    while frame is not None:
        name = frame.f_code.co_filename
        if not any(s in name for s in _SKIP):
            return f"{os.path.basename(name)}:{frame.f_lineno}"
        frame = frame.f_back
    return "?"


def _describe(args: tuple, kwargs: dict) -> dict:
    """Shape and dtype of the first tensor (or first tensor in a list) among the arguments."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, (list, tuple)) and value:
            value = value[0]
        if hasattr(value, "shape") and hasattr(value, "dtype"):
            return {"shape": list(value.shape), "dtype": str(value.dtype).replace("torch.", "")}
    return {}


def _cuda_device(args: tuple, kwargs: dict) -> Any:
    """The device of the first CUDA tensor among the arguments (also inside lists), else ``None``."""
    for value in (*args, *kwargs.values()):
        for item in (value if isinstance(value, (list, tuple)) else (value,)):
            if getattr(item, "is_cuda", False) is True:
                return item.device
    return None


def _write(fh: IO[str], record: dict) -> None:
    fh.write(json.dumps(record, separators=(",", ":")) + "\n")


def _wrap(op: str, fn: Callable) -> Callable:
    @functools.wraps(fn)
    def traced(*args: Any, **kwargs: Any) -> Any:
        fh = _state["file"]
        _state["seq"] += 1
        seq = _state["seq"]
        _write(fh, {"seq": seq, "op": op, "phase": "enter", "site": _call_site(), "t": time.time(),
                    **_describe(args, kwargs)})
        result = fn(*args, **kwargs)
        if kwargs.get("async_op"):
            _write(fh, {"seq": seq, "op": op, "phase": "exit", "t": time.time(), "async_op": True})
            return result
        device = _cuda_device(args, kwargs)
        if device is not None:  # NCCL only queued the kernel: wait for it, so that "exit" means finished
            import torch

            torch.cuda.current_stream(device).synchronize()
        _write(fh, {"seq": seq, "op": op, "phase": "exit", "t": time.time()})
        return result

    return traced


def enable(directory: str | os.PathLike[str] | None = None, rank: int | None = None) -> Path:
    """Start tracing this process's collectives; return the trace file's path.

    Called before ``init_process_group``, it also sets ``TORCH_NCCL_BLOCKING_WAIT=1`` (unless
    already set) so that NCCL collectives block until done (see the module docstring); gloo
    ignores it.

    Args:
        directory: where ``rank<R>.jsonl`` goes (default :func:`trace_dir`).
        rank: this process's rank (default: ``RANK`` from the launcher's env contract, seed D1).

    Raises:
        ValueError: no ``rank`` given and ``RANK`` unset or not an integer.
    """
    import torch.distributed as dist

    if rank is None:
        raw = os.environ.get("RANK", "")
        if not raw.isdigit():
            raise ValueError(f"rank: not given and RANK={raw!r} is not an integer (launch with torchrun)")
        rank = int(raw)
    if _state["file"] is not None:
        return Path(_state["file"].name)
    if not dist.is_initialized():  # NCCL: make work.wait() block, so that a hung rank waits inside its collective
        os.environ.setdefault("TORCH_NCCL_BLOCKING_WAIT", "1")
    path = Path(directory) if directory else trace_dir()
    path.mkdir(parents=True, exist_ok=True)
    _state["file"] = open(path / f"rank{rank}.jsonl", "a", buffering=1)
    for op in OPS:
        fn = getattr(dist, op, None)
        if fn is not None:
            _state["originals"][op] = fn
            setattr(dist, op, _wrap(op, fn))
    return path / f"rank{rank}.jsonl"


def disable() -> None:
    """Restore the original collectives and close the trace file."""
    import torch.distributed as dist

    for op, fn in _state["originals"].items():
        setattr(dist, op, fn)
    _state["originals"] = {}
    if _state["file"] is not None:
        _state["file"].close()
        _state["file"] = None


MAX_TRACE_BYTES = 1 << 30
"""Largest trace file read (bytes): two short lines per collective, about 200 bytes, so ~5 million collectives."""

_PHASES = ("enter", "exit")


def read(path: str | os.PathLike[str]) -> list[dict]:
    """The records of one trace file, in order, each checked: a torn last line (a killed rank's) is skipped.

    Returns:
        One dict per line: ``phase`` (``enter``/``exit``), ``seq`` (int >= 1), ``op`` (str) and, on ``enter``,
        ``site`` (``file:line``, str); other keys as written.

    Raises:
        ValueError: the file cannot be read (:mod:`helpers.inputs`: not a regular file, over
            :data:`MAX_TRACE_BYTES`, a line over ``inputs.MAX_LINE_CHARS``); a line other than the last is not
            JSON; a record lacks a field or has the wrong type (``<path>:<line>: seq = 'x': ...``).
    """
    from helpers import inputs

    records: list[dict] = []
    torn: int | None = None
    with inputs.open_lines(path, max_bytes=MAX_TRACE_BYTES) as lines:
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            if torn is not None:
                raise ValueError(f"{path}:{torn}: not a JSON record (only the last line may be torn)")
            try:
                rec = json.loads(line)
            except (json.JSONDecodeError, RecursionError, ValueError):
                torn = number
                continue
            records.append(_check_record(rec, f"{path}:{number}"))
    return records


def _check_record(rec: object, where: str) -> dict:
    """``rec`` when it is a trace record of the shape :func:`_wrap` writes, else ``ValueError`` naming the field."""
    if not isinstance(rec, dict):
        raise ValueError(f"{where}: a trace record must be a JSON object, not {type(rec).__name__}")
    if rec.get("phase") not in _PHASES:
        raise ValueError(f"{where}: phase = {str(rec.get('phase'))[:40]!r}: must be one of {', '.join(_PHASES)}")
    seq = rec.get("seq")
    if not isinstance(seq, int) or isinstance(seq, bool) or not 1 <= seq < 2**63:
        raise ValueError(f"{where}: seq = {str(seq)[:40]!r}: must be an integer >= 1")
    if not isinstance(rec.get("op"), str):
        raise ValueError(f"{where}: op = {str(rec.get('op'))[:40]!r}: must be the collective's name (a string)")
    if rec["phase"] == "enter" and not isinstance(rec.get("site", ""), str):
        raise ValueError(f"{where}: site = {str(rec.get('site'))[:40]!r}: must be 'file:line' (a string)")
    return rec
