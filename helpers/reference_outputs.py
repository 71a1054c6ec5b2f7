"""The chapters' deterministic outputs must reproduce: nbval's comparison of a fresh run against committed references.

papermill checks that a chapter runs and that its asserts hold; it cannot notice that a cell's output
changed (a table of sizes, a rank contract, a parsed command, a trap's text, a verdict).  nbval can, but
it compares the outputs *stored in the notebook* with a new execution, and the chapters are committed
without outputs.  So the references live outside ``notebooks/`` (:data:`REFERENCE_DIR`, one JSON file per
chapter) and are compared with the *fresh papermill run* the notebook tests just made: no second
execution (``make test`` runs each chapter once).  The comparison is nbval's own code, used as a library:
``IPyNbCell.compare_outputs`` (per output key, ``text/plain``, ``text/markdown``, stream names, error
names; nbval's default skipped keys), ``coalesce_streams`` and the sanitize file format
(``get_sanitize_patterns``), nbval 0.11 ``nbval/plugin.py``.

Which cells are compared strictly (:func:`is_strict`): every code cell except those tagged
``nbval-ignore-output`` (output depends on timing, completion order or the machine: each carries its
reason in the cell metadata key :data:`REASON_KEY`), ``nbval-skip``, ``parameters`` /
``injected-parameters`` (papermill's), and ``tier-*`` (their output depends on the hardware: the GPU
result or the ``[SKIP tier-...]`` line).  In the fresh run a cell that printed a ``[SKIP ...]`` line (no
lab here, say) is reported as not compared, with the line.  Both sides go through the sanitizer
(:data:`SANITIZE_FILE`, nbval's ``regex:``/``replace:`` format, for times, dates, addresses, ports, PIDs,
job stamps, paths, the job runner's progress lines) after two substitutions made here because they are
not constants: the root of the checkout the chapter ran in (``<ROOT>``) and this host's name (``<HOST>``).

A reference is recorded from a run (:func:`record`, ``python -m helpers.reference_outputs update``) and
stores each strict cell's sanitized outputs with the SHA-1 of its source: a cell whose source changed
since is reported stale (rerun the chapter, then update), and a chapter run with other parameters
than the reference's is not compared (its outputs may differ by design).

Command line::

    python -m helpers.reference_outputs compare build/executed/02_ddp.ipynb ...   # exit 1 when a cell differs
    python -m helpers.reference_outputs update build/executed/02_ddp.ipynb ...    # (re)write the references
"""

from __future__ import annotations

import argparse
import ast
import copy
import hashlib
import importlib.util
import json
import platform
import re
import sys
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
REFERENCE_DIR = ROOT / "tests" / "notebooks" / "reference"
SANITIZE_FILE = REFERENCE_DIR / "sanitize.cfg"
IGNORE_TAG = "nbval-ignore-output"
REASON_KEY = "nbval-ignore-output-reason"
"""Cell metadata key holding why a cell tagged ``nbval-ignore-output`` is not compared (one sentence)."""
NOT_COMPARED_TAGS = (IGNORE_TAG, "nbval-skip", "parameters", "injected-parameters")
OUTPUT_PARAMETERS = ("REPORT_DIR",)
"""Parameters that only say where files go (the sanitizer masks paths): a difference does not stop the comparison."""
SKIP_COMPARE = ("metadata", "traceback", "prompt_number", "output_type", "name", "execution_count",
                "application/vnd.jupyter.widget-view+json", "image/png", "image/jpeg")
"""Output keys nbval does not compare (``IPyNbFile.__init__``'s ``skip_compare``, images included as without
``--nbdime``, nbval 0.11 ``plugin.py``): figures are compared by their ``text/plain`` line only."""


def is_strict(cell: Any) -> bool:
    """True when the code cell ``cell`` (a notebook node) is compared strictly (module docstring: which cells)."""
    tags = cell.metadata.get("tags", [])
    return (cell.cell_type == "code" and not any(t in NOT_COMPARED_TAGS for t in tags)
            and not any(t.startswith("tier-") for t in tags))


