"""The ``runbook`` command line.

``runbook diagnose`` executes ``notebooks/00_allocation_check.ipynb`` with papermill into a
fresh ``build/reports/<host>-<timestamp>/`` and prints one ``[OK]``/``[WARN]``/``[FAIL]``
line per check.  Exit status: 0 when no check failed, 1 when one did, 2 when the notebook
itself could not run (a tool error) or a parameter was wrong (a user error): those never drain a node.
Beside ``report.json`` it writes ``drain.sh`` (one ``scontrol ... state=drain`` line per faulty node) and
``junit.xml``; ``--apply`` runs the drain lines.  ``--tier prolog|quick|full`` picks the depth
(``helpers.allocation.tiers``); ``runbook health-check --contract FILE [--drain]`` is the prolog tier alone,
the entry of ``configs/slurm/healthcheck.sh`` (SLURM's HealthCheckProgram) and ``configs/slurm/prolog.sh``.

``runbook doctor --pid PID`` (a torchrun/launcher pid on this node) or ``--job-dir DIR`` (a
runner job that hung) prints which rank diverged, the collective the others wait in and the
source line (``helpers.doctor``).  Exit status 0 when a verdict was printed, 2 otherwise.

``runbook nccl-log FILE...`` reads ``NCCL_DEBUG=INFO`` output (any ranks and hosts interleaved) and
prints a per-rank table (host, interface, transports, Init COMPLETE) and verdicts such as a job bound
to ``docker0`` or a single-node job using the IB transport (``helpers.nccl_log``).  Exit status 1 on
a FAIL verdict.

``runbook lint train.py ds_config.json job.sbatch [--command "torchrun ..."]`` checks a training
script, its DeepSpeed/Accelerate configs and its launch script together before launch
(``helpers.lint``, docs/lint.md).  Exit status 1 on an error-level finding.

``runbook lab up [--nodes N] [--slurm] | down | status | exec NODE -- CMD`` brings up the network lab: N "nodes", each a network
namespace with its own hostname, joined by a bridge in a namespace of its own (``helpers.netlab``).
``runbook preflight --lab`` (or ``--nodes a,b --runner srun``) checks interfaces, ``*_SOCKET_IFNAME``,
the MTU the path really carries and the master address on every node, and names the faulty node
(``helpers.preflight``).  Exit status 1 on a FAIL.

``runbook estimate-memory --params 1.3e9 --world-size 8 --strategy zero2`` prints the model-state
bytes per rank by component (``helpers.memory``; ``runbook estimate-memory --help``).

``runbook build --launcher srun+torchrun --nodes 2 --nproc-per-node 8 train.py --env NCCL_DEBUG=INFO``
prints the command (or the ``srun`` lines, or a whole ``sbatch`` script with ``--launcher sbatch``)
and its known traps: the command builder of chapter 01 without JupyterLab (``helpers.launch_traps``).
``runbook build --check "<command>"`` / ``--check-file job.sbatch`` reads an existing command or batch
script (``helpers.launch_parse``) and lists its traps.  Exit status 1 on a FAIL trap.

Exit statuses, for every command: 0 OK, 1 a FAIL was found, 2 bad input or the check could not run
(argparse also exits 2 on a bad flag, naming it); 141 when stdout was closed early (``| head``), as a
program killed by SIGPIPE.

Adding a command (the protocol of accelerate's ``commands/estimate.py``):

1. Write ``<verb>_parser(subparsers=None) -> argparse.ArgumentParser`` here: it calls
   :func:`_parser` (a sub-command of ``runbook`` when ``subparsers`` is given, else a standalone
   ``runbook <verb>`` parser) and adds the flags.  Validate flags with an argparse ``type`` built
   from :mod:`helpers.validate` (see :func:`positive_int_arg`) so that the error names the flag.
2. Write ``<verb>(args: argparse.Namespace) -> int``: call the domain module's plain functions,
   print, and return the exit status above.  Import heavy modules inside it, not at the top:
   ``runbook --help`` builds every parser.
3. Append ``Command("<verb>", <verb>_parser, <verb>)`` to :data:`COMMANDS`; :func:`build_parser`
   registers it and sets ``func``.  Domain modules keep no argparse code.

Every command's parser and handler live here; the domain modules (``nccl_log``, ``lint``, ``netlab``,
``preflight``, ``memory``...) keep plain functions only.
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import shlex
import socket
import sys
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple, NoReturn

from helpers import jobs, launchers, validate
from helpers.slurm import RUNNERS

NOTEBOOK_00 = "00_allocation_check.ipynb"


class Command(NamedTuple):
    """One ``runbook`` sub-command: its name, its parser builder and its handler (see the module docstring)."""

    name: str
    add_parser: Callable[..., argparse.ArgumentParser]
    run: Callable[[argparse.Namespace], int]


class RunbookParser(argparse.ArgumentParser):
    """``argparse.ArgumentParser`` whose errors are one line: ``runbook <verb>: error: MESSAGE (see ... --help)``.

    argparse's own ``error`` prints the whole usage block before the message; the one line names the
    flag and where the usage is.  Exits with status 2, as argparse does.
    """

    def error(self, message: str) -> NoReturn:  # noqa: D102 - argparse's hook
        self.exit(2, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def plain(text: str) -> str:
    """Docstring markup removed for ``--help``: ``:func:`x``` -> ``x``, double backquotes -> one."""
    import re

    text = re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", text)
    return text.replace("``", "`")


def _parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser] | None, name: str, summary: str,
            description: str | None = None) -> argparse.ArgumentParser:
    """The parser of ``runbook <name>``: registered on ``subparsers``, or standalone when it is None.

    ``summary`` is the one line of ``runbook --help``; ``description`` (default: ``summary``) heads
    ``runbook <name> --help`` and keeps its line breaks when it has several lines (a module docstring,
    shown without its markup: :func:`plain`).  Both are :class:`RunbookParser` (one-line errors).
    """
    description = plain(description or summary)
    formatter = argparse.RawDescriptionHelpFormatter if "\n" in description else argparse.HelpFormatter
    if subparsers is None:
        return RunbookParser(prog=f"runbook {name}", description=description, formatter_class=formatter)
    return subparsers.add_parser(name, help=summary, description=description, formatter_class=formatter)


def positive_int_arg(flag: str, minimum: int = 1) -> Callable[[str], int]:
    """An argparse ``type`` for a whole number >= ``minimum`` whose error names ``flag``.

    Returns:
        A callable ``str -> int``; it raises ``argparse.ArgumentTypeError`` with
        :func:`helpers.validate.positive_int`'s message (``--nproc=0: must be an integer >= 1``).
    """
    def parse(text: str) -> int:
        try:
            return validate.positive_int(int(text), flag, minimum)
        except ValueError as exc:
            msg = str(exc) if str(exc).startswith(flag) else f"{flag}={text!r}: must be an integer >= {minimum}"
            raise argparse.ArgumentTypeError(msg) from None

    parse.__name__ = flag.lstrip("-").replace("-", "_")
    return parse


def positive_float_arg(flag: str) -> Callable[[str], float]:
    """An argparse ``type`` for a finite number > 0 (``0``, ``nan``, ``inf`` refused) whose error names ``flag``.

    Returns:
        A callable ``str -> float``; it raises ``argparse.ArgumentTypeError`` with
        :func:`helpers.validate.positive_float`'s message (``--timeout-s=0.0: must be a finite number > 0``).
    """
    def parse(text: str) -> float:
        try:
            return validate.positive_float(float(text), flag)
        except ValueError as exc:
            msg = str(exc) if str(exc).startswith(flag) else f"{flag}={text[:40]!r}: must be a finite number > 0"
            raise argparse.ArgumentTypeError(msg) from None

    parse.__name__ = flag.lstrip("-").replace("-", "_")
    return parse


# ---------------------------------------------------------------- diagnose

def _literal(text: str) -> object:
    """Parse ``-p`` values as Python literals (``2``, ``0.5``, ``"x"``), falling back to the raw string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def diagnose_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser] | None = None
                    ) -> argparse.ArgumentParser:
    """The ``runbook diagnose`` parser (the allocation check, notebook 00)."""
    p = _parser(subparsers, "diagnose", "run the allocation check (notebook 00) and write a report")
    p.add_argument("--backend", choices=jobs.BACKENDS, default="auto")
    p.add_argument("--nproc", type=positive_int_arg("--nproc"), default=None,
                   help="ranks per node (default: the visible GPUs, capped by SLURM_GPUS_ON_NODE; 2 without a GPU)")
    p.add_argument("--timeout-s", type=float, default=30.0, help="collective timeout per job, seconds")
    p.add_argument("--max-bytes", type=int, default=None, help="largest message of the bandwidth sweep, bytes")
    p.add_argument("--out-dir", default=None, help="where report folders go (default build/reports)")
    p.add_argument("--kernel", default="python3", help="Jupyter kernel to run the notebook with")
    p.add_argument("--cell-timeout-s", type=float, default=900.0, help="papermill per-cell limit, seconds")
    p.add_argument("-p", "--param", nargs=2, action="append", metavar=("NAME", "VALUE"),
                   help="override a notebook parameter (repeatable), e.g. -p SMOKE_STEPS 50")
    p.add_argument("--nodes", default=None,
                   help="comma-separated nodes to check across (default: the SLURM allocation's node list)")
    p.add_argument("--runner", choices=[r for r in RUNNERS if r != "local"], default=None,
                   help="how to reach --nodes: srun (SLURM, default) or lab (the SLURM lab --lab-name)")
    p.add_argument("--lab-name", default=None, help="the SLURM lab for --runner lab")
    p.add_argument("--ranks-per-node", type=positive_int_arg("--ranks-per-node"), default=None,
                   help="ranks per node of the job across nodes (default --nproc)")
    p.add_argument("--apply", action="store_true",
                   help="run the report's drain.sh (scontrol update ... state=drain) for the faulty nodes; never the default")
    p.add_argument("--tier", choices=("prolog", "quick", "full"), default="quick",
                   help="prolog: this node's contract in seconds (no job); quick: the check across nodes with the "
                        "group-testing localisation (default); full: + the network pre-flight and the long runs")
    p.add_argument("--contract", default=None, help="the node contract JSON of --tier prolog (configs/slurm/node_contract.example.json)")
    return p


