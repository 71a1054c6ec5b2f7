"""helpers.allocation.tiers (the prolog tier, the tier map) and the group-test graders of helpers.allocation.grades.

The prolog checks run for real on this host against contracts that it meets or breaks (its own interfaces, the
project folder, this Python); a contract that cannot be read, or a check that raises, is a tool error that never
drains (issue 23).
"""

from __future__ import annotations

import json
import platform
import random
import subprocess

import pytest
from support import ROOT

from helpers import hostinfo
from helpers.allocation import grades, operators, tiers
from helpers.allocation.localise import Outcome, SimulatedCluster, localise


class Recorder:
    """A SLURM client that records the commands it was given (nothing runs)."""

    def __init__(self):
        self.calls = []

    def slurm(self, argv, timeout_s=60.0):
        self.calls.append(list(argv))
        return subprocess.CompletedProcess(argv, 0, "", "")


def data_iface() -> dict:
    return next(i for i in hostinfo.interfaces() if not i["loopback"] and i["ipv4"])


def contract(tmp_path, **fields) -> str:
    path = tmp_path / "contract.json"
    path.write_text(json.dumps(fields))
    return str(path)


def test_prolog_tier_passes_a_contract_this_host_meets(tmp_path):
    iface = data_iface()
    c = tiers.load_contract(contract(tmp_path, iface=iface["name"], mtu=iface["mtu"], mounts=[str(ROOT)],
                                     versions={"python": platform.python_version()[:4]}, gpus=0))
    checks = tiers.prolog_checks(c, "n1")
    assert [x.id for x in checks] == ["prolog.gpus.n1", "prolog.nic.n1", "prolog.mtu.n1", "prolog.mnt.n1", "prolog.ver.n1"]
    assert all(x.status == "OK" for x in checks), [x.line() for x in checks]


def test_a_broken_contract_drains_this_node_with_the_reason(tmp_path):
    iface = data_iface()
    path = contract(tmp_path, iface="ens9", mtu=iface["mtu"] + 100 if iface["mtu"] < 9000 else 1500)
    client = Recorder()
    checks, status, drained = tiers.health_check(path, drain=True, client=client, node="n1")
    assert status == 1 and [x.status for x in checks] == ["FAIL", "FAIL"]
    assert [d["node"] for d in drained] == ["n1"]  # one line per node: the first FAIL gives the reason
    assert client.calls[0][:4] == ["scontrol", "update", "nodename=n1", "state=drain"]
    assert client.calls[0][4].startswith("reason=[node_problem] nic: data interface ens9: missing")


@pytest.mark.parametrize("text, why", [("{not json", "cannot read it as JSON"), ('{"mtu": "big"}', "must be a JSON int"),
                                        ('{"gpu": 8}', "unknown key")])
def test_a_contract_it_cannot_read_is_a_tool_error_and_drains_nothing(tmp_path, text, why):
    path = tmp_path / "contract.json"
    path.write_text(text)
    client = Recorder()
    checks, status, drained = tiers.health_check(str(path), drain=True, client=client, node="n1")
    assert status == 2 and drained == [] and client.calls == []
    assert checks[0].status == "WARN" and operators.cause(checks[0]) == "tool_error" and why in checks[0].title


def test_a_check_that_raises_is_a_tool_error(tmp_path, monkeypatch):
    def broken():
        raise RuntimeError("`ip` (iproute2) not found on PATH")

    monkeypatch.setattr(hostinfo, "interfaces", broken)
    client = Recorder()
    checks, status, _ = tiers.health_check(contract(tmp_path, iface="eth0"), drain=True, client=client, node="n1")
    assert status == 2 and client.calls == [] and "iproute2" in checks[0].title


def test_tier_params_user_values_win():
    assert tiers.tier_params("quick", {})["MULTI_STEPS"] == "nodes,job,smoke,localise"
    assert tiers.tier_params("full", {"SMOKE_STEPS": 7})["SMOKE_STEPS"] == 7
    with pytest.raises(ValueError, match="prolog"):
        tiers.tier_params("prolog", {})


def test_grade_group_reads_the_workers_results():
    ok = {"ok": True, "all_reduce_s": 0.02, "all_to_all_s": 0.01, "bytes": 2 << 20, "ranks": 2, "error": ""}
    failed, value, _ = grades.grade_group({"a": ok, "b": ok}, 0.0125)
    assert not failed and value == pytest.approx(2 * (2 << 20) / 2 / 0.02 / 1e9, rel=1e-3)
    slow = dict(ok, all_to_all_s=2.0)
    assert grades.grade_group({"a": slow, "b": slow}, 0.0125)[0]
    mtu = {"ok": False, "stage": "small_ok", "error": "no result within 8 + 5 s: the collective hung"}
    assert "MTU" in grades.grade_group({"a": mtu, "b": ok}, 0.0125)[2]
    assert "no result from b" in grades.grade_group({"a": ok, "b": None}, None)[2]


def test_grade_localisation_drains_nodes_reports_links_and_blames_no_one_when_all_fail():
    nodes = [f"n{i}" for i in range(8)]
    loc = localise(nodes, SimulatedCluster({"slow_node": ["n3"], "slow_link": [("n0", "n6")]}, random.Random(1),
                                           transient=0.0)).to_dict()
    checks = grades.grade_localisation(loc, 0.0125)
    by_id = {c.id: c for c in checks}
    assert by_id["localise.slow.n3"].status == "FAIL" and by_id["localise.slow.n3"].faulty == ["n3"]
    assert by_id["localise.link.n0-n6"].status == "WARN" and by_id["localise.link.n0-n6"].faulty == []
    assert [n for n, _, _ in operators.drain_commands(checks)] == ["n3"]
    assert operators.reason(by_id["localise.slow.n3"], "n3")[:20] == "[node_problem] slow:"
    dead = localise(nodes, lambda groups: [Outcome(True, None, "timeout") for _ in groups]).to_dict()
    summary = grades.grade_localisation(dead, 0.0125)[-1]
    assert summary.status == "WARN" and summary.faulty == [] and operators.drain_commands([summary]) == []


def test_cli_prolog_tier_and_health_check(tmp_path, capsys):
    from helpers import cli

    bad = tmp_path / "contract.json"
    bad.write_text("[1, 2]")
    assert cli.main(["diagnose", "--tier", "prolog", "--contract", str(bad)]) == 2
    assert "[WARN] tool.health_check." in capsys.readouterr().out
    good = contract(tmp_path, mounts=[str(ROOT)])
    assert cli.main(["health-check", "--contract", good, "--node", "n9", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["status"] == 0 and [c["id"] for c in out["checks"]] == ["prolog.mnt.n9"]
