"""Which names hold a ``DistributedDataParallel``-wrapped module, at which line, in one Python file.

Two documented behaviours of the wrapper make this worth a data flow:

* its forward is a collective: with ``broadcast_buffers=True`` (the default) it "enables syncing (broadcasting)
  buffers of the module at beginning of the forward function"
  (https://docs.pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html), so calling the
  wrapped model on rank 0 only (a rank-0 evaluation) leaves rank 0 in a broadcast the others never join
  (reproduced for real by ``helpers/scenarios/issue_hangs.py --case ddp_eval_rank0``, tests/jobs/test_fr_doctor.py;
  huggingface/accelerate#157, mlfoundations/open_clip#1121);
* it is a new ``nn.Module`` holding the model as ``.module``: ``nn.Module.__getattr__`` looks only in the wrapper's
  own parameters, buffers and submodules (https://docs.pytorch.org/docs/stable/generated/torch.nn.Module.html), so a
  plain attribute set on the model before wrapping (``model.names = ...``) is not found through the wrapper
  (``AttributeError: 'DistributedDataParallel' object has no attribute 'names'``).

A name is wrapped from an assignment ``x = DistributedDataParallel(...)`` (also ``DDP``, mmcv's
``MMDistributedDataParallel``, a wrapper named for it such as yolov5's ``smart_DDP``, or a function of the file that
returns one), through aliases, ``torch.compile(x)`` and ``x.to(...)``, until an assignment from ``x.module``,
``de_parallel(x)`` or ``unwrap_model(x)``.  Assignments are read in line order within each function (the last one
above a use decides; branches are not told apart); a parameter is wrapped when a call in the file (or, through
:attr:`Wrapped.passed_out`, in another linted file) passes a wrapped value in its place.  ``self.X`` attributes are
wrapped when some method assigns a wrapped value to them and none unwraps them.  Standard library only.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from helpers.lint.contract_ast import subtree

DDP_CTOR = re.compile(r"^(?!\w*(?i:unwrap|remove|strip|drop))(\w*DistributedDataParallel|\w*DDP|\w*(?i:ddp_?wrap|wrap_?(?:\w+_)?ddp)\w*)$")
"""Constructor names that return a DDP wrapper (``DDP`` is the usual import alias; a project's ``ddp_wrap(model,
ctx)`` / ``wrap_model_ddp(...)`` helper; not ``ddp_setup`` or ``is_ddp``, which return no model, nor dinov2's
``remove_ddp_wrapper(m)``, which takes the wrapper off)."""
UNWRAP_CALLS = frozenset({"de_parallel", "unwrap_model", "unwrap", "get_unwrapped_model", "_unwrap_model",
                          "unwrap_module", "get_model"})
_SCOPES = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
WRAPPER_OWN = frozenset({"training", "device", "device_ids", "device_type", "output_device", "module", "dim",
                         "process_group", "broadcast_buffers", "find_unused_parameters", "static_graph",
                         "require_backward_grad_sync", "require_forward_param_sync", "gradient_as_bucket_view",
                         "mixed_precision", "logger", "reducer"})
"""Attributes a DistributedDataParallel instance has itself (torch/nn/parallel/distributed.py ``__init__``, and
nn.Module's ``training``): set on the model or not, reading them through the wrapper does not fail."""

DDP_PUBLIC = frozenset("""add_module apply bfloat16 broadcast_buffers buffers call_super_init children compile cpu cuda
    double dump_patches eval extra_repr float forward gather get_buffer get_extra_state get_parameter get_submodule half
    ipu join join_device join_hook join_process_group load_state_dict modules mtia named_buffers named_children
    named_modules named_parameters no_sync parameters register_backward_hook register_buffer register_comm_hook
    register_forward_hook register_forward_pre_hook register_full_backward_hook register_full_backward_pre_hook
    register_load_state_dict_post_hook register_load_state_dict_pre_hook register_module register_parameter
    register_state_dict_post_hook register_state_dict_pre_hook requires_grad_ scatter set_extra_state set_submodule
    share_memory state_dict to to_empty to_kwargs train type will_sync_module_buffers xpu zero_grad""".split()) | WRAPPER_OWN
"""Every public attribute a DistributedDataParallel instance answers (``dir(DistributedDataParallel)`` in torch 2.13,
and :data:`WRAPPER_OWN`): any other name read through the wrapper raises AttributeError."""
STATE_DICT_READERS = {"get_peft_model_state_dict": "peft_config"}
"""Functions that read a model attribute DDP does not have: peft's ``get_peft_model_state_dict(model)`` starts with
``config = model.peft_config[adapter_name]`` (peft/utils/save_and_load.py), so given the wrapper it raises
AttributeError (huggingface/diffusers#6144 passed ``accelerator.unwrap_model(unet)`` instead)."""


SHARDING_PLUGINS = frozenset({"FullyShardedDataParallelPlugin", "DeepSpeedPlugin", "ParallelismConfig"})
"""Accelerate's plugins that make ``prepare`` shard the model (FSDP, FSDP2 with tensor/context parallelism, DeepSpeed)
instead of wrapping it in DistributedDataParallel (accelerate/accelerator.py ``prepare_model``)."""


_SHARDING_WORDS = re.compile(r"Plugin|ParallelismConfig|fsdp_plugin|deepspeed_plugin")


def accelerator_shards(tree: ast.AST, text: str) -> bool:
    """The file builds one of :data:`SHARDING_PLUGINS` or passes ``fsdp_plugin=`` / ``deepspeed_plugin=`` to
    ``Accelerator``: its models are sharded by FSDP or DeepSpeed, whose wrappers forward unknown attributes to the
    module and whose ``save_pretrained`` gathers the shards (a collective every rank calls).  ``text`` (the file's
    source) screens first: a file that names none of them is not walked."""
    if not _SHARDING_WORDS.search(text):
        return False
    for node in subtree(tree):
        if isinstance(node, ast.Call):
            name = call_name(node)
            if name in SHARDING_PLUGINS:
                return True
            if name == "Accelerator" and any(k.arg in ("fsdp_plugin", "deepspeed_plugin") and not (
                    isinstance(k.value, ast.Constant) and k.value.value is None) for k in node.keywords):
                return True
    return False


def accelerator_prepare(node: ast.AST) -> bool:
    """``node`` is an assignment from ``<accelerator>.prepare(...)`` (any receiver whose source names an accelerator:
    ``accelerator``, ``self.accelerator``)."""
    if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
        return False
    f = node.value.func
    return isinstance(f, ast.Attribute) and f.attr == "prepare" and "accelerator" in ast.unparse(f.value).lower()


def prepare_bindings(nodes: Iterable[ast.AST]) -> list[tuple[ast.Call, ast.expr, ast.expr | None]]:
    """``(call, target, argument)`` for each name bound by ``a, b = <x>.prepare(a0, b0)`` (or a bare ``prepare(...)``)
    among ``nodes``: every target of the assignment, each beside the argument at its position (``None`` past the
    last one).  Accelerate's ``prepare`` returns its arguments prepared, in order."""
    out: list[tuple[ast.Call, ast.expr, ast.expr | None]] = []
    for n in nodes:
        if not (isinstance(n, ast.Assign) and isinstance(n.value, ast.Call) and call_name(n.value) == "prepare"):
            continue
        for tt in n.targets:
            targets = tt.elts if isinstance(tt, ast.Tuple) else [tt]
            out.extend((n.value, t, n.value.args[i] if i < len(n.value.args) else None) for i, t in enumerate(targets))
    return out


def prepared_models(tree: ast.AST) -> list[tuple[str, ast.Assign]]:
    """``(name, statement)`` of each model name bound by a ``... = accelerator.prepare(...)`` statement that holds a
    Hugging Face model (the name is bound from ``X.from_pretrained(...)`` / ``X.from_config(...)`` in the file, or passed to
    ``unwrap_model``).  Under several processes without DeepSpeed or FSDP, ``prepare`` returns the model wrapped in
    DistributedDataParallel (accelerate/accelerator.py ``prepare_model``; "unwrap_model: unwraps the model from the
    additional layer possible added by prepare()", https://huggingface.co/docs/accelerate/en/package_reference/accelerator),
    and DeepSpeed's engine and FSDP forward unknown attributes to the module, DDP does not (the caller skips a file that
    shards its models: :func:`accelerator_shards`)."""
    hf: set[str] = set()
    prepares: list[tuple[list[ast.expr], ast.Assign]] = []
    for node in subtree(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call):
            fname = call_name(node.value)
            if fname in ("from_pretrained", "from_config"):
                hf.update(t.id for t in node.targets if isinstance(t, ast.Name))
            if accelerator_prepare(node):
                t = node.targets[0]
                prepares.append((list(t.elts) if isinstance(t, ast.Tuple) else [t], node))
        elif isinstance(node, ast.Call) and call_name(node) in UNWRAP_CALLS:
            hf.update(a.id for a in node.args[:1] if isinstance(a, ast.Name))
    out = [(t.id, at) for targets, at in prepares for t in targets if isinstance(t, ast.Name) and t.id in hf]
    # results = accelerator.prepare(model, ...) then model = results[0]: the wrapper reaches the name by index
    held = {targets[0].id for targets, _at in prepares if len(targets) == 1 and isinstance(targets[0], ast.Name)}
    for node in subtree(tree) if held else ():
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name) and \
                node.targets[0].id in hf and isinstance(node.value, ast.Subscript) and \
                isinstance(node.value.value, ast.Name) and node.value.value.id in held and \
                isinstance(node.value.slice, ast.Constant) and isinstance(node.value.slice.value, int):
            out.append((node.targets[0].id, node))
    return out


