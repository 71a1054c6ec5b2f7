# Source: https://github.com/deepspeedai/DeepSpeedExamples/blob/master/training/cifar/cifar10_deepspeed.py
# Confirmed cause: clean; look-alikes: model_engine.backward/step, prints gated on local_rank == 0, save_checkpoint on every rank, inputs cast to the engine dtype
# Expected rule(s): none (clean)
import deepspeed
import torch
from deepspeed.accelerator import get_accelerator

def main(args):
    deepspeed.init_distributed()
    net = Net()
    parameters = filter(lambda p: p.requires_grad, net.parameters())
    model_engine, optimizer, trainloader, __ = deepspeed.initialize(args=args, model=net, model_parameters=parameters,
                                                                    training_data=trainset, config=ds_config)
    local_device = get_accelerator().device_name(model_engine.local_rank)
    local_rank = model_engine.local_rank
    target_dtype = torch.bfloat16 if model_engine.bfloat16_enabled() else None
    for epoch in range(args.epochs):
        running_loss = 0.0
        for i, data in enumerate(trainloader):
            inputs, labels = data[0].to(local_device), data[1].to(local_device)
            if target_dtype != None:
                inputs = inputs.to(target_dtype)
            outputs = model_engine(inputs)
            loss = criterion(outputs, labels)
            model_engine.backward(loss)
            model_engine.step()
            running_loss += loss.item()
            if local_rank == 0 and i % args.log_interval == (args.log_interval - 1):
                print(f"[{epoch + 1 : d}, {i + 1 : 5d}] loss: {running_loss / args.log_interval : .3f}")
                running_loss = 0.0
    model_engine.save_checkpoint(args.save_dir)
