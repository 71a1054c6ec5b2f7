"""Chapters stay clean: committed without outputs, with the kernelspec the lab really uses.

Opening a chapter in ``make lab`` must not modify it.  Three things did: a committed kernelspec whose
``display_name`` differs from the kernel's own, and a ``language_info`` other than the one the kernel
announces (JupyterLab writes both into the notebook when the kernel starts, so the tab showed unsaved
changes before any cell ran: seen in Chromium, ``tests/browser/test_command_builder.py`` checks it),
and outputs, execution counts and run metadata written by autosave or a save after running cells.
This module is the one definition of "clean":

* the stripping is nbstripout's (https://github.com/kynan/nbstripout, a maintained tool, used as a
  library here and as a git clean filter): outputs and execution counts out, cell ids kept (they
  are nbformat 4.5's stable ids, not run state), plus :data:`EXTRA_KEYS` (what kernels and
  papermill add to the metadata);
* the kernelspec is :func:`lab_kernelspec`, read from the ``python3`` kernel installed in the
  environment (ipykernel's ``Python 3 (ipykernel)``), and ``language_info`` is
  :func:`lab_language_info`, what that kernel announces (ipykernel's ``IPythonKernel.language_info``:
  it names the interpreter's version, so a chapter opened under another Python patch release still
  gets that one line rewritten; the check compares the version up to the minor release).

:func:`problems` lists what is not clean (``tests/unit/test_notebooks_clean.py`` fails on any, in
``make test``); ``python -m helpers.nbclean --fix`` cleans the chapters in place (temp file, then
rename); ``--install-git-filter`` registers nbstripout as this clone's git filter with the same keys,
so that ``git diff`` and ``git add`` never see outputs (``make setup`` runs it).
"""

from __future__ import annotations

import argparse
import copy
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"
KERNEL_NAME = "python3"
EXTRA_KEYS = ("metadata.papermill", "metadata.widgets", "metadata.toc", "cell.metadata.papermill",
              "cell.metadata.execution", "cell.metadata.collapsed", "cell.metadata.scrolled",
              "cell.metadata.jupyter")
"""Metadata nbstripout removes besides its defaults: what a kernel, papermill or JupyterLab adds on a run."""


def lab_kernelspec(name: str = KERNEL_NAME) -> dict[str, str]:
    """``{"name", "display_name", "language"}`` of the kernel ``name`` as installed (what JupyterLab writes back).

    Raises:
        ValueError: no such kernel is installed (names it and ``jupyter kernelspec list``).
    """
    from jupyter_client.kernelspec import KernelSpecManager, NoSuchKernel

    try:
        spec = KernelSpecManager().get_kernel_spec(name)
    except NoSuchKernel:
        raise ValueError(f"kernel={name!r}: not installed here (see `jupyter kernelspec list`)") from None
    return {"display_name": spec.display_name, "language": spec.language, "name": name}


def lab_language_info() -> dict[str, Any]:
    """The ``language_info`` the lab's kernel announces (ipykernel's ``IPythonKernel.language_info``, a copy)."""
    from ipykernel.ipkernel import IPythonKernel

    return copy.deepcopy(dict(IPythonKernel.language_info))


def _minor(info: dict[str, Any]) -> dict[str, Any]:
    """``info`` with ``version`` cut to major.minor (``3.11.7`` -> ``3.11``)."""
    return {**info, "version": ".".join(str(info.get("version", "")).split(".")[:2])}


def tracked_notebooks(root: Path = ROOT) -> list[Path]:
    """The chapters: ``notebooks/*.ipynb`` as git tracks them (every ``*.ipynb`` there outside a git checkout)."""
    try:
        out = subprocess.run(["git", "-C", str(root), "ls-files", "--", "notebooks/*.ipynb"], capture_output=True,
                             text=True, timeout=30, check=True).stdout.split()
    except (OSError, subprocess.SubprocessError):
        out = []
    return [root / p for p in out] or sorted((root / "notebooks").glob("*.ipynb"))


def stripped(nb: Any) -> Any:
    """A copy of the notebook node ``nb`` as nbstripout leaves it (:data:`EXTRA_KEYS`, ids kept)."""
    from nbstripout import strip_output

    return strip_output(copy.deepcopy(nb), keep_output=False, keep_count=False, keep_id=True,
                        extra_keys=[*_DEFAULT_KEYS, *EXTRA_KEYS])


_DEFAULT_KEYS = ("metadata.signature", "metadata.widgets", "cell.metadata.collapsed", "cell.metadata.ExecuteTime",
                 "cell.metadata.execution", "cell.metadata.heading_collapsed", "cell.metadata.hidden",
                 "cell.metadata.scrolled")
"""nbstripout 0.9's own default keys (``_nbstripout.main``), which its library function does not apply by itself."""


