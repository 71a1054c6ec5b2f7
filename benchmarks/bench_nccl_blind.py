"""Score ``runbook nccl-log`` on the blind set: real logs from public issues with confirmed causes, chosen without
seeing the reader's rules (tests/data/nccl/blind/manifest.yaml, collected by another session for issue 24).

A case is **right** when a verdict names the confirmed cause, or names the right suspect marked as a suspect, and
no verdict states a wrong cause (a FAIL/WARN verdict of kind ``cause`` that is not the confirmed one: its fix would
change the wrong thing, which is how this script counts "a fix that makes things worse").  "No verdict" is not
right.  Verdicts of kind ``context`` and ``other-warnings`` never name a cause.

What "names the cause" means per cause category is the table :data:`NAMES` below, written from the manifest's
``cause`` / ``fix`` text before the first score (a regex over each verdict's ``id`` and title).

A second set, ``tests/data/nccl/blind2/`` (collected by two more sessions for issue 24, after the first set had been
used for tuning), carries its own ``accept`` regexes per case (any of them names the cause; written by the collector
from the confirmed cause) and ``reject`` regexes (the classic wrong diagnosis of that case), plus
``decidable_from_log``: a case the log alone cannot decide is right when no verdict states a wrong cause.  A third,
``tests/data/nccl/blind3/`` (10 logs, one more collector session, after blind2 had been used for tuning), has the same
keys, and so have ``tests/data/nccl/blind4/`` (9 logs, collected on 2026-11-26 after blind3 had been used
for tuning) ``tests/data/nccl/blind5/`` (10 logs, collected later that day, after blind4 had been used), ``tests/data/nccl/blind6/`` (29 logs from
five collector sessions on the next day, after blind5 had been used), ``tests/data/nccl/blind7/`` (30 logs from twelve
collector sessions later that day, after blind6 had been used) and ``tests/data/nccl/blind8/`` (10 logs from eight
collector sessions on the same day, after blind7 had been used).  For those sets a wrong cause is a FAIL/WARN ``cause`` verdict that matches a ``reject`` regex or no ``accept`` regex.

Usage: ``python benchmarks/bench_nccl_blind.py [--set blind|blind2|...|blindN] [--record first|after]`` (any folder ``tests/data/nccl/blind*`` with a manifest): prints one row per
case and the total; ``--record`` appends the rows and the total to the set's ``scores.md`` under a heading
(``first`` refuses to run when a first score is already recorded: the first score is taken once, before any
tuning).
"""

from __future__ import annotations

import argparse
import datetime
import re
import subprocess
import sys
from pathlib import Path

import yaml

from helpers import nccl_log as nl

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "nccl"
BLIND = DATA / "blind"

