"""SLURM launch forms: ``srun`` + ``torchrun`` (one agent per node) and a whole ``sbatch`` script.

Multi-node jobs on a SLURM cluster start one ``torchrun`` agent per node with ``srun
--ntasks-per-node=1``; each agent spawns that node's ranks (Gilbreth 4.3, Gilbreth 8.2, Gilbreth 8.13).
The forms here carry the guide's fixes for its multi-node failure modes (§8.12):

* ``MASTER_ADDR`` / ``MASTER_PORT`` are *exported* before ``srun`` (a plain assignment does not
  reach the tasks; PF-slurm-unexported-master: ``The hostname of the rendezvous endpoint ':29500' must be
  ...``), ``--export=ALL`` passes them on (Failure Mode 4);
* the node rank comes from ``$SLURM_NODEID`` (static form) or the rendezvous (c10d form, run id
  ``$SLURM_JOB_ID``);
* the NCCL/gloo variables are re-exported inside the ``bash -c`` of each task (Failure Mode 4);
  a value of ``None`` becomes ``unset`` (``unset NCCL_SOCKET_IFNAME``, Failure Mode 2).

The launch forms return text, validated (bad input raises ``ValueError`` naming the field);
``tests/lab/test_slurm_lab.py`` runs the rendered script on the real SLURM lab.
:func:`submit`, :func:`job_state`, :func:`wait_job`/:func:`wait_jobs`, :func:`wait_stalled` and :func:`queue` submit and
watch jobs through any SLURM client (the lab, or :class:`LocalSlurm` on a login node), reading
``scontrol show job -o`` (no accounting database needed); :func:`nccl_profile` reads the NCCL
profiles of §8.4 (``configs/nccl_single_node.env``, ``configs/nccl_multi_node.env``).
"""

from __future__ import annotations

import dataclasses
import os
import re
import shlex
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from helpers import envvars, procs
from helpers.envvars import shell_lines
from helpers.launchers import DEFAULT_MASTER_PORT, torchrun_flags
from helpers.validate import one_of, positive_float, positive_int, tcp_port

SLURM_RDZV_FORMS = ("static", "c10d")
"""The forms of :data:`helpers.launchers.RDZV_FORMS` that span nodes (``standalone`` is one node only)."""
_JOB_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_TIME = re.compile(r"(\d+-)?\d{1,2}(:\d{2}){0,2}|\d+")  # SLURM --time: MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]
# Commented toggles for the sbatch template (NCCL variables as commented toggles, each with its purpose).
NCCL_TOGGLES = (
    ("NCCL_DEBUG=INFO", "log transports and interfaces: the evidence for MN1/MN2 hangs (runbook nccl-log)"),
    ("NCCL_DEBUG_SUBSYS=INIT,NET", "narrow NCCL_DEBUG to init and networking"),
    ("NCCL_SOCKET_IFNAME=^docker0,lo", "only if auto-detection picks a bridge; never one node's exact name (§8.12)"),
    ("NCCL_IB_DISABLE=1", "TCP-only clusters: stop probing for InfiniBand (MN2)"),
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING=1", "a timed-out collective tears the job down (MN3)"),
)


