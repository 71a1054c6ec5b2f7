"""The rule changes made for the third blind set (issue 25), each on a small inline violation and its look-alike.

The blind files themselves are not used here (they score the linter; these pin the contracts): every snippet is
written from the API's documented behaviour that the rule cites.
"""

from __future__ import annotations

import textwrap

from helpers.lint import lint_texts


def found(*files: tuple[str, str], command: str | None = None) -> dict[str, list[str]]:
    """``{rule: [status, ...]}`` of the findings on ``files`` linted together."""
    out: dict[str, list[str]] = {}
    for f in lint_texts([(p, textwrap.dedent(t)) for p, t in files], command):
        out.setdefault(f.id, []).append(f.status)
    return out


def lines(rule: str, *files: tuple[str, str]) -> list[int]:
    """The lines of ``rule``'s findings."""
    return [f.line_no for f in lint_texts([(p, textwrap.dedent(t)) for p, t in files]) if f.id == rule]


# ---------------------------------------------------------------- false alarms of the first run
LAUNCHED = """
import os, torch, torch.distributed as dist
ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    dist.init_process_group("nccl", timeout=t)
loss = torch.zeros(1)
if ddp:
    dist.all_reduce(loss)
"""


def test_launched_or_not_flag_is_not_a_rank_gate():
    assert "rank-gated-collective" not in found(("t.py", LAUNCHED))
    rank0 = LAUNCHED.replace('!= -1', '== 0')  # now it is rank 0 only: a real gate
    assert found(("t.py", rank0))["rank-gated-collective"] == ["FAIL"]


TRUNCATE = """
import torch.distributed as dist
dist.init_process_group("nccl", timeout=t)
with open("log.txt", "w") as f:
    {body}
"""


def test_truncating_a_log_on_every_rank_is_not_a_write_race():
    assert "write-on-every-rank" not in found(("t.py", TRUNCATE.format(body="pass")))
    assert found(("t.py", TRUNCATE.format(body="f.write('x')")))["write-on-every-rank"] == ["WARN"]


OWN_GET_RANK = """
import os, torch.distributed as dist
def get_rank():
    return int(os.environ.get("RANK", 0))
def init():
    rank = get_rank()
    dist.init_process_group("nccl", rank=rank, timeout=t)
"""


def test_the_files_own_get_rank_does_not_need_the_group():
    assert "collective-before-init" not in found(("t.py", OWN_GET_RANK))
    theirs = OWN_GET_RANK.replace("rank = get_rank()", "rank = dist.get_rank()")
    assert found(("t.py", theirs))["collective-before-init"] == ["FAIL"]


EVAL_SHARD = """
import torch, torch.nn as nn, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Sequential(nn.Linear(4, 4), nn.{layer}(4), nn.GELU())
dist.init_process_group("nccl", timeout=t)
rank = dist.get_rank()
model = Net()
model = torch.compile(model)
model = DDP(model, device_ids=[0])
for i, x in enumerate(data):
    if i % 2 != rank:
        continue
    with torch.no_grad():
        y = model(x)
"""


def test_ddp_forward_of_a_buffer_free_model_is_no_collective():
    # torch/nn/parallel/distributed.py syncs buffers only when len(self.modules_buffers) > 0
    assert "rank-early-exit-collective" not in found(("t.py", EVAL_SHARD.format(layer="LayerNorm")))
    assert found(("t.py", EVAL_SHARD.format(layer="BatchNorm1d")))["rank-early-exit-collective"] == ["FAIL"]
    buffered = EVAL_SHARD.format(layer="LayerNorm").replace("nn.GELU())", "nn.GELU())\n        "
                                                             "self.register_buffer('m', torch.zeros(4))")
    assert found(("t.py", buffered))["rank-early-exit-collective"] == ["FAIL"]
    imported = EVAL_SHARD.format(layer="LayerNorm").replace("model = Net()", "model = timm.create_model('x')")
    assert found(("t.py", imported))["rank-early-exit-collective"] == ["FAIL"]  # unknown: taken to broadcast


# ---------------------------------------------------------------- rules derived for the misses
def test_bash_substring_expansion_is_not_a_default():
    bad = "#!/bin/bash\nMASTER_ADDR=${MASTER_ADDR:localhost}\ntorchrun --master_addr $MASTER_ADDR train.py\n"
    assert found(("run.sh", bad))["shell-default-expansion"] == ["FAIL"]
    good = bad.replace(":localhost", ":-localhost")
    assert "shell-default-expansion" not in found(("run.sh", good))
    offset = "#!/bin/bash\nstart=2\necho ${LINE:start} ${LINE:3:4}\n"  # a real offset: a name the script sets, numbers
    assert "shell-default-expansion" not in found(("run.sh", offset))


def test_set_device_through_deepspeeds_accelerator_from_the_global_rank():
    bad = "from deepspeed.accelerator import get_accelerator\nclass T:\n    def init(self):\n" \
          "        get_accelerator().set_device(self.global_rank)\n"
    assert found(("t.py", bad))["device-from-global-rank"] == ["FAIL"]
    assert "device-from-global-rank" not in found(("t.py", bad.replace("global_rank", "local_rank")))


