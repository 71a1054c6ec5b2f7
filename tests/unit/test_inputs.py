"""The one way in for every file a verb reads (helpers.inputs): kinds refused, bounds, BOM, streams, structured text."""

from __future__ import annotations

import errno
import io
import os
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import inputs

BOMB = "a: &a [x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{n}: &{n} [{', '.join([f'*{p}'] * 9)}]\n" for p, n in zip("abcdefgh", "bcdefghi"))


def test_regular_file_read_whole_with_bom_dropped(tmp_path):
    f = tmp_path / "x.log"
    f.write_bytes(b"\xef\xbb\xbfhost:1:1 NCCL INFO a\r\nsecond\n")
    assert inputs.read_text(f) == "host:1:1 NCCL INFO a\r\nsecond\n"
    assert inputs.read_bytes(f).startswith(b"\xef\xbb\xbf")  # bytes are raw; decode() drops the BOM
    with inputs.open_lines(f) as lines:
        assert list(lines) == ["host:1:1 NCCL INFO a\n", "second\n"]


@pytest.mark.parametrize("make,kind", [
    (lambda d: (os.mkfifo(d / "f"), d / "f")[1], "a FIFO (named pipe)"),
    (lambda d: (os.symlink("/dev/zero", d / "z"), d / "z")[1], "a character device"),
    (lambda d: (os.symlink(d / "l", d / "l"), d / "l")[1], "a symbolic link loop"),
    (lambda d: d, "a directory"),
    (lambda d: (os.symlink(d, d / "s"), d / "s")[1], "a directory"),
    (lambda d: d / "missing", "no such file"),
])
def test_what_is_not_a_regular_file_is_refused_at_once_naming_path_and_kind(tmp_path, make, kind):
    path = make(tmp_path)
    t0 = time.monotonic()
    for read in (inputs.read_text, inputs.read_bytes):
        with pytest.raises(inputs.InputError) as err:
            read(path)
        assert str(err.value).startswith(f"{path}: ") and kind in str(err.value) and "\n" not in str(err.value)
    assert time.monotonic() - t0 < 2  # a FIFO without a writer did not block


def test_unreadable_file_names_path(tmp_path, monkeypatch):
    f = tmp_path / "secret.txt"
    f.write_text("x")
    real = os.open

    def denied(path, *a, **k):
        if os.fspath(path) == str(f):
            raise PermissionError(errno.EACCES, "Permission denied", str(f))
        return real(path, *a, **k)

    monkeypatch.setattr(os, "open", denied)  # the tests run as root, where chmod 000 still reads
    with pytest.raises(inputs.InputError, match=r"secret.txt: cannot open it: permission denied"):
        inputs.read_text(f)


def test_size_and_line_bounds(tmp_path):
    f = tmp_path / "big"
    f.write_bytes(b"a" * 100 + b"\n")
    with pytest.raises(inputs.InputError, match="101 bytes, larger than the limit of 100 bytes"):
        inputs.read_bytes(f, max_bytes=100)
    with pytest.raises(inputs.InputError, match="line 1 is 100 characters long, over the limit of 99"):
        inputs.read_text(f, max_line_chars=99)
    with inputs.open_lines(f, max_line_chars=10) as lines, pytest.raises(inputs.InputError, match="longer than the limit"):
        list(lines)
    with inputs.open_lines(f, max_line_chars=10, long_lines="cut") as lines:
        assert list(lines) == ["a" * 10 + "\n"] and lines.cut == 1
    with pytest.raises(inputs.InputError, match="101 bytes, larger than the limit of 50 bytes"):
        inputs.open_lines(f, max_bytes=50).__enter__()
    with pytest.raises(inputs.InputError, match="^-: larger than the limit of 50 bytes"):
        with inputs.open_lines("-", stdin=io.BytesIO(b"ab\n" * 40), max_bytes=50) as lines:
            list(lines)


def test_binary_and_non_utf8_text(tmp_path):
    (tmp_path / "nul").write_bytes(b"abc\x00def")
    (tmp_path / "latin").write_bytes(b"caf\xe9\n")
    with pytest.raises(inputs.InputError, match="binary file, not text \\(NUL byte at offset 3\\)"):
        inputs.read_text(tmp_path / "nul")
    with pytest.raises(inputs.InputError, match="not UTF-8 text \\(byte 0xe9 at offset 3\\)"):
        inputs.read_text(tmp_path / "latin")
    assert inputs.read_text(tmp_path / "latin", errors="replace") == "caf\ufffd\n"


def test_pipe_by_descriptor_is_read_whole_not_just_after_a_sniffed_head():
    """``<(cat x.log)`` passes /dev/fd/N: a pipe, read once from its first byte (nccl-log lost 8 KB there)."""
    payload = b"".join(b"line %06d\n" % i for i in range(5000))  # 60 KB: past any 8 KB sniff
    r, w = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(w, payload), os.close(w)))
    writer.start()
    try:
        with inputs.open_lines(f"/dev/fd/{r}") as lines:
            assert lines.head == payload[:len(lines.head)] and lines.head
            got = list(lines)
    finally:
        writer.join()
        os.close(r)
    assert "".join(got).encode() == payload


