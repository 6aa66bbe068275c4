"""``advisor recommend``: CAPTURE's planner (seed 000, Section III-C) over layer profiles, and
MadPipe's (seed 001) for --objective time, from profiles or from the analytic models."""

from __future__ import annotations

import math
from pathlib import Path

import click

from advisor import limits
from advisor.cli.options import (
    DEGREE, EPILOG, FRACTION, GPUS, MICRO_BATCH, STDOUT, Bounded, InputError, InputPath, drawing_for, document_options,
    distinct_files, emit_document, gpu_options, model_options, nothing_fits, png_path, workload_options, UserPath, wrote,
)
from advisor.cli.training_flags import memory_options
from advisor.paper_rule import DEFAULT_THRESHOLD


PROFILE_DECIDES = ("model", "num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads",
                   "num_query_groups", "vocab_size", "tie_embeddings", "seq_len", "cp", "distributed_optimizer",
                   "grad_dtype", "recompute", "recompute_method", "recompute_num_layers", "sequence_parallel",
                   "flash_attn", "vocab_divisible_by")


RECOMMEND_HELP = """Recommend the layers per stage (and, in hybrid mode, per-stage degrees) with the lowest
predicted peak memory, or with the shortest predicted period under the memory limit.

\b
Both planners are exact and polynomial: CAPTURE's lowest peak, breaking
ties as CAPTURE does (the next-highest GPU, and so on); MadPipe's shortest
period under the limit for Megatron's 1F1B (stage i keeps PP - i
microbatches), ties to the lowest memory. Every planned stage is one
Megatron-LM runs: with --recompute-method uniform on --megatron-version
0.15, its layers a multiple of --recompute-num-layers.

The exit status is 0 for a plan within the memory; 1 when nothing fits: with
--objective time no split keeps every stage within the limit (one line says the
lowest peak any split reaches, and no plan is printed), with --objective memory
the lowest peak is above --mem or the --gpu's memory (the plan is still printed,
and one line on stderr says it does not fit); either way -o FILE writes no plan
(the line says so: a plan that does not fit is nothing to launch) and --png
draws none; 2 for bad input.

\b
Examples:
  advisor recommend --profile runs/ --gpus 16 --pp 4 --mbs 1 --gbs 64
  advisor recommend --profile runs/ --gpus 16 --gpu h100-94gb --pp 4
      # the preset's memory
  advisor recommend --profile runs/ --gpus 16 --gpus-per-node 4 \\
      --mode hybrid --mbs 8 --predictor capture -o plan.json --png plan.png
  advisor recommend --model llama3.1-405b --gpus 16384 --tp 8 --pp 16 \\
      --gbs 2048 --objective time --gpu h100-80gb
"""
"""advisor recommend --help (here, not in the docstring: the function stays within 80 lines)."""


PREDICTOR_WORDS = {"seed004": "analytic estimates, no profiles"}
"""The table's title says what predicted the plan's memory in a user's words where the name is
internal (seed004: the 4D paper's estimator, Eq. 1-18, with its extensions; not "memory model",
which the caption says of the verdict's: calibrated or Eq. 18); the profile
predictors keep their --predictor names (1f1b, capture). The plan file keeps every name."""


UNFUSED_SWIGLU_WORDS = "unfused SwiGLU: --no-bias-swiglu-fusion"
"""The title's words for a plan whose setup runs the eager SwiGLU (``MegatronSetup.bias_swiglu_fusion``
off): its profiles ran it (Megatron-LM or the symbolic TE spec asked so), or the analytic plan was
priced with --no-bias-swiglu-fusion; the plan launches it."""


@click.command("recommend", epilog=EPILOG, help=RECOMMEND_HELP)
@click.option("--profile", "profiles", multiple=True, type=InputPath(path_type=Path),
              help="A run directory (rank*.jsonl) or a directory of them; repeat for more. Without it the plan "
                   "comes from the analytic models (the 4D paper's memory, the time model with --gpu).")
@click.option("--gpus", type=GPUS, required=True, help="GPUs of the target run.")
@gpu_options("recommend")
@click.option("--objective", type=click.Choice(["memory", "time"]), default="memory", show_default=True,
              help="memory: the lowest peak (CAPTURE); time: the shortest period, the slowest stage's forward "
                   "+ backward time, with every stage within --threshold x --mem (MadPipe; the time model with "
                   "--gpu, or the profiles' per-layer times).")
@click.option("--mode", type=click.Choice(["megatron", "hybrid"]), default="megatron", show_default=True,
              help="megatron: uniform TP/CP/DP, uneven layers per stage (launchable); hybrid: CAPTURE's "
                   "per-stage DP/TP degrees (not launchable on stock Megatron; profiles, memory objective).")
