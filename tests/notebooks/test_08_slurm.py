"""Chapter 08 (SLURM: Gilbreth 3, 4.3, 8.4-8.13) submits real jobs to the SLURM lab end to end.

Every reproduction asserts on its own job inside the notebook (state, exit code, files, ranks' output);
here: the notebook executes without an error, the key texts of the real runs are in its output, and
neither the lab (namespaces, daemons, ``build/slurm-lab/ch``) nor a process is left behind.
"""

from __future__ import annotations

import time

import pytest
from support import assert_outputs_reproduce, execute_notebook, notebook_outputs

from helpers import netlab
from helpers.netlab import slurmlab

LAB_NAME = "ch"  # the notebook's LAB_NAME parameter
pytestmark = pytest.mark.lab  # the lab: make test runs these in the lab's pytest process (tests/conftest.py)


def test_chapter_08_slurm(no_leftovers):
    lab_ok, why = netlab.lab_available()
    slurm_ok, slurm_why = slurmlab.slurm_available()
    t0 = time.monotonic()
    try:
        out = execute_notebook("08_slurm.ipynb", {"LAB_NAME": LAB_NAME})
    finally:
        left = netlab.Lab(1, name=LAB_NAME, slurm=True).leftovers() if lab_ok else []
        if lab_ok:
            netlab.down(LAB_NAME)  # never let one failure leave a lab for the next test
    print(f"chapter 08: {time.monotonic() - t0:.0f} s")
    assert not left, f"lab {LAB_NAME} left behind: {left}"
    errors, text = notebook_outputs(out)
    assert not errors, errors
    assert_outputs_reproduce(out)
    if not (lab_ok and slurm_ok):
        assert f"[SKIP lab] {why if not lab_ok else slurm_why}" in text
        return
    for seen in ("COMPLETED exit 0:0", "can't open file '/tmp/ch08/launch_contract.py'", "JobLaunchFailure",
                 "Could not open stdout file /tmp/ch08/output_in_tmp_", "Unable to find address for: ibp65s0",
                 "was not reachable via ssh", "execve(): bash: No such file or directory",
                 "{'node0': 'INFO', 'node1': 'INFO'}", "The hostname of the rendezvous endpoint ':",
                 "torchelastic/role_info", "EADDRINUSE", "RendezvousTimeoutError", "multinode-ib-disabled",
                 "PD 0:00 Resources", "PD 0:00 Dependency", "TIMEOUT", "DUE TO TIME LIMIT", "rank(s) [1] diverged",
                 "entered gloo:broadcast", "decided by:", "lab ch down"):
        assert seen in text, seen
