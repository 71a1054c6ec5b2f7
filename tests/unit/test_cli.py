"""The ``runbook`` command protocol (helpers/cli.py): pure, no job, no lab."""

from __future__ import annotations

import argparse
import inspect
from pathlib import Path

import pytest

from helpers import cli, memory, nccl_log, netlab, preflight
from helpers.allocation import local

NAMES = [c.name for c in cli.COMMANDS]


def test_registry_names_are_unique_and_cover_the_commands():
    assert len(NAMES) == len(set(NAMES))
    assert set(NAMES) >= {"diagnose", "doctor", "nccl-log", "lab", "preflight", "estimate-memory"}


@pytest.mark.parametrize("command", cli.COMMANDS, ids=NAMES)
def test_every_parser_builds_standalone_and_registered(command):
    alone = command.add_parser(None)
    assert isinstance(alone, argparse.ArgumentParser) and alone.prog == f"runbook {command.name}"
    sub = argparse.ArgumentParser(prog="runbook").add_subparsers(dest="command")
    registered = command.add_parser(sub)
    assert sub.choices[command.name] is registered and registered.prog == f"runbook {command.name}"
    assert inspect.signature(command.run).return_annotation in (int, "int")


def test_build_parser_sets_each_handler():
    parser = cli.build_parser()
    args = parser.parse_args(["estimate-memory", "--params", "1B", "--world-size", "2", "--strategy", "ddp"])
    assert args.func is cli.estimate_memory
    assert parser.parse_args(["lab", "status"]).func is cli.lab
    assert parser.parse_args(["doctor", "--job-dir", "x"]).func is cli.doctor
    assert parser.parse_args(["nccl-log", "f.log"]).func is cli.nccl_log


@pytest.mark.parametrize("argv", [[n] for n in NAMES] + [["lab", a] for a in ("up", "down", "status")] + [[]],
                         ids=lambda a: " ".join(a) or "runbook")
def test_help_exits_0(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main([*argv, "--help"])
    assert exc.value.code == 0
    assert capsys.readouterr().out.startswith("usage: runbook")


def test_estimate_memory_help_goes_through_argparse(capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["estimate-memory", "--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: runbook estimate-memory") and "--world-size" in out and "--shard-size" in out
    with pytest.raises(SystemExit) as exc:  # a missing required flag: argparse names it, status 2
        cli.main(["estimate-memory", "--params", "1B"])
    assert exc.value.code == 2 and "--world-size" in capsys.readouterr().err


@pytest.mark.parametrize("value", ["0", "-3", "x", "1.5"])
def test_bad_nproc_names_the_flag(value, capsys):
    with pytest.raises(SystemExit) as exc:
        cli.main(["diagnose", "--nproc", value])
    assert exc.value.code == 2
    err = capsys.readouterr().err
    assert "argument --nproc: --nproc=" in err and "must be an integer >= 1" in err


def test_positive_int_arg():
    parse = cli.positive_int_arg("--nodes", minimum=2)
    assert parse("3") == 3
    with pytest.raises(argparse.ArgumentTypeError, match=r"--nodes=1: must be an integer >= 2"):
        parse("1")


def test_lab_parser_limits_nodes(capsys):
    parser = cli.build_parser()
    assert parser.parse_args(["lab", "up"]).nodes == 2
    with pytest.raises(SystemExit):
        parser.parse_args(["lab", "up", "--nodes", str(netlab.MAX_NODES + 1)])
    assert "--nodes" in capsys.readouterr().err


def test_defaults_come_from_netlab():
    parser = cli.build_parser()
    assert parser.parse_args(["preflight"]).name == netlab.DEFAULT_NAME
    assert parser.parse_args(["lab", "down"]).name == netlab.DEFAULT_NAME
    default = inspect.signature(local.run_network_preflight).parameters["lab_name"].default
    assert default == netlab.DEFAULT_NAME


def test_preflight_bad_env_is_status_2_before_touching_a_lab(capsys):
    assert cli.main(["preflight", "--name", "nosuchlab", "--env", "NOT A PAIR"]) == 2
    assert "--env 'NOT A PAIR': use NAME=VALUE" in capsys.readouterr().err


def test_domain_modules_hold_no_cli_code():
    for module in (netlab, preflight, memory, nccl_log):
        for name in ("add_cli", "_cli", "build_parser", "_parse_env"):
            assert not hasattr(module, name), f"{module.__name__}.{name}"
    for module in (preflight, memory, nccl_log):
        assert "argparse" not in inspect.getsource(module), module.__name__
    assert not (Path(cli.__file__).parent / "lint" / "cli.py").exists()
