"""Tests of helpers.netlab: a real lab of network namespaces (root), real faults, a real 2-node torchrun job."""

from __future__ import annotations

import itertools
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support import SCENARIOS, lab_leftovers, lab_status, needs_lab

from helpers import jobs, netlab

AVAILABLE, WHY = lab_status()
_ids = itertools.count()


@pytest.fixture
def lab_name():
    """A lab name unique to this test; afterwards, assert nothing of that lab is left (and clean up if so)."""
    name = f"t{os.getpid()}x{next(_ids)}"[:12]
    yield name
    left = lab_leftovers(name)
    netlab.Lab(1, name=name).down()
    assert not left, f"lab {name} left behind: {left}"


@pytest.fixture
def lab(lab_name):
    """A 2-node lab, up for the test, down afterwards."""
    if not AVAILABLE:
        pytest.skip(f"network lab unavailable: {WHY}")
    with netlab.Lab(2, name=lab_name) as the_lab:
        yield the_lab


def sh(lab: netlab.Lab, node: int, script: str, timeout_s: float = 10) -> subprocess.CompletedProcess[str]:
    return lab.run(node, ["sh", "-c", script], timeout_s=timeout_s)


# ---------------------------------------------------------------- validation (no root needed)


@pytest.mark.skipif(AVAILABLE, reason="the lab can be built here")
def test_up_raises_clearly_when_unavailable(lab_name):
    with pytest.raises(RuntimeError, match="cannot build the network lab"):
        netlab.Lab(2, name=lab_name).up()


# ---------------------------------------------------------------- lifecycle


@needs_lab
def test_up_is_fast_idempotent_and_down_leaves_nothing(lab_name):
    lab = netlab.Lab(4, name=lab_name)
    t0 = time.monotonic()
    lab.up()
    up_s = time.monotonic() - t0
    assert up_s <= 10, f"up took {up_s:.2f} s"
    inodes = [os.stat(lab._host_path(netlab.NETNS_DIR / lab.ns(i))).st_ino for i in range(4)]
    lab.set_mtu(2, 1400)  # an injected fault survives a second up(): same lab
    t0 = time.monotonic()
    again = netlab.Lab(4, name=lab_name).up()
    assert time.monotonic() - t0 < up_s + 1
    assert [os.stat(again._host_path(netlab.NETNS_DIR / again.ns(i))).st_ino for i in range(4)] == inodes
    st = netlab.status(lab_name)  # recovered from the system, not from the object
    assert st["up"] and [n["hostname"] for n in st["nodes"]] == ["node0", "node1", "node2", "node3"]
    assert st["nodes"][2]["mtu"] == 1400 and st["nodes"][0]["address"] == "10.77.0.10/24"
    assert netlab.Lab.attach(lab_name).nodes == 4
    t0 = time.monotonic()
    res = lab.down()
    assert time.monotonic() - t0 <= 5
    assert sorted(res["namespaces"]) == sorted([f"{lab_name}-sw"] + [lab.ns(i) for i in range(4)])
    assert not lab_leftovers(lab_name)
    assert not netlab.status(lab_name)["nodes"] and not netlab.status(lab_name)["up"]


@needs_lab
@pytest.mark.skipif(os.geteuid() != 0, reason="builds the half lab with `ip netns add` as root")
def test_half_built_lab_is_cleaned_then_rebuilt(lab_name):
    # What a crash halfway through up() leaves: some namespaces, a stray node, a state folder.
    subprocess.run(["ip", "netns", "add", f"{lab_name}-sw"], check=True)
    subprocess.run(["ip", "netns", "add", f"{lab_name}-node3"], check=True)
    (netlab.LAB_ROOT / lab_name).mkdir(parents=True)
    lab = netlab.Lab(2, name=lab_name).up()
    try:
        assert lab.is_up()
        assert f"{lab_name}-node3" not in lab._netns()
        assert sh(lab, 1, "ping -c 1 -W 1 node0 >/dev/null && echo reached").stdout.strip() == "reached"
    finally:
        lab.down()


