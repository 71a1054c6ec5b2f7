"""helpers.netlab without building a lab: argument validation, addresses and names, the commands it would run."""

from __future__ import annotations

import os

import pytest
from support import SCENARIOS, lab_leftovers

from helpers import jobs, netlab


@pytest.mark.parametrize("kwargs, field", [
    ({"nodes": 0}, "nodes"), ({"nodes": 9}, "nodes"), ({"nodes": True}, "nodes"),
    ({"name": "RB"}, "name"), ({"name": "a-b"}, "name"), ({"name": "x" * 13}, "name"),
    ({"subnet": "10.77.0.1/24"}, "subnet"), ({"subnet": "10.77.0.0/29"}, "subnet"),
    ({"subnet": "172.17.0.0/24"}, "subnet"), ({"subnet": "fd00::/64"}, "subnet"),
])
def test_bad_arguments_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        netlab.Lab(**kwargs)


def test_fault_arguments_are_validated_before_touching_anything():
    lab = netlab.Lab(2, name="novalid")
    with pytest.raises(ValueError, match="node"):
        lab.index(2)
    with pytest.raises(ValueError, match="mtu"):
        lab.set_mtu(0, 100)
    with pytest.raises(ValueError, match="side"):
        lab.set_mtu(0, 1500, side="switch")
    with pytest.raises(ValueError, match="172.17.0.0/16"):
        lab.add_decoy(0, addr="10.77.0.50/24")  # the lab subnet is not a decoy
    with pytest.raises(ValueError, match="name"):
        lab.add_decoy(0, name="eth0")
    with pytest.raises(ValueError, match="net"):
        lab.set_sysctl(0, "kernel.hostname", "x")  # a global sysctl would change the host
    with pytest.raises(ValueError, match="form"):
        lab.torchrun_commands(SCENARIOS / "toy_job.py", form="rdzv")
    assert not lab_leftovers("novalid")


def test_addresses_and_names():
    lab = netlab.Lab(3, subnet="10.88.1.0/24", name="naming")
    assert [lab.address(i) for i in range(3)] == ["10.88.1.10", "10.88.1.11", "10.88.1.12"]
    assert lab.hostnames == ["node0", "node1", "node2"]
    assert lab.index("node2") == 2 and lab.index("naming-node1") == 1 and lab.ns(0) == "naming-node0"
    assert "10.88.1.12\tnode2" in lab.hosts_text() and "127.0.0.1\tlocalhost" in lab.hosts_text()


@pytest.mark.skipif(os.geteuid() != 0, reason="rootless: node_argv names the running holder process")
def test_node_argv_enters_all_three_namespaces():
    argv = netlab.Lab(2, name="argv").node_argv("node1", ["hostname"])
    assert argv[0] == "nsenter" and argv[-4:] == ["--", "env", f"--chdir={os.getcwd()}", "hostname"]
    assert "--net=/run/netns/argv-node1" in argv and f"--chdir={os.getcwd()}" in argv
    assert f"--chdir={jobs.project_root()}" in netlab.Lab(2, name="argv").node_argv(0, ["true"], cwd=jobs.project_root())
    assert any(a.startswith("--uts=") for a in argv) and any(a.startswith("--mount=") for a in argv)


@pytest.mark.skipif(os.geteuid() != 0, reason="rootless: node_argv names the running holder process")
def test_torchrun_commands_in_both_forms():
    lab = netlab.Lab(2, name="cmds")
    toy = SCENARIOS / "toy_job.py"
    c10d = lab.torchrun_commands(toy, ["--steps", "1"], nproc_per_node=2, rdzv_conf="join_timeout=20")
    assert len(c10d) == 2
    for i, cmd in enumerate(c10d):
        text = " ".join(cmd)
        assert f"--net=/run/netns/cmds-node{i}" in text
        assert "--nnodes=2" in text and "--nproc-per-node=2" in text and "--standalone" not in text
        assert "--rdzv-backend=c10d" in text and "--rdzv-endpoint=node0:29500" in text
        assert "--rdzv-conf=join_timeout=20" in text
        assert cmd[-4:] == [jobs.SHIM, str(toy.resolve()), "--steps", "1"]
    static = lab.torchrun_commands(toy, master_node=1, nodes=[1], port=29600, form="static")
    assert len(static) == 1
    text = " ".join(static[0])
    assert "--master-addr=node1" in text and "--master-port=29600" in text and "--node-rank=1" in text
    assert "--nnodes=2" in text  # the node that never joins is still expected (MN1)
    with pytest.raises(ValueError, match="rdzv_conf"):
        lab.torchrun_commands(toy, form="static", rdzv_conf="join_timeout=5")


def test_lab_available_gives_a_reason():
    ok, why = netlab.lab_available()
    assert isinstance(ok, bool) and why
    if ok:
        assert why.startswith("root:" if os.geteuid() == 0 else "rootless:")
