# Source: https://github.com/deepspeedai/DeepSpeed/issues/329
# Confirmed cause: maintainer: without model_engine.backward() gradients are not averaged/reduced; loss.backward() trains N different models
# Expected rule(s): deepspeed-raw-backward
import deepspeed
model_engine, optimizer, _, _ = deepspeed.initialize(args=args, model=net, model_parameters=net.parameters())
for step, batch in enumerate(data_loader):
    loss = model_engine(batch)
    loss.backward(retain_graph=True)
    loss.backward()
    optimizer.step()
