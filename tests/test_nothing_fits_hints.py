"""Honest hints where nothing fits, and honest times where an estimate does not fit.

Where no layout's weights, gradients and optimizer states alone fit the memory, the sweep says what
they need and does not hint a shorter --seq-len or recomputation, which shrink activations only;
where the states fit and activations do not, it still hints a shorter --seq-len, and a shorter one
then fits. Dense and MoE sweeps alike say which of --sharding auto's levers they tried, and why
not the others.
An estimate judged oom or likely oom prints its step time as what the step would take if it fit.

The sizes are derived here by hand from the models' published shapes (Llama 3 405B and 3.1 70B,
Mixtral 8x7B: hidden size, layers, FFN size, KV heads, vocabulary), not read from the advisor.
"""

from __future__ import annotations

import re

import pytest

GIB = 2**30
H100 = ("--gpu", "h100-80gb")


def _llama_parameters(hidden: int, layers: int, ffn: int, heads: int, kv_heads: int, vocab: int) -> tuple[int, int]:
    """(the parameters TP shards, the replicated norms) of an untied Llama: per layer Q and O
    (h x h), K and V (h x kv_heads x head_dim each), the SwiGLU MLP (3 h ffn) and two RMSNorms;
    the embedding and the LM head (vocab x h each), the final norm."""
    kv = kv_heads * hidden // heads
    per_layer = 2 * hidden * hidden + 2 * hidden * kv + 3 * hidden * ffn
    return layers * per_layer + 2 * vocab * hidden, layers * 2 * hidden + hidden


LLAMA3_405B = _llama_parameters(16384, 126, 53248, 128, 8, 128256)
LLAMA31_70B = _llama_parameters(8192, 80, 28672, 64, 8, 128256)
STATE_BYTES = 2 + 4 + 12  # BF16 weights, FP32 gradients, FP32 master weights and Adam's two moments


def _tp8_states_gib(parameters: tuple[int, int], per_parameter: int = STATE_BYTES) -> float:
    """States per GPU at TP 8, PP 1, DP 1 (8 GPUs): the sharded parameters over 8, the norms whole."""
    sharded, replicated = parameters
    return (sharded / 8 + replicated) * per_parameter / GIB


def _line(advisor, *args) -> str:
    """The one nothing-fits line of a sweep (exit status 1, nothing on stdout)."""
    result = advisor("sweep", *args, expect=1)
    assert result.stdout == "" and result.stderr.count("\n") == 1, result.stderr
    return result.stderr.strip()


def _number(line: str, before: str) -> float:
    return float(re.search(rf"([\d.]+) GiB{re.escape(before)}", line).group(1))


def _tries(line: str) -> str:
    return line[line.rindex(". Try ") + len(". Try "):]


# --- 1. the states alone exceed the memory -----------------------------------------------------------

def test_405b_on_8_h100s_says_what_its_states_need_and_hints_no_shorter_seq_len(advisor):
    line = _line(advisor, "--model", "llama3-405b", "--gpus", 8, *H100)
    states = _tp8_states_gib(LLAMA3_405B)  # 850.52 GiB: the least layout (TP 8) holds every layer
    assert f"(TP 8, CP 1, PP 1, MBS 1), and its weights, gradients and optimizer states alone need {states:.1f} " \
           "GiB (more than 80 GiB in every layout, whatever the --seq-len)" in line
    # spread perfectly over 8 GPUs, 18 bytes a parameter is far above 80 GiB in any layout
    assert sum(LLAMA3_405B) * STATE_BYTES / 8 / GIB > 800
    # the levers' floor: 6 bytes of weights and gradients a parameter over all 8 GPUs
    assert f"the weights and gradients alone would still need {_tp8_states_gib(LLAMA3_405B, 6):.1f} GiB" in line
    assert _tries(line) == "more GPUs (--all shows the rows)"
    assert "shorter --seq-len" not in line and "--recompute" not in line


def test_one_gpu_has_nothing_to_shard_over(advisor):
    """--gpus 1 said 'sharded over all 1 GPUs'. Its floor: 6 bytes of weights and gradients a
    parameter, whole on the one GPU: 70B's (8 x the TP 8 share plus the norms) is 394 GiB."""
    line = _line(advisor, "--model", "llama3.1-70b", "--gpus", 1, *H100)
    sharded, replicated = LLAMA31_70B
    floor = (sharded + replicated) * 6 / GIB
    assert f"; with the optimizer in host memory, the weights and gradients alone would still need {floor:.1f} GiB" \
        in line
    assert "sharded over" not in line


