"""--tp-comm-overlap-cfg FILE: the YAML of per-buffer userbuffers settings that Megatron-LM reads
with ``yaml.safe_load`` and passes whole to Transformer Engine's ``initialize_ub`` as ``ub_cfgs``
(core_v0.15.2 and core_v0.19.0 ``megatron/training/initialize.py``, ``_initialize_tp_communicators``).

Transformer Engine (TE 2.9, the release core_v0.15.2 pins, ``pytorch/module/base.py``,
``initialize_ub``) starts every buffer from ``get_default_config`` (v2.9 lines 327-346) and updates
it with the file's mapping for that buffer (``ub_cfg.update``, 478); ``add_ub`` (350-366) takes
exactly the keys below, ``is_reduce_scatter`` among them (any other is a TypeError there). It
raises where a buffer that is not a reduce-scatter is ``pipeline`` (380-383), and asserts that the
projection's and FC2's wgrad are ``external`` (403-407; the second assert, 408-411, reads TE's own
table, where proj_dgrad/fc2_dgrad are always ring_exchange). Any other buffer may be ``external``
too: it gets the non-ring object, and runs what its layer asks (``te_kernel``: a qkv_wgrad runs
bulk). ``qkv_dgrad``/``fc1_dgrad`` given a method other than ``bulk`` move to TE's reduce-scatter
lists (455-468; the file may then not set their ``*_wgrad``, asserted at 462).

A buffer's method makes only its object: ring_exchange a ``CommOverlapP2P``, any other a
``CommOverlap`` (``add_ub``). Which overlap runs is the layer's (``te_kernel``, ``ROLES``).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from advisor.errors import AdvisorError

METHODS = ("ring_exchange", "pipeline", "bulk", "external")

DEFAULT_METHODS = {
    "qkv_fprop": "ring_exchange", "fc1_fprop": "ring_exchange", "proj_dgrad": "ring_exchange",
    "fc2_dgrad": "ring_exchange", "proj_fprop": "pipeline", "fc2_fprop": "pipeline",
    "qkv_dgrad": "bulk", "qkv_wgrad": "bulk", "fc1_dgrad": "bulk", "fc1_wgrad": "bulk",
    "proj_wgrad": "external", "fc2_wgrad": "external",
}
"""``initialize_ub``'s ``methods``: every buffer a Transformer Engine layer asks for, and its method."""

ALL_GATHERS = ("qkv_fprop", "qkv_dgrad", "proj_dgrad", "proj_wgrad", "fc1_fprop", "fc1_dgrad", "fc2_dgrad",
               "fc2_wgrad")
"""``layers_all_gather_overlap``: buffers whose collective is an all-gather (never ``pipeline``)."""

ROLES = {
    "qkv_fprop": "all_gather", "fc1_fprop": "all_gather", "proj_dgrad": "all_gather", "fc2_dgrad": "all_gather",
    "proj_fprop": "reduce_scatter", "fc2_fprop": "reduce_scatter",
    "qkv_dgrad": "bulk_all_gather", "fc1_dgrad": "bulk_all_gather",
    "qkv_wgrad": "bulk_reduce_scatter", "fc1_wgrad": "bulk_reduce_scatter",
    "proj_wgrad": "external", "fc2_wgrad": "external",
}
"""What TE 2.9's layers ask of each buffer under Megatron-LM's default sub-options
(tp_comm_overlap_ag/rs, bulk_dgrad/wgrad on, tp_comm_overlap_rs_dgrad off; others: ``LayerOverlaps.role``;
core_v0.15.2 ``model_parallel_config.py``), whatever the file's method. TE v2.9
``pytorch/module/linear.py`` (flags by parallel mode 1165-1189; forward 149-154; backward 535-554,
723-725) and ``layernorm_linear.py`` (1232-1256; 179-184; 586-605, 728-730, 863-865): the
row-parallel projection and FC2 a non-bulk GEMM with ``ub_type`` RS on ``*_fprop`` (forward) and AG
on ``*_dgrad`` (backward); the column-parallel QKV and FC1 AG on ``*_fprop``, and in the backward
``bulk_overlap=True`` with AG on ``*_dgrad`` (the input's re-gather beside dgrad) and RS on
``*_wgrad`` (dgrad's reduce-scatter beside wgrad); ``*_wgrad`` of the projection and FC2 the
gathered gradient's reuse (external). ``module/base.py`` ``add_ub`` (418-449): ring_exchange makes
a ``CommOverlapP2P``, any other method a ``CommOverlap``, the only thing the method decides."""