def source_sha(cell: Any) -> str:
    """SHA-1 (hex) of the cell's source: a reference recorded from other code is stale."""
    return hashlib.sha1(cell.source.encode()).hexdigest()


def sanitize_patterns(sanitize_file: Path = SANITIZE_FILE, root: Path = ROOT, host: str | None = None) -> OrderedDict:
    """``regex -> replacement`` in the order applied: the checkout's ``root``, this host's name, then the file's pairs.

    Raises:
        FileNotFoundError: ``sanitize_file`` is missing.
    """
    from nbval.plugin import get_sanitize_patterns

    host = platform.node() if host is None else host
    patterns: OrderedDict = OrderedDict([(re.escape(str(root)), "<ROOT>")])
    if host:
        patterns[rf"\b{re.escape(host)}\b"] = "<HOST>"
    patterns.update(get_sanitize_patterns(Path(sanitize_file).read_text()))
    return patterns


class _Cell:
    """nbval's comparison of one cell, outside pytest and without a kernel: ``IPyNbCell``'s own methods.

    ``compare_outputs`` reads ``parent.skip_compare``, ``parent.sanitize_patterns``, ``colors`` and
    writes ``comparison_traceback``; ``format_output_compare`` asks pytest's ``pytest_assertrepr_compare``
    hook first (none here: nbval's fallback, reference then test output, is used).  nbval is imported
    here, not at module import (it imports pytest).
    """

    def __init__(self, patterns: OrderedDict) -> None:
        from nbval.plugin import IPyNbCell, nocolors

        self._nbval = IPyNbCell
        self.parent = SimpleNamespace(skip_compare=SKIP_COMPARE, sanitize_patterns=patterns)
        self.colors = nocolors
        self.config = None
        self.ihook = SimpleNamespace(pytest_assertrepr_compare=lambda **_: [])
        self.comparison_traceback: list[str] = []

    def compare_outputs(self, test: list[Any], ref: list[Any]) -> bool:
        """nbval's ``IPyNbCell.compare_outputs``: True when the sanitized outputs agree."""
        return self._nbval.compare_outputs(self, test, ref)

    def format_output_compare(self, key: str, left: Any, right: Any) -> None:
        """nbval's report of one mismatching key (called by ``compare_outputs``)."""
        self._nbval.format_output_compare(self, key, left, right)

    def sanitize(self, s: Any) -> Any:
        """nbval's sanitizer: every pattern applied in order to a string."""
        return self._nbval.sanitize(self, s)

    def sanitize_outputs(self, outputs: list[Any]) -> list[Any]:
        """nbval's ``sanitize_outputs``: every output's strings sanitized."""
        return self._nbval.sanitize_outputs(self, outputs)


def _outputs(cell: Any) -> list[Any]:
    """The cell's outputs as nbval compares them: a copy, streams coalesced (nbval's ``coalesce_streams``)."""
    from nbval.plugin import coalesce_streams

    return coalesce_streams(copy.deepcopy(list(cell.get("outputs", []))))


def _stored(outputs: list[Any]) -> list[dict[str, Any]]:
    """Outputs as a reference stores them: no metadata, traceback or skipped data keys (nbval ignores them)."""
    out = []
    for o in outputs:
        kept = {k: v for k, v in o.items() if k not in ("metadata", "traceback", "execution_count")}
        if "data" in kept:
            kept["data"] = {k: v for k, v in kept["data"].items() if k not in SKIP_COMPARE}
        out.append(kept)
    return out


def _defaults(nb: Any) -> dict[str, Any]:
    """The literals of the notebook's ``parameters`` cell (``NAME = literal`` lines)."""
    for cell in nb.cells:
        if "parameters" in cell.metadata.get("tags", []):
            values = {}
            for node in ast.parse(cell.source).body:
                if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
                    try:
                        values[node.targets[0].id] = ast.literal_eval(node.value)
                    except ValueError:
                        continue
            return values
    return {}


