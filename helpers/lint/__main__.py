"""``python -m helpers.lint PATH... [--command CMD] [--json]`` (the same as ``runbook lint``)."""

from __future__ import annotations

import argparse
import sys

from helpers.lint import cli


def main(argv: list[str] | None = None) -> int:
    """Parse ``argv`` and run the lint subcommand; return its exit status."""
    parser = argparse.ArgumentParser(prog="runbook")
    cli.add_parser(parser.add_subparsers(dest="cmd", required=True))
    args = parser.parse_args(["lint", *(sys.argv[1:] if argv is None else argv)])
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
