"""Driver side of resuming: run training jobs, crash them, and check bit for bit that a resumed run is the run you wanted.

``torchrun --max-restarts=N`` (TorchElastic) re-forms the worker group after a failure and
starts ``main()`` again; it restores no training state (seed MN5).  Resuming is the script's
job, and it has two halves:

* **Atomic checkpoints** (:func:`save_checkpoint`, :func:`load_checkpoint`, from
  :mod:`helpers.checkpoint`, the rank-side half): a crash at any point leaves either the
  previous checkpoint or the new one, never a torn file.  :func:`naive_save` is the
  counter-example, and :func:`crash_mid_write` kills a real process in the middle of either.
* **Complete state** (:data:`PIECES`): model, optimizer (Adam's moments), LR scheduler, every
  RNG each rank draws from (torch, Python ``random``, NumPy; per rank), and the data position
  (sampler epoch and batches consumed in that epoch).  :func:`check_resume` runs an
  uninterrupted job and an interrupted-and-resumed one (``helpers/scenarios/elastic_train.py``
  under ``torchrun --max-restarts``) through the job runner and compares their final
  parameters exactly with :func:`compare_state_dicts`: on CPU the two must be equal bit for
  bit, and leaving one piece out (``omit=("rng",)``...) makes them differ.

:func:`run_elastic` runs two torchrun agents of one elastic rendezvous, the second joining
late.  Jobs that run side by side (:func:`check_variants`, the two agents) go through
:func:`helpers.jobs.run_together`, so an interrupt stops them all.

The rank side (``save_checkpoint``, ``load_checkpoint``, ``compare_state_dicts``...) is
:mod:`helpers.checkpoint`.  Nothing runs at import; torch is imported inside the functions
that need it.  Sources: seed MN5 and https://docs.pytorch.org/tutorials/beginner/ddp_series_fault_tolerance.html.
"""

from __future__ import annotations

import math
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from helpers import hostinfo, jobs, launchers, procs
from helpers.checkpoint import (
    PIECES,
    Diff,
    compare_state_dicts,
    load_checkpoint,
    parse_omit,
    save_checkpoint,
)
from helpers.jobdir import JobDir
from helpers.jobs import JobResult

__all__ = [
    "SCRIPT", "STEP_LINE", "CrashWrite", "crash_mid_write", "parse_steps", "TrainingRun", "training_args",
    "run_training", "ResumeCheck", "check_resume", "check_variants", "ELASTIC_RDZV_CONF", "ElasticRun",
    "elastic_commands", "run_elastic", "epoch_coverage",
]

SCRIPT = jobs.SCENARIOS / "elastic_train.py"
T = TypeVar("T")
STEP_LINE = re.compile(r"^(?:\[rank \d+\] )?step (\d+) ((?:\w+=\S+ ?)+)$")

@dataclass
class CrashWrite:
    """What :func:`crash_mid_write` observed.

    Attributes:
        atomic: whether the write used :func:`save_checkpoint` (else :func:`naive_save`).
        writer_exit: the writing process's exit status (137: it died mid-write).
        bytes_on_disk: size of the destination file after the crash.
        loaded_step: ``step`` of the checkpoint read back, or ``None`` when it did not load.
        load_error: the exception text when it did not load, else "".
        leftovers: temporary files left next to the destination.
    """

    atomic: bool
    writer_exit: int
    bytes_on_disk: int
    loaded_step: int | None
    load_error: str
    leftovers: list[str] = field(default_factory=list)


