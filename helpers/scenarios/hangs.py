"""The hangs of chapter 03 (seed D19-D23), each as a ``--case`` with a buggy and a fixed ``--mode``.

Every rank runs a toy training loop: per step an all_reduce of a "gradient", a ``step N``
line (the heartbeat), and optional ``--step-s`` of sleep.  Cases:

* ``mismatch`` (D19): at step 2 the last rank calls broadcast where the others call
  all_reduce.  ``fix``: every rank calls all_reduce.
* ``crash`` (D20): at step 2 the last rank finds a NaN loss and raises.  ``--record`` wraps
  main in torchelastic's ``@record``, so torchrun's summary shows the real traceback.
* ``stuck`` (D20): at step 2 the last rank stops (alive, e.g. a stuck data loader) and
  the others wait for the whole collective timeout.
* ``rank0_save`` (D21): at step 2 ``if rank == 0: save_checkpoint()``, and the save waits
  in a barrier for "everyone"; the others have gone on to step 3.  ``fix``: the barrier runs
  on every rank, only the file write is gated on rank 0.
* ``uneven`` (D22): each rank iterates its own slice of a dataset whose size does not divide
  evenly; the last rank gets fewer batches, finishes, and waits in the end-of-epoch barrier
  while the others wait in the next step's all_reduce.  ``fix``: ``DistributedSampler``
  (padding to equal length).
* ``set_epoch`` (D22): a 2-epoch loop over ``DistributedSampler(shuffle=True)``; rank 0 writes
  the sample order of each epoch to ``--out``.  ``bug``: no ``set_epoch``; ``fix``: ``set_epoch(e)``.
* ``slow_eval`` (D23): at step 2 rank 0 evaluates (sleeps, or computes with ``--eval-busy``) for ``--eval-s`` seconds (printing
  ``eval batch N``) while the others wait in a barrier: slow, not hung.
* ``ckpt_read`` (D23): rank 0 writes a checkpoint (slowly), the others read it.  ``bug``:
  no barrier (they read before it exists); ``fix``: atomic write (temp file, fsync, rename)
  then a barrier on every rank.

``--trace`` opts into :mod:`helpers.collective_trace` for the hang doctor.

Example::

    torchrun --standalone --nproc-per-node 4 helpers/scenarios/hangs.py --case rank0_save --timeout-s 10
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from helpers.scenarios import _common

CASES = ("mismatch", "crash", "stuck", "rank0_save", "uneven", "set_epoch", "slow_eval", "ckpt_read")


def save_checkpoint(path: str, state: dict) -> None:
    """The buggy save of D21: writes the file, then waits in a barrier "until every rank is done"."""
    import torch
    import torch.distributed as dist

    torch.save(state, path)
    dist.barrier()  # hidden collective: only the ranks that call save_checkpoint reach it


def atomic_save(state: dict, path: str) -> None:
    """Write ``state`` to ``path`` atomically (``torch.save``'s argument order): temp file, fsync, rename (D23)."""
    import torch

    tmp = f"{path}.tmp"
    with open(tmp, "wb") as fh:
        torch.save(state, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def evaluate(seconds: float, busy: bool = False) -> None:
    """Rank 0's slow evaluation: no collective, prints a heartbeat every 0.5 s; ``busy``: computes instead of sleeping."""
    for i in range(max(1, int(seconds / 0.5))):
        (_common.spin if busy else time.sleep)(0.5)
        _common.log(f"eval batch {i}")


def run(args: argparse.Namespace) -> int:  # noqa: C901 - one branch per case, kept together on purpose
    """Run ``args.case`` in ``args.mode``; return the exit status."""
    import torch
    import torch.distributed as dist

    if args.trace:
        from helpers import collective_trace

        collective_trace.enable()
    _, device = _common.init_distributed(args.backend, args.timeout_s)
    rank, world = dist.get_rank(), dist.get_world_size()
    last = world - 1
    grad = torch.ones(256, device=device)
    bug = args.mode == "bug"

    def step(i: int) -> None:
        dist.all_reduce(grad)
        time.sleep(args.step_s)
        _common.log(f"step {i}")

    if args.case == "set_epoch":
        from torch.utils.data import DistributedSampler

        sampler = DistributedSampler(list(range(32)), shuffle=True, seed=0)
        orders = []
        for epoch in range(2):
            if not bug:
                sampler.set_epoch(epoch)
            orders.append(list(sampler))
            step(epoch)
        if rank == 0:
            _common.write_json_atomic(args.out, {"orders": orders, "set_epoch": not bug})
    elif args.case == "uneven":
        from torch.utils.data import DistributedSampler

        data = list(range(args.samples))
        if bug:  # each rank takes its contiguous slice: the last one is shorter
            per = -(-len(data) // world)
            mine = data[rank * per:(rank + 1) * per]
        else:
            mine = list(DistributedSampler(data, shuffle=False))
        batches = [mine[i:i + args.batch] for i in range(0, len(mine), args.batch)]
        _common.log(f"{len(batches)} batches")
        for i, _ in enumerate(batches):
            step(i)
        dist.barrier()  # end of epoch
    elif args.case == "ckpt_read":
        path = os.path.join(args.ckpt_dir, "model.pt")
        if rank == 0:
            os.makedirs(args.ckpt_dir, exist_ok=True)
            time.sleep(args.write_delay_s)  # a large checkpoint takes time to write
            (torch.save if bug else atomic_save)({"w": grad.cpu()}, path)
            _common.log("checkpoint written")
        if not bug:
            dist.barrier()  # on every rank: nobody reads before rank 0 has renamed the file
        state = torch.load(path)
        _common.log(f"loaded checkpoint, w[0]={state['w'][0].item()}")
    else:
        for i in range(1, args.steps + 1):
            if i == 2 and bug and rank == last and args.case == "mismatch":
                dist.broadcast(grad, src=0)
                _common.log(f"step {i}")
                continue
            if i == 2 and rank == last and args.case == "crash":
                loss = float("nan")
                raise FloatingPointError(f"loss is {loss} at step {i} on rank {rank}")
            if i == 2 and rank == last and args.case == "stuck":
                _common.log("data loader stuck")
                time.sleep(3600)
            if i == 2 and args.case == "rank0_save":
                ckpt = os.path.join(args.ckpt_dir, "ckpt.pt")
                os.makedirs(args.ckpt_dir, exist_ok=True)
                if bug:
                    if rank == 0:
                        save_checkpoint(ckpt, {"w": grad.cpu()})
                else:
                    if rank == 0:
                        atomic_save({"w": grad.cpu()}, ckpt)
                    dist.barrier()
            if i == 2 and args.case == "slow_eval":
                if rank == 0:
                    evaluate(args.eval_s, args.eval_busy)
                dist.barrier()
            step(i)
    dist.destroy_process_group()
    return 0


def main() -> int:
    """Parse the arguments and run the case (optionally under torchelastic's ``@record``)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=CASES, required=True)
    parser.add_argument("--mode", choices=("bug", "fix"), default="bug")
    parser.add_argument("--steps", type=int, default=4)
    parser.add_argument("--step-s", type=float, default=0.2, help="seconds of sleep per step")
    parser.add_argument("--samples", type=int, default=10, help="dataset size (uneven)")
    parser.add_argument("--batch", type=int, default=2, help="batch size (uneven)")
    parser.add_argument("--eval-s", type=float, default=4.0, help="seconds of rank 0's evaluation (slow_eval)")
    parser.add_argument("--eval-busy", action="store_true", help="the evaluation computes instead of sleeping (slow_eval)")
    parser.add_argument("--write-delay-s", type=float, default=4.0, help="seconds before rank 0 writes (ckpt_read; 4: loaded)")
    parser.add_argument("--ckpt-dir", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "hangs-ckpt"))
    parser.add_argument("--out", default=None, help="JSON written by rank 0 (set_epoch)")
    _common.add_dist_args(parser, timeout_s=10)
    parser.add_argument("--trace", action="store_true", help="record collectives for the hang doctor")
    parser.add_argument("--record", action="store_true", help="wrap main in torchelastic's @record (D20)")
    args = parser.parse_args()
    if args.steps < 2:
        parser.error("--steps must be >= 2 (the faults happen at step 2)")
    if args.case == "set_epoch" and not args.out:
        parser.error("--out is required for --case set_epoch")
    if args.record:
        from torch.distributed.elastic.multiprocessing.errors import record

        return record(run)(args)
    return run(args)


if __name__ == "__main__":
    sys.exit(main())
