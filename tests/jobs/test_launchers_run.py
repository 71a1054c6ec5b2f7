"""The argv that helpers.launchers.build_command returns starts a real torchrun job (the D1 contract)."""

from __future__ import annotations

from support import SCENARIOS

from helpers import jobs, launchers

CONTRACT = SCENARIOS / "launch_contract.py"


def test_built_command_really_runs(no_leftovers):
    """The argv from build_command starts a real job (torchrun on PATH via the runner) with the D1 contract."""
    cmd = launchers.build_command("torchrun", 2, script=jobs.SHIM, script_args=[CONTRACT, "--timeout-s", 20])
    run = jobs.run_commands([cmd], name="test-build-command", timeout_s=60, verbose=False)
    assert run.ok, run.summary()
    contracts = jobs.parse_records(run.output, "contract")
    assert sorted(c["RANK"] for c in contracts) == ["0", "1"] and {c["WORLD_SIZE"] for c in contracts} == {"2"}
    assert {g["world_size"] for g in jobs.parse_records(run.output, "group")} == {2}
