"""helpers.hostinfo inside a real network namespace (root): interfaces, MTU mismatch, a DOWN interface."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import uuid
from typing import Any

import pytest
from support import ROOT as REPO


def _netns_usable() -> str:
    if os.geteuid() != 0:
        return "needs root to create a network namespace"
    if shutil.which("ip") is None:
        return "iproute2 missing"
    probe = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True)
    return "" if probe.returncode == 0 else f"`ip netns` unavailable: {probe.stderr.strip()}"


@pytest.fixture
def netns():
    """A namespace with lo, a 9000-MTU veth pair (10.77.201.x), a 1500 one, and a DOWN veth; deleted after."""
    reason = _netns_usable()
    if reason:
        pytest.skip(reason)
    tag = uuid.uuid4().hex[:6]
    name = f"hostinfo-test-{tag}"
    subprocess.run(["ip", "netns", "add", name], check=True)
    try:
        for cmd in (
            "link set lo up",
            f"link add hj{tag} mtu 9000 type veth peer name hk{tag} mtu 9000",
            f"addr add 10.77.201.1/24 dev hj{tag}",
            f"link set hj{tag} up", f"link set hk{tag} up",
            f"link add hm{tag} type veth peer name hn{tag}",
            f"addr add 10.77.202.1/24 dev hm{tag}",
            f"link set hm{tag} up", f"link set hn{tag} up",
            f"link add hd{tag} type veth peer name he{tag}",
            f"addr add 10.77.203.1/24 dev hd{tag}",
        ):
            subprocess.run(["ip", "-n", name, *cmd.split()], check=True, capture_output=True)
        yield name, tag
    finally:
        subprocess.run(["ip", "netns", "del", name], check=False)


def _in_netns(ns: str, code: str) -> Any:
    proc = subprocess.run(["ip", "netns", "exec", ns, sys.executable, "-c", code],
                          cwd=REPO, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_interfaces_inside_netns(netns):
    ns, tag = netns
    seen = {i["name"]: i for i in _in_netns(ns, "import json; from helpers.hostinfo import interfaces; "
                                                "print(json.dumps(interfaces()))")}
    assert seen[f"hj{tag}"]["mtu"] == 9000 and "10.77.201.1/24" in seen[f"hj{tag}"]["ipv4"]
    assert seen[f"hj{tag}"]["up"] and seen[f"hj{tag}"]["state"] == "UP"
    assert seen[f"hd{tag}"]["up"] is False and seen[f"hd{tag}"]["state"] == "DOWN"
    assert "eth0" not in seen  # the host's interfaces stay outside


def test_sysfs_fallback_matches_ip_inside_netns(netns):
    """Without iproute2 the records come from /sys/class/net: the same as `ip -j addr` gives, a veth whose peer is
    down (NO-CARRIER, LOWERLAYERDOWN) included."""
    ns, tag = netns
    for cmd in (f"link add hx{tag} type veth peer name hy{tag}", f"link set hx{tag} up"):
        subprocess.run(["ip", "-n", ns, *cmd.split()], check=True, capture_output=True)
    both = _in_netns(ns, "import json; from helpers import hostinfo; "
                         "print(json.dumps([hostinfo.interfaces(), hostinfo.interfaces_from_sysfs()]))")
    assert both[0] == both[1]
    hx = {i["name"]: i for i in both[1]}[f"hx{tag}"]
    assert "NO-CARRIER" in hx["flags"] and hx["state"] == "LOWERLAYERDOWN" and not hx["running"]


def test_host_checks_inside_netns(netns):
    ns, tag = netns
    code = ("import json, sys; from helpers.allocation.local import host_checks; "
            "print(json.dumps({r.id: r.to_dict() for r in host_checks(json.loads(sys.argv[1]))}))")
    env = {"GLOO_SOCKET_IFNAME": f"hd{tag}", "NCCL_SOCKET_IFNAME": f"hj{tag}"}
    records = _in_netns(ns, code.replace("sys.argv[1]", repr(json.dumps(env))))
    mismatch = records["host.interfaces"]["values"]["mtu_mismatch"]["ether"]
    assert records["host.interfaces"]["status"] == "WARN"
    assert mismatch[f"hj{tag}"] == 9000 and mismatch[f"hm{tag}"] == 1500
    sock = records["host.socket_ifname"]
    assert sock["status"] == "WARN" and "DOWN" in sock["title"]
    assert sock["values"]["NCCL_SOCKET_IFNAME"]["matched"] == [f"hj{tag}"]
