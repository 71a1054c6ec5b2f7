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
import stat
from collections import Counter
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import psutil

from helpers import collective_trace, procs
from helpers.inputs import os_reason
from helpers.jobdir import FR_DIR_ENV, JOB_DIR_ENV, TRACE_DIR_ENV, JobDir

if TYPE_CHECKING:
    from helpers.jobs import JobResult
    from helpers.lint.python_rules import PythonLinter
    from helpers.slurm import SlurmClient

_LIBRARY = ("torch/", "site-packages/", "dist-packages/", "rankshim.py", "collective_trace.py", "threading.py",
            "runpy.py", "<frozen")
_COLLECTIVE_FILE = "distributed_c10d.py"
_DDP_FILE = "torch/nn/parallel/distributed.py"
_BACKWARD = ("torch/autograd/", "torch/_tensor.py")
_MAIN_STATUS = re.compile(r'^Thread \S+ \((?P<status>[a-z+]+)\): "MainThread"', re.MULTILINE)


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


def parse_frame(line: str) -> Frame | None:
    """One py-spy frame line, ``    func (file:line)``, as a :class:`Frame`; ``None`` for any other line.

    Linear in the line's length: the file part holds no parenthesis, so the frame's ``(`` is the line's last one
    and its ``:`` the last one inside it.  (The regular expression this replaces backtracked: a 100,000-character
    line took 52 s.)  Line numbers past 10 digits are not py-spy's and give ``None``.
    """
    body = line.rstrip()
    if not body.endswith(")") or not line[:1].isspace():
        return None
    open_at = body.rfind("(")
    if open_at < 2 or body[open_at - 1] != " ":
        return None
    file, colon, number = body[open_at + 1:-1].rpartition(":")
    func = body[:open_at - 1].lstrip()
    if not (colon and file and func) or ")" in file or not _LINE_NO.fullmatch(number):
        return None
    return Frame(func, file, int(number))


_LINE_NO = re.compile(r"\d{1,10}")


def parse_stack(text: str) -> list[Frame]:
    """The main thread's frames of a ``py-spy dump``, innermost first (empty if py-spy failed)."""
    frames: list[Frame] = []
    in_main = False
    for line in text.splitlines():
        if line.startswith("Thread "):
            in_main = '"MainThread"' in line
            continue
        if in_main and (frame := parse_frame(line)) is not None:
            frames.append(frame)
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
    active: bool | None = None  # py-spy's thread status of the main thread: True "active" (on the CPU), False "idle"
    source: str = "py-spy"  # where the stack came from: "py-spy" or "debug server" (torch.distributed.debug)

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
    status = _MAIN_STATUS.search(stack or "")
    state.active = status["status"].startswith("active") if status and status["status"] != "unknown" else None
    if (stack or "").startswith(DEBUG_SERVER_MARK):
        state.source = "debug server"
    user = next((f for f in frames if not any(lib in f.file for lib in _LIBRARY)), None)
    coll = next((f for f in frames if f.file.endswith(_COLLECTIVE_FILE)), None)
    if coll is not None:
        state.collective = coll.func
    elif any(f.file.endswith(_DDP_FILE) and "broadcast" in f.func for f in frames):
        state.collective = "broadcast (DDP buffers)"  # DDP's forward broadcasts buffers (dist._broadcast_coalesced, C++)
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


KINDS: dict[str, str] = {
    "not entered": "a rank never entered the collective (or enters late): it is stuck, blocked or dead elsewhere",
    "mismatch": "the ranks called different collectives (ops, sizes or roots) at the same position",
    "network": "every rank is inside the same collective: the script agrees, the transport, a node or a peer "
               "outside the job does not",
    "busy": "a rank is busy computing outside any collective (py-spy: its main thread is active)",
    "after return": "no rank is inside a collective: every collective entered has returned (or none was entered "
                    "yet), the stall is outside them",
}
"""The class of a hang verdict (:attr:`HangVerdict.kind`) -> what it means.  The classes follow the hang analysers
that class what they find, e.g. nvidia-resiliency-ext's Flight Recorder attribution (the ranks missing at the
collective where the process group diverges: https://github.com/NVIDIA/nvidia-resiliency-ext,
``attribution/trace_analyzer/fr_attribution.py``): ``not entered``, ``mismatch`` and ``busy`` are bugs in the script
(or its data), ``network`` is for the node and the network, ``after return`` is a wait outside the collectives (a
lock, I/O, a data loader).  A verdict's class is :func:`classify`'s, its next step :func:`next_action`'s."""

HANG_RULES = ("rank-gated-collective", "rank-early-exit-collective", "rank-sliced-data")
"""The ``runbook lint`` rules (:data:`helpers.lint.RULES`) that catch, before launch, a rank that skips or adds a
collective: the next action of a ``mismatch`` or ``not entered`` verdict names the ones that flag the script."""


@dataclass
class HangVerdict:
    """The doctor's conclusion.

    Attributes:
        collective: the op most ranks wait in (``None`` if none waits); seq: its sequence number
            (from traces); site: the line that called it.
        waiting: ranks blocked in that collective; diverged: ranks not in it (the suspects).  When a two-sided tie
            is ``undecided`` both are empty and :attr:`tied` holds the sides: the verdict names no rank.
        states: every rank's :class:`RankState`; text: the printed verdict.
        evidence: what named the diverged rank(s): ``majority`` (more ranks on the other side), ``rank branch``
            (the rank's call chain passes a rank-dependent ``if`` in the source: ``runbook lint``'s taint pass),
            ``call-site count`` (collective trace), ``loop exit`` (its stack is past the end of a loop the other
            side is still in), ``new op`` (Flight Recorder: the rank's op never occurred earlier on the group while
            the other side's continues the pattern), ``pattern`` (its op breaks the repeating pattern of the group's
            history), ``behind`` (fewer collectives entered), ``no dump``, or ``undecided``.
        group: the process group of a Flight Recorder verdict (``'0'`` = default), else ``None``.
        kind: the class of the hang, a key of :data:`KINDS` (``""`` when no rank is known).
        action: the next step for that class: the ``runbook lint`` rule that flags the script, or the node checks.
        tied: the two sides of an ``undecided`` tie (each a list of ranks), else empty.
        also: evidence beyond the deciding one, ``name -> ranks it names`` (agreeing or not).
    """

    collective: str | None
    seq: int | None
    site: str | None
    waiting: list[int]
    diverged: list[int]
    states: dict[int, RankState]
    text: str = ""
    evidence: str = ""
    group: str | None = None  # Flight Recorder process group of the verdict ('0' = default)
    kind: str = ""
    action: str = ""
    tied: list[list[int]] = field(default_factory=list)
    also: dict[str, list[int]] = field(default_factory=dict)


