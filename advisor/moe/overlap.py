"""megatron-core's refusals of the EP all-to-all overlap (--overlap-moe-expert-parallel-comm) and
of --delay-wgrad-compute that do not depend on the layout: the one check of the settings behind
them, for every reader (the command's flags and ``--from-command``: ``advisor.cli.moe``; a saved
sweep row or estimate: ``advisor.saved_row.moe_row_settings``, read by the report and by
advisor-launch). The layout's refusals (EP > 1, VPP where PP > 1, no full recomputation) are
``advisor.moe.space.overlap_problem``'s.

Megatron's rules (``transformer_config.py``, ``TransformerConfig.__post_init__``; core_v0.15.2
lines 1441-1486, core_v0.19.0 lines 2669-2752), in its order: the overlap needs the alltoall or
flex dispatcher, no recomputation method and no recomputation layer count (both must be None),
no ``moe`` in the recomputed modules (core_v0.19.0 only; held for both here), no
--moe-shared-expert-overlap, at most one MTP layer; --delay-wgrad-compute needs the overlap, and
Transformer Engine (``arguments.py``, ``validate_args``, both releases). Each
message names Megatron's flags, which the user knows, whatever the reader: a row's fields are
those flags (``a2a_overlap`` is --overlap-moe-expert-parallel-comm, ``delay_wgrad``
--delay-wgrad-compute, ``dispatcher`` --moe-token-dispatcher-type).
"""

from __future__ import annotations

from collections.abc import Iterable

OVERLAP = "--overlap-moe-expert-parallel-comm"
SHARED_OVERLAP = "--moe-shared-expert-overlap"


def _refuses(flag: str, megatron: str) -> str:
    return f"{OVERLAP} refuses {flag} (megatron-core: '{megatron} when enabling overlap_moe_expert_parallel_comm')"


def settings_problem(*, a2a_overlap: bool, delay_wgrad: bool = False, dispatcher: str = "alltoall",
                     recompute: str = "none", recompute_method: str | None = None,
                     recompute_num_layers: int | str | None = None, recompute_modules: Iterable[str] | None = (),
                     shared_expert_overlap: bool = False, mtp_num_layers: int | None = 0,
                     transformer_impl: str = "transformer_engine") -> str | None:
    """The first rule these settings break, as one line naming Megatron's flags, or None.

    ``recompute_method`` and ``recompute_num_layers`` are what the command gives (None: not
    given); under full recomputation they are left to the layout's check, which refuses full
    recomputation itself first, as megatron-core does."""
    if a2a_overlap:
        if dispatcher not in ("alltoall", "flex"):
            return f"{OVERLAP} needs --moe-token-dispatcher-type alltoall or flex, got {dispatcher}"
        if recompute != "full" and recompute_method is not None:
            return _refuses(f"--recompute-method {recompute_method}", "disable recomputation method")
        if recompute != "full" and recompute_num_layers is not None:
            return _refuses(f"--recompute-num-layers {recompute_num_layers}", "recompute_num_layers must be None")
        if "moe" in (recompute_modules or ()):
            return _refuses("--recompute-modules moe", "disable moe in recompute_modules")
        if shared_expert_overlap:
            return _both_overlaps()
        if (mtp_num_layers or 0) > 1:
            return f"{OVERLAP} allows at most one MTP layer, got --mtp-num-layers {mtp_num_layers} (megatron-core " \
                   "refuses more)"
    if delay_wgrad and not a2a_overlap:
        return f"--delay-wgrad-compute needs {OVERLAP} (megatron-core refuses it alone)"
    if delay_wgrad and transformer_impl != "transformer_engine":  # arguments.py validate_args, both releases
        return f"--delay-wgrad-compute needs --transformer-impl transformer_engine, got {transformer_impl} " \
               "(Megatron-LM refuses it)"
    return None


def _both_overlaps() -> str:
    """The one rule both checks meet: the EP all-to-all overlap refuses the shared experts' own."""
    return _refuses(SHARED_OVERLAP, "disable moe_shared_expert_overlap")


def shared_expert_overlap_problem(*, dispatcher: str, a2a_overlap: bool, recompute_modules: Iterable[str] | None,
                                  shared_experts: bool, release) -> str | None:
    """Why megatron-core refuses --moe-shared-expert-overlap with these settings, as one line, or
    None (``transformer_config.py``, ``__post_init__``, in its order; core_v0.15.2 lines 840-845,
    982-989 and 1476, core_v0.19.0 lines 1644-1650, 1812-1819 and 2707): a model with shared
    experts needs a dispatcher of ``release.shared_expert_overlap_dispatchers`` and no
    ``shared_experts`` recomputation; any model, no EP all-to-all overlap. Without shared experts
    the flag is otherwise read and ignored."""
    if shared_experts and dispatcher not in release.shared_expert_overlap_dispatchers:
        allowed = " or ".join(release.shared_expert_overlap_dispatchers)
        return (f"{SHARED_OVERLAP} needs --moe-token-dispatcher-type {allowed} on {release.name}, got {dispatcher} "
                f"(megatron-core: 'moe_shared_expert_overlap only works with {allowed} token dispatcher')")
    if shared_experts and "shared_experts" in (recompute_modules or ()):
        return (f"{SHARED_OVERLAP} refuses --recompute-modules shared_experts (megatron-core: 'shared_experts "
                f"recompute cannot work with {SHARED_OVERLAP}.')")
    if a2a_overlap:
        return _both_overlaps()
    return None
