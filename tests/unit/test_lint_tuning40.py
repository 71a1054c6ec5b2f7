"""runbook lint changes made on the fortieth blind set (tests/data/lint/blind40), each with its violation and its
look-alike."""

from __future__ import annotations

import textwrap

from helpers.lint import lint_texts
from helpers.lint.contract_ast import forget_subtrees, subtree


def findings(*files: tuple[str, str]) -> list[tuple[str, str]]:
    return [(f.id, f.status) for f in lint_texts([(n, textwrap.dedent(t)) for n, t in files])]


def ids(*files: tuple[str, str]) -> list[str]:
    return [i for i, status in findings(*files) if status != "OK"]


def test_subtree_is_the_walk_kept_per_node():
    """The kept walk is ast.walk's list, in its order, the same object on a second call, and gone after forget."""
    import ast

    tree = ast.parse("def f(x):\n    return g(x) + 1\n")
    fn = tree.body[0]
    first = subtree(fn)
    assert [type(n) for n in first] == [type(n) for n in ast.walk(fn)]
    assert subtree(fn) is first
    forget_subtrees()
    assert subtree(fn) is not first and subtree(fn) == first


def test_launcher_variable_parsed_without_default():
    """OminiControl: int(os.environ.get("LOCAL_RANK")) where the other file's get_rank() falls back to 0 when it is
    unset; a script that only ever runs under its launcher (no read with a default anywhere) is left alone."""
    bare = """
    import os
    import torch
    from .trainer import train

    def main():
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK")))
        train()
    """
    handled = """
    import os

    def get_rank():
        try:
            rank = int(os.environ.get("LOCAL_RANK"))
        except Exception:
            rank = 0
        return rank

    def train():
        pass
    """
    assert "env-int-parse" in ids(("train_subject.py", bare), ("trainer.py", handled))
    assert "env-int-parse" not in ids(("train_subject.py", bare))
    same_file = bare + """
    def other():
        return int(os.environ.get("LOCAL_RANK", 0))
    """
    assert "env-int-parse" in ids(("train.py", same_file))
    guarded = same_file.replace('torch.cuda.set_device(int(os.environ.get("LOCAL_RANK")))',
                                'if "LOCAL_RANK" in os.environ:\n            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK")))')
    assert "env-int-parse" not in ids(("train.py", guarded))


def test_default_cuda_before_another_files_set_device():
    """OminiControl: OminiModel(device=f"cuda") in main(), then train() -- another file's function that binds the GPU
    first thing; binding in main first, or a train() that binds nothing, is not this."""
    main = """
    import torch
    from .trainer import OminiModel, train

    def main():
        {first}
        model = OminiModel(device=f"cuda")
        train(model)
    """
    trainer = """
    import os
    import torch

    class OminiModel:
        def __init__(self, device):
            self.device = device

    def train(model):
        {bind}
        model.fit()
    """
    bound = trainer.replace("{bind}", 'torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))')
    assert "cuda-before-set-device" in ids(("train_subject.py", main.replace("{first}", "pass")), ("trainer.py", bound))
    assert "cuda-before-set-device" not in ids(
        ("train_subject.py", main.replace("{first}", 'torch.cuda.set_device(0)')), ("trainer.py", bound))
    assert "cuda-before-set-device" not in ids(("train_subject.py", main.replace("{first}", "pass")),
                                               ("trainer.py", trainer.replace("{bind}", "pass")))


def test_own_get_rank_returning_local_rank_is_not_the_global_rank():
    """OminiControl's trainer defines get_rank() as LOCAL_RANK (0 when unset): set_device(get_rank()) is the local
    GPU, not device-from-global-rank; torch's dist.get_rank() still is."""
    src = """
    import os
    import torch
    import torch.distributed as dist

    def get_rank():
        try:
            rank = int(os.environ.get("LOCAL_RANK"))
        except Exception:
            rank = 0
        return rank

    def train():
        rank = {call}
        torch.cuda.set_device(rank)
        dist.init_process_group("nccl")
    """
    assert "device-from-global-rank" not in ids(("trainer.py", src.replace("{call}", "get_rank()")))
    assert "device-from-global-rank" in ids(("trainer.py", src.replace("{call}", "dist.get_rank()")))


def test_writer_flag_from_local_rank():
    """maskrcnn-benchmark: save_to_disk = local_rank == 0 handed to the checkpointer (one writer per node); a flag
    named for something else is not this."""
    src = """
    import torch

    def train(cfg, local_rank, model):
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
        {flag} = local_rank == 0
        checkpointer = Checkpointer(cfg, model, {flag})
    """
    assert "local-rank-as-global-rank" in ids(("train_net.py", src.replace("{flag}", "save_to_disk")))
    assert "local-rank-as-global-rank" not in ids(("train_net.py", src.replace("{flag}", "first_gpu")))


