"""How deep the allocation check goes: ``--tier prolog`` (seconds, on one node), ``quick`` (today's check), ``full``.

Not :mod:`helpers.tiers` (the hardware tiers of notebook cells: ``tier-gpu``, ``tier-multinode``); these are the
depths of ``runbook diagnose`` and where each one runs:

=========  =====================================================  ====================================================
tier       what runs                                              where it fits
=========  =====================================================  ====================================================
prolog     this node only, no job, no collective: the node        SLURM's ``HealthCheckProgram`` (slurmd kills it after
           contract (GPUs, data NIC up with an address, its       60 s) and ``Prolog`` (seconds, shared with the job's
           MTU and a don't-fragment ping of that size to a        start): ``configs/slurm/healthcheck.sh``,
           peer, mounts, versions); at most :data:`PROLOG_BUDGET_S` ``configs/slurm/prolog.sh``, ``runbook health-check``
quick      today's check (notebook 00: per-node steps, the job    ``runbook diagnose`` in a new allocation (minutes)
           over every node, the node pairs, the smoke test) and
           the group-testing localisation (:mod:`.localise`)
full       quick + the network pre-flight, the long runs (a 1    a maintenance window, a node back from repair
           GiB busbw sweep, 500-step smoke tests)
=========  =====================================================  ====================================================

HealthCheckProgram: "This program will be killed if it does not terminate normally within 60 seconds ... Any action
to be taken must be explicitly performed by the program (e.g. execute ``scontrol update NodeName=foo State=drain
Reason=...``)" (https://slurm.schedmd.com/slurm.conf.html#OPT_HealthCheckProgram).  Prolog: "If the Prolog fails
(returns a non-zero exit code), this will result in the node being set to a DRAIN state"
(https://slurm.schedmd.com/prolog_epilog.html): so a prolog that breaks on its own must exit 0.
:func:`health_check` drains only for a ``node_problem`` (:mod:`.operators`); a contract it cannot read, a tool
that is missing or a check that raises is a ``tool_error`` WARN, never a drain.

The contract is a JSON file (``configs/slurm/node_contract.json``); every key is optional::

    {"gpus": 8, "iface": "ib0", "mtu": 4092, "mtu_peer": "10.0.0.1", "mounts": ["/shared"],
     "versions": {"python": "3.11", "torch": "2.13.0", "driver": "580."}}
"""

from __future__ import annotations

import dataclasses
import importlib.metadata
import json
import os
import platform
import re
import socket
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from helpers import hostinfo, preflight
from helpers.allocation import operators
from helpers.checks import Check
from helpers.slurm import LocalSlurm, SlurmClient, ThisHost

TIERS = ("prolog", "quick", "full")
PROLOG_BUDGET_S = 10.0
"""The prolog tier's time on one node, seconds (issue 23): a Prolog delays the job's start by this much."""

TIER_PARAMS: Mapping[str, Mapping[str, Any]] = {
    "quick": {"MULTI_STEPS": "nodes,job,smoke,localise"},
    "full": {"MULTI_STEPS": "nodes,job,smoke,preflight,localise", "MAX_BYTES": 1 << 30, "SMOKE_STEPS": 500},
}
"""Notebook 00's parameters for the tiers that run it (``-p NAME VALUE`` given by the user wins)."""

CONTRACT_KEYS = {"gpus": int, "iface": str, "mtu": int, "mtu_peer": str, "mounts": list, "versions": dict}
GPU_DIR = Path("/proc/driver/nvidia/gpus")
"""One folder per GPU the NVIDIA driver sees (no ``nvidia-smi`` call: the prolog has seconds, not a driver query)."""
DRIVER_FILE = Path("/proc/driver/nvidia/version")


@dataclasses.dataclass(frozen=True)
class Contract:
    """What every node must satisfy (the fields of the module docstring; None/empty: not checked)."""

    gpus: int | None = None
    iface: str | None = None
    mtu: int | None = None
    mtu_peer: str = ""
    mounts: tuple[str, ...] = ()
    versions: Mapping[str, str] = dataclasses.field(default_factory=dict)