def diagnose(stacks: Mapping[int, str | None], traces: Mapping[int, Sequence[dict]] | None = None,
             root: str | os.PathLike[str] | None = None) -> HangVerdict:
    """Name the diverged rank(s) from per-rank stacks (py-spy text; ``None`` = rank not running) and traces.

    The collective that the most live ranks wait in, with the same sequence number when traces
    exist, is "the collective"; every other rank diverged.  Two equal sides are decided by
    :func:`break_tie` (the source's rank-dependent branches and loops, the traces' call sites); when nothing
    separates them the verdict is ``undecided``, names no rank, and says what to collect.  When all ranks wait
    in the same collective, nobody diverged here: the peer that is missing is outside the job (another node) or
    the transport is broken.  ``root`` is where relative source paths of the stacks are looked up.

    Raises:
        ValueError: ``stacks`` is empty.
    """
    if not stacks:
        raise ValueError("stacks: need at least one rank's stack")
    traces = traces or {}
    sources = _Sources(root)
    states = {r: rank_state(r, stacks[r], traces.get(r, ())) for r in sorted(stacks)}
    groups = Counter((s.collective, s.seq) for s in states.values() if s.collective)
    if not groups:
        text = "verdict: no rank is in a collective; " + "; ".join(s.describe() for s in states.values())
        v = HangVerdict(None, None, None, [], sorted(states), states, text)
        return _finish(v, sources, after_return=any(s.alive for s in states.values()))
    best = max(groups.values())
    tied = [key for key, n in groups.items() if n == best]
    key = min(tied, key=lambda k: min(r for r, s in states.items() if (s.collective, s.seq) == k))
    evidence, found = "majority", []
    if len(tied) > 1:
        sides = {k: [r for r, s in states.items() if (s.collective, s.seq) == k] for k in tied}
        counts = {r: Counter(rec.get("site") for rec in traces.get(r, ()) if rec.get("phase") == "enter") for r in states}
        found = tie_evidence(sides, states, site_counts=counts if any(counts.values()) else None, sources=sources)
        if found and len(tied) == 2:
            evidence = found[0][0]
            key = next(k for k in tied if k != found[0][1])
        else:
            evidence = "undecided"
            v = HangVerdict(None, None, None, [], [], states, "", evidence, tied=[sides[k] for k in tied])
            v.text = _undecided_text(v, [f"{k[0]}" + (f" #{k[1]}" if k[1] is not None else "") for k in tied],
                                     have_trace=bool(traces), have_fr=False, sources=sources)
            return _finish(v, sources)
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
            text += _decided_text(evidence, found, {k: [r for r, s in states.items() if (s.collective, s.seq) == k]
                                                    for k in tied})
    if len(sites) > 1:
        text += ("\n  note: the waiting ranks reached it from different lines "
                 + ", ".join(f"rank {r}: {states[r].call_site}" for r in waiting)
                 + ": one collective reached by different code paths pairs calls that do not belong together (D21)")
    sides = {k: [r for r, s in states.items() if (s.collective, s.seq) == k] for k in tied}
    v = HangVerdict(op, seq, site, waiting, diverged, states, text, evidence,
                    also={name: sides[g] for name, g, _ in found[1:]})
    return _finish(v, sources, mismatch=any(states[r].collective for r in diverged))


_EVIDENCE = {
    "rank branch": "its call chain passes a rank-dependent branch of the source; the other side's does not",
    "new op": "its op never occurred earlier on this group; the other side's continues the pattern",
    "pattern": "its op breaks the repeating pattern of the collectives before; the other side's continues it",
    "call-site count": "it entered collectives at a call site the other side never used (collective trace)",
    "loop exit": "its stack is past the end of a loop the other side is still in: it ran fewer iterations",
    "majority": "more ranks are on the other side",
    "undecided": "nothing separates the ranks",
}


def _decided_text(evidence: str, found: Sequence[tuple[str, object, str]], sides: Mapping[object, Sequence[int]]) -> str:
    """``decided by: ...`` and the other evidence found, each with the ranks it names (agreeing or not)."""
    guilty = found[0][1] if found else None
    text = f"\n  decided by: {evidence} ({_EVIDENCE[evidence]})" + (f": {found[0][2]}" if found and found[0][2] else "")
    for name, g, detail in found[1:]:
        agree = "agrees" if g == guilty else f"DISAGREES (names ranks {list(sides.get(g, []))})"
        text += f"\n  also: {name} {agree}" + (f": {detail}" if detail else "")
    return text


