"""Rules on what every rank must compute alike, and on the process group being made once.

Data parallelism rests on the ranks agreeing on values each one computes for itself:

- ``DistributedSampler`` "assumes the dataset is of constant size and that any instance of it always returns the
  same elements in the same order" (:data:`_SAMPLER`); Accelerate's ``prepare`` and the Trainer shard a loader by index
  on the same assumption.  A dataset split or shuffled from a random generator each process seeds for itself gives
  every rank a different dataset: the index shards then overlap and leave samples out, and the validation samples of
  one rank are training samples of another (``rank-split-differs``).
- Python salts the ``hash()`` of ``str`` and ``bytes`` per process ("not predictable between repeated invocations of
  Python", :data:`_HASH`): a file name, a cache key, a seed or a shard assignment computed from it differs on every
  rank unless ``PYTHONHASHSEED`` is fixed (``hash-per-process``).

and on the default process group existing once: ``init_process_group`` raises ``ValueError("trying to initialize the
default process group twice!")`` when it already exists (torch/distributed/distributed_c10d.py), and
``Accelerator()`` / ``PartialState()`` (accelerate/state.py) and ``deepspeed.init_distributed()`` create it
themselves under a launcher of several processes (``init-twice``).
"""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

from helpers.lint.contract_ast import ancestors, subtree
from helpers.lint.wrappers import call_name

if TYPE_CHECKING:
    from helpers.lint.python_rules import PythonLinter

_DATA = "https://docs.pytorch.org/docs/stable/data.html"
_SAMPLER = _DATA + "#torch.utils.data.distributed.DistributedSampler"
_RANDOM_SPLIT = "https://docs.pytorch.org/docs/stable/data.html#torch.utils.data.random_split"
_HF_SHUFFLE = "https://huggingface.co/docs/datasets/en/package_reference/main_classes#datasets.Dataset.shuffle"
_SK_SPLIT = "https://scikit-learn.org/stable/modules/generated/sklearn.model_selection.train_test_split.html"
_HASH = "https://docs.python.org/3/reference/datamodel.html#object.__hash__"
_INIT_TWICE = ("https://github.com/pytorch/pytorch/blob/main/torch/distributed/distributed_c10d.py "
               "(init_process_group: 'trying to initialize the default process group twice!')")

_SHARDS = re.compile(r"DistributedSampler|\.prepare\(|\bTrainer\(|DistributedDataParallel|\bDDP\(|"
                     r"FullyShardedDataParallel|fully_shard|deepspeed\.initialize|init_process_group")
"""A file whose data is split between ranks (a sampler, a prepared loader, a trainer) or that sets up a process group
(a data module next to it is read on every rank)."""

_ALL_RNGS = frozenset({"torch", "numpy", "random"})
_SEEDS_OF = {"manual_seed": {"torch"}, "manual_seed_all": {"torch"}, "set_seed": _ALL_RNGS,
             "seed_everything": _ALL_RNGS, "init_seeds": _ALL_RNGS, "fix_seed": _ALL_RNGS, "seed_all": _ALL_RNGS}
"""The generators a seeding call seeds: transformers' / accelerate's ``set_seed`` and Lightning's ``seed_everything``
seed Python's ``random``, NumPy and torch; ``torch.manual_seed`` only torch; ``<mod>.seed`` the module's own."""


def _seeded(call: ast.Call) -> set[str]:
    """The random generators ``call`` seeds with its first argument ({} when it is no seeding call)."""
    name = call_name(call)
    recv = ast.unparse(call.func.value) if isinstance(call.func, ast.Attribute) else ""
    if name == "seed":
        return {"numpy"} if recv in ("np.random", "numpy.random") else {"random"} if recv == "random" else set()
    if name in _SEEDS_OF:
        return set(_SEEDS_OF[name])
    # a project's own helper (utils.setup_seed(args.seed), misc.fix_random_seeds(...)) seeds all of them
    return set(_ALL_RNGS) if "seed" in name.lower() and not name.startswith(("get", "worker")) else set()


def _split_draws(call: ast.Call, hf: bool) -> tuple[str, str, str] | None:
    """``(generator, what, doc)`` when ``call`` splits or shuffles a dataset from a generator it was not given: torch's
    ``random_split`` without ``generator=``, scikit-learn's ``train_test_split`` without ``random_state=``, a Hugging
    Face dataset's ``.shuffle()`` / ``.train_test_split()`` without a seed (both draw the seed from NumPy's global
    state when given none: datasets/arrow_dataset.py), ``random.shuffle`` / ``np.random.shuffle`` /
    ``np.random.permutation``."""
    name = call_name(call)
    kws = {k.arg for k in call.keywords}
    recv = ast.unparse(call.func.value) if isinstance(call.func, ast.Attribute) else ""
    if name == "random_split" and "generator" not in kws and len(call.args) < 3:
        return "torch", "random_split without generator=", _RANDOM_SPLIT
    if name == "train_test_split" and not recv and "random_state" not in kws:
        return "numpy", "train_test_split without random_state=", _SK_SPLIT
    if name in ("shuffle", "train_test_split") and recv and hf and recv not in ("random", "np.random", "numpy.random") \
            and not call.args and not kws & {"seed", "generator"}:
        return "numpy", f".{name}() of a datasets.Dataset without seed=", _HF_SHUFFLE
    if name in ("shuffle", "permutation") and recv in ("random", "np.random", "numpy.random") and call.args:
        return ("random" if recv == "random" else "numpy"), f"{recv}.{name}", _SAMPLER
    return None


