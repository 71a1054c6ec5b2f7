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
import os
import pickle
import re
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from helpers import inputs

_RANK_SUFFIX = re.compile(r"(\d+)(?:\.(?:pkl|pickle|json))?$")
_SKIP = re.compile(r"\.tmp\d*$|\.tmp\d+|^\.")


class DumpError(ValueError):
    """A file that is not a Flight Recorder dump (truncated, foreign pickle, another job's); names the file."""


MAX_DUMP_BYTES = 64 * 2**20
"""Largest dump file read (bytes).  torch's default buffer (2,000 entries) pickles to about 1 MB with 20 frames
per entry; a dump is unpickled in pure Python (see :class:`_Restricted`), about 0.5 s per MB here."""

MAX_ENTRIES = 1_000_000
"""Most entries one dump may hold (torch keeps ``TORCH_FR_BUFFER_SIZE`` of them, 2,000 by default)."""

MAX_FRAMES = 2_000_000
"""Most stack frames (``frames`` records) one dump may hold, over all its entries."""

MAX_SEQ = 2**63
"""Sequence numbers and timestamps are C++ ``int64``/``uint64`` in torch; anything at or above this bound is not one."""

MAX_RANK = 2**31
"""Ranks are C ``int``; a ``pg_config`` rank at or above this bound is not one."""


class _Restricted(pickle._Unpickler):  # type: ignore[name-defined]
    """Unpickler that builds only plain containers: a Flight Recorder dump holds dicts, lists, str, numbers.

    The pure-Python unpickler (``pickle._Unpickler``), not the C one: the C unpickler sizes its memo from the
    index a ``LONG_BINPUT`` opcode names, so a 10-byte pickle can make it allocate 2^31 slots (a MemoryError, or
    gigabytes).  The Python one keeps its memo in a dict and allocates only for data present in the stream.
    """

    def find_class(self, module: str, name: str) -> object:  # noqa: D401 - pickle API
        raise pickle.UnpicklingError(f"global {module}.{name} is not allowed in a Flight Recorder dump")

    def persistent_load(self, pid: object) -> object:  # noqa: D401 - pickle API
        raise pickle.UnpicklingError("persistent ids are not allowed in a Flight Recorder dump")


def load_dump(path: str | os.PathLike[str]) -> dict:
    """Read one Flight Recorder dump, pickle or JSON, and check the type of every field the doctor uses.

    Args:
        path: the file (torch's pickle, e.g. ``nccl_trace_rank_0``, or ``_dump_fr_trace_json()`` output).

    Returns:
        The dump: a dict with at least ``version`` and ``entries`` (a list of dicts), each field used by
        :func:`entries_by_group` / :func:`align` of the type torch writes (:func:`check_dump`).

    Raises:
        DumpError: the file cannot be read (not a regular file, over :data:`MAX_DUMP_BYTES`), is truncated, is a
            pickle of something else, lacks ``entries``/``version``, or a field has the wrong type or range (the
            message names the file and the field, e.g. ``entries[3].collective_seq_id``).
    """
    p = Path(path)
    try:
        raw = inputs.read_bytes(p, max_bytes=MAX_DUMP_BYTES)
    except inputs.InputError as exc:
        raise DumpError(str(exc)) from None
    if not raw:
        raise DumpError(f"{p}: empty file, not a Flight Recorder dump")
    body = raw.removeprefix(b"\xef\xbb\xbf")
    if body.lstrip()[:1] == b"{":
        try:
            data = inputs.load_json(body, p, allow_nan=True)  # NaN/Infinity: named by check_dump, field by field
        except inputs.InputError as exc:
            raise DumpError(f"{p}: not a Flight Recorder dump ({exc.reason})") from None
    else:
        try:
            data = _Restricted(io.BytesIO(raw)).load()
        except Exception as exc:  # noqa: BLE001 - foreign bytes: any failure of the unpickler means "not a dump"
            raise DumpError(f"{p}: not a Flight Recorder dump (truncated or foreign file: {type(exc).__name__}: "
                            f"{_show(str(exc))})") from None
    if not isinstance(data, dict) or "entries" not in data or "version" not in data:
        keys = sorted(map(_show, data))[:6] if isinstance(data, dict) else type(data).__name__
        raise DumpError(f"{p}: not a Flight Recorder dump (no 'version'/'entries'; keys: {keys})")
    check_dump(data, str(p))
    return data


