"""Where and when an executed chapter ran: the record its runner stamps into the notebook's metadata.

Whoever executes a chapter with papermill (the notebook tests, ``helpers.course``, ``runbook diagnose``)
calls :func:`stamp` on the executed copy; the book (``helpers.book``) prints it at the top of the
chapter's page.  papermill records only times and parameters (``metadata.papermill``); this adds the
machine: host, hardware tier, GPUs, torch/CUDA/Python versions, and what ran it.

The record (``metadata["runbook"]["ran"]``)::

    {"runner": "pytest tests/notebooks/test_02_ddp.py", "host": "vm-1", "tier": "cpu", "gpus": 0,
     "gpu_name": "", "slurm_nodes": 1, "torch": "2.13.0+cpu", "cuda": "", "python": "3.11.2",
     "cpus": 2, "platform": "Linux-6.1.0-x86_64", "started": "2026-11-25T16:07:20+00:00",
     "seconds": 106.3}

``tier`` is the largest of ``helpers.tiers.TIERS`` this machine provides (``multinode`` inside a SLURM
allocation of >= 2 nodes, ``multigpu`` with >= 2 CUDA GPUs, ``gpu`` with one, else ``cpu``): the cells of a
higher tier printed ``[SKIP tier-...]`` and did not run.
"""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Any

KEY = "runbook"
"""The notebook-metadata key under which the record is kept (``metadata.runbook.ran``)."""


def machine() -> dict[str, Any]:
    """This machine as the record describes it: host, tier, gpus, gpu_name, slurm_nodes, torch, cuda, python, cpus, platform.

    Imports torch (to count CUDA GPUs and read its version).
    """
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    nodes = int(os.environ.get("SLURM_JOB_NUM_NODES", "1") or 1)
    tier = "multinode" if nodes >= 2 else "multigpu" if gpus >= 2 else "gpu" if gpus == 1 else "cpu"
    return {"host": platform.node(), "tier": tier, "gpus": gpus,
            "gpu_name": torch.cuda.get_device_name(0) if gpus else "", "slurm_nodes": nodes,
            "torch": torch.__version__, "cuda": torch.version.cuda or "", "python": platform.python_version(),
            "cpus": os.cpu_count() or 0, "platform": platform.platform(terse=True)}


def stamp(executed: str | Path, runner: str) -> dict[str, Any]:
    """Add the record of this run to the executed notebook ``executed`` (written atomically) and return it.

    Args:
        executed: the executed copy papermill wrote (its ``metadata.papermill`` gives start time and duration).
        runner: what executed it, as a person would rerun it (``pytest tests/notebooks/test_02_ddp.py``).

    Raises:
        FileNotFoundError: ``executed`` does not exist.
    """
    import nbformat

    from helpers.report import write_atomic

    path = Path(executed)
    nb = nbformat.read(path, as_version=4)
    pm = nb.metadata.get("papermill", {})
    record = {"runner": runner, **machine(), "started": pm.get("start_time") or "",
              "seconds": round(float(pm.get("duration") or 0.0), 1)}
    nb.metadata.setdefault(KEY, {})["ran"] = record
    write_atomic(path, nbformat.writes(nb))
    return record


def read(nb: Any) -> dict[str, Any]:
    """The record stamped into the notebook node ``nb`` (``{}`` when it has none: run by hand, not stamped)."""
    return dict(nb.metadata.get(KEY, {}).get("ran", {}))