def diagnose(args: argparse.Namespace) -> int:
    """Run the allocation check notebook under papermill; print its report; return the exit status."""
    import papermill

    from helpers import provenance
    from helpers.allocation import operators, tiers
    from helpers.allocation.local import allocation_nodes, default_nproc, new_report_dir, open_client
    from helpers.allocation.params import notebook_defaults, validate
    from helpers.checks import Check

    if args.tier == "prolog":
        return health_check(argparse.Namespace(contract=args.contract, drain=args.apply, node=None, json=False))
    nproc = default_nproc() if args.nproc is None else args.nproc
    given: dict[str, object] = {"BACKEND": args.backend, "NPROC": nproc, "TIMEOUT_S": args.timeout_s}
    if args.max_bytes is not None:
        given["MAX_BYTES"] = args.max_bytes
    for name, value in args.param or []:
        given[name] = _literal(value)
    params = tiers.tier_params(args.tier, given)
    for flag, name in (("nodes", "PREFLIGHT_NODES"), ("runner", "PREFLIGHT_RUNNER"), ("lab_name", "PREFLIGHT_LAB"),
                       ("ranks_per_node", "RANKS_PER_NODE")):
        if getattr(args, flag, None) is not None:
            params[name] = getattr(args, flag)
    source = jobs.project_root() / "notebooks" / NOTEBOOK_00
    try:  # an input error before any job starts (issue 11: -p MAX_BYTES -5 used to read as a broken allocation)
        validate(params, notebook_defaults(source))
        nodes = allocation_nodes(str(params.get("PREFLIGHT_NODES", "")))
    except ValueError as exc:
        print(f"runbook diagnose: {exc}", file=sys.stderr)
        print(operators.user_error("user.error", str(exc)).line(), file=sys.stderr)
        return 2
    if nodes and socket.gethostname().split(".")[0] not in nodes:
        print(f"runbook diagnose: WARNING: this host ({socket.gethostname()}) is not one of the allocation's nodes "
              f"({', '.join(nodes)}): the single-node jobs are skipped, the checks run on the nodes through SLURM",
              file=sys.stderr)
    report_dir = new_report_dir(args.out_dir).resolve()  # the notebook runs in notebooks/; nodes write there too
    params["REPORT_DIR"] = str(report_dir)
    executed = report_dir / NOTEBOOK_00
    print(f"runbook diagnose: {source.name} -> {report_dir}", flush=True)
    t0 = time.monotonic()
    try:
        papermill.execute_notebook(str(source), str(executed), parameters=params, cwd=str(source.parent),
                                   kernel_name=args.kernel, progress_bar=False,
                                   execution_timeout=args.cell_timeout_s)
    except papermill.PapermillExecutionError as exc:
        broke = operators.tool_error("tool.notebook", f"the notebook stopped in cell {exc.exec_count}: {exc.ename}: "
                                     f"{exc.evalue}", f"read the executed copy {executed}")
        print(broke.line(), file=sys.stderr)
        operators.write_outputs(report_dir, [broke], time_s=time.monotonic() - t0)  # drain.sh drains nothing
        return 2
    finally:
        if executed.exists():
            provenance.stamp(executed, "runbook diagnose")  # where and when it ran (the book prints it)
    data = json.loads((report_dir / "report.json").read_text())
    checks = [Check.from_dict(c) for c in data["checks"]]
    for check in checks:
        print(check.line())
    drain = (data.get("allocation") or {}).get("drain") or {}
    if drain.get("exclude"):
        print(f"drain list: {drain['exclude']}   (add it to the next sbatch/salloc)")
    written = operators.write_outputs(report_dir, checks, time_s=time.monotonic() - t0)
    to_drain = operators.drain_commands(checks)
    print(f"{written['drain']}: {len(to_drain)} node(s) to drain" + ("" if args.apply or not to_drain else
                                                                   " (run it, or rerun with --apply)"))
    if args.apply and to_drain:
        client = open_client(str(params.get("PREFLIGHT_RUNNER", "srun")), str(params.get("PREFLIGHT_LAB", "")))
        for done in operators.apply(client, checks):
            print(f"drained {done['node']}: {done['reason']}" if done["returncode"] == 0 else
                  f"could not drain {done['node']} (exit {done['returncode']}): {done['stderr']}")
    print(f"{data['status']}: {len(data['checks'])} checks in {time.monotonic() - t0:.1f} s wall; "
          f"report: {report_dir / 'report.md'}")
    return operators.exit_status(checks)


