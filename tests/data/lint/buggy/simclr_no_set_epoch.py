# Source: https://github.com/Spijkervet/SimCLR/pull/26
# Confirmed cause: DistributedSampler without set_epoch(epoch): the same order every epoch (pytorch docs warning); merged
# Expected rule(s): sampler-no-set-epoch
import torch
from torch.utils.data.distributed import DistributedSampler
train_sampler = DistributedSampler(train_dataset, num_replicas=args.world_size, rank=rank, shuffle=True)
train_loader = torch.utils.data.DataLoader(train_dataset, batch_size=args.batch_size, shuffle=(train_sampler is None),
                                           drop_last=True, num_workers=args.workers, sampler=train_sampler)
model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[gpu])
for epoch in range(args.start_epoch, args.epochs):
    lr = optimizer.param_groups[0]["lr"]
    loss_epoch = train(args, train_loader, model, criterion, optimizer, writer)
