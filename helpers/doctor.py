"""The hang doctor: given a hung job, name the rank that diverged, the collective, and the source line.

A distributed hang prints nothing: every healthy rank sits in a collective waiting for a peer
that never calls it (seed D19-D21).  The doctor reads three kinds of evidence per rank:

* torch's Flight Recorder dump (:mod:`helpers.flight_recorder`; :func:`diagnose_fr`): per process
  group the sequence number and op of each collective; no change to the script (docs/hang-doctor.md);
* its Python stack, taken from outside with py-spy (no cooperation from the rank needed);
* optionally its collective trace (:mod:`helpers.collective_trace`): the call site of every
  collective it entered and left (what the Flight Recorder does not record on gloo).

Two-rank ties are decided from the source's rank-dependent branches (``runbook lint``'s taint pass)
and the Flight Recorder's history (:func:`break_tie`); the verdict says which evidence decided.
Across nodes: :func:`diagnose_slurm_job` (``srun --overlap``) and :func:`diagnose_lab`.

HangVerdict: the collective most ranks are blocked in (op, sequence number, the line that called
it) and the ranks that are *not* in it: stuck elsewhere (their innermost user frame), in a
different collective (an op mismatch), or dead.  Usable on a job of the runner
(:func:`diagnose_job`), on a live process tree anywhere (:func:`diagnose_pid`, ``runbook
doctor --pid PID`` on a node), or on stacks and traces saved earlier (``--job-dir``).

What holds on NCCL (GPU jobs): NCCL collectives are asynchronous (the Python call returns once
the kernel is queued), so a hung rank's py-spy stack does *not* sit in the collective that hangs
but at the next point that waits for the GPU (``.item()``, ``.cpu()``, a barrier,
``destroy_process_group``).  The stacks alone then name that later line.  The collective trace
is what keeps the verdict right there: it synchronizes the CUDA stream before writing ``exit``
(:mod:`helpers.collective_trace`), so the op, sequence number and call site of the unfinished
collective come from the trace.  Without the trace (``--pid`` on a job that does not enable
it), set ``TORCH_NCCL_BLOCKING_WAIT=1`` in the job (``work.wait()`` then blocks the CPU,
``ProcessGroupNCCL.hpp``) or read the verdict's collective as "the first sync point after the
hang".  Verified on gloo (CPU) only; the NCCL statements are from torch's source, not run here.
"""

from __future__ import annotations

import os
import re
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from helpers import collective_trace, procs
from helpers.jobdir import FR_DIR_ENV, JOB_DIR_ENV, TRACE_DIR_ENV, JobDir

if TYPE_CHECKING:
    from helpers.jobs import JobResult
    from helpers.slurm import SlurmClient

_FRAME = re.compile(r"^\s+(?P<func>.+?) \((?P<file>[^()]+?):(?P<line>\d+)\)\s*$")
_LIBRARY = ("torch/", "site-packages/", "dist-packages/", "rankshim.py", "collective_trace.py", "threading.py",
            "runpy.py", "<frozen")
_COLLECTIVE_FILE = "distributed_c10d.py"
_BACKWARD = ("torch/autograd/", "torch/_tensor.py")


@dataclass
class Frame:
    """One Python frame of a py-spy dump: function, file (as py-spy shortens it) and line."""

    func: str
    file: str
    line: int

    @property
    def site(self) -> str:
        """``basename:line``, the way users name a line of their script."""
        return f"{os.path.basename(self.file)}:{self.line}"


def parse_stack(text: str) -> list[Frame]:
    """The main thread's frames of a ``py-spy dump``, innermost first (empty if py-spy failed)."""
    frames: list[Frame] = []
    in_main = False
    for line in text.splitlines():
        if line.startswith("Thread "):
            in_main = '"MainThread"' in line
            continue
        m = _FRAME.match(line)
        if m and in_main:
            frames.append(Frame(m["func"], m["file"], int(m["line"])))
    return frames


@dataclass
class RankState:
    """Where one rank is: the collective it waits in (if any), its user frame, its last traced collective."""

    rank: int
    collective: str | None = None  # op name from the stack, or "backward" (DDP's reducer)
    seq: int | None = None  # sequence number from the trace (the open ``enter``)
    call_site: str | None = None  # user line that called the collective / where the rank is
    last_seq: int | None = None  # highest sequence number the rank entered
    last_op: str | None = None
    last_site: str | None = None
    alive: bool = True
    frames: list[Frame] = field(default_factory=list)

    def describe(self) -> str:
        """One line for people."""
        if not self.alive:
            return f"rank {self.rank} is not running (exited or killed)"
        last = (f"; last collective it entered: #{self.last_seq} {self.last_op} at {self.last_site}"
                if self.last_seq is not None else "")
        if self.collective:
            seq = f" #{self.seq}" if self.seq is not None else ""
            return f"rank {self.rank} waits in {self.collective}{seq} called at {self.call_site}"
        return f"rank {self.rank} is in no collective: {_where(self)}{last}{known_wait(self.frames)}"


