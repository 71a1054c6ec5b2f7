"""The job runner: launch a multi-process job, bound it in time, and keep what each rank did.

Every chapter launches its ranks through :func:`run_job` (one launcher command) or
:func:`run_commands` (several, e.g. two torchrun agents acting as two nodes), and runs
independent jobs side by side with :func:`run_together`.  Nothing distributed ever runs
inside the notebook kernel.

What a job gets:

* a job directory ``build/jobs/<name>-<stamp>-<pid>-<n>/`` holding the launcher's output
  (``launcher.stdout``/``.stderr``), each rank's output and exit status
  (``ranks/rank<R>.stdout|.stderr|.json``, written by :mod:`helpers.rankshim`),
  torchrun's ``--log-dir`` and, after a hang, each rank's stack (``stacks/``): the whole
  layout is :class:`helpers.jobdir.JobDir`;
* ``TMPDIR`` inside the job directory (removed at the end) and ``TORCH_EXTENSIONS_DIR``
  in the shared build cache, so nothing lands in ``/tmp``;
* a hard timeout and an optional stall window: when either expires, every live rank writes
  its torch Flight Recorder dump (``fr/``: the runner sends SIGUSR2, :mod:`helpers._fr_site`;
  ``TORCH_FR_BUFFER_SIZE=2000`` and, for NCCL, ``TORCH_NCCL_DUMP_ON_TIMEOUT=1`` with
  ``TORCH_FR_DUMP_TEMP_FILE=<job>/fr/nccl/rank`` are set unless the caller set them), py-spy dumps
  every live rank's stack, then the whole process tree is killed (psutil), so no rank, port
  listener or temp dir outlives the call.
"""

from __future__ import annotations

import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor, wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from helpers import envvars, jobdir, launchers, procs, validate
from helpers.jobdir import FR_DIR_ENV, JOB_DIR_ENV, JobDir, LineCounter, LineTail

RUNNER_LAUNCHERS = ("torchrun", "accelerate", "deepspeed", "python", "srun")
BACKENDS = ("auto", "gloo", "nccl")
SHIM = str(Path(__file__).with_name("rankshim.py"))
_RDZV_FLAGS = ("--master-port", "--master_port", "--master-addr", "--master_addr", "--rdzv-endpoint",
               "--rdzv_endpoint", "--rdzv-backend", "--rdzv_backend", "--node-rank", "--node_rank")
_counter = itertools.count()
_local = threading.local()  # .cancel: the threading.Event of the run_together call running this thread
T = TypeVar("T")


def project_root() -> Path:
    """The repository root (the folder holding ``helpers/``)."""
    return Path(__file__).resolve().parent.parent


SCENARIOS = project_root() / "helpers" / "scenarios"
"""The folder of the rank scripts (``helpers/scenarios``) the chapters launch."""
CONFIGS = project_root() / "configs"
"""The folder of the committed launcher configs (DeepSpeed JSON, Accelerate YAML, hostfiles, sbatch)."""


def scenario(name: str) -> Path:
    """The path of scenario script ``name`` (``"ddp_unused"`` or ``"ddp_unused.py"``) in :data:`SCENARIOS`.

    Raises:
        ValueError: no such script, naming ``name`` and listing the available scenarios.
    """
    stem = str(name).removesuffix(".py")
    path = SCENARIOS / f"{stem}.py"
    if not re.fullmatch(r"[A-Za-z0-9_]+", stem) or stem.startswith("_") or not path.is_file():
        available = sorted(p.stem for p in SCENARIOS.glob("*.py") if not p.stem.startswith("_"))
        raise ValueError(f"scenario={name!r}: accepted values are {', '.join(available)}")
    return path


def build_dir() -> Path:
    """Where generated files go: ``$RUNBOOK_BUILD_DIR`` or ``<project>/build`` (created if missing)."""
    path = Path(os.environ.get("RUNBOOK_BUILD_DIR") or project_root() / "build").resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def extensions_dir() -> Path:
    """Where jobs JIT-build torch extensions (DeepSpeed's ops): ``$TORCH_EXTENSIONS_DIR``, else ``<build>/torch_extensions``.

    Inside the project's build folder (on a cluster: the shared filesystem, so every node loads the op one node
    built), never torch's default ``~/.cache/torch_extensions``; created if missing.
    """
    path = Path(os.environ.get("TORCH_EXTENSIONS_DIR") or build_dir() / "torch_extensions").resolve()
    path.mkdir(parents=True, exist_ok=True)
    return path


