"""environment.yml (conda, GPU clusters) and pyproject.toml list the same packages."""

from __future__ import annotations

import re

import tomllib
import yaml
from support import ROOT


def _name(spec: str) -> str:
    return re.split(r"[<>=!~ \[]", spec.strip(), maxsplit=1)[0].lower().replace("_", "-")


def test_environment_matches_pyproject():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    env = yaml.safe_load((ROOT / "environment.yml").read_text())
    pip = next(d["pip"] for d in env["dependencies"] if isinstance(d, dict) and "pip" in d)
    pip = [p for p in pip if not p.startswith("-e")]
    assert sorted(map(_name, pip)) == sorted(map(_name, deps))
    # the torch pin is the same exact version in both
    assert [p for p in pip if _name(p) == "torch"] == [d for d in deps if _name(d) == "torch"] == ["torch==2.13.0"]


def test_ci_runs_the_readme_test_command():
    readme = (ROOT / "README.md").read_text()
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make test" in readme and "make test" in ci
