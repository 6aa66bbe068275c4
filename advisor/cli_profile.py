"""``advisor profile``: layer-by-layer memory profiles of Megatron runs (see advisor/profiles.py)."""

from __future__ import annotations

import click

from advisor.capture.cli import plan_command


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
def profile() -> None:
    """Plan, run and read layer-by-layer memory profiles of Megatron runs.

    Profiles are written by the Megatron plugin (megatron_hooks), one JSON Lines file per
    rank; their schema is documented in advisor/profiles.py.
    """


profile.add_command(plan_command)
