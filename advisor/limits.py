"""Every bound on what the advisor accepts: sizes, depths, counts and values, in one place.

A reader or a validator that takes a number, a file or a structure from a user checks it against
these bounds before any work, so that a hostile or mistaken input is one error line (exit status
2), never a hang, an out-of-memory kill or a traceback. Each bound says why it is where it is: far
beyond any real training run, and small enough that the work it admits is bounded. New readers
(GPU data, profile schema versions, model files) take their bounds from here.

``check_int``/``check_float`` raise ``AdvisorError`` with the bound's reason in the message;
``check_bool`` refuses what is not true or false. Values are said in JSON's words (``json_text``:
null, true, false), and a reader that passes ``document.get(key, ABSENT)`` has a key left out said
missing (``must_be``).
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

from advisor.errors import AdvisorError

KIB, MIB, GIB = 2**10, 2**20, 2**30


@dataclass(frozen=True, slots=True)
class Bound:
    """An inclusive range and why it is there (the reason completes "must be at most N: ...")."""

    low: float
    high: float
    why: str


# --- files --------------------------------------------------------------------------------

JSON_FILE_BYTES = 64 * MIB
"""A JSON document we read (campaign, plan, sweep, estimate, config.json). The largest we write:
a full campaign at the layer bound is about 10 MiB; a Hugging Face config.json is a few KiB."""
RANK_FILE_BYTES = 1 * GIB
"""A profile rank file. After its first ``PROFILE_LAYER_ITERATIONS`` iterations a rank appends
one iteration record (about 300 bytes) per iteration: 1 GiB holds over three million
iterations, beyond Llama 3 405B's 1.2 million training steps."""
JSON_LINE_BYTES = 1 * MIB
"""One line of a JSON Lines file. A header with every layer number of the deepest model is
about 50 KiB; a layer record is under 1 KiB."""
COMMAND_FILE_BYTES = 1 * MIB
"""A launch script or argument list read by ``--from-command``: the longest published Megatron
launch scripts are a few KiB."""
COMMAND_EXPANSION_BYTES = 256 * KIB
"""What a launch script's variables may add to it when expanded: Megatron-LM's example scripts
expand to a few KiB; 'A=$A$A' sixty times over would add 2^60 characters."""
COMMAND_DEFAULTS_PROBED = 8
"""The ``${NAME:-default}`` variables of a launch script re-read to find which its world size
comes from (``shell_command.world_defaults``, only for a message): Megatron-LM's example scripts
default four or five (NNODES, NODE_RANK, MASTER_ADDR, MASTER_PORT); each costs one reading."""
LOG_FILE_BYTES = 1 * GIB
"""A Megatron-LM training log read by ``compare-log`` (read whole, then line by line): a logged
iteration is one line of about 500 bytes, so 1 GiB holds about two million of them."""
JSON_DEPTH = 64
"""Nesting of a JSON document. Our schemas nest at most 4 levels, Hugging Face configs about 6;
a deeper document is not one of ours (200,000 levels exhausted Python's stack)."""
JSON_INT = 2**63 - 1
"""The largest JSON integer: int64, what torch and Megatron-LM count bytes, tokens and
iterations in."""
NAME_BYTES = 255
"""NAME_MAX on Linux (ext4, XFS, tmpfs): the longest file name in bytes."""
RUN_ID_CHARS = 200
"""A campaign run id names a directory; 200 characters leave room under ``NAME_BYTES`` for the
temporary names of atomic writes."""

# --- models (Megatron-LM's names) ----------------------------------------------------------

MODEL = {
    "num_layers": Bound(1, 4096, "the deepest trained transformers have about 1,000 layers (DeepNet, "
                                 "Wang et al. 2022), Llama 3 405B has 126"),
    "hidden_size": Bound(1, 2**20, "Llama 3 405B has 16,384; 2^20 is 64 times that"),
    "ffn_hidden_size": Bound(1, 2**22, "Llama 3 405B has 53,248; 2^22 is 78 times that"),
    "num_attention_heads": Bound(1, 2**14, "Llama 3 405B has 128; 2^14 is 128 times that"),
    "num_query_groups": Bound(1, 2**14, "a query group has at least one attention head"),
    "kv_channels": Bound(1, 2**14, "an attention head has 64 to 256 channels in released models"),
    "vocab_size": Bound(1, 2**24, "the largest vocabularies have about 256,000 tokens (Gemma); 2^24 is 64 "
                                  "times that"),
}

