"""``runbook build``: the command builder on the command line (issue 16), run in-process through ``cli.main``."""

from __future__ import annotations

import pytest

from helpers import cli, launch_parse, launch_traps


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = cli.main(["build", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_build_prints_the_srun_lines_and_no_trap(capsys):
    code, out, err = run(capsys, "--launcher", "srun+torchrun", "--nodes", "2", "--nproc-per-node", "8", "train.py",
                         "--env", "NCCL_DEBUG=INFO")
    assert code == 0 and "srun --nodes=2 --ntasks-per-node=1 --cpus-per-task=\"${SLURM_CPUS_PER_TASK:-8}\" --export=ALL" in out and "export NCCL_DEBUG=INFO" in out
    assert err.strip() == "0 trap(s): none known"
    assert launch_parse.parse(out) == launch_traps.LaunchSpec(kind="srun+torchrun", nnodes=2, nproc_per_node=8, rdzv="static",
                                                               master_port=29500, env={"NCCL_DEBUG": "INFO"})


def test_build_exits_1_on_a_fail_trap_and_quotes_arguments(capsys):
    code, out, err = run(capsys, "--nodes", "2", "--master-addr", "localhost", "--script-args=--cfg 'a b.yaml'")
    assert code == 1 and "--cfg 'a b.yaml'" in out and "[FAIL] master-addr-loopback (master_addr)" in err


def test_build_sbatch_then_check_file_round_trip(capsys, tmp_path):
    code, out, err = run(capsys, "--launcher", "sbatch", "--nodes", "2", "--nproc-per-node", "4", "/tmp/train.py")
    assert code == 1 and out.startswith("#!/bin/bash") and "[FAIL] script-in-tmp" in err and "[FAIL]" not in out
    job = tmp_path / "job.sbatch"
    job.write_text(out)
    code, out, err = run(capsys, "--check-file", str(job))
    assert code == 1 and out.startswith("read as: sbatch, 2 node(s) x 4 rank(s)") and "script-in-tmp" in err


def test_check_a_pasted_command(capsys):
    code, out, err = run(capsys, "--check", "torchrun --standalone --nnodes=2 --nproc-per-node=8 train.py")
    assert code == 1 and "standalone-multinode" in err and "master-addr-missing" in err
    code, out, err = run(capsys, "--check", "echo hello")
    assert code == 2 and "no launcher found" in err


def test_build_and_check_report_traps_on_the_same_stream(capsys):
    """Issue 28: the summary went to stderr when building and to stdout when checking."""
    built = run(capsys, "--nodes", "2", "--master-addr", "localhost")
    checked = run(capsys, "--check", built[1])
    for code, out, err in (built, checked):
        assert code == 1 and "[FAIL] master-addr-loopback" in err and "trap(s), " in err.splitlines()[-1]
        assert "[FAIL]" not in out and "trap(s)" not in out


def test_script_args_quote_error_names_the_flag(capsys):
    code, out, err = run(capsys, "--script-args", "--name 'bob's run'")
    assert code == 2 and out == ""
    assert err.startswith("runbook build: --script-args=") and "No closing quotation" in err and len(err.splitlines()) == 1


@pytest.mark.parametrize("text, needle", [
    ("python train.py --lr 0.1", "`python train.py` starts the script with no launcher"),
    ("export MASTER_PORT=1234\nsrun -N 2 --ntasks-per-node=8 python3 train.py", "`python3 train.py` starts the script"),
    ("mpirun -np 16 -H a:8,b:8 python train.py", "Open MPI's variables (OMPI_COMM_WORLD_RANK"),
    ("#!/bin/bash\n#SBATCH --nodes=2\nmpiexec -n 2 python train.py", "sbatch: `mpiexec` starts the ranks"),
])
def test_no_launcher_is_explained_as_no_rank_contract(capsys, text, needle):
    """A bare ``python`` (D1) or an MPI launcher: what is missing and the fix, instead of 'no launcher found'."""
    code, out, err = run(capsys, "--check", text)
    assert code == 2 and needle in err and "D1" in err and "no launcher found" not in err


@pytest.mark.parametrize("argv, flag", [(["--master-port", "99999"], "--master-port"), (["--nodes", "0"], "--nodes"),
                                        (["--launcher", "mpirun"], "--launcher")])
def test_bad_flags_are_named(capsys, argv, flag):
    with pytest.raises(SystemExit) as exc:
        cli.main(["build", *argv])
    assert exc.value.code == 2 and flag in capsys.readouterr().err


def test_bad_env_is_named(capsys):
    code, _, err = run(capsys, "--env", "NCCL_DEBUG")
    assert code == 2 and "--env 'NCCL_DEBUG'" in err
