"""runbook lint changes made on the eighteenth blind set (tests/data/lint/blind18), each with its violation and its
look-alike."""

from __future__ import annotations

import textwrap

from helpers.lint import lint_texts


def ids(*files: tuple[str, str]) -> list[str]:
    return [f.id for f in lint_texts([(n, textwrap.dedent(t)) for n, t in files]) if f.status != "OK"]


def test_init_process_group_without_a_backend_is_nccl_for_cuda_work():
    text = """
    import torch, torch.distributed as dist
    dist.init_process_group()
    model = torch.nn.Linear(2, 2).to_empty(device=torch.device("cuda"))
    """
    assert "nccl-no-device-binding" in ids(("train.py", text))
    bound = text.replace("dist.init_process_group()", "torch.cuda.set_device(0)\ndist.init_process_group()")
    assert "nccl-no-device-binding" not in ids(("train.py", bound))
    gloo = text.replace("init_process_group()", "init_process_group('gloo')").replace('"cuda"', '"cpu"')
    assert "nccl-no-device-binding" not in ids(("train.py", gloo))


def test_a_shuffling_sampler_made_in_one_file_and_the_epoch_loop_in_another():
    loader = """
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler
    def make_loader(ds):
        dist.barrier()
        sampler = DistributedSampler(ds, dist.get_world_size(), dist.get_rank(), shuffle=True)
        args = {"dataset": ds}
        args.update({"sampler": sampler})
        return DataLoader(**args)
    """
    loop = """
    def fit(trainer, loaders, total_epoch):
        for epoch in range(1, total_epoch + 1):
            for k, loader in loaders.items():
                trainer.run_one_epoch(loader)
    """
    assert "sampler-no-set-epoch" in ids(("train.py", loader), ("processing_epoch.py", loop))
    fixed = loop.replace("trainer.run_one_epoch(loader)", "loader.sampler.set_epoch(epoch)\n"
                         "                trainer.run_one_epoch(loader)")
    assert "sampler-no-set-epoch" not in ids(("train.py", loader), ("processing_epoch.py", fixed))
    assert "sampler-no-set-epoch" not in ids(("train.py", loader))  # no epoch loop in view


def test_a_sampler_handed_to_an_imported_function_may_get_its_epoch_there():
    """pytorch/examples' FSDP T5: train(..., sampler=sampler1) comes from a utility module that calls set_epoch."""
    text = """
    import torch.distributed as dist
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler
    from utils import train
    dist.init_process_group("nccl")
    sampler1 = DistributedSampler(ds, rank=0, num_replicas=2, shuffle=True)
    loader = DataLoader(ds, sampler=sampler1)
    for epoch in range(1, 10):
        train(model, loader, epoch, sampler=sampler1)
    """
    assert "sampler-no-set-epoch" not in ids(("train.py", text))
    kept = text.replace("train(model, loader, epoch, sampler=sampler1)", "train(model, loader, epoch)")
    assert "sampler-no-set-epoch" in ids(("train.py", kept))


def test_fsdp_config_checked_by_accelerates_plugin():
    config = """
    compute_environment: LOCAL_MACHINE
    distributed_type: FSDP
    fsdp_config:
      fsdp_auto_wrap_policy: "SIZE"
      fsdp_min_num_params: 1000000
      fsdp_sharding_strategy: FULL_SHARD
      fsdp_sync_module_states: true
    mixed_precision: bf16
    num_machines: 1
    num_processes: 8
    """
    assert "acc-invalid-config" in ids(("fsdp.yaml", config))
    good = config.replace('"SIZE"', "SIZE_BASED_WRAP")
    assert "acc-invalid-config" not in ids(("fsdp.yaml", good))


def test_per_rank_outputs_from_a_loader_every_rank_reads_whole():
    text = """
    import os, torch, torch.distributed as dist
    from torch.utils.data import DataLoader
    local_rank = int(os.environ["LOCAL_RANK"])
    dist.init_process_group("nccl")
    loader = DataLoader(dataset, batch_size=8, shuffle=False)
    for i, batch in enumerate(loader):
        torch.save(batch, f"out/r{local_rank}_{i:05d}.pth")
    """
    assert "sampler-not-distributed" in ids(("extract.py", text))
    shared = text.replace('f"out/r{local_rank}_{i:05d}.pth"', 'f"out/{i:05d}.pth"')
    assert "sampler-not-distributed" not in ids(("extract.py", shared))
    split = text.replace("DataLoader(dataset,", "DataLoader(dataset[local_rank::8],")
    assert "sampler-not-distributed" not in ids(("extract.py", split))


