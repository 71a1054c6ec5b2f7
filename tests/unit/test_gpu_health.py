"""GPU health readers and graders (issue 22) on real outputs posted in public issues (tests/data/gpu/manifest.json),
and the gate: on this CPU machine the live NVML path says "no GPU on this node" as INFO."""

from __future__ import annotations

import json

import pytest
from support import ROOT

from helpers.allocation import gpu_grades, gpu_health, local

DATA = ROOT / "tests" / "data" / "gpu"
MANIFEST = json.loads((DATA / "manifest.json").read_text())["files"]


def _health(node: dict, xids: dict | None = None, dcgm: dict | None = None, asked: int | None = None) -> dict:
    return {"nvml": node, "xids": xids, "dcgm": dcgm, "asked": {"expected": asked, "from": "SLURM_GPUS_ON_NODE"}}


def by_id(checks):
    return {c.id: c for c in checks}


def test_manifest_lists_every_file_with_its_url():
    files = {p.name for p in DATA.iterdir() if p.name != "manifest.json"}
    assert files == set(MANIFEST)
    for name, entry in MANIFEST.items():
        assert entry["url"].startswith("https://github.com/"), name
        assert entry["fault"] and entry["kept"], name


def test_remapped_rows_pending_fragment_asks_for_a_reset():
    name = "smi-q-remapped-rows-pending.gpud-pr80.txt"
    node = gpu_health.from_smi_text((DATA / name).read_text())
    gpu = node["gpus"][0]
    assert (gpu["remap_uncorrectable"], gpu["remap_correctable"], gpu["remap_pending"]) == (4, 0, True)
    checks = by_id(gpu_grades.grade_gpu_health(_health(node)))
    want = MANIFEST[name]["expect"]
    c = checks[want["check"]]
    assert (c.status, c.values["action"]) == (want["status"], want["action"])
    assert c.remediation.startswith("reset:") and "a100-gpu-mem-error-mgmt" in c.source
    assert [k for k in checks if k != want["check"]] == ["gpu.count"]  # nothing else is reported by the fragment


def test_xid79_in_the_kernel_log_drains_the_node():
    name = "kernel-xid79.open-gpu-kernel-modules-1151.log"
    events = gpu_health.parse_xids((DATA / name).read_text())
    assert [(e["xid"], e["pci_bus_id"]) for e in events] == [(79, "0000:2b:00")]
    gpus = [dict(gpu_health.empty_gpu(0), pci_bus_id="00000000:2B:00.0", name="NVIDIA GeForce RTX 5080")]
    checks = gpu_grades.grade_xids({"source": "journalctl -k -b", "events": events}, gpus, "node7")
    assert len(checks) == 1
    c = checks[0]
    assert (c.id, c.status, c.values["action"], c.faulty) == ("gpu.xid79.gpu0", "FAIL", "drain", ["node7"])
    assert "node7 GPU 0 (00000000:2B:00.0)" in c.title and "fallen off the bus" in c.title
    assert c.evidence == [events[0]["line"]] and "xid-errors" in c.source


def test_dcgm_memory_failure_names_gpu0_only():
    name = "dcgmi-diag-r2-gpu0-memory-fail.go-dcgm-52.txt"
    tests = gpu_health.parse_dcgmi_diag((DATA / name).read_text())
    assert [(t["section"], t["test"], t["result"], t["gpus"]) for t in tests] == [
        ("Hardware", "GPU Memory", "Fail", {1: "Pass", 0: "Fail"})]
    assert tests[0]["messages"][0].endswith("Unable to create CUDA context: 'CUDA-capable device(s) is/are busy or "
                                            "unavailable'.")
    assert "Reset GPU. Restart DCGM." in tests[0]["messages"][0]  # the words DCGM wrapped mid-way are joined
    checks = gpu_grades.grade_dcgm({"ran": True, "level": 2, "tests": tests})
    assert [(c.id, c.status, c.values["gpu_index"]) for c in checks] == [("gpu.dcgm.gpu_memory", "FAIL", [0])]
    assert checks[0].values["action"] == "replace"


def test_dcgm_4x_layout_reads_every_gpu():
    name = "dcgmi-diag-4.2.3-layout.dcgm-253.txt"
    tests = gpu_health.parse_dcgmi_diag((DATA / name).read_text())
    meta = {t["test"]: t["result"] for t in tests if t["section"] == "Metadata"}
    assert meta == {"DCGM Version": "4.2.3", "Driver Version Detected": "570.148.08",
                    "GPU Device IDs Detected": "26b9, 26b9, 26b9, 26b9"}
    software = next(t for t in tests if t["test"] == "software")
    assert software["gpus"] == {0: "Pass", 1: "Pass", 2: "Pass", 3: "Pass"} and software["result"] == "Pass"
    checks = gpu_grades.grade_dcgm({"ran": True, "level": 1, "tests": tests})
    assert [(c.id, c.status) for c in checks] == [("gpu.dcgm", "OK")]


