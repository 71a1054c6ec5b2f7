"""One way in for every file a ``runbook`` verb reads: regular files and stdin only, bounded, BOM stripped.

Every reader of the project (``nccl-log``, ``lint``, ``build --check-file``, the doctor's stacks, traces and
Flight Recorder dumps) opens its inputs here, so that bad input gives one :class:`InputError` naming the path
(a ``ValueError``: the verbs print it as one line and exit 2) and never a traceback, a hang or a silent loss.

What is read:

* **Regular files** (a symbolic link is followed to its target).  A directory, a FIFO, a socket, a character
  or block device (``/dev/zero``, a terminal) or a link to one is refused *before* anything is read, with the
  kind named: opening a FIFO blocks until a writer comes, and a device may never end.  The file is opened with
  ``O_NONBLOCK`` and its kind taken from ``fstat`` of the open descriptor, so the check and the read see the
  same file (no race between a ``stat`` and the ``open``), and a FIFO is refused without blocking.
* **Streams**: ``-`` (the process's stdin), ``/dev/stdin``, ``/dev/fd/N`` and ``/proc/self/fd/N`` (what a
  shell's process substitution ``<(cmd)`` passes) may be pipes, sockets or terminals; they are read once,
  front to back, never seeked and never opened twice (reading a pipe's head to sniff it and then opening it
  again loses that head: ``nccl-log <(cat x.log)`` used to drop its first 8 KB).  ``/dev/fd/N`` of a socket
  cannot be opened on Linux (``ENXIO``); that is reported like any other open error.

Bounds (stated in docs/inputs.md; each reader may pass its own):

* :data:`MAX_BYTES` (64 MiB): the most a whole-file read (:func:`read_bytes`, :func:`read_text`) takes; a
  regular file larger than that is refused from its size alone, a stream when it passes the bound.
* :data:`MAX_STREAM_BYTES` (4 GiB): the most a line-streaming read (:func:`open_lines`) takes (NCCL logs of
  a large job reach hundreds of MB; ``nccl-log`` streams them in bounded memory).
* :data:`MAX_LINE_CHARS` (1 Mi characters): the longest line; :func:`read_text` refuses the file, and
  :func:`open_lines` refuses it or cuts the line (``long_lines="cut"``) without holding it in memory.
* :data:`MAX_DEPTH` (100): the deepest nesting :func:`load_json` and :func:`load_yaml` accept; deeper is
  "too deeply nested", not a ``RecursionError``.
* :data:`MAX_YAML_NODES` (100,000): the most nodes a YAML document may hold *with its aliases expanded*
  (an "alias bomb" of a few hundred bytes expands to billions; PyYAML shares the aliased objects, but every
  consumer that walks the result pays the expanded size).

Text is UTF-8 (``errors`` says what an invalid byte does); one leading byte-order mark (``EF BB BF``) is
dropped (a BOM-prefixed log used to make a phantom host out of its first line).  :func:`read_each` reads
several paths and reports every failure with its path while still returning the inputs that were read.

Why home-made: Python's ``open`` follows a path to whatever it names and blocks on a FIFO, ``Path.read_text``
has no size bound, and ``json``/``yaml`` have no depth or expansion bound; there is no library that puts
these together, so this module is the thin layer over ``os.open``/``fstat``, :class:`io.TextIOWrapper`
(universal newlines, the ``utf-8-sig`` codec that drops the BOM), :mod:`json` and PyYAML's ``SafeLoader``.
"""

from __future__ import annotations

import errno
import fcntl
import io
import json
import os
import re
import stat
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from typing import IO, Any, Literal, TypeVar

MAX_BYTES = 64 * 2**20
"""Bytes a whole-file read (:func:`read_bytes`, :func:`read_text`) accepts by default: 64 MiB."""

MAX_STREAM_BYTES = 4 * 2**30
"""Bytes a line-streaming read (:func:`open_lines`) accepts by default: 4 GiB."""

MAX_LINE_CHARS = 2**20
"""Characters one line may hold by default: 1,048,576 (1 Mi)."""

MAX_DEPTH = 100
"""Deepest nesting of lists/objects that :func:`load_json` / :func:`load_yaml` accept by default."""

MAX_YAML_NODES = 100_000
"""Most YAML nodes (scalars, sequences, mappings) one document may hold with every alias expanded."""

