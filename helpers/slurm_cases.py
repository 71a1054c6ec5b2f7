"""Chapter 08's batch jobs: the command builder's working ``sbatch`` script and the breakages users make of it.

:func:`job_script` renders the working pattern with :func:`helpers.slurm.sbatch_script` (Gilbreth
4.3 and 8.5: ``sbatch`` -> ``srun`` one task per node -> ``torchrun --node-rank=$SLURM_NODEID``,
``MASTER_ADDR`` from ``scontrol show hostnames``, exported, ``--export=ALL``) for 2 CPU nodes of the
SLURM lab (gloo); :func:`break_script` makes one known mistake in it, as a textual edit of that
script, so that :func:`diff` shows the one or two lines that differ.  Each entry of :data:`BREAKS`
carries its seed source.  Nothing here runs anything: :mod:`helpers.slurm` submits and waits.
"""

from __future__ import annotations

import difflib
import os
import re
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path

from helpers import jobdir, jobs, slurm
from helpers.validate import one_of, positive_int

SCENARIOS = Path(__file__).resolve().parent / "scenarios"
ROOT = Path(__file__).resolve().parent.parent


def job_env(work: str | os.PathLike[str]) -> dict[str, str]:
    """The submitting environment of the chapter's jobs: the venv's ``torchrun`` first on ``PATH``, scratch on the shared folder.

    ``sbatch`` passes it on (``--export=ALL`` is its default); the lab's nodes share the project folder.
    """
    return {"PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "/usr/bin:/bin")]),
            "PYTHONPATH": str(ROOT), "PYTHONUNBUFFERED": "1", "RUNBOOK_JOB_DIR": str(work),
            # DeepSpeed JIT-builds its CPU comm op there once (~30-90 s); every later job reuses it (helpers.jobs does the same)
            "TORCH_EXTENSIONS_DIR": str(jobs.extensions_dir())}


def job_script(work: str | os.PathLike[str], name: str, script: str | os.PathLike[str], args: Sequence[object] = (), *,
               port: int, nodes: int = 2, nproc: int = 1, env: Mapping[str, str | None] | None = None,
               time: str = "00:03:00", rdzv_timeout_s: int = 10) -> str:
    """The builder's working ``sbatch`` script for ``script`` on ``nodes`` CPU nodes of the SLURM lab, gloo.

    Args:
        work: the job folder on the shared filesystem (``--output``/``--error`` go there as ``%x_%j.out|.err``).
        name: ``--job-name``.
        script, args: the training script and its arguments.
        port: ``MASTER_PORT`` (1..65535).
        nodes, nproc: nodes and ranks per node (>= 1).
        env: re-exported inside the ``srun`` task (``None``: ``unset``), after ``RUNBOOK_BACKEND=gloo``.
        time: ``--time``.
        rdzv_timeout_s: torchrun's rendezvous timeout (``--rdzv-conf=timeout=``; the default is 900 s,
            far too long to wait for a broken job in a chapter), >= 1.

    Returns:
        The script text.

    Raises:
        ValueError: as :func:`helpers.slurm.sbatch_script`, or ``rdzv_timeout_s`` < 1.
    """
    positive_int(rdzv_timeout_s, "rdzv_timeout_s", 1)
    text = slurm.sbatch_script(name, nodes, nproc, str(script), list(args), gpus_per_node=0, cpus_per_task=1,
                               partition="lab", account="lab", time=time, master_port=port, log_dir=str(work),
                               env={"RUNBOOK_BACKEND": "gloo", **(env or {})}, rdzv_conf=f"timeout={rdzv_timeout_s}")
    return text


def hang_script(work: str | os.PathLike[str], name: str, *, port: int, mode: str = "bug", case: str = "mismatch",
                timeout_s: int = 120, rdzv_timeout_s: int = 10) -> str:
    """A 2-node batch job of ``scenarios/hangs.py --case CASE`` that hangs (``mode="bug"``) or completes (``"fix"``).

    The ranks run under the rank shim (:mod:`helpers.rankshim`) with ``RUNBOOK_FR_DIR`` = :func:`hang_fr_dir` and
    ``TORCH_FR_BUFFER_SIZE`` = :data:`helpers.jobs.FR_BUFFER_SIZE`: torch's Flight Recorder is on, and a rank writes its dump when asked
    (:mod:`helpers._fr_site`), so ``runbook doctor --slurm-job`` reads torch's own record of the collectives,
    with no change to the script.  ``case="mismatch"`` (D19): at step 2 the last rank calls ``broadcast``
    where the others call ``all_reduce``.

    Args:
        work, name, port, rdzv_timeout_s: as :func:`job_script`.
        mode: ``bug`` or ``fix``.
        case: one of ``scenarios/hangs.py``'s cases.
        timeout_s: the collective timeout of the process group (s, >= 1): how long the hang lasts before
            gloo raises; keep it well above the stall window so that the doctor sees the live hang.

    Raises:
        ValueError: a bad ``mode``, ``timeout_s``, or as :func:`job_script`.
    """
    one_of(mode, "mode", ("bug", "fix"))
    positive_int(timeout_s, "timeout_s", 1)
    args = [SCENARIOS / "hangs.py", "--case", case, "--mode", mode, "--timeout-s", timeout_s, "--steps", 4]
    env = {"TORCH_FR_BUFFER_SIZE": str(jobs.FR_BUFFER_SIZE), jobdir.FR_DIR_ENV: str(hang_fr_dir(work, name))}
    return job_script(work, name, jobs.SHIM, args, port=port, env=env, rdzv_timeout_s=rdzv_timeout_s)


