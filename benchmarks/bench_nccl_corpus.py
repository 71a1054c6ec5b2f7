"""Score ``runbook nccl-log`` on the corpus of real NCCL logs (tests/data/nccl/real/manifest.yaml).

Per log: ``right`` (the expected verdict id is present and no other FAIL/WARN points elsewhere; for
``expect: none``, no FAIL/WARN at all), ``partial`` (the expected id is present next to another
FAIL/WARN verdict, or only as INFO), ``wrong`` (a FAIL/WARN verdict, none of them the expected one), ``silent`` (no
FAIL/WARN verdict although one was expected).  A wrong verdict on a log marked
``harmful_if_wrong`` is counted separately: its fix would make things worse.

Usage: ``python benchmarks/bench_nccl_corpus.py [--markdown]``; exit 1 when fewer than 90 % are right
or any harmful wrong verdict is given (issue 15's targets).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import yaml

from helpers import nccl_log as nl

CORPUS = Path(__file__).resolve().parent.parent / "tests" / "data" / "nccl" / "real"


def score(entry: dict) -> tuple[str, list[str]]:
    """(``right``/``partial``/``wrong``/``silent``, the FAIL/WARN verdict ids) for one manifest entry."""
    log = nl.parse_files([CORPUS / entry["file"]])
    verdicts = nl.interpret(log)
    ids = [v.id for v in verdicts if v.status in ("FAIL", "WARN")]
    expect = entry["expect"]
    if not ids and any(v.id == expect for v in verdicts):
        return "partial", [f"{expect} (INFO)"]
    if expect == "none":
        return ("right" if not ids else "wrong"), ids
    if expect in ids:
        return ("right" if len(ids) == 1 or set(ids) <= {expect, "connect-failed", "init-incomplete"} else "partial"), ids
    return ("wrong" if ids else "silent"), ids


def main(argv: list[str] | None = None) -> int:
    """Print the per-log table and the totals; exit 1 below target."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--markdown", action="store_true", help="print a Markdown table")
    args = parser.parse_args(argv)
    manifest = yaml.safe_load((CORPUS / "manifest.yaml").read_text())
    totals = {"right": 0, "partial": 0, "wrong": 0, "silent": 0}
    harmful = 0
    if args.markdown:
        print("| log | expected | verdicts (FAIL/WARN) | score |\n|---|---|---|---|")
    for entry in manifest:
        result, ids = score(entry)
        totals[result] += 1
        harmful += result == "wrong" and bool(entry["harmful_if_wrong"])
        if args.markdown:
            print(f"| [{entry['file']}]({entry['url']}) | {entry['expect']} | {', '.join(ids) or '-'} | {result} |")
        else:
            print(f"{result:8} {entry['file']:40} expect={entry['expect']:26} got={','.join(ids) or '-'}")
    n = len(manifest)
    pct = 100.0 * totals["right"] / n
    print(f"\n{n} logs: " + ", ".join(f"{k} {v}" for k, v in totals.items()) +
          f"; {pct:.0f} % right; {harmful} wrong verdict(s) whose fix would make things worse")
    return 0 if pct >= 90 and harmful == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
