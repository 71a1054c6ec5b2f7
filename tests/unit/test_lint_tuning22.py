"""runbook lint changes made on the twenty-second blind set (tests/data/lint/blind22), each with its violation and its
look-alike; the #SBATCH option table checked against the installed sbatch's own parser."""

from __future__ import annotations

import os
import shutil
import subprocess
import textwrap

import pytest

from helpers import script_traps
from helpers.lint import lint_texts


def ids(*files: tuple[str, str]) -> list[str]:
    return [f.id for f in lint_texts([(n, textwrap.dedent(t)) for n, t in files]) if f.status != "OK"]


def test_python_312_f_strings_are_not_syntax_errors():
    """lingua and spd: f-strings with quotes of their own kind / backslashes in a replacement field (PEP 701)."""
    text = 'import torch\nlogger.info(f"path {str(Path(d) / "checkpoints")}")\ncmd = f"srun {q(f\'{a}\\n{b}\')}"\n'
    assert "python-syntax" not in ids(("train.py", text))
    assert "python-syntax" in ids(("train.py", text + "def broken(:\n    pass\n"))


def test_an_imported_helper_rebound_in_the_function_that_calls_it():
    """llama-recipes: `hsdp_device_mesh = None` then `hsdp_device_mesh(...)` in the same function."""
    text = """
    from llama_recipes.utils.fsdp_utils import hsdp_device_mesh
    def main(cfg):
        hsdp_device_mesh = None
        if cfg.hsdp:
            hsdp_device_mesh = hsdp_device_mesh(replica_group_size=cfg.r)
        return hsdp_device_mesh
    """
    assert "shadowed-import-called" in ids(("finetuning.py", text))
    renamed = text.replace("        hsdp_device_mesh = None", "        mesh = None").replace(
        "            hsdp_device_mesh = hsdp_device_mesh(", "            mesh = hsdp_device_mesh(").replace(
        "        return hsdp_device_mesh", "        return mesh")
    assert "shadowed-import-called" not in ids(("finetuning.py", renamed))


def test_a_model_on_the_meta_device_off_rank_zero_without_sync_module_states():
    text = """
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    def build(global_rank, config):
        if global_rank == 0:
            model = AutoModelForCausalLM.from_config(config)
        else:
            with torch.device("meta"):
                model = AutoModelForCausalLM.from_config(config)
        return FSDP(model, param_init_fn=(lambda m: m.to_empty(device="cuda", recurse=False))
                    if global_rank != 0 else None)
    """
    assert "fsdp-meta-without-sync" in ids(("train.py", text))
    synced = text.replace("return FSDP(model, ", "return FSDP(model, sync_module_states=True, ")
    assert "fsdp-meta-without-sync" not in ids(("train.py", synced))


def test_fsdp_optimizer_state_scattered_and_thrown_away():
    text = """
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    def resume(checkpoint, model, optimizer, rank):
        osd = checkpoint["optimizer_state_dict"] if rank == 0 else None
        FSDP.scatter_full_optim_state_dict(osd, model)
    """
    assert "collective-result-discarded" in ids(("train.py", text))
    kept = text.replace("        FSDP.scatter", "        sharded = FSDP.scatter") + \
        "        optimizer.load_state_dict(sharded)\n"
    assert "collective-result-discarded" not in ids(("train.py", kept))


def test_a_trainer_subclass_whose_training_step_calls_backward_itself():
    """GLM-4: Seq2SeqTrainer.training_step with loss.backward() under a ZeRO-3 config."""
    text = """
    from transformers import Seq2SeqTrainer as _Seq2SeqTrainer
    class Seq2SeqTrainer(_Seq2SeqTrainer):
        def training_step(self, model, inputs):
            loss = self.compute_loss(model, inputs)
            loss.backward()
            return loss.detach()
    """
    assert "wrapper-raw-backward" in ids(("finetune.py", text))
    right = text.replace("            loss.backward()", "            self.accelerator.backward(loss)")
    assert "wrapper-raw-backward" not in ids(("finetune.py", right))


def test_a_per_rank_seed_reset_alike_before_fsdp_is_not_a_divergent_init():
    """open_lm: random_seed(args.seed, args.rank) for data, then random_seed(args.seed, rank=0) before FSDP(...)."""
    text = """
    import torch
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    def random_seed(seed=42, rank=0):
        torch.manual_seed(seed + rank)
    def main(args):
        with torch.device("meta"):
            model = create_model(args)
        random_seed(args.seed, args.rank)
        random_seed(args.seed, rank=0)
        model = FSDP(model, device_id=args.device)
    """
    assert "rank-seed-before-model-init" not in ids(("main.py", text))
    assert "rank-seed-before-model-init" in ids(("main.py", text.replace("        random_seed(args.seed, rank=0)\n",
                                                                           "")))


def test_a_tensorboard_writer_made_everywhere_and_used_on_rank_zero_only():
    """DeepSpeed-Chat step 3: the writer is created on every rank, add_scalar runs under get_rank() == 0."""
    text = """
    import torch
    from torch.utils.tensorboard import SummaryWriter
    writer = SummaryWriter("logs")
    torch.distributed.init_process_group("nccl")
    for step in range(10):
        if torch.distributed.get_rank() == 0:
            writer.add_scalar("loss", 1.0, step)
    """
    assert "write-on-every-rank" not in ids(("main.py", text))
    ungated = text.replace("        if torch.distributed.get_rank() == 0:\n            writer", "        writer")
    assert "write-on-every-rank" in ids(("main.py", ungated))


