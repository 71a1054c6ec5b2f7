#!/usr/bin/env bash
# excerpt of train.sh (skycrapers/TecoGAN-PyTorch @ 15d87000)
root_dir=.
gpu_ids=0,1  # set to -1 to use cpu
master_port=4321

# run
num_gpus=`echo ${gpu_ids} | awk -F\, '{print NF}'`
if [[ ${num_gpus} > 1 ]]; then
    dist_args="-m torch.distributed.launch --nproc_per_node ${num_gpus} --master_port ${master_port}"
fi

CUDA_VISIBLE_DEVICES=${gpu_ids} \
  python ${dist_args} ${root_dir}/codes/main.py \
  --exp_dir ${exp_dir} \
  --mode train \
 --opt train${suffix}.yml \
 --gpu_ids ${gpu_ids} \
 > ${exp_dir}/train/train${suffix}.log  2>&1 &
