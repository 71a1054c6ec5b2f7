"""helpers.sources: the registry of cited ids, its rendering (docs/sources.md) and the citation finder."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from helpers import sources

ROOT = Path(__file__).resolve().parents[2]


def test_docs_sources_md_is_generated():
    text = (ROOT / "docs" / "sources.md").read_text()
    assert text == sources.render_markdown(), f"docs/sources.md is stale; regenerate: {sources.REGENERATE}"
    assert sources.REGENERATE in text


def test_seed_ids_are_all_registered():
    for sid in [f"D{i}" for i in range(1, 24)] + [f"MN{i}" for i in range(1, 7)] + ["Gilbreth 8.12", "Gilbreth 6.3"]:
        assert sid in sources.SOURCES


@pytest.mark.parametrize("src", sources.SOURCES.values(), ids=list(sources.SOURCES))
def test_each_entry_is_one_sentence_with_public_links(src):
    assert src.id and "\n" not in src.fact and src.fact.endswith(".") and len(src.fact) > 40
    assert all(re.fullmatch(r"https://[^\s<>|]+", u) for u in src.urls)
    assert "seeds/" not in src.fact and "platform-facts" not in src.fact
    if src.id.startswith(("D", "MN", "PF")):
        assert src.urls, f"{src.id}: a seed or platform fact needs a public URL"
    if src.id.startswith("PF-"):
        assert src.fact.startswith("Measured (") and re.search(r"\d+\.\d+\.\d+", src.fact.split(")")[0])


def test_cite():
    assert sources.cite("MN4") == "MN4 (https://github.com/moby/moby/issues/4378)"
    assert sources.cite("Gilbreth 5", "D21") == ("Gilbreth 5 (docs/sources.md); "
                                                  "D21 (https://github.com/Lightning-AI/pytorch-lightning/issues/19604)")
    with pytest.raises(ValueError, match=r"'MN9' is not registered"):
        sources.cite("MN9")
    with pytest.raises(ValueError, match=r"'D99'"):
        sources.cite("D1", "D99")


def test_unregistered_finds_each_form():
    text = ("seed D1. D7, MN4 and D99; gilbreth-hpc-guide §6.3, Gilbreth 2.2, PF-nope, PF-mtu-blackhole, "
            "gilbreth-hpc-guide.md section 5.3, Gilbreth guide's 8.9, MN7, 3D1 and ID12 are not ids")
    assert sources.unregistered(text) == ["D99", "Gilbreth 2.2", "MN7", "PF-nope"]
    assert sources.unregistered("no citation here") == []


def test_the_repository_cites_only_registered_ids():
    files = [*ROOT.glob("helpers/**/*.py"), *ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("configs/*"), ROOT / "README.md"]
    bad = {str(p.relative_to(ROOT)): ids for p in files if p.is_file() and (ids := sources.unregistered(p.read_text()))}
    assert bad == {}


NOT_SHIPPED = ("platform-facts", "seeds/", "gilbreth-hpc-guide", "distributed-launch.md", "multinode.md", "shared/notes",
               "architecture-review", "gpu-path-review", "STYLE.md")
"""Names of documents that do not ship with the repository: cite a registered id (docs/sources.md) instead."""


def test_nothing_points_at_documents_that_do_not_ship():
    files = [*ROOT.glob("helpers/**/*.py"), *ROOT.glob("notebooks/*.ipynb"), *ROOT.glob("configs/**/*"),
             *ROOT.glob("docs/**/*.md"), *ROOT.glob("benchmarks/**/*"), *ROOT.glob("tests/**/*.py"), *ROOT.glob("tests/*.md"),
             *(ROOT / name for name in ("README.md", "Makefile", "pyproject.toml", "environment.yml"))]
    own = Path(__file__).resolve()
    bad = {}
    for p in files:
        if not p.is_file() or p.resolve() == own or "__pycache__" in p.parts or p.suffix in (".pyc", ".png"):
            continue
        text = p.read_text(errors="replace")
        if hits := [name for name in NOT_SHIPPED if name in text]:
            bad[str(p.relative_to(ROOT))] = hits
    assert bad == {}, "cite an id of helpers.sources (docs/sources.md) instead of these files"
