"""Per-rank wrapper the job runner puts between a launcher and the user's script.

Usage (what the runner generates; you do not call this by hand)::

    torchrun --nproc-per-node 2 helpers/rankshim.py train.py --lr 1e-3
    deepspeed --num_gpus 2 helpers/rankshim.py train.py --deepspeed_config ds.json

Each launcher (torchrun, ``accelerate launch``, ``deepspeed``, ``srun``, plain
``python``) starts one shim per rank.  The shim starts the real rank as its child
with the same interpreter, environment and arguments, and:

* copies the child's stdout/stderr line by line to ``<job>/ranks/rank<R>.stdout``
  / ``.stderr`` and to its own stdout/stderr prefixed ``[rank R]``, so the
  launcher's merged stream is rank-prefixed whatever the launcher;
* records the child's PID (for py-spy) and its exit status, signals included
  (``-9`` for SIGKILL), in ``<job>/ranks/rank<R>.json``, written atomically;
* forwards SIGTERM/SIGINT to the child, so launcher teardown behaves as without it;
* when ``RUNBOOK_FR_DIR`` is set (the runner sets it), puts ``helpers/_fr_site`` first on the child's
  ``PYTHONPATH``: its ``sitecustomize`` makes the rank write its Flight Recorder dump on SIGUSR2.

Why our own wrapper: no launcher reports per-rank exit codes or per-rank logs in a
common form (torchrun's ``--log-dir`` layout, DeepSpeed's ``--enable_each_rank_log``
and Accelerate differ, and plain ``python`` has none), and the parent process is
the only one that can read a child's exit status.  Stdlib only, so it adds ~20 ms
of interpreter start per rank and no torch import.

Paths follow :class:`helpers.jobdir.JobDir`.  The job directory comes from ``RUNBOOK_JOB_DIR``; the rank from ``RUNBOOK_RANK``
(set by the runner for plain-``python`` jobs), else ``RANK``, else ``SLURM_PROCID``, else the first free
index (a launcher that sets no env contract, seed D1).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import IO

from helpers.jobdir import FR_DIR_ENV, JobDir


def _claim_rank(layout: JobDir) -> str:
    """Return this process's rank id, claiming a free index when no env names one."""
    for var in ("RUNBOOK_RANK", "RANK", "SLURM_PROCID"):
        value = os.environ.get(var, "")
        if value.strip().lstrip("-").isdigit():
            return str(int(value))
    index = 0
    while True:
        try:
            fd = os.open(layout.rank_claim(index), os.O_CREAT | os.O_EXCL | os.O_WRONLY)
            os.close(fd)
            return str(index)
        except FileExistsError:
            index += 1


def _write_json(path: str | os.PathLike[str], obj: dict) -> None:
    """Atomically replace ``path`` with ``obj`` as JSON."""
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(obj, fh)
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, path)


def _pump(src: IO[bytes], log: IO[bytes], out: IO[bytes], prefix: bytes) -> None:
    """Copy lines from ``src`` to ``log`` (verbatim) and ``out`` (prefixed once) until EOF."""
    for line in iter(src.readline, b""):
        log.write(line)
        log.flush()
        try:
            out.write(line if line.startswith(prefix) else prefix + line)
            out.flush()
        except (BrokenPipeError, ValueError):
            pass  # the launcher stopped reading; keep the per-rank file going


def _set_pdeathsig() -> None:
    """Ask the kernel to SIGKILL the child if the shim dies first (Linux prctl)."""
    try:
        import ctypes

        libc = ctypes.CDLL("libc.so.6", use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG = 1
    except OSError:
        pass


def main(argv: list[str]) -> int:
    """Run ``argv`` (``script.py args...`` or ``-m module args...``) as this rank; return its status."""
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    # The deepspeed launcher runs ``python -u <script> --local_rank=N <args>``; here <script> is
    # this shim, so pass the flag on to the real script in the place it would have had.
    lead = []
    while argv and argv[0].startswith(("--local_rank", "--local-rank")):
        lead.append(argv.pop(0))
    if lead and argv and argv[0] != "-m":
        argv = [argv[0], *lead, *argv[1:]]
    elif lead and len(argv) >= 2:
        argv = [*argv[:2], *lead, *argv[2:]]
    layout = JobDir.from_env(os.getcwd())
    layout.ranks_dir.mkdir(parents=True, exist_ok=True)
    rank = _claim_rank(layout)
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if env.get(FR_DIR_ENV):  # Flight Recorder dump on SIGUSR2, without touching the user's script (helpers/_fr_site)
        site = os.path.join(os.path.dirname(os.path.abspath(__file__)), "_fr_site")
        env["PYTHONPATH"] = os.pathsep.join(p for p in (site, env.get("PYTHONPATH", "")) if p)
    cmd = [sys.executable, "-u", *argv]
    record: dict = {"rank": int(rank), "shim_pid": os.getpid(), "cmd": cmd, "start": time.time()}
    with open(layout.rank_stdout(rank), "ab") as out_log, open(layout.rank_stderr(rank), "ab") as err_log:
        child = subprocess.Popen(
            cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, preexec_fn=_set_pdeathsig
        )
        record["pid"] = child.pid
        _write_json(layout.rank_record(rank), record)

        def forward(signum: int, _frame: object) -> None:
            if child.poll() is None:
                child.send_signal(signum)

        for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2):
            signal.signal(sig, forward)
        prefix = f"[rank {rank}] ".encode()
        pumps = [
            threading.Thread(target=_pump, args=(child.stdout, out_log, sys.stdout.buffer, prefix), daemon=True),
            threading.Thread(target=_pump, args=(child.stderr, err_log, sys.stderr.buffer, prefix), daemon=True),
        ]
        for t in pumps:
            t.start()
        status = child.wait()
        for t in pumps:
            t.join(timeout=5)
    record.update(exit_code=status, end=time.time())
    _write_json(layout.rank_record(rank), record)
    # Mirror the child's status so the launcher sees what the rank really did.
    if status < 0:
        signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
