"""Contract rules on files every rank shares: a directory made on one rank and read or written by all, save hooks and
trackers on every rank, a rank restored from a checkpoint over the launcher's (D23; https://docs.pytorch.org/docs/stable/notes/serialization.html).
Run by :func:`helpers.lint.contract_rules.run`."""

from __future__ import annotations

import ast
import itertools
import re
from typing import TYPE_CHECKING

from helpers.lint.contract_ast import ancestors, method_named, statement_blocks, subtree
from helpers.lint.contracts import _ACC, _DIST, _TORCHRUN

if TYPE_CHECKING:
    from helpers.lint.python_rules import PythonLinter



BLANK_TRACKER = frozenset({"finish", "log", "main_process_only", "start", "store_init_configuration"})
"""What the stand-in tracker answers: ``Accelerator.get_tracker`` returns ``GeneralTracker(_blank=True)`` on every
process that holds no tracker ("Handle tracker only made on main process", accelerate/accelerator.py get_tracker;
W&B, TensorBoard, MLflow ... trackers are made on the main process only, ``main_process_only = True`` in
accelerate/tracking.py); ``dir()`` of that object in accelerate 1.15 is this set."""


def rule_tracker_on_every_rank(lt: PythonLinter) -> None:
    """``accelerator.get_tracker("wandb").run`` (or ``.tracker``, ``.log_images`` ...) outside a main-process gate:
    on the other processes ``get_tracker`` returns a blank ``GeneralTracker`` without the run, so they stop with
    ``AttributeError: 'GeneralTracker' object has no attribute 'run'`` (allenai/open-instruct#1539 moved its
    ``wandb_tracker.run.url`` reads under ``accelerator.is_main_process``)."""
    from helpers.lint.python_rules import _call_name

    if "get_tracker" not in lt.text:
        return
    tracker_names: set[str] = set()
    for node in lt.nodes:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and _call_name(node.value)[1] == "get_tracker":
            tracker_names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    for node in lt.nodes:
        if not isinstance(node, ast.Attribute) or node.attr in BLANK_TRACKER or node.attr.startswith("_"):
            continue
        v = node.value
        direct = isinstance(v, ast.Call) and _call_name(v)[1] == "get_tracker"
        if not (direct or isinstance(v, ast.Name) and v.id in tracker_names):
            continue
        if lt._rank_gate(node) is not None or lt._after_rank_exit(node):
            continue
        fn = lt._enclosing_function(node)
        if fn is not None and lt._function_only_called_gated(fn):
            continue
        lt.add("main-process-object-every-rank", "error", node,
               f"{ast.unparse(node)[:70]} runs on every process, but only the main process holds the tracker: the "
               f"others get a blank GeneralTracker, which has no '{node.attr}' (AttributeError on every rank but 0)",
               "read it under `if accelerator.is_main_process:` (or keep the value from the main process)",
               _ACC + "#accelerate.Accelerator.get_tracker")



_RANK0_RUN_MAKERS = re.compile(r"\bWandbLogger\(|\.init_trackers\(")
"""What starts the W&B run on the main process only: Lightning's ``WandbLogger`` (its ``experiment`` is
``@rank_zero_experiment``: the other ranks get a dummy,
https://lightning.ai/docs/pytorch/stable/extensions/generated/lightning.pytorch.loggers.WandbLogger.html) and
Accelerate's ``Accelerator.init_trackers`` (``@on_main_process``)."""


def rule_raw_wandb_log(lt: PythonLinter) -> None:
    """A module-level ``wandb.log(...)`` on every rank where the run is started by ``WandbLogger`` or
    ``accelerator.init_trackers`` (:data:`_RANK0_RUN_MAKERS`) and nothing calls ``wandb.init``: the main process has
    a run, the others have none and stop with "You must call wandb.init() before wandb.log()" (W&B's distributed
    guide: log from the process that called ``wandb.init``, https://docs.wandb.ai/guides/track/log/distributed-training/).
    The maker may be in another linted file (the facts :attr:`PyFacts.raw_wandb_logs` / ``starts_rank0_run`` feed
    :func:`helpers.lint.cross_rules.raw_wandb_across_files`)."""
    from helpers.lint.python_rules import _call_name

    # one process has the run too: only a run of several processes (a Lightning strategy / device count set, or an
    # Accelerate script, made to be started by accelerate launch) has ranks without it
    lt.facts.starts_rank0_run = bool(_RANK0_RUN_MAKERS.search(lt.text)) and (
        ".init_trackers(" in lt.text or bool(re.search(r"(?i)ddp|fsdp|deepspeed|strategy\s*=|num_nodes|devices\s*=",
                                                      lt.text)))
    lt.facts.calls_wandb_init = "wandb.init(" in lt.text
    if "wandb.log(" not in lt.text:
        return
    for c in lt._calls():
        if _call_name(c) != ("wandb", "log") or lt._rank_gate(c) is not None or lt._after_rank_exit(c):
            continue
        fn = lt._enclosing_function(c)
        if fn is not None and lt._function_only_called_gated(fn):
            continue
        lt.facts.raw_wandb_logs.append(c.lineno)
    if lt.facts.raw_wandb_logs and lt.facts.starts_rank0_run and not lt.facts.calls_wandb_init:
        lt.add("main-process-object-every-rank", "error", lt.facts.raw_wandb_logs[0], RAW_WANDB_MESSAGE,
               RAW_WANDB_FIX, "https://docs.wandb.ai/guides/track/log/distributed-training/")
        lt.facts.raw_wandb_logs = []  # reported here; nothing left for the case-wide form


