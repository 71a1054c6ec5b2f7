"""The straggler score (helpers/allocation/straggler.py, issue 22): ratios to the best rank, thresholds, the node named."""

from __future__ import annotations

import pytest

from helpers import plots
from helpers.allocation import grades, straggler


def _row(rank, host, gflops, gbps, gpu=None):
    return {"rank": rank, "host": host, "local_rank": rank % 2, "matmul_gflops": gflops, "memcpy_gbps": gbps,
            "gpu": gpu, "mode": "concurrent", "seconds": 2.0}


def _gpu(i):
    return {"index": i, "pci_bus_id": f"0000:{0x18 + i:02x}:00", "name": "NVIDIA H100 80GB HBM3"}


@pytest.mark.parametrize("gflops, status", [(51000.0, "OK"), (46400.0, "OK"), (44000.0, "WARN"), (35000.0, "FAIL")])
def test_gpu_ranks_against_the_best_rank(gflops, status):
    speed = [_row(0, "n0", 51000.0, 2000.0, _gpu(0)), _row(1, "n0", 51500.0, 2010.0, _gpu(1)),
             _row(2, "n1", gflops, 2005.0, _gpu(0)), _row(3, "n1", 51200.0, 1990.0, _gpu(1))]
    c = straggler.grade_ranks(speed)
    assert c.status == status
    if status != "OK":
        assert c.faulty == ["n1"] and "rank 2 on n1, GPU 0 (0000:18:00)" in c.title
        assert c.values["ranks"][0]["rank"] == 2 and c.values["ranks"][0]["matmul_ratio"] == round(gflops / 51500, 3)
    else:
        assert c.faulty == []


def test_memory_copy_alone_makes_a_straggler_and_one_rank_is_info():
    speed = [_row(0, "a", 10.0, 2.0), _row(1, "b", 10.0, 0.5)]
    c = straggler.grade_ranks(speed)
    assert c.faulty == ["b"] and "memory copy" in c.title and "local rank 1 (CPU)" in c.title
    assert straggler.grade_ranks(speed[:1]).status == "INFO"
    with pytest.raises(ValueError, match="matmul_gflops=0"):
        straggler.score_ranks([_row(0, "a", 0, 1.0), _row(1, "b", 1.0, 1.0)])


def test_node_scores_from_the_pair_matrix():
    m = {"a": {"b": 1.0, "c": 1.0, "d": 0.3}, "b": {"a": 1.0, "c": 0.95, "d": 0.3}, "c": {"a": 1.0, "b": 0.95, "d": 0.32},
         "d": {"a": 0.3, "b": 0.3, "c": 0.32}}
    c = straggler.grade_nodes(m)
    assert c.status == "FAIL" and c.faulty == ["d"] and c.values["scores"]["d"] == 0.3
    assert straggler.grade_nodes({"a": {"b": 1.0}, "b": {"a": 1.0}}).status == "INFO"  # two nodes: one pair


def test_one_node_bandwidth_graded_against_the_expected_figure_and_drawn(tmp_path):
    sizes = [2 ** k for k in range(20, 27)]
    data = {"world_size": 8, "backend": "nccl",
            "sweep": [{"op": "all_reduce", "bytes": b, "time_s": b / (300e9 / 1.75)} for b in sizes]}  # busbw 300 GB/s
    check, rows = grades.grade_bandwidth(data, expected={"GBps": 370.0, "source": "nccl-tests#212", "detail": "H100"})
    assert check.status == "WARN" and check.values["ratio"] == round(300 / 370, 3)
    assert check.values["scope"] == "intra-node" and check.values["plateau_busbw_GBps"]["all_reduce"] == 300.0
    assert grades.grade_bandwidth(data)[0].status == "OK"  # no expected figure: the plateaus only, as before
    png = plots.plot_busbw(rows, tmp_path / "busbw.png", expected=check.values, title="busbw")
    assert png.stat().st_size > 10_000


