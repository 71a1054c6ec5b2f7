"""Rules for sbatch / shell launch scripts and ``--command``: the command builder's traps, through the one checker.

A launch text is checked by :func:`helpers.script_traps.check_text` (:func:`helpers.launch_parse.parse`, then
:func:`~helpers.launch_traps.find_traps` and :func:`~helpers.script_traps.text_traps`): the same call
``runbook build --check`` / ``--check-file`` and the command builder's paste box make, so the three
entry points share one parser and one rule set.  This module only turns the traps into lint findings
(file and line).
"""

from __future__ import annotations

import dataclasses

from helpers import launch_parse, script_traps
from helpers.checks import Check
from helpers.launch_traps import LaunchSpec


def traps_as_findings(traps: list[Check], path: str, line: int) -> list[Check]:
    """``traps`` as lint findings in ``path``: the same records, placed at the trap's own ``line_no`` (text traps),
    else at ``line``."""
    return [dataclasses.replace(t, file=path, line_no=t.line_no or line, evidence=[f"{path}:{t.line_no or line}"])
            for t in traps]


def lint_shell(path: str, text: str) -> tuple[list[Check], LaunchSpec | None]:
    """Lint a batch/shell script (or a pasted command): returns ``(findings, spec)``, spec None without a launch line.

    Raises:
        ValueError: the launch line holds a value no launch can have (``--master-port 0``), naming the field
            (the caller reports it as the file's one ``input-unreadable`` line).
    """
    try:
        spec, traps = script_traps.check_text(text, file=path != "<command>")
    except launch_parse.NoLaunch:
        spec, traps = None, []
    line = launch_parse.launch_line(text) if spec is not None else 1
    return traps_as_findings(traps, path, line), spec
