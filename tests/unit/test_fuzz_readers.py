"""Property tests of issue 30 for the doctor's, build's and preflight's readers, and helpers.inputs: for any input
(mutations of the real samples of tests/data, and the issue's reproducers as explicit examples) the verb ends with
exit 0, 1 or 2, a message with 2, no traceback, within a time limit.

A small fixed budget (derandomized, no example database: the same inputs each run, nothing left behind); the long,
random search is ``benchmarks/fuzz_campaign.py``.  The harness is ``tests/fuzzing.py``.
"""

from __future__ import annotations

import io
import re

import pytest
from fuzzing import TARGETS, check_outcome, mutations, time_limit
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from helpers import doctor, inputs

SMALL = settings(max_examples=10, deadline=None, derandomize=True, database=None,
                 suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
LIMIT_S = 10.0


def fuzz_target(name: str, data: bytes, tmp_path_factory: pytest.TempPathFactory) -> None:
    scratch = tmp_path_factory.mktemp(name)
    with time_limit(LIMIT_S):
        check_outcome(TARGETS[name].run(data, scratch), name)


@SMALL
@given(mutations(TARGETS["doctor-fr"].seeds()))
@example(b"\x80\x02Nr\xff\xff\xff\x7f.")
@example(b'{"version": "2.10", "entries": [{"collective_seq_id": Infinity}]}')
@example(b'{"version": "2.10", "pg_config": [1], "entries": []}')
@example(b'{"version": "2.10", "entries": [{"collective_seq_id": 1, "process_group": 5}]}')
@example(b'{"version": "2.10", "entries": [{"collective_seq_id": 1, "frames": 3}]}')
@example(b'{"version": "2.10", "entries": [{"collective_seq_id": 1}, {"collective_seq_id": 1000000000000}]}')
@example(b"[" * 1000 + b"]" * 1000)
def test_doctor_fr_dump(tmp_path_factory, data):
    fuzz_target("doctor-fr", data, tmp_path_factory)


@SMALL
@given(mutations(TARGETS["doctor-stacks"].seeds()))
@example(b'Thread 1 (idle): "MainThread"\n    ' + b"a(" * 50_000 + b" (x.py:1)\n")
@example(b"\xef\xbb\xbfThread 1 (idle): \"MainThread\"\n    run (train.py:" + b"9" * 5000 + b")\n")
def test_doctor_stack_file(tmp_path_factory, data):
    fuzz_target("doctor-stacks", data, tmp_path_factory)


@SMALL
@given(mutations(TARGETS["doctor-trace"].seeds()))
@example(b'{"phase": "enter"}\n')
@example(b'{"phase": "enter", "seq": 1e400, "op": "x"}\n')
def test_doctor_trace_file(tmp_path_factory, data):
    fuzz_target("doctor-trace", data, tmp_path_factory)


@SMALL
@given(mutations(TARGETS["build-check-file"].seeds()))
@example(b"torchrun --master-port 0 train.py\n")
@example(b"torchrun --master-port " + b"9" * 5000 + b" train.py\n")
@example(b"\xef\xbb\xbftorchrun --standalone train.py\n")
def test_build_check_file(tmp_path_factory, data):
    fuzz_target("build-check-file", data, tmp_path_factory)


@SMALL
@given(mutations(TARGETS["build-check"].seeds()))
def test_build_check(tmp_path_factory, data):
    fuzz_target("build-check", data, tmp_path_factory)


@SMALL
@given(mutations(TARGETS["preflight-inventory"].seeds()))
@example(b"@@addr\n[{\"ifname\": \"eth0\", \"addr_info\": [{\"family\": \"inet\"}]}]\n@@end\n")
@example(b"@@addr\n{}\n@@route\n[1]\n@@end\n")
def test_preflight_inventory(tmp_path_factory, data):
    fuzz_target("preflight-inventory", data, tmp_path_factory)


@settings(max_examples=30, deadline=None, derandomize=True, database=None)
@given(st.binary(max_size=300), st.sampled_from(["strict", "replace"]))
def test_inputs_read_text_of_any_bytes_is_text_or_one_input_error(data, errors):
    try:
        text = inputs.read_text("-", stdin=io.BytesIO(data), errors=errors, max_line_chars=80)
    except inputs.InputError as exc:
        assert str(exc).startswith("-: ") and "\n" not in str(exc)
        return
    assert not text.startswith("\ufeff") and "\x00" not in text


@settings(max_examples=15, deadline=None, derandomize=True, database=None)
@given(mutations([b'{"train_micro_batch_size_per_gpu": 4, "zero_optimization": {"stage": 2}}',
                  b"compute_environment: LOCAL_MACHINE\ndistributed_type: MULTI_GPU\nnum_processes: 8\n",
                  b"a: &a [1, 2]\nb: [*a, *a]\n"]))
def test_inputs_structured_text_is_data_or_one_input_error(data):
    for load in (inputs.load_json, inputs.load_yaml):
        with time_limit(LIMIT_S):
            try:
                load(data, "cfg")
            except inputs.InputError as exc:
                assert str(exc).startswith("cfg: ") and "\n" not in str(exc)


_OLD_FRAME = re.compile(r"^\s+(?P<func>.+?) \((?P<file>[^()]+?):(?P<line>\d+)\)\s*$")
"""The frame regex parse_frame replaced (it backtracked on long lines): the reference on short ones."""


@settings(max_examples=50, deadline=None, derandomize=True, database=None)
@given(st.text(st.sampled_from(" \t()::ab1.py/x"), max_size=40))
@example("    run (/w/train.py:12)")
@example("    f(x) (a b.py:3)  ")
def test_parse_frame_reads_what_the_old_regex_read(line):
    m = _OLD_FRAME.match(line)
    got = doctor.parse_frame(line)
    want = (m["func"].strip(), m["file"], int(m["line"])) if m and m["func"].strip() and len(m["line"]) <= 10 else None
    assert (None if got is None else (got.func, got.file, got.line)) == want
