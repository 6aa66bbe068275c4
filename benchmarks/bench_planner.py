"""Planning speed of the recommender (issue 5), and of CAPTURE's brute-force Algorithm 4.

Targets: the hybrid space for 32 layers on 16 GPUs (4 nodes x 4) in < 1 s; Megatron mode for 80
layers on PP 16 and 126 layers on PP 32, each in < 1 s. CAPTURE's paper reports 31 min 18 s of
planning for GPT-3 6.7B (32 layers) on 16 GPUs (its Table II).

The profiles are synthetic and in memory (no files): per-module terms from seed 004's equations
(advisor.equations) for Llama-3.1 8B / 70B / 405B, and stage peaks from them with 1F1B in-flight
counts, a per-microbatch receive buffer and a fixed overhead. Only their shape matters here:
identical layers and heavy first and last stages, which is what makes CAPTURE's pruning weak
(Section IV-C: "many layers exhibit similar memory usage"). Timed: from a loaded ProfileSet to a
Plan (statistics or module terms, cost tables, the exact planner with CAPTURE's tie-break, the
even-split baseline), the median of REPEAT runs. Algorithm 4 runs in a child process and is
stopped after --brute-force-limit seconds.

    python benchmarks/bench_planner.py [--brute-force-limit 600]
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import platform
import statistics
import sys
import time

from advisor import equations as eq
from advisor.capture.layout import PipelineLayout, Scenario, in_flight_microbatches
from advisor.capture.observations import ModuleTerms, ProfileSet, RunObservation, StageObservation
from advisor.capture.partitionings import description1, reduced
from advisor.capture.recommend import hybrid_tables, make_predictor, recommend_hybrid, recommend_megatron
from advisor.megatron_args import MegatronSetup
from advisor.models import PRESETS, LlamaSpec, with_overrides

REPEAT = 5
SEQ = 4096
MIB = 2**20


def _terms(spec: LlamaSpec, key, tp: int, dp: int, mbs: float) -> ModuleTerms:
    if key == "embedding":
        params, act = eq.embedding_parameters(spec, tp), eq.embedding_activation_bytes(spec, SEQ, mbs)
        transient = 0.0
    elif key == "output":
        params = eq.embedding_parameters(spec, tp) + eq.final_norm_parameters(spec)
        act = eq.output_activation_bytes(spec, SEQ, mbs)
        transient = 4.0 * SEQ * mbs * spec.vocab_size  # the FP32 logits of the loss
    else:
        params, act = eq.layer_parameters(spec, tp), eq.layer_activation_bytes(spec, SEQ, mbs)
        transient = eq.mlp_activation_bytes(spec, SEQ, mbs) / 2
    return ModuleTerms(parameter_bytes=int(2 * params), gradient_bytes=int(4 * params),
                       optimizer_bytes=int(12 * params / dp), activation_bytes=int(act / tp),
                       forward_peak_bytes=int((act + transient) / tp), backward_peak_bytes=int(transient / tp))


def _run(spec: LlamaSpec, counts, scenario: Scenario, batch: int, name: str) -> RunObservation:
    layout = PipelineLayout.from_counts(counts, batch, len(counts), scenario)
    mbs = batch / scenario.dp
    stages = []
    for index, stage in enumerate(layout.stages):
        keys = (["embedding"] if stage.first == 1 else []) + list(range(stage.first, stage.last + 1)) + \
            (["output"] if stage.last == spec.num_layers else [])
        modules = {key: _terms(spec, key, scenario.tp, scenario.dp, mbs) for key in keys}
        n = in_flight_microbatches(index, len(counts), layout.num_microbatches)
        receive = 2 * SEQ * mbs * spec.hidden_size / scenario.tp
        peak = (sum(m.static_bytes for m in modules.values()) + n * sum(m.activation_bytes for m in modules.values())
                + max(m.backward_peak_bytes for m in modules.values()) + 512 * MIB + n * receive)
        stages.append(StageObservation(
            run=name, stage=index, spec=stage, pipeline_microbatch=batch, in_flight=n, peak_bytes=int(peak),
            modules=modules))
    return RunObservation(run=name, layout=layout, stages=tuple(stages), gpu_peaks=())


def profiles(spec: LlamaSpec, stages: int, scenarios, batches, full: bool) -> ProfileSet:
    """Every scenario profiled on ``stages`` pipeline stages (CAPTURE's Description 1, or the
    reduced set), at its two pipeline microbatches."""
    runs = []
    for scenario in scenarios:
        for partition in (description1 if full else reduced)(spec.num_layers, stages):
            for batch in batches[scenario]:
                runs.append(_run(spec, partition, scenario, batch, f"{scenario.name}-{batch}-{partition}"))
    return ProfileSet(model=spec, seq_len=SEQ, cp=1, setup=MegatronSetup(params_dtype="bfloat16"), runs=tuple(runs))


def median_time(function) -> tuple[float, object]:
    times, result = [], None
    for _ in range(REPEAT):
        start = time.perf_counter()
        result = function()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


HYBRID = [Scenario(), Scenario(dp=2), Scenario(dp=4), Scenario(tp=2), Scenario(tp=4)]


def hybrid_profiles(layers: int) -> ProfileSet:
    """The full campaign of a Llama-3.1-8B with ``layers`` layers, every scenario on 4 stages."""
    spec = with_overrides(PRESETS["llama3.1-8b"], num_layers=layers)
    batches = {s: (4, 8) if s.dp == 4 else (2, 4) for s in HYBRID}
    return profiles(spec, 4, HYBRID, batches, full=True)


def _brute_force(layers: int, nodes: int, per_node: int, queue) -> None:
    from advisor.capture.algorithm4 import algorithm4
    from advisor.capture.search import plan_hybrid

    tables, _ = hybrid_tables(make_predictor(hybrid_profiles(layers), "capture"), devices_per_node=per_node,
                              devices=nodes * per_node, micro_batch_size=8, num_microbatches=32)
    exact_seconds, exact = median_time(lambda: plan_hybrid(tables, nodes, per_node))
    start = time.perf_counter()
    plan = algorithm4(tables, nodes, per_node)
    queue.put((time.perf_counter() - start, exact_seconds, plan == exact, plan.peak, plan.units_per_stage))


def brute_force(layers: int, nodes: int, per_node: int, limit: float) -> tuple[float | None, str]:
    """Algorithm 4 and the exact planner on the same CAPTURE cost tables, in a child process."""
    queue = multiprocessing.Queue()
    child = multiprocessing.Process(target=_brute_force, args=(layers, nodes, per_node, queue))
    child.start()
    child.join(limit)
    if child.is_alive():
        child.terminate()
        child.join()
        return None, f"stopped after {limit:.0f} s"
    elapsed, exact_seconds, same, peak, units = queue.get()
    return elapsed, (f"peak {peak / 2**30:.3f} GiB, layers per stage {units}; exact planner {exact_seconds:.3f} s, "
                     f"{'the same plan' if same else 'A DIFFERENT PLAN'}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--brute-force-limit", type=float, default=600, help="seconds per Algorithm 4 case")
    args = parser.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"Python {platform.python_version()}, {platform.platform()}")
    print(f"Algorithm 4's brute force runs each case for up to --brute-force-limit {args.brute_force_limit:g} s and "
          f"stops at the first that runs out: with the default this benchmark takes 10 to 20 minutes "
          f"(--brute-force-limit 30 for a quick run)", flush=True)
    ok = True

    def report(label: str, seconds: float, target: float | None, detail: str) -> None:
        nonlocal ok
        verdict = "    " if target is None else ("PASS" if seconds < target else "FAIL")
        ok &= target is None or seconds < target
        print(f"{verdict}  {seconds:8.3f} s  {label}: {detail}" + (f" (target < {target} s)" if target else ""))

    data = hybrid_profiles(32)
    for name in ("capture", "1f1b"):
        seconds, plan = median_time(lambda: recommend_hybrid(data, gpus=16, gpus_per_node=4, micro_batch_size=8,
                                                             global_batch_size=256, predictor=name))
        degrees = ",".join(f"{s.tp}x{s.dp}" for s in plan.stages)
        report(f"hybrid, 32 layers on 4 x 4 GPUs, {name} predictor", seconds, 1.0,
               f"{plan.pp} stages, TPxDP {degrees}, peak {plan.peak_bytes / 2**30:.2f} GiB")
    for model, pp in (("llama3.1-70b", 16), ("llama3.1-405b", 32)):
        spec = PRESETS[model]
        reduced_data = profiles(spec, pp, [Scenario(tp=8)], {Scenario(tp=8): (1, 2)}, full=False)
        seconds, plan = median_time(lambda: recommend_megatron(
            reduced_data, gpus=pp * 8, gpus_per_node=8, tp=8, pp=pp, micro_batch_size=1, global_batch_size=1024))
        report(f"megatron, {spec.num_layers} layers on PP {pp} (TP 8), 1f1b predictor", seconds, 1.0,
               f"layers {'/'.join(map(str, plan.layers_per_stage))}, peak {plan.peak_bytes / 2**30:.2f} GiB "
               f"(even split {max(plan.baseline.stage_bytes) / 2**30:.2f} GiB)")
    for layers, nodes, per_node in ((8, 2, 4), (12, 2, 4), (16, 2, 4), (12, 4, 4), (16, 4, 4), (20, 4, 4),
                                    (24, 4, 4), (32, 4, 4)):
        seconds, detail = brute_force(layers, nodes, per_node, args.brute_force_limit)
        if seconds is None:
            print(f"      >{args.brute_force_limit:5.0f} s  Algorithm 4, {layers} layers on {nodes} x {per_node}: "
                  f"{detail}")
            break
        report(f"Algorithm 4, {layers} layers on {nodes} x {per_node}", seconds, None, detail)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
