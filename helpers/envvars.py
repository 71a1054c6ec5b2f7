"""Environment-variable changes, where a value of ``None`` means "unset this variable".

Every place that applies, renders or parses such a mapping uses these three functions: the job
runner and the network lab (:func:`apply`), the SLURM renderer and the command builder
(:func:`shell_lines`), the command builder's text box and the CLI's ``--env`` flags
(:func:`parse_lines`, :func:`parse_pairs`).  :func:`parse_lines` reads back what
:func:`shell_lines` writes.  Standard library only.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Iterable, Mapping

NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
"""A valid variable name: letters, digits and ``_``, not starting with a digit (POSIX)."""

Changes = Mapping[str, "str | None"]


def check_name(key: object, where: str = "env") -> str:
    """``key`` when it is a valid variable name.

    Raises:
        ValueError: naming ``where`` and the accepted form.
    """
    if not isinstance(key, str) or not NAME.fullmatch(key):
        raise ValueError(f"{where}: {key!r} is not a valid variable name (letters, digits, _; not starting with a digit)")
    return key


def apply(base: Mapping[str, str], changes: Changes | None) -> dict[str, str]:
    """A copy of ``base`` with ``changes`` applied: ``None`` removes a variable, anything else sets ``str(value)``."""
    out = dict(base)
    for key, value in (changes or {}).items():
        if value is None:
            out.pop(key, None)
        else:
            out[key] = str(value)
    return out


def shell_lines(changes: Changes) -> list[str]:
    """``export KEY=value`` (quoted for a POSIX shell) or ``unset KEY`` per change, in order.

    Raises:
        ValueError: a key that is not a valid variable name.
    """
    lines = []
    for key, value in changes.items():
        check_name(key)
        lines.append(f"unset {key}" if value is None else f"export {key}={shlex.quote(str(value))}")
    return lines


_SET = re.compile(r"(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)")
_UNSET = re.compile(r"unset\s+([A-Za-z_][A-Za-z0-9_]*)")
FORMS = "KEY=VALUE, export KEY=VALUE, unset KEY"


def parse_line(raw: str, number: int = 1) -> tuple[str, str | None] | None:
    """One line of :func:`parse_lines`: ``(key, value)``, ``(key, None)`` for ``unset``, None for blank/comment.

    A value that starts with a quote is read as the shell would (``'a b'`` -> ``a b``).

    Raises:
        ValueError: naming the line number, the line and :data:`FORMS`.
    """
    line = raw.strip()
    if not line or line.startswith("#"):
        return None
    m = _SET.fullmatch(line)
    if m:
        value = m.group(2)
        if value[:1] in ("'", '"'):
            try:
                parts = shlex.split(value)
            except ValueError as exc:
                raise ValueError(f"env line {number} ({raw!r}): {exc}; accepted forms are {FORMS}") from None
            value = parts[0] if len(parts) == 1 else value
        return m.group(1), value
    u = _UNSET.fullmatch(line)
    if u:
        return u.group(1), None
    hint = " (a bare name sets nothing: write NAME=VALUE, or unset NAME)" if NAME.fullmatch(line) else ""
    raise ValueError(f"env line {number} ({raw!r}): accepted forms are {FORMS}{hint}")


def parse_lines(text: str) -> dict[str, str | None]:
    """Parse ``KEY=VALUE`` / ``export KEY=VALUE`` / ``unset KEY`` lines (``#`` comments, blank lines skipped).

    Raises:
        ValueError: naming the first bad line's number and the accepted forms.
    """
    env: dict[str, str | None] = {}
    for number, raw in enumerate(text.splitlines(), 1):
        parsed = parse_line(raw, number)
        if parsed is not None:
            env[parsed[0]] = parsed[1]
    return env


def parse_pairs(pairs: Iterable[str] | None, flag: str = "--env") -> dict[str, str]:
    """``NAME=VALUE`` strings (one per CLI flag) as a dict.

    Raises:
        ValueError: ``--env 'x': use NAME=VALUE`` for a pair without ``=`` or with a bad name.
    """
    env: dict[str, str] = {}
    for pair in pairs or []:
        key, sep, value = pair.partition("=")
        if not sep or not NAME.fullmatch(key):
            raise ValueError(f"{flag} {pair!r}: use NAME=VALUE (NAME: letters, digits, _)")
        env[key] = value
    return env
