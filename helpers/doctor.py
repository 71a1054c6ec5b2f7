"""The hang doctor: given a hung job, name the rank that diverged, the collective, and the source line.

A distributed hang prints nothing: every healthy rank sits in a collective waiting for a peer
that never calls it (seed D19-D21).  The doctor reads two kinds of evidence per rank:

* its Python stack, taken from outside with py-spy (no cooperation from the rank needed);
* optionally its collective trace (:mod:`helpers.collective_trace`): sequence number, op,
  tensor shape/dtype and call site of every collective it entered and left.

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
from helpers.jobdir import JOB_DIR_ENV, TRACE_DIR_ENV, JobDir

if TYPE_CHECKING:
    from helpers.jobs import JobResult

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
        return f"rank {self.rank} is in no collective: at {self.call_site}{last}"


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
    """

    collective: str | None
    seq: int | None
    site: str | None
    waiting: list[int]
    diverged: list[int]
    states: dict[int, RankState]
    text: str = ""


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
        if len(tied) > 1:
            text += ("\n  note: as many ranks are in another collective: the ranks disagree on which collective "
                     "comes next, and either side may hold the bug (the reference is the group of the lowest rank)")
    if len(sites) > 1:
        text += ("\n  note: the waiting ranks reached it from different lines "
                 + ", ".join(f"rank {r}: {states[r].call_site}" for r in waiting)
                 + ": one collective reached by different code paths pairs calls that do not belong together (D21)")
    return HangVerdict(op, seq, site, waiting, diverged, states, text)


def read_traces(directory: str | os.PathLike[str]) -> dict[int, list[dict]]:
    """Every ``rank<R>.jsonl`` of a trace directory, by rank (empty if the directory is missing)."""
    out: dict[int, list[dict]] = {}
    for path in Path(directory).glob("rank*.jsonl"):
        m = re.fullmatch(r"rank(\d+)\.jsonl", path.name)
        if m:
            out[int(m[1])] = collective_trace.read(path)
    return out


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


def diagnose_job_dir(job_dir: str | os.PathLike[str]) -> HangVerdict:
    """The :class:`HangVerdict` from what a runner job left on disk (``stacks/rank<R>.txt``, ``trace/``, ``ranks/``).

    Raises:
        ValueError: no saved stacks in ``job_dir``.
    """
    layout = JobDir(job_dir)
    stacks: dict[int, str | None] = {rank: path.read_text() for rank, path in layout.stacks().items()}
    if not stacks:
        raise ValueError(f"job_dir={str(layout.path)!r}: no stacks/rank<R>.txt in it")
    for rank in layout.rank_ids():
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


def diagnose_pid(pid: int) -> HangVerdict:
    """The :class:`HangVerdict` for a live job: py-spy every rank under launcher ``pid``, read their traces if they opted in.

    Raises:
        ValueError: no such ``pid``, or no rank process under it.
    """
    ranks = rank_processes(pid)
    if not ranks:
        raise ValueError(f"pid={pid}: no rank processes (with RANK in their environment) under it")
    stacks: dict[int, str | None] = {r: procs.py_spy_dump(p.pid) for r, p in ranks.items()}
    traces: dict[int, list[dict]] = {}
    for r, p in ranks.items():
        env = p.environ()
        directory = env.get(TRACE_DIR_ENV) or (JobDir(env[JOB_DIR_ENV]).trace_dir if env.get(JOB_DIR_ENV) else None)
        if directory and (Path(directory) / f"rank{r}.jsonl").exists():
            traces[r] = collective_trace.read(Path(directory) / f"rank{r}.jsonl")
    return diagnose(stacks, traces)


Verdict = HangVerdict
"""Old name of :class:`HangVerdict` (kept so existing callers keep working)."""
