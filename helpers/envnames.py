"""The environment variables NCCL and torch really read: name lists generated from their sources.

A variable NCCL does not know is ignored without a word (``NCCL_NET_DISABLE=1`` does nothing), so a
course that exports one teaches a fix that is not one.  These lists are the reference the guards
(``tests/unit/test_env_names.py``) and ``runbook lint`` check names against:

* ``helpers/data/nccl_params.txt``: every variable NCCL reads, taken from NCCL's source at a pinned
  release (the tag and commit are in the file's header): ``NCCL_PARAM(Name, "ENV", default)``
  (``src/include/param.h`` prefixes ``NCCL_``), ``DEFINE_NCCL_PARAM(var, type, NCCL_KEY, ...)``
  (``src/include/param/param.h``), the string literals given to ``ncclGetEnv``/``getenv``/
  ``ncclGetLevel`` and NCCL's other readers, plus every variable ``docs/userguide/source/env.rst``
  documents;
* ``helpers/data/nccl_debug_params.txt``: the variables under env.rst's "Debugging" heading, which
  that page says "should not be used in production nor retained in scripts";
* ``helpers/data/torch_env_vars.txt``: the ``TORCH_*`` names torch reads, and the old ``NCCL_*``
  aliases it still accepts (``NCCL_ASYNC_ERROR_HANDLING`` for ``TORCH_NCCL_ASYNC_ERROR_HANDLING``),
  taken from the installed torch: string literals in its C++ headers, its Python sources and its
  shared libraries (a CPU build lacks ``libtorch_cuda``; the ``TORCH_NCCL_*`` names it would add
  are declared in ``ProcessGroupNCCL.hpp``, which every build ships).

* ``helpers/data/slurm_env_vars.txt``: every ``SLURM_*``/``SLURMD_*`` name Slurm documents or sets, taken from
  Slurm's tree at a pinned release: the names in the sbatch, srun and salloc man pages (their INPUT and OUTPUT
  ENVIRONMENT VARIABLES sections, https://slurm.schedmd.com/sbatch.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES) and
  ``doc/html/prolog_epilog.shtml``, plus the ``"SLURM_..."`` string literals of ``src/`` (what slurmd and the
  clients set: ``SLURM_JOB_USER`` is documented only on the prolog page).  A script reading a name outside it
  (``SLURM_JOB_NUMNODES`` for ``SLURM_JOB_NUM_NODES``) reads a variable no Slurm sets.
* ``helpers/data/sbatch_options.txt``: every option ``sbatch`` parses (``--name`` and ``-c``), from
  ``src/common/slurm_opt.c`` of several Slurm releases: the ``slurm_cli_opt_t`` entries with a ``set_func`` or a
  ``set_func_sbatch``, the ones ``slurm_option_table_create`` gives sbatch's ``getopt_long`` (deprecated spellings
  such as ``--tasks-per-node`` included).  An ``#SBATCH`` option outside it stops the submission ("sbatch:
  unrecognized option"), unless a SPANK plugin of the site adds it.

Regenerate (NCCL's tree from ``git archive <tag>`` of github.com/NVIDIA/nccl, Slurm's from github.com/SchedMD/slurm)::

    python -m helpers.envnames --nccl-src DIR --nccl-tag v2.30.7-1 --nccl-commit <sha> --torch
    python -m helpers.envnames --slurm-src DIR --slurm-tag slurm-26-05-3-1 --slurm-commit <sha>
    python -m helpers.envnames --slurm-option-src slurm-22-05-11-1=DIR ... (one per release)

Written here rather than taken from a library: neither NCCL nor torch exports its list of variables
(NCCL's ``ncclParamDumpAll`` needs a GPU build).  Standard library only; nothing runs at import.
"""

from __future__ import annotations

import argparse
import functools
import os
import re
import sys
import tempfile
from collections.abc import Iterable
from datetime import timedelta
from pathlib import Path

