"""The parallel layout of a training run, and the workload it runs."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from advisor import limits
from advisor.errors import AdvisorError

DEFAULT_GPUS_PER_NODE = 8
"""A node of the paper's clusters (and a DGX): the sweep's TP cap, the launcher's default."""

RANK_ORDER = "tp-cp-ep-dp-pp"
"""Megatron's rank order, fastest-varying first (megatron/training/initialize.py passes it to
``parallel_state.initialize_model_parallel``, whose ``RankGenerator`` lays ranks out so)."""
TP_PP_DP_RANK_ORDER = "tp-cp-ep-pp-dp"
"""The order with --use-tp-pp-dp-mapping (the same call, core_v0.15.2 and core_v0.19.0)."""


def pipeline_stage_of_rank(rank: int, *, tp: int, cp: int, dp: int, pp: int, order: str = RANK_ORDER) -> int:
    """The pipeline stage of a global rank: its PP coordinate in ``order``, each axis varying
    after the ones before it (``RankGenerator``; the dense decoder's generator has EP 1)."""
    sizes, stride = {"tp": tp, "cp": cp, "ep": 1, "dp": dp, "pp": pp}, 1
    for axis in order.split("-"):
        if axis == "pp":
            return rank // stride % pp
        stride *= sizes[axis]
    raise ValueError(f"rank order {order!r} has no pp axis")


def check_whole_nodes(gpus: int, gpus_per_node: int) -> None:
    """More GPUs than a node holds come as whole nodes: 8 GPUs on nodes of 3 is no cluster (and
    would cap TP at 2 without a word)."""
    if gpus > gpus_per_node and gpus % gpus_per_node:
        raise AdvisorError(f"{gpus} GPUs are not whole nodes of {gpus_per_node}: give a multiple of {gpus_per_node}, "
                           "at most one node, or the GPUs your nodes hold with --gpus-per-node N (a GB200 NVL72 "
                           "rack's NVLink domain: --gpus-per-node 72)")


def world_size_problem(gpus: int, tp: int, cp: int, pp: int, dp: int, *, key: str = "gpus") -> str | None:
    """Why ``gpus`` (a saved row's or plan's field ``key``) is not the world of this layout, or None:
    megatron-core's world is TP x CP x PP x DP (core_v0.15.2 parallel_state.py,
    initialize_model_parallel: data_parallel_size = world_size // (TP x PP x CP)). The one check of
    the launcher's inputs (``launch.inputs``), the report's (``advisor.report.inputs``) and a
    profile's header (``advisor.profiles``)."""
    if gpus == tp * cp * pp * dp:
        return None
    return f"{key!r} is {gpus}, but TP x CP x PP x DP = {tp * cp * pp * dp}"


def model_parallel_problem(gpus: int, tp: int, cp: int, pp: int, *, subject: str | None = None) -> str | None:
    """Why ``gpus`` cannot hold whole replicas of TP x CP x PP GPUs each, or None: DP is
    gpus / (TP x CP x PP) (core_v0.15.2 parallel_state.py, initialize_model_parallel raises unless
    it divides). The one wording of it; ``subject`` says how the count was given (default
    '--gpus N')."""
    model_parallel = tp * cp * pp
    if gpus % model_parallel == 0:
        return None
    subject = subject or f"--gpus {gpus}"
    return f"{subject} is not divisible by TP x CP x PP = {tp} x {cp} x {pp} = {model_parallel}"


def expert_groups_problem(ranks: int, ep: int, etp: int) -> str | None:
    """Why the ``ranks`` = TP x CP x DP of one pipeline stage cannot hold whole EP x ETP expert
    groups, or None (core_v0.15.2 parallel_state.py, initialize_model_parallel raises unless ETP x
    EP x PP divides the world). The one wording of it."""
    if ranks % (ep * etp) == 0:
        return None
    return f"EP x ETP = {ep * etp} must divide TP x CP x DP = {ranks} (megatron-core's expert groups)"


def global_batch_problem(global_batch_size: int, mbs: int, dp: int, *, subject: str | None = None) -> str | None:
    """Why the global batch is not a whole number of microbatches per pipeline, or None: m =
    GBS / (MBS x DP) (core_v0.15.2 num_microbatches_calculator.py asserts it divides). The one
    wording of it; ``subject`` says how the batch was given (default '--gbs N')."""
    per_step = mbs * dp
    if global_batch_size % per_step == 0:
        return None
    subject = subject or f"--gbs {global_batch_size}"
    return f"{subject} is not divisible by MBS x DP = {mbs} x {dp} = {per_step}"


