"""The bounded readers and the atomic writer (advisor.fileio) against hostile files and paths."""

import os
import stat
import threading

import pytest

from advisor import limits
from advisor.errors import AdvisorError
from advisor.fileio import JsonLines, atomic_write_text, is_stdout, output_target, parse_json, read_json


@pytest.mark.parametrize("text,message", [
    ("[" * 200_000 + "]" * 200_000, "JSON nested deeper than 64 levels"),  # was a RecursionError
    ("[" * 65 + "]" * 65, "JSON nested deeper than 64 levels"),
    ('{"hidden_size": 1' + "0" * 400 + "}", "does not fit in 64 bits"),
    ('{"a": 1' + "0" * 5000 + "}", "does not fit in 64 bits"),  # int() refuses over 4,300 digits
    ('{"a": 9223372036854775808}', "does not fit in 64 bits"),
    ('{"a": -9223372036854775808}', "does not fit in 64 bits"),
    ('{"a": NaN}', "NaN is not a JSON number"),
    ('{"a": -Infinity}', "-Infinity is not a JSON number"),
    ('{"a": 1e400}', "1e400 is beyond the range of a double"),
    ('{"a": 1, "a": 2}', '"a" appears twice as a key of one object'),
    ('{"a": ', "malformed JSON at line 1, column 7"),
    ("\n\n[1, 2,]", "malformed JSON at line 3"),
])
def test_hostile_json_is_one_error_naming_the_file(tmp_path, text, message):
    path = tmp_path / "x.json"
    path.write_text(text)
    with pytest.raises(AdvisorError) as error:
        read_json(path)
    assert str(error.value).startswith(f"{path}") and message in str(error.value)
    assert "\n" not in str(error.value)


def test_bounded_json_that_is_valid_reads_as_json():
    text = '{"a": [1, -2, 2.5e300, 9223372036854775807, {"b": null, "c": "\\u00e9"}]}'
    assert parse_json(text, "x") == {"a": [1, -2, 2.5e300, 2**63 - 1, {"b": None, "c": "é"}]}
    assert parse_json("[" * 64 + "]" * 64, "x") is not None  # 64 levels are allowed


def test_the_line_and_key_of_a_refused_number_are_named():
    with pytest.raises(AdvisorError, match=r"x: line 3: b = NaN is not"):
        parse_json('{\n "a": 1,\n "b": NaN\n}', "x")
    with pytest.raises(AdvisorError, match=r"x: line 1: 1e999 is beyond"):  # in a list: no key to name
        parse_json('[1, 1e999]', "x")


