"""The allocation check on one node: run each check as a real multi-process job, measure the host.

Each ``run_*`` function launches a job through :mod:`helpers.jobs` and returns the
:class:`~helpers.checks.Check` records plus the evidence; the grading of what it measured is the
pure part and lives in :mod:`helpers.allocation.grades` (measured data in, verdicts out), so it
can be tested on its own.  :func:`host_checks`
grades what :mod:`helpers.hostinfo` measures on this host (check 5: port, ``/dev/shm``,
interfaces, ``*_SOCKET_IFNAME`` with the rules of :mod:`helpers.ifnames`).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from helpers import hostinfo, ifnames, jobs, sources
from helpers.allocation.grades import grade_bandwidth, grade_contract, grade_correctness, grade_env, grade_smoke, grade_toolchain
from helpers.checks import Check, worst_status
from helpers.jobdir import JobDir
from helpers.launchers import DEFAULT_MASTER_PORT
from helpers.netlab import DEFAULT_NAME as DEFAULT_LAB_NAME
from helpers.report import GIB, MIB
from helpers.slurm import RUNNERS, LocalSlurm, SlurmClient, ThisHost
from helpers.validate import tcp_port

SCENARIOS = jobs.SCENARIOS
CONFIGS = jobs.CONFIGS


def new_report_dir(base: str | Path | None = None) -> Path:
    """Create and return ``<base>/<host>-<YYYYmmdd-HHMMSS>`` (default base: ``build/reports``)."""
    root = Path(base) if base else jobs.build_dir() / "reports"
    path = root / f"{socket.gethostname()}-{time.strftime('%Y%m%d-%H%M%S')}"
    path.mkdir(parents=True, exist_ok=True)
    return path


def job_failure(check_id: str, title: str, job: jobs.JobResult, source: str = "") -> Check:
    """A FAIL record for a job that crashed, hung or timed out, with the evidence that says why."""
    values: dict[str, Any] = {"job_dir": str(job.job_dir), "wall_s": round(job.wall_s, 2),
                              "launcher_exit": job.returncodes, "failed_ranks": job.failed_ranks}
    if job.hung or job.timed_out:
        values["stopped"] = job.stop_reason
        values["hung_ranks"] = job.hung_ranks
        values["stacks"] = {r: _innermost(s) for r, s in job.stacks.items()}
        fix = (f"the job made no progress ({job.stop_reason}); ranks {job.hung_ranks} were alive: read their "
               f"stacks in {job.job_dir / 'stacks'} (which collective each waits in), then chapter 03_hangs")
    else:
        first = job.first_failure
        tb = first.traceback if first else None
        values["first_failed_rank"] = first.rank if first else None
        text = tb or (first.stderr if first else "") or job.output
        lines = [line for line in text.strip().splitlines() if line.strip()]
        values["error"] = lines[-1] if lines else f"launcher exit {job.returncodes}"
        fix = (f"rank {first.rank if first else '?'} failed first: {values['error']}; "
               f"full logs in {job.job_dir / 'ranks'}")
    return Check(check_id, title, "FAIL", values, fix, source)


def _innermost(stack: str) -> str:
    """The innermost Python frame of each thread in a py-spy dump (the line a rank is stuck on)."""
    lines = stack.splitlines()
    frames = [lines[i + 1].strip() for i, line in enumerate(lines[:-1]) if line.startswith("Thread ")]
    return "; ".join(frames) or stack.strip()[:200]


# --------------------------------------------------------------------------- 1 + 2: env report and contract


def nccl_debug_env(backend: str) -> dict[str, str | None]:
    """The variables that make NCCL log what the NCCL log interpreter reads, on the NCCL backend only.

    ``NCCL_DEBUG=INFO`` with ``NCCL_DEBUG_SUBSYS=INIT,NET`` (bootstrap interface, network, transports,
    ``Init COMPLETE``: enough for :mod:`helpers.nccl_log`, without per-collective lines); ``{}`` on gloo.
    A value the user already exported wins.  Source: https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-debug
    """
    if backend != "nccl":
        return {}
    return {key: os.environ.get(key, value) for key, value in (("NCCL_DEBUG", "INFO"), ("NCCL_DEBUG_SUBSYS", "INIT,NET"))}


def nccl_checks(backend: str, *results: jobs.JobResult | None) -> list[Check]:
    """The NCCL log interpreter's verdicts on the rank logs of ``results`` (issue 15), for the report.

    On gloo, or when no log holds an NCCL line, ``[]``.  Each verdict keeps its record (cause, evidence,
    fix naming the command that confirms it on the node) with its id prefixed ``nccl.`` so the report
    groups them (``nccl.bad-interface``, ``nccl.shm-full``...).  Only a verdict whose evidence decides (kind
    ``cause``) names faulty nodes for the drain list; a suspect or context verdict is reported with no node to drain
    (``values["not_drained"]`` says why): a drain list an admin runs must not take a node out on a guess.

    Args:
        backend: the backend the jobs ran with (``gloo`` / ``nccl``).
        results: the jobs whose ``ranks/rank<R>.stdout|.stderr`` to read (None entries are skipped).
    """
    from helpers import nccl_log

    if backend != "nccl":
        return []
    paths = [p for r in results if r is not None for p in JobDir(r.job_dir).rank_logs()]
    if not paths:
        return []
    found = nccl_log.checks_for_job(paths)
    for c in found:
        c.id = f"nccl.{c.id}"
        if c.values.get("kind") != "cause" and c.faulty:
            # a suspect (or context) names what to confirm on the node, not a fault: reported, never drained
            c.values["not_drained"] = "a suspect read from the NCCL log: confirm it with the command in the fix first"
            c.faulty = []
    return found


def run_env_contract(out_dir: Path, *, nproc: int, backend: str, timeout_s: float) -> tuple[list[Check], list[dict], jobs.JobResult]:
    """Checks 1 and 2: one job where every rank reports its environment and contract.

    Returns:
        ``([env.diff, launcher.contract], per-rank records, job)``; on a failed job, one FAIL
        record and no records.
    """
    out = Path(out_dir) / "env_ranks.json"
    job = jobs.run_job(SCENARIOS / "env_report.py", ["--out", str(out), "--backend", backend,
                                                     "--timeout-s", str(timeout_s)],
                       nproc=nproc, timeout_s=timeout_s + 30, name="env-contract", env=nccl_debug_env(backend))
    if not job.ok or not out.exists():
        return [job_failure("env.diff", "environment report job failed", job, "D1")], [], job
    records = json.loads(out.read_text())
    return [grade_env(records), grade_contract(records)], records, job


# --------------------------------------------------------------------------- 3 + 4: collectives


def intra_expectation(backend: str) -> dict[str, Any]:
    """What a healthy node of this kind reaches inside the node (``grades.grade_bandwidth``'s ``expected``).

    NCCL: the NVLink figure of the GPU model NVML names (:func:`helpers.allocation.grades.nvlink_expectation`);
    gloo: the healthy lab's ``intra`` fraction (:data:`~helpers.allocation.grades.CPU_HEALTHY_FRACTION`) x this host's
    memory copy (:func:`helpers.hostinfo.memcpy_gbps`).  ``{"GBps": None, ...}`` when there is no figure.
    """
    from helpers.allocation import gpu_health, grades

    if backend == "nccl":
        names = [g.get("name") for g in gpu_health.read_nvml()["gpus"] if g.get("name")]
        gbps, source = grades.nvlink_expectation(names[0]) if names else (None, "NVML names no GPU")
        return {"GBps": gbps, "source": source, "detail": names[0] if names else ""}
    mem = hostinfo.memcpy_gbps()
    frac = grades.CPU_HEALTHY_FRACTION["intra"]
    return {"GBps": frac * mem if frac else None, "memcpy_GBps": round(mem, 3),
            "source": grades.SRC_CPU_BW,
            "detail": f"{frac:.3f} x memory copy {mem:.2f} GB/s"}


def run_collectives(out_dir: Path, *, nproc: int, backend: str, timeout_s: float, min_bytes: int, max_bytes: int,
                    check_elements: int = 1 << 20, corrupt_rank: int = -1,
                    min_busbw_gbps: float = 0.0) -> tuple[list[Check], list[dict], jobs.JobResult]:
    """Checks 3 and 4 in one job: exact collective results, then the busbw sweep; and the straggler score.

    Every rank also measures its matmul and memory-copy speed in the same job (``_speed.py``), graded as
    ``straggler.ranks`` (:mod:`helpers.allocation.straggler`: WARN below 0.9, FAIL below 0.7 of the best rank).

    Returns:
        ``([collectives.correctness, collectives.bandwidth, straggler.ranks], annotated sweep rows, job)``.
    """
    out = Path(out_dir) / "collectives.json"
    args = ["--out", str(out), "--backend", backend, "--timeout-s", str(timeout_s), "--min-bytes", str(min_bytes),
            "--max-bytes", str(max_bytes), "--check-elements", str(check_elements), "--corrupt-rank", str(corrupt_rank)]
    psi0, t0 = hostinfo.cpu_pressure_us(), time.monotonic()
    job = jobs.run_job(SCENARIOS / "collectives.py", args, nproc=nproc, timeout_s=timeout_s * 4 + 60,
                       stall_s=timeout_s + 10, name="collectives", env=nccl_debug_env(backend))
    contention = hostinfo.cpu_contention(psi0, time.monotonic() - t0)
    if job.hung or job.timed_out or not out.exists():
        return [job_failure("collectives.correctness", "collectives job did not finish", job,
                            sources.cite("Gilbreth 6.3"))], [], job
    data = json.loads(out.read_text())
    expected = {**intra_expectation(backend), "cpu_contention": contention}
    bandwidth, rows = grade_bandwidth(data, min_busbw_gbps=min_busbw_gbps, expected=expected)
    from helpers.allocation import straggler

    return [grade_correctness(data), bandwidth, *straggler.checks_for_job(data, contention=contention)], rows, job


# --------------------------------------------------------------------------- 6: smoke tests

SMOKE = {
    "01": ("smoke.01_single", "python", "smoke_single.py", "single process trains and reloads its checkpoint",
           sources.cite("Gilbreth 5")),
    "02": ("smoke.02_ddp", "torchrun", "smoke_ddp.py", "DDP trains, rank 0 saves model.module.state_dict()",
           sources.cite("Gilbreth 6")),
    # torchrun, not `deepspeed --num_gpus`: that launcher drops CUDA_VISIBLE_DEVICES (runner.py) and would use
    # other jobs' GPUs on a shared node; smoke_deepspeed.py reads torchrun's env contract (issue 17, finding 7)
    "03": ("smoke.03_deepspeed_zero1", "torchrun", "smoke_deepspeed.py",
           "DeepSpeed ZeRO-1 bf16, collective save and reload", sources.cite("Gilbreth 7")),
}


def run_smoke(which: str, out_dir: Path, *, nproc: int, backend: str, steps: int, hidden: int, batch: int,
              timeout_s: float, fused_adam: bool = True) -> tuple[Check, jobs.JobResult | None]:
    """Run Gilbreth smoke test ``which`` (``01``, ``02``, ``03``) for real and grade it.

    Returns ``(check, job)``; ``job`` is None when 03 was not started because a stale JIT build lock would
    have hung it (:func:`stale_lock_failure`).

    Every smoke test starts under ``torchrun`` or ``python``, which keep ``CUDA_VISIBLE_DEVICES``.
    ``fused_adam=False`` runs 03 on NCCL with ``configs/ds_zero1_gpu.json`` plus
    ``"torch_adam": true`` (written to ``out_dir``), for a node where :func:`check_toolchain`
    found no usable CUDA toolkit: the smoke test then measures the allocation, not the toolkit.
    The ``peak_memory`` the scripts report is the training peak, read before the checkpoint reload.

    Raises:
        ValueError: unknown ``which`` (names the accepted values).
    """
    if which not in SMOKE:
        raise ValueError(f"which={which!r}: accepted values are {', '.join(SMOKE)}")
    check_id, launcher, script, title, source = SMOKE[which]
    out = Path(out_dir) / f"smoke_{which}.json"
    args = ["--out", str(out), "--ckpt-dir", str(Path(out_dir) / "checkpoints" / which), "--steps", str(steps),
            "--hidden", str(hidden), "--batch", str(batch), "--timeout-s", str(timeout_s)]
    if which != "01":
        args += ["--backend", backend]
    if which == "03":
        config = CONFIGS / ("ds_zero1_gpu.json" if backend == "nccl" else "ds_zero1_cpu.json")
        if backend == "nccl" and not fused_adam:
            cfg = json.loads(config.read_text())
            cfg["optimizer"]["params"]["torch_adam"] = True
            config = Path(out_dir) / "ds_zero1_gpu_torch_adam.json"
            config.write_text(json.dumps(cfg, indent=2))
        args += ["--deepspeed-config", str(config)]
    if which == "03" and (locked := stale_lock_failure(check_id, title)) is not None:
        return locked, None
    # torchrun --standalone picks a free rendezvous port itself (D4)
    job = jobs.run_job(SCENARIOS / script, args, launcher=launcher, nproc=1 if which == "01" else nproc,
                       timeout_s=timeout_s * 2 + 60, stall_s=timeout_s + 30, name=f"smoke-{which}")
    ckpt_bytes = sum(f.stat().st_size for f in (Path(out_dir) / "checkpoints" / which).rglob("*") if f.is_file())
    shutil.rmtree(Path(out_dir) / "checkpoints" / which, ignore_errors=True)  # GBs on a GPU node: not report material
    if not out.exists():
        return job_failure(check_id, f"{title}: job failed", job, source), job
    check = grade_smoke(check_id, title, json.loads(out.read_text()), source)
    check.values["wall_s"] = round(job.wall_s, 2)
    check.values.setdefault("checkpoint_bytes", ckpt_bytes)
    if not job.ok and check.status == "OK":
        return job_failure(check_id, f"{title}: passed but the job exited badly", job, source), job
    return check, job


def default_nproc(environ: dict[str, str] | None = None) -> int:
    """Ranks per node for ``runbook diagnose`` when ``--nproc`` is not given.

    The CUDA GPUs this process can see (``helpers.tiers.gpu_count``; under SLURM capped by
    ``SLURM_GPUS_ON_NODE``, the allocation's share of the node); with no visible GPU,
    ``SLURM_GPUS_ON_NODE`` when set (the report then says why NCCL could not run); else 2 (a CPU
    box: two gloo ranks).  Issue 17, finding 15: a default of 2 on an 8-GPU node tested 2 GPUs.
    """
    import os

    from helpers import tiers

    environ = dict(os.environ) if environ is None else environ
    raw = environ.get("SLURM_GPUS_ON_NODE", "").strip()
    slurm = int(raw) if raw.isdigit() and int(raw) > 0 else None
    gpus = tiers.gpu_count()
    if gpus > 0:
        return min(gpus, slurm) if slurm else gpus
    return slurm or 2


def check_toolchain(backend: str, out_dir: Path, *, build: bool = True, timeout_s: float = 900.0) -> list[Check]:
    """Before smoke test 03 on GPU: find nvcc/CUDA_HOME and JIT-build FusedAdam once, outside any stall window.

    The first use of FusedAdam compiles it silently (DeepSpeed ``FusedAdamBuilder().load()``);
    inside the smoke test's stall window a slow build or a missing toolkit read as an allocation
    FAIL or a hang (issue 17, finding 6).  Here the build runs in its own process, with its log in
    ``out_dir/fused_adam_build.log``; the result is cached in ``TORCH_EXTENSIONS_DIR``.

    Args:
        backend: the check's backend; on ``gloo`` nothing is checked (the CPU config uses torch_adam).
        out_dir: where the build log goes.
        build: also build FusedAdam (else only locate the toolkit).
        timeout_s: limit for each build, seconds.

    Returns:
        ``[]`` on gloo, else ``[toolchain.fused_adam]`` (:func:`grade_toolchain`).  When the build fails because
        DeepSpeed cannot parse an arch-specific ``TORCH_CUDA_ARCH_LIST`` entry (``9.0a``, :func:`strip_arch_suffixes`),
        it is built a second time with the suffixes dropped (log ``fused_adam_build_plain_arch.log``): the record
        then says whether that is the fix.
    """
    import subprocess

    if backend != "nccl":
        return []
    import torch
    from torch.utils import cpp_extension

    cuda_home = cpp_extension.CUDA_HOME
    release = None
    if cuda_home:
        try:
            out = subprocess.run([str(Path(cuda_home) / "bin" / "nvcc"), "-V"], capture_output=True, text=True,
                                 timeout=60, check=True).stdout.split()
            release = out[out.index("release") + 1].rstrip(",")
        except (OSError, subprocess.SubprocessError, ValueError, IndexError):
            release = None
    attempt = None
    if build and release and torch.version.cuda and release.split(".")[0] == torch.version.cuda.split(".")[0]:
        log = Path(out_dir) / "fused_adam_build.log"
        arch_list = os.environ.get("TORCH_CUDA_ARCH_LIST", "")
        attempt = _build_fused_adam(log, timeout_s, None)
        attempt["arch_list"] = arch_list
        plain = strip_arch_suffixes(arch_list)
        if not attempt["ok"] and plain is not None and "invalid literal for int()" in attempt["error"]:
            # DeepSpeed's JIT builder reads each entry as numbers ("9.0a" -> int("0a")): the build with the
            # suffixes dropped proves the cause and gives the fix (deepspeedai/DeepSpeed#8619)
            retry = _build_fused_adam(log.with_name("fused_adam_build_plain_arch.log"), timeout_s, plain)
            attempt["retry"] = {**retry, "arch_list": plain}
    return [grade_toolchain(torch.version.cuda, cuda_home, release, attempt)]


def _build_fused_adam(log: Path, timeout_s: float, arch_list: str | None) -> dict[str, Any]:
    """One FusedAdam JIT build in its own process (``TORCH_CUDA_ARCH_LIST=arch_list`` when given), its output in
    ``log``: ``{"ok", "wall_s", "log", "error", "reused"}`` (``error``: the last line of its output, or the timeout;
    ``reused``: ninja found the extension already built in ``TORCH_EXTENSIONS_DIR`` ("ninja: no work to do"), so
    ``wall_s`` is a load, not a build)."""
    import subprocess
    import sys

    env = dict(os.environ, **({"TORCH_CUDA_ARCH_LIST": arch_list} if arch_list is not None else {}))
    code = "from deepspeed.ops.op_builder import FusedAdamBuilder; FusedAdamBuilder().load(verbose=True)"
    t0 = time.monotonic()
    try:
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s, env=env)
    except subprocess.TimeoutExpired:
        return {"ok": False, "wall_s": timeout_s, "log": str(log), "error": f"no result within {timeout_s} s"}
    log.write_text(proc.stdout + proc.stderr)
    lines = [x for x in (proc.stderr or proc.stdout).strip().splitlines() if x.strip()]
    return {"ok": proc.returncode == 0, "wall_s": time.monotonic() - t0, "log": str(log),
            "error": lines[-1] if proc.returncode and lines else "",
            "reused": "ninja: no work to do" in proc.stdout + proc.stderr}


def strip_arch_suffixes(arch_list: str) -> str | None:
    """``TORCH_CUDA_ARCH_LIST`` without the arch-specific / family suffixes DeepSpeed's JIT builder cannot parse
    (``"8.0;9.0a;10.0f+PTX"`` -> ``"8.0;9.0;10.0+PTX"``), or None when no entry has one.

    DeepSpeed up to at least 0.19.8 sorts the entries with ``int()`` on each dotted part
    (``op_builder/builder.py`` ``compute_capability_args``), so ``9.0a`` (Hopper's wgmma targets, which PyTorch
    accepts) raises ``ValueError: invalid literal for int() with base 10: '0a'`` before anything compiles: seen on
    this project's H200 machine; reported as https://github.com/deepspeedai/DeepSpeed/issues/7589, fixed by the open
    https://github.com/deepspeedai/DeepSpeed/pull/8619.  Separators as DeepSpeed reads them: ``;`` or whitespace.
    """
    plain: list[str] = []
    suffixed = False
    for e in re.split(r"[;\s]+", arch_list.strip()):
        m = re.fullmatch(r"(\d+\.\d+)[a-z]+(\+PTX)?", e)
        suffixed = suffixed or m is not None
        base = m.group(1) + (m.group(2) or "") if m else e
        if base and base not in plain:
            plain.append(base)
    return ";".join(plain) if suffixed else None


def gpu_checks(out_dir: Path | None = None, *, dcgm_level: int = 0,
               environ: Mapping[str, str] | None = None) -> list[Check]:
    """The GPU health of this node (issue 22): NVML, the kernel log's XIDs, ``dcgmi diag -r dcgm_level`` where installed.

    Reads with :func:`helpers.allocation.gpu_health.node_health`, grades with
    :func:`helpers.allocation.gpu_grades.grade_gpu_health`; on a node without GPU one ``gpu.health`` INFO ("no GPU on
    this node").  DCGM's own table goes to ``out_dir/dcgm_diag.txt`` (its path in the ``gpu.dcgm*`` records).

    Args:
        out_dir: the report folder (None: DCGM's text is not kept).
        dcgm_level: 0 (no DCGM), 1 (quick, seconds) or 2 (about two minutes).
        environ: the job's environment (what it asked for: ``SLURM_GPUS_ON_NODE``...); default this process's.
    """
    from helpers.allocation import gpu_grades, gpu_health

    health = gpu_health.node_health(dcgm_level=dcgm_level, environ=environ)
    checks = gpu_grades.grade_gpu_health(health)
    dcgm = health.get("dcgm") or {}
    if out_dir is not None and dcgm.get("output"):
        path = Path(out_dir) / "dcgm_diag.txt"
        path.write_text(dcgm["output"])
        for c in checks:
            if c.id.startswith("gpu.dcgm"):
                c.values["output_file"] = str(path)
    return checks


def allocation_nodes(nodes: str = "", environ: dict[str, str] | None = None) -> list[str]:
    """The nodes of this allocation: ``nodes`` (comma-separated) or, when empty, SLURM's node list.

    With ``nodes`` empty and ``SLURM_JOB_NODELIST`` set, the list is expanded by
    ``scontrol show hostnames`` (SLURM's own parser of ``gpu-[01-04]`` forms).  Returns ``[]``
    for a single-node run (nothing to check across nodes).

    Raises:
        ValueError: ``nodes`` names a node twice, or ``scontrol`` failed on the node list.
    """

    environ = dict(os.environ) if environ is None else environ
    if nodes.strip():
        names = [n.strip() for n in nodes.split(",") if n.strip()]
    elif environ.get("SLURM_JOB_NODELIST") and int(environ.get("SLURM_JOB_NUM_NODES", "1") or 1) > 1:
        proc = LocalSlurm().slurm(["scontrol", "show", "hostnames", environ["SLURM_JOB_NODELIST"]], 30)
        if proc.returncode != 0:
            raise ValueError(f"SLURM_JOB_NODELIST={environ['SLURM_JOB_NODELIST']!r}: scontrol show hostnames "
                             f"failed: {proc.stderr.strip()}")
        names = proc.stdout.split()
    else:
        return []
    if len(set(names)) != len(names):
        raise ValueError(f"nodes={nodes!r}: a node is named twice")
    return names if len(names) > 1 else []


def open_client(runner: str = "srun", lab_name: str = "", *, need_slurm: bool = False) -> SlurmClient:
    """The :class:`helpers.slurm.SlurmClient` for ``runner`` (one of :data:`helpers.slurm.RUNNERS`).

    ``srun``: :class:`~helpers.slurm.LocalSlurm`; ``lab``: the running lab ``lab_name`` (default name when empty);
    ``local``: :class:`~helpers.slurm.ThisHost`.

    Raises:
        ValueError: an unknown ``runner`` (names the accepted values); ``lab`` with no lab of that name up
            (:meth:`helpers.netlab.Lab.attach`); ``need_slurm`` and a lab without SLURM (``has no SLURM``), or ``local``.
    """
    if runner not in RUNNERS:
        raise ValueError(f"runner={runner!r}: accepted values are {', '.join(RUNNERS)}")
    if runner == "srun":
        return LocalSlurm()
    if runner == "local":
        if need_slurm:
            raise ValueError("runner='local': this check needs SLURM (srun or lab)")
        return ThisHost()
    from helpers import netlab

    attached = netlab.Lab.attach(lab_name or DEFAULT_LAB_NAME)
    if need_slurm and not attached.has_slurm:
        raise ValueError(f"lab={lab_name!r}: the lab has no SLURM (runbook lab up --slurm)")
    return attached


def run_network_preflight(nodes: Sequence[str], runner: str = "srun", env: dict[str, str] | None = None,
                          *, lab_name: str = DEFAULT_LAB_NAME, timeout_s: float = 15.0) -> list[Check]:
    """The network pre-flight of ``helpers.preflight`` across the allocation's nodes (issue: multi-node).

    Args:
        nodes: node names (first = the master); see :func:`allocation_nodes`.
        runner: how to run a command on a node (:func:`open_client`): ``srun`` (``srun -w NODE --overlap``, inside a
            SLURM allocation), ``lab`` (the running network lab ``lab_name``), ``local``.
        env: the job's variables (``MASTER_ADDR``, ``MASTER_PORT``, ``*_SOCKET_IFNAME``);
            default: this process's environment.
        lab_name: the lab to attach to when ``runner="lab"``.
        timeout_s: limit per command on a node, seconds.

    Returns:
        One ``net.*`` check per node and property (a :class:`Check` naming the node to fix in ``faulty``).

    Raises:
        ValueError: an unknown ``runner`` (names the accepted values), bad nodes or port,
        and ``runner="lab"`` with no lab named ``lab_name`` up (``Lab.attach``).
    """
    from helpers import preflight

    client = open_client(runner, lab_name)
    env = dict(os.environ) if env is None else env
    return list(preflight.run_preflight(list(nodes), client, env, timeout_s=timeout_s))

# --------------------------------------------------------------------------- host checks (check 5)

SHM_FAIL_BYTES = 64 * MIB  # Docker's default --shm-size: https://docs.docker.com/reference/cli/docker/container/run/
SHM_WARN_BYTES = 1 * GIB  # NCCL's advice --shm-size=1g (URL below)
NCCL_SHM_URL = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/troubleshooting/runtime_and_mpi_issues.html#shared-memory"
_IFNAME_ERRORS = {"nccl": "Bootstrap : no socket interface found", "gloo": "Unable to find address for: {name}"}


def _record(cid: str, title: str, status: str, values: dict[str, Any], remediation: str, source: str) -> Check:
    return Check(cid, title, status, values, "" if status == "OK" else remediation, source)


def _check_port(env: Mapping[str, str], master_port: int) -> Check:
    src = sources.cite("D4")
    raw = env.get("MASTER_PORT", "").strip()
    values: dict[str, Any] = {"port_from": "MASTER_PORT" if raw else "argument"}
    try:
        port = tcp_port(int(raw), "MASTER_PORT") if raw else master_port
    except ValueError:
        return _record("host.port", f"MASTER_PORT={raw!r} is not a port", "FAIL", {**values, "raw": raw},
                       "set MASTER_PORT to an integer in 1..65535 (torchrun --master-port)", src)
    values["port"] = port
    values["free"] = hostinfo.port_free(port)
    values["holders"] = [] if values["free"] else hostinfo.port_holders(port)
    try:
        values["ephemeral_port"] = hostinfo.free_port()
    except OSError as exc:
        values["ephemeral_port"] = None
        return _record("host.port", f"cannot bind an ephemeral port: {exc}", "FAIL", values,
                       "the ephemeral range is exhausted or loopback is down: check `ss -s` and `ip addr show lo`", src)
    if values["free"]:
        return _record("host.port", f"port {port} free; ephemeral bind OK", "OK", values, "", src)
    who = ", ".join(f"{h['name'] or '?'} (pid {h['pid']}, {h['status']})" for h in values["holders"]) or "unknown process"
    return _record("host.port", f"port {port} is busy: held by {who}", "WARN", values,
                   f"a torchrun on port {port} would die with 'Address already in use' (errno 98): give each job on "
                   "this node its own --master-port (e.g. 29600), or let torchrun pick one with "
                   "--rdzv-endpoint=localhost:0 (single node); or stop the holder", src)


def _check_shm() -> Check:
    src = f"{NCCL_SHM_URL}; Docker default 64 MiB: https://docs.docker.com/reference/cli/docker/container/run/"
    try:
        info = hostinfo.shm_info()
    except OSError as exc:
        return _record("host.shm", f"/dev/shm unavailable: {exc}", "FAIL", {"path": "/dev/shm"},
                       "NCCL's SHM transport and DataLoader workers need /dev/shm: mount a tmpfs there "
                       "(docker: --shm-size=1g --ulimit memlock=-1, or --ipc=host)", src)
    total, free = info["total_bytes"], info["free_bytes"]
    title = f"/dev/shm {total / GIB:.2f} GiB, {free / GIB:.2f} GiB free"
    fix = ("NCCL creates ~4 MiB segments per peer there and fails with 'failed to extend /dev/shm/nccl-... ' when short; "
           "restart the container with --shm-size=1g --ulimit memlock=-1 (or --ipc=host)")
    if total < SHM_FAIL_BYTES:
        return _record("host.shm", title + " (below Docker's 64 MiB default)", "FAIL", info, fix, src)
    if total < SHM_WARN_BYTES:
        return _record("host.shm", title + " (below the 1 GiB NCCL recommends)", "WARN", info, fix, src)
    if free < SHM_WARN_BYTES:
        return _record("host.shm", title + " (almost full)", "WARN", info,
                       "stale segments fill /dev/shm: list them with `ls -la /dev/shm` and remove those of dead jobs "
                       "(nccl-*, torch_*)", src)
    return _record("host.shm", title, "OK", info, "", src)


STALE_BUILD_LOCK_S = 600.0
"""A JIT build lock older than this, with no local process building in its folder, is stale.  A CPU DeepSpeed op
builds in 30-90 s on 2 cores (measured, ``make ds-ops``) and a CUDA op such as fused_adam in a few minutes
(PF-jit-lock)."""


BUSY_BUILD_LOCK_S = 60.0
"""A build lock younger than this, with no builder process, is an op being loaded right now: OK."""


def _check_build_locks(env: Mapping[str, str], roots: Sequence[str] | None = None) -> Check:
    src = sources.cite("PF-jit-lock")
    roots = hostinfo.extension_roots(env) if roots is None else list(roots)
    locks = hostinfo.build_locks(roots)
    values: dict[str, Any] = {"roots": roots, "locks": locks, "stale_after_s": STALE_BUILD_LOCK_S}
    stale = [lk for lk in locks if lk["age_s"] >= STALE_BUILD_LOCK_S and not lk["builders"]]
    if stale:
        paths = " ".join(lk["path"] for lk in stale)
        return _record("host.jit_lock", f"stale JIT build lock {stale[0]['path']} ({stale[0]['age_s'] / 60:.0f} min old, "
                       "no build running): every job that loads this op (DeepSpeed's comm/optimizer ops) waits "
                       "on it forever", "FAIL", values,
                       f"a build was killed while it held the lock; remove it: rm {paths}  (no process builds in that "
                       "folder here; on a shared filesystem make sure no other node is building it)", src)
    # a load of a built op holds the lock for a moment (ninja finds nothing to do): only a lingering one is news
    locks = [lk for lk in locks if lk["builders"] or lk["age_s"] >= BUSY_BUILD_LOCK_S]
    if locks:
        busy = locks[0]
        how = f"building now (pids {busy['builders']})" if busy["builders"] else f"{busy['age_s']:.0f} s old"
        return _record("host.jit_lock", f"JIT build lock {busy['path']} {how}: jobs that load this op wait for it",
                       "INFO", values, f"if no build finishes within {STALE_BUILD_LOCK_S / 60:.0f} min, remove it: "
                       f"rm {busy['path']}", src)
    return _record("host.jit_lock", "no JIT build lock in " + (", ".join(values["roots"]) or "the extension folders"),
                   "OK", values, "", src)


def stale_lock_failure(check_id: str, title: str) -> Check | None:
    """A FAIL for a job that would load a JIT-built op while a stale build lock waits (``host.jit_lock``), or None.

    Looks in the folder the project's jobs build in (:func:`helpers.jobs.extensions_dir`).  Lets the DeepSpeed
    smoke tests fail at once, naming the file, instead of hanging until their timeout.
    """
    lock = _check_build_locks(os.environ, roots=[str(jobs.extensions_dir())])
    if lock.status != "FAIL":
        return None
    return Check(check_id, f"{title}: not run, {lock.title}", "FAIL", lock.values, lock.remediation, lock.source,
                 evidence=[lk["path"] for lk in lock.values["locks"]])


def _check_interfaces(ifaces: list[dict[str, Any]]) -> Check:
    src = sources.cite("MN4")
    carriers = [i for i in ifaces if i["up"] and not i["loopback"] and i["ipv4"]]
    by_type: dict[str, dict[str, int]] = {}
    for iface in carriers:
        by_type.setdefault(iface["link_type"], {})[iface["name"]] = iface["mtu"]
    mixed = {t: m for t, m in by_type.items() if len(set(m.values())) > 1}
    values = {"interfaces": [{k: i[k] for k in ("name", "state", "mtu", "ipv4", "ipv6")} for i in ifaces],
              "mtu_mismatch": mixed,
              "note": "MTU must also match end to end across nodes (MN4): that comparison is the multi-node preflight's job"}
    problems, fixes = [], []
    if not carriers:
        problems.append("no UP non-loopback interface has an IPv4 address: multi-node is impossible")
        fixes.append("bring up the data-plane NIC (`ip link set DEV up`, DHCP) or ask the provider for a routable interface")
    if mixed:
        problems.append("UP interfaces of one link type differ in MTU: " + "; ".join(
            ", ".join(f"{n}={m}" for n, m in mtus.items()) for mtus in mixed.values()))
        fixes.append("make sure the NIC the job uses has the same MTU on every node and switch hop; "
                     "test with `ping -M do -s <MTU-28> <peer>` (MN4)")
    names = ", ".join(f"{i['name']}({i['mtu']})" for i in ifaces)
    if problems:
        return _record("host.interfaces", "; ".join(problems), "WARN", values, "; ".join(fixes), src)
    return _record("host.interfaces", f"interfaces (mtu): {names}", "OK", values, "", src)


def _multi_node(env: Mapping[str, str]) -> str:
    """Evidence that the job spans nodes ("" when none)."""
    def num(key: str) -> int:
        try:
            return int(env.get(key, ""))
        except ValueError:
            return 0
    for key in ("SLURM_JOB_NUM_NODES", "SLURM_NNODES"):
        if num(key) > 1:
            return f"{key}={num(key)}"
    if num("WORLD_SIZE") > num("LOCAL_WORLD_SIZE") > 0:
        return f"WORLD_SIZE={num('WORLD_SIZE')} > LOCAL_WORLD_SIZE={num('LOCAL_WORLD_SIZE')}"
    return ""


def _check_socket_ifname(env: Mapping[str, str], ifaces: list[dict[str, Any]]) -> Check:
    src = sources.cite("Gilbreth 4.2", "Gilbreth 8.12", "MN2")
    multi = _multi_node(env)
    by_name = {i["name"]: i for i in ifaces}
    usable = [i["name"] for i in ifaces if ifnames.has_address(i)]
    auto = "unset it so that NCCL/gloo auto-detect (interface names vary by node: Gilbreth guide 4.2, 8.12)"
    values: dict[str, Any] = {"multi_node": multi or None}
    statuses, problems, fixes = [], [], []
    for var, flavor in ifnames.IFNAME_VARS.items():
        if var not in env:
            continue
        raw = env[var]
        spec = ifnames.parse(raw, flavor)
        matched = ifnames.match(spec, ifaces) if len(raw) > 1 else []  # ignored value: auto-detect
        values[var] = {"value": raw, "spec": spec, "matched": matched}
        missing = [n for n in spec["names"] if n not in matched] if flavor == "gloo" else []
        status, problem = "OK", ""
        if len(raw) <= 1:
            pass  # ignored by both libraries: auto-detect
        elif not spec["supported"]:
            status, problem = "FAIL", f"{var}={raw!r} is not valid for gloo ({spec['note']})"
        elif not matched or missing:
            err = _IFNAME_ERRORS[flavor].format(name=(missing or spec["names"])[0])
            status, problem = "FAIL", f"{var}={raw!r} selects no usable interface here (expect '{err}')"
        elif all(not by_name[n]["up"] for n in matched):
            status, problem = "WARN", f"{var}={raw!r} selects only DOWN interfaces: {', '.join(matched)}"
        elif multi and all(by_name[n]["loopback"] for n in matched):
            status, problem = "WARN", f"{var}={raw!r} selects only loopback while the job is multi-node ({multi})"
        statuses.append(status)
        if problem:
            problems.append(problem)
            fixes.append(f"{var}: {auto}, or set it to interfaces present on every node (here: {', '.join(usable)})")
    status = worst_status(statuses)
    if not statuses:
        title = "NCCL_SOCKET_IFNAME and GLOO_SOCKET_IFNAME unset: auto-detect"
    else:
        title = "; ".join(problems) or "; ".join(f"{v}={values[v]['value']!r} -> {values[v]['matched'] or 'auto'}"
                                                 for v in ifnames.IFNAME_VARS if v in values)
    return _record("host.socket_ifname", title, status, values, "; ".join(fixes), src)


def host_checks(environ: Mapping[str, str] | None = None, master_port: int = DEFAULT_MASTER_PORT) -> list[Check]:
    """Measure this host (:mod:`helpers.hostinfo`) and grade it: the :class:`helpers.checks.Check` records
    ``host.port``, ``host.shm``, ``host.interfaces``, ``host.socket_ifname``, ``host.jit_lock``, in that order
    (``status`` OK/INFO/WARN/FAIL, ``remediation`` empty when OK, sizes in bytes).

    Thresholds and their sources: ``host.port`` WARN when the rendezvous port is busy (D4);
    ``host.shm`` FAIL below 64 MiB (Docker's default, already too small for NCCL on 8 GPUs), WARN
    below 1 GiB total or free (NCCL troubleshooting, Docker section: ``--shm-size=1g``,
    ``NCCL_SHM_URL``); ``host.interfaces`` WARN on no IPv4 data-plane interface or on differing
    MTUs between UP interfaces of one link type (MN4; the cross-node comparison is the multi-node
    preflight's); ``host.socket_ifname`` FAIL when a set ``NCCL_SOCKET_IFNAME``/``GLOO_SOCKET_IFNAME``
    selects no interface with an address or uses syntax gloo lacks, WARN when it selects only DOWN
    interfaces or only loopback on a multi-node job (Gilbreth guide 4.2, 8.12; MN2); ``host.jit_lock`` FAIL on a
    torch JIT build lock older than :data:`STALE_BUILD_LOCK_S` with no local builder (PF-jit-lock), INFO on a younger
    one older than :data:`BUSY_BUILD_LOCK_S` or with a build running.

    Args:
        environ: the environment to judge (``os.environ`` when None); ``MASTER_PORT`` there
            overrides ``master_port``.
        master_port: rendezvous port to test when ``MASTER_PORT`` is unset (TCP, 1..65535).

    Raises:
        ValueError: ``master_port`` is not an integer in 1..65535 (message names ``master_port``).
    """
    tcp_port(master_port, "master_port")
    env = os.environ if environ is None else environ
    records = [_check_port(env, master_port), _check_shm()]
    try:
        ifaces = hostinfo.interfaces()
    except (RuntimeError, OSError) as exc:
        for cid in ("host.interfaces", "host.socket_ifname"):
            records.append(_record(cid, f"cannot list interfaces: {exc}", "FAIL", {}, "install iproute2 (`ip`)",
                                   sources.cite("MN2", "MN4")))
        return [*records, _check_build_locks(env)]
    records += [_check_interfaces(ifaces), _check_socket_ifname(env, ifaces), _check_build_locks(env)]
    return records
