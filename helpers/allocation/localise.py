"""Which nodes (or links) make the allocation fail: adaptive group testing over a measurement oracle.

At N nodes, measuring every node pair takes N(N-1)/2 tests (26,796 at 232 nodes); group testing finds d faulty
nodes in about 2 d log2(N/d) tests.  The algorithm is NVIDIA Cluster Readiness Engine's adaptive fault isolation,
ADR-055 (https://github.com/NVIDIA/cluster-readiness-engine/blob/main/docs/designs/055-adaptive-fault-isolation.md:
screen groups, split the failing ones, confirm each suspect against a known-good partner; bisection as in
``pkg/orchestration/bisect.go``, confirmation pairs rotating through the healthy pool as in
``pkg/orchestration/diagnose.go`` ``BuildConfirmationGroups``) with ADR-056's cross-boundary probing for faults
between nodes (``docs/designs/056-cross-boundary-probing.md``: a group fails, both its halves pass, so the fault
is a link between them).  A *test* runs one collective over a group of nodes and says pass or fail; a *round*
is a set of disjoint groups tested at the same time (one call of the oracle).

The four faults it localises, and the model each one follows (what makes a group's test fail):

* a **slow node** (a throttled NIC, a slow GPU): every group holding it is slow (a ring is as fast as its
  slowest member): the OR model of group testing (Hwang 1972, ADR-055 reference [4]);
* a **node that fails the collective** (its rank errors or never joins): every group holding it fails;
* a **node with another MTU** (its path drops jumbo frames; lab: its switch port at 1500 behind 9000-byte
  endpoints): every group holding it times out on large messages, small ones pass;
* a **slow link between two nodes**: only a group holding *both* ends is slow (the edge-faulty model of
  ADR-056 reference [5]); the group test must exercise every pair of its members (an all_to_all does).

Differences from ADR-055, and why:

* Screening is top-down halving from the whole allocation (the quick check's job over every node is the
  first test), not ceil(sqrt N) groups: a link between two screening groups would pass every screen, and halving
  keeps the rounds at ceil(log2 N) + 3 (``benchmarks/bench_localisation.py``).
* A suspect is confirmed twice, each time against a different known-good partner: one confirmation lets a
  transient failure of the confirmation test drain a healthy node (about 1 % per suspect with 1 % flaky tests).
* Cross-boundary probing tests, each round, the matched halves of every candidate block at once (X1+Y1 and
  X2+Y2; when both pass, the crossed halves are the candidates of the next round), so a link is found in
  log2(block side) + 1 rounds; ADR-056 clears a block whose two mixed groups pass, which loses half the links.
* When the search ends, one verification test of every node not named (and one end of each named link left out)
  catches a second fault hidden behind a first one in the same failing group; a failing verification starts
  another pass (at most ``max_passes``).

A node is drained only when it failed both confirmations; a link is reported, never drained (its ends are
healthy nodes).  When no group ever passes there is no known-good partner: nothing is confirmed, nothing
drained, and the verdict says the fault is not a node's (fabric, configuration).

The oracle is a callable: ``oracle(groups) -> outcomes``, one :class:`Outcome` per group (the groups of one
call are disjoint).  :func:`localise` calls it with real jobs in :mod:`helpers.allocation.across` and with
:class:`SimulatedCluster` in the tests and the benchmark.  Pure: no SLURM, no job, no file here.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

from helpers.allocation.grades import PAIR_SLOW_FRACTION

KINDS = ("slow_node", "slow_link", "collective", "mtu")
"""The fault kinds :class:`SimulatedCluster` injects: a slow node, a slow link between two nodes, a node whose
rank fails the collective, a node with another MTU."""

PURPOSES = ("root", "split", "confirm", "probe", "cross", "leaf", "verify", "recheck")
"""Why a test ran: the whole set, a half of a failing group, a suspect with a known-good partner, two suspects
together when no node is known good yet, a mixed group of cross-boundary probing, one candidate pair (a link),
the verification after a pass, a link's pair again."""


@dataclasses.dataclass(frozen=True)
class Outcome:
    """What the oracle says about one group: failed or not, the measured value, a word on why.

    Attributes:
        failed: the group's test failed (slow, error, timeout).
        value: the measurement (busbw in GB/s for the real check; relative to nominal in the simulator); None
            when the collective itself failed.
        detail: a few words for the report (``"timeout"``, ``"busbw 0.006 GB/s < floor 0.0125"``).
    """

    failed: bool
    value: float | None = None
    detail: str = ""


