"""runbook lint changes made on the seventeenth blind set (tests/data/lint/blind17), each with its violation and its
look-alike."""

from __future__ import annotations

import textwrap

from helpers.lint import contract_rules, lint_texts
from helpers.lint.python_rules import PythonLinter, lint_python


def ids(*files: tuple[str, str]) -> list[str]:
    return [f.id for f in lint_texts([(n, textwrap.dedent(t)) for n, t in files]) if f.status != "OK"]


def test_a_rank_kept_in_a_config_dict_gates_the_writes():
    text = """
    import torch, torch.distributed as dist
    class Trainer:
        def save_checkpoint(self, path):
            torch.save(self.model.state_dict(), path)
        def _check_save_interval(self):
            self.save_checkpoint("ckpt.pkl")
        def _train_epoch(self):
            if self.config["rank"] == 0:
                self._check_save_interval()
    dist.init_process_group("nccl")
    """
    assert "write-on-every-rank" not in ids(("train.py", text))
    ungated = text.replace('if self.config["rank"] == 0:', 'if self.config["steps"] > 0:')
    assert "write-on-every-rank" in ids(("train.py", ungated))


def test_args_rank_that_is_also_spelled_local_rank_is_the_local_rank():
    text = """
    import argparse, torch, torch.distributed as dist
    parser = argparse.ArgumentParser()
    parser.add_argument("--rank", "--local_rank", default=0, type=int)
    args = parser.parse_args()
    torch.cuda.set_device(args.rank)
    dist.init_process_group("nccl")
    """
    assert "device-from-global-rank" not in ids(("train.py", text))
    plain = text.replace('"--rank", "--local_rank"', '"--rank"')
    assert "device-from-global-rank" in ids(("train.py", plain))


def test_a_rank0_folder_and_an_every_rank_read_of_another_field_of_args():
    text = """
    import os, torch.distributed as dist
    from diffusers import AutoencoderKL
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    if rank == 0:
        os.makedirs(args.results_dir, exist_ok=True)
        with open(f"{args.results_dir}/log.txt", "w") as f:
            f.write("start")
    vae = AutoencoderKL.from_pretrained(args.pretrained_model_path, subfolder="vae")
    """
    assert "rank-gated-object-used" not in ids(("train.py", text))
    same = text.replace("from_pretrained(args.pretrained_model_path", "from_pretrained(args.results_dir")
    assert "rank-gated-object-used" in ids(("train.py", same))


def test_the_wrapper_reaches_a_model_through_the_prepare_results_index():
    text = """
    from accelerate import Accelerator
    from diffusers import FluxTransformer2DModel
    accelerator = Accelerator()
    transformer = FluxTransformer2DModel.from_pretrained("x")
    results = accelerator.prepare(transformer, optimizer, loader)
    transformer = results[0]
    dtype = transformer.dtype
    """
    assert "ddp-wrapper-attribute" in ids(("train.py", text))
    unwrapped = text.replace("dtype = transformer.dtype", "dtype = accelerator.unwrap_model(transformer).dtype")
    assert "ddp-wrapper-attribute" not in ids(("train.py", unwrapped))


def test_lightning_epoch_level_log_without_sync_dist():
    text = """
    import lightning as L
    class Model(L.LightningModule):
        def validation_step(self, batch, batch_idx):
            loss = self.loss(batch)
            self.log("val/loss", loss, prog_bar=True)
        def training_step(self, batch, batch_idx):
            loss = self.loss(batch)
            self.log("train/loss", loss, on_step=True)
            return loss
    """
    assert "metric-not-reduced" in ids(("model.py", text))
    synced = text.replace('self.log("val/loss", loss, prog_bar=True)', 'self.log("val/loss", loss, sync_dist=True)')
    assert "metric-not-reduced" not in ids(("model.py", synced))
    metric_object = text.replace('self.log("val/loss", loss, prog_bar=True)', 'self.log("val/acc", self.val_acc)')
    assert "metric-not-reduced" not in ids(("model.py", metric_object))


