"""The SLURM lab: real slurmctld (head node) + one slurmd per network-namespace node, munge; real sbatch/srun/torchrun.

Skipped with the reason printed when the network lab cannot be built here or slurm-wlm/munge are not
installed (``make setup`` installs them as root; ``apt-get install -y slurm-wlm munge``).
"""

from __future__ import annotations

import os
import re
import sys
import time
from pathlib import Path

import psutil
import pytest
from support import SCENARIOS

from helpers import hostinfo, jobs, netlab, slurm
from helpers.netlab import slurmlab

LAB_OK, LAB_WHY = netlab.lab_available()
SLURM_OK, SLURM_WHY = slurmlab.slurm_available()
pytestmark = [pytest.mark.skipif(not LAB_OK, reason=f"network lab unavailable: {LAB_WHY}"),
              pytest.mark.skipif(not SLURM_OK, reason=f"SLURM lab unavailable: {SLURM_WHY}")]
if not (LAB_OK and SLURM_OK):  # never silently: say why in the run's output too
    print(f"tests/lab/test_slurm_lab.py skipped: {LAB_WHY if not LAB_OK else SLURM_WHY}", file=sys.stderr)


def daemons_of(name: str) -> list[int]:
    """Pids of munged/slurmctld/slurmd/slurmstepd processes that belong to lab ``name`` (by their config paths)."""
    marker = str(slurmlab.slurm_dir(name))
    found = []
    for proc in psutil.process_iter(["cmdline", "name"]):
        try:
            if any(marker in arg for arg in proc.info["cmdline"] or []) or (
                    proc.info["name"] in ("slurmstepd", "slurmd", "slurmctld", "munged")
                    and marker in " ".join(proc.environ().values())):
                found.append(proc.pid)
        except psutil.Error:
            continue
    return found


@pytest.fixture(scope="module")
def cluster():
    """A 2-node SLURM lab for the module; afterwards nothing of it may remain."""
    name = f"sl{os.getpid() % 100000}"
    lab = netlab.Lab(2, name=name, slurm=True)
    t0 = time.monotonic()
    lab.up()
    lab.up_s = time.monotonic() - t0
    try:
        yield lab
    finally:
        lab.down()
        assert not lab.leftovers() and not daemons_of(name)


def wait_job(lab: netlab.Lab, job_id: str, timeout_s: float = 120) -> str:
    """Poll ``scontrol show job`` until the job has ended; return its state (COMPLETED, FAILED...)."""
    deadline = time.monotonic() + timeout_s
    state = "?"
    while time.monotonic() < deadline:
        out = lab.slurm(["scontrol", "show", "job", "-o", job_id], timeout_s=10).stdout
        m = re.search(r"JobState=(\S+)", out)
        state = m.group(1) if m else state
        if state not in ("PENDING", "RUNNING", "CONFIGURING", "COMPLETING", "?"):
            return state
        time.sleep(0.3)
    lab.slurm(["scancel", job_id], timeout_s=10)
    return f"timeout ({state})"


def test_up_down_fast_and_nothing_left(no_leftovers):
    name = f"su{os.getpid() % 100000}"
    lab = netlab.Lab(2, name=name, slurm=True)
    t0 = time.monotonic()
    lab.up()
    up_s = time.monotonic() - t0
    try:
        st = lab.status()
        assert st["up"] and st["slurm"]["nodes"] == {"node0": "idle", "node1": "idle"}, st["slurm"]
        assert "SLURM (head node" in netlab.format_status(st) and "node1 idle" in netlab.format_status(st)
        assert netlab.Lab.attach(name).has_slurm and lab.up() is lab  # idempotent: the same cluster stays
        assert daemons_of(name) and (slurmlab.slurm_dir(name) / "munge.socket").exists()
    finally:
        t0 = time.monotonic()
        res = lab.down()
        down_s = time.monotonic() - t0
    print(f"SLURM lab up {up_s:.2f} s, down {down_s:.2f} s ({len(res['killed'])} processes)")
    assert up_s <= 10 and down_s <= 10
    assert f"{name}-head" in res["namespaces"]
    assert not lab.leftovers() and not daemons_of(name)  # namespaces, mounts, state, SLURM folder, daemons
    assert not slurmlab.slurm_dir(name).exists() and not any(name in n for n in netlab._host.netns_list())