AMP = """
import torch, apex
from torch.nn.parallel import DistributedDataParallel as DDP
model = Net().cuda()
{first}
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
{second}
"""
WRAP, INIT = "model = DDP(model, device_ids=[0])", "model, optimizer = apex.amp.initialize(model, optimizer)"


def test_amp_initialize_after_ddp():
    assert found(("t.py", AMP.format(first=WRAP, second=INIT)))["amp-initialize-after-ddp"] == ["FAIL"]
    assert "amp-initialize-after-ddp" not in found(("t.py", AMP.format(first="", second=INIT + "\n" + WRAP)))


FLAG = """
for micro_step in range(steps):
    {before}
    loss = model(x, y)
    {after}
    loss.backward()
"""
SET = "model.require_backward_grad_sync = (micro_step == steps - 1)"


def test_sync_flag_set_after_the_forward():
    assert found(("t.py", FLAG.format(before="pass", after=SET)))["sync-flag-after-forward"] == ["WARN"]
    assert "sync-flag-after-forward" not in found(("t.py", FLAG.format(before=SET, after="pass")))


NO_SYNC = """
for i, batch in enumerate(loader):
    loss = model(batch)
    with model.no_sync():
        {body}
"""


def test_no_sync_around_the_backward_only():
    assert found(("t.py", NO_SYNC.format(body="loss.backward()")))["no-sync-backward-only"] == ["WARN"]
    whole = "loss = model(batch)\n        loss.backward()"
    assert "no-sync-backward-only" not in found(("t.py", NO_SYNC.format(body=whole)))


ACCUM = """
from contextlib import nullcontext
for batch_idx, batch in enumerate(loader):
    ctx = model.no_sync if {pred} else nullcontext
    with ctx():
        model(batch).backward()
    if (batch_idx + 1) % accum_grad == 0:
        optim.step()
        optim.zero_grad()
"""


def test_no_sync_misaligned_with_the_optimizer_step():
    assert found(("t.py", ACCUM.format(pred="batch_idx % accum_grad != 0")))["no-sync-misaligned"] == ["WARN"]
    assert "no-sync-misaligned" not in found(("t.py", ACCUM.format(pred="(batch_idx + 1) % accum_grad != 0")))


BARRIER = """
import torch, torch.distributed as dist
def main():
    dist.barrier()
    torch.cuda.set_device(local_rank)
if __name__ == "__main__":
    {pre}
    dist.init_process_group(backend="nccl")
    main()
"""


def test_collective_before_set_device():
    assert found(("t.py", BARRIER.format(pre="pass")))["collective-before-set-device"] == ["WARN"]
    bound = BARRIER.format(pre="torch.cuda.set_device(local_rank)")  # bound before the group exists: all later ones use it
    assert "collective-before-set-device" not in found(("t.py", bound))


# ---------------------------------------------------------------- second tuning pass (lint3b)
GATED_ELSEWHERE = """
import wandb
from omegaconf import OmegaConf
from mylib import is_main_process

def train_model(options, checkpoint_dir):
    {first}
    if is_main_process():
        OmegaConf.save(config=options, f=checkpoint_dir / "options_restart.yaml")
"""


def test_a_file_that_gates_its_own_writes_is_checked_for_the_ungated_one():
    """No init_process_group here (the launcher module does it): the file's own main-process gate says it runs per
    rank, so an ungated OmegaConf.save / wandb.init beside it is flagged; a gated or group= one is not."""
    save = 'OmegaConf.save(config=options, f=checkpoint_dir / "o.yaml")'
    assert found(("t.py", GATED_ELSEWHERE.format(first=save)))["write-on-every-rank"] == ["WARN"]
    assert found(("t.py", GATED_ELSEWHERE.format(first="run = wandb.init(project='p')")))["write-on-every-rank"] == \
        ["WARN"]
    assert "write-on-every-rank" not in found(("t.py", GATED_ELSEWHERE.format(first="run = wandb.init(group='g')")))
    assert "write-on-every-rank" not in found(("t.py", GATED_ELSEWHERE.format(
        first=f"if is_main_process():\n        {save}")))
    # without any gate of its own and no DDP set-up, the file is not known to run per rank: not checked
    ungated = GATED_ELSEWHERE.format(first=save).replace("if is_main_process():\n        ", "")
    assert "write-on-every-rank" not in found(("t.py", ungated))


INHERITED = """
from distributed import comm
from .base import BaseTrainer

class Trainer(BaseTrainer):
    def run(self):
        for epoch in range(10):
            if comm.is_main_process():
                self.save_checkpoint(epoch)
            if self.better():
                {best}
"""


