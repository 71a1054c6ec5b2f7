"""runbook lint changes made on the twenty-sixth blind set (tests/data/lint/blind26), each with its violation and its
look-alike."""

from __future__ import annotations

import textwrap

from helpers.launch_parse import expand_arrays, parse
from helpers.lint import lint_texts


def ids(*files: tuple[str, str]) -> list[str]:
    return [f.id for f in lint_texts([(n, textwrap.dedent(t)) for n, t in files]) if f.status != "OK"]


def test_a_fixed_device_map_under_a_multi_process_trainer():
    """trl#725: the quantized examples loaded with device_map={"": 0}; TRL's recipe uses the process index."""
    src = """
    from transformers import AutoModelForCausalLM
    from trl import SFTTrainer

    device_map = {{"": {where}}}
    model = AutoModelForCausalLM.from_pretrained("m", load_in_8bit=True, device_map=device_map)
    trainer = SFTTrainer(model=model)
    """
    assert "same-device-every-rank" in ids(("sft.py", src.format(where="0")))
    assert "same-device-every-rank" not in ids(("sft.py", src.format(where="Accelerator().local_process_index")))


def test_a_main_process_flag_decided_by_the_local_rank():
    """prime-rl's monitor: self.is_master = LOCAL_RANK == 0 started a W&B run on every node."""
    src = """
    import os
    import wandb

    class Monitor:
        def __init__(self):
            rank = int(os.environ.get("LOCAL_RANK", "0"))
            self.is_master = rank == {test}
            if self.is_master:
                wandb.init(project="p")
    """
    assert "local-rank-as-global-rank" in ids(("monitor.py", src.format(test="0")))
    per_node = src.format(test="0").replace("self.is_master", "self.is_local_master")
    assert "local-rank-as-global-rank" not in ids(("monitor.py", per_node))


def test_a_break_under_a_rank_gate_leaves_the_loop_on_that_rank_only():
    """ultralytics/yolov5#4576: early stopping under `if RANK in [-1, 0]:` left the epoch loop on rank 0."""
    src = """
    import torch.distributed as dist

    def train(model, loader, rank, stopper):
        for epoch in range(10):
            for x in loader:
                dist.all_reduce(x)
            if rank == 0:
                if stopper(epoch):
                    break
    """
    assert "rank-early-exit-collective" in ids(("train.py", src))
    shared = src.replace("            if rank == 0:\n                if stopper(epoch):\n                    break",
                         "            if stopper(epoch):\n                break")
    assert "rank-early-exit-collective" not in ids(("train.py", shared))


def test_a_forward_of_a_syncbn_model_on_one_rank():
    """ultralytics/yolov5#4615: the TensorBoard graph traced on rank 0 ran SyncBatchNorm's gather there alone."""
    src = """
    import torch

    def train(model, imgs, rank, tb):
        model = torch.nn.SyncBatchNorm.convert_sync_batchnorm(model)
        {prep}
        if rank == 0:
            tb.add_graph(torch.jit.trace(de_parallel(model), imgs[0:1]))
    """
    assert "rank-gated-collective" in ids(("train.py", src.format(prep="pass")))
    assert "rank-gated-collective" not in ids(("train.py", src.format(prep="model.eval()")))


def test_a_launcher_option_the_launcher_rejects_in_a_variable_and_with_expanded_values():
    """accelerate's slurm example: LAUNCHER="accelerate launch --config ${DIR}/fsdp.yaml ..." (only --config_file)."""
    job = ('#!/bin/bash\n#SBATCH --nodes=2\nexport LAUNCHER="accelerate launch \\\n    --config ${D}/fsdp.yaml \\\n'
           '    --num_processes $((SLURM_NNODES * 4)) \\\n    "\nexport CMD="$LAUNCHER train.py"\nsrun $CMD\n')
    assert "launcher-option-unknown" in ids(("job.sh", job))
    assert "launcher-option-unknown" not in ids(("job.sh", job.replace("--config ", "--config_file ")))
    assert "launcher-option-unknown" in ids(("run.sh", "torchrun --nproc-per-gpu=$N train.py\n"))
    assert "launcher-option-unknown" not in ids(("run.sh", "torchrun --nproc_per_node=$N --master_port=$P train.py\n"))


