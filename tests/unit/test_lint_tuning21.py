"""runbook lint changes made on the twentieth blind set's misses and the twenty-first blind set
(tests/data/lint/blind20, blind21), each with its violation and its look-alike."""

from __future__ import annotations

import json
import textwrap

from helpers.lint import lint_texts


def ids(*files: tuple[str, str]) -> list[str]:
    return [f.id for f in lint_texts([(n, textwrap.dedent(t)) for n, t in files]) if f.status != "OK"]


DS = {"train_micro_batch_size_per_gpu": 1, "gradient_accumulation_steps": 16, "bf16": {"enabled": True},
      "zero_optimization": {"stage": 3}}
RECIPE = """
training:
  output_dir: out
  per_device_train_batch_size: 1
  gradient_accumulation_steps: 8
  bf16: true
"""


def test_a_yaml_recipe_of_training_arguments_against_the_deepspeed_json_linted_with_it():
    """FAI-RL: the recipe's gradient_accumulation_steps 8 against the DeepSpeed file's 16 (HF's fill_match)."""
    assert "ds-args-mismatch" in ids(("recipe.yaml", RECIPE), ("ds.json", json.dumps(DS)))
    same = dict(DS, gradient_accumulation_steps=8)
    assert "ds-args-mismatch" not in ids(("recipe.yaml", RECIPE), ("ds.json", json.dumps(same)))
    auto = dict(DS, gradient_accumulation_steps="auto")
    assert "ds-args-mismatch" not in ids(("recipe.yaml", RECIPE), ("ds.json", json.dumps(auto)))
    # a recipe that names another DeepSpeed file is not compared with this one
    named = RECIPE + "  deepspeed: other.json\n"
    assert "ds-args-mismatch" not in ids(("recipe.yaml", named), ("ds.json", json.dumps(DS)))
    # a YAML that is not TrainingArguments (no output_dir) is not a recipe
    assert "ds-args-mismatch" not in ids(("model.yaml", RECIPE.replace("output_dir", "save_dir")),
                                         ("ds.json", json.dumps(DS)))


def test_precision_flags_against_the_deepspeed_sections():
    ds = {"train_micro_batch_size_per_gpu": 8, "fp16": {"enabled": True}}
    line = "deepspeed train.py --output_dir out --deepspeed ds.json --bf16\n"
    assert "ds-args-mismatch" in ids(("run.sh", line), ("ds.json", json.dumps(ds)))
    fp16 = line.replace("--bf16", "--fp16")
    assert "ds-args-mismatch" not in ids(("run.sh", fp16), ("ds.json", json.dumps(ds)))
    # no precision flag at all: a custom parser with --output_dir is not read as the Trainer's precision
    assert "ds-args-mismatch" not in ids(("run.sh", line.replace(" --bf16", "")), ("ds.json", json.dumps(ds)))


AXOLOTL = """
output_dir: ./out
gradient_accumulation_steps: 4
micro_batch_size: 2
optimizer: paged_adamw_8bit
fsdp:
  - full_shard
  - auto_wrap
fsdp_config:
  fsdp_offload_params: true
  fsdp_auto_wrap_policy: TRANSFORMER_BASED_WRAP
"""


def test_a_bitsandbytes_optimizer_with_fsdp_parameter_offload():
    assert "fsdp-optimizer-incompatible" in ids(("axolotl.yaml", AXOLOTL))
    assert "fsdp-optimizer-incompatible" not in ids(("axolotl.yaml", AXOLOTL.replace("paged_adamw_8bit",
                                                                                       "adamw_torch_fused")))
    assert "fsdp-optimizer-incompatible" not in ids(("axolotl.yaml", AXOLOTL.replace("fsdp_offload_params: true",
                                                                                       "fsdp_offload_params: false")))
    assert "fsdp-optimizer-incompatible" not in ids(("axolotl.yaml", AXOLOTL.replace("adamw_8bit", "adamw_torch_8bit")))
    hf = "torchrun --nproc-per-node 8 train.py --output_dir o --optim adamw_bnb_8bit --fsdp 'full_shard offload'\n"
    assert "fsdp-optimizer-incompatible" in ids(("run.sh", hf))
    assert "fsdp-optimizer-incompatible" not in ids(("run.sh", hf.replace(" offload", "")))


