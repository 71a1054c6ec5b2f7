"""Which launcher, which parallelism, and the command line that starts it (seeds D1-D7).

Three things, all data or pure functions (nothing runs at import):

* :data:`DECISION_TABLE`: the D7 decision (DDP vs FSDP vs ZeRO vs Accelerate) as rows of
  :class:`LauncherRow`, with a single-node and a multi-node command template each;
  :func:`table_markdown` renders it.
* :func:`build_command`: the argv of one launcher on one node, validated (bad input raises
  ``ValueError`` naming the field).  The chapter runs what it builds (notebook 01, D1/D3/D4).

Sources: torchrun https://docs.pytorch.org/docs/2.12/elastic/run.html ; Accelerate
https://huggingface.co/docs/accelerate/en/basic_tutorials/launch ; DeepSpeed
https://huggingface.co/docs/accelerate/en/usage_guides/deepspeed and
https://github.com/huggingface/accelerate/blob/main/docs/source/concept_guides/fsdp_and_deepspeed.md
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from helpers.validate import positive_int, tcp_port

__all__ = ["DECISION_LAUNCHERS", "DECISION_TABLE", "DEFAULT_MASTER_PORT", "RDZV_FORMS", "LauncherRow",
           "build_command", "positive_int", "table_markdown", "tcp_port", "torchrun_flags"]

DECISION_LAUNCHERS = ("torchrun", "accelerate", "deepspeed")
"""The launchers of the D7 decision table and of :func:`build_command` (``jobs.LAUNCHERS`` adds python, srun)."""
DEFAULT_MASTER_PORT = 29500
"""torchrun's (and accelerate's, deepspeed's) default rendezvous port (D4)."""
RDZV_FORMS = ("standalone", "static", "c10d")
"""torchrun's rendezvous forms (:func:`torchrun_flags`): one node private, fixed node ranks, c10d rendezvous (D2, D3)."""
_NNODES_RANGE = re.compile(r"(\d+):(\d+)")


@dataclass(frozen=True)
class LauncherRow:
    """One row of the D7 decision table.

    Attributes:
        launcher: the command (``torchrun``, ``accelerate``, ``deepspeed``).
        when: when to choose it, in one sentence.
        parallelism: what the ranks do (DDP replica, FSDP shards, ZeRO stage...).
        single_node: command template for one node (``{nproc}``, ``{script}``).
        multi_node: command template run on every node (``{nnodes}``, ``{nproc}``, ``{total}``,
            ``{node_rank}``, ``{master_addr}``, ``{master_port}``, ``{script}``).
        seeds: seed entry ids that explain the row.
    """

    launcher: str
    when: str
    parallelism: str
    single_node: str
    multi_node: str
    seeds: tuple[str, ...]


_TORCHRUN_MULTI = ("torchrun --nnodes={nnodes} --nproc-per-node={nproc} --rdzv-id=$JOB_ID --rdzv-backend=c10d "
                   "--rdzv-endpoint={master_addr}:{master_port} {script}")

DECISION_TABLE: tuple[LauncherRow, ...] = (
    LauncherRow("torchrun", "The model, its gradients and optimizer state fit on one GPU; you want throughput.",
                "DDP: a full replica per rank, gradients all-reduced every step.",
                "torchrun --standalone --nproc-per-node={nproc} {script}", _TORCHRUN_MULTI,
                ("D1", "D2", "D3", "D4", "D7", "D8", "D11")),
    LauncherRow("torchrun", "The model does not fit (about 18 bytes per parameter with Adam and mixed precision) "
                "and you stay in plain PyTorch.",
                "FSDP (fully_shard): FULL_SHARD = ZeRO-3, SHARD_GRAD_OP = ZeRO-2, HYBRID_SHARD across nodes.",
                "torchrun --standalone --nproc-per-node={nproc} {script}", _TORCHRUN_MULTI,
                ("D7", "D12", "D13", "D14", "D15")),
    LauncherRow("accelerate",
                "Hugging Face code (Trainer, Accelerator); switch DDP/FSDP/ZeRO without touching the script.",
                "DDP, FSDP or DeepSpeed ZeRO, chosen by the config file.",
                "accelerate launch --config_file config.yaml --num_processes={nproc} {script}",
                "accelerate launch --config_file config.yaml --num_machines={nnodes} --num_processes={total} "
                "--machine_rank={node_rank} --main_process_ip={master_addr} --main_process_port={master_port} {script}",
                ("D5", "D7")),
    LauncherRow("deepspeed", "ZeRO with CPU/NVMe offload of parameters and optimizer separately (ZeRO-Infinity), "
                "or an existing ds_config.json.",
                "DeepSpeed ZeRO stage 1/2/3 (+ offload).",
                "deepspeed --num_gpus={nproc} {script} --deepspeed ds_config.json",
                "deepspeed --hostfile=hostfile --num_nodes={nnodes} --num_gpus={nproc} --master_addr={master_addr} "
                "--master_port={master_port} {script} --deepspeed ds_config.json",
                ("D6", "D7", "D16", "D17", "D18")),
)


