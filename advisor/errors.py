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


def close_names(given: str, names, *, n: int = 3, cutoff: float = 0.6) -> list[str]:
    """The names a misspelt ``given`` may mean, for a 'did you mean' hint: those it begins, in
    their own order (a family's first preset first: 'h100' -> h100-80gb before h100-94gb, which
    difflib ranks alike and lists by its own tie order), then difflib's closest."""
    import difflib  # only a misspelt name needs it: kept off the start-up

    names = list(names)
    started = [name for name in names if name.startswith(given)] if given else []
    close = difflib.get_close_matches(given, names, n=n, cutoff=cutoff)
    return list(dict.fromkeys([*started, *close]))[:n]
