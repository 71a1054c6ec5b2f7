"""The job runner on real torchrun / python jobs (gloo on CPU)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
import uuid

import psutil
import pytest
from support import SCENARIOS

from helpers import jobs

TOY = SCENARIOS / "toy_job.py"


def test_ok_job_reports_each_rank(no_leftovers):
    r = jobs.run_job(TOY, ["--steps", "3"], nproc=2, timeout_s=60, verbose=False)
    assert r.ok, r.summary()
    assert sorted(r.ranks) == [0, 1]
    assert all(res.exit_code == 0 for res in r.ranks.values())
    assert "step 3" in r.ranks[1].stdout
    # the merged launcher stream is rank-prefixed, the per-rank files are not
    assert any(line.startswith("[rank 1] ") for line in r.output.splitlines())
    assert not r.ranks[1].stdout.startswith("[rank 1] [rank 1]")
    assert "--log-dir" in " ".join(r.commands[0]) and (r.job_dir / "torchrun").is_dir()
    assert r.env["TMPDIR"] == str(r.job_dir / "tmp") and not (r.job_dir / "tmp").exists()


def test_crashing_rank_is_named_with_its_traceback(no_leftovers):
    r = jobs.run_job(TOY, ["--mode", "crash", "--bad-rank", "1", "--steps", "5"], nproc=2, timeout_s=60,
                     verbose=False)
    assert not r.ok and not r.hung and not r.timed_out
    assert r.returncode != 0
    # 1 from the uncaught RuntimeError; or SIGABRT when torch's teardown of the live process group aborts after the
    # traceback ("terminate called without an active exception" on that rank's stderr: a c10d/gloo thread still
    # joinable at interpreter exit), which a loaded machine makes more likely (seen once in a clean-clone CI run)
    assert r.ranks[1].exit_code in (1, -signal.SIGABRT)
    assert r.first_failure is not None and r.first_failure.rank == 1
    assert "simulated failure on rank 1 at step 2" in r.first_failure.traceback
    assert r.failed_ranks == [0, 1]  # rank 0 was torn down by torchrun (non-zero too)


def test_exit_code_of_a_rank_is_exact(no_leftovers):
    r = jobs.run_job(TOY, ["--mode", "exit", "--bad-rank", "0", "--steps", "3"], nproc=2, timeout_s=60,
                     verbose=False)
    assert r.ranks[0].exit_code == 3
    assert r.first_failure.rank == 0


def test_stall_is_declared_with_stacks_and_everything_killed(no_leftovers, monkeypatch):
    monkeypatch.setenv("FORCE_COLOR", "1")  # as in a Jupyter kernel: stacks must still be plain text
    stall = 4.0
    r = jobs.run_job(TOY, ["--mode", "hang", "--bad-rank", "1", "--steps", "100", "--step-s", "0.2"], nproc=2,
                     timeout_s=60, stall_s=stall, heartbeat=r"step \d+", verbose=False)
    assert r.hung and not r.timed_out
    assert r.hung_ranks == [0, 1]
    assert "all_reduce" in r.stacks[0]  # the healthy rank waits in the collective
    assert "toy_job.py" in r.stacks[1] and "all_reduce" not in r.stacks[1]  # the stuck one does not
    assert (r.job_dir / "stacks" / "rank1.txt").exists()
    assert "\x1b[" not in r.stacks[0]
    # stopped by the stall rule, not the 60 s timeout (how soon after the window is a benchmark figure:
    # benchmarks/bench_runner.py; a bound in seconds here would fail on a loaded machine)
    assert r.wall_s < 60 and "stall" in r.stop_reason, (r.wall_s, r.stop_reason)
    for res in r.ranks.values():
        assert not psutil.pid_exists(res.pid) or psutil.Process(res.pid).status() == psutil.STATUS_ZOMBIE


def test_stall_window_opens_at_the_first_progress(no_leftovers):
    # startup (~3 s) + a 5 s step before the first heartbeat: longer than stall_s, yet not a hang
    r = jobs.run_job(TOY, ["--steps", "1", "--step-s", "5"], nproc=2, timeout_s=60, stall_s=4,
                     heartbeat=r"step \d+", verbose=False)
    assert r.ok and not r.hung, r.summary()


def test_hard_timeout_kills_within_timeout_plus_5s(no_leftovers):
    timeout = 8.0
    # rank 1 sleeps without collectives while rank 0 waits in all_reduce: a real hang, no stall window
    r = jobs.run_job(TOY, ["--mode", "hang", "--bad-rank", "1", "--steps", "3"], nproc=2, timeout_s=timeout,
                     verbose=False)
    assert r.timed_out and not r.hung
    assert r.wall_s < 60, r.wall_s  # the timeout stopped it (stop_reason below); the margin is not a speed test
    assert set(r.stacks) == {0, 1}
    assert "hard timeout" in r.stop_reason


def test_deepspeed_launcher_passes_local_rank_through_the_shim(no_leftovers):
    from helpers import hostinfo

    r = jobs.run_job(TOY, ["--steps", "2"], launcher="deepspeed", nproc=2, timeout_s=90, verbose=False,
                     launcher_args=[f"--master_port={hostinfo.free_port()}"])
    assert r.ok, r.summary() + r.output[-2000:]
    assert sorted(r.ranks) == [0, 1] and "step 2" in r.ranks[1].stdout
    assert "--local_rank=1" in " ".join(json.loads((r.job_dir / "ranks" / "rank1.json").read_text())["cmd"])


def test_plain_python_launcher_has_no_env_contract(no_leftovers):
    # Seed D1: a bare `python` sets no RANK, so init_process_group fails at once.
    r = jobs.run_job(TOY, ["--backend", "gloo"], launcher="python", nproc=2, timeout_s=60, verbose=False)
    assert sorted(r.ranks) == [0, 1]
    assert all(res.exit_code == 1 for res in r.ranks.values())
    assert "environment variable RANK expected, but not set" in r.ranks[0].traceback


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [({"nproc": 0}, "nproc"), ({"launcher": "mpirun"}, "launcher"), ({"timeout_s": 0}, "timeout_s"),
     ({"stall_s": -1}, "stall_s"), ({"backend": "mpi"}, "backend"), ({"name": "a b"}, "name")],
)
def test_bad_arguments_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        jobs.run_job(TOY, **kwargs)


def test_missing_script_names_the_field():
    with pytest.raises(ValueError, match="script=.*not found"):
        jobs.run_job(SCENARIOS / "nope.py")


def test_choose_backend_on_cpu_is_gloo(capsys):
    assert jobs.choose_backend("auto", 2) == "gloo"
    assert "gloo" in capsys.readouterr().out
    assert jobs.choose_backend("nccl", 2, verbose=False) == "nccl"


def test_launcher_commands_insert_the_shim():
    ds = jobs.launcher_argv("deepspeed", "t.py", ["--x"], nproc=2)[0]
    assert ds[1:3] == ["--num_gpus=2", jobs.SHIM] and ds[-2:] == ["t.py", "--x"]
    acc = jobs.launcher_argv("accelerate", "t.py", nproc=None)[0]
    assert acc[1] == "launch" and not any(a.startswith("--num_processes") for a in acc)
    tr = jobs.launcher_argv("torchrun", "t.py", nproc=2, launcher_args=["--master-port=29600"])[0]
    assert "--standalone" not in tr  # an explicit port means a static rendezvous (D4)
    py = jobs.launcher_argv("python", "t.py", nproc=3)
    assert len(py) == 3


def test_run_together_runs_jobs_side_by_side_and_keeps_their_order(no_leftovers):
    hung, ok = jobs.run_together(
        lambda: jobs.run_job(TOY, ["--mode", "hang", "--bad-rank", "1", "--steps", "100", "--step-s", "0.2"], nproc=2,
                             timeout_s=60, stall_s=3, heartbeat=r"step \d+", name="together-hang", verbose=False),
        lambda: jobs.run_job(TOY, ["--steps", "3"], nproc=2, timeout_s=60, name="together-ok", verbose=False))
    assert (hung.name, ok.name) == ("together-hang", "together-ok")
    assert hung.hung and hung.hung_ranks == [0, 1] and ok.ok, (hung.summary(), ok.summary())
    assert hung.job_dir != ok.job_dir
    # the two jobs' ranks were alive at the same time
    assert max(r.start for r in ok.ranks.values()) < min(r.end for r in hung.ranks.values())
    assert max(r.start for r in hung.ranks.values()) < min(r.end for r in ok.ranks.values())


def test_run_together_raises_after_every_job_has_ended(no_leftovers):
    done = []

    def finishes():
        done.append(jobs.run_job(TOY, ["--steps", "2"], nproc=2, timeout_s=60, verbose=False))
        return done[-1]

    with pytest.raises(ValueError, match="nproc"):
        jobs.run_together(lambda: jobs.run_job(TOY, nproc=0), finishes)
    assert len(done) == 1 and done[0].ok  # the good job ran to its end before the error surfaced


@pytest.mark.parametrize("calls, error, field", [((), ValueError, "calls"), ((1,), TypeError, r"calls\[0\]")])
def test_run_together_bad_input_names_the_field(calls, error, field):
    with pytest.raises(error, match=field):
        jobs.run_together(*calls)


@pytest.fixture
def ctrl_c():
    """SIGINT raises KeyboardInterrupt here, as in a terminal or a notebook kernel, even when the test process was
    started with SIGINT ignored (a background job of a shell without job control: Python then installs no handler)."""
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    yield
    signal.signal(signal.SIGINT, previous)


def test_interrupting_run_together_kills_every_job_at_once(no_leftovers, ctrl_c):
    tag = uuid.uuid4().hex[:8]
    started = time.monotonic()
    timer = threading.Timer(6.0, os.kill, args=(os.getpid(), signal.SIGINT))  # Ctrl-C while both jobs hang
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            jobs.run_together(*(lambda i=i: jobs.run_job(TOY, ["--mode", "hang", "--bad-rank", "1", "--steps", "100"],
                                                         nproc=2, timeout_s=60, name=f"intr-{tag}-{i}", verbose=False)
                                for i in range(2)))
    finally:
        timer.cancel()
    # well before the jobs' own 60 s timeout; no_leftovers checks that no launcher or rank survived
    assert time.monotonic() - started < 60  # cancelled, not ended by the jobs' own 60 s timeout
    results = [json.loads(p.read_text()) for p in (jobs.build_dir() / "jobs").glob(f"intr-{tag}-*/result.json")]
    assert len(results) == 2 and all("cancelled" in r["stop_reason"] for r in results)


def test_interrupt_cancels_a_nested_run_together(no_leftovers, ctrl_c):
    """A helper that runs its own jobs side by side (resume.run_elastic, check_variants) inside run_together."""
    tag = uuid.uuid4().hex[:8]

    def hang(i):
        return jobs.run_job(TOY, ["--mode", "hang", "--bad-rank", "1", "--steps", "100"], nproc=2, timeout_s=60,
                            name=f"nested-{tag}-{i}", verbose=False)

    started = time.monotonic()
    timer = threading.Timer(8.0, os.kill, args=(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt):
            jobs.run_together(lambda: jobs.run_together(lambda: hang("a"), lambda: hang("b"), stagger_s=1.0),
                              lambda: hang("c"))
    finally:
        timer.cancel()
    assert time.monotonic() - started < 60  # cancelled, not ended by the jobs' own 60 s timeout
    results = [json.loads(p.read_text()) for p in (jobs.build_dir() / "jobs").glob(f"nested-{tag}-*/result.json")]
    assert len(results) == 3 and all("cancelled" in r["stop_reason"] for r in results), results


def test_run_together_with_a_set_cancel_token_starts_nothing():
    ran = []
    cancel = threading.Event()
    cancel.set()
    with pytest.raises(jobs.Cancelled):
        jobs.run_together(lambda: ran.append(1), lambda: ran.append(2), cancel=cancel)
    assert ran == []


def test_run_together_max_parallel_and_stagger():
    spans = []

    def span():
        t = time.monotonic()
        time.sleep(0.3)
        spans.append((t, time.monotonic()))
        return len(spans)

    assert sorted(jobs.run_together(span, span, span, max_parallel=1)) == [1, 2, 3]
    starts_ends = sorted(spans)
    assert all(a[1] <= b[0] + 0.01 for a, b in zip(starts_ends, starts_ends[1:]))  # one at a time
    spans.clear()
    t0 = time.monotonic()
    jobs.run_together(span, span, stagger_s=0.5)
    assert sorted(s[0] for s in spans)[1] - t0 >= 0.5
    for bad, field in (({"stagger_s": -1}, "stagger_s"), ({"max_parallel": 0}, "max_parallel")):
        with pytest.raises(ValueError, match=field):
            jobs.run_together(span, **bad)


def test_a_stall_is_no_hang_when_every_rank_ended_well(tmp_path):
    """The runner's second look after a stall (jobs._ended_well): ranks all exited 0 and the launchers exit 0 ->
    slow, not hung; a rank with another exit code, a rank still running, or a failing launcher -> still hung."""
    from helpers.jobdir import JobDir

    layout = JobDir(tmp_path / "job").create()
    layout.ranks_dir.mkdir(parents=True, exist_ok=True)

    def records(*codes):
        for r, code in enumerate(codes):
            rec = {"rank": r, "pid": 1000 + r, **({} if code is None else {"exit_code": code})}
            (layout.ranks_dir / f"rank{r}.json").write_text(json.dumps(rec))

    def launchers(*argv):
        return [subprocess.Popen(a) for a in argv]

    records(0, 0)
    assert jobs._ended_well(layout, launchers(["true"], ["true"]))
    assert not jobs._ended_well(layout, launchers(["true"], ["false"]))
    records(0, 1)
    assert not jobs._ended_well(layout, launchers(["true"]))
    records(0, None)
    assert not jobs._ended_well(layout, launchers(["true"]))
    slow = launchers(["sleep", "30"])
    records(0, 0)
    assert not jobs._ended_well(layout, slow, grace_s=0.2)  # the launcher did not exit within the grace
    slow[0].kill()
    slow[0].wait()
