"""Unit tests of helpers.checks: the one finding record, and the modules that now build it."""

from __future__ import annotations

import json

import pytest

from helpers import checks, launch_traps
from helpers.checks import Check


def test_status_scale_and_validation():
    assert checks.STATUSES == ("OK", "INFO", "WARN", "FAIL")
    with pytest.raises(ValueError, match=r"status='BAD' in check 'x': accepted values are OK, INFO, WARN, FAIL"):
        Check("x", "t", "BAD")
    with pytest.raises(ValueError, match="id"):
        Check("", "t", "OK")


def test_faulty_defaults_to_the_node_only_when_not_ok():
    assert Check("a", "t", "FAIL", node="n1").faulty == ["n1"]
    assert Check("a", "t", "WARN", node="n1").faulty == ["n1"]
    assert Check("a", "t", "INFO", node="n1").faulty == []
    assert Check("a", "t", "FAIL", node="n1", faulty=["n0"]).faulty == ["n0"]
    assert Check("a", "t", "FAIL").faulty == []


def test_no_second_vocabulary_and_line():
    c = Check("net.mtu", "black hole", "WARN", remediation="fix the MTU", node="n1", field="env.X")
    assert c.ok is False and not any(hasattr(c, old) for old in ("severity", "message", "fix"))
    assert c.line() == "[WARN] net.mtu @n1 (env.X): black hole\n       -> fix the MTU"
    assert Check("a", "fine", "OK", remediation="ignored").line() == "[OK]   a: fine"


def test_worst_and_faulty_nodes():
    cs = [Check("a", "t", "OK"), Check("b", "t", "INFO"), Check("c", "t", "WARN", node="n2"),
          Check("d", "t", "FAIL", node="n1"), Check("e", "t", "FAIL", faulty=["n1", "n3"])]
    assert checks.worst(cs) == "FAIL" and checks.worst(cs[:2]) == "INFO" and checks.worst([]) == "OK"
    assert checks.faulty_nodes(cs) == ["n1", "n3"] and checks.faulty_nodes(cs, "WARN") == ["n2"]
    assert checks.worst_status(["OK", "WARN"]) == "WARN"
    with pytest.raises(ValueError, match="MAYBE"):
        checks.worst_status(["MAYBE"])


def test_dict_round_trip_and_unknown_keys():
    c = Check("a", "t", "FAIL", {"x_bytes": 1}, "do", "D4", ["line 1"], "env.A", "n0")
    data = json.loads(json.dumps(c.to_dict()))
    assert Check.from_dict(data) == c
    with pytest.raises(ValueError, match="unknown key"):
        Check.from_dict({**data, "severity": "FAIL"})


def test_a_trap_is_a_plain_check():
    t = launch_traps.trap("script-in-tmp", "FAIL", "script", "node-local", "use $HOME", "gilbreth 8.12")
    assert type(t) is Check
    assert (t.id, t.status, t.title, t.remediation, t.field, t.source) == \
        ("script-in-tmp", "FAIL", "node-local", "use $HOME", "script", "gilbreth 8.12")
    assert t.line() == "[FAIL] script-in-tmp (script): node-local\n       -> use $HOME"
    with pytest.raises(ValueError, match="severity='OK'"):
        launch_traps.trap("x", "OK", "f", "m", "fix", "s")


def test_find_traps_returns_checks():
    spec = launch_traps.LaunchSpec(nnodes=2, script="/tmp/train.py", master_addr="10.0.0.1")
    traps = launch_traps.find_traps(spec)
    assert traps and all(isinstance(t, Check) and t.status in ("WARN", "FAIL") for t in traps)
    assert "standalone-multinode" in [t.id for t in traps]


def _every_record_type() -> list[Check]:
    """One record of every tool, built the way each tool builds it."""
    from helpers.lint.findings import finding

    return [Check("env.diff", "NCCL_ALGO differs", "FAIL", {"nodes": 2}, "export it on every node", "D21", node="n1"),
            finding("rank-gated-collective", "error", "train.py", 14, "barrier only on rank 0", "call it on every rank", "D21"),
            launch_traps.find_traps(launch_traps.LaunchSpec(nnodes=2, rdzv="standalone"))[0],
            Check("net.mtu.n1", "9000-byte frames dropped", "WARN", node="n1", faulty=["n0"]),
            Check.from_dict(Check("smoke.01", "trained", "OK").to_dict())]


@pytest.mark.parametrize("style", checks.STYLES)
def test_every_record_type_renders_in_every_style(style):
    records = _every_record_type()
    text = checks.render(records, style)
    for c in records:
        assert c.id in text and c.title in text
    assert ("train.py:14" in text) == (style in ("lint", "markdown", "runbook"))
    with pytest.raises(ValueError, match="style"):
        checks.render(records, "html")


def test_every_record_type_goes_through_the_one_json_shape():
    records = _every_record_type()
    data = json.loads(json.dumps(checks.to_json(records, summary={"n": len(records)})))
    assert list(data) == ["checks", "summary"]
    assert [Check.from_dict(d) for d in data["checks"]] == [Check.from_dict(c.to_dict()) for c in records]
