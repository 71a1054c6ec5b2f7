"""The fuzz harness: what every reader must do with bad input, the mutations, and the readers as targets.

The promise of every ``runbook`` verb: whatever the input, it ends with exit status 0, 1 or 2, with a message on
stderr when it is 2, never a traceback, never a hang.  This module states that property once (:func:`run_cli`,
:func:`check_outcome`), makes inputs from the real samples of ``tests/data`` (:func:`mutate`, and
:func:`mutations` for hypothesis), and names each reader as a :class:`Target` (bytes in, one verb run).

Two users:

* the property tests of the unit layer (``tests/unit/test_fuzz_*.py``): hypothesis draws a few dozen mutated
  samples per reader, plus the reproducers of issue 30 as explicit examples (a small, fixed budget);
* the long campaign, ``benchmarks/fuzz_campaign.py``: random mutations for minutes, each target in a worker
  process that is killed when one input runs past its time limit (a hang inside C code cannot be interrupted
  from Python), failures kept with their input.

Adding a reader: write ``def _my_target(data: bytes, scratch: Path) -> Outcome`` that writes ``data`` where
the verb reads it and returns :func:`run_cli`'s outcome, and add a :class:`Target` to :data:`TARGETS` with seeds
(real files first).  Pure standard library (plus hypothesis in :func:`mutations`), so benchmarks can import it
as ``tests.fuzzing`` with the repository root on ``sys.path``.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import io
import json
import os
import pickle
import random
import signal
import sys
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data"

EXIT_STATUSES = (0, 1, 2)
"""What a verb may exit with (cli.py's module docstring): 0 OK, 1 a FAIL found, 2 bad input."""


class Hang(BaseException):
    """An input ran past its time limit (raised inside the reader by :func:`time_limit`).

    A ``BaseException``, so that a reader's own ``except Exception`` (a runner guard) cannot swallow it.
    """


class BrokenPromise(AssertionError):
    """A verb broke the promise on one input: an exception escaped, a wrong exit status, or exit 2 without a message."""


@contextlib.contextmanager
def time_limit(seconds: float) -> Iterator[None]:
    """Raise :class:`Hang` inside the block once ``seconds`` of wall time pass (SIGALRM; main thread, Unix only).

    Python code is interrupted between bytecodes; a loop inside C code (a regular expression, ``json``) is
    interrupted only when it returns: the campaign's worker process is the bound for those.
    """
    def alarm(signum: int, frame: Any) -> None:
        raise Hang(f"over the {seconds:g} s limit")

    old = signal.signal(signal.SIGALRM, alarm)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)


@dataclass
class Outcome:
    """One verb run: exit status, stdout and stderr."""

    rc: int
    out: str
    err: str


@functools.cache
def _parser() -> Any:
    """``runbook``'s parser, built once: building it (argparse, gettext look-ups) cost 70 % of a fuzzed doctor run."""
    from helpers.cli import build_parser

    return build_parser()


def run_cli(argv: Sequence[str], stdin: bytes = b"") -> Outcome:
    """Run ``runbook ARGV`` in this process with ``stdin`` as its standard input; capture its output.

    What :func:`helpers.cli.main` does (parse, then the command's handler), with the parser built once.
    ``SystemExit`` (argparse on a bad flag) gives its code; any other exception propagates: that is the bug.
    """
    def main(args: list[str]) -> int:
        ns = _parser().parse_args(args)
        return int(ns.func(ns))

    out, err = io.StringIO(), io.StringIO()
    fake_in = io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8")
    saved = sys.stdin
    sys.stdin = fake_in
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(list(argv))
            except SystemExit as exc:  # argparse: 2 and its message on stderr; exit(None) is 0
                rc = 0 if exc.code is None else exc.code if isinstance(exc.code, int) else 2
    finally:
        sys.stdin = saved
    return Outcome(rc, out.getvalue(), err.getvalue())


