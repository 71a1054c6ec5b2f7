"""runbook lint changes made on the twentieth blind set (tests/data/lint/blind20), each with its violation and its
look-alike."""

from __future__ import annotations

import textwrap

from helpers.launch_parse import launcher_argv
from helpers.lint import lint_texts


def ids(*files: tuple[str, str]) -> list[str]:
    return [f.id for f in lint_texts([(n, textwrap.dedent(t)) for n, t in files]) if f.status != "OK"]


def test_a_subgroup_collective_under_a_role_test_is_not_rank_gated():
    """Lightning's decoupled RL example: the trainer (rank 1) and the player share a two-rank group."""
    text = """
    import torch.distributed as dist
    def train(global_rank, player_trainer_collective, metrics):
        if global_rank == 1:
            player_trainer_collective.broadcast_object_list([metrics], src=1)
    """
    assert "rank-gated-collective" not in ids(("train.py", text))
    world = text.replace("player_trainer_collective.broadcast_object_list", "dist.broadcast_object_list")
    assert "rank-gated-collective" in ids(("train.py", world))


def test_checkpoints_saved_from_cpu_copies_load_without_map_location():
    text = """
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, FullStateDictConfig
    policy = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
    def save(model, path):
        torch.save(model.state_dict(), path)
    def load(model, path):
        model.load_state_dict(torch.load(path))
    """
    assert "load-without-map-location" not in ids(("ckpt.py", text))
    gpu = text.replace("offload_to_cpu=True, ", "")
    assert "load-without-map-location" in ids(("ckpt.py", gpu))


def test_a_step_skipped_on_one_rank_by_an_exception():
    text = """
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP
    model = DDP(torch.nn.Linear(2, 2))
    for batch in loader:
        try:
            loss = model(batch).sum()
            loss.backward()
        except NoValidAnchorsError:
            continue
        opt.step()
    """
    assert "exception-skips-collective" in ids(("train.py", text))
    assert "exception-skips-collective" not in ids(("train.py", text.replace("NoValidAnchorsError", "StopIteration")))
    assert "exception-skips-collective" not in ids(("train.py", text.replace("            continue\n",
                                                                               "            raise\n")))


def test_a_loader_wrapped_before_accelerate_prepares_it():
    text = """
    from accelerate import Accelerator
    from torch.utils.data import DataLoader
    accelerator = Accelerator()
    dl = DataLoader(ds, batch_size=8, shuffle=True)
    dl = cycle(dl)
    model, dl, opt = accelerator.prepare(model, dl, opt)
    """
    assert "loader-wrapped-before-prepare" in ids(("trainer.py", text))
    fixed = text.replace("    dl = cycle(dl)\n    model, dl, opt = accelerator.prepare(model, dl, opt)",
                         "    model, dl, opt = accelerator.prepare(model, dl, opt)\n    dl = cycle(dl)")
    assert fixed != text
    assert "loader-wrapped-before-prepare" not in ids(("trainer.py", fixed))


def test_push_to_hub_on_every_rank_of_a_deepspeed_trainer_script():
    text = """
    from transformers import TrainingArguments
    from trl import SFTTrainer
    args = TrainingArguments(output_dir="out", deepspeed="ds_config.json")
    trainer = SFTTrainer(model=model, args=args)
    trainer.train()
    model.push_to_hub("me/model")
    """
    assert "write-on-every-rank" in ids(("train.py", text))
    assert "write-on-every-rank" not in ids(("train.py", text.replace("model.push_to_hub", "trainer.push_to_hub")))
    gated = text.replace('model.push_to_hub("me/model")', 'if trainer.is_world_process_zero():\n'
                                                          '    model.push_to_hub("me/model")')
    assert "write-on-every-rank" not in ids(("train.py", gated))


def test_an_object_made_on_the_main_process_only_gates_what_uses_it():
    text = """
    from accelerate import Accelerator
    accelerator = Accelerator()
    def main(cfg, model, pre):
        ema = None
        if accelerator.is_main_process:
            ema = EMAModel(model.parameters())
        if ema is not None:
            pre.push_to_hub("me/model-ema")
    main(cfg, model, pre)
    """
    assert "write-on-every-rank" not in ids(("train.py", text))
    every = text.replace("        if accelerator.is_main_process:\n            ema = EMAModel",
                         "        if cfg.ema:\n            ema = EMAModel")
    assert "write-on-every-rank" in ids(("train.py", every))


def test_torchrun_workers_per_node_from_slurms_task_count():
    job = ("#!/bin/bash\n#SBATCH -N 1\n#SBATCH --ntasks-per-node=1\nsrun bash -c \"python -m torch.distributed.run "
           "--nproc_per_node $SLURM_NTASKS_PER_NODE --nnodes $SLURM_NNODES train.py\"\n")
    assert "slurm-env-misuse" in ids(("job.sh", job))
    assert "slurm-env-misuse" not in ids(("job.sh", job.replace("$SLURM_NTASKS_PER_NODE", "$SLURM_GPUS_ON_NODE")))


def test_a_node_count_override_against_the_allocation():
    job = ("#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --gpus-per-node=4\npython3 -m verl.trainer.main_ppo "
           "trainer.n_gpus_per_node=4 trainer.nnodes=1 trainer.total_epochs=15\n")
    assert "nnodes-mismatch" in ids(("job.slurm", job))
    assert "nnodes-mismatch" not in ids(("job.slurm", job.replace("trainer.nnodes=1", "trainer.nnodes=2")))
    assert "nnodes-mismatch" not in ids(("job.slurm", job.replace("trainer.nnodes=1", "trainer.nnodes=$SLURM_NNODES")))


def test_the_deepspeed_config_given_twice():
    script = """
    import argparse, deepspeed
    parser = argparse.ArgumentParser()
    parser = deepspeed.add_config_arguments(parser)
    args = parser.parse_args()
    engine, opt, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters(),
                                             config="ds_config.json")
    """
    launch = "uv run deepspeed --num_gpus=1 train.py --deepspeed_config ds_config.json\n"
    assert "ds-config-twice" in ids(("train.py", script), ("run.sh", launch))
    once = launch.replace(" --deepspeed_config ds_config.json", "")
    assert "ds-config-twice" not in ids(("train.py", script), ("run.sh", once))


def test_runners_that_pass_the_command_on():
    assert launcher_argv("uv run deepspeed --num_gpus=1 a.py".split()) == ("deepspeed", ["--num_gpus=1", "a.py"])
    assert launcher_argv("nohup torchrun --nproc-per-node 2 a.py".split())[0] == "torchrun"
    assert launcher_argv("uv pip install deepspeed".split()) is None


def test_a_clock_verdict_made_common_is_not_clock_gated():
    text = """
    import time, torch.distributed as dist
    def loop(cfg, start, step):
        done = synchronize_flag(time.time() - start >= cfg.limit)
        if done:
            dist.barrier()
    """
    assert "clock-gated-collective" not in ids(("train.py", text))
    raw = text.replace("synchronize_flag(time.time() - start >= cfg.limit)", "time.time() - start >= cfg.limit")
    assert "clock-gated-collective" in ids(("train.py", raw))