def choose_backend(requested: str = "auto", nproc_per_node: int = 1, *, verbose: bool = True) -> str:
    """Resolve a backend name for a job of ``nproc_per_node`` ranks on this node.

    ``auto`` means NCCL when CUDA is available and every rank on the node can get its own
    GPU (``torch.cuda.device_count() >= nproc_per_node``, seed D3), gloo otherwise.
    The choice and its reason are printed when ``verbose``.

    Raises:
        ValueError: ``requested`` is not ``auto``, ``gloo`` or ``nccl``; or ``nproc_per_node`` < 1.
    """
    if requested not in BACKENDS:
        raise ValueError(f"backend={requested!r}: accepted values are {', '.join(BACKENDS)}")
    if nproc_per_node < 1:
        raise ValueError(f"nproc_per_node={nproc_per_node}: must be >= 1")
    import torch  # lazy: costs ~2 s, and only the backend choice needs it

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if requested == "auto":
        chosen = "nccl" if gpus >= nproc_per_node else "gloo"
        reason = f"{gpus} GPU(s) visible for {nproc_per_node} rank(s) per node"
    else:
        chosen = requested
        reason = "requested"
    if verbose:
        print(f"backend: {chosen} ({reason})")
    return chosen


@dataclass
class RankResult:
    """What one rank did: its pid, exit status (negative = killed by that signal), logs and stack."""

    rank: int
    pid: int | None
    exit_code: int | None
    stdout_path: Path
    stderr_path: Path
    start: float | None = None
    end: float | None = None
    stack: str | None = None

    @property
    def stdout(self) -> str:
        """This rank's stdout, unprefixed (empty if it wrote none)."""
        return _read(self.stdout_path)

    @property
    def stderr(self) -> str:
        """This rank's stderr, unprefixed."""
        return _read(self.stderr_path)

    @property
    def traceback(self) -> str | None:
        """The last Python traceback in this rank's stderr, or ``None``."""
        err = self.stderr
        at = err.rfind("Traceback (most recent call last)")
        return err[at:].strip() if at >= 0 else None


@dataclass
class JobResult:
    """The outcome of one job (see :func:`run_commands`).

    Attributes:
        name: job name; job_dir: its directory.
        commands: the argv of each launcher process; env: variables the runner set or
            changed (``None`` = removed), not the whole environment.
        returncodes: each launcher's exit status (``None`` if it had to be killed).
        wall_s: seconds from launch to the end of teardown.
        timed_out: the hard timeout expired; hung: the stall window expired first.
        ranks: rank id -> :class:`RankResult`; stacks: rank id -> py-spy text, for the
            ranks alive when the job was declared hung or timed out.
        stop_reason: why the runner stopped the job ("" when it ended by itself): the hard
            timeout, the stall window, or a cancel from an interrupted :func:`run_together`;
            stopped_at: wall-clock time (``time.time()``, seconds) of that decision.
    """

    name: str
    job_dir: Path
    commands: list[list[str]]
    env: dict[str, str | None]
    returncodes: list[int | None]
    wall_s: float
    timed_out: bool
    hung: bool
    timeout_s: float
    stall_s: float | None
    backend: str | None = None
    ranks: dict[int, RankResult] = field(default_factory=dict)
    stacks: dict[int, str] = field(default_factory=dict)
    stop_reason: str = ""
    stopped_at: float | None = None

    @property
    def returncode(self) -> int | None:
        """The first launcher's exit status (the usual single-launcher case)."""
        return self.returncodes[0] if self.returncodes else None

    @property
    def ok(self) -> bool:
        """True when every launcher and every rank exited 0 and nothing hung or timed out."""
        return (not self.timed_out and not self.hung and all(rc == 0 for rc in self.returncodes)
                and all(r.exit_code == 0 for r in self.ranks.values()))

    @property
    def failed_ranks(self) -> list[int]:
        """Ranks whose own exit status was non-zero or unknown, sorted."""
        return sorted(r for r, res in self.ranks.items() if res.exit_code != 0)

    @property
    def first_failure(self) -> RankResult | None:
        """The rank that exited non-zero first (the one that diverged, when one crashed)."""
        failed = [r for r in self.ranks.values() if r.exit_code not in (0, None) and r.end]
        return min(failed, key=lambda r: r.end or 0.0) if failed else None

    @property
    def hung_ranks(self) -> list[int]:
        """Ranks that were still alive when the job was declared hung or timed out."""
        return sorted(self.stacks)

    @property
    def output(self) -> str:
        """The launchers' merged stdout and stderr (rank lines carry a ``[rank R]`` prefix)."""
        layout = JobDir(self.job_dir)
        return _read(layout.launcher_stdout) + _read(layout.launcher_stderr)

    def records(self, kind: str, rank: int | None = None) -> list[dict]:
        """The ``kind {json}`` records the ranks printed (see :func:`parse_records`), in output order.

        Args:
            kind: the record name (``contract``, ``bind``, ``group``, ``accelerate``, ``params``).
            rank: read only that rank's own stdout; ``None`` reads the launchers' merged output.

        Raises:
            ValueError: ``kind`` is not a lowercase word, or ``rank`` is not a rank of this job.
        """
        if rank is None:
            return parse_records(self.output, kind)
        if rank not in self.ranks:
            raise ValueError(f"rank={rank!r}: accepted values are the job's ranks {sorted(self.ranks)}")
        return parse_records(self.ranks[rank].stdout, kind)

    def grep(self, pattern: str) -> list[str]:
        """Lines matching regex ``pattern`` in the launcher output and every rank's logs.

        A rank's line appears twice (its own log, and prefixed in the launcher's stream): count
        per rank with ``ranks[r].stdout`` instead of counting these lines.
        """
        rx = re.compile(pattern)
        texts = [self.output] + [r.stdout + r.stderr for r in self.ranks.values()]
        return [line for text in texts for line in text.splitlines() if rx.search(line)]

    def summary(self) -> str:
        """A few human-readable lines: status, wall time, and each rank's exit status."""
        state = "TIMED OUT" if self.timed_out else "HUNG" if self.hung else "ok" if self.ok else "FAILED"
        lines = [f"job {self.name}: {state} in {self.wall_s:.1f} s (launcher exit {self.returncodes})"]
        if self.stop_reason:
            lines.append(f"  stopped: {self.stop_reason}")
        for rank in sorted(self.ranks):
            r = self.ranks[rank]
            extra = " (stack captured)" if rank in self.stacks else ""
            lines.append(f"  rank {rank}: exit {r.exit_code} pid {r.pid}{extra}")
        return "\n".join(lines)

    def to_dict(self) -> dict:
        """JSON-serialisable form (paths as strings, logs left in their files)."""
        return {
            "name": self.name, "job_dir": str(self.job_dir), "commands": self.commands, "env": self.env,
            "returncodes": self.returncodes, "wall_s": self.wall_s, "timed_out": self.timed_out,
            "hung": self.hung, "timeout_s": self.timeout_s, "stall_s": self.stall_s, "backend": self.backend,
            "stop_reason": self.stop_reason, "stopped_at": self.stopped_at, "failed_ranks": self.failed_ranks, "hung_ranks": self.hung_ranks,
            "ranks": {r: {"pid": v.pid, "exit_code": v.exit_code} for r, v in self.ranks.items()},
        }


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except FileNotFoundError:
        return ""


