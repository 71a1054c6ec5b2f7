"""runbook lint rules tuned on the sixteenth blind set (tests/data/lint/blind16), each with its violation and its
look-alike."""

from __future__ import annotations

import textwrap

from helpers.lint import lint_texts


def ids(*files: tuple[str, str]) -> list[str]:
    return [f.id for f in lint_texts([(n, textwrap.dedent(t)) for n, t in files]) if f.status != "OK"]


def test_gather_of_eval_outputs_keeps_the_padding_duplicates():
    text = """
    from accelerate import Accelerator
    accelerator = Accelerator()
    model, eval_dataloader = accelerator.prepare(model, eval_dataloader)
    preds = []
    for batch in eval_dataloader:
        out = model(**batch)
        preds.extend(accelerator.gather(out).tolist())
    """
    assert "gather-not-for-metrics" in ids(("train.py", text))
    assert "gather-not-for-metrics" not in ids(("train.py", text.replace(".gather(", ".gather_for_metrics(")))
    trimmed = text + "    preds = preds[: len(eval_dataloader.dataset)]\n"   # the pre-0.12 manual trim
    assert "gather-not-for-metrics" not in ids(("train.py", trimmed))
    train = text.replace("eval_dataloader", "train_dataloader")                # a training gather is no metric
    assert "gather-not-for-metrics" not in ids(("train.py", train))


def test_ema_copy_made_before_the_model_moves_to_the_gpu():
    text = """
    import torch
    from timm.utils import ModelEma
    def main(args):
        model = build()
        model_ema = ModelEma(model, decay=0.999, device='')
        model.to(device)
    """
    assert "ema-before-to-device" in ids(("train.py", text))
    after = text.replace("        model_ema = ModelEma(model, decay=0.999, device='')\n        model.to(device)\n",
                         "        model.to(device)\n        model_ema = ModelEma(model, decay=0.999, device='')\n")
    assert "ema-before-to-device" not in ids(("train.py", after))
    assert "ema-before-to-device" not in ids(("train.py", text.replace("device=''", "device='cuda'")))


def test_deepspeed_initialize_given_a_plateau_scheduler_or_an_iterable_dataset():
    text = """
    import deepspeed
    import webdataset as wds
    from torch.optim.lr_scheduler import ReduceLROnPlateau
    scheduler = ReduceLROnPlateau(opt, mode="min")
    raw = wds.WebDataset(urls)
    ds = raw.shuffle(1000).batched(8)
    engine, opt, dl, sched = deepspeed.initialize(model=model, optimizer=opt, lr_scheduler=scheduler,
                                                   training_data=ds)
    """
    got = ids(("train.py", text))
    assert "ds-plateau-scheduler" in got and "ds-iterable-training-data" in got
    fixed = text.replace("lr_scheduler=scheduler", "lr_scheduler=None").replace("training_data=ds", "training_data=None")
    got = ids(("train.py", fixed))
    assert "ds-plateau-scheduler" not in got and "ds-iterable-training-data" not in got
    mapped = text.replace("raw = wds.WebDataset(urls)", "raw = ImageFolder(root)")
    assert "ds-iterable-training-data" not in ids(("train.py", mapped))


def test_a_barrier_with_no_group_in_the_one_process_run():
    text = """
    import torch
    import torch.multiprocessing as mp
    from icefall.dist import setup_dist
    def train_one_epoch(model):
        save(model)
        torch.distributed.barrier()
    def run(rank, world_size):
        if world_size > 1:
            setup_dist(rank, world_size)
        train_one_epoch(model)
    def main():
        world_size = torch.cuda.device_count()
        if world_size > 1:
            mp.spawn(run, args=(world_size,), nprocs=world_size)
        else:
            run(rank=0, world_size=1)
    main()
    """
    assert "collective-before-init" in ids(("train.py", text))
    guarded = text.replace("        torch.distributed.barrier()", "        if world_size > 1:\n            torch.distributed.barrier()")
    assert "collective-before-init" not in ids(("train.py", guarded.replace("def train_one_epoch(model)", "def train_one_epoch(model, world_size=1)")))
    caller_guarded = text.replace("        train_one_epoch(model)", "        if world_size > 1:\n            train_one_epoch(model)")
    assert "collective-before-init" not in ids(("train.py", caller_guarded))
    once = text.replace("        if world_size > 1:\n            setup_dist(rank, world_size)",
                        "        if not torch.distributed.is_initialized():\n            setup_dist(rank, world_size)")
    assert "collective-before-init" not in ids(("train.py", once))


def test_a_sampler_bound_only_when_distributed():
    text = """
    import torch.distributed as dist
    from torch.utils.data import DataLoader, DistributedSampler
    def main():
        if dist.is_initialized() and dist.get_world_size() > 1:
            sampler = DistributedSampler(ds)
        loader = DataLoader(ds, sampler=sampler, shuffle=sampler is None)
    """
    assert "unbound-after-ddp-branch" in ids(("train.py", text))
    bound = text.replace("    def main():\n", "    def main():\n        sampler = None\n")
    assert "unbound-after-ddp-branch" not in ids(("train.py", bound))
    looped = """
    import torch.distributed as dist
    def reduce(log_vars):
        for name, value in log_vars.items():
            if dist.is_initialized():
                value = value.clone()
            log_vars[name] = value.item()
    """
    assert "unbound-after-ddp-branch" not in ids(("train.py", looped))


