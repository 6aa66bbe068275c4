"""Random combinations of the commands' options, each checked for what issue 24 forbids: a
traceback, an exit status other than 0, 1 (nothing fits) or 2, more than one line before an
error, output on stdout after one, a hang (--timeout), or an -o file left behind by a failure
(exit 1, nothing fits, writes the empty document: JSON [] or an empty CSV).

    python benchmarks/fuzz_cli.py [--cases 400] [--seed 1] [--only estimate,sweep,command,log]

In process (click's CliRunner), so a few hundred cases take a minute; prints each problem with
the arguments that caused it, then a count per exit status, and exits 1 if it found any. The
values are mostly valid (so that a case reaches the pricing) with odd ones mixed in (ODD); a
case that finds a bug belongs in tests/test_hostile_inputs.py once fixed.
"""

from __future__ import annotations

import argparse
import random
import signal
import sys
import tempfile
import traceback
from collections import Counter
from pathlib import Path

from click.testing import CliRunner

from advisor.cli import cli

ROOT = Path(__file__).resolve().parent.parent
ODD = 0.12
MOE_MODELS = ("mixtral-8x7b", "qwen3-30b-a3b", "deepseek-v3", "qwen3-235b-a22b")
DENSE_MODELS = ("llama3.1-8b", "llama3.2-1b", "llama3.1-70b")
GPUS = ("h100-80gb", "a100-40gb", "gb200", "mi300x-192gb", "b200-180gb")
FLAGS = ("--grad-reduce-in-bf16", "--no-distributed-optimizer", "--no-overlap-grad-reduce", "--overlap-param-gather",
         "--tp-comm-overlap", "--use-torch-fsdp2", "--optimizer-cpu-offload", "--fp8-param-gather",
         "--no-sequence-parallel", "--no-flash-attn", "--cross-entropy-loss-fusion", "--overlap-moe-expert-parallel-comm",
         "--delay-wgrad-compute")
VALUED = {  # option: (valid values, odd values)
    "--use-megatron-fsdp --data-parallel-sharding-strategy": (("no_shard", "optim", "optim_grads",
                                                               "optim_grads_params"), ()),
    "--fp8-format": (("e4m3", "hybrid"), ()), "--fp8-recipe": (("delayed", "tensorwise", "mxfp8", "blockwise"), ()),
    "--cross-entropy-fusion-impl": (("native", "te"), ()), "--dataloader-mask": (("off", "cached", "rebuilt"), ()),
    "--optimizer-offload-fraction": (("0.5", "1"), ("0", "1e-300", "nan")),
    "--vocab-divisible-by": (("1", "128"), ("0", "100000")), "--recompute": (("none", "selective", "full"), ()),
    "--recompute-method": (("uniform", "block"), ()), "--recompute-num-layers": (("1", "2"), ("0", "1000")),
    "--ep": (("1", "2", "8", "64"), ("3", "100000")), "--etp": (("1", "2", "4"), ("3", "64")),
    "--moe-token-dispatcher-type": (("alltoall", "allgather", "flex"), ()),
    "--moe-routing capacity --moe-expert-capacity-factor": (("1", "1.25"), ("1e308", "1e-300")),
    "--moe-routing": (("balanced", "dropless"), ()), "--moe-imbalance": (("1", "1.3"), ("1e300", "16384")),
    "--mtp-num-layers": (("0", "1"), ("16",)), "--recompute-modules": (("moe_act", "layernorm", "mlp", "moe"), ()),
    "--vpp": (("1", "2", "3"), ()), "--seq-len": (("4096", "8192"), ("1", "16")), "--gbs": (("64", "1024"), ("7",)),
}


def _value(r: random.Random, valid, odd) -> str:
    return r.choice(odd) if odd and r.random() < ODD else r.choice(valid)


def options(r: random.Random, command: str) -> list[str]:
    """One case of ``advisor estimate`` or ``advisor sweep``: a model, a GPU, a layout, then a few
    training and MoE options, with --megatron-version 0.15 or 0.19."""
    model = r.choice(MOE_MODELS if r.random() < 0.7 else DENSE_MODELS)
    args = [command, "--model", model, "--megatron-version", r.choice(("0.15", "0.19"))]
    args += ["--gpu", r.choice(GPUS)] if r.random() < 0.7 else ["--mem", r.choice(("40", "80"))]
    gpus = r.choice((8, 16, 64, 256, 1024))
    args += ["--gpus", str(gpus)]
    if command == "estimate":
        tp, pp = r.choice((1, 2, 4, 8)), r.choice((1, 2, 4))
        args += ["--tp", str(min(tp, gpus)), "--pp", str(pp if tp * pp <= gpus else 1)]
    args += r.sample(FLAGS, r.choice((0, 1, 1, 2)))
    for option in r.sample(sorted(VALUED), r.choice((0, 1, 2, 3, 4))):
        if option == "--vpp" and command == "estimate" and "--pp" in args and args[args.index("--pp") + 1] == "1":
            continue
        args += [*option.split(), _value(r, *VALUED[option])]
    return args + ["--format", r.choice(("table", "json", "csv"))]


