"""runbook lint rules tuned on the twelfth blind set (tests/data/lint/blind12), each with its violation and its look-alike."""

from __future__ import annotations

import textwrap

import pytest

from helpers import script_traps
from helpers.lint import lint_texts


def found(*files: tuple[str, str]) -> dict[str, list[str]]:
    """``{rule: [status, ...]}`` of the findings on ``files`` linted together."""
    out: dict[str, list[str]] = {}
    for f in lint_texts([(p, textwrap.dedent(t)) for p, t in files]):
        out.setdefault(f.id, []).append(f.status)
    return out


@pytest.mark.parametrize("read", [
    "int(os.environ['SLURM_TASKS_PER_NODE'])",          # '8(x2)' on two nodes (InternImage)
    "int(os.getenv('MASTER_ADDRESS'))",                 # a host name (NERSC's sc23 tutorial)
    "float(os.environ.get('SLURM_JOB_CPUS_PER_NODE'))",
])
def test_int_of_a_variable_that_holds_no_number(read):
    text = f"import os\nimport torch.distributed as dist\nn = {read}\n"
    assert found(("t.py", text))["env-int-parse"] == ["FAIL"]


def test_int_of_a_number_variable_is_fine():
    text = ("import os\nn = int(os.environ['SLURM_NTASKS_PER_NODE'])\nm = int(os.environ['SLURM_NNODES'])\n"
            "addr = os.environ['MASTER_ADDR']\nport = int(os.environ['MASTER_PORT'])\n")
    assert "env-int-parse" not in found(("t.py", text))


def test_a_name_assigned_from_the_variable_is_followed():
    text = "import os\ntasks = os.environ['SLURM_TASKS_PER_NODE']\nper_node = int(tasks)\n"
    assert found(("t.py", text))["env-int-parse"] == ["FAIL"]


UNCLOSED = "#!/bin/bash\n#SBATCH --nodes=1\nfor bs in 8 16; do\n  for g in 1 2; do\n    torchrun --nproc_per_node $g train.py --bs $bs\ndone\n"


def test_a_script_bash_cannot_parse():
    """transformers-in-supercomputers: two nested loops, one done."""
    assert found(("job.sh", UNCLOSED))["shell-syntax-error"] == ["FAIL"]
    assert "shell-syntax-error" not in found(("job.sh", UNCLOSED + "done\n"))


def test_a_template_placeholder_is_not_a_syntax_error():
    """Megatron's example scripts: CHECKPOINT_PATH=<Specify path> is to be filled in."""
    text = "#! /bin/bash\nCHECKPOINT_PATH=<Specify path>\npython -m torch.distributed.launch --nproc_per_node 8 x.py\n"
    assert "shell-syntax-error" not in found(("job.sh", text))
    assert not [t for t in script_traps.text_traps(text) if t.id == "shell-syntax-error"]


def test_a_zsh_script_is_not_read_by_bash():
    assert "shell-syntax-error" not in found(("job.sh", "#!/bin/zsh\nfor x in 1 2; do\n  echo $x\n"))


NET = """
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
class Net(nn.Module):
    def __init__(self):
        {super}
        self.fc1 = nn.Linear(4, 4){bn}
def main(rank):
    dist.init_process_group("nccl")
    ddp_model = DDP(Net().to(rank), device_ids=[rank])
    if rank == 0:
        test(ddp_model)
def test(model):
    model(x)
"""


@pytest.mark.parametrize("spelling", ["super().__init__()", "super(Net, self).__init__()"])
def test_a_buffer_free_model_evaluated_on_rank_0_is_no_collective(spelling):
    """Princeton's mnist_classify_ddp: the Python 2 spelling of super() hid the class's layers from the check."""
    assert "rank-gated-collective" not in found(("t.py", NET.format(super=spelling, bn="")))
    with_bn = NET.format(super=spelling, bn="\n        self.bn = nn.BatchNorm1d(4)")
    assert "rank-gated-collective" in found(("t.py", with_bn))


def test_a_file_named_per_process_is_no_shared_write():
    """icefall's zipformer: f"{exp_dir}/batch-{uuid4()}.pt" is each process's own file."""
    base = ("import torch\nimport torch.distributed as dist\nfrom lhotse.utils import uuid4\n"
            "dist.init_process_group('nccl')\nmodel = DDP(net)\nfor batch in loader:\n    torch.save(batch, {name})\n")
    assert "write-on-every-rank" not in found(("t.py", base.format(name='f"{out}/batch-{uuid4()}.pt"')))
    assert "write-on-every-rank" not in found(("t.py", base.format(name='f"{out}/batch-{os.getpid()}.pt"')))
    assert "write-on-every-rank" in found(("t.py", base.format(name='f"{out}/batch.pt"')))


