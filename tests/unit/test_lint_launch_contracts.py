"""Rules written from the launchers' and argparse's contracts before the sixteenth blind round: a required option the
launch line does not pass, a launcher option written after the script, set_epoch called once."""

from __future__ import annotations

import textwrap

from helpers.lint import lint_texts

SCRIPT = """
import argparse
import torch.distributed as dist
parser = argparse.ArgumentParser()
parser.add_argument("--data_path", type=str, required=True)
parser.add_argument("--lr", type=float, default=1e-4)
args = parser.parse_args()
dist.init_process_group("nccl")
"""


def ids(*files: tuple[str, str]) -> list[str]:
    return [f.id for f in lint_texts([(n, textwrap.dedent(t)) for n, t in files]) if f.status != "OK"]


def test_required_option_missing_from_the_launch_line():
    assert "script-arg-missing" in ids(("train.py", SCRIPT), ("run.sh", "torchrun --nproc-per-node=2 train.py --lr 1\n"))
    for line in ("torchrun --nproc-per-node=2 train.py --data_path /d\n",
                 "torchrun --nproc-per-node=2 train.py --data_path=/d\n",
                 "torchrun --nproc-per-node=2 train.py --data /d\n",          # a unique prefix (allow_abbrev)
                 "torchrun --nproc-per-node=2 train.py $EXTRA_ARGS\n",        # the expansion may hold it
                 'torchrun --nproc-per-node=2 train.py "$@"\n'):
        assert "script-arg-missing" not in ids(("train.py", SCRIPT), ("run.sh", line)), line
    # an expansion that is an option's value cannot hold the missing option
    assert "script-arg-missing" in ids(("train.py", SCRIPT), ("run.sh", "torchrun train.py --lr $LR\n"))
    # a parser that keeps unknown arguments or is built dynamically is not read
    assert "script-arg-missing" not in ids(("train.py", SCRIPT.replace("parse_args()", "parse_known_args()[0]")),
                                           ("run.sh", "torchrun train.py --lr 1\n"))


def test_launcher_option_after_the_script():
    for line in ("deepspeed train.py --num_gpus 2 --lr 1\n", "torchrun train.py --nproc_per_node=2\n",
                 "accelerate launch train.py --num_processes 2\n",
                 "srun torchrun --nnodes 2 --rdzv-backend c10d --rdzv-endpoint h:1 train.py --nproc-per-node 4\n"):
        assert "launcher-option-after-script" in ids(("run.sh", line)), line
    for line in ("deepspeed --num_gpus 2 train.py --lr 1\n", "accelerate launch train.py --mixed_precision fp16\n",
                 "torchrun --nproc-per-node 2 train.py -- --nnodes 2\n"):
        assert "launcher-option-after-script" not in ids(("run.sh", line)), line
    # the linted script defines the option itself: it is the script's
    own = SCRIPT.replace('"--lr"', '"--num_gpus"')
    assert "launcher-option-after-script" not in ids(("train.py", own),
                                                     ("run.sh", "deepspeed train.py --num_gpus 2 --data_path d\n"))


def test_set_epoch_called_once_before_the_epoch_loop():
    once = """
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler
    def main():
        dist.init_process_group("nccl")
        sampler = DistributedSampler(ds)
        sampler.set_epoch(START)
        loader = DataLoader(ds, sampler=sampler)
        for epoch in range(10):
            for b in loader:
                pass
    """
    assert "sampler-no-set-epoch" in ids(("train.py", once))
    per_epoch = once.replace("        sampler.set_epoch(START)\n", "").replace(
        "            for b in loader:", "            sampler.set_epoch(epoch)\n            for b in loader:")
    assert "sampler-no-set-epoch" not in ids(("train.py", per_epoch))
    in_helper = once.replace("        sampler.set_epoch(START)\n", "").replace(
        "def main():", "def train_one(epoch):\n        sampler.set_epoch(epoch)\n    def main():")
    assert "sampler-no-set-epoch" not in ids(("train.py", in_helper))
    constant = per_epoch.replace("set_epoch(epoch)", "set_epoch(0)")
    assert "sampler-no-set-epoch" in ids(("train.py", constant))


def test_legacy_launcher_and_a_parser_with_only_the_dashed_local_rank():
    parser = SCRIPT.replace('"--lr"', '"--local-rank"')
    launch = ("run.sh", "python -m torch.distributed.launch --nproc_per_node=2 train.py --data_path d\n")
    found = [f for f in lint_texts([("train.py", textwrap.dedent(parser)), launch])
             if f.id == "local-rank-arg-under-launcher"]
    assert [f.status for f in found] == ["WARN"]                 # torch 1.x passes --local_rank
    both = parser.replace('"--local-rank"', '"--local-rank", "--local_rank"')
    assert "local-rank-arg-under-launcher" not in ids(("train.py", both), launch)


def test_undefined_name_in_the_branch_that_wraps_the_model():
    text = """
    import torch
    import torch.nn as nn
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    def wrap(model, use_fsdp):
        if use_fsdp:
            def policy(module, recurse, nonwrapped_numel):
                return unwrapped_params >= 1e8
            model = FSDP(model, auto_wrap_policy=policy)
        return model
    """
    assert "undefined-name" in ids(("train.py", text))
    assert "undefined-name" not in ids(("train.py", text.replace("unwrapped_params", "nonwrapped_numel")))
    # an excerpt (globals undefined outside the branch too) is not read
    assert "undefined-name" not in ids(("train.py", text + "    wrap(net, args.fsdp)\n"))


def test_a_collective_between_init_distributed_and_initialize_with_no_device_bound():
    text = """
    import torch, deepspeed
    def main(args):
        deepspeed.init_distributed()
        if torch.distributed.get_rank() != 0:
            torch.distributed.barrier()
        data = load()
        engine, opt, loader, _ = deepspeed.initialize(args=args, model=net, training_data=data)
    """
    assert "collective-before-set-device" in ids(("train.py", text))
    bound = text.replace("        deepspeed.init_distributed()\n",
                         "        torch.cuda.set_device(args.local_rank)\n        deepspeed.init_distributed()\n")
    assert "collective-before-set-device" not in ids(("train.py", bound))
    gloo = text.replace("init_distributed()", "init_distributed(dist_backend='gloo')")
    assert "collective-before-set-device" not in ids(("train.py", gloo))