def rank_state(rank: int, stack: str | None, trace: Sequence[dict] = ()) -> RankState:
    """Combine one rank's py-spy stack and trace records into a :class:`RankState`."""
    state = RankState(rank)
    if stack is None:
        state.alive = False
    frames = parse_stack(stack or "")
    state.frames = frames
    user = next((f for f in frames if not any(lib in f.file for lib in _LIBRARY)), None)
    coll = next((f for f in frames if f.file.endswith(_COLLECTIVE_FILE)), None)
    if coll is not None:
        state.collective = coll.func
    elif any(any(b in f.file for b in _BACKWARD) for f in frames):
        state.collective = "backward"  # DDP's gradient all-reduce runs in the autograd engine
    state.call_site = user.site if user else (frames[0].site if frames else None)
    opened: dict[int, dict] = {}
    for rec in trace:
        if rec.get("phase") == "enter":
            opened[rec["seq"]] = rec
            state.last_seq, state.last_op, state.last_site = rec["seq"], rec["op"], rec.get("site")
        elif rec.get("phase") == "exit":
            opened.pop(rec.get("seq"), None)
    if opened and state.alive and (state.collective or not frames):
        rec = opened[max(opened)]
        state.seq, state.collective = rec["seq"], state.collective or rec["op"]
        state.call_site = rec.get("site") or state.call_site
    return state


@dataclass
class HangVerdict:
    """The doctor's conclusion.

    Attributes:
        collective: the op most ranks wait in (``None`` if none waits); seq: its sequence number
            (from traces); site: the line that called it.
        waiting: ranks blocked in that collective; diverged: ranks not in it (the suspects).
        states: every rank's :class:`RankState`; text: the printed verdict.
        evidence: what named the diverged rank(s): ``majority`` (more ranks on the other side), ``rank branch``
            (the rank's call chain passes a rank-dependent ``if`` in the source: ``runbook lint``'s taint pass),
            ``new op`` (Flight Recorder: the rank's op never occurred earlier on the group while the other side's
            continues the pattern), ``pattern`` (its op breaks the repeating pattern of the group's history), ``behind`` (fewer collectives entered), ``no dump``, or ``undecided``.
        group: the process group of a Flight Recorder verdict (``'0'`` = default), else ``None``.
    """

    collective: str | None
    seq: int | None
    site: str | None
    waiting: list[int]
    diverged: list[int]
    states: dict[int, RankState]
    text: str = ""
    evidence: str = ""  # what decided a tie or named the rank: "majority", "rank branch", "new op", "behind", "undecided", ...
    group: str | None = None  # Flight Recorder process group of the verdict ('0' = default)


def diagnose(stacks: Mapping[int, str | None], traces: Mapping[int, Sequence[dict]] | None = None) -> HangVerdict:
    """Name the diverged rank(s) from per-rank stacks (py-spy text; ``None`` = rank not running) and traces.

    The collective that the most live ranks wait in, with the same sequence number when traces
    exist, is "the collective"; every other rank diverged.  On a tie the group holding the
    lowest rank is taken as the reference.  When all ranks wait in the same collective,
    nobody diverged here: the peer that is missing is outside the job (another node) or the
    transport is broken.

    Raises:
        ValueError: ``stacks`` is empty.
    """
    if not stacks:
        raise ValueError("stacks: need at least one rank's stack")
    traces = traces or {}
    states = {r: rank_state(r, stacks[r], traces.get(r, ())) for r in sorted(stacks)}
    groups = Counter((s.collective, s.seq) for s in states.values() if s.collective)
    if not groups:
        text = "verdict: no rank is in a collective; " + "; ".join(s.describe() for s in states.values())
        return HangVerdict(None, None, None, [], sorted(states), states, text)
    best = max(groups.values())
    tied = [key for key, n in groups.items() if n == best]
    key = min(tied, key=lambda k: min(r for r, s in states.items() if (s.collective, s.seq) == k))
    evidence = "majority"
    if len(tied) > 1:
        sides = {k: [r for r, s in states.items() if (s.collective, s.seq) == k] for k in tied}
        counts = {r: Counter(rec.get("site") for rec in traces.get(r, ()) if rec.get("phase") == "enter") for r in states}
        guilty, evidence = break_tie(sides, states, site_counts=counts if any(counts.values()) else None)
        if guilty is not None:
            key = next(k for k in tied if k != guilty) if len(tied) == 2 else key
    waiting = [r for r, s in states.items() if (s.collective, s.seq) == key]
    diverged = [r for r in states if r not in waiting]
    sites = Counter(states[r].call_site for r in waiting)
    site = sites.most_common(1)[0][0]
    op, seq = key
    label = f"{op}" + (f" (collective #{seq})" if seq is not None else "")
    if not diverged:
        text = (f"verdict: all {len(waiting)} ranks wait in {label} at {site}: no rank of this job diverged; "
                "the peer that never arrives is elsewhere (another node, a dead process) or the transport is stuck")
    else:
        text = (f"verdict: rank(s) {diverged} diverged. Ranks {waiting} wait in {label} called at {site}.\n"
                + "\n".join("  " + states[r].describe() for r in diverged))
        if len(tied) > 1 and evidence == "undecided":
            text += ("\n  note: as many ranks are in another collective and nothing separates them (undecided): "
                     "either side may hold the bug (the reference is the group of the lowest rank)")
        elif len(tied) > 1:
            text += f"\n  decided by: {evidence} ({_EVIDENCE[evidence]})"
    if len(sites) > 1:
        text += ("\n  note: the waiting ranks reached it from different lines "
                 + ", ".join(f"rank {r}: {states[r].call_site}" for r in waiting)
                 + ": one collective reached by different code paths pairs calls that do not belong together (D21)")
    return HangVerdict(op, seq, site, waiting, diverged, states, text, evidence)