def test_an_imported_save_helper_decides_its_own_writer():
    """wenet: save_model imported from wenet.utils.train_utils tests the rank itself."""
    text = ("import torch.distributed as dist\nfrom wenet.utils.train_utils import save_model\n"
            "dist.init_process_group('nccl')\nsave_model(model, info_dict={})\n")
    assert "write-on-every-rank" not in found(("t.py", text))
    local = text.replace("from wenet.utils.train_utils import save_model\n", "") + \
        "def save_model(m, info_dict):\n    m.save_pretrained('out')\n"
    assert "write-on-every-rank" in found(("t.py", local))


def test_an_imported_save_checkpoint_under_rank_0_is_no_collective():
    """physicsnemo: save_checkpoint imported from physicsnemo.launch.utils writes a file; an engine's is a method."""
    text = ("import torch.distributed as dist\nfrom physicsnemo.launch.utils import save_checkpoint\n"
            "dist.init_process_group('nccl')\nif dist.get_rank() == 0:\n    save_checkpoint('ckpt', models=m)\n")
    assert "rank-gated-collective" not in found(("t.py", text))
    engine = text.replace("save_checkpoint('ckpt', models=m)", "model_engine.save_checkpoint('ckpt')")
    assert "rank-gated-collective" in found(("t.py", engine))


LOOP = """
import torch.distributed as dist
def train(model, loader, opt):
    for inp, tar in loader:
        loss = loss_func(model(inp), tar)
        loss.backward()
        opt.step()
        {reduce}
"""


def test_an_all_reduce_after_the_backward_is_a_logging_copy():
    """NERSC sc23 train.py: the loss is reduced for logging after backward; the next step makes it anew."""
    assert "backward-through-all-reduce" not in found(("t.py", LOOP.format(reduce="dist.all_reduce(loss)")))
    before = LOOP.replace("        loss.backward()\n", "        dist.all_reduce(loss)\n        loss.backward()\n")
    assert found(("t.py", before.format(reduce="")))["backward-through-all-reduce"] == ["WARN"]


@pytest.mark.parametrize("line", [
    "torchrun --nnodes=1 --nproc_per_node=8 --rdzv_endpoint=$HOST:29500 python wenet/bin/train.py --config c.yaml",
    "srun torchrun --nproc_per_node 2 python3 train.py",
    "deepspeed --num_gpus 2 python train.py --deepspeed ds.json",
])
def test_an_interpreter_given_as_the_launchers_script(line):
    """wenet-e2e/wenet#2024: torchrun runs its first positional argument with its own Python."""
    assert found(("run.sh", "#!/bin/bash\n" + line + "\n"))["launcher-program-not-script"] == ["FAIL"]


@pytest.mark.parametrize("line", ["torchrun --no-python --nproc_per_node 2 python train.py",
                                  "torchrun --nproc_per_node 2 train.py", "python -m torch.distributed.run train.py"])
def test_a_script_or_no_python_is_fine(line):
    assert "launcher-program-not-script" not in found(("run.sh", "#!/bin/bash\n" + line + "\n"))


ZERO_ONLY = """
from lightning.pytorch.utilities import rank_zero_only
import torch.distributed as dist
@rank_zero_only
def get_base_model(cfg):
    return ASRModel.from_pretrained(cfg.name)
def main(cfg):
    trainer = pl.Trainer(devices=2, strategy="ddp")
    asr_model = get_base_model(cfg)
    asr_model.setup_training_data(cfg.train_ds)
"""


def test_the_value_of_a_rank_zero_only_function_is_none_on_the_other_ranks():
    """NVIDIA/NeMo#7699: @rank_zero_only on get_base_model returns None on every rank but 0."""
    assert found(("t.py", ZERO_ONLY))["rank-gated-object-used"] == ["FAIL"]
    assert "rank-gated-object-used" not in found(("t.py", ZERO_ONLY.replace("@rank_zero_only\n", "")))


@pytest.mark.parametrize("use, meant", [("dist.rank()", "get_rank"), ("dist.world_size()", "get_world_size"),
                                        ("torch.distributed.get_ranks()", "get_rank")])
