"""Chapter 06 (multi-node network, seeds MN1-MN4 + Gilbreth §4/§6.3/§8.12) runs end to end on the network lab.

Every reproduction asserts on its own run inside the notebook; here: the notebook executes without
an error and leaves no process and no lab namespace behind; the size parser, the rank-log reader and
the fabric-manager grading are tested on canned input (the scripts' ``--help`` and bad-input
handling: ``tests/test_scenario_cli.py``).
"""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from conftest import SCENARIOS, execute_notebook, notebook_outputs

from helpers import netlab, tiers
from helpers.scenarios import fabric_check, net_allreduce

LAB_NAME = "ch06"  # the notebook's LAB_NAME parameter


def test_sizes_parse_binary_and_decimal_units():
    assert net_allreduce.parse_sizes("4KiB, 64MiB,1GiB") == [4096, 64 * 2**20, 2**30]
    assert net_allreduce.parse_sizes("4096,1MB") == [4096, 10**6]
    with pytest.raises(ValueError, match="--sizes"):
        net_allreduce.parse_size("4 parsecs")


def test_read_log_reads_a_failed_and_a_passing_rank():
    failed = net_allreduce.read_log(
        "[rank 1] host node1: GLOO_SOCKET_IFNAME unset: gloo uses hostname 'node1' -> 10.77.0.11 (eth0)\n"
        "[rank 1] init done in 0.09 s: rank 1 of 2\n"
        "[rank 1] step 0 all_reduce 4KiB ok in 0.010 s\n"
        "[rank 1] gloo transport: 10.77.0.11 (eth0) -> 10.77.0.10\n"
        "[rank 1] step 0 all_reduce 64MiB FAILED after 5.04 s: RuntimeError: [x.cc:78] Timed out waiting 5000ms "
        "for recv operation to complete\n")
    assert failed["host"] == "node1" and failed["init_s"] == 0.09 and failed["failed_after"] == 5.04
    assert failed["results"] == {"4KiB": {"status": "ok", "seconds": 0.01, "step": 0},
                                 "64MiB": {"status": "FAILED", "seconds": 5.04, "step": 0}}
    assert failed["error"].startswith("RuntimeError: [x.cc:78] Timed out waiting 5000ms")
    assert failed["transport"] == ["10.77.0.11 (eth0) -> 10.77.0.10"] and not failed["done"]
    init = net_allreduce.read_log("[rank 0] init FAILED after 15.03 s: RuntimeError: Connect timeout [none]\n")
    assert init["failed_after"] == 15.03 and init["error"] == "RuntimeError: Connect timeout [none]" and not init["results"]
    assert net_allreduce.read_log("[rank 0] done\n")["done"]


SMI_Q_PCIE = "    Fabric\n        State                             : N/A\n        Status                            : N/A\n"
SMI_Q_OK = "    Fabric\n        State                   : Completed\n        Status                  : Success\n" * 2
SMI_Q_PENDING = "    Fabric\n        State                   : In Progress\n        Status                  : N/A\n"
FM_OK = "Fabric Manager version is : 550.90.07\n"


def _status(records):
    return {r["id"]: r["status"] for r in records}


