"""Rank-side checkpoint code: atomic save/load, RNG state, the pieces of a complete checkpoint, exact comparison.

What a training script (``helpers/scenarios/elastic_train.py``) imports to checkpoint and resume;
torch and the standard library only (NumPy for its RNG state), no job runner, so a rank pays for
nothing it does not use.  The driver side (running the jobs, comparing their results) is
:mod:`helpers.resume`.

* **Atomic checkpoints** (:func:`save_checkpoint`, :func:`load_checkpoint`): the state is
  written to a temporary file in the destination's directory, flushed and ``fsync``-ed, then
  renamed over the destination with ``os.replace`` (atomic on POSIX within one file system),
  and the directory is ``fsync``-ed so the rename itself is durable.  A crash at any point
  leaves either the previous checkpoint or the new one, never a torn file.
  :func:`naive_save` (``torch.save`` straight onto the destination) is the counter-example.
* **Complete state** (:data:`PIECES`): model, optimizer (Adam's moments), LR scheduler, every
  RNG each rank draws from (:func:`rng_state`: torch, Python ``random``, NumPy; per rank), and
  the data position (sampler epoch and batches consumed in that epoch); :func:`parse_omit`
  names the pieces a resume leaves out.
* **Exact comparison** (:func:`compare_state_dicts`): no tolerance, bit for bit.

Nothing runs at import; torch is imported inside the functions that need it.
Sources: seed MN5 and https://docs.pytorch.org/tutorials/beginner/ddp_series_fault_tolerance.html;
``os.replace`` / ``fsync`` semantics: https://docs.python.org/3/library/os.html#os.replace,
https://man7.org/linux/man-pages/man2/fsync.2.html.
"""

from __future__ import annotations

import math
import os
import tempfile
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PIECES = ("model", "optimizer", "scheduler", "rng", "epoch", "position")
"""What a complete checkpoint of ``elastic_train.py`` holds; each can be left out with ``omit``."""


# --------------------------------------------------------------------------- atomic save / load

def _serialize(state: Mapping[str, Any], fh: Any) -> None:
    """Write ``state`` to the open binary file ``fh`` (``torch.save``); a seam that tests replace."""
    import torch

    torch.save(dict(state), fh)


