#!/bin/bash
# Source: NVIDIA/Megatron-LM core_v0.19.0 (commit 5be9626709af2722333bf54797c954c09edeada3),
# examples/gptoss/02_train.sh (Apache-2.0): the command it runs with its defaults (mock data,
# --checkpoint-path ckpt) and a --distributed-config-file setting GPUS_PER_NODE=4, its own way to
# size the launch (PP = the world size: at its default 8 GPUs, PP 8 does not divide its 12 layers),
# as bash expands it (printf %q of the arguments); a test input of advisor estimate --from-command.

python -m torch.distributed.run --nproc_per_node 4 --nnodes 1 --master_addr localhost \
--master_port 29500 --node_rank 0 pretrain_gpt.py --no-masked-softmax-fusion --transformer-impl \
transformer_engine --disable-bias-linear --untie-embeddings-and-output-weights --no-rope-fusion \
--normalization RMSNorm --num-layers 12 --hidden-size 512 --ffn-hidden-size 2048 \
--num-attention-heads 64 --group-query-attention --num-query-groups 8 --seq-length 8192 \
--max-position-embeddings 8192 --use-mcore-models --rotary-percent 1.0 --rope-type rope \
--position-embedding-type rope --rotary-base 10000 --no-bias-gelu-fusion \
--export-force-local-attention --no-bias-dropout-fusion --quick-geglu --glu-linear-offset 1.0 \
--softmax-type learnable --window-attn-skip-freq 2 --activation-func-clamp-value 7.0 \
--window-size 127\,0 --enable-gpt-oss --num-experts 4 --moe-router-topk 2 \
--moe-router-load-balancing-type aux_loss --moe-aux-loss-coeff 1e-3 --moe-grouped-gemm \
--moe-token-dispatcher-type alltoall --overlap-param-gather --overlap-grad-reduce \
--moe-ffn-hidden-size 2048 --moe-router-dtype fp32 --moe-z-loss-coeff 1e-3 --moe-permute-fusion \
--mock-data --tokenizer-type NullTokenizer --vocab-size 128256 --data-cache-path \
/workspace/megatron-lm/benchmark_cache_gpt_oss_20b --tiktoken-pattern v2 --split \'99\,1\,0\' \
--no-create-attention-mask-in-dataloader --no-mmap-bin-files --num-workers 1 --micro-batch-size 1 \
--global-batch-size 128 --lr 1.0e-5 --train-samples 1953125000 --lr-decay-samples 1949218748 \
--lr-decay-style cosine --min-lr 1.0e-6 --weight-decay 0.1 --lr-warmup-fraction 0.05 --clip-grad \
1.0 --bf16 --use-flash-attn --attention-softmax-in-fp32 --accumulate-allreduce-grads-in-fp32 \
--disable-bf16-reduced-precision-matmul --recompute-activations --tensor-model-parallel-size 1 \
--pipeline-model-parallel-size 4 --expert-model-parallel-size 1 --sequence-parallel \
--context-parallel-size 1 --use-distributed-optimizer --fp8-format hybrid --fp8-param-gather \
--fp8-amax-compute-algo max --fp8-amax-history-len 1024 --log-interval 1 --save-interval 10000 \
--eval-interval 50000000 --eval-iters 0 --save ckpt --tensorboard-dir ckpt/tensorboard \
--moe-per-layer-logging --no-load-optim --no-load-rng --log-throughput
