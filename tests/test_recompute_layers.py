"""--recompute-num-layers N against the layout, one check (``Recomputation.chunk_problem``) for
``estimate``, ``sweep`` and ``recommend``: refused exactly where Megatron-LM fails, and the
harmless cases (N above a chunk's layers) accepted and priced alike by all three.

What Megatron does (read in both checkouts, and run below): core_v0.15.2's
``TransformerBlock._checkpointed_forward`` runs ``custom(layer_idx, layer_idx + N)`` for the
uniform method, whose loop takes ``self.layers[index]``: a model chunk whose layers N does not
divide fails with IndexError at its first training forward. core_v0.19.0's ``checkpointed_forward``
(megatron/core/recompute.py) ends each unit at ``min(layer_idx + N, layers)``. The block method
checkpoints ``layer_idx < N`` on both: above a chunk's layers, every layer."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from megatron_real import CUDA_ON_CPU, SHARED

from advisor.megatron_args import chunk_layers
from advisor.options import Recomputation

# (method, layers of the block, N): divides, does not, N above the layers, N equal to them
CASES = [("uniform", 4, 2), ("uniform", 3, 2), ("uniform", 6, 4), ("uniform", 3, 4), ("uniform", 3, 3),
         ("uniform", 5, 1), ("block", 3, 5), ("block", 3, 3), ("block", 4, 1)]

# One TransformerBlock of each case, trained one step on the CPU under the GPU test double, with
# Megatron's own recomputation loop. Its CheckpointFunction saves CUDA RNG states, which a CPU
# has not: the stand-in runs the same unit (custom(start, end)) without them.
PROBE = """
import importlib.util, json, os, sys
from unittest import mock
if importlib.util.find_spec("triton") is None:  # core_v0.19.0's MoE paged-stash kernels need it; a dense block, no
    sys.modules["megatron.core.transformer.moe.ops.paged_stash"] = mock.MagicMock()
import torch, torch.distributed as dist
os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", sys.argv[2]
dist.init_process_group("gloo", rank=0, world_size=1)
from megatron.core import parallel_state, tensor_parallel
tensor_parallel.checkpoint = lambda function, distribute_saved_activations, *args: function(*args)
parallel_state.initialize_model_parallel(1, 1)
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.transformer_block import TransformerBlock
failed = []
for method, layers, n in json.loads(sys.argv[1]):
    config = TransformerConfig(num_layers=layers, hidden_size=16, num_attention_heads=2, use_cpu_initialization=True,
                               recompute_granularity="full", recompute_method=method, recompute_num_layers=n,
                               hidden_dropout=0.0, attention_dropout=0.0, bias_dropout_fusion=False,
                               masked_softmax_fusion=False, persist_layer_norm=False,
                               gradient_accumulation_fusion=False)
    block = TransformerBlock(config, get_gpt_layer_local_spec()).train()
    hidden = torch.randn(4, 1, 16, requires_grad=True)
    try:
        block(hidden, torch.ones(1, 1, 4, 4, dtype=torch.bool).triu(1)).sum().backward()
        failed.append(None)
    except IndexError as error:
        failed.append(f"IndexError: {error}")
