"""helpers.ddp_math against hand-computed values and Goyal et al. 2017's reference setting (seed D11)."""

from __future__ import annotations

import pytest

from helpers import ddp_math


def test_effective_batch_multiplies_rank_batch_world_and_accumulation():
    assert ddp_math.effective_batch(32, 8) == 256
    assert ddp_math.effective_batch(4, 16, grad_accum_steps=4) == 256


@pytest.mark.parametrize("field,args", [("per_rank_batch", (0, 2)), ("world_size", (8, -1)),
                                        ("grad_accum_steps", (8, 2, 0)), ("world_size", (8, 2.0)),
                                        ("per_rank_batch", (True, 2))])
def test_effective_batch_rejects_bad_input_naming_the_field(field, args):
    with pytest.raises(ValueError, match=field):
        ddp_math.effective_batch(*args)


def test_linear_scaling_matches_goyal_reference():
    # Goyal et al. 2017: lr = 0.1 * kn / 256; k = 32 GPUs of n = 32 images -> 8k batch, lr 3.2
    assert ddp_math.linear_scaled_lr(0.1, 256, 8192) == pytest.approx(3.2)
    assert ddp_math.linear_scaled_lr(0.1, 256, 128) == pytest.approx(0.05)
    with pytest.raises(ValueError, match="base_lr"):
        ddp_math.linear_scaled_lr(0.0, 256, 512)
    with pytest.raises(ValueError, match="base_batch"):
        ddp_math.linear_scaled_lr(0.1, 0, 512)


def test_warmup_rises_linearly_then_holds():
    lrs = [ddp_math.warmup_lr(s, 4, 0.4, 0.1) for s in range(6)]
    assert lrs == pytest.approx([0.1, 0.175, 0.25, 0.325, 0.4, 0.4])
    assert ddp_math.warmup_lr(0, 0, 0.4, 0.1) == 0.4
    with pytest.raises(ValueError, match="step"):
        ddp_math.warmup_lr(-1, 4, 0.4, 0.1)


def test_lr_table_rows():
    rows = ddp_math.lr_scaling_table(0.1, 32, [1, 8, 16, 512], base_batch=256, dataset_size=1000, warmup_epochs=5)
    assert [r["effective_batch"] for r in rows] == [32, 256, 512, 16384]
    assert [r["lr"] for r in rows] == pytest.approx([0.0125, 0.1, 0.2, 6.4])
    assert [r["warmup_steps"] for r in rows] == [0, 0, 10, 5]  # ceil(1000/512)=2 steps/epoch * 5; none when not scaled up
    assert [r["warmup_start_lr"] for r in rows] == pytest.approx([0.0125, 0.1, 0.1, 0.1])
    assert [r["within_validated"] for r in rows] == [True, True, True, False]


def test_lr_table_defaults_to_the_one_rank_run_and_rejects_empty():
    rows = ddp_math.lr_scaling_table(0.1, 32, [1, 2])
    assert [r["lr"] for r in rows] == pytest.approx([0.1, 0.2]) and "warmup_steps" not in rows[0]
    with pytest.raises(ValueError, match="world_sizes"):
        ddp_math.lr_scaling_table(0.1, 32, [])


def test_compare_grads_tolerances():
    ok = ddp_math.compare_grads([1.0, -2.0, 0.0], [1.0 + 1e-6, -2.0, 5e-7])
    assert ok["allclose"] and ok["max_abs_diff"] == pytest.approx(1e-6) and ok["n"] == 3
    bad = ddp_math.compare_grads([1.0, 2.0], [1.0, 1.0])
    assert not bad["allclose"] and bad["max_rel_diff"] == pytest.approx(0.5)
    with pytest.raises(ValueError, match="length"):
        ddp_math.compare_grads([1.0], [1.0, 2.0])