_EVIDENCE = {
    "rank branch": "its call chain passes a rank-dependent branch of the source; the other side's does not",
    "new op": "its op never occurred earlier on this group; the other side's continues the pattern",
    "pattern": "its op breaks the repeating pattern of the collectives before; the other side's continues it",
    "call-site count": "it entered collectives at a call site the other side never used (collective trace)",
    "majority": "more ranks are on the other side",
    "undecided": "nothing separates the ranks",
}


def rank_branches(frames: Sequence[Frame], root: str | os.PathLike[str] | None = None) -> list[str]:
    """The rank-dependent branches on a rank's user call chain: ``file:line`` of each ``if rank ...`` that guards a frame.

    Uses ``runbook lint``'s rank-taint pass (:meth:`helpers.lint.python_rules.PythonLinter.rank_branch_at`) on each
    user frame's source file (read from ``frame.file``, or under ``root`` when that path is relative).
    Unreadable sources are skipped.
    """
    from helpers.lint.python_rules import PythonLinter

    linters: dict[str, PythonLinter | None] = {}
    found = []
    for f in frames:
        if any(lib in f.file for lib in _LIBRARY):
            continue
        if f.file not in linters:
            linters[f.file] = None
            for cand in (Path(f.file), Path(root or ".") / f.file, Path(__file__).resolve().parent.parent / f.file):
                try:
                    linters[f.file] = PythonLinter(str(cand), cand.read_text())
                    break
                except (OSError, SyntaxError, ValueError):
                    continue
        lint = linters[f.file]
        gate = lint.rank_branch_at(f.line) if lint else None
        if gate is not None:
            found.append(f"{os.path.basename(f.file)}:{gate}")
    return found


def break_tie(sides: Mapping[object, Sequence[int]], states: Mapping[int, RankState],
              history: Mapping[str, int] | None = None, ops: Mapping[object, str] | None = None,
              expected: str | None = None, site_counts: Mapping[int, Mapping[str, int]] | None = None
              ) -> tuple[object | None, str]:
    """Decide which of two equal sides of a hang holds the bug; return ``(guilty side key or None, evidence)``.

    Evidence, in order: (1) ``rank branch``: exactly one side's ranks have a rank-dependent branch on their
    call chain (:func:`rank_branches`); (1b) ``call-site count``: with collective traces (``site_counts``: rank ->
    call site -> collectives entered there), exactly one side's ranks entered collectives at a call site the
    other side never used (an extra call, or a call at the end that the others have not reached); (2) ``new op`` (Flight Recorder): with ``history`` (op -> how often it
    occurred earlier on the group) and ``ops`` (side -> op), exactly one side's op never occurred before;
    (3) ``pattern`` (Flight Recorder): ``expected`` is the op the common history's repeating pattern predicts
    (:func:`helpers.flight_recorder.expected_next`) and exactly one side's op differs from it (an extra or a
    missing call earlier, e.g. an evaluation forward through DDP on one rank); otherwise ``(None, "undecided")``.
    Only two sides are decided.
    """
    keys = list(sides)
    if len(keys) != 2:
        return None, "undecided"
    gated = {k: any(rank_branches(states[r].frames) for r in sides[k] if r in states) for k in keys}
    if gated[keys[0]] != gated[keys[1]]:
        return (keys[0] if gated[keys[0]] else keys[1]), "rank branch"
    if site_counts:
        seen = {k: set().union(*(set(site_counts.get(r, {})) for r in sides[k])) for k in keys}
        only = {k: seen[k] - seen[o] for k, o in ((keys[0], keys[1]), (keys[1], keys[0]))}
        if bool(only[keys[0]]) != bool(only[keys[1]]):
            return (keys[0] if only[keys[0]] else keys[1]), "call-site count"
    if history is not None and ops is not None:
        new = {k: history.get(ops[k], 0) == 0 for k in keys}
        if new[keys[0]] != new[keys[1]]:
            return (keys[0] if new[keys[0]] else keys[1]), "new op"
    if expected is not None and ops is not None:
        breaks = {k: ops[k] != expected for k in keys}
        if breaks[keys[0]] != breaks[keys[1]]:
            return (keys[0] if breaks[keys[0]] else keys[1]), "pattern"
    return None, "undecided"


