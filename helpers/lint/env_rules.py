"""Contract rules on the launcher's environment: the variables torchrun, the ``deepspeed`` launcher, Accelerate and
SLURM set (names, spellings, types: strings, never numbers), read where they are not set, or set per node where they
must agree (https://docs.pytorch.org/docs/stable/elastic/run.html#environment-variables,
https://slurm.schedmd.com/srun.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES).  Run by
:func:`helpers.lint.contract_rules.run`."""

from __future__ import annotations

import ast
import itertools
import re
from typing import TYPE_CHECKING

from helpers.lint.contract_ast import ancestors, assigned_once, src_env_key
from helpers.lint.contracts import _DIST, _SBATCH_ENV, _TORCHRUN
from helpers.lint.wrappers import assign_targets

if TYPE_CHECKING:
    from helpers.lint.contract_rules import ScriptContract
    from helpers.lint.python_rules import PythonLinter


_RANK_ENV = re.compile(r"['\"](?:RANK|LOCAL_RANK|NODE_RANK|GROUP_RANK|SLURM_PROCID|SLURM_NODEID|SLURM_LOCALID|"
                       r"OMPI_COMM_WORLD_RANK|OMPI_COMM_WORLD_LOCAL_RANK|PMI_RANK)['\"]")
_TRUTH = "https://docs.python.org/3/library/stdtypes.html#truth-value-testing"


def rule_rank_zero_falsy(lt: PythonLinter) -> None:
    """``rank = get_envint("RANK", None)`` then ``if rank:`` as "is RANK set": an integer 0 is false (Python's truth
    value testing, :data:`_TRUTH`), so the main process (rank 0) takes the "not set" path; ``return rank == 0`` inside
    ``if rank:`` can never be true (NVIDIA/NeMo#3374).  The value must be an integer read of a rank variable (a call
    whose name says int, or ``int(...)``): ``os.environ.get("RANK")`` is the string "0", which is true."""
    for node in lt.nodes:
        if not isinstance(node, ast.If):
            continue
        test = node.test.operand if isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not) else node.test
        if not isinstance(test, ast.Name):
            continue
        made = assigned_once(lt, test.id, node, before=node.lineno)
        if made is None or not isinstance(made.value, ast.Call):
            continue
        value = made.value
        called = ast.unparse(value.func).lower()
        if "int" not in called or not _RANK_ENV.search(ast.unparse(value)) or \
                not any(isinstance(b, ast.Return) for b in node.body):
            continue  # only "if rank: return <from it>": the other paths may fall back to the same 0
        dead = any(isinstance(c, ast.Compare) and isinstance(c.left, ast.Name) and c.left.id == test.id and
                   len(c.ops) == 1 and isinstance(c.ops[0], ast.Eq) and isinstance(c.comparators[0], ast.Constant) and
                   c.comparators[0].value == 0 for b in node.body for c in ast.walk(b)) and test is node.test
        lt.add("rank-zero-falsy", "warning", node,
               f"'if {ast.unparse(node.test)}:' tests {test.id} (line {made.lineno}: {ast.unparse(value)[:50]}) for "
               f"truth: rank 0 is false, so the main process reads as 'not set'" +
               (f"; '{test.id} == 0' inside it can never be true" if dead else ""),
               f"if {test.id} is not None:", _TRUTH)


_ENVIRON = "https://docs.python.org/3/library/os.html#os.environ"


def rule_environ_getattr(lt: PythonLinter) -> None:
    """``getattr(os.environ, "WORLD_SIZE", 1)``: ``os.environ`` is a mapping (:data:`_ENVIRON`); its keys are not
    attributes, so the default comes back whatever the launcher set: world size 1 and rank -1 on every process
    (ultralytics/yolov5#3680: ``os.environ.get`` was meant)."""
    from helpers.lint.python_rules import _call_name

    for c in lt._calls():
        if _call_name(c) != ("", "getattr") or len(c.args) < 2 or ast.unparse(c.args[0]) not in ("os.environ", "environ"):
            continue
        key = c.args[1].value if isinstance(c.args[1], ast.Constant) else ast.unparse(c.args[1])
        lt.add("environ-getattr", "error", c,
               f"getattr(os.environ, {key!r}, ...) looks for an attribute of the os.environ mapping, not the "
               f"variable: it always returns the default, whatever {key} the launcher set",
               f"os.environ.get({key!r}, ...)", _ENVIRON)


_DS_ARGS = "https://github.com/deepspeedai/DeepSpeed/blob/master/deepspeed/launcher/launch.py"