def _undecided_text(v: HangVerdict, labels: Sequence[str], have_trace: bool, have_fr: bool, sources: _Sources,
                    prefix: str = "verdict") -> str:
    """The verdict line of an undecided tie: no rank named, and what to collect to decide."""
    sides = " and ".join(f"ranks {side} in {lab}" for side, lab in zip(v.tied, labels, strict=False))
    want = []
    if not any(s.frames for s in v.states.values()):
        want.append("every rank's Python stack (py-spy dump --pid, or `runbook doctor --pid` on the node)")
    missing = sorted({f for f in sources.unread})
    if missing:
        want.append("the source files on the stacks, readable here (not found or not a regular file: "
                    + ", ".join(missing[:3]) + "; `runbook doctor --job-dir` from the job's working directory)")
    if not have_fr:
        want.append("the Flight Recorder dumps (TORCH_FR_BUFFER_SIZE=2000 in the job; `runbook doctor --fr-dir`)")
    if not have_trace:
        want.append("the collective trace (helpers.collective_trace.enable() in the script: the call site of every "
                    "collective)")
    want.append("a rerun with TORCH_DISTRIBUTED_DEBUG=DETAIL (the first mismatching collective fails at once, naming "
                "the op of every rank)")
    return (f"{prefix}: undecided: two equal sides, {sides}, and nothing separates them, so no rank is named."
            "\n  to decide, collect: " + "; ".join(want))


class _Sources:
    """The source files named by stack frames, each parsed once by ``runbook lint``'s Python linter.

    A frame's file is read under ``root`` (when given), else from its path, else under this project; only a regular file of at
    most :data:`SOURCE_MAX_BYTES` is read (opened non-blocking, checked with ``fstat`` on the open descriptor: a
    frame naming a FIFO or a device cannot block the doctor, a huge file cannot exhaust it).
    """

    def __init__(self, root: str | os.PathLike[str] | None = None) -> None:
        self.root = Path(root) if root is not None else None
        self.linters: dict[str, PythonLinter | None] = {}
        self.texts: dict[str, tuple[str, str]] = {}
        self.unread: set[str] = set()

    def linter(self, file: str) -> PythonLinter | None:
        """The linter of ``file`` (a frame's path), or ``None`` when it cannot be read or parsed."""
        from helpers.lint.python_rules import PythonLinter

        if file not in self.linters:
            self.linters[file] = None
            cands = ([self.root / file] if self.root else []) + [Path(file), Path(__file__).resolve().parent.parent / file]
            for cand in cands:
                text = read_source(cand)
                if text is None:
                    continue
                try:
                    self.linters[file] = PythonLinter(str(cand), text)
                    self.texts[file] = (str(cand), text)
                    break
                except (SyntaxError, ValueError, RecursionError):
                    continue
            if self.linters[file] is None:
                self.unread.add(file)
        return self.linters[file]


SOURCE_MAX_BYTES = 4 * 1024 * 1024
"""The largest source file the doctor reads for a stack frame (4 MiB; the largest module of torch 2.13 is under 1 MiB)."""


def read_source(path: str | os.PathLike[str], max_bytes: int = SOURCE_MAX_BYTES) -> str | None:
    """The text of ``path`` if it is a regular file of at most ``max_bytes`` bytes of UTF-8, else ``None``.

    Opened with ``O_NONBLOCK`` and checked with ``fstat`` on the descriptor (not the name), so a FIFO, a device or
    a file swapped for one after a check never blocks; never raises for an unreadable path.
    """
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_NOCTTY", 0))
    except (OSError, ValueError):
        return None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) or info.st_size > max_bytes:
            return None
        chunks, got = [], 0
        while got <= max_bytes:
            chunk = os.read(fd, min(1 << 20, max_bytes + 1 - got))
            if not chunk:
                break
            chunks.append(chunk)
            got += len(chunk)
        if got > max_bytes:
            return None
        return b"".join(chunks).decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    finally:
        os.close(fd)


def _user_frames(frames: Sequence[Frame]) -> list[Frame]:
    return [f for f in frames if not any(lib in f.file for lib in _LIBRARY)]


def rank_branches(frames: Sequence[Frame], root: str | os.PathLike[str] | None = None,
                  sources: _Sources | None = None) -> list[str]:
    """The rank-dependent branches on a rank's user call chain: ``file:line`` of each ``if rank ...`` that guards a frame.

    Uses ``runbook lint``'s rank-taint pass (:meth:`helpers.lint.python_rules.PythonLinter.rank_branch_at`) on each
    user frame's source file (read from ``frame.file``, or under ``root`` when that path is relative; regular files of
    at most :data:`SOURCE_MAX_BYTES` only, see :func:`read_source`).  Unreadable sources are skipped.
    """
    sources = sources or _Sources(root)
    found = []
    for f in _user_frames(frames):
        lint = sources.linter(f.file)
        gate = lint.rank_branch_at(f.line) if lint else None
        if gate is not None:
            found.append(f"{os.path.basename(f.file)}:{gate}")
    return found


def _singled_arms(frames: Sequence[Frame], sources: _Sources) -> list[str]:
    """``file:line (`test`)`` of each rank-dependent ``if`` on the call chain whose arm the frame is in singles out
    ranks: the body of an equality (``rank == 0``, ``rank in (...)``, a flag like ``is_main_process``) or the ``else``
    of an inequality.  An adapter over ``runbook lint``'s :meth:`~helpers.lint.python_rules.PythonLinter.rank_branch_at`
    (which gives the gate's line, not the arm)."""
    import ast

    out = []
    for f in _user_frames(frames):
        lint = sources.linter(f.file)
        gate = lint.rank_branch_at(f.line) if lint else None
        node = next((n for n in lint.nodes if isinstance(n, ast.If) and n.lineno == gate), None) if gate else None
        if node is None or not node.body:
            continue
        in_body = node.body[0].lineno <= f.line <= (node.body[-1].end_lineno or node.body[-1].lineno)
        eq = _singles_out(node.test, lint)
        if eq is not None and eq == in_body:
            out.append(f"{os.path.basename(f.file)}:{gate} (`{ast.unparse(node.test)[:50]}`)")
    return out