@needs_lab
def test_nodes_have_their_own_hostname_hosts_and_addresses(lab):
    host_before = socket.gethostname()
    for i in range(2):
        r = sh(lab, i, "uname -n; getent ahostsv4 node0 | head -1; getent ahostsv4 node1 | head -1; "
                       "ip -j addr show; pwd")
        lines = r.stdout.splitlines()
        assert r.returncode == 0, r.stderr
        assert lines[0] == f"node{i}"
        assert lines[1].split()[0] == "10.77.0.10" and lines[2].split()[0] == "10.77.0.11"
        addrs = [a["local"] for link in json.loads(lines[3]) for a in link.get("addr_info", [])]
        assert sorted(addrs) == sorted(["127.0.0.1", lab.address(i)])  # no IPv6, nothing else
        assert lines[4] == os.getcwd()  # the caller's directory, entered by path inside the node
    assert socket.gethostname() == host_before  # the real host was never renamed
    assert sh(lab, 0, "ping -c 1 -W 1 node1").returncode == 0
    if netlab.shutil.which("ethtool"):
        r = sh(lab, 0, "ethtool -k eth0")
        assert "tcp-segmentation-offload: off" in r.stdout and "generic-segmentation-offload: off" in r.stdout


@needs_lab
def test_relative_and_absolute_paths_are_one_mount_inside_a_node(lab, tmp_path):
    # Regression: an inherited working directory (nsenter --wd=.) stayed on the host's mount, and
    # os.replace(absolute, relative) failed with EXDEV "Invalid cross-device link".
    code = ("import os, sys; d = sys.argv[1]; open(os.path.join(d, 'a'), 'w').close(); "
            "os.replace(os.path.join(d, 'a'), os.path.relpath(os.path.join(d, 'b'))); print('replaced')")
    r = lab.run(0, [sys.executable, "-c", code, str(tmp_path)], cwd=jobs.project_root())
    assert r.stdout.strip() == "replaced", r.stderr
    assert (tmp_path / "b").exists()


@needs_lab
@pytest.mark.skipif(netlab.shutil.which("ethtool") is None, reason="ethtool is needed to read the offloads back")
def test_offloads_off_without_ethtool(lab_name, monkeypatch):
    """Without ethtool, the lab turns TSO/GSO off with the same ioctls from Python."""
    real_which = netlab.shutil.which
    monkeypatch.setattr(netlab.shutil, "which", lambda name, *a, **k: None if name == "ethtool" else real_which(name, *a, **k))
    with netlab.Lab(2, name=lab_name) as lab:
        monkeypatch.undo()
        r = sh(lab, 1, "ethtool -k eth0")
        # the legacy ioctls clear IPv4/IPv6 TSO and GSO (AccECN TSO, new in 6.x, is not covered: irrelevant here)
        assert "\ttx-tcp-segmentation: off" in r.stdout and "\ttx-tcp6-segmentation: off" in r.stdout
        assert "generic-segmentation-offload: off" in r.stdout


@needs_lab
def test_private_tmp_is_per_node(lab_name):
    with netlab.Lab(2, name=lab_name, private_tmp=True) as lab:
        assert sh(lab, 0, "echo from-node0 > /tmp/train.py && cat /tmp/train.py").stdout.strip() == "from-node0"
        missing = sh(lab, 1, "cat /tmp/train.py")
        assert missing.returncode != 0 and "No such file" in missing.stderr
        assert not Path("/tmp/train.py").exists()
        assert sh(lab, 0, "cat /tmp/train.py").stdout.strip() == "from-node0"  # persists on its node
        assert sh(lab, 1, f"test -f {jobs.project_root() / 'helpers' / 'netlab' / '__init__.py'} && echo seen").stdout.strip() == "seen"


@needs_lab
def test_down_kills_every_process_of_the_lab(lab):
    procs = [subprocess.Popen(lab.node_argv(i, ["sleep", "300"])) for i in range(2)]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not all(lab.node_pids(i) for i in range(2)):
        time.sleep(0.05)
    assert lab.node_pids(1) == [procs[1].pid]
    t0 = time.monotonic()
    res = lab.down()
    assert time.monotonic() - t0 <= 5
    assert sorted(res["killed"]) == sorted(p.pid for p in procs)
    assert [p.wait(timeout=5) for p in procs] == [-15, -15]


# ---------------------------------------------------------------- faults


