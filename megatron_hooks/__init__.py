"""The Megatron-LM plugin: per-layer memory hooks with CUDA and CPU backends (see README.md here).

Entry points: ``integration.install`` (profile an unmodified ``pretrain_gpt.py``),
``hooks.LayerMemoryHooks`` with ``recorder.ProfileRecorder`` (your own loop),
``stage_emulation.emulate_stages`` / ``python -m megatron_hooks.emulate`` (pipeline stages on the CPU),
``model.build_gpt_model`` (a megatron-core Llama stage from an ``advisor`` spec).

Imports torch and megatron-core; depends on ``advisor`` (for the profile schema), never the
other way round.
"""
