# Source: https://github.com/OpenGVLab/efficient-video-recognition/issues/18
# Confirmed cause: every rank writes the same checkpoint in DDP mode; the fix gates the save with dist.get_rank() == 0
# Expected rule(s): write-on-every-rank
import torch
import torch.distributed as dist
dist.init_process_group('nccl')
model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[cuda_device_id])
for i in range(resume_step, args.num_steps):
    loss = train_step(model, batch)
    if (i + 1) % args.save_freq == 0:
        torch.save({'model': model.state_dict(), 'optimizer': optimizer.state_dict(), 'next_step': i + 1},
                   os.path.join(args.checkpoint_dir, f'checkpoint-{i + 1}.pth'))
