"""The allocation check in the operators' terms: ``drain.sh``, drain reasons SLURM shows, JUnit XML, ``--apply``.

Who acts on the report is a SLURM admin or a CI system, not the person who ran the check:

* **drain.sh**: one ``scontrol update nodename=NODE state=drain reason="[node_problem] <check>: <value>"`` line
  per faulty node (the admins' own command: https://slurm.schedmd.com/scontrol.html#OPT_State_1).  ``sinfo -R``
  prints the reason in a 20-character column (its default format is ``%20E %9u %19H %N``:
  https://slurm.schedmd.com/sinfo.html#OPT_list-reasons), so the first 20 characters say what is wrong:
  ``[node_problem] `` (15) then a code of at most 4 letters and a colon (:data:`CODES`), e.g.
  ``[node_problem] slow: busbw 0.006 GB/s < 0.0125``.  The ``[node_problem]`` / ``[user_problem]`` prefixes are
  Nebius soperator's convention (``internal/consts/slurm.go``: ``SlurmNodeReasonHC = "[node_problem]"``; its
  acceptance tests drain with ``[user_problem] alloc_gpus_busy``: https://github.com/nebius/soperator), which its
  controllers read to decide between repairing the node and telling the user.
* **never drain for a tool error or a user error**: a check that broke on its own (an exception, a missing
  program, our own job launcher timing out) or because of what the user asked for (a bad parameter, SLURM
  refusing the step's request) is a WARN record (:func:`tool_error`, :func:`user_error`; ``values["cause"]``)
  with the reason, drains nothing, and makes the exit status 2 (:func:`exit_status`).  A node is drained only
  when a check measured it and named it in ``faulty`` (:func:`drain_commands`).
* **--apply** runs those ``scontrol`` lines (opt-in; never the default) through the
  :class:`helpers.slurm.SlurmClient` that reached the nodes (:func:`apply`).
* **junit.xml** beside ``report.json``: one ``<testcase>`` per check; FAIL is a ``<failure>``, a tool or user
  error an ``<error>`` (JUnit's "the test could not run"), WARN and INFO pass with the line in ``<system-out>``
  and a ``status`` property.  Written with the standard library's ``xml.etree.ElementTree``: the format needs
  five elements, and the PyPI writers (``junit-xml``) would be a dependency for that alone.  Schema: the
  de-facto JUnit XML read by Jenkins, GitLab and GitHub test reporters
  (https://github.com/testmoapp/junitxml).

Pure except :func:`write_outputs` (two files, written atomically) and :func:`apply` (``scontrol``).
"""

from __future__ import annotations

import os
import re
import xml.etree.ElementTree as ET
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from helpers.checks import NOT_OK, Check

if TYPE_CHECKING:
    from helpers.slurm import SlurmClient

CAUSES = ("node_problem", "user_problem", "tool_error")
"""Why a record is not OK: the node (drain it), the user's request or script (tell them), the check itself (fix it)."""

REASON_WIDTH = 20
"""Characters of the reason ``sinfo -R`` shows (``%20E``): they must say what is wrong."""

MAX_REASON = 120
"""Longest reason written (``scontrol`` keeps more, but every ``sinfo``/``squeue`` view cuts it)."""

CODES: Mapping[str, str] = {
    "versions": "ver", "gpus": "gpu", "step": "down", "launch": "join", "env_diff": "env", "contract": "rank",
    "correctness": "data", "bandwidth": "slow", "intra": "slow", "inter": "slow", "slow": "slow", "link": "link",
    "collective": "coll", "mtu": "mtu", "socket_ifname": "nic", "interfaces": "nic", "iface": "nic", "nic": "nic",
    "port": "port", "shm": "shm", "mount": "mnt", "mounts": "mnt", "version": "ver", "host": "host",
}
"""What-is-wrong codes (at most 4 letters) by the word of the check id that names the measurement
(``node.gpus.node1`` -> ``gpu``; ``pairs.bandwidth`` -> ``slow``; ``net.mtu.node1`` -> ``mtu``).  An id with none of
these words gets its second word cut to 4 letters."""

_UNSAFE = re.compile(r'["$`\\\n\r]+')


