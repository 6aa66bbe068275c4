"""Plan -> Megatron-LM flags -> torchrun / srun / sbatch, with ``megatron_hooks`` installed."""
