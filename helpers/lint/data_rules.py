"""Contract rules on data and randomness across ranks: ``DistributedSampler`` with ``shuffle``, loaders that every rank
reads whole, seeds that are the same (or differ) where they must not, schedules sized from the unsharded dataset,
resumes that skip batches each epoch (https://docs.pytorch.org/docs/stable/data.html#torch.utils.data.distributed.DistributedSampler,
https://huggingface.co/docs/accelerate/package_reference/accelerator).  Run by :func:`helpers.lint.contract_rules.run`."""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

from helpers.lint.contract_ast import ancestors, const, kwarg, last_assignment, method_named, statement_blocks, subtree, under_if
from helpers.lint.contracts import _DATA, _SAMPLER
from helpers.lint.wrappers import accelerator_prepare, assign_targets

if TYPE_CHECKING:
    from helpers.lint.python_rules import PythonLinter


_LOADER_POSITIONS = ("dataset", "batch_size", "shuffle", "sampler")
"""The first positional parameters of ``torch.utils.data.DataLoader`` (``DataLoader(dataset, batch_size=1,
shuffle=None, sampler=None, ...)``, https://docs.pytorch.org/docs/stable/data.html#torch.utils.data.DataLoader)."""


def _loader_arg(c: ast.Call, name: str) -> ast.AST | None:
    """The value ``DataLoader(...)`` gets for parameter ``name``, by keyword or by position."""
    got = kwarg(c, name)
    pos = _LOADER_POSITIONS.index(name)
    if got is None and len(c.args) > pos and not any(isinstance(a, ast.Starred) for a in c.args[:pos + 1]):
        got = c.args[pos]
    return got


def _assume(test: ast.AST, value: bool, known: dict[str, bool]) -> None:
    """Record in ``known`` (source -> truth) what ``test`` being ``value`` says: ``not x`` false says x, ``a and b``
    true says both."""
    known[ast.unparse(test)] = value
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        _assume(test.operand, not value, known)
    elif isinstance(test, ast.BoolOp) and (isinstance(test.op, ast.And) and value or
                                           isinstance(test.op, ast.Or) and not value):
        for v in test.values:
            _assume(v, value, known)


def _truth(expr: ast.AST, known: dict[str, bool], values: dict[str, ast.AST], depth: int = 0) -> bool | None:
    """Whether ``expr`` is true given ``known`` (three-valued: None when it cannot be told), a name read through its
    assignment in ``values``; ``not``, ``and``, ``or``, conditional expressions and constants.  Own code: the question
    is asked of source texts (``args.distributed`` known true where the sampler is made), which a symbolic-logic
    package would need translating into its own symbols first; the forms a shuffle flag takes are these few."""
    key = ast.unparse(expr)
    if key in known:
        return known[key]
    if isinstance(expr, ast.Constant):
        return bool(expr.value)
    if isinstance(expr, ast.Name) and expr.id in values and depth < 3:
        return _truth(values[expr.id], known, values, depth + 1)
    if isinstance(expr, ast.UnaryOp) and isinstance(expr.op, ast.Not):
        got = _truth(expr.operand, known, values, depth)
        return None if got is None else not got
    if isinstance(expr, ast.BoolOp):
        parts = [_truth(v, known, values, depth) for v in expr.values]
        stop = isinstance(expr.op, ast.Or)  # the value that decides: True for `or`, False for `and`
        return stop if stop in parts else (not stop if all(p is not None for p in parts) else None)
    if isinstance(expr, ast.IfExp):
        test = _truth(expr.test, known, values, depth)
        if test is not None:
            return _truth(expr.body if test else expr.orelse, known, values, depth)
        body, orelse = _truth(expr.body, known, values, depth), _truth(expr.orelse, known, values, depth)
        return body if body == orelse else None
    return None


def _sampler_sometimes(lt: PythonLinter, c: ast.Call, sampler: ast.AST, shuffle: ast.AST) -> str | None:
    """A loader given ``shuffle=<expression>`` and ``sampler=<name>`` where the name is bound to a sampler on some path
    (``sampler = None; if ddp: sampler = DistributedSampler(ds)``) and the shuffle expression does not look at the
    sampler (``shuffle=(sampler is None)`` does), nor at what decides that the sampler is made (``shuffle=False if
    args.distributed else True`` beside ``if args.distributed: sampler = ...``), nor is set False beside it: the run
    where both hold stops with the ValueError.  Returns the sampler's constructor, else None."""
    from helpers.lint.python_rules import _call_name

    scope = lt._enclosing_function(c) or lt.tree
    if isinstance(sampler, ast.Call):
        made = [sampler]
        name = None
    elif isinstance(sampler, ast.Name):
        name = sampler.id
        made = [n.value for n in subtree(scope) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and
                any(isinstance(t, ast.Name) and t.id == name for t in n.targets)]
    else:
        return None
    samplers = [m for m in made if _call_name(m)[1].endswith("Sampler") and _call_name(m)[1] != "BatchSampler"]
    if not samplers or isinstance(shuffle, ast.Constant):
        return None
    shuffle_names = {n.id for n in ast.walk(shuffle) if isinstance(n, ast.Name)}
    if name and name in shuffle_names:
        return None  # shuffle=(sampler is None), shuffle=shuffle and sampler is None

    sets = [(t.id, n.value) for n in subtree(scope) if isinstance(n, ast.Assign)
            for t in n.targets if isinstance(t, ast.Name) and t.id in shuffle_names]
    values = {k: v for k, v in sets if [x for x, _ in sets].count(k) == 1}  # names bound once: read through
    ctor = None
    for m in samplers:  # each place a sampler is made, with what holds there (`if args.distributed:`, `if not x:`)
        known: dict[str, bool] = {}
        child, p = m, lt.parents.get(m)
        while p is not None and p is not scope:
            if isinstance(p, ast.If):
                _assume(p.test, child in p.body, known)
            child, p = p, lt.parents.get(p)
        holds = _truth(shuffle, known, values)
        if holds is False:
            continue  # shuffle=False if args.distributed else True; shuffle=not group_by_length: never both
        if holds is None and any(ast.unparse(n) in known for v in [shuffle, *values.values()] for n in ast.walk(v)):
            continue  # it asks what decides the sampler in a way not followed here: left alone
        ctor = _call_name(m)[1]
        break
    if ctor is None:
        return None

    def beside_sampler(stmt: ast.stmt) -> bool:  # the statement list holding it also makes the sampler
        parent = lt.parents.get(stmt)
        blocks = [getattr(parent, f) for f in ("body", "orelse", "finalbody") if isinstance(getattr(parent, f, None), list)]
        block = next((b for b in blocks if stmt in b), [])
        return any(isinstance(x, ast.Assign) and isinstance(x.value, ast.Call) and
                   _call_name(x.value)[1].endswith("Sampler") for x in block)

    for n in subtree(scope):  # how the shuffle names are set: from the sampler, or False where the sampler is made
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id in shuffle_names for t in n.targets):
            if (name and any(isinstance(x, ast.Name) and x.id == name for x in ast.walk(n.value))) or \
                    (isinstance(n.value, ast.Constant) and not n.value.value and beside_sampler(n)):
                return None
    return ctor


def rule_dataloader_sampler_and_shuffle(lt: PythonLinter) -> None:
    """DataLoader(sampler=..., shuffle=True): 'sampler option is mutually exclusive with shuffle' (ValueError), by
    keyword or by position (``DataLoader(dataset, batch_size, shuffle, sampler=sampler)``); also a shuffle expression
    (``shuffle=is_train``) beside a name bound to a sampler on some path (:func:`_sampler_sometimes`: SevenNet,
    fastMRI's data module, both under DDP only)."""
    from helpers.lint.python_rules import _call_name

    for c in lt._calls():
        if _call_name(c)[1] != "DataLoader":
            continue
        sampler, shuffle = _loader_arg(c, "sampler"), _loader_arg(c, "shuffle")
        if sampler is None or isinstance(sampler, ast.Constant):
            continue  # no sampler, or sampler=None
        if const(shuffle) is True:
            lt.add("dataloader-sampler-and-shuffle", "error", c,
                   "DataLoader(sampler=..., shuffle=True): 'ValueError: sampler option is mutually exclusive with "
                   "shuffle' (the DistributedSampler shuffles)", "drop shuffle=True; pass shuffle= to the sampler",
                   _DATA + "#torch.utils.data.DataLoader")
        elif shuffle is not None and (ctor := _sampler_sometimes(lt, c, sampler, shuffle)):
            lt.add("dataloader-sampler-and-shuffle", "error", c,
                   f"DataLoader(shuffle={ast.unparse(shuffle)[:30]}, sampler={ast.unparse(sampler)[:30]}): when the "
                   f"{ctor} is made and {ast.unparse(shuffle)[:30]} is true (training under several processes) it "
                   "stops with 'ValueError: sampler option is mutually exclusive with shuffle'",
                   f"shuffle=({ast.unparse(shuffle)[:30]}) and {ast.unparse(sampler)[:30]} is None, and pass the "
                   "shuffle to the sampler", _DATA + "#torch.utils.data.DataLoader")


_SEED_CALLS = {"seed_everything", "manual_seed", "set_seed", "seed", "manual_seed_all"}
_WEIGHTS_LOADED = {"load_state_dict", "from_pretrained", "load_checkpoint", "load_model", "load"}
_FSDP_SYNC = "https://docs.pytorch.org/docs/stable/fsdp.html"


def _seeding_functions(lt: PythonLinter) -> set[str]:
    """Functions of this file that seed a generator from one of their parameters (``def random_seed(seed, rank):
    torch.manual_seed(seed + rank)``): a call of one with a rank argument seeds per rank."""
    from helpers.lint.python_rules import _call_name

    out: set[str] = set()
    for name, fn in lt.functions.items():
        params = {a.arg for a in fn.args.args}
        if any(isinstance(c, ast.Call) and _call_name(c)[1] in _SEED_CALLS and c.args and
               any(isinstance(n, ast.Name) and n.id in params for n in ast.walk(c.args[0])) for c in subtree(fn)):
            out.add(name)
    return out


def rule_rank_seed_before_model_init(lt: PythonLinter) -> None:
    """A seed that differs per rank (``seed_everything(1337 + fabric.global_rank)``) set before the model is built, in a
    file that shards the model with FSDP.  DDP broadcasts rank 0's parameters when it wraps a module; FSDP does not
    unless ``sync_module_states=True`` ("broadcast module parameters and buffers from rank 0", :data:`_FSDP_SYNC`):
    each rank keeps the shard of its own random initialisation, so the assembled model mixes N different ones.  The
    model is built after the seed in the same function (an ``init_module`` block, or ``model = ...(...)``)."""
    from helpers.lint.python_rules import _call_name

    if not re.search(r"FSDP|FullyShardedDataParallel|fully_shard|strategy\s*=\s*['\"]fsdp", lt.text) or \
            re.search(r"sync_module_states\s*=\s*True", lt.text):
        return
    seeders = _seeding_functions(lt)
    meta = bool(re.search(r"""device\(\s*['"]meta['"]|['"]meta['"]\s+if\b|init_empty_weights|device=['"]meta['"]""",
                          lt.text))
    for c in lt._calls():
        name = _call_name(c)[1]
        if name in _SEED_CALLS:
            if not c.args or not lt.taint.is_rank(c.args[0]):
                continue
        elif not (name in seeders and any(lt.taint.is_rank(a) for a in [*c.args, *(k.value for k in c.keywords)])):
            continue
        fn = lt._enclosing_function(c) or lt.tree
        built = None
        for n in subtree(fn):
            if getattr(n, "lineno", 0) <= c.lineno:
                continue
            if meta and isinstance(n, ast.Call) and _call_name(n)[1] in ("FSDP", "FullyShardedDataParallel",
                                                                          "fully_shard"):
                built = n  # built on the meta device: FSDP materialises and initialises the parameters when it wraps
                break
            if isinstance(n, ast.With) and any("init_module" in ast.unparse(i.context_expr) for i in n.items) or \
                    isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and any(
                        isinstance(t, ast.Name) and "model" in t.id.lower() for t in n.targets) and \
                    isinstance(n.value.func, ast.Name) and n.value.func.id[:1].isupper() and \
                    n.value.func.id not in ("FSDP", "DDP", "FullyShardedDataParallel", "DistributedDataParallel"):
                built = n
                break
        if built is not None and any(
                isinstance(n, ast.Call) and (_call_name(n)[1] in _SEED_CALLS or _call_name(n)[1] in seeders)
                and c.lineno < n.lineno <= built.lineno
                and not any(lt.taint.is_rank(a) for a in [*n.args, *(k.value for k in n.keywords)])
                for n in subtree(fn)):
            continue  # reseeded alike on every rank before the build (open_lm: `random_seed(args.seed, rank=0)`)
        if built is None or any(isinstance(n, ast.Call) and _call_name(n)[1] in _WEIGHTS_LOADED and
                                getattr(n, "lineno", 0) > built.lineno and not under_if(lt, n, fn)
                                for n in subtree(fn)):
            continue  # no model built here, or its initialisation is always replaced by loaded weights
        lt.add("rank-seed-before-model-init", "warning", c,
               f"{ast.unparse(c)[:60]} gives each rank its own seed before the model is built (line {built.lineno}) "
               "and FSDP shards it without sync_module_states: every rank keeps its shard of a different random "
               "initialisation", "seed the same on every rank before building the model, then reseed per rank "
               "(seed + rank) for data and dropout; or pass sync_module_states=True", _FSDP_SYNC)


