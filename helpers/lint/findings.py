"""The lint finding: a plain :class:`helpers.checks.Check` built from lint words (rule, severity, file, line).

The record is :class:`~helpers.checks.Check` itself (``id`` = the rule, ``file`` / ``line_no`` = where);
:func:`finding` only translates the linter's vocabulary, and the ``lint`` text style lives with the
other renderers in :mod:`helpers.checks` (:func:`~helpers.checks.lint_line`).
"""

from __future__ import annotations

from helpers.checks import LINT_WORDS, Check

SEVERITY_TO_STATUS = {"info": "INFO", "warning": "WARN", "error": "FAIL"}
"""Lint severities -> :data:`helpers.checks.STATUSES` (the inverse of :data:`helpers.checks.LINT_WORDS`)."""


def finding(rule: str, severity: str, file: str, line: int, message: str, fix: str, seed: str) -> Check:
    """A lint finding as a :class:`Check`: ``id`` = ``rule``, ``title`` = ``message``, ``remediation`` = ``fix``,
    ``source`` = ``seed``, ``file`` / ``line_no`` = where (``line`` 0: the file as a whole).

    Raises:
        ValueError: ``severity`` not one of info, warning, error.
    """
    if severity not in SEVERITY_TO_STATUS:
        raise ValueError(f"severity={severity!r}: accepted values are {', '.join(SEVERITY_TO_STATUS)}")
    return Check(id=rule, title=message, status=SEVERITY_TO_STATUS[severity], remediation=fix, source=seed,
                 evidence=[f"{file}:{line}"], file=file, line_no=line)


def severity(check: Check) -> str:
    """The lint word of ``check``'s status: ``info`` / ``warning`` / ``error`` (``OK`` reads as ``info``)."""
    return LINT_WORDS[check.status]
