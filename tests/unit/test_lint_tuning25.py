"""runbook lint changes made on the twenty-fifth blind set (tests/data/lint/blind25), each with its violation and its
look-alike."""

from __future__ import annotations

import textwrap

from helpers.lint import lint_texts


def found(*files: tuple[str, str]) -> list[tuple[str, str]]:
    """``(rule id, status)`` of every finding that is not OK."""
    return [(f.id, f.status) for f in lint_texts([(n, textwrap.dedent(t)) for n, t in files]) if f.status != "OK"]


def ids(*files: tuple[str, str]) -> list[str]:
    return [i for i, _s in found(*files)]


DINO = """
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel

class All(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.classifiers_dict = nn.ModuleDict(d)

def remove_ddp_wrapper(m):
    return m.module if isinstance(m, DistributedDataParallel) else m

def evaluate(classifiers):
    return list(classifiers.classifiers_dict)

def main(d):
    classifiers = DistributedDataParallel(All(d))
    evaluate(remove_ddp_wrapper(classifiers))
    evaluate({call})
"""


def test_a_call_that_takes_the_wrapper_off_does_not_pass_the_wrapper_on():
    """dinov2's linear eval hands remove_ddp_wrapper(model) to its evaluation; the bare wrapper still counts."""
    assert "ddp-wrapper-attribute" not in ids(("eval.py", DINO.replace("{call}", "remove_ddp_wrapper(classifiers)")))
    assert "ddp-wrapper-attribute" in ids(("eval.py", DINO.replace("{call}", "classifiers")))


PREPARED = """
from accelerate import Accelerator
accelerator = Accelerator()

def main(optimizer, loader):
    transformer = CogVideoXTransformer3DModel.from_pretrained("THUDM/CogVideoX-2b", subfolder="transformer")
    transformer, optimizer, loader = accelerator.prepare(transformer, optimizer, loader)
    {line}
"""


def test_a_hasattr_dispatch_on_a_prepared_model_is_the_author_s_own():
    """diffusers' cogvideox: transformer.module.config if hasattr(transformer, "module") else transformer.config."""
    guarded = 'cfg = transformer.module.config if hasattr(transformer, "module") else transformer.config'
    assert "ddp-wrapper-attribute" not in ids(("train.py", PREPARED.replace("{line}", guarded)))
    in_test = "if transformer.config.in_channels == 8:\n        print(1)"  # the read is the test itself
    assert "ddp-wrapper-attribute" in ids(("train.py", PREPARED.replace("{line}", in_test)))
    none_check = 'print(f"{transformer.dtype}" if transformer else "none")'  # sd-scripts: not a dispatch
    assert "ddp-wrapper-attribute" in ids(("train.py", PREPARED.replace("{line}", none_check)))


LIT = """
import lightning.pytorch as pl
import torch.nn.functional as F

class Model(pl.LightningModule):
    def validation_step(self, batch, batch_idx):
        loss = F.mse_loss(self(batch), batch)
        self._log_all(loss, "val")

    def _log_all(self, loss, stage):
        self.log(f"{stage}/loss", loss, on_epoch=True)

    def configure_optimizers(self):
        opt = torch.optim.Adam(self.parameters())
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched(opt), "monitor": MONITOR}}
"""


def test_an_epoch_value_logged_without_sync_dist_warns_where_a_monitor_reads_it():
    """MEDS_EIC_AR: a helper of the step logs f"{stage}/loss" and the scheduler monitors "val/loss"; Lightning's
    own examples log a value nothing monitors (a note)."""
    assert ("metric-not-reduced", "WARN") in found(("module.py", LIT.replace("MONITOR", '"val/loss"')))
    assert ("metric-not-reduced", "INFO") in found(("module.py", LIT.replace("MONITOR", '"train/acc"')))
    synced = LIT.replace("on_epoch=True)", "on_epoch=True, sync_dist=True)").replace("MONITOR", '"val/loss"')
    assert "metric-not-reduced" not in ids(("module.py", synced))


