"""Chapter 03 executes end to end on CPU; every reproduction asserts on its own run inside the notebook."""

from __future__ import annotations

import time

from support import assert_outputs_reproduce, execute_notebook, notebook_outputs


def test_chapter_03_hangs(no_leftovers):
    t0 = time.monotonic()
    out = execute_notebook("03_hangs.ipynb")
    errors, text = notebook_outputs(out)
    assert not errors, errors
    assert_outputs_reproduce(out)
    assert "rank(s) [0] diverged" in text and "rank(s) [2] diverged" in text
    assert "[SKIP tier-multigpu]" in text
    print(f"chapter 03: {time.monotonic() - t0:.0f} s")
