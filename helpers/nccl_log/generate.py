"""Generate ``helpers/data/nccl_sites.json``: every message NCCL and its network plugins can print, from their sources.

Run it on git clones of the sources (nothing here runs at import, and the reader never needs git)::

    python -m helpers.nccl_log.generate --nccl PATH/TO/nccl [--plugin NAME=PATH ...] [--out FILE]

What it extracts, per release tag of https://github.com/NVIDIA/nccl from :data:`FIRST_TAG` to the newest
``vX.Y.Z-N`` tag (the tags are walked so each message gets the first and last release that prints it):

- every ``WARN(fmt, ...)`` call (``src/include/debug.h``: ``#define WARN(...) ncclDebugLogInternal(NCCL_LOG_WARN, ...)``),
  the format string rebuilt from its concatenated literals (``PRIu64`` and friends expanded, other macros and
  ``#name`` stringification read as "any text");
- every ``INFO(flags, fmt, ...)`` whose format carries evidence (:data:`INFO_EVIDENCE`: failures, fall-backs,
  NCCL's own ``HINT:`` lines, the transport / network / plugin / version choices);
- the strings ``ncclGetErrorString`` returns (``src/init.cc``): what a caller such as PyTorch quotes;
- for each plugin clone given with ``--plugin``: its own WARN macro calls at its newest commit
  (aws-ofi-nccl's ``NCCL_OFI_WARN`` prefixes ``NET/OFI ``; the Mellanox/HPC-X and Google fastsocket plugins use
  ``WARN``; NCCL's ``plugins/net/example``).

Each entry: the format, a regex that matches what printf makes of it, the level (WARN / INFO / ERROR), the
subsystem (from the source path, :func:`subsystem_of`), the releases (first and last tag that print it) and the
sites (``file:line`` as URLs at the pinned commit of the newest tag).  What a message means, its fix and whether it
states a cause or names a suspect are not generated: :mod:`helpers.nccl_log.catalog` derives them from the
subsystem and the message's words at load time, so regenerating never loses hand-written knowledge.

Written with the standard library (``subprocess`` for git, ``re``): no C parser is needed for printf-style calls
whose format is a literal, which is every logging call in these trees (a call whose format is not a literal is
counted in ``skipped`` and listed).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Sequence
from pathlib import Path

FIRST_TAG = "v2.18.1-1"
"""The oldest release walked (the issue asks for 2.18 onwards; 2.18.1 is the first 2.18 tag)."""

NCCL_URL = "https://github.com/NVIDIA/nccl"
SOURCE_EXT = (".cc", ".cu", ".h", ".c", ".cpp", ".hpp")

INFO_EVIDENCE = re.compile(
    r"fail|error|unable|cannot|can't|could not|not found|no device|disabl|fallback|fall back|mismatch|timeout|"
    r"timed out|retry|abort|HINT|Using network|Using \[|NET/\w+ ?: Using|Plugin|plugin|GPU Direct RDMA|GDR|"
    r"NVLS|version|Init COMPLETE|Init START|invalid|ignoring|unsupported|not supported|warning|exceed",
    re.IGNORECASE)
"""Which INFO formats are kept: the ones that say something failed, fell back, or record a choice."""

_PRI = {"PRIu64": "lu", "PRId64": "ld", "PRIx64": "lx", "PRIi64": "li", "PRIu32": "u", "PRId32": "d",
        "PRIx32": "x", "PRIu16": "u", "PRIu8": "u", "PRIX64": "lX", "PRIuPTR": "lu", "PRIxPTR": "lx",
        "PRId8": "d", "PRIi32": "i"}
_ANY = "\x00"   # placeholder for "any text" (a macro or #stringified argument inside a format)

# printf conversion: flags, width, precision, length, conversion
_CONV = re.compile(r"%(?P<flags>[-+ #0']*)(?P<width>\*|\d+)?(?:\.(?P<prec>\*|\d+))?(?P<len>hh|h|ll|l|L|z|j|t|q)?"
                   r"(?P<conv>[diouxXeEfFgGaAcspnm%])")


def format_regex(fmt: str) -> str:
    """The regex (a ``str``) matching any text printf makes of ``fmt``; :data:`_ANY` marks reads as ``.*?``.

    Only the first line of a multi-line format is used: NCCL prints the rest as lines of their own, without its
    prefix.  Numbers match ``-?\\d+`` (hex ``[0-9a-fA-F]+`` with an optional ``0x``), ``%s`` / ``%m`` / macros match lazily
    ``.*?``, ``%p`` a pointer or ``(nil)``; spaces match one or more blanks (widths pad with spaces).  The result is
    anchored at the start only: NCCL's prefix is cut before matching and the caller decides about the tail.
    """
    fmt = fmt.split("\n", 1)[0]
    out: list[str] = []
    pos = 0
    for m in _CONV.finditer(fmt):
        out.append(_literal(fmt[pos:m.start()]))
        pos = m.end()
        c = m["conv"]
        pad = r"\s*" if m["width"] else ""
        if c == "%":
            out.append("%")
        elif c in "di":
            out.append(pad + r"-?\d+")
        elif c == "u":
            out.append(pad + r"\d+")
        elif c in "xX":
            out.append(pad + r"(?:0x)?[0-9a-fA-F]+")
        elif c == "o":
            out.append(pad + r"[0-7]+")
        elif c in "eEfFgGaA":
            out.append(pad + r"[-+0-9.eEinfINFa]+")
        elif c == "c":
            out.append(r".")
        elif c == "p":
            out.append(r"(?:0x[0-9a-fA-F]+|\(nil\)|0)")
        else:  # s, m, n
            out.append(pad + r".*?")
    out.append(_literal(fmt[pos:]))
    return "".join(out)


def _literal(text: str) -> str:
    """``text`` as a regex: escaped, blanks as ``\\s+``, :data:`_ANY` (or ``<...>``) as ``.*?``."""
    parts = []
    for chunk in text.split(_ANY):
        esc = re.escape(chunk.replace("\n", " ").replace("\t", " "))
        parts.append(re.sub(r"(?:\\ )+", r"\\s+", esc))
    return ".*?".join(parts)


def sample_message(fmt: str) -> str:
    """What printf could make of the first line of ``fmt`` (numbers 7, hex 1f, strings ``x``, pointers ``0x7f00``)."""
    def one(m: re.Match[str]) -> str:
        c = m["conv"]
        return {"%": "%", "c": "c", "p": "0x7f00", "s": "x", "m": "x", "n": ""}.get(
            c, "1f" if c in "xX" else ("1.5" if c in "eEfFgGaA" else "7"))
    return _CONV.sub(one, fmt.split("\n", 1)[0].replace("<...>", "x"))


def anchor_of(fmt: str) -> str:
    """The longest literal piece of ``fmt`` (no conversion, no macro): a cheap substring filter before the regex."""
    pieces = re.split(r"%[-+ #0']*(?:\*|\d+)?(?:\.(?:\*|\d+))?(?:hh|h|ll|l|L|z|j|t|q)?[diouxXeEfFgGaAcspnm%]|\x00",
                      fmt.split("\n", 1)[0])
    return max((p.strip() for p in pieces), key=len, default="")


# ------------------------------------------------------------------------------------------- C scanning

_CALL = re.compile(r"(?<![\w.>])(?P<name>WARN|INFO|NCCL_OFI_WARN|NCCL_OFI_INFO)\s*\(")


def _skip_ws(src: str, i: int) -> int:
    n = len(src)
    while i < n:
        if src[i] in " \t\r\n\\":
            i += 1
        elif src.startswith("//", i):
            j = src.find("\n", i)
            i = n if j < 0 else j + 1
        elif src.startswith("/*", i):
            j = src.find("*/", i + 2)
            i = n if j < 0 else j + 2
        else:
            break
    return i


def _c_string(src: str, i: int) -> tuple[str, int]:
    """The C string literal starting at ``src[i] == '"'`` (escapes decoded loosely) and the index after it."""
    out = []
    i += 1
    n = len(src)
    while i < n and src[i] != '"':
        if src[i] == "\\" and i + 1 < n:
            nxt = src[i + 1]
            out.append({"n": "\n", "t": "\t", '"': '"', "\\": "\\", "'": "'", "\n": ""}.get(nxt, nxt))
            i += 2
        else:
            out.append(src[i])
            i += 1
    return "".join(out), i + 1


def _skip_arg(src: str, i: int) -> int:
    """Index of the top-level ``,`` or ``)`` ending the argument that starts at ``i``."""
    depth = 0
    n = len(src)
    while i < n:
        ch = src[i]
        if ch == '"':
            _, i = _c_string(src, i)
            continue
        if ch == "'":
            j = i + 1
            while j < n and src[j] != "'":
                j += 2 if src[j] == "\\" else 1
            i = j + 1
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            if depth == 0:
                return i
            depth -= 1
        elif ch == "," and depth == 0:
            return i
        i += 1
    return n


def _format_at(src: str, i: int) -> str | None:
    """The format argument starting at ``i``: concatenated literals, ``PRI*`` macros, other macros as :data:`_ANY`.

    None when the argument is not built from literals (a variable format).
    """
    pieces: list[str] = []
    literal = False
    n = len(src)
    while True:
        i = _skip_ws(src, i)
        if i >= n:
            return None
        ch = src[i]
        if ch == '"':
            s, i = _c_string(src, i)
            pieces.append(s)
            literal = True
        elif ch == "#" and i + 1 < n and (src[i + 1].isalpha() or src[i + 1] == "_"):
            m = re.compile(r"#\s*\w+").match(src, i)
            pieces.append(_ANY)
            i = m.end() if m else i + 1
        elif ch.isalpha() or ch == "_":
            m = re.compile(r"\w+").match(src, i)
            assert m is not None
            word = m.group(0)
            pieces.append(_PRI.get(word, _ANY))
            i = m.end()
        else:
            break
        if src[_skip_ws(src, i):_skip_ws(src, i) + 1] in (",", ")"):
            break
    if not literal:
        return None
    return "".join(pieces)


def calls_in(src: str) -> Iterable[tuple[str, int, str | None]]:
    """``(macro, line number, format or None)`` for every logging call in one C/C++ source text.

    ``#define WARN(...)`` lines themselves are skipped.
    """
    for m in _CALL.finditer(src):
        line_start = src.rfind("\n", 0, m.start()) + 1
        if src[line_start:m.start()].lstrip().startswith("#define"):
            continue
        i = m.end()
        if m["name"] in ("INFO", "NCCL_OFI_INFO"):
            i = _skip_arg(src, i)
            if i >= len(src) or src[i] != ",":
                continue
            i += 1
        fmt = _format_at(src, i)
        yield m["name"], src.count("\n", 0, m.start()) + 1, fmt


def error_strings(src: str) -> list[tuple[int, str]]:
    """``(line, text)`` of each ``return "..."`` inside ``ncclGetErrorString`` of ``src/init.cc``."""
    start = src.find("ncclGetErrorString(ncclResult_t code)")
    if start < 0:
        return []
    end = src.find("\n}", start)
    out = []
    for m in re.finditer(r'return\s+"((?:[^"\\]|\\.)*)"', src[start:end]):
        out.append((src.count("\n", 0, start + m.start()) + 1, m.group(1)))
    return out


# ------------------------------------------------------------------------------------------ subsystems

SUBSYSTEMS: tuple[tuple[str, str], ...] = (
    ("transport/net_ib", "net-ib"), ("misc/ibvwrap", "net-ib"), ("transport/net_socket", "net-socket"),
    ("transport/coll_net", "collnet"), ("transport/nvls", "nvls"), ("transport/p2p", "p2p"),
    ("transport/shm", "shm"), ("misc/shmutils", "shm"), ("transport/net.cc", "net"), ("transport/generic", "net"),
    ("plugin/net", "net-plugin"), ("plugin/tuner", "tuner-plugin"), ("plugin/profiler", "profiler-plugin"), ("plugin/", "plugin"), ("ras/", "ras"), ("net.cc", "net"), ("bootstrap", "bootstrap"), ("misc/socket", "socket"),
    ("proxy", "proxy"), ("graph/", "topology"), ("misc/nvmlwrap", "nvml"), ("misc/cudawrap", "cuda"),
    ("include/checks.h", "cuda"), ("misc/gdrwrap", "gdr"), ("misc/argcheck", "arguments"), ("enqueue", "enqueue"),
    ("group", "group"), ("init", "init"), ("include/alloc", "memory"), ("mem_manager", "memory"),
    ("allocator", "memory"), ("register/", "registration"), ("ras/", "ras"), ("gin/", "gin"),
    ("transport/net_ib/gin", "gin"), ("rma/", "rma"), ("os/windows", "os-windows"), ("os/", "os"),
    ("symmetric", "symmetric"), ("dev_runtime", "device-runtime"), ("ce_coll", "ce-collectives"),
    ("misc/strongstream", "cuda"), ("misc/ipcsocket", "shm"), ("misc/", "misc"), ("collectives", "enqueue"),
    ("transport.cc", "transport"), ("channel", "init"), ("debug", "misc"), ("nccl_ofi", "net-plugin:aws-ofi"),
)
"""(path fragment, subsystem): the first fragment found in a source path names its subsystem."""


def subsystem_of(path: str, plugin: str = "") -> str:
    """The subsystem of a source file (``src/transport/net_ib/connect.cc`` -> ``net-ib``); plugins: ``net-plugin:NAME``."""
    if plugin:
        return f"net-plugin:{plugin}"
    for fragment, name in SUBSYSTEMS:
        if fragment in path:
            return name
    return "misc"


# ----------------------------------------------------------------------------------------------- git

def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True,
                          errors="replace").stdout


def release_tags(repo: Path, first: str = FIRST_TAG) -> list[str]:
    """NCCL's release tags ``vX.Y.Z-N`` from ``first`` to the newest, in version order."""
    def key(tag: str) -> tuple[int, ...]:
        return tuple(int(x) for x in re.findall(r"\d+", tag))
    tags = [t for t in _git(repo, "tag").split() if re.fullmatch(r"v\d+\.\d+\.\d+-\d+", t)]
    return sorted((t for t in tags if key(t) >= key(first)), key=key)