def _singles_out(test: object, lint: object) -> bool | None:
    """True when ``test`` holds for a few ranks (``rank == k``, ``rank in (...)``, a rank flag), False when it holds for
    all but a few (``!=``, ``not in``, ``not flag``), None when it cannot be told (``rank < k``)."""
    import ast

    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _singles_out(test.operand, lint)
        return None if inner is None else not inner
    if isinstance(test, ast.BoolOp):
        parts = [_singles_out(v, lint) for v in test.values if lint.taint.rank_test(v)]  # type: ignore[attr-defined]
        if parts and all(p is not None for p in parts) and len(set(parts)) == 1:
            return parts[0]  # `rank == 0 or rank == 1` singles out as `rank == 0` does; `!= ... and != ...` the reverse
        return None
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        op = test.ops[0]
        if isinstance(op, (ast.Eq, ast.In, ast.Is)):
            return True
        if isinstance(op, (ast.NotEq, ast.NotIn, ast.IsNot)):
            return False
        return None
    if isinstance(test, (ast.Name, ast.Attribute, ast.Call)):
        return True
    return None


def loop_exit(inside: Sequence[Frame], past: Sequence[Frame], sources: _Sources | None = None) -> str | None:
    """If ``past``'s stack is beyond the end of a loop that ``inside``'s stack is still in, describe that loop; else ``None``.

    The two stacks are compared at their innermost common user function (same file and function name): ``inside``'s
    line lies in a ``for``/``while`` loop of that function and ``past``'s line comes after the loop's last line, so
    ``past`` left the loop with fewer iterations (a ``break``/``continue``, or less data).  The loop's rank-dependent
    exits (``runbook lint``'s taint pass) are named when there are any.  Loops read with :mod:`ast` from the source
    the lint parsed.
    """
    import ast

    sources = sources or _Sources()
    outer = {(f.file, f.func): f for f in reversed(_user_frames(past))}
    common = next(((f, outer[(f.file, f.func)]) for f in _user_frames(inside) if (f.file, f.func) in outer), None)
    if common is None or common[0].line == common[1].line:
        return None
    fa, fb = common
    lint = sources.linter(fa.file)
    if lint is None:
        return None
    loops = [n for n in lint.nodes if isinstance(n, (ast.For, ast.While, ast.AsyncFor))
             and n.lineno <= fa.line <= (n.end_lineno or n.lineno) and fb.line > (n.end_lineno or n.lineno)]
    if not loops:
        return None
    loop = max(loops, key=lambda n: n.lineno)  # the innermost loop that one stack is in and the other is past
    fn = next((n for n in lint.nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
               and n.lineno <= loop.lineno and (n.end_lineno or 0) >= fb.line), None)
    if fn is None and fa.func != "<module>":
        return None
    exits = [n.lineno for n in ast.walk(loop) if isinstance(n, ast.If) and lint.taint.rank_test(n.test)
             and any(isinstance(s, (ast.Break, ast.Continue, ast.Return)) for s in ast.walk(n))]
    name = os.path.basename(fa.file)
    text = f"the loop at {name}:{loop.lineno} (one side at line {fa.line}, in it; the other at line {fb.line}, past it)"
    if exits:
        text += "; rank-dependent exit(s) in the loop: " + ", ".join(f"{name}:{x}" for x in exits)
    return text


def tie_evidence(sides: Mapping[object, Sequence[int]], states: Mapping[int, RankState],
                 history: Mapping[str, int] | None = None, ops: Mapping[object, str] | None = None,
                 expected: str | None = None, site_counts: Mapping[int, Mapping[str, int]] | None = None,
                 sources: _Sources | None = None) -> list[tuple[str, object, str]]:
    """Every piece of evidence that separates two equal sides of a hang, strongest first: ``(name, guilty side, detail)``.

    In order: ``rank branch`` (exactly one side's call chains pass a rank-dependent branch: :func:`rank_branches`);
    ``call-site count`` (collective traces, ``site_counts``: rank -> call site -> collectives entered there: exactly
    one side entered collectives at a call site the other never used); ``loop exit`` (one side's stacks are past the
    end of a loop the other side's are still in: :func:`loop_exit`); ``new op`` (Flight Recorder: with ``history``,
    op -> how often it occurred earlier on the group, and ``ops``, side -> op: exactly one side's op never occurred
    before); ``pattern`` (``expected``, the op the history's repeating pattern predicts,
    :func:`helpers.flight_recorder.expected_next`: exactly one side's op differs from it).  Empty unless there are
    exactly two sides, or when nothing separates them.
    """
    keys = list(sides)
    if len(keys) != 2:
        return []
    sources = sources or _Sources()
    out: list[tuple[str, object, str]] = []
    a, b = keys
    gates = {k: {r: rank_branches(states[r].frames, sources=sources) for r in sides[k] if r in states} for k in keys}
    gated = {k: any(gates[k].values()) for k in keys}
    if gated[a] != gated[b]:
        k = a if gated[a] else b
        out.append(("rank branch", k, "; ".join(f"rank {r} passes {', '.join(g)}" for r, g in gates[k].items() if g)))
    elif gated[a] and gated[b]:  # both sides inside rank-dependent branches: the arm that singles out a rank
        arms = {k: {r: [x for x in _singled_arms(states[r].frames, sources)] for r in sides[k] if r in states} for k in keys}
        single = {k: any(arms[k].values()) for k in keys}
        if single[a] != single[b]:
            k = a if single[a] else b
            out.append(("rank branch", k, "; ".join(f"rank {r} takes the arm of {', '.join(x)} that singles out a rank, "
                                                    "the other side the other arm" for r, x in arms[k].items() if x)))
    if site_counts:
        seen = {k: set().union(*(set(site_counts.get(r, {})) for r in sides[k])) for k in keys}
        only = {a: seen[a] - seen[b], b: seen[b] - seen[a]}
        if bool(only[a]) != bool(only[b]):
            k = a if only[a] else b
            out.append(("call-site count", k, f"ranks {list(sides[k])} used {', '.join(sorted(map(str, only[k])))}"))
    past = {}
    for k, o in ((a, b), (b, a)):
        for r in sides[k]:
            for q in sides[o]:
                if r in states and q in states and states[r].frames and states[q].frames:
                    hit = loop_exit(states[q].frames, states[r].frames, sources)
                    if hit:
                        past.setdefault(k, f"rank {r} is past {hit.replace('one side', f'rank {q}', 1).replace('the other', f'rank {r}', 1)}")
    if len(past) == 1:
        k = next(iter(past))
        out.append(("loop exit", k, past[k]))
    if history is not None and ops is not None:
        new = {k: history.get(ops[k], 0) == 0 for k in keys}
        if new[a] != new[b]:
            k = a if new[a] else b
            out.append(("new op", k, f"{ops[k]} never occurred earlier on the group; {ops[a if k == b else b]} did "
                                     f"{history.get(ops[a if k == b else b], 0)} time(s)"))
    if expected is not None and ops is not None:
        breaks = {k: ops[k] != expected for k in keys}
        if breaks[a] != breaks[b]:
            k = a if breaks[a] else b
            out.append(("pattern", k, f"the history's repeating pattern predicts {expected}"))
    return out


