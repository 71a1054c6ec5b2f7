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


def test_run_chapter_takes_a_fractional_cell_timeout(tmp_path):
    """gpu_check hands run_chapter the seconds left of its budget (a float); nbclient's timeout is an int trait and
    refused 269.6 on the H200 machine, failing the chapter before any cell ran."""
    import nbformat

    from helpers import course

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell("print(6 * 7)")])
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3", "language": "python"}
    path = tmp_path / "99_tiny.ipynb"
    nbformat.write(nb, path)
    res = course.run_chapter(path, tmp_path / "out", timeout_s=29.6)
    assert res.status == "passed", res.error
    executed = nbformat.read(res.executed, as_version=4)
    assert executed.cells[0].outputs[0]["text"].strip() == "42"