KNOWN_WAITS = {
    "FileBaton.wait": ("waits for torch's JIT build lock (the file `lock` in the op's folder under TORCH_EXTENSIONS_DIR "
                       "or ~/.cache/torch_extensions); if no build is running it is stale, left by a killed build, and "
                       "every rank waits forever: `runbook diagnose` names it (host.jit_lock); remove it (PF-jit-lock)"),
}
"""Library frames that explain a wait outside any collective: innermost function (as py-spy names it) -> hint."""


def known_wait(frames: Sequence[Frame]) -> str:
    """``"; <hint>"`` when a frame of ``frames`` is a known wait of :data:`KNOWN_WAITS`, else ``""``."""
    hit = next((KNOWN_WAITS[f.func] for f in frames if f.func in KNOWN_WAITS), "")
    return f"; {hit}" if hit else ""


def _where(state: RankState) -> str:
    """``in f() called from g() at file:line`` for a rank outside any collective (its two innermost user frames)."""
    user = [f for f in state.frames if not any(lib in f.file for lib in _LIBRARY)]
    if not user:
        return f"at {state.call_site}" if state.call_site else "(no stack)"
    text = f"in {user[0].func.split('.')[-1]}() at {user[0].site}"
    if len(user) > 1:
        text += f" called from {user[1].func.split('.')[-1]}() at {user[1].site}"
    return text