def test_non_utf8_bytes_and_a_bom(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_bytes(b'{"a": "\xff"}')
    with pytest.raises(AdvisorError, match=r"bad.json: not UTF-8 text \(byte 0xff at offset 7\)"):
        read_json(bad)
    bom = tmp_path / "bom.json"
    bom.write_bytes(b'\xef\xbb\xbf{"a": 1}')
    assert read_json(bom) == {"a": 1}


def _in_thread(function, *args):
    """Run ``function`` with a deadline: a reader that blocks on a FIFO would hang the test suite."""
    result = {}

    def target():
        try:
            result["value"] = function(*args)
        except BaseException as exc:  # handed to the test
            result["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    thread.join(timeout=10)
    assert not thread.is_alive(), "the reader blocked"
    return result


@pytest.mark.parametrize("make,kind", [
    (lambda path: os.mkfifo(path), "is a FIFO (named pipe)"),
    (lambda path: os.symlink("/dev/zero", path), "is a character device"),
    (lambda path: os.mkdir(path), "is a directory"),
])
def test_what_is_not_a_regular_file_is_refused_without_reading(tmp_path, make, kind):
    path = tmp_path / "input.json"
    make(path)
    for reader in (read_json, lambda p: list(JsonLines(p, max_bytes=100, what="rank file"))):
        result = _in_thread(reader, path)
        assert isinstance(result.get("error"), AdvisorError) and kind in str(result["error"])


def test_a_file_over_its_bound_is_refused_before_reading(tmp_path, monkeypatch):
    path = tmp_path / "big.json"
    path.write_text("[" + "1," * 100 + "1]")
    monkeypatch.setattr(limits, "JSON_FILE_BYTES", 100)
    with pytest.raises(AdvisorError, match=r"big.json is 203 bytes; a JSON file is at most 100"):
        read_json(path, max_bytes=limits.JSON_FILE_BYTES)


def test_json_lines_tolerate_a_cut_last_line_only(tmp_path):
    path = tmp_path / "rank.jsonl"
    path.write_bytes(b'{"a": 1}\n\n{"b": 2}\n{"c": [1, 2')
    lines = JsonLines(path, max_bytes=1000, what="rank file")
    assert list(lines) == [(1, {"a": 1}), (3, {"b": 2})] and lines.truncated_line == 4
    path.write_bytes(b'{"a": 1}\n{"c": [1, 2\n{"b": 2}\n')  # cut in the middle: damage, not an interrupted append
    with pytest.raises(AdvisorError, match=r"rank.jsonl:2: malformed JSON"):
        list(JsonLines(path, max_bytes=1000, what="rank file"))
    path.write_bytes(b'{"a": 1}\n{"b": "\xc3')  # cut inside a UTF-8 sequence
    assert list(JsonLines(path, max_bytes=1000, what="rank file")) == [(1, {"a": 1})]
    path.write_bytes(b'{"a": 1}')  # complete but for its newline
    assert list(JsonLines(path, max_bytes=1000, what="rank file")) == [(1, {"a": 1})]


def test_a_json_line_over_its_bound_is_refused(tmp_path, monkeypatch):
    monkeypatch.setattr(limits, "JSON_LINE_BYTES", 16)
    path = tmp_path / "rank.jsonl"
    path.write_text('{"a": 1}\n{"b": "' + "x" * 40 + '"}\n')
    with pytest.raises(AdvisorError, match=r"rank.jsonl:2: line longer than 16 bytes"):
        list(JsonLines(path, max_bytes=1000, what="rank file"))


# --- writing ---------------------------------------------------------------------------------


@pytest.fixture
def umask_027():
    old = os.umask(0o027)
    yield
    os.umask(old)


def test_a_new_file_gets_the_umask_and_a_replaced_one_keeps_its_mode(tmp_path, umask_027):
    path = tmp_path / "out.json"
    atomic_write_text(path, "1")
    assert stat.S_IMODE(path.stat().st_mode) == 0o640  # 0666 & ~027, not mkstemp's 0600
    path.chmod(0o604)
    atomic_write_text(path, "2")
    assert stat.S_IMODE(path.stat().st_mode) == 0o604 and path.read_text() == "2"
    assert os.listdir(tmp_path) == ["out.json"]


def test_a_symlink_is_followed_and_kept(tmp_path):
    target, link = tmp_path / "real.json", tmp_path / "link.json"
    target.write_text("old")
    link.symlink_to("real.json")
    atomic_write_text(link, "new")
    assert link.is_symlink() and target.read_text() == "new"


def test_a_245_character_name_is_written(tmp_path):
    path = tmp_path / ("x" * 240 + ".json")  # the temporary name must fit in 255 bytes too
    atomic_write_text(path, "ok")
    assert path.read_text() == "ok" and os.listdir(tmp_path) == [path.name]


@pytest.mark.parametrize("name,message", [
    ("/dev/null", "/dev/null is a character device: output files are written atomically, as regular files only"),
    ("/dev/full", "/dev/full is a character device"),
    ("/dev/stdout", "/dev/stdout names an open file descriptor, not a file"),
    ("/dev/fd/2", "/dev/fd/2 names an open file descriptor"),
    ("missing/out.json", "missing/out.json: no such directory"),
    ("readonly.json", "readonly.json is read-only; it is not replaced"),
    ("fifo", "fifo is a FIFO (named pipe)"),
    ("dir", "dir is a directory"),
    ("x" * 256, "the file name is longer than 255 bytes"),
    ("", "the output path '' names no file"),
    ("new/", "new/ ends in '/', which names a directory; give a file name"),
    ("dir/", "dir/ ends in '/', which names a directory"),
    ("readonly.json/", "readonly.json/ ends in '/', which names a directory"),
    ("/proc/self/fd/1", "/proc/self/fd/1 names an open file descriptor"),
])
def test_what_cannot_be_replaced_atomically_is_refused_by_its_name(tmp_path, monkeypatch, name, message):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "readonly.json").write_text("keep")
    (tmp_path / "readonly.json").chmod(0o444)
    os.mkfifo(tmp_path / "fifo")
    (tmp_path / "dir").mkdir()
    with pytest.raises(AdvisorError) as error:
        atomic_write_text(name, "new")
    assert message in str(error.value) and ".tmp" not in str(error.value)
    assert (tmp_path / "readonly.json").read_text() == "keep"
    assert sorted(os.listdir(tmp_path)) == ["dir", "fifo", "readonly.json"]


@pytest.mark.skipif(not os.path.isdir("/proc/self"), reason="no /proc here (Linux's process file system)")
def test_a_proc_path_that_is_no_descriptor_gets_the_error_a_write_would_meet():
    """'/proc/x.out names an open file descriptor' was said of every path in /proc."""
    with pytest.raises(AdvisorError) as error:
        output_target("/proc/x.out")
    assert str(error.value) == "/proc/x.out: cannot create files in /proc: No such file or directory"
    assert not os.path.exists("/proc/x.out")


def test_a_trailing_slash_on_the_command_line_is_refused_before_any_work(advisor, tmp_path):
    """-o out/ (a directory, by POSIX) wrote the regular file 'out' and exited 0; --plot likewise."""
    assert advisor.error("models", "-o", f"{tmp_path}/new/") == (
        f"Error: Invalid value for '-o' / '--output': {tmp_path}/new/ ends in '/', which names a directory; give a "
        "file name (see 'cli models --help')")
    assert "ends in '/'" in advisor.error("sweep", "--gpus", 8, "--mem", 40, "--plot", f"{tmp_path}/p/")
    assert os.listdir(tmp_path) == []


def test_a_failed_write_names_the_users_path_and_leaves_nothing(tmp_path, monkeypatch):
    path = tmp_path / "out.json"
    path.write_text("old")

    def full(fd, data):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "write", full)
    with pytest.raises(AdvisorError, match=rf"^{path}: cannot write: No space left on device$"):
        atomic_write_text(path, "new")
    monkeypatch.undo()
    assert path.read_text() == "old" and os.listdir(tmp_path) == ["out.json"]


