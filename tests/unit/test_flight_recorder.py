"""Flight Recorder parsing, alignment, ties and bad input (helpers.flight_recorder, doctor.diagnose_fr).

tests/data/fr/<case>/rank<R> are real dumps of chapter 03's hangs (2 ranks, gloo, torch 2.13), written by the
runner's SIGUSR2 request when the stall window expired; the synthetic dumps below cover what a 2-rank CPU job
cannot show (several groups, wrapped buffers, missing ranks, early divergence).
"""

from __future__ import annotations

import json
import pickle
from pathlib import Path

import pytest

from helpers import doctor
from helpers import flight_recorder as fr
from helpers.cli import main as cli_main

DATA = Path(__file__).resolve().parent.parent / "data" / "fr"


def entry(seq: int, op: str, pg: str = "0", sizes: object = ((256,),), t: int = 1_795_000_000_000_000_000) -> dict:
    return {"collective_seq_id": seq, "profiling_name": f"gloo:{op}", "process_group": [pg, "default_pg" if pg == "0" else "undefined"],
            "input_sizes": [list(s) for s in sizes], "state": "scheduled", "is_p2p": False, "frames": None,
            "time_created_ns": t + seq}


def dump(*entries: dict) -> dict:
    return {"version": "2.10", "pg_config": {}, "pg_status": {}, "comm_lib_version": "", "entries": list(entries)}


@pytest.mark.parametrize("case,diverged,evidence", [("mismatch", [1], "new op"), ("rank0_save", [0], "new op"),
                                                    ("uneven", [1], "new op"), ("stuck", [1], "behind")])
def test_real_dumps_alone_name_the_rank(case, diverged, evidence):
    v = doctor.diagnose_fr(doctor.load_fr(DATA / case))
    assert v.diverged == diverged and v.evidence == evidence, v.text
    assert v.collective == "gloo:all_reduce" and v.group == "0"


def test_real_dump_keys_and_ops():
    d = fr.load_dump(DATA / "mismatch" / "rank1")
    assert {"version", "entries", "pg_config"} <= set(d)
    ops = [(e.seq, e.op) for e in fr.entries_by_group(d)["0"]]
    assert ops[-1] == (2, "gloo:broadcast") and ops[0] == (1, "gloo:all_reduce")


def test_json_and_pickle_read_alike(tmp_path):
    d = dump(entry(1, "all_reduce"), entry(2, "barrier"))
    (tmp_path / "rank0.json").write_text(json.dumps(d))
    (tmp_path / "rank1").write_bytes(pickle.dumps(dump(entry(1, "all_reduce"), entry(2, "all_reduce"))))
    dumps = fr.load_dir(tmp_path)
    assert sorted(dumps) == [0, 1]
    g = fr.align(dumps)[0]
    assert g.diverge_seq == 2 and g.ops_at == {0: "gloo:barrier", 1: "gloo:all_reduce"}


def test_majority_three_ranks_and_divergence_long_before_the_hang():
    ok = [entry(i, "all_reduce") for i in range(1, 8)]
    odd = [entry(1, "all_reduce"), entry(2, "all_reduce", sizes=((128,),)), *[entry(i, "all_reduce") for i in range(3, 8)]]
    v = doctor.diagnose_fr({0: dump(*ok), 1: dump(*ok), 2: dump(*odd)})
    assert v.diverged == [2] and v.seq == 2 and v.evidence == "majority"
    assert "long before the hang" in v.text


def test_behind_and_missing_dump():
    v = doctor.diagnose_fr({0: dump(entry(1, "all_reduce"), entry(2, "all_reduce")), 1: dump(entry(1, "all_reduce"))},
                           world_size=3)
    assert v.diverged == [1, 2] and "rank 2: no Flight Recorder dump" in v.text


def test_several_groups_the_diverged_one_decides():
    main = [entry(i, "all_reduce") for i in (1, 2, 3)]
    sub0 = [entry(1, "all_gather", pg="1"), entry(2, "all_gather", pg="1")]
    sub1 = [entry(1, "all_gather", pg="1"), entry(2, "broadcast", pg="1")]
    groups = fr.align({0: dump(*main, *sub0), 1: dump(*main, *sub1), 2: dump(*main, *sub0)})
    assert [g.group for g in groups] == ["0", "1"] and groups[0].diverge_seq is None and groups[1].diverge_seq == 2
    v = doctor.diagnose_fr({0: dump(*main, *sub0), 1: dump(*main, *sub1), 2: dump(*main, *sub0)})
    assert v.group == "1" and v.diverged == [1]


def test_wrapped_buffer_is_aligned_on_the_common_part():
    full = [entry(i, "all_reduce") for i in range(1, 11)] + [entry(11, "barrier")]
    wrapped = [entry(i, "all_reduce") for i in range(6, 12)]
    g = fr.align({0: dump(*full), 1: dump(*wrapped)})[0]
    assert g.wrapped == [1] and g.diverge_seq == 11
    v = doctor.diagnose_fr({0: dump(*full), 1: dump(*wrapped)})
    assert v.diverged == [0] and v.evidence == "new op" and "wrapped" in v.text


