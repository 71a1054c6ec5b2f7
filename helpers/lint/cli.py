"""The ``runbook lint`` subcommand: :func:`add_parser` registers it, :func:`run` runs it."""

from __future__ import annotations

import argparse
import json
import sys

from helpers.lint import UNREADABLE, lint_paths


def add_parser(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:  # type: ignore[type-arg]
    """Add ``lint PATH... [--command CMD] [--json]`` to ``subparsers``; returns the new parser."""
    p = subparsers.add_parser("lint", help="check scripts, DeepSpeed/Accelerate configs and sbatch files before launch",
                              description="Lint training scripts, DeepSpeed JSON, Accelerate YAML and sbatch/shell "
                                          "launch scripts together (docs/lint.md). Exit 1 on an error, 2 on unreadable "
                                          "input, 0 otherwise.")
    p.add_argument("paths", nargs="*", help="files: *.py, DeepSpeed *.json, Accelerate *.yaml, *.sbatch/*.sh")
    p.add_argument("--command", default=None, help="a launch command to check too (torchrun/accelerate/deepspeed/srun ...)")
    p.add_argument("--json", action="store_true", help='print {"findings": [{rule, seed, severity, file, line, message, fix}]}')
    p.set_defaults(func=run)
    return p


def run(args: argparse.Namespace) -> int:
    """Lint ``args.paths`` (+ ``args.command``); print text or JSON; return 2/1/0 (unreadable / error / clean)."""
    if not args.paths and not args.command:
        print("runbook lint: give files to lint and/or --command", file=sys.stderr)
        return 2
    findings = lint_paths(args.paths, command=args.command)
    for f in findings:
        if f.rule == UNREADABLE:
            print(f"runbook lint: {f.title}", file=sys.stderr)
    rest = [f for f in findings if f.rule != UNREADABLE]
    if args.json:
        print(json.dumps({"findings": [f.to_lint_dict() for f in findings]}, indent=2))
    else:
        for f in rest:
            print(f.text())
        counts = {s: sum(f.lint_severity == s for f in rest) for s in ("error", "warning", "info")}
        print(f"{len(rest)} finding(s): {counts['error']} error, {counts['warning']} warning, {counts['info']} info")
    if any(f.rule == UNREADABLE for f in findings):
        return 2
    return 1 if any(f.lint_severity == "error" for f in findings) else 0
