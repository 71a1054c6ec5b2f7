"""runbook lint changes made on the nineteenth blind set (tests/data/lint/blind19), each with its violation and its
look-alike."""

from __future__ import annotations

import textwrap

from helpers.lint import lint_texts, markdown_shell


def ids(*files: tuple[str, str]) -> list[str]:
    return [f.id for f in lint_texts([(n, textwrap.dedent(t)) for n, t in files]) if f.status != "OK"]


def test_forward_through_the_module_inside_ddp_then_backward():
    text = """
    import torch
    from torch.nn.parallel import DistributedDataParallel
    def train(model, batches, opt):
        model = DistributedDataParallel(model, device_ids=[0])
        for x, y in batches:
            out = model.module.decode(model.module.encode(x))
            loss = (out - y).pow(2).mean()
            loss.backward()
            opt.step()
    """
    assert "ddp-bypassed" in ids(("train.py", text))
    through = text.replace("model.module.decode(model.module.encode(x))", "model(x)")
    assert "ddp-bypassed" not in ids(("train.py", through))
    evaluation = text.replace("            loss.backward()\n", "")
    assert "ddp-bypassed" not in ids(("train.py", evaluation))


def test_a_launch_check_with_none_is_the_same_on_every_rank():
    """speechbrain: `os.environ.get("RANK") is not None` says whether torchrun started the run, alike on every rank."""
    text = """
    import os, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    class Brain:
        def __init__(self):
            self.distributed_launch = os.environ.get("RANK") is not None
        def wrap(self, module):
            if self.distributed_launch:
                module = DDP(module)
            return module
    """
    assert "rank-gated-collective" not in ids(("core.py", text))
    gated = text.replace("if self.distributed_launch:", "if int(os.environ['RANK']) == 0:")
    assert "rank-gated-collective" in ids(("core.py", gated))


def test_accelerator_prepare_of_a_model_on_the_main_process_only():
    text = """
    from accelerate import Accelerator
    accelerator = Accelerator()
    model, optimizer = accelerator.prepare(model, optimizer)
    if accelerator.is_main_process:
        model = accelerator.unwrap_model(model)
        model.save_pretrained("out")
        model = accelerator.prepare(model)
    """
    assert "rank-gated-collective" in ids(("train.py", text))
    outside = text.replace("        model = accelerator.prepare(model)\n", "model = accelerator.prepare(model)\n")
    assert "rank-gated-collective" not in ids(("train.py", outside))


def test_a_distributed_sampler_seeded_per_rank():
    text = """
    import time, torch.distributed as dist
    from torch.utils.data.distributed import DistributedSampler
    seed = int(time.time()) % (2**31) * dist.get_rank()
    sampler = DistributedSampler(dataset, shuffle=True, seed=seed)
    """
    assert "sampler-seed-per-rank" in ids(("train.py", text))
    shared = text.replace("int(time.time()) % (2**31) * dist.get_rank()", "args.seed")
    assert "sampler-seed-per-rank" not in ids(("train.py", shared))


def test_a_rank_slicing_sampler_that_shuffles_with_the_global_rng():
    text = """
    import torch
    from torch.utils.data.distributed import DistributedSampler
    class StatefulSampler(DistributedSampler):
        def __iter__(self):
            indices = torch.randperm(len(self.dataset)).tolist()
            return iter(indices[self.rank:self.total_size:self.num_replicas])
    """
    assert "sampler-rng-differs" in ids(("data.py", text))
    seeded = text.replace("torch.randperm(len(self.dataset))", "torch.randperm(len(self.dataset), generator=g)")
    assert "sampler-rng-differs" not in ids(("data.py", seeded))


