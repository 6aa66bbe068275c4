"""``python -m launch``: the same as ``advisor-launch``."""

from launch.cli import main

main()
