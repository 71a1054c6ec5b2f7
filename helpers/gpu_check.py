"""Everything that needs a GPU, in one command (``make gpu-check``), with one summary of what ran, passed, failed or
was skipped and why (issue 22).

On a GPU node, in this order, each step bounded in time (the whole stays under 10 minutes on one GPU node):

1. ``gpu-health``: the GPU health check on real NVML (:func:`helpers.allocation.local.gpu_checks`, with
   ``dcgmi diag -r 1`` where DCGM is installed);
2. ``diagnose``: ``runbook diagnose --backend nccl`` (notebook 00 under papermill) on every visible GPU;
3. ``fused-adam``: DeepSpeed's FusedAdam JIT build (:func:`helpers.allocation.local.check_toolchain`);
4. ``chapter NN``: every chapter with a ``tier-gpu`` cell, and with ``tier-multigpu`` cells where the node has 2 or
   more GPUs, executed with papermill (:func:`helpers.course.run_chapter`): passed when no cell failed and the
   tagged cells ran.

What a node lacks is a skip with its reason, never a pretend result: no GPU (then every step is skipped, exit 0),
papermill / nbformat / ipykernel missing (the GPU image of this project's GPU machines ships none: they travel as
wheels), deepspeed missing, fewer than 2 GPUs for the multi-GPU cells.  It runs on the interpreter it is started with
(its own torch: no venv is created, nothing is installed) and reports that torch.

Command line::

    python -m helpers.gpu_check --out build/gpu-check [--budget-s 540]

Writes ``<out>/summary.json`` and ``<out>/summary.md``; exit 1 when a step failed, else 0.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import platform
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
STATUSES = ("passed", "failed", "skipped")


@dataclass
class Step:
    """One step of the check: ``name``, ``status`` (one of :data:`STATUSES`), ``why`` (a skip's reason or a failure's
    first line), ``seconds``, ``details`` (what it measured: check records, paths)."""

    name: str
    status: str
    why: str = ""
    seconds: float = 0.0
    details: dict[str, Any] = field(default_factory=dict)


def gpu_inventory() -> dict[str, Any]:
    """This node's GPUs as torch and NVML see them: ``{"torch", "torch_cuda", "cuda_gpus", "nvml": read_nvml()}``."""
    from helpers.allocation import gpu_health

    info: dict[str, Any] = {"python": platform.python_version(), "nvml": gpu_health.read_nvml()}
    try:
        import torch

        info.update(torch=torch.__version__, torch_cuda=torch.version.cuda,
                    cuda_gpus=torch.cuda.device_count() if torch.cuda.is_available() else 0)
    except ImportError as exc:
        info.update(torch=None, torch_cuda=None, cuda_gpus=0, torch_error=str(exc))
    return info


def tagged_chapters(tiers: Sequence[str]) -> list[Path]:
    """The chapters (``notebooks/NN_*.ipynb``) with at least one code cell tagged ``tier-<t>`` for ``t`` in ``tiers``."""
    out = []
    for nb in sorted((ROOT / "notebooks").glob("[0-9][0-9]*_*.ipynb")):
        cells = json.loads(nb.read_text())["cells"]
        if any(f"tier-{t}" in c.get("metadata", {}).get("tags", []) for c in cells for t in tiers):
            out.append(nb)
    return out


def _missing(*modules: str) -> list[str]:
    return [m for m in modules if importlib.util.find_spec(m) is None]


def _timed(name: str, fn: Any) -> Step:
    t0 = time.monotonic()
    try:
        step = fn()
    except Exception as exc:  # noqa: BLE001 - a failing step is a result, the next steps still run
        step = Step(name, "failed", f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300] if str(exc).strip() else ''}")
    step.seconds = round(time.monotonic() - t0, 1)
    return step


def run(out: Path, budget_s: float = 540.0, dcgm_level: int = 1) -> tuple[list[Step], dict[str, Any]]:
    """Run the steps of the module docstring into ``out``; return them and the inventory.

    Raises:
        ValueError: ``budget_s`` <= 0 or ``dcgm_level`` not 0, 1, 2.
    """
    if not budget_s > 0:
        raise ValueError(f"budget_s={budget_s!r}: seconds > 0")
    if dcgm_level not in (0, 1, 2):
        raise ValueError(f"dcgm_level={dcgm_level!r}: accepted values are 0, 1, 2")
    out.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    inv = gpu_inventory()
    gpus = len(inv["nvml"]["gpus"]) or inv["cuda_gpus"]
    names = ["gpu-health", "diagnose", "fused-adam"] + [f"chapter {p.stem}" for p in
                                                         tagged_chapters(("gpu", "multigpu"))]
    if not gpus or not inv["cuda_gpus"]:
        why = (f"no GPU on this node (NVML: {inv['nvml'].get('error') or str(len(inv['nvml']['gpus'])) + ' GPU(s)'}; "
               f"torch {inv['torch']} sees {inv['cuda_gpus']} CUDA GPU(s))")
        return [Step(n, "skipped", why) for n in names], inv

    def left() -> float:
        return budget_s - (time.monotonic() - t0)

    steps = [_timed("gpu-health", lambda: _gpu_health(out, dcgm_level))]
    steps.append(_timed("diagnose", lambda: _diagnose(out, gpus, left())))
    steps.append(_timed("fused-adam", lambda: _fused_adam(out, left())))
    tiers = ("gpu", "multigpu") if gpus >= 2 else ("gpu",)
    for nb in tagged_chapters(("gpu", "multigpu")):
        name = f"chapter {nb.stem}"
        if not tagged_chapters(tiers) or nb not in tagged_chapters(tiers):
            steps.append(Step(name, "skipped", f"only tier-multigpu cells: needs >= 2 GPUs, this node has {gpus}"))
        elif left() < 60:
            steps.append(Step(name, "skipped", f"the {budget_s:g} s budget is spent"))
        else:
            steps.append(_timed(name, lambda nb=nb: _chapter(nb, out, tiers, left())))
    return steps, inv


