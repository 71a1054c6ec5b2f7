"""The rules of ``NCCL_SOCKET_IFNAME`` / ``GLOO_SOCKET_IFNAME``: parse a value, match it, select, and judge names.

The only owner of these rules; the host checks (:mod:`helpers.allocation.local`), the network
pre-flight (:mod:`helpers.preflight`), the command builder (:mod:`helpers.launch_traps`) and the
NCCL log interpreter (:mod:`helpers.nccl_log`) all ask here.

* :func:`parse`: what a value means to NCCL (prefixes, ``^`` excludes, ``=`` exact) or to gloo
  (exact names only);
* :func:`match`: which of one host's interfaces a parsed value selects;
* :func:`select`: what a variable selects on one node, with the library's runtime rules (NCCL skips
  interfaces without carrier, ``IFF_RUNNING``, but not IPv4 loopback; gloo needs every name);
* :func:`node_local_reason`: why an interface name/address cannot carry traffic between nodes
  (loopback, Docker/libvirt/CNI bridges, veth pairs);
* :func:`node_specific_name`: whether a name is a PCI-slot name (``ibp65s0``) that differs per node.

Interfaces are the dicts of :func:`helpers.hostinfo.interfaces` / :func:`helpers.preflight.parse_ip_addr`
(``name``, ``ipv4``, ``ipv6``, ``loopback``, ``up``, ``running``...).  Standard library only.

Sources: NCCL's ``findInterfaces`` / ``ncclOsFindInterfaces`` (https://github.com/NVIDIA/nccl,
``src/misc/socket.cc``); :data:`NCCL_IFNAME_URL`; seed MN2; Gilbreth 4.2, Gilbreth 8.12 (names
differ per node); https://github.com/NVIDIA/nccl/issues/1053 and
https://github.com/pytorch/pytorch/issues/68893 (NCCL bound to a bridge hangs).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from functools import lru_cache
from typing import Any

NCCL_IFNAME_URL = "https://docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html#nccl-socket-ifname"
FLAVORS = ("nccl", "gloo")
IFNAME_VARS: dict[str, str] = {"NCCL_SOCKET_IFNAME": "nccl", "GLOO_SOCKET_IFNAME": "gloo"}
"""The variables, each with its flavor (the library whose rules apply): iterate it for the names."""

LOOPBACK = "loopback"
"""What :func:`node_local_reason` returns for ``lo``, 127.x and ``::1``."""
LINK_LOCAL = "IPv4 link-local address, 169.254/16"
"""What :func:`node_local_reason` returns for a 169.254.x.x address: RFC 3927 link-local, "not forwarded by routers"
(https://www.rfc-editor.org/rfc/rfc3927), and often the same on every node (EKS Pod Identity's pod-id-link0 is
169.254.170.23 everywhere: awslabs/aws-do-eks#54)."""

# One pattern per kind of node-local interface, checked in order (MN2).
_NODE_LOCAL = (
    (re.compile(r"lo\d*", re.I), LOOPBACK),
    (re.compile(r"docker.*|br-[0-9a-f]+", re.I), "Docker bridge"),
    (re.compile(r"virbr.*", re.I), "libvirt bridge"),
    (re.compile(r"cni.*", re.I), "CNI bridge (Kubernetes)"),
    (re.compile(r"veth.*", re.I), "container veth pair"),
)
_PCI_SLOT = re.compile(r"p\d+s\d+")  # ibp65s0, enp65s0f1: the PCI slot is in the name (systemd predictable names)


def flavor_of(var: str) -> str:
    """``nccl`` or ``gloo`` for a variable of :data:`IFNAME_VARS`.

    Raises:
        ValueError: ``var`` is not one of :data:`IFNAME_VARS`.
    """
    if var not in IFNAME_VARS:
        raise ValueError(f"var={var!r}: accepted values are {', '.join(IFNAME_VARS)}")
    return IFNAME_VARS[var]


def parse(value: str, flavor: str) -> dict[str, Any]:
    """Parse ``NCCL_SOCKET_IFNAME`` (``flavor="nccl"``) or ``GLOO_SOCKET_IFNAME`` (``"gloo"``).

    NCCL (:data:`NCCL_IFNAME_URL`; ``src/misc/socket.cc`` ``findInterfaces``): a comma-separated list
    of name *prefixes*; a leading ``^`` excludes them, a leading ``=`` makes them exact names,
    ``^=`` both; ``:port`` suffixes are dropped; a value of one character or less is ignored
    (``strlen(env) > 1``) and NCCL auto-detects.  Gloo as torch passes it (measured, torch 2.13):
    comma-separated *exact* names, each of which must exist; no ``^``/``=`` (``^docker0`` fails
    with ``Unable to find address for: ^docker0``); a one-character value is ignored; a trailing
    comma is ignored, an empty entry elsewhere fails.  Neither strips spaces.

    Returns:
        ``{"exclude": bool, "exact": bool, "names": list[str], "supported": bool, "note": str}``;
        ``names == []`` means the library auto-detects.  For unsupported gloo syntax ``names``
        holds what gloo will literally look up (e.g. ``["^docker0"]``).

    Raises:
        ValueError: ``flavor`` is not one of ``nccl``, ``gloo`` (message names ``flavor``).
    """
    if flavor not in FLAVORS:
        raise ValueError(f"flavor={flavor!r}: accepted values are {', '.join(FLAVORS)}")
    if len(value) <= 1:
        return {"exclude": False, "exact": flavor == "gloo", "names": [], "supported": True,
                "note": f"{value!r} is ignored (one character or less): {flavor} auto-detects"}
    notes: list[str] = []
    if flavor == "nccl":
        rest = value
        exclude = rest.startswith("^")
        rest = rest[1:] if exclude else rest
        exact = rest.startswith("=")
        rest = rest[1:] if exact else rest
        names = [n for n in (entry.split(":")[0] for entry in rest.split(",")) if n]
        supported = True
        notes.append(f"{'all interfaces except those' if exclude else 'interfaces'} {'named' if exact else 'starting with'} "
                     + " or ".join(names))
    else:
        exclude, exact = False, True
        names = value.split(",")
        if names[-1] == "":
            names.pop()
        supported = not value.startswith(("^", "=")) and "" not in names
        if value.startswith(("^", "=")):
            notes.append(f"{value[0]!r} is NCCL syntax; gloo takes exact names only and fails with "
                         f"'Unable to find address for: {names[0]}'")
        if "" in names:
            notes.append("empty entry: gloo fails with \"interface or hostname can't be empty\"")
        if supported:
            notes.append("gloo opens a device on every listed interface: each one must exist")
    if any(n != n.strip() for n in names):
        notes.append("names contain spaces, which are not stripped")
    return {"exclude": exclude, "exact": exact, "names": names, "supported": supported, "note": "; ".join(notes)}


def has_address(iface: Mapping[str, Any]) -> bool:
    """Whether ``iface`` carries an IPv4 address or a non-loopback IPv6 one.

    NCCL skips interfaces without one, and IPv6 loopback; gloo fails on them too (measured: a
    bridge with no address gives ``Unable to find address for: <name>``).
    """
    return bool(iface["ipv4"]) or any(not a.startswith("::1/") for a in iface["ipv6"])


def match(spec: Mapping[str, Any], ifaces: Sequence[Mapping[str, Any]], require_address: bool = True) -> list[str]:
    """Names of the interfaces in ``ifaces`` that ``spec`` (from :func:`parse`) selects, in order.

    Prefix match unless ``spec["exact"]``; ``spec["exclude"]`` inverts; an empty ``names`` list
    selects everything (NCCL's ``matchIfList``) for a non-exact spec and nothing for gloo.  With
    ``require_address`` (default) only interfaces carrying an address count (:func:`has_address`),
    as in NCCL's and gloo's own lookup (``getifaddrs``).

    Raises:
        KeyError: ``spec`` lacks ``names``/``exact``/``exclude`` or an interface lacks ``name``.
    """
    names = spec["names"]
    selected = []
    for iface in ifaces:
        if require_address and not has_address(iface):
            continue
        if not names:
            hit = not spec["exact"]
        elif spec["exact"]:
            hit = iface["name"] in names
        else:
            hit = any(iface["name"].startswith(n) for n in names)
        if hit != bool(spec["exclude"]):
            selected.append(iface["name"])
    return selected


def _by_name(ifaces: Sequence[Mapping[str, Any]], name: str | None) -> dict[str, Any]:
    return next((dict(i) for i in ifaces if i["name"] == name), {})


def select(var: str, value: str, ifaces: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """What ``var`` = ``value`` selects among one node's ``ifaces`` (they need ``running``, as from
    :func:`helpers.preflight.parse_ip_addr`).

    NCCL (``NCCL_SOCKET_IFNAME``): the interfaces whose name matches (prefix, or exact after
    ``=``; inverted after ``^``), that are running (``IFF_RUNNING``) and carry an address; IPv4
    loopback is *not* skipped, so ``^docker0`` keeps ``lo``, which comes first
    (``ncclOsFindInterfaces``).  The first selected interface carries the bootstrap.
    Gloo (``GLOO_SOCKET_IFNAME``): every listed exact name must exist with an address (else
    ``Unable to find address for: NAME``); carrier is not checked by gloo.

    Returns:
        ``{"var", "value", "spec" (:func:`parse`), "selected": [names], "first": name or None,
        "address": first IPv4 (or IPv6) of ``first``, "problem": str, "kind": "" / "syntax" /
        "missing" / "no-address" / "no-carrier" / "loopback", "error": what the library prints,
        or "", "node_local": :func:`node_local_reason` of ``first`` or None}``; ``problem`` is ""
        when the selection is usable.

    Raises:
        ValueError: ``var`` is not one of :data:`IFNAME_VARS`.
    """
    flavor = flavor_of(var)
    spec = parse(value, flavor)
    out: dict[str, Any] = {"var": var, "value": value, "spec": spec, "selected": [], "first": None, "address": None,
                           "problem": "", "kind": "", "error": "", "node_local": None}
    names = [i["name"] for i in ifaces]
    if not spec["names"] and len(value) <= 1:
        return out  # ignored value: the library auto-detects
    if flavor == "gloo":
        if not spec["supported"]:
            out.update(problem=f"{var}={value!r} is not valid for gloo: {spec['note']}", kind="syntax",
                       error=f"Unable to find address for: {spec['names'][0] if spec['names'] else value}")
            return out
        missing = [n for n in spec["names"] if n not in names]
        bare = [n for n in spec["names"] if n in names and not _by_name(ifaces, n).get("ipv4")
                and not _by_name(ifaces, n).get("ipv6")]
        if missing or bare:
            bad = (missing or bare)[0]
            what = "does not exist" if missing else "has no address"
            out.update(problem=f"interface {bad!r} {what} here (interfaces: {', '.join(names)})",
                       kind="missing" if missing else "no-address", error=f"Unable to find address for: {bad}")
            return out
        out["selected"] = list(spec["names"])
    else:
        matched = match(spec, ifaces)
        running = [n for n in matched if _by_name(ifaces, n).get("running")]
        out["selected"] = running
        if not running:
            why = (f"{', '.join(matched)} match but have no carrier (not IFF_RUNNING)" if matched
                   else f"no interface with an address matches (interfaces: {', '.join(names)})")
            out.update(problem=why, kind="no-carrier" if matched else "missing",
                       error="Bootstrap : no socket interface found")
            return out
    first = _by_name(ifaces, out["selected"][0])
    out["first"] = first.get("name")
    addrs = first.get("ipv4") or first.get("ipv6") or []
    out["address"] = addrs[0].split("/")[0] if addrs else None
    out["node_local"] = node_local_reason(str(out["first"]), out["address"] or "")
    if flavor == "nccl" and first.get("loopback"):
        out["kind"] = "loopback"
        out["problem"] = (f"the first interface NCCL selects is {first['name']} ({out['address']}): its bootstrap "
                          f"would listen on loopback" + (" (a '^' list keeps lo unless it names it)"
                                                         if spec["exclude"] else ""))
    elif flavor == "gloo" and not first.get("running"):
        out.update(kind="no-carrier",
                   problem=f"{first['name']} has no carrier ({first.get('state')}): nothing reaches its address")
    return out


@lru_cache(maxsize=4096)  # a 200 MB NCCL log asks about the same few interfaces for tens of thousands of ranks
def node_local_reason(name: str, ip: str = "") -> str | None:
    """Why the interface ``name`` (address ``ip``, optional) cannot carry traffic between nodes, or None.

    Node-local interfaces: loopback (``lo``, any 127.x address, ``::1``: :data:`LOOPBACK`), an IPv4 link-local address
    (169.254.x.x: :data:`LINK_LOCAL`), Docker
    bridges (``docker*``, ``br-<hex id>``), libvirt bridges (``virbr*``), Kubernetes CNI bridges
    (``cni*``) and container veth pairs (``veth*``).  Each carries the same address on every
    node, or none reachable from outside: NCCL/gloo bound to one hangs or fails multi-node (seed
    MN2; https://github.com/NVIDIA/nccl/issues/1053, https://github.com/pytorch/pytorch/issues/68893).
    Names are matched case-insensitively; ``name`` may be an NCCL prefix (``docker``).

    Returns:
        ``"loopback"``, :data:`LINK_LOCAL`, ``"Docker bridge"``, ``"libvirt bridge"``, ``"CNI bridge (Kubernetes)"``,
        ``"container veth pair"``, or None when the name and address look routable.
    """
    if ip.startswith("127.") or ip == "::1":
        return LOOPBACK
    if ip.startswith("169.254."):
        return LINK_LOCAL
    for pattern, reason in _NODE_LOCAL:
        if pattern.fullmatch(name):
            return reason
    return None


def node_specific_name(name: str) -> bool:
    """Whether ``name`` holds a PCI slot (``ibp65s0``, ``enp65s0f1``): such names differ between nodes.

    Setting one in ``*_SOCKET_IFNAME`` for a multi-node job fails on the nodes where the card sits
    in another slot (Gilbreth 8.12, failure mode 2; MN2).
    """
    return bool(_PCI_SLOT.search(name))
