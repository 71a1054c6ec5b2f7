"""runbook lint changes made on the twenty-fourth blind set (tests/data/lint/blind24), each with its violation and its
look-alike."""

from __future__ import annotations

import textwrap

from helpers.lint import lint_texts


def ids(*files: tuple[str, str]) -> list[str]:
    return [f.id for f in lint_texts([(n, textwrap.dedent(t)) for n, t in files]) if f.status != "OK"]


def test_a_launcher_command_kept_in_a_variable_with_the_rank_expanded_by_the_batch_shell():
    """open-r1: LAUNCHER="accelerate launch ... --machine_rank $SLURM_PROCID ..." then srun bash -c "$LAUNCHER ..."."""
    job = ('#!/bin/bash\n#SBATCH --nodes=2\nexport LAUNCHER="accelerate launch \\\n    --num_machines 2 \\\n'
           '    --machine_rank $SLURM_PROCID \\\n    "\nsrun --nodes=2 --ntasks=2 bash -c "$LAUNCHER train.py"\n')
    assert "node-rank-fixed" in ids(("train.slurm", job))
    escaped = job.replace("--machine_rank $SLURM_PROCID", "--machine_rank \\$SLURM_PROCID")
    assert "node-rank-fixed" not in ids(("train.slurm", escaped))
    c10d = job.replace("    --num_machines 2 \\\n", "    --num_machines 2 --rdzv_backend=c10d \\\n")
    assert "node-rank-fixed" not in ids(("train.slurm", c10d))  # open-r1, alignment-handbook: the rendezvous ranks


def test_a_launcher_option_expanded_before_its_default_is_set():
    """awsome-distributed-training: TORCHRUN_ARGS=( --nproc_per_node=$NPROC_PER_NODE ) above NPROC_PER_NODE=${...:-4}."""
    job = ("#!/bin/bash\n#SBATCH --nodes=2\ndeclare -a TORCHRUN_ARGS=(\n    --nproc_per_node=$NPROC_PER_NODE\n"
           "    --nnodes=$SLURM_JOB_NUM_NODES\n)\nNPROC_PER_NODE=${NPROC_PER_NODE:-4}\n"
           "srun torchrun \"${TORCHRUN_ARGS[@]}\" train.py\n")
    assert "launcher-var-unset" in ids(("job.sbatch", job))
    before = job.replace("NPROC_PER_NODE=${NPROC_PER_NODE:-4}\n", "").replace(
        "declare -a TORCHRUN_ARGS", "NPROC_PER_NODE=${NPROC_PER_NODE:-4}\ndeclare -a TORCHRUN_ARGS")
    assert "launcher-var-unset" not in ids(("job.sbatch", before))
    in_function = ("#!/bin/bash\nlaunch() {\n    torchrun --nproc_per_node=$NPROC train.py\n}\nNPROC=4\nlaunch\n")
    assert "launcher-var-unset" not in ids(("run.sh", in_function))
