"""Tables and plots for chapter 04 (FSDP), read from the JSON the FSDP rank scripts write.

* :func:`wrap_rows` / :func:`plot_wrapping`: seed D12, from ``helpers/scenarios/fsdp_wrap.py``;
* :func:`collective_rows`: seed D13, the collectives of one training step per strategy, from
  ``helpers/scenarios/fsdp_sharding.py`` (sizes with the nccl-tests definitions:
  https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md).

Model-state bytes against the estimate are :func:`helpers.memory.compare_fsdp_measured`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from helpers.report import MIB


def wrap_rows(result: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One row per (wrapping, rank): FSDP units and the bytes measured around one forward.

    Args:
        result: the JSON of ``fsdp_wrap.py``.

    Returns:
        Dicts with ``wrap``, ``rank``, ``units``, ``resident_param_bytes`` (this rank's
        shards), ``peak_gathered_param_bytes`` (FSDP2: unsharded parameters alive at the peak;
        0 for FSDP1, whose flat parameters the script does not open),
        ``forward_peak_increase`` (peak of all live tensor bytes during forward minus the value
        before it) and ``all_gather_count``.

    Raises:
        KeyError: ``result`` is not an ``fsdp_wrap.py`` result.
    """
    rows = []
    for entry in result["wraps"]:
        for rank, rec in sorted(entry["ranks"].items(), key=lambda kv: int(kv[0])):
            gathers = rec["all_gathers"]
            rows.append({"wrap": entry["wrap"], "rank": int(rank), "units": rec["units"],
                         "resident_param_bytes": rec["resident_param_bytes"],
                         "peak_gathered_param_bytes": rec["peak_gathered_param_bytes"],
                         "forward_peak_increase": rec["forward_peak_increase"],
                         "all_gather_count": sum(v["count"] for op, v in gathers.items() if "allgather" in op)})
    return rows


def plot_wrapping(rows: Sequence[Mapping[str, Any]], rank: int = 0, ax: Any = None) -> Any:
    """Grouped bars (MiB) per wrapping: resident shards, peak gathered params, forward peak increase.

    Args:
        rows: from :func:`wrap_rows`; rank: which rank to draw; ax: a matplotlib Axes (default: new figure).

    Returns:
        The matplotlib Figure.
    """
    import matplotlib.pyplot as plt

    mine = [r for r in rows if r["rank"] == rank]
    if ax is None:
        _, ax = plt.subplots(figsize=(1.9 * len(mine) + 2, 3.8))
    series = (("resident_param_bytes", "parameter shards (resident)", "#4C72B0"),
              ("peak_gathered_param_bytes", "gathered parameters at the peak (FSDP2)", "#DD8452"),
              ("forward_peak_increase", "forward peak increase (all tensors)", "#55A868"))
    width = 0.26
    for j, (key, label, color) in enumerate(series):
        xs = [i + (j - 1) * width for i in range(len(mine))]
        ax.bar(xs, [r[key] / MIB for r in mine], width, label=label, color=color, edgecolor="black", linewidth=0.4)
    ax.set_xticks(range(len(mine)))
    ax.set_xticklabels([f"{r['wrap']}\n{r['units']} unit(s)" for r in mine], fontsize=8)
    ax.set_ylabel("MiB on this rank")
    ax.set_title(f"D12: one FSDP unit vs one per block (rank {rank}, measured)")
    ax.legend(fontsize=7)
    ax.figure.tight_layout()
    return ax.figure


def collective_rows(result: Mapping[str, Any], rank: int = 0) -> list[dict[str, Any]]:
    """The collectives one training step issued on ``rank``, per strategy and op.

    Args:
        result: the JSON of ``fsdp_sharding.py``; rank: whose trace to read.

    Returns:
        Dicts with ``strategy``, ``mesh``, ``op`` (``all_gather``, ``reduce_scatter``,
        ``all_reduce``), ``count``, ``dtypes``, ``size_bytes`` (nccl-tests size, summed) and
        ``sent_bytes`` (bytes this rank sends under the ring algorithm, summed).

    Raises:
        KeyError: ``result`` is not an ``fsdp_sharding.py`` result, or has no such rank.
    """
    names = {"_allgather_base_": "all_gather", "allgather_": "all_gather",
             "_reduce_scatter_base_": "reduce_scatter", "allreduce_": "all_reduce"}
    rows = []
    for entry in result["strategies"]:
        rec = entry["ranks"][str(rank)] if str(rank) in entry["ranks"] else entry["ranks"][rank]
        for op, v in rec["collectives"].items():
            rows.append({"strategy": entry["strategy"], "mesh": tuple(entry["mesh"]), "op": names.get(op, op),
                         "count": v["count"], "dtypes": v["dtypes"], "size_bytes": v["size_bytes"],
                         "sent_bytes": v["sent_bytes"]})
    return rows


def format_collectives(rows: Sequence[Mapping[str, Any]]) -> str:
    """A fixed-width table of :func:`collective_rows` (MiB), one line per strategy and op."""
    lines = [f"{'strategy':<14}{'mesh':<8}{'op':<16}{'calls':>6}{'size MiB':>10}{'sent MiB':>10}  dtype"]
    for r in rows:
        size = "?" if r["size_bytes"] is None else f"{r['size_bytes'] / MIB:.2f}"
        sent = "?" if r["sent_bytes"] is None else f"{r['sent_bytes'] / MIB:.2f}"
        lines.append(f"{r['strategy']:<14}{'x'.join(map(str, r['mesh'])):<8}{r['op']:<16}{r['count']:>6}"
                     f"{size:>10}{sent:>10}  {','.join(r['dtypes'])}")
    return "\n".join(lines)
