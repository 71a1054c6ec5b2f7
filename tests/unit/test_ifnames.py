"""Unit tests of helpers.ifnames, and that the command builder, the pre-flight and the host checks agree with it."""

from __future__ import annotations

from typing import Any

import pytest

from helpers import ifnames, launch_traps, preflight
from helpers.allocation import local


def _iface(name: str, ipv4: list[str], running: bool = True, loopback: bool = False) -> dict[str, Any]:
    return {"name": name, "state": "UP" if running else "DOWN", "mtu": 1500, "flags": ["UP"] if running else [],
            "link_type": "ether", "loopback": loopback, "up": running, "running": running, "ipv4": ipv4, "ipv6": []}


IFACES = [_iface("lo", ["127.0.0.1/8"], loopback=True), _iface("eth0", ["10.0.0.2/24"]),
          _iface("docker0", ["172.17.0.1/16"]), _iface("ib0", ["10.9.0.2/24"], running=False)]


def test_one_definition_of_the_variables():
    assert ifnames.IFNAME_VARS == {"NCCL_SOCKET_IFNAME": "nccl", "GLOO_SOCKET_IFNAME": "gloo"}
    assert preflight.IFNAME_VARS is ifnames.IFNAME_VARS
    with pytest.raises(ValueError, match="var='UCX_NET_DEVICES': accepted values are NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME"):
        ifnames.flavor_of("UCX_NET_DEVICES")


def test_parse_and_match():
    spec = ifnames.parse("^docker,lo", "nccl")
    assert (spec["exclude"], spec["exact"], spec["names"]) == (True, False, ["docker", "lo"])
    assert ifnames.match(spec, IFACES) == ["eth0", "ib0"]
    assert ifnames.parse("^docker0", "gloo")["supported"] is False
    assert ifnames.parse("e", "nccl")["names"] == []
    with pytest.raises(ValueError, match="flavor='mpi'"):
        ifnames.parse("eth0", "mpi")


def test_select_applies_runtime_rules():
    sel = ifnames.select("NCCL_SOCKET_IFNAME", "^docker0", IFACES)
    assert sel["first"] == "lo" and sel["kind"] == "loopback" and sel["node_local"] == "loopback"
    sel = ifnames.select("NCCL_SOCKET_IFNAME", "ib", IFACES)
    assert sel["kind"] == "no-carrier" and sel["error"] == "Bootstrap : no socket interface found"
    sel = ifnames.select("NCCL_SOCKET_IFNAME", "eth", IFACES)
    assert sel["first"] == "eth0" and sel["address"] == "10.0.0.2" and not sel["problem"] and sel["node_local"] is None
    sel = ifnames.select("GLOO_SOCKET_IFNAME", "eth1", IFACES)
    assert sel["kind"] == "missing" and sel["error"] == "Unable to find address for: eth1"


@pytest.mark.parametrize("name, ip, reason", [
    ("lo", "", "loopback"), ("eth0", "127.0.1.1", "loopback"), ("eth0", "::1", "loopback"),
    ("docker0", "", "Docker bridge"), ("br-3f2a9c", "", "Docker bridge"), ("virbr0", "", "libvirt bridge"),
    ("cni0", "", "CNI bridge (Kubernetes)"), ("veth1a2b3c", "", "container veth pair"),
    ("eth0", "10.0.0.2", None), ("ib0", "", None), ("bond0", "", None), ("br0", "", None), ("enp65s0f1", "", None),
])
def test_node_local_reason(name, ip, reason):
    assert ifnames.node_local_reason(name, ip) == reason


def test_node_specific_names():
    assert ifnames.node_specific_name("ibp65s0") and ifnames.node_specific_name("enp65s0f1")
    assert not ifnames.node_specific_name("ib0") and not ifnames.node_specific_name("eth")


@pytest.mark.parametrize("name", ["cni0", "docker0", "virbr0", "veth1a2b", "lo"])
def test_builder_preflight_and_rule_agree(name):
    """The command builder's trap, the pre-flight's selection and node_local_reason say the same of ``name``."""
    reason = ifnames.node_local_reason(name)
    assert reason is not None
    spec = launch_traps.LaunchSpec(nnodes=2, rdzv="c10d", master_addr="10.0.0.1", env={"NCCL_SOCKET_IFNAME": name})
    trap_ids = [t.id for t in launch_traps.find_traps(spec)]
    assert ("ifname-loopback" if reason == "loopback" else "ifname-bridge") in trap_ids
    node = [_iface(name, ["127.0.0.1/8" if name == "lo" else "172.17.0.1/16"], loopback=name == "lo"),
            _iface("eth0", ["10.0.0.2/24"])]
    sel = ifnames.select("NCCL_SOCKET_IFNAME", "=" + name, node)
    assert sel["first"] == name and sel["node_local"] == reason
    plain = launch_traps.LaunchSpec(nnodes=2, rdzv="c10d", master_addr="10.0.0.1", env={"NCCL_SOCKET_IFNAME": "eth0"})
    assert not {"ifname-loopback", "ifname-bridge"} & {t.id for t in launch_traps.find_traps(plain)}
    assert ifnames.select("NCCL_SOCKET_IFNAME", "eth0", node)["node_local"] is None


def test_host_grading_uses_the_same_rules():
    graded = local._check_socket_ifname({"GLOO_SOCKET_IFNAME": "^docker0"}, IFACES)
    assert graded.status == "FAIL" and graded.values["GLOO_SOCKET_IFNAME"]["spec"] == ifnames.parse("^docker0", "gloo")
    graded = local._check_socket_ifname({"NCCL_SOCKET_IFNAME": "eth"}, IFACES)
    assert graded.status == "OK" and graded.values["NCCL_SOCKET_IFNAME"]["matched"] == ["eth0"]
