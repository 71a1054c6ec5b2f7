"""What a new user meets first (issue 28): the README's start, the chapters' intros, the D7 builder cell, citations.

Each test reads the shipped text (README.md, the chapters, docs/) or runs the shipped cell: a
regression brings back the stumble it names.
"""

from __future__ import annotations

import contextlib
import io
import re
import sys
from pathlib import Path

import nbformat
import pytest

from helpers import nbclean, sources

ROOT = Path(__file__).resolve().parents[2]
README = (ROOT / "README.md").read_text()
CHAPTERS = nbclean.tracked_notebooks()


def _markdown(path: Path) -> str:
    return "\n".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "markdown")


def test_readme_starts_with_the_path_a_new_user_takes():
    start = README.index("## Start here")
    assert start < README.index("## Two commands")
    steps = README[start:README.index("## Two commands")]
    for needle in ("make setup", "source .venv/bin/activate", "runbook: command not found", "make lab",
                   "00_allocation_check.ipynb", "**Setup** and **Parameters** first"):
        assert needle in steps, needle
    first_runbook = min(m.start() for m in re.finditer(r"^runbook |`runbook [a-z]", README, re.M))
    assert README.index("source .venv/bin/activate") < first_runbook  # activation comes before any runbook example


def test_readme_tables_have_no_blank_line_inside():
    """A blank line inside a table ends it: the rows after it render as stray ``|`` text."""
    lines = README.splitlines()
    for i in range(2, len(lines)):
        if lines[i].startswith("| ") and not lines[i - 1].strip() and lines[i - 2].startswith("|"):
            pytest.fail(f"README.md line {i + 1}: a table row after a blank line: {lines[i][:80]}")


def test_readme_says_once_what_the_gilbreth_guide_is():
    assert README.count("**Gilbreth N.N**") == 1 and "no public copy" in README
    for src in sources.SOURCES.values():  # its facts about a tool point to a public page (not a job run on that cluster)
        if src.id.startswith("Gilbreth") and "(job " not in src.fact and any(w in src.fact for w in ("NCCL", "srun", "sbatch", "DeepSpeed", "ZeRO")):
            assert src.urls, src.id


CITED = re.compile(r"(?<![\w/.-])((?:tests|helpers|docs|benchmarks|notebooks)/[\w./-]+\.(?:py|md|ipynb|json|yaml|sbatch|env))\b")


@pytest.mark.parametrize("path", [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *CHAPTERS],
                         ids=lambda p: p.name)
def test_cited_files_exist_and_no_issue_numbers(path):
    """A reader can open every file a chapter or page names, and meets no 'issue 15' (an issue tracker they lack)."""
    text = _markdown(path) if path.suffix == ".ipynb" else path.read_text()
    missing = sorted({p for p in CITED.findall(text) if "<" not in p and "*" not in p and not (ROOT / p).exists()})
    assert missing == []
    text = re.sub(r"Gilbreth \d+(\.\d+)?, issue \d", "", text)  # the guide's own numbered issues (chapter 05's sections)
    assert re.findall(r"\(issue \d+\)|\bissue \d+\b(?!:)", text) == []


@pytest.mark.parametrize("path", CHAPTERS, ids=[p.name for p in CHAPTERS])
def test_chapter_intro_says_how_long_and_what_to_run_first(path):
    intro = nbformat.read(path, as_version=4).cells[0].source
    assert re.search(r"\*\*How long:\*\* about \d+(\.\d)? minutes? \(\d+(-\d+)? s measured", intro), intro[-400:]
    assert "keep the kernel busy" in intro and "Run **Setup** and **Parameters** first" in intro


def test_the_d7_builder_cell_runs_alone_and_prints_nothing():
    """Jumping to chapter 01's builder and running that one cell: no NameError, no stray ``train.py []`` line."""
    nb = nbformat.read(ROOT / "notebooks" / "01_launchers.ipynb", as_version=4)
    head = next(i for i, c in enumerate(nb.cells) if c.cell_type == "markdown" and c.source.startswith("### The command builder"))
    text, cell = nb.cells[head].source, nb.cells[head + 1]
    assert "runs on its own" in text and "**Setup** and **Parameters** run first" in text
    *body, last = cell.source.strip().splitlines()
    namespace: dict = {}
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        exec(compile("\n".join(body), "d7-cell", "exec"), namespace)  # a fresh kernel: nothing defined before
        shown = eval(last, namespace)  # the cell's last expression is what JupyterLab displays
    assert out.getvalue() == "" and type(shown).__name__ == "HBox" and "rb-builder" in shown._dom_classes


def test_chapter_01_explains_18_bytes_per_parameter_as_the_tool_counts_it():
    from helpers import memory

    text = _markdown(ROOT / "notebooks" / "01_launchers.ipynb")
    assert "18 bytes per parameter" in text and "gradient_as_bucket_view" in text and "20" in text
    psi = 10**9
    assert memory.estimate(psi, 8, "ddp").total == 18 * psi
    assert memory.estimate(psi, 8, "ddp", bucket_view=True).total == 16 * psi
    assert memory.estimate(psi, 8, "ddp", precision="fp32").total == 20 * psi  # torch.autocast keeps fp32 weights


def test_make_lab_turns_autosave_and_the_news_off(tmp_path):
    """``make lab`` must not write into a chapter unless the user saves (the browser test checks the news and a chapter
    opened unmodified in Chromium; autosave's 120 s interval is too slow to wait for there)."""
    import json

    from helpers import labserver

    argv = labserver.lab_argv(tmp_path / "nb", lab_dir=tmp_path)
    assert f"--LabApp.app_settings_dir={tmp_path.resolve() / 'app-settings'}" in argv
    assert "--LabApp.expose_app_in_browser=True" in argv  # the builder's chapter links use window.jupyterapp
    written = json.loads(labserver.write_overrides(tmp_path).read_text())
    assert written["@jupyterlab/docmanager-extension:plugin"] == {"autosave": False}
    assert written["@jupyterlab/apputils-extension:notification"]["fetchNews"] == "false"
    schema = Path(sys.prefix) / "share" / "jupyter" / "lab" / "schemas" / "@jupyterlab" / "docmanager-extension" / "plugin.json"
    if schema.exists():  # the setting names are JupyterLab's own
        assert "autosave" in json.loads(schema.read_text())["properties"]
