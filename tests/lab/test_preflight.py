"""Tests of helpers.preflight: interface-selection rules, grading on canned node output, and every fault on a real lab."""

from __future__ import annotations

import itertools
import json
import os
import subprocess
import sys
import time
from collections.abc import Sequence

import pytest
from support import by_id, lab_status, needs_lab, not_ok

from helpers import netlab, preflight
from helpers.checks import Check, faulty_nodes

AVAILABLE, WHY = lab_status()
_ids = itertools.count()
HEALTHY_ENV = {"MASTER_ADDR": "node0", "MASTER_PORT": "29500", "NCCL_SOCKET_IFNAME": "eth", "GLOO_SOCKET_IFNAME": "eth0"}


# ---------------------------------------------------------------- the lab


@pytest.fixture
def lab():
    """A 2-node lab for one test; afterwards assert that no namespace, mount or process of it is left."""
    if not AVAILABLE:
        pytest.skip(f"network lab unavailable: {WHY}")
    name = f"p{os.getpid()}x{next(_ids)}"[:12]
    the_lab = netlab.Lab(2, name=name).up()
    yield the_lab
    the_lab.down()
    left = [n for n in subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout.split()
            if n.startswith(f"{name}-")]
    assert not left, f"namespaces left behind: {left}"
    assert not netlab.Lab(1, name=name).leftovers()


def run(lab: netlab.Lab, env: dict[str, str]) -> list[Check]:
    t0 = time.monotonic()
    checks = preflight.run_preflight(lab.hostnames, lab, env)
    assert time.monotonic() - t0 < 60  # bounded: every step has its own timeout
    return checks


@needs_lab
def test_healthy_lab_is_all_ok(lab):
    checks = run(lab, HEALTHY_ENV)
    assert {c.status for c in checks} == {"OK"}, preflight.format_checks(checks)
    ids = set(by_id(checks))
    for node in ("node0", "node1"):
        assert {f"net.node.{node}", f"net.NCCL_SOCKET_IFNAME.{node}", f"net.GLOO_SOCKET_IFNAME.{node}",
                f"net.hostname.{node}", f"net.master.{node}"} <= ids
    assert {"net.port.node0", "net.mtu.node1"} <= ids
    node1 = by_id(checks)["net.node.node1"].values["interfaces"]
    assert [(i["name"], i["mtu"], i["ipv4"]) for i in node1] == [("lo", 65536, ["127.0.0.1/8"]),
                                                                  ("eth0", 1500, ["10.77.0.11/24"])]


@needs_lab
def test_mtu_black_hole(lab):
    lab.set_mtu("all", 9000)  # both endpoints claim 9000, the bridge side stays at 1500
    bad = not_ok(run(lab, HEALTHY_ENV))
    assert list(bad) == ["net.mtu.node1"]
    c = bad["net.mtu.node1"]
    assert c.status == "FAIL" and "black hole" in c.title and set(c.faulty) == {"node1", "node0"}
    assert c.values["pings"][8972]["ok"] is False and c.values["pings"][1472]["ok"] is True
    assert "mtu 1500" in c.remediation