def load_contract(path: str | os.PathLike[str] | None) -> Contract:
    """Read the contract JSON at ``path`` (None: the empty contract, every check that needs a value skipped).

    Raises:
        ValueError: unreadable file, not JSON, an unknown key, or a value of the wrong type (named).
    """
    if path is None:
        return Contract()
    try:
        data = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise ValueError(f"contract {path}: cannot read it as JSON: {exc}") from None
    if not isinstance(data, dict):
        raise ValueError(f"contract {path}: a JSON object expected")
    unknown = sorted(set(data) - set(CONTRACT_KEYS))
    if unknown:
        raise ValueError(f"contract {path}: unknown key(s) {', '.join(unknown)}; accepted: {', '.join(CONTRACT_KEYS)}")
    for key, kind in CONTRACT_KEYS.items():
        if key in data and (not isinstance(data[key], kind) or isinstance(data[key], bool)):
            raise ValueError(f"contract {path}: {key}={data[key]!r}: must be a JSON {kind.__name__}")
    if "mtu" in data and not 576 <= data["mtu"] <= 65535:
        raise ValueError(f"contract {path}: mtu={data['mtu']}: must be 576..65535 bytes")
    if "gpus" in data and data["gpus"] < 0:
        raise ValueError(f"contract {path}: gpus={data['gpus']}: must be >= 0")
    if not all(isinstance(m, str) for m in data.get("mounts", [])):
        raise ValueError(f"contract {path}: mounts: a list of paths")
    if not all(isinstance(v, str) for v in data.get("versions", {}).values()):
        raise ValueError(f"contract {path}: versions: {{name: version prefix}} strings")
    return Contract(data.get("gpus"), data.get("iface"), data.get("mtu"), data.get("mtu_peer", ""),
                    tuple(data.get("mounts", ())), dict(data.get("versions", {})))


def this_node() -> str:
    """The SLURM name of this node (``SLURMD_NODENAME``, set for Prolog and HealthCheckProgram), else the short hostname."""
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def _rec(cid: str, node: str, ok: bool, title: str, values: dict[str, Any], fix: str, source: str = "") -> Check:
    return Check(f"prolog.{cid}.{node}", f"{node}: {title}", "OK" if ok else "FAIL", values, "" if ok else fix,
                 source, node=node)


def _version(name: str) -> str | None:
    if name == "python":
        return platform.python_version()
    if name == "driver":
        text = DRIVER_FILE.read_text() if DRIVER_FILE.exists() else ""
        m = re.search(r"Kernel Module\s+(?:for\s+\S+\s+)?([0-9][0-9.]+)", text)
        return m.group(1) if m else None
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def prolog_checks(contract: Contract, node: str | None = None, *, runner: SlurmClient | None = None) -> list[Check]:
    """The prolog tier on this node: one record per contract field (no job, no collective, no torch import).

    Records ``prolog.<gpus|nic|mtu|mnt|ver>.<node>``, FAIL naming this node when the contract is broken.  The MTU
    check sends one don't-fragment ping of ``mtu - 28`` bytes to ``mtu_peer`` (and one of 1472 to tell a black
    hole from an unreachable peer; :func:`helpers.preflight.df_ping`, ``-W 1``), so it costs at most ~2 s.

    Raises:
        RuntimeError: interfaces unreadable (no ``ip`` and no /sys/class/net, or ``ip`` failing: :func:`helpers.hostinfo.interfaces`): a tool error for the caller.
    """
    node = node or this_node()
    runner = runner or ThisHost()
    checks: list[Check] = []
    if contract.gpus is not None:
        seen = len(list(GPU_DIR.iterdir())) if GPU_DIR.is_dir() else 0
        checks.append(_rec("gpus", node, seen >= contract.gpus, f"{seen} GPU(s) visible to the driver, {contract.gpus} "
                           "in the contract", {"gpus": seen, "contract": contract.gpus},
                           "nvidia-smi; check the driver (dmesg: Xid, fallen off the bus), reseat or replace the GPU",
                           "MN1"))
    ifaces = {i["name"]: i for i in hostinfo.interfaces()}
    if contract.iface is not None:
        have = ifaces.get(contract.iface)
        ok = bool(have and have["up"] and have["ipv4"])
        state = ("missing" if not have else f"{have['state']}, address {', '.join(have['ipv4']) or 'none'}")
        others = ", ".join(n for n, i in ifaces.items() if not i["loopback"] and i["ipv4"])
        checks.append(_rec("nic", node, ok, f"data interface {contract.iface}: {state}" + ("" if ok else f" (have {others or 'none'})"),
                           {"iface": contract.iface, "present": sorted(ifaces)}, "bring the interface up with its address "
                           "(ip link, ip addr); a renamed NIC breaks every *_SOCKET_IFNAME that names it (Gilbreth 8.12)",
                           "Gilbreth 8.12"))
    if contract.mtu is not None:
        have = ifaces.get(contract.iface or "") or next((i for i in ifaces.values() if not i["loopback"] and i["ipv4"]), None)
        mtu = have["mtu"] if have else None
        values: dict[str, Any] = {"iface": have["name"] if have else None, "mtu": mtu, "contract": contract.mtu}
        ok, title = mtu == contract.mtu, f"MTU {mtu} on {values['iface']}, {contract.mtu} in the contract"
        if ok and contract.mtu_peer:
            big, shown, said = preflight.df_ping(runner, node, contract.mtu_peer, contract.mtu - 28, timeout_s=4)
            small = preflight.df_ping(runner, node, contract.mtu_peer, 1472, timeout_s=4)[0] if big else 0
            values.update(peer=contract.mtu_peer, large_ping=big, small_ping=small, command=shown, said=said)
            if big and small == 0:
                ok, title = False, f"path MTU below {contract.mtu}: {shown} lost, 1472 bytes pass (black hole, MN4)"
            elif big:
                title += f"; {contract.mtu_peer} does not answer a ping at all"
        checks.append(_rec("mtu", node, ok, title, values, "set the same MTU on the node and its switch port (ip link "
                           "set dev IFACE mtu N; the switch's port config); tcp_mtu_probing=1 only hides it", "MN4"))
    for path in contract.mounts:
        ok = os.path.isdir(path) and os.access(path, os.R_OK | os.X_OK)
        checks.append(_rec("mnt", node, ok, f"{path} {'mounted and readable' if ok else 'missing or unreadable'}",
                           {"path": path, "mount_point": os.path.ismount(path)},
                           f"mount {path} (the shared filesystem: the job's code and checkpoints live there)",
                           "Gilbreth 8.12"))
    if contract.versions:
        have_v = {k: _version(k) for k in contract.versions}
        odd = {k: v for k, v in have_v.items() if not (v or "").startswith(contract.versions[k])}
        checks.append(_rec("ver", node, not odd, ", ".join(f"{k} {v}" for k, v in have_v.items())
                           + (f" (contract: {', '.join(f'{k} {contract.versions[k]}*' for k in odd)})" if odd else ""),
                           {"have": have_v, "contract": dict(contract.versions)},
                           "install the contract's versions (one image for every node); ranks with different NCCL or "
                           "torch versions hang or crash", "Gilbreth 8.12"))
    return checks