def srun_torchrun(nnodes: int | str, nproc_per_node: int, script: str, script_args: Sequence[object] = (), *,
                  rdzv: str = "static", master_port: int = DEFAULT_MASTER_PORT,
                  env: Mapping[str, str | None] | None = None, srun_args: Sequence[str] = (),
                  ntasks_per_node: int = 1, export: str = "ALL", nodelist: Sequence[str] = (),
                  pre_launch: Sequence[str] = (), rdzv_conf: str | None = None) -> str:
    """The shell lines that start ``script`` on every node of the allocation: ``srun`` + ``torchrun``.

    Meant to run inside an allocation (``sbatch`` or ``salloc``): it reads ``$SLURM_JOB_NODELIST``,
    ``$SLURM_JOB_ID`` and, per task, ``$SLURM_NODEID``.

    Args:
        nnodes: number of nodes, an integer >= 1, or a shell expression such as
            ``"$SLURM_JOB_NUM_NODES"``.
        nproc_per_node: ranks per node (GPUs per node), >= 1.
        script: the training script; on a shared filesystem, never ``/tmp`` (§8.12).
        script_args: its arguments (each shell-quoted).
        rdzv: ``static`` (``--node-rank=$SLURM_NODEID --master-addr --master-port``, as in §4.3)
            or ``c10d`` (``--rdzv-backend=c10d --rdzv-id=$SLURM_JOB_ID``, identical on every node;
            also what elastic restarts need, chapter 07).
        master_port: rendezvous port on the first node, 1..65535.
        env: variables re-exported in every task (``None`` value: ``unset``).
        srun_args: extra ``srun`` options (``--gpus-per-node=8``...).  Unless they name
            ``--cpus-per-task``, the line carries ``--cpus-per-task="${SLURM_CPUS_PER_TASK:-nproc_per_node}"``:
            Slurm 22.05-23.02's ``srun`` does not inherit the batch value (23.11 does again).
        ntasks_per_node: ``srun --ntasks-per-node``; 1 is right (one torchrun per node, §8.2): another
            value is written as given so that the command builder can show the trap it makes.
        export: ``srun --export`` (``ALL``; ``NONE`` is written as given, Failure Mode 4).
        nodelist: the nodes of this job when they are a subset of the allocation (a job step on some
            nodes of it): ``MASTER_ADDR`` is the first of them, not the allocation's first node; empty
            (default): ``$SLURM_JOB_NODELIST``.
        pre_launch: shell lines each task runs before ``torchrun`` (inside the task body, so ``$SLURMD_NODENAME``
            and the like expand per node), e.g. a marker file that says the task started.
        rdzv_conf: torchrun's ``--rdzv-conf`` (``timeout=10``: the static store waits 10 s for every agent).

    Returns:
        Shell text (several lines, ending with a newline).

    Raises:
        ValueError: naming the field: ``nnodes``/``nproc_per_node`` < 1, ``rdzv`` not one of
            :data:`SLURM_RDZV_FORMS`, ``master_port`` outside 1..65535, an empty ``script``, an invalid
            variable name in ``env``.
    """
    if any(not isinstance(n, str) or not re.fullmatch(r"[A-Za-z0-9_.\-\[\],]+", n) for n in nodelist):
        raise ValueError(f"nodelist={list(nodelist)!r}: node names (letters, digits, '_.-', SLURM ranges)")
    if isinstance(nnodes, str):
        if not nnodes.strip():
            raise ValueError("nnodes: an integer >= 1 or a shell expression such as $SLURM_JOB_NUM_NODES")
    else:
        positive_int(nnodes, "nnodes", 1)
    positive_int(nproc_per_node, "nproc_per_node", 1)
    if rdzv not in SLURM_RDZV_FORMS:
        raise ValueError(f"rdzv={rdzv!r}: accepted values are {', '.join(SLURM_RDZV_FORMS)}")
    tcp_port(master_port, "master_port")
    positive_int(ntasks_per_node, "ntasks_per_node", 1)
    if not isinstance(export, str) or not re.fullmatch(r"[A-Za-z0-9_,=]+", export):
        raise ValueError(f"export={export!r}: ALL, NONE or a comma-separated list of variable names")
    if not isinstance(script, str) or not script.strip():
        raise ValueError(f"script={script!r}: the training script's path is required")
    task_env = shell_lines(env or {})
    # Shell text, double-quoted so that each task expands it: $SLURM_NODEID differs per node.
    if rdzv == "static":
        flags = torchrun_flags("static", nnodes=nnodes, nproc_per_node=nproc_per_node, node_rank='"$SLURM_NODEID"',
                               master_addr='"$MASTER_ADDR"', master_port='"$MASTER_PORT"', rdzv_conf=rdzv_conf)
    else:
        flags = torchrun_flags("c10d", nnodes=nnodes, nproc_per_node=nproc_per_node, rdzv_id='"$SLURM_JOB_ID"',
                               rdzv_endpoint='"$MASTER_ADDR:$MASTER_PORT"', rdzv_conf=rdzv_conf)
    torchrun = ["torchrun", *flags, shlex.quote(script), *(shlex.quote(str(a)) for a in script_args)]
    body = [*task_env, *pre_launch, " \\\n      ".join([" ".join(torchrun[:3]), *torchrun[3:]])]
    # The task body is single-quoted, so $SLURM_NODEID expands in each task, not in the batch shell.
    inner = "\n    ".join(body).replace("'", "'\\''")
    # Slurm 22.05-23.02: srun does not inherit the batch --cpus-per-task (23.11 does again); without it a task may get 1 CPU (issue 17)
    cpus = ([] if any(a.split("=")[0] == "--cpus-per-task" for a in srun_args)
            else [f'--cpus-per-task="${{SLURM_CPUS_PER_TASK:-{nproc_per_node}}}"'])
    srun = ["srun", f"--nodes={nnodes}", f"--ntasks-per-node={ntasks_per_node}", *cpus, f"--export={export}",
            *map(shlex.quote, srun_args)]
    hosts = shlex.quote(",".join(nodelist)) if nodelist else '"$SLURM_JOB_NODELIST"'
    # assigned, then exported: `export X="$(cmd)"` returns export's status and hides a failed scontrol from set -e
    # (ShellCheck SC2155); assigned alone, the batch script stops there instead of starting tasks with no address
    return (f"MASTER_ADDR=\"$(scontrol show hostnames {hosts} | head -n 1)\"\n"
            f"export MASTER_ADDR\n"
            f"export MASTER_PORT={master_port}\n"
            f"{' '.join(srun)} bash -c '\n    {inner}\n'\n")


