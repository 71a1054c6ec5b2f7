"""helpers.slurm's job-state parsing and NCCL profiles, helpers.slurm_cases' breakages: no cluster needed."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from helpers import launch_traps, slurm
from helpers import slurm_cases as sc

LINE = ("JobId=7 JobName=fm1 UserId=root(0) JobState=FAILED Reason=NonZeroExitCode Dependency=(null) ExitCode=1:0 "
        "RunTime=00:00:03 TimeLimit=00:03:00 StdErr=/w/fm1_7.err StdIn=/dev/null StdOut=/w/fm1_7.out")


class Canned:
    """A SLURM client that answers scontrol with a fixed line (and records the commands)."""

    def __init__(self, text: str) -> None:
        self.text, self.calls = text, []

    def slurm(self, argv, timeout_s=60.0, *, env=None, cwd=None):
        self.calls.append(list(argv))
        return subprocess.CompletedProcess(argv, 0, self.text, "")


def test_job_state_reads_scontrol():
    s = slurm.job_state(Canned(LINE), "7")
    assert (s.state, s.exit_code, s.reason, s.exit_status, s.ended) == ("FAILED", "1:0", "NonZeroExitCode", 1, True)
    assert s.stdout == Path("/w/fm1_7.out") and s.files() == {"/w/fm1_7.out": False, "/w/fm1_7.err": False}
    assert s.out() == "" and "job 7 FAILED exit 1:0 (NonZeroExitCode)" in s.summary()
    assert slurm.job_state(Canned(""), "8").state == "UNKNOWN"


def test_wait_jobs_returns_ended_jobs_and_validates():
    client = Canned(LINE)
    assert slurm.wait_jobs(client, ["7"], timeout_s=5)["7"].state == "FAILED"
    with pytest.raises(ValueError, match="timeout_s"):
        slurm.wait_job(client, "7", timeout_s=0)
    with pytest.raises(ValueError, match="pattern"):
        slurm.wait_output(client, "7", "(", timeout_s=1)


def test_nccl_profiles_are_the_guides_table():
    single, multi = slurm.nccl_profile("single_node"), slurm.nccl_profile("multi_node")
    assert single["NCCL_IB_DISABLE"] == "1" and single["NCCL_P2P_LEVEL"] == "NVL" and "NCCL_NET_DISABLE" not in single
    assert "NCCL_P2P_LEVEL" not in multi  # NVL on a PCIe-only node turns P2P off: a commented toggle there
    assert multi["NCCL_IB_DISABLE"] == "0" and multi["NCCL_SOCKET_IFNAME"] is None and multi["GLOO_SOCKET_IFNAME"] is None
    assert "NCCL_DEBUG" not in multi  # commented toggles stay off
    with pytest.raises(ValueError, match="profile"):
        slurm.nccl_profile("two_nodes")
    for name in slurm.NCCL_PROFILES:
        text = slurm.nccl_profile_path(name).read_text()
        assert "# EDIT" in text and "source configs/" in text.splitlines()[1]
        assert subprocess.run(["bash", "-n", str(slurm.nccl_profile_path(name))]).returncode == 0


@pytest.mark.parametrize("name", list(sc.BREAKS))
def test_each_breakage_changes_the_working_script_and_stays_valid_bash(name, tmp_path):
    good = sc.job_script("/shared/w", "case", sc.SCENARIOS / "launch_contract.py", ["--timeout-s", 5], port=29999)
    bad = sc.break_script(good, name)
    assert bad != good and sc.diff(good, bad)
    path = tmp_path / "job.sbatch"
    path.write_text(bad)
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    assert sc.BREAKS[name][1]  # every breakage names its source


def test_breakages_the_builder_sees():
    assert "--rdzv-conf=timeout=10" in sc.job_script("/w", "x", "/w/t.py", ["a"], port=1)
    with pytest.raises(ValueError, match="name"):
        sc.break_script("#!/bin/bash\n", "no-such-break")
    with pytest.raises(ValueError, match="not found"):
        sc.break_script("#!/bin/bash\n", "srun-export-none")
    spec = launch_traps.LaunchSpec(kind="sbatch", nnodes=2, srun_ntasks_per_node=2)
    assert "srun-tasks-per-node" in {t.id for t in launch_traps.find_traps(spec)}
