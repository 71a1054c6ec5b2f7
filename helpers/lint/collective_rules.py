"""Contract rules on process groups and collectives: a collective before ``init_process_group`` or on one process
without a group, reductions that sum where a mean was meant, CPU tensors handed to NCCL, gathers of per-rank shapes,
barriers per step or inside a sampler, results discarded, names ``torch.distributed`` lacks
(https://docs.pytorch.org/docs/stable/distributed.html).  Run by :func:`helpers.lint.contract_rules.run`."""

from __future__ import annotations

import ast
import re
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

from helpers.lint.contract_ast import ancestors, assigned_once, const, kwarg, method_named, moved, statement_blocks, subtree
from helpers.lint.contracts import _ACC, _COLL, _DIST, _INIT

if TYPE_CHECKING:
    from helpers.lint.contract_rules import ScriptContract
    from helpers.lint.python_rules import PythonLinter


def rule_init_contract(lt: PythonLinter, sc: ScriptContract) -> None:
    """init_process_group: rank/world_size with tcp:// or a store; nothing distributed before it."""
    from helpers.lint.python_rules import _call_name

    for c in lt._calls():
        if _call_name(c)[1] != "init_process_group":
            continue
        method = const(kwarg(c, "init_method"))
        uses_store = kwarg(c, "store") is not None
        if (isinstance(method, str) and method.startswith(("tcp://", "file://")) or uses_store) and \
                not any(k.arg is None for k in c.keywords) and len(c.args) <= 2:
            missing = [k for k in ("rank", "world_size") if kwarg(c, k) is None]
            if missing:
                lt.add("init-missing-rank-world-size", "error", c,
                       f"init_process_group({'store' if uses_store else method}) without {' and '.join(missing)}: "
                       "with a tcp:// or file:// method or a store, rank and world_size must be given "
                       "('ValueError: ... rank ... world_size ... required')",
                       "pass rank=int(os.environ['RANK']), world_size=int(os.environ['WORLD_SIZE']), or use "
                       "init_method='env://' under torchrun", _INIT)
    _collective_before_init(lt)
    _collective_without_group_on_one_process(lt)


_NEEDS_GROUP = {"get_rank", "get_world_size", "barrier", "all_reduce", "all_gather", "broadcast", "reduce",
                "DistributedDataParallel", "DDP", "DistributedSampler", "new_group", "all_gather_object"}


def _collective_before_init(lt: PythonLinter) -> None:
    """A statement before ``init_process_group`` in the same block that needs the default group."""
    from helpers.lint.python_rules import _call_name

    for block in statement_blocks(lt):
        init_at = next((i for i, s in enumerate(block) if isinstance(s, (ast.Expr, ast.Assign)) and
                        isinstance(s.value, ast.Call) and _call_name(s.value)[1] == "init_process_group"), None)
        if not init_at:
            continue
        for stmt in block[:init_at]:
            if not isinstance(stmt, (ast.Expr, ast.Assign, ast.AnnAssign, ast.AugAssign)):
                continue  # a branch may guard it (if dist.is_initialized())
            for c in (n for n in ast.walk(stmt) if isinstance(n, ast.Call)):
                recv, name = _call_name(c)
                if name not in _NEEDS_GROUP or (name in ("reduce", "broadcast", "all_reduce", "barrier")
                                                and recv not in ("dist", "torch.distributed")):
                    continue
                if name == "DistributedSampler" and kwarg(c, "num_replicas") is not None:
                    continue
                if name in lt.functions and recv in ("", "self", "cls"):
                    continue  # the file's own get_rank() (one that reads RANK from the environment), not dist's
                lt.add("collective-before-init", "error", c,
                       f"{(recv + '.') if recv else ''}{name}() runs before init_process_group (line "
                       f"{block[init_at].lineno}): 'Default process group has not been initialized, please make "
                       "sure to call init_process_group'", "call init_process_group first", _INIT)
                break


_INIT_HELPER = re.compile(r"(?i)^_*(init_process_group|setup_dist\w*|init_dist\w*|dist_init\w*|setup_ddp|"
                          r"init_distributed\w*|setup_distributed\w*)$")
_MULTI_TEST = re.compile(r"(?i)world_size|distributed|is_\w*initialized|\bddp\b|use_ddp|n_?gpus?\b|num_gpus|"
                         r"gpu_count|device_count|parallel|multi_?gpu|num_processes")
_GROUP_COLLECTIVES = {"barrier", "all_reduce", "all_gather", "broadcast", "reduce", "gather", "scatter",
                      "all_gather_object", "broadcast_object_list", "gather_object", "reduce_scatter", "all_to_all"}


def _one_process_exit_before(lt: PythonLinter, node: ast.AST) -> bool:
    """``node``'s function returns (or raises) earlier under a test of the process count (``if world_size == 1:
    return``): the one-process run never gets to ``node``."""
    fn = lt._enclosing_function(node)
    line = getattr(node, "lineno", 0)
    return fn is not None and any(isinstance(s, ast.If) and s.lineno < line and _MULTI_TEST.search(ast.unparse(s.test))
                                  and any(isinstance(b, (ast.Return, ast.Raise)) for b in s.body) for s in subtree(fn))


def _under_multi_test(lt: PythonLinter, node: ast.AST) -> bool:
    """``node`` runs only when several processes run: in the body of ``if world_size > 1:`` (``if args.distributed``,
    ``if dist.is_initialized()``...), or in the ``else`` of its negation (``if world_size == 1: ... else:``)."""
    child, p = node, lt.parents.get(node)
    while p is not None:
        if isinstance(p, (ast.If, ast.IfExp, ast.While)) and _MULTI_TEST.search(ast.unparse(p.test)):
            inverted = bool(re.search(r"^not\b|==\s*1\b|<=\s*1\b|<\s*2\b", ast.unparse(p.test)))
            in_body = child is p.body or (isinstance(p.body, list) and child in p.body)
            in_else = child is p.orelse or (isinstance(p.orelse, list) and child in p.orelse)
            if (in_body and not inverted) or (in_else and inverted):
                return True
        child, p = p, lt.parents.get(p)
    return False


def _called_here(lt: PythonLinter, fn: ast.AST | None) -> bool:
    """Some call in this file outside ``fn`` names ``fn`` (``fn(...)``, ``obj.fn(...)``), the calls
    :func:`_reached_unguarded` follows."""
    from helpers.lint.python_rules import _call_name

    name = getattr(fn, "name", None)
    return fn is not None and any(_call_name(x)[1] == name and x not in subtree(fn) for x in lt._calls())


def _reached_unguarded(lt: PythonLinter, fn: ast.AST, depth: int = 0) -> bool:
    """Some call of the function ``fn`` in this file (``fn(...)``, ``obj.fn(...)``) runs under no test of the process
    count, directly or through a caller that is itself so reached (three levels); False when nothing here calls it."""
    from helpers.lint.python_rules import _call_name

    name = getattr(fn, "name", None)
    for c in lt._calls():
        if _call_name(c)[1] != name or c in subtree(fn):
            continue
        if _under_multi_test(lt, c):
            continue
        caller = lt._enclosing_function(c)
        if caller is None or depth >= 3 or _reached_unguarded(lt, caller, depth + 1):
            return True
    return False


def _collective_without_group_on_one_process(lt: PythonLinter) -> None:
    """The group is made only for several processes (``if world_size > 1: setup_dist(...)``, no ``else``) and a
    ``torch.distributed`` collective elsewhere in the file runs under no such test: the one-process run (``run(rank=0,
    world_size=1)``) reaches it with no default group and stops with "Default process group has not been
    initialized" (``_INIT``; lifeiteng/vall-e: ``torch.distributed.barrier()`` after each checkpoint, fixed by
    ``if world_size > 1:``).  In a file that makes no group itself, its own guard of other distributed work by the
    process count (``if get_world_size() > 1: sampler.set_epoch(epoch)``, ``if distributed: model =
    MMDistributedDataParallel(...)``) is the same evidence of a one-process run (PELICAN's unconditional
    ``torch.distributed.barrier()``, mmaction2's ``train_model``).  One finding, at the first such collective."""
    from helpers.lint.python_rules import _call_name

    def count_test(test: ast.AST) -> bool:  # a test of the process count; `if not is_initialized()` is an
        src = ast.unparse(test)               # init-once guard, not one
        return bool(_MULTI_TEST.search(src)) and not re.search(r"not\s+[\w.]*initialized\(", src)

    conditional = [n for n in lt.nodes if isinstance(n, ast.If) and count_test(n.test)
                   and not n.orelse and any(isinstance(c, ast.Call) and _INIT_HELPER.match(_call_name(c)[1])
                                            for s in n.body for c in ast.walk(s))]
    conditional_init = bool(conditional)
    if not conditional and not any(isinstance(c, ast.Call) and _INIT_HELPER.match(_call_name(c)[1])
                                   for c in lt._calls()):
        # no group made here: the file's own guard of distributed work by the process count (`if get_world_size()
        # > 1: loader.sampler.set_epoch(epoch)`, PELICAN's trainer) says it also runs as one process
        def body(n: ast.If) -> str:
            return "".join(ast.unparse(b) for b in n.body)

        conditional = [n for n in lt.nodes if isinstance(n, ast.If) and count_test(n.test) and (
            not n.orelse and re.search(r"\b(?:set_epoch|barrier|all_reduce|all_gather\w*|broadcast\w*|"
                                       r"DistributedSampler|\w*DistributedDataParallel|DDP)\b", body(n)) or
            re.search(r"\b\w*DistributedDataParallel\(|\bDDP\(", body(n)))]  # `if distributed: DDP(...) else: ...`

    def made_always(c: ast.Call) -> bool:  # an init under no count test, in a function reached unguarded (or not
        if any(isinstance(a, ast.If) and count_test(a.test) for a in ancestors(lt, c)):  # called in this file)
            return False
        fn = lt._enclosing_function(c)
        return not _called_here(lt, fn) or _reached_unguarded(lt, fn)

    if not conditional or any(isinstance(c, ast.Call) and _INIT_HELPER.match(_call_name(c)[1]) and made_always(c)
                              for c in lt._calls()):
        return  # the group is made unconditionally somewhere too (ultralytics' _setup_ddp is called only under
        # `if world_size > 1:`, so its init_process_group is not)
    for c in lt._calls():
        recv, name = _call_name(c)
        if name not in _GROUP_COLLECTIVES or recv not in ("dist", "torch.distributed"):
            continue
        if _under_multi_test(lt, c):
            continue
        fn = lt._enclosing_function(c)
        if _one_process_exit_before(lt, c):
            continue
        if fn is not None and not _reached_unguarded(lt, fn) and (
                conditional_init or any(_call_name(x)[1] == getattr(fn, "name", None) for x in lt._calls())):
            continue  # called only under a process-count test (`if args.distributed: top1.all_reduce()`); a function
            # nothing here calls counts as reached when the file shows the one-process path only by its own guards
            # (mmaction2's train_model, called by tools/train.py), not where it makes the group itself
        init = conditional[0]
        lt.add("collective-before-init", "error", c,
               f"{recv}.{name}() runs under no test of the process count, while the file runs its distributed work "
               f"only under `{ast.unparse(init.test)[:40]}` (line {init.lineno}): the one-process run reaches it with "
               "no group "
               "('Default process group has not been initialized, please make sure to call init_process_group')",
               f"guard it like the set-up: if {ast.unparse(init.test)[:40]}: {recv}.{name}()", _INIT)
        return


