"""Chapter 02 (DDP, seed D8-D11) executes end to end on CPU; every reproduction asserts on its own run inside the notebook."""

from __future__ import annotations

import time

from support import assert_outputs_reproduce, execute_notebook, notebook_outputs


def test_chapter_02_ddp(no_leftovers):
    t0 = time.monotonic()
    out = execute_notebook("02_ddp.ipynb")
    errors, text = notebook_outputs(out)
    assert not errors, errors
    assert_outputs_reproduce(out)
    assert "Expected to have finished reduction in the prior iteration" in text
    assert "Timed out waiting 5000ms for recv operation to complete" in text
    assert "SyncBatchNorm layers only work with GPU modules" in text
    assert "[SKIP tier-multigpu]" in text
    print(f"chapter 02: {time.monotonic() - t0:.0f} s")
