"""The on-disk layout of one job: every path the runner, the rank shim and the doctor share.

Standard library only, so that :mod:`helpers.rankshim` (which must start fast and import no
torch) can use it.  Modelled on torch elastic's ``DefaultLogsSpecs.reify``, which decides every
per-rank path in one place and states them in its docstring
(https://github.com/pytorch/pytorch/blob/main/torch/distributed/elastic/multiprocessing/api.py).

:class:`JobDir` names the paths; :class:`LineTail` reads the new whole lines of growing log
files (the runner's ``echo`` and ``heartbeat``).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

JOB_DIR_ENV = "RUNBOOK_JOB_DIR"
"""Environment variable through which the runner tells every process its job directory."""
FR_DIR_ENV = "RUNBOOK_FR_DIR"
"""Environment variable naming the folder where ranks write Flight Recorder dumps on SIGUSR2 (``<job>/fr``)."""
TRACE_DIR_ENV = "RUNBOOK_TRACE_DIR"
"""Environment variable that overrides where :mod:`helpers.collective_trace` writes (default ``<job>/trace``)."""

_RANK_FILE = re.compile(r"rank(-?\d+)$")


class JobDir:
    """The files of one job, under ``path`` (``build/jobs/<name>-<stamp>-<pid>-<n>/``, see ``jobs.new_job_dir``)::

        <job>/
        ├── job.json                 commands and environment changes of the launchers (runner, at start)
        ├── result.json              JobResult.to_dict() (runner, at the end)
        ├── launcher.stdout          every launcher's merged stdout; rank lines carry a "[rank R] " prefix
        ├── launcher.stderr          the same for stderr
        ├── tmp/                     TMPDIR of every process of the job (runner; removed at the end)
        ├── ranks/
        │   ├── rank<R>.stdout       rank R's stdout, verbatim (rank shim)
        │   ├── rank<R>.stderr       rank R's stderr, verbatim (rank shim)
        │   ├── rank<R>.json         {"rank", "shim_pid", "cmd", "start", "pid"}, then "exit_code" and "end"
        │   │                        once it exited (rank shim; replaced atomically)
        │   ├── .claim<N>            rank indices claimed under a launcher that sets no rank variable
        │   ├── task-<node>          a job across nodes: node's SLURM task started, before torchrun (the task's shell)
        │   ├── started-<node>-<L>   ... its local rank L started, before the rendezvous (allocation_job.py)
        │   └── joined-<node>-<L>    ... and joined the process group (allocation_job.py)
        ├── stacks/rank<R>.txt       py-spy dump of each rank alive when the job hung or timed out (runner)
        ├── trace/rank<R>.jsonl      collective enter/exit records, when the script opted in (collective_trace)
        ├── fr/rank<R>               torch Flight Recorder dump (pickle) of each rank, written when the runner
        │                            declares a stall (SIGUSR2, helpers/_fr_site); fr/rank<R>.ready: rank R can dump
        ├── torchrun/                torchrun's --log-dir; torchrun/node<I>/ per node of a multi-node lab job
        └── nodes/node<I>.stdout     launcher output of node I of a multi-node lab job (netlab), and .stderr

    ``R`` is the global rank (``RANK``, else ``RUNBOOK_RANK``/``SLURM_PROCID``, else a claimed
    index: see :mod:`helpers.rankshim`); ``I`` is a lab node index.  Creating a ``JobDir``
    touches nothing on disk: :meth:`create` makes the folders the runner needs.

    Args:
        path: the job directory (a ``str`` or path-like).
    """

    def __init__(self, path: str | os.PathLike[str]) -> None:
        self.path = Path(path)

    def __repr__(self) -> str:
        return f"JobDir({str(self.path)!r})"

    def __fspath__(self) -> str:
        return str(self.path)

    @classmethod
    def from_env(cls, default: str | os.PathLike[str] = ".") -> JobDir:
        """The job directory named by ``$RUNBOOK_JOB_DIR`` (set by the runner), else ``default``."""
        return cls(os.environ.get(JOB_DIR_ENV) or default)

    def create(self) -> JobDir:
        """Make the job directory, ``ranks/`` and ``tmp/`` (existing ones are kept); return ``self``."""
        self.ranks_dir.mkdir(parents=True, exist_ok=True)
        self.tmp_dir.mkdir(exist_ok=True)
        return self

    # ------------------------------------------------------------------ top-level files
    @property
    def job_json(self) -> Path:
        """``job.json``: the launchers' commands and environment changes."""
        return self.path / "job.json"

    @property
    def result_json(self) -> Path:
        """``result.json``: the job's result as JSON."""
        return self.path / "result.json"

    @property
    def launcher_stdout(self) -> Path:
        """``launcher.stdout``: the launchers' merged stdout."""
        return self.path / "launcher.stdout"

    @property
    def launcher_stderr(self) -> Path:
        """``launcher.stderr``: the launchers' merged stderr."""
        return self.path / "launcher.stderr"

    @property
    def tmp_dir(self) -> Path:
        """``tmp/``: the job's ``TMPDIR``."""
        return self.path / "tmp"

    # ------------------------------------------------------------------ ranks
    @property
    def ranks_dir(self) -> Path:
        """``ranks/``: the rank shim's per-rank files."""
        return self.path / "ranks"

    def rank_stdout(self, rank: int | str) -> Path:
        """``ranks/rank<R>.stdout``."""
        return self.ranks_dir / f"rank{rank}.stdout"

    def rank_stderr(self, rank: int | str) -> Path:
        """``ranks/rank<R>.stderr``."""
        return self.ranks_dir / f"rank{rank}.stderr"

    def rank_record(self, rank: int | str) -> Path:
        """``ranks/rank<R>.json``: pid and exit status of rank R."""
        return self.ranks_dir / f"rank{rank}.json"

    def rank_claim(self, index: int) -> Path:
        """``ranks/.claim<N>``: the marker of a claimed rank index."""
        return self.ranks_dir / f".claim{index}"

    def rank_logs(self) -> list[Path]:
        """Every ``ranks/rank<R>.stdout`` and ``.stderr`` present now."""
        return sorted(self.ranks_dir.glob("rank*.std*"))

    def rank_stdouts(self) -> list[Path]:
        """Every ``ranks/rank<R>.stdout`` present now."""
        return sorted(self.ranks_dir.glob("rank*.stdout"))

    def rank_ids(self) -> list[int]:
        """The ranks that have a ``rank<R>.json`` record, sorted."""
        return sorted(r for r in (_rank_of(p) for p in self.ranks_dir.glob("rank*.json")) if r is not None)

    def rank_records(self) -> dict[int, dict]:
        """Rank id -> the shim's record (``rank<R>.json``); records being rewritten or unreadable are skipped."""
        records = {}
        for path in self.ranks_dir.glob("rank*.json"):
            try:
                rec = json.loads(path.read_text())
            except (json.JSONDecodeError, FileNotFoundError):
                continue
            records[int(rec["rank"])] = rec
        return records

    def live_ranks(self) -> dict[int, int]:
        """Rank id -> pid of the ranks that started and have not exited (per the shim's records)."""
        return {r: rec["pid"] for r, rec in self.rank_records().items() if "exit_code" not in rec and rec.get("pid")}

    # ------------------------------------------------------------------ stacks, traces
    @property
    def stacks_dir(self) -> Path:
        """``stacks/``: py-spy dumps taken at a hang or timeout."""
        return self.path / "stacks"

    def stack(self, rank: int | str) -> Path:
        """``stacks/rank<R>.txt``."""
        return self.stacks_dir / f"rank{rank}.txt"

    def stacks(self) -> dict[int, Path]:
        """Rank id -> its saved stack file, for the stacks present now."""
        return {r: p for p in self.stacks_dir.glob("rank*.txt") if (r := _rank_of(p)) is not None}

    @property
    def trace_dir(self) -> Path:
        """``trace/``: the collective traces (:mod:`helpers.collective_trace`)."""
        return self.path / "trace"

    def trace(self, rank: int | str) -> Path:
        """``trace/rank<R>.jsonl``."""
        return self.trace_dir / f"rank{rank}.jsonl"

    # ------------------------------------------------------------------ launchers' own logs
    @property
    def fr_dir(self) -> Path:
        """``fr/``: the ranks' Flight Recorder dumps (:mod:`helpers.flight_recorder`)."""
        return self.path / "fr"

    def fr(self, rank: int | str) -> Path:
        """``fr/rank<R>``: rank R's Flight Recorder dump (torch's pickle)."""
        return self.fr_dir / f"rank{rank}"

    @property
    def torchrun_dir(self) -> Path:
        """``torchrun/``: torchrun's ``--log-dir``."""
        return self.path / "torchrun"

    def torchrun_node_dir(self, node: int) -> Path:
        """``torchrun/node<I>``: torchrun's ``--log-dir`` of lab node I."""
        return self.torchrun_dir / f"node{node}"

    @property
    def nodes_dir(self) -> Path:
        """``nodes/``: per-node launcher output of a multi-node lab job."""
        return self.path / "nodes"

    def node_stdout(self, node: int) -> Path:
        """``nodes/node<I>.stdout``."""
        return self.nodes_dir / f"node{node}.stdout"

    def node_stderr(self, node: int) -> Path:
        """``nodes/node<I>.stderr``."""
        return self.nodes_dir / f"node{node}.stderr"

    # --- the markers of a job across nodes (helpers.allocation.across names the node whose ranks never came)

    def node_marker(self, what: str, node: str, local_rank: int) -> Path:
        """``ranks/<what>-<node>-<local_rank>`` (``what``: ``started`` or ``joined``)."""
        return self.ranks_dir / f"{what}-{node}-{local_rank}"

    def node_markers(self, what: str) -> set[tuple[str, int]]:
        """``{(node, local_rank)}`` of every ``ranks/<what>-<node>-<local_rank>`` marker."""
        return {(p.name[len(what) + 1:].rsplit("-", 1)[0], int(p.name.rsplit("-", 1)[1]))
                for p in self.ranks_dir.glob(f"{what}-*") if p.name.rsplit("-", 1)[1].isdigit()}

    def task_marker_shell(self) -> str:
        """The shell line a SLURM task runs before ``torchrun``: ``touch <ranks>/task-<node>`` (``$SLURMD_NODENAME``,
        else ``hostname``), the node expanded by the task's own shell."""
        import shlex

        return f'touch {shlex.quote(str(self.ranks_dir))}/task-"${{SLURMD_NODENAME:-$(hostname)}}"'

    def task_markers(self) -> set[str]:
        """The nodes whose SLURM task left its ``ranks/task-<node>`` marker."""
        return {p.name[len("task-"):] for p in self.ranks_dir.glob("task-*")}