def table_markdown(rows: Sequence[LauncherRow] = DECISION_TABLE) -> str:
    """The decision table as a Markdown table (one row per :class:`LauncherRow`)."""
    lines = ["| launcher | when | parallelism | one node | every node of a multi-node job | seeds |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        cells = [f"`{row.launcher}`", row.when, row.parallelism, f"`{row.single_node}`", f"`{row.multi_node}`",
                 ", ".join(row.seeds)]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def _flag_value(value: object, name: str, check: Callable[[object, str], object]) -> str:
    """``value`` as flag text: a non-empty string passes through (shell text such as ``"$SLURM_NODEID"``), else ``check``."""
    if isinstance(value, str):
        if not value.strip():
            raise ValueError(f"{name}={value!r}: must not be empty")
        return value
    check(value, name)
    return str(value)


def torchrun_flags(form: str | None, *, nnodes: int | str, nproc_per_node: int | str | None,
                   master_addr: str | None = None, master_port: int | str | None = None,
                   node_rank: int | str | None = None, rdzv_id: str | None = None, rdzv_endpoint: str | None = None,
                   rdzv_conf: str | None = None, max_restarts: int | None = None) -> list[str]:
    """torchrun's size and rendezvous flags for one agent: the one place they are spelled (D2, D3, D4).

    Forms (:data:`RDZV_FORMS`):

    * ``standalone``: ``--standalone``, a private rendezvous on a free port; one node only (D2).
    * ``static``: ``[--node-rank=R] --master-addr=A --master-port=P``; every node has its rank (D3).
      ``node_rank`` may be left out for one node.
    * ``c10d``: ``--rdzv-id=ID --rdzv-backend=c10d --rdzv-endpoint=A:P [--rdzv-conf=C]``, identical on
      every node; the form elastic membership needs (chapter 07).
    * ``None``: only ``--nnodes``/``--nproc-per-node`` (the caller passes its own rendezvous flags).

    A string value is passed through unchecked, so shell text works (``node_rank='"$SLURM_NODEID"'``;
    quoting is the caller's); ints are validated.  ``nnodes`` may be a ``"MIN:MAX"`` range (elastic
    agents, ``--nnodes=1:2``), checked when both are integers.

    Args:
        form: one of :data:`RDZV_FORMS`, or None.
        nnodes: nodes, an int >= 1 or a string (``"1:2"``, ``"$SLURM_JOB_NUM_NODES"``).
        nproc_per_node: ranks per node, an int >= 1 or a string; None leaves the flag out.
        master_addr: node 0's address (static; c10d's endpoint unless ``rdzv_endpoint``).
        master_port: the store's TCP port, 1..65535 (static; c10d's endpoint unless ``rdzv_endpoint``).
        node_rank: this node's index, ``0..nnodes-1`` when both are ints (static).
        rdzv_id: the job id, same on every node (c10d).
        rdzv_endpoint: ``HOST:PORT`` as written (c10d), instead of ``master_addr:master_port``.
        rdzv_conf: ``--rdzv-conf`` value (static and c10d), e.g. ``join_timeout=60`` (c10d) or ``timeout=10``
            (static: how long the store waits for every agent; torchrun's default is 900 s).
        max_restarts: ``--max-restarts``, an int >= 0 (any form).

    Returns:
        The flags, in the order above (size flags first).

    Raises:
        ValueError: naming the field: an unknown ``form``; a bad ``nnodes``, ``nproc_per_node``,
            ``master_port``, ``node_rank`` or ``max_restarts``; ``standalone`` with several nodes;
            a field the form needs is missing; a field the form does not take is given.
    """
    if form is not None and form not in RDZV_FORMS:
        raise ValueError(f"form={form!r}: accepted values are {', '.join(RDZV_FORMS)}, or None")
    span = _NNODES_RANGE.fullmatch(nnodes) if isinstance(nnodes, str) else None
    if span and not 1 <= int(span.group(1)) <= int(span.group(2)):
        raise ValueError(f"nnodes={nnodes!r}: a range MIN:MAX needs 1 <= MIN <= MAX")
    flags = [f"--nnodes={_flag_value(nnodes, 'nnodes', positive_int)}"]
    if nproc_per_node is not None:
        flags.append(f"--nproc-per-node={_flag_value(nproc_per_node, 'nproc_per_node', positive_int)}")
    if max_restarts is not None:
        flags.append(f"--max-restarts={positive_int(max_restarts, 'max_restarts', 0)}")
    given = {"master_addr": master_addr, "master_port": master_port, "node_rank": node_rank, "rdzv_id": rdzv_id,
             "rdzv_endpoint": rdzv_endpoint, "rdzv_conf": rdzv_conf}
    takes = {None: (), "standalone": (), "static": ("master_addr", "master_port", "node_rank", "rdzv_conf"),
             "c10d": ("master_addr", "master_port", "rdzv_id", "rdzv_endpoint", "rdzv_conf")}[form]
    extra = [k for k, v in given.items() if v is not None and k not in takes]
    if extra:
        raise ValueError(f"{extra[0]}: the {form or 'None'} form does not take it (it takes {', '.join(takes) or 'nothing'})")
    if form == "standalone":
        if isinstance(nnodes, int) and nnodes > 1 or span and int(span.group(2)) > 1:
            raise ValueError(f"nnodes={nnodes!r}: --standalone is one node only (D2); use static or c10d")
        return flags + ["--standalone"]
    port = None if master_port is None else _flag_value(master_port, "master_port", tcp_port)
    if master_addr is not None and not str(master_addr).strip():
        raise ValueError(f"master_addr={master_addr!r}: must be a non-empty host name or IP address")
    if form == "static":
        if master_addr is None or port is None:
            raise ValueError(f"{'master_addr' if master_addr is None else 'master_port'}: required by the static form")
        if node_rank is not None:
            if not isinstance(node_rank, str) and (isinstance(node_rank, bool) or not isinstance(node_rank, int)
                                                    or node_rank < 0 or isinstance(nnodes, int) and node_rank >= nnodes):
                top = f"0..{nnodes - 1} (nnodes={nnodes})" if isinstance(nnodes, int) else ">= 0"
                raise ValueError(f"node_rank={node_rank!r}: must be an integer in {top}")
            flags.append(f"--node-rank={node_rank}")
        flags += [f"--master-addr={master_addr}", f"--master-port={port}"]
        return flags + ([f"--rdzv-conf={rdzv_conf}"] if rdzv_conf is not None else [])
    if form == "c10d":
        if not rdzv_id or not str(rdzv_id).strip():
            raise ValueError(f"rdzv_id={rdzv_id!r}: the c10d form needs a job id, the same on every node")
        if rdzv_endpoint is None:
            if master_addr is None or port is None:
                raise ValueError("rdzv_endpoint: the c10d form needs it, or master_addr and master_port")
            rdzv_endpoint = f"{master_addr}:{port}"
        elif master_addr is not None or master_port is not None:
            raise ValueError("rdzv_endpoint: give it or master_addr/master_port, not both")
        flags += [f"--rdzv-id={rdzv_id}", "--rdzv-backend=c10d", f"--rdzv-endpoint={rdzv_endpoint}"]
        return flags + ([f"--rdzv-conf={rdzv_conf}"] if rdzv_conf is not None else [])
    return flags


