"""Batch-size arithmetic of data parallelism (seed D11): effective batch, LR scaling, warmup, gradient checks.

Under DDP every rank processes its own batch and the gradients are averaged, so one
optimizer step sees ``effective batch = per-rank batch x world_size (x gradient-accumulation
steps)``.  A learning rate tuned at one batch size is not right at another: the *linear
scaling rule* (multiply the LR by the factor the batch grew by) with a *gradual warmup*
is the usual baseline, from Goyal et al. 2017, "Accurate, Large Minibatch SGD: Training
ImageNet in 1 Hour", https://arxiv.org/abs/1706.02677 (validated there for SGD with
momentum on ImageNet up to a batch of 8k).

Stdlib only (and :mod:`helpers.validate`, :func:`helpers.report.markdown_table`); nothing runs at import.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence

from helpers.validate import positive_float, positive_int

GOYAL_MAX_VALIDATED_BATCH = 8192
"""Largest minibatch for which Goyal et al. 2017 report the linear scaling rule matching the baseline."""


def effective_batch(per_rank_batch: int, world_size: int, grad_accum_steps: int = 1) -> int:
    """Samples per optimizer step: ``per_rank_batch * world_size * grad_accum_steps``.

    Args:
        per_rank_batch: samples each rank processes per forward (the DataLoader's batch_size).
        world_size: number of ranks.
        grad_accum_steps: micro-batches accumulated before each optimizer step.

    Returns:
        The effective (global) batch size, in samples.

    Raises:
        ValueError: an argument is not an integer >= 1 (names it).
    """
    return (positive_int(per_rank_batch, "per_rank_batch") * positive_int(world_size, "world_size")
            * positive_int(grad_accum_steps, "grad_accum_steps"))


def linear_scaled_lr(base_lr: float, base_batch: int, new_batch: int) -> float:
    """The linear scaling rule (Goyal et al. 2017): ``base_lr * new_batch / base_batch``.

    Args:
        base_lr: the learning rate tuned at ``base_batch``.
        base_batch: the effective batch size ``base_lr`` was tuned for (samples).
        new_batch: the effective batch size of the new run (samples).

    Returns:
        The scaled learning rate.

    Raises:
        ValueError: ``base_lr`` not a finite number > 0, or a batch not an integer >= 1.
    """
    lr = positive_float(base_lr, "base_lr")
    return lr * positive_int(new_batch, "new_batch") / positive_int(base_batch, "base_batch")


def warmup_lr(step: int, warmup_steps: int, target_lr: float, start_lr: float) -> float:
    """Gradual warmup (Goyal et al. 2017, section 2.2): LR at optimizer step ``step`` (0-based).

    Rises linearly from ``start_lr`` at step 0 to ``target_lr`` at ``warmup_steps``, then stays
    at ``target_lr`` (the decay schedule that follows is the caller's).

    Raises:
        ValueError: ``step`` < 0, ``warmup_steps`` < 0, or a LR not a finite number > 0.
    """
    if isinstance(step, bool) or not isinstance(step, int) or step < 0:
        raise ValueError(f"step={step!r}: must be an integer >= 0")
    if isinstance(warmup_steps, bool) or not isinstance(warmup_steps, int) or warmup_steps < 0:
        raise ValueError(f"warmup_steps={warmup_steps!r}: must be an integer >= 0")
    target, start = positive_float(target_lr, "target_lr"), positive_float(start_lr, "start_lr")
    if warmup_steps == 0 or step >= warmup_steps:
        return target
    return start + (target - start) * step / warmup_steps


def lr_scaling_table(base_lr: float, per_rank_batch: int, world_sizes: Iterable[int], *, base_batch: int | None = None,
                     grad_accum_steps: int = 1, dataset_size: int | None = None,
                     warmup_epochs: float = 5.0) -> list[dict]:
    """One row per world size: effective batch, linearly scaled LR, and the warmup length.

    Args:
        base_lr: LR tuned at ``base_batch``.
        per_rank_batch: samples per rank per forward.
        world_sizes: world sizes to tabulate (e.g. ``[1, 2, 4, 8, 16]``).
        base_batch: effective batch ``base_lr`` was tuned at; default: the 1-rank run
            (``per_rank_batch * grad_accum_steps``).
        grad_accum_steps: micro-batches per optimizer step.
        dataset_size: samples per epoch; when given, each row has ``steps_per_epoch`` and
            ``warmup_steps`` (``warmup_epochs`` of optimizer steps, rounded up).
        warmup_epochs: warmup length in epochs (Goyal et al. 2017 use 5).

    Returns:
        A list of dicts with keys ``world_size``, ``effective_batch``, ``scale`` (LR factor),
        ``lr``, ``warmup_start_lr`` (the smaller of ``base_lr`` and ``lr``: warmup climbs from
        the reference LR), ``within_validated`` (effective batch <= 8192), and, with
        ``dataset_size``, ``steps_per_epoch`` and ``warmup_steps`` (0 when the batch did not
        grow: only a scaled-up LR needs a warmup).

    Raises:
        ValueError: a bad argument (names it), or no world size.
    """
    sizes = [positive_int(w, "world_sizes[]") for w in world_sizes]
    if not sizes:
        raise ValueError("world_sizes: give at least one world size")
    if warmup_epochs < 0:
        raise ValueError(f"warmup_epochs={warmup_epochs!r}: must be >= 0")
    ref = base_batch if base_batch is not None else effective_batch(per_rank_batch, 1, grad_accum_steps)
    rows = []
    for w in sizes:
        eff = effective_batch(per_rank_batch, w, grad_accum_steps)
        lr = linear_scaled_lr(base_lr, ref, eff)
        row = {"world_size": w, "effective_batch": eff, "scale": eff / ref, "lr": lr,
               "warmup_start_lr": min(base_lr, lr), "within_validated": eff <= GOYAL_MAX_VALIDATED_BATCH}
        if dataset_size is not None:
            steps = math.ceil(positive_int(dataset_size, "dataset_size") / eff)
            row.update(steps_per_epoch=steps, warmup_steps=math.ceil(warmup_epochs * steps) if eff > ref else 0)
        rows.append(row)
    return rows


def compare_grads(reference: Sequence[float], other: Sequence[float], *, rtol: float = 1e-5,
                  atol: float = 1e-6) -> dict:
    """Compare two flattened gradients element by element, as ``numpy.allclose`` would.

    An element matches when ``|other - reference| <= atol + rtol * |reference|``.

    Args:
        reference, other: gradients of the same length (floats).
        rtol, atol: relative and absolute tolerances (>= 0).

    Returns:
        ``{"allclose": bool, "max_abs_diff": float, "max_rel_diff": float, "n": int}``.

    Raises:
        ValueError: lengths differ, a sequence is empty, or a tolerance is negative.
    """
    if len(reference) != len(other):
        raise ValueError(f"other: length {len(other)} != reference length {len(reference)}")
    if not reference:
        raise ValueError("reference: empty gradient")
    if rtol < 0 or atol < 0:
        raise ValueError(f"rtol={rtol!r}, atol={atol!r}: tolerances must be >= 0")
    diffs = [abs(b - a) for a, b in zip(reference, other)]
    ok = all(d <= atol + rtol * abs(a) for d, a in zip(diffs, reference))
    rel = max(d / abs(a) if a else (0.0 if d == 0 else math.inf) for d, a in zip(diffs, reference))
    return {"allclose": ok, "max_abs_diff": max(diffs), "max_rel_diff": rel, "n": len(diffs)}
