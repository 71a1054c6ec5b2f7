"""The rule changes made for the fifth blind set, each on a small inline violation and its look-alike.

The blind files themselves are not used here (they score the linter; these pin the contracts): every snippet is
written from the API's documented behaviour that the rule cites (accelerate's prepare / unwrap_model / get_tracker,
DeepSpeed's engine.step, transformers' Trainer.save_model, Accelerator.save_state under DDP, collectives on every rank).
"""

from __future__ import annotations

import textwrap

from helpers.lint import lint_texts


def found(*files: tuple[str, str]) -> dict[str, list[str]]:
    """``{rule: [status, ...]}`` of the findings on ``files`` linted together."""
    out: dict[str, list[str]] = {}
    for f in lint_texts([(p, textwrap.dedent(t)) for p, t in files]):
        out.setdefault(f.id, []).append(f.status)
    return out


PREPARED = """
from accelerate import Accelerator
from diffusers import UNet2DConditionModel
from peft.utils import get_peft_model_state_dict
accelerator = Accelerator()
unet = UNet2DConditionModel.from_pretrained("m")
unet, opt = accelerator.prepare(unet, opt)
for batch in loader:
    {read}
"""


def test_an_attribute_of_a_prepared_hf_model_is_read_through_the_ddp_wrapper():
    assert found(("t.py", PREPARED.format(read="c = unet.config.in_channels")))["ddp-wrapper-attribute"] == ["FAIL"]
    assert found(("t.py", PREPARED.format(read="sd = get_peft_model_state_dict(unet)")))["ddp-wrapper-attribute"] == [
        "FAIL"]
    for fine in ("c = accelerator.unwrap_model(unet).config.in_channels", "unet.train()",
                 "sd = get_peft_model_state_dict(accelerator.unwrap_model(unet))", "p = unet.module.config"):
        assert "ddp-wrapper-attribute" not in found(("t.py", PREPARED.format(read=fine))), fine
    rebound = PREPARED.replace("for batch", "unet = accelerator.unwrap_model(unet)\nfor batch")
    assert "ddp-wrapper-attribute" not in found(("t.py", rebound.format(read="c = unet.config")))


def test_deleting_checkpoints_on_every_rank_and_its_gated_form():
    src = """
    import os, shutil
    from accelerate import Accelerator
    accelerator = Accelerator()
    for step in range(10):
        {prune}
        if accelerator.is_main_process:
            accelerator.save_state(f"ckpt-{{step}}")
    """
    every = found(("t.py", src.format(prune="shutil.rmtree(os.path.join(out, old))")))
    assert every["write-on-every-rank"] == ["WARN"]
    gated = src.format(prune="if accelerator.is_main_process:\n            shutil.rmtree(os.path.join(out, old))")
    assert "write-on-every-rank" not in found(("t.py", gated))
    assert "write-on-every-rank" not in found(("t.py", src.format(prune="shutil.rmtree(tmp_dir)")))  # per process


def test_save_model_of_a_project_module_or_the_hf_trainer_is_not_a_write_race():
    """MAE's misc.save_model gates inside (save_on_master); Trainer.save_model must run on every process."""
    src = """
    import torch.distributed as dist
    from util import misc
    dist.init_process_group("nccl")
    if dist.get_rank() == 0:
        torch.save(model.state_dict(), "m.pt")
    {call}
    """
    assert "write-on-every-rank" not in found(("t.py", src.format(call="misc.save_model(args=args, model=model)")))
    assert "write-on-every-rank" not in found(("t.py", src.format(call="trainer.save_model(out)")))
    assert found(("t.py", src.format(call="model.save_model(out)")))["write-on-every-rank"] == ["WARN"]


def test_save_state_under_a_main_process_gate_matters_only_where_deepspeed_or_fsdp_can_run():
    src = "from accelerate import Accelerator\naccelerator = Accelerator()\n{extra}\nif accelerator.is_main_process:\n" \
          "    accelerator.save_state(p)\n"
    # no DeepSpeed/FSDP named: fine under DDP, said as info (the accelerate config may still pick DeepSpeed: blind6)
    assert found(("t.py", src.format(extra="")))["rank-gated-collective"] == ["INFO"]
    assert found(("t.py", src.format(extra="plugin = AcceleratorState().deepspeed_plugin")))["rank-gated-collective"] == [
        "FAIL"]


def test_an_early_return_on_this_ranks_empty_tensor_before_a_gather():
    src = """
    def mask(self, x):
        kept = x[x > 0]
        if {test}:
            return None
        n = self.accelerator.gather(torch.tensor([kept.numel()]))
        return n
    """
    assert found(("t.py", src.format(test="kept.numel() == 0")))["rank-early-exit-collective"] == ["WARN"]
    assert found(("t.py", src.format(test="len(kept) == 0")))["rank-early-exit-collective"] == ["WARN"]
    assert "rank-early-exit-collective" not in found(("t.py", src.format(test="x is None")))
    assert "rank-early-exit-collective" not in found(("t.py", src.format(test="kept.numel() > 0")))


def test_tracker_reads_need_the_main_process():
    src = """
    from accelerate import Accelerator
    accelerator = Accelerator(log_with="wandb")
    accelerator.init_trackers("p")
    tracker = accelerator.get_tracker("wandb")
    {read}
    """
    assert found(("t.py", src.format(read="print(tracker.run.url)")))["main-process-object-every-rank"] == ["FAIL"]
    assert "main-process-object-every-rank" not in found(("t.py", src.format(read="tracker.log({'loss': 1.0})")))
    gated = "if accelerator.is_main_process:\n        print(tracker.run.url)"
    assert "main-process-object-every-rank" not in found(("t.py", src.format(read=gated)))


def test_a_deepspeed_step_behind_the_scripts_own_accumulation_counter():
    src = """
    import deepspeed
    class T:
        def setup(self):
            self.model, self.optimizer, _, self.scheduler = deepspeed.initialize(model=m, config=c)
        def train(self):
            for i, b in enumerate(dl):
                loss = self.model(b)
                self.model.backward(loss)
                {step}
    """
    manual = "if (i + 1) % accumulation_steps == 0:\n                    self.model.step()"
    assert found(("t.py", src.format(step=manual)))["ds-manual-accumulation"] == ["WARN"]
    assert "ds-manual-accumulation" not in found(("t.py", src.format(step="self.model.step()")))


def test_the_global_rank_handed_to_another_files_device_parameter():
    """yolov5's torch_distributed_zero_first(local_rank) uses its argument in barrier(device_ids=[...])."""
    utils = ("torch_utils.py", """
    import torch.distributed as dist
    def zero_first(local_rank):
        if local_rank not in (-1, 0):
            dist.barrier(device_ids=[local_rank])
    """)
    train = ("train.py", """
    import os
    from torch_utils import zero_first
    RANK = int(os.getenv("RANK", -1))
    LOCAL_RANK = int(os.getenv("LOCAL_RANK", -1))
    with zero_first({arg}):
        data = load()
    """)
    bad = found(utils, (train[0], train[1].format(arg="RANK")))
    assert bad["device-from-global-rank"] == ["FAIL"]
    assert "device-from-global-rank" not in found(utils, (train[0], train[1].format(arg="LOCAL_RANK")))
