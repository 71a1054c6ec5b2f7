"""One record for every finding the runbook reports: :class:`Check`, with one status scale.

Every tool of the project says what it found the same way: the allocation check (``report.json``),
the host checks, the network pre-flight (one record per node), the command builder's traps, the
NCCL log interpreter's verdicts and ``runbook lint``.  Each of them builds a plain :class:`Check`
(through a factory function that takes the tool's own words: ``launch_traps.trap``,
``lint.findings.finding``, the log reader's verdicts), so a record from one tool can go into another
tool's report unchanged.  The record and its presentation are apart, in pylint's shape (one
``Message``, reporters in ``pylint/reporters/``): :func:`render` writes the text form in one of
:data:`STYLES`, :func:`to_json` the one JSON shape every command that prints checks uses
(``{"checks": [...], ...}``), and :meth:`Check.line` is the ``runbook`` style of one record.

Status scale, least to most severe (:data:`STATUSES`):

- ``OK``: measured and fine.
- ``INFO``: worth knowing, nothing to fix (a costly option that is set on purpose, say).
- ``WARN``: works now, or works badly; fix it before it bites.
- ``FAIL``: will not work (or did not): fix it first.

Standard library only, so rank-side code and the CLI can import it without torch.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping
from typing import Any

STATUSES = ("OK", "INFO", "WARN", "FAIL")
"""The status scale, ordered least to most severe; :func:`worst` relies on this order."""

NOT_OK = ("WARN", "FAIL")
"""Statuses that ask for an action (and name the faulty node, when there is one)."""


@dataclasses.dataclass
class Check:
    """One finding.

    Attributes:
        id: stable identifier (``env.diff``, ``net.mtu``, ``standalone-multinode``...).
        title: one line for people: what was found, in the words of the error the user sees.
        status: one of :data:`STATUSES`.
        values: what was measured (JSON-serialisable; units in the key names, e.g. ``busbw_gbps``).
        remediation: what to do when not OK (empty when OK).
        source: where the rule or threshold comes from: a seed id registered in
            :mod:`helpers.sources` (``D21``, ``MN4``, ``Gilbreth 8.12``) or a public URL.
        evidence: the lines (log lines, stack frames, file:line) that show it; a few, not all.
        field: the input to change (a :class:`helpers.launch_traps.LaunchSpec` attribute,
            ``env.NAME``, a config key); empty when the finding is not about one input.
        node: the node the check measured (as the runner names it); empty on one host.
        faulty: the nodes to fix when the status is WARN/FAIL.  It may differ from ``node``: a
            ping from node1 that fails because node0's cable is out names node0.  Defaults to
            ``[node]`` for WARN/FAIL when a node is set, ``[]`` otherwise.
        file: the file the finding is in (a script, a config, ``<command>``); empty when none.
        line_no: 1-based line in ``file`` (0: the file as a whole, or no file).

    Raises:
        ValueError: ``status`` not in :data:`STATUSES`, or an empty ``id``.
    """

    id: str
    title: str
    status: str
    values: dict[str, Any] = dataclasses.field(default_factory=dict)
    remediation: str = ""
    source: str = ""
    evidence: list[str] = dataclasses.field(default_factory=list)
    field: str = ""
    node: str = ""
    faulty: list[str] = dataclasses.field(default_factory=list)
    file: str = ""
    line_no: int = 0

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status={self.status!r} in check {self.id!r}: accepted values are {', '.join(STATUSES)}")
        if not self.id:
            raise ValueError("id: a check needs a non-empty id")
        if self.status in NOT_OK and not self.faulty and self.node:
            self.faulty = [self.node]

    @property
    def ok(self) -> bool:
        """True when the status asks for no action (``OK`` or ``INFO``)."""
        return self.status not in NOT_OK

    def line(self) -> str:
        """``[WARN] id: title`` plus, when not OK, ``-> remediation`` on the next line.

        A node (``@node1``), a field (``(env.NCCL_SOCKET_IFNAME)``) and a place (``train.py:14``) are
        shown when set.
        """
        where = f" @{self.node}" if self.node else ""
        what = f" ({self.field})" if self.field else ""
        at = f" {self.file}:{self.line_no}" if self.file else ""
        text = f"[{self.status}]{' ' * (5 - len(self.status))}{self.id}{where}{what}{at}: {self.title}"
        if self.status != "OK" and self.remediation:
            text += f"\n       -> {self.remediation}"
        return text

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: every attribute, lists and dicts copied."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Check:
        """Rebuild a check from :meth:`to_dict` output (unknown keys are an error naming them).

        Raises:
            ValueError: a key that is not an attribute of :class:`Check`, or a bad status.
        """
        names = {f.name for f in dataclasses.fields(Check)}
        unknown = sorted(set(data) - names)
        if unknown:
            raise ValueError(f"check record: unknown key(s) {', '.join(unknown)}; accepted keys are {', '.join(sorted(names))}")
        return Check(**dict(data))


STYLES = ("runbook", "lint", "markdown")
"""Text styles of :func:`render`: ``runbook`` (``[WARN] id @node (field): title`` and ``-> remediation``),
``lint`` (``file:line: warning id [source]: title`` and ``    fix: remediation``, the compiler-style
line that editors and CI annotators read) and ``markdown`` (``- [WARN] `id`: title`` list items, for reports)."""

LINT_WORDS = {"OK": "info", "INFO": "info", "WARN": "warning", "FAIL": "error"}
"""The ``lint`` style's words for the statuses (a display mapping, not a second scale)."""