def hang_fr_dir(work: str | os.PathLike[str], name: str) -> Path:
    """The Flight Recorder folder of job ``name`` of :func:`hang_script`: ``<work>/fr-<name>``.

    One per job: two jobs writing ``rank<R>.ready`` into one folder overwrite each other's pids, and the
    doctor then asks no rank for its dump.
    """
    return Path(work) / f"fr-{name}"


def _sub(pattern: str, repl: str, count: int = 0) -> Callable[[str], str]:
    def edit(text: str) -> str:
        new, n = re.subn(pattern, repl, text, count=count, flags=re.M)
        if not n:
            raise ValueError(f"break: {pattern!r} not found in the script")
        return new
    return edit


def _chain(*edits: Callable[[str], str]) -> Callable[[str], str]:
    def edit(text: str) -> str:
        for e in edits:
            text = e(text)
        return text
    return edit


def _hostfile(text: str) -> str:
    """Replace the srun + torchrun launch by ``deepspeed --hostfile`` built from the allocation."""
    m = re.search(r"^srun .*?\n'\n", text, flags=re.S | re.M)
    if not m:
        raise ValueError("break: no srun launch in the script")
    script = re.search(r"--rdzv-conf=timeout=\d+ \\\n\s+(\S+)((?: \\\n\s+\S+)*)\n'", m.group(0))
    if not script:
        raise ValueError("break: no torchrun script in the launch")
    args = " ".join(a.strip(" \\\n") for a in script.group(2).split("\\\n") if a.strip(" \\\n"))
    launch = ('scontrol show hostnames "$SLURM_JOB_NODELIST" | sed "s/$/ slots=1/" > "hostfile_$SLURM_JOB_ID"\n'
              'deepspeed --hostfile "hostfile_$SLURM_JOB_ID" --master_addr "$MASTER_ADDR" --master_port "$MASTER_PORT" \\\n'
              f"    {script.group(1)} {args}\n")
    return text[:m.start()] + launch + text[m.end():]


BREAKS: dict[str, tuple[str, str, Callable[[str], str]]] = {
    "output-in-tmp": ("--output/--error in node-local /tmp (made on the login node only)",
                      "Gilbreth 8.12 failure mode 1; PF-slurm-node-tmp",
                      _sub(r"^(#SBATCH --(?:output|error))=\S+/(%x_%j\.(?:out|err))$", r"\1=/tmp/ch08/\2")),
    "script-in-tmp": ("the training script in node-local /tmp (written on the login node only)",
                      "Gilbreth 8.12 failure mode 1",
                      _sub(r"^(\s+)\S*/helpers/scenarios/(\w+\.py) \\$", r"\1/tmp/ch08/\2 \\")),
    "deepspeed-hostfile": ("deepspeed --hostfile from scontrol show hostnames instead of srun + torchrun",
                           "Gilbreth 8.5, Gilbreth 8.12 failure mode 3; D6", _hostfile),
    "srun-export-none": ("srun --export=NONE: the tasks start without the batch shell's environment",
                         "Gilbreth 8.5, Gilbreth 8.12 failure mode 4",
                         _sub(r"--export=ALL", "--export=NONE")),
    "set-not-exported": ("NCCL_DEBUG=INFO set in the batch shell, not exported, not re-exported in the task",
                         "Gilbreth 8.12 failure mode 4",
                         _sub(r"^(export MASTER_PORT=\d+)$", r"NCCL_DEBUG=INFO\n\1")),
    "master-addr-not-exported": ("MASTER_ADDR computed but not exported before the single-quoted srun bash -c",
                                 "Gilbreth 8.5 (export MASTER_ADDR MASTER_PORT); PF-slurm-unexported-master",
                                 _sub(r"^export MASTER_ADDR\n", "")),
    "node-rank-expanded-early": ("NODE_RANK=$SLURM_NODEID taken in the batch shell (node 0) and passed to every task",
                                 "Gilbreth 4.3, Gilbreth 8.5 (NODE_RANK=$SLURM_NODEID inside the task)",
                                 _chain(_sub(r"^(srun )", 'export NODE_RANK="$SLURM_NODEID"   # in the batch shell: node 0\n\\1'),
                                        _sub(r'--node-rank="\$SLURM_NODEID"', '--node-rank="$NODE_RANK"'))),
    "ntasks-per-node-2": ("--ntasks-per-node=2 (one per GPU, as for srun python) with torchrun --nproc-per-node=1",
                          "Gilbreth 8.2 (one task per node: torchrun spawns the ranks)",
                          _sub(r"--ntasks-per-node=1", "--ntasks-per-node=2")),
    "standalone-multinode": ("torchrun --standalone (a single-node command) copied into the 2-node job",
                             "D2; torchrun docs (--standalone: single-node)",
                             _sub(r'--node-rank="\$SLURM_NODEID" \\\n\s+--master-addr="\$MASTER_ADDR" \\\n\s+'
                                  r'--master-port="\$MASTER_PORT" \\\n\s+--rdzv-conf=timeout=(\d+)', r"--standalone --rdzv-conf=join_timeout=\1")),
}
"""Known breakages: name -> (what the user did, seed source, edit of :func:`job_script`'s text)."""