ROTARY_BASE = Bound(0, 1e12, "RoPE bases in released models are 10,000 to 1,000,000")
ROPE_SCALING = Bound(1, 1e6, "Llama 3.1 scales RoPE frequencies by 8")

# --- workload and layout ------------------------------------------------------------------

SEQ_LEN = Bound(1, 2**24, "the longest trained contexts are about 10 million tokens")
GLOBAL_BATCH = Bound(1, 2**24, "Llama 3 405B trained with 16 million tokens per step, 2,048 sequences "
                               "of 8,192; 2^24 sequences is 8,000 times that")
TOKENS = Bound(0, 1e17, "the largest published training runs use about 36 trillion tokens (Qwen3); 10^17 is "
                        "about 3,000 times that")
"""Exclusive at 0: advisor sweep and estimate's --tokens, the training token budget (1e40 priced
10^25 days). advisor-launch's budget is bounded by Megatron's int64 sample index (``launch.job``)."""
GPUS = Bound(1, 2**20, "the largest training clusters have about 100,000 GPUs; 2^20 is ten times that")
GPUS_PER_NODE = Bound(1, 1024, "an NVLink domain has at most 576 GPUs (NVL576)")
GPU_MEMORY_GIB = Bound(0, 2**14, "a GPU has at most a few hundred GiB (B300: 288 GB); 16 TiB is 50 times that")
"""Exclusive at 0: memory must be positive; must be finite (inf and nan are refused)."""
MEMORY_FRACTION = Bound(0, 1, "a fraction of the GPU's memory")
"""Exclusive at 0: --threshold."""
GPU_HOUR_PRICE_USD = Bound(0, 1e6, "a GPU-hour rents for a few dollars")
"""Exclusive at 0: --gpu-hour-price (nan passed click's FloatRange and wrote NaN into the JSON)."""
FS_BANDWIDTH_GBS = Bound(1e-3, 1e6, "the fastest parallel file systems write a few TB/s")
"""advisor-launch --fs-bandwidth and a job file's fs_bandwidth_gbs: 1 MB/s to 1 PB/s (nan, and 1e-300,
whose save took 1e311 s, were a traceback pricing the save interval)."""
DEGREE = Bound(1, GPUS.high, "a parallel degree cannot exceed the GPU count bound")
MICRO_BATCH = Bound(1, GLOBAL_BATCH.high, "a micro-batch is part of the global batch")
VIRTUAL_STAGES = Bound(1, MODEL["num_layers"].high, "each virtual stage holds at least one layer")
MERGED_UNITS = Bound(1, MODEL["num_layers"].high, "CAPTURE's layer merger makes at most one unit per layer")
"""Units the layer merger makes (recommend's --merge-to)."""
STAGE_INDEX = Bound(0, MODEL["num_layers"].high - 1, "a pipeline stage holds at least one layer")
"""A 0-based pipeline stage (the emulator's --stage)."""

# --- mixtures of experts ------------------------------------------------------------------

EXPERTS = 2**14
"""DeepSeek-V3 routes over 256 experts; 2^14 is 64 times that (advisor.moe.spec refuses more)."""
DISPATCHER_SMS = Bound(2, 1024, "no GPU has more SMs (B200 has 148)")
"""--moe-deepep-num-sms: checked against the GPU's own SMs where it is known (``advisor.moe.time``)."""
MOE_IMBALANCE = Bound(1, EXPERTS, "the busiest rank receives at most every routed token, EP times the mean, and "
                                  "EP is at most the experts")
MOE_CAPACITY_FACTOR = Bound(0, EXPERTS, "at a factor of E an expert's capacity holds every routed token "
                                        "(megatron-core moe/moe_utils.py, get_capacity: ceil(tokens / E x factor))")
"""Exclusive at 0: a capacity of no tokens drops them all."""
MOE_TOPK_SCALING = Bound(0, 1e3, "DeepSeek-V3 scales the routed experts' output by 2.5")
AUX_LOSS_COEFF = Bound(0, 1e3, "released MoE models weigh their load-balancing loss 0.001 to 0.02")
"""Exclusive at 0: --moe-router-topk-scaling-factor."""
YARN_MSCALE = Bound(0, 1e3, "DeepSeek-V3's yarn mscale and mscale_all_dim are 1.0")
MTP_LAYERS = Bound(0, 16, "DeepSeek-V3 trains one multi-token-prediction layer")

