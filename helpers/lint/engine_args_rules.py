"""What a script hands to ``deepspeed.initialize`` against what the engine does with it.

``deepspeed.initialize(model=, optimizer=, lr_scheduler=, training_data=, ...)`` documents each argument's type
(https://deepspeed.readthedocs.io/en/latest/initialize.html): the engine steps ``lr_scheduler`` itself after every
optimizer step, with no argument, and wraps ``training_data`` in its own ``DeepSpeedDataLoader`` with a
``DistributedSampler``.  A call is read as ``deepspeed.initialize`` when it is that function, or when it passes
``training_data=`` (the keyword only DeepSpeed's initialize takes; a project's wrapper that forwards to it, such as
DALLE-pytorch's ``distr_backend.distribute``).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from helpers.lint.python_rules import PythonLinter

_DS_INIT = "https://deepspeed.readthedocs.io/en/latest/initialize.html"
_ITERABLE = re.compile(r"\bwds\.|WebDataset\(|IterableDataset\(|streaming\s*=\s*True|\.to_iterable_dataset\(")
"""A value built as an iterable-style dataset: webdataset pipelines, ``datasets``' streaming datasets."""


def _engine_calls(lt: PythonLinter) -> list[ast.Call]:
    from helpers.lint.python_rules import _call_name

    return [c for c in lt._calls() if (_call_name(c)[1] == "initialize" and "deepspeed" in _call_name(c)[0])
            or any(k.arg == "training_data" for k in c.keywords)]


def _values(expr: ast.AST) -> list[ast.AST]:
    """The values ``expr`` can take: both branches of ``a if cond else b``."""
    return _values(expr.body) + _values(expr.orelse) if isinstance(expr, ast.IfExp) else [expr]


def _assignments(lt: PythonLinter, name: str) -> Iterator[ast.Assign]:
    """The assignments ``name = <value>`` of the file."""
    return (a for a in lt.nodes if isinstance(a, ast.Assign) and any(isinstance(t, ast.Name) and t.id == name
                                                                     for t in a.targets))


def _iterable_made(lt: PythonLinter, name: str, classes: set[str], depth: int = 0) -> ast.Assign | None:
    """The assignment that makes ``name`` an iterable-style dataset: its value is one (:data:`_ITERABLE`, a class of
    ``classes``), or is derived from a name that is (``ds = filtered.map(...).batched(...)`` after ``filtered =
    wds.WebDataset(...).select(...)``), followed three assignments deep."""
    for a in _assignments(lt, name):
        src = ast.unparse(a.value)
        if _ITERABLE.search(src) or any(re.search(rf"\b{c}\(", src) for c in classes):
            return a
        if depth < 3 and any(_iterable_made(lt, n.id, classes, depth + 1) for n in ast.walk(a.value)
                             if isinstance(n, ast.Name) and n.id != name and isinstance(n.ctx, ast.Load)
                             and not (isinstance(lt.parents.get(n), ast.Call) and lt.parents[n].func is n)):
            return a
    return None


def _iterable_classes(lt: PythonLinter) -> set[str]:
    return {n.name for n in lt.nodes if isinstance(n, ast.ClassDef)
            and any(ast.unparse(b).endswith("IterableDataset") for b in n.bases)}


def rule_engine_args(lt: PythonLinter) -> None:
    """``ds-plateau-scheduler``: a ``ReduceLROnPlateau`` passed as ``lr_scheduler``: the engine calls
    ``lr_scheduler.step()`` after each optimizer step with no metric, and ``ReduceLROnPlateau.step(metrics)`` needs
    one (``TypeError: step() missing 1 required positional argument: 'metrics'``, or a decay never driven by the
    loss; lucidrains/DALLE-pytorch#303 stopped passing it).  ``ds-iterable-training-data``: an iterable-style dataset
    (webdataset, a streaming ``datasets`` dataset, an ``IterableDataset`` subclass of the file) passed as
    ``training_data``: the engine builds a ``DistributedSampler`` over it, and ``DataLoader`` refuses a sampler with an
    IterableDataset ("DataLoader with IterableDataset: expected unspecified sampler option"; DALLE-pytorch#367)."""
    if "training_data" not in lt.text and "initialize" not in lt.text:
        return
    iterable_classes = _iterable_classes(lt)
    found: set[str] = set()  # one finding per argument kind
    for call in _engine_calls(lt):
        for kw in call.keywords:
            for value in _values(kw.value) if kw.arg in ("lr_scheduler", "training_data") else ():
                if not isinstance(value, ast.Name) or kw.arg in found:
                    continue
                if kw.arg == "lr_scheduler":
                    made = next((a for a in _assignments(lt, value.id) if "ReduceLROnPlateau(" in ast.unparse(a.value)),
                                None)
                    if made is None:
                        continue
                    lt.add("ds-plateau-scheduler", "error", call,
                           f"lr_scheduler={value.id} is a ReduceLROnPlateau (line {made.lineno}): the DeepSpeed engine "
                           "steps its scheduler after every optimizer step with no metric, and ReduceLROnPlateau.step "
                           "needs one ('step() missing 1 required positional argument: metrics')",
                           "keep the scheduler out of deepspeed.initialize (lr_scheduler=None) and call "
                           f"{value.id}.step(val_loss) yourself", _DS_INIT)
                else:
                    made = _iterable_made(lt, value.id, iterable_classes)
                    if made is None:
                        continue
                    lt.add("ds-iterable-training-data", "error", call,
                           f"training_data={value.id} is an iterable-style dataset (line {made.lineno}): the "
                           "DeepSpeed engine wraps it in a DataLoader with a DistributedSampler, which an "
                           "IterableDataset refuses ('DataLoader with IterableDataset: expected unspecified sampler "
                           "option')", "pass training_data=None and iterate your own loader (shard the stream by "
                           "rank, e.g. wds.split_by_node)", _DS_INIT)
                found.add(kw.arg)


