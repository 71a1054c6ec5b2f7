# Source: https://github.com/pytorch/tutorials/blob/main/intermediate_source/ddp_tutorial.rst
# Confirmed cause: clean; look-alikes: model.to(rank)/device_ids=[rank] with mp.spawn's local index, torch.save under rank == 0 with the barrier outside the gate
# Expected rule(s): none (clean)
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP
from datetime import timedelta

def setup(rank, world_size):
    # MASTER_ADDR/MASTER_PORT come from the environment (the tutorial hard-codes them; not reproduced here)
    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=timedelta(minutes=5))

def demo_checkpoint(rank, world_size):
    print(f"Running DDP checkpoint example on rank {rank}.")
    setup(rank, world_size)
    model = ToyModel().to(rank)
    ddp_model = DDP(model, device_ids=[rank])
    loss_fn = nn.MSELoss()
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.001)
    CHECKPOINT_PATH = tempfile.gettempdir() + "/model.checkpoint"
    if rank == 0:
        torch.save(ddp_model.state_dict(), CHECKPOINT_PATH)
    dist.barrier()
    map_location = {'cuda:%d' % 0: 'cuda:%d' % rank}
    ddp_model.load_state_dict(torch.load(CHECKPOINT_PATH, map_location=map_location, weights_only=True))
    optimizer.zero_grad()
    outputs = ddp_model(torch.randn(20, 10))
    labels = torch.randn(20, 5).to(rank)
    loss_fn(outputs, labels).backward()
    optimizer.step()
    if rank == 0:
        os.remove(CHECKPOINT_PATH)
    cleanup()

def run_demo(demo_fn, world_size):
    mp.spawn(demo_fn, args=(world_size,), nprocs=world_size, join=True)
