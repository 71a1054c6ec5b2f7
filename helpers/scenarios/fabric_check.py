"""Per-node GPU fabric check before a multi-node launch: is nvidia-fabricmanager up and at the driver's version (MN1)?

On NVSwitch systems (HGX/DGX A100, H100, H200, B200) every node must run
``nvidia-fabricmanager``, at exactly the driver's version, before its GPUs can join an NVLink
fabric; one node without it stops the whole job at NCCL init, silently (seeds/multinode.md MN1;
https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/).  Run this on EVERY node
before launching (``srun --ntasks-per-node=1 python fabric_check.py``); it prints one line per
check and exits 1 on a FAIL:

* ``gpu.driver``: the driver version (``nvidia-smi --query-gpu=driver_version``); no driver:
  ``[SKIP]``, not a GPU node, exit 0;
* ``fabric.nvswitch``: NVSwitch devices (``/proc/driver/nvidia-nvswitch/devices/*``,
  ``/dev/nvidia-nvswitch*``); none (PCIe GPUs, e.g. Gilbreth's A100 PCIe) and no GPU reporting a
  fabric state: fabric manager is not needed, OK;
* ``fabric.service``: ``systemctl is-active nvidia-fabricmanager`` is ``active`` (WARN when there is
  no systemctl, e.g. in a container: then ``fabric.gpu`` decides);
* ``fabric.version``: ``nv-fabricmanager --version`` (``Fabric Manager version is : X``) equals
  the driver version (a mismatch makes the service refuse to start: "fabric manager NVIDIA GPU
  driver interface version ... don't match with driver version ...", NVIDIA/gpu-operator#544);
* ``fabric.gpu``: every GPU's ``Fabric State`` in ``nvidia-smi -q`` is ``Completed`` with
  ``Status : Success`` (``In Progress`` = the GPU never registered: fabric manager not running).
  When every GPU has joined, a missing or inactive host unit (``fabric.service``/``fabric.version``)
  is a WARN, not a FAIL: the fabric manager then runs outside this host's systemd (GB200/GB300 NVL
  compute trays, where the NMX-Controller hosts the Global Fabric Manager; GPU-Operator hosts, where
  it runs in the driver container; NVIDIA/NVSentinel#883).  Not verified on such hardware.

Example::

    python helpers/scenarios/fabric_check.py            # this node
    srun --ntasks-per-node=1 python helpers/scenarios/fabric_check.py --json
"""

from __future__ import annotations

import argparse
import glob
import json
import re
import shutil
import subprocess
import sys

SERVICE = "nvidia-fabricmanager"
_FM_VERSION = re.compile(r"Fabric Manager version is\s*:\s*(\S+)")
_KV = re.compile(r"^\s*(\w[\w ]*?)\s*:\s*(.*?)\s*$")
URL = "https://docs.nvidia.com/datacenter/tesla/fabric-manager-user-guide/"


def parse_driver(text: str) -> str | None:
    """The driver version from ``nvidia-smi --query-gpu=driver_version --format=csv,noheader`` (first GPU)."""
    lines = [ln.strip() for ln in (text or "").splitlines() if ln.strip()]
    return lines[0] if lines and re.fullmatch(r"\d+(\.\d+)+", lines[0]) else None


def parse_fm_version(text: str) -> str | None:
    """The version from ``nv-fabricmanager --version`` (``Fabric Manager version is : 580.159.03``), or None."""
    m = _FM_VERSION.search(text or "")
    return m.group(1) if m else None


def parse_fabric_states(text: str) -> list[tuple[str, str]]:
    """``(State, Status)`` of every GPU's ``Fabric`` block in ``nvidia-smi -q`` output, in GPU order."""
    states: list[tuple[str, str]] = []
    lines = (text or "").splitlines()
    for i, line in enumerate(lines):
        if line.strip() != "Fabric":
            continue
        block = {}
        for nxt in lines[i + 1:i + 4]:
            m = _KV.match(nxt)
            if m:
                block[m.group(1)] = m.group(2)
        states.append((block.get("State", "N/A"), block.get("Status", "N/A")))
    return states


