"""runbook lint changes made while the thirtieth blind set (tests/data/lint/blind30) was collected and after it was
scored, each with its violation and its look-alike."""

from __future__ import annotations

import textwrap

from helpers.lint import lint_texts


def ids(*files: tuple[str, str]) -> list[str]:
    return [f.id for f in lint_texts([(n, textwrap.dedent(t)) for n, t in files]) if f.status != "OK"]


_ACC = """
compute_environment: LOCAL_MACHINE
deepspeed_config:
  deepspeed_config_file: ds.json
  zero3_init_flag: false
distributed_type: DEEPSPEED
{mp}num_machines: 1
num_processes: 2
"""


def test_top_level_mixed_precision_beside_a_deepspeed_config_file():
    """trlx (blind28): accelerate launch reads mixed_precision from the YAML (any value, 'no' included) and adds it
    to ACCELERATE_CONFIG_DS_FIELDS; DeepSpeedPlugin then raises 'When using `deepspeed_config_file`, the following
    accelerate config variables will be ignored' (reproduced with accelerate 1.15)."""
    bad = _ACC.replace("{mp}", "mixed_precision: 'no'\n")
    assert "acc-ds-file-overrides" in ids(("acc.yaml", bad))
    assert "acc-ds-file-overrides" not in ids(("acc.yaml", _ACC.replace("{mp}", "")))
    assert "acc-ds-file-overrides" not in ids(("acc.yaml", _ACC.replace("{mp}", "mixed_precision: null\n")))
    # the command line's --mixed_precision is read instead of the YAML's: no clash
    launch = "accelerate launch --config_file acc.yaml --mixed_precision fp16 train.py\n"
    assert "acc-ds-file-overrides" not in ids(("acc.yaml", bad), ("run.sh", launch))
    # without a DeepSpeed config file the YAML's precision is the one used
    plain = bad.replace("  deepspeed_config_file: ds.json\n", "  zero_stage: 2\n")
    assert "acc-ds-file-overrides" not in ids(("acc.yaml", plain))


_LOADER = """
import torch.distributed as dist
from torch.utils.data import DataLoader, DistributedSampler

def loader(dataset, is_train, ddp):
    {body}
"""


def _loader(body: str) -> list[str]:
    return ids(("train.py", _LOADER.replace("{body}", textwrap.indent(textwrap.dedent(body), "    ").strip())))


def test_shuffle_beside_a_sampler_made_on_some_paths():
    """SevenNet (positional shuffle) and fastMRI (shuffle=is_train beside `if is_train: DistributedSampler`): the DDP
    training loader stops with 'sampler option is mutually exclusive with shuffle'."""
    seven = """
    sampler = None
    if ddp:
        sampler = DistributedSampler(dataset, shuffle=is_train)
    return DataLoader(dataset, 8, is_train, sampler=sampler)
    """
    assert "dataloader-sampler-and-shuffle" in _loader(seven)
    fastmri = """
    sampler = None
    if ddp:
        if is_train:
            sampler = DistributedSampler(dataset)
        else:
            sampler = VolumeSampler(dataset, shuffle=False)
    return DataLoader(dataset, batch_size=8, sampler=sampler, shuffle=is_train)
    """
    assert "dataloader-sampler-and-shuffle" in _loader(fastmri)
    # look-alikes: the shuffle asks the sampler itself, or the question that makes it, the other way round
    for body in ("""
    sampler = DistributedSampler(dataset) if ddp else None
    return DataLoader(dataset, batch_size=8, sampler=sampler, shuffle=(sampler is None))
    """, """
    sampler = None
    if ddp:
        sampler = DistributedSampler(dataset)
    return DataLoader(dataset, batch_size=8, sampler=sampler, shuffle=False if ddp else True)
    """, """
    sampler = None
    if ddp:
        sampler = DistributedSampler(dataset)
    return DataLoader(dataset, batch_size=8, sampler=sampler, shuffle=not ddp)
    """, """
    shuffle = not ddp
    if not shuffle:
        sampler = DistributedSampler(dataset)
    else:
        sampler = None
    return DataLoader(dataset, batch_size=8, shuffle=shuffle, sampler=sampler)
    """, """
    sampler = None
    shuffle = is_train
    if ddp:
        sampler = DistributedSampler(dataset)
        shuffle = False
    return DataLoader(dataset, batch_size=8, shuffle=shuffle, sampler=sampler)
    """):
        assert "dataloader-sampler-and-shuffle" not in _loader(body), body


