"""Contracts between files: the launch line (or batch script) and the training script it starts.

* what the launcher passes and the script must accept: ``torch.distributed.launch`` passes ``--local-rank=N``
  (PyTorch >= 2.0, https://docs.pytorch.org/docs/stable/distributed.html#launch-utility), the ``deepspeed``
  launcher ``--local_rank=N`` (deepspeed/launcher/launch.py), torchrun nothing (``LOCAL_RANK`` in the
  environment); the arguments written after the script must be options its argparse parser defines;
* what the launcher sets and the script reads: ``init_process_group(env://)`` needs RANK/WORLD_SIZE/MASTER_*,
  which a bare ``python train.py`` does not set;
* what the allocation has and the script uses: ``nccl`` on an allocation with no GPU request, a Lightning
  ``Trainer(devices=, num_nodes=)`` that differs from ``--ntasks-per-node`` / ``--nodes``.

Every rule here decides only when both sides are read (the script's basename is the launch line's script).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

from helpers import launch_parse
from helpers.checks import Check
from helpers.launch_traps import LaunchSpec
from helpers.lint.contract_rules import ScriptContract
from helpers.lint.contracts import _DS_LAUNCH, _INIT, _LAUNCH, _PL_SLURM, _TORCHRUN
from helpers.lint.findings import finding

_PY_LINE = re.compile(r"^[ \t]*(?:[A-Za-z_]\w*=\S*\s+)*(?:\S*/)?python[0-9.]*\s+(?:-u\s+)?([^\s-]\S*\.py)\b", re.M)


def _script(facts: Sequence[object], name: str) -> tuple[str, ScriptContract] | None:
    base = os.path.basename(name or "")
    for f in facts:
        sc = getattr(f, "contract", None)
        if sc is not None and base and os.path.basename(f.path) == base:  # type: ignore[attr-defined]
            return f.path, sc  # type: ignore[attr-defined]
    return None


def _line_of(text: str, pattern: str) -> int:
    m = re.search(pattern, text, re.M)
    return text.count("\n", 0, m.start()) + 1 if m else 1


def lint_cross(facts: Sequence[object], launches: Sequence[tuple[str, str, LaunchSpec | None]]) -> list[Check]:
    """The launch <-> script findings.

    Args:
        facts: the linted scripts' :class:`helpers.lint.python_rules.PyFacts` (with ``contract``).
        launches: ``(path, text, spec)`` of each launch file and of ``--command`` (``spec`` None: no launch
            line the parser reads).
    """
    out: list[Check] = []
    for path, text, spec in launches:
        for m in _PY_LINE.finditer(text):
            got = _script(facts, m.group(1))
            if got is None or not got[1].env_init or got[1].spawns or not got[1].init_line:
                continue
            if re.search(r"^\s*(export\s+)?(RANK|WORLD_SIZE)=", text, re.M):
                continue
            out.append(finding(
                "env-init-without-launcher", "error", path, text.count("\n", 0, m.start()) + 1,
                f"{m.group(1)} is started by plain python, one process with no RANK/WORLD_SIZE/MASTER_ADDR, and "
                f"init_process_group ({got[0]}:{got[1].init_line}) reads them from the environment: 'environment "
                "variable RANK expected, but not set'", "start it with torchrun --nproc-per-node=N (or srun + "
                "torchrun)", _INIT))
        if spec is None:
            continue
        got = _script(facts, spec.script)
        if got is None:
            continue
        script, sc = got
        line = launch_parse.launch_line(text) or 1
        legacy = bool(re.search(r"torch\.distributed\.launch\b", text)) and not re.search(r"--use[-_]env", text)
        if legacy and sc.options is not None and "--local-rank" not in sc.options:
            had = "--local_rank" in sc.options
            out.append(finding(
                "local-rank-arg-under-launcher", "error", script, sc.options_line,
                "python -m torch.distributed.launch passes --local-rank=N (dashed since PyTorch 2.0) and this "
                f"parser defines {'only --local_rank' if had else 'no --local-rank'}: 'error: unrecognized "
                "arguments: --local-rank=0'",
                'parser.add_argument("--local-rank", "--local_rank", type=int), or switch to torchrun and read '
                "LOCAL_RANK", _LAUNCH))
        elif spec.kind == "deepspeed" and "--no_local_rank" not in text and "--no-local-rank" not in text and \
                sc.options is not None and "--local_rank" not in sc.options:
            out.append(finding(
                "local-rank-arg-under-launcher", "error", script, sc.options_line,
                "the deepspeed launcher passes --local_rank=N to the script and this parser does not define it: "
                "'error: unrecognized arguments: --local_rank=0'",
                'parser.add_argument("--local_rank", type=int, default=-1) (or deepspeed --no_local_rank)',
                _DS_LAUNCH))
        elif spec.kind in ("torchrun", "srun+torchrun", "sbatch") and not legacy and sc.local_rank_arg and \
                sc.uses_args_local_rank and not sc.reads_local_rank_env:
            out.append(finding(
                "local-rank-arg-under-launcher", "error", script, sc.options_line,
                "torchrun passes no --local-rank (it sets LOCAL_RANK in the environment) and the script takes its "
                "device from args.local_rank: every rank keeps the default (all on one GPU, or not distributed)",
                "local_rank = int(os.environ['LOCAL_RANK'])", _TORCHRUN))
        if sc.options is not None:
            out += _unknown_args(path, line, spec, sc, script)
        if spec.kind == "sbatch" and spec.gpus_per_node == 0 and sc.backend == "nccl":
            out.append(finding(
                "nccl-without-gpus", "error", script, sc.init_line,
                f"init_process_group(backend='nccl') but {path} requests no GPU (no --gpus-per-node / --gres=gpu): "
                "'ProcessGroupNCCL is only supported with GPUs, no GPUs found!'",
                "request GPUs (#SBATCH --gpus-per-node=N) or use backend='gloo' on CPU nodes", _INIT))
    out += _lightning(facts, launches)
    return out


def _unknown_args(path: str, line: int, spec: LaunchSpec, sc: ScriptContract, script: str) -> list[Check]:
    options = sc.options or set()
    for arg in spec.script_args:
        if arg == "--":
            break
        if not arg.startswith("-") or re.fullmatch(r"-\d.*", arg) or "$" in arg or "{" in arg:
            continue
        name = arg.split("=", 1)[0]
        if name in options or (name.startswith("--") and any(o.startswith(name) for o in options if o.startswith("--"))):
            continue  # argparse accepts a unique prefix of a long option (allow_abbrev)
        return [finding("script-arg-unknown", "error", path, line,
                        f"the launch line passes {name} to {os.path.basename(script)}, whose argparse parser "
                        f"({script}:{sc.options_line}) does not define it: 'error: unrecognized arguments: {arg}'",
                        f"add parser.add_argument('{name}', ...) or drop it from the launch line", _TORCHRUN)]
    return []


def _lightning(facts: Sequence[object], launches: Sequence[tuple[str, str, LaunchSpec | None]]) -> list[Check]:
    out: list[Check] = []
    for path, text, _spec in launches:
        header = launch_parse.sbatch_header(text)
        if not header:
            continue
        tasks, nodes = header.get("--ntasks-per-node", ""), header.get("--nodes", "")
        for f in facts:
            sc = getattr(f, "contract", None)
            if sc is None or sc.trainer is None:
                continue
            tline, devices, num_nodes = sc.trainer
            if devices is not None and tasks.isdigit() and int(tasks) != devices:
                out.append(finding(
                    "lightning-slurm-mismatch", "error", f.path, tline,  # type: ignore[attr-defined]
                    f"Trainer(devices={devices}) but {path} sets --ntasks-per-node={tasks}: 'You set devices="
                    f"{devices} in Lightning, but the number of tasks per node configured in SLURM "
                    f"--ntasks-per-node={tasks} does not match'", f"devices={tasks} (one task per GPU)", _PL_SLURM))
            if num_nodes is not None and nodes.isdigit() and int(nodes) != num_nodes:
                out.append(finding(
                    "lightning-slurm-mismatch", "error", f.path, tline,  # type: ignore[attr-defined]
                    f"Trainer(num_nodes={num_nodes}) but {path} allocates --nodes={nodes}: the ranks wait for "
                    "nodes that are not there (or some nodes are idle)", f"num_nodes={nodes}", _PL_SLURM))
    return out