RAW_WANDB_MESSAGE = ("wandb.log(...) runs on every rank, but the W&B run is started on the main process only "
                     "(WandbLogger / accelerator.init_trackers) and nothing calls wandb.init: every other rank stops "
                     "with 'You must call wandb.init() before wandb.log()'")
RAW_WANDB_FIX = ("log through the logger (self.logger.experiment / accelerator.log), or gate it: if "
                 "self.global_rank == 0 / accelerator.is_main_process")


_RANK_FIELDS = frozenset({"local_rank", "global_rank", "rank", "node_rank"})
"""Per-process option fields (the world size is the same in every process: reloading it loses nothing of this one)."""


def _attr_targets(node: ast.Assign, name: str) -> set[str]:
    """``{attr}`` of every ``name.attr`` the assignment sets, tuple targets included."""
    from helpers.lint.wrappers import flat_targets

    return {t.attr for t in flat_targets(node)
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == name}


_LOADERS = frozenset({"load", "safe_load", "full_load", "loads"})


def rule_rank_overwritten_on_resume(lt: PythonLinter) -> None:
    """Options reloaded from a saved file (``opt = argparse.Namespace(**yaml.load(f))``, ``args = torch.load(...)
    ["args"]``) after the process's rank was put in them, and the rank read again afterwards: the file was written
    by one process (rank 0) of an earlier run, so every process now carries rank 0's ``local_rank``/``global_rank``
    (torchrun sets RANK/LOCAL_RANK/WORLD_SIZE for each process at each start, ``_TORCHRUN`` environment variables;
    ultralytics/yolov5#1810: after --resume every rank called set_device(0))."""
    from helpers.lint.python_rules import _call_name

    if not re.search(r"\b(?:local_rank|global_rank)\b", lt.text):
        return
    by_scope: dict[ast.AST | None, list[ast.Assign]] = {}  # each function's own assignments (None: module level)
    for n in lt.nodes:
        if isinstance(n, ast.Assign):
            by_scope.setdefault(lt._enclosing_function(n), []).append(n)
    for scope, stmts in by_scope.items():
        fn = lt.tree if scope is None else scope
        for node in stmts:
            if len(node.targets) != 1 or not isinstance(node.targets[0], ast.Name):
                continue
            name = node.targets[0].id
            if not any(isinstance(c, ast.Call) and _call_name(c)[1] in _LOADERS for c in ast.walk(node.value)):
                continue
            before = {a for n in stmts if n.lineno < node.lineno for a in _attr_targets(n, name)} & _RANK_FIELDS
            if not before:
                continue  # the rank was never put in these options: nothing of this process is lost
            again = {a for n in stmts if n.lineno > node.lineno for a in _attr_targets(n, name)}
            reads = [a for a in subtree(fn) if isinstance(a, ast.Attribute) and isinstance(a.ctx, ast.Load)
                     and isinstance(a.value, ast.Name) and a.value.id == name and a.attr in before - again
                     and a.lineno > node.lineno]
            if reads:
                lt.add("rank-overwritten-on-resume", "error", node,
                       f"{name} is replaced from a saved file here after this process's {', '.join(sorted(before))} "
                       f"was put in it, and {name}.{reads[0].attr} is read again (line {reads[0].lineno}): the file "
                       "holds the values of the process that wrote it (rank 0), so every process now has them",
                       f"keep the process's own values across the reload (save {name}.local_rank and "
                       f"{name}.global_rank before it and set them again after)", _TORCHRUN + "#environment-variables")
                break


_CONFIG_LOADER = re.compile(rf"^(?:{'|'.join(sorted(_LOADERS))}|load_(?:config|conf|cfg|args|yaml|json|opts|hparams)\w*)$")
""":data:`_LOADERS` and a project's own config reader (``load_config``, ``load_yaml``)."""
_NAMESPACE_DICT = re.compile(r"vars\((\w+)\)|(\w+)\.__dict__")


