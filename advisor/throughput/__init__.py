"""The one time model: how long a Megatron-LM iteration takes, and what TFLOP/s it reports.

    from advisor.throughput import TimeModel
    model = TimeModel(spec, gpu, seq_len=8192, global_batch_size=1024)
    step = model.step(tp, cp, pp, dp, mbs)            # numpy arrays broadcast: one call prices a sweep
    model.throughput(step, gpus)                      # step_time_s, tflops_per_gpu, mfu, tokens_per_s
    model.stage(tp, cp, mbs, layers, embedding=..., head=...)   # one stage's microbatch fwd/bwd

``terms.py`` holds each time term with its source, ``flops.py`` the FLOP counts,
``calibration.py`` the constants (``advisor/calibration.json``).
"""

from advisor.throughput.calibration import Calibration, load_calibration
from advisor.throughput.flops import megatron_flops_per_iteration
from advisor.throughput.model import StageTimes, StepTime, TimeModel, TimeOptions

__all__ = [
    "Calibration", "StageTimes", "StepTime", "TimeModel", "TimeOptions", "load_calibration",
    "megatron_flops_per_iteration",
]