_LOCAL_RANK_SPELLINGS = (
    # (what the script is made for, that launcher, the spelling it passes, the one the parser lacks, source)
    (r"add_config_arguments", "the deepspeed launcher (deepspeed.add_config_arguments), which", "--local_rank",
     "--local-rank", _DS_ARGS),
    (r"torch\.distributed\.launch\b", "torch.distributed.launch, which since PyTorch 2.0", "--local-rank",
     "--local_rank", "https://docs.pytorch.org/docs/stable/distributed.html#launch-utility"),
)
"""Launchers that pass the local rank as an argument, and the spelling each passes.  The deepspeed launcher appends
``--local_rank={local_rank}`` to every worker's command (deepspeed/launcher/launch.py, unless ``--no_local_rank``;
deepspeedai/Megatron-DeepSpeed#192); ``python -m torch.distributed.launch`` passes ``--local-rank=N`` since PyTorch 2.0
("Changed in version 2.0.0: The launcher will pass the --local-rank=<rank> argument to your script";
speechbrain#1951).  A script made for the deepspeed launcher is that launcher's case even when it also names
torch.distributed.launch."""


def rule_local_rank_required(lt: PythonLinter) -> None:
    """``add_argument("--local_rank", type=int, required=True)`` with no ``--local-rank`` spelling: no current launcher
    passes that option -- torchrun passes none (it sets LOCAL_RANK; its docs tell scripts that read --local-rank to
    read the variable instead,
    https://docs.pytorch.org/docs/stable/elastic/run.html#transitioning-from-torch-distributed-launch-to-torchrun) and
    ``torch.distributed.launch`` since PyTorch 2.0 passes ``--local-rank`` (:data:`_LOCAL_RANK_SPELLINGS`), so the
    parser stops every worker before training (microsoft/Swin-Transformer's main.py)."""
    from helpers.lint.python_rules import _call_name

    if "--local_rank" not in lt.text or "required" not in lt.text:
        return
    for c in lt._calls():
        if _call_name(c)[1] != "add_argument" or not c.args:
            continue
        flags = [a.value for a in c.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        req = next((k.value for k in c.keywords if k.arg == "required"), None)
        if "--local_rank" not in flags or "--local-rank" in flags or not (isinstance(req, ast.Constant) and req.value):
            continue
        if any(isinstance(a, ast.If) and re.search(r"(?i)version", ast.unparse(a.test)) for a in ancestors(lt, c)):
            continue  # `if PYTORCH_MAJOR_VERSION == 1:` -- PyTorch 1.x's launch passed --local_rank (Swin's fix)
        lt.add("local-rank-arg-under-launcher", "error", c,
               "--local_rank is required, but torchrun passes no such option (it sets LOCAL_RANK) and "
               "torch.distributed.launch (PyTorch 2.0 and later) passes --local-rank: every worker stops at "
               "argument parsing", 'add_argument("--local-rank", "--local_rank", dest="local_rank", type=int, '
               'default=int(os.environ.get("LOCAL_RANK", -1))), not required',
               "https://docs.pytorch.org/docs/stable/elastic/run.html#transitioning-from-torch-distributed-launch-to-torchrun")


def rule_local_rank_spelling(lt: PythonLinter, sc: ScriptContract) -> None:
    """A script made for a launcher that passes the local rank as an argument (:data:`_LOCAL_RANK_SPELLINGS`) whose
    parser defines the other spelling only: argparse matches option strings exactly, so every worker stops with
    'unrecognized arguments: --local_rank=0' (or ``--local-rank=0``)."""
    written = sc.extra.get("literal_options") or frozenset()
    for marker, launcher, passes, has, source in _LOCAL_RANK_SPELLINGS:
        if not re.search(marker, lt.text):
            continue
        if has in written and passes not in written:
            where = next((c.lineno for c in lt._calls() if c.args and isinstance(c.args[0], ast.Constant)
                          and c.args[0].value == has), sc.options_line or 1)
            lt.add("local-rank-arg-under-launcher", "error", where,
                   f"the parser defines {has} but not {passes}, and this script is made for {launcher} passes "
                   f"{passes}=N: 'error: unrecognized arguments: {passes}=0'",
                   'add_argument("--local-rank", "--local_rank", dest="local_rank", type=int)', source)
        return  # the first launcher the script is made for decides


_SLURM_ROLES: dict[str, str] = {
    "SLURM_PROCID": "the global task rank",
    "SLURM_LOCALID": "the task's rank on its node",
    "SLURM_NODEID": "the node's index in the job",
    "SLURM_NTASKS": "the job's number of tasks", "SLURM_NPROCS": "the job's number of tasks",
    "SLURM_STEP_NUM_TASKS": "the job's number of tasks",
    "SLURM_JOB_NUM_NODES": "the number of nodes", "SLURM_NNODES": "the number of nodes",
    "SLURM_STEP_NUM_NODES": "the number of nodes",
    "SLURM_NTASKS_PER_NODE": "the tasks per node",
    "SLURM_JOB_CPUS_PER_NODE": "the job's CPUs on the node, shared by all its tasks there",
    "SLURM_CPUS_ON_NODE": "the CPUs on the node, shared by all the job's tasks there",
    "SLURM_CPUS_PER_TASK": "the CPUs of one task",
}
"""What a Slurm output variable holds (sbatch/srun OUTPUT ENVIRONMENT VARIABLES: SLURM_PROCID "The MPI rank (or
relative process ID) of the current process", SLURM_LOCALID "Node local task ID for the process within a job",
SLURM_NODEID "ID of the nodes allocated" (the relative node ID of the current node, srun), SLURM_NTASKS/NPROCS the
number of tasks, SLURM_JOB_NUM_NODES/NNODES "Total number of nodes in the job's resource allocation",
SLURM_NTASKS_PER_NODE "Number of tasks requested per node", SLURM_JOB_CPUS_PER_NODE "Count of CPUs available to the
job on the nodes in the allocation", SLURM_CPUS_ON_NODE "Number of CPUs allocated to the batch step" / on the node,
SLURM_CPUS_PER_TASK "Number of cpus requested per task"; ``_SBATCH_ENV``)."""

_SLOT_ROLES: tuple[tuple[re.Pattern[str], str], ...] = (
    (re.compile(r"^(node_rank|machine_rank|node_id|node_idx|node_index|group_rank)$"), "the node's index in the job"),
    (re.compile(r"^(local_world_size|local_size|nproc_per_node|nprocs_per_node|procs_per_node|tasks_per_node|"
                r"ntasks_per_node|local_world)$"), "the tasks per node"),
    (re.compile(r"^(num_nodes|nnodes|n_nodes|num_machines|node_count|nodes)$"), "the number of nodes"),
    (re.compile(r"^(local_rank|localrank|local_rank_id)$"), "the task's rank on its node"),
    (re.compile(r"^(world_size|num_processes|num_replicas|ntasks)$"), "the job's number of tasks"),
    (re.compile(r"^(rank|global_rank|world_rank|proc_rank|process_rank)$"), "the global task rank"),
    (re.compile(r"^(num_workers|n_workers|workers|num_threads|n_threads|cpus_per_task|num_cpus_per_task)$"),
     "the CPUs of one task"),
)
"""A name that promises one of those quantities (torchrun's --node-rank/--nproc-per-node/--nnodes, accelerate's
--machine_rank/--num_machines, init_process_group's rank/world_size, LOCAL_RANK, LOCAL_WORLD_SIZE; a process's
DataLoader workers or threads, which one task's CPUs feed)."""


def _slurm_read(node: ast.AST | None) -> tuple[ast.AST, str] | None:
    """``(node, "SLURM_X")`` when ``node`` reads a Slurm/PMI variable: ``os.environ["SLURM_X"]``,
    ``os.getenv("SLURM_X")``, or a helper of the script that takes the name first (``get_int_env("SLURM_X", env)``),
    through ``int()``/``str()``."""
    from helpers.lint.python_rules import _call_name, _env_key

    while isinstance(node, ast.Call) and _call_name(node)[1] in ("int", "str") and node.args:
        node = node.args[0]
    if node is None:
        return None
    key = _env_key(node)
    if key is None and isinstance(node, ast.Call) and node.args and isinstance(node.args[0], ast.Constant) and \
            isinstance(node.args[0].value, str) and "env" in "".join(_call_name(node)).lower():
        key = node.args[0].value
    if key is None and isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
            node.func.attr == "get" and node.args and isinstance(node.args[0], ast.Constant) and \
            "env" in _dotted_lower(node.func.value):
        key = node.args[0].value
    if isinstance(key, str) and key.startswith(("SLURM_", "SLURMD_")):
        return node, key
    return None


def _dotted_lower(node: ast.AST) -> str:
    return ast.unparse(node).lower()


def _slurm_known(key: str) -> str | None:
    """``None`` when Slurm sets ``key``; else the documented name it most likely meant (``SLURM_JOB_NUMNODES`` ->
    ``SLURM_JOB_NUM_NODES``: the same without underscores, or a close spelling), or ``""`` when none is close."""
    import difflib

    from helpers import envnames

    known = envnames.slurm_env_vars()
    if key in known or not key.startswith(("SLURM_", "SLURMD_")):
        return None
    squeezed = {k.replace("_", ""): k for k in known}
    if key.replace("_", "") in squeezed:
        return squeezed[key.replace("_", "")]
    close = difflib.get_close_matches(key, sorted(known), n=1, cutoff=0.9)
    return close[0] if close else ""


def rule_slurm_env(lt: PythonLinter) -> None:
    """Slurm's output variables read for what they are not (``_SBATCH_ENV``, srun's OUTPUT ENVIRONMENT VARIABLES).

    * ``slurm-var-unknown``: a ``SLURM_*`` name Slurm neither documents nor sets (``helpers/data/slurm_env_vars.txt``,
      :func:`helpers.envnames.slurm_env_vars`) that is one spelling away from one it does (``SLURM_JOB_NUMNODES``):
      ``os.environ[...]`` raises KeyError, ``.get`` returns its default on every node.  A name far from every Slurm
      name (a site's own) is left alone.
    * ``slurm-env-misuse``: a variable assigned to, or passed as, a name that promises another quantity: the node
      rank torchrun/accelerate take from ``SLURM_PROCID`` (the task rank: right only with one task per node, out of
      range or repeated with more), a per-node process count from the node count, a global rank from
      ``SLURM_LOCALID``...
    """
    if "SLURM" not in lt.text:
        return
    seen: set[int] = set()
    for n in lt.nodes:
        read = _slurm_read(n) if isinstance(n, (ast.Subscript, ast.Call)) else None
        if read is None or id(read[0]) in seen:
            continue
        seen.add(id(read[0]))
        meant = _slurm_known(read[1])
        if meant:
            lt.add("slurm-var-unknown", "warning", n,
                   f"{read[1]} is not a variable Slurm sets (sbatch/srun OUTPUT ENVIRONMENT VARIABLES); {meant} is: "
                   "os.environ[...] raises KeyError, .get() returns its default on every node",
                   f"read {meant}", _SBATCH_ENV)
    slots: list[tuple[ast.AST, str, ast.AST]] = []
    for n in lt.nodes:
        if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None:
            for t in assign_targets(n):
                name = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else None
                if name:
                    slots.append((n, name, n.value))
        elif isinstance(n, ast.keyword) and n.arg:
            slots.append((n.value, n.arg, n.value))
    for at, name, value in slots:
        want = next((role for pat, role in _SLOT_ROLES if pat.match(name.lower().lstrip("_"))), None)
        parts = value.values if isinstance(value, ast.BoolOp) else [value.body, value.orelse] \
            if isinstance(value, ast.IfExp) else [value]
        for part in parts:
            read = _slurm_read(part)
            if want is None or read is None:
                continue
            key = _slurm_known(read[1]) or read[1]
            has = _SLURM_ROLES.get(key)
            if has is None or has == want:
                continue
            cpus = want == "the CPUs of one task"
            lt.add("slurm-env-misuse", "warning" if cpus else "error", at,
                   f"{name} (meant: {want}) is taken from {read[1]}, which holds {has}: "
                   + ("right only with one Slurm task per node; with more, node ranks repeat or go out of range "
                      "and the launch fails" if key == "SLURM_PROCID" and "node" in want else
                      "each of the node's tasks (one per GPU) starts that many, so the node's CPUs are "
                      "oversubscribed by the tasks per node" if cpus else
                      "the value differs from the intended one as soon as the job has several nodes or several "
                      "tasks per node"),
                   f"read the variable that holds {want}: " + next(
                       (k for k, r in _SLURM_ROLES.items() if r == want), "see the sbatch/srun output variables"),
                   _SBATCH_ENV)
            break


_NOT_NUMBERS = {
    "SLURM_TASKS_PER_NODE": "'8(x2)' on two nodes of 8 tasks, '2,1' when they differ",
    "SLURM_STEP_TASKS_PER_NODE": "'8(x2)' on two nodes of 8 tasks",
    "SLURM_JOB_CPUS_PER_NODE": "'72(x2)' on two nodes of 72 CPUs",
    "SLURM_JOB_NODELIST": "a host list such as 'gpu[01-04]'", "SLURM_NODELIST": "a host list such as 'gpu[01-04]'",
    "SLURM_STEP_NODELIST": "a host list such as 'gpu[01-04]'", "SLURM_JOB_GPUS": "a list such as '0,1,2,3'",
    "SLURM_STEP_GPUS": "a list such as '0,1,2,3'",
    "MASTER_ADDR": "a host name or IP address", "MASTER_ADDRESS": "a host name or IP address",
}
"""Variables whose documented value is not a number (sbatch / srun OUTPUT ENVIRONMENT VARIABLES, ``_SBATCH_ENV``:
SLURM_TASKS_PER_NODE "Number of tasks to be initiated on each node. Values are comma separated ... If two or more
consecutive nodes are to have the same task count, that count is followed by "(x#)"..."; torch's env:// rendezvous:
MASTER_ADDR, the address of the rank 0 node), with an example of what ``int()`` then meets."""


def _env_none_parsed(lt: PythonLinter) -> None:
    """``env-int-parse`` for a launcher's variable read without a default and parsed at once, on every path:
    ``int(os.environ.get("LOCAL_RANK"))``.  ``os.environ.get`` / ``os.getenv`` return None for an unset variable
    (https://docs.python.org/3/library/os.html#os.getenv) and ``int(None)`` raises TypeError, so the script dies
    wherever no launcher set it: ``python train.py``, or ``accelerate launch`` with one process, whose simple launcher
    sets no LOCAL_RANK (accelerate/utils/launch.py, ``prepare_simple_launcher_cmd_env``; OminiControl's fix gave the
    read a default).  Reported where the author's own code expects the variable to be unset (a read of it with a
    default, under ``try`` or a test, in this file or in another linted file:
    :func:`helpers.lint.cross_rules.env_none_parsed_across`): a script meant to run only under its launcher
    (DeepSpeed's cifar example, a Ray worker) reads it the same way, and is right to.  Not itself under a test, a ``try``, a conditional expression or
    a boolean operator (fairseq's SLURM branch reads SLURM_NODEID only where SLURM set it)."""
    from helpers.lint.python_rules import _call_name, _env_key

    if not re.search(r"environ|getenv", lt.text):
        return
    facts = lt.facts
    for c in lt.nodes:
        if not isinstance(c, (ast.Call, ast.Subscript)):
            continue
        key = _env_key(c)
        if key is None or not _LAUNCHER_SET.fullmatch(key):
            continue
        held = list(itertools.takewhile(
            lambda p: not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)), ancestors(lt, c)))
        if isinstance(c, ast.Subscript):  # os.environ["LOCAL_RANK"] under try / a test: its absence handled
            if any(isinstance(p, (ast.Try, ast.If, ast.IfExp, ast.BoolOp)) for p in held):
                facts.env_unset_handled.add(key)
            continue
        parent = lt.parents.get(c)
        parsed = isinstance(parent, ast.Call) and _call_name(parent) in (("", "int"), ("", "float")) and \
            len(parent.args) == 1 and parent.args[0] is c and not parent.keywords
        guarded = any(isinstance(p, (ast.IfExp, ast.BoolOp, ast.Try, ast.While, ast.Assert, ast.comprehension)) or
                      isinstance(p, ast.If) and "__name__" not in ast.unparse(p.test) for p in held)
        if len(c.args) > 1 or c.keywords or guarded and _call_name(c)[1] != "setdefault":
            facts.env_unset_handled.add(key)
        elif parsed and _call_name(c)[1] != "setdefault":
            facts.env_none_parsed.append((key, parent.lineno, ast.unparse(parent)[:60]))  # type: ignore[union-attr]
    for n in lt.nodes:
        if isinstance(n, ast.Compare) and any(isinstance(op, (ast.In, ast.NotIn)) for op in n.ops) and \
                isinstance(n.left, ast.Constant) and isinstance(n.left.value, str) and \
                re.search(r"environ", ast.unparse(n.comparators[0])):
            facts.env_unset_handled.add(n.left.value)
    for key, line, src in facts.env_none_parsed:
        if key in facts.env_unset_handled:
            lt.add("env-int-parse", "warning", line, env_none_message(key, src, "this file"), env_none_fix(key),
                   _GETENV)


