"""The ``runbook`` command line.

``runbook diagnose`` executes ``notebooks/00_allocation_check.ipynb`` with papermill into a
fresh ``build/reports/<host>-<timestamp>/`` and prints one ``[OK]``/``[WARN]``/``[FAIL]``
line per check.  Exit status: 0 when no check failed, 1 when one did, 2 when the notebook
itself could not run.

``runbook doctor --pid PID`` (a torchrun/launcher pid on this node) or ``--job-dir DIR`` (a
runner job that hung) prints which rank diverged, the collective the others wait in and the
source line (``helpers.doctor``).  Exit status 0 when a verdict was printed, 2 otherwise.

``runbook nccl-log FILE...`` reads ``NCCL_DEBUG=INFO`` output (any ranks and hosts interleaved) and
prints a per-rank table (host, interface, transports, Init COMPLETE) and verdicts such as a job bound
to ``docker0`` or a single-node job using the IB transport (``helpers.nccl_log``).  Exit status 1 on
a FAIL verdict.

``runbook lab up [--nodes N] | down | status`` brings up the network lab: N "nodes", each a network
namespace with its own hostname, joined by a bridge in a namespace of its own (``helpers.netlab``).
``runbook preflight --lab`` (or ``--nodes a,b --runner srun``) checks interfaces, ``*_SOCKET_IFNAME``,
the MTU the path really carries and the master address on every node, and names the faulty node
(``helpers.preflight``).  Exit status 1 on a FAIL.

``runbook estimate-memory --params 1.3e9 --world-size 8 --strategy zero2`` prints the model-state
bytes per rank by component (``helpers.memory``; ``runbook estimate-memory --help``).
"""

from __future__ import annotations

import argparse
import ast
import json
import sys
import time
from collections.abc import Sequence

from helpers import jobs

NOTEBOOK_00 = "00_allocation_check.ipynb"


def _literal(text: str) -> object:
    """Parse ``-p`` values as Python literals (``2``, ``0.5``, ``"x"``), falling back to the raw string."""
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text


def diagnose(args: argparse.Namespace) -> int:
    """Run the allocation check notebook under papermill; print its report; return the exit status."""
    import papermill

    from helpers.diagnostics import default_nproc, new_report_dir

    nproc = default_nproc() if args.nproc is None else args.nproc
    params: dict[str, object] = {"BACKEND": args.backend, "NPROC": nproc, "TIMEOUT_S": args.timeout_s}
    if args.max_bytes is not None:
        params["MAX_BYTES"] = args.max_bytes
    for name, value in args.param or []:
        params[name] = _literal(value)
    report_dir = new_report_dir(args.out_dir)
    params["REPORT_DIR"] = str(report_dir)
    source = jobs.project_root() / "notebooks" / NOTEBOOK_00
    executed = report_dir / NOTEBOOK_00
    print(f"runbook diagnose: {source.name} -> {report_dir}", flush=True)
    t0 = time.monotonic()
    try:
        papermill.execute_notebook(str(source), str(executed), parameters=params, cwd=str(source.parent),
                                   kernel_name=args.kernel, progress_bar=False,
                                   execution_timeout=args.cell_timeout_s)
    except papermill.PapermillExecutionError as exc:
        print(f"[FAIL] the notebook stopped in cell {exc.exec_count}: {exc.ename}: {exc.evalue}", file=sys.stderr)
        print(f"       executed copy: {executed}", file=sys.stderr)
        return 2
    data = json.loads((report_dir / "report.json").read_text())
    for check in data["checks"]:
        status = check["status"]
        print(f"[{status}]{' ' * (5 - len(status))}{check['id']}: {check['title']}")
        if status != "OK" and check["remediation"]:
            print(f"       -> {check['remediation']}")
    print(f"{data['status']}: {len(data['checks'])} checks in {time.monotonic() - t0:.1f} s wall; "
          f"report: {report_dir / 'report.md'}")
    return 1 if data["status"] == "FAIL" else 0


def doctor(args: argparse.Namespace) -> int:
    """Print the hang doctor's verdict for a live launcher pid or a saved job directory."""
    from helpers import doctor as doc

    try:
        verdict = doc.diagnose_pid(args.pid) if args.pid is not None else doc.diagnose_job_dir(args.job_dir)
    except ValueError as exc:
        print(f"runbook doctor: {exc}", file=sys.stderr)
        return 2
    print(verdict.text)
    if args.stacks:
        for rank, state in verdict.states.items():
            print(f"--- rank {rank}: " + " <- ".join(f"{f.func} ({f.site})" for f in state.frames[:8]))
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``runbook`` (sub-commands)."""
    parser = argparse.ArgumentParser(prog="runbook", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("diagnose", help="run the allocation check (notebook 00) and write a report")
    p.add_argument("--backend", choices=jobs.BACKENDS, default="auto")
    p.add_argument("--nproc", type=int, default=None,
                   help="ranks per node (default: the visible GPUs, capped by SLURM_GPUS_ON_NODE; 2 without a GPU)")
    p.add_argument("--timeout-s", type=float, default=30.0, help="collective timeout per job, seconds")
    p.add_argument("--max-bytes", type=int, default=None, help="largest message of the bandwidth sweep, bytes")
    p.add_argument("--out-dir", default=None, help="where report folders go (default build/reports)")
    p.add_argument("--kernel", default="python3", help="Jupyter kernel to run the notebook with")
    p.add_argument("--cell-timeout-s", type=float, default=900.0, help="papermill per-cell limit, seconds")
    p.add_argument("-p", "--param", nargs=2, action="append", metavar=("NAME", "VALUE"),
                   help="override a notebook parameter (repeatable), e.g. -p SMOKE_STEPS 50")
    p.set_defaults(func=diagnose)
    d = sub.add_parser("doctor", help="name the rank that diverged in a hung job")
    where = d.add_mutually_exclusive_group(required=True)
    where.add_argument("--pid", type=int, help="pid of the launcher (torchrun, deepspeed...) on this node")
    where.add_argument("--job-dir", help="a runner job directory with stacks/ (and trace/)")
    d.add_argument("--stacks", action="store_true", help="also print each rank's innermost frames")
    d.set_defaults(func=doctor)
    from helpers import nccl_log, netlab, preflight  # no torch: cheap to import for --help

    nccl_log.add_cli(sub)
    netlab.add_cli(sub)
    preflight.add_cli(sub)
    # listed for --help; main() hands its arguments to helpers.memory's own parser
    sub.add_parser("estimate-memory", add_help=False,
                   help="bytes per rank of params, grads and optimizer states (DDP, ZeRO, FSDP)")
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``runbook`` console script.

    Raises:
        SystemExit: on bad arguments (argparse names the field and accepted values).
    """
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["estimate-memory"]:
        from helpers import memory

        return memory.main(argv[1:])
    args = build_parser().parse_args(argv)
    if getattr(args, "nproc", None) is not None and args.nproc < 1:
        build_parser().error(f"--nproc={args.nproc}: must be >= 1")
    return int(args.func(args))


if __name__ == "__main__":
    sys.exit(main())
