"""Per-rank memory of the model states (parameters, gradients, optimizer states) of a data-parallel job.

What each data-parallel strategy keeps on every rank, from the ZeRO paper's accounting
(Rajbhandari et al. 2020, "ZeRO: Memory Optimizations Toward Training Trillion Parameter
Models", section 3.1 and figure 1, https://arxiv.org/abs/1910.02054), for a model of Ψ
parameters on N data-parallel ranks (D16, Gilbreth 7.1):

==================  =========  =========  ==================  ============
strategy            params     grads      optimizer states    total
==================  =========  =========  ==================  ============
ddp / zero0         2Ψ         2Ψ         12Ψ                 16Ψ
zero1               2Ψ         2Ψ         12Ψ/N               4Ψ + 12Ψ/N
zero2               2Ψ         2Ψ/N       12Ψ/N               2Ψ + 14Ψ/N
zero3               2Ψ/N       2Ψ/N       12Ψ/N               16Ψ/N
==================  =========  =========  ==================  ============

with mixed-precision Adam (bf16 or fp16 compute copies, K = 12 bytes of fp32 state per
parameter: the master copy 4Ψ, momentum 4Ψ, variance 4Ψ).  fp32 training keeps 4Ψ params,
4Ψ grads and 8Ψ Adam moments (no separate master copy).  PyTorch FSDP shards the same way
(``NO_SHARD`` = DDP, ``SHARD_GRAD_OP`` = ZeRO-2, ``FULL_SHARD`` = ZeRO-3, seed D13), but keeps
its sharded parameters in fp32 (they are the master copy) and its sharded gradients in fp32;
its totals equal the ZeRO totals, its split between the columns differs (see :func:`estimate`).

Offload (DeepSpeed ``offload_optimizer`` / ``offload_param``, ZeRO-Offload: Ren et al. 2021,
https://arxiv.org/abs/2101.06840) moves the fp32 master, the moments and an fp32 gradient
partition (4Ψ/N) to host RAM; ZeRO-3 also keeps its 2-byte gradient partition there, and with
``offload_param`` its parameter partition: ZeRO-2 2Ψ (device) + 16Ψ/N (host), ZeRO-3 2Ψ/N
(device) + 18Ψ/N (host), ZeRO-3 with parameter offload 20Ψ/N (host).  Measured on DeepSpeed
0.19.8 in chapter 05 (D16).

DDP's gradient buckets (``ddp`` only, :attr:`Estimate.grad_buckets`, in ``total``): PyTorch's
``DistributedDataParallel`` all-reduces gradients through flat bucket tensors, one more full copy of
the gradients unless ``gradient_as_bucket_view=True`` makes each ``param.grad`` a view into its
bucket (torch 2.13 ``torch/nn/parallel/distributed.py``, the ``gradient_as_bucket_view`` docstring:
"the saved memory size will be equal to the total gradients size"; :data:`DDP_DOCS`).  So DDP with
mixed-precision Adam holds 16Ψ of model states (the ZeRO paper's figure) plus 2Ψ of buckets: 18Ψ;
with ``torch.autocast`` (fp32 parameters, the usual DDP + AMP: ``precision="fp32"`` here, since
autocast changes only the activations) 16Ψ + 4Ψ = 20Ψ.

Not included, on purpose: activations (they depend on batch and sequence length, not on the
strategy: :func:`activation_bytes_formula`), ZeRO's and FSDP's communication buffers, allocator fragmentation,
the CUDA context, and the working set of all-gathered layers under ZeRO-3/FULL_SHARD.
DeepSpeed's own estimators (``deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs``
and ``deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs``, and their ``_all_live``
/ ``_all_cold`` wrappers) add a 1.5 "additional buffer factor" to host RAM, count the 4Ψ/N fp32
gradient partition that ZeRO-1/2/3 build while the optimizer steps (``step_transient`` here),
and leave out ZeRO-3's 2-byte gradient partition, which 0.19.8 keeps allocated;
``tests/unit/test_memory.py`` checks each difference.

Command line (the ``runbook estimate-memory`` subcommand calls :func:`main`)::

    runbook estimate-memory --params 1.3e9 --world-size 8 --strategy zero2 [--precision bf16-mixed] [--offload cpu]
    runbook estimate-memory --params 7B --world-size 16 --strategy all

Nothing runs at import; torch is imported only by :func:`params_of`.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

from helpers.report import human_bytes
from helpers.validate import whole_number

ZERO_PAPER = "ZeRO paper, Rajbhandari et al. 2020, sec. 3.1 and fig. 1: https://arxiv.org/abs/1910.02054"
ZERO_OFFLOAD_PAPER = "ZeRO-Offload, Ren et al. 2021: https://arxiv.org/abs/2101.06840"
DS_ESTIMATOR = ("DeepSpeed 0.19.8 deepspeed/runtime/zero/stage_1_and_2.py estimate_zero2_model_states_mem_needs, "
                "stage3.py estimate_zero3_model_states_mem_needs; https://deepspeed.readthedocs.io/en/latest/memory.html")
FSDP_DOCS = ("PyTorch FSDP: https://pytorch.org/docs/stable/fsdp.html (ShardingStrategy), "
             "FSDP2 MixedPrecisionPolicy: https://pytorch.org/docs/stable/distributed.fsdp.fully_shard.html")
DDP_DOCS = ("torch 2.13 torch/nn/parallel/distributed.py, DistributedDataParallel(gradient_as_bucket_view=False): "
            "https://docs.pytorch.org/docs/stable/generated/torch.nn.parallel.DistributedDataParallel.html")
KORTHIKANTI = ("Korthikanti et al. 2022, Reducing Activation Recomputation in Large Transformer Models, "
               "sec. 4.1 eq. (1): https://arxiv.org/abs/2205.05198")

STRATEGIES = ("ddp", "zero0", "zero1", "zero2", "zero3", "fsdp_no_shard", "fsdp_shard_grad_op",
              "fsdp_full_shard", "fsdp_hybrid_shard")
PRECISIONS = ("bf16-mixed", "fp16-mixed", "fp32")
# Bytes of optimizer state per parameter, in fp32, besides the master copy (Adam: m and v).
OPTIMIZER_STATE_BYTES = {"adam": 8, "adamw": 8, "sgd": 4, "lion": 4}
OFFLOADS = (None, "cpu", "cpu+param")

# strategy -> (params sharded, grads sharded, optimizer states sharded)
_SHARDING = {
    "ddp": (False, False, False),
    "zero0": (False, False, False),
    "zero1": (False, False, True),
    "zero2": (False, True, True),
    "zero3": (True, True, True),
    "fsdp_no_shard": (False, False, False),
    "fsdp_shard_grad_op": (True, True, True),
    "fsdp_full_shard": (True, True, True),
    "fsdp_hybrid_shard": (True, True, True),
}


@dataclass(frozen=True)
class Estimate:
    """Bytes of model states held by ONE rank, by component.

    Attributes:
        strategy, precision, optimizer, offload, world_size, n_params: the inputs
            (``shard_size`` for ``fsdp_hybrid_shard``: ranks that shard one replica).
        params: bytes of the parameters the rank keeps (low-precision copies under
            DeepSpeed mixed precision; fp32 sharded parameters under FSDP mixed precision).
        grads: bytes of gradients held at the end of backward.
        optimizer_states: bytes of optimizer state, including the fp32 master copy when the
            strategy keeps one apart from ``params`` (``master`` + ``moments``).
        master, moments: the two parts of ``optimizer_states``.
        total: params + grads + optimizer_states.
        device_bytes, host_bytes: ``total`` split by where it lives (everything on the
            device unless ``offload`` moves it to host RAM).
        step_transient: extra bytes DeepSpeed allocates while the optimizer steps (the fp32
            gradient partition of ZeRO-1/2/3, 4Ψ/N in mixed precision), not in ``total``.
        compute_copy: bytes of unsharded compute-precision parameters that FSDP SHARD_GRAD_OP
            keeps from forward to backward (0 elsewhere; ZeRO-3/FULL_SHARD hold one layer's
            worth, which depends on the model), not in ``total``.
        formulas: component -> formula in Ψ (params) and N (world or shard size).
        grad_buckets: bytes of DDP's gradient buckets (``ddp`` without ``bucket_view``: one more
            copy of the gradients, in their dtype), in ``total`` and ``device_bytes``; 0 elsewhere.
        sources: where each formula comes from.  notes: caveats for this configuration.
    """

    strategy: str
    precision: str
    optimizer: str
    offload: str | None
    world_size: int
    n_params: int
    params: int
    grads: int
    optimizer_states: int
    master: int
    moments: int
    total: int
    device_bytes: int
    host_bytes: int
    step_transient: int
    compute_copy: int
    shard_size: int | None = None
    grad_buckets: int = 0
    formulas: dict[str, str] = field(default_factory=dict)
    sources: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    def components(self) -> dict[str, int]:
        """``{"params": ..., "grads": ..., "optimizer_states": ..., "grad_buckets": ...}`` in bytes (their sum is ``total``)."""
        return {"params": self.params, "grads": self.grads, "optimizer_states": self.optimizer_states,
                "grad_buckets": self.grad_buckets}

    def to_dict(self) -> dict[str, Any]:
        """JSON-serialisable form."""
        return asdict(self)


def _frac(coef: float, sharded: bool, n_sym: str) -> str:
    c = f"{coef:g}Ψ"
    return f"{c}/{n_sym}" if sharded else c


def estimate(params: int, world_size: int, strategy: str, precision: str = "bf16-mixed", optimizer: str = "adam",
             offload: str | None = None, *, shard_size: int | None = None, bucket_view: bool = False) -> Estimate:
    """Estimate the bytes of model states each rank holds (params, grads, optimizer states).

    Args:
        params: number of parameters Ψ of the whole model (``params_of(model)``), >= 0.
        world_size: data-parallel ranks N (GPUs in the job), >= 1.
        strategy: one of ``STRATEGIES``: ``ddp``/``zero0`` (no sharding), ``zero1`` (optimizer
            states), ``zero2`` (+ gradients), ``zero3`` (+ parameters), and the FSDP
            ``ShardingStrategy`` names (``fsdp_no_shard``, ``fsdp_shard_grad_op``,
            ``fsdp_full_shard``, ``fsdp_hybrid_shard`` with ``shard_size``).
        precision: ``bf16-mixed`` / ``fp16-mixed`` (2-byte compute copies, fp32 master and
            optimizer states) or ``fp32``.
        optimizer: ``adam``/``adamw`` (8 bytes of fp32 moments per parameter), ``sgd`` (with
            momentum) or ``lion`` (4 bytes).
        offload: ``None`` (all on the device), ``cpu`` (DeepSpeed ``offload_optimizer``:
            fp32 master, moments and the fp32 gradient partition live in host RAM, and under
            ZeRO-3 the 2-byte gradient partition too; ZeRO-1/2/3 only), ``cpu+param`` (ZeRO-3
            ``offload_param`` as well: the 2-byte parameter partition moves to host RAM too).
        shard_size: ranks per replica for ``fsdp_hybrid_shard`` (e.g. GPUs per node); the
            state is sharded over ``shard_size`` ranks instead of ``world_size``.
        bucket_view: ``ddp`` only: the job passes ``gradient_as_bucket_view=True`` to
            ``DistributedDataParallel``, so the gradients live in the buckets (no second copy).

    Returns:
        An :class:`Estimate` (bytes are rounded down to whole bytes per component).

    Raises:
        ValueError: naming the field, for an unknown strategy, precision, optimizer or
            offload, ``params`` < 0, ``world_size`` < 1, an offload the strategy does not
            support, or a missing/invalid ``shard_size``.

    Sources: ZeRO paper section 3.1 (K = 12 for mixed-precision Adam) and figure 1; ZeRO-Offload
    (Ren et al. 2021) and DeepSpeed's ``offload_optimizer``/``offload_param`` for the host side;
    PyTorch FSDP docs for the FSDP layouts; seed D16.
    """
    n_params = whole_number(params, "params", 0)
    world = whole_number(world_size, "world_size", 1)
    if strategy not in STRATEGIES:
        raise ValueError(f"strategy={strategy!r}: accepted values are {', '.join(STRATEGIES)}")
    if precision not in PRECISIONS:
        raise ValueError(f"precision={precision!r}: accepted values are {', '.join(PRECISIONS)}")
    if optimizer not in OPTIMIZER_STATE_BYTES:
        raise ValueError(f"optimizer={optimizer!r}: accepted values are {', '.join(OPTIMIZER_STATE_BYTES)}")
    if offload == "none":
        offload = None
    if offload not in OFFLOADS:
        raise ValueError(f"offload={offload!r}: accepted values are None, 'none', 'cpu', 'cpu+param'")
    is_zero = strategy.startswith("zero")
    if offload is not None and strategy not in ("zero1", "zero2", "zero3"):
        raise ValueError(f"offload={offload!r}: DeepSpeed offload needs strategy zero1, zero2 or zero3, "
                         f"got strategy={strategy!r}")
    if offload == "cpu+param" and strategy != "zero3":
        raise ValueError(f"offload='cpu+param': parameter offload needs strategy='zero3', got {strategy!r}")
    n_sym = "N"
    if strategy == "fsdp_hybrid_shard":
        if shard_size is None:
            raise ValueError("shard_size=None: fsdp_hybrid_shard needs shard_size (ranks per replica, e.g. GPUs per node)")
        shard = whole_number(shard_size, "shard_size", 1)
        if world % shard:
            raise ValueError(f"shard_size={shard}: must divide world_size={world}")
        n_sym = "S"
    else:
        if shard_size is not None:
            raise ValueError(f"shard_size={shard_size!r}: only used with strategy='fsdp_hybrid_shard'")
        shard = world

    psi = n_params
    mixed = precision != "fp32"
    lp = 2 if mixed else 4                      # bytes of a compute-precision value
    k_opt = OPTIMIZER_STATE_BYTES[optimizer]    # fp32 moments
    p_sh, g_sh, o_sh = _SHARDING[strategy]

    def part(nbytes_per_param: int, sharded: bool) -> int:
        return (nbytes_per_param * psi) // shard if sharded else nbytes_per_param * psi

    sources = [ZERO_PAPER]
    notes: list[str] = []
    step_transient = 0
    compute_copy = 0
    if strategy.startswith("fsdp") and mixed:
        # FSDP mixed precision: the sharded parameters stay fp32 (they are the master copy),
        # gradients are cast back to fp32 on the shard; bf16 copies exist only for compute.
        params_b, p_coef = part(4, p_sh), 4
        grads_b, g_coef = part(4, g_sh), 4
        master_b, m_coef = 0, 0
        sources.append(FSDP_DOCS)
        notes.append("FSDP keeps fp32 (sharded) parameters and gradients; bf16 copies are made for compute only, "
                     "so the split differs from DeepSpeed's while the total is the same")
    else:
        params_b, p_coef = part(lp, p_sh), lp
        grads_b, g_coef = part(lp, g_sh), lp
        master_b, m_coef = (part(4, o_sh), 4) if mixed else (0, 0)
    if strategy == "fsdp_shard_grad_op":
        compute_copy = lp * psi
        notes.append(f"SHARD_GRAD_OP keeps the unsharded {'bf16' if mixed else 'fp32'} parameters from forward to "
                     f"backward: compute_copy = {lp}Ψ at the peak (measured in chapter 04, D13)")
    moments_b = part(k_opt, o_sh)
    optim_b = master_b + moments_b
    if is_zero and mixed:
        # DeepSpeed 0.19.8 builds fp32 gradients for the optimizer step and frees them after it:
        # the rank's partition at ZeRO-1/2/3 (stage_1_and_2.py, stage3.py: 4Ψ/N), the whole model
        # at ZeRO-0 (runtime/fp16/unfused_optimizer.py: 4Ψ).  Measured in chapter 05 (D16).
        step_transient = (4 * psi) // shard if strategy != "zero0" else 4 * psi
        sources.append(DS_ESTIMATOR)
    if strategy in ("zero1", "zero2"):
        notes.append("DeepSpeed 0.19.8 reduces the gradients at the accumulation boundary into a buffer holding the "
                     "whole gradient of every parameter that overlaps the rank's partition (params_in_partition): "
                     "up to 2 x 2 bytes x the largest parameter more than 2Ψ/N")
    if strategy == "zero1":
        notes.append("so right after the boundary backward DeepSpeed 0.19.8's ZeRO-1 holds what ZeRO-2 holds; "
                     "the paper's full 2Ψ of gradients is held between boundaries (gradient_accumulation_steps > 1), "
                     "which is the peak this estimate reports")
    if strategy == "zero3":
        notes.append("plus one layer's gathered parameters while it computes, and parameters below "
                     "stage3_param_persistence_threshold (1e5 elements) that every rank keeps whole")

    formulas = {
        "params": _frac(p_coef, p_sh, n_sym),
        "grads": _frac(g_coef, g_sh, n_sym),
        "optimizer_states": _frac(m_coef + k_opt, o_sh, n_sym),
    }
    host = 0
    if offload is not None:
        sources.append(ZERO_OFFLOAD_PAPER)
        # offload_optimizer: the fp32 master, the moments and an fp32 gradient partition live in
        # host RAM (DeepSpeed copies each reduced gradient into it; the step runs on the CPU).
        # ZeRO-1/2 reduce through device buckets straight into that fp32 partition; ZeRO-3 also
        # keeps its 2-byte gradient partition (grad_partitions_flat_buffer) on the optimizer's
        # device, i.e. the host (stage3.py, DeepSpeed 0.19.8; measured in chapter 05).
        fp32_grads = (4 * psi) // shard
        step_transient = 0
        if strategy == "zero3" and mixed:
            grads_b = fp32_grads + grads_b
            formulas["grads"] = f"{lp}Ψ/N + 4Ψ/N (2-byte and fp32 partitions, host)"
        else:
            grads_b = fp32_grads
            formulas["grads"] = "4Ψ/N (fp32 partition, host)"
        host = grads_b + optim_b
        notes.append("offload_optimizer=cpu: gradients are reduced into an fp32 partition in host RAM; "
                     "DeepSpeed's estimators multiply host RAM by 1.5 for buffers")
        if offload == "cpu+param":
            host += params_b
            notes.append("offload_param=cpu: the device keeps only the layers being computed "
                         "(DeepSpeed's estimator counts 4 bytes x the largest layer)")
    buckets = 0
    if strategy == "ddp":
        sources.append(DDP_DOCS)
        if bucket_view:
            notes.append("gradient_as_bucket_view=True: the gradients are views into DDP's all-reduce buckets, "
                         "no second copy")
        else:
            buckets = grads_b
            notes.append(f"DDP all-reduces through flat gradient buckets, a second copy of the gradients "
                         f"({g_coef}Ψ); gradient_as_bucket_view=True (--bucket-view) makes the gradients views "
                         "into them and saves it")
        if mixed:
            notes.append("bf16-mixed here is the ZeRO paper's layout (2-byte parameters and gradients, an fp32 master "
                         "copy in the optimizer); DDP with torch.autocast keeps fp32 parameters and gradients: "
                         "that is --precision fp32 (autocast changes only the activations)")
    elif bucket_view:
        raise ValueError(f"bucket_view=True: only DistributedDataParallel has gradient buckets (strategy='ddp'), "
                         f"got strategy={strategy!r}")
    total = params_b + grads_b + optim_b + buckets
    device = total - host
    formulas["total"] = {
        (False, False, False): f"{p_coef + g_coef + m_coef + k_opt}Ψ",
        (False, False, True): f"{p_coef + g_coef}Ψ + {m_coef + k_opt}Ψ/{n_sym}",
        (False, True, True): f"{p_coef}Ψ + {g_coef + m_coef + k_opt}Ψ/{n_sym}",
        (True, True, True): f"{p_coef + g_coef + m_coef + k_opt}Ψ/{n_sym}",
    }[(p_sh, g_sh, o_sh)]
    if offload is not None:
        host_coef = 4 + (lp if strategy == "zero3" and mixed else 0) + m_coef + k_opt
        if offload == "cpu":
            formulas["total"] = f"{formulas['params']} (device) + {host_coef}Ψ/N (host)"
        else:
            formulas["total"] = f"{p_coef}Ψ/N + {host_coef}Ψ/N = {p_coef + host_coef}Ψ/N (host)"
    if buckets:
        formulas["grad_buckets"] = f"{g_coef}Ψ"
        formulas["total"] = f"{p_coef + g_coef + m_coef + k_opt + g_coef}Ψ ({formulas['total']} + {g_coef}Ψ DDP buckets)"
    if compute_copy:
        formulas["total"] += f" (+ {lp}Ψ unsharded from forward to backward)"
    return Estimate(strategy=strategy, precision=precision, optimizer=optimizer, offload=offload, world_size=world,
                    n_params=psi, params=params_b, grads=grads_b, optimizer_states=optim_b, master=master_b,
                    moments=moments_b, total=total, device_bytes=device, host_bytes=host,
                    step_transient=step_transient, compute_copy=compute_copy,
                    shard_size=shard if strategy == "fsdp_hybrid_shard" else None, grad_buckets=buckets, formulas=formulas,
                    sources=tuple(dict.fromkeys(sources)), notes=tuple(notes))


def params_of(model: Any, *, trainable_only: bool = False) -> int:
    """Number of parameters of a ``torch.nn.Module``, each shared parameter counted once.

    Works on a model built on the meta device (``torch.device("meta")``), which allocates no
    memory: build the real architecture there and count it before you pick a strategy.
    Sharing is resolved by parameter identity (``module.parameters()`` yields a tied weight
    once).  DeepSpeed's ``model_to_params`` dedupes by ``data_ptr()`` instead, which is 0 for
    every meta tensor: on a meta model it counts only one tensor (see tests/unit/test_memory.py).

    Args:
        model: the module.  trainable_only: count only parameters with ``requires_grad``.

    Returns:
        The parameter count Ψ.

    Raises:
        ValueError: ``model`` has no ``parameters()`` method (names the field).
    """
    if not hasattr(model, "parameters"):
        raise ValueError(f"model={type(model).__name__}: expected a torch.nn.Module (needs .parameters())")
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)


def activation_bytes_formula(kind: str, *, batch: int, bytes_per_value: int = 2, widths: Sequence[int] | None = None,
                             seq_len: int | None = None, hidden: int | None = None, heads: int | None = None,
                             layers: int | None = None) -> tuple[str, int]:
    """Bytes of activations autograd saves for backward in one forward pass, with its formula.

    Activations are reported apart from the model states on purpose: they scale with batch and
    sequence length, not with the data-parallel strategy.

    Args:
        kind: ``mlp`` (``Linear -> act -> Linear -> ... -> Linear`` with an elementwise
            activation such as GELU after every hidden layer; ``widths`` = [d0, d1, ..., dk]) or
            ``transformer`` (GPT-style layers; ``seq_len``, ``hidden``, ``heads``, ``layers``).
        batch: micro-batch size per rank b.
        bytes_per_value: 2 for bf16/fp16 activations, 4 for fp32.

    Returns:
        ``(formula, bytes)``.  MLP: each Linear saves its input and each activation saves its
        input, so ``b * bytes * (d0 + 2 * sum(d1..d(k-1)))`` (the loss's own saved tensors are
        not counted).  Transformer: ``L * s * b * h * (34 + 5 * a * s / h)`` bytes with 16-bit
        activations, no recomputation, no tensor or sequence parallelism (Korthikanti et al.
        2022, eq. 1; the 34 assumes 2-byte values and 1-byte dropout masks, so
        ``bytes_per_value`` must be 2).

    Raises:
        ValueError: unknown ``kind``, or a missing/invalid field for it (named).
    """
    b = whole_number(batch, "batch", 1)
    if bytes_per_value not in (1, 2, 4, 8):
        raise ValueError(f"bytes_per_value={bytes_per_value!r}: accepted values are 1, 2, 4, 8")
    if kind == "mlp":
        if widths is None or len(widths) < 2:
            raise ValueError(f"widths={widths!r}: mlp needs at least [d_in, d_out]")
        ws = [whole_number(w, "widths", 1) for w in widths]
        hidden_sum = sum(ws[1:-1])
        value = b * bytes_per_value * (ws[0] + 2 * hidden_sum)
        formula = (f"b*bytes*(d0 + 2*sum(hidden widths)) = {b}*{bytes_per_value}*({ws[0]} + 2*{hidden_sum})"
                   f" = {value} B")
        return formula, value
    if kind == "transformer":
        s = whole_number(seq_len, "seq_len", 1) if seq_len is not None else None
        h = whole_number(hidden, "hidden", 1) if hidden is not None else None
        a = whole_number(heads, "heads", 1) if heads is not None else None
        n_layers = whole_number(layers, "layers", 1) if layers is not None else None
        for name, v in (("seq_len", s), ("hidden", h), ("heads", a), ("layers", n_layers)):
            if v is None:
                raise ValueError(f"{name}=None: transformer needs seq_len, hidden, heads and layers")
        if bytes_per_value != 2:
            raise ValueError(f"bytes_per_value={bytes_per_value!r}: the transformer formula assumes 2 (16-bit)")
        per_layer = s * b * h * (34 + 5 * a * s / h)
        value = int(n_layers * per_layer)
        formula = (f"L*s*b*h*(34 + 5*a*s/h) = {n_layers}*{s}*{b}*{h}*(34 + 5*{a}*{s}/{h}) = {value} B "
                   f"[{KORTHIKANTI}]")
        return formula, value
    raise ValueError(f"kind={kind!r}: accepted values are mlp, transformer")


# Stage labels of helpers/scenarios/ds_zero_memory.py -> (strategy, offload, moment to compare).
MEASURED_STAGES = {
    "0": ("zero0", None, "after_backward"),
    "1": ("zero1", None, "after_backward"),
    "2": ("zero2", None, "after_backward"),
    "3": ("zero3", None, "after_backward"),
    "1-accum2": ("zero1", None, "mid_accumulation"),
    "2-offload": ("zero2", "cpu", "after_backward"),
    "3-offload": ("zero3", "cpu+param", "after_backward"),
}


def compare_measured(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of measured vs estimated model-state bytes, one per stage and rank.

    Args:
        result: the JSON written by ``helpers/scenarios/ds_zero_memory.py`` (chapter 05, D16).

    Returns:
        Dicts with ``stage``, ``rank``, ``strategy``, ``offload``, ``moment`` and, for
        ``params``/``grads``/``optimizer_states``/``total``, the measured and estimated bytes
        (``measured_params``, ``estimated_params``...), plus ``error`` = measured/estimated - 1
        of the total, ``fp32_grads_in_step`` (measured) and ``step_transient`` (estimated).
        Measured grads = 2-byte gradients + fp32 gradients held at that moment; measured
        optimizer states = fp32 master + moments (the Estimate's definitions).

    Raises:
        ValueError: a stage label this function does not know (names it).
    """
    rows = []
    world = int(result["world_size"])
    for entry in result["stages"]:
        label = entry["stage"]
        if label not in MEASURED_STAGES:
            raise ValueError(f"stage={label!r}: accepted values are {', '.join(MEASURED_STAGES)}")
        strategy, offload, moment = MEASURED_STAGES[label]
        est = estimate(int(entry["n_params"]), world, strategy, offload=offload)
        for rank, moments in sorted(entry["ranks"].items(), key=lambda kv: int(kv[0])):
            m = moments[moment]
            measured = {"params": m["params"], "grads": m["grads"] + m["fp32_grads"],
                        "optimizer_states": m["master"] + m["moments"]}
            measured["total"] = sum(measured.values())
            row: dict[str, Any] = {"stage": label, "rank": int(rank), "strategy": strategy, "offload": offload,
                                   "moment": moment, "formula": est.formulas["total"]}
            for key in ("params", "grads", "optimizer_states", "total"):
                row[f"measured_{key}"] = measured[key]
                row[f"estimated_{key}"] = getattr(est, key)
            row["error"] = measured["total"] / est.total - 1 if est.total else float("nan")
            row["fp32_grads_in_step"] = moments.get("in_step", {}).get("fp32_grads")
            row["step_transient"] = est.step_transient
            row["buffers"] = m.get("buffers", 0)
            rows.append(row)
    return rows