_GETENV = "https://docs.python.org/3/library/os.html#os.getenv"


def env_none_message(key: str, src: str, where: str) -> str:
    """The finding's words for ``int(os.environ.get(key))`` whose absence ``where`` handles elsewhere."""
    return (f"{src}: os.environ.get returns None where {key} is unset, and int(None) raises TypeError; {where} "
            f"expects {key} to be unset at times (it reads it with a default or a guard), and this read dies there: "
            "a run without a launcher, or accelerate launch with one process (which sets no LOCAL_RANK)")


def env_none_fix(key: str) -> str:
    """The fix for :func:`env_none_message`."""
    return f"give the read a default (os.environ.get('{key}', '0')), as the other read does"


def rule_launcher_env_overwritten(lt: PythonLinter) -> None:
    """``launcher-env-ignored``: ``os.environ["RANK"] = "0"`` / ``["WORLD_SIZE"] = "1"`` / ``["LOCAL_RANK"] = "0"`` at
    module level (or in the ``__main__`` block), under no test: the script makes itself rank 0 of a world of 1 whatever
    started it.  torchrun and the ``deepspeed`` launcher set these per process ("RANK - The global rank", "WORLD_SIZE -
    The world size", ``_TORCHRUN``), so under a launch of N processes every process now trains alone, each as rank 0,
    on the same port (CoreWeave's finetuner, started by ``deepspeed.launcher.runner --num_gpus N``).  The notebook
    trick of running DeepSpeed without a launcher does this on purpose: guard it (``if "RANK" not in os.environ``)."""
    top: list[ast.stmt] = list(getattr(lt.tree, "body", []))
    for st in list(top):
        if isinstance(st, ast.If) and "__name__" in ast.unparse(st.test):
            top += st.body
    hits: list[tuple[ast.Assign, str]] = []
    for st in top:
        if isinstance(st, ast.Assign) and len(st.targets) == 1 and isinstance(st.targets[0], ast.Subscript):
            key = src_env_key(st.targets[0])
            if key in ("RANK", "WORLD_SIZE", "LOCAL_RANK") and isinstance(st.value, ast.Constant) and \
                    str(st.value.value) in ("0", "1"):
                hits.append((st, key))
    if len({key for _st, key in hits}) < 2:
        return  # one variable set alone may be a default for a one-process tool; the rank and the world size together
        # are the one-process world
    st, _key = hits[0]
    lt.add("launcher-env-ignored", "warning", st,
           f"{', '.join(ast.unparse(s.targets[0]) for s, _k in hits)} set to one-process values at import, under no "
           "test: under torchrun or the deepspeed launcher (which set them per process) every process becomes rank 0 "
           "of a world of 1 and trains alone, all on the same port",
           'set them only where no launcher did: if "RANK" not in os.environ: ...', _TORCHRUN + "#environment-variables")


