"""The long fuzz campaign of issue 30: mutated real samples into every reader, for minutes; inputs tried, failures found.

Run (from the repository root, with the repository on ``PYTHONPATH``)::

    python benchmarks/fuzz_campaign.py --minutes 30 --workers 2            # every reader of tests/fuzzing.py
    python benchmarks/fuzz_campaign.py --minutes 5 --targets doctor-fr,build-check-file

Each worker is a process of its own that runs the targets in turn (:data:`tests.fuzzing.TARGETS`: bytes in, one
``runbook`` verb run in-process, the promise checked: exit 0/1/2, a message with 2, no traceback).  An input that
runs past ``--limit-s`` is interrupted (SIGALRM) and counted as a hang; a worker that stops answering (a loop
inside C code) is killed by the parent, which records the input it was on and starts a new worker.  Memory is
bounded per worker (``--memory-gb``, ``RLIMIT_AS``), so a blow-up is a ``MemoryError`` finding, not a stalled
machine.  Failures are told apart by :func:`tests.fuzzing.signature` (exception type and innermost ``helpers/``
frame); each new one is written, with its input, to ``--out`` (default ``build/fuzz/``).

Prints a table per target (inputs tried, inputs/s, distinct failures) and the totals, and writes
``<out>/summary.json``; SIGINT or SIGTERM stops it early with the same summary.  Exit status 0 when no failure was found, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import resource
import shutil
import signal
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _worker(index: int, names: list[str], seed: int, limit_s: float, memory_gb: float, out: str,
            counts: dict, beat: object, queue: object) -> None:
    """Fuzz ``names`` in turn until killed; report failures on ``queue``; count inputs in ``counts``."""
    from tests import fuzzing

    if memory_gb > 0:
        cap = int(memory_gb * 2**30)
        resource.setrlimit(resource.RLIMIT_AS, (cap, cap))
    os.environ.setdefault("TMPDIR", tempfile.gettempdir())
    rng = random.Random(seed)
    targets = [fuzzing.TARGETS[n] for n in names]
    seeds = {t.name: t.seeds() for t in targets}
    current = Path(out) / f"current-{index}"
    scratch_root = Path(tempfile.mkdtemp(prefix=f"fuzz-{index}-"))
    seen: set[str] = set()
    for t in targets:  # warm up: first imports (DeepSpeed's alone takes > 20 s on a loaded machine) are no hang
        (scratch_root / "warm").mkdir(exist_ok=True)
        fuzzing.try_one(t, seeds[t.name][0], scratch_root / "warm", 600.0)
    try:
        while True:
            for t in targets:
                pool = seeds[t.name]
                data = fuzzing.mutate(rng.choice(pool), rng, pool)
                current.write_bytes(t.name.encode() + b"\n" + data)
                scratch = scratch_root / "s"
                shutil.rmtree(scratch, ignore_errors=True)
                scratch.mkdir()
                exc = fuzzing.try_one(t, data, scratch, limit_s)
                key = f"{index}:{t.name}"  # one counter per worker: no lost updates between workers
                counts[key] = counts.get(key, 0) + 1
                beat.value = time.time()  # type: ignore[attr-defined]
                if exc is not None:
                    sig = f"{t.name}: {fuzzing.signature(exc)}"
                    if sig not in seen:
                        seen.add(sig)
                        queue.put((t.name, sig, str(exc)[:500], fuzzing.encode_input(data)))  # type: ignore[attr-defined]
    finally:
        shutil.rmtree(scratch_root, ignore_errors=True)


INSTRUMENTED = ("helpers.inputs", "helpers.flight_recorder", "helpers.doctor", "helpers.collective_trace",
                "helpers.launch_parse", "helpers.launch_traps", "helpers.hostinfo", "helpers.preflight", "helpers.cli",
                "helpers.nccl_log", "helpers.lint", "helpers.memory")
"""Modules atheris instruments for coverage (the readers and what they call)."""


def _atheris_child(name: str, seconds: float, limit_s: float, memory_gb: float, out: Path) -> int:
    """One target under atheris (libFuzzer, coverage-guided) for ``seconds``; libFuzzer exits the process."""
    import atheris

    from tests import fuzzing

    with atheris.instrument_imports(include=list(INSTRUMENTED)):
        for module in INSTRUMENTED:
            __import__(module)
    target = fuzzing.TARGETS[name]
    corpus = out / "corpus" / name
    corpus.mkdir(parents=True, exist_ok=True)
    for i, seed in enumerate(target.seeds()):
        (corpus / f"seed-{i}").write_bytes(seed)
    scratch = Path(tempfile.mkdtemp(prefix=f"atheris-{name}-"))
    fuzzing.try_one(target, target.seeds()[0], scratch, 600.0)  # warm up: first imports are no hang

    def one(data: bytes) -> None:
        for child in scratch.iterdir():
            shutil.rmtree(child) if child.is_dir() and not child.is_symlink() else child.unlink()
        exc = fuzzing.try_one(target, data, scratch, limit_s)
        if exc is not None:
            raise exc  # libFuzzer writes the input to <out>/crash-<sha1> and stops

    (out / "artifacts").mkdir(exist_ok=True)
    atheris.Setup([sys.argv[0], f"-max_total_time={int(seconds)}", f"-timeout={int(limit_s * 3)}",
                   f"-rss_limit_mb={int(memory_gb * 1024) or 0}", f"-artifact_prefix={out / 'artifacts'}/",
                   "-print_final_stats=1", str(corpus)], one)
    atheris.Fuzz()
    return 0


def _atheris(names: list[str], minutes: float, args: argparse.Namespace, out: Path) -> int:
    """Run each target under atheris in a child process for its share of ``minutes``; print runs and crashes."""
    import re
    import subprocess

    share = max(10.0, minutes * 60 / len(names))
    rows, failures = [], 0
    for name in names:
        log = out / f"atheris-{name}.log"
        t0 = time.time()
        with open(log, "w") as fh:
            rc = subprocess.run([sys.executable, __file__, "--atheris-child", name, "--limit-s", str(args.limit_s),
                                 "--memory-gb", str(args.memory_gb), "--out", str(out), "--minutes", str(share / 60)],
                                stdout=fh, stderr=subprocess.STDOUT, timeout=share + 120).returncode
        text = log.read_text(errors="replace")
        runs = re.findall(r"stat::number_of_executed_units: (\d+)", text) or re.findall(r"Done (\d+) runs", text)
        cov = re.findall(r"cov: (\d+)", text)
        crashed = rc != 0
        failures += crashed
        rows.append((name, int(runs[-1]) if runs else 0, time.time() - t0, cov[-1] if cov else "?", crashed))
        if crashed:
            print(f"  CRASH {name} (exit {rc}): see {log}", flush=True)
    print(f"\n{'target (atheris)':<22}{'runs':>10}{'per s':>9}{'cov':>7}  crash")
    for name, runs, wall, cov, crashed in rows:
        print(f"{name:<22}{runs:>10,}{runs / wall:>9.1f}{cov:>7}  {'YES' if crashed else 'no'}")
    total = sum(r[1] for r in rows)
    print(f"{'total':<22}{total:>10,}; {failures} target(s) crashed; logs and artifacts in {out}")
    (out / "summary-atheris.json").write_text(json.dumps({"runs": {r[0]: r[1] for r in rows}, "crashed": [r[0] for r in rows if r[4]],
                                                          "wall_s": round(sum(r[2] for r in rows), 1)}, indent=1))
    return 1 if failures else 0


def main(argv: list[str] | None = None) -> int:
    """Run the campaign; print the table; return 0 when nothing failed, else 1."""
    from tests import fuzzing

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=5.0, help="wall time of the campaign (default 5)")
    p.add_argument("--workers", type=int, default=max(1, min(2, os.cpu_count() or 1)), help="worker processes")
    p.add_argument("--targets", default="", help=f"comma-separated, default all: {', '.join(fuzzing.TARGETS)}")
    p.add_argument("--owner", default="", help="only the targets of this owner tag (fuzz, lint, nccl_log, memory)")
    p.add_argument("--limit-s", type=float, default=10.0, help="time limit of one input (a hang past it)")
    p.add_argument("--memory-gb", type=float, default=3.0, help="address-space limit per worker, GiB (0: none)")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: from the clock; printed)")
    p.add_argument("--out", default=str(ROOT / "build" / "fuzz"), help="where failures and summary.json go")
    p.add_argument("--engine", choices=("random", "atheris"), default="random",
                   help="random: the mutations of tests/fuzzing.py in workers (default); atheris: libFuzzer's "
                   "coverage-guided search, one target at a time (needs atheris importable, e.g. "
                   "pip install --target build/atheris atheris, then PYTHONPATH=.:build/atheris)")
    p.add_argument("--atheris-child", default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.atheris_child:
        return _atheris_child(args.atheris_child, args.minutes * 60, args.limit_s, args.memory_gb, Path(args.out))
    names = [n for n in (args.targets.split(",") if args.targets else fuzzing.TARGETS) if n]
    if args.owner:
        names = [n for n in names if fuzzing.TARGETS[n].owner == args.owner]
    unknown = [n for n in names if n not in fuzzing.TARGETS]
    if unknown or not names:
        print(f"--targets: unknown {unknown or 'none selected'}; known: {', '.join(fuzzing.TARGETS)}", file=sys.stderr)
        return 2
    seed = args.seed if args.seed is not None else int(time.time())
    out = Path(args.out)
    (out / "failures").mkdir(parents=True, exist_ok=True)
    if args.engine == "atheris":
        return _atheris(names, args.minutes, args, out)
    ctx = mp.get_context("fork")
    manager = ctx.Manager()
    counts = manager.dict()
    queue = ctx.Queue()
    failures: dict[str, dict] = {}
    cpu0 = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.time()
    deadline = t0 + args.minutes * 60
    stall = args.limit_s * 3 + 10
    workers: list[list] = []

    def start(i: int, n: int) -> list:
        beat = ctx.Value("d", time.time())
        proc = ctx.Process(target=_worker, args=(i, names, seed * 1000 + i * 100 + n, args.limit_s, args.memory_gb,
                                                 str(out), counts, beat, queue), daemon=True)
        proc.start()
        return [proc, beat, n]

    def record(name: str, sig: str, message: str, b64: str) -> None:
        if sig in failures:
            return
        failures[sig] = {"target": name, "signature": sig, "message": message, "input_base64": b64}
        safe = "".join(c if c.isalnum() else "_" for c in sig)[:120]
        (out / "failures" / f"{safe}.json").write_text(json.dumps(failures[sig], indent=1))
        print(f"  NEW {sig}: {message[:200]}", flush=True)

    print(f"fuzz campaign: {len(names)} target(s), {args.workers} worker(s), {args.minutes:g} min, seed {seed}", flush=True)
    for i in range(args.workers):
        workers.append(start(i, 0))
    signal.signal(signal.SIGTERM, lambda *_: (_ for _ in ()).throw(KeyboardInterrupt()))  # kill PID: stop, summarise
    try:
        while time.time() < deadline:
            time.sleep(0.5)
            while not queue.empty():
                record(*queue.get())
            for i, w in enumerate(workers):
                proc, beat, n = w
                if not proc.is_alive() or time.time() - beat.value > stall:
                    proc.kill()
                    proc.join()
                    cur = out / f"current-{i}"
                    name, _, data = cur.read_bytes().partition(b"\n") if cur.exists() else (b"?", b"", b"")
                    why = "died" if proc.exitcode not in (None, -9) else f"stalled over {stall:g} s (killed)"
                    record(name.decode(), f"{name.decode()}: worker {why}", f"exit code {proc.exitcode}",
                           fuzzing.encode_input(data))
                    workers[i] = start(i, n + 1)
    except KeyboardInterrupt:
        print("stopped early (SIGINT/SIGTERM): the figures below cover the time run", flush=True)
    finally:
        for proc, _, _ in workers:
            proc.kill()
            proc.join()
        while not queue.empty():
            record(*queue.get())
        for i in range(args.workers):
            (out / f"current-{i}").unlink(missing_ok=True)
    wall = time.time() - t0
    cpu1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (cpu1.ru_utime - cpu0.ru_utime) + (cpu1.ru_stime - cpu0.ru_stime)
    tried: dict[str, int] = {}
    for key, k in dict(counts).items():
        name = key.split(":", 1)[1]
        tried[name] = tried.get(name, 0) + k
    manager.shutdown()
    total = sum(tried.values())
    print(f"\n{'target':<22}{'inputs':>10}{'per s':>9}{'failures':>10}")
    for n in names:
        k = tried.get(n, 0)
        f = sum(1 for v in failures.values() if v["target"] == n)
        print(f"{n:<22}{k:>10,}{k / wall:>9.1f}{f:>10}")
    print(f"{'total':<22}{total:>10,}{total / wall:>9.1f}{len(failures):>10}")
    print(f"wall {wall / 60:.1f} min, worker CPU {cpu / 60:.1f} min, seed {seed}; failures in {out / 'failures'}")
    summary = {"seed": seed, "wall_s": round(wall, 1), "cpu_s": round(cpu, 1), "workers": args.workers,
               "inputs": tried, "total_inputs": total, "failures": list(failures.values())}
    (out / "summary.json").write_text(json.dumps(summary, indent=1))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
