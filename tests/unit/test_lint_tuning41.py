"""runbook lint changes made on the forty-first blind set (tests/data/lint/blind41), each with its violation and its
look-alike."""

from __future__ import annotations

import textwrap

from helpers.lint import lint_texts


def findings(*files: tuple[str, str]) -> list[tuple[str, str]]:
    return [(f.id, f.status) for f in lint_texts([(n, textwrap.dedent(t)) for n, t in files])]


def ids(*files: tuple[str, str]) -> list[str]:
    return [i for i, status in findings(*files) if status != "OK"]


def test_training_arguments_json_is_not_a_deepspeed_config():
    """llm2vec: a JSON of TrainingArguments (gradient_accumulation_steps among its fields) read by
    HfArgumentParser.parse_json_file; a DeepSpeed config with the same key and an unknown one is still checked."""
    hf = '{"model_name_or_path": "m", "output_dir": "out", "learning_rate": 2e-4, "num_train_epochs": 3,\n' \
         ' "per_device_train_batch_size": 64, "gradient_accumulation_steps": 1, "do_train": true}\n'
    assert "ds-unknown-key" not in ids(("train.json", hf))
    ds = '{"gradient_accumulation_steps": 1, "train_micro_batch_size_per_gpu": 4, "zero_optimisation": {}}\n'
    assert "ds-unknown-key" in ids(("ds_config.json", ds))


def test_bare_call_of_a_method_does_not_taint_self():
    """Protenix: a rank value passed to a bare call whose callee's first parameter is `self` tainted `self`, and with
    it every `self.configs...` test (a false rank-early-exit-collective on a clean trainer)."""
    src = """
    import torch
    import torch.distributed as dist

    class Trainer:
        def log(self, msg):
            print(msg)

        def step(self, model, x):
            log(dist.get_rank())
            if self.configs.eval_only:
                return
            dist.all_reduce(x)
    """
    assert "rank-early-exit-collective" not in ids(("trainer.py", src))
    gated = src.replace("if self.configs.eval_only:", "if dist.get_rank() == 0:")
    assert "rank-early-exit-collective" in ids(("trainer.py", gated))


def test_undefined_name_read_only_when_distributed():
    """webdataset: split_by_node reads `wid` (never defined) after returning early when no group exists; the same
    name defined is not this."""
    src = """
    import torch

    def split_by_node(urls, group=None):
        if not torch.distributed.is_available() or not torch.distributed.is_initialized():
            return urls
        rank = torch.distributed.get_rank(group=group)
        size = torch.distributed.get_world_size(group=group)
        {define}
        if size > 1:
            if wid == 0 and len(urls) < size:
                print("too few shards")
            return urls[rank::size]
        return urls
    """
    assert "undefined-name" in ids(("shardlists.py", src.replace("{define}", "pass")))
    assert "undefined-name" not in ids(("shardlists.py", src.replace("{define}", "wid = rank")))


def test_accelerator_set_device_index_and_slurm_global_formula():
    """WeatherGenerator: torch.accelerator.set_device_index(rank) where rank is RANK, or SLURM_NODEID * per_node +
    local_rank (the global formula); the local rank is fine."""
    src = """
    import os
    import torch
    import torch.distributed as dist

    def init():
        local_rank = int(os.environ.get("SLURM_LOCALID", "0"))
        rank = int(os.environ.get("RANK", "-1"))
        if rank == -1:
            rank = int(os.environ.get("SLURM_NODEID", "0")) * 4 + local_rank
        torch.accelerator.set_device_index({index})
        dist.init_process_group("nccl")
    """
    assert "device-from-global-rank" in ids(("trainer_base.py", src.replace("{index}", "rank")))
    assert "device-from-global-rank" not in ids(("trainer_base.py", src.replace("{index}", "local_rank")))


def test_lightning_hook_order():
    """MassSpecGym: self.split set in prepare_data (main process only) and read in setup; nequip: the world size read
    in a LightningModule's __init__ (before the process group exists).  State set in setup, or the world size read
    in setup, is not this."""
    dm = """
    import pytorch_lightning as pl

    class DataModule(pl.LightningDataModule):
        def __init__(self, path):
            super().__init__()
            self.path = path

        def {hook}(self):
            self.split = load(self.path)

        def train_dataloader(self):
            return make_loader(self.split)
    """
    assert "lightning-prepare-data-state" in ids(("data.py", dm.replace("{hook}", "prepare_data")))
    assert "lightning-prepare-data-state" not in ids(("data.py", dm.replace("{hook}", "setup")))
    module = """
    import torch
    import lightning.pytorch as pl

    class Module(pl.LightningModule):
        def __init__(self):
            super().__init__()
            {init}

        def setup(self, stage):
            {setup}
    """
    read = "self.world_size = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1"
    assert "rank-before-init" in ids(("lightning.py", module.replace("{init}", read).replace("{setup}", "pass")))
    assert "rank-before-init" not in ids(("lightning.py", module.replace("{init}", "pass").replace("{setup}", read)))


