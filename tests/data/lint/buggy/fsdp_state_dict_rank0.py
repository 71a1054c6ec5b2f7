# Source: https://github.com/pytorch/pytorch/issues/122903
# Confirmed cause: the FULL_STATE_DICT state_dict() is a collective (all-gather); calling it on rank 0 only hangs
# Expected rule(s): rank-gated-collective
from torch.distributed import init_process_group, barrier
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, FullStateDictConfig, StateDictType

def load_and_save(rank, model, auto_wrap_policy, event, counter):
    init_process_group("nccl", rank=rank, world_size=world_size)
    fsdp_model = FSDP(model, auto_wrap_policy=auto_wrap_policy, device_id=torch_device(f'cuda:{rank}'))
    save_policy = FullStateDictConfig(offload_to_cpu=True, rank0_only=True)
    with FSDP.state_dict_type(fsdp_model, StateDictType.FULL_STATE_DICT, save_policy):
        if rank == 0:
            cpu_state = fsdp_model.state_dict()
            save(cpu_state, f'{output_dir}/{file_name}.pt')
    barrier()

if __name__ == "__main__":
    mp.spawn(load_and_save, args=(model, policy, event, counter), nprocs=world_size)
