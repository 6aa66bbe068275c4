"""Without $COLUMNS, a table on a terminal fits the terminal's own width: interactive shells seldom
export COLUMNS, and the tables were cut at 100 columns in an 80-column terminal."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios


def _run_on_a_terminal(columns: int, *args: str) -> str:
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
    env = {key: value for key, value in os.environ.items() if key != "COLUMNS"}
    process = subprocess.Popen([sys.executable, "-m", "advisor", *args], stdout=follower, stderr=follower,
                               stdin=subprocess.DEVNULL, env=env)
    os.close(follower)
    chunks = []
    while True:
        try:
            chunk = os.read(leader, 65536)
        except OSError:  # the terminal closes when the process exits
            break
        if not chunk:
            break
        chunks.append(chunk)
    process.wait(timeout=60)
    os.close(leader)
    text = b"".join(chunks).decode()
    return re.sub(r"\x1b\[[0-9;]*m", "", text).replace("\r", "")


def test_a_table_fits_the_terminal_it_is_printed_on():
    for columns in (80, 120):
        text = _run_on_a_terminal(columns, "estimate", "--tp", "2", "--gpus", "8", "--gpu", "h100-80gb")
        widest = max(len(line) for line in text.splitlines())
        assert widest <= columns and (widest > 100) == (columns > 100), (columns, widest)
