"""The Megatron-LM plugin: per-layer memory hooks (CUDA and CPU backends).

Imports torch and megatron-core; depends on ``advisor`` (for the profile schema), never the
other way round.
"""
