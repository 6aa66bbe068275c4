"""``advisor profile show | plan | run``: layer-by-layer memory profiles of Megatron runs (schema:
advisor/profiles.py) and CAPTURE's profiling campaign (seed 000, Section III-A)."""

from __future__ import annotations

from pathlib import Path

import click

from advisor import limits
from advisor.render import Drawing
from advisor.cli.options import (
    DEGREE, EPILOG, GIB, GLOBAL_BATCH, GPUS, GPUS_PER_NODE, MEGATRON_CHECKOUT, MICRO_BATCH, PER_NODE_FLAG, TRAIN_ITERS,
    SEQ_LEN, SEQ_LEN_HELP, TCP_PORT, Bounded, CloseCommands, InputError, InputPath, NonEmpty, OutDirectory,
    apply_options, drawing_for, document_options, emit, emit_document, model_options, note, output_options,
    parse_numbers,
)
from advisor.cli.training_flags import NO_BIAS_SWIGLU_FUSION, on_unlike_megatron

SECTIONS = ("ranks", "layers", "compare")
MOE_LAYER_FILE = "moe_layer.json"  # advisor.moe.layer_profile.FILENAME, without importing it at start-up


class ProfileCommands(CloseCommands):
    """``advisor profile``'s commands; a section of ``show`` given as a command ('advisor profile
    compare runs/': the brief of an audit called it one) names the command that has it."""

    def resolve_command(self, ctx: click.Context, args: list[str]):
        if args and args[0] in SECTIONS and args[0] not in self.list_commands(ctx):
            where = args[1] if len(args) > 1 and not args[1].startswith("-") else "DIR"
            raise click.UsageError(f"No such command '{args[0]}'; the {args[0]} table is a section of show: "
                                   f"advisor profile show {where} --section {args[0]}", ctx)
        return super().resolve_command(ctx, args)


@click.group(cls=ProfileCommands, context_settings={"help_option_names": ["-h", "--help"]})
def profile() -> None:
    """Plan, run and read layer-by-layer memory profiles of Megatron runs.

    A profile is a run directory of one JSON Lines file per rank (rank00000.jsonl, ...),
    written by the advisor's memory hooks in Megatron: the run's model and layout, then per
    module and iteration its weights, gradients, optimizer share and kept activations in
    bytes, its transient forward/backward peaks and times, and each iteration's peak memory
    (the schema: docs/profiling.md).

    \b
    Examples:
      advisor profile plan --gpus 16 --gpus-per-node 4 --mode reduced \\
          -o campaign.json
      advisor profile run campaign.json --out runs/ --backend symbolic
      advisor profile show runs/
      advisor recommend --profile runs/ --gpus 64 --pp 4 --mbs 1 --gbs 512
    """


@profile.command(epilog=EPILOG)
@click.argument("directory", type=InputPath(path_type=Path))
@click.option("--section", type=click.Choice(("all", *SECTIONS)), default="all", show_default=True,
              help="ranks: one row per rank; layers: one row per module; compare: measured / the 4D paper's terms.")
@click.option("--rank", "ranks", type=int, multiple=True, metavar="N", help="Only these ranks (repeatable).")
@click.option("--iteration", type=Bounded(limits.ITERATION), default=None,
              help="Which recorded iteration to show per layer (default: the last).")
