"""runbook lint changes made on the twenty-third blind set (tests/data/lint/blind23), each with its violation and its
look-alike."""

from __future__ import annotations

import textwrap

from helpers.lint import lint_texts


def ids(*files: tuple[str, str]) -> list[str]:
    return [f.id for f in lint_texts([(n, textwrap.dedent(t)) for n, t in files]) if f.status != "OK"]


def test_lightning_seed_everything_without_workers_under_a_distributed_strategy():
    """openfold: seed_everything(args.seed) with DDPPlugin, no workers=True."""
    text = """
    import pytorch_lightning as pl
    from pytorch_lightning.plugins import DDPPlugin
    def main(args):
        pl.seed_everything(args.seed)
        trainer = pl.Trainer(strategy=DDPPlugin(find_unused_parameters=False), gpus=8)
        trainer.fit(model, datamodule)
    """
    assert "same-seed-every-rank" in ids(("train.py", text))
    assert "same-seed-every-rank" not in ids(("train.py", text.replace("seed_everything(args.seed)",
                                                                      "seed_everything(args.seed, workers=True)")))
    fabric = "import lightning as L\nfabric = L.Fabric(strategy='ddp')\nfabric.seed_everything(1337)\n"
    assert "same-seed-every-rank" not in ids(("pretrain.py", fabric))  # litgpt: alike on purpose, for the init
    single = text.replace("strategy=DDPPlugin(find_unused_parameters=False), ", "").replace(
        "    from pytorch_lightning.plugins import DDPPlugin\n", "")
    assert "same-seed-every-rank" not in ids(("train.py", single))


def test_a_streaming_dataset_read_whole_by_every_rank():
    """astroPT: load_dataset(..., streaming=True) into a plain DataLoader under DDP."""
    text = """
    from datasets import load_dataset
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DataLoader
    def main(model, rank, world):
        ds = load_dataset("Smith42/galaxies", split="train", streaming=True)
        ds = ds.map(process)
        loader = DataLoader(ds, batch_size=8)
        model = DDP(model)
    """
    assert "iterable-not-sharded" in ids(("train.py", text))
    split = text.replace("        ds = ds.map(process)\n", "        ds = split_dataset_by_node(ds.map(process), rank, world)\n")
    assert "iterable-not-sharded" not in ids(("train.py", split))
    mapped = text.replace("streaming=True", "streaming=False")
    assert "iterable-not-sharded" not in ids(("train.py", mapped))


def test_an_eval_loader_accelerate_never_prepares():
    """lerobot: the training loader goes through accelerator.prepare, the eval loader does not."""
    text = """
    from accelerate import Accelerator
    from torch.utils.data import DataLoader
    accelerator = Accelerator()
    train_loader = DataLoader(train_ds, batch_size=8, shuffle=True)
    eval_loader = DataLoader(eval_ds, batch_size=8)
    model, optimizer, train_loader = accelerator.prepare(model, optimizer, train_loader)
    for batch in eval_loader:
        loss = model(batch)
    """
    assert "loader-not-prepared" in ids(("train.py", text))
    prepared = text.replace("optimizer, train_loader)", "optimizer, train_loader, eval_loader)")
    assert "loader-not-prepared" not in ids(("train.py", prepared))
    rank0 = text.replace("for batch in eval_loader:\n        loss", "if accelerator.is_main_process:\n"
                         "        for batch in eval_loader:\n            loss")
    assert "loader-not-prepared" not in ids(("train.py", textwrap.dedent(rank0)))


def test_get_state_dict_of_a_submodule_of_the_prepared_model():
    """trlx: accelerator.get_state_dict(self.model.base_model) under ZeRO-3."""
    text = """
    class Trainer:
        def __init__(self, accelerator, model, opt):
            self.accelerator = accelerator
            self.model, self.opt = self.accelerator.prepare(model, opt)
        def save_pretrained(self, directory):
            state_dict = self.accelerator.get_state_dict(self.model.base_model)
            return state_dict
    """
    assert "zero3-state-dict-submodule" in ids(("trainer.py", text))
    whole = text.replace("get_state_dict(self.model.base_model)", "get_state_dict(self.model)")
    assert "zero3-state-dict-submodule" not in ids(("trainer.py", whole))


def test_gathered_parameters_keyword_from_deepspeeds_signature():
    """Megatron-DeepSpeed: GatheredParameters(..., enable=...) where the parameter is `enabled`."""
    text = """
    from deepspeed.runtime.zero import GatheredParameters
    def init(layer, gather):
        with GatheredParameters(layer.weight, modifier_rank=0, enable=gather):
            layer.weight.data.zero_()
    """
    assert "api-unknown-kwarg" in ids(("utils.py", text))
    assert "api-unknown-kwarg" not in ids(("utils.py", text.replace("enable=gather", "enabled=gather")))


def test_a_checkpointer_objects_save_on_rank_zero_is_not_an_engine_collective():
    """torchtune: self._checkpointer.save_checkpoint(...) under `if self._is_rank_zero:` after the gather."""
    text = """
    import torch.distributed as dist
    class Recipe:
        def __init__(self, cfg):
            self._checkpointer = config.instantiate(cfg.checkpointer)
            self._is_rank_zero = dist.get_rank() == 0
        def save(self, state):
            cpu_state_dict = training.gather_cpu_state_dict(self._model, self._is_rank_zero)
            if self._is_rank_zero:
                self._checkpointer.save_checkpoint({"model": cpu_state_dict}, epoch=1)
    """
    assert "rank-gated-collective" not in ids(("recipe.py", text))
    engine = text.replace("self._checkpointer.save_checkpoint(", "self._model_engine.save_checkpoint(")
    assert "rank-gated-collective" in ids(("recipe.py", engine))
    # allennlp#4693: a checkpointer given nothing gathered (a DeepSpeed checkpointer saves through the engine)
    nothing = text.replace("            cpu_state_dict = training.gather_cpu_state_dict(self._model, self._is_rank_zero)\n",
                           "            cpu_state_dict = state\n")
    assert "rank-gated-collective" in ids(("recipe.py", nothing))
