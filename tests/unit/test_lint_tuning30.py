"""runbook lint changes made while the thirtieth blind set (tests/data/lint/blind30) was collected and after it was
scored, each with its violation and its look-alike."""

from __future__ import annotations

import textwrap

from helpers.lint import lint_texts


def ids(*files: tuple[str, str]) -> list[str]:
    return [f.id for f in lint_texts([(n, textwrap.dedent(t)) for n, t in files]) if f.status != "OK"]


_ACC = """
compute_environment: LOCAL_MACHINE
deepspeed_config:
  deepspeed_config_file: ds.json
  zero3_init_flag: false
distributed_type: DEEPSPEED
{mp}num_machines: 1
num_processes: 2
"""


def test_top_level_mixed_precision_beside_a_deepspeed_config_file():
    """trlx (blind28): accelerate launch reads mixed_precision from the YAML (any value, 'no' included) and adds it
    to ACCELERATE_CONFIG_DS_FIELDS; DeepSpeedPlugin then raises 'When using `deepspeed_config_file`, the following
    accelerate config variables will be ignored' (reproduced with accelerate 1.15)."""
    bad = _ACC.replace("{mp}", "mixed_precision: 'no'\n")
    assert "acc-ds-file-overrides" in ids(("acc.yaml", bad))
    assert "acc-ds-file-overrides" not in ids(("acc.yaml", _ACC.replace("{mp}", "")))
    assert "acc-ds-file-overrides" not in ids(("acc.yaml", _ACC.replace("{mp}", "mixed_precision: null\n")))
    # the command line's --mixed_precision is read instead of the YAML's: no clash
    launch = "accelerate launch --config_file acc.yaml --mixed_precision fp16 train.py\n"
    assert "acc-ds-file-overrides" not in ids(("acc.yaml", bad), ("run.sh", launch))
    # without a DeepSpeed config file the YAML's precision is the one used
    plain = bad.replace("  deepspeed_config_file: ds.json\n", "  zero_stage: 2\n")
    assert "acc-ds-file-overrides" not in ids(("acc.yaml", plain))