# ---------------------------------------------------------------- health-check

def health_check_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser] | None = None
                        ) -> argparse.ArgumentParser:
    """The ``runbook health-check`` parser (the prolog tier on this node; SLURM's HealthCheckProgram and Prolog)."""
    p = _parser(subparsers, "health-check", "the prolog tier: this node's contract in seconds, drain it when broken")
    p.add_argument("--contract", default=None, help="the node contract JSON (configs/slurm/node_contract.example.json)")
    p.add_argument("--drain", action="store_true",
                   help="drain this node (scontrol update nodename=NODE state=drain reason=...) on a node problem; "
                        "never for a tool error")
    p.add_argument("--node", default=None, help="this node's SLURM name (default $SLURMD_NODENAME, else the hostname)")
    p.add_argument("--json", action="store_true", help="print the records as JSON")
    return p


def health_check(args: argparse.Namespace) -> int:
    """Run :func:`helpers.allocation.tiers.health_check`; print one line per record and a summary; return its status."""
    from helpers.allocation import tiers
    from helpers.checks import to_json

    t0 = time.monotonic()
    checks, status, drained = tiers.health_check(args.contract, drain=args.drain, node=args.node)
    if args.json:
        print(json.dumps(to_json(checks, status=status, drained=drained), indent=2))
    else:
        for check in checks:
            print(check.line())
        for done in drained:
            print(f"drained {done['node']}: {done['reason']}" if done["returncode"] == 0 else
                  f"could not drain {done['node']} (exit {done['returncode']}): {done['stderr']}")
        print(tiers.summary_line(checks, status, time.monotonic() - t0))
    return status


# ---------------------------------------------------------------- doctor

def doctor_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser] | None = None
                  ) -> argparse.ArgumentParser:
    """The ``runbook doctor`` parser (``--pid``, ``--job-dir`` and/or ``--fr-dir``)."""
    d = _parser(subparsers, "doctor", "name the rank that diverged in a hung job")
    where = d.add_mutually_exclusive_group()
    where.add_argument("--pid", type=int, help="pid of the launcher (torchrun, deepspeed...) on this node")
    where.add_argument("--job-dir", help="a runner job directory with stacks/ (and fr/, trace/)")
    d.add_argument("--fr-dir", help="a folder of torch Flight Recorder dumps (<prefix><rank>, pickle or JSON); alone or with "
                   "--pid/--job-dir (docs/hang-doctor.md)")
    where.add_argument("--slurm-job", metavar="JOBID", help="a running SLURM job: stacks and dumps from every node "
                       "(srun --overlap --jobid JOBID)")
    where.add_argument("--lab", metavar="NAME", help="a job on the network lab NAME: stacks and dumps from every lab node")
    d.add_argument("--stacks", action="store_true", help="also print each rank's innermost frames")
    return d


def doctor(args: argparse.Namespace) -> int:
    """Print the hang doctor's verdict for a live launcher pid or a saved job directory (0; 2 on bad input)."""
    from helpers import doctor as doc

    if args.pid is None and args.job_dir is None and args.fr_dir is None and not args.slurm_job and not args.lab:
        print("runbook doctor: give --pid, --job-dir, --fr-dir, --slurm-job or --lab", file=sys.stderr)
        return 2
    try:
        if args.slurm_job:
            verdict = doc.diagnose_slurm_job(args.slurm_job)
        elif args.lab:
            verdict = doc.diagnose_lab(args.lab)
        elif args.pid is not None:
            verdict = doc.diagnose_pid(args.pid, fr_dir=args.fr_dir)
        elif args.job_dir is not None:
            verdict = doc.diagnose_job_dir(args.job_dir, fr_dir=args.fr_dir)
        else:
            verdict = doc.diagnose_fr(doc.load_fr(args.fr_dir))
    except ValueError as exc:  # one line per problem (every unreadable file is named)
        for line in str(exc).splitlines() or ["bad input"]:
            print(f"runbook doctor: {line}", file=sys.stderr)
        return 2
    print(verdict.text)
    if args.stacks:
        for rank, state in verdict.states.items():
            print(f"--- rank {rank}: " + " <- ".join(f"{f.func} ({f.site})" for f in state.frames[:8]))
    return 0


