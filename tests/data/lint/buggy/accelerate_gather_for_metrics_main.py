# Source: https://github.com/huggingface/accelerate/issues/2785
# Confirmed cause: reporter: gather_for_metrics() isn't happy to be under accelerator.is_main_process; moving it out fixed the hang
# Expected rule(s): rank-gated-collective
from accelerate import Accelerator
accelerator = Accelerator(gradient_accumulation_steps=GRADIENT_ACCUM_STEPS)
for epoch in range(EPOCHS):
    model.eval()
    if accelerator.is_main_process:
        for images, targets in testloader:
            with torch.no_grad():
                pred = model(images)
            pred, targets = accelerator.gather_for_metrics((pred, targets))
