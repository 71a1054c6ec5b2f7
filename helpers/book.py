"""The course as a book: a static site of the README, the chapters with the outputs of their real execution, docs/.

``make book`` (``python -m helpers.book``) runs after ``make test``: it takes the notebooks the test suite
executed (``build/executed/NN_*.ipynb``: papermill's copies, stamped by ``helpers.provenance``), never
executes anything, stages a Sphinx source tree in ``build/book/src`` and builds ``build/book/html`` with
myst-nb and sphinx-book-theme (``book/conf.py`` says why this stack and not Jupyter Book 2).

The staging (:func:`prepare`) changes only how a chapter is shown, never what it printed:

* under the title, where and when it ran (runner, host, hardware tier, GPUs, torch, CUDA, Python, date,
  duration: :mod:`helpers.provenance`'s record) and how many cells did not run there;
* before each cell that printed ``[SKIP ...]`` (a ``tier-gpu`` / ``tier-multigpu`` cell on a CPU machine,
  a lab cell without the lab), a "did not run here" note with the printed reason; the cell gets the tag
  ``not-run-here``;
* an output longer than :data:`FOLD_LINES` lines is folded (myst-nb's ``hide-output``: a ``<details>``);
* an ipywidgets output (chapter 01's command builder) cannot work without a kernel: it is removed, and a
  note after the cell says so and links the builder's page; the widget state is dropped.

The README becomes ``index.md`` with a hidden table of contents (chapters, then the docs pages).
Sphinx runs with ``-W -n`` (every warning, an unresolved cross-reference included, fails the build);
:func:`broken_links` runs LinkChecker over the built site (internal links and anchors; no network).

Command line::

    python -m helpers.book [--executed build/executed] [--out build/book] [--no-link-check]
"""

from __future__ import annotations

import argparse
import copy
import shutil
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
CONF_DIR = ROOT / "book"
EXECUTED = ROOT / "build" / "executed"
OUT = ROOT / "build" / "book"
FOLD_LINES = 30
"""Outputs with more lines than this are folded on the page (the longest chapter outputs are ~45 lines)."""
BUILD_TIMEOUT_S = 600.0
LINKCHECK_TIMEOUT_S = 300.0
WIDGET_MIME = "application/vnd.jupyter.widget-view+json"


def chapters() -> list[Path]:
    """The committed chapters, ``notebooks/NN_*.ipynb``, in order."""
    return sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb"))


def test_file(chapter: str) -> str:
    """The test that executes ``chapter`` (``02_ddp.ipynb`` -> ``tests/notebooks/test_02_ddp.py``)."""
    return f"tests/notebooks/test_{Path(chapter).stem}.py"


def executed_copies(executed_dir: Path = EXECUTED) -> list[Path]:
    """The executed copy of every chapter in ``executed_dir``, in chapter order.

    Raises:
        FileNotFoundError: copies are missing; names each and the test that writes it.
    """
    found = [Path(executed_dir) / c.name for c in chapters()]
    missing = [p for p in found if not p.is_file()]
    if missing:
        how = "; ".join(f"{p.name} (pytest {test_file(p.name)})" for p in missing)
        raise FileNotFoundError(f"executed chapters missing in {executed_dir}: {how}; `make test` writes them all")
    return found


def stale_cells(source: Any, executed: Any) -> list[str]:
    """Ids of the code cells whose source differs between the committed chapter and its executed copy.

    papermill's injected-parameters cell is not compared (it is the run's, not the chapter's).  A cell
    added to or removed from the chapter since the run counts as stale.
    """
    def code(nb: Any) -> dict[str, str]:
        return {c.get("id"): c.source for c in nb.cells
                if c.cell_type == "code" and "injected-parameters" not in c.metadata.get("tags", [])}
    have, ran = code(source), code(executed)
    return sorted(cid for cid in have.keys() | ran.keys() if have.get(cid) != ran.get(cid))


def output_lines(cell: Any) -> int:
    """Lines of output of a code cell (streams, markdown or plain-text displays): more than :data:`FOLD_LINES` are folded."""
    lines = 0
    for o in cell.get("outputs", []):
        text = o.get("text") or o.get("data", {}).get("text/markdown") or o.get("data", {}).get("text/plain") or ""
        lines += len("".join(text).splitlines())
    return lines


