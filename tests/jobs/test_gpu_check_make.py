"""`make gpu-check` (helpers/gpu_check.py, issue 22) on this CPU machine, the real command: it exits cleanly, says there
is no GPU and skips every step with that reason; nothing pretends a GPU result."""

from __future__ import annotations

import json
import subprocess

from support import ROOT


def test_make_gpu_check_on_cpu_skips_everything_saying_why(tmp_path):
    out = tmp_path / "gc"
    proc = subprocess.run(["make", "--no-print-directory", "gpu-check", f"ARGS=--out {out}"], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    summary = json.loads((out / "summary.json").read_text())
    steps = summary["steps"]
    assert [s["name"] for s in steps][:3] == ["gpu-health", "diagnose", "fused-adam"]
    assert any(s["name"] == "chapter 06_multinode_network" for s in steps)
    assert all(s["status"] == "skipped" and s["why"].startswith("no GPU on this node") for s in steps)
    assert summary["inventory"]["cuda_gpus"] == 0 and summary["inventory"]["torch"]
    md = (out / "summary.md").read_text()
    assert "0 passed, 0 failed" in md and f"{len(steps)} skipped" in md and "no GPU on this node" in proc.stdout
