"""The hang doctor reads torch's own debug server (``torch.distributed.debug``) beside py-spy, on a real hung job (gloo)."""

from __future__ import annotations

import os
import subprocess
import time

from support import SCENARIOS

from helpers import doctor, hostinfo, jobs, procs

TOY = SCENARIOS / "toy_job.py"


def test_debug_server_stacks_match_py_spy(no_leftovers, tmp_path):
    env = dict(os.environ, RUNBOOK_JOB_DIR=str(tmp_path), TMPDIR=str(tmp_path), RUNBOOK_BACKEND="gloo")
    args = ["--mode", "hang", "--steps", "50", "--step-s", "0.1", "--trace", "--debug-server", str(hostinfo.free_port())]
    cmd = jobs.launcher_argv("torchrun", TOY, args, nproc=2, log_dir=tmp_path / "logs")[0]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # rank 0 has entered collective #2 (rank 1 sleeps instead)
            trace = tmp_path / "trace" / "rank0.jsonl"
            if trace.exists() and '"seq":2,"op":"all_reduce","phase":"enter"' in trace.read_text():
                break
            time.sleep(0.3)
        time.sleep(0.5)
        ranks = doctor.rank_processes(proc.pid)
        served = doctor.debug_server_stacks(next(iter(ranks.values())).environ(), sorted(ranks))
        spied = {r: procs.py_spy_dump(p.pid) for r, p in ranks.items()}
    finally:
        procs.kill_tree([proc.pid], sessions=[proc.pid])
        proc.wait(timeout=10)
    assert sorted(served) == [0, 1], served
    for r in (0, 1):  # the same innermost user line from both tools
        assert doctor.rank_state(r, served[r]).call_site == doctor.rank_state(r, spied[r]).call_site
    v = doctor.diagnose(served)
    assert v.diverged == [1] and v.collective == "all_reduce" and v.kind == "not entered", v.text