def test_a_sharded_loader_read_on_rank_zero_only():
    text = """
    import torch, torch.distributed as dist
    from torch.utils.data.distributed import DistributedSampler
    val_sampler = DistributedSampler(val_dataset, shuffle=False)
    val_loader = torch.utils.data.DataLoader(val_dataset, batch_size=8, sampler=val_sampler)
    for epoch in range(3):
        if dist.get_rank() == 0:
            acc1 = validate(val_loader, model)
    """
    assert "eval-shard-unreduced" in ids(("main.py", text))
    every = text.replace("        if dist.get_rank() == 0:\n            acc1", "        acc1")
    assert "eval-shard-unreduced" not in ids(("main.py", every))
    progress = text.replace("            acc1 = validate(val_loader, model)",
                            "            it = tqdm(enumerate(val_loader))\n        else:\n            it = enumerate(val_loader)")
    assert "eval-shard-unreduced" not in ids(("main.py", progress))


def test_sklearn_fetchers_download_on_every_rank():
    text = """
    import os, sklearn.datasets
    is_main = int(os.environ.get("LOCAL_RANK", "0")) == 0
    data = sklearn.datasets.fetch_openml(data_id=44129, as_frame=True)
    """
    assert "download-every-rank" in ids(("finetune.py", text))
    one = text.replace('is_main = int(os.environ.get("LOCAL_RANK", "0")) == 0\n', "")
    assert "download-every-rank" not in ids(("finetune.py", one))


def test_a_barrier_only_on_the_branch_that_downloads_a_missing_file():
    text = """
    import os, torch, torch.distributed as dist
    def load(path, url):
        if os.path.exists(path):
            state = torch.load(path, map_location="cpu")
        else:
            if dist.get_rank() == 0:
                state = torch.hub.load_state_dict_from_url(url, model_dir=os.path.dirname(path))
                dist.barrier()
            else:
                dist.barrier()
                state = torch.load(path, map_location="cpu")
        return state
    """
    assert "collective-in-data-dependent-branch" in ids(("backbone.py", text))
    resume = """
    import os, torch.distributed as dist
    def resume(engine, path):
        if os.path.exists(path):
            engine.load_checkpoint(path)
            dist.barrier()
    """
    assert "collective-in-data-dependent-branch" not in ids(("train.py", resume))


def test_lightning_hooks_write_on_every_rank_under_a_ddp_strategy():
    text = """
    import torch
    import lightning.pytorch as pl
    from lightning.pytorch.strategies.ddp import DDPStrategy
    class Model(pl.LightningModule):
        def on_train_end(self):
            self.save_checkpoints()
        def save_checkpoints(self):
            torch.save(self.state_dict(), "G_last.pth")
    trainer = pl.Trainer(strategy=DDPStrategy(find_unused_parameters=True))
    """
    assert "write-on-every-rank" in ids(("train.py", text))
    gated = text.replace("            self.save_checkpoints()", "            if self.global_rank == 0:\n"
                                                                  "                self.save_checkpoints()")
    assert "write-on-every-rank" not in ids(("train.py", gated))
    told = """
    from torch.nn.parallel import DistributedDataParallel as DDP
    strategy.save_model(actor, path, only_rank0=True)
    """
    assert "write-on-every-rank" not in ids(("train.py", told))


def test_a_raw_scheduler_stepped_inside_accumulate():
    text = """
    from accelerate import Accelerator
    from transformers import get_scheduler
    accelerator = Accelerator(gradient_accumulation_steps=4)
    lr_scheduler = get_scheduler("cosine", optimizer=optimizer, num_warmup_steps=10, num_training_steps=1000)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:
        with accelerator.accumulate(model):
            accelerator.backward(model(batch).loss)
            optimizer.step()
            lr_scheduler.step()
    """
    assert "scheduler-steps-per-microbatch" in ids(("train.py", text))
    prepared = text.replace("accelerator.prepare(model, optimizer, loader)",
                            "accelerator.prepare(model, optimizer, loader, lr_scheduler)")
    assert "scheduler-steps-per-microbatch" not in ids(("train.py", prepared.replace("model, optimizer, loader =",
                                                                                     "model, optimizer, loader, lr_scheduler =")))
    synced = text.replace("            lr_scheduler.step()", "            if accelerator.sync_gradients:\n"
                                                              "                lr_scheduler.step()")
    assert "scheduler-steps-per-microbatch" not in ids(("train.py", synced))