BOM = "\ufeff"
"""The UTF-8 byte-order mark as a character (``EF BB BF`` as bytes)."""

_STREAM = re.compile(r"-|/dev/stdin|/dev/fd/\d+|/proc/self/fd/\d+")
_KINDS = ((stat.S_ISDIR, "a directory, not a file"), (stat.S_ISFIFO, "a FIFO (named pipe), not a regular file"),
          (stat.S_ISSOCK, "a socket, not a regular file"), (stat.S_ISCHR, "a character device, not a regular file"),
          (stat.S_ISBLK, "a block device, not a regular file"))
_ERRNO = {errno.ENOENT: "no such file or directory", errno.EACCES: "permission denied", errno.EPERM: "permission denied",
          errno.ELOOP: "a symbolic link loop (too many levels of symbolic links)", errno.EISDIR: "a directory, not a file",
          errno.ENOTDIR: "not a directory (or a part of the path is not)", errno.ENAMETOOLONG: "the name is too long",
          errno.ENXIO: "no such device (a socket or a closed descriptor cannot be opened by name)"}
_CHUNK = 1 << 16
_TEXT_CHUNK = 1 << 18

T = TypeVar("T")


class InputError(ValueError):
    """One input that cannot be read or parsed: ``str(err)`` is ``"<path>: <reason>"``, one line.

    Attributes:
        path: the input as the user named it (``-`` for stdin); reason: what is wrong with it.
    """

    def __init__(self, path: str | os.PathLike[str], reason: str) -> None:
        self.path = os.fspath(path)
        self.reason = " ".join(str(reason).split())  # one line, whatever the reason quoted
        super().__init__(f"{self.path}: {self.reason}")


def is_stream(path: str | os.PathLike[str]) -> bool:
    """Whether ``path`` names stdin or an inherited descriptor (``-``, ``/dev/stdin``, ``/dev/fd/N``, ``/proc/self/fd/N``)."""
    return bool(_STREAM.fullmatch(os.fspath(path)))


def os_reason(exc: OSError) -> str:
    """A short lower-case reason for an ``OSError`` (``no such file or directory``, ``permission denied``, ...)."""
    return _ERRNO.get(exc.errno or 0) or (exc.strerror or str(exc)).lower()


def _binary(stream: IO[Any]) -> IO[bytes]:
    """The byte stream under ``stream``: its ``.buffer`` (``sys.stdin``), itself when it yields bytes, else an encoder."""
    buffer = getattr(stream, "buffer", None)
    if buffer is not None:
        return buffer
    if isinstance(stream, io.TextIOBase):
        return _Encoded(stream)  # type: ignore[return-value]
    return stream


class _Encoded(io.RawIOBase):
    """A text stream (``io.StringIO`` in tests) read as UTF-8 bytes."""

    def __init__(self, text: IO[str]) -> None:
        self._text, self._pending = text, b""

    def readable(self) -> bool:  # noqa: D102 - io API
        return True

    def readinto(self, b: Any) -> int:  # noqa: D102 - io API
        while not self._pending:
            chunk = self._text.read(_CHUNK)
            if not chunk:
                return 0
            self._pending = chunk.encode("utf-8", "surrogatepass")
        n = min(len(b), len(self._pending))
        b[:n], self._pending = self._pending[:n], self._pending[n:]
        return n


class _Bounded(io.RawIOBase):
    """A byte stream that raises :class:`InputError` once more than ``limit`` bytes came through it."""

    def __init__(self, raw: IO[bytes], limit: int, name: str) -> None:
        self._raw, self._limit, self._name, self.count = raw, limit, name, 0

    def readable(self) -> bool:  # noqa: D102 - io API
        return True

    def readinto(self, b: Any) -> int:  # noqa: D102 - io API
        data = self._raw.read(min(len(b), self._limit + 1 - self.count))
        n = len(data)
        self.count += n
        if self.count > self._limit:
            raise InputError(self._name, f"larger than the limit of {self._limit:,} bytes")
        b[:n] = data
        return n


