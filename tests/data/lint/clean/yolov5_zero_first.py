# Source: https://github.com/ultralytics/yolov5/blob/master/utils/torch_utils.py
# Confirmed cause: clean; look-alike: two rank-gated barriers that pair up (each rank calls exactly one)
# Expected rule(s): none (clean)
from contextlib import contextmanager
import torch.distributed as dist

@contextmanager
def torch_distributed_zero_first(local_rank: int):
    # Decorator to make all processes in distributed training wait for each local_master to do something
    if local_rank not in [-1, 0]:
        dist.barrier(device_ids=[local_rank])
    yield
    if local_rank == 0:
        dist.barrier(device_ids=[0])
