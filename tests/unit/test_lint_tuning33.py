"""runbook lint changes made in the thirty-third session of blind rounds (tests/data/lint/blind33 and the misses of
the earlier sets it revisited), each with its violation and its look-alike."""

from __future__ import annotations

import textwrap
from pathlib import Path

from helpers.lint import lint_paths, lint_texts

SCRIPT = """
import argparse
p = argparse.ArgumentParser()
p.add_argument("--deepspeed")
p.add_argument("--fsdp_config")
args = p.parse_args()
"""


def _ids(tmp_path: Path, launch: str, files: dict[str, str]) -> list[str]:
    for name, text in {"train.sh": launch, "train.py": SCRIPT, **files}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    paths = [str(tmp_path / n) for n in ("train.sh", "train.py", *files)]
    return [f.id for f in lint_paths(paths) if f.status != "OK"]


def test_launch_names_a_deepspeed_config_that_is_not_there(tmp_path, monkeypatch):
    """zero_nlp / ross3d / LEGENT (blind28): --deepspeed names a JSON file the repository does not hold."""
    monkeypatch.chdir(tmp_path)
    line = "torchrun --nproc_per_node 2 train.py --deepspeed configs/zero2.json\n"
    assert "config-path-missing" in _ids(tmp_path, line, {})
    assert "config-path-missing" not in _ids(tmp_path, line, {"configs/zero2.json": "{}"})
    variable = "torchrun --nproc_per_node 2 train.py --deepspeed $DS_CONFIG\n"
    assert "config-path-missing" not in _ids(tmp_path, variable, {})


def test_fsdp_config_and_hostfile_not_there(tmp_path, monkeypatch):
    """The script's --fsdp_config and DeepSpeed's --hostfile (ms-swift, blind11/blind20: DeepSpeed's runner then
    starts every rank on this node) checked alike; a linted file of that name counts as the file (files handed to
    the linter may be copies out of their tree)."""
    monkeypatch.chdir(tmp_path)
    line = "torchrun --nproc_per_node 2 train.py --fsdp_config train/scripts/fsdp.json\n"
    assert "config-path-missing" in _ids(tmp_path, line, {})
    assert "config-path-missing" not in _ids(tmp_path, line, {"train/scripts/fsdp.json": "{}"})
    assert "config-path-missing" not in _ids(tmp_path, line, {"copies/fsdp.json": "{}"})
    hosts = "deepspeed --hostfile=./examples/multi-node-deepspeed/host.txt train.py\n"
    assert "config-path-missing" in _ids(tmp_path, hosts, {})
    assert "config-path-missing" not in _ids(tmp_path, hosts, {"examples/multi-node-deepspeed/host.txt": "n1 slots=8\n"})


def test_a_config_the_launch_file_writes_first(tmp_path, monkeypatch):
    """bigscience-metadata / DeepSpeedExamples: the batch script writes the accelerate config, then launches with it."""
    monkeypatch.chdir(tmp_path)
    line = ("echo 'num_processes: 2' > acc.yaml\n"
            "accelerate launch --config_file acc.yaml train.py\n")
    assert "config-path-missing" not in _ids(tmp_path, line, {})
    assert "config-path-missing" in _ids(tmp_path, line.split("\n", 1)[1], {})


