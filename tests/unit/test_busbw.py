"""busbw arithmetic against the nccl-tests definitions (doc/PERFORMANCE.md)."""

from __future__ import annotations

import pytest

from helpers import busbw


@pytest.mark.parametrize("n", [1, 2, 4, 8, 16])
def test_bus_factors_match_nccl_tests(n):
    assert busbw.bus_factor("all_reduce", n) == pytest.approx(2 * (n - 1) / n)
    assert busbw.bus_factor("all_gather", n) == pytest.approx((n - 1) / n)
    assert busbw.bus_factor("reduce_scatter", n) == pytest.approx((n - 1) / n)
    assert busbw.bus_factor("broadcast", n) == 1.0


def test_worked_example_8_ranks():
    # 1 GiB all_reduce in 10 ms on 8 ranks: algbw 107.37 GB/s, busbw = algbw * 14/8
    size, t = 1 << 30, 0.010
    assert busbw.algbw_gbps(size, t) == pytest.approx(107.374182, rel=1e-6)
    assert busbw.busbw_gbps("all_reduce", 8, size, t) == pytest.approx(107.374182 * 1.75, rel=1e-6)
    assert busbw.busbw_gbps("all_gather", 8, size, t) == pytest.approx(107.374182 * 0.875, rel=1e-6)


def test_annotate_adds_both_bandwidths():
    rows = busbw.annotate([{"op": "all_reduce", "bytes": 2e9, "time_s": 1.0}], 2)
    assert rows[0]["algbw_GBps"] == pytest.approx(2.0)
    assert rows[0]["busbw_GBps"] == pytest.approx(2.0)  # factor 2*(1)/2 = 1


def test_plateau_ignores_latency_bound_sizes():
    sizes = [2**k for k in range(15, 29)]
    bw = [0.01, 0.02, 0.05, 0.1, 0.3, 0.8, 1.2, 1.5, 1.55, 1.6, 1.5, 1.58, 1.62, 1.57]
    p = busbw.plateau(sizes, bw)
    mean_all = sum(bw) / len(bw)
    assert p["plateau_GBps"] == pytest.approx(1.575)  # median of the 4 largest sizes
    assert mean_all < 0.62 * p["plateau_GBps"]  # nccl-tests' average (0.96) understates it by ~40 %
    assert p["peak_GBps"] == 1.62
    assert p["half_plateau_bytes"] == 2**20  # first size at >= half the plateau (0.8 >= 0.7875)


def test_plateau_resists_one_outlier():
    p = busbw.plateau([1, 2, 4, 8], [1.0, 1.0, 9.0, 1.0], fraction=1.0)
    assert p["plateau_GBps"] == 1.0


@pytest.mark.parametrize(
    ("call", "field"),
    [(lambda: busbw.bus_factor("alltoall", 2), "op"), (lambda: busbw.bus_factor("all_reduce", 0), "n"),
     (lambda: busbw.algbw_gbps(1, 0), "time_s"), (lambda: busbw.plateau([], []), "sizes"),
     (lambda: busbw.plateau([1], [1], fraction=0), "fraction")],
)
def test_bad_input_names_the_field(call, field):
    with pytest.raises(ValueError, match=field):
        call()