def grade(driver: str | None, nvswitches: int, service: str, fm_version_text: str, smi_q: str) -> list[dict]:
    """The check records from what the node reported.

    Args:
        driver: driver version (None: no NVIDIA driver).
        nvswitches: number of NVSwitch devices seen.
        service: output of ``systemctl is-active nvidia-fabricmanager`` (``active``, ``inactive``,
            ``failed``, ``unknown``, or "" when systemctl is missing: a container, where the service and
            version checks become WARN and the GPUs' own fabric state decides).
        fm_version_text: output of ``nv-fabricmanager --version`` ("" when not installed).
        smi_q: output of ``nvidia-smi -q``.

    Returns:
        ``[{"id", "status" (OK/WARN/FAIL/SKIP), "title", "fix"}]``.

    Raises:
        ValueError: ``nvswitches`` is negative.
    """
    if nvswitches < 0:
        raise ValueError(f"nvswitches={nvswitches}: must be >= 0")
    if not driver:
        return [{"id": "gpu.driver", "status": "SKIP", "fix": "",
                 "title": "no NVIDIA driver (nvidia-smi missing or failed): not a GPU node, nothing to check"}]
    out = [{"id": "gpu.driver", "status": "OK", "title": f"driver {driver}", "fix": ""}]
    states = parse_fabric_states(smi_q)
    reported = [s for s in states if s[0] not in ("N/A", "")]
    if nvswitches == 0 and not reported:
        out.append({"id": "fabric.nvswitch", "status": "OK", "fix": "",
                    "title": "no NVSwitch and no GPU fabric state: PCIe/NVLink-bridge GPUs, nvidia-fabricmanager "
                             "not needed"})
        return out
    out.append({"id": "fabric.nvswitch", "status": "OK", "fix": "",
                "title": f"{nvswitches} NVSwitch device(s), {len(reported)} GPU(s) report a fabric state: "
                         "nvidia-fabricmanager required"})
    state = service.strip()
    host_view = bool(state)  # no systemctl: a container, which sees the GPUs but not the host's services
    if not host_view:
        out.append({"id": "fabric.service", "status": "WARN", "title": f"cannot see {SERVICE} (no systemctl: "
                    "a container?); fabric.gpu below still tells whether the GPUs joined the fabric",
                    "fix": f"run `systemctl status {SERVICE}` on the host"})
    else:
        out.append({"id": "fabric.service", "status": "OK" if state == "active" else "FAIL",
                    "title": f"{SERVICE}: {state}",
                    "fix": "" if state == "active" else
                    f"systemctl restart {SERVICE}; journalctl -u {SERVICE} -b | tail (a version mismatch or a sick "
                    f"NVSwitch); if it will not start, drain this node and relaunch without it (MN1; {URL})"})
    fm = parse_fm_version(fm_version_text)
    if fm is None:
        out.append({"id": "fabric.version", "status": "FAIL" if host_view else "WARN",
                    "title": "nv-fabricmanager not installed or silent" + ("" if host_view else " (not visible here)"),
                    "fix": f"install the fabric manager package of exactly driver {driver} ({URL})"})
    else:
        same = fm == driver
        out.append({"id": "fabric.version", "status": "OK" if same else "FAIL",
                    "title": f"fabric manager {fm} {'=' if same else '!='} driver {driver}",
                    "fix": "" if same else f"install fabric manager {driver} (or the driver matching {fm}), then "
                                           f"systemctl restart {SERVICE}"})
    bad = [f"GPU {i}: {st}/{status}" for i, (st, status) in enumerate(states)
           if st not in ("N/A", "") and not (st == "Completed" and status == "Success")]
    out.append({"id": "fabric.gpu", "status": "FAIL" if bad else "OK",
                "title": ("; ".join(bad) if bad else
                          f"{len(reported)} GPU(s) registered with the fabric (Completed/Success)"),
                "fix": "" if not bad else f"'In Progress' = the GPU never registered: {SERVICE} is not running or "
                                          f"not compatible; fix fabric.service / fabric.version, then re-check"})
    if reported and not bad:  # the GPUs joined the fabric: a fabric manager runs, just not as this host's unit
        for rec in out:
            if rec["id"] in ("fabric.service", "fabric.version") and rec["status"] == "FAIL":
                rec["status"] = "WARN"
                rec["title"] += (" - but every GPU joined the fabric, so the fabric manager runs elsewhere "
                                 "(GB200/GB300 NVL: NMX-Controller on the switch trays; GPU Operator: the driver container)")
    return out


def _cmd(argv: list[str], timeout_s: float) -> str:
    """stdout of ``argv`` ("" when the tool is missing, fails to start, or times out)."""
    if shutil.which(argv[0]) is None:
        return ""
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return ""


def probe(timeout_s: float) -> dict:
    """Run the node's commands; return the raw facts :func:`grade` takes."""
    driver = parse_driver(_cmd(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], timeout_s))
    switches = set(glob.glob("/proc/driver/nvidia-nvswitch/devices/*")) | set(glob.glob("/dev/nvidia-nvswitch[0-9]*"))
    return {"driver": driver, "nvswitches": len(switches) if driver else 0,
            "service": _cmd(["systemctl", "is-active", SERVICE], timeout_s) if driver else "",
            "fm_version_text": _cmd(["nv-fabricmanager", "--version"], timeout_s) if driver else "",
            "smi_q": _cmd(["nvidia-smi", "-q"], timeout_s) if driver else ""}


def main(argv: list[str] | None = None) -> int:
    """Check this node; print one line per check (or JSON); exit 1 on a FAIL, 2 on bad input."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--timeout-s", type=float, default=20.0, help="limit per command, seconds (default 20)")
    parser.add_argument("--json", action="store_true", help="print the records as JSON")
    args = parser.parse_args(argv)
    if args.timeout_s <= 0:
        parser.error(f"--timeout-s={args.timeout_s}: must be > 0 seconds")
    import socket

    records = grade(**probe(args.timeout_s))
    host = socket.gethostname()
    if args.json:
        print(json.dumps({"host": host, "checks": records}, indent=1))
    else:
        for r in records:
            print(f"[{r['status']}] {r['id']} ({host}): {r['title']}" + (f"\n       -> {r['fix']}" if r["fix"] else ""))
    return 1 if any(r["status"] == "FAIL" for r in records) else 0


if __name__ == "__main__":
    sys.exit(main())
