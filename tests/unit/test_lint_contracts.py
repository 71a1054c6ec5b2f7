"""The contract table (helpers.lint.contracts -> docs/lint.md), the rules it names, and one rule set behind the
three launch-check entry points (runbook lint, runbook build --check, the command builder's paste box)."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from helpers import cli, script_traps, widgets
from helpers.lint import RULES, lint_texts
from helpers.lint.contracts import CONTRACTS, coverage, render_markdown

ROOT = Path(__file__).resolve().parents[2]


def ids(*files: tuple[str, str], command: str | None = None) -> set[str]:
    return {f.id for f in lint_texts([(p, textwrap.dedent(t)) for p, t in files], command)}


def test_docs_table_is_generated_and_every_decidable_precondition_has_a_rule():
    assert render_markdown() in (ROOT / "docs" / "lint.md").read_text(), "regenerate: python -m helpers.lint.contracts"
    ruled, decidable = coverage()
    assert decidable >= 50 and ruled == decidable
    for c in CONTRACTS:
        assert c.url.startswith("https://") and set(c.rules) <= set(RULES), c
        assert c.decidable == (not c.note)


# ---------------------------------------------------------------- the contract rules, each with its look-alike
CASES = [
    ("dataloader-sampler-and-shuffle",
     ("t.py", "from torch.utils.data import DataLoader\nloader = DataLoader(ds, sampler=DistributedSampler(ds), "
              "shuffle=True)\n"),
     ("t.py", "loader = DataLoader(ds, sampler=None, shuffle=True)\nother = DataLoader(ds, sampler=s, shuffle=False)\n")),
    ("init-missing-rank-world-size",
     ("t.py", "import torch.distributed as dist\ndist.init_process_group('gloo', init_method='tcp://10.0.0.1:23456')\n"),
     ("t.py", "import torch.distributed as dist\ndist.init_process_group('gloo', init_method='tcp://h:1', rank=r, "
              "world_size=w, timeout=t)\n")),
    ("collective-before-init",
     ("t.py", "import torch.distributed as dist\ndef main():\n    rank = dist.get_rank()\n"
              "    dist.init_process_group('gloo')\n"),
     ("t.py", "import torch.distributed as dist\ndef main():\n    dist.init_process_group('gloo')\n"
              "    rank = dist.get_rank()\n")),
    ("nccl-no-device-binding",
     ("t.py", "import torch.distributed as dist\ndist.init_process_group('nccl')\nmodel = Net().cuda()\n"),
     ("t.py", "import os, torch, torch.distributed as dist\ntorch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n"
              "dist.init_process_group('nccl')\nmodel = Net().cuda()\n")),
    ("fsdp-optimizer-before-wrap",
     ("t.py", "def main():\n    opt = torch.optim.AdamW(model.parameters())\n    model = FSDP(model)\n"),
     ("t.py", "def main():\n    model = FSDP(model)\n    opt = torch.optim.AdamW(model.parameters())\n")),
    ("wrapper-raw-backward",
     ("t.py", "acc = Accelerator()\nmodel, opt = acc.prepare(model, opt)\nloss = model(x)\nloss.backward()\n"),
     ("t.py", "acc = Accelerator()\nmodel, opt = acc.prepare(model, opt)\nloss = model(x)\nacc.backward(loss)\n")),
    ("ds-offload-needs-stage",
     ("ds.json", '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 2, '
                 '"offload_param": {"device": "cpu"}}, "optimizer": {"type": "AdamW"}}'),
     ("ds.json", '{"train_micro_batch_size_per_gpu": 1, "zero_optimization": {"stage": 3, '
                 '"offload_param": {"device": "cpu"}}, "optimizer": {"type": "AdamW"}}')),
    ("ds-invalid-value",
     ("ds.json", '{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": "8"}'),
     ("ds.json", '{"train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": "auto"}')),
    ("syncbn-without-ddp",
     ("t.py", "model = torch.nn.DataParallel(model)\nmodel = nn.SyncBatchNorm.convert_sync_batchnorm(model)\n"),
     ("t.py", "model = nn.SyncBatchNorm.convert_sync_batchnorm(model)\nmodel = DistributedDataParallel(model)\n")),
    ("load-without-map-location",
     ("t.py", "dist.init_process_group('nccl')\nmodel = DDP(model)\nstate = torch.load('snap.pt')\n"),
     ("t.py", "dist.init_process_group('nccl')\nmodel = DDP(model)\nstate = torch.load('snap.pt', map_location=loc)\n")),
    ("nccl-cpu-tensor",
     ("t.py", "import torch.distributed as dist\ndist.init_process_group('nccl')\ndef f(a):\n"
              "    t = torch.FloatTensor([a])\n    dist.all_reduce(t)\n"),
     ("t.py", "import torch.distributed as dist\ndist.init_process_group('nccl')\ndef f(a):\n"
              "    t = torch.tensor([a], device='cuda')\n    dist.all_reduce(t)\n")),
    ("grad-accum-from-device-count",
     ("t.py", "init_process_group('nccl')\ngradient_accumulation_steps //= torch.cuda.device_count()\n"),
     ("t.py", "init_process_group('nccl')\ngradient_accumulation_steps //= int(os.environ['WORLD_SIZE'])\n")),
    ("main-process-object-every-rank",
     ("t.py", "acc = Accelerator(log_with='wandb')\nacc.init_trackers('p')\nurl = acc.get_tracker('wandb').run.url\n"),
     ("t.py", "acc = Accelerator(log_with='wandb')\nacc.init_trackers('p')\nif acc.is_main_process:\n"
              "    url = acc.get_tracker('wandb').run.url\nacc.get_tracker('wandb').log({'a': 1})\n")),
    ("ds-manual-accumulation",
     ("t.py", "engine, opt, _, _ = deepspeed.initialize(model=m, config=c)\nfor i, b in enumerate(dl):\n"
              "    engine.backward(engine(b))\n    if (i + 1) % 4 == 0:\n        engine.step()\n"),
     ("t.py", "engine, opt, _, _ = deepspeed.initialize(model=m, config=c)\nfor i, b in enumerate(dl):\n"
              "    engine.backward(engine(b))\n    engine.step()\n    if (i + 1) % 100 == 0:\n        save(engine)\n")),
    ("ddp-bypassed",
     ("t.py", "class T(Trainer):\n    def compute_loss(self, model, inputs):\n"
              "        base = self.accelerator.unwrap_model(model).get_decoder()\n        return base(**inputs).loss\n"),
     ("t.py", "class T(Trainer):\n    def compute_loss(self, model, inputs):\n        out = model(**inputs)\n"
              "        cfg = self.accelerator.unwrap_model(model).config\n        return out.loss\n")),
    ("master-port-random-per-node",
     ("t.py", "import os, socket\ndef free_port():\n    s = socket.socket()\n    s.bind(('', 0))\n"
              "    return s.getsockname()[1]\ndef launch(num_machines, machine_rank):\n    env = dict(os.environ)\n"
              "    env['MASTER_PORT'] = str(free_port())\n"),
     ("t.py", "import os, socket\ndef free_port():\n    s = socket.socket()\n    s.bind(('', 0))\n"
              "    return s.getsockname()[1]\ndef launch(num_machines, machine_rank):\n    env = dict(os.environ)\n"
              "    if machine_rank == 0:\n        env['MASTER_PORT'] = str(free_port())\n")),
    ("rank-overwritten-on-resume",
     ("t.py", "opt = parser.parse_args()\nopt.global_rank = int(os.environ['RANK'])\nif opt.resume:\n"
              "    opt = argparse.Namespace(**yaml.load(f))\ntorch.cuda.set_device(opt.global_rank % 8)\n"),
     ("t.py", "opt = parser.parse_args()\nopt.global_rank = int(os.environ['RANK'])\nif opt.resume:\n"
              "    keep = opt.global_rank\n    opt = argparse.Namespace(**yaml.load(f))\n    opt.global_rank = keep\n"
              "torch.cuda.set_device(opt.global_rank % 8)\n")),
    ("undefined-attribute",
     ("t.py", "class T:\n    def __init__(self):\n        self.local_rank = 0\n    def load(self):\n"
              "        return f'cuda:{self.gpu_id}'\n"),
     ("t.py", "class T:\n    def __init__(self):\n        self.gpu_id = 0\n    def load(self):\n"
              "        return f'cuda:{self.gpu_id}', self.helper()\n")),
    # lint blind6: DeepSpeedExamples#804, pytorch/examples#1285, peft#2454, trl#1353, litgpt#703
    ("rank-gated-model-change",
     ("t.py", "acc = Accelerator()\nif acc.is_main_process:\n    conv = nn.Conv2d(8, 4, 3)\n    unet.conv_in = conv\n"
              "unet, opt = acc.prepare(unet, opt)\n"),
     ("t.py", "acc = Accelerator()\nconv = nn.Conv2d(8, 4, 3)\nunet.conv_in = conv\nif acc.is_main_process:\n"
              "    print('replaced conv_in')\nunet, opt = acc.prepare(unet, opt)\n")),
    ("sampler-not-distributed",
     ("t.py", "def main(args):\n    if args.local_rank == -1:\n        s = SequentialSampler(ds)\n    else:\n"
              "        s = DistributedSampler(ds)\n    s = SequentialSampler(ds)\n    dl = DataLoader(ds, sampler=s)\n"),
     ("t.py", "def main(args):\n    s = SequentialSampler(ds)\n    if args.local_rank != -1:\n"
              "        s = DistributedSampler(ds)\n    dl = DataLoader(ds, sampler=s)\n")),
    ("set-device-after-init",
     ("t.py", "import os, torch\nfrom torch.distributed import init_process_group\ndef setup():\n"
              "    init_process_group(backend='nccl')\n    torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n"),
     ("t.py", "import os, torch\nfrom torch.distributed import init_process_group\ndef setup():\n"
              "    torch.cuda.set_device(int(os.environ['LOCAL_RANK']))\n    init_process_group(backend='nccl')\n")),
    ("launcher-env-unset",
     ("t.py", "import os\nuse_fsdp = os.environ.get('ACCELERATE_USE_FSDP').lower() == 'true'\n"),
     ("t.py", "import os\nuse_fsdp = os.environ.get('ACCELERATE_USE_FSDP', 'false').lower() == 'true'\n")),
    ("quantized-model-no-device-map",
     ("t.py", "from trl import DPOTrainer\nmodel = AutoModelForCausalLM.from_pretrained('m', load_in_4bit=True)\n"
              "trainer = DPOTrainer(model)\n"),
     ("t.py", "from accelerate import PartialState\nfrom trl import DPOTrainer\nmodel = AutoModelForCausalLM.from_pretrained"
              "('m', load_in_4bit=True, device_map={'': PartialState().process_index})\ntrainer = DPOTrainer(model)\n")),
    ("fsdp-inference-mode",
     ("t.py", "import torch\nfrom lightning.fabric.strategies import FSDPStrategy\n@torch.inference_mode()\n"
              "def validate(model, x):\n    return model(x)\n"),
     ("t.py", "import torch\nfrom lightning.fabric.strategies import FSDPStrategy\n@torch.no_grad()\n"
              "def validate(model, x):\n    return model(x)\n")),
    # bash launch scripts (lint blind6: huggingface/peft#1722, open-mmlab/mmpose#1338, LLaMA-Factory ebab655)
    ("shell-broken-continuation",
     ("run.sh", "torchrun --nproc-per-node 2 train.py \\ \n    --lr 0.1 \\\n    --epochs 3\n"),
     ("run.sh", "torchrun --nproc-per-node 2 train.py \\\n    --lr 0.1 \\\n    --epochs 3\n")),
    ("launcher-var-unset",
     ("run.sh", "torchrun --nnodes $NNODES --node_rank $NODE_RANK --master_addr node0 --master_port 29500 "
                "--nproc_per_node 2 train.py\n"),
     ("run.sh", "NNODES=${NNODES:-1}\nNODE_RANK=${NODE_RANK:-0}\ntorchrun --nnodes $NNODES --node_rank $NODE_RANK "
                "--master_addr node0 --master_port 29500 --nproc_per_node 2 train.py\n")),
    ("master-addr-missing",
     ("run.sh", "PORT=${PORT:-29500}\npython -m torch.distributed.launch --nnodes=2 --node_rank=0 "
                "--master_addr=$MASTER_ADDR --nproc_per_node=2 --master_port=$PORT train.py\n"),
     ("run.sh", "MASTER_ADDR=${MASTER_ADDR:-127.0.0.1}\nPORT=${PORT:-29500}\npython -m torch.distributed.launch "
                "--nnodes=1 --node_rank=0 --master_addr=$MASTER_ADDR --nproc_per_node=2 --master_port=$PORT train.py\n")),
]


def test_hf_trainer_arguments_against_the_deepspeed_config():
    ds = ("ds.json", '{"train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 8}')
    cmd = "deepspeed train.py --deepspeed ds.json --output_dir out --do_train"
    assert "ds-args-mismatch" in ids(ds, command=cmd)  # the TrainingArguments defaults: 8 and 1
    auto = ("ds.json", '{"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto"}')
    assert "ds-args-mismatch" not in ids(auto, command=cmd)
    same = cmd + " --per_device_train_batch_size 16 --gradient_accumulation_steps 8"
    assert "ds-args-mismatch" not in ids(ds, command=same)


def test_excerpts_and_reports_are_read():
    excerpt = "# pasted from an issue\n    if torch.cuda.device_count() > 1:\n        sampler = DistributedSampler(ds)\n" \
              "# [...]\n    loader = DataLoader(ds, shuffle=True,\n# [...]\n    sampler=sampler)\n"
    got = ids(("t.py", excerpt))
    assert {"python-syntax", "dataloader-sampler-and-shuffle"} <= got
    report = "- distributed_type: MULTI_GPU\n- num_processes: 1\n- num_machines: 2\n- machine_rank: 0\n"
    assert "acc-processes-not-divisible" in ids(("env.txt", report))
    usage = "usage: train.py [-h] [--lr LR]\n"
    assert "local-rank-arg-under-launcher" in ids(("usage.txt", usage),
                                                  command="python -m torch.distributed.launch --nproc_per_node=2 train.py")
    truncated = ("ds.json", '{"train_batch_size": 8,\n "gradient_accumulation_steps": "8",\n "fp16": {"enabled": true,\n')
    assert {"config-unparsable", "ds-invalid-value"} <= ids(truncated)
    broken = "CUDA_VISIBLE_DEVICES=1,2 torchrun --nproc_per_node=4 --master_addr=127.0.0.1\n--master_port=5555 train.py\n"
    assert "nproc-exceeds-gpus" in ids(("run.sh", broken))


@pytest.mark.parametrize("rule, buggy, clean", CASES, ids=[c[0] for c in CASES])
def test_each_contract_rule_fires_on_the_violation_and_not_on_the_look_alike(rule, buggy, clean):
    assert rule in ids(buggy)
    assert rule not in ids(clean)


ARGPARSE = """
import argparse, os, torch, torch.distributed as dist
p = argparse.ArgumentParser()
p.add_argument("--lr", type=float)
{extra}
args = p.parse_args()
dist.init_process_group("nccl")
torch.cuda.set_device({device})
"""


def test_launcher_and_script_contracts():
    legacy = ("train.py", ARGPARSE.format(extra='p.add_argument("--local_rank", type=int)', device="args.local_rank"))
    cmd = "python -m torch.distributed.launch --nproc_per_node=2 train.py --lr 0.1"
    assert "local-rank-arg-under-launcher" in ids(legacy, command=cmd)
    fixed = ("train.py", ARGPARSE.format(extra='p.add_argument("--local-rank", "--local_rank", type=int)',
                                         device="args.local_rank"))
    assert "local-rank-arg-under-launcher" not in ids(fixed, command=cmd)
    # torchrun passes nothing: args.local_rank keeps its default
    assert "local-rank-arg-under-launcher" in ids(legacy, command="torchrun --nproc-per-node=2 train.py --lr 0.1")
    env = ("train.py", ARGPARSE.format(extra="", device="int(os.environ['LOCAL_RANK'])"))
    assert not ids(env, command="torchrun --nproc-per-node=2 train.py --lr 0.1") & {
        "local-rank-arg-under-launcher", "script-arg-unknown"}
    assert "local-rank-arg-under-launcher" in ids(env, command="deepspeed --num_gpus=2 train.py --lr 0.1")
    assert "script-arg-unknown" in ids(env, command="torchrun --nproc-per-node=2 train.py --lr 0.1 --epochs 3")
    assert "script-arg-unknown" not in ids(env, command="torchrun --nproc-per-node=2 train.py --l 0.1")  # a prefix
    assert "env-init-without-launcher" in ids(env, ("run.sh", "python train.py --lr 0.1\n"))
    assert "env-init-without-launcher" not in ids(env, ("run.sh", "torchrun --nproc-per-node=2 train.py --lr 0.1\n"))


def test_allocation_and_script_contracts():
    cpu = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\nsrun torchrun --nnodes=2 --nproc-per-node=4 " \
          "--rdzv-backend=c10d --rdzv-endpoint=$H:29500 train.py\n"
    script = ("train.py", "import os, torch, torch.distributed as dist\ntorch.cuda.set_device(int(os.environ["
                          "'LOCAL_RANK']))\ndist.init_process_group('nccl')\n")
    assert "nccl-without-gpus" in ids(script, ("job.sh", cpu))
    assert "nccl-without-gpus" not in ids(script, ("job.sh", cpu.replace("--nodes=2\n", "--nodes=2\n#SBATCH --gpus-per-node=4\n")))
    pl = ("train.py", "import lightning as L\ntrainer = L.Trainer(devices=4, num_nodes=2)\n")
    assert "lightning-slurm-mismatch" in ids(pl, ("job.sh", cpu.replace("--nnodes=2 --nproc-per-node=4 ", "")))
    ok = cpu.replace("--ntasks-per-node=1", "--ntasks-per-node=4")
    assert "lightning-slurm-mismatch" not in ids(pl, ("job.sh", ok))


# ---------------------------------------------------------------- one rule set, three entry points
LAUNCH_EXAMPLES = {
    "standalone-multinode": "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --gpus-per-node=8\nsrun torchrun --standalone "
                            "--nnodes=2 --nproc-per-node=8 train.py\n",
    "master-addr-missing": "torchrun --nnodes=2 --node-rank=0 --nproc-per-node=8 train.py",
    "master-addr-loopback": "torchrun --nnodes=2 --node-rank=0 --master-addr=localhost --nproc-per-node=8 train.py",
    "default-port-shared": "deepspeed --num_gpus=2 train.py",
    "nproc-exceeds-gpus": "#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --gpus-per-node=2\nsrun torchrun --nproc-per-node=4 "
                          "train.py\n",
    "accelerate-cpu-one-process": "accelerate launch --cpu --num_processes 4 train.py",
    "deepspeed-ssh": "deepspeed --hostfile hostfile train.py",
    "script-in-tmp": "#!/bin/bash\n#SBATCH --nodes=2\nsrun torchrun --nnodes=2 --rdzv-backend=c10d "
                     "--rdzv-endpoint=h:1 /tmp/train.py\n",
    "args-in-tmp": "#!/bin/bash\n#SBATCH --nodes=2\nsrun torchrun --nnodes=2 --rdzv-backend=c10d --rdzv-endpoint=h:1 "
                   "train.py --config /tmp/c.yaml\n",
    "srun-tasks-per-node": "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=8\nsrun torchrun --nnodes=2 "
                           "--rdzv-backend=c10d --rdzv-endpoint=h:1 train.py\n",
    "node-rank-fixed": "#!/bin/bash\n#SBATCH --nodes=2\nsrun torchrun --nnodes=2 --nproc-per-node=8 "
                       "--node_rank=$SLURM_NODEID --master-addr=n0 train.py\n",
    "srun-export-none": "#!/bin/bash\n#SBATCH --nodes=2\nsrun --export=NONE torchrun --nnodes=2 --rdzv-backend=c10d "
                        "--rdzv-endpoint=h:1 train.py\n",
    "gloo-nccl-syntax": "export GLOO_SOCKET_IFNAME=^docker0\ntorchrun --standalone --nproc-per-node=2 train.py",
    "ifname-loopback": "export NCCL_SOCKET_IFNAME=lo\ntorchrun --nnodes=2 --node-rank=0 --master-addr=n0 train.py",
    "ifname-bridge": "export NCCL_SOCKET_IFNAME=docker0\ntorchrun --standalone --nproc-per-node=2 train.py",
    "ifname-node-specific": "export NCCL_SOCKET_IFNAME=ibp65s0\ntorchrun --nnodes=2 --node-rank=0 --master-addr=n0 "
                            "train.py",
    "nccl-exclude-keeps-lo": "export NCCL_SOCKET_IFNAME=^docker0\ntorchrun --standalone --nproc-per-node=2 train.py",
    "single-node-net-transport": "export NCCL_P2P_DISABLE=1\ntorchrun --standalone --nproc-per-node=2 train.py",
    "nccl-net-disable-ignored": "export NCCL_NET_DISABLE=1\ntorchrun --nnodes=2 --node-rank=0 --master-addr=n0 train.py",
    "multinode-ib-disabled": "export NCCL_IB_DISABLE=1\ntorchrun --nnodes=2 --node-rank=0 --master-addr=n0 train.py",
    "deprecated-async-error-handling": "export NCCL_ASYNC_ERROR_HANDLING=1\ntorchrun --standalone train.py",
    "async-error-handling-off": "export TORCH_NCCL_ASYNC_ERROR_HANDLING=0\ntorchrun --standalone train.py",
    "master-addr-not-exported": "#!/bin/bash\n#SBATCH --nodes=2\nMASTER_ADDR=$(hostname)\nsrun bash -c 'torchrun "
                                "--nnodes=2 --node-rank=$SLURM_NODEID --master-addr=$MASTER_ADDR train.py'\n",
    "nnodes-mismatch": "#!/bin/bash\n#SBATCH --nodes=2\nsrun torchrun --nnodes=4 --rdzv-backend=c10d "
                       "--rdzv-endpoint=h:1 train.py\n",
    "launcher-option-unknown": "torchrun -\u2014nproc-per-node=8 train.py",
    "srun-no-script": "#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --ntasks-per-node=8\nsrun --cpu_bind=v python\n"
                      "deepspeed train.py\n",
    "sbatch-option-unknown": "#!/bin/bash\n#SBATCH --nodes=1\n#SBATCH --gpus-per-nodes=8\nsrun torchrun --nnodes=1 "
                             "--nproc-per-node=8 train.py\n",
    "sbatch-tasks-fewer-than-nodes": "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks=1\nsrun torchrun --nnodes=2 "
                                     "--rdzv-backend=c10d --rdzv-endpoint=h:1 train.py\n",
}


def test_every_launch_rule_has_an_example():
    launch_rules = {r for r in RULES if RULES[r] and r in set(widgets.TRAP_SECTIONS)} - {"port-in-use"}
    assert launch_rules <= set(LAUNCH_EXAMPLES), launch_rules - set(LAUNCH_EXAMPLES)


@pytest.fixture(scope="module")
def builder():
    return widgets.command_builder()


@pytest.mark.parametrize("rule", sorted(LAUNCH_EXAMPLES))
def test_every_launch_rule_fires_through_lint_build_check_and_the_paste_box(rule, capsys, tmp_path, builder):
    text = LAUNCH_EXAMPLES[rule]
    job = tmp_path / "job.sh"
    job.write_text(text)
    assert rule in {f.id for f in lint_texts([(str(job), text)])}                           # runbook lint
    cli.main(["build", "--check", text])                                                     # runbook build --check (traps on stderr)
    assert f"] {rule} (" in capsys.readouterr().err
    cli.main(["build", "--check-file", str(job)])                                            # --check-file
    assert f"] {rule} (" in capsys.readouterr().err
    builder.paste.value = text                                                               # the paste box
    assert rule in [t.id for t in builder.pasted_traps]
    assert rule in [t.id for t in script_traps.check_text(text)[1]]


# ---------------------------------------------------------------- rank data flow across functions
def test_rank_flows_through_calls_returns_spawn_and_loop_counts():
    through_call = """
    import torch.distributed as dist
    def step(is_first):
        if is_first:
            dist.barrier()
    def main():
        step(dist.get_rank() == 0)
    """
    assert "rank-gated-collective" in ids(("t.py", through_call))
    returned = """
    import torch.distributed as dist
    def is_leader():
        return dist.get_rank() == 0
    if is_leader():
        dist.all_reduce(t)
    """
    assert "rank-gated-collective" in ids(("t.py", returned))
    spawned = """
    import torch.multiprocessing as mp, torch.distributed as dist
    def worker(idx, world):
        if idx == 0:
            dist.barrier()
    mp.spawn(worker, args=(2,), nprocs=2)
    """
    assert "rank-gated-collective" in ids(("t.py", spawned))
    loop = """
    import torch.distributed as dist
    rank = dist.get_rank()
    for _ in range(rank + 1):
        dist.all_reduce(t)
    """
    assert "rank-gated-collective" in ids(("t.py", loop))
    save_on_gpu0 = """
    import torch, torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    def train(gpu_id, model):
        dist.init_process_group("nccl", timeout=t)
        model = DDP(model, device_ids=[gpu_id])
        if gpu_id == 0:
            torch.save(model.state_dict(), "m.pt")
    """
    assert not ids(("t.py", save_on_gpu0)) & {"write-on-every-rank", "rank-gated-collective"}