def test_stdin_dash_text_or_binary():
    assert inputs.read_text("-", stdin=io.StringIO("\ufeffa\nb\n")) == "a\nb\n"
    assert inputs.read_bytes("-", stdin=io.BytesIO(b"xy")) == b"xy"
    with pytest.raises(inputs.InputError, match=r"^-: larger than the limit of 3 bytes"):
        inputs.read_bytes("-", stdin=io.BytesIO(b"abcd"), max_bytes=3)


def test_read_each_keeps_going_and_names_each_failure(tmp_path):
    (tmp_path / "a").write_text("A")
    (tmp_path / "c").write_text("C")
    good, bad = inputs.read_each([tmp_path / "a", tmp_path / "b", tmp_path, tmp_path / "c"])
    assert good == [(str(tmp_path / "a"), "A"), (str(tmp_path / "c"), "C")]
    assert [e.path for e in bad] == [str(tmp_path / "b"), str(tmp_path)]


@pytest.mark.parametrize("text,reason", [
    ("[" * 1000 + "]" * 1000, "nested too deeply"),
    ("[" * 101 + "]" * 101, "more than 100 levels"),
    ('{"a": NaN}', "NaN is not a JSON number"),
    ('{"a": Infinity}', "Infinity is not a JSON number"),
    ("1" * 5000, "not usable JSON"),
    ('{"a": ', "not valid JSON: Expecting value (line 1, column 7)"),
])
def test_json_bounds(text, reason):
    with pytest.raises(inputs.InputError) as err:
        inputs.load_json(text, "ds.json")
    assert str(err.value).startswith("ds.json: ") and reason in str(err.value)


def test_json_accepts_bom_and_depth_at_the_bound():
    assert inputs.load_json("\ufeff" + "[" * 100 + "]" * 100, "x") is not None
    assert inputs.load_json(b'{"a": [1]}', "x") == {"a": [1]}


@pytest.mark.parametrize("text,reason", [
    (BOMB, "YAML nodes once its aliases are expanded"),
    ("&a [*a]", "YAML nodes once its aliases are expanded"),
    ("- " * 500 + "x", "nested too deeply"),
    ("[" * 500 + "]" * 500, "nested too deeply"),
    ("x: !!python/object/apply:os.system [ls]", "could not determine a constructor"),
    ("{[1]: 2}", "found unhashable key"),
    ("a: 1\n---\nb: 2", "not valid YAML"),
    ("a: [", "not valid YAML"),
])
def test_yaml_bounds(text, reason):
    t0 = time.monotonic()
    with pytest.raises(inputs.InputError) as err:
        inputs.load_yaml(text, "acc.yaml")
    assert str(err.value).startswith("acc.yaml: ") and reason in str(err.value)
    assert time.monotonic() - t0 < 5


def test_yaml_ordinary_documents_and_shared_anchors():
    assert inputs.load_yaml("", "x") is None
    assert inputs.load_yaml("\ufeffbase: &b {lr: 1}\nrun: *b\n", "x") == {"base": {"lr": 1}, "run": {"lr": 1}}


@settings(max_examples=40, deadline=None, derandomize=True, database=None)
@given(st.lists(st.sampled_from(["a", "b", "\n", "\r", "\r\n", "xyzxyz", "\u2028", "\x0c"]), max_size=40).map("".join),
       st.integers(1, 12), st.integers(1, 30))
def test_open_lines_reads_what_a_text_file_reads_with_long_lines_cut(text, limit, chunk):
    """Lines as ``open()``'s text mode gives them (universal newlines, only ``\\n`` ends a line), whatever the chunking."""
    want, cut = [], 0
    for line in io.StringIO(text, newline=None):
        body = line.removesuffix("\n")
        want.append(body[:limit] + "\n" if len(body) > limit else line)
        cut += len(body) > limit
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(inputs, "_TEXT_CHUNK", chunk)
        with inputs.open_lines("-", stdin=io.BytesIO(text.encode()), max_line_chars=limit, long_lines="cut") as lines:
            assert list(lines) == want and lines.cut == cut
        with inputs.open_lines("-", stdin=io.BytesIO(text.encode()), max_line_chars=limit, long_lines="cut") as lines:
            batches = list(lines.batches())
        assert [line for batch in batches for line in batch] == [line.removesuffix("\n") for line in want]
        assert lines.cut == cut and all(batches)


def test_a_control_character_in_yaml_is_one_input_error():
    """PyYAML's Reader refuses a control character when the loader is built, before parsing: still an InputError."""
    import pytest

    from helpers import inputs

    with pytest.raises(inputs.InputError, match=r"cfg: not valid YAML: unacceptable character #x0001"):
        inputs.load_yaml(b'\x01{"a": 1}', "cfg")