print(json.dumps(failed))
"""


def _megatron_fails(tag: str, tmp_path) -> list[str | None]:
    """Per case, Megatron's error (None where it trained). megatron.core alone imports on this
    Python for both releases (core_v0.19.0's Python 3.12 is its training package's); its
    ``$MEGATRON_LM_PYTHON312`` is used where set."""
    path = SHARED / tag
    if not (path / "megatron" / "core").is_dir():
        pytest.skip(f"no Megatron-LM checkout {tag} at {path}")
    python = os.environ.get("MEGATRON_LM_PYTHON312") if tag == "core_v0.19.0" else None
    script = tmp_path / "probe.py"
    script.write_text(PROBE)
    env = dict(os.environ, PYTHONPATH=f"{CUDA_ON_CPU}{os.pathsep}{path}", CUDA_ON_CPU="1")
    from megatron_hooks.stage_emulation import free_port

    result = subprocess.run([python or sys.executable, str(script), json.dumps(CASES), str(free_port())],
                            capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("tag", ["core_v0.15.2", "core_v0.19.0"])
def test_the_check_refuses_exactly_what_megatron_fails_on(tag, tmp_path):
    failed = _megatron_fails(tag, tmp_path)
    refused = [Recomputation(recompute="full", recompute_method=method, recompute_num_layers=n).chunk_problem(
        [layers], tag) for method, layers, n in CASES]
    assert [error is not None for error in failed] == [problem is not None for problem in refused], (failed, refused)
    assert all(error is None or error.startswith("IndexError") for error in failed)
    if tag == "core_v0.15.2":  # the releases differ, or the test would not tell them apart
        assert any(failed)


ESTIMATE = ["estimate", "--tp", 2, "--pp", 4, "--gpus", 32, "--gbs", 256, "--recompute", "full"]


@pytest.mark.parametrize("extra,chunks", [([], "8"), (["--vpp", 2, "--layers-per-stage", "12,8,6,6"], "3, 4, 6")])
def test_estimate_refuses_what_core_015_fails_on(advisor, extra, chunks):
    line = advisor.error(*ESTIMATE, "--mem", 80, "--recompute-method", "uniform", "--recompute-num-layers", 5,
                         "--megatron-version", "0.15", *extra)
    assert f"--recompute-num-layers 5 with model chunks of {chunks} layers" in line
    assert "IndexError" in line and "_checkpointed_forward" in line
    # the same layout on core 0.19, and an N that divides every chunk on 0.15, are estimated
    advisor.json(*ESTIMATE, "--mem", 80, "--recompute-method", "uniform", "--recompute-num-layers", 5, *extra)
    advisor.json(*ESTIMATE, "--mem", 80, "--recompute-method", "uniform", "--recompute-num-layers", 1,
                 "--megatron-version", "0.15", *extra)


@pytest.mark.parametrize("command", [ESTIMATE, ["recommend", "--model", "llama3.1-8b", "--gpus", 64, "--tp", 2,
                                                  "--pp", 4, "--recompute", "full"]])
@pytest.mark.parametrize("half,needs", [(["--recompute-num-layers", 27], "needs --recompute-method block or uniform"),
                                        (["--recompute-method", "block"], "needs --recompute-num-layers N")])
def test_half_a_full_recomputation_is_refused(advisor, command, half, needs):
    """Megatron-LM has no default method or N (TransformerConfig raises without either): a sweep
    row's "full block 27" copied as --recompute-num-layers 27 alone was priced as uniform 27."""
    assert needs in advisor.error(*command, *half)


def test_full_recomputation_alone_is_every_layer(advisor):
    """Neither given: uniform 1, every layer recomputed, as block with all of a stage's layers."""
    alone = advisor.json(*ESTIMATE, "--gpu", "h100-80gb")
    assert (alone["recompute_method"], alone["recompute_num_layers"]) == ("uniform", 1)
    assert alone["total_gib"] == _priced(advisor, "block", 8)[0]
    assert alone["total_gib"] == _priced(advisor, "uniform", 1)[0]


def _priced(advisor, method: str, n: int, *extra) -> tuple[float, float, float]:
    row = advisor.json(*ESTIMATE, "--gpu", "h100-80gb", "--recompute-method", method, "--recompute-num-layers", n,
                       *extra)
    assert row["recompute_num_layers"] == n  # the flag as given: what Megatron runs
    return row["total_gib"], row["activations_gib"], row["step_time_s"]


@pytest.mark.parametrize("extra,largest", [([], 8), (["--vpp", 2, "--layers-per-stage", "7,9,8,8"], 5)])
@pytest.mark.parametrize("method", ["block", "uniform"])
def test_n_above_a_chunk_is_priced_as_the_whole_chunk(advisor, method, extra, largest):
    """Block above a chunk's layers recomputes all of them, and (core 0.19) uniform runs them as
    one unit: priced as N = the largest chunk's layers, in memory and in time."""
    whole = _priced(advisor, method, largest, *extra)
    assert _priced(advisor, method, largest + 1, *extra) == whole
    assert _priced(advisor, method, 99, *extra) == whole
    assert _priced(advisor, method, 2, *extra) != whole  # N is priced at all


SWEEP = ["sweep", "--gpus", 32, "--mem", 40, "--gbs", 256, "--recompute", "full", "--all"]


def _layouts(rows: list[dict]) -> dict:
    return {(row["tp"], row["cp"], row["pp"], row["dp"], row["mbs"]): row for row in rows}


def test_sweep_takes_n_above_the_layers_as_every_layer(advisor):
    """It refused N above the model's layers, which Megatron runs (block: every layer)."""
    above = _layouts(advisor.json(*SWEEP, "--split", "even", "--recompute-num-layers", 99))
    whole = _layouts(advisor.json(*SWEEP, "--split", "even", "--recompute-num-layers", 32))
    assert above.keys() == whole.keys() and above
    assert all(above[key]["total_gib"] == whole[key]["total_gib"] for key in above)
    # the rows with recomputation state N as given (those pruned as unable to fit show the plain variant)
    assert {row["recompute_num_layers"] for row in above.values() if row["recompute"] == "full"} == {99}