def test_the_paper_model_with_narrow_choices_hints_only_what_shrinks_states(advisor):
    line = _line(advisor, "--model", "llama3.1-70b", "--gpus", 8, "--mem", 4, "--recompute", "none",
                 "--split", "even")
    assert _number(line, " (more than") == pytest.approx(_tp8_states_gib(LLAMA31_70B), abs=0.05)
    # 6 bytes of weights and gradients over 8 GPUs (49.3 GiB) do not fit 4 GiB either: no lever helps
    assert _number(line, ". Try") == pytest.approx(_tp8_states_gib(LLAMA31_70B, 6), abs=0.05)
    assert _tries(line) == "more GPUs, --split auto or a GPU with more memory (--all shows the rows)"


def test_where_offload_could_make_room_a_shorter_seq_len_is_hinted_with_it_and_then_fits(advisor):
    """70B on 8 H100s: 147.9 GiB of states, but 49.3 GiB of weights and gradients, so optimizer
    CPU offload (--sharding auto) leaves room; at 131072 tokens it still does not fit, at 32768 it does."""
    line = _line(advisor, "--model", "llama3.1-70b", "--gpus", 8, *H100, "--seq-len", 131072)
    assert f"optimizer states alone need {_tp8_states_gib(LLAMA31_70B):.1f} GiB" in line
    # the ladder's bound (advisor.space_search.may_fit) skips every rung: said so, as the MoE line says it
    assert ("; --sharding auto did not try Megatron-FSDP optim_grads, optim_grads_params or optimizer CPU offload: "
            "no layout can fit with it.") in line
    for lever in (("--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads"),
                  ("--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"),
                  ("--optimizer-cpu-offload",)):  # each rung, given by hand: nothing fits either
        _line(advisor, "--model", "llama3.1-70b", "--gpus", 8, *H100, "--seq-len", 131072, *lever)
    assert _tries(line) == ("more GPUs, a shorter --seq-len with them or a GPU with more memory "
                            "(--all shows the rows)")
    shorter = advisor("sweep", "--model", "llama3.1-70b", "--gpus", 8, *H100, "--seq-len", 32768, "--top", 1)
    assert "the rows use optimizer CPU offload" in shorter.stderr

    fixed = _line(advisor, "--model", "llama3.1-70b", "--gpus", 8, *H100, "--seq-len", 131072, "--sharding", "fixed")
    assert _tries(fixed) == ("more GPUs, --sharding auto (Megatron-FSDP, optimizer CPU offload) or a GPU with more "
                             "memory (--all shows the rows)")


def test_on_a_gpu_that_cannot_time_offload_the_line_says_it_was_not_tried(advisor):
    """70B on 8 H800s: gpus.json gives the H800 no host memory bandwidth, so --sharding auto's ladder
    passes the offload (escalation.climb); the line said offload was tried and fit nothing
    (reviewer6). Given by hand, the offload is refused (exit 2) for the same reason. The FSDP
    rungs are not swept either: the ladder's bound says no layout can fit with them."""
    line = _line(advisor, "--model", "llama3.1-70b", "--gpus", 8, "--gpu", "h800-80gb")
    assert ("; --sharding auto did not try Megatron-FSDP optim_grads or optim_grads_params: no layout can fit with "
            "it; it did not try optimizer CPU offload: h800-80gb has no host link or host memory bandwidth to time "
            "it (gpus.json). Try ") in line
    assert "host memory bandwidth" in advisor.error("sweep", "--model", "llama3.1-70b", "--gpus", 8, "--gpu",
                                                    "h800-80gb", "--optimizer-cpu-offload")


# --- 2. activations dominate: the shorter --seq-len stays, and is true ----------------------------------

def test_where_activations_dominate_a_shorter_seq_len_is_hinted_and_fits(advisor):
    args = ("--model", "llama3.1-8b", "--gpus", 8, *H100)
    line = _line(advisor, *args, "--seq-len", 524288)
    assert "alone need" not in line
    assert ("; --sharding auto did not try Megatron-FSDP optim_grads, optim_grads_params or optimizer CPU offload: "
            "no layout can fit with it. Try") in line  # the line said nothing of the ladder it climbed
    _line(advisor, *args, "--seq-len", 524288, "--optimizer-cpu-offload")  # the bound's claim, given by hand
    assert _tries(line) == "more GPUs or a shorter --seq-len (--all shows the rows)"
    rows = advisor.json("sweep", *args, "--seq-len", 131072)
    assert rows and rows[0]["rank"] == 1