def crash_mid_write(path: str | os.PathLike[str], *, atomic: bool, die_after_bytes: int = 4096,
                    timeout_s: float = 120.0) -> CrashWrite:
    """Write checkpoint step 1 to ``path``, then kill a real process in the middle of writing step 2.

    The second write runs in a fresh Python process whose file writes end it with
    ``os._exit(137)`` after ``die_after_bytes`` bytes (no ``finally``, no cleanup: what a
    SIGKILL or a node loss does).  Then ``path`` is read back.

    Args:
        path: destination checkpoint (its directory is created).
        atomic: use :func:`save_checkpoint` (True) or :func:`naive_save` (False) for step 2.
        die_after_bytes: bytes written before the process dies (the full checkpoint is ~260 KB).
        timeout_s: bound on the writer process, seconds.

    Returns:
        A :class:`CrashWrite`.

    Raises:
        ValueError: ``die_after_bytes`` < 1.
    """
    import torch

    if die_after_bytes < 1:
        raise ValueError(f"die_after_bytes={die_after_bytes!r}: must be >= 1")
    dest = Path(path)
    save_checkpoint(dest, {"step": 1, "weight": torch.full((1 << 16,), 1.0)})
    root = str(Path(__file__).resolve().parent.parent)
    proc = subprocess.run([sys.executable, str(jobs.scenario("crash_write.py")), "--path", str(dest),
                           *(["--atomic"] if atomic else []), "--die-after-bytes", str(die_after_bytes)],
                          capture_output=True, text=True, timeout=timeout_s, env={**os.environ, "PYTHONPATH": root})
    step, error = None, ""
    try:
        state = load_checkpoint(dest)
        step = int(state["step"])
    except Exception as exc:  # noqa: BLE001 - the point is to show what a torn file raises
        error = f"{type(exc).__name__}: {exc}"
    leftovers = sorted(p.name for p in dest.parent.glob(f".{dest.name}.tmp-*"))
    return CrashWrite(atomic=atomic, writer_exit=proc.returncode, bytes_on_disk=dest.stat().st_size,
                      loaded_step=step, load_error=error, leftovers=leftovers)

# --------------------------------------------------------------------------- running the two jobs

def parse_steps(text: str) -> list[dict[str, Any]]:
    """Parse the ``step N key=value ...`` lines that ``elastic_train.py`` prints after each completed step.

    Args:
        text: one rank's stdout (an optional ``[rank R]`` prefix is accepted).

    Returns:
        One dict per line, in order: ``{"step": N, "restart": ..., "world_size": ..., ...}``
        (integers and floats converted, other values kept as text).
    """
    records = []
    for line in text.splitlines():
        m = STEP_LINE.match(line.strip())
        if not m:
            continue
        rec: dict[str, Any] = {"step": int(m.group(1))}
        for item in m.group(2).split():
            key, _, value = item.partition("=")
            rec[key] = _number(value)
        records.append(rec)
    return records


def _number(value: str) -> Any:
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


@dataclass
class TrainingRun:
    """One ``elastic_train.py`` job (see :func:`run_training`).

    Attributes:
        job: the :class:`helpers.jobs.JobResult`.
        final: path of the final model state dict rank 0 wrote (may not exist if the job failed).
        steps: rank 0's completed-step records (:func:`parse_steps`), all restarts included.
    """

    job: JobResult
    final: Path
    steps: list[dict[str, Any]]

    def state(self) -> dict[str, Any]:
        """The final model state dict (raises ``FileNotFoundError`` when the job wrote none)."""
        return load_checkpoint(self.final)["model"]  # type: ignore[index]

    def steps_by_restart(self) -> dict[int, list[int]]:
        """Rank 0's completed steps, grouped by ``TORCHELASTIC_RESTART_COUNT``."""
        out: dict[int, list[int]] = {}
        for rec in self.steps:
            out.setdefault(int(rec["restart"]), []).append(rec["step"])
        return out


