"""Tests of helpers.hostinfo: real interfaces, real sockets, real /dev/shm, a real network namespace."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil
import pytest

from helpers import hostinfo
from helpers.allocation import local
from helpers.allocation.local import host_checks
from helpers.checks import Check
from helpers.hostinfo import interfaces, interfaces_from_sysfs, port_free, shm_info
from helpers.ifnames import match as match_ifname
from helpers.ifnames import parse as parse_socket_ifname

REPO = Path(__file__).resolve().parents[2]


def _by_id(records: list[Check]) -> dict[str, dict[str, Any]]:
    return {r.id: r.to_dict() for r in records}


# ---------------------------------------------------------------- interfaces / shm


def test_interfaces_lists_loopback():
    lo = {i["name"]: i for i in interfaces()}["lo"]
    assert lo["mtu"] == 65536
    assert "127.0.0.1/8" in lo["ipv4"]
    assert lo["loopback"] and lo["up"] and lo["state"] in ("UNKNOWN", "UP")


def test_interfaces_agrees_with_psutil():
    ours = {i["name"]: i["mtu"] for i in interfaces()}
    theirs = {name: st.mtu for name, st in psutil.net_if_stats().items()}
    assert ours == theirs


def test_interfaces_without_ip_reads_sysfs(monkeypatch, tmp_path):
    """GPU images often lack iproute2 (this project's H200 machine had no `ip`): the same records from sysfs."""
    with_ip = interfaces()
    monkeypatch.setenv("PATH", str(tmp_path))  # an empty directory: no `ip` anywhere
    assert interfaces() == with_ip  # names, order, flags, operstate, MTU, link type, addresses


def test_interfaces_from_sysfs_unreadable_root_raises(tmp_path):
    with pytest.raises(OSError):
        interfaces_from_sysfs(tmp_path / "missing")


def test_shm_info_matches_psutil():
    info = shm_info()
    usage = psutil.disk_usage("/dev/shm")
    assert info["path"] == "/dev/shm"
    assert info["total_bytes"] == usage.total > 0
    assert 0 <= info["free_bytes"] <= info["total_bytes"]


def test_shm_info_missing_path_raises(tmp_path):
    with pytest.raises(FileNotFoundError):
        shm_info(str(tmp_path / "nope"))


def test_host_shm_record_grades_measured_size():
    rec = _by_id(host_checks({}))["host.shm"]
    total, free = rec["values"]["total_bytes"], rec["values"]["free_bytes"]
    if total < local.SHM_FAIL_BYTES:
        assert rec["status"] == "FAIL"
    elif total < local.SHM_WARN_BYTES or free < local.SHM_WARN_BYTES:
        assert rec["status"] == "WARN"
        assert "--shm-size" in rec["remediation"] or "/dev/shm" in rec["remediation"]
    else:
        assert rec["status"] == "OK" and rec["remediation"] == ""
    assert "nvidia.com" in rec["source"]


# ---------------------------------------------------------------- ports


def test_bad_master_port_in_env_is_a_fail_record():
    rec = _by_id(host_checks({"MASTER_PORT": "http"}))["host.port"]
    assert rec["status"] == "FAIL" and "MASTER_PORT" in rec["title"]


@pytest.mark.parametrize("bad", [0, 65536, -1, "29500", 29500.0, True])
def test_port_validation_names_port(bad):
    with pytest.raises(ValueError, match="port"):
        port_free(bad)


def test_host_checks_bad_master_port_names_field():
    with pytest.raises(ValueError, match="master_port"):
        host_checks({}, master_port=70000)


@pytest.mark.parametrize("count", [0, -1, 1.5, True, "2"])
def test_free_ports_bad_count_names_the_field(count):
    with pytest.raises(ValueError, match="count"):
        hostinfo.free_ports(count)


# ---------------------------------------------------------------- *_SOCKET_IFNAME parsing and matching


@pytest.mark.parametrize(
    "value, flavor, exclude, exact, names, supported",
    [
        ("eth", "nccl", False, False, ["eth"], True),
        ("^docker,lo", "nccl", True, False, ["docker", "lo"], True),
        ("=eth0", "nccl", False, True, ["eth0"], True),
        ("^=docker0", "nccl", True, True, ["docker0"], True),
        ("eth0:1,ib", "nccl", False, False, ["eth0", "ib"], True),
        ("e", "nccl", False, False, [], True),
        ("eth0,lo", "gloo", False, True, ["eth0", "lo"], True),
        ("lo,", "gloo", False, True, ["lo"], True),
        ("^docker0", "gloo", False, True, ["^docker0"], False),
        ("=lo", "gloo", False, True, ["=lo"], False),
        (",lo", "gloo", False, True, ["", "lo"], False),
    ],
)
def test_parse_socket_ifname_table(value, flavor, exclude, exact, names, supported):
    spec = parse_socket_ifname(value, flavor)
    assert set(spec) == {"exclude", "exact", "names", "supported", "note"}
    assert (spec["exclude"], spec["exact"], spec["names"], spec["supported"]) == (exclude, exact, names, supported)
    assert isinstance(spec["note"], str) and spec["note"]


def test_gloo_caret_note_names_the_error():
    assert "Unable to find address for: ^docker0" in parse_socket_ifname("^docker0", "gloo")["note"]


def test_bad_flavor_names_field_and_values():
    with pytest.raises(ValueError, match=r"flavor.*nccl.*gloo"):
        parse_socket_ifname("eth0", "mpi")


def _iface(name: str, ipv4: list[str], up: bool = True, loopback: bool = False) -> dict[str, Any]:
    return {"name": name, "state": "UP" if up else "DOWN", "mtu": 1500, "flags": [], "link_type": "ether",
            "loopback": loopback, "up": up, "ipv4": ipv4, "ipv6": []}


IFACES = [_iface("lo", ["127.0.0.1/8"], loopback=True), _iface("eth0", ["10.0.0.2/24"]),
          _iface("eth10", ["10.1.0.2/24"]), _iface("docker0", ["172.17.0.1/16"]), _iface("ib0", [])]


@pytest.mark.parametrize(
    "value, flavor, expected",
    [
        ("eth", "nccl", ["eth0", "eth10"]),
        ("=eth1", "nccl", []),
        ("eth1", "nccl", ["eth10"]),
        ("^docker,lo", "nccl", ["eth0", "eth10"]),
        ("^=eth0", "nccl", ["lo", "eth10", "docker0"]),
        ("ib", "nccl", []),  # ib0 has no address: NCCL and gloo skip it
        ("eth0,lo", "gloo", ["lo", "eth0"]),
        ("eth", "gloo", []),
        ("^docker0", "gloo", []),
    ],
)
def test_match_ifname(value, flavor, expected):
    assert match_ifname(parse_socket_ifname(value, flavor), IFACES) == expected


# ---------------------------------------------------------------- host.socket_ifname / host.interfaces on this host


def test_gloo_ifname_missing_interface_fails_with_autodetect_advice():
    rec = _by_id(host_checks({"GLOO_SOCKET_IFNAME": "ibp65s0"}))["host.socket_ifname"]
    assert rec["status"] == "FAIL"
    assert "Unable to find address for: ibp65s0" in rec["title"]
    assert "auto-detect" in rec["remediation"]
    assert rec["values"]["GLOO_SOCKET_IFNAME"]["matched"] == []


def test_gloo_ifname_lo_single_node_ok():
    rec = _by_id(host_checks({"GLOO_SOCKET_IFNAME": "lo"}))["host.socket_ifname"]
    assert rec["status"] == "OK" and rec["remediation"] == ""
    assert rec["values"]["GLOO_SOCKET_IFNAME"]["matched"] == ["lo"]


def test_gloo_ifname_lo_multi_node_warns():
    env = {"GLOO_SOCKET_IFNAME": "lo", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}
    rec = _by_id(host_checks(env))["host.socket_ifname"]
    assert rec["status"] == "WARN" and "loopback" in rec["title"]
    assert _by_id(host_checks({"GLOO_SOCKET_IFNAME": "lo", "SLURM_JOB_NUM_NODES": "2"}))["host.socket_ifname"]["status"] == "WARN"


def test_gloo_caret_fails_and_nccl_caret_is_fine():
    rec = _by_id(host_checks({"GLOO_SOCKET_IFNAME": "^docker0", "NCCL_SOCKET_IFNAME": "^docker0"}))["host.socket_ifname"]
    assert rec["status"] == "FAIL"
    assert rec["values"]["GLOO_SOCKET_IFNAME"]["spec"]["supported"] is False
    assert "lo" in rec["values"]["NCCL_SOCKET_IFNAME"]["matched"]


def test_nccl_ifname_no_match_fails():
    rec = _by_id(host_checks({"NCCL_SOCKET_IFNAME": "=ibp65s0"}))["host.socket_ifname"]
    assert rec["status"] == "FAIL" and "no socket interface found" in rec["title"]


def test_unset_ifname_is_ok():
    rec = _by_id(host_checks({}))["host.socket_ifname"]
    assert rec["status"] == "OK" and "auto-detect" in rec["title"]
    rec = _by_id(host_checks({"NCCL_SOCKET_IFNAME": "e", "GLOO_SOCKET_IFNAME": "x"}))["host.socket_ifname"]
    assert rec["status"] == "OK"  # one character: both libraries ignore it and auto-detect
    assert rec["values"]["GLOO_SOCKET_IFNAME"]["matched"] == [] and "auto" in rec["title"]


def test_record_shape():
    records = host_checks({})
    assert all(type(r) is Check for r in records)
    assert [r.id for r in records] == ["host.port", "host.shm", "host.interfaces", "host.socket_ifname", "host.jit_lock"]
    for rec in records:
        assert rec.status in ("OK", "INFO", "WARN", "FAIL") and rec.source
        assert (rec.remediation == "") == (rec.status == "OK")
        json.dumps(rec.to_dict())  # plain data
    lo = [i for i in _by_id(records)["host.interfaces"]["values"]["interfaces"] if i["name"] == "lo"]
    assert lo and lo[0]["mtu"] == 65536


# ---------------------------------------------------------------- host.jit_lock: torch's JIT build lock (PF-jit-lock)

def _lock(root, age_s, op="deepspeed_shm_comm"):
    folder = root / op
    folder.mkdir(parents=True)
    lock = folder / "lock"
    lock.touch()
    t = time.time() - age_s
    os.utime(lock, (t, t))
    return lock


def test_stale_build_lock_is_a_fail_naming_the_file(tmp_path):
    ext = tmp_path / "ext"
    lock = _lock(ext, local.STALE_BUILD_LOCK_S + 60)
    env = {"TORCH_EXTENSIONS_DIR": str(ext), "HOME": str(tmp_path / "home")}
    found = hostinfo.build_locks(hostinfo.extension_roots(env))
    assert [f["path"] for f in found] == [str(lock)] and found[0]["age_s"] >= local.STALE_BUILD_LOCK_S
    rec = _by_id(host_checks(env))["host.jit_lock"]
    assert rec["status"] == "FAIL" and str(lock) in rec["title"] and f"rm {lock}" in rec["remediation"]


def test_young_lock_or_running_build_is_info_and_no_lock_is_ok(tmp_path):
    home = tmp_path / "home"
    env = {"TORCH_EXTENSIONS_DIR": str(tmp_path / "none"), "HOME": str(home)}
    assert _by_id(host_checks(env))["host.jit_lock"]["status"] == "OK"
    # torch's default root: ~/.cache/torch_extensions/<py>_<accelerator>/<op>/lock
    loading = _lock(home / ".cache" / "torch_extensions" / "py311_cpu", 5, op="loading_now")
    assert _by_id(host_checks(env))["host.jit_lock"]["status"] == "OK"  # a load holds it for a moment
    young = _lock(home / ".cache" / "torch_extensions" / "py311_cpu", local.BUSY_BUILD_LOCK_S + 5)
    rec = _by_id(host_checks(env))["host.jit_lock"]
    assert rec["status"] == "INFO" and str(young) in rec["title"] and str(loading) not in rec["title"]
    old = _lock(tmp_path / "ext", local.STALE_BUILD_LOCK_S * 2)
    builder = subprocess.Popen(["sleep", "30"], cwd=old.parent)  # a build in progress works in that folder
    try:
        env["TORCH_EXTENSIONS_DIR"] = str(tmp_path / "ext")
        rec = _by_id(host_checks(env))["host.jit_lock"]
        locks = {lk["path"]: lk for lk in rec["values"]["locks"]}
        assert builder.pid in locks[str(old)]["builders"] and rec["status"] == "INFO"
    finally:
        builder.kill()
        builder.wait()


def test_smoke_is_not_started_on_a_stale_lock(tmp_path, monkeypatch):
    monkeypatch.setenv("TORCH_EXTENSIONS_DIR", str(tmp_path / "ext"))
    assert local.stale_lock_failure("smoke.03", "DeepSpeed smoke") is None
    lock = _lock(tmp_path / "ext", local.STALE_BUILD_LOCK_S + 1)
    rec = local.stale_lock_failure("smoke.03", "DeepSpeed smoke")
    assert rec.status == "FAIL" and rec.id == "smoke.03" and "not run" in rec.title and rec.evidence == [str(lock)]
    check, job = local.run_smoke("03", tmp_path, nproc=2, backend="gloo", steps=1, hidden=8, batch=2, timeout_s=5)
    assert job is None and check.status == "FAIL" and str(lock) in check.title


def test_cpu_contention_reads_the_kernel_pressure_counter(tmp_path):
    """PSI: a file in the kernel's format is parsed; without PSI, None; on this host, busy processes beyond the CPUs
    raise the share of time a task waited for a CPU (measured, not assumed)."""
    fake = tmp_path / "cpu"
    fake.write_text("some avg10=1.00 avg60=0.50 avg300=0.10 total=123456\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
    assert hostinfo.cpu_pressure_us(str(fake)) == 123456
    assert hostinfo.cpu_pressure_us(str(tmp_path / "absent")) is None
    assert hostinfo.cpu_contention(None, 1.0, str(fake)) is None
    assert hostinfo.cpu_contention(123456 - 500_000, 1.0, str(fake)) == 0.5
    if hostinfo.cpu_pressure_us() is None:
        pytest.skip("this kernel has no /proc/pressure/cpu")
    busy: list[subprocess.Popen] = []
    try:  # started inside the try: a failed start still kills the ones already running
        for _ in range((os.cpu_count() or 1) * 2):
            busy.append(subprocess.Popen([sys.executable, "-c", "while True: pass"], start_new_session=True))
        start, t0 = hostinfo.cpu_pressure_us(), time.monotonic()
        time.sleep(1.5)
        share = hostinfo.cpu_contention(start, time.monotonic() - t0)
    finally:
        for p in busy:
            p.kill()
        for p in busy:
            p.wait(timeout=10)
    assert all(p.returncode is not None for p in busy)
    assert share is not None and share > 0.5, share
