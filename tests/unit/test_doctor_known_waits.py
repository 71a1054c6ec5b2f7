"""The doctor explains a rank that waits outside any collective in a known library wait (PF-jit-lock).

``tests/data/stacks/deepspeed_stale_jit_lock.txt`` is a real ``py-spy dump`` of a rank of the allocation check's
multi-node DeepSpeed smoke test, taken on this project's machine (2026-11-24) while every rank waited on a stale
``~/.cache/torch_extensions/py311_cpu/deepspeed_shm_comm/lock`` left by a killed build the day before.
"""

from __future__ import annotations

from pathlib import Path

from helpers import doctor

STACK = (Path(__file__).resolve().parents[1] / "data" / "stacks" / "deepspeed_stale_jit_lock.txt").read_text()


def test_stale_jit_lock_wait_is_explained():
    verdict = doctor.diagnose({0: STACK, 1: STACK})
    assert "no rank is in a collective" in verdict.text
    assert "JIT build lock" in verdict.text and "host.jit_lock" in verdict.text
    assert "builder.py:613" in verdict.text  # where it waits (the innermost frames outside torch)


def test_no_hint_without_a_known_wait():
    other = STACK.replace("FileBaton.wait", "sleep_for_data")
    assert "JIT build lock" not in doctor.diagnose({0: other}).text
