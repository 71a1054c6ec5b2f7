"""Issue 30's reproducers for the doctor, build and preflight readers: each ends in one clear line and exit 2 (or the
right answer), never a traceback, a hang or a wrong verdict.  Every test runs the real verb (``cli.main`` in-process).

The lint, nccl-log and estimate-memory reproducers of the same issue live with those readers' tests.
"""

from __future__ import annotations

import json
import os
import pickle
import threading
import time
from pathlib import Path

import pytest
from fuzzing import check_outcome, time_limit
from fuzzing import run_cli as _run_cli

from helpers import collective_trace, doctor, launch_parse
from helpers import flight_recorder as fr

DATA = Path(__file__).resolve().parent.parent / "data"
STACK0 = (DATA / "fr" / "rank0_save" / "stack0.txt").read_text()
STACK1 = (DATA / "fr" / "rank0_save" / "stack1.txt").read_text()


def run_cli(argv, stdin=b""):
    """The verb, under a 20 s limit: a FIFO that blocked again would fail the test, not hang the suite."""
    with time_limit(20):
        return _run_cli(argv, stdin)


def one_error(outcome, *needles: str) -> str:
    """The outcome is exit 2 with one stderr line holding every needle; return that line."""
    check_outcome(outcome)
    lines = outcome.err.strip().splitlines()
    assert outcome.rc == 2 and len(lines) == 1, outcome.err
    assert all(n in lines[0] for n in needles), lines[0]
    return lines[0]


def entry(seq, op="all_reduce", **over):
    e = {"collective_seq_id": seq, "profiling_name": f"gloo:{op}", "process_group": ["0", "default_pg"],
         "input_sizes": [[4]], "state": "scheduled", "is_p2p": False, "frames": None, "time_created_ns": 10**18 + seq}
    e.update(over)
    return e


def dump(*entries, **over):
    d = {"version": "2.10", "pg_config": {"0": {"desc": "default_pg", "ranks": "[0, 1]"}}, "entries": list(entries)}
    d.update(over)
    return d


# ------------------------------------------------------------------------------------------ Flight Recorder dumps

@pytest.mark.parametrize("bad,field", [
    (dump(entry(1, process_group=5)), "entries[0].process_group = 5"),
    (dump(entry(1), pg_config=[1]), "pg_config = a list of 1 item(s)"),
    (dump(entry(1, frames=3)), "entries[0].frames = 3"),
    (dump(entry(1), entry(2, collective_seq_id="2")), "entries[1].collective_seq_id = '2'"),
    (dump(entry(1, collective_seq_id=True)), "entries[0].collective_seq_id = True"),
    (dump(entry(1, input_sizes=[[[[1]]]])), "entries[0].input_sizes"),
    (dump(entry(1, frames=[{"name": "f", "filename": "a.py", "line": "x"}])), "entries[0].frames[0]"),
    (dump(entry(1), pg_config={"0": {"desc": "d", "ranks": "[" + "9" * 5000 + "]"}}), "pg_config['0'].ranks"),
    (dump(entry(1, collective_seq_id=10**5000)), "an integer of 16610 bits"),
    (dump(5), "entries[0] = 5"),
])
def test_dump_field_of_the_wrong_type_is_named(tmp_path, bad, field):
    (tmp_path / "rank0").write_bytes(pickle.dumps(dump(entry(1))))
    (tmp_path / "rank1").write_bytes(pickle.dumps(bad))
    one_error(run_cli(["doctor", "--fr-dir", str(tmp_path)]), str(tmp_path / "rank1"), field)


def test_json_dump_with_infinity_names_the_field_and_a_bom_is_read(tmp_path):
    (tmp_path / "rank0.json").write_bytes(b"\xef\xbb\xbf" + json.dumps(dump(entry(1), entry(2))).encode())
    (tmp_path / "rank1.json").write_text(json.dumps(dump(entry(1), entry(2, collective_seq_id=float("inf")))))
    one_error(run_cli(["doctor", "--fr-dir", str(tmp_path)]), "rank1.json", "entries[1].collective_seq_id = inf")
    (tmp_path / "rank1.json").write_text(json.dumps(dump(entry(1), entry(2, "barrier"))))
    out = run_cli(["doctor", "--fr-dir", str(tmp_path)])
    assert out.rc == 0 and "ops differ" not in out.out and "#2" in out.out, out


def test_ten_byte_pickle_with_a_huge_memo_index_is_refused_without_allocating(tmp_path):
    bomb = b"\x80\x02Nr\xff\xff\xff\x7f."  # PROTO 2, NONE, LONG_BINPUT 2**31-1, STOP
    assert len(bomb) <= 10
    (tmp_path / "rank0").write_bytes(bomb)
    t0 = time.monotonic()
    one_error(run_cli(["doctor", "--fr-dir", str(tmp_path)]), "rank0", "not a Flight Recorder dump")
    assert time.monotonic() - t0 < 5