def test_a_bf16_branch_that_picks_float16():
    """CogVideo: `if ds_config['bf16']['enabled']: weight_dtype = torch.float16`."""
    text = """
    import torch
    weight_dtype = torch.float32
    if "fp16" in ds_config and ds_config["fp16"]["enabled"]:
        weight_dtype = torch.float16
    if "bf16" in ds_config and ds_config["bf16"]["enabled"]:
        weight_dtype = torch.float16
    """
    assert "ds-precision-mismatch" in ids(("train.py", text))
    right = text[:text.rindex("torch.float16")] + "torch.bfloat16\n"
    assert "ds-precision-mismatch" not in ids(("train.py", right))
    negated = """
    import torch
    if args.mixed_precision != "bf16":
        weight_dtype = torch.float16
    """
    assert "ds-precision-mismatch" not in ids(("train.py", negated))


def test_results_of_this_ranks_slice_reported_by_rank_zero():
    """nnUNet's DDP validation: pred_gt_tuples filled over my_keys = all_keys[local_rank::world_size]."""
    text = """
    import torch.distributed as dist
    def validate(self, all_keys):
        pred_gt_tuples = []
        my_keys = all_keys[self.local_rank::dist.get_world_size()]
        for k in my_keys:
            pred_gt_tuples.append(predict(k))
        dist.barrier()
        if self.local_rank == 0:
            aggregate_scores(pred_gt_tuples, json_output_file="summary.json")
    """
    assert "eval-shard-unreduced" in ids(("trainer.py", text))
    every = text.replace("for k in my_keys:", "for k in all_keys:")
    assert "eval-shard-unreduced" not in ids(("trainer.py", every))
    gathered = text.replace("        dist.barrier()\n", "        out = [None] * dist.get_world_size()\n"
                            "        dist.all_gather_object(out, pred_gt_tuples)\n"
                            "        pred_gt_tuples = [t for part in out for t in part]\n")
    assert "eval-shard-unreduced" not in ids(("trainer.py", gathered))


def test_a_checkpoint_directory_named_from_each_ranks_clock():
    """OpenTau: the config's output_dir default from datetime.now(), saved into by accelerator.save_state."""
    config = """
    import datetime as dt
    from pathlib import Path
    class TrainConfig:
        def validate(self):
            if not self.output_dir:
                now = dt.datetime.now()
                train_dir = f"{now:%Y-%m-%d}/{now:%H-%M-%S}_{self.job_name}"
                self.output_dir = Path("outputs/train") / train_dir
    """
    train = """
    import accelerate
    def train(cfg, model, loader):
        accelerator = accelerate.Accelerator()
        model, loader = accelerator.prepare(model, loader)
        for step, batch in enumerate(loader):
            checkpoint_dir = get_step_checkpoint_dir(cfg.output_dir, step)
            accelerator.save_state(checkpoint_dir)
    """
    assert "clock-dependent-path" in ids(("configs.py", config), ("train.py", train))
    fixed = train.replace("        model, loader =", "        accelerate.utils.broadcast_object_list([cfg.output_dir])\n"
                          "        model, loader =")
    assert "clock-dependent-path" not in ids(("configs.py", config), ("train.py", fixed))
    fixed_name = config.replace("Path(\"outputs/train\") / train_dir", "Path(\"outputs/train\") / self.job_name")
    assert "clock-dependent-path" not in ids(("configs.py", fixed_name), ("train.py", train))
    one_file = """
    import time
    import deepspeed
    engine, *_ = deepspeed.initialize(model=model, config="ds.json")
    save_dir = "ckpt/" + time.strftime("%Y%m%d-%H%M%S")
    engine.save_checkpoint(save_dir)
    """
    assert "clock-dependent-path" in ids(("train.py", one_file))


def test_an_object_first_set_to_none_then_made_on_rank_zero_only():
    """One table of rank-only objects: `writer = None` first no longer hides the rank-0-only SummaryWriter."""
    text = """
    import torch.distributed as dist
    def main(local_rank, loader):
        writer = None
        if local_rank == 0:
            writer = SummaryWriter("runs/x")
        for step, batch in enumerate(loader):
            loss = step_fn(batch)
            dist.all_reduce(loss)
            writer.add_scalar("loss", loss.item(), step)
    """
    assert "rank-gated-object-used" in ids(("train.py", text))
    guarded = text.replace("            writer.add_scalar", "            if not writer:\n                continue\n"
                           "            writer.add_scalar")
    assert "rank-gated-object-used" not in ids(("train.py", guarded))
