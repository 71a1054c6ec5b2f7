"""Rules on when ``DistributedDataParallel`` all-reduces gradients during gradient accumulation.

The contract (torch/nn/parallel/distributed.py): the wrapper decides in its FORWARD whether the coming backward
all-reduces.  ``_pre_forward`` arms the reducer only ``if torch.is_grad_enabled() and
self.require_backward_grad_sync`` (``self.reducer.prepare_for_forward()``), and the end of the forward calls
``self.reducer.prepare_for_backward(...)`` under the same test; ``no_sync()`` only sets
``self.require_backward_grad_sync = False`` for the duration of its block, and its docstring warns "The forward pass
should be included inside the context manager, or else gradients will still be synchronized."
(https://docs.pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html#torch.nn.parallel.DistributedDataParallel.no_sync).
So the flag (or the ``no_sync`` block) must cover the forward of each non-final micro-step, and the one synchronised
micro-step must be the one whose gradients reach ``optimizer.step()``.
"""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

from helpers.lint.contract_ast import subtree
from helpers.lint.wrappers import DDP_CTOR, assign_targets, call_name, prepare_bindings

if TYPE_CHECKING:
    from helpers.lint.python_rules import PythonLinter

_DDP_DOC = "https://docs.pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html"
_LOSS_OPS = frozenset({"backward", "scale", "mean", "sum", "div", "float", "detach", "item", "perf_counter", "time"})
"""Calls that may sit in a ``no_sync`` block without being a forward (loss arithmetic, a scaler, timers)."""


def _calls(node: ast.AST) -> list[ast.Call]:
    return [n for n in ast.walk(node) if isinstance(n, ast.Call)]


def _loop_position(lt: PythonLinter, node: ast.AST) -> tuple[list[ast.stmt], int] | None:
    """``(body, i)``: the body of the innermost loop around ``node`` and the index of its statement holding ``node``."""
    child, p = node, lt.parents.get(node)
    while p is not None and not isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)):
        if isinstance(p, (ast.For, ast.While, ast.AsyncFor)) and child in p.body:
            return p.body, p.body.index(child)  # type: ignore[arg-type]
        child, p = p, lt.parents.get(p)
    return None


def rule_sync_flag_after_forward(lt: PythonLinter) -> None:
    """``model.require_backward_grad_sync = ...`` set after ``model(...)`` and before ``backward()`` in the same
    micro-step: the forward already read the previous value, so this backward syncs (or not) by the last step's
    choice (karpathy/build-nanogpt#30 showed the loss curve it costs)."""
    for node in lt.nodes:
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Attribute)
                and node.targets[0].attr == "require_backward_grad_sync"):
            continue
        model = ast.unparse(node.targets[0].value)
        where = _loop_position(lt, node)
        if where is None:
            continue
        body, i = where
        forward = next((c for s in body[:i] for c in _calls(s) if ast.unparse(c.func) == model), None)
        backward = any(call_name(c) == "backward" for s in body[i:] for c in _calls(s))
        if forward is not None and backward:
            lt.add("sync-flag-after-forward", "warning", node,
                   f"{model}.require_backward_grad_sync is set after the forward {model}(...) (line {forward.lineno}): "
                   "DistributedDataParallel reads the flag in its forward, so the backward below all-reduces (or not) "
                   "by the value of the previous micro-step: the last micro-step's gradients are not averaged across "
                   "ranks and the first one of the next step is",
                   f"set {model}.require_backward_grad_sync before {model}(...) (or run the forward and backward of "
                   f"each non-final micro-step inside `with {model}.no_sync():`)", _DDP_DOC + "#torch.nn.parallel."
                   "DistributedDataParallel.no_sync")


def rule_no_sync_backward_only(lt: PythonLinter) -> None:
    """``with model.no_sync(): loss.backward()`` with the forward outside the block: a no-op ("The forward pass should
    be included inside the context manager, or else gradients will still be synchronized", no_sync's docstring)."""
    for node in lt.nodes:
        if not isinstance(node, (ast.With, ast.AsyncWith)):
            continue
        if not any(isinstance(it.context_expr, ast.Call) and call_name(it.context_expr) == "no_sync" for it in node.items):
            continue
        calls = [c for s in node.body for c in _calls(s)]
        if any(call_name(c) == "backward" for c in calls) and all(call_name(c) in _LOSS_OPS for c in calls):
            lt.add("no-sync-backward-only", "warning", node,
                   "this no_sync() block holds only the backward: DistributedDataParallel decides in the forward "
                   "whether the backward all-reduces, so with the forward outside the block the gradients are still "
                   "all-reduced on every micro-step (no_sync: 'The forward pass should be included inside the "
                   "context manager, or else gradients will still be synchronized')",
                   "run the forward and the backward of each non-final micro-step inside `with model.no_sync():`",
                   _DDP_DOC + "#torch.nn.parallel.DistributedDataParallel.no_sync")


