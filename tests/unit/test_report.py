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
