"""The rule changes made for the fourth blind set, each on a small inline violation and its look-alike.

The blind files themselves are not used here (they score the linter; these pin the contracts): every snippet is
written from the API's documented behaviour that the rule cites (init_process_group's world_size, Slurm's output
environment variables, torch.distributed.all_reduce outside autograd, barrier / wait_for_everyone).
"""

from __future__ import annotations

import textwrap

from helpers import envnames
from helpers.lint import lint_texts


def found(*files: tuple[str, str]) -> dict[str, list[str]]:
    """``{rule: [status, ...]}`` of the findings on ``files`` linted together."""
    out: dict[str, list[str]] = {}
    for f in lint_texts([(p, textwrap.dedent(t)) for p, t in files]):
        out.setdefault(f.id, []).append(f.status)
    return out


# ---------------------------------------------------------------- world-size-from-device-count
DEVICE_COUNT_WORLD = """
import os, torch, torch.distributed as dist
def init():
    rank: int = int(os.environ["LOCAL_RANK"])
    world_size: int = torch.cuda.device_count()
    torch.cuda.set_device(rank)
    dist.init_process_group(world_size=world_size, rank=rank)
"""

SPAWNED_WORLD = """
import torch, torch.distributed as dist, torch.multiprocessing as mp
def worker(rank, world_size):
    torch.cuda.set_device(rank)
    dist.init_process_group("nccl", rank=rank, world_size=world_size)
if __name__ == "__main__":
    world_size = torch.cuda.device_count()
    mp.spawn(worker, args=(world_size,), nprocs=world_size)
"""


def test_world_size_from_device_count_under_a_launcher():
    got = found(("t.py", DEVICE_COUNT_WORLD))
    assert got["world-size-from-device-count"] == ["FAIL"]
    # the annotated `rank: int = int(os.environ["LOCAL_RANK"])` is followed as a local rank too
    assert "local-rank-as-global-rank" in got


def test_world_size_from_device_count_is_right_when_the_script_spawns_one_process_per_gpu():
    assert "world-size-from-device-count" not in found(("t.py", SPAWNED_WORLD))


# ---------------------------------------------------------------- Slurm output variables
SLURM_MISSPELT = """
import os
local_world_size = int(os.environ["SLURM_JOB_NUMNODES"])
"""

SLURM_NODE_RANK_FROM_PROCID = """
def _int_env(name, env):
    return int(env[name]) if name in env else None
def detect(env):
    node_rank = _int_env("SLURM_PROCID", env)
    return node_rank
"""

SLURM_RIGHT = """
import os
rank = int(os.environ["SLURM_PROCID"])
local_rank = int(os.environ["SLURM_LOCALID"])
world_size = int(os.environ["SLURM_NTASKS"])
node_rank = int(os.environ["SLURM_NODEID"])
nnodes = int(os.environ.get("SLURM_JOB_NUM_NODES", 1))
local_world_size = int(os.environ["SLURM_NTASKS_PER_NODE"])
site = os.environ.get("SLURM_MY_SITE_SCRATCH")
"""


def test_slurm_variable_slurm_does_not_set():
    got = found(("t.py", SLURM_MISSPELT))
    assert got["slurm-var-unknown"] == ["WARN"]
    assert got["slurm-env-misuse"] == ["FAIL"]  # a node count (as SLURM_JOB_NUM_NODES) for a per-node count


def test_node_rank_from_the_task_rank():
    assert found(("t.py", SLURM_NODE_RANK_FROM_PROCID))["slurm-env-misuse"] == ["FAIL"]


def test_slurm_variables_read_for_what_they_hold_and_a_site_variable_are_quiet():
    got = found(("t.py", SLURM_RIGHT))
    assert "slurm-env-misuse" not in got and "slurm-var-unknown" not in got


def test_slurm_list_holds_the_documented_output_variables():
    names = envnames.slurm_env_vars()
    assert {"SLURM_PROCID", "SLURM_LOCALID", "SLURM_NODEID", "SLURM_JOB_NUM_NODES", "SLURM_NTASKS_PER_NODE",
            "SLURM_JOB_USER"} <= names
    assert "SLURM_JOB_NUMNODES" not in names
    assert envnames.SLURM_ENV_VARS.read_text().startswith("# Every SLURM_")


def test_extract_slurm_reads_man_pages_and_source(tmp_path):
    for rel in ("doc/man/man1/sbatch.1", "doc/man/man1/srun.1", "doc/man/man1/salloc.1",
                "doc/html/prolog_epilog.shtml"):
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text("\\fBSLURM_NODEID\\fR\nID of the nodes allocated.\n")
    (tmp_path / "src" / "slurmd").mkdir(parents=True)
    (tmp_path / "src" / "slurmd" / "env.c").write_text('setenvf(&env, "SLURM_JOB_USER", "%s", u);\n'
                                                        'x = "SLURM_RLIMIT_";\n')
    assert envnames.extract_slurm(tmp_path) == {"SLURM_NODEID", "SLURM_JOB_USER"}


# ---------------------------------------------------------------- rank-early-exit-collective, rank tests
NESTED_BREAK = """
import torch.distributed as dist
def train(distr, stopper, batches):
    for batch in batches:
        step(batch)
        if distr.is_global_main:
            score = validate()
            if stopper.is_stop(score):
                break
        dist.barrier()
"""

INNER_LOOP_BREAK = """
import torch.distributed as dist
def train(distr, batches, items):
    for batch in batches:
        if distr.is_global_main:
            for item in items:
                if item is None:
                    break
        dist.barrier()
"""


