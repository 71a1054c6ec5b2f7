"""Hangs written from public issues (2 to 4 ranks), for the hang doctor on Flight Recorder evidence (issue 13).

Each case is a small training loop (an ``all_reduce`` of a "gradient" per step, a ``step N`` heartbeat) with
the pattern of one public report; :data:`CASES` gives its source, rank count and the rank(s) the doctor
must name.  None opts into :mod:`helpers.collective_trace`: the evidence is torch's Flight Recorder
(the runner sets ``TORCH_FR_BUFFER_SIZE``) and py-spy stacks.

* ``early_stop_rank0``: only rank 0 evaluates the stop criterion and leaves the loop
  (https://github.com/Lightning-AI/pytorch-lightning/issues/379).
* ``eval_gather_main``: evaluation with a metrics gather runs on the main process only
  (https://github.com/huggingface/transformers/issues/31532).
* ``nan_skip``: a rank that sees a NaN loss skips the step (``continue``), so it makes one all_reduce
  fewer and reaches the end-of-epoch barrier first (https://github.com/ai2cm/ace/pull/850).
* ``oom_skip``: a rank catches an out-of-memory error and goes on with the next batch; 3 ranks
  (https://github.com/facebookresearch/fairseq/pull/689).
* ``subgroup_mismatch``: 4 ranks in two sub-groups ([0, 1], [2, 3]) next to the default group; in the
  second sub-group rank 3 (the last rank) broadcasts while rank 2 all-reduces (with 2 ranks: one sub-group [0, 1]) (sub-group collectives, as in
  https://github.com/pytorch/pytorch/issues/130102).
* ``ddp_eval_rank0``: rank 0 runs an evaluation forward of the DDP model (buffers broadcast) while the
  others go on (https://github.com/huggingface/accelerate/issues/157).
* ``patience_local``: each rank applies early-stopping patience to its *own* validation loss; rank 1's
  runs out first and it gathers the final metrics while the others train on; 3 ranks (the fix broadcasts
  the decision: https://github.com/ultralytics/yolov5/pull/8345).
* ``save_in_main``: ``wait_for_everyone()`` inside the main-process save block; 3 ranks
  (https://github.com/bytedance/UNO/issues/71).

Example::

    torchrun --standalone --nproc-per-node 2 helpers/scenarios/issue_hangs.py --case nan_skip --timeout-s 30
"""

from __future__ import annotations

import argparse
import math
import sys
import time

from helpers.scenarios import _common

CASES: dict[str, tuple[str, int, list[int]]] = {
    "early_stop_rank0": ("https://github.com/Lightning-AI/pytorch-lightning/issues/379", 2, [0]),
    "eval_gather_main": ("https://github.com/huggingface/transformers/issues/31532", 2, [0]),
    "nan_skip": ("https://github.com/ai2cm/ace/pull/850", 2, [1]),
    "oom_skip": ("https://github.com/facebookresearch/fairseq/pull/689", 3, [2]),
    "subgroup_mismatch": ("https://github.com/pytorch/pytorch/issues/130102", 4, [3]),
    "ddp_eval_rank0": ("https://github.com/huggingface/accelerate/issues/157", 2, [0]),
    "patience_local": ("https://github.com/ultralytics/yolov5/pull/8345", 3, [1]),
    "save_in_main": ("https://github.com/bytedance/UNO/issues/71", 3, [0]),
}
"""case -> (public source, ranks, the rank(s) the doctor must name)."""


def expected(case: str, world: int) -> list[int]:
    """The rank(s) that diverge in ``case`` run with ``world`` ranks (the two-rank versions of issue 26 included).

    Raises:
        ValueError: ``case`` is not in :data:`CASES`, or ``world`` < 2.
    """
    if case not in CASES:
        raise ValueError(f"case={case!r}: expected one of {sorted(CASES)}")
    if world < 2:
        raise ValueError(f"world={world}: a hang needs at least 2 ranks")
    last = {"nan_skip", "oom_skip", "subgroup_mismatch"}
    return [world - 1] if case in last else ([1] if case == "patience_local" else [0])