def test_local_rank_as_rank_on_a_loopback_master_is_one_node():
    """Lightning's Fabric meta-learning example: MASTER_ADDR=127.0.0.1, init_process_group(rank=local_rank)."""
    src = """
    import os
    import torch.distributed as dist

    def main():
        local_rank = int(os.environ["LOCAL_RANK"])
        world_size = int(os.environ["WORLD_SIZE"])
        {addr}
        dist.init_process_group("gloo", rank=local_rank, world_size=world_size)
    """
    assert "local-rank-as-global-rank" not in ids(("t.py", src.replace("{addr}", 'os.environ["MASTER_ADDR"] = "127.0.0.1"')))
    assert "local-rank-as-global-rank" in ids(("t.py", src.replace("{addr}", 'os.environ["MASTER_ADDR"] = os.environ["HEAD"]')))


def test_a_sampler_seed_set_per_rank_in_another_file_has_one_rule():
    """mlcommons/training#625: main.py sets flags.seed = worker_seeds[local_rank]; data_loader.py seeds the sampler."""
    main = """
    from data_loader import get_loader
    def main(flags, local_rank):
        worker_seeds = setup_seeds(flags.seed)
        flags.seed = worker_seeds[local_rank]
        get_loader(flags)
    """
    loader = """
    from torch.utils.data import DistributedSampler
    def get_loader(flags, ds):
        return DistributedSampler(ds, seed=flags.seed, drop_last=True)
    """
    got = ids(("main.py", main), ("data_loader.py", loader))
    assert "sampler-seed-per-rank" in got and "rank-split-differs" not in got
    assert "sampler-seed-per-rank" not in ids(("main.py", main.replace("flags.seed = worker", "flags.w = worker")),
                                             ("data_loader.py", loader))


DADC = """
import torch
from torch.utils.data import IterableDataset

class Shards(IterableDataset):
    def __init__(self, n, seed=0):
        self.n, self.seed, self.epoch = n, seed, 0

    def set_epoch(self, epoch):
        self.epoch = epoch

    def __iter__(self):
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        yield from torch.randperm(self.n, generator=g).tolist()
        self.set_epoch(self.epoch + 1)
"""
PLAN = """
import pytorch_lightning as pl

class Plan(pl.LightningModule):
    def training_step(self, batch, batch_idx):
        return self.model(batch)
"""


def test_an_iterable_dataset_s_set_epoch_that_lightning_never_calls():
    """cellarium-ml#40: Lightning sets the sampler's epoch, not an iterable dataset's; the fix calls it itself."""
    assert "sampler-no-set-epoch" in ids(("dataset.py", DADC), ("plan.py", PLAN))
    hook = PLAN + ("\n    def on_train_epoch_start(self):\n"
                   "        self.trainer.train_dataloader.dataset.set_epoch(self.current_epoch)\n")
    assert "sampler-no-set-epoch" not in ids(("dataset.py", DADC), ("plan.py", hook))
    assert "sampler-no-set-epoch" not in ids(("dataset.py", DADC))  # no Lightning loop linted: a loop may call it


def test_makedirs_on_every_rank_without_exist_ok():
    """RWKV-infctx-trainer#31: if not os.path.exists(d): os.makedirs(d) at start-up on every srun task."""
    src = """
    import os
    from lightning.pytorch.cli import LightningCLI

    def prepare(d):
        {body}

    prepare("ckpt")
    LightningCLI()
    """
    assert ("write-on-every-rank", "INFO") in found(("t.py", src.replace("{body}", "if not os.path.exists(d):\n"
                                                                                  "            os.makedirs(d)")))
    assert ("write-on-every-rank", "FAIL") in found(("t.py", src.replace("{body}", "os.makedirs(d)")))
    assert "write-on-every-rank" not in ids(("t.py", src.replace("{body}", "os.makedirs(d, exist_ok=True)")))
    caught = "try:\n            os.makedirs(d)\n        except FileExistsError:\n            pass"
    assert "write-on-every-rank" not in ids(("t.py", src.replace("{body}", caught)))


