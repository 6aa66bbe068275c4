"""``advisor profile plan`` and ``advisor recommend``: thin click commands over advisor.capture.

Heavy imports (numpy, rich, matplotlib) happen inside the commands.
"""

from __future__ import annotations

from pathlib import Path

import click

from advisor.cli_options import InputError, apply_options, color_wanted, model_options

EPILOG = "Method and schemas: README.md (CAPTURE). Errors exit with status 2."


def _numbers(text: str, kind, name: str) -> tuple:
    try:
        values = tuple(kind(part) for part in text.split(","))
    except ValueError:
        raise InputError(f"{name} must be comma-separated numbers, got {text!r}") from None
    return values


def _document_options(func):
    func = click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path), default=None,
                        help="Also write the JSON document to this file (atomically).")(func)
    return click.option("--format", "fmt", type=click.Choice(["table", "json"]), default="table",
                        show_default=True, help="What to print: a table for people, or the JSON document.")(func)


def _emit(document: dict, table: str, fmt: str, output: Path | None) -> None:
    from advisor import render
    from advisor.fileio import atomic_write_text

    text = render.to_json(document)
    if output is not None:
        atomic_write_text(output, text)
        click.echo(f"wrote {output}", err=True)
    click.echo(text if fmt == "json" else table, nl=False)


# --- advisor profile plan ----------------------------------------------------------------


@click.command("plan", epilog=EPILOG)
@model_options
@click.option("--gpus", type=click.IntRange(min=1), required=True, help="GPUs the profiling runs may use (G).")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=8, show_default=True,
              help="K: DP/TP sub-meshes stay inside a node.")
@click.option("--seq-len", type=click.IntRange(min=1), default=8192, show_default=True, help="Sequence length.")
@click.option("--mbs", type=click.IntRange(min=1), default=1, show_default=True,
              help="Target micro-batch: sequences per microbatch entering the pipeline.")
@click.option("--gbs", type=click.IntRange(min=1), default=1024, show_default=True, help="Target global batch.")
@click.option("--mode", type=click.Choice(["full", "reduced"]), default="full", show_default=True,
              help="full: CAPTURE's Description 1 (about 10 L runs); reduced: 3 partitionings per scenario "
                   "and batch, for the 1F1B-aware predictor.")
@click.option("--fractions", default="0.5,0.25", show_default=True, metavar="F1,F2",
              help="The two fractions of the target microbatch to profile at.")
@click.option("--cp", type=click.IntRange(min=1), default=1, show_default=True,
              help="Context parallel size of every run (and of the target).")
@click.option("--microbatches", type=click.IntRange(min=1), default=None,
              help="Microbatches per profiling run (default: min(stages, target's)).")
@click.option("--units", default=None, metavar="N,N,...",
              help="Layers per merged unit for the DP/TP runs (CAPTURE's layer merger, Section III-A3).")
@click.option("--dtype", type=click.Choice(["bfloat16", "float16", "float32"]), default="bfloat16",
              show_default=True, help="Dtype of weights and activations (Megatron's --bf16 / --fp16 / neither).")
@click.option("--distributed-optimizer/--no-distributed-optimizer", default=True, show_default=True,
              help="Megatron's --use-distributed-optimizer (the CPU emulator runs without it).")
@click.option("--sequence-parallel/--no-sequence-parallel", default=True, show_default=True,
              help="--sequence-parallel in the TP runs (the CPU emulator runs without it).")
