"""The report writer: atomic files, valid records, clear errors."""

from __future__ import annotations

import json
import os

import pytest

from helpers import report
from helpers.checks import Check, worst


def _checks():
    return [Check("a.one", "first", "OK", {"x_bytes": 1}),
            Check("b.two", "second", "WARN", {"y": [1, 2]}, "do this", "D4")]


def test_write_report_files(tmp_path):
    js, md = report.write_report(tmp_path, _checks(), {"host": "h"}, images=["busbw.png"])
    data = json.loads(js.read_text())
    assert data["status"] == "WARN"
    assert [c["id"] for c in data["checks"]] == ["a.one", "b.two"]
    assert data["checks"][1]["remediation"] == "do this"
    text = md.read_text()
    assert "| WARN | `b.two` |" in text and "![busbw](busbw.png)" in text
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json", "report.md"]  # no temp files left


def test_failed_write_keeps_the_old_file(tmp_path, monkeypatch):
    target = tmp_path / "report.json"
    target.write_text("old")

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", boom)
    with pytest.raises(OSError, match="disk full"):
        report.write_atomic(target, "new content")
    assert target.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]


def test_worst_and_line():
    checks = _checks() + [Check("c", "bad", "FAIL", remediation="fix it")]
    assert worst(checks) == "FAIL"
    assert worst([]) == "OK"
    assert checks[2].line().startswith("[FAIL] c: bad") and "-> fix it" in checks[2].line()


def test_bad_records_are_refused(tmp_path):
    with pytest.raises(ValueError, match="status='MAYBE'.*OK, INFO, WARN, FAIL"):
        Check("x", "t", "MAYBE")
    with pytest.raises(ValueError, match="duplicate ids"):
        report.write_report(tmp_path, [Check("x", "t", "OK")] * 2, {})
    with pytest.raises(ValueError, match="checks"):
        report.write_report(tmp_path, [], {})


def test_report_md_leads_with_what_to_do_and_folds_the_evidence():
    """Issue 28: an all-OK 2-node report was ~580 lines of raw values; the action comes first now."""
    checks = [Check("env.diff", "identical on 4 ranks", "OK", {"ranks": list(range(4))}),
              Check("pairs.bandwidth", "node1 slow with every partner", "WARN", {"matrix": {"a": 1}},
                            "drain node1", "MN3", faulty=["node1"]),
              Check("smoke.03", "ZeRO-1 reload failed", "FAIL", {"err": "x" * 500}, "see the log", "D16")]
    sections = "## Drain list\n\nLeave out: `--exclude=node1` (FAIL: none; WARN: node1)\n\n## Node node0\n\n- versions: x\n"
    text = report.to_markdown(checks, {"host": "h"}, sections_md=sections)
    head = text[:text.index("## Checks")]
    assert head.index("[FAIL] `smoke.03`") < head.index("[WARN] `pairs.bandwidth`") < head.index("**Drain list**")
    assert "(node: node1)" in head and "→ drain node1" in head and "`--exclude=node1`" in head
    evidence = text[text.index("## Evidence"):]
    assert "<details open><summary>[FAIL] <code>smoke.03</code>" in evidence
    assert "<details><summary>[OK] <code>env.diff</code>" in evidence and "### Node node0" in evidence
    assert "x" * 118 not in text  # long values stay truncated
    ok = report.to_markdown([checks[0]], {"host": "h"}, sections_md="## Drain list\n\nNo node to leave out.\n")
    assert ok.split("## What to do")[1].split("##")[0].strip() == "Nothing: all 1 checks passed. The allocation is ready for a job."


def test_two_nodes_get_no_heat_map(tmp_path):
    """Two nodes are one pair: one number drawn as a 2x2 heat-map told nothing (issue 28)."""
    from helpers import plots

    with pytest.raises(ValueError, match="2 node\\(s\\); a heat-map needs 3 or more"):
        plots.plot_pair_matrix({"a": {"b": 1.0}, "b": {"a": 1.0}}, tmp_path / "pairs.png")
    assert not (tmp_path / "pairs.png").exists()