def test_a_collective_inside_a_sampler_iteration():
    text = """
    import torch
    class BucketSampler(torch.utils.data.Sampler):
        def __iter__(self):
            for batch in self.buckets():
                self.accelerator.wait_for_everyone()
                yield batch
    """
    assert "collective-in-sampler" in ids(("sampler.py", text))
    outside = text.replace("                self.accelerator.wait_for_everyone()\n", "") + \
        "    def sync(self):\n        self.accelerator.wait_for_everyone()\n"
    assert "collective-in-sampler" not in ids(("sampler.py", outside))


def test_module_read_on_a_prepared_model_that_may_be_unwrapped():
    text = """
    from accelerate import Accelerator
    accelerator = Accelerator()
    def train():
        print(model.module.h)
    model = accelerator.prepare(model)
    train()
    """
    assert "module-attr-without-ddp" in ids(("train.py", text))
    assert "module-attr-without-ddp" not in ids(("train.py", text.replace("model.module.h",
                                                                          "accelerator.unwrap_model(model).h")))
    guarded = text.replace("        print(model.module.h)",
                           "        if hasattr(model, 'module'):\n            print(model.module.h)")
    assert "module-attr-without-ddp" not in ids(("train.py", guarded))


def test_an_accumulation_flag_true_on_the_step_that_must_sync():
    text = """
    for iter_num in range(max_iters):
        is_accumulating = (iter_num + 1) % gradient_accumulation_steps == 0
        with fabric.no_backward_sync(model, enabled=is_accumulating):
            fabric.backward(loss_fn(model(x), y))
        if not is_accumulating:
            optimizer.step()
    """
    assert "no-sync-misaligned" in ids(("train.py", text))
    right = text.replace("% gradient_accumulation_steps == 0", "% gradient_accumulation_steps != 0")
    assert "no-sync-misaligned" not in ids(("train.py", right))


def test_an_attribute_accelerate_objects_do_not_have():
    rank = """
    import json
    class SaveHook:
        def save(self, path):
            rank = getattr(self.accelerator, "rank", 0)
            json.dump({}, open(f"{path}/state-{rank}.json", "w"))
    """
    assert "api-unknown-attribute" in ids(("hooks.py", rank))
    assert "api-unknown-attribute" not in ids(("hooks.py", rank.replace('"rank"', '"process_index"')))
    own = rank + "    def wrap(self):\n        self.accelerator.rank = 3\n"      # the project sets it itself
    assert "api-unknown-attribute" not in ids(("hooks.py", own))
    plugin = """
    import accelerate
    from accelerate.state import AcceleratorState
    def contexts():
        deepspeed_plugin = AcceleratorState() if accelerate.state.is_initialized() else None
        if deepspeed_plugin is None:
            return []
        return [deepspeed_plugin.zero3_init_context_manager(enable=False)]
    """
    assert "api-unknown-attribute" in ids(("train.py", plugin))
    fixed = plugin.replace("AcceleratorState() if", "AcceleratorState().deepspeed_plugin if")
    assert "api-unknown-attribute" not in ids(("train.py", fixed))


def test_a_ddp_model_passed_by_keyword_to_a_rank0_evaluation():
    """icefall: ``evaluate(model=model)`` under ``if rank == 0`` runs the DDP forward (a buffer broadcast) on one rank;
    the wrapped value is followed through keyword arguments as through positions, in one file and across files."""
    text = """
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    def evaluate(model, dl):
        with torch.no_grad():
            for b in dl:
                model(b)
    def train_one_epoch(model, dl, rank):
        for i, b in enumerate(dl):
            model(b).sum().backward()
            if rank == 0 and i % 10 == 0:
                evaluate(model=model, dl=dl)
    def run(rank, world_size):
        dist.init_process_group("nccl", rank=rank, world_size=world_size)
        torch.cuda.set_device(rank)
        model = DDP(torch.nn.Linear(2, 2).cuda(), device_ids=[rank])
        train_one_epoch(model=model, dl=[], rank=rank)
    """
    assert "rank-gated-collective" in ids(("train.py", text))
    unwrapped = text.replace("evaluate(model=model, dl=dl)", "evaluate(model=model.module, dl=dl)")
    assert "rank-gated-collective" not in ids(("train.py", unwrapped))
    other = text.replace("evaluate(model=model, dl=dl)", "evaluate(dl=dl, model=torch.nn.Linear(2, 2))")
    assert "rank-gated-collective" not in ids(("train.py", other))
    caller = """
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    from evalmod import evaluate
    dist.init_process_group("nccl")
    model = DDP(torch.nn.Linear(2, 2).cuda())
    evaluate([], model=model)
    """
    _got, fact = lint_python("train.py", textwrap.dedent(caller), (contract_rules.run,))
    assert fact.ddp_passed == {"evaluate": {"model"}}
    lib = "def evaluate(dl, model=None):\n    return model.module\n"
    linter = PythonLinter("evalmod.py", lib, ddp_params=fact.ddp_passed)
    assert list(linter.wrappers.w.params.values()) == [{"model": True}]


