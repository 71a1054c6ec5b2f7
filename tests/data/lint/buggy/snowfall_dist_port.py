# Source: https://github.com/k2-fsa/snowfall/issues/152
# Confirmed cause: a second training on the same machine fails with 'Address already in use': the port is hard-coded in snowfall/dist.py (maintainers confirmed)
# Expected rule(s): hardcoded-master-port
import os
import torch

def setup_dist(rank, world_size):
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ['MASTER_PORT'] = '12354'
    torch.distributed.init_process_group("nccl", rank=rank, world_size=world_size)