def test_a_torch_distributed_name_one_slip_from_a_real_one(use, meant):
    """k2-fsa/icefall#507: dist.rank() does not exist (get_rank())."""
    text = f"import torch\nimport torch.distributed as dist\nr = {use}\n"
    got = [f for f in lint_texts([("t.py", text)]) if f.id == "dist-api-unknown"]
    assert len(got) == 1 and meant in got[0].title


@pytest.mark.parametrize("text", [
    "import torch\nimport torch.distributed as dist\ndist.set_timeout(t, g)\n",       # a newer torch's API
    "import torch\ntorch.distributed.tensor.parallel.loss_parallel()\n",              # a submodule
    "import utils.dist as dist\nr = dist.rank()\n",                                   # a project's own module
    "import torch.distributed as dist\nr = dist.get_rank()\n",
])
def test_real_torch_distributed_names_and_other_modules_are_left_alone(text):
    assert "dist-api-unknown" not in found(("t.py", text))


def test_the_torch_distributed_names_are_the_installed_torchs():
    import pkgutil

    import torch.distributed as tdist

    from helpers.lint.collective_rules import torch_distributed_names

    have = {n for n in dir(tdist) if n[:1].islower()} | {m.name for m in pkgutil.iter_modules(tdist.__path__)
                                                          if m.name[:1].islower()}
    assert torch_distributed_names() == have, "regenerate helpers/data/torch_distributed_names.txt (its header)"


CLOCK = """
import time
import torch.distributed as dist
def fit(loader, interval):
    last = time.time()
    for step, batch in enumerate(loader):
        train_step(batch)
        if {test}:
            dist.barrier()
            last = time.time()
"""


def test_a_collective_under_a_test_of_each_ranks_own_clock():
    """speechbrain#1167: an intra-epoch checkpoint every N minutes, through a barrier, decided by each rank's clock."""
    assert found(("t.py", CLOCK.format(test="time.time() - last >= interval")))["clock-gated-collective"] == ["WARN"]
    assert "clock-gated-collective" not in found(("t.py", CLOCK.format(test="step % 1000 == 0")))
    gated = CLOCK.format(test="dist.get_rank() == 0 and time.time() - last >= interval")
    assert "clock-gated-collective" not in found(("t.py", gated))


def test_a_helper_imported_by_name_from_another_linted_file_is_a_collective_there():
    helpers = ("util.py", "import torch.distributed as dist\ndef run_on_main(fn):\n    fn()\n    dist.barrier()\n")
    core = ("core.py", "import time\nfrom util import run_on_main\nimport torch.distributed as dist\n"
                       "def fit(last):\n    if time.time() - last > 60:\n        run_on_main(save)\n")
    assert found(helpers, core)["clock-gated-collective"] == ["WARN"]


@pytest.mark.parametrize("text", [
    "from accelerate.utils import DeepSpeedPlugin\np = DeepSpeedPlugin(zero_stage=2, offload_optimizer='cpu')\n",
    "import torch\nfrom torch.nn.parallel import DistributedDataParallel as DDP\nm = DDP(net, device_id=[0])\n",
    "import torch.distributed as dist\ndist.init_process_group('nccl', time_out=t)\n",
    "import accelerate\na = accelerate.Accelerator(gradient_accumulation_step=4)\n",
])
def test_a_keyword_the_api_does_not_take(text):
    """kohya-ss/sd-scripts: DeepSpeedPlugin(offload_optimizer=...) for offload_optimizer_device."""
    got = [f for f in lint_texts([("t.py", text)]) if f.id == "api-unknown-kwarg"]
    assert len(got) == 1 and got[0].status == "FAIL"


@pytest.mark.parametrize("text", [
    "from accelerate.utils import DeepSpeedPlugin\np = DeepSpeedPlugin(zero_stage=2, offload_optimizer_device='cpu')\n",
    "from accelerate import Accelerator\na = Accelerator(logging_dir='x')\n",          # another release's name
    "from mylib import DeepSpeedPlugin\np = DeepSpeedPlugin(offload_optimizer='cpu')\n",  # not Accelerate's
    "import torch\nfrom torch.utils.data import DataLoader\nDataLoader(ds, batch_size=4, shuffle=True)\n",
])
def test_accepted_or_foreign_keywords_are_left_alone(text):
    assert "api-unknown-kwarg" not in found(("t.py", text))


def test_the_signatures_are_the_installed_packages():
    from helpers.lint import signature_rules

    assert signature_rules.generate() == signature_rules.signatures(), (
        "regenerate helpers/data/api_signatures.json: python -c \"import json; from helpers.lint import "
        "signature_rules as s; print(json.dumps(s.generate(), indent=1, sort_keys=True))\"")
