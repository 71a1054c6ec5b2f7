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
    # no precision flag, but TrainingArguments' own --deepspeed: the Trainer's fp16 is False against "enabled": true
    assert "ds-args-mismatch" in ids(("run.sh", line.replace(" --bf16", "")), ("ds.json", json.dumps(ds)))
    # a custom parser (--output_dir, DeepSpeed's own --deepspeed_config) is not read as the Trainer's arguments
    custom = line.replace(" --bf16", "").replace("--deepspeed ds.json", "--deepspeed_config ds.json")
    assert "ds-args-mismatch" not in ids(("run.sh", custom), ("ds.json", json.dumps(ds)))


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


def test_a_scheduler_stepped_outside_the_optimizers_branch():
    """OneVision-Encoder: `lr_scheduler.step()` after `if is_accumulation_step: ... else: opt.step()`."""
    text = """
    for step, batch in enumerate(loader):
        loss = model(batch) / accum
        if step % accum != 0:
            with model.no_sync():
                loss.backward()
        else:
            loss.backward()
            opt.step()
            opt.zero_grad()
        lr_scheduler.step()
    """
    assert "scheduler-steps-per-microbatch" in ids(("train.py", text))
    inside = text.replace("            opt.zero_grad()\n        lr_scheduler.step()",
                          "            opt.zero_grad()\n            lr_scheduler.step()")
    assert "scheduler-steps-per-microbatch" not in ids(("train.py", inside))
    amp = """
    for batch in loader:
        loss = model(batch)
        if use_amp:
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
        else:
            loss.backward()
            optimizer.step()
        scheduler.step()
    """
    assert "scheduler-steps-per-microbatch" not in ids(("train.py", amp))


def test_zero_grad_inside_accelerate_accumulate():
    text = """
    from accelerate import Accelerator
    accelerator = Accelerator(gradient_accumulation_steps=4)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for batch in loader:
        with accelerator.accumulate(model):
            optimizer.zero_grad()
            loss = model(batch)
            accelerator.backward(loss)
            optimizer.step()
    """
    assert "zero-grad-in-accumulate" in ids(("train.py", text))
    after = text.replace("            optimizer.zero_grad()\n", "").replace(
        "            optimizer.step()\n", "            optimizer.step()\n            optimizer.zero_grad()\n")
    assert "zero-grad-in-accumulate" not in ids(("train.py", after))
    model_zero = after.replace("            optimizer.zero_grad()\n", "            model.zero_grad()\n")
    assert "zero-grad-in-accumulate" in ids(("train.py", model_zero))


def test_device_ids_from_a_global_rank_attribute():
    """deepmd-pytorch: `self.rank = dist.get_rank() if dist.is_initialized() else 0`, then DDP(device_ids=[self.rank])."""
    text = """
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel as DDP
    class Trainer:
        def __init__(self, model):
            self.rank = dist.get_rank() if dist.is_initialized() else 0
            self.wrapper = DDP(model, device_ids=[self.rank], output_device=self.rank)
    """
    assert "device-from-global-rank" in ids(("training.py", text))
    local = text.replace("self.wrapper = DDP", "self.rank = int(os.environ['LOCAL_RANK'])\n            self.wrapper = DDP")
    assert "device-from-global-rank" not in ids(("training.py", local))


def test_init_process_group_given_the_rank_beside_a_global_rank_parameter():
    """bergson: `def worker(global_rank, rank, world_size)` passing `rank` to init_process_group."""
    text = """
    import torch.distributed as dist
    def worker(global_rank: int, rank: int, world_size: int):
        dist.init_process_group("nccl", rank=rank, world_size=world_size)
    """
    assert "local-rank-as-global-rank" in ids(("cli.py", text))
    assert "local-rank-as-global-rank" not in ids(("cli.py", text.replace("rank=rank,", "rank=global_rank,")))


def test_a_zero3_gather_under_a_rank_gate():
    """VideoLLaMA2: deepspeed.zero.GatheredParameters (a collective) reached from `if local_rank == 0:`."""
    text = """
    from deepspeed import zero
    def maybe_zero_3(param):
        with zero.GatheredParameters([param]):
            return param.data.cpu().clone()
    def save(self, model, local_rank):
        if local_rank == 0:
            state = {k: maybe_zero_3(v) for k, v in model.named_parameters()}
            torch.save(state, "adapter.bin")
    """
    assert "rank-gated-collective" in ids(("trainer.py", text))
    every = text.replace("        if local_rank == 0:\n            state = {k: maybe_zero_3(v) for k, v in model."
                         "named_parameters()}\n", "        state = {k: maybe_zero_3(v) for k, v in model."
                         "named_parameters()}\n        if local_rank == 0:\n")
    assert "rank-gated-collective" not in ids(("trainer.py", every))


def test_a_tensorboard_writer_made_by_a_trainer_on_every_process():
    """F5-TTS: the Trainer's __init__ builds its Accelerator and a SummaryWriter with no rank gate."""
    text = """
    from accelerate import Accelerator
    from torch.utils.tensorboard import SummaryWriter
    class Trainer:
        def __init__(self, model, run_name):
            self.accelerator = Accelerator()
            self.writer = SummaryWriter(log_dir=f"runs/{run_name}")
    """
    assert "write-on-every-rank" in ids(("trainer.py", text))
    gated = text.replace("            self.writer = SummaryWriter", "            if self.accelerator.is_main_process:\n"
                         "                self.writer = SummaryWriter")
    assert "write-on-every-rank" not in ids(("trainer.py", gated))


