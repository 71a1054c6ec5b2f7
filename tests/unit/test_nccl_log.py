"""Tests of helpers.nccl_log on the sample logs under tests/data/nccl/ and on inline lines.

Pure parsing: no torch, no subprocess.  The gilbreth_* samples are verbatim excerpts of
the Gilbreth guide (the section id, e.g. Gilbreth 6.3, in each file's header; see helpers.sources); the others
are hand-written in real NCCL formats (sources in their headers).
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path

import pytest

from helpers import cli
from helpers import nccl_log as nl
from helpers.checks import Check

DATA = Path(__file__).parents[1] / "data" / "nccl"


def load(name: str) -> nl.NcclLog:
    return nl.parse_files([DATA / name])


def verdicts(name: str) -> dict[str, Check]:
    return {v.id: v for v in nl.interpret(load(name))}


def severities(vs) -> set[str]:
    return {v.status for v in (vs.values() if isinstance(vs, dict) else vs)}


# ------------------------------------------------------------------------------- per sample log

# sample -> (verdict id that must be present, its severity, CLI exit status)
EXPECTED = {
    "healthy_multinode_ib.log": (None, None, 0),
    "gilbreth_6_7_shm_single_node.log": (None, None, 0),
    "gilbreth_8_9_multinode_ib.log": (None, None, 0),
    "gilbreth_6_3_incorrect_single_node.log": ("single-node-ib-loaded", "INFO", 0),
    "gilbreth_8_12_no_socket_interface.log": ("no-interface", "FAIL", 1),
    "no_socket_interface.log": ("no-interface", "FAIL", 1),
    "bridge_virbr0_bootstrap.log": ("bad-interface", "FAIL", 1),
    "lo_socket_ifname.log": ("bad-interface", "FAIL", 1),
    "single_node_net_ib.log": ("single-node-net-transport", "FAIL", 1),
    "gilbreth_6_3_p2p_hang.log": ("p2p-acs-hang", "FAIL", 1),
    "single_node_p2p_hang.log": ("p2p-acs-hang", "FAIL", 1),  # issue 29: the guide's two lines in a one-node log
    "ib_fallback_socket.log": ("ib-fallback-socket", "WARN", 0),
    "connect_no_route.log": ("connect-failed", "FAIL", 1),
    "mn1_stuck_host.log": ("init-incomplete", "FAIL", 1),
    "mixed_versions.log": ("mixed-nccl-version", "FAIL", 1),
}


def test_every_sample_is_covered() -> None:
    assert sorted(p.name for p in DATA.glob("*.log")) == sorted(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_sample_verdict_and_exit_status(name: str, capsys: pytest.CaptureFixture[str]) -> None:
    vid, severity, status = EXPECTED[name]
    found = verdicts(name)
    if vid is None:
        assert not severities(found) & {"FAIL", "WARN"}, found
    else:
        assert found[vid].status == severity
        assert found[vid].evidence and found[vid].remediation
    assert cli.main(["nccl-log", str(DATA / name)]) == status
    out = capsys.readouterr().out
    if vid is not None:
        assert re.search(rf"\[{severity}\]\s+{re.escape(vid)}(?: @\S+)?: ", out)


def test_healthy_multinode_fields() -> None:
    log = load("healthy_multinode_ib.log")
    assert log.topology() == "multi-node"
    assert log.hosts == ["gpu-a01", "gpu-a02"]
    assert list(log.ranks) == ["gpu-a01:41021[0]", "gpu-a01:41022[1]", "gpu-a02:38817[0]", "gpu-a02:38818[1]"]
    r0 = log.ranks["gpu-a01:41021[0]"]
    assert (r0.host, r0.pid, r0.cuda_dev, r0.rank) == ("gpu-a01", 41021, 0, 0)
    assert r0.nccl_version == "2.21.5+cuda12.4"          # the bare "NCCL version" line after its own line
    assert [str(i) for i in r0.bootstrap] == ["ens8f0:10.20.0.11<0>"]
    assert r0.net == "IB" and r0.network == "IB"
    assert r0.net_devices == ["[0]mlx5_0:1/IB", "[1]mlx5_1:1/IB"] and r0.oob.name == "ens8f0"
    assert r0.connections() == {(0, 1): ["P2P/CUMEM/read"], (3, 0): ["NET/IB/0/GDRDMA"]}
    assert r0.transports() == ["NET/IB", "P2P/CUMEM"]
    done = r0.init_complete[0]
    assert (done.rank, done.nranks, done.cuda_dev) == (0, 4, 0)
    assert (r0.n_nodes, r0.local_ranks) == (2, 2)
    assert [r.rank for r in log.ranks.values()] == [0, 1, 2, 3]
    assert all(r.completed for r in log.ranks.values())
    assert log.lines_seen == 64 and log.nccl_lines == 57 and 0 < log.unparsed_count < log.nccl_lines


# -------------------------------------------------------------------- Gilbreth guide excerpts

def test_gilbreth_6_7_correct_output() -> None:
    log = load("gilbreth_6_7_shm_single_node.log")
    assert set(log.ranks) == {"rank0", "rank1"}
    assert log.ranks["rank0"].connections() == {(0, 1): ["SHM/direct/direct"]}
    assert [c.nranks for r in log.ranks.values() for c in r.init_complete] == [2, 2]
    assert log.unattributed.lines == 2                   # "Connected all rings/trees"


def test_gilbreth_6_3_incorrect_output() -> None:
    log = load("gilbreth_6_3_incorrect_single_node.log")
    assert log.unattributed.network == "IB"
    assert log.ranks["rank0"].connections() == {(0, 1): ["P2P/CUMEM"]}
    assert "Gilbreth 6.3" in verdicts("gilbreth_6_3_incorrect_single_node.log")["single-node-ib-loaded"].title


def test_gilbreth_8_9_multinode() -> None:
    log = load("gilbreth_8_9_multinode_ib.log")
    assert log.topology() == "multi-node"
    assert log.ranks["gilbreth-i004"].net_devices == ["[0]ibp161s0:1/RoCE/DETH"]
    assert log.ranks["gilbreth-k025"].net == "IB"
    assert log.ranks["rank0"].connections() == {(0, 2): ["NET/IB/0"], (0, 4): ["P2P/CUMEM"]}


def test_gilbreth_8_12_fix_cites_the_guide() -> None:
    v = verdicts("gilbreth_8_12_no_socket_interface.log")["no-interface"]
    assert v.evidence == ["Bootstrap : no socket interface found"]
    assert "unset NCCL_SOCKET_IFNAME" in v.remediation and "Gilbreth 8.12" in v.remediation


# -------------------------------------------------------------------------- one verdict each

def test_bridge_bootstrap_and_refused() -> None:
    log = load("bridge_virbr0_bootstrap.log")
    assert list(log.ranks) == ["node-a:9120[0]", "node-b:7731[0]"]   # [rank1]: lines folded into node-b's key
    found = {v.id: v for v in nl.interpret(log)}
    bad = found["bad-interface"]
    assert "virbr0 (libvirt bridge)" in bad.title and bad.values["hosts"] == ["node-a", "node-b"]
    assert "NCCL_SOCKET_IFNAME=^docker0,lo" in bad.remediation and "MN2" in bad.remediation
    conn = found["connect-failed"]  # it dialled the bridge's address: the consequence of bad-interface, now FAIL
    assert bad.status == "FAIL" and conn.status == "INFO" and conn.values["ranks"] == ["node-b:7731[0]"]
    assert "192.168.122.1:35547" in conn.title and "Connection refused" in conn.title
    assert "ib-fallback-socket" not in found      # no line shows IB was expected (issue 15: no fallback note)


def test_lo_names_the_environment_variable() -> None:
    bad = verdicts("lo_socket_ifname.log")["bad-interface"]
    assert "lo (loopback)" in bad.title
    assert bad.remediation.startswith("NCCL_SOCKET_IFNAME is set to lo by the environment")
    assert load("lo_socket_ifname.log").ranks["node2:4410[0]"].env == {"NCCL_SOCKET_IFNAME": "lo",
                                                                       "NCCL_IB_DISABLE": "1"}


def test_single_node_net_is_the_gilbreth_trap() -> None:
    log = load("single_node_net_ib.log")
    assert log.topology() == "single-node" and list(log.ranks) == ["gpu-node-07:18211[0]", "gpu-node-07:18212[1]"]
    v = {v.id: v for v in nl.interpret(log)}["single-node-net-transport"]
    assert v.values["hosts"] == ["gpu-node-07"] and "NET/IB" in v.title
    assert "NCCL_P2P_DISABLE=1" in v.title
    # the settings of Gilbreth 6.3 "Required Environment Variables", corrected against NCCL's source: the guide's
    # NCCL_NET_DISABLE is read by no NCCL release; NCCL_NET_DISABLE_INTRA keeps NET off inside a node
    for setting in ("NCCL_IB_DISABLE=1", "NCCL_NET_DISABLE_INTRA=1", "NCCL_P2P_LEVEL=NVL", "NCCL_SHM_DISABLE=0"):
        assert setting in v.remediation
    assert "NCCL_NET_DISABLE=" not in v.remediation and "unset NCCL_P2P_DISABLE" in v.remediation
    assert "Gilbreth 6.3" in v.remediation


def test_ib_fallback_is_warn_only() -> None:
    found = verdicts("ib_fallback_socket.log")
    assert severities(found) - {"INFO"} == {"WARN"}
    assert "ens5" in found["ib-fallback-socket"].title


def test_no_route_names_the_address_and_its_host() -> None:
    v = verdicts("connect_no_route.log")["connect-failed"]
    assert v.values["hosts"] == ["node5"] and v.values["ranks"] == ["node5:240[0]", "node5:241[1]"]
    assert "10.0.0.4:56849 (advertised by node4)" in v.title and "No route to host" in v.title


def test_no_interface_names_the_variable_and_host() -> None:
    found = verdicts("no_socket_interface.log")
    v = found["no-interface"]
    assert v.values["hosts"] == ["gilbreth-i004"] and "NCCL_SOCKET_IFNAME=ibp65s0" in v.title
    assert "init-incomplete" not in found                 # already explained by the FAIL above


def test_mn1_names_the_stuck_host() -> None:
    log = load("mn1_stuck_host.log")
    assert log.ranks["node-a:1201[0]"].nccl_version == "2.20.5+cuda12.4"   # [default0]: bare line -> node-a
    assert log.ranks["node-a:1201[0]"].label == "default0"
    found = {v.id: v for v in nl.interpret(log)}
    v = found["init-incomplete"]
    assert v.status == "FAIL" and v.values["hosts"] == ["node-b"]
    assert v.values["ranks"] == ["node-b:3377[0]", "node-b:3378[1]"] and "MN1" in v.title
    assert [f.id for f in found.values() if f.status == "FAIL"] == ["init-incomplete"]


def test_mixed_versions() -> None:
    v = verdicts("mixed_versions.log")["mixed-nccl-version"]
    assert "2.18.3 on node-b" in v.title and "2.21.5 on node-a" in v.title
    assert "rank 0 runs 2.21.5, rank 2 runs 2.18.3" in v.title


# -------------------------------------------------------------------------------- line formats

@pytest.mark.parametrize("line, rank, nranks, dev", [
    ("h:1:2 [7] NCCL INFO comm 0x7fdf08000d00 rank 15 nranks 16 cudaDev 7 busId e7000 - Init COMPLETE", 15, 16, 7),
    ("h:1:2 [4] NCCL INFO comm 0x557fe785f7a0 rank 36 nranks 64 cudaDev 4 nvmlDev 4 busId 9b000 "
     "commId 0x5ae77eb5ea4ec1ee - Init COMPLETE", 36, 64, 4),
    ("h:1:2 [6] NCCL INFO ncclCommInitRank comm 0x55555b0ba430 rank 6 nranks 8 cudaDev 6 nvmlDev 6 busId bb000 "
     "commId 0xb1a317b2c0f1498c - Init COMPLETE", 6, 8, 6),
    ("h:1:2 [1] NCCL INFO ncclCommSplit comm 0x5591 rank 1 nranks 2 cudaDev 1 nvmlDev 1 busId 2a000 parent 0x5581 "
     "splitCount 1 color 7 key 1 - Init COMPLETE", 1, 2, 1),
    ("NCCL INFO comm 0x... rank 1 nranks 2 - Init COMPLETE", 1, 2, None),
])
def test_init_complete_forms(line: str, rank: int, nranks: int, dev: int | None) -> None:
    (info,) = nl.parse(line).ranks.values()
    done = info.init_complete[0]
    assert (done.rank, done.nranks, done.cuda_dev) == (rank, nranks, dev)
    assert info.completed and info.rank == rank


@pytest.mark.parametrize("msg, src, dst, direction, via, own", [
    ("Channel 00/0 : 0[0] -> 1[1] via P2P/direct pointer", 0, 1, None, "P2P/direct pointer", 0),
    ("Channel 01/0 : 26[2] -> 33[1] [receive] via NET/IBext_v8/4", 26, 33, "receive", "NET/IBext_v8/4", 33),
    ("Ring 00 : 3[b01000] -> 4[201000] [send] via NET/Socket/0", 3, 4, "send", "NET/Socket/0", 3),
    ("Channel 00 : 0[0] -> 1[1] via SHM/direct/direct", 0, 1, None, "SHM/direct/direct", 0),
])
def test_channel_forms(msg: str, src: int, dst: int, direction: str | None, via: str, own: int) -> None:
    (info,) = nl.parse(f"gpu1:10:11 [0] NCCL INFO {msg}").ranks.values()
    ch = info.channels[0]
    assert (ch.src, ch.dst, ch.direction, ch.via, ch.own_rank) == (src, dst, direction, via, own)


@pytest.mark.parametrize("prefix, key, rank, label", [
    ("[rank3]:", "n1:70[3]", 3, "rank3"),                  # torchrun >= 2.2 --tee
    ("[default1]:", "n1:70[3]", None, "default1"),         # older torchrun: local rank label
    ("[rank 2] ", "n1:70[3]", 2, "rank2"),                 # helpers.jobs merged output
    ("2025-03-04T10:15:01.102Z ", "n1:70[3]", None, None),
    ("\x1b[0m ", "n1:70[3]", None, None),                  # ANSI colour (pytorch/pytorch#68893)
    ("(worker3, rank=3, pid=70, ip=10.1.0.7) ", "n1:70[3]", None, None),   # Ray
])
def test_prefixes(prefix: str, key: str, rank: int | None, label: str | None) -> None:
    log = nl.parse(f"{prefix}n1:70:71 [3] NCCL INFO Bootstrap : Using eth0:10.1.0.7<0>")
    info = log.ranks[key]
    assert (info.rank, info.label, info.bootstrap[0].name) == (rank, label, "eth0")


@pytest.mark.parametrize("name, address, reason", [
    ("lo", "127.0.0.1<0>", "loopback"), ("eno9", "127.0.1.1<0>", "loopback"),
    ("docker0", "172.17.0.1<0>", "Docker bridge"), ("br-3f2a1b9c", "172.18.0.1<0>", "Docker bridge"),
    ("virbr0", "192.168.122.1<0>", "libvirt bridge"),
    ("veth75fa783", "fe80::14ad:64ff:fe64:b31e%veth75fa783<0>", "container veth pair"),
    ("eth0", "10.0.0.1<0>", None), ("ibp65s0", "172.18.37.23<0>", None), ("bond0", "10.8.0.21<0>", None),
])
def test_bad_interface_reason(name: str, address: str, reason: str | None) -> None:
    assert nl.bad_interface_reason(nl.Iface(name, address)) == reason


TWO_HOSTS = ("a:1:1 [0] NCCL INFO Bootstrap : Using ens5:10.0.0.1<0>\n"
             "b:2:2 [0] NCCL INFO Bootstrap : Using ens5:10.0.0.2<0>\n")


def test_veth_second_in_socket_list_fails_multinode() -> None:
    # NCCL uses every listed NET/Socket device (the list format of pytorch/pytorch#68893)
    text = TWO_HOSTS + ("a:1:1 [0] NCCL INFO NET/Socket : Using [0]ens5:10.0.0.1<0> "
                        "[1]veth75fa783:fe80::14ad:64ff:fe64:b31e%veth75fa783<0>\n")
    v = {v.id: v for v in nl.interpret(nl.parse(text))}["bad-interface"]
    assert v.status == "FAIL" and "NET/Socket on veth75fa783" in v.title and v.values["hosts"] == ["a"]


def test_docker0_and_same_address_on_two_hosts() -> None:
    text = ("a:1:1 [0] NCCL INFO NCCL_SOCKET_IFNAME set by environment to docker0\n"
            "a:1:1 [0] NCCL INFO Bootstrap : Using docker0:172.17.0.1<0>\n"
            "b:2:2 [0] NCCL INFO Bootstrap : Using cni0:10.244.0.1<0>\n"
            "c:3:3 [0] NCCL INFO Bootstrap : Using cni0:10.244.0.1<0>\n")
    v = {v.id: v for v in nl.interpret(nl.parse(text))}["bad-interface"]
    assert "docker0 (Docker bridge)" in v.title and "advertised by 2 hosts" in v.title
    assert v.values["hosts"] == ["a", "b", "c"] and "set to docker0" in v.remediation


def test_loopback_on_one_node_is_only_info() -> None:
    text = ("a:1:1 [0] NCCL INFO Bootstrap : Using lo:127.0.0.1<0>\n"
            "a:1:1 [0] NCCL INFO comm 0x1 rank 0 nRanks 2 nNodes 1 localRanks 2 localRank 0 MNNVL 0\n")
    v = {v.id: v for v in nl.interpret(nl.parse(text))}["bad-interface"]
    assert v.status == "INFO"


def test_connect_retry_then_complete_is_transient_warn() -> None:
    text = TWO_HOSTS + (
        "b:2:2 [0] NCCL INFO socketPollConnect: connect to 10.0.0.1<4000> returned Connection refused, "
        "retrying (1/34) after sleep for 100 msec\n"
        "a:1:1 [0] NCCL INFO comm 0x1 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE\n"
        "b:2:2 [0] NCCL INFO comm 0x2 rank 1 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE\n")
    found = {v.id: v for v in nl.interpret(nl.parse(text))}
    assert found["connect-failed"].status == "WARN" and "transient" in found["connect-failed"].title
    assert "10.0.0.1:4000 (advertised by a)" in found["connect-failed"].title


def test_pre_init_lines_of_another_cuda_dev_fold_into_the_process() -> None:
    # Bootstrap printed before torch.cuda.set_device (dev 0), the rest on dev 1: one rank, not a stuck one
    text = ("a:1:1 [0] NCCL INFO Bootstrap : Using ens5:10.0.0.1<0>\n"
            "a:1:9 [1] NCCL INFO comm 0x1 rank 1 nranks 2 cudaDev 1 busId 2000 - Init COMPLETE\n"
            "a:2:8 [0] NCCL INFO comm 0x2 rank 0 nranks 2 cudaDev 0 busId 1000 - Init COMPLETE\n")
    log = nl.parse(text)
    assert list(log.ranks) == ["a:1[1]", "a:2[0]"] and log.ranks["a:1[1]"].bootstrap[0].name == "ens5"
    assert not [v for v in nl.interpret(log) if v.status != "INFO"]


def test_warn_lines_are_kept() -> None:
    text = "a:1:1 [0] enqueue.cc:100 NCCL WARN Cuda failure 'out of memory'\n"
    log = nl.parse(text)
    assert log.ranks["a:1[0]"].warns == [text.strip()]
    (v,) = [v for v in nl.interpret(log) if v.id.startswith("nccl.cuda-")]
    assert "out of memory" in v.title and v.status == "FAIL" and v.values["kind"] == "cause"
    assert v.source.startswith("https://github.com/NVIDIA/nccl/blob/")       # the site that prints it
    unknown = "a:1:1 [0] x.cc:1 NCCL WARN a message no NCCL release prints\n"
    assert {v.id for v in nl.interpret(nl.parse(unknown))} >= {"other-warnings"}


# ----------------------------------------------------------------------------- bad input, CLI

def test_no_nccl_lines_names_the_source(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(ValueError, match=r"<text>: no NCCL lines"):
        nl.parse("just\nsome text\n")
    empty = tmp_path / "train.out"
    empty.write_text("epoch 1 loss 0.3\n")
    with pytest.raises(ValueError, match="train.out: no NCCL lines"):
        nl.parse_files([empty])
    assert cli.main(["nccl-log", str(empty)]) == 2
    assert "train.out: no NCCL lines" in capsys.readouterr().err


def test_missing_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    missing = tmp_path / "nope.log"
    with pytest.raises(ValueError, match="nope.log: cannot read"):
        nl.parse_files([missing])
    assert cli.main(["nccl-log", str(missing)]) == 2
    assert "nope.log: cannot read the log" in capsys.readouterr().err


def test_bad_arguments() -> None:
    with pytest.raises(ValueError, match="text"):
        nl.parse(b"bytes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="log"):
        nl.interpret("not a log")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="status='BAD'"):
        nl.verdict("x", "BAD", "m")
    with pytest.raises(ValueError, match="kind='maybe'"):
        nl.verdict("x", "WARN", "m", kind="maybe")
    with pytest.raises(ValueError, match="paths"):
        nl.parse_files([])


def test_json_output(capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["nccl-log", str(DATA / "mn1_stuck_host.log"), "--json"]) == 1
    data = json.loads(capsys.readouterr().out)
    assert data["log"]["topology"] == "multi-node" and set(data["log"]["ranks"]) == {
        "node-a:1201[0]", "node-a:1202[1]", "node-b:3377[0]", "node-b:3378[1]"}
    assert data["log"]["ranks"]["node-a:1201[0]"]["connections"]["0->1"] == ["P2P/CUMEM/read"]
    (v,) = [v for v in data["checks"] if v["id"] == "init-incomplete"]
    assert v["values"]["hosts"] == ["node-b"] and v["status"] == "FAIL"


def test_several_files_make_one_job(capsys: pytest.CaptureFixture[str]) -> None:
    files = [str(DATA / "ib_fallback_socket.log"), str(DATA / "healthy_multinode_ib.log")]
    log = nl.parse_files(files)
    assert len(log.ranks) == 6 and log.sources == files


def test_render_rows_and_verdict_lines() -> None:
    log = load("connect_no_route.log")
    vs = nl.interpret(log)
    text = nl.render(log, vs)
    lines = text.splitlines()
    for key in log.ranks:
        assert sum(line.startswith(key + " ") for line in lines) == 1
    v = vs[0]
    assert v.line() in text and f"[{v.status}] {v.id} @node5: {v.title}" in lines
    assert nl.render(load("healthy_multinode_ib.log"), []).rstrip().endswith("[OK] no finding")


def test_long_lines_stay_fast() -> None:
    t0 = time.monotonic()
    for junk in ("x" * 1_000_000, "NCCL INFO Bootstrap : Using " + "y" * 1_000_000,
                 "NCCL " + "comm 0x1 rank 1 nranks 2 " * 40_000, "[rank1]:" * 100_000 + "NCCL INFO z"):
        try:
            nl.parse(junk)
        except ValueError:
            pass
    assert time.monotonic() - t0 < 5.0


def test_runbook_cli_wires_nccl_log(capsys):
    from helpers import cli

    data = Path(__file__).parents[1] / "data" / "nccl"
    assert cli.main(["nccl-log", str(data / "single_node_net_ib.log")]) == 1
    assert "[FAIL] single-node-net-transport" in capsys.readouterr().out
    assert cli.main(["nccl-log", str(data / "healthy_multinode_ib.log")]) == 0


def test_one_node_p2p_then_timeout_names_the_acs_suspect() -> None:
    """Gilbreth 6.3 on PCIe A100s: P2P channels, Init COMPLETE, a watchdog timeout: PCIe ACS / IOMMU, as a suspect."""
    log = load("gilbreth_6_3_p2p_hang.log")
    assert log.topology() == "single-node" and all(r.completed for r in log.ranks.values())
    found = {v.id: v for v in nl.interpret(log)}
    v = found["p2p-acs-hang"]
    assert v.status == "FAIL" and v.values["kind"] == "suspect" and v.title.startswith("suspect:")
    assert "ACS" in v.title and "IOMMU" in v.title and v.node == "gpu-node-07"
    for command in ("nvidia-smi topo -p2p r", "lspci -vvv | grep ACSCtl", "NCCL_P2P_DISABLE=1"):
        assert command in v.remediation
    assert v.source.endswith("#pci-access-control-services-acs")
    assert found["torch-watchdog-timeout"].status == "INFO"          # explained by the suspect above
    assert not [x for x in found.values() if x.status in ("FAIL", "WARN") and x.id != "p2p-acs-hang"]
    # the same channels without a timeout: nothing to suspect
    healthy = nl.parse("\n".join(line for line in (DATA / "gilbreth_6_3_p2p_hang.log").read_text().splitlines()
                                 if "Watchdog" not in line))
    assert "p2p-acs-hang" not in {x.id for x in nl.interpret(healthy)}


def test_every_nccl_variable_a_fix_names_exists_in_nccl() -> None:
    """Fixes only name NCCL_* variables that some NCCL release (2.18..latest) reads (NCCL_NET_DISABLE does not exist)."""
    from helpers.nccl_log import catalog, model, rules

    known = set(nl.load_sites()["header"]["env_vars"])
    assert "NCCL_NET_DISABLE_INTRA" in known and "NCCL_NET_DISABLE" not in known
    texts = [model.GILBRETH_SINGLE_NODE_FIX] + [e["fix"] for e in nl.load_catalog()]
    texts += [k[6] for k in catalog.KNOWLEDGE] + [c[3] for c in catalog.CUDA_ERRORS]
    texts += [b["workaround"] for b in nl.load_versions()]
    texts.append(Path(rules.__file__).read_text())
    named = {m for text in texts for m in re.findall(r"\bNCCL_[A-Z0-9_]*[A-Z0-9]\b", text)}
    assert named - known == set()


# ------------------------------------------------------------------------------- the reader's plan per distinct line

def test_plan_of_a_line_comes_from_its_text_alone() -> None:
    """What ``_Parser._plan`` makes of one line: skip, nccl-tests summary, a non-NCCL catalog line, or an NCCL line
    with the memo table and key of its head's rank, its events, and what a second reading for the same rank replays."""
    from helpers.nccl_log import reading

    p = reading._Parser()
    for blank in ("", "   ", "# a comment", "  # an indented comment"):
        assert p._plan(blank) == (reading._SKIP,)
    assert p._plan("# Avg bus bandwidth    : 1.23") == (reading._SUMMARY,)

    what, cache, hkey, cut, events, extra, parsed, bare, replay, done = p._plan(
        "host:1:2 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>")
    assert (what, hkey, extra, done) == (reading._NCCL, "host:1:2 [0", None, [None, None, None, None])
    assert cache is p._rank_of_pre and parsed[0] == ("host", 1, 0) and parsed[4] == "host:1[0]"
    assert [e[0] for e in events] == [e[0] for e in replay] == ["bootstrap"]     # an assignment: replayed
    channel = p._plan("host:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/IPC")
    assert [e[0] for e in channel[4]] == ["channel"] and channel[8] == () and channel[7] == ("rank0", False)

    warn = p._plan("host:1:2 [0] misc/socket.cc:483 NCCL WARN socketStartConnect: Connect to 10.0.0.2<45763> failed"
                   " : Connection refused")
    assert warn[1] is p._rank_of and warn[2] == "host:1:2 [0] misc/socket.cc:483 "   # the head keeps the source
    again, last_error, is_warn, says_using, hit, site, line = warn[5]
    assert (again, last_error, is_warn, says_using) == (0, False, True, False) and isinstance(site, int)
    assert [e[0] for e in warn[4]] == ["connect"]

    using = p._plan("host:1:2 [0] NCCL INFO NET/Socket : Using  # reconstructed: the list wrapped")
    assert using[5][0] == 1 and using[5][3] is True and using[5][6] == "host:1:2 [0] NCCL INFO NET/Socket : Using"
    bare = p._plan("NCCL version 2.19.3+cuda12.3")
    assert bare[2] == "" and bare[6][0] is None and bare[7] == (None, True)    # no head: the previous line's rank

    other = p._plan("[rank3]: Cuda failure 802 'system not yet initialized'")
    assert other[0] == reading._OTHER and other[6] == "cuda-802-fabric-manager" and other[7] is None