_COUNT_TEST = re.compile(r"(?i)(?:world_size|num_gpus|n_?gpus|gpu_count|num_processes|device_count\(\)|"
                         r"get_world_size\(\))\s*(?:>|>=|!=|==)\s*[12]\b|\b(?:dist|distributed)\.is_initialized\(\)|"
                         r"^(?:not\s+)?(?:self\.|args\.|cfg\.)?(?:distributed|is_distributed|use_ddp|ddp)$")
"""A test of the process count itself (``num_gpus > 1``, ``dist.is_initialized()``, ``args.distributed``), not
:data:`_MULTI_TEST`'s wider net (a model-parallel size is not the process count)."""


def rule_collective_helper_unguarded(lt: PythonLinter) -> None:
    """``collective-before-init`` for a collective helper of this file (``reduce_sum``, which calls
    ``dist.all_reduce``) that the file calls under a process-count test (``if num_gpus > 1:``) in one place and with
    none in another: the author's guards say the one-process run has no process group, and that run reaches the
    unguarded call ("Default process group has not been initialized", ``_INIT``; FCOS's loss called ``reduce_sum``
    unguarded in its no-positive-sample branch only)."""
    from helpers.lint.python_rules import _call_name

    helpers = {name for name in lt.collective_funcs if name in lt.functions and not any(
        isinstance(n, (ast.If, ast.IfExp)) and (_MULTI_TEST.search(ast.unparse(n.test)) or
                                                _COUNT_TEST.search(ast.unparse(n.test)))
        for n in subtree(lt.functions[name]))}  # (not mmengine's all_reduce, which returns at once for one process)
    if not helpers:
        return
    by_name: dict[str, list[ast.Call]] = {}
    for c in lt._calls():
        recv, name = _call_name(c)
        if name in helpers and recv in ("", "self", "cls"):
            by_name.setdefault(name, []).append(c)
    def count_gate(c: ast.Call) -> ast.If | ast.IfExp | None:
        """The innermost ``if`` testing the process count that holds ``c`` (when the multi-process test holds)."""
        if not _under_multi_test(lt, c):
            return None
        return next((p for p in ancestors(lt, c) if isinstance(p, (ast.If, ast.IfExp)) and
                     _COUNT_TEST.search(ast.unparse(p.test))), None)

    for name, calls in by_name.items():
        guarded = [(c, gate) for c in calls if (gate := count_gate(c)) is not None]
        loose = [c for c in calls if not _under_multi_test(lt, c) and lt._enclosing_function(c) is not lt.functions[name]]
        if not guarded or not loose:
            continue
        for c in loose:
            if _one_process_exit_before(lt, c):
                continue
            g, test = guarded[0]
            lt.add("collective-before-init", "error", c,
                   f"{name}() runs a collective ({lt.collective_funcs[name]}) and is called here under no test of the "
                   f"process count, while line {g.lineno} calls it only under `{ast.unparse(test.test)[:40]}`: the "
                   "one-process run reaches this call with no process group ('Default process group has not been "
                   "initialized')", f"guard it the same way: if {ast.unparse(test.test)[:40]}: {name}(...)", _INIT)
            break


_MEAN_NAME = re.compile(r"(?i)loss|acc|metric|err|score|ppl|perplexity")
_WORLD_WORDS = re.compile(r"world_size|get_world_size|num_processes|num_replicas|n_gpus|ngpus|nranks|size\(\)")


def rule_allreduce_sum_not_averaged(lt: PythonLinter) -> None:
    """A loss or metric all-reduced with the default ``ReduceOp.SUM`` and then used (logged, printed, compared) with no
    division by the world size: ``all_reduce``'s op defaults to SUM ("op (optional): One of the values from
    torch.distributed.ReduceOp", SUM by default, ``_COLL``), so the value is N times the mean (NERSC's sc22 tutorial
    logged the step-0 losses world_size times too large).  Not reported when the tensor is divided after the call, or
    the op is AVG / MAX / MIN, or each rank wrote its own positions of it before (an assembly of shares)."""
    from helpers.lint.python_rules import _call_name

    if "all_reduce" not in lt.text:
        return
    tdist = {"torch.distributed"} | {n for n, o in lt.import_origins.items() if o == "torch.distributed"}
    for c in lt._calls():
        recv, fname = _call_name(c)
        if fname != "all_reduce" or recv not in tdist or not c.args or not isinstance(c.args[0], ast.Name) or \
                not _MEAN_NAME.search(c.args[0].id):
            continue  # torch.distributed's own all_reduce (Fabric's and others' default to a mean)
        op = next((k.value for k in c.keywords if k.arg == "op"), c.args[1] if len(c.args) > 1 else None)
        if op is not None and not ast.unparse(op).endswith("SUM"):
            continue
        name = c.args[0].id
        scope = lt._enclosing_function(c) or lt.tree
        if any(isinstance(n, ast.Call) and _call_name(n)[1] == "all_reduce" and n.args and
               re.search(r"(?i)count|num|total|tokens|samples|\bn_", ast.unparse(n.args[0])) for n in subtree(scope)):
            continue  # a global count is summed beside it: a sum normalised by the job's count, not by the ranks
        if any(isinstance(n, ast.Assign) and n.lineno < c.lineno and
               any(isinstance(t, ast.Subscript) and ast.unparse(t.value) == name and lt.taint.is_rank(t.slice)
                   for t in n.targets) for n in subtree(scope)):
            continue  # each rank fills its own rows (`score_matrix[start + i, idx] = s`, start from the rank): the sum
            # assembles the shares (BLIP's and ALBEF's retrieval scores), it is no mean
        later = sorted((n for n in subtree(scope) if getattr(n, "lineno", 0) > c.lineno),
                       key=lambda n: (n.lineno, getattr(n, "col_offset", 0)))
        divided = any(isinstance(n, ast.AugAssign) and isinstance(n.op, ast.Div) and ast.unparse(n.target) == name or
                      isinstance(n, ast.BinOp) and isinstance(n.op, ast.Div) and name in ast.unparse(n.left)
                      for n in later)
        if divided or _WORLD_WORDS.search(" ".join(ast.unparse(n) for n in later if isinstance(n, ast.Assign) and
                                                   name in ast.unparse(n))):
            continue
        used = next((n for n in later if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)), None)
        if used is None:
            continue
        lt.add("allreduce-sum-not-averaged", "warning", c,
               f"{ast.unparse(c)[:50]} sums {name} over the ranks (all_reduce's default op is SUM) and line "
               f"{used.lineno} uses it with no division by the world size: the value is N times the mean",
               f"divide after the sum ({name} /= dist.get_world_size()) or reduce with op=dist.ReduceOp.AVG (nccl)",
               _COLL)


_TENSOR_CTORS = {"FloatTensor", "LongTensor", "IntTensor", "DoubleTensor", "tensor", "zeros", "ones", "empty",
                 "full", "as_tensor", "from_numpy", "Tensor"}


_ACC_GATHERS = {"gather", "gather_for_metrics", "reduce"}
_ACC_OPERATIONS = "https://github.com/huggingface/accelerate/blob/main/src/accelerate/utils/operations.py"


_GATHER_FOR_METRICS = ("https://huggingface.co/docs/accelerate/en/package_reference/accelerator"
                       "#accelerate.Accelerator.gather_for_metrics")
_EVAL_LOADER = re.compile(r"(?i)\b\w*(eval|val|valid|validation|test|dev)\w*(loader|_dl|dataloader)\w*")


def rule_gather_not_for_metrics(lt: PythonLinter) -> None:
    """``accelerator.gather(preds)`` in a loop over an evaluation loader, its result kept for a metric: a prepared
    loader gives every process the same number of batches by repeating samples from the start of the dataset to
    fill the last one (``even_batches=True``, the default), so the gathered predictions hold those duplicates and the
    metric is computed on a few samples twice; ``gather_for_metrics`` drops them ("Gathers input_data and potentially
    drops duplicates in the last batch if on a distributed system. Should be used for gathering the inputs and
    targets for metric calculation", ``_GATHER_FOR_METRICS``; huggingface/peft#327).  Not where the function trims the
    duplicates itself (``samples_seen``, a slice by ``len(...dataset)``, the pre-0.12 Accelerate examples)."""
    from helpers.lint.python_rules import _call_name

    if "gather(" not in lt.text or "accelerator" not in lt.text.lower():
        return
    for c in lt._calls():
        recv, name = _call_name(c)
        if name != "gather" or "accelerator" not in recv.lower() or not c.args:
            continue
        loop = next((a for a in ancestors(lt, c) if isinstance(a, (ast.For, ast.AsyncFor))), None)
        if loop is None or not _EVAL_LOADER.search(ast.unparse(loop.iter)):
            continue
        fn = lt._enclosing_function(c) or lt.tree
        src = ast.unparse(fn)
        if "samples_seen" in src or re.search(r"len\(\s*\w+(\.\w+)*\.dataset\s*\)", src) or "even_batches" in lt.text:
            continue
        lt.add("gather-not-for-metrics", "warning", c,
               f"{ast.unparse(c)[:60]} gathers evaluation outputs over {ast.unparse(loop.iter)[:40]}: the prepared "
               "loader pads its last batch with repeated samples so that every process has one, and gather keeps "
               "them: the metric counts those samples twice",
               f"{recv}.gather_for_metrics({ast.unparse(c.args[0])[:30]}) (drops the duplicates)", _GATHER_FOR_METRICS)


def _cpu_ctor(expr: ast.AST) -> str | None:
    """The constructor's name when ``expr`` is ``torch.<ctor>(...)`` (:data:`_TENSOR_CTORS`) without ``device=``: a
    tensor made on the CPU."""
    from helpers.lint.python_rules import _call_name

    if not isinstance(expr, ast.Call):
        return None
    crecv, cname = _call_name(expr)
    return cname if crecv == "torch" and cname in _TENSOR_CTORS and kwarg(expr, "device") is None else None