BUFFER_FREE_LAYERS = frozenset({
    "Linear", "Bilinear", "Embedding", "EmbeddingBag", "LayerNorm", "GroupNorm", "RMSNorm", "Dropout", "Dropout1d",
    "Dropout2d", "Dropout3d", "GELU", "ReLU", "SiLU", "Tanh", "Sigmoid", "Softmax", "LogSoftmax", "LeakyReLU", "ELU",
    "Mish", "Softplus", "Hardswish", "Identity", "Flatten", "Unflatten", "ModuleList", "ModuleDict", "Sequential",
    "Parameter", "ParameterList", "ParameterDict", "Conv1d", "Conv2d", "Conv3d", "ConvTranspose1d", "ConvTranspose2d",
    "ConvTranspose3d", "MultiheadAttention", "MaxPool1d", "MaxPool2d", "AvgPool1d", "AvgPool2d", "AdaptiveAvgPool1d",
    "AdaptiveAvgPool2d"})
"""``torch.nn`` layers that register no buffers (their ``__init__`` in torch/nn/modules/ holds only parameters and
submodules; the norms with running statistics, BatchNorm/InstanceNorm, register ``running_mean``/``running_var``)."""
_PLAIN_CALLS = frozenset({"dict", "list", "tuple", "range", "super", "int", "float", "len", "getattr", "setattr",
                          "isinstance", "print", "zip", "enumerate", "min", "max", "sum", "hasattr"})


