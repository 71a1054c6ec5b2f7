"""The course's book (issue 27): built from the chapters this session executed, read in Debian's Chromium.

``helpers.book.build`` (what ``make book`` runs) stages the executed chapters, the README and docs/ and runs
Sphinx with ``-W -n``: a warning or an unresolved cross-reference fails the build, so the build itself is
the cross-reference check.  Then LinkChecker walks the site (no broken internal link), and Playwright
drives one Chromium over the site served on 127.0.0.1: the index lists the nine chapters; every chapter
page shows where and when it ran, one output block per code cell that printed something in the executed
notebook, every figure it drew (loaded, not a broken image), a "did not run here" note per skipped cell,
and its long outputs folded; the site's search finds a term from chapter 06.

These tests run last in a session (``conftest.py``): in ``make test`` the notebook layer has just
written ``build/executed/``.  Run alone, without executed chapters (or with copies older than the
chapters), they skip saying so; in a session that executed the notebooks, a missing copy fails.
Skipped, with the reason, when ``/usr/bin/chromium`` is missing (the build and link check still run).
"""

from __future__ import annotations

import functools
import http.server
import re
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import nbformat
import pytest

from helpers import book, hostinfo

pytestmark = pytest.mark.last
CHROMIUM = "/usr/bin/chromium"
SEARCH_TERM = "setpci"  # chapter 06, MN1's fabric-manager section: only that chapter uses the word
CHROMIUM_ARGS = ["--headless", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--no-first-run", "--no-sandbox"]


@pytest.fixture(scope="module")
def site(request) -> Path:
    """The book, built from ``build/executed/`` into ``build/book/``; its html folder."""
    ran_notebooks = any("tests/notebooks/" in item.nodeid for item in request.session.items)
    t0 = time.monotonic()
    try:
        index = book.build()
    except (FileNotFoundError, ValueError) as exc:
        if ran_notebooks:
            raise
        pytest.skip(f"no current executed chapters to build the book from ({exc}); run make test-notebooks first")
    print(f"book built in {time.monotonic() - t0:.1f} s", file=sys.stderr)
    return index.parent


def _executed(chapter: Path) -> nbformat.NotebookNode:
    return nbformat.read(str(book.EXECUTED / chapter.name), as_version=4)


def _expected(nb: nbformat.NotebookNode) -> dict[str, int]:
    """What the chapter page must show, counted in the executed notebook."""
    code = [c for c in nb.cells if c.cell_type == "code"]
    shown = [c for c in code if any(book.WIDGET_MIME not in o.get("data", {}) for o in c.get("outputs", []))]
    texts = ["".join(o.get("text", "") for o in c.get("outputs", [])) for c in code]
    return {"outputs": len(shown),
            "figures": sum("image/png" in o.get("data", {}) for c in code for o in c.get("outputs", [])),
            "not_run": sum(bool(re.search(r"\[SKIP [\w-]+\]", t)) for t in texts),
            "folded": sum(book.output_lines(c) > book.FOLD_LINES for c in shown)}


def test_the_site_has_no_broken_internal_link(site):
    t0 = time.monotonic()
    broken = book.broken_links(site)
    print(f"LinkChecker: {time.monotonic() - t0:.1f} s", file=sys.stderr)
    assert broken == [], "\n".join(broken)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    """``python -m http.server``'s handler without a log line per request."""

    def log_message(self, format: str, *args: object) -> None:  # noqa: A002 - the base class's signature
        pass


@pytest.fixture(scope="module")
def server(site) -> Iterator[str]:
    """The site on ``http://127.0.0.1:<free port>`` (``python -m http.server``'s handler), stopped at the end."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", hostinfo.free_port()), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()
        thread.join(timeout=10)


def test_every_chapter_page_shows_its_run_in_chromium(server, tmp_path):
    if not Path(CHROMIUM).exists():
        pytest.skip(f"{CHROMIUM} is missing: install Debian's chromium (make setup does it as root: SYSTEM_TOOLS)")
    from playwright.sync_api import sync_playwright

    chapters = book.chapters()
    t0 = time.monotonic()
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=CHROMIUM, headless=True, args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            errors: list[str] = []
            page.on("pageerror", lambda exc: errors.append(str(exc)))
            page.goto(f"{server}/index.html")
            assert "distributed-runbook" in page.title()
            toc = page.locator(".bd-sidebar-primary a.reference.internal[href^='notebooks/']")
            assert toc.count() == len(chapters), toc.all_text_contents()
            for chapter in chapters:
                want = _expected(_executed(chapter))
                page.goto(f"{server}/notebooks/{chapter.stem}.html")
                where = page.locator(".run-provenance").first.text_content() or ""
                assert "Where and when this chapter ran" in where and "torch" in where.lower(), (chapter.name, where)
                assert page.locator(".cell_output").count() == want["outputs"], chapter.name
                figures = page.locator(".cell_output img")
                assert figures.count() == want["figures"], chapter.name
                loaded = page.evaluate("[...document.querySelectorAll('.cell_output img')].map(i => i.complete && i.naturalWidth)")
                assert all(w and w > 100 for w in loaded), (chapter.name, loaded)
                assert page.locator("div.not-run-here").count() == want["not_run"], chapter.name
                assert page.locator(".cell.tag_not-run-here").count() == want["not_run"], chapter.name
                assert page.locator(".cell details.hide").count() == want["folded"], chapter.name
            page.goto(f"{server}/search.html?q={SEARCH_TERM}")
            hits = page.locator("#search-results a[href*='06_multinode_network']")
            hits.first.wait_for(timeout=30_000)
            assert errors == [], errors
            page.screenshot(path=str(tmp_path / "search.png"))
        finally:
            browser.close()
    print(f"browser part: {len(chapters) + 2} pages in {time.monotonic() - t0:.1f} s", file=sys.stderr)


def test_a_broken_cross_reference_or_anchor_fails_the_build(tmp_path):
    """The book's own Sphinx settings on a two-page site: links to a missing section fail the build, each named (one
    Sphinx run: the resolving link beside them is not reported)."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "index.md").write_text("# T\n\n[real](other.md#real) [gone](other.md#gone) [missing](#nowhere)\n\n"
                                  "```{toctree}\n:hidden:\nother\n```\n")
    (src / "other.md").write_text("# Other\n\n## Real\n")
    with pytest.raises(RuntimeError) as failed:
        book.sphinx_build(src, tmp_path / "html", tmp_path / "doctrees", jobs=1)
    report = str(failed.value)
    assert "local id not found in doc 'other': 'gone'" in report and "target not found: 'nowhere'" in report, report
    assert "'real'" not in report, report


def test_the_search_term_is_chapter_06s():
    """The term the browser test searches for is in chapter 06's committed text (a changed chapter says so here)."""
    nb = nbformat.read(str(book.ROOT / "notebooks" / "06_multinode_network.ipynb"), as_version=4)
    assert any(SEARCH_TERM in c.source for c in nb.cells if c.cell_type == "markdown")
