"""Read and align PyTorch Flight Recorder dumps: which rank is behind, or entered a different collective.

The Flight Recorder (``TORCH_FR_BUFFER_SIZE=2000``, alias ``TORCH_NCCL_TRACE_BUFFER_SIZE``) keeps, in every
rank, a ring buffer of the collectives it entered: per process group a ``collective_seq_id`` (1, 2, ... in
call order), the op (``profiling_name`` such as ``gloo:all_reduce``, ``nccl:all_reduce``), sizes and state.
Torch writes it as a pickle (``torch._C._distributed_c10d._dump_fr_trace()``; NCCL on a timeout with
``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` to ``$TORCH_FR_DUMP_TEMP_FILE<rank>``) or JSON (``_dump_fr_trace_json()``).
Measured here (torch 2.13, gloo): entries carry ``state='scheduled'`` and ``frames=None`` on gloo; gloo
writes no dump on a timeout (the runner asks each rank for one, :mod:`helpers._fr_site.sitecustomize`);
the first dump *with* stack traces takes ~5 s (symbolizer), without them < 1 ms.

:func:`load_dump` reads one file (pickle or JSON, any backend) and :func:`load_dir` a folder of
``<prefix><rank>`` files; :func:`align` lines the ranks up per process group by ``collective_seq_id``
and returns one :class:`GroupAlignment` per group: the first sequence number where the ranks' ops differ
(this can be long before the hang), the ranks that are behind, ranks without a dump, and ranks whose
buffer wrapped before the point compared.  The verdict itself is the doctor's (:mod:`helpers.doctor`).
"""

from __future__ import annotations

import io
import json
import os
import pickle
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

_RANK_SUFFIX = re.compile(r"(\d+)(?:\.(?:pkl|pickle|json))?$")
_SKIP = re.compile(r"\.tmp\d*$|\.tmp\d+|^\.")


class DumpError(ValueError):
    """A file that is not a Flight Recorder dump (truncated, foreign pickle, another job's); names the file."""


class _Restricted(pickle.Unpickler):
    """Unpickler that builds only plain containers: a Flight Recorder dump holds dicts, lists, str, numbers."""

    def find_class(self, module: str, name: str) -> object:  # noqa: D401 - pickle API
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a Flight Recorder dump")


def load_dump(path: str | os.PathLike[str]) -> dict:
    """Read one Flight Recorder dump, pickle or JSON.

    Args:
        path: the file (torch's pickle, e.g. ``nccl_trace_rank_0``, or ``_dump_fr_trace_json()`` output).

    Returns:
        The dump: a dict with at least ``version`` and ``entries`` (a list of dicts).

    Raises:
        DumpError: the file cannot be read, is truncated, is a pickle of something else, or lacks
            ``entries``/``version`` (the message names the file).
    """
    p = Path(path)
    try:
        raw = p.read_bytes()
    except OSError as exc:
        raise DumpError(f"{p}: cannot read: {exc.strerror or exc}") from None
    if not raw:
        raise DumpError(f"{p}: empty file, not a Flight Recorder dump")
    try:
        if raw.lstrip()[:1] == b"{":
            data = json.loads(raw)
        else:
            data = _Restricted(io.BytesIO(raw)).load()
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError, KeyError) as exc:
        raise DumpError(f"{p}: not a Flight Recorder dump (truncated or foreign file: {exc})") from None
    if not isinstance(data, dict) or "entries" not in data or "version" not in data or not isinstance(data["entries"], list):
        raise DumpError(f"{p}: not a Flight Recorder dump (no 'version'/'entries'; keys: {sorted(data)[:6] if isinstance(data, dict) else type(data).__name__})")
    return data


def rank_of(path: str | os.PathLike[str]) -> int | None:
    """The rank a dump file is named for: the trailing digits (``rank3``, ``nccl_trace_rank_3``, ``rank_3.json``)."""
    m = _RANK_SUFFIX.search(Path(path).name)
    return int(m[1]) if m else None


