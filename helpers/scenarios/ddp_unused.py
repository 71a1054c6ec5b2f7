"""D8: a DDP model with a branch that the loss never uses, and the three ways out.

The model is a trunk with two heads, ``head_a`` and ``head_b``; ``forward`` returns both.

* ``--mode bug`` (variant ``bug``): the loss uses ``head_a`` only, and DDP runs with its defaults
  (``find_unused_parameters=False``).  Step 1 completes; step 2 raises ``RuntimeError:
  Expected to have finished reduction in the prior iteration before starting a new one``
  on every rank (``head_b``'s gradient hooks never fired, so the reduction of step 1 never
  finished).
* ``--mode fix``: trains ``--steps`` steps of each fix in ``--variants``, interleaved in
  rounds of ``--chunk`` steps so that noise from other processes hits all of them alike,
  and times every step (forward, backward with DDP's all-reduce, optimizer step):

  - ``all_outputs``: both heads in the loss, DDP defaults (the fixed model: the baseline);
  - ``find_unused``: ``head_a`` only, ``find_unused_parameters=True``;
  - ``static_graph``: ``head_b`` not even called in forward (a branch skipped), ``static_graph=True``;
  - ``static_graph_returned``: ``head_b`` called and returned but not in the loss,
    ``static_graph=True``: fails at its third step with ``Expected to have finished reduction ...
    your training graph has changed`` (pytorch/pytorch#97030, #79171);
  - ``bug`` is accepted as a variant too (it fails at its second step).

  Rank 0 writes ``{"median_ms": {variant: ...}, "steps": {...}, ...}`` to ``--out``
  (median over the steps after each variant's first ``--warmup``).

Every step prints ``step N`` (1-based) before its forward and ``step N done ... grad_checksum=X``
after its optimizer step, X being the sum of this rank's gradients (equal on every rank when
DDP averaged them; in the bug's step 1 they differ: nothing was reduced).
Source: seed D8; https://pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html

Example::

    torchrun --standalone --nproc-per-node 2 helpers/scenarios/ddp_unused.py --mode bug
    torchrun --standalone --nproc-per-node 2 helpers/scenarios/ddp_unused.py --mode fix --out d8.json
    torchrun --standalone --nproc-per-node 2 helpers/scenarios/ddp_unused.py --mode bug --variants static_graph_returned --steps 4
"""

from __future__ import annotations

import argparse
import gc
import statistics
import sys
import time

from helpers.scenarios import _common

# variant -> (head_b called in forward, head_b in the loss, DDP keyword arguments)
VARIANTS = {
    "bug": (True, False, {}),
    "all_outputs": (True, True, {}),
    "find_unused": (True, False, {"find_unused_parameters": True}),
    "static_graph": (False, False, {"static_graph": True}),
    "static_graph_returned": (True, False, {"static_graph": True}),
}


def build_model(hidden: int, call_b: bool = True):
    """Return the two-head model: forward returns ``(logits_a, logits_b)``, ``logits_b`` None unless ``call_b``."""
    from torch import nn

    class TwoHeads(nn.Module):
        """A trunk and two classification heads; forward returns both heads' logits."""

        def __init__(self) -> None:
            super().__init__()
            self.trunk = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU())
            self.head_a = nn.Linear(hidden, 10)
            self.head_b = nn.Linear(hidden, 10)

        def forward(self, x):
            h = self.trunk(x)
            return self.head_a(h), (self.head_b(h) if call_b else None)

    return TwoHeads()


def wrap(variant: str, hidden: int, device):
    """Build the model for ``variant`` and wrap it in DDP with that variant's flags.

    Returns:
        ``(ddp_model, head_b_in_loss)``.

    Raises:
        ValueError: unknown ``variant`` (names the accepted values).
    """
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    if variant not in VARIANTS:
        raise ValueError(f"variant={variant!r}: accepted values are {', '.join(VARIANTS)}")
    torch.manual_seed(0)  # the same initial weights on every rank
    call_b, in_loss, kwargs = VARIANTS[variant]
    model = build_model(hidden, call_b).to(device)
    return DDP(model, **kwargs), in_loss