@click.option("--predictor", type=click.Choice(["1f1b", "capture", "seed004"]), default=None,
              help="From profiles (--profile): 1f1b (their default), per-module terms by pipeline position, or "
                   "capture, CAPTURE's M_i/M_a statistics. Without profiles: seed004 (the default there), the 4D "
                   "paper's analytical memory model and, with --gpu, the time model. The plan records the one used.")
@click.option("--tp", type=DEGREE, default=1, show_default=True, help="Megatron mode: TP.")
@click.option("--cp", type=DEGREE, default=1, show_default=True,
              help="Without profiles: CP (profiles carry their own).")
@click.option("--pp", type=DEGREE, default=None, help="Megatron mode: pipeline stages (required).")
@click.option("--mbs", type=MICRO_BATCH, default=1, show_default=True,
              help="Micro-batch size (Megatron's, per DP replica; in hybrid mode the pipeline microbatch).")
@click.option("--merge-to", type=Bounded(limits.MERGED_UNITS), default=None,
              help="Merge layers to this many units first (CAPTURE's layer merger, Section III-A3).")
@click.option("--threshold", type=FRACTION, default=None,
              help=f"--objective time keeps every stage within this fraction of --mem (default {DEFAULT_THRESHOLD:g} "
                   "for the analytic estimator, the 4D paper's rule; 1.0 with profiles, which measure what it "
                   "leaves out, less the CUDA runtime's memory and the allocator's reserve, which they do not).")
@click.option("--memory-model", type=click.Choice(["calibrated", "paper"]), default=None,
              help="Without profiles, how a stage's memory is priced: calibrated (default with --gpu: the usage "
                   "advisor sweep and estimate judge, fits up to all of --mem) or paper (Eq. 18; default without).")
@click.option("--png", type=UserPath(dir_okay=False), default=None, callback=png_path, metavar="FILE.png",
              help="Draw the per-GPU memory of the plan beside the even split (like CAPTURE's Fig. 6).")
@model_options
@workload_options
@memory_options
@document_options
def recommend(profiles, gpus, gpu, mem, gpus_per_node, objective, mode, predictor, tp, cp, pp, mbs, merge_to,
              threshold, memory_model, png, spec, workload, options, release, fmt, output) -> None:
    """``advisor recommend``: ``RECOMMEND_HELP`` says what it does."""
    from advisor.capture.recommend import recommend_analytic, recommend_hybrid, recommend_megatron
    from advisor.errors import NothingFits
    from advisor.memory import GIB

    predictor = _check_input(profiles, gpus, gpus_per_node, objective, mode, predictor, tp, pp, output, png)
    calibration = _calibration(profiles, gpu, mem, memory_model)
    unmeasured = _unmeasured_bytes(mem) if profiles and mem else 0.0
    timing = None
    limit = None
    if objective == "time":
        if mem is None:
            raise InputError("--objective time needs the memory limit: --mem GIB or --gpu NAME")
        # profiles and the calibrated model measure or price what the paper's 80% leaves as headroom;
        # a profile's allocation leaves out what the calibrated model adds (``_unmeasured_bytes``)
        limit = (threshold or (1.0 if profiles or calibration else DEFAULT_THRESHOLD)) * mem * GIB - unmeasured
    # the GPU's memory, in every plan: the plan printed and the plan written say the same
    common = dict(gpus=gpus, gpus_per_node=gpus_per_node, micro_batch_size=mbs,
                  gpu_memory=None if mem is None else mem * GIB)
    try:
        if profiles:
            from advisor.capture.observations import load_profile_set

            profile_set = load_profile_set(profiles)
            if gpu is not None:
                # priced as launched: the profiles' setup decides the plan's flags (advisor.megatron_args)
                timing = _timing(profile_set.model, gpu, profile_set.seq_len, workload.global_batch_size,
                                 profile_set.setup.training_options().time_options())
            common.update(global_batch_size=workload.global_batch_size, predictor=predictor, merge_to=merge_to)
            if mode == "megatron":
                plan = recommend_megatron(profile_set, tp=tp, pp=pp, objective=objective, stage_limit=limit,
                                          timing=timing, **common)
            else:
                plan = recommend_hybrid(profile_set, **common)
        else:
            if getattr(spec, "num_experts", None):  # priced as dense it would be wrong, not approximate
                raise InputError(f"{spec.name} is a mixture of experts: the recommender's stages are dense layers; "
                                 "use advisor sweep or advisor estimate (--ep, --layers-per-stage)")
            if gpu is not None:
                timing = _timing(spec, gpu, workload.seq_len, workload.global_batch_size, options.time_options())
            plan = recommend_analytic(spec, workload, options, tp=tp, cp=cp, pp=pp, objective=objective,
                                      stage_limit=limit, timing=timing, release=release, calibration=calibration,
                                      threshold=threshold or DEFAULT_THRESHOLD, **common)
    except NothingFits as exc:
        less = f" less {unmeasured / GIB:.1f} GiB of runtime and allocator reserve" if unmeasured else ""
        nothing_fits(f"advisor recommend: nothing fits: {exc} (TP {tp}, PP {pp}, MBS {mbs}, --threshold "
                     f"{(limit + unmeasured) / GIB / mem:g} x {mem:g} GiB{less}). {_tries(profiles, options, mode)}"
                     f"{_unwritten(output, png)}")
    over = bool(mem) and plan.peak_bytes + unmeasured > mem * GIB  # the lowest peak, shown, over the memory: no files
    if png is not None and not over:
        from advisor.capture.chart import draw

        draw(plan, png, mem)
        wrote(png)
    emit_document(plan.to_dict(), lambda: _plan_table(plan, mem, unmeasured), fmt,
                  None if over and output != STDOUT else output)
    if over:
        beside = f" with {unmeasured / GIB:.1f} GiB of runtime and allocator reserve" if unmeasured else ""
        nothing_fits(f"advisor recommend: nothing fits: the lowest peak any split reaches is "
                     f"{_above((plan.peak_bytes + unmeasured) / GIB, mem)} GiB per GPU{beside}, above {mem:g} GiB. "
                     f"{_tries(profiles, options, mode)}{_unwritten(output, png)}")