def load_dir(directory: str | os.PathLike[str], *, world_size: int | None = None) -> dict[int, dict]:
    """Every dump in ``directory`` by rank (files named ``<prefix><rank>``; temporary files skipped).

    Args:
        directory: the folder (``<job>/fr/``, or the folder of ``TORCH_FR_DUMP_TEMP_FILE``).
        world_size: when known, a file for a rank >= it is an error.

    Returns:
        ``{rank: dump}``.

    Raises:
        DumpError: the folder is missing or holds no dump; a file is unreadable (named); two files claim
            one rank; the dumps disagree on the default group's members or on which groups exist (dumps of
            different jobs mixed, naming the file that disagrees).
    """
    d = Path(directory)
    if not d.is_dir():
        raise DumpError(f"{d}: no such folder")
    files = sorted(p for p in d.iterdir() if p.is_file() and not _SKIP.search(p.name))
    dumps: dict[int, dict] = {}
    names: dict[int, Path] = {}
    for p in files:
        rank = rank_of(p)
        if rank is None:
            continue
        if rank in names:
            raise DumpError(f"{p}: a second dump for rank {rank} (also {names[rank].name}): dumps of different jobs mixed?")
        if world_size is not None and rank >= world_size:
            raise DumpError(f"{p}: rank {rank} but the job has {world_size} ranks")
        dumps[rank], names[rank] = load_dump(p), p
    if not dumps:
        raise DumpError(f"{d}: no Flight Recorder dump in it (files named <prefix><rank>, e.g. rank0 or nccl_trace_rank_0)")
    ref_rank = min(dumps)
    ref = _job_key(dumps[ref_rank])
    for rank, dump in dumps.items():
        key = _job_key(dump)
        if ref and key and key != ref:
            raise DumpError(f"{names[rank]}: its process groups {key} differ from {names[ref_rank].name}'s {ref}: "
                            "dumps of different jobs mixed")
    starts = {r: t for r, d in dumps.items() if (t := _first_time_s(d)) is not None}
    if starts:
        early = min(starts, key=starts.__getitem__)
        for rank, t in starts.items():
            if t - starts[early] > MIXED_JOBS_S:
                raise DumpError(f"{names[rank]}: its first collective came {t - starts[early]:.0f} s after "
                                f"{names[early].name}'s: dumps of different jobs mixed")
    return dumps


MIXED_JOBS_S = 600.0
"""Seconds between two ranks' first collective (``time_created_ns`` of sequence 1 on the default group) above
which :func:`load_dir` calls the dumps mixed: ranks of one job enter their first collective together."""


def _first_time_s(dump: Mapping) -> float | None:
    for e in dump.get("entries", []):
        if isinstance(e, Mapping) and e.get("collective_seq_id") == 1 and str((e.get("process_group") or ["?"])[0]) == "0" \
                and isinstance(e.get("time_created_ns"), int):
            return e["time_created_ns"] / 1e9
    return None


def _job_key(dump: Mapping) -> tuple:
    """What all ranks of one job share: each group's name, description and member ranks (from ``pg_config``)."""
    cfg = dump.get("pg_config") or {}
    return tuple(sorted((str(k), str(v.get("desc", "")), str(v.get("ranks", ""))) for k, v in cfg.items()
                        if isinstance(v, Mapping)))


@dataclass
class Entry:
    """One collective as a rank recorded it: sequence number, op, sizes, state and (NCCL) frames."""

    seq: int
    op: str
    sizes: str
    state: str
    frames: list[str] = field(default_factory=list)

    @property
    def sig(self) -> tuple[str, str]:
        """What must match across ranks at one sequence number: op and input sizes."""
        return (self.op, self.sizes)


