# Source: https://github.com/meta-llama/llama-cookbook/issues/90
# Confirmed cause: torch.cuda.set_device(rank) should use local_rank: 'invalid device ordinal' on every node but the first (reporter's fix worked)
# Expected rule(s): device-from-global-rank
import os
import torch
import torch.distributed as dist

def main(**kwargs):
    if train_config.enable_fsdp:
        setup()
        local_rank = int(os.environ["LOCAL_RANK"])
        rank = int(os.environ["RANK"])
        world_size = int(os.environ["WORLD_SIZE"])
    if torch.distributed.is_initialized():
        torch.cuda.set_device(rank)