def _show(value: object, width: int = 60) -> str:
    """``repr(value)`` cut to ``width`` characters, safe for any value (an int of 5,000 digits has no ``repr``)."""
    if isinstance(value, int) and not isinstance(value, bool) and value.bit_length() > 64:
        return f"an integer of {value.bit_length()} bits"
    if isinstance(value, (list, tuple, dict)):
        return f"a {type(value).__name__} of {len(value)} item(s)"
    text = repr(value) if not isinstance(value, str) else repr(value[:width + 1])
    return text if len(text) <= width else text[:width - 3] + "..."


def _is_int(value: object, lo: int = 0, hi: int = MAX_SEQ) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and lo <= value < hi


def check_dump(data: Mapping[str, Any], name: str) -> None:
    """Check the type and range of every field of a dump that this module reads; raise :class:`DumpError` naming it.

    What torch writes (``torch/csrc/distributed/c10d/FlightRecorder*``; measured in tests/data/fr): ``version`` a
    str; ``pg_config`` a dict of group name (str) -> {``desc``: str, ``ranks``: str such as ``"[0, 1]"`` or a list
    of ints}; ``entries`` a list of dicts with ``collective_seq_id`` (int >= 0), ``profiling_name`` / ``state`` (str),
    ``process_group`` ((name, desc) of str), ``pg_id`` (int), ``is_p2p`` (bool), ``input_sizes`` (a list of
    shapes, each a list of ints), ``time_created_ns`` (int) and ``frames`` (None or a list of {``name``,
    ``filename``: str, ``line``: int}).  Missing optional fields are allowed; fields not read are not checked.
    Counts are bounded (:data:`MAX_ENTRIES`, :data:`MAX_FRAMES`, :data:`MAX_SEQ`, :data:`MAX_RANK`).

    Raises:
        DumpError: ``"<name>: <field> = <value>: <what it must be>"``.
    """
    def bad(field_name: str, value: object, must: str) -> DumpError:
        return DumpError(f"{name}: {field_name} = {_show(value)}: {must}")

    if not isinstance(data.get("version"), (str, int, float)) or isinstance(data.get("version"), bool):
        raise bad("version", data.get("version"), "must be a version string such as '2.10'")
    cfg = data.get("pg_config")
    if cfg is not None:
        if not isinstance(cfg, dict):
            raise bad("pg_config", cfg, "must be a mapping of process-group name -> {desc, ranks}")
        for key, value in cfg.items():
            where = f"pg_config[{_show(key)}]"
            if not isinstance(key, str):
                raise bad(where, key, "a process-group name must be a string")
            if not isinstance(value, dict):
                raise bad(where, value, "must be a mapping with 'desc' and 'ranks'")
            if not isinstance(value.get("desc", ""), str):
                raise bad(where + ".desc", value.get("desc"), "must be a string")
            _check_ranks(value.get("ranks", ""), where + ".ranks", bad)
    entries = data["entries"]
    if not isinstance(entries, list):
        raise bad("entries", entries, "must be a list of collectives")
    if len(entries) > MAX_ENTRIES:
        raise bad("entries", entries, f"more than {MAX_ENTRIES:,} entries")
    frames_seen = 0
    for i, e in enumerate(entries):
        at = f"entries[{i}]"
        if not isinstance(e, dict):
            raise bad(at, e, "must be a mapping (one collective)")
        seq = e.get("collective_seq_id", 0)
        if not _is_int(seq):
            raise bad(at + ".collective_seq_id", seq, f"must be an integer in 0..{MAX_SEQ - 1}")
        for key in ("profiling_name", "state"):
            if e.get(key) is not None and not isinstance(e[key], str):
                raise bad(f"{at}.{key}", e[key], "must be a string (or null)")
        if not isinstance(e.get("is_p2p", False), bool):
            raise bad(at + ".is_p2p", e.get("is_p2p"), "must be true or false")
        pg = e.get("process_group")
        if pg is not None and not (isinstance(pg, (list, tuple)) and 1 <= len(pg) <= 2 and all(isinstance(x, str) for x in pg)):
            raise bad(at + ".process_group", pg, "must be [name, description], two strings")
        if pg is None and "pg_id" in e and not _is_int(e["pg_id"], 0, MAX_RANK):
            raise bad(at + ".pg_id", e["pg_id"], "must be an integer >= 0")
        t = e.get("time_created_ns")
        if t is not None and not _is_int(t, 0, 2**64):
            raise bad(at + ".time_created_ns", t, "must be an integer (nanoseconds)")
        sizes = e.get("input_sizes")
        if sizes is not None and not (isinstance(sizes, list) and all(
                isinstance(shape, list) and all(_is_int(n) for n in shape) for shape in sizes)):
            raise bad(at + ".input_sizes", sizes, "must be a list of shapes, each a list of integers >= 0")
        frames = e.get("frames")
        if frames is None:
            continue
        if not isinstance(frames, list):
            raise bad(at + ".frames", frames, "must be a list of {name, filename, line}, or null")
        frames_seen += len(frames)
        if frames_seen > MAX_FRAMES:
            raise bad(at + ".frames", frames, f"more than {MAX_FRAMES:,} frames in the dump")
        for j, f in enumerate(frames):
            if not (isinstance(f, dict) and isinstance(f.get("name", ""), str) and isinstance(f.get("filename", ""), str)
                    and _is_int(f.get("line", 0), 0, 2**31)):
                raise bad(f"{at}.frames[{j}]", f, "must be {name: str, filename: str, line: int}")


