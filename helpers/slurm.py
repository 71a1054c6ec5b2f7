"""SLURM launch forms: ``srun`` + ``torchrun`` (one agent per node) and a whole ``sbatch`` script.

Multi-node jobs on a SLURM cluster start one ``torchrun`` agent per node with ``srun
--ntasks-per-node=1``; each agent spawns that node's ranks (gilbreth-hpc-guide §4.3, §8.2, §8.13).
The forms here carry the guide's fixes for its multi-node failure modes (§8.12):

* ``MASTER_ADDR`` / ``MASTER_PORT`` are *exported* before ``srun`` (a plain assignment does not
  reach the tasks; platform-facts.md: ``The hostname of the rendezvous endpoint ':29500' must be
  ...``), ``--export=ALL`` passes them on (Failure Mode 4);
* the node rank comes from ``$SLURM_NODEID`` (static form) or the rendezvous (c10d form, run id
  ``$SLURM_JOB_ID``);
* the NCCL/gloo variables are re-exported inside the ``bash -c`` of each task (Failure Mode 4);
  a value of ``None`` becomes ``unset`` (``unset NCCL_SOCKET_IFNAME``, Failure Mode 2).

Nothing here runs anything: the functions return text, validated (bad input raises ``ValueError``
naming the field).  ``tests/test_slurm.py`` runs the rendered script for real with stand-in
``srun``/``scontrol`` commands that start one local ``torchrun`` per "node".
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence

from helpers.envvars import shell_lines
from helpers.launchers import DEFAULT_MASTER_PORT, torchrun_flags
from helpers.validate import positive_int, tcp_port

RDZV_FORMS = ("static", "c10d")
"""The forms of :data:`helpers.launchers.RDZV_FORMS` that span nodes (``standalone`` is one node only)."""
_JOB_NAME = re.compile(r"[A-Za-z0-9_.-]{1,64}")
_TIME = re.compile(r"(\d+-)?\d{1,2}(:\d{2}){0,2}|\d+")  # SLURM --time: MM, MM:SS, HH:MM:SS, D-HH[:MM[:SS]]
# Commented toggles for the sbatch template (STYLE.md: NCCL variables as commented toggles with a purpose).
NCCL_TOGGLES = (
    ("NCCL_DEBUG=INFO", "log transports and interfaces: the evidence for MN1/MN2 hangs (runbook nccl-log)"),
    ("NCCL_DEBUG_SUBSYS=INIT,NET", "narrow NCCL_DEBUG to init and networking"),
    ("NCCL_SOCKET_IFNAME=^docker0,lo", "only if auto-detection picks a bridge; never one node's exact name (§8.12)"),
    ("NCCL_IB_DISABLE=1", "TCP-only clusters: stop probing for InfiniBand (MN2)"),
    ("TORCH_NCCL_ASYNC_ERROR_HANDLING=1", "a timed-out collective tears the job down (MN3)"),
)


def srun_torchrun(nnodes: int | str, nproc_per_node: int, script: str, script_args: Sequence[object] = (), *,
                  rdzv: str = "static", master_port: int = DEFAULT_MASTER_PORT,
                  env: Mapping[str, str | None] | None = None, srun_args: Sequence[str] = ()) -> str:
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
        srun_args: extra ``srun`` options (``--gpus-per-node=8``...).

    Returns:
        Shell text (several lines, ending with a newline).

    Raises:
        ValueError: naming the field: ``nnodes``/``nproc_per_node`` < 1, ``rdzv`` not one of
            :data:`RDZV_FORMS`, ``master_port`` outside 1..65535, an empty ``script``, an invalid
            variable name in ``env``.
    """
    if isinstance(nnodes, str):
        if not nnodes.strip():
            raise ValueError("nnodes: an integer >= 1 or a shell expression such as $SLURM_JOB_NUM_NODES")
    else:
        positive_int(nnodes, "nnodes", 1)
    positive_int(nproc_per_node, "nproc_per_node", 1)
    if rdzv not in RDZV_FORMS:
        raise ValueError(f"rdzv={rdzv!r}: accepted values are {', '.join(RDZV_FORMS)}")
    tcp_port(master_port, "master_port")
    if not isinstance(script, str) or not script.strip():
        raise ValueError(f"script={script!r}: the training script's path is required")
    task_env = shell_lines(env or {})
    # Shell text, double-quoted so that each task expands it: $SLURM_NODEID differs per node.
    if rdzv == "static":
        flags = torchrun_flags("static", nnodes=nnodes, nproc_per_node=nproc_per_node, node_rank='"$SLURM_NODEID"',
                               master_addr='"$MASTER_ADDR"', master_port='"$MASTER_PORT"')
    else:
        flags = torchrun_flags("c10d", nnodes=nnodes, nproc_per_node=nproc_per_node, rdzv_id='"$SLURM_JOB_ID"',
                               rdzv_endpoint='"$MASTER_ADDR:$MASTER_PORT"')
    torchrun = ["torchrun", *flags, shlex.quote(script), *(shlex.quote(str(a)) for a in script_args)]
    body = [*task_env, " \\\n      ".join([" ".join(torchrun[:3]), *torchrun[3:]])]
    # The task body is single-quoted, so $SLURM_NODEID expands in each task, not in the batch shell.
    inner = "\n    ".join(body).replace("'", "'\\''")
    srun = ["srun", f"--nodes={nnodes}", "--ntasks-per-node=1", "--export=ALL", *map(shlex.quote, srun_args)]
    return ("export MASTER_ADDR=\"$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)\"\n"
            f"export MASTER_PORT={master_port}\n"
            f"{' '.join(srun)} bash -c '\n    {inner}\n'\n")


def sbatch_script(job_name: str, nodes: int, nproc_per_node: int, script: str, script_args: Sequence[object] = (), *,
                  gpus_per_node: int | None = None, cpus_per_task: int | None = None, time: str = "00:30:00",
                  partition: str | None = None, account: str | None = None, rdzv: str = "static",
                  master_port: int = DEFAULT_MASTER_PORT, env: Mapping[str, str | None] | None = None,
                  log_dir: str = ".", setup: Sequence[str] = ()) -> str:
    """A complete ``sbatch`` job script for ``script`` on ``nodes`` nodes (gilbreth-hpc-guide §8.13, fixed).

    Header: ``#SBATCH`` lines (``--ntasks-per-node=1``: one torchrun per node, §8.2); partition,
    account and (when not given) the GPU request are written as *disabled* ``##SBATCH ... # EDIT``
    lines, so the script runs as it is on a small CPU cluster and a GPU user enables one line;
    ``set -euo pipefail``; the NCCL toggles of :data:`NCCL_TOGGLES` commented out with their purpose;
    then :func:`srun_torchrun`.  The header comment carries the command that submits it (STYLE.md).

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
                           master_port=master_port, env=env)
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
        'cd "$SLURM_SUBMIT_DIR"   # shared filesystem: /tmp is node-local (gilbreth-hpc-guide 8.12)',
        'echo "job $SLURM_JOB_ID on $SLURM_JOB_NUM_NODES node(s): $SLURM_JOB_NODELIST"',
        *setup,
        "# NCCL toggles (uncomment what you need):",
        *(f"# export {var:34} # {why}" for var, why in NCCL_TOGGLES),
    ]
    return "\n".join(head) + "\n" + launch
