"""Every scenario script in ``helpers/scenarios/`` runs on its own: ``--help`` answers (with an example)
without importing torch, and bad input exits 2 naming the flag (STYLE.md: "each runnable on its own
with ``--help``")."""

from __future__ import annotations

import subprocess
import sys

import pytest
from conftest import SCENARIOS

SCRIPTS = sorted(p.name for p in SCENARIOS.glob("*.py") if not p.name.startswith("_"))


def test_every_scenario_is_listed():
    assert len(SCRIPTS) >= 20 and "net_allreduce.py" in SCRIPTS and "elastic_train.py" in SCRIPTS


@pytest.mark.parametrize("script", SCRIPTS)
def test_scenario_help_answers_without_torch(script):
    out = subprocess.run([sys.executable, "-X", "importtime", str(SCENARIOS / script), "--help"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "Example" in out.stdout, out.stderr[-500:]
    assert "| torch\n" not in out.stderr  # --help must not pay torch's ~2 s import


@pytest.mark.parametrize("script, argv, flag", [
    ("fsdp_wrap.py", ["--wraps", "fsdp3-whole"], "--wraps"),
    ("fsdp_sharding.py", ["--strategies", "zero3"], "--strategies"),
    ("fsdp_sharding.py", ["--steps", "1"], "--steps"),
    ("fsdp_precision.py", ["--policies", "fp8"], "--policies"),
    ("fsdp_checkpoint.py", ["--mode", "export", "--ckpt-dir", "x"], "--mode"),
    ("net_allreduce.py", ["--sizes", "3B"], "--sizes"),
    ("net_allreduce.py", ["--sizes", "64XB"], "--sizes"),
    ("net_allreduce.py", ["--sizes", ","], "--sizes"),
    ("net_allreduce.py", ["--sizes", "2GiB"], "--sizes"),
    ("net_allreduce.py", ["--steps", "0"], "--steps"),
    ("net_allreduce.py", ["--interval-s", "-1"], "--interval-s"),
    ("net_allreduce.py", ["--timeout-s", "-5"], "--timeout-s"),
    ("net_allreduce.py", ["--backend", "mpi"], "--backend"),
    ("fabric_check.py", ["--timeout-s", "0"], "--timeout-s"),
])
def test_scenario_bad_input_names_the_flag(script, argv, flag):
    out = subprocess.run([sys.executable, str(SCENARIOS / script), *argv], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and flag in out.stderr
