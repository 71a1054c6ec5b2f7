"""A DDP toy training loop that times its steps: the model for the tracing-overhead benchmark.

Each step: forward and backward of a small MLP under DDP (gradients all-reduced by DDP's
reducer), an optimizer step, and an ``all_reduce`` of the loss for logging (a Python-level
collective, which ``--trace`` records).  Rank 0 writes the median step time (seconds,
after ``--warmup`` steps) to ``--out``.

Example::

    torchrun --standalone --nproc-per-node 2 helpers/scenarios/ddp_step.py --out step.json --trace
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from helpers.scenarios import _common


def main() -> int:
    """Train ``--steps`` steps and write the median step time."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", required=True)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--warmup", type=int, default=20)
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--trace", action="store_true", help="record collectives (helpers.collective_trace)")
    parser.add_argument("--backend", choices=_common.BACKENDS, default=os.environ.get("RUNBOOK_BACKEND", "auto"))
    args = parser.parse_args()
    if args.steps <= args.warmup:
        parser.error("--steps must be larger than --warmup")

    import torch
    import torch.distributed as dist
    from torch import nn

    if args.trace:
        from helpers import collective_trace

        collective_trace.enable()
    _, device = _common.init_distributed(args.backend, 60)
    torch.manual_seed(0)
    h = args.hidden
    model = nn.Sequential(nn.Linear(h, 4 * h), nn.GELU(), nn.Linear(4 * h, h)).to(device)
    ddp = nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-4)
    x = torch.randn(args.batch, h, device=device)
    times = []
    for _ in range(args.steps):
        t0 = time.perf_counter()
        loss = nn.functional.mse_loss(ddp(x), x)
        opt.zero_grad()
        loss.backward()
        opt.step()
        logged = loss.detach().clone()
        dist.all_reduce(logged)
        _common.synchronize(device)
        times.append(time.perf_counter() - t0)
    if dist.get_rank() == 0:
        _common.write_json_atomic(args.out, {"median_step_s": statistics.median(times[args.warmup:]),
                                             "steps": args.steps, "trace": args.trace})
    del ddp, model, opt
    _common.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