def rule_rank_overwritten_by_setattr_loop(lt: PythonLinter) -> None:
    """``rank-overwritten-on-resume`` for a namespace refilled key by key from a saved file: ``for k, v in
    load_config(path).items(): setattr(args, k, v)`` (or ``vars(args).update(conf)`` / ``args.__dict__.update(conf)``)
    with no exception for the per-process fields, then ``args.local_rank`` read: every process now carries the
    ``local_rank`` of the process that saved the file (rank 0), so all of them bind GPU 0 (neural_sp's ASR trainer on
    ``--resume``).  The contract is the launcher's: LOCAL_RANK / RANK are this start's, per process (``_TORCHRUN``)."""
    from helpers.lint.python_rules import _call_name

    if not re.search(r"\b(?:local_rank|global_rank)\b", lt.text):
        return
    for node in lt.nodes:
        target = source = None
        if isinstance(node, ast.For) and isinstance(node.target, ast.Tuple) and isinstance(node.iter, ast.Call) and \
                _call_name(node.iter)[1] == "items" and isinstance(node.iter.func, ast.Attribute):
            sets = [c for c in ast.walk(node) if isinstance(c, ast.Call) and _call_name(c)[1] == "setattr" and
                    len(c.args) == 3 and isinstance(c.args[0], ast.Name)]
            if sets:
                target, source = sets[0].args[0].id, node.iter.func.value  # type: ignore[attr-defined]
        elif isinstance(node, ast.Call) and _call_name(node)[1] == "update" and node.args and \
                isinstance(node.func, ast.Attribute) and (m := _NAMESPACE_DICT.fullmatch(ast.unparse(node.func.value))):
            target, source = (m.group(1) or m.group(2)), node.args[0]
        if target is None or source is None:
            continue
        fn = lt._enclosing_function(node) or lt.tree
        loaded = source
        if isinstance(source, ast.Name):  # conf = load_config(path); for k, v in conf.items()
            loaded = next((n.value for n in subtree(fn) if isinstance(n, ast.Assign) and n.lineno <= node.lineno
                           and any(isinstance(t, ast.Name) and t.id == source.id for t in n.targets)), source)
        if not any(isinstance(c, ast.Call) and _CONFIG_LOADER.match(_call_name(c)[1]) for c in ast.walk(loaded)):
            continue
        if re.search(r"rank", ast.unparse(node)):
            continue  # the loop keeps the rank fields out (if k not in ("local_rank", ...))
        end = getattr(node, "end_lineno", node.lineno)
        again = any(isinstance(a, ast.Attribute) and isinstance(a.ctx, ast.Store) and isinstance(a.value, ast.Name)
                    and a.value.id == target and a.attr in _RANK_FIELDS and a.lineno > end for a in subtree(fn))
        read = next((a for a in subtree(fn) if isinstance(a, ast.Attribute) and isinstance(a.ctx, ast.Load)
                     and isinstance(a.value, ast.Name) and a.value.id == target and a.attr in _RANK_FIELDS
                     and a.lineno > end), None)
        if read is None or again:
            continue
        lt.add("rank-overwritten-on-resume", "error", node,
               f"every key of {ast.unparse(source)[:40]} (a file saved by one process) is written into {target}, "
               f"{target}.{read.attr} included, and {target}.{read.attr} is read afterwards (line {read.lineno}): "
               "every process now has the saver's value (rank 0's), so all of them take the same GPU",
               f"skip the per-process fields when reloading (if k not in ('local_rank', 'rank', ...)), or set "
               f"{target}.{read.attr} again from the environment after it", _TORCHRUN + "#environment-variables")


def rule_rank_gated_directory(lt: PythonLinter) -> None:
    """A directory created under a rank gate (``if rank == 0: os.makedirs(ckpt_dir)``) and written into on every
    rank later in the same function, with no barrier between: the other ranks may get there before rank 0 made it,
    or run on a node that never makes it (a node-local disk), and fail with FileNotFoundError
    (karpathy/nanochat: every rank saves its optimizer shard into the directory rank 0 creates).  ``os.makedirs``'s
    ``exist_ok=True`` makes it safe on every rank (https://docs.python.org/3/library/os.html#os.makedirs)."""
    from helpers.lint.python_rules import _call_name, _written_paths

    if "makedirs" not in lt.text and "mkdir" not in lt.text:
        return
    for c in lt._calls():
        recv, name = _call_name(c)
        if name not in ("makedirs", "mkdir") or lt._rank_gate(c) is None:
            continue
        target = c.args[0] if c.args and name == "makedirs" else c.func.value if isinstance(c.func, ast.Attribute) \
            and recv not in ("os",) else None
        if not isinstance(target, ast.Name):
            continue
        fn = lt._enclosing_function(c) or lt.tree
        names = {target.id}
        for n in subtree(fn):  # paths built from it: p = os.path.join(d, ...), d / "x", f"{d}/x"
            if isinstance(n, ast.Assign) and n.lineno > c.lineno and any(
                    isinstance(x, ast.Name) and x.id in names for x in ast.walk(n.value)):
                names.update(t.id for t in n.targets if isinstance(t, ast.Name))
        if any(_call_name(n)[1] in ("makedirs", "mkdir") and lt._rank_gate(n) is None for n in subtree(fn)
               if isinstance(n, ast.Call)):
            continue  # made on every rank too
        later = sorted((n for n in subtree(fn) if isinstance(n, ast.Call) and getattr(n, "lineno", 0) > c.lineno),
                       key=lambda n: n.lineno)
        for w in later:
            wname = _call_name(w)[1]
            if wname in ("barrier", "wait_for_everyone"):  # torch.distributed's, Accelerate's, Lightning's strategy
                break
            if lt._write_kind(w) != "file" or lt._rank_gate(w) is not None:
                continue  # what writes a file: the one list of python_rules (torch.save, open(p, "w"), ...)
            if not any(isinstance(x, ast.Name) and x.id in names for a in _written_paths(w) for x in ast.walk(a)):
                continue
            lt.add("rank-gated-object-used", "warning", w,
                   f"{ast.unparse(w)[:60]} runs on every rank and writes into {target.id}, which only "
                   f"`{ast.unparse(getattr(lt._rank_gate(c), 'test', c))[:40]}` creates (line {c.lineno}), with no "
                   "barrier between: another rank can get there first, or run on a node where it was never made "
                   "(FileNotFoundError)",
                   f"create it on every rank (os.makedirs({target.id}, exist_ok=True) is safe to repeat), or "
                   "barrier() after rank 0 creates it", "https://docs.python.org/3/library/os.html#os.makedirs")
            break


