"""DeepSpeed's CPU all-reduce segments in /dev/shm (helpers.jobdir): their names, their removal by a rank and by the runner."""

from __future__ import annotations

import os
from pathlib import Path

from helpers import jobdir, jobs


def test_name_follows_deepspeed_shm_initialize():
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29511"}
    assert jobdir.deepspeed_shm_name(1, env) == f"deepspeed_allreduce_buffer_{os.getuid()}_127.0.0.1_29511_1"
    assert jobdir.deepspeed_shm_name(0, {"MASTER_PORT": "1"}) is None


def test_rank_removes_only_its_own_segment(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29512")
    mine, peer = (tmp_path / jobdir.deepspeed_shm_name(r) for r in (0, 1))
    mine.write_bytes(b"x")
    peer.write_bytes(b"x")
    assert jobdir.remove_deepspeed_shm(0, str(tmp_path)) is True
    assert not mine.exists() and peer.exists()
    assert jobdir.remove_deepspeed_shm(0, str(tmp_path)) is False


def test_runner_removes_the_segments_of_its_port(tmp_path: Path):
    env = {"MASTER_ADDR": "127.0.0.1"}
    for port in ("29500", "31000"):
        for rank in range(2):
            (tmp_path / jobdir.deepspeed_shm_name(rank, {**env, "MASTER_PORT": port})).write_bytes(b"x")
    removed = jobs.remove_deepspeed_segments(["--master_port", "31000"], 2, str(tmp_path))
    assert sorted(removed) == sorted(jobdir.deepspeed_shm_name(r, {**env, "MASTER_PORT": "31000"}) for r in range(2))
    assert len(jobs.remove_deepspeed_segments([], 3, str(tmp_path))) == 2  # the launcher's default port 29500
    assert not list(tmp_path.iterdir())