def rule_env_not_a_number(lt: PythonLinter) -> None:
    """``env-int-parse``: ``int()`` / ``float()`` of a variable whose documented value is not a number
    (:data:`_NOT_NUMBERS`), directly or through one assignment: a ValueError as soon as the job has several nodes
    (``int('8(x2)')``, InternImage's ``SLURM_TASKS_PER_NODE``) or at once (``int(os.getenv('MASTER_ADDRESS'))``)."""
    from helpers.lint.python_rules import _call_name, _env_key

    _env_none_parsed(lt)
    if not re.search("|".join(_NOT_NUMBERS), lt.text):
        return
    env_names: dict[str, str] = {}  # a name assigned from a read: addr = os.environ["MASTER_ADDR"]
    for n in lt.nodes:
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            key = _env_key(n.value)
            if key in _NOT_NUMBERS:
                env_names[n.targets[0].id] = key
    for c in lt._calls():
        if _call_name(c) not in (("", "int"), ("", "float")) or not c.args:
            continue
        arg = c.args[0]
        key = _env_key(arg) or (env_names.get(arg.id) if isinstance(arg, ast.Name) else None)
        if key not in _NOT_NUMBERS:
            continue
        lt.add("env-int-parse", "error", c,
               f"{ast.unparse(c)[:60]}: {key} is {_NOT_NUMBERS[key]}, not a number, so {_call_name(c)[1]}() raises "
               "ValueError" + (" as soon as the job spans several nodes" if key.startswith("SLURM") else ""),
               "read the number from a variable that holds one (SLURM_NTASKS_PER_NODE, SLURM_NNODES, SLURM_NTASKS, "
               "SLURM_GPUS_ON_NODE), or parse the list (scontrol show hostnames); keep an address a string",
               _SBATCH_ENV)