# --- 3. MoE sweeps ---------------------------------------------------------------------------------------

# the ladder's rungs the MoE model prices (advisor.cli.moe.rung_problem), each skipped by the bound
# (advisor.moe.space.may_fit: the model states alone exceed the memory in every layout with it)
TRIED = ("; --sharding auto did not try Megatron-FSDP optim_grads, optim_grads_params or optimizer CPU offload: no "
         "layout can fit with it")


def test_deepseek_v3_on_16_h100s_says_its_states_exceed_and_which_sharding_was_tried(advisor):
    line = _line(advisor, "--model", "deepseek-v3", "--gpus", 16, *H100)
    # 671B parameters at 18 bytes, spread perfectly over 16 GPUs: 703 GiB at the very least
    floor = 671e9 * STATE_BYTES / 16 / GIB
    assert _number(line, " (more than 80 GiB in every layout, whatever the --seq-len)") >= floor > 80
    assert TRIED + ". Try more GPUs (--all shows the rows)" in line
    assert "shorter --seq-len" not in _tries(line) and "--sharding" not in _tries(line)
    # --sharding auto is the default: given explicitly, the same line
    assert _line(advisor, "--model", "deepseek-v3", "--gpus", 16, *H100, "--sharding", "auto") == line
    assert TRIED not in _line(advisor, "--model", "deepseek-v3", "--gpus", 16, *H100, "--sharding", "fixed")
    # each rung named is true, swept as a user would give it
    for lever in (("--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads"),
                  ("--use-megatron-fsdp", "--data-parallel-sharding-strategy", "optim_grads_params"),
                  ("--optimizer-cpu-offload",)):
        _line(advisor, "--model", "deepseek-v3", "--gpus", 16, *H100, *lever)


def test_mixtral_on_8_h100s_needs_its_states_by_hand_and_fits_a_bigger_gpu(advisor):
    """Under Megatron's DDP (--sharding fixed); the default ladder runs it with optimizer CPU offload
    (tests/test_moe_escalation.py)."""
    line = _line(advisor, "--model", "mixtral-8x7b", "--gpus", 8, *H100, "--sharding", "fixed")
    hidden, layers, ffn, vocab, experts, kv = 4096, 32, 14336, 32000, 8, 1024
    # TP 8, EP 8: one expert of each layer per GPU; attention, embedding and head over TP 8;
    # router and norms whole; every state sharded over the 8 GPUs once (DP and expert DP 1)
    expert = layers * 3 * hidden * ffn * experts // 8
    dense = (2 * vocab * hidden + layers * (2 * hidden * hidden + 2 * hidden * kv)) / 8 \
        + layers * (hidden * experts + 2 * hidden) + hidden
    assert _number(line, " (more than 80 GiB") == pytest.approx(
        (expert + dense) * STATE_BYTES / GIB, abs=0.05)
    assert line.endswith("(more than 80 GiB in every layout, whatever the --seq-len). Try more GPUs or a GPU with "
                         "more memory (--all shows the rows)")
    rows = advisor.json("sweep", "--model", "mixtral-8x7b", "--gpus", 8, "--gpu", "h200-141gb", "--top", 1)
    assert rows and rows[0]["rank"] == 1


def test_an_moe_sweep_whose_states_fit_keeps_the_shorter_seq_len_which_then_fits(advisor):
    args = ("--model", "qwen3-30b-a3b", "--gpus", 8, *H100, "--sharding", "fixed")  # auto: offload runs it
    line = _line(advisor, *args)
    assert "alone need" not in line
    assert line.endswith(" MBS 1). Try more GPUs or a shorter --seq-len (--all shows the rows)")
    rows = advisor.json("sweep", *args, "--seq-len", 2048)
    assert rows and rows[0]["rank"] == 1


# --- 4. estimates that do not fit say their time is hypothetical --------------------------------------

def _time_lines(result) -> list[str]:
    return [line for line in result.stdout.splitlines() if re.search(r"\bstep [\d.]+ s\b|\btokens: ", line)]


