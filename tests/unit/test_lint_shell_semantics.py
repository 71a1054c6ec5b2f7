"""Launch-script rules from bash's own semantics (helpers/script_traps.py: srun-payload-split, shell-var-literal,
shell-positional-twice), each with its violation and its look-alike, through runbook lint and runbook build --check."""

from __future__ import annotations

import pytest

from helpers import cli, script_traps
from helpers.lint import lint_texts

NEW = ("srun-payload-split", "shell-var-literal", "shell-positional-twice")


def traps(text: str) -> dict[str, list[str]]:
    """``{rule: [status, ...]}`` of this module's rules in the text traps of ``text``."""
    out: dict[str, list[str]] = {}
    for t in script_traps.text_traps(text):
        if t.id in NEW:
            out.setdefault(t.id, []).append(t.status)
    return out


HEAD = "#!/bin/bash\n#SBATCH --nodes=2\n#SBATCH --ntasks-per-node=1\n"
TORCHRUN = "torchrun --nnodes=2 --nproc-per-node=4 --rdzv-backend=c10d --rdzv-endpoint=$HEAD_NODE:29500 train.py"


@pytest.mark.parametrize("op", [";", "&&", "||", "&"])
def test_a_launcher_after_a_control_operator_runs_on_the_first_node_only(op):
    assert traps(HEAD + f"srun --ntasks-per-node=1 hostname {op} {TORCHRUN}\n") == {"srun-payload-split": ["FAIL"]}


@pytest.mark.parametrize("text", [
    HEAD + f"srun --ntasks-per-node=1 bash -c 'cd $WORK; {TORCHRUN}'\n",           # inside the payload's own shell
    HEAD + f"srun --ntasks-per-node=1 {TORCHRUN} 2>&1 | tee log.txt\n",               # a pipe after the launcher
    "#!/bin/bash\n#SBATCH --nodes=1\nsrun hostname && torchrun --standalone train.py\n",  # one node: it is there
    HEAD + "srun hostname; python plot.py\n",                                        # no launcher after it
    HEAD + f"srun -N 1 hostname; {TORCHRUN}\n",                                      # srun -N 1 on this line
])
def test_a_launcher_inside_srun_or_on_one_node_is_not(text):
    assert "srun-payload-split" not in traps(text)


@pytest.mark.parametrize("line, status", [
    (r"srun torchrun --nnodes=2 --node_rank=\$SLURM_NODEID --master_addr=$HEAD train.py", "FAIL"),
    ("srun python train.py --master '$MASTER_ADDR'", "FAIL"),
    ("srun python train.py --out '$SCRATCH/run1'", "WARN"),
    (r"torchrun --nproc-per-node=4 train.py --data \${DATA_DIR}/train", "WARN"),
])
def test_a_dollar_kept_literal_for_a_program_without_a_shell(line, status):
    assert traps(HEAD + line + "\n") == {"shell-var-literal": [status]}


@pytest.mark.parametrize("line", [
    r"srun bash -c 'torchrun --node_rank=$SLURM_NODEID train.py'",        # the per-task shell expands it
    r"srun sh -c \"python train.py --rank \$SLURM_PROCID\"",
    'srun python train.py --out "$SCRATCH/run1"',                         # double quotes expand now
    "python -c 'import sys; print(sys.argv[1:])' a b",                    # lowercase: Python code, not a variable
    "CMD='torchrun --node_rank=$SLURM_NODEID train.py'",                  # an assignment for a later eval
    "echo 'run with $MASTER_ADDR'",
])
def test_a_dollar_a_shell_expands_later_is_not(line):
    assert "shell-var-literal" not in traps(HEAD + line + "\n")


def test_a_dollar_in_a_here_document_is_not():
    text = HEAD + "cat > run.sh <<'EOF'\ntorchrun --node_rank=$SLURM_NODEID train.py\nsrun python x.py '$A'\nEOF\n"
    assert "shell-var-literal" not in traps(text)


@pytest.mark.parametrize("line", [
    "python tools/train.py $1 --work-dir $4 ${@:4}",
    'python train.py --config $1 "$@"',
    "torchrun --nproc_per_node=$2 train.py $3 ${@:2:2}",
])
def test_an_argument_passed_again_by_a_positional_range(line):
    assert traps("#!/bin/bash\n" + line + "\n") == {"shell-positional-twice": ["WARN"]}


@pytest.mark.parametrize("line", [
    "python tools/train.py $1 --launcher pytorch ${@:3}",   # $1 before the range
    'python train.py "$@"',
    "torchrun --nproc_per_node=$2 train.py $1 ${@:3}",
    'echo "args: $1 $@"',
    "ARGS=\"$1 $@\"",
])
def test_arguments_before_the_range_are_not(line):
    assert "shell-positional-twice" not in traps("#!/bin/bash\n" + line + "\n")


def test_the_three_reach_lint_build_check_and_the_paste_box(capsys, tmp_path):
    """No launch line this parser reads (the launcher is outside every srun payload): build --check and the paste box
    still list the text's traps, as runbook lint does."""
    from helpers import widgets

    text = HEAD + f"srun hostname ; {TORCHRUN}\n" + "srun python train.py --out '$SCRATCH/x' ${@:1} $1\n"
    job = tmp_path / "job.sh"
    job.write_text(text)
    assert set(NEW) <= {f.id for f in lint_texts([(str(job), text)])}
    cli.main(["build", "--check-file", str(job)])
    out = capsys.readouterr()
    assert all(f"] {rule} (" in out.err for rule in NEW), out.err
    assert "no launch line this parser reads" in out.out
    assert cli.main(["build", "--check", "srun hostname"]) == 2  # nothing at all: still bad input
    builder = widgets.command_builder()
    builder.paste.value = text
    assert set(NEW) <= {t.id for t in builder.pasted_traps} and builder.load_button.disabled