DATA = Path(__file__).resolve().parent / "data"
NCCL_PARAMS = DATA / "nccl_params.txt"
NCCL_DEBUG_PARAMS = DATA / "nccl_debug_params.txt"
TORCH_ENV_VARS = DATA / "torch_env_vars.txt"
SLURM_ENV_VARS = DATA / "slurm_env_vars.txt"
SBATCH_OPTIONS = DATA / "sbatch_options.txt"

NAME = re.compile(r"\b(?:NCCL|TORCH)_[A-Z0-9_]*[A-Z0-9]\b")
"""A ``NCCL_*`` or ``TORCH_*`` variable name in free text (``TORCH_NCCL_*`` included)."""

_PARAM = re.compile(r'\bNCCL_PARAM\(\s*\w+\s*,\s*"([A-Z0-9_]+)"')
_DEFINE_PARAM = re.compile(r"\bDEFINE_NCCL_PARAM\(\s*\w+\s*,[^,]+,\s*(NCCL_[A-Z0-9_]+)")
_READER = re.compile(r"\b(?:ncclGetEnv|getenv|ncclGetLevel|getNthreads|get\w*FromEnv|env_value|env_flag_enabled)"
                     r"\(([^;]*?)\)")
_LITERAL_NCCL = re.compile(r'"(NCCL_[A-Z0-9_]+)"')
_RST_HEADING = re.compile(r"^(NCCL_[A-Z0-9_]+)\s*\n[-=~^]{3,}\s*$", re.M)
_SOURCES = (".cc", ".c", ".cpp", ".cu", ".h", ".hpp")


def read_list(path: Path) -> frozenset[str]:
    """The names in one list file: one per line, ``#`` comments and blank lines skipped.

    Raises:
        FileNotFoundError: ``path`` missing.
    """
    return frozenset(line.strip() for line in Path(path).read_text().splitlines()
                     if line.strip() and not line.lstrip().startswith("#"))


@functools.cache
def nccl_params() -> frozenset[str]:
    """Every variable NCCL reads (``helpers/data/nccl_params.txt``)."""
    return read_list(NCCL_PARAMS)


@functools.cache
def nccl_debug_params() -> frozenset[str]:
    """The debug-only NCCL variables (env.rst, "Debugging"; ``helpers/data/nccl_debug_params.txt``)."""
    return read_list(NCCL_DEBUG_PARAMS)


@functools.cache
def torch_env_vars() -> frozenset[str]:
    """The ``TORCH_*`` variables and ``NCCL_*`` aliases torch reads (``helpers/data/torch_env_vars.txt``)."""
    return read_list(TORCH_ENV_VARS)


@functools.cache
def slurm_env_vars() -> frozenset[str]:
    """Every ``SLURM_*``/``SLURMD_*`` variable Slurm documents or sets (``helpers/data/slurm_env_vars.txt``)."""
    return read_list(SLURM_ENV_VARS)


def known(name: str) -> bool:
    """Whether NCCL or torch reads ``name``; any name outside the ``NCCL_``/``TORCH_`` prefixes is not judged (True)."""
    if name.startswith("TORCH_"):
        return name in torch_env_vars()
    if name.startswith("NCCL_"):
        return name in nccl_params() or name in torch_env_vars()
    return True


def unknown(names: Iterable[str]) -> list[str]:
    """The names of ``names`` that neither NCCL nor torch reads, sorted, without repeats."""
    return sorted({n for n in names if not known(n)})


def names_in(text: str) -> set[str]:
    """Every ``NCCL_*``/``TORCH_*`` name in ``text``."""
    return set(NAME.findall(text))


