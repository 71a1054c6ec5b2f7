torch.distributed.init_process_group(backend='nccl',
                                     init_method='env://', world_size=2)
