"""The health of every GPU of this node, as one record per GPU: read live through NVML, or from posted text.

One record shape, three ways in (so a ``nvidia-smi -q -x`` someone posted in an issue grades exactly like the
live node):

* :func:`read_nvml`: the live node through NVIDIA's own binding, ``nvidia-ml-py`` (``import pynvml``), never
  by parsing ``nvidia-smi`` text.  The NVML calls are those of the NVML API reference
  (https://docs.nvidia.com/deploy/nvml-api/index.html); a field a GPU does not support is ``None``.
* :func:`from_smi_xml`: ``nvidia-smi -q -x`` (the ``nvsmi_device_v*.dtd`` tags).
* :func:`from_smi_text`: ``nvidia-smi -q`` (indented ``Key : Value`` text; a posted fragment without its
  ``GPU 0000...`` header is read as one GPU).

A node record (:func:`read_nvml`'s return)::

    {"source": "nvml" | "nvidia-smi -q -x" | "nvidia-smi -q", "driver": "550.54.15", "cuda_driver": "12.4",
     "nvml": "12.550.54.15", "gpus": [GPU record, ...], "error": None | "why NVML could not be read"}

A GPU record: ``index``, ``name``, ``pci_bus_id``, ``uuid``; ``ecc_enabled``; ``ecc_uncorrected_volatile`` /
``ecc_uncorrected_aggregate`` (counts: volatile since the driver loaded, aggregate over the board's life); retired
pages ``retired_sbe`` / ``retired_dbe`` / ``retired_pending``; row remapping ``remap_correctable`` /
``remap_uncorrectable`` / ``remap_pending`` / ``remap_failed``; PCIe ``pcie_gen`` / ``pcie_gen_max`` /
``pcie_width`` / ``pcie_width_max``; ``throttle`` (names of the active clock throttle / event reasons, ``None`` when not reported, NVML's
``nvmlClocksThrottleReason*`` bits); ``nvlinks`` (``[{"link", "active", "replay", "recovery", "crc_flit",
"crc_data"}]``, NVML's ``NVML_NVLINK_ERROR_DL_*`` counters); ``persistence``; ``mig``; ``temperature_c`` with
``temperature_slowdown_c`` / ``temperature_shutdown_c``; ``power_w`` with ``power_limit_w`` (enforced) and
``power_default_limit_w``.  Unknown = ``None``.

Beside the records, what NVML does not keep since boot: XID errors from the kernel log (:func:`read_kernel_xids`,
:func:`parse_xids`: NVML's XID events only report what happens after a process registers for them) and, where
DCGM is installed, ``dcgmi diag`` (:func:`run_dcgmi_diag`, :func:`parse_dcgmi_diag`).  :func:`expected_gpus`
says how many GPUs the job asked for.  Grading is :mod:`helpers.allocation.gpu_grades`'.  Nothing runs at import;
``pynvml`` is imported only inside :func:`read_nvml`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import time
import xml.etree.ElementTree as ET
from collections.abc import Mapping, Sequence
from typing import Any

from helpers.procs import run_bounded

NVML_DOCS = "https://docs.nvidia.com/deploy/nvml-api/index.html"

THROTTLE_BITS = {  # nvml.h nvmlClocksThrottleReason* / nvmlClocksEventReason* (the same bits)
    0x1: "gpu_idle", 0x2: "applications_clocks_setting", 0x4: "sw_power_cap", 0x8: "hw_slowdown",
    0x10: "sync_boost", 0x20: "sw_thermal_slowdown", 0x40: "hw_thermal_slowdown", 0x80: "hw_power_brake_slowdown",
    0x100: "display_clock_setting",
}
"""Bit -> name of NVML's clock throttle (event) reasons; the names are ``nvidia-smi -q -x``'s tag suffixes."""

FIELDS = ("index", "name", "pci_bus_id", "uuid", "ecc_enabled", "ecc_uncorrected_volatile", "ecc_uncorrected_aggregate",
          "retired_sbe", "retired_dbe", "retired_pending", "remap_correctable", "remap_uncorrectable", "remap_pending",
          "remap_failed", "pcie_gen", "pcie_gen_max", "pcie_width", "pcie_width_max", "throttle", "nvlinks",
          "persistence", "mig", "temperature_c", "temperature_slowdown_c", "temperature_shutdown_c", "power_w",
          "power_limit_w", "power_default_limit_w")
"""The keys of a GPU record, in the order the grader reports them."""


def empty_gpu(index: int) -> dict[str, Any]:
    """A GPU record with every field unknown (``None``; ``nvlinks`` empty)."""
    rec: dict[str, Any] = dict.fromkeys(FIELDS)
    rec.update(index=index, nvlinks=[])
    return rec


def node_record(source: str, gpus: list[dict[str, Any]], *, driver: str | None = None, cuda_driver: str | None = None,
                nvml: str | None = None, error: str | None = None) -> dict[str, Any]:
    """The node record of the module docstring."""
    return {"source": source, "driver": driver, "cuda_driver": cuda_driver, "nvml": nvml, "gpus": gpus, "error": error}


# --------------------------------------------------------------------------- live: NVML


def _text(value: Any) -> str:
    return value.decode() if isinstance(value, bytes) else str(value)


def read_nvml() -> dict[str, Any]:
    """Every GPU of this node through NVML (``nvidia-ml-py``); the node record of the module docstring.

    Without the binding, the NVML library (``libnvidia-ml.so``: no driver) or any GPU, the record has no GPU and
    ``error`` says which (the grader turns that into "no GPU on this node", INFO).  A field a GPU does not
    support (``NVMLError_NotSupported``, e.g. row remapping before Ampere, NVLink on PCIe boards) stays ``None``.
    """
    try:
        import pynvml
    except ImportError:
        return node_record("nvml", [], error="nvidia-ml-py is not installed (pip install nvidia-ml-py)")
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError as exc:
        return node_record("nvml", [], error=f"NVML: {exc} (no NVIDIA driver on this node)")
    try:
        def call(fn: Any, *args: Any) -> Any:
            try:
                return fn(*args)
            except pynvml.NVMLError:
                return None

        cuda = call(pynvml.nvmlSystemGetCudaDriverVersion)
        node = node_record("nvml", [], driver=call(pynvml.nvmlSystemGetDriverVersion),
                           cuda_driver=f"{cuda // 1000}.{cuda % 1000 // 10}" if isinstance(cuda, int) else None,
                           nvml=call(pynvml.nvmlSystemGetNVMLVersion))
        node["driver"] = _text(node["driver"]) if node["driver"] is not None else None
        node["nvml"] = _text(node["nvml"]) if node["nvml"] is not None else None
        for i in range(pynvml.nvmlDeviceGetCount()):
            node["gpus"].append(_nvml_gpu(pynvml, call, i))
        return node
    finally:
        pynvml.nvmlShutdown()


def _nvml_gpu(nv: Any, call: Any, index: int) -> dict[str, Any]:
    """One GPU's record through NVML (the calls named in the NVML API reference, :data:`NVML_DOCS`)."""
    h = nv.nvmlDeviceGetHandleByIndex(index)
    rec = empty_gpu(index)
    rec["name"] = _text(call(nv.nvmlDeviceGetName, h) or "") or None
    pci = call(nv.nvmlDeviceGetPciInfo, h)
    rec["pci_bus_id"] = _text(pci.busId) if pci is not None else None
    rec["uuid"] = _text(call(nv.nvmlDeviceGetUUID, h) or "") or None
    ecc = call(nv.nvmlDeviceGetEccMode, h)
    rec["ecc_enabled"] = bool(ecc[0]) if ecc else None
    if rec["ecc_enabled"]:
        unc = nv.NVML_MEMORY_ERROR_TYPE_UNCORRECTED
        rec["ecc_uncorrected_volatile"] = call(nv.nvmlDeviceGetTotalEccErrors, h, unc, nv.NVML_VOLATILE_ECC)
        rec["ecc_uncorrected_aggregate"] = call(nv.nvmlDeviceGetTotalEccErrors, h, unc, nv.NVML_AGGREGATE_ECC)
    sbe = call(nv.nvmlDeviceGetRetiredPages, h, nv.NVML_PAGE_RETIREMENT_CAUSE_MULTIPLE_SINGLE_BIT_ECC_ERRORS)
    dbe = call(nv.nvmlDeviceGetRetiredPages, h, nv.NVML_PAGE_RETIREMENT_CAUSE_DOUBLE_BIT_ECC_ERROR)
    rec["retired_sbe"] = len(sbe) if sbe is not None else None
    rec["retired_dbe"] = len(dbe) if dbe is not None else None
    pending = call(nv.nvmlDeviceGetRetiredPagesPendingStatus, h)
    rec["retired_pending"] = bool(pending) if pending is not None else None
    rows = call(nv.nvmlDeviceGetRemappedRows, h)
    if rows is not None:
        rec.update(remap_correctable=rows[0], remap_uncorrectable=rows[1], remap_pending=bool(rows[2]),
                   remap_failed=bool(rows[3]))
    rec["pcie_gen"] = call(nv.nvmlDeviceGetCurrPcieLinkGeneration, h)
    rec["pcie_gen_max"] = call(nv.nvmlDeviceGetMaxPcieLinkGeneration, h)  # the system's maximum with this GPU
    rec["pcie_width"] = call(nv.nvmlDeviceGetCurrPcieLinkWidth, h)
    rec["pcie_width_max"] = call(nv.nvmlDeviceGetMaxPcieLinkWidth, h)
    reasons = call(getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", nv.nvmlDeviceGetCurrentClocksThrottleReasons), h)
    rec["throttle"] = None if reasons is None else [name for bit, name in THROTTLE_BITS.items() if reasons & bit]
    for link in range(nv.NVML_NVLINK_MAX_LINKS):
        state = call(nv.nvmlDeviceGetNvLinkState, h, link)
        if state is None:
            continue  # no such link on this board
        counters = {key: call(nv.nvmlDeviceGetNvLinkErrorCounter, h, link, code) for key, code in
                    (("replay", nv.NVML_NVLINK_ERROR_DL_REPLAY), ("recovery", nv.NVML_NVLINK_ERROR_DL_RECOVERY),
                     ("crc_flit", nv.NVML_NVLINK_ERROR_DL_CRC_FLIT), ("crc_data", nv.NVML_NVLINK_ERROR_DL_CRC_DATA))}
        rec["nvlinks"].append({"link": link, "active": state == nv.NVML_FEATURE_ENABLED, **counters})
    pm = call(nv.nvmlDeviceGetPersistenceMode, h)
    rec["persistence"] = pm == nv.NVML_FEATURE_ENABLED if pm is not None else None
    mig = call(nv.nvmlDeviceGetMigMode, h)
    rec["mig"] = mig[0] == nv.NVML_DEVICE_MIG_ENABLE if mig else None
    rec["temperature_c"] = call(nv.nvmlDeviceGetTemperature, h, nv.NVML_TEMPERATURE_GPU)
    rec["temperature_slowdown_c"] = call(nv.nvmlDeviceGetTemperatureThreshold, h, nv.NVML_TEMPERATURE_THRESHOLD_SLOWDOWN)
    rec["temperature_shutdown_c"] = call(nv.nvmlDeviceGetTemperatureThreshold, h, nv.NVML_TEMPERATURE_THRESHOLD_SHUTDOWN)
    mw = call(nv.nvmlDeviceGetPowerUsage, h)
    limit = call(nv.nvmlDeviceGetEnforcedPowerLimit, h)
    rec["power_w"] = mw / 1000 if mw is not None else None
    default = call(nv.nvmlDeviceGetPowerManagementDefaultLimit, h)
    rec["power_limit_w"] = limit / 1000 if limit is not None else None
    rec["power_default_limit_w"] = default / 1000 if default is not None else None
    return rec


# --------------------------------------------------------------------------- posted: nvidia-smi -q -x / -q


_NUM = re.compile(r"-?\d+(?:\.\d+)?")


def _number(value: str | None) -> float | None:
    """``"45 C"`` -> 45.0, ``"16x"`` -> 16.0, ``"N/A"``/``None`` -> None."""
    if value is None:
        return None
    m = _NUM.search(value)
    return float(m.group()) if m else None


def _int(value: str | None) -> int | None:
    n = _number(value)
    return int(n) if n is not None else None


def _yes(value: str | None) -> bool | None:
    """``Yes``/``Enabled``/``Active`` -> True, ``No``/``Disabled``/``Not Active`` -> False, else None."""
    if value is None:
        return None
    v = value.strip().lower()
    if v in ("yes", "enabled", "active", "true"):
        return True
    if v in ("no", "disabled", "not active", "false"):
        return False
    return None


def _key(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "_", text.strip().lower()).strip("_")


def _get(tree: Mapping[str, Any], *paths: str) -> str | None:
    """The first of ``paths`` ("a/b/c", normalised keys) found in the nested dict ``tree``."""
    for path in paths:
        node: Any = tree
        for part in path.split("/"):
            if not isinstance(node, Mapping) or part not in node:
                node = None
                break
            node = node[part]
        if isinstance(node, str):
            return node
    return None


def _sum(*values: int | None) -> int | None:
    known = [v for v in values if v is not None]
    return sum(known) if known else None


def _from_tree(index: int, tree: Mapping[str, Any], bus_id: str | None) -> dict[str, Any]:
    """A GPU record from one GPU's nested dict (``nvidia-smi -q -x`` tags or ``-q`` labels, normalised by :func:`_key`).

    Both spellings are listed per field: the XML tag path first, then the text label path (``nvidia-smi -q`` prints
    the same fields as the XML, with labels).  Volatile/aggregate uncorrectable ECC: ``double_bit/total`` before
    driver 5xx, ``dram_uncorrectable`` + ``sram_uncorrectable`` after.
    """
    rec = empty_gpu(index)
    rec["pci_bus_id"] = bus_id
    rec["name"] = _get(tree, "product_name")
    rec["uuid"] = _get(tree, "uuid", "gpu_uuid")
    rec["persistence"] = _yes(_get(tree, "persistence_mode"))
    rec["mig"] = _yes(_get(tree, "mig_mode/current_mig", "mig_mode/current"))
    rec["ecc_enabled"] = _yes(_get(tree, "ecc_mode/current_ecc", "ecc_mode/current"))
    for scope in ("volatile", "aggregate"):
        old = _int(_get(tree, f"ecc_errors/{scope}/double_bit/total"))
        new = _sum(_int(_get(tree, f"ecc_errors/{scope}/dram_uncorrectable")),
                   _int(_get(tree, f"ecc_errors/{scope}/sram_uncorrectable")))
        rec[f"ecc_uncorrected_{scope}"] = new if new is not None else old
    rec["retired_sbe"] = _int(_get(tree, "retired_pages/multiple_single_bit_retirement/retired_count",
                                   "retired_pages/single_bit_ecc"))
    rec["retired_dbe"] = _int(_get(tree, "retired_pages/double_bit_retirement/retired_count",
                                   "retired_pages/double_bit_ecc"))
    rec["retired_pending"] = _yes(_get(tree, "retired_pages/pending_blacklist", "retired_pages/pending_retirement",
                                       "retired_pages/pending_page_blacklist", "retired_pages/pending_page_retirement"))
    rec["remap_correctable"] = _int(_get(tree, "remapped_rows/remapped_row_corr", "remapped_rows/correctable_error"))
    rec["remap_uncorrectable"] = _int(_get(tree, "remapped_rows/remapped_row_unc", "remapped_rows/uncorrectable_error"))
    rec["remap_pending"] = _yes(_get(tree, "remapped_rows/remapped_row_pending", "remapped_rows/pending"))
    rec["remap_failed"] = _yes(_get(tree, "remapped_rows/remapped_row_failure", "remapped_rows/remapping_failure_occurred"))
    rec["pcie_gen"] = _int(_get(tree, "pci/pci_gpu_link_info/pcie_gen/current_link_gen",
                                "pci/gpu_link_info/pcie_generation/current"))
    rec["pcie_gen_max"] = _int(_get(tree, "pci/pci_gpu_link_info/pcie_gen/max_link_gen",
                                    "pci/gpu_link_info/pcie_generation/max"))
    rec["pcie_width"] = _int(_get(tree, "pci/pci_gpu_link_info/link_widths/current_link_width",
                                  "pci/gpu_link_info/link_width/current"))
    rec["pcie_width_max"] = _int(_get(tree, "pci/pci_gpu_link_info/link_widths/max_link_width",
                                      "pci/gpu_link_info/link_width/max"))
    for section in ("clocks_throttle_reasons", "clocks_event_reasons"):
        if section not in tree:
            continue
        rec["throttle"] = rec["throttle"] or []
        flat = _flatten(tree.get(section) or {})
        for key, value in flat.items():
            name = re.sub(r"^clocks_(throttle|event)_reason_", "", key.split("/")[-1])
            if _yes(value) and name not in rec["throttle"]:
                rec["throttle"].append(name)
    rec["temperature_c"] = _number(_get(tree, "temperature/gpu_temp", "temperature/gpu_current_temp"))
    rec["temperature_slowdown_c"] = _number(_get(tree, "temperature/gpu_temp_slow_threshold", "temperature/gpu_slowdown_temp"))
    rec["temperature_shutdown_c"] = _number(_get(tree, "temperature/gpu_temp_max_threshold", "temperature/gpu_shutdown_temp"))
    for section in ("gpu_power_readings", "power_readings"):
        if section in tree:
            rec["power_w"] = _number(_get(tree, f"{section}/power_draw", f"{section}/instant_power_draw",
                                          f"{section}/average_power_draw"))
            rec["power_limit_w"] = _number(_get(tree, f"{section}/enforced_power_limit", f"{section}/current_power_limit",
                                                f"{section}/power_limit"))
            rec["power_default_limit_w"] = _number(_get(tree, f"{section}/default_power_limit"))
            break
    return rec


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    out: dict[str, str] = {}
    for k, v in tree.items():
        if isinstance(v, Mapping):
            out[f"{prefix}{k}"] = v.get("_value", "") if "_value" in v else ""
            out.update(_flatten(v, f"{prefix}{k}/"))
        else:
            out[f"{prefix}{k}"] = v
    return out


def _xml_tree(el: ET.Element) -> Any:
    children = list(el)
    if not children:
        return (el.text or "").strip()
    out: dict[str, Any] = {}
    for child in children:
        out.setdefault(_key(child.tag), _xml_tree(child))
    return out


def from_smi_xml(text: str) -> dict[str, Any]:
    """The node record (module docstring) from ``nvidia-smi -q -x`` output.

    Raises:
        ValueError: the text is not XML, or has no ``<nvidia_smi_log>`` root (names what was found).
    """
    body = re.sub(r"<!DOCTYPE[^>]*>", "", text).strip()  # the DTD file is not shipped with a posted output
    truncated = ""
    try:
        root = ET.fromstring(body)
    except ET.ParseError as exc:
        # a posted output is often cut short: keep every element that was complete before the cut
        parser = ET.XMLPullParser(events=("start",))
        root = None
        try:
            parser.feed(body)
            parser.close()
        except ET.ParseError:
            pass
        for _, el in parser.read_events():
            root = el
            break
        if root is None:
            raise ValueError(f"nvidia-smi -q -x: not XML ({exc})") from None
        truncated = f"truncated XML ({exc}): fields after the cut are unknown"
    if root.tag != "nvidia_smi_log":
        raise ValueError(f"nvidia-smi -q -x: root element <{root.tag}>, expected <nvidia_smi_log>")
    gpus = [_from_tree(i, _xml_tree(g), g.get("id")) for i, g in enumerate(root.findall("gpu"))]
    node = node_record("nvidia-smi -q -x", gpus, driver=root.findtext("driver_version"),
                       cuda_driver=root.findtext("cuda_version"))
    if truncated:
        node["note"] = truncated
    return node


_LINE = re.compile(r"^(?P<indent>\s*)(?P<key>[^:]+?)\s*(?::\s*(?P<value>.*))?$")
_GPU_HEADER = re.compile(r"^GPU\s+([0-9A-Fa-f]{4,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-9A-Fa-f])\s*$")


def _text_tree(lines: Sequence[str]) -> dict[str, Any]:
    """Nested dict from indented ``Key : Value`` lines (a key without a value opens a section)."""
    root: dict[str, Any] = {}
    stack: list[tuple[int, dict[str, Any]]] = [(-1, root)]
    for raw in lines:
        if not raw.strip() or raw.lstrip().startswith(("=", "#")):
            continue
        m = _LINE.match(raw.rstrip())
        if not m:
            continue
        indent = len(m.group("indent").expandtabs(4))
        while stack and indent <= stack[-1][0]:
            stack.pop()
        parent = stack[-1][1] if stack else root
        key = _key(m.group("key"))
        value = m.group("value")
        if value is None or value == "":
            child: dict[str, Any] = {}
            parent.setdefault(key, child)
            stack.append((indent, parent[key] if isinstance(parent[key], dict) else child))
        else:
            if key in parent and isinstance(parent[key], dict):  # "HW Slowdown : Active" with nested reasons under it
                parent[key]["_value"] = value.strip()
            else:
                parent.setdefault(key, value.strip())
            stack.append((indent, parent[key] if isinstance(parent.get(key), dict) else {}))
    return root


def from_smi_text(text: str) -> dict[str, Any]:
    """The node record (module docstring) from ``nvidia-smi -q`` text, whole or a posted fragment.

    Each ``GPU 00000000:3B:00.0`` header opens a GPU; text without one is read as a single GPU of unknown bus id
    (a block such as ``Remapped Rows`` quoted alone in an issue).

    Raises:
        ValueError: the text holds no ``Key : Value`` line at all.
    """
    lines = text.splitlines()
    header = _text_tree([ln for ln in lines if not ln.startswith((" ", "\t"))])
    blocks: list[tuple[str | None, list[str]]] = []
    for ln in lines:
        m = _GPU_HEADER.match(ln.strip()) if not ln.startswith((" ", "\t")) else None
        if m:
            blocks.append((m.group(1), []))
        elif blocks:
            blocks[-1][1].append(ln)
    if not blocks:
        blocks = [(None, lines)]
    gpus = []
    for i, (bus, body) in enumerate(blocks):
        # the first indented level of a GPU block is its fields: dedent it so the tree's keys are the field names
        indents = [len(ln) - len(ln.lstrip()) for ln in body if ln.strip()]
        cut = min(indents) if indents else 0
        tree = _text_tree([ln[cut:] for ln in body])
        if not tree:
            continue
        gpus.append(_from_tree(i, tree, bus))
    if not gpus:
        raise ValueError("nvidia-smi -q: no 'Key : Value' line found")
    return node_record("nvidia-smi -q", gpus, driver=_get(header, "driver_version"), cuda_driver=_get(header, "cuda_version"))


def read_posted(text: str) -> dict[str, Any]:
    """:func:`from_smi_xml` when the text is XML (starts with ``<``), else :func:`from_smi_text`."""
    return from_smi_xml(text) if text.lstrip().startswith("<") else from_smi_text(text)


# --------------------------------------------------------------------------- XID errors since boot (kernel log)

_XID = re.compile(r"NVRM: Xid \((?:PCI:)?(?P<bus>[0-9A-Fa-f:.]+)\): (?P<xid>\d+),\s*(?P<text>.*)")


def parse_xids(text: str) -> list[dict[str, Any]]:
    """XID events from kernel-log text: ``[{"xid": int, "pci_bus_id": "0000:2b:00", "text": the rest, "line"}]``.

    The line format is the NVIDIA driver's (``NVRM: Xid (PCI:0000:2b:00): 79, GPU has fallen off the bus.``),
    documented in https://docs.nvidia.com/deploy/xid-errors/index.html ("Viewing Xid Messages").
    """
    out = []
    for line in text.splitlines():
        m = _XID.search(line)
        if m:
            out.append({"xid": int(m.group("xid")), "pci_bus_id": m.group("bus"), "text": m.group("text").strip(),
                        "line": line.strip()})
    return out


KERNEL_LOGS = (("journalctl -k -b", ["journalctl", "-k", "-b", "-o", "short-iso", "--no-pager", "-g", "NVRM: Xid"]),
               ("dmesg", ["dmesg", "-T"]))


def read_kernel_xids(timeout_s: float = 10.0) -> dict[str, Any]:
    """XID events since boot from the first kernel log this process can read.

    Tries ``journalctl -k -b`` (this boot), then ``dmesg`` (the ring buffer: since boot unless it wrapped; may need
    root with ``kernel.dmesg_restrict=1``), then ``/var/log/kern.log``.

    Returns:
        ``{"source": the log read or None, "events": parse_xids(...), "tried": {source: why it failed}}``.
    """
    tried: dict[str, str] = {}
    for name, argv in KERNEL_LOGS:
        if shutil.which(argv[0]) is None:
            tried[name] = "not installed"
            continue
        try:
            proc = run_bounded(argv, timeout_s)
        except OSError as exc:
            tried[name] = str(exc)
            continue
        if proc.returncode == 0 or (name.startswith("journalctl") and proc.returncode == 1 and not proc.stderr.strip()):
            return {"source": name, "events": parse_xids(proc.stdout), "tried": tried}  # journalctl -g: 1 = no match
        tried[name] = (proc.stderr.strip().splitlines() or [f"exit {proc.returncode}"])[-1]
    path = "/var/log/kern.log"
    try:
        with open(path, errors="replace") as fh:
            return {"source": path, "events": parse_xids(fh.read()), "tried": tried}
    except OSError as exc:
        tried[path] = exc.strerror or str(exc)
    return {"source": None, "events": [], "tried": tried}


# --------------------------------------------------------------------------- DCGM diagnostics

_ROW = re.compile(r"^\|(?P<name>[^|]*)\|(?P<result>[^|]*)\|\s*$")
_SECTION = re.compile(r"^[|+]-+\s+(?P<section>[A-Za-z][A-Za-z ]*?)\s+-+\+")
_PER_GPU = re.compile(r"(?:GPU(?P<a>\d+)\s*:\s*(?P<ra>Pass|Fail|Warn|Skip))|(?:(?P<rb>Pass|Fail|Warn|Skip)\s*-\s*GPUs?:\s*(?P<b>[\d, ]+))",
                      re.I)
RESULTS = ("Pass", "Skip", "Warn", "Fail")
"""DCGM's test outcomes, least to most severe (DCGM user guide, "dcgmi diag" output:
https://docs.nvidia.com/datacenter/dcgm/latest/user-guide/dcgm-diagnostics.html)."""


def parse_dcgmi_diag(text: str) -> list[dict[str, Any]]:
    """The tests of a ``dcgmi diag -r N`` table (DCGM 3.x and 4.x layouts).

    Returns:
        ``[{"section": "Hardware", "test": "GPU Memory", "result": worst of the row, "gpus": {index: result},
        "messages": ["Warning: GPU 0 Error using CUDA API cuCtxCreate ...", ...]}]``; ``Warning``/``Info``/``Error``
        rows (text wrapped over several table lines) are joined and attached to the test above them.  Metadata rows
        (``DCGM Version``...) come back as a test of section ``Metadata``.
    """
    tests: list[dict[str, Any]] = []
    section = ""
    current: dict[str, Any] | None = None
    note: list[str] | None = None
    for raw in text.splitlines():
        line = raw.rstrip()
        sm = _SECTION.match(line)
        if sm:
            section, current, note = sm.group("section").strip(), None, None
            continue
        m = _ROW.match(line)
        if not m:
            continue
        name, result = m.group("name").strip(), m.group("result").strip()
        if name in ("Diagnostic",) and result == "Result":
            continue
        # DCGM wraps a message at the cell's width minus its padding (45 of 48 characters), cutting words: a line
        # that fills it continues the word on the next line; a shorter one ended at a space
        seg = m.group("result")[1:].rstrip()
        sep = "" if len(seg) >= len(m.group("result")) - 3 else " "
        if name in ("Warning", "Info", "Error"):
            note = [f"{name}: ", seg.lstrip(), sep]
            if current is not None:
                current["messages"].append(note)
            continue
        if not name:
            if note is not None:  # a wrapped message
                note += [seg, sep]
                continue
            if current is not None:
                _add_result(current, result)
            continue
        note = None
        current = {"section": section, "test": name, "result": "", "gpus": {}, "messages": []}
        tests.append(current)
        _add_result(current, result)
    for t in tests:
        t["messages"] = ["".join(parts).strip() for parts in t["messages"]]
    return tests


def _add_result(test: dict[str, Any], text: str) -> None:
    if test["section"] == "Metadata":
        test["result"] = (test["result"] + " " + text).strip()
        return
    found = False
    for m in _PER_GPU.finditer(text):
        found = True
        res = (m.group("ra") or m.group("rb")).capitalize()
        ids = [m.group("a")] if m.group("a") else [g for g in re.split(r"[, ]+", m.group("b")) if g]
        for g in ids:
            test["gpus"][int(g)] = res
        test["result"] = max([test["result"], res] if test["result"] else [res], key=RESULTS.index)
    word = text.split(" ")[0].capitalize() if text else ""
    if not found and word in RESULTS:
        test["result"] = max([test["result"], word] if test["result"] else [word], key=RESULTS.index)


def run_dcgmi_diag(level: int = 1, timeout_s: float = 300.0) -> dict[str, Any]:
    """``dcgmi diag -r level`` on this node where DCGM is installed; its table parsed (:func:`parse_dcgmi_diag`).

    Level 1 (quick, seconds) and 2 (medium, about two minutes) are NVIDIA's tiers (DCGM user guide,
    https://docs.nvidia.com/datacenter/dcgm/latest/user-guide/dcgm-diagnostics.html).

    Returns:
        ``{"ran": bool, "level", "returncode", "tests", "output" (the text, for the report), "why" (when not ran)}``.

    Raises:
        ValueError: ``level`` not 1, 2 or 3.
    """
    if level not in (1, 2, 3):
        raise ValueError(f"level={level!r}: accepted values are 1, 2, 3 (dcgmi diag -r)")
    exe = shutil.which("dcgmi")
    if exe is None:
        return {"ran": False, "level": level, "why": "dcgmi not installed (DCGM: https://github.com/NVIDIA/DCGM)"}
    proc = run_bounded([exe, "diag", "-r", str(level)], timeout_s)
    return {"ran": True, "level": level, "returncode": proc.returncode, "tests": parse_dcgmi_diag(proc.stdout),
            "output": (proc.stdout + proc.stderr)[-20000:]}


# --------------------------------------------------------------------------- what the job asked for


def expected_gpus(environ: Mapping[str, str] | None = None) -> dict[str, Any]:
    """How many GPUs this node should show, from what the job asked for.

    ``SLURM_GPUS_ON_NODE`` (SLURM: the GPUs allocated on this node), ``SLURM_GPUS_PER_NODE`` (``--gpus-per-node``,
    ``8`` or ``a100:8``), ``CUDA_VISIBLE_DEVICES`` (a list: its length; sources: https://slurm.schedmd.com/sbatch.html
    "OUTPUT ENVIRONMENT VARIABLES", CUDA's "CUDA Environment Variables").

    Returns:
        ``{"expected": int or None, "from": the variable it came from, "values": {var: raw}}``; the first set
        variable in the order above wins.
    """
    env = os.environ if environ is None else environ
    values = {k: env.get(k) for k in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE", "CUDA_VISIBLE_DEVICES") if env.get(k)}
    for var in ("SLURM_GPUS_ON_NODE", "SLURM_GPUS_PER_NODE"):
        raw = values.get(var, "")
        m = re.search(r"(\d+)\s*$", raw.split(",")[0])
        if m:
            return {"expected": int(m.group(1)), "from": var, "values": values}
    cvd = values.get("CUDA_VISIBLE_DEVICES")
    if cvd is not None:
        ids = [d for d in cvd.split(",") if d.strip() and d.strip() != "-1"]
        return {"expected": len(ids), "from": "CUDA_VISIBLE_DEVICES", "values": values}
    return {"expected": None, "from": None, "values": values}


def node_health(*, dcgm_level: int = 0, environ: Mapping[str, str] | None = None,
                dcgm_timeout_s: float = 300.0) -> dict[str, Any]:
    """Everything this module reads on this node, JSON-serialisable, for the per-node step and the one-node check.

    Args:
        dcgm_level: 0 (do not run DCGM), 1 or 2 (``dcgmi diag -r``, where installed and a GPU is present).
        environ: the job's environment (:func:`expected_gpus`).
        dcgm_timeout_s: bound on ``dcgmi diag``, seconds.

    Returns:
        ``{"host", "nvml": read_nvml(), "xids": read_kernel_xids() (only with a GPU), "asked": expected_gpus(),
        "dcgm": run_dcgmi_diag() or None, "read_s"}``.
    """
    t0 = time.monotonic()
    nvml = read_nvml()
    has_gpu = bool(nvml["gpus"])
    out = {"host": socket.gethostname(), "nvml": nvml, "asked": expected_gpus(environ),
           "xids": read_kernel_xids() if has_gpu else None,
           "dcgm": run_dcgmi_diag(dcgm_level, dcgm_timeout_s) if has_gpu and dcgm_level else None}
    out["read_s"] = round(time.monotonic() - t0, 3)
    json.dumps(out)  # fails here, not in a report writer, if a field is not JSON
    return out
