"""runbook lint changes made on the seventeenth blind set (tests/data/lint/blind17), each with its violation and its
look-alike."""

from __future__ import annotations

import textwrap

from helpers.lint import lint_texts


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
