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
    """The ``report.md`` text: what to do first, then the checks in one table, then the evidence, folded.

    Layout (a reader acts on the first screen; the raw values are one click away):

    1. ``# Allocation check: HOST — STATUS``;
    2. **What to do**: one numbered line per FAIL, then per WARN check (title, remediation, the nodes
       it names), and the drain list when ``sections_md`` starts with one; or one line saying there is
       nothing to do;
    3. the checks as one table (status, id, what), FAILs and WARNs first;
    4. folded (``<details>``, which GitHub and JupyterLab render): the run's ``meta``, the rest of
       ``sections_md`` (node pairs, each node), and each check's values and source (the FAIL and WARN
       ones unfolded); then ``images``.

    Args:
        checks: the records; meta: run facts (``host``...); images: file names next to the report;
        sections_md: Markdown from :func:`helpers.allocation.render_markdown` (its ``## Drain list``
            section first, which is lifted into "What to do").
    """
    order = {"FAIL": 0, "WARN": 1, "INFO": 2, "OK": 3}
    ranked = sorted(checks, key=lambda c: order[c.status])
    act = [c for c in ranked if c.status in ("FAIL", "WARN")]
    drain, rest = "", sections_md.strip()
    if rest.startswith("## Drain list"):
        cut = rest.find("\n## ", 1)
        drain, rest = (rest, "") if cut < 0 else (rest[:cut], rest[cut + 1:])
        drain = drain.removeprefix("## Drain list").strip()
    lines = [f"# Allocation check: {meta.get('host', '?')} — {worst(checks)}", "", "## What to do", ""]
    if act:
        for n, c in enumerate(act, 1):
            where = f" (node: {', '.join(c.faulty)})" if c.faulty else (f" (node: {c.node})" if c.node else "")
            lines.append(f"{n}. **[{c.status}] `{c.id}`**{where}: {_cell(c.title)} → "
                         f"{_cell(c.remediation) if c.remediation else 'see its evidence below'}")
        if drain and "No node to leave out" not in drain:
            lines.append(f"{len(act) + 1}. **Drain list**: {drain}")
    else:
        info = sum(c.status == "INFO" for c in checks)
        lines.append(f"Nothing: all {len(checks)} checks passed" + (f" ({info} for information)" if info else "")
                     + ". The allocation is ready for a job.")
    lines += ["", "## Checks", "", "| status | check | what |", "|---|---|---|"]
    lines += [f"| {c.status} | `{c.id}` | {_cell(c.title)} |" for c in ranked]
    lines += ["", "## Evidence", "", "<details><summary>The run</summary>", ""]
    lines += [f"- {k}: `{_cell(v)}`" for k, v in meta.items()]
    lines += ["", "</details>"]
    if rest:
        lines += ["", "<details><summary>Across the nodes: node pairs and each node</summary>", "",
                  rest.replace("\n## ", "\n### ").replace("## ", "### ", 1) if rest.startswith("## ") else rest,
                  "", "</details>"]
    for c in ranked:
        opened = " open" if c.status in ("FAIL", "WARN") else ""
        lines += ["", f"<details{opened}><summary>[{c.status}] <code>{c.id}</code>: {_html_cell(c.title)}</summary>", ""]
        if c.remediation:
            lines += [f"**Remediation:** {c.remediation}", ""]
        if c.source:
            lines += [f"Source: {c.source}", ""]
        lines += [f"- {k}: `{_cell(v)}`" for k, v in c.values.items()]
        lines += ["", "</details>"]
    for image in images:
        lines += ["", f"![{Path(image).stem}]({image})"]
    return "\n".join(lines) + "\n"


def _html_cell(value: Any) -> str:
    """:func:`_cell` escaped for an HTML ``<summary>``."""
    import html

    return html.escape(_cell(value))


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