def _rank_of(path: Path) -> int | None:
    """``3`` for ``rank3.json`` / ``rank3.txt`` / ``rank3.stdout``; ``None`` for other names."""
    m = _RANK_FILE.match(path.name.split(".", 1)[0])
    return int(m.group(1)) if m else None


class LineTail:
    """Reads the whole lines appended to a set of growing files since the last read.

    The set is re-evaluated at each read (rank logs appear while a job runs); a partial last
    line is kept for the next read.  Example (what the runner's ``heartbeat`` does)::

        tail = LineTail(lambda: JobDir(job).rank_stdouts())
        steps = sum(1 for line in tail.read() if "step" in line)

    Args:
        files: a callable returning the paths to follow (missing files are skipped).
    """

    def __init__(self, files: Callable[[], Iterable[Path]]) -> None:
        self.files = files
        self.offsets: dict[Path, int] = {}

    def read(self) -> list[str]:
        """The new whole lines of every file, file by file, without their line ends."""
        return self.read_text().splitlines()

    def read_text(self) -> str:
        """The new whole lines of every file, as one text (line ends kept)."""
        parts = []
        for path in self.files():
            start = self.offsets.get(path, 0)
            try:
                with open(path, "rb") as fh:
                    fh.seek(start)
                    chunk = fh.read()
            except FileNotFoundError:
                continue
            end = chunk.rfind(b"\n") + 1  # only whole lines
            self.offsets[path] = start + end
            if end:
                parts.append(chunk[:end].decode(errors="replace"))
        return "".join(parts)