def compare_fsdp_measured(result: dict[str, Any], moment: str = "after_backward") -> list[dict[str, Any]]:
    """Rows of measured vs estimated model-state bytes for the FSDP runs of chapter 04 (D13).

    Args:
        result: the JSON written by ``helpers/scenarios/fsdp_sharding.py`` (fp32 parameters,
            Adam).  Its strategies map to ``fsdp_<strategy>``; ``hybrid_shard`` is estimated
            with ``shard_size`` = the mesh's shard dimension.
        moment: which measurement to compare (``after_forward``, ``after_backward``,
            ``after_step``); at ``after_backward`` params, grads and Adam moments are all live.

    Returns:
        Dicts in :func:`compare_measured`'s format (``stage`` is ``"<strategy> N=<world_size>"``), so
        :func:`plot_comparison` draws them; plus ``measured_compute`` and ``estimated_compute``
        (unsharded parameters held at ``after_forward``: SHARD_GRAD_OP's ``compute_copy``).
        Measured optimizer states = Adam's ``exp_avg`` + ``exp_avg_sq`` + ``step`` (FSDP's
        sharded fp32 parameters are the master copy, counted in params).

    Raises:
        ValueError: an unknown strategy or moment (names it).
    """
    if moment not in ("after_forward", "after_backward", "after_step"):
        raise ValueError(f"moment={moment!r}: accepted values are after_forward, after_backward, after_step")
    rows = []
    world = int(result["world_size"])
    for entry in result["strategies"]:
        strategy = f"fsdp_{entry['strategy']}"
        if strategy not in STRATEGIES:
            raise ValueError(f"strategy={entry['strategy']!r}: accepted values are full_shard, shard_grad_op, "
                             "no_shard, hybrid_shard")
        shard = int(entry["mesh"][-1]) if strategy == "fsdp_hybrid_shard" else None
        est = estimate(int(entry["n_params"]), world, strategy, precision="fp32", optimizer="adam", shard_size=shard)
        for rank, rec in sorted(entry["ranks"].items(), key=lambda kv: int(kv[0])):
            m = rec[moment]
            row: dict[str, Any] = {"stage": f"{entry['strategy']} N={world}", "rank": int(rank), "strategy": strategy,
                                   "world_size": world,
                                   "offload": None, "moment": moment, "formula": est.formulas["total"],
                                   "measured_params": m["params"], "estimated_params": est.params,
                                   "measured_grads": m["grads"], "estimated_grads": est.grads,
                                   "measured_optimizer_states": m["moments"],
                                   "estimated_optimizer_states": est.optimizer_states,
                                   "measured_total": m["total"], "estimated_total": est.total,
                                   "measured_compute": rec["after_forward"]["compute"],
                                   "estimated_compute": est.compute_copy}
            row["error"] = m["total"] / est.total - 1 if est.total else float("nan")
            rows.append(row)
    return rows


