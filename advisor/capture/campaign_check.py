"""A campaign document checked against itself, before any run starts: one validator for the file
kind that ``advisor profile run`` and both runners execute (schema: ``advisor/capture/campaign.py``).

Every field a runner uses is typed and bounded (``advisor.limits``), and every field that another
one implies must agree with it: a run's ``pp`` is its number of stages, its ``world_size`` is
TP x DP x CP x PP, its ``pipeline_microbatch`` is the micro-batch x DP, its ``global_batch_size``
the pipeline microbatch x microbatches; TP divides the attention and KV heads; a run fits the
campaign's GPUs and its sub-mesh a node. A run id names a directory: letters, digits and ``._+=-``,
starting with a letter or a digit (no blank, newline, NUL, slash or leading dot). The first problem
is one ``AdvisorError`` naming the file, the run and the field.

``emulation_problems`` lists, all at once, what the CPU emulator cannot run as planned.
"""

from __future__ import annotations

import re
from pathlib import Path

from advisor import limits
from advisor.errors import AdvisorError
from advisor.megatron_args import MegatronSetup
from advisor.options.flags import SWIGLU_UNFUSED_FLAG
from advisor.memory import tp_problem
from advisor.model_spec import from_fields
from advisor.models import LlamaSpec
from advisor.parallel import sequence_problem

RUN_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+=-]*")
SETUP_DTYPES = ("bfloat16", "float16", "float32")
CAMPAIGN_SETUP_FIELDS = tuple(name for name in MegatronSetup.__dataclass_fields__ if name != "transformer_impl")
"""The fields of a campaign's setup: a plan's but its layer spec, which a campaign's runs take from
their runner (``campaign_run.backend_fields``: the CPU emulator's local spec, the symbolic
backend's --layer-spec, --transformer-impl after -- for Megatron-LM), and the plans from them
from what the runs' headers say they built (``observations.launched_transformer_impl``)."""
CAMPAIGN_FIELDS = ("schema", "version", "mode", "model", "seq_len", "gpus", "gpus_per_node", "cp", "setup", "target",
                   "fractions", "scenarios", "skipped", "runs")
"""The fields of a campaign (``advisor.capture.campaign.Campaign.to_dict``)."""
RUN_FIELDS = ("id", "scenario", "tp", "dp", "cp", "pp", "pipeline_microbatch", "micro_batch_size", "num_microbatches",
              "global_batch_size", "world_size", "layers_per_stage", "source", "launchable", "megatron_args", "ep",
              "etp")
"""The fields of a campaign's run (``advisor.capture.campaign.CampaignRun.to_dict``; EP and ETP a
mixture of experts' only). Another is refused (``_Fields.refuse_unknown``): a run's 'megatron_arg' left it
without its flags, launched from the model alone, without a word."""
_DEGREES = ("tp", "dp", "cp", "pp")


class _Fields:
    """Typed, bounded access to one JSON object, with messages naming the file and the object."""

    def __init__(self, document: object, where: str) -> None:
        if not isinstance(document, dict):
            raise AdvisorError(f"{where} must be a JSON object, got {_kind(document)}")
        self.document, self.where = document, where

    def get(self, key: str):
        if key not in self.document:
            raise AdvisorError(f"{self.where}: missing {key!r}")
        return self.document[key]

    def integer(self, key: str, bound: limits.Bound) -> int:
        return limits.check_int(self.get(key), repr(key), bound, self.where)

    def refuse_unknown(self, known: tuple[str, ...], what: str) -> None:
        """AdvisorError naming the first field that is not one of ``known`` (``what`` has those),
        with the one it may misspell, as a saved row's and a plan's readers word it."""
        if problem := limits.unknown_field(self.document, known, f"{what} has {', '.join(known)}"):
            raise AdvisorError(f"{self.where}: {problem}")

    def boolean(self, key: str) -> bool:
        value = self.get(key)
        if not isinstance(value, bool):
            raise AdvisorError(f"{self.where}: {key!r} must be true or false, got {_kind(value)}")
        return value


def _kind(value: object) -> str:
    text = repr(value)
    if len(text) <= 40:
        return text
    return {dict: "an object", list: "a long list"}.get(type(value), text[:37] + "...")


def run_id_problem(name: object) -> str | None:
    """Why ``name`` cannot name a run's directory, or None."""
    if not isinstance(name, str):
        return f"a run id must be a string, got {_kind(name)}"
    if len(name) > limits.RUN_ID_CHARS or not RUN_ID.fullmatch(name):
        return (f"run id {_kind(name)} cannot name a directory: use up to {limits.RUN_ID_CHARS} letters, digits "
                f"and ._+=-, starting with a letter or a digit")
    return None


