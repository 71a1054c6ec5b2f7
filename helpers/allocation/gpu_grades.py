"""Grading the GPU health of a node (:mod:`helpers.allocation.gpu_health` records) into :class:`~helpers.checks.Check` s.

Pure functions and their thresholds, like :mod:`helpers.allocation.grades` (which keeps the allocation check's
other grades); this module holds the GPU-health ones so that the per-GPU rules and their NVIDIA sources sit
together.  Every non-OK record names the GPU (index and PCI bus id) in its title and ``values``, the value, the
threshold with its source (NVIDIA's documentation, by URL) and the action in ``values["action"]``, one of
:data:`ACTIONS`; its remediation starts with that action.

* :func:`grade_gpu_health`: one node's record (:func:`helpers.allocation.gpu_health.node_health`) -> ``gpu.*``;
  a node without GPU is one ``gpu.health`` INFO ("no GPU on this node"), never a WARN.
* :func:`grade_gpu_versions`: driver, CUDA (driver API) and NVML versions equal on every node.
* :func:`grade_dcgm`: ``dcgmi diag`` tests -> ``gpu.dcgm.<test>``.
* :func:`grade_xids`: XID events since boot -> ``gpu.xid`` (per XID code, with the catalogue's action).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from helpers.checks import Check

ACTIONS = ("none", "restart the job", "fix the configuration", "reset", "reseat", "drain", "replace")
"""What a record asks for, least to most disruptive: a GPU ``reset`` (``nvidia-smi -r`` or a reboot), ``reseat``
(the board or its cable/riser), ``drain`` (take the node out of the scheduler until fixed), ``replace`` (RMA)."""

SRC_NVML = "https://docs.nvidia.com/deploy/nvml-api/group__nvmlDeviceQueries.html"
SRC_MEM = "https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/index.html"
SRC_RECOVERY = "https://docs.nvidia.com/deploy/a100-gpu-mem-error-mgmt/error-recovery-and-response-flags.html"
SRC_RETIRE = "https://docs.nvidia.com/deploy/dynamic-page-retirement/visibility.html"
SRC_XID = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"
SRC_XID_CHECKS = "https://docs.nvidia.com/health-validation/reference/checks/xid.md"
SRC_PERSIST = ("https://docs.nvidia.com/deploy/driver-persistence/index.html; DCGM's own software test warns "
               "'Persistence mode for GPU 0 is disabled' (https://github.com/NVIDIA/NVSentinel/pull/772)")
SRC_MIG = "https://docs.nvidia.com/datacenter/tesla/mig-user-guide/index.html"
SRC_PCIE = ("nvidia-smi --help-query-gpu, pcie.link.gen.current / pcie.link.width.current: 'These may be reduced when "
            "the GPU is not in use' (quoted in https://github.com/NVIDIA/gpu-monitoring-tools/issues/215)")
SRC_THROTTLE = ("nvml.h nvmlClocksThrottleReasonHwSlowdown: 'reducing the core clocks by a factor of 2 or more ... an "
                "indicator of temperature being too high, External Power Brake Assertion ...' (quoted in "
                "https://github.com/kubeflow/kubeflow/issues/68); " + SRC_NVML)
SRC_DCGM = "https://docs.nvidia.com/datacenter/dcgm/latest/user-guide/dcgm-diagnostics.html"

SLOWDOWN_REASONS = ("hw_slowdown", "hw_thermal_slowdown", "hw_power_brake_slowdown", "sw_thermal_slowdown")
"""Throttle reasons that hold clocks down for a hardware or thermal cause (a WARN); the others (idle, application
clocks, the software power cap, sync boost, display clocks) are the GPU doing what it was told (OK)."""

XID_ACTIONS: dict[int, tuple[str, str, str]] = {
    # xid: (status, action, what it means) -- from NVIDIA's Xid catalogue (SRC_XID), its memory-error and page
    # retirement documents (SRC_MEM, SRC_RETIRE) and NVIDIA's health-validation Xid checks (SRC_XID_CHECKS:
    # Xid 46 and 48 CRITICAL, "drain: reset_gpu -> service_required").
    13: ("INFO", "restart the job", "Graphics Engine Exception: mostly an application fault (catalogue: RESTART_APP)"),
    31: ("INFO", "restart the job", "GPU memory page fault: mostly an application fault (catalogue: RESTART_APP)"),
    43: ("INFO", "restart the job", "GPU stopped processing, the application was stopped (catalogue: RESTART_APP)"),
    45: ("INFO", "restart the job", "preemptive cleanup after a previous error (catalogue: RESTART_APP)"),
    46: ("FAIL", "drain", "GPU stopped processing (health validation: CRITICAL, drain, reset GPU, service)"),
    48: ("FAIL", "drain", "double-bit (uncorrectable) ECC error (health validation: CRITICAL, drain, reset GPU, service)"),
    63: ("WARN", "reset", "a row remapping / page retirement is pending: it takes effect at the next GPU reset"),
    64: ("FAIL", "reset", "recording a row remapping / page retirement failed: reset the GPU; if it repeats, drain "
                          "and RMA (row-remapping failure, " + SRC_RECOVERY + ")"),
    74: ("FAIL", "reset", "NVLink error: reset the GPU; if it repeats, reseat/replace the board or the NVLink bridge"),
    79: ("FAIL", "drain", "GPU has fallen off the bus: no reset from software; reseat the board, check power/PCIe"),
    92: ("WARN", "none", "high single-bit ECC error rate: watch, plan replacement if it persists"),
    94: ("WARN", "restart the job", "contained ECC error: the application was stopped, the GPU keeps serving"),
    95: ("FAIL", "reset", "uncontained ECC error: every application on the GPU is affected; reset the GPU"),
    119: ("FAIL", "reset", "GSP RPC timeout: reset the GPU (reboot if the reset fails)"),
    120: ("FAIL", "reset", "GSP error: reset the GPU (reboot if the reset fails)"),
}
"""XID code -> (status, action, meaning).  A code not listed is a WARN "look it up in the catalogue"."""


def _who(node: str, gpu: Mapping[str, Any]) -> str:
    where = f"{node} " if node else ""
    bus = gpu.get("pci_bus_id") or "bus id unknown"
    return f"{where}GPU {gpu.get('index')} ({bus})"


def _gpu_check(cid: str, node: str, gpu: Mapping[str, Any], title: str, status: str, value: Any, threshold: str,
               action: str, how: str, source: str) -> Check:
    """One non-OK finding on one GPU, in the shape of the module docstring."""
    if action not in ACTIONS:
        raise ValueError(f"action={action!r}: accepted values are {', '.join(ACTIONS)}")
    idx = gpu.get("index")
    return Check(f"{cid}.gpu{idx}", f"{_who(node, gpu)}: {title}", status,
                 {"gpu_index": idx, "pci_bus_id": gpu.get("pci_bus_id"), "gpu": gpu.get("name"), "value": value,
                  "threshold": threshold, "action": action},
                 f"{action}: {how}", source, node=node)


def _ok(cid: str, node: str, title: str, values: dict[str, Any], source: str) -> Check:
    return Check(cid, f"{node + ': ' if node else ''}{title}", "OK", values, "", source, node=node)


def grade_gpu_health(health: Mapping[str, Any], node: str = "") -> list[Check]:
    """The ``gpu.*`` records of one node (``health``: :func:`helpers.allocation.gpu_health.node_health`).

    Rules, thresholds and sources (each record repeats its own):

    * ``gpu.count``: FAIL when NVML shows fewer GPUs than the job asked for (``asked``); drain (a missing GPU is an
      XID 79, a GPU held by a dead process or a board off the bus).
    * ``gpu.ecc``: uncorrectable ECC errors since the driver loaded (volatile) > 0: FAIL, reset (NVIDIA: error
      containment, then the row is remapped at the next reset, SRC_MEM); lifetime (aggregate) > 0: WARN, none.
    * ``gpu.row_remap``: a remapping pending: WARN, reset ("row-remapping will happen at the next GPU reset",
      SRC_RECOVERY); a remapping failure: FAIL, replace (RMA, SRC_RECOVERY).
    * ``gpu.retired_pages`` (pre-Ampere): a retirement pending: WARN, reset (XID 63 "reload the driver to activate",
      SRC_RETIRE); pages retired for double-bit errors: WARN, none.
    * ``gpu.pcie``: link width below the maximum: WARN, reseat; link generation below the maximum: INFO (idle GPUs lower
      it, SRC_PCIE; ``dcgmi diag -r 2`` measures the link under load).
    * ``gpu.throttle``: an active reason of :data:`SLOWDOWN_REASONS`: WARN, drain if it persists (SRC_THROTTLE).
    * ``gpu.nvlink``: a link down while others are up: FAIL, reseat; replay/recovery/CRC counters > 0: WARN, reset.
    * ``gpu.persistence``: off: WARN, fix the configuration (``nvidia-smi -pm 1``; SRC_PERSIST).
    * ``gpu.mig``: on: WARN, fix the configuration (a training job sees MIG slices, not the GPU; SRC_MIG).
    * ``gpu.temperature``: at/above the slowdown threshold: WARN, drain; at/above shutdown: FAIL, drain (NVML
      ``nvmlDeviceGetTemperatureThreshold``).
    * ``gpu.power``: enforced limit below the default limit: WARN, fix the configuration (a power-capped GPU is slow).
    * ``gpu.xid``: :func:`grade_xids`; ``gpu.dcgm.*``: :func:`grade_dcgm`.

    Returns:
        On a node without GPU, ``[gpu.health INFO]``; else per family one OK record, or one record per GPU that is
        not OK (ids ``gpu.<family>.gpu<index>``).
    """
    nvml = health.get("nvml") or {}
    gpus = nvml.get("gpus") or []
    asked = (health.get("asked") or {}).get("expected")
    who = f"{node}: " if node else ""
    if not gpus:
        why = nvml.get("error") or "NVML lists no GPU"
        status = "FAIL" if asked else "INFO"
        return [Check("gpu.health", f"{who}no GPU on this node ({why})" + (f"; the job asked for {asked}" if asked else ""),
                      status, {"asked": health.get("asked"), "error": nvml.get("error"), "action": "drain" if asked else "none"},
                      f"drain: the job asked for {asked} GPU(s) and none is visible: check the driver (nvidia-smi), "
                      "CUDA_VISIBLE_DEVICES and the job's --gpus-per-node" if asked else "", SRC_NVML, node=node)]
    checks: list[Check] = []
    count = len(gpus)
    values = {"gpus": count, "asked": health.get("asked"), "names": sorted({str(g.get("name")) for g in gpus}),
              "driver": nvml.get("driver"), "cuda_driver": nvml.get("cuda_driver"), "nvml": nvml.get("nvml"),
              "source": nvml.get("source")}
    if asked is not None and count < asked:
        checks.append(Check("gpu.count", f"{who}{count} GPU(s) visible through NVML, the job asked for {asked} "
                            f"({health['asked']['from']})", "FAIL", {**values, "action": "drain",
                                                                      "threshold": f">= {asked} ({health['asked']['from']})"},
                            "drain: a GPU is missing (fallen off the bus: look for XID 79 in the kernel log; held by a "
                            "dead process; disabled): drain the node and reseat or replace the board", SRC_NVML, node=node))
    else:
        checks.append(_ok("gpu.count", node, f"{count} GPU(s) ({', '.join(values['names'])}), driver {values['driver']}, "
                          f"CUDA {values['cuda_driver']}" + (f", {asked} asked for" if asked is not None else ""), values,
                          SRC_NVML))
    families = (("gpu.ecc", _ecc, SRC_MEM), ("gpu.row_remap", _remap, SRC_RECOVERY),
                ("gpu.retired_pages", _retired, SRC_RETIRE), ("gpu.pcie", _pcie, SRC_PCIE),
                ("gpu.throttle", _throttle, SRC_THROTTLE), ("gpu.nvlink", _nvlink, SRC_NVML),
                ("gpu.persistence", _persistence, SRC_PERSIST), ("gpu.mig", _mig, SRC_MIG),
                ("gpu.temperature", _temperature, SRC_NVML), ("gpu.power", _power, SRC_NVML))
    for cid, rule, source in families:
        found: list[Check] = []
        known = 0
        for gpu in gpus:
            got = rule(cid, node, gpu)
            if got is None:
                continue  # not reported by this GPU / this output
            known += 1
            found += got
        if found:
            checks += found
        elif known:
            checks.append(_ok(cid, node, f"{cid.split('.', 1)[1]}: OK on {known} GPU(s)", {"gpus_reported": known}, source))
    xids = health.get("xids")
    if xids is not None:
        checks += grade_xids(xids, gpus, node)
    dcgm = health.get("dcgm")
    if dcgm:
        checks += grade_dcgm(dcgm, gpus, node)
    return checks


# --------------------------------------------------------------------------- one rule per family
# Each returns None when the GPU does not report the field, [] when it is fine, else its findings.


def _ecc(cid: str, node: str, g: Mapping[str, Any]) -> list[Check] | None:
    vol, agg = g.get("ecc_uncorrected_volatile"), g.get("ecc_uncorrected_aggregate")
    if vol is None and agg is None:
        return None
    if vol:
        return [_gpu_check(cid, node, g, f"{vol} uncorrectable ECC error(s) since the driver loaded", "FAIL", vol, "0",
                           "reset", "stop its jobs and reset the GPU (nvidia-smi -r, or reboot); NVIDIA contains the error "
                           "and remaps the row at the reset; drain the node if it repeats", SRC_MEM)]
    if agg:
        return [_gpu_check(cid, node, g, f"{agg} uncorrectable ECC error(s) over the board's life", "WARN", agg, "0",
                           "none", "nothing to do now if row remapping / page retirement handled them (see gpu.row_remap); "
                           "watch the count", SRC_MEM)]
    return []


def _remap(cid: str, node: str, g: Mapping[str, Any]) -> list[Check] | None:
    if g.get("remap_pending") is None and g.get("remap_failed") is None:
        return None
    if g.get("remap_failed"):
        return [_gpu_check(cid, node, g, "a row remapping failed", "FAIL", True, "no failure", "replace",
                           "drain the node and RMA the GPU (row-remapping failure flag: NVIDIA's RMA thresholds)",
                           SRC_RECOVERY)]
    if g.get("remap_pending"):
        unc = g.get("remap_uncorrectable")
        return [_gpu_check(cid, node, g, f"row remapping pending ({unc} row(s) remapped for uncorrectable errors)",
                           "WARN", {"pending": True, "uncorrectable": unc, "correctable": g.get("remap_correctable")},
                           "not pending", "reset", "reset the GPU when its jobs end (nvidia-smi -r, or reboot): the "
                           "remapping happens at the next GPU reset", SRC_RECOVERY)]
    return []


def _retired(cid: str, node: str, g: Mapping[str, Any]) -> list[Check] | None:
    if g.get("retired_pending") is None and g.get("retired_dbe") is None:
        return None
    if g.get("retired_pending"):
        return [_gpu_check(cid, node, g, "a page retirement is pending", "WARN", True, "not pending", "reset",
                           "reload the driver or reboot (XID 63: 'New retired page, reload the driver to activate')",
                           SRC_RETIRE)]
    if g.get("retired_dbe"):
        return [_gpu_check(cid, node, g, f"{g['retired_dbe']} page(s) retired for double-bit ECC errors", "WARN",
                           g["retired_dbe"], "0", "none", "the pages are retired already; watch the count and plan a "
                           "replacement if it grows", SRC_RETIRE)]
    return []


def _pcie(cid: str, node: str, g: Mapping[str, Any]) -> list[Check] | None:
    w, wmax, gen, gmax = g.get("pcie_width"), g.get("pcie_width_max"), g.get("pcie_gen"), g.get("pcie_gen_max")
    if None in (w, wmax) and None in (gen, gmax):
        return None
    if w is not None and wmax is not None and w < wmax:
        return [_gpu_check(cid, node, g, f"PCIe link x{w}, the slot and GPU allow x{wmax}", "WARN",
                           {"width": w, "width_max": wmax}, f"x{wmax}", "reseat",
                           "a link trained narrower halves host<->GPU bandwidth: reseat the board (or its riser), check "
                           "the slot; dcgmi diag -r 2 measures the link under load", SRC_PCIE)]
    if gen is not None and gmax is not None and gen < gmax:
        return [_gpu_check(cid, node, g, f"PCIe Gen{gen}, Gen{gmax} possible (normal on an idle GPU)", "INFO",
                           {"gen": gen, "gen_max": gmax}, f"Gen{gmax} under load", "none",
                           "rerun under load (dcgmi diag -r 2, its pcie test) before acting", SRC_PCIE)]
    return []


def _throttle(cid: str, node: str, g: Mapping[str, Any]) -> list[Check] | None:
    if g.get("throttle") is None:
        return None
    active = [r for r in g["throttle"] if r in SLOWDOWN_REASONS]
    if not active:
        return []
    return [_gpu_check(cid, node, g, f"clocks held down: {', '.join(active)}", "WARN", active,
                       f"none of {', '.join(SLOWDOWN_REASONS)}", "drain",
                       "check the GPU's temperature and the node's cooling and power supply (HW slowdown cuts clocks by 2x "
                       "or more); drain the node if it persists", SRC_THROTTLE)]


def _nvlink(cid: str, node: str, g: Mapping[str, Any]) -> list[Check] | None:
    links = g.get("nvlinks") or []
    if not links:
        return None
    down = [lk["link"] for lk in links if not lk.get("active")]
    if down and len(down) < len(links):
        return [_gpu_check(cid, node, g, f"NVLink link(s) {down} down while {len(links) - len(down)} are up", "FAIL",
                           {"down": down, "links": len(links)}, "every link up", "reseat",
                           "drain the node; reset the GPU, then reseat the board / NVLink bridge (NVSwitch systems: check "
                           "nvidia-fabricmanager); replace if it stays down", SRC_NVML)]
    errs = {lk["link"]: {k: lk.get(k) for k in ("replay", "recovery", "crc_flit", "crc_data") if lk.get(k)} for lk in links}
    errs = {k: v for k, v in errs.items() if v}
    if errs:
        return [_gpu_check(cid, node, g, f"NVLink error counters non-zero on link(s) {sorted(errs)}", "WARN", errs, "0",
                           "reset", "reset the GPU (the counters restart) and rerun; counters that grow again mean a bad "
                           "link: reseat or replace", SRC_NVML)]
    return []


def _persistence(cid: str, node: str, g: Mapping[str, Any]) -> list[Check] | None:
    if g.get("persistence") is None:
        return None
    if g["persistence"]:
        return []
    return [_gpu_check(cid, node, g, "persistence mode off", "WARN", False, "Enabled", "fix the configuration",
                       "nvidia-smi -pm 1 as root (or run nvidia-persistenced): without it the driver tears the GPU down "
                       "between jobs, each start pays the initialisation", SRC_PERSIST)]


def _mig(cid: str, node: str, g: Mapping[str, Any]) -> list[Check] | None:
    if g.get("mig") is None:
        return None
    if not g["mig"]:
        return []
    return [_gpu_check(cid, node, g, "MIG mode on", "WARN", True, "Disabled", "fix the configuration",
                       "a training job sees MIG instances, not the GPU: nvidia-smi -i <gpu> -mig 0, then reset the GPU, "
                       "unless the partitioning is wanted", SRC_MIG)]


def _temperature(cid: str, node: str, g: Mapping[str, Any]) -> list[Check] | None:
    t, slow, shut = g.get("temperature_c"), g.get("temperature_slowdown_c"), g.get("temperature_shutdown_c")
    if t is None:
        return None
    if shut and t >= shut:
        return [_gpu_check(cid, node, g, f"{t:g} C, at or above the shutdown threshold {shut:g} C", "FAIL", t,
                           f"< {shut:g} C (shutdown)", "drain", "drain the node now and check its cooling", SRC_NVML)]
    if slow and t >= slow:
        return [_gpu_check(cid, node, g, f"{t:g} C, at or above the slowdown threshold {slow:g} C", "WARN", t,
                           f"< {slow:g} C (slowdown)", "drain", "the GPU is throttling: check fans, airflow and the "
                           "node's other GPUs; drain if it stays hot", SRC_NVML)]
    return []


def _power(cid: str, node: str, g: Mapping[str, Any]) -> list[Check] | None:
    limit, default = g.get("power_limit_w"), g.get("power_default_limit_w")
    if limit is None or default is None:
        return None
    if limit < default:
        return [_gpu_check(cid, node, g, f"power limit {limit:g} W, below the default {default:g} W", "WARN",
                           {"limit_w": limit, "default_w": default}, f">= {default:g} W", "fix the configuration",
                           f"a capped GPU runs slower than its peers: nvidia-smi -i <gpu> -pl {default:g} (root), or ask "
                           "the admins why it is capped", SRC_NVML)]
    return []


# --------------------------------------------------------------------------- XIDs, DCGM, versions


def _gpu_by_bus(gpus: Sequence[Mapping[str, Any]], bus: str) -> Mapping[str, Any]:
    """The GPU record whose PCI bus id ends like the kernel's short form (``0000:2b:00``), else a stub."""
    short = bus.lower().lstrip("0")
    for g in gpus:
        full = str(g.get("pci_bus_id") or "").lower()
        if full and short and short.split(".")[0] in full.lstrip("0"):
            return g
    return {"index": "?", "pci_bus_id": bus}