def test_steps_counted_on_the_unprepared_loader():
    text = """
    class Trainer:
        def prepare_learning(self):
            train_dataloader = self.store.create_loader(8)
            self.model, self.train_dataloader = self.accelerator.prepare(self.model, train_dataloader)
            self.total_steps = self.epochs * len(train_dataloader)
    """
    assert "lr-steps-from-dataset-length" in ids(("trainer.py", text))
    assert "lr-steps-from-dataset-length" not in ids(("trainer.py", text.replace("len(train_dataloader)",
                                                                                 "len(self.train_dataloader)")))
    rebound = text.replace("self.model, self.train_dataloader = self.accelerator.prepare(self.model, train_dataloader)",
                           "self.model, train_dataloader = self.accelerator.prepare(self.model, train_dataloader)")
    assert "lr-steps-from-dataset-length" not in ids(("trainer.py", rebound))


def test_a_positional_argument_the_parser_does_not_define():
    script = """
    import argparse
    parser = argparse.ArgumentParser()
    parser.add_argument('--prompt_path', type=str, default=None)
    parser.add_argument('--use_lora', action='store_true')
    args = parser.parse_args()
    """
    bad = "torchrun --standalone --nproc_per_node=2 train.py prompts.csv --use_lora\n"
    assert "script-arg-unknown" in ids(("train.py", script), ("run.sh", bad))
    for ok in ("torchrun --standalone --nproc_per_node=2 train.py --prompt_path prompts.csv --use_lora\n",
               "torchrun --standalone --nproc_per_node=2 train.py --use_lora 2>&1 | tee log.txt\n"):
        assert "script-arg-unknown" not in ids(("train.py", script), ("run.sh", ok)), ok
    positional = script.replace("'--prompt_path', type=str, default=None", "'prompt_path'")
    assert "script-arg-unknown" not in ids(("train.py", positional), ("run.sh", bad))


def test_colossalai_launched_twice_and_a_save_callback_on_every_rank():
    twice = """
    import colossalai
    def main(args):
        if args.seed is None:
            colossalai.launch_from_torch(config={})
        else:
            colossalai.launch_from_torch(config={}, seed=args.seed)
        colossalai.launch_from_torch(config={})
    """
    assert "init-twice" in ids(("train.py", twice))
    assert "init-twice" not in ids(("train.py", twice.replace("        colossalai.launch_from_torch(config={})\n    ", "    ")))
    callback = """
    import os
    from accelerate import Accelerator
    accelerator = Accelerator()
    def train(args):
        if accelerator.is_main_process:
            accelerator.init_trackers("run")
        for epoch in range(3):
            def save_func():
                ckpt_file = os.path.join(args.output_dir, f"e{epoch}.safetensors")
                accelerator.unwrap_model(network).save_weights(ckpt_file, dtype, None)
            train_util.save_on_epoch_end(args, save_func, epoch)
    """
    assert "write-on-every-rank" in ids(("train.py", callback))
    gated = callback.replace("            train_util.save_on_epoch_end(args, save_func, epoch)",
                             "            if accelerator.is_main_process:\n"
                             "                train_util.save_on_epoch_end(args, save_func, epoch)")
    assert "write-on-every-rank" not in ids(("train.py", gated))


def test_zero3_config_and_an_unwrapped_save_pretrained():
    script = """
    from accelerate import Accelerator
    accelerator = Accelerator()
    model = accelerator.prepare(model)
    accelerator.unwrap_model(model).save_pretrained("out")
    """
    zero3 = ("zero3.yaml", "compute_environment: LOCAL_MACHINE\ndistributed_type: DEEPSPEED\ndeepspeed_config:\n"
                           "  zero_stage: 3\n  zero3_save_16bit_model: true\nnum_processes: 8\n")
    assert "ds-zero3-save-without-gather" in ids(("train.py", script), zero3)
    gathered = script.replace('save_pretrained("out")',
                              'save_pretrained("out", state_dict=accelerator.get_state_dict(model))')
    assert "ds-zero3-save-without-gather" not in ids(("train.py", gathered), zero3)
    assert "ds-zero3-save-without-gather" not in ids(("train.py", script),
                                                     ("zero2.yaml", zero3[1].replace("zero_stage: 3", "zero_stage: 2")))


def test_argparse_before_an_hf_argument_parser_is_read():
    script = """
    import argparse
    from transformers import HfArgumentParser, TrainingArguments
    def setup():
        parser = argparse.ArgumentParser()
        parser.add_argument("--train_args_file", type=str)
        args = parser.parse_args()
        parser = HfArgumentParser((TrainingArguments,))
        return parser.parse_json_file(json_file=args.train_args_file)
    """
    launch = ("run.sh", "deepspeed --num_gpus=2 train.py --train_args_file sft.json\n")
    assert "local-rank-arg-under-launcher" in ids(("train.py", script), launch)
    hf_cli = script.replace("return parser.parse_json_file(json_file=args.train_args_file)",
                            "return parser.parse_args_into_dataclasses()")
    assert "local-rank-arg-under-launcher" not in ids(("train.py", hf_cli), launch)


def test_rank0_write_and_an_every_rank_read_of_another_file():
    text = """
    import torch, torch.distributed as dist
    def main_worker(gpu, args):
        dist.init_process_group("nccl", init_method=args.dist_url, world_size=args.world_size, rank=args.rank)
        if args.rank == 0:
            stats_file = open(args.checkpoint_dir / 'stats.txt', 'a', buffering=1)
        if (args.checkpoint_dir / 'checkpoint.pth').is_file():
            ckpt = torch.load(args.checkpoint_dir / 'checkpoint.pth', map_location='cpu')
    """
    assert "rank-gated-object-used" not in ids(("main.py", text))
    same = text.replace("'checkpoint.pth'", "'stats.txt'")
    assert "rank-gated-object-used" in ids(("main.py", same))