def test_inherited_checkpoint_save_ungated_beside_a_gated_one():
    assert lines("write-on-every-rank", ("t.py", INHERITED.format(best="self.save_best_checkpoint()"))) == [11]
    gated = "if comm.is_main_process():\n                    self.save_best_checkpoint()"
    assert "write-on-every-rank" not in found(("t.py", INHERITED.format(best=gated)))
    # a method the file defines is read by the ordinary write rule instead; an engine's save_checkpoint is a collective
    assert "write-on-every-rank" not in found(("t.py", INHERITED.format(best="self.engine.save_checkpoint('d')")))


MAIN_BY_LOCAL = """
import os

def if_main_process():
    if "LOCAL_RANK" in os.environ:
        return int(os.environ["{key}"]) == 0
    return True

def is_local_rank_zero():
    return int(os.environ["LOCAL_RANK"]) == 0
"""


def test_main_process_decided_by_local_rank():
    """torchrun: LOCAL_RANK is per node, RANK global: a 'main process' test on LOCAL_RANK is true once per node;
    a function named for the per-node process (is_local_rank_zero) is what it says."""
    assert lines("local-rank-as-global-rank", ("t.py", MAIN_BY_LOCAL.format(key="LOCAL_RANK"))) == [6]
    assert "local-rank-as-global-rank" not in found(("t.py", MAIN_BY_LOCAL.format(key="RANK")))


UNBOUND = """
import torch

def main(args, model, rank):
    if args.ddp:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[rank])
        {ddp_extra}
    else:
        model_module = model.module if hasattr(model, "module") else model
    ema = AveragedModel(model_module)
"""


def test_name_bound_only_outside_the_ddp_branch():
    assert lines("unbound-after-ddp-branch", ("t.py", UNBOUND.format(ddp_extra="pass"))) == [10]
    assert "unbound-after-ddp-branch" not in found(("t.py", UNBOUND.format(ddp_extra="model_module = model.module")))
    assert "unbound-after-ddp-branch" not in found(("t.py", UNBOUND.format(ddp_extra="return model")))
    same_test = UNBOUND.format(ddp_extra="pass").replace("    ema = AveragedModel(model_module)",
                                                         "    if not args.ddp:\n        ema = AveragedModel(model_module)")
    assert "unbound-after-ddp-branch" not in found(("t.py", same_test))


MAIN_PY = """
import os, torch.distributed as dist
from training import Trainer
local_rank = int(os.environ["LOCAL_RANK"])
{bind}
dist.init_process_group(backend="nccl")
Trainer().run()
"""
TRAINING_PY = """
import os, torch
from torch.nn.parallel import DistributedDataParallel as DDP
LOCAL_RANK = int(os.environ["LOCAL_RANK"])
DEVICE = torch.device(f"cuda:{LOCAL_RANK}")

class Trainer:
    def __init__(self):
        self.model = DDP(make_model().to(DEVICE), device_ids=[LOCAL_RANK], output_device=LOCAL_RANK)
"""


def test_nccl_device_binding_is_judged_over_the_case_files():
    """DDP's docstring: each process works on one GPU via CUDA_VISIBLE_DEVICES or torch.cuda.set_device(i); the group,
    the wrapper and the device live in different files here, and no file binds it."""
    assert found(("main.py", MAIN_PY.format(bind="")), ("training.py", TRAINING_PY))["nccl-no-device-binding"] == \
        ["WARN"]
    bound = MAIN_PY.format(bind="torch.cuda.set_device(local_rank)")
    assert "nccl-no-device-binding" not in found(("main.py", bound), ("training.py", TRAINING_PY))
    # one file alone with an explicit per-rank device is left to the single-file rule (bare 'cuda' only)
    assert "nccl-no-device-binding" not in found(("main.py", MAIN_PY.format(bind="") + TRAINING_PY))


LOSS_LOG = """
import os, torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
dist.init_process_group("nccl", timeout=t)
model = DDP(net, device_ids=[local_rank])

def print0(*a):
    if int(os.environ.get("RANK", 0)) == 0:
        print(*a)

for step in range(10):
    lossf = 0.0
    for micro in range(4):
        loss = model(x, y)
        lossf += loss.item()
    {reduce}
    print0(f"train loss {{lossf:.4f}}")
"""


def test_loss_summed_on_each_rank_and_printed_by_rank0_only():
    """DDP averages gradients, not the loss: a `lossf += loss.item()` printed by rank 0 alone is its shard's value
    (karpathy/llm.c#551); reduced first, it is the job's mean."""
    got = found(("t.py", LOSS_LOG.format(reduce="pass")))
    assert got["metric-not-reduced"] == ["INFO"]
    reduced = LOSS_LOG.format(reduce="t = torch.tensor(lossf, device=dev); dist.all_reduce(t); lossf = t.item()")
    assert "metric-not-reduced" not in found(("t.py", reduced))
    every_rank = LOSS_LOG.format(reduce="pass").replace('print0(f"train', 'print(f"train')
    assert "metric-not-reduced" not in found(("t.py", every_rank))


def test_an_entry_point_named_main_is_not_a_main_process_test():
    entry = "import os\ndef main():\n    if int(os.environ['LOCAL_RANK']) == 0:\n        download()\n"
    assert "local-rank-as-global-rank" not in found(("t.py", entry))