def sbatch_script(job_name: str, nodes: int, nproc_per_node: int, script: str, script_args: Sequence[object] = (), *,
                  gpus_per_node: int | None = None, cpus_per_task: int | None = None, time: str = "00:30:00",
                  partition: str | None = None, account: str | None = None, rdzv: str = "static",
                  master_port: int = DEFAULT_MASTER_PORT, env: Mapping[str, str | None] | None = None,
                  log_dir: str = ".", setup: Sequence[str] = (), ntasks_per_node: int = 1, export: str = "ALL",
                  rdzv_conf: str | None = None) -> str:
    """A complete ``sbatch`` job script for ``script`` on ``nodes`` nodes (Gilbreth 8.13, fixed).

    Header: ``#SBATCH`` lines (``--ntasks-per-node=1``: one torchrun per node, Gilbreth 8.2); partition,
    account and (when not given) the GPU request are written as *disabled* ``##SBATCH ... # EDIT``
    lines, so the script runs as it is on a small CPU cluster and a GPU user enables one line;
    ``set -euo pipefail``; the NCCL toggles of :data:`NCCL_TOGGLES` commented out with their purpose;
    then :func:`srun_torchrun`.  The header comment carries the command that submits it.

    Logs: ``sbatch`` opens ``--output``/``--error`` *before* the script runs, so a missing folder fails
    the job with no output file anywhere (issue 11); the default ``log_dir="."`` writes them next to
    the submit directory, which always exists; another ``log_dir`` must be created before ``sbatch``
    (the header's submit command does ``mkdir -p``).

    Args:
        job_name: ``--job-name`` (letters, digits, ``_.-``; at most 64).
        nodes: ``--nodes``, >= 1.
        nproc_per_node: ranks per node, >= 1.
        script, script_args, rdzv, master_port, env: as in :func:`srun_torchrun`.
        gpus_per_node: ``--gpus-per-node``; ``None`` (default) writes the request disabled
            (``##SBATCH --gpus-per-node=<nproc_per_node>  # EDIT``: a CPU cluster runs it as it is);
            0 writes none (a CPU job: gloo).
        cpus_per_task: ``--cpus-per-task`` (cores for the one torchrun task of each node), >= 1;
            ``None``: ``nproc_per_node`` (one core per rank: a larger default stays pending forever on
            small CPU nodes).
        time: ``--time`` in a SLURM format (``MM``, ``HH:MM:SS``, ``D-HH:MM:SS``).
        partition, account: written as given, or as a disabled ``##SBATCH ... # EDIT`` line.
        log_dir: where ``%x_%j.out``/``.err`` go (default the submit directory); it must exist at
            submit time (see above).
        setup: shell lines run before the launch (``module load ...``, ``source .venv/bin/activate``).
        ntasks_per_node, export: as in :func:`srun_torchrun` (the ``srun`` line's options; keep 1 and ``ALL``).
        rdzv_conf: as in :func:`srun_torchrun`.

    Returns:
        The script text (starts with ``#!/bin/bash``, ends with a newline).

    Raises:
        ValueError: naming the field, for any value outside the ranges above.
    """
    if not isinstance(job_name, str) or not _JOB_NAME.fullmatch(job_name):
        raise ValueError(f"job_name={job_name!r}: letters, digits, '_', '.', '-' only, 1 to 64 characters")
    positive_int(nodes, "nodes", 1)
    positive_int(nproc_per_node, "nproc_per_node", 1)
    gpus = None if gpus_per_node is None else positive_int(gpus_per_node, "gpus_per_node", 0)
    cpus = nproc_per_node if cpus_per_task is None else positive_int(cpus_per_task, "cpus_per_task", 1)
    if not isinstance(time, str) or not _TIME.fullmatch(time):
        raise ValueError(f"time={time!r}: a SLURM time such as 30, 00:30:00 or 1-00:00:00")
    for name, value in (("partition", partition), ("account", account), ("log_dir", log_dir)):
        if value is not None and (not isinstance(value, str) or not value.strip() or any(c.isspace() for c in value)):
            raise ValueError(f"{name}={value!r}: a non-empty word without spaces")
    launch = srun_torchrun('"$SLURM_JOB_NUM_NODES"', nproc_per_node, script, script_args, rdzv=rdzv,
                           master_port=master_port, env=env, ntasks_per_node=ntasks_per_node, export=export,
                           rdzv_conf=rdzv_conf)
    log = shlex.quote(log_dir)
    out = "" if log_dir in (".", "./") else f"{log_dir}/"
    submit = "sbatch job.sbatch" if not out else f"mkdir -p {log} && sbatch job.sbatch"
    if gpus is None:
        gpu_line = [f"##SBATCH --gpus-per-node={nproc_per_node}   # EDIT: GPU clusters: remove one '#'"]
    else:
        gpu_line = [f"#SBATCH --gpus-per-node={gpus}"] if gpus else []
    head = [
        "#!/bin/bash",
        f"# Submit from the project directory (on a shared filesystem): {submit}",
        "# (sbatch opens --output before the script runs: a missing log folder fails the job with no output anywhere)",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --partition={partition}" if partition else "##SBATCH --partition=CHANGE_ME   # EDIT: your partition (remove one '#')",
        f"#SBATCH --account={account}" if account else "##SBATCH --account=CHANGE_ME     # EDIT: your account (remove one '#')",
        f"#SBATCH --nodes={nodes}",
        "#SBATCH --ntasks-per-node=1        # one torchrun per node; it spawns the node's ranks",
        f"#SBATCH --cpus-per-task={cpus}",
        *gpu_line,
        f"#SBATCH --time={time}",
        f"#SBATCH --output={out}%x_%j.out",
        f"#SBATCH --error={out}%x_%j.err",
        "set -euo pipefail",
        'cd "$SLURM_SUBMIT_DIR"   # shared filesystem: /tmp is node-local (Gilbreth 8.12)',
        'echo "job $SLURM_JOB_ID on $SLURM_JOB_NUM_NODES node(s): $SLURM_JOB_NODELIST"',
        *setup,
        "# NCCL toggles (uncomment what you need):",
        *(f"# export {var:34} # {why}" for var, why in NCCL_TOGGLES),
    ]
    return "\n".join(head) + "\n" + launch