_CONVERSIONS = frozenset({"int", "float", "bool", "str", "eval", "literal_eval", "strtobool", "Path"})
_STRING_SINKS = frozenset({"print", "info", "warning", "debug", "error", "format", "join", "append", "get",
                           "setdefault", "write", "log"})


def rule_env_str_as_number(lt: PythonLinter) -> None:
    """``env-str-as-number``: ``os.environ.get(K, 3600)`` (or ``os.getenv``) with a number as its default, used without
    a conversion: unset, the value is that number; set, it is a string ("os.environ: a mapping object where keys and
    values are strings", https://docs.python.org/3/library/os.html#os.environ), so the same line fails only when
    someone sets the variable (``timedelta(seconds=os.environ.get('DIST_TIMEOUT', 3600))``: TypeError, VLMEvalKit)."""
    from helpers.lint.python_rules import _call_name, _env_key

    if "environ" not in lt.text and "getenv" not in lt.text:
        return
    for c in lt._calls():
        key = _env_key(c)
        default = c.args[1] if len(c.args) > 1 else next((k.value for k in c.keywords if k.arg == "default"), None)
        if key is None or not (isinstance(default, ast.Constant) and type(default.value) in (int, float)):
            continue
        parent = lt.parents.get(c)
        if isinstance(parent, ast.Call) and _call_name(parent)[1] in _CONVERSIONS | _STRING_SINKS:
            continue
        if not (isinstance(parent, (ast.Call, ast.keyword, ast.BinOp, ast.Compare, ast.AugAssign)) or
                isinstance(parent, ast.keyword)):
            continue
        holder = lt.parents.get(parent)
        if isinstance(parent, ast.keyword) and parent.arg == "default" and isinstance(holder, ast.Call) and \
                _call_name(holder)[1] == "add_argument" and any(k.arg == "type" for k in holder.keywords):
            continue  # argparse converts a string default with type= ("If the default value is a string, the parser
            # parses the value as if it were a command-line argument", https://docs.python.org/3/library/argparse.html#default)
        lt.add("env-str-as-number", "error", c,
               f"{ast.unparse(c)[:60]}: the default is a number but a set {key} is a string, and it is used as a "
               "number here without a conversion: the line works until someone sets the variable (TypeError, or a "
               "string comparison)", f"convert it: int({ast.unparse(c)})", "https://docs.python.org/3/library/os.html#os.environ")
    _env_string_in_arithmetic(lt)