# --- training options ---------------------------------------------------------------------

OFFLOAD_FRACTION = Bound(0, 1, "the share of the optimizer's parameters whose states live on the CPU")
"""--optimizer-offload-fraction (``advisor.options.Offload``)."""
FP8_AMAX_HISTORY = Bound(1, 2**16, "Transformer Engine's DelayedScaling keeps 1,024 amax values by default "
                                   "(Megatron-LM 1); 2^16 is 64 times that")
"""--fp8-amax-history-len (``advisor.options.Precision``): 10^400 was an OverflowError pricing the history."""

# --- profiling ----------------------------------------------------------------------------

PROFILING_MICROBATCHES = Bound(1, 4096, "a 1F1B stage holds at most PP microbatches at once, and PP is at most "
                                        "the layer bound, so a profiling run gains nothing from more")
PROFILING_ITERATIONS = Bound(1, 10_000, "CAPTURE profiles two iterations; memory is steady from the second")
CAMPAIGN_RUNS = Bound(1, 100_000, "a full campaign has about 10 runs per layer: 40,000 at the layer bound")
ITERATION = Bound(0, JSON_INT, "torch and Megatron-LM count iterations in int64")
"""A recorded iteration, 0-based (advisor profile show --iteration)."""
PROFILE_LAYER_ITERATIONS = 10
"""A rank file holds per-layer records for its first iterations only; later iterations append one
iteration record each (peak, static memory, time), so a long training's file grows by a constant
~300 bytes per iteration. Per-layer memory is the same from the second iteration on (the first
allocates the optimizer states); ten iterations show that it is steady."""
CPU_EMULATION_SECONDS = 3600.0
"""``advisor profile run`` on the CPU refuses a campaign estimated to take longer (unless the user
insists with --force): the emulator is for toy models and for testing a campaign; a real model's
campaign runs on GPUs (--megatron-lm), where it takes minutes."""


def finite_number(value, high: float = 1e15) -> bool:
    """A JSON number a page can draw and a file may hold: not a boolean, finite, at most ``high``
    in size (1e308 GiB overflowed a log axis's ticks)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        and abs(value) <= high


def unknown_field(document: dict, known, nobody: str) -> str | None:
    """The problem of the first field of ``document`` not in ``known``, with the known field it
    may misspell ('vp' for 'vpp', which was ignored without a word), ending in ``nobody`` (who
    writes no such field); None where there is none."""
    from advisor.errors import close_names

    unknown = sorted(str(key) for key in document if key not in known)
    if not unknown:
        return None
    close = close_names(unknown[0], sorted(known), n=1, cutoff=0.8)
    hint = f" (did you mean '{close[0]}'?)" if close else ""
    return f"unknown field {json_text(unknown[0])}{hint}: {nobody}"


def threads() -> Bound:
    """Intra-op threads per emulated GPU, up to this machine's cores."""
    return Bound(1, os.cpu_count() or 1, "more threads than this machine's cores only oversubscribe them "
                                        "(100,000 crashed the runner)")


# --- a training log (compare-log) ---------------------------------------------------------

LOGGED_ITERATION_MS = Bound(0, 7 * 24 * 3600 * 1000, "a week; a logged iteration takes seconds, the first, "
                                                     "start-up included, minutes")
"""A log's 'elapsed time per iteration (ms)' (Megatron's mean over the log interval): 1e300 read as
a step time of 10^297 s, with exit status 0."""
LOGGED_TFLOPS = Bound(0, 1e5, "the fastest GPUs peak at some thousands of dense TFLOP/s (B200: 4,500 in FP8)")
"""A log's 'throughput per GPU (TFLOP/s/GPU)'."""
LOGGED_COUNT = Bound(0, JSON_INT, "torch and Megatron-LM count in int64")
"""A log's iteration, rank, global batch size or count of skipped iterations."""
LOGGED_MEMORY_MIB = Bound(0, GPU_MEMORY_GIB.high * KIB, "a GPU's memory, bounded as --mem's is (16 TiB)")
"""A log's memory figures in MB (2^20 bytes): Megatron's reports, its theoretical memory, the hooks' peaks."""


# --- what is shown, and where it runs -----------------------------------------------------