def break_script(text: str, name: str) -> str:
    """``text`` (a :func:`job_script`) with breakage ``name`` of :data:`BREAKS` made in it.

    Raises:
        ValueError: ``name`` not in :data:`BREAKS`, or the script lacks the line the breakage edits.
    """
    one_of(name, "name", tuple(BREAKS))
    return BREAKS[name][2](text)


def diff(before: str, after: str) -> str:
    """The changed lines only (``-`` old, ``+`` new), no context: what the breakage is."""
    lines = difflib.unified_diff(before.splitlines(), after.splitlines(), lineterm="", n=0)
    return "\n".join(line for line in lines if line[:1] in "+-" and not line.startswith(("+++", "---")))


def submit_all(client: slurm.SlurmClient, work: str | os.PathLike[str], scripts: Mapping[str, str], *,
               env: Mapping[str, str | None] | None = None) -> dict[str, str]:
    """Submit every script (``--job-name=<name>``, so its files are ``<name>_<id>.out|.err``); name -> job id.

    Raises:
        ValueError: a bad name; RuntimeError: ``sbatch`` refused a script.
    """
    return {name: slurm.submit(client, text, work, name=name, env=job_env(work) if env is None else env,
                               sbatch_args=[f"--job-name={name}"]) for name, text in scripts.items()}


def run_jobs(client: slurm.SlurmClient, work: str | os.PathLike[str], scripts: Mapping[str, str], *,
             timeout_s: float = 90.0, env: Mapping[str, str | None] | None = None) -> dict[str, slurm.JobState]:
    """Submit every script at once (SLURM runs them side by side as far as the CPUs allow) and wait for all.

    Args:
        client: the SLURM lab (or :class:`helpers.slurm.LocalSlurm`).
        work: the shared job folder (each script is written there as ``<name>.sbatch``).
        scripts: name -> batch script text (names: letters, digits, ``_.-``); each job runs as
            ``--job-name=<name>``, so its files are ``<name>_<id>.out|.err``.
        timeout_s: how long to wait for all of them; a job still running then is cancelled
            (its state says ``CANCELLED``).
        env: the submitting environment (default :func:`job_env`).

    Returns:
        name -> :class:`helpers.slurm.JobState`, in the order of ``scripts``.

    Raises:
        ValueError: a bad name or ``timeout_s``; RuntimeError: ``sbatch`` refused a script.
    """
    ids = submit_all(client, work, scripts, env=env)
    states = slurm.wait_jobs(client, list(ids.values()), timeout_s)
    return {name: states[job_id] for name, job_id in ids.items()}


def show(states: Mapping[str, slurm.JobState], grep: str = r"rror|can't open|srun: |Unable|address") -> None:
    """Print each job's summary, which output files exist, and, for a job that did not complete with exit 0, the lines
    of its stderr that match ``grep``.  A completed job's stderr is not shown: torchrun's agents may log a failed exit
    barrier after every rank succeeded ("Error waiting on exit barrier", torch/distributed/elastic/agent/server/api.py,
    when the store's host left first), noise that differs from run to run."""
    for name, s in states.items():
        files = ", ".join(f"{Path(p).name}{'' if ok else ' (missing)'}" for p, ok in s.files().items())
        print(f"{name}: {s.summary()} | files: {files}")
        if s.state == "COMPLETED" and s.exit_code == "0:0":
            continue
        for line in [ln for ln in s.err().splitlines() if re.search(grep, ln)][:6]:
            print("    " + line[:220])


def wait_queue(client: slurm.SlurmClient, expect: Mapping[str, str], timeout_s: float = 30.0) -> list[list[str]]:
    """Poll :func:`helpers.slurm.queue` until every job of ``expect`` shows its state code (``{"12": "PD"}``); the last rows.

    A ``PD`` job must also show a reason other than ``None`` (the controller fills it in on its next scheduling pass).
    Returns the rows seen last when ``timeout_s`` passes first (the caller's assertion then says what differed).
    """
    positive_int(int(timeout_s), "timeout_s", 1)
    deadline = time.monotonic() + timeout_s
    while True:
        rows = slurm.queue(client)
        seen = {row[0]: row for row in rows}
        if all(j in seen and seen[j][1] == code and (code != "PD" or seen[j][-1] != "None") for j, code in expect.items()):
            return rows
        if time.monotonic() > deadline:
            return rows
        time.sleep(0.5)
