# Source: https://github.com/pytorch/pytorch/issues/31771
# Confirmed cause: DistributedSampler without set_epoch(epoch): the same order every epoch (pytorch docs warning); triaged: set_epoch is required
# Expected rule(s): sampler-no-set-epoch
import torch
from torch.utils.data import Dataset, DataLoader
torch.distributed.init_process_group(backend="nccl")
dataset = RandomDataset()
sampler = torch.utils.data.distributed.DistributedSampler(dataset, shuffle=True)
dataloader = DataLoader(dataset, batch_size=5, pin_memory=True, drop_last=True, sampler=sampler)
for epoch in range(3):
    print("epoch: ", epoch)
    for i, data in enumerate(dataloader, 0):
        names, _ = data
        print(names)