def plot_comparison(rows: Sequence[dict[str, Any]], rank: int = 0, ax: Any = None) -> Any:
    """One figure: for each stage, a measured and an estimated bar stacked by component (MiB).

    Args:
        rows: from :func:`compare_measured`; rank: which rank's measurements to draw.
        ax: a matplotlib Axes to draw into (default: a new figure).

    Returns:
        The matplotlib Figure.
    """
    import matplotlib.pyplot as plt

    mine = [r for r in rows if r["rank"] == rank]
    if ax is None:
        _, ax = plt.subplots(figsize=(1.6 * len(mine) + 2, 4))
    colors = {"params": "#4C72B0", "grads": "#DD8452", "optimizer_states": "#55A868"}
    width = 0.38
    for i, row in enumerate(mine):
        for j, kind in enumerate(("measured", "estimated")):
            bottom = 0.0
            for comp, color in colors.items():
                value = row[f"{kind}_{comp}"] / 2**20
                ax.bar(i + (j - 0.5) * width, value, width, bottom=bottom, color=color,
                       alpha=1.0 if kind == "measured" else 0.45, edgecolor="black", linewidth=0.4,
                       label=f"{comp} ({kind})" if i == 0 else None)
                bottom += value
        top = max(row["measured_total"], row["estimated_total"]) / 2**20
        ax.text(i, top * 1.02, f"{row['error']:+.1%}", ha="center", va="bottom", fontsize=8)
    ax.set_xticks(range(len(mine)))
    ax.set_xticklabels([f"{r['stage']}\n{r['formula'].split(' (')[0]}" for r in mine], fontsize=8)
    ax.set_ylabel("MiB per rank")
    ax.set_ylim(0, max(max(r["measured_total"], r["estimated_total"]) for r in mine) / 2**20 * 1.45)
    ax.set_title(f"Model states per rank (rank {rank}): measured (solid) vs helpers.memory.estimate (pale)")
    ax.legend(fontsize=7, ncol=2)
    ax.figure.tight_layout()
    return ax.figure


