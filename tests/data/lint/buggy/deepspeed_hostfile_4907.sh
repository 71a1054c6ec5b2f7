#!/bin/bash
# Source: https://github.com/deepspeedai/DeepSpeed/issues/4907
# Confirmed cause: the multi-node deepspeed launcher checks passwordless ssh: "Command 'ssh -o PasswordAuthentication=no 192.168.3.100 hostname' returned non-zero exit status 255"
# Expected rule(s): deepspeed-ssh
deepspeed --num_gpus 2 --num_nodes 2 --master_addr 192.168.3.100 --hostfile hostfile cifar10_deepspeed.py --deepspeed_config ds_config.json