@output_options
def show(directory: Path, section: str, ranks: tuple[int, ...], iteration: int | None, fmt: str,
         output: Path | None) -> None:
    """Summarise a profile run directory (or each run of a campaign's --out): per rank, per
    layer, and against the 4D paper's terms. A run lacking some ranks' files (some stages only,
    or a rank that never started) shows as partial, naming them; recommend --profile refuses it.

    \b
    ranks    peak allocated (and reserved, allocator retries on CUDA), static
             memory, status
    layers   per module: weights, gradients, optimizer share, activations kept
             for backward by one microbatch, transient forward/backward peaks
    compare  each measured term / the 4D paper's analytical one for this
             run's model, layout and dtype: Eq. 6-9 (weights), Eq. 12/15 (a
             layer's activations), Eq. 13 (embedding), Eq. 14 (LM head), Eq.
             16-17 (activations in flight), Eq. 18 (peak); where a known
             difference of the run explains a ratio (FP32 weights, the CPU's
             kernels, the token ids, the TE layer), a note under the table and
             the ratio its hand count predicts (expected); for a symbolic MoE
             layer (DIR/moe_layer.json, python -m megatron_hooks.moe_layer
             --out DIR): each MoE term of the estimate / its measured part, and
             a note where the layer was not built as those terms price it (the
             TE spec, CUDA)

    \b
    Examples:
      advisor profile show runs/tp2
      advisor profile show runs/tp2 --section compare --rank 0 --format csv
      advisor profile show runs/         # every run of a campaign's --out
    """
    from advisor import render
    from advisor.capture.observations import run_directories
    from advisor.profiles import load_run

    if (directory / MOE_LAYER_FILE).is_file():
        emit(_show_moe_layer(directory, section, fmt, drawing_for(output)), output)
        return
    if fmt == "csv" and section == "all":
        raise InputError("--format csv needs one --section (ranks, layers or compare)")
    # a run directory, or a campaign's --out holding one directory per run (as recommend --profile takes)
    directories = run_directories([directory])
    titled = [_show_run(load_run(path), section, ranks, iteration) for path in directories]
    shown = [doc for _, doc in titled]
    if fmt == "json":
        text = render.to_json(shown[0] if len(shown) == 1 and directories[0] == directory else {"runs": shown})
    elif fmt == "csv":
        text = _csv(shown, section, single=len(shown) == 1 and directories[0] == directory)
    else:
        first = _sections(section)[0]
        text = "\n".join(_table(name, doc[name], title if name == first else None, drawing_for(output),
                                 doc.get("compare_reasons"))
                          for title, doc in titled for name in _sections(section))
    emit(text, output)


def _csv(shown: list[dict], section: str, single: bool) -> str:
    """One section of every run as CSV (a campaign's rows say their run, ``run_id``); its header
    even where no rank recorded an iteration. A partial run (ranks without a file), which a CSV
    cannot say, is said on stderr."""
    from advisor import render
    from advisor.profile_report import COMPARE_COLUMNS, LAYER_COLUMNS

    for doc in shown:
        if doc["missing_ranks"]:
            click.echo(f"advisor profile show: run {doc['run']['run_id']}: {doc['status']}, {doc['missing']}",
                       err=True)
    columns = {"layers": LAYER_COLUMNS, "compare": COMPARE_COLUMNS}.get(section, ())
    return render.to_csv([row if single else {"run_id": doc["run"]["run_id"], **row}
                          for doc in shown for row in doc[section]],
                         columns=columns if single else ("run_id", *columns))


def _show_moe_layer(directory: Path, section: str, fmt: str, drawing: Drawing) -> str:
    """A symbolic MoE layer profile (``advisor/moe/layer_profile.py``): each analytic term of
    advisor.moe beside the measured part it prices."""
    from advisor import render
    from advisor.errors import AdvisorError
    from advisor.moe import layer_profile

    if section not in ("all", "compare"):
        raise InputError(f"{directory / MOE_LAYER_FILE} is one MoE layer: it has the compare section only")
    try:
        profile = layer_profile.load(directory)
    except AdvisorError as exc:
        raise InputError(str(exc)) from None
    rows = layer_profile.compare(profile)
    note = layer_profile.build_note(profile)  # a layer not built as the terms price it: said, not a bare ratio
    if fmt == "json":
        return render.to_json({"moe_layer": profile.to_dict(), "compare": rows,
                               "build_note": note and note.to_dict()})
    if fmt == "csv":
        return render.to_csv(rows)
    columns = [render.Column("term", "term", justify="left"),  # MiB: a layer's terms are tens to thousands
               render.Column("analytic_bytes", "analytic MiB", ".2f", scale=2**20),
               render.Column("measured_bytes", "measured MiB", ".2f", scale=2**20),
               render.Column("ratio", "measured/analytic", ".3f"),
               render.Column("analytic", "advisor/moe function", justify="left", drop=1)]
    degrees = "".join(f"{name} {value}, " for name, value in (("TP", profile.tp), ("EP", profile.ep),
                                                              ("ETP", profile.etp)) if value > 1 or name == "EP")
    dropping = "" if profile.capacity_factor is None else f", capacity {profile.capacity_factor:g} (padded)"
    title = (f"{profile.model.name}: one MoE layer, sequence {profile.seq_len}, MBS {profile.mbs}, {degrees}"
             f"{profile.dispatcher} dispatcher{dropping}, BF16, {profile.backend}")
    routing = "balanced" if profile.capacity_factor is None else "capacity"
    caption = (f"analytic: advisor/moe (memory.py, transient.py, params.py), {routing} routing; differences term "
               "by term: docs/profiling.md")
    return render.to_table(rows, columns, title=title, drawing=drawing,
                           caption=caption if note is None else f"{caption}\nnote: {note.text}")


def _sections(section: str) -> tuple[str, ...]:
    return SECTIONS if section == "all" else (section,)


