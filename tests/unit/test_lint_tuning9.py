"""runbook lint rules tuned on the ninth blind set (tests/data/lint/blind9), each with its violation and its look-alike."""

from __future__ import annotations

import textwrap

from helpers.lint import lint_texts


def found(*files: tuple[str, str]) -> dict[str, list[str]]:
    """``{rule: [status, ...]}`` of the findings on ``files`` linted together."""
    out: dict[str, list[str]] = {}
    for f in lint_texts([(p, textwrap.dedent(t)) for p, t in files]):
        out.setdefault(f.id, []).append(f.status)
    return out


# ---------------------------------------------------------------------------------------------- false alarms removed

def test_state_dict_options_that_broadcast_from_rank0_load_and_gather_nothing():
    """torchtune: StateDictOptions(full_state_dict=True, broadcast_from_rank0=True) feeds set_model_state_dict."""
    text = """
    from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict, get_model_state_dict
    def load(model, sd):
        options = StateDictOptions(full_state_dict=True, broadcast_from_rank0=True{extra})
        return set_model_state_dict(model, sd, options=options)
    """
    assert "fsdp-full-state-dict-all-ranks" not in found(("t.py", text.replace("{extra}", "")))
    gather = text.replace(", broadcast_from_rank0=True{extra}", "")
    assert found(("t.py", gather))["fsdp-full-state-dict-all-ranks"] == ["WARN"]


INIT_BRANCH = """
import os
import torch.distributed as dist
def get_dist_info():
    if "RANK" in os.environ:
        return True, int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"]), int(os.environ["WORLD_SIZE"])
    return False, 0, 0, 1
def compute_init(device_type):
    is_ddp, rank, local_rank, world = get_dist_info()
    if is_ddp and device_type == "cuda":
{body}
"""


def test_a_barrier_in_the_branch_that_initialises_the_process_group_is_reached_by_every_member():
    """nanochat: `if is_ddp: init_process_group(); barrier()`: a rank that skips the branch has no process group."""
    inits = "        dist.init_process_group(backend='nccl')\n        dist.barrier()\n"
    assert "rank-gated-collective" not in found(("t.py", INIT_BRANCH.replace("{body}", inits)))
    gated = "        if rank == 0:\n            dist.barrier()\n"
    assert found(("t.py", INIT_BRANCH.replace("{body}", gated)))["rank-gated-collective"] == ["FAIL"]


def test_a_gate_every_rank_passes_when_the_model_is_sharded():
    """open_clip: `if fsdp_enabled or args.save_logs: save_checkpoint(...)` (save_logs is rank 0's)."""
    text = """
    import torch.distributed as dist
    def save(args, rank):
        if {gate}:
            dist.barrier()
    """
    assert "rank-gated-collective" not in found(("t.py", text.replace("{gate}", "args.fsdp or rank == 0")))
    assert found(("t.py", text.replace("{gate}", "args.verbose or rank == 0")))["rank-gated-collective"] == ["FAIL"]


def test_an_early_return_and_a_collective_under_exclusive_conditions():
    """open_clip evaluate(): non-zero ranks leave only when not use_fsdp_eval; the broadcast runs only when it is."""
    text = """
    import torch.distributed as dist
    def evaluate(args, signal):
        use_fsdp_eval = args.fsdp and args.distributed
        is_rank0 = dist.get_rank() == 0
        if not use_fsdp_eval and not is_rank0:
            return {}
        if {cond}:
            dist.broadcast(signal, src=0)
        return {}
    """
    assert "rank-early-exit-collective" not in found(("t.py", text.replace("{cond}", "use_fsdp_eval")))
    assert found(("t.py", text.replace("{cond}", "args.log")))["rank-early-exit-collective"] == ["FAIL"]


def test_an_error_path_that_stops_the_run_is_not_a_skipped_collective():
    """open_clip main(): rank 0 prints 'Error. Experiment already exists' and returns -1."""
    text = """
    import os
    import torch.distributed as dist
    def main(args):
        if dist.get_rank() == 0:
            if os.path.exists(args.log_path):
                {leave}
        dist.barrier()
    """
    assert "rank-early-exit-collective" not in found(("t.py", text.replace("{leave}", 'print("Error. exists")\n                return -1')))
    assert "rank-early-exit-collective" not in found(("t.py", text.replace("{leave}", 'logger.error("exists")\n                return')))
    assert found(("t.py", text.replace("{leave}", "return")))["rank-early-exit-collective"] == ["FAIL"]


# ---------------------------------------------------------------------------------------------- new findings

NANOGPT = """
import os
import torch
from torch.distributed import init_process_group
backend = 'nccl'
device = 'cuda'
ddp = int(os.environ.get('RANK', -1)) != -1
if ddp:
    init_process_group(backend=backend)
    ddp_local_rank = int(os.environ['LOCAL_RANK'])
    device = f'cuda:{ddp_local_rank}'
{bind}
model = torch.nn.Linear(2, 2).to(device)
"""


