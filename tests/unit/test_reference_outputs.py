"""helpers.reference_outputs: nbval's comparison of a fresh chapter run against the committed references.

On small notebooks made here (no kernel): a strict cell that prints the same thing after sanitizing passes, a
changed one fails with nbval's report, a stale reference and a skipped cell are named; then the committed
chapters, tags and references are checked for consistency (every ignored cell says why, every reference
matches the chapter's current code).
"""

from __future__ import annotations

import re
from pathlib import Path

import nbformat
import pytest

from helpers import reference_outputs as ro

ROOT = Path(__file__).resolve().parents[2]


def _nb(*cells: tuple[str, str, list[str]], params: dict | None = None) -> nbformat.NotebookNode:
    """A notebook of code cells ``(source, stdout, tags)``, as papermill leaves it (run, with outputs)."""
    nb = nbformat.v4.new_notebook()
    nb.cells.append(nbformat.v4.new_code_cell("NPROC = 2\nLAB_NAME = 'ch'", metadata={"tags": ["parameters"]}))
    for i, (source, out, tags) in enumerate(cells):
        cell = nbformat.v4.new_code_cell(source, metadata={"tags": tags}, execution_count=i + 1)
        cell.id = f"c{i}"
        if out:
            cell.outputs = [nbformat.v4.new_output("stream", name="stdout", text=out)]
        nb.cells.append(cell)
    nb.metadata["papermill"] = {"parameters": params or {}}
    return nb


CELLS = [("print(plan)", "ZeRO-2: 1.50 GB per rank\n", []),
         ("run()", "verdict after 12.0 s: rank(s) [1] diverged\n", []),
         ("measure()", "median step 6.42 ms\n", [ro.IGNORE_TAG]),
         ("gpu()", "[SKIP tier-gpu] needs >= 1 CUDA GPU(s); this machine has 0\n", ["tier-gpu"]),
         ("quiet()", "", [])]


@pytest.fixture()
def recorded(tmp_path: Path) -> tuple[Path, Path]:
    """A chapter run and the reference recorded from it: (executed copy, reference folder)."""
    executed = tmp_path / "02_demo.ipynb"
    nbformat.write(_nb(*CELLS), executed)
    refs = tmp_path / "refs"
    ro.update(executed, refs)
    return executed, refs


def _rerun(tmp_path: Path, cells: list, params: dict | None = None) -> Path:
    path = tmp_path / "rerun" / "02_demo.ipynb"
    path.parent.mkdir(exist_ok=True)
    nbformat.write(_nb(*cells, params=params), path)
    return path


def test_strict_cells_are_the_untagged_code_cells(recorded):
    executed, refs = recorded
    doc = ro.json.loads(ro.reference_path(executed, refs).read_text())
    assert [c["id"] for c in doc["cells"]] == ["c0", "c1", "c4"]  # not the ignored, tier or parameters cells
    assert doc["cells"][1]["outputs"][0]["text"] == "verdict after <T>: rank(s) [1] diverged\n"  # stored sanitized


def test_same_output_after_sanitizing_reproduces(recorded, tmp_path):
    executed, refs = recorded
    cells = [CELLS[0], ("run()", "verdict after 31.7 s: rank(s) [1] diverged\n", []), ("measure()", "median 9 ms\n", [ro.IGNORE_TAG]),
             CELLS[3], CELLS[4]]
    result = ro.compare(_rerun(tmp_path, cells), refs)
    assert result.ok and (result.compared, result.with_output) == (3, 2), result.render()
    assert "3 cells compared strictly (2 with output), 0 differ" in result.render()


def test_a_changed_output_fails_with_nbvals_report(recorded, tmp_path):
    executed, refs = recorded
    cells = [("print(plan)", "ZeRO-2: 1.75 GB per rank\n", []), *CELLS[1:4], ("quiet()", "a warning\n", [])]
    result = ro.compare(_rerun(tmp_path, cells), refs)
    assert not result.ok and [cid for cid, _ in result.differ] == ["c0", "c4"]
    report = dict(result.differ)
    assert "Reference output from ipynb file" in report["c0"] and "1.50 GB" in report["c0"] and "1.75 GB" in report["c0"]
    assert "Unexpected output fields" in report["c4"]