def rule_rank_split_differs(lt: PythonLinter) -> None:
    """A dataset split or shuffled from a random generator that no call seeds alike on every rank, in a file whose data
    is split between ranks: each process draws its own permutation, so each rank holds a different dataset and the
    sampler's index shards overlap (the contract of ``DistributedSampler``, :data:`_SAMPLER`).  A warning for a split
    (one rank's held-out samples are another's training samples: lm-sys/FastChat#1522 seeded its split for this) and
    for a file list shuffled before it is sharded by rank (files no rank reads for the whole run); info for a
    datasets ``.shuffle()`` alone (the sampler reshuffles each epoch: the ranks' shards overlap within an epoch).

    Not a finding: a generator seeded anywhere in the file with a value that is not a rank (``set_seed(args.seed)``,
    ``torch.manual_seed(0)``, a project's own ``setup_seed(...)``); a split under a rank gate (one rank draws it); a
    ``random.shuffle`` / ``np.random.permutation`` of the file list another rule reads (those only when the file
    shards by rank or uses a sampler, and never inside a function a loop calls per step: an augmentation).
    """
    if not _SHARDS.search(lt.text):
        return
    hf = bool(re.search(r"^\s*(from\s+datasets\s+import|import\s+datasets\b)", lt.text, re.M))
    seeded: set[str] = set()
    rank_seeded: set[str] = set()
    for c in lt._calls():
        got = _seeded(c)
        if got and c.args:
            (rank_seeded if lt.taint.is_rank(c.args[0]) else seeded).update(got)
        elif got and not c.args and call_name(c) in ("set_seed", "seed_everything"):
            seeded.update(got)  # seed_everything() picks a seed and exports it as PL_GLOBAL_SEED for every process
    for c in lt._calls():
        drawn = _split_draws(c, hf)
        if drawn is None:
            continue
        rng, what, doc = drawn
        if rng in seeded or lt._rank_gate(c) is not None:
            continue
        if what.startswith(("random.", "np.random", "numpy.random")) and not _shuffles_data(lt, c):
            continue
        per_rank = "seeded per rank" if rng in rank_seeded else "never seeded alike on every rank"
        # a reorder alone (datasets' .shuffle()) under a sampler that shuffles anyway costs overlap within an epoch
        # (like sampling with replacement across ranks): info; a split leaks held-out samples, and a file list
        # sharded once leaves files unread for the whole run: warning
        severity = "info" if what.startswith(".shuffle()") else "warning"
        lt.add("rank-split-differs", severity, c,
               f"{ast.unparse(c)[:60]}: {what} draws from the {rng} generator, {per_rank}: each rank splits or "
               "orders the dataset differently, so the ranks' shards overlap and miss samples (and one rank's "
               "held-out samples are another's training samples)",
               "give the split its own seeded generator (random_split(..., generator=torch.Generator()."
               "manual_seed(seed)), random_state=seed, ds.shuffle(seed=seed)) with the same seed on every rank, or "
               "split once on rank 0 and save the split", doc)


def _shuffles_data(lt: PythonLinter, call: ast.Call) -> bool:
    """``random.shuffle(x)`` / ``np.random.permutation(n)`` orders the data itself: outside any loop (a one-time
    preparation), on a name that reads like a dataset, file or index list."""
    if lt._in_loop(call):
        return False
    arg = ast.unparse(call.args[0]).lower()
    return bool(re.search(r"file|path|sample|data|shard|indices|idx|ids|list|items|lines|urls|records|len\(", arg))


def _flows_into_name(lt: PythonLinter, call: ast.Call) -> ast.AST | None:
    """Where the value of ``hash(...)`` becomes a name, a seed or a rank's share: the enclosing f-string, ``str()``,
    ``%`` / ``+`` / ``.format`` with a string, path join, seeding call or ``%`` by the world size; one assignment is
    followed to the uses of its name in the same function."""
    def sink(node: ast.AST) -> ast.AST | None:
        p = lt.parents.get(node)
        for _ in range(4):
            if p is None:
                return None
            if isinstance(p, ast.JoinedStr):
                return p
            if isinstance(p, ast.Call):
                name = call_name(p)
                if name in ("str", "format", "join", "Path") or _seeded(p) or name == "manual_seed":
                    return p
            if isinstance(p, ast.BinOp) and isinstance(p.op, ast.Mod):
                return p  # "%s" % hash(x), or hash(x) % world_size: a shard picked per process
            if isinstance(p, ast.BinOp) and isinstance(p.op, ast.Add) and any(
                    isinstance(s, ast.Constant) and isinstance(s.value, str) for s in (p.left, p.right)):
                return p
            if isinstance(p, (ast.Assign, ast.stmt)):
                return None
            p = lt.parents.get(p)
        return None

    got = sink(call)
    if got is not None:
        return got
    stmt = lt.parents.get(call)
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1 and isinstance(stmt.targets[0], ast.Name):
        name = stmt.targets[0].id
        scope = lt._enclosing_function(call) or lt.tree
        for n in subtree(scope):
            if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load) and n.lineno > call.lineno:
                got = sink(n)
                if got is not None:
                    return got
    return None


def rule_hash_per_process(lt: PythonLinter) -> None:
    """``hash(x)`` of a string-like value turned into a file name, cache key, seed or shard choice in a file whose ranks
    are separate processes: Python salts ``str`` / ``bytes`` hashes per process (:data:`_HASH`), so every rank computes
    a different value (a cache one rank writes that the others never find, a shard two ranks take and one none takes).

    Not a finding: a ``PYTHONHASHSEED`` the file sets; ``hash`` of an int constant or arithmetic (ints hash to
    themselves); a value used only inside the process (a dict key, a comparison)."""
    if not _SHARDS.search(lt.text) or "PYTHONHASHSEED" in lt.text:
        return
    for c in lt._calls():
        if not (isinstance(c.func, ast.Name) and c.func.id == "hash" and len(c.args) == 1):
            continue
        arg = c.args[0]
        if isinstance(arg, (ast.BinOp, ast.UnaryOp)) or isinstance(arg, ast.Constant) and \
                not isinstance(arg.value, (str, bytes)) or isinstance(arg, ast.Call) and call_name(arg) in ("len", "int"):
            continue
        where = _flows_into_name(lt, c)
        if where is None:
            continue
        lt.add("hash-per-process", "warning", c,
               f"{ast.unparse(c)[:50]} becomes part of {ast.unparse(where)[:60]}: Python salts str/bytes hashes per "
               "process, so each rank computes a different value (a different file, cache key, seed or shard)",
               "use a stable digest (hashlib.sha256(x.encode()).hexdigest()[:16], or zlib.crc32) or export "
               "PYTHONHASHSEED=0 in the launch environment", _HASH)


def _guarded(lt: PythonLinter, node: ast.AST) -> bool:
    """``node`` runs only when no group exists yet (``if not dist.is_initialized():``), or inside a ``try``."""
    p = lt.parents.get(node)
    while p is not None and not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if isinstance(p, (ast.If, ast.IfExp, ast.While)) and "is_initialized" in ast.unparse(p.test):
            return True
        if isinstance(p, ast.Try):
            return True
        p = lt.parents.get(p)
    return False