Oracle = Callable[[Sequence[tuple[str, ...]]], Sequence[Outcome]]
"""``oracle(groups) -> one Outcome per group``; the groups of one call are disjoint (they run at the same time)."""


@dataclasses.dataclass(frozen=True)
class Test:
    """One group test as it ran: its round (1-based), the group, why it ran, and its outcome."""

    round: int
    group: tuple[str, ...]
    purpose: str
    failed: bool
    value: float | None = None
    detail: str = ""


@dataclasses.dataclass
class Localisation:
    """The result of :func:`localise`.

    Attributes:
        nodes: the faulty nodes (each failed two confirmations against known-good partners): drain them.
        links: the faulty links, ``(a, b)`` with ``a < b`` in the input order: report them, drain nothing.
        unconfirmed: suspects that could not be confirmed (no known-good partner): neither drained nor cleared.
        verdict: ``healthy`` (the first test passed), ``localised`` (faults named, the verification passed),
            ``transient`` (nothing named, the repeated test passed), ``not localised`` (still failing: no node or
            link explains it, e.g. every group fails: fabric or configuration), ``round limit``.
        tests: every test in order.
        rounds: rounds run (oracle calls, the first test included).
        n: nodes given.
    """

    nodes: list[str]
    links: list[tuple[str, str]]
    unconfirmed: list[str]
    verdict: str
    tests: list[Test]
    rounds: int
    n: int

    @property
    def pairs(self) -> int:
        """The tests measuring every node pair would take: N(N-1)/2."""
        return self.n * (self.n - 1) // 2

    @property
    def test_count(self) -> int:
        """Tests run (group tests of every round)."""
        return len(self.tests)

    def to_dict(self) -> dict[str, Any]:
        """The JSON form: named nodes and links, the verdict, the counts, every test."""
        return {"nodes": list(self.nodes), "links": [list(p) for p in self.links], "unconfirmed": list(self.unconfirmed),
                "verdict": self.verdict, "rounds": self.rounds, "tests": self.test_count, "pairs": self.pairs,
                "n": self.n, "history": [dataclasses.asdict(t) for t in self.tests]}


def round_bound(n: int) -> int:
    """ceil(log2 N) + 3: the rounds the issue allows (and the halving search needs) for N nodes."""
    return math.ceil(math.log2(max(n, 2))) + 3


# --------------------------------------------------------------------------- the search


@dataclasses.dataclass
class _Split:
    """A failed group to halve: each half is tested (a single node with a known-good partner)."""

    group: tuple[str, ...]
    halves: list[tuple[str, ...]] = dataclasses.field(default_factory=list)
    failed: dict[tuple[str, ...], bool] = dataclasses.field(default_factory=dict)


@dataclasses.dataclass
class _Cross:
    """Candidate blocks ``(X, Y)``: X and Y each passed, a group holding both failed: a link X-Y is to be found."""

    blocks: list[tuple[tuple[str, ...], tuple[str, ...]]]


@dataclasses.dataclass
class _Confirm:
    """A suspect node to test with known-good partners until it failed ``need`` times, or passed once."""

    node: str
    need: int
    partners: list[str] = dataclasses.field(default_factory=list)


