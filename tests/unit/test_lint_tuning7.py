"""runbook lint rules tuned on the seventh blind set (tests/data/lint/blind7), each with its violation and its look-alike."""

from __future__ import annotations

import textwrap

from helpers.lint import lint_texts


def found(*files: tuple[str, str]) -> dict[str, list[str]]:
    """``{rule: [status, ...]}`` of the findings on ``files`` linted together."""
    out: dict[str, list[str]] = {}
    for f in lint_texts([(p, textwrap.dedent(t)) for p, t in files]):
        out.setdefault(f.id, []).append(f.status)
    return out


MASKED_GATHER = """
import torch
from accelerate import Accelerator
accelerator = Accelerator()
def threshold(entropies, mask):
    kept = entropies[mask.bool()].float()
    {pad}
    everything = accelerator.gather(kept)
    return torch.quantile(everything, 0.8)
"""


def test_a_gather_of_a_boolean_masked_tensor():
    """huggingface/trl#3964: each rank keeps a different number of tokens; all_gather needs equal sizes."""
    assert found(("t.py", MASKED_GATHER.replace("{pad}", "")))["gather-variable-shape"] == ["WARN"]
    padded = MASKED_GATHER.replace("{pad}", "kept = accelerator.pad_across_processes(kept, dim=0)")
    assert "gather-variable-shape" not in found(("t.py", padded))
    fixed = MASKED_GATHER.replace("entropies[mask.bool()].float()", "entropies.float()").replace("{pad}", "")
    assert "gather-variable-shape" not in found(("t.py", fixed))


CPU_GATHER = """
import torch
from accelerate import Accelerator
accelerator = Accelerator()
def tokens(inputs):
    return accelerator.gather_for_metrics(torch.tensor(inputs["position_ids"].size(1){device})).sum().item()
"""


def test_an_accelerate_gather_of_a_cpu_tensor():
    """huggingface/trl#3245: Accelerate hands the tensor to nccl unchanged; nccl takes CUDA tensors only."""
    assert found(("t.py", CPU_GATHER.replace("{device}", "")))["nccl-cpu-tensor"] == ["WARN"]
    assert "nccl-cpu-tensor" not in found(("t.py", CPU_GATHER.replace("{device}", ", device=accelerator.device")))


THREADS = """
import os, torch
def set_threads():
    n = os.cpu_count() // ({divisor} if torch.distributed.is_initialized() else 1)
    torch.set_num_threads(n)
"""


def test_the_nodes_cpus_divided_by_the_whole_jobs_ranks():
    """meta-pytorch/torchtune#2164: cpu_count() is one node's; the ranks sharing it are LOCAL_WORLD_SIZE."""
    assert found(("d.py", THREADS.replace("{divisor}", "torch.distributed.get_world_size()")))["world-size-as-local"] == ["WARN"]
    assert "world-size-as-local" not in found(("d.py", THREADS.replace("{divisor}", "int(os.environ['LOCAL_WORLD_SIZE'])")))


RESUME = """
from accelerate import Accelerator
accelerator = Accelerator()
def train(args, train_dataloader, starting_epoch, resume_step):
    for epoch in range(starting_epoch, args.num_train_epochs):
        if args.resume_from_checkpoint{epoch_test}:
            train_dataloader = accelerator.skip_first_batches(train_dataloader, num_batches=resume_step)
        for step, batch in enumerate(train_dataloader):
            pass
"""


def test_skip_first_batches_in_every_epoch():
    """huggingface/accelerate#2001: the skip belongs to the epoch the checkpoint stopped in."""
    assert found(("t.py", RESUME.replace("{epoch_test}", "")))["resume-skip-every-epoch"] == ["WARN"]
    assert "resume-skip-every-epoch" not in found(("t.py", RESUME.replace("{epoch_test}", " and epoch == starting_epoch")))


def test_an_accelerate_config_without_distribution_but_many_processes():
    """huggingface/trl#3637: launch.py turns multi-GPU on for num_processes > 1 when several GPUs are visible."""
    config = "compute_environment: LOCAL_MACHINE\ndistributed_type: 'NO'\nmixed_precision: 'no'\nnum_machines: 1\n" \
             "num_processes: {n}\nuse_cpu: false\n"
    assert found(("single_gpu.yaml", config.replace("{n}", "8")))["acc-processes-without-distribution"] == ["WARN"]
    assert "acc-processes-without-distribution" not in found(("single_gpu.yaml", config.replace("{n}", "1")))


SRUN = """#!/bin/bash
#SBATCH --nodes=2
srun --nodes=1 --ntasks=1 -w "$node_1" bash -c {quote}\\
&& pip install ray \\
&& ray start --head --block" &>> log &
"""


def test_bash_c_followed_by_an_operator_gets_no_command_string():
    """OpenRLHF ec131a8: the opening quote of the command string was missing; bash -c takes the next word."""
    assert found(("run.sh", SRUN.replace("{quote}", "")))["shell-c-without-command"] == ["FAIL"]
    assert "shell-c-without-command" not in found(("run.sh", SRUN.replace("{quote}", '"')))
    assert "shell-c-without-command" not in found(("run.sh", "#!/bin/bash\necho 'use bash -c && ...'\n"))


