"""nccl-log on bad input (issue 30): one line and exit 2, or the right answer; never a traceback, a hang or a loss.

Reproducers of issue 30 (a pipe / <(cmd) losing its first 8 KB, a BOM making a phantom host, a FIFO blocking
forever, a NUL tail, an unreadable folder) and a hypothesis property over mutations of the real samples.
"""

from __future__ import annotations

import json
import os
import stat
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import cli
from helpers import nccl_log as nl

DATA = Path(__file__).resolve().parent.parent / "data" / "nccl"
SAMPLES = sorted((DATA / "real").glob("*.log")) + sorted((DATA / "blind").glob("*.log"))
BIG = DATA / "real" / "shm_full_ci_pods.log"


def _ids(path: Path) -> list[tuple[str, str, tuple[str, ...]]]:
    log = nl.parse_files([path])
    return [(v.id, v.status, tuple(v.values["hosts"])) for v in nl.interpret(log)]


def test_a_pipe_is_read_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """/dev/fd/N of a pipe (what <(cat x.log) passes) gives the file's verdicts, first 8 KB included."""
    data = BIG.read_bytes() + b"epoch 1 loss 0.25\n" * 1000      # the failure sits in the first 8 KB
    assert len(data) > 8192
    r, w = os.pipe()
    writer = threading.Thread(target=lambda: (os.write(w, data), os.close(w)))
    writer.start()
    try:
        status = cli.main(["nccl-log", f"/dev/fd/{r}", "--json"])
    finally:
        writer.join()
        os.close(r)
    from_pipe = json.loads(capsys.readouterr().out)
    same = tmp_path / "same.log"
    same.write_bytes(data)
    assert cli.main(["nccl-log", str(same), "--json"]) == status == 1
    from_file = json.loads(capsys.readouterr().out)
    assert [c["id"] for c in from_pipe["checks"]] == [c["id"] for c in from_file["checks"]]
    assert from_pipe["log"]["lines_seen"] == from_file["log"]["lines_seen"]


def test_a_bom_changes_nothing(tmp_path: Path) -> None:
    """Every real log gives the same verdicts with a UTF-8 BOM in front (it used to make a phantom host)."""
    for path in SAMPLES:
        try:
            plain = _ids(path)
        except ValueError:
            continue
        bommed = tmp_path / path.name
        bommed.write_bytes(b"\xef\xbb\xbf" + path.read_bytes())
        assert _ids(bommed) == plain, path.name


def test_a_fifo_is_refused_without_blocking(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    fifo = tmp_path / "pipe.log"
    os.mkfifo(fifo)
    start = time.monotonic()
    assert cli.main(["nccl-log", str(fifo), str(BIG)]) == 2
    assert time.monotonic() - start < 5
    out, err = capsys.readouterr()
    assert err.count("\n") == 1 and "FIFO" in err and str(fifo) in err
    assert "[FAIL] shm-full" in out                       # the other file is still read


def test_a_nul_tail_ends_the_read(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """11 KB of log then NUL bytes (a preallocated file): the log is read, the tail named, exit 2, bounded time."""
    path = tmp_path / "tail.log"
    with path.open("wb") as fh:
        fh.write(BIG.read_bytes())
        fh.write(b"\x00" * (8 * 2**20))
    start = time.monotonic()
    assert cli.main(["nccl-log", str(path)]) == 2
    assert time.monotonic() - start < 10
    out, err = capsys.readouterr()
    assert "[FAIL] shm-full" in out and "NUL bytes from line" in err


def test_an_unreadable_folder_keeps_the_other_files(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    locked = tmp_path / "locked"
    locked.mkdir()
    (locked / "rank1.log").write_text(BIG.read_text())
    locked.chmod(0)
    try:
        if os.access(locked / "rank1.log", os.R_OK):
            pytest.skip("running as a user that reads through permissions (root)")
        assert cli.main(["nccl-log", str(locked / "rank1.log"), str(BIG)]) == 2
        out, err = capsys.readouterr()
        assert "[FAIL] shm-full" in out and err.count("\n") == 1 and "permission denied" in err
        assert nl.checks_for_job(tmp_path) == []          # a folder it cannot list is skipped, not raised
    finally:
        locked.chmod(stat.S_IRWXU)


def test_a_directory_and_dev_zero_are_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    link = tmp_path / "zero.log"
    link.symlink_to("/dev/zero")
    assert cli.main(["nccl-log", str(tmp_path), str(link), str(BIG)]) == 2
    out, err = capsys.readouterr()
    assert err.count("\n") == 2 and "directory" in err and "device" in err and "[FAIL] shm-full" in out


LINES = [line for path in SAMPLES[:40] for line in path.read_text(errors="replace").splitlines()[:40]]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(st.sampled_from(LINES), st.text(max_size=200),
                          st.sampled_from(LINES).map(lambda s: s[: len(s) // 2] + "\ufeff\x00[" + s[len(s) // 2:])),
                max_size=40),
       st.booleans())
def test_any_input_gives_an_answer_or_one_error(lines: list[str], bom: bool) -> None:
    """Mutations of the real samples: parse/interpret/render/JSON either work or raise one ValueError; bounded time."""
    text = ("\ufeff" if bom else "") + "\n".join(lines)
    start = time.monotonic()
    try:
        log = nl.parse(text)
    except ValueError as exc:
        assert "\n" not in str(exc)
        return
    verdicts = nl.interpret(log)
    assert nl.render(log, verdicts)
    json.dumps(nl.to_json(log, verdicts))
    assert time.monotonic() - start < 5