def _check_ranks(ranks: object, where: str, bad: Any) -> None:
    """A ``pg_config`` ``ranks`` value: a string of integers (``"[0, 1]"``) or a list of them, each in 0..MAX_RANK-1."""
    if isinstance(ranks, str):
        if len(ranks) > 16 * 2**20:
            raise bad(where, ranks, "too long")
        numbers = re.findall(r"-?[0-9]+", ranks)
        if any(len(x) > 10 or not 0 <= int(x) < MAX_RANK for x in numbers):
            raise bad(where, ranks, f"each rank must be an integer in 0..{MAX_RANK - 1}")
    elif isinstance(ranks, list):
        if not all(_is_int(r, 0, MAX_RANK) for r in ranks):
            raise bad(where, ranks, f"each rank must be an integer in 0..{MAX_RANK - 1}")
    else:
        raise bad(where, ranks, "must be a string such as '[0, 1]' or a list of ranks")


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
        DumpError: the folder is missing or holds no dump; a file named like a dump is unreadable, not a
            regular file or not a dump (every such file named, one line each); two files claim one rank; the dumps disagree on the default group's members or on which groups exist (dumps of
            different jobs mixed, naming the file that disagrees).
    """
    d = Path(directory)
    try:
        files = sorted(p for p in d.iterdir() if not _SKIP.search(p.name) and not p.name.endswith(".ready"))
    except OSError as exc:
        raise DumpError(f"{d}: cannot list the folder: {inputs.os_reason(exc)}") from None
    dumps: dict[int, dict] = {}
    names: dict[int, Path] = {}
    problems: list[str] = []
    for p in files:
        rank = rank_of(p)
        if rank is None:
            continue
        if rank in names:
            raise DumpError(f"{p}: a second dump for rank {rank} (also {names[rank].name}): dumps of different jobs mixed?")
        if world_size is not None and rank >= world_size:
            raise DumpError(f"{p}: rank {rank} but the job has {world_size} ranks")
        try:  # every file is read, so that one message names every bad dump
            dumps[rank], names[rank] = load_dump(p), p
        except DumpError as exc:
            problems.append(str(exc))
    if problems:
        raise DumpError("\n".join(problems))
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
        # only the sequence numbers some rank recorded: a gap (1, then 10**12) is not walked number by number
        for s in sorted({s for seqs in by_seq.values() for s in seqs if lo <= s <= hi}):
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
            prefix = [e.sig for e in have[ref] if lo <= e.seq < diverge]
            expected = expected_next(prefix)
        out.append(GroupAlignment(g, desc, members, missing, last, first, diverge, ops_at, wrapped, behind, dict(history),
                                  expected))
    return out


PATTERN_WINDOW = 4096
"""How many of the latest collectives :func:`expected_next` searches for a repeating pattern."""


def expected_next(sigs: list[tuple[str, str]]) -> str | None:
    """The op that continues the repeating tail of ``sigs`` ((op, sizes) in sequence order), else ``None``.

    A training step's collectives repeat (DDP: buffers broadcast, gradients all-reduced), but start-up does
    not, so only the tail is matched: the shortest period ``p`` whose last ``max(1, p - 1)`` entries repeat the
    ones ``p`` earlier predicts ``sigs[-p]``'s op.  A heuristic, used only to break two-rank ties
    (:func:`helpers.doctor.break_tie`, evidence ``pattern``).  Only the last :data:`PATTERN_WINDOW` entries are
    matched: a step's pattern is far shorter, and the search is quadratic in what it is given.
    """
    sigs = sigs[-PATTERN_WINDOW:]
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
            raw = cfg.get("ranks", "")
            ranks = list(raw) if isinstance(raw, list) else [int(x) for x in re.findall(r"-?[0-9]+", str(raw))]
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
