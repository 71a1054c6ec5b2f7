"""The hang doctor across nodes (issue 13): a hung 2-node SLURM job on the lab, one verdict from every node's
stacks and Flight Recorder dumps, through ``runbook doctor --slurm-job`` and ``--lab``.

Skipped with the reason printed when the network lab or SLURM cannot be built here.  Lab name ``fd``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import SCENARIOS

from helpers import hostinfo, jobs, netlab, slurm
from helpers.netlab import slurmlab

LAB_OK, LAB_WHY = netlab.lab_available()
SLURM_OK, SLURM_WHY = slurmlab.slurm_available()
pytestmark = [pytest.mark.skipif(not LAB_OK, reason=f"network lab unavailable: {LAB_WHY}"),
              pytest.mark.skipif(not SLURM_OK, reason=f"SLURM lab unavailable: {SLURM_WHY}")]
STALL_S = 3.0


def _quiet_for(path: Path, seconds: float, timeout_s: float = 120) -> float:
    """Wait until ``path`` has not changed for ``seconds`` (the stall window); return its last change (epoch s)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists() and "step 1" in path.read_text() and time.time() - path.stat().st_mtime >= seconds:
            return path.stat().st_mtime
        time.sleep(0.1)
    raise AssertionError(f"{path}: the job never stalled ({path.read_text()[-2000:] if path.exists() else 'no output'})")


def test_two_node_hang_named_from_every_node(no_leftovers):
    lab = netlab.Lab(2, name="fd", subnet="10.77.13.0/24", slurm=True)
    lab.up()
    try:
        work = jobs.new_job_dir("fr-2node")
        script = slurm.sbatch_script("frlab", 2, 1, str(jobs.SHIM), [SCENARIOS / "hangs.py", "--case", "mismatch", "--backend",
                                                                      "gloo", "--timeout-s", 120, "--steps", 4],
                                     gpus_per_node=0, cpus_per_task=1, partition=slurmlab.PARTITION, account="lab",
                                     time="00:05:00", master_port=hostinfo.free_port(), log_dir=str(work),
                                     env={"GLOO_SOCKET_IFNAME": "eth0", "TORCH_FR_BUFFER_SIZE": "2000",
                                          "RUNBOOK_FR_DIR": str(work / "fr")})
        (work / "job.sbatch").write_text(script)
        env = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]), "RUNBOOK_JOB_DIR": str(work)}
        sub = lab.slurm(["sbatch", "--parsable", str(work / "job.sbatch")], env=env, cwd=work)
        assert sub.returncode == 0, sub.stderr
        job_id = sub.stdout.strip().split(";")[0]
        try:
            last = _quiet_for(work / f"frlab_{job_id}.out", STALL_S)
            cmd = [sys.executable, "-m", "helpers.cli", "doctor"]
            out = lab.slurm([*cmd, "--slurm-job", job_id], env=env, timeout_s=90)
            slurm_s = time.time() - last - STALL_S
            t0 = time.time()
            via_lab = subprocess.run([*cmd, "--lab", "fd"], capture_output=True, text=True, timeout=90)  # from the host
            lab_s = time.time() - t0
        finally:
            lab.slurm(["scancel", job_id], timeout_s=10)
        print(f"two-node verdict {slurm_s:.2f} s after the stall window (--slurm-job); --lab took {lab_s:.2f} s\n{out.stdout}")
        for res in (out, via_lab):
            assert res.returncode == 0, res.stderr[-2000:]
            assert "rank(s) [1] diverged" in res.stdout and "gloo:broadcast" in res.stdout, res.stdout
        assert "Flight Recorder" in out.stdout and slurm_s <= 5
    finally:
        lab.down()
        assert not lab.leftovers()