# --- Submitting and watching jobs (chapter 08; any cluster, the SLURM lab included) -----------------

END_STATES = ("COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL",
              "DEADLINE")
"""Job states after which a job no longer runs (``scontrol show job``'s ``JobState``; squeue's CD, F, CA, TO...)."""
NCCL_PROFILES = ("single_node", "multi_node")
"""The NCCL environment profiles of Gilbreth 8.4, as ``configs/nccl_<name>.env``."""


RUNNERS = ("srun", "lab", "local")
"""How the project reaches the nodes (``--runner``, ``PREFLIGHT_RUNNER``): ``srun`` (:class:`LocalSlurm`: this machine's
SLURM), ``lab`` (:class:`helpers.netlab.Lab`: the network / SLURM lab), ``local`` (:class:`ThisHost`: no SLURM, one node).
:func:`helpers.allocation.local.open_client` turns a name into the client."""
TAG = "runbook"
"""The prefix of the job/step name (``srun -J``) of everything the project starts through SLURM; :meth:`SlurmClient.cleanup`
cancels by the full tag (prefix + a token per run)."""
LAUNCH_ERRORS = re.compile(r"(Task launch for \S+ failed on node (\S+?):.*|"
                           r"Unable to create step for job.*|"
                           r"Required node not available.*|"
                           r"Nodes? (\S+) (?:are|is) (?:down|not responding).*|"
                           r"Job step creation temporarily disabled.*)")
"""SLURM's own launch errors (``srun``/``salloc`` stderr); see :func:`slurm_errors`."""


def new_tag(prefix: str = TAG) -> str:
    """A job/step name for one run: ``<prefix>-<6 hex digits>`` (what :meth:`SlurmClient.cleanup` looks for)."""
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def slurm_errors(text: str) -> list[dict[str, str]]:
    """SLURM's own launch errors in ``text``: ``[{"line", "node", "kind"}]``.

    ``kind`` is ``unreachable`` when SLURM names a node it could not launch on (``node`` set), else
    ``refused`` (SLURM refused the step itself: ``Unable to create step ...``; ``node`` empty).

    ``Task launch for StepId=12.0 failed on node node2: Connection timed out`` names ``node2``:
    slurmctld/srun could not reach that node's slurmd, i.e. a network (or daemon) fault on that node.
    Source: the messages of SLURM's ``src/srun/`` and ``src/api/step_launch.c`` (https://github.com/SchedMD/slurm).
    """
    found = []
    for m in LAUNCH_ERRORS.finditer(text or ""):
        node = (m.group(2) or m.group(3) or "").strip()
        found.append({"line": m.group(1).strip(), "node": node, "kind": "unreachable" if node else "refused"})
    return found


