"""Files: the bounded readers and the atomic writer that every user file goes through.

Reading (``read_json``, ``JsonLines``) accepts regular files only: a FIFO, a socket or a device is
refused after an ``open`` that cannot block, and never read. The size is checked against
``advisor.limits`` before a byte is read; text must be UTF-8 (a BOM is allowed); JSON is parsed
with its nesting depth bounded, its integers bounded to int64, NaN, Infinity and numbers that
overflow a double refused, and a key repeated in one object refused (JSON leaves it undefined).
Every failure is one ``AdvisorError`` naming the file (and the line).

Writing (``atomic_write_bytes``) replaces a regular file, or creates a new one, through a
temporary file in the same directory and a rename, so a reader sees the old content or the whole
new one. A symbolic link is followed (the link stays, its target gets the content). What is not
a regular file (a device such as /dev/null, a FIFO, a directory) is refused, as is a read-only
file. A new file gets the mode the umask gives (0666 & ~umask), a replaced file keeps its mode.
Errors name the user's path, never the temporary file.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Iterator

from advisor import limits
from advisor.errors import AdvisorError

_KINDS = {stat.S_ISFIFO: "a FIFO (named pipe)", stat.S_ISCHR: "a character device", stat.S_ISBLK: "a block device",
          stat.S_ISSOCK: "a socket", stat.S_ISDIR: "a directory"}


def _kind(mode: int) -> str:
    return next((name for test, name in _KINDS.items() if test(mode)), "not a regular file")


def not_a_directory(path: str | Path, name: str | None = None) -> str | None:
    """Why ``path``, which exists, cannot be written into as a directory ('out is a FIFO (named
    pipe), not a directory'), naming it ``name`` (default: the path); None for a directory or a
    path that does not exist."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    if stat.S_ISDIR(mode):
        return None
    return f"{name or os.fspath(path)} is {'a file' if stat.S_ISREG(mode) else _kind(mode)}, not a directory"


# --- reading -------------------------------------------------------------------------------


