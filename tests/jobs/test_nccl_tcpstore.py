"""The NCCL log reader on real TCPStore failures, made here with torch on CPU (a real store: the jobs layer)."""

from __future__ import annotations

import pytest

from helpers import nccl_log as nl

REAL_RUNS = {"tcpstore-client-timeout", "tcpstore-port-in-use", "tcpstore-clients-missing"}


def test_tcpstore_failures_are_read() -> None:
    """Real TCPStore failures (torch on CPU): a client with no server, a port in use, a missing client."""
    import datetime
    import socket

    from torch.distributed import TCPStore

    texts = []
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    with pytest.raises(Exception) as client:
        TCPStore("127.0.0.1", free, 2, False, timeout=datetime.timedelta(seconds=0.1))
    texts.append(str(client.value))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        with pytest.raises(Exception) as server:
            TCPStore("127.0.0.1", s.getsockname()[1], 2, True, timeout=datetime.timedelta(seconds=0.1))
    texts.append(str(server.value))
    with pytest.raises(Exception) as waiting:
        TCPStore("127.0.0.1", 0, 2, True, timeout=datetime.timedelta(seconds=0.1), wait_for_workers=True)
    texts.append(str(waiting.value))
    found = {v.id: v for v in nl.interpret(nl.parse("\n".join(texts)))}
    assert REAL_RUNS <= set(found), [v.line() for v in found.values()]
    assert all(found[i].status == "FAIL" and found[i].remediation for i in REAL_RUNS)
    assert "nc -zv MASTER_ADDR MASTER_PORT" in found["tcpstore-client-timeout"].remediation


def test_an_unresolvable_store_host_is_named(capfd) -> None:
    """A real client whose store host does not resolve (RFC 6761 .invalid): c10d's own warning (socket.cpp, written
    to the process's stderr) is read as the cause, beside the timeout it ends in."""
    import datetime

    from torch.distributed import TCPStore

    with pytest.raises(Exception) as client:
        TCPStore("no-such-host.invalid", 29999, 2, False, timeout=datetime.timedelta(seconds=0.1))
    text = capfd.readouterr().err + "\n" + str(client.value)
    found = {v.id: v for v in nl.interpret(nl.parse(text))}
    host = found["rendezvous-host-unresolvable"]
    assert host.status == "FAIL" and "getent hosts" in host.remediation, text[:2000]
    assert "cannot be retrieved (gai error" in host.evidence[0]
