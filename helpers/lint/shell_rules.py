"""Rules for sbatch / shell launch scripts: the command builder's traps plus what only the text shows.

The launch line is read with :func:`helpers.launch_parse.parse_sbatch` (``#SBATCH`` header) or
:func:`helpers.launch_parse.parse_command`, and the spec is checked with
:func:`helpers.launch_traps.find_traps`: one rule set for the widget, ``--command`` and the sbatch
reader.  The text-only rule here is ``master-addr-not-exported`` (a plain assignment does not
reach the srun tasks; Gilbreth 4.3, PF-slurm-unexported-master).
"""

from __future__ import annotations

import dataclasses
import re

from helpers import launch_parse, launch_traps
from helpers.checks import Check
from helpers.launch_traps import LaunchSpec
from helpers.lint.findings import finding

_SEVERITY = {"FAIL": "error", "WARN": "warning", "INFO": "info"}


def traps_as_findings(spec: LaunchSpec, path: str, line: int) -> list[Check]:
    """:func:`launch_traps.find_traps` of ``spec`` as findings (plus ``standalone-multinode`` for ``srun torchrun --standalone``)."""
    traps = list(launch_traps.find_traps(spec))
    if spec.kind in ("srun+torchrun", "sbatch") and spec.rdzv == "standalone" and spec.nnodes > 1:
        alike = dataclasses.replace(spec, kind="torchrun", master_addr=spec.master_addr or "$MASTER_ADDR")
        traps += [t for t in launch_traps.find_traps(alike) if t.id == "standalone-multinode"]
    return [finding(t.id, _SEVERITY.get(t.severity, "warning"), path, line, t.message, t.fix, t.source) for t in traps]


def _single_quoted_spans(text: str) -> list[tuple[int, int]]:
    """Character spans inside single quotes (not expanded by the shell that reads this text)."""
    spans, start, dq, i = [], -1, False, 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and start < 0:
            i += 2
            continue
        if ch == "#" and start < 0 and not dq and (i == 0 or text[i - 1] in " \t\n"):
            nl = text.find("\n", i)
            i = len(text) if nl < 0 else nl
            continue
        if ch == '"' and start < 0:
            dq = not dq
        elif ch == "'" and not dq:
            if start < 0:
                start = i
            else:
                spans.append((start, i))
                start = -1
        i += 1
    return spans


def lint_shell(path: str, text: str) -> tuple[list[Check], LaunchSpec | None]:
    """Lint a batch/shell script: returns ``(findings, spec)`` (spec None when there is no launch line)."""
    out: list[Check] = []
    is_batch = "#SBATCH" in text
    try:
        spec = launch_parse.parse_sbatch(text) if is_batch else launch_parse.parse_command(text)
    except ValueError:
        spec = None
    line = launch_parse.launch_line(text)
    if spec is not None:
        out += traps_as_findings(spec, path, line)
    quoted = _single_quoted_spans(text)
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        assign = re.search(rf"^[ \t]*{var}=", text, re.MULTILINE)
        if not assign or re.search(rf"^[ \t]*export\s+(.*\s)?{var}\b", text, re.MULTILINE):
            continue
        if not re.search(r"^[ \t]*srun\b", text[assign.end():], re.MULTILINE):
            continue
        uses = [m.start() for m in re.finditer(r"\$\{?" + var + r"\b", text)
                if m.start() > assign.end() and text[m.start() - 1] != "\\"]  # \$VAR: expanded later, per task
        if uses and any(not any(a0 <= u < b0 for a0, b0 in quoted) for u in uses):
            continue  # expanded by the batch shell before srun: no export needed
        line_no = text.count("\n", 0, assign.start()) + 1
        out.append(finding("master-addr-not-exported", "error", path, line_no,
                                f"{var} is assigned but not exported, and the srun tasks read it later (env:// "
                                "rendezvous, or $" + var + " deferred to the task by single quotes or \\$): they see it empty "
                                "('The hostname of the rendezvous endpoint ':29500' ...')",
                                f"export {var}=...", "Gilbreth 4.3"))
    return out, spec
