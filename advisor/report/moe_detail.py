"""One MoE layout in detail (a sweep row or an estimate of ``advisor.moe``): its per-stage terms
as ``advisor.moe.space.estimate_layout`` prices them from the row (EP, ETP, VPP, the dispatcher,
the routing assumption, the training options with FP8, the MTP layers in the model), the
calibrated model's additions where the row was judged by it. Nothing is priced here.
"""

from __future__ import annotations

from advisor.errors import AdvisorError
from advisor.saved_row import number

MOE_SEGMENTS = ("weights", "gradients", "optimizer", "FP8 weights", "layer activations", "embedding activations",
                "output activations", "dispatcher and expert buffers", "runtime, allocator, logits, mask")
"""Stacked memory of an MoE stage, bottom to top: its model states by kind, as a dense stage's
(``advisor.moe.stage.ModelStates``' weights, gradients and optimizer: together its dense and
expert states, Megatron-FSDP's buffers in the first two), then ``StageBytes``' other buckets; the
last is the calibrated model's addition (its factors are applied to the activation buckets)."""
_KEYS = ("weights_gib", "gradients_gib", "optimizer_gib", "fp8_weights_gib", "layer_activations_gib",
         "embedding_activations_gib", "output_activations_gib", "transient_gib")
_ACTIVATIONS = slice(4, 8)
"""Where the activation buckets the calibrated factors scale sit in ``_KEYS``."""


_ROUTING = {"balanced": "every expert receives its share of the tokens (what load balancing aims at; "
                         "--moe-router-force-load-balancing forces it)",
            "capacity": "each expert capped at --moe-expert-capacity-factor times its share",
            "dropless": "the most tokens a dropless router can send one rank (its memory's worst case)"}
"""What each routing assumption prices (``advisor.moe.memory``'s docstring)."""


def experts_text(row: dict) -> str:
    """The expert layout and the assumptions an MoE row was priced under, in a sentence: EP, ETP
    and the expert-data-parallel size, the dispatcher, the routing assumption (with its capacity
    factor, padding and imbalance), and the step's EP all-to-all time."""
    from advisor.moe.flags import row_pads

    routing = row.get("routing") or "balanced"
    words = [f"EP {row.get('ep')} x ETP {row.get('etp')}"
             + (f" (expert data parallel {row['edp']})" if row.get("edp") else ""),
             f"token dispatcher {row.get('dispatcher') or 'alltoall'}"
             + (" with the all-to-all overlapped" if row.get("a2a_overlap") else ""),
             f"routing {routing}: {_ROUTING.get(routing, 'as the row records')}"]
    if row.get("capacity_factor") is not None:
        words[-1] += f", factor {row['capacity_factor']:g}" + (", padded" if row_pads(row) else ", not padded")
    if (imbalance := number(row, "imbalance")) not in (None, 1.0):
        words.append(f"the busiest rank {imbalance:g} x its share (imbalance)")
    if (a2a := number(row, "ep_comm_s")) is not None:
        words.append(f"EP communication {a2a:.3f} s of the step")
    return "Experts: " + "; ".join(words) + "."


def _settings(row: dict):
    from advisor.moe.flags import row_pads
    from advisor.moe.memory import RoutedTokens
    from advisor.moe.stage import MoEOptions
    from advisor.options import TrainingOptions

    modules = row.get("recompute_modules")
    try:
        training = TrainingOptions.from_dict({k: v for k, v in (row.get("options") or {}).items()
                                              if not k.startswith("recompute")})
        return MoEOptions(dispatcher=row.get("dispatcher") or "alltoall", training=training,
                          a2a_overlap=bool(row.get("a2a_overlap")), delay_wgrad=bool(row.get("delay_wgrad")),
                          dispatcher_sms=row.get("dispatcher_sms"), permute_fusion=bool(row.get("permute_fusion")),
                          router_fusion=bool(row.get("router_fusion")),
                          shared_expert_overlap=bool(row.get("shared_expert_overlap")),
                          flex_backend=row.get("flex_backend") or "deepep",
                          routing=RoutedTokens(routing=row.get("routing") or "balanced",
                                               capacity_factor=row.get("capacity_factor"),
                                               pad_to_capacity=row_pads(row),
                                               imbalance=row.get("imbalance") or 1.0),
                          modules=frozenset(modules) if modules else None)
    except (AdvisorError, TypeError) as exc:
        raise AdvisorError(f"the MoE row's options cannot be read: {exc}") from None


