#!/bin/bash
# source: https://github.com/huggingface/pytorch-image-models/blob/aa4b5850c1543fa488abf260f18390eda46cf85d/distributed_train.sh
NUM_PROC=$1
shift
torchrun --nproc_per_node=$NUM_PROC train.py "$@"