def test_bash_arrays_and_srun_options_reach_the_script_arguments():
    """awsome-distributed-ai: srun ${AUTO_RESUME} -l --container-mounts $(...) torchrun "${TORCHRUN_ARGS[@]}" ddp.py
    ${TRAIN_ARGS[@]} with --use-mlflow for a parser that defines --use_mlflow."""
    job = ('#!/bin/bash\n#SBATCH --nodes=2\ndeclare -a TORCHRUN_ARGS=(\n    --nproc_per_node=4  # GPUs\n'
           '    --rdzv_endpoint=$(hostname)\n)\ndeclare -a TRAIN_ARGS=(\n    --epochs 5\n    --use-mlflow\n)\n'
           'srun ${AUTO_RESUME} -l --container-mounts $(dirname "$PWD") torchrun \\\n    "${TORCHRUN_ARGS[@]}" \\\n'
           '    ddp.py ${TRAIN_ARGS[@]}\n')
    assert "--use-mlflow" in expand_arrays(job)
    spec = parse(job)
    assert spec.script == "ddp.py" and spec.nproc_per_node == 4 and "--use-mlflow" in spec.script_args
    script = ('import argparse\np = argparse.ArgumentParser()\np.add_argument("--epochs", type=int)\n'
              'p.add_argument("--use_mlflow", action="store_true")\nargs = p.parse_args()\n')
    assert "script-arg-unknown" in ids(("job.sbatch", job), ("ddp.py", script))
    assert "script-arg-unknown" not in ids(("job.sbatch", job.replace("--use-mlflow", "--use_mlflow")),
                                           ("ddp.py", script))


def test_readme_placeholders_are_the_reader_s():
    """Alpaca-CoT's README: --master_addr=xxx --master_port=yyy, torchrun --nproc_per_node $ngpu."""
    readme = ("# Train\n\n```bash\ntorchrun --nproc_per_node $ngpu train.py\n```\n\n```\npython -m torch.distributed."
              "launch --nproc_per_node 4 --master_addr=xxx --master_port=yyy train.py\n```\n")
    got = ids(("README.md", readme))
    assert "launcher-option-unknown" not in got and "launcher-var-unset" not in got


def test_a_state_dict_stripped_of_module_loaded_into_the_wrapper():
    """mlfoundations/open_lm#138: resume stripped 'module.' and loaded into the DDP-wrapped model."""
    src = """
    import torch
    from torch.nn.parallel import DistributedDataParallel

    def load_model(path, model):
        sd = torch.load(path)["state_dict"]
        sd = {k[len("module."):]: v for k, v in sd.items()}
        {target}.load_state_dict(sd)

    def main(model, path):
        model = DistributedDataParallel(model)
        load_model(path, model)
    """
    assert "ddp-state-dict-prefix" in ids(("main.py", src.replace("{target}", "model")))
    assert "ddp-state-dict-prefix" not in ids(("main.py", src.replace("{target}", "model.module")))
    dispatch = src.replace("        {target}.load_state_dict(sd)", "        if distributed:\n"
                           "            model.module.load_state_dict(sd)\n        else:\n            model.load_state_dict(sd)")
    assert "ddp-state-dict-prefix" not in ids(("main.py", dispatch))  # open_lm's fix


def test_a_forward_on_the_unwrapped_global_model_before_backward():
    """jingyaogong/minimind#854: the GRPO loss ran on model.module, so DDP never all-reduced the gradients."""
    src = """
    from torch.nn.parallel import DistributedDataParallel

    def train_epoch(loader, optimizer):
        for x in loader:
            inner = model.module if isinstance(model, DistributedDataParallel) else model
            loss = {call}(x).loss
            loss.backward()
            optimizer.step()

    model = DistributedDataParallel(build())
    """
    assert "ddp-bypassed" in ids(("train.py", src.replace("{call}", "inner")))
    assert "ddp-bypassed" not in ids(("train.py", src.replace("{call}", "model")))


def test_a_checkpoint_saved_from_the_compiled_model_loaded_before_compiling():
    """karpathy/nanoGPT: raw_model of the compiled model saved '_orig_mod.' keys; resume loaded them uncompiled."""
    src = """
    import torch

    model = GPT(conf)
    if resume:
        model.load_state_dict(torch.load("ckpt.pt")["model"])
    model = torch.compile(model)
    raw_model = model
    torch.save({"model": raw_model.state_dict()}, "ckpt.pt")
    """
    assert "compile-state-dict-prefix" in ids(("train.py", src))
    fixed = src.replace('torch.load("ckpt.pt")["model"]',
                        '{k.removeprefix("_orig_mod."): v for k, v in torch.load("ckpt.pt")["model"].items()}')
    assert "compile-state-dict-prefix" not in ids(("train.py", fixed))


def test_the_author_s_dispatch_between_the_wrapper_and_the_module():
    """diffusers' custom_diffusion: if num_processes > 1: text_encoder.module.get_input_embeddings() else: ..."""
    src = """
    from accelerate import Accelerator
    accelerator = Accelerator()
    te = CLIPTextModel.from_pretrained("m")
    te, opt = accelerator.prepare(te, opt)
    if accelerator.num_processes > 1:
        g = te.module.get_input_embeddings().weight.grad
    else:
        g = te.get_input_embeddings().weight.grad
    """
    assert "ddp-wrapper-attribute" not in ids(("train.py", src))
    bare = src.replace("te.module.get_input_embeddings", "te.get_input_embeddings")
    assert "ddp-wrapper-attribute" in ids(("train.py", bare))