def test_a_project_ddp_wrap_helper_returns_the_ddp_model():
    text = """
    import torch
    from dist import ddp_setup, ddp_wrap
    def eval_dev(model, batches):
        with torch.no_grad():
            return sum(model(b).sum() for b in batches)
    def main():
        ctx = ddp_setup("cuda")
        model = ddp_wrap(torch.nn.Linear(2, 2), ctx)
        model(1).sum().backward()
        if ctx.is_main:
            eval_dev(model, [])
    """
    assert "rank-gated-collective" in ids(("train.py", text))
    assert "rank-gated-collective" not in ids(("train.py", text.replace("ddp_wrap(", "make_model(")))
    assert "ddp-wrapper-attribute" not in ids(("train.py", text + "    print(ctx.is_main)\n"))


def test_an_augmented_assignment_reads_the_attribute_first():
    text = """
    class Trainer:
        def __init__(self, args):
            self.args = args
            self.setup()
        def setup(self):
            self.gradient_accumulation_steps //= 2
    """
    assert "undefined-attribute" in ids(("train.py", text))
    set_first = text.replace("self.args = args", "self.args = args\n        self.gradient_accumulation_steps = 8")
    assert "undefined-attribute" not in ids(("train.py", set_first))


def test_a_scheduler_length_from_max_train_steps_under_accelerate():
    text = """
    import argparse
    from accelerate import Accelerator
    from diffusers.optimization import get_scheduler
    parser = argparse.ArgumentParser()
    parser.add_argument("--max_train_steps", type=int, default=None)
    args = parser.parse_args()
    accelerator = Accelerator()
    lr_scheduler = get_scheduler("cosine", optimizer=optimizer, num_warmup_steps=10,
                                 num_training_steps=args.max_train_steps)
    unet, optimizer, lr_scheduler = accelerator.prepare(unet, optimizer, lr_scheduler)
    """
    assert "lr-steps-from-dataset-length" in ids(("train.py", text))
    scaled = text.replace("num_training_steps=args.max_train_steps",
                          "num_training_steps=args.max_train_steps * accelerator.num_processes")
    assert "lr-steps-from-dataset-length" not in ids(("train.py", scaled))
    split = text.replace("Accelerator()", "Accelerator(split_batches=True)")
    assert "lr-steps-from-dataset-length" not in ids(("train.py", split))
    deepspeed = text.replace("from accelerate import Accelerator", "from accelerate import Accelerator\n"
                             "from accelerate.utils import DummyScheduler")
    assert "lr-steps-from-dataset-length" not in ids(("train.py", deepspeed))


def test_raw_wandb_log_where_the_run_exists_on_rank_zero_only():
    module = """
    import wandb
    import lightning as L
    class Model(L.LightningModule):
        def validation_step(self, batch, batch_idx):
            if batch_idx == 0:
                wandb.log({"x": 1})
    """
    trainer = """
    import lightning as L
    from lightning.pytorch.loggers import WandbLogger
    trainer = L.Trainer(logger=WandbLogger(project="p"), strategy="ddp", devices=4)
    """
    assert "main-process-object-every-rank" in ids(("model.py", module), ("train.py", trainer))
    gated = module.replace("if batch_idx == 0:", "if batch_idx == 0 and self.global_rank == 0:")
    assert "main-process-object-every-rank" not in ids(("model.py", gated), ("train.py", trainer))
    one = trainer.replace(', strategy="ddp", devices=4', "")
    assert "main-process-object-every-rank" not in ids(("model.py", module), ("train.py", one))
    own_init = module.replace("import wandb", "import wandb\nwandb.init(project='p')")
    assert "main-process-object-every-rank" not in ids(("model.py", own_init), ("train.py", trainer))


def test_a_launcher_option_its_own_parser_rejects():
    assert "launcher-option-unknown" in ids(("run.sh", "torchrun -\u2014nproc-per-node=8 train.py --lr 1\n"))
    assert "launcher-option-unknown" in ids(("run.sh", "torchrun --nproc 8 train.py\n"))  # ambiguous prefix
    assert "launcher-option-unknown" in ids(("run.sh", "accelerate launch --num_procs 8 train.py\n"))
    for fine in ("torchrun --nproc_per_node=8 --nnodes 1 train.py --whatever 1\n",
                 "python -m torch.distributed.launch --use_env --nproc_per_node=2 train.py\n",
                 "accelerate launch --num_processes 8 --mixed_precision bf16 train.py\n",
                 "torchrun $EXTRA --nproc_per_node=8 train.py\n",
                 "torchrun --signals-to-handle SIGTERM --nproc_per_node 2 train.py\n"):
        assert "launcher-option-unknown" not in ids(("run.sh", fine)), fine


