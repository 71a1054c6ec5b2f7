"""`make gpu-check` (helpers/gpu_check.py, issue 22) on this CPU machine: it exits cleanly, says there is no GPU and
skips every step with that reason; nothing pretends a GPU result."""

from __future__ import annotations

from helpers import gpu_check


def test_tagged_chapters_are_the_ones_with_gpu_cells():
    names = [p.stem for p in gpu_check.tagged_chapters(("gpu",))]
    assert names == ["06_multinode_network"]  # the one chapter with a tier-gpu cell today
    assert len(gpu_check.tagged_chapters(("gpu", "multigpu"))) >= 7
