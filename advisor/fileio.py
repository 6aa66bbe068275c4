"""Files: JSON read with one clear error, and atomic writes (a reader sees the old file or the
whole new one, never half of it)."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

from advisor.errors import AdvisorError


def read_json(path: str | Path):
    """The JSON value in ``path``; AdvisorError naming the file if it cannot be read or parsed."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise AdvisorError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise AdvisorError(f"{path} is a directory, not a JSON file") from None
    except UnicodeDecodeError:
        raise AdvisorError(f"{path}: not a UTF-8 text file") from None
    except OSError as exc:
        raise AdvisorError(f"{path}: cannot read: {exc.strerror or exc}") from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise AdvisorError(f"{path}: malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except ValueError as exc:  # an integer of more digits than Python converts (sys.get_int_max_str_digits)
        raise AdvisorError(f"{path}: unreadable JSON: {exc}") from None


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` through a temporary file in the same directory and a rename."""
    path = Path(path)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    return atomic_write_bytes(path, text.encode("utf-8"))