def test_stdout_is_recognised_by_name_and_by_identity(tmp_path):
    assert is_stdout("-") and not is_stdout(tmp_path / "x")
    assert is_stdout("/dev/stdout") == (os.fstat(1).st_ino == os.stat("/dev/stdout").st_ino)
    target, info = output_target(tmp_path / "new.json")
    assert target == tmp_path / "new.json" and info is None


def test_every_bound_says_why():
    for name, bound in [*limits.MODEL.items(), ("seq", limits.SEQ_LEN), ("gbs", limits.GLOBAL_BATCH),
                        ("gpus", limits.GPUS), ("mem", limits.GPU_MEMORY_GIB)]:
        assert bound.low < bound.high and len(bound.why) > 20, name
    with pytest.raises(AdvisorError, match=r"num_layers must be at most 4,096, got 1000000000000000000: the deepest"):
        limits.check_int(10**18, "num_layers", limits.MODEL["num_layers"])
    with pytest.raises(AdvisorError, match=r"must be at most 1,048,576, got a 401-digit number"):
        limits.check_int(10**400, "hidden_size", limits.MODEL["hidden_size"])
    with pytest.raises(AdvisorError, match=r"memory must be a finite number, got inf"):
        limits.check_float(float("inf"), "memory", limits.GPU_MEMORY_GIB, low_open=True)
    with pytest.raises(AdvisorError, match=r"memory must be a finite number, got nan"):
        limits.check_float(float("nan"), "memory", limits.GPU_MEMORY_GIB, low_open=True)
    with pytest.raises(AdvisorError, match=r"memory must be above 0, got 0"):
        limits.check_float(0, "memory", limits.GPU_MEMORY_GIB, low_open=True)
    with pytest.raises(AdvisorError, match=r"tp must be an integer, got '2'"):
        limits.check_int("2", "tp", limits.DEGREE)
