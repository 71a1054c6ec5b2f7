# Source: https://github.com/yangkky/distributed_tutorial/issues/13
# Confirmed cause: 'Address already in use while running second time': the tutorial fixes MASTER_PORT=8888; answer: use a different port
# Expected rule(s): hardcoded-master-port
import os
import torch.multiprocessing as mp

def main():
    args = parser.parse_args()
    args.world_size = args.gpus * args.nodes
    os.environ['MASTER_ADDR'] = '10.57.23.164'
    os.environ['MASTER_PORT'] = '8888'
    mp.spawn(train, nprocs=args.gpus, args=(args,))
