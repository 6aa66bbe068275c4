#!/bin/bash
# Source: NVIDIA/Megatron-LM, examples/megatron_fsdp/sbatch_mfsdp_deepseek_v3.sh (snapshot commit
# d98e8a64ddf34856e74b24714e3bedb2f5a39553, 2026-08-22; the file as of adfe9e11d9). Its
# PRETRAIN_ARGS with the script's defaults (TP 1, EP 8, MBS 4, GBS 2048), trimmed to the flags
# and laid out here, the paths placeholders; the `if` blocks (Megatron-FSDP, profiling, wandb)
# and the sbatch wrapper are left out, so this is the script with USE_MEGATRON_FSDP=0, and the
# FSDP branch's flags are the last array, added by the test that prices the default. A test
# input of advisor estimate --from-command (tests/test_from_command.py).
PRETRAIN_ARGS=(
    --distributed-timeout-minutes 60 --tensor-model-parallel-size 1 --expert-model-parallel-size 8
    --expert-tensor-parallel-size 1 --context-parallel-size 1 --use-distributed-optimizer --overlap-grad-reduce
    --overlap-param-gather --use-mcore-models --sequence-parallel --use-flash-attn --disable-bias-linear
    --micro-batch-size 4 --global-batch-size 2048 --train-samples 585937500 --exit-duration-in-mins 220
    --no-check-for-nan-in-loss-and-grad --manual-gc --manual-gc-interval 10
    --recompute-granularity selective --recompute-modules mlp moe mla_up_proj layernorm
    --transformer-impl transformer_engine --seq-length 4096 --data-cache-path /out/cache
    --tokenizer-type HuggingFaceTokenizer --tokenizer-model deepseek-ai/DeepSeek-V3 --data-path /data/text
    --split 99,1,0 --no-mmap-bin-files --no-create-attention-mask-in-dataloader --num-workers 6
    --num-layers 61 --hidden-size 7168 --ffn-hidden-size 18432 --num-attention-heads 128 --kv-channels 128
    --max-position-embeddings 4096 --position-embedding-type rope --rotary-base 10000
    --make-vocab-size-divisible-by 3232 --normalization RMSNorm --norm-epsilon 1e-6 --swiglu
    --untie-embeddings-and-output-weights --multi-latent-attention --attention-dropout 0.0 --hidden-dropout 0.0
    --clip-grad 1.0 --weight-decay 0.1 --qk-layernorm --lr-decay-samples 584765624 --lr-warmup-samples 1536000
    --lr-warmup-init 3.9e-7 --lr 3.9e-6 --min-lr 3.9e-7 --lr-decay-style cosine --adam-beta1 0.9 --adam-beta2 0.95
    --num-experts 256 --moe-layer-freq [0]*3+[1]*58 --moe-ffn-hidden-size 2048
    --moe-shared-expert-intermediate-size 2048 --moe-router-load-balancing-type seq_aux_loss --moe-router-topk 8
    --moe-token-dispatcher-type flex --moe-flex-dispatcher-backend hybridep --moe-router-pre-softmax
    --moe-grouped-gemm --moe-aux-loss-coeff 1e-4 --moe-router-group-topk 4 --moe-router-num-groups 8
    --moe-router-topk-scaling-factor 2.5 --moe-router-score-function sigmoid --moe-router-enable-expert-bias
    --moe-router-bias-update-rate 1e-3 --moe-router-dtype fp32 --moe-permute-fusion
    --moe-router-force-load-balancing --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128
    --qk-pos-emb-head-dim 64 --v-head-dim 128 --rotary-scaling-factor 40 --mscale 1.0 --mscale-all-dim 1.0
    --mtp-num-layers 1 --mtp-loss-scaling-factor 0.1 --eval-iters 32 --eval-interval 100
    --auto-detect-ckpt-format --load /out/checkpoints --save /out/checkpoints --save-interval 100
    --dist-ckpt-strictness log_all --init-method-std 0.02 --log-timers-to-tensorboard --log-memory-to-tensorboard
    --log-num-zeros-in-grad --log-params-norm --log-validation-ppl-to-tensorboard --log-throughput --log-interval 1
    --logging-level 40 --tensorboard-dir /out/tensorboard --bf16 --enable-experimental
)
python pretrain_gpt.py ${PRETRAIN_ARGS[@]}
