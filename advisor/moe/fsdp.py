"""Megatron-FSDP (--use-megatron-fsdp) on an MoE model: what megatron-core core_v0.19.0 does with
the experts, and the buffers and collectives of a stage's FSDP units, vectorised over layouts.

What megatron-core does (read in ``../shared/megatron-lm``):

- core_v0.19.0 shards the routed experts over the expert-data-parallel group and everything else
  over DP x CP: ``_get_parameter_groups`` marks a parameter expert by its name (``".experts." in
  n``, megatron_fsdp/param_and_grad_buffer.py:1782) and keeps expert and other parameters in
  separate buffers (grouped by ``is_expert_param``, :1794, :1833); each buffer takes the group of
  its kind (``get_fsdp_group(is_expert_parallel=group.is_expert_param)``, :2590-2612;
  megatron_fsdp/utils.py:690-710: ``expt_fsdp_group``), which the adapter builds from the expert
  data-parallel group (distributed/fsdp/mcore_fsdp_adapter.py:368, :434-457, ``expt_dp_group =
  parallel_state.get_expert_data_parallel_group()``: world / (ETP x EP x PP) ranks).
- Its FSDP unit (optim_grads_params) is the transformer layer, dense or MoE
  (mcore_fsdp_adapter.py:160-162: ``[TransformerLayer, MoETransformerLayer, MambaLayer]``); a
  unit's buckets are aggregated per (unit, expert or not) (param_and_grad_buffer.py:1938-1950),
  so an MoE layer is gathered and reduced as two collectives, its dense part over DP x CP and its
  experts over the expert DP group. The prefetch budget and the reduce-scatter queue count the
  elements of every bucket, of either kind (:4483-4500; ``wait_for_previous_grad_reduce``,
  :3916-3946).
- Its budgets: ``suggested_communication_unit_size`` is, with optim_grads_params, twice the mean
  FSDP unit's elements on the rank, and otherwise the DDP bucket size (--ddp-bucket-size, default
  max(40M, 1M x DP x CP), training.py:1562), at least 1e9 either way (megatron_fsdp.py:420-444);
  the queue holds that many elements, the prefetch half (``memory_levers.fsdp_communication_unit``,
  the dense model's rule too).
- core_v0.15.2 cannot wrap an expert-parallel model: ``MegatronFSDP.__init__`` calls
  ``self.dist_index.get_expert_dp_group()`` where any parameter has ``allreduce`` False
  (megatron_fsdp.py:229-242), which the experts have at EP > 1 (transformer/moe/experts.py:232-233,
  extensions/transformer_engine.py:411-413 and :1172), and its ``FSDPDistributedIndex`` has no such
  method (megatron_fsdp/utils.py:680-880; its ``get_dp_group(is_expert_parallel=True)`` returns
  None, 'Expert parallel is not supported'), so the wrapping raises AttributeError. The advisor
  prices Megatron-FSDP on MoE models for core_v0.19.0 only (``release_problem``).
- Neither release's validate_args refuses Megatron-FSDP with MoE (core_v0.15.2 arguments.py:699-720,
  core_v0.19.0 :1100-1163; core_v0.19.0 refuses --moe-single-grouped-weight/bias, :1116-1126, which
  the rows never write). core_v0.19.0's adapter runs --overlap-moe-expert-parallel-comm under
  Megatron-FSDP with per-submodule gather hooks (mcore_fsdp_adapter.py:168-225), which this model
  does not price (``advisor.cli.moe``).
"""

from __future__ import annotations

import numpy as np

from advisor import memory_levers as levers
from advisor.moe import mtp as mtp_terms


def release_problem(release) -> tuple[str, str] | None:
    """Why Megatron-LM ``release`` cannot run Megatron-FSDP on an MoE model (the module docstring:
    core_v0.15.2 fails to wrap expert-parallel parameters), or None: (the reason, its source and
    remedy, which follow it in the command's refusal)."""
    from advisor.options.releases import release_defaults

    defaults = release_defaults(release)
    if not defaults.fsdp_wraps_experts:
        return (f"{defaults.name}'s Megatron-FSDP cannot wrap an MoE model's expert-parallel parameters",
                " (its FSDPDistributedIndex has no expert data-parallel group: megatron_fsdp.py "
                "get_expert_dp_group raises AttributeError at EP > 1), and the advisor prices Megatron-FSDP "
                "on MoE models as core_v0.19.0 runs it: give --megatron-version 0.19, or drop --use-megatron-fsdp")
    return None