def test_attribute_of_a_model_the_class_unwraps_under_its_ddp_flag():
    """MALA: `if use_ddp: self.network.module.save_network(...)` in one method, `self.network.params` read directly
    in another; Module's own methods (`self.network.to(...)`) and reads under the same test are not this."""
    src = """
    class Runner:
        def save(self, path):
            if self.parameters_full.use_ddp:
                self.network.module.save_network(path)
            else:
                self.network.save_network(path)

        def predict(self, x):
            self.network.to({device})
            return self.network(x)
    """
    assert "ddp-wrapper-attribute" in ids(("runner.py", src.replace("{device}", 'self.network.params.device')))
    assert "ddp-wrapper-attribute" not in ids(("runner.py", src.replace("{device}", '"cuda"')))


def test_rank_layout_formulas():
    """lightning.data: rank // num_nodes as a node index; openfold-3: world_size - n % world_size as padding.  The
    ranks-per-node division, and the padding taken modulo the world size (or under a remainder test), are not this."""
    node = """
    def shuffle(env, chunks):
        per_node = [[] for _ in range(env.num_nodes)]
        for rank, c in enumerate(chunks):
            per_node[{index}].extend(c)
        return per_node
    """
    assert "node-index-formula" in ids(("shuffle.py", node.replace("{index}", "rank // env.num_nodes")))
    assert "node-index-formula" not in ids(("shuffle.py", node.replace(
        "{index}", "rank // (env.world_size // env.num_nodes)")))
    pad = """
    def pad(items, world_size):
        n = len(items)
        {body}
        return items + items[:extra]
    """
    assert "padding-formula" in ids(("pad.py", pad.replace("{body}", "extra = world_size - n % world_size")))
    assert "padding-formula" not in ids(("pad.py", pad.replace("{body}", "extra = (world_size - n % world_size) % world_size")))
    assert "padding-formula" not in ids(("pad.py", pad.replace(
        "{body}", "extra = world_size - n % world_size if n % world_size else 0")))


def test_distributed_sampler_over_an_index_list():
    """ffcv: DistributedSampler(self.indices) and its output returned as the order; mapped back through the list, it
    is not this."""
    src = """
    import numpy as np
    from torch.utils.data import DistributedSampler

    class Random:
        def __init__(self, indices):
            self.indices = indices
            self.sampler = DistributedSampler(self.indices, shuffle=True)

        def sample_order(self, epoch):
            self.sampler.set_epoch(epoch)
            return {order}
    """
    assert "sampler-positions-not-indices" in ids(("random.py", src.replace("{order}", "np.array(list(self.sampler))")))
    assert "sampler-positions-not-indices" not in ids(("random.py", src.replace(
        "{order}", "np.array([self.indices[i] for i in self.sampler])")))


def test_random_named_file_is_per_process_unless_seeded():
    """boltz: a temporary checkpoint named by random.choices (Python's unseeded generator: a name per process),
    written and removed under the same flag; with random seeded alike on every rank the ranks share the name."""
    src = """
    import os
    import random
    import string
    import torch
    import lightning.pytorch as pl

    def main(cfg):
        {seed}
        if cfg.pretrained:
            if cfg.from_trunk:
                name = "".join(random.choices(string.ascii_lowercase, k=10))
                path = os.path.dirname(cfg.pretrained) + "/" + name + ".ckpt"
                torch.save({}, path)
            else:
                path = cfg.pretrained
            model = load(path)
            if cfg.from_trunk:
                os.remove(path)
        pl.Trainer(strategy="ddp").fit(model)

    if __name__ == "__main__":
        main(load_config())
    """
    assert "write-on-every-rank" not in ids(("train.py", src.replace("{seed}", "pass")))
    assert "write-on-every-rank" in ids(("train.py", src.replace("{seed}", "pl.seed_everything(42)")))