def _accelerator_cpu_tensor(lt: PythonLinter) -> None:
    """``accelerator.gather_for_metrics(torch.tensor(n))``: Accelerate's gather / reduce hand the tensor to
    ``torch.distributed`` as it is (``_gpu_gather_one``: ``all_gather_into_tensor``; utils/operations.py,
    :data:`_ACC_OPERATIONS`), and a multi-GPU run uses nccl, which takes CUDA tensors only ('No backend type associated
    with device type cpu').  A ``torch.tensor(...)``-like constructor without ``device=``, inline or assigned once in
    the same function and never moved, is a CPU tensor; on a CPU (gloo) run it works, so a warning."""
    from helpers.lint.python_rules import _call_name

    for call in lt._calls():
        recv, name = _call_name(call)
        if name not in _ACC_GATHERS or "accelerator" not in recv.lower() or not call.args:
            continue
        arg, made = call.args[0], None
        if isinstance(arg, ast.Name):
            made = assigned_once(lt, arg.id, call)
            if made is None or moved(lt, arg.id, call):
                continue
            arg = made.value
        cname = _cpu_ctor(arg)
        if cname is None:
            continue
        where = f" (line {made.lineno})" if made is not None else ""
        lt.add("nccl-cpu-tensor", "warning", call,
               f"{recv}.{name}() is given a CPU tensor, torch.{cname}(...){where}: Accelerate passes it to "
               "torch.distributed unchanged, and a multi-GPU run's nccl backend takes CUDA tensors only ('No backend "
               "type associated with device type cpu')",
               f"create it on the process's device: torch.{cname}(..., device={recv}.device)", _ACC_OPERATIONS)


def rule_nccl_cpu_tensor(lt: PythonLinter, sc: ScriptContract) -> None:
    """A CPU tensor passed to a collective under nccl ('Tensors must be CUDA and dense'); for Accelerate's gathers see
    :func:`_accelerator_cpu_tensor`."""
    from helpers.lint.python_rules import _call_name

    _accelerator_cpu_tensor(lt)
    if sc.backend != "nccl":
        return
    for call in lt._calls():
        recv, name = _call_name(call)
        if name not in ("all_reduce", "broadcast", "reduce", "all_gather_into_tensor", "reduce_scatter_tensor") or \
                recv not in ("dist", "torch.distributed") or not call.args or not isinstance(call.args[0], ast.Name):
            continue
        var = call.args[0].id
        made = assigned_once(lt, var, call)
        if made is None:
            continue
        cname = _cpu_ctor(made.value)
        if cname is not None and not moved(lt, var, call):
            lt.add("nccl-cpu-tensor", "error", call,
                   f"{var} (torch.{cname}(...), line {made.lineno}) is a CPU tensor and the backend is nccl: "
                   "'Tensors must be CUDA and dense'", f"create it on the GPU: torch.{cname}(..., device='cuda') or "
                   f"{var}.cuda()", _DIST + "#backends")


_TENSOR_GATHERS = {"gather", "gather_for_metrics", "all_gather", "all_gather_into_tensor"}
_DATA_SIZED = {"masked_select", "nonzero", "unique", "unique_consecutive", "argwhere"}


def _data_sized(expr: ast.AST) -> str | None:
    """Why ``expr`` has a size that depends on the data (so on the rank), or None: boolean-mask indexing
    (``x[mask]``, ``x[mask.bool()]``, ``x[x > 0]``) or ``masked_select`` / ``nonzero`` / ``unique``; method calls that
    keep the size (``.float()``, ``.to(...)``, ``.detach()``) are looked through."""
    while isinstance(expr, ast.Call) and isinstance(expr.func, ast.Attribute) and \
            expr.func.attr in ("float", "half", "bfloat16", "to", "detach", "contiguous", "cpu", "cuda", "clone"):
        expr = expr.func.value
    if isinstance(expr, ast.Subscript):
        index = expr.slice
        if isinstance(index, ast.Compare) or (isinstance(index, ast.Call) and isinstance(index.func, ast.Attribute)
                                              and index.func.attr == "bool") or \
                (isinstance(index, (ast.Name, ast.Attribute)) and "mask" in ast.unparse(index).lower()):
            return f"boolean-mask indexing {ast.unparse(expr)[:50]}"
    if isinstance(expr, ast.Call):
        name = expr.func.attr if isinstance(expr.func, ast.Attribute) else getattr(expr.func, "id", "")
        if name in _DATA_SIZED:
            return f"{name}() {ast.unparse(expr)[:50]}"
    return None


def rule_gather_variable_shape(lt: PythonLinter) -> None:
    """A tensor whose length depends on the rank's data, gathered as it is.

    ``all_gather`` / ``all_gather_into_tensor`` need the same size on every rank (torch.distributed: the output holds
    world_size equal chunks), and Accelerate's ``gather`` / ``gather_for_metrics`` call them unchanged; its documented
    way for tensors of different lengths is ``pad_across_processes`` first (:data:`_ACC_OPERATIONS`).  Ranks whose masks
    keep different numbers of elements then fail with a size mismatch or hang.  The gathered value is the expression
    itself or a name assigned once from it in the same function; a ``pad_across_processes`` of that name clears it."""
    from helpers.lint.python_rules import _call_name

    for call in lt._calls():
        recv, name = _call_name(call)
        if name not in _TENSOR_GATHERS or not call.args or not (
                "accelerator" in recv.lower() and name in ("gather", "gather_for_metrics")
                or recv in ("dist", "torch.distributed") and name in ("all_gather", "all_gather_into_tensor")):
            continue
        arg = call.args[1] if name in ("all_gather", "all_gather_into_tensor") and len(call.args) > 1 else call.args[0]
        why = _data_sized(arg)
        if why is None and isinstance(arg, ast.Name):
            fn = lt._enclosing_function(call) or lt.tree
            made = assigned_once(lt, arg.id, call)
            padded = any(isinstance(n, ast.Call) and _call_name(n)[1] == "pad_across_processes" for n in subtree(fn))
            if made is not None and not padded:
                why = _data_sized(made.value)
                why = f"{arg.id} = {why} (line {made.lineno})" if why else None
        if why is None:
            continue
        lt.add("gather-variable-shape", "warning", call,
               f"{recv}.{name}() gathers a tensor whose length depends on each rank's data ({why}): the ranks' "
               "tensors differ in size, which all_gather does not allow (a size mismatch error or a hang)",
               f"pad first: {recv}.pad_across_processes(t, dim=0) (then drop the padding), or gather the per-rank "
               "counts and values of a fixed size" if "accelerator" in recv.lower() else
               "all_gather the sizes first, pad every rank's tensor to the largest, gather, then trim", _ACC_OPERATIONS)


def collect_cpu_tensor_facts(lt: PythonLinter) -> None:
    """:attr:`PyFacts.collective_params` (module-level functions that pass a parameter as the tensor of
    ``dist.all_reduce`` / ``all_gather`` / ``broadcast`` / ``reduce``), :attr:`PyFacts.cpu_tensor_args` (calls of
    functions defined elsewhere given an inline ``torch.tensor(...)`` without ``device=``: a CPU tensor) and
    :attr:`PyFacts.mentions_nccl`, for :func:`helpers.lint.cross_rules.cpu_tensor_to_collective_across`."""
    from helpers.lint.python_rules import _call_name, _src

    f = lt.facts
    f.mentions_nccl = "nccl" in lt.text
    for fn in getattr(lt.tree, "body", []):
        if not isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        params = [a.arg for a in fn.args.args]
        used = {params.index(c.args[0].id) for c in subtree(fn) if isinstance(c, ast.Call)
                and _call_name(c)[0] in ("dist", "torch.distributed") and _call_name(c)[1] in
                ("all_reduce", "broadcast", "reduce", "all_gather_into_tensor") and c.args
                and isinstance(c.args[0], ast.Name) and c.args[0].id in params}
        if used:
            f.collective_params[fn.name] = used
    for call in lt._calls():
        recv, name = _call_name(call)
        if recv or name in lt.functions or not name:
            continue
        for i, a in enumerate(call.args):
            if _cpu_ctor(a) is not None:
                f.cpu_tensor_args.append((name, i, call.lineno, _src(a)[:50]))


TORCH_DISTRIBUTED_NAMES = Path(__file__).resolve().parents[1] / "data" / "torch_distributed_names.txt"


@lru_cache(maxsize=1)
def torch_distributed_names() -> frozenset[str]:
    """The lowercase names ``torch.distributed`` has (:data:`TORCH_DISTRIBUTED_NAMES`, taken from the installed torch;
    a test keeps them equal)."""
    return frozenset(line.strip() for line in TORCH_DISTRIBUTED_NAMES.read_text().splitlines()
                     if line.strip() and not line.startswith("#"))