# ---------------------------------------------------------------- nccl-log

def nccl_log_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser] | None = None
                    ) -> argparse.ArgumentParser:
    """The ``runbook nccl-log FILE... [--json]`` parser (``-`` reads stdin)."""
    from helpers import nccl_log as nl

    p = _parser(subparsers, "nccl-log", "interpret NCCL_DEBUG=INFO logs: per-rank table and verdicts",
                (nl.__doc__ or "").split("\n\n")[0])
    p.add_argument("files", nargs="+", metavar="FILE", help="NCCL_DEBUG=INFO log(s); several = one job; - = stdin")
    p.add_argument("--json", action="store_true",
                   help='print {"checks": [...], "log": {...}}: the verdicts as check records and the per-rank summary (bounded)')
    return p


def nccl_log(args: argparse.Namespace) -> int:
    """Parse, interpret and print NCCL logs (``helpers.nccl_log``).

    The cyclic garbage collector is off for the whole command (:func:`helpers.nccl_log.collector_paused`): the parsed
    log (a record per rank, about 600,000 objects for the 32,000 ranks of a 200 MB log) makes no reference cycles and
    lives until the command returns, so each collection would only walk it again (about 1 s of the 200 MB benchmark,
    ``benchmarks/bench_nccl_big.py``).

    Returns:
        2 when an input could not be read (one line per unreadable input on stderr; the others are
        still interpreted), else 1 on a FAIL verdict, else 0.
    """
    from helpers import nccl_log as nl

    with nl.collector_paused():
        problems: list[str] = []
        try:
            log = nl.parse_files(args.files, problems=problems)
        except ValueError as exc:
            for line in problems or [str(exc)]:
                print(f"nccl-log: {line}", file=sys.stderr)
            return 2
        for line in problems:
            print(f"nccl-log: {line}", file=sys.stderr)
        verdicts = nl.interpret(log)
        if args.json:
            print(json.dumps(nl.to_json(log, verdicts), indent=1))
        else:
            print(nl.render(log, verdicts), end="")
        if problems:
            return 2
        return 1 if any(v.status == "FAIL" for v in verdicts) else 0


# ---------------------------------------------------------------- lint

def lint_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser] | None = None) -> argparse.ArgumentParser:
    """The ``runbook lint PATH... [--command CMD] [--json]`` parser (docs/lint.md)."""
    p = _parser(subparsers, "lint", "check scripts, DeepSpeed/Accelerate configs and sbatch files before launch",
                "Lint training scripts, DeepSpeed JSON, Accelerate YAML and sbatch/shell launch scripts together "
                "(docs/lint.md). Exit 1 on an error, 2 on unreadable input, 0 otherwise.")
    p.add_argument("paths", nargs="*", help="files: *.py, DeepSpeed *.json, Accelerate *.yaml, *.sbatch/*.sh")
    p.add_argument("--command", default=None, help="a launch command to check too (torchrun/accelerate/deepspeed/srun ...)")
    p.add_argument("--json", action="store_true", help='print {"checks": [...]}: every finding as a check record (id = rule, file, line_no, status...)')
    return p


def lint(args: argparse.Namespace) -> int:
    """Lint ``args.paths`` (and ``args.command``) with :func:`helpers.lint.lint_paths`; print text or JSON.

    Returns:
        2 when an input is unreadable (named on stderr; the other files are still linted), else 1
        when an error-level finding exists, else 0.
    """
    from helpers.checks import LINT_WORDS, lint_line, to_json
    from helpers.lint import UNREADABLE, lint_paths

    if not args.paths and not args.command:
        print("runbook lint: give files to lint and/or --command", file=sys.stderr)
        return 2
    findings = lint_paths(args.paths, command=args.command)
    for f in findings:
        if f.id == UNREADABLE:
            print(f"runbook lint: {f.title}", file=sys.stderr)
    rest = [f for f in findings if f.id != UNREADABLE]
    if args.json:
        print(json.dumps(to_json(findings), indent=2))
    else:
        for f in rest:
            print(lint_line(f))
        counts = {s: sum(LINT_WORDS[f.status] == s for f in rest) for s in ("error", "warning", "info")}
        print(f"{len(rest)} finding(s): {counts['error']} error, {counts['warning']} warning, {counts['info']} info")
    if any(f.id == UNREADABLE for f in findings):
        return 2
    return 1 if any(f.status == "FAIL" for f in findings) else 0


# ---------------------------------------------------------------- lab

def lab_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser] | None = None
               ) -> argparse.ArgumentParser:
    """The ``runbook lab`` parser: ``up [--nodes N] [--subnet S] [--private-tmp] [--slurm] | down | status |
    exec NODE -- CMD...``, each with ``--name``."""
    from helpers import netlab

    p = _parser(subparsers, "lab", "the network lab: N namespace 'nodes' behind one bridge (root)", netlab.__doc__)
    sub = p.add_subparsers(dest="lab_command", required=True)
    u = sub.add_parser("up", help="build the lab (idempotent)")
    u.add_argument("--nodes", type=int, default=2, choices=range(1, netlab.MAX_NODES + 1),
                   metavar=f"1..{netlab.MAX_NODES}")
    u.add_argument("--subnet", default=netlab.DEFAULT_SUBNET)
    u.add_argument("--private-tmp", action="store_true", help="a private tmpfs on /tmp in each node")
    u.add_argument("--slurm", action="store_true",
                   help="also start SLURM: slurmctld + munged on a head node, one slurmd per node (needs slurm-wlm, munge)")
    sub.add_parser("down", help="remove the lab, its processes and mounts")
    sub.add_parser("status", help="show what exists")
    e = sub.add_parser("exec", help="run a command inside a lab node (head = the SLURM head node): exec NODE -- CMD ...")
    e.add_argument("node", help="node0, node1, ... (or head with --slurm), or the node's index")
    e.add_argument("argv", nargs=argparse.REMAINDER, help="the command (after --)")
    e.add_argument("--timeout-s", type=float, default=600.0, help="kill the command after this many seconds")
    for action_parser in sub.choices.values():
        action_parser.add_argument("--name", default=netlab.DEFAULT_NAME, help=f"lab name (default {netlab.DEFAULT_NAME})")
    return p


