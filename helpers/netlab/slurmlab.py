"""A real SLURM cluster on a lab: ``slurmctld`` on a head node, one ``slurmd`` per lab node, munge for auth.

``Lab(..., slurm=True)`` (see :class:`helpers.netlab.Lab`) adds a head (login) node ``head`` on
the lab network and calls :func:`start` once the network is built; :meth:`Lab.down` kills every
daemon (they all live in lab namespaces) and removes this lab's SLURM folder
(``build/slurm-lab/<name>/``: ``slurm.conf``, munge key and socket, state, spool and logs).

Layout (``name="rb"``, 2 nodes)::

    head  (10.77.0.9):  munged (socket in the SLURM folder, shared by every node), slurmctld
    node0 (10.77.0.10): slurmd -> NodeName=node0        node1 (10.77.0.11): slurmd -> NodeName=node1
    partition "lab" (default): node[0-1], CPUs = this machine's

Each daemon runs in its node's network + UTS + mount namespaces (:meth:`Lab.node_argv`, not
``ip netns exec``, which remounts /sys and loses /sys/fs/cgroup), with the node's own hostname,
``/etc/hosts`` and private ``/tmp``; the project folder is the shared filesystem.  Clients
(``sbatch``, ``srun``, ``squeue``, ``sinfo``, ``scancel``, ``scontrol``) need ``SLURM_CONF``:
:meth:`Lab.node_argv` sets it inside every node of a SLURM lab; run them from the head node with
:meth:`Lab.slurm`.  Source: PF-slurm-namespaces; Debian's ``slurm-wlm``
22.05 and ``munge`` 0.5.15.  Nothing runs at import.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from helpers import jobs

if TYPE_CHECKING:
    from helpers.netlab.lab import Lab

HEAD = "head"
PARTITION = "lab"
TOOLS = ("slurmctld", "slurmd", "munged", "mungekey", "sbatch", "srun", "sinfo", "scontrol")
_READY_S = 10.0


def slurm_available() -> tuple[bool, str]:
    """Whether the SLURM and munge programs are installed, and what to do if not.

    Returns:
        ``(True, "slurm-wlm ...")`` or ``(False, reason)`` (printable as a skip message).
    """
    missing = [t for t in TOOLS if shutil.which(t) is None]
    if missing:
        return False, f"missing {', '.join(missing)}: apt-get install -y slurm-wlm munge (as root), or make setup"
    out = subprocess.run(["slurmd", "-V"], capture_output=True, text=True, timeout=10, check=False)
    return True, (out.stdout.strip() or "slurm-wlm") + ", munge"


def slurm_dir(name: str) -> Path:
    """The SLURM folder of lab ``name``: ``<build>/slurm-lab/<name>`` (config, key, socket, state, spool, logs)."""
    return jobs.build_dir() / "slurm-lab" / name


def conf_path(name: str) -> Path:
    """``slurm.conf`` of lab ``name`` (what ``SLURM_CONF`` points at)."""
    return slurm_dir(name) / "slurm.conf"


def slurm_conf(lab: "Lab") -> str:
    """The ``slurm.conf`` text for ``lab``: no accounting, no cgroups, every path inside :func:`slurm_dir`."""
    d = slurm_dir(lab.name)
    cpus = os.cpu_count() or 1
    nodes = [f"NodeName={lab.hostname(i)} NodeAddr={lab.address(i)} CPUs={cpus} State=UNKNOWN" for i in range(lab.nodes)]
    return "\n".join([
        f"# runbook network lab {lab.name!r}: written by helpers.netlab.slurmlab; removed by `runbook lab down`",
        f"ClusterName={lab.name}lab",
        f"SlurmctldHost={HEAD}({lab.address(HEAD)})",
        "SlurmUser=root", "SlurmdUser=root",
        "AuthType=auth/munge", f"AuthInfo=socket={d / 'munge.socket'}",
        "CredType=cred/munge",
        f"StateSaveLocation={d / 'state'}",
        f"SlurmdSpoolDir={d / 'spool'}/%n",
        f"SlurmctldPidFile={d / 'slurmctld.pid'}", f"SlurmdPidFile={d / 'slurmd-%n.pid'}",
        f"SlurmctldLogFile={d / 'log' / 'slurmctld.log'}", f"SlurmdLogFile={d / 'log' / 'slurmd-%n.log'}",
        "ProctrackType=proctrack/linuxproc", "TaskPlugin=task/none", "JobAcctGatherType=jobacct_gather/none",
        "SwitchType=switch/none", "MpiDefault=none", "ReturnToService=2",
        "SchedulerType=sched/builtin", "SelectType=select/cons_tres", "SelectTypeParameters=CR_Core",
        "SlurmctldTimeout=30", "SlurmdTimeout=30", "MessageTimeout=10", "KillWait=2", "InactiveLimit=0",
        *nodes,
        f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP",
    ]) + "\n"


def _daemon(lab: "Lab", node: int | str, argv: list[str], log: Path) -> None:
    """Start a daemon that forks into the background inside ``node``; wait for the foreground part.

    Raises:
        RuntimeError: it exited non-zero (its output is in the message).
    """
    with open(log, "ab") as out:
        proc = subprocess.run(lab.node_argv(node, argv, cwd=jobs.project_root()), stdin=subprocess.DEVNULL, stdout=out,
                              stderr=subprocess.STDOUT, timeout=_READY_S, check=False, start_new_session=True)
    if proc.returncode != 0:
        raise RuntimeError(f"{lab.hostname(node)}: `{' '.join(argv)}` failed (exit {proc.returncode}): "
                           f"{log.read_text(errors='replace')[-800:]}")


def start(lab: "Lab") -> float:
    """Write the config and munge key, start munged + slurmctld on the head and slurmd on every node.

    Waits until ``sinfo`` reports every node ``idle`` (at most 10 s).  Measured here: ~0.5-1 s.

    Returns:
        Seconds it took.

    Raises:
        RuntimeError: SLURM is not installed, a daemon did not start, or the nodes did not become
            idle in time (``sinfo``'s last answer and the log folder are in the message).
    """
    t0 = time.monotonic()
    ok, why = slurm_available()
    if not ok:
        raise RuntimeError(f"cannot start SLURM on the lab: {why}")
    d = slurm_dir(lab.name)
    shutil.rmtree(d, ignore_errors=True)
    for sub in ("state", "spool", "log"):
        (d / sub).mkdir(parents=True)
    d.chmod(0o700)
    conf_path(lab.name).write_text(slurm_conf(lab))
    subprocess.run(["mungekey", "-c", "-k", str(d / "munge.key")], check=True, capture_output=True, timeout=10)
    log = d / "log" / "daemons.out"
    _daemon(lab, HEAD, ["munged", f"--socket={d / 'munge.socket'}", f"--key-file={d / 'munge.key'}",
                        f"--pid-file={d / 'munged.pid'}", f"--log-file={d / 'log' / 'munged.log'}",
                        f"--seed-file={d / 'munge.seed'}", "--force"], log)
    _daemon(lab, HEAD, ["slurmctld", "-c", "-f", str(conf_path(lab.name))], log)
    for i in range(lab.nodes):
        _daemon(lab, i, ["slurmd", "-f", str(conf_path(lab.name))], log)
    deadline = time.monotonic() + _READY_S
    states: dict[str, str] = {}
    while time.monotonic() < deadline:
        states = node_states(lab)
        if len(states) == lab.nodes and all(s == "idle" for s in states.values()):
            return round(time.monotonic() - t0, 3)
        time.sleep(0.1)
    raise RuntimeError(f"SLURM on lab {lab.name!r}: nodes not idle after {_READY_S:g} s: {states or 'no answer'} "
                       f"(logs in {d / 'log'})")


def node_states(lab: "Lab") -> dict[str, str]:
    """SLURM's state of each node (``{"node0": "idle", ...}``; ``{}`` when slurmctld does not answer)."""
    if not conf_path(lab.name).exists() or not lab.node_pids(HEAD):
        return {}
    proc = lab.run(HEAD, ["sinfo", "-h", "-N", "-o", "%N %T"], timeout_s=10, cwd=jobs.project_root())
    if proc.returncode != 0:
        return {}
    return dict(line.split(None, 1) for line in proc.stdout.splitlines() if len(line.split()) == 2)


def status(lab: "Lab") -> dict[str, Any]:
    """``{"conf": path or None, "nodes": {name: state}, "queue": [squeue lines]}`` for :meth:`Lab.status`."""
    if not conf_path(lab.name).exists():
        return {"conf": None, "nodes": {}, "queue": []}
    nodes = node_states(lab)
    queue: list[str] = []
    if nodes:
        proc = lab.run(HEAD, ["squeue", "-h", "-o", "%i %j %T %N"], timeout_s=10, cwd=jobs.project_root())
        queue = proc.stdout.splitlines() if proc.returncode == 0 else []
    return {"conf": str(conf_path(lab.name)), "nodes": nodes, "queue": queue}


def remove(name: str) -> list[str]:
    """Remove lab ``name``'s SLURM folder (its daemons must already be dead); return what was removed."""
    d = slurm_dir(name)
    if not d.exists():
        return []
    shutil.rmtree(d, ignore_errors=True)
    return [str(d)]