def break_tie(sides: Mapping[object, Sequence[int]], states: Mapping[int, RankState],
              history: Mapping[str, int] | None = None, ops: Mapping[object, str] | None = None,
              expected: str | None = None, site_counts: Mapping[int, Mapping[str, int]] | None = None,
              sources: _Sources | None = None) -> tuple[object | None, str]:
    """Decide which of two equal sides of a hang holds the bug; return ``(guilty side key or None, evidence)``.

    The strongest item of :func:`tie_evidence` decides; ``(None, "undecided")`` when there is none (or more than
    two sides).
    """
    found = tie_evidence(sides, states, history, ops, expected, site_counts, sources)
    return (found[0][1], found[0][0]) if found else (None, "undecided")


def classify(states: Mapping[int, RankState], diverged: Sequence[int], *, mismatch: bool = False,
             after_return: bool = False) -> str:
    """The class of a hang (a key of :data:`KINDS`) from where the ranks are.

    ``mismatch``: a diverged rank entered a different collective (op, sizes or root) at the position the others
    wait at; ``after_return``: no rank is inside a collective (stacks; or every Flight Recorder entry completed).
    Otherwise with no diverged rank, ``network``; a diverged rank whose main thread py-spy saw ``active``,
    ``busy``; else ``not entered`` (idle in user code, blocked, dead, or no stack).
    """
    if after_return:
        return "after return"
    if not diverged:
        return "network"
    if mismatch:
        return "mismatch"
    if any(states[r].alive and states[r].active and not states[r].collective for r in diverged if r in states):
        return "busy"
    return "not entered"


def next_action(kind: str, states: Mapping[int, RankState], diverged: Sequence[int], sources: _Sources | None = None,
                waiting: Sequence[int] = ()) -> str:
    """The next step for a verdict of class ``kind``: the ``runbook lint`` rule that flags the script, or the node checks.

    For ``mismatch`` and ``not entered`` the Python files on the ranks' stacks are linted
    (:func:`helpers.lint.python_rules.lint_python`) and the :data:`HANG_RULES` findings on a line of a stack, or in a
    function on the stacks before its last stack line, are named; without a readable source, the rules to run.
    ``network`` points at the allocation check (``runbook diagnose``, notebook 00) and the network pre-flight
    (``runbook preflight``); ``busy`` and ``after return`` at the line and the known waits (:data:`KNOWN_WAITS`).
    """
    sources = sources or _Sources()
    dead = [r for r in diverged if r in states and not states[r].alive]
    waits = "".join(known_wait(states[r].frames) for r in states)
    if kind == "network":
        who = f"rank(s) {sorted(waiting)}" if waiting else "every rank"
        return (f"next: check the node(s) of {who} and the links between them: `runbook diagnose` (the allocation "
                "check, notebook 00: GPUs, NCCL tests, JIT locks) on each, `runbook preflight --nodes ...` across "
                "them (interfaces, MTU, master reachability); a missing rank: its node's log and `scontrol show job`")
    if kind == "after return":
        return ("next: no collective is pending; the ranks wait on something else (a lock, I/O, a data loader, "
                "a subprocess): read each rank's innermost frames" + (f"{waits}" if waits else
                                                                      "; `runbook diagnose` checks the node's locks"))
    if kind == "busy":
        return ("next: take a second look in a few seconds (`runbook doctor` again): a busy rank's stack moves, a hung "
                "one's does not; if it is legitimate work, count it in the heartbeat and raise the collective timeout "
                "(init_process_group(timeout=...)); keep collectives out of rank-0-only code (rank-gated-collective)")
    hits = _lint_hits(states, sources)
    parts = []
    if dead:
        parts.append(f"rank(s) {dead} exited: read their own error first (torchrun's Root Cause; wrap main in "
                     "torchelastic's @record), then why the others waited")
    if waits:
        parts.append(waits.lstrip("; "))
    idle = [r for r in diverged if r in states and states[r].alive and states[r].frames and not states[r].collective]
    if kind == "not entered" and idle and not waits:
        parts.append(f"rank(s) {idle} wait outside any collective at the line above: if a second look (`runbook doctor` "
                     "again) finds the stack moved, it is slow, not hung (D23: count that work in the heartbeat)")
    if hits:
        parts.append("`runbook lint` flags it before launch: " + "; ".join(hits))
    elif sources.linters and any(sources.linters.values()):
        parts.append("no `runbook lint` rule of this class (" + ", ".join(HANG_RULES) + ") flags a line on the stacks of "
                     + ", ".join(sorted({os.path.basename(f) for f, lt in sources.linters.items() if lt})))
    else:
        parts.append("run `runbook lint` on the script: " + ", ".join(HANG_RULES) + " catch this class before launch")
    return "next: " + "; ".join(parts)


