"""Plots (matplotlib, headless Agg backend) for the chapters and reports."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any


def _save(fig: Any, path: str | Path) -> Path:
    """Lay ``fig`` out, write it to ``path`` (parent folders created), close it; return the path."""
    import matplotlib.pyplot as plt

    fig.tight_layout()
    out = Path(path)
    out.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(out)
    plt.close(fig)
    return out

def plot_busbw(rows: Sequence[Mapping], path: str | Path, *, plateaus: Mapping[str, Mapping] | None = None,
               title: str = "busbw vs message size", expected: Mapping[str, Any] | None = None) -> Path:
    """Plot busbw (GB/s, nccl-tests definition) against message size (bytes, log2 axis), one line per op.

    Args:
        rows: sweep rows with ``op``, ``bytes`` and ``busbw_GBps`` (see :func:`helpers.busbw.annotate`).
        path: PNG file to write (parent created).
        plateaus: optional ``{op: {"plateau_GBps", "from_bytes"}}`` drawn as dashed lines over
            the sizes they were taken from.
        title: figure title.
        expected: optional ``{"expected_GBps", "good_ratio", "warn_ratio", "scope"}`` (a
            :func:`helpers.allocation.grades.grade_expected` record's values): the expected figure as a solid black line,
            the WARN and FAIL thresholds as dotted lines, and the scope (intra-/inter-node) in the title.

    Returns:
        The PNG path.

    Raises:
        ValueError: ``rows`` is empty.
    """
    if not rows:
        raise ValueError("rows: nothing to plot")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4), dpi=110)
    for op in dict.fromkeys(r["op"] for r in rows):
        pts = sorted((r["bytes"], r["busbw_GBps"]) for r in rows if r["op"] == op)
        line = ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", ms=3, label=op)[0]
        if plateaus and op in plateaus:
            p = plateaus[op]
            ax.hlines(p["plateau_GBps"], p["from_bytes"], pts[-1][0], colors=line.get_color(), linestyles="dashed")
    if expected and expected.get("expected_GBps"):
        exp = expected["expected_GBps"]
        ax.axhline(exp, color="black", lw=1.2, label=f"expected {exp:.3g} GB/s")
        ax.axhline(exp * expected.get("good_ratio", 0.9), color="tab:orange", ls=":", lw=1,
                   label=f"WARN below {expected.get('good_ratio', 0.9):.0%}")
        ax.axhline(exp * expected.get("warn_ratio", 0.75), color="tab:red", ls=":", lw=1,
                   label=f"FAIL below {expected.get('warn_ratio', 0.75):.0%}")
    if expected and expected.get("scope"):
        title = f"{title} ({expected['scope']})"
    ax.set_xscale("log", base=2)
    ax.set_xlabel("message size (bytes)")
    ax.set_ylabel("busbw (GB/s)")
    ax.set_title(title)
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    return _save(fig, path)


def plot_pair_matrix(matrix: Mapping[str, Mapping[str, float]], path: str | Path, *,
                     title: str = "node x node busbw (GB/s)") -> Path:
    """Heat-map of the node-pair busbw matrix (GB/s, one rank per node; see :func:`helpers.allocation.grades.pair_matrix`).

    Args:
        matrix: ``{a: {b: GB/s}}``, symmetric; missing pairs (not measured, or the diagonal) are blank.
        path: PNG file to write (parent created).

    Returns:
        The PNG path.

    Raises:
        ValueError: ``matrix`` has fewer than 3 nodes (two nodes are one pair: one number, no picture to read).
    """
    nodes = list(matrix)
    if len(nodes) < 3:
        raise ValueError(f"matrix: {len(nodes)} node(s); a heat-map needs 3 or more (2 nodes are one pair: report its busbw)")
    import math

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    grid = [[matrix[a].get(b, math.nan) for b in nodes] for a in nodes]
    size = 1.2 + 0.6 * len(nodes)
    fig, ax = plt.subplots(figsize=(size + 1.5, size), dpi=110)
    im = ax.imshow(grid, cmap="viridis")
    ax.set_xticks(range(len(nodes)), nodes, rotation=90)
    ax.set_yticks(range(len(nodes)), nodes)
    if len(nodes) <= 16:
        for i, row in enumerate(grid):
            for j, v in enumerate(row):
                if not math.isnan(v):
                    ax.text(j, i, f"{v:.3g}", ha="center", va="center", color="w", fontsize=7)
    fig.colorbar(im, ax=ax, label="busbw (GB/s)")
    ax.set_title(title)
    return _save(fig, path)