def _gpu_health(out: Path, dcgm_level: int) -> Step:
    from helpers.allocation import local

    checks = local.gpu_checks(out, dcgm_level=dcgm_level)
    bad = [c for c in checks if c.status == "FAIL"]
    return Step("gpu-health", "failed" if bad else "passed", bad[0].title if bad else "",
                details={"checks": [c.line() for c in checks]})


def _diagnose(out: Path, gpus: int, left: float) -> Step:
    missing = _missing("papermill", "nbformat", "ipykernel")
    if missing:
        return Step("diagnose", "skipped", f"{', '.join(missing)} not installed: runbook diagnose executes notebook 00 "
                    "with papermill (bring their wheels to this node)")
    proc = subprocess.run([sys.executable, "-m", "helpers.cli", "diagnose", "--backend", "nccl", "--nproc", str(gpus),
                           "--out-dir", str(out / "diagnose")], cwd=ROOT, capture_output=True, text=True,
                          timeout=max(60.0, min(left, 300.0)))
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("[")]
    bad = [ln for ln in lines if ln.startswith("[FAIL]")]
    status = "passed" if proc.returncode == 0 else "failed"
    return Step("diagnose", status, (bad[0] if bad else (proc.stderr.strip().splitlines() or [""])[-1]) if status == "failed"
                else "", details={"returncode": proc.returncode, "lines": lines[-40:]})


def _fused_adam(out: Path, left: float) -> Step:
    if _missing("deepspeed"):
        return Step("fused-adam", "skipped", "deepspeed not installed (its FusedAdam is what this step builds)")
    from helpers.allocation import local

    checks = local.check_toolchain("nccl", out, build=True, timeout_s=max(60.0, min(left, 300.0)))
    c = checks[0]
    return Step("fused-adam", "passed" if c.status == "OK" else "failed", "" if c.status == "OK" else c.title,
                details={"check": c.line()})


def _chapter(nb: Path, out: Path, tiers: Sequence[str], left: float) -> Step:
    name = f"chapter {nb.stem}"
    missing = _missing("papermill", "nbformat", "ipykernel")
    if missing:
        return Step(name, "skipped", f"{', '.join(missing)} not installed: chapters run under papermill")
    from helpers import course

    res = course.run_chapter(nb, out / "chapters", timeout_s=max(60.0, min(left, 540.0)))
    ran = {t: res.tiers.get(t, {}).get("ran", 0) for t in tiers}
    if res.status != "passed":
        return Step(name, "failed", res.error or "a cell failed", details=asdict(res))
    if not any(ran.values()):
        return Step(name, "failed", f"no tier cell ran ({res.skips})", details=asdict(res))
    return Step(name, "passed", "", details={"tiers": res.tiers, "executed": res.executed})


def render(steps: Sequence[Step], inv: dict[str, Any]) -> str:
    """The summary as markdown: what ran where, then one row per step."""
    nvml = inv["nvml"]
    head = (f"GPU check on {platform.node()}: python {inv['python']}, torch {inv['torch']} (CUDA {inv['torch_cuda']}), "
            f"{len(nvml['gpus'])} GPU(s) through NVML ({', '.join(sorted({str(g['name']) for g in nvml['gpus']})) or 'none'}"
            f"; driver {nvml.get('driver')})\n\n")
    rows = ["| step | status | time | why |", "|---|---|---|---|"]
    rows += [f"| {s.name} | {s.status} | {s.seconds:.0f} s | {s.why or '-'} |" for s in steps]
    counts = {st: sum(s.status == st for s in steps) for st in STATUSES}
    return head + "\n".join(rows) + "\n\n" + ", ".join(f"{n} {k}" for k, n in counts.items()) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    """Command line (module docstring): run, write ``summary.json`` / ``summary.md``, print the summary."""
    p = argparse.ArgumentParser(prog="python -m helpers.gpu_check", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT / "build" / "gpu-check"), help="output folder (default build/gpu-check)")
    p.add_argument("--budget-s", type=float, default=540.0, help="seconds for everything (default 540, under 10 min)")
    p.add_argument("--dcgm-level", type=int, choices=(0, 1, 2), default=1, help="dcgmi diag -r N where installed")
    args = p.parse_args(argv)
    if not args.budget_s > 0:
        p.error(f"--budget-s={args.budget_s}: seconds > 0")
    out = Path(args.out)
    steps, inv = run(out, args.budget_s, args.dcgm_level)
    summary = {"host": platform.node(), "inventory": inv, "steps": [asdict(s) for s in steps]}
    tmp = out / "summary.json.tmp"
    tmp.write_text(json.dumps(summary, indent=1, default=str) + "\n")
    tmp.replace(out / "summary.json")
    text = render(steps, inv)
    (out / "summary.md").write_text(text)
    print(text)
    return 1 if any(s.status == "failed" for s in steps) else 0


if __name__ == "__main__":
    sys.exit(main())
