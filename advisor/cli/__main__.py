"""``python -m advisor.cli``: the ``advisor`` command, as ``python -m advisor`` and the
console script (pyproject.toml's ``advisor = "advisor.cli:main"``) run it; ``python -m
launch.cli`` already ran ``advisor-launch`` so."""

from advisor.cli import main

main()