CHECKPOINT = """
import torch.distributed.checkpoint as dcp
def save_checkpoint(model, path, tokenizer=None, tokenizer_path=None):
    dcp.save({"model": model.state_dict()}, checkpoint_id=path)
    if tokenizer is not None:
        {gate}tokenizer.save_pretrained(tokenizer_path)
"""


def test_a_write_beside_a_collective_runs_on_every_rank():
    """NVIDIA-NeMo/RL#3504: every rank calls a function that calls dcp.save, so its ungated write runs N times."""
    assert found(("c.py", CHECKPOINT.replace("{gate}", "")))["write-on-every-rank"] == ["WARN"]
    gated = CHECKPOINT.replace("{gate}", "if torch.distributed.get_rank() == 0: ")
    assert "write-on-every-rank" not in found(("c.py", "import torch\n" + gated))
    plain = CHECKPOINT.replace("    dcp.save({\"model\": model.state_dict()}, checkpoint_id=path)\n", "").replace("{gate}", "")
    assert "write-on-every-rank" not in found(("c.py", plain))


SPAWNED = """
import torch, torch.multiprocessing as mp
from nemo.collections.nlp.models import MTEncDecModel
def translate(rank, world_size, path):
    {set_device}model = MTEncDecModel.restore_from(restore_path=path)
    model.to(rank)
def main():
    mp.spawn(translate, args=(2, "m.nemo"), nprocs=2, join=True)
"""


def test_a_checkpoint_restored_in_spawned_workers_without_a_device():
    """NVIDIA/NeMo#2312: restore_from maps to the current device, GPU 0 in every worker without set_device."""
    assert found(("t.py", SPAWNED.replace("{set_device}", "")))["load-without-map-location"] == ["WARN"]
    assert "load-without-map-location" not in found(("t.py", SPAWNED.replace("{set_device}", "torch.cuda.set_device(rank); ")))


FABRIC = """
import lightning as L
from lightning.fabric.strategies import FSDPStrategy
def main(fabric):
    fabric.seed_everything(1337{rank})
    with fabric.init_module(empty_init=False):
        model = GPT(config)
    model = fabric.setup(model)
fabric = L.Fabric(strategy=FSDPStrategy())
fabric.launch(main)
"""


def test_a_per_rank_seed_before_an_fsdp_model_is_built():
    """Lightning-AI/litgpt#269: FSDP keeps each rank's own initialisation (no broadcast without sync_module_states)."""
    assert found(("p.py", FABRIC.replace("{rank}", " + fabric.global_rank")))["rank-seed-before-model-init"] == ["WARN"]
    assert "rank-seed-before-model-init" not in found(("p.py", FABRIC.replace("{rank}", "")))
    ddp = FABRIC.replace("{rank}", " + fabric.global_rank").replace("FSDPStrategy()", "'ddp'").replace(
        "from lightning.fabric.strategies import FSDPStrategy\n", "")
    assert "rank-seed-before-model-init" not in found(("p.py", ddp))


FALSY = """
from nemo.utils.env_var_parsing import get_envint
def is_global_rank_zero():
    rank = get_envint("RANK", None)
    if {test}:
        return rank == 0
    return get_envint("SLURM_NODEID", 0) == 0 and get_envint("LOCAL_RANK", 0) == 0
"""


def test_a_rank_tested_for_truth():
    """NVIDIA/NeMo#3374: RANK=0 is false, so rank 0 took the SLURM path; os.environ.get gives the string "0"."""
    assert found(("g.py", FALSY.replace("{test}", "rank")))["rank-zero-falsy"] == ["WARN"]
    assert "rank-zero-falsy" not in found(("g.py", FALSY.replace("{test}", "rank is not None")))
    as_text = FALSY.replace('get_envint("RANK", None)', 'os.environ.get("RANK")').replace("{test}", "rank")
    assert "rank-zero-falsy" not in found(("g.py", "import os\n" + as_text))


def test_a_rank_taken_before_the_process_group_exists():
    """meta-pytorch/torchtune#193: the helper answers (1, 0) until init_process_group; called first, every rank is 0."""
    env = ("import torch\ndef get_world_size_and_rank():\n    if not torch.distributed.is_initialized():\n"
           "        return 1, 0\n    return torch.distributed.get_world_size(), torch.distributed.get_rank()\n")
    recipe = ("from env import get_world_size_and_rank, init_from_env, seed\ndef recipe(cfg):\n"
              "    {first}\n    {second}\n    seed(cfg.seed + rank)\n")
    before = recipe.replace("{first}", "world_size, rank = get_world_size_and_rank()").replace(
        "{second}", "device = init_from_env()")
    after = recipe.replace("{first}", "device = init_from_env()").replace(
        "{second}", "world_size, rank = get_world_size_and_rank()")
    assert found(("env.py", env), ("recipe.py", before))["rank-before-init"] == ["FAIL"]
    assert "rank-before-init" not in found(("env.py", env), ("recipe.py", after))