def _skips(cell: Any) -> list[tuple[str, str]]:
    """The ``(kind, reason)`` of each distinct ``[SKIP ...]`` line the cell printed."""
    from helpers import tiers

    text = "".join(o.get("text", "") for o in cell.get("outputs", []) if o.get("output_type") == "stream")
    found: list[tuple[str, str]] = []
    for hit in tiers.SKIP_LINE.findall(text):
        if hit not in found:
            found.append(hit)
    return found


def provenance_text(ran: dict[str, Any], papermill: dict[str, Any], not_run: int) -> str:
    """The "where and when it ran" note of a chapter page (MyST).

    Args:
        ran: the :mod:`helpers.provenance` record (``{}`` for a copy executed by hand: then only papermill's
            start time and duration are known, and the note says the machine was not recorded).
        papermill: the executed copy's ``metadata.papermill``.
        not_run: how many cells printed a ``[SKIP ...]`` line.
    """
    started = str(ran.get("started") or papermill.get("start_time") or "?")[:16].replace("T", " ")
    seconds = float(ran.get("seconds") or papermill.get("duration") or 0.0)
    lines = [":::{admonition} Where and when this chapter ran", ":class: note run-provenance"]
    if ran:
        gpus = f"{ran['gpus']} x {ran['gpu_name']}" if ran.get("gpus") else "no GPU"
        cuda = f", CUDA {ran['cuda']}" if ran.get("cuda") else ""
        lines.append(f"Executed by `{ran.get('runner', '?')}` on host `{ran.get('host', '?')}`: "
                     f"hardware tier **{ran.get('tier', '?')}** ({gpus}, {ran.get('cpus', '?')} CPUs, "
                     f"{ran.get('slurm_nodes', 1)} node(s)), torch **{ran.get('torch', '?')}**{cuda}, "
                     f"Python {ran.get('python', '?')}, started **{started} UTC**, {seconds:.0f} s.")
    else:
        lines.append(f"Executed with papermill, started **{started} UTC**, {seconds:.0f} s; the machine was not recorded "
                     "(a copy executed by hand, not by the test suite or `helpers.course`): the Setup cell's output "
                     "shows its versions.")
    lines.append("Every output below is that run's own.")
    if not_run:
        lines.append(f"**{not_run} cell(s) did not run there** (they need hardware or a lab that machine lacked): "
                     "each is marked *Did not run here* with the reason it printed.")
    lines.append(":::")
    return "\n".join(lines)


def _not_run_note(skips: list[tuple[str, str]]) -> str:
    reasons = "; ".join(f"`{kind}`: {why}" for kind, why in skips)
    return (":::{admonition} Did not run here\n:class: warning not-run-here\n"
            f"The run behind this page skipped the cell below ({reasons}). "
            "Its output is the skip line; the code is what runs where the hardware exists.\n:::")


_WIDGET_NOTE = (":::{admonition} An interactive widget\n:class: note widget-note\n"
                "The cell above displayed the command builder, a widget that needs a running kernel: "
                "run the cell in `make lab` to use it. "
                "What it does, with a screenshot: [the command builder](../docs/command-builder.md).\n:::")


def prepare(nb: Any) -> Any:
    """A copy of the executed chapter ``nb`` as the book shows it (module docstring: provenance, skips, folds, widgets).

    Args:
        nb: the executed notebook (nbformat node, version 4).

    Returns:
        The new notebook node; outputs are untouched except widget outputs (removed, a note follows the cell).
    """
    import nbformat

    from helpers import provenance

    nb = copy.deepcopy(nb)
    nb.metadata.pop("widgets", None)
    cells = []
    not_run = 0
    for cell in nb.cells:
        if cell.cell_type == "code":
            skips = _skips(cell)
            tags = list(cell.metadata.get("tags", []))
            if skips:
                not_run += 1
                cells.append(nbformat.v4.new_markdown_cell(_not_run_note(skips)))
                tags.append("not-run-here")
            if output_lines(cell) > FOLD_LINES:
                tags.append("hide-output")
            widget = any(WIDGET_MIME in o.get("data", {}) for o in cell.get("outputs", []))
            cell.outputs = [o for o in cell.get("outputs", []) if WIDGET_MIME not in o.get("data", {})]
            cell.metadata["tags"] = tags
            cells.append(cell)
            if widget:
                cells.append(nbformat.v4.new_markdown_cell(_WIDGET_NOTE))
            continue
        cells.append(cell)
    title = next((i for i, c in enumerate(cells) if c.cell_type == "markdown"), -1)
    cells.insert(title + 1, nbformat.v4.new_markdown_cell(provenance_text(provenance.read(nb), nb.metadata.get("papermill", {}), not_run)))
    for cell in cells:
        cell.pop("id", None)  # nbformat gives the inserted cells random ids; ids are not shown
    nb.cells = cells
    nb.nbformat_minor = 4
    return nb