def training_args(*, steps: int, micro: int = 4, crash_at: int | None = None, ckpt: Path | None = None,
                  ckpt_every: int = 1, omit: Sequence[str] = (), out: Path | None = None,
                  extra: Sequence[str] = ()) -> list[str]:
    """The command-line arguments of ``elastic_train.py`` for one run (see its ``--help``).

    Raises:
        ValueError: ``steps`` < 1, ``micro`` < 1, ``ckpt_every`` < 1, a ``crash_at`` outside
            ``[0, steps)``, or an unknown ``omit`` piece (names the field).
    """
    if steps < 1 or micro < 1 or ckpt_every < 1:
        raise ValueError(f"steps={steps}, micro={micro}, ckpt_every={ckpt_every}: each must be >= 1")
    if crash_at is not None and not 0 <= crash_at < steps:
        raise ValueError(f"crash_at={crash_at}: must be in [0, steps={steps})")
    args = ["--steps", str(steps), "--micro", str(micro)]
    if crash_at is not None:
        args += ["--crash-at", str(crash_at)]
    if ckpt is not None:
        args += ["--ckpt", str(ckpt), "--ckpt-every", str(ckpt_every)]
    omitted = parse_omit(omit)
    if omitted:
        args += ["--omit", ",".join(omitted)]
    if out is not None:
        args += ["--out", str(out)]
    return args + [str(a) for a in extra]


def run_training(out_dir: str | os.PathLike[str], name: str, *, steps: int, micro: int = 4,
                 crash_at: int | None = None, ckpt_every: int | None = None, omit: Sequence[str] = (),
                 resume_from: str | os.PathLike[str] | None = None, nproc: int = 2, max_restarts: int = 1,
                 env: Mapping[str, str | None] | None = None, timeout_s: float = 120.0, stall_s: float | None = 45.0,
                 backend: str = "gloo", extra: Sequence[str] = (), verbose: bool = True) -> TrainingRun:
    """Run ``elastic_train.py`` on ``nproc`` ranks under ``torchrun --max-restarts`` through the job runner.

    Args:
        out_dir: directory for this run's checkpoint (``<name>.ckpt``, plus ``<name>.ckpt.step<N>``
            links) and final state (``<name>.final.pt``); all are deleted first, so a stale file
            never stands in for this run.
        name: job name (letters, digits, ``._-``).
        steps: optimizer steps to train; micro: samples per rank per micro-batch.
        crash_at: step at which rank 1 raises, on the first launch only (``TORCHELASTIC_RESTART_COUNT=0``).
        ckpt_every: checkpoint every this many steps (``None``: no checkpoint, the MN5 bug).
        omit: checkpoint pieces not restored on resume (see :data:`PIECES`).
        resume_from: a checkpoint to start from (copied to this run's checkpoint path first):
            the run's first launch resumes from it, as a relaunch after a crash would.
        nproc: ranks; max_restarts: torchrun ``--max-restarts``.
        env: extra environment for the launcher (e.g. ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE``).
        timeout_s, stall_s: the runner's hard timeout and stall window, seconds.
        backend: process-group backend passed to the script (``gloo`` for the exact CPU comparison).
        extra: more script arguments.

    Returns:
        A :class:`TrainingRun`.

    Raises:
        ValueError: bad arguments (see :func:`training_args`), ``max_restarts`` < 0, ``resume_from``
            missing or given without ``ckpt_every``.
    """
    if max_restarts < 0:
        raise ValueError(f"max_restarts={max_restarts}: must be >= 0")
    if resume_from is not None and (not ckpt_every or not Path(resume_from).is_file()):
        raise ValueError(f"resume_from={str(resume_from)!r}: needs an existing checkpoint file and ckpt_every")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / f"{name}.ckpt" if ckpt_every else None
    final = out / f"{name}.final.pt"
    for stale in [final, *(out.glob(f"{name}.ckpt*") if ckpt else [])]:
        stale.unlink(missing_ok=True)
    if resume_from is not None and ckpt is not None:
        shutil.copyfile(resume_from, ckpt)
    args = training_args(steps=steps, micro=micro, crash_at=crash_at, ckpt=ckpt, ckpt_every=ckpt_every or 1,
                         omit=omit, out=final, extra=[*extra, "--backend", backend])
    if ckpt is not None:
        args.append("--keep-history")
    job = jobs.run_job(SCRIPT, args, nproc=nproc, launcher_args=[f"--max-restarts={max_restarts}"], env=env,
                       timeout_s=timeout_s, stall_s=stall_s, heartbeat=r"step \d+", name=name, verbose=verbose)
    rank0 = job.ranks.get(0)
    return TrainingRun(job=job, final=final, steps=parse_steps(rank0.stdout) if rank0 else [])