def _files(repo: Path, rev: str, roots: Sequence[str]) -> dict[str, str]:
    """``{path: text}`` of the C/C++ sources under ``roots`` at ``rev`` (one ``git cat-file --batch``)."""
    listing = _git(repo, "ls-tree", "-r", rev, "--", *roots).splitlines()
    entries = [(ln.split()[2], ln.split("\t", 1)[1]) for ln in listing if ln.split("\t", 1)[1].endswith(SOURCE_EXT)]
    if not entries:
        return {}
    proc = subprocess.run(["git", "-C", str(repo), "cat-file", "--batch"], input=("\n".join(s for s, _ in entries) + "\n").encode(),
                          capture_output=True, check=True)
    data = proc.stdout
    out: dict[str, str] = {}
    pos = 0
    for _, path in entries:
        header_end = data.index(b"\n", pos)
        size = int(data[pos:header_end].split()[2])
        out[path] = data[header_end + 1:header_end + 1 + size].decode("utf-8", "replace")
        pos = header_end + 1 + size + 1
    return out


def _entries_of(files: dict[str, str], plugin: str = "") -> tuple[dict[tuple[str, str], list[tuple[str, int]]], list[str]]:
    """``{(level, format): [(path, line), ...]}`` and the skipped (non-literal) sites of one tree."""
    found: dict[tuple[str, str], list[tuple[str, int]]] = {}
    skipped: list[str] = []
    for path, src in sorted(files.items()):
        if "WARN" not in src and "INFO" not in src:
            continue
        for name, line, fmt in calls_in(src):
            level = "WARN" if "WARN" in name else "INFO"
            if fmt is None:
                if level == "WARN":
                    skipped.append(f"{path}:{line}")
                continue
            if name == "NCCL_OFI_WARN" or name == "NCCL_OFI_INFO":
                fmt = "NET/OFI " + fmt
            if level == "INFO" and not INFO_EVIDENCE.search(fmt):
                continue
            found.setdefault((level, fmt), []).append((path, line))
        if path.endswith("src/init.cc"):
            for line, text in error_strings(src):
                found.setdefault(("ERROR", text), []).append((path, line))
    return found, skipped


