# Source: https://github.com/deepspeedai/DeepSpeed/issues/1270
# Confirmed cause: an HF-style config with "auto" used by a raw DeepSpeed script: TypeError: '>' not supported between 'str' and 'float' (maintainer asked, reporter confirmed HF config copied)
# Expected rule(s): ds-auto-raw-initialize
import deepspeed
model, optimizer, _, _ = deepspeed.initialize(args=args, model=model, model_parameters=model.parameters())
for step, batch in enumerate(train_dataloader):
    loss = model(**batch)[0]
    model.backward(loss)
    model.step()
