"""The group-testing localisation on a simulated, noisy cluster (issue 23): rounds, tests, faults named and missed.

For each point (N nodes x a fault set), ``--trials`` runs of :func:`helpers.allocation.localise.localise` over
:class:`helpers.allocation.localise.SimulatedCluster` (values with lognormal noise, sigma 0.25; 1 % of the tests
fail for no reason), the faults placed at random on distinct nodes each trial.  Fault sets: none, then 1, 2
and 3 faults of each kind alone (slow node, slow link, a node that fails the collective, a node with another
MTU), then one of each kind together.

Columns: ``rounds_max`` (most rounds in any trial; the bound ceil(log2 N) + 3 and the share of trials within it
beside it), ``tests_mean`` against ``pairs`` = N(N-1)/2 (what measuring every pair takes), ``named`` / ``missed``
(faults, summed over the trials), ``false_drains`` (healthy nodes named for draining, summed; a link's ends are
healthy nodes).  Prints, asserts nothing.

Run: ``.venv/bin/python benchmarks/bench_localisation.py`` (about a minute on 2 cores);
``--nodes 8,64 --trials 200``; ``--json`` prints one JSON object per point instead of the table, with the keys
``nodes, faults, trials, rounds_max, tests_mean, named, missed, false_drains``.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from helpers.allocation.localise import KINDS, SimulatedCluster, localise, random_faults, round_bound, score  # noqa: E402

DEFAULT_NODES = (8, 16, 32, 64, 128, 256, 512, 1024)


def fault_sets() -> list[dict[str, int]]:
    """None, 1-3 of each kind alone, one of each kind together."""
    return [{}] + [{kind: c} for kind in KINDS for c in (1, 2, 3)] + [dict.fromkeys(KINDS, 1)]


def label(counts: dict[str, int]) -> str:
    """``"none"``, ``"slow_node:2"``, ``"slow_node:1,slow_link:1,..."``."""
    return ",".join(f"{k}:{v}" for k, v in counts.items()) or "none"


def point(n: int, counts: dict[str, int], trials: int, rng: random.Random, transient: float) -> dict:
    """``trials`` localisations of ``counts`` faults among ``n`` nodes; the JSON object of the point (+ table extras)."""
    nodes = [f"node{i:04d}" for i in range(n)]
    rounds, tests = [], 0
    total = {"named": 0, "missed": 0, "false_drains": 0}
    for _ in range(trials):
        faults = random_faults(nodes, counts, rng)
        result = localise(nodes, SimulatedCluster(faults, rng, transient=transient))
        rounds.append(result.rounds)
        tests += result.test_count
        for key, value in score(result, faults).items():
            total[key] += value
    bound = round_bound(n)
    return {"nodes": n, "faults": label(counts), "trials": trials, "rounds_max": max(rounds),
            "tests_mean": round(tests / trials, 1), **total,
            "_within": sum(r <= bound for r in rounds) / trials, "_bound": bound, "_pairs": n * (n - 1) // 2}


def main(argv: list[str] | None = None) -> int:
    """Parse the flags, run every point, print the table (or JSON lines)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--nodes", default=",".join(map(str, DEFAULT_NODES)),
                        help="comma-separated node counts, each >= 8 (default 8,16,...,1024)")
    parser.add_argument("--trials", type=int, default=100, help="trials per point (default 100)")
    parser.add_argument("--transient", type=float, default=0.01, help="chance a test fails for no reason (default 0.01)")
    parser.add_argument("--seed", type=int, default=23, help="random seed (default 23)")
    parser.add_argument("--json", action="store_true", help="one JSON object per point instead of the table")
    args = parser.parse_args(argv)
    try:
        sizes = [int(x) for x in args.nodes.split(",") if x.strip()]
    except ValueError:
        parser.error(f"--nodes {args.nodes!r}: comma-separated whole numbers, e.g. 8,64,1024")
    if not sizes or min(sizes) < 8:
        parser.error(f"--nodes {args.nodes!r}: every count must be >= 8 (3 faults of a kind need room)")
    if args.trials < 1:
        parser.error(f"--trials {args.trials}: must be >= 1")
    if not 0 <= args.transient < 1:
        parser.error(f"--transient {args.transient}: must be in [0, 1)")
    rng = random.Random(args.seed)
    if not args.json:
        print("| N | faults | trials | rounds max (bound; share within) | tests mean | pairs N(N-1)/2 | named | missed | false drains |")
        print("|---|---|---|---|---|---|---|---|---|")
    t0 = time.monotonic()
    for n in sizes:
        for counts in fault_sets():
            row = point(n, counts, args.trials, rng, args.transient)
            if args.json:
                print(json.dumps({k: v for k, v in row.items() if not k.startswith("_")}), flush=True)
            else:
                total = sum(counts.values()) * args.trials
                print(f"| {n} | {row['faults']} | {row['trials']} | {row['rounds_max']} ({row['_bound']}; "
                      f"{row['_within']:.0%}) | {row['tests_mean']} | {row['_pairs']:,} | {row['named']}/{total} | "
                      f"{row['missed']} | {row['false_drains']} |", flush=True)
    print(f"{time.monotonic() - t0:.1f} s", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
