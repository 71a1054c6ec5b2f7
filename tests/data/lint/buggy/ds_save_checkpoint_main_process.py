# Source: https://github.com/deepspeedai/DeepSpeed/issues/2993
# Confirmed cause: DeepSpeedEngine.save_checkpoint called only on the main process hangs; all ranks must call it (maintainer tjruwase)
# Expected rule(s): rank-gated-collective
import deepspeed
from accelerate import Accelerator
accelerator = Accelerator()
model, optimizer, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config="ds_config.json")
for step, batch in enumerate(loader):
    loss = model(batch)
    model.backward(loss)
    model.step()
    if accelerator.is_main_process:
        if global_step % checkpointing_steps == 0:
            model.save_checkpoint(save_path)