@dataclass(frozen=True, kw_only=True, slots=True)
class LayerOverlaps:
    """Which userbuffers overlaps Megatron-LM asks Transformer Engine's layers for: its
    --tp-comm-overlap sub-options (``TensorParallel``), as ``extensions/transformer_engine.py``
    (core_v0.15.2 and core_v0.19.0) passes them: ``TELinear`` (the row-parallel projection and FC2)
    gets ``ub_overlap_ag``/``ub_overlap_rs``; ``TELayerNormColumnParallelLinear`` (QKV, FC1)
    ``ub_overlap_ag``, ``ub_overlap_rs_dgrad``, ``ub_bulk_dgrad``, ``ub_bulk_wgrad``. The defaults
    are Megatron's (``model_parallel_config.py``), which ``ROLES`` describes."""

    overlap_ag: bool = True
    """ub_overlap_ag: the column layers' input all-gather in the forward, the row layers' output
    gradient all-gather in the backward (TE 2.9 ``linear.py``/``layernorm_linear.py`` ``__init__``:
    ``ub_overlap_ag_fprop`` where column-parallel, ``ub_overlap_ag_dgrad`` where row-parallel)."""
    overlap_rs: bool = True
    """ub_overlap_rs: the row layers' output reduce-scatter in the forward (``ub_overlap_rs_fprop``)."""
    overlap_rs_dgrad: bool = False
    """ub_overlap_rs_dgrad: the column layers' dgrad reduce-scatter beside dgrad itself, on the
    ``*_dgrad`` buffer (``CommOverlapType.RS``, not bulk); TE then turns both bulk overlaps off
    (``ub_bulk_dgrad``/``ub_bulk_wgrad`` are set ``and not self.ub_overlap_rs_dgrad``)."""
    bulk_dgrad: bool = True
    """ub_bulk_dgrad: the column layers' input re-gather beside dgrad (``*_dgrad``, bulk)."""
    bulk_wgrad: bool = True
    """ub_bulk_wgrad: the column layers' dgrad reduce-scatter beside wgrad (``*_wgrad``, bulk)."""

    def role(self, name: str) -> str | None:
        """What the layer asks of buffer ``name`` (``ROLES``' names), or None where it runs that
        collective without userbuffers: NCCL's ``gather_along_first_dim`` /
        ``reduce_scatter_along_first_dim`` (TE 2.9 ``layernorm_linear.py`` forward 253-265 and
        backward 586-605, 654-674, 738-753; ``linear.py`` the same for the row layers)."""
        stem, _, kind = name.partition("_")
        column = stem in ("qkv", "fc1")
        if kind == "fprop":
            return ROLES[name] if (self.overlap_ag if column else self.overlap_rs) else None
        if not column:  # proj/fc2 dgrad (the gradient's gather) and wgrad (its external reuse)
            return ROLES[name] if self.overlap_ag else None
        if self.overlap_rs_dgrad:
            return "reduce_scatter" if kind == "dgrad" else None
        return ROLES[name] if (self.bulk_dgrad if kind == "dgrad" else self.bulk_wgrad) else None


MEGATRON_OVERLAPS = LayerOverlaps()
"""Megatron-LM's default sub-options: every buffer runs its ``ROLES`` role."""

KEYS = ("method", "is_reduce_scatter", "num_sm", "cga_size", "set_sm_margin", "num_splits", "aggregate",
        "atomic_gemm", "use_ce", "fp8_buf", "comm_priority", "gemm_priority", "pipeline_rs_overlap_first_gemm")
"""``add_ub``'s keyword arguments: what a buffer's mapping may set."""


