"""helpers.resume: atomic checkpoints, RNG state capture, the exact state-dict comparison, and the log parsers."""

from __future__ import annotations

import math
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from helpers import checkpoint, resume


def _state(value: float) -> dict:
    return {"step": int(value), "model": {"w": torch.full((3, 2), value), "b": torch.zeros(2)}, "note": "x"}


# --------------------------------------------------------------------------- atomic save / load

def test_save_then_load_round_trips(tmp_path):
    path = checkpoint.save_checkpoint(tmp_path / "sub" / "a.ckpt", _state(1.0))
    back = checkpoint.load_checkpoint(path)
    assert back["step"] == 1 and back["note"] == "x"
    assert checkpoint.compare_state_dicts(_state(1.0)["model"], back["model"]).equal
    assert not list(path.parent.glob(".a.ckpt.tmp-*"))


def test_failure_before_replace_leaves_previous_checkpoint_intact(tmp_path, monkeypatch):
    path = tmp_path / "a.ckpt"
    checkpoint.save_checkpoint(path, _state(1.0))

    def refuse(src, dst):
        raise OSError("simulated crash just before os.replace")

    monkeypatch.setattr(checkpoint.os, "replace", refuse)
    with pytest.raises(OSError, match="before os.replace"):
        checkpoint.save_checkpoint(path, _state(2.0))
    monkeypatch.undo()
    assert checkpoint.load_checkpoint(path)["step"] == 1
    assert not list(tmp_path.glob(".a.ckpt.tmp-*")), "the failed write must remove its temporary file"


def _dies_halfway(state, fh):
    """A serializer that writes part of a checkpoint, then fails (a crash mid-write)."""
    fh.write(b"PK\x03\x04 half a zip archive")
    fh.flush()
    raise KeyboardInterrupt("simulated crash mid-write")


