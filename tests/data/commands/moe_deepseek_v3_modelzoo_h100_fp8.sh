#!/bin/bash
# Source: yanring/Megatron-MoE-ModelZoo (commit e8650517d60d71ab73fc6b3b0388cac4ba435181,
# 2026-05-16): best_practice/deepseek-v3/run_deepseek_v3_h100.sh's first run (A2A_OVERLAP=1 PP=8
# VPP=4 TP=2 EP=64 NNODES=128 GBS=8192 PR=fp8 and its flags), with model_configs/benchmarking/
# DeepSeek-V3.yaml's MODEL_ARGS and the flags sbatch_benchmarking.sh adds for them (the default
# DeepEP dispatcher, PR=fp8, A2A_OVERLAP=1). Trimmed to the flags that describe the run (data,
# logging and checkpoint flags left out) and laid out here. A test input of advisor estimate
# --from-command (tests/test_from_command.py).
PARALLEL=(--tensor-model-parallel-size 2 --pipeline-model-parallel-size 8 --expert-model-parallel-size 64
    --context-parallel-size 1 --expert-tensor-parallel-size 1 --pipeline-model-parallel-layout 'Et|(tt|)*30mL'
    --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --sequence-parallel
    --micro-batch-size 1 --global-batch-size 8192)
MODEL=(--use-mcore-models --transformer-impl transformer_engine --use-flash-attn --disable-bias-linear
    --seq-length 4096 --max-position-embeddings 4096 --num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432
    --num-attention-heads 128 --kv-channels 128 --position-embedding-type rope --rotary-base 10000
    --make-vocab-size-divisible-by 3232 --normalization RMSNorm --norm-epsilon 1e-6 --swiglu
    --untie-embeddings-and-output-weights --attention-dropout 0.0 --hidden-dropout 0.0 --qk-layernorm
    --multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128 --qk-pos-emb-head-dim 64
    --v-head-dim 128 --rotary-scaling-factor 40 --mscale 1.0 --mscale-all-dim 1.0
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model unsloth/DeepSeek-V3 --no-create-attention-mask-in-dataloader)
MOE=(--num-experts 256 --moe-layer-freq '([0]*3+[1]*58)' --moe-ffn-hidden-size 2048
    --moe-shared-expert-intermediate-size 2048 --moe-router-load-balancing-type seq_aux_loss --moe-router-topk 8
    --moe-grouped-gemm --moe-aux-loss-coeff 1e-4 --moe-router-group-topk 4 --moe-router-num-groups 8
    --moe-router-topk-scaling-factor 2.5 --moe-router-score-function sigmoid --moe-router-enable-expert-bias
    --moe-router-bias-update-rate 1e-3 --moe-router-dtype fp32 --moe-permute-fusion --moe-router-fusion
    --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend deepep
    --mtp-num-layers 1 --mtp-loss-scaling-factor 0.1)
TRAINING=(--bf16 --cross-entropy-loss-fusion --cross-entropy-fusion-impl native --manual-gc --manual-gc-interval 10
    --no-check-for-nan-in-loss-and-grad --enable-experimental --clip-grad 1.0 --weight-decay 0.1
    --recompute-granularity selective --recompute-modules mla_up_proj mlp
    --fp8-recipe blockwise --fp8-format e4m3 --fp8-param-gather --use-precision-aware-optimizer
    --main-grads-dtype fp32 --main-params-dtype fp32 --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16
    --moe-router-padding-for-fp8 --delay-wgrad-compute --overlap-moe-expert-parallel-comm)
torchrun --nproc_per_node 8 --nnodes 128 pretrain_gpt.py ${PARALLEL[@]} ${MODEL[@]} ${MOE[@]} ${TRAINING[@]}