@dataclass
class ResumeCheck:
    """An uninterrupted run, an interrupted-and-resumed run, and the exact comparison of their final parameters."""

    reference: TrainingRun
    resumed: TrainingRun
    omit: tuple[str, ...]
    diff: Diff

    @property
    def passed(self) -> bool:
        """True when both jobs succeeded and the final parameters are identical bit for bit."""
        return self.reference.job.ok and self.resumed.job.ok and self.diff.equal

    def __str__(self) -> str:
        left_out = ",".join(self.omit) or "nothing"
        return f"resume check (left out: {left_out}): {'PASS' if self.passed else 'FAIL'}: {self.diff}"


def check_resume(out_dir: str | os.PathLike[str], *, steps: int, ckpt_every: int, crash_at: int | None = None,
                 resume_from: str | os.PathLike[str] | None = None, omit: Sequence[str] = (),
                 reference: TrainingRun | None = None, name: str | None = None, **kwargs: Any) -> ResumeCheck:
    """Run (or reuse) an uninterrupted job and an interrupted-and-resumed one, and compare them exactly.

    The interrupted run is either one torchrun job whose rank 1 crashes at ``crash_at`` on the
    first launch and which torchrun restarts (``crash_at``), or a fresh launch that resumes from
    the checkpoint a crashed launch left behind (``resume_from``: cheaper when several variants
    resume from the same point).  Every rank restores the checkpoint minus the pieces in
    ``omit``.  On CPU with the same world size, a complete resume reproduces the uninterrupted
    run's parameters bit for bit.

    Args:
        out_dir: where the checkpoints and final states go.
        steps, ckpt_every, crash_at, resume_from: see :func:`run_training` (give exactly one of
            ``crash_at`` and ``resume_from``).
        omit: checkpoint pieces the resumed job does not restore.
        reference: an uninterrupted :class:`TrainingRun` of the same ``steps`` to reuse (else one is run).
        name: job name of the resumed run (default ``resume-<omit>``).
        **kwargs: passed to :func:`run_training` for both jobs (``micro``, ``nproc``, ``env``, ``timeout_s``...).

    Returns:
        A :class:`ResumeCheck` (its ``passed`` is the verdict).

    Raises:
        ValueError: bad arguments, both or neither of ``crash_at``/``resume_from``, or a
            ``reference`` that did not run ``steps`` steps.
    """
    omitted = parse_omit(omit)
    if (crash_at is None) == (resume_from is None):
        raise ValueError(f"crash_at={crash_at!r}, resume_from={resume_from!r}: give exactly one of them")
    if reference is None:
        reference = run_training(out_dir, "resume-reference", steps=steps, **kwargs)
    elif not reference.steps or reference.steps[-1]["step"] != steps - 1:
        raise ValueError(f"reference: its last step is not steps - 1 = {steps - 1}")
    label = name or ("resume-" + ("-".join(omitted) if omitted else "complete"))
    resumed = run_training(out_dir, label, steps=steps, crash_at=crash_at, resume_from=resume_from,
                           ckpt_every=ckpt_every, omit=omitted, **kwargs)
    if reference.final.exists() and resumed.final.exists():
        diff = compare_state_dicts(reference.state(), resumed.state())
    else:
        diff = Diff(equal=False, compared=0, differing=[], first="(no final state written)",
                    first_max_abs_diff=math.inf, max_abs_diff=math.inf)
    return ResumeCheck(reference=reference, resumed=resumed, omit=omitted, diff=diff)