def health_check(contract_path: str | None, *, drain: bool = False, client: SlurmClient | None = None,
                 node: str | None = None) -> tuple[list[Check], int, list[dict[str, Any]]]:
    """``runbook health-check``: the prolog tier on this node, then (``drain``) ``scontrol ... state=drain`` for it.

    Never raises for the check's own trouble: a contract it cannot read or a check that raises becomes a
    ``tool_error`` WARN (no drain).  ``drain`` acts only on ``node_problem`` records
    (:func:`helpers.allocation.operators.drain_commands`), through ``client`` (default: this machine's SLURM).

    Returns:
        ``(checks, exit status, drained)``: status 0 OK, 1 a node problem, 2 a tool error
        (:func:`helpers.allocation.operators.exit_status`); ``drained`` as :func:`helpers.allocation.operators.apply`.
    """
    node = node or this_node()
    t0 = time.monotonic()
    try:
        checks = prolog_checks(load_contract(contract_path), node)
    except Exception as exc:  # noqa: BLE001 - any failure of the check itself is a tool error, never a drain
        checks = [operators.tool_error(f"tool.health_check.{node}", f"{node}: the health check broke: "
                                       f"{type(exc).__name__}: {exc}", node=node)]
    took = time.monotonic() - t0
    if took > PROLOG_BUDGET_S:
        checks.append(operators.tool_error(f"tool.health_check_time.{node}", f"{node}: the prolog tier took {took:.1f} s, "
                                           f"over its {PROLOG_BUDGET_S:g} s budget", node=node))
    drained = operators.apply(client or LocalSlurm(), checks) if drain else []
    return checks, operators.exit_status(checks), drained


def tier_params(tier: str, given: Mapping[str, Any]) -> dict[str, Any]:
    """Notebook 00's parameters for ``tier`` (quick/full), under the ones the user ``given`` (which win).

    Raises:
        ValueError: ``tier`` not one of :data:`TIERS`, or ``prolog`` (which runs no notebook).
    """
    if tier not in TIER_PARAMS:
        raise ValueError(f"tier={tier!r}: the notebook runs for {', '.join(TIER_PARAMS)} (prolog: runbook health-check)")
    return {**TIER_PARAMS[tier], **given}


def summary_line(checks: Sequence[Check], status: int, took_s: float) -> str:
    """One line for slurmd's log and the wrapper's log file: ``node status=N ok=.. fail=.. error=.. 0.4 s``."""
    bad = [c for c in checks if not c.ok]
    words = "; ".join(f"{c.id}: {c.title}" for c in bad) or "all OK"
    return f"runbook health-check: exit {status} in {took_s:.1f} s: {words}"