_RECORD = re.compile(r"^(?:\[rank (?P<shim>-?\d+)\] )?(?P<kind>[a-z_]+) (?P<body>\{.*\})\s*$")


def parse_records(text: str, kind: str) -> list[dict]:
    """The JSON records of one ``kind`` printed by the ranks, in output order.

    Scenario scripts print ``<kind> {json}`` lines; the rank shim prefixes them ``[rank R] ``
    in a job's merged output (``JobResult.output``).  Each returned dict gets ``_shim_rank``
    (the shim's ``R``, or ``None`` for an unprefixed line).  Lines whose JSON does not parse
    are skipped.

    Args:
        text: output to scan (a job's ``output``, or one rank's ``stdout``).
        kind: the record name (``contract``, ``bind``, ``group``, ``accelerate``, ``params``).

    Returns:
        One dict per matching line.

    Raises:
        ValueError: ``kind`` is not a lowercase word.
    """
    if not re.fullmatch(r"[a-z_]+", kind or ""):
        raise ValueError(f"kind={kind!r}: a lowercase record name such as 'contract'")
    found = []
    for line in text.splitlines():
        m = _RECORD.match(line)
        if m and m.group("kind") == kind:
            try:
                rec = json.loads(m.group("body"))
            except json.JSONDecodeError:
                continue
            rec["_shim_rank"] = int(m.group("shim")) if m.group("shim") is not None else None
            found.append(rec)
    return found


def shim_argv(script: str | os.PathLike[str], args: Sequence[str] = ()) -> list[str]:
    """``[rankshim.py, script, *args]``: what a launcher should run instead of ``script`` alone."""
    return [SHIM, str(script), *map(str, args)]


