"""The chapters stay clean (issue 28): no outputs, no run metadata, the kernelspec the lab really uses.

Fails when a tracked notebook carries an output, an execution count, metadata a kernel or papermill
adds, or a kernelspec other than the installed ``python3`` kernel's (JupyterLab rewrites a foreign
one when the kernel starts, so the chapter shows unsaved changes before any cell runs).  Clean with
``python -m helpers.nbclean --fix``.
"""

from __future__ import annotations

import shutil

import nbformat
import pytest

from helpers import nbclean

CHAPTERS = nbclean.tracked_notebooks()


def test_the_chapters_are_tracked():
    assert len(CHAPTERS) >= 9 and all(p.suffix == ".ipynb" for p in CHAPTERS)


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.name for p in CHAPTERS])
def test_tracked_chapter_is_clean(path):
    assert nbclean.problems(path) == []


def test_the_kernelspec_is_the_installed_kernels():
    spec = nbclean.lab_kernelspec()
    assert spec["name"] == "python3" and spec["language"] == "python" and spec["display_name"]
    with pytest.raises(ValueError, match="^kernel='no-such-kernel'"):
        nbclean.lab_kernelspec("no-such-kernel")


def test_outputs_counts_run_metadata_and_a_foreign_kernelspec_are_found_and_fixed(tmp_path):
    path = tmp_path / CHAPTERS[0].name
    shutil.copy(CHAPTERS[0], path)
    nb = nbformat.read(path, as_version=4)
    code = next(i for i, c in enumerate(nb.cells) if c.cell_type == "code")
    nb.cells[code].outputs = [nbformat.v4.new_output("stream", text="train.py []\n")]
    nb.cells[code].execution_count = 3
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    nbformat.write(nb, path)
    found = nbclean.problems(path)
    assert f"cell {code} (id {nb.cells[code].id}): 1 output(s), execution_count 3" in found[0]
    assert "kernelspec" in found[1] and "Python 3 (ipykernel)" in found[1]
    assert nbclean.fix(path) and nbclean.problems(path) == [] and not nbclean.fix(path)

    nb = nbformat.read(path, as_version=4)  # what papermill adds; a language_info of another Python
    nb.metadata["papermill"] = {"duration": 1.0}
    nbformat.write(nb, path)
    assert nbclean.problems(path) == [f"{path.name}: run metadata nbstripout removes: papermill"]
    nb.metadata.pop("papermill")
    nb.metadata["language_info"] = {"name": "python"}  # what the chapters had: JupyterLab filled it in on open
    nbformat.write(nb, path)
    assert "language_info {'name': 'python'} is not the kernel's" in nbclean.problems(path)[0]
    nbclean.fix(path)
    assert nbclean.problems(path) == [] and nbformat.read(path, as_version=4).cells[code].id == nb.cells[code].id