def lab(args: argparse.Namespace) -> int:
    """Bring the lab up, down, or print its status (0; 2 when the lab cannot be built here)."""
    from helpers import netlab

    if args.lab_command == "up":
        ok, why = netlab.lab_available()
        if not ok:
            print(f"runbook lab: {why}", file=sys.stderr)
            return 2
        t0 = time.monotonic()
        built = netlab.up(args.nodes, args.name, args.subnet, args.private_tmp, slurm=args.slurm)
        print(f"lab {built.name!r} up in {time.monotonic() - t0:.2f} s; enter a node with: "
              f"{shlex.join(built.node_argv(0, ['bash']))}")
        print(netlab.format_status(built.status()))
        return 0
    if args.lab_command == "exec":
        argv = args.argv[1:] if args.argv[:1] == ["--"] else args.argv
        if not argv:
            print("runbook lab exec: give the command after --, e.g. runbook lab exec head -- sinfo", file=sys.stderr)
            return 2
        node: int | str = int(args.node) if args.node.isdigit() else args.node
        try:
            res = netlab.Lab.attach(args.name).run(node, argv, timeout_s=args.timeout_s)
        except (ValueError, RuntimeError) as exc:
            print(f"runbook lab exec: {exc}", file=sys.stderr)
            return 2
        sys.stdout.write(res.stdout)
        sys.stderr.write(res.stderr)
        return res.returncode
    if args.lab_command == "down":
        res = netlab.down(args.name)
        print(f"lab {args.name!r} down in {res['seconds']:.2f} s: removed {len(res['namespaces'])} namespace(s), "
              f"killed {len(res['killed'])} process(es)")
        return 0
    print(netlab.format_status(netlab.status(args.name)))
    return 0


# ---------------------------------------------------------------- preflight

def preflight_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser] | None = None
                     ) -> argparse.ArgumentParser:
    """The ``runbook preflight`` parser.

    ``runbook preflight [--lab] [--name rb] [--env NAME=VALUE ...]`` checks the running network lab;
    ``runbook preflight --nodes a,b --runner srun`` checks real nodes (from inside an allocation;
    MASTER_ADDR, MASTER_PORT and *_SOCKET_IFNAME are taken from the environment, ``--env``
    overrides).
    """
    from helpers import netlab, preflight

    p = _parser(subparsers, "preflight", "network pre-flight check across the nodes (IFNAME, MTU, master)",
                preflight.__doc__)
    where = p.add_mutually_exclusive_group()
    where.add_argument("--lab", action="store_true",
                       help="check the running network lab (default outside a multi-node SLURM allocation)")
    where.add_argument("--nodes", help="comma-separated node names (real nodes; see --runner; default inside a "
                       "multi-node SLURM allocation: its node list)")
    p.add_argument("--runner", choices=[r for r in RUNNERS if r != "lab"], default="srun",
                   help="how to reach --nodes: srun (SLURM, default) or local (this host is the one node)")
    p.add_argument("--name", default=netlab.DEFAULT_NAME, help=f"lab name (default {netlab.DEFAULT_NAME})")
    p.add_argument("--env", action="append", metavar="NAME=VALUE",
                   help="a job variable (MASTER_ADDR, MASTER_PORT, NCCL_SOCKET_IFNAME, GLOO_SOCKET_IFNAME); repeat")
    p.add_argument("--master", default=None, help="the node that runs rank 0 (default: the first node)")
    p.add_argument("--timeout-s", type=positive_float_arg("--timeout-s"), default=15.0,
                   help="limit per command on a node, seconds (> 0)")
    p.add_argument("--json", action="store_true", help="print the records as JSON")
    return p


