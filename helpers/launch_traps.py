"""A launch described once (:class:`LaunchSpec`), rendered for any launcher, and checked for the known traps.

:func:`render` turns a spec into what the user runs: a ``torchrun`` / ``accelerate launch`` /
``deepspeed`` command (:func:`helpers.launchers.build_command`), the ``srun`` + ``torchrun`` lines,
or a whole ``sbatch`` script (:mod:`helpers.slurm`).  :func:`find_traps` lists what in the spec
will break, each :class:`~helpers.checks.Check` (:func:`trap`) with the field to change, the fix and the seed entry it comes from.
The command-builder widget (:mod:`helpers.widgets`) calls both on every keystroke; both are pure
(``find_traps(check_port=True)`` also asks this machine whether the port is free).

Every trap here was reproduced in a chapter: the ids are stable and the notebooks assert on them.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping
from dataclasses import dataclass, field

from helpers import envvars, hostinfo, ifnames, launchers, slurm, sources
from helpers.checks import NOT_OK, Check
from helpers.validate import positive_int, tcp_port

KINDS = ("torchrun", "accelerate", "deepspeed", "srun+torchrun", "sbatch")
SEVERITIES = NOT_OK  # a trap asks for an action: WARN or FAIL of the one status scale
_LOOPBACK = re.compile(r"^(localhost|127\.\d+\.\d+\.\d+|::1|0\.0\.0\.0)$")


@dataclass(frozen=True)
class LaunchSpec:
    """One launch, as the user would describe it.

    Attributes:
        kind: one of :data:`KINDS`.
        nnodes: nodes, >= 1.
        nproc_per_node: ranks per node, >= 1 (GPUs per node, on GPUs).
        script: the training script's path.
        script_args: its arguments.
        rdzv: torchrun's rendezvous form, one of :data:`helpers.launchers.RDZV_FORMS` (``standalone`` is one node only, D2).
        master_addr: node 0's address (multi-node torchrun/accelerate/deepspeed); SLURM forms take
            it from ``scontrol``.
        master_port: the rendezvous port, or ``None`` for the launcher's default (29500; a free one
            for ``torchrun --standalone``).
        node_rank: this node's index (multi-node torchrun static form, accelerate, deepspeed
            ``--no_ssh``); ``None`` with deepspeed means its ssh/pdsh launcher (D6).
        env: variables the job exports (``None`` value: unset).
        gpus_per_node: GPUs on each node if known (``None``: unknown; 0: CPU nodes, gloo).
        accelerate_cpu: accelerate on CPU (``--cpu``, D5).
        srun_ntasks_per_node: tasks ``srun`` starts per node in the SLURM forms (must be 1).
        srun_export: ``srun --export`` in the SLURM forms (``ALL``: the tasks see the batch
            shell's exports; ``NONE`` drops them, Gilbreth 8.12 failure mode 4).
    """

    kind: str = "torchrun"
    nnodes: int = 1
    nproc_per_node: int = 1
    script: str = "train.py"
    script_args: tuple[str, ...] = ()
    rdzv: str = "standalone"
    master_addr: str | None = None
    master_port: int | None = None
    node_rank: int | None = None
    env: Mapping[str, str | None] = field(default_factory=dict)
    gpus_per_node: int | None = None
    accelerate_cpu: bool = False
    srun_ntasks_per_node: int = 1
    srun_export: str = "ALL"


def trap(id: str, severity: str, field: str, message: str, fix: str, source: str) -> Check:  # noqa: A002
    """A known way the spec fails, as a plain :class:`helpers.checks.Check` built from the command builder's words.

    ``status`` = ``severity`` (``FAIL``: it will not run correctly; ``WARN``: it may, until something changes),
    ``title`` = ``message`` (what will happen, in the words of the error the user would see), ``remediation`` =
    ``fix``, and ``field`` (the :class:`LaunchSpec` attribute, or ``env.NAME``, to change); ``source`` is the seed
    entry or document it comes from.

    Raises:
        ValueError: ``severity`` not one of :data:`SEVERITIES`, or an empty ``id``.
    """
    if severity not in SEVERITIES:
        raise ValueError(f"severity={severity!r} in trap {id!r}: accepted values are {', '.join(SEVERITIES)}")
    return Check(id=id, title=message, status=severity, remediation=fix, source=source, field=field)




def validate(spec: LaunchSpec) -> None:
    """Raise ``ValueError`` naming the field when ``spec`` cannot describe a launch at all.

    Checks: ``kind`` in :data:`KINDS`, ``rdzv`` in :data:`helpers.launchers.RDZV_FORMS`, ``nnodes``/``nproc_per_node`` >= 1,
    ``master_port`` in 1..65535, ``gpus_per_node`` >= 0, ``srun_ntasks_per_node`` >= 1, a script whose path
    does not start with ``-``, ``srun_export`` a word such as ``ALL``/``NONE``.
    """
    if spec.kind not in KINDS:
        raise ValueError(f"kind={spec.kind!r}: accepted values are {', '.join(KINDS)}")
    if spec.rdzv not in launchers.RDZV_FORMS:
        raise ValueError(f"rdzv={spec.rdzv!r}: accepted values are {', '.join(launchers.RDZV_FORMS)}")
    for name in ("nnodes", "nproc_per_node", "srun_ntasks_per_node"):
        positive_int(getattr(spec, name), name)
    if spec.master_port is not None:
        tcp_port(spec.master_port, "master_port")
    if spec.gpus_per_node is not None and (not isinstance(spec.gpus_per_node, int) or spec.gpus_per_node < 0):
        raise ValueError(f"gpus_per_node={spec.gpus_per_node!r}: must be an integer >= 0, or None when unknown")
    if not isinstance(spec.script, str) or not spec.script.strip():
        raise ValueError("script: the training script's path is required")
    if spec.script.startswith("-"):
        raise ValueError(f"script={spec.script[:40]!r}: a path, not an option (the launcher would read it as its own "
                         "flag: `runbook build -- --help` built `torchrun ... --help`); write ./" + spec.script[:40])
    if not isinstance(spec.srun_export, str) or not re.fullmatch(r"[A-Za-z0-9_,=]+", spec.srun_export):
        raise ValueError(f"srun_export={spec.srun_export!r}: ALL, NONE or a comma-separated list of variable names")


def render(spec: LaunchSpec) -> str:
    """What the user runs for ``spec``: ``export`` lines and the command, or the SLURM lines / script.

    Multi-node torchrun/accelerate/deepspeed commands are shown for the node ``node_rank`` (node 0
    when ``None``); run the same line on every node with its own rank.

    Raises:
        ValueError: as :func:`validate`; ``rdzv='standalone'`` with several torchrun nodes (D2: the
            command the rdzv field names cannot be written); :func:`helpers.launchers.build_command`'s errors
            (e.g. ``master_addr`` missing for several nodes), naming the field.
    """
    validate(spec)
    if spec.kind in ("srun+torchrun", "sbatch"):
        rdzv = "c10d" if spec.rdzv == "c10d" else "static"
        port = spec.master_port or launchers.DEFAULT_MASTER_PORT
        if spec.kind == "sbatch":
            return slurm.sbatch_script("train", spec.nnodes, spec.nproc_per_node, spec.script, spec.script_args,
                                       gpus_per_node=spec.gpus_per_node, rdzv=rdzv, master_port=port, env=spec.env,
                                       ntasks_per_node=spec.srun_ntasks_per_node, export=spec.srun_export)
        return slurm.srun_torchrun(spec.nnodes, spec.nproc_per_node, spec.script, spec.script_args, rdzv=rdzv,
                                   master_port=port, env=spec.env, ntasks_per_node=spec.srun_ntasks_per_node,
                                   export=spec.srun_export)
    multi = spec.nnodes > 1
    if spec.kind == "torchrun" and multi and spec.rdzv == "standalone":
        raise ValueError(f"rdzv='standalone': one node only (D2); for nnodes={spec.nnodes} choose static or c10d")
    node_rank = spec.node_rank if spec.node_rank is not None or spec.kind == "deepspeed" else (0 if multi else None)
    port = spec.master_port
    if spec.kind == "torchrun" and not multi and spec.rdzv != "standalone" and port is None:
        port = launchers.DEFAULT_MASTER_PORT  # one node without --standalone: an explicit store on 29500
    argv = launchers.build_command(spec.kind, spec.nproc_per_node, spec.nnodes, node_rank, spec.master_addr, port,
                                   script=spec.script, script_args=spec.script_args,
                                   rdzv_id="$JOB_ID" if multi and spec.rdzv == "c10d" else None)
    if spec.kind == "accelerate" and spec.accelerate_cpu:
        argv = [a for a in argv if a != "--multi_gpu"]
        argv[2:2] = ["--cpu"]
    exports = envvars.shell_lines(spec.env)
    line = " ".join(a if a == "--rdzv-id=$JOB_ID" else shlex.quote(a) for a in argv)  # $JOB_ID: the user's shell expands it
    return "\n".join([*exports, line]) + "\n"


def _ifname_traps(spec: LaunchSpec) -> list[Check]:
    traps = []
    multi = spec.nnodes > 1
    for var, flavor in ifnames.IFNAME_VARS.items():
        value = spec.env.get(var)
        if not value:
            continue
        parsed = ifnames.parse(value, flavor)
        names = parsed["names"]
        if not parsed["supported"]:
            traps.append(trap("gloo-nccl-syntax", "FAIL", f"env.{var}", parsed["note"],
                              "gloo takes exact names: unset it (the hostname's address is used) or export the exact "
                              "name per node", sources.cite("PF-wrong-nic", "MN2")))
            continue
        local = [ifnames.node_local_reason(n) for n in names]
        if multi and ifnames.LOOPBACK in local and not parsed["exclude"]:
            traps.append(trap("ifname-loopback", "FAIL", f"env.{var}",
                              f"{var}={value} binds to 127.0.0.1: every node connects to itself and the job never forms "
                              "(a single-node setting carried into a multi-node job)",
                              f"unset {var} for multi-node jobs", sources.cite("Gilbreth 4.1", "Gilbreth 4.2", "MN2")))
        elif any(r not in (None, ifnames.LOOPBACK) for r in local) and not parsed["exclude"]:
            traps.append(trap("ifname-bridge", "FAIL", f"env.{var}",
                              f"{var}={value} selects a host-local bridge (172.17.0.1 on every node): "
                              "'Connection refused' on one side, 'Connect timeout' on the other",
                              f"unset {var} or name the data-plane interface", "MN2; chapter 06"))
        elif multi and any(ifnames.node_specific_name(n) for n in names) and not parsed["exclude"]:  # gloo never excludes
            fix = ("unset it, or use a prefix every node has (ib, eth, en)" if flavor == "nccl"
                   else "unset it (each node's hostname must resolve to its data-plane address), or export the name "
                        "per node inside the srun task")
            traps.append(trap("ifname-node-specific", "WARN", f"env.{var}",
                              f"{var}={value} names one node's interface; names differ per node (ibp65s0 vs ibp161s0): "
                              + ("'Bootstrap : no socket interface found'" if flavor == "nccl"
                                 else f"'Unable to find address for: {names[0]}'") + " where it is missing",
                              fix, sources.cite("PF-wrong-nic", "Gilbreth 8.12", "MN2")))
        if flavor == "nccl" and parsed["exclude"] and "lo" not in names:
            traps.append(trap("nccl-exclude-keeps-lo", "WARN", f"env.{var}",
                              f"{var}={value} still allows lo, which NCCL lists first: it may bootstrap on 127.0.0.1",
                              f"{var}=^{','.join([*names, 'lo'])}", "chapter 06 MN2; NCCL env docs"))
    return traps


def find_traps(spec: LaunchSpec, *, check_port: bool = False) -> list[Check]:
    """The known traps in ``spec``, FAILs first.

    Args:
        spec: the launch.
        check_port: also check, on this machine, that the rendezvous port is free (one node, or
            this machine is node 0); a taken port is ``port-in-use`` (D4).

    Returns:
        A list of :class:`~helpers.checks.Check` from :func:`trap` (empty: nothing known is wrong).

    Raises:
        ValueError: as :func:`validate`.
    """
    validate(spec)
    t: list[Check] = []
    multi = spec.nnodes > 1
    slurm_kind = spec.kind in ("srun+torchrun", "sbatch")
    env = spec.env
    if multi and spec.kind in ("torchrun", "srun+torchrun", "sbatch") and spec.rdzv == "standalone":
        t.append(trap("standalone-multinode", "FAIL", "rdzv",
                      "--standalone makes a private rendezvous on each node: two groups of one node each, never one job",
                      "use the static form (--node-rank, --master-addr) or c10d (same --rdzv-id/--rdzv-endpoint "
                      "everywhere)", "D2"))
    if multi and not slurm_kind:
        if not spec.master_addr and spec.kind == "deepspeed" and spec.node_rank is None:
            pass  # deepspeed's ssh launcher asks the hostfile's first host for its address (launcher/runner.py)
        elif not spec.master_addr:
            t.append(trap("master-addr-missing", "FAIL", "master_addr",
                          "several nodes need node 0's address: without it the rendezvous cannot start",
                          "set master_addr to node 0's hostname or data-plane IP", "D1"))
        elif _LOOPBACK.match(spec.master_addr):
            t.append(trap("master-addr-loopback", "FAIL", "master_addr",
                          f"master_addr={spec.master_addr} is this node itself on every node: the other nodes wait for a "
                          "store that is not there ('1/N clients joined', RendezvousTimeoutError)",
                          "node 0's hostname or data-plane IP (SLURM: scontrol show hostnames | head -n 1)", "D1; MN1"))
    if not multi and spec.kind in ("accelerate", "deepspeed") and spec.master_port in (None, launchers.DEFAULT_MASTER_PORT):
        t.append(trap("default-port-shared", "WARN", "master_port",
                      f"{spec.kind} uses port 29500 unless told otherwise: a second job on this node fails with "
                      "EADDRINUSE (or, with a c10d endpoint, silently joins the first job)",
                      "a distinct port per job (torchrun: --standalone picks a free one)", "D4"))
    if check_port and (not multi or (spec.master_addr and _LOOPBACK.match(spec.master_addr))) \
            and not (spec.kind == "torchrun" and spec.rdzv == "standalone" and spec.master_port is None):
        port = spec.master_port or launchers.DEFAULT_MASTER_PORT
        if not hostinfo.port_free(port):
            holders = ", ".join(f"{h['name']} (pid {h['pid']})" for h in hostinfo.port_holders(port)) or "another process"
            t.append(trap("port-in-use", "FAIL", "master_port", f"port {port} is taken on this machine by {holders}: "
                          "DistNetworkError ... EADDRINUSE", f"another port (free now: {hostinfo.free_port()})", "D4"))
    visible = env.get("CUDA_VISIBLE_DEVICES") or ""
    if re.fullmatch(r"\d+(,\d+)*", visible) and spec.nproc_per_node > len(visible.split(",")):
        t.append(trap("nproc-exceeds-gpus", "FAIL", "nproc_per_node",
                      f"{spec.nproc_per_node} ranks per node but CUDA_VISIBLE_DEVICES={visible} shows "
                      f"{len(visible.split(','))} GPU(s): local ranks {len(visible.split(','))}.. call set_device on "
                      "an ordinal that does not exist ('invalid device ordinal') or share a GPU",
                      f"nproc_per_node <= {len(visible.split(','))}, or list more GPUs in CUDA_VISIBLE_DEVICES", "D3"))
    elif spec.gpus_per_node is not None and spec.gpus_per_node > 0 and spec.nproc_per_node > spec.gpus_per_node:
        t.append(trap("nproc-exceeds-gpus", "FAIL", "nproc_per_node",
                      f"{spec.nproc_per_node} ranks per node on {spec.gpus_per_node} GPU(s): two ranks share a GPU "
                      "(NCCL: 'Duplicate GPU detected') or cuda:LOCAL_RANK does not exist ('invalid device ordinal')",
                      f"nproc_per_node <= {spec.gpus_per_node}", "D3"))
    if spec.kind == "accelerate" and spec.accelerate_cpu and spec.nproc_per_node * spec.nnodes > 1:
        t.append(trap("accelerate-cpu-one-process", "FAIL", "accelerate_cpu",
                      "accelerate launch --cpu --num_processes N starts ONE process",
                      "drop --cpu and export ACCELERATE_USE_CPU=1 with --multi_gpu (or Accelerator(cpu=True)): "
                      "N processes on gloo", sources.cite("D5", "PF-accelerate-cpu")))
    if spec.kind == "deepspeed" and multi and spec.node_rank is None:
        t.append(trap("deepspeed-ssh", "WARN", "node_rank",
                      "deepspeed --hostfile starts the other nodes over ssh/pdsh: where compute nodes refuse ssh it dies "
                      "with 'ssh exited with exit code 2'",
                      "start it on every node with --no_ssh --node_rank=i, or use srun + torchrun",
                      sources.cite("D6", "Gilbreth 4.3", "Gilbreth 8.12")))
    if (multi or slurm_kind) and spec.script.startswith("/tmp/"):
        t.append(trap("script-in-tmp", "FAIL", "script",
                      f"{spec.script} is node-local: the other nodes fail with \"can't open file '{spec.script}'\"",
                      "put the script on a shared filesystem ($HOME, /scratch)",
                      sources.cite("PF-slurm-node-tmp", "Gilbreth 8.12")))
    if slurm_kind and spec.srun_ntasks_per_node != 1:
        t.append(trap("srun-tasks-per-node", "FAIL", "srun_ntasks_per_node",
                      f"{spec.srun_ntasks_per_node} srun tasks per node each start a torchrun: "
                      f"{spec.srun_ntasks_per_node}x the agents, clashing node ranks and ports",
                      "--ntasks-per-node=1: torchrun spawns the node's ranks", sources.cite("Gilbreth 8.2")))
    if slurm_kind and multi and spec.node_rank is not None:
        t.append(trap("node-rank-fixed", "FAIL", "node_rank",
                      f"every node gets --node-rank={spec.node_rank}: $SLURM_NODEID was expanded once by the batch "
                      "shell (double quotes or an assignment before srun), so torchrun waits for nodes that never come",
                      "single-quote the srun task (bash -c '... --node-rank=$SLURM_NODEID ...') or use the c10d "
                      "rendezvous (no node rank)", sources.cite("Gilbreth 4.3")))
    if slurm_kind and spec.srun_export.split(",")[0].upper() == "NONE":
        t.append(trap("srun-export-none", "FAIL", "srun_export",
                      "--export=NONE starts the tasks without the batch shell's environment: MASTER_ADDR/MASTER_PORT, "
                      "the NCCL variables and PATH (the venv's torchrun) are missing",
                      "--export=ALL (and re-export the NCCL variables inside the task)",
                      sources.cite("Gilbreth 8.12")))
    tmp_args = [a for a in spec.script_args if a.split("=", 1)[-1].startswith("/tmp/")]
    if (multi or slurm_kind) and tmp_args:
        t.append(trap("args-in-tmp", "FAIL", "script_args",
                      f"{tmp_args[0]} is node-local: the other nodes cannot read it",
                      "put configs and data on a shared filesystem ($HOME, /scratch)",
                      sources.cite("PF-slurm-node-tmp", "Gilbreth 8.12")))
    t += _ifname_traps(spec)
    if spec.nnodes == 1 and (env.get("NCCL_P2P_DISABLE") == "1" or env.get("NCCL_SHM_DISABLE") == "1"):
        t.append(trap("single-node-net-transport", "WARN", "env.NCCL_P2P_DISABLE",
                      "with P2P/SHM disabled the GPUs of one node talk over the network transport: Init COMPLETE, then "
                      "the first collective times out where NET does not loop back",
                      "unset NCCL_P2P_DISABLE and NCCL_SHM_DISABLE (configs/nccl_single_node.env); where P2P itself "
                      "hangs (PCIe ACS/IOMMU) NCCL_P2P_LEVEL=NVL moves the pair to SHM",
                      sources.cite("Gilbreth 6.3")))
    if "NCCL_NET_DISABLE" in env:
        t.append(trap("nccl-net-disable-ignored", "WARN", "env.NCCL_NET_DISABLE",
                      "NCCL_NET_DISABLE is not an NCCL variable: NCCL ignores it, so it disables nothing (its only "
                      "such parameter is NCCL_NET_DISABLE_INTRA)",
                      "remove it; on one node keep NCCL_IB_DISABLE=1 NCCL_P2P_LEVEL=NVL NCCL_SHM_DISABLE=0 "
                      "(configs/nccl_single_node.env)", sources.cite("Gilbreth 4.1")))
    # on AWS EFA the inter-node transport is the aws-ofi-nccl network plugin (libfabric), not NCCL's IB verbs: there
    # NCCL_IB_DISABLE=1 is the usual setting and costs nothing
    # (https://docs.aws.amazon.com/AWSEC2/latest/UserGuide/efa-start-nccl.html)
    other_net = any(k.startswith(("FI_", "OFI_NCCL")) or k in ("NCCL_NET", "NCCL_NET_PLUGIN") for k in env) or any(
        re.search(r"amazon/efa|aws-ofi-nccl|libfabric", str(v)) for v in env.values())
    if multi and env.get("NCCL_IB_DISABLE") == "1" and not other_net:
        t.append(trap("multinode-ib-disabled", "WARN", "env.NCCL_IB_DISABLE",
                      "NCCL_IB_DISABLE=1 on a multi-node job: NCCL falls back to TCP sockets between the nodes without an "
                      "error (only NCCL_DEBUG=INFO's `Using network Socket` shows it), at a fraction of InfiniBand's speed",
                      "NCCL_IB_DISABLE=0 (configs/nccl_multi_node.env) where the nodes have InfiniBand; keep 1 only on "
                      "TCP-only clusters", sources.cite("Gilbreth 4.2", "Gilbreth 8.3")))
    if env.get("NCCL_ASYNC_ERROR_HANDLING") is not None:
        t.append(trap("deprecated-async-error-handling", "WARN", "env.NCCL_ASYNC_ERROR_HANDLING",
                      "NCCL_ASYNC_ERROR_HANDLING is the old name", "TORCH_NCCL_ASYNC_ERROR_HANDLING", "MN3"))
    if env.get("TORCH_NCCL_ASYNC_ERROR_HANDLING") == "0":
        t.append(trap("async-error-handling-off", "WARN", "env.TORCH_NCCL_ASYNC_ERROR_HANDLING",
                      "a timed-out NCCL collective no longer tears the job down: a dead rank leaves the rest hanging",
                      "unset it (or 1)", "MN3"))
    return sorted(t, key=lambda trap: SEVERITIES.index(trap.status), reverse=True)