ROWS = Bound(1, JSON_INT, "the largest JSON integer")
"""A count or rank of a sweep's rows (--top, advisor-launch --rank): beyond the rows there are,
all are shown (or none is found)."""
DETAILED_LAYOUTS = Bound(1, 20, "each is drawn in full (memory per stage, time parts); more would bury the ranking")
"""advisor report --top: the best-ranked layouts the page draws in detail."""
TCP_PORT = Bound(1, 65535, "a TCP port is a 16-bit number")
NODE_RANK = Bound(0, GPUS.high - 1, "a node holds at least one GPU, so there are no more nodes than GPUs")
"""0-based, below the node count (torchrun --node-rank)."""
CPUS_PER_TASK = Bound(1, 2**16, "the largest nodes have about 1,000 hardware threads; 2^16 is 64 times that")
SIGNAL_TIME_S = Bound(60, 65535, "Slurm's --signal takes at most 65535 seconds")
"""#SBATCH --signal=TERM@S: at least Slurm's event resolution of 60 s (it may signal that much early)."""


# --- checks -------------------------------------------------------------------------------


def check_int(value: object, name: str, bound: Bound, where: str = "") -> int:
    """``value`` as an int within ``bound``; AdvisorError naming ``name`` (and ``where``) otherwise."""
    prefix = f"{where}: " if where else ""
    name = f"{name} " if name else ""
    if isinstance(value, bool) or not isinstance(value, int):
        raise AdvisorError(f"{prefix}{name}{must_be('an integer', value)}")
    if value < bound.low:
        raise AdvisorError(f"{prefix}{name}must be at least {bound.low:g}, got {json_text(value)}")
    if value > bound.high:
        raise AdvisorError(f"{prefix}{name}must be at most {int(bound.high):,}, got {json_text(value)}: {bound.why}")
    return value


def check_bool(value: object, name: str, where: str = "") -> bool:
    """``value`` as a bool (true or false in JSON); AdvisorError naming ``name`` otherwise."""
    if not isinstance(value, bool):
        prefix = f"{where}: " if where else ""
        raise AdvisorError(f"{prefix}{name} {must_be('true or false', value)}")
    return value


def check_float(value: object, name: str, bound: Bound, where: str = "", *, low_open: bool = False) -> float:
    """``value`` as a finite float within ``bound`` (above ``bound.low`` when ``low_open``)."""
    prefix = f"{where}: " if where else ""
    name = f"{name} " if name else ""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise AdvisorError(f"{prefix}{name}{must_be('a number', value)}")
    if isinstance(value, int) and abs(value) > 2**1000:  # float() of it overflows
        raise AdvisorError(f"{prefix}{name}must be at most {bound.high:g}, got {json_text(value)}: {bound.why}")
    if not math.isfinite(value):
        raise AdvisorError(f"{prefix}{name}must be a finite number, got {value}")
    if value < bound.low or (low_open and value == bound.low):
        relation = "above" if low_open else "at least"
        raise AdvisorError(f"{prefix}{name}must be {relation} {bound.low:g}, got {value:g}")
    if value > bound.high:
        raise AdvisorError(f"{prefix}{name}must be at most {bound.high:g}, got {value:g}: {bound.why}")
    return float(value)


class _Absent:
    """The value of a key a JSON document leaves out (``ABSENT``)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT = _Absent()
"""What a reader's ``document.get(key, ABSENT)`` gives for a key the document leaves out: ``must_be``
says it is missing, where None is JSON's null."""


def json_text(value: object) -> str:
    """A value read from JSON, for a message in JSON's words (null, true, false; a string quoted),
    shortened (a hostile value may be megabytes long)."""
    if value is None or isinstance(value, bool):
        return {None: "null", True: "true", False: "false"}[value]
    text = repr(value) if not isinstance(value, int) else _int_text(value)
    return text if len(text) <= 40 else text[:37] + "..."


def must_be(what: str, value: object, show=json_text) -> str:
    """'must be WHAT, got VALUE' (``show``: ``json_text``), or 'is missing (it must be WHAT)' for
    ``ABSENT``: a JSON user reads null for null and missing for a key left out."""
    if value is ABSENT:
        return f"is missing (it must be {what})"
    return f"must be {what}, got {show(value)}"


def _int_text(value: int) -> str:
    if abs(value) < 10**30:
        return str(value)
    digits = int(abs(value).bit_length() * math.log10(2)) + 1  # str() refuses over 4,300 digits
    return f"{'-' if value < 0 else ''}a {digits:,}-digit number"
