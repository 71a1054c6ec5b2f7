"""Guards: every NCCL_*/TORCH_* variable the project prints, recommends or exports is one NCCL or torch reads.

The reference lists are generated from NCCL's source at a pinned tag and from the installed torch
(helpers/envnames.py).  A name that does not exist may still be named where the text says so
(``NCCL_NET_DISABLE``: "NCCL does not read it"); the marker must sit within a few lines of it.
"""

from __future__ import annotations

import io
import json
import re
import tokenize
from pathlib import Path

import pytest

from helpers import envnames, sources

ROOT = Path(__file__).resolve().parents[2]
NOT_A_VARIABLE = re.compile(r"not an? (?:NCCL|torch)|does not exist|not read|never reads|ignore|unknown|no such|isn't one|"
                            r"is not one of them",
                            re.I)
"""Words that tell the reader the name next to them is not a variable (within MARKER_LINES lines)."""
MARKER_LINES = 3
NOT_VARIABLES = {"NCCL_PARAM", "NCCL_KEY", "TORCH_CHECK", "NCCL_VERSION_CODE", "NCCL_X", "NCCL_LOG_WARN", "NCCL_OFI_INFO",
                 "NCCL_OFI_WARN"}
"""Names that are not meant as variables: NCCL/torch C macros (NCCL's and aws-ofi-nccl's log macros) and a
docstring's placeholder (``NCCL_X``)."""
PENDING: dict[str, set[str]] = {}
"""Files allowed an unknown name for now (none)."""


def _python_text(text: str, identifiers: set[str] | None = None) -> str:
    """Only the string literals and comments of Python source (identifiers such as NCCL_PROFILES are code).

    The NCCL_*/TORCH_* identifiers met on the way are added to ``identifiers`` (a notebook's prose may name one).
    """
    try:
        tokens = list(tokenize.generate_tokens(io.StringIO(text).readline))
    except (tokenize.TokenError, SyntaxError, IndentationError):
        return text
    lines = [""] * (text.count("\n") + 2)
    for tok in tokens:
        if tok.type in (tokenize.STRING, tokenize.COMMENT):
            for i, part in enumerate(tok.string.split("\n")):
                lines[tok.start[0] - 1 + i] += " " + part
        elif identifiers is not None and tok.type == tokenize.NAME and tok.string[:5] in ("NCCL_", "TORCH"):
            identifiers.add(tok.string)
    return "\n".join(lines)


def _texts(identifiers: set[str]) -> dict[str, str]:
    """What the project shows a reader, per file: code reduced to its strings and comments."""
    out: dict[str, str] = {}
    for path in sorted((ROOT / "helpers").rglob("*.py")):
        out[str(path.relative_to(ROOT))] = _python_text(path.read_text(), identifiers)
    for path in sorted(p for p in (ROOT / "configs").rglob("*") if p.is_file()):
        out[str(path.relative_to(ROOT))] = path.read_text()
    for path in [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md",
                 *sorted((ROOT / "helpers" / "data").glob("*.yaml"))]:
        out[str(path.relative_to(ROOT))] = path.read_text()
    for path in sorted((ROOT / "notebooks").glob("*.ipynb")):
        cells = json.loads(path.read_text())["cells"]
        out[str(path.relative_to(ROOT))] = "\n".join(
            _python_text("".join(c["source"])) if c["cell_type"] == "code" else "".join(c["source"]) for c in cells)
    return out


def _unmarked_unknowns(text: str, identifiers: set[str]) -> set[str]:
    lines = text.splitlines()
    bad = set()
    for i, line in enumerate(lines):
        for name in envnames.NAME.findall(line):
            if envnames.known(name) or name in identifiers or name in NOT_VARIABLES:
                continue
            near = "\n".join(lines[max(0, i - MARKER_LINES):i + MARKER_LINES + 1])
            if not NOT_A_VARIABLE.search(near):
                bad.add(name)
    return bad


def test_every_nccl_and_torch_name_the_project_shows_exists():
    identifiers: set[str] = set()
    texts = _texts(identifiers)  # fills identifiers from helpers/ before any text is judged
    found = {path: sorted(bad) for path, text in texts.items()
             if (bad := _unmarked_unknowns(text, identifiers) - PENDING.get(path, set()))}
    assert found == {}, ("names NCCL/torch do not read (helpers/data/nccl_params.txt, torch_env_vars.txt), "
                         f"not marked as such: {found}")


