# Source: https://github.com/kekmodel/FixMatch-pytorch/issues/34
# Confirmed cause: DistributedSampler without set_epoch(epoch): the same order every epoch (pytorch docs warning); maintainer: 'You are right'
# Expected rule(s): sampler-no-set-epoch
from torch.utils.data import DataLoader, RandomSampler
from torch.utils.data.distributed import DistributedSampler
train_sampler = RandomSampler if args.local_rank == -1 else DistributedSampler
labeled_trainloader = DataLoader(labeled_dataset, sampler=train_sampler(labeled_dataset), batch_size=args.batch_size)
for epoch in range(args.start_epoch, args.epochs):
    model.train()
    for batch_idx in range(args.eval_step):
        inputs_x, targets_x = next(labeled_iter)
