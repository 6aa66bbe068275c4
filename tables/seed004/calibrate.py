"""``python -m tables.seed004.calibrate``: fit the advisor's constants and write advisor/calibration.json.

    python -m tables.seed004.calibrate                 # fit on all 454 runs, write advisor/calibration.json
    python -m tables.seed004.calibrate --on A100-40GB  # fit on one GPU type's runs only
    python -m tables.seed004.calibrate --check         # exit 1 if the file differs from a fresh fit
    python -m tables.seed004.calibrate probe           # refit the kernel constants from the H100 probe

The shipped file is fitted on both GPU types (the most data). The validation in
``python -m tables.seed004`` never uses it: it fits each direction on one GPU type and reports on
the other (``tables/seed004/validation.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import numpy as np
from scipy.optimize import least_squares

from advisor.cli.options import OneLineGroup
from advisor.fileio import atomic_write_text, read_json
from advisor.render import to_json
from advisor.throughput.calibration import CALIBRATION_FILE, calibration_document
from tables.seed004 import timing, validation
from tables.seed004.results import analyse

GPU_TYPES = ("all", "A100-40GB", "H100-94GB")


def fitted_document(on: str = "all") -> dict:
    """The constants fitted on ``on``'s runs, with the procedure choices made the validation's way
    (``validation.fit_on``: leave one table out) on the same runs; the choices are recorded in the
    time section's notes."""
    measured = [t for t in analyse().measured if on == "all" or t.paper.gpu == on]
    label = "all 454 runs of seed 004 (A100 and H100)" if on == "all" else f"the {on} runs of seed 004"
    fit = validation.fit_on(measured, label)
    notes = {"memory_tie_break": fit.tie_break, "rank_by_selected": fit.rank_by,
             "selected_by": "leave one table out on the same runs (tables/seed004/validation.py, fit_on)"}
    # the ranking's tolerance is a statistic of the held-out validation (never of this fit's own runs)
    ranking = validation.validate(analyse().measured).tolerance if on == "all" else None
    return calibration_document(fit.time.with_values(notes=notes), fit.memory, ranking)


def probe_fit(path: Path = timing.PROBE) -> dict:
    """time = FLOPs / (efficiency x 989 TFLOP/s) + latency, least squares on log time, for the
    probe's GEMMs (2mkn FLOPs) and its causal flash-attention calls (forward + backward: 3.5 x
    2 s^2 a d FLOPs)."""
    rows = read_json(path)["rows"]
    peak = timing.H100_SXM_PEAK
    out = {}
    for kind, flops, seconds in (
        ("gemm", lambda r: 2.0 * r["m"] * r["k"] * r["n"], lambda r: r["seconds"]),
        ("attention", lambda r: 3.5 * 2.0 * r["seq"] ** 2 * r["heads"] * r["head_dim"], lambda r: r["forward_backward_s"]),
    ):
        selected = [r for r in rows if r["kind"] == ("gemm" if kind == "gemm" else "sdpa")]
        f = np.array([flops(r) for r in selected])
        t = np.array([seconds(r) for r in selected])
        fit = least_squares(lambda x: np.log((f / (x[0] * peak) + x[1]) / t), [0.7, 1e-5], bounds=([0.05, 0], [1, 1e-2]))
        model = f / (fit.x[0] * peak) + fit.x[1]
        out[kind] = {"efficiency": round(float(fit.x[0]), 4), "latency_s": float(f"{fit.x[1]:.3g}"),
                     "mean_abs_error": round(float(np.mean(np.abs(model / t - 1))), 4), "shapes": len(selected)}
    return out


@click.group(cls=OneLineGroup, invoke_without_command=True, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--on", type=click.Choice(GPU_TYPES), default="all", show_default=True,
              help="Which runs to fit on.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=CALIBRATION_FILE,
              show_default="advisor/calibration.json", help="Where to write the constants.")
@click.option("--check", is_flag=True, help="Write nothing; exit 1 if --out differs from a fresh fit.")
@click.pass_context
def main(ctx: click.Context, on: str, out: Path, check: bool) -> None:
    """Fit the time model's and the memory model's constants to seed 004's real runs."""
    if ctx.invoked_subcommand is not None:
        return
    from advisor.fileio import output_target, read_json

    # before the fit, and as the advisor reads and writes files: a malformed --out was a traceback,
    # a FIFO hung (found by a CLI fuzzer)
    if check:
        current = read_json(out, what="calibration file") if out.exists() else None
    else:
        output_target(out)
    document = fitted_document(on)
    text = to_json(document)
    if check:
        if current != json.loads(text):
            click.echo(f"{out} differs from a fresh fit on {on}; run python -m tables.seed004.calibrate", err=True)
            ctx.exit(1)
        click.echo(f"{out} is up to date")
        return
    atomic_write_text(out, text)
    time, memory = document["time"], document["memory"]
    click.echo(f"wrote {out}\n  time:   " + ", ".join(f"{k}={time[k]:.4g}" for k in time["fitted"])
               + "\n  memory: " + ", ".join(f"{k}={memory[k]:.4g}" for k in memory["fitted"]))


@main.command()
@click.option("--data", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=timing.PROBE,
              show_default="benchmarks/gpu/data/h100_sxm_gemm_attention.json")
def probe(data: Path) -> None:
    """Fit the H100 kernel constants (Kernels.hopper, gemm/attention latency) from the probe."""
    click.echo(to_json(probe_fit(data)), nl=False)


if __name__ == "__main__":
    main(prog_name="python -m tables.seed004.calibrate")