def _halves(group: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    mid = len(group) // 2
    return group[:mid], group[mid:]


class _Search:
    """The state of one :func:`localise` run (kept out of the public API: call :func:`localise`)."""

    def __init__(self, nodes: Sequence[str], oracle: Oracle, confirmations: int, max_rounds: int) -> None:
        self.order = {n: i for i, n in enumerate(nodes)}
        self.oracle = oracle
        self.confirmations = confirmations
        self.max_rounds = max_rounds
        self.good: dict[str, int] = {}  # node -> size of the largest group it passed in
        self.rotation = 0
        self.tests: list[Test] = []
        self.rounds = 0
        self.nodes: list[str] = []
        self.links: list[tuple[str, str]] = []
        self.unconfirmed: list[str] = []
        self.tried: set[frozenset[str]] = set()

    def sort(self, group: Iterable[str]) -> tuple[str, ...]:
        return tuple(sorted(group, key=self.order.__getitem__))

    def link(self, a: str, b: str) -> tuple[str, str]:
        first, second = self.sort((a, b))
        return first, second

    def run(self, groups: list[tuple[tuple[str, ...], str]]) -> list[Outcome]:
        """One round: test ``[(group, purpose)]`` (disjoint) through the oracle; record; learn the good nodes."""
        self.rounds += 1
        outcomes = list(self.oracle([g for g, _ in groups]))
        if len(outcomes) != len(groups):
            raise ValueError(f"oracle: {len(outcomes)} outcomes for {len(groups)} groups; give one per group")
        for (group, purpose), out in zip(groups, outcomes, strict=True):
            if len(group) == 2:
                self.tried.add(frozenset(group))
            self.tests.append(Test(self.rounds, group, purpose, bool(out.failed), out.value, out.detail))
            if not out.failed:
                for node in group:
                    self.good[node] = max(self.good.get(node, 0), len(group))
        return outcomes

    def pair_up(self, suspects: Sequence[str]) -> list[tuple[str, ...]]:
        """Disjoint pairs of suspects never tested together: a pair that passes gives known-good partners."""
        pairs: list[tuple[str, ...]] = []
        used: set[str] = set()
        for i, a in enumerate(suspects):
            for b in suspects[i + 1:]:
                if a not in used and b not in used and frozenset((a, b)) not in self.tried:
                    pairs.append(self.sort((a, b)))
                    used |= {a, b}
        return pairs

    def partner(self, busy: set[str], exclude: Iterable[str] = ()) -> str | None:
        """A known-good node not busy this round (largest passing group first, rotating among equals), or None."""
        free = [n for n in self.good if n not in busy and n not in set(exclude)]
        free = free or [n for n in self.good if n not in busy]  # a partner used before rather than none
        if not free:
            return None
        best = max(self.good[n] for n in free)
        pool = sorted((n for n in free if self.good[n] == best), key=self.order.__getitem__)
        self.rotation += 1
        return pool[self.rotation % len(pool)]

    def search(self, failed_group: tuple[str, ...]) -> None:
        """Name the faults inside ``failed_group`` (a group whose test failed) until no work is left."""
        work: list[_Split | _Cross | _Confirm] = [_Split(failed_group)]
        while work and self.rounds < self.max_rounds:
            plan: list[tuple[tuple[str, ...], str]] = []
            owners: list[tuple[object, Any]] = []
            busy: set[str] = set()
            for item in work:  # every split and cross item covers nodes no other item holds
                if isinstance(item, _Split):
                    item.halves = [h for h in _halves(item.group) if h]
                    for half in item.halves:
                        if len(half) >= 2:
                            plan.append((half, "split"))
                            owners.append((item, half))
                            busy |= set(half)
                elif isinstance(item, _Cross):
                    for x, y in item.blocks:
                        for group, kind in _cross_groups(x, y):
                            plan.append((self.sort(group), kind))
                            owners.append((item, (x, y, group)))
                            busy |= set(group)
            waiting: list[_Confirm] = []
            for item in work:  # single-node halves and suspects: with a known-good partner not busy this round
                singles = ([_Confirm(h[0], 0) for h in item.halves if len(h) == 1] if isinstance(item, _Split)
                           else [item] if isinstance(item, _Confirm) else [])
                for conf in singles:
                    partner = self.partner(busy | {conf.node}, conf.partners)
                    if partner is None:
                        waiting.append(conf)
                        continue
                    conf.partners.append(partner)
                    busy |= {conf.node, partner}
                    plan.append((self.sort((conf.node, partner)), "confirm"))
                    owners.append((item, conf))
            if not plan:  # only suspects left, no known-good partner free: pair them up to find one, or give up
                probes = self.pair_up([c.node for c in waiting])
                if probes:
                    self.run([(p, "probe") for p in probes])
                    continue
                self.unconfirmed += [c.node for c in waiting if c.node not in self.unconfirmed]
                return
            outcomes = self.run(plan)
            work = self.advance(work, owners, outcomes, waiting)

    def advance(self, work: list[Any], owners: list[tuple[object, Any]], outcomes: list[Outcome],
                waiting: list[_Confirm]) -> list[Any]:
        """The work of the next round from this round's outcomes."""
        nxt: list[Any] = [c for c in waiting if isinstance(c, _Confirm) and c.need]
        results: dict[int, list[tuple[Any, bool]]] = {}
        for (item, key), out in zip(owners, outcomes, strict=True):
            results.setdefault(id(item), []).append((key, out.failed))
        for item in work:
            got = results.get(id(item), [])
            if isinstance(item, _Confirm):
                if not got:
                    continue  # waiting for a partner (kept above)
                if not got[0][1]:
                    continue  # passed with a known-good partner: cleared
                item.need -= 1
                if item.need <= 0:
                    self.nodes.append(item.node)
                else:
                    nxt.append(item)
            elif isinstance(item, _Split):
                nxt += self.advance_split(item, got, waiting)
            else:
                nxt += self.advance_cross(item, got)
        return nxt

    def advance_split(self, item: _Split, got: list[tuple[Any, bool]], waiting: list[_Confirm]) -> list[Any]:
        nxt: list[Any] = []
        pending = [c for c in waiting if c.node in item.group]
        failed_halves = []
        for key, failed in got:
            if isinstance(key, _Confirm):  # a single-node half, tested with a known-good partner
                if failed:
                    nxt.append(_Confirm(key.node, self.confirmations - 1, list(key.partners)))
                    failed_halves.append((key.node,))
            elif failed:
                failed_halves.append(key)
                nxt.append(_Split(key))
        for conf in pending:  # a half still waiting for a partner: keep the split going for it
            nxt.append(_Confirm(conf.node, self.confirmations))
            failed_halves.append((conf.node,))
        for conf in nxt:
            if isinstance(conf, _Confirm) and conf.need <= 0:
                self.nodes.append(conf.node)
        nxt = [c for c in nxt if not (isinstance(c, _Confirm) and c.need <= 0)]
        if failed_halves:
            return nxt
        # both halves passed: the fault is between them (ADR-056's both-halves-pass)
        a, b = item.halves
        if len(a) == 1 and len(b) == 1:
            self.links.append(self.link(a[0], b[0]))  # the pair itself was the failing group
            return []
        return [_Cross([(a, b)])]

    def advance_cross(self, item: _Cross, got: list[tuple[Any, bool]]) -> list[Any]:
        failing = [(x, y, g) for (x, y, g), failed in got if failed]
        if failing:  # one link per block: follow the failing mixed groups, drop the rest (verification catches more)
            blocks = []
            for x, y, group in failing:
                sub_x, sub_y = tuple(n for n in group if n in x), tuple(n for n in group if n in y)
                if len(sub_x) == 1 and len(sub_y) == 1:
                    self.links.append(self.link(sub_x[0], sub_y[0]))
                else:
                    blocks.append((sub_x, sub_y))
            return [_Cross(blocks)] if blocks else []
        blocks = []
        for x, y in item.blocks:  # every tested group passed: the untested combinations are the candidates
            if len(x) == 1 and len(y) == 1:
                continue  # the pair passed: no link here
            (x1, x2), (y1, y2) = _split_side(x), _split_side(y)
            blocks += [(p, q) for p, q in ((x1, y2), (x2, y1)) if p and q]
        return [_Cross(blocks)] if blocks else []


def _split_side(side: tuple[str, ...]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    return (side, ()) if len(side) == 1 else _halves(side)


def _cross_groups(x: tuple[str, ...], y: tuple[str, ...]) -> list[tuple[tuple[str, ...], str]]:
    """The groups that probe block X x Y in one round: the pair itself, or the matched halves X1+Y1 and X2+Y2."""
    if len(x) == 1 and len(y) == 1:
        return [(x + y, "leaf")]
    (x1, x2), (y1, y2) = _split_side(x), _split_side(y)
    return [(p + q, "cross") for p, q in ((x1, y1), (x2, y2)) if p and q]


def localise(nodes: Sequence[str], oracle: Oracle, *, first: Outcome | None = None, confirmations: int = 2,
             verify: bool = True, max_passes: int = 4, max_rounds: int | None = None) -> Localisation:
    """Name the faulty nodes and links of ``nodes`` with group tests run by ``oracle`` (see the module docstring).

    Args:
        nodes: the node names, in the order the halves are cut (keep neighbours, e.g. one rack, together).
        oracle: ``oracle(groups) -> [Outcome per group]``; the groups of one call are disjoint.
        first: the outcome of the test over every node when the caller already ran it (the quick check's job
            over every node); counted as round 1.  None: the first round tests every node.
        confirmations: times a suspect must fail with a (different) known-good partner before it is named (>= 1).
        verify: after a pass that named faults or named nothing, test every node not named once more; a
            failure starts another pass (at most ``max_passes``).
        max_passes: passes of the search (the first included), >= 1.
        max_rounds: stop after this many rounds (default 4 x :func:`round_bound`); the verdict is then ``round limit``.

    Returns:
        :class:`Localisation`.

    Raises:
        ValueError: fewer than 2 nodes, a repeated node, ``confirmations``/``max_passes`` < 1, or an oracle
            that answers a different number of outcomes than groups.
    """
    nodes = list(nodes)
    if len(nodes) < 2:
        raise ValueError(f"nodes={nodes!r}: give 2 or more nodes")
    if len(set(nodes)) != len(nodes):
        raise ValueError(f"nodes: {sorted({n for n in nodes if nodes.count(n) > 1})!r} given more than once")
    if confirmations < 1:
        raise ValueError(f"confirmations={confirmations!r}: must be >= 1")
    if max_passes < 1:
        raise ValueError(f"max_passes={max_passes!r}: must be >= 1")
    limit = max_rounds if max_rounds is not None else 4 * round_bound(len(nodes))
    s = _Search(nodes, oracle, confirmations, limit)
    everyone = tuple(nodes)
    if first is None:
        root = s.run([(everyone, "root")])[0]
    else:
        s.rounds = 1
        s.tests.append(Test(1, everyone, "root", bool(first.failed), first.value, first.detail))
        if not first.failed:
            s.good.update(dict.fromkeys(nodes, len(nodes)))
        root = first
    if not root.failed:
        return Localisation([], [], [], "healthy", s.tests, s.rounds, len(nodes))
    verdict = _passes(s, everyone, verify, max_passes, limit)
    return Localisation(s.nodes, s.links, s.unconfirmed, verdict, s.tests, s.rounds, len(nodes))


def _passes(s: _Search, everyone: tuple[str, ...], verify: bool, max_passes: int, limit: int) -> str:
    """Search, then verify (every node not named, and each new link's pair again, in one round), until it passes.

    A link found in one test is tested again in the verification round: a transient failure of that one test
    would otherwise name a healthy link and leave one of its ends out of the verification.  A link that passes
    the second time is withdrawn, and the next verification takes its ends back in.  Returns the verdict.
    """
    failing: tuple[str, ...] | None = everyone
    confirmed: set[tuple[str, str]] = set()
    passes = 0
    while True:
        if failing is not None:
            if passes == max_passes:
                return "not localised"
            passes += 1
            s.search(failing)
            if s.rounds >= limit:
                return "round limit"
            if not verify:
                return "localised" if s.nodes or s.links else "not localised"
        recheck: list[tuple[str, str]] = []
        for pair in s.links:  # the new links whose pairs do not overlap are tested again (the rest stay named)
            if pair in confirmed:
                continue
            if set(pair) & {n for p in recheck for n in p}:
                confirmed.add(pair)
            else:
                recheck.append(pair)
        left_out = (set(s.nodes) | set(s.unconfirmed) | {b for _, b in confirmed}
                    | {n for p in recheck for n in p})
        rest = tuple(n for n in everyone if n not in left_out)
        plan = ([(rest, "verify")] if len(rest) >= 2 else []) + [(pair, "recheck") for pair in recheck]
        if not plan:
            return "localised" if s.nodes or s.links else "not localised"
        outcomes = s.run(plan)
        verified = outcomes[0] if len(rest) >= 2 else None
        withdrawn = False
        for pair, out in zip(recheck, outcomes[len(plan) - len(recheck):], strict=True):
            if out.failed:
                confirmed.add(pair)
            else:
                s.links.remove(pair)
                withdrawn = True
        if verified is not None and verified.failed:
            failing = rest
        elif withdrawn:
            failing = None  # verify once more with the withdrawn links' ends back in
        else:
            return "localised" if s.nodes or s.links else "transient"


# --------------------------------------------------------------------------- a simulated cluster


@dataclasses.dataclass
class SimulatedCluster:
    """A noisy oracle over injected faults, for the unit tests and ``benchmarks/bench_localisation.py``.

    A group's value is ``nominal x lognormal(0, sigma)``, times ``slow_factor`` when it holds a slow node or both
    ends of a slow link; it fails below ``floor`` (:data:`helpers.allocation.grades.PAIR_SLOW_FRACTION` of
    nominal, the real check's rule for a slow pair).  A group holding a ``collective`` node fails (error); one
    holding an ``mtu`` node and another node times out.  Any test also fails on its own with probability
    ``transient`` (a flaky run: the reason the confirmation exists).

    The defaults: sigma 0.25 (healthy pairs on the loaded 2-core lab varied 2.7x, about 4 sigma: grades.py),
    ``slow_factor`` 0.1 (the lab's 50 Mb/s port against ~0.5-1 Gb/s), ``transient`` 1 %.

    Attributes:
        faults: ``{kind: [node, ...]}`` for the node kinds, ``{"slow_link": [(a, b), ...]}`` for links.
        rng: the random generator (seed it for a reproducible run).
    """

    faults: Mapping[str, Sequence[Any]]
    rng: random.Random
    sigma: float = 0.25
    slow_factor: float = 0.1
    transient: float = 0.01
    floor: float = PAIR_SLOW_FRACTION
    calls: int = 0

    def __post_init__(self) -> None:
        unknown = sorted(set(self.faults) - set(KINDS))
        if unknown:
            raise ValueError(f"faults: unknown kind(s) {', '.join(unknown)}; accepted: {', '.join(KINDS)}")
        self._slow = set(self.faults.get("slow_node", ()))
        self._coll = set(self.faults.get("collective", ()))
        self._mtu = set(self.faults.get("mtu", ()))
        self._links = [tuple(p) for p in self.faults.get("slow_link", ())]

    def __call__(self, groups: Sequence[tuple[str, ...]]) -> list[Outcome]:
        """One round: an :class:`Outcome` per group (see the class docstring)."""
        self.calls += 1
        return [self._one(frozenset(g)) for g in groups]

    def _one(self, group: frozenset[str]) -> Outcome:
        if group & self._coll:
            return Outcome(True, None, "a rank failed the collective")
        if group & self._mtu and len(group) > 1:
            return Outcome(True, None, "timeout on large messages")
        if self.rng.random() < self.transient:
            return Outcome(True, None, "transient failure")
        value = math.exp(self.rng.gauss(0.0, self.sigma))
        if group & self._slow:
            value *= self.slow_factor
        if any(a in group and b in group for a, b in self._links):
            value *= self.slow_factor
        return Outcome(value < self.floor, round(value, 4), f"{value:.3f} of nominal")


def random_faults(nodes: Sequence[str], counts: Mapping[str, int], rng: random.Random) -> dict[str, list[Any]]:
    """Place ``counts`` (``{kind: how many}``) faults on distinct nodes drawn with ``rng``; a link takes two nodes
    that hold no other fault (so its ends are healthy nodes).

    Raises:
        ValueError: an unknown kind, a negative count, or more faulty nodes than ``nodes`` has.
    """
    unknown = sorted(set(counts) - set(KINDS))
    if unknown:
        raise ValueError(f"counts: unknown kind(s) {', '.join(unknown)}; accepted: {', '.join(KINDS)}")
    if any(c < 0 for c in counts.values()):
        raise ValueError(f"counts={dict(counts)!r}: counts must be >= 0")
    need = sum(2 * c if k == "slow_link" else c for k, c in counts.items())
    if need > len(nodes):
        raise ValueError(f"counts={dict(counts)!r}: {need} faulty nodes needed, only {len(nodes)} nodes")
    pool = rng.sample(list(nodes), need)
    faults: dict[str, list[Any]] = {}
    for kind in KINDS:
        c = counts.get(kind, 0)
        if kind == "slow_link":
            faults[kind] = [tuple(sorted((pool.pop(), pool.pop()), key=list(nodes).index)) for _ in range(c)]
        else:
            faults[kind] = [pool.pop() for _ in range(c)]
    return faults


def score(result: Localisation, faults: Mapping[str, Sequence[Any]]) -> dict[str, int]:
    """``{"named", "missed", "false_drains"}`` of ``result`` against the injected ``faults``.

    A node fault is named when the node is in ``result.nodes``; a link when the pair is in ``result.links``.
    A false drain is a node in ``result.nodes`` that holds no node fault (a link's ends included).
    """
    bad_nodes = {n for k, v in faults.items() if k != "slow_link" for n in v}
    links = {tuple(sorted(p)) for p in faults.get("slow_link", ())}
    named_links = {tuple(sorted(p)) for p in result.links}
    named = len(bad_nodes & set(result.nodes)) + len(links & named_links)
    total = len(bad_nodes) + len(links)
    return {"named": named, "missed": total - named, "false_drains": len(set(result.nodes) - bad_nodes)}