_OP_SIGNS = {ast.Div: "/", ast.FloorDiv: "//", ast.Sub: "-", ast.Pow: "**"}


def _env_string_in_arithmetic(lt: PythonLinter) -> None:
    """The other half of ``env-str-as-number``: an environment read with no numeric default (``os.environ[K]``,
    ``os.getenv(K)``) as an operand of ``/``, ``//``, ``-`` or ``**`` (directly or as an arm of a conditional
    expression: ``cpu_count() // (os.environ["LOCAL_WORLD_SIZE"] if dist.is_initialized() else 1)``): the value is
    a string, so the operation raises TypeError whenever the variable is read (deepmd-kit's data loader under
    torchrun).  ``+``, ``*`` and ``%`` are left alone (string concatenation, repetition and formatting)."""
    from helpers.lint.python_rules import _env_key

    for node in lt.nodes:
        if not (isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.FloorDiv, ast.Sub, ast.Pow))):
            continue
        for side in (node.left, node.right):
            arms = [side.body, side.orelse] if isinstance(side, ast.IfExp) else [side]
            read = next((a for a in arms if _env_key(a) is not None and not (
                isinstance(a, ast.Call) and len(a.args) > 1)), None)
            if read is None:
                continue
            key = _env_key(read)
            lt.add("env-str-as-number", "error", node,
                   f"{ast.unparse(node)[:60]}: {key} read from the environment is a string, and "
                   f"'{_OP_SIGNS[type(node.op)]}' between a string and a number raises TypeError whenever it is read",
                   f"convert it first: int({ast.unparse(read)})", "https://docs.python.org/3/library/os.html#os.environ")
            break