def test_a_buffer_registered_after_the_model_was_prepared():
    text = """
    import torch
    from accelerate import Accelerator
    accelerator = Accelerator()
    model, optimizer = accelerator.prepare(model, optimizer)
    model.register_buffer("_classes_", torch.tensor([1, 2]))
    """
    assert "ddp-buffer-after-wrap" in ids(("main.py", text))
    before = """
    import torch
    from accelerate import Accelerator
    accelerator = Accelerator()
    model.register_buffer("_classes_", torch.tensor([1, 2]))
    model, optimizer = accelerator.prepare(model, optimizer)
    """
    assert "ddp-buffer-after-wrap" not in ids(("main.py", before))


def test_a_dataset_processed_on_the_main_process_only():
    text = """
    from accelerate import Accelerator
    accelerator = Accelerator()
    def main(ds):
        if accelerator.is_main_process:
            ds = ds.filter(keep, input_columns=["length"])
        loader = make_loader(ds)
    """
    assert "rank-gated-data-setup" in ids(("run.py", text))
    first = text.replace("        if accelerator.is_main_process:\n            ds = ds.filter",
                         "        with accelerator.main_process_first():\n            ds = ds.filter")
    assert "rank-gated-data-setup" not in ids(("run.py", first))


def test_markdown_shell_blocks_are_launch_lines():
    readme = "# Train\n\nRun it:\n\n```bash\ndeepspeed --num_gpus=N 1-pretrain.py\n```\n\n```python\nx = 1\n```\n"
    blocks = markdown_shell(readme)
    assert len(blocks) == 1 and blocks[0].splitlines()[5] == "deepspeed --num_gpus=N 1-pretrain.py"
    script = """
    import argparse, os, torch.distributed as dist
    parser = argparse.ArgumentParser()
    parser.add_argument("--epochs", type=int)
    args = parser.parse_args()
    ddp = int(os.environ.get("RANK", -1)) != -1
    if ddp:
        dist.init_process_group("nccl")
    """
    found = ids(("README.md", readme), ("1-pretrain.py", script))
    assert "local-rank-arg-under-launcher" in found and "shell-syntax-error" not in found
    plain = readme.replace("deepspeed --num_gpus=N 1-pretrain.py", "python 1-pretrain.py")
    assert "env-init-without-launcher" not in ids(("README.md", plain), ("1-pretrain.py", script))


def test_a_script_that_launches_itself():
    text = """
    import argparse, os, subprocess
    def parse_args():
        parser = argparse.ArgumentParser()
        parser.add_argument("--config")
        parser.add_argument("--num-gpus", type=int, default=1)
        return parser.parse_args()
    def main():
        args = parse_args()
        script_path = os.path.abspath(__file__)
        cmd = ["deepspeed", f"--num_gpus={args.num_gpus}", script_path, "--config", args.config]
        subprocess.run(cmd)
    """
    assert "local-rank-arg-under-launcher" in ids(("train.py", text))
    takes = text.replace('parser.add_argument("--config")', 'parser.add_argument("--config")\n'
                         '        parser.add_argument("--local_rank", type=int, default=-1)')
    assert "local-rank-arg-under-launcher" not in ids(("train.py", takes))
    misplaced = takes.replace('f"--num_gpus={args.num_gpus}", script_path',
                              'f"--num_gpus={args.num_gpus}", "--deepspeed_config", "ds.json", script_path')
    assert "launcher-option-unknown" in ids(("train.py", misplaced))


def test_fsdp_mixed_precision_with_param_and_reduce_dtypes_set():
    text = """
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision
    mp = MixedPrecision(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    model = FSDP(model, mixed_precision=mp, auto_wrap_policy=policy)
    """
    assert "fsdp-partial-mixed-precision" not in ids(("train.py", text))
    assert "fsdp-partial-mixed-precision" in ids(("train.py", text.replace(", reduce_dtype=torch.float32", "")))
