"""helpers.slurm: the srun + torchrun form and the sbatch script, rendered and checked with bash -n.

The rendered script runs for real, both rendezvous forms, on the SLURM lab (real slurmctld + slurmd
per network-namespace node): tests/lab/test_slurm_lab.py.
"""

from __future__ import annotations

import shutil
import subprocess

import pytest

from helpers import slurm


def test_srun_torchrun_static_form_follows_gilbreth_4_3():
    text = slurm.srun_torchrun(2, 4, "/home/me/train.py", ["--lr", "0.1 x"], env={"NCCL_DEBUG": "INFO",
                                                                                 "NCCL_SOCKET_IFNAME": None})
    assert text.startswith('MASTER_ADDR="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"\nexport MASTER_ADDR\n')
    assert "export MASTER_PORT=29500\n" in text
    assert "srun --nodes=2 --ntasks-per-node=1 --cpus-per-task=\"${SLURM_CPUS_PER_TASK:-4}\" --export=ALL bash -c '" in text
    assert "export NCCL_DEBUG=INFO" in text and "unset NCCL_SOCKET_IFNAME" in text
    assert '--node-rank="$SLURM_NODEID"' in text and "--nproc-per-node=4" in text
    assert "'\\''0.1 x'\\''" in text  # an argument with a space survives the single-quoted task body


def test_c10d_form_is_identical_on_every_node():
    text = slurm.srun_torchrun(4, 8, "train.py", rdzv="c10d", master_port=29611)
    assert '--rdzv-id="$SLURM_JOB_ID"' in text and '--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"' in text
    assert "SLURM_NODEID" not in text


@pytest.mark.parametrize("kwargs, field", [
    ({"nnodes": 0}, "nnodes"), ({"nproc_per_node": 0}, "nproc_per_node"), ({"rdzv": "etcd"}, "rdzv"),
    ({"master_port": 70000}, "master_port"), ({"script": " "}, "script"), ({"env": {"1BAD": "x"}}, "env"),
])
def test_srun_torchrun_bad_input_names_the_field(kwargs, field):
    args = {"nnodes": 2, "nproc_per_node": 2, "script": "train.py", **kwargs}
    with pytest.raises(ValueError, match=field):
        slurm.srun_torchrun(**args)


@pytest.mark.parametrize("kwargs, field", [
    ({"job_name": "has space"}, "job_name"), ({"nodes": 0}, "nodes"), ({"time": "soon"}, "time"),
    ({"gpus_per_node": -1}, "gpus_per_node"), ({"partition": ""}, "partition"), ({"cpus_per_task": 0}, "cpus_per_task"),
])
def test_sbatch_bad_input_names_the_field(kwargs, field):
    args = {"job_name": "j", "nodes": 2, "nproc_per_node": 2, "script": "train.py", **kwargs}
    with pytest.raises(ValueError, match=field):
        slurm.sbatch_script(**args)


def test_sbatch_script_header_and_syntax(tmp_path):
    text = slurm.sbatch_script("smoke", 4, 2, "train.py", partition="a100-80gb", time="01:00:00", gpus_per_node=2)
    lines = text.splitlines()
    assert lines[0] == "#!/bin/bash" and "set -euo pipefail" in lines
    assert "#SBATCH --nodes=4" in lines and "#SBATCH --gpus-per-node=2" in lines
    assert any(line.startswith("#SBATCH --ntasks-per-node=1") for line in lines)
    assert any("--account=CHANGE_ME" in line and "# EDIT" in line for line in lines)
    assert "# export NCCL_DEBUG=INFO" in text
    cpu = slurm.sbatch_script("cpu", 2, 2, "train.py", gpus_per_node=0)
    assert "--gpus-per-node" not in cpu
    path = tmp_path / "job.sbatch"
    path.write_text(text)
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True).returncode == 0
    if shutil.which("shellcheck"):
        out = subprocess.run(["shellcheck", "-S", "warning", str(path)], capture_output=True, text=True)
        assert out.returncode == 0, out.stdout
