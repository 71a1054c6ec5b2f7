"""Grading of the allocation checks, on real jobs where a real job can show the fault."""

from __future__ import annotations

import copy
import json
import socket

from support import SCENARIOS

from helpers import jobs
from helpers.allocation import grades, local


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _two_node_env_job(tmp_path, env_per_node):
    """Two torchrun agents on this host acting as two nodes (static rendezvous), one rank each."""
    port = _free_port()
    out = tmp_path / "env.json"
    cmds = [["torchrun", "--nnodes=2", f"--node-rank={i}", "--nproc-per-node=1", "--master-addr=127.0.0.1",
             f"--master-port={port}", *jobs.shim_argv(SCENARIOS / "env_report.py",
                                                      ["--out", str(out), "--backend", "gloo", "--timeout-s", "30"])]
            for i in range(2)]
    job = jobs.run_commands(cmds, per_process_env=env_per_node, timeout_s=60, name="two-node-env", verbose=False)
    assert job.ok, job.summary()
    return json.loads(out.read_text())


def test_a_setting_that_differs_across_ranks_is_a_warn(tmp_path, no_leftovers):
    records = _two_node_env_job(tmp_path, [{"NCCL_DEBUG": "INFO"}, {"NCCL_DEBUG": None}])
    check = grades.grade_env(records)
    assert check.status == "WARN"
    assert check.values["differing"] == {"env.NCCL_DEBUG": {0: "INFO", 1: None}}
    assert "re-export" in check.remediation
    # the same two "nodes" with the same settings: contract complete, nothing differs
    contract = grades.grade_contract(records)
    assert contract.status == "OK", contract.values["problems"]
    assert [r["contract"]["GROUP_RANK"] for r in records] == ["0", "1"]


def test_identical_ranks_are_ok(tmp_path, no_leftovers):
    checks, records, job = local.run_env_contract(tmp_path, nproc=2, backend="gloo", timeout_s=30)
    assert [c.status for c in checks] == ["OK", "OK"], [c.line() for c in checks]
    assert [r["contract"]["RANK"] for r in records] == ["0", "1"]
    assert "gloo" in checks[1].values["device_binding"]


def test_contract_faults_are_named(tmp_path):
    base = [{"hostname": "n", "backend": "nccl", "dist_world_size": 2,
             "contract": {"RANK": str(i), "LOCAL_RANK": str(i), "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2",
                          "GROUP_RANK": "0", "MASTER_ADDR": "n", "MASTER_PORT": "29500"},
             "gpu": {"index": i, "uuid": f"GPU-{i}"}} for i in range(2)]
    assert grades.grade_contract(base).status == "OK"
    same_gpu = copy.deepcopy(base)
    same_gpu[1]["gpu"]["uuid"] = "GPU-0"
    check = grades.grade_contract(same_gpu)
    assert check.status == "FAIL" and "same GPU" in check.title
    dup = copy.deepcopy(base)
    dup[1]["contract"]["RANK"] = "0"
    assert "RANK values [0, 0]" in grades.grade_contract(dup).title
    no_group = copy.deepcopy(base)
    for r in no_group:
        r["contract"]["GROUP_RANK"] = None
    assert grades.grade_contract(no_group).status == "WARN"


def test_corrupt_rank_fails_the_correctness_check(tmp_path, no_leftovers):
    checks, rows, job = local.run_collectives(tmp_path, nproc=2, backend="gloo", timeout_s=30, min_bytes=1 << 15,
                                             max_bytes=1 << 16, check_elements=4096, corrupt_rank=1)
    correctness, bandwidth, ranks = checks
    assert ranks.id == "straggler.ranks" and len(ranks.values["ranks"]) == 2
    assert correctness.status == "FAIL"
    assert correctness.values["all_reduce"]["wrong_per_rank"] == [1, 1]  # one bad input poisons every rank's sum
    assert correctness.values["broadcast(root=0)"]["wrong_per_rank"] == [0, 0]  # root 0 sent good data
    assert correctness.values["broadcast(root=1)"]["wrong_per_rank"] == [1, 1]
    # Every rank sees the wrong sum and exits 1; torchrun SIGTERMs whichever rank is still
    # finishing when the first one exits, so only "some rank exited 1, none exited 0" is certain.
    codes = [r.exit_code for r in job.ranks.values()]
    assert 1 in codes and 0 not in codes, codes
    assert {r["op"] for r in rows} == {"all_reduce", "all_gather", "reduce_scatter", "broadcast"}
    assert bandwidth.status == "OK" and all(r["busbw_GBps"] > 0 for r in rows)


def test_bandwidth_threshold_warns(tmp_path):
    data = {"world_size": 2, "backend": "gloo",
            "sweep": [{"op": "all_reduce", "bytes": 1 << k, "time_s": (1 << k) / 1e9} for k in range(15, 20)]}
    ok, rows = grades.grade_bandwidth(data, min_busbw_gbps=0.5)
    assert ok.status == "OK" and ok.values["plateau_busbw_GBps"]["all_reduce"] == 1.0
    warn, _ = grades.grade_bandwidth(data, min_busbw_gbps=2.0)
    assert warn.status == "WARN" and "below 2.0 GB/s" in warn.title


def test_a_hung_job_becomes_a_fail_naming_the_stacks(no_leftovers):
    job = jobs.run_job(SCENARIOS / "toy_job.py", ["--mode", "hang", "--steps", "50", "--step-s", "0.2"], nproc=2,
                       timeout_s=60, stall_s=4, heartbeat=r"step \d+", verbose=False)
    check = local.job_failure("x", "t", job)
    assert check.status == "FAIL" and check.values["hung_ranks"] == [0, 1]
    assert "all_reduce" in check.values["stacks"][0]
    assert "stacks" in check.remediation