def test_ddp_of_a_module_built_on_the_meta_device():
    """WeatherGenerator: DDP's constructor reads and broadcasts the parameters ('Tensor.item() cannot be called on
    meta tensors', reproduced on torch 2.13 with one gloo process)."""
    src = """
    import torch
    from torch.nn.parallel import DistributedDataParallel
    def build(cf):
        with torch.device("meta"):
            model = Model(cf)
        {between}
        model = DistributedDataParallel(model)
        return model
    """
    assert "ddp-meta-module" in ids(("trainer.py", src.replace("{between}", "pass")))
    assert "ddp-meta-module" not in ids(("trainer.py", src.replace("{between}", 'model.to_empty(device="cuda")')))
    fsdp = src.replace("{between}", "pass").replace("model = DistributedDataParallel(model)", "fully_shard(model)")
    assert "ddp-meta-module" not in ids(("trainer.py", fsdp))


def test_attribute_of_a_self_model_wrapped_in_ddp():
    """nequip: `self.model = DistributedDataParallel(self.model)` in one method, `self.model.unscale(...)` in
    another: AttributeError under DDP only."""
    src = """
    import torch

    class Trainer:
        def __init__(self, model):
            self.model = model
            self.model.check_inputs()
        def init(self):
            if self.distributed:
                self.model = torch.nn.parallel.DistributedDataParallel(self.model)
        def step(self, data):
            data = {read}
            return self.model(data)
    """
    assert "ddp-wrapper-attribute" in ids(("trainer.py", src.replace("{read}", "self.model.unscale(data)")))
    guarded = "self.model.module.unscale(data) if isinstance(self.model, DDP) else self.model.unscale(data)"
    assert "ddp-wrapper-attribute" not in ids(("trainer.py", src.replace("{read}", guarded)))
    assert "ddp-wrapper-attribute" not in ids(("trainer.py", src.replace("{read}", "self.model.state_dict()")))


def test_loss_that_all_reduces_its_own_graph():
    """lightly's Barlow Twins loss: the cross-correlation averaged with dist.all_reduce inside the loss, whose caller
    differentiates the result: not autograd-aware."""
    src = """
    import torch
    import torch.distributed as dist

    class BarlowTwinsLoss(torch.nn.Module):
        def forward(self, z_a, z_b):
            c = z_a.T @ z_b
            if dist.is_initialized():
                c = c / dist.get_world_size()
                {reduce}
            return torch.diagonal(c).add_(-1).pow_(2).sum()
    """
    assert "backward-through-all-reduce" in ids(("loss.py", src.replace("{reduce}", "dist.all_reduce(c)")))
    autograd = "c = torch.distributed.nn.functional.all_reduce(c)"
    assert "backward-through-all-reduce" not in ids(("loss.py", src.replace("{reduce}", autograd)))
    count = src.replace("{reduce}", "n = torch.tensor(c.shape[0])\n                dist.all_reduce(n)")
    assert "backward-through-all-reduce" not in ids(("loss.py", count))


def test_scores_assembled_from_rank_shares_are_no_hang_and_no_mean():
    """BLIP's and ALBEF's retrieval evaluation: each rank scores rows sims[start:end] (start from the rank) with no
    collective in the loop, then one SUM all_reduce assembles the matrix: no uneven-share hang, no mean."""
    src = """
    import torch
    import torch.distributed as dist

    def evaluation(model, sims, world, rank):
        score_matrix = torch.full(sims.shape, -100.0)
        step = sims.size(0) // world + 1
        start = rank * step
        end = min(sims.size(0), start + step)
        for i, row in enumerate(sims[start:end]):
            {body}
        dist.barrier()
        dist.all_reduce(score_matrix, op=dist.ReduceOp.SUM)
        return score_matrix.cpu().numpy()

    model = torch.nn.parallel.DistributedDataParallel(net)
    """
    got = ids(("eval.py", src.replace("{body}", "score_matrix[start + i] = model.head(row)")))
    assert "rank-sliced-data" not in got and "allreduce-sum-not-averaged" not in got
    hang = ids(("eval.py", src.replace("{body}", "dist.all_reduce(row)\n            score_matrix[start + i] = row")))
    assert "rank-sliced-data" in hang