def _lint_hits(states: Mapping[int, RankState], sources: _Sources, limit: int = 3) -> list[str]:
    """``rule at file:line`` of the :data:`HANG_RULES` findings relevant to the stacks: on a line of a stack first,
    else on a line that assigns data a loop on the stacks iterates (``rank-sliced-data``: the loop that one rank
    leaves early)."""
    import ast

    from helpers.lint import contract_rules
    from helpers.lint.python_rules import lint_python

    lines: dict[str, set[int]] = {}
    for st in states.values():
        for f in _user_frames(st.frames):
            lines.setdefault(f.file, set()).add(f.line)
    exact, feeds = [], []
    for file in lines:
        lint = sources.linter(file)
        if lint is None:
            continue
        path, text = sources.texts[file]
        findings, _facts = lint_python(path, text, (contract_rules.run,))
        loops = [n for n in lint.nodes if isinstance(n, (ast.For, ast.AsyncFor))
                 and any(n.lineno <= x <= (n.end_lineno or n.lineno) for x in lines[file])]
        fed = _assignment_lines({x.id for n in loops for x in ast.walk(n.iter) if isinstance(x, ast.Name)}, lint)
        for fnd in findings:
            if fnd.id in HANG_RULES:
                hit = f"{fnd.id} at {os.path.basename(file)}:{fnd.line_no}"
                (exact if fnd.line_no in lines[file] else feeds if fnd.line_no in fed else []).append(hit)
    return (exact + feeds)[:limit]


def _assignment_lines(names: set[str], lint: object, depth: int = 3) -> set[int]:
    """Lines of the assignments of ``names`` and, ``depth`` levels back, of the names their values use."""
    import ast

    found: set[int] = set()
    for _ in range(depth):
        more: set[str] = set()
        for n in lint.nodes:  # type: ignore[attr-defined]
            if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id in names for t in n.targets):
                if n.lineno not in found:
                    found.add(n.lineno)
                    more |= {x.id for x in ast.walk(n.value) if isinstance(x, ast.Name)}
        names = more
    return found


def _finish(v: HangVerdict, sources: _Sources, *, mismatch: bool = False, after_return: bool = False) -> HangVerdict:
    """Class the verdict, add its next action, and append both to its text."""
    if v.evidence == "undecided" and v.tied:
        v.kind = "mismatch" if all(any(v.states[r].collective for r in side) for side in v.tied) else "not entered"
    elif v.text.startswith("verdict (Flight Recorder): the Flight Recorder dumps hold no collective"):
        return v
    else:
        v.kind = classify(v.states, v.diverged, mismatch=mismatch, after_return=after_return)
    v.action = next_action(v.kind, v.states, v.diverged, sources, v.waiting)
    served = [r for r, st in v.states.items() if st.source == "debug server"]
    if served:
        v.text += f"\n  note: the stacks of rank(s) {served} come from torch.distributed.debug's server (py-spy gave none)"
    v.text += f"\n  class: {v.kind} ({KINDS[v.kind]})\n  {v.action}"
    return v


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
    user = _user_frames(state.frames)
    if not user:
        return f"at {state.call_site}" if state.call_site else "(no stack)"
    text = f"in {user[0].func.split('.')[-1]}() at {user[0].site}"
    if len(user) > 1:
        text += f" called from {user[1].func.split('.')[-1]}() at {user[1].site}"
    return text