def check_outcome(outcome: Outcome, what: str = "") -> None:
    """The promise, on one run: exit 0, 1 or 2; on 2 a message on stderr; no traceback in the output.

    Raises:
        BrokenPromise: naming what was broken, with the end of stderr.
    """
    tail = outcome.err[-400:]
    if outcome.rc not in EXIT_STATUSES:
        raise BrokenPromise(f"{what}: exit status {outcome.rc!r}, not one of {EXIT_STATUSES}: {tail}")
    if outcome.rc == 2 and not outcome.err.strip():
        raise BrokenPromise(f"{what}: exit status 2 without a message on stderr")
    if "Traceback (most recent call last)" in outcome.out + outcome.err:
        raise BrokenPromise(f"{what}: a traceback in the output: {tail}")


# ------------------------------------------------------------------------------------------ mutations

TOKENS: tuple[bytes, ...] = (
    b"0", b"-1", b"1e400", b"NaN", b"Infinity", b"-Infinity", b"null", b"true", b"[]", b"{}", b"9" * 5000,
    b"\xef\xbb\xbf", b"\x00", b"\xff\xfe", b"\r\n", b"\r", b"\t", b"\\", b"'", b'"', b"[" * 600, b"{\"a\":" * 300,
    b"&a ", b"*a", b"- " * 300, b"$SLURM_NODEID", b"${MASTER_PORT}", b"--master-port=0", b"--nnodes=2:4",
    b"torchrun ", b"srun ", b"bash -c '", b"#SBATCH --nodes=", b"export A=", b"(", b")", b":", b" (x.py:1)",
    b'Thread 1 (idle): "MainThread"\n', b"\xe2\x80\xa8", b"\xd9\xa3", b"\xc0\x80", b"a" * 70000,
)
"""Bytes that break readers more often than random ones: numbers at the edges, nesting, encodings, shell."""


def mutate(data: bytes, rng: random.Random, pool: Sequence[bytes] = (), rounds: int | None = None) -> bytes:
    """``data`` changed by 1-4 random edits: flip, insert/delete/duplicate a run, a token, a splice from ``pool``.

    Deterministic for a given ``rng`` state; the result can be longer than ``data`` (tokens, duplication) but
    stays below ~8 MB.
    """
    out = bytearray(data)
    for _ in range(rounds if rounds is not None else rng.randint(1, 4)):
        at = rng.randint(0, len(out))
        kind = rng.randrange(9)
        if kind == 0 and out:  # flip bits of one byte
            i = rng.randrange(len(out))
            out[i] ^= 1 << rng.randrange(8)
        elif kind == 1:  # a random byte
            out[at:at] = bytes([rng.randrange(256)])
        elif kind == 2 and out:  # delete a run
            del out[at:at + rng.randint(1, 64)]
        elif kind == 3 and out:  # duplicate a run (lines, keys, entries)
            j = rng.randint(at, min(len(out), at + 256))
            out[at:at] = out[at:j] * rng.randint(1, 8)
        elif kind in (4, 5):  # an interesting token
            out[at:at] = rng.choice(TOKENS)
        elif kind == 6 and pool:  # a splice from another sample
            other = rng.choice(pool)
            if other:
                i = rng.randrange(len(other))
                out[at:at] = other[i:i + rng.randint(1, 512)]
        elif kind == 7 and out:  # truncate
            del out[at:]
        elif kind == 8 and out:  # replace a digit run by an edge number
            i = rng.randrange(len(out))
            if chr(out[i]).isdigit():
                j = i
                while j < len(out) and chr(out[j]).isdigit():
                    j += 1
                out[i:j] = rng.choice((b"0", b"-1", b"4294967296", b"9223372036854775808", b"99999999999999999999"))
        if len(out) > 8 * 2**20:
            del out[8 * 2**20:]
    return bytes(out)


def mutations(seeds: Sequence[bytes]) -> Any:
    """A hypothesis strategy: one of ``seeds``, mutated by :func:`mutate` with a drawn random state."""
    from hypothesis import strategies as st

    return st.builds(lambda seed, rng: mutate(seed, rng, seeds), st.sampled_from(list(seeds)), st.randoms(use_true_random=False))


# ------------------------------------------------------------------------------------------ targets