_ENV_NAMES = (re.compile(r'NCCL_PARAM\(\s*\w+\s*,\s*"([A-Z0-9_]+)"'), re.compile(r'"(NCCL_[A-Z0-9_]+)"'))


def env_names(files: dict[str, str]) -> list[str]:
    """Every ``NCCL_*`` environment variable a source tree reads: ``NCCL_PARAM(Name, "X", ...)`` gives ``NCCL_X``,
    and every ``"NCCL_..."`` string literal (``ncclGetEnv("NCCL_SOCKET_IFNAME")``, ``ncclGetLevel(..., "NCCL_P2P_LEVEL")``)."""
    names: set[str] = set()
    for src in files.values():
        names.update("NCCL_" + m for m in _ENV_NAMES[0].findall(src))
        names.update(_ENV_NAMES[1].findall(src))
    return sorted(names)


def generate(nccl: Path, plugins: Sequence[tuple[str, Path, str]] = (), first: str = FIRST_TAG) -> dict:
    """The catalog of sites as a JSON-ready dict (see the module docstring).

    Args:
        nccl: a git clone of NVIDIA/nccl with its tags.
        plugins: ``(name, clone, url)`` per plugin (its newest commit is read).
        first: the oldest tag walked.
    Returns:
        ``{"header": {...}, "entries": [...], "skipped": [...]}``; entries sorted by subsystem then format.
    Raises:
        ValueError: no release tag at or after ``first``.
        subprocess.CalledProcessError: git failed.
    """
    tags = release_tags(nccl, first)
    if not tags:
        raise ValueError(f"{nccl}: no NCCL release tag at or after {first}")
    latest = tags[-1]
    commit = _git(nccl, "rev-parse", f"{latest}^{{commit}}").strip()
    seen: dict[tuple[str, str], dict] = {}
    skipped_latest: list[str] = []
    env_all: set[str] = set()
    for tag in tags:
        files = _files(nccl, tag, ["src", "plugins/net"])
        env_all.update(env_names(files))
        found, skipped = _entries_of(files)
        for key, sites in found.items():
            e = seen.setdefault(key, {"first": tag, "sites_by_tag": {}})
            e["last"] = tag
            e["sites_by_tag"] = {tag: sites}
        if tag == latest:
            skipped_latest = skipped
    entries = []
    for (level, fmt), e in seen.items():
        tag = e["last"]
        sites = e["sites_by_tag"][tag]
        rev = commit if tag == latest else tag
        entries.append({
            "level": level, "format": fmt.replace(_ANY, "<...>"), "regex": format_regex(fmt), "anchor": anchor_of(fmt),
            "subsystem": subsystem_of(sites[0][0]) if not sites[0][0].startswith("plugins/") else "net-plugin:example",
            "origin": "nccl", "first": e["first"], "last": tag, "in_latest": tag == latest,
            "sites": [f"{NCCL_URL}/blob/{rev}/{p}#L{ln}" for p, ln in sites[:8]], "site_count": len(sites),
        })
    header: dict = {"generator": "python -m helpers.nccl_log.generate", "nccl_tag": latest, "nccl_commit": commit,
                    "tags_walked": tags, "plugins": {},
                    "env_vars": sorted(env_all)}
    for name, clone, url in plugins:
        rev = _git(clone, "rev-parse", "HEAD").strip()
        described = _git(clone, "describe", "--tags", "--always", "HEAD").strip()
        header["plugins"][name] = {"url": url, "commit": rev, "describe": described}
        found, _ = _entries_of({p: s for p, s in _files(clone, "HEAD", ["."]).items()
                                if not re.search(r"(^|/)(tests?|unit_tests?)/", p)}, name)
        for (level, fmt), sites in found.items():
            if level == "ERROR":
                continue
            entries.append({
                "level": level, "format": fmt.replace(_ANY, "<...>"), "regex": format_regex(fmt),
                "anchor": anchor_of(fmt), "subsystem": subsystem_of("", name), "origin": name, "first": described,
                "last": described, "in_latest": True, "sites": [f"{url}/blob/{rev}/{p}#L{ln}" for p, ln in sites[:8]],
                "site_count": len(sites)})
    entries.sort(key=lambda e: (e["origin"] != "nccl", e["subsystem"], e["level"], e["format"]))
    return {"header": header, "entries": entries, "skipped": skipped_latest}