def _show_run(run, section: str, ranks: tuple[int, ...], iteration: int | None) -> tuple[str, dict]:
    """One run's title and document for ``profile show``: its header, status and the chosen sections."""
    from advisor.profile_report import (compare_rank, layer_rows, missing_text, rank_summary, run_description,
                                        reasons_used, run_status, stopped_early_text)

    profiles = [rank for rank in run.ranks if not ranks or rank.header.rank in ranks]
    if not profiles:
        raise InputError(f"no rank {', '.join(map(str, ranks))} in {run.directory}")
    for rank in profiles:
        known = {it.iteration for it in rank.iterations}
        if iteration is not None and iteration not in known:
            first, last = min(known, default=None), max(known, default=None)
            has = ("none" if first is None else f"{first} to {last}" if len(known) == last - first + 1
                   else ", ".join(map(str, sorted(known))))
            raise InputError(f"rank {rank.header.rank} recorded no iteration {iteration} (it has {has})")
    compared = [row for rank in profiles for row in compare_rank(rank, iteration)] if "compare" in _sections(
        section) else []
    tables = {
        "ranks": [rank_summary(rank) for rank in profiles],
        "layers": [row for rank in profiles for row in layer_rows(rank, iteration)],
        "compare": [row.to_dict() for row in compared],
    }
    return run_description(run), {"run": run.header.to_dict(), "status": run_status(run),
                                  "missing_ranks": list(run.missing_ranks), "missing": missing_text(run),
                                  "stopped_early": stopped_early_text(run),
                                  **{name: tables[name] for name in _sections(section)},
                                  # each reason the compare rows name: its text and source (profile_reasons)
                                  **({"compare_reasons": reasons_used(compared)} if "compare" in _sections(section)
                                     else {})}


def _table(name: str, rows: list[dict], title: str | None, drawing: Drawing, reasons: dict[str, dict] | None = None
           ) -> str:
    from advisor.render import Column, byte_unit, to_table

    def byte_columns(keys_and_headers, drops=None):
        unit, size = byte_unit(row[key] for row in rows for key, _ in keys_and_headers)
        return [Column(key, f"{header} {unit}", ".2f", scale=size, drop=(drops or {}).get(key, 0))
                for key, header in keys_and_headers]

    if name == "ranks":
        # the rank's coordinates in the mesh, not the degrees: named as Megatron's parallel_state names them
        columns = [Column("rank", "rank"), Column("tp_rank", "tp_rank"), Column("cp_rank", "cp_rank"),
                   Column("pp_rank", "pp_rank"), Column("dp_rank", "dp_rank"), Column("layers", "layers"),
                   Column("in_flight_microbatches", "in flight", drop=2), Column("num_microbatches", "m", drop=2),
                   *byte_columns([("static_bytes", "static"), ("peak_allocated_bytes", "peak alloc."),
                                  ("peak_reserved_bytes", "peak reserved")],
                                 {"static_bytes": 1, "peak_allocated_bytes": -1, "peak_reserved_bytes": 3}),
                   Column("alloc_retries", "retries", drop=3), Column("status", "status", justify="left", drop=-1)]
        caption = "; ".join(f"rank {row['rank']}: {row['where']}" for row in rows if row["where"]) or None
        return to_table(rows, columns, title=title, caption=caption, drawing=drawing)
    if name == "layers":
        columns = [Column("rank", "rank"), Column("module", "module", justify="left"),
                   Column("layer_number", "layer"),
                   *byte_columns([("parameter_bytes", "weights"), ("gradient_bytes", "grads"),
                                  ("optimizer_bytes", "optimizer"), ("activation_bytes", "act./mb"),
                                  ("forward_peak_bytes", "fwd peak"), ("backward_peak_bytes", "bwd peak")])]
        return to_table(rows, columns, title=title, drawing=drawing)
    return _compare_table(rows, reasons or {}, title, drawing, byte_columns)


