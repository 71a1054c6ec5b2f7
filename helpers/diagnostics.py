"""The allocation check: run each check as a real multi-process job and grade what it measured.

Each ``run_*`` function launches a job through :mod:`helpers.jobs` and returns the
:class:`~helpers.checks.Check` records plus the evidence; each ``grade_*`` function is the
pure part (measured data in, verdicts out), so it can be tested on its own.  :func:`host_checks`
grades what :mod:`helpers.hostinfo` measures on this host (check 5: port, ``/dev/shm``,
interfaces, ``*_SOCKET_IFNAME`` with the rules of :mod:`helpers.ifnames`).
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import time
from collections import defaultdict
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from helpers import busbw, hostinfo, ifnames, jobs, sources
from helpers.checks import Check, worst_status
from helpers.jobdir import JobDir
from helpers.launchers import DEFAULT_MASTER_PORT
from helpers.netlab import DEFAULT_NAME as DEFAULT_LAB_NAME
from helpers.report import GIB, MIB
from helpers.validate import tcp_port

SCENARIOS = jobs.SCENARIOS
CONFIGS = jobs.CONFIGS

# Values that differ across ranks by design (one per rank, or one per node): not a WARN.
PER_RANK_KEYS = {
    "pid", "dist_rank", "hostname", "device", "gpu.index", "gpu.uuid", "gpu.pci_bus_id",
    "contract.RANK", "contract.LOCAL_RANK", "contract.ROLE_RANK", "contract.GROUP_RANK",
    "env.TORCHELASTIC_ERROR_FILE", "env.SLURM_PROCID", "env.SLURM_LOCALID", "env.SLURM_NODEID",
    "env.SLURM_TASK_PID", "env.SLURMD_NODENAME", "env.SLURM_TOPOLOGY_ADDR", "env.SLURM_GTIDS",
    "env.SLURM_STEP_GPUS", "env.SLURM_JOB_GPUS",
}
REQUIRED_CONTRACT = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")
TORCHRUN_CONTRACT = ("LOCAL_WORLD_SIZE", "GROUP_RANK")


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

def _flatten(record: dict, prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in record.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict):
            flat.update(_flatten(value, name + "."))
        else:
            flat[name] = value
    return flat


def grade_env(records: Sequence[dict]) -> Check:
    """WARN when any value that should be the same on every rank differs (versions, NCCL_*...).

    ``CUDA_VISIBLE_DEVICES`` may differ when each rank is given exactly one distinct GPU (a
    scheduler binding one GPU per task); any other difference is a WARN.  Also WARN when a
    node's ranks may run on fewer CPUs than there are ranks (the smallest ``cpu_affinity``,
    ``len(os.sched_getaffinity(0))``, below the node's rank count): the ``srun`` without
    ``--cpus-per-task`` case (Slurm 22.05-23.02 do not pass the batch value to ``srun``),
    which makes starts slow and stall windows fire (issue 17, finding 8).
    ``values["cpu_affinity"]``: the crowded nodes, ``{node: {"ranks", "min_cpus"}}``.
    """
    flats = [_flatten(r) for r in records]
    keys = sorted(set().union(*flats) - PER_RANK_KEYS)
    differing: dict[str, dict[int, Any]] = {}
    for key in keys:
        values = {i: f.get(key) for i, f in enumerate(flats)}
        if len({json.dumps(v, sort_keys=True) for v in values.values()}) > 1:
            differing[key] = values
    cvd = differing.get("env.CUDA_VISIBLE_DEVICES")
    if cvd and all(v and "," not in str(v) for v in cvd.values()) and len(set(cvd.values())) == len(cvd):
        differing.pop("env.CUDA_VISIBLE_DEVICES")
    first = records[0] if records else {}
    values = {"ranks": len(records), "hosts": sorted({r.get("hostname") for r in records}),
              "torch": first.get("torch"), "cuda": first.get("torch_cuda"), "nccl": first.get("nccl"),
              "driver": first.get("driver"), "deepspeed": first.get("deepspeed"),
              "accelerate": first.get("accelerate"),
              "gpu": (first.get("gpu") or {}).get("name"),
              "gpu_memory_bytes": (first.get("gpu") or {}).get("total_memory_bytes"),
              "variables": sorted(k[4:] for k in keys if k.startswith("env.")),
              "differing": differing}
    crowded = _crowded_hosts(records)
    values["cpu_affinity"] = crowded
    if crowded:
        where = "; ".join(f"{host}: {v['ranks']} ranks on {v['min_cpus']} CPU(s)" for host, v in crowded.items())
        return Check("env.diff", f"fewer CPUs than ranks ({where})"
                     + (f"; {len(differing)} value(s) differ across ranks: {', '.join(differing)}" if differing else ""),
                     "WARN", values, "give every rank at least one core: under srun pass --cpus-per-task=N on the srun "
                     "line itself (Slurm 22.05-23.02 do not pass the batch value to srun; or export "
                     "SRUN_CPUS_PER_TASK), check taskset/numactl bindings"
                     + ("; and make every rank see the same settings (Gilbreth 8.12 failure mode 4)"
                        if differing else ""),
                     "Slurm 22.05-23.02 srun --cpus-per-task: https://slurm.schedmd.com/srun.html#OPT_cpus-per-task; "
                     + sources.cite("Gilbreth 8.12"))
    if differing:
        return Check("env.diff", f"{len(differing)} value(s) differ across ranks: {', '.join(differing)}", "WARN",
                     values, "make every rank see the same software and NCCL_*/TORCH_*/GLOO_* settings "
                     "(export them before the launcher; under srun re-export them in the srun command: "
                     "Gilbreth 8.12 failure mode 4)", sources.cite("Gilbreth 8.12", "D1"))
    return Check("env.diff", f"environment identical on all {len(records)} ranks "
                 f"(torch {values['torch']}, {values['gpu'] or 'no GPU'})", "OK", values, "", "D1")


def _crowded_hosts(records: Sequence[dict]) -> dict[str, dict[str, int]]:
    """Per node (hostname/GROUP_RANK): ranks and the smallest ``cpu_affinity``, where that is below the rank count."""
    by_node: dict[str, list[int]] = defaultdict(list)
    for r in records:
        if isinstance(r.get("cpu_affinity"), int):
            by_node[f"{r.get('hostname')}/node{(r.get('contract') or {}).get('GROUP_RANK')}"].append(r["cpu_affinity"])
    return {node: {"ranks": len(cpus), "min_cpus": min(cpus)} for node, cpus in by_node.items() if min(cpus) < len(cpus)}


def grade_contract(records: Sequence[dict]) -> Check:
    """Check the launcher's env contract (seed D1) and the device binding by LOCAL_RANK (seed D3)."""
    problems: list[str] = []
    warnings: list[str] = []
    contracts = [r.get("contract", {}) for r in records]
    n = len(records)
    for i, c in enumerate(contracts):
        missing = [k for k in REQUIRED_CONTRACT if not c.get(k)]
        if missing:
            problems.append(f"rank #{i} lacks {', '.join(missing)}")
        soft = [k for k in TORCHRUN_CONTRACT if not c.get(k)]
        if soft:
            warnings.append(f"rank #{i} lacks {', '.join(soft)} (set by torchrun; other launchers may omit them)")
    ranks = sorted(int(c["RANK"]) for c in contracts if str(c.get("RANK", "")).isdigit())
    if ranks != list(range(n)):
        problems.append(f"RANK values {ranks} are not 0..{n - 1}, each once")
    sizes = {c.get("WORLD_SIZE") for c in contracts} | {str(r.get("dist_world_size")) for r in records}
    if sizes != {str(n)}:
        problems.append(f"WORLD_SIZE {sorted(map(str, sizes))} disagrees with the {n} ranks that reported")
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        seen = {c.get(key) for c in contracts}
        if len(seen) > 1:
            problems.append(f"{key} differs across ranks: {sorted(map(str, seen))}")
    # A node is a launcher agent: (hostname, GROUP_RANK); two agents on one host are two nodes.
    by_host: dict[str, list[dict]] = defaultdict(list)
    for r in records:
        by_host[f"{r.get('hostname')}/node{r.get('contract', {}).get('GROUP_RANK')}"].append(r)
    for host, recs in by_host.items():
        local = sorted(int(r["contract"]["LOCAL_RANK"]) for r in recs if str(r["contract"].get("LOCAL_RANK", "")).isdigit())
        if local != list(range(len(recs))):
            problems.append(f"{host}: LOCAL_RANK values {local} are not 0..{len(recs) - 1}, each once")
        gpus = [r["gpu"] for r in recs if r.get("gpu")]
        if gpus:
            ids = [g.get("uuid") or g.get("pci_bus_id") for g in gpus]
            if len(set(ids)) < len(ids):
                problems.append(f"{host}: several ranks are bound to the same GPU {ids} (D3: bind by LOCAL_RANK, "
                                "check CUDA_VISIBLE_DEVICES)")
            for r in recs:
                if r.get("gpu") and str(r["gpu"].get("index")) != str(r["contract"].get("LOCAL_RANK")):
                    problems.append(f"{host}: rank {r['contract'].get('RANK')} uses cuda:{r['gpu'].get('index')} "
                                    f"but LOCAL_RANK={r['contract'].get('LOCAL_RANK')}")
    backend = records[0].get("backend") if records else None
    binding = ("one GPU per rank, by LOCAL_RANK" if backend == "nccl"
               else "CPU ranks (gloo): no GPU to bind, binding by LOCAL_RANK not exercised")
    values = {"per_rank": [{k: c.get(k) for k in (*REQUIRED_CONTRACT, *TORCHRUN_CONTRACT)} for c in contracts],
              "device_binding": binding, "problems": problems, "warnings": warnings}
    if problems:
        return Check("launcher.contract", f"env contract broken: {problems[0]}", "FAIL", values,
                     "launch through torchrun (or srun + torchrun), which sets RANK, LOCAL_RANK, WORLD_SIZE, "
                     "LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR/PORT for every rank; bind the GPU with "
                     "torch.cuda.set_device(int(os.environ['LOCAL_RANK']))", "D1, D3")
    if warnings:
        return Check("launcher.contract", f"env contract usable, with gaps: {warnings[0]}", "WARN", values,
                     "prefer torchrun, which sets the whole contract", "D1")
    return Check("launcher.contract", f"env contract complete on {n} ranks; device binding: {binding}", "OK",
                 values, "", "D1, D3")


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
    groups them (``nccl.bad-interface``, ``nccl.shm-full``...).

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