def launcher_argv(launcher: str, script: str | os.PathLike[str], args: Sequence[str] = (), *,
                  nproc: int | None = 2, nnodes: int = 1, launcher_args: Sequence[str] = (),
                  standalone: bool | None = None, log_dir: Path | None = None) -> list[list[str]]:
    """Build the process command line(s) for one launcher, with the rank shim inserted.

    Args:
        launcher: one of ``torchrun``, ``accelerate``, ``deepspeed``, ``python``, ``srun``.
        script: the rank script; args: its arguments.
        nproc: ranks per node (``--nproc-per-node``, ``--num_processes``, ``--num_gpus``,
            ``srun -n``; for ``python``, that many bare processes).  ``None`` passes no
            count (``accelerate launch`` then uses its config: seed D5).
        nnodes: torchrun ``--nnodes``.
        launcher_args: extra launcher flags, placed before the script.
        standalone: torchrun ``--standalone``; ``None`` = on for one node unless
            ``launcher_args`` already names a rendezvous/master flag (seed D2, D4).
        log_dir: torchrun ``--log-dir`` (keeps ``/tmp/torchelastic_*`` away).

    Returns:
        One argv per process to start (several only for ``python`` with ``nproc`` > 1).

    Raises:
        ValueError: unknown launcher, bad nproc, or the launcher is not installed.
    """
    if launcher not in RUNNER_LAUNCHERS:
        raise ValueError(f"launcher={launcher!r}: accepted values are {', '.join(RUNNER_LAUNCHERS)}")
    if nproc is not None and (not isinstance(nproc, int) or nproc < 1):
        raise ValueError(f"nproc={nproc!r}: must be an integer >= 1")
    if nnodes < 1:
        raise ValueError(f"nnodes={nnodes!r}: must be an integer >= 1")
    body = shim_argv(script, args)
    if launcher == "python":
        return [[sys.executable, "-u", *body] for _ in range(nproc or 1)]
    tool = {"torchrun": "torchrun", "accelerate": "accelerate", "deepspeed": "deepspeed", "srun": "srun"}[launcher]
    exe = procs.find_tool(tool)
    if exe is None:
        raise ValueError(f"launcher={launcher!r}: `{tool}` is not installed or not on PATH")
    extra = list(map(str, launcher_args))
    if launcher == "torchrun":
        if standalone is None:
            standalone = nnodes == 1 and not any(a.split("=")[0] in _RDZV_FLAGS for a in extra)
        cmd = [exe, *launchers.torchrun_flags("standalone" if standalone else None, nnodes=nnodes, nproc_per_node=nproc)]
        cmd += [f"--log-dir={log_dir}"] if log_dir else []
        return [cmd + extra + body]
    if launcher == "accelerate":
        count = [f"--num_processes={nproc}"] if nproc else []
        return [[exe, "launch", *count, *extra, *body]]
    if launcher == "deepspeed":
        # --num_gpus=N makes the deepspeed runner drop CUDA_VISIBLE_DEVICES and use GPUs 0..N-1 (runner.py main);
        # --include=localhost:<ids> keeps the visible set, as the runner itself does without flags (issue 17)
        visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
        if nproc and visible and not all(d.isdigit() for d in visible):
            raise ValueError(f"CUDA_VISIBLE_DEVICES={','.join(visible)!r}: the deepspeed launcher's --include takes GPU "
                             "indices only; use launcher='torchrun'")
        if nproc and visible and nproc > len(visible):
            raise ValueError(f"nproc={nproc}: more than the {len(visible)} GPU(s) in CUDA_VISIBLE_DEVICES")
        count = [f"--include=localhost:{','.join(visible[:nproc])}"] if nproc and visible else \
            [f"--num_gpus={nproc}"] if nproc else []
        return [[exe, *count, *extra, *body]]
    return [[exe, f"--ntasks={nproc or 1}", *extra, sys.executable, "-u", *body]]


def run_job(script: str | os.PathLike[str], args: Sequence[str] = (), *, launcher: str = "torchrun",
            nproc: int | None = 2, nnodes: int = 1, launcher_args: Sequence[str] = (),
            standalone: bool | None = None, backend: str | None = None, **kwargs: object) -> JobResult:
    """Launch ``script`` under ``launcher`` with ``nproc`` ranks and wait for it, bounded in time.

    Args:
        script: path of the rank script (must exist).
        args: the script's arguments.
        launcher, nproc, nnodes, launcher_args, standalone: see :func:`launcher_argv`.
        backend: if given (``auto``/``gloo``/``nccl``), resolved with :func:`choose_backend`,
            printed, exported as ``RUNBOOK_BACKEND`` and recorded in the result; the script
            decides what to do with it.
        **kwargs: passed to :func:`run_commands` (``timeout_s``, ``stall_s``, ``env``,
            ``name``, ``heartbeat``, ``cwd``, ``echo``, ``verbose``).

    Returns:
        The :class:`JobResult`.

    Raises:
        ValueError: a bad argument, naming the field (``script`` missing, ``nproc`` < 1,
            unknown ``launcher`` or ``backend``, ``timeout_s`` <= 0...).
    """
    path = Path(script)
    if not path.is_file():
        raise ValueError(f"script={str(script)!r}: file not found")
    name = str(kwargs.pop("name", None) or path.stem)
    job_dir = new_job_dir(name)
    cmds = launcher_argv(launcher, path.resolve(), args, nproc=nproc, nnodes=nnodes, launcher_args=launcher_args,
                         standalone=standalone, log_dir=JobDir(job_dir).torchrun_dir)
    env = dict(kwargs.pop("env", None) or {})  # type: ignore[call-overload]
    chosen = None
    if backend is not None:
        chosen = choose_backend(backend, nproc or 1, verbose=bool(kwargs.get("verbose", True)))
        env["RUNBOOK_BACKEND"] = chosen
    per_process_env = [{"RUNBOOK_RANK": str(i)} for i in range(len(cmds))] if launcher == "python" else None
    result = run_commands(cmds, env=env, name=name, job_dir=job_dir, per_process_env=per_process_env,
                          **kwargs)  # type: ignore[arg-type]
    result.backend = chosen
    if launcher == "deepspeed":
        remove_deepspeed_segments(launcher_args, nproc or 1)
    return result