def _key(node: ast.AST) -> str | None:
    """The name a counter or modulus goes by (``batch_idx``, ``self.accum_grad`` -> ``accum_grad``,
    ``loss_dict["batch_idx"]`` -> ``batch_idx``)."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Subscript) and isinstance(node.slice, ast.Constant) and isinstance(node.slice.value, str):
        return node.slice.value
    return None


def _modulo_zero(test: ast.AST) -> tuple[str, int, str, bool] | None:
    """``(counter, offset, modulus, equal)`` of ``(counter + offset) % modulus ==/!= 0`` (``equal``: ``==``)."""
    if not (isinstance(test, ast.Compare) and len(test.ops) == 1 and isinstance(test.ops[0], (ast.Eq, ast.NotEq))
            and isinstance(test.comparators[0], ast.Constant) and test.comparators[0].value == 0
            and isinstance(test.left, ast.BinOp) and isinstance(test.left.op, ast.Mod)):
        return None
    left, offset = test.left.left, 0
    if isinstance(left, ast.BinOp) and isinstance(left.op, ast.Add) and isinstance(left.right, ast.Constant) \
            and isinstance(left.right.value, int):
        left, offset = left.left, left.right.value
    counter, modulus = _key(left), _key(test.left.right)
    if counter is None or modulus is None:
        return None
    return counter, offset, modulus, isinstance(test.ops[0], ast.Eq)


def _skip_sync_on_the_step(lt: PythonLinter) -> None:
    """``flag = (i + 1) % n == 0`` (true on the last micro-step of each accumulation window, the one that must
    all-reduce) handed to ``fabric.no_backward_sync(model, enabled=flag)`` as the "skip the sync" switch: the gradient sync is skipped exactly on the step boundary and done on the other micro-steps
    (Fabric: "enabled: Whether the context manager is enabled or not. True means skip the sync, False means do not
    skip", https://lightning.ai/docs/fabric/stable/api/fabric_methods.html#no-backward-sync; lit-llama's
    finetune_full.py, fixed to ``% n != 0``)."""
    boundary: dict[str, ast.Assign] = {}
    for n in lt.nodes:
        if isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name):
            got = _modulo_zero(n.value)
            if got is not None and got[3]:
                boundary[n.targets[0].id] = n
    if not boundary:
        return
    for c in (x for x in lt.nodes if isinstance(x, ast.Call) and call_name(x) == "no_backward_sync"):
        flag = next((k.value for k in c.keywords if k.arg == "enabled"), c.args[1] if len(c.args) > 1 else None)
        if isinstance(flag, ast.Name) and flag.id in boundary:
            made = boundary[flag.id]
            lt.add("no-sync-misaligned", "warning", c,
                   f"no_backward_sync(..., enabled={flag.id}) skips the gradient sync when {flag.id} is true, and "
                   f"{flag.id} = `{ast.unparse(made.value)}` (line {made.lineno}) is true on the last micro-step of each "
                   "window, the one that must all-reduce before the optimizer step: the sync runs on the other "
                   "micro-steps instead", f"{flag.id} = `{ast.unparse(made.value).replace('==', '!=')}` (true while "
                   "accumulating)", "https://lightning.ai/docs/fabric/stable/api/fabric_methods.html#no-backward-sync")
            return


def rule_no_sync_misaligned(lt: PythonLinter) -> None:
    """The micro-step that all-reduces is not the one before ``optimizer.step()``: ``no_sync`` chosen by
    ``i % n != 0`` (so ``i % n == 0`` syncs) while the step runs when ``(i + 1) % n == 0``.  The gradients the
    optimizer applies then hold the later micro-steps' rank-local contributions, so replicas diverge
    (modelscope/FunASR#3472)."""
    _skip_sync_on_the_step(lt)
    if "no_sync" not in lt.text:
        return
    syncs: list[tuple[ast.AST, tuple[str, int, str, bool]]] = []   # the predicate under which a micro-step syncs
    steps: list[tuple[ast.AST, tuple[str, int, str, bool]]] = []
    for node in lt.nodes:
        if isinstance(node, ast.IfExp):
            got = _modulo_zero(node.test)
            if got is not None and ("no_sync" in ast.unparse(node.body)) != ("no_sync" in ast.unparse(node.orelse)):
                no_sync_when_true = "no_sync" in ast.unparse(node.body)
                syncs.append((node, (got[0], got[1], got[2], got[3] != no_sync_when_true)))
        elif isinstance(node, ast.If):
            got = _modulo_zero(node.test)
            if got is None:
                continue
            if any(call_name(c) == "step" and "sched" not in ast.unparse(c.func).lower()
                   for s in node.body for c in _calls(s)):
                steps.append((node, got))
    for node, (counter, off, mod, eq) in syncs:
        for step, (s_counter, s_off, s_mod, s_eq) in steps:
            if counter == s_counter and mod == s_mod and s_eq and (not eq or off != s_off):
                lt.add("no-sync-misaligned", "warning", node,
                       f"no_sync is chosen so that the micro-step with `{ast.unparse(node.test)}` "
                       f"{'false' if eq else 'true'} all-reduces, but the optimizer steps when "
                       f"`{ast.unparse(step.test)}` (line {step.lineno}): the synchronised micro-step is not the last "
                       "one before the step, so the applied gradients hold rank-local contributions and the replicas "
                       "drift apart",
                       f"enter no_sync when the step predicate is false: `({counter} + {s_off}) % {mod} != 0`",
                       _DDP_DOC + "#torch.nn.parallel.DistributedDataParallel.no_sync")
                break


_AUTOGRAD_COLL = "https://docs.pytorch.org/docs/stable/distributed.html#autograd-enabled-communication-primitives"
_NO_GRAD_OPS = frozenset({"detach", "item", "tolist", "cpu", "numpy"})


def _carries(expr: ast.AST, names: set[str]) -> bool:
    """Whether ``expr`` carries one of ``names`` into its value as a numerator or term: not only as a divisor
    (``local_sum / global_count`` is the usual global-mean normalisation) and not through ``.detach()``/``.item()``."""
    todo = [expr]
    while todo:
        node = todo.pop()
        if isinstance(node, ast.Name) and node.id in names:
            return True
        if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Div, ast.FloorDiv)):
            todo.append(node.left)
            continue
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in _NO_GRAD_OPS:
            continue
        if isinstance(node, (ast.Lambda, ast.Compare)):
            continue
        todo.extend(c for c in ast.iter_child_nodes(node) if isinstance(c, ast.expr))
    return False