class SlurmClient:
    """The one way the project asks SLURM something or runs a command on a node (submitit's shape: one interface,
    a local and a cluster implementation; ``submitit/slurm/slurm.py`` beside ``submitit/local/local.py``).

    Implementations say only *where* a client command runs (:meth:`client_argv`) and how to reach one node
    (:meth:`on_node`); the rest is written once here:

    * :meth:`slurm`: a client command (``sbatch``, ``squeue``, ``scontrol``, ``scancel``, ``srun``...), bounded
      by :func:`helpers.procs.run_bounded` (SIGTERM, then SIGKILL of its session, returncode 124);
    * :meth:`popen`: the same, started in the background with its output in a file (a long ``srun``/``salloc``);
    * :meth:`step_argv` / :meth:`step`: one job step on some nodes (``-J tag``, ``--overlap`` inside an
      allocation, ``--export=ALL``, ``--kill-on-bad-exit=1``);
    * :meth:`cleanup`: ``scancel`` every job and step of a tag still known to SLURM.

    The implementations: :class:`LocalSlurm` (this machine's SLURM clients: a login node or a node of the
    allocation), :class:`ThisHost` (no SLURM: the one host is the one node) and
    :class:`helpers.netlab.Lab` (the SLURM lab: client commands on its head node, nodes reached directly).
    """

    def client_argv(self, argv: Sequence[str]) -> list[str]:
        """The command line that runs the client command ``argv`` (here: ``argv`` itself)."""
        return [str(a) for a in argv]

    def client_env(self, env: Mapping[str, str | None] | None = None) -> dict[str, str]:
        """The environment of a client command: this process's, this venv's ``bin`` first on ``PATH`` (``torchrun``
        and ``python`` on every node: the project folder is the shared filesystem), then ``env`` (``None`` unsets)."""
        here = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
        return envvars.apply(here, env)

    @property
    def in_allocation(self) -> bool:
        """True when client commands run inside a SLURM allocation (steps then need ``--overlap``)."""
        return bool(os.environ.get("SLURM_JOB_ID"))

    def slurm(self, argv: Sequence[str], timeout_s: float = 60.0, *, env: Mapping[str, str | None] | None = None,
              cwd: str | os.PathLike[str] | None = None) -> subprocess.CompletedProcess[str]:
        """Run the client command ``argv`` and wait at most ``timeout_s`` seconds (returncode 124 after that).

        A command that cannot start (``srun`` not installed) is returncode 127 with the reason on stderr.
        """
        try:
            return procs.run_bounded(self.client_argv(argv), timeout_s, env=self.client_env(env), cwd=cwd)
        except OSError as exc:
            return subprocess.CompletedProcess(list(argv), 127, "", f"{argv[0]}: {exc.strerror or exc}")

    def popen(self, argv: Sequence[str], log: str | os.PathLike[str],
              env: Mapping[str, str | None] | None = None) -> subprocess.Popen:
        """Start the client command ``argv`` in a session of its own, stdout+stderr to the file ``log``.

        Stop it with :func:`helpers.procs.stop_session` (``srun`` cancels its step on SIGTERM).
        """
        with open(log, "w") as fh:
            return subprocess.Popen(self.client_argv(argv), stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=self.client_env(env), start_new_session=True)

    def step_argv(self, nodes: Sequence[str], tag: str, *, ntasks_per_node: int = 1) -> list[str]:
        """``srun`` options for one step of ``ntasks_per_node`` tasks on each of ``nodes``, named ``tag``."""
        # -n explicit: inside sbatch, srun inherits SLURM_NTASKS of the whole job ("More processors requested than permitted")
        opts = ["srun", "-J", tag, "-w", ",".join(nodes), f"-N{len(nodes)}", f"-n{len(nodes) * ntasks_per_node}",
                f"--ntasks-per-node={ntasks_per_node}", "--export=ALL", "--kill-on-bad-exit=1"]
        return opts + (["--overlap"] if self.in_allocation else [])

    def step(self, nodes: Sequence[str], argv: Sequence[str], tag: str, timeout_s: float, *,
             env: Mapping[str, str | None] | None = None, ntasks_per_node: int = 1) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` as one step on ``nodes`` (:meth:`step_argv`), bounded by ``timeout_s``."""
        return self.slurm([*self.step_argv(nodes, tag, ntasks_per_node=ntasks_per_node), *argv], timeout_s, env=env)

    def on_node(self, node: str, argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on ``node`` (here: a one-task step, ``srun -w NODE -N1 -n1``), bounded by ``timeout_s``."""
        return self.step([node], argv, f"{TAG}-node", timeout_s)

    def cleanup(self, tag: str) -> list[str]:
        """``scancel`` every job and step named ``tag`` still known to SLURM; return their ids."""
        ids: list[str] = []
        for extra in ([], ["-s"]):
            out = self.slurm(["squeue", "-h", *extra, "-o", "%i %j"], 20).stdout
            ids += [line.split()[0] for line in out.splitlines() if line.split()[1:] == [tag]]
        if ids:
            self.slurm(["scancel", *ids], 20)
        return ids


class LocalSlurm(SlurmClient):
    """The SLURM clients of this machine (a login node, or a node of the allocation): ``LocalSlurm().slurm(["squeue"])``."""


class ThisHost(SlurmClient):
    """No SLURM: this host is the only node (``runbook preflight --runner local``); :meth:`on_node` runs ``argv`` here."""

    def on_node(self, node: str, argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` on this machine (``node`` is only a label), bounded by ``timeout_s``."""
        try:
            return procs.run_bounded(argv, timeout_s)
        except OSError as exc:
            return subprocess.CompletedProcess(list(argv), 127, "", f"{argv[0]}: {exc.strerror or exc}")


@dataclass(frozen=True)
class JobState:
    """What SLURM says about one job, and the files it wrote.

    Attributes:
        job_id: the job id (text).
        state: ``JobState`` (``PENDING``, ``RUNNING``, ``COMPLETED``, ``FAILED``, ``TIMEOUT``, ``CANCELLED``...),
            or ``UNKNOWN`` when ``scontrol`` no longer knows the job.
        exit_code: ``ExitCode`` as ``"status:signal"`` (``"0:0"``, ``"1:0"``, ``"0:15"``).
        reason: ``Reason`` (``None``, ``Resources``, ``Dependency``, ``NonZeroExitCode``, ``TimeLimit``...).
        stdout, stderr: the ``StdOut``/``StdErr`` paths SLURM was told to write (may not exist).
        fields: every ``Key=Value`` of ``scontrol show job -o``.
        waited_s: seconds :func:`wait_job` waited (0 for :func:`job_state`).
    """

    job_id: str
    state: str
    exit_code: str = ""
    reason: str = ""
    stdout: Path | None = None
    stderr: Path | None = None
    fields: Mapping[str, str] = field(default_factory=dict)
    waited_s: float = 0.0

    @property
    def ended(self) -> bool:
        """True once the job is in one of :data:`END_STATES`."""
        return self.state in END_STATES

    @property
    def exit_status(self) -> int | None:
        """The batch script's exit status (the part before ``:`` of ``exit_code``), or None."""
        head = self.exit_code.split(":")[0]
        return int(head) if head.isdigit() else None

    def out(self) -> str:
        """The text of the job's stdout file ('' when SLURM wrote none)."""
        return _read(self.stdout)

    def err(self) -> str:
        """The text of the job's stderr file ('' when SLURM wrote none)."""
        return _read(self.stderr)

    def files(self) -> dict[str, bool]:
        """``{path: exists}`` for the job's stdout and stderr files."""
        return {str(p): p.exists() for p in (self.stdout, self.stderr) if p is not None}

    def summary(self) -> str:
        """``job 12 FAILED exit 1:0 (NonZeroExitCode) after 8.1 s``."""
        return f"job {self.job_id} {self.state} exit {self.exit_code or '?'} ({self.reason or '-'}) after {self.waited_s:.1f} s"


