"""What the FSDP rank scripts of chapter 04 share: the model, byte accounting and a collective trace.

Stdlib-only at import time (torch is imported inside the functions), like ``_common``.

* :func:`make_model`: ``blocks`` residual MLP blocks of width ``hidden`` (each one a natural
  FSDP unit, the role a transformer layer plays in seed D12), plus a registered buffer per
  block so that buffer dtypes can be seen (D14).
* :func:`storage_bytes` / :func:`model_state_bytes`: bytes this rank holds, counted once per
  tensor storage (``untyped_storage().nbytes()``, what the allocator holds).  FSDP2 keeps its
  sharded parameters as ``DTensor`` s whose local shard is ``to_local()``; while a unit is
  unsharded, FSDP2 registers plain (unsharded) tensors on the module instead
  (``torch/distributed/fsdp/_fully_shard/_fsdp_param.py``, ``to_unsharded``), and those are the
  ``compute`` bytes below.
* :func:`live_tensor_bytes`: every tensor storage the garbage collector can see (params,
  gathered units, activations, batch): the CPU stand-in for ``torch.cuda.memory_allocated``.
* :class:`CollectiveTrace`: the collectives a step issued, read from a ``torch.profiler`` trace
  (``record_shapes=True`` gives each ``c10d::`` op's tensor shapes and dtypes), with the bytes
  each rank sends under the ring algorithm (nccl-tests PERFORMANCE.md:
  https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md).
"""

from __future__ import annotations

import gc
import warnings
from typing import Any

DTYPE_BYTES = {"float": 4, "c10::BFloat16": 2, "c10::Half": 2, "double": 8, "long int": 8, "int": 4}
# The profiler's C++ type names -> torch's dtype names.
DTYPE_NAMES = {"float": "float32", "c10::BFloat16": "bfloat16", "c10::Half": "float16", "double": "float64",
               "long int": "int64", "int": "int32"}


def make_model(hidden: int, blocks: int) -> Any:
    """``blocks`` residual MLP blocks ``x + fc2(gelu(fc1(x)))`` (``fc1``: hidden -> 4*hidden), on the CPU.

    Each block also holds a buffer ``scale`` (ones, fp32) that multiplies its output, so that
    the dtype FSDP gives buffers is visible (D14).  Parameters: ``blocks * (8 h^2 + 5 h)``.
    """
    import torch
    from torch import nn

    class Block(nn.Module):
        """One FSDP unit: a residual MLP with a registered buffer."""

        def __init__(self, h: int) -> None:
            super().__init__()
            self.fc1 = nn.Linear(h, 4 * h)
            self.fc2 = nn.Linear(4 * h, h)
            self.register_buffer("scale", torch.ones(h))

        def forward(self, x: Any) -> Any:
            return x + self.fc2(nn.functional.gelu(self.fc1(x))) * self.scale

    return nn.Sequential(*[Block(hidden) for _ in range(blocks)])


def is_dtensor(t: Any) -> bool:
    """True when ``t`` is a ``torch.distributed.tensor.DTensor`` (FSDP2's sharded parameter)."""
    from torch.distributed.tensor import DTensor

    return isinstance(t, DTensor)


def _local(t: Any) -> Any:
    return t.to_local() if is_dtensor(t) else t


def storage_bytes(tensors: Any, seen: set[int] | None = None) -> int:
    """Bytes of the distinct storages behind ``tensors`` (a tensor, or nested lists/dicts of them).

    A DTensor counts its local shard.  ``seen`` (data pointers) is updated, so a storage
    already counted in an earlier call is not counted again.
    """
    import torch

    seen = set() if seen is None else seen
    total = 0
    stack = [tensors]
    while stack:
        obj = stack.pop()
        if obj is None:
            continue
        if isinstance(obj, torch.Tensor):
            storage = _local(obj).untyped_storage()
            if storage.nbytes() and storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
        elif isinstance(obj, dict):
            stack.extend(obj.values())
        elif isinstance(obj, (list, tuple)):
            stack.extend(obj)
    return total


def model_state_bytes(model: Any, optimizer: Any) -> dict[str, int]:
    """This rank's model-state bytes by component, for an FSDP2 model and its optimizer.

    Returns a dict: ``params`` (the sharded parameters the optimizer updates: their local
    shards), ``grads`` (their ``.grad`` shards), ``moments`` (the optimizer's ``state``:
    Adam ``exp_avg``/``exp_avg_sq``/``step``), ``compute`` (unsharded parameters registered on
    modules at this moment: a unit FSDP2 has gathered and not yet resharded), ``total``
    (params + grads + moments, the estimator's model states).
    """
    seen: set[int] = set()
    sharded = [p for group in optimizer.param_groups for p in group["params"]]
    out = {"params": storage_bytes(sharded, seen),
           "grads": storage_bytes([p.grad for p in sharded], seen),
           "moments": storage_bytes(list(optimizer.state.values()), seen)}
    out["compute"] = storage_bytes([p for p in model.parameters() if not is_dtensor(p)], seen)
    out["total"] = out["params"] + out["grads"] + out["moments"]
    return out


