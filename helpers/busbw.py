"""Bandwidth arithmetic with the nccl-tests definitions.

Source: https://github.com/NVIDIA/nccl-tests/blob/master/doc/PERFORMANCE.md

* ``algbw = S / t``: bytes of the operation over its time.  ``S`` is the buffer size nccl-tests
  prints: the full vector for all_reduce and broadcast, the gathered output for
  all_gather, the full input for reduce_scatter.
* ``busbw = algbw * factor``: the rate each link must carry, comparable to the hardware's
  peak whatever the rank count ``n``: all_reduce ``2(n-1)/n``; all_gather and
  reduce_scatter ``(n-1)/n``; broadcast and reduce ``1``; all_to_all ``(n-1)/n`` on the buffer of one rank
  (nccl-tests ``src/alltoall.cu``, ``AlltoAllGetBw``).

Units: bytes, seconds, GB/s = 1e9 B/s (as nccl-tests).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all")


def bus_factor(op: str, n: int) -> float:
    """The nccl-tests busbw factor of collective ``op`` on ``n`` ranks.

    Raises:
        ValueError: unknown ``op`` (names the accepted ones) or ``n`` < 1.
    """
    if op not in OPS:
        raise ValueError(f"op={op!r}: accepted values are {', '.join(OPS)}")
    if n < 1:
        raise ValueError(f"n={n!r}: the rank count must be >= 1")
    if op == "all_reduce":
        return 2.0 * (n - 1) / n
    if op in ("all_gather", "reduce_scatter", "all_to_all"):
        return (n - 1) / n
    return 1.0


def algbw_gbps(size_bytes: float, time_s: float) -> float:
    """Algorithm bandwidth in GB/s (1e9 B/s) of ``size_bytes`` moved in ``time_s`` seconds.

    Raises:
        ValueError: ``time_s`` <= 0 or ``size_bytes`` < 0.
    """
    if time_s <= 0:
        raise ValueError(f"time_s={time_s!r}: must be > 0 seconds")
    if size_bytes < 0:
        raise ValueError(f"size_bytes={size_bytes!r}: must be >= 0")
    return size_bytes / time_s / 1e9


def busbw_gbps(op: str, n: int, size_bytes: float, time_s: float) -> float:
    """Bus bandwidth in GB/s: :func:`algbw_gbps` times :func:`bus_factor`."""
    return algbw_gbps(size_bytes, time_s) * bus_factor(op, n)


def annotate(rows: Sequence[dict], n: int) -> list[dict]:
    """Add ``algbw_GBps`` and ``busbw_GBps`` to sweep rows ``{"op", "bytes", "time_s", ...}``."""
    return [dict(r, algbw_GBps=algbw_gbps(r["bytes"], r["time_s"]),
                 busbw_GBps=busbw_gbps(r["op"], n, r["bytes"], r["time_s"])) for r in rows]


def plateau(sizes: Sequence[float], busbw: Sequence[float], *, fraction: float = 0.25, min_points: int = 3) -> dict:
    """The bandwidth a collective settles at for large messages.

    nccl-tests prints an "Avg bus bandwidth" averaged over *every* size, so small,
    latency-bound sizes drag it down and its value depends on the chosen size range.
    The plateau is the median busbw over the largest ``fraction`` of sizes (at least
    ``min_points``), where the curve is flat; the median resists one noisy point.  Also
    returned: the peak, and the smallest size reaching half the plateau (where the
    bandwidth-bound regime starts).

    Args:
        sizes: message sizes in bytes; busbw: GB/s at each size (same length).

    Returns:
        ``{"plateau_GBps", "peak_GBps", "points", "from_bytes", "half_plateau_bytes"}``.

    Raises:
        ValueError: empty or mismatched inputs, or ``fraction`` outside (0, 1].
    """
    if not sizes or len(sizes) != len(busbw):
        raise ValueError("sizes/busbw: need the same, non-zero number of points")
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction={fraction!r}: must be in (0, 1]")
    pairs = sorted(zip(sizes, busbw))
    k = min(len(pairs), max(min_points, round(len(pairs) * fraction)))
    top = pairs[-k:]
    value = statistics.median(b for _, b in top)
    half = next((s for s, b in pairs if b >= value / 2), pairs[-1][0])
    return {"plateau_GBps": value, "peak_GBps": max(b for _, b in pairs), "points": k,
            "from_bytes": top[0][0], "half_plateau_bytes": half}
