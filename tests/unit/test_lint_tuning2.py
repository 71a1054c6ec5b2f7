"""The rule changes made for the second blind set (issue 25), each on a small inline violation and its look-alike.

The blind files themselves are not used here (they score the linter; these pin the contracts): every snippet is
written from the API's documented behaviour that the rule cites.
"""

from __future__ import annotations

import json
import textwrap

import pytest

from helpers import cli, launch_parse, script_traps
from helpers.lint import lint_texts


def found(*files: tuple[str, str], command: str | None = None) -> dict[str, list[str]]:
    """``{rule: [status, ...]}`` of the findings on ``files`` linted together."""
    out: dict[str, list[str]] = {}
    for f in lint_texts([(p, textwrap.dedent(t)) for p, t in files], command):
        out.setdefault(f.id, []).append(f.status)
    return out


# ---------------------------------------------------------------- false alarms of the first run
ZERO2 = json.dumps({"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2}})


def test_zero_without_optimizer_is_decided_by_the_script():
    raw = ("train.py", "import deepspeed\nengine, *_ = deepspeed.initialize(model=m, model_parameters=m.parameters(), "
                       "config='ds.json')\n")
    assert found(("ds.json", ZERO2), raw)["ds-zero-without-optimizer"] == ["FAIL"]
    hf = ("train.py", "from transformers import Trainer, TrainingArguments\nTrainer(model=m, args=a).train()\n")
    assert "ds-zero-without-optimizer" not in found(("ds.json", ZERO2), hf)
    assert found(("ds.json", ZERO2))["ds-zero-without-optimizer"] == ["INFO"]  # the config alone decides nothing
    zero3 = json.dumps({"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3}})
    assert "ds-zero-without-optimizer" not in found(("ds.json", zero3), raw)  # ZeRO-Offload needs none
    through = ("train.py", "class C:\n    def engine(self, cfg):\n        return self.ds.initialize(model=m, "
                           "model_parameters=m.parameters(), config=cfg)\n")
    assert found(("ds.json", ZERO2), through)["ds-zero-without-optimizer"] == ["FAIL"]


WRITES = """
import io, torch, torch.distributed as dist
dist.init_process_group("nccl", timeout=t)
def upload(obj, dst):
    buf = io.BytesIO()
    torch.save(obj, buf)
    send(buf, dst)
def to_disk(obj):
    torch.save(obj, "snap.pt")
def snapshot(obj):
    upload(obj, "s3://b/k")
    to_disk(obj)
def train(rank):
    if rank == 0:
        snapshot(model.state_dict())
{tail}
"""


def test_writes_in_memory_or_reached_only_through_gated_callers_are_not_races():
    assert "write-on-every-rank" not in found(("t.py", WRITES.format(tail="")))
    assert found(("t.py", WRITES.format(tail="to_disk(model.state_dict())")))["write-on-every-rank"] == ["WARN"]


def test_tracker_runs_on_every_rank():
    base = "import wandb, torch.distributed as dist\ndist.init_process_group('nccl', timeout=t)\nrank = dist.get_rank()\n"
    assert "write-on-every-rank" in found(("t.py", base + "wandb.init(project='p')\n"))
    assert "write-on-every-rank" not in found(("t.py", base + "if rank == 0:\n    wandb.init(project='p')\n"))
    assert "write-on-every-rank" not in found(("t.py", base + "wandb.init(project='p', group='job-1')\n"))


def test_one_fsdp_unit_is_a_cost_and_the_tensor_parallel_recipe_is_not_reported():
    root_only = "from torch.distributed.fsdp import fully_shard\nmodel = fully_shard(model, mesh=dp_mesh)\n"
    assert found(("t.py", root_only))["fsdp-no-wrap-policy"] == ["INFO"]
    tp = "from torch.distributed.tensor.parallel import parallelize_module\nmodel = parallelize_module(model, tp, plan)\n"
    assert "fsdp-no-wrap-policy" not in found(("t.py", tp + root_only))


TIMEOUT = """
import torch.distributed as dist
dist.init_process_group("nccl")
rank = dist.get_rank()
{body}
"""


@pytest.mark.parametrize("body, expected", [
    ("train()", False),
    ("with training_args.main_process_first(desc='tokenize'):\n    ds = ds.map(tok)", True),
    ("with torch_distributed_zero_first(rank):\n    ds = build()", True),
    ("if rank != 0:\n    dist.barrier()\nds = build()\nif rank == 0:\n    dist.barrier()", True),
    ("if rank == 0:\n    download()\ndist.barrier()", True),
])
def test_init_without_timeout_only_where_ranks_wait_for_one_rank(body, expected):
    assert ("init-without-timeout" in found(("t.py", TIMEOUT.format(body=body)))) is expected


# ---------------------------------------------------------------- launch line <-> script, batch scripts
TIMM_ARGS = """
import argparse
config_parser = argparse.ArgumentParser(add_help=False)
config_parser.add_argument('-c', '--config', default='')
parser = argparse.ArgumentParser()
parser.add_argument('--lr', type=float)
parser.add_argument('--local_rank', type=int, default=0)
def _parse_args():
    args_config, remaining = config_parser.parse_known_args()
    return parser.parse_args({rest})
"""


def test_leftovers_of_parse_known_args_parsed_strictly_are_checked():
    cmd = "python3 -m torch.distributed.launch --nproc_per_node=2 train.py --lr 0.1"
    assert "local-rank-arg-under-launcher" in found(("train.py", TIMM_ARGS.format(rest="remaining")), command=cmd)
    lenient = TIMM_ARGS.format(rest="remaining").replace("return parser.parse_args(remaining)",
                                                         "return parser.parse_known_args(remaining)[0]")
    assert "local-rank-arg-under-launcher" not in found(("train.py", lenient), command=cmd)


SLURM = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node={tasks}\n#SBATCH --gres=gpu:8\n"
LAUNCH_TEXTS = {
    "nnodes-mismatch": SLURM.format(tasks=1) + "srun torchrun --nproc_per_node 8 --rdzv_backend c10d "
                                               "--rdzv_endpoint $HEAD:29500 train.py\n",
    "master-addr-login-node": "#!/bin/bash\nMASTER=$SLURM_SUBMIT_HOST\npython -m torch.distributed.run --nnodes=2 "
                              "--node_rank=$SLURM_NODEID --master_addr=${MASTER} --master_port=1234 train.py\n",
    "srun-tasks-per-node": SLURM.format(tasks=1) + "# PTL doesn't need a launcher\nLAUNCHER=\"python -u\"\n"
                                                   "CMD=\"$LAUNCHER train.py\"\nsrun --jobid $SLURM_JOB_ID bash -c \"$CMD\"\n",
}


@pytest.mark.parametrize("rule", sorted(LAUNCH_TEXTS))
def test_new_launch_rules_fire_through_lint_and_build_check(rule, capsys, tmp_path):
    text = LAUNCH_TEXTS[rule]
    assert rule in found(("job.sh", text))                                            # runbook lint
    assert rule in [t.id for t in script_traps.text_traps(text)]                      # the text checker
    # `srun python x.py` is no launch line the parser reads: check_text still returns the text traps (spec None), so
    # build --check and the paste box list them as lint does
    job = tmp_path / "job.sh"
    job.write_text(text)
    cli.main(["build", "--check-file", str(job)])                                     # runbook build --check-file
    assert f"] {rule} (" in capsys.readouterr().err
    assert rule in [t.id for t in script_traps.check_text(text)[1]]                   # the paste box's checker


def test_launch_look_alikes():
    with_nnodes = LAUNCH_TEXTS["nnodes-mismatch"].replace("--nproc_per_node 8", "--nnodes 2 --nproc_per_node 8")
    assert "nnodes-mismatch" not in found(("job.sh", with_nnodes))
    one_node = LAUNCH_TEXTS["nnodes-mismatch"].replace("--nodes=2", "--nodes=1")
    assert "nnodes-mismatch" not in found(("job.sh", one_node))
    node0 = LAUNCH_TEXTS["master-addr-login-node"].replace("$SLURM_SUBMIT_HOST",
                                                           '$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)')
    assert "master-addr-login-node" not in found(("job.sh", node0))
    per_gpu = SLURM.format(tasks=8) + "srun python -u train.py\n"
    assert "srun-tasks-per-node" not in found(("job.sh", per_gpu))
    spawns = ("train.py", "import torch.multiprocessing as mp\ndef run(i):\n    pass\nmp.spawn(run, nprocs=8)\n")
    assert "srun-tasks-per-node" in found(("job.sh", LAUNCH_TEXTS["srun-tasks-per-node"]))
    assert "srun-tasks-per-node" not in found(("job.sh", LAUNCH_TEXTS["srun-tasks-per-node"]), spawns)
    per_node_lines = "# node 0\ntorchrun --nnodes=2 --node_rank=0 --master_addr=n0 t.py\n# node 1\n" \
                     "torchrun --nnodes=2 --node_rank=1 --master_addr=n0 t.py\n"
    assert "node-rank-fixed" not in found(("launch.sh", per_node_lines))


def test_an_apostrophe_in_a_comment_opens_no_quote():
    text = "# it doesn't matter\nA=1\nsrun torchrun --nnodes=2 train.py\n"
    assert [n for n, _ in launch_parse.join_continuations(text)] == [1, 2, 3]


# ---------------------------------------------------------------- ranks, devices, seeds
SAMPLER = """
import os, torch.distributed as dist
from torch.utils.data.distributed import DistributedSampler
local_rank = int(os.environ["LOCAL_RANK"])
world_size = int(os.environ["WORLD_SIZE"])
dist.init_process_group("nccl", timeout=t)
sampler = DistributedSampler(ds, num_replicas=world_size, rank={rank})
"""


def test_local_rank_where_the_global_rank_is_meant():
    assert found(("train.py", SAMPLER.format(rank="local_rank")))["local-rank-as-global-rank"] == ["WARN"]
    assert "local-rank-as-global-rank" not in found(("train.py", SAMPLER.format(rank="dist.get_rank()")))
    two_nodes = "torchrun --nnodes=2 --node_rank=0 --master_addr=n0 --nproc_per_node=4 train.py"
    assert found(("train.py", SAMPLER.format(rank="local_rank")), command=two_nodes)["local-rank-as-global-rank"] \
        == ["FAIL"]
    shard = """
    import os
    def load(ckpt_dir, local_rank, world_size):
        checkpoints = sorted(Path(ckpt_dir).glob("*.pth"))
        assert world_size == len(checkpoints)
        return torch.load(checkpoints[local_rank], map_location="cpu")
    load(d, int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"]))
    """
    assert "local-rank-as-global-rank" in found(("example.py", shard))
    assert "local-rank-as-global-rank" not in found(("example.py", shard.replace("checkpoints[local_rank]",
                                                                                 "checkpoints[0]")))


def test_one_fixed_visible_device_for_every_rank():
    base = "import os, torch.distributed as dist\nos.environ['CUDA_VISIBLE_DEVICES'] = f'{rank % 8},'\n"
    assert "same-device-every-rank" in found(("t.py", base + "os.environ['CUDA_VISIBLE_DEVICES'] = '6'\n"
                                                     "dist.init_process_group('nccl', timeout=t)\n"))
    assert "same-device-every-rank" not in found(("t.py", base + "dist.init_process_group('nccl', timeout=t)\n"))
    assert "same-device-every-rank" not in found(("t.py", "import os, torch.distributed as dist\n"
                                                          "os.environ['CUDA_VISIBLE_DEVICES'] = '0,1,2,3'\n"
                                                          "dist.init_process_group('nccl', timeout=t)\n"))


SEED = """
import torch
from torch.utils.data import DataLoader, distributed
def loader(ds, rank):
    sampler = None if rank == -1 else distributed.DistributedSampler(ds)
    generator = torch.Generator()
    generator.manual_seed({seed})
    return DataLoader(ds, sampler=sampler, num_workers=8, generator=generator)
"""


def test_worker_seeds_alike_on_every_rank():
    assert "same-seed-every-rank" in found(("t.py", SEED.format(seed="0")))
    assert "same-seed-every-rank" not in found(("t.py", SEED.format(seed="6148914691236517205 + rank")))


# ---------------------------------------------------------------- the DistributedDataParallel wrapper's data flow
DDP_EVAL = """
import torch, torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
def evaluate(model, data):
    with torch.no_grad():
        return model(data)
def main():
    dist.init_process_group("nccl", timeout=t)
    model = DDP(net, device_ids=[local_rank]{extra})
    if dist.get_rank() == 0:
        evaluate({arg}, data)
"""


def test_a_rank0_forward_through_the_ddp_wrapper_is_a_collective():
    assert "rank-gated-collective" in found(("t.py", DDP_EVAL.format(extra="", arg="model")))
    assert "rank-gated-collective" not in found(("t.py", DDP_EVAL.format(extra="", arg="model.module")))
    assert "rank-gated-collective" not in found(("t.py", DDP_EVAL.format(extra=", broadcast_buffers=False",
                                                                         arg="model")))


def test_the_wrapper_flows_into_a_function_of_another_file():
    main = ("main.py", "import torch.distributed as dist\nfrom mylib.train import evaluate\n"
                       "dist.init_process_group('nccl', timeout=t)\nmodel = torch.nn.parallel.DistributedDataParallel(net)\n"
                       "evaluate(model, data)\n")
    lib = ("train.py", "def evaluate(model, data):\n    if not is_master(args):\n        return {}\n"
                       "    return model(data)\n")
    assert "rank-early-exit-collective" in found(main, lib)
    assert "rank-early-exit-collective" not in found(lib)  # alone: nothing says model is wrapped


def test_attributes_of_the_model_are_not_read_through_the_wrapper():
    src = """
    def train(model):
        model.names = loader.dataset.classes
        show(model.names)
        model = smart_DDP(model)
        fit(model)
        return {read}
    """
    assert "ddp-wrapper-attribute" in found(("t.py", src.format(read="model.names")))
    assert "ddp-wrapper-attribute" not in found(("t.py", src.format(read="model.module.names")))


LIGHTNING = """
from pytorch_lightning import LightningModule
from pytorch_lightning.utilities import rank_zero_only
class M(LightningModule):
    def validation_epoch_end(self, outputs):
        if self.global_rank == 0:
            self._log_metrics(evaluate(outputs))
    def _log_metrics(self, results):
        for k, v in results.items():
            self.log(k, v{kw})
"""


def test_lightning_log_from_rank_zero_only_needs_rank_zero_only():
    assert "rank-gated-collective" in found(("m.py", LIGHTNING.format(kw="")))
    assert "rank-gated-collective" not in found(("m.py", LIGHTNING.format(kw=", rank_zero_only=True")))
    decorated = ("m.py", "from pytorch_lightning import LightningModule\nclass M(LightningModule):\n"
                         "    @rank_zero_only\n    def report(self, v):\n        self.log('acc', v, sync_dist=True)\n")
    assert "rank-gated-collective" in found(decorated)


# ---------------------------------------------------------------- checkpoints and saving
def test_load_placement_decided_per_call_and_across_files():
    branch = """
    import torch, torch.distributed as dist
    dist.init_process_group("nccl", timeout=t)
    if args.gpu is None:
        checkpoint = torch.load(args.resume)
    else:
        checkpoint = torch.load(args.resume, map_location=f"cuda:{args.gpu}")
    """
    assert "load-without-map-location" not in found(("main.py", branch))
    helper = ("checkpoint.py", "import torch\ndef load(path):\n    return torch.load(path)\n")
    assert "load-without-map-location" not in found(helper)
    script = ("ddp_train.py", "import torch.distributed as dist\ndist.init_process_group('nccl', timeout=t)\n"
                              "model = DistributedDataParallel(model)\n")
    assert "load-without-map-location" in found(helper, script)


def test_zero3_save_needs_the_16bit_gather():
    acc = "distributed_type: DEEPSPEED\nnum_processes: 4\ndeepspeed_config:\n  zero_stage: 3\n  zero3_save_16bit_model: {v}\n"
    assert "ds-zero3-save-without-gather" in found(("acc.yaml", acc.format(v="false")))
    assert "ds-zero3-save-without-gather" not in found(("acc.yaml", acc.format(v="true")))
    z3 = {"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 3}}
    hf = ("train.py", "from transformers import Trainer\ntrainer = Trainer(model=m, args=a)\ntrainer.train()\n"
                      "trainer.save_model(out)\n")
    assert "ds-zero3-save-without-gather" in found(("ds.json", json.dumps(z3)), hf)
    assert "ds-zero3-save-without-gather" not in found(("ds.json", json.dumps(z3)))  # raw DeepSpeed saves shards
    z3["zero_optimization"]["stage3_gather_16bit_weights_on_model_save"] = True
    assert "ds-zero3-save-without-gather" not in found(("ds.json", json.dumps(z3)), hf)


def test_a_deepspeed_scheduler_next_to_one_chosen_in_code():
    cfg = ("zero3_offload.json", json.dumps({"train_micro_batch_size_per_gpu": "auto", "scheduler": {
        "type": "WarmupLR", "params": {"warmup_num_steps": "auto"}}, "zero_optimization": {"stage": 3}}))
    cmd = "deepspeed train.py --deepspeed zero3_offload.json --output_dir out --lr_scheduler_type cosine"
    assert "ds-scheduler-overrides" in found(cfg, command=cmd)
    assert "ds-scheduler-overrides" not in found(cfg, command=cmd.replace(" --lr_scheduler_type cosine", ""))
    acc = ("train.py", "from accelerate import Accelerator\naccelerator = Accelerator()\n"
                       "sched = get_scheduler('cosine', optimizer=opt, num_training_steps=n)\n"
                       "model, opt, sched = accelerator.prepare(model, opt, sched)\n")
    assert found(cfg, acc)["ds-scheduler-overrides"] == ["FAIL"]


LR_STEPS = """
import math
from accelerate import Accelerator
accelerator = Accelerator()
train_dataloader = DataLoader(ds, batch_size=8)
{counted}
lr_scheduler = get_scheduler("cosine", optimizer=opt, num_training_steps={steps})
model, opt, train_dataloader, lr_scheduler = accelerator.prepare(model, opt, train_dataloader, lr_scheduler)
"""
SHARDED = """
if args.max_train_steps is None:
    per_process = math.ceil(len(train_dataloader) / accelerator.num_processes)
    steps = args.num_train_epochs * math.ceil(per_process / args.gradient_accumulation_steps) * accelerator.num_processes
else:
    steps = args.max_train_steps * accelerator.num_processes
"""


WHOLE = """
num_update_steps_per_epoch = math.ceil(len(train_dataloader) / args.gradient_accumulation_steps)
if args.max_train_steps is None:
    args.max_train_steps = args.num_train_epochs * num_update_steps_per_epoch
"""


def test_scheduler_length_counted_before_prepare_shards_the_loader():
    buggy = LR_STEPS.format(counted=WHOLE, steps="args.max_train_steps * accelerator.num_processes")
    assert "lr-steps-from-dataset-length" in found(("t.py", buggy))
    fixed = LR_STEPS.format(counted=SHARDED, steps="steps")  # huggingface/diffusers#8312's fix
    assert "lr-steps-from-dataset-length" not in found(("t.py", fixed))
    unmultiplied = LR_STEPS.format(counted=WHOLE, steps="args.max_train_steps")  # counted whole, stepped N times: right
    assert "lr-steps-from-dataset-length" not in found(("t.py", unmultiplied))


def test_syncbn_with_a_ddp_wrapper_function_is_the_distributed_branch():
    src = "if RANK == -1:\n    model = torch.nn.DataParallel(model)\nif RANK != -1:\n" \
          "    model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)\n    model = smart_DDP(model)\n"
    assert "syncbn-without-ddp" not in found(("t.py", src))


def test_a_fixed_set_device_under_a_launcher_of_several_ranks():
    script = ("train.py", "import torch, torch.distributed as dist\ntorch.cuda.set_device(0)\n"
                          "dist.init_process_group('nccl', timeout=t)\n")
    assert found(script, command="torchrun --nproc-per-node=4 train.py")["same-device-every-rank"] == ["FAIL"]
    assert "same-device-every-rank" not in found(script, command="torchrun --nproc-per-node=1 train.py")
    branch = ("train.py", "import os, torch, torch.distributed as dist\nlocal_rank = int(os.environ.get('LOCAL_RANK', -1))\n"
                          "if local_rank == -1:\n    torch.cuda.set_device(0)\nelse:\n    torch.cuda.set_device(local_rank)\n"
                          "dist.init_process_group('nccl', timeout=t)\n")
    assert "same-device-every-rank" not in found(branch, command="torchrun --nproc-per-node=4 train.py")


def test_save_state_gated_so_that_deepspeed_and_fsdp_ranks_all_enter():
    src = ("from accelerate import Accelerator, DeepSpeedPlugin\naccelerator = Accelerator()\nif {gate}:\n"
           "    accelerator.save_state(p)\n")
    assert "rank-gated-collective" in found(("t.py", src.format(gate="accelerator.is_main_process")))
    # a script that never names DeepSpeed or FSDP runs under DDP, where save_state gathers nothing (diffusers' pattern)
    ddp = src.replace(", DeepSpeedPlugin", "")
    assert found(("t.py", ddp.format(gate="accelerator.is_main_process")))["rank-gated-collective"] == ["INFO"]
    ok = "accelerator.is_main_process or accelerator.distributed_type == DistributedType.DEEPSPEED"
    assert "rank-gated-collective" not in found(("t.py", src.format(gate=ok)))
