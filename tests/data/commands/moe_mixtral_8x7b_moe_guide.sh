#!/bin/bash
# Source: megatron-core's MoE guide, megatron/core/transformer/moe/README.md, "Examples" ("Runs
# Mixtral 8x7B model on 32 H100/A100 GPUs"), in NVIDIA/Megatron-LM core_v0.19.0 (commit
# 5be9626709af2722333bf54797c954c09edeada3; ../shared/megatron-lm/core_v0.19.0). Its argument
# list, trimmed to the flags and laid out here, the paths placeholders. A test input of
# advisor estimate --from-command (tests/test_from_command.py).
DISTRIBUTED_ARGS=(--nproc_per_node 8 --nnodes 4 --node_rank 0 --master_addr localhost --master_port 29500)
MODEL_ARGS=(--disable-bias-linear --seq-length 4096 --max-position-embeddings 32768 --num-layers 32
    --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --init-method-std 0.01
    --attention-dropout 0.0 --hidden-dropout 0.0 --normalization RMSNorm --position-embedding-type rope --swiglu
    --untie-embeddings-and-output-weights --group-query-attention --num-query-groups 8
    --no-masked-softmax-fusion --no-position-embedding)
MOE_ARGS=(--num-experts 8 --expert-model-parallel-size 8 --moe-router-load-balancing-type aux_loss
    --moe-router-topk 2 --moe-aux-loss-coeff 1e-2 --moe-grouped-gemm --moe-permute-fusion
    --moe-token-dispatcher-type alltoall)
DATA_ARGS=(--tokenizer-type Llama2Tokenizer --tokenizer-model /data/tokenizer.model --data-path /data/text_document
    --split 99990,8,2)
TRAINING_ARGS=(--micro-batch-size 1 --global-batch-size 128 --lr 1e-4 --train-iters 500000 --lr-decay-iters 320000
    --lr-decay-style cosine --min-lr 1.0e-5 --weight-decay 0.1 --lr-warmup-iters 500 --clip-grad 1.0 --bf16
    --overlap-grad-reduce --overlap-param-gather)
MODEL_PARALLEL_ARGS=(--tensor-model-parallel-size 1 --pipeline-model-parallel-size 4
    --num-layers-per-virtual-pipeline-stage 8 --sequence-parallel --use-distributed-optimizer)
LOGGING_ARGS=(--log-interval 1 --save-interval 10000 --eval-interval 1000 --eval-iters 10 --save /ckpt --load /ckpt
    --tensorboard-dir /ckpt/tensorboard --ckpt-format torch_dist --auto-detect-ckpt-format)
torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py ${MODEL_ARGS[@]} ${MOE_ARGS[@]} ${DATA_ARGS[@]} \
    ${TRAINING_ARGS[@]} ${MODEL_PARALLEL_ARGS[@]} ${LOGGING_ARGS[@]}
