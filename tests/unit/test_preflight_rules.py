"""helpers.preflight without the lab: NCCL's and gloo's interface-selection rules, grading on canned node output."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence

import pytest
from support import by_id

from helpers import ifnames, preflight, slurm
from helpers.checks import Check


def iface(name: str, ipv4: Sequence[str] = (), *, mtu: int = 1500, carrier: bool = True, loopback: bool = False) -> dict:
    flags = (["LOOPBACK"] if loopback else ["BROADCAST", "MULTICAST"]) + ["UP"] + (["LOWER_UP"] if carrier else ["NO-CARRIER"])
    return {"ifname": name, "mtu": mtu, "flags": flags, "operstate": "UNKNOWN" if loopback else ("UP" if carrier else "DOWN"),
            "addr_info": [{"family": "inet", "local": a.split("/")[0], "prefixlen": int(a.split("/")[1])} for a in ipv4]}


LO = iface("lo", ["127.0.0.1/8"], mtu=65536, loopback=True)


def test_nccl_prefix_exclusion_and_exact():
    ifaces = preflight.parse_ip_addr(json.dumps([LO, iface("eth0", ["10.0.0.1/24"]), iface("docker0", ["172.17.0.1/16"]),
                                                 iface("ib0", ["10.1.0.1/24"], carrier=False)]))
    sel = ifnames.select("NCCL_SOCKET_IFNAME", "eth", ifaces)
    assert sel["selected"] == ["eth0"] and sel["address"] == "10.0.0.1" and not sel["problem"]
    sel = ifnames.select("NCCL_SOCKET_IFNAME", "^docker0", ifaces)  # keeps lo, which comes first
    assert sel["first"] == "lo" and sel["kind"] == "loopback"
    sel = ifnames.select("NCCL_SOCKET_IFNAME", "^docker0,lo", ifaces)
    assert sel["selected"] == ["eth0"] and not sel["problem"]
    sel = ifnames.select("NCCL_SOCKET_IFNAME", "=eth", ifaces)  # exact: no interface is named "eth"
    assert sel["kind"] == "missing" and sel["error"] == "Bootstrap : no socket interface found"
    sel = ifnames.select("NCCL_SOCKET_IFNAME", "ib", ifaces)  # matches, but no carrier: NCCL skips it
    assert sel["kind"] == "no-carrier" and "ib0" in sel["problem"]


def test_gloo_exact_names_only():
    ifaces = preflight.parse_ip_addr(json.dumps([LO, iface("eth0", ["10.0.0.1/24"]), iface("br9")]))
    assert not ifnames.select("GLOO_SOCKET_IFNAME", "eth0", ifaces)["problem"]
    sel = ifnames.select("GLOO_SOCKET_IFNAME", "eth", ifaces)  # no prefix matching in gloo
    assert sel["kind"] == "missing" and sel["error"] == "Unable to find address for: eth"
    sel = ifnames.select("GLOO_SOCKET_IFNAME", "^docker0", ifaces)
    assert sel["kind"] == "syntax" and sel["error"] == "Unable to find address for: ^docker0"
    assert ifnames.select("GLOO_SOCKET_IFNAME", "br9", ifaces)["kind"] == "no-address"
    with pytest.raises(ValueError, match="var"):
        ifnames.select("UCX_NET_DEVICES", "eth0", ifaces)


def test_parse_inventory_rejects_truncated_output():
    with pytest.raises(ValueError, match="incomplete"):
        preflight.parse_inventory("@@hostname\nnode0\n@@addr\n[]\n")


def test_node_check_defaults_faulty_to_its_node():
    c = Check("net.x.n1", "t", "FAIL", node="n1")
    assert c.faulty == ["n1"] and isinstance(c, Check)
    assert Check("net.x.n1", "t", "OK", node="n1").faulty == []


def test_run_preflight_validates_its_arguments():
    with pytest.raises(ValueError, match="nodes"):
        preflight.run_preflight([], slurm.ThisHost())
    with pytest.raises(ValueError, match="master"):
        preflight.run_preflight(["a", "b"], slurm.ThisHost(), master="c")
    with pytest.raises(ValueError, match="MASTER_PORT"):
        preflight.run_preflight(["a"], slurm.ThisHost(), {"MASTER_PORT": "http"})


def test_unreachable_node_is_a_fail_naming_it():
    """A runner that cannot reach node b (as srun to a dead node): net.node.b FAIL; a is still checked."""
    class DeadB(slurm.ThisHost):
        def on_node(self, node: str, argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
            if node == "b":
                return subprocess.CompletedProcess(list(argv), 1, "", "srun: error: Unable to create step: node b down")
            return super().on_node(node, argv, timeout_s)

    checks = preflight.run_preflight(["a", "b"], DeadB(), {"MASTER_ADDR": "127.0.0.1"})
    bad = by_id(checks)["net.node.b"]
    assert bad.status == "FAIL" and bad.faulty == ["b"] and "node b down" in bad.title
    assert by_id(checks)["net.node.a"].status == "OK"
