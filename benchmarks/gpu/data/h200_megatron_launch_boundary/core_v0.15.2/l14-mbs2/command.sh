# the command advisor-launch ran (its '+ ' line in launch.log)
torchrun --nproc-per-node 1 --standalone \
    -m launch.entry --megatron-lm /tmp/tmp.b9VUUAeGLS/core_v0.15.2 \
    --profile-dir /tmp/b/core_v0.15.2/l14-mbs2/profile -- \
    --num-layers 14 --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 \
    --group-query-attention --num-query-groups 8 --seq-length 4096 --max-position-embeddings 4096 \
    --normalization RMSNorm --norm-epsilon 1e-05 --swiglu --position-embedding-type rope \
    --rotary-base 500000 --use-rope-scaling --rope-scaling-factor 8 --attention-dropout 0 \
    --hidden-dropout 0 --disable-bias-linear --untie-embeddings-and-output-weights \
    --tensor-model-parallel-size 1 --context-parallel-size 1 --pipeline-model-parallel-size 1 \
    --micro-batch-size 2 --global-batch-size 8 --bf16 --accumulate-allreduce-grads-in-fp32 \
    --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather \
    --attention-backend unfused --make-vocab-size-divisible-by 1 --mock-data \
    --tokenizer-type NullTokenizer --vocab-size 128255 --transformer-impl local --no-rope-fusion \
    --no-persist-layer-norm --no-gradient-accumulation-fusion --no-masked-softmax-fusion \
    --no-bias-swiglu-fusion --train-iters 4 --lr 1e-4 --log-interval 1 --eval-iters 0 \
    --eval-interval 1000