def rule_backward_through_all_reduce(lt: PythonLinter) -> None:
    """``dist.all_reduce(t)`` in place, then a loss built from ``t`` (as a term, not only as the divisor) and
    ``loss.backward()`` in the same function.  ``torch.distributed.all_reduce`` is not recorded by autograd (the
    autograd-aware collectives are ``torch.distributed.nn.*``, ``_AUTOGRAD_COLL``), so the backward treats the sum as
    this rank's own value: each rank's gradient carries only its local share of a loss normalised globally, and the
    data-parallel wrapper's gradient averaging (DDP/FSDP divide by the world size, ``_DDP_DOC``) divides again: the
    model trains with lr / world_size.  Backward on the rank-local loss; use the reduced copy for logging."""
    if "all_reduce" not in lt.text or "backward" not in lt.text:
        return
    for fn in (n for n in lt.nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        reduced: dict[str, ast.Call] = {}
        for st in subtree(fn):
            if isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and call_name(st.value) == "all_reduce" \
                    and st.value.args and isinstance(st.value.args[0], ast.Name) and \
                    "nn" not in ast.unparse(st.value.func).split(".") and lt._enclosing_function(st) is fn:
                reduced.setdefault(st.value.args[0].id, st.value)
        if not reduced:
            continue
        carrying = _propagate(fn, set(reduced))
        assigns = [n for n in subtree(fn) if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None]
        for c in (n for n in subtree(fn) if isinstance(n, ast.Call)):
            target = None
            if isinstance(c.func, ast.Attribute) and c.func.attr == "backward":
                target = c.func.value
                if isinstance(target, ast.Call) and call_name(target) == "scale" and target.args:
                    target = target.args[0]  # scaler.scale(loss).backward()
                elif not isinstance(target, ast.Name) and c.args:
                    target = c.args[0]  # accelerator.backward(loss), engine.backward(loss)
            if isinstance(target, ast.Name) and target.id in carrying and target.id not in reduced or \
                    isinstance(target, ast.Name) and target.id in reduced:
                first = min(reduced.values(), key=lambda x: x.lineno)
                at = reduced[target.id] if target.id in reduced else first
                if at.lineno > c.lineno or target.id in reduced and any(
                        reduced[target.id].lineno < n.lineno < c.lineno for n in assigns
                        if any(isinstance(t, ast.Name) and t.id == target.id for t in assign_targets(n))):
                    continue  # the reduce comes after this backward (a logging copy), or the loss was made anew since
                lt.add("backward-through-all-reduce", "warning", c,
                       f"{ast.unparse(c)[:60]} differentiates a loss built from {ast.unparse(first)[:50]} "
                       f"(line {first.lineno}): dist.all_reduce is not autograd-aware, so each rank's gradient holds "
                       "only its own share, and the data-parallel gradient averaging divides by the world size "
                       "again (the model trains with lr / world_size)",
                       "call backward on the rank-local loss (scaled by world_size / global count if it is "
                       "normalised globally); keep the reduced copy for logging, or use "
                       "torch.distributed.nn.functional.all_reduce", _AUTOGRAD_COLL)
                break


def _propagate(fn: ast.AST, names: set[str]) -> set[str]:
    """``names`` and every name of ``fn`` assigned from an expression that carries one of them (:func:`_carries`),
    followed through four rounds of assignments (tuples element by element)."""
    carrying = set(names)
    assigns = [n for n in subtree(fn) if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None]
    for _ in range(4):
        before = len(carrying)
        for n in assigns:
            for t in assign_targets(n):
                if isinstance(t, ast.Name) and _carries(n.value, carrying):
                    carrying.add(t.id)
                elif isinstance(t, ast.Tuple):
                    vals = n.value.elts if isinstance(n.value, ast.Tuple) and \
                        len(n.value.elts) == len(t.elts) else [n.value] * len(t.elts)
                    carrying.update(e.id for e, v in zip(t.elts, vals) if isinstance(e, ast.Name) and _carries(v, carrying))
        if len(carrying) == before:
            break
    return carrying


_COUNT_NAME = re.compile(r"(?i)count|num|total|\bn_|size|denom")


def rule_loss_through_all_reduce(lt: PythonLinter) -> None:
    """``backward-through-all-reduce`` where the backward is not in the file: a loss function (a ``forward`` of a
    class named ``*Loss*``, or a function named ``*loss*``) that reduces a tensor built from its inputs in place with
    ``dist.all_reduce`` and returns a value built from it.  The reduction is not recorded by autograd
    (``_AUTOGRAD_COLL``), so whoever calls ``backward()`` on the returned loss gets each rank's gradient of its own
    share only, which the data-parallel averaging then divides by the world size again (lightly's Barlow Twins loss:
    the cross-correlation averaged with ``dist.all_reduce``, fixed with ``torch.distributed.nn.all_reduce``).  Not
    for counts (``_COUNT_NAME``), nor under ``torch.no_grad()``."""
    if "all_reduce" not in lt.text:
        return
    for fn in (n for n in lt.nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
        cls = lt.parents.get(fn)
        if not (fn.name == "forward" and isinstance(cls, ast.ClassDef) and "loss" in cls.name.lower() or
                "loss" in fn.name.lower()) or any("no_grad" in ast.unparse(d) for d in fn.decorator_list):
            continue
        params = {a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]} - {"self", "cls"}
        from_inputs = _propagate(fn, params)
        for st in subtree(fn):
            if not (isinstance(st, ast.Expr) and isinstance(st.value, ast.Call) and call_name(st.value) == "all_reduce"
                    and st.value.args and isinstance(st.value.args[0], ast.Name) and
                    "nn" not in ast.unparse(st.value.func).split(".") and lt._enclosing_function(st) is fn):
                continue
            name = st.value.args[0].id
            if name not in from_inputs or _COUNT_NAME.search(name) or any(
                    isinstance(w, ast.With) and "no_grad" in ast.unparse(w) and st in ast.walk(w) for w in subtree(fn)):
                continue
            carrying = _propagate(fn, {name})
            if not any(isinstance(r, ast.Return) and r.value is not None and r.lineno > st.lineno and
                       _carries(r.value, carrying) for r in subtree(fn)):
                continue
            lt.add("backward-through-all-reduce", "warning", st.value,
                   f"{ast.unparse(st.value)[:50]} reduces {name}, built from the loss's inputs, and the loss returned "
                   f"is built from it: dist.all_reduce is not autograd-aware, so the caller's backward gives each rank "
                   "the gradient of its own share only, and the data-parallel averaging divides by the world size "
                   "again (the model trains with lr / world_size)",
                   f"{name} = torch.distributed.nn.functional.all_reduce({name}) (autograd-aware), or reduce a "
                   "detached copy for logging only", _AUTOGRAD_COLL)
            break


_LOSS_HOOKS = frozenset({"compute_loss", "training_step", "train_step", "forward_step", "compute_losses"})
"""Methods whose ``model`` argument is the wrapped training model and whose result is back-propagated: the Hugging
Face Trainer's ``compute_loss(model, inputs)`` (https://huggingface.co/docs/transformers/en/main_classes/trainer,
"subclass and override compute_loss"), Lightning's ``training_step``, and the usual names of a hand-written step."""
_NO_GRAD = frozenset({"no_grad", "inference_mode"})


def _under_no_grad(lt: PythonLinter, node: ast.AST, scope: ast.AST) -> bool:
    """``node`` sits inside a ``with torch.no_grad()`` / ``torch.inference_mode()`` block of ``scope`` (evaluation: no
    backward follows it)."""
    ctx = lt.parents.get(node)
    while ctx is not None and ctx is not scope:
        if isinstance(ctx, ast.With) and any(isinstance(i.context_expr, ast.Call) and
                                             call_name(i.context_expr) in _NO_GRAD for i in ctx.items):
            return True
        ctx = lt.parents.get(ctx)
    return False


def rule_forward_bypasses_ddp(lt: PythonLinter) -> None:
    """A training-loss method (or a helper it hands ``model`` to) that runs the forward on the unwrapped model:
    ``accelerator.unwrap_model(model)`` / ``model.module`` and whatever is taken from it (``.get_decoder()``, the
    base model by ``getattr``).  DDP arms its reducer in its own forward (``_pre_forward`` /
    ``prepare_for_backward``, the module docstring): a forward that bypasses the wrapper leaves the backward without
    the all-reduce, so every rank trains its own copy (huggingface/trl#5934).  Also any function that calls
    ``backward()`` and runs such a forward on a model this file wraps in DDP, without calling the wrapper itself
    (jingyaogong/minimind#854: a global policy model unwrapped for the GRPO loss).  Calls under ``torch.no_grad()`` do
    not count (evaluation)."""
    if "unwrap_model" not in lt.text and ".module" not in lt.text:
        return
    hooks = [f for f in lt.nodes if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef)) and f.name in _LOSS_HOOKS]
    funcs = {f.name: f for f in lt.nodes if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))}
    todo = [(f, "model") for f in hooks if "model" in [a.arg for a in f.args.args]]
    # a step function that reads a model the file wraps in DDP (a global, jingyaogong/minimind#854) and calls backward
    wrapped = {t.id for n in lt.nodes if isinstance(n, ast.Assign) and isinstance(n.value, ast.Call)
               and DDP_CTOR.match(call_name(n.value) or "") for t in n.targets if isinstance(t, ast.Name)}
    for f in funcs.values():
        if f not in hooks and any(isinstance(c.func, ast.Attribute) and c.func.attr == "backward" for c in _calls(f)):
            todo += [(f, name) for name in sorted(wrapped) if not any(
                isinstance(c.func, ast.Name) and c.func.id == name for c in _calls(f))]
    for hook, _ in list(todo):  # a helper of the same file the hook passes its model to: self._liger_loss(model, x)
        for c in _calls(hook):
            callee = funcs.get(call_name(c))
            if callee is not None and callee not in hooks and any(isinstance(a, ast.Name) and a.id == "model"
                                                                  for a in c.args):
                pos = [i for i, a in enumerate(c.args) if isinstance(a, ast.Name) and a.id == "model"][0]
                params = [a.arg for a in callee.args.args if a.arg != "self"]
                if pos < len(params):
                    todo.append((callee, params[pos]))
    seen: set[int] = set()
    for fn, param in todo:
        if id(fn) in seen:
            continue
        seen.add(id(fn))
        bare: set[str] = set()
        for node in subtree(fn):
            if not isinstance(node, ast.Assign):
                continue
            v = node.value
            unwrapped = any((isinstance(n, ast.Call) and call_name(n) == "unwrap_model" and n.args
                             and isinstance(n.args[0], ast.Name) and n.args[0].id == param) or
                            (isinstance(n, ast.Attribute) and n.attr == "module" and isinstance(n.value, ast.Name)
                             and n.value.id == param) for n in ast.walk(v))
            derived = any(isinstance(n, ast.Name) and n.id in bare for n in ast.walk(v))
            if unwrapped or derived:
                bare.update(t.id for t in assign_targets(node) if isinstance(t, ast.Name))
        for c in _calls(fn):
            if not (isinstance(c.func, ast.Name) and c.func.id in bare):
                continue
            if _under_no_grad(lt, c, fn):
                continue  # under torch.no_grad(): no backward follows
            lt.add("ddp-bypassed", "error", c,
                   f"{c.func.id}(...) runs the forward on the model taken out of its DDP wrapper ({fn.name}'s "
                   f"'{param}' unwrapped): DistributedDataParallel prepares its gradient all-reduce in its own forward, "
                   "so this loss's backward is not synchronised across ranks (each rank drifts)",
                   f"call the wrapped {param}(...) for the training forward (unwrap only to read attributes or to "
                   "save), or compute the loss inside the wrapped module's forward", _DDP_DOC)
            break