def test_every_bad_dump_is_named(tmp_path):
    (tmp_path / "rank0").write_bytes(b"\x80\x02}q\x00")
    (tmp_path / "rank1").write_bytes(pickle.dumps(dump(entry(1, frames=3))))
    out = run_cli(["doctor", "--fr-dir", str(tmp_path)])
    assert out.rc == 2 and len(out.err.strip().splitlines()) == 2 and "rank0" in out.err and "rank1" in out.err


def test_sequence_gap_is_not_walked():
    """Rank 1 recorded sequence numbers 1 and 10**12: align used to visit every number in between."""
    dumps = {0: dump(entry(1), entry(2)), 1: dump(entry(1), entry(10**12, "barrier"))}
    t0 = time.monotonic()
    g = fr.align(dumps)[0]
    v = doctor.diagnose_fr(dumps)
    assert time.monotonic() - t0 < 2
    assert g.last == {0: 2, 1: 10**12} and g.behind == [0] and v.diverged == [0]


@pytest.mark.parametrize("make,kind", [
    (lambda p: os.symlink("/dev/zero", p), "a character device"),
    (lambda p: os.mkfifo(p), "a FIFO"),
    (lambda p: p.mkdir(), "a directory"),
    (lambda p: os.symlink(p, p), "a symbolic link loop"),
])
def test_dump_that_is_not_a_regular_file_is_named_not_skipped(tmp_path, make, kind):
    """Skipping it would count rank 1 as 'no dump' and blame it."""
    (tmp_path / "rank0").write_bytes(pickle.dumps(dump(entry(1))))
    make(tmp_path / "rank1")
    t0 = time.monotonic()
    one_error(run_cli(["doctor", "--fr-dir", str(tmp_path)]), str(tmp_path / "rank1"), kind)
    assert time.monotonic() - t0 < 5


# ------------------------------------------------------------------------------------------ stacks and traces

def job_dir(tmp_path: Path, stack1=STACK1, trace1: str | None = None) -> Path:
    job = tmp_path / "job"
    for sub in ("stacks", "ranks", "trace"):
        (job / sub).mkdir(parents=True)
    (job / "stacks" / "rank0.txt").write_text(STACK0)
    if stack1 is not None:
        (job / "stacks" / "rank1.txt").write_text(stack1)
    for r in (0, 1):
        (job / "ranks" / f"rank{r}.json").write_text(json.dumps({"rank": r}))
    if trace1 is not None:
        (job / "trace" / "rank1.jsonl").write_text(trace1)
    return job


def test_saved_stacks_give_the_verdict(tmp_path):
    out = run_cli(["doctor", "--job-dir", str(job_dir(tmp_path))])
    assert out.rc == 0 and "rank(s) [0] diverged" in out.out, out


@pytest.mark.parametrize("make,kind", [
    (lambda p: p.mkdir(), "a directory"),
    (lambda p: os.symlink(p, p), "a symbolic link loop"),
    (lambda p: os.symlink("/dev/zero", p), "a character device"),
    (lambda p: os.mkfifo(p), "a FIFO"),
])
def test_stack_file_that_cannot_be_read_is_named(tmp_path, make, kind):
    job = job_dir(tmp_path, stack1=None)
    make(job / "stacks" / "rank1.txt")
    t0 = time.monotonic()
    one_error(run_cli(["doctor", "--job-dir", str(job)]), "rank1.txt", kind)
    assert time.monotonic() - t0 < 5


def test_unreadable_stack_file_is_named(tmp_path, monkeypatch):
    job = job_dir(tmp_path)
    real = os.open

    def denied(path, *a, **k):
        if str(path).endswith("rank1.txt"):
            raise PermissionError(13, "Permission denied", str(path))
        return real(path, *a, **k)

    monkeypatch.setattr(os, "open", denied)  # root reads a chmod-000 file: refuse the open instead
    one_error(run_cli(["doctor", "--job-dir", str(job)]), "rank1.txt", "permission denied")


def test_a_100000_character_stack_line_is_fast_and_frames_still_parse():
    line = "    " + "f(" * 50_000 + " (x.py:1)"
    text = 'Thread 1 (idle): "MainThread"\n' + line + "\n    run (/w/train.py:12)\n"
    t0 = time.monotonic()
    frames = doctor.parse_stack(text)
    assert time.monotonic() - t0 < 1
    assert [f.site for f in frames] == ["x.py:1", "train.py:12"] and len(frames[0].func) == 100_000
    assert doctor.parse_stack('Thread 1 (idle): "MainThread"\n    a ' + "x" * 100_000 + " (t.py:3)\n")[0].line == 3


@pytest.mark.parametrize("record,field", [
    ('{"phase": "enter"}', "seq = 'None'"),
    ('{"phase": "enter", "seq": 1}', "op = 'None'"),
    ('{"phase": "begin", "seq": 1, "op": "x"}', "phase = 'begin'"),
    ('{"phase": "enter", "seq": "1", "op": "x"}', "seq = '1'"),
    ('{"phase": "enter", "seq": 1, "op": "x", "site": 5}', "site = '5'"),
    ("[1, 2]", "must be a JSON object"),
])
def test_bad_trace_record_is_named(tmp_path, record, field):
    job = job_dir(tmp_path, trace1=record + "\n" + '{"phase": "exit", "seq": 1, "op": "x"}\n')
    one_error(run_cli(["doctor", "--job-dir", str(job)]), "rank1.jsonl:1", field)


