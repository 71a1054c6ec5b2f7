"""helpers.allocation.localise: adaptive group testing over a simulated, noisy oracle (issue 23).

Every fault kind alone and in pairs, the round bound ceil(log2 N) + 3, no healthy node drained under noise,
nothing drained when no group ever passes, a transient first failure, a link withdrawn when its pair passes again.
"""

from __future__ import annotations

import random

import pytest

from helpers.allocation.localise import KINDS, Outcome, SimulatedCluster, localise, random_faults, round_bound, score


def names(n: int) -> list[str]:
    return [f"node{i}" for i in range(n)]


def quiet(faults: dict, seed: int = 0) -> SimulatedCluster:
    """The simulator with its noise on values but no transient failure: the answer is then exact."""
    return SimulatedCluster(faults, random.Random(seed), transient=0.0)


def test_healthy_allocation_costs_one_test():
    result = localise(names(64), quiet({}))
    assert (result.verdict, result.rounds, result.test_count, result.nodes, result.links) == ("healthy", 1, 1, [], [])
    assert result.pairs == 64 * 63 // 2


@pytest.mark.parametrize("n", [2, 3, 8, 13, 64])
@pytest.mark.parametrize("kind", ["slow_node", "collective", "mtu"])
def test_every_single_faulty_node_is_named_within_the_bound(n, kind):
    nodes = names(n)
    for bad in nodes if n <= 13 else nodes[::7]:
        result = localise(nodes, quiet({kind: [bad]}))
        if n == 2:  # two nodes: no known-good partner exists, so nothing can be confirmed (or drained)
            assert result.nodes == [] and result.verdict == "not localised", result
            continue
        assert result.nodes == [bad] and result.links == [], (bad, result.tests)
        assert result.verdict == "localised"
        assert n < 8 or result.rounds <= round_bound(n), (bad, result.rounds)  # 3 nodes: only pairs can tell


@pytest.mark.parametrize("n", [4, 8, 16, 40])
def test_every_slow_link_is_named_within_the_bound_and_drains_nothing(n):
    nodes = names(n)
    pairs = [(a, b) for i, a in enumerate(nodes) for b in nodes[i + 1:]]
    for a, b in pairs if n <= 8 else random.Random(n).sample(pairs, 25):
        result = localise(nodes, quiet({"slow_link": [(a, b)]}))
        assert result.links == [(a, b)] and result.nodes == [], ((a, b), result.tests)
        assert result.rounds <= round_bound(n), ((a, b), result.rounds)


def test_two_faults_of_different_kinds_on_8_nodes_within_the_bound():
    nodes = names(8)
    for slow in nodes:
        for broken in nodes:
            if slow == broken:
                continue
            result = localise(nodes, quiet({"slow_node": [slow], "collective": [broken]}))
            assert sorted(result.nodes) == sorted([slow, broken]) and result.links == [], result.tests
            assert result.rounds <= round_bound(8)


def test_tests_grow_like_log_n_not_like_the_pairs():
    rng = random.Random(3)
    nodes = names(1024)
    counts = [localise(nodes, SimulatedCluster(random_faults(nodes, {"slow_node": 1}, rng), rng)).test_count
              for _ in range(20)]
    assert max(counts) < 80 < 1024 * 1023 // 2  # 2 log2(N) splits + confirmations + verification, not 523,776 pairs


@pytest.mark.parametrize("kind", KINDS)
def test_noisy_oracle_names_the_fault_and_drains_no_healthy_node(kind):
    """1 % of the tests fail for no reason: the two confirmations keep healthy nodes out of the drain list."""
    rng = random.Random(kind)
    nodes = names(32)
    total = {"named": 0, "missed": 0, "false_drains": 0}
    for _ in range(40):
        faults = random_faults(nodes, {kind: 1}, rng)
        got = score(localise(nodes, SimulatedCluster(faults, rng, transient=0.01)), faults)
        total = {k: total[k] + got[k] for k in total}
    assert total["false_drains"] == 0 and total["named"] >= 39, total


def test_nothing_is_drained_when_every_group_fails():
    """A fabric-wide fault: every group fails, no node is known good, so no suspect can be confirmed."""
    nodes = names(16)
    result = localise(nodes, lambda groups: [Outcome(True, None, "timeout") for _ in groups])
    assert result.nodes == [] and result.links == [] and result.verdict == "not localised"
    assert sorted(result.unconfirmed) == sorted(nodes)


def test_a_first_failure_that_does_not_repeat_is_transient():
    calls = []

    def flaky(groups):
        calls.append(groups)
        return [Outcome(len(calls) == 1, None, "transient") for _ in groups]

    result = localise(names(8), flaky)
    assert result.verdict == "transient" and result.nodes == [] and result.links == []


def test_first_outcome_from_the_caller_is_round_one():
    sim = quiet({"slow_node": ["node5"]})
    result = localise(names(8), sim, first=Outcome(True, 0.01, "the job over every node was slow"))
    assert result.tests[0].purpose == "root" and result.tests[0].detail == "the job over every node was slow"
    assert result.nodes == ["node5"] and sim.calls == result.rounds - 1
    healthy = localise(names(8), quiet({}), first=Outcome(False, 1.0))
    assert healthy.verdict == "healthy" and healthy.rounds == 1


def test_a_link_whose_pair_passes_again_is_withdrawn():
    """The pair test that named a link failed once by chance: the recheck passes and the link is not reported."""
    state = {"first_leaf": True}

    def oracle(groups):
        out = []
        for g in groups:
            if len(g) == 8:
                out.append(Outcome(not state.get("root_done"), 0.1))
                state["root_done"] = True
            elif set(g) == {"node0", "node6"} and state["first_leaf"]:
                state["first_leaf"] = False
                out.append(Outcome(True, None, "transient"))
            else:
                out.append(Outcome(False, 1.0))
        return out

    result = localise(names(8), oracle)
    assert result.links == [] and "recheck" in [t.purpose for t in result.tests], result.tests
    assert result.verdict == "transient"


def test_bad_input_names_the_field():
    with pytest.raises(ValueError, match="2 or more"):
        localise(["a"], quiet({}))
    with pytest.raises(ValueError, match="more than once"):
        localise(["a", "b", "a"], quiet({}))
    with pytest.raises(ValueError, match="confirmations"):
        localise(names(4), quiet({}), confirmations=0)
    with pytest.raises(ValueError, match="one per group"):
        localise(names(4), lambda groups: [])
    with pytest.raises(ValueError, match="unknown kind"):
        SimulatedCluster({"fast_node": []}, random.Random(0))
    with pytest.raises(ValueError, match="faulty nodes needed"):
        random_faults(names(4), {"slow_link": 3}, random.Random(0))


def test_random_faults_are_on_distinct_nodes_and_links_have_healthy_ends():
    nodes = names(20)
    faults = random_faults(nodes, {"slow_node": 3, "slow_link": 3, "collective": 2, "mtu": 2}, random.Random(1))
    used = [n for k in ("slow_node", "collective", "mtu") for n in faults[k]] + [n for p in faults["slow_link"] for n in p]
    assert len(used) == len(set(used)) == 3 + 6 + 2 + 2


def test_round_bound():
    assert [round_bound(n) for n in (2, 8, 9, 1024)] == [4, 6, 7, 13]