def grade_correctness(data: dict) -> Check:
    """FAIL when any output element of any collective differs from its known value."""
    cases = data["correctness"]
    wrong = [c for c in cases if not c["exact"] or any(c["wrong_per_rank"])]
    values = {c["op"]: {"elements": c["elements"], "wrong_per_rank": c["wrong_per_rank"]} for c in cases}
    if wrong:
        detail = "; ".join(f"{c['op']}: {sum(c['wrong_per_rank'])} wrong element(s), per rank {c['wrong_per_rank']}"
                           for c in wrong)
        values["first_mismatch_rank0"] = next((c["first_mismatch_rank0"] for c in wrong if c["first_mismatch_rank0"]), None)
        return Check("collectives.correctness", f"wrong results: {detail}", "FAIL", values,
                     "a rank or link corrupts data: rerun to see if it repeats, then exclude the node/GPU "
                     "(compare per-GPU with nccl-tests -c 1) and report it to the admins",
                     "https://github.com/NVIDIA/nccl-tests (-c check)")
    ops = ", ".join(c["op"] for c in cases)
    return Check("collectives.correctness", f"exact results on {data['world_size']} ranks for {ops}", "OK",
                 values, "", "https://github.com/NVIDIA/nccl-tests (-c check)")


def grade_bandwidth(data: dict, *, min_busbw_gbps: float = 0.0) -> tuple[Check, list[dict]]:
    """Annotate the sweep with algbw/busbw and each op's plateau; WARN below ``min_busbw_gbps``.

    Args:
        data: the collectives job's JSON (``world_size``, ``sweep`` rows).
        min_busbw_gbps: the plateau busbw (GB/s) every op must reach; 0 disables the threshold
            (there is no universal number: take it from a known-good node of the same kind).

    Returns:
        ``(check, annotated rows)``.
    """
    n = data["world_size"]
    rows = busbw.annotate(data["sweep"], n)
    plateaus = {}
    for op in dict.fromkeys(r["op"] for r in rows):
        mine = [r for r in rows if r["op"] == op]
        plateaus[op] = busbw.plateau([r["bytes"] for r in mine], [r["busbw_GBps"] for r in mine])
    values = {"world_size": n, "backend": data["backend"], "plateau_busbw_GBps":
              {op: round(p["plateau_GBps"], 3) for op, p in plateaus.items()}, "plateaus": plateaus,
              "sizes_bytes": [min(r["bytes"] for r in rows), max(r["bytes"] for r in rows)] if rows else []}
    if n < 2:
        return Check("collectives.bandwidth", "one rank: nothing crosses a link (busbw factor 0)", "WARN", values,
                     "run with 2 or more ranks per node", "nccl-tests PERFORMANCE.md"), rows
    slow = {op: p for op, p in values["plateau_busbw_GBps"].items() if p < min_busbw_gbps}
    summary = ", ".join(f"{op} {v:.2f}" for op, v in values["plateau_busbw_GBps"].items())
    source = "https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md"
    if slow:
        return Check("collectives.bandwidth", f"plateau busbw below {min_busbw_gbps} GB/s: {slow}", "WARN", values,
                     "check the transport NCCL picked (NCCL_DEBUG=INFO: P2P/SHM inside a node, NET/IB across), "
                     "NCCL_P2P_LEVEL / NCCL_IB_DISABLE settings, and GPU topology (nvidia-smi topo -m)", source), rows
    return Check("collectives.bandwidth", f"plateau busbw (GB/s): {summary}", "OK", values, "", source), rows