_SUFFIX = {"k": 3, "m": 6, "b": 9, "g": 9, "t": 12}
MAX_PARAMS = 10**15
"""The largest parameter count :func:`parse_count` accepts (a thousand times the largest models trained so far)."""


def parse_count(text: str) -> int:
    """Parse a parameter count as people write it: ``8.3B``, ``7e9``, ``1.5M``, ``350m``, ``1,300,000,000``, ``70 B``.

    Exact decimal arithmetic (``8.3B`` is 8,300,000,000, not a float's 8,299,999,999), so no
    float overflow either: ``1e400`` is refused with a message, never an ``OverflowError``.

    Returns:
        The count, 1 .. :data:`MAX_PARAMS`.

    Raises:
        ValueError: not a count, not a whole number, below 1 or above :data:`MAX_PARAMS`; the
            message names ``--params`` and gives examples.
    """
    from decimal import Decimal, DecimalException

    raw = str(text).strip().replace("_", "").replace(",", "")
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBgGtT]?)", raw)
    if not m:
        raise ValueError(f"--params={text!r}: expected a count such as 8.3B, 7e9, 1.5M or 1300000000")
    try:
        value = Decimal(m.group(1)).scaleb(_SUFFIX[m.group(2).lower()] if m.group(2) else 0)
    except DecimalException:  # an exponent beyond the decimal context's range (1e9999999)
        raise ValueError(f"--params={text!r}: out of range; expected a model size such as 8.3B or 7e9") from None
    if value > MAX_PARAMS:
        raise ValueError(f"--params={text!r}: more than {MAX_PARAMS:.0e} parameters; expected a model size such as "
                         "8.3B or 7e9")
    if value != value.to_integral_value():
        raise ValueError(f"--params={text!r}: not a whole number of parameters")
    if value < 1:
        raise ValueError(f"--params={text!r}: must be at least 1 parameter")
    return int(value)