FIX_VERB = re.compile(r"^(?:Fix|Fixed|Fixes|Fixing|Avoid|Prevent|Resolve|Resolved|Work ?around|Correct|Corrected)\b")
"""How a release-notes item that repairs something begins (NCCL's notes start each such item with one of these)."""


_TRAILER = re.compile(r"^(?:Signed-off-by|Mirrored-from|Co-authored-by|Reviewed-by):")


def release_notes(repo: Path, tag: str) -> str:
    """The release notes of ``tag`` as NCCL's git history holds them ('' when they are not there).

    The notes are the message of the commit titled ``NCCL X.Y.Z-N`` (or ``X.Y.Z-N``, ``NCCL vX.Y.Z-N Release``):
    the tag itself, or, where the tag points at a merge or a follow-up commit ("Add missing files for the NCCL
    2.29.7-1 release"), the newest such commit among the 30 before it; git trailers (Signed-off-by...) dropped.
    Releases from 2.30.3 on keep their notes on the GitHub release page only: '' for those.
    """
    version = tag[1:]
    title = re.compile(rf"^(?:NCCL )?v?{re.escape(version)}(?: [Rr]elease)?$")
    log = _git(repo, "log", "-n", "30", "--format=%s%x00%B%x01", tag)
    for record in log.split("\x01"):
        subject, _, body = record.strip("\n").partition("\x00")
        if title.match(subject.strip()):
            lines = [ln for ln in body.splitlines()[1:] if not _TRAILER.match(ln)]
            return "" if any("Release notes: http" in ln for ln in lines[:4]) else "\n".join(lines).strip("\n")
    return ""