def test_stale_reference_skip_line_and_other_parameters_are_named(recorded, tmp_path):
    executed, refs = recorded
    cells = [("print(plan())", "ZeRO-2: 1.50 GB per rank\n", []),
             ("run()", "[SKIP lab] USE_LAB = False (parameter)\n", []), *CELLS[2:]]
    result = ro.compare(_rerun(tmp_path, cells), refs)
    assert [cid for cid, _ in result.differ] == ["c0"] and "stale reference" in result.differ[0][1]
    assert result.not_compared == [["c1", "[SKIP lab] USE_LAB = False (parameter)"]]
    other = ro.compare(_rerun(tmp_path, CELLS, params={"LAB_NAME": "x", "NPROC": 2}), refs)
    assert other.ok and other.skipped == "run with parameters {'LAB_NAME': 'x'}, the reference with {}"
    assert ro.compare(tmp_path / "rerun" / "99_none.ipynb", refs).skipped.startswith("no reference 99_none.json")


def test_without_nbval_the_chapter_is_not_compared_and_says_why(recorded, tmp_path, monkeypatch):
    """A GPU node's image has no nbval (seen on the H200 machine): make gpu-check's chapter run is not failed for it."""
    import importlib.util

    executed, refs = recorded
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "nbval" else real(name, *a))
    result = ro.compare(_rerun(tmp_path, CELLS), refs)
    assert result.ok and result.skipped.startswith("nbval is not installed")


def test_sanitizer_masks_what_changes_by_nature_only():
    shim = ro._Cell(ro.sanitize_patterns(host="vm-7"))
    masked = shim.sanitize(
        f"I1125 16:05:21.123456 24697 {ROOT}/.venv/lib/python3.11/site-packages/torch/x.py:942] up on vm-7 "
        "--log-dir=build/jobs/d8-bug-20261125-160723-21736-0/torchrun --master-port=48151 127.0.0.1:41233 "
        "at 0x7f3a2b4c5d60 pid 4242 took 15.2 s, [rank1]: RuntimeError: boom; world_size=2 RANK=1 LOCAL_RANK=0; "
        "/opt/conda/envs/rb/bin/python3.11: can't open file")
    assert masked == ("<LOG>] up on <HOST> --log-dir=build/jobs/d8-bug-<STAMP>/torchrun --master-port=<PORT> "
                      "127.0.0.1:<PORT> at <ADDR> pid <PID> took <T>, [rank<N>]: RuntimeError: boom; "
                      "world_size=2 RANK=1 LOCAL_RANK=0; <PYTHON>: can't open file")
    assert shim.sanitize(masked) == masked  # idempotent: references are stored sanitized
    together = ("[a] launching 1 command(s), timeout 90 s: torchrun x.py\n[b] launching 1 command(s), timeout 90 s: torchrun y.py\n"
                "job b: HUNG in 16.1 s (launcher exit [0])\njob a: ok in 3.0 s (launcher exit [0])\nverdict: rank 1\n")
    assert shim.sanitize(together) == "<job runner line>\n" * 4 + "verdict: rank 1\n"  # the jobs' order is a race


# ------------------------------------------------------------------ the committed chapters and references

def _chapters() -> list[Path]:
    return sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def test_every_ignored_cell_says_why_and_nbval_skip_is_never_used():
    for path in _chapters():
        for cell in nbformat.read(path, as_version=4).cells:
            tags = cell.metadata.get("tags", [])
            assert "nbval-skip" not in tags, f"{path.name} {cell.get('id')}: nbval-skip would hide a cell from the comparison"
            reason = cell.metadata.get(ro.REASON_KEY, "")
            assert (ro.IGNORE_TAG in tags) == bool(reason), (
                f"{path.name} cell {cell.get('id')}: the tag {ro.IGNORE_TAG} and the metadata {ro.REASON_KEY} go together")
            assert not reason or len(reason) > 20, (path.name, cell.get("id"), reason)


def test_every_chapter_has_a_current_reference():
    """The references match the chapters' code: a chapter edited without recording its reference again fails here first."""
    for path in _chapters():
        ref = ro.reference_path(path)
        assert ref.is_file(), f"{ref} missing: run the chapter's test, then python -m helpers.reference_outputs update build/executed/{path.name}"
        doc = ro.json.loads(ref.read_text())
        strict = {c.get("id"): ro.source_sha(c) for c in nbformat.read(path, as_version=4).cells if ro.is_strict(c)}
        recorded = {c["id"]: c["source_sha1"] for c in doc["cells"]}
        assert recorded == strict, (
            f"{ref.name} is stale for cells {sorted(set(recorded.items()) ^ set(strict.items()))}: rerun "
            f"pytest tests/notebooks/test_{path.stem}.py, then python -m helpers.reference_outputs update build/executed/{path.name}")


def test_the_sanitize_file_is_nbvals_format_and_compiles():
    from nbval.plugin import get_sanitize_patterns

    text = ro.SANITIZE_FILE.read_text()
    pairs = get_sanitize_patterns(text)
    assert len(pairs) == len(re.findall(r"^regex: ", text, flags=re.M)) >= 10
    for regex, _ in pairs:
        re.compile(regex)
