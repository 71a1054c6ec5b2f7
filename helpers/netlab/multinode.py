"""Multi-node ``torchrun`` on a lab: one launcher per node, run through :func:`helpers.jobs.run_commands`.

:class:`MultiNodeMixin` gives :class:`helpers.netlab.Lab` its ``torchrun_commands`` and ``launch``
methods; :func:`node_output` reads one node's launcher log back.  The rendezvous flags (c10d or
static form, seed D2) are built in :func:`rendezvous_flags` and the job directory is made in
:func:`_new_job_dir`: one place each.  Nothing runs at import.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from helpers import jobs, launchers
from helpers.jobdir import JobDir
from helpers.launchers import DEFAULT_MASTER_PORT
from helpers.validate import positive_int, tcp_port

FORMS = ("c10d", "static")


def rendezvous_flags(form: str, master: str, port: int, node_rank: int, rdzv_id: str,
                     rdzv_conf: str | None = None) -> list[str]:
    """The ``torchrun`` rendezvous flags of one node (seed D2).

    Args:
        form: ``"c10d"`` (``--rdzv-backend=c10d --rdzv-endpoint=<master>:<port> --rdzv-id``, node
            ranks assigned at rendezvous) or ``"static"`` (``--master-addr --master-port --node-rank``).
        master: host name of the rendezvous / master node.
        port: TCP port.
        node_rank: this node's rank (static form only).
        rdzv_id: c10d job id.
        rdzv_conf: ``--rdzv-conf`` value (c10d only), e.g. ``"join_timeout=20"``.

    Raises:
        ValueError: bad form, or ``rdzv_conf`` with the static form.
    """
    if form not in FORMS:
        raise ValueError(f"form={form!r}: accepted values are {', '.join(FORMS)}")
    if rdzv_conf and form != "c10d":
        raise ValueError("rdzv_conf: only the c10d form takes --rdzv-conf")
    # The one builder of torchrun's flags; the size flags (its first, --nnodes) come from jobs.launcher_argv.
    if form == "c10d":
        flags = launchers.torchrun_flags("c10d", nnodes="lab", nproc_per_node=None, master_addr=master, master_port=port,
                                         rdzv_id=rdzv_id, rdzv_conf=rdzv_conf)
    else:
        flags = launchers.torchrun_flags("static", nnodes="lab", nproc_per_node=None, master_addr=master,
                                         master_port=port, node_rank=node_rank)
    return flags[1:]


def _new_job_dir(name: str) -> Path:
    """A fresh job directory for a lab job (:func:`helpers.jobs.new_job_dir`)."""
    return jobs.new_job_dir(name)


class MultiNodeMixin:
    """The multi-node launching methods of :class:`helpers.netlab.Lab`."""

    if TYPE_CHECKING:  # provided by Lab
        nodes: int
        name: str

        def index(self, node: int | str) -> int: ...
        def hostname(self, node: int | str) -> str: ...
        def node_argv(self, node: int | str, argv: Sequence[str],
                      cwd: str | os.PathLike[str] | None = None) -> list[str]: ...
        def _complete(self) -> bool: ...

    def torchrun_commands(self, script: str | os.PathLike[str], args: Sequence[str] = (), nproc_per_node: int = 1,
                          form: str = "c10d", master_node: int | str = 0, nodes: Sequence[int | str] | None = None,
                          rdzv_conf: str | None = None, extra_args: Sequence[str] = (), port: int = DEFAULT_MASTER_PORT,
                          rdzv_id: str = "runbook-lab", log_dir: str | os.PathLike[str] | None = None,
                          cwd: str | os.PathLike[str] | None = None) -> list[list[str]]:
        """One ``torchrun`` command per node, each wrapped by :meth:`node_argv` (rank script under the rank shim).

        Args:
            script, args: the rank script and its arguments.
            nproc_per_node: ranks per node.
            form: ``"c10d"`` or ``"static"``: see :func:`rendezvous_flags`.
            master_node: the node whose hostname is the endpoint / MASTER_ADDR.
            nodes: the nodes to start (default all); ``--nnodes`` is always the lab size, so
                starting fewer reproduces a node that never joins (MN1).
            rdzv_conf: ``--rdzv-conf`` value (c10d), e.g. ``"join_timeout=20"``.
            extra_args: more torchrun flags (before the script).
            port: rendezvous / master port.
            rdzv_id: c10d job id.
            log_dir: torchrun ``--log-dir`` base; each node gets ``<log_dir>/nodeI``.
            cwd: working directory inside the nodes (default: the project root, as
                :func:`helpers.jobs.run_commands` uses).

        Returns:
            ``[argv of node a, argv of node b, ...]`` in the order of ``nodes``.

        Raises:
            ValueError: bad form, node, nproc_per_node or port; ``script`` missing.
        """
        if form not in FORMS:
            raise ValueError(f"form={form!r}: accepted values are {', '.join(FORMS)}")
        positive_int(nproc_per_node, "nproc_per_node")
        tcp_port(port, "port")
        if not Path(script).is_file():
            raise ValueError(f"script={str(script)!r}: file not found")
        master = self.hostname(master_node)
        chosen = [self.index(n) for n in (range(self.nodes) if nodes is None else nodes)]
        if not chosen or len(set(chosen)) != len(chosen):
            raise ValueError(f"nodes={nodes!r}: give distinct nodes of this lab, at least one")
        cmds = []
        for i in chosen:
            rdzv = rendezvous_flags(form, master, port, i, rdzv_id, rdzv_conf)
            launcher = jobs.launcher_argv("torchrun", Path(script).resolve(), args, nproc=nproc_per_node,
                                          nnodes=self.nodes, launcher_args=[*rdzv, *map(str, extra_args)],
                                          standalone=False,
                                          log_dir=Path(log_dir) / f"node{i}" if log_dir else None)[0]
            cmds.append(self.node_argv(i, launcher, cwd=jobs.project_root() if cwd is None else cwd))
        return cmds

    def launch(self, script: str | os.PathLike[str], args: Sequence[str] = (), *, nproc_per_node: int = 1,
               form: str = "c10d", master_node: int | str = 0, nodes: Sequence[int | str] | None = None,
               rdzv_conf: str | None = None, extra_args: Sequence[str] = (), port: int = DEFAULT_MASTER_PORT,
               per_node_env: Mapping[int | str, Mapping[str, str | None]] | None = None, name: str = "lab-job",
               timeout_s: float = 60.0, **run_kwargs: Any) -> jobs.JobResult:
        """Run a multi-node ``torchrun`` job on the lab through :func:`helpers.jobs.run_commands`.

        One command per started node (see :meth:`torchrun_commands`).  Each node's launcher
        output is also copied to ``<job_dir>/nodes/nodeI.stdout`` and ``.stderr`` (the runner's
        ``launcher.stdout``/``.stderr`` hold all nodes merged; read one node with
        :func:`node_output`); torchrun's own logs go to ``<job_dir>/torchrun/nodeI``.  Ranks are
        global (``ranks[r]``), whatever node they ran on.

        Args:
            script, args, nproc_per_node, form, master_node, nodes, rdzv_conf, extra_args, port:
                see :meth:`torchrun_commands`.
            per_node_env: extra variables per node, keyed by index or hostname.
            name: job name.
            timeout_s: seconds (default 60; :func:`helpers.jobs.run_commands`).
            **run_kwargs: passed on to :func:`helpers.jobs.run_commands` (``stall_s``, ``env``,
                ``heartbeat``, ``echo``, ``verbose``, ...); ``verbose`` (default True) also
                prints one line about the nodes.

        Returns:
            The :class:`helpers.jobs.JobResult`; ``result.commands[k]`` is node ``nodes[k]``.

        Raises:
            RuntimeError: the lab is not up.  ValueError: bad arguments (see above).
            TypeError: ``run_kwargs`` names ``job_dir`` or ``per_process_env`` (set here).
        """
        if not self._complete():
            raise RuntimeError(f"lab {self.name!r} is not up: call up() first (or `runbook lab up`)")
        chosen = [self.index(n) for n in (range(self.nodes) if nodes is None else nodes)]
        job_dir = _new_job_dir(name)
        try:
            cmds = self.torchrun_commands(script, args, nproc_per_node, form, master_node, chosen, rdzv_conf,
                                          extra_args, port, rdzv_id=job_dir.name, log_dir=JobDir(job_dir).torchrun_dir)
        except ValueError:
            shutil.rmtree(job_dir, ignore_errors=True)
            raise
        layout = JobDir(job_dir)
        layout.nodes_dir.mkdir()
        wrapped = []
        for i, cmd in zip(chosen, cmds):
            out, err = layout.node_stdout(i), layout.node_stderr(i)
            tee = ('set -o pipefail; "$@" 2> >(tee -a ' + shlex.quote(str(err)) + " >&2) | tee -a "
                   + shlex.quote(str(out)))
            wrapped.append(["bash", "-c", tee, "lab-node", *cmd])
        per_env = None
        if per_node_env:
            keyed = {self.index(k): v for k, v in per_node_env.items()}
            per_env = [dict(keyed.get(i, {})) for i in chosen]
        if run_kwargs.get("verbose", True):
            print(f"[{name}] lab {self.name!r}: nodes {', '.join(self.hostname(i) for i in chosen)} of {self.nodes}, "
                  f"{nproc_per_node} rank(s) each, {form} rendezvous at {self.hostname(master_node)}:{port}; "
                  f"per-node logs {job_dir / 'nodes'}/nodeI.stdout|.stderr")
        return jobs.run_commands(wrapped, timeout_s=timeout_s, name=name, job_dir=job_dir, per_process_env=per_env,
                                 **run_kwargs)


def node_output(result: jobs.JobResult, node: int | str) -> str:
    """The launcher output (stdout then stderr) of one node of a :meth:`Lab.launch` job ("" if it did not run)."""
    i = int(node) if isinstance(node, int) else int(re.sub(r"^.*node", "", str(node)))
    base = result.job_dir / "nodes" / f"node{i}"
    return "".join(p.read_text(errors="replace") for p in (base.with_suffix(".stdout"), base.with_suffix(".stderr"))
                   if p.exists())