@needs_lab
def test_mtu_black_hole_without_iputils_ping(lab):
    """A node without ``ping``: the Python raw-socket ICMP probe measures the same black hole."""
    def no_ping(node: str, argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        res = lab.run(node, argv, timeout_s)
        if "@@hostname" in " ".join(argv):  # the inventory: hide the ping binary
            lines = res.stdout.splitlines()
            at = lines.index("@@ping")
            res.stdout = "\n".join(lines[:at + 1] + lines[at + 2:] if not lines[at + 1].startswith("@@") else lines) + "\n"
        return res

    lab.set_mtu("all", 9000)
    checks = preflight.run_preflight(lab.hostnames, no_ping, {"MASTER_ADDR": "node0"})
    assert by_id(checks)["net.node.node1"].values["ping_tool"] == "python3 icmp probe"
    mtu = by_id(checks)["net.mtu.node1"]
    assert mtu.status == "FAIL" and "black hole" in mtu.title, preflight.format_checks(checks)
    assert "python icmp probe" in mtu.values["pings"][1472]["output"]
    assert by_id(checks)["net.master.node1"].status == "OK"


@needs_lab
def test_df_ping_sees_the_black_hole_with_either_tool(lab):
    """``preflight.df_ping``: iputils ping where installed, the raw-ICMP probe where not; same verdict."""
    lab.set_mtu("all", 9000)
    dst = lab.address(0)
    big, cmd, said = preflight.df_ping(lab, "node1", dst, 8972)
    small, _, _ = preflight.df_ping(lab, "node1", dst, 1472)
    assert big != 0 and small == 0, (cmd, said)

    def without_ping(node: str, argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        if argv[:2] == ["sh", "-c"] and "command -v ping" in argv[2]:
            return subprocess.CompletedProcess(list(argv), 0, "", "")
        return lab.run(node, argv, timeout_s)

    big, cmd, said = preflight.df_ping(without_ping, "node1", dst, 8972)
    assert big != 0 and cmd.startswith("python3 <icmp probe>") and "0 received" in said
    assert preflight.df_ping(without_ping, "node1", dst, 1472)[0] == 0
    with pytest.raises(ValueError, match="size"):
        preflight.df_ping(lab, "node1", dst, -1)


@needs_lab
def test_mtu_mismatch_of_one_endpoint_is_a_warning(lab):
    lab.set_mtu(1, 9000)  # TCP's MSS hides it (PF-mtu-blackhole), but it is still wrong
    bad = not_ok(run(lab, HEALTHY_ENV))
    assert list(bad) == ["net.mtu.node1"] and bad["net.mtu.node1"].status == "WARN"
    assert bad["net.mtu.node1"].faulty == ["node1"] and "9000" in bad["net.mtu.node1"].title


@needs_lab
def test_decoy_ifname(lab):
    lab.add_decoy("all")
    bad = not_ok(run(lab, {**HEALTHY_ENV, "GLOO_SOCKET_IFNAME": "docker0", "NCCL_SOCKET_IFNAME": "^docker0"}))
    for node in ("node0", "node1"):
        gloo = bad[f"net.GLOO_SOCKET_IFNAME.{node}"]
        assert gloo.status == "FAIL" and "172.17.0.1" in gloo.title and sorted(gloo.faulty) == ["node0", "node1"]
        nccl = bad[f"net.NCCL_SOCKET_IFNAME.{node}"]
        assert nccl.status == "FAIL" and "lo" in nccl.title and "^docker0,lo" in nccl.remediation
    assert faulty_nodes(list(bad.values())) == ["node0", "node1"]


@needs_lab
def test_interface_present_on_one_node_only(lab):
    lab.rename_data_iface(0, "ibp65s0")
    lab.rename_data_iface(1, "ibp161s0")
    bad = not_ok(run(lab, {**HEALTHY_ENV, "GLOO_SOCKET_IFNAME": "ibp65s0", "NCCL_SOCKET_IFNAME": "ibp65s0"}))
    assert sorted(bad) == ["net.GLOO_SOCKET_IFNAME.node1", "net.NCCL_SOCKET_IFNAME.node1"]
    assert "Unable to find address for: ibp65s0" in bad["net.GLOO_SOCKET_IFNAME.node1"].title
    assert all(c.faulty == ["node1"] for c in bad.values())
    # NCCL's prefix form covers both names: fixed
    assert not not_ok(run(lab, {"MASTER_ADDR": "node0", "NCCL_SOCKET_IFNAME": "ibp"}))


@needs_lab
@pytest.mark.parametrize("cut", [1, 0])
def test_cut_link(lab, cut):
    lab.cut_link(cut)
    checks = run(lab, HEALTHY_ENV)
    assert faulty_nodes(checks) == [f"node{cut}"], preflight.format_checks(checks)
    master = by_id(checks)["net.master.node1"]
    assert master.status == "FAIL" and "no carrier" in master.title and master.faulty == [f"node{cut}"]


@needs_lab
def test_wrong_master_address(lab):
    lab.set_host_entry(1, "node0", "10.77.0.99")  # a stale /etc/hosts entry on node1 only
    checks = run(lab, HEALTHY_ENV)
    fails = {c.id: c for c in checks if c.status == "FAIL"}
    assert list(fails) == ["net.master.node1"] and fails["net.master.node1"].faulty == ["node1"]
    assert "10.77.0.99" in fails["net.master.node1"].title and "10.77.0.10" in fails["net.master.node1"].title
    lab.set_host_entry(1, "node0", lab.address(0))
    checks = run(lab, {**HEALTHY_ENV, "MASTER_ADDR": "10.77.0.99"})  # an address the master does not have
    fails = {c.id: c for c in checks if c.status == "FAIL"}
    assert fails["net.master.node0"].faulty == ["node0"] and "not an address of node0" in fails["net.master.node0"].title
    assert faulty_nodes(checks) == ["node0"]
    checks = run(lab, {"MASTER_ADDR": "localhost"})
    assert all("loopback" in by_id(checks)[f"net.master.node{i}"].title for i in range(2))


@needs_lab
def test_hostname_resolving_to_loopback(lab):
    lab.set_host_entry(1, "node1", "127.0.1.1")  # Debian's default /etc/hosts line for the own hostname
    bad = not_ok(run(lab, {"MASTER_ADDR": "node0"}))
    assert list(bad) == ["net.hostname.node1"] and bad["net.hostname.node1"].status == "FAIL"


@needs_lab
def test_busy_port_on_master(lab):
    holder = subprocess.Popen(lab.node_argv(0, [sys.executable, "-c", "import socket, time\n"
                                                "s = socket.socket(); s.bind(('0.0.0.0', 29500)); s.listen()\n"
                                                "print('listening', flush=True); time.sleep(120)"]),
                              stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "listening"
    bad = not_ok(run(lab, HEALTHY_ENV))
    assert list(bad) == ["net.port.node0"] and bad["net.port.node0"].faulty == ["node0"]
    assert f"pid={holder.pid}" in bad["net.port.node0"].title
    lab.down()  # the lab's teardown kills the holder, which lives in node0's namespace
    assert holder.wait(timeout=5) == -15


@needs_lab
def test_cli(lab, capsys):
    from helpers import cli

    parser = cli.build_parser()
    args = parser.parse_args(["preflight", "--lab", "--name", lab.name, "--env", "GLOO_SOCKET_IFNAME=eth0"])
    assert args.func(args) == 0
    assert "OK: " in capsys.readouterr().out
    lab.add_decoy("all")
    args = parser.parse_args(["preflight", "--name", lab.name, "--env", "GLOO_SOCKET_IFNAME=docker0", "--json"])
    assert args.func(args) == 1
    records = json.loads(capsys.readouterr().out)
    assert {r["id"] for r in records if r["status"] == "FAIL"} == {"net.GLOO_SOCKET_IFNAME.node0",
                                                                   "net.GLOO_SOCKET_IFNAME.node1"}
    args = parser.parse_args(["preflight", "--name", "nosuchlab"])
    assert args.func(args) == 2