def _compare_table(rows: list[dict], reasons: dict[str, dict], title: str | None, drawing: Drawing, byte_columns
                   ) -> str:
    """The compare section: each ratio, the ratio its known reasons predict (``expected``), and
    those reasons under the table, one note per term they explain (``advisor.profile_reasons``: a
    bare 0.667 or 1.36 read as an error of the estimate where it is a known difference, audit)."""
    from advisor.render import Column, to_table

    # the ratio is what this section is for: the equation's name goes first (at 100 columns the
    # ratio, rightmost, went and left two columns of bytes to divide by hand, audit), then the
    # estimate, then the measurement (the layers section has it too)
    columns = [Column("rank", "rank"), Column("module", "module", justify="left"),
               Column("term", "term", justify="left"), Column("equation", "4D paper", justify="left", drop=3),
               *byte_columns([("measured_bytes", "measured"), ("estimated_bytes", "estimate")],
                             {"measured_bytes": 1, "estimated_bytes": 2}),
               Column("ratio", "ratio", ".3f"), Column("expected_ratio", "expected", ".3f")]
    caption = ("ratio: measured / estimate, the 4D paper's for this run's model, layout, sequence, micro-batch and "
               "dtype: Eq. 6-9 weights, Eq. 4 gradients, Eq. 10 optimizer, Eq. 12/15 a layer's activations, Eq. 13 "
               "embedding, Eq. 14 output, Eq. 16-17 in flight, Eq. 18 peak")
    if notes := _compare_notes(rows, reasons):
        caption += ("\nexpected: the ratio that the known reasons below predict (their hand counts; - where "
                    "none applies or none has one); sources: --format json, compare_reasons\n" + "\n".join(notes))
    return to_table(rows, columns, title=title, drawing=drawing, caption=caption)


def _compare_notes(rows: list[dict], reasons: dict[str, dict]) -> list[str]:
    """One line per term that known reasons explain ('layer activations: ...'), each reason's
    text once; the activations in flight sum the modules' (Eq. 16-17), so they point back."""
    by_label: dict[str, list[str]] = {}
    for row in rows:
        if not row["reasons"]:
            continue
        module = row["module"]
        kind = "layer" if module.startswith("decoder.") else "" if module == "stage" else module
        label = f"{kind} {row['term']}".strip()
        keys = by_label.setdefault(label, [])
        keys += [key for key in row["reasons"] if key not in keys]
    grouped: dict[tuple[str, ...], list[str]] = {}  # terms with the same reasons share their note
    for label, keys in by_label.items():
        if label != "activations in flight":
            grouped.setdefault(tuple(keys), []).append(label)
    notes = [f"{', '.join(labels)}: " + "; ".join(reasons[key]["text"] for key in keys)
             for keys, labels in grouped.items()]
    if "activations in flight" in by_label:
        notes.append("activations in flight: the modules' activations above, as 1F1B holds them")
    return notes


# --- advisor profile plan ----------------------------------------------------------------


@profile.command("plan", epilog=EPILOG)
@model_options
@click.option("--gpus", type=GPUS, required=True, help="GPUs the profiling runs may use (G).")
@click.option("--gpus-per-node", type=GPUS_PER_NODE, default=8, show_default=True,
              help="GPUs per node, K: the DP and TP runs' sub-meshes (2 and 4 GPUs) stay inside one node. "
                   + PER_NODE_FLAG)
@click.option("--seq-len", type=SEQ_LEN, default=8192, show_default=True, help=SEQ_LEN_HELP)
@click.option("--mbs", type=MICRO_BATCH, default=1, show_default=True,
              help="Target micro-batch: sequences per microbatch entering the pipeline.")
@click.option("--gbs", type=GLOBAL_BATCH, default=1024, show_default=True, help="Target global batch.")
@click.option("--mode", type=click.Choice(["full", "reduced"]), default="full", show_default=True,
              help="full: CAPTURE's Description 1 (about 10 L runs); reduced: 3 partitionings per scenario "
                   "and batch, for the 1F1B-aware predictor.")
@click.option("--fractions", default="0.5,0.25", show_default=True, metavar="F1,F2",
              help="The two fractions of the target microbatch to profile at.")
@click.option("--cp", type=DEGREE, default=1, show_default=True,
              help="Context parallel size of every run (and of the target).")
@click.option("--microbatches", type=Bounded(limits.PROFILING_MICROBATCHES), default=None,
              help="Microbatches per profiling run (default: min(stages, target's)).")
@click.option("--units", type=NonEmpty("give the layers of each merged unit, summing to the model's layers"), default=None,
              metavar="N,N,...",
              help="Layers per merged unit for the DP/TP runs (CAPTURE's layer merger, Section III-A3).")
@click.option("--dtype", type=click.Choice(["bfloat16", "float16", "float32"]), default="bfloat16",
              show_default=True, help="Dtype of weights and activations (Megatron's --bf16 / --fp16 / neither).")
@click.option("--distributed-optimizer/--no-distributed-optimizer", default=True, show_default=True,
              help="Megatron's --use-distributed-optimizer in every run (the CPU emulator runs without it). "
                   + on_unlike_megatron())
