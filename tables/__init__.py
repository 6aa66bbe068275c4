"""Scripts that reproduce the seed papers' tables and figures from the advisor's own code.

Run from the repository root, for example ``python -m tables.seed004``.
"""