def rule_same_seed_every_rank(lt: PythonLinter) -> None:
    """A DataLoader over a ``DistributedSampler`` given ``generator=g`` with ``g.manual_seed(<no rank>)``: the workers'
    seeds come from that generator ("base_seed is a long generated by main process using its RNG ... or a specified
    generator", https://docs.pytorch.org/docs/stable/data.html#randomness-in-multi-process-data-loading), so every rank's
    workers draw the same random stream and apply the same augmentations to their different samples (Lightning seeds
    workers from the global rank for this reason: ``pl_worker_init_function``)."""
    from helpers.lint.python_rules import _call_name

    if "DistributedSampler" not in lt.text or "manual_seed" not in lt.text:
        return
    for c in lt._calls():
        kws = {k.arg: k.value for k in c.keywords if k.arg}
        gen, sampler = kws.get("generator"), kws.get("sampler")
        if not isinstance(gen, ast.Name) or sampler is None:
            continue
        scope = lt._enclosing_function(c) or lt.tree
        if not _distributed_sampler(lt, sampler, scope):
            continue
        for n in subtree(scope):
            if not (isinstance(n, ast.Call) and _call_name(n)[1] == "manual_seed" and n.args):
                continue
            target = n.func.value if isinstance(n.func, ast.Attribute) else None
            assigned = isinstance(lt.parents.get(n), ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == gen.id for t in lt.parents[n].targets)  # type: ignore[attr-defined]
            if (isinstance(target, ast.Name) and target.id == gen.id or assigned) and not lt.taint.is_rank(n.args[0]):
                lt.add("same-seed-every-rank", "warning", n,
                       f"{ast.unparse(n)[:50]} seeds the DataLoader generator (line {c.lineno}) the same on every rank: "
                       "the workers' seeds derive from it, so all ranks apply the same random augmentations to their "
                       "shards (less diversity than one GPU: the DDP accuracy drop of ultralytics/yolov5#9545)",
                       f"{ast.unparse(n.func)}(seed + rank) with the global rank",
                       "https://docs.pytorch.org/docs/stable/data.html#randomness-in-multi-process-data-loading")
                break


_PL_SEED = "https://lightning.ai/docs/pytorch/stable/api/lightning.pytorch.utilities.seed.html"
_PL_DISTRIBUTED = re.compile(r"DDPPlugin|DDPStrategy|DeepSpeedPlugin|DeepSpeedStrategy|FSDPStrategy|replace_sampler_ddp|"
                             r"(?:strategy|accelerator|distributed_backend|backend)\s*=\s*['\"](?:ddp|fsdp|deepspeed)")
"""A Lightning script that trains with several processes (``accelerator="ddp"`` / ``distributed_backend="ddp"``
were the spellings before Lightning 1.5's ``strategy=``; ``replace_sampler_ddp`` exists for DDP only)."""


def rule_seed_everything_without_workers(lt: PythonLinter) -> None:
    """``same-seed-every-rank`` for Lightning: ``seed_everything(seed)`` with the same seed on every rank and without
    ``workers=True``, in a script trained with a distributed strategy: every process starts from the same random
    state, and only ``workers=True`` makes Lightning give each DataLoader worker of each process its own seed ("derive
    unique seeds across all dataloader workers and processes for torch, numpy and stdlib random number generators",
    ``_PL_SEED``), so the ranks draw the same random crops and samples for their shards (aqlaboratory/openfold).  Not
    where the seed depends on the rank, nor where a ``worker_init_fn`` may seed the processes apart
    (:func:`_worker_seeds_own`), nor for ``fabric.seed_everything``
    (the Fabric scripts of the clean sets seed alike on purpose for the model's initialisation and read token shards
    with no random transform: a finding there would be true by the letter and of no consequence)."""
    if "seed_everything" not in lt.text or not _PL_DISTRIBUTED.search(lt.text) or _worker_seeds_own(lt):
        return
    for c in lt._calls():
        if ast.unparse(c.func).split(".")[-1] != "seed_everything" or "fabric" in ast.unparse(c.func).lower():
            continue  # (Fabric scripts seed alike on purpose for the model's init: litgpt, lit-llama; not read)
        workers = next((k.value for k in c.keywords if k.arg == "workers"), None)
        if workers is not None and not (isinstance(workers, ast.Constant) and not workers.value):
            continue
        if any(lt.taint.is_rank(a) for a in [*c.args, *(k.value for k in c.keywords)]):
            continue
        lt.add("same-seed-every-rank", "warning", c,
               f"{ast.unparse(c)[:50]} seeds every rank alike and leaves the DataLoader workers' seeds to it: with "
               "a distributed strategy the ranks draw the same random augmentations and samples for their shards",
               f"{ast.unparse(c.func)}({''.join(ast.unparse(a) + ', ' for a in c.args)}workers=True)", _PL_SEED)
        return


def _worker_seeds_own(lt: PythonLinter) -> bool:
    """The file gives its loaders a ``worker_init_fn`` that may seed each process's workers apart: one it imports (not
    read), or one of its own that reads a rank.  One of its own that seeds only from ``get_worker_info().seed``
    does not: that seed is the main process's ``base_seed + worker_id`` ("base_seed is a long generated by main
    process using its RNG", https://docs.pytorch.org/docs/stable/data.html#randomness-in-multi-process-data-loading),
    the same on every rank that was seeded alike (facebookresearch/fastMRI#123)."""
    given = {ast.unparse(k.value) for n in lt.nodes if isinstance(n, ast.Call) for k in n.keywords
             if k.arg == "worker_init_fn"}
    own = {name: fn for name, fn in lt.functions.items() if "worker_init" in name or name in given}
    if any(g not in lt.functions and g != "None" for g in given):
        return True
    return any(re.search(r"rank|process_index|getpid", ast.unparse(fn)) for fn in own.values())


_STEP_KWARGS = ("num_training_steps", "total_steps", "T_max", "total_iters")


def _per_process(node: ast.AST) -> bool:
    """``node`` divides by the process count (``len(dl) / accelerator.num_processes``: the sharded length)."""
    return any(isinstance(n, ast.BinOp) and isinstance(n.op, (ast.Div, ast.FloorDiv)) and
               "num_processes" in ast.unparse(n.right) for n in ast.walk(node))


def _len_of_unprepared(lt: PythonLinter, stmt: ast.Assign, scope: ast.AST) -> None:
    """``self.train_dataloader = accelerator.prepare(train_dataloader)`` then ``total_steps = epochs *
    len(train_dataloader)``: the name still holds the unprepared loader, whose length counts every process's
    batches; each process iterates the prepared one, about ``1 / num_processes`` of it, so the step budget and the
    schedule built from it are ``num_processes`` times too long (CarperAI/trlx's SFT trainer).  Only a length that
    goes into a step count (an assignment to a name with ``step``, ``iters`` or ``total`` in it)."""
    from helpers.lint.python_rules import _call_name

    prep = stmt.value
    if len(stmt.targets) != 1 or not isinstance(prep, ast.Call):
        return
    target = stmt.targets[0]
    outs = target.elts if isinstance(target, ast.Tuple) else [target]
    if len(outs) != len(prep.args):
        return
    moved = {a.id: ast.unparse(o) for a, o in zip(prep.args, outs) if isinstance(a, ast.Name) and ast.unparse(o) != a.id
             and "loader" in a.id.lower()}
    for n in subtree(scope):
        if not (isinstance(n, ast.Assign) and n.lineno > prep.lineno and
                re.search(r"(?i)step|iters|total", " ".join(ast.unparse(x) for x in n.targets))):
            continue
        for c in (x for x in ast.walk(n.value) if isinstance(x, ast.Call) and _call_name(x)[1] == "len" and x.args):
            arg = c.args[0]
            if isinstance(arg, ast.Name) and arg.id in moved and not any(
                    isinstance(a, ast.Assign) and prep.lineno < a.lineno < n.lineno and
                    any(isinstance(x, ast.Name) and x.id == arg.id for x in a.targets) for a in subtree(scope)):
                lt.add("lr-steps-from-dataset-length", "warning", c,
                       f"len({arg.id}) is the unprepared loader's length: accelerator.prepare (line {prep.lineno}) "
                       f"returned the sharded one as {moved[arg.id]}, which each process iterates (about 1 / "
                       "num_processes of it), so this step count is num_processes times too large",
                       f"len({moved[arg.id]})", "https://huggingface.co/docs/accelerate/en/basic_tutorials/migration")
                return


def rule_lr_steps_from_dataset_length(lt: PythonLinter) -> None:
    """A scheduler length ``steps * accelerator.num_processes`` whose ``steps`` come from ``len(dataloader)`` before
    ``accelerator.prepare`` shards that dataloader.

    Two documented behaviours meet here: ``prepare`` shards a dataloader, so each process iterates about
    ``len / num_processes`` batches (https://huggingface.co/docs/accelerate/en/basic_tutorials/migration), and the
    prepared scheduler steps ``num_processes`` times per optimizer step (accelerate/scheduler.py
    ``AcceleratedScheduler.step``: "the training dataloader batch size was multiplied by num_processes, so we need to
    do num_processes steps per training step").  A length counted on the unsharded loader already holds every
    process's batches; multiplying it by ``num_processes`` counts them twice: the schedule is ``num_processes`` times
    too long and the learning rate never decays as set (huggingface/diffusers#8312).
    """
    from helpers.lint.python_rules import _call_name

    for stmt in lt.nodes:
        if accelerator_prepare(stmt):
            _len_of_unprepared(lt, stmt, lt._enclosing_function(stmt) or lt.tree)  # type: ignore[arg-type]
    if "num_processes" not in lt.text or ".prepare(" not in lt.text:
        return
    for prep in lt._calls():
        recv, name = _call_name(prep)
        if name != "prepare" or "accelerator" not in recv.lower():
            continue
        loaders = {a.id for a in prep.args if isinstance(a, ast.Name)}
        scope = lt._enclosing_function(prep) or lt.tree
        assigns: dict[str, list[ast.Assign | ast.AugAssign]] = {}
        for n in subtree(scope):
            if isinstance(n, (ast.Assign, ast.AugAssign)) and n.lineno < prep.lineno:
                for t in assign_targets(n):
                    assigns.setdefault(ast.unparse(t), []).append(n)

        def above(node: ast.AST, at: ast.AST) -> bool:  # node's block encloses at (it runs on every path to at)
            p = lt.parents.get(node)
            q: ast.AST | None = at
            while q is not None and q is not p:
                q = lt.parents.get(q)
            return q is not None

        def reaching(src: str, at: ast.AST) -> list[ast.AST]:
            """The assignments of ``src`` that can reach ``at``: above it, not in a branch that excludes it, and not
            overwritten on every path between (a later assignment whose block encloses ``at``)."""
            before = [a for a in assigns.get(src, ()) if a.lineno < at.lineno and not _exclusive(lt, a, at)]  # type: ignore[attr-defined]
            return [a for a in before if not any(a.lineno < b.lineno and above(b, at) for b in before)]  # type: ignore[attr-defined]

        def kind(expr: ast.AST, at: ast.AST, depth: int = 0) -> str:
            """"sharded" (divided by the process count), "whole" (counted on the unsharded loader), or ""."""
            if _per_process(expr):
                return "sharded"
            out = ""
            todo = [expr]
            while todo:
                n = todo.pop()
                if isinstance(n, ast.Call) and _call_name(n)[1] == "len" and n.args and \
                        isinstance(n.args[0], ast.Name) and n.args[0].id in loaders:
                    out = "whole"
                elif isinstance(n, (ast.Name, ast.Attribute)) and depth < 6:
                    for a in reaching(ast.unparse(n), at):
                        k = kind(a.value, a, depth + 1)  # type: ignore[attr-defined]
                        out = "whole" if k == "whole" else out
                else:
                    todo.extend(ast.iter_child_nodes(n))
            return out

        for c in (n for n in subtree(scope) if isinstance(n, ast.Call) and n.lineno < prep.lineno):
            for kw in c.keywords:
                if kw.arg not in _STEP_KWARGS:
                    continue
                values: list[tuple[ast.AST, ast.AST]] = [(kw.value, c)]
                if isinstance(kw.value, (ast.Name, ast.Attribute)):
                    values = [(a.value, a) for a in reaching(ast.unparse(kw.value), c)]  # type: ignore[attr-defined]
                if not any(isinstance(v, ast.BinOp) and isinstance(v.op, ast.Mult) and
                           any("num_processes" in ast.unparse(x) for x in (v.left, v.right)) and
                           any(kind(x, at) == "whole" for x in (v.left, v.right) if "num_processes" not in ast.unparse(x))
                           for v, at in values):
                    continue
                lt.add("lr-steps-from-dataset-length", "warning", c,
                       f"{kw.arg}={ast.unparse(kw.value)[:60]} counts steps on the dataloader before "
                       f"accelerator.prepare (line {prep.lineno}) shards it, then multiplies by num_processes: the "
                       "prepared scheduler already steps num_processes times per step, so the schedule is "
                       "num_processes times too long (the learning rate never decays as set)",
                       "count steps on the sharded length: ceil(len(loader) / accelerator.num_processes), then "
                       "multiply by num_processes (huggingface/diffusers#8312)",
                       "https://github.com/huggingface/accelerate/blob/main/src/accelerate/scheduler.py")