_HANDS_OVER = frozenset({"unwrap_model", "unwrap", "print", "len", "isinstance", "getattr", "hasattr", "type", "id",
                         "register_for_checkpointing", "get_state_dict", "save_model", "clip_grad_norm_",
                         "clip_grad_value_", "cast_training_params", "save", "info", "debug", "warning",
                         "accumulate", "no_sync", "backward"})
"""Calls that receive a prepared model without running its forward (unwrapping, reading, saving, logging)."""


def rule_prepared_model_never_called(lt: PythonLinter) -> None:
    """A module given to ``accelerator.prepare`` (DistributedDataParallel under several processes) and then never
    called: not ``model(...)``, not handed to a function that could call it, not kept on ``self``, while the file
    back-propagates: the training forward runs on other modules (``pipeline.unet(...)`` with the LoRA layers
    prepared), so the wrapper's forward, which arms DDP's gradient all-reduce, never runs and each rank keeps its own
    gradients (kvablack/ddpo-pytorch; the DDP contract, ``_DDP_DOC``).  Not where the file shards its models
    (DeepSpeed / FSDP reduce through their own hooks)."""
    if "prepare(" not in lt.text or getattr(lt, "_shards_models", False) or \
            not re.search(r"\.backward\(", lt.text):
        return
    modules = {n.func.value.id for n in lt.nodes if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
               and n.func.attr in ("parameters", "named_parameters") and isinstance(n.func.value, ast.Name)}
    for call, target, _arg in prepare_bindings(lt.nodes):
        if not (isinstance(target, ast.Name) and target.id in modules):
            continue
        name = target.id
        uses = [n for n in lt.nodes if isinstance(n, ast.Name) and n.id == name and isinstance(n.ctx, ast.Load)
                and getattr(n, "lineno", 0) > call.lineno]
        called = handed = False
        for u in uses:
            p = lt.parents.get(u)
            if isinstance(p, ast.Call) and p.func is u or isinstance(p, ast.Attribute) and p.attr == "forward":
                called = True  # model(x), model.forward(x): the wrapper's own forward
            elif isinstance(p, (ast.Call, ast.keyword)) or isinstance(p, (ast.Return, ast.Yield, ast.Tuple, ast.List,
                                                                           ast.Dict, ast.Assign, ast.Starred)):
                c = p if isinstance(p, ast.Call) else lt.parents.get(p)
                if not (isinstance(c, ast.Call) and call_name(c) in _HANDS_OVER):
                    handed = True
        if called or handed or not uses:
            continue
        lt.add("ddp-bypassed", "warning", call,
               f"{name} is prepared here (DistributedDataParallel under several processes) but never called: the "
               "training forward runs on other modules, so the wrapper's forward, which arms DDP's gradient "
               "all-reduce, never runs and each rank keeps its own gradients",
               f"run the training forward through the prepared {name}(...) (prepare the module that is called), or "
               "reduce the gradients yourself (accelerator.reduce) before the optimizer step", _DDP_DOC)


