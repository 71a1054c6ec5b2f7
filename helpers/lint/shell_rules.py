"""Rules for sbatch / shell launch scripts: the command builder's traps plus what only the text shows.

The launch line is read with :func:`helpers.launch_parse.parse_sbatch` (``#SBATCH`` header) or
:func:`helpers.launch_parse.parse_command`, and the spec is checked with
:func:`helpers.launch_traps.find_traps`: one rule set for the widget, ``--command`` and the sbatch
reader.  The text-only rule here is ``master-addr-not-exported`` (a plain assignment does not
reach the srun tasks; gilbreth-hpc-guide §4.3, platform-facts.md).
"""

from __future__ import annotations

import dataclasses
import re

from helpers import launch_parse, launch_traps
from helpers.launch_traps import LaunchSpec
from helpers.lint.findings import Finding

_SEVERITY = {"FAIL": "error", "WARN": "warning", "INFO": "info"}


def traps_as_findings(spec: LaunchSpec, path: str, line: int) -> list[Finding]:
    """:func:`launch_traps.find_traps` of ``spec`` as findings (plus ``standalone-multinode`` for ``srun torchrun --standalone``)."""
    traps = list(launch_traps.find_traps(spec))
    if spec.kind in ("srun+torchrun", "sbatch") and spec.rdzv == "standalone" and spec.nnodes > 1:
        alike = dataclasses.replace(spec, kind="torchrun", master_addr=spec.master_addr or "$MASTER_ADDR")
        traps += [t for t in launch_traps.find_traps(alike) if t.id == "standalone-multinode"]
    return [Finding.make(t.id, _SEVERITY.get(t.severity, "warning"), path, line, t.message, t.fix, t.source) for t in traps]


def lint_shell(path: str, text: str) -> tuple[list[Finding], LaunchSpec | None]:
    """Lint a batch/shell script: returns ``(findings, spec)`` (spec None when there is no launch line)."""
    out: list[Finding] = []
    is_batch = "#SBATCH" in text
    try:
        spec = launch_parse.parse_sbatch(text) if is_batch else launch_parse.parse_command(text)
    except ValueError:
        spec = None
    line = launch_parse.launch_line(text)
    if spec is not None:
        out += traps_as_findings(spec, path, line)
    lines = text.splitlines()
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        assigned = [i for i, ln in enumerate(lines, 1) if re.match(rf"^\s*{var}=", ln)]
        exported = any(re.match(rf"^\s*export\s+(.*\s)?{var}\b", ln) for ln in lines)
        if not assigned or exported:
            continue
        srun = [i for i, ln in enumerate(lines, 1) if re.match(r"^\s*srun\b", ln)]
        if not srun:
            continue
        body = "\n".join(lines[srun[0] - 1:])
        early_use = re.search(r'"[^"\']*\$\{?' + var, lines[srun[0] - 1]) or re.search(
            r"--\S*(master|main_process)[_-]?(addr|ip|port)[= ]\$\{?" + var, body.split("'")[0], re.I)
        if early_use:
            continue
        out.append(Finding.make("master-addr-not-exported", "error", path, assigned[0],
                                f"{var} is assigned but not exported: the srun tasks (and torchrun's env:// "
                                f"rendezvous) do not see it ('The hostname of the rendezvous endpoint ':29500' ...')",
                                f"export {var}=...", "Gilbreth 4.3"))
    return out, spec
