"""runbook lint rules tuned on the thirteenth blind set (tests/data/lint/blind13), each with its violation and its look-alike."""

from __future__ import annotations

import textwrap

from helpers.lint import lint_texts


def ids(text: str, name: str = "train.py") -> list[str]:
    return [f.id for f in lint_texts([(name, textwrap.dedent(text))]) if f.status != "OK"]


DDP_HEAD = """
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader
from torch.utils.data.distributed import DistributedSampler
dist.init_process_group("nccl")
model = DDP(torch.nn.Linear(2, 2))
"""


def test_loader_without_distributed_sampler_under_ddp():
    bad = DDP_HEAD.replace("from torch.utils.data.distributed import DistributedSampler\n", "") + \
        "loader = DataLoader(ds, batch_size=8, shuffle=True)\n"
    assert "sampler-not-distributed" in ids(bad)
    good = DDP_HEAD + "sampler = DistributedSampler(ds)\nloader = DataLoader(ds, batch_size=8, sampler=sampler)\n"
    assert "sampler-not-distributed" not in ids(good)
    other = bad.replace("from torch.utils.data import DataLoader", "from dgl.dataloading import DataLoader")
    assert "sampler-not-distributed" not in ids(other)          # another library's loader shards itself (use_ddp)


def test_distributed_sampler_never_given_to_a_loader():
    bad = DDP_HEAD + "sampler = DistributedSampler(ds)\nloader = DataLoader(ds, batch_size=8, shuffle=True)\n"
    assert "sampler-not-distributed" in ids(bad)


def test_same_tensor_all_reduced_twice():
    bad = "import torch.distributed as dist\nif ws > 1:\n    dist.all_reduce(acc)\n    dist.all_reduce(acc)\n"
    assert "collective-same-tensor-twice" in ids(bad)
    good = "import torch.distributed as dist\ndist.all_reduce(acc)\nacc = acc / 2\ndist.all_reduce(acc)\n" \
           "dist.all_reduce(val_acc)\n"
    assert "collective-same-tensor-twice" not in ids(good)


def test_rank_env_from_local_rank():
    bad = """
    import os
    import torch.distributed as dist
    def setup(local_rank, world_size, address):
        os.environ["MASTER_ADDR"] = address
        os.environ["RANK"] = str(local_rank)
        dist.init_process_group("nccl", world_size=world_size)
    """
    assert "local-rank-as-global-rank" in ids(bad)
    one_node = bad.replace('os.environ["MASTER_ADDR"] = address', 'os.environ["MASTER_ADDR"] = "localhost"')
    assert "local-rank-as-global-rank" not in ids(one_node)


def test_complementary_rank_gates_make_the_object_everywhere():
    text = """
    import torch.distributed as dist
    def main(rank):
        if rank == 0:
            dataset = load()
        dist.barrier()
        if rank != 0:
            dataset = load()
        print(dataset.num_features)
    """
    assert "rank-gated-object-used" not in ids(text)
    assert "rank-gated-object-used" in ids(text.replace("if rank != 0:\n            dataset = load()\n", ""))


def test_own_initialize_is_not_deepspeed():
    text = """
    import torch
    def initialize(config):
        return model, opt
    model, opt = initialize(cfg)
    loss.backward()
    """
    assert "deepspeed-raw-backward" not in ids(text)
    assert "deepspeed-raw-backward" in ids("import deepspeed\nengine, opt, _, _ = deepspeed.initialize(model=m)\n"
                                           "loss.backward()\n")


def test_sampler_seed_per_rank_in_one_file_and_across_files():
    one = """
    import torch.distributed as dist
    from torch.utils.data.distributed import DistributedSampler
    rank = dist.get_rank()
    sampler = DistributedSampler(ds, seed=args.seed + rank)
    """
    assert "sampler-seed-per-rank" in ids(one)
    assert "sampler-seed-per-rank" not in ids(one.replace("seed=args.seed + rank", "seed=args.seed"))
    main = textwrap.dedent("""
    import torch.distributed as dist
    from data import get_loader
    local_rank = dist.get_rank()
    worker_seeds = make_seeds(flags.seed)
    flags.seed = worker_seeds[local_rank]
    loader = get_loader(flags)
    """)
    data = textwrap.dedent("""
    from torch.utils.data import DataLoader
    from torch.utils.data.distributed import DistributedSampler
    def get_loader(flags):
        sampler = DistributedSampler(ds, seed=flags.seed, drop_last=True)
        return DataLoader(ds, sampler=sampler)
    """)
    got = [(f.file, f.id) for f in lint_texts([("main.py", main), ("data.py", data)]) if f.status != "OK"]
    assert ("data.py", "sampler-seed-per-rank") in got
    alone = [f.id for f in lint_texts([("data.py", data)]) if f.status != "OK"]
    assert "sampler-seed-per-rank" not in alone