_NOT_FORWARD = frozenset({"state_dict", "load_state_dict", "parameters", "named_parameters", "buffers", "train",
                          "eval", "to", "cuda", "cpu", "zero_grad", "requires_grad_", "modules", "named_modules",
                          "children", "apply", "half", "float", "bfloat16", "save_pretrained", "generate",
                          "get_input_embeddings", "resize_token_embeddings", "register_buffer"})
"""Methods of the unwrapped module that are not a training forward (reading, moving, saving, generating)."""


def rule_module_method_forward(lt: PythonLinter) -> None:
    """``model = DistributedDataParallel(...)``, then a training step that runs the model through methods of the
    wrapped module (``model.module.encode(...)``, ``model.module.decode(...)``) and calls ``backward()``, with no call
    of the wrapper itself in that function: DDP prepares the gradient all-reduce in its own ``forward``
    (``_pre_forward``), so a backward through ``model.module``'s methods is not synchronised and every rank trains
    its own copy (hkproj/pytorch-transformer-distributed).  Calls under ``torch.no_grad()`` (evaluation) do not
    count."""
    if ".module." not in lt.text or ".backward(" not in lt.text:
        return
    scopes = [f for f in lt.nodes if isinstance(f, (ast.FunctionDef, ast.AsyncFunctionDef))] + [lt.tree]
    for fn in scopes:
        calls = [c for c in _calls(fn) if lt._enclosing_function(c) is (None if fn is lt.tree else fn)]
        backward = [c for c in calls if isinstance(c.func, ast.Attribute) and c.func.attr == "backward"]
        if not backward:
            continue
        direct = {c.func.id for c in calls if isinstance(c.func, ast.Name)} | \
            {ast.unparse(c.func) for c in calls if isinstance(c.func, ast.Attribute)}
        for c in calls:
            f = c.func
            if not (isinstance(f, ast.Attribute) and f.attr not in _NOT_FORWARD and isinstance(f.value, ast.Attribute)
                    and f.value.attr == "module" and isinstance(f.value.value, (ast.Name, ast.Attribute))):
                continue
            holder = f.value.value
            if not lt.wrappers.state(holder, c)[0] or ast.unparse(holder) in direct or \
                    not any(b.lineno > c.lineno for b in backward):
                continue
            if fn is not lt.tree and _under_no_grad(lt, c, fn):
                continue  # under torch.no_grad()
            lt.add("ddp-bypassed", "error", c,
                   f"{ast.unparse(f)}(...) runs the forward through the module inside the DDP wrapper, and this "
                   f"function then calls backward() (line {min(b.lineno for b in backward if b.lineno > c.lineno)}) "
                   "without ever calling the wrapper: DDP prepares its gradient all-reduce in its own forward, so "
                   "the gradients are not synchronised and every rank trains its own copy",
                   f"run the training forward through the wrapper ({ast.unparse(holder)}(...)): put encode/decode/"
                   "project in the module's forward", _DDP_DOC)
            break