def rule_lr_steps_given_per_step(lt: PythonLinter, options: set[str] | None) -> None:
    """A scheduler handed to ``accelerator.prepare`` whose ``num_training_steps`` is an optimizer-step count the user
    gives (``args.max_train_steps``, an argparse option) with no ``num_processes`` in it: the prepared scheduler
    steps ``num_processes`` times per optimizer step (accelerate/scheduler.py ``AcceleratedScheduler.step``, unless
    ``split_batches=True`` or ``step_scheduler_with_optimizer=False``), so with N processes the warm-up and the decay
    end after 1/N of the run (huggingface/diffusers: the examples' schedulers were given
    ``max_train_steps * accelerator.num_processes``).  A count taken from the unsharded loader's length is right as it
    is (:func:`rule_lr_steps_from_dataset_length` checks that one); only the option's own path is wrong, so the
    finding names the option.  Not in a DeepSpeed script (``DummyScheduler`` / ``DummyOptim``): under DeepSpeed the
    prepared scheduler is a ``DeepSpeedSchedulerWrapper`` whose ``step`` does nothing and the engine steps the
    scheduler once per optimizer step (accelerate/utils/deepspeed.py)."""
    from helpers.lint.python_rules import _call_name

    if not options or ".prepare(" not in lt.text or "Accelerator(" not in lt.text or \
            re.search(r"DummyScheduler|DummyOptim", lt.text):
        return  # a DeepSpeed script: the engine steps the scheduler once per step (DeepSpeedSchedulerWrapper.step)
    for c in lt._calls():
        if _call_name(c)[1] == "Accelerator" and any(
                k.arg in ("split_batches", "step_scheduler_with_optimizer") or k.arg is None for k in c.keywords):
            return  # the scheduler steps once per optimizer step (or the settings are not visible)
    for prep in (n.value for n in lt.nodes if accelerator_prepare(n)):
        assert isinstance(prep, ast.Call)
        prepared = {a.id for a in prep.args if isinstance(a, ast.Name)}
        scope = lt._enclosing_function(prep) or lt.tree
        assigns = [n for n in subtree(scope) if isinstance(n, ast.Assign) and n.lineno < prep.lineno]
        for a in assigns:
            if not (isinstance(a.value, ast.Call) and any(isinstance(t, ast.Name) and t.id in prepared
                                                          for t in a.targets)):
                continue
            name = _call_name(a.value)[1]
            if not _builds_scheduler(name):
                continue
            steps = kwarg(a.value, "num_training_steps")
            if steps is None:
                continue
            sources = [steps]
            if isinstance(steps, ast.Name):
                sources = [b.value for b in assigns if any(isinstance(t, ast.Name) and t.id == steps.id
                                                            for t in b.targets)] or sources
            text = " ".join(ast.unparse(x) for x in sources)
            if re.search(r"num_processes|world_size|num_gpus|n_gpu", text):
                continue
            given = next((n for x in sources for n in ast.walk(x) if isinstance(n, ast.Attribute) and
                          isinstance(n.value, ast.Name) and n.value.id in ("args", "opt", "cfg", "config") and
                          "step" in n.attr and {f"--{n.attr}", f"--{n.attr.replace('_', '-')}"} & options), None)
            if given is None:
                continue
            lt.add("lr-steps-from-dataset-length", "warning", a.value,
                   f"num_training_steps={ast.unparse(steps)[:60]} counts optimizer steps from --{given.attr}, but the "
                   f"scheduler goes through accelerator.prepare (line {prep.lineno}), which steps it num_processes "
                   "times per optimizer step: with N processes (not under DeepSpeed, whose engine steps it once) the "
                   "schedule ends after 1/N of the run",
                   f"num_training_steps={ast.unparse(steps)[:40]} * accelerator.num_processes (and the warm-up too)",
                   "https://github.com/huggingface/accelerate/blob/main/src/accelerate/scheduler.py")


_ACCUMULATION_TEST = re.compile(r"%|(?i:accum|sync_gradients|update_freq|micro|grad_steps|gradient_steps)")
"""A test that decides accumulation (``(i + 1) % accum == 0``, ``is_accumulation_step``, ``sync_gradients``); not a
warm-up or freeze gate (BigVGAN's ``if steps >= a.freeze_step: optim_d.step()``, where the scheduler stepping on is
meant)."""


def rule_scheduler_outside_conditional_step(lt: PythonLinter) -> None:
    """``scheduler-steps-per-microbatch`` in a hand-written accumulation loop: the optimizer steps only in one branch
    of a loop body (``if is_accumulation_step: ... else: opt.step()``, ``if (i + 1) % accum == 0: opt.step()``) and a
    scheduler's ``step()`` sits in the same body outside that branch, so it steps on every micro-batch: the schedule
    runs accumulation-steps times too fast.  PyTorch's contract: "lr_scheduler.step() ... after optimizer's update"
    once per optimizer step (https://docs.pytorch.org/docs/stable/optim.html#how-to-adjust-learning-rate;
    deepglint/OneVision-Encoder#82).  Not a ``ReduceLROnPlateau`` (stepped with a metric) nor a call under its own
    test, nor an optimizer gated by something other than accumulation (:data:`_ACCUMULATION_TEST`)."""
    if "step()" not in lt.text:
        return
    for loop in (n for n in lt.nodes if isinstance(n, (ast.For, ast.While))):
        def steps(block: list[ast.stmt]) -> bool:  # an optimizer step: opt.step(), scaler.step(opt)
            return any(isinstance(c, ast.Call) and isinstance(c.func, ast.Attribute) and c.func.attr == "step"
                       and re.search(r"(?i)opt", ast.unparse(c)) for st in block for c in subtree(st))

        opt_if = next((st for st in loop.body if isinstance(st, ast.If) and steps(st.body) != steps(st.orelse)
                       and _ACCUMULATION_TEST.search(ast.unparse(st.test))),
                      None)  # one arm steps the optimizer, the other does not (both arms: amp or not, every pass)
        if opt_if is None:
            continue
        for stmt in loop.body[loop.body.index(opt_if) + 1:]:
            if not isinstance(stmt, ast.Expr) or not isinstance(stmt.value, ast.Call):
                continue
            c = stmt.value
            if isinstance(c.func, ast.Attribute) and c.func.attr == "step" and not c.args and \
                    re.search(r"(?i)sched", ast.unparse(c.func.value)):
                lt.add("scheduler-steps-per-microbatch", "warning", c,
                       f"{ast.unparse(c.func.value)}.step() runs on every pass of this loop, but the optimizer steps "
                       f"only under the test at line {opt_if.lineno}: the schedule advances once per micro-batch, "
                       "accumulation-steps times too fast",
                       f"step {ast.unparse(c.func.value)} right after the optimizer, in the same branch",
                       "https://docs.pytorch.org/docs/stable/optim.html#how-to-adjust-learning-rate")
                return


def _builds_scheduler(name: str) -> bool:
    """Whether a call of ``name`` builds a learning-rate schedule sized by ``num_training_steps``: transformers' /
    diffusers' ``get_scheduler`` and ``get_*_schedule_with_warmup``, and a project's own ``*schedule*`` builder.  The
    one test of the scheduler rules of this module."""
    return name == "get_scheduler" or "schedule" in name


def rule_lr_steps_times_world_size(lt: PythonLinter) -> None:
    """A scheduler sized ``steps * world_size`` (Accelerate's convention for its prepared scheduler, which steps
    ``num_processes`` times per optimizer step: accelerate/scheduler.py) in a script that does not use Accelerate:
    its scheduler steps once per optimizer step, so the warm-up and the decay last ``world_size`` times longer than the
    run and the learning rate never gets where it was set to go (hao-ai-lab/FastVideo's training pipeline)."""
    from helpers.lint.python_rules import _call_name

    if "Accelerator(" in lt.text or "accelerator" in lt.text or "world_size" not in lt.text:
        return
    for c in lt._calls():
        name = _call_name(c)[1]
        if not _builds_scheduler(name):
            continue
        for k in c.keywords:
            if k.arg not in ("num_training_steps", "num_warmup_steps") or not isinstance(k.value, ast.BinOp) or \
                    not isinstance(k.value.op, ast.Mult):
                continue
            sides = [ast.unparse(k.value.left), ast.unparse(k.value.right)]
            if any(re.search(r"world_size|num_processes|num_gpus", x) for x in sides) and \
                    any("step" in x and not re.search(r"world_size|num_processes", x) for x in sides):
                lt.add("lr-steps-from-dataset-length", "warning", c,
                       f"{k.arg}={ast.unparse(k.value)[:60]}: multiplied by the world size, as for Accelerate's "
                       "prepared scheduler (stepped num_processes times per step), but this scheduler is stepped once per "
                       "optimizer step: the schedule lasts world_size times longer than the run",
                       f"{k.arg}={sides[0] if 'step' in sides[0] else sides[1]}",
                       "https://github.com/huggingface/accelerate/blob/main/src/accelerate/scheduler.py")
                return


def rule_raw_scheduler_in_accumulate(lt: PythonLinter) -> None:
    """``lr_scheduler.step()`` inside ``with accelerator.accumulate(model):`` for a scheduler that no
    ``accelerator.prepare`` call is given (the optimizer is): the prepared optimizer skips its step on the
    accumulation micro-steps, but a raw scheduler steps every time it is called, so the schedule runs
    ``gradient_accumulation_steps`` times too fast (Accelerate's gradient accumulation guide: prepare the scheduler,
    whose ``step`` follows the optimizer's, https://huggingface.co/docs/accelerate/en/usage_guides/gradient_accumulation;
    starVLA).  Not where the step is guarded by ``accelerator.sync_gradients``."""
    from helpers.lint.python_rules import _call_name

    if ".accumulate(" not in lt.text or "prepare" not in lt.text:
        return
    schedulers = {ast.unparse(t) for n in lt.nodes if isinstance(n, ast.Assign) for t in n.targets
                  if re.search(r"sched", ast.unparse(t))}
    prepared: set[str] = set()
    optimizers: set[str] = set()
    for c in lt._calls():
        name = _call_name(c)[1]
        if "prepare" in name or "setup_distributed" in name:
            given = {ast.unparse(a) for a in c.args}
            prepared |= given
            optimizers |= {g for g in given if "optim" in g}
    if not optimizers:
        return  # the optimizer's preparation is not in view: nothing to compare the scheduler with
    for w in (n for n in lt.nodes if isinstance(n, ast.With)):
        if not any(isinstance(i.context_expr, ast.Call) and _call_name(i.context_expr)[1] == "accumulate"
                   for i in w.items):
            continue
        for c in (n for n in ast.walk(w) if isinstance(n, ast.Call)):
            if not (isinstance(c.func, ast.Attribute) and c.func.attr == "step"):
                continue
            held = ast.unparse(c.func.value)
            held_name = held.split(".")[-1]
            if held not in schedulers and not any(x.split(".")[-1] == held_name for x in schedulers) or \
                    held in prepared or any(x.split(".")[-1] == held_name for x in prepared):
                continue
            guard = lt.parents.get(c)
            while guard is not None and guard is not w and not (isinstance(guard, ast.If) and
                                                                "sync_gradients" in ast.unparse(guard.test)):
                guard = lt.parents.get(guard)
            if guard is not w:
                continue
            lt.add("scheduler-steps-per-microbatch", "warning", c,
                   f"{held}.step() inside accelerator.accumulate(...), but {held} is not given to accelerator.prepare "
                   "(the optimizer is): the prepared optimizer skips its step on accumulation micro-steps, this "
                   "scheduler steps on every one, so the schedule runs gradient_accumulation_steps times too fast",
                   f"pass {held} to accelerator.prepare too (its step then follows the optimizer's), or step it under "
                   "`if accelerator.sync_gradients:`",
                   "https://huggingface.co/docs/accelerate/en/usage_guides/gradient_accumulation")
            return


