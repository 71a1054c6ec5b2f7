# Source: https://github.com/huggingface/transformers/issues/31532
# Confirmed cause: reporter: only the main process entered the evaluate part, so gather_for_metrics waits for the other processes forever
# Expected rule(s): rank-gated-collective
from accelerate import Accelerator
accelerator = Accelerator()

def evaluate(model, eval_dataloader):
    model.eval()
    for batch in eval_dataloader:
        with torch.no_grad():
            outputs = model(**batch)
        predictions = accelerator.gather_for_metrics(outputs.logits.argmax(dim=-1))
    return predictions

progress_bar = tqdm(range(num_epochs * len(train_dataloader)), disable=not accelerator.is_main_process)
for epoch in range(num_epochs):
    for step, batch in enumerate(train_dataloader):
        ...
        if accelerator.is_main_process and progress_bar.n % eval_steps == 0:
            evaluate(model, eval_dataloader)