def held_parameters(layer_parameters, dense, moe_units):
    """(dense-part elements, expert elements, the largest unit, the units) of a stage's FSDP units:
    ``dense`` dense layers and ``moe_units`` MoE layers (its MTP layers' transformer layers among
    them: each is an MoE ``TransformerLayer``, an FSDP unit of its own). ``layer_parameters``: (an
    MoE layer's dense part, its experts, a dense layer) on one GPU, the FSDP units' two bucket
    groups (the module docstring) and a dense layer's one (``advisor.moe.stage.model_states``'s)."""
    moe_dense, experts, dense_layer = layer_parameters
    moe_units, dense = np.asarray(moe_units, dtype=float), np.asarray(dense, dtype=float)
    largest = np.where(moe_units > 0, np.maximum(moe_dense + experts, np.where(dense > 0, dense_layer, 0.0)),
                       dense_layer)
    return dense * dense_layer + moe_units * moe_dense, moe_units * experts, largest, dense + moe_units


def buffer_bytes(options, layer_parameters, dense, moe_units, dp_cp=1, replayed=None):
    """(gathered weights, queued gradients, the dense part's share of them) in bytes per GPU: the
    dense model's Megatron-FSDP buffers (``memory_levers.fsdp_held_buffer_bytes``: the unit in use
    and the prefetched ones, the reduce-scatter queue) over the stage's units, both bucket groups of
    an MoE layer together, with core_v0.19.0's budgets (``memory_levers.fsdp_communication_unit``,
    ``options.fsdp_budget_from_units``: core_v0.19.0, the one release ``release_problem`` lets
    price Megatron-FSDP on an MoE model). ``options``: the
    estimator's (``MemoryOptions``); ``layer_parameters``: ``held_parameters``'. The share splits
    them between the dense and expert columns in proportion to the elements held (Megatron counts
    both kinds against one budget). ``dp_cp``: the dense DP x CP group's ranks, whose count the
    optim_grads budgets grow with (core_v0.19.0's ``resolve_ddp_bucket_size`` takes
    ``pg_collection.dp_cp``, not the expert group).

    optim_grads with ``replayed`` (``advisor.moe.fsdp_replay.ReplayedStages``: the stages, their
    MoE layers and MTP layers, which ``moe_units`` counts together): the queued gradients are the
    dense model's replay of the bucket cut and queue (``memory_levers.fsdp_optim_grads_peak``)
    over the stage's weights, the dense part and the routed experts in their two parameter groups,
    the embedding, final norm and output layer with them (``advisor.moe.fsdp_replay``), and the
    share counts those ends as dense; a last stage's MTP layers are replayed there too, each with
    its norms and eh_proj, and the stage's copy of the embedding at PP > 1
    (``fsdp_replay._mtp_ends``). A caller giving no ``replayed`` keeps the queue + the largest unit
    (``memory_levers.fsdp_queued_elements``), without the ends: underpriced where the DDP bucket
    size exceeds the largest weight (large DP x CP) or without --overlap-grad-reduce."""
    held_dense, held_experts, largest, units = held_parameters(layer_parameters, dense, moe_units)
    held = held_dense + held_experts
    gathered, queued = levers.fsdp_held_buffer_bytes(options, largest, held, units, dp_cp)
    share = np.where(held > 0, held_dense / np.where(held > 0, held, 1.0), 1.0)
    if replayed is not None and options.fsdp_strategy == "optim_grads":
        from advisor.moe import fsdp_replay

        _, queue = levers.fsdp_communication_unit(options, held, units, dp_cp)
        elements = fsdp_replay.queued_elements(options, replayed, dense, dp_cp, queue)
        queued = levers.bucket_bytes(options) * elements
        ends = replayed_ends(replayed)
        share = np.where(held + ends > 0, (held_dense + ends) / np.where(held + ends > 0, held + ends, 1.0), share)
    return gathered, queued, share


def replayed_ends(replayed):
    """The dense elements the replay holds on each stage of ``replayed`` beside the layers' (the
    MTP layers' transformer layers among them): the embedding, final norm and output layer
    (``memory_levers.end_sizes``), and each MTP layer's norms and eh_proj
    (``advisor.moe.mtp.own_parameters``) with, untied at PP > 1, the stage's copy of the embedding
    (``advisor.moe.fsdp_replay._mtp_ends``, as ``advisor.moe.stage.model_states`` counts them)."""
    ends = replayed.ends()
    embedding, norm, output, _ = levers.end_sizes(*ends)
    mtp = np.asarray(replayed.mtp)
    copy = np.where((mtp > 0) & (np.asarray(replayed.pp) > 1) & (not replayed.spec.tie_embeddings), ends.matrix, 0.0)
    return embedding + norm + output + mtp * mtp_terms.own_parameters(replayed.spec, replayed.tp) + copy
