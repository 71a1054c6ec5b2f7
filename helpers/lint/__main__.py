"""``python -m helpers.lint PATH... [--command CMD] [--json]``: the same as ``runbook lint`` (:func:`helpers.cli.lint`)."""

from __future__ import annotations

import sys

from helpers import cli


def main(argv: list[str] | None = None) -> int:
    """Run ``runbook lint`` with ``argv`` (default: ``sys.argv[1:]``); return its exit status."""
    return cli.main(["lint", *(sys.argv[1:] if argv is None else argv)])


if __name__ == "__main__":
    sys.exit(main())