def _makes_group(call: ast.Call) -> str | None:
    """What the call is when it creates the default process group under a multi-process launcher."""
    name = call_name(call)
    recv = ast.unparse(call.func.value) if isinstance(call.func, ast.Attribute) else ""
    if name == "init_process_group":
        return "init_process_group"
    if name in ("Accelerator", "PartialState") and (not recv or recv.endswith("accelerate")):
        return f"{name}()"
    if name == "init_distributed" and recv.endswith("deepspeed"):
        return "deepspeed.init_distributed()"
    if name in ("launch", "launch_from_torch", "launch_from_slurm", "launch_from_openmpi") and recv.endswith("colossalai"):
        return f"colossalai.{name}()"  # calls init_process_group itself, untested (colossalai/initialize.py launch)
    return None


def rule_init_twice(lt: PythonLinter) -> None:
    """``init_process_group`` called where the default group already exists on the same path: after another
    ``init_process_group``, after ``Accelerator()`` / ``PartialState()`` or ``deepspeed.init_distributed()`` (which
    create it under a launcher of several processes) in the same function, with no ``destroy_process_group`` between
    and no ``is_initialized()`` test around it: torch raises ``ValueError: trying to initialize the default process
    group twice!`` (:data:`_INIT_TWICE`).  The makers ``Accelerator()`` and ``deepspeed.init_distributed()`` test
    ``is_initialized()`` themselves, so only an ``init_process_group`` coming second is a finding."""
    by_scope: dict[ast.AST, list[tuple[int, str, ast.Call]]] = {}
    for c in lt._calls():
        what = _makes_group(c)
        if what is not None or call_name(c) == "destroy_process_group":
            scope = lt._enclosing_function(c) or lt.tree
            by_scope.setdefault(scope, []).append((c.lineno, what or "destroy", c))
    for calls in by_scope.values():
        calls.sort(key=lambda t: t[0])
        made: tuple[int, str] | None = None
        for line, what, c in calls:
            if what == "destroy":
                made = None
                continue
            if (what == "init_process_group" or what.startswith("colossalai.")) and made is not None and \
                    not _guarded(lt, c) and \
                    not _other_branch(lt, c, made[0]):
                lt.add("init-twice", "error", c,
                       f"{what} here, after {made[1]} at line {made[0]} made the default process group on "
                       "this path: torch raises 'ValueError: trying to initialize the default process group twice!' "
                       "(Accelerator() and deepspeed.init_distributed() make it under a multi-process launcher)",
                       "keep one of the two, or test torch.distributed.is_initialized() before init_process_group",
                       _INIT_TWICE)
            made = (line, what)


def _other_branch(lt: PythonLinter, call: ast.Call, first_line: int) -> bool:
    """The earlier maker at ``first_line`` and ``call`` sit in different branches of one ``if`` (only one runs)."""
    p = lt.parents.get(call)
    while p is not None and not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        if isinstance(p, ast.If):
            lines_body = {getattr(n, "lineno", 0) for s in p.body for n in ast.walk(s)}
            lines_else = {getattr(n, "lineno", 0) for s in p.orelse for n in ast.walk(s)}
            if (call.lineno in lines_body and first_line in lines_else) or \
                    (call.lineno in lines_else and first_line in lines_body):
                return True
        p = lt.parents.get(p)
    return False


_CLOCKS = frozenset({"time", "monotonic", "perf_counter", "time_ns", "monotonic_ns", "now", "utcnow"})


def _clock(node: ast.AST) -> ast.Call | None:
    """A ``time.time()`` / ``monotonic()`` / ``perf_counter()`` / ``datetime.now()`` call inside ``node``."""
    return next((c for c in ast.walk(node) if isinstance(c, ast.Call) and call_name(c) in _CLOCKS and
                 isinstance(c.func, ast.Attribute) and ast.unparse(c.func.value).split(".")[-1] in ("time", "datetime")),
                None)


def _reads_clock(test: ast.AST, scope: ast.AST, assigned: dict[tuple[ast.AST, str], list[tuple[int, ast.AST]]]
                 ) -> ast.Call | None:
    """The clock reading ``test`` depends on: a clock call in it, or in the last assignment (in ``scope``, before the
    test) of a name it reads; ``assigned``: ``(scope, name) -> [(line, value)]`` of the file's plain assignments."""
    got = _clock(test)
    if got is not None:
        return got
    for name in {n.id for n in ast.walk(test) if isinstance(n, ast.Name)}:
        sets = [value for line, value in assigned.get((scope, name), ()) if line < test.lineno]
        if sets and isinstance(sets[-1], ast.Call) and re.search(r"(?i)sync|broadcast|all_?reduce|agree",
                                                                 call_name(sets[-1])):
            continue  # the clock's verdict made common to all ranks first (OLMo's synchronize_flag broadcasts it)
        if sets and (got := _clock(sets[-1])) is not None:
            return got
    return None


def rule_clock_gated_collective(lt: PythonLinter) -> None:
    """A collective under a condition on the wall clock (``if time.time() - last_ckpt >= interval:``): each rank
    reads its own clock, so near the threshold some ranks enter the branch and the others do not, and the
    collective (a barrier in a main-process save helper, an all-reduce) waits for ranks that never come.  Every rank
    of the group must call the same collectives in the same order (collective functions,
    https://docs.pytorch.org/docs/stable/distributed.html#collective-functions): decide on one rank and broadcast the
    decision, or count steps instead of seconds (speechbrain's intra-epoch checkpoints, speechbrain#1167).

    Not a finding: a branch under a rank gate too (one rank decides alone and calls no collective with others)."""
    assigned: dict[tuple[ast.AST, str], list[tuple[int, ast.AST]]] = {}
    for n in lt.nodes:  # once per file, in line order within each scope (the last one before a test counts)
        if isinstance(n, ast.Assign):
            for t in n.targets:
                if isinstance(t, ast.Name):
                    assigned.setdefault((lt._enclosing_function(n) or lt.tree, t.id), []).append((n.lineno, n.value))
    for v in assigned.values():
        v.sort(key=lambda x: x[0])
    for node in lt.nodes:
        if not isinstance(node, (ast.If, ast.While)):
            continue
        scope = lt._enclosing_function(node) or lt.tree
        clock = _reads_clock(node.test, scope, assigned)
        if clock is None or lt._rank_gate(node) is not None or lt.taint.rank_test(node.test):
            continue
        coll = next(((c, name) for st in node.body for c in subtree(st) if isinstance(c, ast.Call)
                     and (name := lt.collective_name(c)) and lt._rank_gate(c) in (None, node)), None)
        if coll is None:
            continue
        call, name = coll
        lt.add("clock-gated-collective", "warning", call,
               f"{name} runs under `{ast.unparse(node.test)[:70]}`, a test of this rank's own clock "
               f"({ast.unparse(clock)}): ranks cross the threshold at different moments, so some enter the branch "
               "and the others never join the collective (a hang)",
               "decide on one rank and broadcast it (flag = torch.tensor(int(due)); dist.broadcast(flag, 0)), or "
               "decide by a step count every rank shares", "https://docs.pytorch.org/docs/stable/distributed.html"
               "#collective-functions")


