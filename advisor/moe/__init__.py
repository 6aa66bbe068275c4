"""Mixture-of-experts: specs (``spec``), parameter counts (``params``), per-layer memory terms
(``memory``), time terms (``time``) and the EP/ETP layout space (``space``), each term citing the
megatron-core file and function it follows (``megatron/core/transformer/moe/`` of core_v0.15.2)."""