_MULTI_NODE = re.compile(r"\b(?:num_machines|machine_rank|node_rank|nnodes|num_nodes|NODE_RANK)\b")


def rule_master_port_per_node(lt: PythonLinter) -> None:
    """``MASTER_PORT`` set from a port this machine finds free (a function that binds port 0, or one named for it),
    in a launcher that handles several machines, outside a ``machine_rank == 0`` branch: every node picks its own
    port, but env:// needs the one port rank 0's store listens on, on every node ("MASTER_PORT - required; has to be
    a free port on machine with rank 0", ``_DIST`` environment-variable initialization).  The other nodes connect to
    a port nobody listens on and the rendezvous times out (Megvii-BaseDetection/YOLOX#240)."""
    from helpers.lint.python_rules import _call_name, _dotted

    if not _MULTI_NODE.search(lt.text) or not re.search(r"MASTER_PORT|master_port|main_process_port", lt.text):
        return
    finders = {f.name for f in lt.nodes if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and (
        re.search(r"(free|available|open|unused)_port", f.name) or any(isinstance(c, ast.Call) and _call_name(c)[1] == "bind" and c.args and
                                     isinstance(c.args[0], ast.Tuple) and len(c.args[0].elts) == 2 and
                                     isinstance(c.args[0].elts[1], ast.Constant) and c.args[0].elts[1].value == 0
                                     for c in ast.walk(f)))}
    if not finders:
        return
    picked = {t.id for node in lt.nodes if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
              and _call_name(node.value)[1] in finders for t in node.targets if isinstance(t, ast.Name)}
    for node in lt.nodes if "MASTER_PORT" in lt.text else []:
        if not (isinstance(node, ast.Assign) and any(isinstance(t, ast.Subscript) and isinstance(t.slice, ast.Constant)
                                                     and t.slice.value == "MASTER_PORT" for t in node.targets)):
            continue
        src = [n for n in ast.walk(node.value) if isinstance(n, ast.Name) and n.id in picked or
               isinstance(n, ast.Call) and _call_name(n)[1] in finders]
        fn = lt._enclosing_function(node)
        if not src or fn is None or not _MULTI_NODE.search(ast.unparse(fn)):
            continue
        gated = any(isinstance(a, ast.If) and re.search(r"(machine|node)_rank\s*==\s*0", ast.unparse(a.test))
                    for a in ancestors(lt, node))
        if gated:
            continue
        lt.add("master-port-random-per-node", "error", node,
               f"MASTER_PORT comes from a port this machine finds free ({ast.unparse(node.value)[:40]}) in a launcher "
               f"for several machines ({_dotted(node.targets[0].value)}): each node picks its own, the other nodes "
               "connect to a port rank 0's store does not listen on (the rendezvous times out)",
               "choose the port on machine 0 and give the same value to every node (a fixed --master-port, or share "
               "it with the address)", _DIST + "#environment-variable-initialization")
    # a per-node launch command built in a loop over the hosts, its master port probed anew in every iteration
    for node in lt.nodes:
        if not (isinstance(node, ast.keyword) and node.arg in ("master_port", "main_process_port", "port") and
                isinstance(node.value, ast.Call) and _call_name(node.value)[1] in finders):
            continue
        loop = next((a for a in ancestors(lt, node) if isinstance(a, ast.For)), None)
        if loop is None or not re.search(r"(?i)host|node|machine|worker", ast.unparse(loop.iter)):
            continue
        lt.add("master-port-random-per-node", "error", node.value,
               f"{node.arg}={ast.unparse(node.value)[:40]} is probed again for every node of `for ... in "
               f"{ast.unparse(loop.iter)[:30]}`: each node's launcher gets its own port, and the nodes after the "
               "first connect to a port rank 0's store does not listen on (the rendezvous times out)",
               "probe the port once, before the loop, and give every node the same value",
               _DIST + "#environment-variable-initialization")


