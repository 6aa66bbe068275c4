"""What the training options need to know of each Megatron-LM release: the defaults it applies to
a flag a command line leaves out, where they differ between releases.

Read from each release's ``megatron/training/arguments.py`` (and, for core_v0.19.0, the
dataclasses its parser is generated from) in ``../shared/megatron-lm``; ``tests/test_options_real.py``
checks them against the real parsers. The release table itself is ``advisor.releases`` (one for the
options and the launcher, ``launch.megatron_versions``); this module looks a release up for them.
"""

from __future__ import annotations

from advisor.errors import AdvisorError
from advisor.releases import NEWEST, RELEASES, MegatronRelease


ReleaseDefaults = MegatronRelease
"""One release line's facts (``advisor.releases``); the options read ``fsdp_sharding_strategy``."""


def release_defaults(release: "str | tuple[int, int] | ReleaseDefaults | None" = None) -> ReleaseDefaults:
    """The defaults of ``release``: '0.15', '0.19.0', 'core_v0.15.2', (0, 19), or None (the newest)."""
    if release is None:
        return NEWEST
    if isinstance(release, ReleaseDefaults):
        return release
    if isinstance(release, str):
        parts = release.strip().removeprefix("core_v").removeprefix("v").split(".")
        if len(parts) not in (2, 3) or not all(part.isdecimal() for part in parts):
            raise AdvisorError(f"--megatron-version {release!r}: expected a release such as 0.19 or core_v0.15.2")
        release = (int(parts[0]), int(parts[1]))
    for defaults in RELEASES:
        if tuple(release[:2]) == defaults.release:
            return defaults
    known = ", ".join(defaults.checked for defaults in RELEASES)
    raise AdvisorError(f"Megatron-LM core {'.'.join(map(str, release))} is not a release the advisor knows "
                       f"(it knows {known})")