def test_tie_with_nothing_to_separate_is_undecided():
    a = dump(entry(1, "barrier"), entry(2, "all_reduce"))
    b = dump(entry(1, "barrier"), entry(2, "all_gather"))
    v = doctor.diagnose_fr({0: a, 1: b})
    assert v.evidence == "undecided" and "undecided" in v.text


def test_tie_decided_by_the_rank_branch_in_the_source():
    stacks = {r: (Path(__file__).resolve().parent.parent / "data" / "fr" / "rank0_save" / f"stack{r}.txt").read_text() for r in (0, 1)}
    v = doctor.diagnose(stacks)
    assert v.diverged == [0] and v.evidence == "rank branch", v.text
    assert "save_checkpoint() at hangs.py:52 called from run()" in doctor.diagnose_fr(doctor.load_fr(DATA / "rank0_save"), stacks).text


@pytest.mark.parametrize("content,needle", [(b"", "empty file"), (pickle.dumps(dump())[:20], "truncated"),
                                            (pickle.dumps(Path("x")), "not allowed"), (pickle.dumps({"a": 1}), "no 'version'")])
def test_bad_input_names_the_file_and_exits_2(tmp_path, capsys, content, needle):
    (tmp_path / "rank0").write_bytes(content)
    with pytest.raises(fr.DumpError, match=needle):
        fr.load_dir(tmp_path)
    assert cli_main(["doctor", "--fr-dir", str(tmp_path)]) == 2
    assert str(tmp_path / "rank0") in capsys.readouterr().err


def test_empty_dir_and_mixed_jobs(tmp_path, capsys):
    assert cli_main(["doctor", "--fr-dir", str(tmp_path)]) == 2 and "no Flight Recorder dump" in capsys.readouterr().err
    (tmp_path / "rank0").write_bytes(pickle.dumps(dump(entry(1, "all_reduce"))))
    (tmp_path / "rank1").write_bytes(pickle.dumps(dump(entry(1, "all_reduce", t=1_795_000_000_000_000_000 + 7200 * 10**9))))
    with pytest.raises(fr.DumpError, match="rank1: .*different jobs mixed"):
        fr.load_dir(tmp_path)
    (tmp_path / "rank1").write_bytes(pickle.dumps(dump(entry(1, "all_reduce"))))
    (tmp_path / "nccl_trace_rank_1").write_bytes(pickle.dumps(dump(entry(1, "all_reduce"))))
    with pytest.raises(fr.DumpError, match="second dump for rank 1"):
        fr.load_dir(tmp_path)


def test_cli_fr_dir_alone(capsys):
    assert cli_main(["doctor", "--fr-dir", str(DATA / "uneven")]) == 0
    out = capsys.readouterr().out
    assert "rank(s) [1] diverged" in out and "gloo:barrier" in out


def test_stack_tie_decided_by_call_site_counts():
    stack = ('Thread 1 (idle): "MainThread"\n    {op} (torch/distributed/distributed_c10d.py:100)\n'
             '    run (/nonexistent/train.py:{line})\n')
    stacks = {0: stack.format(op="all_reduce", line=10), 1: stack.format(op="barrier", line=20)}
    enter = [{"phase": "enter", "seq": i, "op": "all_reduce", "site": "train.py:10"} for i in (1, 2)]
    traces = {0: [*enter, {"phase": "enter", "seq": 3, "op": "all_reduce", "site": "train.py:10"}],
              1: [*enter, {"phase": "enter", "seq": 3, "op": "barrier", "site": "train.py:20"}]}
    v = doctor.diagnose(stacks, traces)
    assert v.diverged == [1] and v.evidence == "call-site count", v.text
    assert doctor.diagnose(stacks).evidence == "undecided"


def test_a_real_nccl_dump_from_a_gpu_reads_like_the_gloo_ones():
    """tests/data/fr/nccl_h100_timeout: the dump torch 2.11 (NCCL 2.28.9, one H100) wrote when its watchdog timed out
    the second all_reduce (tests/data/nccl/device/h100_watchdog_timeout.log is that run's output)."""
    d = fr.load_dump(DATA / "nccl_h100_timeout" / "nccl_trace_rank_0")
    assert d["version"] == "2.10" and d["pg_config"]
    ops = fr.entries_by_group(d)["0"]
    assert [(e.seq, e.op) for e in ops] == [(1, "nccl:all_reduce"), (2, "nccl:all_reduce")]
    states = [raw["state"] for raw in d["entries"]]
    assert states == ["completed", "scheduled"] and d["entries"][1]["timeout_ms"] == 8000
    g = fr.align(fr.load_dir(DATA / "nccl_h100_timeout"))[0]
    assert g.members == [0] and g.last == {0: 2} and g.diverge_seq is None