_ACC_OPT = "https://github.com/huggingface/accelerate/blob/main/src/accelerate/optimizer.py"
_MODEL_NAME = re.compile(r"(?i)model|policy|net|unet|transformer|encoder|decoder|critic|actor")


def _prepared_optimizers(lt: PythonLinter) -> set[str]:
    """The names bound to what ``accelerator.prepare(...)`` returns at an argument whose name says optimizer."""
    return {ast.unparse(t) for _call, t, a in prepare_bindings(lt.nodes)
            if a is not None and ("optim" in ast.unparse(a).lower() or "optim" in ast.unparse(t).lower())}


def rule_zero_grad_in_accumulate(lt: PythonLinter) -> None:
    """``zero-grad-in-accumulate``: inside ``with accelerator.accumulate(model):``, (a) ``zero_grad()`` before the
    backward: entering the block sets ``sync_gradients`` for the step that applies the accumulated gradients, and the
    prepared optimizer's ``zero_grad`` clears them exactly then ("if self.gradient_state.sync_gradients:
    self.optimizer.zero_grad()", accelerate/optimizer.py), so each update uses the last micro-batch only
    (modelscope/DiffSynth-Studio#1404); (b) ``zero_grad()`` of the model (or of anything not prepared as an
    optimizer): not gated by the sync flag, it wipes the gradients of every micro-step (tatsu-lab/alpaca_farm#57:
    "The AcceleratedOptimizer object has the right wraps that disable zero_grad on non-sync steps").  The documented
    loop: forward, ``accelerator.backward``, ``optimizer.step()``, ``optimizer.zero_grad()``
    (https://huggingface.co/docs/accelerate/en/usage_guides/gradient_accumulation)."""
    if ".accumulate(" not in lt.text or "zero_grad" not in lt.text:
        return
    optimizers = _prepared_optimizers(lt)
    for w in (n for n in lt.nodes if isinstance(n, ast.With)):
        acc = next((i.context_expr for i in w.items if isinstance(i.context_expr, ast.Call)
                    and call_name(i.context_expr) == "accumulate"
                    and isinstance(i.context_expr.func, ast.Attribute)
                    and "accelerator" in ast.unparse(i.context_expr.func.value).lower()), None)
        if acc is None:
            continue
        models = {ast.unparse(a) for a in acc.args}
        calls = sorted((c for s in w.body for c in _calls(s)), key=lambda c: (c.lineno, c.col_offset))
        backward = next((c.lineno for c in calls if call_name(c) == "backward"), None)
        for c in calls:
            if call_name(c) != "zero_grad" or not isinstance(c.func, ast.Attribute):
                continue
            holder = ast.unparse(c.func.value)
            if holder in models or (holder not in optimizers and "optim" not in holder.lower()
                                    and _MODEL_NAME.search(holder.rsplit(".", 1)[-1])):
                lt.add("zero-grad-in-accumulate", "warning", c,
                       f"{holder}.zero_grad() inside accelerator.accumulate(...): the model's (or an unprepared "
                       "object's) zero_grad is not gated by Accelerate's sync flag, so it clears the gradients of every "
                       "micro-step and only the last micro-batch reaches the update",
                       "call the prepared optimizer's zero_grad() after optimizer.step()", _ACC_OPT)
                break
            if backward is not None and c.lineno < backward:
                lt.add("zero-grad-in-accumulate", "warning", c,
                       f"{holder}.zero_grad() runs before the backward (line {backward}) inside "
                       "accelerator.accumulate(...): on the step that applies the accumulated gradients the prepared "
                       "optimizer really zeroes them here, so each update uses the last micro-batch only",
                       f"move {holder}.zero_grad() after {holder}.step()", _ACC_OPT)
                break