_DIR_NAME = re.compile(r"(?i)dir|path|folder|root|output|ckpt|checkpoint|save")
_EVERY_RANK_SAVES = frozenset({"save_state", "save_checkpoint"})
"""Saves that every rank calls with the same directory and writes its own files into: Accelerate's
``save_state`` (each process's RNG state, its model/optimizer shards under DeepSpeed or FSDP), a DeepSpeed engine's
``save_checkpoint`` ("all processes must call this method", each writing its ZeRO partition)."""
_DS_SAVE = "https://deepspeed.readthedocs.io/en/latest/model-checkpointing.html"


def _target_key(t: ast.AST) -> str | None:
    return t.id if isinstance(t, ast.Name) else (t.attr if isinstance(t, ast.Attribute) else None)


def clock_paths(lt: PythonLinter) -> dict[str, int]:
    """Names and attributes assigned a path derived from this process's clock (``now = datetime.now(); run_dir =
    f"{now:%H-%M-%S}"; self.output_dir = Path("outputs") / run_dir``): ``{name or attribute: line}``, for those whose name says directory/path/output.  Followed through plain
    assignments (names and attributes, by their last component) to a fixed point."""
    if not any(w in lt.text for w in ("now(", "time(", "strftime(")):
        return {}
    clocked: set[str] = set()
    out: dict[str, int] = {}
    assigns = [n for n in lt.nodes if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None]
    for _ in range(4):
        grew = False
        for n in assigns:
            value = n.value  # type: ignore[union-attr]
            reads = {x.id if isinstance(x, ast.Name) else x.attr for x in ast.walk(value)
                     if isinstance(x, (ast.Name, ast.Attribute))}
            timed = _clock(value) is not None or bool(reads & clocked) or \
                any(isinstance(c, ast.Call) and call_name(c) == "strftime" and isinstance(c.func, ast.Attribute)
                    and ast.unparse(c.func.value) == "time" and len(c.args) == 1 for c in ast.walk(value))
            if not timed:
                continue
            for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                key = _target_key(t)
                if key and key not in clocked:
                    clocked.add(key)
                    grew = True
                    if _DIR_NAME.search(key):
                        out.setdefault(key, n.lineno)
        if not grew:
            break
    return out


def every_rank_save_dirs(lt: PythonLinter) -> dict[str, int]:
    """The names and attributes the directory of an every-rank save is built from (``accelerator.save_state(ckpt_dir)``
    with ``ckpt_dir = get_step_checkpoint_dir(cfg.output_dir, step)``: ``{"output_dir": line, "ckpt_dir": line}``),
    one level of assignment followed; only names that say directory/path/output.  Empty in a file that broadcasts
    (``broadcast_object_list``: the directory may be made common there)."""
    out: dict[str, int] = {}
    if re.search(r"\bbroadcast\w*\(", lt.text):
        return out
    values = {_target_key(t): n.value for n in lt.nodes if isinstance(n, ast.Assign) for t in n.targets
              if _target_key(t)}
    for c in lt._calls():
        if call_name(c) not in _EVERY_RANK_SAVES or not (c.args or c.keywords) or lt._rank_gate(c) is not None:
            continue
        arg = c.args[0] if c.args else c.keywords[0].value
        for x in [arg] + [values[k] for k in {_target_key(y) for y in ast.walk(arg)} if k in values]:
            for y in ast.walk(x):
                key = _target_key(y)
                if key and _DIR_NAME.search(key):
                    out.setdefault(key, c.lineno)
    return out


def rule_clock_dependent_path(lt: PythonLinter) -> None:
    """``clock-dependent-path``: the directory of an every-rank save (:data:`_EVERY_RANK_SAVES`) built from this
    process's clock (:func:`clock_paths`) in the same file: each rank reads its own clock, so ranks started across a
    tick of the format (a second for ``%H-%M-%S``) name different directories and the checkpoint's per-rank files
    land apart (a checkpoint missing shards or RNG states that load_state cannot read back; OpenTau's fix
    broadcasts rank 0's output_dir).  Accelerate's ``save_state`` and DeepSpeed's ``save_checkpoint`` are called by
    every process with one directory (:data:`_DS_SAVE`).  The same across files:
    :func:`helpers.lint.cross_rules.clock_path_across`."""
    clocked = clock_paths(lt)
    attrs = {t.attr for n in lt.nodes if isinstance(n, (ast.Assign, ast.AnnAssign))
             for t in (n.targets if isinstance(n, ast.Assign) else [n.target]) if isinstance(t, ast.Attribute)}
    lt.facts.clock_paths = {k: v for k, v in clocked.items() if k in attrs}  # another file reaches attributes only
    saves = every_rank_save_dirs(lt)
    lt.facts.save_dir_names = saves
    for key, line in saves.items():
        if key in clocked:
            lt.add("clock-dependent-path", "warning", _line_node(line),
                   f"this save's directory comes from {key} (line {clocked[key]}), built from this process's clock: "
                   "every rank reads its own, so ranks started across a tick name different directories and the "
                   "checkpoint's per-rank files land apart", "decide the directory on rank 0 and broadcast it "
                   "(dist.broadcast_object_list([out_dir], src=0)), or name it from the config / job id", _DS_SAVE)
            return


def _attr_of_name(node: ast.AST | None) -> str | None:
    """``args.seed`` -> ``seed`` (an attribute of a plain name that is not ``self``/``cls``); None otherwise."""
    if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) and node.value.id not in ("self", "cls"):
        return node.attr
    return None


def _per_rank(lt: PythonLinter, node: ast.AST | None, depth: int = 3) -> bool:
    """``node`` holds a value that differs per rank: a rank value (the taint pass), an element picked by a rank
    (``worker_seeds[local_rank]``), arithmetic on one, or a name assigned one of those (followed ``depth`` times)."""
    if node is None or depth < 0:
        return False
    if lt.taint.is_rank_value(node) or (isinstance(node, ast.Subscript) and lt.taint.is_rank(node.slice)):
        return True
    if isinstance(node, ast.BinOp):
        return _per_rank(lt, node.left, depth) or _per_rank(lt, node.right, depth)
    if isinstance(node, ast.Name):
        return any(isinstance(a, ast.Assign) and any(isinstance(t, ast.Name) and t.id == node.id for t in a.targets)
                   and _per_rank(lt, a.value, depth - 1) for a in lt.nodes)
    return False


