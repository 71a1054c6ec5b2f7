"""A tiny distributed job whose one rank can be made to crash or hang, for the runner's tests.

Every rank initialises the default process group (gloo or NCCL), then runs ``--steps``
steps of one all_reduce each, printing ``step N`` (the heartbeat) after each.  At step
``--at-step`` the rank ``--bad-rank`` misbehaves according to ``--mode``:

* ``ok``: nothing, everyone finishes;
* ``crash``: raises ``RuntimeError`` (the others see ``Connection closed by peer``);
* ``hang``: stops calling collectives and sleeps (alive but stuck: the others wait in
  all_reduce until their timeout);
* ``exit``: ``os._exit(3)`` without cleanup;
* ``mismatch``: calls broadcast where the others call all_reduce (a desync: on gloo it
  hangs until the timeout, PF-gloo-op-mismatch).

``--trace`` opts into :mod:`helpers.collective_trace` (per-rank collective log for the doctor); ``--debug-server PORT``
starts torch's own debug server (``torch.distributed.debug.start_debug_server``), whose per-rank worker serves the
rank's Python stacks over HTTP (the doctor reads them beside py-spy's).

Example::

    torchrun --standalone --nproc-per-node 2 helpers/scenarios/toy_job.py --mode hang --bad-rank 1
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from helpers.scenarios import _common

MODES = ("ok", "crash", "hang", "exit", "mismatch")


def main() -> int:
    """Parse arguments, run the job, return 0 on success."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=MODES, default="ok")
    parser.add_argument("--bad-rank", type=int, default=1, help="rank that misbehaves")
    parser.add_argument("--at-step", type=int, default=2, help="step at which it misbehaves")
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--step-s", type=float, default=0.0, help="seconds of sleep per step")
    parser.add_argument("--hang-s", type=float, default=3600.0, help="how long a hanging rank sleeps")
    _common.add_dist_args(parser, timeout_s=60)
    parser.add_argument("--trace", action="store_true", help="record collectives for the hang doctor")
    parser.add_argument("--debug-server", type=int, default=None, metavar="PORT",
                        help="start torch.distributed.debug's server after init (every rank's worker; rank 0's page on PORT)")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None,
                        help="appended by the deepspeed launcher; LOCAL_RANK from the env is used")
    args = parser.parse_args()
    if args.steps < 1:
        parser.error("--steps must be >= 1")

    import torch
    import torch.distributed as dist

    if args.trace:
        from helpers import collective_trace

        collective_trace.enable()
    _, device = _common.init_distributed(args.backend, args.timeout_s)
    if args.debug_server is not None:
        from torch.distributed.debug import start_debug_server

        try:
            start_debug_server(port=args.debug_server)
        except ImportError as exc:  # torch 2.13: rank 0's page imports tabulate; every rank's worker already serves
            _common.log(f"debug server: no page on rank 0 ({exc}); the per-rank workers run")
    rank = dist.get_rank()
    value = torch.ones(4, device=device)
    for step in range(1, args.steps + 1):
        if rank == args.bad_rank and step == args.at_step:
            if args.mode == "crash":
                raise RuntimeError(f"simulated failure on rank {rank} at step {step}")
            if args.mode == "hang":
                _common.log(f"step {step}: rank {rank} stops calling collectives")
                time.sleep(args.hang_s)
            if args.mode == "exit":
                os._exit(3)
            if args.mode == "mismatch":
                dist.broadcast(value, src=0)
                continue
        dist.all_reduce(value)
        time.sleep(args.step_s)
        _common.log(f"step {step}")
    _common.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