def _read(path: Path | None) -> str:
    try:
        return path.read_text(errors="replace") if path is not None else ""
    except OSError:
        return ""


def parse_scontrol(text: str) -> dict[str, str]:
    """``Key=Value`` pairs of one ``scontrol show ... -o`` line (values may hold spaces only in the last field, ``Command``...)."""
    fields: dict[str, str] = {}
    for m in re.finditer(r"(?:^|\s)([A-Za-z][A-Za-z0-9_:/]*)=(\S*)", text.strip()):
        fields.setdefault(m.group(1), m.group(2))
    return fields


def submit(client: SlurmClient, script_text: str, work: str | os.PathLike[str], *, name: str = "job",
           sbatch_args: Sequence[str] = (), env: Mapping[str, str | None] | None = None,
           cwd: str | os.PathLike[str] | None = None) -> str:
    """Write ``script_text`` to ``<work>/<name>.sbatch`` and ``sbatch --parsable`` it; return the job id.

    Args:
        client: what runs ``sbatch`` (a SLURM lab, or :class:`LocalSlurm`).
        script_text: the batch script.
        work: a folder on the shared filesystem (created if missing).
        name: the script's file name stem (letters, digits, ``_.-``).
        sbatch_args: extra ``sbatch`` options before the script (``--dependency=afterany:12``...).
        env: added to the submitting environment (``None`` removes a variable); ``sbatch`` passes it on.
        cwd: where ``sbatch`` runs (``$SLURM_SUBMIT_DIR``); default ``work``.

    Returns:
        The job id (text).

    Raises:
        ValueError: a bad ``name``.
        RuntimeError: ``sbatch`` refused the job (its stderr in the message).
    """
    if not isinstance(name, str) or not _JOB_NAME.fullmatch(name):
        raise ValueError(f"name={name!r}: letters, digits, '_', '.', '-' only, 1 to 64 characters")
    folder = Path(work)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}.sbatch"
    path.write_text(script_text)
    r = client.slurm(["sbatch", "--parsable", *sbatch_args, str(path)], env=env, cwd=cwd or folder)
    if r.returncode != 0 or not r.stdout.strip():
        raise RuntimeError(f"sbatch {path} refused (exit {r.returncode}): {r.stderr.strip()}")
    return r.stdout.strip().split(";")[0]


