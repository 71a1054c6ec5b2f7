# Source: https://github.com/pytorch/examples/blob/main/distributed/FSDP2/example.py
# Confirmed cause: clean; look-alikes: a variable named rank holding LOCAL_RANK, MixedPrecisionPolicy (FSDP2, two dtypes), fully_shard per layer, the full state dict gathered on every rank and saved on rank 0
# Expected rule(s): none (clean)
import os
import torch
from torch.distributed.fsdp import fully_shard, MixedPrecisionPolicy
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

def main(args):
    rank = int(os.environ["LOCAL_RANK"])
    if torch.accelerator.is_available():
        device_type = torch.accelerator.current_accelerator()
        device = torch.device(f"{device_type}:{rank}")
        torch.accelerator.set_device_index(rank)
    torch.distributed.init_process_group(backend=backend, device_id=device, timeout=timeout)
    model = Transformer(model_args)
    fsdp_kwargs = {}
    if args.mixed_precision:
        fsdp_kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in model.layers:
        fully_shard(layer, **fsdp_kwargs)
    fully_shard(model, **fsdp_kwargs)
    optim = torch.optim.Adam(model.parameters(), lr=1e-2)
    for _ in range(10):
        x = torch.randint(0, vocab_size, (batch_size, seq_len), device=device)
        loss = model(x).sum()
        loss.backward()
        optim.step()
        optim.zero_grad()
    full_sd = get_model_state_dict(model=model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if torch.distributed.get_rank() == 0:
        torch.save(full_sd, args.checkpoint_path)
    torch.distributed.destroy_process_group()