def _exclusive(lt: PythonLinter, a: ast.AST, b: ast.AST) -> bool:
    """``a`` and ``b`` sit in different branches of one ``if`` (never both run)."""
    chain: dict[ast.AST, ast.AST] = {}
    child, p = a, lt.parents.get(a)
    while p is not None:
        chain[p] = child
        child, p = p, lt.parents.get(p)
    child, p = b, lt.parents.get(b)
    while p is not None:
        if p in chain:
            if isinstance(p, ast.If):
                ca = chain[p]
                return (ca in p.body and child in p.orelse) or (ca in p.orelse and child in p.body)
            return False
        child, p = p, lt.parents.get(p)
    return False


def _distributed_sampler(lt: PythonLinter, sampler: ast.AST, scope: ast.AST) -> bool:
    """``sampler`` is (or names a value built from) a DistributedSampler."""
    from helpers.lint.python_rules import _call_name

    def has(node: ast.AST) -> bool:
        return any(isinstance(n, ast.Call) and _call_name(n)[1] == "DistributedSampler" for n in ast.walk(node))

    if has(sampler):
        return True
    if isinstance(sampler, ast.Name):
        return any(isinstance(n, ast.Assign) and any(isinstance(t, ast.Name) and t.id == sampler.id for t in n.targets)
                   and has(n.value) for n in subtree(scope))
    return False


_ACC_RESUME = "https://huggingface.co/docs/accelerate/en/usage_guides/checkpoint"
_ACC_PREPARE = "https://huggingface.co/docs/accelerate/en/package_reference/accelerator#accelerate.Accelerator.prepare"


def rule_resume_skip_every_epoch(lt: PythonLinter) -> None:
    """``train_dataloader = accelerator.skip_first_batches(train_dataloader, n)`` inside the epoch loop, guarded only by
    "resuming": the skip is meant for the first epoch after a resume (Accelerate's checkpoint guide and its examples:
    ``if resume and epoch == starting_epoch``, :data:`_ACC_RESUME`); run in every epoch it drops the first ``n``
    batches of each, and reassigning the loop's own loader makes the next epochs iterate the skipping one."""
    from helpers.lint.python_rules import _call_name

    for call in lt._calls():
        if _call_name(call)[1] != "skip_first_batches":
            continue
        node: ast.AST | None = call
        loop, tests = None, []
        while node is not None:
            parent = lt.parents.get(node)
            if isinstance(parent, ast.If) and node in parent.body:
                tests.append(parent.test)
            if isinstance(parent, (ast.For, ast.While)) and node in parent.body:
                loop = parent
                break
            node = parent
        if not isinstance(loop, ast.For) or not isinstance(loop.target, ast.Name):
            continue
        epoch = loop.target.id
        if any(epoch in {n.id for n in ast.walk(t) if isinstance(n, ast.Name)} for t in tests):
            continue
        # the resume test itself changes in the loop: a flag cleared in the skipping branch (``if resume_step is
        # not None: ...; resume_step = None``) or a step read again each pass (a checkpoint per split): once only
        tested = {n.id for t in tests for n in ast.walk(t) if isinstance(n, ast.Name)}
        stored = {t.id for n in subtree(loop) if isinstance(n, (ast.Assign, ast.AugAssign, ast.AnnAssign))
                  for t in assign_targets(n) if isinstance(t, ast.Name)}
        if tested & stored:
            continue
        stmt = lt.parents.get(call)
        reassigns = isinstance(stmt, ast.Assign) and call.args and isinstance(call.args[0], ast.Name) and any(
            isinstance(t, ast.Name) and t.id == call.args[0].id for t in stmt.targets)
        lt.add("resume-skip-every-epoch", "warning", call,
               f"skip_first_batches runs in every pass of 'for {epoch} in ...' (no test of {epoch}): every epoch "
               "drops its first batches, not only the epoch the checkpoint stopped in" +
               (f", and {call.args[0].id} itself is replaced by the skipping loader" if reassigns else ""),
               f"skip only when resuming into the first epoch: if resume and {epoch} == starting_epoch: active = "
               f"accelerator.skip_first_batches(loader, resume_step) else: active = loader", _ACC_RESUME)


_PLAIN_SAMPLERS = frozenset({"SequentialSampler", "RandomSampler"})


def rule_loader_not_preparable(lt: PythonLinter) -> None:
    """``loader-not-preparable``: a ``DataLoader(..., batch_size=None)`` (automatic batching off: the dataset yields
    whole batches, and the loader has no ``batch_sampler``) handed to ``accelerator.prepare``.  Under several processes
    Accelerate shards a map-style loader by wrapping its ``batch_sampler`` (``BatchSamplerShard``), which is None here:
    "TypeError: 'NoneType' object is not iterable" (accelerate 1.15 ``prepare_data_loader`` with
    ``num_processes=2``, reproduced; one process passes, so the single-GPU run hides it: uniem's M3E training).  Not
    where the dataset is an ``IterableDataset`` this file defines or a streaming dataset: Accelerate dispatches
    those from process 0."""
    from helpers.lint.python_rules import _call_name

    if "prepare(" not in lt.text or "batch_size" not in lt.text:
        return
    iterable = {n.name for n in lt.nodes if isinstance(n, ast.ClassDef) and
                any("Iterable" in ast.unparse(b) for b in n.bases)}
    made: dict[str, ast.Call] = {}
    for n in lt.nodes:
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and _call_name(n.value)[1] == "DataLoader":
            c = n.value
            size = kwarg(c, "batch_size") if kwarg(c, "batch_size") is not None else \
                (c.args[1] if len(c.args) > 1 else None)
            if not (isinstance(size, ast.Constant) and size.value is None):
                continue
            data = kwarg(c, "dataset") or (c.args[0] if c.args else None)
            src = ast.unparse(data) if data is not None else ""
            if re.search(r"(?i)iterable|stream", src) or any(
                    isinstance(a, ast.Assign) and isinstance(a.value, ast.Call) and _call_name(a.value)[1] in iterable
                    and ast.unparse(a.targets[0]) == src for a in lt.nodes):
                continue
            made.update({t.id: c for t in n.targets if isinstance(t, ast.Name)})
    for c in lt._calls():
        if not (isinstance(c.func, ast.Attribute) and c.func.attr == "prepare" and
                "accelerator" in ast.unparse(c.func.value).lower()):
            continue
        for a in c.args:
            if isinstance(a, ast.Name) and a.id in made:
                lt.add("loader-not-preparable", "error", c,
                       f"{a.id} is a DataLoader with batch_size=None (line {made[a.id].lineno}), so it has no "
                       "batch_sampler, and accelerator.prepare shards a loader through its batch_sampler: under "
                       "several processes it stops with \"TypeError: 'NoneType' object is not iterable\" (one "
                       "process passes)", "let the DataLoader batch (batch_size=N with a collate_fn), or give it a "
                       "batch_sampler that yields each batch's indices", _ACC_PREPARE)


def rule_loader_not_prepared(lt: PythonLinter) -> None:
    """``loader-not-prepared``: a script that hands its training DataLoader to ``accelerator.prepare`` builds another
    DataLoader (no sampler of its own) that it never prepares, and every process loops over it: Accelerate shards only
    the loaders it prepares ("prepare ... DataLoader: will be sharded across processes",
    https://huggingface.co/docs/accelerate/en/package_reference/accelerator#accelerate.Accelerator.prepare), so each
    process evaluates the whole set (N times the work, and metrics that are not the sharded ones the script
    reduces; huggingface/lerobot).  Not under a rank gate (one process evaluating everything on purpose)."""
    from helpers.lint.python_rules import _call_name

    if ".prepare(" not in lt.text or "DataLoader" not in lt.text:
        return
    made = [(t.id, n) for n in lt.nodes if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
            and _call_name(n.value)[1] == "DataLoader" for t in n.targets if isinstance(t, ast.Name)]
    loaders = {name: n.lineno for name, n in made
               if not any(k.arg in ("sampler", "batch_sampler") for k in n.value.keywords)}  # type: ignore[attr-defined]
    prepared = {a.id for c in lt._calls() if _call_name(c)[1] in ("prepare", "prepare_data_loader")
                for a in [*c.args, *(k.value for k in c.keywords)] if isinstance(a, ast.Name)}
    if not (prepared & {name for name, _n in made}):
        return  # no DataLoader goes through prepare: not this script's way of sharding
    for loop in (n for n in lt.nodes if isinstance(n, ast.For) and isinstance(n.iter, ast.Name)):
        name = loop.iter.id
        if name not in loaders or name in prepared or lt._rank_gate(loop) is not None:
            continue
        lt.add("loader-not-prepared", "warning", loop,
               f"every process loops over {name} (line {loaders[name]}), a DataLoader never given to "
               "accelerator.prepare: it is not sharded, so each process goes through all of it (N times the work; "
               "what it computes is not a shard's)", f"{name} = accelerator.prepare({name}) (and gather the results "
               "with accelerator.gather_for_metrics)",
               "https://huggingface.co/docs/accelerate/en/package_reference/accelerator#accelerate.Accelerator.prepare")
        return


def rule_sampler_not_distributed(lt: PythonLinter) -> None:
    """A sampler name given a ``DistributedSampler`` (in a branch) and then, unconditionally in the same block, a
    ``SequentialSampler``/``RandomSampler`` before the DataLoader reads it: the distributed one is dead on every rank,
    so each rank goes through the whole dataset (``DistributedSampler``: "restricts data loading to a subset of the
    dataset", ``_DATA``; deepspeedai/DeepSpeedExamples#804: every rank evaluated the whole eval set)."""
    from helpers.lint.python_rules import _call_name

    if "DistributedSampler" not in lt.text:
        return
    for block in statement_blocks(lt):
        distributed: dict[str, int] = {}
        for stmt in block:
            if isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.Call) and \
                    _call_name(stmt.value)[1] in _PLAIN_SAMPLERS:
                for t in (t for t in stmt.targets if isinstance(t, ast.Name) and t.id in distributed):
                    lt.add("sampler-not-distributed", "warning", stmt,
                           f"{t.id} = {_call_name(stmt.value)[1]}(...) replaces the DistributedSampler assigned at "
                           f"line {distributed[t.id]} on every rank: each rank then loads the whole dataset "
                           "(duplicated work, metrics over N copies)",
                           "keep the distributed sampler (drop this assignment, or put it in the branch that "
                           "runs without a process group)", _DATA + "#torch.utils.data.distributed.DistributedSampler")
                    del distributed[t.id]
                continue
            for n in ast.walk(stmt):
                if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and \
                        _call_name(n.value)[1] == "DistributedSampler":
                    distributed.update({t.id: n.lineno for t in n.targets if isinstance(t, ast.Name)})
                elif isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load) and n.id in distributed and \
                        not isinstance(stmt, ast.If):
                    distributed.pop(n.id, None)  # read before it is replaced: used as it was meant


_SHARDS_ITSELF = re.compile(r"\.prepare\(|prepare_data_loader|auto_dataloader|setup_dataloaders|lightning|Lightning|"
                            r"DistributedSampler|DistributedBatchSampler|ElasticDistributedSampler|split_dataset_by_node|"
                            r"NeighborLoader|IterableDataset|wds\.|webdataset|horovod|hvd\.")
"""What shards a loader's data across ranks without a DistributedSampler in the DataLoader call (Accelerate's and
ignite's loader wrappers, Lightning, datasets' split_dataset_by_node, iterable datasets, PyG loaders, Horovod)."""


def _dict_keys(lt: PythonLinter, name: str, depth: int = 2) -> dict[str, ast.expr]:
    """The constant keys (and values) a dict held by ``name`` gets anywhere in the file: ``name = {...}`` literals and
    ``name.update(other)`` of a literal or of another such name (``train_kwargs.update(cuda_kwargs)``)."""
    out: dict[str, ast.expr] = {}
    if depth < 0:
        return out
    for node in lt.nodes:
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name for t in node.targets) and \
                isinstance(node.value, ast.Dict):
            out.update((k.value, v) for k, v in zip(node.value.keys, node.value.values)
                       if isinstance(k, ast.Constant) and isinstance(k.value, str))
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "update" and \
                isinstance(node.func.value, ast.Name) and node.func.value.id == name and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Dict):
                out.update((k.value, v) for k, v in zip(arg.keys, arg.values)
                           if isinstance(k, ast.Constant) and isinstance(k.value, str))
            elif isinstance(arg, ast.Name):
                out.update(_dict_keys(lt, arg.id, depth - 1))
    return out