def check_variants(out_dir: str | os.PathLike[str], pieces: Sequence[str], *, parallel: int = 2,
                   **kwargs: Any) -> dict[str, ResumeCheck]:
    """:func:`check_resume` once per piece left out (``omit=[piece]``), ``parallel`` jobs at a time.

    Args:
        out_dir: where the checkpoints and final states go.
        pieces: the pieces to leave out, one run each (see :data:`PIECES`).
        parallel: how many jobs run at the same time (:func:`helpers.jobs.run_together`'s
            ``max_parallel``; each job is its own torchrun, and an interrupt stops them all).
        **kwargs: passed to :func:`check_resume` (``steps``, ``ckpt_every``, ``resume_from``,
            ``reference`` (required: one shared reference run), ``env``...).

    Returns:
        ``{piece: ResumeCheck}`` in the order of ``pieces``.

    Raises:
        ValueError: an unknown piece, ``parallel`` < 1, or no ``reference`` given.
    """
    if not pieces or any(not p for p in pieces):
        raise ValueError(f"pieces={list(pieces)!r}: give one or more of {', '.join(PIECES)}")
    names = [parse_omit([p])[0] for p in pieces]
    if parallel < 1:
        raise ValueError(f"parallel={parallel}: must be >= 1")
    if kwargs.get("reference") is None:
        raise ValueError("reference: run the uninterrupted job once and pass it (the variants share it)")
    checks = jobs.run_together(*[_bind(check_resume, out_dir, omit=[p], **kwargs) for p in names], max_parallel=parallel)
    return dict(zip(names, checks))


def _bind(fn: Callable[..., T], *args: Any, **kwargs: Any) -> Callable[[], T]:
    """``lambda: fn(*args, **kwargs)``, with the arguments fixed now (not when the lambda runs)."""
    return lambda: fn(*args, **kwargs)


# --------------------------------------------------------------------------- elastic membership (--nnodes=1:2)

ELASTIC_RDZV_CONF = "join_timeout=30,last_call_timeout=1,read_timeout=10"
"""Short rendezvous timeouts (seconds) for the elastic runs; torch's defaults are 600, 30 and 60."""
AGENT_STAGGER_S = 0.5
"""Seconds between the start of agent A's job and agent B's in :func:`run_elastic`."""


@dataclass
class ElasticRun:
    """Two torchrun agents of one elastic rendezvous (``--nnodes=1:2``), agent B joining late.

    Attributes:
        agents: ``{"A": JobResult, "B": JobResult}``: each agent is a job of its own (its own
            ``launcher.stderr`` and the logs of the ranks it started).
        steps: one record per step, its last attempt (:func:`last_attempts`; :func:`parse_steps` fields plus
            ``agent``), in step order, from every rank of both agents.
        launches: one record per rank start (the ``launch ...`` line: agent, world_size,
            restart_count, master port, agent_store).
        wall_s: seconds from the first agent's start to the end of both.
    """

    agents: dict[str, JobResult]
    steps: list[dict[str, Any]]
    launches: list[dict[str, Any]]
    wall_s: float

    @property
    def ok(self) -> bool:
        """True when both agents and all their ranks succeeded."""
        return all(job.ok for job in self.agents.values())

    def group_ranks(self) -> dict[str, list[int]]:
        """Each agent's ``group_rank`` in every rendezvous round it completed (from its ``LOGLEVEL=INFO`` lines)."""
        rx = re.compile(r"api\.py:\d+\]\s+group_rank=(\d+)")
        return {name: [int(m.group(1)) for m in rx.finditer(job.output)] for name, job in self.agents.items()}

    def agent_errors(self, pattern: str = r"Error") -> dict[str, list[str]]:
        """Lines of each agent's own output (ranks' lines excluded) matching regex ``pattern``."""
        rx = re.compile(pattern)
        return {name: [ln for ln in job.output.splitlines() if rx.search(ln) and not ln.startswith("[rank")]
                for name, job in self.agents.items()}


_LAUNCH = re.compile(r"launch restart_count=(\d+) world_size=(\d+) .*master=(\S+) agent_store=(\S+)")