def remove_deepspeed_segments(launcher_args: Sequence[str], world_size: int, shm_dir: str = "/dev/shm") -> list[str]:
    """Remove the ``/dev/shm`` all-reduce segments a ``deepspeed``-launched job on this host leaves; return their names.

    A rank that ends normally removes its own (:func:`helpers.scenarios._common.finish`); one killed by the timeout
    or by its launcher cannot, and DeepSpeed never does (see :func:`helpers.jobdir.remove_deepspeed_shm`).
    The launcher exports ``MASTER_ADDR=127.0.0.1`` on one node and ``MASTER_PORT`` from ``--master_port`` (read by
    the project's launch-line parser, :func:`helpers.launch_parse.parse_command`; default
    :data:`helpers.launchers.DEFAULT_MASTER_PORT`), so the names are known: ranks ``0 .. world_size - 1``.
    """
    import shlex

    from helpers import launch_parse  # lazy: the parser and its trap rules are not needed to run a job

    spec = launch_parse.parse_command(shlex.join(["deepspeed", *map(str, launcher_args), "job.py"]))
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(spec.master_port or launchers.DEFAULT_MASTER_PORT)}
    return [str(jobdir.deepspeed_shm_name(rank, env)) for rank in range(world_size)
            if jobdir.remove_deepspeed_shm(rank, shm_dir, env)]


def run_together(*calls: Callable[[], T], stagger_s: float = 0.0, max_parallel: int | None = None,
                 cancel: threading.Event | None = None) -> list[T]:
    """Run independent jobs at the same time; return their results in the order given.

    Each call is a zero-argument callable that runs one job, typically
    ``lambda: run_job(...)``.  They run in threads of this process: the runner spends its
    time polling its launchers, so a thread per job is enough, and each job still gets its
    own session, job directory, ports, timeout and teardown.  On a 2-core machine most of a
    short job is spent importing torch in one launcher and then in the ranks, or waiting out
    a stall window or a collective timeout; two or three such jobs side by side take little
    longer than the longest of them.

    Use it for runs that share no port, file or output directory (a broken and a fixed script
    side by side).  Do not use it for runs whose step times you report: they compete for
    the same CPUs.

    An interrupt while waiting (Ctrl-C, the notebook's stop button) stops every job at once
    (its process tree killed, as on a timeout) before the ``KeyboardInterrupt`` propagates.
    Every :func:`run_commands` call made in these threads watches one cancel event; a
    ``run_together`` called inside one of them (a helper that runs its own jobs side by side,
    such as ``resume.run_elastic``) shares its caller's event, so the outer interrupt stops
    the nested jobs too.

    Args:
        calls: the jobs to run, each a callable taking no argument.
        stagger_s: seconds between the start of one call and the next (e.g. a second
            torchrun agent that must start after the first); 0 starts them all at once.
        max_parallel: at most this many calls run at a time (the others wait their turn);
            ``None`` runs them all at once.
        cancel: the event that stops the jobs when set (by this function on an interrupt, or
            by the caller); default: the event of the enclosing ``run_together`` when called
            inside one, else a new one.

    Returns:
        ``[calls[0](), calls[1](), ...]``.

    Raises:
        ValueError: no call given, ``stagger_s`` < 0, or ``max_parallel`` < 1.
        TypeError: a call is not callable (naming its position).
        Cancelled: the cancel event was set before every call had started (the started ones
            were stopped).
        Exception: the first exception a call raised (in the order given), after every call
            has returned, so no job is left running when it propagates.
    """
    if not calls:
        raise ValueError("calls: give at least one callable, e.g. lambda: run_job(...)")
    for i, call in enumerate(calls):
        if not callable(call):
            raise TypeError(f"calls[{i}]: expected a callable (e.g. lambda: run_job(...)), got {type(call).__name__}")
    if not stagger_s >= 0:
        raise ValueError(f"stagger_s={stagger_s!r}: must be >= 0 seconds")
    if max_parallel is not None:
        validate.positive_int(max_parallel, "max_parallel")
    event = cancel or current_cancel() or threading.Event()
    pool = ThreadPoolExecutor(max_workers=max_parallel or len(calls), thread_name_prefix="runbook-job",
                              initializer=_bind_cancel, initargs=(event,))
    futures: list[Future[T]] = []
    try:
        for i, call in enumerate(calls):
            if i and stagger_s and event.wait(stagger_s):
                break  # cancelled while staggering: start no more
            futures.append(pool.submit(_unless_cancelled, call, event))
        wait(futures)
    except BaseException:
        event.set()  # each run_commands loop sees it within one poll interval and kills its job
        raise
    finally:
        pool.shutdown(wait=True, cancel_futures=event.is_set())
    if len(futures) < len(calls) or any(f.cancelled() for f in futures):
        raise Cancelled("run_together: cancelled before every call had started")
    return [f.result() for f in futures]