_ITEM_VERB = re.compile(r"(?:Fix|Fixes|Fixed|Add|Adds|Avoid|Prevent|Improve|Reduce|Enable|Disable|Support|Remove|Allow|"
                        r"Make|Use|Update|Change|Increase|Decrease|Rework|Optimize|Introduce|Extend|Move|Print|Report|"
                        r"Work around|Resolve|Correct|Set)\b")


def note_items(notes: str) -> list[str]:
    """Split release notes into items, one per paragraph or bullet, each unwrapped onto one line.

    A line starts a new item when it is a bullet (``*`` or ``-``) or begins at column 0 with an upper-case letter
    after a blank line, after a line that ends a sentence (``.``, ``)``, ``:``) or with a verb that opens an item
    (``Fix``, ``Add``...: some notes end a line with an issue number); any other line continues the
    item before it (NCCL wraps its notes at ~75 columns, bullets with a hanging indent).
    """
    items: list[list[str]] = []
    prev = ""
    for raw in notes.splitlines():
        line = raw.rstrip()
        text = line.strip()
        if not text:
            prev = ""
            continue
        bullet = re.match(r"^\s*[*-]\s+", line)
        starts = bullet or (line[0].isupper() and (not prev or prev.rstrip().endswith((".", ")", ":"))
                                                   or bool(_ITEM_VERB.match(line))))
        if starts or not items:
            items.append([])
        items[-1].append(text[bullet.end() - (len(line) - len(line.lstrip())):] if bullet else text)
        prev = line
    return [" ".join(parts) for parts in items]


