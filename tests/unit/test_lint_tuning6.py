"""runbook lint rules tuned on the sixth blind set (tests/data/lint/blind6), each with its violation and its look-alike."""

from __future__ import annotations

import textwrap

from helpers.lint import lint_texts


def found(*files: tuple[str, str]) -> dict[str, list[str]]:
    """``{rule: [status, ...]}`` of the findings on ``files`` linted together."""
    out: dict[str, list[str]] = {}
    for f in lint_texts([(p, textwrap.dedent(t)) for p, t in files]):
        out.setdefault(f.id, []).append(f.status)
    return out


LOCAL_GATED_SAVE = """
import os, torch
class Trainer:
    def __init__(self):
        self.local_rank = int(os.environ["LOCAL_RANK"])
        self.global_rank = int(os.environ["RANK"])
    def _save_snapshot(self, epoch):
        torch.save({"EPOCHS_RUN": epoch}, self.snapshot_path)
    def train(self):
        for epoch in range(3):
            if self.{gate} == 0 and epoch % 2 == 0:
                self._save_snapshot(epoch)
"""


def test_a_job_wide_write_gated_by_the_local_rank():
    """pytorch/examples#1357: multinode.py and minGPT's trainer saved under local_rank == 0 (one writer per node)."""
    assert found(("m.py", LOCAL_GATED_SAVE.replace("{gate}", "local_rank")))["local-rank-as-global-rank"] == ["WARN"]
    assert "local-rank-as-global-rank" not in found(("m.py", LOCAL_GATED_SAVE.replace("{gate}", "global_rank")))
    # a file that never reads the global rank: the local gate may be meant (each node writes its own disk)
    only_local = LOCAL_GATED_SAVE.replace('        self.global_rank = int(os.environ["RANK"])\n', "")
    assert "local-rank-as-global-rank" not in found(("m.py", only_local.replace("{gate}", "local_rank")))


SHARDED = """
from accelerate import Accelerator, FullyShardedDataParallelPlugin
from transformers import AutoModelForCausalLM
model = AutoModelForCausalLM.from_pretrained("m")
accelerator = Accelerator({plugin})
model, opt = accelerator.prepare(model, opt)
model.save_pretrained("out")
"""


def test_a_model_sharded_through_accelerates_plugin_is_not_a_ddp_wrapper():
    """FSDP/DeepSpeed wrappers forward attributes; save_pretrained gathers the shards on every rank (nd_parallel)."""
    plain = found(("t.py", SHARDED.replace("{plugin}", "")))
    assert "ddp-wrapper-attribute" in plain and "write-on-every-rank" in plain
    sharded = found(("t.py", SHARDED.replace("{plugin}", "fsdp_plugin=FullyShardedDataParallelPlugin(fsdp_version=2)")))
    assert "ddp-wrapper-attribute" not in sharded and "write-on-every-rank" not in sharded


SELF_PREPARED = """
class PPOTrainer:
    def __init__(self, model, optimizer):
        self.accelerator = Accelerator()
        self.model = model
        (self.model, self.optimizer) = self.accelerator.prepare(self.model, optimizer)
    def _save_pretrained(self, save_directory):
        {save}
"""


def test_a_model_prepared_on_self_and_saved_in_another_method():
    """huggingface/trl#157: save_pretrained on the DDP wrapper that prepare() returned in __init__."""
    bad = found(("t.py", SELF_PREPARED.replace("{save}", "self.model.save_pretrained(save_directory)")))
    assert bad["ddp-wrapper-attribute"] == ["FAIL"]
    fixed = SELF_PREPARED.replace("{save}", "self.accelerator.unwrap_model(self.model).save_pretrained(save_directory)")
    assert "ddp-wrapper-attribute" not in found(("t.py", fixed))
    assert "ddp-wrapper-attribute" not in found(("t.py", SELF_PREPARED.replace("{save}", "self.model.train()")))


def test_a_config_made_for_the_hf_integration_whose_scheduler_replaces_the_trainers():
    """axolotl#909: zero1/2/3.json carried a WarmupDecayLR with 'auto' params; the Trainer then builds no scheduler."""
    cfg = ('{"train_micro_batch_size_per_gpu": "auto", "zero_optimization": {"stage": 2}, '
           '"scheduler": {"type": "WarmupDecayLR", "params": {"warmup_min_lr": %s, "warmup_max_lr": %s}}}')
    assert found(("zero2.json", cfg % ('"auto"', '"auto"')))["ds-scheduler-overrides"] == ["INFO"]
    assert "ds-scheduler-overrides" not in found(("zero2.json", cfg % ("0", "0.001")))  # a plain DeepSpeed config