def diagnose_fr(dumps: Mapping[int, Mapping], stacks: Mapping[int, str | None] | None = None,
                world_size: int | None = None, root: str | os.PathLike[str] | None = None) -> HangVerdict:
    """Name the diverged rank(s) from Flight Recorder dumps (:mod:`helpers.flight_recorder`), with stacks if given.

    Per process group the ranks are aligned by ``collective_seq_id``.  The group where ranks first entered
    different ops (possibly long before the hang) decides; else the group where some ranks are behind
    (entered fewer collectives: stuck elsewhere or dead); else every rank waits in the same collective (or, when
    every rank's last entry completed, none does: ``after return``).  Among different ops, the op of most ranks is
    "the collective"; a two-sided tie is decided by :func:`tie_evidence` (the stacks' source first, then the
    dumps' history); with nothing to separate the sides the verdict is ``undecided`` and names no rank.  Ranks of
    ``world_size`` (or of the stacks) without a dump count as diverged.  Stacks (py-spy text) add where each rank
    is: the line, and for a rank outside any collective its function and caller.

    Args:
        dumps: rank -> dump; stacks: rank -> py-spy text (``None``: not running); world_size: ranks of the job;
        root: where relative source paths of the stacks are looked up.

    Raises:
        ValueError: ``dumps`` is empty.
    """
    from helpers import flight_recorder as fr

    groups = fr.align(dumps)
    stacks = dict(stacks or {})
    sources = _Sources(root)
    ranks = sorted(set(dumps) | set(stacks) | set(range(world_size or 0)))
    states = {r: rank_state(r, stacks.get(r)) if r in stacks else RankState(r) for r in ranks}
    no_dump = [r for r in ranks if r not in dumps]
    pick = next((g for g in groups if g.diverge_seq is not None), None) or next((g for g in groups if g.behind), None) \
        or (groups[0] if groups else None)
    if pick is None:
        text = "verdict (Flight Recorder): the Flight Recorder dumps hold no collective"
        return HangVerdict(None, None, None, [], no_dump, states, text, "no dump")
    label = f"group {pick.group}" + (f" ({pick.desc})" if pick.desc else "")
    evidence, found = "majority", []
    after_return = False
    if pick.diverge_seq is not None:
        seq = pick.diverge_seq
        sides: dict[str, list[int]] = {}
        for r, op in sorted(pick.ops_at.items()):
            sides.setdefault(op, []).append(r)
        best = max(len(v) for v in sides.values())
        top = [op for op, rs in sides.items() if len(rs) == best]
        op = top[0] if len(top) == 1 else min(top, key=lambda o: min(sides[o]))
        if len(top) == 2:
            found = tie_evidence({o: sides[o] for o in top}, states, pick.history, {o: o for o in top}, pick.expected,
                                 sources=sources)
            if found:
                evidence = found[0][0]
                op = next(o for o in top if o != found[0][1])
            else:
                v = HangVerdict(None, seq, None, [], [], states, "", "undecided", pick.group, tied=[sides[o] for o in top])
                v.text = _undecided_text(v, [f"{o} (collective #{seq} on {label})" for o in top],
                                         have_trace=False, have_fr=True, sources=sources, prefix="verdict (Flight Recorder)")
                return _finish(v, sources)
        elif len(top) > 2:
            evidence = "undecided"
            v = HangVerdict(None, seq, None, [], [], states, "", evidence, pick.group, tied=[sides[o] for o in top])
            v.text = _undecided_text(v, [f"{o} (collective #{seq} on {label})" for o in top], have_trace=False,
                                     have_fr=True, sources=sources, prefix="verdict (Flight Recorder)")
            return _finish(v, sources)
        waiting = sides[op]
        diverged = sorted({r for r in pick.ops_at if r not in waiting} | set(no_dump))
        detail = [f"rank {r} entered {pick.ops_at[r]} as #{seq} on {label}" for r in diverged if r in pick.ops_at]
    else:
        seq = max(pick.last.values())
        behind = pick.behind
        waiting = [r for r, s in pick.last.items() if s == seq]
        diverged = sorted(set(behind) | set(no_dump))
        evidence = "behind" if behind else ("no dump" if no_dump else "majority")
        op = next((e.op for e in fr.entries_by_group(dumps[waiting[0]]).get(pick.group, []) if e.seq == seq), "?") if waiting else "?"
        detail = [f"rank {r} stopped after #{pick.last[r]} on {label}" for r in diverged if r in pick.last]
        after_return = not diverged and all(_completed(dumps[r], pick.group, seq) for r in waiting)
    detail += [f"rank {r}: no Flight Recorder dump (dead, or no dump requested)" for r in no_dump]
    for r in diverged:
        st = states.get(r)
        if st is not None and st.frames:
            where = (f"waits in {st.collective} {_where(st)}" if st.collective else f"is in no collective: {_where(st)}")
            detail.append(f"  rank {r} (stack) {where}")
    site = Counter(states[r].call_site for r in waiting if states[r].call_site).most_common(1)
    site_s = site[0][0] if site else None
    at = f" called at {site_s}" if site_s else ""
    if not diverged and after_return:
        text = (f"verdict (Flight Recorder): all {len(waiting)} ranks completed {op} #{seq} on {label}{at}, their last "
                "collective: no rank of this job diverged and none is inside a collective")
    elif not diverged:
        text = (f"verdict (Flight Recorder): all {len(waiting)} ranks entered {op} #{seq} on {label}{at}: no rank of this "
                "job diverged; the peer that never arrives is elsewhere or the transport is stuck")
    else:
        text = (f"verdict (Flight Recorder): rank(s) {diverged} diverged. Ranks {waiting} entered {op} (collective #{seq} "
                f"on {label}){at}.\n" + "\n".join("  " + d for d in detail))
        if found:
            text += _decided_text(evidence, found, sides)
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
    v = HangVerdict(op, seq, site_s, waiting, diverged, states, text, evidence, pick.group,
                    also={name: list(sides[g]) for name, g, _ in found[1:]} if found else {})
    return _finish(v, sources, mismatch=pick.diverge_seq is not None, after_return=after_return)


def _completed(dump: Mapping, group: str, seq: int) -> bool:
    """Whether ``dump``'s entry ``seq`` of ``group`` finished: torch marks an entry ``retired`` (gloo) or its state
    ``completed`` (NCCL) when its work ended (``FlightRecorder.hpp``); ``pg_status``'s ``last_completed_collective``
    says the same per group."""
    status = (dump.get("pg_status") or {}).get(group)
    if isinstance(status, Mapping) and isinstance(status.get("last_completed_collective"), int):
        if status["last_completed_collective"] >= seq:
            return True
    for e in dump.get("entries", []):
        if isinstance(e, Mapping) and e.get("collective_seq_id") == seq and str((e.get("process_group") or [""])[0]) == group:
            return bool(e.get("retired")) or e.get("state") == "completed"
    return False


def read_traces(directory: str | os.PathLike[str]) -> dict[int, list[dict]]:
    """Every ``rank<R>.jsonl`` of a trace directory, by rank (empty if the directory is missing).

    Raises:
        ValueError: a trace file cannot be read or holds a bad record (:func:`helpers.collective_trace.read`); every
            such file is named, one line each, after all were tried.
    """
    out: dict[int, list[dict]] = {}
    problems: list[str] = []
    for path in sorted(Path(directory).glob("rank*.jsonl")):
        m = re.fullmatch(r"rank([0-9]{1,9})\.jsonl", path.name)
        if m:
            try:
                out[int(m[1])] = collective_trace.read(path)
            except ValueError as exc:
                problems.append(str(exc))
    if problems:
        raise ValueError("\n".join(problems))
    return out


def read_stacks(paths: Mapping[int, str | os.PathLike[str]]) -> dict[int, str]:
    """The saved py-spy stacks (rank -> file, :meth:`helpers.jobdir.JobDir.stacks`) as text, by rank.

    Each file is read through :mod:`helpers.inputs` (a regular file, bounded; a directory, FIFO, device, link loop
    or unreadable file is refused).  A rank whose stack cannot be read is not guessed at (taking it as "not
    running" would blame it), so every bad file is reported together.

    Raises:
        ValueError: one line per stack file that could not be read, naming it.
    """
    from helpers import inputs

    by_path = {os.fspath(p): r for r, p in paths.items()}
    good, bad = inputs.read_each(sorted(by_path), lambda p: inputs.read_text(p, errors="replace"))
    if bad:
        raise ValueError("\n".join(str(e) for e in bad))
    return {by_path[p]: text for p, text in good}