def release_fixes(repo: Path, first: str = FIRST_TAG) -> dict:
    """Every repair item of NCCL's release notes from ``first`` to the newest tag.

    Args:
        repo: a git clone of NVIDIA/nccl with its tags.
        first: the oldest tag read.

    Returns:
        ``{"header": {"nccl_tag", "nccl_commit", "tags_read", "tags_without_notes"}, "fixes": [{"release": "2.20.3",
        "tag": "v2.20.3-1", "text": "Fix hang during A2A connection."}, ...]}`` in release order.  What an item is
        about (its symptom, the part of NCCL) is read at load time (:func:`helpers.nccl_log.catalog.load_release_fixes`).

    Raises:
        ValueError: no release tag at or after ``first``.
    """
    tags = release_tags(repo, first)
    if not tags:
        raise ValueError(f"{repo}: no NCCL release tag at or after {first}")
    fixes, missing = [], []
    for tag in tags:
        notes = release_notes(repo, tag)
        if not notes:
            missing.append(tag)
        for item in note_items(notes):
            if FIX_VERB.match(item):
                fixes.append({"release": tag[1:].split("-")[0], "tag": tag, "text": item})
    commit = _git(repo, "rev-parse", f"{tags[-1]}^{{commit}}").strip()
    return {"header": {"generator": "python -m helpers.nccl_log.generate --fixes-only", "nccl_tag": tags[-1],
                       "nccl_commit": commit, "tags_read": tags, "tags_without_notes": missing,
                       "notes_url": f"{NCCL_URL}/releases/tag/<tag>"},
            "fixes": fixes}


