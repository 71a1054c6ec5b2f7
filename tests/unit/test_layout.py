"""The map of the code stays true: the README's Layout names every module of ``helpers/`` once, names nothing
that does not exist, and the names removed by the one-home refactor do not come back (issue 21)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from support import ROOT

HELPERS = ROOT / "helpers"
# Names retired by the refactors (old name -> today's); a notebook or module using one teaches a name that is gone.
RETIRED = {
    r"\bhelpers\.diagnostics\b|from helpers import [^\n]*\bdiagnostics\b": "helpers.allocation.local / .grades",
    r"\ballocation_grades\b": "helpers.allocation.grades",
    r"\bdiagnose_params\b": "helpers.allocation.params",
    r"\blaunchers\.LAUNCHERS\b": "launchers.DECISION_LAUNCHERS",
    r"\blaunchers\.rank_records\b": "jobs.parse_records",
    r"\blaunch_traps\.(RDZV|parse_env)\b": "launchers.RDZV_FORMS / envvars.parse_lines",
    r"\b(ddp_math|memory)\.format_table\b": "report.markdown_table / memory.format_estimate",
    r"\bmemory\.main\(": 'cli.main(["estimate-memory", ...])',
    r"\bhostinfo\.host_checks\b": "allocation.local.host_checks",
    r"\bpreflight\.(NodeCheck|select_ifaces|faulty_nodes|local_runner|srun_runner)\b": "checks / ifnames / slurm clients",
    r"\breport\.(Check|worst|STATUSES)\b": "helpers.checks",
    r"\bFinding\.make\b|\bto_lint_dict\b": "lint.findings.finding / checks.to_json",
    r"\blab\.runner\(\)": "the lab itself (a SlurmClient)",
}


def _modules() -> set[str]:
    """Every module and package of helpers/ by its short name (scenarios' scripts and private modules excepted)."""
    names = set()
    for path in HELPERS.rglob("*.py"):
        rel = path.relative_to(HELPERS)
        if rel.parts[0] in ("scenarios", "data") or path.name == "__init__.py" and len(rel.parts) == 1:
            continue
        if path.name == "__init__.py":
            names.add(rel.parts[-2])
        elif rel.parts[0] != "_fr_site":
            names.add(path.stem)
    names |= {p.name for p in HELPERS.iterdir() if p.is_dir() and (p / "__init__.py").exists() or p.name == "_fr_site"}
    return names - {"__pycache__"}


def _layout() -> str:
    text = (ROOT / "README.md").read_text()
    start = text.index("## Layout")
    return text[start:text.index("\n## ", start + 1)]


def test_readme_layout_names_every_module():
    layout = _layout()
    missing = sorted(m for m in _modules() if not re.search(rf"(?<![\w.]){re.escape(m)}(?![\w])", layout))
    assert missing == [], f"README.md Layout misses: {missing}"


def test_readme_layout_names_nothing_that_is_gone():
    words = set(re.findall(r"\b[a-z_][a-z0-9_]+(?=/| \(|,|$| )", _layout().split("```")[1], flags=re.M))
    packages_and_files = _modules() | {p.stem for p in HELPERS.rglob("*.py")} | {"helpers", "notebooks", "configs", "docs",
                                                                                 "tests", "benchmarks", "scenarios", "data"}
    candidates = {w for w in words if (HELPERS / f"{w}.py").exists() or w in packages_and_files}
    assert candidates, "the Layout block lists no module at all"
    for line in _layout().split("```")[1].splitlines():
        head = line.strip().split(" ")[0]
        if line.startswith("  ") and head.endswith("/"):
            assert (HELPERS / head.rstrip("/")).is_dir(), f"README.md Layout names {head}, which is not a folder of helpers/"


FILES = [p for p in [*HELPERS.rglob("*.py"), *(ROOT / "notebooks").glob("*.ipynb"), *(ROOT / "tests").rglob("*.py"),
                     *(ROOT / "benchmarks").glob("*.py")] if p.name != "test_layout.py"]


@pytest.fixture(scope="module")
def texts() -> dict[Path, str]:
    """Every file the retired names are searched in, read once for all the patterns."""
    return {p: p.read_text(errors="replace") for p in FILES}


@pytest.mark.parametrize("pattern", RETIRED, ids=list(RETIRED.values()))
def test_retired_names_stay_retired(pattern, texts):
    hits = [f"{p.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}" for p, text in texts.items()
            for m in re.finditer(pattern, text)]
    assert hits == [], f"{pattern!r} is retired (use {RETIRED[pattern]}): {hits[:8]}"


def test_test_file_names_are_unique_across_layer_folders():
    """pytest imports each test file by its base name (rootdir-relative, no ``__init__.py`` in tests/), so two
    layers holding ``test_x.py`` stop collection of the whole suite ("import file mismatch"): CI failed so once."""
    seen: dict[str, Path] = {}
    clashes = []
    for path in sorted((ROOT / "tests").rglob("test_*.py")):
        if path.name in seen:
            clashes.append(f"{seen[path.name].relative_to(ROOT)} and {path.relative_to(ROOT)}")
        seen.setdefault(path.name, path)
    assert not clashes, "test files share a base name: " + "; ".join(clashes)
