"""The one exception type for bad user input.

The core raises `AdvisorError` with a message written for the user; the CLI turns it
into one line on stderr and exit status 2. Anything else escaping is a bug.
"""


class AdvisorError(ValueError):
    """Bad input: unknown model, malformed config, impossible sizes, no valid configuration."""