def moe_stages(row: dict) -> tuple[list[dict], bool, object, dict | None]:
    """(per stage each of MOE_SEGMENTS in GiB, whether calibrated, the spec, the step's parts) of
    an MoE row: the parts as ``estimate_layout`` prices them with a GPU preset (a sweep's rows do
    not carry them, an estimate's do), else None."""
    return moe_layout(row)[:4]


def moe_layout(row: dict) -> tuple[list[dict], bool, object, dict | None, str]:
    """``moe_stages``' four and, in words, whose model states the fullest stage holds: its
    weights, gradients and optimizer states are drawn by kind, as a dense stage's; the sentence
    says how much of them is the dense parameters' and how much the routed experts'
    (``StageBytes``' dense and expert states: the estimate's ``dense_states_gib``,
    ``expert_states_gib``)."""
    estimate, calibrated, spec = _priced(row)
    stage = max(estimate["stages"], key=lambda s: s.get("usage_gib", s["total_gib"]))
    owners = (f"Stage {stage['stage']}'s weights, gradients and optimizer states: {stage['dense_states_gib']:.2f} "
              f"GiB the dense parameters', {stage['expert_states_gib']:.2f} GiB the routed experts'.")
    return _segments(estimate, calibrated, spec), calibrated, spec, estimate.get("time_parts"), owners


def _priced(row: dict) -> tuple[dict, bool, object]:
    """(``estimate_layout``'s estimate of the row, whether calibrated, the spec)."""
    from advisor.hardware import get_gpu
    from advisor.moe.space import estimate_layout
    from advisor.moe.spec import spec_from_dict
    from advisor.parallel import Workload

    spec = spec_from_dict(row["model"])
    memory = number(row, "memory_gib")
    calibrated = row.get("memory_model") == "calibrated" and bool(memory)
    estimate = estimate_layout(
        spec, Workload(seq_len=row["seq_len"], global_batch_size=row["global_batch_size"]), tp=row["tp"], cp=row["cp"],
        pp=row["pp"], ep=row["ep"], etp=row["etp"], dp=row["dp"], mbs=row["mbs"], vpp=row.get("vpp") or 1,
        recompute=row.get("recompute") or "none", memory_gib=memory,
        gpu=get_gpu(row["gpu"]).with_overrides(gpus_per_node=row.get("gpus_per_node")) if row.get("gpu") else None,
        options=_settings(row), memory_model="calibrated" if calibrated else "paper",
        layers_per_stage=tuple(row["layers_per_stage"]) if row.get("layers_per_stage") else None)
    return estimate, calibrated, spec


def _segments(estimate: dict, calibrated: bool, spec) -> list[dict]:
    stages = []
    for stage in estimate["stages"]:
        values = [stage[key] for key in _KEYS]
        added = stage["usage_gib"] - stage["total_gib"] if calibrated else 0.0
        if calibrated:  # the calibrated factors act on the activations; the rest of the difference is added
            from advisor.throughput.calibration import load_memory_calibration

            cal = load_memory_calibration()
            layer, embedding, output, transient = values[_ACTIVATIONS]
            scaled = [cal.activation_factor * layer, cal.activation_factor / spec.hidden_size * embedding,
                      cal.activation_factor * output, cal.activation_factor * transient]
            added -= sum(scaled) - (layer + embedding + output + transient)
            values[_ACTIVATIONS] = scaled
        stages.append(dict(zip(MOE_SEGMENTS, [*values, added])))
    return stages