def job_state(client: SlurmClient, job_id: str) -> JobState:
    """The job's state now, from ``scontrol show job -o`` (``UNKNOWN`` once the controller forgot it)."""
    r = client.slurm(["scontrol", "show", "job", "-o", str(job_id)], timeout_s=20)
    f = parse_scontrol(r.stdout) if r.returncode == 0 else {}
    return JobState(str(job_id), f.get("JobState", "UNKNOWN"), f.get("ExitCode", ""), f.get("Reason", ""),
                    Path(f["StdOut"]) if f.get("StdOut") else None, Path(f["StdErr"]) if f.get("StdErr") else None, f)


def wait_job(client: SlurmClient, job_id: str, timeout_s: float = 120.0, poll_s: float = 0.3) -> JobState:
    """Poll :func:`job_state` until the job ends (``sbatch --wait`` sleeps 2, 8, then 32 s between
    polls: ``_job_wait`` in Slurm's src/sbatch/sbatch.c, x4 each time up to 32 s or MinJobAge/2).

    Args:
        client, job_id: as :func:`job_state`.
        timeout_s: how long to wait (> 0); a job still running then is cancelled with ``scancel``
            and waited for a few more seconds.
        poll_s: seconds between polls (> 0).

    Returns:
        The last :class:`JobState` (``waited_s`` set).

    Raises:
        ValueError: ``timeout_s`` or ``poll_s`` not > 0.
    """
    return wait_jobs(client, [job_id], timeout_s, poll_s)[str(job_id)]


def wait_jobs(client: SlurmClient, job_ids: Sequence[str], timeout_s: float = 120.0,
              poll_s: float = 0.3) -> dict[str, JobState]:
    """:func:`wait_job` for several jobs at once (they run side by side): ``{job_id: JobState}``."""
    positive_float(timeout_s, "timeout_s")
    positive_float(poll_s, "poll_s")
    t0 = time.monotonic()
    states: dict[str, JobState] = {}
    pending = [str(j) for j in job_ids]
    cancelled = False
    while pending:
        for j in list(pending):
            s = job_state(client, j)
            if s.ended or s.state == "UNKNOWN":
                states[j] = dataclasses.replace(s, waited_s=time.monotonic() - t0)
                pending.remove(j)
        if pending and time.monotonic() - t0 > timeout_s:
            if cancelled:  # scancel'ed and still not ended after 10 s: report what it is
                states.update({j: dataclasses.replace(job_state(client, j), waited_s=time.monotonic() - t0) for j in pending})
                break
            client.slurm(["scancel", *pending], timeout_s=20)
            cancelled, timeout_s = True, timeout_s + 10
        if pending:
            time.sleep(poll_s)
    return {str(j): states[str(j)] for j in job_ids}


