"""NCCL's release-notes fixes (helpers/data/nccl_release_fixes.json) and the verdict that attaches them to a log.

The generator reads each release's notes from NCCL's git history; these tests check the item splitting on notes
written the way NCCL writes them, the reading of each fix (its symptom, the NCCL features it names), that a log
gets only the fixes of later releases for its own symptom and feature, and, where a clone of NVIDIA/nccl is at hand,
that the file is not behind the clone's newest release.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from helpers import nccl_log as nl
from helpers.nccl_log import catalog, generate

CLONE = Path(os.environ.get("NCCL_SRC", "/work/.mirror/NVIDIA+nccl/repo"))
DATA = Path(__file__).resolve().parents[1] / "data" / "nccl"


def test_note_items_unwrap_paragraphs_and_bullets() -> None:
    notes = ("Fix hang with Collnet on bfloat16 on systems with less than one NIC\n"
             "per GPU.\n"
             "Fix net/IB error path. Github PR #1164\n"
             "Fix collnet rail mapping with split comm.\n"
             "\n"
             "NVLink SHARP (NVLS) improvements\n"
             " * Gracefully fall back by default to other transports if NVLS\n"
             "   initialization fails.\n"
             " * Fixes a crash when network plugin assignment fails.\n")
    items = generate.note_items(notes)
    assert items == ["Fix hang with Collnet on bfloat16 on systems with less than one NIC per GPU.",
                     "Fix net/IB error path. Github PR #1164", "Fix collnet rail mapping with split comm.",
                     "NVLink SHARP (NVLS) improvements",
                     "Gracefully fall back by default to other transports if NVLS initialization fails.",
                     "Fixes a crash when network plugin assignment fails."]
    assert [bool(generate.FIX_VERB.match(i)) for i in items] == [True, True, True, False, False, True]


def test_fixes_are_read_for_symptom_and_feature() -> None:
    fixes = {f["text"]: f for f in catalog.load_release_fixes()}
    shm = fixes["Fix crash when shared memory creation fails."]
    assert shm["release"] == "2.18.3" and shm["symptom"] == "crash" and shm["features"] == {"shared memory"}
    a2a = fixes["Fix hang during A2A connection."]
    assert a2a["symptom"] == "hang" and "alltoall" in a2a["features"]
    uds = fixes["Fix UDS connection failure when using ncclCommSplit. Issue #1185"]
    assert uds["symptom"] == "error" and uds["features"] >= {"UDS", "commSplit"}
    assert not any("performance" in t and "hang" not in t and "crash" not in t for t in fixes)   # not failures
    assert catalog.fixes_after("2.20.5", {"error"}, {"UDS"}) == []            # fixed in 2.20.5 itself
    assert [f["release"] for f in catalog.fixes_after("2.19.3", {"error"}, {"UDS"})] == ["2.20.5"]
    assert catalog.fixes_after("", {"error"}, {"UDS"}) == [] and catalog.fixes_after("2.19.3", {"hang"}, {"UDS"}) == []


def test_a_log_gets_the_fixes_of_its_feature_only() -> None:
    nvls = [v for v in nl.interpret(nl.parse_files([DATA / "real" / "nvls_fm_bare_h100.log"])) if v.id == "release-fixes"]
    assert len(nvls) == 1 and nvls[0].status == "INFO" and nvls[0].values["kind"] == "suspect"
    assert nvls[0].values["features"] == ["NVLS"] and nvls[0].values["nccl_version"] == "2.18.5"
    assert all("multicast" in f or "NVLS" in f for f in nvls[0].values["fixes"])
    shm_crash = ("host1:11:11 [0] NCCL INFO NCCL version 2.18.1+cuda12.1\n"
                 "host1:11:11 [0] NCCL WARN Error while creating shared memory segment /dev/shm/nccl-x (size 9637888)\n"
                 "[host1:11:0:11] Caught signal 11 (Segmentation fault: address not mapped to object at address (nil))\n")
    found = [v for v in nl.interpret(nl.parse(shm_crash)) if v.id == "release-fixes"]
    assert found and "Fix crash when shared memory creation fails." in " ".join(found[0].values["fixes"])
    assert "crash" in found[0].values["symptoms"] and found[0].values["features"] == ["shared memory"]
    healthy = nl.parse_files([DATA / "healthy_multinode_ib.log"])
    assert not [v for v in nl.interpret(healthy) if v.id == "release-fixes"]


def test_crash_signal_lines_are_read() -> None:
    for line in ("  traceback : Signal 11 (SIGSEGV) received by PID 4242",
                 "[n1:2:0:3] Caught signal 11 (Segmentation fault: address not mapped to object at address 0x48)",
                 "Fatal Python error: Segmentation fault", "  exitcode  : -11 (pid: 12)"):
        assert "process-crash-signal" in nl.parse(line).catalog, line
    abort = nl.parse("h:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4\n  traceback : Signal 6 (SIGABRT) received by PID 4242")
    assert "process-crash-signal" not in abort.catalog      # torch aborts itself after an NCCL error: not a native fault


@pytest.mark.skipif(not (CLONE / ".git").exists() and not (CLONE / "HEAD").exists(), reason="no NVIDIA/nccl clone")
def test_release_fixes_are_not_behind_the_clone() -> None:
    stored = json.loads(catalog.FIXES_PATH.read_text(encoding="utf-8"))
    fresh = generate.release_fixes(CLONE)
    assert stored == fresh, "regenerate: python -m helpers.nccl_log.generate --nccl CLONE --fixes-only"


def test_sigbus_reads_as_shared_memory() -> None:
    for line in ("[h:1    :0:381] Caught signal 7 (Bus error: nonexistent physical address)",
                 "  traceback : Signal 7 (SIGBUS) received by PID 4242"):
        log = nl.parse(line)
        assert "shm-bus-error" in log.catalog and "process-crash-signal" not in log.catalog, line
    v = {x.id: x for x in nl.interpret(nl.parse_files([DATA / "blind13" / "07_hugectrbackend42_docker_shm_sigbus.log"]))}
    assert v["shm-bus-error"].status == "FAIL" and "df -h /dev/shm" in v["shm-bus-error"].remediation