def test_break_nested_under_a_main_process_gate_skips_the_barrier():
    assert found(("t.py", NESTED_BREAK))["rank-early-exit-collective"] == ["FAIL"]


def test_break_of_an_inner_loop_under_the_gate_is_not_an_exit():
    assert "rank-early-exit-collective" not in found(("t.py", INNER_LOOP_BREAK))


SEED_READ_BEFORE_RANK = """
import torch, torch.distributed as dist
def set_seed(seed, mesh):
    s = seed
    if s is None:
        t = torch.zeros(1)
        dist.broadcast(t, src=0)
        s = int(t.item())
    s += mesh.get_local_rank()
    torch.manual_seed(s)
"""

SEED_READ_AFTER_RANK = """
import torch, torch.distributed as dist
def set_seed(seed):
    s = seed + dist.get_rank()
    if s > 3:
        dist.barrier()
"""


def test_a_name_read_before_it_becomes_rank_dependent_is_no_rank_gate():
    assert "rank-gated-collective" not in found(("t.py", SEED_READ_BEFORE_RANK))


def test_a_name_read_after_it_became_rank_dependent_still_gates():
    assert found(("t.py", SEED_READ_AFTER_RANK))["rank-gated-collective"] == ["FAIL"]


# ---------------------------------------------------------------- barrier-every-step
BARRIER_EACH_STEP = """
def train(accelerator, model, loader, optimizer, save_every):
    for epoch in range(3):
        for step, batch in enumerate(loader):
            loss = model(batch)
            accelerator.backward(loss)
            optimizer.step()
            accelerator.wait_for_everyone()
            if accelerator.is_main_process and step % save_every == 0:
                accelerator.save_model(model, "out")
        accelerator.wait_for_everyone()
"""

BARRIER_WHEN_SAVING = """
def train(accelerator, model, loader, optimizer, save_every):
    for step, batch in enumerate(loader):
        loss = model(batch)
        accelerator.backward(loss)
        optimizer.step()
        if step % save_every == 0:
            accelerator.wait_for_everyone()
            accelerator.save_model(model, "out")
"""


def test_barrier_on_every_training_step():
    got = found(("t.py", BARRIER_EACH_STEP))
    assert got["barrier-every-step"] == ["WARN"]  # the per-epoch one (no backward of its own) is not reported


def test_barrier_only_in_the_save_branch_is_quiet():
    assert "barrier-every-step" not in found(("t.py", BARRIER_WHEN_SAVING))


# ---------------------------------------------------------------- backward-through-all-reduce
BACKWARD_THROUGH_REDUCE = """
import torch, torch.distributed as dist
def step(model, batch, optimizer):
    local_sum, local_tokens = model(batch)
    metrics = torch.stack([local_sum, local_tokens])
    dist.all_reduce(metrics)
    global_sum, global_tokens = metrics[0], metrics[1]
    loss = global_sum / global_tokens.clamp(min=1)
    loss.backward()
    optimizer.step()
"""

REDUCED_DIVISOR_ONLY = """
import torch, torch.distributed as dist
def step(model, batch, optimizer, world_size):
    local_sum, local_tokens = model(batch)
    tokens = local_tokens.detach().clone()
    dist.all_reduce(tokens)
    loss = local_sum * world_size / tokens
    loss.backward()
    reported = loss.detach().clone()
    dist.all_reduce(reported)
    optimizer.step()
"""


def test_backward_through_an_all_reduced_loss():
    assert found(("t.py", BACKWARD_THROUGH_REDUCE))["backward-through-all-reduce"] == ["WARN"]


def test_a_reduced_count_as_divisor_and_a_reduced_copy_for_logging_are_quiet():
    assert "backward-through-all-reduce" not in found(("t.py", REDUCED_DIVISOR_ONLY))


# ---------------------------------------------------------------- device-from-global-rank through a returned value
RETURNED_PROCESS_INDEX = """
import torch
from accelerate import Accelerator
class Wrapper:
    @classmethod
    def _current_device(cls):
        index = Accelerator().process_index
        return index if torch.cuda.is_available() else "cpu"
    @classmethod
    def load(cls, name, model_cls):
        device = cls._current_device()
        model = model_cls.from_pretrained(name, device_map={"": device})
        head = torch.nn.Linear(4, 1).to(cls._current_device())
        return model, head
"""

RETURNED_LOCAL_INDEX = """
import os, torch
from accelerate import Accelerator
def get_rank():
    rank = os.environ.get("RANK")
    return int(rank)
def get_local_rank():
    for key in ("LOCAL_RANK",):
        rank = os.environ.get(key)
        if rank is not None:
            return int(rank)
def load(model_cls, name):
    index = Accelerator().local_process_index
    model = model_cls.from_pretrained(name, device_map={"": index})
    return model.to(get_local_rank())
"""


def test_global_rank_returned_by_a_method_reaches_device_map_and_to():
    """Accelerate's process_index is the global index; a method returning it picks the device on every call site."""
    assert found(("m.py", RETURNED_PROCESS_INDEX)).get("device-from-global-rank") == ["FAIL"] * 2


def test_local_index_and_a_local_rank_function_are_not_the_global_rank():
    """local_process_index, and a function whose own ``rank`` comes from LOCAL_RANK (another function's ``rank``
    being global does not leak into it)."""
    assert "device-from-global-rank" not in found(("m.py", RETURNED_LOCAL_INDEX))
