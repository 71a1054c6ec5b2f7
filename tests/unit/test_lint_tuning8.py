"""runbook lint rules tuned on the eighth blind set (tests/data/lint/blind8), each with its violation and its look-alike."""

from __future__ import annotations

import textwrap

from helpers.lint import lint_texts


def found(*files: tuple[str, str]) -> dict[str, list[str]]:
    """``{rule: [status, ...]}`` of the findings on ``files`` linted together."""
    out: dict[str, list[str]] = {}
    for f in lint_texts([(p, textwrap.dedent(t)) for p, t in files]):
        out.setdefault(f.id, []).append(f.status)
    return out


DDP_STRIDE = """
import torch
from torch.nn.parallel import DistributedDataParallel as DDP
def train(model, rank, cuda):
    if cuda and rank != -1:
        model = DDP(model, device_ids=[rank])
    {read}
"""


def test_an_attribute_a_ddp_instance_does_not_have():
    """ultralytics/yolov5#683: model.stride read on the DDP wrapper; nn.Module.__getattr__ finds only 'module'."""
    assert found(("t.py", DDP_STRIDE.replace("{read}", "gs = int(model.stride.max())")))["ddp-wrapper-attribute"] == ["FAIL"]
    dispatch = "gs = model.module.stride if hasattr(model, 'module') else model.stride"
    assert "ddp-wrapper-attribute" not in found(("t.py", DDP_STRIDE.replace("{read}", dispatch)))
    assert "ddp-wrapper-attribute" not in found(("t.py", DDP_STRIDE.replace("{read}", "model.train(); model.no_sync")))
    other_branch = DDP_STRIDE.replace("{read}", "").replace(
        "        model = DDP(model, device_ids=[rank])\n",
        "        model = DDP(model, device_ids=[rank])\n    elif cuda:\n        model.features = model.features.cuda()\n")
    assert "ddp-wrapper-attribute" not in found(("t.py", other_branch))


EMA = """
import torch
def train(model, rank):
    torch.distributed.init_process_group("nccl")
    ema = ModelEMA(model) if rank in [-1, 0] else None
    {use}
"""


def test_an_object_made_on_rank_zero_used_on_every_rank():
    """ultralytics/yolov5#775: ema is None on ranks > 0, then ema.updates is set on all of them."""
    assert found(("t.py", EMA.replace("{use}", "ema.updates = 10")))["rank-gated-object-used"] == ["FAIL"]
    assert "rank-gated-object-used" not in found(("t.py", EMA.replace("{use}", "if ema:\n        ema.updates = 10")))
    both = EMA.replace("ema = ModelEMA(model) if rank in [-1, 0] else None",
                       "if rank == 0:\n        ema = ModelEMA(model)\n    else:\n        ema = ModelEMA(model, quiet=True)")
    assert "rank-gated-object-used" not in found(("t.py", both.replace("{use}", "ema.updates = 10")))


def test_getattr_on_os_environ_always_gives_the_default():
    """ultralytics/yolov5#3680: os.environ is a mapping; getattr finds no WORLD_SIZE attribute."""
    code = "import os\nworld_size = int({read}'WORLD_SIZE', 1))\n"
    assert found(("t.py", code.replace("{read}", "getattr(os.environ, ")))["environ-getattr"] == ["FAIL"]
    assert "environ-getattr" not in found(("t.py", code.replace("{read}", "os.environ.get(")))


SHORT = """
import torch.distributed as dist
from datetime import timedelta
def main(rank):
    dist.init_process_group("nccl", timeout=timedelta({timeout}))
    if rank == 0:
        evaluate()
    dist.barrier()
"""


def test_a_process_group_timeout_shorter_than_a_first_rank_step():
    """ultralytics/yolov5#4422: 60 s while rank 0 validates and the others wait in a collective."""
    assert found(("t.py", SHORT.replace("{timeout}", "seconds=60")))["init-timeout-short"] == ["WARN"]
    assert "init-timeout-short" not in found(("t.py", SHORT.replace("{timeout}", "minutes=30")))


DS_ARGS = """
import argparse, deepspeed
def parse():
    parser = argparse.ArgumentParser()
    parser.add_argument({spelling}, type=int, default=None)
    parser = deepspeed.add_config_arguments(parser)
    return parser.parse_args()
"""