def rule_distributed_api_unknown(lt: PythonLinter) -> None:
    """``dist-api-unknown``: ``dist.<name>`` where ``dist`` is ``torch.distributed`` (``import torch.distributed as
    dist``, ``from torch import distributed as dist``, or spelled out) and the name is none torch.distributed has
    (:func:`torch_distributed_names`) but one a slip away from a name it has (``get_`` left out, or a close spelling):
    ``AttributeError: module 'torch.distributed' has no attribute ...`` when that line runs (icefall's ``dist.rank()``
    for ``dist.get_rank()``).  A name far from every known one may be an API of a newer torch (torchtitan calls
    ``set_timeout``) and is left alone, as are capitalised names (classes such as ``ProcessGroupNCCL``, present only
    in some builds) and a name the file assigns to the module."""
    aliases = {"torch.distributed"} | {name for name, origin in lt.import_origins.items()
                                       if origin == "torch.distributed" and name != "torch"}
    aliases -= {t.id for n in lt.nodes if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    if len(aliases) == 1 and "torch.distributed" not in lt.text:
        return
    import difflib

    known = torch_distributed_names()
    for n in lt.nodes:
        if isinstance(n, ast.Attribute) and isinstance(n.ctx, ast.Load) and n.attr[:1].islower() and \
                not n.attr.startswith("_") and n.attr not in known and ast.unparse(n.value) in aliases:
            meant = f"get_{n.attr}" if f"get_{n.attr}" in known else next(
                iter(difflib.get_close_matches(n.attr, known, n=1, cutoff=0.85)), None)
            if meant is None:
                continue  # far from every name: an API of a newer torch (torchtitan's set_timeout), not a slip
            lt.add("dist-api-unknown", "error", n,
                   f"{ast.unparse(n)}: torch.distributed has no '{n.attr}'; '{meant}' is what it has (AttributeError "
                   "when this line runs)", f"{ast.unparse(n.value)}.{meant}",
                   "https://docs.pytorch.org/docs/stable/distributed.html")


_BARRIERS = {"barrier", "wait_for_everyone", "monitored_barrier", "wait_for_everybody"}
_STEP_CALLS = {"backward", "step"}


def _own_calls(loop: ast.For | ast.While | ast.AsyncFor) -> list[ast.Call]:
    """The calls one iteration of ``loop`` makes itself (not inside a nested loop, function or class)."""
    out: list[ast.Call] = []
    todo: list[ast.AST] = list(loop.body)
    while todo:
        node = todo.pop()
        if isinstance(node, (ast.For, ast.While, ast.AsyncFor, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef,
                             ast.Lambda)):
            continue
        if isinstance(node, ast.Call):
            out.append(node)
        todo.extend(ast.iter_child_nodes(node))
    return out


_DATA_BASES = re.compile(r"(?:^|\.)(?:Sampler|BatchSampler|DistributedSampler|IterableDataset|Dataset)$")


def rule_collective_in_sampler(lt: PythonLinter) -> None:
    """A collective (``dist.barrier()``, ``accelerator.wait_for_everyone()``, an all-reduce) inside the ``__iter__`` /
    ``__getitem__`` / ``__next__`` of a Sampler or Dataset class: it runs once per batch or sample this rank's data
    yields, and each rank's sampler decides that from its own data (buckets exhausted, uneven shards), so the ranks
    call it a different number of times and the last ones wait forever ("Every rank of the group calls the same
    collectives in the same order", ``_COLL``); in DataLoader workers (num_workers > 0) there is no process group at all
    (bghira/SimpleTuner removed the per-batch wait_for_everyone from its MultiAspectSampler)."""
    for cls in (n for n in lt.nodes if isinstance(n, ast.ClassDef)
                and any(_DATA_BASES.search(ast.unparse(b)) for b in n.bases)):
        for fn in (b for b in cls.body if isinstance(b, ast.FunctionDef)
                   and b.name in ("__iter__", "__getitem__", "__next__", "__getitems__")):
            hit = next((c for c in subtree(fn) if isinstance(c, ast.Call) and lt.collective_name(c)), None)
            if hit is None:
                continue
            lt.add("collective-in-sampler", "warning", hit,
                   f"{lt.collective_name(hit)} runs in {cls.name}.{fn.name}: once per item this rank's data yields, "
                   "which differs between ranks (and in a DataLoader worker no process group exists): the ranks "
                   "reach it a different number of times and hang",
                   "synchronise in the training loop (once per step or epoch), not inside the sampler or dataset",
                   _COLL)
            return


def rule_barrier_every_step(lt: PythonLinter) -> None:
    """A barrier (``dist.barrier()``, ``accelerator.wait_for_everyone()``) as a plain statement of the training-step
    loop (the loop whose own iteration calls ``backward``/``optimizer.step``), under no condition: every step waits
    for the slowest rank ("This collective blocks processes until the whole group enters this function", ``_DIST``
    barrier; Accelerate's wait_for_everyone "Will stop the execution of the current process until every other process
    has reached that point ... Useful to do before saving a model", ``_ACC``).  The gradient all-reduce already
    synchronises the step; the extra barrier stalls every rank on every step (multi-node utilisation drops).  Keep it
    in the branch that saves or evaluates."""
    from helpers.lint.python_rules import _call_name

    if not any(b in lt.text for b in _BARRIERS):
        return
    for c in lt._calls():
        if _call_name(c)[1] not in _BARRIERS:
            continue
        stmt = lt.parents.get(c)
        loop = lt.parents.get(stmt) if isinstance(stmt, ast.Expr) else None
        if not isinstance(loop, (ast.For, ast.While, ast.AsyncFor)) or stmt not in loop.body:
            continue
        steps = sorted((x for x in _own_calls(loop) if _call_name(x)[1] in _STEP_CALLS
                        and "sched" not in _call_name(x)[0].lower()),  # a scheduler may step once an epoch
                       key=lambda x: (_call_name(x)[1] != "backward", x.lineno))
        if not steps:
            continue
        lt.add("barrier-every-step", "warning", c,
               f"{ast.unparse(c)} runs on every iteration of the training loop (line {loop.lineno}, "
               f"{ast.unparse(steps[0].func)} at line {steps[0].lineno}): every step waits for the slowest rank, "
               "on top of the gradient all-reduce",
               "call it only where it is needed: inside the save/evaluation branch (if step % save_steps == 0: "
               "wait_for_everyone(); save on the main process)", _ACC)


_DIST_SETUP = frozenset({"DistributedSampler", "DistributedDataParallel", "DDP", "init_process_group", "set_device",
                         "FullyShardedDataParallel", "FSDP"})


def _undefined_names(text: str) -> dict[tuple[int, str], int]:
    """``{(line, name): column}`` of the names ruff's pyflakes check F821 finds undefined in ``text`` (a NameError
    when that line runs).  ruff is the analyser (a project dependency, the linter of this code base); ``{}`` when it
    cannot run."""
    import json
    import subprocess

    from helpers import procs

    ruff = procs.find_tool("ruff")
    if ruff is None:
        return {}
    try:
        proc = subprocess.run([ruff, "check", "--no-cache", "--isolated", "--select", "F821", "--output-format", "json",
                               "--stdin-filename", "x.py", "-"], input=text, capture_output=True, text=True, timeout=10,
                              check=False)
        found = json.loads(proc.stdout or "[]")
    except (OSError, subprocess.SubprocessError, ValueError):
        return {}
    out: dict[tuple[int, str], int] = {}
    for f in found:
        m = re.search(r"`([^`]+)`", f.get("message", ""))
        if m:
            out[(f["location"]["row"], m.group(1))] = f["location"]["column"]
    return out


def rule_undefined_distributed_flag(lt: PythonLinter) -> None:
    """A name that decides the distributed set-up (``DistributedSampler(ds) if distributed else None``, ``if
    distributed: model = DDP(model)``) but is defined nowhere the code can see it: that line raises ``NameError``
    when it runs (ruff's F821 finds the undefined name; NERSC's sc22 tutorial read ``distributed`` in a function
    whose caller set ``params.distributed``); also an undefined name read in the branch that does the set-up (FunASR's
    FSDP wrap policy read ``unwrapped_params``): that branch runs only in the distributed job, so a single-process
    try never reaches it.  Other undefined names are left to a general linter."""
    from helpers.lint.python_rules import _call_name

    _undefined_when_distributed(lt)
    if not any(k in lt.text for k in _DIST_SETUP):
        return
    undefined = None
    for node in lt.nodes:
        if isinstance(node, ast.IfExp):
            test, branches = node.test, [node.body, node.orelse]
        elif isinstance(node, ast.If):
            test, branches = node.test, node.body + node.orelse
        else:
            continue
        if not any(isinstance(c, ast.Call) and _call_name(c)[1] in _DIST_SETUP for b in branches for c in ast.walk(b)):
            continue
        names = list(ast.walk(test))
        if isinstance(node, ast.If):  # and the branch that does the set-up, run only in the distributed case
            for branch in (node.body, node.orelse):
                if any(isinstance(c, ast.Call) and _call_name(c)[1] in _DIST_SETUP for s in branch for c in ast.walk(s)) \
                        and not (len(branch) == 1 and isinstance(branch[0], ast.If)):  # an elif: its own If
                    inside = [n for s in branch for n in ast.walk(s)]
                    undefined = _undefined_names(lt.text) if undefined is None else undefined
                    spans = {(n.lineno, n.id) for n in inside if isinstance(n, ast.Name)}
                    if set(undefined) <= spans:  # a whole file: nothing undefined outside the branch (an excerpt
                        names += inside         # leaves its globals undefined everywhere)
        for n in names:
            if not (isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)) or \
                    isinstance(lt.parents.get(n), ast.Attribute):
                continue  # `args.distributed` with no `args` here is an excerpt's global, not this bug
            undefined = _undefined_names(lt.text) if undefined is None else undefined
            if (n.lineno, n.id) in undefined:
                lt.add("undefined-name", "error", n,
                       f"{n.id} {'decides' if any(n is x for x in ast.walk(test)) else 'is read in'} the distributed "
                       "set-up here but is not defined in this scope (nor globally): "
                       f"the line raises NameError: name '{n.id}' is not defined",
                       f"pass it in or read it where it is set (params.{n.id}, args.{n.id})",
                       "https://docs.python.org/3/reference/executionmodel.html#resolution-of-names")
                return


_SIZE_OVER_ONE = re.compile(r"\b\w*(?:size|count|gpus|processes|replicas)\w*\s*(?:>\s*1|>=\s*2|!=\s*1)\b")


def _undefined_when_distributed(lt: PythonLinter) -> None:
    """``undefined-name`` for a name no scope defines, read only where the process group has several ranks: under
    ``if world_size > 1:`` or after the function's own ``if not dist.is_initialized(): return``.  A one-process run
    (the usual first try, and a library's unit tests) never reaches that line; the first multi-GPU job raises
    NameError there (webdataset's ``split_by_node`` read ``wid``, copied from ``split_by_worker``).  Only in a whole
    file: where other undefined names are read elsewhere too, the file is an excerpt (ruff's F821 finds them)."""
    if "is_initialized" not in lt.text and not _SIZE_OVER_ONE.search(lt.text):
        return
    undefined = _undefined_names(lt.text)
    if not undefined:
        return
    hits = []
    for n in lt.nodes:
        if not (isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and (n.lineno, n.id) in undefined):
            continue
        fn = lt._enclosing_function(n)
        if fn is None:
            return  # read at module level: an excerpt's global, or a general linter's finding
        guarded = any(isinstance(p, ast.If) and _SIZE_OVER_ONE.search(ast.unparse(p.test)) and
                      any(n is x for st in p.body for x in subtree(st)) for p in ancestors(lt, n))
        early = any(isinstance(st, ast.If) and st.lineno < n.lineno and "is_initialized()" in ast.unparse(st.test)
                    and re.match(r"^not\b|.*\bor not\b", ast.unparse(st.test)) and
                    any(isinstance(b, ast.Return) for b in st.body) for st in fn.body)
        if not (guarded or early):
            return  # an undefined name on every path too: not this rule's (an excerpt, or ruff's)
        hits.append(n)
    if hits:
        n = hits[0]
        lt.add("undefined-name", "error", n,
               f"{n.id} is not defined in this scope (nor globally), and this line runs only when the process group "
               "has several ranks: a one-process run never reaches it, the first multi-GPU job raises NameError: "
               f"name '{n.id}' is not defined", f"define {n.id} here (or read the value this branch meant)",
               "https://docs.python.org/3/reference/executionmodel.html#resolution-of-names")


_IN_PLACE_REDUCE = frozenset({"all_reduce", "reduce"})


