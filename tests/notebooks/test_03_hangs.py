"""Chapter 03 executes end to end on CPU; every reproduction asserts on its own run inside the notebook."""

from __future__ import annotations

import shutil
import time

from support import ROOT, assert_outputs_reproduce, execute_notebook, notebook_outputs


def test_chapter_03_hangs(no_leftovers):
    t0 = time.monotonic()
    # the read race needs no checkpoint left by an earlier run (rank 1 would read it instead of failing)
    for stale in ("ckpt_race", "ckpt_safe"):
        shutil.rmtree(ROOT / "build" / "executed" / stale, ignore_errors=True)
    out = execute_notebook("03_hangs.ipynb")
    errors, text = notebook_outputs(out)
    assert not errors, errors
    assert_outputs_reproduce(out)
    assert "rank(s) [0] diverged" in text and "rank(s) [2] diverged" in text
    assert "[SKIP tier-multigpu]" in text
    print(f"chapter 03: {time.monotonic() - t0:.0f} s")