def test_mpirun_capital_n_is_per_node():
    from helpers import script_traps

    both = "mpirun --hostfile ~/hostfile \\\n  -N $NUM_NODES \\\n  -npernode 1 \\\n  bash run.sh\n"
    got = {t.id: t.status for t in script_traps.text_traps(both)}
    assert got.get("mpirun-count-flags") == "FAIL"
    alone = {t.id: t.status for t in script_traps.text_traps("mpirun -N ${SLURM_NNODES} python train.py\n")}
    assert alone.get("mpirun-count-flags") == "WARN"
    fine = {t.id for t in script_traps.text_traps("mpirun -N 8 --hostfile hosts python train.py\nsrun -N $NNODES x\n")}
    assert "mpirun-count-flags" not in fine


def test_option_the_script_refuses_without_an_env_var():
    args_py = textwrap.dedent("""
    import os
    def validate(args):
        if os.environ.get('CUDA_DEVICE_MAX_CONNECTIONS') != "1":
            if args.sequence_parallel:
                raise RuntimeError("Using sequence parallelism requires setting the environment variable "
                                   "CUDA_DEVICE_MAX_CONNECTIONS to 1")
    """)
    launch = "torchrun --nproc-per-node 8 pretrain_gpt.py \\\n  --tensor-model-parallel-size 2 \\\n  --sequence-parallel\n"
    got = [(f.file, f.id) for f in lint_texts([("arguments.py", args_py), ("run.sh", launch)]) if f.status != "OK"]
    assert ("run.sh", "script-env-required") in got
    fixed = "export CUDA_DEVICE_MAX_CONNECTIONS=1\n" + launch
    got = [f.id for f in lint_texts([("arguments.py", args_py), ("run.sh", fixed)]) if f.status != "OK"]
    assert "script-env-required" not in got


def test_iterable_dataset_split_by_worker_only():
    ds = textwrap.dedent("""
    from torch.utils.data import IterableDataset, get_worker_info
    class Packed(IterableDataset):
        def __iter__(self):
            info = get_worker_info()
            files = self.files if info is None else self.files[info.id::info.num_workers]
            return iter(files)
    """)
    train = "import lightning as L\nfrom packed import Packed\nfabric = L.Fabric(devices=4, strategy='fsdp')\nds = Packed()\n"
    got = [(f.file, f.id) for f in lint_texts([("packed.py", ds), ("train.py", train)]) if f.status != "OK"]
    assert ("train.py", "iterable-not-sharded") in got
    sharded = ds.replace("return iter(files)", "return iter(files[self.rank::self.world_size])")
    got = [f.id for f in lint_texts([("packed.py", sharded), ("train.py", train)]) if f.status != "OK"]
    assert "iterable-not-sharded" not in got
    alone = [f.id for f in lint_texts([("packed.py", ds)]) if f.status != "OK"]
    assert "iterable-not-sharded" not in alone            # nothing trains data parallel


def test_project_seeding_function_with_rank_before_fsdp_materialises_meta_weights():
    text = """
    import random
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    def random_seed(seed, rank):
        torch.manual_seed(seed + rank)
        random.seed(seed + rank)
    def main(args):
        with torch.device("meta"):
            model = create_model(args)
        random_seed(args.seed, args.rank)
        model = FSDP(model, param_init_fn=init)
    """
    assert "rank-seed-before-model-init" in ids(text)
    assert "rank-seed-before-model-init" not in ids(text.replace("random_seed(args.seed, args.rank)",
                                                                 "random_seed(args.seed, 0)"))


def test_master_port_probed_per_node_in_a_loop():
    text = """
    import socket
    def get_available_port(ip):
        return 1234
    def submit(hosts, num_nodes):
        for node_id, host in enumerate(hosts):
            cmd = wrap(num_nodes=num_nodes, node_rank=node_id, master_port=get_available_port(hosts[0][0]))
    """
    assert "master-port-random-per-node" in ids(text)
    once = """
    def get_available_port(ip):
        return 1234
    def submit(hosts, num_nodes):
        port = get_available_port(hosts[0][0])
        for node_id, host in enumerate(hosts):
            cmd = wrap(num_nodes=num_nodes, node_rank=node_id, master_port=port)
    """
    assert "master-port-random-per-node" not in ids(once)


def test_rank_shard_computed_and_never_read():
    text = """
    def run(rank, world_size, data):
        train_idx = data.train_mask.nonzero().view(-1)
        train_idx = train_idx.split(train_idx.size(0) // world_size)[rank]
        loader = NeighborLoader(data, input_nodes=data.train_mask)
    """
    assert "rank-shard-unused" in ids(text)
    assert "rank-shard-unused" not in ids(text.replace("input_nodes=data.train_mask", "input_nodes=train_idx"))