def test_a_per_rank_device_with_no_current_device_bound():
    """karpathy/nanoGPT#116: the tensors go to cuda:{local_rank}, the current device stays cuda:0."""
    assert found(("t.py", NANOGPT.replace("{bind}", "")))["nccl-no-device-binding"] == ["WARN"]
    assert "nccl-no-device-binding" not in found(("t.py", NANOGPT.replace("{bind}", "    torch.cuda.set_device(device)")))


TWO_D = """
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import parallelize_module, ColwiseParallel
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
def demo(model, dp, tp):
    mesh = init_device_mesh("cuda", (dp, tp), mesh_dim_names=("dp", "tp"))
    model = parallelize_module(model, mesh["tp"], {"net": ColwiseParallel()})
    model = FSDP(model{mesh})
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
"""


def test_fsdp_over_a_tensor_parallel_model_without_its_data_parallel_mesh():
    """pytorch/examples#1160: FSDP(model) after parallelize_module on a 2-D mesh shards over the whole world."""
    assert found(("t.py", TWO_D.replace("{mesh}", "")))["fsdp-mesh-without-group"] == ["WARN"]
    assert "fsdp-mesh-without-group" not in found(("t.py", TWO_D.replace("{mesh}", ", device_mesh=mesh['dp']")))
    one_d = TWO_D.replace("(dp, tp)", "(tp,)").replace("{mesh}", "")
    assert "fsdp-mesh-without-group" not in found(("t.py", one_d))


CKPT_DIR = """
import os
import torch
import torch.distributed as dist
def save_checkpoint(checkpoint_dir, step, model_data, optimizer_data, rank=0):
    if rank == 0:
        os.makedirs(checkpoint_dir, exist_ok=True)
        torch.save(model_data, os.path.join(checkpoint_dir, f"model_{step:06d}.pt"))
{between}
    optimizer_path = os.path.join(checkpoint_dir, f"optim_{step:06d}_rank{rank:d}.pt")
    torch.save(optimizer_data, optimizer_path)
"""


def test_a_directory_made_on_rank_0_and_written_by_every_rank():
    """karpathy/nanochat: each rank saves its optimizer shard into the directory rank 0 creates."""
    got = found(("t.py", CKPT_DIR.replace("{between}", "")))
    assert got["rank-gated-object-used"] == ["WARN"]
    assert "write-on-every-rank" not in got          # a per-rank file name: each rank writes its own file
    assert "rank-gated-object-used" not in found(("t.py", CKPT_DIR.replace("{between}", "    dist.barrier()")))
    assert "rank-gated-object-used" not in found(
        ("t.py", CKPT_DIR.replace("{between}", "    os.makedirs(checkpoint_dir, exist_ok=True)")))


SAVE_HOOK = """
import os
from accelerate import Accelerator
accelerator = Accelerator()
def save_model_hook(models, weights, output_dir):
{body}
accelerator.register_save_state_pre_hook(save_model_hook)
"""


def test_a_save_state_hook_that_writes_on_every_process():
    """huggingface/diffusers#4929: the hook runs in every process that calls save_state (all, under DeepSpeed)."""
    body = "    for model in models:\n        model.save_pretrained(os.path.join(output_dir, 'controlnet'))\n        weights.pop()\n"
    assert found(("t.py", SAVE_HOOK.replace("{body}", body)))["write-on-every-rank"] == ["WARN"]
    gated = ("    if accelerator.is_main_process:\n        for model in models:\n"
             "            model.save_pretrained(os.path.join(output_dir, 'controlnet'))\n            weights.pop()\n")
    assert "write-on-every-rank" not in found(("t.py", SAVE_HOOK.replace("{body}", gated)))


EFA_JOB = """#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
export NCCL_IB_DISABLE=1
{extra}
srun torchrun --nnodes 2 --nproc_per_node 8 --rdzv_backend c10d --rdzv_endpoint "$head:29500" train.py
"""


def test_ib_disabled_on_an_efa_cluster_is_the_usual_setting():
    """torchtitan's multinode_trainer.slurm (AWS): EFA is the aws-ofi-nccl plugin, not NCCL's IB verbs."""
    assert found(("job.slurm", EFA_JOB.replace("{extra}", "")))["multinode-ib-disabled"] == ["WARN"]
    efa = "export LD_LIBRARY_PATH=/opt/amazon/efa/lib:$LD_LIBRARY_PATH"
    assert "multinode-ib-disabled" not in found(("job.slurm", EFA_JOB.replace("{extra}", efa)))
    assert "multinode-ib-disabled" not in found(("job.slurm", EFA_JOB.replace("{extra}", "export FI_PROVIDER=efa")))