def test_torn_last_trace_line_is_skipped_but_not_a_torn_middle(tmp_path):
    good = '{"phase": "enter", "seq": 1, "op": "all_reduce", "site": "t.py:3"}\n'
    (tmp_path / "a.jsonl").write_text(good + '{"phase": "ex')
    assert [r["seq"] for r in collective_trace.read(tmp_path / "a.jsonl")] == [1]
    (tmp_path / "b.jsonl").write_text('{"phase": "ex\n' + good)
    with pytest.raises(ValueError, match="b.jsonl:1: not a JSON record"):
        collective_trace.read(tmp_path / "b.jsonl")


# ------------------------------------------------------------------------------------------ build

@pytest.mark.parametrize("command,needles", [
    ("torchrun --master-port 0 train.py", ("master_port=0", "1..65535")),
    ("torchrun --master-port " + "9" * 5000 + " train.py", ("--master-port=999999999999...", "5,000 digits")),
    ("torchrun --nproc-per-node " + "9" * 5000 + " train.py", ("--nproc-per-node=",)),
    ("#!/bin/bash\n#SBATCH --nodes=" + "1" * 5000 + "\nsrun torchrun train.py", ("#SBATCH --nodes=",)),
])
def test_check_of_an_impossible_number_is_one_line(command, needles):
    one_error(run_cli(["build", "--check", command]), *needles)


def test_check_file_of_a_2mb_line_is_refused_fast(tmp_path):
    f = tmp_path / "long.sh"
    f.write_text("torchrun " + "x " * 1_000_000 + "train.py\n")
    t0 = time.monotonic()
    one_error(run_cli(["build", "--check-file", str(f)]), "line 1 is 2,000,017 characters long", "131,072")
    assert time.monotonic() - t0 < 5


@pytest.mark.parametrize("make,kind", [
    (lambda p: os.symlink("/dev/zero", p), "a character device"),
    (lambda p: os.mkfifo(p), "a FIFO"),
    (lambda p: p.mkdir(), "a directory"),
    (lambda p: os.symlink(p, p), "a symbolic link loop"),
])
def test_check_file_that_is_not_a_regular_file(tmp_path, make, kind):
    make(tmp_path / "job.sbatch")
    t0 = time.monotonic()
    one_error(run_cli(["build", "--check-file", str(tmp_path / "job.sbatch")]), "job.sbatch", kind)
    assert time.monotonic() - t0 < 5


def test_check_file_reads_a_pipe_whole_and_drops_a_bom(tmp_path):
    """``--check-file <(cat job.sbatch)``: the launch line sits past the first 8 KB of the pipe."""
    text = "\ufeff#!/bin/bash\n" + "# padding\n" * 1200 + "#SBATCH --nodes=2\nsrun torchrun --nproc-per-node=4 train.py\n"
    r, w = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(w, text.encode()), os.close(w)))
    writer.start()
    try:
        out = run_cli(["build", "--check-file", f"/dev/fd/{r}"])
    finally:
        writer.join()
        os.close(r)
    check_outcome(out)
    assert out.out.startswith("read as: sbatch, 2 node(s) x 4 rank(s)"), out
    assert run_cli(["build", "--check-file", "-"], stdin=text.encode()).out == out.out


def test_build_that_renders_nothing_never_exits_0(tmp_path):
    out = run_cli(["build", "--launcher", "accelerate", "--nodes", "1", "--node-rank", "1"])
    assert out.rc == 2 and out.out == "" and "no command: node_rank=1" in out.err


def test_a_script_that_looks_like_an_option_is_refused():
    one_error(run_cli(["build", "--", "--help"]), "script='--help'", "not an option")


def test_an_env_value_with_a_newline_reads_back():
    built = run_cli(["build", "--env", "A=x\ny", "--env", "B=1"])
    assert built.rc == 0
    assert launch_parse.parse(built.out).env == {"A": "x\ny", "B": "1"}


# ------------------------------------------------------------------------------------------ preflight

@pytest.mark.parametrize("value", ["0", "nan", "inf", "-1", "1e400"])
def test_preflight_timeout_must_be_a_finite_positive_number(value):
    out = run_cli(["preflight", "--nodes", "n0", "--runner", "local", "--timeout-s", value])
    check_outcome(out)
    assert out.rc == 2 and "--timeout-s" in out.err and "finite number > 0" in out.err


def test_launch_line_never_raises_on_a_number_parse_refuses():
    text = "export A=1\ntorchrun --master-port " + "9" * 30 + " train.py\n"
    with pytest.raises(ValueError, match="--master-port=999999999999...: a number of 30 digits"):
        launch_parse.parse(text)
    assert launch_parse.launch_line(text) == 2
