"""_fsdp.py, the shared module of the chapter-04 FSDP scenarios: byte accounting, the toy model, collective-trace sizes."""

from __future__ import annotations

import pytest
import torch

from helpers.scenarios import _fsdp


def test_storage_bytes_counts_each_storage_once():
    a = torch.zeros(1000)
    view = a[10:20]
    seen: set[int] = set()
    assert _fsdp.storage_bytes([a, view, {"x": a}], seen) == 4000
    assert _fsdp.storage_bytes(a, seen) == 0  # already counted
    assert _fsdp.storage_bytes([torch.zeros(3, dtype=torch.bfloat16), None]) == 6


def test_model_has_the_documented_parameter_count():
    model = _fsdp.make_model(16, 3)
    assert sum(p.numel() for p in model.parameters()) == 3 * (8 * 16 * 16 + 5 * 16)
    assert [n for n, _ in model.named_buffers()] == ["0.scale", "1.scale", "2.scale"]


@pytest.mark.parametrize("op, shapes, dtypes, expected", [
    # all-gather of a 2-way shard: size = gathered output, each rank sends half
    ("_allgather_base_", [[1000], [500], [], []], ["float", "float", "", "Scalar"], (4000, 2, 2000, "float32")),
    # reduce-scatter over 4 ranks in bf16: size = the input, each rank sends 3/4
    ("_reduce_scatter_base_", [[250], [1000], []], ["c10::BFloat16", "c10::BFloat16", ""], (2000, 4, 1500, "bfloat16")),
    # all-reduce with shapes recorded: 2(n-1)/n x size
    ("allreduce_", [[100], []], ["float", ""], (400, 2, 400, "float32")),
])
def test_collective_sizes_follow_nccl_tests(op, shapes, dtypes, expected):
    rec = _fsdp.CollectiveTrace(world_size=2)._describe(op, shapes, dtypes)
    assert (rec["size_bytes"], rec["group_size"], rec["sent_bytes"], rec["dtype"]) == expected


def test_tensor_list_ops_without_shapes_are_unknown_not_zero():
    rec = _fsdp.CollectiveTrace(world_size=2)._describe("allgather_", [[], [], []], ["", "TensorList", ""])
    assert rec["size_bytes"] is None and rec["sent_bytes"] is None