def grade_xids(xids: Mapping[str, Any], gpus: Sequence[Mapping[str, Any]] = (), node: str = "") -> list[Check]:
    """XID events since boot (:func:`helpers.allocation.gpu_health.read_kernel_xids`) -> ``gpu.xid`` records.

    One record per (GPU, XID code), with the status and action of :data:`XID_ACTIONS` (NVIDIA's Xid catalogue,
    SRC_XID); a code not listed is a WARN.  No readable kernel log: INFO naming what was tried.  None: OK.
    """
    who = f"{node}: " if node else ""
    if xids.get("source") is None:
        return [Check("gpu.xid", f"{who}no kernel log readable for XID errors (tried: {', '.join(xids.get('tried') or {})})",
                      "INFO", {"tried": xids.get("tried")}, "", SRC_XID, node=node)]
    events = xids.get("events") or []
    if not events:
        return [_ok("gpu.xid", node, f"no XID error since boot ({xids['source']})", {"source": xids["source"]}, SRC_XID)]
    grouped: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for e in events:
        grouped.setdefault((e["pci_bus_id"], e["xid"]), []).append(e)
    checks = []
    for (bus, code), evs in grouped.items():
        status, action, meaning = XID_ACTIONS.get(code, ("WARN", "none", "look the code up in NVIDIA's Xid catalogue"))
        g = _gpu_by_bus(gpus, bus)
        c = _gpu_check("gpu.xid", node, {**g, "pci_bus_id": g.get("pci_bus_id") or bus}, f"XID {code} x{len(evs)}: {meaning}",
                       status, {"xid": code, "count": len(evs)}, "no XID of this kind since boot", action,
                       f"{meaning}; first line: {evs[0]['line'][:200]}", f"{SRC_XID}; {SRC_XID_CHECKS}")
        c.id = f"gpu.xid{code}.gpu{g.get('index')}"
        c.evidence = [e["line"] for e in evs[:3]]
        if status == "INFO":
            c.faulty = []
        checks.append(c)
    return checks