def elastic_commands(name: str, port: int, ckpt: Path, a_rank0_log: Path, *, steps: int, micro: int, scale: str,
                     max_world: int, step_sleep: float, join_after_step: int,
                     rdzv_conf: str = ELASTIC_RDZV_CONF) -> list[list[str]]:
    """The argv of the two agents: ``torchrun --nnodes=1:2 --nproc-per-node=1`` with a c10d rendezvous on ``port``.

    Agent B is wrapped in ``bash -c``: it starts only once agent A's rank 0 has logged step
    ``join_after_step`` (a second node that comes up while the first is training).

    Raises:
        ValueError: ``scale`` not ``live``/``pinned``, or ``max_world`` < 1.
    """
    if scale not in ("live", "pinned"):
        raise ValueError(f"scale={scale!r}: accepted values are live, pinned")
    if max_world < 1:
        raise ValueError(f"max_world={max_world}: must be >= 1")
    torchrun = procs.find_tool("torchrun") or str(Path(sys.executable).parent / "torchrun")
    agent = [torchrun, *launchers.torchrun_flags("c10d", nnodes="1:2", nproc_per_node=1, rdzv_id=name,
                                                 rdzv_endpoint=f"127.0.0.1:{port}", rdzv_conf=rdzv_conf, max_restarts=0)]
    args = ["--steps", str(steps), "--micro", str(micro), "--ckpt", str(ckpt), "--ckpt-every", "1",
            "--scale", scale, "--max-world", str(max_world), "--step-sleep", str(step_sleep),
            "--sleep-below-world", str(max_world), "--backend", "gloo"]
    wait = (f'until grep -qs "^step {int(join_after_step)} " "{a_rank0_log}"; do sleep 0.2; done; '
            f'echo "[agent B] starting: agent A logged step {int(join_after_step)}" >&2; exec "$@"')
    return [agent + jobs.shim_argv(SCRIPT, args), ["bash", "-c", wait, "agent-B", *agent, *jobs.shim_argv(SCRIPT, args)]]


def run_elastic(out_dir: str | os.PathLike[str], name: str, *, share_store: bool = True, scale: str = "live",
                max_world: int = 2, steps: int = 24, micro: int = 4, step_sleep: float = 0.5, join_after_step: int = 2,
                rdzv_conf: str = ELASTIC_RDZV_CONF, timeout_s: float = 90.0, verbose: bool = True) -> ElasticRun:
    """Start agent A alone (world_size 1), let agent B join mid-training, and keep what both did.

    Each agent is one job of the runner (:func:`helpers.jobs.run_commands`, both run by
    :func:`helpers.jobs.run_together`; B's process is started :data:`AGENT_STAGGER_S` after A's,
    so that B's node id, which holds its pid, sorts after A's and A stays rank 0 of the
    rendezvous unless pids wrap around),
    so each has its own output and rank logs; the agents log at ``LOGLEVEL=INFO`` (their
    rendezvous and restart decisions).  Both resume from one checkpoint written every step, so
    a restart of the worker group at the membership change loses no step (one whose checkpoint
    had not landed is redone, and :func:`last_attempts` keeps the redone one).

    Args:
        out_dir: where the checkpoint (``<name>.ckpt``) goes (deleted first).
        name: job name prefix and rendezvous id.
        share_store: False sets ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` (every rendezvous round
            gets a fresh store); True leaves torch's default (the agent's store is shared and reused).
        scale: ``live`` or ``pinned`` (see ``elastic_train.py --help``); max_world: the pinned world size.
        steps, micro: training length and per-rank micro-batch.
        step_sleep: seconds slept after each step while the world is below ``max_world``.
        join_after_step: agent B starts when A's rank 0 has logged this step.
        rdzv_conf: ``--rdzv-conf`` (short timeouts, see :data:`ELASTIC_RDZV_CONF`).
        timeout_s: hard limit of each agent's job, seconds.

    Returns:
        An :class:`ElasticRun`.

    Raises:
        ValueError: bad ``scale``/``max_world`` (see :func:`elastic_commands`), ``steps`` < 1.
    """
    if steps < 1:
        raise ValueError(f"steps={steps}: must be >= 1")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    ckpt = out / f"{name}.ckpt"
    for stale in out.glob(f"{name}.ckpt*"):
        stale.unlink()
    port = hostinfo.free_port()
    dirs = {a: jobs.new_job_dir(f"{name}-{a}") for a in "AB"}
    cmds = elastic_commands(name, port, ckpt, JobDir(dirs["A"]).rank_stdout(0), steps=steps, micro=micro,
                            scale=scale, max_world=max_world, step_sleep=step_sleep, join_after_step=join_after_step,
                            rdzv_conf=rdzv_conf)
    env = {"TORCH_DISABLE_SHARE_RDZV_TCP_STORE": None if share_store else "1", "LOGLEVEL": "INFO"}

    def agent(label: str, cmd: list[str]) -> JobResult:
        return jobs.run_commands([cmd], timeout_s=timeout_s, env=env, name=f"{name}-{label}", job_dir=dirs[label],
                                 verbose=verbose)

    t0 = time.monotonic()
    # B's process starts AGENT_STAGGER_S after A's, so that B's pid (hence its node id in the rendezvous) sorts after A's.
    ran = jobs.run_together(*[_bind(agent, label, cmd) for label, cmd in zip("AB", cmds)], stagger_s=AGENT_STAGGER_S)
    results = dict(zip("AB", ran))
    records: list[dict[str, Any]] = []
    launches = []
    for label in "AB":
        for rank, res in results[label].ranks.items():
            records.extend({**rec, "agent": label} for rec in parse_steps(res.stdout))
            for m in _LAUNCH.finditer(res.stdout):
                launches.append({"agent": label, "rank_log": rank, "restart_count": int(m.group(1)),
                                 "world_size": int(m.group(2)), "master": m.group(3), "agent_store": m.group(4)})
    return ElasticRun(agents={label: results[label] for label in "AB"}, steps=last_attempts(records), launches=launches,
                      wall_s=time.monotonic() - t0)