def rule_collective_same_tensor_twice(lt: PythonLinter) -> None:
    """The same tensor all-reduced twice in one block with nothing assigned to it between the calls: ``all_reduce``
    works in place ("the final result ... will be in tensor"; ``_COLL``), so the second call reduces the first one's
    sum (N x N times one rank's value after a SUM); it is usually a copy-paste where another tensor was meant, which is
    then never reduced (pyg-team/pytorch_geometric#9896: train_acc reduced three times, val_acc and test_acc never)."""
    from helpers.lint.python_rules import _call_name

    for block in statement_blocks(lt):
        seen: dict[str, int] = {}
        for stmt in block:
            call = stmt.value if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Call) else None
            if call is not None and lt.collective_name(call) and _call_name(call)[1] in _IN_PLACE_REDUCE and call.args:
                key = ast.unparse(call.args[0])
                if key in seen:
                    lt.add("collective-same-tensor-twice", "warning", stmt,
                           f"{ast.unparse(call)[:60]} reduces {key} again (first at line {seen[key]}) with nothing "
                           f"assigned to it between: {_call_name(call)[1]} works in place, so the second call "
                           "reduces the first one's result; another tensor was likely meant, and it is never reduced",
                           f"reduce each tensor once: {_call_name(call)[1]}(<the other tensor>)", _COLL)
                    del seen[key]
                    continue
                seen[key] = stmt.lineno
                continue
            if not seen:
                continue  # nothing reduced yet in this block: no assignment to look for
            written = {ast.unparse(t) for n in ast.walk(stmt) if isinstance(n, (ast.Assign, ast.AugAssign))
                       for t in (n.targets if isinstance(n, ast.Assign) else [n.target])}
            seen = {k: v for k, v in seen.items() if not any(k == w or k.startswith(w + ".") or
                                                             k.startswith(w + "[") for w in written)}


_GATHERS_RETURNING = {"gather_for_metrics", "collect_results", "collect_results_gpu", "collect_results_cpu",
                      "pad_across_processes", "scatter_full_optim_state_dict", "shard_full_optim_state_dict",
                      "optim_state_dict_to_load"}
"""Collectives that return what they gathered (Accelerate's ``gather_for_metrics`` / ``pad_across_processes``,
mmengine's ``collect_results``), unlike ``torch.distributed.all_gather``, which fills the list it is given; and FSDP's
optimizer-state converters, which return the state dict to pass to ``optimizer.load_state_dict`` ("Returns: The full
optimizer state dict now remapped to flattened parameters ... restricted to only include this rank's part",
``FSDP.scatter_full_optim_state_dict``, https://docs.pytorch.org/docs/stable/fsdp.html)."""


def rule_collective_result_discarded(lt: PythonLinter) -> None:
    """A gathering call whose result is thrown away (an expression statement): every rank joins the collective and
    then keeps its own unmerged data (open-mmlab/mmengine#1208: ``collect_results(self.results, size, 'gpu')`` on a
    line of its own).  ``accelerator.gather`` / ``accelerator.reduce`` count too (they return the result:
    :data:`_ACC`), and ``torch.distributed.nn.functional``'s collectives ("Returns: A tuple of Tensors", out of place:
    https://docs.pytorch.org/docs/stable/distributed.html#autograd-enabled-communication-primitives; stable-pretraining's
    ``all_gather`` wrapper returned its input)."""
    from helpers.lint.python_rules import _call_name

    for n in lt.nodes:
        if not (isinstance(n, ast.Expr) and isinstance(n.value, ast.Call)):
            continue
        recv, name = _call_name(n.value)
        functional = name in _GROUP_COLLECTIVES and bool(re.search(r"distributed\.nn(?:\.functional)?$", recv) or
                                                         lt.import_origins.get(recv, "").startswith("torch.distributed.nn"))
        if not (name in _GATHERS_RETURNING or name in ("gather", "reduce") and recv.endswith("accelerator") or functional):
            continue  # torch.distributed.nn.functional's collectives return their output (autograd-aware, not in place)
        if "optim_state_dict" in name:
            lt.add("collective-result-discarded", "error", n,
                   f"{ast.unparse(n)[:60]}: it returns this rank's optimizer state and the line throws it away, so "
                   "the optimizer is never given the checkpoint's state (its moments restart at zero on resume)",
                   f"optimizer.load_state_dict({ast.unparse(n.value)[:50]})", "https://docs.pytorch.org/docs/stable/"
                   "fsdp.html#torch.distributed.fsdp.FullyShardedDataParallel.scatter_full_optim_state_dict")
            continue
        lt.add("collective-result-discarded", "error", n,
               f"{ast.unparse(n)[:60]}: the gathered result is thrown away; every rank joins the collective and "
               "then goes on with its own part only",
               f"keep it: results = {ast.unparse(n.value)[:50]}", _ACC + "#accelerate.Accelerator.gather_for_metrics")


_FS_TEST = re.compile(r"(?:os\.path\.(?:exists|isfile|isdir)|\.exists|\.is_file|\.is_dir|glob|listdir)\(")
"""A test of the filesystem: its answer depends on when each rank looks (a rank-0 download or save in progress)."""


_MAKES_FILE = re.compile(r"download|urlretrieve|load_state_dict_from_url|snapshot_download|makedirs|mkdir|copy")
"""Calls that create the file or directory a branch tested for (downloads, copies, directories)."""


def rule_collective_in_filesystem_branch(lt: PythonLinter) -> None:
    """A collective in one branch of ``if os.path.exists(path):`` and none in the other: whether the file is there
    depends on when each rank looks (rank 0 downloading or saving it, a shared filesystem's delay), so some ranks take
    the branch with the barrier and the others skip it: the barrier never completes, or pairs with an unrelated one
    (Peterande/D-FINE: the pretrained weights' download barrier only where the file was missing).  Only where that
    path itself makes a file (a download, a save, a directory): a file that was there before the run (a checkpoint
    to resume) is seen alike by every rank.  Collectives must be reached on every rank (D21); test on rank 0 and
    broadcast the answer, or barrier on every path."""
    from helpers.lint.python_rules import _call_name

    if not _FS_TEST.search(lt.text):
        return

    def collectives(stmts: list[ast.stmt]) -> list[ast.Call]:
        out = []
        for st in stmts:
            for c in (n for n in subtree(st) if isinstance(n, ast.Call)):
                if lt.collective_name(c) or _call_name(c)[1].endswith("barrier"):
                    out.append(c)
        return out

    for node in lt.nodes:
        if not (isinstance(node, ast.If) and _FS_TEST.search(ast.unparse(node.test))) or lt.taint.rank_test(node.test):
            continue
        body, other = collectives(node.body), collectives(node.orelse)
        if bool(body) == bool(other):
            continue
        side = node.body if body else node.orelse
        if not any(isinstance(c, ast.Call) and (lt._write_kind(c) == "file" or _MAKES_FILE.search(_call_name(c)[1]))
                   for st in side for c in subtree(st)):
            continue  # nothing on that path makes the file: it was there (or not) before the run, alike on all ranks
        hit = (body or other)[0]
        lt.add("collective-in-data-dependent-branch", "warning", hit,
               f"{ast.unparse(hit.func)}() is reached only when `{ast.unparse(node.test)[:60]}` is "
               f"{'true' if body else 'false'}, a test of the filesystem that ranks can answer differently (rank 0 "
               "downloading or writing that file): the ranks that go the other way never join it (hang, or it pairs "
               "with another barrier)", "decide on rank 0 and broadcast the answer (broadcast_object_list), or make "
               "every path reach the same collectives", "D21")


_NON_FINITE = re.compile(r"\b(?:isnan|isinf|isfinite)\(")
_STEP_WORK = re.compile(r"\.backward\(|\bstep\(|update_params\(|backward\(")
_REDUCES = re.compile(r"(?i)all_reduce|reduce_\w*|\w*_reduce\(|gather|allreduce|sync")


def rule_nonfinite_loss_break(lt: PythonLinter) -> None:
    """``collective-in-data-dependent-branch`` for a training loop left with ``break`` (or ``return``) when this
    rank's own loss is not finite (``if torch.isnan(loss) or torch.isinf(loss): break``) in a data-parallel script:
    each rank tests the loss of its own batch, so one rank leaves the loop while the others go on into the next
    step's backward, whose gradient all-reduce the leaver never joins (a hang until the NCCL timeout; torchdistill
    fixed it).  Collectives are reached by every rank (D21): reduce the flag first (all_reduce of a 0/1 tensor) or
    stop the whole job (sys.exit: torchrun then ends the other workers).  Not where the tested loss was reduced
    across ranks in the loop before the test (DETR's ``reduce_dict``)."""
    if not _NON_FINITE.search(lt.text) or not re.search(r"DistributedDataParallel|init_process_group|\bDDP\(",
                                                         lt.text):
        return
    for node in lt.nodes:
        if not (isinstance(node, ast.If) and _NON_FINITE.search(ast.unparse(node.test)) and
                re.search(r"(?i)loss", ast.unparse(node.test))):
            continue
        if not any(isinstance(st, (ast.Break, ast.Return)) for st in node.body):
            continue
        loop = next((p for p in ancestors(lt, node) if isinstance(p, (ast.For, ast.While))), None)
        if loop is None or not _STEP_WORK.search(ast.unparse(loop)):
            continue
        tested = {n.id for n in ast.walk(node.test) if isinstance(n, ast.Name)}
        if any(isinstance(c, ast.Call) and _REDUCES.search(ast.unparse(c.func)) and c.lineno < node.lineno and
               ({n.id for n in ast.walk(c) if isinstance(n, ast.Name)} & tested or
                isinstance(lt.parents.get(c), ast.Assign) and
                {t.id for t in lt.parents[c].targets if isinstance(t, ast.Name)} & tested)  # type: ignore[attr-defined]
               for c in subtree(loop)):
            continue  # the loss was reduced across ranks first: every rank sees the same value
        lt.add("collective-in-data-dependent-branch", "warning", node,
               f"`{ast.unparse(node.test)[:60]}` tests this rank's own loss and leaves the training loop: the other "
               "ranks' losses are finite, so they go on into the next step's backward, whose gradient all-reduce this "
               "rank never joins (a hang until the collective times out)",
               "all_reduce a non-finite flag across ranks and break on every rank together (or sys.exit(1): the "
               "launcher then ends the other workers)", "D21")


_POLL = re.compile(r"\.(?:done|is_completed|query)\(\)")
"""A poll of asynchronous work (``Future.done()``, ``Work.is_completed()``, ``Event.query()``): true once this
process's own work has finished, a moment that differs between ranks."""


def rule_collective_under_poll(lt: PythonLinter) -> None:
    """A collective reached only when ``fut.done()`` (an async checkpoint's future, a ``Work`` polled with
    ``is_completed()``): each rank's work finishes at its own moment, so at the same step some ranks see it done and
    enter the barrier while the others go on to the next collective (allenai/OLMo-core: the async checkpointer's
    barrier under ``if blocking or fut.done()``).  Collectives are reached by every rank (D21): decide on one rank and
    broadcast, or wait (``fut.result()``) on every rank before the barrier."""
    if not _POLL.search(lt.text):
        return
    for node in lt.nodes:
        if not (isinstance(node, ast.If) and _POLL.search(ast.unparse(node.test))) or lt.taint.rank_test(node.test):
            continue
        inside = [c for st in node.body for c in subtree(st) if isinstance(c, ast.Call) and
                  (lt.collective_name(c) or ast.unparse(c.func).endswith("barrier"))]
        other = [c for st in node.orelse for c in subtree(st) if isinstance(c, ast.Call) and
                 (lt.collective_name(c) or ast.unparse(c.func).endswith("barrier"))]
        if not inside or other:
            continue
        hit = inside[0]
        lt.add("collective-in-data-dependent-branch", "warning", hit,
               f"{ast.unparse(hit.func)}() is reached only when `{ast.unparse(node.test)[:60]}` holds, a poll of this "
               "rank's own asynchronous work: ranks finish it at different moments, so some enter the collective and "
               "the others go on (a hang, or it pairs with another collective)",
               "wait on every rank (fut.result()) before the collective, or decide on one rank and broadcast", "D21")


