"""MN5/MN6: torchrun restarts the group, not the state; and an elastic group changes the batch under you.

A small DDP regression model (a dropout layer: torch RNG; a random input scale: Python
``random``; target noise: NumPy) trained with Adam and a warmup-then-step-decay LambdaLR on a
96-sample synthetic dataset split by ``DistributedSampler``.  After every completed step
each rank prints one line::

    step N restart=R world_size=W epoch=E pos=P global_batch=G samples_per_rank=S lr=... lr_rule=... loss=... ids=3-17-...

(``restart`` is ``TORCHELASTIC_RESTART_COUNT``; ``lr`` the LR the step used; ``lr_rule`` what the
linear scaling rule gives for this global batch; ``ids`` the sorted sample ids of the whole global
batch; every rank prints the line, with its own loss).

* **MN5, the bug** (no ``--ckpt``): with ``--crash-at K`` rank ``--crash-rank`` raises at the
  start of step K on the first launch only; ``torchrun --max-restarts=1`` restarts the group
  and ``main()`` trains again from step 0.
* **MN5, the fix** (``--ckpt PATH --ckpt-every M``): rank 0 writes an atomic checkpoint
  (``helpers.checkpoint.save_checkpoint``) every M steps holding the model, the optimizer, the
  scheduler, every rank's RNG states (gathered to rank 0) and the data position (sampler epoch
  + batches consumed in it); every rank loads it at start and resumes at the saved step.
  ``--omit rng,scheduler,...`` leaves pieces out of the restore to show what each one is for.
* **The restart's own race** (``--probe-store``, ``--late-rank``): on a restart, rank 0 reports
  which gloo address keys of the previous launch the store still holds, then every rank exits;
  ``--late-rank R`` makes rank R join the group ``--late-s`` seconds late on a restart.
* **MN6 under torchrun** (``--nnodes=1:2``, ``--step-sleep``): the world size can change between
  launches.  ``--scale live`` (default) shards the data over the live world size and sets the
  LR from the live global batch (``micro x world_size``, linear rule) when the optimizer is
  built (a restored optimizer and scheduler then bring back the LR of the world that saved
  them); ``--scale pinned --max-world N`` shards over N virtual ranks, each rank accumulating
  ``N / world_size`` of them, so the global batch, the LR and the samples of every step do not
  depend on how many ranks are alive.

Rank 0 writes the final model state to ``--out`` (atomically).
Source: seed MN5 (https://docs.pytorch.org/tutorials/beginner/ddp_series_fault_tolerance.html),
MN6 (https://horovod.readthedocs.io/en/stable/elastic_include.html).

Example::

    torchrun --standalone --nproc-per-node 2 --max-restarts 1 helpers/scenarios/elastic_train.py --steps 24 --crash-at 19
    torchrun --standalone --nproc-per-node 2 --max-restarts 1 helpers/scenarios/elastic_train.py --steps 24 \\
        --crash-at 19 --ckpt build/ch07/run.ckpt --ckpt-every 8 --out build/ch07/final.pt
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import sys
import time

from helpers import checkpoint
from helpers.scenarios import _common

DATASET = 96
FEATURES = 8
BASE_BATCH = 8  # the global batch the base LR is tuned for (linear scaling rule)


def lr_factor(step: int, warmup: int = 3, decay_every: int = 6, gamma: float = 0.5) -> float:
    """The schedule's multiplier at ``step``: linear warmup over ``warmup`` steps, then x``gamma`` every ``decay_every``."""
    return min(1.0, (step + 1) / warmup) * gamma ** (step // decay_every)


def make_model():
    """The model, seeded identically on every rank (DDP also broadcasts rank 0's weights)."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 32), nn.Tanh(), nn.Dropout(0.2), nn.Linear(32, 1))


def make_data():
    """The fixed synthetic dataset ``(x, y)`` of ``DATASET`` rows (identical on every rank)."""
    import torch

    g = torch.Generator().manual_seed(1234)
    x = torch.randn(DATASET, FEATURES, generator=g)
    return x, x.sum(dim=1, keepdim=True).sin() + 0.1 * torch.randn(DATASET, 1, generator=g)


class Shards:
    """``n_shards`` ``DistributedSampler`` shards of the dataset; any rank can read any shard's batches."""

    def __init__(self, n_shards: int, micro: int, seed: int = 0) -> None:
        from torch.utils.data import DistributedSampler

        self.samplers = [DistributedSampler(range(DATASET), num_replicas=n_shards, rank=v, shuffle=True, seed=seed,
                                            drop_last=True) for v in range(n_shards)]
        self.micro = micro
        self.steps_per_epoch = len(self.samplers[0]) // micro
        self._epoch: int | None = None
        self._indices: list[list[int]] = []

    def batch(self, shard: int, epoch: int, pos: int) -> list[int]:
        """Sample ids of micro-batch ``pos`` of ``shard`` in ``epoch`` (``set_epoch`` = the shuffle of that epoch)."""
        if epoch != self._epoch:
            for s in self.samplers:
                s.set_epoch(epoch)
            self._indices = [list(s) for s in self.samplers]
            self._epoch = epoch
        return self._indices[shard][pos * self.micro:(pos + 1) * self.micro]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Parse and check the command line (``--help`` needs no torch)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=24, help="optimizer steps to train")
    p.add_argument("--micro", type=int, default=4, help="samples per rank per micro-batch")
    p.add_argument("--lr", type=float, default=0.01, help="LR for a global batch of %d (scaled linearly)" % BASE_BATCH)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--crash-at", type=int, default=None, help="step at which --crash-rank fails (first launch only)")
    p.add_argument("--crash-rank", type=int, default=1)
    p.add_argument("--crash-how", choices=("raise", "exit"), default="raise",
                   help="raise RuntimeError, or os._exit(1) (no traceback, no cleanup)")
    p.add_argument("--ckpt", default=None, help="checkpoint file (none: no checkpoint, the MN5 bug)")
    p.add_argument("--ckpt-every", type=int, default=1, help="rank 0 saves after every this many steps")
    p.add_argument("--omit", default="", help="checkpoint pieces NOT restored: comma list of "
                   "model,optimizer,scheduler,rng,epoch,position")
    p.add_argument("--scale", choices=("live", "pinned"), default="live",
                   help="shard/scale by the live world size, or pin them to --max-world")
    p.add_argument("--max-world", type=int, default=None, help="world size the batch is pinned to (--scale pinned)")
    p.add_argument("--late-rank", type=int, default=None,
                   help="on a restart (TORCHELASTIC_RESTART_COUNT >= 1), this rank waits --late-s before joining")
    p.add_argument("--late-s", type=float, default=5.0, help="seconds --late-rank waits (a slow node)")
    p.add_argument("--keep-history", action="store_true",
                   help="also keep every checkpoint as <ckpt>.step<N> (a hard link)")
    p.add_argument("--probe-store", action="store_true",
                   help="on a restart, rank 0 reports the previous launch's gloo keys in the store; all ranks exit 0")
    p.add_argument("--step-sleep", type=float, default=0.0, help="seconds of sleep after each step (elastic runs)")
    p.add_argument("--sleep-below-world", type=int, default=None,
                   help="sleep only while the live world_size is below this (the late node's window to join)")
    p.add_argument("--out", default=None, help="final model state (rank 0, atomic)")
    _common.add_dist_args(p, timeout_s=30, backend="gloo")
    args = p.parse_args(argv)
    for name in ("steps", "micro", "ckpt_every"):
        if getattr(args, name) < 1:
            p.error(f"--{name.replace('_', '-')} must be >= 1")
    if args.crash_at is not None and not 0 <= args.crash_at < args.steps:
        p.error(f"--crash-at must be in [0, --steps={args.steps})")
    if args.scale == "pinned" and not args.max_world:
        p.error("--scale pinned needs --max-world")
    if args.max_world is not None and args.max_world < 1:
        p.error("--max-world must be >= 1")
    try:
        checkpoint.parse_omit(args.omit)
    except ValueError as exc:
        p.error(str(exc))
    return args


