"""fabric_check.py (chapter 06, MN1): the fabric-manager grading and parsers on canned node output, and the CPU-node skip."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import SCENARIOS

from helpers import tiers
from helpers.scenarios import fabric_check

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
    mismatch = fabric_check.grade("550.90.12", 6, "failed\n", FM_OK, SMI_Q_PENDING)
    assert _status(mismatch)["fabric.version"] == "FAIL" and "550.90.07 != driver 550.90.12" in mismatch[3]["title"]
    # Every GPU joined the fabric: the fabric manager runs elsewhere (GB200 NMX-C, GPU Operator), so no false FAIL
    joined = fabric_check.grade("550.90.12", 6, "failed\n", FM_OK, SMI_Q_OK)
    assert _status(joined)["fabric.version"] == "WARN" and "runs elsewhere" in joined[3]["title"]
    assert _status(fabric_check.grade("550.90.07", 6, "active", "", SMI_Q_PENDING))["fabric.version"] == "FAIL"
    assert _status(fabric_check.grade("550.90.07", 6, "active", "", SMI_Q_OK))["fabric.version"] == "WARN"
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