FASTMRI_TRAIN = """
import pytorch_lightning as pl
from data_module import DataModule

def main(args):
    pl.seed_everything(args.seed)
    trainer = pl.Trainer(gpus=2, accelerator="ddp")
    trainer.fit(Model(), datamodule=DataModule())
"""
FASTMRI_DATA = """
import torch

def worker_init_fn(worker_id):
    info = torch.utils.data.get_worker_info()
    info.dataset.transform.rng.seed(info.seed % (2 ** 32 - 1){rank})
"""


def test_seed_everything_without_workers_when_the_worker_init_ignores_the_rank():
    """fastMRI#123: seed_everything on every rank, workers seeded from worker_info.seed only."""
    assert "same-seed-every-rank" in ids(("train.py", FASTMRI_TRAIN), ("data_module.py", FASTMRI_DATA.replace("{rank}", "")))
    own = FASTMRI_TRAIN + "\n" + FASTMRI_DATA.replace("{rank}", " + torch.distributed.get_rank()") + \
        "\nloader = torch.utils.data.DataLoader(ds, worker_init_fn=worker_init_fn)\n"
    assert "same-seed-every-rank" not in ids(("train.py", own))


SLICES = """
import random
from torch.utils.data import Dataset

class Slices(Dataset):
    def __init__(self, files, sample_rate=1.0):
        files = list(files)
        if sample_rate < 1:
            random.shuffle(files)
            files = files[:round(len(files) * sample_rate)]
        self.files = sorted(files)
"""
MODULE = """
from torch.utils.data import DataLoader, DistributedSampler
from mri_data import Slices

def loader(files):
    ds = Slices(files, 0.5)
    return DataLoader(ds, sampler=DistributedSampler(ds))
"""


def test_a_dataset_drawn_from_the_unseeded_global_state_under_a_distributed_sampler():
    """fastMRI#63: every rank drew its own random subset of files, then the sampler split different lists."""
    assert "rank-split-differs" in ids(("mri_data.py", SLICES), ("module.py", MODULE))
    seeded = "import random\nrandom.seed(0)\n" + MODULE
    assert "rank-split-differs" not in ids(("mri_data.py", SLICES), ("module.py", seeded))


CUSTOM = """
import h5py

def write_as_hdf5(files, path):
    with h5py.File(path, "w") as f:
        f.create_dataset("pos", data=files)

class Custom:
    def __init__(self, files, hdf5=None):
        if hdf5 is not None:
            write_as_hdf5(files, hdf5)
"""
DATAMODULE = """
import pytorch_lightning as pl
import custom

class Data(pl.LightningDataModule):
    def {hook}(self, stage=None):
        self.dataset = custom.Custom(self.hparams["files"], self.hparams["hdf5"])
"""


def test_a_file_written_by_a_dataset_built_in_datamodule_setup():
    """torchmd-net: the HDF5 conversion ran in the dataset's constructor, built in setup() on every rank."""
    assert "write-on-every-rank" in ids(("custom.py", CUSTOM), ("data.py", DATAMODULE.replace("{hook}", "setup")))
    assert "write-on-every-rank" not in ids(("custom.py", CUSTOM),
                                            ("data.py", DATAMODULE.replace("{hook}", "prepare_data")))


METRIC = """
import torch
from torchmetrics import Metric
from torchmetrics.utilities import dim_zero_cat

class MCC(Metric):
    def __init__(self):
        super().__init__()
        self.add_state("TP", default=[], dist_reduce_fx="cat")

    def update(self, tp):
        self.TP += [tp]

    def compute(self):
        return {read}.sum()
"""


def test_a_list_state_joined_as_a_list_after_the_sync():
    """chemprop#1131: torch.cat(self.TP) in compute(); after the sync TP is already one Tensor (TypeError seen on two
    gloo processes with torchmetrics 1.x)."""
    assert "metric-state-reduce" in ids(("metrics.py", METRIC.replace("{read}", "torch.cat(self.TP, dim=0)")))
    assert "metric-state-reduce" not in ids(("metrics.py", METRIC.replace("{read}", "dim_zero_cat(self.TP)")))
