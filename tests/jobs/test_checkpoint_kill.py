"""helpers.resume's atomic save against a writer process SIGKILLed mid-write (a real process, hence the jobs layer)."""

from __future__ import annotations

import pytest
import torch

from helpers import checkpoint, resume


def _state(value: float) -> dict:
    return {"step": int(value), "model": {"w": torch.full((3, 2), value), "b": torch.zeros(2)}, "note": "x"}


@pytest.mark.parametrize("atomic", [False, True])
def test_a_process_killed_mid_write(tmp_path, atomic):
    r = resume.crash_mid_write(tmp_path / "c.ckpt", atomic=atomic, die_after_bytes=4096)
    assert r.writer_exit == 137
    if atomic:
        assert r.loaded_step == 1 and r.load_error == "" and r.bytes_on_disk > 4096
        assert len(r.leftovers) == 1  # the dead writer could not clean up...
        checkpoint.save_checkpoint(tmp_path / "c.ckpt", _state(3.0))
        assert not list(tmp_path.glob(".c.ckpt.tmp-*"))  # ...the next save does
    else:
        assert r.loaded_step is None and r.bytes_on_disk == 4096
        assert "failed finding central directory" in r.load_error