def default_timeouts() -> dict[str, timedelta]:
    """The installed torch's default process-group timeouts: ``{"nccl": ..., "other": ...}`` (gloo and the rest).

    ``other`` is ``torch.distributed.constants.default_pg_timeout``; ``nccl`` is
    ``default_pg_nccl_timeout`` where torch was built with NCCL, else the C++ constant
    ``kProcessGroupNCCLDefaultTimeout`` read from the ``ProcessGroupNCCL.hpp`` the wheel ships (a CPU
    build has no NCCL but the same header).

    Raises:
        LookupError: the NCCL default is in neither place (a torch that moved the constant).
    """
    from torch.distributed import constants  # imported here: torch is heavy and only this function needs it

    nccl = constants.default_pg_nccl_timeout
    if nccl is None:
        header = (Path(constants.__file__).resolve().parent.parent / "include" / "torch" / "csrc" / "distributed"
                  / "c10d" / "ProcessGroupNCCL.hpp")
        m = re.search(r"kProcessGroupNCCLDefaultTimeout\s*=\s*std::chrono::milliseconds\(([\d\s*]+)\)",
                      header.read_text() if header.is_file() else "")
        if not m:
            raise LookupError(f"no kProcessGroupNCCLDefaultTimeout in {header}")
        ms = 1
        for factor in m.group(1).split("*"):
            ms *= int(factor)
        nccl = timedelta(milliseconds=ms)
    return {"nccl": nccl, "other": constants.default_pg_timeout}


def _source_files(root: Path) -> Iterable[Path]:
    for sub in ("src", "plugins"):
        for path in sorted((root / sub).rglob("*")):
            if path.suffix in _SOURCES and path.is_file():
                yield path


def extract_nccl(root: Path) -> set[str]:
    """The variables NCCL's source tree at ``root`` reads (``src/`` and ``plugins/``) or env.rst documents.

    Raises:
        FileNotFoundError: ``root`` has no ``src/include/param.h`` (not an NCCL tree).
    """
    root = Path(root)
    if not (root / "src" / "include" / "param.h").is_file():
        raise FileNotFoundError(f"nccl_src: {root} has no src/include/param.h (expected a checkout of NVIDIA/nccl)")
    names: set[str] = set()
    for path in _source_files(root):
        text = path.read_text(errors="replace")
        names.update("NCCL_" + m for m in _PARAM.findall(text))
        names.update(_DEFINE_PARAM.findall(text))
        for args in _READER.findall(text):
            names.update(_LITERAL_NCCL.findall(args))
    env_rst = root / "docs" / "userguide" / "source" / "env.rst"
    if env_rst.is_file():
        names.update(_RST_HEADING.findall(env_rst.read_text()))
    names.discard("NCCL_")
    return names


def extract_nccl_debug(root: Path) -> list[str]:
    """The variables documented under the "Debugging" heading of NCCL's env.rst, in page order.

    Raises:
        FileNotFoundError: no ``docs/userguide/source/env.rst`` under ``root``.
        ValueError: the page has no "Debugging" section.
    """
    text = (Path(root) / "docs" / "userguide" / "source" / "env.rst").read_text()
    start = re.search(r"^Debugging\s*\n={3,}\s*$", text, re.M)
    if not start:
        raise ValueError("env.rst: no 'Debugging' section")
    rest = text[start.end():]
    end = re.search(r"^\S.*\n={3,}\s*$", rest, re.M)
    return _RST_HEADING.findall(rest[:end.start()] if end else rest)


def extract_torch(torch_dir: Path) -> set[str]:
    """The ``TORCH_*`` names and ``NCCL_*`` aliases in the installed torch at ``torch_dir``.

    Literals of its C++ headers and Python sources, and whole-string ``TORCH_*`` entries of its
    shared libraries; C macros (a header name followed by ``(``: ``TORCH_CHECK``) are left out.
    """
    torch_dir = Path(torch_dir)
    names: set[str] = set()
    macros: set[str] = set()
    quoted = re.compile(r"[\"'](TORCH_[A-Z0-9_]+|NCCL_[A-Z0-9_]+)[\"']")
    for path in (torch_dir / "include").rglob("*.h*"):
        text = path.read_text(errors="replace")
        names.update(n for n in quoted.findall(text))
        macros.update(re.findall(r"\b(TORCH_[A-Z0-9_]+)\(", text))
    for path in torch_dir.rglob("*.py"):
        names.update(n for n in quoted.findall(path.read_text(errors="replace")) if n.startswith("TORCH_"))
    whole = re.compile(rb"(?<![A-Za-z0-9_])(TORCH_[A-Z0-9_]{3,})\x00")
    for path in (torch_dir / "lib").glob("*.so*"):
        names.update(m.decode() for m in whole.findall(path.read_bytes()))
    return {n for n in names if n not in macros and not n.endswith("_")}


