"""Reports of a parsed log and its verdicts: the text table (:func:`render`), the JSON (:func:`to_json`) and the
job hook (:func:`checks_for_job`)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

from helpers import checks
from helpers.checks import Check
from helpers.nccl_log.model import NcclLog
from helpers.nccl_log.reading import parse_files
from helpers.nccl_log.rules import interpret

# ------------------------------------------------------------------------------------------ output

def render(log: NcclLog, verdicts: Sequence[Check]) -> str:
    """Human summary: a header, one table row per rank, then each verdict in :func:`helpers.checks.render`'s
    ``runbook`` style (``[FAIL] id @node: title`` and ``-> remediation``), followed by its evidence lines indented
    with ``    | ``.
    """
    header = (f"nccl-log: {len(log.ranks)} rank(s) on {len(log.hosts) or 'unknown'} host(s), {log.topology()}; "
              f"{log.lines_seen} lines read, {log.nccl_lines} NCCL, {log.unparsed_count} not interpreted")
    columns = ("key", "rank", "host", "nccl", "bootstrap", "net", "transports", "init")
    rows = []
    for r in log.ranks.values():
        init = (f"COMPLETE x{len(r.init_complete)}" if r.completed else f"stopped at {r.stage_name}")
        net = r.net or r.network or "-"
        if r.net and r.net_devices:
            net += " " + " ".join(r.net_devices[:2]) + (" ..." if len(r.net_devices) > 2 else "")
        rows.append((r.key, "-" if r.rank is None else str(r.rank), r.host or "-", r.nccl_version or "-",
                     " ".join(str(i) for i in r.bootstrap[:2]) or "-", net, ",".join(r.transports()) or "-", init))
    widths = [max([len(c)] + [len(row[k]) for row in rows]) for k, c in enumerate(columns)]
    out = [header, "  ".join(c.ljust(w) for c, w in zip(columns, widths)).rstrip()]
    out += ["  ".join(v.ljust(w) for v, w in zip(row, widths)).rstrip() for row in rows]
    if not rows:
        out.append("(no line names a rank or host)")
    out.append("")
    if not verdicts:
        out.append("[OK] no finding")
    for v in verdicts:
        out.append(checks.render([v]))
        out += [f"    | {line}" for line in v.evidence]
    return "\n".join(out) + "\n"


_JSON_RANKS_MAX = 64


def to_json(log: NcclLog, verdicts: Sequence[Check]) -> dict:
    """The machine-readable form of :func:`render` (what ``--json`` prints), bounded in size: the project's one shape,
    :func:`helpers.checks.to_json` (``{"checks": [...], "log": {...}}``), the log's summary under ``log``.

    Counts plus a few examples per kind: each rank's summary keeps 3 WARN lines and the counters,
    at most 64 ranks are listed (``ranks_omitted`` counts the rest), each verdict keeps at most
    6 evidence lines, and ``catalog`` gives the line count per catalog id.
    """
    keys = list(log.ranks)[:_JSON_RANKS_MAX]
    summary = {"sources": log.sources, "problems": log.problems, "topology": log.topology(),
               "hosts": log.hosts[:_JSON_RANKS_MAX], "hosts_total": len(log.hosts),
               "lines_seen": log.lines_seen, "nccl_lines": log.nccl_lines, "unparsed_count": log.unparsed_count,
               "reconstructed_lines": log.reconstructed,
               "catalog": {cid: hit.count for cid, hit in log.catalog.items()},
               "sites": {str(i): hit.count for i, hit in log.sites.items()},
               "ranks": {k: log.ranks[k].summary() for k in keys}, "ranks_omitted": len(log.ranks) - len(keys),
               "unattributed": log.unattributed.summary() if log.unattributed.lines else None}
    return checks.to_json(verdicts, log=summary)


_JOB_LOG_SUFFIXES = (".log", ".txt", ".out", ".err")


def checks_for_job(job: str | Path | Sequence[str | Path]) -> list[Check]:
    """The interpreter's verdicts for a job's NCCL logs, as :class:`helpers.checks.Check` records.

    For the allocation check (notebook 00) and chapter 06 to attach to their report when the
    backend is NCCL.

    Args:
        job: a job directory (its ``*.log``, ``*.txt``, ``*.out``, ``*.err`` files, recursively) or a
            list of log paths.
    Returns:
        The verdicts (FAIL first); ``[]`` when no file holds an NCCL line (NCCL_DEBUG was not INFO).
        An unreadable file becomes one ``nccl-log.input`` INFO check naming it.
    Raises:
        ValueError: ``job`` is neither an existing directory nor a non-empty list of paths.
    """
    if isinstance(job, (str, Path)):
        root = Path(job)
        if not root.is_dir():
            raise ValueError(f"job: {job} is not a directory; give the job directory or a list of log files")
        paths: list[str | Path] = _job_logs(root)
    else:
        paths = list(job)
        if not paths:
            raise ValueError("job: give the job directory or a non-empty list of log files")
    problems: list[str] = []
    try:
        log = parse_files(paths, problems=problems) if paths else None
    except ValueError:
        return []
    if log is None:
        return []
    found: list[Check] = list(interpret(log))
    found += [Check(id="nccl-log.input", title=line, status="INFO", source="issue 15") for line in problems
              if "no NCCL lines" not in line]
    return found


def _job_logs(root: Path) -> list[str | Path]:
    """The log files under ``root`` (by suffix, sorted); a folder that cannot be listed is skipped, not raised."""
    out: list[str | Path] = []
    for folder, _dirs, files in os.walk(root, onerror=lambda exc: None):
        out += [Path(folder) / f for f in files if Path(f).suffix in _JOB_LOG_SUFFIXES]
    return sorted(out)

