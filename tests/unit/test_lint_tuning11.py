"""runbook lint rules tuned on the eleventh blind set (tests/data/lint/blind11), each with its violation and its look-alike."""

from __future__ import annotations

import textwrap

from helpers.lint import lint_texts


def found(*files: tuple[str, str]) -> dict[str, list[str]]:
    """``{rule: [status, ...]}`` of the findings on ``files`` linted together."""
    out: dict[str, list[str]] = {}
    for f in lint_texts([(p, textwrap.dedent(t)) for p, t in files]):
        out.setdefault(f.id, []).append(f.status)
    return out


SHOULD_SAVE = """
import torch.distributed as dist
class PPOTrainer:
    def save_model(self, output_dir):
        if {gate}:
            state_dict = self.accelerator.get_state_dict(self.model)
            self.model.save_pretrained(output_dir, state_dict=state_dict)
"""


def test_training_arguments_should_save_is_the_main_process():
    """hiyouga/LLaMA-Factory: get_state_dict (a ZeRO-3 gather) under `if self.args.should_save:`."""
    assert found(("t.py", SHOULD_SAVE.replace("{gate}", "self.args.should_save")))["rank-gated-collective"] == ["FAIL"]
    assert "rank-gated-collective" not in found(("t.py", SHOULD_SAVE.replace("{gate}", "self.should_save")))


ADAPTER = """
import torch.distributed as dist
from peft import PeftModel
def checkpoint(vla, base_vla, adapter_dir, distributed_state):
    if distributed_state.is_main_process:
        vla.module.save_pretrained(adapter_dir)
{between}
    merged = PeftModel.from_pretrained(base_vla, adapter_dir)
    dist.barrier()
"""


def test_a_file_written_on_the_main_process_and_read_by_every_rank_without_a_barrier():
    """openvla/openvla: every rank loads the LoRA adapter rank 0 is still saving."""
    assert found(("t.py", ADAPTER.replace("{between}", "")))["rank-gated-object-used"] == ["WARN"]
    assert "rank-gated-object-used" not in found(("t.py", ADAPTER.replace("{between}", "    dist.barrier()")))


FIRST_NODE = """#!/bin/bash
#SBATCH --nodes={nodes}
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
export MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1)
{prefix}torchrun --nnodes=$SLURM_JOB_NUM_NODES --nproc_per_node=8 --rdzv_backend=c10d --rdzv_endpoint=$MASTER_ADDR:29500 train.py
"""


def test_a_multi_node_batch_script_that_starts_the_launcher_on_the_first_node_only():
    """Lumi-supercomputer/LUMI-AI-Guide: torchrun run by the batch script itself; sbatch runs it on the first node."""
    got = found(("job.sbatch", FIRST_NODE.replace("{nodes}", "4").replace("{prefix}", "")))
    assert got["nnodes-mismatch"] == ["FAIL"]
    assert "nnodes-mismatch" not in found(("job.sbatch", FIRST_NODE.replace("{nodes}", "4").replace("{prefix}", "srun ")))
    assert "nnodes-mismatch" not in found(("job.sbatch", FIRST_NODE.replace("{nodes}", "1").replace("{prefix}", "")))


def test_zero3_without_the_16bit_gather_is_info_until_a_script_saves_the_model():
    """ms-swift's accelerate multi_node.yaml alone: how the model is saved is not in the config."""
    acc = ("compute_environment: LOCAL_MACHINE\ndeepspeed_config:\n  zero_stage: 3\n  zero3_init_flag: false\n"
           "distributed_type: DEEPSPEED\nnum_machines: 1\nnum_processes: 8\n")
    assert found(("acc.yaml", acc))["ds-zero3-save-without-gather"] == ["INFO"]
    saver = "from transformers import Trainer\ntrainer = Trainer(model=model, args=args)\ntrainer.train()\ntrainer.save_model()\n"
    assert found(("acc.yaml", acc), ("train.py", saver))["ds-zero3-save-without-gather"] == ["WARN"]


def test_torch_load_of_a_per_rank_file_needs_no_map_location():
    """volcengine/verl: each rank loads f"model_world_size_{w}_rank_{rank}.pt", which it saved from its own GPU."""
    text = """
    import os, torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    def load(self, local_path):
        path = os.path.join(local_path, {name})
        return torch.load(path, weights_only=False)
    """
    assert "load-without-map-location" not in found(("t.py", text.replace("{name}", 'f"model_rank_{self.rank}.pt"')))
    assert found(("t.py", text.replace("{name}", '"model.pt"')))["load-without-map-location"] == ["WARN"]


VAR_DIST = """
import torch.distributed as tdist
__rank, __world_size = 0, 1
def initialize():
    global __rank, __world_size
    __rank, __world_size = tdist.get_rank(), tdist.get_world_size()
def is_visualizer():
    return __rank == 0
def allreduce(t):
    tdist.all_reduce(t)
"""
VAR_TRAIN = """
import dist
from trainer import VARTrainer
dist.initialize()
trainer = VARTrainer(is_visualizer={flag}, device="cuda")
"""
VAR_TRAINER = """
import dist
class VARTrainer:
    def __init__(self, is_visualizer, device):
        self.is_visualizer = is_visualizer
    def train_step(self, g_it, counts):
        if g_it % 500 == 0 and self.is_visualizer:
            dist.allreduce(counts)
"""


def test_a_rank_test_made_in_one_file_passed_through_another_to_a_collective_in_a_third():
    """FoundationVision/VAR: dist.is_visualizer() (rank 0) -> VARTrainer(is_visualizer=...) -> dist.allreduce under it."""
    files = [("dist.py", VAR_DIST), ("train.py", VAR_TRAIN.replace("{flag}", "dist.is_visualizer()")),
             ("trainer.py", VAR_TRAINER)]
    assert found(*files)["rank-gated-collective"] == ["FAIL"]
    same = [("dist.py", VAR_DIST), ("train.py", VAR_TRAIN.replace("{flag}", "True")), ("trainer.py", VAR_TRAINER)]
    assert "rank-gated-collective" not in found(*same)


def test_a_tuple_assignment_taints_element_by_element():
    """`rank, world = get_rank(), get_world_size()`: the world size is the same on every rank."""
    text = """
    import torch.distributed as dist
    def step(t):
        rank, world = dist.get_rank(), dist.get_world_size()
        if {test}:
            dist.all_reduce(t)
    """
    assert "rank-gated-collective" not in found(("t.py", text.replace("{test}", "world > 1")))
    assert found(("t.py", text.replace("{test}", "rank == 0")))["rank-gated-collective"] == ["FAIL"]


def test_a_launch_line_whose_script_path_is_a_command_substitution():
    """open-mmlab/mmdetection3d: `$(dirname "$0")/train.py $CONFIG --seed 0`, and train.py has no --seed."""
    launch = ('#!/usr/bin/env bash\nCONFIG=$1\nGPUS=$2\n'
              'python -m torch.distributed.launch --nproc_per_node=$GPUS $(dirname "$0")/train.py $CONFIG --seed 0\n')
    script = ("import argparse\nparser = argparse.ArgumentParser()\nparser.add_argument('config')\n"
              "parser.add_argument('--local-rank', '--local_rank', type=int, default=0)\n{seed}args = parser.parse_args()\n")
    assert found(("dist_train.sh", launch), ("train.py", script.replace("{seed}", "")))["script-arg-unknown"] == ["FAIL"]
    seeded = script.replace("{seed}", "parser.add_argument('--seed', type=int)\n")
    assert "script-arg-unknown" not in found(("dist_train.sh", launch), ("train.py", seeded))