def format_estimate(est: Estimate) -> str:
    """A plain-text table of one estimate: component, formula, bytes, GiB and where it lives."""
    where_opt = "host" if est.offload else "device"
    where_p = "host" if est.offload == "cpu+param" else "device"
    n_desc = f"shard size {est.shard_size}" if est.shard_size else f"world size {est.world_size}"
    rows = [
        ("params", est.formulas["params"], est.params, where_p),
        ("grads", est.formulas["grads"], est.grads, "host" if est.offload else "device"),
        ("optimizer states", est.formulas["optimizer_states"], est.optimizer_states, where_opt),
        ("  of which fp32 master", "", est.master, where_opt),
        ("  of which moments", "", est.moments, where_opt),
    ]
    if est.grad_buckets:
        rows.append(("DDP gradient buckets", est.formulas["grad_buckets"], est.grad_buckets, "device"))
    rows.append(("total", est.formulas["total"], est.total, "device+host" if est.offload else "device"))
    lines = [f"model states per rank: Ψ = {est.n_params:,} params, {n_desc}, {est.strategy}, "
             f"{est.precision}, {est.optimizer}, offload={est.offload or 'none'}",
             f"{'component':<24}{'formula':<26}{'bytes':>16}{'':>3}{'human':>11}  where"]
    for name, formula, value, where in rows:
        lines.append(f"{name:<24}{formula:<26}{value:>16,}{'':>3}{human_bytes(value):>11}  {where}")
    lines.append(f"device {human_bytes(est.device_bytes)}, host {human_bytes(est.host_bytes)}")
    if est.step_transient:
        lines.append(f"+ {human_bytes(est.step_transient)} while the optimizer steps (the fp32 gradients DeepSpeed "
                     "builds for the step; its own estimator counts them)")
    if est.compute_copy:
        lines.append(f"+ {human_bytes(est.compute_copy)} unsharded compute copy between forward and backward")
    lines.append("not included: activations (--seq-len/--hidden/--layers/--heads/--micro-batch), ZeRO/FSDP "
                 "communication buffers, fragmentation, CUDA context")
    for note in est.notes:
        lines.append(f"note: {note}")
    for src in est.sources:
        lines.append(f"source: {src}")
    return "\n".join(lines)