NAMES: dict[str, str] = {
    "no-ip-interface-container": r"no-interface|socket-ifname-no-match|socket-no-interface|no usable socket interface",
    "shm-too-small": r"shm-full|nccl\.shm\b|/dev/shm",
    "ib-gid-index": r"GID index|NCCL_IB_GID_INDEX|link-local",
    "gdr-disabled-peermem-detection-old-nccl": r"peermem|GPU Direct RDMA (?:is )?disabled|GDR disabled",
    "ulimit-memlock": r"memlock|ulimit -l|locked-memory",
    "port-in-use": r"tcpstore-port-in-use|[Aa]ddress already in use|holds the port",
    "nccl-bug-fixed-in-2.26": r"known-bug\.\S+.*fixed in 2\.26",
    "nccl-regression-2.19": r"known-bug\.\S+.*2\.19|regression",
    "wrong-interface-name": r"no-interface|socket-ifname-no-match|matches no interface",
    "ib-unusable-hca": r"NCCL_IB_HCA|HCA|ib-verbs-call",
    "driver-too-old-for-cuda-runtime": r"driver-version-is-insufficient|driver is older",
    "nccl-cuda-build-mismatch": r"built (?:for|against) (?:another|a different) CUDA|CUDA (?:runtime|version) (?:mismatch|differs)",
    "net-plugin-static-topo-file": r"topology file|NCCL_TOPO_FILE|static topolog",
    "p2p-acs-gdr": r"\bACS\b",
    "p2p-iommu": r"IOMMU|\bACS\b",
    "faulty-node-ib-fabric": r"ib-retry-exceeded|faulty node|bad node|fabric|cannot reach each other",
    "efa-devices-not-exposed-in-container": r"EFA|/dev/infiniband|ofi-provider",
    "wrong-master-addr": r"MASTER_ADDR|tcpstore-client-timeout",
    "timeout-slow-rank-uneven-work": r"slow|lagging|straggler|uneven|took longer",
    "rail-topology-cross-nic": r"CROSS_NIC|rail",
    "stale-graph-file-config": r"GRAPH_FILE|graph file|nccl\.conf",
    "nccl-built-without-gpu-arch": r"gencode|sm_\d+|architecture|no kernel image|named symbol not found",
    "efa-libfabric-bug-nccl219-cumem": r"FI_EFA|libfabric|EFA installer",
    "gdr-data-corruption-driver-bug": r"driver bug|GPU Direct RDMA.*(?:driver|corrupt)|NCCL_IB_CUDA_SUPPORT",
    "more-ranks-than-gpus-per-node": r"invalid-device-ordinal|more ranks than GPUs|LOCAL_RANK >= visible|does not exist",
    "wrong-interface-bootstrap-ipoib": r"bad-interface|IPoIB|NCCL_SOCKET_IFNAME",
    "nccl-bug-fixed-in-2.27.3-bootstrap-stray-connection": r"known-bug\.\S+.*2\.27|stray connection|magic",
    "nccl-bug-fixed-in-2.8-topo-injection": r"known-bug\.\S+.*2\.8\b|topology file.*CPU",
    "nccl-tests-built-without-mpi": r"\bMPI\b|separate (?:jobs|processes)|each rank alone",
    "pytorch-regression-with-old-nccl": r"set_device|old NCCL|NCCL >= ?2\.13",
    "nvls-nccl-2.26.2-old-driver": r"NVLS|nvls|NVLink SHARP",
    "nvls-init-hang": r"NVLS|nvls|NVLink SHARP",
    "duplicate-gpu-no-set-device": r"duplicate-gpu|same GPU|set_device",
    "tcpstore-libuv-missing-windows": r"libuv|USE_LIBUV",
    "wrong-interface-docker-bridges": r"bad-interface|docker0|veth|bridge",
    "nccl-too-old-for-hardware": r"too old|newer NCCL|does not know this (?:GPU|hardware)",
    "mismatched-collectives-data-dependent-graph": r"mismatch|different collectives|different sizes|never entered",
    "socket-ifname-nonexistent": r"no-interface|socket-ifname-no-match|matches no interface",
    "ulimit-nofile": r"nofile|ulimit -n|open files",
}
"""Cause category -> regex over ``"<id> <title>"`` of a verdict that names that cause (written before scoring)."""


