"""runbook lint changes made on the thirty-fifth blind set (tests/data/lint/blind35), each with its violation and
its look-alike."""

from __future__ import annotations

import textwrap

from helpers.lint import lint_texts


def findings(*files: tuple[str, str]) -> list[tuple[str, str]]:
    return [(f.id, f.status) for f in lint_texts([(n, textwrap.dedent(t)) for n, t in files])]


def ids(*files: tuple[str, str]) -> list[str]:
    return [i for i, status in findings(*files) if status != "OK"]


def test_trainer_push_to_hub_on_the_main_process_only():
    """alignment-handbook: `if accelerator.is_main_process: trainer.push_to_hub()`; save_model gathers under ZeRO-3 /
    FSDP: info where the file does not show a sharded config, an error where it does."""
    src = """
    from accelerate import Accelerator

    def main(trainer, accelerator, args):
        {cfg}
        if accelerator.is_main_process:
            trainer.push_to_hub()
        accelerator.wait_for_everyone()
    """
    got = findings(("run_dpo.py", src.replace("{cfg}", "pass")))
    assert ("rank-gated-collective", "INFO") in got
    sharded = findings(("run_dpo.py", src.replace("{cfg}", "args.deepspeed = 'zero3.json'")))
    assert ("rank-gated-collective", "FAIL") in sharded
    every = src.replace("if accelerator.is_main_process:\n            trainer.push_to_hub()", "trainer.push_to_hub()")
    assert "rank-gated-collective" not in [i for i, _s in findings(("run_dpo.py", every.replace("{cfg}", "pass")))]


def test_local_world_size_from_the_job_size_on_several_nodes():
    """LUMI's AI workshop: export LOCAL_WORLD_SIZE=$WORLD_SIZE in a 2-node sbatch script run with srun."""
    script = """#!/bin/bash
    #SBATCH --nodes={n}
    #SBATCH --ntasks-per-node=8
    export WORLD_SIZE=$SLURM_NPROCS
    export LOCAL_WORLD_SIZE={value}
    srun python train.py
    """
    assert "world-size-as-local" in ids(("run.sh", script.replace("{n}", "2").replace("{value}", "$WORLD_SIZE")))
    assert "world-size-as-local" not in ids(
        ("run.sh", script.replace("{n}", "2").replace("{value}", "$SLURM_NTASKS_PER_NODE")))
    assert "world-size-as-local" not in ids(("run.sh", script.replace("{n}", "1").replace("{value}", "$WORLD_SIZE")))


def test_distributed_sampler_without_shuffle_where_one_process_shuffles():
    """doctr's detection reference: DistributedSampler(..., shuffle=False) vs RandomSampler on one process."""
    src = """
    from torch.utils.data import RandomSampler, SequentialSampler
    from torch.utils.data.distributed import DistributedSampler

    def loader(train_set, distributed, rank):
        if distributed:
            sampler = DistributedSampler(train_set, rank=rank, shuffle={flag})
        else:
            sampler = {single}(train_set)
        return sampler
    """
    assert "sampler-no-shuffle" in ids(("train.py", src.replace("{flag}", "False").replace("{single}", "RandomSampler")))
    assert "sampler-no-shuffle" not in ids(("train.py", src.replace("{flag}", "True").replace("{single}", "RandomSampler")))
    assert "sampler-no-shuffle" not in ids(
        ("train.py", src.replace("{flag}", "False").replace("{single}", "SequentialSampler")))


def test_strided_shard_joined_rank_major():
    """Music-Source-Separation-Training's valid_multi_gpu: items[rank::world_size], then torch.cat of the gathered
    results cut to len(items)."""
    src = """
    import torch
    import torch.distributed as dist

    def valid(items, rank, world_size, run):
        mine = items[{shard}]
        local = torch.tensor(run(mine))
        gathered = [torch.zeros_like(local) for _ in range(world_size)]
        dist.all_gather(gathered, local)
        return torch.cat(gathered).tolist()[:len(items)]
    """
    assert "gather-order-differs" in ids(("valid.py", src.replace("{shard}", "rank::world_size")))
    n = "rank * len(items) // world_size:(rank + 1) * len(items) // world_size"
    assert "gather-order-differs" not in ids(("valid.py", src.replace("{shard}", n)))


def test_site_storage_variable_is_not_a_misspelling():
    """nersc-dl-wandb (blind35 clean): $SCRATCH (set by NERSC) beside a local `scratch=`; a misspelling one letter
    away stays a finding (when ShellCheck, the analyser, is installed)."""
    from helpers.script_traps import _shellcheck

    script = "#!/bin/bash\nscratch=/tmp/x\nCCONTAINER=img.sif\nsrun singularity exec {img} python train.py --out $SCRATCH/run\n"
    assert "shell-var-unset" not in ids(("job.sh", script.replace("{img}", "$CCONTAINER")))
    if _shellcheck() is not None:
        assert "shell-var-unset" in ids(("job.sh", script.replace("{img}", "$CONTAINER")))