def overridden(nb: Any) -> dict[str, Any]:
    """The papermill parameters of the executed notebook ``nb`` that differ from its defaults (:data:`OUTPUT_PARAMETERS` left out)."""
    defaults = _defaults(nb)
    given = nb.metadata.get("papermill", {}).get("parameters", {}) or {}
    return {k: v for k, v in sorted(given.items()) if k not in OUTPUT_PARAMETERS and defaults.get(k, object()) != v}


def reference_path(executed: str | Path, reference_dir: Path = REFERENCE_DIR) -> Path:
    """The reference file of a chapter: ``<reference_dir>/<notebook stem>.json``."""
    return Path(reference_dir) / f"{Path(executed).stem}.json"


def run_root(nb: Any) -> Path:
    """The checkout the executed notebook ``nb`` ran in: papermill's ``input_path`` is ``<root>/notebooks/NN.ipynb``
    (this checkout when papermill did not record it)."""
    given = nb.metadata.get("papermill", {}).get("input_path")
    return Path(given).resolve().parent.parent if given else ROOT


def record(executed: str | Path, patterns: OrderedDict | None = None) -> dict[str, Any]:
    """The reference document of an executed chapter: its strict cells' sanitized outputs.

    Returns:
        ``{"notebook", "parameters" (overridden ones), "recorded_from" (helpers.provenance record or {}),
        "cells": [{"id", "source_sha1", "outputs"}]}``, cells in notebook order.

    Raises:
        ValueError: a strict cell did not run (``execution_count`` None: the run stopped early), named.
    """
    import nbformat

    from helpers import provenance

    nb = nbformat.read(str(executed), as_version=4)
    shim = _Cell(sanitize_patterns(root=run_root(nb)) if patterns is None else patterns)
    cells = []
    for cell in nb.cells:
        if not is_strict(cell):
            continue
        if cell.get("execution_count") is None:
            raise ValueError(f"{Path(executed).name} cell {cell.get('id')}: did not run; record from a complete run")
        cells.append({"id": cell.get("id"), "source_sha1": source_sha(cell),
                      "outputs": _stored(shim.sanitize_outputs(_outputs(cell)))})
    ran = provenance.read(nb)
    return {"notebook": Path(executed).name, "parameters": overridden(nb),
            "recorded_from": {k: ran.get(k) for k in ("host", "tier", "torch", "started") if k in ran},
            "cells": cells}


def update(executed: str | Path, reference_dir: Path = REFERENCE_DIR) -> Path:
    """(Re)write the reference of ``executed`` from that run (atomically); returns the file written."""
    from helpers.report import write_atomic

    doc = record(executed)
    return write_atomic(reference_path(executed, reference_dir), json.dumps(doc, indent=1, ensure_ascii=False) + "\n")


@dataclass
class Comparison:
    """One chapter compared with its reference.

    Attributes:
        notebook: the chapter's file name.
        compared: strict cells compared (their sanitized outputs, empty ones included).
        with_output: of those, how many have an output.
        differ: ``[cell id, what differs]`` for each mismatch (nbval's report), stale or missing reference.
        not_compared: ``[cell id, why]`` for strict cells skipped in this run (a ``[SKIP ...]`` line, not run).
        skipped: why the whole chapter was not compared ('' when it was): no reference, other parameters.
    """

    notebook: str
    compared: int = 0
    with_output: int = 0
    differ: list[list[str]] = field(default_factory=list)
    not_compared: list[list[str]] = field(default_factory=list)
    skipped: str = ""

    @property
    def ok(self) -> bool:
        """True when nothing differs (a skipped chapter is ok: it says why)."""
        return not self.differ

    def render(self) -> str:
        """A few lines: the counts, then each difference with nbval's report."""
        if self.skipped:
            return f"{self.notebook}: not compared: {self.skipped}"
        head = (f"{self.notebook}: {self.compared} cells compared strictly ({self.with_output} with output), "
                f"{len(self.differ)} differ, {len(self.not_compared)} not compared")
        lines = [head] + [f"  cell {cid}: not compared: {why}" for cid, why in self.not_compared]
        lines += [f"  cell {cid} differs:\n{text}" for cid, text in self.differ]
        return "\n".join(lines)