def test_srun_gives_each_node_its_identity_and_a_local_tmp(cluster):
    probe = ('echo "$(hostname) $SLURM_NODEID $SLURM_PROCID $SLURM_JOB_NUM_NODES $SLURM_JOB_NODELIST '
             '$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"; '
             'echo "$(hostname)" > /tmp/mark; ls /tmp')
    r = cluster.slurm(["srun", "-N2", "--ntasks-per-node=1", "bash", "-c", probe], timeout_s=60)
    assert r.returncode == 0, r.stderr
    rows = sorted(line.split() for line in r.stdout.splitlines() if line.startswith("node"))
    assert rows == [["node0", "0", "0", "2", "node[0-1]", "node0"], ["node1", "1", "1", "2", "node[0-1]", "node0"]]
    assert cluster.run(0, ["cat", "/tmp/mark"]).stdout.strip() == "node0"  # each node's /tmp is its own
    assert cluster.run(1, ["cat", "/tmp/mark"]).stdout.strip() == "node1"
    assert cluster.run("head", ["test", "-e", "/tmp/mark"]).returncode == 1  # nor on the head node
    # the step's end leaves the nodes COMPLETING while slurmd cleans up (srun(1) returns first): idle within seconds
    deadline, nodes = time.monotonic() + 20, []
    while time.monotonic() < deadline:
        nodes = cluster.slurm(["sinfo", "-h", "-o", "%D %T"]).stdout.split()
        if nodes != ["2", "completing"]:
            break
        time.sleep(0.3)
    assert nodes == ["2", "idle"]


def test_an_outer_slurm_job_does_not_leak_into_the_lab(cluster, monkeypatch):
    """Chapter 08 run by configs/slurm/course.sbatch builds its lab inside a real job: that job's SLURM_* must not
    reach the lab's clients (an inherited SLURM_JOB_ID made srun ask the wrong controller about the wrong job)."""
    for var, value in (("SLURM_JOB_ID", "424242"), ("SLURM_JOBID", "424242"), ("SLURM_NODELIST", "gpu-a[01-02]"),
                       ("SLURM_JOB_NODELIST", "gpu-a[01-02]"), ("SLURM_STEP_ID", "0")):
        monkeypatch.setenv(var, value)
    r = cluster.slurm(["srun", "-N2", "--ntasks-per-node=1", "bash", "-c", 'echo "$(hostname) $SLURM_JOB_NODELIST"'],
                      timeout_s=60)
    assert r.returncode == 0, r.stderr
    assert sorted(r.stdout.split("\n")[:2]) == ["node0 node[0-1]", "node1 node[0-1]"]


@pytest.mark.parametrize("rdzv", slurm.SLURM_RDZV_FORMS)
def test_rendered_sbatch_with_srun_torchrun_completes(cluster, rdzv):
    work = jobs.new_job_dir(f"slurmlab-{rdzv}")  # the shared filesystem (never /tmp: node-local here)
    # below the ephemeral range: srun, on node0 with the batch step, listens on ephemeral ports (a CI run lost the
    # rendezvous port to it: torchrun's agent then connected to srun's socket, "Failed to recv, got 0 bytes")
    port = hostinfo.free_port(outside_ephemeral=True)
    script = slurm.sbatch_script("lab", 2, 2, str(jobs.SHIM), [SCENARIOS / "launch_contract.py", "--timeout-s", 30],
                                 gpus_per_node=0, cpus_per_task=1, partition=slurmlab.PARTITION, account="lab",
                                 time="00:05:00", rdzv=rdzv, master_port=port, log_dir=str(work),
                                 env={"GLOO_SOCKET_IFNAME": "eth0", "RUNBOOK_BACKEND": "gloo"})
    (work / "job.sbatch").write_text(script)
    env = {"PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ["PATH"]]), "RUNBOOK_JOB_DIR": str(work)}
    sub = cluster.slurm(["sbatch", "--parsable", str(work / "job.sbatch")], env=env, cwd=work)
    assert sub.returncode == 0, sub.stderr
    job_id = sub.stdout.strip().split(";")[0]
    state = wait_job(cluster, job_id)
    out = (work / f"lab_{job_id}.out").read_text()
    err = (work / f"lab_{job_id}.err").read_text()
    assert state == "COMPLETED", f"{state}\n{out[-2000:]}\n{err[:3000]}\n...\n{err[-3000:]}"  # both nodes' first lines
    assert f"job {job_id} on 2 node(s): node[0-1]" in out
    seen = jobs.parse_records(out, "contract")
    assert sorted(int(r["RANK"]) for r in seen) == [0, 1, 2, 3], out[-3000:]
    assert {r["WORLD_SIZE"] for r in seen} == {"4"} and len({r["MASTER_PORT"] for r in seen}) == 1
    assert {r["MASTER_ADDR"] for r in seen} == {"node0"}  # scontrol show hostnames | head -n 1, exported
    if rdzv == "static":  # c10d hands the ranks a store port of its own choosing, not the rendezvous port
        assert {r["MASTER_PORT"] for r in seen} == {str(port)}
    assert sorted(r["GROUP_RANK"] for r in seen) == ["0", "0", "1", "1"]
    by_host = {(r["hostname"], r["GROUP_RANK"]) for r in seen}
    assert {h for h, _ in by_host} == {"node0", "node1"} and len(by_host) == 2  # one node rank per host
    if rdzv == "static":  # static form: the node rank is SLURM_NODEID
        assert by_host == {("node0", "0"), ("node1", "1")}
    groups = jobs.parse_records(out, "group")
    assert len(groups) == 4 and {g["world_size"] for g in groups} == {4}
