"""The rendered sbatch script run for real with stand-in ``srun``/``scontrol`` (``tests/fake_slurm/``): one local
torchrun agent per "node", two agents x two ranks form one 4-rank job, in both rendezvous forms."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest
from support import ROOT, SCENARIOS

from helpers import hostinfo, jobs, launchers, slurm

FAKE = ROOT / "tests" / "fake_slurm"


@pytest.mark.parametrize("rdzv", slurm.RDZV_FORMS)
def test_rendered_sbatch_runs_a_two_node_job(tmp_path, no_leftovers, rdzv):
    port = hostinfo.free_port()
    script = slurm.sbatch_script("t", 2, 2, str(jobs.SHIM), [SCENARIOS / "launch_contract.py", "--timeout-s", 20],
                                 gpus_per_node=0, rdzv=rdzv, master_port=port, log_dir=str(tmp_path),
                                 env={"GLOO_SOCKET_IFNAME": None, "RUNBOOK_BACKEND": "gloo"})
    job = tmp_path / "job.sbatch"
    job.write_text(script)
    env = {"PATH": os.pathsep.join([str(FAKE), str(Path(sys.executable).parent), os.environ["PATH"]]),
           "SLURM_JOB_NODELIST": "127.0.0.1,127.0.0.1", "SLURM_JOB_NUM_NODES": "2", "SLURM_JOB_ID": "4242",
           "SLURM_SUBMIT_DIR": str(tmp_path)}
    run = jobs.run_commands([["bash", str(job)]], env=env, timeout_s=120, name=f"sbatch-{rdzv}", verbose=False)
    assert run.ok, run.summary() + run.output[-3000:]
    seen = launchers.rank_records(run.output, "contract")
    assert sorted(int(r["RANK"]) for r in seen) == [0, 1, 2, 3], run.output[-3000:]
    assert {r["WORLD_SIZE"] for r in seen} == {"4"} and len({r["MASTER_PORT"] for r in seen}) == 1
    if rdzv == "static":  # c10d hands the ranks a store port of its own choosing, not the rendezvous port
        assert {r["MASTER_PORT"] for r in seen} == {str(port)}
    assert sorted(r["GROUP_RANK"] for r in seen) == ["0", "0", "1", "1"]
    groups = launchers.rank_records(run.output, "group")
    assert len(groups) == 4 and {g["world_size"] for g in groups} == {4}