@click.option("--sequence-parallel/--no-sequence-parallel", default=True, show_default=True,
              help="--sequence-parallel in the TP runs (the CPU emulator runs without it). "
                   + on_unlike_megatron())
@click.option("--ep", type=DEGREE, default=None,
              help="Mixture of experts: every run's expert-parallel size (default 1; the runs carry EP and ETP, "
                   "'advisor profile run' refuses them yet).")
@click.option("--etp", type=DEGREE, default=None,
              help="Mixture of experts: every run's expert tensor-parallel size (default 1, written on every run, "
                   "whose TP varies by scenario; Megatron's own default would be each run's TP).")
@NO_BIAS_SWIGLU_FUSION
@document_options
def plan_command(spec, gpus, gpus_per_node, seq_len, mbs, gbs, mode, fractions, cp, microbatches, units, dtype,
                 distributed_optimizer, sequence_parallel, ep, etp, no_bias_swiglu_fusion, fmt, output) -> None:
    """Plan CAPTURE's profiling runs (its paper's Section III-A) as Megatron runs.

    \b
    Scenarios: pipeline-only on G GPUs, and 2- and 4-way DP and TP on sub-meshes
    of a node (G/K stages), each at two microbatches (a half and a quarter of
    --mbs, rounded up to what the scenario can run). Each run is a partitioning
    of the layers over the stages, with its Megatron-LM flags and a stable id.

    \b
    Examples:
      advisor profile plan --gpus 16 --gpus-per-node 4 --mbs 8
      advisor profile plan --gpus 16 --gpus-per-node 4 --mode reduced \\
          -o campaign.json
      advisor profile plan --gpus 4 --gpus-per-node 4 --model llama3.2-1b \\
          --format json
      advisor profile plan --gpus 4 --gpus-per-node 1 --mode reduced \\
          --dtype float32 --no-distributed-optimizer --no-sequence-parallel \\
          -o campaign.json   # for the CPU emulator
    """
    from advisor import render
    from advisor.capture.campaign import plan_campaign
    from advisor.megatron_args import MegatronSetup

    campaign = plan_campaign(
        spec, gpus=gpus, gpus_per_node=gpus_per_node, seq_len=seq_len, micro_batch_size=mbs, global_batch_size=gbs,
        mode=mode, fractions=parse_numbers(fractions, float, "--fractions"), cp=cp, num_microbatches=microbatches,
        units=parse_numbers(units, int, "--units") if units else None,
        setup=MegatronSetup(params_dtype=dtype, distributed_optimizer=distributed_optimizer,
                            sequence_parallel=sequence_parallel, bias_swiglu_fusion=not no_bias_swiglu_fusion),
        ep=ep, etp=etp,
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
        title=f"{spec.name}: {mode} profiling campaign, {len(rows)} runs on {gpus} GPUs ({gpus_per_node} per node)"
              + (", --no-bias-swiglu-fusion" if no_bias_swiglu_fusion else ""),  # the table shows no flags
        caption=caption, drawing=drawing_for(None),  # emit_document: --output takes the JSON
    )
    emit_document(campaign.to_dict(), table, fmt, output)


# --- advisor profile run -----------------------------------------------------------------


def run_options(func):
    """CAMPAIGN, --out, --backend, --layer-spec, --threads, --memory-limit: shared by 'advisor
    profile run' and the runner it starts (python -m megatron_hooks.campaign_runner), which
    receives them unchanged."""
    return apply_options([
        click.argument("campaign", type=InputPath(dir_okay=False, path_type=Path)),
        click.option("--out", required=True, type=OutDirectory(hint="give the directory for the runs", path_type=Path),
                     help="Directory for the runs: OUT/<run id>/rank*.jsonl (what 'advisor recommend --profile' "
                          "reads)."),
        click.option("--backend", type=click.Choice(["cpu", "symbolic"]), default="cpu", show_default=True,
                     help="Without --megatron-lm: cpu emulates each stage with real tensors (small models); "
                          "symbolic runs megatron-core on fake tensors, at the real model size, in seconds, as a "
                          "GPU rank would hold it (the CUDA kernels stood in for)."),
        click.option("--layer-spec", type=click.Choice(["transformer_engine", "local"]), default=None,
                     help="--backend symbolic: the layer spec of the run to stand for (default transformer_engine, "
                          "Megatron-LM's --transformer-impl; local: megatron-core's own modules)."),
        click.option("--threads", type=Bounded(limits.threads()), default=None,
                     help="Intra-op threads per emulated GPU (default: OMP_NUM_THREADS where set, else "
                          "cores / (TP x DP))."),
        click.option("--memory-limit", type=GIB, default=None, metavar="GIB",
                     help="Memory of each emulated GPU in GiB: a rank that needs more ends OOM, which is recorded "
                          "as the run's outcome (default: no limit)."),
    ], func)