def test_parse_head_reads_prefix_and_labels() -> None:
    """A head: NCCL's prefix alone (the short path), with torchrun's rank or local label before it, or a host label."""
    from helpers.nccl_log.reading import _parse_head

    assert _parse_head("gpu-a01:41021:41107 [3] ") == (("gpu-a01", 41021, 3), None, None, None, "gpu-a01:41021[3]")
    assert _parse_head("gpu-a01:41021:41107 [3] init.cc:497 ")[4] == "gpu-a01:41021[3]"
    assert _parse_head("[rank5]:gpu-a01:41021:41107 [3] ")[:2] == (("gpu-a01", 41021, 3), 5)
    assert _parse_head("[default1]:gpu-a01:41021:41107 [3] ")[2] == "default1"
    assert _parse_head("[rank 2] ") == (None, 2, None, None, None)
    assert _parse_head("node7: ") == (None, None, None, "node7", None)


def test_a_line_read_again_counts_as_if_read_fresh(monkeypatch: pytest.MonkeyPatch) -> None:
    """The plan table and its shortcuts for a line read again change nothing: every log of tests/data/nccl read twice
    over (so lines repeat for the same ranks) gives the same log with plans never kept (``_PLAN_LINE_MAX`` -1: every
    line read afresh, the reader before the plans), kept, or kept three at a time (the table starts again every third
    line); and so with memo tables of two entries (the rank tables start again, and the plans with them)."""
    from helpers.nccl_log import reading

    def read(text: str) -> str:
        try:
            return repr(nl.parse(text * 2))
        except ValueError as exc:     # no NCCL line in it
            return str(exc)

    texts = [f.read_text(errors="replace") for f in sorted(DATA.rglob("*.log"))]
    # one process printed under two torchrun labels: the rank follows the label of the latest head read afresh
    texts.append("".join(f"[rank{r}]:h:1:1 [0] NCCL INFO Bootstrap : Using eth0:10.0.0.1<0>\n"
                         f"h:{r + 2}:1 [0] NCCL INFO cudaDriverVersion 12030\n" for r in (0, 1, 0, 2, 0)))
    for memo_max in (reading._MEMO_MAX, 2):
        monkeypatch.setattr(reading, "_MEMO_MAX", memo_max)
        monkeypatch.setattr(reading, "_PLAN_LINE_MAX", -1)
        fresh = [read(t) for t in texts]
        assert sum("RankInfo(" in r for r in fresh) > 60
        for plan_max in (16384, 3):
            monkeypatch.setattr(reading, "_PLAN_LINE_MAX", 512)
            monkeypatch.setattr(reading, "_PLAN_MAX", plan_max)
            assert [read(t) for t in texts] == fresh, (memo_max, plan_max)
