"""Read a launch back into a :class:`helpers.launch_traps.LaunchSpec`: a pasted command or an sbatch script.

:func:`parse_command` reads ``torchrun ...``, ``python -m torch.distributed.run ...``, ``accelerate
launch ...``, ``deepspeed ...`` and ``srun ... torchrun ...`` (with ``export`` lines before it);
:func:`parse_sbatch` reads a whole batch script (``#SBATCH`` header, exports, the launch line).
Both return the spec that :func:`helpers.launch_traps.find_traps` checks, so the command builder's
traps are also the rules of ``runbook lint`` and of the widget's "paste to check" (one rule set).
For every spec :func:`helpers.launch_traps.render` can write, ``parse_command(render(spec))``
gives the spec back (``parse_sbatch`` for ``kind="sbatch"``), up to the defaults the launcher fills
in (a port of ``None`` is read back as the 29500 that was written).

What the batch shell expands before ``srun`` starts the tasks is taken as expanded: a
``--node-rank=$SLURM_NODEID`` outside single quotes is node 0 on every node (Gilbreth
4.3), so the spec says ``node_rank=0`` and :func:`find_traps` reports ``node-rank-fixed``.
Standard library only.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from typing import Any

from helpers.launch_traps import LaunchSpec


class NoLaunch(ValueError):
    """The text holds no launch line this parser reads (a ``ValueError``: bad input)."""


ASSIGN = re.compile(r"^(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(.*)$", re.DOTALL)  # a quoted value may hold newlines
"""A shell assignment word (``VAR=value``, ``export VAR=value``): the name and the value."""
_EARLY_SLURM = re.compile(r"\$\{?SLURM_(NODEID|PROCID|LOCALID|NODE_RANK)\}?")


def join_continuations(text: str) -> list[tuple[int, str]]:
    """Logical lines (backslash-newline joined, quotes spanning lines kept together), with 1-based first line numbers."""
    out: list[tuple[int, str]] = []
    buf, start, quote = "", 0, ""
    for number, line in enumerate(text.splitlines(), 1):
        if not buf:
            start = number
        escaped = False
        for i, ch in enumerate(line):  # track open quotes so a multi-line 'bash -c' body stays one logical line
            if escaped:
                escaped = False  # \' outside quotes is a literal quote ('\'' inside a single-quoted payload)
            elif quote == '"' and ch == "\\":
                escaped = True  # "...\"..." keeps the double quote open
            elif quote:
                quote = "" if ch == quote else quote
            elif ch == "\\":
                escaped = True
            elif ch == "#" and (i == 0 or line[i - 1] in " \t"):
                break  # a comment: its apostrophes ("doesn't") open no quote (bash(1), COMMENTS)
            elif ch in "'\"":
                quote = ch
        if line.endswith("\\") and not quote:
            buf += line[:-1] + " "
            continue
        buf += line + ("\n" if quote else "")
        if quote:
            continue
        out.append((start, buf))
        buf = ""
    if buf:
        out.append((start, buf))
    merged: list[tuple[int, str]] = []
    for start, line in out:  # a pasted command broken without its backslash: a line that starts with --option
        if merged and line.lstrip().startswith("--") and not merged[-1][1].lstrip().startswith("#"):
            merged[-1] = (merged[-1][0], merged[-1][1].rstrip() + " " + line.strip())
        else:
            merged.append((start, line))
    return merged


_SHLEX_MAX = 65536
"""Longest logical line given to :func:`shlex.split` (characters).  shlex builds each token one character at a
time, quadratic in the token's length (a 2 MB one-word line took over 100 s); a longer line is split on
whitespace instead (Linux caps one argument at 128 KiB, MAX_ARG_STRLEN, so no real launch word is near it)."""


def split_words(line: str) -> list[str]:
    """The words of a shell line: quotes removed, comments dropped, and a command substitution ``$(...)`` kept whole
    with its word (``$(dirname "$0")/train.py`` is one word, as bash splits it; shlex alone does not know ``$(``)."""
    subs: list[str] = []

    def hold(m: re.Match[str]) -> str:
        subs.append(m.group(0))
        return f"\x00{len(subs) - 1}\x00"

    held = re.sub(r"\$\([^()]*\)", hold, line) if "$(" in line else line
    if len(held) > _SHLEX_MAX or not re.search(r"[\"'\\#]", held):
        words = held.split()  # nothing to unquote (or too long to unquote in bounded time)
    else:
        try:
            words = shlex.split(held, comments=True)
        except ValueError:
            words = held.split()
    if not subs:
        return words
    return [re.sub(r"\x00(\d+)\x00", lambda m: subs[int(m.group(1))], w) for w in words]


def _opt(args: list[str], i: int, names: tuple[str, ...]) -> tuple[str | None, int]:
    """The value of option ``args[i]`` if it is one of ``names`` (``--x=v`` or ``--x v``), and the next index."""
    a = args[i]
    for n in names:
        if a == n and i + 1 < len(args):
            return args[i + 1], i + 2
        if a.startswith(n + "="):
            return a[len(n) + 1:], i + 1
    return None, i


MAX_TEXT_CHARS = 2**20
"""Longest command or batch script :func:`parse` reads: 1 Mi characters (a batch script is a few KB)."""

MAX_LINE_CHARS = 128 * 1024
"""Longest line :func:`parse` reads: 128 KiB, Linux's ``MAX_ARG_STRLEN`` (the longest single argument ``execve``
takes, ``include/uapi/linux/binfmts.h``), far above any launch line."""

_MAX_DIGITS = 18


def _int(value: str | None, option: str = "a number") -> int | None:
    """The whole number ``value`` states (``None`` when it is not one: a variable, ``2:4``...).

    Raises:
        ValueError: more than 18 digits (naming ``option``): no launcher count or port is that large, and Python
            refuses to convert past 4,300 digits.
    """
    if value is None:
        return None
    value = value.strip().strip('"')
    if not re.fullmatch(r"\d+", value):
        return None
    if len(value) > _MAX_DIGITS:
        raise ValueError(f"{option}={value[:12]}...: a number of {len(value):,} digits; no launcher accepts it")
    return int(value)


def _norm(flag: str) -> str:
    return flag.replace("_", "-")


def parse_options(args: list[str], value_opts: set[str]) -> tuple[dict[str, str], set[str], str, tuple[str, ...]]:
    """Walk a launcher's argv: ``(values, flags, script, script_args)``.

    An option in ``value_opts`` takes a value (``--opt=v`` or ``--opt v``); any other ``-...`` word is a
    flag; the first other word is the script and everything after it its arguments.  Option names are
    normalised (``_`` -> ``-``), as the launchers accept both spellings.
    """
    vals: dict[str, str] = {}
    flags: set[str] = set()
    i = 0
    while i < len(args):
        a = args[i]
        key, eq, val = a.partition("=")
        nkey = _norm(key)
        if nkey in value_opts:
            if not eq:
                val = args[i + 1] if i + 1 < len(args) else ""
                i += 1
            vals[nkey] = val
        elif a.startswith("-"):
            flags.add(nkey)
        else:
            return vals, flags, a, tuple(args[i + 1:])
        i += 1
    return vals, flags, "", ()


TORCHRUN_VALUE = {"--nnodes", "--nproc-per-node", "--node-rank", "--master-addr", "--master-port", "--rdzv-id",
                  "--rdzv-backend", "--rdzv-endpoint", "--rdzv-conf", "--max-restarts", "--monitor-interval",
                  "--start-method", "--role", "--log-dir", "--redirects", "--tee", "--local-addr", "--logs-specs",
                  "--local-ranks-filter", "--omp-num-threads"}
"""torchrun's options that take a value (the others are flags); used by the parser and the script traps."""
_TORCHRUN_FLAGS = {"--standalone", "--no-python", "--run-path", "--module", "-m"}


