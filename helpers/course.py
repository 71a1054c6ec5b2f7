"""The course as a test suite: execute chapters with papermill and write one summary (per chapter: tiers run / skipped).

On a cluster this runs inside an allocation (``configs/slurm/course.sbatch``, ``make course-sbatch``):
the GPU cells run where the allocation has GPUs (``helpers.tiers``), the multi-node cells where it
has >= 2 nodes, and every skipped tier is listed with the reason the notebook printed
(``[SKIP tier-gpu] ...``, ``[SKIP lab] ...``: never silently).
Executed copies go to ``<out>/executed/``; the summary to ``<out>/summary.json`` and ``<out>/summary.md``.
Each executed copy is stamped with where and when it ran (``helpers.provenance``), and its deterministic
cells are compared with the committed references, as ``make test`` does (``helpers.reference_outputs``:
nbval's comparison; a chapter run with other parameters is not compared, and says so).

Command line::

    python -m helpers.course --out build/course [--chapters 00,08] [-p 08:JOB_TIMEOUT_S=120]
"""

from __future__ import annotations

import argparse
import json
import math
import re
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
NOTEBOOKS = ROOT / "notebooks"


def lab_sbatch(text: str) -> str:
    """``configs/slurm/course.sbatch`` with its ``# EDIT`` lines filled in for the SLURM lab's CPU nodes
    (partition and account ``lab``, one CPU per task, no GPU request)."""
    text = re.sub(r"^#SBATCH --partition=.*$", "#SBATCH --partition=lab", text, flags=re.M)
    text = re.sub(r"^#SBATCH --account=.*$", "#SBATCH --account=lab", text, flags=re.M)
    text = re.sub(r"^#SBATCH --cpus-per-task=.*$", "#SBATCH --cpus-per-task=1", text, flags=re.M)
    return re.sub(r"^#SBATCH --gpus-per-node=.*\n", "", text, flags=re.M)


@dataclass
class ChapterResult:
    """One chapter's run.

    Attributes:
        chapter: the notebook's file name (``08_slurm.ipynb``).
        status: ``passed`` (every cell ran without an error), ``failed``, or ``skipped`` (not run: reason in ``error``).
        seconds: wall time of the execution.
        tiers: tier -> ``{"ran": n, "skipped": n}`` over the cells tagged ``tier-*`` (untagged cells count as ``cpu``).
        skips: ``[tier or "lab", reason]`` for every ``[SKIP ...]`` line the notebook printed (deduplicated).
        error: the failing cell's error name and message ('' when passed).
        executed: path of the executed copy.
        outputs: the reference comparison in one line (``helpers.reference_outputs.Comparison.render``'s first).
        outputs_differ: ``[cell id, nbval's report]`` of each strict cell whose output did not reproduce.
    """

    chapter: str
    status: str
    seconds: float = 0.0
    tiers: dict[str, dict[str, int]] = field(default_factory=dict)
    skips: list[list[str]] = field(default_factory=list)
    error: str = ""
    executed: str = ""
    outputs: str = ""
    outputs_differ: list[list[str]] = field(default_factory=list)


def chapters(selected: str | Sequence[str] | None = None) -> list[Path]:
    """The chapter notebooks (``notebooks/NN_*.ipynb``, in order), or those whose number or name is in ``selected``.

    Args:
        selected: ``None`` (all), or numbers/names (``"00,08"``, ``["08_slurm"]``).

    Raises:
        ValueError: a selection that matches no notebook (names the available ones).
    """
    found = sorted(NOTEBOOKS.glob("[0-9][0-9]*_*.ipynb"))
    if selected is None:
        return found
    wanted = [s.strip() for s in (selected.split(",") if isinstance(selected, str) else selected) if s.strip()]
    out = []
    for w in wanted:
        match = [p for p in found if p.name.split("_")[0] == w or p.stem == w or p.name == w]
        if not match:
            raise ValueError(f"chapters: {w!r} matches no notebook; available: {', '.join(p.stem for p in found)}")
        out += [p for p in match if p not in out]
    return out


def read_result(chapter: str, executed: str | Path, seconds: float = 0.0, error: str = "") -> ChapterResult:
    """Count tiers run/skipped and collect the ``[SKIP ...]`` reasons of an executed notebook."""
    import nbformat

    from helpers.tiers import SKIP_LINE

    nb = nbformat.read(str(executed), as_version=4)
    tiers: dict[str, dict[str, int]] = {}
    skips: list[list[str]] = []
    failed = bool(error)
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        tags = [t[5:] for t in cell.metadata.get("tags", []) if t.startswith("tier-")] or ["cpu"]
        text = "".join(o.get("text", "") for o in cell.get("outputs", []))
        failed |= any(o.get("output_type") == "error" for o in cell.get("outputs", []))
        found = SKIP_LINE.findall(text)
        for tier in tags:
            counts = tiers.setdefault(tier, {"ran": 0, "skipped": 0})
            counts["skipped" if any(k == f"tier-{tier}" for k, _ in found) else "ran"] += 1
        skips += [[k, reason] for k, reason in found if [k, reason] not in skips]
    return ChapterResult(chapter, "failed" if failed else "passed", seconds, tiers, skips, error, str(executed))