_EVERY_PROCESS = re.compile(r"DistributedDataParallel|\bDDP\(|init_process_group|Accelerator\(|deepspeed\.initialize|"
                            r"LightningCLI\(|Fabric\(|\b(?:pl|L)\.Trainer\(|lightning\.pytorch")
"""What says a file's top-level code runs in every process of a job (a process group, or a Lightning entry point,
which starts its extra processes by running the same script again)."""


def rule_makedirs_race(lt: PythonLinter) -> None:
    """``if not os.path.exists(d): os.makedirs(d)`` (or a bare ``os.makedirs(d)`` / ``Path.mkdir()``) without
    ``exist_ok=True``, outside any rank gate, in a file every process runs: ``os.makedirs`` "raises FileExistsError
    if the target directory already exists" unless ``exist_ok`` is true
    (https://docs.python.org/3/library/os.html#os.makedirs), so two ranks that both saw the directory missing race,
    and the loser crashes (RWKV/RWKV-infctx-trainer#31: multi-node runs died with FileExistsError).  Not under a
    ``try`` that catches it, not for a per-rank path, not on one rank only (a gate, an early exit of the other ranks,
    a function called only under a gate).  An error when nothing checks first (every rank but one fails); a note
    for check-then-create, which fails only when two ranks reach it in the same instant."""
    from helpers.lint.python_rules import _call_name

    if not re.search(r"makedirs|mkdir", lt.text) or not _EVERY_PROCESS.search(lt.text):
        return
    for c in lt._calls():
        recv, name = _call_name(c)
        if name not in ("makedirs", "mkdir") or (name == "makedirs" and recv not in ("os", "")):
            continue
        if name == "mkdir" and recv == "" or any(k.arg == "exist_ok" and not (
                isinstance(k.value, ast.Constant) and not k.value.value) for k in c.keywords):
            continue
        if name == "makedirs" and len(c.args) > 2 or lt._rank_gate(c) is not None or lt._after_rank_exit(c) or \
                lt._before_own_spawn(c):
            continue
        fn = lt._enclosing_function(c)
        if fn is not None and lt._function_only_called_gated(fn):
            continue
        target = c.args[0] if c.args and recv == "os" else c.func.value if isinstance(c.func, ast.Attribute) else None
        if target is None or lt._rank_in_name(target, c) or _catches_exists(lt, c):
            continue
        checked = next((p for p in _ancestors(lt, c) if isinstance(p, ast.If) and re.search(
            r"\bnot\b.*(?:exists|isdir)\(", ast.unparse(p.test))), None)
        how = (f"after `{ast.unparse(checked.test)[:50]}` (line {checked.lineno}): two ranks can both see it missing, "
               "and the second makedirs raises FileExistsError" if checked else
               "on every rank: all but the first process to get there raise FileExistsError")
        lt.add("write-on-every-rank", "error" if checked is None else "info", c,
               f"{ast.unparse(c)[:60]} without exist_ok=True runs {how}",
               f"{ast.unparse(c.func)}({ast.unparse(target) + ', ' if recv == 'os' else ''}exist_ok=True) (safe on "
               "every rank), or make it on one rank and barrier()", "https://docs.python.org/3/library/os.html#os.makedirs")


def _ancestors(lt: PythonLinter, node: ast.AST) -> list[ast.AST]:
    """:func:`helpers.lint.contract_ast.ancestors` up to the function that holds ``node``."""
    return list(itertools.takewhile(lambda p: not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)),
                                    ancestors(lt, node)))


def _catches_exists(lt: PythonLinter, node: ast.AST) -> bool:
    """``node`` sits in the body of a ``try`` whose handlers catch FileExistsError (or OSError, Exception, bare)."""
    for p in _ancestors(lt, node):
        if isinstance(p, ast.Try) and any(node is n for st in p.body for n in subtree(st)):
            for h in p.handlers:
                if h.type is None or re.search(r"FileExistsError|OSError|IOError|Exception|BaseException",
                                               ast.unparse(h.type)):
                    return True
    return False


def _path_names(lt: PythonLinter, expr: ast.AST) -> set[str]:
    """The names a path expression is built from, an attribute chain kept whole (``args.results_dir``, not ``args``:
    two fields of one namespace are two paths)."""
    out: set[str] = set()
    for x in ast.walk(expr):
        if isinstance(x, ast.Attribute) and isinstance(lt.parents.get(x), ast.Attribute):
            continue  # part of a longer chain
        if isinstance(x, ast.Attribute) and not isinstance(lt.parents.get(x), ast.Call) or \
                isinstance(x, ast.Attribute) and lt.parents[x].func is not x:  # type: ignore[attr-defined]
            out.add(ast.unparse(x))
        elif isinstance(x, ast.Name) and not isinstance(lt.parents.get(x), ast.Attribute):
            out.add(x.id)
    return out


