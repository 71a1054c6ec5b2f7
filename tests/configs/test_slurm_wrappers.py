"""configs/slurm/healthcheck.sh and prolog.sh: bash accepts them, and what SLURM sees of each outcome of the check.

The interpreter is a stub that exits with the status ``runbook health-check`` would give (0 healthy, 1 node
problem, 2 the check broke, 124 ``timeout`` killed it): the Prolog fails only for a node problem (SLURM then
drains the node and requeues the job), the HealthCheckProgram always exits 0 (it drains by itself), and a broken
check is logged as "nothing drained".  The node contract example loads with the real loader.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest
from support import ROOT

from helpers.allocation import tiers

WRAPPERS = [ROOT / "configs" / "slurm" / name for name in ("healthcheck.sh", "prolog.sh")]


@pytest.mark.parametrize("script", WRAPPERS, ids=lambda p: p.name)
def test_wrapper_is_valid_bash_with_its_slurm_conf_line(script):
    assert os.access(script, os.X_OK)
    assert subprocess.run(["bash", "-n", str(script)], capture_output=True).returncode == 0
    text = script.read_text()
    assert "set -euo pipefail" in text and "# EDIT" in text
    assert ("HealthCheckProgram=" if script.name == "healthcheck.sh" else "Prolog=") in text
    if shutil.which("shellcheck"):
        assert subprocess.run(["shellcheck", str(script)], capture_output=True).returncode == 0


@pytest.mark.parametrize("check_rc, prolog_rc", [(0, 0), (1, 1), (2, 0), (124, 0)])
def test_only_a_node_problem_fails_the_prolog(tmp_path, check_rc, prolog_rc):
    stub = tmp_path / "python"
    stub.write_text(f"#!/bin/sh\necho \"stub check: $*\"\nexit {check_rc}\n")
    stub.chmod(0o755)
    site = tmp_path / "site.env"
    site.write_text(f"RUNBOOK_PYTHON={stub}\nRUNBOOK_LOG_DIR={tmp_path / 'log'}\n")
    env = {**os.environ, "RUNBOOK_SITE_ENV": str(site), "SLURMD_NODENAME": "node7"}
    for script, want in zip(WRAPPERS, (0, prolog_rc), strict=True):
        proc = subprocess.run([str(script)], env=env, capture_output=True, text=True, timeout=30)
        assert proc.returncode == want, (script.name, proc.stderr)
    log = (tmp_path / "log" / "node7.log").read_text()
    assert "--node node7 --drain" in log
    assert ("nothing drained" in log) == (check_rc not in (0, 1))


def test_contract_example_loads():
    contract = tiers.load_contract(ROOT / "configs" / "slurm" / "node_contract.example.json")
    assert contract.iface == "eth0" and contract.mtu == 1500 and contract.mounts == ("/shared",)
