"""runbook lint's rules on what every rank must compute alike (helpers/lint/agreement_rules.py): each with its violation
and its look-alike."""

from __future__ import annotations

import textwrap

import pytest

from helpers.lint import lint_texts


def found(*files: tuple[str, str]) -> dict[str, list[str]]:
    """``{rule: [status, ...]}`` of the findings on ``files`` linted together."""
    out: dict[str, list[str]] = {}
    for f in lint_texts([(p, textwrap.dedent(t)) for p, t in files]):
        out.setdefault(f.id, []).append(f.status)
    return out


SPLIT = """
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, random_split
from torch.utils.data.distributed import DistributedSampler
def main(args):
    dist.init_process_group("nccl")
    {seed}
    full = MyDataset(args.data)
    train, val = {split}
    loader = DataLoader(train, sampler=DistributedSampler(train), batch_size=8)
"""


@pytest.mark.parametrize("seed, split", [
    ("pass", "random_split(full, [0.9, 0.1])"),
    ("torch.manual_seed(args.seed + dist.get_rank())", "random_split(full, [0.9, 0.1])"),
    ("np.random.seed(0)", "random_split(full, [0.9, 0.1])"),  # seeds NumPy, not torch
    ("torch.manual_seed(0)", "train_test_split(full, test_size=0.1)"),  # seeds torch, not NumPy
])
def test_a_split_each_rank_draws_for_itself_is_a_finding(seed, split):
    assert found(("t.py", SPLIT.format(seed=seed, split=split)))["rank-split-differs"] == ["WARN"]


@pytest.mark.parametrize("seed, split", [
    ("pass", "random_split(full, [0.9, 0.1], generator=torch.Generator().manual_seed(42))"),
    ("torch.manual_seed(args.seed)", "random_split(full, [0.9, 0.1])"),
    ("set_seed(args.seed)", "train_test_split(full, test_size=0.1)"),
    ("utils.setup_seed(1234)", "random_split(full, [0.9, 0.1])"),  # a project's own seeding helper
    ("pass", "train_test_split(full, test_size=0.1, random_state=0)"),
    ("pass", "(full, full) if dist.get_rank() else random_split(full, [0.9, 0.1])"),  # one rank draws it
])
def test_a_split_seeded_alike_is_not(seed, split):
    assert "rank-split-differs" not in found(("t.py", SPLIT.format(seed=seed, split=split)))


HF = """
from datasets import load_dataset
from accelerate import Accelerator
accelerator = Accelerator()
ds = load_dataset("json", data_files="d.jsonl")["train"]
ds = ds.{call}
loader = accelerator.prepare(DataLoader(ds, batch_size=4))
"""


def test_a_hugging_face_dataset_shuffled_without_a_seed():
    """datasets' shuffle()/train_test_split() draw their seed from NumPy's global state when given none."""
    assert found(("t.py", HF.format(call="shuffle()")))["rank-split-differs"] == ["INFO"]  # a reorder only
    assert found(("t.py", HF.format(call="train_test_split(test_size=0.05)")))["rank-split-differs"] == ["WARN"]
    assert "rank-split-differs" not in found(("t.py", HF.format(call="shuffle(seed=42)")))
    assert "rank-split-differs" not in found(("t.py", HF.format(call="shuffle(42)")))


def test_a_file_list_shuffled_before_sharding_by_rank():
    text = """
    import random, glob
    import torch.distributed as dist
    dist.init_process_group("nccl")
    files = sorted(glob.glob("shards/*.tar"))
    random.shuffle(files)
    mine = files[dist.get_rank()::dist.get_world_size()]
    """
    assert found(("t.py", text))["rank-split-differs"] == ["WARN"]
    assert "rank-split-differs" not in found(("t.py", text.replace("random.shuffle(files)",
                                                                    "random.seed(0)\n    random.shuffle(files)")))


def test_an_augmentation_shuffle_in_the_training_loop_is_not_a_split():
    text = """
    import random
    import torch.distributed as dist
    from torch.utils.data.distributed import DistributedSampler
    dist.init_process_group("nccl")
    for step, batch in enumerate(loader):
        random.shuffle(batch_files)
        np.random.permutation(len(batch))
    """
    assert "rank-split-differs" not in found(("t.py", text))


def test_a_split_in_a_one_process_script_is_not():
    assert "rank-split-differs" not in found(("t.py", "from torch.utils.data import random_split\n"
                                                      "a, b = random_split(ds, [0.9, 0.1])\n"))


HASH = """
import os
import torch.distributed as dist
dist.init_process_group("nccl")
def cache_path(cfg):
    {body}
"""


@pytest.mark.parametrize("body", [
    'return os.path.join("/cache", f"tok_{hash(cfg.tokenizer)}.pt")',
    'key = hash(str(cfg))\n    return f"/cache/{key}.arrow"',
    'return shards[hash(cfg.name) % dist.get_world_size()]',
    'torch.manual_seed(hash(cfg.run_name))',
])
def test_a_salted_hash_that_names_or_seeds_something_is_a_finding(body):
    assert found(("t.py", HASH.format(body=body)))["hash-per-process"] == ["WARN"]


@pytest.mark.parametrize("body", [
    'return os.path.join("/cache", hashlib.sha256(cfg.name.encode()).hexdigest())',
    'return {hash(cfg.name): 1}',            # used inside the process only
    'return f"/cache/{hash(3)}.pt"',          # ints hash to themselves
    'return f"/cache/{hash(len(cfg))}.pt"',
])
def test_a_stable_or_in_process_hash_is_not(body):
    assert "hash-per-process" not in found(("t.py", HASH.format(body=body)))


def test_pythonhashseed_set_in_the_file_settles_it():
    text = HASH.format(body='return f"/cache/{hash(cfg.name)}.pt"')
    assert "hash-per-process" not in found(("t.py", 'import os\nos.environ["PYTHONHASHSEED"] = "0"\n' + text))


INIT = """
import torch.distributed as dist
from accelerate import Accelerator
def main(args):
    {first}
    {second}
"""


@pytest.mark.parametrize("first", ["accelerator = Accelerator()", 'dist.init_process_group("nccl")',
                                   "deepspeed.init_distributed()"])
def test_a_second_default_group_raises(first):
    got = found(("t.py", INIT.format(first=first, second='dist.init_process_group(backend="nccl")')))
    assert got["init-twice"] == ["FAIL"]


@pytest.mark.parametrize("first, second", [
    ("accelerator = Accelerator()", 'if not dist.is_initialized():\n        dist.init_process_group("nccl")'),
    ('dist.init_process_group("nccl")', "accelerator = Accelerator()"),  # Accelerator tests is_initialized itself
    ('dist.init_process_group("nccl")', 'dist.destroy_process_group()\n    dist.init_process_group("gloo")'),
    ('if args.accelerate:\n        a = Accelerator()', 'else:\n        dist.init_process_group("nccl")'),
])
def test_one_default_group_per_path_is_fine(first, second):
    assert "init-twice" not in found(("t.py", INIT.format(first=first, second=second)))