@needs_lab
def test_mtu_black_hole_needs_both_ends_at_9000(lab):
    big = "ping -M do -s 8972 -c 1 -W 1 node0"
    small = "ping -M do -s 1472 -c 1 -W 1 node0"
    lab.set_mtu(1, 9000)  # one endpoint only: the ping itself is lost too, but TCP's MSS would hide it
    assert sh(lab, 1, big).returncode != 0
    lab.set_mtu("all", 9000)  # both endpoints 9000, bridge side still 1500: the black hole
    assert sh(lab, 1, big).returncode != 0 and sh(lab, 1, small).returncode == 0
    lab.set_mtu("all", 9000, side="bridge")  # jumbo end to end: fixed
    assert sh(lab, 1, big).returncode == 0
    st = lab.status()
    assert st["switch"]["bridge_mtu"] == 9000 and st["nodes"][1]["bridge_port"]["mtu"] == 9000


@needs_lab
def test_cut_and_restore_link(lab):
    lab.cut_link(1)
    r = sh(lab, 1, "ping -c 1 -W 1 node0; ip -br link show eth0")
    assert r.returncode == 0 and "NO-CARRIER" in r.stdout and " 0 received" in r.stdout
    lab.restore_link(1)
    deadline = time.monotonic() + 3
    while sh(lab, 1, "ping -c 1 -W 1 node0").returncode != 0:
        assert time.monotonic() < deadline, "link did not come back"


@needs_lab
def test_rename_decoy_sysctl_hosts_entry(lab):
    lab.rename_data_iface(0, "ibp65s0")
    lab.rename_data_iface(1, "ibp161s0")
    assert lab.data_iface(0) == "ibp65s0" and lab.status()["nodes"][0]["address"] == "10.77.0.10/24"
    assert sh(lab, 1, "ping -c 1 -W 1 node0").returncode == 0  # address and route kept
    lab.add_decoy("all")
    for i in range(2):
        assert "172.17.0.1/16" in sh(lab, i, "ip -br addr show docker0").stdout
    host_value = Path("/proc/sys/net/ipv4/tcp_mtu_probing").read_text().strip()
    assert lab.set_sysctl(1, "net.ipv4.tcp_mtu_probing", 1) == "0"
    assert lab.get_sysctl(1, "net.ipv4.tcp_mtu_probing") == "1" and lab.get_sysctl(0, "net.ipv4.tcp_mtu_probing") == "0"
    assert Path("/proc/sys/net/ipv4/tcp_mtu_probing").read_text().strip() == host_value
    lab.set_host_entry(1, "node0", "10.77.0.99")
    assert sh(lab, 1, "getent ahostsv4 node0").stdout.split()[0] == "10.77.0.99"
    assert sh(lab, 0, "getent ahostsv4 node0").stdout.split()[0] == "10.77.0.10"


@needs_lab
def test_kill_node_kills_only_that_node(lab):
    procs = [subprocess.Popen(lab.node_argv(i, ["sleep", "300"])) for i in range(2)]
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline and not all(lab.node_pids(i) for i in range(2)):
        time.sleep(0.05)
    assert lab.kill_node(1) == [procs[1].pid]
    assert procs[1].wait(timeout=5) == -9  # the caller still sees the real exit status
    assert procs[0].poll() is None


# ---------------------------------------------------------------- faults at a point of a running job


def test_inject_when_fires_once_on_a_complete_matching_line(tmp_path):
    ranks = tmp_path / "job" / "ranks"
    calls: list[float] = []
    with netlab.inject_when(tmp_path / "job", r"step 3 ", lambda: calls.append(time.time()), timeout_s=10) as watch:
        ranks.mkdir(parents=True)  # the job directory appears after the watch starts
        log = ranks / "rank1.stdout"
        with open(log, "w") as fh:
            for step in range(3):
                fh.write(f"step {step} ok\n")
                fh.flush()
            fh.write("step 3 ")  # half a line: not a line yet
            fh.flush()
            time.sleep(0.3)
            assert not calls
            fh.write("ok\nstep 4 ok\nstep 3 again\n")
        deadline = time.monotonic() + 5
        while not calls and time.monotonic() < deadline:
            time.sleep(0.02)
    assert len(calls) == 1 and watch.fired and watch.line == "step 3 ok" and watch.fired_at <= calls[0]


