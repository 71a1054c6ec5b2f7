"""runbook lint changes made on the thirty-second blind set (tests/data/lint/blind32), each with its violation and
its look-alike."""

from __future__ import annotations

import textwrap

from helpers.lint import lint_texts


def ids(*files: tuple[str, str]) -> list[str]:
    return [f.id for f in lint_texts([(n, textwrap.dedent(t)) for n, t in files]) if f.status != "OK"]


def test_the_value_mp_spawn_returns():
    """RecBole: res = mp.spawn(...) returned to the caller; spawn returns None with join=True (its docstring)."""
    src = """
    import torch.multiprocessing as mp

    def run(args):
        res = mp.spawn(worker, args=(args,), nprocs=args.nproc{join})
        {use}
    """
    assert "spawn-result-used" in ids(("run.py", src.replace("{join}", "").replace("{use}", "return res")))
    context = src.replace("{join}", ", join=False").replace("{use}", "res.join()")
    assert "spawn-result-used" not in ids(("run.py", context))
    assert "spawn-result-used" not in ids(("run.py", src.replace("{join}", "").replace("{use}", "return None")))


def test_functional_collective_result_dropped():
    """stable-pretraining: torch.distributed.nn.functional.all_gather(tensor) on a line of its own, then the input
    returned: the gathered tuple is thrown away (the functional collectives are out of place)."""
    src = """
    import torch

    def all_gather(tensor):
        {call}
        return (tensor,)
    """
    dropped = "torch.distributed.nn.functional.all_gather(tensor)"
    assert "collective-result-discarded" in ids(("dist.py", src.replace("{call}", dropped)))
    kept = "return torch.distributed.nn.functional.all_gather(tensor)"
    assert "collective-result-discarded" not in ids(("dist.py", src.replace("{call}", kept)))
    in_place = "torch.distributed.all_reduce(tensor)"
    assert "collective-result-discarded" not in ids(("dist.py", src.replace("{call}", in_place)))


def test_fsdp_wrap_class_of_another_model_family():
    """LLaVA: --fsdp_transformer_layer_cls_to_wrap LlamaDecoderLayer for mosaicml/mpt-7b-chat."""
    line = ("torchrun --nnodes=1 --nproc_per_node=8 train.py --model_name_or_path {model} --bf16 True "
            "--fsdp 'full_shard auto_wrap' --fsdp_transformer_layer_cls_to_wrap 'LlamaDecoderLayer'\n")
    assert "fsdp-wrap-class-mismatch" in ids(("run.sh", line.replace("{model}", "mosaicml/mpt-7b-chat")))
    for model in ("meta-llama/Llama-2-7b-hf", "lmsys/vicuna-7b-v1.5", "./checkpoints/my-model"):
        assert "fsdp-wrap-class-mismatch" not in ids(("run.sh", line.replace("{model}", model))), model


def test_local_rank_read_before_the_name_is_rebound_to_the_global_rank():
    """torchrec's nvt example: rank = LOCAL_RANK picks the device, then rank = dist.get_rank() further down."""
    src = """
    import os
    import torch
    import torch.distributed as dist

    def main():
        rank = int(os.environ["{var}"])
        device = torch.device(f"cuda:{rank}")
        torch.cuda.set_device(device)
        dist.init_process_group("nccl")
        rank = dist.get_rank()
    """
    assert "device-from-global-rank" not in ids(("train.py", src.replace("{var}", "LOCAL_RANK")))
    assert "device-from-global-rank" in ids(("train.py", src.replace("{var}", "RANK")))


def test_per_node_main_flag_that_gates_prints_only():
    """TabPFN's fine-tuning example: is_main_process from LOCAL_RANK gates prints and an evaluation: once per node
    is harmless; gating a W&B run it is the per-node tracker of prime-rl."""
    src = """
    import os

    def main():
        is_main_process = int(os.environ.get("LOCAL_RANK", "0")) == 0
        if is_main_process:
            {body}
    """
    assert "local-rank-as-global-rank" not in ids(("ft.py", src.replace("{body}", 'print("fitting")')))
    assert "local-rank-as-global-rank" in ids(("ft.py", src.replace("{body}", 'wandb.init(project="x")')))


def test_profile_files_named_by_the_microsecond():
    """dlrm: each process writes "dlrm_s_pytorch" + str(datetime.now()) + "_shape.prof": one file per process."""
    src = """
    import datetime
    import torch.distributed as dist

    dist.init_process_group("gloo")
    time_stamp = {stamp}
    with open("dlrm" + time_stamp + "_shape.prof", "w") as f:
        f.write("x")
    """
    assert "write-on-every-rank" not in ids(("dlrm.py", src.replace("{stamp}", "str(datetime.datetime.now())")))
    assert "write-on-every-rank" in ids(("dlrm.py", src.replace("{stamp}", '"run"')))
    early_exit = """
    import os

    class Monitor:
        def __init__(self, config):
            rank = int(os.environ.get("LOCAL_RANK", "0"))
            self.is_master = rank == 0
            if not self.is_master:
                return
            self.wandb = wandb.init(project=config.project)
    """
    assert "local-rank-as-global-rank" in ids(("monitor.py", early_exit))  # prime-rl: the W&B run after the exit


def test_launch_world_size_against_the_configs_parallel_layout():
    """nanotron's tiny-llama example: `python -u -m torch.distributed.run --nproc_per_node 2` with a config whose
    dp x tp x pp = 8; ParallelContext asserts TP*CP*DP*PP == WORLD_SIZE."""
    config = "parallelism:\n  dp: 2\n  pp: 2\n  tp: {tp}\n"
    launch = ("python -u -m torch.distributed.run --nproc_per_node 2 --nnodes 1 run_train.py "
              "--config-file examples/config_tiny.yaml\n")
    assert "nnodes-mismatch" in ids(("config_tiny.yaml", config.replace("{tp}", "2")), ("train.sh", launch))
    fits = launch.replace("--nproc_per_node 2", "--nproc_per_node 8")
    assert "nnodes-mismatch" not in ids(("config_tiny.yaml", config.replace("{tp}", "2")), ("train.sh", fits))
    assert "nnodes-mismatch" not in ids(("other.yaml", config.replace("{tp}", "2")), ("train.sh", launch))
