"""Chapter 06 (multi-node network, seeds MN1-MN4 + Gilbreth §4/§6.3/§8.12) runs end to end on the network lab.

Every reproduction asserts on its own run inside the notebook; here: the notebook executes without
an error and leaves no process and no lab namespace behind; the size parser, the rank-log reader and
the fabric-manager grading are tested on canned input (the scripts' ``--help`` and bad-input
handling: ``tests/scenarios/``).
"""

from __future__ import annotations

import time

import pytest
from support import assert_outputs_reproduce, execute_notebook, notebook_outputs

from helpers import netlab, tiers

LAB_NAME = "ch06"  # the notebook's LAB_NAME parameter
pytestmark = pytest.mark.lab  # the lab: make test runs these in the lab's pytest process (tests/conftest.py)


def test_chapter_06_without_the_lab_skips_every_lab_cell_loudly(no_leftovers):
    out = execute_notebook("06_multinode_network.ipynb", {"USE_LAB": False, "LAB_NAME": "ch06skip"})
    errors, text = notebook_outputs(out)
    assert not errors, errors
    assert text.count("[SKIP lab] USE_LAB = False (parameter)") >= 15  # one per lab cell, never silent
    assert "single-node-net-transport" in text and "no-interface" in text  # the NCCL-log cells still run


def test_chapter_06_multinode_network(no_leftovers):
    lab_ok, why = netlab.lab_available()
    t0 = time.monotonic()
    try:
        out = execute_notebook("06_multinode_network.ipynb", {"LAB_NAME": LAB_NAME})
    finally:
        left = netlab.Lab(1, name=LAB_NAME).leftovers() if lab_ok else []  # namespaces, mounts, state, holder
        if lab_ok:
            netlab.down(LAB_NAME)  # never let one failure leave a lab for the next test
    print(f"chapter 06: {time.monotonic() - t0:.0f} s")
    assert not left, f"lab {LAB_NAME} left behind: {left}"
    errors, text = notebook_outputs(out)
    assert not errors, errors
    assert_outputs_reproduce(out)
    if not lab_ok:
        assert f"[SKIP lab] {why}" in text
    else:
        for seen in ("RendezvousTimeoutError", "1/2 clients joined", "Connection refused, remote=[172.17.0.1]",
                     "Connect timeout", "Unable to find address for: ibp65s0", "Unable to find address for: ^docker0",
                     "Connection closed by peer [10.77.0.11]", "Timed out waiting 5000ms for recv",
                     "no rank of this job diverged", "MTU black hole", "(ibp161s0) -> 10.77.0.10"):
            assert seen in text, seen
    assert "single-node-net-transport" in text and "init-incomplete" in text
    if tiers.gpu_count() < 2:
        assert "[SKIP tier-multigpu]" in text
    if tiers.gpu_count() < 1:
        assert "[SKIP tier-gpu]" in text
