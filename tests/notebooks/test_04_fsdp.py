"""Chapter 04 (FSDP, seed D12-D15) executes end to end on CPU; every reproduction asserts on its own run inside the notebook."""

from __future__ import annotations

import time

from support import assert_outputs_reproduce, execute_notebook, notebook_outputs


def test_chapter_04_fsdp(no_leftovers):
    t0 = time.monotonic()
    out = execute_notebook("04_fsdp.ipynb")
    errors, text = notebook_outputs(out)
    assert not errors, errors
    assert_outputs_reproduce(out)
    assert "FSDP needs a non-CPU accelerator device" in text
    assert "size mismatch for 0.fc1.weight" in text
    assert "max abs diff 0.0," in text
    assert "out of bounds for storage of size 0" in text
    assert "[SKIP tier-multigpu]" in text
    print(f"chapter 04: {time.monotonic() - t0:.0f} s")