class Cancelled(RuntimeError):
    """The cancel event of a :func:`run_together` call was set before a job could start."""


def current_cancel() -> threading.Event | None:
    """The cancel event of the :func:`run_together` call running this thread (``None`` outside one)."""
    return getattr(_local, "cancel", None)


def _unless_cancelled(call: Callable[[], T], event: threading.Event) -> T:
    """Run ``call`` unless ``event`` is already set (a queued call of an interrupted run_together)."""
    if event.is_set():
        raise Cancelled("run_together: cancelled before this call started")
    return call()


def _bind_cancel(event: threading.Event) -> None:
    _local.cancel = event


def new_job_dir(name: str) -> Path:
    """Create and return a fresh job directory ``build/jobs/<name>-<stamp>-<pid>-<n>``.

    Pass it as ``job_dir`` to :func:`run_commands` when the commands must name paths inside it
    before they start (e.g. torchrun's ``--log-dir`` per node).

    Raises:
        ValueError: ``name`` has characters other than letters, digits, ``.``, ``_``, ``-``.
    """
    if not re.fullmatch(r"[A-Za-z0-9_.-]+", name):
        raise ValueError(f"name={name!r}: use letters, digits, '.', '_' and '-' only")
    stamp = time.strftime("%Y%m%d-%H%M%S")
    path = build_dir() / "jobs" / f"{name}-{stamp}-{os.getpid()}-{next(_counter)}"
    path.mkdir(parents=True)
    return path


def _progress_size(layout: JobDir) -> int:
    """Bytes written so far to the job's logs: the stall detector's progress measure."""
    total = 0
    for p in [layout.launcher_stdout, layout.launcher_stderr, *layout.rank_logs()]:
        try:
            total += p.stat().st_size
        except FileNotFoundError:
            pass
    return total


