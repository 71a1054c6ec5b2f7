"""The lint finding record: a :class:`helpers.checks.Check` with a rule id, a file and a line."""

from __future__ import annotations

import dataclasses
from typing import Any

from helpers.checks import Check

SEVERITY_TO_STATUS = {"info": "INFO", "warning": "WARN", "error": "FAIL"}
STATUS_TO_SEVERITY = {v: k for k, v in SEVERITY_TO_STATUS.items()}


@dataclasses.dataclass
class Finding(Check):
    """One lint finding.

    Attributes (besides :class:`Check`'s: ``id`` = ``rule``, ``title`` = message, ``status`` from
    the severity, ``remediation`` = fix, ``source`` = the seed entry):
        rule: the rule id (``rank-gated-collective``, ``ds-batch-mismatch``...).
        file: the file it was found in (``<command>`` for ``--command``).
        line: 1-based line number (0: the file as a whole).
    """

    rule: str = ""
    file: str = ""
    line: int = 0

    @classmethod
    def make(cls, rule: str, severity: str, file: str, line: int, message: str, fix: str, seed: str) -> Finding:
        """Build a finding from lint words (``severity`` one of info/warning/error).

        Raises:
            ValueError: ``severity`` not one of info, warning, error.
        """
        if severity not in SEVERITY_TO_STATUS:
            raise ValueError(f"severity={severity!r}: accepted values are {', '.join(SEVERITY_TO_STATUS)}")
        return cls(id=rule, title=message, status=SEVERITY_TO_STATUS[severity], remediation=fix, source=seed,
                   evidence=[f"{file}:{line}"], rule=rule, file=file, line=line)

    @property
    def lint_severity(self) -> str:
        """``info`` / ``warning`` / ``error`` (``OK`` reads as ``info``)."""
        return STATUS_TO_SEVERITY.get(self.status, "info")

    def to_lint_dict(self) -> dict[str, Any]:
        """The ``--json`` form: ``{rule, seed, severity, file, line, message, fix}``."""
        return {"rule": self.rule, "seed": self.source, "severity": self.lint_severity, "file": self.file,
                "line": self.line, "message": self.title, "fix": self.remediation}

    def text(self) -> str:
        """``file:line: severity rule [seed]: message`` and ``    fix: ...`` on the next line."""
        return f"{self.file}:{self.line}: {self.lint_severity} {self.rule} [{self.source}]: {self.title}\n    fix: {self.remediation}"
