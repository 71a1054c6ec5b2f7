# Source: https://github.com/huggingface/accelerate/issues/2210
# Confirmed cause: accumulation given both to Accelerator(...) and in the DeepSpeed config: one overrides the other; maintainer: leave it 'auto' in the DeepSpeed config and set it in one place
# Expected rule(s): acc-accumulation-twice
from accelerate import Accelerator
accelerator = Accelerator(gradient_accumulation_steps=args.gradient_accumulation_steps, log_with='wandb', mixed_precision='bf16')