_DS_TRAINING = "https://deepspeed.readthedocs.io/en/latest/training.html"


def rule_forward_bypasses_engine(lt: PythonLinter) -> None:
    """``engine, ... = deepspeed.initialize(model=model, ...)``, then the training forward on ``model`` itself and
    ``engine.backward(loss)`` / ``engine.step()``: DeepSpeed's training contract runs all three through the engine
    ("loss = model_engine(batch); model_engine.backward(loss); model_engine.step()", :data:`_DS_TRAINING`); the
    engine's forward is where it casts the inputs to the fp16/bf16 of its config, gathers ZeRO-3's partitioned
    parameters and times the step, so a forward that bypasses it computes with the wrong weights or dtype
    (eth-cscs/pytorch-training's BERT example).  Not under ``torch.no_grad()``; not where the raw name is bound
    again after the initialize (``model = engine``)."""
    if "deepspeed.initialize(" not in lt.text or ".backward(" not in lt.text:
        return
    for n in lt.nodes:
        if not (isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and
                ast.unparse(n.value.func) == "deepspeed.initialize"):
            continue
        raw = next((k.value for k in n.value.keywords if k.arg == "model"), None)
        t = n.targets[0]
        engine = t.elts[0] if isinstance(t, ast.Tuple) and t.elts else t
        if not (isinstance(raw, ast.Name) and isinstance(engine, ast.Name)) or raw.id == engine.id:
            continue
        scope = lt._enclosing_function(n) or lt.tree
        if any(isinstance(a, (ast.Assign, ast.AnnAssign)) and a.lineno > n.lineno and
               any(isinstance(x, ast.Name) and x.id == raw.id for x in assign_targets(a)) for a in subtree(scope)):
            continue
        calls = [c for c in subtree(scope) if isinstance(c, ast.Call) and c.lineno > n.lineno]
        if not any(isinstance(c.func, ast.Attribute) and c.func.attr == "backward" and
                   isinstance(c.func.value, ast.Name) and c.func.value.id == engine.id for c in calls):
            continue
        for c in calls:
            if not (isinstance(c.func, ast.Name) and c.func.id == raw.id):
                continue
            if _under_no_grad(lt, c, scope):
                continue  # under torch.no_grad()
            lt.add("ddp-bypassed", "error", c,
                   f"{raw.id}(...) runs the training forward on the model given to deepspeed.initialize (line "
                   f"{n.lineno}), while {engine.id}.backward() runs the backward: the engine's forward (its "
                   "fp16/bf16 input cast, ZeRO-3's parameter gathering) is skipped",
                   f"loss = {engine.id}(...) for the training forward (DeepSpeed's training loop)", _DS_TRAINING)
            return


