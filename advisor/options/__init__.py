"""One description of a run's training options (issue 21): memory, time and Megatron-LM flags
derive from it, and Megatron-LM flags parse back into it.

    options = TrainingOptions().with_(grad_reduce_dtype="bf16", fsdp_strategy="optim_grads")
    options.memory_options()          # advisor.memory.MemoryOptions
    options.time_options()            # advisor.throughput.TimeOptions
    training_args(options, tp=8)      # the flags, each priced option stated
    parse_training_args(argv, "0.15") # -> (TrainingOptions, flags it cannot price)
"""

from advisor.options.flags import parse_training_args, training_args
from advisor.options.releases import RELEASES, ReleaseDefaults, release_defaults
from advisor.options.training import (
    CROSS_ENTROPY_FUSIONS, FP8_FORMATS, FP8_RECIPES, FSDP_STRATEGIES, Attention, DataParallel, Fusions, Loss,
    Offload, Precision, Recomputation, TensorParallel, TrainingOptions,
)

__all__ = [
    "CROSS_ENTROPY_FUSIONS", "FP8_FORMATS", "FP8_RECIPES", "FSDP_STRATEGIES", "RELEASES", "Attention", "DataParallel",
    "Fusions", "Loss", "Offload", "Precision",
    "Recomputation", "ReleaseDefaults", "TensorParallel", "TrainingOptions", "parse_training_args",
    "release_defaults", "training_args",
]
