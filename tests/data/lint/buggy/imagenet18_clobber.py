# Source: https://github.com/cybertronai/imagenet18_old/issues/16
# Confirmed cause: maintainer: 'multiple workers save and clobber each other's checkpoints'
# Expected rule(s): write-on-every-rank
import torch
import torch.distributed as dist
dist.init_process_group(backend=args.dist_backend, init_method=args.dist_url, world_size=args.world_size)
model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.local_rank])
for epoch in range(args.start_epoch, args.epochs):
    train(trn_loader, model, criterion, optimizer, epoch)
    torch.save({'epoch': epoch + 1, 'state_dict': model.state_dict()}, f'{args.save_dir}/checkpoint.pth.tar')
