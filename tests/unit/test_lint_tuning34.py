"""runbook lint changes made on the thirty-fourth blind set (tests/data/lint/blind34), each with its violation and
its look-alike."""

from __future__ import annotations

import textwrap
from pathlib import Path

from helpers.lint import lint_paths, lint_texts


def ids(*files: tuple[str, str]) -> list[str]:
    return [f.id for f in lint_texts([(n, textwrap.dedent(t)) for n, t in files]) if f.status != "OK"]


def test_split_by_a_rounded_down_share_drops_items():
    """PyG's distributed_sampling.py: idx.split(idx.size(0) // world_size)[rank]; tensor_split(world_size) is exact."""
    src = """
    import torch.distributed as dist

    def run(rank, world_size, idx):
        dist.init_process_group("nccl", rank=rank, world_size=world_size)
        part = {split}[rank]
        return part
    """
    assert "rank-split-drops" in ids(("train.py", src.replace("{split}", "idx.split(idx.size(0) // world_size)")))
    assert "rank-split-drops" not in ids(("train.py", src.replace("{split}", "idx.tensor_split(world_size)")))
    assert "rank-split-drops" not in ids(("train.py", src.replace("{split}", "line.split(',')")))


def test_rank_from_a_global_variable_or_a_local_one_by_launcher():
    """DGL's get_proc_info: OMPI_COMM_WORLD_RANK under Open MPI, MPI_LOCALRANKID under MPICH, both returned as the rank."""
    src = """
    import os

    def get_proc_info():
        if "OMPI_COMM_WORLD_RANK" in os.environ:
            rank = int(os.environ.get("OMPI_COMM_WORLD_RANK") or 0)
        elif "PMI_RANK" in os.environ:
            rank = int(os.environ.get("{other}") or 0)
        return rank
    """
    assert "local-rank-as-global-rank" in ids(("prep.py", src.replace("{other}", "MPI_LOCALRANKID")))
    assert "local-rank-as-global-rank" not in ids(("prep.py", src.replace("{other}", "PMI_RANK")))


def test_deepspeed_script_loops_over_its_own_unsharded_loader():
    """eth-cscs/pytorch-training's T5 script: DataLoader(shuffle=True) beside deepspeed.initialize, no sampler."""
    src = """
    import deepspeed
    from torch.utils.data import DataLoader

    engine, opt, loader, _ = deepspeed.initialize(model=model, model_parameters=model.parameters())
    train = DataLoader(ds, batch_size=4, {kw})
    for batch in train:
        engine.backward(engine(batch))
    """
    assert "sampler-not-distributed" in ids(("t5.py", src.replace("{kw}", "shuffle=True")))
    assert "sampler-not-distributed" not in ids(("t5.py", src.replace("{kw}", "sampler=DistributedSampler(ds)")))


def test_forward_on_the_model_given_to_deepspeed():
    """eth-cscs/pytorch-training's BERT script: outputs = model(...) while model_engine.backward(loss)."""
    src = """
    import deepspeed

    model_engine, optimizer, loader, _ = deepspeed.initialize(model=model, model_parameters=model.parameters())
    for batch in loader:
        loss = {fwd}(batch)
        model_engine.backward(loss)
        model_engine.step()
    """
    assert "ddp-bypassed" in ids(("bert.py", src.replace("{fwd}", "model")))
    assert "ddp-bypassed" not in ids(("bert.py", src.replace("{fwd}", "model_engine")))


def test_dataset_download_in_each_spawned_worker():
    """PyG's ogbg example: each spawned rank builds PygGraphPropPredDataset (download + process); the fixed example
    builds it once in __main__ before mp.spawn."""
    src = """
    import torch.multiprocessing as mp
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel
    from ogb.graphproppred import PygGraphPropPredDataset

    def run(rank, world_size):
        dist.init_process_group("nccl", rank=rank, world_size=world_size)
        dataset = PygGraphPropPredDataset("ogbg-molhiv", "data")
        model = DistributedDataParallel(make(), device_ids=[rank])
        dist.barrier()

    if __name__ == "__main__":
        {pre}
        mp.spawn(run, args=(4,), nprocs=4)
    """
    assert "download-every-rank" in ids(("ogb.py", src.replace("{pre}", "pass")))
    assert "download-every-rank" not in ids(
        ("ogb.py", src.replace("{pre}", "PygGraphPropPredDataset('ogbg-molhiv', 'data')")))


