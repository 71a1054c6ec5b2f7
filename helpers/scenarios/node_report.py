"""What one node of the allocation has, as one JSON line: the program each node's SLURM step runs.

``runbook diagnose`` across nodes starts it once per node (``srun -w NODE -N1 -n1 ... python
helpers/scenarios/node_report.py``) and grades the lines together
(:func:`helpers.allocation.grades.grade_nodes`): versions of torch / CUDA / NCCL / driver / DeepSpeed,
the GPUs, the host checks, the interface towards ``MASTER_ADDR`` and its line rate, the host's memory-copy
bandwidth.  The record itself is :func:`helpers.allocation.across.node_report`.

Example:
    python helpers/scenarios/node_report.py --master-port 29500
"""

from __future__ import annotations

import argparse
import json
import os
import sys


def main(argv: list[str] | None = None) -> int:
    """Print :func:`helpers.allocation.across.node_report` as one JSON line; exit 0 (2 on a bad ``--master-port``)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Example: python helpers/scenarios/node_report.py --master-port 29500",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--master-port", type=int, default=os.environ.get("MASTER_PORT") or "29500",
                        help="the rendezvous port whose holder the host checks look for (default $MASTER_PORT, else 29500)")
    parser.add_argument("--dcgm-level", type=int, choices=(0, 1, 2), default=0,
                        help="also run `dcgmi diag -r N` where DCGM is installed and a GPU is present (0: no; default 0)")
    args = parser.parse_args(argv)
    if not 1 <= args.master_port <= 65535:
        parser.error(f"--master-port={args.master_port}: a TCP port, 1..65535")
    from helpers.allocation.across import node_report  # imports torch: after --help

    print(json.dumps(node_report(args.master_port, args.dcgm_level)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