def diagnose_fr(dumps: Mapping[int, Mapping], stacks: Mapping[int, str | None] | None = None,
                world_size: int | None = None) -> HangVerdict:
    """Name the diverged rank(s) from Flight Recorder dumps (:mod:`helpers.flight_recorder`), with stacks if given.

    Per process group the ranks are aligned by ``collective_seq_id``.  The group where ranks first entered
    different ops (possibly long before the hang) decides; else the group where some ranks are behind
    (entered fewer collectives: stuck elsewhere or dead); else every rank waits in the same collective.
    Among different ops, the op of most ranks is "the collective"; a two-sided tie is decided by
    :func:`break_tie`.  Ranks of ``world_size`` (or of the stacks) without a dump count as diverged.  Stacks
    (py-spy text) add where each rank is: the line, and for a rank outside any collective its function and caller.

    Args:
        dumps: rank -> dump; stacks: rank -> py-spy text (``None``: not running); world_size: ranks of the job.

    Raises:
        ValueError: ``dumps`` is empty.
    """
    from helpers import flight_recorder as fr

    groups = fr.align(dumps)
    stacks = dict(stacks or {})
    ranks = sorted(set(dumps) | set(stacks) | set(range(world_size or 0)))
    states = {r: rank_state(r, stacks.get(r)) if r in stacks else RankState(r) for r in ranks}
    no_dump = [r for r in ranks if r not in dumps]
    pick = next((g for g in groups if g.diverge_seq is not None), None) or next((g for g in groups if g.behind), None) \
        or (groups[0] if groups else None)
    if pick is None:
        text = "verdict: the Flight Recorder dumps hold no collective"
        return HangVerdict(None, None, None, [], no_dump, states, text, "no dump")
    label = f"group {pick.group}" + (f" ({pick.desc})" if pick.desc else "")
    evidence = "majority"
    if pick.diverge_seq is not None:
        seq = pick.diverge_seq
        sides: dict[str, list[int]] = {}
        for r, op in sorted(pick.ops_at.items()):
            sides.setdefault(op, []).append(r)
        best = max(len(v) for v in sides.values())
        top = [op for op, rs in sides.items() if len(rs) == best]
        op = top[0] if len(top) == 1 else min(top, key=lambda o: min(sides[o]))
        if len(top) == 2:
            guilty, evidence = break_tie({o: sides[o] for o in top}, states, pick.history, {o: o for o in top}, pick.expected)
            if guilty is not None:
                op = next(o for o in top if o != guilty)
        waiting = sides[op]
        diverged = sorted({r for r in pick.ops_at if r not in waiting} | set(no_dump))
        detail = [f"rank {r} entered {pick.ops_at[r]} as #{seq} on {label}" for r in diverged if r in pick.ops_at]
    else:
        seq = max(pick.last.values())
        behind = pick.behind
        waiting = [r for r, s in pick.last.items() if s == seq]
        diverged = sorted(set(behind) | set(no_dump))
        evidence = "behind" if behind else ("no dump" if no_dump else "majority")
        ref = next(iter(dumps.values()))
        op = next((e.op for e in fr.entries_by_group(dumps[waiting[0]]).get(pick.group, []) if e.seq == seq), "?") if waiting else "?"
        del ref
        detail = [f"rank {r} stopped after #{pick.last[r]} on {label}" for r in diverged if r in pick.last]
    detail += [f"rank {r}: no Flight Recorder dump (dead, or no dump requested)" for r in no_dump]
    for r in diverged:
        st = states.get(r)
        if st is not None and st.frames:
            where = (f"waits in {st.collective} {_where(st)}" if st.collective else f"is in no collective: {_where(st)}")
            detail.append(f"  rank {r} (stack) {where}")
    site = Counter(states[r].call_site for r in waiting if states[r].call_site).most_common(1)
    site_s = site[0][0] if site else None
    at = f" called at {site_s}" if site_s else ""
    if not diverged:
        text = (f"verdict (Flight Recorder): all {len(waiting)} ranks entered {op} #{seq} on {label}{at}: no rank of this "
                "job diverged; the peer that never arrives is elsewhere or the transport is stuck")
    else:
        text = (f"verdict (Flight Recorder): rank(s) {diverged} diverged. Ranks {waiting} entered {op} (collective #{seq} "
                f"on {label}){at}.\n" + "\n".join("  " + d for d in detail))
        if evidence == "undecided":
            text += "\n  note: two equal sides and nothing separates them (undecided): either side may hold the bug"
        elif evidence in _EVIDENCE and evidence != "majority":
            text += f"\n  decided by: {evidence} ({_EVIDENCE[evidence]})"
        if pick.diverge_seq is not None and pick.diverge_seq < min(pick.last.values()):
            text += (f"\n  note: the ranks diverged at #{pick.diverge_seq}, {min(pick.last.values()) - pick.diverge_seq} "
                     "collective(s) before the last one they entered: the pairing went wrong long before the hang")
    if pick.wrapped:
        text += f"\n  note: the buffer of rank(s) {pick.wrapped} wrapped (oldest entries lost); raise TORCH_FR_BUFFER_SIZE"
    others = [g for g in groups if g is not pick and (g.diverge_seq is not None or g.behind)]
    for g in others:
        text += "\n  also: " + g.describe()
    return HangVerdict(op, seq, site_s, waiting, diverged, states, text, evidence, pick.group)


def read_traces(directory: str | os.PathLike[str]) -> dict[int, list[dict]]:
    """Every ``rank<R>.jsonl`` of a trace directory, by rank (empty if the directory is missing)."""
    out: dict[int, list[dict]] = {}
    for path in Path(directory).glob("rank*.jsonl"):
        m = re.fullmatch(r"rank(\d+)\.jsonl", path.name)
        if m:
            out[int(m[1])] = collective_trace.read(path)
    return out


def load_fr(directory: str | os.PathLike[str], world_size: int | None = None) -> dict[int, dict]:
    """The Flight Recorder dumps of a folder by rank (``<job>/fr``: the ranks' own dumps; else its ``nccl/``: NCCL's dump on timeout).

    Raises:
        helpers.flight_recorder.DumpError: (a ``ValueError``) no dump, an unreadable one, or dumps of different jobs, naming the file.
    """
    from helpers import flight_recorder as fr

    d = Path(directory)
    nccl = d / "nccl"
    if d.is_dir() and nccl.is_dir() and not any(fr.rank_of(p) is not None for p in d.iterdir() if p.is_file()
                                                 and not p.name.endswith(".ready")) and any(nccl.iterdir()):
        d = nccl
    return fr.load_dir(d, world_size=world_size)


def _has_dumps(directory: Path) -> bool:
    return directory.is_dir() and any(p.is_file() and re.fullmatch(r"rank\d+", p.name) for p in directory.iterdir())