def _path_leaf(expr: ast.AST) -> str | None:
    """The file name a path expression ends in when it is written out (``d / "stats.txt"``,
    ``os.path.join(d, "ckpt.pt")``, ``f"{d}/log.txt"``, ``"out/a.json"``), else None."""
    if isinstance(expr, ast.BinOp) and isinstance(expr.op, ast.Div):
        expr = expr.right
    elif isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and expr.func.attr == "join" and expr.args:
        expr = expr.args[-1]
    elif isinstance(expr, ast.JoinedStr) and expr.values and isinstance(expr.values[-1], ast.Constant):
        tail = str(expr.values[-1].value)
        return tail.rsplit("/", 1)[-1] or None if "/" in tail or len(expr.values) == 1 else None
    if isinstance(expr, ast.Constant) and isinstance(expr.value, str) and expr.value:
        return expr.value.rstrip("/").rsplit("/", 1)[-1] or None
    return None


_READS_PATH = {"from_pretrained": None, "load": 0, "open": 0, "read_csv": 0, "read_json": 0, "load_file": 0}
"""Calls that read a file or directory, and which argument names it (None: any argument, as in
``PeftModel.from_pretrained(base, adapter_dir)``); ``open`` only without a write mode."""


def rule_rank_gated_file_read(lt: PythonLinter) -> None:
    """A file written under a rank gate (``if is_main_process: model.save_pretrained(adapter_dir)``) and read right
    after on every rank, with no barrier between: the other ranks may read before rank 0 has written it (an older
    copy, or FileNotFoundError), the race ``dist.barrier()`` after the gated write removes (openvla/openvla: every
    rank loaded the LoRA adapter rank 0 was still saving).  The write and the read are in the same block."""
    from helpers.lint.python_rules import _call_name, _written_paths

    for block in statement_blocks(lt):
        for i, stmt in enumerate(block):
            if not (isinstance(stmt, ast.If) and lt.taint.rank_test(stmt.test)):
                continue
            names: set[str] = set()
            leaves: set[str | None] = set()
            for c in (n for st in stmt.body for n in subtree(st) if isinstance(n, ast.Call)):
                if lt._write_kind(c) == "file":
                    names.update(x for a in _written_paths(c) for x in _path_names(lt, a))
                    leaves.update(_path_leaf(a) for a in _written_paths(c))
            for a in (n for st in stmt.body for n in subtree(st) if isinstance(n, ast.Assign)):
                if any(isinstance(t, ast.Name) and t.id in names for t in a.targets):
                    names.update(_path_names(lt, a.value))
            if not names:
                continue
            hit = None
            for later in block[i + 1:]:
                for c in (n for n in ast.walk(later) if isinstance(n, ast.Call)):
                    recv, name = _call_name(c)
                    if name == "barrier" or name == "wait_for_everyone":
                        hit = False
                        break
                    if name not in _READS_PATH or lt._rank_gate(c) is not None:
                        continue
                    if name == "open" and any(isinstance(m, ast.Constant) and isinstance(m.value, str) and
                                              set(m.value) & set("wax") for m in c.args[1:2]):
                        continue
                    if name == "load" and recv not in ("torch", "json", "yaml", "np", "numpy", "pickle"):
                        continue
                    at = _READS_PATH[name]
                    args = c.args if at is None else c.args[at:at + 1]
                    if any(x in names for a in args for x in _path_names(lt, a)) and \
                            not (None not in leaves and all(_path_leaf(a) not in leaves | {None} for a in args)):
                        hit = c  # (not where both name their files and the names differ: stats.txt, checkpoint.pth)
                        break
                if hit is not None:
                    break
            if hit:
                lt.add("rank-gated-object-used", "warning", hit,
                       f"{ast.unparse(hit)[:60]} runs on every rank and reads what only `"
                       f"{ast.unparse(stmt.test)[:40]}` writes (line {stmt.lineno}), with no barrier between: "
                       "the other ranks can read it before it is written (an old copy, or FileNotFoundError)",
                       "call dist.barrier() (accelerator.wait_for_everyone()) after the gated write, before "
                       "the read", _DIST + "#torch.distributed.barrier")


_MMENGINE_METRIC = "https://mmengine.readthedocs.io/en/latest/api/generated/mmengine.evaluator.BaseMetric.html"