def load_fr(directory: str | os.PathLike[str], world_size: int | None = None) -> dict[int, dict]:
    """The Flight Recorder dumps of a folder by rank (``<job>/fr``: the ranks' own dumps; else its ``nccl/``: NCCL's dump on timeout).

    Raises:
        helpers.flight_recorder.DumpError: (a ``ValueError``) no dump, an unreadable one, or dumps of different jobs, naming the file.
    """
    from helpers import flight_recorder as fr

    d = Path(directory)
    nccl = d / "nccl"
    try:
        if d.is_dir() and nccl.is_dir() and not any(fr.rank_of(p) is not None for p in d.iterdir() if p.is_file()
                                                     and not p.name.endswith(".ready")) and any(nccl.iterdir()):
            d = nccl
    except OSError as exc:
        raise fr.DumpError(f"{exc.filename or d}: cannot list the folder: {os_reason(exc)}") from None
    return fr.load_dir(d, world_size=world_size)


def _has_dumps(directory: Path) -> bool:
    """Whether ``directory`` holds a ``rank<R>`` file; true when it cannot be listed (:func:`load_fr` then says why)."""
    try:
        return directory.is_dir() and any(p.is_file() and re.fullmatch(r"rank\d+", p.name) for p in directory.iterdir())
    except OSError:
        return True


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
        ValueError: no saved stacks and no dumps in ``job_dir``; a bad dump, stack or trace file (each named).
    """
    layout = JobDir(job_dir)
    stacks: dict[int, str | None] = dict(read_stacks(layout.stacks()))
    ranks = layout.rank_ids()
    if fr_dir is not None or (use_fr and _has_dumps(layout.fr_dir)):
        dumps = load_fr(fr_dir if fr_dir is not None else layout.fr_dir, world_size=len(ranks) or None)
        return diagnose_fr(dumps, {r: stacks.get(r) for r in ranks} if stacks else None, world_size=len(ranks) or None)
    if not stacks:
        raise ValueError(f"job_dir={str(layout.path)!r}: no stacks/rank<R>.txt and no fr/ dumps in it")
    for rank in ranks:
        stacks.setdefault(rank, None)
    return diagnose(stacks, read_traces(layout.trace_dir))


DEBUG_SERVER_MARK = "# torch.distributed.debug dump_traceback"
"""First line of a stack the doctor read from torch's debug server (:func:`debug_server_stacks`), in py-spy's layout."""
_TB_THREAD = re.compile(r"^(?:Current thread|Thread) (0x[0-9a-f]+)", re.IGNORECASE)
_TB_FRAME = re.compile(r'^\s+File "(?P<file>[^"]+)", line (?P<line>\d+) in (?P<func>.+?)\s*$')


def parse_traceback(text: str) -> list[Frame]:
    """The main thread's frames, innermost first, of a :func:`faulthandler.dump_traceback` text (what torch's debug
    server's ``dump_traceback`` handler returns): the thread whose outermost frame is ``<module>``, else the last one
    listed (CPython lists the newest thread first).  Empty when the text holds no frame."""
    threads: list[list[Frame]] = []
    for line in text.splitlines():
        if _TB_THREAD.match(line):
            threads.append([])
            continue
        m = _TB_FRAME.match(line)
        if m and threads:
            threads[-1].append(Frame(m["func"], m["file"], int(m["line"])))
    threads = [t for t in threads if t]
    return next((t for t in threads if t[-1].func == "<module>"), threads[-1] if threads else [])


def debug_server_stacks(env: Mapping[str, str], ranks: Sequence[int], timeout_s: float = 5.0) -> dict[int, str]:
    """Each rank's Python stack from torch's own debug server, for a job that runs it; ``{}`` when it does not (PF-debug-server).

    ``torch.distributed.debug.start_debug_server()`` (torch 2.13, experimental) starts on every rank a worker HTTP
    server and writes its address to the job's TCPStore (``MASTER_ADDR:MASTER_PORT``, read from ``env``: a rank's
    environment) under ``debug_server/rank<R>``; the worker's ``dump_traceback`` handler answers with
    :func:`faulthandler.dump_traceback` of every thread (torch/distributed/debug/__init__.py, _debug_handlers.py).
    No ptrace is needed, so it works where py-spy is refused (Yama ``ptrace_scope``, containers).  Each text is the
    main thread in py-spy's layout (first line :data:`DEBUG_SERVER_MARK`, status ``unknown``), so :func:`rank_state`
    reads it like py-spy's.  Ranks that do not answer within ``timeout_s`` are left out.
    """
    import urllib.request
    from datetime import timedelta

    try:
        import torch.distributed as dist

        host, port = env["MASTER_ADDR"], int(env["MASTER_PORT"])
        store = dist.PrefixStore("debug_server", dist.TCPStore(host, port, is_master=False, wait_for_workers=False,
                                                                timeout=timedelta(seconds=timeout_s)))
    except (KeyError, ValueError, RuntimeError, ImportError, OSError):
        return {}
    out: dict[int, str] = {}
    for r in ranks:
        try:
            if not store.check([f"rank{r}"]):
                continue
            url = store.get(f"rank{r}").decode() + "/handler/dump_traceback"
            with urllib.request.urlopen(urllib.request.Request(url, method="POST"), timeout=timeout_s) as resp:
                frames = parse_traceback(resp.read().decode("utf-8", "replace"))
        except (OSError, RuntimeError, ValueError):
            continue
        if frames:
            out[r] = (f"{DEBUG_SERVER_MARK} {url}\nThread 0 (unknown): \"MainThread\"\n"
                      + "".join(f"    {f.func} ({f.file}:{f.line})\n" for f in frames))
    return out


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
    blind = [r for r, text in stacks.items() if not parse_stack(text or "")]
    if blind:  # py-spy refused or failed: torch's debug server, where the job runs it
        stacks.update(debug_server_stacks(next(iter(ranks.values())).environ(), blind))
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




if __name__ == "__main__":
    raise SystemExit(_main())