def evaluate(grad: object) -> float:
    """Rank 0's evaluation: gathers every rank's metric (an all_gather the other ranks never join)."""
    import torch
    import torch.distributed as dist

    metrics = [torch.zeros(1, device=grad.device) for _ in range(dist.get_world_size())]  # type: ignore[attr-defined]
    dist.all_gather(metrics, torch.ones(1, device=grad.device))  # type: ignore[attr-defined]
    return float(sum(m.item() for m in metrics))


def run(args: argparse.Namespace) -> int:  # noqa: C901 - one branch per case, kept together on purpose
    """Run ``args.case``; return the exit status."""
    import torch
    import torch.distributed as dist

    _, device = _common.init_distributed("gloo", args.timeout_s)  # gloo: these hangs are the CPU tier's
    rank, world = dist.get_rank(), dist.get_world_size()
    grad = torch.ones(64, device=device)
    case = args.case

    def step(i: int, group: object = None) -> None:
        dist.all_reduce(grad, group=group)
        time.sleep(args.step_s)
        _common.log(f"step {i}")

    if case == "subgroup_mismatch":
        groups = [dist.new_group(list(range(g, min(g + 2, world)))) for g in range(0, world, 2)]  # pairs; every rank creates each
        mine = groups[rank // 2]
        for i in range(1, args.steps + 1):
            step(i)
            if i == 2 and rank == world - 1:
                dist.broadcast(grad, src=rank // 2 * 2, group=mine)
            else:
                dist.all_reduce(grad, group=mine)
    elif case == "ddp_eval_rank0":
        from torch.nn.parallel import DistributedDataParallel as DDP

        model = DDP(torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.BatchNorm1d(8)))
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        for i in range(1, args.steps + 1):
            model(torch.randn(4, 8, device=device)).sum().backward()
            opt.step()
            _common.log(f"step {i}")
            time.sleep(args.step_s)
            if i == 2 and rank == 0:
                model(torch.randn(4, 8, device=device))  # evaluation forward through DDP: broadcasts BatchNorm buffers
    else:
        stop, best, patience = False, math.inf, 0
        for i in range(1, args.steps + 1):
            if case == "early_stop_rank0" and rank == 0:
                stop = i >= 3  # the validation metric stopped improving
            if stop:
                break
            if case == "eval_gather_main" and i == 2 and rank == 0:
                evaluate(grad)
            loss = float("nan") if case == "nan_skip" and rank == world - 1 and i == 2 else 1.0
            if not math.isfinite(loss):
                continue  # skip the bad batch: no backward, no all_reduce on this rank
            if case == "oom_skip" and rank == world - 1 and i == 2:
                try:
                    raise torch.cuda.OutOfMemoryError("CUDA out of memory (simulated)")
                except torch.cuda.OutOfMemoryError:
                    continue  # go on with the next batch
            step(i)
            if case == "patience_local":
                val = 1.0 / i if rank != 1 else 1.0 + i  # rank 1's own shard of the validation set gets worse
                patience = 0 if val < best else patience + 1
                best = min(best, val)
                if patience >= 2:
                    break
            if case == "save_in_main" and i == 2 and rank == 0:
                torch.save({"w": grad}, f"{args.ckpt}")
                dist.barrier()  # wait_for_everyone() inside the main-process block
        if case == "patience_local":
            evaluate(grad)  # final metrics of every rank
        dist.barrier()  # end of training
    dist.destroy_process_group()
    return 0


def main() -> int:
    """Parse the arguments and run the case."""
    import os

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--case", choices=sorted(CASES), required=True)
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("--step-s", type=float, default=0.2, help="seconds of sleep per step")
    parser.add_argument("--ckpt", default=os.path.join(os.environ.get("TMPDIR", "/tmp"), "issue-hangs.pt"))
    _common.add_dist_args(parser, timeout_s=30, backend=None)
    return run(parser.parse_args())


if __name__ == "__main__":
    sys.exit(main())