def rule_metric_init_writes(lt: PythonLinter) -> None:
    """``write-on-every-rank`` in an mmengine ``BaseMetric``'s ``__init__`` (or a method of the class it calls): the
    runner builds the evaluator and its metrics in every process, and only ``compute_metrics`` runs on the main
    process (``BaseMetric.evaluate`` collects the results, then ``if is_main_process(): ... self.compute_metrics``,
    ``_MMENGINE_METRIC``), so a file created, removed or written while the metric is built is touched by every rank
    at once (open-mmlab/mmselfsup#689: every rank removed and re-created the shape-bias CSV)."""
    if "BaseMetric" not in lt.text:
        return
    for cls in lt.nodes:
        if not isinstance(cls, ast.ClassDef) or not any(ast.unparse(b).endswith("BaseMetric") for b in cls.bases):
            continue
        init = method_named(cls, "__init__")
        if init is None:
            continue
        bodies = [init] + [m for c in subtree(init) if isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute)
                           and isinstance(c.func.value, ast.Name) and c.func.value.id == "self"
                           and (m := method_named(cls, c.func.attr)) is not None]
        for body in bodies:
            hit = next((c for c in subtree(body) if isinstance(c, ast.Call) and lt._write_kind(c) in ("file", "delete")
                        and lt._rank_gate(c) is None), None)
            if hit is not None:
                where = "" if body is init else f" ({body.name}, called from __init__)"
                # the every-rank rule deferred it until something proved the program distributed: an mmengine
                # metric is that proof
                lt.facts.deferred[:] = [f for f in lt.facts.deferred
                                        if not (f.id == "write-on-every-rank" and f.line_no == hit.lineno)]
                lt.add("write-on-every-rank", "warning", hit,
                       f"{ast.unparse(hit)[:60]} runs while {cls.name} is built{where}: mmengine builds the evaluator's "
                       "metrics in every process (only compute_metrics runs on the main one), so every rank touches "
                       "this file at once",
                       "create the file in compute_metrics (main process only), or under is_main_process()",
                       _MMENGINE_METRIC)
                break


def rule_save_hook_every_rank(lt: PythonLinter) -> None:
    """A function registered with ``accelerator.register_save_state_pre_hook`` that writes (``save_pretrained``,
    ``torch.save``) with no main-process test: Accelerate calls the hook from ``save_state`` in every process that
    calls it, and under DeepSpeed or FSDP every process must (``save_state`` gathers the sharded state), so each
    writes the same files (huggingface/diffusers#4929 put the hooks' writes under ``accelerator.is_main_process``;
    https://huggingface.co/docs/accelerate/en/package_reference/accelerator#accelerate.Accelerator.register_save_state_pre_hook)."""
    from helpers.lint.python_rules import _call_name

    if "register_save_state_pre_hook" not in lt.text:
        return
    hooks = {c.args[0].id for c in lt._calls() if _call_name(c)[1] == "register_save_state_pre_hook" and c.args
             and isinstance(c.args[0], ast.Name)}
    for node in lt.nodes:
        if not (isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name in hooks) or \
                lt._function_only_called_gated(node):
            continue  # (every save_state that runs the hook is made by one process: rank-gated-collective's case)
        for c in (n for n in ast.walk(node) if isinstance(n, ast.Call)):
            recv, name = _call_name(c)
            if not (name == "save_pretrained" or name == "save" and recv in ("torch", "safetensors.torch")):
                continue
            if lt._rank_gate(c) is not None or lt._after_rank_exit(c):
                break
            lt.add("write-on-every-rank", "warning", c,
                   f"{ast.unparse(c)[:60]} in the save_state hook {node.name} runs in every process that calls "
                   "save_state, which under DeepSpeed or FSDP is every process: N processes write the same files",
                   "write under `if accelerator.is_main_process:` inside the hook (still pop the weights on every "
                   "process)", _ACC + "#accelerate.Accelerator.register_save_state_pre_hook")
            break


_DCP_STATE = "https://docs.pytorch.org/docs/stable/distributed.checkpoint.html#torch.distributed.checkpoint.state_dict.get_optimizer_state_dict"
_RESTORE = re.compile(r"(?i)restore|resume|load_checkpoint|load_state|from_checkpoint")


def _dcp_load(call: ast.Call) -> bool:
    """``dcp.load(...)`` / ``torch.distributed.checkpoint.load(...)`` / ``dist_cp.load(...)``."""
    f = call.func
    return isinstance(f, ast.Attribute) and f.attr in ("load", "load_state_dict") and \
        re.search(r"(?:^|\.)(?:dcp|dist_cp|checkpoint|DCP)$", ast.unparse(f.value)) is not None