COMMAND = (ROOT / "tests" / "data" / "logs" / "core_v0.15.2_cpu_pp2.command").read_text()
LOG = ROOT / "tests" / "data" / "logs" / "core_v0.15.2_cpu_pp2.log"
EXTRA = ("--num-experts 4 --moe-router-topk 2 --moe-grouped-gemm --expert-model-parallel-size 2",
         "--moe-expert-capacity-factor nan", "--mtp-num-layers 1000", "--pipeline-model-parallel-layout 'E|t*9|t,L'",
         "--pipeline-model-parallel-layout 't*99999999999'", "--tensor-model-parallel-size 0", "--fp8-format e4m3",
         "--recompute-granularity full", "--use-megatron-fsdp", "--context-parallel-size 3", "--seq-length 1",
         "--micro-batch-size 3", "'unclosed", "$((1+", "${UNSET}", "A=$A$A", "--num-layers=", "-- --lr 1")


def command_text(r: random.Random) -> str:
    """A launch script: the real one of tests/data/logs, with flags added, cut or mangled."""
    text = COMMAND.rstrip() + "".join(" \\\n  " + r.choice(EXTRA) for _ in range(r.choice((0, 1, 2, 3))))
    if r.random() < 0.2:
        cut = r.randrange(len(text))
        text = text[:cut] + r.choice(("", "'", '"', "\\", "$(", "${", "\n", "\x00")) + text[cut:]
    return text


class Hang(Exception):
    pass


def _alarm(*_) -> None:
    raise Hang()



def _empty_document(text: str) -> bool:
    """JSON [] or a CSV with no row: what a sweep where nothing fits writes."""
    text = text.strip()
    return text in ("", "[]") or ("\n" not in text and not text.startswith(("[", "{")))


def check(args: list[str], timeout: int, stdin: str | None = None, output: Path | None = None) -> tuple[int, list]:
    """(exit status, problems) of one in-process run."""
    signal.signal(signal.SIGALRM, _alarm)
    signal.alarm(timeout)
    try:
        result = CliRunner().invoke(cli, args, input=stdin)
    except Hang:
        return -1, [f"hang over {timeout} s"]
    finally:
        signal.alarm(0)
    problems = []
    if result.exception is not None and not isinstance(result.exception, SystemExit):
        if isinstance(result.exception, Hang):
            return -1, [f"hang over {timeout} s"]
        problems.append("".join(traceback.format_exception(result.exception)).strip().splitlines()[-1])
    if result.exit_code not in (0, 1, 2):
        problems.append(f"exit status {result.exit_code}")
    lines = result.stderr.strip().splitlines()
    if result.exit_code == 2 and (len(lines) != 1 or not lines[0].startswith("Error: ") or result.stdout):
        problems.append(f"not one error line: {result.stderr[:200]!r} / stdout {result.stdout[:80]!r}")
    if result.exit_code == 1 and "nothing fits" not in result.stderr and "no split" not in result.stderr:
        problems.append(f"exit 1 without 'nothing fits': {result.stderr[:200]!r}")
    # exit 1 (nothing fits) writes the empty document, JSON [] or a CSV of the header line alone
    # (advisor.render.csv_header); a failure nothing
    if output is not None and output.exists() and (result.exit_code == 2 or result.exit_code == 1
                                                   and not _empty_document(output.read_text())):
        problems.append(f"{output} left behind")
    return result.exit_code, problems


def cases(kind: str, r: random.Random, scratch: Path):
    """(arguments, stdin, output file) of one case of ``kind``."""
    if kind in ("estimate", "sweep"):
        args = options(r, kind)
        output = scratch / "out.txt" if r.random() < 0.2 else None
        return args + (["-o", str(output)] if output else []), None, output
    if kind == "command":
        return ["estimate", "--from-command", "-", "--gpu", "h100-80gb",
                "--megatron-version", r.choice(("0.15", "0.19"))], command_text(r), None
    log = scratch / "train.log"
    text = LOG.read_text()
    cut = r.randrange(len(text))
    log.write_text(r.choice((text[:cut], text.replace("max allocated: 0.0", r.choice(("nan", "1e999", "-1")), 1))))
    return ["compare-log", str(log), "--from-command", str(LOG.with_suffix(".command")), "--gpu", "h100-80gb",
            "--format", r.choice(("json", "table"))], None, None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--cases", type=int, default=400, help="cases per kind")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--only", default="estimate,sweep,command,log")
    parser.add_argument("--timeout", type=int, default=20, help="seconds before a case counts as a hang")
    options_ = parser.parse_args()
    r, found, statuses = random.Random(options_.seed), 0, Counter()
    with tempfile.TemporaryDirectory() as scratch:
        for kind in options_.only.split(","):
            for _ in range(options_.cases):
                args, stdin, output = cases(kind, r, Path(scratch))
                if output is not None and output.exists():
                    output.unlink()
                status, problems = check(args, options_.timeout, stdin, output)
                statuses[(kind, status)] += 1
                for problem in problems:
                    found += 1
                    print(f"{' '.join(args)}\n  stdin: {(stdin or '')[-200:]!r}\n  {problem}", flush=True)
    print("cases per (kind, exit status):", dict(sorted(statuses.items())))
    print(f"{found} problems")
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