def run_chapter(path: Path, out_dir: Path, parameters: Mapping[str, Any] | None = None,
                timeout_s: float = 1800) -> ChapterResult:
    """Execute one notebook with papermill into ``out_dir/executed/`` (cwd ``notebooks/``) and read its result.

    A chapter that passed is then compared with its reference outputs (``ChapterResult.outputs``).
    """
    import papermill

    from helpers import provenance, reference_outputs

    executed = out_dir / "executed" / path.name
    executed.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    error = ""
    try:
        papermill.execute_notebook(str(path), str(executed), parameters=dict(parameters or {}), cwd=str(NOTEBOOKS),
                                   kernel_name="python3", progress_bar=False,
                                   execution_timeout=max(1, math.ceil(timeout_s)))  # nbclient: an int
    except Exception as exc:  # noqa: BLE001 - a failing chapter is a result, not the end of the course
        error = f"{type(exc).__name__}: {str(exc).strip().splitlines()[-1][:300] if str(exc).strip() else ''}"
    seconds = time.monotonic() - t0
    if not executed.exists():
        return ChapterResult(path.name, "failed", seconds, error=error or "no executed notebook written")
    provenance.stamp(executed, "python -m helpers.course")
    result = read_result(path.name, executed, seconds, error)
    if result.status == "passed":
        comparison = reference_outputs.compare(executed)
        result.outputs = comparison.render().splitlines()[0]
        result.outputs_differ = comparison.differ
    return result


def render(results: Sequence[ChapterResult]) -> str:
    """The summary as a markdown table: chapter, status, time, tiers ran/skipped, skip reasons or the error."""
    lines = ["| chapter | status | time | tiers (ran/skipped cells) | skipped because / error |", "|---|---|---|---|---|"]
    for r in results:
        tiers = ", ".join(f"{t} {c['ran']}/{c['skipped']}" for t, c in sorted(r.tiers.items()))
        why = r.error or "; ".join(sorted({f"{k}: {reason}" for k, reason in r.skips})) or "-"
        lines.append(f"| {r.chapter} | {r.status} | {r.seconds:.0f} s | {tiers or '-'} | {why} |")
    passed = sum(r.status == "passed" for r in results)
    text = "\n".join(lines) + f"\n\n{passed}/{len(results)} chapters passed\n"
    compared = [r for r in results if r.outputs]
    if compared:
        text += "\nDeterministic outputs against the references (tests/notebooks/reference/):\n\n"
        text += "".join(f"- {r.outputs}\n" for r in compared)
        text += "".join(f"\n{r.chapter} cell {cid}:\n```\n{report}\n```\n" for r in compared for cid, report in r.outputs_differ)
    return text


def run_course(out_dir: str | Path, selected: str | Sequence[str] | None = None,
               parameters: Mapping[str, Mapping[str, Any]] | None = None, timeout_s: float = 1800) -> list[ChapterResult]:
    """Execute the selected chapters one after another; write ``summary.json`` and ``summary.md`` in ``out_dir``.

    Args:
        out_dir: where the executed copies and the summary go (created).
        selected: as :func:`chapters`.
        parameters: chapter number (``"08"``) -> papermill parameters for that chapter.
        timeout_s: per-cell execution timeout.

    Returns:
        One :class:`ChapterResult` per chapter, in order.
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    results = [run_chapter(p, out, (parameters or {}).get(p.name.split("_")[0]), timeout_s) for p in chapters(selected)]
    (out / "summary.json").write_text(json.dumps([asdict(r) for r in results], indent=2) + "\n")
    (out / "summary.md").write_text(render(results))
    return results


def _parameter(text: str) -> tuple[str, str, Any]:
    chapter, sep, rest = text.partition(":")
    key, eq, value = rest.partition("=")
    if not (sep and eq and chapter and key):
        raise ValueError(f"-p {text!r}: use CHAPTER:NAME=VALUE (08:JOB_TIMEOUT_S=120)")
    try:
        return chapter, key, json.loads(value)
    except json.JSONDecodeError:
        return chapter, key, value


def main(argv: Sequence[str] | None = None) -> int:
    """Command line: run the course, print the summary; exit 1 when a chapter failed or a deterministic output differs."""
    p = argparse.ArgumentParser(prog="python -m helpers.course", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT / "build" / "course"), help="output folder (default build/course)")
    p.add_argument("--chapters", default=None, help="comma-separated numbers or names (default: all)")
    p.add_argument("-p", "--parameter", action="append", default=[], help="CHAPTER:NAME=VALUE papermill parameter")
    p.add_argument("--cell-timeout-s", type=float, default=1800, help="papermill's per-cell timeout, seconds (default 1800)")
    args = p.parse_args(argv)
    params: dict[str, dict[str, Any]] = {}
    for text in args.parameter:
        chapter, key, value = _parameter(text)
        params.setdefault(chapter, {})[key] = value
    results = run_course(args.out, args.chapters, params, args.cell_timeout_s)
    print(render(results))
    return 0 if all(r.status == "passed" and not r.outputs_differ for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