def last_attempts(records: Iterable[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """One record per step, the one of its last attempt, in step order.

    A worker prints a step's line before the checkpoint of that step lands (``elastic_train.py``),
    so a restart of the worker group between the two leaves a line for a step that the next
    attempt redoes from the previous checkpoint; the attempt with the highest ``restart`` count is
    the one whose update the checkpoint holds.  Every rank prints every step: of records with the
    same step and restart count, the first is kept.

    Args:
        records: step records (:func:`parse_steps`), any order, ``restart`` missing counts as 0.

    Returns:
        One dict per step number, sorted by step.
    """
    kept: dict[int, dict[str, Any]] = {}
    for rec in records:
        held = kept.get(rec["step"])
        if held is None or int(rec.get("restart", 0)) > int(held.get("restart", 0)):
            kept[rec["step"]] = dict(rec)
    return [kept[k] for k in sorted(kept)]


def epoch_coverage(steps: Sequence[Mapping[str, Any]], dataset_size: int) -> dict[int, dict[str, int]]:
    """How the samples of each epoch were used, from the ``epoch`` and ``ids`` fields of completed steps.

    Args:
        steps: step records (:func:`parse_steps`), one per completed step.
        dataset_size: number of samples in the dataset.

    Returns:
        ``{epoch: {"steps", "slots", "distinct", "twice_or_more", "never"}}``: slots = sample
        slots used in that epoch; never = samples of the dataset not seen in it.

    Raises:
        ValueError: ``dataset_size`` < 1.
    """
    if dataset_size < 1:
        raise ValueError(f"dataset_size={dataset_size}: must be >= 1")
    seen: dict[int, list[int]] = {}
    count: dict[int, int] = {}
    for rec in steps:
        ids = [int(i) for i in str(rec["ids"]).split("-") if i != ""]
        seen.setdefault(int(rec["epoch"]), []).extend(ids)
        count[int(rec["epoch"])] = count.get(int(rec["epoch"]), 0) + 1
    out = {}
    for epoch, ids in sorted(seen.items()):
        distinct = set(ids)
        out[epoch] = {"steps": count[epoch], "slots": len(ids), "distinct": len(distinct),
                      "twice_or_more": sum(1 for i in distinct if ids.count(i) > 1),
                      "never": dataset_size - len(distinct)}
    return out
