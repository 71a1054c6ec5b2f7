"""helpers.jobdir (the job-directory layout, line tails) and the pure parts of helpers.jobs that use it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import jobs
from helpers.jobdir import JobDir, LineCounter, LineTail


def test_layout_paths(tmp_path):
    d = JobDir(tmp_path)
    assert d.launcher_stdout == tmp_path / "launcher.stdout" and d.job_json == tmp_path / "job.json"
    assert d.rank_stdout(3) == tmp_path / "ranks" / "rank3.stdout" and d.rank_record(0) == tmp_path / "ranks" / "rank0.json"
    assert d.stack(1) == tmp_path / "stacks" / "rank1.txt" and d.trace(1) == tmp_path / "trace" / "rank1.jsonl"
    assert d.torchrun_node_dir(2) == tmp_path / "torchrun" / "node2" and d.node_stderr(1) == tmp_path / "nodes" / "node1.stderr"
    assert not d.ranks_dir.exists()  # naming paths creates nothing
    d.create()
    assert d.ranks_dir.is_dir() and d.tmp_dir.is_dir()


def test_rank_records_live_ranks_and_stacks(tmp_path):
    d = JobDir(tmp_path).create()
    d.rank_record(0).write_text(json.dumps({"rank": 0, "pid": 10, "exit_code": 0}))
    d.rank_record(1).write_text(json.dumps({"rank": 1, "pid": 11}))
    d.ranks_dir.joinpath("rank2.json").write_text("{torn")  # being rewritten: skipped
    assert sorted(d.rank_records()) == [0, 1] and d.live_ranks() == {1: 11}
    assert d.rank_ids() == [0, 1, 2]
    d.stacks_dir.mkdir()
    d.stack(1).write_text("Thread 11")
    assert d.stacks() == {1: d.stack(1)}


def test_from_env(tmp_path, monkeypatch):
    monkeypatch.setenv("RUNBOOK_JOB_DIR", str(tmp_path))
    assert JobDir.from_env().path == tmp_path
    monkeypatch.delenv("RUNBOOK_JOB_DIR")
    assert JobDir.from_env("elsewhere").path == Path("elsewhere")


def test_line_tail_reads_only_new_whole_lines(tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    a.write_text("one\ntw")
    tail = LineTail(lambda: [a, b])  # b does not exist yet
    assert tail.read() == ["one"]
    with open(a, "a") as fh:
        fh.write("o\nthree\n")
    b.write_text("step 1\n")
    assert tail.read() == ["two", "three", "step 1"] and tail.read() == []
    counter = LineCounter(lambda: [a, b], r"^step \d+")
    assert counter.poll() == 1
    with open(b, "a") as fh:
        fh.write("step 2\nstep")
    assert counter.poll() == 2


def test_scenario_paths_and_errors():
    assert jobs.scenario("toy_job") == jobs.SCENARIOS / "toy_job.py" == jobs.scenario("toy_job.py")
    assert (jobs.CONFIGS).is_dir()
    for bad in ("nope", "_common", "../jobs"):
        with pytest.raises(ValueError, match=r"scenario=.*accepted values are .*toy_job"):
            jobs.scenario(bad)


def test_records_of_a_job(tmp_path):
    d = JobDir(tmp_path).create()
    d.launcher_stdout.write_text('[rank 1] group {"world_size": 2}\nnoise\n[rank 0] group {"world_size": 2}\n')
    d.rank_stdout(0).write_text('group {"world_size": 2}\ncontract {"RANK": "0"}\n')
    rank0 = jobs.RankResult(rank=0, pid=1, exit_code=0, stdout_path=d.rank_stdout(0), stderr_path=d.rank_stderr(0))
    job = jobs.JobResult(name="t", job_dir=tmp_path, commands=[], env={}, returncodes=[0], wall_s=0.0, timed_out=False,
                         hung=False, timeout_s=1.0, stall_s=None, ranks={0: rank0})
    assert [r["_shim_rank"] for r in job.records("group")] == [1, 0]
    assert job.records("contract", rank=0) == [{"RANK": "0", "_shim_rank": None}]
    assert jobs.parse_records(job.output, "group") == job.records("group")
    with pytest.raises(ValueError, match="rank=5"):
        job.records("group", rank=5)
    with pytest.raises(ValueError, match="kind"):
        job.records("Group!")