def _looped_over(lt: PythonLinter, loader: ast.Call) -> bool:
    """The name ``loader`` is assigned to is what a ``for`` goes through (``for b in train_loader``,
    ``enumerate(train_loader)``, ``tqdm(train_loader)``)."""
    parent = lt.parents.get(loader)
    if not (isinstance(parent, ast.Assign) and len(parent.targets) == 1 and isinstance(parent.targets[0], ast.Name)):
        return False
    name = parent.targets[0].id
    return any(isinstance(f, (ast.For, ast.AsyncFor)) and any(isinstance(x, ast.Name) and x.id == name
                                                               for x in ast.walk(f.iter)) for f in lt.nodes)


def rule_loader_without_distributed_sampler(lt: PythonLinter) -> None:
    """Data parallel training whose loader gives every rank the whole dataset: the file wraps its model in
    ``DistributedDataParallel`` and builds a ``DataLoader(..., shuffle=True)`` with no ``sampler=`` while nothing in
    the file shards the data (no DistributedSampler, no loader wrapper of a library: :data:`_SHARDS_ITSELF`); or it
    makes a ``DistributedSampler`` that no DataLoader reads.  DDP averages gradients but splits no data: "It is up to
    the user to ... split the data" is DistributedSampler's job ("restricts data loading to a subset of the dataset",
    ``_DATA``), so each rank trains on every sample, N times the work per epoch (kubeflow/trainer#2012, torchft#74).
    The same under ``deepspeed.initialize``: the engine shards only the loader it builds from ``training_data=``."""
    from helpers.lint.python_rules import _call_name

    engine = "deepspeed.initialize(" in lt.text  # the engine averages gradients as DDP does, and splits no data
    # but the loader it returns for training_data= (pytorch-training's T5 script looped over its own DataLoader)
    if "DistributedDataParallel" not in lt.text and not re.search(r"\bDDP\(", lt.text) and not engine:
        return
    wrapper = "DistributedDataParallel" if not engine or re.search(r"DistributedDataParallel|\bDDP\(", lt.text) \
        else "the DeepSpeed engine"
    loads = {n.id for n in lt.nodes if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
    for node in lt.nodes:
        if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and
                _call_name(node.value)[1].endswith("DistributedSampler")):
            continue
        for t in (t for t in node.targets if isinstance(t, ast.Name) and t.id not in loads):
            lt.add("sampler-not-distributed", "warning", node,
                   f"{t.id} = {_call_name(node.value)[1]}(...) is never read: no DataLoader gets it (sampler=), so "
                   "each rank loads the whole dataset while DDP averages the gradients",
                   f"DataLoader(..., sampler={t.id}) and drop shuffle=True (the sampler shuffles; call "
                   f"{t.id}.set_epoch(epoch) every epoch)", _DATA + "#torch.utils.data.distributed.DistributedSampler")
    if _SHARDS_ITSELF.search(lt.text):
        return
    for node in lt.nodes:
        if not (isinstance(node, ast.Call) and _call_name(node)[1] == "DataLoader"):
            continue
        origin = lt.import_origins.get(node.func.id, "torch") if isinstance(node.func, ast.Name) else "torch"
        if not origin.startswith("torch"):   # dgl.dataloading.DataLoader(use_ddp=...) and other libraries' loaders
            continue
        kws = {k.arg: k.value for k in node.keywords}
        for k in node.keywords:  # DataLoader(ds, **train_kwargs): the keys of the dicts that name holds
            if k.arg is None and isinstance(k.value, ast.Name):
                kws.update((key, v) for key, v in _dict_keys(lt, k.value.id).items() if key not in kws)
        shuffle = kws.get("shuffle")
        if "sampler" in kws or "batch_sampler" in kws or "use_ddp" in kws or \
                not (isinstance(shuffle, ast.Constant) and shuffle.value is True):
            continue
        if wrapper != "DistributedDataParallel" and not _looped_over(lt, node):
            continue  # under DeepSpeed: only a loader the training loop goes through (HelloDeepSpeed hands its
            # loader to an infinite iterator of random draws)
        lt.add("sampler-not-distributed", "warning", node,
               "DataLoader(..., shuffle=True) without a DistributedSampler in a file that trains under "
               f"{wrapper}: it averages gradients and splits no data, so every rank goes through the whole dataset "
               "(N times the work per epoch, each sample N times)",
               "sampler = DistributedSampler(dataset) (shuffles itself; sampler.set_epoch(epoch) every epoch) and "
               "DataLoader(dataset, sampler=sampler, shuffle=False)", _DATA + "#torch.utils.data.distributed.DistributedSampler")
        return


_SHUFFLES = re.compile(r"^(?:torch\.randperm|random\.shuffle|np\.random\.permutation|numpy\.random\.permutation|"
                       r"np\.random\.shuffle|numpy\.random\.shuffle|random\.sample)$")
"""Shuffles that draw from the process's global random state unless given a generator."""


def rule_sampler_rng_differs(lt: PythonLinter) -> None:
    """A sampler class that takes its rank's slice of a permutation (``indices[self.rank::self.num_replicas]``) and
    draws that permutation from the process's global random state (``torch.randperm(n)`` with no ``generator=``,
    ``random.shuffle``): the ranks' global states differ (model initialisation, dropout, augmentation), so each rank
    slices a different permutation, the slices overlap and some samples are never seen.  ``DistributedSampler``
    itself shuffles with ``g = torch.Generator(); g.manual_seed(self.seed + self.epoch)`` so that every replica draws
    the same one (torch/utils/data/distributed.py ``__iter__``; Wuziyi616/nerv)."""
    from helpers.lint.python_rules import _call_name

    if "num_replicas" not in lt.text:
        return
    for cls in (n for n in lt.nodes if isinstance(n, ast.ClassDef)):
        if not any("Sampler" in ast.unparse(b) for b in cls.bases):
            continue
        body = ast.unparse(cls)
        if not re.search(r"\[\s*self\.rank\s*:[^\]]*self\.num_replicas\s*\]", body):
            continue
        for c in (n for n in ast.walk(cls) if isinstance(n, ast.Call)):
            recv, name = _call_name(c)
            full = f"{recv}.{name}" if recv else name
            if _SHUFFLES.match(full) and not any(k.arg in ("generator", "random_state") for k in c.keywords):
                lt.add("sampler-rng-differs", "error", c,
                       f"{full}(...) in {cls.name}, which then takes self.rank's slice: with no generator it draws from "
                       "this process's global random state, which differs between ranks, so the ranks slice different "
                       "permutations (overlapping shards, samples never seen)",
                       "g = torch.Generator(); g.manual_seed(self.seed + self.epoch); torch.randperm(n, generator=g)",
                       "https://github.com/pytorch/pytorch/blob/main/torch/utils/data/distributed.py")
                break


_BUILTIN_READS = frozenset({"len", "print", "str", "repr", "enumerate", "iter", "tqdm", "id", "type", "isinstance"})
"""Calls that look at a loader without running a pass over it for a result (a length in a log line, a progress bar
around the loop that every rank runs)."""


def _other_branch_reads(lt: PythonLinter, node: ast.AST, name: str) -> bool:
    """The ``else`` of the rank gate around ``node`` reads ``name`` too (a progress bar on rank 0, the plain loop on
    the others): every rank goes through the loader."""
    child, p = node, lt.parents.get(node)
    while p is not None:
        if isinstance(p, ast.If) and child in p.body and lt.taint.rank_test(p.test):
            return any(isinstance(n, ast.Name) and n.id == name for s in p.orelse for n in ast.walk(s))
        child, p = p, lt.parents.get(p)
    return False


def rule_shard_read_on_one_rank(lt: PythonLinter) -> None:
    """A loader whose sampler is a ``DistributedSampler`` read only under a rank gate (``if dist.get_rank() == 0:
    acc = validate(val_loader, ...)``): the sampler gives each rank "a subset of the dataset" (``_DATA``), so rank 0
    alone sees 1/world_size of it, and the accuracy it reports (and the best checkpoint chosen by it) depends on the
    GPU count (megvii-research/Sparsebit's ImageNet example).  Evaluate on every rank and reduce, or give the rank-0
    evaluation a loader without the distributed sampler."""
    from helpers.lint.python_rules import _call_name

    if "DistributedSampler" not in lt.text:
        return
    samplers = {t.id for n in lt.nodes if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                and _call_name(n.value)[1].endswith("DistributedSampler") for t in n.targets if isinstance(t, ast.Name)}
    loaders = {t.id for n in lt.nodes if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
               and _call_name(n.value)[1] == "DataLoader" and isinstance(kwarg(n.value, "sampler"), ast.Name)
               and kwarg(n.value, "sampler").id in samplers  # type: ignore[union-attr]
               for t in n.targets if isinstance(t, ast.Name)}
    if not loaders:
        return
    for node in lt.nodes:
        read = None
        if isinstance(node, ast.Call) and not (isinstance(node.func, ast.Name) and node.func.id in _BUILTIN_READS):
            read = next((a.id for a in node.args if isinstance(a, ast.Name) and a.id in loaders), None)
        elif isinstance(node, ast.For):
            read = next((n.id for n in ast.walk(node.iter) if isinstance(n, ast.Name) and n.id in loaders), None)
        if read is None or lt._rank_gate(node) is None or _other_branch_reads(lt, node, read):
            continue
        lt.add("eval-shard-unreduced", "warning", node,
               f"{read} reads through a DistributedSampler, but only under a rank gate: that rank sees its own "
               "1/world_size shard, so what it computes (an accuracy, a best checkpoint) depends on the GPU count",
               "run it on every rank and reduce the sums (dist.all_reduce), or give the one-rank pass a loader "
               "without the distributed sampler", _DATA + "#torch.utils.data.distributed.DistributedSampler")
        return


def rule_rank_slice_results_on_one_rank(lt: PythonLinter) -> None:
    """Results collected over this rank's slice (``my_keys = all_keys[rank::world_size]``; ``for k in my_keys:
    results.append(...)``) handed to a call under a rank gate (``if local_rank == 0: aggregate_scores(results)``) with
    no gather of them: that rank's list holds its own 1/world_size of the cases, so the metric it reports covers a
    subset that depends on the GPU count (MIC-DKFZ/nnUNet's DDP validation).  The same contract as a
    ``DistributedSampler``'s shard read on one rank (:func:`rule_shard_read_on_one_rank`); not where the list is
    passed to a gather (``all_gather_object``, ``gather``)."""
    slices = {t.id for n in lt.nodes if isinstance(n, ast.Assign) and isinstance(n.value, ast.Subscript)
              and isinstance(n.value.slice, ast.Slice) and n.value.slice.lower is not None
              and n.value.slice.step is not None and lt.taint.is_rank(n.value.slice.lower)
              for t in n.targets if isinstance(t, ast.Name)}
    if not slices:
        return
    collected: dict[str, int] = {}
    for loop in (n for n in lt.nodes if isinstance(n, ast.For) and isinstance(n.iter, ast.Name) and n.iter.id in slices):
        for c in (n for s in loop.body for n in ast.walk(s) if isinstance(n, ast.Call)):
            if isinstance(c.func, ast.Attribute) and c.func.attr in ("append", "extend") and \
                    isinstance(c.func.value, ast.Name):
                collected.setdefault(c.func.value.id, loop.lineno)
    gathered = {a.id for c in lt._calls() if "gather" in ast.unparse(c.func).lower()
                for a in ast.walk(c) if isinstance(a, ast.Name)}
    for c in lt._calls():
        name = next((a.id for a in c.args if isinstance(a, ast.Name) and a.id in collected and a.id not in gathered),
                    None)
        if name is None or lt._rank_gate(c) is None or \
                (isinstance(c.func, ast.Name) and c.func.id in _BUILTIN_READS):
            continue
        lt.add("eval-shard-unreduced", "warning", c,
               f"{name} is filled over this rank's slice (the loop at line {collected[name]}) and read here under a rank "
               f"gate: that rank holds only its 1/world_size of the cases, so {ast.unparse(c.func)[:40]} reports on a "
               "subset that depends on the GPU count",
               f"gather the lists first (dist.all_gather_object) or build {name} over every case on the rank that "
               "reports", _DATA + "#torch.utils.data.distributed.DistributedSampler")
        return


_TRANSFORM = re.compile(r"(?:\.|\b)(?:map|filter|select|shuffle|train_test_split|cast_column)\w*\(")
"""A datasets transform (``ds.map(...)``, ``ds.filter(...)``): it returns a new dataset; the old one is unchanged."""


