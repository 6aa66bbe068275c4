"""The user's Megatron-LM checkout and the profile directory, checked before anything starts.

Shared by the launcher (on the submitting machine) and the entry (on every rank); no click,
no torch.
"""

from __future__ import annotations

import os
from pathlib import Path

from advisor.errors import AdvisorError

ENV_VAR = "MEGATRON_LM"
SCRIPT = "pretrain_gpt.py"


def resolve_checkout(directory: str | os.PathLike | None) -> Path:
    """The checkout from ``--megatron-lm DIR`` or, without it, ``$MEGATRON_LM``; it must hold
    ``pretrain_gpt.py``. The path is kept as given (relative paths stay relative: torchrun's
    workers and a Slurm job start in the directory they were launched from)."""
    if directory is None or str(directory) == "":
        directory = os.environ.get(ENV_VAR) or None
        if directory is None:
            raise AdvisorError(f"give --megatron-lm DIR (your Megatron-LM checkout) or set {ENV_VAR}")
    path = Path(directory)
    if not path.is_dir():
        raise AdvisorError(f"Megatron-LM checkout {path}: no such directory")
    if not (path / SCRIPT).is_file():
        raise AdvisorError(f"Megatron-LM checkout {path} has no {SCRIPT}")
    return path


def check_profile_dir(directory: str | os.PathLike) -> Path:
    """A directory for a new run's rank files: absent, or a directory without rank files."""
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise AdvisorError(f"--profile-dir {path} is a file, not a directory")
    if path.is_dir() and any(path.glob("rank*.jsonl")):
        raise AdvisorError(f"--profile-dir {path} already holds a run's rank files; give a new directory")
    return path
