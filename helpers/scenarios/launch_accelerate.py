"""A few DDP training steps through HF Accelerate: how many processes ran, and were they in sync? (seed D5)

Every process builds the same tiny model (seeded), trains ``--steps`` SGD steps on data that
differs per process (seeded by the launcher's ``RANK``, else by pid), and prints::

    [rank R] accelerate {"num_processes": 2, "process_index": 0, "distributed_type": "MULTI_CPU",
                         "device": "cpu", "env_RANK": "0", "env_WORLD_SIZE": "2", "pid": 123}
    [rank R] step 1
    [rank R] params {"checksum": "0x...", "sum": 0.123}

When the processes really form one data-parallel group, gradients are averaged every step and
every process ends with bit-identical parameters (same checksum).  When the launcher started
processes that Accelerate did not join into a group (``--multi_gpu`` on a CPU box without
``ACCELERATE_USE_CPU=1``), ``num_processes`` is 1 in each and the checksums differ: the
processes trained alone, silently.

``--cpu`` builds ``Accelerator(cpu=True)`` (the in-script fix); the launcher-side fix is
``ACCELERATE_USE_CPU=1`` in the environment.

Example::

    ACCELERATE_USE_CPU=1 accelerate launch --config_file configs/accelerate_ddp_cpu.yaml \\
        helpers/scenarios/launch_accelerate.py --steps 3
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys

from helpers.scenarios import _common


def main() -> int:
    """Parse arguments, train, print the state and the parameter checksum; return 0."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=3, help="optimizer steps")
    parser.add_argument("--cpu", action="store_true", help="Accelerator(cpu=True): join a gloo group on CPU")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be >= 1")

    import torch
    from accelerate import Accelerator

    accelerator = Accelerator(cpu=args.cpu)
    state = {"num_processes": accelerator.num_processes, "process_index": accelerator.process_index,
             "distributed_type": str(accelerator.distributed_type).split(".")[-1], "device": str(accelerator.device),
             "env_RANK": os.environ.get("RANK"), "env_WORLD_SIZE": os.environ.get("WORLD_SIZE"), "pid": os.getpid()}
    print("accelerate", json.dumps(state), flush=True)
    torch.manual_seed(0)  # same initial weights everywhere
    model = torch.nn.Linear(16, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    model, opt = accelerator.prepare(model, opt)
    gen = torch.Generator().manual_seed(1000 + _common.env_int("RANK", os.getpid()))  # different data per process
    for step in range(1, args.steps + 1):
        x = torch.randn(8, 16, generator=gen).to(accelerator.device)
        y = torch.randn(8, 1, generator=gen).to(accelerator.device)
        loss = torch.nn.functional.mse_loss(model(x), y)
        accelerator.backward(loss)
        opt.step()
        opt.zero_grad()
        print(f"step {step}", flush=True)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    checksum = hashlib.sha256(flat.cpu().numpy().tobytes()).hexdigest()[:16]
    print("params", json.dumps({"checksum": checksum, "sum": float(flat.sum())}), flush=True)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return 0


if __name__ == "__main__":
    sys.exit(main())
