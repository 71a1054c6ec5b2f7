"""runbook lint changes made on the twenty-seventh blind set (tests/data/lint/blind27), each with its violation and
its look-alike."""

from __future__ import annotations

import textwrap

from helpers.lint import lint_texts


def found(*files: tuple[str, str]) -> list[tuple[str, str]]:
    return [(f.id, f.status) for f in lint_texts([(n, textwrap.dedent(t)) for n, t in files]) if f.status != "OK"]


def ids(*files: tuple[str, str]) -> list[str]:
    return [i for i, _s in found(*files)]


def test_a_launcher_option_of_a_command_kept_in_a_variable_from_an_unset_variable():
    """open-r1's launch.slurm: LAUNCHER="accelerate launch ... --gradient_accumulation_steps $GRAD_ACC_STEPS ..."."""
    job = ('#!/bin/bash\n#SBATCH --nodes=2\nsource ~/.bashrc\nexport LAUNCHER="accelerate launch \\\n'
           '    --gradient_accumulation_steps $GRAD_ACC_STEPS \\\n    --num_machines 2 \\\n    "\n'
           'srun bash -c "$LAUNCHER train.py"\n')
    assert "launcher-var-unset" in ids(("launch.slurm", job))
    assert "launcher-var-unset" not in ids(("launch.slurm", job.replace("source ~/.bashrc\n", "GRAD_ACC_STEPS=4\n")))
    assert "launcher-var-unset" not in ids(("launch.slurm", job.replace("source ~/.bashrc", "source env.sh")))


def test_the_training_script_left_to_an_unset_variable():
    """accelerate's submit_multinode.sh: CMD="$LAUNCHER $PYTHON_FILE $ARGS" with SCRIPT set instead."""
    job = ('#!/bin/bash\n#SBATCH --nodes=2\nexport LAUNCHER="accelerate launch --num_machines 2 "\n'
           'export SCRIPT="train.py"\nexport CMD="$LAUNCHER {word} $ARGS"\nsrun $CMD\n')
    assert ("launcher-var-unset", "FAIL") in found(("job.sh", job.format(word="$PYTHON_FILE")))
    assert "launcher-var-unset" not in ids(("job.sh", job.format(word="$SCRIPT")))


def test_an_unset_variable_on_a_launch_line_under_set_u():
    """OLMo: set -exuo pipefail, then --fsdp.hybrid_sharding_num_model_replicas=$NUM_NODES never assigned."""
    job = ("#!/usr/bin/env bash\nset -exuo pipefail\n{assign}torchrun --nnodes $BEAKER_REPLICA_COUNT train.py "
           "--fsdp.replicas=$NUM_NODES\n")
    assert ("shell-var-unset", "FAIL") in found(("run.sh", job.format(assign="")))
    assert "shell-var-unset" not in ids(("run.sh", job.format(assign="NUM_NODES=$BEAKER_REPLICA_COUNT\n")))
    assert "shell-var-unset" not in ids(("run.sh", job.format(assign="").replace("set -exuo pipefail", "set -ex")))


def test_lightning_devices_from_the_launch_line_against_ntasks():
    """CSC's pytorch-ddp-examples: #SBATCH --ntasks=1, srun python x.py --gpus=4, Trainer(gpus=args.gpus)."""
    script = """
    import argparse
    import pytorch_lightning as pl
    p = argparse.ArgumentParser()
    p.add_argument("--gpus", type=int, default=1)
    args = p.parse_args()
    trainer = pl.Trainer(gpus=args.gpus, accelerator="gpu", strategy="ddp")
    """
    job = "#!/bin/bash\n#SBATCH --ntasks={n}\n#SBATCH --gres=gpu:v100:4\nsrun python3 mnist.py --gpus=4\n"
    assert "lightning-slurm-mismatch" in ids(("run.sh", job.format(n=1)), ("mnist.py", script))
    assert "lightning-slurm-mismatch" not in ids(("run.sh", job.format(n=4)), ("mnist.py", script))


def test_a_direct_backward_beside_a_deepspeed_engine_settled_by_the_config():
    """DeepSpeed >= 0.18.3 accepts loss.backward() through ZeRO 1-3's hooks; stage 0 or fp16 does not."""
    script = """
    import deepspeed
    engine, opt, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config="ds.json")
    for x in loader:
        loss = engine(x).sum()
        loss.backward()
        engine.step()
    """
    zero2 = '{"train_batch_size": 8, "zero_optimization": {"stage": 2}, "bf16": {"enabled": true}}'
    zero0 = '{"train_batch_size": 8, "fp16": {"enabled": true}}'
    assert "deepspeed-raw-backward" not in ids(("train.py", script), ("ds.json", zero2))
    assert ("deepspeed-raw-backward", "FAIL") in found(("train.py", script), ("ds.json", zero0))
    assert ("deepspeed-raw-backward", "WARN") in found(("train.py", script))


def test_a_prepared_module_that_is_never_called():
    """kvablack/ddpo-pytorch: the LoRA layers were prepared, the forward ran on pipeline.unet."""
    src = """
    from accelerate import Accelerator
    accelerator = Accelerator()
    trainable_layers = AttnProcsLayers(pipeline.unet.attn_processors)
    optimizer = torch.optim.AdamW(trainable_layers.parameters())
    trainable_layers, optimizer = accelerator.prepare(trainable_layers, optimizer)
    for batch in loader:
        pred = {forward}(batch)
        loss = pred.mean()
        accelerator.backward(loss)
        accelerator.clip_grad_norm_(trainable_layers.parameters(), 1.0)
        optimizer.step()
    """
    assert "ddp-bypassed" in ids(("train.py", src.replace("{forward}", "pipeline.unet")))
    assert "ddp-bypassed" not in ids(("train.py", src.replace("{forward}", "trainable_layers")))