def _above(peak_gib: float, mem: float) -> str:
    """``peak_gib`` to 2 decimals, or as many more as it takes to read as above ``mem`` (a MiB-scale
    CPU plan read "0.04 GiB per GPU, above 0.04 GiB"); cut, not rounded, so it never rounds up past."""
    for decimals in range(2, 10):
        cut = math.floor(peak_gib * 10**decimals) / 10**decimals
        if cut > mem:
            return f"{cut:.{decimals}f}"
    return repr(peak_gib)


def _calibration(profiles, gpu, mem: float | None, memory_model: str | None):
    """The calibrated memory model's constants where the analytic plan is priced with it (the
    default with --gpu, as in advisor sweep and estimate), else None (Eq. 18, or profiles)."""
    if profiles:
        if memory_model is not None:
            raise InputError(f"--memory-model {memory_model} prices the analytic plan; profiles measure their own "
                             "memory: drop it with --profile")
        return None
    from advisor.verdicts import default_memory_model

    if (memory_model or default_memory_model(gpu is not None)) == "paper":
        return None
    if mem is None:
        raise InputError("--memory-model calibrated needs the GPU's memory: --gpu NAME or --mem GIB")
    from advisor.throughput.calibration import load_memory_calibration

    return load_memory_calibration()


def _check_input(profiles, gpus: int, gpus_per_node: int, objective: str, mode: str, predictor: str | None,
                 tp: int, pp: int | None, output: Path | None, png: Path | None) -> str:
    """The checks before any work (one line and exit 2 for each); the predictor to use: the one
    asked for, or 1f1b with profiles and seed004 without."""
    from click.core import ParameterSource

    from advisor.parallel import check_whole_nodes

    distinct_files(**{"--output": output, "--png": png})
    if mode == "megatron" and pp is None:
        # Named as the user meets it: --mode megatron is the default, so most never typed it.
        raise InputError("advisor recommend needs --pp P, the number of pipeline stages whose layers it "
                         "plans (--mode megatron, the default; --mode hybrid chooses PP itself, from profiles)")
    if mode == "hybrid" and (pp is not None or tp != 1):
        raise InputError("--mode hybrid chooses TP, DP and PP per stage itself; drop --tp and --pp")
    if mode == "hybrid" and (objective == "time" or not profiles):
        raise InputError("--mode hybrid plans CAPTURE's space from profiles, for --objective memory only")
    check_whole_nodes(gpus, gpus_per_node)  # as advisor sweep and estimate: 16 GPUs on nodes of 3 is no cluster
    if profiles:
        context = click.get_current_context()
        given = [name for name in PROFILE_DECIDES if context.get_parameter_source(name) == ParameterSource.COMMANDLINE]
        if given:
            flags = ", ".join("--" + name.replace("_", "-") for name in given)
            raise InputError(f"{flags}: the profiles decide the model, sequence and setup; drop them with --profile")
        if predictor == "seed004":
            raise InputError("--predictor seed004 is the analytic models', which read no profiles: drop --profile, "
                             "or use --predictor 1f1b or capture")
        return predictor or "1f1b"
    # 1f1b and capture price layers from measured profiles: without them the plan would silently be
    # the analytic models' (seed004), not the predictor asked for
    if predictor in ("1f1b", "capture"):
        raise InputError(f"--predictor {predictor} needs profiles: give --profile DIR (made by 'advisor profile "
                         f"run'), or use --predictor seed004")
    return "seed004"


