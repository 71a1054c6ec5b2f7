# Source: https://github.com/huggingface/transformers/blob/v2.11.0/examples/text-classification/run_glue.py
# Confirmed cause: clean; look-alikes: the first-process-downloads pair of barriers (balanced), local_rank compared with -1, save under local_rank in [-1, 0]; find_unused_parameters=True is info only
# Expected rule(s): none (clean)
import torch
from torch.utils.data import DataLoader, RandomSampler
from torch.utils.data.distributed import DistributedSampler

def train(args, train_dataset, model, tokenizer):
    train_sampler = RandomSampler(train_dataset) if args.local_rank == -1 else DistributedSampler(train_dataset)
    train_dataloader = DataLoader(train_dataset, sampler=train_sampler, batch_size=args.train_batch_size)
    if args.local_rank != -1:
        model = torch.nn.parallel.DistributedDataParallel(model, device_ids=[args.local_rank], output_device=args.local_rank,
                                                          find_unused_parameters=True)
    for epoch in range(int(args.num_train_epochs)):
        if args.local_rank != -1:
            train_sampler.set_epoch(epoch)
        for step, batch in enumerate(train_dataloader):
            loss = model(**batch)[0]
            loss.backward()
            optimizer.step()
        if args.local_rank in [-1, 0] and args.save_steps > 0:
            model_to_save = model.module if hasattr(model, "module") else model
            model_to_save.save_pretrained(args.output_dir)

def main():
    if args.local_rank == -1 or args.no_cuda:
        device = torch.device("cuda" if torch.cuda.is_available() and not args.no_cuda else "cpu")
    else:
        torch.cuda.set_device(args.local_rank)
        device = torch.device("cuda", args.local_rank)
        torch.distributed.init_process_group(backend="nccl", timeout=timeout)
    if args.local_rank not in [-1, 0]:
        torch.distributed.barrier()  # Make sure only the first process in distributed training will download model & vocab
    model = AutoModelForSequenceClassification.from_pretrained(args.model_name_or_path, config=config)
    if args.local_rank == 0:
        torch.distributed.barrier()  # Make sure only the first process in distributed training will download model & vocab
    model.to(args.device)
    train(args, train_dataset, model, tokenizer)