@contextmanager
def open_binary(path: str | os.PathLike[str], *, stdin: IO[Any] | None = None,
                max_bytes: int | None = None) -> Iterator[IO[bytes]]:
    """Open ``path`` for reading bytes, refusing anything that is not a regular file or a stream (module docstring).

    Args:
        path: a file; ``-`` reads ``stdin``; ``/dev/stdin``, ``/dev/fd/N``, ``/proc/self/fd/N`` are streams.
        stdin: what ``-`` reads (default ``sys.stdin``; a text stream is read as UTF-8).
        max_bytes: when given, a regular file larger than this is refused before it is read (streams are
            bounded by the reader).

    Yields:
        A binary file object (stdin is not closed on exit; everything opened here is).

    Raises:
        InputError: missing, unreadable, a symbolic link loop, a directory, a FIFO, a socket, a device,
            or larger than ``max_bytes``; the message names ``path`` and the kind.
    """
    name = os.fspath(path)
    if name == "-":
        yield _binary(stdin if stdin is not None else sys.stdin)
        return
    try:
        fd = os.open(name, os.O_RDONLY | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC)
    except OSError as exc:
        raise InputError(name, f"cannot open it: {os_reason(exc)}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            kind = next((text for test, text in _KINDS if test(st.st_mode)), "not a regular file")
            if not (is_stream(name) and not stat.S_ISDIR(st.st_mode)):
                hint = " (give a pipe's content on stdin: ... | runbook VERB -)" if stat.S_ISFIFO(st.st_mode) else ""
                raise InputError(name, kind + hint)
        elif max_bytes is not None and st.st_size > max_bytes:
            raise InputError(name, f"{st.st_size:,} bytes, larger than the limit of {max_bytes:,} bytes")
        fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)  # a stream: block on read
        fh = os.fdopen(fd, "rb", buffering=0)
    except BaseException:
        os.close(fd)
        raise
    with fh:
        yield fh  # type: ignore[misc]


def _read_all(fh: IO[bytes], limit: int, name: str) -> bytes:
    """At most ``limit`` bytes of ``fh``; :class:`InputError` when there are more."""
    chunks, total = [], 0
    while True:
        try:
            chunk = fh.read(min(1 << 20, limit + 1 - total))
        except OSError as exc:
            raise InputError(name, f"cannot read it: {os_reason(exc)}") from None
        if not chunk:
            return b"".join(chunks)
        chunks.append(chunk)
        total += len(chunk)
        if total > limit:
            raise InputError(name, f"larger than the limit of {limit:,} bytes")


def read_bytes(path: str | os.PathLike[str], *, max_bytes: int = MAX_BYTES, stdin: IO[Any] | None = None) -> bytes:
    """The whole content of ``path`` (a regular file or a stream, see :func:`open_binary`), at most ``max_bytes``.

    Raises:
        InputError: see :func:`open_binary`; larger than ``max_bytes``; a read error.
    """
    name = os.fspath(path)
    with open_binary(name, stdin=stdin, max_bytes=max_bytes) as fh:
        return _read_all(fh, max_bytes, name)


def decode(data: bytes, path: str | os.PathLike[str], *, errors: str = "strict", max_line_chars: int = MAX_LINE_CHARS,
           allow_nul: bool = False) -> str:
    """``data`` as UTF-8 text with one leading BOM dropped, checked for NUL bytes and line length.

    Args:
        data: the bytes; path: the name for messages; errors: the codec's ``errors`` (``strict``: an invalid
            byte is an error; ``replace``: U+FFFD); max_line_chars: the longest line accepted;
            allow_nul: whether a NUL byte is text (default no: a NUL means a binary file).

    Raises:
        InputError: not UTF-8 (with ``errors="strict"``; the byte offset named), a NUL byte, a line longer
            than ``max_line_chars`` (its number named).
    """
    if not allow_nul and (at := data.find(b"\x00")) >= 0:
        raise InputError(path, f"a binary file, not text (NUL byte at offset {at})")
    try:
        text = data.decode("utf-8-sig", errors)
    except UnicodeDecodeError as exc:
        raise InputError(path, f"not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start})") from None
    check_lines(text, path, max_line_chars)
    return text


def check_lines(text: str, path: str | os.PathLike[str], max_line_chars: int = MAX_LINE_CHARS) -> None:
    """Raise :class:`InputError` naming the first line of ``text`` longer than ``max_line_chars`` characters."""
    if len(text) <= max_line_chars:
        return
    for number, line in enumerate(text.splitlines(), 1):
        if len(line) > max_line_chars:
            raise InputError(path, f"line {number} is {len(line):,} characters long, over the limit of {max_line_chars:,}")


