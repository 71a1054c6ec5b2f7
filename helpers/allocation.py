"""The allocation check across nodes: per-node steps, one job over every node, the node-pair matrix, the drain list.

``runbook diagnose`` inside a multi-node allocation (or with ``--nodes a,b --runner srun|lab``) runs,
through real SLURM (issue 11, sections 2-3):

* :func:`run_node_steps`: one ``srun -w NODE -N1 -n1 --overlap`` step per node, in parallel, running
  :func:`node_report` there (versions, GPU count, host checks, interfaces, NIC line rate, host
  memory-copy bandwidth); :func:`grade_nodes` turns them into checks naming the node.
* :func:`run_job_across`: ONE job over every node, the Gilbreth 4.3 way (``srun`` one task per node
  + ``torchrun``, ``--export=ALL``, ``MASTER_ADDR`` from ``scontrol show hostnames``: the text of
  :func:`helpers.slurm.srun_torchrun`), with a join deadline: a node whose ranks never wrote their
  ``joined-*`` marker is a FAIL naming it.  The job (``helpers/scenarios/allocation_job.py``)
  measures the env contract, collectives, intra/inter-node busbw and the node pairs;
  :func:`grade_job` / :func:`grade_pairs` / :func:`grade_envelope` grade them.
* :func:`run_smoke_across`: the multi-node DeepSpeed ZeRO-1 smoke test (Gilbreth 8.9: the verified multi-node DeepSpeed run).
* :func:`drain_list`: the nodes to leave out, as ``--exclude=`` for the next ``sbatch``.

Every SLURM command is tagged with a job/step name (:data:`TAG` + a token) and :func:`cleanup`
cancels whatever of it is left.  A SLURM launch error is reported in SLURM's own words
(:func:`slurm_errors`).
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from helpers import busbw, jobs, sources
from helpers.checks import Check, faulty_nodes

TAG = "runbook-check"
MAX_ALL_PAIRS = 16  # every node pair up to 16 nodes (15 rounds); beyond, the first SAMPLED_ROUNDS round-robin rounds
SAMPLED_ROUNDS = 8
RUNNERS = ("srun", "lab")
PAIR_SLOW_FRACTION = 0.3  # a pair below 30% of the reference (median over nodes of each node's best pair) is slow
# (bisection as in NVIDIA/nccl-tests PR 376); healthy pairs on the loaded 2-core lab varied 2.7x (0.074-0.197 GB/s)
INTER_FLOOR = 0.2  # GPU: inter-node plateau below 20% of the NIC line rate: WARN (a 10 GbE fallback on a 100G NIC is 10%)
CPU_FLOOR = 0.01  # CPU (gloo): busbw below 1% of the envelope (min of line rate and memory copy): WARN; measured healthy
# on the 2-core lab under load ~10: inter-node 4%, intra-node 7-9% of a 1.8 GB/s memory copy (docs/allocation-check.md)
SRC_PAIRS = "https://github.com/NVIDIA/nccl-tests/pull/376; https://github.com/NVIDIA/nccl/issues/349"
SRC_ENVELOPE = "https://github.com/NVIDIA/nccl-tests/issues/40; nccl-tests doc/PERFORMANCE.md"
# Published per-GPU NVLink / PCIe bandwidth, GB/s per direction (the GPU path: written and gated, not run here).
GPU_LINK_GBPS = {
    "H100": (450.0, "NVLink 4: 900 GB/s bidirectional per GPU, https://www.nvidia.com/en-us/data-center/h100/"),
    "H200": (450.0, "NVLink 4: 900 GB/s bidirectional per GPU, https://www.nvidia.com/en-us/data-center/h200/"),
    "A100": (300.0, "NVLink 3: 600 GB/s bidirectional per GPU, https://www.nvidia.com/en-us/data-center/a100/"),
    "V100": (150.0, "NVLink 2: 300 GB/s bidirectional per GPU, https://www.nvidia.com/en-us/data-center/v100/"),
    "PCIe4": (32.0, "PCIe 4.0 x16: 32 GB/s per direction, https://pcisig.com/specifications"),
    "PCIe5": (64.0, "PCIe 5.0 x16: 64 GB/s per direction, https://pcisig.com/specifications"),
}
_LAUNCH_ERR = re.compile(r"(Task launch for \S+ failed on node (\S+?):.*|"
                         r"Unable to create step for job.*|"
                         r"Required node not available.*|"
                         r"Nodes? (\S+) (?:are|is) (?:down|not responding).*|"
                         r"Job step creation temporarily disabled.*)")


# --------------------------------------------------------------------------- running SLURM commands

class Slurm:
    """Runs SLURM client commands: here (``runner="srun"``, inside or outside an allocation) or on the head node of lab ``lab``.

    Every ``srun``/``salloc`` it starts carries ``-J <tag>``, so :meth:`cleanup` can find and
    ``scancel`` what is left (no pending job or step after a failure).

    Raises:
        ValueError: ``runner`` not in :data:`RUNNERS`; ``runner="lab"`` and no SLURM lab ``lab`` up.
    """

    def __init__(self, runner: str = "srun", lab: str = "", tag: str = "") -> None:
        if runner not in RUNNERS:
            raise ValueError(f"runner={runner!r}: accepted values are {', '.join(RUNNERS)}")
        self.runner = runner
        self.tag = tag or f"{TAG}-{uuid.uuid4().hex[:6]}"
        self.lab = None
        if runner == "lab":
            from helpers import netlab

            self.lab = netlab.Lab.attach(lab) if lab else netlab.Lab.attach()
            if not self.lab.has_slurm:
                raise ValueError(f"lab={lab!r}: the lab has no SLURM (runbook lab up --slurm)")
        self.in_allocation = runner == "srun" and bool(os.environ.get("SLURM_JOB_ID"))
        # torchrun and python of this venv on every node (the project folder is the shared filesystem)
        self.base_env = {"PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"}

    def argv(self, argv: Sequence[str]) -> list[str]:
        """The command line that runs ``argv`` as a SLURM client (inside the lab's head node for ``lab``)."""
        argv = [str(a) for a in argv]
        return self.lab.node_argv("head", argv, cwd=jobs.project_root()) if self.lab else argv

    def popen(self, argv: Sequence[str], log: Path, env: Mapping[str, str] | None = None) -> subprocess.Popen:
        """Start ``argv`` (its own session), stdout+stderr to ``log``."""
        fh = open(log, "w")  # noqa: SIM115 - the child owns it
        try:
            return subprocess.Popen(self.argv(argv), stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env={**os.environ, **self.base_env, **(env or {})}, start_new_session=True)
        finally:
            fh.close()

    def run(self, argv: Sequence[str], timeout_s: float, env: Mapping[str, str] | None = None
            ) -> subprocess.CompletedProcess[str]:
        """Run ``argv`` and wait at most ``timeout_s``; on expiry stop it (:func:`stop`), returncode 124."""
        proc = subprocess.Popen(self.argv(argv), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                                stdin=subprocess.DEVNULL, env={**os.environ, **self.base_env, **(env or {})},
                                start_new_session=True)
        try:
            out, err = proc.communicate(timeout=timeout_s)
            return subprocess.CompletedProcess(argv, proc.returncode, out, err)
        except subprocess.TimeoutExpired:
            stop(proc)
            out, err = proc.communicate()
            return subprocess.CompletedProcess(argv, 124, out, (err or "") + f"\n[runbook] stopped after {timeout_s:g} s\n")

    def step_argv(self, nodes: Sequence[str], *, ntasks_per_node: int = 1) -> list[str]:
        """``srun`` options for one step on ``nodes`` (``--overlap`` inside an allocation)."""
        # -n explicit: inside sbatch, srun inherits SLURM_NTASKS of the whole job ("More processors requested than permitted")
        opts = ["srun", "-J", self.tag, "-w", ",".join(nodes), f"-N{len(nodes)}", f"-n{len(nodes) * ntasks_per_node}",
                f"--ntasks-per-node={ntasks_per_node}", "--export=ALL", "--kill-on-bad-exit=1"]
        return opts + (["--overlap"] if self.in_allocation else [])

    def cleanup(self) -> list[str]:
        """``scancel`` every job and step of this run still known to SLURM; return their ids."""
        ids: list[str] = []
        for extra in ([], ["-s"]):
            out = self.run(["squeue", "-h", *extra, "-o", "%i %j"], 20).stdout
            ids += [line.split()[0] for line in out.splitlines() if line.split()[1:] == [self.tag]]
        if ids:
            self.run(["scancel", *ids], 20)
        return ids


def stop(proc: subprocess.Popen, grace_s: float = 5.0) -> None:
    """Stop an ``srun``/``salloc`` politely: SIGTERM (srun cancels its step), then SIGKILL its session."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(proc.pid, sig)
        except (ProcessLookupError, PermissionError):
            return
        try:
            proc.wait(timeout=grace_s)
            return
        except subprocess.TimeoutExpired:
            continue


def slurm_errors(text: str) -> list[dict[str, str]]:
    """SLURM's own launch errors in ``text``: ``[{"line", "node", "kind"}]``.

    ``kind`` is ``unreachable`` when SLURM names a node it could not launch on (``node`` set), else
    ``refused`` (SLURM refused the step itself: ``Unable to create step ...``; ``node`` empty).

    ``Task launch for StepId=12.0 failed on node node2: Connection timed out`` names ``node2``:
    slurmctld/srun could not reach that node's slurmd, i.e. a network (or daemon) fault on that node.
    """
    found = []
    for m in _LAUNCH_ERR.finditer(text or ""):
        node = (m.group(2) or m.group(3) or "").strip()
        found.append({"line": m.group(1).strip(), "node": node, "kind": "unreachable" if node else "refused"})
    return found


# --------------------------------------------------------------------------- per node

def nic_speed_mbps(iface: str) -> tuple[float | None, str]:
    """Line rate of ``iface`` in Mb/s and where it came from (sysfs ``speed``, ``ethtool``, ``ibstat``)."""
    try:
        value = int(Path(f"/sys/class/net/{iface}/speed").read_text().strip())
        if value > 0:
            return float(value), f"/sys/class/net/{iface}/speed"
    except (OSError, ValueError):
        pass
    for argv, rx, unit in ((["ethtool", iface], r"Speed:\s*(\d+)\s*Mb/s", 1.0), (["ibstat"], r"Rate:\s*(\d+)", 1000.0)):
        try:
            out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        m = re.search(rx, out)
        if m:
            return float(m.group(1)) * unit, " ".join(argv)
    return None, "unknown (no sysfs speed, ethtool or ibstat)"


def memcpy_gbps(nbytes: int = 64 << 20, repeats: int = 5) -> float:
    """This host's memory-copy bandwidth, GB/s (best of ``repeats`` copies of ``nbytes``, read + write counted once)."""
    import torch

    src = torch.ones(nbytes // 4)
    dst = torch.empty_like(src)
    best = float("inf")
    for _ in range(repeats):
        t = time.perf_counter()
        dst.copy_(src)
        best = min(best, time.perf_counter() - t)
    return nbytes / best / 1e9


def node_report(master_port: int = 29500) -> dict[str, Any]:
    """What :func:`run_node_steps` measures on one node (run there): versions, GPUs, host checks, NIC, memcpy.

    Returns:
        ``{"hostname", "versions": {torch, cuda, nccl, driver, deepspeed}, "gpus", "nvswitch",
        "fabric_manager", "host_checks": [Check dicts], "iface", "nic_mbps", "nic_source", "memcpy_GBps",
        "socket_ifname": {VAR: value}, "slurm_gpus"}``.
    """
    import importlib.metadata

    import torch

    from helpers import diagnostics, hostinfo

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
    speed, source = nic_speed_mbps(iface) if iface else (None, "no data interface")
    checks = diagnostics.host_checks(master_port=master_port)
    return {"hostname": socket.gethostname(), "versions": {"torch": torch.__version__, "cuda": torch.version.cuda,
                                                           "nccl": nccl, "driver": driver, "deepspeed": version("deepspeed")},
            "gpus": gpus, "nvswitch": nvswitch, "fabric_manager": fabric,
            "host_checks": [c.to_dict() for c in checks], "iface": iface, "nic_mbps": speed, "nic_source": source,
            "memcpy_GBps": round(memcpy_gbps(), 2),
            "socket_ifname": {k: os.environ.get(k) for k in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME")},
            "slurm_gpus": os.environ.get("SLURM_GPUS_ON_NODE") or os.environ.get("SLURM_GPUS_PER_NODE")}


def run_node_steps(slurm: Slurm, nodes: Sequence[str], out_dir: Path, *, timeout_s: float = 45.0,
                   env: Mapping[str, str] | None = None) -> tuple[dict[str, dict], list[Check]]:
    """One step per node, in parallel: :func:`node_report` there.

    Returns:
        ``({node: report}, [a FAIL per node whose step failed, in SLURM's words])``.
    """
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    py = [sys.executable, "-m", "helpers.allocation", "node-report"]

    def one(node: str) -> tuple[str, subprocess.CompletedProcess[str]]:
        return node, slurm.run([*slurm.step_argv([node]), *py], timeout_s, env)

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
        fix = f"read {node}'s step log; run the command by hand: srun -w {node} -N1 python -m helpers.allocation node-report"
    return Check(cid, title, "FAIL", {"returncode": proc.returncode, "slurm_errors": errs}, fix,
                 sources.cite("MN1", "MN3"), evidence=[e["line"] for e in errs], node=node, faulty=named)


def grade_nodes(reports: Mapping[str, Mapping[str, Any]], *, gpus_per_node: int = 0) -> list[Check]:
    """Checks from the per-node reports: versions equal everywhere, GPU count, host checks and fabric manager per node.

    Args:
        reports: ``{node: node_report()}``.
        gpus_per_node: GPUs the allocation asked for per node (0: none expected, CPU).

    Returns:
        ``node.versions`` (FAIL naming the odd node(s) on a torch/CUDA/NCCL/DeepSpeed difference, WARN on the
        driver), then per node ``node.gpus.<node>`` and ``node.<host check id>.<node>`` (node set).
    """
    checks: list[Check] = []
    keys = ("torch", "cuda", "nccl", "driver", "deepspeed")
    differing: dict[str, dict[str, Any]] = {}
    odd: list[str] = []
    for key in keys:
        seen = {n: r["versions"].get(key) for n, r in reports.items()}
        values = [json.dumps(v) for v in seen.values()]
        if len(set(values)) > 1:
            common = max(set(values), key=values.count)
            differing[key] = seen
            odd += [n for n, v in seen.items() if json.dumps(v) != common and n not in odd]
    table = {n: r["versions"] for n, r in reports.items()}
    if differing:
        status = "FAIL" if set(differing) - {"driver"} else "WARN"
        checks.append(Check("node.versions", f"versions differ across nodes: {', '.join(differing)} (odd: {', '.join(odd)})",
                            status, {"per_node": table, "differing": differing},
                            f"install the same torch/CUDA/NCCL/DeepSpeed on {', '.join(odd)} (one venv on the shared "
                            "filesystem); ranks with different NCCL versions hang or crash (Gilbreth 8.12 failure mode 4)",
                            sources.cite("Gilbreth 8.12"), faulty=odd))
    else:
        first = next(iter(table.values()), {})
        checks.append(Check("node.versions", f"same versions on {len(table)} nodes: " +
                            ", ".join(f"{k} {first.get(k)}" for k in keys), "OK", {"per_node": table}, "", "D1"))
    for node, r in reports.items():
        want = gpus_per_node
        status = "OK" if r["gpus"] >= want else "FAIL"
        title = f"{node}: {r['gpus']} GPU(s) visible, {want} asked for"
        if r.get("nvswitch") and r.get("fabric_manager") != "active":
            status, title = "FAIL", title + f"; NVSwitch node with nvidia-fabricmanager {r.get('fabric_manager')!r} (MN1)"
        checks.append(Check(f"node.gpus.{node}", title, status, {"gpus": r["gpus"], "asked": want,
                                                                   "fabric_manager": r.get("fabric_manager")},
                            "" if status == "OK" else f"{node}: check `nvidia-smi`, CUDA_VISIBLE_DEVICES and the job's --gpus-per-node; "
                            "NVSwitch nodes: systemctl start nvidia-fabricmanager", sources.cite("MN1"), node=node))
        for c in r["host_checks"]:
            rec = Check.from_dict(c)
            rec.id, rec.node, rec.title = f"node.{rec.id}.{node}", node, f"{node}: {rec.title}"
            # a stale JIT build lock sits in a user's folder (often the shared home), not in the node: nothing to drain
            rec.faulty = [node] if rec.status in ("WARN", "FAIL") and c["id"] != "host.jit_lock" else []
            checks.append(rec)
    return checks


# --------------------------------------------------------------------------- one job across every node

def _job_shell(slurm: Slurm, nodes: Sequence[str], nproc: int, script: Path, args: Sequence[str],
               env: Mapping[str, str | None] | None, master_port: int) -> list[str]:
    """The Gilbreth 4.3 launch (``slurm.srun_torchrun``) as one command: inside the allocation, or in a ``salloc`` on ``nodes``."""
    from helpers import slurm as slurm_forms

    text = slurm_forms.srun_torchrun(len(nodes), nproc, str(script), list(args), master_port=master_port, env=env,
                                     srun_args=["-J", slurm.tag, "-w", ",".join(nodes), f"--ntasks={len(nodes)}",
                                                "--kill-on-bad-exit=1",
                                                *(["--overlap"] if slurm.in_allocation else [])])
    if slurm.in_allocation:
        # SLURM_JOB_NODELIST is the whole allocation; MASTER_ADDR must be the first node *of this job*.
        text = text.replace('"$SLURM_JOB_NODELIST"', shlex.quote(",".join(nodes)))
        return ["bash", "-c", text]
    # One torchrun task per node needs a CPU per rank: the srun line asks for $SLURM_CPUS_PER_TASK (Slurm >= 22.05
    # no longer passes the allocation's value to srun), so the allocation must grant it, or the step is refused.
    return ["salloc", "-J", slurm.tag, "-w", ",".join(nodes), f"-N{len(nodes)}", "--ntasks-per-node=1",
            f"--cpus-per-task={nproc}", "--immediate=30", "bash", "-c", text]


def _joined(out_dir: Path, what: str = "joined") -> set[tuple[str, int]]:
    """``(node, local_rank)`` of every ``ranks/<what>-<node>-<local_rank>`` marker (``what``: started or joined)."""
    return {(p.name[len(what) + 1:].rsplit("-", 1)[0], int(p.name.rsplit("-", 1)[1]))
            for p in (out_dir / "ranks").glob(f"{what}-*")}


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


def run_job_across(slurm: Slurm, nodes: Sequence[str], out_dir: Path, *, nproc: int = 1, backend: str = "gloo",
                   join_timeout_s: float = 60.0, timeout_s: float = 240.0, collective_timeout_s: float = 60.0,
                   script: str = "allocation_job.py", script_args: Sequence[str] = (),
                   env: Mapping[str, str | None] | None = None, master_port: int = 29500,
                   result: str = "allocation_job.json", markers: bool = True) -> dict[str, Any]:
    """Launch ``script`` on every node with ``nproc`` ranks each; wait for every node to join, then for the result.

    Returns:
        ``{"ok", "data" (rank 0's JSON or None), "missing" (nodes with a rank that never joined),
        "joined", "wall_s", "returncode", "log", "slurm_errors", "stopped" (why it was stopped, or "")}``.
    """
    out_dir = Path(out_dir).resolve()
    (out_dir / "ranks").mkdir(parents=True, exist_ok=True)
    log = out_dir / "launch.log"
    argv = [*([] if script_args else ["--out-dir", str(out_dir)]), "--backend", backend,
            "--timeout-s", str(collective_timeout_s), *script_args]
    if script == "allocation_job.py" and len(nodes) > MAX_ALL_PAIRS:  # sampled: each node meets SAMPLED_ROUNDS partners
        argv += ["--max-rounds", str(SAMPLED_ROUNDS)]
    # JIT-built ops (DeepSpeed's) in the project's build folder on the shared filesystem, built once for every node,
    # never in each user's ~/.cache (jobs.extensions_dir)
    env = {"TORCH_EXTENSIONS_DIR": str(jobs.extensions_dir()), **(env or {})}
    cmd = _job_shell(slurm, nodes, nproc, jobs.project_root() / "helpers" / "scenarios" / script, argv, env, master_port)
    # Each task leaves a marker before torchrun, whose rendezvous holds every rank until all nodes are in:
    # the node without one is the node whose task never started (inside the single-quoted task body).
    if "'" not in str(out_dir):
        touch = f'touch {out_dir}/ranks/task-"${{SLURMD_NODENAME:-$(hostname)}}"\n    torchrun '
        cmd[-1] = cmd[-1].replace("\n    torchrun ", "\n    " + touch, 1)
    t0 = time.monotonic()
    proc = slurm.popen(cmd, log)
    expected = {(n, r) for n in nodes for r in range(nproc)}
    stopped = ""
    while proc.poll() is None:
        elapsed = time.monotonic() - t0
        if markers and elapsed > join_timeout_s and not expected <= _joined(out_dir):
            stopped = f"not every node joined within {join_timeout_s:g} s"
        elif elapsed > timeout_s:
            stopped = f"no result within {timeout_s:g} s"
        if stopped:
            stop(proc)
            break
        time.sleep(0.5)
    proc.wait()
    joined = _joined(out_dir)
    text = log.read_text(errors="replace") if log.exists() else ""
    data_path = out_dir / result
    data = json.loads(data_path.read_text()) if data_path.exists() else None
    started = _joined(out_dir, "started")
    tasks = {p.name[len("task-"):] for p in (out_dir / "ranks").glob("task-*")}
    all_in = {(n, r) for n in nodes for r in range(nproc)} <= joined
    missing = culprits(nodes, nproc, tasks, started, joined) if markers and not all_in else []
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


def grade_job(data: Mapping[str, Any], nodes: Sequence[str], nproc: int) -> list[Check]:
    """The env contract and env diff across all ranks of all nodes, and collectives correctness across nodes.

    Adds to :func:`helpers.diagnostics.grade_contract`: ``GROUP_RANK == SLURM_NODEID`` on every rank and
    ``WORLD_SIZE == nodes x ranks per node``.
    """
    from helpers import diagnostics

    records = data["records"]
    contract = diagnostics.grade_contract(records)
    extra = []
    for r in records:
        c, nid = r.get("contract", {}), r.get("env", {}).get("SLURM_NODEID")
        if nid is not None and str(c.get("GROUP_RANK")) != str(nid):
            extra.append(f"{r['hostname']}: GROUP_RANK={c.get('GROUP_RANK')} but SLURM_NODEID={nid}")
    if data["world_size"] != len(nodes) * nproc:
        extra.append(f"WORLD_SIZE={data['world_size']} != {len(nodes)} nodes x {nproc} ranks")
    if extra:
        contract = Check("launcher.contract", f"env contract broken across nodes: {extra[0]}", "FAIL",
                         {**contract.values, "problems": contract.values["problems"] + extra},
                         "start one torchrun per node with --node-rank=$SLURM_NODEID (Gilbreth 4.3)", "D1, D3",
                         faulty=sorted({e.split(":")[0] for e in extra if ":" in e}))
    contract.id = "job.contract"
    env = diagnostics.grade_env(records)
    env.id = "job.env_diff"
    if env.status != "OK":  # name the node(s) whose value is the odd one out
        hosts = [r["hostname"] for r in records]
        odd: list[str] = []
        for per_rank in env.values["differing"].values():
            vals = [json.dumps(v) for v in per_rank.values()]
            # the most frequent value is the reference; on a tie, rank 0's (the node the job was launched from:
            # failure mode 4 loses the launch environment on the *other* nodes)
            top = max(vals.count(v) for v in vals)
            common = json.dumps(per_rank.get(0)) if vals.count(json.dumps(per_rank.get(0))) == top else \
                max(set(vals), key=vals.count)
            odd += [hosts[i] for i, v in per_rank.items() if json.dumps(v) != common and hosts[i] not in odd]
        if len(set(hosts)) > 1 and odd and len(set(odd)) < len(set(hosts)):
            env.status = "FAIL"
        env.faulty = list(dict.fromkeys(odd))
        env.title += f" (odd: {', '.join(env.faulty)})"
    corr = diagnostics.grade_correctness({"correctness": data["correctness"], "world_size": data["world_size"]})
    corr.id = "job.correctness"
    return [contract, env, corr]


def _plateau(rows: Sequence[Mapping[str, Any]]) -> float:
    ann = busbw.annotate(rows, rows[0]["ranks"])
    return busbw.plateau([r["bytes"] for r in ann], [r["busbw_GBps"] for r in ann])["plateau_GBps"]


def pair_matrix(data: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """``{a: {b: busbw GB/s}}`` (symmetric) from the job's pair rows (2-rank all_reduce: busbw = algbw)."""
    m: dict[str, dict[str, float]] = {h: {} for h in data["hosts"]}
    for p in data["pairs"]:
        v = busbw.busbw_gbps("all_reduce", 2, p["bytes"], p["time_s"])
        m[p["a"]][p["b"]] = m[p["b"]][p["a"]] = round(v, 4)
    return m


def inter_envelope(reports: Mapping[str, Mapping[str, Any]], cpu: bool) -> tuple[float | None, float, str]:
    """``(envelope GB/s, floor fraction, what it is)`` for inter-node busbw.

    GPU: the slowest node's NIC line rate (sysfs/ethtool/ibstat), floor :data:`INTER_FLOOR`.  CPU (gloo):
    the smaller of that and the slowest node's measured memory copy (gloo over TCP is CPU-bound long
    before a 10 GbE line), floor :data:`CPU_FLOOR`.
    """
    rates = [r["nic_mbps"] / 8000 for r in reports.values() if r.get("nic_mbps")]
    line = min(rates) if rates else None
    if not cpu:
        return line, INTER_FLOOR, "NIC line rate"
    mem = [r["memcpy_GBps"] for r in reports.values() if r.get("memcpy_GBps")]
    cands = [v for v in (line, min(mem) if mem else None) if v]
    return (min(cands) if cands else None), CPU_FLOOR, "min(NIC line rate, host memory copy): CPU/gloo"


def grade_pairs(matrix: Mapping[str, Mapping[str, float]], line_rate_gbps: float | None = None,
                floor_fraction: float = INTER_FLOOR) -> Check:
    """Name the outlier of the node x node matrix: a node all of whose pairs are slow, or one slow pair (the link).

    A pair is slow below :data:`PAIR_SLOW_FRACTION` of the reference, the median over nodes of each node's
    best pair (3 or more nodes), or below
    ``floor_fraction`` of the envelope ``line_rate_gbps`` when given (:func:`inter_envelope`; with 2 nodes
    there is one pair: only the envelope can judge it).
    """
    pairs = {tuple(sorted((a, b))): v for a, row in matrix.items() for b, v in row.items()}
    values = {"matrix": matrix, "envelope_GBps": line_rate_gbps, "floor_fraction": floor_fraction,
              "slow_fraction_of_median": PAIR_SLOW_FRACTION}
    if not pairs:
        return Check("pairs.bandwidth", "no node pair measured", "WARN", values, "run with 2 or more nodes", SRC_PAIRS)
    best = sorted(max(row.values()) for row in matrix.values() if row)
    med = best[len(best) // 2]  # the reference: a slow node is in every pair of its own, never in most nodes' best pair
    floor = max(PAIR_SLOW_FRACTION * med if len(matrix) > 2 else 0.0, floor_fraction * line_rate_gbps if line_rate_gbps else 0.0)
    slow = {p: v for p, v in pairs.items() if v < floor}
    values.update(reference_GBps=med, floor_GBps=round(floor, 4), slow_pairs={f"{a}-{b}": v for (a, b), v in slow.items()})
    if not slow:
        return Check("pairs.bandwidth", f"{len(pairs)} node pair(s), reference busbw {med:.3f} GB/s, none below {floor:.3f}",
                     "OK", values, "", SRC_PAIRS)
    nodes = list(matrix)
    bad_nodes = [n for n in nodes if all(p in slow for p in pairs if n in p)]
    if len(nodes) == 2:
        bad_nodes = []
    if bad_nodes:
        title = f"slow node(s) {', '.join(bad_nodes)}: every pair with it below {floor:.3f} GB/s (reference {med:.3f})"
        fix = (f"drain {', '.join(bad_nodes)} (--exclude={','.join(bad_nodes)}); check its NIC rate (ethtool, ibstat), "
               "its port's errors, and a throttled or shared link")
        faulty = bad_nodes
    else:
        links = ", ".join(f"{a}-{b} ({v:.3f} GB/s)" for (a, b), v in slow.items())
        title = f"slow link(s): {links}, below {floor:.3f} GB/s"
        fix = "the nodes are fine with others: the cable/switch path between them is slow; report the link"
        faulty = sorted({n for p in slow for n in p}) if len(slow) == 1 and len(nodes) == 2 else []
    return Check("pairs.bandwidth", title, "WARN", values, fix, SRC_PAIRS, faulty=faulty)


def grade_envelope(data: Mapping[str, Any], reports: Mapping[str, Mapping[str, Any]]) -> list[Check]:
    """"Is my number normal": inter-node plateau vs the NIC line rate, intra-node vs memory copy (CPU) or NVLink/PCIe (GPU).

    The envelope is printed in each record.  Floors: inter-node :data:`INTER_FLOOR` of the slowest node's line rate;
    CPU intra-node :data:`CPU_FLOOR` of the node's measured memory-copy bandwidth; GPU intra-node half of the
    published per-GPU figure of :data:`GPU_LINK_GBPS` (gated: only with a GPU named there).
    """
    checks = []
    rates = {n: r["nic_mbps"] / 8000 for n, r in reports.items() if r.get("nic_mbps")}
    gpu_name = (data["records"][0].get("gpu") or {}).get("name") or ""
    line, floor_frac, what = inter_envelope(reports, cpu=not gpu_name)
    inter = _plateau(data["inter"])
    env = {"envelope_GBps": line, "envelope": what, "per_node_line_rate_GBps": rates,
           "per_node_memcpy_GBps": {n: r.get("memcpy_GBps") for n, r in reports.items()},
           "sources": {n: r.get("nic_source") for n, r in reports.items()}}
    if line is None:
        checks.append(Check("envelope.inter", f"inter-node plateau busbw {inter:.3f} GB/s; line rate unknown", "INFO",
                            {"plateau_GBps": inter, **env}, "", SRC_ENVELOPE))
    else:
        frac = inter / line
        status = "OK" if frac >= floor_frac else "WARN"
        checks.append(Check("envelope.inter", f"inter-node plateau busbw {inter:.3f} GB/s = {frac:.1%} of the "
                            f"{line:.3f} GB/s envelope ({what}; floor {floor_frac:.0%})", status,
                            {"plateau_GBps": inter, "fraction": round(frac, 3), **env},
                            "far below the NIC: a fallback path (TCP instead of IB, 10 GbE), a slow node (see "
                            "pairs.bandwidth) or NCCL_SOCKET_IFNAME on the wrong NIC", SRC_ENVELOPE))
    for node, rows in data.get("intra", {}).items():
        plat = _plateau(rows)
        rep = reports.get(node, {})
        if gpu_name:
            key = next((k for k in GPU_LINK_GBPS if k in gpu_name), "PCIe4")
            ref, src = GPU_LINK_GBPS[key]
            floor = 0.5 * ref
        else:
            ref, src, floor = rep.get("memcpy_GBps"), "memory copy of this host, measured", CPU_FLOOR * (rep.get("memcpy_GBps") or 0)
        status = "OK" if not ref or plat >= floor else "WARN"
        checks.append(Check(f"envelope.intra.{node}", f"{node}: intra-node plateau busbw {plat:.3f} GB/s vs envelope "
                            f"{ref} GB/s ({src}); floor {floor:.3f}", status,
                            {"plateau_GBps": plat, "envelope_GBps": ref, "floor_GBps": floor, "source": src},
                            f"{node}: check the intra-node transport (NCCL_DEBUG=INFO: P2P/NVLink or SHM), nvidia-smi topo -m",
                            SRC_ENVELOPE, node=node))
    for c in checks:
        c.remediation = "" if c.status == "OK" else c.remediation
    return checks


def run_smoke_across(slurm: Slurm, nodes: Sequence[str], out_dir: Path, *, nproc: int, backend: str,
                     steps: int = 20, timeout_s: float = 300.0, join_timeout_s: float = 90.0) -> Check:
    """The multi-node smoke test (Gilbreth 8.9: the verified multi-node DeepSpeed run): DeepSpeed ZeRO-1 bf16, every rank saves and loads; one optimizer-state file per rank."""
    from helpers import diagnostics

    title = f"multi-node DeepSpeed ZeRO-1 bf16 on {len(nodes)} nodes x {nproc}"
    if (locked := diagnostics.stale_lock_failure("smoke.multinode", title)) is not None:
        return locked  # the ranks would wait on it until the timeout (the folder is on the shared filesystem)
    out_dir = Path(out_dir)
    ckpt = out_dir / "checkpoints"
    out = out_dir / "smoke.json"
    cfg = diagnostics.CONFIGS / ("ds_zero1_gpu.json" if backend == "nccl" else "ds_zero1_cpu.json")
    args = ["--steps", str(steps), "--ckpt-dir", str(ckpt), "--out", str(out), "--deepspeed-config", str(cfg)]
    run = run_job_across(slurm, nodes, out_dir, nproc=nproc, backend=backend, join_timeout_s=join_timeout_s,
                         timeout_s=timeout_s, script="smoke_deepspeed.py", script_args=args, result="smoke.json",
                         markers=False)
    if not run["data"]:
        return job_failure("smoke.multinode", title, run, nodes)
    check = diagnostics.grade_smoke("smoke.multinode", title, run["data"], "Gilbreth 8.9")
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
        return Check("allocation.host", f"running on {host}, a node of the allocation", "OK", {"host": host, "nodes": list(nodes)})
    return Check("allocation.host", f"running on {host}, which is not a node of the allocation ({', '.join(nodes)}): "
                 "the single-node jobs are not run here, every check below ran on the nodes through srun", "WARN",
                 {"host": host, "nodes": list(nodes)},
                 "run `runbook diagnose` inside the allocation (sbatch configs/slurm/allocation_check.sbatch, or "
                 "salloc then srun -N1 runbook diagnose) so nothing is measured on the login node", sources.cite("Gilbreth 4.3"))


MULTI_STEPS = ("nodes", "job", "smoke", "preflight")


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
        lines += [f"- [{c.status}] `{c.id}`: {c.title}" for c in mine] + [""]
    return "\n".join(lines)


def run_allocation(nodes: Sequence[str], out_dir: Path, *, runner: str = "srun", lab: str = "", nproc: int = 1,
                   backend: str = "gloo", steps: Sequence[str] = MULTI_STEPS, join_timeout_s: float = 60.0,
                   timeout_s: float = 240.0, gpus_per_node: int = 0, smoke_steps: int = 20,
                   log: Callable[[str], None] = print) -> tuple[list[Check], dict[str, Any]]:
    """Every multi-node check of ``steps`` (subset of :data:`MULTI_STEPS`) on ``nodes``; cleans up what it started.

    Returns:
        ``(checks, evidence)`` with evidence ``{"reports", "matrix", "job", "drain"}``.

    Raises:
        ValueError: fewer than 2 nodes, an unknown step or runner.
    """
    from helpers import diagnostics

    if len(nodes) < 2:
        raise ValueError(f"nodes={list(nodes)!r}: give 2 or more nodes")
    unknown = [s for s in steps if s not in MULTI_STEPS]
    if unknown:
        raise ValueError(f"steps={unknown!r}: accepted values are {', '.join(MULTI_STEPS)}")
    out_dir = Path(out_dir).resolve()  # the nodes write there: an absolute path on the shared filesystem
    checks: list[Check] = []
    try:
        slurm = Slurm(runner, lab)
    except ValueError as exc:
        if runner != "lab" or "has no SLURM" not in str(exc):
            raise
        checks.append(Check("allocation.slurm", f"{exc}: the per-node steps and the job across nodes are skipped", "INFO",
                            {"lab": lab}, "", "docs/slurm-lab.md"))
        if "preflight" in steps:
            checks += diagnostics.run_network_preflight(nodes, "lab", lab_name=lab or diagnostics.DEFAULT_LAB_NAME)
        return checks, {"reports": {}, "matrix": {}, "job": None, "drain": drain_list(checks),
                        "checks": [c.to_dict() for c in checks]}
    ev: dict[str, Any] = {"reports": {}, "matrix": {}, "job": None, "tag": slurm.tag}
    try:
        if "nodes" in steps:
            reports, failed = run_node_steps(slurm, nodes, out_dir / "nodes", timeout_s=min(45.0, timeout_s))
            ev["reports"] = reports
            checks += failed + grade_nodes(reports, gpus_per_node=gpus_per_node)
            log(f"per-node steps: {len(reports)}/{len(nodes)} nodes answered")
        dead = faulty_nodes([c for c in checks if c.id.startswith("node.step.")])
        if "job" in steps and dead:
            checks.append(Check("job.launch", f"not launched: {', '.join(dead)} cannot run a SLURM step", "FAIL",
                                {"skipped_for": dead}, f"rerun without them: --exclude={','.join(dead)}", "MN1", faulty=dead))
        elif "job" in steps:
            run = run_job_across(slurm, nodes, out_dir / "job", nproc=nproc, backend=backend,
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
                if ev["reports"]:
                    checks += grade_envelope(data, ev["reports"])
                ev["inter"], ev["intra"] = data["inter"], data["intra"]
        if "smoke" in steps and not dead:
            checks.append(run_smoke_across(slurm, nodes, out_dir / "smoke", nproc=nproc, backend=backend,
                                           steps=smoke_steps, join_timeout_s=max(join_timeout_s, 90.0)))
        if "preflight" in steps:
            checks += diagnostics.run_network_preflight(nodes, "lab" if runner == "lab" else "srun",
                                                        lab_name=lab or diagnostics.DEFAULT_LAB_NAME)
    finally:
        ev["cancelled"] = slurm.cleanup()
    ev["drain"] = drain_list(checks)
    ev["checks"] = [c.to_dict() for c in checks]
    return checks, ev


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m helpers.allocation node-report``: print :func:`node_report` as one JSON line (run by each node's step)."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] != ["node-report"]:
        print("usage: python -m helpers.allocation node-report", file=sys.stderr)
        return 2
    print(json.dumps(node_report(int(os.environ.get("MASTER_PORT", "29500") or 29500))), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
