# Source: https://github.com/LMCache/LMCache/issues/814
# Confirmed cause: the vLLM connector used the global rank as the device id, > GPUs per node on the second node (maintainer: use local_rank)
# Expected rule(s): device-from-global-rank
import torch
import torch.distributed as dist

def init_engine(config):
    global_rank = dist.get_rank()
    device_id = global_rank
    torch.cuda.set_device(device_id)