_LAUNCHER_SET = re.compile(r"^(?:ACCELERATE_\w+|FSDP_\w+|LOCAL_RANK|RANK|WORLD_SIZE|LOCAL_WORLD_SIZE|GROUP_RANK|"
                           r"MASTER_ADDR|MASTER_PORT|TORCHELASTIC_\w+|SLURM_\w+|OMPI_COMM_WORLD_\w+|PMI_\w+)$")
"""Variables a launcher sets for the processes it starts (torchrun's contract, ``accelerate launch``'s
``ACCELERATE_*``/``FSDP_*`` from its config, srun's ``SLURM_*``): unset under another launcher, or none."""


def rule_launcher_env_unset(lt: PythonLinter) -> None:
    """``os.environ.get("ACCELERATE_USE_FSDP").lower()``: ``get`` without a default returns None when the variable is
    unset, and a launcher sets its variables only for the processes it starts and the configurations that need them
    (``accelerate launch`` exports ``ACCELERATE_USE_FSDP`` for an FSDP config only; torchrun's ``_TORCHRUN``
    environment), so the method call raises ``AttributeError: 'NoneType' object has no attribute ...`` under any
    other launch (huggingface/peft#2454)."""
    from helpers.lint.python_rules import _env_key

    for node in lt.nodes:
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
            continue
        got = node.func.value
        if not (isinstance(got, ast.Call) and len(got.args) == 1 and not got.keywords):
            continue
        key = _env_key(got)
        if key is None or not _LAUNCHER_SET.match(key) or isinstance(got.func, ast.Subscript):
            continue
        lt.add("launcher-env-unset", "warning", node,
               f"{ast.unparse(got)}.{node.func.attr}(): {key} is set only by some launchers (and configurations); "
               f"unset, get() returns None and .{node.func.attr}() raises AttributeError: 'NoneType' object has no "
               f"attribute '{node.func.attr}'", f"give it a default: {ast.unparse(got)[:-1]}, \"...\").{node.func.attr}()",
               _TORCHRUN + "#environment-variables")


__all__ = ["env_none_fix", "env_none_message", "rule_launcher_env_overwritten", "rule_env_not_a_number", "rule_local_rank_required", "rule_env_str_as_number", "rule_environ_getattr", "rule_launcher_env_unset", "rule_local_rank_spelling", "rule_master_port_per_node", "rule_rank_zero_falsy", "rule_slurm_env"]