@_document_options
def plan_command(spec, gpus, gpus_per_node, seq_len, mbs, gbs, mode, fractions, cp, microbatches, units, dtype,
                 distributed_optimizer, sequence_parallel, fmt, output) -> None:
    """Plan the profiling runs of CAPTURE (seed 000, Section III-A) as Megatron runs.

    \b
    Scenarios: pipeline-only on G GPUs, and 2- and 4-way DP and TP on sub-meshes
    of a node (G/K stages), each at two microbatches (a half and a quarter of
    --mbs, rounded up to what the scenario can run). Each run is a partitioning
    of the layers over the stages, with its Megatron-LM flags and a stable id.

    \b
    Examples:
      advisor profile plan --gpus 16 --gpus-per-node 4 --mbs 8
      advisor profile plan --gpus 16 --gpus-per-node 4 --mode reduced -o campaign.json
      advisor profile plan --gpus 4 --gpus-per-node 4 --model llama3.2-1b --format json
      advisor profile plan --gpus 4 --gpus-per-node 1 --mode reduced --dtype float32 \\
          --no-distributed-optimizer --no-sequence-parallel -o campaign.json   # for the CPU emulator
    """
    from advisor import render
    from advisor.capture.campaign import plan_campaign
    from advisor.megatron_args import MegatronSetup

    campaign = plan_campaign(
        spec, gpus=gpus, gpus_per_node=gpus_per_node, seq_len=seq_len, micro_batch_size=mbs, global_batch_size=gbs,
        mode=mode, fractions=_numbers(fractions, float, "--fractions"), cp=cp, num_microbatches=microbatches,
        units=_numbers(units, int, "--units") if units else None,
        setup=MegatronSetup(params_dtype=dtype, distributed_optimizer=distributed_optimizer,
                            sequence_parallel=sequence_parallel),
    )
    rows = [run.to_dict() for run in campaign.runs]
    for row in rows:
        row["layers"] = " ".join(map(str, row["layers_per_stage"]))
    caption = "; ".join(
        f"{plan.scenario.name}: {plan.partitionings} partitionings x {len(plan.pipeline_microbatches)} batches"
        + (f" (no M_i for {len(plan.uncovered_mi)}, no M_a for {len(plan.uncovered_ma)} layers)"
           if plan.uncovered_mi or plan.uncovered_ma else "")
        for plan in campaign.scenarios
    )
    caption += "".join(f"; skipped {name}: {reason}" for name, reason in campaign.skipped)
    table = render.to_table(
        rows,
        [render.Column("id", "id", justify="left"), render.Column("scenario", "scenario", justify="left"),
         render.Column("pipeline_microbatch", "batch"), render.Column("micro_batch_size", "MBS"),
         render.Column("num_microbatches", "m"), render.Column("global_batch_size", "GBS"),
         render.Column("world_size", "GPUs"), render.Column("layers", "layers per stage", justify="left")],
        title=f"{spec.name}: {mode} profiling campaign, {len(rows)} runs on {gpus} GPUs ({gpus_per_node} per node)",
        caption=caption, color=color_wanted(None),
    )
    _emit(campaign.to_dict(), table, fmt, output)


# --- advisor profile run -----------------------------------------------------------------


def run_options(func):
    """CAMPAIGN, --out, --threads, --memory-limit: shared by 'advisor profile run' and the runner
    it starts (python -m megatron_hooks.campaign_runner), which receives them unchanged."""
    return apply_options([
        click.argument("campaign", type=click.Path(dir_okay=False, path_type=Path)),
        click.option("--out", required=True, type=click.Path(file_okay=False, path_type=Path),
                     help="Directory for the runs: OUT/<run id>/rank*.jsonl (what 'advisor recommend --profile' "
                          "reads)."),
        click.option("--threads", type=click.IntRange(min=1), default=None,
                     help="Intra-op threads per emulated GPU (default: cores / (TP x DP))."),
        click.option("--memory-limit", type=click.FloatRange(min=0, min_open=True), default=None, metavar="GIB",
                     help="Memory of each emulated GPU in GiB: a rank that needs more ends OOM, which is recorded "
                          "as the run's outcome (default: no limit)."),
    ], func)


@click.command("run", epilog=EPILOG)
@run_options
@click.option("--megatron-lm", metavar="DIR", default=None,
              help="Run on this node's GPUs: each run through torchrun and your Megatron-LM checkout's "
                   "pretrain_gpt.py, with the hooks (advisor-launch's entry). Without it, emulate on the CPU.")