def test_inject_when_finds_the_next_job_of_a_name_and_gives_up_at_its_timeout(tmp_path, monkeypatch):
    monkeypatch.setenv("RUNBOOK_BUILD_DIR", str(tmp_path))
    old = jobs.new_job_dir("injname")
    (old / "ranks").mkdir()
    (old / "ranks" / "rank0.stdout").write_text("step 3 old job\n")  # an older job of that name never counts
    watch = netlab.inject_when("injname", "step 3", lambda: None, timeout_s=0.5)
    time.sleep(0.8)
    assert not watch.stop().fired and watch.job_dir is None
    with pytest.raises(ZeroDivisionError):  # the fault's own error reaches the caller when the block ends
        with netlab.inject_when("injname", "boom", lambda: 1 / 0, timeout_s=10) as watch:
            new = jobs.new_job_dir("injname")
            (new / "ranks").mkdir()
            (new / "ranks" / "rank0.stdout").write_text("boom\n")
            time.sleep(0.5)
    assert watch.job_dir == new and watch.fired


@pytest.mark.parametrize("kwargs, field", [({"pattern": "("}, "pattern"), ({"fault": None}, "fault"),
                                           ({"timeout_s": 0}, "timeout_s"), ({"job_or_dir": 3}, "job_or_dir")])
def test_inject_when_names_the_bad_argument(kwargs, field):
    args = {"job_or_dir": "x", "pattern": "step", "fault": lambda: None, "timeout_s": 1.0, **kwargs}
    with pytest.raises(ValueError, match=field):
        netlab.inject_when(**args)


@needs_lab
def test_inject_when_cuts_a_cable_in_a_real_job(lab, no_leftovers):
    args = ["--backend", "gloo", "--sizes", "1KiB", "--steps", "200", "--interval-s", "0.1", "--timeout-s", "3"]
    with netlab.inject_when("lab-inject", r"step 3 ", lambda: lab.cut_link(1), timeout_s=60) as watch:
        r = lab.launch(SCENARIOS / "net_allreduce.py", args, form="static", timeout_s=60, name="lab-inject",
                       verbose=False)
    assert watch.fired and "step 3" in watch.line and watch.job_dir == r.job_dir
    assert not r.ok and lab.status()["nodes"][1]["bridge_port"]["state"] == "DOWN"
    ends = [rr.end for rr in r.ranks.values() if rr.end and rr.exit_code not in (0, None)]
    assert ends and 2 < min(ends) - watch.fired_at < 15  # the 3 s recv timeout, counted from the cut


# ---------------------------------------------------------------- CLI


@needs_lab
def test_cli_up_status_down(lab_name, capsys):
    from helpers import cli

    parser = cli.build_parser()
    args = parser.parse_args(["lab", "up", "--nodes", "3", "--name", lab_name])
    assert args.func(args) == 0
    assert netlab.Lab(3, name=lab_name).is_up()  # outlives the command: recoverable from the system
    args = parser.parse_args(["lab", "status", "--name", lab_name])
    assert args.func(args) == 0
    out = capsys.readouterr().out
    assert f"lab {lab_name!r}: up" in out and "node2" in out and "10.77.0.12/24" in out
    args = parser.parse_args(["lab", "down", "--name", lab_name])
    assert args.func(args) == 0
    assert "removed 4 namespace(s)" in capsys.readouterr().out
    with pytest.raises(SystemExit):
        parser.parse_args(["lab", "up", "--nodes", str(netlab.MAX_NODES + 1)])  # over the lab's limit


# ---------------------------------------------------------------- a real 2-node job


@needs_lab
@pytest.mark.parametrize("form", ["c10d", "static"])
def test_two_node_job_sees_node_hostnames(lab, form, no_leftovers, tmp_path):
    out = tmp_path / "env.json"
    r = lab.launch(SCENARIOS / "env_report.py", ["--out", str(out), "--backend", "gloo", "--timeout-s", "30"],
                   form=form, timeout_s=120, name=f"lab-{form}", verbose=False)
    assert r.ok, r.summary() + "\n" + r.output[-3000:]
    records = json.loads(out.read_text())
    seen = sorted((rec["hostname"], rec["contract"]["RANK"]) for rec in records)
    assert [h for h, _ in seen] == ["node0", "node1"] and sorted(rk for _, rk in seen) == ["0", "1"]
    assert {rec["contract"]["MASTER_ADDR"] for rec in records} == {"node0"}
    for i in range(2):
        assert (r.job_dir / "nodes" / f"node{i}.stdout").exists()
        assert f"/run/netns/{lab.ns(i)}" in " ".join(r.commands[i])
    node_of_rank1 = next(rec["hostname"] for rec in records if rec["contract"]["RANK"] == "1")
    assert "[rank 1]" in netlab.node_output(r, node_of_rank1)  # each node's launcher log holds its own ranks
