"""A launch command as people paste it, read into ``pretrain_gpt.py``'s arguments and a world size.

Accepted: a bare argument list; ``torchrun ... pretrain_gpt.py ...``; ``python -m
torch.distributed.run|launch ...``; ``srun ... python pretrain_gpt.py ...`` or ``srun ... torchrun
...``; ``advisor-launch``'s own ``-m launch.entry ... -- ARGS``; a launch script holding one of
them (``#SBATCH`` lines, backslash continuations, comments, ``VAR=value`` and ``export``,
``$VAR``/``${VAR}``/``${VAR:-default}`` and arrays ``A=(...)``, ``A+=(...)``, ``"${A[@]}"``, with
bash's quoting and word splitting, done by ``shlex``). Not run: command substitution ``$(...)``,
arithmetic, and assignments or the launch inside ``if``/``for``/``while`` (refused in one line).
A variable the script does not set, and a substitution not run, expand to a marker
(``unexpanded``): harmless in a data path, an error where a priced value needs it, and shown as
written in every message (``as_written``).
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass

from advisor import limits
from advisor.errors import AdvisorError

MARK = "\x00"
"""Brackets what the script did not expand: the name of a variable it leaves unset (EP), or a
command substitution ((nproc)), arithmetic (((N*8))) or backticks (BACKTICK + hostname), their
text '...' where it holds spaces or quotes; no '$' or '`' inside, which double quotes would escape.
Never shown: ``as_written`` gives the script's text back ($EP, $(nproc), $((N*8)), `hostname`)."""
BACKTICK = "\x01"

_SUBSTITUTION_TEXT = re.compile(r"[\w.,:+*/%=-]{1,40}")
"""The inside of a substitution kept in its marker (shown as written); others become '...'."""