def test_sampler_that_ignores_its_shuffle_argument():
    """maskrcnn-benchmark's DistributedSampler copy: shuffle= taken, self.shuffle = True set."""
    src = """
    from torch.utils.data import Sampler

    class DistributedSampler(Sampler):
        def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True):
            self.dataset = dataset
            self.shuffle = {value}
    """
    assert "sampler-shuffle-ignored" in ids(("distributed.py", src.replace("{value}", "True")))
    assert "sampler-shuffle-ignored" not in ids(("distributed.py", src.replace("{value}", "shuffle")))


def test_metric_built_on_every_rank_writes_a_file():
    """mmselfsup: an mmengine BaseMetric whose __init__ calls a method that removes and re-creates a CSV; writing it
    in compute_metrics (main process only) is not this."""
    src = """
    import os
    from mmengine.evaluator import BaseMetric

    class ShapeBiasMetric(BaseMetric):
        def __init__(self, csv_dir):
            super().__init__()
            self.csv_dir = csv_dir
            {init}

        def create_csv(self):
            path = os.path.join(self.csv_dir, "result.csv")
            with open(path, "w") as f:
                f.write("a,b")
            return path

        def compute_metrics(self, results):
            {compute}
            return {}
    """
    assert "write-on-every-rank" in ids(("metric.py", src.replace("{init}", "self.csv_path = self.create_csv()")
                                         .replace("{compute}", "pass")))
    assert "write-on-every-rank" not in ids(("metric.py", src.replace("{init}", "pass")
                                             .replace("{compute}", "self.create_csv()")))


def test_collective_helper_called_unguarded_where_other_calls_are_guarded():
    """FCOS: reduce_sum (dist.all_reduce) called under `if num_gpus > 1:` twice and bare once; always guarded, or
    never guarded (a script that always runs distributed), is not this."""
    src = """
    import os
    import torch.distributed as dist

    def get_num_gpus():
        return int(os.environ["WORLD_SIZE"]) if "WORLD_SIZE" in os.environ else 1

    def reduce_sum(tensor):
        tensor = tensor.clone()
        dist.all_reduce(tensor)
        return tensor

    def loss(pos, centerness):
        num_gpus = get_num_gpus()
        if num_gpus > 1:
            total = reduce_sum(pos)
        else:
            total = pos
        {last}
        return total
    """
    assert "collective-before-init" in ids(("loss.py", src.replace("{last}", "reduce_sum(centerness)")))
    assert "collective-before-init" not in ids(("loss.py", src.replace(
        "{last}", "if num_gpus > 1:\n            reduce_sum(centerness)")))
    other = src.replace("if num_gpus > 1:", "if args.virtual_pipeline_model_parallel_size is not None:")
    assert "collective-before-init" not in ids(("loss.py", other.replace("{last}", "reduce_sum(centerness)")))
    own_guard = src.replace("        tensor = tensor.clone()\n", "        if get_num_gpus() == 1:\n            return tensor\n")
    assert "collective-before-init" not in ids(("loss.py", own_guard.replace("{last}", "reduce_sum(centerness)")))


def test_accelerate_multi_gpu_with_one_visible_gpu():
    """OmniGen2: CUDA_VISIBLE_DEVICES=0 accelerate launch --multi_gpu (no --num_processes) -- one GPU for a multi-GPU
    launch; two visible GPUs, or an explicit --num_processes (the builder's own form, checked by the older trap), are
    not this one."""
    from helpers.script_traps import check_text

    def traps(line: str) -> list[str]:
        return [t.id for t in check_text(line)[1] if t.status == "FAIL"]

    assert "nproc-exceeds-gpus" in traps("CUDA_VISIBLE_DEVICES=0 accelerate launch --multi_gpu train.py")
    assert "nproc-exceeds-gpus" not in traps("CUDA_VISIBLE_DEVICES=0,1 accelerate launch --multi_gpu train.py")
    assert "nproc-exceeds-gpus" not in traps("accelerate launch --multi_gpu train.py")
    assert traps("CUDA_VISIBLE_DEVICES=0 accelerate launch --multi_gpu --num_processes 2 train.py").count(
        "nproc-exceeds-gpus") == 1  # an explicit count: the spec's trap, not a second one from the text
    assert "nproc-exceeds-gpus" in traps("export CUDA_VISIBLE_DEVICES=3\naccelerate launch --multi_gpu train.py")
    assert "nproc-exceeds-gpus" in ids(("train.sh", "CUDA_VISIBLE_DEVICES=0 accelerate launch --multi_gpu \\\n"
                                                    "    --main_process_port 41001 train.py --config a.yml\n"))