def preflight(args: argparse.Namespace) -> int:
    """Run ``helpers.preflight.run_preflight`` on the lab or ``--nodes``: 0 no FAIL, 1 a FAIL, 2 could not run."""
    from helpers import envvars, netlab
    from helpers import preflight as pf
    from helpers.checks import to_json, worst

    try:
        extra = envvars.parse_pairs(args.env)
    except ValueError as exc:
        print(f"runbook preflight: {exc}", file=sys.stderr)
        return 2
    from helpers.allocation.local import allocation_nodes, open_client

    if not args.nodes and not args.lab:  # inside a multi-node allocation: its nodes, not the lab (issue 11)
        try:
            args.nodes = ",".join(allocation_nodes(""))
        except ValueError as exc:
            print(f"runbook preflight: {exc}", file=sys.stderr)
            return 2
    if args.nodes:
        nodes = [n for n in args.nodes.split(",") if n]
        runner = open_client(args.runner)
        env = {k: os.environ[k] for k in ("MASTER_ADDR", "MASTER_PORT", *pf.IFNAME_VARS) if k in os.environ}
    else:
        try:
            attached = netlab.Lab.attach(args.name)
        except ValueError as exc:
            print(f"runbook preflight: {exc}; start it with `runbook lab up`", file=sys.stderr)
            return 2
        if not attached.is_up():
            print(f"runbook preflight: lab {args.name!r} is incomplete: run `runbook lab up`", file=sys.stderr)
            return 2
        nodes, runner, env = attached.hostnames, attached, {}
    env.update(extra)
    t0 = time.monotonic()
    try:
        checks = pf.run_preflight(nodes, runner, env, master=args.master, timeout_s=args.timeout_s)
    except ValueError as exc:
        print(f"runbook preflight: {exc}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps(to_json(checks), indent=1, default=str))
    else:
        print(pf.format_checks(checks))
        print(f"({len(nodes)} node(s), {time.monotonic() - t0:.1f} s)")
    return 1 if worst(checks) == "FAIL" else 0


# ---------------------------------------------------------------- estimate-memory

MAX_WORLD_SIZE = 10**7
"""The largest ``--world-size`` accepted (ten times the GPUs of the largest clusters built so far)."""


def _count_arg(text: str) -> int:
    """argparse ``type`` of ``--params``: :func:`helpers.memory.parse_count` (``8.3B``, ``7e9``, ``1.5M``)."""
    from helpers import memory

    try:
        return memory.parse_count(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _world_size_arg(text: str) -> int:
    """argparse ``type`` of ``--world-size``: a whole number in 1 .. :data:`MAX_WORLD_SIZE`."""
    n = positive_int_arg("--world-size")(text)
    if n > MAX_WORLD_SIZE:
        raise argparse.ArgumentTypeError(f"--world-size={text!r}: more than {MAX_WORLD_SIZE:,} ranks")
    return n


_GPU_UNITS = {"": 2**30, "g": 2**30, "gib": 2**30, "gb": 10**9, "m": 2**20, "mib": 2**20, "mb": 10**6,
              "t": 2**40, "tib": 2**40, "tb": 10**12}


def _gpu_memory_arg(text: str) -> int:
    """argparse ``type`` of ``--gpu-memory``: ``80`` or ``80GiB`` (GiB), ``80GB`` (10^9 bytes), ``81559MiB``; bytes.

    A bare number is GiB, the unit ``torch.cuda.get_device_properties().total_memory`` is usually read in.
    """
    import re

    m = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([A-Za-z]*)\s*", text)
    unit = m.group(2).lower() if m else None
    if not m or unit not in _GPU_UNITS or not 0 < float(m.group(1)) * _GPU_UNITS[unit] <= 2**50:
        raise argparse.ArgumentTypeError(f"--gpu-memory={text!r}: expected the memory of one GPU such as 80, "
                                         "80GiB, 80GB or 40960MiB (a bare number is GiB)")
    return int(float(m.group(1)) * _GPU_UNITS[unit])


def _visible_gpu_memory() -> int | None:
    """Bytes of memory of this machine's first GPU from ``nvidia-smi`` (no torch import), or None without one."""
    import shutil
    import subprocess

    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=memory.total", "--format=csv,noheader,nounits"], capture_output=True,
                             text=True, timeout=10, check=True).stdout.split()
        return int(out[0]) * 2**20 if out else None  # nvidia-smi reports MiB
    except (OSError, subprocess.SubprocessError, ValueError):
        return None


def estimate_memory_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser] | None = None
                           ) -> argparse.ArgumentParser:
    """The ``runbook estimate-memory`` parser (``--params`` and ``--world-size`` required; every strategy by default)."""
    from helpers import memory

    p = _parser(subparsers, "estimate-memory", "bytes per rank of params, grads and optimizer states (DDP, ZeRO, FSDP)",
                "Bytes of parameters, gradients and optimizer states per rank for each data-parallel strategy\n"
                "(ZeRO paper formulas; DDP adds its gradient buckets), whether that fits on one GPU, and the\n"
                "activations of a transformer when its shape is given.  Example:\n"
                "  runbook estimate-memory --params 8.3B --world-size 8 --gpu-memory 80GiB")
    p.add_argument("--params", type=_count_arg, required=True,
                   help="parameter count as you would write it: 8.3B, 7e9, 1.5M, 1300000000")
    p.add_argument("--world-size", type=_world_size_arg, required=True, help="data-parallel ranks N (GPUs in the job)")
    p.add_argument("--strategy", default="all", help=f"one of {', '.join(memory.STRATEGIES)}; default all (side by side)")
    p.add_argument("--precision", default="bf16-mixed",
                   help=f"one of {', '.join(memory.PRECISIONS)} (default bf16-mixed; DDP with torch.autocast: fp32)")
    p.add_argument("--optimizer", default="adam", help=f"one of {', '.join(memory.OPTIMIZER_STATE_BYTES)} (default adam)")
    p.add_argument("--offload", default=None, choices=("none", "cpu", "cpu+param"),
                   help="none, cpu (offload_optimizer) or cpu+param (ZeRO-3 offload_param)")
    p.add_argument("--shard-size", type=positive_int_arg("--shard-size"), default=None,
                   help="ranks per replica, for fsdp_hybrid_shard")
    p.add_argument("--bucket-view", action="store_true",
                   help="DDP with gradient_as_bucket_view=True: no second copy of the gradients in its buckets")
    p.add_argument("--gpu-memory", type=_gpu_memory_arg, default=None,
                   help="memory of one GPU (80, 80GiB, 80GB): adds a 'fits' column (default: nvidia-smi's, if any)")
    shape = p.add_argument_group("activations (a GPT-style transformer; all five, or none)")
    for flag, what in (("--micro-batch", "micro-batch size per rank"), ("--seq-len", "sequence length"),
                       ("--hidden", "hidden size"), ("--layers", "layers"), ("--heads", "attention heads")):
        shape.add_argument(flag, type=positive_int_arg(flag), default=None, help=what)
    p.add_argument("--json", action="store_true", help="print the estimate(s) as JSON")
    return p


_SHAPE = ("micro_batch", "seq_len", "hidden", "layers", "heads")


