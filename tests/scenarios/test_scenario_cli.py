"""Every scenario script in ``helpers/scenarios/`` runs on its own: ``--help`` answers (with an example)
without importing torch, and bad input exits 2 naming the flag."""

from __future__ import annotations

import subprocess
import sys

import pytest
from support import SCENARIOS

CONTRACT = SCENARIOS / "launch_contract.py"
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
    ("node_report.py", ["--master-port", "0"], "--master-port"),
    ("crash_write.py", ["--path", "x", "--die-after-bytes", "-1"], "--die-after-bytes"),
    ("icmp_probe.py", ["127.0.0.1", "70000", "1", "-"], "size"),
    ("icmp_probe.py", ["127.0.0.1", "56", "2", "-"], "df"),
    ("node_report.py", ["--master-port", "http"], "--master-port"),
    ("net_allreduce.py", ["--backend", "mpi"], "--backend"),
    ("fabric_check.py", ["--timeout-s", "0"], "--timeout-s"),
])
def test_scenario_bad_input_names_the_flag(script, argv, flag):
    out = subprocess.run([sys.executable, str(SCENARIOS / script), *argv], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and flag in out.stderr


@pytest.mark.parametrize("name, flags", [
    ("launch_contract.py", ["--hold-s", "--devices-per-node", "--bind", "--local_rank"]),
    ("launch_accelerate.py", ["--steps", "--cpu"]),
])
def test_scenario_help(name, flags):
    proc = subprocess.run([sys.executable, str(SCENARIOS / name), "--help"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert "Example" in proc.stdout and all(f in proc.stdout for f in flags)


def test_contract_script_rejects_bad_timeout():
    proc = subprocess.run([sys.executable, str(CONTRACT), "--timeout-s", "0"], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 2 and "--timeout-s" in proc.stderr


def test_scenarios_answer_help():
    """Each chapter-05 rank script documents itself without importing torch or DeepSpeed."""
    import subprocess
    import sys

    from support import SCENARIOS

    for name in ("ds_zero_memory.py", "ds_pitfalls.py", "ds_checkpoint.py", "ds_config_check.py"):
        proc = subprocess.run([sys.executable, str(SCENARIOS / name), "--help"], capture_output=True, text=True,
                              timeout=30)
        assert proc.returncode == 0 and "usage:" in proc.stdout, (name, proc.stderr)