def test_truncated_xml_keeps_what_was_posted_and_warns_on_persistence():
    name = "smi-q-x-persistence-disabled.nvidia-smi-exporter-1.xml"
    node = gpu_health.read_posted((DATA / name).read_text())
    assert node["source"] == "nvidia-smi -q -x" and "truncated" in node["note"]
    assert (node["driver"], node["cuda_driver"]) == ("430.26", "10.2")
    gpu = node["gpus"][0]
    assert (gpu["name"], gpu["pci_bus_id"], gpu["persistence"]) == ("GeForce GTX 1080", "00000000:01:00.0", False)
    c = by_id(gpu_grades.grade_gpu_health(_health(node), node="node3"))["gpu.persistence.gpu0"]
    assert (c.status, c.values["action"], c.node, c.faulty) == ("WARN", "fix the configuration", "node3", ["node3"])
    assert "nvidia-smi -pm 1" in c.remediation and "NVSentinel/pull/772" in c.source


def test_text_and_xml_map_to_the_same_record():
    """The same fields, spelled as nvidia-smi -q prints them and as -q -x tags them, give one record."""
    text = ("GPU 00000000:3B:00.0\n    Product Name : NVIDIA A100-SXM4-80GB\n    Persistence Mode : Enabled\n"
            "    PCI\n        GPU Link Info\n            PCIe Generation\n                Max : 4\n                Current : 4\n"
            "            Link Width\n                Max : 16x\n                Current : 8x\n")
    xml = ("<nvidia_smi_log><gpu id=\"00000000:3B:00.0\"><product_name>NVIDIA A100-SXM4-80GB</product_name>"
           "<persistence_mode>Enabled</persistence_mode><pci><pci_gpu_link_info><pcie_gen><max_link_gen>4</max_link_gen>"
           "<current_link_gen>4</current_link_gen></pcie_gen><link_widths><max_link_width>16x</max_link_width>"
           "<current_link_width>8x</current_link_width></link_widths></pci_gpu_link_info></pci></gpu></nvidia_smi_log>")
    a, b = gpu_health.from_smi_text(text)["gpus"][0], gpu_health.from_smi_xml(xml)["gpus"][0]
    assert a == b and (a["pcie_width"], a["pcie_width_max"]) == (8, 16)
    pcie = by_id(gpu_grades.grade_gpu_health(_health(gpu_health.from_smi_xml(xml))))["gpu.pcie.gpu0"]
    assert (pcie.status, pcie.values["action"]) == ("WARN", "reseat")


def test_missing_gpu_against_what_the_job_asked_for():
    node = gpu_health.node_record("nvml", [dict(gpu_health.empty_gpu(i), pci_bus_id=f"0000:{i:02x}:00.0") for i in range(7)],
                                  driver="550.54.15")
    c = by_id(gpu_grades.grade_gpu_health(_health(node, asked=8), node="n1"))["gpu.count"]
    assert (c.status, c.values["action"], c.faulty) == ("FAIL", "drain", ["n1"]) and "7 GPU(s)" in c.title
    env = {"SLURM_GPUS_PER_NODE": "a100:8", "CUDA_VISIBLE_DEVICES": "0,1"}
    assert gpu_health.expected_gpus(env)["expected"] == 8
    assert gpu_health.expected_gpus({"CUDA_VISIBLE_DEVICES": "0,1"}) == {
        "expected": 2, "from": "CUDA_VISIBLE_DEVICES", "values": {"CUDA_VISIBLE_DEVICES": "0,1"}}


def test_driver_versions_differ_across_nodes():
    def h(driver):
        return {"nvml": gpu_health.node_record("nvml", [gpu_health.empty_gpu(0)], driver=driver, cuda_driver="12.4",
                                               nvml="12." + driver)}
    c = gpu_grades.grade_gpu_versions({"a": h("550.54.15"), "b": h("550.54.15"), "c": h("535.104.05")})
    assert (c.status, c.faulty) == ("FAIL", ["c"]) and "driver" in c.values["differing"]
    assert gpu_grades.grade_gpu_versions({"a": h("550.54.15"), "b": h("550.54.15")}).status == "OK"


def test_action_must_be_known():
    with pytest.raises(ValueError, match="action='reboot'"):
        gpu_grades._gpu_check("gpu.x", "", gpu_health.empty_gpu(0), "t", "WARN", 1, "0", "reboot", "", "")


def test_no_gpu_on_this_cpu_node_is_info():
    """The live path on this machine: NVML (nvidia-ml-py) finds no driver; nothing pretends a GPU result."""
    checks = local.gpu_checks(environ={})
    assert [(c.id, c.status) for c in checks] == [("gpu.health", "INFO")]
    assert "no GPU on this node" in checks[0].title and checks[0].values["error"]
    # a job that asked for GPUs on a node that has none is a FAIL, not an INFO
    asked = local.gpu_checks(environ={"SLURM_GPUS_ON_NODE": "4"})
    assert [(c.id, c.status) for c in asked] == [("gpu.health", "FAIL")]