@dataclass
class Target:
    """One reader: its name, its seed inputs (real files of tests/data first) and how one input runs it."""

    name: str
    seeds: Callable[[], list[bytes]]
    run: Callable[[bytes, Path], Outcome]
    owner: str = ""
    extra: dict[str, Any] = field(default_factory=dict)


def _files(*patterns: str) -> list[bytes]:
    return [p.read_bytes() for pattern in patterns for p in sorted(ROOT.glob(pattern)) if p.is_file()]


def _fr_json(path: Path) -> bytes:
    from helpers import flight_recorder as fr

    return json.dumps(fr.load_dump(path), default=list).encode()


def _fr_seeds() -> list[bytes]:
    real = sorted((DATA / "fr").glob("*/rank[0-9]"))
    return [p.read_bytes() for p in real] + [_fr_json(p) for p in real[:3]] + [
        pickle.dumps({"version": "2.10", "pg_config": {"0": {"desc": "default_pg", "ranks": "[0, 1]"}}, "entries": [
            {"collective_seq_id": s, "profiling_name": "gloo:all_reduce", "process_group": ("0", "default_pg"),
             "input_sizes": [[256]], "state": "scheduled", "is_p2p": False,
             "frames": [{"name": "train", "filename": "/w/train.py", "line": 10 + s}], "time_created_ns": 10**18 + s}
            for s in (1, 2, 3)]}, protocol=2)]


def _doctor_fr(data: bytes, scratch: Path) -> Outcome:
    """``runbook doctor --fr-dir``: the input is rank 1's dump, next to a real rank 0."""
    folder = scratch / "fr"
    folder.mkdir(exist_ok=True)
    (folder / "rank0").write_bytes((DATA / "fr" / "mismatch" / "rank0").read_bytes())
    (folder / "rank1").write_bytes(data)
    return run_cli(["doctor", "--fr-dir", str(folder)])


def _stack_seeds() -> list[bytes]:
    return _files("tests/data/stacks/*.txt", "tests/data/fr/*/stack*.txt")


def _job_dir(scratch: Path, stack1: bytes, trace1: bytes | None) -> Path:
    job = scratch / "job"
    for sub in ("stacks", "ranks", "trace"):
        (job / sub).mkdir(parents=True, exist_ok=True)
    stack0 = (DATA / "fr" / "rank0_save" / "stack0.txt").read_bytes()
    (job / "stacks" / "rank0.txt").write_bytes(stack0)
    (job / "stacks" / "rank1.txt").write_bytes(stack1)
    for r in (0, 1):
        (job / "ranks" / f"rank{r}.json").write_text(json.dumps({"rank": r}))
    if trace1 is not None:
        (job / "trace" / "rank0.jsonl").write_bytes(_TRACE)
        (job / "trace" / "rank1.jsonl").write_bytes(trace1)
    return job


_TRACE = (b'{"seq":1,"op":"all_reduce","phase":"enter","site":"train.py:10","t":1.0,"shape":[4],"dtype":"float32"}\n'
          b'{"seq":1,"op":"all_reduce","phase":"exit","t":1.1}\n'
          b'{"seq":2,"op":"barrier","phase":"enter","site":"train.py:12","t":1.2}\n')


def _doctor_stacks(data: bytes, scratch: Path) -> Outcome:
    """``runbook doctor --job-dir``: the input is rank 1's saved py-spy stack."""
    return run_cli(["doctor", "--job-dir", str(_job_dir(scratch, data, None))])


def _doctor_trace(data: bytes, scratch: Path) -> Outcome:
    """``runbook doctor --job-dir``: the input is rank 1's collective trace (rank 1's stack is a real one)."""
    stack1 = (DATA / "fr" / "rank0_save" / "stack1.txt").read_bytes()
    return run_cli(["doctor", "--job-dir", str(_job_dir(scratch, stack1, data))])


def _rendered() -> list[bytes]:
    """What ``runbook build`` writes for each launcher on two nodes (the forms --check must read back)."""
    from helpers import launch_traps

    out = []
    for kind in launch_traps.KINDS:
        spec = launch_traps.LaunchSpec(kind=kind, nnodes=2, nproc_per_node=4, master_addr="n0", master_port=29511,
                                       node_rank=0, env={"NCCL_DEBUG": "INFO"}, script="train.py", script_args=("--lr", "0.1"))
        try:
            out.append(launch_traps.render(spec).encode())
        except ValueError:
            continue
    return out


