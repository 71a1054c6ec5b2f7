"""Chapter 03 executes end to end on CPU; every reproduction asserts on its own run inside the notebook."""

from __future__ import annotations

import time

import nbformat
from conftest import execute_notebook


def test_chapter_03_hangs(no_leftovers):
    t0 = time.monotonic()
    out = execute_notebook("03_hangs.ipynb")
    nb = nbformat.read(out, as_version=4)
    errors = [o for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", [])
              if o.get("output_type") == "error"]
    assert not errors
    text = "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.get("outputs", []))
    assert "rank(s) [0] diverged" in text and "rank(s) [2] diverged" in text
    assert "[SKIP tier-multigpu]" in text
    print(f"chapter 03: {time.monotonic() - t0:.0f} s")
