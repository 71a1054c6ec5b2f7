"""Chapter 02 (DDP, seed D8-D11) executes end to end on CPU; every reproduction asserts on its own run inside the notebook."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from conftest import notebook_outputs, SCENARIOS, execute_notebook

DDP_SCRIPTS = ["ddp_unused.py", "ddp_uneven.py", "ddp_batchnorm.py", "ddp_effective_batch.py"]


@pytest.mark.parametrize("script", DDP_SCRIPTS)
def test_scenario_help_answers_without_torch(script):
    out = subprocess.run([sys.executable, "-X", "importtime", str(SCENARIOS / script), "--help"],
                         capture_output=True, text=True, timeout=30)
    assert out.returncode == 0 and "Example" in out.stdout
    assert "| torch\n" not in out.stderr  # --help must not pay torch's ~2 s import


def test_uneven_shards_bad_input_is_named():
    sys.path.insert(0, str(SCENARIOS))
    import ddp_uneven

    assert ddp_uneven.parse_shards("13,8") == [13, 8]
    for bad in ("13,x", "0,8", ""):
        with pytest.raises(ValueError, match="shards"):
            ddp_uneven.parse_shards(bad)


def test_chapter_02_ddp(no_leftovers):
    t0 = time.monotonic()
    out = execute_notebook("02_ddp.ipynb")
    errors, text = notebook_outputs(out)
    assert not errors, errors
    assert "Expected to have finished reduction in the prior iteration" in text
    assert "Timed out waiting 5000ms for recv operation to complete" in text
    assert "SyncBatchNorm layers only work with GPU modules" in text
    assert "[SKIP tier-multigpu]" in text
    print(f"chapter 02: {time.monotonic() - t0:.0f} s")