def read_text(path: str | os.PathLike[str], *, max_bytes: int = MAX_BYTES, max_line_chars: int = MAX_LINE_CHARS,
              errors: str = "strict", allow_nul: bool = False, stdin: IO[Any] | None = None) -> str:
    """The whole of ``path`` as text: :func:`read_bytes` then :func:`decode` (BOM dropped; NUL and line length checked).

    Raises:
        InputError: every reason of :func:`read_bytes` and :func:`decode`, naming ``path``.
    """
    return decode(read_bytes(path, max_bytes=max_bytes, stdin=stdin), path, errors=errors,
                  max_line_chars=max_line_chars, allow_nul=allow_nul)


class Lines:
    """The lines of one input, streamed (see :func:`open_lines`): iterate for ``str`` lines ending in ``"\\n"``, or
    take them a list at a time without the newline (:meth:`batches`).

    Attributes:
        path: the input's name; head: its first bytes (up to 8 KiB, fewer from a slow pipe), peeked without
            consuming them, for sniffing (gzip magic ``1f 8b``, NUL bytes); cut: how many lines were cut.
    """

    def __init__(self, path: str, text: io.TextIOWrapper, head: bytes, max_line_chars: int,
                 long_lines: Literal["error", "cut"]) -> None:
        self.path, self.head, self.cut = path, head, 0
        self._text, self._max, self._long_lines = text, max_line_chars, long_lines

    def __iter__(self) -> Iterator[str]:
        """The lines, each ending in ``"\\n"`` but the last one when the input does not end with a newline.

        The whole lines of each block (:meth:`_blocks`) are split by :class:`io.StringIO` (C speed, as fast as
        iterating a file).
        """
        for block in self._blocks():
            yield from io.StringIO(block)

    def batches(self) -> Iterator[list[str]]:
        """The same lines as iterating, *without* their ``"\\n"``, a list at a time (one per chunk read).

        For a reader whose per-line work is small (``nccl-log`` on a log of millions of lines): ``str.split`` of
        a block costs less than a line iterator (which converts the block to UCS-4 and back, line by line), and
        ``itertools.chain.from_iterable(lines.batches())`` streams them from C.
        """
        for block in self._blocks():
            batch = block.split("\n")
            if block[-1:] == "\n":
                batch.pop()     # the empty text after the block's last newline
            yield batch

    def _blocks(self) -> Iterator[str]:
        """The input as blocks of whole lines, each line ending in ``"\\n"`` (the last one may not), long lines cut.

        Read in chunks of decoded text no longer than the limit; a block is the whole lines inside one chunk, or the
        one line that spans two chunks (checked in Python), so a line longer than the limit is never held whole.
        """
        limit, read, long = self._max, self._text.read, self._long
        size = max(1, min(_TEXT_CHUNK, limit))  # a line inside one chunk is then never over the limit
        carry, skipping = "", False  # skipping: the rest of a line already cut
        try:
            while chunk := read(size):
                first = chunk.find("\n")
                if first < 0:  # no line ends in this chunk
                    if not skipping:
                        carry += chunk
                        if len(carry) > limit:
                            yield long(carry)
                            carry, skipping = "", True
                    continue
                if skipping:  # the cut line ends at this chunk's first newline
                    skipping = False
                else:
                    line = carry + chunk[:first]
                    yield line + "\n" if len(line) <= limit else long(line)
                last = chunk.rfind("\n")
                if last > first:  # the whole lines between
                    yield chunk[first + 1:last + 1]
                carry = chunk[last + 1:]
                if len(carry) > limit:
                    yield long(carry)
                    carry, skipping = "", True
        except UnicodeDecodeError as exc:
            raise InputError(self.path, f"not UTF-8 text ({exc.reason})") from None
        except OSError as exc:
            raise InputError(self.path, f"cannot read it: {os_reason(exc)}") from None
        if carry and not skipping:
            yield carry

    def _long(self, line: str) -> str:
        """A line over the limit: :class:`InputError` (``long_lines="error"``), or its first characters, counted."""
        if self._long_lines == "error":
            raise InputError(self.path, f"a line longer than the limit of {self._max:,} characters")
        self.cut += 1
        return line[:self._max] + "\n"


