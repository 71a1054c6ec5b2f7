# Source: https://github.com/huggingface/transformers-bloom-inference/pull/40
# Confirmed cause: rank 0 calls dist.barrier() while the other processes do not (deadlock); merged by the maintainer
# Expected rule(s): rank-gated-collective
import torch.distributed as dist
rank = dist.get_rank()

def get_checkpoint_files(model_name_or_path):
    ...

if rank == 0:
    # download the weights once, then let the others go
    get_checkpoint_files(model_name)
    dist.barrier()