def entries_by_group(dump: Mapping) -> dict[str, list[Entry]]:
    """A dump's collectives per process group (key: the group's name, ``'0'`` = the default group), in seq order.

    Point-to-point entries (``is_p2p``, ``collective_seq_id`` 0) are left out: they have no cross-rank order.
    """
    out: dict[str, list[Entry]] = {}
    for e in dump.get("entries", []):
        if not isinstance(e, Mapping) or e.get("is_p2p") or not e.get("collective_seq_id"):
            continue
        pg = e.get("process_group") or [str(e.get("pg_id", "?")), ""]
        name = str(pg[0])
        frames = [f"{f.get('name')} ({os.path.basename(str(f.get('filename')))}:{f.get('line')})"
                  for f in (e.get("frames") or []) if isinstance(f, Mapping)]
        out.setdefault(name, []).append(Entry(int(e["collective_seq_id"]), str(e.get("profiling_name", "?")),
                                              str(e.get("input_sizes", "")), str(e.get("state", "")), frames))
    for lst in out.values():
        lst.sort(key=lambda x: x.seq)
    return out


@dataclass
class GroupAlignment:
    """The ranks of one process group lined up by ``collective_seq_id``.

    Attributes:
        group: the group's name (``'0'`` = default); desc: its description (``default_pg``, ...).
        members: ranks of the group (from ``pg_config``, else those with entries); missing: members without a dump.
        last: rank -> highest sequence number it entered; first: rank -> lowest still in its buffer.
        diverge_seq: the first sequence number where the ranks that recorded it entered different ops (or
            sizes); ``None`` if they never differ.  ops_at: rank -> op there.
        wrapped: ranks whose buffer no longer holds sequence numbers the others compared (first > 1).
        behind: ranks whose ``last`` is below the group's highest.
        history: op -> how many sequence numbers before ``diverge_seq`` (on the reference rank) used it.
        expected: the op the repeating pattern of the common history predicts at ``diverge_seq``
            (:func:`expected_next`), or ``None``.
    """

    group: str
    desc: str
    members: list[int]
    missing: list[int]
    last: dict[int, int]
    first: dict[int, int]
    diverge_seq: int | None
    ops_at: dict[int, str]
    wrapped: list[int]
    behind: list[int]
    history: dict[str, int]
    expected: str | None = None

    @property
    def stalled_seq(self) -> int | None:
        """The sequence number the group stalls at: the divergence, else the lowest ``last`` among the ranks."""
        if self.diverge_seq is not None:
            return self.diverge_seq
        return min(self.last.values()) if self.last else None

    def describe(self) -> str:
        """One line for people."""
        name = f"group {self.group}" + (f" ({self.desc})" if self.desc else "")
        parts = [f"{name}: last collective entered per rank " + ", ".join(f"{r}:#{s}" for r, s in sorted(self.last.items()))]
        if self.diverge_seq is not None:
            parts.append(f"ops differ at #{self.diverge_seq}: " + ", ".join(f"rank {r} {op}" for r, op in sorted(self.ops_at.items())))
        if self.behind:
            parts.append(f"behind: {self.behind}")
        if self.missing:
            parts.append(f"no dump: {self.missing}")
        if self.wrapped:
            parts.append(f"buffer wrapped: {self.wrapped}")
        return "; ".join(parts)


def align(dumps: Mapping[int, Mapping]) -> list[GroupAlignment]:
    """Line the ranks up per process group by ``collective_seq_id`` (see :class:`GroupAlignment`).

    Args:
        dumps: rank -> dump (:func:`load_dump`).

    Returns:
        One alignment per process group that has entries, the default group first.

    Raises:
        ValueError: ``dumps`` is empty.
    """
    if not dumps:
        raise ValueError("dumps: need at least one rank's Flight Recorder dump")
    per_rank = {r: entries_by_group(d) for r, d in dumps.items()}
    groups = sorted({g for e in per_rank.values() for g in e}, key=lambda g: (not g.isdigit(), int(g) if g.isdigit() else 0, g))
    out = []
    for g in groups:
        members, desc = _members(dumps, g)
        have = {r: per_rank[r][g] for r in per_rank if per_rank[r].get(g)}
        members = members or sorted(have)
        missing = [r for r in members if r not in dumps]
        last = {r: lst[-1].seq for r, lst in have.items()}
        first = {r: lst[0].seq for r, lst in have.items()}
        by_seq = {r: {e.seq: e for e in lst} for r, lst in have.items()}
        lo, hi = max(first.values()), max(last.values())
        diverge, ops_at = None, {}
        for s in range(lo, hi + 1):
            at = {r: by_seq[r][s] for r in have if s in by_seq[r]}
            if len({e.sig for e in at.values()}) > 1:
                same_op = len({e.op for e in at.values()}) == 1  # then the sizes differ: name them
                diverge, ops_at = s, {r: (f"{e.op} sizes={e.sizes}" if same_op else e.op) for r, e in at.items()}
                break
        wrapped = [r for r, f in first.items() if f > 1 and f > min(first.values())]
        top = max(last.values())
        behind = sorted(r for r, s in last.items() if s < top)
        ref = min(have)
        history = Counter(e.op for e in have[ref] if diverge is None or e.seq < diverge)
        expected = None
        if diverge is not None:
            prefix = [by_seq[ref][s].sig for s in range(lo, diverge) if s in by_seq[ref]]
            expected = expected_next(prefix)
        out.append(GroupAlignment(g, desc, members, missing, last, first, diverge, ops_at, wrapped, behind, dict(history),
                                  expected))
    return out


