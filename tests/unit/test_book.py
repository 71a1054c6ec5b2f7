"""helpers.book (what a chapter page shows) and helpers.provenance (where and when a chapter ran), on notebooks made here.

The build itself, the link check and the pages in Chromium are tests/browser/test_book_pages.py (after the notebook layer).
"""

from __future__ import annotations

import platform
from pathlib import Path

import nbformat
import pytest

from helpers import book, provenance

RAN = {"runner": "pytest tests/notebooks/test_02_ddp.py", "host": "vm-1", "tier": "cpu", "gpus": 0, "gpu_name": "",
       "slurm_nodes": 1, "torch": "2.13.0+cpu", "cuda": "", "python": "3.11.2", "cpus": 2, "platform": "Linux",
       "started": "2026-11-25T16:07:20.312982+00:00", "seconds": 106.3}


def _executed() -> nbformat.NotebookNode:
    nb = nbformat.v4.new_notebook()
    nb.cells = [nbformat.v4.new_markdown_cell("# 02 - DDP\n\nWhat you will learn."),
                nbformat.v4.new_code_cell("print('torch')", outputs=[nbformat.v4.new_output("stream", text="torch 2.13\n")]),
                nbformat.v4.new_code_cell("if tiers.have('multigpu'):\n    run()", metadata={"tags": ["tier-multigpu"]},
                                          outputs=[nbformat.v4.new_output(
                                              "stream", text="[SKIP tier-multigpu] needs >= 2 CUDA GPU(s); this machine has 0\n")]),
                nbformat.v4.new_code_cell("long()", outputs=[nbformat.v4.new_output("stream", text="line\n" * 40)]),
                nbformat.v4.new_code_cell("builder.widget", outputs=[nbformat.v4.new_output(
                    "display_data", data={book.WIDGET_MIME: {"model_id": "abc"}, "text/plain": "HBox(...)"})])]
    nb.metadata["papermill"] = {"start_time": RAN["started"], "duration": 106.3}
    nb.metadata["widgets"] = {"state": "..."}
    nb.metadata[provenance.KEY] = {"ran": RAN}
    return nb


def test_a_page_says_where_it_ran_marks_skipped_cells_folds_long_outputs_and_drops_widgets():
    page = book.prepare(_executed())
    kinds = [c.cell_type for c in page.cells]
    assert kinds == ["markdown", "markdown", "code", "markdown", "code", "code", "code", "markdown"]
    where = page.cells[1].source
    assert "Where and when this chapter ran" in where and "run-provenance" in where
    for needle in ("`pytest tests/notebooks/test_02_ddp.py`", "host `vm-1`", "tier **cpu**", "no GPU",
                   "torch **2.13.0+cpu**", "2026-11-25 16:07 UTC", "106 s", "1 cell(s) did not run there"):
        assert needle in where, needle
    note, skipped = page.cells[3], page.cells[4]
    assert "Did not run here" in note.source and "needs >= 2 CUDA GPU(s)" in note.source and "`tier-multigpu`" in note.source
    assert skipped.metadata["tags"] == ["tier-multigpu", "not-run-here"]
    assert page.cells[5].metadata["tags"] == ["hide-output"] and page.cells[2].metadata["tags"] == []
    assert page.cells[6].outputs == [] and "[the command builder](../docs/command-builder.md)" in page.cells[7].source
    assert "widgets" not in page.metadata
    assert _executed().cells[4].outputs, "prepare() must not change the executed notebook it was given"


def test_a_copy_without_a_run_record_says_so_with_papermills_time():
    nb = _executed()
    del nb.metadata[provenance.KEY]
    where = book.prepare(nb).cells[1].source
    assert "the machine was not recorded" in where and "2026-11-25 16:07 UTC" in where


def test_stale_cells_are_the_code_cells_that_changed_since_the_run():
    source, ran = _executed(), _executed()
    for i, cell in enumerate(source.cells):
        cell.id = ran.cells[i].id = f"c{i}"
    ran.cells.insert(1, nbformat.v4.new_code_cell("LAB_NAME = 'x'", metadata={"tags": ["injected-parameters"]}))
    assert book.stale_cells(source, ran) == []
    source.cells[3].source = "longer()"
    assert book.stale_cells(source, ran) == ["c3"]


def test_missing_executed_chapters_are_named_with_their_test(tmp_path: Path):
    with pytest.raises(FileNotFoundError, match=r"02_ddp.ipynb \(pytest tests/notebooks/test_02_ddp.py\)"):
        book.executed_copies(tmp_path)


def test_the_index_is_the_readme_with_hidden_tables_of_contents():
    text = book.index_text("# runbook\n\nHello.\n", ["notebooks/00_a", "notebooks/01_b"], ["docs/book"])
    assert text.startswith("# runbook\n\nHello.\n")
    assert "```{toctree}\n:hidden:\n:caption: Chapters\n\nnotebooks/00_a\nnotebooks/01_b\n```" in text
    assert ":caption: Tools and references\n\ndocs/book\n```" in text


def test_stamp_records_this_machine_and_the_runner(tmp_path: Path):
    path = tmp_path / "02_ddp.ipynb"
    nbformat.write(_executed(), path)
    record = provenance.stamp(path, "python -m helpers.course")
    assert record["runner"] == "python -m helpers.course" and record["host"] == platform.node()
    assert record["tier"] in ("cpu", "gpu", "multigpu", "multinode") and record["torch"].startswith("2.")
    assert record["started"] == RAN["started"] and record["seconds"] == 106.3
    assert provenance.read(nbformat.read(path, as_version=4)) == record
