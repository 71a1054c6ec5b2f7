# Source: https://github.com/openai/gpt-oss/issues/266
# Confirmed cause: global RANK used as the CUDA device index: cuda:4 on a 4-GPU node of a two-node launch (fixed by PR #267 with LOCAL_RANK)
# Expected rule(s): device-from-global-rank
import os
import torch
import torch.distributed as dist

def init_distributed() -> torch.device:
    world_size = int(os.environ.get("WORLD_SIZE", 1))
    rank = int(os.environ.get("RANK", 0))
    if world_size > 1:
        dist.init_process_group(backend="nccl", init_method="env://", world_size=world_size, rank=rank)
    torch.cuda.set_device(rank)
    device = torch.device(f"cuda:{rank}")
    return device