_SLURM_NAME = re.compile(r"SLURMD?_[A-Z0-9_]*[A-Z0-9]")
_SLURM_LITERAL = re.compile(r'"(SLURMD?_[A-Z0-9_]*[A-Z0-9])"')
_SLURM_DOCS = ("doc/man/man1/sbatch.1", "doc/man/man1/srun.1", "doc/man/man1/salloc.1", "doc/html/prolog_epilog.shtml")


def extract_slurm(root: Path) -> set[str]:
    """The ``SLURM_*``/``SLURMD_*`` names of a Slurm source tree at ``root``: every one the sbatch/srun/salloc man
    pages and the prolog/epilog page mention, and every string literal of that form under ``src/``.

    Raises:
        FileNotFoundError: one of the four documentation files is missing (not a Slurm tree).
    """
    names: set[str] = set()
    for rel in _SLURM_DOCS:
        names.update(_SLURM_NAME.findall((root / rel).read_text(errors="replace")))
    for path in _source_files(root):
        names.update(_SLURM_LITERAL.findall(path.read_text(errors="replace")))
    return {n for n in names if not n.endswith("_")}


_SLURM_OPT_BLOCK = re.compile(r"static slurm_cli_opt_t slurm_opt_\w+ = \{(.*?)\n\};", re.S)


def extract_sbatch_options(root: Path) -> set[str]:
    """The options ``sbatch`` parses in the Slurm tree at ``root`` (``src/common/slurm_opt.c``): ``--name`` of every
    ``slurm_cli_opt_t`` with a name and a ``set_func`` or ``set_func_sbatch``, and ``-c`` where its ``val`` is a
    character (``slurm_option_table_create`` builds sbatch's getopt table from exactly those).

    Raises:
        FileNotFoundError: no ``src/common/slurm_opt.c`` under ``root`` (not a Slurm tree).
    """
    out: set[str] = set()
    for block in _SLURM_OPT_BLOCK.findall((root / "src" / "common" / "slurm_opt.c").read_text(errors="replace")):
        name = re.search(r'\.name\s*=\s*"([^"]+)"', block)
        if name is None or not re.search(r"\.set_func(?:_sbatch)?\s*=", block):
            continue
        out.add("--" + name.group(1))
        short = re.search(r"\.val\s*=\s*'(.)'", block)
        if short:
            out.add("-" + short.group(1))
    return out


def sbatch_options() -> frozenset[str]:
    """Every option sbatch parses, ``--long`` and ``-s`` (``helpers/data/sbatch_options.txt``)."""
    return read_list(SBATCH_OPTIONS)


