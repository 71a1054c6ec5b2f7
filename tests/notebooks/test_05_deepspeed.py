"""Chapter 05 executes end to end on CPU; every reproduction asserts on its own run inside the notebook."""

from __future__ import annotations

import time

from support import assert_outputs_reproduce, execute_notebook, notebook_outputs


def test_chapter_05_deepspeed(no_leftovers):
    t0 = time.monotonic()
    out = execute_notebook("05_deepspeed.ipynb")
    wall = time.monotonic() - t0
    errors, text = notebook_outputs(out)
    assert not errors, errors
    assert_outputs_reproduce(out)
    assert "zero stage 1 requires an optimizer" in text and "largest gap: stage" in text
    assert text.count("[SKIP tier-multigpu]") == 3  # the GPU cells said why they did not run
    print(f"chapter 05: {wall:.0f} s")


def test_pitfall_strict_mode_really_crashes(no_leftovers, tmp_path):
    """Without the notebook's catch-and-continue, a bug case ends every rank with the same error (exit 1)."""
    from support import SCENARIOS

    from helpers import jobs

    r = jobs.run_job(SCENARIOS / "ds_pitfalls.py", ["--cases", "no-optimizer", "--modes", "bug", "--strict",
                     "--backend", "gloo", "--out", str(tmp_path / "x.json")], nproc=2, timeout_s=120,
                     name="t05-strict")
    assert not r.ok and r.failed_ranks == [0, 1]
    assert all("AssertionError: zero stage 1 requires an optimizer" in r.ranks[k].traceback for k in (0, 1))
    assert not (tmp_path / "x.json").exists()