def rule_dcp_load_raw_optimizer_state(lt: PythonLinter) -> None:
    """``optimizer-state-not-restored``: ``dcp.load(state)`` where ``state`` holds ``optimizer.state_dict()`` (a
    dict literal, or items assigned to it in the same function).  DCP loads in place into the tensors of the
    state_dict it is given; a freshly built optimizer's ``state_dict()`` has no state tensors yet (Adam creates
    ``exp_avg`` / ``exp_avg_sq`` at its first step), so there is nothing to fill and the moments restart at zero on
    every resume.  torch.distributed.checkpoint's contract for optimizers is ``get_optimizer_state_dict`` (which
    initialises the state) and ``set_optimizer_state_dict`` (``_DCP_STATE``; KempnerForge's fix)."""
    if "state_dict()" not in lt.text or "load(" not in lt.text:
        return
    for call in lt._calls():
        if not _dcp_load(call) or not call.args:
            continue
        arg = call.args[0]
        values: list[ast.AST] = list(arg.values) if isinstance(arg, ast.Dict) else []
        if isinstance(arg, ast.Name):
            scope = lt._enclosing_function(call) or lt.tree
            for n in subtree(scope):
                if isinstance(n, ast.Assign) and n.lineno < call.lineno:
                    for t in n.targets:
                        if isinstance(t, ast.Subscript) and ast.unparse(t.value) == arg.id:
                            values.append(n.value)
                        elif isinstance(t, ast.Name) and t.id == arg.id and isinstance(n.value, ast.Dict):
                            values.extend(v for v in n.value.values if v is not None)
        raw = next((v for v in values if isinstance(v, ast.Call) and isinstance(v.func, ast.Attribute)
                    and v.func.attr == "state_dict" and not v.args
                    and re.search(r"(?i)optim", ast.unparse(v.func.value))), None)
        if raw is None:
            continue
        lt.add("optimizer-state-not-restored", "warning", call,
               f"{ast.unparse(call)[:50]} loads into {ast.unparse(raw)} (line {raw.lineno}): DCP fills the tensors of "
               "the state dict it is given, and a new optimizer's state_dict() holds none yet (Adam's exp_avg appear "
               "at its first step), so the optimizer's moments are not restored on resume",
               "osd = get_optimizer_state_dict(model, optimizer); dcp.load({'optimizer': osd}, ...); "
               "set_optimizer_state_dict(model, optimizer, osd)", _DCP_STATE)


_SAVE_LOAD = re.compile(r"(?i)save|load|checkpoint|ckpt")


def _resumes(lt: PythonLinter) -> bool:
    """The code (not its strings) resumes from a checkpoint: a name, attribute or keyword that says resume or
    load_checkpoint, an optimizer's ``load_state_dict``, or ``torch.load`` / ``fabric.load`` / ``dcp.load``."""
    for n in lt.nodes:
        word = n.id if isinstance(n, ast.Name) else n.attr if isinstance(n, ast.Attribute) else \
            n.arg if isinstance(n, ast.keyword) else None
        if word and re.search(r"(?i)resum|load_checkpoint|load_state$", word):
            return True
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and (
                (n.func.attr == "load_state_dict" and "optim" in ast.unparse(n.func.value).lower())
                or (n.func.attr == "load" and re.search(r"(?:^|\.)(?:torch|fabric|dcp)$", ast.unparse(n.func.value)))):
            return True
    return False


