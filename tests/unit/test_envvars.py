"""Unit tests of helpers.envvars and of the modules that apply, render and parse env changes with it."""

from __future__ import annotations

import pytest

from helpers import envvars, launch_traps, slurm


def test_apply_sets_unsets_and_leaves_base_alone():
    base = {"A": "1", "B": "2"}
    assert envvars.apply(base, {"A": None, "C": 3}) == {"B": "2", "C": "3"}
    assert base == {"A": "1", "B": "2"}
    assert envvars.apply(base, None) == base


def test_shell_lines_round_trip_through_parse_lines():
    changes = {"NCCL_SOCKET_IFNAME": "^docker0,lo", "MSG": "a b 'c'", "GONE": None}
    lines = envvars.shell_lines(changes)
    assert lines[-1] == "unset GONE" and lines[0] == "export NCCL_SOCKET_IFNAME='^docker0,lo'"
    assert envvars.parse_lines("\n".join(lines)) == changes


def test_bad_names_and_lines_are_refused():
    with pytest.raises(ValueError, match="not a valid variable name"):
        envvars.shell_lines({"1X": "a"})
    with pytest.raises(ValueError, match=r"env line 2 .*unset NAME"):
        envvars.parse_lines("A=1\nB\n")  # a bare name used to mean unset ; issue 16
    with pytest.raises(ValueError, match="env line 1"):
        envvars.parse_lines("A B")
    with pytest.raises(ValueError, match="--env 'x'"):
        envvars.parse_pairs(["x"])
    assert envvars.parse_pairs(["A=b=c"]) == {"A": "b=c"}


def test_callers_share_the_rules():
    text = slurm.srun_torchrun(2, 1, "train.py", env={"NCCL_SOCKET_IFNAME": None, "X": "a b"})
    assert "unset NCCL_SOCKET_IFNAME" in text and "export X='\\''a b'\\''" in text  # inside the task's single quotes
    rendered = launch_traps.render(launch_traps.LaunchSpec(env={"X": "a b", "Y": None}))
    assert rendered.splitlines()[:2] == envvars.shell_lines({"X": "a b", "Y": None})
    with pytest.raises(ValueError, match="not a valid variable name"):
        launch_traps.render(launch_traps.LaunchSpec(env={"BAD-NAME": "1"}))
