"""Run the three Gilbreth smoke tests (Gilbreth 5, Gilbreth 6, Gilbreth 7) for real, on the CPU.

* 01 ``smoke_single.py`` with plain ``python``;
* 02 ``smoke_ddp.py`` with ``torchrun --standalone --nproc-per-node 2`` (section 6.6);
* 03 ``smoke_deepspeed.py`` with the ``deepspeed --num_gpus 2`` launcher (section 7.8), which
  appends ``--local_rank=N`` to the script's arguments, and once more with torchrun (which
  does not, so the script must take LOCAL_RANK from the environment) and a ``--batch`` that
  differs from the config's micro batch.

Each run is short (``--steps 10``) and asserts on the JSON result and the exit code.  The
first DeepSpeed run on a machine JIT-builds DeepSpeed's shared-memory comm op (~35-45 s);
``TORCH_EXTENSIONS_DIR`` points at ``build/torch_extensions`` so that later runs reuse it.
"""

from __future__ import annotations

import json
import math
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from support import run

REPO = Path(__file__).resolve().parents[2]
SCEN = REPO / "helpers" / "scenarios"
BIN = Path(sys.executable).parent
SCRIPTS = {"01": SCEN / "smoke_single.py", "02": SCEN / "smoke_ddp.py", "03": SCEN / "smoke_deepspeed.py"}
STEPS = 10
RUN_TIMEOUT_S = 120
DS_TIMEOUT_S = 300  # includes the one-off JIT build of the comm op on a fresh machine


def free_port() -> int:
    """Return a TCP port that was free a moment ago (for the deepspeed launcher's --master_port)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def check_result(proc: subprocess.CompletedProcess, out: Path, test: str, world_size: int) -> dict:
    """Assert that a smoke run exited 0 and that its JSON result reports a pass; return the JSON."""
    assert proc.returncode == 0, f"rc={proc.returncode}\nSTDOUT:\n{proc.stdout[-4000:]}\nSTDERR:\n{proc.stderr[-4000:]}"
    result = json.loads(out.read_text())
    assert result["test"] == test
    assert result["passed"] is True
    assert result["checkpoint_reload"] is True
    assert result["world_size"] == world_size
    assert result["steps"] == STEPS
    assert result["steps_per_s"] > 0
    assert result["samples_per_s"] == pytest.approx(result["steps_per_s"] * result["batch"] * world_size)
    assert math.isfinite(result["final_loss"])
    assert result["params"] == 1_575_168  # the section 5.3 MLP at hidden 256
    assert result["checkpoint_bytes"] > 0
    assert result["peak_memory"]["bytes"] > 0
    assert "torch" in result["versions"]
    assert f"step {STEPS}/{STEPS} loss" in proc.stdout
    return result


def test_01_single(tmp_path: Path, run_env: dict[str, str]) -> None:
    """01 (section 5): one process trains, saves, reloads into a fresh model: exact."""
    out = tmp_path / "01.json"
    proc = run([sys.executable, str(SCRIPTS["01"]), "--steps", str(STEPS), "--ckpt-dir", str(tmp_path / "ckpt"),
                "--out", str(out)], run_env, RUN_TIMEOUT_S)
    result = check_result(proc, out, "01_single", 1)
    assert result["device"] in ("cpu", "cuda:0")
    assert (tmp_path / "ckpt" / "smoke_1gpu.pt").stat().st_size == result["checkpoint_bytes"]


def test_02_ddp(tmp_path: Path, run_env: dict[str, str]) -> None:
    """02 (section 6): torchrun, 2 ranks of DDP; rank 0 saves model.module, every rank reloads exactly."""
    out = tmp_path / "02.json"
    proc = run([str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2",
                "--log-dir", str(tmp_path / "torchrun-logs"), str(SCRIPTS["02"]), "--steps", str(STEPS),
                "--ckpt-dir", str(tmp_path / "ckpt"), "--out", str(out)], run_env, RUN_TIMEOUT_S)
    result = check_result(proc, out, "02_ddp", 2)
    assert result["backend"] in ("gloo", "nccl")
    assert proc.stdout.count("checkpoint reload: SUCCESS") == 2  # both ranks checked


def test_03_deepspeed_launcher(tmp_path: Path, run_env: dict[str, str]) -> None:
    """03 (section 7): the deepspeed launcher, 2 ranks, ZeRO-1 bf16, collective save + load, exact."""
    out = tmp_path / "03.json"
    proc = run([str(BIN / "deepspeed"), "--num_gpus", "2", "--master_port", str(free_port()), str(SCRIPTS["03"]),
                "--steps", str(STEPS), "--ckpt-dir", str(tmp_path / "ckpt"), "--out", str(out)],
               run_env, DS_TIMEOUT_S)
    result = check_result(proc, out, "03_deepspeed_zero1", 2)
    assert "--local_rank=1" in proc.stdout + proc.stderr  # the launcher appended it and the script took it
    assert result["zero_stage"] == 1
    assert result["dtype"] == "torch.bfloat16"
    assert result["train_batch_size"] == 64  # derived by DeepSpeed: 32 micro x 2 ranks x 1 accumulation
    assert result["versions"]["deepspeed"]
    # One model file, one optimizer shard per rank (ZeRO-1 partitions the optimizer state).
    assert sum("optim_states" in f for f in result["checkpoint_files"]) == 2
    assert any("model_states" in f for f in result["checkpoint_files"])
    assert proc.stdout.count("checkpoint reload: SUCCESS") == 2


def test_03_deepspeed_torchrun_batch_override(tmp_path: Path, run_env: dict[str, str]) -> None:
    """03 under torchrun (no --local_rank argument) with --batch 16: DeepSpeed derives train_batch_size 32."""
    out = tmp_path / "03.json"
    proc = run([str(BIN / "torchrun"), "--standalone", "--nproc-per-node", "2",
                "--log-dir", str(tmp_path / "torchrun-logs"), str(SCRIPTS["03"]), "--steps", str(STEPS),
                "--batch", "16", "--ckpt-dir", str(tmp_path / "ckpt"), "--out", str(out)], run_env, DS_TIMEOUT_S)
    result = check_result(proc, out, "03_deepspeed_zero1", 2)
    assert result["batch"] == 16
    assert result["train_batch_size"] == 32
    assert result["deepspeed_config"]["train_micro_batch_size_per_gpu"] == 16