MOE_REFUSAL = ("is a mixture of experts: its campaign's runs carry EP and ETP, but the profilers build "
               "dense stages and the rank files hold a dense model; measure its MoE layer with python -m "
               "megatron_hooks.moe_layer (advisor profile show DIR) and price it with advisor sweep/estimate --ep")
"""Why an MoE campaign is not run (nor its profiles recommended from): one line."""


def check_campaign(document: object, path: Path | str) -> LlamaSpec:
    """Check a campaign document (see the module docstring); returns its model. A mixture of
    experts' campaign is refused in one line (``MOE_REFUSAL``)."""
    model = document.get("model") if isinstance(document, dict) else None
    if isinstance(model, dict) and "num_experts" in model:
        raise AdvisorError(f"{path}: {model.get('name')} {MOE_REFUSAL}")
    top = _Fields(document, str(path))
    top.refuse_unknown(CAMPAIGN_FIELDS, "a campaign")
    model = top.get("model")  # its own error names the file once
    try:  # an object of LlamaSpec's fields, each checked (a dataclass's TypeError named Python's internals)
        spec = from_fields(LlamaSpec, model, "'model'")
    except AdvisorError as exc:
        raise AdvisorError(f"{path}: {exc}") from None
    seq_len = top.integer("seq_len", limits.SEQ_LEN)
    gpus, per_node = top.integer("gpus", limits.GPUS), top.integer("gpus_per_node", limits.GPUS_PER_NODE)
    cp = top.integer("cp", limits.DEGREE)
    setup = _Fields(top.get("setup"), f"{path}: 'setup'")
    if setup.get("params_dtype") not in SETUP_DTYPES:
        raise AdvisorError(f"{path}: 'setup': 'params_dtype' must be one of {', '.join(SETUP_DTYPES)}, got "
                           f"{_kind(setup.get('params_dtype'))}")
    setup.boolean("distributed_optimizer")
    sequence_parallel = setup.boolean("sequence_parallel")
    # campaigns written before it was a choice were planned with Megatron's fused default
    bias_swiglu_fusion = setup.boolean("bias_swiglu_fusion") if "bias_swiglu_fusion" in setup.document else True
    setup.refuse_unknown(CAMPAIGN_SETUP_FIELDS, "a campaign's setup")
    runs = top.get("runs")
    if not isinstance(runs, list) or not runs:
        raise AdvisorError(f"{path}: 'runs' must be a non-empty list of runs, got {_kind(runs)}")
    limits.check_int(len(runs), "the number of runs", limits.CAMPAIGN_RUNS, str(path))
    seen: set[str] = set()
    for index, run in enumerate(runs):
        fields = _Fields(run, f"{path}: run {index + 1}")
        if problem := run_id_problem(fields.get("id")):
            raise AdvisorError(f"{path}: run {index + 1}: {problem}")
        name = run["id"]
        if name in seen:
            raise AdvisorError(f"{path}: run id {name!r} appears twice")
        seen.add(name)
        fields.where = f"{path}: run {name}"
        fields.refuse_unknown(RUN_FIELDS, "a campaign's run")
        _check_run(fields, spec, seq_len, gpus, per_node, cp, sequence_parallel, bias_swiglu_fusion)
    return spec


