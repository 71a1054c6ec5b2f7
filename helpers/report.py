"""The allocation-check report (``report.json`` + ``report.md``, written atomically) and small renderers.

:class:`Check`, :func:`worst` and :data:`STATUSES` are re-exported from :mod:`helpers.checks`
(their home); :func:`markdown_table` and :func:`human_bytes` render tables and sizes for every
chapter; :data:`MIB`/:data:`GIB` are the byte units.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from helpers.checks import Check, worst
from helpers.checks import to_json as checks_json

__all__ = ["GIB", "KIB", "MIB", "human_bytes", "markdown_table", "to_json", "to_markdown", "write_atomic", "write_report"]

KIB = 1024
MIB = 1024**2
GIB = 1024**3
"""Binary byte units (the one definition: host checks, chapter 04 tables, memory estimates)."""


def human_bytes(n: float) -> str:
    """``1536`` -> ``'1.50 KiB'``: binary units, as GPU memory is reported."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.2f} {unit}"
        n /= 1024
    return f"{n:.2f} TiB"  # pragma: no cover


def markdown_table(rows: Sequence[Mapping[str, Any]], columns: Sequence[str] | None = None) -> str:
    """Render ``rows`` (dicts with the same keys) as a Markdown table; floats with 4 significant digits.

    Args:
        rows: one mapping per row.
        columns: the keys to show, in order (default: the first row's keys).

    Raises:
        ValueError: ``rows`` is empty, or a column is missing from a row (names it).
    """
    if not rows:
        raise ValueError("rows: nothing to format")
    cols = list(columns or rows[0].keys())
    for c in cols:
        if any(c not in r for r in rows):
            raise ValueError(f"columns: {c!r} is missing from some rows")

    def cell(v: object) -> str:
        return f"{v:.4g}" if isinstance(v, float) else str(v)

    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(cell(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


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


def to_json(checks: Sequence[Check], meta: dict[str, Any], extra: Mapping[str, Any] | None = None) -> str:
    """The ``report.json`` text: ``{"meta": ..., "status": worst, "checks": [Check...]}`` plus the keys of ``extra``."""
    return json.dumps(checks_json(checks, meta=meta, status=worst(checks), **(extra or {})), indent=2, default=str)


def _cell(value: Any) -> str:
    text = json.dumps(value, default=str) if not isinstance(value, str) else value
    text = text if len(text) <= 120 else text[:117] + "..."
    return text.replace("|", "\\|").replace("\n", " ")


def to_markdown(checks: Sequence[Check], meta: dict[str, Any], *, images: Sequence[str] = (), sections_md: str = "") -> str:
    """The ``report.md`` text: a summary table, ``sections_md`` (e.g. the per-node sections), then each check's values."""
    lines = [f"# Allocation check: {meta.get('host', '?')} — {worst(checks)}", ""]
    lines += [f"- {k}: `{_cell(v)}`" for k, v in meta.items()]
    lines += ["", "| status | check | what | remediation |", "|---|---|---|---|"]
    lines += [f"| {c.status} | `{c.id}` | {_cell(c.title)} | {_cell(c.remediation) or '—'} |" for c in checks]
    if sections_md:
        lines += ["", sections_md.rstrip()]
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
                 images: Sequence[str] = (), sections_md: str = "", extra: Mapping[str, Any] | None = None
                 ) -> tuple[Path, Path]:
    """Write ``report.json`` and ``report.md`` into ``out_dir`` atomically; return both paths.

    ``sections_md`` goes into ``report.md`` after the summary table; ``extra`` adds top-level keys to
    ``report.json`` (the allocation check: ``{"allocation": {matrix, drain, ...}}``).

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
    json_path = write_atomic(out / "report.json", to_json(checks, meta, extra))
    md_path = write_atomic(out / "report.md", to_markdown(checks, meta, images=images, sections_md=sections_md))
    return json_path, md_path
