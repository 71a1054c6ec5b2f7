"""The byte accounting, collective-trace parsing and chapter-04 tables (no distributed job needed)."""

from __future__ import annotations

import pytest

from helpers import fsdp_report, memory


def _sharding_result(strategy="full_shard", mesh=(2,), world=2, n_params=1000):
    per_rank = 16 * n_params // (mesh[-1] if strategy != "no_shard" else 1)
    moment = {"params": per_rank // 4, "grads": per_rank // 4, "moments": per_rank // 2, "compute": 0, "total": per_rank}
    ranks = {str(r): {"after_forward": moment, "after_backward": moment, "after_step": moment,
                      "collectives": {"_allgather_base_": {"count": 2, "size_bytes": 8, "sent_bytes": 4,
                                                           "dtypes": ["float32"]}}} for r in range(world)}
    return {"world_size": world, "strategies": [{"strategy": strategy, "n_params": n_params, "mesh": list(mesh),
                                                 "ranks": ranks}]}


def test_compare_fsdp_measured_matches_the_estimate():
    rows = memory.compare_fsdp_measured(_sharding_result())
    assert len(rows) == 2 and all(r["error"] == 0 for r in rows)
    assert rows[0]["stage"] == "full_shard N=2" and rows[0]["formula"] == "16Ψ/N"
    hyb = memory.compare_fsdp_measured(_sharding_result("hybrid_shard", (2, 2), 4))
    assert hyb[0]["estimated_total"] == 16 * 1000 // 2  # sharded over the 2 ranks of a node


def test_compare_fsdp_measured_names_bad_input():
    with pytest.raises(ValueError, match="strategy='zero9'"):
        memory.compare_fsdp_measured(_sharding_result("zero9"))
    with pytest.raises(ValueError, match="moment="):
        memory.compare_fsdp_measured(_sharding_result(), moment="mid_step")


def test_shard_grad_op_estimate_includes_the_unsharded_copy_in_fp32_too():
    est = memory.estimate(1000, 2, "fsdp_shard_grad_op", precision="fp32")
    assert est.compute_copy == 4000 and est.total == 16 * 1000 // 2


def test_collective_rows_and_table():
    rows = fsdp_report.collective_rows(_sharding_result())
    assert rows == [{"strategy": "full_shard", "mesh": (2,), "op": "all_gather", "count": 2, "dtypes": ["float32"],
                     "size_bytes": 8, "sent_bytes": 4}]
    assert "all_gather" in fsdp_report.format_collectives(rows)