def problems(path: str | Path, kernelspec: dict[str, str] | None = None,
             language_info: dict[str, Any] | None = None) -> list[str]:
    """What makes the notebook at ``path`` unclean: one message per problem, ``[]`` when clean.

    Args:
        path: an ``.ipynb`` file.
        kernelspec: the expected kernelspec (default :func:`lab_kernelspec`).
        language_info: the expected ``language_info`` (default :func:`lab_language_info`).

    Returns:
        Messages naming the notebook and the cell (``01_launchers.ipynb cell 12 (id d7-builder): 2
        output(s), execution_count 5``), a kernelspec that differs, or metadata nbstripout removes.
    """
    import nbformat

    path = Path(path)
    want = lab_kernelspec() if kernelspec is None else kernelspec
    nb = nbformat.read(path, as_version=4)
    found = []
    for i, cell in enumerate(nb.cells):
        outs, count = len(cell.get("outputs", [])), cell.get("execution_count")
        if outs or count is not None:
            found.append(f"{path.name} cell {i} (id {cell.get('id', '?')}): {outs} output(s), execution_count {count}")
    have = dict(nb.metadata.get("kernelspec", {}))
    if have != want:
        found.append(f"{path.name}: kernelspec {have} is not the lab's {want} (JupyterLab rewrites it on open)")
    lang = lab_language_info() if language_info is None else language_info
    have_lang = dict(nb.metadata.get("language_info", {}))
    if _minor(have_lang) != _minor(lang):
        found.append(f"{path.name}: language_info {have_lang} is not the kernel's {lang} (JupyterLab rewrites it on open)")
    clean = stripped(nb)
    if not found and clean != nb:
        extra = sorted(set(nb.metadata) - set(clean.metadata)) or ["cell metadata"]
        found.append(f"{path.name}: run metadata nbstripout removes: {', '.join(extra)}")
    return found


def fix(path: str | Path, kernelspec: dict[str, str] | None = None,
        language_info: dict[str, Any] | None = None) -> bool:
    """Strip ``path`` with nbstripout, set the lab's kernelspec and language_info; write atomically; True when changed."""
    import nbformat

    from helpers.report import write_atomic

    path = Path(path)
    nb = nbformat.read(path, as_version=4)
    clean = stripped(nb)
    clean.metadata["kernelspec"] = lab_kernelspec() if kernelspec is None else kernelspec
    clean.metadata["language_info"] = lab_language_info() if language_info is None else language_info
    if clean == nb:
        return False
    write_atomic(path, nbformat.writes(clean) + "\n")
    return True


def install_git_filter(root: Path = ROOT) -> str:
    """Register nbstripout as the git clean filter of ``notebooks/*.ipynb`` in this clone, with :data:`EXTRA_KEYS`.

    Writes the clone's ``.git/config`` (``filter.nbstripout.*``, ``diff.ipynb.textconv``) and
    ``.git/info/attributes`` through ``nbstripout --install`` (nothing tracked changes).

    Returns:
        What was done, one line.

    Raises:
        ValueError: ``root`` is not a git checkout (named).
    """
    git = ["git", "-C", str(root)]
    if subprocess.run([*git, "rev-parse", "--git-dir"], capture_output=True, timeout=30).returncode:
        raise ValueError(f"root={str(root)!r}: not a git checkout; nothing to install")
    subprocess.run([sys.executable, "-m", "nbstripout", "--install"], cwd=root, check=True, timeout=60)
    keep = "--keep-id"
    subprocess.run([*git, "config", "filter.nbstripout.clean", f"'{sys.executable}' -m nbstripout {keep}"],
                   check=True, timeout=30)
    subprocess.run([*git, "config", "filter.nbstripout.extrakeys", " ".join(EXTRA_KEYS)], check=True, timeout=30)
    return f"nbstripout is the git clean filter of *.ipynb in {root} (ids kept, {len(EXTRA_KEYS)} extra keys)"


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m helpers.nbclean [--fix] [--install-git-filter] [NOTEBOOK...]``: 0 clean, 1 not clean, 2 bad input."""
    p = argparse.ArgumentParser(prog="python -m helpers.nbclean", description=__doc__.split("\n\n")[0])
    p.add_argument("notebooks", nargs="*", help="default: the tracked chapters in notebooks/")
    p.add_argument("--fix", action="store_true", help="strip and set the kernelspec in place")
    p.add_argument("--install-git-filter", action="store_true", help="register nbstripout as this clone's git filter")
    args = p.parse_args(argv)
    try:
        if args.install_git_filter:
            print(install_git_filter())
            return 0
        paths = [Path(n) for n in args.notebooks] or tracked_notebooks()
        want = lab_kernelspec()
        if args.fix:
            for path in paths:
                if fix(path, want):
                    print(f"cleaned {path}")
            return 0
        found = [msg for path in paths for msg in problems(path, want)]
    except (OSError, ValueError, subprocess.CalledProcessError) as exc:
        print(f"nbclean: {exc}", file=sys.stderr)
        return 2
    for msg in found:
        print(msg)
    return 1 if found else 0


if __name__ == "__main__":
    sys.exit(main())
