#!/bin/bash

BEAKER_IMAGE="${1:-${BEAKER_USER}/open-instruct-integration-test}"

echo "Using Beaker image: $BEAKER_IMAGE"

uv run python mason.py \
    --cluster ai2/jupiter \
    --workspace ai2/open-instruct-dev \
    --priority urgent \
    --image "$BEAKER_IMAGE" \
    --description "Two-node OLMo-core SFT test." \
    --pure_docker_mode \
    --preemptible \
    --num_nodes 2 \
    --gpus 8 \
    --non_resumable \
    --no_auto_dataset_cache \
    --env OLMO_SHARED_FS=1 \
    -- torchrun \
    --nnodes=2 \
    --node_rank=\$BEAKER_REPLICA_RANK \
    --master_addr=\$BEAKER_LEADER_REPLICA_HOSTNAME \
    --master_port=29400 \
    --nproc_per_node=8 \
    open_instruct/olmo_core_finetune.py \
    --model_name_or_path Qwen/Qwen3-0.6B \
    --max_seq_length 4096 \
    --per_device_train_batch_size 1 \
    --gradient_accumulation_steps 4 \
    --learning_rate 8e-5 \
    --warmup_ratio 0.03 \
    --num_epochs 2 \
    --ephemeral_save_interval 100 \
    --logging_steps 1 \
    --mixer_list allenai/tulu-3-sft-personas-algebra 100 \
    --seed 123 \
    --compile_model true \
    --with_tracking \
    --output_dir \$CHECKPOINT_OUTPUT_DIR