def rule_rank_gated_data_setup(lt: PythonLinter) -> None:
    """A dataset rebound to its processed form only under a rank gate (``if accelerator.is_main_process:
    vectorized_datasets = filter_fn(...)``), then read by every rank: ``datasets``' ``map`` / ``filter`` return a new
    dataset and leave the old one as it was, so the other ranks keep the raw data (or the name unset) and train or
    evaluate on something else than rank 0 (huggingface/distil-whisper).  Accelerate's idiom runs the transform on
    every rank inside ``with accelerator.main_process_first():`` (rank 0 writes the cache, the others read it,
    https://huggingface.co/docs/accelerate/en/package_reference/accelerator#accelerate.Accelerator.main_process_first)."""
    from helpers.lint.python_rules import _call_name

    if not _TRANSFORM.search(lt.text):
        return
    partials = {t.id for n in lt.nodes if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
                and _call_name(n.value)[1] == "partial" and n.value.args and _TRANSFORM.search(
                    ast.unparse(n.value.args[0]) + "(") for t in n.targets if isinstance(t, ast.Name)}
    for node in lt.nodes:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        target = node.targets[0]
        base = target.value if isinstance(target, ast.Subscript) else target
        if not isinstance(base, ast.Name):
            continue
        value = ast.unparse(node.value)
        if not (_TRANSFORM.search(value) or any(re.search(rf"\b{re.escape(p)}\(", value) for p in partials)):
            continue
        gate = lt._rank_gate(node)
        if gate is None or isinstance(gate, ast.If) and gate.orelse:
            continue
        fn = lt._enclosing_function(node) or lt.tree
        later = next((n for n in subtree(fn) if isinstance(n, ast.Name) and n.id == base.id and
                      isinstance(n.ctx, ast.Load) and n.lineno > node.end_lineno and lt._rank_gate(n) is None
                      and not lt._after_rank_exit(n)), None)  # type: ignore[operator]
        if later is None or any(isinstance(n, ast.Name) and n.id == base.id and isinstance(n.ctx, ast.Store) and
                                node.end_lineno < n.lineno <= later.lineno and lt._rank_gate(n) is None  # type: ignore[operator]
                                for n in subtree(fn)):
            continue  # rebound on every rank before the read (rank 0 saved it, all load it: parler-tts)
        lt.add("rank-gated-data-setup", "warning", node,
               f"{ast.unparse(target)} gets its processed dataset only on the gated rank, and every rank reads "
               f"{base.id} later (line {later.lineno}): map/filter return a new dataset, so the other ranks keep the "
               "unprocessed one", "run the transform on every rank inside `with accelerator.main_process_first():` "
               "(rank 0 builds the cache, the others load it)",
               "https://huggingface.co/docs/accelerate/en/package_reference/accelerator#accelerate.Accelerator.main_process_first")
        return


def rule_loader_wrapped_before_prepare(lt: PythonLinter) -> None:
    """A DataLoader wrapped in something else (``cycle(dl)``, a generator, a custom iterator) and that wrapper handed
    to ``accelerator.prepare``: ``prepare`` shards the objects it recognises (``DataLoader``: "prepare_data_loader"
    replaces its sampler with one that splits the data across processes) and returns the others unchanged, so every
    process iterates the whole dataset (lucidrains/denoising-diffusion-pytorch; Accelerate's
    https://huggingface.co/docs/accelerate/en/package_reference/accelerator#accelerate.Accelerator.prepare).  Prepare
    the DataLoader itself, then wrap what it returns."""
    from helpers.lint.python_rules import _call_name

    if ".prepare(" not in lt.text or "DataLoader(" not in lt.text:
        return
    loaders = {ast.unparse(t) for n in lt.nodes if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
               and _call_name(n.value)[1] == "DataLoader" for t in n.targets}
    wrapped: dict[str, tuple[str, int]] = {}
    for n in lt.nodes:
        if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and _call_name(n.value)[1] not in (
                "DataLoader", "prepare", "prepare_data_loader", "skip_first_batches") and n.value.args and \
                any(ast.unparse(a) in loaders for a in n.value.args):
            for t in n.targets:
                wrapped[ast.unparse(t)] = (_call_name(n.value)[1], n.lineno)
    if not wrapped:
        return
    for n in (x for x in lt.nodes if accelerator_prepare(x)):
        call = n.value
        assert isinstance(call, ast.Call)
        hit = next((ast.unparse(a) for a in call.args if ast.unparse(a) in wrapped
                    and wrapped[ast.unparse(a)][1] < call.lineno), None)
        if hit is None:
            continue
        how, line = wrapped[hit]
        lt.add("loader-wrapped-before-prepare", "warning", call,
               f"{hit} = {how}(<DataLoader>) (line {line}) is handed to accelerator.prepare, which shards DataLoaders "
               f"and returns anything else unchanged: {how}(...) is not one, so every process iterates the whole "
               "dataset", f"prepare the DataLoader first, then wrap it: dl = accelerator.prepare(dl); {hit} = {how}(dl)",
               "https://huggingface.co/docs/accelerate/en/package_reference/accelerator#accelerate.Accelerator.prepare")
        return


def rule_per_rank_outputs_from_whole_loader(lt: PythonLinter) -> None:
    """A script that runs as several processes (``init_process_group``), iterates a torch ``DataLoader`` with no
    sampler, and writes one output file per rank inside that loop (``torch.save(x, f"r{rank}_{i}.pth")``): the
    per-rank files say the work is meant to be split, but nothing splits the input (no ``DistributedSampler``, no
    rank in the dataset or loader, no library loader that shards), so every rank processes the whole dataset and
    the outputs hold each sample world-size times (``DistributedSampler``: "restricts data loading to a subset of
    the dataset", ``_DATA``; hkchengrex/MMAudio: latents extracted under torchrun, each clip N times)."""
    from helpers.lint.python_rules import _call_name, _written_paths

    if "init_process_group" not in lt.text or _SHARDS_ITSELF.search(lt.text):
        return
    loaders: dict[str, ast.Call] = {}
    for node in lt.nodes:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and \
                _call_name(node.value)[1] == "DataLoader" and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name):
            call = node.value
            origin = lt.import_origins.get(call.func.id, "torch") if isinstance(call.func, ast.Name) else "torch"
            given = [*call.args, *(k.value for k in call.keywords)]
            names = {n.id for a in given for n in ast.walk(a) if isinstance(n, ast.Name)}
            given += [a.value for a in lt.nodes if isinstance(a, ast.Assign) and  # how the dataset was built
                      any(isinstance(t, ast.Name) and t.id in names for t in a.targets)]
            if not origin.startswith("torch") or any(k.arg in ("sampler", "batch_sampler", None) for k in call.keywords) \
                    or any(lt.taint.is_rank_value(n) for a in given for n in ast.walk(a)):
                continue
            loaders[node.targets[0].id] = call
    for loop in (n for n in lt.nodes if isinstance(n, ast.For)):
        read = {n.id for n in ast.walk(loop.iter) if isinstance(n, ast.Name)} & set(loaders)
        if not read:
            continue
        for call in (c for stmt in loop.body for c in ast.walk(stmt) if isinstance(c, ast.Call)):
            if lt._write_kind(call) != "file" or lt._rank_gate(call) is not None:
                continue
            if any(lt.taint.is_rank_value(n) for p in _written_paths(call) for n in ast.walk(p)):
                name = sorted(read)[0]
                lt.add("sampler-not-distributed", "warning", loaders[name],
                       f"every rank iterates all of {name} (a DataLoader with no sampler, nothing rank-dependent in "
                       f"it) and writes its own file per batch (line {call.lineno}): each rank processes the whole "
                       "dataset, so the per-rank outputs repeat every sample world-size times",
                       "DataLoader(dataset, sampler=DistributedSampler(dataset, shuffle=False), ...) so each rank "
                       "takes its share", _DATA + "#torch.utils.data.distributed.DistributedSampler")
                return


def collect_sampler_facts(lt: PythonLinter) -> None:
    """Facts for :func:`helpers.lint.cross_rules.lightning_sampler_replaced`: the sampler classes this file defines
    that shard by rank themselves (a ``Sampler`` / ``BatchSampler`` subclass, not a ``DistributedSampler`` one, whose
    body reads ``num_replicas`` / ``get_world_size()`` / ``get_rank()``), the ``DataLoader(sampler=...)`` /
    ``batch_sampler=`` calls and the class each is given, and a Lightning ``Trainer(...)`` call with whether it sets
    ``use_distributed_sampler`` (``replace_sampler_ddp`` before Lightning 2.0).  Also, for
    :func:`helpers.lint.cross_rules.iterable_epoch_never_set`, the ``IterableDataset`` subclasses whose ``__iter__``
    (or a method it calls) reads ``self.epoch`` and that define ``set_epoch``, whether the file runs a Lightning loop,
    and whether it calls ``set_epoch`` on anything but ``self``."""
    from helpers.lint.python_rules import _call_name

    for cls in (n for n in lt.nodes if isinstance(n, ast.ClassDef)):
        bases = [ast.unparse(b) for b in cls.bases]
        if any("DistributedSampler" in b for b in bases) or not any(re.search(r"(?:^|\.)(Batch)?Sampler\b", b)
                                                                    for b in bases):
            continue
        if re.search(r"num_replicas|get_world_size\(|get_rank\(", ast.unparse(cls)):
            lt.facts.rank_samplers[cls.name] = cls.lineno
    made: dict[str, str] = {}
    for node in lt.nodes:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call) and len(node.targets) == 1 and \
                isinstance(node.targets[0], ast.Name):
            made[node.targets[0].id] = _call_name(node.value)[1]
    for c in lt._calls():
        recv, name = _call_name(c)
        if name == "DataLoader":
            for k in c.keywords:
                if k.arg in ("sampler", "batch_sampler"):
                    given = _call_name(k.value)[1] if isinstance(k.value, ast.Call) else \
                        made.get(k.value.id, "") if isinstance(k.value, ast.Name) else ""
                    if given:
                        lt.facts.loader_samplers.append((given, c.lineno))
        elif name == "Trainer" and re.search(r"lightning", lt.text):
            sets = any(k.arg in ("use_distributed_sampler", "replace_sampler_ddp") or k.arg is None for k in c.keywords)
            lt.facts.lightning_trainer = -1 if sets else (lt.facts.lightning_trainer or c.lineno)
        elif name == "set_epoch" and recv != "self":
            lt.facts.sets_epoch_from_outside = True
    lightning = re.search(r"lightning", lt.text) is not None
    for cls in (n for n in lt.nodes if isinstance(n, ast.ClassDef)):
        bases = [ast.unparse(b) for b in cls.bases]
        lt.facts.lightning_loop |= lightning and any(b.endswith("LightningModule") for b in bases)
        if not any(b.endswith("IterableDataset") for b in bases):
            continue
        methods = {m.name: m for m in cls.body if isinstance(m, ast.FunctionDef)}
        it = methods.get("__iter__")
        if "set_epoch" in methods and it is not None and any(
                isinstance(n, ast.Attribute) and n.attr == "epoch" and ast.unparse(n.value) == "self"
                for m in (it, *[methods[c.func.attr] for c in ast.walk(it) if isinstance(c, ast.Call)
                                and isinstance(c.func, ast.Attribute) and ast.unparse(c.func.value) == "self"
                                and c.func.attr in methods]) for n in ast.walk(m)):
            lt.facts.iterable_epoch_classes[cls.name] = cls.lineno
    lt.facts.lightning_loop |= lt.facts.lightning_trainer != 0
    _collect_unseeded_draws(lt)
    _collect_setup_writes(lt)


def _writes_file(lt: PythonLinter, c: ast.Call) -> bool:
    """``c`` writes a file: :meth:`PythonLinter._write_kind`, or ``h5py.File(path, "w")`` (modes w, w-, x, a: the
    HDF5 library locks a file open for writing, so a second writer fails, https://docs.h5py.org/en/stable/high/file.html)."""
    from helpers.lint.python_rules import _call_name

    if lt._write_kind(c) == "file":
        return True
    recv, name = _call_name(c)
    if name == "File" and recv == "h5py":
        mode = c.args[1] if len(c.args) > 1 else next((k.value for k in c.keywords if k.arg == "mode"), None)
        return isinstance(mode, ast.Constant) and isinstance(mode.value, str) and mode.value[:1] in "wxa"
    return False


