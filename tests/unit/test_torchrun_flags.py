"""Unit tests of launchers.torchrun_flags, the one builder of torchrun's rendezvous flags, and of its callers."""

from __future__ import annotations

import pytest

from helpers import jobs, launchers, slurm
from helpers.launchers import torchrun_flags


def test_forms():
    assert torchrun_flags("standalone", nnodes=1, nproc_per_node=4) == ["--nnodes=1", "--nproc-per-node=4", "--standalone"]
    assert torchrun_flags("static", nnodes=2, nproc_per_node=8, master_addr="10.0.0.1", master_port=29500,
                          node_rank=1) == ["--nnodes=2", "--nproc-per-node=8", "--node-rank=1",
                                           "--master-addr=10.0.0.1", "--master-port=29500"]
    assert torchrun_flags("c10d", nnodes=2, nproc_per_node=1, master_addr="h", master_port=29400, rdzv_id="j7") == [
        "--nnodes=2", "--nproc-per-node=1", "--rdzv-id=j7", "--rdzv-backend=c10d", "--rdzv-endpoint=h:29400"]
    assert torchrun_flags(None, nnodes=1, nproc_per_node=None) == ["--nnodes=1"]
    assert launchers.RDZV_FORMS == ("standalone", "static", "c10d")


def test_shell_text_passes_through():
    flags = torchrun_flags("static", nnodes='"$SLURM_JOB_NUM_NODES"', nproc_per_node=4, node_rank='"$SLURM_NODEID"',
                           master_addr='"$MASTER_ADDR"', master_port='"$MASTER_PORT"')
    assert flags == ['--nnodes="$SLURM_JOB_NUM_NODES"', "--nproc-per-node=4", '--node-rank="$SLURM_NODEID"',
                     '--master-addr="$MASTER_ADDR"', '--master-port="$MASTER_PORT"']


def test_elastic_agent_and_per_node_forms():
    """What resume.py (elastic agents) and netlab.py (per lab node) need."""
    agent = torchrun_flags("c10d", nnodes="1:2", nproc_per_node=1, rdzv_endpoint="127.0.0.1:29700", rdzv_id="el",
                           max_restarts=0, rdzv_conf="join_timeout=60")
    assert agent == ["--nnodes=1:2", "--nproc-per-node=1", "--max-restarts=0", "--rdzv-id=el", "--rdzv-backend=c10d",
                     "--rdzv-endpoint=127.0.0.1:29700", "--rdzv-conf=join_timeout=60"]
    per_node = [torchrun_flags("static", nnodes=3, nproc_per_node=2, master_addr="node0", master_port=29500, node_rank=i)
                for i in range(3)]
    assert [f[2] for f in per_node] == ["--node-rank=0", "--node-rank=1", "--node-rank=2"]


@pytest.mark.parametrize("kwargs, field", [
    ({"form": "etcd"}, "form"),
    ({"form": "standalone", "nnodes": 2}, "nnodes"),
    ({"form": "standalone", "nnodes": "1:2"}, "nnodes"),
    ({"form": "c10d", "nnodes": "3:2", "rdzv_id": "j", "rdzv_endpoint": "h:1"}, "nnodes"),
    ({"form": "static", "nnodes": 0, "master_addr": "h", "master_port": 1}, "nnodes"),
    ({"form": "static", "nproc_per_node": 0, "master_addr": "h", "master_port": 1}, "nproc_per_node"),
    ({"form": "static", "master_port": 1}, "master_addr"),
    ({"form": "static", "master_addr": "h"}, "master_port"),
    ({"form": "static", "master_addr": "h", "master_port": 70000}, "master_port"),
    ({"form": "static", "nnodes": 2, "master_addr": "h", "master_port": 1, "node_rank": 2}, "node_rank"),
    ({"form": "static", "master_addr": "h", "master_port": 1, "rdzv_id": "j"}, "rdzv_id"),
    ({"form": "c10d", "master_addr": "h", "master_port": 1}, "rdzv_id"),
    ({"form": "c10d", "rdzv_id": "j"}, "rdzv_endpoint"),
    ({"form": "standalone", "master_port": 29500}, "master_port"),
    ({"form": "static", "master_addr": "h", "master_port": 1, "max_restarts": -1}, "max_restarts"),
])
def test_bad_input_names_the_field(kwargs, field):
    args = {"nnodes": 1, "nproc_per_node": 1, **kwargs}
    form = args.pop("form")
    with pytest.raises(ValueError, match=field):
        torchrun_flags(form, **args)


def test_callers_build_with_it():
    cmd = launchers.build_command("torchrun", 8, 2, 1, "10.0.0.1", script="t.py")
    assert cmd == ["torchrun", *torchrun_flags("static", nnodes=2, nproc_per_node=8, master_addr="10.0.0.1",
                                               master_port=launchers.DEFAULT_MASTER_PORT, node_rank=1), "t.py"]
    text = slurm.srun_torchrun(2, 4, "train.py", rdzv="c10d")
    assert '--rdzv-id="$SLURM_JOB_ID"' in text and '--rdzv-endpoint="$MASTER_ADDR:$MASTER_PORT"' in text
    argv = jobs.launcher_argv("torchrun", "t.py", nproc=2)[0]
    assert argv[1:4] == ["--nnodes=1", "--nproc-per-node=2", "--standalone"]