def test_a_rank_sharding_sampler_under_lightnings_default_sampler_replacement():
    """GPT-SoVITS: Lightning wraps a sampler that is not a DistributedSampler in its DistributedSamplerWrapper, so a
    bucket sampler that already shards by rank is sharded twice unless use_distributed_sampler=False."""
    sampler = """
    import torch.distributed as dist
    from torch.utils.data import Sampler
    class BucketSampler(Sampler):
        def __init__(self, dataset, batch_size):
            self.num_replicas = dist.get_world_size()
            self.rank = dist.get_rank()
        def __iter__(self):
            return iter(range(self.rank, 100, self.num_replicas))
    """
    module = """
    from torch.utils.data import DataLoader
    from bucket import BucketSampler
    def train_dataloader(ds):
        sampler = BucketSampler(ds, batch_size=8)
        return DataLoader(ds, batch_size=8, sampler=sampler)
    """
    train = """
    from lightning.pytorch import Trainer
    trainer = Trainer(devices=-1, strategy="ddp")
    """
    files = [("bucket.py", sampler), ("data.py", module), ("train.py", train)]
    assert "lightning-sampler-replaced" in ids(*files)
    off = train.replace('strategy="ddp"', 'strategy="ddp", use_distributed_sampler=False')
    assert "lightning-sampler-replaced" not in ids(*files[:2], ("train.py", off))
    plain = sampler.replace("self.num_replicas = dist.get_world_size()", "self.n = 1").replace(
        "self.rank = dist.get_rank()", "self.start = 0").replace("self.rank, 100, self.num_replicas", "self.start, 100")
    assert "lightning-sampler-replaced" not in ids(("bucket.py", plain), *files[1:])
    subclass = sampler.replace("from torch.utils.data import Sampler", "from torch.utils.data import DistributedSampler")
    subclass = subclass.replace("class BucketSampler(Sampler)", "class BucketSampler(DistributedSampler)")
    assert "lightning-sampler-replaced" not in ids(("bucket.py", subclass), *files[1:])


def test_a_plain_scheduler_stretched_by_the_world_size():
    """FastVideo: Accelerate's convention (steps x num_processes) on a scheduler that Accelerate does not step."""
    text = """
    import torch.distributed as dist
    from diffusers.optimization import get_scheduler
    class Pipeline:
        def __init__(self, args, optimizer):
            self.world_size = dist.get_world_size()
            self.lr_scheduler = get_scheduler(args.lr_scheduler, optimizer=optimizer,
                                              num_warmup_steps=args.lr_warmup_steps * self.world_size,
                                              num_training_steps=args.max_train_steps * self.world_size)
    """
    assert "lr-steps-from-dataset-length" in ids(("pipeline.py", text))
    plain = text.replace(" * self.world_size", "")
    assert "lr-steps-from-dataset-length" not in ids(("pipeline.py", plain))
    accelerate = text.replace("import torch.distributed as dist", "import torch.distributed as dist\n"
                              "from accelerate import Accelerator\naccelerator = Accelerator()")
    assert "lr-steps-from-dataset-length" not in ids(("pipeline.py", accelerate))