def test_dataparallel_with_one_device_per_process():
    """CDial-GPT: DataParallel(model, device_ids=[args.local_rank]) under torch.distributed.launch."""
    src = """
    import torch
    from torch.nn import DataParallel

    def main(args, model):
        torch.distributed.init_process_group("nccl")
        model = {wrap}
    """
    assert "dataparallel-under-launcher" in ids(
        ("train.py", src.replace("{wrap}", "DataParallel(model, device_ids=[args.local_rank])")))
    ddp = "torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.local_rank])"
    assert "dataparallel-under-launcher" not in ids(("train.py", src.replace("{wrap}", ddp)))


def test_constant_root_with_a_subgroup():
    """fastmoe: broadcast(coalesced, 0, group=comm) per data-parallel group; a helper's group parameter defaulting to
    WORLD is left to its callers."""
    src = """
    import torch.distributed as dist

    def sync(comms, t):
        for comm in comms:
            dist.broadcast(t, {root}, group=comm)

    def helper(t, group=dist.group.WORLD):
        dist.broadcast(t, 0, group=group)
    """
    assert "wrong-collective-src-rank" in ids(("d.py", src.replace("{root}", "0")))
    assert "wrong-collective-src-rank" not in ids(("d.py", src.replace("{root}", "dist.get_global_rank(comm, 0)")))


def test_trainer_override_returns_an_unsharded_loader():
    """stanford-crfm/mistral: a Trainer subclass's get_train_dataloader returns DataLoader(...) of its own."""
    src = """
    from torch.utils.data import DataLoader
    from transformers import Trainer

    class MyTrainer(Trainer):
        def get_train_dataloader(self):
            return {ret}
    """
    assert "sampler-not-distributed" in ids(
        ("trainer.py", src.replace("{ret}", "DataLoader(self.train_dataset, shuffle=True)")))
    assert "sampler-not-distributed" not in ids(
        ("trainer.py", src.replace("{ret}", "self.accelerator.prepare(DataLoader(self.train_dataset))")))


def test_barrier_under_a_poll_of_async_work():
    """OLMo-core: barrier() under `if blocking or fut.done()`; waiting with fut.result() on every rank is fine."""
    src = """
    import torch.distributed as dist

    def await_last(fut, blocking):
        {test}
            fut.result()
            dist.barrier()
    """
    assert "collective-in-data-dependent-branch" in ids(("ckpt.py", src.replace("{test}", "if blocking or fut.done():")))
    assert "collective-in-data-dependent-branch" not in ids(("ckpt.py", src.replace("{test}", "if blocking:")))


def test_loop_variables_not_exported_to_the_child_script(tmp_path):
    """ColossalAI's GPT benchmark: for GPUNUM in 1 2 4 8 ... bash ./run.sh, and run.sh reads ${GPUNUM:-1}."""
    run = "export GPUNUM=${GPUNUM:-1}\ntorchrun --standalone --nproc_per_node=${GPUNUM} train.py\n"
    bench = "for GPUNUM in 1 2 4 8\ndo\n{line}\ndone\n"
    assert "launcher-var-unset" in ids(("benchmark.sh", bench.replace("{line}", "bash ./run.sh")), ("run.sh", run))
    assert "launcher-var-unset" not in ids(("benchmark.sh", bench.replace("{line}", "GPUNUM=$GPUNUM bash ./run.sh")),
                                           ("run.sh", run))
    exported = "export GPUNUM\n" + bench.replace("{line}", "bash ./run.sh")
    assert "launcher-var-unset" not in ids(("benchmark.sh", exported), ("run.sh", run))