def _fsync_dir(directory: Path) -> None:
    """``fsync`` a directory so that a rename inside it survives a power loss (Linux)."""
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def save_checkpoint(path: str | os.PathLike[str], state: Mapping[str, Any], *, clean_stale: bool = True) -> Path:
    """Write ``state`` to ``path`` atomically: a reader sees the old file or the new one, never a torn one.

    Protocol: serialize into a temporary file in the *same directory* (``os.replace`` is atomic
    only within one file system), ``flush`` + ``os.fsync`` it, ``os.replace`` it onto ``path``,
    then ``fsync`` the directory (the rename is a directory update).  If anything fails before
    the rename, the temporary file is removed and ``path`` is untouched.  A process killed
    outright (SIGKILL, ``os._exit``) cannot clean up: it may leave a ``.<name>.tmp-*`` file
    next to ``path``, which :func:`load_checkpoint` never reads and the next save removes.

    Args:
        path: destination file; its directory is created if missing.
        state: a mapping of picklable values (tensors, ``state_dict()`` results, ints, lists).
        clean_stale: first remove ``.<name>.tmp-*`` files a killed writer left (safe with one
            writer per path, e.g. rank 0 only: two writers of one path are a bug anyway).

    Returns:
        The destination path.

    Raises:
        ValueError: ``state`` is not a mapping.
        OSError: the file system refused the write (the previous checkpoint is intact).

    Source: seed MN5 ("tmp → fsync → os.rename"); https://docs.python.org/3/library/os.html#os.replace
    """
    if not isinstance(state, Mapping):
        raise ValueError(f"state={type(state).__name__}: must be a mapping (dict) of checkpoint pieces")
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if clean_stale:
        for stale in dest.parent.glob(f".{dest.name}.tmp-*"):
            stale.unlink(missing_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{dest.name}.tmp-", dir=dest.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            _serialize(state, fh)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, dest)
    except BaseException:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        raise
    _fsync_dir(dest.parent)
    return dest


def naive_save(path: str | os.PathLike[str], state: Mapping[str, Any]) -> Path:
    """Counter-example: serialize straight onto ``path`` (what ``torch.save(state, path)`` does).

    A crash during the write leaves a truncated file in place of the previous checkpoint.
    Kept only so that :func:`helpers.resume.crash_mid_write` can show the difference; use :func:`save_checkpoint`.

    Returns:
        The destination path.
    """
    dest = Path(path)
    dest.parent.mkdir(parents=True, exist_ok=True)
    with open(dest, "wb") as fh:
        _serialize(state, fh)
    return dest


def load_checkpoint(path: str | os.PathLike[str], *, missing_ok: bool = False) -> dict[str, Any] | None:
    """Read a checkpoint written by :func:`save_checkpoint` (tensors on CPU, ``weights_only=True``).

    ``weights_only=True`` (torch's default since 2.6) unpickles only tensors and plain Python
    containers and numbers, so the checkpoint must hold no custom objects (the RNG states are
    stored as lists, see :func:`rng_state`).

    Args:
        path: the checkpoint file.
        missing_ok: return ``None`` instead of raising when ``path`` does not exist (a first launch).

    Returns:
        The state dict, or ``None`` (``missing_ok`` and no file).

    Raises:
        FileNotFoundError: no file and not ``missing_ok``.
        RuntimeError: the file is not a readable torch checkpoint (e.g. torn by a crash mid-write:
            ``PytorchStreamReader failed reading zip archive``).
    """
    import torch

    p = Path(path)
    if not p.exists():
        if missing_ok:
            return None
        raise FileNotFoundError(f"checkpoint {p} does not exist")
    return torch.load(p, map_location="cpu", weights_only=True)


# --------------------------------------------------------------------------- RNG state

def rng_state() -> dict[str, Any]:
    """This process's RNG states (torch CPU, Python ``random``, NumPy global), in ``weights_only``-safe form.

    Returns:
        ``{"torch": ByteTensor, "python": [version, [ints], gauss], "numpy": [name, [ints], pos, has_gauss, cached]}``
        (``"cuda"`` too, one ByteTensor per visible GPU, when CUDA is initialised).
    """
    import random

    import numpy as np
    import torch

    version, internal, gauss = random.getstate()
    name, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {"torch": torch.get_rng_state(), "python": [version, list(internal), gauss],
                             "numpy": [name, keys.tolist(), int(pos), int(has_gauss), float(cached)]}
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore the RNG states captured by :func:`rng_state`.

    Raises:
        ValueError: ``state`` lacks one of ``torch``, ``python``, ``numpy`` (names the missing keys).
    """
    import random

    import numpy as np
    import torch

    missing = [k for k in ("torch", "python", "numpy") if k not in state]
    if missing:
        raise ValueError(f"rng state: missing {missing}; accepted keys are torch, python, numpy (cuda optional)")
    torch.set_rng_state(state["torch"])
    version, internal, gauss = state["python"]
    random.setstate((int(version), tuple(int(x) for x in internal), gauss))
    name, keys, pos, has_gauss, cached = state["numpy"]
    np.random.set_state((str(name), np.array(keys, dtype=np.uint32), int(pos), int(has_gauss), float(cached)))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


def parse_omit(text: str | Iterable[str] | None) -> tuple[str, ...]:
    """Parse the pieces to leave out of a resume (comma-separated text or an iterable).

    Returns:
        The pieces, in :data:`PIECES` order, without duplicates (empty for ``None``/"").

    Raises:
        ValueError: an unknown piece (names the field ``omit`` and the accepted values).
    """
    if text is None:
        return ()
    items = [p.strip() for p in (text.split(",") if isinstance(text, str) else text)]
    items = [p for p in items if p]
    bad = [p for p in items if p not in PIECES]
    if bad:
        raise ValueError(f"omit={bad}: accepted values are {', '.join(PIECES)}")
    return tuple(p for p in PIECES if p in items)


# --------------------------------------------------------------------------- exact comparison

@dataclass
class Diff:
    """The exact comparison of two state dicts (see :func:`compare_state_dicts`).

    Attributes:
        equal: same names on both sides, and every entry identical (tensors: same shape, dtype and bits).
        compared: number of entries (tensors and other leaves) present on both sides.
        differing: names of the entries that differ (in the first dict's order).
        first: the first differing tensor's name ("" when equal).
        first_max_abs_diff: largest ``|a - b|`` in that tensor (0.0 when equal; ``inf`` for a
            shape/dtype mismatch or a missing tensor).
        max_abs_diff: largest ``|a - b|`` over all compared tensors.
        only_in_a, only_in_b: names present in one dict only.
    """

    equal: bool
    compared: int
    differing: list[str]
    first: str
    first_max_abs_diff: float
    max_abs_diff: float
    only_in_a: list[str] = field(default_factory=list)
    only_in_b: list[str] = field(default_factory=list)

    def __str__(self) -> str:
        if self.equal:
            return f"EQUAL: {self.compared} entries identical bit for bit (max abs diff {self.max_abs_diff})"
        return (f"DIFFERENT: {len(self.differing)} of {self.compared} entries differ; first: {self.first} "
                f"(max abs diff {self.first_max_abs_diff:.3g}); max abs diff overall {self.max_abs_diff:.3g}"
                + (f"; only in a: {self.only_in_a}" if self.only_in_a else "")
                + (f"; only in b: {self.only_in_b}" if self.only_in_b else ""))


def compare_state_dicts(a: Mapping[str, Any], b: Mapping[str, Any]) -> Diff:
    """Compare two ``{name: tensor}`` mappings exactly: no tolerance, every element must be equal.

    Tensors must have the same shape and dtype and the same *bits* (floating-point tensors are
    compared through an integer view: ``-0.0`` differs from ``0.0``, a NaN equals a NaN with the
    same bits).  Nested mappings and lists (an optimizer state, per-rank
    RNG states) are flattened to dotted names first (``state.0.exp_avg``); other leaves (ints,
    floats, strings) are compared with ``==``.

    Args:
        a, b: state dicts (e.g. ``model.state_dict()`` of two runs).

    Returns:
        A :class:`Diff` naming the first differing tensor (in ``a``'s order) and the largest
        absolute difference.

    Raises:
        ValueError: ``a`` or ``b`` is not a mapping.
    """
    import torch

    for label, d in (("a", a), ("b", b)):
        if not isinstance(d, Mapping):
            raise ValueError(f"{label}={type(d).__name__}: must be a mapping of name -> tensor")
    fa, fb = _flatten(a), _flatten(b)
    only_a = [k for k in fa if k not in fb]
    only_b = [k for k in fb if k not in fa]
    differing: list[str] = []
    worst: dict[str, float] = {}
    for name in (k for k in fa if k in fb):
        x, y = fa[name], fb[name]
        tensors = isinstance(x, torch.Tensor) + isinstance(y, torch.Tensor)
        if tensors == 2 and (x.shape != y.shape or x.dtype != y.dtype):
            same, gap = False, math.inf
        elif tensors == 2:
            same = _same_bits(x, y)
            gap = 0.0 if same else _max_abs_diff(x, y)
        elif tensors == 1:
            same, gap = False, math.inf
        else:
            same = bool(x == y)
            gap = 0.0 if same else _scalar_gap(x, y)
        worst[name] = gap
        if not same:
            differing.append(name)
    missing = only_a + only_b
    first = differing[0] if differing else (missing[0] if missing else "")
    return Diff(equal=not differing and not missing, compared=len(worst), differing=differing, first=first,
                first_max_abs_diff=worst.get(first, math.inf if first else 0.0),
                max_abs_diff=math.inf if missing else max(worst.values(), default=0.0),
                only_in_a=only_a, only_in_b=only_b)


_INT_VIEW = {2: "int16", 4: "int32", 8: "int64"}


def _same_bits(x: Any, y: Any) -> bool:
    """True when two tensors of one shape and dtype hold the same bits (floats through an integer view)."""
    import torch

    if x.is_complex():
        x, y = torch.view_as_real(x), torch.view_as_real(y)
    if x.is_floating_point() and x.element_size() in _INT_VIEW:
        kind = getattr(torch, _INT_VIEW[x.element_size()])
        return torch.equal(x.detach().cpu().contiguous().view(kind), y.detach().cpu().contiguous().view(kind))
    return torch.equal(x.detach().cpu(), y.detach().cpu())


def _max_abs_diff(x: Any, y: Any) -> float:
    """Largest ``|x - y|`` (float64), ``inf`` where exactly one side is NaN."""
    import torch

    x, y = x.detach().cpu(), y.detach().cpu()
    if x.dtype == torch.bool:
        x, y = x.to(torch.uint8), y.to(torch.uint8)
    delta = (x.to(torch.float64) - y.to(torch.float64)).abs() if not x.is_complex() else (x - y).abs().double()
    if x.is_floating_point():
        nx, ny = torch.isnan(x), torch.isnan(y)
        delta = delta.masked_fill(nx & ny, 0.0).masked_fill(nx ^ ny, float("inf"))
    return float(delta.max()) if delta.numel() else 0.0


def _scalar_gap(x: Any, y: Any) -> float:
    try:
        return abs(float(x) - float(y))
    except (TypeError, ValueError):
        return math.inf


def _flatten(d: Mapping[Any, Any] | Sequence[Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    items = d.items() if isinstance(d, Mapping) else enumerate(d)
    for key, value in items:
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) or (isinstance(value, (list, tuple)) and value):
            out.update(_flatten(value, name + "."))
        else:
            out[name] = value
    return out