def test_batch_variable_word_past_its_first_closing_quote():
    """GritLM: LAUNCHER="... --main_process_ip "$MASTER_ADDR" ... --machine_rank $SLURM_PROCID ..." is one shell
    word; the batch shell expands $SLURM_PROCID (0) when it assigns it, so all 32 nodes start with rank 0."""
    script = """#!/bin/bash
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1)
LAUNCHER="accelerate launch \\
    --num_machines 4 --num_processes 32 \\
    --main_process_ip "$MASTER_ADDR" \\
    --main_process_port 6000 \\
    --machine_rank $SLURM_PROCID \\
    "
srun bash -c "$LAUNCHER train.py"
"""
    assert "node-rank-fixed" in ids(("job.sh", script))
    assert "node-rank-fixed" not in ids(("job.sh", script.replace("rank $SLURM_PROCID", "rank \\$SLURM_PROCID")))


def test_loader_without_batching_handed_to_prepare():
    """uniem: DataLoader(batch_size=None) given to accelerator.prepare; under two processes Accelerate's
    prepare_data_loader raises "TypeError: 'NoneType' object is not iterable" (reproduced, accelerate 1.15)."""
    src = """
    from accelerate import Accelerator
    from torch.utils.data import DataLoader
    accelerator = Accelerator()
    loader = DataLoader({data}, batch_size={size}, collate_fn=collate)
    loader = accelerator.prepare(loader)
    """
    assert "loader-not-preparable" in ids(("train.py", src.replace("{data}", "ds").replace("{size}", "None")))
    assert "loader-not-preparable" not in ids(("train.py", src.replace("{data}", "ds").replace("{size}", "32")))
    streaming = src.replace("{data}", "streaming_ds").replace("{size}", "None")
    assert "loader-not-preparable" not in ids(("train.py", streaming))


def test_stride_by_the_world_size_that_ignores_the_rank():
    """ColBERT's Examples.tolist(rank, nranks): range(0, len(data), nranks) gives every rank the same elements."""
    src = """
    class Examples:
        def tolist(self, rank=None, nranks=None):
            if rank or nranks:
                return [self.data[i] for i in range({start}, len(self.data), nranks)]
            return list(self.data)
    """
    assert "rank-shard-unused" in ids(("examples.py", src.replace("{start}", "0")))
    assert "rank-shard-unused" not in ids(("examples.py", src.replace("{start}", "rank")))
    no_rank = "def every(data, world_size):\n    return data[::world_size]\n"
    assert "rank-shard-unused" not in ids(("sub.py", no_rank))


def test_dataloader_workers_from_the_node_cpu_count():
    """stable-pretraining: each task (one per GPU) starts SLURM_JOB_CPUS_PER_NODE workers, the node's CPUs."""
    src = """
    import os
    num_workers = int(os.environ.get("{var}", 1))
    """
    assert "slurm-env-misuse" in ids(("data.py", src.replace("{var}", "SLURM_JOB_CPUS_PER_NODE")))
    assert "slurm-env-misuse" not in ids(("data.py", src.replace("{var}", "SLURM_CPUS_PER_TASK")))


def test_contrastive_targets_against_gathered_rows():
    """solo-learn's SimCLR loss: (local x gathered) mask with fill_diagonal_; a CLIP-style loss with arange targets
    against the gathered texts: right on rank 0 only."""
    simclr = """
    import torch
    from solo.utils.misc import gather

    def simclr_loss_func(z, indexes):
        gathered_indexes = gather(indexes)
        pos_mask = (indexes.t() == gathered_indexes){fill}
        return pos_mask
    """
    assert "gathered-labels-without-rank-offset" in ids(("loss.py", simclr.replace("{fill}", ".fill_diagonal_(False)")))
    fixed = "\n        pos_mask[:, z.size(0) * get_rank():].fill_diagonal_(False)"
    assert "gathered-labels-without-rank-offset" not in ids(("loss.py", simclr.replace("{fill}", fixed)))
    clip = """
    import torch
    import torch.nn.functional as F

    def clip_loss(image, text, rank):
        all_text = concat_all_gather(text)
        logits = image @ all_text.t()
        labels = torch.arange(logits.shape[0]){offset}
        return F.cross_entropy(logits, labels)
    """
    assert "gathered-labels-without-rank-offset" in ids(("clip.py", clip.replace("{offset}", "")))
    assert "gathered-labels-without-rank-offset" not in ids(("clip.py", clip.replace("{offset}",
                                                                                        " + rank * logits.shape[0]")))
    square = clip.replace("logits = image @ all_text.t()", "logits = concat_all_gather(image) @ all_text.t()")
    assert "gathered-labels-without-rank-offset" not in ids(("clip.py", square.replace("{offset}", "")))