def rule_exception_skips_collective(lt: PythonLinter) -> None:
    """``try: loss = model(batch); loss.backward() except SomeError: continue`` in the training loop of a data
    parallel script: the exception depends on this rank's batch, so one rank skips the step's backward (DDP's
    gradient all-reduce) while the others run it and wait for it: the collectives no longer line up (a hang, or
    gradients averaged with the next step's; NVIDIA-NeMo/Automodel's skipped micro-batches).  Every rank must make the
    same collectives (D21): agree on skipping (all-reduce a flag) or make the step a no-op on every rank."""
    from helpers.lint.python_rules import WRAPS_DDP

    if ".backward(" not in lt.text or not re.search(WRAPS_DDP, lt.text):
        return
    for t in (n for n in lt.nodes if isinstance(n, ast.Try)):
        if not any(isinstance(a, (ast.For, ast.While)) for a in ancestors(lt, t)):
            continue
        backward = next((c for st in t.body for c in subtree(st) if isinstance(c, ast.Call) and
                         isinstance(c.func, ast.Attribute) and c.func.attr == "backward"), None)
        if backward is None:
            continue
        for h in t.handlers:
            skip = next((x for x in h.body if isinstance(x, (ast.Continue, ast.Break, ast.Return))), None)
            if skip is None or any(isinstance(x, ast.Raise) for x in ast.walk(h)) or \
                    (h.type is not None and "StopIteration" in ast.unparse(h.type)):
                continue  # (StopIteration: the data ran out, on every rank at the same step with equal shards)
            lt.add("exception-skips-collective", "warning", skip,
                   f"the except clause (line {h.lineno}) skips this step with `{ast.unparse(skip)}` when "
                   f"{ast.unparse(h.type) if h.type else 'an exception'} is raised on this rank: its backward "
                   f"(line {backward.lineno}, DDP's gradient all-reduce) does not run while the other ranks run theirs, "
                   "so the collectives stop lining up (hang, or mixed steps)",
                   "agree across ranks first (all-reduce a skip flag and skip together), or filter the data so every "
                   "rank can run the step", "D21")
            break


_INTO_OUTPUT = {"all_gather_object": (0, 1), "all_gather": (0, 1), "gather_object": (1, 0), "gather": (1, 0)}
"""torch.distributed collectives that write every rank's part into an output list and leave this rank's input as it
was: name -> (output position, input position): ``all_gather_object(object_list, obj)``, ``all_gather(tensor_list,
tensor)``, ``gather_object(obj, object_gather_list, dst)``, ``gather(tensor, gather_list, dst)`` (``_COLL``)."""


def rule_local_used_after_gather(lt: PythonLinter) -> None:
    """``dist.all_gather_object(all_preds, preds)`` then, on rank 0 only (under a rank test, or after ``if rank != 0:
    return``), the input ``preds`` read where the gathered ``all_preds`` was meant: the input still holds rank 0's
    part only, so rank 0 writes or scores a 1/N share of the results (mlfoundations/open_flamingo: predictions
    looked up in the local dict by keys from the gathered one).  Only when the gathered output is read too in that
    function (the author gathered for a reason) and the input is not rebound after the gather."""
    from helpers.lint.python_rules import _call_name

    if "gather" not in lt.text:
        return
    for c in lt._calls():
        recv, name = _call_name(c)
        if name not in _INTO_OUTPUT or not re.search(r"dist|distributed", recv) or len(c.args) < 2 or \
                not all(isinstance(a, ast.Name) for a in c.args[:2]):
            continue
        at_out, at_in = _INTO_OUTPUT[name]
        out, local = c.args[at_out].id, c.args[at_in].id  # type: ignore[attr-defined]
        fn = lt._enclosing_function(c) or lt.tree
        later = [n for n in subtree(fn) if getattr(n, "lineno", 0) > c.end_lineno]  # type: ignore[operator]
        if any(isinstance(n, ast.Name) and n.id == local and isinstance(n.ctx, ast.Store) for n in later) or \
                not any(isinstance(n, ast.Name) and n.id == out and isinstance(n.ctx, ast.Load) for n in later):
            continue
        fed = {id(a) for g in later if isinstance(g, ast.Call) and lt.collective_name(g) for a in ast.walk(g)}
        read = next((n for n in later if isinstance(n, ast.Name) and n.id == local and isinstance(n.ctx, ast.Load)
                     and id(n) not in fed and (lt._rank_gate(n) is not None or lt._after_rank_exit(n))), None)
        if read is None:
            continue
        lt.add("collective-result-discarded", "warning", read,
               f"{local} is read on one rank after {name}({out}, {local}) (line {c.lineno}) gathered every rank's "
               f"part into {out}: {local} still holds this rank's part only, so the rank-0 results cover 1/N of the "
               "data", f"use {out} (the gathered parts) here", _DIST + "#torch.distributed.all_gather_object")


_GATHERISH = re.compile(r"^(?:all_gather\w*|concat_all_gather|gather|gather_from_all|gather_features|dist_gather\w*|"
                        r"gather_all\w*|gather_tensors?|gather_with_grad|concat_gather)$")
_PAIRWISE = frozenset({"einsum", "mm", "matmul", "bmm", "cosine_similarity", "cdist", "inner"})
_CLIP_LOSS = "https://github.com/mlfoundations/open_clip/blob/main/src/open_clip/loss.py"


def _gathered_names(lt: PythonLinter, fn: ast.AST) -> set[str]:
    """Names of ``fn`` that hold every rank's rows: assigned from a gather (``gather(z)``, ``concat_all_gather(k)``,
    ``GatherLayer.apply(z)``, ``torch.cat`` of a list ``dist.all_gather`` filled), then from expressions of those
    (``F.normalize(g)``, ``g.t()``), three rounds.  ``torch.gather(x, dim, index)`` / ``x.gather(dim, index)`` (an
    index look-up) is not one."""
    from helpers.lint.python_rules import _call_name

    filled = {c.args[0].id for c in subtree(fn) if isinstance(c, ast.Call) and _call_name(c)[1] == "all_gather"
              and c.args and isinstance(c.args[0], ast.Name)}
    out: set[str] = set()
    assigns = [n for n in subtree(fn) if isinstance(n, ast.Assign) and len(n.targets) == 1
               and isinstance(n.targets[0], ast.Name)]
    for n in assigns:
        v = n.value
        if not isinstance(v, ast.Call):
            continue
        recv, name = _call_name(v)
        gather = _GATHERISH.match(name) and len(v.args) == 1 and not v.keywords and recv in ("", "dist", "utils",
                                                                                              "misc", "self")
        layer = name == "apply" and "gather" in recv.lower()
        joined = name in ("cat", "concat", "stack") and v.args and any(
            isinstance(x, ast.Name) and x.id in filled for x in ast.walk(v.args[0]))
        if gather or layer or joined:
            out.add(n.targets[0].id)  # type: ignore[attr-defined]
    for _ in range(3):
        out |= {n.targets[0].id for n in assigns  # type: ignore[attr-defined]
                if any(isinstance(x, ast.Name) and x.id in out for x in ast.walk(n.value))}
    return out


def _mixed(node: ast.AST, gathered: set[str], local: set[str]) -> bool:
    """``node`` pairs this rank's rows with every rank's: a ``@`` / comparison / pairwise call (einsum, mm, matmul...)
    with a gathered operand and a local one (names of ``local``, never gathered)."""
    from helpers.lint.python_rules import _call_name

    def has(e: ast.AST, names: set[str]) -> bool:
        return any(isinstance(x, ast.Name) and x.id in names for x in ast.walk(e))

    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.MatMult):
        sides = [node.left, node.right]
    elif isinstance(node, ast.Compare) and len(node.comparators) == 1:
        sides = [node.left, node.comparators[0]]
    elif isinstance(node, ast.Call) and _call_name(node)[1] in _PAIRWISE:
        sides = [a for a in node.args if not isinstance(a, ast.Constant)]
    else:
        return False
    def global_rows(e: ast.AST) -> bool:  # a gathered name, or a gather called in place
        return has(e, gathered) or any(isinstance(x, ast.Call) and (
            _GATHERISH.match(_call_name(x)[1]) and len(x.args) == 1 or
            _call_name(x)[1] == "apply" and "gather" in _call_name(x)[0].lower()) for x in ast.walk(e))

    return any(global_rows(a) for a in sides) and any(has(a, local) and not global_rows(a) for a in sides)