def write_list(path: Path, header: Iterable[str], names: Iterable[str]) -> None:
    """Write ``names`` sorted, one per line, under ``# ``-prefixed ``header`` lines (temp file, then rename)."""
    body = "".join(f"# {line}\n" for line in header) + "".join(f"{n}\n" for n in sorted(set(names)))
    fd, tmp = tempfile.mkstemp(dir=Path(path).parent, prefix=".envnames-")
    with os.fdopen(fd, "w") as out:
        out.write(body)
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    """Regenerate the lists: ``--nccl-src DIR --nccl-tag T --nccl-commit SHA``, ``--slurm-src DIR --slurm-tag T
    --slurm-commit SHA`` and/or ``--torch``."""
    p = argparse.ArgumentParser(prog="python -m helpers.envnames", description=__doc__.splitlines()[0])
    p.add_argument("--nccl-src", type=Path, help="an NVIDIA/nccl source tree (git archive of a release tag)")
    p.add_argument("--nccl-tag", help="the release tag of --nccl-src, recorded in the header")
    p.add_argument("--nccl-commit", help="the commit id of that tag, recorded in the header")
    p.add_argument("--torch", action="store_true", help="regenerate torch_env_vars.txt from the installed torch")
    p.add_argument("--slurm-src", type=Path, help="a SchedMD/slurm source tree (git archive of a release tag)")
    p.add_argument("--slurm-tag", help="the release tag of --slurm-src, recorded in the header")
    p.add_argument("--slurm-commit", help="the commit id of that tag, recorded in the header")
    p.add_argument("--slurm-option-src", action="append", default=[], metavar="TAG=DIR",
                   help="a Slurm release tag and its source tree: sbatch_options.txt is the union over all given")
    args = p.parse_args(argv)
    if args.slurm_option_src:
        pairs = [spec.partition("=")[::2] for spec in args.slurm_option_src]
        if any(not tag or not d for tag, d in pairs):
            p.error("--slurm-option-src takes TAG=DIR (a release tag and its source tree)")
        write_list(SBATCH_OPTIONS, ["Every option sbatch parses, from src/common/slurm_opt.c of github.com/SchedMD/slurm "
                                    + ", ".join(tag for tag, _d in pairs) + " (their union).",
                                    "Generated by `python -m helpers.envnames --slurm-option-src TAG=DIR ...`: "
                                    "slurm_cli_opt_t entries with set_func or set_func_sbatch. Do not edit by hand."],
                   set().union(*(extract_sbatch_options(Path(d)) for _tag, d in pairs)))
    if args.slurm_src:
        if not (args.slurm_tag and args.slurm_commit):
            p.error("--slurm-src needs --slurm-tag and --slurm-commit (recorded in the header)")
        write_list(SLURM_ENV_VARS, [f"Every SLURM_*/SLURMD_* variable Slurm documents or sets: github.com/SchedMD/slurm "
                                    f"{args.slurm_tag} (commit {args.slurm_commit}).",
                                    "Generated by `python -m helpers.envnames --slurm-src`: names in the sbatch/srun/"
                                    "salloc man pages and prolog_epilog.shtml,",
                                    "plus the \"SLURM_...\" string literals of src/. Do not edit by hand."],
                   extract_slurm(args.slurm_src))
    if args.nccl_src:
        if not (args.nccl_tag and args.nccl_commit):
            p.error("--nccl-src needs --nccl-tag and --nccl-commit (recorded in the header)")
        origin = f"github.com/NVIDIA/nccl {args.nccl_tag} (commit {args.nccl_commit})"
        write_list(NCCL_PARAMS, [f"Every environment variable NCCL reads: {origin}.",
                                 "Generated by `python -m helpers.envnames` (helpers/envnames.py): NCCL_PARAM / "
                                 "DEFINE_NCCL_PARAM / ncclGetEnv / getenv / ncclGetLevel",
                                 "names in src/ and plugins/, plus docs/userguide/source/env.rst. Do not edit by hand."],
                   extract_nccl(args.nccl_src))
        write_list(NCCL_DEBUG_PARAMS, [f"NCCL's debug-only variables: env.rst 'Debugging' section, {origin}.",
                                       "NCCL: they 'should not be used in production nor retained in scripts'.",
                                       "Generated by `python -m helpers.envnames`. Do not edit by hand."],
                   extract_nccl_debug(args.nccl_src))
    if args.torch:
        import torch  # only the generator needs torch

        write_list(TORCH_ENV_VARS, [f"TORCH_* variables and NCCL_* aliases read by torch {torch.__version__} "
                                    "(installed wheel: C++ headers, Python sources, shared libraries).",
                                    "Generated by `python -m helpers.envnames --torch`. Do not edit by hand."],
                   extract_torch(Path(torch.__file__).parent))
    if not (args.nccl_src or args.torch or args.slurm_src or args.slurm_option_src):
        p.error("nothing to do: give --nccl-src (with --nccl-tag, --nccl-commit), --slurm-src (with --slurm-tag, "
                "--slurm-commit) and/or --torch")
    return 0


if __name__ == "__main__":
    sys.exit(main())
