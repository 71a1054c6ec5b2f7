"""gilbreth-hpc-guide.md 7.5 issue 3 and zero_to_fp32: DeepSpeed checkpoints are collectives.

``--mode bug``: after ``--steps`` training steps only rank 0 calls
``engine.save_checkpoint(dir, tag)`` (the ``if rank == 0:`` habit from ``torch.save``).
``save_checkpoint`` starts with ``dist.barrier()`` and validates the tag with two
``all_reduce`` calls, so rank 0 waits for peers that never come.  What the other ranks do
next decides the symptom (``--after``):

* ``idle``: they sleep (an eval or a data wait without collectives): rank 0 hangs in the
  barrier until the collective timeout;
* ``barrier``: they reach their own final ``dist.barrier()``, which pairs with rank 0's first
  barrier; they then tear down while rank 0 is in the next collective, which fails
  (``Connection closed by peer`` on gloo);
* ``exit``: they return without any collective and the process ends.

``--mode fix``: every rank calls ``save_checkpoint``; rank 0 then rebuilds a full fp32 state
dict from the ZeRO shards with ``deepspeed.utils.zero_to_fp32.get_fp32_state_dict_from_zero_checkpoint``
(the API behind the ``zero_to_fp32.py`` script) and compares it with the trained engine's own
fp32 master weights (``deepspeed.utils.safe_get_full_fp32_param``, called on every rank) and
bf16 module weights (gathered with ``deepspeed.zero.GatheredParameters`` under ZeRO-3).  It
also lists where DeepSpeed wrote ``zero_to_fp32.py`` and runs that script offline
(``python <save_dir>/zero_to_fp32.py <save_dir> <out_dir> --tag <tag>``), comparing its output
with the in-process recovery.

Rank 0 writes ``--out`` in fix mode.  Exit status 0 when the recovered weights match.

Example::

    deepspeed --num_gpus 2 helpers/scenarios/ds_checkpoint.py --mode fix --ckpt-dir build/ckpt05 --out build/05_ckpt.json
    deepspeed --num_gpus 2 helpers/scenarios/ds_checkpoint.py --mode bug --after idle --ckpt-dir build/ckpt05 --timeout-s 10
"""

from __future__ import annotations

import argparse
import glob
import os
import subprocess
import sys
import time
from typing import Any

from helpers.scenarios import _common, smoke_deepspeed


def build_parser() -> argparse.ArgumentParser:
    """Command-line parser (module docstring = what it reproduces)."""
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mode", choices=("bug", "fix"), required=True, help="bug: save on rank 0 only; fix: on all ranks")
    p.add_argument("--after", choices=("idle", "barrier", "exit"), default="idle",
                   help="bug mode: what the other ranks do while rank 0 saves (default idle)")
    p.add_argument("--stage", type=int, choices=(1, 2, 3), default=3, help="ZeRO stage (default 3)")
    p.add_argument("--hidden", type=int, default=128, help="MLP hidden size (default 128)")
    p.add_argument("--batch", type=int, default=8, help="micro batch per rank (default 8)")
    p.add_argument("--steps", type=int, default=3, help="training steps before the save (default 3)")
    p.add_argument("--ckpt-dir", required=True, help="checkpoint directory (save_dir)")
    p.add_argument("--out", default=None, help="JSON result path (fix mode, rank 0)")
    _common.add_dist_args(p, timeout_s=30)
    p.add_argument("--local_rank", "--local-rank", dest="local_rank", type=int, default=None,
                   help="appended by the deepspeed launcher; LOCAL_RANK from the environment is preferred")
    return p


def stage_config(stage: int, batch: int) -> dict[str, Any]:
    """``configs/ds_zero<stage>_cpu.json`` with the micro batch set to ``batch`` (ZeRO-3: nothing kept whole)."""
    _, values = smoke_deepspeed.load_config(os.path.join(smoke_deepspeed.REPO_ROOT, "configs",
                                                         f"ds_zero{stage}_cpu.json"), batch)
    values = {k: v for k, v in values.items() if k != "_comment"}
    if stage == 3:
        values["zero_optimization"] = dict(values["zero_optimization"], stage3_param_persistence_threshold=0)
    return values


