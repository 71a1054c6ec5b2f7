# Source: https://github.com/yangkky/distributed_tutorial/issues/5
# Confirmed cause: DistributedSampler without set_epoch(epoch): the same order every epoch (pytorch docs warning) (the tutorial's DistributedSampler loop never calls it)
# Expected rule(s): sampler-no-set-epoch
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

def train(gpu, args):
    rank = args.nr * args.gpus + gpu
    dist.init_process_group(backend='nccl', init_method='env://', world_size=args.world_size, rank=rank)
    torch.cuda.set_device(gpu)
    model = nn.parallel.DistributedDataParallel(model, device_ids=[gpu])
    train_sampler = torch.utils.data.distributed.DistributedSampler(train_dataset, num_replicas=args.world_size, rank=rank)
    train_loader = torch.utils.data.DataLoader(dataset=train_dataset, batch_size=batch_size, shuffle=False,
                                               num_workers=0, pin_memory=True, sampler=train_sampler)
    for epoch in range(args.epochs):
        for i, (images, labels) in enumerate(train_loader):
            loss = criterion(model(images.cuda(non_blocking=True)), labels.cuda(non_blocking=True))

if __name__ == '__main__':
    mp.spawn(train, nprocs=args.gpus, args=(args,))
