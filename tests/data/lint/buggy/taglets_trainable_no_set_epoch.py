# Source: https://github.com/BatsResearch/taglets/pull/28
# Confirmed cause: DistributedSampler without set_epoch(epoch): the same order every epoch (pytorch docs warning); merged
# Expected rule(s): sampler-no-set-epoch
import torch
class Trainable:
    def _do_train(self, rank, q, train_data, val_data):
        train_sampler = torch.utils.data.distributed.DistributedSampler(train_data, num_replicas=self.n_proc, rank=rank)
        train_data_loader = torch.utils.data.DataLoader(train_data, batch_size=self.batch_size, sampler=train_sampler)
        for epoch in range(self.num_epochs):
            train_loss, train_acc = self._train_epoch(rank, train_data_loader)