def test_failure_mid_write_leaves_previous_checkpoint_intact(tmp_path, monkeypatch):
    path = tmp_path / "a.ckpt"
    checkpoint.save_checkpoint(path, _state(1.0))
    monkeypatch.setattr(checkpoint, "_serialize", _dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.save_checkpoint(path, _state(2.0))
    monkeypatch.undo()
    assert checkpoint.load_checkpoint(path)["step"] == 1
    assert not list(tmp_path.glob(".a.ckpt.tmp-*"))


def test_naive_save_is_torn_by_the_same_failure(tmp_path, monkeypatch):
    path = tmp_path / "a.ckpt"
    checkpoint.naive_save(path, _state(1.0))
    monkeypatch.setattr(checkpoint, "_serialize", _dies_halfway)
    with pytest.raises(KeyboardInterrupt):
        checkpoint.naive_save(path, _state(2.0))
    monkeypatch.undo()
    with pytest.raises(RuntimeError):
        checkpoint.load_checkpoint(path)


def test_save_rejects_a_non_mapping(tmp_path):
    with pytest.raises(ValueError, match="state"):
        checkpoint.save_checkpoint(tmp_path / "a.ckpt", [1, 2])  # type: ignore[arg-type]


def test_load_missing(tmp_path):
    assert checkpoint.load_checkpoint(tmp_path / "none.ckpt", missing_ok=True) is None
    with pytest.raises(FileNotFoundError):
        checkpoint.load_checkpoint(tmp_path / "none.ckpt")


def test_crash_mid_write_rejects_bad_size(tmp_path):
    with pytest.raises(ValueError, match="die_after_bytes"):
        resume.crash_mid_write(tmp_path / "c.ckpt", atomic=True, die_after_bytes=0)


# --------------------------------------------------------------------------- RNG state

def _draws() -> tuple:
    return torch.rand(3).tolist(), random.random(), float(np.random.normal())


def test_rng_state_round_trips_through_a_weights_only_checkpoint(tmp_path):
    torch.manual_seed(1)
    random.seed(1)
    np.random.seed(1)
    _draws()
    path = checkpoint.save_checkpoint(tmp_path / "rng.ckpt", {"rng": [checkpoint.rng_state()]})
    expected = _draws()
    _draws()
    checkpoint.set_rng_state(checkpoint.load_checkpoint(path)["rng"][0])
    assert _draws() == expected


def test_set_rng_state_names_missing_keys():
    with pytest.raises(ValueError, match="numpy"):
        checkpoint.set_rng_state({"torch": torch.get_rng_state(), "python": list(random.getstate())})


# --------------------------------------------------------------------------- exact comparison

def test_compare_equal_is_exact_and_zero():
    a = {"w": torch.randn(4, 4), "opt": {"state": [{"exp_avg": torch.ones(2)}], "lr": 0.1}}
    b = {"w": a["w"].clone(), "opt": {"state": [{"exp_avg": torch.ones(2)}], "lr": 0.1}}
    d = checkpoint.compare_state_dicts(a, b)
    assert d.equal and d.max_abs_diff == 0.0 and d.first == "" and d.compared == 3
    assert "EQUAL" in str(d)


def test_compare_names_the_first_differing_tensor_and_its_max_diff():
    a = {"0.weight": torch.zeros(3), "0.bias": torch.zeros(2), "1.weight": torch.zeros(2)}
    b = {"0.weight": torch.zeros(3), "0.bias": torch.tensor([0.0, 1e-7]), "1.weight": torch.tensor([0.0, -0.25])}
    d = checkpoint.compare_state_dicts(a, b)
    assert not d.equal and d.differing == ["0.bias", "1.weight"] and d.first == "0.bias"
    assert d.first_max_abs_diff == pytest.approx(1e-7) and d.max_abs_diff == 0.25
    assert "first: 0.bias" in str(d)


def test_compare_is_bitwise():
    nan = float("nan")
    assert checkpoint.compare_state_dicts({"x": torch.tensor([nan, 1.0])}, {"x": torch.tensor([nan, 1.0])}).equal
    signed = checkpoint.compare_state_dicts({"x": torch.tensor([0.0])}, {"x": torch.tensor([-0.0])})
    assert not signed.equal and signed.first == "x" and signed.first_max_abs_diff == 0.0
    one_nan = checkpoint.compare_state_dicts({"x": torch.tensor([nan])}, {"x": torch.tensor([1.0])})
    assert not one_nan.equal and math.isinf(one_nan.first_max_abs_diff)


def test_compare_shape_dtype_and_missing_keys():
    assert math.isinf(checkpoint.compare_state_dicts({"x": torch.zeros(3)}, {"x": torch.zeros(2)}).first_max_abs_diff)
    assert not checkpoint.compare_state_dicts({"x": torch.zeros(2)}, {"x": torch.zeros(2, dtype=torch.float64)}).equal
    d = checkpoint.compare_state_dicts({"x": torch.zeros(1)}, {"x": torch.zeros(1), "y": torch.ones(1)})
    assert not d.equal and d.only_in_b == ["y"] and d.first == "y" and math.isinf(d.max_abs_diff)
    assert not checkpoint.compare_state_dicts({"x": torch.zeros(1)}, {"x": 0.0}).equal


def test_compare_rejects_non_mappings():
    with pytest.raises(ValueError, match="b="):
        checkpoint.compare_state_dicts({}, [torch.zeros(1)])  # type: ignore[arg-type]


# --------------------------------------------------------------------------- arguments and log parsing

def test_parse_omit():
    assert checkpoint.parse_omit("rng, scheduler,rng") == ("scheduler", "rng")
    assert checkpoint.parse_omit(None) == () and checkpoint.parse_omit("") == ()
    assert checkpoint.parse_omit(["epoch"]) == ("epoch",)
    with pytest.raises(ValueError, match="omit.*accepted values are model, optimizer"):
        checkpoint.parse_omit("rngs")


def test_training_args_validate_their_fields():
    args = resume.training_args(steps=24, crash_at=19, ckpt=Path("c.ckpt"), ckpt_every=8, omit=["rng"])
    assert args[:4] == ["--steps", "24", "--micro", "4"] and "--omit" in args and "rng" in args
    for bad in (dict(steps=0), dict(steps=4, crash_at=4), dict(steps=4, micro=0), dict(steps=4, omit=["lr"])):
        with pytest.raises(ValueError):
            resume.training_args(**bad)


def test_check_resume_needs_exactly_one_interruption(tmp_path):
    with pytest.raises(ValueError, match="exactly one"):
        resume.check_resume(tmp_path, steps=4, ckpt_every=2)
    with pytest.raises(ValueError, match="reference"):
        resume.check_variants(tmp_path, ["rng"], steps=4, ckpt_every=2, crash_at=1)


def test_parse_steps_and_epoch_coverage():
    text = "\n".join([
        "[rank 0] fresh start at step 0 (no checkpoint yet)",
        "step 0 restart=0 world_size=1 epoch=0 pos=0 global_batch=2 samples_per_rank=2 lr=0.005 lr_rule=0.005 loss=0.5 ids=0-1",
        "[rank 0] step 1 restart=0 world_size=2 epoch=0 pos=1 global_batch=4 samples_per_rank=2 lr=0.005 lr_rule=0.01 loss=0.4 ids=1-2-4-5",
        "step 2 restart=1 world_size=2 epoch=1 pos=0 global_batch=4 samples_per_rank=2 lr=0.0025 lr_rule=0.005 loss=0.3 ids=0-1-2-3",
    ])
    steps = resume.parse_steps(text)
    assert [s["step"] for s in steps] == [0, 1, 2] and steps[1]["world_size"] == 2 and steps[1]["lr_rule"] == 0.01
    assert steps[0]["ids"] == "0-1" and steps[2]["restart"] == 1
    cover = resume.epoch_coverage(steps, dataset_size=6)
    assert cover[0] == {"steps": 2, "slots": 6, "distinct": 5, "twice_or_more": 1, "never": 1}
    assert cover[1]["never"] == 2
    with pytest.raises(ValueError, match="dataset_size"):
        resume.epoch_coverage(steps, dataset_size=0)


def test_elastic_commands(tmp_path):
    a, b = resume.elastic_commands("t", 29999, tmp_path / "t.ckpt", tmp_path / "rank0.stdout", steps=8, micro=2,
                                   scale="pinned", max_world=2, step_sleep=0.1, join_after_step=2)
    assert Path(a[0]).name == "torchrun" and "--nnodes=1:2" in a and "--rdzv-endpoint=127.0.0.1:29999" in a
    assert any(x.startswith("--rdzv-conf=") and "read_timeout=" in x for x in a)
    assert b[:2] == ["bash", "-c"] and '"^step 2 "' in b[2] and b[4:] == a
    with pytest.raises(ValueError, match="scale"):
        resume.elastic_commands("t", 1, tmp_path, tmp_path, steps=1, micro=1, scale="max", max_world=2,
                                step_sleep=0, join_after_step=0)




def test_last_attempts_keeps_the_redone_step():
    """A line printed before a checkpoint that never landed is superseded by the step's redo after the restart."""
    records = [
        {"step": 3, "restart": 0, "world_size": 1, "ids": "0-1", "agent": "A"},
        {"step": 4, "restart": 0, "world_size": 1, "ids": "2-3", "agent": "A"},  # killed before its checkpoint landed
        {"step": 4, "restart": 1, "world_size": 2, "ids": "4-5", "agent": "B"},
        {"step": 4, "restart": 1, "world_size": 2, "ids": "4-5", "agent": "A"},  # every rank prints every step
        {"step": 5, "restart": 1, "world_size": 2, "ids": "6-7", "agent": "A"},
    ]
    kept = resume.last_attempts(reversed(records))
    assert [(r["step"], r["restart"]) for r in kept] == [(3, 0), (4, 1), (5, 1)] and kept[1]["ids"] == "4-5"
    assert resume.last_attempts([{"step": 0, "ids": "0"}]) == [{"step": 0, "ids": "0"}]