def _tries(profiles, options, mode: str = "megatron") -> str:
    """What can bring a plan's peak down, but what was given already (as advisor sweep's hints);
    hybrid mode chooses TP and PP itself, so only more GPUs."""
    if mode == "hybrid":
        return "Try more GPUs"
    full = not profiles and options.recomputation.recompute != "full"  # profiles decide their recomputation
    return "Try more GPUs, a larger --pp or --tp" + (", or --recompute full" if full else "") + \
        " (advisor sweep searches the layouts)"


def _unwritten(output: Path | None, png: Path | None = None) -> str:
    """What ends a nothing-fits line where -o named a file or --png a picture: a plan that does
    not fit is not written, nor drawn (one that was got launched without a word)."""
    plan = output is not None and output != STDOUT
    if plan and png is not None:
        return f"; no plan written to {output}, no picture to {png}"
    if plan:
        return f"; no plan written to {output}"
    return "" if png is None else f"; no picture written to {png}"


def _timing(spec, gpu, seq_len: int, global_batch_size: int, time_options=None):
    from advisor.rank_times import Timing
    from advisor.throughput import TimeModel, TimeOptions

    return Timing(TimeModel(spec, gpu, seq_len, global_batch_size, None, time_options or TimeOptions()),
                  gpu.gpus_per_node)


def set_aside_text(skipped: tuple[tuple[str, str], ...], total: int, shown: int = 3) -> str:
    """The plan table's line for the profile runs set aside: a campaign killed midway gave a plan
    from the runs that had finished without a word but in the JSON (audit)."""
    from advisor.capture.observations import set_aside_groups

    parts = [f"{names} ({why})" for names, why in set_aside_groups(skipped, shown)]
    return f"set aside {len(skipped)} of {total} profile runs: " + "; ".join(parts)


def stopped_early_text(runs: tuple[tuple[str, int, int], ...], shown: int = 3) -> str:
    """The plan table's line for the profile runs used that Megatron ended early itself: each one's
    peaks are those of the iterations it ran (a first iteration can peak lower than the next: the
    optimizer's states appear at the first step), so the plan says how many."""
    parts = [f"{run} ({done} of {asked} iterations)" for run, done, asked in runs[:shown]]
    more = f" and {len(runs) - shown} more" if len(runs) > shown else ""
    return (f"stopped early by Megatron (--exit-interval, --exit-duration-in-mins or a signal), measured over the "
            f"iterations they ran: {', '.join(parts)}{more}")


def _unmeasured_bytes(mem: float) -> float:
    """What a GPU holds beside a profile's peak allocation (``verdicts.runtime_and_reserve_bytes``):
    a profile measures allocated bytes (max_memory_allocated, or its symbolic and CPU stand-ins),
    so a plan at 99% of the GPU by its profiles would not run (audit: an 8B plan at 79.2 of 80 GiB
    that advisor estimate calls likely oom, 84.3 GiB)."""
    from advisor.throughput.calibration import load_memory_calibration
    from advisor.verdicts import runtime_and_reserve_bytes

    return float(runtime_and_reserve_bytes(load_memory_calibration(), mem))


