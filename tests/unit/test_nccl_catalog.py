"""The catalog generated from NCCL's, its plugins' and PyTorch's sources (helpers/data/nccl_sites.json) and its readings.

The generator (helpers.nccl_log.generate) walks NCCL's release tags; these tests check what it wrote: every entry's
regex matches what printf makes of its format, the header pins the newest tag and its commit, at least 90 % of the
WARN sites of that release are recognised with a specific reading, and, where a clone of NVIDIA/nccl is at hand
(NCCL_SRC, or the mirror this project was built from), that the catalog is not behind its newest release.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

import pytest

from helpers import nccl_log as nl
from helpers.nccl_log import catalog, generate

SITES = nl.load_sites()
CLONE = Path(os.environ.get("NCCL_SRC", "/work/.mirror/NVIDIA+nccl/repo"))


def test_header_pins_the_release_and_commit() -> None:
    header = SITES["header"]
    assert re.fullmatch(r"v\d+\.\d+\.\d+-\d+", header["nccl_tag"]) and re.fullmatch(r"[0-9a-f]{40}", header["nccl_commit"])
    assert header["tags_walked"][0].startswith("v2.18.") and header["tags_walked"][-1] == header["nccl_tag"]
    assert {"aws-ofi", "hpcx-sharp", "fastsocket"} <= set(header["plugins"])
    assert all(e["sites"][0].startswith("https://github.com/") for e in SITES["entries"])


def test_every_format_is_matched_by_its_own_regex() -> None:
    """Each entry's regex matches what printf makes of its format (match_site on the latest release's WARN
    formats is checked by the coverage test below)."""
    for e in SITES["entries"]:
        message = generate.sample_message(e["format"])
        assert re.match(e["regex"], message), (e["format"], e["regex"])


def test_format_regex_reads_printf() -> None:
    rx = generate.format_regex("NET/IB : Got completion from peer %s with status=%d opcode=%d len=%u vendor err %d")
    assert re.match(rx, "NET/IB : Got completion from peer 10.0.0.2<4321> with status=12 opcode=0 len=0 vendor err 129")
    assert generate.anchor_of("Call to " + "\x00" + " failed : %s") == "failed :"


def test_calls_are_extracted_from_c_source() -> None:
    src = ('  WARN("NET/IB : %s:%d Got async event : %s", dev, port, str);\n'
           '  INFO(NCCL_INIT|NCCL_NET, "NET/IB : No device found.");\n'
           '  INFO(NCCL_INIT, "Channel %02d : %d", c, r);\n'
           '#define WARN(...) nothing\n'
           '  WARN("Call to " #name " failed : %" PRIu64, x);\n')
    calls = list(generate.calls_in(src))
    assert calls[0] == ("WARN", 1, "NET/IB : %s:%d Got async event : %s")
    assert calls[1] == ("INFO", 2, "NET/IB : No device found.")
    assert calls[3] == ("WARN", 5, "Call to \x00 failed : %lu")
    found, _ = generate._entries_of({"src/x.cc": src})
    assert ("INFO", "Channel %02d : %d") not in found             # an INFO line without evidence is not kept


def test_coverage_of_the_latest_release_is_at_least_90_percent() -> None:
    cov = catalog.coverage()["all"]
    assert cov["sites"] >= 600                                   # 2.30.7 has ~700 WARN call sites
    assert cov["recognised"] / cov["sites"] >= 0.95
    assert cov["specific"] / cov["sites"] >= 0.90


@pytest.mark.skipif(not (CLONE / ".git").exists() and not (CLONE / "HEAD").exists(), reason="no NVIDIA/nccl clone")
def test_catalog_is_not_behind_the_newest_release() -> None:
    newest = generate.release_tags(CLONE)[-1]
    assert SITES["header"]["nccl_tag"] == newest, f"regenerate: python -m helpers.nccl_log.generate --nccl {CLONE}"
    found, _ = generate._entries_of(generate._files(CLONE, newest, ["src"]))
    known = {(e["level"], e["format"]) for e in SITES["entries"]}
    missing = [fmt for (level, fmt) in found if (level, fmt.replace("\x00", "<...>")) not in known]
    assert not missing, missing[:5]
    commit = subprocess.run(["git", "-C", str(CLONE), "rev-parse", f"{newest}^{{commit}}"], capture_output=True,
                            text=True, check=True).stdout.strip()
    assert SITES["header"]["nccl_commit"] == commit


def test_site_ties_go_to_the_whole_message_then_to_ncclS_own_site() -> None:
    """Anchors of one length: the format that matches the whole message wins over one matching its start, then the
    first entry (NCCL's own site before a plugin's copy of the same format), whatever the hash seed."""
    from helpers.nccl_log import catalog
    from helpers.nccl_log.generate import sample_message

    entries = catalog.load_sites()["entries"]
    message = sample_message("Retrieve %s version %d failed with %d status %d")
    shorter = next(e for e in entries if e["origin"] == "nccl" and e["format"] == "Retrieve %s failed with %d")
    assert re.match(shorter["regex"], message)  # it matches the start of the longer message ...
    back = catalog.match_site(message, "WARN")  # ... but a format matching all of it wins
    assert back is not None and back["format"] != shorter["format"] and re.fullmatch(back["regex"], message)
    twins = [e for e in entries if e["format"] == "Net : unsupported IP family" and e["level"] == "WARN"]
    assert {e["origin"] for e in twins} >= {"nccl", "hpcx-sharp"}
    back = catalog.match_site("Net : unsupported IP family", "WARN")
    assert back is not None and back["index"] == min(e["index"] for e in twins) and back["origin"] == "nccl"
