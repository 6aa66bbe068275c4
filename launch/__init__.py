"""``advisor-launch``: a sweep row, an estimate or a plan -> Megatron-LM flags -> torchrun / Slurm,
with ``megatron_hooks`` installed in every rank when profiling.

    inputs      the three inputs, read strictly (LaunchInput, read_input)
    arguments   flags and values, --mock-data, the user's arguments and their conflicts (compose)
    commands    GPUs per node, torchrun (one node, several), the Slurm batch script, printing
    placement   TP and EP groups the launch's ranks per node split, against the nodes a row was priced on
    checkout    the Megatron-LM checkout, its release, and the profile directory, checked before anything starts
    megatron_versions  the releases as data: flags, vocabulary rule, mock data, Python, environment
    megatron_check     argument lists through a real checkout's parse_args + validate_args (tests)
    process     the command's process group: signals forwarded, exit status returned
    entry       python -m launch.entry: pretrain_gpt.py in-process, with the hooks
    cli         the advisor-launch command line (click); imports no torch
"""
