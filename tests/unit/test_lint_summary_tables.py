"""Each chapter's Summary table names the ``runbook lint`` rule that catches its failure mode before launch (issue 14).

The ids in the "caught before launch by" column must be rules the linter (or
:func:`helpers.launch_traps.find_traps`) can emit: :data:`helpers.lint.RULES`, itself checked here
against the ids written in the rule modules.  For a set of rows, the chapter's own buggy scenario
(helpers/scenarios/) is linted and the rule the table names must fire on the buggy line.
"""

from __future__ import annotations

import ast
import json
import re
from pathlib import Path

import pytest

from helpers.lint import RULES, UNREADABLE, lint_paths

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("0[0-8]_*.ipynb"))
COLUMN = "caught before launch by"
NONE = "—"
RULE_MODULES = sorted((ROOT / "helpers" / "lint").glob("*.py")) + [ROOT / "helpers" / f for f in (
    "launch_traps.py", "launch_parse.py", "script_traps.py")]


def _cells(line: str) -> list[str]:
    """The cells of one markdown table row (``\\|`` inside a cell is not a separator)."""
    return [c.strip() for c in re.split(r"(?<!\\)\|", line.strip().strip("|"))]


def _summary(path: Path) -> tuple[list[str], list[list[str]]]:
    """``(header, rows)`` of the table in the notebook's last ``## Summary`` markdown cell."""
    nb = json.loads(path.read_text(encoding="utf-8"))
    cells = [c for c in nb["cells"] if c["cell_type"] == "markdown" and "".join(c["source"]).startswith("## Summary")]
    assert cells, f"{path.name}: no '## Summary' markdown cell"
    lines = [ln for ln in "".join(cells[-1]["source"]).splitlines() if ln.startswith("|")]
    assert len(lines) >= 3, f"{path.name}: no table in the Summary cell"
    assert set(lines[1].replace("|", "").strip()) <= {"-", ":"}, f"{path.name}: second line is not the separator"
    return _cells(lines[0]), [_cells(ln) for ln in lines[2:]]


def _ids(cell: str) -> list[str]:
    return re.findall(r"`([^`]+)`", cell)


def _row(notebook: str, symptom: str) -> list[str]:
    header, rows = _summary(ROOT / "notebooks" / notebook)
    hits = [r for r in rows if symptom in r[0]]
    assert len(hits) == 1, f"{notebook}: {len(hits)} rows whose symptom contains {symptom!r}"
    return hits[0]


def _emitted_ids() -> set[str]:
    """Rule ids written as the first argument of ``add(...)``, ``finding(...)``, ``trap(...)`` in the rule modules."""
    ids: set[str] = set()
    for path in RULE_MODULES:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Call) or not node.args:
                continue
            name = node.func.attr if isinstance(node.func, ast.Attribute) else getattr(node.func, "id", "")
            if name not in ("add", "finding", "trap"):
                continue
            first = node.args[0]
            if isinstance(first, ast.Constant) and isinstance(first.value, str):
                ids.add(first.value)
            elif isinstance(first, ast.Name) and first.id == "UNREADABLE":
                ids.add(UNREADABLE)
    return ids


def test_the_registry_is_exactly_the_ids_the_rule_modules_emit():
    emitted = _emitted_ids()
    assert len(emitted) > 40
    assert set(RULES) == emitted, (f"missing from RULES: {sorted(emitted - set(RULES))}; "
                                   f"in RULES but never emitted: {sorted(set(RULES) - emitted)}")
    assert all(seed.strip() for seed in RULES.values())


def test_every_chapter_has_a_summary_table():
    assert [p.name[:2] for p in NOTEBOOKS] == [f"0{i}" for i in range(9)]


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_summary_table_names_real_rules(path: Path):
    header, rows = _summary(path)
    assert header[-1] == COLUMN, f"{path.name}: last column is {header[-1]!r}"
    for row in rows:
        assert len(row) == len(header), f"{path.name}: row {row[0]!r} has {len(row)} cells for {len(header)} columns"
        cell = row[-1]
        ids = _ids(cell)
        assert ids or cell == NONE or "runbook lint" in cell, f"{path.name}: {row[0]!r}: {cell!r} is neither ids nor {NONE}"
        unknown = [i for i in ids if i not in RULES]
        assert not unknown, f"{path.name}: {row[0]!r} names {unknown}, not rules runbook lint can emit"