def _open_regular(path: Path, max_bytes: int, what: str) -> int:
    """A read-only descriptor of the regular file ``path``, no larger than ``max_bytes``."""
    try:
        # O_NONBLOCK: opening a FIFO without a writer would otherwise wait forever.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except FileNotFoundError:
        raise AdvisorError(f"{path}: no such file") from None
    except PermissionError:
        raise AdvisorError(f"{path}: cannot read: permission denied") from None
    except OSError as exc:
        raise AdvisorError(f"{path}: cannot open: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if stat.S_ISDIR(info.st_mode):
            raise AdvisorError(f"{path} is a directory, not a {what}")
        if not stat.S_ISREG(info.st_mode):
            raise AdvisorError(f"{path} is {_kind(info.st_mode)}; a {what} is read from a regular file only")
        if info.st_size > max_bytes:
            raise AdvisorError(f"{path} is {info.st_size:,} bytes; a {what} is at most {max_bytes:,}")
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_bytes(path: str | Path, *, max_bytes: int = limits.JSON_FILE_BYTES, what: str = "file") -> bytes:
    """The content of the regular file ``path``, at most ``max_bytes`` (checked again while
    reading, for a file that grows)."""
    path = Path(path)
    fd = _open_regular(path, max_bytes, what)
    chunks, total = [], 0
    try:
        while chunk := os.read(fd, 1 << 20):
            total += len(chunk)
            if total > max_bytes:
                raise AdvisorError(f"{path} grew beyond {max_bytes:,} bytes while being read; a {what} is at most that")
            chunks.append(chunk)
    except OSError as exc:
        raise AdvisorError(f"{path}: cannot read: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    return b"".join(chunks)


def decode_utf8(data: bytes, where: str, *, errors: str = "strict") -> str:
    """UTF-8 text (a BOM dropped); ``errors="replace"`` reads a stray byte as U+FFFD instead of refusing it."""
    if errors != "strict":
        return data.decode("utf-8-sig", errors=errors)
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise AdvisorError(f"{where}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None


def read_text(path: str | Path, *, max_bytes: int, what: str, errors: str = "strict") -> str:
    """A UTF-8 text file, or standard input for '-', at most ``max_bytes`` (``errors``: ``decode_utf8``'s)."""
    if str(path) == "-":
        import sys

        # Python sets sys.stdin to None when file descriptor 0 is closed (`cmd <&-`, some daemons).
        if sys.stdin is None:
            raise AdvisorError(f"standard input is closed; pipe in the {what} or give a file name instead of '-'")
        try:
            data = sys.stdin.buffer.read(max_bytes + 1)
        except OSError as exc:
            raise AdvisorError(f"standard input: cannot read: {exc.strerror or exc}") from None
        if len(data) > max_bytes:
            raise AdvisorError(f"standard input is over {max_bytes:,} bytes; a {what} is at most that")
        return decode_utf8(data, "standard input", errors=errors)
    return decode_utf8(read_bytes(path, max_bytes=max_bytes, what=what), str(path), errors=errors)


class NotAFileToReplace(AdvisorError):
    """An output path that exists and is no regular file (a FIFO, a device): where the command
    can write standard output instead, its option says so (``advisor.cli.options.file_path``)."""


class _Refused(Exception):
    def __init__(self, literal: str, why: str) -> None:
        super().__init__(literal)
        self.literal, self.why = literal, why


def _parse_int(text: str) -> int:
    # Length first: int() of a 100,000-digit literal is slow, and over 4,300 digits it raises.
    if len(text.lstrip("-")) > 19 or abs(value := int(text)) > limits.JSON_INT:
        raise _Refused(text, "does not fit in 64 bits")
    return value


def _parse_float(text: str) -> float:
    value = float(text)
    if value in (float("inf"), float("-inf")):
        raise _Refused(text, "is beyond the range of a double")
    return value


def _parse_constant(name: str):
    raise _Refused(name, "is not a JSON number (JSON has no NaN or Infinity)")


def _object(pairs: list[tuple[str, object]]) -> dict:
    result = dict(pairs)
    if len(result) != len(pairs):
        seen = set()
        key = next(key for key, _ in pairs if key in seen or seen.add(key))
        raise _Refused(json.dumps(key), "appears twice as a key of one object")
    return result


_KEY_BEFORE = re.compile(r'"([A-Za-z0-9_.-]{1,64})"\s*:\s*\Z')


def _within_bounds(value: object) -> bool:
    """Whether a value parsed with Python's own number parsing keeps the bounds: nested at most
    ``limits.JSON_DEPTH`` levels, integers within int64, no float overflowed to infinity."""
    stack, bound = [(value, 1)] if type(value) in (dict, list) else [([value], 0)], limits.JSON_INT
    while stack:
        item, depth = stack.pop()
        if depth > limits.JSON_DEPTH:
            return False
        for child in item.values() if type(item) is dict else item:
            kind = type(child)
            if kind is dict or kind is list:
                stack.append((child, depth + 1))
            elif (kind is int and not -bound <= child <= bound) or (kind is float and child in _INFINITIES):
                return False
    return True


_INFINITIES = (float("inf"), float("-inf"))


def parse_json(text: str, where: str):
    """The JSON value of ``text``, bounded as the module says; AdvisorError naming ``where``.

    Parsed once with Python's own numbers and checked after (2.4x faster than a hook on every
    number: a 4.5 MB sweep of every layout in 0.09 s, not 0.23); only a document that breaks a
    bound or does not parse is parsed again, number by number, to name the first problem."""
    try:
        value = json.loads(text, parse_constant=_parse_constant, object_pairs_hook=_object)
    except (ValueError, RecursionError, _Refused):  # ValueError: JSONDecodeError, and int()'s 4,300 digits
        return _parse_naming_the_problem(text, where)
    return value if _within_bounds(value) else _parse_naming_the_problem(text, where)


def _parse_naming_the_problem(text: str, where: str):
    try:
        value = json.loads(text, parse_int=_parse_int, parse_float=_parse_float, parse_constant=_parse_constant,
                           object_pairs_hook=_object)
    except json.JSONDecodeError as exc:
        raise AdvisorError(f"{where}: malformed JSON at line {exc.lineno}, column {exc.colno}: {exc.msg}") from None
    except RecursionError:  # the C scanner's guard, far below what a long document could nest
        raise AdvisorError(f"{where}: JSON nested deeper than {limits.JSON_DEPTH} levels") from None
    except _Refused as exc:
        shown = exc.literal if len(exc.literal) <= 30 else exc.literal[:27] + "..."
        at = max(text.find(exc.literal), 0)
        line = text.count("\n", 0, at) + 1
        key = _KEY_BEFORE.search(text, max(at - 200, 0), at)  # the key the value belongs to, if any
        named = f"{key.group(1)} = " if key else ""
        raise AdvisorError(f"{where}: line {line}: {named}{shown} {exc.why}") from None
    if not _within_bounds(value):  # only its depth is left to break
        raise AdvisorError(f"{where}: JSON nested deeper than {limits.JSON_DEPTH} levels")
    return value


def read_json(path: str | Path, *, max_bytes: int = limits.JSON_FILE_BYTES, what: str = "JSON file"):
    """The JSON value in the regular file ``path``; AdvisorError naming the file if it cannot be
    read, is too large, is not UTF-8, or is not bounded JSON."""
    path = Path(path)
    return parse_json(decode_utf8(read_bytes(path, max_bytes=max_bytes, what=what), str(path)), str(path))


STDIN = "standard input"
"""What a '-' path reads, by the name messages give it."""


def read_json_input(path: str | Path, *, what: str) -> tuple[object, str]:
    """(the JSON value, where it came from) of ``--from FILE`` or ``--from -``: standard input, so
    that a sweep's JSON pipes into the command that reads it (advisor report, advisor-launch).
    Empty standard input says what to pipe in: the command before the pipe failed or wrote to -o."""
    if str(path) != "-":
        where = str(path)
        text = decode_utf8(read_bytes(Path(path), max_bytes=limits.JSON_FILE_BYTES, what=what), where)
        if not text.strip():  # what 'advisor sweep ... > sweep.json' leaves when the sweep fails
            raise AdvisorError(f"{where} is empty: give the JSON of advisor sweep or estimate --format json "
                               "(or a plan, advisor recommend -o)")
    else:
        where, text = STDIN, read_text("-", max_bytes=limits.JSON_FILE_BYTES, what=what)
        if not text.strip():
            raise AdvisorError("--from -: standard input is empty; pipe in the JSON of advisor sweep or estimate "
                               "--format json (or a plan), or give --from FILE")
    try:
        return parse_json(text, where), where
    except AdvisorError:
        if text.lstrip()[:1] in ("{", "["):  # JSON, only broken: the parser's line and column say where
            raise
    # a table: 'advisor sweep | advisor-launch args --from -', or 'advisor sweep > sweep.json'
    first = text.strip().splitlines()[0]
    shown = first if len(first) <= 40 else first[:37] + "..."
    raise AdvisorError(f"{where} holds no JSON (it begins {shown!r}): advisor sweep and estimate write it with "
                       "--format json, advisor recommend with -o FILE")


class JsonLines:
    """The values of a JSON Lines file, one per line, read one line at a time.

    Each line is bounded (``limits.JSON_LINE_BYTES``) and parsed as ``parse_json`` does. A last
    line without its newline that does not parse is what an interrupted append leaves: it is
    skipped, and ``truncated_line`` says which line it was. Blank lines are skipped. ::

        lines = JsonLines(path, max_bytes=limits.RANK_FILE_BYTES, what="profile rank file")
        for number, value in lines: ...
    """

    def __init__(self, path: str | Path, *, max_bytes: int, what: str) -> None:
        self.path, self.max_bytes, self.what = Path(path), max_bytes, what
        self.truncated_line: int | None = None

    def __iter__(self) -> Iterator[tuple[int, object]]:
        fd = _open_regular(self.path, self.max_bytes, self.what)
        total = 0
        with os.fdopen(fd, "rb") as handle:
            for number, raw in enumerate(iter(lambda: handle.readline(limits.JSON_LINE_BYTES + 1), b""), start=1):
                total += len(raw)
                where = f"{self.path}:{number}"
                if total > self.max_bytes:
                    raise AdvisorError(f"{self.path} grew beyond {self.max_bytes:,} bytes while being read")
                complete = raw.endswith(b"\n")
                if len(raw) > limits.JSON_LINE_BYTES and not complete:
                    raise AdvisorError(f"{where}: line longer than {limits.JSON_LINE_BYTES:,} bytes")
                try:
                    text = decode_utf8(raw, where)
                    if not text.strip():
                        continue
                    value = parse_json(text, where)
                except AdvisorError:
                    if not complete and not handle.peek(1):
                        self.truncated_line = number  # an interrupted append: the last line, cut short
                        return
                    raise
                yield number, value


# --- writing -------------------------------------------------------------------------------


_PSEUDO = (("/", "proc"), ("/", "sys"))
"""The kernel's file systems: their permission bits do not say whether a file can be created."""


def _resolve(path: Path) -> Path:
    """``path`` with its symbolic links followed, refusing a descriptor's: /dev/stdout, /dev/fd/N
    and /proc/PID/fd/N are links to an open descriptor, whose "target" is whatever it is
    connected to."""
    current = Path(os.path.abspath(path))
    for _ in range(40):  # Linux's own limit on links followed (ELOOP)
        parent = Path(os.path.realpath(current.parent))
        current = parent / current.name
        if parent.parts[:2] == ("/", "proc") and parent.name == "fd":
            raise AdvisorError(f"{path} names an open file descriptor, not a file: output files are written "
                               f"atomically (for standard output, leave out -o or give -o -)")
        if not current.is_symlink():
            return current
        current = Path(os.path.join(parent, os.readlink(current)))
    raise AdvisorError(f"{path}: too many levels of symbolic links")


def _check_creatable(path: Path, parent: Path) -> None:
    """In /proc or /sys, create (and remove) the temporary file a write would, for the error the
    write would meet (/proc/x.out: 'No such file or directory'), before any work."""
    probe = parent / _temporary_name("probe")
    try:
        os.close(os.open(probe, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600))
    except OSError as exc:
        raise AdvisorError(f"{path}: cannot create files in {parent}: {exc.strerror or exc}") from None
    probe.unlink(missing_ok=True)


def output_target(path: str | Path) -> tuple[Path, os.stat_result | None]:
    """The regular file a write to ``path`` replaces (symbolic links followed) and its status, or
    the new file it creates (status None); AdvisorError, naming ``path``, for anything a file
    cannot be written to. Called before the work (so a bad -o fails fast) and by every write."""
    if os.fspath(path) in ("", "."):
        raise AdvisorError(f"the output path {os.fspath(path)!r} names no file")
    if os.fspath(path).endswith(os.sep):  # Path() would drop the '/': a directory, by POSIX
        raise AdvisorError(f"{os.fspath(path)} ends in '{os.sep}', which names a directory; give a file name")
    path = Path(path)
    if len(os.fsencode(path.name)) > limits.NAME_BYTES:
        raise AdvisorError(f"{path}: the file name is longer than {limits.NAME_BYTES} bytes")
    try:
        target = _resolve(path)
    except OSError as exc:
        raise AdvisorError(f"{path}: {exc.strerror or exc}") from None
    try:
        info = os.stat(target)
    except FileNotFoundError:
        info = None
    except OSError as exc:
        raise AdvisorError(f"{path}: {exc.strerror or exc}") from None
    if info is not None:
        if stat.S_ISDIR(info.st_mode):
            raise AdvisorError(f"{path} is a directory; give a file name")
        if not stat.S_ISREG(info.st_mode):
            raise NotAFileToReplace(f"{path} is {_kind(info.st_mode)}: output files are written atomically, as "
                                    f"regular files only")
        if not os.access(target, os.W_OK) or not info.st_mode & 0o222:  # root may write anywhere
            raise AdvisorError(f"{path} is read-only; it is not replaced")
    if len(os.fsencode(target.name)) > limits.NAME_BYTES:
        raise AdvisorError(f"{path}: the file name is longer than {limits.NAME_BYTES} bytes")
    parent = target.parent
    if not parent.is_dir():
        raise AdvisorError(f"{path}: no such directory: {parent}")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise AdvisorError(f"{path}: cannot create files in {parent}: permission denied")
    if parent.parts[:2] in _PSEUDO:
        _check_creatable(path, parent)
    return target, info


def is_stdout(path: str | Path) -> bool:
    """Whether ``path`` is '-' or names this process's standard output (/dev/stdout, or the file
    that stdout is redirected to): an explicit request to write to stdout, not to replace a file."""
    if str(path) == "-":
        return True
    try:
        named, out = os.stat(path), os.fstat(1)
    except (OSError, ValueError):
        return False
    return (named.st_dev, named.st_ino) == (out.st_dev, out.st_ino)


def expand_home(value: str) -> str:
    """``value`` with a leading ``~`` or ``~user`` expanded as a shell would, else as given (an
    unknown ~user too, so that the error is the path's own). A shell leaves '~' alone where it is
    quoted ('~/x'), follows '=' (--out=~/x in sh) or comes from a script or a config, and
    click.Path never expands it: --profile-dir '~/x' made a directory named '~' here."""
    return os.path.expanduser(value) if value.startswith("~") else value


def same_file(a: str | Path, b: str | Path) -> bool:
    """Whether ``a`` and ``b`` name one existing file (``os.path.samefile``: a hard link, a symbolic
    link or another spelling of the path counts). A path that does not exist names no file yet, so
    no other path's: a missing input is its reader's error, and a new output replaces nothing."""
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):
        return False


def refuse_overwriting(output: str | Path | None, inputs: dict[str, str | Path | None]) -> None:
    """AdvisorError where the file ``output`` (-o) is one that an input option reads (``inputs``:
    the option's name -> its path): the write would replace the input ('advisor report --from
    a.json -o a.json' replaced the sweep with its page, 'advisor-launch k8s --from a.json -o a.json'
    with YAML, both exit 0). Standard output and standard input ('-') are no files."""
    if output is None or is_stdout(output):
        return
    for option, path in inputs.items():
        if path is not None and str(path) != "-" and same_file(output, path):
            raise AdvisorError(f"-o {output} is the file {option} reads: writing it would replace the input; "
                               "give another file name")


def _temporary_name(name: str) -> str:
    """'.NAME.XXXXXXXX.tmp', NAME shortened so that the whole fits in a file name."""
    token = os.urandom(4).hex()  # secrets.token_hex(4), without importing secrets (5 ms: hashlib, random)
    room = limits.NAME_BYTES - len(f"..{token}.tmp")
    encoded = os.fsencode(name)[:room]
    return f".{os.fsdecode(encoded)}.{token}.tmp"


def atomic_write_bytes(path: str | Path, data: bytes) -> Path:
    """Write ``data`` to ``path`` atomically (see the module docstring); returns ``path``."""
    target, info = output_target(path)
    temporary = target.parent / _temporary_name(target.name)
    try:
        fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o666)  # the umask applies
        try:
            if info is not None:
                os.fchmod(fd, stat.S_IMODE(info.st_mode))
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view):]
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(temporary, target)
    except OSError as exc:
        temporary.unlink(missing_ok=True)
        raise AdvisorError(f"{path}: cannot write: {exc.strerror or exc}") from None
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
    return Path(path)


def atomic_write_text(path: str | Path, text: str) -> Path:
    """Write ``text`` (UTF-8) to ``path`` atomically. A file name that is not UTF-8 (Python holds its
    bytes as surrogates, os.fsdecode) is written back as those bytes, as standard output writes it
    (a model or profile path with byte 0xff in a report or a batch script was a UnicodeEncodeError)."""
    return atomic_write_bytes(path, text.encode("utf-8", "surrogateescape"))