def live_tensor_bytes(collect: bool = True) -> int:
    """Bytes of every distinct tensor storage the garbage collector can see now.

    Includes parameters, gathered units, activations and the batch: on CPU this stands in for
    ``torch.cuda.memory_allocated``.  ``collect=True`` runs a garbage collection first (needed
    once, before a measurement; inside forward hooks the tensors that matter are referenced, and
    skipping it makes a call ~5x cheaper).
    """
    import torch

    if collect:
        gc.collect()
    seen: set[int] = set()
    total = 0
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for obj in gc.get_objects():
            try:
                if not isinstance(obj, torch.Tensor) or is_dtensor(obj) or obj.device.type == "meta":
                    continue
                storage = obj.untyped_storage()
            except Exception:  # noqa: BLE001 - objects being torn down, wrapper subclasses
                continue
            if storage.nbytes() and storage.data_ptr() not in seen:
                seen.add(storage.data_ptr())
                total += storage.nbytes()
    return total


class CollectiveTrace:
    """Record the collectives issued inside a ``with`` block, with their sizes, from ``torch.profiler``.

    After the block, :attr:`ops` lists one dict per ``c10d::`` op: ``op`` (e.g.
    ``_allgather_base_``, ``_reduce_scatter_base_``, ``allreduce_``), ``size_bytes`` (the
    nccl-tests "size": the gathered output of an all-gather, the input of a reduce-scatter,
    the buffer of an all-reduce/broadcast), ``dtype`` and ``sent_bytes`` (what each rank sends
    under the ring algorithm: (n-1)/n x size for all-gather and reduce-scatter, 2(n-1)/n x size
    for all-reduce, per nccl-tests PERFORMANCE.md), where n is the world size of the default
    group, except that all-gathers and reduce-scatters take it from the gathered/input size
    ratio and all-reduces from their group (HSDP all-reduces across replicas only).  All-reduces
    are tensor-list ops whose shapes the profiler does not record, so ``torch.distributed.all_reduce``
    is wrapped while the block runs to read their size and group (FSDP2 calls it through the
    ``torch.distributed`` module); ``allreduce_group_size`` is the fallback.
    """

    def __init__(self, world_size: int, allreduce_group_size: int | None = None) -> None:
        self.world_size = world_size
        self.allreduce_group_size = allreduce_group_size or world_size
        self.ops: list[dict[str, Any]] = []
        self._prof: Any = None

    def __enter__(self) -> CollectiveTrace:
        import torch.distributed as dist
        from torch.profiler import ProfilerActivity, profile

        original = dist.all_reduce

        def all_reduce(tensor: Any, *args: Any, **kwargs: Any) -> Any:
            group = kwargs.get("group", args[1] if len(args) > 1 else None)
            self._all_reduces.append((tensor.numel() * tensor.element_size(), dist.get_world_size(group),
                                      str(tensor.dtype).replace("torch.", "")))
            return original(tensor, *args, **kwargs)

        self._all_reduces: list[tuple[int, int, str]] = []
        self._original = original
        dist.all_reduce = all_reduce
        self._prof = profile(activities=[ProfilerActivity.CPU], record_shapes=True)
        self._prof.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        import torch.distributed as dist

        self._prof.__exit__(*exc)
        dist.all_reduce = self._original
        python_level = list(self._all_reduces)
        for event in self._prof.events():
            if event.name.startswith("c10d::"):
                rec = self._describe(event.name[len("c10d::"):], event.input_shapes, event.input_dtypes)
                if rec["size_bytes"] is None and rec["op"].startswith("allreduce") and python_level:
                    # The profiler records no shapes for tensor-list ops: take the size from the
                    # Python-level dist.all_reduce call that issued it (same order).
                    size, n, dtype = python_level.pop(0)
                    rec.update(size_bytes=size, group_size=n, dtype=dtype, sent_bytes=int(size * 2 * (n - 1) / n))
                self.ops.append(rec)

    def _describe(self, op: str, shapes: list, dtypes: list) -> dict[str, Any]:
        def numel(shape: Any) -> int:
            n = 1
            for d in shape:
                n *= int(d)
            return n

        tensors = [s for s in shapes if isinstance(s, list) and s and all(isinstance(d, int) for d in s)]
        dtype = next((t for t in dtypes if t in DTYPE_BYTES), "?")
        if not tensors or dtype == "?":
            # Tensor-list ops (FSDP1's ``allgather_`` on gloo) carry no shapes in the profiler.
            return {"op": op, "dtype": dtype, "size_bytes": None, "group_size": None, "sent_bytes": None}
        itemsize = DTYPE_BYTES[dtype]
        n = self.world_size
        if op.startswith(("_allgather_base", "_reduce_scatter_base")) and len(tensors) >= 2:
            big, small = max(numel(tensors[0]), numel(tensors[1])), min(numel(tensors[0]), numel(tensors[1]))
            n = big // small if small else n
            size, factor = big * itemsize, (n - 1) / n
        elif op.startswith("allreduce"):
            n = self.allreduce_group_size
            size, factor = numel(tensors[0]) * itemsize, 2 * (n - 1) / n
        else:
            size, factor = numel(tensors[0]) * itemsize, 1.0
        return {"op": op, "dtype": DTYPE_NAMES[dtype], "size_bytes": size, "group_size": n,
                "sent_bytes": int(size * factor)}

    def summary(self) -> dict[str, dict[str, int]]:
        """Per op: ``count``, total ``size_bytes`` and ``sent_bytes`` (None when the trace had no shapes), ``dtypes`` seen."""
        out: dict[str, dict[str, Any]] = {}
        for rec in self.ops:
            entry = out.setdefault(rec["op"], {"count": 0, "size_bytes": 0, "sent_bytes": 0, "dtypes": []})
            entry["count"] += 1
            for key in ("size_bytes", "sent_bytes"):
                entry[key] = None if rec[key] is None or entry[key] is None else entry[key] + rec[key]
            if rec["dtype"] not in entry["dtypes"]:
                entry["dtypes"].append(rec["dtype"])
        return out