def megatron_options(func):
    """--megatron-lm, --mock-data, --train-iters, --slurm, --rdzv-port: shared by 'advisor profile
    run' and the GPU runner it starts (python -m launch.campaign_runner, advisor.cli.runners),
    which receives them unchanged."""
    return apply_options([
        click.option("--megatron-lm", type=MEGATRON_CHECKOUT, metavar="DIR", default=None,
                     help="Run on this node's GPUs: each run through torchrun and your Megatron-LM checkout's "
                          "pretrain_gpt.py, with the hooks (advisor-launch's entry). Without it, emulate on the "
                          "CPU."),
        click.option("--mock-data", is_flag=True,
                     help="With --megatron-lm: Megatron-LM's mock data, with a NullTokenizer sized to the model."),
        click.option("--train-iters", type=TRAIN_ITERS, default=None,
                     help="With --megatron-lm: iterations per run (default 2, as CAPTURE's profiling runs)."),
        click.option("--slurm", is_flag=True,
                     help="With --megatron-lm, inside a Slurm allocation (salloc or a batch script): each run as "
                          "srun of one torchrun per node, for campaigns wider than a node."),
        click.option("--rdzv-port", type=TCP_PORT, default=None,
                     help="With --slurm: the c10d rendezvous port on the allocation's first node (default 29500)."),
    ], func)


RUN_HELP = """Execute a profiling campaign (from 'advisor profile plan'), resuming where it stopped.

On a CPU every run is emulated stage by stage with real megatron-core modules (its
microbatches in 1F1B order, two iterations), in a subprocess that imports torch and
megatron-core once. Before it starts, the command says what the runs will cost (time and memory,
from their shapes) and refuses, with every other incompatibility, what cannot finish on this
machine (over an hour, or more memory than is available) unless --force is given.

With --backend symbolic, no GPU and any model size: every rank of every run is profiled on fake
tensors with megatron-core's real modules and optimizer, the CUDA kernels stood in for;
--memory-limit then predicts which runs would run out of memory.

With --megatron-lm, every run is a real Megatron-LM run on this node's GPUs instead: torchrun
starts your pretrain_gpt.py with the run's flags and the hooks, and your arguments after '--'
(data, tokenizer, --lr ...) go to every run; with --slurm, inside an allocation, runs span
several nodes.

Runs already complete under --out (every rank ended ok or oom) are skipped; partial ones are run
again; an OOM is an outcome, not a failure.

\b
On the CPU, a small model:
  advisor profile plan --model llama3.2-1b --num-layers 8 \\
      --hidden-size 256 --ffn-hidden-size 1024 --num-attention-heads 4 \\
      --num-query-groups 2 --vocab-size 8192 --gpus 4 --gpus-per-node 1 \\
      --mode reduced --dtype float32 --no-distributed-optimizer \\
      --no-sequence-parallel --seq-len 512 --mbs 4 --gbs 16 -o campaign.json
  advisor profile run campaign.json --out runs/
  advisor recommend --profile runs/ --gpus 4 --pp 4 --mbs 4 --gbs 16

\b
At real size, on fake tensors:
  advisor profile plan --gpus 16 --gpus-per-node 4 --mode reduced \\
      -o real.json
  advisor profile run real.json --out real-runs/ --backend symbolic
  advisor recommend --profile real-runs/ --gpus 64 --pp 4 --mbs 1 --gbs 512

\b
On GPUs, with your Megatron-LM checkout (one node; several, inside salloc):
  advisor profile plan --gpus 8 --gpus-per-node 8 --mode reduced -o gpu.json
  advisor profile run gpu.json --out runs/ --megatron-lm ~/Megatron-LM \\
      --mock-data -- --lr 1e-4
  advisor profile plan --gpus 32 --gpus-per-node 8 --mode reduced \\
      -o wide.json
  salloc --nodes 4 --gpus-per-node 8 advisor profile run wide.json \\
      --out wide-runs/ --megatron-lm ~/Megatron-LM --slurm --mock-data \\
      -- --lr 1e-4
"""
"""advisor profile run --help (here, not in the docstring: the function stays within 80 lines)."""


@profile.command("run", epilog=EPILOG, help=RUN_HELP)
@run_options
@megatron_options
@click.option("--slurm-array", is_flag=True,
              help="With --megatron-lm: submit the campaign as one Slurm job array, one task per run not yet "
                   "complete under --out (submit again to resume: complete runs are skipped, killed ones redone).")