def write_json(data: dict, out: Path) -> None:
    """Write ``data`` to ``out`` atomically (temp file in the same folder, then rename)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=out.parent, suffix=".tmp")
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=0, sort_keys=False, ensure_ascii=False)
        fh.write("\n")
    os.replace(tmp, out)


DEFAULT_OUT = Path(__file__).resolve().parents[1] / "data" / "nccl_sites.json"
FIXES_OUT = Path(__file__).resolve().parents[1] / "data" / "nccl_release_fixes.json"


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: ``--nccl CLONE [--plugin NAME=CLONE=URL ...] [--out FILE] [--fixes-out FILE] [--fixes-only]``;
    prints entry counts."""
    p = argparse.ArgumentParser(prog="python -m helpers.nccl_log.generate", description=__doc__.split("\n\n")[0])
    p.add_argument("--nccl", required=True, type=Path, help="git clone of https://github.com/NVIDIA/nccl with tags")
    p.add_argument("--plugin", action="append", default=[], metavar="NAME=CLONE=URL",
                   help="a network plugin's clone, e.g. aws-ofi=/src/aws-ofi-nccl=https://github.com/aws/aws-ofi-nccl")
    p.add_argument("--first", default=FIRST_TAG, help=f"oldest tag to walk (default {FIRST_TAG})")
    p.add_argument("--out", type=Path, default=DEFAULT_OUT)
    p.add_argument("--fixes-out", type=Path, default=FIXES_OUT, help="where the release notes' fixes go")
    p.add_argument("--fixes-only", action="store_true", help="write only the release notes' fixes (no plugin clones needed)")
    args = p.parse_args(argv)
    fixes = release_fixes(args.nccl, args.first)
    write_json(fixes, args.fixes_out)
    print(f"{args.fixes_out}: {len(fixes['fixes'])} fixes from {len(fixes['header']['tags_read'])} releases "
          f"({len(fixes['header']['tags_without_notes'])} without notes in git)", file=sys.stderr)
    if args.fixes_only:
        return 0
    plugins = []
    for spec in args.plugin:
        parts = spec.split("=", 2)
        if len(parts) != 3:
            p.error(f"--plugin {spec!r}: expected NAME=CLONE=URL")
        plugins.append((parts[0], Path(parts[1]), parts[2]))
    data = generate(args.nccl, plugins, args.first)
    write_json(data, args.out)
    n_warn = sum(1 for e in data["entries"] if e["level"] == "WARN" and e["in_latest"] and e["origin"] == "nccl")
    print(f"{args.out}: {len(data['entries'])} entries ({n_warn} WARN formats in {data['header']['nccl_tag']}), "
          f"{len(data['skipped'])} WARN sites with a non-literal format", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