def test_a_deepspeed_script_that_accepts_only_the_dashed_local_rank():
    """deepspeedai/Megatron-DeepSpeed#192: the deepspeed launcher passes --local_rank=N; argparse matches exactly."""
    assert found(("a.py", DS_ARGS.replace("{spelling}", "'--local-rank'")))["local-rank-arg-under-launcher"] == ["FAIL"]
    both = DS_ARGS.replace("{spelling}", "'--local-rank', '--local_rank'")
    assert "local-rank-arg-under-launcher" not in found(("a.py", both))


REMOVE = """
from mmengine.dist import is_main_process
class Hook:
    def save(self, runner, path):
        if is_main_process():
            runner.save_checkpoint(path)
        {gate}self.file_client.remove(self.best_path)
"""


def test_a_storage_clients_remove_on_every_rank():
    """open-mmlab/mmengine#682: every rank removed the previous best checkpoint."""
    assert found(("h.py", REMOVE.replace("{gate}", "")))["write-on-every-rank"] == ["WARN"]
    gated = REMOVE.replace("{gate}", "if is_main_process(): ")
    assert "write-on-every-rank" not in found(("h.py", gated))
    assert "write-on-every-rank" not in found(("h.py", REMOVE.replace("{gate}", "").replace(
        "self.file_client.remove(self.best_path)", "self.paths.remove(self.best_path)")))


HELPER = """
import torch
def ddp_all_reduce(obj, op):
    torch.distributed.all_reduce(obj, op=op)
    return obj
def init(backend="nccl"):
    torch.distributed.init_process_group(backend=backend)
"""
CALLER = """
import torch
from distributed import ddp_all_reduce
def combine(count):
    return ddp_all_reduce(torch.tensor(count{device}), None)
"""


def test_a_cpu_tensor_given_to_a_helper_that_all_reduces_it():
    """speechbrain/speechbrain#2934: torch.tensor(local_count) on the CPU, all_reduced under nccl."""
    assert found(("distributed.py", HELPER), ("features.py", CALLER.replace("{device}", "")))["nccl-cpu-tensor"] == ["WARN"]
    placed = CALLER.replace("{device}", ", device='cuda'")
    assert "nccl-cpu-tensor" not in found(("distributed.py", HELPER), ("features.py", placed))


def test_look_alikes_from_the_clean_files():
    """The clean files' patterns that had alarms: a one-process --evolve path (yolov5), an all-reduce helper whose
    emptiness test reads a dict of named statistics (fairseq), mmengine's bare save_checkpoint under is_main_process in
    a method of the same name, and FULL_STATE_DICT used only to load an optimizer state."""
    evolve = """
import os, yaml, torch.distributed as dist
LOCAL_RANK = int(os.getenv("LOCAL_RANK", -1))
def main(opt):
    if LOCAL_RANK != -1:
        assert not opt.evolve, "--evolve is not compatible with DDP"
        dist.init_process_group("nccl")
    if not opt.evolve:
        train(opt)
    else:
        with open("evolve.yaml", "w") as f:
            yaml.dump({}, f)
"""
    assert "write-on-every-rank" not in found(("train.py", evolve))
    stats = """
import torch
from torch.distributed import all_reduce
def all_reduce_dict(data, device):
    def _all_reduce_dict(data):
        if len(data) == 0:
            return data
        buf = torch.cat([t.view(-1) for t in data.values()]).to(device=device)
        all_reduce(buf)
        return buf
    return _all_reduce_dict(data)
"""
    assert "rank-early-exit-collective" not in found(("utils.py", stats))
    strategy = """
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, StateDictType
from mmengine.dist import is_main_process
class FSDPStrategy:
    def save_checkpoint(self, filename):
        from mmengine.runner.checkpoint import save_checkpoint
        state_dict = {"optimizer": self.optim_state_dict()}
        if is_main_process():
            save_checkpoint(state_dict, filename)
    def optim_state_dict(self):
        return FSDP.optim_state_dict(self.model, self.optim)
    def load_optim_state_dict(self, state):
        with FSDP.state_dict_type(self.model, StateDictType.FULL_STATE_DICT):
            state = FSDP.optim_state_dict_to_load(optim_state_dict=state, model=self.model, optim=self.optim)
        self.optim.load_state_dict(state)
"""
    got = found(("fsdp.py", strategy))
    assert "rank-gated-collective" not in got and "fsdp-full-state-dict-all-ranks" not in got, got
