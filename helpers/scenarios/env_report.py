"""Every rank reports its environment and launcher contract; rank 0 writes them all to ``--out``.

Gathered per rank (what ``torch.utils.collect_env`` does not report): hostname, pid,
torch / CUDA / NCCL / driver versions, the GPU bound by ``LOCAL_RANK`` (name, memory,
UUID, PCI bus id), the launcher's env contract (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``,
``LOCAL_WORLD_SIZE``, ``GROUP_RANK``, ``MASTER_ADDR``/``PORT``: seed D1) and every
``NCCL_*``, ``TORCH_*``, ``TORCHELASTIC_*``, ``GLOO_*``, ``CUDA_VISIBLE_DEVICES`` and
``SLURM_*`` variable.  Records travel to rank 0 with ``all_gather_object``, so the job
also proves that the process group forms.

Example::

    torchrun --standalone --nproc-per-node 2 helpers/scenarios/env_report.py --out env.json
"""

from __future__ import annotations

import argparse
import importlib.metadata
import os
import platform
import shutil
import socket
import subprocess
import sys

from helpers.scenarios import _common

ENV_PREFIXES = ("NCCL_", "TORCH_", "TORCHELASTIC_", "GLOO_", "SLURM_", "CUDA_", "OMP_NUM_THREADS")
CONTRACT = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
            "MASTER_ADDR", "MASTER_PORT")


def _version(dist_name: str) -> str | None:
    try:
        return importlib.metadata.version(dist_name)
    except importlib.metadata.PackageNotFoundError:
        return None


def _driver_version() -> str | None:
    """NVIDIA driver version from ``nvidia-smi`` (torch does not expose it), or None."""
    exe = shutil.which("nvidia-smi")
    if not exe:
        return None
    try:
        out = subprocess.run([exe, "--query-gpu=driver_version", "--format=csv,noheader"],
                             capture_output=True, text=True, timeout=20, check=False)
    except subprocess.TimeoutExpired:
        return "nvidia-smi timed out"
    return out.stdout.strip().splitlines()[0] if out.returncode == 0 and out.stdout.strip() else None


def collect(backend: str, device: object) -> dict:
    """This rank's record (see the module docstring)."""
    import torch
    import torch.distributed as dist

    record: dict = {
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "torch_cuda": torch.version.cuda,
        "deepspeed": _version("deepspeed"),
        "accelerate": _version("accelerate"),
        "backend": backend,
        "dist_rank": dist.get_rank(),
        "dist_world_size": dist.get_world_size(),
        "cpu_affinity": len(os.sched_getaffinity(0)),
        "contract": {k: os.environ.get(k) for k in CONTRACT},
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
        "cuda_available": torch.cuda.is_available(),
        "gpu_count": torch.cuda.device_count() if torch.cuda.is_available() else 0,
        "nccl": None,
        "driver": None,
        "device": str(device),
        "gpu": None,
    }
    if torch.cuda.is_available():
        nccl = torch.cuda.nccl.version()
        record["nccl"] = ".".join(map(str, nccl)) if isinstance(nccl, tuple) else str(nccl)
        record["driver"] = _driver_version()
    if getattr(device, "type", "cpu") == "cuda":
        props = torch.cuda.get_device_properties(device)
        record["gpu"] = {
            "index": torch.cuda.current_device(),
            "name": props.name,
            "total_memory_bytes": int(props.total_memory),
            "uuid": str(getattr(props, "uuid", "")),
            "pci_bus_id": f"{getattr(props, 'pci_domain_id', 0):04x}:{getattr(props, 'pci_bus_id', 0):02x}:"
                          f"{getattr(props, 'pci_device_id', 0):02x}",
        }
    return record


def main() -> int:
    """Gather every rank's record on rank 0 and write them, ordered by rank, to ``--out``."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True, help="JSON file rank 0 writes (list of per-rank records)")
    _common.add_dist_args(parser, timeout_s=60)
    args = parser.parse_args()

    import torch.distributed as dist

    backend, device = _common.init_distributed(args.backend, args.timeout_s)
    record = collect(backend, device)
    gathered: list = [None] * dist.get_world_size()
    dist.all_gather_object(gathered, record)
    if dist.get_rank() == 0:
        _common.write_json_atomic(args.out, gathered)
        _common.log(f"wrote {len(gathered)} rank records to {args.out}")
    _common.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