def rule_scheduler_not_checkpointed(lt: PythonLinter) -> None:
    """``scheduler-not-checkpointed``: a function builds an LR scheduler it steps, and a checkpoint state that holds
    the optimizer but not the scheduler (``state = TrainTaskState(model=..., optimizer=optimizer, step=...)``,
    ``{"model": ..., "optimizer": ...}``) handed to a save or load (``fabric.save(path, state)``,
    ``save_checkpoint(..., state=state)``): a resumed run rebuilds the scheduler at step 0, so its warm-up and decay
    start over (lightly-ai/lightly-train#301).  The resume contract: every object whose state the run continues
    from is saved and loaded, the scheduler's through its ``state_dict()`` (torch.optim: "LRScheduler.state_dict()",
    https://docs.pytorch.org/docs/stable/optim.html; Fabric's checkpoint guide saves each object in the state
    dict, https://lightning.ai/docs/fabric/stable/guide/checkpoint/checkpoint.html).  Not for ``accelerator.save_state``
    (it saves the prepared schedulers itself), nor in a file that sets a scheduler's ``last_epoch`` (the schedule
    rebuilt at the saved epoch), nor in one that never resumes (no resume, load_checkpoint, optimizer load)."""
    if "sched" not in lt.text or "last_epoch" in lt.text:
        return  # (a scheduler put back at the saved epoch, `scheduler.last_epoch = start_epoch - 1`: yolov5's resume)
    if not _resumes(lt):
        return  # nothing here resumes from a checkpoint: one saved for inference or fine-tuning
    stepped = {ast.unparse(c.func.value) for c in lt._calls() if isinstance(c.func, ast.Attribute)
               and c.func.attr == "step" and "sched" in ast.unparse(c.func.value).lower()}
    for fn in (n for n in lt.nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        scheds = {t.id for n in subtree(fn) if isinstance(n, ast.Assign) for tt in n.targets
                  for t in (tt.elts if isinstance(tt, ast.Tuple) else [tt])
                  if isinstance(t, ast.Name) and "sched" in t.id.lower() and t.id in stepped}
        if not scheds:
            continue
        for n in (x for x in subtree(fn) if isinstance(x, ast.Assign) and len(x.targets) == 1
                  and isinstance(x.targets[0], ast.Name)):
            v = n.value
            keys = [k.value for k in v.keys if isinstance(k, ast.Constant)] if isinstance(v, ast.Dict) else \
                [k.arg for k in v.keywords if k.arg] if isinstance(v, ast.Call) else []
            if "optimizer" not in keys or any("sched" in str(k).lower() for k in keys) or \
                    any(isinstance(x, ast.Name) and x.id in scheds for x in ast.walk(v)):
                continue
            name = n.targets[0].id
            use = next((c for c in subtree(fn) if isinstance(c, ast.Call) and c.lineno >= n.lineno
                        and _SAVE_LOAD.search(ast.unparse(c.func).rsplit(".", 1)[-1])
                        and "save_state" not in ast.unparse(c.func)
                        and any(isinstance(a, ast.Name) and a.id == name
                                for a in [*c.args, *(k.value for k in c.keywords)])), None)
            if use is None:
                continue
            sched = sorted(scheds)[0]
            lt.add("scheduler-not-checkpointed", "warning", n,
                   f"{name} holds the optimizer but not {sched}, and {ast.unparse(use.func)}(...) (line {use.lineno}) "
                   f"saves or restores it: a resumed run starts {sched} again from step 0 (the warm-up and decay "
                   "repeat)", f"add {sched} to {name} (its state_dict() is saved and loaded with the rest)",
                   "https://docs.pytorch.org/docs/stable/optim.html")
            return


def _assigned_self_attrs(fn: ast.AST, holder: str = "self") -> set[str]:
    return {t.attr for n in subtree(fn) if isinstance(n, (ast.Assign, ast.AnnAssign))
            for t in (n.targets if isinstance(n, ast.Assign) else [n.target])
            if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == holder}


def _restored_attrs(lt: PythonLinter, method: ast.AST) -> set[str]:
    """The ``self`` attributes a restore method sets: in its body, and in a module-level function of the file it
    hands ``self`` to (``_restore_checkpoint(self, path)`` setting ``trainer._ema = ...``)."""
    out = _assigned_self_attrs(method)
    for c in (n for n in ast.walk(method) if isinstance(n, ast.Call) and isinstance(n.func, ast.Name)):
        fn = lt.functions.get(c.func.id)
        pos = next((i for i, a in enumerate(c.args) if isinstance(a, ast.Name) and a.id == "self"), None)
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and pos is not None and pos < len(fn.args.args):
            out |= _assigned_self_attrs(fn, fn.args.args[pos].arg)
    return out


def rule_state_overwritten_after_load(lt: PythonLinter) -> None:
    """``state-overwritten-after-load``: a method calls the class's restore method (``self.restore_checkpoint(path)``,
    a name with restore/resume/load_checkpoint/load_state) and later, in the same method and with no read of it in
    between, assigns an attribute that restore set (``self._ema = build_ema(...)``): the restored value is replaced by
    a fresh one on every resume (ai2cm/ace: the EMA's ``num_updates`` back to 0).  Restoring state means the
    loaded values are the ones the run continues from (https://docs.pytorch.org/tutorials/beginner/saving_loading_models.html
    #saving-loading-a-general-checkpoint-for-inference-and-or-resuming-training): build the objects first, restore
    last."""
    if not _RESTORE.search(lt.text):
        return
    for cls in (n for n in lt.nodes if isinstance(n, ast.ClassDef)):
        methods = {m.name: m for m in cls.body if isinstance(m, (ast.FunctionDef, ast.AsyncFunctionDef))}
        restores = {name: _restored_attrs(lt, m) for name, m in methods.items() if _RESTORE.search(name)}
        if not any(restores.values()):
            continue
        for m in methods.values():
            for call in (n for n in ast.walk(m) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
                         and isinstance(n.func.value, ast.Name) and n.func.value.id == "self"
                         and n.func.attr in restores and n.func.attr != m.name):
                attrs = restores[call.func.attr]  # type: ignore[union-attr]
                reads: dict[str, int] = {}
                for n in ast.walk(m):
                    if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and \
                            isinstance(n.value, ast.Name) and n.value.id == "self" and n.lineno > call.lineno:
                        reads[n.attr] = min(reads.get(n.attr, n.lineno), n.lineno)
                for n in (x for x in m.body if isinstance(x, ast.Assign) and x.lineno > call.lineno):
                    hit = next((t.attr for t in n.targets if isinstance(t, ast.Attribute) and t.attr in attrs
                                and isinstance(t.value, ast.Name) and t.value.id == "self"
                                and reads.get(t.attr, n.lineno + 1) >= n.lineno
                                and not any(isinstance(v, ast.Attribute) and v.attr == t.attr
                                            for v in ast.walk(n.value))), None)
                    if hit is None:
                        continue
                    lt.add("state-overwritten-after-load", "warning", n,
                           f"self.{hit} is set here after self.{call.func.attr}(...) (line {call.lineno}) "  # type: ignore[union-attr]
                           f"restored it: a resumed run continues with a fresh {hit}, not the one in the checkpoint",
                           f"build self.{hit} before the restore call (or only when not resuming)",
                           "https://docs.pytorch.org/tutorials/beginner/saving_loading_models.html")
                    return


__all__ = ["BLANK_TRACKER", "rule_dcp_load_raw_optimizer_state", "rule_makedirs_race", "rule_metric_init_writes", "rule_state_overwritten_after_load", "RAW_WANDB_FIX", "RAW_WANDB_MESSAGE", "rule_rank_gated_directory", "rule_rank_gated_file_read", "rule_rank_overwritten_on_resume", "rule_rank_overwritten_by_setattr_loop", "rule_raw_wandb_log", "rule_save_hook_every_rank", "rule_scheduler_not_checkpointed", "rule_tracker_on_every_rank"]