def index_text(readme: str, chapter_docs: Sequence[str], doc_pages: Sequence[str]) -> str:
    """The README as the book's ``index.md``, with the hidden tables of contents Sphinx needs for navigation."""
    def toc(caption: str, docs: Sequence[str]) -> str:
        return "\n".join(["", "```{toctree}", ":hidden:", f":caption: {caption}", "", *docs, "```", ""])
    return readme.rstrip() + "\n" + toc("Chapters", chapter_docs) + toc("Tools and references", doc_pages)


def _write_if_changed(path: Path, text: str) -> None:
    """Leave an unchanged staged file alone, so that Sphinx's incremental build skips it."""
    if not (path.exists() and path.read_text() == text):
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def stage(src: Path, executed_dir: Path = EXECUTED, allow_stale: bool = False) -> list[Path]:
    """Write the Sphinx sources into ``src``: ``index.md`` (README), ``docs/`` (pages and images), ``notebooks/``.

    Args:
        src: the staging folder (files no longer staged are removed from it).
        executed_dir: where the executed chapters are.
        allow_stale: stage a chapter whose executed copy ran other code than the committed chapter.

    Returns:
        The staged chapter files.

    Raises:
        FileNotFoundError: an executed chapter is missing (:func:`executed_copies`).
        ValueError: an executed copy is stale (names the chapter, the cells and the test to rerun).
    """
    import nbformat

    src = Path(src)
    copies = executed_copies(executed_dir)
    staged: set[Path] = set()
    out = []
    stale = []
    for chapter, executed in zip(chapters(), copies):
        nb = nbformat.read(str(executed), as_version=4)
        changed = stale_cells(nbformat.read(str(chapter), as_version=4), nb)
        if changed and not allow_stale:
            stale.append(f"{chapter.name} (cells {', '.join(changed[:5])}{' ...' if len(changed) > 5 else ''}: "
                         f"rerun pytest {test_file(chapter.name)})")
            continue
        target = src / "notebooks" / chapter.name
        _write_if_changed(target, nbformat.writes(prepare(nb)))
        staged.add(target)
        out.append(target)
    if stale:
        raise ValueError("executed copies older than the chapters: " + "; ".join(stale))
    pages = sorted((ROOT / "docs").glob("*.md"))
    for page in pages:
        _write_if_changed(src / "docs" / page.name, page.read_text())
        staged.add(src / "docs" / page.name)
    for image in sorted((ROOT / "docs" / "img").glob("*")):
        target = src / "docs" / "img" / image.name
        if not (target.exists() and target.read_bytes() == image.read_bytes()):
            target.parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(image, target)
        staged.add(target)
    index = src / "index.md"
    _write_if_changed(index, index_text((ROOT / "README.md").read_text(), [f"notebooks/{p.stem}" for p in out],
                                        [f"docs/{p.stem}" for p in pages]))
    staged.add(index)
    for path in sorted(src.rglob("*")):
        if path.is_file() and path not in staged:
            path.unlink()
    return out


def build(out: Path = OUT, executed_dir: Path = EXECUTED, allow_stale: bool = False, jobs: int = 2) -> Path:
    """Stage and build the book; return ``<out>/html/index.html``.

    Args:
        out: the book's folder (``src/``, ``doctrees/``, ``html/`` inside).
        executed_dir: where the executed chapters are.
        allow_stale: as :func:`stage`.
        jobs: Sphinx's parallel workers (``-j``).

    Raises:
        FileNotFoundError, ValueError: from :func:`stage`.
        RuntimeError: Sphinx failed (a warning, a broken cross-reference, a timeout); carries Sphinx's output.
    """
    out = Path(out)
    stage(out / "src", executed_dir, allow_stale)
    sphinx_build(out / "src", out / "html", out / "doctrees", jobs)
    return out / "html" / "index.html"


