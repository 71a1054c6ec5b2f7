"""helpers.hostinfo's port checks on real sockets of this machine: a held port, TIME_WAIT vs TCPStore, free ports."""

from __future__ import annotations

import os
import socket
import time
from datetime import timedelta

import psutil
import pytest
from support import record_by_id as _by_id

from helpers import hostinfo
from helpers.allocation.local import host_checks
from helpers.hostinfo import free_port, port_free


def test_held_port_is_busy_then_free():
    holder = socket.socket()
    holder.bind(("127.0.0.1", 0))
    holder.listen()
    port = holder.getsockname()[1]
    try:
        assert port_free(port) is False
        rec = _by_id(host_checks({"MASTER_PORT": str(port)}))["host.port"]
        assert rec["status"] == "WARN"
        assert rec["values"]["port"] == port and rec["values"]["port_from"] == "MASTER_PORT"
        assert any(h["pid"] == os.getpid() and h["status"] == "LISTEN" for h in rec["values"]["holders"])
        assert f"pid {os.getpid()}" in rec["title"]
        assert "--master-port" in rec["remediation"] and "localhost:0" in rec["remediation"]
        assert "D4" in rec["source"]
    finally:
        holder.close()
    assert port_free(port) is True
    rec = _by_id(host_checks({"MASTER_PORT": str(port)}))["host.port"]
    assert rec["status"] == "OK" and rec["remediation"] == ""
    assert isinstance(rec["values"]["ephemeral_port"], int)


def test_master_port_argument_used_when_env_unset():
    port = free_port()
    rec = _by_id(host_checks({}, master_port=port))["host.port"]
    assert rec["values"]["port"] == port and rec["values"]["port_from"] == "argument"


def _time_wait_port(listener_reuse: bool) -> int:
    """A port whose server side is in TIME_WAIT (the server closes first), listener with/without SO_REUSEADDR."""
    srv = socket.socket()
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, int(listener_reuse))
    srv.bind(("0.0.0.0", 0))
    srv.listen()
    port = srv.getsockname()[1]
    cli = socket.create_connection(("127.0.0.1", port))
    conn, _ = srv.accept()
    conn.close()
    time.sleep(0.1)
    cli.close()
    srv.close()
    time.sleep(0.1)
    states = {c.status for c in psutil.net_connections("tcp") if c.laddr and c.laddr.port == port}
    assert psutil.CONN_TIME_WAIT in states
    return port


def _tcpstore_binds(port: int) -> bool:
    dist = pytest.importorskip("torch.distributed")
    try:
        store = dist.TCPStore("127.0.0.1", port, 1, True, timeout=timedelta(seconds=5))
    except Exception as exc:  # DistNetworkError: "Address already in use"
        assert "already in use" in str(exc).lower() or "EADDRINUSE" in str(exc)
        return False
    del store
    return True


@pytest.mark.parametrize("listener_reuse", [True, False], ids=["reuseaddr-listener", "plain-listener"])
def test_time_wait_port_verdict_matches_tcpstore(listener_reuse):
    port = _time_wait_port(listener_reuse)
    verdict = port_free(port)
    assert verdict is listener_reuse  # TIME_WAIT blocks only when the old socket lacked SO_REUSEADDR
    assert _tcpstore_binds(_time_wait_port(listener_reuse)) is verdict


def test_free_port_is_bindable():
    assert port_free(free_port(), "127.0.0.1")


def test_free_ports_are_distinct_and_bindable():
    ports = hostinfo.free_ports(3)
    assert len(set(ports)) == 3 and all(port_free(p, "127.0.0.1") for p in ports)