def run_commands(commands: Sequence[Sequence[str]], *, timeout_s: float = 120.0, stall_s: float | None = None,
                 env: Mapping[str, str | None] | None = None, name: str = "job", job_dir: Path | None = None,
                 per_process_env: Sequence[Mapping[str, str | None]] | None = None, heartbeat: str | None = None,
                 cwd: str | os.PathLike[str] | None = None, echo: bool = False, verbose: bool = True,
                 poll_s: float = 0.1) -> JobResult:
    """Start launcher processes, watch them, and stop them all at the timeout or a stall.

    Each command is started in a session of its own; its stdout/stderr go to files in the
    job directory.  The commands should run their ranks through the rank shim
    (:func:`shim_argv`) so that per-rank logs, pids and exit statuses are recorded.

    Args:
        commands: argv of each launcher process (e.g. one torchrun per "node").
        timeout_s: hard limit in seconds; on expiry stacks are taken, then everything is killed.
        stall_s: seconds without progress after which the job is declared hung (before the
            hard timeout).  Progress is any growth of the job's logs or, when ``heartbeat``
            is given, a new line matching that regex in a rank's stdout.  The window opens at
            the first progress, so a slow start (imports, rendezvous on a loaded machine) is
            bounded by ``timeout_s`` alone; and a job whose ranks have all exited is never
            declared hung (the launcher is only slow to tear down), nor one whose ranks all exited 0
            while its stacks and dumps were being taken (slow, not hung: a loaded machine).
        env: variables to set for every process (``None`` removes a variable).
        name: job name, used in the job directory's name.
        job_dir: directory to use (default: a fresh ``build/jobs/<name>-<stamp>``).
        per_process_env: extra variables for each command, index-aligned with ``commands``.
        heartbeat: regex of a progress line (e.g. ``r"step \\d+"``).
        cwd: working directory of the processes (default: the project root).
        echo: copy the launchers' output to this process's stdout while the job runs.
        verbose: print one line when the job starts and one when it ends.
        poll_s: seconds between checks.

    Returns:
        The :class:`JobResult`.

    Raises:
        ValueError: no command, ``timeout_s`` <= 0, ``stall_s`` <= 0, or misaligned
            ``per_process_env``.
    """
    if not commands:
        raise ValueError("commands: at least one command is required")
    if not timeout_s or timeout_s <= 0:
        raise ValueError(f"timeout_s={timeout_s!r}: must be > 0 seconds (every job is bounded)")
    if stall_s is not None and stall_s <= 0:
        raise ValueError(f"stall_s={stall_s!r}: must be > 0 seconds or None")
    if per_process_env is not None and len(per_process_env) != len(commands):
        raise ValueError("per_process_env: needs one mapping per command")
    job_dir = job_dir or new_job_dir(name)
    layout = JobDir(job_dir).create()
    tmp = layout.tmp_dir
    # The interpreter's own bin first on PATH: the launchers, and the ninja that built the cached
    # DeepSpeed ops (a different ninja sees "command line changed" and rebuilds them, ~30 s).
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    changes: dict[str, str | None] = {"PYTHONUNBUFFERED": "1", "TMPDIR": str(tmp), JOB_DIR_ENV: str(job_dir),
                                      "TORCH_EXTENSIONS_DIR": str(extensions_dir()),
                                      "PATH": path, "PYTHONPATH": _pythonpath()}
    (layout.fr_dir / "nccl").mkdir(parents=True, exist_ok=True)
    for var, value in ((FR_DIR_ENV, str(layout.fr_dir)), ("TORCH_FR_BUFFER_SIZE", str(FR_BUFFER_SIZE)),
                       ("TORCH_NCCL_DUMP_ON_TIMEOUT", "1"), ("TORCH_FR_DUMP_TEMP_FILE", str(layout.fr_dir / "nccl" / "rank"))):
        if var not in os.environ and not (var == "TORCH_FR_BUFFER_SIZE" and "TORCH_NCCL_TRACE_BUFFER_SIZE" in os.environ):
            changes[var] = value
    changes.update(env or {})
    base_env = envvars.apply(os.environ, changes)
    cmds = [list(map(str, c)) for c in commands]
    layout.job_json.write_text(json.dumps({"commands": cmds, "env": changes}, indent=1))
    if verbose:
        _say(f"[{name}] launching {len(cmds)} command(s), timeout {timeout_s:g} s"
             + (f", stall {stall_s:g} s" if stall_s else "") + f": {' '.join(_short(c) for c in cmds[0])}")
    out = open(layout.launcher_stdout, "ab")
    err = open(layout.launcher_stderr, "ab")
    popens: list[subprocess.Popen[bytes]] = []
    launcher_tail = LineTail(lambda: (layout.launcher_stdout, layout.launcher_stderr))
    t0 = time.monotonic()
    timed_out = hung = False
    stop_reason = ""
    stopped_at = None
    stacks: dict[int, str] = {}
    try:
        for i, cmd in enumerate(cmds):
            proc_env = envvars.apply(base_env, per_process_env[i]) if per_process_env else base_env
            popens.append(subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=proc_env,
                                           cwd=str(cwd or project_root()), start_new_session=True))
        beat = LineCounter(layout.rank_stdouts, heartbeat) if heartbeat else None
        last_progress, last_mark = t0, 0
        cancel = current_cancel()
        while any(p.poll() is None for p in popens):
            time.sleep(poll_s)
            now = time.monotonic()
            if cancel is not None and cancel.is_set():
                stopped_at, stop_reason = time.time(), "cancelled: the run_together call that started it was interrupted"
                break
            if echo:
                _echo(launcher_tail)
            mark = beat.poll() if beat else _progress_size(layout)
            if mark != last_mark:
                last_mark, last_progress = mark, now
            if now - t0 >= timeout_s:
                timed_out, stop_reason = True, f"hard timeout of {timeout_s:g} s expired"
            elif stall_s and last_mark and now - last_progress >= stall_s:
                if layout.live_ranks() or not layout.rank_records():
                    hung, stop_reason = True, f"no progress for {stall_s:g} s (stall window)"
                else:  # every rank has exited: the launcher is only slow to tear down
                    last_progress = now
            if timed_out or hung:
                stopped_at = time.time()
                request_fr_dumps(layout)
                stacks = _collect_stacks(layout)
                if hung and _ended_well(layout, popens):
                    # slow, not hung: every rank had exited 0 by the time the evidence was taken (a loaded machine
                    # stretched a quiet phase past the window); the job's own outcome stands
                    hung, stop_reason, stopped_at, stacks = False, "", None, {}
                    continue
                break
    finally:
        procs.kill_tree([p.pid for p in popens], sessions=[p.pid for p in popens], grace_s=2.0)
        for p in popens:
            try:
                p.wait(timeout=5)
            except subprocess.TimeoutExpired:
                pass
        out.close()
        err.close()
        if echo:
            _echo(launcher_tail)
        shutil.rmtree(tmp, ignore_errors=True)
    wall = time.monotonic() - t0
    result = JobResult(name=name, job_dir=job_dir, commands=cmds, env=changes,
                       returncodes=[p.returncode for p in popens],
                       wall_s=wall, timed_out=timed_out, hung=hung, timeout_s=timeout_s, stall_s=stall_s,
                       ranks=_collect_ranks(layout, stacks), stacks=stacks, stop_reason=stop_reason, stopped_at=stopped_at)
    layout.result_json.write_text(json.dumps(result.to_dict(), indent=1))
    if verbose:
        _say(result.summary().splitlines()[0])
    return result