def estimate_memory(args: argparse.Namespace) -> int:
    """Print the per-rank model-state table (or JSON) of ``helpers.memory.estimate``: 0, or 2 on a bad value.

    With ``--gpu-memory`` (or a GPU that ``nvidia-smi`` reports) each strategy gets a ``fits`` verdict:
    device bytes at the peak (model states, the optimizer step's fp32 gradients, SHARD_GRAD_OP's
    compute copy, and the activations when the shape is given) against the GPU's memory.
    """
    from helpers import memory as mem

    given = [f for f in _SHAPE if getattr(args, f) is not None]
    try:
        if given and len(given) < len(_SHAPE):
            missing = ", ".join("--" + f.replace("_", "-") for f in _SHAPE if f not in given)
            raise ValueError(f"{missing}: the activation estimate needs all of --micro-batch, --seq-len, --hidden, "
                             "--layers and --heads")
        activations, act_formula = 0, ""
        if given:
            if args.precision == "fp32":
                raise ValueError("--precision='fp32': the activation formula (Korthikanti et al. 2022) is for 16-bit "
                                 "activations; give bf16-mixed or fp16-mixed, or leave the shape out")
            act_formula, activations = mem.activation_bytes_formula(
                "transformer", batch=args.micro_batch, seq_len=args.seq_len, hidden=args.hidden, heads=args.heads,
                layers=args.layers)
        offload = None if args.offload in (None, "none") else args.offload
        if args.strategy == "all":
            names = [s for s in mem.STRATEGIES if s not in ("zero0", "fsdp_hybrid_shard")]
            if offload is not None:
                names = [s for s in names if s in ("zero1", "zero2", "zero3")]
            ests = [mem.estimate(args.params, args.world_size, s, args.precision, args.optimizer, offload,
                                 bucket_view=args.bucket_view and s == "ddp") for s in names]
        else:
            ests = [mem.estimate(args.params, args.world_size, args.strategy, args.precision, args.optimizer, offload,
                                 shard_size=args.shard_size, bucket_view=args.bucket_view)]
    except ValueError as exc:
        print(f"runbook estimate-memory: {exc}", file=sys.stderr)
        return 2
    gpu = args.gpu_memory if args.gpu_memory is not None else _visible_gpu_memory()
    hb = mem.human_bytes

    def peak(e: mem.Estimate) -> int:
        return e.device_bytes + e.step_transient + e.compute_copy + activations

    def fits(e: mem.Estimate) -> str:
        if gpu is None:
            return ""
        room = gpu - peak(e)
        return f"fits ({hb(room)} free)" if room >= 0 else f"NO ({hb(-room)} over)"

    if args.json:
        print(json.dumps([{**e.to_dict(), "activations": activations, "peak_device_bytes": peak(e),
                           "gpu_memory": gpu, "fits": None if gpu is None else peak(e) <= gpu} for e in ests], indent=2))
        return 0
    if len(ests) == 1:
        print(mem.format_estimate(ests[0]))
    else:
        print(f"model states per rank: Ψ = {args.params:,} params, world size {args.world_size}, {args.precision}, "
              f"{args.optimizer}, offload={offload or 'none'}")
        print(f"{'strategy':<20}{'params':>12}{'grads':>12}{'optim':>12}{'buckets':>12}{'total':>12}  formula")
        for e in ests:
            print(f"{e.strategy:<20}{hb(e.params):>12}{hb(e.grads):>12}{hb(e.optimizer_states):>12}"
                  f"{hb(e.grad_buckets) if e.grad_buckets else '-':>12}{hb(e.total):>12}  {e.formulas['total']}")
        print(f"source: {mem.ZERO_PAPER}; DDP buckets: {mem.DDP_DOCS}")
    if activations:
        print(f"activations per rank (every strategy): {hb(activations)} = {act_formula}")
    if gpu is None:
        print("fits on one GPU? add --gpu-memory 80GiB (your GPU's memory)")
    else:
        print(f"on one GPU of {hb(gpu)} (peak: device model states + the optimizer step's fp32 gradients"
              f"{' + activations' if activations else ''}; not counted: CUDA context ~0.5-1 GiB, fragmentation):")
        for e in ests:
            print(f"  {e.strategy:<20}{hb(peak(e)):>12}  {fits(e)}")
    return 0


# ---------------------------------------------------------------- build (the command builder)

def build_command_parser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser] | None = None
                         ) -> argparse.ArgumentParser:
    """The ``runbook build`` parser: the command builder's fields as flags, or ``--check`` / ``--check-file``.

    (``build_parser`` is the name of the whole ``runbook`` parser, hence ``build_command_parser``.)
    """
    from helpers import launch_traps

    p = _parser(subparsers, "build", "build a launch command or sbatch script and list its traps (or --check one)",
                "Build the command that starts a training script (torchrun, accelerate launch, deepspeed, srun + torchrun,\n"
                "or a whole sbatch script) and list its known traps, FAILs first; or read an existing command or\n"
                "batch script (--check, --check-file) and list its traps.  Exit status: 0 no FAIL, 1 a FAIL trap,\n"
                "2 bad input.  The command (with --check: how it was read) goes to stdout, the traps and their count to\n"
                "stderr, in both modes (runbook build ... > job.sbatch keeps the script clean).  Example:\n"
                "  runbook build --launcher srun+torchrun --nodes 2 --nproc-per-node 8 train.py --env NCCL_DEBUG=INFO")
    p.add_argument("script", nargs="?", default=None, help="the training script (default train.py)")
    p.add_argument("--launcher", choices=launch_traps.KINDS, default="torchrun", help="default torchrun")
    p.add_argument("--nodes", type=positive_int_arg("--nodes"), default=1, help="nodes (default 1)")
    p.add_argument("--nproc-per-node", type=positive_int_arg("--nproc-per-node"), default=1,
                   help="ranks per node, usually the GPUs per node (default 1)")
    p.add_argument("--gpus-per-node", type=positive_int_arg("--gpus-per-node", 0), default=None,
                   help="GPUs on each node, if known (0: CPU nodes)")
    p.add_argument("--rdzv", choices=launchers.RDZV_FORMS, default=None,
                   help="torchrun rendezvous form (default: standalone on one node, static on several)")
    p.add_argument("--master-addr", default=None, help="node 0's hostname or IP (several nodes, outside SLURM)")
    p.add_argument("--master-port", type=tcp_port_arg("--master-port"), default=None, help="rendezvous port (default 29500)")
    p.add_argument("--node-rank", type=positive_int_arg("--node-rank", 0), default=None, help="this node's index")
    p.add_argument("--script-args", default="", metavar="TEXT", help="the script's arguments as shell text: --script-args=\"--lr 0.1 --cfg 'a b.yaml'\"")
    p.add_argument("--env", action="append", metavar="NAME=VALUE", help="a variable the job exports (repeat)")
    p.add_argument("--unset", action="append", metavar="NAME", help="a variable the job unsets (repeat)")
    p.add_argument("--accelerate-cpu", action="store_true", help="accelerate on CPU (--cpu)")
    p.add_argument("--srun-ntasks-per-node", type=positive_int_arg("--srun-ntasks-per-node"), default=1,
                   help="srun tasks per node in the SLURM forms (keep 1)")
    p.add_argument("--srun-export", default="ALL", help="srun --export in the SLURM forms (default ALL)")
    p.add_argument("--check-port", action="store_true", help="also check that the rendezvous port is free here (D4)")
    check = p.add_mutually_exclusive_group()
    check.add_argument("--check", metavar="COMMAND", help="read this command instead of building one, and list its traps")
    check.add_argument("--check-file", metavar="PATH", help="read a command or sbatch script from PATH ('-': stdin)")
    return p


