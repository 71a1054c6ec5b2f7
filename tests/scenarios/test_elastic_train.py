"""elastic_train.py (chapter 07, MN5/MN6): its argument parser and LR schedule."""

from __future__ import annotations

import os

import pytest

from helpers import resume


def test_scenario_rejects_bad_arguments():
    from helpers.scenarios import elastic_train

    assert elastic_train.parse_args(["--steps", "4", "--crash-at", "3"]).crash_at == 3
    for bad in (["--steps", "0"], ["--steps", "4", "--crash-at", "4"], ["--scale", "pinned"]):
        with pytest.raises(SystemExit):
            elastic_train.parse_args(bad)
    assert elastic_train.lr_factor(0) == pytest.approx(1 / 3) and elastic_train.lr_factor(6) == 0.5
    assert os.path.basename(resume.SCRIPT) == "elastic_train.py"