def _check_run(fields: _Fields, spec: LlamaSpec, seq_len: int, gpus: int, per_node: int, cp: int,
               sequence_parallel: bool, bias_swiglu_fusion: bool) -> None:
    where, run = fields.where, fields.document
    tp, dp, run_cp, pp = (fields.integer(key, limits.DEGREE) for key in _DEGREES)
    mbs = fields.integer("micro_batch_size", limits.MICRO_BATCH)
    microbatches = fields.integer("num_microbatches", limits.PROFILING_MICROBATCHES)
    counts = fields.get("layers_per_stage")
    if (not isinstance(counts, list) or not counts or len(counts) > limits.MODEL["num_layers"].high
            or any(isinstance(c, bool) or not isinstance(c, int) or c < 1 for c in counts)
            or sum(counts) != spec.num_layers):
        raise AdvisorError(f"{where}: 'layers_per_stage' {_kind(counts)} must be positive layer counts that sum to "
                           f"the model's {spec.num_layers} layers")
    implied = {
        "pp": (len(counts), "the number of stages in layers_per_stage"),
        "world_size": (tp * dp * run_cp * pp, f"TP x DP x CP x PP = {tp} x {dp} x {run_cp} x {pp}"),
        "pipeline_microbatch": (mbs * dp, f"micro_batch_size x DP = {mbs} x {dp}"),
        "global_batch_size": (mbs * dp * microbatches,
                              f"micro_batch_size x DP x num_microbatches = {mbs} x {dp} x {microbatches}"),
        "cp": (cp, "the campaign's cp"),
    }
    for key, (value, why) in implied.items():
        given = fields.integer(key, limits.GPUS if key == "world_size" else limits.GLOBAL_BATCH)
        if given != value:
            raise AdvisorError(f"{where}: {key!r} is {given}, but {why} is {value}")
    if run["world_size"] > gpus:
        raise AdvisorError(f"{where}: 'world_size' {run['world_size']} is more than the campaign's {gpus} GPUs")
    if tp * dp * run_cp > per_node:
        raise AdvisorError(f"{where}: a stage's TP x DP x CP = {tp * dp * run_cp} GPUs is more than a node's "
                           f"{per_node} (gpus_per_node)")
    if problem := tp_problem(spec, tp):
        raise AdvisorError(f"{where}: {problem}")
    if problem := sequence_problem(seq_len, run_cp, tp if sequence_parallel else 1):
        raise AdvisorError(f"{where}: {problem}")
    args = run.get("megatron_args", [])
    if not isinstance(args, list) or not all(isinstance(arg, str) and "\0" not in arg for arg in args):
        raise AdvisorError(f"{where}: 'megatron_args' must be a list of strings without NUL bytes")
    if problem := model_args_problem(args, spec, seq_len):
        raise AdvisorError(f"{where}: 'megatron_args' {problem}")
    # Megatron-LM runs the flags, the emulators and the prices read the setup: one SwiGLU for both
    if args and (SWIGLU_UNFUSED_FLAG in args) == bias_swiglu_fusion:
        given = "give" if bias_swiglu_fusion else "lack"
        raise AdvisorError(f"{where}: 'megatron_args' {given} {SWIGLU_UNFUSED_FLAG}, but the campaign's setup says "
                           f"bias_swiglu_fusion {str(bias_swiglu_fusion).lower()}")
    for key in ("launchable",):
        if key in run and not isinstance(run[key], bool):
            raise AdvisorError(f"{where}: {key!r} must be true or false, got {_kind(run[key])}")


def _flag_values(args) -> dict[str, str | None]:
    """'--flag value' and bare '--switch' pairs of an argument list: flag -> value (None: a switch)."""
    values: dict[str, str | None] = {}
    for i, arg in enumerate(args):
        if arg.startswith("--"):
            following = args[i + 1] if i + 1 < len(args) else None
            values[arg] = None if following is None or following.startswith("--") else following
    return values


def model_args_problem(args, spec: LlamaSpec, seq_len: int) -> str | None:
    """Where a run's Megatron flags build another network than the campaign's ``model`` (an edited
    file: the emulator ran the flags' size, the real path blamed its output directory), or None."""
    from advisor.megatron_args import model_args

    if not args:  # a run without flags is launched from the model itself
        return None
    given = _flag_values(args)
    for flag, value in _flag_values(model_args(spec, seq_len)).items():
        if flag not in given:
            return f"lack {flag}, which the campaign's model needs"
        if given[flag] != value:
            return f"give {flag} {given[flag]}, but the campaign's model and seq_len say {value}"
    return None


def emulation_problems(campaign: dict) -> list[str]:
    """Everything the CPU emulator cannot run as planned (it runs torch's Adam unsharded on every
    rank, and no sequence or context parallelism), each with how many runs and the first of them;
    empty if it can run every run. ``campaign`` was checked by ``check_campaign``."""
    spec = LlamaSpec(**campaign["model"])
    setup = campaign["setup"]
    rules = [
        (lambda run: run["dp"] > 1 and setup["distributed_optimizer"],
         "DP > 1 with the distributed optimizer, which the emulator does not shard", "--no-distributed-optimizer"),
        (lambda run: run["tp"] > 1 and setup["sequence_parallel"],
         "TP > 1 with sequence parallelism, which the emulator cannot run", "--no-sequence-parallel"),
        (lambda run: run["cp"] > 1, "CP > 1; the emulator runs no context parallelism", "--cp 1"),
        (lambda run: spec.vocab_size % run["tp"] or spec.ffn_hidden_size % run["tp"],
         f"a TP that does not divide the vocabulary ({spec.vocab_size}) and the FFN size "
         f"({spec.ffn_hidden_size}), which the emulator splits evenly", None),
    ]
    problems = []
    for applies, what, remedy in rules:
        hit = [run["id"] for run in campaign["runs"] if applies(run)]
        if hit:
            fix = f" (plan it with {remedy})" if remedy else ""
            problems.append(f"{len(hit)} run(s) with {what}, first {hit[0]}{fix}")
    return problems