def _say(line: str) -> None:
    """Print one progress line in a single write: jobs started together (:func:`run_together`) print from
    threads, and ``print``'s separate write of the newline let two lines run into one."""
    sys.stdout.write(line + "\n")
    sys.stdout.flush()


def _ended_well(layout: JobDir, popens: Sequence[subprocess.Popen[bytes]], grace_s: float = 5.0) -> bool:
    """True when every rank that started has exited 0 and every launcher then exits 0 within ``grace_s`` seconds."""
    records = layout.rank_records()
    if not records or any(rec.get("exit_code") != 0 for rec in records.values()):
        return False
    deadline = time.monotonic() + grace_s
    while any(p.poll() is None for p in popens) and time.monotonic() < deadline:
        time.sleep(0.05)
    return all(p.poll() == 0 for p in popens)


def _pythonpath() -> str:
    """``$PYTHONPATH`` with the project root first, so that every rank imports this checkout's ``helpers``."""
    root = str(project_root())
    rest = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and p != root]
    return os.pathsep.join([root, *rest])


def _short(arg: str) -> str:
    root = str(project_root()) + os.sep
    return arg.replace(root, "")


def _echo(tail: LineTail) -> None:
    """Copy the launchers' new whole lines to this process's stdout."""
    text = tail.read_text()
    if text:
        sys.stdout.write(text)
        sys.stdout.flush()


FR_BUFFER_SIZE = 2000
"""Flight Recorder entries kept per rank (``TORCH_FR_BUFFER_SIZE``), the value of torch's own docs
(https://docs.pytorch.org/tutorials/unstable/flight_recorder_tutorial.html)."""
FR_WAIT_S = 10.0
"""Seconds :func:`request_fr_dumps` (and the doctor's node report) wait at most for the ranks' dumps; both return as
soon as every asked rank has written its dump (measured: < 0.1 s on gloo on an idle machine; seconds at load 7)."""


def request_fr_dumps(layout: JobDir, wait_s: float = FR_WAIT_S) -> dict[int, Path]:
    """Ask every live rank of a job for its Flight Recorder dump; return the dumps that arrived.

    Sends SIGUSR2 to each rank whose ``fr/rank<R>.ready`` names its pid (:mod:`helpers._fr_site`; a rank
    without it is left alone: SIGUSR2 would kill it), then waits up to ``wait_s`` seconds for
    ``fr/rank<R>`` to be (re)written.

    Args:
        layout: the job's :class:`JobDir`; wait_s: seconds to wait, > 0.

    Returns:
        ``{rank: path}`` of the dumps written after the request.
    """
    import signal

    t0 = time.time()
    asked: dict[int, Path] = {}
    for rank, pid in layout.live_ranks().items():
        ready = layout.fr_dir / f"rank{rank}.ready"
        try:
            if ready.read_text().strip() == str(pid):
                os.kill(pid, signal.SIGUSR2)
                asked[rank] = layout.fr(rank)
        except (OSError, ValueError):
            continue
    done: dict[int, Path] = {}
    while asked and time.time() - t0 < wait_s:
        for rank, path in asked.items():
            try:
                if rank not in done and path.stat().st_mtime >= t0 - 0.01:
                    done[rank] = path
            except OSError:
                pass
        if len(done) == len(asked):
            break
        time.sleep(0.02)
    return done


def _collect_stacks(layout: JobDir) -> dict[int, str]:
    """py-spy every rank that has not exited yet; save each stack under ``stacks/``."""
    stacks: dict[int, str] = {}
    live = layout.live_ranks()
    if not live:
        return stacks
    layout.stacks_dir.mkdir(exist_ok=True)
    threads = []

    def dump(rank: int, pid: int) -> None:
        stacks[rank] = procs.py_spy_dump(pid)

    for rank, pid in live.items():
        threads.append(threading.Thread(target=dump, args=(rank, pid)))
        threads[-1].start()
    for t in threads:
        t.join()
    for rank, text in stacks.items():
        layout.stack(rank).write_text(text)
    return stacks


def _collect_ranks(layout: JobDir, stacks: Mapping[int, str]) -> dict[int, RankResult]:
    ranks = {}
    for rank, rec in sorted(layout.rank_records().items()):
        ranks[rank] = RankResult(rank=rank, pid=rec.get("pid"), exit_code=rec.get("exit_code"),
                                 stdout_path=layout.rank_stdout(rank), stderr_path=layout.rank_stderr(rank),
                                 start=rec.get("start"), end=rec.get("end"), stack=stacks.get(rank))
    return ranks