def assign_targets(node: ast.Assign | ast.AnnAssign | ast.AugAssign) -> list[ast.expr]:
    """The targets of an assignment: ``a, b`` of ``a = b = v``, ``x`` of ``x: int = v`` and of ``x += v``."""
    return list(node.targets) if isinstance(node, ast.Assign) else [node.target]


def flat_targets(node: ast.Assign | ast.AnnAssign | ast.AugAssign) -> list[ast.expr]:
    """:func:`assign_targets` with tuple and list targets unpacked, nested ones too, and ``*rest`` read as ``rest``:
    ``a``, ``self.b`` and ``c`` of ``a, (self.b, *c) = v``."""
    todo, out = assign_targets(node)[::-1], []
    while todo:
        t = todo.pop()
        if isinstance(t, (ast.Tuple, ast.List)):
            todo.extend(t.elts[::-1])
        elif isinstance(t, ast.Starred):
            todo.append(t.value)
        else:
            out.append(t)
    return out


def call_name(call: ast.Call) -> str:
    """The called name: ``f`` of ``f(...)``, ``m`` of ``x.m(...)``, "" for anything else (a call of a call)."""
    f = call.func
    return f.attr if isinstance(f, ast.Attribute) else f.id if isinstance(f, ast.Name) else ""


@dataclass
class Wrapped:
    """The wrapped names of one file.

    Attributes:
        assigns: per ``(scope, name)`` (scope: the function node, or the module), ``[(line, wrapped, broadcasts)]``
            in line order.
        params: per function, the parameter names that receive a wrapped module.
        attrs: ``self.X`` attributes holding a wrapped module -> whether it broadcasts buffers.
        stored: per scope, ``[(line, name, attr)]`` plain attributes stored on a name (``model.names = ...``).
        passed_out: calls of functions this file does not define (imported) that pass a wrapped module:
            function name -> argument positions and keyword names.
        param_elems: per function, the parameters given a list or tuple literal of modules, and the positions of
            its wrapped ones (``train_and_evaluate(rank, [net_g, net_d], ...)``, then ``net_g, net_d = nets``).
    """

    assigns: dict[tuple[ast.AST, str], list[tuple[int, bool, bool]]] = field(default_factory=dict)
    params: dict[ast.AST, dict[str, bool]] = field(default_factory=dict)
    attrs: dict[str, bool] = field(default_factory=dict)
    stored: dict[ast.AST, list[tuple[int, str, str]]] = field(default_factory=dict)
    passed_out: dict[str, set[int | str]] = field(default_factory=dict)
    param_elems: dict[ast.AST, dict[str, set[int]]] = field(default_factory=dict)


