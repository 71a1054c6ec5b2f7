"""The nbstripout git filter that ``make setup`` installs (helpers/nbclean.py): real git, real nbstripout processes.

Here, not in tests/unit: ``git add`` runs the filter, a Python process that imports nbformat (seconds).
"""

from __future__ import annotations

import nbformat
import pytest

from helpers import nbclean

CHAPTERS = nbclean.tracked_notebooks()


def test_the_git_filter_keeps_outputs_out_of_the_index(tmp_path):
    """``make setup`` registers nbstripout as the clone's clean filter: a notebook saved with outputs is staged without."""
    import subprocess

    subprocess.run(["git", "init", "-q", str(tmp_path)], check=True, timeout=30)
    assert "clean filter" in nbclean.install_git_filter(tmp_path)
    nb = nbformat.read(CHAPTERS[0], as_version=4)
    code = next(c for c in nb.cells if c.cell_type == "code")
    code.outputs, code.execution_count = [nbformat.v4.new_output("stream", text="ran here\n")], 4
    nbformat.write(nb, tmp_path / "x.ipynb")
    subprocess.run(["git", "-C", str(tmp_path), "add", "x.ipynb"], check=True, timeout=60)
    staged = subprocess.run(["git", "-C", str(tmp_path), "show", ":x.ipynb"], capture_output=True, text=True,
                            check=True, timeout=30).stdout
    assert "ran here" not in staged and '"execution_count": 4' not in staged and code.id in staged
    with pytest.raises(ValueError, match="not a git checkout"):
        nbclean.install_git_filter(tmp_path / "nowhere")