def test_configs_never_set_an_unknown_variable():
    for path in sorted(p for p in (ROOT / "configs").rglob("*") if p.is_file()):
        for line in path.read_text().splitlines():
            m = re.match(r"\s*(?:export\s+|unset\s+)?((?:NCCL|TORCH)_[A-Z0-9_]+)\b", line)
            assert not m or envnames.known(m.group(1)), f"{path.name}: {line.strip()}"


def test_the_guard_catches_what_it_guards():
    assert _unmarked_unknowns("export NCCL_NET_DISABLE=1   # SHM inside the node", set()) == {"NCCL_NET_DISABLE"}
    assert _unmarked_unknowns("NCCL_NET_DISABLE=1 is not an NCCL variable", set()) == set()
    assert _unmarked_unknowns("export NCCL_IB_DISABLE=1 TORCH_NCCL_ASYNC_ERROR_HANDLING=3", set()) == set()
    shown = _python_text("NCCL_PROFILES = ('NCCL_TIMEOUT',)  # TORCH_X\n")
    assert "NCCL_PROFILES" not in shown and "'NCCL_TIMEOUT'" in shown and "TORCH_X" in shown


def test_lists_hold_the_names_the_course_relies_on():
    nccl, torch_names = envnames.nccl_params(), envnames.torch_env_vars()
    assert {"NCCL_DEBUG", "NCCL_IB_DISABLE", "NCCL_P2P_LEVEL", "NCCL_SOCKET_IFNAME", "NCCL_NET_DISABLE_INTRA"} <= nccl
    assert "NCCL_NET_DISABLE" not in nccl and "NCCL_TIMEOUT" not in nccl  # the seeds' two invented names
    assert {"TORCH_NCCL_ASYNC_ERROR_HANDLING", "TORCH_DISTRIBUTED_DEBUG", "TORCH_NCCL_TRACE_BUFFER_SIZE"} <= torch_names
    assert "NCCL_ASYNC_ERROR_HANDLING" in torch_names  # torch's deprecated alias, not NCCL's
    assert {"NCCL_P2P_LEVEL", "NCCL_IB_DISABLE"} <= envnames.nccl_debug_params() <= nccl
    header = envnames.NCCL_PARAMS.read_text().splitlines()[0]
    assert re.search(r"v\d+\.\d+\.\d+-\d+ \(commit [0-9a-f]{40}\)", header), header
    assert envnames.unknown(["NCCL_NET_DISABLE", "NCCL_DEBUG", "TORCH_NCCL_BOGUS", "PATH"]) == [
        "NCCL_NET_DISABLE", "TORCH_NCCL_BOGUS"]


def test_extractors_read_the_source_forms(tmp_path):
    (tmp_path / "src" / "include").mkdir(parents=True)
    (tmp_path / "src" / "include" / "param.h").write_text("#define NCCL_PARAM(name, env, deftVal)\n")
    (tmp_path / "src" / "a.cc").write_text('NCCL_PARAM(IbDisable, "IB_DISABLE", 0);\n'
                                           'DEFINE_NCCL_PARAM(ncclParamDebugFile, const char*, NCCL_DEBUG_FILE, 0);\n'
                                           'const char* s = ncclGetEnv("NCCL_SOCKET_IFNAME");\n'
                                           'ncclGetLevel(&l, "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL");\n'
                                           'INFO(NCCL_INIT, "NCCL_NOT_READ_HERE %d", 1);\n')
    assert envnames.extract_nccl(tmp_path) == {"NCCL_IB_DISABLE", "NCCL_DEBUG_FILE", "NCCL_SOCKET_IFNAME",
                                               "NCCL_P2P_DISABLE", "NCCL_P2P_LEVEL"}
    with pytest.raises(FileNotFoundError, match="nccl_src"):
        envnames.extract_nccl(tmp_path / "src")


def test_default_timeouts_come_from_the_installed_torch_and_the_prose_agrees():
    defaults = envnames.default_timeouts()
    minutes = {k: int(v.total_seconds() // 60) for k, v in defaults.items()}
    mn3 = sources.get("MN3").fact
    assert f"{int(defaults['nccl'].total_seconds())} s" in mn3 and f"{int(defaults['other'].total_seconds())} s" in mn3
    assert minutes["nccl"] < minutes["other"]