@pytest.mark.parametrize("args, verdict", [
    (("--model", "llama3-405b", "--gpus", 8, "--tp", 8, *H100), "oom"),
    (("--gpus", 8, "--tp", 2, *H100, "--mem", 62), "likely oom"),
    (("--model", "mixtral-8x7b", "--gpus", 8, "--ep", 8, *H100), "oom"),
    (("--model", "qwen3-30b-a3b", "--gpus", 8, "--tp", 4, "--pp", 2, "--ep", 4, "--etp", 1, "--recompute", "full",
      *H100),
     "likely oom"),
])
def test_an_estimate_that_does_not_fit_times_the_step_if_it_fit(advisor, args, verdict):
    table = advisor("estimate", *args)  # exit status 0: the estimate did its job
    row = advisor.json("estimate", *args)
    assert row["verdict"] == verdict
    step = f"if it fit: step {row['step_time_s']:.2f} s, {row['tflops_per_gpu']:.0f} TFLOP/s per GPU"
    assert _time_lines(table)[0].startswith(step)
    assert f"-> {verdict}\n" in table.stdout


def test_the_405b_estimate_is_oom_by_hand_and_its_json_keeps_its_keys(advisor):
    args = ("--model", "llama3-405b", "--gpus", 8, "--tp", 8, *H100)
    assert _tp8_states_gib(LLAMA3_405B) > 80  # its states alone: oom whatever its activations
    row = advisor.json("estimate", *args)
    fitting = advisor.json("estimate", "--gpus", 8, "--tp", 2, *H100)
    assert row["verdict"] == "oom" and fitting["verdict"] == "fits"
    assert set(row) == set(fitting)  # the verdict says it; no key added or dropped
    days = advisor.json("estimate", *args, "--tokens", "15T")["days"]
    lines = _time_lines(advisor("estimate", *args, "--tokens", "15T"))
    assert len(lines) == 2 and lines[0].startswith("if it fit: step ")
    assert lines[1].startswith(f"if it fit: 15T tokens: {days:.1f} days")


@pytest.mark.parametrize("args", [
    ("--gpus", 8, "--tp", 2, *H100),
    ("--model", "mixtral-8x7b", "--gpus", 16, "--tp", 4, "--cp", 2, "--ep", 8, "--etp", 2, *H100),
])
def test_an_estimate_that_fits_times_the_step_plainly(advisor, args):
    assert advisor.json("estimate", *args)["verdict"] == "fits"
    lines = _time_lines(advisor("estimate", *args))
    assert lines and lines[0].startswith("step ") and "if it fit" not in advisor("estimate", *args).stdout


def test_with_the_precision_aware_optimizer_it_says_which_levers_were_not_tried(advisor):
    """--sharding auto cannot climb where the options refuse its rungs: Megatron-FSDP is not priced
    with the precision-aware optimizer, and offload ignores lowered state dtypes (it keeps FP32
    states). Said, not claimed as tried; the 70B case above fits with offload at 32768 tokens."""
    lowered = _line(advisor, "--model", "llama3.1-70b", "--gpus", 8, *H100, "--gbs", 64,
                    "--use-precision-aware-optimizer", "--exp-avg-dtype", "bf16")
    assert ("; --sharding auto did not try Megatron-FSDP optim_grads or optim_grads_params: "
            "--use-precision-aware-optimizer with FSDP is not priced (Megatron-FSDP keeps the main weights in its "
            "own buffers; Megatron-Bridge turns the optimizer off with FSDP); it did not try optimizer CPU offload: "
            "--exp-avg-dtype bf16 has no effect with --optimizer-cpu-offload (Megatron's HybridDeviceOptimizer keeps "
            "FP32 states).") in lowered
    assert "a shorter --seq-len" not in lowered  # the states alone exceed the memory, whatever the --seq-len
    assert "--optimizer-cpu-offload without --exp-avg-dtype" in _tries(lowered)  # which then fits (above)
    fp32 = _line(advisor, "--model", "llama3.1-70b", "--gpus", 8, *H100, "--seq-len", 131072,
                 "--use-precision-aware-optimizer")
    assert ("; --sharding auto did not try Megatron-FSDP optim_grads or optim_grads_params: "
            "--use-precision-aware-optimizer with FSDP is not priced (Megatron-FSDP keeps the main weights in its own "
            "buffers; Megatron-Bridge turns the optimizer off with FSDP); it did not try optimizer CPU offload: no "
            "layout can fit with it.") in fp32
    _line(advisor, "--model", "llama3.1-70b", "--gpus", 8, *H100, "--seq-len", 131072,
          "--use-precision-aware-optimizer", "--optimizer-cpu-offload")  # the bound's claim, given by hand