def test_sweep_keeps_the_layouts_core_015_runs(advisor):
    """Uniform N = 4 on core 0.15 with the even split: the layouts whose chunks 4 divides, and
    only those (core 0.19 runs them all)."""
    uniform = [*SWEEP, "--split", "even", "--recompute-method", "uniform", "--recompute-num-layers", 4]
    old = advisor.json(*uniform, "--megatron-version", "0.15", "--gpu", "h100-80gb")
    new = advisor.json(*uniform, "--gpu", "h100-80gb")
    chunks = {tuple(chunk_layers(row["layers_per_stage"], row["vpp"])) for row in old}
    assert chunks and all(layers % 4 == 0 for each in chunks for layers in each)
    assert any(row["vpp"] > 1 for row in old)  # the interleaved chunks are checked too
    assert _layouts(old).keys() == {key for key, row in _layouts(new).items() if (32 // row["pp"]) % 4 == 0}
    assert len(_layouts(old)) < len(_layouts(new))


@pytest.mark.parametrize("extra,message", [
    (["--recompute-num-layers", 4], "advisor sweep needs --split even with --recompute-method uniform "
                                    "--recompute-num-layers 4 here"),
    ([], "advisor sweep needs --recompute-num-layers N with --recompute-method uniform here"),
    (["--recompute-num-layers", 3, "--split", "even"], "every model chunk's layers a multiple of it"),
])
def test_sweep_refuses_a_search_core_015_would_fail_on(advisor, extra, message):
    line = advisor.error(*SWEEP, "--recompute-method", "uniform", "--megatron-version", "0.15", *extra)
    assert message in line
    assert "IndexError" in line or "no valid (TP, CP, PP, MBS)" in line


def test_sweep_plans_any_split_where_n_divides_everything(advisor):
    rows = advisor.json(*SWEEP, "--recompute-method", "uniform", "--recompute-num-layers", 1,
                        "--megatron-version", "0.15")
    assert any(len(set(row["layers_per_stage"])) > 1 for row in rows)  # uneven splits, as with any release


RECOMMEND = ["recommend", "--model", "llama3.1-8b", "--gpus", 64, "--tp", 2, "--pp", 4, "--recompute", "full",
             "--recompute-method", "uniform"]


@pytest.mark.parametrize("objective", [["--objective", "memory"], ["--objective", "time", "--gpu", "h100-80gb"]])
def test_recommend_plans_only_stages_core_015_runs(advisor, objective):
    old = advisor.json(*RECOMMEND, "--recompute-num-layers", 4, "--megatron-version", "0.15", *objective)
    new = advisor.json(*RECOMMEND, "--recompute-num-layers", 4, *objective)
    assert all(layers % 4 == 0 for layers in old["layers_per_stage"]) and sum(old["layers_per_stage"]) == 32
    assert any(layers % 4 for layers in new["layers_per_stage"])  # unconstrained, the planner goes elsewhere
    assert old["peak_predicted_gib"] >= new["peak_predicted_gib"] or objective[1] == "time"


def test_recommend_refuses_n_no_split_can_take(advisor):
    line = advisor.error(*RECOMMEND, "--recompute-num-layers", 5, "--megatron-version", "0.15")
    assert "no split of 32 layers over PP 4 gives every stage a multiple of 5 layers" in line
    advisor.json(*RECOMMEND, "--recompute-num-layers", 5)  # core 0.19 runs it


def test_a_launch_script_core_015_would_fail_on_is_named(advisor, tmp_path):
    """--from-command reads the user's own flags into the same check."""
    script = tmp_path / "train.sh"
    script.write_text("torchrun --nproc-per-node 8 --nnodes 4 pretrain_gpt.py --num-layers 32 --hidden-size 4096 "
                      "--ffn-hidden-size 14336 --num-attention-heads 32 --group-query-attention --num-query-groups 8 "
                      "--seq-length 8192 --max-position-embeddings 8192 --normalization RMSNorm --swiglu "
                      "--position-embedding-type rope --disable-bias-linear --untie-embeddings-and-output-weights "
                      "--tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 --micro-batch-size 1 "
                      "--global-batch-size 256 --bf16 --recompute-granularity full --recompute-method uniform "
                      "--recompute-num-layers 3 --vocab-size 128256\n")
    line = advisor.error("estimate", "--from-command", script, "--mem", 80, "--megatron-version", "0.15")
    assert "--recompute-num-layers 3 with model chunks of 8 layers" in line
    assert advisor.json("estimate", "--from-command", script, "--mem", 80)["recompute_num_layers"] == 3


def test_with_from_command_the_recompute_flags_are_the_commands(advisor):
    """A lone --recompute-num-layers beside --from-command is the command's to give, not a half
    recomputation to complete (the user was told to add --recompute-method, then refused for it)."""
    command = Path(__file__).parent / "data" / "logs" / "core_v0.15.2_cpu_pp2.command"
    line = advisor.error("estimate", "--from-command", command, "--mem", 80, "--recompute-num-layers", 4)
    assert "comes from the command with --from-command" in line and "needs --recompute-method" not in line
