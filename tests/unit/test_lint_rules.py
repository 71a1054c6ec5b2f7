"""runbook lint: rule details (taint through helpers, early exits, cross-file checks), the CLI contract, launch_parse."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from helpers import cli, launch_traps
from helpers.checks import Check, lint_line
from helpers.launch_parse import parse_command, parse_sbatch
from helpers.launch_traps import LaunchSpec
from helpers.lint import lint_texts
from helpers.lint.findings import finding

REPO = Path(__file__).resolve().parents[2]


def rules(*files: tuple[str, str], command: str | None = None) -> list[str]:
    return [f.id for f in lint_texts([(p, textwrap.dedent(t)) for p, t in files], command)]


def test_collective_through_a_helper_and_after_an_early_return():
    src = """
    import torch.distributed as dist
    def save(model):
        torch.save(model.state_dict(), "m.pt")
        dist.barrier()
    def evaluate(model):
        if dist.get_rank() != 0:
            return None
        dist.all_reduce(acc)
    def main():
        rank = dist.get_rank()
        is_main = rank == 0
        if is_main:
            save(model)
        evaluate(model)
    """
    got = lint_texts([("t.py", textwrap.dedent(src))])
    gated = [f for f in got if f.id == "rank-gated-collective"]
    assert gated and "save() -> dist.barrier" in gated[0].title and gated[0].line_no == 14
    assert "rank-early-exit-collective" in [f.id for f in got]


def test_rank_dependent_break_in_a_loop():
    src = """
    import torch.distributed as dist
    for step, batch in enumerate(loader):
        if dist.get_rank() == 0 and step > max_steps:
            break
        dist.all_reduce(loss)
    """
    assert "rank-early-exit-collective" in rules(("t.py", src))


def test_balanced_branches_and_minus_one_checks_are_not_findings():
    src = """
    import torch.distributed as dist
    if rank == 0:
        dist.broadcast(x, src=0)
    else:
        dist.broadcast(y, src=0)
    if args.local_rank != -1:
        dist.barrier()
    if rank == 0:
        dist.send(t, dst=1)
    """
    assert rules(("t.py", src)) == []


def test_suppression_comment():
    src = """
    import torch.distributed as dist
    if dist.get_rank() == 0:
        dist.barrier()  # runbook-lint: disable=rank-gated-collective
    """
    assert rules(("t.py", src)) == []


def test_device_from_global_rank_but_not_from_modulo_or_local_rank():
    bad = "import os, torch\nrank = int(os.environ['RANK'])\ntorch.cuda.set_device(rank)\n"
    good = ("import os, torch\nrank = int(os.environ['RANK'])\nlocal_rank = int(os.environ['LOCAL_RANK'])\n"
            "torch.cuda.set_device(rank % torch.cuda.device_count())\ndevice = torch.device('cuda', local_rank)\n")
    assert rules(("a.py", bad)) == ["device-from-global-rank"]
    assert rules(("b.py", good)) == []


def test_fsdp_options():
    src = """
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP, MixedPrecision, FullStateDictConfig
    mp = MixedPrecision(param_dtype=torch.bfloat16)
    model = FSDP(model, mixed_precision=mp)
    cfg = FullStateDictConfig(offload_to_cpu=True)
    """
    assert sorted(rules(("f.py", src))) == ["fsdp-full-state-dict-all-ranks", "fsdp-no-wrap-policy",
                                            "fsdp-partial-mixed-precision"]
    # both options written out, even as False, are a choice (accelerate's peak-memory example, lint blind6)
    chosen = "from torch.distributed.fsdp import FullStateDictConfig\ncfg = FullStateDictConfig(offload_to_cpu=False, rank0_only=False)\n"
    assert "fsdp-full-state-dict-all-ranks" not in rules(("g.py", chosen))


DS_SCRIPT = """
import deepspeed, torch
engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(), config="ds.json")
x = torch.randn(32, 4096, device=engine.device)
"""


def test_cross_file_deepspeed_checks():
    cfg = json.dumps({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1,
                      "zero_optimization": {"stage": 1}, "bf16": {"enabled": True}, "fp16": {"enabled": True}})
    got = rules(("train.py", DS_SCRIPT), ("ds.json", cfg), command="torchrun --nnodes=1 --nproc-per-node=2 train.py")
    assert {"ds-zero-without-optimizer", "ds-batch-mismatch", "ds-fp16-and-bf16", "half-config-float32-inputs"} <= set(got)
    # the same arithmetic next to a world size of 4, with an optimizer section: nothing to report
    fixed = json.dumps({"train_batch_size": 64, "train_micro_batch_size_per_gpu": 16, "gradient_accumulation_steps": 1,
                        "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}, "zero_optimization": {"stage": 1}})
    assert rules(("ds.json", fixed), command="torchrun --nnodes=1 --nproc-per-node=4 train.py") == []


def test_deepspeed_sub_config_is_validated_by_deepspeed_and_top_level_by_us():
    cfg = json.dumps({"zero_optimization": {"stage": 2, "overlap_com": True}, "stage": 2, "train_batch_sise": 8})
    got = rules(("ds.json", cfg))
    assert {"ds-invalid-section", "ds-misplaced-key", "ds-unknown-key"} <= set(got)


def test_accelerate_config_checks():
    yaml_text = """
    compute_environment: LOCAL_MACHINE
    distributed_type: MULTI_GPU
    num_machines: 2
    num_processes: 7
    mixed_precision: bf16
    """
    assert rules(("a.yaml", yaml_text)) == ["acc-processes-not-divisible"]
    assert rules(("b.yaml", "distributed_type: NO\nnum_processes: 1\nbogus_key: 1\n")) == ["acc-invalid-config"]


SBATCH_EARLY = """\
#!/bin/bash
#SBATCH --nodes=2
#SBATCH --ntasks-per-node=1
MASTER_ADDR=$(scontrol show hostnames $SLURM_JOB_NODELIST | head -n 1)
srun --export=NONE bash -c "torchrun --nnodes=2 --nproc-per-node=8 --node-rank=$SLURM_NODEID --master-addr=\\$MASTER_ADDR --master-port=29500 train.py"
"""


def test_sbatch_rules_come_from_launch_traps():
    ids = {f.id for f in lint_texts([("job.sbatch", SBATCH_EARLY)])}
    assert {"node-rank-fixed", "srun-export-none", "master-addr-not-exported"} <= ids
    spec = parse_sbatch(SBATCH_EARLY)
    assert spec.node_rank == 0 and spec.srun_export == "NONE" and spec.nnodes == 2
    assert {t.id for t in launch_traps.find_traps(spec)} >= {"node-rank-fixed", "srun-export-none"}


def test_the_generated_sbatch_script_is_clean():
    spec = LaunchSpec(kind="sbatch", nnodes=2, nproc_per_node=4, rdzv="static", master_port=29500, gpus_per_node=4)
    assert rules(("job.sbatch", launch_traps.render(spec))) == []


@pytest.mark.parametrize("spec", [
    LaunchSpec(nproc_per_node=2),
    LaunchSpec(nnodes=2, rdzv="c10d", master_addr="n0", master_port=29400, nproc_per_node=8, script_args=("--lr", "1e-4")),
    LaunchSpec(nnodes=2, rdzv="static", master_addr="n0", master_port=29500, node_rank=1),
    LaunchSpec(kind="accelerate", nnodes=2, nproc_per_node=2, master_addr="n0", master_port=29500, node_rank=1, rdzv="static"),
    LaunchSpec(kind="deepspeed", nproc_per_node=2, master_port=29611, rdzv="static"),
    LaunchSpec(kind="deepspeed", nnodes=2, master_addr="n0", master_port=29500, node_rank=1, rdzv="static"),
    LaunchSpec(kind="srun+torchrun", nnodes=2, nproc_per_node=4, master_port=29500, rdzv="static",
               env={"NCCL_DEBUG": "INFO", "NCCL_SOCKET_IFNAME": None}),
    LaunchSpec(kind="sbatch", nnodes=3, nproc_per_node=4, master_port=29501, rdzv="c10d", gpus_per_node=4, env={"A": "1"}),
])
def test_parse_is_the_inverse_of_render(spec):
    text = launch_traps.render(spec)
    back = parse_sbatch(text) if spec.kind == "sbatch" else parse_command(text)
    assert back == spec


def test_parse_command_forms():
    s = parse_command("python -m torch.distributed.run --standalone --nproc_per_node 4 train.py --epochs 3")
    assert (s.kind, s.nproc_per_node, s.rdzv, s.script_args) == ("torchrun", 4, "standalone", ("--epochs", "3"))
    s = parse_command("export NCCL_SOCKET_IFNAME=ibp65s0\nsrun --nodes=2 --ntasks-per-node=2 torchrun --nnodes=2 "
                      "--nproc-per-node=4 --rdzv-backend=c10d --rdzv-endpoint=n0:29400 /tmp/train.py")
    assert s.srun_ntasks_per_node == 2 and s.env == {"NCCL_SOCKET_IFNAME": "ibp65s0"}
    assert {t.id for t in launch_traps.find_traps(s)} >= {"srun-tasks-per-node", "script-in-tmp", "ifname-node-specific"}
    s = parse_command("torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint=n0:29400 "
                      "train.py --deepspeed_config /tmp/ds.json")
    assert [t.id for t in launch_traps.find_traps(s)] == ["args-in-tmp"]
    with pytest.raises(ValueError, match="no launcher"):
        parse_command("python train.py")


def test_finding_is_a_check_with_lint_severities():
    f = finding("r", "warning", "a.py", 3, "msg", "fix", "D21")
    assert (f.status, f.id, f.source, f.file, f.line_no) == ("WARN", "r", "D21", "a.py", 3)
    assert type(f) is Check and f.line() == "[WARN] r a.py:3: msg\n       -> fix"
    assert lint_line(f) == "a.py:3: warning r [D21]: msg\n    fix: fix"
    with pytest.raises(ValueError, match="severity"):
        finding("r", "fatal", "a.py", 1, "m", "f", "D1")


def _run_cli(argv: list[str]) -> int:
    return cli.main(["lint", *argv])


def test_cli_exit_codes_and_json(tmp_path, capsys):
    bad = tmp_path / "train.py"
    bad.write_text("import torch.distributed as dist\nif dist.get_rank() == 0:\n    dist.barrier()\n")
    ok = tmp_path / "ok.py"
    ok.write_text("import torch.distributed as dist\ndist.barrier()\n")
    assert _run_cli([str(ok)]) == 0
    capsys.readouterr()
    assert _run_cli([str(bad), "--json"]) == 1
    first = json.loads(capsys.readouterr().out)["checks"][0]
    assert {k: first[k] for k in ("id", "source", "status", "file", "line_no")} == {
        "id": "rank-gated-collective", "source": "D21", "status": "FAIL", "file": str(bad), "line_no": 3}
    assert first["title"] and first["remediation"]
    missing = tmp_path / "nope.json"
    assert _run_cli([str(missing), str(bad)]) == 2
    captured = capsys.readouterr()
    assert f"{missing}: cannot open it" in captured.err and "rank-gated-collective" in captured.out


def test_the_scenarios_buggy_modes_are_found():
    """The project's own reproductions: the linter finds the intended bug where it is statically decidable."""
    paths = [REPO / "helpers" / "scenarios" / n for n in ("hangs.py", "ds_checkpoint.py", "fsdp_checkpoint.py")]
    got = {(Path(f.file).name, f.id) for f in lint_texts([(str(p), p.read_text()) for p in paths])}
    assert ("hangs.py", "rank-gated-collective") in got        # rank0_save: save_checkpoint() -> dist.barrier (D21)
    assert ("hangs.py", "rank-sliced-data") in got             # uneven: data[rank * per:(rank + 1) * per] (D22)
    assert ("ds_checkpoint.py", "rank-gated-collective") in got  # engine.save_checkpoint under rank == 0 (Gilbreth 7.5)
    assert ("fsdp_checkpoint.py", "rank-gated-collective") in got  # get_model_state_dict on rank 0 only (D21)
    assert ("fsdp_checkpoint.py", "fsdp-full-state-dict-all-ranks") in got  # the offload_to_cpu demo (D15)


def test_json_output_stays_json_when_deepspeed_is_imported(tmp_path, capsys):
    cfg = tmp_path / "ds.json"
    cfg.write_text(json.dumps({"train_batch_size": 8, "zero_optimization": {"stage": 2, "overlap_comm": True},
                               "optimizer": {"type": "AdamW", "params": {"lr": 1e-4}}}))
    assert _run_cli([str(cfg), "--json"]) == 0
    assert json.loads(capsys.readouterr().out) == {"checks": []}


def test_flat_targets_unpacks_nested_tuples_lists_and_starred():
    """The one walk the rules share for the names and attributes an assignment binds."""
    import ast

    from helpers.lint.wrappers import flat_targets

    node = ast.parse("a, [self.b, *c], (d, (e,)) = x = v").body[0]
    assert [ast.unparse(t) for t in flat_targets(node)] == ["a", "self.b", "c", "d", "e", "x"]
    assert [ast.unparse(t) for t in flat_targets(ast.parse("n += 1").body[0])] == ["n"]