ACCELERATE_VALUE = {"--config-file", "--num-processes", "--num-machines", "--machine-rank", "--main-process-ip",
                    "--main-process-port", "--mixed-precision", "--gpu-ids", "--num-cpu-threads-per-process",
                    "--dynamo-backend", "--deepspeed-config-file", "--zero-stage", "--gradient-accumulation-steps",
                    "--deepspeed-hostfile", "--deepspeed-multinode-launcher", "--rdzv-backend",
                    "--main-training-function"}
"""``accelerate launch``'s options that take a value."""
DEEPSPEED_VALUE = {"--num-gpus", "--num-nodes", "--hostfile", "-H", "--node-rank", "--master-addr", "--master-port",
                   "--include", "-i", "--exclude", "-e", "--launcher", "--launcher-args", "--ssh-port"}
"""The ``deepspeed`` runner's options that take a value (the rest are flags)."""


def _torchrun(args: list[str], early: dict[str, Any]) -> dict[str, Any]:
    out, flags, script, script_args = parse_options(args, TORCHRUN_VALUE)
    spec: dict[str, Any] = {"kind": "torchrun"}
    nnodes = out.get("--nnodes")
    if nnodes is not None:
        spec["nnodes"] = _int(nnodes.split(":")[-1], "--nnodes") or nnodes
    nproc = out.get("--nproc-per-node")
    if nproc is not None:
        spec["nproc_per_node"] = _int(nproc, "--nproc-per-node") or nproc
    if out.get("--rdzv-backend") == "c10d" or out.get("--rdzv-endpoint"):
        spec["rdzv"] = "c10d"
        host, _, port = (out.get("--rdzv-endpoint") or "").rpartition(":")
        spec["master_addr"] = host or None
        spec["master_port"] = _int(port, "--rdzv-endpoint port") or None  # port 0: c10d picks a free port (torchrun docs)
    elif "--standalone" in flags:
        spec["rdzv"] = "standalone"
    else:
        spec["rdzv"] = "static"
        spec["master_addr"] = out.get("--master-addr")
        spec["master_port"] = _int(out.get("--master-port"), "--master-port")
    if "--node-rank" in out:
        nr = out["--node-rank"]
        spec["node_rank"] = _int(nr, "--node-rank")
        if spec["node_rank"] is None and early.get("node_rank_early"):
            spec["node_rank"] = 0  # $SLURM_NODEID expanded once by the batch shell: 0 on every node
    spec["script"] = script
    spec["script_args"] = script_args
    return spec