class LineCounter:
    """Counts the lines matching a regex appended to a set of files (the runner's ``heartbeat``).

    Args:
        files: as for :class:`LineTail`.
        pattern: a regular expression, searched in each line.
    """

    def __init__(self, files: Callable[[], Iterable[Path]], pattern: str) -> None:
        self.rx = re.compile(pattern)
        self.tail = LineTail(files)
        self.count = 0

    def poll(self) -> int:
        """Read the new lines and return the running count of matching lines."""
        self.count += sum(1 for line in self.tail.read() if self.rx.search(line))
        return self.count


DEEPSPEED_SHM_PREFIX = "deepspeed_allreduce_buffer"
"""Name prefix of DeepSpeed's CPU all-reduce segments in ``/dev/shm`` (``SHM_BUFFER_NAME`` in DeepSpeed's
``csrc/cpu/comm/shm.cpp``)."""


def deepspeed_shm_name(rank: int, env: Mapping[str, str] | None = None) -> str | None:
    """The ``/dev/shm`` name of ``rank``'s DeepSpeed CPU all-reduce buffer, or None without MASTER_ADDR/MASTER_PORT.

    DeepSpeed's ``shm_initialize`` (csrc/cpu/comm/shm.cpp) names it ``deepspeed_allreduce_buffer_<uid>_<MASTER_ADDR>_
    <MASTER_PORT>_<rank>`` (uid and address/port in the name since deepspeedai/DeepSpeed#4115).  ``env`` defaults to
    ``os.environ``.
    """
    env = os.environ if env is None else env
    addr, port = env.get("MASTER_ADDR"), env.get("MASTER_PORT")
    if not addr or not port:
        return None
    return f"{DEEPSPEED_SHM_PREFIX}_{os.getuid()}_{addr}_{port}_{rank}"


def remove_deepspeed_shm(rank: int, shm_dir: str = "/dev/shm", env: Mapping[str, str] | None = None) -> bool:
    """Unlink ``rank``'s DeepSpeed CPU all-reduce buffer (about 66 MB) if it exists; return whether one was removed.

    DeepSpeed creates one such segment per rank when every rank is on one node (``LOCAL_SIZE`` equals the world
    size, which the ``deepspeed`` launcher exports) and never unlinks it: ``shared_close`` in shm.cpp is never
    called, so each run leaves its segments until reboot (the author of deepspeedai/DeepSpeed#4115 says so; the
    leak filled a CI machine's /dev/shm in sgl-project/sglang#38638).  Call it after a barrier, once every peer has
    mapped the segment: the peers' mappings outlive the unlink.  ``env`` defaults to ``os.environ``.
    """
    name = deepspeed_shm_name(rank, env)
    if name is None:
        return False
    try:
        os.unlink(os.path.join(shm_dir, name))
    except FileNotFoundError:
        return False
    return True
