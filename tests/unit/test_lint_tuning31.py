"""runbook lint changes made on the thirty-first blind set (tests/data/lint/blind31), each with its violation and
its look-alike."""

from __future__ import annotations

import textwrap

from helpers.lint import lint_texts


def ids(*files: tuple[str, str]) -> list[str]:
    return [f.id for f in lint_texts([(n, textwrap.dedent(t)) for n, t in files]) if f.status != "OK"]


def test_collective_guarded_by_the_rank_while_the_group_needs_several_processes():
    """ultralytics: init_process_group in _setup_ddp, called only under `if world_size > 1:`; dist.broadcast under
    `if RANK > -1:`, which a one-process torchrun (RANK=0, world size 1) enters with no group."""
    src = """
    import torch.distributed as dist
    from utils import RANK

    class Trainer:
        def _setup_ddp(self, world_size):
            dist.init_process_group("nccl", rank=RANK, world_size=world_size)
        def _setup_train(self, world_size):
            self.amp = check_amp()
            if {guard}:
                dist.broadcast(self.amp, src=0)
        def _do_train(self, world_size=1):
            if world_size > 1:
                self._setup_ddp(world_size)
            self._setup_train(world_size)

    Trainer()._do_train(device_count())
    """
    assert "collective-before-init" in ids(("trainer.py", src.replace("{guard}", "RANK > -1")))
    assert "collective-before-init" not in ids(("trainer.py", src.replace("{guard}", "world_size > 1")))
    always = src.replace("            if world_size > 1:\n                self._setup_ddp(world_size)\n",
                         "            self._setup_ddp(world_size)\n")
    assert "collective-before-init" not in ids(("trainer.py", always.replace("{guard}", "RANK > -1")))


def test_unconditional_barrier_in_a_library_function_with_a_non_distributed_branch():
    """mmaction2's train_model: `if distributed: MMDistributedDataParallel(...) else: MMDataParallel(...)`, then
    dist.barrier() for both; tools/train.py calls it with distributed=False for --launcher none."""
    src = """
    import torch.distributed as dist

    def train_model(model, dataset, cfg, distributed=False):
        if distributed:
            model = MMDistributedDataParallel(model.cuda())
        else:
            model = MMDataParallel(model, device_ids=cfg.gpu_ids)
        runner.run(loaders)
        {barrier}
    """
    assert "collective-before-init" in ids(("train.py", src.replace("{barrier}", "dist.barrier()")))
    guarded = "if distributed:\n            dist.barrier()"
    assert "collective-before-init" not in ids(("train.py", src.replace("{barrier}", guarded)))


def test_namespace_refilled_from_a_saved_config():
    """neural_sp: every key of the saved conf.yml, local_rank included, written back into args on --resume."""
    src = """
    import torch

    def main(args):
        if args.resume:
            conf = load_config(args.resume_conf)
            for k, v in conf.items():
                if k != {keep}:
                    setattr(args, k, v)
        torch.cuda.set_device(args.local_rank)
    """
    assert "rank-overwritten-on-resume" in ids(("train.py", src.replace("{keep}", "'resume'")))
    kept = src.replace("if k != {keep}:", "if k not in ('resume', 'local_rank'):")
    assert "rank-overwritten-on-resume" not in ids(("train.py", kept))


def test_scripted_model_saved_on_every_rank():
    """wenet: torch.jit.script(model).save(init.zip) on every rank of a DDP job."""
    src = """
    import os
    import torch
    import torch.distributed as dist

    dist.init_process_group("nccl")
    model = build()
    script_model = torch.jit.script(model)
    {save}
    model = torch.nn.parallel.DistributedDataParallel(model)
    """
    save = "script_model.save(os.path.join(args.model_dir, 'init.zip'))"
    assert "write-on-every-rank" in ids(("train.py", src.replace("{save}", save)))
    gated = f"if dist.get_rank() == 0:\n        {save}"
    assert "write-on-every-rank" not in ids(("train.py", src.replace("{save}", gated)))


