"""helpers.launchers (D7 table, command builder, record parser), the D1-D6 scenario scripts, and the configs."""

from __future__ import annotations

import re

import pytest
from support import SCENARIOS

from helpers import jobs, launchers

CONTRACT = SCENARIOS / "launch_contract.py"
# --- build_command -------------------------------------------------------------------------------------------

def test_torchrun_single_node_is_standalone_unless_a_port_is_given():
    assert launchers.build_command("torchrun", 4, script="train.py", script_args=["--lr", 0.1]) == [
        "torchrun", "--nnodes=1", "--nproc-per-node=4", "--standalone", "train.py", "--lr", "0.1"]
    cmd = launchers.build_command("torchrun", 2, master_port=29600, script="t.py")
    assert "--standalone" not in cmd and cmd[3:5] == ["--master-addr=127.0.0.1", "--master-port=29600"]


def test_torchrun_multi_node_static_and_c10d_forms():
    static = launchers.build_command("torchrun", 8, nnodes=2, node_rank=1, master_addr="10.0.0.1", script="t.py")
    assert static == ["torchrun", "--nnodes=2", "--nproc-per-node=8", "--node-rank=1", "--master-addr=10.0.0.1",
                      "--master-port=29500", "t.py"]
    c10d = [launchers.build_command("torchrun", 8, nnodes=2, node_rank=i, master_addr="head", master_port=29400,
                                    rdzv_id="job7", script="t.py") for i in range(2)]
    assert c10d[0] == c10d[1]  # D2: the identical command on every node
    assert {"--rdzv-id=job7", "--rdzv-backend=c10d", "--rdzv-endpoint=head:29400"} <= set(c10d[0])


def test_accelerate_counts_total_processes_and_adds_multi_gpu():
    one = launchers.build_command("accelerate", 1, script="t.py")
    assert "--multi_gpu" not in one and "--num_processes=1" in one
    multi = launchers.build_command("accelerate", 4, nnodes=2, node_rank=1, master_addr="10.0.0.1",
                                    config_file="cfg.yaml", script="t.py")
    assert multi[:4] == ["accelerate", "launch", "--config_file", "cfg.yaml"]
    assert {"--num_processes=8", "--num_machines=2", "--multi_gpu", "--machine_rank=1",
            "--main_process_ip=10.0.0.1", "--main_process_port=29500"} <= set(multi)
    assert multi[-1] == "t.py"


def test_deepspeed_forms():
    assert launchers.build_command("deepspeed", 2, script="t.py") == ["deepspeed", "--num_gpus=2", "t.py"]
    ssh = launchers.build_command("deepspeed", 8, nnodes=2, master_addr="h0", hostfile="hf", script="t.py")
    assert "--hostfile=hf" in ssh and "--no_ssh" not in ssh
    no_ssh = launchers.build_command("deepspeed", 8, nnodes=2, node_rank=1, master_addr="h0", hostfile="hf",
                                     script="t.py")
    assert {"--hostfile=hf", "--no_ssh", "--node_rank=1", "--master_addr=h0"} <= set(no_ssh)


@pytest.mark.parametrize("kwargs, field", [
    ({"launcher": "python"}, "launcher"),
    ({"launcher": "mpirun"}, "launcher"),
    ({"nproc_per_node": 0}, "nproc_per_node"),
    ({"nproc_per_node": True}, "nproc_per_node"),
    ({"nproc_per_node": "2"}, "nproc_per_node"),
    ({"nnodes": 0}, "nnodes"),
    ({"nnodes": 2, "node_rank": 0}, "master_addr"),
    ({"nnodes": 2, "node_rank": 2, "master_addr": "h"}, "node_rank"),
    ({"node_rank": -1}, "node_rank"),
    ({"master_port": 0}, "master_port"),
    ({"master_port": 70000}, "master_port"),
    ({"master_addr": ""}, "master_addr"),
    ({"script": None}, "script"),
    ({"script": " "}, "script"),
    ({"nnodes": 2, "master_addr": "h"}, "node_rank"),  # torchrun: neither static node_rank nor rdzv_id
    ({"launcher": "accelerate", "nnodes": 2, "master_addr": "h"}, "node_rank"),
])
def test_bad_input_names_the_field(kwargs, field):
    args = {"launcher": "torchrun", "nproc_per_node": 2, "script": "t.py", **kwargs}
    with pytest.raises(ValueError, match=rf"^{field}\b"):
        launchers.build_command(args.pop("launcher"), args.pop("nproc_per_node"), **args)


# --- the decision table and the record parser ----------------------------------------------------------------

def test_decision_table_rows_are_complete_and_render():
    keys = {"nnodes": 2, "nproc": 8, "total": 16, "node_rank": 0, "master_addr": "h", "master_port": 29500,
            "script": "train.py"}
    parallelisms = " ".join(r.parallelism for r in launchers.DECISION_TABLE)
    for word in ("DDP", "FSDP", "ZeRO"):
        assert word in parallelisms
    for row in launchers.DECISION_TABLE:
        assert row.launcher in launchers.DECISION_LAUNCHERS and row.when and row.parallelism
        assert row.seeds and all(re.fullmatch(r"D\d+", s) for s in row.seeds) and "D7" in row.seeds
        for template in (row.single_node, row.multi_node):
            assert template.format(**keys).split()[0] == row.launcher and "train.py" in template.format(**keys)
    md = launchers.table_markdown().splitlines()
    assert len(md) == len(launchers.DECISION_TABLE) + 2 and all(line.count(" | ") == 5 for line in md[2:])


def test_parse_records_parses_prefixed_and_plain_lines():
    text = "\n".join(['[rank 1] contract {"RANK": "1"}', 'contract {"RANK": "0"}', "[rank 0] contract {broken",
                      '[rank 0] group {"rank": 0}', "contract without json"])
    recs = jobs.parse_records(text, "contract")
    assert recs == [{"RANK": "1", "_shim_rank": 1}, {"RANK": "0", "_shim_rank": None}]
    assert jobs.parse_records(text, "group") == [{"rank": 0, "_shim_rank": 0}]
    with pytest.raises(ValueError, match="^kind"):
        jobs.parse_records(text, "Contract!")


# --- the scenario scripts ----------------------------------------------------------------------------------

# --- Accelerate configs, checked with Accelerate's own loader ----------------------------------------------

