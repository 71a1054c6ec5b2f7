# Source: https://github.com/pytorch/examples/blob/main/distributed/FSDP/T5_training.py
# Confirmed cause: clean (reduced from the FSDP getting-started tutorial's MNIST script); look-alikes: all_reduce then print under rank == 0, set_device(rank) with mp.spawn's local index, FULL_STATE_DICT state_dict() on every rank with rank0_only, torch.save under rank == 0
# Expected rule(s): none (clean)
import functools
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.utils.data.distributed import DistributedSampler
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, FullStateDictConfig, StateDictType
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy
from datetime import timedelta

def setup(rank, world_size):
    dist.init_process_group("nccl", rank=rank, world_size=world_size, timeout=timedelta(minutes=10))

def train(args, model, rank, world_size, train_loader, optimizer, epoch, sampler=None):
    model.train()
    ddp_loss = torch.zeros(2).to(rank)
    if sampler:
        sampler.set_epoch(epoch)
    for batch_idx, (data, target) in enumerate(train_loader):
        data, target = data.to(rank), target.to(rank)
        optimizer.zero_grad()
        output = model(data)
        loss = F.nll_loss(output, target, reduction='sum')
        loss.backward()
        optimizer.step()
        ddp_loss[0] += loss.item()
        ddp_loss[1] += len(data)
    dist.all_reduce(ddp_loss, op=dist.ReduceOp.SUM)
    if rank == 0:
        print('Train Epoch: {} \tLoss: {:.6f}'.format(epoch, ddp_loss[0] / ddp_loss[1]))

def fsdp_main(rank, world_size, args):
    setup(rank, world_size)
    sampler1 = DistributedSampler(dataset1, rank=rank, num_replicas=world_size, shuffle=True)
    train_loader = torch.utils.data.DataLoader(dataset1, batch_size=args.batch_size, sampler=sampler1)
    my_auto_wrap_policy = functools.partial(size_based_auto_wrap_policy, min_num_params=100)
    torch.cuda.set_device(rank)
    model = Net().to(rank)
    model = FSDP(model, auto_wrap_policy=my_auto_wrap_policy)
    for epoch in range(1, args.epochs + 1):
        train(args, model, rank, world_size, train_loader, optimizer, epoch, sampler=sampler1)
    if args.save_model:
        dist.barrier()
        save_policy = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
        with FSDP.state_dict_type(model, StateDictType.FULL_STATE_DICT, save_policy):
            states = model.state_dict()
        if rank == 0:
            torch.save(states, "mnist_cnn.pt")

if __name__ == '__main__':
    WORLD_SIZE = torch.cuda.device_count()
    mp.spawn(fsdp_main, args=(WORLD_SIZE, args), nprocs=WORLD_SIZE, join=True)
