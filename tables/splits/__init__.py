"""Pipeline splits compared (issue 14): for Llama-3.1-8B/70B/405B on a few GPU counts, the even
split, Megatron-LM's ``--account-for-embedding/loss-in-pipeline-split`` splits, the
memory-optimal split and MadPipe's time-optimal split, each priced by the advisor's memory
estimator (seed 004, per stage and position) and time model: ``python -m tables.splits``."""