def test_prepared_model_attribute_on_a_non_ddp_distributed_type():
    """Accelerate's example: `if accelerator.distributed_type == DistributedType.XLA: model.tie_weights()`."""
    text = """
    from accelerate import Accelerator, DistributedType
    from transformers import AutoModelForCausalLM
    accelerator = Accelerator()
    model = AutoModelForCausalLM.from_config(config)
    model, optimizer = accelerator.prepare(model, optimizer)
    if accelerator.distributed_type == DistributedType.XLA:
        model.tie_weights()
    """
    assert "ddp-wrapper-attribute" not in ids(("train.py", text))
    assert "ddp-wrapper-attribute" in ids(("train.py", text.replace(
        "if accelerator.distributed_type == DistributedType.XLA:\n    ", "if True:\n    ")))


def test_sbatch_tasks_fewer_than_nodes():
    """oumi's Frontier launcher: `sbatch -N ${FRONTIER_NODES} -n1 job.sh`."""
    assert "sbatch-tasks-fewer-than-nodes" in ids(("launcher.sh", "sbatch -N ${NODES} -n1 job.sh\n"))
    assert "sbatch-tasks-fewer-than-nodes" in ids(("job.sh", "#!/bin/bash\n#SBATCH -N 4\n#SBATCH -n 2\nsrun hostname\n"))
    assert "sbatch-tasks-fewer-than-nodes" not in ids(("launcher.sh", "sbatch -N ${NODES} --ntasks-per-node=1 job.sh\n"))
    assert "sbatch-tasks-fewer-than-nodes" not in ids(("job.sh", "#!/bin/bash\n#SBATCH -N 2\n#SBATCH -n 16\nsrun x\n"))


OPTIONS = ["--nodes=2", "--tasks-per-node=2", "--ntasks-per-node=2", "--gpus-per-node=8", "--gpus-per-nodes=8",
           "--ntasks-per=1", "--ntasks-per-n=1", "--wait-all-nodes=1", "--exclusive", "--time=10", "-N2",
           "--mem-per-gpu=8G", "--gres=gpu:8", "--foo", "--cpus-per-gpu=4", "--signal=USR1@90", "--hint=nomultithread"]
REJECTED = {"--gpus-per-nodes=8", "--ntasks-per=1", "--foo"}


def flagged(option: str) -> bool:
    job = f"#!/bin/bash\n#SBATCH {option}\nsrun hostname\n"
    return "sbatch-option-unknown" in ids(("job.sh", job))


@pytest.mark.parametrize("option", OPTIONS)
def test_sbatch_option_verdicts(option):
    assert flagged(option) == (option in REJECTED), option


def test_sbatch_option_unknown_through_build_check():
    job = "#!/bin/bash\n#SBATCH --gpus-per-nodes=8\nsrun torchrun --nnodes=1 --nproc-per-node=8 train.py\n"
    assert "sbatch-option-unknown" in [t.id for t in script_traps.check_text(job, file=True)[1]]


@pytest.mark.skipif(shutil.which("sbatch") is None, reason="sbatch is not installed")
def test_sbatch_option_verdicts_agree_with_the_installed_sbatch(tmp_path):
    """The table against sbatch's own getopt: with a controller that is not there, a known option fails at submission
    ('Unable to contact slurm controller'), an unknown or ambiguous one at parsing (all submitted at once: each
    waits about 9 s for the controller)."""
    conf = tmp_path / "slurm.conf"
    conf.write_text("ClusterName=t\nSlurmctldHost=localhost\nSlurmctldPort=1\nNodeName=n1 CPUs=1\n"
                    "PartitionName=p Nodes=n1 Default=YES\n")
    runs = []
    for i, option in enumerate(OPTIONS):
        job = tmp_path / f"job{i}.sh"
        job.write_text(f"#!/bin/bash\n#SBATCH {option}\nsrun hostname\n")
        runs.append((option, subprocess.Popen(["sbatch", str(job)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                              text=True, cwd=tmp_path, env={**os.environ, "SLURM_CONF": str(conf)},
                                              start_new_session=True)))
    for option, proc in runs:
        try:
            _out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                os.killpg(proc.pid, 9)
                proc.wait()
        rejected = "unrecognized option" in err or "is ambiguous" in err or "invalid option" in err
        assert flagged(option) == rejected, (option, err)


def test_a_rank_zero_logger_handed_to_a_trainer_of_another_file():
    """llm-random: `logger = get_logger(...) if rank == 0 else None`, then ConditionalTrainer(logger=logger) whose
    methods call self.logger.report_scalar with no test."""
    train = """
    import torch.distributed as dist
    def main(rank, model):
        dist.init_process_group("nccl")
        logger = get_logger(model) if rank == 0 else None
        trainer = ConditionalTrainer(model=model, logger=logger)
        trainer.train(100)
    """
    trainer = """
    from attr import define
    @define(slots=False)
    class ConditionalTrainer:
        model: object
        logger: object
        def train(self, steps):
            for step in range(steps):
                self.logger.report_scalar(title="step", value=step, iteration=step)
    """
    assert "rank-gated-object-used" in ids(("cc_train.py", train), ("conditional_trainer.py", trainer))
    tested = trainer.replace("                self.logger.report_scalar",
                             "                if self.logger is not None:\n                    self.logger.report_scalar")
    assert "rank-gated-object-used" not in ids(("cc_train.py", train), ("conditional_trainer.py", tested))
    everywhere = train.replace(" if rank == 0 else None", "")
    assert "rank-gated-object-used" not in ids(("cc_train.py", everywhere), ("conditional_trainer.py", trainer))