def diagnose_job(job: JobResult) -> HangVerdict:
    """The :class:`HangVerdict` for a :class:`helpers.jobs.JobResult` that hung or timed out (stacks taken by the runner).

    Ranks that had exited when the stacks were taken count as not running.

    Raises:
        ValueError: the job has no stacks (it neither hung nor timed out).
    """
    stacks: dict[int, str | None] = dict(job.stacks)
    if not stacks:
        raise ValueError("job: no stacks were taken (the job did not hang or time out)")
    for rank in job.ranks:
        stacks.setdefault(rank, None)
    return diagnose(stacks, read_traces(JobDir(job.job_dir).trace_dir))


def diagnose_job_dir(job_dir: str | os.PathLike[str], fr_dir: str | os.PathLike[str] | None = None,
                     use_fr: bool = True) -> HangVerdict:
    """The :class:`HangVerdict` from what a runner job left on disk (``stacks/``, ``fr/``, ``trace/``, ``ranks/``).

    With Flight Recorder dumps (``fr_dir``, else the job's ``fr/`` when ``use_fr``) the verdict is
    :func:`diagnose_fr` on dumps + stacks; otherwise :func:`diagnose` on stacks (+ collective traces).

    Raises:
        ValueError: no saved stacks and no dumps in ``job_dir``; a bad dump (naming the file).
    """
    layout = JobDir(job_dir)
    stacks: dict[int, str | None] = {rank: path.read_text() for rank, path in layout.stacks().items()}
    ranks = layout.rank_ids()
    if fr_dir is not None or (use_fr and _has_dumps(layout.fr_dir)):
        dumps = load_fr(fr_dir if fr_dir is not None else layout.fr_dir, world_size=len(ranks) or None)
        return diagnose_fr(dumps, {r: stacks.get(r) for r in ranks} if stacks else None, world_size=len(ranks) or None)
    if not stacks:
        raise ValueError(f"job_dir={str(layout.path)!r}: no stacks/rank<R>.txt and no fr/ dumps in it")
    for rank in ranks:
        stacks.setdefault(rank, None)
    return diagnose(stacks, read_traces(layout.trace_dir))