@click.option("--mock-data", is_flag=True,
              help="With --megatron-lm: Megatron-LM's mock data, with a NullTokenizer sized to the model.")
@click.option("--train-iters", type=click.IntRange(min=1), default=None,
              help="With --megatron-lm: iterations per run (default 2, as CAPTURE's profiling runs).")
@click.option("--slurm", is_flag=True,
              help="With --megatron-lm, inside a Slurm allocation (salloc or a batch script): each run as srun "
                   "of one torchrun per node, for campaigns wider than a node.")
@click.option("--rdzv-port", type=click.IntRange(1, 65535), default=None,
              help="With --slurm: the c10d rendezvous port on the allocation's first node (default 29500).")
@click.argument("user_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- MEGATRON_ARGS...]")
def run_command(campaign: Path, out: Path, threads: int | None, memory_limit: float | None, megatron_lm: str | None,
                mock_data: bool, train_iters: int | None, slurm: bool, rdzv_port: int | None,
                user_args: tuple[str, ...]) -> None:
    """Execute a profiling campaign (from 'advisor profile plan'), resuming where it stopped.

    \b
    On a CPU every run is emulated stage by stage with real megatron-core
    modules (megatron_hooks.emulate, 1F1B order, two iterations), in a
    subprocess that imports torch and megatron-core once. With --megatron-lm,
    every run is a real Megatron-LM run on this node's GPUs instead: torchrun
    starts your pretrain_gpt.py with the run's flags and the hooks, and your
    arguments after '--' (data, tokenizer, --lr ...) go to every run; with
    --slurm, inside an allocation, runs span several nodes. Runs
    already complete under --out (every rank ended ok or oom) are skipped;
    partial ones are run again; an OOM is an outcome, not a failure.

    \b
    Examples:
      advisor profile plan --model llama3.2-1b --num-layers 8 --hidden-size 256 \\
          --ffn-hidden-size 1024 --num-attention-heads 4 --num-query-groups 2 --vocab-size 8192 \\
          --gpus 4 --gpus-per-node 1 --mode reduced --dtype float32 --no-distributed-optimizer \\
          --no-sequence-parallel --seq-len 512 --mbs 4 --gbs 16 -o campaign.json
      advisor profile run campaign.json --out runs/
      advisor recommend --profile runs/ --gpus 4 --pp 4 --mbs 4 --gbs 16
    \b
      advisor profile plan --gpus 8 --gpus-per-node 8 --mode reduced -o campaign.json
      advisor profile run campaign.json --out runs/ --megatron-lm ~/Megatron-LM --mock-data -- --lr 1e-4
      advisor profile plan --gpus 32 --gpus-per-node 8 --mode reduced -o wide.json
      salloc --nodes 4 --gpus-per-node 8 advisor profile run wide.json --out wide-runs/ \\
          --megatron-lm ~/Megatron-LM --slurm --mock-data -- --lr 1e-4
    """
    import sys

    from advisor.capture import progress
    from advisor.capture.campaign_run import prepare, scan
    from advisor.capture.relay import missing_modules, relay

    gpus = megatron_lm is not None
    if gpus and (threads or memory_limit):
        raise InputError("--threads and --memory-limit are the CPU emulator's; with --megatron-lm the GPUs decide")
    if not gpus and (mock_data or train_iters or slurm or rdzv_port or user_args):
        given = ("--mock-data" if mock_data else "--train-iters" if train_iters else "--slurm" if slurm
                 else "--rdzv-port" if rdzv_port else f"'{user_args[0]}'")
        raise InputError(f"{given} is for Megatron-LM runs: give --megatron-lm DIR (the CPU emulator takes no "
                         f"Megatron-LM arguments)")
    document = prepare(campaign, out, emulated=not gpus)
    scan(document, out)  # runs of another campaign under --out: refused before the runner starts
    if missing := missing_modules():
        raise InputError(f"advisor profile run needs torch and megatron-core, and {' and '.join(missing)} "
                         f"cannot be imported here: pip install torch && pip install -e '.[megatron]'")
    if gpus:
        options = ["--megatron-lm", megatron_lm, *(["--mock-data"] if mock_data else []),
                   *(["--train-iters", str(train_iters)] if train_iters else []), *(["--slurm"] if slurm else []),
                   *(["--rdzv-port", str(rdzv_port)] if rdzv_port else []), "--", *user_args]
    else:
        options = [*(["--threads", str(threads)] if threads else []),
                   *(["--memory-limit", repr(memory_limit)] if memory_limit else [])]
    try:
        status, summary, last = relay(campaign, out, options, progress.view(sys.stderr.isatty()), gpus=gpus)
    except KeyboardInterrupt:
        complete = sum(check.state == "complete" for check in scan(document, out).values())
        click.echo(f"interrupted: {complete} of {len(document['runs'])} runs are complete; run the same command "
                   f"to resume", err=True)
        sys.exit(130)
    _finish(status, summary, last, out)