def main() -> int:
    """Run ``--mode bug`` or ``--mode fix`` (see the module docstring)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--mode", choices=("bug", "fix"), default="bug")
    parser.add_argument("--variants", default=None,
                        help=f"comma-separated, from: {', '.join(VARIANTS)} "
                             "(default: bug for --mode bug, all_outputs,find_unused,static_graph for --mode fix)")
    parser.add_argument("--steps", type=int, default=60, help="steps per variant")
    parser.add_argument("--warmup", type=int, default=10, help="first steps of each variant left out of the median")
    parser.add_argument("--chunk", type=int, default=10, help="steps per variant before switching to the next")
    parser.add_argument("--hidden", type=int, default=256)
    parser.add_argument("--batch", type=int, default=32)
    parser.add_argument("--out", default=None, help="JSON written by rank 0 (--mode fix)")
    _common.add_dist_args(parser, timeout_s=30)
    args = parser.parse_args()
    default = "bug" if args.mode == "bug" else "all_outputs,find_unused,static_graph"
    variants = [v.strip() for v in (args.variants or default).split(",") if v.strip()]
    bad = [v for v in variants if v not in VARIANTS]
    if bad:
        parser.error(f"--variants: unknown {bad}; accepted values are {', '.join(VARIANTS)}")
    if args.steps < 1 or args.chunk < 1:
        parser.error("--steps and --chunk must be >= 1")
    if args.mode == "fix" and (args.steps <= args.warmup or not args.out):
        parser.error("--mode fix needs --out and --steps larger than --warmup")

    import torch
    import torch.distributed as dist
    import torch.nn.functional as F

    _, device = _common.init_distributed(args.backend, args.timeout_s)
    rank = dist.get_rank()
    torch.manual_seed(100 + rank)  # each rank its own data shard
    x = torch.randn(args.batch, 64, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)
    models = {v: wrap(v, args.hidden, device) for v in variants}
    opts = {v: torch.optim.SGD(m.parameters(), lr=0.01) for v, (m, _) in models.items()}
    times: dict[str, list[float]] = {v: [] for v in variants}
    total = args.steps
    step = 0
    while any(len(t) < total for t in times.values()):
        for v in variants:
            ddp, both = models[v]
            for _ in range(min(args.chunk, total - len(times[v]))):
                step += 1
                _common.log(f"step {step} ({v})")
                t0 = time.perf_counter()
                logits_a, logits_b = ddp(x)
                loss = F.cross_entropy(logits_a, y)
                if both:
                    loss = loss + 0.5 * F.cross_entropy(logits_b, y)
                opts[v].zero_grad()
                loss.backward()
                opts[v].step()
                _common.synchronize(device)
                times[v].append(time.perf_counter() - t0)
                # sum of this rank's gradients: equal on every rank only if DDP averaged them
                checksum = sum(float(p.grad.double().sum()) for p in ddp.parameters() if p.grad is not None)
                _common.log(f"step {step} done ({v}) grad_checksum={checksum:.9g}")
    if rank == 0 and args.out:
        medians = {v: 1000 * statistics.median(t[args.warmup:]) for v, t in times.items()}
        _common.write_json_atomic(args.out, {
            "median_ms": medians, "steps": {v: len(t) for v, t in times.items()}, "warmup": args.warmup,
            "world_size": dist.get_world_size(), "batch": args.batch, "hidden": args.hidden})
    # Free DDP (its reducer holds gloo work and tensors) while the interpreter is fully alive: gloo
    # threads that touch Python objects during interpreter shutdown abort a rank with "terminate
    # called without an active exception" (pytorch/pytorch#179291); we saw it ~1 in 50 DDP jobs.
    del models, opts, ddp
    gc.collect()
    _common.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