def rank_processes(pid: int) -> dict[int, psutil.Process]:
    """The rank processes under launcher ``pid`` (e.g. torchrun's), by ``RANK``.

    A rank is a descendant whose environment has ``RANK`` and whose command line is not the
    rank shim (the shim and its child share ``RANK``; the child is the real rank).

    Raises:
        ValueError: ``pid`` does not exist.
    """
    try:
        root = psutil.Process(pid)
    except psutil.NoSuchProcess:
        raise ValueError(f"pid={pid}: no such process") from None
    found: dict[int, psutil.Process] = {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            rank = proc.environ().get("RANK", "")
            cmd = " ".join(proc.cmdline())
        except psutil.Error:
            continue
        if rank.isdigit() and "rankshim.py" not in cmd and "python" in os.path.basename(proc.cmdline()[0] if proc.cmdline() else ""):
            found.setdefault(int(rank), proc)
    return found


def diagnose_pid(pid: int, fr_dir: str | os.PathLike[str] | None = None) -> HangVerdict:
    """The :class:`HangVerdict` for a live job: py-spy every rank under launcher ``pid``, read their traces if they opted in.

    Flight Recorder dumps come from ``fr_dir`` (e.g. ``TORCH_FR_DUMP_TEMP_FILE``'s folder after NCCL's dump on
    timeout) or, for a job of the runner (ranks with ``RUNBOOK_FR_DIR``), are requested from the ranks (SIGUSR2);
    with dumps the verdict is :func:`diagnose_fr`.

    Raises:
        ValueError: no such ``pid``, or no rank process under it.
    """
    ranks = rank_processes(pid)
    if not ranks:
        raise ValueError(f"pid={pid}: no rank processes (with RANK in their environment) under it")
    fr_dirs = {p.environ().get(FR_DIR_ENV) for p in ranks.values()} - {None, ""}
    if fr_dir is None and len(fr_dirs) == 1:  # a runner job: ask the ranks for their dumps first
        from helpers.jobs import request_fr_dumps

        layout = JobDir(Path(next(iter(fr_dirs))).parent)
        if request_fr_dumps(layout):
            fr_dir = layout.fr_dir
    stacks: dict[int, str | None] = {r: procs.py_spy_dump(p.pid) for r, p in ranks.items()}
    if fr_dir is not None:
        return diagnose_fr(load_fr(fr_dir), stacks, world_size=int(next(iter(ranks.values())).environ().get("WORLD_SIZE", "0")) or None)
    traces: dict[int, list[dict]] = {}
    for r, p in ranks.items():
        env = p.environ()
        directory = env.get(TRACE_DIR_ENV) or (JobDir(env[JOB_DIR_ENV]).trace_dir if env.get(JOB_DIR_ENV) else None)
        if directory and (Path(directory) / f"rank{r}.jsonl").exists():
            traces[r] = collective_trace.read(Path(directory) / f"rank{r}.jsonl")
    return diagnose(stacks, traces)


def node_report(job_id: str | None = None, wait_s: float | None = None) -> dict:
    """What this node can say about a hung job: every rank process's py-spy stack and Flight Recorder dump.

    Rank processes are the Python processes with ``RANK`` in their environment (and, when ``job_id`` is
    given, ``SLURM_JOB_ID == job_id``) in this node's network namespace (the network lab's nodes share one
    process table), except the rank shim.  A rank that runs :mod:`helpers._fr_site`
    (``RUNBOOK_FR_DIR`` set and ``rank<R>.ready`` naming its pid) is asked for its dump first (SIGUSR2);
    dumps already in ``RUNBOOK_FR_DIR`` or in ``TORCH_FR_DUMP_TEMP_FILE``'s folder (NCCL's dump on timeout)
    are read as they are.

    Args:
        job_id: only the ranks of this SLURM job.
        wait_s: how long to wait for the requested dumps after the stacks were taken (default
            :data:`helpers.jobs.FR_WAIT_S`); returns as soon as every asked rank has written its dump.

    Returns:
        ``{"host", "ranks": {rank: {"pid", "stack", "world_size"}}, "dumps": {rank: base64 pickle/JSON bytes}}``
        (JSON-serialisable: what ``python -m helpers.doctor --node-report`` prints for the collector).
    """
    import base64
    import signal
    import socket
    import time

    from helpers import flight_recorder as fr
    from helpers.jobs import FR_WAIT_S

    ranks: dict[int, psutil.Process] = {}
    here = os.readlink("/proc/self/ns/net")
    for proc in psutil.process_iter():
        try:
            env, cmd = proc.environ(), proc.cmdline()
            if os.readlink(f"/proc/{proc.pid}/ns/net") != here:  # another node of the network lab
                continue
        except (psutil.Error, OSError):
            continue
        if not env.get("RANK", "").isdigit() or (job_id and env.get("SLURM_JOB_ID") != str(job_id)):
            continue
        if not cmd or "python" not in os.path.basename(cmd[0]) or any("rankshim.py" in c for c in cmd):
            continue
        ranks.setdefault(int(env["RANK"]), proc)
    folders: dict[int, Path] = {}
    t0 = time.time()
    for r, proc in ranks.items():
        env = proc.environ()
        if env.get(FR_DIR_ENV):
            d = Path(env[FR_DIR_ENV])
            folders[r] = d
            try:
                if (d / f"rank{r}.ready").read_text().strip() == str(proc.pid):
                    os.kill(proc.pid, signal.SIGUSR2)
            except (OSError, ValueError):
                pass
        elif env.get("TORCH_FR_DUMP_TEMP_FILE"):
            folders[r] = Path(env["TORCH_FR_DUMP_TEMP_FILE"]).parent
    stacks = {r: procs.py_spy_dump(p.pid) for r, p in ranks.items()}
    dumps: dict[str, str] = {}
    # the window opens once the stacks are taken: py-spy alone can take seconds on a loaded node, and a window
    # counted from the signal closed before the first look (chapter 08 under load 7: no dump read at all)
    deadline = time.time() + (FR_WAIT_S if wait_s is None else wait_s)
    while True:
        for r, d in folders.items():
            for cand in sorted(d.glob(f"*{r}")) if d.is_dir() and str(r) not in dumps else []:
                if fr.rank_of(cand) == r and cand.is_file() and cand.stat().st_mtime >= t0 - 0.01:
                    dumps[str(r)] = base64.b64encode(cand.read_bytes()).decode()
        if len(dumps) >= len(folders) or time.time() > deadline:
            break
        time.sleep(0.05)
    return {"host": socket.gethostname(), "dumps": dumps,
            "ranks": {str(r): {"pid": p.pid, "stack": stacks[r], "world_size": int(p.environ().get("WORLD_SIZE", "0") or 0)}
                      for r, p in ranks.items()}}


def diagnose_reports(reports: Sequence[Mapping]) -> HangVerdict:
    """One verdict from every node's :func:`node_report`: stacks and dumps of all ranks, wherever they run.

    Raises:
        ValueError: no rank in any report; a dump that is not a Flight Recorder dump (naming host and rank).
    """
    import base64
    import tempfile

    from helpers import flight_recorder as fr

    stacks: dict[int, str | None] = {}
    world = 0
    raw: dict[int, tuple[str, bytes]] = {}
    for rep in reports:
        for r, info in rep.get("ranks", {}).items():
            stacks[int(r)] = info.get("stack")
            world = max(world, int(info.get("world_size") or 0))
        for r, b64 in rep.get("dumps", {}).items():
            raw[int(r)] = (str(rep.get("host")), base64.b64decode(b64))
    if not stacks:
        raise ValueError("reports: no rank process found on any node (is the job running? --slurm-job the right id?)")
    for r in range(world):
        stacks.setdefault(r, None)
    if not raw:
        return diagnose(stacks)
    with tempfile.TemporaryDirectory(dir=os.environ.get("TMPDIR")) as tmp:
        for r, (host, data) in raw.items():
            (Path(tmp) / f"{host}.rank{r}").write_bytes(data)
        dumps = fr.load_dir(tmp, world_size=world or None)
    return diagnose_fr(dumps, stacks, world_size=world or None)


def _node_report_argv(job_id: str | None) -> list[str]:
    import sys

    return [sys.executable, "-m", "helpers.doctor", "--node-report"] + (["--slurm-job", str(job_id)] if job_id else [])


def _parse_reports(text: str) -> list[dict]:
    import json

    return [json.loads(line) for line in text.splitlines() if line.startswith("{")]


def diagnose_slurm_job(job_id: str, timeout_s: float = 60.0, client: SlurmClient | None = None) -> HangVerdict:
    """The verdict for a running SLURM job on every node: ``srun --overlap --jobid J`` runs :func:`node_report` once per node.

    As ml-engineering's hang recipe does (``srun --overlap --jobid``, py-spy on every node:
    https://github.com/stas00/ml-engineering/blob/master/debug/pytorch.md); needs this project on the shared
    filesystem at the same path on every node.  ``client``: how to reach SLURM (default
    :class:`helpers.slurm.LocalSlurm`, this machine's clients; the SLURM lab is one too).

    Raises:
        ValueError: ``srun`` failed (its stderr in the message) or no node found a rank.
    """
    from helpers.slurm import LocalSlurm

    client = client or LocalSlurm()
    nodes = client.slurm(["squeue", "-h", "-j", str(job_id), "-o", "%D"], timeout_s)
    n = nodes.stdout.strip()
    if nodes.returncode or not n.isdigit():
        raise ValueError(f"slurm job {job_id}: not running ({(nodes.stderr or nodes.stdout).strip() or 'squeue found nothing'})")
    import shutil
    import tempfile

    from helpers import jobs

    # One file per task (srun --output=...%t): srun forwards task output in chunks, so two nodes' long JSON
    # lines (base64 dumps) interleave on a shared stdout.  The folder is in build/, on the shared filesystem.
    scratch = jobs.build_dir() / "tmp"
    scratch.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix=f"doctor-{job_id}-", dir=scratch))
    try:
        out = client.slurm(["srun", "--overlap", f"--jobid={job_id}", f"--nodes={n}", "--ntasks-per-node=1",
                            "--export=ALL", f"--output={folder}/node-%t.json", *_node_report_argv(job_id)],
                           timeout_s, env={"PYTHONPATH": _project_pythonpath()})
        if out.returncode:
            raise ValueError(f"slurm job {job_id}: srun --overlap failed ({out.stderr.strip()[-300:]})")
        text = "\n".join(f.read_text() for f in sorted(folder.glob("node-*.json")))
    finally:
        shutil.rmtree(folder, ignore_errors=True)
    return diagnose_reports(_parse_reports(text))


