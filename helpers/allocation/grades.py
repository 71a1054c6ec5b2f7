"""Every grade of the allocation check, one node or many: measured data in, :class:`~helpers.checks.Check` out.

Pure functions and their thresholds (no SLURM, no job, no file here); :mod:`helpers.allocation.local`
and :mod:`helpers.allocation.across` measure, this module decides.

One node (the jobs of :mod:`helpers.allocation.local`):

* :func:`grade_env` / :func:`grade_contract`: the env report of every rank (versions equal, the launcher's
  contract complete, the device binding);
* :func:`grade_correctness` / :func:`grade_bandwidth`: the collectives job (exact results, busbw plateaus);
* :func:`grade_smoke`: the Gilbreth smoke tests; :func:`grade_toolchain`: the CUDA toolchain for FusedAdam.

Across nodes (:mod:`helpers.allocation.across`):

* :func:`grade_nodes`: the per-node reports (:func:`helpers.allocation.across.node_report`) -> ``node.versions``,
  ``node.gpus.<node>``, ``node.<host check>.<node>``.
* :func:`grade_job`: the job across nodes -> ``job.contract``, ``job.env_diff`` (the odd node named),
  ``job.correctness``.
* :func:`pair_matrix` / :func:`grade_pairs`: the node x node busbw matrix and its outlier (a slow node is slow
  in every pair of its own; one slow pair is the link), bisection as nccl-tests users do by hand
  (NVIDIA/nccl-tests PR 376, NVIDIA/nccl issue 349).
* :func:`inter_envelope` / :func:`grade_envelope`: "is my number normal": plateau busbw against the NIC line
  rate, the host's memory copy (CPU) or published NVLink/PCIe figures (GPU).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Mapping, Sequence
from typing import Any

from helpers import busbw, sources
from helpers.checks import Check

PAIR_SLOW_FRACTION = 0.3  # a pair below 30% of the reference (median over nodes of each node's best pair) is slow
# (bisection as in NVIDIA/nccl-tests PR 376); healthy pairs on the loaded 2-core lab varied 2.7x (0.074-0.197 GB/s)
INTER_FLOOR = 0.2  # GPU: inter-node plateau below 20% of the NIC line rate: WARN (a 10 GbE fallback on a 100G NIC is 10%)
CPU_FLOOR = 0.01  # CPU (gloo): busbw below 1% of the envelope (min of line rate and memory copy): WARN; measured healthy
# on the 2-core lab under load ~10: inter-node 4%, intra-node 7-9% of a 1.8 GB/s memory copy (docs/allocation-check.md)
SRC_PAIRS = "https://github.com/NVIDIA/nccl-tests/pull/376; https://github.com/NVIDIA/nccl/issues/349"
SRC_ENVELOPE = "https://github.com/NVIDIA/nccl-tests/issues/40; nccl-tests doc/PERFORMANCE.md"
# Published per-GPU link bandwidth, GB/s per direction, by the EXACT model name nvidia-smi / torch report (the GPU
# path: written and gated, not run here).  The form factor decides the link: SXM boards have NVLink (through NVSwitch)
# between every pair; PCIe and NVL cards have NVLink only across a bridge between some pairs, so their floor is the
# PCIe slot's figure.  A model not listed is graded INFO (no floor): matching by substring graded "A100 80GB PCIe"
# against NVLink 3 and proposed every healthy PCIe node for draining, and let unknown NVLink models pass as PCIe.
_NVL4 = "NVLink 4: 900 GB/s bidirectional per GPU"
_PCIE4 = "PCIe 4.0 x16: 32 GB/s per direction, https://pcisig.com/specifications"
_PCIE5 = "PCIe 5.0 x16: 64 GB/s per direction, https://pcisig.com/specifications"
GPU_LINKS: dict[str, tuple[str, float, str]] = {
    "NVIDIA B200": ("SXM", 900.0, "NVLink 5: 1.8 TB/s bidirectional per GPU, https://www.nvidia.com/en-us/data-center/hgx/"),
    "NVIDIA H200": ("SXM", 450.0, f"{_NVL4}, https://www.nvidia.com/en-us/data-center/h200/"),
    "NVIDIA H200 NVL": ("NVL", 64.0, f"{_PCIE5} (NVLink bridges join some pairs only)"),
    "NVIDIA H100 80GB HBM3": ("SXM", 450.0, f"{_NVL4}, https://www.nvidia.com/en-us/data-center/h100/"),
    "NVIDIA H100 NVL": ("NVL", 64.0, f"{_PCIE5} (NVLink bridges join some pairs only)"),
    "NVIDIA H100 PCIe": ("PCIe", 64.0, _PCIE5),
    "NVIDIA A100-SXM4-80GB": ("SXM", 300.0, "NVLink 3: 600 GB/s bidirectional per GPU, https://www.nvidia.com/en-us/data-center/a100/"),
    "NVIDIA A100-SXM4-40GB": ("SXM", 300.0, "NVLink 3: 600 GB/s bidirectional per GPU, https://www.nvidia.com/en-us/data-center/a100/"),
    "NVIDIA A100 80GB PCIe": ("PCIe", 32.0, _PCIE4),
    "NVIDIA A100-PCIE-40GB": ("PCIe", 32.0, _PCIE4),
    "NVIDIA L40S": ("PCIe", 32.0, _PCIE4),
    "Tesla V100-SXM2-32GB": ("SXM", 150.0, "NVLink 2: 300 GB/s bidirectional per GPU, https://www.nvidia.com/en-us/data-center/v100/"),
    "Tesla V100-SXM2-16GB": ("SXM", 150.0, "NVLink 2: 300 GB/s bidirectional per GPU, https://www.nvidia.com/en-us/data-center/v100/"),
    "Tesla V100-PCIE-32GB": ("PCIe", 16.0, "PCIe 3.0 x16: 16 GB/s per direction, https://pcisig.com/specifications"),
}


def gpu_link(name: str) -> tuple[str, float, str] | None:
    """``(form factor SXM/PCIe/NVL, GB/s per direction, source)`` for the exact model ``name``; None when not listed.

    Only surrounding whitespace is ignored: "NVIDIA A100 80GB PCIe" is not "NVIDIA A100-SXM4-80GB".
    """
    return GPU_LINKS.get(name.strip())


# --------------------------------------------------------------------------- expected busbw (issue 22)

GOOD_RATIO = 0.9
"""A plateau at 0.9 of the expected figure or more is OK (issue 22)."""
WARN_RATIO = 0.75
"""From 0.75 of the expected figure: WARN; below: FAIL."""
NIC_BUSBW_GBPS: dict[int, tuple[float, str]] = {
    100: (12.0, "https://github.com/NVIDIA/nccl-tests/issues/29 (sjeaugey: '12.2 GB/s (for a 100Gbps card) is as good "
                "as you can get. DGX-1 can get 48 GB/s because we have 4 IB adapters')"),
    200: (24.0, "https://github.com/NVIDIA/nccl-tests/issues/119 (sjeaugey: 'We usually consider 24GB/s is the peak "
                "performance per 200G NIC (12 GB/s for 100G NICs)')"),
    400: (48.0, "https://github.com/NVIDIA/nccl-tests/issues/267 (AddyLaddy: 'CX-7 NICs at NDR rate (400Gbps) should "
                "achieve up to 48-49GB/s per NIC')"),
}
"""All-reduce busbw a healthy NIC reaches across nodes, GB/s, by line rate in Gb/s (the NCCL maintainers' answers)."""
GBPS_PER_GBIT = 0.12
"""The same figures per Gb/s of line rate (12/100 = 24/200 = 48/400), for a rate not in :data:`NIC_BUSBW_GBPS`."""
NVLINK_EFFICIENCY = 370.0 / 450.0
"""NVLink busbw NCCL reaches over the line rate: 'With the protocol overhead (~20%) NCCL can get an effective NVLink
bandwidth of 370GB/s' of the H100's 450 GB/s (sjeaugey, https://github.com/NVIDIA/nccl-tests/issues/212); with NVLink
SHARP an 8-GPU all_reduce reaches ~480 GB/s busbw, above this figure, so it never WARNs there."""
SRC_NVLINK = "https://github.com/NVIDIA/nccl-tests/issues/212"
CPU_HEALTHY_FRACTION = {"inter": 0.056, "intra": 0.117}
"""gloo on CPU: the plateau busbw a healthy lab reaches, as a fraction of its envelope (inter: min(NIC line rate,
memory copy); intra: the host's memory copy): the median of 10 healthy runs of benchmarks/bench_straggler.py (2-node
SLURM lab, 2 ranks per node, 2-core machine, load 2.8-8.3): inter 0.0386-0.1083 (median 0.056), intra 0.0366-0.4183
(20 node plateaus, median 0.117).  The expected figure is that fraction x the run's own envelope."""
CPU_GOOD_RATIO = 0.25
"""gloo on CPU: OK from this ratio to the expected figure (GPU: :data:`GOOD_RATIO`).  Healthy lab runs on the shared
2-core machine spread widely around their median: the lowest healthy run was 0.69 of the median inter-node and 0.31
intra-node (the node's memory copy, measured beside other jobs, moves the most), so OK starts at 0.8 of the lowest
healthy ratio (0.25) and WARN reaches down to 0.15; a node whose CPU is capped at a twentieth drove the inter-node
ratio to 0.09-0.17 and its own intra-node ratio to 0.04-0.25 in the same benchmark."""
CPU_WARN_RATIO = 0.15
"""gloo on CPU: WARN from this ratio, FAIL below (see :data:`CPU_GOOD_RATIO`)."""
SRC_CPU_BW = "healthy SLURM-lab runs, benchmarks/bench_straggler.py (grades.CPU_HEALTHY_FRACTION, CPU_GOOD_RATIO)"
CPU_CONTENDED = 0.3
"""gloo on CPU: a plateau below :data:`CPU_GOOD_RATIO` is not graded (INFO) when, during the job, some task on the host
waited for a CPU more than this share of the wall time (Linux PSI, :func:`helpers.hostinfo.cpu_contention`).  gloo
moves bytes with CPU threads, so on a contended host it measures the scheduler, not the node.  Measured on the 2-core
machine with the check's 2 ranks: idle, 0.13 (its own ranks; ratio 1.25); beside the job tests of ``make test``,
0.33-0.88 (ratios 0.43-2.1); beside two or four busy loops, 0.70-0.86; this threshold is twice the idle figure.  A
healthy node graded beside the whole of ``make test`` once fell to 0.25 of the expected figure: a WARN that was noise.
A node capped by its cgroup's CPU quota reads as contended too (one throttled busy loop at 5 % of a CPU alone read
0.53 here, cgroup v1 CFS quota): its bandwidth is then not graded, and the straggler score, which compares the ranks
with each other, is what names it (``straggler.ranks``).  In the SLURM lab (2 nodes x 2 ranks on the 2 cores) the job across
nodes reads 0.96 even when healthy: there the envelope's CPU figures are graded only when they reach OK."""


def nic_expectation(report: Mapping[str, Any]) -> tuple[float | None, str]:
    """``(GB/s, how)``: the all_reduce busbw a healthy node of this kind reaches across nodes.

    Sum over its active RDMA ports (``report["rdma_ports"]``, :func:`helpers.hostinfo.infiniband_ports`) of
    :data:`NIC_BUSBW_GBPS` (or :data:`GBPS_PER_GBIT` x rate); without RDMA ports, the data interface's line rate x
    :data:`GBPS_PER_GBIT`.  ``(None, why)`` when no rate is known.
    """
    ports = [p for p in report.get("rdma_ports") or [] if p.get("rate_gbps")]
    if ports:
        total, parts = 0.0, []
        for p in ports:
            rate = int(round(p["rate_gbps"]))
            fig = NIC_BUSBW_GBPS.get(rate, (GBPS_PER_GBIT * rate, ""))[0]
            total += fig
            parts.append(f"{p['device']} {rate} Gb/s -> {fig:g} GB/s")
        return total, f"{len(ports)} RDMA NIC(s): " + ", ".join(parts)
    if report.get("nic_mbps"):
        rate = report["nic_mbps"] / 1000
        return GBPS_PER_GBIT * rate, f"{report.get('iface')} {rate:g} Gb/s x {GBPS_PER_GBIT} (no RDMA NIC)"
    return None, "no NIC rate known"


def nvlink_expectation(gpu_name: str) -> tuple[float | None, str]:
    """``(GB/s, source)``: intra-node busbw a healthy node of this GPU model reaches; None for models without a
    maintainer figure (PCIe/NVL cards and models not in :data:`GPU_LINKS`)."""
    link = gpu_link(gpu_name)
    if link is None or link[0] != "SXM":
        return None, f"no NCCL maintainer figure for '{gpu_name}'"
    return round(link[1] * NVLINK_EFFICIENCY, 1), f"{link[2]}; x {NVLINK_EFFICIENCY:.3f} ({SRC_NVLINK})"


def grade_expected(check_id: str, measured: float, expected: float | None, source: str, scope: str, *,
                   node: str = "", detail: str = "", cpu: bool = False, contention: float | None = None) -> Check:
    """A plateau ``measured`` (GB/s) against the ``expected`` figure: OK at :data:`GOOD_RATIO` or more, WARN from
    :data:`WARN_RATIO`, FAIL below (``cpu``: :data:`CPU_GOOD_RATIO` / :data:`CPU_WARN_RATIO`); no figure: INFO.
    ``cpu`` and ``contention`` (0-1, the share of the job's wall time a task on the host waited for a CPU) above
    :data:`CPU_CONTENDED`: a figure below the OK ratio is INFO, not graded (the host was busy), never a drain.
    ``values``: measured, expected, ratio, source, scope (``intra-node`` / ``inter-node``), the thresholds and the
    contention."""
    good, warn = (CPU_GOOD_RATIO, CPU_WARN_RATIO) if cpu else (GOOD_RATIO, WARN_RATIO)
    values = {"measured_GBps": round(measured, 4), "expected_GBps": round(expected, 4) if expected else None,
              "ratio": round(measured / expected, 3) if expected else None, "source": source, "scope": scope,
              "good_ratio": good, "warn_ratio": warn, "detail": detail,
              "cpu_contention": round(contention, 3) if contention is not None else None}
    where = f"{node}: " if node else ""
    if not expected:
        return Check(check_id, f"{where}{scope} plateau busbw {measured:.3f} GB/s; no expected figure ({source})", "INFO",
                     values, "", source, node=node)
    ratio = measured / expected
    if cpu and ratio < good and contention is not None and contention > CPU_CONTENDED:
        values["not_graded"] = (f"the host's CPUs were contended for {contention:.0%} of the job (PSI cpu some > "
                                f"{CPU_CONTENDED:.0%}): gloo's bandwidth then measures the scheduler")
        return Check(check_id, f"{where}{scope} plateau busbw {measured:.3f} GB/s = {ratio:.0%} of the expected "
                     f"{expected:.3f} GB/s, not graded: a task waited for a CPU {contention:.0%} of the time",
                     "INFO", values, "rerun the check when nothing else runs on the node (top, /proc/pressure/cpu)",
                     f"{source}; https://docs.kernel.org/accounting/psi.html", node=node)
    status = "OK" if ratio >= good else "WARN" if ratio >= warn else "FAIL"
    title = (f"{where}{scope} plateau busbw {measured:.3f} GB/s = {ratio:.0%} of the expected {expected:.3f} GB/s"
             + (f" ({detail})" if detail else ""))
    fix = ("" if status == "OK" else "far below what a healthy system of this kind reaches: check the transport NCCL "
           "picked (NCCL_DEBUG=INFO: NET/IB vs NET/Socket across nodes, P2P/NVLink vs SHM inside), NCCL_IB_HCA and the "
           "NICs' rates (ibstat), nvidia-smi topo -m, and a slow node (pairs.bandwidth, straggler.*)")
    return Check(check_id, title, status, values, fix, source, node=node)


# --------------------------------------------------------------------------- one node

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


MIN_GRADED_BYTES = 16 << 20
"""A sweep whose largest message is below 16 MiB measures latency, not bandwidth: its plateau is not graded against
the expected figure (the allocation check's default sweep goes to 256 MiB; the job across nodes' to 16 MiB)."""


def grade_bandwidth(data: dict, *, min_busbw_gbps: float = 0.0,
                    expected: Mapping[str, Any] | None = None) -> tuple[Check, list[dict]]:
    """Annotate the sweep with algbw/busbw and each op's plateau; grade the all_reduce plateau.

    Args:
        data: the collectives job's JSON (``world_size``, ``sweep`` rows).
        min_busbw_gbps: a plateau busbw (GB/s) every op must reach, set by hand (WARN below); 0: use ``expected``.
        expected: ``{"GBps", "source", "detail", "cpu_contention"}``, what a healthy node of this kind reaches inside a node
            (:func:`nvlink_expectation` on GPU; :data:`CPU_HEALTHY_FRACTION` x memory copy on CPU), graded by
            :func:`grade_expected` (GPU: OK >= 0.9, WARN from 0.75, FAIL below; CPU: :data:`CPU_GOOD_RATIO`,
            :data:`CPU_WARN_RATIO`; no figure: OK with the plateaus, as before).

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
        # INFO, not WARN: a one-GPU node is healthy with nothing to measure (make gpu-check on a one-GPU H200)
        return Check("collectives.bandwidth", "one rank: nothing crosses a link (busbw factor 0), bandwidth not graded",
                     "INFO", values, "to grade it, run with 2 or more ranks per node (GPUs per node on NCCL)",
                     "nccl-tests PERFORMANCE.md"), rows
    slow = {op: p for op, p in values["plateau_busbw_GBps"].items() if p < min_busbw_gbps}
    summary = ", ".join(f"{op} {v:.2f}" for op, v in values["plateau_busbw_GBps"].items())
    source = "https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md"
    if slow:
        return Check("collectives.bandwidth", f"plateau busbw below {min_busbw_gbps} GB/s: {slow}", "WARN", values,
                     "check the transport NCCL picked (NCCL_DEBUG=INFO: P2P/SHM inside a node, NET/IB across), "
                     "NCCL_P2P_LEVEL / NCCL_IB_DISABLE settings, and GPU topology (nvidia-smi topo -m)", source), rows
    largest = max((r["bytes"] for r in rows), default=0)
    if expected and expected.get("GBps") and "all_reduce" in values["plateau_busbw_GBps"] and largest < MIN_GRADED_BYTES:
        values["not_graded"] = f"largest message {largest} B < {MIN_GRADED_BYTES} B: the plateau is latency-bound"
    elif expected and expected.get("GBps") and "all_reduce" in values["plateau_busbw_GBps"]:
        graded = grade_expected("collectives.bandwidth", values["plateau_busbw_GBps"]["all_reduce"], expected["GBps"],
                                expected.get("source", ""), "intra-node", detail=expected.get("detail", ""),
                                cpu=data.get("backend") != "nccl", contention=expected.get("cpu_contention"))
        graded.values.update(values)
        graded.title = f"all_reduce {graded.title}; plateaus (GB/s): {summary}"
        return graded, rows
    return Check("collectives.bandwidth", f"plateau busbw (GB/s): {summary}", "OK", values, "", source), rows


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


def grade_toolchain(torch_cuda: str | None, cuda_home: str | None, nvcc_release: str | None,
                    build: dict[str, Any] | None = None) -> Check:
    """Grade the CUDA toolchain that DeepSpeed's FusedAdam (smoke test 03 on GPU) JIT-builds with.

    Args:
        torch_cuda: ``torch.version.cuda`` (``"12.8"``), ``None`` for a CPU build of torch.
        cuda_home: torch's ``cpp_extension.CUDA_HOME`` (``None``: not found).
        nvcc_release: ``"12.8"`` from ``nvcc -V``, ``None`` when nvcc could not run.
        build: the FusedAdam build attempt, ``{"ok": bool, "wall_s": float, "log": path, "error": str}``,
            or ``None`` when not attempted; ``arch_list`` (its ``TORCH_CUDA_ARCH_LIST``) and ``retry`` (the same
            fields, ``arch_list`` the list without arch-specific suffixes) when the first build tripped over them.

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
    def failed_fix(log: Any) -> str:
        return f"read {log}; check gcc/ninja and TORCH_EXTENSIONS_DIR (writable), " + avoid

    retry = (build or {}).get("retry")
    if build is not None and not build.get("ok") and retry:
        arch, plain = build.get("arch_list", ""), retry.get("arch_list", "")
        why = (f"FusedAdam JIT build failed: DeepSpeed cannot parse TORCH_CUDA_ARCH_LIST={arch!r} (an arch-specific "
               f"suffix such as 9.0a: {build.get('error', '')[:80]})")
        cite = ("https://github.com/deepspeedai/DeepSpeed/issues/7589, fix in "
                "https://github.com/deepspeedai/DeepSpeed/pull/8619")
        if retry.get("ok"):
            return Check("toolchain.fused_adam", f"{why}; with TORCH_CUDA_ARCH_LIST={plain!r} it {_built(retry)}",
                         "WARN", values,
                         f"export TORCH_CUDA_ARCH_LIST='{plain}' where DeepSpeed builds its ops (job script, module "
                         f"file), or a DeepSpeed release with the fix, " + avoid, f"{cite}; {source}")
        return Check("toolchain.fused_adam", f"{why}; with TORCH_CUDA_ARCH_LIST={plain!r} it failed too: "
                     f"{retry.get('error', '')[:120]}", "WARN", values, failed_fix(retry.get("log")),
                     f"{cite}; {source}")
    if build is not None and not build.get("ok"):
        return Check("toolchain.fused_adam", f"FusedAdam JIT build failed: {build.get('error', '')[:200]}", "WARN",
                     values, failed_fix(build.get("log")), source)
    built = f", FusedAdam {_built(build)}" if build else ""
    return Check("toolchain.fused_adam", f"nvcc {nvcc_release} matches torch CUDA {torch_cuda}{built}", "OK", values,
                 "", source)


def _built(attempt: Mapping[str, Any]) -> str:
    """How a successful FusedAdam attempt ended: ``built in N s``, or ``loaded an earlier build in N s`` when ninja had
    nothing to do (the extension was already in ``TORCH_EXTENSIONS_DIR``: the seconds are not a build time)."""
    verb = "loaded an earlier build" if attempt.get("reused") else "built"
    return f"{verb} in {attempt['wall_s']:.0f} s"


# --------------------------------------------------------------------------- across nodes

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


def grade_job(data: Mapping[str, Any], nodes: Sequence[str], nproc: int) -> list[Check]:
    """The env contract and env diff across all ranks of all nodes, and collectives correctness across nodes.

    Adds to :func:`grade_contract`: ``GROUP_RANK == SLURM_NODEID`` on every rank and
    ``WORLD_SIZE == nodes x ranks per node``.
    """
    records = data["records"]
    contract = grade_contract(records)
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
    env = grade_env(records)
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
    corr = grade_correctness({"correctness": data["correctness"], "world_size": data["world_size"]})
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
    """"Is my number normal": each busbw plateau against what a healthy system of that kind reaches (issue 22).

    Inter-node (``envelope.inter``): GPU, the slowest node's NICs (:func:`nic_expectation`: the NCCL maintainers'
    per-NIC figures x the node's RDMA NICs); CPU (gloo), :data:`CPU_HEALTHY_FRACTION` ``inter`` x
    the envelope (:func:`inter_envelope`: min of the NIC line rate and the memory copy).  Intra-node
    (``envelope.intra.<node>``): GPU SXM models, :func:`nvlink_expectation` of the exact model; PCIe/NVL cards (no
    maintainer figure found), WARN below half the slot's published rate as before; an unlisted model: INFO, never a
    drain proposal; CPU, the ``intra`` fraction x the node's memory copy, graded with :data:`CPU_GOOD_RATIO` /
    :data:`CPU_WARN_RATIO`; on CPU a node whose CPUs were contended during the sweeps (``data["cpu_contention"]``,
    the busiest node for ``envelope.inter``) is not graded below the OK ratio (:data:`CPU_CONTENDED`).
    Graded by :func:`grade_expected`; every record carries measured, expected, ratio, source and scope.
    """
    checks = []
    rates = {n: r["nic_mbps"] / 8000 for n, r in reports.items() if r.get("nic_mbps")}
    gpu_name = (data["records"][0].get("gpu") or {}).get("name") or ""
    line, _, what = inter_envelope(reports, cpu=not gpu_name)
    inter = _plateau(data["inter"])
    env = {"envelope_GBps": line, "envelope": what, "per_node_line_rate_GBps": rates,
           "per_node_memcpy_GBps": {n: r.get("memcpy_GBps") for n, r in reports.items()},
           "sources": {n: r.get("nic_source") for n, r in reports.items()}}
    if gpu_name:
        per_node = {n: nic_expectation(r) for n, r in reports.items()}
        known = {n: v for n, v in per_node.items() if v[0]}
        slow = min(known, key=lambda n: known[n][0]) if known else None
        expected, detail = (known[slow][0], f"{slow}: {known[slow][1]}") if slow else (None, "no NIC rate known")
        source = "; ".join(src for _, src in NIC_BUSBW_GBPS.values())
    else:
        frac = CPU_HEALTHY_FRACTION["inter"]
        expected = frac * line if line and frac else None
        detail = f"{frac:.3f} x {line:.3f} GB/s envelope ({what})" if expected else "no healthy fraction measured"
        source = SRC_CPU_BW
    contention = {n: c for n, c in (data.get("cpu_contention") or {}).items() if c is not None}
    rec = grade_expected("envelope.inter", inter, expected, source, "inter-node", detail=detail, cpu=not gpu_name,
                         contention=max(contention.values()) if contention else None)
    rec.values.update({"plateau_GBps": inter, "fraction": round(inter / line, 4) if line else None, **env})
    checks.append(rec)
    for node, rows in data.get("intra", {}).items():
        plat = _plateau(rows)
        rep = reports.get(node, {})
        if gpu_name and nvlink_expectation(gpu_name)[0] is None:
            link = gpu_link(gpu_name)
            if link is None:
                checks.append(Check(f"envelope.intra.{node}", f"{node}: intra-node plateau busbw {plat:.3f} GB/s; no "
                                    f"published link figure for '{gpu_name}' (not in GPU_LINKS): not graded", "INFO",
                                    {"plateau_GBps": plat, "gpu": gpu_name, "scope": "intra-node"}, "", SRC_ENVELOPE,
                                    node=node))
                continue
            # PCIe / NVL cards: no NCCL maintainer figure found; half the slot's published rate is the floor (as before)
            form, ref, src = link
            ok = plat >= 0.5 * ref
            checks.append(Check(f"envelope.intra.{node}", f"{node}: intra-node plateau busbw {plat:.3f} GB/s vs the "
                                f"{form} link's {ref} GB/s; floor {0.5 * ref:.3f}", "OK" if ok else "WARN",
                                {"plateau_GBps": plat, "measured_GBps": plat, "envelope_GBps": ref, "floor_GBps": 0.5 * ref,
                                 "source": src, "scope": "intra-node", "gpu": gpu_name},
                                "" if ok else f"{node}: check the intra-node transport (NCCL_DEBUG=INFO: P2P or SHM), "
                                "nvidia-smi topo -m", f"{form}: {src}", node=node))
            continue
        if gpu_name:
            expected, source = nvlink_expectation(gpu_name)
            detail = gpu_name
        else:
            frac = CPU_HEALTHY_FRACTION["intra"]
            mem = rep.get("memcpy_GBps")
            expected = frac * mem if mem and frac else None
            detail = f"{frac:.3f} x memory copy {mem} GB/s" if expected else "no healthy fraction measured"
            source = SRC_CPU_BW
        rec = grade_expected(f"envelope.intra.{node}", plat, expected, source, "intra-node", node=node, detail=detail,
                             cpu=not gpu_name, contention=contention.get(node))
        rec.values.update({"plateau_GBps": plat, "envelope_GBps": rep.get("memcpy_GBps") if not gpu_name else expected,
                           "gpu": gpu_name or None})
        checks.append(rec)
    return checks


# --------------------------------------------------------------------------- group tests (issue 23)

SRC_GROUPS = ("https://github.com/NVIDIA/cluster-readiness-engine/blob/main/docs/designs/055-adaptive-fault-isolation.md; "
              "https://github.com/NVIDIA/cluster-readiness-engine/blob/main/docs/designs/056-cross-boundary-probing.md")


def grade_group(results: Mapping[str, Mapping[str, Any] | None], floor_gbps: float | None) -> tuple[bool, float | None, str]:
    """One group test of the localisation from its members' results: ``(failed, busbw GB/s or None, detail)``.

    Args:
        results: ``{node: result or None}`` as ``helpers/scenarios/group_test.py`` writes them (``ok``,
            ``all_reduce_s``, ``all_to_all_s``, ``bytes``, ``ranks``, ``error``, ``stage``); None: no result.
        floor_gbps: below this busbw the group is slow (:func:`inter_envelope`'s envelope x its floor fraction);
            None: only errors fail.

    The value is the smaller of the all_reduce and the all_to_all busbw (nccl-tests definitions,
    :mod:`helpers.busbw`): a slow node slows both, a slow link between two members the all_to_all.
    """
    missing = [n for n, r in results.items() if r is None]
    if missing:
        return True, None, f"no result from {', '.join(missing)} (its worker is not running)"
    broken = [(n, r) for n, r in results.items() if r and not r.get("ok")]
    if broken:
        node, r = broken[0]
        if r.get("stage") == "small_ok":
            return True, None, f"large messages lost after small ones passed ({node}: {r.get('error', '')}; an MTU black hole?)"
        return True, None, f"{node}: {r.get('error') or 'failed'}"
    r = next(iter(results.values()))
    k, size = int(r["ranks"]), float(r["bytes"])
    ar = busbw.busbw_gbps("all_reduce", k, size, max(r["all_reduce_s"], 1e-9))
    a2a = busbw.busbw_gbps("all_to_all", k, size, max(r["all_to_all_s"], 1e-9))
    value = round(min(ar, a2a), 5)
    which = "all_to_all" if a2a < ar else "all_reduce"
    if floor_gbps is not None and value < floor_gbps:
        return True, value, f"{which} busbw {value:.4f} GB/s < floor {floor_gbps:.4f}"
    return False, value, f"busbw {value:.4f} GB/s (all_reduce {ar:.4f}, all_to_all {a2a:.4f})"


def _node_kind(history: Sequence[Mapping[str, Any]], node: str) -> tuple[str, str]:
    """``(kind, detail)`` of a named node from its failed confirmations: ``mtu``, ``coll`` (an error) or ``slow``."""
    failed = [t for t in history if t["purpose"] == "confirm" and node in t["group"] and t["failed"]]
    detail = failed[-1]["detail"] if failed else ""
    if "large messages" in detail:
        return "mtu", detail
    if failed and failed[-1]["value"] is None:
        return "coll", detail
    return "slow", detail


def grade_localisation(loc: Mapping[str, Any], floor_gbps: float | None) -> list[Check]:
    """Records from a localisation (``Localisation.to_dict()``): one FAIL per named node, one WARN per link, a summary.

    * ``localise.<slow|coll|mtu>.<node>`` FAIL, faulty ``[node]``: it failed its group tests and twice with
      known-good partners (slow: busbw below the floor; coll: its rank's collective errors; mtu: small messages
      pass, large ones are lost);
    * ``localise.link.<a>-<b>`` WARN, no node to drain: only groups holding both ends fail;
    * ``localise.summary``: OK when the first test passed; INFO when faults were named or the failure did not
      repeat; WARN when the failure stays and no node or link explains it (fabric, configuration), naming none.
    """
    history = loc["history"]
    checks = []
    for node in loc["nodes"]:
        kind, detail = _node_kind(history, node)
        words = {"slow": "slow with every known-good partner", "coll": "its collective fails with every known-good partner",
                 "mtu": "large messages to and from it are lost (small ones pass)"}[kind]
        fix = {"slow": "check its NIC rate and errors (ethtool -S, ibstat), a throttled port, a degraded GPU",
               "coll": "read its rank's error: a missing interface, a firewall, a driver fault",
               "mtu": "set one MTU on the node and its switch port (MN4)"}[kind]
        checks.append(Check(f"localise.{kind}.{node}", f"{node}: {words} ({detail})", "FAIL",
                            {"detail": detail, "floor_GBps": floor_gbps}, f"drain {node}; {fix}", SRC_GROUPS, node=node))
    for a, b in loc["links"]:
        checks.append(Check(f"localise.link.{a}-{b}", f"slow link {a}-{b}: groups holding both fail, each passes with "
                            "other nodes", "WARN", {"link": [a, b], "floor_GBps": floor_gbps},
                            f"not a node fault: report the path between {a} and {b} (cable, switch port) to the network team",
                            SRC_GROUPS))
    summary = (f"{loc['tests']} group tests in {loc['rounds']} rounds over {loc['n']} nodes "
               f"(every pair would take {loc['pairs']:,})")
    verdict = loc["verdict"]
    if verdict == "healthy":
        status, title, fix = "OK", f"one group test over all {loc['n']} nodes passed", ""
    elif verdict in ("localised", "transient"):
        named = len(loc["nodes"]) + len(loc["links"])
        status = "INFO"
        title = (f"{named} fault(s) named by {summary}" if verdict == "localised"
                 else f"the first test failed once and passed again: transient ({summary})")
        fix = ""
    else:
        status = "WARN"
        title = f"{verdict}: the allocation's group tests fail and no node or link explains it ({summary})"
        fix = ("every group fails alike: suspect the fabric or a setting common to all nodes (NCCL_*, MTU, "
               "the switch), not one node; nothing was drained")
    checks.append(Check("localise.summary", title, status, {k: v for k, v in loc.items() if k != "history"}
                        | {"floor_GBps": floor_gbps}, fix, SRC_GROUPS))
    return checks
