# Source: https://github.com/Snowdar/asv-subtools/issues/8
# Confirmed cause: DistributedSampler without set_epoch(epoch): the same order every epoch (pytorch docs warning); maintainer: 'the answer is yes ... we will fix it'
# Expected rule(s): sampler-no-set-epoch
import torch
class Bunch:
    def __init__(self, trainset, valid, use_fast_loader=False, max_prefetch=10, batch_size=512, shuffle=True):
        if utils.use_ddp():
            train_sampler = torch.utils.data.distributed.DistributedSampler(trainset, shuffle=shuffle)
            self.train_loader = DataLoader(trainset, batch_size=batch_size, sampler=train_sampler)

def run_epochs(self):
    for this_epoch in range(start_epoch, epochs):
        for batch in data.train_loader:
            self.train_one_batch(batch)