def rule_gathered_labels_without_rank_offset(lt: PythonLinter) -> None:
    """``gathered-labels-without-rank-offset``: this rank's rows compared with every rank's (``z @ gather(z).T``,
    ``indexes.t() == gather(indexes)``) give a (local x global) matrix whose self-pairs sit at column ``rank * n +
    i``, not on the diagonal; the diagonal masked out (``fill_diagonal_``) or the targets taken as ``arange(n)``
    are right on rank 0 only: on the other ranks each sample is paired with rank 0's rows (solo-learn's SimCLR loss,
    fixed by offsetting the mask by ``z.size(0) * rank``; open_clip's ``ClipLoss`` adds ``num_logits * rank`` to its
    labels when ``local_loss`` is set).  Not when both sides are gathered (a square global matrix), nor when the
    targets add a rank term."""
    from helpers.lint.python_rules import _call_name

    if "gather" not in lt.text.lower():
        return
    for fn in (n for n in lt.nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        gathered = _gathered_names(lt, fn)
        if not gathered:
            continue
        params = {a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]} - {"self", "cls"}
        local = {n.id for n in subtree(fn) if isinstance(n, ast.Name)} & params - gathered
        for _ in range(3):
            local |= {n.targets[0].id for n in subtree(fn) if isinstance(n, ast.Assign) and len(n.targets) == 1
                      and isinstance(n.targets[0], ast.Name) and n.targets[0].id not in gathered
                      and any(isinstance(x, ast.Name) and x.id in local for x in ast.walk(n.value))}
        mixed = {n.targets[0].id for n in subtree(fn) if isinstance(n, ast.Assign) and len(n.targets) == 1
                 and isinstance(n.targets[0], ast.Name) and any(_mixed(x, gathered, local) for x in ast.walk(n.value))}

        def is_mixed(e: ast.AST) -> bool:
            return any(_mixed(x, gathered, local) for x in ast.walk(e)) or \
                any(isinstance(x, ast.Name) and x.id in mixed for x in ast.walk(e))

        ranked = re.compile(r"rank|process_index")
        aranges = {n.targets[0].id: n for n in subtree(fn) if isinstance(n, ast.Assign) and len(n.targets) == 1
                   and isinstance(n.targets[0], ast.Name) and isinstance(n.value, ast.Call)
                   and _call_name(n.value)[1] == "arange" and not ranked.search(ast.unparse(n.value))}
        for name in list(aranges):  # a rank term added afterwards: labels = labels + rank * n
            if any(isinstance(n, (ast.Assign, ast.AugAssign)) and ranked.search(ast.unparse(n)) and
                   any(isinstance(t, ast.Name) and t.id == name for t in ([n.target] if isinstance(n, ast.AugAssign)
                                                                         else n.targets)) for n in subtree(fn)):
                aranges.pop(name)
        for c in (n for n in subtree(fn) if isinstance(n, ast.Call)):
            recv, name = _call_name(c)
            if name == "fill_diagonal_" and isinstance(c.func, ast.Attribute) and is_mixed(c.func.value) and \
                    not ranked.search(ast.unparse(c.func.value)):  # pos_mask[:, n * rank:].fill_diagonal_: offset
                recv_src = ast.unparse(c.func.value)
                what = f"{recv_src[:50] if isinstance(c.func.value, ast.Name) else f'({recv_src[:48]})'}.fill_diagonal_()"
            elif name == "cross_entropy" and len(c.args) >= 2 and is_mixed(c.args[0]) and \
                    isinstance(c.args[1], ast.Name) and c.args[1].id in aranges:
                what = f"targets {c.args[1].id} = {ast.unparse(aranges[c.args[1].id].value)[:40]}"
            else:
                continue
            lt.add("gathered-labels-without-rank-offset", "warning", c,
                   f"{what} on a matrix of this rank's rows against the gathered rows of every rank: each row's own "
                   "pair is at column rank * n + i, so the diagonal is its pair on rank 0 only (on the others the "
                   "samples are matched with rank 0's)", "offset by the rank: torch.arange(n) + rank * n (or mask the "
                   "diagonal shifted by rank * n)", _CLIP_LOSS)
            break


_TORCHMETRICS_IMPLEMENT = "https://lightning.ai/docs/torchmetrics/stable/pages/implement.html"
_JOINS = frozenset({"cat", "concat", "concatenate", "stack", "vstack", "hstack"})


def _chosen_by_loop(loop: ast.For, group: ast.AST) -> bool:
    """``group`` is picked by the loop's variable: ``for dp_comm in comms: comm = self.comms[dp_comm]`` (fastmoe)."""
    targets = {x.id for x in ast.walk(loop.target) if isinstance(x, ast.Name)}
    names = {x.id for x in ast.walk(group) if isinstance(x, ast.Name)}
    if names & targets:
        return True
    return any(isinstance(a, ast.Assign) and {t.id for t in a.targets if isinstance(t, ast.Name)} & names and
               {x.id for x in ast.walk(a.value) if isinstance(x, ast.Name)} & targets
               for st in loop.body for a in subtree(st))


_ROOTED = {"broadcast": ("src", 1), "reduce": ("dst", 1), "scatter": ("src", 2), "gather": ("dst", 2),
           "broadcast_object_list": ("src", 1), "scatter_object_list": ("src", 2), "gather_object": ("dst", 2)}
"""Collectives with a root, the keyword that names it and its position: the root is a rank of the default group."""


def rule_group_root_as_group_rank(lt: PythonLinter) -> None:
    """``dist.broadcast(t, 0, group=comm)``: the root of a rooted collective is "Source rank on global process group
    (regardless of group argument)" (:data:`_COLL`, ``src`` / ``dst``), so a constant root given with a subgroup is
    global rank 0 for every group: the groups that do not hold rank 0 raise "Global rank 0 is not part of group" or
    hang (laekov/fastmoe's DistributedGroupedDataParallel broadcast each data-parallel group from 0).  Not for
    ``group=None`` / ``WORLD``; a root computed per group (``get_global_rank(group, 0)``, Megatron's
    ``get_..._src_rank()``) is not a constant; only for a group that is one of several (chosen in a loop, a device
    mesh's dimension, a tensor/pipeline/data/expert-parallel group by its name), not one spanning the job."""
    from helpers.lint.python_rules import _call_name

    if "group" not in lt.text:
        return
    for c in lt._calls():
        recv, name = _call_name(c)
        if name not in _ROOTED or not lt.collective_name(c):
            continue
        group = kwarg(c, "group")
        if group is None or isinstance(group, ast.Constant) or re.search(r"WORLD|world", ast.unparse(group)):
            continue
        fn = lt._enclosing_function(c)
        if isinstance(group, ast.Name) and isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = fn.args.args + fn.args.kwonlyargs
            defaults = dict(zip([a.arg for a in fn.args.args][::-1], fn.args.defaults[::-1]))
            defaults.update({a.arg: d for a, d in zip(fn.args.kwonlyargs, fn.args.kw_defaults) if d is not None})
            if group.id in {a.arg for a in args} and (group.id not in defaults or re.search(
                    r"WORLD|None", ast.unparse(defaults[group.id]))):
                continue  # a helper's group parameter (fairchem's gather_objects(group=dist.group.WORLD)): its callers
                # decide, and with the default the root is right
        text = ast.unparse(group)
        in_loop = any(_chosen_by_loop(a, group) for a in ancestors(lt, c) if isinstance(a, ast.For))
        if not (in_loop or re.search(r"mesh|get_group\(|(?:^|_)(?:tp|pp|dp|cp|ep|sp|expert|tensor|pipeline|data|"
                                     r"model)(?:_|$)", text, re.I)):
            continue  # one group that spans the job (a DDP module's process_group): its root 0 is a member
        key, pos = _ROOTED[name]
        root = kwarg(c, key) if kwarg(c, key) is not None else (c.args[pos] if len(c.args) > pos else None)
        if not (isinstance(root, ast.Constant) and isinstance(root.value, int)):
            continue
        lt.add("wrong-collective-src-rank", "warning", c,
               f"{ast.unparse(c)[:70]} names {key}={root.value} with group={ast.unparse(group)[:30]}: {key} is a rank of "
               f"the default group whatever the group, so every group is told global rank {root.value}, which only "
               "one group holds (the others: 'Global rank ... is not part of group', or a hang)",
               f"{key}=dist.get_global_rank({ast.unparse(group)[:30]}, {root.value}) (or group_{key}={root.value}, "
               "a rank within the group, on a torch that has it)", _COLL)


def rule_strided_shard_gathered_rank_major(lt: PythonLinter) -> None:
    """``mine = items[rank::world_size]`` (rank r takes items r, r+W, r+2W...), each rank's results all-gathered and
    joined rank after rank (``torch.cat(gathered)``) and cut to ``len(items)``: all_gather returns the ranks' tensors
    in rank order (:data:`_COLL`), so the joined list holds rank 0's items 0, W, 2W... first: result i is not item i,
    and the cut keeps the padding of the short ranks while it drops the last ranks' real results
    (ZFTurbo/Music-Source-Separation-Training's valid_multi_gpu).  Interleave back instead
    (``torch.stack(gathered, 1).flatten()``) or shard contiguously."""
    if "::" not in lt.text:
        return
    for fn in (n for n in lt.nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        strided: dict[str, int] = {}
        for n in subtree(fn):
            if isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Slice) and n.slice.step is not None and \
                    n.slice.lower is not None and n.slice.upper is None and lt.taint.is_rank(n.slice.lower) and \
                    re.search(r"world|size|num_replicas|nprocs", ast.unparse(n.slice.step)) and \
                    isinstance(n.value, ast.Name):
                strided[n.value.id] = n.lineno
        if not strided:
            continue
        for n in subtree(fn):
            if not (isinstance(n, ast.Subscript) and isinstance(n.slice, ast.Slice) and n.slice.lower is None and
                    isinstance(n.slice.upper, ast.Call) and ast.unparse(n.slice.upper.func) == "len" and
                    n.slice.upper.args and isinstance(n.slice.upper.args[0], ast.Name) and
                    n.slice.upper.args[0].id in strided):
                continue
            joined = any(isinstance(c, ast.Call) and ast.unparse(c.func).split(".")[-1] in ("cat", "concatenate",
                                                                                          "hstack", "chain")
                         for c in ast.walk(n.value))
            if not joined:
                continue
            src = n.slice.upper.args[0].id
            lt.add("gather-order-differs", "warning", n,
                   f"{ast.unparse(n)[:70]}: each rank took {src}[rank::world_size] (line {strided[src]}), and the "
                   "gathered results are joined rank after rank: result i is not item i, and the cut to "
                   f"len({src}) keeps the short ranks' padding and drops the last ranks' real results",
                   "interleave back (torch.stack(gathered, dim=1).flatten()) or shard contiguously "
                   "(items[rank * n:(rank + 1) * n])", _COLL)
            break


def rule_metric_list_state_after_sync(lt: PythonLinter) -> None:
    """A torchmetrics ``Metric`` whose list state (``add_state("preds", default=[], dist_reduce_fx="cat")``) is
    joined in ``compute()`` as a list (``torch.cat(self.preds)``): when several processes run, ``compute()`` first
    syncs the states, and the sync gathers every process's list and applies the reduction, ``dim_zero_cat``, so the
    state is then one Tensor, not a list (torchmetrics/metric.py ``_sync_dist``), and ``torch.cat(tensor)`` raises
    "TypeError: cat(): argument 'tensors' (position 1) must be tuple of Tensors, not Tensor" (seen here with
    torchmetrics 1.x on two gloo processes); on one process nothing syncs and it works.  Torchmetrics' guide reads list
    states through ``dim_zero_cat``, which takes either (:data:`_TORCHMETRICS_IMPLEMENT`; chemprop/chemprop#1131)."""
    from helpers.lint.python_rules import _call_name

    if "add_state" not in lt.text or "compute" not in lt.text:
        return
    for cls in (n for n in lt.nodes if isinstance(n, ast.ClassDef)):
        lists: dict[str, int] = {}
        for c in (n for n in ast.walk(cls) if isinstance(n, ast.Call) and _call_name(n)[1] == "add_state"):
            name = c.args[0] if c.args else kwarg(c, "name")
            default = c.args[1] if len(c.args) > 1 else kwarg(c, "default")
            fx = c.args[2] if len(c.args) > 2 else kwarg(c, "dist_reduce_fx")
            if isinstance(name, ast.Constant) and isinstance(default, ast.List) and not default.elts and \
                    (isinstance(fx, ast.Constant) and fx.value == "cat" or
                     fx is not None and ast.unparse(fx).endswith("dim_zero_cat")):
                lists[name.value] = c.lineno
        compute = method_named(cls, "compute")
        if not lists or compute is None:
            continue
        for c in (n for n in ast.walk(compute) if isinstance(n, ast.Call)):
            recv, name = _call_name(c)
            arg = c.args[0] if c.args else kwarg(c, "tensors")
            if name not in _JOINS or recv not in ("torch", "np", "numpy") or not (
                    isinstance(arg, ast.Attribute) and ast.unparse(arg.value) == "self" and arg.attr in lists):
                continue
            lt.add("metric-state-reduce", "error", c,
                   f"{ast.unparse(c)[:50]} treats the list state '{arg.attr}' (add_state at line {lists[arg.attr]}, "
                   "dist_reduce_fx='cat') as a list: under several processes compute() syncs it first and the "
                   f"gathered lists are concatenated into one Tensor, so {recv}.{name} raises 'TypeError: ... must be "
                   "tuple of Tensors, not Tensor' (one process: no sync, no error)",
                   f"from torchmetrics.utilities import dim_zero_cat; dim_zero_cat(self.{arg.attr}) (takes the list "
                   "or the synced tensor)", _TORCHMETRICS_IMPLEMENT)
            break


