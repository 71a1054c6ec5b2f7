"""runbook lint changes made in the thirty-third session of blind rounds (tests/data/lint/blind33 and the misses of
the earlier sets it revisited), each with its violation and its look-alike."""

from __future__ import annotations

import textwrap
from pathlib import Path

from helpers.lint import lint_paths

SCRIPT = """
import argparse
p = argparse.ArgumentParser()
p.add_argument("--deepspeed")
p.add_argument("--fsdp_config")
args = p.parse_args()
"""


def _ids(tmp_path: Path, launch: str, files: dict[str, str]) -> list[str]:
    for name, text in {"train.sh": launch, "train.py": SCRIPT, **files}.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(textwrap.dedent(text))
    paths = [str(tmp_path / n) for n in ("train.sh", "train.py", *files)]
    return [f.id for f in lint_paths(paths) if f.status != "OK"]


def test_launch_names_a_deepspeed_config_that_is_not_there(tmp_path, monkeypatch):
    """zero_nlp / ross3d / LEGENT (blind28): --deepspeed names a JSON file the repository does not hold."""
    monkeypatch.chdir(tmp_path)
    line = "torchrun --nproc_per_node 2 train.py --deepspeed configs/zero2.json\n"
    assert "config-path-missing" in _ids(tmp_path, line, {})
    assert "config-path-missing" not in _ids(tmp_path, line, {"configs/zero2.json": "{}"})
    variable = "torchrun --nproc_per_node 2 train.py --deepspeed $DS_CONFIG\n"
    assert "config-path-missing" not in _ids(tmp_path, variable, {})


def test_fsdp_config_and_hostfile_not_there(tmp_path, monkeypatch):
    """The script's --fsdp_config and DeepSpeed's --hostfile (ms-swift, blind11/blind20: DeepSpeed's runner then
    starts every rank on this node) checked alike; a linted file of that name counts as the file (files handed to
    the linter may be copies out of their tree)."""
    monkeypatch.chdir(tmp_path)
    line = "torchrun --nproc_per_node 2 train.py --fsdp_config train/scripts/fsdp.json\n"
    assert "config-path-missing" in _ids(tmp_path, line, {})
    assert "config-path-missing" not in _ids(tmp_path, line, {"train/scripts/fsdp.json": "{}"})
    assert "config-path-missing" not in _ids(tmp_path, line, {"copies/fsdp.json": "{}"})
    hosts = "deepspeed --hostfile=./examples/multi-node-deepspeed/host.txt train.py\n"
    assert "config-path-missing" in _ids(tmp_path, hosts, {})
    assert "config-path-missing" not in _ids(tmp_path, hosts, {"examples/multi-node-deepspeed/host.txt": "n1 slots=8\n"})


def test_a_config_the_launch_file_writes_first(tmp_path, monkeypatch):
    """bigscience-metadata / DeepSpeedExamples: the batch script writes the accelerate config, then launches with it."""
    monkeypatch.chdir(tmp_path)
    line = ("echo 'num_processes: 2' > acc.yaml\n"
            "accelerate launch --config_file acc.yaml train.py\n")
    assert "config-path-missing" not in _ids(tmp_path, line, {})
    assert "config-path-missing" in _ids(tmp_path, line.split("\n", 1)[1], {})


def test_no_verdict_without_the_script(tmp_path, monkeypatch):
    """A launch file linted alone (its script not given: peft's run_peft_fsdp.sh, a blind6 clean file) says nothing
    of the paths it names: where it runs from is unknown."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "run.sh").write_text("torchrun --nproc_per_node 2 other.py --deepspeed ds.json\n"
                                     "accelerate launch --config_file configs/fsdp.yaml other.py\n")
    assert "config-path-missing" not in [f.id for f in lint_paths([str(tmp_path / "run.sh")])]
