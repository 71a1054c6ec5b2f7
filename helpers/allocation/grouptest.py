"""The localisation across nodes with real jobs: one SLURM step of group-test workers, one round per oracle call.

:func:`run_localisation` is the ``localise`` step of :func:`helpers.allocation.across.run_allocation`:

1. one step over every node (``srun -N<n> --ntasks-per-node=1``, no ``--kill-on-bad-exit``: a worker that dies
   must not take the others with it), each task ``helpers/scenarios/group_test.py``: torch imported once per node;
2. the floor below which a group is slow: the envelope of :func:`helpers.allocation.grades.inter_envelope` (NIC
   line rate, and on CPU the host's memory copy, from each worker's hello) times its floor fraction;
3. :func:`helpers.allocation.localise.localise` with :class:`RoundOracle` as the oracle: each call writes one round
   of disjoint groups, waits for every member's result and grades each group
   (:func:`helpers.allocation.grades.grade_group`);
4. ``stop``, the step stopped and cancelled by its tag whatever happened; the records of
   :func:`helpers.allocation.grades.grade_localisation`.
"""

from __future__ import annotations

import json
import random
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from helpers import jobs
from helpers.allocation.grades import grade_group, grade_localisation, inter_envelope
from helpers.allocation.localise import Localisation, Outcome, localise
from helpers.checks import Check
from helpers.procs import stop_session
from helpers.slurm import SlurmClient

BASE_PORT = 29650
"""Each round's groups use ``base + round``, ``base`` drawn per run from ``BASE_PORT + 100 * k`` (k < 20): every group's
first node hosts its own store there, and a run right after another never meets the last one's sockets."""
GROUP_BYTES = 2 << 20
"""Buffer of each group test (2 MiB): large enough to cross any MTU and show a rate limit, small enough for 2 cores."""


def _read(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


class RoundOracle:
    """The oracle of :func:`helpers.allocation.localise.localise` over the running workers (files in ``out_dir``).

    Args:
        out_dir: the workers' shared folder.
        floor_gbps: busbw below which a group is slow (None: only errors fail).
        timeout_s: collective timeout of each test, seconds; a round waits at most ``timeout_s + 10``.
        size: bytes of each test.
    """

    def __init__(self, out_dir: Path, floor_gbps: float | None, *, timeout_s: float = 8.0, size: int = GROUP_BYTES) -> None:
        self.out_dir, self.floor, self.timeout_s, self.size = Path(out_dir), floor_gbps, timeout_s, size
        self.round = 0
        self.base = BASE_PORT + 100 * random.randrange(20)
        self.wall: list[float] = []

    def __call__(self, groups: Sequence[tuple[str, ...]]) -> list[Outcome]:
        """Write the round, wait for every member's result (or the deadline), grade each group."""
        self.round += 1
        t0 = time.monotonic()
        plan = {"groups": [list(g) for g in groups], "port": self.base + self.round, "bytes": self.size,
                "timeout_s": self.timeout_s}
        rdir = self.out_dir / "rounds" / str(self.round)
        rdir.mkdir(parents=True, exist_ok=True)
        tmp = self.out_dir / "rounds" / f".{self.round}.json"
        tmp.write_text(json.dumps(plan))
        tmp.replace(self.out_dir / "rounds" / f"{self.round}.json")
        members = [n for g in groups for n in g]
        deadline = t0 + self.timeout_s + 10
        while time.monotonic() < deadline and not all((rdir / f"{n}.json").exists() for n in members):
            time.sleep(0.05)
        self.wall.append(round(time.monotonic() - t0, 2))
        outcomes = []
        for g in groups:
            failed, value, detail = grade_group({n: _read(rdir / f"{n}.json") for n in g}, self.floor)
            outcomes.append(Outcome(failed, value, detail))
        return outcomes


def run_localisation(client: SlurmClient, tag: str, nodes: Sequence[str], out_dir: Path, *, backend: str = "gloo",
                     timeout_s: float = 8.0, start_timeout_s: float = 90.0, size: int = GROUP_BYTES,
                     log: Callable[[str], None] = print) -> tuple[list[Check], dict[str, Any]]:
    """Localise the faulty nodes and links of ``nodes`` with real group tests (see the module docstring).

    Returns:
        ``(checks, evidence)``: :func:`helpers.allocation.grades.grade_localisation`'s records (a WARN
        ``localise.start`` naming no node when the workers did not start), and ``{"localisation": to_dict(),
        "floor_GBps", "envelope", "hello", "round_wall_s", "start_s", "wall_s", "log"}``.
    """
    out_dir = Path(out_dir).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    log_path = out_dir / "workers.log"
    script = jobs.scenario("group_test.py")
    inner = shlex.join([sys.executable, str(script), "--out-dir", str(out_dir), "--backend", backend])
    step = [a for a in client.step_argv(nodes, tag) if a != "--kill-on-bad-exit=1"]  # one dead worker must not end the rest
    t0 = time.monotonic()
    proc = client.popen([*step, "bash", "-c", f"exec {inner}"], log_path)  # through bash: the node's profile applies
    ev: dict[str, Any] = {"log": str(log_path)}
    try:
        hello: dict[str, dict[str, Any]] = {}
        while time.monotonic() - t0 < start_timeout_s and len(hello) < len(nodes) and proc.poll() is None:
            hello = {n: h for n in nodes if (h := _read(out_dir / "hello" / f"{n}.json"))}
            time.sleep(0.2)
        ev.update(hello=hello, start_s=round(time.monotonic() - t0, 1))
        if not hello:
            tail = [ln for ln in log_path.read_text(errors="replace").splitlines() if ln.strip()][-3:] if log_path.exists() else []
            rec = Check("localise.start", f"the group-test workers did not start within {start_timeout_s:g} s "
                        f"({' | '.join(tail) or 'no output'})", "WARN", {"cause": "tool_error", "log": str(log_path)},
                        f"read {log_path}; run the step by hand: srun -N{len(nodes)} python {script} --out-dir DIR",
                        "")
            return [rec], ev
        envelope, fraction, what = inter_envelope(hello, cpu=backend != "nccl")
        floor = round(envelope * fraction, 6) if envelope else None
        ev.update(floor_GBps=floor, envelope={"GBps": envelope, "fraction": fraction, "what": what})
        oracle = RoundOracle(out_dir, floor, timeout_s=timeout_s, size=size)
        result: Localisation = localise(list(nodes), oracle)
        ev.update(localisation=result.to_dict(), round_wall_s=oracle.wall)
        log(f"localisation over {len(nodes)} nodes: {result.verdict}, {result.test_count} tests in {result.rounds} rounds "
            f"({sum(oracle.wall):.1f} s); nodes {result.nodes or 'none'}, links {result.links or 'none'}")
        return grade_localisation(result.to_dict(), floor), ev
    finally:
        (out_dir / "stop").write_text("stop\n")
        deadline = time.monotonic() + 10
        while proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if proc.poll() is None:
            stop_session(proc)
        proc.wait()
        ev["wall_s"] = round(time.monotonic() - t0, 1)