def run_collectives(out_dir: Path, *, nproc: int, backend: str, timeout_s: float, min_bytes: int, max_bytes: int,
                    check_elements: int = 1 << 20, corrupt_rank: int = -1,
                    min_busbw_gbps: float = 0.0) -> tuple[list[Check], list[dict], jobs.JobResult]:
    """Checks 3 and 4 in one job: exact collective results, then the busbw sweep.

    Returns:
        ``([collectives.correctness, collectives.bandwidth], annotated sweep rows, job)``.
    """
    out = Path(out_dir) / "collectives.json"
    args = ["--out", str(out), "--backend", backend, "--timeout-s", str(timeout_s), "--min-bytes", str(min_bytes),
            "--max-bytes", str(max_bytes), "--check-elements", str(check_elements), "--corrupt-rank", str(corrupt_rank)]
    job = jobs.run_job(SCENARIOS / "collectives.py", args, nproc=nproc, timeout_s=timeout_s * 4 + 60,
                       stall_s=timeout_s + 10, name="collectives", env=nccl_debug_env(backend))
    if job.hung or job.timed_out or not out.exists():
        return [job_failure("collectives.correctness", "collectives job did not finish", job,
                            sources.cite("Gilbreth 6.3"))], [], job
    data = json.loads(out.read_text())
    bandwidth, rows = grade_bandwidth(data, min_busbw_gbps=min_busbw_gbps)
    return [grade_correctness(data), bandwidth], rows, job


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


