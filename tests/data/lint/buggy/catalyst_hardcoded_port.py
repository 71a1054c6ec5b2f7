# Source: https://github.com/catalyst-team/catalyst/pull/716
# Confirmed cause: 'DDP couldn't start twice at the same time on the same machine, because the master port is hardcoded' (merged)
# Expected rule(s): hardcoded-master-port
import os
import torch.distributed as dist

def get_slurm_params():
    ...

def distributed_cmd_run(worker_fn, distributed=True, *args, **kwargs):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = "424242"
    dist.init_process_group("nccl")