def _finish(status: int, summary, last: str, out: Path) -> None:
    """The summary on stdout; a failure on stderr with the runner's exit status."""
    import sys

    if summary.finished:
        counts = summary.counts
        click.echo(f"{summary.runs} runs in {out}: {counts['ok']} ok, {counts['oom']} oom, {counts['error']} failed, "
                   f"{summary.skipped} already complete ({summary.seconds:.0f} s)")
    if status == 0:
        return
    if status == 2:  # the runner refused its input (what this command had not checked)
        raise InputError(last.rsplit(" | ", 1)[-1].removeprefix("Error: "))
    if status == 1 and summary.finished:
        first = summary.failed[0]
        click.echo(f"Error: {len(summary.failed)} run(s) failed, first {first['id']}: {first.get('error')} "
                   f"(run the same command to retry them)", err=True)
        sys.exit(1)
    how = f"signal {-status}" if status < 0 else f"exit status {status}"
    click.echo(f"Error: the campaign runner stopped ({how}) after {len(summary.done)} runs; run the same command "
               f"to resume (finished runs are kept). Its last words: {last or 'none'}", err=True)
    sys.exit(1)


# --- advisor recommend -------------------------------------------------------------------


@click.command("recommend", epilog=EPILOG)
@click.option("--profile", "profiles", multiple=True, required=True, type=click.Path(path_type=Path),
              help="A run directory (rank*.jsonl) or a directory of them; repeat for more.")
@click.option("--gpus", type=click.IntRange(min=1), required=True, help="GPUs of the target run.")
@click.option("--gpus-per-node", type=click.IntRange(min=1), default=8, show_default=True, help="K.")
@click.option("--mode", type=click.Choice(["megatron", "hybrid"]), default="megatron", show_default=True,
              help="megatron: uniform TP/CP/DP, uneven layers per stage (launchable); hybrid: CAPTURE's "
                   "per-stage DP/TP degrees (not launchable on stock Megatron).")
@click.option("--predictor", type=click.Choice(["1f1b", "capture"]), default="1f1b", show_default=True,
              help="1f1b: per-module terms by pipeline position; capture: CAPTURE's M_i/M_a as published.")
@click.option("--tp", type=click.IntRange(min=1), default=1, show_default=True, help="Megatron mode: TP.")
@click.option("--pp", type=click.IntRange(min=1), default=None, help="Megatron mode: pipeline stages (required).")
@click.option("--mbs", type=click.IntRange(min=1), default=1, show_default=True,
              help="Micro-batch size (Megatron's, per DP replica; in hybrid mode the pipeline microbatch).")
@click.option("--gbs", type=click.IntRange(min=1), default=1024, show_default=True, help="Global batch size.")
@click.option("--merge-to", type=click.IntRange(min=1), default=None,
              help="Merge layers to this many units first (CAPTURE's layer merger, Section III-A3).")
@click.option("--mem", type=click.FloatRange(min=0, min_open=True), default=None,
              help="GPU memory in GiB: drawn on the chart, and the plan's share of it shown.")
