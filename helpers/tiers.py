"""Hardware tiers of notebook cells: run a cell's body only where its hardware exists, and say why not.

Cells that need hardware carry a tag (``tier-gpu``, ``tier-multigpu``, ``tier-multinode``) and
open with ``if tiers.have("multigpu"):``; on a machine without it the reason is printed and
the body is skipped, never silently.
"""

from __future__ import annotations

TIERS = ("cpu", "gpu", "multigpu", "multinode")


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
