"""ds_config_check.py (chapter 05, D17/D18): the checker's command line and exit status."""

from __future__ import annotations

import json
import re

from support import ROOT

from helpers.scenarios import ds_config_check


def test_checker_cli(tmp_path, capsys):
    good = json.loads((ROOT / "configs" / "ds_zero2_cpu.json").read_text())
    typo = tmp_path / "typo.json"
    typo.write_text(json.dumps({k: v for k, v in good.items() if k != "gradient_clipping"} | {"gradient_clip": 0.0}))
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(dict(good, zero_optimization={"stage": 2, "offload_optimiser": {"device": "cpu"}})))
    ok_path = str(ROOT / "configs" / "ds_zero2_cpu.json")
    assert ds_config_check.main([ok_path, str(typo), "--world-size", "2"]) == 0
    out = capsys.readouterr().out
    assert "[OK]   " in out and "[WARN] " in out and "'gradient_clip' looks like 'gradient_clipping'" in out
    assert ds_config_check.main([ok_path, str(typo), "--strict"]) == 1
    capsys.readouterr()
    assert ds_config_check.main([str(bad)]) == 1
    assert "[FAIL]" in capsys.readouterr().out


def test_checker_flags_auto(tmp_path, capsys):
    """D18: "auto" inside zero_optimization silently becomes stage 0; "auto" batch keys fail."""
    good = json.loads((ROOT / "configs" / "ds_zero2_cpu.json").read_text())
    stage_auto = tmp_path / "stage_auto.json"
    stage_auto.write_text(json.dumps(dict(good, zero_optimization={"stage": "auto"})))
    batch_auto = tmp_path / "batch_auto.json"
    batch_auto.write_text(json.dumps(dict(good, train_micro_batch_size_per_gpu="auto")))
    assert ds_config_check.main([str(stage_auto)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("[WARN]") and "zero_optimization.stage is \"auto\"" in out
    assert re.search(r"zero_optimization\.stage +0 +\('auto' in the file", out)
    assert ds_config_check.main([str(batch_auto)]) == 1
    assert "[FAIL]" in capsys.readouterr().out
