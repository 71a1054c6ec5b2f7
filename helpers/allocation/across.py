"""The allocation check across nodes: per-node steps, one job over every node, the node-pair matrix, the drain list.

``runbook diagnose`` inside a multi-node allocation (or with ``--nodes a,b --runner srun|lab``) runs,
through real SLURM (issue 11, sections 2-3):

* :func:`run_node_steps`: one ``srun -w NODE -N1 -n1 --overlap`` step per node, in parallel, running
  :func:`node_report` there (versions, GPU count, host checks, interfaces, NIC line rate,
  host memory-copy bandwidth); :func:`helpers.allocation.grades.grade_nodes` turns them into checks naming the node.
* :func:`run_job_across`: ONE job over every node, the Gilbreth 4.3 way (``srun`` one task per node
  + ``torchrun``, ``--export=ALL``, ``MASTER_ADDR`` from ``scontrol show hostnames``: the text of
  :func:`helpers.slurm.srun_torchrun`), with a join deadline: a node whose ranks never wrote their
  ``joined-*`` marker is a FAIL naming it.  The job (``helpers/scenarios/allocation_job.py``)
  measures the env contract, collectives, intra/inter-node busbw and the node pairs;
  :mod:`helpers.allocation.grades` grades them (``grade_job``, ``grade_pairs``, ``grade_envelope``).
* :func:`run_smoke_across`: the multi-node DeepSpeed ZeRO-1 smoke test (Gilbreth 8.9: the verified multi-node DeepSpeed run).
* :func:`drain_list`: the nodes to leave out, as ``--exclude=`` for the next ``sbatch``.

Every SLURM command is tagged with a job/step name (:data:`TAG` + a token) and :func:`cleanup`
cancels whatever of it is left.  A SLURM launch error is reported in SLURM's own words
(:func:`slurm_errors`).
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from helpers import jobs, sources
from helpers.allocation import grouptest, local, straggler
from helpers.allocation.grades import grade_envelope, grade_job, grade_nodes, grade_pairs, grade_smoke, inter_envelope, pair_matrix
from helpers.checks import Check, faulty_nodes, render
from helpers.jobdir import JobDir
from helpers.launchers import DEFAULT_MASTER_PORT
from helpers.procs import stop_session
from helpers.slurm import TAG as SLURM_TAG
from helpers.slurm import SlurmClient, new_tag, slurm_errors, srun_torchrun

TAG = f"{SLURM_TAG}-check"
MAX_ALL_PAIRS = 16  # every node pair up to 16 nodes (15 rounds); beyond, the first SAMPLED_ROUNDS round-robin rounds
SAMPLED_ROUNDS = 8


# --------------------------------------------------------------------------- per node


def node_report(master_port: int = DEFAULT_MASTER_PORT, dcgm_level: int = 0) -> dict[str, Any]:
    """What :func:`run_node_steps` measures on one node (run there): versions, GPUs, host checks, NIC, memcpy.

    ``dcgm_level`` (0, 1, 2): also run ``dcgmi diag -r`` where DCGM is installed (``gpu_health``).

    Returns:
        ``{"hostname", "versions": {torch, cuda, nccl, driver, deepspeed}, "gpus", "nvswitch",
        "fabric_manager", "host_checks": [Check dicts], "iface", "nic_mbps", "nic_source", "memcpy_GBps",
        "socket_ifname": {VAR: value}, "slurm_gpus", "gpu_health": gpu_health.node_health()}``.
    """
    import importlib.metadata

    import torch

    from helpers import hostinfo
    from helpers.allocation import gpu_health

    def version(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nccl = ".".join(map(str, torch.cuda.nccl.version())) if gpus else None
    driver = fabric = None
    nvswitch = False
    if gpus:  # GPU path: written and gated (never run on the CPU lab)
        smi = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, check=False)
        driver = smi.stdout.split("\n")[0].strip() or None
        nvswitch = Path("/dev/nvidia-nvswitchctl").exists()
        if nvswitch:  # MN1: NVSwitch nodes need nvidia-fabricmanager running
            fabric = subprocess.run(["systemctl", "is-active", "nvidia-fabricmanager"], capture_output=True,
                                    text=True, check=False).stdout.strip()
    ifaces = hostinfo.interfaces()
    data = [i for i in ifaces if i["up"] and not i["loopback"] and i["ipv4"]]
    iface = data[0]["name"] if data else ""
    speed, source = hostinfo.nic_speed_mbps(iface) if iface else (None, "no data interface")
    checks = local.host_checks(master_port=master_port)
    return {"hostname": socket.gethostname(), "versions": {"torch": torch.__version__, "cuda": torch.version.cuda,
                                                           "nccl": nccl, "driver": driver, "deepspeed": version("deepspeed")},
            "gpus": gpus, "nvswitch": nvswitch, "fabric_manager": fabric,
            "host_checks": [c.to_dict() for c in checks], "iface": iface, "nic_mbps": speed, "nic_source": source,
            "memcpy_GBps": round(hostinfo.memcpy_gbps(), 2), "rdma_ports": hostinfo.infiniband_ports(),
            "socket_ifname": {k: os.environ.get(k) for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")},
            "slurm_gpus": os.environ.get("SLURM_GPUS_ON_NODE") or os.environ.get("SLURM_GPUS_PER_NODE"),
            "gpu_health": gpu_health.node_health(dcgm_level=dcgm_level)}


def run_node_steps(client: SlurmClient, tag: str, nodes: Sequence[str], out_dir: Path, *, timeout_s: float = 45.0,
                   env: Mapping[str, str] | None = None, dcgm_level: int = 0) -> tuple[dict[str, dict], list[Check]]:
    """One step per node named ``tag``, in parallel: :func:`node_report` there (``scenarios/node_report.py``).

    ``dcgm_level`` > 0 adds ``dcgmi diag -r dcgm_level`` on the nodes that have DCGM (and 300 s to ``timeout_s``).

    Returns:
        ``({node: report}, [a FAIL per node whose step failed, in SLURM's words])``.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    py = [sys.executable, str(jobs.scenario("node_report.py")), "--dcgm-level", str(dcgm_level)]
    timeout_s += 300.0 if dcgm_level else 0.0

    def one(node: str) -> tuple[str, subprocess.CompletedProcess[str]]:
        return node, client.step([node], py, tag, timeout_s, env=env)

    reports, failures = {}, []
    with ThreadPoolExecutor(max_workers=min(16, len(nodes))) as pool:
        for node, proc in pool.map(one, nodes):
            (out_dir / f"node-{node}.log").write_text(proc.stdout + "\n--- stderr\n" + proc.stderr)
            line = next((ln for ln in proc.stdout.splitlines() if ln.startswith("{")), "")
            if proc.returncode == 0 and line:
                reports[node] = json.loads(line)
            else:
                failures.append(step_failure(f"node.step.{node}", node, proc, timeout_s))
    return reports, failures


def gpu_node_checks(reports: Mapping[str, Mapping[str, Any]]) -> list[Check]:
    """The GPU health of every node (issue 22): ``node.gpu.*.<node>`` per node, then ``node.gpu_versions``.

    Each node's ``gpu_health`` (:func:`helpers.allocation.gpu_health.node_health`, read there) is graded by
    :func:`helpers.allocation.gpu_grades.grade_gpu_health`; a node without GPU gives one INFO record.
    """
    from helpers.allocation import gpu_grades

    checks: list[Check] = []
    healths = {n: r["gpu_health"] for n, r in reports.items() if r.get("gpu_health")}
    for node, health in healths.items():
        for c in gpu_grades.grade_gpu_health(health, node=node):
            c.id = f"node.{c.id}.{node}"
            checks.append(c)
    if healths:
        checks.append(gpu_grades.grade_gpu_versions(healths))
    return checks


def step_failure(cid: str, node: str, proc: subprocess.CompletedProcess[str], timeout_s: float) -> Check:
    """A FAIL for a SLURM step that did not run on ``node``, with SLURM's own message and what it implies."""
    text = (proc.stderr or "") + (proc.stdout or "")
    errs = slurm_errors(text)
    named = [e["node"] for e in errs if e["node"]] or [node]
    if errs and all(e["kind"] == "refused" for e in errs):
        title = f"{node}: SLURM refused the step: {errs[0]['line']}"
        fix = ("not a node fault: the step asks for more than the allocation grants (check --ntasks/--cpus-per-task "
               "of the job, and that steps may share it: srun --overlap); run runbook diagnose inside the allocation")
        refused = Check(cid, title, "FAIL", {"returncode": proc.returncode, "slurm_errors": errs}, fix,
                        "https://slurm.schedmd.com/srun.html", evidence=[e["line"] for e in errs], node=node)
        refused.faulty = []  # no node to drain: the request was wrong
        return refused
    if errs:
        title = f"{node}: SLURM could not run the step: {errs[0]['line']}"
        fix = (f"SLURM itself cannot reach {', '.join(named)} (its slurmd): a network or daemon fault on that node; "
               f"leave it out (--exclude={','.join(named)}) and report it to the admins (scontrol show node {named[0]})")
    elif proc.returncode == 124:
        title = f"{node}: the step did not finish within {timeout_s:g} s"
        tail = [ln for ln in text.splitlines() if ln.strip()][-3:]
        title += f" ({' | '.join(tail)})" if tail else ""
        fix = (f"{node} accepts no step (hung node, lost link or busy CPUs): check `scontrol show node {node}`, "
               f"`sinfo -R`; leave it out with --exclude={node}")
    else:
        tail = [ln for ln in text.splitlines() if ln.strip()][-2:]
        title = f"{node}: the step failed (exit {proc.returncode}): {' | '.join(tail)}"
        fix = f"read {node}'s step log; run the command by hand: srun -w {node} -N1 python helpers/scenarios/node_report.py"
    return Check(cid, title, "FAIL", {"returncode": proc.returncode, "slurm_errors": errs}, fix,
                 sources.cite("MN1", "MN3"), evidence=[e["line"] for e in errs], node=node, faulty=named)


# --------------------------------------------------------------------------- one job across every node

def _job_shell(client: SlurmClient, tag: str, nodes: Sequence[str], nproc: int, script: Path, args: Sequence[str],
               env: Mapping[str, str | None] | None, master_port: int, pre_launch: Sequence[str] = ()) -> list[str]:
    """The Gilbreth 4.3 launch (:func:`helpers.slurm.srun_torchrun`) as one command: inside the allocation, or in a
    ``salloc`` on ``nodes``.  ``MASTER_ADDR`` is the first of ``nodes`` (inside an allocation ``SLURM_JOB_NODELIST``
    is the whole allocation); ``pre_launch`` runs in each task before ``torchrun``."""
    text = srun_torchrun(len(nodes), nproc, str(script), list(args), master_port=master_port, env=env,
                         srun_args=["-J", tag, "-w", ",".join(nodes), f"--ntasks={len(nodes)}", "--kill-on-bad-exit=1",
                                    *(["--overlap"] if client.in_allocation else [])],
                         nodelist=nodes, pre_launch=pre_launch)
    if client.in_allocation:
        return ["bash", "-c", text]
    # One torchrun task per node needs a CPU per rank: the srun line asks for $SLURM_CPUS_PER_TASK (Slurm 22.05-23.02
    # do not pass the allocation's value to srun), so the allocation must grant it, or the step is refused.
    return ["salloc", "-J", tag, "-w", ",".join(nodes), f"-N{len(nodes)}", "--ntasks-per-node=1",
            f"--cpus-per-task={nproc}", "--immediate=30", "bash", "-c", text]


def culprits(nodes: Sequence[str], nproc: int, tasks: set[str], started: set[tuple[str, int]],
             joined: set[tuple[str, int]]) -> list[str]:
    """The nodes to blame when not every rank joined, first level that tells nodes apart:

    1. nodes whose SLURM task never started (``tasks``: the ``task-<node>`` markers each task writes
       before ``torchrun``; torchrun's own rendezvous holds every node's ranks until all agents are in,
       so on the healthy nodes no rank starts either);
    2. nodes with a rank that never started (``started-<node>-<local_rank>``);
    3. nodes with a rank that never joined the process group.

    Returns ``[]`` when no level tells the nodes apart.
    """
    levels = ([n for n in nodes if n not in tasks],
              [n for n in nodes if any((n, r) not in started for r in range(nproc))],
              [n for n in nodes if any((n, r) not in joined for r in range(nproc))])
    return next((missing for missing in levels if 0 < len(missing) < len(nodes)), [])


def run_job_across(client: SlurmClient, tag: str, nodes: Sequence[str], out_dir: Path, *, nproc: int = 1, backend: str = "gloo",
                   join_timeout_s: float = 60.0, timeout_s: float = 240.0, collective_timeout_s: float = 60.0,
                   script: str = "allocation_job.py", script_args: Sequence[str] = (),
                   env: Mapping[str, str | None] | None = None, master_port: int = DEFAULT_MASTER_PORT,
                   result: str = "allocation_job.json", markers: bool = True) -> dict[str, Any]:
    """Launch ``script`` on every node with ``nproc`` ranks each (job name ``tag``); wait for every node to join, then for the result.

    The markers each task and rank leave (task started, rank started, rank joined) are the job folder's
    (:class:`helpers.jobdir.JobDir`: ``ranks/task-<node>``, ``ranks/started-<node>-<local_rank>``, ``ranks/joined-...``).

    Returns:
        ``{"ok", "data" (rank 0's JSON or None), "missing" (nodes with a rank that never joined),
        "joined", "wall_s", "returncode", "log", "slurm_errors", "stopped" (why it was stopped, or "")}``.
    """
    out_dir = Path(out_dir).resolve()
    jd = JobDir(out_dir)
    jd.ranks_dir.mkdir(parents=True, exist_ok=True)
    log = out_dir / "launch.log"
    argv = [*([] if script_args else ["--out-dir", str(out_dir)]), "--backend", backend,
            "--timeout-s", str(collective_timeout_s), *script_args]
    if script == "allocation_job.py" and len(nodes) > MAX_ALL_PAIRS:  # sampled: each node meets SAMPLED_ROUNDS partners
        argv += ["--max-rounds", str(SAMPLED_ROUNDS)]
    # JIT-built ops (DeepSpeed's) in the project's build folder on the shared filesystem, built once for every node,
    # never in each user's ~/.cache (jobs.extensions_dir)
    env = {"TORCH_EXTENSIONS_DIR": str(jobs.extensions_dir()), **(env or {})}
    # Each task leaves a marker before torchrun, whose rendezvous holds every rank until all nodes are in:
    # the node without one is the node whose task never started.
    cmd = _job_shell(client, tag, nodes, nproc, jobs.scenario(script), argv, env, master_port,
                     pre_launch=[jd.task_marker_shell()])
    t0 = time.monotonic()
    proc = client.popen(cmd, log)
    expected = {(n, r) for n in nodes for r in range(nproc)}
    stopped = ""
    at_stop: tuple[set[str], set[tuple[str, int]], set[tuple[str, int]]] | None = None
    while proc.poll() is None:
        elapsed = time.monotonic() - t0
        if markers and elapsed > join_timeout_s and not expected <= jd.node_markers("joined"):
            stopped = f"not every node joined within {join_timeout_s:g} s"
        elif elapsed > timeout_s:
            stopped = f"no result within {timeout_s:g} s"
        if stopped:
            # the markers as they stood at the deadline: a task stuck before its marker (a node profile that blocks)
            # writes it while it is being killed, and must not look as if it had started
            at_stop = (jd.task_markers(), jd.node_markers("started"), jd.node_markers("joined"))
            stop_session(proc)
            break
        time.sleep(0.5)
    proc.wait()
    text = log.read_text(errors="replace") if log.exists() else ""
    data_path = out_dir / result
    data = json.loads(data_path.read_text()) if data_path.exists() else None
    tasks, started, joined = at_stop or (jd.task_markers(), jd.node_markers("started"), jd.node_markers("joined"))
    missing = culprits(nodes, nproc, tasks, started, joined) if markers and not expected <= joined else []
    return {"ok": proc.returncode == 0 and data is not None and not stopped, "data": data, "missing": missing,
            "joined": sorted(f"{n}/{r}" for n, r in joined), "started": sorted(f"{n}/{r}" for n, r in started), "wall_s": round(time.monotonic() - t0, 1),
            "returncode": proc.returncode, "log": str(log), "slurm_errors": slurm_errors(text), "stopped": stopped,
            "tail": [ln for ln in text.splitlines() if ln.strip()][-4:]}


def job_failure(cid: str, title: str, run: Mapping[str, Any], nodes: Sequence[str]) -> Check:
    """A FAIL for a job over the nodes that did not produce its result: the nodes that never joined, SLURM's words."""
    named = [e["node"] for e in run["slurm_errors"] if e["node"]]
    faulty = list(dict.fromkeys(named + run["missing"]))
    why = run["slurm_errors"][0]["line"] if run["slurm_errors"] else (run["stopped"] or f"exit {run['returncode']}")
    if run["missing"]:
        head = f"{', '.join(run['missing'])} never joined ({why})"
        fix = (f"the ranks of {', '.join(run['missing'])} never reached the rendezvous: the node is down, unreachable "
               f"or its task failed to start; leave it out: --exclude={','.join(faulty)}")
    else:
        head = f"the job did not complete ({why})"
        fix = f"read {run['log']} and the rank logs; " + ("; ".join(run["tail"]) or "no output")
    return Check(cid, f"{title}: {head}", "FAIL", {k: run[k] for k in ("missing", "joined", "started", "wall_s", "returncode",
                                                                        "stopped", "log", "slurm_errors", "tail")},
                 fix, sources.cite("MN1", "MN3", "Gilbreth 4.3"), evidence=run["tail"], faulty=faulty)


def run_smoke_across(client: SlurmClient, tag: str, nodes: Sequence[str], out_dir: Path, *, nproc: int, backend: str,
                     steps: int = 20, timeout_s: float = 300.0, join_timeout_s: float = 90.0) -> Check:
    """The multi-node smoke test (Gilbreth 8.9: the verified multi-node DeepSpeed run): DeepSpeed ZeRO-1 bf16, every rank saves and loads; one optimizer-state file per rank."""
    title = f"multi-node DeepSpeed ZeRO-1 bf16 on {len(nodes)} nodes x {nproc}"
    if (locked := local.stale_lock_failure("smoke.multinode", title)) is not None:
        return locked  # the ranks would wait on it until the timeout (the folder is on the shared filesystem)
    out_dir = Path(out_dir)
    ckpt = out_dir / "checkpoints"
    out = out_dir / "smoke.json"
    cfg = local.CONFIGS / ("ds_zero1_gpu.json" if backend == "nccl" else "ds_zero1_cpu.json")
    args = ["--steps", str(steps), "--ckpt-dir", str(ckpt), "--out", str(out), "--deepspeed-config", str(cfg)]
    run = run_job_across(client, tag, nodes, out_dir, nproc=nproc, backend=backend, join_timeout_s=join_timeout_s,
                         timeout_s=timeout_s, script="smoke_deepspeed.py", script_args=args, result="smoke.json",
                         markers=False)
    if not run["data"]:
        return job_failure("smoke.multinode", title, run, nodes)
    check = grade_smoke("smoke.multinode", title, run["data"], "Gilbreth 8.9")
    optim = [f for f in run["data"].get("checkpoint_files", []) if "optim_states" in f]
    want = len(nodes) * nproc
    check.values.update(optimizer_state_files=len(optim), ranks=want, wall_s=run["wall_s"])
    if len(optim) != want and check.status == "OK":
        check.status, check.title = "FAIL", f"{title}: {len(optim)} optimizer-state files for {want} ranks"
        check.remediation = "ZeRO-1 writes one optimizer shard per rank: every rank must call save_checkpoint"
    return check


def drain_list(checks: Sequence[Check]) -> dict[str, Any]:
    """The nodes to leave out (named by a FAIL, then by a WARN) and the ready ``--exclude=`` line."""
    fail = faulty_nodes(checks, "FAIL")
    warn = [n for n in faulty_nodes(checks, "WARN") if n not in fail]
    nodes = fail + warn
    return {"fail": fail, "warn": warn, "nodes": nodes,
            "exclude": f"--exclude={','.join(nodes)}" if nodes else ""}


def host_check(nodes: Sequence[str], host: str | None = None) -> Check:
    """WARN when this process runs on a host that is not one of the allocation's nodes (a login node)."""
    host = host or socket.gethostname()
    short = host.split(".")[0]
    if short in nodes or host in nodes:
        return Check("across.host", f"running on {host}, a node of the allocation", "OK", {"host": host, "nodes": list(nodes)})
    return Check("across.host", f"running on {host}, which is not a node of the allocation ({', '.join(nodes)}): "
                 "the single-node jobs are not run here, every check below ran on the nodes through srun", "WARN",
                 {"host": host, "nodes": list(nodes)},
                 "run `runbook diagnose` inside the allocation (sbatch configs/slurm/allocation_check.sbatch, or "
                 "salloc then srun -N1 runbook diagnose) so nothing is measured on the login node", sources.cite("Gilbreth 4.3"))


MULTI_STEPS = ("nodes", "job", "smoke", "preflight", "localise")


def render_markdown(ev: Mapping[str, Any], checks: Sequence[Check] = ()) -> str:
    """The report's multi-node sections: the drain list, the node x node matrix, then one section per node.

    Args:
        ev: the evidence of :func:`run_allocation` (``reports``, ``matrix``, ``drain``, ``node_checks``).
        checks: the records to list under each node (those with ``node`` set or naming it in ``faulty``);
            default ``ev["checks"]``.
    """
    checks = list(checks) or [Check.from_dict(c) for c in ev.get("checks", [])]
    drain = ev.get("drain") or {}
    lines = ["## Drain list", ""]
    lines += [f"Leave out: `{drain['exclude']}` (FAIL: {', '.join(drain['fail']) or 'none'}; "
              f"WARN: {', '.join(drain['warn']) or 'none'})" if drain.get("nodes") else "No node to leave out.", ""]
    matrix = ev.get("matrix") or {}
    if matrix:
        names = list(matrix)
        lines += ["## Node pairs: all_reduce busbw (GB/s), one rank per node", "",
                  "| | " + " | ".join(names) + " |", "|---" * (len(names) + 1) + "|"]
        lines += [f"| {a} | " + " | ".join(f"{matrix[a].get(b, float('nan')):.3f}" if b in matrix[a] else "—"
                                            for b in names) + " |" for a in names]
        lines.append("")
    for node, rep in (ev.get("reports") or {}).items():
        mine = [c for c in checks if c.node == node or node in c.faulty]
        v = rep["versions"]
        lines += [f"## Node {node}", "",
                  f"- versions: torch {v['torch']}, CUDA {v['cuda']}, NCCL {v['nccl']}, driver {v['driver']}, "
                  f"DeepSpeed {v['deepspeed']}",
                  f"- GPUs: {rep['gpus']}; NIC {rep['iface']} {rep['nic_mbps']} Mb/s ({rep['nic_source']}); "
                  f"memory copy {rep['memcpy_GBps']} GB/s", ""]
        lines += [render(mine, "markdown"), ""] if mine else []
    return "\n".join(lines)


def run_allocation(nodes: Sequence[str], out_dir: Path, *, runner: str = "srun", lab: str = "", nproc: int = 1,
                   backend: str = "gloo", steps: Sequence[str] = MULTI_STEPS, join_timeout_s: float = 60.0,
                   timeout_s: float = 240.0, gpus_per_node: int = 0, smoke_steps: int = 20,
                   log: Callable[[str], None] = print, dcgm_level: int = 0) -> tuple[list[Check], dict[str, Any]]:
    """Every multi-node check of ``steps`` (subset of :data:`MULTI_STEPS`) on ``nodes``; cleans up what it started.

    Returns:
        ``(checks, evidence)`` with evidence ``{"reports", "matrix", "job", "drain"}``.

    Raises:
        ValueError: fewer than 2 nodes, an unknown step or runner.
    """
    if len(nodes) < 2:
        raise ValueError(f"nodes={list(nodes)!r}: give 2 or more nodes")
    unknown = [s for s in steps if s not in MULTI_STEPS]
    if unknown:
        raise ValueError(f"steps={unknown!r}: accepted values are {', '.join(MULTI_STEPS)}")
    out_dir = Path(out_dir).resolve()  # the nodes write there: an absolute path on the shared filesystem
    checks: list[Check] = []
    try:
        client = local.open_client(runner, lab, need_slurm=True)
    except ValueError as exc:
        if runner != "lab" or "has no SLURM" not in str(exc):
            raise
        checks.append(Check("across.slurm", f"{exc}: the per-node steps and the job across nodes are skipped", "INFO",
                            {"lab": lab}, "", "docs/slurm-lab.md"))
        if "preflight" in steps:
            checks += local.run_network_preflight(nodes, "lab", lab_name=lab or local.DEFAULT_LAB_NAME)
        return checks, {"reports": {}, "matrix": {}, "job": None, "drain": drain_list(checks),
                        "checks": [c.to_dict() for c in checks]}
    tag = new_tag(TAG)
    ev: dict[str, Any] = {"reports": {}, "matrix": {}, "job": None, "tag": tag}
    try:
        if "nodes" in steps:
            reports, failed = run_node_steps(client, tag, nodes, out_dir / "nodes", timeout_s=min(45.0, timeout_s),
                                             dcgm_level=dcgm_level)
            ev["reports"] = reports
            checks += failed + grade_nodes(reports, gpus_per_node=gpus_per_node) + gpu_node_checks(reports)
            log(f"per-node steps: {len(reports)}/{len(nodes)} nodes answered")
        dead = faulty_nodes([c for c in checks if c.id.startswith("node.step.")])
        if "job" in steps and dead:
            checks.append(Check("job.launch", f"not launched: {', '.join(dead)} cannot run a SLURM step", "FAIL",
                                {"skipped_for": dead}, f"rerun without them: --exclude={','.join(dead)}", "MN1", faulty=dead))
        elif "job" in steps:
            run = run_job_across(client, tag, nodes, out_dir / "job", nproc=nproc, backend=backend,
                                 join_timeout_s=join_timeout_s, timeout_s=timeout_s)
            ev["job"] = {k: v for k, v in run.items() if k != "data"}
            log(f"job across {len(nodes)} nodes: ok={run['ok']} in {run['wall_s']} s")
            if run["data"] is None:
                checks.append(job_failure("job.launch", f"job over {len(nodes)} nodes x {nproc}", run, nodes))
            else:
                data = run["data"]
                checks += grade_job(data, nodes, nproc)
                ev["matrix"] = pair_matrix(data)
                cpu = not (data["records"][0].get("gpu") or {}).get("name")
                envelope, floor_frac, _ = inter_envelope(ev["reports"], cpu)
                checks.append(grade_pairs(ev["matrix"], envelope, floor_frac))
                checks += straggler.checks_for_job(data, ev["matrix"], prefix="job.")  # every rank's speed, every node's pairs
                if ev["reports"]:
                    checks += grade_envelope(data, ev["reports"])
                ev["inter"], ev["intra"] = data["inter"], data["intra"]
        if "smoke" in steps and not dead:
            checks.append(run_smoke_across(client, tag, nodes, out_dir / "smoke", nproc=nproc, backend=backend,
                                           steps=smoke_steps, join_timeout_s=max(join_timeout_s, 90.0)))
        alive = [n for n in nodes if n not in dead]
        if "localise" in steps and len(alive) >= 2:  # group testing (issue 23): the nodes SLURM can reach
            found, ev["localise"] = grouptest.run_localisation(client, tag, alive, out_dir / "localise", backend=backend,
                                                               log=log)
            checks += found
        if "preflight" in steps:
            checks += local.run_network_preflight(nodes, "lab" if runner == "lab" else "srun",
                                                        lab_name=lab or local.DEFAULT_LAB_NAME)
    finally:
        ev["cancelled"] = client.cleanup(tag)
    ev["drain"] = drain_list(checks)
    ev["checks"] = [c.to_dict() for c in checks]
    return checks, ev