def _launch_seeds() -> list[bytes]:
    return _files("configs/**/*.sbatch", "configs/**/*.sh", "tests/data/lint/*/*.sh") + _rendered() + [
        b"torchrun --nnodes=2 --nproc-per-node=8 --rdzv-backend=c10d --rdzv-endpoint=n0:29500 train.py --lr 0.1\n",
        b"export NCCL_DEBUG=INFO\nsrun --nodes=2 --ntasks-per-node=1 bash -c 'torchrun --node-rank=$SLURM_NODEID "
        b"--nnodes=2 --master-addr=n0 --master-port=29500 train.py'\n",
        b"accelerate launch --num-processes 8 --num-machines 2 --machine-rank 0 --main-process-ip n0 train.py\n",
        b"deepspeed --num-gpus 8 --num-nodes 2 --hostfile hosts train.py --deepspeed ds.json\n",
        b"python -m torch.distributed.run --standalone --nproc-per-node=2 train.py\n",
    ]


def _build_check_file(data: bytes, scratch: Path) -> Outcome:
    """``runbook build --check-file``: the input is the launch script."""
    path = scratch / "job.sbatch"
    path.write_bytes(data)
    return run_cli(["build", "--check-file", str(path)])


def _build_check(data: bytes, scratch: Path) -> Outcome:
    """``runbook build --check TEXT``: the input, decoded leniently, is the pasted command (no NUL in argv)."""
    text = data.decode("utf-8", "replace").replace("\x00", "")
    return run_cli(["build", "--check", text])


def _inventory_seed() -> bytes:
    addr = [{"ifindex": 1, "ifname": "lo", "flags": ["LOOPBACK", "UP", "LOWER_UP"], "mtu": 65536, "operstate": "UNKNOWN",
             "link_type": "loopback", "addr_info": [{"family": "inet", "local": "127.0.0.1", "prefixlen": 8}]},
            {"ifindex": 2, "ifname": "eth0", "flags": ["BROADCAST", "MULTICAST", "UP", "LOWER_UP"], "mtu": 1500,
             "operstate": "UP", "link_type": "ether", "linkinfo": {"info_kind": "veth"},
             "addr_info": [{"family": "inet", "local": "10.0.0.1", "prefixlen": 24}]}]
    route = [{"dst": "10.0.0.1", "dev": "eth0", "prefsrc": "10.0.0.1"}]
    return ("@@hostname\nnode0\n@@addr\n" + json.dumps(addr) + "\n@@master\n10.0.0.1\n@@self\n10.0.0.1\n@@route\n"
            + json.dumps(route) + "\n@@listen\n@@ss ok\n@@ping\n/usr/bin/ping\n@@python\n/usr/bin/python3\n@@end\n").encode()


def _preflight(data: bytes, scratch: Path) -> Outcome:
    """``helpers.preflight.run_preflight`` on two nodes whose runner answers ``data`` (inventory) on node 1."""
    import subprocess

    from helpers import preflight

    good = _inventory_seed().decode()
    text = data.decode("utf-8", "replace")

    def runner(node: str, argv: Sequence[str], timeout_s: float) -> subprocess.CompletedProcess[str]:
        if "@@hostname" in " ".join(argv):
            return subprocess.CompletedProcess(list(argv), 0, good if node == "n0" else text, "")
        return subprocess.CompletedProcess(list(argv), 0, "@@ping mtu0 0 ok\n@@ping small0 0 ok\n", "")

    try:
        checks = preflight.run_preflight(["n0", "n1"], runner, {"NCCL_SOCKET_IFNAME": "eth0"}, timeout_s=1)
    except ValueError as exc:
        return Outcome(2, "", str(exc))
    preflight.format_checks(checks)
    return Outcome(1 if any(c.status == "FAIL" for c in checks) else 0, "", "")


