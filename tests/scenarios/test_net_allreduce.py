"""net_allreduce.py (chapter 06, MN2-MN4): the size parser and the rank-log reader, on canned input."""

from __future__ import annotations

import pytest

from helpers.scenarios import net_allreduce


def test_sizes_parse_binary_and_decimal_units():
    assert net_allreduce.parse_sizes("4KiB, 64MiB,1GiB") == [4096, 64 * 2**20, 2**30]
    assert net_allreduce.parse_sizes("4096,1MB") == [4096, 10**6]
    with pytest.raises(ValueError, match="--sizes"):
        net_allreduce.parse_size("4 parsecs")


def test_read_log_reads_a_failed_and_a_passing_rank():
    failed = net_allreduce.read_log(
        "[rank 1] host node1: GLOO_SOCKET_IFNAME unset: gloo uses hostname 'node1' -> 10.77.0.11 (eth0)\n"
        "[rank 1] init done in 0.09 s: rank 1 of 2\n"
        "[rank 1] step 0 all_reduce 4KiB ok in 0.010 s\n"
        "[rank 1] gloo transport: 10.77.0.11 (eth0) -> 10.77.0.10\n"
        "[rank 1] step 0 all_reduce 64MiB FAILED after 5.04 s: RuntimeError: [x.cc:78] Timed out waiting 5000ms "
        "for recv operation to complete\n")
    assert failed["host"] == "node1" and failed["init_s"] == 0.09 and failed["failed_after"] == 5.04
    assert failed["results"] == {"4KiB": {"status": "ok", "seconds": 0.01, "step": 0},
                                 "64MiB": {"status": "FAILED", "seconds": 5.04, "step": 0}}
    assert failed["error"].startswith("RuntimeError: [x.cc:78] Timed out waiting 5000ms")
    assert failed["transport"] == ["10.77.0.11 (eth0) -> 10.77.0.10"] and not failed["done"]
    init = net_allreduce.read_log("[rank 0] init FAILED after 15.03 s: RuntimeError: Connect timeout [none]\n")
    assert init["failed_after"] == 15.03 and init["error"] == "RuntimeError: Connect timeout [none]" and not init["results"]
    assert net_allreduce.read_log("[rank 0] done\n")["done"]