def test_init_path_without_the_binding_the_other_path_has():
    """fairchem: the SLURM path calls torch.cuda.set_device(local_rank) before init_process_group, the torchrun path
    reads LOCAL_RANK and binds nothing."""
    src = """
    import os
    import torch
    import torch.distributed as dist

    def setup(config):
        if config["submit"]:
            torch.cuda.set_device(config["local_rank"])
            dist.init_process_group(backend="nccl", rank=config["rank"], world_size=config["world_size"])
        else:
            config["local_rank"] = int(os.environ.get("LOCAL_RANK"))
            {bind}
            dist.init_process_group(backend="nccl", rank=int(os.environ["RANK"]), world_size=config["world_size"])
    """
    assert "nccl-no-device-binding" in ids(("distutils.py", src.replace("{bind}", "pass")))
    assert "nccl-no-device-binding" not in ids(
        ("distutils.py", src.replace("{bind}", "torch.cuda.set_device(config['local_rank'])")))


def test_a_world_size_counted_from_this_nodes_devices():
    """DGL's graphbolt multi-GPU example (blind34 clean): world_size = len(devices) for mp.spawn on one node."""
    src = """
    import os
    import torch.multiprocessing as mp

    def main(args):
        devices = list(map(int, args.gpu.split(",")))
        world_size = {ws}
        os.environ["OMP_NUM_THREADS"] = str(mp.cpu_count() // 2 // world_size)
        mp.spawn(run, args=(world_size,), nprocs=world_size)
    """
    assert "world-size-as-local" not in ids(("gb.py", src.replace("{ws}", "len(devices)")))
    assert "world-size-as-local" in ids(("gb.py", src.replace("{ws}", "int(os.environ['WORLD_SIZE'])")))


def test_module_taken_in_one_branch_of_the_argument():
    """DGL's dist GraphSAGE (blind34 clean): generate_emb(model if args.standalone else model.module, ...)."""
    src = """
    import torch as th

    def generate_emb(model, g):
        return model.inference(g)

    def run(args, model, g):
        model = th.nn.parallel.DistributedDataParallel(model)
        return generate_emb({arg}, g)
    """
    assert "ddp-wrapper-attribute" not in ids(("sage.py", src.replace("{arg}", "model if args.standalone else model.module")))
    assert "ddp-wrapper-attribute" in ids(("sage.py", src.replace("{arg}", "model")))


def test_barrier_after_the_download_does_not_order_it(tmp_path):
    """The download rule's rank-first guard: a barrier after training does not order an earlier download."""
    p = tmp_path / "t.py"
    p.write_text(textwrap.dedent("""
        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel
        from torchvision.datasets import CIFAR10

        def main():
            dist.init_process_group("nccl")
            ds = CIFAR10("data", download=True)
            model = DistributedDataParallel(make())
            dist.barrier()
        """))
    assert "download-every-rank" in [f.id for f in lint_paths([str(p)])]
    assert Path(p).exists()


def test_download_in_a_one_device_fabric_script():
    """Lightning's Fabric dcgan example (blind9 clean): Fabric(devices=1), one process downloads CelebA."""
    src = """
    from lightning.fabric import Fabric
    from torchvision.datasets import CelebA

    def main():
        fabric = Fabric(accelerator="auto", devices={n})
        fabric.launch()
        dataset = CelebA(root="data", download=True)
        fabric.barrier()
    """
    assert "download-every-rank" not in ids(("dcgan.py", src.replace("{n}", "1")))
    assert "download-every-rank" in ids(("dcgan.py", src.replace("{n}", "4")))


def test_shutil_copy_of_a_checkpoint_on_every_rank():
    """icefall (blind12): copyfile(src=filename, dst=best_train_filename) after the save, on every spawned rank."""
    src = """
    from shutil import copyfile
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP

    def save(params, filename, rank):
        {gate}copyfile(src=filename, dst=params.exp_dir / "best-train-loss.pt")

    def run(rank, world_size, params, model):
        dist.init_process_group("nccl", rank=rank, world_size=world_size)
        model = DDP(model)
        save(params, "epoch-1.pt", rank)
    """
    assert "write-on-every-rank" in ids(("train.py", src.replace("{gate}", "")))
    assert "write-on-every-rank" not in ids(("train.py", src.replace("{gate}", "if rank == 0:\n            ")))