def _accelerate(args: list[str]) -> dict[str, Any]:
    vals, flags, script, rest = parse_options(args, ACCELERATE_VALUE)
    total = _int(vals.get("--num-processes"), "--num-processes") or 1
    machines = _int(vals.get("--num-machines"), "--num-machines") or 1
    spec: dict[str, Any] = {"kind": "accelerate", "nnodes": machines,
                            "nproc_per_node": max(1, total // machines), "script": script, "script_args": rest,
                            "master_port": _int(vals.get("--main-process-port"), "--main-process-port"),
                            "accelerate_cpu": "--cpu" in flags, "rdzv": "static" if machines > 1 else "standalone"}
    if machines > 1:
        spec["node_rank"] = _int(vals.get("--machine-rank"), "--machine-rank")
        spec["master_addr"] = vals.get("--main-process-ip")
    return spec


def _deepspeed(args: list[str]) -> dict[str, Any]:
    vals, flags, script, rest = parse_options(args, DEEPSPEED_VALUE)
    nproc = _int(vals.get("--num-gpus"), "--num-gpus")
    include = vals.get("--include") or vals.get("-i")
    if nproc is None and include:
        nproc = max(len(part.split(":", 1)[-1].split(",")) for part in include.split("@"))
    nnodes = _int(vals.get("--num-nodes"), "--num-nodes") or (2 if (vals.get("--hostfile") or vals.get("-H")) and "--no-ssh" not in flags
                                                and not vals.get("--num-nodes") else 1)
    spec: dict[str, Any] = {"kind": "deepspeed", "nproc_per_node": nproc or 1, "nnodes": nnodes, "script": script,
                            "script_args": rest, "master_port": _int(vals.get("--master-port"), "--master-port"), "rdzv": "static"}
    if nnodes > 1:
        spec["master_addr"] = vals.get("--master-addr")
        spec["node_rank"] = _int(vals.get("--node-rank"), "--node-rank") if "--no-ssh" in flags else None
    return spec


_RUNNERS = {"uv": 1, "poetry": 1, "pipenv": 1, "pdm": 1, "hatch": 1, "nohup": 0, "exec": 0}
"""Words that run the command after them unchanged: ``uv run`` / ``poetry run``... (1: followed by ``run``), ``nohup``
and ``exec`` (0: nothing else)."""


_PYTHON_FLAGS = frozenset({"-u", "-B", "-O", "-OO", "-s", "-S", "-E", "-I", "-P", "-q", "-b", "-bb", "-d", "-v", "-R"})
"""The interpreter's own options that take no value (https://docs.python.org/3/using/cmdline.html), which may stand
between ``python`` and ``-m``."""


def launcher_argv(words: list[str]) -> tuple[str, list[str]] | None:
    """``(launcher, args)`` when ``words`` starts a launcher (after ``VAR=value`` prefixes and a runner that passes the
    command on unchanged: ``uv run``, ``poetry run``, ``nohup``, ``exec``)."""
    i = 0
    while i < len(words) and ASSIGN.match(words[i]) and not words[i].startswith("-"):
        i += 1
    w = words[i:]
    while w and w[0] in _RUNNERS and (len(w) > 1 and w[1] == "run" or _RUNNERS[w[0]] == 0):
        w = w[1 + (w[0] in ("uv", "poetry", "pipenv", "pdm", "hatch")):]  # `uv run deepspeed ...`, `nohup torchrun ...`
    if not w:
        return None
    head = w[0].rsplit("/", 1)[-1]
    if head == "torchrun":
        return "torchrun", w[1:]
    if re.fullmatch(r"python[0-9.]*", head):
        j = 1
        while j < len(w) and (w[j] in _PYTHON_FLAGS or w[j] in ("-X", "-W")):
            j += 2 if w[j] in ("-X", "-W") else 1  # `python -u -m torch.distributed.run` (nanotron's examples)
        if len(w) > j + 1 and w[j] == "-m" and w[j + 1] in ("torch.distributed.run", "torch.distributed.launch"):
            return "torchrun", w[j + 2:]
    if head == "accelerate" and len(w) > 1 and w[1] == "launch":
        return "accelerate", w[2:]
    if head == "deepspeed":
        return "deepspeed", w[1:]
    if head == "srun":
        return "srun", w[1:]
    return None


SRUN_FLAGS = frozenset({
    "-l", "--label", "-u", "--unbuffered", "-v", "--verbose", "-Q", "--quiet", "-O", "--overcommit", "-X",
    "--disable-status", "-Z", "--no-allocate", "-E", "--preserve-env", "-H", "--hold", "-s", "--oversubscribe",
    "-K", "--kill-on-bad-exit", "-h", "--help", "-V", "--version", "--pty", "--multi-prog", "--overlap", "--exact",
    "--exclusive", "--spread-job", "--contiguous", "--reboot", "--test-only", "--use-min-nodes", "--whole", "--x11",
    "--usage", "--no-kill", "-k", "--wait-all-nodes", "--send-libs", "--external-launcher",
    "--jobid-is-jobstep", "--container-writable", "--container-remap-root", "--no-container-mount-home",
    "--container-mount-home", "--no-container-remap-root", "--no-container-entrypoint", "--container-entrypoint",
})
"""srun options that take no value (or only an attached ``=value``): every other option takes the next word as its
value (https://slurm.schedmd.com/srun.html; the ``--container-*`` switches are the pyxis plugin's,
https://github.com/NVIDIA/pyxis#usage)."""


def _srun(args: list[str], raw_line: str, env: dict[str, str | None], early: dict[str, Any]) -> dict[str, Any]:
    """srun options, then the task: ``bash -c 'BODY'`` (BODY parsed line by line) or a launcher."""
    opts: dict[str, str] = {}
    i = 0
    short = {"-N": "--nodes", "-n": "--ntasks"}
    while i < len(args) and (args[i].startswith("-") or args[i].startswith("$") and i + 1 < len(args) and (
            args[i + 1].startswith("-") or launcher_argv(args[i + 1:]) is not None)):
        a = args[i]
        if a.startswith("$"):  # ${AUTO_RESUME}: options the batch shell fills in (or nothing), before the task
            i += 1
            continue
        key, eq, val = a.partition("=")
        key = short.get(key, key)
        bundled = not a.startswith("--") and len(a) > 2  # -N2, -lN2: the value is attached
        if not eq and not bundled and key not in SRUN_FLAGS:
            val = args[i + 1] if i + 1 < len(args) else ""
            i += 1
        elif bundled and a[:2] in short:
            key, val = short[a[:2]], a[2:]
        opts[key] = val
        i += 1
    task = args[i:]
    spec: dict[str, Any] = {}
    if len(task) >= 3 and task[0].rsplit("/", 1)[-1] in ("bash", "sh") and task[1] == "-c":
        body = task[2]
        # was the body single-quoted on the srun line?  Then $SLURM_NODEID expands per task.
        quoted_single = re.search(r"(bash|sh)\s+-c\s+'", raw_line) is not None
        inner_early = dict(early)
        if not quoted_single and _EARLY_SLURM.search(body):
            inner_early["node_rank_early"] = True
        spec = _parse_lines(body, env, inner_early, in_task=True)
    else:
        got = launcher_argv(task)
        if got and got[0] == "torchrun":
            direct = dict(early)
            if _EARLY_SLURM.search(raw_line):
                direct["node_rank_early"] = True  # no shell in the task: the submitting shell expanded it (node 0)
            spec = _torchrun(got[1], direct)
    if not spec.get("script"):
        return {}  # the task is not a launcher we can read (a variable, a wrapper script): no spec
    spec["kind"] = "srun+torchrun"
    nodes = _int(opts.get("--nodes"), "srun --nodes")
    if nodes:
        spec["nnodes"] = nodes
    elif "--nodes" in opts:
        spec["nnodes_expr"] = opts["--nodes"]
    if "--ntasks-per-node" in opts:
        spec["srun_ntasks_per_node"] = _int(opts["--ntasks-per-node"], "srun --ntasks-per-node") or 1
    if "--export" in opts:
        spec["srun_export"] = opts["--export"]
    return spec


def _parse_lines(text: str, env: dict[str, str | None], early: dict[str, Any], *, in_task: bool = False) -> dict[str, Any]:
    """Walk shell lines: collect exports into ``env``; return the fields of the first launch line."""
    for number, line in join_continuations(text):
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        words = split_words(stripped)
        if not words:
            continue
        if words[0] == "unset":
            for name in words[1:]:
                env[name] = None
            continue
        if words[0] == "export" or (len(words) == 1 and ASSIGN.match(words[0])):
            for w in words[1:] if words[0] == "export" else words:
                m = ASSIGN.match(w)
                if m:
                    value = m.group(2)
                    if m.group(1) in ("MASTER_ADDR", "MASTER_PORT") and not in_task:
                        early[m.group(1)] = value
                        continue
                    if _EARLY_SLURM.search(value) and not in_task:
                        early.setdefault("early_vars", set()).add(m.group(1))
                    env[m.group(1)] = value
            continue
        got = launcher_argv(words)
        if got is None:
            continue
        launcher, args = got
        for w in words:  # VAR=value prefixes of the launch command are in its environment
            m = ASSIGN.match(w)
            if not m or w.startswith("-"):
                break
            env[m.group(1)] = m.group(2)
        # a variable set from $SLURM_NODEID in the batch shell, used on the launch line: expanded once
        used_early = any(re.search(r"\$\{?" + v + r"\b", line) for v in early.get("early_vars", ()))
        local_early = dict(early)
        if used_early or (not in_task and _EARLY_SLURM.search(line) and launcher != "srun"):
            local_early["node_rank_early"] = True
        if launcher == "srun":
            spec = _srun(args, stripped, env, local_early)
            if not spec:
                continue
        elif launcher == "torchrun":
            spec = _torchrun(args, local_early)
        elif launcher == "accelerate":
            spec = _accelerate(args)
        else:
            spec = _deepspeed(args)
        spec["_line"] = number
        for name in list(env):
            if name in early.get("early_vars", ()):
                env.pop(name)
        return spec
    return {}


def _finish(fields: dict[str, Any], env: dict[str, str | None], early: dict[str, Any]) -> LaunchSpec:
    names = {f.name for f in dataclasses.fields(LaunchSpec)}
    kwargs = {k: v for k, v in fields.items() if k in names and v is not None}
    if not isinstance(kwargs.get("nnodes", 1), int):
        kwargs.pop("nnodes")
    if not isinstance(kwargs.get("nproc_per_node", 1), int):
        kwargs.pop("nproc_per_node")
    if kwargs.get("kind") in ("srun+torchrun", "sbatch"):
        port = _int(early.get("MASTER_PORT"), "MASTER_PORT")
        if port:
            kwargs["master_port"] = port
        kwargs.pop("master_addr", None)
    kwargs["env"] = dict(env)
    kwargs.setdefault("script", "train.py")
    if not kwargs["script"]:
        raise NoLaunch("command: no training script found after the launcher's options")
    kwargs["script_args"] = tuple(kwargs.get("script_args", ()))
    return LaunchSpec(**kwargs)


def launch_line(text: str) -> int:
    """The 1-based line number of the launch command in ``text`` (0 when there is none); never raises."""
    try:
        return int(_parse_lines(text, {}, {}).get("_line", 0))
    except ValueError:  # a number no launcher accepts (parse() names it): the first line that starts a launcher
        return next((n for n, line in join_continuations(text) if launcher_argv(split_words(line.strip()))), 0)


_MPI = ("mpirun", "mpiexec", "orterun", "prterun")


def _unlaunched(text: str) -> str | None:
    """Why the first command of ``text`` starts no rank contract, when it is a bare ``python`` or an MPI launcher.

    ``python train.py`` (also under ``srun``) starts processes that torch.distributed cannot group:
    nothing sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` (D1).  ``mpirun`` sets Open MPI's own
    variables (``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_SIZE``, ``OMPI_COMM_WORLD_LOCAL_RANK``:
    https://docs.open-mpi.org/en/main/tuning-apps/environment-var.html), which ``init_process_group``'s
    ``env://`` does not read.  None for any other text.
    """
    for _, line in join_continuations(text):
        words = split_words(line.strip())
        if not words or words[0] in ("export", "unset", "cd", "set", "module", "source", ".", "echo") or (
                len(words) == 1 and ASSIGN.match(words[0])):
            continue
        i = 0
        while i < len(words) and ASSIGN.match(words[i]):
            i += 1
        words = words[i:]
        if words and words[0].rsplit("/", 1)[-1] == "srun":
            j = 1
            while j < len(words) and words[j].startswith("-"):
                j += 1 if "=" in words[j] or words[j] in ("--overlap", "--exclusive", "-l", "--label") else 2
            words = words[j:]
        head = words[0].rsplit("/", 1)[-1] if words else ""
        if re.fullmatch(r"python[0-9.]*", head):
            script = next((w for w in words[1:] if not w.startswith("-")), "train.py")
            return (f"command: `{' '.join(words[:2])}` starts the script with no launcher, so no process gets RANK, "
                    "WORLD_SIZE or MASTER_ADDR and init_process_group() cannot form the group (D1: no launcher, no "
                    f"contract); start it with `torchrun --nproc-per-node=N {script}` (one per node)")
        if head in _MPI:
            return (f"command: `{head}` starts the ranks with Open MPI's variables (OMPI_COMM_WORLD_RANK, "
                    "OMPI_COMM_WORLD_SIZE), not the RANK, WORLD_SIZE and MASTER_ADDR that init_process_group('env://') "
                    "reads (D1); launch with torchrun (one per node, `srun ... torchrun` under SLURM), or set RANK, "
                    "WORLD_SIZE, LOCAL_RANK from the OMPI_COMM_WORLD_* variables and MASTER_ADDR/MASTER_PORT in the "
                    "script before init_process_group")
        return None
    return None


def parse_command(text: str) -> LaunchSpec:
    """The :class:`LaunchSpec` of a pasted launch command (``export`` / ``unset`` lines before it allowed).

    Args:
        text: shell text: ``torchrun ...``, ``python -m torch.distributed.run ...``, ``accelerate launch ...``,
            ``deepspeed ...``, or ``srun [opts] torchrun ...`` / ``srun [opts] bash -c '... torchrun ...'``;
            backslash continuations are joined.

    Returns:
        The spec; fields the command does not say keep :class:`LaunchSpec`'s defaults.

    Raises:
        ValueError: no launcher found (the accepted ones are named; a bare ``python script.py`` or an
            ``mpirun`` line is explained: no rank contract, D1), or no script after its options.
    """
    env: dict[str, str | None] = {}
    early: dict[str, Any] = {}
    fields = _parse_lines(text, env, early)
    if not fields:
        raise NoLaunch(_unlaunched(text) or "command: no launcher found; accepted: torchrun, python -m "
                         "torch.distributed.run, accelerate launch, deepspeed, srun ... torchrun")
    return _finish(fields, env, early)


def sbatch_header(text: str) -> dict[str, str]:
    """The ``#SBATCH`` options of a batch script as ``{"--nodes": "2", ...}`` (short forms -N/-n normalised)."""
    opts: dict[str, str] = {}
    short = {"-N": "--nodes", "-n": "--ntasks", "-G": "--gpus", "-c": "--cpus-per-task", "-p": "--partition",
             "-J": "--job-name", "-t": "--time", "-A": "--account", "-o": "--output", "-e": "--error"}
    for line in text.splitlines():
        m = re.match(r"^#SBATCH\s+(.*)$", line.strip())
        if not m:
            continue
        words = split_words(m.group(1))
        i = 0
        while i < len(words):
            key, eq, val = words[i].partition("=")
            if not eq and key in short and i + 1 < len(words):
                val, i = words[i + 1], i + 1
            opts[short.get(key, key)] = val
            i += 1
    return opts


_GPU_REQUESTS = ("--gpus-per-node", "--gres", "--gpus", "-G", "--gpus-per-task", "--gpus-per-socket")


_ARRAY = re.compile(r"^[ \t]*(?:declare[ \t]+-a[ \t]+|local[ \t]+|export[ \t]+)?([A-Za-z_]\w*)=\(", re.MULTILINE)


def _array_body(text: str, start: int) -> str | None:
    """The text between the ``(`` before ``start`` and its matching ``)`` (nested ``$( ... )`` kept), or None."""
    depth = 1
    for i in range(start, len(text)):
        if text[i] == "(":
            depth += 1
        elif text[i] == ")":
            depth -= 1
            if depth == 0:
                return text[start:i]
    return None


def expand_arrays(text: str) -> str:
    """``text`` with each ``"${NAME[@]}"`` / ``${NAME[@]}`` replaced by the elements of the bash array ``NAME=( ... )``
    the script assigns once (``declare -a TORCHRUN_ARGS=( --nproc_per_node=4 ... )``, comments dropped), on the
    line where it is used, so the launch line reads as bash runs it ("${name[@]} expands each element of name to a
    separate word", https://www.gnu.org/software/bash/manual/html_node/Arrays.html).  An array assigned twice, or
    appended to (``NAME+=``), is left as written: its value depends on the path taken.  Line numbers are kept."""
    if "[@]" not in text:
        return text
    found: dict[str, list[str]] = {}
    for m in _ARRAY.finditer(text):
        inner = _array_body(text, m.end())
        if inner is None or m.group(1) in found or re.search(rf"^\s*{m.group(1)}\+=", text, re.MULTILINE):
            found[m.group(1)] = []  # unclosed, assigned twice or appended to: not expanded
            continue
        body = " ".join(re.sub(r"(?:^|\s)#.*$", "", ln) for ln in inner.replace("\\\n", " ").splitlines())
        found[m.group(1)] = body.split() or [""]
    for name, words in found.items():
        if words:
            text = re.sub(rf'"?\$\{{{name}\[@\]\}}"?', lambda _m, w=" ".join(words): w, text)
    return text


def parse_sbatch(text: str) -> LaunchSpec:
    """The :class:`LaunchSpec` of a batch script: ``#SBATCH`` header plus its launch line.

    ``--nodes`` and ``--ntasks-per-node`` (inherited by ``srun`` unless it overrides them) and
    ``--gpus-per-node`` / ``--gres=gpu:N`` come from the header (no GPU request at all: ``gpus_per_node=0``,
    for an ``srun`` launch; a request left disabled, ``##SBATCH --gpus-per-node=N  # EDIT``: ``None``); exports at the top and inside the
    task's ``bash -c`` go to ``env``.  A script that launches with ``srun`` is ``kind="sbatch"``; one
    that runs ``deepspeed`` / ``accelerate launch`` / ``torchrun`` directly keeps that kind, with the
    allocation's node count (so ``deepspeed --hostfile`` in an allocation is ``deepspeed-ssh``).

    Raises:
        ValueError: no launch line found.
    """
    header = sbatch_header(text)
    env: dict[str, str | None] = {}
    early: dict[str, Any] = {}
    fields = _parse_lines(expand_arrays(text), env, early)
    if not fields:
        why = _unlaunched("\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#")))
        raise NoLaunch(why.replace("command:", "sbatch:", 1) if why else
                         "sbatch: no launch line (srun, torchrun, accelerate launch, deepspeed) found")
    nodes = _int(header.get("--nodes", "").split("-")[0], "#SBATCH --nodes") if header.get("--nodes") else None
    if fields.get("kind") == "srun+torchrun":
        fields["kind"] = "sbatch"
        if nodes and not isinstance(fields.get("nnodes"), int):
            fields["nnodes"] = nodes
        if "srun_ntasks_per_node" not in fields and header.get("--ntasks-per-node"):
            fields["srun_ntasks_per_node"] = _int(header["--ntasks-per-node"], "#SBATCH --ntasks-per-node") or 1
        if "srun_export" not in fields and header.get("--export"):
            fields["srun_export"] = header["--export"]
    elif nodes and fields.get("kind") == "deepspeed" and fields.get("nnodes", 1) == 1 and nodes > 1:
        fields["nnodes"] = nodes
        fields.setdefault("master_addr", None)
    gpus = header.get("--gpus-per-node")
    gres = re.search(r"gpu(?::[A-Za-z0-9_-]+)?:(\d+)", header.get("--gres", ""))
    g = _int(gpus.split(":")[-1], "#SBATCH --gpus-per-node") if gpus else (_int(gres.group(1), "#SBATCH --gres") if gres else None)
    disabled = re.search(r"^##SBATCH\s+--(?:gpus-per-node|gres)\b", text, re.M)
    if g is None and fields.get("kind") == "sbatch" and not any(k in header for k in _GPU_REQUESTS) and not disabled:
        g = 0  # no GPU request at all: the allocation has none (a CPU job, gloo); a disabled one: unknown (None)
    if g is not None:
        fields["gpus_per_node"] = g
    return _finish(fields, env, early)


