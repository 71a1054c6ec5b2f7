"""Chapter 04 (FSDP, seed D12-D15) executes end to end on CPU; every reproduction asserts on its own run inside the notebook."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from conftest import SCENARIOS, execute_notebook, notebook_outputs

FSDP_SCRIPTS = ["fsdp_wrap.py", "fsdp_sharding.py", "fsdp_precision.py", "fsdp_checkpoint.py"]


@pytest.mark.parametrize("script", FSDP_SCRIPTS)
def test_scenario_help_answers_without_torch(script):
    out = subprocess.run([sys.executable, "-X", "importtime", str(SCENARIOS / script), "--help"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "Example" in out.stdout
    assert "| torch\n" not in out.stderr  # --help must not pay torch's ~2 s import


@pytest.mark.parametrize("script, argv, flag", [
    ("fsdp_wrap.py", ["--wraps", "fsdp3-whole"], "--wraps"),
    ("fsdp_sharding.py", ["--strategies", "zero3"], "--strategies"),
    ("fsdp_sharding.py", ["--steps", "1"], "--steps"),
    ("fsdp_precision.py", ["--policies", "fp8"], "--policies"),
    ("fsdp_checkpoint.py", ["--mode", "export", "--ckpt-dir", "x"], "--mode"),
])
def test_scenario_bad_input_names_the_flag(script, argv, flag):
    out = subprocess.run([sys.executable, str(SCENARIOS / script), *argv], capture_output=True, text=True, timeout=30)
    assert out.returncode == 2 and flag in out.stderr


def test_chapter_04_fsdp(no_leftovers):
    t0 = time.monotonic()
    out = execute_notebook("04_fsdp.ipynb")
    errors, text = notebook_outputs(out)
    assert not errors, errors
    assert "FSDP needs a non-CPU accelerator device" in text
    assert "size mismatch for 0.fc1.weight" in text
    assert "max abs diff 0.0," in text
    assert "out of bounds for storage of size 0" in text
    assert "[SKIP tier-multigpu]" in text
    print(f"chapter 04: {time.monotonic() - t0:.0f} s")