@dataclass(frozen=True, kw_only=True, slots=True)
class Userbuffer:
    """One buffer's settings, as ``get_default_config`` and the file leave them. Priced: method,
    num_sm, set_sm_margin, num_splits, fp8_buf (under --fp8-format). Read but not priced: cga_size,
    aggregate, atomic_gemm, use_ce, the stream priorities."""

    method: str
    """ring_exchange, pipeline, bulk or external."""
    num_sm: int
    """SMs the communication kernels run on (1 for ring exchange, 16 otherwise, by default)."""
    set_sm_margin: bool
    """Whether the GEMM beside the collective gives those SMs up (``_math_sms = sm_count - num_sm``)."""
    num_splits: int
    """The pipeline method's chunks (4 by default; ring exchange always runs TP chunks)."""
    is_reduce_scatter: bool | None = None
    """The file's ``is_reduce_scatter``; None where it leaves TE's (``UserbuffersConfig.reduce_scatter``).
    What it decides (TE 2.9 base.py): whether ``pipeline`` is allowed (380-383), and the type of a
    ring-exchange object (424), whose buffer is 2 TP - 1 chunks of 1/TP for a reduce-scatter
    (``comm_gemm_overlap.cpp`` 673-677); the other object does not take it (428-441)."""
    fp8_buf: bool = False
    """Whether the buffer holds FP8 in an FP8 run, as ``initialize_ub`` decides it: every all-gather
    buffer (``layers_all_gather_overlap``), and a buffer of TE's ``methods["pipeline"]`` list whose
    mapping sets fp8_buf. That list is TE's default methods (proj_fprop, fc2_fprop), not the file's:
    only a non-bulk qkv_dgrad/fc1_dgrad moves to the list of its own method. So proj_fprop set to
    ring_exchange with fp8_buf is FP8, qkv_wgrad set to pipeline with fp8_buf is not."""


def te_kernel(name: str, method: str, role: str | None = None) -> str:
    """The overlap TE 2.9 runs for buffer ``name`` made by ``method``: ring_exchange, pipeline,
    bulk or external (``advisor.throughput.userbuffers.exposed``'s names); ValueError where it
    fails at run time. ``csrc/extensions/gemm.cpp`` (``gemm``, v2.9 lines 266-305) calls
    ``bulk_overlap`` where the layer passes ``bulk_overlap``, else ``split_overlap_ag`` for AG and
    ``split_overlap_rs`` for RS, on the buffer's object whatever its method: so ``num_splits``
    counts only for a pipelined reduce-scatter, and ``num_sm``/``set_sm_margin`` for every object.
    ``common/include/transformer_engine/comm_gemm_overlap.h``: ``CommOverlapBase`` (any method but
    ring_exchange) pipelines the RS in ``num_splits`` chunks and refuses ``split_overlap_ag``
    (lines 200-206, "Operation not supported."); ``CommOverlapP2PBase`` (ring_exchange) runs AG and
    RS as TP point-to-point chunks and refuses ``bulk_overlap`` (lines 267-273). ``role``: what
    the layer asks of the buffer (``LayerOverlaps.role``), default Megatron's (``ROLES``)."""
    role = role or ROLES[name]
    ring = method == "ring_exchange"
    if role in ("bulk_all_gather", "bulk_reduce_scatter"):
        if ring:
            raise ValueError("ring_exchange does not run here: the layer asks this buffer for a bulk overlap, which "
                             "Transformer Engine's ring-exchange object refuses ('Operation not supported'); use "
                             "bulk or pipeline (both run bulk)")
        return "bulk"
    if role == "all_gather" and not ring:
        raise ValueError(f"{method} does not run for an all-gather beside its GEMM: only ring_exchange does "
                         "(Transformer Engine's other object refuses split_overlap_ag: 'Operation not supported')")
    if role == "external":
        return "external"
    return "ring_exchange" if ring else "pipeline"


