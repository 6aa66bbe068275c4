"""``python -m tables.published``: the advisor against published runs it was not fitted on.

    runs.py        dense_runs.csv (Megatron-core / NeMo runs on H100, BF16 and FP8, each with its
                   layout, options and source; all marked test) priced through --from-command's path
    meta405b.py    Llama 3 405B's TFLOP/s as Meta reports them (Dubey et al. 2024, Table 4)
    short_sequences.py  short_sequence_runs.csv: the per-microbatch overhead against published
                   runs at sequence 2048-4096, priced with and without it
    alltoall_rate.py  nccl_alltoall_p5.csv: NCCL's measured multi-node all-to-all rate, the EP
                   all-to-all's network term (advisor.moe.ep_time.A2A_NETWORK_FRACTION, A2A_PEER_S)
"""
