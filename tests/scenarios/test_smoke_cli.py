"""The Gilbreth smoke scripts' command lines: ``--help`` lists the common flags, ``--steps 0`` is a usage error."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from support import SCENARIOS, run

SCRIPTS = {"01": SCENARIOS / "smoke_single.py", "02": SCENARIOS / "smoke_ddp.py", "03": SCENARIOS / "smoke_deepspeed.py"}


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_help(name: str, run_env: dict[str, str]) -> None:
    """``--help`` answers at once (torch is imported after argparse) and lists the common flags."""
    proc = run([sys.executable, str(SCRIPTS[name]), "--help"], run_env, 60)
    assert proc.returncode == 0, proc.stderr
    for flag in ("--steps", "--hidden", "--batch", "--ckpt-dir", "--out", "--seed", "--timeout-s"):
        assert flag in proc.stdout
    assert ("--backend" in proc.stdout) == (name != "01")


@pytest.mark.parametrize("name", sorted(SCRIPTS))
def test_steps_zero_rejected(name: str, tmp_path: Path, run_env: dict[str, str]) -> None:
    """``--steps 0`` is a usage error (exit 2) whose message names ``--steps``; nothing is written."""
    out = tmp_path / "never.json"
    proc = run([sys.executable, str(SCRIPTS[name]), "--steps", "0", "--ckpt-dir", str(tmp_path / "ckpt"),
                "--out", str(out)], run_env, 60)
    assert proc.returncode == 2
    assert "--steps" in proc.stderr
    assert not out.exists()