def default_buffer(name: str, method: str | None = None) -> Userbuffer:
    """``get_default_config(name)``: ring exchange on 1 SM without a margin, else 16 SMs with one,
    and 4 pipeline splits; ``method``: the one ``initialize_ub`` moved the buffer to (a non-bulk
    qkv_dgrad/fc1_dgrad), whose defaults it then takes."""
    method = method or DEFAULT_METHODS[name]
    ring = method == "ring_exchange"
    return Userbuffer(method=method, num_sm=1 if ring else 16, set_sm_margin=not ring, num_splits=4,
                      fp8_buf=_all_gather(name, method))


def _all_gather(name: str, method: str) -> bool:
    """Whether ``name`` run by ``method`` is an all-gather buffer: a non-bulk qkv_dgrad/fc1_dgrad
    is a reduce-scatter (``initialize_ub`` moves it off ``layers_all_gather_overlap``)."""
    return name in ALL_GATHERS and not (name in ("qkv_dgrad", "fc1_dgrad") and method != "bulk")


@dataclass(frozen=True, slots=True)
class UserbuffersConfig:
    """A --tp-comm-overlap-cfg file read: the buffers it sets, each merged over its default."""

    path: str
    buffers: tuple[tuple[str, Userbuffer], ...] = ()

    def buffer(self, name: str) -> Userbuffer:
        """``name``'s settings: the file's where it sets the buffer, else the default."""
        return dict(self.buffers).get(name) or default_buffer(name)

    def kernel(self, name: str, overlaps: LayerOverlaps = MEGATRON_OVERLAPS) -> str | None:
        """The overlap TE 2.9 really runs for buffer ``name`` (``te_kernel``): its layer's role and
        the file's method, which chooses only ring exchange or not. The one reading of the method
        that the time and the memory models price: ``proj_fprop: {method: bulk}`` runs pipelined,
        ``qkv_wgrad: {method: pipeline}`` and a non-bulk ``qkv_dgrad`` run bulk. None where
        ``overlaps`` (Megatron's sub-options) leave the buffer unused: its collective runs in NCCL."""
        role = overlaps.role(name)
        return None if role is None else te_kernel(name, self.buffer(name).method, role)

    def reduce_scatter(self, name: str) -> bool:
        """Whether buffer ``name`` is a reduce-scatter (``initialize_ub``'s
        ``layers_reduce_scatter_overlap``): proj_fprop, fc2_fprop, and qkv_wgrad/fc1_wgrad, except
        that a non-bulk qkv_dgrad/fc1_dgrad takes its wgrad's place there (the wgrad buffer is still
        made, as a bulk all-gather that never runs); the file's ``is_reduce_scatter`` where it sets
        one (``ub_cfg.update`` overrides ``get_default_config``'s)."""
        given = dict(self.buffers).get(name)
        if given is not None and given.is_reduce_scatter is not None:
            return given.is_reduce_scatter
        if name in ("qkv_dgrad", "fc1_dgrad"):
            return self.buffer(name).method != "bulk"
        if name in ("qkv_wgrad", "fc1_wgrad"):
            return self.buffer(name.replace("wgrad", "dgrad")).method == "bulk"
        return name in ("proj_fprop", "fc2_fprop")

    def fp8_reduce_scatters(self, overlaps: LayerOverlaps = MEGATRON_OVERLAPS) -> tuple[str, ...]:
        """The buffers a GEMM writes its output to for a reduce-scatter (``overlaps.role``) that hold
        FP8 in an FP8 run (``Userbuffer.fp8_buf``): the file's fp8_buf on proj_fprop/fc2_fprop; with
        --tp-comm-overlap-rs-dgrad, qkv/fc1_dgrad too, which are FP8 by TE's default (all-gather
        buffers) unless the file moves them off bulk without fp8_buf. Under Megatron's default
        sub-options a qkv/fc1 dgrad moved to pipeline with fp8_buf is FP8 too, but its layer
        all-gathers FP8 input there."""
        given = dict(self.buffers)
        names = [*given, *(name for name in DEFAULT_METHODS if name not in given)]  # the file's order first
        return tuple(name for name in names
                     if self.buffer(name).fp8_buf and overlaps.role(name) in ("reduce_scatter", "bulk_reduce_scatter"))

    def bf16_all_gathers(self, overlaps: LayerOverlaps = MEGATRON_OVERLAPS) -> tuple[str, ...]:
        """The buffers a layer all-gathers its input into (``overlaps.role``) that stay BF16 in an FP8
        run: a qkv/fc1_dgrad the file moves off bulk without fp8_buf (``initialize_ub`` takes it off
        ``layers_all_gather_overlap``), where the bulk dgrad still gathers the FP8 input."""
        return tuple(name for name, buffer in self.buffers
                     if not buffer.fp8_buf and overlaps.role(name) in ("all_gather", "bulk_all_gather"))