def wait_output(client: SlurmClient, job_id: str, pattern: str, timeout_s: float = 120.0, poll_s: float = 0.5) -> JobState:
    """Poll until the job's stdout or stderr matches regex ``pattern``, or the job ends, or ``timeout_s`` passes.

    For a job that does not end by itself (one rank failed, the other node's task still waits): its
    state *at the moment the error appeared* (``RUNNING``) is the evidence.  Nothing is cancelled here.

    Returns:
        The :class:`JobState` at that moment (``waited_s`` set).

    Raises:
        ValueError: ``timeout_s`` or ``poll_s`` not > 0, or a bad regex.
    """
    positive_float(timeout_s, "timeout_s")
    positive_float(poll_s, "poll_s")
    try:
        rx = re.compile(pattern)
    except re.error as exc:
        raise ValueError(f"pattern={pattern!r}: not a regular expression ({exc})") from None
    t0 = time.monotonic()
    while True:
        s = job_state(client, job_id)
        if s.ended or s.state == "UNKNOWN" or rx.search(s.out()) or rx.search(s.err()) or time.monotonic() - t0 > timeout_s:
            return dataclasses.replace(s, waited_s=time.monotonic() - t0)
        time.sleep(poll_s)


def wait_stalled(client: SlurmClient, job_id: str, stall_s: float, heartbeat: str = r"step \d+",
                 timeout_s: float = 120.0, poll_s: float = 0.2) -> tuple[JobState, float]:
    """Poll until the job's stdout shows ``heartbeat`` and then stays unchanged for ``stall_s``: the job hangs.

    The stall window is the one :func:`helpers.jobs.run_job` uses on one node (no new output for
    ``stall_s`` seconds after the first heartbeat), here read from the ``--output`` file SLURM writes on the
    shared filesystem, so it works from the login node for a job on any nodes.

    Args:
        client: the SLURM lab or :class:`LocalSlurm`.
        job_id: the job to watch.
        stall_s: seconds without new output that count as a stall (> 0).
        heartbeat: regex that must have appeared first (the job got past start-up).
        timeout_s, poll_s: give up after ``timeout_s`` seconds; poll every ``poll_s`` seconds (> 0).

    Returns:
        ``(state, last_output)``: the :class:`JobState` when the window closed (``RUNNING`` for a hang;
        ``waited_s`` set) and the epoch time (s) of the job's last output.

    Raises:
        ValueError: a non-positive duration or a bad regex.
        TimeoutError: the job ended, or did not stall within ``timeout_s`` (its state and output tail in the message).
    """
    for value, name in ((stall_s, "stall_s"), (timeout_s, "timeout_s"), (poll_s, "poll_s")):
        positive_float(value, name)
    try:
        rx = re.compile(heartbeat)
    except re.error as exc:
        raise ValueError(f"heartbeat={heartbeat!r}: not a regular expression ({exc})") from None
    t0 = time.monotonic()
    state = job_state(client, job_id)
    while time.monotonic() - t0 < timeout_s:
        out = state.stdout
        if out is not None and out.exists() and rx.search(state.out()):
            last = out.stat().st_mtime
            if time.time() - last >= stall_s:
                state = job_state(client, job_id)
                if not state.ended:
                    return dataclasses.replace(state, waited_s=time.monotonic() - t0), last
        if state.ended:
            break
        time.sleep(poll_s)
        state = job_state(client, job_id)
    raise TimeoutError(f"job {job_id}: no stall of {stall_s} s within {timeout_s} s ({state.summary()}); "
                       f"last output: {state.out()[-500:]!r}")


def queue(client: SlurmClient, fmt: str = "%i %t %M %r") -> list[list[str]]:
    """``squeue -h -o FMT`` rows split on spaces (Gilbreth 3.4: job id, state code, time used, reason)."""
    r = client.slurm(["squeue", "-h", "-o", fmt], timeout_s=20)
    return [line.split() for line in r.stdout.splitlines() if line.strip()]


def nccl_profile_path(name: str) -> Path:
    """``configs/nccl_<name>.env`` for ``name`` in :data:`NCCL_PROFILES` (Gilbreth 8.4).

    Raises:
        ValueError: ``name`` not one of :data:`NCCL_PROFILES`.
    """
    one_of(name, "profile", NCCL_PROFILES)
    return Path(__file__).resolve().parent.parent / "configs" / f"nccl_{name}.env"


def nccl_profile(name: str) -> dict[str, str | None]:
    """The variables the profile sets (``None``: ``unset``), commented toggles left out; for ``env=`` of the builders.

    Raises:
        ValueError: ``name`` not one of :data:`NCCL_PROFILES`, or a malformed line in the file.
    """
    text = nccl_profile_path(name).read_text()
    return envvars.parse_lines("\n".join(re.sub(r"\s+#.*$", "", line) for line in text.splitlines()))
