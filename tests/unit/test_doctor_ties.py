"""Two-rank ties decided from the code, undecided verdicts that name no rank, and the class of every verdict (issue 26).

tests/data/ties/<case>/ holds real runs of the two-rank hangs (gloo, torch 2.13, this project's runner, stall window
3 s): ``rank<R>`` the Flight Recorder dump of rank R, ``stack<R>.txt`` its py-spy dump.  ``tests/data/ties/src`` is the
source the stacks point at (``helpers/scenarios/*.py`` as they were for those runs), so the line numbers stay right
when the scenarios change.  ``busy_eval`` is ``hangs.py --case slow_eval --eval-busy`` (rank 0 computes outside any
collective); the others are ``issue_hangs.py`` cases and ``hangs.py --case uneven --samples 9``.
"""

from __future__ import annotations

import os
import pickle
import threading
import time
from pathlib import Path

import pytest

from helpers import doctor
from helpers import flight_recorder as fr

DATA = Path(__file__).resolve().parents[1] / "data"
TIES = DATA / "ties"
SRC = TIES / "src"


def _load(case: str) -> tuple[dict, dict]:
    folder = TIES / case
    return fr.load_dir(folder), {r: (folder / f"stack{r}.txt").read_text() for r in (0, 1)}


# case -> (rank that diverged, evidence from the stacks alone, class)
CASES = {
    "uneven": ([1], "loop exit", "mismatch"),
    "early_stop_rank0": ([0], "loop exit", "mismatch"),
    "nan_skip": ([1], "loop exit", "mismatch"),
    "patience_local": ([1], "loop exit", "mismatch"),
    "subgroup_mismatch": ([1], "rank branch", "mismatch"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_two_rank_tie_decided_from_the_code(case):
    want, evidence, kind = CASES[case]
    dumps, stacks = _load(case)
    alone = doctor.diagnose(stacks, root=SRC)
    assert alone.diverged == want and alone.evidence == evidence and alone.kind == kind, alone.text
    both = doctor.diagnose_fr(dumps, stacks, root=SRC)
    assert both.diverged == want and both.evidence == evidence, both.text
    assert f"rank(s) {want} diverged" in both.text.splitlines()[0] and "decided by: " + evidence in both.text
    assert "also: new op agrees" in both.text  # the dumps name the same rank
    assert doctor.diagnose_fr(dumps).diverged == want  # and so do the dumps alone


def test_loop_exit_names_the_loop_and_the_lint_rule():
    v = doctor.diagnose(_load("uneven")[1], root=SRC)
    assert "past the loop at hangs.py:117" in v.text
    assert "rank-sliced-data at hangs.py:112" in v.action  # the slice that made rank 1's loop shorter
    nan = doctor.diagnose(_load("nan_skip")[1], root=SRC)
    assert "rank-dependent exit(s) in the loop: issue_hangs.py:124" in nan.text  # `if not math.isfinite(loss): continue`


def test_the_arm_that_singles_out_a_rank():
    v = doctor.diagnose(_load("subgroup_mismatch")[1], root=SRC)
    assert "takes the arm of issue_hangs.py:98" in v.text and "rank-gated-collective at issue_hangs.py:99" in v.action


def test_undecided_names_no_rank_and_says_what_to_collect():
    dumps, stacks = _load("ddp_eval_rank0")
    v = doctor.diagnose(stacks, root=SRC)  # both ranks at the same line: rank 0 in DDP's buffer broadcast, rank 1 in backward
    assert v.evidence == "undecided" and v.diverged == [] and v.waiting == [] and v.tied == [[0], [1]], v.text
    first = v.text.splitlines()[0]
    assert "undecided" in first and "rank(s)" not in first and "diverged" not in first and "no rank is named" in first
    assert "to decide, collect:" in v.text and "Flight Recorder dumps" in v.text and "collective trace" in v.text
    with_fr = doctor.diagnose_fr(dumps, stacks, root=SRC)  # the dumps' repeating pattern decides
    assert with_fr.diverged == [0] and with_fr.evidence == "pattern", with_fr.text


def test_undecided_on_synthetic_stacks_lists_the_missing_sources():
    stack = ('Thread 1 (idle): "MainThread"\n    {op} (torch/distributed/distributed_c10d.py:100)\n'
             '    run (/nonexistent/train.py:{line})\n')
    v = doctor.diagnose({0: stack.format(op="all_reduce", line=10), 1: stack.format(op="barrier", line=20)})
    assert v.evidence == "undecided" and v.diverged == [] and "/nonexistent/train.py" in v.text


def test_busy_rank_is_classed_busy():
    dumps, stacks = _load("busy_eval")
    for v in (doctor.diagnose(stacks), doctor.diagnose_fr(dumps, stacks)):
        assert v.diverged == [0] and v.kind == "busy" and v.states[0].active is True, v.text
        assert "second look" in v.action
    assert doctor.diagnose_fr(dumps).kind == "not entered"  # without a stack, nothing says it computes


def test_real_fr_corpus_classes_and_actions():
    stuck = doctor.diagnose_fr(doctor.load_fr(DATA / "fr" / "stuck"))
    assert stuck.kind == "not entered" and "class: not entered" in stuck.text
    save_dir = DATA / "fr" / "rank0_save"
    stacks = {r: (save_dir / f"stack{r}.txt").read_text() for r in (0, 1)}
    save = doctor.diagnose_fr(doctor.load_fr(save_dir), stacks, root=SRC)
    assert save.kind == "mismatch" and "rank-gated-collective at hangs.py:148" in save.action, save.text
    lock = (DATA / "stacks" / "deepspeed_stale_jit_lock.txt").read_text()
    jit = doctor.diagnose({0: lock, 1: lock})
    assert jit.kind == "after return" and "host.jit_lock" in jit.action


def _entry(seq: int, op: str, retired: bool) -> dict:
    return {"collective_seq_id": seq, "profiling_name": f"gloo:{op}", "process_group": ["0", "default_pg"],
            "input_sizes": [[4]], "state": "scheduled", "retired": retired, "time_created_ns": 1_795_000_000_000_000_000 + seq}


def test_every_rank_inside_is_network_and_after_return_when_completed():
    def dump(done: bool) -> dict:
        return {"version": "2.10", "pg_config": {}, "pg_status": {}, "entries": [_entry(1, "all_reduce", True),
                                                                                 _entry(2, "all_reduce", done)]}
    net = doctor.diagnose_fr({0: dump(False), 1: dump(False)})
    assert net.diverged == [] and net.kind == "network" and "runbook diagnose" in net.action and "preflight" in net.action
    after = doctor.diagnose_fr({0: dump(True), 1: dump(True)})
    assert after.kind == "after return" and "completed" in after.text


def test_read_source_never_blocks_nor_reads_huge_files(tmp_path):
    fifo = tmp_path / "train.py"
    os.mkfifo(fifo)
    big = tmp_path / "big.py"
    big.write_bytes(b"#" * 64)
    ok = tmp_path / "ok.py"
    ok.write_text("x = 1\n")
    got: dict = {}
    t = threading.Thread(target=lambda: got.update(fifo=doctor.read_source(fifo), dir=doctor.read_source(tmp_path)), daemon=True)
    t0 = time.monotonic()
    t.start()
    t.join(5)
    assert not t.is_alive() and got == {"fifo": None, "dir": None} and time.monotonic() - t0 < 5
    assert doctor.read_source(big, max_bytes=63) is None and doctor.read_source(big, max_bytes=64) == "#" * 64
    assert doctor.read_source(ok) == "x = 1\n" and doctor.read_source(tmp_path / "missing.py") is None
    frames = [doctor.Frame("run", str(fifo), 1)]
    assert doctor.rank_branches(frames) == []  # a frame naming a FIFO is skipped, not read


def test_dump_pickles_of_the_corpus_are_plain():
    for case in CASES:
        for r in (0, 1):
            assert isinstance(pickle.loads((TIES / case / f"rank{r}").read_bytes()), dict)


def test_debug_server_traceback_reads_like_py_spy():
    """tests/data/stacks/debug_server_rank<R>.txt: what torch's debug server (``start_debug_server``, torch 2.13) served
    for ``toy_job.py --mode hang --debug-server 0`` on 2 ranks (``POST <worker>/handler/dump_traceback``)."""
    raw = {r: (DATA / "stacks" / f"debug_server_rank{r}.txt").read_text() for r in (0, 1)}
    frames = {r: doctor.parse_traceback(t) for r, t in raw.items()}
    assert frames[0][0].func == "all_reduce" and frames[0][-1].func == "<module>" and frames[1][0].site == "toy_job.py:78"
    assert doctor.parse_traceback("Current thread 0x1 (most recent call first):\n  <no Python frame>\n") == []
    stacks = {r: f"{doctor.DEBUG_SERVER_MARK} x\nThread 0 (unknown): \"MainThread\"\n"
              + "".join(f"    {f.func} ({f.file}:{f.line})\n" for f in frames[r]) for r in raw}
    v = doctor.diagnose(stacks)
    assert v.diverged == [1] and v.states[1].source == "debug server" and v.states[1].active is None
    assert "torch.distributed.debug's server" in v.text