def _collect_setup_writes(lt: PythonLinter) -> None:
    """Facts for :func:`helpers.lint.cross_rules.setup_writes_every_rank`: the module-level functions and classes of
    the file that write a file (a function whose body writes, or calls such a function of the file; a class whose
    ``__init__`` does), and the calls a ``LightningDataModule.setup`` makes outside any rank gate."""
    from helpers.lint.python_rules import _call_name

    top = {n.name: n for n in getattr(lt.tree, "body", []) if isinstance(n, (ast.FunctionDef, ast.ClassDef))}
    bodies = {name: method_named(n, "__init__") if isinstance(n, ast.ClassDef) else n for name, n in top.items()}
    writers = lt.facts.writing_callables
    for _round in range(3):
        for name, body in bodies.items():
            if body is not None and name not in writers and any(
                    isinstance(c, ast.Call) and (_writes_file(lt, c) or _call_name(c)[1] in writers)
                    for c in subtree(body)):
                writers.add(name)
    for cls in (n for n in top.values() if isinstance(n, ast.ClassDef)
                and any(ast.unparse(b).endswith("LightningDataModule") for b in n.bases)):
        setup = method_named(cls, "setup")
        for c in (n for n in subtree(setup) if isinstance(n, ast.Call)) if setup is not None else ():
            if lt._rank_gate(c) is None and not lt._after_rank_exit(c):
                lt.facts.setup_calls.append((_call_name(c)[1], c.lineno, ast.unparse(c)[:60]))


_SEEDS = re.compile(r"^(?:seed_everything|manual_seed|manual_seed_all|set_seed|seed_all|init_seeds|fix_seed|"
                    r"set_random_seed|setup_seed|seed_torch)$")
"""Calls that seed a process's global random state (``random.seed`` / ``np.random.seed`` are read by receiver)."""


def _collect_unseeded_draws(lt: PythonLinter) -> None:
    """Facts for :func:`helpers.lint.cross_rules.unseeded_dataset_draw`: ``Dataset`` subclasses whose ``__init__``
    chooses its contents with the global random state (:data:`_SHUFFLES` without a generator), whether the file seeds
    a global random state, and whether it makes a ``DistributedSampler``."""
    from helpers.lint.python_rules import _call_name

    for c in lt._calls():
        recv, name = _call_name(c)
        if _SEEDS.match(name) or (name == "seed" and recv in ("random", "np.random", "numpy.random")):
            lt.facts.seeds_global_rng = True
        elif name.endswith("DistributedSampler"):
            lt.facts.splits_by_sampler = True
    for cls in (n for n in lt.nodes if isinstance(n, ast.ClassDef)):
        if not any(re.search(r"(?:^|\.)Dataset$", ast.unparse(b)) for b in cls.bases):
            continue
        init = method_named(cls, "__init__")
        for c in (n for n in subtree(init) if isinstance(n, ast.Call)) if init is not None else ():
            recv, name = _call_name(c)
            if _SHUFFLES.match(f"{recv}.{name}" if recv else name) and \
                    not any(k.arg in ("generator", "random_state", "seed") for k in c.keywords):
                lt.facts.unseeded_dataset_draws.setdefault(cls.name, c.lineno)
                break


def rule_distributed_sampler_unshuffled(lt: PythonLinter) -> None:
    """``if distributed: sampler = DistributedSampler(ds, shuffle=False) else: sampler = RandomSampler(ds)``: the file
    shuffles its training data on one process and not on several (DistributedSampler's ``shuffle`` "If True
    (default), sampler will shuffle the indices", :data:`_DATA`), so the multi-GPU run trains on the same fixed order
    every epoch (mindee/doctr's detection reference).  Only where the other branch of the same ``if`` shuffles."""
    from helpers.lint.python_rules import _call_name

    if "DistributedSampler" not in lt.text:
        return
    for node in lt.nodes:
        if not (isinstance(node, ast.If) and node.orelse):
            continue
        sides = []
        for block in (node.body, node.orelse):
            got: dict[str, ast.Call] = {}
            for st in block:
                if isinstance(st, ast.Assign) and isinstance(st.value, ast.Call) and len(st.targets) == 1 and \
                        isinstance(st.targets[0], ast.Name):
                    got[st.targets[0].id] = st.value
            sides.append(got)
        for name in set(sides[0]) & set(sides[1]):
            if re.search(r"(?i)test|val|eval", name + " " + ast.unparse(sides[0][name])):
                continue  # an evaluation sampler keeps its order on purpose
            for dist_side, other in ((sides[0][name], sides[1][name]), (sides[1][name], sides[0][name])):
                shuffle = kwarg(dist_side, "shuffle")
                if _call_name(dist_side)[1].endswith("DistributedSampler") and isinstance(shuffle, ast.Constant) and \
                        shuffle.value is False and _call_name(other)[1] == "RandomSampler":
                    lt.add("sampler-no-shuffle", "warning", dist_side,
                           f"{ast.unparse(dist_side)[:60]} does not shuffle, while the one-process branch uses "
                           f"{_call_name(other)[1]}: the multi-GPU run trains on one fixed order every epoch",
                           "DistributedSampler(..., shuffle=True) and sampler.set_epoch(epoch) at each epoch's start",
                           _DATA + "#torch.utils.data.distributed.DistributedSampler")


_HF_TRAINER_SRC = "https://github.com/huggingface/transformers/blob/main/src/transformers/trainer.py"


def rule_trainer_loader_override_unsharded(lt: PythonLinter) -> None:
    """A Hugging Face ``Trainer`` subclass whose ``get_train_dataloader`` / ``get_eval_dataloader`` returns a
    ``DataLoader(...)`` it builds itself, with no ``sampler=`` / ``batch_sampler=`` and not through
    ``self.accelerator.prepare``: the Trainer's own method shards its loader across processes (``return
    self.accelerator.prepare(DataLoader(...))``; before Accelerate, a DistributedSampler or ``IterableDatasetShard``,
    :data:`_HF_TRAINER_SRC`), so the override gives every rank the whole dataset (stanford-crfm/mistral's iterable
    datasets)."""
    from helpers.lint.python_rules import _call_name

    if "get_train_dataloader" not in lt.text and "get_eval_dataloader" not in lt.text:
        return
    for cls in (n for n in lt.nodes if isinstance(n, ast.ClassDef)):
        if not any(ast.unparse(b).endswith("Trainer") for b in cls.bases):
            continue
        for fn in cls.body:
            if not (isinstance(fn, ast.FunctionDef) and fn.name in ("get_train_dataloader", "get_eval_dataloader")):
                continue
            for r in (n for n in subtree(fn) if isinstance(n, ast.Return) and isinstance(n.value, ast.Call)):
                call = r.value
                if _call_name(call)[1] != "DataLoader" or any(k.arg in ("sampler", "batch_sampler")
                                                                for k in call.keywords) or \
                        call.args and isinstance(call.args[0], (ast.List, ast.Tuple)):
                    continue  # (DataLoader([]): sentence-transformers' placeholder when there is nothing to load)
                data = call.args[0] if call.args else kwarg(call, "dataset")
                if isinstance(data, ast.Name) and any(
                        isinstance(a, ast.Assign) and any(isinstance(t, ast.Name) and t.id == data.id for t in a.targets)
                        and re.search(r"IterableDatasetShard|split_dataset_by_node|\.shard\(", ast.unparse(a.value))
                        for a in subtree(fn)):
                    continue  # sharded by hand first (Open-Assistant's IterableDatasetShard)
                lt.add("sampler-not-distributed", "warning", call,
                       f"{cls.name}.{fn.name} returns a DataLoader of its own, with no sampler and not through "
                       "self.accelerator.prepare: the Trainer's method it replaces shards the loader across "
                       "processes, so under a multi-process launch every rank reads the whole dataset",
                       "return self.accelerator.prepare(DataLoader(...)) (or give it a DistributedSampler / "
                       "split_dataset_by_node for an iterable dataset)", _HF_TRAINER_SRC)
                break


_TORCH_SPLIT = "https://docs.pytorch.org/docs/stable/generated/torch.split.html"
_WORLD_NAME = re.compile(r"get_world_size\(|world_size|WORLD_SIZE|num_replicas|num_processes|nprocs|n_gpus|ngpus")


def rule_rank_split_drops(lt: PythonLinter) -> None:
    """``idx.split(idx.size(0) // world_size)[rank]`` (or ``torch.split(idx, n // world_size)[rank]``): a chunk size
    rounded down gives more than world-size chunks whenever the count does not divide ("Last chunk will be smaller
    if the tensor size along the given dimension is not divisible by split_size", :data:`_TORCH_SPLIT`), and the
    ranks take the first world-size of them: the items of the extra chunk are never used by any rank (pyg-team/
    pytorch_geometric#9753 switched to ``tensor_split(world_size)``)."""
    from helpers.lint.python_rules import _call_name

    if ".split(" not in lt.text:
        return
    for node in lt.nodes:
        if not (isinstance(node, ast.Subscript) and isinstance(node.value, ast.Call) and lt.taint.is_rank(node.slice)):
            continue
        call = node.value
        recv, name = _call_name(call)
        if name != "split" or not isinstance(call.func, ast.Attribute):
            continue
        size = (call.args[1] if len(call.args) > 1 else None) if recv == "torch" else \
            (call.args[0] if call.args else kwarg(call, "split_size"))
        if not (isinstance(size, ast.BinOp) and isinstance(size.op, ast.FloorDiv) and
                _WORLD_NAME.search(ast.unparse(size.right))):
            continue
        lt.add("rank-split-drops", "warning", node,
               f"{ast.unparse(node)[:70]} cuts chunks of {ast.unparse(size)[:40]} items: when the count is not a "
               "multiple of the world size that makes more chunks than there are ranks, and the items of the extra ones are never "
               "used by any rank", "split into exactly world-size parts: x.tensor_split(world_size)[rank] (or "
               "shard with DistributedSampler)", _TORCH_SPLIT)


def _values(lt: PythonLinter, expr: ast.AST, at: ast.AST, depth: int = 3) -> list[ast.AST]:
    """``expr`` and, a few assignments deep, the values its names were last given before ``at`` in the same scope
    (``bsz = 128 / float(size)``, then ``DataLoader(..., batch_size=bsz)``)."""
    out, todo, seen = [expr], [expr], set()
    while todo and depth > 0:
        depth -= 1
        nxt = []
        for e in todo:
            for name in {n.id for n in ast.walk(e) if isinstance(n, ast.Name)} - seen:
                seen.add(name)
                last = last_assignment(lt, name, at)
                if last is not None:
                    nxt.append(last.value)
        out += nxt
        todo = nxt
    return out


def _true_division(expr: ast.AST) -> ast.AST | None:
    """The ``a / b`` or ``float(...)`` whose float reaches the value of ``expr`` (not through ``int()``, ``round()``,
    ``math.floor`` / ``ceil``, which give integers), else None."""
    from helpers.lint.python_rules import _call_name

    if isinstance(expr, ast.BinOp):
        if isinstance(expr.op, ast.Div):
            return expr
        if isinstance(expr.op, (ast.Mult, ast.Add, ast.Sub)):
            return _true_division(expr.left) or _true_division(expr.right)
        return None
    if isinstance(expr, ast.Call) and _call_name(expr)[1] == "float" and not isinstance(expr.func, ast.Attribute):
        return expr
    return None


def rule_batch_size_not_int(lt: PythonLinter) -> None:
    """``DataLoader(..., batch_size=bsz)`` where ``bsz`` comes from a true division (``128 / float(world_size)``, a
    per-rank share of a global batch): Python's ``/`` gives a float, and the DataLoader's ``BatchSampler`` raises
    "batch_size should be a positive integer value, but got batch_size=64.0" (torch/utils/data/sampler.py: ``not
    isinstance(batch_size, int)``), on every world size (seba-1511/dist_tuto.pth: ``bsz = 128 / float(size)``)."""
    from helpers.lint.python_rules import _call_name

    if "batch_size" not in lt.text or "DataLoader" not in lt.text:
        return
    for c in lt._calls():
        if _call_name(c)[1] != "DataLoader" or isinstance(c.func, ast.Name) and \
                not lt.import_origins.get(c.func.id, "torch").startswith("torch"):
            continue
        given = _loader_arg(c, "batch_size")
        if given is None:
            continue
        hit = next((d for v in _values(lt, given, c) if (d := _true_division(v)) is not None), None)
        if hit is None:
            continue
        lt.add("batch-size-not-int", "error", c,
               f"batch_size={ast.unparse(given)[:40]} is a float ({ast.unparse(hit)[:40]} is a true division): the "
               "DataLoader raises 'batch_size should be a positive integer value, but got batch_size=...'",
               f"an integer: {ast.unparse(hit).replace(' / ', ' // ', 1)[:50]} (and check that it divides evenly)",
               _DATA + "#torch.utils.data.DataLoader")


