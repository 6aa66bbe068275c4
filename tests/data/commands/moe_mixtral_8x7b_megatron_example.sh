#!/bin/bash
# Source: NVIDIA/Megatron-LM, examples/mixtral/train_mixtral_8x7b_distributed.sh (snapshot commit
# d98e8a64ddf34856e74b24714e3bedb2f5a39553, 2026-08-22; the file as of 779c5b748d). Its argument
# list, trimmed to the flags and laid out here; the paths are placeholders, NNODES (the script's
# $SLURM_NNODES, default 1) is 8, and the optional wandb `if` block is left out. A test input of
# advisor estimate --from-command (tests/test_from_command.py).
DISTRIBUTED_ARGS=(--nproc_per_node 8 --nnodes 8 --node_rank 0 --master_addr localhost --master_port 29500)
MODEL_ARGS=(--use-mcore-models --disable-bias-linear --seq-length 4096 --max-position-embeddings 32768
    --num-layers 32 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --init-method-std 0.01
    --attention-dropout 0.0 --hidden-dropout 0.0 --normalization RMSNorm --position-embedding-type rope --swiglu
    --untie-embeddings-and-output-weights --group-query-attention --num-query-groups 8
    --no-masked-softmax-fusion --no-position-embedding --rotary-base 1000000)
MOE_ARGS=(--num-experts 8 --moe-router-topk 2 --moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-2
    --moe-grouped-gemm --moe-token-dispatcher-type alltoall --overlap-param-gather --overlap-grad-reduce)
DATA_ARGS=(--tokenizer-type Llama2Tokenizer --tokenizer-model /data/tokenizer.model --data-path /data/text_document
    --split 99990,8,2)
TRAINING_ARGS=(--micro-batch-size 1 --global-batch-size 256 --lr 1e-4 --train-iters 500000 --lr-decay-iters 320000
    --lr-decay-style cosine --min-lr 1.0e-5 --weight-decay 0.1 --lr-warmup-iters 500 --clip-grad 1.0 --bf16)
MODEL_PARALLEL_ARGS=(--tensor-model-parallel-size 1 --pipeline-model-parallel-size 4 --expert-model-parallel-size 8
    --use-distributed-optimizer --sequence-parallel)
LOGGING_ARGS=(--log-interval 1 --save-interval 10000 --eval-interval 1000 --eval-iters 10 --save /ckpt --load /ckpt
    --tensorboard-dir /ckpt/tensorboard --no-load-optim --no-load-rng)
torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py ${MODEL_ARGS[@]} ${MOE_ARGS[@]} ${DATA_ARGS[@]} \
    ${TRAINING_ARGS[@]} ${MODEL_PARALLEL_ARGS[@]} ${LOGGING_ARGS[@]}