def _clock_seed(lt: PythonLinter, seed: ast.AST, at: ast.AST) -> bool:
    """``seed`` (at ``at``) reads the clock (``time.time()``), directly or through the name's last assignments in
    the function: each process reads its own instant (NVlabs/LongLive seeded a sampler with ``time.time() * rank``)."""
    sources = [seed]
    if isinstance(seed, ast.Name):
        fn = lt._enclosing_function(at) or lt.tree
        sources += [a.value for a in subtree(fn) if isinstance(a, ast.Assign) and a.lineno < at.lineno and
                    any(isinstance(t, ast.Name) and t.id == seed.id for t in a.targets)]
    return any(isinstance(n, ast.Call) and ast.unparse(n.func) in ("time.time", "time.time_ns", "time.perf_counter")
               for x in sources for n in ast.walk(x))


def rule_sampler_seed_per_rank(lt: PythonLinter) -> None:
    """``DistributedSampler(..., seed=s)`` with a seed that depends on the rank: the sampler shuffles the whole index
    list with ``seed + epoch`` on every rank and then takes this rank's slice, so its documented contract is that the
    seed "should be identical across all processes in the distributed group" (:data:`_SAMPLER`); seeded per rank
    (or from each process's clock, :func:`_clock_seed`), the ranks slice different permutations, their shards overlap
    and some samples are never seen (mlcommons/training#625: the UNet3D reference passed each worker's own seed).

    Also records, for :func:`helpers.lint.cross_rules.sampler_seed_across`, the attributes this file gives a rank value
    (``flags.seed = worker_seeds[local_rank]``: :attr:`PyFacts.rank_attrs`) and the attribute a sampler here takes its
    seed from (``seed=flags.seed``: :attr:`PyFacts.sampler_seed_attrs`), so a seed set per rank in one file and read by
    the sampler of another is found too.
    """
    facts = lt.facts
    for node in lt.nodes:
        if isinstance(node, ast.Assign) and any(_attr_of_name(t) for t in node.targets) and _per_rank(lt, node.value):
            facts.rank_attrs.update(a for t in node.targets if (a := _attr_of_name(t)))
    if "DistributedSampler" not in lt.text:
        return
    for c in lt._calls():
        if not call_name(c).endswith("DistributedSampler"):
            continue
        seed = next((k.value for k in c.keywords if k.arg == "seed"), c.args[4] if len(c.args) > 4 else None)
        if seed is None:
            continue
        attr = _attr_of_name(seed)
        ranked = _per_rank(lt, seed) or bool(attr and attr in facts.rank_attrs)
        clock = _clock_seed(lt, seed, c)
        if ranked or clock:
            lt.add("sampler-seed-per-rank", "error", c,
                   f"DistributedSampler(seed={ast.unparse(seed)[:40]}): the seed is {'rank' if ranked else 'clock'}-"
                   "dependent, so each rank shuffles the index list with its own permutation and takes its slice of "
                   "it: the shards overlap and some samples are never seen in an epoch",
                   "give every rank the same sampler seed (the run's base seed, before any per-rank offset), "
                   "sampler.set_epoch(epoch) for a new order each epoch; seed the per-rank augmentation streams "
                   "separately", _SAMPLER)
        elif attr:
            facts.sampler_seed_attrs.append((attr, c.lineno, ast.unparse(seed)))


_BY_PROCESS = re.compile(r"\b(?:rank|world_size|num_replicas|num_processes|process_index|process_rank|global_rank|"
                         r"get_rank|get_world_size|node_rank|RANK|WORLD_SIZE|split_dataset_by_node|num_shards|shard_id)\b")
_DATA_PARALLEL = re.compile(r"DistributedDataParallel|\bDDP\(|FullyShardedDataParallel|\bFSDP\(|FSDPStrategy|"
                            r"DDPStrategy|Fabric\(|Accelerator\(|deepspeed\.initialize|init_process_group|"
                            r"idist\.(?:Parallel|auto_model|auto_dataloader)")


def rule_iterable_not_sharded(lt: PythonLinter) -> None:
    """An ``IterableDataset`` subclass that splits its stream by DataLoader worker (``get_worker_info``) and never by
    process: under data parallel training every rank iterates the same stream.  ``DistributedSampler`` (and Lightning
    Fabric's / Accelerate's loader set-up, which inject it) work on map-style datasets only; an iterable dataset "is
    replicated on each worker process ... the replicas must be configured differently to avoid duplicated data", and
    the ranks of a job are replicas too (:data:`_DATA`; Lightning-AI/lit-llama's PackedDataset, fixed by adding
    ``num_processes`` / ``process_rank``).  Reported where the class is built, when that file or another linted file
    trains data parallel (:func:`helpers.lint.cross_rules.iterable_not_sharded_across` for two files)."""
    facts = lt.facts
    facts.trains_data_parallel = bool(_DATA_PARALLEL.search(lt.text))
    for c in lt._calls():
        name = call_name(c)
        if name and name not in facts.constructs:
            facts.constructs[name] = c.lineno
    for node in lt.nodes:
        if not (isinstance(node, ast.ClassDef) and any(ast.unparse(b).endswith("IterableDataset") for b in node.bases)):
            continue
        body = ast.unparse(node)
        if "get_worker_info" in body and not _BY_PROCESS.search(body):
            facts.unsharded_iterables[node.name] = node.lineno
    if not facts.trains_data_parallel:
        return
    for name, line in facts.unsharded_iterables.items():
        if name in facts.constructs:
            lt.add("iterable-not-sharded", "warning", _line_node(line),
                   f"{name} (an IterableDataset) splits its stream by DataLoader worker only: under data parallel "
                   "training every rank reads the same samples (no sampler shards an iterable dataset)",
                   f"give {name} the rank and world size and keep every world_size-th shard (after the worker split), "
                   "or use datasets' split_dataset_by_node", _DATA + "#torch.utils.data.IterableDataset")


_HF_SPLIT_BY_NODE = "https://huggingface.co/docs/datasets/en/use_with_pytorch#distributed"


