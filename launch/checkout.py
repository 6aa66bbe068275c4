"""The user's Megatron-LM checkout (and its release), and the profile directory, checked before
anything starts.

Shared by the launcher (on the submitting machine) and the entry (on every rank); no click,
no torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Sequence

from advisor.errors import AdvisorError
from advisor.fileio import expand_home, not_a_directory
from launch.megatron_versions import NEWEST, MegatronVersion, named, of_checkout, read_version

ENV_VAR = "MEGATRON_LM"
SCRIPT = "pretrain_gpt.py"


def resolve_checkout(directory: str | os.PathLike | None) -> Path:
    """The checkout from ``--megatron-lm DIR`` or, without it, ``$MEGATRON_LM``; it must hold
    ``pretrain_gpt.py``. The path is kept as given (relative paths stay relative: torchrun's
    workers and a Slurm job start in the directory they were launched from), but for a leading
    ``~`` or ``~user``, expanded here as a shell would: the manifests and a dry run's command
    pass ``'~/Megatron-LM'`` through quoted (a pod's args, a SkyPilot run script), so that each
    node's entry expands it to its own home, and Path alone never does."""
    if directory is None or str(directory) == "":
        directory = os.environ.get(ENV_VAR) or None
        if directory is None:
            raise AdvisorError(f"give --megatron-lm DIR (your Megatron-LM checkout) or set {ENV_VAR}")
    path = Path(expand_home(str(directory)))
    shown = str(directory) if str(path) == str(directory) else f"{directory} ({path})"
    if not path.is_dir():  # a file (pretrain_gpt.py itself) was 'no such directory', which it is not
        if (problem := not_a_directory(path, f"Megatron-LM checkout {shown}")) is None:
            raise AdvisorError(f"Megatron-LM checkout {shown}: no such directory")
        raise AdvisorError(problem + (" (give the directory that holds it)" if path.name == SCRIPT else ""))
    if not (path / SCRIPT).is_file():
        raise AdvisorError(f"Megatron-LM checkout {shown} has no {SCRIPT}")
    return path


def check_profile_dir(directory: str | os.PathLike) -> Path:
    """A directory for a new run's rank files: absent, or a directory without rank files."""
    path = Path(directory)
    if problem := not_a_directory(path, f"--profile-dir {path}"):  # by its kind: a FIFO or /dev/null was 'a file'
        raise AdvisorError(problem)
    if path.is_dir() and any(path.glob("rank*.jsonl")):
        raise AdvisorError(f"--profile-dir {path} already holds a run's rank files; give a new directory")
    return path


@dataclass(frozen=True, kw_only=True, slots=True)
class Release:
    """The Megatron-LM a launch is for: its rules (``launch.megatron_versions``) and the checkout
    they were read from, or None where a dry run has no checkout and assumes them."""

    rules: MegatronVersion
    checkout: Path | None
    given: str | None
    """The checkout's path as the user gave it (kept for the printed command), or None."""
    version: str | None = None
    """--megatron-version as the user gave it, or None: without a checkout, the newest release's
    rules were assumed."""

    def assumption(self) -> str | None:
        """What a dry run without a checkout says about the rules it used, or None: the release
        --megatron-version named, or the newest one assumed (and how to pick another)."""
        if self.checkout is not None:
            return None
        where = f"no checkout at {self.given}" if self.given else f"no --megatron-lm or ${ENV_VAR}"
        if self.version is not None:
            return (f"{where}: the rules of {self.rules.name} (--megatron-version {self.version}; checked with "
                    f"{self.rules.checked})")
        return (f"{where}: assuming the rules of {self.rules.name} (checked with {self.rules.checked}); "
                f"--megatron-version picks another")


def resolve_release(directory: str | os.PathLike | None, version: str | None, *, need_checkout: bool,
                    elsewhere: bool = False) -> Release:
    """The checkout (``--megatron-lm`` or ``$MEGATRON_LM``) and its version's rules. Without
    ``need_checkout`` (dry runs, ``advisor-launch args``) no checkout is fine: the rules are
    ``--megatron-version``'s, else the newest release's. A checkout given is read here, and one
    that is not here (or holds no pretrain_gpt.py) is an error: a typo silently took the newest
    release's rules (its --mock-data vocabulary differs by one from core 0.15's), unless
    ``elsewhere``: the path names a checkout in an image or on other nodes (k8s, skypilot), read
    where this machine has one. A version given that the checkout is not is an error."""
    given = str(directory) if directory not in (None, "") else os.environ.get(ENV_VAR) or None
    # elsewhere, a '~' is the nodes' home (their entry expands it), not this machine's: not read here
    here = given is not None and (not elsewhere or (Path(given) / SCRIPT).is_file())
    if need_checkout or here:
        try:
            checkout = resolve_checkout(given)
        except AdvisorError as exc:
            if need_checkout:
                raise
            raise AdvisorError(f"{exc} (without a checkout here, give neither --megatron-lm nor ${ENV_VAR}: "
                               "--megatron-version picks the rules)") from None
        rules = of_checkout(checkout)
        if version is not None and named(version) is not rules:
            found = ".".join(map(str, read_version(checkout)))
            raise AdvisorError(f"--megatron-version {version}, but the checkout {checkout} is Megatron-LM core {found}")
        return Release(rules=rules, checkout=checkout, given=given)
    return Release(rules=named(version) if version is not None else NEWEST, checkout=None, given=given,
                   version=version)


def _field_spellings(flag: str) -> tuple[str, ...]:
    """How a dataclass field that core_v0.19.0's ArgumentGroupFactory turns into ``flag`` is
    written: '\n    name:' (an annotated field, indented once), with and without a switch's prefix."""
    name = flag.removeprefix("--")
    names = {name} | {name.removeprefix(prefix) for prefix in ("no-", "disable-") if name.startswith(prefix)}
    return tuple(f"\n    {each.replace('-', '_')}:" for each in sorted(names))


def spelled_in(checkout: Path, flags: Sequence[str]) -> dict[str, str]:
    """For each of ``flags`` that a Python file of ``checkout`` spells as a string ('--flag' or
    "--flag"), that file (relative to the checkout): where a checkout's own argument provider (an
    extra_args_provider of its pretrain_gpt.py) may add a flag the release's parser lacks. A flag
    no file spells cannot be added so (argparse takes option strings as written), though a name
    built at run time (core_v0.19.0's ArgumentGroupFactory derives its flags from dataclass fields)
    is not seen as a string: a dataclass field of the flag's name ('    moe_router_fusion: bool', the
    flag's words with '_', a 'no-' or 'disable-' switch's without its prefix) counts as its
    spelling there. Read only where a flag is unknown: a checkout is some 5 MB of Python."""
    found: dict[str, str] = {}
    wanted = {flag: (f"'{flag}'", f'"{flag}"', *_field_spellings(flag)) for flag in flags}
    for root, directories, files in os.walk(checkout):
        directories[:] = sorted(name for name in directories if not name.startswith("."))  # .git, caches
        for path in sorted(Path(root) / name for name in files if name.endswith(".py")):
            try:
                text = path.read_text(errors="replace")
            except OSError:  # unreadable: it adds nothing we can see
                continue
            found.update((flag, str(path.relative_to(checkout))) for flag, quoted in wanted.items()
                         if flag not in found and any(spelling in text for spelling in quoted))
        if len(found) == len(wanted):
            break
    return found
