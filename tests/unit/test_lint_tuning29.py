"""runbook lint changes made on the twenty-ninth blind set (tests/data/lint/blind29), each with its violation and
its look-alike."""

from __future__ import annotations

import textwrap

from helpers.lint import lint_texts


def ids(*files: tuple[str, str]) -> list[str]:
    return [f.id for f in lint_texts([(n, textwrap.dedent(t)) for n, t in files]) if f.status != "OK"]


def test_an_unguarded_barrier_in_a_file_that_guards_its_other_distributed_work():
    """PELICAN's trainer: `if get_world_size() > 1: sampler.set_epoch(epoch)`, and an unconditional
    torch.distributed.barrier() that a one-process run reaches with no process group."""
    src = """
    import torch
    from .utils import get_world_size

    class Trainer:
        def train(self, loader):
            for epoch in range(10):
                if get_world_size() > 1:
                    loader.sampler.set_epoch(epoch)
                self.train_epoch(loader)
                {barrier}

    Trainer().train(make_loader())
    """
    assert "collective-before-init" in ids(("trainer.py", src.replace("{barrier}", "torch.distributed.barrier()")))
    guarded = src.replace("{barrier}", "if get_world_size() > 1:\n                    torch.distributed.barrier()")
    assert "collective-before-init" not in ids(("trainer.py", guarded))
    unguarded_file = src.replace("                if get_world_size() > 1:\n                    "
                                 "loader.sampler.set_epoch(epoch)\n", "").replace("{barrier}",
                                                                                  "torch.distributed.barrier()")
    assert "collective-before-init" not in ids(("trainer.py", unguarded_file))  # no sign of a one-process run