def tcp_port_arg(flag: str) -> Callable[[str], int]:
    """An argparse ``type`` for a TCP port 1..65535 whose error names ``flag`` (:func:`helpers.validate.tcp_port`)."""
    def parse(text: str) -> int:
        try:
            return validate.tcp_port(int(text), flag)
        except ValueError:
            raise argparse.ArgumentTypeError(f"{flag}={text!r}: must be an integer in 1..65535") from None

    parse.__name__ = flag.lstrip("-").replace("-", "_")
    return parse


def build_command(args: argparse.Namespace) -> int:
    """Print the built command, or how a command was read (stdout), then the traps and their count (stderr).

    One rule for both modes: stdout carries what can be kept (the command, ``> job.sbatch``; the
    ``read as:`` line), stderr the findings, which the exit status also gives.

    Returns 0 when no trap is a FAIL, 1 on a FAIL trap, 2 on bad input or when no command could be built
    (the traps found are still listed).
    """
    from helpers import envvars, inputs, launch_parse, launch_traps, script_traps
    from helpers.checks import worst

    checking = args.check is not None or args.check_file is not None
    try:
        if checking:
            if args.check_file is not None:  # a regular file or stdin, bounded, BOM dropped (helpers.inputs)
                text = inputs.read_text(args.check_file, max_bytes=launch_parse.MAX_TEXT_CHARS * 4,
                                        max_line_chars=launch_parse.MAX_LINE_CHARS)
            else:
                text = args.check
            spec, traps = script_traps.check_text(text, check_port=args.check_port, file=args.check_file is not None)
            print(f"read as: {launch_parse.describe(spec)}" if spec is not None else
                  "read as: no launch line this parser reads (srun, torchrun, accelerate launch, deepspeed); the "
                  "script's text traps:")
        else:
            env: dict[str, str | None] = dict(envvars.parse_pairs(args.env))
            for name in args.unset or []:
                env[envvars.check_name(name, "--unset")] = None
            rdzv = args.rdzv or ("standalone" if args.nodes == 1 and args.launcher == "torchrun" else "static")
            try:
                script_args = tuple(shlex.split(args.script_args))
            except ValueError as exc:  # shlex: "No closing quotation"
                raise ValueError(f"--script-args={args.script_args!r}: {exc}; quote as in a shell: \"bob's run\" "
                                 "or 'bob'\\''s run'") from None
            spec = launch_traps.LaunchSpec(
                kind=args.launcher, nnodes=args.nodes, nproc_per_node=args.nproc_per_node, script=args.script or "train.py",
                script_args=script_args, rdzv=rdzv, master_addr=args.master_addr,
                master_port=args.master_port, node_rank=args.node_rank, env=env, gpus_per_node=args.gpus_per_node,
                accelerate_cpu=args.accelerate_cpu, srun_ntasks_per_node=args.srun_ntasks_per_node,
                srun_export=args.srun_export)
            traps = launch_traps.find_traps(spec, check_port=args.check_port)
    except (OSError, ValueError) as exc:
        print(f"runbook build: {exc}", file=sys.stderr)
        return 2
    failed = False
    if not checking:
        try:
            print(launch_traps.render(spec), end="")
        except ValueError as exc:  # nothing on stdout: never exit 0 then (`runbook build ... > job.sh` would be empty)
            print(f"runbook build: no command: {exc}", file=sys.stderr)
            failed = True
    sys.stdout.flush()  # the command first, then the findings, also when both streams go to one terminal
    for trap in traps:
        print(trap.line() + f"  [{trap.source}]", file=sys.stderr)
    print(f"{len(traps)} trap(s)" + (f", {sum(t.status == 'FAIL' for t in traps)} FAIL" if traps else ": none known"),
          file=sys.stderr)
    return 2 if failed else (1 if worst(traps) == "FAIL" else 0)


# ---------------------------------------------------------------- registry

COMMANDS: tuple[Command, ...] = (
    Command("diagnose", diagnose_parser, diagnose),
    Command("health-check", health_check_parser, health_check),
    Command("doctor", doctor_parser, doctor),
    Command("nccl-log", nccl_log_parser, nccl_log),
    Command("lint", lint_parser, lint),
    Command("lab", lab_parser, lab),
    Command("preflight", preflight_parser, preflight),
    Command("estimate-memory", estimate_memory_parser, estimate_memory),
    Command("build", build_command_parser, build_command),
)
"""Every ``runbook`` sub-command, in ``--help`` order."""


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``runbook``: every :data:`COMMANDS` entry registered, ``func`` set to its handler.

    Each sub-command's parser is also kept in the namespace (``_parser``) so that :func:`main` reports
    an unknown flag with that sub-command's name.
    """
    parser = RunbookParser(prog="runbook", description=plain(__doc__.split("\nAdding a command")[0]),
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True, parser_class=RunbookParser)
    for cmd in COMMANDS:
        sp = cmd.add_parser(sub)
        sp.set_defaults(func=cmd.run, _parser=sp)
    return parser


EPIPE_STATUS = 141
"""Exit status when the reader of stdout went away (``runbook ... | head``): 128 + SIGPIPE, as a shell reports it."""


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``runbook`` console script; returns the command's exit status (0, 1 or 2).

    An unknown flag after a sub-command is reported by that sub-command's parser (its name and its
    ``--help``), not by the top-level one.  When stdout is a pipe whose reader has exited
    (``runbook estimate-memory ... | head``) the command stops quietly with :data:`EPIPE_STATUS`: no
    ``BrokenPipeError`` traceback, for every verb (the way the Python documentation recommends:
    https://docs.python.org/3/library/signal.html#note-on-sigpipe).

    Raises:
        SystemExit: on bad arguments (one line naming the flag and the accepted values; status 2).
    """
    args, extra = build_parser().parse_known_args(list(sys.argv[1:] if argv is None else argv))
    if extra:
        args._parser.error(f"unrecognized arguments: {' '.join(extra)}")
    try:
        status = int(args.func(args))
        sys.stdout.flush()
    except BrokenPipeError:
        # Python flushes stdout again at exit and would print "Exception ignored ... BrokenPipeError":
        # point the descriptor at /dev/null first.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return EPIPE_STATUS
    return status


if __name__ == "__main__":
    sys.exit(main())