def parse(text: str) -> LaunchSpec:
    """:func:`parse_sbatch` for a batch script (a ``#!`` first line or a ``#SBATCH`` line), else :func:`parse_command`.

    What the command builder's "paste to check" box and ``runbook build --check`` call.

    Raises:
        ValueError: as :func:`parse_command` / :func:`parse_sbatch`; an empty ``text``; more than
            :data:`MAX_TEXT_CHARS` characters or a line over :data:`MAX_LINE_CHARS`.
    """
    if not isinstance(text, str) or not text.strip():
        raise NoLaunch("command: empty; paste a torchrun / accelerate launch / deepspeed / srun command or an sbatch script")
    if len(text) > MAX_TEXT_CHARS:
        raise ValueError(f"command: {len(text):,} characters, over the limit of {MAX_TEXT_CHARS:,} (a launch line or batch script)")
    for number, line in enumerate(text.splitlines(), 1):
        if len(line) > MAX_LINE_CHARS:
            raise ValueError(f"command: line {number} is {len(line):,} characters long, over the limit of {MAX_LINE_CHARS:,}")
    if text.lstrip().startswith("#!") or re.search(r"^\s*#SBATCH\b", text, re.MULTILINE):
        return parse_sbatch(text)
    return parse_command(text)


def canonical(spec: LaunchSpec) -> LaunchSpec:
    """``spec`` as its rendered command states it: what :func:`parse` reads back from :func:`helpers.launch_traps.render`.

    ``render(canonical(s)) == render(s)`` and ``parse(render(s)) == canonical(s)`` for every spec that
    renders (``tests/unit/test_launch_parse.py`` checks both on 1,000 random specs).  The changes:

    * defaults the command writes become explicit: the port 29500 (every form that writes a port), node
      rank 0 (multi-node static torchrun, accelerate), ``127.0.0.1`` for one torchrun node with a port,
      (``gpus_per_node`` of an sbatch script stays as given: ``None`` is written as a disabled request,
      ``##SBATCH --gpus-per-node=N  # EDIT``, which reads back as ``None``);
    * fields the form does not write are reset to their defaults: ``master_addr`` / ``node_rank`` on
      one node and in the SLURM forms (``scontrol`` and ``$SLURM_NODEID`` give them), ``gpus_per_node``
      outside ``sbatch``, ``accelerate_cpu`` outside accelerate, ``srun_*`` outside the SLURM forms;
    * ``rdzv`` becomes what the command uses: ``static`` for one torchrun node with a port, for the
      SLURM forms unless ``c10d``, and for deepspeed; accelerate is ``standalone`` on one node.

    Raises:
        ValueError: as :func:`helpers.launch_traps.validate`, naming the field.
    """
    from helpers import launch_traps, launchers

    launch_traps.validate(spec)
    default_port = launchers.DEFAULT_MASTER_PORT
    multi = spec.nnodes > 1
    keep: dict[str, Any] = {"kind": spec.kind, "nnodes": spec.nnodes, "nproc_per_node": spec.nproc_per_node,
                            "script": spec.script, "script_args": tuple(spec.script_args), "env": dict(spec.env)}
    if spec.kind in ("srun+torchrun", "sbatch"):
        keep.update(rdzv="c10d" if spec.rdzv == "c10d" else "static", master_port=spec.master_port or default_port,
                    srun_ntasks_per_node=spec.srun_ntasks_per_node, srun_export=spec.srun_export)
        if spec.kind == "sbatch":
            keep["gpus_per_node"] = spec.gpus_per_node
    elif spec.kind == "torchrun":
        if not multi and spec.rdzv == "standalone" and spec.master_port is None:
            keep.update(rdzv="standalone")
        elif not multi:
            keep.update(rdzv="static", master_addr=spec.master_addr or "127.0.0.1", master_port=spec.master_port or default_port)
        else:
            keep.update(rdzv=spec.rdzv, master_addr=spec.master_addr, master_port=spec.master_port or default_port)
            if spec.rdzv == "static":
                keep["node_rank"] = 0 if spec.node_rank is None else spec.node_rank
            elif spec.rdzv == "standalone":
                keep["node_rank"] = spec.node_rank
    elif spec.kind == "accelerate":
        keep.update(rdzv="static" if multi else "standalone", accelerate_cpu=spec.accelerate_cpu,
                    master_port=spec.master_port or default_port if multi else spec.master_port)
        if multi:
            keep.update(master_addr=spec.master_addr, node_rank=0 if spec.node_rank is None else spec.node_rank)
    else:  # deepspeed
        keep.update(rdzv="static", master_port=spec.master_port or default_port if multi else spec.master_port)
        if multi:
            keep.update(master_addr=spec.master_addr, node_rank=spec.node_rank)
    return LaunchSpec(**keep)


def describe(spec: LaunchSpec) -> str:
    """One line for people: ``torchrun, 2 node(s) x 8 rank(s), rendezvous static, master n0:29500, script train.py, env A, B``."""
    where = ((f", master {spec.master_addr}" if spec.master_addr else "")
             + (f"{':' if spec.master_addr else ', port '}{spec.master_port}" if spec.master_port else ""))
    args = f" {shlex.join(spec.script_args)}" if spec.script_args else ""
    return (f"{spec.kind}, {spec.nnodes} node(s) x {spec.nproc_per_node} rank(s), rendezvous {spec.rdzv}{where}"
            f"{f', node rank {spec.node_rank}' if spec.node_rank is not None else ''}, script {spec.script}{args}"
            f"{', env ' + ', '.join(spec.env) if spec.env else ''}")


# --------------------------------------------------------------------------- checking a launch text
# (here, not in launch_traps: the checks need this module's parser, and this module imports launch_traps)
