"""runbook lint rules tuned on the fifteenth blind set (tests/data/lint/blind15), each with its violation and its look-alike."""

from __future__ import annotations

import textwrap

from helpers.lint import lint_texts


def ids(text: str, name: str = "train.py") -> list[str]:
    return [f.id for f in lint_texts([(name, textwrap.dedent(text))]) if f.status != "OK"]


def test_device_string_from_the_global_rank_on_one_path():
    text = """
    import os
    import torch
    def get_device_name():
        if torch.distributed.is_initialized():
            local_rank = torch.distributed.get_rank()
        else:
            local_rank = int(os.environ.get("LOCAL_RANK", 0))
        return f"cuda:{local_rank}"
    """
    assert "device-from-global-rank" in ids(text)
    assert "device-from-global-rank" not in ids(text.replace("torch.distributed.get_rank()",
                                                             "torch.distributed.get_node_local_rank()"))


def test_raw_backward_on_the_non_deepspeed_path_is_not_a_deepspeed_finding():
    text = """
    import deepspeed
    engine, optimizer, _, _ = deepspeed.initialize(model=net)
    def backward(model, loss, engine_kind):
        if engine_kind == "deepspeed":
            model.backward(loss)
        else:
            loss.backward()
    """
    assert "deepspeed-raw-backward" not in ids(text)
    plain = """
    import deepspeed
    engine, optimizer, _, _ = deepspeed.initialize(model=net)
    def backward(model, loss):
        loss.backward()
    """
    assert "deepspeed-raw-backward" in ids(plain)


def test_tracker_checkpoint_upload_is_not_a_collective():
    text = """
    def save(self):
        if self.rank == 0:
            self.wandb_logger.save_checkpoint(self.file_name, "last")
    """
    assert "rank-gated-collective" not in ids(text)


def test_same_constant_signal_file_per_node_is_not_a_job_wide_write():
    text = """
    import os
    import torch.distributed as dist
    def signal(path):
        rank = dist.get_rank()
        if int(os.environ["LOCAL_RANK"]) == 0:
            with open(path, "w") as f:
                f.write("local rank zero done")
    """
    assert "local-rank-as-global-rank" not in ids(text)
    assert "local-rank-as-global-rank" in ids(text.replace('f.write("local rank zero done")', "f.write(str(rank))"))