_OBJECT_COLLECTIVES = {"all_gather_object": 1, "gather_object": 0, "broadcast_object_list": 0,
                       "scatter_object_list": 1, "send_object_list": 0}
"""The object collectives of torch.distributed and the position of the object (or list of objects) they pickle."""


def rule_object_collective_unpicklable(lt: PythonLinter) -> None:
    """``object-collective-unpicklable``: an object collective given a value that holds a ``lambda``
    (``defaultdict(lambda: {...})``): the object collectives pickle what they send ("uses pickle module implicitly",
    "obj (Any) - Pickable Python object", :data:`_COLL`), and pickle cannot serialise a lambda ("Can't pickle
    <function <lambda>>"), so the gather fails on every rank (allenai/olmocr's reward statistics).  The value is the
    argument itself, or what the file assigns to that name or ``self`` attribute."""
    from helpers.lint.python_rules import _call_name

    if "_object" not in lt.text or "lambda" not in lt.text:
        return
    for c in lt._calls():
        name = _call_name(c)[1]
        at = _OBJECT_COLLECTIVES.get(name)
        if at is None or len(c.args) <= at:
            continue
        obj = c.args[at]
        key = ast.unparse(obj)
        values = [obj] + [n.value for n in lt.nodes if isinstance(n, ast.Assign) and
                          any(ast.unparse(t) == key for t in n.targets)]
        lam = next((x for v in values for x in ast.walk(v) if isinstance(x, ast.Lambda)), None)
        if lam is None:
            continue
        lt.add("object-collective-unpicklable", "error", c,
               f"{name}(...) pickles {key}, which holds a lambda (line {lam.lineno}: "
               f"{ast.unparse(lt.parents.get(lam, lam))[:40]}): pickle cannot serialise it, so the collective raises "
               "on every rank", "send plain data: convert it first (json-like dicts, dict(d) of a defaultdict, or a "
               "named function in place of the lambda)", _COLL)


def rule_bucket_by_python_type(lt: PythonLinter) -> None:
    """``bucket-by-python-type``: gradients grouped for a flattened all-reduce by ``type(param.data)`` (the apex-era
    idiom of tacotron2's ``apply_gradient_allreduce``): since PyTorch 0.4 ``type()`` of any tensor is
    ``torch.Tensor`` whatever its dtype or device ("the type() of a Tensor no longer reflects the data type. Use
    isinstance() or x.type() instead", the 0.4 migration guide,
    https://pytorch.org/blog/pytorch-0_4_0-migration-guide/), so fp16 and fp32 gradients land in one bucket and
    ``_flatten_dense_tensors`` / ``torch.cat`` of mixed dtypes fails (or silently casts).  Reported where the function
    that builds the buckets all-reduces."""
    from helpers.lint.python_rules import _call_name

    if "type(" not in lt.text or "all_reduce" not in lt.text:
        return
    for fn in (n for n in lt.nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        calls = [c for c in subtree(fn) if isinstance(c, ast.Call)]
        if not any(_call_name(c)[1] == "all_reduce" for c in calls):
            continue
        hit = next((c for c in calls if isinstance(c.func, ast.Name) and c.func.id == "type" and len(c.args) == 1
                    and isinstance(c.args[0], ast.Attribute) and c.args[0].attr in ("data", "grad")), None)
        if hit is None:
            continue
        lt.add("bucket-by-python-type", "warning", hit,
               f"{ast.unparse(hit)} is torch.Tensor for every tensor (PyTorch 0.4 and later): the buckets it keys "
               "mix fp16 and fp32 gradients, and flattening them for the all-reduce fails or casts",
               f"key the buckets by {ast.unparse(hit.args[0])}.dtype (or .type(), the string with the dtype)",
               "https://pytorch.org/blog/pytorch-0_4_0-migration-guide/")


_RANK_FUNCS = frozenset({"get_rank", "get_world_size", "get_local_rank", "get_node_local_rank", "get_global_rank",
                         "is_initialized", "is_available"})
"""torch.distributed's functions that answer a rank, a size or a state only when called (Accelerate's
``is_main_process`` is a property, and a local ``is_main_process`` is usually a bool: neither is here)."""


def rule_rank_function_not_called(lt: PythonLinter) -> None:
    """``rank-function-not-called``: ``if dist.get_rank == 0:`` -- the function itself compared, not its result: a
    function object never equals a number, so the test is always False (and ``if dist.is_initialized:`` always True:
    a function is truthy, https://docs.python.org/3/library/stdtypes.html#truth-value-testing); the rank-0 branch
    never runs on any rank (starVLA's frozen-modules report)."""
    if not re.search(r"\b(?:" + "|".join(_RANK_FUNCS) + r")\b(?!\s*\()", lt.text):
        return

    def bare(e: ast.AST) -> bool:  # torch.distributed's function by its module (dist.get_rank) or imported name
        if isinstance(e, ast.Attribute):
            recv = ast.unparse(e.value)
            ours = recv in ("dist", "torch.distributed") or lt.import_origins.get(recv, "") == "torch.distributed"
        elif isinstance(e, ast.Name):
            ours = lt.import_origins.get(e.id, "").startswith("torch.distributed.")
        else:
            return False
        name = e.attr if isinstance(e, ast.Attribute) else e.id  # type: ignore[union-attr]
        return ours and name in _RANK_FUNCS and not (isinstance(lt.parents.get(e), ast.Call) and
                                                     lt.parents[e].func is e)  # type: ignore[attr-defined]

    for node in lt.nodes:
        hit = None
        if isinstance(node, ast.Compare) and any(isinstance(c, ast.Constant) and isinstance(c.value, int)
                                                 for c in [node.left, *node.comparators]):
            hit = next((e for e in [node.left, *node.comparators] if bare(e)), None)
        elif isinstance(node, (ast.If, ast.IfExp, ast.While)):
            test = node.test.operand if isinstance(node.test, ast.UnaryOp) and isinstance(node.test.op, ast.Not) \
                else node.test
            hit = test if bare(test) else None
        if hit is None:
            continue
        lt.add("rank-function-not-called", "error", node,
               f"{ast.unparse(hit)} is the function, not its result (no parentheses): "
               f"`{ast.unparse(getattr(node, 'test', node))[:50]}` is the same on every rank and never what it means",
               f"call it: {ast.unparse(hit)}()", "https://docs.python.org/3/library/stdtypes.html#truth-value-testing")


def rule_allreduce_accumulated_twice(lt: PythonLinter) -> None:
    """``allreduce-accumulated-twice``: a loop all-reduces each batch's value and adds it to a running total, and
    the total is all-reduced again after the loop (THUDM/GLM's LM evaluation): ``all_reduce`` sums over the group
    ("the final result ... will be in tensor", :data:`_COLL`), so the per-batch sums already hold every rank's share
    and the second reduction multiplies the result by the world size."""
    from helpers.lint.python_rules import _call_name

    if lt.text.count("all_reduce") < 2:
        return
    for loop in (n for n in lt.nodes if isinstance(n, (ast.For, ast.While))):
        reduced = {c.args[0].id for c in subtree(loop) if isinstance(c, ast.Call) and _call_name(c)[1] == "all_reduce"
                   and c.args and isinstance(c.args[0], ast.Name)}
        if not reduced:
            continue
        totals = {a.target.id for a in subtree(loop) if isinstance(a, ast.AugAssign) and isinstance(a.op, ast.Add)
                  and isinstance(a.target, ast.Name) and any(isinstance(x, ast.Name) and x.id in reduced
                                                              for x in ast.walk(a.value))}
        if not totals:
            continue
        fn = lt._enclosing_function(loop) or lt.tree
        end = getattr(loop, "end_lineno", loop.lineno)
        carriers = set(totals)
        for a in sorted((n for n in subtree(fn) if isinstance(n, ast.Assign) and n.lineno > end), key=lambda n: n.lineno):
            if any(isinstance(x, ast.Name) and x.id in carriers for x in ast.walk(a.value)):
                carriers.update(t.id for t in a.targets if isinstance(t, ast.Name))
        again = next((c for c in subtree(fn) if isinstance(c, ast.Call) and c.lineno > end and
                      _call_name(c)[1] == "all_reduce" and c.args and isinstance(c.args[0], ast.Name) and
                      c.args[0].id in carriers), None)
        if again is None:
            continue
        lt.add("allreduce-accumulated-twice", "error", again,
               f"{ast.unparse(again)[:60]} reduces totals built from {', '.join(sorted(totals))}, which the loop "
               f"(line {loop.lineno}) already adds up from all-reduced values: every rank's share is counted world-size "
               "times", "reduce once: either each batch's value inside the loop or the totals after it", _COLL)


__all__ = ["rule_nonfinite_loss_break", "rule_collective_helper_unguarded", "TORCH_DISTRIBUTED_NAMES", "rule_allreduce_accumulated_twice", "rule_rank_function_not_called", "rule_bucket_by_python_type", "rule_object_collective_unpicklable", "collect_cpu_tensor_facts", "rule_allreduce_sum_not_averaged", "rule_barrier_every_step", "rule_collective_in_filesystem_branch", "rule_collective_in_sampler", "rule_collective_result_discarded", "rule_collective_under_poll", "rule_collective_same_tensor_twice", "rule_distributed_api_unknown", "rule_exception_skips_collective", "rule_gather_not_for_metrics", "rule_gather_variable_shape", "rule_gathered_labels_without_rank_offset", "rule_group_root_as_group_rank", "rule_strided_shard_gathered_rank_major", "rule_init_contract", "rule_local_used_after_gather", "rule_metric_list_state_after_sync", "rule_nccl_cpu_tensor", "rule_undefined_distributed_flag", "torch_distributed_names"]
