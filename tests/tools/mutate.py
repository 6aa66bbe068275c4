"""A small mutation pass over the core (issue 24): each mutant changes one operator or constant in
a memory term, the schedule, a verdict, a time term or an emitted flag; the fast tests that cover
that code run against it; a mutant the tests pass "survives".

    python tests/tools/mutate.py                 # every mutant, a table on stdout
    python tests/tools/mutate.py --only 3,7      # some of them

Each mutant is (file, the exact text, its replacement, the tests to run). The text must occur
exactly once, so a mutant cannot silently stop applying when the code moves (the pass fails
instead). The file is restored after each run, also on Ctrl-C. mutmut was not used: it rewrites
every operator of a file and needs hours for these tests on two shared cores.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MEMORY = ["tests/test_memory.py", "tests/test_cli.py::test_estimate_extensions_reach_the_estimator"]
SCHEDULE = ["tests/test_schedule.py", "tests/test_memory.py"]
TIME = ["tests/test_terms_by_hand.py", "tests/test_throughput.py"]
VERDICTS = ["tests/test_verdicts_ranking.py"]
FLAGS = ["tests/test_megatron_args.py"]
OPTIONS = ["tests/test_megatron_args.py", "tests/test_options.py", "tests/test_levers.py"]
LEVERS = ["tests/test_levers.py", "tests/test_torch_fsdp2.py"]
REPLAY = ["tests/test_fsdp_optim_grads_ends.py", "tests/test_fsdp_optim_grads_queue.py",
          "tests/test_fsdp_optim_grads_replay.py"]
MOE_FSDP = ["tests/test_moe_fsdp_optim_grads_replay.py", "tests/test_moe_fsdp.py"]
MOE = ["tests/test_moe_memory.py", "tests/test_moe_time_stage.py", "tests/test_moe_pricing.py"]

MUTANTS = [  # (file, text, replacement, tests)
    ("advisor/equations.py", "return 3 * spec.hidden_size * spec.ffn_hidden_size / tp",
     "return 2 * spec.hidden_size * spec.ffn_hidden_size / tp", MEMORY),
    ("advisor/equations.py", "weights = 2 * h * h * (1 + k / a)", "weights = 2 * h * h * (1 + k / h)", MEMORY),
    ("advisor/equations.py", "    return 2 * spec.hidden_size\n", "    return spec.hidden_size\n", MEMORY),
    ("advisor/memory_levers.py", 'STATE_BYTES = {"fp32": 4,', 'STATE_BYTES = {"fp32": 6,',
     MEMORY + ["tests/test_terms_by_hand.py"]),
    ("advisor/equations.py", "eq11 = 6 * s * b * h + 4 * s * b * h * spec.num_query_groups",
     "eq11 = 6 * s * b * h + 2 * s * b * h * spec.num_query_groups", MEMORY),
    ("advisor/equations.py", "return 2 * spec.num_attention_heads * seq_len * seq_len * mbs",
     "return spec.num_attention_heads * seq_len * seq_len * mbs", MEMORY),
    ("advisor/equations.py", "return 2 * seq_len * mbs * (spec.hidden_size + 4 * spec.ffn_hidden_size)",
     "return 2 * seq_len * mbs * (spec.hidden_size + 3 * spec.ffn_hidden_size)", MEMORY),
    ("advisor/equations.py", "return 4 * seq_len * mbs * (spec.vocab_size if vocab is None else vocab)",
     "return 2 * seq_len * mbs * (spec.vocab_size if vocab is None else vocab)", MEMORY),
    ("advisor/equations.py", "return -(-vocab_size // multiple) * multiple", "return vocab_size // multiple * multiple",
     MEMORY),
    ("advisor/schedule.py", "warm = np.where(vpp == 1, pp - stage, interleaved)",
     "warm = np.where(vpp == 1, pp - stage + 1, interleaved)", SCHEDULE),
    ("advisor/schedule.py", "interleaved = 2 * (pp - stage - 1) + (vpp - 1) * pp + 1",
     "interleaved = 2 * (pp - stage - 1) + (vpp - 1) * pp", SCHEDULE),
    ("advisor/schedule.py", "return np.minimum(warm, np.asarray(num_microbatches, dtype=float) * vpp)",
     "return warm", SCHEDULE),
    ("advisor/paper_rule.py", "    if total_gib <= threshold * memory_gib:", "    if total_gib < threshold * memory_gib:",
     VERDICTS),
    ("advisor/paper_rule.py", "    if total_gib <= memory_gib:\n        return \"tight\"",
     "    if total_gib < memory_gib:\n        return \"tight\"", VERDICTS),
    ("advisor/verdicts.py", "    if ratio <= 1 - band:", "    if ratio <= 1:", VERDICTS),
    ("advisor/verdicts.py", "    if ratio <= 1 + band:", "    if ratio <= 1 + 2 * band:", VERDICTS),
    ("advisor/ranking.py", "    floor = (1 - tolerance) * tflops(fastest[0])", "    floor = tflops(fastest[0])",
     VERDICTS),
    ("advisor/throughput/terms.py", "    return forward, 2.0 * forward", "    return forward, 1.0 * forward", TIME),
    ("advisor/throughput/terms.py", "return 2.0 * m * k * n / rates.gemm_flops_per_s",
     "return 1.0 * m * k * n / rates.gemm_flops_per_s", TIME),
    ("advisor/throughput/terms.py", "    return steps / n * size_bytes / bandwidth", "    return size_bytes / bandwidth",
     TIME),
    ("advisor/throughput/terms.py", "    return 2 * reduce, 0.0 * gather", "    return reduce, 0.0 * gather", TIME),
    ("advisor/throughput/terms.py", "    forward = tp_collective_time(spec, tokens, tp, rates, sizes.input_gather) \\\n"
     "        + tp_collective_time(spec, tokens, tp, rates, sizes.output_scatter)",
     "    forward = tp_collective_time(spec, tokens, tp, rates, sizes.input_gather) \\\n"
     "        + 0.0 * tp_collective_time(spec, tokens, tp, rates, sizes.output_scatter)", TIME),
    ("advisor/throughput/terms.py", "return forward_flops / rate + latency / 3.5, 2.5 * forward_flops / rate",
     "return forward_flops / rate + latency / 3.5, 2.0 * forward_flops / rate", TIME),
    ("advisor/throughput/terms.py", "    backward = steps * np.maximum(0.0, 2 * send - attention_backward / c)",
     "    backward = steps * np.maximum(0.0, send - attention_backward / c)", TIME),
    ("advisor/throughput/terms.py", "    return (grad_bytes + grad_bytes + weight_write_bytes + master_read_bytes",
     "    return (grad_bytes + weight_write_bytes + master_read_bytes", TIME),
    ("advisor/throughput/terms.py", "    size = BF16 * tokens * spec.hidden_size / np.asarray(tp, dtype=float)\n"
     "    bandwidth = np.where(cross_node", "    size = BF16 * tokens * spec.hidden_size\n"
     "    bandwidth = np.where(cross_node", TIME),
    ("advisor/throughput/model.py", "        pipeline = m * slowest + (total - slowest) / v",
     "        pipeline = m * slowest + (total - slowest)", TIME),
    ("advisor/throughput/model.py", "        pipeline = m * slowest + (total - slowest) / v",
     "        pipeline = m * total / p + (total - slowest) / v", TIME),
    ("advisor/megatron_args.py", '"--attention-dropout", "0", "--hidden-dropout", "0",', "", FLAGS),
    ("advisor/megatron_args.py", '"--disable-bias-linear"', '"--add-bias-linear"', FLAGS),
    # the emitted flags moved to advisor/options/flags.py with the training options (issue 21)
    ("advisor/options/flags.py", '        args.append("--sequence-parallel")', "        pass", OPTIONS),
    ("advisor/options/flags.py", 'if p.params_dtype != "float32" and p.grad_reduce_dtype == "fp32":',
     'if p.params_dtype != "float32" and p.grad_reduce_dtype == "bf16":', OPTIONS),
    # the levers' memory and time terms (issue 21)
    ("advisor/memory_levers.py", "    gradients = options.gradient_bytes / np.where(grads_sharded, shards, 1.0)",
     "    gradients = options.gradient_bytes / np.where(weights_sharded, shards, 1.0)", LEVERS),
    ("advisor/memory_levers.py", "    return weights, gradients, optimizer * (1.0 - options.optimizer_host_fraction)",
     "    return weights, gradients, optimizer", LEVERS),
    ("advisor/throughput/levers.py", "    return gather, gather + scatter", "    return gather, scatter", LEVERS),
    ("advisor/throughput/levers.py", "    copies = offloaded * (gradient_bytes + BF16) / link_bytes_per_s",
     "    copies = offloaded * gradient_bytes / link_bytes_per_s", LEVERS),
    # the MoE terms (issue 22)
    ("advisor/moe/stage.py", "    per_expert = levers.state_bytes_per_parameter(options.memory, edp)",
     "    per_expert = levers.state_bytes_per_parameter(options.memory, 1)", MOE),
    ("advisor/moe/memory.py", "    per_copy = BF16 * (spec.hidden_size + 2 * f + (0 if recompute_act else f) + eager) + 4 + 8 / etp",
     "    per_copy = BF16 * (spec.hidden_size + 2 * f + (0 if recompute_act else f) + eager) + 4", MOE),
    ("advisor/moe/time.py", "    return forward, 2 * forward\n\n\ndef attention_flops",
     "    return forward, forward\n\n\ndef attention_flops", MOE),
    ("advisor/moe/ep_time.py", "(A2A_NETWORK_FRACTION * rates.line_network_bytes_per_s)",
     "(A2A_NETWORK_FRACTION * rates.nvlink_bytes_per_s)", MOE),
    # parameter counts at TP > 1 and PP > 1 (survivors of the coverage map; tests added with them)
    ("advisor/moe/params.py", "    return replicated + split / tp", "    return (replicated + split) / tp", MOE),
    ("advisor/moe/params.py", "return 3 * spec.hidden_size * spec.shared_expert_size / tp",
     "return 3 * spec.hidden_size * spec.shared_expert_size", MOE),
    ("advisor/throughput/model.py", "ends = np.where(p > 1, 1.0, 1.0 if spec.tie_embeddings else 2.0)",
     "ends = np.where(p > 1, 2.0, 1.0 if spec.tie_embeddings else 2.0)", LEVERS),
    ("advisor/throughput/model.py", "ends = np.where(p > 1, 1.0, 1.0 if spec.tie_embeddings else 2.0)",
     "ends = np.where(p > 1, 1.0, 2.0)", LEVERS),
    ("advisor/moe/memory.py", "    return kept / (tp * cp) + gathered", "    return kept / cp + gathered", MOE),
    ("advisor/throughput/levers.py", "return elementwise_time(step_bytes * (1.0 - fraction) * np.asarray(shard",
     "return elementwise_time(step_bytes * np.asarray(shard", LEVERS),
    # Megatron-FSDP optim_grads: the bucket cut, the queue and the first and last stages' ends
    ("advisor/memory_levers.py", "    return np.floor(queue / u) + 2.0", "    return np.floor(queue / u) + 1.0",
     LEVERS),
    ("advisor/memory_levers.py", "LAYER_WEIGHT_ARRIVAL = (5, 4, 3, 1, 2, 0)", "LAYER_WEIGHT_ARRIVAL = (5, 4, 3, 2, 1, 0)",
     REPLAY),
    ("advisor/memory_levers.py", "        return ddp_bucket_size(dp_cp)", "        return ddp_bucket_size(2 * dp_cp)", REPLAY),
    ("advisor/memory_levers.py", "        if own or current is None or current[1] >= bucket:",
     "        if own or current is None or current[1] > bucket:", REPLAY),
    ("advisor/memory_levers.py", "    output = np.where(last & ~(only & tied), matrix, 0.0)",
     "    output = np.where(last, matrix, 0.0)", REPLAY),
    ("advisor/memory_levers.py", 'tie = np.where(only, TIES["early"], TIES["own"]) if tied',
     'tie = np.where(only, TIES["own"], TIES["own"]) if tied', REPLAY),
    # the MoE layer's activations, transients and EP time (issue 22)
    ("advisor/moe/memory.py", "        return tokens * ep * np.minimum(k, local) * etp",
     "        return tokens * ep * k * etp", MOE),
    ("advisor/moe/memory.py", "    return np.where(group > 1, tokens * group, 0.0)",
     "    return np.where(group > 1, tokens * (group - 1), 0.0)", MOE),
    ("advisor/moe/memory.py", "    return 2 * BF16 * spec.hidden_size + RSTD_BYTES",
     "    return BF16 * spec.hidden_size + RSTD_BYTES", MOE),
    ("advisor/moe/memory.py", "    return INDEX_BYTES * k + PROBS_BYTES * k + group_mask",
     "    return INDEX_BYTES * k + group_mask", MOE),
    ("advisor/moe/transient.py", "    return np.where(etp > 1, copies / etp * PROBS_BYTES * spec.hidden_size, 0.0)",
     "    return np.where(etp > 1, copies * PROBS_BYTES * spec.hidden_size, 0.0)", MOE),
    ("advisor/moe/transient.py", "    return tokens * spec.num_experts * (PROBS_BYTES + held_map)",
     "    return tokens * spec.num_experts * PROBS_BYTES", MOE),
    ("advisor/moe/ep_time.py", "    return np.where(g > 1, dispatch + combine, 0.0)", "    return np.where(g > 1, dispatch, 0.0)",
     MOE),
    ("advisor/moe/ep_time.py", "    return np.maximum(comm, work + comm_sm_share * comm)", "    return np.maximum(comm, work)",
     MOE),
    # Megatron-FSDP optim_grads on an MoE stage: the groups and the backward order of its weights
    ("advisor/moe/fsdp_replay.py", '("router", spec.num_experts * h, DENSE)', '("router", spec.num_experts * h, ROUTED)',
     MOE_FSDP),
    ("advisor/moe/fsdp_replay.py", 'order = routed + ["router"] + (["shared_fc2", "shared_fc1"] if shared else [])',
     'order = (["shared_fc2", "shared_fc1"] if shared else []) + routed + ["router"]', MOE_FSDP),
    ("advisor/moe/fsdp_replay.py", '        routed = [f"fc2.{i}" for i in range(local)] + [f"fc1.{i}" for i in range(local)]',
     '        routed = [f"fc1.{i}" for i in range(local)] + [f"fc2.{i}" for i in range(local)]', MOE_FSDP),
]


def run(index: int, mutant, python: str) -> tuple[str, float]:
    path, text, replacement, tests = mutant
    file = ROOT / path
    original = file.read_text()
    if original.count(text) != 1:
        return f"does not apply ({original.count(text)} matches)", 0.0
    file.write_text(original.replace(text, replacement))
    start = time.monotonic()
    try:
        result = subprocess.run([python, "-m", "pytest", "-x", "-q", "-p", "no:cacheprovider", *tests], cwd=ROOT,
                                capture_output=True, text=True, timeout=900)
    finally:
        file.write_text(original)
    return ("killed" if result.returncode else "SURVIVED"), time.monotonic() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--only", default=None, help="comma-separated mutant numbers (1-based)")
    args = parser.parse_args()
    chosen = range(1, len(MUTANTS) + 1) if args.only is None else [int(n) for n in args.only.split(",")]
    print("| # | file | mutant | tests | result |\n|---:|---|---|---|---|")
    for n in chosen:
        path, text, replacement, tests = MUTANTS[n - 1]
        outcome, seconds = run(n, MUTANTS[n - 1], sys.executable)
        change = f"`{text.strip().splitlines()[0][:60]}` -> `{(replacement.strip().splitlines() or [''])[0][:60]}`"
        print(f"| {n} | {path} | {change} | {', '.join(Path(t.split('::')[0]).stem for t in tests)} | {outcome} "
              f"({seconds:.0f} s) |", flush=True)


if __name__ == "__main__":
    main()