def rule_streaming_not_sharded(lt: PythonLinter) -> None:
    """``iterable-not-sharded`` for ``datasets``' streaming datasets: ``load_dataset(..., streaming=...)`` (an
    ``IterableDataset``, also after ``.map`` / ``.select_columns``) handed to a plain ``DataLoader`` in a file that
    wraps its model in DDP/FSDP, with no ``split_dataset_by_node`` and no ``.shard(...)`` of it: "To split your
    dataset across your training nodes, you can use datasets.distributed.split_dataset_by_node" (``_HF_SPLIT_BY_NODE``);
    without it every rank iterates the same stream (Smith42/astroPT).  Not where the loader goes through
    ``accelerator.prepare`` (Accelerate shards iterable datasets itself)."""
    if "streaming" not in lt.text or "DataLoader" not in lt.text or not _DATA_PARALLEL.search(lt.text) or \
            re.search(r"split_dataset_by_node|\.shard\(|accelerator\.prepare|\.prepare\(", lt.text):
        return
    streams: set[str] = set()
    for n in lt.nodes:
        if not (isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)):
            continue
        calls = [c for c in ast.walk(n.value) if isinstance(c, ast.Call)]
        loads = any(call_name(c) == "load_dataset" and any(
            k.arg == "streaming" and not (isinstance(k.value, ast.Constant) and not k.value.value) for k in c.keywords)
            for c in calls)
        derived = isinstance(n.value, ast.Call) and any(isinstance(x, ast.Name) and x.id in streams
                                                        for x in ast.walk(n.value))
        if loads or derived:
            streams.add(n.targets[0].id)
    if not streams:
        return
    for c in lt._calls():
        if call_name(c) != "DataLoader" or not c.args or any(k.arg == "sampler" for k in c.keywords):
            continue
        held = next((x.id for x in ast.walk(c.args[0]) if isinstance(x, ast.Name) and x.id in streams), None)
        if held is None:
            continue
        lt.add("iterable-not-sharded", "warning", c,
               f"DataLoader({held}) reads a streaming dataset (an IterableDataset) that nothing splits by rank: under "
               "data parallel training every rank iterates the same stream (the same samples N times)",
               f"{held} = split_dataset_by_node({held}, rank=rank, world_size=world_size)", _HF_SPLIT_BY_NODE)
        return


def rule_rank_shard_unused(lt: PythonLinter) -> None:
    """This rank's shard is computed and never read: ``idx = idx.split(n // world_size)[rank]`` (or a slice or
    ``chunk`` picked by the rank) assigned to a name nothing reads afterwards in the same function, so the loader goes
    on with the whole data and every rank trains on every sample (pyg-team/pytorch_geometric#6312: the split index was
    dead code while ``NeighborLoader(input_nodes=data.train_mask)`` took all nodes).  The contract is
    DistributedSampler's: each rank loads its own subset (:data:`_SAMPLER`)."""
    for node in lt.nodes:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)):
            continue
        value = node.value
        if not (isinstance(value, ast.Subscript) and lt.taint.is_rank(value.slice) and
                isinstance(value.value, ast.Call) and call_name(value.value) in ("split", "chunk", "tensor_split",
                                                                                   "array_split")):
            continue
        name = node.targets[0].id
        scope = lt._enclosing_function(node) or lt.tree
        read = any(isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load) and n.lineno > node.lineno
                   for n in subtree(scope))
        if read:
            continue
        lt.add("rank-shard-unused", "warning", node,
               f"{name} = {ast.unparse(value)[:50]} picks this rank's shard, and nothing reads {name} afterwards: the "
               "data loader still goes through the whole data on every rank", f"give the loader {name} (for example "
               f"input_nodes={name} / Subset(dataset, {name}))", _SAMPLER)


_WORLD_STEP = re.compile(r"(?i)^(?:\w+\.)*(?:nranks|n_ranks|world_size|num_replicas|num_processes|num_workers_total|"
                         r"ngpus|n_gpus|num_gpus|nprocs|get_world_size\(\)|world_size\(\))$")


def rule_rank_stride_without_rank(lt: PythonLinter) -> None:
    """``rank-shard-unused`` for a stride by the world size that starts at 0 where a rank is at hand:
    ``range(0, len(data), nranks)`` or ``data[::world_size]`` in a function that has the rank (a parameter or a
    variable named so, or a value from it) gives every rank the same elements, the first of each group of
    ``nranks`` (ColBERT's ``Examples.tolist(rank, nranks)``, fixed to ``range(rank, len(data), nranks)``).  The
    contract is DistributedSampler's: rank r takes indices r, r + N, r + 2N... (:data:`_SAMPLER`)."""
    for node in lt.nodes:
        if isinstance(node, ast.Call) and call_name(node) == "range" and len(node.args) == 3:
            start, step = node.args[0], node.args[2]
        elif isinstance(node, ast.Slice) and node.step is not None:
            start, step = node.lower, node.step
        else:
            continue
        if not _WORLD_STEP.match(ast.unparse(step)) or not (start is None or
                                                           isinstance(start, ast.Constant) and start.value == 0):
            continue
        fn = lt._enclosing_function(node)
        if fn is None:
            continue
        params = {a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]}
        has_rank = {"rank", "local_rank", "global_rank", "process_index", "rank_id"} & params or any(
            lt.taint.is_rank(n) for n in subtree(fn) if isinstance(n, ast.Name))
        if not has_rank:
            continue
        lt.add("rank-shard-unused", "warning", node,
               f"{ast.unparse(node)[:50]} strides by {ast.unparse(step)} from 0, while this function has the rank: "
               "every rank takes the same elements (the first of each group), and the others are never used",
               f"start the stride at the rank: range(rank, len(data), {ast.unparse(step)}) / "
               f"data[rank::{ast.unparse(step)}]", _SAMPLER)


_RANK_FIRST = re.compile(r"barrier|wait_for_everyone|main_process_first|local_main_process_first|one_rank_first|"
                         r"rank_zero_first|zero_first|local_rank_zero_first")


_FILE_LOCK = re.compile(r"^(?:FileLock|SoftFileLock|UnixFileLock|InterProcessLock|file_lock)$")
"""A lock on a file (py-filelock's ``FileLock``, fasteners' ``InterProcessLock``): the processes that share the file
system take turns inside it, so the first downloads and the others find the files."""


