"""The allocation check attaches the NCCL log interpreter's verdicts to its report on NCCL (issue 15)."""

from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

from helpers.allocation import local

DATA = Path(__file__).resolve().parents[1] / "data" / "nccl"


def _job(tmp_path: Path, log: str) -> SimpleNamespace:
    """A job directory as the runner leaves it, rank 0's stderr holding a real NCCL_DEBUG=INFO log."""
    ranks = tmp_path / "ranks"
    ranks.mkdir(parents=True)
    shutil.copy(DATA / log, ranks / "rank0.stderr")
    (ranks / "rank0.stdout").write_text("step 1\n")
    return SimpleNamespace(job_dir=tmp_path)


def test_nccl_jobs_get_the_interpreters_verdicts(tmp_path):
    found = local.nccl_checks("nccl", _job(tmp_path, "single_node_net_ib.log"), None)
    assert found and all(c.id.startswith("nccl.") for c in found)
    fail = [c for c in found if c.status == "FAIL"]
    assert [c.id for c in fail] == ["nccl.single-node-net-transport"]
    assert fail[0].evidence and fail[0].remediation


def test_gloo_and_silent_logs_add_nothing(tmp_path):
    assert local.nccl_checks("gloo", _job(tmp_path / "a", "single_node_net_ib.log")) == []
    quiet = tmp_path / "b" / "ranks"
    quiet.mkdir(parents=True)
    (quiet / "rank0.stdout").write_text("step 1\nstep 2\n")
    assert local.nccl_checks("nccl", SimpleNamespace(job_dir=tmp_path / "b")) == []


def test_nccl_jobs_log_init_and_net_only(monkeypatch):
    monkeypatch.delenv("NCCL_DEBUG", raising=False)
    monkeypatch.delenv("NCCL_DEBUG_SUBSYS", raising=False)
    assert local.nccl_debug_env("gloo") == {}
    assert local.nccl_debug_env("nccl") == {"NCCL_DEBUG": "INFO", "NCCL_DEBUG_SUBSYS": "INIT,NET"}
    monkeypatch.setenv("NCCL_DEBUG", "TRACE")
    assert local.nccl_debug_env("nccl")["NCCL_DEBUG"] == "TRACE"


def test_a_suspect_from_the_log_is_reported_but_drains_no_node(tmp_path):
    """The drain list is run by an admin: only a verdict whose evidence decides names the node; a suspect (NCCL's IB
    GPU Direct RDMA line, say) is reported with the command that confirms it."""
    from helpers.allocation import operators

    ranks = tmp_path / "s" / "ranks"
    ranks.mkdir(parents=True)
    (ranks / "rank0.stderr").write_text(
        "gpu-07:578:578 [0] NCCL INFO NCCL version 2.27.5+cuda13.0\n"
        "gpu-07:578:578 [0] NCCL INFO NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0'\n")
    found = {c.id: c for c in local.nccl_checks("nccl", SimpleNamespace(job_dir=tmp_path / "s"))}
    gdr = found["nccl.nccl.gdr-disabled"]
    assert gdr.status == "WARN" and gdr.node == "gpu-07" and gdr.faulty == [] and gdr.values["not_drained"]
    assert operators.drain_commands(found.values()) == []
    cause = [c for c in local.nccl_checks("nccl", _job(tmp_path / "c", "single_node_net_ib.log")) if c.status == "FAIL"]
    assert cause[0].values["kind"] == "cause" and cause[0].faulty and operators.drain_commands(cause)
