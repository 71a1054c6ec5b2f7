# Source: https://github.com/NVIDIA/apex/issues/629
# Confirmed cause: two processes save their checkpoints with the same file name: some checkpoints fail to load ('storage has wrong size')
# Expected rule(s): write-on-every-rank
import torch
from apex.parallel import DistributedDataParallel as DDP
torch.distributed.init_process_group(backend='nccl', init_method='env://')
model = DDP(model)
for epoch in range(args.epochs):
    train(model, optimizer, epoch)
    torch.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict()}, model_path)