def _parameter(fn: ast.FunctionDef | ast.AsyncFunctionDef, at: int | str, method_call: bool) -> str | None:
    """The parameter of ``fn`` that receives argument ``at`` of a call: a position (``self``/``cls`` skipped when
    the call is ``obj.method(...)``) or a keyword (``evaluate(model=model)``); None when ``fn`` has no such
    parameter (it lands in ``*args`` / ``**kwargs``)."""
    if isinstance(at, str):
        names = {a.arg for a in [*fn.args.posonlyargs, *fn.args.args, *fn.args.kwonlyargs]}
        return at if at in names else None
    params = [a.arg for a in [*fn.args.posonlyargs, *fn.args.args]]
    if method_call and params and params[0] in ("self", "cls"):
        params = params[1:]
    return params[at] if at < len(params) else None


class WrapperFlow:
    """The analysis over one parsed file (``tree``, each node's ``parents``, the file's ``functions`` by name)."""

    def __init__(self, tree: ast.AST, text: str, parents: Mapping[ast.AST, ast.AST], functions: Mapping[str, ast.AST],
                 external: Mapping[str, set[int | str]] | None = None,
                 returns: Mapping[str, set[int | None]] | None = None):
        """``external``: this file's functions that another linted file calls with a wrapped module (name -> argument
        positions or keywords); ``returns``: functions of other linted files that return one (name -> ``None`` for
        the whole value, or its positions in a returned tuple: ``model, opt, ... = wrap_model_distributed(...)``)."""
        self.tree, self.parents, self.functions = tree, parents, functions
        self._class_defs: dict[str, ast.ClassDef] | None = None
        self.w = Wrapped()
        self.returns_ddp: set[str] = set()
        self.returns: dict[str, set[int | None]] = {k: set(v) for k, v in (returns or {}).items()}
        self.returned_in = bool(self.returns)  # another linted file hands this one a wrapper
        self.aliases: dict[str, list[str]] = {}
        if not re.search(r"DistributedDataParallel|DDP\(|(?i:ddp_?wrap|wrap_?\w*ddp)\w*\(", text) and not external \
                and not self.returns:
            return
        for name, fn in functions.items():
            values = [n.value for n in subtree(fn) if isinstance(n, ast.Return) and n.value is not None]
            if any(isinstance(v, ast.Call) and DDP_CTOR.match(call_name(v)) for v in values):
                self.returns_ddp.add(name)
        self._function_aliases()
        for name, positions in (external or {}).items():
            fn = functions.get(name)
            if fn is not None and not isinstance(fn, ast.Lambda):
                for at in positions:
                    param = _parameter(fn, at, False)  # type: ignore[arg-type]
                    if param is not None:
                        self.w.params.setdefault(fn, {})[param] = True
        for _ in range(2):  # parameters fed by wrapped values, then the assignments that use them
            self._assignments()
            self._parameters()
            self._returned()
        self._assignments()
        self._stores()

    # -------------------------------------------------------------- queries
    def scope(self, node: ast.AST) -> ast.AST:
        """The function (or module) ``node`` belongs to."""
        p = self.parents.get(node)
        while p is not None and not isinstance(p, _SCOPES):
            p = self.parents.get(p)
        return p if p is not None else self.tree

    def state(self, expr: ast.AST, at: ast.AST) -> tuple[bool, bool]:
        """``(wrapped, broadcasts buffers)`` of the value ``expr`` at node ``at``."""
        if isinstance(expr, ast.Name):
            scope = self.scope(at)
            line = getattr(at, "lineno", 0)
            last = None
            for ln, wrapped, bcast in self.w.assigns.get((scope, expr.id), ()):
                if ln >= line:
                    break
                last = (wrapped, bcast)
            if last is not None:
                return last
            params = self.w.params.get(scope, {})
            return (expr.id in params, params.get(expr.id, False))
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name) and expr.value.id == "self":
            return (expr.attr in self.w.attrs, self.w.attrs.get(expr.attr, False))
        if isinstance(expr, ast.Call):
            name = call_name(expr)
            if DDP_CTOR.match(name) or name in self.returns_ddp or None in self.returns.get(name, ()):
                quiet = any(k.arg == "broadcast_buffers" and isinstance(k.value, ast.Constant) and k.value.value is False
                            for k in expr.keywords) or (bool(expr.args) and DDP_CTOR.match(name) is not None
                                                        and self.buffer_free(expr.args[0], at))
                return True, not quiet
            if name in ("compile", "to", "cuda") and isinstance(expr.func, ast.Attribute):
                inner = expr.args[0] if name == "compile" and expr.args else expr.func.value
                return self.state(inner, at)
        if isinstance(expr, ast.IfExp):  # `model if args.standalone else model.module`: the script unwraps it itself
            if self._unwraps(expr.body) or self._unwraps(expr.orelse):
                return False, False
            return self.state(expr.body, at)
        return False, False

    def buffer_free(self, expr: ast.AST, at: ast.AST, depth: int = 0) -> bool:
        """The module ``expr`` (at node ``at``) is built from a class of this file whose whole tree has no buffers, so
        the wrapper's forward broadcasts nothing: DDP syncs buffers only when ``will_sync_module_buffers()``, i.e.
        ``self.require_forward_param_sync and self.broadcast_buffers and len(self.modules_buffers) > 0``
        (torch/nn/parallel/distributed.py, ``_check_sync_bufs_pre_fwd``).

        Known only when every layer its ``__init__`` builds (followed through the file's own classes) is one of
        :data:`BUFFER_FREE_LAYERS` and no class calls ``register_buffer``; any other constructor (an imported model,
        ``nn.BatchNorm2d``) leaves it unknown (False: the forward is taken to broadcast)."""
        if depth > 4:
            return False
        if isinstance(expr, ast.Call):
            name = call_name(expr)
            if name == "compile" and expr.args:
                return self.buffer_free(expr.args[0], at, depth + 1)
            if name in ("to", "cuda") and isinstance(expr.func, ast.Attribute):
                return self.buffer_free(expr.func.value, at, depth + 1)
            return isinstance(expr.func, ast.Name) and self._class_buffer_free(expr.func.id, depth + 1)
        if isinstance(expr, ast.Name):
            scope, line = self.scope(at), getattr(at, "lineno", 0)
            last = max((n for n in subtree(scope) if isinstance(n, ast.Assign) and n.lineno < line
                        and self.scope(n) is scope and any(isinstance(t, ast.Name) and t.id == expr.id
                                                           for t in n.targets)),
                       key=lambda n: n.lineno, default=None)
            return last is not None and self.buffer_free(last.value, last, depth + 1)
        return False

    def _class_buffer_free(self, name: str, depth: int) -> bool:
        cls = self._classes().get(name)
        if cls is None or depth > 6:
            return False
        for base in cls.bases:
            b = ast.unparse(base)
            if b not in ("nn.Module", "torch.nn.Module", "Module") and not self._class_buffer_free(b, depth + 1):
                return False
        init = next((n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name == "__init__"), None)
        calls = [n for n in ast.walk(cls) if isinstance(n, ast.Call)]
        if any(call_name(c) == "register_buffer" for c in calls):
            return False
        for c in (n for n in subtree(init) if isinstance(n, ast.Call)) if init is not None else ():
            f, cname = c.func, call_name(c)
            recv = ast.unparse(f.value) if isinstance(f, ast.Attribute) else ""
            if recv in ("nn", "torch.nn"):
                if cname not in BUFFER_FREE_LAYERS:
                    return False
            elif recv == "torch" and cname[:1].islower():
                continue  # a tensor (torch.zeros for an nn.Parameter)
            elif isinstance(f, ast.Name) and cname in _PLAIN_CALLS:
                continue
            elif recv == "self" or (isinstance(f, ast.Attribute) and ast.unparse(f.value).startswith("super(")):
                continue  # a method of the class (register_buffer ruled out above), super().__init__() (or the
                # Python 2 spelling super(Net, self).__init__())
            elif isinstance(f, ast.Name) and f.id[:1].isupper() and f.id in self._classes():
                if not self._class_buffer_free(f.id, depth + 1) and not self._plain_class(f.id):
                    return False
            else:
                return False
        return True

    def _plain_class(self, name: str) -> bool:
        """A class of the file that is not a module (a dataclass config: ``GPTConfig(...)``)."""
        cls = self._classes().get(name)
        return cls is not None and not cls.bases

    def _classes(self) -> dict[str, ast.ClassDef]:
        """The file's classes by name (the first definition of a name), built on first use."""
        if self._class_defs is None:
            self._class_defs = {}
            for n in subtree(self.tree):
                if isinstance(n, ast.ClassDef):
                    self._class_defs.setdefault(n.name, n)
        return self._class_defs

    def forward(self, call: ast.Call) -> bool:
        """``call`` is the forward of a wrapped module that broadcasts its buffers (a collective)."""
        f = call.func
        if isinstance(f, ast.Name) or (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
                                       and f.value.id == "self"):
            wrapped, bcast = self.state(f, call)
            return wrapped and bcast
        return False

    def wrapper_attribute(self, node: ast.Attribute) -> int:
        """The line where ``node``'s attribute was stored on the model before it was wrapped, when ``node`` reads it
        through the wrapper (0 otherwise)."""
        if not (isinstance(node.value, ast.Name) and isinstance(node.ctx, ast.Load)) or node.attr in WRAPPER_OWN:
            return 0
        wrapped, _ = self.state(node.value, node)
        if not wrapped:
            return 0
        scope, line = self.scope(node), node.lineno
        wrap_line = max((ln for ln, w, _b in self.w.assigns.get((scope, node.value.id), ()) if w and ln < line),
                        default=0)
        return next((ln for ln, name, attr in self.w.stored.get(scope, ()) if name == node.value.id
                     and attr == node.attr and ln < wrap_line), 0)

    # -------------------------------------------------------------- passes
    def _assignments(self) -> None:
        assigns: dict[tuple[ast.AST, str], list[tuple[int, bool, bool]]] = {}
        attrs: dict[str, bool] = {}
        unwrapped_attrs: set[str] = set()
        nodes = sorted((n for n in subtree(self.tree) if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value),
                       key=lambda n: n.lineno)
        self.w.assigns = assigns
        for n in nodes:
            targets = assign_targets(n)
            scope = self.scope(n)
            wrapped, bcast = self.state(n.value, n)  # type: ignore[arg-type]
            unwrap = self._unwraps(n.value)  # type: ignore[arg-type]
            elems = self.w.param_elems.get(scope, {}).get(n.value.id, set()) \
                if isinstance(n.value, ast.Name) and (scope, n.value.id) not in assigns else set()
            # (the parameter as given: not rebound in the function before this line)
            for t in targets:
                if isinstance(t, ast.Tuple) and elems:  # net_g, net_d = nets (a parameter given [DDP(g), DDP(d)])
                    for i, elt in enumerate(t.elts):
                        if isinstance(elt, ast.Name):
                            assigns.setdefault((scope, elt.id), []).append((n.lineno, i in elems, True))
                elif isinstance(t, ast.Tuple) and isinstance(n.value, ast.Call) and \
                        self.returns.get(call_name(n.value), {None}) - {None}:
                    at = self.returns[call_name(n.value)]  # model, optimizer, ... = wrap_model_distributed(...)
                    for i, elt in enumerate(t.elts):
                        if isinstance(elt, ast.Name):
                            assigns.setdefault((scope, elt.id), []).append((n.lineno, i in at, True))
                elif isinstance(t, ast.Name):
                    assigns.setdefault((scope, t.id), []).append((n.lineno, wrapped and not unwrap, bcast))
                elif isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id == "self":
                    if wrapped and not unwrap:
                        attrs[t.attr] = attrs.get(t.attr, False) or bcast
                    elif unwrap:
                        unwrapped_attrs.add(t.attr)
        self.w.attrs = {a: b for a, b in attrs.items() if a not in unwrapped_attrs}

    @staticmethod
    def _unwraps(value: ast.AST) -> bool:
        if isinstance(value, ast.Attribute) and value.attr == "module":
            return True
        if isinstance(value, ast.Call) and (call_name(value) in UNWRAP_CALLS or
                                            (call_name(value) == "getattr" and len(value.args) > 1 and
                                             isinstance(value.args[1], ast.Constant) and value.args[1].value == "module")):
            return True
        return isinstance(value, ast.IfExp) and (WrapperFlow._unwraps(value.body) or WrapperFlow._unwraps(value.orelse))

    def _parameters(self) -> None:
        for call in (n for n in subtree(self.tree) if isinstance(n, ast.Call)):
            f = call.func
            name = call_name(call)
            local = isinstance(f, ast.Name) or (isinstance(f, ast.Attribute) and isinstance(f.value, ast.Name)
                                                and f.value.id in ("self", "cls"))
            fns = [self.functions[name]] if local and name in self.functions else \
                [self.functions[a] for a in self.aliases.get(name, ())] if isinstance(f, ast.Name) else []
            given: list[tuple[int | str, ast.expr]] = [*enumerate(call.args),
                                                        *((k.arg, k.value) for k in call.keywords if k.arg)]
            for at, arg in given:
                if isinstance(arg, (ast.List, ast.Tuple)) and fns and not isinstance(f, ast.Attribute):
                    elems = {i for i, e in enumerate(arg.elts) if self.state(e, call)[0]}
                    for fn in fns if elems else ():
                        param = None if isinstance(fn, ast.Lambda) else _parameter(fn, at, False)  # type: ignore[arg-type]
                        if param is not None:
                            self.w.param_elems.setdefault(fn, {}).setdefault(param, set()).update(elems)
                    continue
                wrapped, bcast = self.state(arg, call)
                if not wrapped:
                    continue
                if not fns or all(isinstance(fn, ast.Lambda) for fn in fns):
                    if isinstance(f, ast.Name) and name not in self.functions:
                        self.w.passed_out.setdefault(name, set()).add(at)
                    continue
                for fn in fns:
                    param = None if isinstance(fn, ast.Lambda) else \
                        _parameter(fn, at, isinstance(f, ast.Attribute))  # type: ignore[arg-type]
                    if param is not None:
                        self.w.params.setdefault(fn, {})[param] = bcast

    def _function_aliases(self) -> None:
        """Names bound to one of the file's functions, or to either of two by a conditional expression
        (``train_function = run_train_rlhf if rlhf else run_train``): a call of the name calls one of them."""
        for n in subtree(self.tree):
            if not (isinstance(n, ast.Assign) and len(n.targets) == 1 and isinstance(n.targets[0], ast.Name)):
                continue
            options = [n.value.body, n.value.orelse] if isinstance(n.value, ast.IfExp) else [n.value]
            names = [o.id for o in options if isinstance(o, ast.Name) and o.id in self.functions]
            if names and len(names) == len(options) and n.targets[0].id not in self.functions:
                self.aliases.setdefault(n.targets[0].id, []).extend(names)

    def _returned(self) -> None:
        """What each of the file's functions returns wrapped (:attr:`returns`: ``None`` for the whole value, a
        position for an element of a returned tuple): ``return model, optimizer`` after ``model = DDP(model)``."""
        for name, fn in self.functions.items():
            if isinstance(fn, ast.Lambda):
                continue
            got: set[int | None] = set()
            for r in (n for n in subtree(fn) if isinstance(n, ast.Return) and n.value is not None):
                if self.scope(r) is not fn:
                    continue
                if isinstance(r.value, ast.Tuple):
                    got.update(i for i, e in enumerate(r.value.elts) if self.state(e, r)[0])
                elif isinstance(r.value, ast.Name) and self.state(r.value, r)[0]:
                    got.add(None)
            if got:
                self.returns[name] = self.returns.get(name, set()) | got

    def _stores(self) -> None:
        for n in subtree(self.tree):
            if isinstance(n, ast.Assign):
                for t in n.targets:
                    if isinstance(t, ast.Attribute) and isinstance(t.value, ast.Name) and t.value.id != "self":
                        self.w.stored.setdefault(self.scope(n), []).append((n.lineno, t.value.id, t.attr))


