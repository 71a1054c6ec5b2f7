"""Each rank prints the launcher's env contract, then joins the default process group (seeds D1-D4, D6).

One line per rank, before anything can fail::

    [rank R] contract {"RANK": "2", "LOCAL_RANK": "0", "WORLD_SIZE": "4", ..., "tag": "node1", "pid": 123}

so the notebook can compare what each launcher set (torchrun, ``deepspeed``, bare ``python``: D1, D6).
With ``--devices-per-node N`` (``0`` = ``LOCAL_WORLD_SIZE``, i.e. one simulated device per local rank)
the rank also prints the device index it would bind with ``RANK`` and with ``LOCAL_RANK`` (D3)::

    [rank R] bind {"node": 1, "by_rank": 2, "by_local_rank": 0, "devices_per_node": 2, "by_rank_valid": false}

Then it calls ``init_process_group`` (env:// rendezvous, ``--timeout-s`` bounds the store wait), prints
``group {"rank": R, "world_size": W, "members": [...]}`` where ``members`` lists every member's
``tag``, pid and ``RANK`` (``all_gather_object``: proves which processes formed ONE group, D2),
holds for ``--hold-s`` seconds with one ``all_reduce`` and a ``step N`` line per second (a job that
keeps its port busy, D4), and leaves through a barrier.

``--bind`` (GPU only, D3): ``none`` never calls ``set_device`` (every rank computes on ``cuda:0``),
``rank`` binds ``cuda:RANK``, ``local_rank`` binds ``cuda:LOCAL_RANK`` (the fix).

Example::

    torchrun --standalone --nproc-per-node 2 helpers/scenarios/launch_contract.py --tag node0
    RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=29511 \\
        python helpers/scenarios/launch_contract.py --timeout-s 5
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time

from helpers.scenarios import _common

CONTRACT = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
            "TORCHELASTIC_RUN_ID")
BINDS = ("cpu", "none", "rank", "local_rank")


def contract() -> dict:
    """The launcher-set variables of this process (``None`` = not set), with hostname and pid."""
    record: dict = {k: os.environ.get(k) for k in CONTRACT}
    record.update(hostname=socket.gethostname(), pid=os.getpid())
    return record


def bind_report(devices_per_node: int) -> dict:
    """The device index this rank would bind by ``RANK`` and by ``LOCAL_RANK`` (seed D3).

    Args:
        devices_per_node: devices on this node (``0`` = ``LOCAL_WORLD_SIZE``, one per local rank).

    Returns:
        ``{"node" (GROUP_RANK), "by_rank", "by_local_rank", "devices_per_node", "by_rank_valid",
        "by_local_rank_valid"}``.
    """
    n = devices_per_node or _common.env_int("LOCAL_WORLD_SIZE", 1)
    by_rank, by_local = _common.env_int("RANK", 0), _common.env_int("LOCAL_RANK", 0)
    return {"node": _common.env_int("GROUP_RANK", 0), "by_rank": by_rank, "by_local_rank": by_local,
            "devices_per_node": n,
            "by_rank_valid": 0 <= by_rank < n, "by_local_rank_valid": 0 <= by_local < n}


def main() -> int:
    """Parse arguments, report the contract, join the group, hold, leave; return 0 on success."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tag", default="", help="label printed with every record (e.g. node0 / jobA)")
    _common.add_dist_args(parser, timeout_s=10, backend=None)
    parser.add_argument("--hold-s", type=float, default=0.0, help="seconds to stay in the group (1 step/s)")
    parser.add_argument("--devices-per-node", type=int, default=-1,
                        help="print the D3 bind report for N devices per node (0 = LOCAL_WORLD_SIZE; -1 = off)")
    parser.add_argument("--bind", choices=BINDS, default="cpu",
                        help="cpu: gloo on CPU; none/rank/local_rank: NCCL, device chosen that way (D3)")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None,
                        help="appended by the deepspeed launcher (D6); printed, LOCAL_RANK from the env is used")
    args = parser.parse_args()
    if args.timeout_s <= 0:
        parser.error("--timeout-s must be > 0")

    record = contract()
    record.update(tag=args.tag, argv_local_rank=args.local_rank)
    print("contract", json.dumps(record), flush=True)
    if args.devices_per_node >= 0:
        print("bind", json.dumps(bind_report(args.devices_per_node)), flush=True)

    from datetime import timedelta

    import torch
    import torch.distributed as dist

    timeout = timedelta(seconds=args.timeout_s)
    if args.bind == "cpu":
        device = torch.device("cpu")
        dist.init_process_group("gloo", timeout=timeout)
    else:
        if args.bind != "none":
            index = _common.env_int("RANK" if args.bind == "rank" else "LOCAL_RANK", 0)
            torch.cuda.set_device(index)  # D3: index by LOCAL_RANK; RANK overflows on node 1+
        device = torch.device("cuda", torch.cuda.current_device())
        dist.init_process_group("nccl", timeout=timeout)
    members: list = [None] * dist.get_world_size()
    dist.all_gather_object(members, {"tag": args.tag, "pid": os.getpid(), "RANK": record["RANK"],
                                     "device": str(device)})
    print("group", json.dumps({"rank": dist.get_rank(), "world_size": dist.get_world_size(),
                               "members": members}), flush=True)
    value = torch.ones(1, device=device)
    start = time.monotonic()
    step = 0
    while time.monotonic() - start < args.hold_s:
        time.sleep(1.0)
        dist.all_reduce(value)
        step += 1
        print(f"step {step}", flush=True)
    _common.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
