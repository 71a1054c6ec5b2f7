"""helpers.allocation.operators: drain.sh lines SLURM accepts, reasons readable in sinfo -R's 20 characters, JUnit XML,
tool and user errors that never drain (issue 23).  The records come from the real graders."""

from __future__ import annotations

import re
import shutil
import subprocess
import xml.etree.ElementTree as ET

import pytest

from helpers.allocation import across, grades, operators
from helpers.checks import Check

LINE = re.compile(r'^scontrol update nodename=(\S+) state=drain reason="(\[node_problem\] [^"$`\\]+)"$')


def _slow_node_pairs() -> Check:
    nodes = ["n0", "n1", "n2", "n3"]
    return grades.grade_pairs({a: {b: (0.01 if "n2" in (a, b) else 0.1) for b in nodes if b != a} for a in nodes})


def _missing_gpus() -> list[Check]:
    report = {"versions": {"torch": "2.13.0", "cuda": "12.8", "nccl": "2.27", "driver": "580.1", "deepspeed": "0.19.8"},
              "gpus": 6, "host_checks": [], "nvswitch": False}
    return grades.grade_nodes({"gpu01": {**report, "gpus": 8}, "gpu02": report}, gpus_per_node=8)


def _refused_step() -> Check:
    return across.step_failure("node.step.node0", "node0", subprocess.CompletedProcess(
        [], 1, "", "srun: error: Unable to create step for job 1: More processors requested than permitted\n"), 30)


def test_reasons_say_what_is_wrong_in_the_first_20_characters():
    slow = _slow_node_pairs()
    gpus = next(c for c in _missing_gpus() if c.id == "node.gpus.gpu02")
    mtu = Check("net.mtu.node1", "node1: path MTU 1500 < interface MTU 9000 (ping -M do -s 8972 lost)", "FAIL", node="node1")
    for check, node, head in ((slow, "n2", "[node_problem] slow:"), (gpus, "gpu02", "[node_problem] gpu: "),
                              (mtu, "node1", "[node_problem] mtu: ")):
        text = operators.reason(check, node)
        assert text[:operators.REASON_WIDTH] == head, text
        assert not text[len(head):].startswith(node)  # the node's name is the nodename=, not the reason
    assert operators.reason(gpus, "gpu02") == "[node_problem] gpu: 6 GPU(s) visible, 8 asked for"


def test_drain_script_one_line_per_faulty_node_that_bash_accepts(tmp_path):
    checks = [_slow_node_pairs(), *_missing_gpus(), _refused_step(),
              operators.tool_error("tool.notebook", 'the notebook stopped in cell 7: "$HOME" `x`')]
    text = operators.drain_script(checks)
    lines = [ln for ln in text.splitlines() if ln.startswith("scontrol")]
    assert [LINE.match(ln).group(1) for ln in lines] == ["gpu02", "n2"]  # FAIL records first, one line per node
    assert "# not drained (user_problem): node.step.node0" in text and "# not drained (tool_error): tool.notebook" in text
    script = tmp_path / "drain.sh"
    script.write_text(text)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    if shutil.which("shellcheck"):
        assert subprocess.run(["shellcheck", str(script)], capture_output=True, text=True).returncode == 0


def test_tool_and_user_errors_never_drain_even_when_they_name_a_node():
    broke = operators.tool_error("tool.job", "our launcher timed out on node3", node="node3")
    broke.faulty = ["node3"]  # even a record that names a node: the check broke, the node is not to blame
    user = operators.user_error("user.error", "MAX_BYTES=-5: must be an integer >= 4")
    assert operators.drain_commands([broke, user, _refused_step()]) == []
    assert "nothing to drain" in operators.drain_script([broke, user])
    assert [operators.cause(c) for c in (broke, user, _refused_step())] == ["tool_error", "user_problem", "user_problem"]


def test_exit_status_two_for_tool_or_user_errors_then_one_for_fail():
    assert operators.exit_status([_slow_node_pairs()]) == 0  # a WARN
    assert operators.exit_status(_missing_gpus()) == 1
    assert operators.exit_status([*_missing_gpus(), operators.tool_error("tool.x", "broke")]) == 2
    assert operators.exit_status([_refused_step()]) == 2


def test_junit_xml_failures_errors_and_passes():
    checks = [*_missing_gpus(), _slow_node_pairs(), operators.tool_error("tool.notebook", "cell 3 raised KeyError")]
    root = ET.fromstring(operators.junit_xml(checks, time_s=12.3))
    suite = root.find("testsuite")
    assert (suite.get("tests"), suite.get("failures"), suite.get("errors"), suite.get("time")) == (str(len(checks)), "1", "1", "12.3")
    cases = {c.get("name"): c for c in suite.iter("testcase")}
    failed = cases["node.gpus.gpu02@gpu02"].find("failure")
    assert failed is not None and failed.get("message") == "gpu02: 6 GPU(s) visible, 8 asked for"
    assert cases["tool.notebook"].find("error").get("type") == "tool_error"
    assert cases["pairs.bandwidth"].find("failure") is None and "[WARN]" in cases["pairs.bandwidth"].find("system-out").text


def test_write_outputs_and_apply_through_a_client(tmp_path):
    class Recorder:
        def __init__(self):
            self.calls = []

        def slurm(self, argv, timeout_s=60.0):
            self.calls.append(list(argv))
            return subprocess.CompletedProcess(argv, 0, "", "")

    checks = _missing_gpus()
    paths = operators.write_outputs(tmp_path, checks)
    assert paths["drain"].stat().st_mode & 0o111 and ET.parse(paths["junit"]).getroot().tag == "testsuites"
    client = Recorder()
    done = operators.apply(client, checks)
    assert client.calls == [["scontrol", "update", "nodename=gpu02", "state=drain",
                             "reason=[node_problem] gpu: 6 GPU(s) visible, 8 asked for"]]
    assert done[0]["node"] == "gpu02" and done[0]["returncode"] == 0


@pytest.mark.parametrize("cid, want", [("node.gpus.a", "gpu"), ("pairs.bandwidth", "slow"), ("net.mtu.a", "mtu"),
                                       ("node.step.a", "down"), ("job.launch", "join"), ("node.versions", "ver"),
                                       ("node.host.socket_ifname.a", "nic"), ("gpu.xid.a", "xid")])
def test_codes_are_at_most_four_letters(cid, want):
    assert operators.code(cid) == want and len(want) <= 4


def test_cli_bad_parameter_is_a_user_error_record(capsys):
    from helpers import cli

    assert cli.main(["diagnose", "-p", "MAX_BYTES", "-5"]) == 2
    assert "[WARN] user.error: MAX_BYTES=-5" in capsys.readouterr().err