def test_no_verdict_without_the_script(tmp_path, monkeypatch):
    """A launch file linted alone (its script not given: peft's run_peft_fsdp.sh, a blind6 clean file) says nothing
    of the paths it names: where it runs from is unknown."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.sh").write_text("torchrun --nproc_per_node 2 other.py --deepspeed ds.json\n"
                                     "accelerate launch --config_file configs/fsdp.yaml other.py\n")
    assert "config-path-missing" not in [f.id for f in lint_paths([str(tmp_path / "run.sh")])]


def ids(*files: tuple[str, str]) -> list[str]:
    return [f.id for f in lint_texts([(n, textwrap.dedent(t)) for n, t in files]) if f.status != "OK"]


def test_module_of_a_model_the_script_wrapped_before_prepare():
    """LightningDiT (blind33 clean): model = DDP(model) before accelerator.prepare: prepare hands the DDP module back,
    so model.module exists on one process too."""
    src = """
    from accelerate import Accelerator
    from torch.nn.parallel import DistributedDataParallel as DDP

    def main(model, opt, loader):
        accelerator = Accelerator()
        {wrap}
        model, opt, loader = accelerator.prepare(model, opt, loader)
        for x in loader:
            update_ema(ema, model.module)
    """
    assert "module-attr-without-ddp" not in ids(("train.py", src.replace("{wrap}", "model = DDP(model, device_ids=[0])")))
    assert "module-attr-without-ddp" in ids(("train.py", src.replace("{wrap}", "pass")))


def test_writes_of_the_launching_process_before_spawn():
    """stylegan3 (blind33 clean): the launcher function writes the run's options, then torch.multiprocessing.spawn
    starts the workers: one process writes."""
    src = """
    import os, json, torch

    def launch_training(c):
        os.makedirs(c.run_dir)
        with open(os.path.join(c.run_dir, "training_options.json"), "wt") as f:
            json.dump(c, f)
        torch.multiprocessing.spawn(fn=subprocess_fn, args=(c,), nprocs=c.num_gpus)

    def subprocess_fn(rank, c):
        torch.distributed.init_process_group("nccl", rank=rank, world_size=c.num_gpus)
        {write}
    """
    assert "write-on-every-rank" not in ids(("train.py", src.replace("{write}", "pass")))
    assert "write-on-every-rank" in ids(("train.py", src.replace("{write}", "os.makedirs(c.run_dir)")))


def test_a_config_dict_dumped_on_every_rank():
    """HunyuanDiT (blind33 clean): args_dict = vars(args) dumped to args.json by every rank: the same bytes."""
    src = """
    import json, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    def main(args, model, out):
        dist.init_process_group("nccl")
        model = DDP(model)
        args_dict = vars(args)
        with open(f"{out}/args.json", "w") as f:
            json.dump({what}, f)
    """
    assert "write-on-every-rank" not in ids(("train.py", src.replace("{what}", "args_dict")))
    assert "write-on-every-rank" in ids(("train.py", src.replace("{what}", "model.state_dict()")))


def test_torch_load_made_by_the_main_process_only():
    """PixArt-sigma (blind33 clean): a validation function called under is_main_process loads without map_location."""
    src = """
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    def log_validation(model):
        null_y = torch.load("null_embed.pth")
        return model(null_y)

    def train(model, accelerator):
        model = DDP(model)
        {call}
    """
    assert "load-without-map-location" not in ids(
        ("train.py", src.replace("{call}", "if accelerator.is_main_process:\n            log_validation(model)")))
    assert "load-without-map-location" in ids(("train.py", src.replace("{call}", "log_validation(model)")))


def test_save_state_hook_runs_where_save_state_runs():
    """diffusers' kandinsky / t2i-adapter scripts (blind33 clean): the save_state pre-hook writes with no gate, and
    save_state is called under is_main_process only: one process runs the hook."""
    src = """
    from accelerate import Accelerator

    def main(model):
        accelerator = Accelerator()

        def save_model_hook(models, weights, output_dir):
            for m in models:
                m.save_pretrained(output_dir)
                weights.pop()

        accelerator.register_save_state_pre_hook(save_model_hook)
        model = accelerator.prepare(model)
        for step in range(10):
            {save}
    """
    gated = "if accelerator.is_main_process:\n                accelerator.save_state('ckpt')"
    assert "write-on-every-rank" not in ids(("train.py", src.replace("{save}", gated)))
    assert "write-on-every-rank" in ids(("train.py", src.replace("{save}", "accelerator.save_state('ckpt')")))


def test_partition_by_local_rank_times_a_world_size_share():
    """mosaicml/diffusion (blind33): start = dist.get_local_rank() * samples_per_rank, per_rank from the world size."""
    src = """
    from composer.utils import dist

    def generate(n):
        samples_per_rank, remainder = divmod(n, dist.get_world_size())
        start = {who} * samples_per_rank
        return range(start, start + samples_per_rank)
    """
    assert "local-rank-as-global-rank" in ids(("gen.py", src.replace("{who}", "dist.get_local_rank()")))
    assert "local-rank-as-global-rank" not in ids(("gen.py", src.replace("{who}", "dist.get_global_rank()")))


def test_run_directory_numbered_by_a_listing_on_every_rank():
    """Open-Sora (blind33): create_experiment_workspace (another file) counts the outputs folder and makes the next
    number on every rank; DiT makes it under rank 0."""
    helper = """
    import os
    from glob import glob

    def create_experiment_workspace(cfg):
        os.makedirs(cfg.outputs, exist_ok=True)
        index = len(glob(f"{cfg.outputs}/*"))
        exp_dir = f"{cfg.outputs}/{index:03d}"
        os.makedirs(exp_dir, exist_ok=True)
        return exp_dir
    """
    train = """
    import torch.distributed as dist
    from config_utils import create_experiment_workspace

    def main(cfg):
        dist.init_process_group("nccl")
        {call}
    """
    every = train.replace("{call}", "exp_dir = create_experiment_workspace(cfg)")
    assert "write-on-every-rank" in ids(("config_utils.py", helper), ("train.py", every))
    gated = train.replace("{call}", "if dist.get_rank() == 0:\n            exp_dir = create_experiment_workspace(cfg)")
    assert "write-on-every-rank" not in ids(("config_utils.py", helper), ("train.py", gated))


def test_submodule_module_inside_a_lightning_module():
    """Latte (blind33): self.model.module.state_dict() inside a LightningModule; an EMA wrapper has a module."""
    src = """
    from lightning import LightningModule

    class Module(LightningModule):
        def __init__(self, args):
            super().__init__()
            self.model = get_models(args)
            self.ema = ModelEmaV2(self.model)

        def state(self):
            return {read}
    """
    assert "module-attr-without-ddp" in ids(("train_pl.py", src.replace("{read}", "self.model.module.state_dict()")))
    assert "module-attr-without-ddp" not in ids(("train_pl.py", src.replace("{read}", "self.ema.module.state_dict()")))


def test_per_rank_device_string_without_set_device_under_a_cuda_chosen_nccl():
    """guided-diffusion (blind33): backend 'gloo' if no CUDA else 'nccl'; dev() gives cuda:{rank % 8}; no set_device."""
    src = """
    import torch as th
    import torch.distributed as dist

    def setup_dist():
        backend = "gloo" if not th.cuda.is_available() else "nccl"
        dist.init_process_group(backend=backend, init_method="env://")
        {bind}

    def dev():
        return th.device(f"cuda:{RANK % 8}")
    """
    assert "nccl-no-device-binding" in ids(("dist_util.py", src.replace("{bind}", "pass")))
    assert "nccl-no-device-binding" not in ids(("dist_util.py", src.replace("{bind}", "th.cuda.set_device(dev())")))


def test_self_attribute_whose_parameters_the_class_reads_is_a_model():
    """muse-maskgit (blind33): self.vae prepared by accelerate, self.vae.discr read after."""
    src = """
    from accelerate import Accelerator

    class Trainer:
        def __init__(self, vae):
            self.accelerator = Accelerator()
            self.vae = vae
            self.optim = Adam(self.vae.parameters())
            self.vae, self.optim = self.accelerator.prepare(self.vae, self.optim)

        def step(self):
            return self.vae.{attr}
    """
    assert "ddp-wrapper-attribute" in ids(("trainers.py", src.replace("{attr}", "discr")))
    assert "ddp-wrapper-attribute" not in ids(("trainers.py", src.replace("{attr}", "module.discr")))


def test_launch_legacy_local_rank_against_the_parser_in_an_imported_module():
    """Chinese-CLIP (blind33): main.py calls parse_args() from params.py, whose parser has only --local_rank, and the
    launch uses python -m torch.distributed.launch (PyTorch 2 passes --local-rank)."""
    params = """
    import argparse

    def parse_args():
        parser = argparse.ArgumentParser()
        parser.add_argument("--lr", type=float)
        parser.add_argument({opt}, type=int, default=0)
        args = parser.parse_args()
        return args
    """
    main = """
    import torch.distributed as dist
    from cn_clip.training.params import parse_args

    def main():
        args = parse_args()
        dist.init_process_group("nccl")
    """
    launch = "python3 -m torch.distributed.launch --nproc_per_node=8 cn_clip/training/main.py --lr 1e-4\n"
    got = ids(("params.py", params.replace("{opt}", '"--local_rank"')), ("main.py", main), ("run.sh", launch))
    assert "local-rank-arg-under-launcher" in got
    got = ids(("params.py", params.replace("{opt}", '"--local-rank", "--local_rank"')), ("main.py", main),
              ("run.sh", launch))
    assert "local-rank-arg-under-launcher" not in got


def test_type_test_of_the_ddp_wrapper():
    """open_clip (blind33): is_clip(model) = type(model) in [CLIP, ...] on the DDP-wrapped model: always False."""
    src = """
    from torch.nn.parallel import DistributedDataParallel

    def is_clip(model):
        return type(model) in [CLIP, CustomTextCLIP]

    def main(model):
        model = {wrap}
        if is_clip(model):
            pass
    """
    assert "ddp-wrapper-attribute" in ids(("train.py", src.replace("{wrap}", "DistributedDataParallel(model)")))
    assert "ddp-wrapper-attribute" not in ids(("train.py", src.replace("{wrap}", "model.cuda()")))
    isdp = src.replace("type(model) in [CLIP, CustomTextCLIP]", "isinstance(model, DistributedDataParallel)")
    assert "ddp-wrapper-attribute" not in ids(("train.py", isdp.replace("{wrap}", "DistributedDataParallel(model)")))