def test_fabric_check_grades_what_a_node_reports():
    assert _status(fabric_check.grade(None, 0, "", "", "")) == {"gpu.driver": "SKIP"}
    pcie = fabric_check.grade("565.57.01", 0, "inactive", "", SMI_Q_PCIE)  # Gilbreth's A100 PCIe: FM not needed
    assert _status(pcie) == {"gpu.driver": "OK", "fabric.nvswitch": "OK"}
    healthy = fabric_check.grade("550.90.07", 6, "active\n", FM_OK, SMI_Q_OK)
    assert set(_status(healthy).values()) == {"OK"} and len(healthy) == 5
    down = _status(fabric_check.grade("550.90.07", 6, "inactive\n", FM_OK, SMI_Q_PENDING))
    assert down["fabric.service"] == "FAIL" and down["fabric.gpu"] == "FAIL" and down["fabric.version"] == "OK"
    mismatch = fabric_check.grade("550.90.12", 6, "failed\n", FM_OK, SMI_Q_OK)
    assert _status(mismatch)["fabric.version"] == "FAIL" and "550.90.07 != driver 550.90.12" in mismatch[3]["title"]
    assert _status(fabric_check.grade("550.90.07", 6, "active", "", SMI_Q_OK))["fabric.version"] == "FAIL"
    container = _status(fabric_check.grade("550.90.07", 6, "", "", SMI_Q_OK))  # no systemctl, no FM binary
    assert container["fabric.service"] == container["fabric.version"] == "WARN" and container["fabric.gpu"] == "OK"
    assert _status(fabric_check.grade("550.90.07", 6, "", "", SMI_Q_PENDING))["fabric.gpu"] == "FAIL"
    with pytest.raises(ValueError, match="nvswitches"):
        fabric_check.grade("550.90.07", -1, "", "", "")


def test_fabric_check_parsers():
    assert fabric_check.parse_driver("565.57.01\n565.57.01\n") == "565.57.01"
    assert fabric_check.parse_driver("NVIDIA-SMI has failed because it couldn't communicate") is None
    assert fabric_check.parse_fm_version("\n\n\tFabric Manager version is : 535.161.08\n") == "535.161.08"
    assert fabric_check.parse_fabric_states(SMI_Q_OK) == [("Completed", "Success")] * 2
    assert fabric_check.parse_fabric_states(SMI_Q_PENDING) == [("In Progress", "N/A")]


@pytest.mark.skipif(tiers.gpu_count() > 0, reason="this machine has a GPU: the GPU path is checked by the notebook")
def test_fabric_check_skips_on_a_cpu_node():
    out = subprocess.run([sys.executable, str(SCENARIOS / "fabric_check.py")], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.startswith("[SKIP] gpu.driver")


def test_chapter_06_without_the_lab_skips_every_lab_cell_loudly(no_leftovers):
    out = execute_notebook("06_multinode_network.ipynb", {"USE_LAB": False, "LAB_NAME": "ch06skip"})
    errors, text = notebook_outputs(out)
    assert not errors, errors
    assert text.count("[SKIP lab] USE_LAB = False (parameter)") >= 15  # one per lab cell, never silent
    assert "single-node-net-transport" in text and "no-interface" in text  # the NCCL-log cells still run


def test_chapter_06_multinode_network(no_leftovers):
    lab_ok, why = netlab.lab_available()
    t0 = time.monotonic()
    try:
        out = execute_notebook("06_multinode_network.ipynb", {"LAB_NAME": LAB_NAME})
    finally:
        left = netlab.Lab(1, name=LAB_NAME).leftovers() if lab_ok else []  # namespaces, mounts, state, holder
        if lab_ok:
            netlab.down(LAB_NAME)  # never let one failure leave a lab for the next test
    print(f"chapter 06: {time.monotonic() - t0:.0f} s")
    assert not left, f"lab {LAB_NAME} left behind: {left}"
    errors, text = notebook_outputs(out)
    assert not errors, errors
    if not lab_ok:
        assert f"[SKIP lab] {why}" in text
    else:
        for seen in ("RendezvousTimeoutError", "1/2 clients joined", "Connection refused, remote=[172.17.0.1]",
                     "Connect timeout", "Unable to find address for: ibp65s0", "Unable to find address for: ^docker0",
                     "Connection closed by peer [10.77.0.11]", "Timed out waiting 5000ms for recv",
                     "no rank of this job diverged", "MTU black hole", "(ibp161s0) -> 10.77.0.10"):
            assert seen in text, seen
    assert "single-node-net-transport" in text and "init-incomplete" in text
    if tiers.gpu_count() < 2:
        assert "[SKIP tier-multigpu]" in text
    if tiers.gpu_count() < 1:
        assert "[SKIP tier-gpu]" in text
