"""A command run with a real pseudo-terminal (``pty``) as its standard output: what an engineer at
a terminal sees, which no pipe and no click runner shows (the terminal's width, colour, box
drawing)."""

from __future__ import annotations

import fcntl
import os
import pty
import re
import struct
import subprocess
import sys
import termios

from conftest import ROOT

STYLE = re.compile(r"\x1b\[[0-9;]*m")
"""An SGR escape: colour, bold."""


def on_a_terminal(*args: str, program: str = "advisor", env: dict[str, str] | None = None, columns: int | None = None,
                  stderr_too: bool = False, cwd=ROOT) -> str:
    """What the terminal receives from ``python -m program args``, its line ends as '\\n', styles
    kept (``STYLE.sub('', text)`` drops them). ``columns``: the terminal's own width, $COLUMNS
    unset; ``stderr_too``: the notes on stderr come to the terminal too (else they are dropped).
    ``env`` adds to (or, with None values, removes from) this process's environment. Exit 0 or
    an AssertionError."""
    leader, follower = pty.openpty()
    environment = dict(os.environ)
    if columns is not None:
        fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 50, columns, 0, 0))
        environment.pop("COLUMNS", None)
    for key, value in (env or {}).items():
        if value is None:
            environment.pop(key, None)
        else:
            environment[key] = value
    with subprocess.Popen([sys.executable, "-m", program, *args], stdout=follower,
                          stderr=follower if stderr_too else subprocess.DEVNULL, stdin=subprocess.DEVNULL,
                          env=environment, cwd=cwd) as process:
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # EIO: the process closed its side of the terminal
                break
            if not chunk:
                break
            chunks.append(chunk)
        os.close(leader)
        assert process.wait(timeout=120) == 0, b"".join(chunks).decode(errors="replace")
    return b"".join(chunks).decode().replace("\r\n", "\n")
