"""runbook lint changes made on the twenty-eighth blind set (tests/data/lint/blind28), each with its violation and
its look-alike."""

from __future__ import annotations

import textwrap

from helpers.lint import lint_texts


def ids(*files: tuple[str, str]) -> list[str]:
    return [f.id for f in lint_texts([(n, textwrap.dedent(t)) for n, t in files]) if f.status != "OK"]


def test_a_trainer_callback_that_writes_on_every_rank():
    """hiyouga/ChatGLM-Efficient-Tuning: LogCallback.on_log appended to trainer_log.jsonl on every process."""
    src = """
    import json, os
    from transformers import TrainerCallback

    class LogCallback(TrainerCallback):
        def on_log(self, args, state, control, **kwargs):
            {gate}with open(os.path.join(args.output_dir, "trainer_log.jsonl"), "a") as f:
                f.write(json.dumps(state.log_history[-1]))
    """
    assert "write-on-every-rank" in ids(("callbacks.py", src.replace("{gate}", "")))
    gated = src.replace("{gate}with open", "if not state.is_world_process_zero:\n                return\n"
                                           "            with open")
    assert "write-on-every-rank" not in ids(("callbacks.py", gated))


def test_writes_of_a_plain_trainer_script_started_on_several_processes():
    """asmtransformers: tokenizer/model.save_pretrained after trainer.train(), launched by srun + torchrun."""
    script = """
    from transformers import Trainer
    def main(model, tok, args, out):
        trainer = Trainer(model=model, args=args)
        trainer.train()
        model.save_pretrained(out)
    main(m, t, a, "out")
    """
    job = "#!/bin/bash\n#SBATCH --nodes=1\nsrun torchrun --nproc-per-node {n} pretrain.py\n"
    assert "write-on-every-rank" in ids(("pretrain.py", script), ("job.sh", job.format(n=8)))
    assert "write-on-every-rank" not in ids(("pretrain.py", script), ("job.sh", job.format(n=1)))
    assert "write-on-every-rank" not in ids(("pretrain.py", script))  # nothing says it runs on several processes


def test_an_option_added_twice_to_one_parser():
    """Dreambooth-Anything: two parser.add_argument('--local_rank', ...) calls; argparse raises while building."""
    src = """
    import argparse
    def parse_args():
        parser = argparse.ArgumentParser()
        parser.add_argument("--local_rank", type=int, default=-1)
        {second}
        return parser.parse_args()
    """
    assert "argparse-duplicate-option" in ids(("train.py", src.replace(
        "{second}", 'parser.add_argument("--local_rank", type=int, default=-1)')))
    branches = src.replace('        parser.add_argument("--local_rank", type=int, default=-1)\n        {second}',
                           '        if old:\n            parser.add_argument("--local_rank", type=int)\n'
                           '        else:\n            parser.add_argument("--local_rank", type=str)')
    assert "argparse-duplicate-option" not in ids(("train.py", branches))


def test_fsdp_qlora_leaves_device_map_out():
    """philschmid's run_fsdp_qlora: bnb_4bit_quant_storage set and no device_map, as the FSDP-QLoRA recipe says."""
    src = """
    import torch
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig, Trainer
    q = BitsAndBytesConfig(load_in_4bit=True{storage})
    model = AutoModelForCausalLM.from_pretrained("m", quantization_config=q)
    trainer = Trainer(model=model)
    """
    assert "quantized-model-no-device-map" in ids(("run.py", src.replace("{storage}", "")))
    fsdp = src.replace("{storage}", ", bnb_4bit_quant_storage=torch.bfloat16")
    assert "quantized-model-no-device-map" not in ids(("run.py", fsdp))


def test_lightning_s_checkpoint_io_is_not_a_collective():
    """Lightning's own multiprocessing launcher: `if local_rank != 0: return` then checkpoint_io.save_checkpoint."""
    src = """
    import tempfile, os

    def collect(strategy, state_dict):
        if strategy.local_rank != 0:
            return None
        path = os.path.join(tempfile.mkdtemp(), ".temp.ckpt")
        strategy.checkpoint_io.save_checkpoint(state_dict, path)
        return path
    """
    assert "rank-early-exit-collective" not in ids(("launcher.py", src))
    engine = src.replace("strategy.checkpoint_io.save_checkpoint(state_dict, path)",
                         "model_engine.save_checkpoint(path)")
    assert "rank-early-exit-collective" in ids(("launcher.py", engine))