def cause(check: Check) -> str:
    """The :data:`CAUSES` entry of a WARN/FAIL record, or ``""`` (OK/INFO, or not OK but no node to blame).

    ``values["cause"]`` when the record carries one (:func:`tool_error`, :func:`user_error`); a SLURM step the
    controller *refused* (``slurm_errors`` all of kind ``refused``: the request was wrong, not the node) is
    ``user_problem``; a record naming faulty nodes is ``node_problem``; anything else not OK (a slow link, an
    envelope, a job that did not complete without naming a node) blames no node: ``""``, reported, never drained.
    """
    if check.status not in NOT_OK:
        return ""
    values = check.values if isinstance(check.values, Mapping) else {}
    if values.get("cause") in CAUSES:
        return str(values["cause"])
    errs = values.get("slurm_errors")
    if errs and all(isinstance(e, Mapping) and e.get("kind") == "refused" for e in errs):
        return "user_problem"
    return "node_problem" if check.faulty else ""


def is_error(check: Check) -> bool:
    """True for a tool or user error: the check could not judge the node (exit status 2, a JUnit ``<error>``)."""
    return cause(check) in ("tool_error", "user_problem")


def code(check_id: str) -> str:
    """The short code of :data:`CODES` for ``check_id`` (at most 4 letters, lower case)."""
    words = check_id.split(".")
    for word in [*reversed(words[1:]), words[0]]:  # the most specific word first: node.host.socket_ifname.a -> nic
        if word in CODES:
            return CODES[word]
    return re.sub(r"[^a-z0-9]", "", (words[1] if len(words) > 1 else words[0]).lower())[:4] or "chk"


def reason(check: Check, node: str) -> str:
    """``[<cause>] <code>: <what was measured>`` for ``node``, safe inside double quotes, at most :data:`MAX_REASON`.

    The value is the record's title without the node's name in front (``node2: 0 GPU(s) visible, 8 asked for``
    -> ``0 GPU(s) visible, 8 asked for``).
    """
    title = check.title
    for prefix in (f"{node}: ", f"{node} "):
        if title.startswith(prefix):
            title = title[len(prefix):]
    text = f"[{cause(check) or 'node_problem'}] {code(check.id)}: {title}"
    text = _UNSAFE.sub(" ", text).strip()
    return text if len(text) <= MAX_REASON else text[:MAX_REASON - 3].rstrip() + "..."


def drain_commands(checks: Iterable[Check]) -> list[tuple[str, str, list[str]]]:
    """``[(node, reason, scontrol argv)]``: one per node that a ``node_problem`` record names, FAIL records first.

    Tool and user errors name no node here (:func:`cause`), whatever their ``faulty`` says.
    """
    ordered = sorted((c for c in checks if cause(c) == "node_problem"), key=lambda c: c.status != "FAIL")
    seen: dict[str, str] = {}
    for check in ordered:
        for node in check.faulty:
            seen.setdefault(node, reason(check, node))
    return [(node, why, ["scontrol", "update", f"nodename={node}", "state=drain", f"reason={why}"])
            for node, why in seen.items()]


def drain_script(checks: Iterable[Check], *, origin: str = "runbook diagnose") -> str:
    """The text of ``drain.sh``: ``set -euo pipefail``, then one ``scontrol update ... state=drain`` line per node.

    With nothing to drain the script says why in a comment and does nothing (exit 0); the tool and user errors
    are listed as comments, so whoever reads it sees that no node was blamed for them.
    """
    checks = list(checks)
    lines = ["#!/usr/bin/env bash", f"# Written by {origin}: drain the nodes the allocation check found faulty.",
             "# Run it as a SLURM admin (or `runbook diagnose --apply`); `sinfo -R` then shows each reason.",
             "# Undo: scontrol update nodename=NODE state=resume", "set -euo pipefail"]
    commands = drain_commands(checks)
    for node, why, _ in commands:
        lines.append(f'scontrol update nodename={node} state=drain reason="{why}"')
    others = [c for c in checks if is_error(c)]
    for c in others:
        lines.append(f"# not drained ({cause(c)}): {c.id}: {_UNSAFE.sub(' ', c.title)[:MAX_REASON]}")
    if not commands:
        lines.append("# nothing to drain: no check named a faulty node")
    return "\n".join(lines) + "\n"