@contextmanager
def open_lines(path: str | os.PathLike[str], *, max_bytes: int = MAX_STREAM_BYTES, max_line_chars: int = MAX_LINE_CHARS,
               long_lines: Literal["error", "cut"] = "error", errors: str = "replace",
               stdin: IO[Any] | None = None) -> Iterator[Lines]:
    """Stream the lines of ``path`` (a regular file or a stream) in bounded memory, BOM dropped, read once.

    Newlines are universal (``\\r\\n`` and ``\\r`` read as ``\\n``, as in ``open``'s text mode).

    Args:
        path: see :func:`open_binary`; max_bytes: the most bytes read (a larger regular file is refused at
            once; a stream raises :class:`InputError` once it passes the bound, on entry, where the first
            buffer already does, or *while iterating*); max_line_chars: the longest line; long_lines: ``error``
            raises on a longer line, ``cut`` yields its first ``max_line_chars`` characters and skips the
            rest (counted in :attr:`Lines.cut`); errors: the UTF-8 codec's ``errors`` (default ``replace``:
            logs hold stray bytes); stdin: what ``-`` reads.

    Yields:
        A :class:`Lines`.

    Raises:
        InputError: see :func:`open_binary`; while iterating, too many bytes, a long line (``error``), a
            decoding error (``strict``) or a read error.
    """
    name = os.fspath(path)
    with open_binary(name, stdin=stdin, max_bytes=max_bytes) as raw:
        buffered = io.BufferedReader(_Bounded(raw, max_bytes, name), _CHUNK)  # type: ignore[arg-type]
        try:
            head = buffered.peek(8192)[:8192]
        except OSError as exc:
            raise InputError(name, f"cannot read it: {os_reason(exc)}") from None
        text = io.TextIOWrapper(buffered, encoding="utf-8-sig", errors=errors, newline=None)
        try:
            yield Lines(name, text, head, max_line_chars, long_lines)
        finally:
            text.detach()  # leave closing to open_binary (stdin stays open)


def read_each(paths: Iterable[str | os.PathLike[str]], read: Callable[[str], T] = read_text  # type: ignore[assignment]
              ) -> tuple[list[tuple[str, T]], list[InputError]]:
    """Read every path with ``read`` (default :func:`read_text`); a failure is kept with its path, the others still read.

    Returns:
        ``([(path, value) for each input read], [InputError for each that failed])``, both in the order given.
        ``read`` raising :class:`InputError` (or another ``ValueError``/``OSError``, turned into one naming the
        path) counts as a failure; any other exception propagates.
    """
    good: list[tuple[str, T]] = []
    bad: list[InputError] = []
    for p in paths:
        name = os.fspath(p)
        try:
            good.append((name, read(name)))
        except InputError as exc:
            bad.append(exc)
        except OSError as exc:
            bad.append(InputError(name, f"cannot read it: {os_reason(exc)}"))
        except ValueError as exc:
            bad.append(InputError(name, str(exc)))
    return good, bad


# ------------------------------------------------------------------------------------------ structured text

def depth(value: object, limit: int = MAX_DEPTH) -> int:
    """The nesting depth of lists/tuples/dicts in ``value`` (a scalar: 0), counted without recursion, up to ``limit + 1``.

    Shared objects (YAML aliases) are visited once per path, so call it on data whose expanded size is bounded.
    """
    deepest, stack = 0, [(value, 0)]
    while stack:
        item, level = stack.pop()
        if isinstance(item, dict):
            children: Sequence[object] = [*item.keys(), *item.values()]
        elif isinstance(item, (list, tuple)):
            children = item
        else:
            continue
        level += 1
        deepest = max(deepest, level)
        if deepest > limit:
            return deepest
        stack.extend((c, level) for c in children)
    return deepest


def load_json(text: str | bytes, path: str | os.PathLike[str], *, max_depth: int = MAX_DEPTH,
              allow_nan: bool = False) -> Any:
    """Parse JSON with its nesting bounded; a leading BOM is dropped.

    Args:
        text: the document; path: the name for messages; max_depth: the deepest nesting accepted;
        allow_nan: whether the non-standard ``NaN``/``Infinity``/``-Infinity`` are numbers (RFC 8259 has none).

    Raises:
        InputError: not JSON (line and column named), nested deeper than ``max_depth``, a non-standard number,
            an integer past Python's digit limit.
    """
    if isinstance(text, bytes):
        text = decode(text, path, max_line_chars=sys.maxsize)
    text = text.removeprefix(BOM)

    def no_constant(word: str) -> float:
        raise InputError(path, f"{word} is not a JSON number (RFC 8259)")

    try:
        data = json.loads(text, **({} if allow_nan else {"parse_constant": no_constant}))
    except json.JSONDecodeError as exc:
        raise InputError(path, f"not valid JSON: {exc.msg} (line {exc.lineno}, column {exc.colno})") from None
    except RecursionError:
        raise InputError(path, f"nested too deeply to analyse (more than {max_depth} levels)") from None
    except InputError:
        raise
    except ValueError as exc:  # e.g. an integer of more than 4300 digits (sys.get_int_max_str_digits)
        raise InputError(path, f"not usable JSON: {exc}") from None
    if depth(data, max_depth) > max_depth:
        raise InputError(path, f"nested too deeply to analyse (more than {max_depth} levels)")
    return data


