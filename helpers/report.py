"""Check records and the allocation-check report (``report.json`` + ``report.md``), written atomically."""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

STATUSES = ("OK", "WARN", "FAIL")


@dataclass
class Check:
    """One check's verdict.

    Attributes:
        id: stable identifier (``env.diff``, ``collectives.correctness``...).
        title: one line for people.
        status: ``OK``, ``WARN`` or ``FAIL``.
        values: what was measured (JSON-serialisable; units in the key names).
        remediation: what to do when not OK (empty when OK).
        source: where the rule or threshold comes from (URL or seed id such as ``D3``).
    """

    id: str
    title: str
    status: str
    values: dict[str, Any] = field(default_factory=dict)
    remediation: str = ""
    source: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status={self.status!r} in check {self.id!r}: accepted values are {', '.join(STATUSES)}")
        if not self.id:
            raise ValueError("id: a check needs a non-empty id")

    def line(self) -> str:
        """``[OK]   id: title`` (with the remediation when not OK)."""
        text = f"[{self.status}]{' ' * (5 - len(self.status))}{self.id}: {self.title}"
        return text + (f"\n       -> {self.remediation}" if self.status != "OK" and self.remediation else "")


def worst(checks: Iterable[Check]) -> str:
    """The most severe status among ``checks`` (``OK`` when empty)."""
    statuses = [c.status for c in checks]
    return max(statuses, key=STATUSES.index) if statuses else "OK"


def write_atomic(path: str | os.PathLike[str], text: str) -> Path:
    """Write ``text`` to ``path`` so that readers see the old file or the whole new one, never a part.

    Writes a temp file in the same directory, fsyncs it, then ``os.replace``s it over ``path``
    (atomic on POSIX within one filesystem).  On any error the temp file is removed and the
    old file is untouched.

    Returns:
        The path written.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w") as fh:
            fh.write(text)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
    return path


def to_json(checks: Sequence[Check], meta: dict[str, Any]) -> str:
    """The ``report.json`` text: ``{"meta": ..., "status": worst, "checks": [Check...]}``."""
    return json.dumps({"meta": meta, "status": worst(checks), "checks": [asdict(c) for c in checks]},
                      indent=2, default=str)


def _cell(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    text = text if len(text) <= 120 else text[:117] + "..."
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(checks: Sequence[Check], meta: dict[str, Any], *, images: Sequence[str] = ()) -> str:
    """The ``report.md`` text: a summary table, then each check's measured values and remediation."""
    lines = [f"# Allocation check: {meta.get('host', '?')} — {worst(checks)}", ""]
    lines += [f"- {k}: `{_cell(v)}`" for k, v in meta.items()]
    lines += ["", "| status | check | what | remediation |", "|---|---|---|---|"]
    lines += [f"| {c.status} | `{c.id}` | {_cell(c.title)} | {_cell(c.remediation) or '—'} |" for c in checks]
    for c in checks:
        lines += ["", f"## [{c.status}] {c.id}", "", c.title, ""]
        if c.remediation:
            lines += [f"**Remediation:** {c.remediation}", ""]
        if c.source:
            lines += [f"Source: {c.source}", ""]
        lines += [f"- {k}: `{_cell(v)}`" for k, v in c.values.items()]
    for image in images:
        lines += ["", f"![{Path(image).stem}]({image})"]
    return "\n".join(lines) + "\n"


def write_report(out_dir: str | os.PathLike[str], checks: Sequence[Check], meta: dict[str, Any], *,
                 images: Sequence[str] = ()) -> tuple[Path, Path]:
    """Write ``report.json`` and ``report.md`` into ``out_dir`` atomically; return both paths.

    Raises:
        ValueError: ``checks`` is empty or two checks share an id.
    """
    if not checks:
        raise ValueError("checks: the report needs at least one check")
    ids = [c.id for c in checks]
    dupes = sorted({i for i in ids if ids.count(i) > 1})
    if dupes:
        raise ValueError(f"checks: duplicate ids {dupes}")
    out = Path(out_dir)
    json_path = write_atomic(out / "report.json", to_json(checks, meta))
    md_path = write_atomic(out / "report.md", to_markdown(checks, meta, images=images))
    return json_path, md_path