@click.option("--partition", default=None, help="With --slurm-array: #SBATCH --partition.")
@click.option("--account", default=None, help="With --slurm-array: #SBATCH --account.")
@click.option("--time", "time_limit", default=None, help="With --slurm-array: #SBATCH --time of each task.")
@click.option("--qos", default=None, help="With --slurm-array: #SBATCH --qos.")
@click.option("--dry-run", is_flag=True, help="With --slurm-array: print the batch script, submit nothing.")
@click.option("--force", is_flag=True,
              help="CPU emulator: run a campaign even if it is estimated to take more than "
                   f"{limits.CPU_EMULATION_SECONDS / 3600:g} h or more memory than this machine has available.")
@click.argument("user_args", nargs=-1, type=click.UNPROCESSED, metavar="[-- MEGATRON_ARGS...]")
def run_command(campaign: Path, out: Path, backend: str, layer_spec: str | None, threads: int | None,
                memory_limit: float | None, megatron_lm: str | None, mock_data: bool, train_iters: int | None,
                slurm: bool, rdzv_port: int | None, slurm_array: bool, partition: str | None, account: str | None,
                time_limit: str | None, qos: str | None, dry_run: bool, force: bool,
                user_args: tuple[str, ...]) -> None:
    """``advisor profile run``: ``RUN_HELP`` says what it does."""
    import signal
    import sys

    from advisor.cli import progress
    from advisor.capture.campaign_run import EmulationBudget, backend_fields, prepare, scan
    from advisor.capture.relay import Terminated, relay
    from advisor.limits import GIB as GIB_BYTES

    gpus = megatron_lm is not None
    _check_backend_flags(gpus, backend, threads, memory_limit, layer_spec,
                         mock_data=mock_data, train_iters=train_iters, slurm=slurm, rdzv_port=rdzv_port,
                         user_args=user_args)
    array = {"--partition": partition, "--account": account, "--time": time_limit, "--qos": qos,
             "--dry-run": dry_run or None}
    if _slurm_array(slurm_array, array, gpus and not slurm):
        _submit_array(campaign, out, megatron_lm, mock_data, train_iters, rdzv_port, array, user_args)
        return
    emulated = not gpus and backend == "cpu"
    budget = EmulationBudget(threads=threads, memory_limit_bytes=memory_limit and memory_limit * GIB_BYTES)
    document = prepare(campaign, out, backend="megatron" if gpus else backend, layer_spec=layer_spec,
                       budget=budget if emulated and not force else None)
    if not gpus and (line := _eager_swiglu_note(document, backend_fields(backend, layer_spec))):
        click.echo(line, err=True)
    # runs of another campaign, setup or backend under --out: refused before the runner starts
    scan(document, out, backend_fields("megatron" if gpus else backend, layer_spec, user_args))
    _before_start(document, out, megatron_lm, budget if emulated else None)
    options = (["--megatron-lm", megatron_lm, *(["--mock-data"] if mock_data else []),
                *(["--train-iters", str(train_iters)] if train_iters else []), *(["--slurm"] if slurm else []),
                *(["--rdzv-port", str(rdzv_port)] if rdzv_port else []), "--", *user_args] if gpus
               else _emulator_options(backend, layer_spec, threads, memory_limit))
    try:
        status, summary, last = relay(campaign, out, options, progress.view(sys.stderr.isatty()), gpus=gpus)
    except KeyboardInterrupt as stop:
        complete = sum(check.state == "complete" for check in scan(document, out).values())
        click.echo(f"interrupted: {complete} of {len(document['runs'])} runs are complete; run the same command "
                   f"to resume", err=True)
        sys.exit(128 + (stop.args[0] if isinstance(stop, Terminated) else signal.SIGINT))
    _finish(status, summary, last, out)


def _eager_swiglu_note(document: dict, made_by: dict) -> str | None:
    """One line where the campaign asks for the eager SwiGLU (setup ``bias_swiglu_fusion`` false)
    and the backend's stages build the local spec's eager SwiGLU whatever is asked
    (``observations.swiglu_as_asked``): their profiles stand for Megatron-LM's fused default
    (``stands_for_swiglu_fusion``), so a plan from them launches the fused SwiGLU."""
    from advisor.capture.observations import swiglu_as_asked

    if document.get("setup", {}).get("bias_swiglu_fusion", True) is not False \
            or swiglu_as_asked(made_by["emulated"], made_by["layer_spec"]):
        return None
    return ("note: the campaign asks for the eager SwiGLU (bias_swiglu_fusion false), but this backend's local "
            "spec runs it whatever is asked, and its profiles stand for Megatron-LM's fused default: a plan from "
            "them launches the fused SwiGLU; to profile the eager one as asked, use --backend symbolic "
            "--layer-spec transformer_engine (its default) or --megatron-lm DIR")


