"""Chapter 07 (elastic restart, seed MN5-MN6) executes end to end on CPU; every reproduction asserts on its own run inside the notebook."""

from __future__ import annotations

import time

from support import assert_outputs_reproduce, execute_notebook, notebook_outputs


def test_chapter_07_elastic_restart(no_leftovers):
    t0 = time.monotonic()
    out = execute_notebook("07_elastic_restart.ipynb")
    errors, text = notebook_outputs(out)
    assert not errors, errors
    assert_outputs_reproduce(out)
    assert "RuntimeError: injected crash at step 19 on rank 1" in text
    assert "Worker group FAILED. 1/1 attempts left; will restart worker group" in text
    assert "TORCHELASTIC_RESTART_COUNT=1: steps 0..23 (24 steps)" in text  # the bug: restarted from step 0
    assert "TORCHELASTIC_RESTART_COUNT=1: steps 16..23 (8 steps)" in text  # the fix: resumed at the checkpoint
    assert "EQUAL: 4 entries identical bit for bit (max abs diff 0.0)" in text
    assert "already holds gloo address keys ['default_pg/0//cpu//0/0', 'default_pg/0//cpu//0/1']" in text
    assert "wait timeout after 10000ms, keys: /torch.rendezvous.scaleup-shared.1/MASTER_ADDR" in text
    assert "Detected 1 new nodes from group_rank=0; will restart worker group" in text
    assert "[SKIP tier-multigpu]" in text
    print(f"chapter 07: {time.monotonic() - t0:.0f} s")