def test_a_monai_bundle_binds_the_gpu_by_the_global_rank():
    bundle = json.dumps({"device": "$torch.device(f'cuda:{dist.get_rank()}')",
                         "network": {"_target_": "torch.nn.parallel.DistributedDataParallel",
                                     "module": "$@network_def.to(@device)", "device_ids": ["@device"]},
                         "initialize": ["$import torch.distributed as dist",
                                        "$torch.cuda.set_device(@device)"]}, indent=1)
    assert "device-from-global-rank" in ids(("multi_gpu_train.json", bundle))
    local = bundle.replace("dist.get_rank()", "os.environ['LOCAL_RANK']")
    assert "device-from-global-rank" not in ids(("multi_gpu_train.json", local))
    # a bundle with an optimizer item is not a DeepSpeed config
    train = json.dumps({"optimizer": {"_target_": "torch.optim.Adam", "lr": 1e-4}, "device": "$torch.device('cuda:0')"})
    assert not [i for i in ids(("train.json", train)) if i.startswith("ds-")]


def test_dcp_load_into_a_fresh_optimizers_state_dict():
    """KempnerForge: dcp.load({'optimizer': self.optimizer.state_dict()}) on a new optimizer restores no moments."""
    text = """
    import torch.distributed.checkpoint as dcp
    class Manager:
        def load(self, path):
            state = {}
            state["model"] = self.model.state_dict()
            state["optimizer"] = self.optimizer.state_dict()
            dcp.load(state, checkpoint_id=path)
            self.optimizer.load_state_dict(state["optimizer"])
    """
    assert "optimizer-state-not-restored" in ids(("manager.py", text))
    fixed = text.replace('state["optimizer"] = self.optimizer.state_dict()',
                         'state["optimizer"] = get_optimizer_state_dict(self.model, self.optimizer)')
    assert "optimizer-state-not-restored" not in ids(("manager.py", fixed))


def test_a_restored_attribute_rebuilt_after_the_restore():
    """ai2cm/ace: restore_checkpoint sets self._ema, then __init__ builds a fresh one after it."""
    text = """
    import torch
    class Trainer:
        def __init__(self, path, modules):
            self.modules = modules
            if path:
                self.restore_checkpoint(path)
            self._ema = build_ema(modules)
        def restore_checkpoint(self, path):
            _restore_checkpoint(self, path)
    def _restore_checkpoint(trainer, path):
        ckpt = torch.load(path, map_location="cpu")
        trainer._ema = EMATracker.from_state(ckpt["ema"])
    """
    assert "state-overwritten-after-load" in ids(("trainer.py", text))
    before = text.replace("            if path:\n                self.restore_checkpoint(path)\n"
                          "            self._ema = build_ema(modules)\n",
                          "            self._ema = build_ema(modules)\n            if path:\n"
                          "                self.restore_checkpoint(path)\n")
    assert "state-overwritten-after-load" not in ids(("trainer.py", before))


def test_a_checkpoint_state_without_the_scheduler():
    """lightly-train: TrainTaskState(model, optimizer, step) saved and loaded by Fabric; the scheduler is left out."""
    text = """
    def train(fabric, model, config):
        optimizer, scheduler = model.get_optimizer(total_steps=config.steps)
        state = TrainTaskState(train_model=model, optimizer=optimizer, step=-1)
        if config.resume:
            helpers.load_checkpoint(fabric=fabric, state=state)
        for step in range(config.steps):
            optimizer.step()
            scheduler.step()
            helpers.save_checkpoint(fabric=fabric, state=state)
    """
    assert "scheduler-not-checkpointed" in ids(("train_task.py", text))
    kept = text.replace("optimizer=optimizer, step=-1", "optimizer=optimizer, scheduler=scheduler, step=-1")
    assert "scheduler-not-checkpointed" not in ids(("train_task.py", kept))


def test_a_checkpoint_without_the_scheduler_in_a_file_that_never_resumes_or_resets_last_epoch():
    """yolov5: the classify script saves {'model', 'optimizer', ...} for inference and never resumes; train.py puts
    the scheduler back with `scheduler.last_epoch = start_epoch - 1`."""
    text = """
    import torch
    def train(model, optimizer, epochs):
        scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_lambda=lambda e: 1.0)
        for epoch in range(epochs):
            scheduler.step()
            ckpt = {"epoch": epoch, "model": model.state_dict(), "optimizer": optimizer.state_dict()}
            torch.save(ckpt, "last.pt")
        print("model = torch.hub.load('ultralytics/yolov5', 'custom', 'last.pt')")
    """
    assert "scheduler-not-checkpointed" not in ids(("train.py", text))
    resumes = text.replace("    def train(model, optimizer, epochs):\n",
                           "    def train(model, optimizer, epochs, resume=None):\n"
                           "        if resume:\n            optimizer.load_state_dict(torch.load(resume)['optimizer'])\n")
    assert "scheduler-not-checkpointed" in ids(("train.py", resumes))
    rebuilt = resumes.replace("        for epoch in range(epochs):\n",
                              "        scheduler.last_epoch = 0\n        for epoch in range(epochs):\n")
    assert "scheduler-not-checkpointed" not in ids(("train.py", rebuilt))
