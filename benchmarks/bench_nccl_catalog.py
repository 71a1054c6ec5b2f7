"""Coverage of the catalog generated from the sources: WARN sites recognised and read, per subsystem.

For the newest NCCL release the generator walked (helpers/data/nccl_sites.json's header) and each network plugin,
prints one row per subsystem: call sites, sites whose printed message the reader matches back to its own format
(``recognised``) and sites whose reading is specific (a class of ``helpers.nccl_log.catalog.KNOWLEDGE`` rather
than the subsystem alone).  Usage: ``python benchmarks/bench_nccl_catalog.py [--markdown]``; exit 1 when the NCCL
WARN sites read specifically fall under 90 % (issue 24's target).
"""

from __future__ import annotations

import argparse
import sys

from helpers import nccl_log as nl
from helpers.nccl_log import catalog


def rows(origin: str, level: str = "WARN") -> list[tuple[str, int, int, int]]:
    """``(subsystem, sites, recognised, specific)``, largest first, ``all`` last."""
    cov = catalog.coverage(origin, level)
    body = sorted(((k, v["sites"], v["recognised"], v["specific"]) for k, v in cov.items() if k != "all"),
                  key=lambda r: -r[1])
    total = cov.get("all", {"sites": 0, "recognised": 0, "specific": 0})
    return body + [("all", total["sites"], total["recognised"], total["specific"])]


def main(argv: list[str] | None = None) -> int:
    """Print the tables; return 1 when NCCL's specific coverage is under 90 %."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--markdown", action="store_true")
    args = p.parse_args(argv)
    header = nl.load_sites()["header"]
    origins = [("nccl", f"NVIDIA/nccl {header['nccl_tag']} ({header['nccl_commit'][:12]})")]
    origins += [(name, f"{name} {info['describe']} ({info['commit'][:12]})") for name, info in header["plugins"].items()]
    worst = 1.0
    for origin, title in origins:
        table = rows(origin)
        print(f"\n{title}: WARN sites")
        if args.markdown:
            print("| subsystem | sites | recognised | specific |\n|---|---:|---:|---:|")
        for name, n, rec, spec in table:
            cells = (name, str(n), f"{rec} ({rec / max(n, 1):.0%})", f"{spec} ({spec / max(n, 1):.0%})")
            print("| " + " | ".join(cells) + " |" if args.markdown else f"{cells[0]:20s} {cells[1]:>6s} {cells[2]:>12s} {cells[3]:>12s}")
        if origin == "nccl":
            worst = table[-1][3] / max(table[-1][1], 1)
    return 0 if worst >= 0.90 else 1


if __name__ == "__main__":
    sys.exit(main())
