"""The one exception type for bad user input.

The core raises `AdvisorError` with a message written for the user; the CLI turns it
into one line on stderr and exit status 2. Anything else escaping is a bug.
"""


class AdvisorError(ValueError):
    """Bad input: unknown model, malformed config, impossible sizes, no valid configuration."""


class NothingFits(AdvisorError):
    """Not bad input: the question was valid, and no plan within the memory limit exists. The CLI
    says so in one line with exit status 1 (``advisor.cli.options.nothing_fits``), as ``advisor
    sweep`` does when no layout fits; bad input stays 2."""