TE_DEFAULTS = UserbuffersConfig("")
"""No file: every buffer at ``get_default_config``."""


def _problem(path: str, name: str, what: str) -> AdvisorError:
    return AdvisorError(f"--tp-comm-overlap-cfg {path}: {name}: {what}")


def _whole(path: str, name: str, key: str, value, least: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise _problem(path, name, f"{key} must be a whole number >= {least}, got {value!r}")
    return value


def _flag(path: str, name: str, key: str, value) -> bool:
    if value not in (0, 1):  # True/False or 0/1, as the recipes write it (a bool in add_ub)
        raise _problem(path, name, f"{key} must be true, false, 0 or 1, got {value!r}")
    return bool(value)


def _reduce_scatter(path: str, name: str, method: str, given: dict) -> bool | None:
    """The file's ``is_reduce_scatter`` (None where it leaves it), refused where TE 2.9 then raises
    or fails: ``pipeline`` on a buffer that is not a reduce-scatter (base.py 380-383, ValueError,
    whatever the file says the buffer is), and a ring-exchange object of the other direction than
    its layer's GEMM (base.py 424 makes it by the flag): an all-gather's layer asks the whole
    buffer as the gathered input, and a reduce-scatter's object is 2 TP - 1 chunks of 1/TP
    (``CommOverlapP2P::get_buffer``, pytorch/csrc/extensions/comm_gemm_overlap.cpp 289-291:
    "Invalid shape for a Userbuffers buffer"); a reduce-scatter's GEMM receives chunks TP to
    2 TP - 2 (``CommOverlapP2PBase::split_overlap_rs``, comm_gemm_overlap.cpp 1166-1170) into an
    all-gather's object of TP chunks (673-677), past its buffer."""
    flag = None if "is_reduce_scatter" not in given else _flag(path, name, "is_reduce_scatter",
                                                                given["is_reduce_scatter"])
    scatter = not _all_gather(name, method) if flag is None else flag  # get_default_config's, after the move
    if method == "pipeline" and not scatter:
        raise _problem(path, name, "pipeline is not supported for an all-gather (Transformer Engine refuses it"
                                   + (": is_reduce_scatter is false)" if flag is False else ")"))
    if flag is not None and te_kernel(name, method) == "ring_exchange" and flag != (ROLES[name] == "reduce_scatter"):
        made, runs = ("a reduce-scatter", "all-gathers") if flag else ("an all-gather", "reduce-scatters")
        raise _problem(path, name, f"is_reduce_scatter: {str(flag).lower()} makes {made} ring-exchange buffer, but "
                                   f"the layer {runs} there (Transformer Engine fails on it: the buffer's size is the "
                                   f"other direction's); leave is_reduce_scatter out")
    return flag


def _buffer(path: str, name: str, given) -> Userbuffer:
    """One buffer's mapping merged over its default, refused where ``add_ub`` would refuse it, or
    where the layer's GEMM then fails on the buffer's object (``te_kernel``, ``_reduce_scatter``)."""
    if not isinstance(given, dict):
        raise _problem(path, name, f"expected a mapping of settings, got {given!r}")
    unknown = sorted(set(given) - set(KEYS))
    if unknown:
        raise _problem(path, name, f"unknown setting {unknown[0]!r} (Transformer Engine's initialize_ub takes "
                                   f"{', '.join(KEYS)})")
    method = given.get("method", DEFAULT_METHODS[name])
    if method not in METHODS:
        raise _problem(path, name, f"method must be one of {', '.join(METHODS)}, got {method!r}")
    # initialize_ub moves a non-bulk dgrad to its method's list before taking the defaults
    base = default_buffer(name, method if name in ("qkv_dgrad", "fc1_dgrad") else None)
    if name in ("proj_wgrad", "fc2_wgrad") and method != "external":  # base.py 403-407; others may be external
        raise _problem(path, name, f"method must be external (Transformer Engine asserts it for proj_wgrad and "
                                   f"fc2_wgrad), got {method}")
    try:  # what the layer then runs on the buffer's object (te_kernel): refused where TE fails
        scatter = _reduce_scatter(path, name, method, given)
        te_kernel(name, method)
    except ValueError as exc:
        raise _problem(path, name, str(exc)) from None
    return Userbuffer(method=method, num_sm=_whole(path, name, "num_sm", given.get("num_sm", base.num_sm), 1),
                      set_sm_margin=_flag(path, name, "set_sm_margin", given.get("set_sm_margin", base.set_sm_margin)),
                      is_reduce_scatter=scatter,
                      num_splits=_whole(path, name, "num_splits", given.get("num_splits", base.num_splits), 1),
                      # initialize_ub (TE 2.9 base.py): fp8_buf = (name in layers_all_gather_overlap) or
                      # (user_ub_cfg[name].get("fp8_buf", False) and name in methods["pipeline"]), where
                      # methods is TE's default table, moved only for a non-bulk dgrad: base.method
                      fp8_buf=_all_gather(name, method) or (bool(given.get("fp8_buf")) and base.method == "pipeline"))


def parse_userbuffers(path: str, data) -> UserbuffersConfig:
    """The settings of a loaded file (``data``, what ``yaml.safe_load`` returned)."""
    if data is None:  # an empty file: initialize_ub takes None as no settings
        return UserbuffersConfig(path)
    if not isinstance(data, dict):
        raise AdvisorError(f"--tp-comm-overlap-cfg {path}: expected a mapping of buffer names, got {type(data).__name__}")
    buffers = []
    for name, given in data.items():
        if name not in DEFAULT_METHODS:
            raise _problem(path, name, f"not a userbuffers buffer (Transformer Engine's are {', '.join(DEFAULT_METHODS)})")
        buffers.append((name, _buffer(path, name, given)))
    for dgrad in ("qkv_dgrad", "fc1_dgrad"):
        wgrad = dgrad.replace("dgrad", "wgrad")
        if dgrad in data and dict(buffers)[dgrad].method != "bulk" and wgrad in data:
            raise _problem(path, wgrad, f"set beside a non-bulk {dgrad}, whose reduce-scatter replaces it "
                                        "(Transformer Engine asserts it absent)")
    return UserbuffersConfig(path, tuple(buffers))


def load_userbuffers(path: str) -> UserbuffersConfig:
    """The file at ``path`` (relative to the working directory, as Megatron-LM opens it) read and
    checked; AdvisorError (one line) where it is missing, not YAML, or a setting TE would refuse.
    Read every call (the options read it each time they are made): the file edited, or the same
    path from another working directory, is never answered from an earlier read."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except OSError as exc:
        raise AdvisorError(f"--tp-comm-overlap-cfg {path}: cannot read it ({exc.strerror or exc})") from None
    except UnicodeDecodeError:
        raise AdvisorError(f"--tp-comm-overlap-cfg {path}: not a UTF-8 text file (a YAML of userbuffers settings)") \
            from None
    return _parse_text(path, text)


@lru_cache(maxsize=32)
def _parse_text(path: str, text: str) -> UserbuffersConfig:
    """``text`` parsed as YAML and checked, kept by the text itself: PyYAML's pure-Python parse is
    about 4 ms for a recipe's file and a sweep makes its options about 9 times."""
    import yaml  # only a run with the file needs it: kept off the start-up

    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise AdvisorError(f"--tp-comm-overlap-cfg {path}: not YAML ({str(exc).splitlines()[0]})") from None
    return parse_userbuffers(path, data)
