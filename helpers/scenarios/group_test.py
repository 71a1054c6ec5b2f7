"""One worker per node for the group tests of the localisation: each round, a collective among the nodes of its group.

``runbook diagnose`` across nodes (the ``localise`` step, :mod:`helpers.allocation.grouptest`) starts it once per
node in one SLURM step (``srun --ntasks-per-node=1``), so torch is imported once per node, not once per test.  The
orchestrator and the workers talk through files in ``--out-dir`` on the shared filesystem:

* the worker writes ``hello/<node>.json`` (its NIC line rate and memory-copy bandwidth, for the envelope);
* the orchestrator writes ``rounds/<R>.json``: ``{"groups": [[node, ...], ...], "port": P, "bytes": S,
  "timeout_s": T}`` (disjoint groups);
* each member of a group forks a child that forms a process group with the other members (a ``TCPStore`` on the
  group's first node, port ``P``), times one ``all_reduce`` and one ``all_to_all`` of ``S`` bytes (the
  all_to_all sends to every other member: a slow link between two members shows), and writes
  ``rounds/<R>/<node>.json``: ``{"ok", "all_reduce_s", "all_to_all_s", "ranks", "error"}``.  A child that is not
  done within ``T`` + 5 s is killed, and the worker writes the error itself;
* ``stop`` ends every worker.

Forking after ``import torch`` keeps a round at ~0.3 s; a child stuck in a collective (an MTU black hole) is
killed without losing the worker.

Example (inside an allocation; the orchestrator writes the rounds)::

    srun -N8 --ntasks-per-node=1 python helpers/scenarios/group_test.py --out-dir build/localise --backend gloo
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import socket
import sys
import time

POLL_S = 0.05


def _node() -> str:
    return os.environ.get("SLURMD_NODENAME") or socket.gethostname().split(".")[0]


def _write(path: str, obj: dict) -> None:
    """Write ``obj`` as JSON to ``path`` atomically (a reader never sees half a file)."""
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as fh:
        json.dump(obj, fh)
    os.replace(tmp, path)


def run_test(group: list[str], rank: int, port: int, size: int, timeout_s: float, backend: str, stage: dict) -> dict:
    """In the child: form the group's process group, time one all_reduce and one all_to_all of ``size`` bytes.

    ``stage["small_ok"]`` turns True once a one-element all_reduce went through (small messages pass: a later
    failure of the large ones points at the MTU, MN4).
    """
    from datetime import timedelta

    import torch
    import torch.distributed as dist

    k = len(group)
    store = dist.TCPStore(group[0], port, k, rank == 0, timeout=timedelta(seconds=timeout_s))
    device = torch.device("cuda", 0) if backend == "nccl" else torch.device("cpu")
    dist.init_process_group(backend, store=store, rank=rank, world_size=k, timeout=timedelta(seconds=timeout_s))
    dist.all_reduce(torch.ones(1, device=device))  # one element: fits any MTU
    stage["small_ok"] = True
    _write(stage["marker"], {"stage": "small_ok"})
    n = max(k, size // 4 // k * k)  # float32 elements, a multiple of k for all_to_all
    buf, out = torch.ones(n, device=device), torch.empty(n, device=device)
    times = {}  # no large warm-up: the one-element all_reduce above opened every connection
    for name, op in (("all_reduce_s", lambda: dist.all_reduce(buf)), ("all_to_all_s", lambda: dist.all_to_all_single(out, buf))):
        dist.barrier()
        t = time.perf_counter()
        op()
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        times[name] = time.perf_counter() - t
    slowest = torch.tensor([times["all_reduce_s"], times["all_to_all_s"]], dtype=torch.float64, device=device)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)  # every member reports the group's slowest times
    dist.destroy_process_group()
    return {"ok": True, "all_reduce_s": float(slowest[0]), "all_to_all_s": float(slowest[1]), "ranks": k,
            "bytes": n * 4, "error": ""}


def one_round(plan: dict, me: str, out_dir: str, r: int, backend: str) -> None:
    """Take part in round ``r`` when ``me`` is in one of its groups: fork, wait, write the result."""
    group = next((g for g in plan["groups"] if me in g), None)
    if group is None:
        return
    result_path = os.path.join(out_dir, "rounds", str(r), f"{me}.json")
    marker = result_path + ".small"
    pid = os.fork()
    if pid == 0:  # the child: one test, then _exit (no atexit, no torch teardown races)
        code, stage = 0, {"small_ok": False, "marker": marker}
        try:
            res = run_test(group, group.index(me), int(plan["port"]), int(plan["bytes"]), float(plan["timeout_s"]), backend,
                           stage)
        except Exception as exc:  # noqa: BLE001 - any failure of the collective is the result
            res, code = {"ok": False, "error": f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:300]}, 1
            if stage["small_ok"]:
                res["stage"] = "small_ok"
        res["node"], res["group"] = me, group
        _write(result_path, res)
        os._exit(code)
    deadline = time.monotonic() + float(plan["timeout_s"]) + 5
    while time.monotonic() < deadline:
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done:
            break
        time.sleep(POLL_S)
    else:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        _write(result_path, {"ok": False, "node": me, "group": group,
                             **({"stage": "small_ok"} if os.path.exists(marker) else {}),
                             "error": f"no result within {plan['timeout_s']:g} + 5 s: the collective hung"})


def main(argv: list[str] | None = None) -> int:
    """Say hello, then take part in every round until ``stop`` appears; exit 0 (2 on bad flags)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="Example: python helpers/scenarios/group_test.py --out-dir build/localise",
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out-dir", required=True, help="the shared folder of the plans and results")
    parser.add_argument("--backend", choices=("gloo", "nccl"), default="gloo")
    parser.add_argument("--max-wait-s", type=float, default=600.0, help="give up when no round comes for this long")
    args = parser.parse_args(argv)
    if not args.max_wait_s > 0:
        parser.error(f"--max-wait-s={args.max_wait_s}: must be > 0 seconds")
    me = _node()
    from helpers import hostinfo  # psutil, no torch

    ifaces = [i for i in hostinfo.interfaces() if i["up"] and not i["loopback"] and i["ipv4"]]
    speed = hostinfo.nic_speed_mbps(ifaces[0]["name"])[0] if ifaces else None
    import torch  # imported once, before the forks
    import torch.distributed  # noqa: F401

    # One intra-op thread: an OpenMP pool started in this process (memcpy_gbps' copy would start it) is dead in a
    # forked child, whose first large tensor op then waits forever (GNU libgomp is not fork-safe).
    torch.set_num_threads(1)

    _write(os.path.join(args.out_dir, "hello", f"{me}.json"),
           {"node": me, "nic_mbps": speed, "memcpy_GBps": round(hostinfo.memcpy_gbps(), 2), "pid": os.getpid()})
    r, last = 1, time.monotonic()
    while time.monotonic() - last < args.max_wait_s:
        if os.path.exists(os.path.join(args.out_dir, "stop")):
            return 0
        path = os.path.join(args.out_dir, "rounds", f"{r}.json")
        if not os.path.exists(path):
            time.sleep(POLL_S)
            continue
        with open(path) as fh:
            one_round(json.load(fh), me, args.out_dir, r, args.backend)
        r, last = r + 1, time.monotonic()
    return 0


if __name__ == "__main__":
    sys.exit(main())