DCGM_TEST_ACTIONS = {"memory": ("replace", "GPU memory test failed: reset and rerun; a repeat means a bad board"),
                     "pcie": ("reseat", "PCIe test failed: check the link width/generation (gpu.pcie), reseat the board"),
                     "nvlink": ("reseat", "NVLink test failed: reset, then reseat the board / bridge"),
                     "software": ("fix the configuration", "a deployment check failed: read the message (driver, "
                                  "persistence mode, page retirement / row remap, processes on the GPU)"),
                     "diagnostic": ("drain", "the stress test failed: drain the node and report it"),
                     "targeted": ("drain", "the targeted stress/power test failed: drain the node and report it")}
"""DCGM test name (lower case, first word) -> (action, what it means); any other test: drain."""


def grade_dcgm(dcgm: Mapping[str, Any], gpus: Sequence[Mapping[str, Any]] = (), node: str = "") -> list[Check]:
    """``dcgmi diag`` (:func:`helpers.allocation.gpu_health.run_dcgmi_diag`) -> ``gpu.dcgm.*``.

    Not run (no DCGM): one INFO saying why.  Each test that Fails is a FAIL and each Warn a WARN, naming the GPUs the
    table names and carrying DCGM's own messages as evidence; the rest is one OK record.  Source: the DCGM
    diagnostics guide (SRC_DCGM).
    """
    who = f"{node}: " if node else ""
    level = dcgm.get("level")
    if not dcgm.get("ran"):
        return [Check("gpu.dcgm", f"{who}dcgmi diag -r {level} not run: {dcgm.get('why')}", "INFO", dict(dcgm), "",
                      SRC_DCGM, node=node)]
    tests = [t for t in dcgm.get("tests") or [] if t["section"] != "Metadata"]
    if not tests:
        return [Check("gpu.dcgm", f"{who}dcgmi diag -r {level} printed no result table (exit {dcgm.get('returncode')})",
                      "WARN", {"output": (dcgm.get("output") or "")[-2000:], "action": "none"},
                      "none: read the output; run dcgmi diag -r 1 by hand (is nv-hostengine running?)", SRC_DCGM, node=node)]
    checks = []
    for t in tests:
        if t["result"] not in ("Fail", "Warn"):
            continue
        key = re.split(r"[\s_]+", t["test"].lower())[-1] if "memory" in t["test"].lower() else t["test"].lower().split()[0]
        action, meaning = DCGM_TEST_ACTIONS.get(key, DCGM_TEST_ACTIONS.get(t["test"].lower().split()[0],
                                                                             ("drain", "a DCGM test failed")))
        bad = sorted(int(i) for i, r in t["gpus"].items() if r == t["result"])
        named = [g for g in gpus if g.get("index") in bad] or [{"index": i, "pci_bus_id": None} for i in bad]
        where = ", ".join(_who(node, g) for g in named) or (node or "this node")
        status = "FAIL" if t["result"] == "Fail" else "WARN"
        checks.append(Check(f"gpu.dcgm.{re.sub(r'[^a-z0-9]+', '_', t['test'].lower()).strip('_')}",
                            f"{where}: DCGM {t['section']} test '{t['test']}' {t['result']}", status,
                            {"gpu_index": bad, "pci_bus_id": [g.get("pci_bus_id") for g in named], "value": t["result"],
                             "threshold": "Pass", "action": action, "level": level, "per_gpu": t["gpus"]},
                            f"{action}: {meaning}", SRC_DCGM, evidence=t["messages"][:3], node=node))
    if not checks:
        checks.append(_ok("gpu.dcgm", node, f"dcgmi diag -r {level}: {len(tests)} test(s) passed",
                          {"tests": {t["test"]: t["result"] for t in tests}, "level": level}, SRC_DCGM))
    return checks