def main(argv: list[str] | None = None) -> int:
    """Train, then save (rank 0 only in bug mode; all ranks and verify in fix mode)."""
    args = build_parser().parse_args(argv)
    _common.log(f"mode {args.mode}: importing deepspeed")  # output before the ~5 s import (stall windows)
    deepspeed, backend = smoke_deepspeed.init_deepspeed(args.backend, args.timeout_s)
    import torch
    import torch.distributed as dist
    from deepspeed.utils import safe_get_full_fp32_param
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = smoke_deepspeed.make_model(args.hidden)
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=stage_config(args.stage, args.batch))
    dtype = next(engine.module.parameters()).dtype
    gen = torch.Generator().manual_seed(1 + rank)
    for step in range(1, args.steps + 1):
        x = torch.randn(args.batch, args.hidden, generator=gen).to(dtype=dtype, device=engine.device)
        y = torch.randn(args.batch, args.hidden, generator=gen).to(dtype=dtype, device=engine.device)
        loss = torch.nn.functional.mse_loss(engine(x), y)
        engine.backward(loss)
        engine.step()
        _common.log(f"step {step} loss {loss.item():.4f}")
    tag = f"step{args.steps}"

    if args.mode == "bug":
        if rank == 0:
            _common.log(f"rank 0 alone calls save_checkpoint({args.ckpt_dir!r}, tag={tag!r})")
            engine.save_checkpoint(args.ckpt_dir, tag=tag)
            _common.log("save_checkpoint returned")
        elif args.after == "idle":
            _common.log("skipping the save; idle (an eval, a data wait: no collective)")
            time.sleep(10 * args.timeout_s)
        elif args.after == "barrier":
            _common.log("skipping the save; final barrier, then exit")
            dist.barrier()
        else:
            _common.log("skipping the save; exit")
            return 0
        dist.destroy_process_group()
        return 0

    engine.save_checkpoint(args.ckpt_dir, tag=tag)  # every rank: it is a collective
    names = [n for n, _ in engine.module.named_parameters()]
    master = {n: safe_get_full_fp32_param(p).detach().cpu().clone() for n, p in engine.module.named_parameters()}
    if args.stage == 3:
        with deepspeed.zero.GatheredParameters(list(engine.module.parameters()), modifier_rank=None):
            bf16 = {n: p.detach().cpu().clone() for n, p in engine.module.named_parameters()}
    else:
        bf16 = {n: p.detach().cpu().clone() for n, p in engine.module.named_parameters()}
    ok = True
    if rank == 0:
        recovered = get_fp32_state_dict_from_zero_checkpoint(args.ckpt_dir, tag=tag)
        compare = {}
        for n in names:
            r = recovered[n]
            compare[n] = {
                "shape": list(r.shape), "dtype": str(r.dtype),
                "equal_fp32_master": bool(torch.equal(r, master[n])),
                "max_abs_diff_vs_master": float((r - master[n]).abs().max()),
                "equal_bf16_module_after_cast": bool(torch.equal(r.to(bf16[n].dtype), bf16[n])),
                "max_abs_diff_vs_bf16_module": float((r - bf16[n].float()).abs().max()),
            }
        ok = set(recovered) == set(names) and all(c["equal_fp32_master"] for c in compare.values())
        files = sorted(os.path.relpath(os.path.join(root, f), args.ckpt_dir)
                       for root, _, fs in os.walk(args.ckpt_dir) for f in fs)
        n_recovered = int(sum(v.numel() for v in recovered.values()))
        script = os.path.join(args.ckpt_dir, "zero_to_fp32.py")
        offline: dict[str, Any] = {"script": script, "ran": False}
        if os.path.isfile(script):
            out_dir = os.path.join(args.ckpt_dir, "fp32_offline")
            proc = subprocess.run([sys.executable, script, args.ckpt_dir, out_dir, "--tag", tag],
                                  capture_output=True, text=True, timeout=10 * args.timeout_s)
            files_out = sorted(glob.glob(os.path.join(out_dir, "*")))
            offline.update(ran=True, returncode=proc.returncode, files=[os.path.basename(f) for f in files_out])
            bins = [f for f in files_out if f.endswith(".bin")]
            if proc.returncode == 0 and bins:
                sd = torch.load(bins[0], map_location="cpu", weights_only=True)
                offline["equal_to_in_process"] = set(sd) == set(recovered) and all(
                    torch.equal(sd[n], recovered[n]) for n in recovered)
            else:
                offline["stderr_tail"] = proc.stderr[-2000:]
            ok = ok and offline.get("equal_to_in_process", False)
        _common.log(f"recovered {len(recovered)} tensors, {n_recovered} parameters; match fp32 master: {ok}")
        if args.out:
            _common.write_json_atomic(args.out, {
                "stage": args.stage, "world_size": world, "tag": tag, "files": files,
                "zero_to_fp32_in_save_dir": os.path.isfile(os.path.join(args.ckpt_dir, "zero_to_fp32.py")),
                "zero_to_fp32_in_tag_dir": os.path.isfile(os.path.join(args.ckpt_dir, tag, "zero_to_fp32.py")),
                "recovered_params": n_recovered, "model_params": sum(p.ds_numel if hasattr(p, "ds_numel")
                                                                     else p.numel() for p in engine.module.parameters()),
                "compare": compare, "offline_script": offline, "match": ok,
                "versions": {"torch": torch.__version__, "deepspeed": deepspeed.__version__}})
    # on the engine's device: an NCCL group has no CPU backend (Backend.backend_capability["nccl"] == ["cuda"])
    flag = torch.tensor([int(ok)], device=engine.device)
    dist.broadcast(flag, src=0)
    _common.finish()
    return 0 if flag.item() else 1


if __name__ == "__main__":
    sys.exit(main())
