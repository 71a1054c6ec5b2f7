# Source: https://github.com/bytedance/ibot/issues/15
# Confirmed cause: every process saves the same checkpoint file (duplicate writes, unloadable checkpoint); maintainer: 'Problem fixed'
# Expected rule(s): write-on-every-rank
import torch
import torch.distributed as dist
dist.init_process_group(backend="nccl")
for epoch in range(start_epoch, args.epochs):
    train_stats = train_one_epoch(student, teacher, data_loader, optimizer, epoch, args)
    save_dict = {'student': student.state_dict(), 'teacher': teacher.state_dict(), 'epoch': epoch + 1}
    torch.save(save_dict, os.path.join(args.output_dir, 'checkpoint.pth'))