def score(entry: dict, where: Path = BLIND) -> tuple[str, list[str], list[str]]:
    """``(result, naming verdicts, wrong-cause verdicts)``; result: ``right``, ``harmful``, ``wrong`` or ``silent``.

    ``harmful``: a FAIL/WARN verdict of kind ``cause`` names another cause (whether or not the right one is there);
    ``wrong``: verdicts, none naming the cause; ``silent``: no FAIL/WARN verdict and none naming the cause.
    """
    problems: list[str] = []
    try:
        log = nl.parse_files([where / entry["file"]], problems=problems)
        verdicts = nl.interpret(log)
    except ValueError:
        verdicts = []
    # a collector's regex may start with its own (?i): the alternation below is case-blind already, and Python
    # refuses a global flag that is not at the start of the whole pattern
    accept = [re.sub(r"^\(\?i\)", "", a) for a in entry.get("accept") or []]
    rx = re.compile("|".join(f"(?:{a})" for a in accept) if accept else NAMES[entry["cause_category"]], re.IGNORECASE
                    if accept else 0)
    reject = re.compile("|".join(f"(?:{re.sub(r'^[(][?]i[)]', '', r)})" for r in entry.get("reject") or [])
                        or r"(?!)", re.IGNORECASE)
    naming, wrong = [], []
    for v in verdicts:
        kind = v.values.get("kind", "cause")
        if kind == "context" or v.id == "other-warnings":
            continue
        text = f"{v.id} {v.title}"
        if v.status in ("FAIL", "WARN") and kind == "cause" and reject.search(text):
            wrong.append(v.id)
        elif rx.search(text):
            naming.append(v.id)
        elif v.status in ("FAIL", "WARN") and kind == "cause":
            wrong.append(v.id)
    acting = [v for v in verdicts if v.status in ("FAIL", "WARN")]
    if wrong:
        return "harmful", naming, wrong
    if naming:
        return "right", naming, wrong
    if entry.get("decidable_from_log") is False:
        return "undecided", naming, [v.id for v in acting]
    return ("wrong" if acting else "silent"), naming, [v.id for v in acting]


def run(where: Path = BLIND) -> tuple[list[str], str]:
    """The rows (one per case) and the total line of the set in ``where``.

    ``undecided`` (a case marked ``decidable_from_log: false`` with no wrong-cause verdict) counts as right: saying
    nothing beats a wrong cause there; the total also gives the decidable cases apart.
    """
    manifest = yaml.safe_load((where / "manifest.yaml").read_text())
    rows, counts = [], {"right": 0, "undecided": 0, "harmful": 0, "wrong": 0, "silent": 0}
    dec_n = dec_right = 0
    for entry in manifest:
        result, naming, other = score(entry, where)
        counts[result] += 1
        if entry.get("decidable_from_log", True):
            dec_n += 1
            dec_right += result == "right"
        rows.append(f"| {entry['file']} | {entry['cause_category']} | {result} | {', '.join(naming) or '-'} | "
                    f"{', '.join(other) or '-'} |")
    n = len(manifest)
    ok = counts["right"] + counts["undecided"]
    total = (f"{n} cases: right {ok} ({ok / n:.0%}; {counts['undecided']} of them undecidable cases left without a "
             f"wrong cause), harmful {counts['harmful']}, wrong {counts['wrong']}, silent {counts['silent']}; "
             f"decidable from the log: {dec_right}/{dec_n} right")
    return rows, total


def main(argv: list[str] | None = None) -> int:
    """Print (and with ``--record``, append to scores.md) the per-case table and the total."""
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sets = sorted((d.name for d in DATA.glob("blind*") if (d / "manifest.yaml").is_file()), key=lambda n: (len(n), n))
    p.add_argument("--set", default="blind", choices=sets, help="which blind set: a folder tests/data/nccl/blind* (default blind)")
    p.add_argument("--record", choices=("first", "after"))
    args = p.parse_args(argv)
    where = DATA / args.set
    scores = where / "scores.md"
    rows, total = run(where)
    table = ["| case | cause category | result | verdicts naming it | wrong-cause / other acting verdicts |",
             "|---|---|---|---|---|"] + rows
    print("\n".join(table) + "\n\n" + total)
    if args.record:
        text = scores.read_text() if scores.exists() else "# Blind set scores (benchmarks/bench_nccl_blind.py)\n"
        if args.record == "first" and "## First score" in text:
            print("a first score is already recorded; it is taken once", file=sys.stderr)
            return 2
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
        when = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
        title = "First score (before any tuning)" if args.record == "first" else "Score after tuning"
        text += f"\n## {title}: commit {head}, {when}\n\n**{total}**\n\n" + "\n".join(table) + "\n"
        scores.write_text(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