def _bound(stmts: list[ast.stmt]) -> set[str]:
    """Names bound anywhere in ``stmts`` (assignment, ``for``/``with`` targets, imports, walrus, ``def``/``class``,
    ``except ... as``), nested function bodies included (an over-approximation: fewer findings)."""
    out: set[str] = set()
    for stmt in stmts:
        for n in ast.walk(stmt):
            if isinstance(n, ast.Name) and isinstance(n.ctx, (ast.Store, ast.Del)):
                out.add(n.id)
            elif isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                out.add(n.name)
            elif isinstance(n, (ast.Import, ast.ImportFrom)):
                out.update((a.asname or a.name).split(".")[0] for a in n.names)
            elif isinstance(n, ast.ExceptHandler) and n.name:
                out.add(n.name)
            elif isinstance(n, (ast.Global, ast.Nonlocal)):
                out.update(n.names)
    return out


def unbound_after_wrap(tree: ast.AST, parents: Mapping[ast.AST, ast.AST]) -> list[tuple[ast.Name, ast.If]]:
    """Names bound only in the branch that does NOT build the DDP wrapper and read after the ``if``/``else``, or only
    under an ``if`` that holds in a distributed run alone (``if dist.is_initialized():`` with no ``else``):
    ``if ddp: model = DDP(model) else: model_module = model.module ...`` then ``AveragedModel(model_module)``.
    Python decides a function's local names at compile time and "if the name refers to a local variable that has
    not been bound, a UnboundLocalError exception is raised" (at module level a NameError;
    https://docs.python.org/3/reference/executionmodel.html#resolution-of-names), so the DDP run (the path a
    single-GPU test never takes) fails there.  Only names not bound before the ``if`` in the same scope, not bound in
    the DDP branch, and whose first mention after the ``if`` in its block is a read; a DDP branch that ends in
    ``return``/``raise`` never reaches the read.

    Returns:
        ``[(the Name read, the if statement)]``, one per name.
    """
    out: list[tuple[ast.Name, ast.If]] = []
    for node in subtree(tree):
        if isinstance(node, ast.If) and not node.orelse and _DIST_TEST.search(ast.unparse(node.test)):
            only = _bound(node.body)  # `if dist.is_initialized(): sampler = DistributedSampler(ds)`, no else:
            # the one-process run (no group, world size 1) never binds it (ColossalAI's train_prompts.py)
        elif isinstance(node, ast.If) and node.orelse:
            branches = (node.body, node.orelse)
            ddp = [any(isinstance(c, ast.Call) and DDP_CTOR.match(call_name(c)) for s in b for c in ast.walk(s))
                   for b in branches]
            if ddp[0] == ddp[1]:
                continue
            wrap, other = (node.body, node.orelse) if ddp[0] else (node.orelse, node.body)
            if isinstance(wrap[-1], (ast.Return, ast.Raise, ast.Continue, ast.Break)):
                continue
            only = _bound(other) - _bound(wrap)
        else:
            continue
        if not only:
            continue
        block, scope = _block_of(node, parents)
        if block is None:
            continue
        before = _bound(block[:block.index(node)])
        if not node.orelse and scope is not None:  # also what the scope binds on an earlier line (a loop target)
            before |= {n.id for n in subtree(scope) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Store)
                       and n.lineno < node.lineno}
            before |= _bound([s for s in subtree(scope) if isinstance(s, (ast.Import, ast.ImportFrom, ast.FunctionDef,
                              ast.ClassDef, ast.Global, ast.Nonlocal)) and s is not scope and s.lineno < node.lineno])
        if isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef)):
            args = scope.args
            before |= {a.arg for a in [*args.posonlyargs, *args.args, *args.kwonlyargs, args.vararg, args.kwarg] if a}
            before |= _bound([s for s in scope.body if isinstance(s, (ast.Global, ast.Nonlocal))])
        else:
            continue  # module level: other modules may bind the name (from x import *), keep to functions
        only -= before
        after = block[block.index(node) + 1:]
        mentions = sorted((n for s in after for n in ast.walk(s) if isinstance(n, ast.Name) and n.id in only),
                          key=lambda n: (n.lineno, n.col_offset))
        seen: set[str] = set()
        for n in mentions:
            if n.id in seen:
                continue
            seen.add(n.id)
            if isinstance(n.ctx, ast.Load) and not _under_same_test(n, node, parents):
                out.append((n, node))
    return out


