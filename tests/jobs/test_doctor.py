"""The hang doctor on real hung jobs (gloo, CPU)."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from support import ROOT, SCENARIOS

from helpers import doctor, jobs, procs

TOY = SCENARIOS / "toy_job.py"
HANG = ["--steps", "50", "--step-s", "0.1"]


def _hung(mode: str, nproc: int = 2, trace: bool = True) -> jobs.JobResult:
    args = ["--mode", mode, *HANG] + (["--trace"] if trace else [])
    r = jobs.run_job(TOY, args, nproc=nproc, timeout_s=60, stall_s=4, heartbeat=r"step \d+", verbose=False)
    assert r.hung, r.summary()
    return r


def test_stuck_rank_is_named_with_collective_seq_and_line(no_leftovers):
    v = doctor.diagnose_job(_hung("hang"))
    assert v.diverged == [1] and v.waiting == [0]
    assert (v.collective, v.seq) == ("all_reduce", 2)
    assert v.site.startswith("toy_job.py:")
    src = TOY.read_text().splitlines()
    assert "dist.all_reduce(value)" in src[int(v.site.split(":")[1]) - 1]
    stuck = v.states[1]
    assert stuck.collective is None and "time.sleep" in src[int(stuck.call_site.split(":")[1]) - 1]
    assert "rank(s) [1] diverged" in v.text


def test_op_mismatch_is_named(no_leftovers):
    v = doctor.diagnose_job(_hung("mismatch"))
    assert v.diverged == [1]
    assert v.states[1].collective == "broadcast" and v.states[1].seq == 2
    assert "rank 1 waits in broadcast #2" in v.text


def test_without_trace_stacks_suffice(no_leftovers):
    v = doctor.diagnose_job(_hung("hang", nproc=3, trace=False))
    assert v.diverged == [1] and v.waiting == [0, 2] and v.seq is None
    assert v.collective == "all_reduce"


def test_saved_job_dir_gives_the_same_verdict(no_leftovers):
    r = _hung("hang")
    out = subprocess.run([sys.executable, "-m", "helpers.cli", "doctor", "--job-dir", str(r.job_dir)],
                         capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0 and "rank(s) [1] diverged" in out.stdout


def test_live_launcher_pid(no_leftovers, tmp_path):
    env = dict(__import__("os").environ, RUNBOOK_JOB_DIR=str(tmp_path), TMPDIR=str(tmp_path))
    cmd = jobs.launcher_argv("torchrun", TOY, ["--mode", "hang", *HANG, "--trace"], nproc=2,
                             log_dir=tmp_path / "logs")[0]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 40
        while time.monotonic() < deadline:  # wait until rank 0 has entered collective #2
            trace = tmp_path / "trace" / "rank0.jsonl"
            if trace.exists() and '"seq":2,"op":"all_reduce","phase":"enter"' in trace.read_text():
                break
            time.sleep(0.3)
        time.sleep(0.5)
        v = doctor.diagnose_pid(proc.pid)
    finally:
        procs.kill_tree([proc.pid], sessions=[proc.pid])
        proc.wait(timeout=10)
    assert v.diverged == [1] and (v.collective, v.seq) == ("all_reduce", 2)


def test_parse_stack_and_errors():
    text = ('Thread 7 (idle): "MainThread"\n    all_reduce (torch/distributed/distributed_c10d.py:3252)\n'
            "    main (train.py:61)\n"
            'Thread 9 (idle): "Thread-1"\n    run (threading.py:10)\n')
    frames = doctor.parse_stack(text)
    assert [f.site for f in frames] == ["distributed_c10d.py:3252", "train.py:61"]
    with pytest.raises(ValueError, match="stacks"):
        doctor.diagnose({})
    with pytest.raises(ValueError, match="pid="):
        doctor.diagnose_pid(2**22 + 12345)
    v = doctor.diagnose({0: text, 1: text})
    assert v.diverged == [] and "no rank of this job diverged" in v.text
