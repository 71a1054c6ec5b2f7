# Source: https://github.com/lucidrains/DALLE-pytorch/pull/230
# Confirmed cause: DistributedSampler without set_epoch(epoch): the same order every epoch (pytorch docs warning); merged
# Expected rule(s): sampler-no-set-epoch
import torch
from torch.utils.data.distributed import DistributedSampler
data_sampler = DistributedSampler(ds, num_replicas=distr_backend.get_world_size(), rank=distr_backend.get_rank())
dl = DataLoader(ds, batch_size=BATCH_SIZE, shuffle=not data_sampler, drop_last=True, sampler=data_sampler)
for epoch in range(resume_epoch, EPOCHS):
    for i, (text, images) in enumerate(distr_dl):
        loss = distr_dalle(text, images, return_loss=True)