_AMP_ACCUM = "https://docs.pytorch.org/docs/stable/notes/amp_examples.html#gradient-accumulation"
_ACCUM_TEST = re.compile(r"%|acc|accum|grad_acc|micro|sync_gradients|update_step|should_step|boundary")


def rule_clip_inside_accumulation(lt: PythonLinter) -> None:
    """``clip-inside-accumulation``: ``clip_grad_norm_`` on every micro-step of an accumulation loop whose
    ``optimizer.step()`` runs only at the boundary (``if acc_step == 0:`` / ``if (i + 1) % accum == 0:``): each
    clip rescales a partial sum of the gradients (and, under DDP's ``no_sync``, this rank's unsynchronised part), so
    the step sees gradients clipped several times over and the logged norm is a micro-step's.  PyTorch's AMP notes
    unscale (to clip) "only after all gradients for that optimizer's assigned parameters have been accumulated", in
    the step branch of the accumulation recipe (:data:`_AMP_ACCUM`; facebookresearch/lingua)."""
    if "clip_grad_norm" not in lt.text:
        return
    for clip in (c for c in lt._calls() if call_name(c) in ("clip_grad_norm_", "clip_grad_norm")):
        st, p = clip, lt.parents.get(clip)
        while p is not None and not isinstance(p, (ast.For, ast.While, ast.With, ast.If, ast.IfExp,
                                                   ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)):
            st, p = p, lt.parents.get(p)
        if not isinstance(p, (ast.For, ast.While, ast.With)) or st not in p.body:
            continue  # (under an if, or not a statement of a loop's body)
        for nxt in p.body[p.body.index(st) + 1:]:  # type: ignore[arg-type]
            if isinstance(nxt, ast.If) and _ACCUM_TEST.search(ast.unparse(nxt.test)) and \
                    not lt.taint.rank_test(nxt.test) and any(
                        isinstance(c, ast.Call) and call_name(c) == "step" and isinstance(c.func, ast.Attribute) and
                        re.search(r"(?i)optim|opt$", ast.unparse(c.func.value)) for x in nxt.body for c in ast.walk(x)):
                lt.add("clip-inside-accumulation", "warning", clip,
                       f"{ast.unparse(clip.func)}(...) runs on every micro-step while the optimizer steps only when "
                       f"`{ast.unparse(nxt.test)[:40]}` (line {nxt.lineno}): partial gradients are clipped at each "
                       "micro-step, so the step's gradient is clipped several times and the logged norm is a "
                       "micro-step's", "clip once, inside the step branch, right before optimizer.step()", _AMP_ACCUM)
                break


def run(lt: PythonLinter) -> None:
    """Run the gradient-synchronisation rules on ``lt``."""
    rule_forward_bypasses_ddp(lt)
    rule_forward_bypasses_engine(lt)
    rule_prepared_model_never_called(lt)
    rule_module_method_forward(lt)
    rule_sync_flag_after_forward(lt)
    rule_no_sync_backward_only(lt)
    rule_no_sync_misaligned(lt)
    rule_backward_through_all_reduce(lt)
    rule_loss_through_all_reduce(lt)
    rule_zero_grad_in_accumulate(lt)
    rule_clip_inside_accumulation(lt)


__all__ = ["run"]
