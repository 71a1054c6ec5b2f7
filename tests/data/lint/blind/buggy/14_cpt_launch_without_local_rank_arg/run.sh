# command as posted by the reporter ("I have single machine with two GPUs")
python -m torch.distributed.launch --nproc_per_node=4 train_adgen.py