STALE_KEYS = ("default_pg/0//cpu//0/0", "default_pg/0//cpu//0/1")
"""Store keys where gloo's ``connectFullMesh`` publishes the addresses of ranks 0 and 1 of the default group (torch 2.13)."""


def probe_store(log) -> None:
    """Before joining the group, report which gloo address keys the launcher's store already holds.

    With the rendezvous store shared with the workers (torch >= 2.5's default,
    ``TORCHELASTIC_USE_AGENT_STORE=True``), a restarted group reuses the previous launch's
    store, so the keys the dead ranks wrote are still there.
    """
    from datetime import timedelta

    import torch.distributed as dist

    if os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True":
        log("probe: TORCHELASTIC_USE_AGENT_STORE is not True: this launch gets a fresh store from rank 0")
        return
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timedelta(seconds=10))
    present = [k for k in STALE_KEYS if store.check([k])]
    log(f"probe: before any rank of this launch joined, the store at {os.environ['MASTER_ADDR']}:"
        f"{os.environ['MASTER_PORT']} already holds gloo address keys {present}")


def run(args: argparse.Namespace) -> int:
    """The training loop (see the module docstring)."""
    import random

    import numpy as np
    import torch
    import torch.distributed as dist
    from torch import nn
    from torch.nn.parallel import DistributedDataParallel as DDP

    omit = checkpoint.parse_omit(args.omit)
    restart = _common.env_int("TORCHELASTIC_RESTART_COUNT", 0)
    env_rank = _common.env_int("RANK", -1)
    _common.log(f"launch restart_count={restart} world_size={os.environ.get('WORLD_SIZE')} "
                f"group_rank={os.environ.get('GROUP_RANK')} local_rank={os.environ.get('LOCAL_RANK')} pid={os.getpid()} "
                f"master={os.environ.get('MASTER_ADDR')}:{os.environ.get('MASTER_PORT')} "
                f"agent_store={os.environ.get('TORCHELASTIC_USE_AGENT_STORE')}")
    if args.probe_store and restart >= 1:
        if env_rank == 0:
            probe_store(_common.log)
        _common.log("probe: exiting without joining the group")
        return 0
    if restart >= 1 and args.late_rank is not None and env_rank == args.late_rank:
        _common.log(f"restart {restart}: joining the process group {args.late_s:g} s late (a slow node)")
        time.sleep(args.late_s)
    _, device = _common.init_distributed(args.backend, args.timeout_s)
    rank, world = dist.get_rank(), dist.get_world_size()
    n_shards = args.max_world if args.scale == "pinned" else world
    if n_shards % world:
        raise ValueError(f"max_world={n_shards}: must be a multiple of the live world_size={world}")
    mine = list(range(rank, n_shards, world))  # the (virtual) shards this rank trains on
    global_batch = args.micro * n_shards
    data = Shards(n_shards, args.micro, args.seed)
    x_all, y_all = make_data()
    config = {"micro": args.micro, "lr": args.lr, "seed": args.seed, "scale": args.scale, "max_world": args.max_world or 0}

    model = make_model().to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr * global_batch / BASE_BATCH)  # linear scaling rule
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_factor)
    torch.manual_seed(args.seed + 1 + rank)  # per-rank streams: dropout masks,
    random.seed(args.seed + 1 + rank)        # the input scale,
    np.random.seed(args.seed + 1 + rank)     # the target noise
    step, epoch, pos = 0, 0, 0
    state = checkpoint.load_checkpoint(args.ckpt, missing_ok=True) if args.ckpt else None
    if state is not None:
        if state["config"] != config:
            raise ValueError(f"checkpoint {args.ckpt}: saved with config {state['config']}, this launch has {config}; "
                             "resume only the identical configuration")
        step = int(state["step"])
        if "model" not in omit:
            model.load_state_dict(state["model"])
        if "optimizer" not in omit:
            opt.load_state_dict(state["optimizer"])
        if "scheduler" not in omit:
            sched.load_state_dict(state["scheduler"])
        if "rng" not in omit and rank < len(state["rng"]):
            checkpoint.set_rng_state(state["rng"][rank])
        if "epoch" not in omit:
            epoch = int(state["epoch"])
        if "position" not in omit:
            pos = int(state["pos"])
        _common.log(f"resumed from {os.path.basename(args.ckpt)} at step {step} (epoch {state['epoch']}, pos "
                    f"{state['pos']}, saved by world_size {state['world_size']}); restored: "
                    f"{','.join(p for p in checkpoint.PIECES if p not in omit)}; left out: {','.join(omit) or 'nothing'}")
        if pos >= data.steps_per_epoch:  # saved under a sharding with longer epochs (a smaller world)
            _common.log(f"position {pos} is past the end of an epoch ({data.steps_per_epoch} steps at "
                        f"{n_shards} shards): starting epoch {epoch + 1}")
            epoch, pos = epoch + 1, 0
    else:
        _common.log(f"fresh start at step 0 ({'no checkpoint yet' if args.ckpt else 'no checkpoint configured'})")
    net = DDP(model, device_ids=[device.index] if device.type == "cuda" else None)

    while step < args.steps:
        if args.crash_at == step and restart == 0 and rank == args.crash_rank:
            _common.log(f"injected crash at step {step} (TORCHELASTIC_RESTART_COUNT={restart})")
            if args.crash_how == "exit":
                os._exit(1)
            raise RuntimeError(f"injected crash at step {step} on rank {rank}")
        model.train()
        total = 0.0
        for i, shard in enumerate(mine):  # more than one shard only with --scale pinned below --max-world
            ids = torch.tensor(data.batch(shard, epoch, pos))
            x = x_all[ids] * random.uniform(0.9, 1.1)
            y = y_all[ids] + torch.from_numpy(np.random.normal(0.0, 0.01, size=(len(ids), 1))).float()
            with net.no_sync() if i < len(mine) - 1 else contextlib.nullcontext():
                loss = nn.functional.mse_loss(net(x.to(device)), y.to(device)) / len(mine)
                loss.backward()
            total += float(loss.detach())
        lr = opt.param_groups[0]["lr"]
        opt.step()
        opt.zero_grad(set_to_none=True)
        sched.step()
        all_ids = sorted(i for v in range(n_shards) for i in data.batch(v, epoch, pos))
        done = f"step {step} restart={restart} world_size={world} epoch={epoch} pos={pos} global_batch={global_batch} "
        pos += 1
        if pos >= data.steps_per_epoch:
            epoch, pos = epoch + 1, 0
        step += 1
        rule = args.lr * global_batch / BASE_BATCH * lr_factor(step - 1)
        # The line goes out before the checkpoint: an agent that stops the workers between the two (a membership
        # change) then leaves a line for a step that is redone after the restart (the reader keeps the last attempt),
        # never a checkpointed step without its line.
        print(done + f"samples_per_rank={args.micro * len(mine)} lr={lr:.6g} lr_rule={rule:.6g} loss={total:.6f} "
              f"ids={'-'.join(map(str, all_ids))}", flush=True)
        if args.ckpt and step % args.ckpt_every == 0:
            save(args, dist, rank, world, model, opt, sched, step, epoch, pos, config)
        if args.step_sleep and (args.sleep_below_world is None or world < args.sleep_below_world):
            time.sleep(args.step_sleep)

    if args.out and rank == 0:
        checkpoint.save_checkpoint(args.out, {"model": model.state_dict(), "step": step})
    _common.log(f"done: {step} steps, final checksum {sum(float(p.detach().double().sum()) for p in model.parameters()):.10f}")
    del net
    gc.collect()
    _common.finish()
    return 0


def save(args, dist, rank, world, model, opt, sched, step, epoch, pos, config) -> None:
    """Gather every rank's RNG states to rank 0, which writes the checkpoint atomically (and a step-stamped link)."""
    states = [None] * world
    dist.all_gather_object(states, checkpoint.rng_state())
    if rank == 0:
        checkpoint.save_checkpoint(args.ckpt, {
            "step": step, "epoch": epoch, "pos": pos, "world_size": world, "config": config,
            "model": model.state_dict(), "optimizer": opt.state_dict(), "scheduler": sched.state_dict(), "rng": states,
        })
        if args.keep_history:
            stamped = f"{args.ckpt}.step{step}"
            if os.path.exists(stamped):
                os.unlink(stamped)
            os.link(args.ckpt, stamped)


def main(argv: list[str] | None = None) -> int:
    """Parse the command line and train (see the module docstring); return the exit status."""
    return run(parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())