def default_layers_per_stage(num_layers: int, pp: int) -> tuple[int, ...]:
    """Megatron's split when none is given: the same share of the layers on every pipeline stage
    (core_v0.15.2 transformer/transformer_block.py, get_num_layers_to_build: num_layers //
    pipeline_model_parallel_size, after asserting that it divides; ``num_layers`` there includes
    the embedding and loss under --account-for-*-in-pipeline-split)."""
    return (num_layers // pp,) * pp


def heads_problem(tp: int, heads: int, kv_heads: int, *, name: str = "TP") -> str | None:
    """Why TP cannot split the attention of ``heads`` heads and ``kv_heads`` key-value heads, or
    None: each rank takes whole heads of both (megatron-core's ``divide`` asserts it). The one
    wording; ``name`` says how TP was given (default 'TP', the sweep's '--tp')."""
    if heads % tp or kv_heads % tp:
        return f"{name} {tp} must divide the attention heads ({heads}) and the KV heads ({kv_heads})"
    return None


def sequence_splits(seq_len: int, cp, tp):
    """Whether the sequence splits over CP and TP, elementwise over arrays of degrees (the
    enumerators'); ``sequence_problem`` says why not, in the one wording."""
    return ((cp == 1) | (seq_len % (2 * cp) == 0)) & ((seq_len // cp) % tp == 0)


def sequence_problem(seq_len: int, cp: int, tp: int) -> str | None:
    """Why the sequence cannot be split over CP and TP, or None: CP splits it into 2 x CP chunks
    (load-balanced causal attention; core_v0.15.2 ``get_batch_on_this_cp_rank``), and sequence
    parallelism, on whenever TP > 1, splits each CP rank's part over TP. The one wording of it."""
    if cp > 1 and seq_len % (2 * cp):
        return f"sequence length {seq_len} must be divisible by 2 x CP = {2 * cp}"
    if tp > 1 and (seq_len // cp) % tp:
        return f"sequence parallelism needs the sequence per CP rank ({seq_len // cp}) divisible by TP {tp}"
    return None


@dataclass(frozen=True, slots=True)
class Pinned:
    """Degrees the user fixed (advisor sweep --tp/--cp/--pp/--mbs, Megatron's sizes); None: searched.
    A pinned degree need not be one the search would try (a power of 2 for TP, CP and MBS): any
    value Megatron-LM launches is enumerated, under the same rules as the searched ones."""

    tp: int | None = None
    cp: int | None = None
    pp: int | None = None
    mbs: int | None = None

    def values(self, name: str, searched) -> list[int]:
        """The candidates of dimension ``name``: the pinned value alone, or ``searched``."""
        pin = getattr(self, name)
        return list(searched) if pin is None else [pin]

    def given(self) -> dict[str, int]:
        return {name: getattr(self, name) for name in self.__slots__ if getattr(self, name) is not None}

    def text(self) -> str:
        """'TP 8, PP 2' (the pinned degrees, for a line that says why no layout has them)."""
        return ", ".join(f"{name.upper()} {value}" for name, value in self.given().items())

    def problem(self, gpus: int, *, heads: int, kv_heads: int, layers: int, seq_len: int,
                global_batch_size: int | None, max_tp: int) -> str | None:
        """Why no layout on ``gpus`` GPUs can have these degrees, named by their flags, or None
        (the rules of the search's enumeration, ``advisor.space.launchable``; the MoE sweep's
        ``advisor.moe.space._bases``)."""
        tp, cp, pp, mbs = (value or 1 for value in (self.tp, self.cp, self.pp, self.mbs))
        if tp > max_tp:
            return (f"--tp {tp} is more than --gpus-per-node {max_tp}: the sweep keeps TP within a node "
                    "(advisor estimate prices a TP across nodes)")
        if problem := heads_problem(tp, heads, kv_heads, name="--tp"):
            return problem
        if pp > layers:
            return f"--pp {pp} exceeds the {layers} layers"
        if problem := model_parallel_problem(gpus, tp, cp, pp):
            return problem
        if problem := sequence_problem(seq_len, cp, tp):
            return problem
        if global_batch_size is not None and global_batch_size % mbs:
            return f"--gbs {global_batch_size} is not divisible by --mbs {mbs}"
        return None


_BOUNDS = {"tp": limits.DEGREE, "cp": limits.DEGREE, "pp": limits.DEGREE, "dp": limits.DEGREE,
           "mbs": limits.MICRO_BATCH, "vpp": limits.VIRTUAL_STAGES, "seq_len": limits.SEQ_LEN,
           "global_batch_size": limits.GLOBAL_BATCH}


def _require_bounded(obj: object) -> None:
    """Every field a positive integer within its bound (advisor.limits): checked where a layout or a
    workload is made, so no caller can enumerate or allocate from an absurd one."""
    # The class's fields without dataclasses.fields' filtering per call (these classes have no
    # pseudo-fields), and a plain int within its bound passes without check_int's messages: a sweep
    # makes thousands of layouts. Anything else goes to check_int, which raises as it did.
    for name in type(obj).__dataclass_fields__:
        value = getattr(obj, name)
        if value is not None and not (type(value) is int and _BOUNDS[name].low <= value <= _BOUNDS[name].high):
            limits.check_int(value, name, _BOUNDS[name])


@dataclass(frozen=True, kw_only=True, slots=True)
class ParallelConfig:
    """Megatron's 4D layout: GPUs = tp x cp x pp x dp."""

    tp: int = 1
    """Tensor parallel size t (with sequence parallelism whenever t > 1)."""
    cp: int = 1
    """Context parallel size c."""
    pp: int = 1
    """Pipeline parallel size p."""
    dp: int = 1
    """Data parallel size d."""
    mbs: int = 1
    """Micro-batch size b."""
    vpp: int = 1
    """Virtual pipeline stages (model chunks) per pipeline rank; 1 = no interleaving."""

    def __post_init__(self) -> None:
        _require_bounded(self)

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def model_parallel_size(self) -> int:
        """TP x CP x PP: the GPUs that hold one replica of the model."""
        return self.tp * self.cp * self.pp

    def to_dict(self) -> dict:
        return asdict(self)


@dataclass(frozen=True, kw_only=True, slots=True)
class Workload:
    """What is trained: sequence length and global batch size (seed 004 uses 8192 and 1024)."""

    seq_len: int = 8192
    """s, tokens per sequence."""
    global_batch_size: int | None = 1024
    """Sequences per iteration; None leaves the number of microbatches unknown."""

    def __post_init__(self) -> None:
        _require_bounded(self)

    def num_microbatches(self, parallel: ParallelConfig) -> int | None:
        """m = gbs / (b x d), the microbatches per pipeline per iteration."""
        if self.global_batch_size is None:
            return None
        if problem := global_batch_problem(self.global_batch_size, parallel.mbs, parallel.dp):
            raise AdvisorError(problem)
        return self.global_batch_size // (parallel.mbs * parallel.dp)
