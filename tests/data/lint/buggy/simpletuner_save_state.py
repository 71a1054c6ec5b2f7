# Source: https://github.com/bghira/SimpleTuner/issues/262
# Confirmed cause: with DeepSpeed accelerator.save_state() hangs when called on the main process only; fixed by calling it on all processes
# Expected rule(s): rank-gated-collective
from accelerate import Accelerator
accelerator = Accelerator()
for step, batch in enumerate(train_dataloader):
    ...
    if accelerator.is_main_process:
        if global_step % args.checkpointing_steps == 0:
            save_path = os.path.join(args.output_dir, f"checkpoint-{global_step}")
            accelerator.save_state(save_path)