def grade_gpu_versions(healths: Mapping[str, Mapping[str, Any]]) -> Check:
    """``node.gpu_versions``: driver, CUDA (driver API) and NVML versions equal on every node that has GPUs.

    FAIL naming the odd node(s) (the value most nodes have is the reference): NCCL and CUDA behave differently across
    driver versions, and a job spanning them fails or hangs (the same rule as ``node.versions`` for torch and NCCL).
    """
    table = {n: {k: (h.get("nvml") or {}).get(k) for k in ("driver", "cuda_driver", "nvml")}
             for n, h in healths.items() if (h.get("nvml") or {}).get("gpus")}
    if not table:
        return Check("node.gpu_versions", "no node has a GPU: driver versions not compared", "INFO", {"per_node": {}})
    odd: list[str] = []
    differing = []
    for key in ("driver", "cuda_driver", "nvml"):
        vals = [str(v[key]) for v in table.values()]
        common = max(set(vals), key=vals.count)
        if len(set(vals)) > 1:
            differing.append(key)
            odd += [n for n, v in table.items() if str(v[key]) != common and n not in odd]
    if differing:
        return Check("node.gpu_versions", f"GPU {', '.join(differing)} version differs across nodes (odd: {', '.join(odd)})",
                     "FAIL", {"per_node": table, "differing": differing, "action": "drain"},
                     f"drain: install the same NVIDIA driver on {', '.join(odd)} as on the other nodes (or leave them out)",
                     "https://docs.nvidia.com/deploy/cuda-compatibility/index.html", faulty=odd)
    first = next(iter(table.values()))
    return Check("node.gpu_versions", f"driver {first['driver']}, CUDA {first['cuda_driver']}, NVML {first['nvml']} on "
                 f"all {len(table)} GPU node(s)", "OK", {"per_node": table})