def _rank_first_guarded(lt: PythonLinter, node: ast.AST, memo: dict[int, tuple[bool, bool]]) -> bool:
    """``node`` runs under a rank gate, inside a file lock (:data:`_FILE_LOCK`), or in a function that makes the ranks
    take turns (a barrier, Accelerate's ``main_process_first``, ignite's ``one_rank_first``): the rank-first idiom
    around a download.  ``memo`` keeps each function's answer (a file has hundreds of calls and few functions)."""
    if lt._rank_gate(node) is not None:
        return True
    if any(isinstance(p, (ast.With, ast.AsyncWith)) and any(
            isinstance(i.context_expr, ast.Call) and _FILE_LOCK.search(call_name(i.context_expr))
            for i in p.items) for p in ancestors(lt, node)):
        return True  # `with FileLock(path):` the processes of a node take turns (Ray Train's examples)
    scope = lt._enclosing_function(node) or lt.tree
    if id(scope) not in memo:  # (takes turns at all, by a *_first() context) per function, read once
        text = lt.text if scope is lt.tree else lt.source_lines(scope)
        memo[id(scope)] = (bool(_RANK_FIRST.search(text)), "first" in text)
    turns, first = memo[id(scope)]
    if not turns:
        return False
    if first:
        return True  # main_process_first() / one_rank_first() / torch_distributed_zero_first(): the turns are taken
    # a barrier orders only what comes after it (PyG's ogbg example waits after training, not before its download)
    line = getattr(node, "lineno", 0)
    return any(isinstance(c, ast.Call) and call_name(c) in ("barrier", "wait_for_everyone") and c.lineno < line
               and _on_path(lt, c, node, scope) for c in subtree(scope))


def _branches(lt: PythonLinter, node: ast.AST, scope: ast.AST) -> set[tuple[ast.If, bool]]:
    """The ``if`` statements that hold ``node`` below ``scope``, each with the arm it is in (True: the body)."""
    out: set[tuple[ast.If, bool]] = set()
    child, p = node, lt.parents.get(node)
    while p is not None and p is not scope:
        if isinstance(p, ast.If) and child is not p.test:
            out.add((p, any(child is s for s in p.body)))
        child, p = p, lt.parents.get(p)
    return out


def _on_path(lt: PythonLinter, barrier: ast.AST, node: ast.AST, scope: ast.AST) -> bool:
    """The barrier is on the way to ``node``: every ``if`` arm that holds the barrier holds ``node`` too (composer's
    barrier in the FFCV branch does not order the plain branch's download), rank tests aside (``if rank != 0:
    barrier()`` is the rank-first idiom itself)."""
    held = {(i, arm) for i, arm in _branches(lt, barrier, scope) if not lt.taint.rank_test(i.test)}
    return held <= _branches(lt, node, scope)


_MULTI_PROCESS = re.compile(r"""environ(?:\.get)?[\[(]\s*['"](?:LOCAL_)?RANK['"]|getenv\(\s*['"](?:LOCAL_)?RANK['"]|"""
                            r"""\.get_rank\(\)""")
"""A script that reads its rank (from the launcher's environment, or asks the process group) is run as several
processes (TabPFN's finetuning example, "torchrun --nproc-per-node=N", gates its prints on LOCAL_RANK)."""


def _sklearn_fetch(lt: PythonLinter, c: ast.Call) -> bool:
    """``sklearn.datasets.fetch_*(...)`` (``fetch_openml``, ``fetch_covtype``...): each fetcher downloads into the
    shared ``data_home`` cache when the data is not there yet ("Load the ... dataset (download it if necessary)",
    https://scikit-learn.org/stable/api/sklearn.datasets.html), with no lock between processes."""
    name = call_name(c)
    if not name.startswith("fetch_"):
        return False
    func = ast.unparse(c.func)
    return "sklearn" in func or lt.import_origins.get(name, "").startswith("sklearn")


def _made_before_spawn(lt: PythonLinter) -> set[str]:
    """Names called in the launching process before it starts the workers (``PygGraphPropPredDataset(...)`` in
    ``__main__``, then ``mp.spawn(run, ...)``: PyG's distributed_batching.py downloads once, so the workers find the
    files): a call outside the spawned functions, in a scope with a ``spawn`` / ``start_processes`` call after it."""
    out: set[str] = set()
    if not lt.spawned_funcs:
        return out
    spawns = [c for c in lt._calls() if call_name(c) in ("spawn", "start_processes")]
    for c in lt._calls():
        fn = lt._enclosing_function(c)
        if getattr(fn, "name", None) in lt.spawned_funcs:
            continue
        if any(lt._enclosing_function(s) is fn and s.lineno > c.lineno for s in spawns):
            out.add(call_name(c))
    return out


def _pyg_dataset(lt: PythonLinter, c: ast.Call) -> bool:
    """A dataset of PyG (``torch_geometric.datasets.Reddit(root)``) or OGB (``PygGraphPropPredDataset(name, root)``):
    their constructors download and process into ``root`` when the files are not there ("the raw files are
    downloaded ... and processed", https://pytorch-geometric.readthedocs.io/en/latest/tutorial/create_dataset.html),
    with nothing between processes."""
    name = call_name(c)
    origin = lt.import_origins.get(name, "") or ast.unparse(c.func)
    return origin.startswith("torch_geometric.datasets") or origin.startswith("ogb.") and name.endswith("Dataset")