def _plan_table(plan, mem: float | None, unmeasured: float = 0.0) -> str:
    from advisor import render
    from advisor.memory import GIB

    baseline = plan.baseline
    same = baseline is not None and len(baseline.stage_bytes) == plan.pp
    # GiB for real models; MiB (or less) for the tiny ones of a CPU profile.
    unit, size = render.byte_unit([max(stage.predicted_bytes for stage in plan.stages)])
    rows = []
    for stage in plan.stages:
        first, last = stage.gpus[0], stage.gpus[-1]
        rows.append({
            "stage": stage.stage, "count": stage.layers,
            "layers": f"{stage.first_layer}-{stage.last_layer}" if stage.layers > 1 else str(stage.first_layer),
            "tp": stage.tp, "dp": stage.dp, "gpus": f"{first}-{last}" if last > first else str(first),
            "in_flight": stage.in_flight_microbatches, "bytes": stage.predicted_bytes,
            "even": baseline.stage_bytes[stage.stage] if same else None, "time": stage.predicted_time_s,
        })
    # where the terminal is narrow, what can be worked out goes first (the GPU ids from the degrees,
    # the even split is the caption's peak too), the plan's memory and time last: at 60 columns the
    # memory per GPU, the rightmost but one of equal rank, went first and the GPU ids stayed (audit)
    columns = [render.Column("stage", "stage"), render.Column("layers", "layers"), render.Column("count", "#"),
               render.Column("tp", "TP"), render.Column("dp", "DP"), render.Column("gpus", "GPU ids", drop=4),
               render.Column("in_flight", "in flight", drop=2),
               render.Column("bytes", "plan", ".2f", scale=size, unit=unit)]
    # each column its unit under its header: the even split's memory said none ('GiB per GPU' was
    # the header of the plan's column beside it)
    if same:
        columns.append(render.Column("even", "even split", ".2f", scale=size, drop=3, unit=unit))
    if plan.period_s is not None:
        columns.append(render.Column("time", "time", ".1f", scale=1e-3, drop=1, unit="ms/microbatch"))
    peak = plan.peak_bytes
    caption = f"predicted peak {peak / size:.2f} {unit}"
    if plan.memory_model is not None:
        caption += ", calibrated memory model" if plan.memory_model == "calibrated" else ", Eq. 18"
    if mem and unmeasured:  # a profile's allocation: the runtime and the allocator's reserve on top
        caption += (f" allocated; with {unmeasured / GIB:.1f} GiB of runtime and allocator reserve, "
                    f"{render.percent_text((peak + unmeasured) / GIB / mem)} of {mem:g} GiB")
    elif mem:
        caption += f" ({render.percent_text(peak / GIB / mem)} of {mem:g} GiB)"
    if plan.verdict is not None:
        caption += f" -> {plan.verdict}"
    if baseline:
        even = max(baseline.stage_bytes)
        change = (even - peak) / even
        # a time plan may keep the even split's peak stage: "0.0% lower" said a gain there was none
        compared = "the same peak" if f"{abs(change):.1%}" == "0.0%" else \
            f"this plan is {abs(change):.1%} {'lower' if change >= 0 else 'higher'}"
        caption += f"; {baseline.label}: {even / size:.2f} {unit} ({compared})"
    if plan.objective == "time":
        caption += (f"\nperiod (slowest stage) {plan.period_s * 1e3:.1f} ms with every stage within "
                    f"{plan.stage_limit_bytes / GIB:.1f} GiB")
        if baseline is not None and baseline.stage_times is not None:
            caption += f"; even split {max(baseline.stage_times) * 1e3:.1f} ms"
        if plan.step_time_s is not None:
            caption += f"; predicted step {plan.step_time_s:.2f} s"
            if baseline is not None and baseline.step_time_s is not None:
                caption += f" (even split {baseline.step_time_s:.2f} s)"
    if not plan.launchable:
        caption += "\nNOT launchable on stock Megatron-LM (per-stage degrees)"
    elif plan.verdict in ("oom", "likely oom"):  # "launchable" beside "-> oom" read as a contradiction
        caption += f"\nstock Megatron-LM can launch this layout, but it is predicted {plan.verdict}"
    else:
        caption += "\nlaunchable on stock Megatron-LM"
    if plan.skipped_runs:
        caption += "\n" + set_aside_text(plan.skipped_runs, len(plan.profile_runs) + len(plan.skipped_runs))
    if plan.stopped_early_runs:
        caption += "\n" + stopped_early_text(plan.stopped_early_runs)
    degrees = f"TP {plan.tp}, CP {plan.cp}, DP {plan.dp}" if plan.tp else "per-stage TP/DP"
    # the SwiGLU the profiles ran (or the analytic plan priced) is launched: the eager one keeps
    # more memory a layer than Megatron-LM's default, and only the plan's flags said so
    swiglu = "" if plan.setup.bias_swiglu_fusion else f", {UNFUSED_SWIGLU_WORDS}"
    title = (f"{plan.model.name}: {plan.mode} plan, {plan.gpus} GPUs, {degrees}, PP {plan.pp}, "
             f"MBS {plan.micro_batch_size}, {plan.num_microbatches} microbatches "
             f"({PREDICTOR_WORDS.get(plan.predictor, f'{plan.predictor} predictor')}{swiglu})")
    # emit_document: the table always goes to standard output (--output takes the JSON)
    return render.to_table(rows, columns, title=title, caption=caption, drawing=drawing_for(None))