def test_srun_with_an_interpreter_and_no_program():
    job = "#!/bin/bash\n#SBATCH --nodes=1\nsrun --cpu_bind=v --accel-bind=gn python \n\ndeepspeed train.py\n"
    assert "srun-no-script" in ids(("job.sh", job))
    for fine in ("srun python train.py", "srun python -c 'print(1)'", "srun python -m pkg.train",
                 "srun --ntasks 2 python -u train.py", "srun bash run.sh"):
        assert "srun-no-script" not in ids(("job.sh", f"#!/bin/bash\n#SBATCH --nodes=1\n{fine}\n")), fine


def test_torch_clip_grad_norm_on_an_fsdp1_module():
    text = """
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    class Trainer:
        def __init__(self, policy):
            self.policy = FSDP(policy)
        def clip(self):
            return torch.nn.utils.clip_grad_norm_(self.policy.parameters(), 1.0)
    """
    assert "fsdp-clip-grad-norm" in ids(("trainers.py", text))
    own = text.replace("torch.nn.utils.clip_grad_norm_(self.policy.parameters(), 1.0)", "self.policy.clip_grad_norm_(1.0)")
    assert "fsdp-clip-grad-norm" not in ids(("trainers.py", own))
    no_shard = text.replace("FSDP(policy)", "FSDP(policy, sharding_strategy=ShardingStrategy.NO_SHARD)")
    assert "fsdp-clip-grad-norm" not in ids(("trainers.py", no_shard))
    other_fn = """
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    def wrap(model):
        model = FSDP(model)
        return model
    def step(model, engine):
        if engine == "torch_ddp":
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    """
    assert "fsdp-clip-grad-norm" not in ids(("utils.py", other_fn))


def test_the_local_part_read_on_rank_zero_after_a_gather():
    text = """
    import json, torch
    def evaluate(args, predictions):
        all_predictions = [None] * args.world_size
        torch.distributed.all_gather_object(all_predictions, predictions)
        all_predictions = {k: v for d in all_predictions for k, v in d.items()}
        if args.rank != 0:
            return
        with open("results.json", "w") as f:
            f.write(json.dumps([predictions[k] for k in all_predictions]))
    """
    assert "collective-result-discarded" in ids(("evaluate.py", text))
    fixed = text.replace("predictions[k] for k", "all_predictions[k] for k")
    assert "collective-result-discarded" not in ids(("evaluate.py", fixed))
    gather_object = """
    import torch.distributed as dist
    def gather(data, dst=0):
        if dist.get_rank() == dst:
            output = [None] * dist.get_world_size()
            dist.gather_object(data, output, dst=dst)
            return output
        dist.gather_object(data, None, dst=dst)
        return []
    """
    assert "collective-result-discarded" not in ids(("comm.py", gather_object))


def test_ddp_around_a_model_frozen_earlier_in_the_loop():
    text = """
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    def evaluate_all(model, swas, local_rank):
        for swa in swas:
            load(model, swa)
            ddp_model = DDP(model, device_ids=[local_rank])
            run(ddp_model)
            for param in model.parameters():
                param.requires_grad = False
    """
    assert "ddp-no-trainable-params" in ids(("run_train.py", text))
    thawed = text.replace("load(model, swa)", "load(model, swa)\n        model.requires_grad_(True)")
    assert "ddp-no-trainable-params" not in ids(("run_train.py", thawed))
    part = text.replace("model.parameters():\n", "model.encoder.parameters():\n")
    assert "ddp-no-trainable-params" not in ids(("run_train.py", part))


def test_a_rank_from_scheduler_variables_only_under_torchrun():
    helper = """
    import os, torch, torch.distributed as dist
    def setup():
        rank = int(os.environ.get("SLURM_PROCID", 0))
        world_size = int(os.environ.get("SLURM_NTASKS", 1))
        os.environ["RANK"] = str(rank)
        dist.init_process_group(backend="nccl", init_method="env://", world_size=world_size, rank=rank)
    """
    launch = "python -m torch.distributed.launch --nproc_per_node=$1 train.py\n"
    assert "launcher-env-ignored" in ids(("dist_helper.py", helper), ("train.sh", launch))
    reads = helper.replace('int(os.environ.get("SLURM_PROCID", 0))',
                           'int(os.environ.get("RANK", os.environ.get("SLURM_PROCID", 0)))')
    assert "launcher-env-ignored" not in ids(("dist_helper.py", reads), ("train.sh", launch))
    srun = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=4\nsrun python train.py\n"
    assert "launcher-env-ignored" not in ids(("dist_helper.py", helper), ("job.sh", srun))
