"""Hardware tiers of notebook cells: run a cell's body only where its hardware exists, and say why not.

Cells that need hardware carry a tag (``tier-gpu``, ``tier-multigpu``, ``tier-multinode``) and
open with ``if tiers.have("multigpu"):``; on a machine without it the reason is printed and
the body is skipped, never silently.
"""

from __future__ import annotations

import re

TIERS = ("cpu", "gpu", "multigpu", "multinode")
SKIP_LINE = re.compile(r"\[SKIP ([\w-]+)\] ([^\n]*)")
"""The line a skipped cell prints (``[SKIP tier-gpu] reason``, ``[SKIP lab] reason``): groups kind and reason.
:func:`have` and :func:`backend_is` print it; the course summary, the book and the reference comparison find
skipped cells with it."""


def gpu_count() -> int:
    """Number of CUDA GPUs this process can see (0 without CUDA)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def have(tier: str, *, verbose: bool = True) -> bool:
    """True when this machine provides ``tier``; otherwise print ``[SKIP tier-X] reason`` and return False.

    Tiers: ``cpu`` (always), ``gpu`` (>= 1 CUDA GPU), ``multigpu`` (>= 2 CUDA GPUs),
    ``multinode`` (a SLURM allocation of >= 2 nodes: ``SLURM_JOB_NUM_NODES``).

    Raises:
        ValueError: unknown ``tier`` (names the accepted values).
    """
    if tier not in TIERS:
        raise ValueError(f"tier={tier!r}: accepted values are {', '.join(TIERS)}")
    if tier == "cpu":
        return True
    if tier == "multinode":
        import os

        nodes = int(os.environ.get("SLURM_JOB_NUM_NODES", "1") or 1)
        ok, reason = nodes >= 2, f"needs a SLURM allocation of >= 2 nodes; SLURM_JOB_NUM_NODES={nodes}"
    else:
        need = 1 if tier == "gpu" else 2
        n = gpu_count()
        ok, reason = n >= need, f"needs >= {need} CUDA GPU(s); this machine has {n}"
    if not ok and verbose:
        print(f"[SKIP tier-{tier}] {reason}")
    return ok


def backend_is(backend: str, wanted: str, why: str) -> bool:
    """True when ``backend == wanted``; otherwise print ``[SKIP backend-<wanted>] why`` and return False.

    For a cell whose body shows one backend's behaviour (gloo's error texts, FSDP on CPU): on the
    other backend it is skipped with its reason, never silently.

    Args:
        backend: the backend the chapter chose (``gloo``/``nccl``).
        wanted: the backend the cell needs.
        why: what the cell shows that only ``wanted`` has (printed on a skip).
    """
    if backend == wanted:
        return True
    print(f"[SKIP backend-{wanted}] {why}; this run uses {backend}")
    return False


def agent_devices(backend: str, agents: int, nproc_per_agent: int) -> tuple[str, list[dict[str, str | None]]]:
    """Backend and per-agent environment for ``agents`` torchrun agents on ONE host acting as nodes.

    Each agent's ranks bind ``cuda:LOCAL_RANK``, so two agents on one host would share GPUs, and
    NCCL refuses that at init ("Duplicate GPU detected", NCCL ``init.cc``; chapter 01 D3).  With
    NCCL and at least ``agents * nproc_per_agent`` visible GPUs every agent gets its own disjoint
    ``CUDA_VISIBLE_DEVICES`` slice; with fewer, gloo (the reason is printed); any other backend
    is returned unchanged with empty environments.

    Returns:
        ``(backend, [env for agent 0, env for agent 1, ...])``.

    Raises:
        ValueError: ``agents`` or ``nproc_per_agent`` < 1.
    """
    import os

    from helpers.validate import positive_int

    positive_int(agents, "agents", 1)
    positive_int(nproc_per_agent, "nproc_per_agent", 1)
    if backend != "nccl":
        return backend, [{} for _ in range(agents)]
    need = agents * nproc_per_agent
    visible = [d.strip() for d in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if d.strip()]
    ids = visible or [str(i) for i in range(gpu_count())]
    if gpu_count() < need or len(ids) < need:
        print(f"[gloo] {agents} agents x {nproc_per_agent} ranks on one host need {need} GPUs for NCCL "
              f"(one per rank); this machine has {gpu_count()}")
        return "gloo", [{} for _ in range(agents)]
    return "nccl", [{"CUDA_VISIBLE_DEVICES": ",".join(ids[a * nproc_per_agent:(a + 1) * nproc_per_agent])}
                    for a in range(agents)]
