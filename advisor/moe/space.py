"""The MoE layout space: (TP, CP, PP, EP, ETP, DP, MBS, recomputation), vectorised, classified
and ranked; one layout's estimate stage by stage.

Valid layouts follow megatron-core's ``parallel_state.initialize_model_parallel``: the dense
grid is TP x CP x DP x PP; the expert grid reuses the same ranks as ETP x EP x EDP x PP, so
ETP x EP must divide TP x CP x DP (world / PP), and EP must divide the experts. TP divides the
heads (and the KV heads); sequence parallelism is on whenever TP > 1 (Megatron requires it for
MoE with TP). Verdicts: seed 004's rule, fits <= threshold x memory, tight <= memory, oom.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from advisor import equations as eq
from advisor.errors import AdvisorError
from advisor.hardware import GpuSpec
from advisor.moe import stage as st
from advisor.moe import time as mt
from advisor.moe.spec import MoESpec
from advisor.parallel import Workload
from advisor.throughput import terms
from advisor.throughput.calibration import load_calibration

GIB = 2**30
RECOMPUTES = ("none", "selective", "full")


@dataclass(frozen=True, slots=True)
class Layouts:
    """Columns of layouts (numpy arrays of equal length)."""

    tp: np.ndarray
    cp: np.ndarray
    pp: np.ndarray
    ep: np.ndarray
    etp: np.ndarray
    dp: np.ndarray
    mbs: np.ndarray
    recompute: np.ndarray
    """Index into RECOMPUTES."""


def layout_problem(spec: MoESpec, workload: Workload, gpus: int, tp: int, cp: int, pp: int, ep: int, etp: int,
                   mbs: int) -> str | None:
    """Why megatron-core cannot run this layout, or None."""
    heads = spec.num_attention_heads
    groups = heads if spec.mla is not None else spec.num_query_groups
    if heads % tp or groups % tp:
        return f"TP {tp} must divide the attention heads ({heads}) and the KV heads ({groups})"
    if gpus % (tp * cp * pp):
        return f"{gpus} GPUs are not a multiple of TP x CP x PP = {tp * cp * pp}"
    if spec.num_experts % ep:
        return f"EP {ep} must divide the {spec.num_experts} experts"
    if (gpus // pp) % (ep * etp):
        return f"EP x ETP = {ep * etp} must divide TP x CP x DP = {gpus // pp} (megatron-core's expert groups)"
    if pp > spec.num_layers:
        return f"PP {pp} exceeds the {spec.num_layers} layers"
    if cp > 1 and workload.seq_len % (2 * cp):
        return f"sequence length {workload.seq_len} must be divisible by 2 x CP = {2 * cp}"
    if (workload.seq_len // cp) % tp:
        return f"sequence parallelism needs the sequence per CP rank divisible by TP {tp}"
    dp = gpus // (tp * cp * pp)
    if workload.global_batch_size % (mbs * dp):
        return f"global batch {workload.global_batch_size} is not a multiple of MBS x DP = {mbs * dp}"
    return None


def enumerate_layouts(spec: MoESpec, workload: Workload, gpus: int, max_tp: int) -> Layouts:
    """Every valid layout (``layout_problem``'s rules, vectorised): TP, CP, ETP, MBS powers of 2
    (ETP up to TP, MBS up to 8); PP any divisor; EP any divisor of the experts; each with three
    recomputation choices (none; selective: --recompute-modules; full)."""
    powers = np.array([2**i for i in range(int(math.log2(gpus)) + 1)])
    small = powers[powers <= max_tp]
    pps = np.array([p for p in range(1, min(gpus, spec.num_layers) + 1) if gpus % p == 0])
    eps = np.array([e for e in range(1, spec.num_experts + 1) if spec.num_experts % e == 0])
    tp, cp, pp, ep, etp, mbs = (x.ravel() for x in np.meshgrid(small, powers, pps, eps, small, powers[powers <= 8],
                                                                 indexing="ij"))
    heads = spec.num_attention_heads
    groups = heads if spec.mla is not None else spec.num_query_groups
    s, gbs = workload.seq_len, workload.global_batch_size
    ok = (heads % tp == 0) & (groups % tp == 0) & (gpus % (tp * cp * pp) == 0) & (etp <= tp)
    ok &= ((gpus // pp) % (ep * etp) == 0) & ((cp == 1) | (s % (2 * cp) == 0)) & ((s // cp) % tp == 0)
    dp = gpus // np.maximum(tp * cp * pp, 1)
    ok &= (dp >= 1) & (gbs % np.maximum(mbs * dp, 1) == 0)
    if not ok.any():
        raise AdvisorError(f"no layout of {spec.name} on {gpus} GPUs satisfies megatron-core's constraints")
    base = np.stack([tp, cp, pp, ep, etp, dp, mbs])[:, ok]
    repeat = np.repeat(base, len(RECOMPUTES), axis=1)
    return Layouts(*repeat, recompute=np.tile(np.arange(len(RECOMPUTES)), base.shape[1]))


def _by_recompute(func, layouts: Layouts, **kwargs):
    """Call ``func(..., recompute=name)`` on each recomputation's subset, gathered back."""
    out = None
    for index, name in enumerate(RECOMPUTES):
        which = layouts.recompute == index
        if not which.any():
            continue
        part = func({k: getattr(layouts, k)[which] for k in ("tp", "cp", "pp", "ep", "etp", "dp", "mbs")},
                    name, **kwargs)
        if out is None:
            out = {key: np.zeros(len(layouts.tp)) for key in part}
        for key, value in part.items():
            out[key][which] = value
    return out


def _memory(columns, recompute, *, spec, workload, options):
    """The peak over the representative stages (``stage.representative_stages``)."""
    m = workload.global_batch_size / (columns["mbs"] * columns["dp"])
    peak = None
    for stage in st.representative_stages(spec, columns["pp"]):
        b = st.stage_bytes(spec, workload.seq_len, options, num_microbatches=m, stage=stage, recompute=recompute,
                           **columns)
        fields = {"total": b.total, "states": b.model_states, "activations": b.activations + b.transient,
                  "stage": stage * np.ones_like(b.total)}
        if peak is None:
            peak = fields
        else:
            pick = fields["total"] > peak["total"]
            peak = {key: np.where(pick, fields[key], peak[key]) for key in fields}
    return peak


RECOMPUTE_PASSES = {"none": 3.0, "selective": 3.1, "full": 4.0}
"""Compute passes of a layer per microbatch: forward and a backward of twice its FLOPs; full
recomputation runs the forward again; selective recomputation of --recompute-modules moe_act,
layernorm (and mla_up_proj) redoes elementwise work and MLA's up projections, taken as a tenth
of a forward (an assumption)."""


def _times(columns, recompute, *, spec, workload, gpu, options, vpp: int = 1):
    """Step time: 1F1B over the stages (Narayanan et al. 2021: m x the slowest stage + the
    others' fill and drain), the exposed DP gradient reduce-scatter and parameter all-gather
    (dense parts over DP x CP, experts over EDP, overlapped with the first stage's backward and
    forward), Adam on the shards; ``vpp`` interleaved chunks divide the fill and drain. Communication of a layer runs once forward and once backward
    (and again when fully recomputed)."""
    cal = load_calibration()
    rates = terms.Rates.of(gpu, cal)
    c = {k: np.asarray(v, dtype=float) for k, v in columns.items()}
    dense_f, moe_f, comm, _ = mt.layer_times(spec, workload.seq_len, tp=c["tp"], cp=c["cp"], ep=c["ep"],
                                             etp=c["etp"], mbs=c["mbs"], rates=rates,
                                             imbalance=options.routing.imbalance)
    passes = RECOMPUTE_PASSES[recompute]
    moe_t = passes * (moe_f - comm) + (3.0 if recompute == "full" else 2.0) * comm
    dense_t = passes * dense_f
    most = np.ceil(spec.num_layers / c["pp"])  # the largest stage of split_layers
    tokens = c["mbs"] * workload.seq_len / c["cp"]
    head_f, head_b = terms.lm_head_time(spec, tokens, c["tp"], spec.vocab_size, rates)
    overhead = cal.microbatch_overhead_s
    total = spec.first_dense_layers * dense_t + spec.moe_layers * moe_t + head_f + head_b + c["pp"] * overhead
    slowest = np.maximum(most * moe_t + overhead + np.where(c["pp"] == 1, head_f + head_b, 0), total / c["pp"])
    m = workload.global_batch_size / (c["mbs"] * c["dp"])
    pipeline = m * slowest + (total - slowest) / vpp  # interleaving shrinks the fill and drain v-fold
    edp = c["tp"] * c["cp"] * c["dp"] / (c["etp"] * c["ep"])
    first = st.stage_bytes(spec, workload.seq_len, options, num_microbatches=m, stage=0 * c["pp"],
                           recompute=recompute, vpp=vpp, **columns)
    dense_params = first.weights_gradients_optimizer / (6 + 12 / (c["dp"] * c["cp"]))
    expert_params = first.expert_states / (6 + 12 / edp)
    span = c["tp"] * c["cp"] * c["dp"]
    reduce_d, gather_d = terms.data_parallel_time(dense_params, c["dp"] * c["cp"], span, rates)
    reduce_e, gather_e = terms.data_parallel_time(expert_params, edp, span, rates)
    dp_comm = (np.maximum(0.0, reduce_d + reduce_e - most * 2 * moe_f)
               + np.maximum(0.0, gather_d + gather_e - most * moe_f))
    optimizer = (terms.optimizer_time(dense_params, c["dp"] * c["cp"], rates)
                 + terms.optimizer_time(expert_params, edp, rates))
    step = pipeline + dp_comm + optimizer
    vocab = eq.padded_vocab_size(spec.vocab_size, None, c["tp"])
    flops = mt.megatron_flops_per_iteration(spec, workload.seq_len, workload.global_batch_size, vocab)
    tflops = flops / (step * c["tp"] * c["cp"] * c["pp"] * c["dp"]) / 1e12
    return {"step_time_s": step, "tflops_per_gpu": tflops, "mfu": tflops / gpu.bf16_dense_tflops,
            "tokens_per_s": workload.global_batch_size * workload.seq_len / step,
            "ep_comm_s": m * spec.moe_layers / c["pp"] * (3.0 if recompute == "full" else 2.0) * comm}


def classify(total_gib, memory_gib: float, threshold: float):
    return np.where(total_gib <= threshold * memory_gib, "fits", np.where(total_gib <= memory_gib, "tight", "oom"))


@dataclass(frozen=True, slots=True)
class SweepResult:
    """The ranked layouts as columns (``order``: best first); rows are made only for what is shown."""

    spec: MoESpec
    layouts: Layouts
    memory: dict
    total_gib: np.ndarray
    verdict: np.ndarray
    timing: dict | None
    memory_gib: float
    options: st.MoEOptions
    order: np.ndarray
    considered: int

    @property
    def counts(self) -> dict:
        """Verdicts of the layouts kept (one recomputation each)."""
        return {v: int((self.verdict[self.order] == v).sum()) for v in ("fits", "tight", "oom")}

    def rows(self, include_oom: bool = False, limit: int | None = None) -> list[dict]:
        chosen = self.order if include_oom else self.order[self.verdict[self.order] != "oom"]
        ranked = int((self.verdict[self.order] != "oom").sum())
        out = []
        for position, i in enumerate(chosen[:limit]):
            row = _row(self.spec, self.layouts, i, self.memory, self.total_gib, self.verdict, self.timing,
                       self.memory_gib, self.options)
            row["rank"] = position + 1 if position < ranked and row["verdict"] != "oom" else None
            out.append(row)
        return out

    def least(self) -> dict:
        """The layout that needs the least memory (for the nothing-fits message)."""
        i = int(np.argmin(self.total_gib))
        return _row(self.spec, self.layouts, i, self.memory, self.total_gib, self.verdict, self.timing,
                    self.memory_gib, self.options)


def _one_recompute_each(layouts: Layouts, verdict, speed) -> np.ndarray:
    """Per base layout, the recomputation kept: the fastest (with a GPU; else the least
    recomputation) among those that fit, else among those that are tight, else the one that
    needs the least memory. The three variants of a base layout are consecutive."""
    n = len(RECOMPUTES) if len(np.unique(layouts.recompute)) == len(RECOMPUTES) else 1
    grade = np.select([verdict == "fits", verdict == "tight"], [0, 1], 2).reshape(-1, n)
    key = grade * 1e9 + speed.reshape(-1, n)
    return np.arange(0, len(verdict), n) + np.argmin(key, axis=1)


def sweep(spec: MoESpec, workload: Workload, gpus: int, memory_gib: float, *, threshold: float = 0.8,
          max_tp: int = 8, gpu: GpuSpec | None = None, options: st.MoEOptions = st.MoEOptions(),
          ep: int | None = None, etp: int | None = None, even_split: bool = False,
          recompute: str | None = None) -> SweepResult:
    """Every valid layout with the recomputation it needs (or, with a GPU, the fastest that
    fits), ranked: fits before tight, then (with a GPU) the shortest step, else the smallest
    TP x CP x PP x EP; then the larger MBS. ``ep``/``etp`` pin those; ``even_split`` keeps PP
    dividing the layers; ``recompute`` pins the recomputation (none, selective, full)."""
    layouts = enumerate_layouts(spec, workload, gpus, max_tp)
    keep = np.ones(len(layouts.tp), dtype=bool)
    if even_split:
        keep &= spec.num_layers % layouts.pp == 0
    if recompute is not None:
        keep &= layouts.recompute == RECOMPUTES.index(recompute)
    if ep is not None:
        keep &= layouts.ep == ep
    if etp is not None:
        keep &= layouts.etp == etp
    layouts = Layouts(*(getattr(layouts, f)[keep] for f in Layouts.__dataclass_fields__))
    if not len(layouts.tp):
        raise AdvisorError(f"no layout of {spec.name} on {gpus} GPUs with these choices (EP {ep or 'any'}, ETP "
                           f"{etp or 'any'}" + (", an even split" if even_split else "")
                           + (f", recompute {recompute}" if recompute else "") + ")")
    memory = _by_recompute(_memory, layouts, spec=spec, workload=workload, options=options)
    total_gib = memory["total"] / GIB
    verdict = classify(total_gib, memory_gib, threshold)
    timing = _by_recompute(_times, layouts, spec=spec, workload=workload, gpu=gpu, options=options) if gpu else None
    if timing:
        speed = timing["step_time_s"]
    else:  # the paper's rule: the least model parallelism, no recomputation first
        speed = (layouts.tp * layouts.cp * layouts.pp * layouts.ep).astype(float) + layouts.recompute / 10
    kept = _one_recompute_each(layouts, verdict, np.where(verdict == "oom", total_gib, speed))
    # ties (CP trades against MBS at equal tokens per rank): the fewer CP ranks, then the larger MBS, smaller EP
    order = kept[np.lexsort((layouts.ep[kept], -layouts.mbs[kept], layouts.cp[kept], speed[kept],
                             verdict[kept] == "tight", verdict[kept] == "oom"))]
    return SweepResult(spec, layouts, memory, total_gib, verdict, timing, memory_gib, options, order,
                       considered=len(layouts.tp))


def _row(spec, layouts, i, memory, total_gib, verdict, timing, memory_gib, options) -> dict:
    tp, cp, pp, ep, etp, dp, mbs = (int(layouts.tp[i]), int(layouts.cp[i]), int(layouts.pp[i]), int(layouts.ep[i]),
                                    int(layouts.etp[i]), int(layouts.dp[i]), int(layouts.mbs[i]))
    recompute = RECOMPUTES[int(layouts.recompute[i])]
    row = {"rank": None, "tp": tp, "cp": cp, "pp": pp, "ep": ep, "etp": etp, "mbs": mbs, "dp": dp,
           "gpus": tp * cp * pp * dp, "edp": tp * cp * dp // (ep * etp), "vpp": 1,
           "layers_per_stage": st.split_layers(spec.num_layers, pp), "recompute": recompute,
           "recompute_modules": sorted(options.recompute_modules(spec)) if recompute == "selective" else None,
           "recompute_method": "uniform" if recompute == "full" else None,
           "recompute_num_layers": 1 if recompute == "full" else None,
           "dispatcher": options.dispatcher, "routing": options.routing.routing,
           "capacity_factor": options.routing.capacity_factor if options.routing.routing == "capacity" else None,
           "gradient_bytes": options.gradient_bytes, "distributed_optimizer": options.distributed_optimizer,
           "imbalance": options.routing.imbalance,
           "total_gib": float(total_gib[i]), "model_states_gib": float(memory["states"][i] / GIB),
           "activations_gib": float(memory["activations"][i] / GIB), "peak_stage": int(memory["stage"][i]),
           "memory_fraction": float(total_gib[i] / memory_gib), "verdict": str(verdict[i])}
    if timing is not None:
        row.update({key: float(value[i]) for key, value in timing.items()})
    return row


def estimate_layout(spec: MoESpec, workload: Workload, *, tp: int, cp: int, pp: int, ep: int, etp: int, dp: int,
                    mbs: int, vpp: int = 1, recompute: str = "none", memory_gib: float | None = None,
                    threshold: float = 0.8, gpu: GpuSpec | None = None,
                    options: st.MoEOptions = st.MoEOptions()) -> dict:
    """One layout: a sweep row's keys plus ``stages`` (every stage's bytes); AdvisorError when
    megatron-core cannot run it."""
    problem = layout_problem(spec, workload, tp * cp * pp * dp, tp, cp, pp, ep, etp, mbs)
    m = workload.global_batch_size / (mbs * dp)
    if not problem and vpp > 1 and (pp == 1 or min(st.split_layers(spec.num_layers, pp)) < vpp or m % pp):
        problem = (f"VPP {vpp} needs PP > 1, at least {vpp} layers on every stage and the microbatches "
                   f"({m:g}) a multiple of PP {pp}")
    if problem:
        raise AdvisorError(problem)
    b = st.stage_bytes(spec, workload.seq_len, options, tp=tp, cp=cp, pp=pp, ep=ep, etp=etp, dp=dp, mbs=mbs,
                       num_microbatches=m, stage=np.arange(pp), recompute=recompute, vpp=vpp)
    stages = [{"stage": i, "layers": int(b.layers[i]), "dense_layers": int(b.dense_layers[i]),
               "in_flight_microbatches": float(b.in_flight[i]),
               "dense_states_gib": float(b.weights_gradients_optimizer[i] / GIB),
               "expert_states_gib": float(b.expert_states[i] / GIB), "model_states_gib": float(b.model_states[i] / GIB),
               "activations_gib": float(b.activations[i] / GIB), "transient_gib": float(b.transient[i] / GIB),
               "total_gib": float(b.total[i] / GIB)} for i in range(pp)]
    peak = int(np.argmax(b.total))
    layouts = Layouts(*(np.array([x]) for x in (tp, cp, pp, ep, etp, dp, mbs, RECOMPUTES.index(recompute))))
    memory = {"total": b.total[peak:peak + 1], "states": b.model_states[peak:peak + 1],
              "activations": (b.activations + b.transient)[peak:peak + 1], "stage": np.array([peak])}
    total = memory["total"] / GIB
    limit = np.inf if memory_gib is None else memory_gib
    timing = _by_recompute(_times, layouts, spec=spec, workload=workload, gpu=gpu, options=options,
                           vpp=vpp) if gpu else None
    row = _row(spec, layouts, 0, memory, total, classify(total, limit, threshold), timing, limit, options)
    row.update(vpp=vpp, model=spec.name, seq_len=workload.seq_len, global_batch_size=workload.global_batch_size,
               gpu=gpu.name if gpu else None, stages=stages)
    if memory_gib is None:
        row.update(verdict=None, memory_fraction=None)
    return row