def load_yaml(text: str | bytes, path: str | os.PathLike[str], *, max_depth: int = MAX_DEPTH,
              max_nodes: int = MAX_YAML_NODES) -> Any:
    """Parse one YAML document with PyYAML's safe loader, nesting and alias expansion bounded.

    Args:
        text: the document; path: the name for messages; max_depth: the deepest nesting accepted;
        max_nodes: the most nodes the document may hold with every alias expanded (an alias bomb).

    Returns:
        The data (``None`` for an empty document).

    Raises:
        InputError: not YAML (PyYAML's problem and position named), several documents, an unsafe tag,
            nested deeper than ``max_depth``, more than ``max_nodes`` nodes expanded, an unhashable key.
    """
    import yaml

    if isinstance(text, bytes):
        text = decode(text, path, max_line_chars=sys.maxsize)
    text = text.removeprefix(BOM)

    class Loader(yaml.SafeLoader):
        level = 0

        def compose_node(self, parent: Any, index: Any) -> Any:  # noqa: D102 - PyYAML API
            self.level += 1
            try:
                if self.level > max_depth:
                    raise InputError(path, f"nested too deeply to analyse (more than {max_depth} levels)")
                return super().compose_node(parent, index)
            finally:
                self.level -= 1

    try:
        # PyYAML's Reader checks the characters when the loader is built: a control character raises there
        loader = Loader(text)
    except yaml.YAMLError as exc:
        raise InputError(path, f"not valid YAML: {exc}") from None
    try:
        node = loader.get_single_node()
        if node is None:
            return None
        size = _expanded_nodes(node, max_nodes)
        if size > max_nodes:
            raise InputError(path, f"more than {max_nodes:,} YAML nodes once its aliases are expanded (an alias bomb?)")
        return loader.construct_document(node)
    except InputError:
        raise
    except yaml.MarkedYAMLError as exc:
        where = f" (line {exc.problem_mark.line + 1}, column {exc.problem_mark.column + 1})" if exc.problem_mark else ""
        raise InputError(path, f"not valid YAML: {exc.problem or exc.context}{where}") from None
    except (yaml.YAMLError, ValueError, TypeError, RecursionError) as exc:
        raise InputError(path, f"not usable YAML: {type(exc).__name__}: {exc}") from None
    finally:
        loader.dispose()


def _expanded_nodes(node: Any, limit: int) -> int:
    """How many nodes ``node`` holds with aliases expanded (a shared node counted at each use), at most ``limit + 1``.

    Counted once per distinct node, children before parents (an explicit stack, no recursion); a node that
    contains itself (``&a [*a]``) expands without end and counts as ``limit + 1``.
    """
    import yaml

    def kids(n: Any) -> list[Any]:
        if isinstance(n, yaml.SequenceNode):
            return list(n.value)
        if isinstance(n, yaml.MappingNode):
            return [x for pair in n.value for x in pair]
        return []

    memo: dict[int, int | None] = {}  # None: still open (on the current path)
    stack: list[tuple[Any, bool]] = [(node, False)]
    while stack:
        n, done = stack.pop()
        if done:
            sizes = [memo[id(k)] for k in kids(n)]
            if any(s is None for s in sizes):  # a child still open is an ancestor: the node contains itself
                return limit + 1
            memo[id(n)] = min(limit + 1, 1 + sum(sizes))  # type: ignore[arg-type]
            continue
        if id(n) in memo:
            continue
        memo[id(n)] = None
        stack.append((n, True))
        stack.extend((k, False) for k in kids(n) if id(k) not in memo)
    return memo[id(node)] or 0