def rule_dataset_len_not_sharded(lt: PythonLinter) -> None:
    """An ``IterableDataset`` whose ``__iter__`` splits the data by rank (``num_replicas``, ``get_rank()``,
    ``world_size``) while its ``__len__`` returns the whole collection's size: for an iterable dataset the
    DataLoader's length is "an estimate based on len(dataset) / batch_size ... because PyTorch trusts user dataset
    code in correctly handling multi-process loading" (torch.utils.data.DataLoader's warning), so every consumer of
    ``len(loader)`` (Lightning's steps per epoch, an LR schedule, a progress bar) counts the world size times more than
    the rank yields (cellarium-ml's IterableDistributedAnnDataCollectionDataset)."""
    if "IterableDataset" not in lt.text or "__len__" not in lt.text:
        return
    shard = re.compile(r"num_replicas|world_size|get_rank\(|\brank\b|WORLD_SIZE")
    for cls in (n for n in lt.nodes if isinstance(n, ast.ClassDef)):
        if not any(ast.unparse(b).endswith("IterableDataset") for b in cls.bases):
            continue
        methods = {m.name: m for m in cls.body if isinstance(m, ast.FunctionDef)}
        it, ln = methods.get("__iter__"), methods.get("__len__")
        if it is None or ln is None or not shard.search(ast.unparse(it)):
            continue
        body = ast.unparse(ln)
        if shard.search(body) or re.search(r"//|/|\bshard|\breplica|\bworker|split", body.split(":", 1)[1]):
            continue
        rets = [r for r in ast.walk(ln) if isinstance(r, ast.Return) and r.value is not None]
        if not rets:
            continue
        lt.add("dataset-len-not-sharded", "warning", rets[0],
               f"{cls.name}.__len__ returns {ast.unparse(rets[0].value)[:40]}, the whole dataset, while __iter__ "
               "yields only this rank's share: len(DataLoader) of an iterable dataset is taken from len(dataset), so "
               "steps per epoch, LR schedules and progress bars count world-size times too many",
               "return this rank's count from __len__ (the items __iter__ yields here: ceil(n / num_replicas), in "
               "batches if it yields batches)", _DATA + "#torch.utils.data.IterableDataset")


def _world_scaled(expr: ast.AST) -> ast.AST | None:
    """The ``x * world_size`` product in ``expr`` (a world-size name on either side), else None."""
    for n in ast.walk(expr):
        if isinstance(n, ast.BinOp) and isinstance(n.op, ast.Mult) and any(
                _WORLD_NAME.search(ast.unparse(s)) for s in (n.left, n.right)):
            return n
    return None


def rule_batch_times_world_size(lt: PythonLinter) -> None:
    """``DataLoader(ds, sampler=DistributedSampler(ds), batch_size=args.batch_size * world_size)``: with a
    DistributedSampler each rank's loader draws its own batches ("each process can pass a DistributedSampler instance
    as a DataLoader sampler, and load a subset of the original dataset that is exclusive to it", :data:`_SAMPLER`), so
    ``batch_size`` is the per-process batch; scaled by the world size, the global batch is the intended one times the
    world size (geoelements/gns).  Also the facts for :func:`helpers.lint.cross_rules.batch_times_world_size_across`
    (a function of one file whose parameter is such a loader's batch size, called from another with a scaled
    value)."""
    from helpers.lint.python_rules import _call_name

    if "DataLoader" not in lt.text and "batch_size" not in lt.text:
        return
    for c in lt._calls():
        name = _call_name(c)[1]
        if name != "DataLoader":
            if name and name not in lt.functions:
                for at, a in [*enumerate(c.args), *((k.arg, k.value) for k in c.keywords if k.arg)]:
                    hit = _world_scaled(a)
                    if hit is not None and (at == "batch_size" or isinstance(at, int)):
                        lt.facts.world_scaled_args.append((name, at, c.lineno, ast.unparse(hit)[:50]))  # type: ignore[attr-defined]
            continue
        sampler, given = _loader_arg(c, "sampler"), _loader_arg(c, "batch_size")
        scope = lt._enclosing_function(c) or lt.tree
        if sampler is None or given is None or not _distributed_sampler(lt, sampler, scope):
            continue
        fn = lt._enclosing_function(c)
        if isinstance(given, ast.Name) and isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) and \
                fn in getattr(lt.tree, "body", []):
            params = [a.arg for a in fn.args.args]
            if given.id in params:
                lt.facts.dist_batch_params.setdefault(fn.name, set()).update(  # type: ignore[attr-defined]
                    {params.index(given.id), given.id})
        hit = next((h for v in _values(lt, given, c) if (h := _world_scaled(v)) is not None), None)
        if hit is not None:
            lt.add("batch-times-world-size", "warning", c,
                   f"batch_size={ast.unparse(given)[:40]} scales a per-process batch by the world size "
                   f"({ast.unparse(hit)[:40]}) for a loader with a DistributedSampler: each rank draws that many, so "
                   "the global batch is world-size times the intended one",
                   "give the loader the per-process batch (the global batch // world_size)", _SAMPLER)


def rule_sampler_shuffle_ignored(lt: PythonLinter) -> None:
    """``sampler-shuffle-ignored``: a sampler class whose ``__init__`` takes ``shuffle`` and never reads it, while it
    sets ``self.shuffle`` to a constant: the caller's ``shuffle=False`` (an evaluation loader, a sequential order a
    result file depends on) is dropped and the order is the constant's (maskrcnn-benchmark's copy of
    DistributedSampler set ``self.shuffle = True``; torch's own stores the argument: ``shuffle (bool, optional): If
    True (default), sampler will shuffle the indices``, ``_SAMPLER``)."""
    if "shuffle" not in lt.text or "Sampler" not in lt.text:
        return
    for cls in lt.nodes:
        if not isinstance(cls, ast.ClassDef) or not ("Sampler" in cls.name or any(
                "Sampler" in ast.unparse(b) for b in cls.bases)):
            continue
        init = method_named(cls, "__init__")
        if init is None or "shuffle" not in [a.arg for a in init.args.args + init.args.kwonlyargs]:
            continue
        if any(isinstance(n, ast.Name) and n.id == "shuffle" and isinstance(n.ctx, ast.Load) for n in subtree(init)):
            continue
        fixed = next((n for n in subtree(init) if isinstance(n, ast.Assign) and isinstance(n.value, ast.Constant)
                      and isinstance(n.value.value, bool) and any(ast.unparse(t) == "self.shuffle" for t in n.targets)),
                     None)
        if fixed is None:
            continue
        lt.add("sampler-shuffle-ignored", "warning", fixed,
               f"{cls.name}.__init__ takes shuffle= but never reads it and sets self.shuffle = {fixed.value.value}: a "
               f"loader built with shuffle={not fixed.value.value} gets the opposite order (an evaluation set "
               "shuffled, or a training set never shuffled)",
               "self.shuffle = shuffle", _SAMPLER)


_WORLD_SIZE_NAME = re.compile(r"(?i)(?:^|\.|_)(?:world_size|num_replicas|num_ranks|nranks|n_?gpus|num_gpus|ngpu)$")
_NODES_NAME = re.compile(r"(?i)(?:^|\.|_)(?:num_nodes|nnodes|n_nodes|num_machines|node_count)$")
_TORCHRUN_RANKS = "https://docs.pytorch.org/docs/stable/distributed.html#launch-utility"


def rule_rank_arithmetic(lt: PythonLinter) -> None:
    """Two formulas on the rank layout that are right on one node (or for some sizes) only.
    ``node-index-formula``: ``rank // num_nodes`` taken as the node of a rank; launchers number the ranks node by
    node ("RANK = node_rank * nproc_per_node + local_rank", ``_TORCHRUN_RANKS``), so the node is ``rank //
    ranks_per_node`` (``rank // (world_size // num_nodes)``): with 2 nodes of 8, rank 5 is put on node 2
    (lightning.data's intra-node chunk shuffle).  ``padding-formula``: ``world_size - n % world_size`` as the number
    of items to add so that ``n`` divides evenly, with no outer ``% world_size`` and no test that ``n % world_size``
    is not 0: when ``n`` is a multiple it pads a whole extra ``world_size`` (DistributedSampler pads ``ceil(n / W) *
    W - n``, which is 0 then, ``_SAMPLER``; openfold-3's ``pad_to_world_size``)."""
    if "//" not in lt.text and "%" not in lt.text:
        return
    for n in lt.nodes:
        if not isinstance(n, ast.BinOp):
            continue
        if isinstance(n.op, ast.FloorDiv) and isinstance(n.right, (ast.Name, ast.Attribute)) and \
                _NODES_NAME.search(ast.unparse(n.right)) and \
                (lt.taint.is_rank_value(n.left) or re.search(r"(?i)\brank$", ast.unparse(n.left))):
            lt.add("node-index-formula", "error", n,
                   f"{ast.unparse(n)[:60]} as a node index: ranks are numbered node by node (rank = node_rank * "
                   "ranks_per_node + local_rank), so the node is rank // ranks_per_node; this formula puts ranks on "
                   "the wrong node (or past the last one) as soon as there are several nodes",
                   f"divide by the ranks per node: {ast.unparse(n.left)} // (world_size // {ast.unparse(n.right)})",
                   _TORCHRUN_RANKS)
            continue
        if isinstance(n.op, ast.Sub) and isinstance(n.right, ast.BinOp) and isinstance(n.right.op, ast.Mod) and \
                _WORLD_SIZE_NAME.search(ast.unparse(n.left)) and ast.dump(n.left) == ast.dump(n.right.right):
            parent = lt.parents.get(n)
            if isinstance(parent, ast.BinOp) and isinstance(parent.op, ast.Mod):
                continue  # (W - n % W) % W: 0 when n divides
            remainder = ast.dump(n.right)
            if any(isinstance(p, (ast.If, ast.IfExp, ast.While)) and any(
                    isinstance(x, ast.BinOp) and ast.dump(x) == remainder for x in ast.walk(p.test))
                   for p in ancestors(lt, n)):
                continue  # under `if n % W != 0` (or `if n % W:`)
            lt.add("padding-formula", "warning", n,
                   f"{ast.unparse(n)[:60]} pads a whole extra {ast.unparse(n.left)} when "
                   f"{ast.unparse(n.right.left)} is already a multiple of it (the remainder is 0): every rank gets "
                   "one more, repeated, item than it needs",
                   f"({ast.unparse(n)}) % {ast.unparse(n.left)} (or -{ast.unparse(n.right.left)} % "
                   f"{ast.unparse(n.left)})", _SAMPLER)


_INDEX_LIST = re.compile(r"(?i)(?:^|[._])(?:indices|idxs?|ids|index_list|sample_ids)$")


def rule_sampler_over_index_list(lt: PythonLinter) -> None:
    """``sampler-positions-not-indices``: ``DistributedSampler(indices)`` over a list of dataset indices, its output
    used as dataset indices: the sampler treats what it is given as the dataset and yields positions ``0 ..
    len(indices) - 1`` of it ("Sampler that restricts data loading to a subset of the dataset", its ``__iter__``
    yields ``range(len(self.dataset))`` shuffled and strided, ``_SAMPLER``), not the entries, so the ranks read the
    first ``len(indices)`` items of the dataset whatever the index list held (ffcv's Random order with custom
    indices).  Not where the file maps the positions through the list (``indices[i]``)."""
    if "DistributedSampler" not in lt.text:
        return
    for c in lt._calls():
        if not (isinstance(c.func, (ast.Name, ast.Attribute)) and ast.unparse(c.func).endswith("DistributedSampler")
                and c.args and _INDEX_LIST.search(ast.unparse(c.args[0]))):
            continue
        held = ast.unparse(c.args[0])
        if any(isinstance(n, ast.Subscript) and ast.unparse(n.value) == held and not isinstance(n.slice, ast.Slice)
               for n in lt.nodes):
            continue  # indices[i] for i in sampler: mapped back
        lt.add("sampler-positions-not-indices", "warning", c,
               f"DistributedSampler({held}) yields positions 0..len({held})-1, not the entries of {held}: used as "
               "dataset indices they select the first items of the dataset, whatever the index list holds",
               f"map them back ([{held}[i] for i in sampler]), or give the sampler a Subset of the dataset", _SAMPLER)


__all__ = ["collect_sampler_facts", "rule_sampler_over_index_list", "rule_rank_arithmetic", "rule_sampler_shuffle_ignored", "rule_batch_size_not_int", "rule_batch_times_world_size", "rule_dataset_len_not_sharded", "rule_distributed_sampler_unshuffled", "rule_rank_split_drops", "rule_trainer_loader_override_unsharded", "rule_dataloader_sampler_and_shuffle", "rule_rank_slice_results_on_one_rank", "rule_loader_not_prepared", "rule_loader_without_distributed_sampler", "rule_loader_wrapped_before_prepare", "rule_lr_steps_from_dataset_length", "rule_lr_steps_given_per_step", "rule_lr_steps_times_world_size", "rule_per_rank_outputs_from_whole_loader", "rule_rank_gated_data_setup", "rule_rank_seed_before_model_init", "rule_raw_scheduler_in_accumulate", "rule_resume_skip_every_epoch", "rule_same_seed_every_rank", "rule_sampler_not_distributed", "rule_sampler_rng_differs", "rule_scheduler_outside_conditional_step", "rule_seed_everything_without_workers", "rule_shard_read_on_one_rank"]