_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*|[0-9@*#?]")
_ARRAY_ASSIGN = re.compile(r"\s*(?:export\s+|declare\s+-a\s+|local\s+)?([A-Za-z_]\w*)(\+?)=\(")
_CONTROL = {"if", "then", "elif", "else", "fi", "for", "while", "until", "do", "done", "case", "esac",
            "function", "{", "}"}
_OPENERS, _CLOSERS = {"if", "for", "while", "until", "case", "{"}, {"fi", "done", "esac", "}"}
_SEPARATORS = {";", "&&", "||", "|", "&", ";;"}
_REDIRECTS = re.compile(r"^\d*(>|>>|<|>&|&>|<&|>\|)$")

# torchrun's options that take a value (torch/distributed/run.py), '-' and '_' spellings alike.
_TORCHRUN_VALUED = {"nproc-per-node", "nnodes", "node-rank", "master-addr", "master-port", "rdzv-backend",
                    "rdzv-endpoint", "rdzv-id", "rdzv-conf", "max-restarts", "monitor-interval", "start-method",
                    "role", "log-dir", "redirects", "tee", "local-addr", "logs-specs", "local-ranks-filter",
                    "shutdown-timeout", "signals-to-handle", "event-log-handler", "duplicate-stdout-filters",
                    "duplicate-stderr-filters", "r", "t"}
"""torchrun's options that take a value (``python -m torch.distributed.run --help``, torch 2.13)."""
# srun's options that take a value (slurm's srun(1)); '--opt=value' needs no table.
_SRUN_VALUED = {"N", "nodes", "n", "ntasks", "ntasks-per-node", "gpus-per-node", "G", "gpus", "gres", "c",
                "cpus-per-task", "p", "partition", "t", "time", "J", "job-name", "o", "output", "e", "error",
                "A", "account", "mpi", "container-image", "container-mounts", "container-workdir",
                "container-name", "container-env", "cpu-bind", "mem", "export", "w", "nodelist", "x",
                "exclude", "qos", "signal", "gpus-per-task", "mem-per-gpu", "cpus-per-gpu", "label", "l"}


@dataclass(frozen=True, slots=True)
class LaunchCommand:
    """What the pasted text runs: Megatron's arguments, and the world size its launcher gives."""

    arguments: tuple[str, ...]
    """pretrain_gpt.py's arguments, after expansion and quoting."""
    launcher: str
    """'arguments' (a bare list), 'torchrun', 'srun', 'python' or 'srun+torchrun'."""
    world_size: int | None
    """GPUs, from the launcher's own arguments; None where it does not say."""
    world_source: str
    """How world_size was read, for the report ('torchrun --nproc-per-node 8 x --nnodes 2'), or
    where it is None, why ('no torchrun or srun in it')."""
    gpus_per_node: int | None = None
    """The ranks the launcher starts on each node (torchrun's --nproc-per-node, else srun's
    --ntasks-per-node without torchrun), where it says: which ranks share a node's NVLink."""


def unset_name(token: str) -> str | None:
    """The variable an argument depends on that the script does not set (or the substitution,
    as written, it does not run), or None."""
    match = re.search(MARK + "(.*?)" + MARK, token)
    return match.group(1) if match else None


def unset_variable(word: str) -> bool:
    """Whether ``word`` is one variable the script does not set, whole: bash expands it, unquoted,
    to no word at all (``${EXTRA_ARGS[@]}`` left for the environment to fill)."""
    match = re.fullmatch(MARK + "(.*?)" + MARK, word)
    return match is not None and _NAME.fullmatch(match.group(1)) is not None


def _written(inside: str) -> str:
    return f"`{inside[1:]}`" if inside.startswith(BACKTICK) else "$" + inside


def as_written(token: str) -> str:
    """``token`` as the script wrote it: each marker back to its $VAR, $(...), $((...)) or `...`."""
    return re.sub(MARK + "(.*?)" + MARK, lambda match: _written(match.group(1)), token)


def unexpanded(token: str) -> str | None:
    """What ``token`` holds that the script did not expand, said for a message ('$EP, a shell
    variable the script does not set'), or None."""
    inside = unset_name(token)
    if inside is None:
        return None
    what = ("shell arithmetic the advisor does not evaluate" if inside.startswith("((") else
            "a command substitution the advisor does not run" if inside[:1] in ("(", BACKTICK) else
            "a shell variable the script does not set")
    shown = as_written(token)
    return f"{shown}, {what}" if shown == _written(inside) else f"{shown} ({_written(inside)} is {what})"


def _substitution(text: str, start: int, end: int, open_: str, close: str) -> str:
    """The marker of the substitution ``text[start:end + 1]`` (``open_`` ... ``close``), its inside
    kept where it is short and plain."""
    inside = text[start + len(open_):end + 1 - len(close)]
    inside = inside if _SUBSTITUTION_TEXT.fullmatch(inside) else "..."
    return MARK + (BACKTICK + inside if open_ == "`" else open_[1:] + inside + close) + MARK


def _closing(text: str, start: int, open_: str, close: str) -> int:
    """Index of the bracket closing the one at ``start`` (quotes respected), or -1."""
    depth, quote, i = 0, None, start
    while i < len(text):
        char = text[i]
        if quote:
            if char == "\\" and quote == '"':
                i += 1
            elif char == quote:
                quote = None
        elif char in "'\"":
            quote = char
        elif char == "\\":
            i += 1
        elif char == open_:
            depth += 1
        elif char == close:
            depth -= 1
            if depth == 0:
                return i
        i += 1
    return -1


class _Expander:
    """bash's parameter expansion over the variables set so far, one word-splitting context at a time."""

    def __init__(self, environment: dict[str, str] | None = None) -> None:
        self.scalars: dict[str, str] = {}
        self.arrays: dict[str, list[str]] = {}
        self.grown = 0
        """Characters the expansions have added to the script so far."""
        self.environment = environment or {}
        """Variables the caller's environment is supposed to hold (never the real one, which the
        advisor does not read): where a ``${NAME:-default}`` stands, they replace the default
        (``world_defaults`` sets one at a time to see which the world size depends on)."""
        self.defaulted: dict[str, str] = {}
        """Variables the script does not set whose ``${NAME:-default}`` gave its default: bash
        would take the caller's value instead (NNODES=${NNODES:-1})."""

    def _grow(self, expansion: str) -> None:
        """Refuse expansions past ``limits.COMMAND_EXPANSION_BYTES`` ('A=$A$A' sixty times
        doubled a value to 2^60 characters: a hang)."""
        self.grown += len(expansion)
        if self.grown > limits.COMMAND_EXPANSION_BYTES:
            raise AdvisorError(f"the variables' expansions add more than {limits.COMMAND_EXPANSION_BYTES:,} "
                               "characters to the script (a launch script's variables expand to a few KiB)")

    def _values(self, name: str, index: str | None, default: str | None) -> list[str] | None:
        if name in self.arrays:
            values = self.arrays[name]
            return values if index in ("@", "*") else values[:1]
        if name in self.scalars:
            return [self.scalars[name]]
        if name in self.environment:
            return [self.environment[name]]
        if default is not None:
            self.defaulted.setdefault(name, default)
            return None  # the default, expanded by the caller
        return [MARK + name + MARK]

    def _parameter(self, text: str, i: int) -> tuple[list[str] | None, str | None, int, bool]:
        """The expansion at ``text[i] == '$'``: (values, default text, end index, whole-array)."""
        if text.startswith("$((", i) or text.startswith("$(", i):
            end = _closing(text, i + 1, "(", ")")
            if end < 0:
                raise AdvisorError(f"unclosed $( in {text[i:i + 40]!r}")
            # named as written where its text is plain, else "$(...)": spaces and quotes would split it
            opener, closer = ("$((", "))") if text.startswith("$((", i) else ("$(", ")")
            return [_substitution(text, i, end, opener, closer)], None, end + 1, False
        if text.startswith("${", i):
            end = text.find("}", i)
            if end < 0:
                raise AdvisorError(f"unclosed ${{ in {text[i:i + 40]!r}")
            body = text[i + 2:end]
            match = re.fullmatch(r"([A-Za-z_]\w*|[0-9]+)(?:\[([@*0-9])\])?(?::?-(.*))?", body, re.S)
            if not match:
                raise AdvisorError(f"cannot read the expansion ${{{body}}}")
            name, index, default = match.groups()
            return self._values(name, index, default), default, end + 1, index in ("@", "*")
        match = _NAME.match(text, i + 1)
        if not match:
            return ["$"], None, i + 1, False
        return self._values(match.group(0), None, None), None, match.end(), False

    def expand(self, text: str) -> str:
        """``text`` with every expansion replaced, quoted so that shlex then splits words as bash does."""
        out, quote, i = [], None, 0
        while i < len(text):
            char = text[i]
            if quote == "'":
                out.append(char)
                quote = None if char == "'" else quote
            elif char == "\\":
                out.append(text[i:i + 2])
                i += 1
            elif char == "$" or (char == "`" and quote is None):
                if char == "`":
                    end = text.find("`", i + 1)
                    end = end if end > 0 else len(text)
                    values, default, stop, whole = [_substitution(text, i, end, "`", "`")], None, end + 1, False
                else:
                    values, default, stop, whole = self._parameter(text, i)
                if values is None:
                    out.append(self.expand(default))
                elif quote == '"' and whole and text[i - 1] == '"' and text[stop:stop + 1] == '"':
                    out[-1] = " ".join(shlex.quote(v) for v in values) + " "  # "${A[@]}": one word each
                    i, quote = stop + 1, None
                    self._grow(out[-1])
                    continue
                elif quote == '"':
                    out.append(re.sub(r'(["\\$`])', r"\\\1", " ".join(values)))
                else:  # unquoted: split into words
                    out.append(" ".join(shlex.quote(word) for value in values for word in value.split()))
                i = stop
                self._grow(out[-1])
                continue
            else:
                if char in "'\"" and quote is None:
                    quote = char
                elif char == '"' and quote == '"':
                    quote = None
                out.append(char)
            i += 1
        return "".join(out)


_WORD = re.compile(r"""(?:\\.|'[^']*'|"(?:[^"\\]|\\.)*"|[^\s\\'"])+""", re.S)
_WORD_CHARS = 64 * 1024
"""The longest word read: a path or a data blend is a few KiB, and shlex builds a word one
character at a time, in time quadratic in its length (a word of 1 MiB took minutes)."""


def _check_words(text: str, where: str) -> None:
    longest = max((len(match.group()) for match in _WORD.finditer(text)), default=0)
    if longest > _WORD_CHARS:
        raise AdvisorError(f"{where}: a word of {longest:,} characters; a launch script's words (flags, paths, "
                           f"values) are read up to {_WORD_CHARS:,}")


def _words(text: str, where: str) -> list[str]:
    """shlex's words of one logical line, separators (; && || |) and redirections as their own words."""
    _check_words(text, where)
    lexer = shlex.shlex(text, posix=True, punctuation_chars=";&|<>")
    lexer.whitespace_split, lexer.commenters = True, "#"
    try:
        return list(lexer)
    except ValueError as exc:
        raise AdvisorError(f"{where}: {exc}") from None


def _commands(words: list[str]) -> list[list[str]]:
    """Simple commands of one line: split at separators, redirections and their targets dropped."""
    commands, current, skip = [], [], False
    for i, word in enumerate(words):
        if skip:
            skip = False
        elif word.isdigit() and i + 1 < len(words) and _REDIRECTS.match(words[i + 1]):
            pass  # the file descriptor of '2>&1', which shlex splits off
        elif word in _SEPARATORS:
            commands.append(current)
            current = []
        elif _REDIRECTS.match(word):
            skip = True
        else:
            current.append(word)
    return [command for command in commands + [current] if command]


class _Growing:
    """A logical line growing one physical line at a time, each character read once: whether a
    quote (as shlex.split(comments=True) reads them) or an array literal (as ``_closing``) is
    still open. Re-reading the whole text at every line was quadratic: minutes for a quote or an
    array left open over a long file."""

    def __init__(self, first: str) -> None:
        array = _ARRAY_ASSIGN.match(first)
        self.array, self.closed = array is not None, array is None
        self.parts: list[str] = []
        self.quote, self.escape = None, False  # shlex: None, a quote, '#' (a comment); a backslash pending
        self.depth, self.bracket_quote, self.bracket_escape = 0, None, False
        self._add(first, array.end() - 1 if array else 0)

    @property
    def open(self) -> bool:
        return not self.closed or self.quote in ("'", '"') or self.escape

    def add(self, line: str) -> None:
        self._add("\n" + line, 0)

    def text(self) -> str:
        return "".join(self.parts)

    def _add(self, chunk: str, array_from: int) -> None:
        self.parts.append(chunk)
        for char in chunk:
            if self.escape:
                self.escape = False
            elif self.quote == "#":
                self.quote = None if char == "\n" else "#"
            elif self.quote == "'":
                self.quote = None if char == "'" else "'"
            elif self.quote == '"':
                self.escape, self.quote = char == "\\", None if char == '"' else '"'
            elif char == "\\":
                self.escape = True
            elif char in "'\"#":
                self.quote = char
        if not self.closed:
            self._brackets(chunk[array_from:])

    def _brackets(self, chunk: str) -> None:
        for char in chunk:
            if self.bracket_escape:
                self.bracket_escape = False
            elif self.bracket_quote:
                if char == "\\" and self.bracket_quote == '"':
                    self.bracket_escape = True
                elif char == self.bracket_quote:
                    self.bracket_quote = None
            elif char in "'\"":
                self.bracket_quote = char
            elif char == "\\":
                self.bracket_escape = True
            elif char in "()":
                self.depth += 1 if char == "(" else -1
                if self.depth == 0:
                    self.closed = True
                    return


def _logical_lines(text: str):
    """(first line number, text) of each logical line: continuations joined, an open quote or
    array carried over to the next physical line."""
    text = text.replace("\r\n", "\n").replace("\\\n", "")
    growing, start = None, 1
    for number, line in enumerate(text.split("\n"), start=1):
        if growing is None:
            start = number
            if line.lstrip().startswith("#"):
                yield start, line  # a comment (#SBATCH directives are read from these)
                continue
            growing = _Growing(line)
        elif growing.array and line.lstrip().startswith("#"):
            continue  # a comment line inside an array literal (its apostrophes open no quote)
        else:
            growing.add(line)
        if not growing.open:
            yield start, growing.text()
            growing = None
    if growing is not None:
        raise AdvisorError(f"line {start}: an unclosed quote or array runs to the end of the text")


@dataclass
class _Found:
    line: int
    words: list[str]
    env: dict


class _Script:
    """Walks a script, keeping its variables, #SBATCH directives and the launch command."""

    def __init__(self, environment: dict[str, str] | None = None) -> None:
        self.expander = _Expander(environment)
        self.sbatch: list[str] = []
        self.depth, self.control = 0, ""
        self.found: list[_Found] = []

    def _inside_control(self, line: int, what: str) -> None:
        if self.depth:
            raise AdvisorError(f"line {line}: {what} inside '{self.control}' (shell control flow is not run): "
                               f"paste the command it runs, or keep only the branch you use")

    def _assign_array(self, line: int, match: re.Match, text: str) -> None:
        end = _closing(text, match.end() - 1, "(", ")")
        name, append = match.group(1), match.group(2)
        self._inside_control(line, f"{name}=(...)")
        words = _words(self.expander.expand(text[match.end():end]), f"line {line}")
        self.expander.arrays[name] = (self.expander.arrays.get(name, []) if append else []) + words
        self.expander.scalars.pop(name, None)

    def read_line(self, line: int, text: str) -> None:
        stripped = text.strip()
        if stripped.startswith("#"):
            if stripped.startswith("#SBATCH"):
                _check_words(stripped, f"line {line}")
                self.sbatch += shlex.split(stripped[len("#SBATCH"):], comments=True)
            return
        match = _ARRAY_ASSIGN.match(text)
        if match:
            self._assign_array(line, match, text)
            return
        for command in _commands(_words(self.expander.expand(text), f"line {line}")):
            self._read_command(line, command)

    def _read_command(self, line: int, words: list[str]) -> None:
        head = words[0]
        if head in _CONTROL:
            self.depth += (head in _OPENERS) - (head in _CLOSERS)
            self.control = head if head in _OPENERS else self.control
            rest = [w for w in words[1:] if w not in _CONTROL]
            if head in ("then", "do", "else") and rest:
                self._read_command(line, rest)
            return
        if head == "export":
            words = words[1:] or [""]
        env = {}
        while words and re.fullmatch(r"[A-Za-z_]\w*=.*", words[0], re.S):
            name, value = words.pop(0).split("=", 1)
            env[name] = value
        if not words:  # assignments alone: the script's variables
            self._inside_control(line, ", ".join(env))
            self.expander.scalars.update(env)
            for name in env:
                self.expander.arrays.pop(name, None)
            return
        if _is_launch(words):
            self._inside_control(line, "the launch command")
            self.found.append(_Found(line, words, env))


def _basename(word: str) -> str:
    return word.rsplit("/", 1)[-1]


def _is_launch(words: list[str]) -> bool:
    """A command that runs Megatron: torchrun, a pretrain script, launch.entry, or a bare argument list."""
    return (_basename(words[0]) == "torchrun" or words[0].startswith("--")
            or any(re.search(r"pretrain_\w+\.py$", w) or w in ("launch.entry", "torch.distributed.run",
                                                               "torch.distributed.launch") for w in words))


def _options(words: list[str], valued: set[str]) -> tuple[dict[str, str], list[str]]:
    """A launcher's leading options (``--opt value``, ``--opt=value``, ``-N 2``, ``--flag``) and the rest."""
    options, i = {}, 0
    while i < len(words) and words[i].startswith("-") and words[i] != "--":
        key, _, value = words[i].lstrip("-").partition("=")
        key = key.replace("_", "-")
        if not value and key in valued and i + 1 < len(words):
            value, i = words[i + 1], i + 1
        options[key] = value
        i += 1
    return options, words[i:]


class _Unreadable(Exception):
    """A launcher's count the advisor cannot read (its text is why): the world size is unknown,
    which the user's --gpus settles, so it is not refused here but named with the other missing
    inputs (``advisor.cli.from_command``)."""


def _integer(options: dict, keys: tuple[str, ...], what: str) -> int | None:
    for key in keys:
        if key in options:
            value = options[key]
            shown = unexpanded(value)
            if shown is not None:
                raise _Unreadable(f"{what} --{key} is {shown}")
            if key == "nnodes" and ":" in value:
                value = value.split(":")[-1]  # elastic MIN:MAX: the most it runs on
            if key == "gres":
                value = value.rsplit(":", 1)[-1]
            if not value.isdecimal() or int(value) < 1:
                raise _Unreadable(f"{what} --{key} {value!r} is not a positive integer")
            return int(value)
    return None


def _torchrun_world(options: dict) -> tuple[int, str]:
    per_node = _integer(options, ("nproc-per-node",), "torchrun's") or 1
    nodes = _integer(options, ("nnodes",), "torchrun's") or 1
    return per_node * nodes, f"torchrun --nproc-per-node {per_node} x --nnodes {nodes}"


def _world(read, options: dict) -> tuple[int | None, str]:
    """(the world size ``read`` finds in a launcher's ``options``, how it was read); (None, why)
    where a count cannot be read."""
    try:
        return read(options)
    except _Unreadable as problem:
        return None, str(problem)


def _slurm_world(options: dict) -> tuple[int | None, str]:
    tasks = _integer(options, ("ntasks", "n"), "srun's")
    if tasks:
        return tasks, f"srun --ntasks {tasks}"
    nodes = _integer(options, ("nodes", "N"), "srun's") or 1
    per_node = _integer(options, ("ntasks-per-node",), "srun's")
    if per_node is None:
        return None, "srun gives no --ntasks or --ntasks-per-node"
    return nodes * per_node, f"srun --nodes {nodes} x --ntasks-per-node {per_node}"


def _python_target(words: list[str]) -> list[str]:
    """What ``python`` runs: its own options (-u, -O, -X opt, -W arg, ...) skipped, up to ``-m
    MODULE ...`` or the script."""
    i = 0
    while i < len(words) and words[i].startswith("-") and words[i] != "-m":
        i += 2 if words[i] in ("-X", "-W") else 1
    return words[i:]


def _unwrap(words: list[str], sbatch: dict) -> LaunchCommand:
    """Peel srun, torchrun / python -m torch.distributed.run, python and launch.entry off the arguments."""
    launchers, world, source, slurm, per_node = [], None, "no torchrun or srun in it", None, None
    while words:
        name = _basename(words[0])
        if name == "srun":
            options, words = _options(words[1:], _SRUN_VALUED)
            slurm, launchers = {**sbatch, **options}, launchers + ["srun"]
        elif name == "torchrun" or words[:2] in (["-m", "torch.distributed.run"], ["-m", "torch.distributed.launch"]):
            options, words = _options(words[1 if name == "torchrun" else 2:], _TORCHRUN_VALUED)
            world, source = _world(_torchrun_world, options)
            per_node = _per_node(options, "nproc-per-node", "torchrun's") if world is not None else None
            launchers.append("torchrun")
            if "no-python" in options or "m" in options or "module" in options:
                words = ["-m", *words] if "no-python" not in options else words
        elif re.fullmatch(r"python[0-9.]*", name):
            launchers = launchers or ["python"]
            words = _python_target(words[1:])
        elif words[:2] == ["-m", "launch.entry"]:
            words = words[words.index("--") + 1:] if "--" in words else []
        elif words[0] == "-m":
            raise AdvisorError(f"python -m {words[1] if len(words) > 1 else ''} is not a launcher this reads "
                               "(torchrun, torch.distributed.run, launch.entry)")
        elif re.search(r"\.py$", words[0]) or words[0].startswith("--"):
            words = words[1:] if words[0].endswith(".py") else words
            break
        else:
            raise AdvisorError(f"cannot read {as_written(words[0])!r} as a launcher or a Megatron script")
    # srun's tasks are torchrun's agents, not the ranks: an unreadable torchrun count stays unknown.
    if world is None and slurm is not None and "torchrun" not in launchers:
        world, source = _world(_slurm_world, slurm)
        per_node = _per_node(slurm, "ntasks-per-node", "srun's") if world is not None else None
    return LaunchCommand(tuple(words), "+".join(launchers) or "arguments", world, source, per_node)


def _per_node(options: dict, key: str, what: str) -> int | None:
    """A launcher's ranks per node where its options give them readably, else None."""
    try:
        return _integer(options, (key,), what)
    except _Unreadable:
        return None


def read_command(text: str) -> LaunchCommand:
    """The one Megatron launch in ``text`` (a command line, an argument list or a script)."""
    return _read_script(text)[1]


def _read_script(text: str, environment: dict[str, str] | None = None) -> tuple[_Script, LaunchCommand]:
    """``text`` walked (its variables, with ``environment`` standing for the caller's), and its launch."""
    script = _Script(environment)
    for line, logical in _logical_lines(text):
        script.read_line(line, logical)
    if not script.found:
        quoted = " (a launch inside a quoted string, as in bash -c \"...\", is not read: write the command itself)" \
            if re.search(r"torchrun|pretrain_\w+\.py", text) else ""
        raise AdvisorError("found no Megatron launch (torchrun, srun, python ... pretrain_gpt.py, or an argument "
                           f"list starting with --){quoted}")
    if len(script.found) > 1:
        lines = ", ".join(str(found.line) for found in script.found)
        raise AdvisorError(f"found {len(script.found)} Megatron launches (lines {lines}): give the one to read")
    sbatch, _ = _options(script.sbatch, _SRUN_VALUED)
    return script, _unwrap(script.found[0].words, sbatch)


_PROBE = "7919"
"""A value no launch script defaults a count to (a prime): the world size changes with it where it
depends on the variable it stands for."""


def world_defaults(text: str) -> tuple[tuple[str, str], ...]:
    """(name, default as written) of each variable the script's world size comes from through its
    own ``${NAME:-default}`` (Megatron's MoE README: NNODES=${NNODES:-"1"}), the caller's
    environment not being read: each default the script took is set, alone, to another value,
    and kept where the world size then differs. Empty where ``text`` gives no world size."""
    script, launch = _read_script(text)
    if launch.world_size is None:
        return ()
    found = []
    for name, default in list(script.expander.defaulted.items())[:limits.COMMAND_DEFAULTS_PROBED]:
        try:
            probed = _read_script(text, {name: _PROBE})[1].world_size
        except AdvisorError:
            continue  # the other value breaks the reading elsewhere: no evidence either way
        if probed != launch.world_size:
            found.append((name, default))
    return tuple(found)