def _check_backend_flags(gpus: bool, backend: str, threads: int | None, memory_limit: float | None,
                         layer_spec: str | None, *, mock_data: bool, train_iters: int | None, slurm: bool,
                         rdzv_port: int | None, user_args: tuple[str, ...]) -> None:
    """One line (InputError) for a flag of one backend given to another."""
    if gpus and (threads or memory_limit):
        raise InputError("--threads and --memory-limit are the CPU emulator's; with --megatron-lm the GPUs decide")
    if gpus and backend != "cpu":
        raise InputError("--backend symbolic profiles without GPUs; with --megatron-lm your Megatron-LM runs on them")
    if backend == "symbolic" and threads:
        raise InputError("--threads is the CPU backend's; the symbolic backend computes nothing")
    if backend != "symbolic" and layer_spec:
        raise InputError("--layer-spec is the symbolic backend's (the CPU backend runs the local spec; with "
                         "--megatron-lm your arguments decide)")
    if not gpus and (mock_data or train_iters or slurm or rdzv_port or user_args):
        given = ("--mock-data" if mock_data else "--train-iters" if train_iters else "--slurm" if slurm
                 else "--rdzv-port" if rdzv_port else f"'{user_args[0]}'")
        raise InputError(f"{given} is for Megatron-LM runs: give --megatron-lm DIR (the CPU emulator takes no "
                         f"Megatron-LM arguments)")


def _before_start(document: dict, out: Path, megatron_lm: str | None, budget) -> None:
    """One line (exit status 2) without torch and megatron-core; with the CPU emulator's
    ``budget``, the line that says what its runs will cost."""
    from advisor.capture.relay import missing_modules

    if missing := missing_modules(megatron_lm):
        raise InputError(f"advisor profile run needs torch and megatron-core, and {' and '.join(missing)} "
                         f"cannot be imported here: pip install torch && pip install -e '.[megatron]'")
    if budget is not None and (cost := budget.cost(document, out)).runs:
        note(f"advisor profile run: {cost.summary()}")


def _slurm_array(slurm_array: bool, array: dict, megatron_without_slurm: bool) -> bool:
    """Whether to submit a job array; one line for its flags without --slurm-array, or for
    --slurm-array without --megatron-lm or with --slurm."""
    if not slurm_array and (given := next((name for name, value in array.items() if value is not None), None)):
        raise InputError(f"{given} is for --slurm-array")
    if slurm_array and not megatron_without_slurm:
        raise InputError("--slurm-array submits Megatron-LM runs from a login node: give --megatron-lm DIR, "
                         "without --slurm (each array task runs inside its own allocation)")
    return slurm_array


def _emulator_options(backend: str, layer_spec: str | None, threads: int | None, memory_limit: float | None
                      ) -> list[str]:
    """The campaign runner's flags for the CPU or symbolic backend."""
    return ["--backend", backend, *(["--layer-spec", layer_spec] if layer_spec else []),
            *(["--threads", str(threads)] if threads else []),
            *(["--memory-limit", repr(memory_limit)] if memory_limit else [])]


def _submit_array(campaign: Path, out: Path, megatron_lm: str, mock_data: bool, train_iters: int | None,
                  rdzv_port: int | None, array: dict, user_args: tuple[str, ...]) -> None:
    """``python -m launch.slurm_array`` (the job array's writer, on the launch side) with this
    interpreter; its output (the script, or sbatch's answer) is the command's, its exit status too."""
    import subprocess
    import sys

    from advisor.capture.relay import LAUNCH_ARRAY_MODULE

    options = [*(["--mock-data"] if mock_data else []), *(["--train-iters", str(train_iters)] if train_iters else []),
               *(["--rdzv-port", str(rdzv_port)] if rdzv_port else []),
               *[item for name, value in array.items() if value
                 for item in ([name] if value is True else [name, value])]]
    result = subprocess.run([sys.executable, "-m", LAUNCH_ARRAY_MODULE, str(campaign), "--out", str(out),
                             "--megatron-lm", megatron_lm, *options, "--", *user_args], capture_output=True, text=True)
    click.echo(result.stdout, nl=False)
    click.echo(result.stderr, nl=False, err=True)
    sys.exit(result.returncode)


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