def build_command(launcher: str, nproc_per_node: int, nnodes: int = 1, node_rank: int | None = None,
                  master_addr: str | None = None, master_port: int | None = None, *,
                  script: str | os.PathLike[str] | None = None, script_args: Sequence[object] = (),
                  rdzv_id: str | None = None, hostfile: str = "hostfile",
                  config_file: str | None = None) -> list[str]:
    """The argv that starts ``script`` under ``launcher`` on one node (seeds D1-D6).

    Forms produced:

    * torchrun, one node: ``--standalone`` (a private rendezvous on a free port, D2/D4), or
      ``--master-port=P`` when ``master_port`` is given.
    * torchrun, several nodes: with ``rdzv_id``, the c10d rendezvous form, identical on every
      node (D2); without it, the static form ``--node-rank=i --master-addr --master-port`` (D3).
    * accelerate: ``--num_processes`` is the TOTAL over all machines; ``--multi_gpu`` is added
      when it is > 1, since without it Accelerate starts one process (D5).
    * deepspeed: ``--num_gpus``; several nodes use ``--hostfile`` (pdsh over ssh) or, when
      ``node_rank`` is given, ``--no_ssh --node_rank=i`` started on each node like torchrun (D6).

    Args:
        launcher: ``torchrun``, ``accelerate`` or ``deepspeed``.
        nproc_per_node: ranks (processes, usually GPUs) on each node, >= 1.
        nnodes: number of nodes, >= 1.
        node_rank: this node's index ``0..nnodes-1`` (``GROUP_RANK``); required for the static
            torchrun form and for accelerate with ``nnodes`` > 1.
        master_addr: address of node 0 (required when ``nnodes`` > 1).
        master_port: TCP port 1..65535 of the rendezvous store on node 0 (default 29500 for
            several nodes).  For one node, ``None`` means: torchrun ``--standalone`` picks a free
            port; accelerate and deepspeed use their default 29500, shared with any other job (D4).
        script: the training script (required).
        script_args: its arguments (converted with ``str``).
        rdzv_id: torchrun job id for the c10d rendezvous form (same on every node).
        hostfile: deepspeed hostfile path (both multi-node forms read the node list from it).
        config_file: accelerate ``--config_file``.

    Returns:
        The argv list (the launcher's name first, resolved through ``PATH`` when run).

    Raises:
        ValueError: naming the field: unknown ``launcher``; ``nproc_per_node`` or ``nnodes`` < 1;
            ``node_rank`` outside ``0..nnodes-1``; ``master_addr`` missing when ``nnodes`` > 1;
            ``master_port`` outside 1..65535; ``script`` missing; ``node_rank`` missing where the
            form needs it.
    """
    if launcher not in DECISION_LAUNCHERS:
        raise ValueError(f"launcher={launcher!r}: accepted values are {', '.join(DECISION_LAUNCHERS)}")
    positive_int(nproc_per_node, "nproc_per_node")
    positive_int(nnodes, "nnodes")
    if node_rank is not None and (isinstance(node_rank, bool) or not isinstance(node_rank, int)
                                  or not 0 <= node_rank < nnodes):
        raise ValueError(f"node_rank={node_rank!r}: must be an integer in 0..{nnodes - 1} (nnodes={nnodes})")
    if master_port is not None:
        tcp_port(master_port, "master_port")
    if master_addr is not None and (not isinstance(master_addr, str) or not master_addr.strip()):
        raise ValueError(f"master_addr={master_addr!r}: must be a non-empty host name or IP address")
    if nnodes > 1 and master_addr is None:
        raise ValueError(f"master_addr: required when nnodes={nnodes} > 1 (the address of node 0)")
    if not isinstance(script, str | os.PathLike) or not str(script).strip():
        raise ValueError(f"script={script!r}: the training script's path is required")
    tail = [str(script), *map(str, script_args)]
    multi = nnodes > 1
    port = master_port if master_port is not None else DEFAULT_MASTER_PORT

    if launcher == "torchrun":
        size = {"nnodes": nnodes, "nproc_per_node": nproc_per_node}
        if multi and rdzv_id:
            flags = torchrun_flags("c10d", **size, master_addr=master_addr, master_port=port, rdzv_id=rdzv_id)
        elif multi:
            if node_rank is None:
                raise ValueError("node_rank: required for the static multi-node form (or pass rdzv_id for c10d)")
            flags = torchrun_flags("static", **size, master_addr=master_addr, master_port=port, node_rank=node_rank)
        elif master_port is not None:
            flags = torchrun_flags("static", **size, master_addr=master_addr or "127.0.0.1", master_port=master_port)
        else:
            flags = torchrun_flags("standalone", **size)
        return ["torchrun", *flags, *tail]

    if launcher == "accelerate":
        total = nproc_per_node * nnodes
        cmd = ["accelerate", "launch"]
        cmd += ["--config_file", str(config_file)] if config_file else []
        cmd += [f"--num_processes={total}", f"--num_machines={nnodes}"]
        cmd += ["--multi_gpu"] if total > 1 else []
        if multi:
            if node_rank is None:
                raise ValueError(f"node_rank: required for accelerate with nnodes={nnodes} (--machine_rank)")
            cmd += [f"--machine_rank={node_rank}", f"--main_process_ip={master_addr}", f"--main_process_port={port}"]
        elif master_port is not None:
            cmd += [f"--main_process_port={master_port}"]
        return cmd + tail

    cmd = ["deepspeed", f"--num_gpus={nproc_per_node}"]
    if multi:
        cmd += [f"--hostfile={hostfile}", f"--num_nodes={nnodes}"]
        cmd += ["--no_ssh", f"--node_rank={node_rank}"] if node_rank is not None else []
        cmd += [f"--master_addr={master_addr}", f"--master_port={port}"]
    elif master_port is not None:
        cmd += [f"--master_port={master_port}"]
    return cmd + tail
