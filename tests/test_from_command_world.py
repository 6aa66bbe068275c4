"""``--from-command``: where a launch script's world size came from, told where it does not fit.

Megatron-LM's MoE README (core_v0.15.2 megatron/core/transformer/moe/README.md, 'MoE training
example', the Mixtral 8x7B script) counts its nodes with ``NNODES=${NNODES:-"1"}``: the advisor does
not read the caller's environment, so it reads 8 GPUs, which cannot hold EP 8 over PP 4. The
refusal names the variable and its default, and --gpus as the way out."""

from __future__ import annotations

import json

from click.testing import CliRunner

from advisor.cli import cli
from advisor.shell_command import world_defaults

# The README script's launch part as written (its model, MoE and parallel flags kept; its data,
# logging and optional wandb 'if' block left out).
README_HEAD = '''#!/bin/bash
export CUDA_DEVICE_MAX_CONNECTIONS=1

GPUS_PER_NODE=8
# Change for multinode config
MASTER_ADDR=${MASTER_ADDR:-"localhost"}
MASTER_PORT=${MASTER_PORT:-"6000"}
NNODES=${NNODES:-"1"}
NODE_RANK=${RANK:-"0"}
WORLD_SIZE=$(($GPUS_PER_NODE*$NNODES))

DISTRIBUTED_ARGS=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NNODES
    --node_rank $NODE_RANK
    --master_addr $MASTER_ADDR
    --master_port $MASTER_PORT
)
'''
MIXTRAL = README_HEAD + '''
MODEL_ARGS=(
    --disable-bias-linear --seq-length 4096 --max-position-embeddings 32768 --num-layers 32
    --hidden-size 4096 --ffn-hidden-size 14336 --num-attention-heads 32 --init-method-std 0.01
    --attention-dropout 0.0 --hidden-dropout 0.0 --normalization RMSNorm --position-embedding-type rope
    --swiglu --untie-embeddings-and-output-weights --group-query-attention --num-query-groups 8
    --no-masked-softmax-fusion --no-position-embedding
)
MOE_ARGS=(
    --num-experts 8
    --expert-model-parallel-size 8
    --moe-router-load-balancing-type aux_loss # options: aux_loss, sinkhorn, None. Default is aux_loss.
    --moe-router-topk 2
    --moe-aux-loss-coeff 1e-2
    --moe-grouped-gemm
    --moe-permute-fusion
)
TRAINING_ARGS=(--micro-batch-size 1 --global-batch-size 128 --bf16)
MODEL_PARALLEL_ARGS=(
    --tensor-model-parallel-size 1
    --pipeline-model-parallel-size 4
    --num-layers-per-virtual-pipeline-stage 8
    --sequence-parallel
    --use-distributed-optimizer
)
torchrun ${DISTRIBUTED_ARGS[@]} pretrain_gpt.py \\
    ${MODEL_ARGS[@]} \\
    ${MOE_ARGS[@]} \\
    ${TRAINING_ARGS[@]} \\
    ${MODEL_PARALLEL_ARGS[@]}
'''
DEFAULTED = ("the world size 8 (torchrun --nproc-per-node 8 x --nnodes 1; $NNODES from the script's default "
             "${NNODES:-\"1\"}: the caller's environment is not read)")


def estimate(script: str, *argv: str):
    return CliRunner().invoke(cli, ["estimate", "--from-command", "-", "--vocab-size", "32000", *argv], input=script)


def refused(result) -> str:
    """The one line refusing the command read from stdin, after its prefix (checked whole)."""
    assert result.exit_code == 2 and result.stderr.count("\n") == 1 and "Traceback" not in result.output, result.output
    prefix = "Error: --from-command stdin: "
    assert result.stderr.startswith(prefix), result.stderr
    return result.stderr.removeprefix(prefix).rstrip("\n")


def test_the_readme_mixtral_script_names_the_default_its_world_size_came_from():
    # 8 GPUs per node x NNODES 1 = 8; over PP 4, TP x CP x DP = 2; EP 8 x ETP 1 (the TP) = 8
    assert refused(estimate(MIXTRAL)) == (
        "EP x ETP = 8 must divide TP x CP x DP = 2 (megatron-core's expert groups), from " + DEFAULTED
        + " over PP 4: give --gpus N for the run you mean")


def test_gpus_overrides_the_scripts_default_world_size():
    result = estimate(MIXTRAL, "--gpus", "64", "--format", "json")
    assert result.exit_code == 0, result.output
    row = json.loads(result.stdout)
    assert (row["gpus"], row["pp"], row["ep"], row["dp"]) == (64, 4, 8, 16)  # 64 / (TP 1 x CP 1 x PP 4)


def test_gpus_too_few_for_the_expert_groups_is_said_as_given():
    assert refused(estimate(MIXTRAL, "--gpus", "16")) == (
        "EP x ETP = 8 must divide TP x CP x DP = 4 (megatron-core's expert groups), from --gpus 16 over PP 4: "
        "give --gpus N for the run you mean")


def test_a_dense_layout_too_large_for_the_default_world_names_it_too():
    dense = MIXTRAL.replace("${MOE_ARGS[@]}", "").replace("--tensor-model-parallel-size 1",
                                                            "--tensor-model-parallel-size 4")
    assert refused(estimate(dense)) == (
        DEFAULTED + " is not divisible by TP x CP x PP = 4 x 1 x 4 = 16: give --gpus N for the run you mean")


def test_only_the_defaults_the_world_size_comes_from_are_named():
    # NODE_RANK (from $RANK), MASTER_ADDR and MASTER_PORT default too, but change no count
    assert world_defaults(MIXTRAL) == (("NNODES", '"1"'),)
    both = "N=${N:-2}\nP=${GPUS:-4}\nX=${X:-1}\ntorchrun --nproc-per-node $P --nnodes $N pretrain_gpt.py --num-layers 2\n"
    assert world_defaults(both) == (("N", "2"), ("GPUS", "4"))
    assert world_defaults("NNODES=2\ntorchrun --nproc-per-node 8 --nnodes $NNODES pretrain_gpt.py\n") == ()