def rule_download_every_rank(lt: PythonLinter) -> None:
    """A dataset downloaded (``download=True``) by every rank at once: each process fetches and unpacks into the same
    ``root`` (the dataset classes check for finished files, not for a download in progress: torchvision's
    ``download`` "downloads the dataset ... If dataset is already downloaded, it is not downloaded again"), so the
    ranks race on the same files (truncated archives, failed checksums).  The idiom: rank 0 (or each node's local
    rank 0) downloads while the others wait in a barrier, then they read (pytorch-ignite/code-generator#60).  Reported
    where the download runs ungated in a data parallel file, or (:func:`helpers.lint.cross_rules.download_every_rank_across`)
    where such a file calls another linted file's function that downloads."""
    facts = lt.facts
    memo: dict[int, tuple[bool, bool]] = {}
    before_spawn = _made_before_spawn(lt)
    one = re.search(r"(?:Fabric|Trainer)\([^)]*\bdevices\s*=\s*1\b", lt.text) and not re.search(
        r"init_process_group|DistributedDataParallel|num_nodes\s*=\s*(?!1\b)", lt.text)  # (Fabric(devices=1): one
    # process, the dcgan example)
    several = (facts.trains_data_parallel or bool(_MULTI_PROCESS.search(lt.text))) and not one
    flagged = {c for c in lt._calls() if any(k.arg == "download" and not (isinstance(k.value, ast.Constant) and
                                                                          k.value.value in (False, None))
                                             for k in c.keywords)}
    # a download flag (download=self.download) that the file itself guards on one rank elsewhere (composer's FFCV
    # path: `if dist.get_local_rank() == 0: CIFAR10(..., download=self.download)`): its other, ungated build of the
    # same kind downloads on every process of the job the file knows it runs in
    own_guard = any(lt._rank_gate(c) is not None or _rank_first_guarded(lt, c, memo) for c in flagged)
    for c in lt._calls():
        unguarded_flag = own_guard and c in flagged and lt._rank_gate(c) is None
        if not (any(k.arg == "download" and isinstance(k.value, ast.Constant) and k.value.value is True
                    for k in c.keywords) or _sklearn_fetch(lt, c) or _pyg_dataset(lt, c) or unguarded_flag) or \
                _rank_first_guarded(lt, c, memo) or call_name(c) in before_spawn:
            continue
        if unguarded_flag and not several:
            lt.add("download-every-rank", "warning", c,
                   f"{ast.unparse(c)[:50]} downloads into the same root on every rank, while this file builds the "
                   "same kind of dataset on one rank first elsewhere: the processes race on the same archive",
                   "do as the other path does: download on one (local) rank first, barrier, then build on every rank",
                   "https://docs.pytorch.org/vision/stable/datasets.html")
            continue
        fn = lt._enclosing_function(c)
        if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)):
            facts.download_funcs.setdefault(fn.name, c.lineno)
        if several:
            lt.add("download-every-rank", "warning", c,
                   f"{ast.unparse(c)[:50]} downloads on every rank at once into the same root: the processes race on "
                   "the same archive and files", "download on one rank first: if rank != 0: barrier(); download; if "
                   "rank == 0: barrier() (or accelerator.main_process_first(), idist.one_rank_first())",
                   "https://docs.pytorch.org/vision/stable/datasets.html")
    for c in lt._calls():
        name = call_name(c)
        if name and name not in facts.ungated_calls and not _rank_first_guarded(lt, c, memo):
            facts.ungated_calls[name] = c.lineno


_LISTINGS = frozenset({"glob", "listdir", "iterdir", "scandir", "rglob"})


def rule_listing_numbered_dir(lt: PythonLinter) -> None:
    """A run directory numbered by counting what the output folder already holds (``experiment_index =
    len(glob(f"{outputs}/*")); os.makedirs(f"{outputs}/{experiment_index:03d}-...")``), made on every rank: each
    process lists the folder at its own moment, so a rank that lists after another rank made its directory takes the
    next number, and the ranks write into different directories (hpcaitech/Open-Sora#91; DiT's train.py does the
    same count under ``if rank == 0``).  The functions that do it are recorded (``PyFacts.listing_dir_funcs``) for
    :func:`helpers.lint.cross_rules.listing_dir_across`; a call of one here, outside any rank gate, in a file that
    trains data parallel is the finding."""
    if "len(" not in lt.text or not any(w + "(" in lt.text for w in _LISTINGS):
        return
    funcs: dict[str, int] = {}
    for name, fn in lt.functions.items():
        counted: set[str] = set()  # names holding the count, and names built from them (exp_name, exp_dir)
        first = 0
        assigns = [(n, {x.id for x in ast.walk(n.value) if isinstance(x, ast.Name)},
                    any(isinstance(x, ast.Call) and call_name(x) == "len" and x.args and any(
                        isinstance(y, ast.Call) and call_name(y) in _LISTINGS for y in ast.walk(x.args[0]))
                        for x in ast.walk(n.value)))
                   for n in subtree(fn) if isinstance(n, ast.Assign) and lt._rank_gate(n) is None]
        for _ in range(4):
            for n, reads, counts in assigns:
                if counts or reads & counted:
                    counted.update(t.id for t in n.targets if isinstance(t, ast.Name))
                    first = min(first or n.lineno, n.lineno) if counts else first
        made = [n for n in subtree(fn) if isinstance(n, ast.Call) and call_name(n) in ("makedirs", "mkdir")
                and lt._rank_gate(n) is None and any(isinstance(x, ast.Name) and x.id in counted
                                                     for a in [*n.args, getattr(n.func, "value", n)]
                                                     for x in ast.walk(a))]
        if first and made:
            funcs[name] = first
    lt.facts.listing_dir_funcs = funcs
    if not funcs or not lt.facts.trains_data_parallel:
        return
    for c in lt._calls():
        name = call_name(c)
        if name in funcs and lt._rank_gate(c) is None and not lt._after_rank_exit(c) and \
                lt._enclosing_function(c) is not lt.functions[name]:
            fn = lt._enclosing_function(c)
            if fn is not None and lt._function_only_called_gated(fn):
                continue
            lt.add("write-on-every-rank", "warning", c, listing_message(name, f"line {funcs[name]}"),
                   LISTING_FIX, OPEN_SORA)
            return


OPEN_SORA = "https://github.com/hpcaitech/Open-Sora/issues/91"
"""The report of the listing-numbered run directory race."""
LISTING_FIX = ("number and make the directory on rank 0, then broadcast its name (dist.broadcast_object_list), or "
                "name it from the job id / config")


def listing_message(name: str, where: str) -> str:
    """The finding's text for ``name``, the function that numbers the directory, counted at ``where``."""
    return (f"{name}(...) numbers a new run directory by counting the output folder's entries ({where}) and every "
            "rank calls it: a rank that lists the folder after another made its directory takes the next number, so "
            "the ranks write into different directories")


def _line_node(line: int) -> ast.AST:
    """A bare node at ``line`` for a finding whose place is a line number."""
    node = ast.Pass()
    node.lineno, node.col_offset = line, 0
    return node


def run(lt: PythonLinter) -> None:
    """Run this module's rules on ``lt``."""
    rule_rank_split_differs(lt)
    rule_hash_per_process(lt)
    rule_init_twice(lt)
    rule_clock_gated_collective(lt)
    rule_sampler_seed_per_rank(lt)
    rule_iterable_not_sharded(lt)
    rule_streaming_not_sharded(lt)
    rule_rank_shard_unused(lt)
    rule_rank_stride_without_rank(lt)
    rule_download_every_rank(lt)
    rule_listing_numbered_dir(lt)
    rule_clock_dependent_path(lt)


__all__ = ["LISTING_FIX", "OPEN_SORA", "clock_paths", "every_rank_save_dirs", "listing_message", "rule_clock_dependent_path", "rule_clock_gated_collective", "rule_hash_per_process", "rule_init_twice", "rule_listing_numbered_dir", "rule_rank_split_differs",
           "rule_download_every_rank", "rule_iterable_not_sharded", "rule_rank_shard_unused", "rule_rank_stride_without_rank",
           "rule_sampler_seed_per_rank", "rule_streaming_not_sharded", "run"]