def sphinx_build(src: Path, html: Path, doctrees: Path, jobs: int = 2) -> None:
    """Sphinx with ``book/conf.py`` on ``src`` into ``html``: ``-W -n``, so any warning (an unresolved
    cross-reference or ``#anchor`` included) fails it; bounded by :data:`BUILD_TIMEOUT_S`.

    Raises:
        RuntimeError: Sphinx failed or timed out; carries its output (the warnings name file and line).
    """
    from helpers import procs

    argv = [sys.executable, "-m", "sphinx", "-b", "html", "-W", "--keep-going", "-n", "-q", "-j", str(jobs),
            "-c", str(CONF_DIR), "-d", str(doctrees), str(src), str(html)]
    proc = procs.run_bounded(argv, BUILD_TIMEOUT_S, cwd=ROOT)
    if proc.returncode != 0:
        raise RuntimeError(f"sphinx-build failed (exit {proc.returncode}):\n{proc.stderr[-6000:]}{proc.stdout[-2000:]}")


def broken_links(html_dir: Path = OUT / "html") -> list[str]:
    """Broken internal links of the built site, found by LinkChecker (``[]`` when none).

    LinkChecker (https://linkchecker.github.io/linkchecker/) follows every link and asset from ``index.html``
    inside the site (``file://``); external URLs are listed but not fetched (no network here).  Anchors
    are not checked here: its ``AnchorCheck`` plugin rechecks the page once per ``#anchor`` (3 min for this
    site on 2 cores, against 15 s without); the anchors the pages link to are checked when the book is
    built instead (Sphinx ``-n -W``: MyST reports a ``#section`` that no heading has as a warning).

    Returns:
        One line per broken link (``url in parent page: result``).

    Raises:
        RuntimeError: LinkChecker did not run (not installed, timed out); carries its output.
    """
    import csv
    import io

    from helpers import procs

    html_dir = Path(html_dir).resolve()
    config = html_dir.parent / "linkcheckerrc"
    config.write_text("[filtering]\ncheckextern=0\n")
    argv = [sys.executable, "-m", "linkcheck", "--config", str(config), "--no-status", "--output", "csv",
            "--no-warnings", "--threads", "4", (html_dir / "index.html").as_uri()]
    proc = procs.run_bounded(argv, LINKCHECK_TIMEOUT_S, cwd=html_dir)
    if proc.returncode not in (0, 1):
        raise RuntimeError(f"linkchecker failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    rows = [line for line in proc.stdout.splitlines() if line and not line.startswith("#")]
    broken = []
    for row in csv.DictReader(io.StringIO("\n".join(rows)), delimiter=";"):
        if row.get("valid", "True") in ("False", "false", "0"):
            broken.append(f"{row.get('urlname')} in {row.get('parentname')}: {row.get('result')}")
    return broken


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m helpers.book``: build the book, check its links; 0 built and no broken link, 1 otherwise, 2 bad input."""
    p = argparse.ArgumentParser(prog="python -m helpers.book", description=__doc__.split("\n\n")[0])
    p.add_argument("--executed", default=str(EXECUTED), help="executed chapters (default build/executed)")
    p.add_argument("--out", default=str(OUT), help="the book's folder (default build/book; the site in html/)")
    p.add_argument("--allow-stale", action="store_true", help="build from executed copies older than the chapters")
    p.add_argument("--no-link-check", action="store_true", help="skip LinkChecker")
    args = p.parse_args(argv)
    t0 = time.monotonic()
    try:
        index = build(Path(args.out), Path(args.executed), args.allow_stale)
    except (FileNotFoundError, ValueError) as exc:
        print(f"book: {exc}", file=sys.stderr)
        return 2
    except RuntimeError as exc:
        print(f"book: {exc}", file=sys.stderr)
        return 1
    print(f"book: built {index} in {time.monotonic() - t0:.1f} s")
    if not args.no_link_check:
        t1 = time.monotonic()
        broken = broken_links(index.parent)
        for line in broken:
            print(f"broken link: {line}", file=sys.stderr)
        print(f"book: {len(broken)} broken internal link(s) ({time.monotonic() - t1:.1f} s)")
        if broken:
            return 1
    print(f"book: open {index} in a browser, or: python -m http.server -d {index.parent} 8000 (then http://127.0.0.1:8000)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
