"""runbook lint on bad input (issue 30): one line naming the file and exit 2 (or the right answer), never a
traceback, a hang or an answer that depends on the other files; a hypothesis property per input kind."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import cli
from helpers.lint import UNREADABLE, lint_paths, lint_texts

DATA = Path(__file__).resolve().parents[1] / "data" / "lint"


def _run(capsys, *paths) -> tuple[int, str, str]:
    code = cli.main(["lint", *map(str, paths)])
    out = capsys.readouterr()
    return code, out.out, out.err


REPRODUCERS = {
    "port0.sh": "torchrun --master-port 0 train.py\n",
    "port5000.sh": "torchrun --master-port " + "9" * 5000 + " train.py\n",
    "nested.json": "[" * 1000 + "]" * 1000,
    "nested.yaml": "a: " + "[" * 500 + "]" * 500 + "\n",
    "bomb.yaml": "a: &a [x,x,x,x,x,x,x,x,x]\n" + "".join(
        f"{c}: &{c} [{','.join(['*' + p] * 9)}]\n" for p, c in zip("abcdefg", "bcdefgh")),
    "minus.py": "x = " + "-" * 100_000 + "1\n",
    "oneline.sh": "torchrun " + "a" * 2_000_000 + "\n",
}


@pytest.mark.parametrize("name", sorted(REPRODUCERS))
def test_each_reproducer_is_one_line_and_exit_2_and_the_other_file_is_still_linted(tmp_path, capsys, name):
    bad = tmp_path / name
    bad.write_text(REPRODUCERS[name])
    buggy = DATA / "buggy" / "ds_loss_backward.py"
    t0 = time.monotonic()
    code, out, err = _run(capsys, bad, buggy)
    assert time.monotonic() - t0 < 10
    assert code == 2
    assert err.count("\n") == 1 and err.startswith(f"runbook lint: {bad}: ")
    assert "Traceback" not in err + out
    assert "deepspeed-raw-backward" in out  # the good file's findings are still there


def test_a_symlink_to_dev_zero_is_refused_not_read(tmp_path, capsys):
    link = tmp_path / "job.sh"
    os.symlink("/dev/zero", link)
    code, _out, err = _run(capsys, link)
    assert code == 2 and "device" in err and err.count("\n") == 1
    assert cli.main(["build", "--check-file", str(link)]) == 2  # the same way in for build --check-file
    assert "device" in capsys.readouterr().err


def test_zero_micro_batch_is_deepspeeds_own_assertion_not_a_crash():
    cfg = json.dumps({"train_batch_size": 8, "train_micro_batch_size_per_gpu": 0, "gradient_accumulation_steps": 1})
    found = lint_texts([("ds.json", cfg)])
    assert [f.id for f in found] == ["ds-batch-not-positive"]
    assert "train_micro_batch_size_per_gpu = 0" in found[0].title


def test_a_long_string_concatenation_is_analysed():
    src = "import torch.distributed as dist\nx = " + " + ".join(['"a"'] * 400) + "\nif dist.get_rank() == 0:\n" \
          "    dist.barrier()\n"
    assert [f.id for f in lint_texts([("t.py", src)])] == ["rank-gated-collective"]


def test_findings_do_not_depend_on_the_other_files():
    clean, buggy = DATA / "clean" / "deepspeed_cifar10.py", DATA / "buggy" / "ds_loss_backward.py"
    alone = {(f.file, f.line_no, f.id) for f in lint_paths([buggy])}
    together = {(f.file, f.line_no, f.id) for f in lint_paths([clean, buggy]) if f.file == str(buggy)}
    assert (str(buggy), 10, "deepspeed-raw-backward") in alone
    assert together == alone


PY_SEEDS = sorted((DATA / "buggy").glob("*.py"))[:6] + sorted((DATA / "clean").glob("*.py"))[:3]
_PROPS = settings(max_examples=12, deadline=None, suppress_health_check=list(HealthCheck))  # the unit layer's budget; the long campaign is helper fuzz's benchmark


def _never_crashes(path: str, text: str) -> None:
    t0 = time.monotonic()
    found = lint_texts([(path, text)])
    assert time.monotonic() - t0 < 20  # bounded (the first call imports DeepSpeed: seconds on a loaded machine)
    for f in found:
        assert f.file == path and f.status in ("INFO", "WARN", "FAIL")
        assert f.id != UNREADABLE or f.title.startswith(path + ": ")


def _mutate(text: str, data) -> str:
    i = data.draw(st.integers(0, len(text)))
    j = data.draw(st.integers(i, min(len(text), i + 40)))
    return text[:i] + data.draw(st.text(max_size=30)) + text[j:]


@_PROPS
@given(st.data())
def test_property_python(data):
    seed = data.draw(st.sampled_from(PY_SEEDS)).read_text()
    _never_crashes("t.py", _mutate(seed, data))


@_PROPS
@given(st.data())
def test_property_deepspeed_json(data):
    seed = data.draw(st.sampled_from(sorted(DATA.glob("*/*.json")))).read_text()
    _never_crashes("ds.json", _mutate(seed, data))


@_PROPS
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.text(max_size=8),
                    lambda kids: st.lists(kids, max_size=4) | st.dictionaries(
                        st.sampled_from(["train_batch_size", "train_micro_batch_size_per_gpu", "zero_optimization",
                                         "stage", "fp16", "bf16", "enabled", "optimizer", "gradient_accumulation_steps",
                                         "x"]), kids, max_size=4), max_leaves=12))
def test_property_deepspeed_json_values(value):
    _never_crashes("ds.json", json.dumps({"train_batch_size": 8, "zero_optimization": value, "bf16": value,
                                          "train_micro_batch_size_per_gpu": value}))


@_PROPS
@given(st.data())
def test_property_accelerate_yaml(data):
    seed = data.draw(st.sampled_from(sorted(DATA.glob("*/*.yaml")))).read_text()
    _never_crashes("acc.yaml", _mutate(seed, data))


@_PROPS
@given(st.data())
def test_property_shell(data):
    seeds = sorted(DATA.glob("*/*.sh")) + sorted(DATA.glob("*/*.slurm"))
    seed = data.draw(st.sampled_from(seeds)).read_text()
    _never_crashes("job.sh", _mutate(seed, data))


@_PROPS
@given(st.lists(st.sampled_from(["torchrun", "srun", "-N", "2", "--nnodes=2", "--nproc-per-node=0", "--master-port",
                                 "0", "99999", "--standalone", "--node-rank=$SLURM_NODEID", "deepspeed", "--hostfile",
                                 "h", "accelerate", "launch", "--num-processes", "3", "train.py", "'", '"', "\\",
                                 "export", "MASTER_ADDR=x", "bash", "-c", "\n"]), max_size=14))
def test_property_launch_command(words):
    _never_crashes("cmd.sh", " ".join(words))