def lint_line(check: Check) -> str:
    """One record in the ``lint`` style: ``file:line: warning id [source]: title`` + ``    fix: remediation``."""
    text = f"{check.file or '-'}:{check.line_no}: {LINT_WORDS[check.status]} {check.id} [{check.source}]: {check.title}"
    if check.remediation:
        text += f"\n    fix: {check.remediation}"
    return text


def markdown_line(check: Check) -> str:
    """One record in the ``markdown`` style: ``- [WARN] `id`: title`` (``@node`` and ``file:line`` when set)."""
    where = f" @{check.node}" if check.node else ""
    at = f" ({check.file}:{check.line_no})" if check.file else ""
    return f"- [{check.status}] `{check.id}`{where}{at}: {check.title}"


def render(checks: Iterable[Check], style: str = "runbook") -> str:
    """The text form of ``checks``, one record after the other, in ``style`` (one of :data:`STYLES`).

    Raises:
        ValueError: ``style`` not in :data:`STYLES`.
    """
    if style not in STYLES:
        raise ValueError(f"style={style!r}: accepted values are {', '.join(STYLES)}")
    one = {"runbook": Check.line, "lint": lint_line, "markdown": markdown_line}[style]
    return "\n".join(one(c) for c in checks)


def to_json(checks: Iterable[Check], **meta: Any) -> dict[str, Any]:
    """The one JSON shape of a list of checks: ``{"checks": [Check.to_dict(), ...], **meta}``.

    ``meta`` adds the command's own top-level keys (``summary``, ``files``, ``hosts``...); it may not
    be called ``checks``.
    """
    return {"checks": [c.to_dict() for c in checks], **meta}


def worst(checks: Iterable[Check]) -> str:
    """The most severe status among ``checks`` (``OK`` when there are none)."""
    statuses = [c.status for c in checks]
    return max(statuses, key=STATUSES.index) if statuses else "OK"


def worst_status(statuses: Iterable[str]) -> str:
    """The most severe of plain status strings (``OK`` when there are none).

    Raises:
        ValueError: a status not in :data:`STATUSES`.
    """
    seen = list(statuses)
    for s in seen:
        if s not in STATUSES:
            raise ValueError(f"status={s!r}: accepted values are {', '.join(STATUSES)}")
    return max(seen, key=STATUSES.index) if seen else "OK"


def faulty_nodes(checks: Iterable[Check], status: str = "FAIL") -> list[str]:
    """The nodes named faulty by the checks of ``status``, in first-seen order, without repeats."""
    seen: list[str] = []
    for c in checks:
        if c.status == status:
            seen += [n for n in c.faulty if n not in seen]
    return seen