_BF16_WORDS = frozenset({"bf16", "bfloat16"})
_FP16_WORDS = frozenset({"fp16", "float16", "half"})
_DS_BF16 = "https://www.deepspeed.ai/docs/config-json/#bfloat16-training-options"


def _precision_words(test: ast.AST) -> set[str] | None:
    """The precision names a branch test compares with (its string constants, lowercased), or ``None`` when the test
    negates (``!=``, ``not in``, ``not``): a negated test selects the other precision, so its body may rightly pick
    either dtype."""
    words: set[str] = set()
    for node in ast.walk(test):
        if isinstance(node, ast.Compare) and any(isinstance(op, (ast.NotEq, ast.NotIn, ast.IsNot)) for op in node.ops):
            return None
        if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.Not):
            return None
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            words.add(node.value.lower())
    return words


def rule_precision_branch_swapped(lt: PythonLinter) -> None:
    """``ds-precision-mismatch``: a branch taken when the config says bf16 (its test compares with ``"bf16"`` /
    ``"bfloat16"`` and no fp16 word) whose body sets a dtype to ``torch.float16`` / ``torch.half`` and never to
    ``torch.bfloat16``, or the converse (an fp16 test that sets ``torch.bfloat16``).  With DeepSpeed's ``bf16``
    section enabled the engine keeps the model in bfloat16 (https://www.deepspeed.ai/docs/config-json/#bfloat16-training-options),
    and with Accelerate's ``mixed_precision="bf16"`` autocast runs in bfloat16: tensors the script casts to the other
    half type meet bf16 weights ('expected ... BFloat16 but found Half') or lose range (fp16 overflows where bf16 does
    not).  A negated test (``!=``, ``not in``) is not read."""
    if "bf16" not in lt.text and "bfloat16" not in lt.text:
        return
    for node in lt.nodes:
        if not isinstance(node, ast.If):
            continue
        words = _precision_words(node.test)
        if not words:
            continue
        bf, fp = bool(words & _BF16_WORDS), bool(words & _FP16_WORDS)
        if bf == fp:
            continue
        dtypes = {ast.unparse(s.value) for s in node.body if isinstance(s, ast.Assign)
                  and isinstance(s.value, ast.Attribute) and isinstance(s.value.value, ast.Name)
                  and s.value.value.id == "torch"}
        wrong, right = ({"torch.float16", "torch.half"}, "torch.bfloat16") if bf else ({"torch.bfloat16"}, "torch.float16")
        if not (dtypes & wrong) or right in dtypes or (not bf and "torch.half" in dtypes):
            continue
        stmt = next(s for s in node.body if isinstance(s, ast.Assign) and ast.unparse(s.value) in wrong)
        said = "bf16" if bf else "fp16"
        lt.add("ds-precision-mismatch", "warning", stmt,
               f"this branch runs when the config says {said} (line {node.lineno}: {ast.unparse(node.test)[:60]}) and "
               f"sets {ast.unparse(stmt.value)}: the engine's weights and autocast are "
               f"{'bfloat16' if bf else 'float16'}, so tensors cast here meet the other half type ('expected ... "
               f"{'BFloat16 but found Half' if bf else 'Half but found BFloat16'}')",
               f"{ast.unparse(stmt.targets[0])[:30]} = {right}", _DS_BF16)
