"""SLURM's own slurmd runs configs/slurm/healthcheck.sh on the lab (issue 23): the prolog tier drains a broken node with
its reason, a healthy node stays IDLE, and nothing drains while the check itself is broken.

One 3-node SLURM lab, ``HealthCheckInterval=5``.  Phase 1: the contract file is not JSON (the check breaks on
every node) while node1 really breaks the contract: after every node has run the check, every node is still
idle.  Phase 2: the contract is fixed: node1 goes DRAIN with ``[node_problem] nic: ...`` in sinfo -R's first 20
characters, node0 and node2 stay idle.  The lab is named ``hc`` and torn down; the logs live under build/.
"""

from __future__ import annotations

import shutil
import sys
import time

import pytest
from support import ROOT

from helpers import jobs, netlab
from helpers.netlab import slurmlab

LAB_OK, LAB_WHY = netlab.lab_available()
SLURM_OK, SLURM_WHY = slurmlab.slurm_available()
pytestmark = [pytest.mark.skipif(not LAB_OK, reason=f"network lab unavailable: {LAB_WHY}"),
              pytest.mark.skipif(not SLURM_OK, reason=f"SLURM lab unavailable: {SLURM_WHY}")]
NAME = "hc"
INTERVAL_S = 5


def states(lab: netlab.Lab) -> dict[str, tuple[str, str]]:
    """``{node: (state, reason)}`` from ``sinfo -N`` (``%E``: the full reason)."""
    out = lab.slurm(["sinfo", "-h", "-N", "-o", "%N|%T|%E"], timeout_s=20).stdout
    return {n: (s, r) for n, s, r in (line.split("|", 2) for line in out.splitlines() if line.count("|") == 2)}


def runs(logs, node: str) -> int:
    path = logs / f"{node}.log"
    return path.read_text().count("runbook health-check: exit") if path.exists() else 0


def wait_for(predicate, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(1)
    return False


def test_health_check_program_drains_the_broken_node_only_and_never_when_it_breaks(no_leftovers):
    work = jobs.build_dir() / "lab-health-check"  # on the shared filesystem: the nodes' /tmp is private
    shutil.rmtree(work, ignore_errors=True)
    logs, contract = work / "logs", work / "contract.json"
    logs.mkdir(parents=True)
    contract.write_text("{this is not json")
    t0 = time.monotonic()
    try:
        with netlab.Lab(3, name=NAME, slurm=True) as lab:
            site = work / "site.env"  # what a site puts beside the wrapper: slurmd passes next to no environment
            site.write_text(f"SLURM_CONF={slurmlab.conf_path(NAME)}\nRUNBOOK_PYTHON={sys.executable}\n"
                            f"RUNBOOK_CONTRACT={contract}\nRUNBOOK_LOG_DIR={logs}\n")
            program = work / "healthcheck"
            program.write_text(f"#!/bin/bash\nenv > {work}/env-$(hostname).txt\nexport RUNBOOK_SITE_ENV={site}\n"
                               f"exec {ROOT / 'configs/slurm/healthcheck.sh'}\n")
            program.chmod(0o755)
            lab.rename_data_iface("node1", "ens9")  # node1 breaks the contract's "iface": "eth0"
            conf = slurmlab.conf_path(NAME)
            conf.write_text(conf.read_text() + f"HealthCheckProgram={program}\nHealthCheckInterval={INTERVAL_S}\n")
            assert lab.slurm(["scontrol", "reconfigure"]).returncode == 0

            # phase 1: the check is broken (its contract is not JSON): it runs on every node, drains nothing
            assert wait_for(lambda: all(runs(logs, n) >= 2 for n in lab.hostnames), 90), \
                {n: runs(logs, n) for n in lab.hostnames}
            broken = states(lab)
            assert {n: s for n, (s, _) in broken.items()} == dict.fromkeys(lab.hostnames, "idle"), broken
            assert "tool.health_check.node1" in (logs / "node1.log").read_text()

            # phase 2: the contract is readable: node1 (no eth0) is drained with the reason, the others stay idle
            contract.write_text('{"iface": "eth0", "mtu": 1500}')
            drained = wait_for(lambda: states(lab)["node1"][0].startswith("drain"), 60)
            print((logs / "node1.log").read_text()[-1200:])
            assert drained, (states(lab), (work / "env-node1.txt").read_text())
            seen = {n: runs(logs, n) for n in lab.hostnames}
            assert wait_for(lambda: all(runs(logs, n) > seen[n] for n in ("node0", "node2")), 30)
            final = states(lab)
            print(final, f"{time.monotonic() - t0:.1f} s", "the environment slurmd gave the program:",
                  (work / "env-node1.txt").read_text().split())
    finally:
        shutil.rmtree(work, ignore_errors=True)
    assert final["node1"][1][:20] == "[node_problem] nic: ", final
    assert "ens9" in final["node1"][1]
    assert final["node0"][0] == final["node2"][0] == "idle", final