@click.option("--png", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Draw the per-GPU memory of the plan beside the even split (like CAPTURE's Fig. 6).")
@_document_options
def recommend_command(profiles, gpus, gpus_per_node, mode, predictor, tp, pp, mbs, gbs, merge_to, mem, png, fmt,
                      output) -> None:
    """Recommend the layers per stage (and, in hybrid mode, per-stage degrees) with the lowest
    predicted peak memory, from layer-by-layer profiles.

    \b
    The planner is exact: it minimises the peak over every plan in polynomial
    time, breaking ties as CAPTURE does (the next-highest GPU, and so on).

    \b
    Examples:
      advisor recommend --profile runs/ --gpus 16 --pp 4 --mbs 1 --gbs 64
      advisor recommend --profile runs/ --gpus 16 --gpus-per-node 4 --mode hybrid --mbs 8 \\
          --predictor capture -o plan.json --png plan.png
    """
    from advisor.capture.observations import load_profile_set
    from advisor.capture.recommend import recommend_hybrid, recommend_megatron

    if mode == "megatron" and pp is None:
        raise InputError("--mode megatron needs --pp (the number of pipeline stages)")
    if mode == "hybrid" and (pp is not None or tp != 1):
        raise InputError("--mode hybrid chooses TP, DP and PP per stage itself; drop --tp and --pp")
    profile_set = load_profile_set(profiles)
    common = dict(gpus=gpus, gpus_per_node=gpus_per_node, micro_batch_size=mbs, global_batch_size=gbs,
                  predictor=predictor, merge_to=merge_to)
    if mode == "megatron":
        plan = recommend_megatron(profile_set, tp=tp, pp=pp, **common)
    else:
        plan = recommend_hybrid(profile_set, **common)
    if png is not None:
        from advisor.capture.chart import draw

        draw(plan, png, mem)
        click.echo(f"wrote {png}", err=True)
    _emit(plan.to_dict(), _plan_table(plan, mem), fmt, output)


def _plan_table(plan, mem: float | None) -> str:
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
            "stage": stage.stage, "layers": f"{stage.first_layer}-{stage.last_layer}", "count": stage.layers,
            "tp": stage.tp, "dp": stage.dp, "gpus": f"{first}-{last}" if last > first else str(first),
            "in_flight": stage.in_flight_microbatches, "bytes": stage.predicted_bytes,
            "even": baseline.stage_bytes[stage.stage] if same else None,
        })
    columns = [render.Column("stage", "stage"), render.Column("layers", "layers"), render.Column("count", "#"),
               render.Column("tp", "TP"), render.Column("dp", "DP"), render.Column("gpus", "GPU ids"),
               render.Column("in_flight", "in flight"), render.Column("bytes", f"{unit} per GPU", ".2f", scale=size)]
    if same:
        columns.append(render.Column("even", "even split", ".2f", scale=size))
    peak = plan.peak_bytes
    caption = f"predicted peak {peak / size:.2f} {unit}"
    if mem:
        caption += f" ({peak / GIB / mem:.0%} of {mem:g} GiB)"
    if baseline:
        even = max(baseline.stage_bytes)
        change = (even - peak) / even
        caption += f"; {baseline.label}: {even / size:.2f} {unit} (this plan is {abs(change):.1%} " + \
            ("lower)" if change >= 0 else "higher)")
    caption += "; launchable on stock Megatron-LM" if plan.launchable else \
        "; NOT launchable on stock Megatron-LM (per-stage degrees)"
    degrees = f"TP {plan.tp}, CP {plan.cp}, DP {plan.dp}" if plan.tp else "per-stage TP/DP"
    title = (f"{plan.model.name}: {plan.mode} plan, {plan.gpus} GPUs, {degrees}, PP {plan.pp}, "
             f"MBS {plan.micro_batch_size}, {plan.num_microbatches} microbatches ({plan.predictor} predictor)")
    return render.to_table(rows, columns, title=title, caption=caption, color=color_wanted(None))