@pytest.mark.parametrize("share, status", [(0.5, "OK"), (0.3, "WARN"), (0.2, "FAIL")])
def test_cpu_ranks_use_the_thresholds_measured_on_the_lab(share, status):
    c = straggler.grade_ranks([_row(0, "node0", 14.0, 1.5), _row(1, "node1", 14.0 * share, 1.5)])
    assert c.status == status and c.values["warn_below"] == straggler.CPU_WARN_BELOW
    assert "bench_straggler" in c.source


def _matrix_from_medians(medians: dict[str, float]) -> dict[str, dict[str, float]]:
    """A pair matrix whose row of node a holds a's median in every column (each node's median is then exactly its own)."""
    return {a: {b: va for b in medians if b != a} for a, va in medians.items()}


def test_a_spread_across_most_nodes_drains_none():
    """The 8-node lab, healthy, 2 cores shared by 8 nodes (runbook diagnose --tier quick, 2026-11-25): pair medians
    from 0.59 to 1.0 of the best.  Graded against the GPU anchors they named 6 of 8 healthy nodes to drain."""
    scores = {"node0": 0.592, "node1": 1.0, "node2": 0.912, "node3": 0.655, "node4": 0.655, "node5": 0.827,
              "node6": 0.858, "node7": 0.602}
    m = _matrix_from_medians(scores)
    gpu = straggler.grade_nodes(m)
    assert gpu.status == "WARN" and gpu.faulty == [] and "not one straggler" in gpu.title
    cpu = straggler.checks_for_job({"speed": [_row(0, "node0", 10.0, 2.0), _row(1, "node1", 10.0, 2.0)]}, m)[1]
    assert cpu.status == "OK" and cpu.values["warn_below"] == straggler.CPU_WARN_BELOW  # gloo ranks: the CPU figures


def test_one_slow_node_among_many_is_still_named_on_cpu():
    m = _matrix_from_medians({f"n{i}": 1.0 for i in range(7)} | {"n7": 0.1})
    c = straggler.checks_for_job({"speed": [_row(0, "n0", 10.0, 2.0), _row(1, "n7", 10.0, 2.0)]}, m)[1]
    assert c.status == "FAIL" and c.faulty == ["n7"]


def test_one_rank_bandwidth_is_not_graded_and_not_a_warning():
    """A one-GPU node (the H200 of make gpu-check) is healthy: one rank moves nothing over a link."""
    data = {"world_size": 1, "backend": "nccl",
            "sweep": [{"op": "all_reduce", "bytes": b, "time_s": 1e-5} for b in (2 ** 20, 2 ** 24)]}
    check, _ = grades.grade_bandwidth(data)
    assert check.status == "INFO" and "not graded" in check.title and "2 or more ranks" in check.remediation


def test_cpu_ranks_on_a_contended_host_are_not_graded():
    """A clean-clone make test (2 cores, the lab suite beside the main one) saw the one-node job's rank 1 at 0.14 of
    rank 0 while the host's tasks waited for a CPU 69 % of the time: the scheduler, not the node; INFO, no drain."""
    speed = [_row(0, "vm", 22.0, 2.9), _row(1, "vm", 20.0, 0.41)]
    assert straggler.grade_ranks(speed).status == "FAIL"                               # no PSI reading: graded
    busy = straggler.grade_ranks(speed, contention=0.694)
    assert busy.status == "INFO" and busy.faulty == [] and "contended" in busy.title
    assert busy.values["cpu_contention"] == 0.694
    assert straggler.grade_ranks(speed, contention=grades.CPU_CONTENDED / 2).status == "FAIL"  # an idle host grades
    gpus = [_row(0, "n0", 51000.0, 2000.0, _gpu(0)), _row(1, "n0", 30000.0, 2000.0, _gpu(1))]
    assert straggler.grade_ranks(gpus, contention=0.9).status == "FAIL"               # a GPU's speed is no CPU share