def compare(executed: str | Path, reference_dir: Path = REFERENCE_DIR, patterns: OrderedDict | None = None) -> Comparison:
    """Compare the strict cells of a fresh executed chapter with its reference, with nbval's comparison.

    Args:
        executed: the executed copy (papermill's output).
        reference_dir: where the ``<stem>.json`` references are.
        patterns: sanitizer (default :func:`sanitize_patterns`).

    Returns:
        A :class:`Comparison`; ``skipped`` says why when the chapter has no reference, ran with other parameters, or
        nbval is not installed (seen on a GPU node's image: the chapter's run is the result, the comparison waits).
    """
    import nbformat

    from helpers import tiers

    executed = Path(executed)
    result = Comparison(executed.name)
    ref_file = reference_path(executed, reference_dir)
    if not ref_file.exists():
        result.skipped = f"no reference {ref_file.name} (python -m helpers.reference_outputs update {executed})"
        return result
    if importlib.util.find_spec("nbval") is None:  # a GPU node's image: the chapter ran, the comparison cannot
        result.skipped = "nbval is not installed (its comparison code is what compares the outputs)"
        return result
    ref = json.loads(ref_file.read_text())
    nb = nbformat.read(str(executed), as_version=4)
    params = overridden(nb)
    if params != ref.get("parameters", {}):
        result.skipped = f"run with parameters {params}, the reference with {ref.get('parameters', {})}"
        return result
    shim = _Cell(sanitize_patterns(root=run_root(nb)) if patterns is None else patterns)
    by_id = {c["id"]: c for c in ref["cells"]}
    update_hint = f"rerun the chapter, then: python -m helpers.reference_outputs update {executed}"
    seen = set()
    for cell in nb.cells:
        if not is_strict(cell):
            continue
        cid = cell.get("id")
        seen.add(cid)
        want = by_id.get(cid)
        if want is None:
            result.differ.append([cid, f"  no reference for this cell ({update_hint})"])
            continue
        if want["source_sha1"] != source_sha(cell):
            result.differ.append([cid, f"  stale reference: the cell's source changed since it was recorded ({update_hint})"])
            continue
        if cell.get("execution_count") is None:
            result.not_compared.append([cid, "did not run (the chapter stopped before it)"])
            continue
        fresh = _outputs(cell)
        skip = tiers.SKIP_LINE.search("".join(o.get("text", "") for o in fresh))
        if skip:
            result.not_compared.append([cid, skip.group(0)])
            continue
        shim.comparison_traceback = []
        reference = [nbformat.from_dict(o) for o in want["outputs"]]
        result.compared += 1
        result.with_output += bool(reference)
        if not shim.compare_outputs(fresh, reference):
            result.differ.append([cid, "\n".join(str(line) for line in shim.comparison_traceback)])
    for cid in by_id.keys() - seen:
        result.differ.append([cid, f"  the reference has a cell this chapter no longer has as a strict cell ({update_hint})"])
    return result


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m helpers.reference_outputs {compare,update} NOTEBOOK...``: 0 same, 1 a cell differs, 2 bad input."""
    p = argparse.ArgumentParser(prog="python -m helpers.reference_outputs", description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=("compare", "update"), help="compare with the references, or rewrite them")
    p.add_argument("notebooks", nargs="+", help="executed chapters (build/executed/NN_*.ipynb)")
    args = p.parse_args(argv)
    failed = False
    for name in args.notebooks:
        try:
            if args.action == "update":
                print(f"wrote {update(name)}")
                continue
            result = compare(name)
        except (OSError, ValueError) as exc:
            print(f"reference_outputs: {name}: {exc}", file=sys.stderr)
            return 2
        print(result.render())
        failed |= not result.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