def expected_next(sigs: list[tuple[str, str]]) -> str | None:
    """The op that continues the repeating tail of ``sigs`` ((op, sizes) in sequence order), else ``None``.

    A training step's collectives repeat (DDP: buffers broadcast, gradients all-reduced), but start-up does
    not, so only the tail is matched: the shortest period ``p`` whose last ``max(1, p - 1)`` entries repeat the
    ones ``p`` earlier predicts ``sigs[-p]``'s op.  A heuristic, used only to break two-rank ties
    (:func:`helpers.doctor.break_tie`, evidence ``pattern``).
    """
    n = len(sigs)
    for p in range(1, n // 2 + 1):
        run = 0
        while run < n - p and sigs[n - 1 - run] == sigs[n - 1 - run - p]:
            run += 1
        if run >= max(1, p - 1):
            return sigs[n - p][0]
    return None


def _members(dumps: Mapping[int, Mapping], group: str) -> tuple[list[int], str]:
    """Member ranks and description of ``group`` from any dump's ``pg_config`` (``ranks`` is a string like ``[0, 1]``)."""
    for d in dumps.values():
        cfg = (d.get("pg_config") or {}).get(group)
        if isinstance(cfg, Mapping):
            ranks = [int(x) for x in re.findall(r"-?\d+", str(cfg.get("ranks", "")))]
            return ranks, str(cfg.get("desc", ""))
    return [], ""


def summary(dumps: Mapping[int, Mapping], last: int = 4) -> str:
    """The last ``last`` collectives of each rank per process group, one line per rank: ``rank 1 group 0: #1 gloo:all_reduce ...``."""
    lines = []
    for rank in sorted(dumps):
        for group, entries in entries_by_group(dumps[rank]).items():
            tail = " | ".join(f"#{e.seq} {e.op}" for e in entries[-last:])
            lines.append(f"rank {rank} group {group}: {tail}")
    return "\n".join(lines)


def torch_analyzer(directory: str | os.PathLike[str], timeout_s: float = 120.0) -> tuple[int, str]:
    """Run torch's own analyzer (``python -m torch.distributed.flight_recorder.fr_trace``) on the dumps of ``directory``.

    The dumps are copied to a scratch folder as ``rank_<R>`` (the analyzer reads every file with the prefix).

    Returns:
        ``(exit status, the last 15 lines of its output)``; measured with torch 2.13 on gloo dumps: status 1,
        ``KeyError: ('0', 0)`` in ``build_collectives`` (gloo registers no ``pg_config``).
    """
    import shutil
    import subprocess
    import sys
    import tempfile

    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        for p in Path(directory).iterdir():
            rank = rank_of(p)
            if p.is_file() and rank is not None and not _SKIP.search(p.name) and not p.name.endswith(".ready"):
                shutil.copy(p, Path(tmp) / f"rank_{rank}")
        out = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", tmp, "-p", "rank_"],
                             capture_output=True, text=True, timeout=timeout_s)
    return out.returncode, "\n".join((out.stdout + out.stderr).strip().splitlines()[-15:])