def diagnose_lab(name: str, job_id: str | None = None, timeout_s: float = 60.0) -> HangVerdict:
    """The verdict for a job running on the network lab ``name``: :func:`node_report` on every lab node (the lab's node runner).

    Raises:
        ValueError: the lab is not up, or no node found a rank.
    """
    from helpers import netlab

    lab = netlab.Lab.attach(name)
    reports: list[dict] = []
    for node in range(lab.nodes):
        res = lab.run(node, _node_report_argv(job_id), timeout_s=timeout_s, env={"PYTHONPATH": _project_pythonpath()})
        reports += _parse_reports(res.stdout)
    return diagnose_reports(reports)


def _project_pythonpath() -> str:
    root = str(Path(__file__).resolve().parent.parent)
    return os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH", "")) if p)


def _main(argv: Sequence[str] | None = None) -> int:
    """``python -m helpers.doctor --node-report [--slurm-job J]``: print this node's :func:`node_report` as one JSON line."""
    import argparse
    import json

    p = argparse.ArgumentParser(prog="python -m helpers.doctor", description=_main.__doc__)
    p.add_argument("--node-report", action="store_true", required=True)
    p.add_argument("--slurm-job", default=None)
    args = p.parse_args(argv)
    print(json.dumps(node_report(args.slurm_job)))
    return 0


Verdict = HangVerdict
"""Old name of :class:`HangVerdict` (kept so existing callers keep working)."""


if __name__ == "__main__":
    raise SystemExit(_main())