def _nccl_log(data: bytes, scratch: Path) -> Outcome:
    """``runbook nccl-log`` on the input as a file and a real log next to it (the other file must still be read)."""
    path = scratch / "x.log"
    path.write_bytes(data)
    return run_cli(["nccl-log", str(path), str(DATA / "nccl" / "connect_no_route.log")])


def _nccl_log_stdin(data: bytes, scratch: Path) -> Outcome:
    """``runbook nccl-log -`` with the input on stdin."""
    return run_cli(["nccl-log", "-"], stdin=data)


def _lint(suffix: str) -> Callable[[bytes, Path], Outcome]:
    def run(data: bytes, scratch: Path) -> Outcome:
        path = scratch / f"input{suffix}"
        path.write_bytes(data)
        return run_cli(["lint", str(path)])

    run.__doc__ = f"``runbook lint`` on the input as a ``{suffix}`` file."
    return run


def _estimate_memory(data: bytes, scratch: Path) -> Outcome:
    """``runbook estimate-memory``: the input's first three words are --params, --world-size and --strategy."""
    words = (data.decode("utf-8", "replace").replace("\x00", "").split() + ["1.3B", "8", "zero2"])[:3]
    return run_cli(["estimate-memory", "--params", words[0], "--world-size", words[1], "--strategy", words[2]])


TARGETS: dict[str, Target] = {t.name: t for t in (
    Target("doctor-fr", _fr_seeds, _doctor_fr, "fuzz"),
    Target("doctor-stacks", _stack_seeds, _doctor_stacks, "fuzz"),
    Target("doctor-trace", lambda: [_TRACE, _TRACE + b'{"seq":3,"op":"all_re'], _doctor_trace, "fuzz"),
    Target("build-check-file", _launch_seeds, _build_check_file, "fuzz"),
    Target("build-check", _launch_seeds, _build_check, "fuzz"),
    Target("preflight-inventory", lambda: [_inventory_seed()], _preflight, "fuzz"),
    # the readers of other verbs (issue 30), for their owners' tests and the campaign
    Target("nccl-log", lambda: _files("tests/data/nccl/*.log"), _nccl_log, "nccl_log"),
    Target("nccl-log-stdin", lambda: _files("tests/data/nccl/*.log")[:8], _nccl_log_stdin, "nccl_log"),
    Target("lint-py", lambda: _files("tests/data/lint/*/*.py"), _lint(".py"), "lint"),
    Target("lint-json", lambda: _files("tests/data/lint/*/*.json", "configs/*.json"), _lint(".json"), "lint"),
    Target("lint-yaml", lambda: _files("tests/data/lint/*/*.yaml", "configs/*.yaml"), _lint(".yaml"), "lint"),
    Target("lint-sh", _launch_seeds, _lint(".sh"), "lint"),
    Target("estimate-memory", lambda: [b"1.3e9 8 zero2", b"350M 64 fsdp_full_shard", b"7B 16 all", b"1300000000 2 ddp"],
           _estimate_memory, "memory"),
)}
"""The readers this harness drives, by name."""


def add_target(target: Target) -> None:
    """Register another reader (other verbs' tests and the campaign add theirs here)."""
    TARGETS[target.name] = target


def signature(exc: BaseException) -> str:
    """What makes two failures the same bug: the exception type and the innermost frame inside ``helpers/``."""
    frames = [f for f in traceback.extract_tb(exc.__traceback__) if f"{os.sep}helpers{os.sep}" in f.filename]
    where = f"{Path(frames[-1].filename).name}:{frames[-1].lineno}" if frames else "?"
    return f"{type(exc).__name__} at {where}"


def try_one(target: Target, data: bytes, scratch: Path, limit_s: float) -> BaseException | None:
    """Run ``target`` on ``data`` under :func:`time_limit`; return the broken promise (an exception), or None."""
    try:
        with time_limit(limit_s):
            check_outcome(target.run(data, scratch), target.name)
    except (Exception, Hang) as exc:  # noqa: BLE001 - every escape is a finding
        return exc
    return None


def encode_input(data: bytes) -> str:
    """``data`` as base64 text, for a failure record."""
    return base64.b64encode(data).decode()