def test_attribute_set_on_the_main_process_only_and_read_by_every_process():
    """e2-tts: self.ema_model made under `if self.is_main:`, loaded in load_checkpoint on every process."""
    src = """
    from accelerate import Accelerator

    class Trainer:
        def __init__(self, model):
            self.accelerator = Accelerator()
            if self.accelerator.is_main_process:
                self.ema_model = EMA(model)
            {other}
        def load_checkpoint(self, ckpt):
            {use}
    """
    use = "self.ema_model.load_state_dict(ckpt['ema'])"
    assert "rank-gated-object-used" in ids(("trainer.py", src.replace("{other}", "pass").replace("{use}", use)))
    both = src.replace("{other}", "else:\n                self.ema_model = None").replace(
        "{use}", "if self.ema_model is not None:\n                " + use)
    assert "rank-gated-object-used" not in ids(("trainer.py", both))
    gated = src.replace("{other}", "pass").replace("{use}", "if self.accelerator.is_main_process:\n                " + use)
    assert "rank-gated-object-used" not in ids(("trainer.py", gated))


def test_scheduler_beside_an_optimizer_gated_by_a_freeze_step():
    """BigVGAN: the discriminator's optimizer steps only after freeze_step; its scheduler stepping every batch is the
    design, not an accumulation mistake.  The accumulation form is still found."""
    src = """
    for i, batch in enumerate(loader):
        loss = model(batch)
        loss.backward()
        if {test}:
            optim_d.step()
            optim_d.zero_grad()
        scheduler_d.step()
    """
    assert "scheduler-steps-per-microbatch" not in ids(("train.py", src.replace("{test}", "steps >= a.freeze_step")))
    assert "scheduler-steps-per-microbatch" in ids(("train.py", src.replace("{test}", "(i + 1) % accum == 0")))


def test_directory_made_on_the_main_process_then_wait_for_everyone():
    """distil-whisper: output_dir made on the main process, accelerator.wait_for_everyone(), then every process
    writes into it: the barrier orders them."""
    src = """
    import os
    from accelerate import Accelerator
    accelerator = Accelerator()

    def main(output_dir):
        if accelerator.is_main_process:
            os.makedirs(output_dir)
        {wait}
        with open(os.path.join(output_dir, f"part-{accelerator.process_index}.csv"), "w") as f:
            f.write("x")
    """
    assert "rank-gated-object-used" in ids(("run.py", src.replace("{wait}", "pass")))
    assert "rank-gated-object-used" not in ids(("run.py", src.replace("{wait}", "accelerator.wait_for_everyone()")))


def test_module_trained_beside_ddp_models_but_never_wrapped():
    """wetts' VITS2: net_g and net_d wrapped in DDP, the duration discriminator trained by its own optimizer and never
    wrapped: its gradients are not averaged."""
    src = """
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    def run(rank):
        net_g, net_d, net_dur = Gen(), Disc(), DurDisc()
        optim_g = torch.optim.AdamW(net_g.parameters(), 2e-4)
        optim_d = torch.optim.AdamW(net_d.parameters(), 2e-4)
        optim_dur = torch.optim.AdamW(net_dur.parameters(), 2e-4)
        net_g = DDP(net_g, device_ids=[rank])
        net_d = DDP(net_d, device_ids=[rank])
        {extra}
        train(net_g, net_d, net_dur)
    """
    assert "trained-module-not-wrapped" in ids(("train.py", src.replace("{extra}", "pass")))
    assert "trained-module-not-wrapped" not in ids(("train.py", src.replace("{extra}",
                                                                            "net_dur = DDP(net_dur, device_ids=[rank])")))
    helper = src.replace("{extra}", "net_dur = wrap_model(net_dur)")
    assert "trained-module-not-wrapped" not in ids(("train.py", helper))
    wrapper = """
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    def run(rank):
        model = Net().to(rank)
        ddp_model = DDP(model, device_ids=[rank])
        optimizer = torch.optim.Adadelta(ddp_model.parameters(), lr=1.0)
        train(ddp_model, optimizer)
    """
    assert "trained-module-not-wrapped" not in ids(("mnist.py", wrapper))  # the optimizer trains the wrapper itself
