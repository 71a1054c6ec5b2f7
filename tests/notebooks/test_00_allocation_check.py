"""The allocation check end to end: `runbook diagnose` executes notebook 00 with papermill."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from support import ROOT, assert_outputs_reproduce, notebook_outputs

from helpers.allocation import grades

RUNBOOK = [sys.executable, "-m", "helpers.cli", "diagnose"]
EXPECTED = ["env.diff", "launcher.contract", "collectives.correctness", "collectives.bandwidth", "straggler.ranks", "host.port",
            "host.shm", "host.interfaces", "host.socket_ifname", "host.jit_lock", "gpu.health", "smoke.01_single", "smoke.02_ddp",
            "smoke.03_deepspeed_zero1"]


def _run(tmp_path: Path, *extra: str) -> tuple[subprocess.CompletedProcess, Path]:
    proc = subprocess.run([*RUNBOOK, "--out-dir", str(tmp_path), *extra], cwd=ROOT, capture_output=True,
                          text=True, timeout=900)
    dirs = [d for d in tmp_path.iterdir() if d.is_dir()]
    assert len(dirs) == 1, (proc.stdout, proc.stderr)
    return proc, dirs[0]


@pytest.mark.lab_process  # ~3 min: make test runs it beside the lab tests (Makefile)
def test_diagnose_on_cpu_writes_an_actionable_report(tmp_path, no_leftovers):
    proc, report_dir = _run(tmp_path)
    # the book's chapter 00 (and the reference comparison below): this run's executed copy, beside the other chapters'
    executed = ROOT / "build" / "executed" / "00_allocation_check.ipynb"
    if (report_dir / "00_allocation_check.ipynb").is_file():
        executed.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(report_dir / "00_allocation_check.ipynb", executed)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    data = json.loads((report_dir / "report.json").read_text())
    by_id = {c["id"]: c for c in data["checks"]}
    assert list(by_id) == EXPECTED
    for cid in ("env.diff", "launcher.contract", "collectives.correctness", "smoke.01_single", "smoke.02_ddp",
                "smoke.03_deepspeed_zero1"):
        assert by_id[cid]["status"] == "OK", by_id[cid]
    # gloo's bandwidth is graded unless this run's own PSI reading says the host's CPUs were contended (make test runs
    # this beside other jobs on 2 cores): then INFO with the reading, never a WARN that is noise
    bw = by_id["collectives.bandwidth"]
    contended = (bw["values"]["cpu_contention"] or 0) > grades.CPU_CONTENDED
    assert bw["status"] == "OK" or (bw["status"] == "INFO" and contended and "not_graded" in bw["values"]), bw
    assert all(c["status"] in ("OK", "INFO", "WARN", "FAIL") and c["source"] for c in data["checks"])
    # no GPU here: the GPU health check (NVML) says so as INFO, never a pretend result (issue 22)
    assert by_id["gpu.health"]["status"] == "INFO" and "no GPU on this node" in by_id["gpu.health"]["title"]
    assert by_id["collectives.bandwidth"]["values"]["sizes_bytes"] == [32 << 10, 256 << 20]
    assert set(by_id["collectives.bandwidth"]["values"]["plateau_busbw_GBps"]) == {
        "all_reduce", "all_gather", "reduce_scatter", "broadcast"}
    assert all(v > 0 for v in by_id["collectives.bandwidth"]["values"]["plateau_busbw_GBps"].values())
    smoke = by_id["smoke.02_ddp"]["values"]
    assert smoke["world_size"] == 2 and smoke["steps"] == 100 and smoke["checkpoint_reload"] is True
    assert by_id["smoke.03_deepspeed_zero1"]["values"]["zero_stage"] == 1
    for line in ("[OK]   env.diff", "[OK]   smoke.03_deepspeed_zero1"):
        assert line in proc.stdout
    for name in ("report.md", "busbw.png", "00_allocation_check.ipynb"):
        assert (report_dir / name).is_file(), name
    assert notebook_outputs(report_dir / "00_allocation_check.ipynb")[0] == []
    assert_outputs_reproduce(executed)
    assert not (report_dir / "checkpoints" / "03").exists()
    # papermill never writes back into notebooks/
    assert notebook_outputs(ROOT / "notebooks" / "00_allocation_check.ipynb")[0] == []


@pytest.mark.lab_process  # ~3 min: make test runs it beside the lab tests (Makefile)
def test_a_corrupting_rank_makes_diagnose_exit_1(tmp_path, no_leftovers):
    proc, report_dir = _run(tmp_path, "--max-bytes", "65536", "-p", "RUN_SMOKE", '""', "-p", "CORRUPT_RANK", "1")
    assert proc.returncode == 1, proc.stdout + proc.stderr
    data = json.loads((report_dir / "report.json").read_text())
    assert data["status"] == "FAIL"
    bad = [c for c in data["checks"] if c["status"] == "FAIL"]
    assert [c["id"] for c in bad] == ["collectives.correctness"]
    assert "[FAIL] collectives.correctness" in proc.stdout and "->" in proc.stdout


def test_bad_nproc_is_refused():
    proc = subprocess.run([*RUNBOOK, "--nproc", "0"], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2 and "--nproc=0" in proc.stderr


@pytest.mark.lab  # builds the lab: make test runs it in the lab's pytest process (tests/conftest.py)
def test_diagnose_across_lab_nodes_names_the_mtu_black_hole(tmp_path, no_leftovers):
    """With PREFLIGHT_NODES the allocation check adds the network pre-flight; a black hole is a FAIL naming the nodes."""
    import pytest

    from helpers import netlab

    ok, reason = netlab.lab_available()
    if not ok:
        pytest.skip(f"network lab unavailable: {reason}")
    with netlab.Lab(nodes=2, name="rbdiag") as lab:
        lab.set_mtu("all", 9000)  # both endpoints at 9000, the bridge side at 1500 (MN4)
        proc, report_dir = _run(tmp_path, "--max-bytes", "65536", "-p", "RUN_SMOKE", '""',
                                "-p", "PREFLIGHT_NODES", '"node0,node1"', "-p", "PREFLIGHT_RUNNER", '"lab"',
                                "-p", "PREFLIGHT_LAB", '"rbdiag"')
    assert proc.returncode == 1, proc.stdout + proc.stderr
    data = json.loads((report_dir / "report.json").read_text())
    net = {c["id"]: c for c in data["checks"] if c["id"].startswith("net.")}
    assert net["net.mtu.node1"]["status"] == "FAIL" and "black hole" in net["net.mtu.node1"]["title"]
    assert set(net["net.mtu.node1"]["faulty"]) == {"node0", "node1"}
    assert all(c["status"] == "OK" for cid, c in net.items() if cid.startswith("net.node."))
    assert "[FAIL] net.mtu.node1" in proc.stdout
