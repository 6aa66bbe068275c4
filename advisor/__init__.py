"""The advisor core: Llama specs, seed 004's memory estimator, the sweep, profiles, CAPTURE.

Pure Python with numpy/scipy/click; it never imports torch, so it starts fast and runs
anywhere. The Megatron side lives in ``megatron_hooks`` and ``launch``.
"""
