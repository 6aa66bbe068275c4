"""Seed 004's per-GPU memory (Eq. 7-10, 13-17) of pipeline ranks as a function of the decoder
layers a rank holds, vectorised over layouts: ``StageModel``, what the split planners and the
sweep price thousands of layouts with, and ``StageTerms``, the per-stage bytes it reports.
``advisor.memory`` prices one layout with it and holds the options, checks and results.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np

from advisor import equations as eq
from advisor import memory_levers as levers
from advisor import memory_terms
from advisor import schedule
from advisor.models import LlamaSpec
from advisor.splits import per_rank

if TYPE_CHECKING:  # a run-time import would close a cycle: advisor.memory builds its estimates with StageModel
    from advisor.memory import MemoryOptions

@dataclass(frozen=True, slots=True)
class StageTerms:
    """Per-GPU bytes of pipeline stages as numpy arrays, one element per (layout, stage): what
    ``estimate_memory`` reports for one layout and ``advisor.space_pricer`` for thousands at once."""

    parameters: np.ndarray
    weights: np.ndarray
    gradients: np.ndarray
    optimizer: np.ndarray
    layer_activations: np.ndarray
    embedding_activations: np.ndarray
    output_activations: np.ndarray
    in_flight: np.ndarray
    """Microbatches in flight, in whole-stage units (``in_flight_microbatches``)."""

    @property
    def model_states(self) -> np.ndarray:
        return self.weights + self.gradients + self.optimizer

    @property
    def activations(self) -> np.ndarray:
        return self.layer_activations + self.embedding_activations + self.output_activations

    @property
    def total(self) -> np.ndarray:
        return self.model_states + self.activations


def head_shares_embedding(spec: LlamaSpec, pp):
    """Whether the LM head holds no weights of its own: with tied embeddings at PP 1 it uses the
    input embedding's (core_v0.15.2 models/gpt/gpt_model.py: the output layer skips its weight
    when pre_process and share_embeddings_and_output_weights). Tied at PP > 1, the last stage
    keeps its own copy of the embedding, kept equal to the first stage's by an all-reduce
    (models/common/language_module/language_module.py, setup_embeddings_and_output_layer); untied,
    the head is a matrix of its own. Elementwise over an array ``pp``."""
    return spec.tie_embeddings & (pp == 1)


def layer_bytes(spec: LlamaSpec, seq_len: int, mbs, tp, cp, options: MemoryOptions):
    """(kept, checkpoint): what one transformer layer keeps on one GPU for one microbatch, and
    what it keeps when fully recomputed.

    Everything is split over t x c (Eq. 15, 17), except, without sequence parallelism, the
    8sbh that tensor parallelism leaves whole on each TP rank."""
    t, c = np.asarray(tp), np.asarray(cp)
    replicated = 0 if options.sequence_parallel else eq.tensor_parallel_replicated_activation_bytes(spec, seq_len, mbs)
    whole = np.where(t == 1, 0, replicated)
    full = eq.layer_activation_bytes(spec, seq_len, mbs, options.fused_norms, options.flash_attention) - whole
    modules = options.recompute_modules if options.recompute == "selective" else frozenset()
    if not options.flash_attention and "core_attn" not in modules:
        # Unfused core attention's s^2 scores and K and V expanded to every head; recomputed, it
        # keeps none of them (Korthikanti et al. 2023, Table 2); with FlashAttention there are none.
        full = full + eq.unfused_attention_bytes(spec, seq_len, mbs)
    if not options.bias_swiglu_fusion and "mlp" not in modules:
        # --no-bias-swiglu-fusion: the eager SwiGLU's fifth h_ffn tensor beyond Eq. 12's four, split
        # over t c; a recomputed MLP keeps none
        full = full + eq.unfused_swiglu_bytes(spec, seq_len, mbs)
    kept = full / (t * c) + whole / c
    if modules - {"core_attn"}:
        hidden, ffn = eq.recomputed_module_bytes(spec, seq_len, mbs, modules, options.fused_norms)
        # the hidden-size inputs it frees are the projections' inputs that TP without SP leaves whole
        kept = kept - ffn / (t * c) - hidden / np.where(whole == 0, t * c, c)
    fp8_split, fp8_whole = levers.fp8_activation_saving(spec, seq_len, mbs, options)
    kept = kept - fp8_split / (t * c) - fp8_whole / np.where(whole == 0, t * c, c)
    # A checkpoint is the layer input: split like the other sequence-parallel tensors.
    checkpoint = eq.layer_checkpoint_bytes(spec, seq_len, mbs) / np.where(whole == 0, t * c, c)
    return kept, checkpoint


def _ceil_div(counts, divisor):
    """ceil(counts / divisor) of whole numbers (as floats or integers), as -(-counts // divisor)
    gives it: exact below 2^53 (the rounded quotient cannot cross a whole number), and several
    times faster on floats, whose floor division numpy computes as a divmod."""
    return np.ceil(counts / divisor)


def _uniform_transient(kept, checkpoint, chunk, unit, units, full_unit):
    """The most a chunk of ``chunk`` layers rebuilds at once above its checkpoints under the
    uniform method: its last unit (u layers, u kept layers minus its input, which is the
    checkpoint itself), or, with two units or more, a full unit of N while the last unit's
    checkpoint is already freed. ``units``: ceil(chunk / unit); ``full_unit``: unit x kept - 2 x
    checkpoint (the caller's, computed once)."""
    last_unit = chunk - unit * (units - 1)
    return np.where(chunk <= unit, chunk * kept - checkpoint, np.maximum(last_unit * kept - checkpoint, full_unit))


@dataclass(frozen=True, slots=True)
class _Lines:
    """What ``StageModel.most_layers`` inverts, per line of its total (a leading axis of lines)
    and layout, computed once per model: the same operations on the same values as at each
    bound, so the same bytes."""

    fixed: np.ndarray
    """The line's total at 0 layers (total(0) plus its buffers' intercept)."""
    slope: np.ndarray
    """Buffer bytes per layer the line adds to ``total`` without its buffers."""
    intercept: np.ndarray
    beyond_cost: np.ndarray
    """(c - k) N F: the checkpoints in place of kept layers, beyond q = N."""
    beyond_slope: np.ndarray
    """s v + k F: total(v q) per q beyond N (s: a layer's model states, k: a kept layer)."""
    within_slope: np.ndarray
    """s v + c F: total(v q) per q up to N (c: a checkpoint)."""
    start: np.ndarray | None = None
    """With interleaving: r from which R_r gains p per chunk (v - E // p)."""
    few_slope: tuple = ()
    """s + c R p per layer of the last r < start chunks, as (c a checkpoint, c a kept layer)."""
    rest_cost: tuple = ()
    """c (E - (E // p) p - start p): the rest's passes below the line from start on (the pair)."""
    many_slope: tuple = ()
    """s + c (R + 1) p per layer of the last r >= start chunks (the pair)."""


_PER_RANK = ("kept", "checkpoint", "layer_parameters", "weight_bytes", "gradient_bytes", "optimizer_bytes",
             "layer_extra_bytes", "vpp", "recompute_layers")
"""``StageModel``'s per-layout terms that ``total`` reads at every call, each kept as wide as the
ranks (``splits.per_rank``: the planners call ``total`` several times for each model built or
taken; the 405B levers sweep on 16,384 GPUs ran 2% fewer instructions)."""


_NOTHING_ADDED = 0.0
"""``StageModel.added`` of a model that is not calibrated (``total`` then adds nothing)."""


class StageModel:
    """Seed 004's Eq. 7-10 and 13-17 for pipeline ranks of layouts, as a function of the decoder
    layers a rank holds: everything that does not depend on that count is computed once here, so
    that ``terms(layers)`` and ``total(layers)`` are cheap for the split planners. Every layout
    quantity may be a numpy array (they broadcast); ``num_microbatches`` may be inf (no cap).

    ``recompute_layers`` is N of full recomputation per layout (0: none); by default the
    options' N when they ask for it.

    ``calibrated`` (``advisor.verdicts.CalibratedTerms`` of these stages) makes ``total`` and
    ``most_layers`` the calibrated model's usage instead of Eq. 18: every activation term is
    linear in the bytes a layer keeps and its checkpoint, so their factors scale those, and the
    bytes it adds join the fixed part. Such a model prices splits only (no ``terms``)."""

    def __init__(self, spec: LlamaSpec, seq_len: int, options: MemoryOptions, *, tp, cp, dp, mbs, pp, vpp,
                 num_microbatches, stage, recompute_layers=None, calibrated=None) -> None:
        t, c, d, b, p, i = (np.asarray(x) for x in (tp, cp, dp, mbs, pp, stage))
        # VPP and N as floats: every term they meet is one, and an int64 operand costs numpy a
        # buffered cast at each call (whole numbers: the same values)
        v = np.asarray(vpp, dtype=float)
        if recompute_layers is None:
            recompute_layers = options.recompute_num_layers if options.recompute == "full" else 0
        vocab = eq.padded_vocab_size(spec.vocab_size, options.vocab_divisible_by, t)
        first, last = i == 0, i == p - 1
        embedding = eq.embedding_parameters(spec, t, vocab)
        head = np.where(head_shares_embedding(spec, p), 0, embedding)
        self.layer_parameters = eq.layer_parameters(spec, t)  # Eq. 6
        # optim_grads's buckets are cut over the weights in order (memory_levers.fsdp_optim_grads_peak),
        # the first stage's embedding and the last's final norm and output layer among them
        self.layer_weights, self.queue_replay, self.end_elements = None, None, 0.0  # read under optim_grads alone
        if options.fsdp_strategy == "optim_grads":
            self.layer_weights = levers.layer_weights(spec, t)
            ends = levers.stage_ends(spec, t, p, i, vocab)
            self.end_elements = sum(levers.end_sizes(*ends)[:3])  # what the replay holds beyond the layers at most
            self.queue_replay = levers.QueueReplay(
                self.layer_weights, levers.fsdp_bucket_size(options, d * c),
                levers.fsdp_communication_unit(options, self.layer_parameters, 1, d * c)[1], ends, spec.num_layers)
        self.num_layers = spec.num_layers  # the most a rank holds: the replay's cap (_lines)
        self.end_parameters = np.where(first, embedding, 0) + np.where(last, eq.final_norm_parameters(spec) + head, 0)
        # Eq. 4 and 10, with the levers' sharding and offload (advisor.memory_levers)
        self.weight_bytes, self.gradient_bytes, self.optimizer_bytes = levers.state_bytes_per_parameter(options, d * c)
        self.layer_extra_bytes = levers.fp8_weight_bytes_per_layer(spec, t, options)
        self.fp8 = options.fp8_format is not None
        self.options = options
        self.dp_cp = d * c  # Megatron-FSDP's budgets may grow with it (memory_levers.fsdp_communication_unit)
        sharding = levers.SHARDING[options.fsdp_strategy]
        self.buffered = sharding is not None and sharding[1]  # Megatron-FSDP's unsharded gradient queue
        dtype_scale = options.element_bytes / eq.WEIGHT_BYTES  # the equations count BF16 bytes
        kept, checkpoint = layer_bytes(spec, seq_len, b, t, c, options)
        self.kept, self.checkpoint = kept * dtype_scale, checkpoint * dtype_scale
        # --transformer-impl local (``fused_norms`` False): megatron-core's global memory buffer,
        # kept once per process by a stage with decoder layers (``layer_activations``)
        self.local_buffer = not options.fused_norms
        self.attention_buffer = memory_terms.local_attention_buffer(spec, seq_len, b, t, options)
        self.vpp, self.recompute_layers = v, np.asarray(recompute_layers, dtype=float)
        self.recomputing = bool((self.recompute_layers > 0).any())
        self.interleaved = bool((v > 1).any())
        self.uniform = options.recompute_method == "uniform"
        self.in_flight = schedule.InFlight.at(i, p, v, num_microbatches)
        # Eq. 17: TP with SP, and CP, split every activation; without SP only CP splits the
        # hidden states around the embedding and the LM head.
        sharded = t * c
        whole = sharded if options.sequence_parallel else c
        # Eq. 13: 8sbh per microbatch in flight on the first chunk of the first stage
        self.embedding_activations = np.where(
            first, eq.embedding_activation_bytes(spec, seq_len, b) * self.in_flight.first_chunk() / whole, 0.0)
        # Eq. 14: the last stage runs each microbatch's backward at once
        self.output_activations = np.where(
            last, eq.output_hidden_activation_bytes(spec, seq_len, b) * dtype_scale / whole
            + memory_terms.loss_logits_bytes(spec, seq_len, b, vocab, options.cross_entropy_fusion) / sharded, 0.0)
        self.calibrated, self.added, self._total_at_zero, self._constants = calibrated is not None, _NOTHING_ADDED, None, {}
        if calibrated is not None:
            self.kept, self.checkpoint = self.kept * calibrated.layer_factor, self.checkpoint * calibrated.layer_factor
            self.attention_buffer = self.attention_buffer * calibrated.buffer_factor
            self.embedding_activations = self.embedding_activations * calibrated.embedding_factor
            self.output_activations = self.output_activations * calibrated.output_factor
            self.added = calibrated.added
        for name in _PER_RANK:
            setattr(self, name, per_rank(getattr(self, name), np.shape(self.in_flight.passes)))

    def take(self, rows: np.ndarray, count: int, recompute_layers) -> StageModel:
        """This model for layouts ``rows`` of its ``count`` (the leading axis of every per-layout
        array) with ``recompute_layers`` N: what building it for them gives, without pricing
        again what N does not change (the sweep's planners step N over the same layouts).

        Only the layer activations read N, except the calibrated layer factor, which reads
        whether N > 0: a calibrated model must keep that per layout (``advisor.space_pricer``'s pricer
        takes from one built with the same). Every array is elementwise in the layouts, so its
        rows are the values a new build computes; what reduces over layouts is recomputed.

        total(0) (``_fixed``) reads no N either (no layers, no layer activations at any N), so
        it is computed here once and its rows taken: the 405B levers sweep took about 200
        models, each of which computed its own."""
        self._fixed()
        new = object.__new__(StageModel)
        for name, value in vars(self).items():
            setattr(new, name, _rows_of(value, rows, count))
        new.in_flight = schedule.InFlight(**{name: _rows_of(getattr(self.in_flight, name), rows, count)
                                             for name in schedule.InFlight.__dataclass_fields__})
        if self.layer_weights is not None:
            new.layer_weights = tuple(_rows_of(value, rows, count) for value in self.layer_weights)  # one array a weight
        new.queue_replay = None if self.queue_replay is None else self.queue_replay.take(rows, count)
        new.recompute_layers = per_rank(np.asarray(recompute_layers, dtype=float), np.shape(new.in_flight.passes))
        new._constants = {}  # N's constants start anew
        new.recomputing = bool((new.recompute_layers > 0).any())
        new.interleaved = bool((new.vpp > 1).any())
        return new

    def layer_activations(self, layers):
        """Activations of a rank's transformer layers at its peak, all microbatches in flight
        (Eq. 16-17), and, under --transformer-impl local, megatron-core's global memory buffer
        that their attention keeps once for the stage (``attention_buffer``,
        ``equations.local_attention_buffer_bytes``) where it holds any layer."""
        layers = np.asarray(layers)
        held = self._held_activations(layers)
        if not self.local_buffer:
            return held
        return held + np.where(layers > 0, self.attention_buffer, 0.0)

    def _held_activations(self, layers):
        """``layer_activations`` without the buffer: what the layers keep for their backward.

        The rank's ``layers`` are split over its v chunks as evenly as possible, the remainder
        on its last chunks; chunk k holds phi_k microbatches (``advisor.schedule``). With
        X = sum_k phi_k x (layers of chunk k), the rank keeps X layer-microbatches.

        Full recomputation (Megatron's ``--recompute-granularity full``, per model chunk):
        ``block`` checkpoints the first N layers of each chunk (each layer alone), ``uniform``
        every unit of N layers (ceil(layers/N) inputs). A recomputed unit's activations are
        rebuilt for one microbatch during its backward pass; that transient adds to the peak
        when the chunk has no whole layer left to free first (block: every layer recomputed;
        uniform: always); a rebuilt layer's input is the checkpoint itself. With interleaving,
        the larger of the two chunk sizes' transients (their first backward passes need not
        come first)."""
        kept, checkpoint, vpp, n = self.kept, self.checkpoint, self.vpp, self.recompute_layers
        if self.interleaved:  # chunks of q layers, the last r of q + 1: np.divmod's, without its slow float divmod
            per_chunk = np.floor(layers / vpp)  # exact for whole numbers below 2^53, as in _ceil_div
            extra = layers - per_chunk * vpp
            larger = self.in_flight.last_chunks(extra)
        else:
            per_chunk, extra, larger = layers, 0, 0
        passes = self.in_flight.passes
        held = per_chunk * passes + larger if self.interleaved else per_chunk * passes  # X (no 0 added: the same)
        if not self.recomputing:  # what both methods below give with N = 0, without their zero terms
            return np.where(layers > 0, kept * held, 0.0)
        if self.uniform:
            recomputed = self._uniform_activations(per_chunk, extra, larger, held)
        else:
            checkpointed = np.where(n > per_chunk, held, self._constant("n passes", lambda: n * passes))
            # sum_k phi_k min(N, layers of chunk k); one layer rebuilt where all are recomputed
            transient = np.where(n >= per_chunk, self._rebuilt(), 0)
            recomputed = checkpoint * checkpointed + kept * (held - checkpointed) + transient
        return np.where(layers > 0, recomputed, 0.0)

    def _uniform_activations(self, per_chunk, extra, larger, held):
        """``layer_activations`` of the uniform method where N > 0 (kept whole where N = 0). Without
        interleaving (``larger`` and ``extra`` 0) the terms of the chunks of q + 1 layers are
        zeros: left out, the same bytes."""
        kept, checkpoint, passes, n = self.kept, self.checkpoint, self.in_flight.passes, self.recompute_layers
        unit = self._constant("unit", lambda: np.maximum(n, 1))
        full_unit = self._constant("full unit", lambda: unit * kept - 2 * checkpoint)
        units = _ceil_div(per_chunk, unit)
        transient = _uniform_transient(kept, checkpoint, per_chunk, unit, units, full_unit)
        if self.interleaved:
            more = _ceil_div(per_chunk + 1, unit)
            units = units * (passes - larger) + more * larger
            transient = np.maximum(
                np.where(extra < self.vpp, transient, 0),
                np.where(extra > 0, _uniform_transient(kept, checkpoint, per_chunk + 1, unit, more, full_unit), 0))
        else:
            units, transient = units * passes, np.maximum(transient, 0.0)
        return np.where(n > 0, checkpoint * units + transient, kept * held)

    def _constant(self, name: str, compute):
        """What ``compute()`` gives from this model's per-layout arrays alone (no layer count):
        computed at its first use, then kept (``take`` starts a new store)."""
        if name not in self._constants:
            self._constants[name] = compute()
        return self._constants[name]

    def _rebuilt(self):
        """The layer a fully recomputed chunk rebuilds above its checkpoint: a kept layer less its
        input (0 where N = 0)."""
        n, kept, checkpoint = self.recompute_layers, self.kept, self.checkpoint
        return self._constant("rebuilt", lambda: np.where(n > 0, kept - checkpoint, 0))

    def most_layers(self, bound, low, high):
        """The most layers n in [low, high] with total(n) <= bound (low - 1 where none), in closed
        form; None with the uniform method (no closed form: the planner bisects).

        With n = v q + r (chunks of q layers, the last r of q + 1), the block method gives
        total(v q) = two lines in q: up to q = N every layer recomputed (a checkpoint per
        microbatch in flight, and one layer rebuilt), beyond it each further layer kept whole;
        and total(v q + r) - total(v q) = s r + c R_r, with s a layer's model states, c the
        checkpoint (q < N) or a kept layer, and R_r the passes in flight of the last r chunks,
        itself two lines in r (``schedule.InFlight``).

        Megatron-FSDP's buffers (``memory_levers.fsdp_buffer_bytes``) are each the smaller of two
        lines in n (n layers' worth, or a capped queue): the total is the smallest of the
        totals with one line of each, each of the form above (another slope s, another fixed
        part), and each increasing in n, so n is the largest of their inverses.

        The estimate is then corrected by evaluating ``total`` beside it, so rounding cannot move
        the answer; should it not settle within v + 2 steps, None (the planner bisects)."""
        if self.uniform and (self.recompute_layers > 0).any():
            return None
        # the largest of the lines' inverses, all lines at once (a leading axis of them)
        estimate = self._inverse(bound, high).max(axis=0)
        estimate = np.minimum(np.maximum(estimate, low - 1), high).astype(np.int64)  # np.clip, without its wrapper
        for _ in range(int(np.max(self.vpp)) + 2):  # one step fixes rounding; more would mean a wrong estimate
            # total beside the estimate, a call per count: stacked into one call, every per-layout
            # term broadcasts over a third axis, which costs numpy more than the second call
            above, at = self.total(np.minimum(estimate + 1, high)), self.total(np.maximum(estimate, low))
            up = (estimate < high) & (above <= bound)
            down = (estimate >= low) & (at > bound)
            if not (up.any() or down.any()):
                return estimate
            estimate = estimate + up - down
        return None

    def _fixed(self):
        """``_lines``' total(0), which no bound changes: computed once per model (``take`` takes
        its rows). Without Megatron-FSDP's buffers where the replay's lines carry them, which
        total(0) would hold already (optim_grads: the first or last stage's ends)."""
        if self._total_at_zero is None:
            self._total_at_zero = self.total(0, buffers=self.queue_replay is None)
        return self._total_at_zero

    def _inverse(self, bound, high):
        """``most_layers``' estimate for each of its lines (``_Lines``, a leading axis of them)."""
        line = self._constant("lines", self._lines)
        n, v, fixed = self.recompute_layers, self.vpp, line.fixed
        beyond = np.floor((bound - fixed - line.beyond_cost) / line.beyond_slope)
        within = np.minimum(np.floor((bound - fixed - self._rebuilt()) / line.within_slope), n)
        q = np.where(beyond > n, beyond, np.where(within >= 1, within, np.where(bound >= fixed, 0, -1)))
        q = np.minimum(np.maximum(q, -1), np.maximum(np.floor(high / v), 0))  # high // v: exact, as in _ceil_div
        estimate = v * q
        if self.interleaved:
            at = np.maximum(estimate, 0)
            budget = bound - (self.total(at, buffers=False) + line.slope * at + line.intercept)
            recomputed, start = n > q, line.start  # c: a checkpoint where recomputed, else a kept layer
            few = np.minimum(np.floor(budget / np.where(recomputed, *line.few_slope)), start - 1)
            many = np.floor((budget - np.where(recomputed, *line.rest_cost)) / np.where(recomputed, *line.many_slope))
            extra = np.minimum(np.maximum(np.where(many >= start, many, np.maximum(few, 0)), 0), v - 1)
            estimate = np.where(q >= 0, estimate + extra, -1)
        return estimate

    def _lines(self) -> _Lines:
        """``_Lines`` of this model (``most_layers``' docstring): one line without Megatron-FSDP's
        buffers, one per choice of a line of each buffer with them."""
        fixed, n, passes, v = self._fixed(), self.recompute_layers, self.in_flight.passes, self.vpp
        kept, checkpoint = self.kept, self.checkpoint
        if self.local_buffer:  # the lines are of ranks with layers, which keep the buffer; total(0) has none
            fixed = fixed + self.attention_buffer
        per_layer = self.layer_parameters * (self.weight_bytes + self.gradient_bytes + self.optimizer_bytes) \
            + self.layer_extra_bytes
        if self.buffered:
            lines = [(fixed + intercept, per_layer + slope, slope, intercept)
                     for slope, intercept in levers.fsdp_buffer_lines(
                         self.options, self.layer_parameters, self.dp_cp, self.layer_weights,
                         None if self.queue_replay is None else self.queue_replay.most(self.num_layers),
                         self.end_elements)]
        else:
            lines = [(fixed, per_layer, 0.0, 0.0)]
        shape = (len(lines),) + np.broadcast_shapes(*(np.shape(value) for line in lines for value in line))
        fixed, per_layer, slope, intercept = (np.empty(shape) for _ in range(4))  # every term is a float
        for i, line in enumerate(lines):
            fixed[i], per_layer[i], slope[i], intercept[i] = line
        interleaved = {}
        if self.interleaved:
            pp, rounds, rest, filled = self.in_flight.pp, self.in_flight.rounds, self.in_flight.rest, self.in_flight.filled
            start = v - filled  # R_r gains p per chunk from r = v - filled on, plus the partial chunk
            pair = (checkpoint, kept)
            interleaved = dict(start=start, few_slope=tuple(per_layer + c * rounds * pp for c in pair),
                               rest_cost=tuple(c * (rest - filled * pp - start * pp) for c in pair),
                               many_slope=tuple(per_layer + c * (rounds + 1) * pp for c in pair))
        return _Lines(fixed=fixed, slope=slope, intercept=intercept, beyond_cost=(checkpoint - kept) * n * passes,
                      beyond_slope=per_layer * v + kept * passes, within_slope=per_layer * v + checkpoint * passes,
                      **interleaved)

    def parameters(self, layers):
        return np.asarray(layers) * self.layer_parameters + self.end_parameters

    def states(self, layers, parameters, buffers: bool = True):
        """(weights, gradients, optimizer) bytes of a rank: per parameter (Eq. 4, 10 with the
        levers' sharding), plus Transformer Engine's FP8 weight copies per layer and
        Megatron-FSDP's gathered weights and queued gradients (``advisor.memory_levers``;
        without them where not ``buffers``)."""
        if not (self.fp8 or (self.buffered and buffers)):  # the sums below with only zeros added: the same bytes
            return self.weight_bytes * parameters, self.gradient_bytes * parameters, self.optimizer_bytes * parameters
        gathered, queued = levers.fsdp_buffer_bytes(self.options, self.layer_parameters, layers, self.dp_cp,
                                                    self.queue_replay) if buffers else (0, 0)
        weights = self.weight_bytes * parameters + (np.asarray(layers) * self.layer_extra_bytes + gathered)
        return weights, self.gradient_bytes * parameters + queued, self.optimizer_bytes * parameters

    def total(self, layers, buffers: bool = True):
        """Peak bytes per GPU of a rank holding ``layers`` decoder layers (Eq. 18 per stage); the
        same sums, in the same order, as ``terms(layers).total``. Without Megatron-FSDP's buffers
        where not ``buffers`` (``most_layers`` adds them as lines). The layers as floats once: every
        term multiplies them by floats (the same values; one conversion instead of one per term)."""
        layers = np.asarray(layers, dtype=float)
        parameters = self.parameters(layers)
        weights, gradients, optimizer = self.states(layers, parameters, buffers)
        states = weights + gradients + optimizer
        total = states + (self.layer_activations(layers) + self.embedding_activations + self.output_activations)
        return total if self.added is _NOTHING_ADDED else total + self.added  # adding 0.0 changes no byte count

    def terms(self, layers) -> StageTerms:
        if self.calibrated:
            raise ValueError("a calibrated StageModel prices splits; Eq. 18's terms come from a plain one")
        parameters = self.parameters(layers)
        weights, gradients, optimizer = self.states(layers, parameters)
        return StageTerms(
            parameters=parameters,
            weights=weights,
            gradients=gradients,
            optimizer=optimizer,
            layer_activations=self.layer_activations(layers),
            embedding_activations=self.embedding_activations,
            output_activations=self.output_activations,
            in_flight=self.in_flight.passes / self.vpp,
        )


def _rows_of(value, rows: np.ndarray, count: int):
    """``value``'s rows ``rows`` where it is an array over ``count`` layouts (its leading axis);
    as it is where it does not vary with the layout (a number, or one row for all). ``take``, not
    ``value[rows]``: the same rows, 2-3x faster for a few ranks (numpy's fancy indexing walks each
    element through its index iterator; a model has about forty such arrays to take)."""
    if isinstance(value, np.ndarray) and value.ndim and value.shape[0] == count:
        return value.take(rows, axis=0)
    return value