def test_most_chapters_name_at_least_one_rule():
    named = [p.name for p in NOTEBOOKS if any(_ids(r[-1]) for r in _summary(p)[1])]
    assert len(named) >= 8, named


def _ds_json(tmp_path: Path, name: str, case: str) -> Path:
    """The buggy DeepSpeed JSON of a ``helpers/scenarios/ds_pitfalls.py`` case, written to ``tmp_path``."""
    from helpers.scenarios import ds_pitfalls as dp

    if case == "typo-top":
        cfg = dp.base_config(2, gradient_clip=0.0)
    elif case == "typo-zero":
        cfg = dp.base_config(2)
        cfg["zero_optimization"] = {"stage": 2, "offload_optimiser": {"device": "cpu"}}
    elif case == "no-optimizer":
        cfg = dp.base_config(1)
        del cfg["optimizer"]
    elif case == "batch-mismatch":
        cfg = dp.base_config(1, train_batch_size=16)
    else:
        raise ValueError(f"case: {case!r}")
    path = tmp_path / name
    path.write_text(json.dumps(cfg, indent=2))
    return path


SCENARIOS = "helpers/scenarios/"
CASES = [  # (notebook, symptom substring, rule, scenario file or ds_pitfalls case, text on the buggy line, command)
    ("03_hangs.ipynb", "ranks call different collectives", "rank-gated-collective", SCENARIOS + "hangs.py",
     "dist.broadcast(grad", None),
    ("03_hangs.ipynb", "hangs at save/eval", "rank-gated-collective", SCENARIOS + "hangs.py", "save_checkpoint(ckpt", None),
    ("03_hangs.ipynb", "hangs at the end of an epoch", "rank-sliced-data", SCENARIOS + "hangs.py", "data[rank * per", None),
    ("04_fsdp.ipynb", "hang at the checkpoint", "rank-gated-collective", SCENARIOS + "fsdp_checkpoint.py",
     "get_model_state_dict(model", None),
    ("05_deepspeed.ipynb", "at the checkpoint", "rank-gated-collective", SCENARIOS + "ds_checkpoint.py",
     "engine.save_checkpoint(", None),
    ("08_slurm.ipynb", "(FM5)", "rank-gated-collective", SCENARIOS + "ds_checkpoint.py", "engine.save_checkpoint(", None),
    ("05_deepspeed.ipynb", "config change has no effect", "ds-unknown-key", "ds_pitfalls:typo-top", '"gradient_clip"', None),
    ("05_deepspeed.ipynb", "`extra_forbidden`", "ds-invalid-section", "ds_pitfalls:typo-zero", None, None),
    ("05_deepspeed.ipynb", "requires an optimizer", "ds-zero-without-optimizer", "ds_pitfalls:no-optimizer", None, None),
    ("05_deepspeed.ipynb", "train_batch_size is not equal", "ds-batch-mismatch", "ds_pitfalls:batch-mismatch",
     '"train_batch_size"', "deepspeed --num_gpus 2 helpers/scenarios/ds_pitfalls.py --out build/05_pitfalls.json"),
]


@pytest.mark.parametrize("notebook,symptom,rule,scenario,marker,command", CASES, ids=lambda v: v if isinstance(v, str) else "")
def test_the_rule_the_table_names_fires_on_the_chapters_buggy_scenario(tmp_path, notebook, symptom, rule, scenario, marker,
                                                                       command):
    row = _row(notebook, symptom)
    assert rule in _ids(row[-1]), f"{notebook}: {row[0]!r} does not name {rule}"
    extra: list[Path] = []
    if scenario.startswith("ds_pitfalls:"):
        path = _ds_json(tmp_path, "ds_config.json", scenario.split(":", 1)[1])
        if rule == "ds-zero-without-optimizer":  # decided with the script that calls deepspeed.initialize
            extra = [ROOT / SCENARIOS / "ds_pitfalls.py"]
    else:
        path = ROOT / scenario
    findings = [f for f in lint_paths([path, *extra], command=command) if f.id == rule and f.file == str(path)]
    assert findings, f"{rule} does not fire on {scenario}"
    if marker is not None:
        lines = path.read_text(encoding="utf-8").splitlines()
        assert any(marker in lines[f.line_no - 1] for f in findings if f.line_no >= 1), \
            f"{rule} fires on {scenario} at {[f.line_no for f in findings]}, none of them the line with {marker!r}"
