# excerpt: line 11 of train_WIP.py as shown in the reporter's traceback
torch.distributed.init_process_group(backend="nccl", world_size=4)