def tool_error(check_id: str, message: str, remediation: str = "", *, node: str = "") -> Check:
    """A WARN record for a check that broke on its own (``values["cause"] = "tool_error"``): never drains.

    ``node`` only says where it ran; ``faulty`` stays empty.
    """
    rec = Check(check_id, message, "WARN", {"cause": "tool_error"},
                remediation or "the check itself failed, not the node: read its log, fix or report the tool, run it again",
                "https://slurm.schedmd.com/slurm.conf.html#OPT_HealthCheckProgram", node=node)
    rec.faulty = []
    return rec


def user_error(check_id: str, message: str, remediation: str = "", *, node: str = "") -> Check:
    """A WARN record for a user's mistake (bad parameter, a request SLURM refused): ``values["cause"] = "user_problem"``."""
    rec = Check(check_id, message, "WARN", {"cause": "user_problem"},
                remediation or "fix the request (its message names the field) and run it again", "", node=node)
    rec.faulty = []
    return rec


def exit_status(checks: Iterable[Check]) -> int:
    """2 when any record is a tool or user error (:func:`is_error`), else 1 when any is FAIL, else 0."""
    checks = list(checks)
    if any(is_error(c) for c in checks):
        return 2
    return 1 if any(c.status == "FAIL" for c in checks) else 0


def junit_xml(checks: Sequence[Check], suite: str = "allocation-check", *, time_s: float | None = None) -> str:
    """The JUnit XML text of ``checks``: one ``<testsuite>``, one ``<testcase>`` per record (see the module docstring)."""
    errors = sum(is_error(c) for c in checks)
    failures = sum(c.status == "FAIL" and not is_error(c) for c in checks)
    root = ET.Element("testsuites", name=suite, tests=str(len(checks)), failures=str(failures), errors=str(errors))
    ts = ET.SubElement(root, "testsuite", name=suite, tests=str(len(checks)), failures=str(failures),
                       errors=str(errors), skipped="0", time=f"{time_s or 0:.1f}")
    for c in checks:
        case = ET.SubElement(ts, "testcase", classname=f"{suite}.{c.id.split('.')[0]}", name=c.id + (f"@{c.node}" if c.node else ""),
                             time="0")
        props = ET.SubElement(case, "properties")
        ET.SubElement(props, "property", name="status", value=c.status)
        if c.faulty:
            ET.SubElement(props, "property", name="faulty", value=",".join(c.faulty))
        body = "\n".join([c.title, *([f"fix: {c.remediation}"] if c.remediation else []), *c.evidence])
        if is_error(c):
            ET.SubElement(case, "error", message=c.title, type=cause(c)).text = body
        elif c.status == "FAIL":
            ET.SubElement(case, "failure", message=c.title, type=cause(c) or "FAIL").text = body
        else:
            ET.SubElement(case, "system-out").text = c.line()
    ET.indent(root)
    return '<?xml version="1.0" encoding="UTF-8"?>\n' + ET.tostring(root, encoding="unicode") + "\n"


def write_outputs(report_dir: str | os.PathLike[str], checks: Sequence[Check], *, origin: str = "runbook diagnose",
                  time_s: float | None = None) -> dict[str, Path]:
    """Write ``drain.sh`` (mode 755) and ``junit.xml`` into ``report_dir`` atomically; return their paths."""
    from helpers.report import write_atomic

    out = Path(report_dir)
    drain = write_atomic(out / "drain.sh", drain_script(checks, origin=origin))
    drain.chmod(0o755)
    junit = write_atomic(out / "junit.xml", junit_xml(checks, time_s=time_s))
    return {"drain": drain, "junit": junit}


def apply(client: SlurmClient, checks: Iterable[Check], *, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    """Run the ``scontrol update ... state=drain`` of :func:`drain_commands` through ``client``.

    Returns:
        ``[{"node", "reason", "returncode", "stderr"}]``, one per node, in order.
    """
    done = []
    for node, why, argv in drain_commands(checks):
        proc = client.slurm(argv, timeout_s)
        done.append({"node": node, "reason": why, "returncode": proc.returncode, "stderr": proc.stderr.strip()})
    return done
