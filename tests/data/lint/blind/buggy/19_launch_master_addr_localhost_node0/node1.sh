python -m torch.distributed.launch --nproc_per_node=1 --nnodes=2 --node_rank=0 --master_addr=localhost 
--master_port=2222  --use_env TRAINING_SCRIPT.py