def grade_smoke(check_id: str, title: str, data: dict, source: str) -> Check:
    """OK when the smoke test's own JSON says it trained, its loss is finite and its checkpoint reloaded exactly."""
    keep = ("world_size", "backend", "device", "steps", "steps_per_s", "samples_per_s", "final_loss", "params",
            "peak_memory", "checkpoint_reload", "checkpoint_bytes", "zero_stage", "dtype")
    values = {k: data[k] for k in keep if k in data}
    headline = (f"{data.get('steps')} steps at {data.get('steps_per_s', 0):.1f} steps/s, final loss "
                f"{data.get('final_loss', float('nan')):.4f}, peak memory "
                f"{(data.get('peak_memory') or {}).get('bytes', 0) / 1e9:.2f} GB")
    if data.get("passed"):
        return Check(check_id, f"{title}: {headline}", "OK", values, "", source)
    return Check(check_id, f"{title}: FAILED ({headline}, reload exact: {data.get('checkpoint_reload')})", "FAIL",
                 values, "read the rank logs; compare with the working pattern in " + source, source)


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


def grade_toolchain(torch_cuda: str | None, cuda_home: str | None, nvcc_release: str | None,
                    build: dict[str, Any] | None = None) -> Check:
    """Grade the CUDA toolchain that DeepSpeed's FusedAdam (smoke test 03 on GPU) JIT-builds with.

    Args:
        torch_cuda: ``torch.version.cuda`` (``"12.8"``), ``None`` for a CPU build of torch.
        cuda_home: torch's ``cpp_extension.CUDA_HOME`` (``None``: not found).
        nvcc_release: ``"12.8"`` from ``nvcc -V``, ``None`` when nvcc could not run.
        build: the FusedAdam build attempt, ``{"ok": bool, "wall_s": float, "log": path, "error": str}``,
            or ``None`` when not attempted.

    Returns:
        ``toolchain.fused_adam``: OK when the build succeeded (or would be possible and was not
        tried), WARN with the fix otherwise (an allocation can be fine without a toolkit: jobs
        then need ``"torch_adam": true``).  Rule: DeepSpeed ``op_builder/builder.py``
        (``installed_cuda_version``: no CUDA_HOME -> MissingCUDAException; torch and nvcc CUDA
        major versions must match).
    """
    source = ("deepspeed op_builder/builder.py (installed_cuda_version, assert_no_cuda_mismatch); "
              + sources.cite("Gilbreth 7.4"))
    values: dict[str, Any] = {"torch_cuda": torch_cuda, "cuda_home": cuda_home, "nvcc_release": nvcc_release,
                              "build": build}
    avoid = 'or avoid the build: "torch_adam": true in the DeepSpeed config\'s optimizer params'
    if torch_cuda is None:
        return Check("toolchain.fused_adam", "torch has no CUDA: FusedAdam cannot be built", "WARN", values,
                     "install a CUDA build of torch (environment.yml), " + avoid, source)
    if cuda_home is None or nvcc_release is None:
        what = "no CUDA_HOME" if cuda_home is None else f"no runnable nvcc in {cuda_home}/bin"
        return Check("toolchain.fused_adam", f"{what}: DeepSpeed cannot JIT-build FusedAdam", "WARN", values,
                     f"load a CUDA {torch_cuda.split('.')[0]}.x toolkit (module load cuda/{torch_cuda}, or "
                     f"export CUDA_HOME=/usr/local/cuda-{torch_cuda}) so that $CUDA_HOME/bin/nvcc exists, " + avoid, source)
    if nvcc_release.split(".")[0] != torch_cuda.split(".")[0]:
        return Check("toolchain.fused_adam", f"nvcc {nvcc_release} does not match torch's CUDA {torch_cuda}", "WARN",
                     values, f"point CUDA_HOME at a CUDA {torch_cuda.split('.')[0]}.x toolkit, " + avoid, source)
    if build is not None and not build.get("ok"):
        return Check("toolchain.fused_adam", f"FusedAdam JIT build failed: {build.get('error', '')[:200]}", "WARN",
                     values, f"read {build.get('log')}; check gcc/ninja and TORCH_EXTENSIONS_DIR (writable), " + avoid,
                     source)
    built = f", FusedAdam built in {build['wall_s']:.0f} s" if build else ""
    return Check("toolchain.fused_adam", f"nvcc {nvcc_release} matches torch CUDA {torch_cuda}{built}", "OK", values,
                 "", source)


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
        timeout_s: limit for the build, seconds.

    Returns:
        ``[]`` on gloo, else ``[toolchain.fused_adam]`` (:func:`grade_toolchain`).
    """
    import subprocess
    import sys

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
        t0 = time.monotonic()
        code = "from deepspeed.ops.op_builder import FusedAdamBuilder; FusedAdamBuilder().load(verbose=True)"
        try:
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=timeout_s)
            log.write_text(proc.stdout + proc.stderr)
            lines = [x for x in (proc.stderr or proc.stdout).strip().splitlines() if x.strip()]
            attempt = {"ok": proc.returncode == 0, "wall_s": time.monotonic() - t0, "log": str(log),
                       "error": lines[-1] if proc.returncode and lines else ""}
        except subprocess.TimeoutExpired:
            attempt = {"ok": False, "wall_s": timeout_s, "log": str(log), "error": f"no result within {timeout_s} s"}
    return [grade_toolchain(torch.version.cuda, cuda_home, release, attempt)]


PREFLIGHT_RUNNERS = ("srun", "lab", "local")


def allocation_nodes(nodes: str = "", environ: dict[str, str] | None = None) -> list[str]:
    """The nodes of this allocation: ``nodes`` (comma-separated) or, when empty, SLURM's node list.

    With ``nodes`` empty and ``SLURM_JOB_NODELIST`` set, the list is expanded by
    ``scontrol show hostnames`` (SLURM's own parser of ``gpu-[01-04]`` forms).  Returns ``[]``
    for a single-node run (nothing to check across nodes).

    Raises:
        ValueError: ``nodes`` names a node twice, or ``scontrol`` failed on the node list.
    """
    import subprocess

    environ = dict(os.environ) if environ is None else environ
    if nodes.strip():
        names = [n.strip() for n in nodes.split(",") if n.strip()]
    elif environ.get("SLURM_JOB_NODELIST") and int(environ.get("SLURM_JOB_NUM_NODES", "1") or 1) > 1:
        proc = subprocess.run(["scontrol", "show", "hostnames", environ["SLURM_JOB_NODELIST"]],
                              capture_output=True, text=True, timeout=30, check=False)
        if proc.returncode != 0:
            raise ValueError(f"SLURM_JOB_NODELIST={environ['SLURM_JOB_NODELIST']!r}: scontrol show hostnames "
                             f"failed: {proc.stderr.strip()}")
        names = proc.stdout.split()
    else:
        return []
    if len(set(names)) != len(names):
        raise ValueError(f"nodes={nodes!r}: a node is named twice")
    return names if len(names) > 1 else []


def run_network_preflight(nodes: Sequence[str], runner: str = "srun", env: dict[str, str] | None = None,
                          *, lab_name: str = DEFAULT_LAB_NAME, timeout_s: float = 15.0) -> list[Check]:
    """The network pre-flight of ``helpers.preflight`` across the allocation's nodes (issue: multi-node).

    Args:
        nodes: node names (first = the master); see :func:`allocation_nodes`.
        runner: how to run a command on a node: ``srun`` (``srun -w NODE --overlap``, inside a
            SLURM allocation), ``lab`` (the running network lab ``lab_name``), ``local``.
        env: the job's variables (``MASTER_ADDR``, ``MASTER_PORT``, ``*_SOCKET_IFNAME``);
            default: this process's environment.
        lab_name: the lab to attach to when ``runner="lab"``.
        timeout_s: limit per command on a node, seconds.

    Returns:
        One ``net.*`` check per node and property (``helpers.preflight.NodeCheck``, a
        :class:`Check` naming the node to fix in ``faulty``).

    Raises:
        ValueError: an unknown ``runner`` (names the accepted values), bad nodes or port,
        and ``runner="lab"`` with no lab named ``lab_name`` up (``Lab.attach``).
    """
    from helpers import preflight

    if runner not in PREFLIGHT_RUNNERS:
        raise ValueError(f"runner={runner!r}: accepted values are {', '.join(PREFLIGHT_RUNNERS)}")
    if runner == "lab":
        from helpers import netlab

        run = netlab.Lab.attach(lab_name).runner()
    elif runner == "srun":
        run = preflight.srun_runner()
    else:
        run = preflight.local_runner
    env = dict(os.environ) if env is None else env
    return list(preflight.run_preflight(list(nodes), run, env, timeout_s=timeout_s))

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