_DIST_TEST = re.compile(r"is_initialized\(\)|get_world_size\(\)\s*>|world_size\s*>\s*1|\bdistributed\b|\bddp\b|"
                        r"is_distributed|local_rank\s*!=\s*-1|num_processes\s*>\s*1")
"""A test that is true only in a distributed run (a group exists, several processes)."""


def _under_same_test(read: ast.AST, branch: ast.If, parents: Mapping[ast.AST, ast.AST]) -> bool:
    """``read`` sits under an ``if``/conditional expression that tests a name the DDP ``if`` tested too
    (``if not ddp: use(model_module)``): the same condition guards both, so the read is on the bound path."""
    names = {n.id for n in ast.walk(branch.test) if isinstance(n, ast.Name)} | \
            {n.attr for n in ast.walk(branch.test) if isinstance(n, ast.Attribute)}
    p = parents.get(read)
    while p is not None and p is not branch:
        if isinstance(p, (ast.If, ast.IfExp, ast.While)) and \
                any(isinstance(n, ast.Name) and n.id in names or isinstance(n, ast.Attribute) and n.attr in names
                    for n in ast.walk(p.test)):
            return True
        if isinstance(p, (ast.FunctionDef, ast.AsyncFunctionDef)):
            break
        p = parents.get(p)
    return False


def _block_of(node: ast.stmt, parents: Mapping[ast.AST, ast.AST]) -> tuple[list[ast.stmt] | None, ast.AST | None]:
    """The statement list holding ``node`` and the enclosing function (or module)."""
    parent = parents.get(node)
    block = None
    for fld in ("body", "orelse", "finalbody", "handlers"):
        b = getattr(parent, fld, None)
        if isinstance(b, list) and node in b:
            block = b
    scope = parent
    while scope is not None and not isinstance(scope, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Module)):
        scope = parents.get(scope)
    return block, scope


__all__ = ["BUFFER_FREE_LAYERS", "DDP_CTOR", "UNWRAP_CALLS", "WRAPPER_OWN", "Wrapped", "WrapperFlow", "call_name", "unbound_after_wrap"]
