"""``runbook lint``: the failure modes of the seeds, caught before launch, in a script, its configs and its sbatch file together.

:func:`lint_paths` reads Python training scripts (:mod:`helpers.lint.python_rules`), DeepSpeed JSON
(:mod:`helpers.lint.deepspeed_rules`), Accelerate YAML (:mod:`helpers.lint.accelerate_rules`) and
sbatch/shell launch scripts (:mod:`helpers.lint.shell_rules`), plus an optional pasted launch
command, and runs the cross-file rules: the world size from the launch files checks the DeepSpeed
batch arithmetic (Gilbreth 7.4), a raw ``deepspeed.initialize`` in a script makes
``"auto"`` and a missing optimizer errors (D18, §7.5 issue 1), bf16 in the JSON with float32
inputs in the script is §7.5 issue 2, accumulation set in two files is D18.
Each finding is a :class:`helpers.checks.Check` (built by :func:`helpers.lint.findings.finding`).
See docs/lint.md.
"""

from __future__ import annotations

import os
from collections.abc import Iterable, Sequence

from helpers.checks import Check
from helpers.lint.findings import finding

UNREADABLE = "input-unreadable"

RULES: dict[str, str] = {
    # meta: an input the linter cannot read or parse
    UNREADABLE: "runbook lint",
    "config-unparsable": "D5, D17",
    "command-unparsable": "D7",
    "python-syntax": "runbook lint",
    # helpers.lint.python_rules
    "rank-gated-collective": "D21; Gilbreth 7.5",
    "rank-early-exit-collective": "D21",
    "device-from-global-rank": "D3",
    "sampler-no-set-epoch": "D22",
    "rank-sliced-data": "D9, D22",
    "deepspeed-raw-backward": "D18",
    "find-unused-parameters": "D8",
    "batchnorm-without-syncbn": "D10",
    "fsdp-no-wrap-policy": "D12",
    "fsdp-partial-mixed-precision": "D14",
    "fsdp-full-state-dict-all-ranks": "D15",
    "write-on-every-rank": "D23",
    "hardcoded-master-port": "D4",
    "init-without-timeout": "MN3",
    # cross-file (lint_texts)
    "half-config-float32-inputs": "Gilbreth 7.5",
    # helpers.lint.deepspeed_rules
    "ds-unknown-key": "D17",
    "ds-misplaced-key": "D17",
    "ds-invalid-section": "D17",
    "ds-zero-without-optimizer": "Gilbreth 7.5",
    "ds-batch-mismatch": "Gilbreth 7.4",
    "ds-auto-raw-initialize": "D18",
    "ds-fp16-and-bf16": "D17",
    # helpers.lint.accelerate_rules
    "acc-invalid-config": "D5",
    "acc-ds-file-overrides": "D17",
    "acc-accumulation-twice": "D18",
    "acc-processes-not-divisible": "D5",
    "acc-multinode-ssh-launcher": "Gilbreth 4.3, 8.12",
    # helpers.lint.shell_rules (text only)
    "master-addr-not-exported": "Gilbreth 4.3",
    # helpers.launch_traps.find_traps (sbatch/shell files and --command, through shell_rules.traps_as_findings)
    "standalone-multinode": "D2",
    "master-addr-missing": "D1",
    "master-addr-loopback": "D1, MN1",
    "default-port-shared": "D4",
    "port-in-use": "D4",
    "nproc-exceeds-gpus": "D3",
    "accelerate-cpu-one-process": "D5",
    "deepspeed-ssh": "D6, Gilbreth 4.3, 8.12",
    "script-in-tmp": "Gilbreth 8.12",
    "args-in-tmp": "Gilbreth 8.12",
    "srun-tasks-per-node": "Gilbreth 8.2",
    "node-rank-fixed": "Gilbreth 4.3",
    "srun-export-none": "Gilbreth 8.12",
    "gloo-nccl-syntax": "MN2",
    "ifname-loopback": "Gilbreth 4.1, 4.2, MN2",
    "ifname-bridge": "MN2",
    "ifname-node-specific": "Gilbreth 8.12, MN2",
    "nccl-exclude-keeps-lo": "MN2",
    "single-node-net-transport": "Gilbreth 6.3",
    "nccl-net-disable-ignored": "Gilbreth 4.1",
    "multinode-ib-disabled": "Gilbreth 4.2, 8.3",
    "deprecated-async-error-handling": "MN3",
    "async-error-handling-off": "MN3",
}
"""Every rule id ``runbook lint`` (and :func:`helpers.launch_traps.find_traps`) can emit -> its seed (docs/lint.md).

``port-in-use`` comes only from ``find_traps(check_port=True)`` (the command builder), not from the
linter.  tests/unit/test_lint_summary_tables.py checks this table against the ids written in the
rule modules, so a new rule must be added here too.
"""
_SHELL_EXT = (".sh", ".sbatch", ".slurm", ".bash", ".job")


def _kind(path: str, text: str) -> str:
    low = path.lower()
    if low.endswith(".py"):
        return "python"
    if low.endswith(".json"):
        return "json"
    if low.endswith((".yaml", ".yml")):
        return "yaml"
    if low.endswith(_SHELL_EXT) or text.startswith("#!") and ("sh" in text.splitlines()[0]) or "#SBATCH" in text:
        return "shell"
    if text.lstrip().startswith("{"):
        return "json"
    return "shell"


def lint_texts(files: Sequence[tuple[str, str]], command: str | None = None) -> list[Check]:
    """Lint already-read files ``[(path, text), ...]`` together (and ``command``, shown as ``<command>``).

    Returns:
        The findings, sorted by file and line.
    """
    from helpers import launch_parse
    from helpers.lint import accelerate_rules, deepspeed_rules, python_rules, shell_rules

    findings: list[Check] = []
    facts: list[python_rules.PyFacts] = []
    ds_files: list[tuple[str, str, dict]] = []
    acc_files: list[tuple[str, str, dict]] = []
    specs = []
    for path, text in files:
        kind = _kind(path, text)
        if kind == "python":
            got, fact = python_rules.lint_python(path, text)
            findings += got
            facts.append(fact)
        elif kind == "json":
            try:
                data = deepspeed_rules.load(text)
            except ValueError as exc:
                findings.append(finding("config-unparsable", "error", path, 1, str(exc), "fix the JSON", "D17"))
                continue
            if deepspeed_rules.is_deepspeed_config(data):
                ds_files.append((path, text, data))
        elif kind == "yaml":
            try:
                data = accelerate_rules.load(text)
            except ValueError as exc:
                findings.append(finding("config-unparsable", "error", path, 1, str(exc), "fix the YAML", "D5"))
                continue
            if accelerate_rules.is_accelerate_config(data):
                acc_files.append((path, text, data))
        else:
            got, spec = shell_rules.lint_shell(path, text)
            findings += got
            if spec is not None:
                specs.append(spec)
    if command:
        try:
            spec = launch_parse.parse_command(command)
            specs.append(spec)
            findings += shell_rules.traps_as_findings(spec, "<command>", 1)
        except ValueError as exc:
            findings.append(finding("command-unparsable", "error", "<command>", 1, str(exc),
                                         "paste the whole launch line", "D7"))
    world = next((s.nnodes * s.nproc_per_node for s in specs), None)
    if world is None:
        world = next((accelerate_rules.world_size(d) for _, _, d in acc_files if accelerate_rules.world_size(d)), None)
    raw = [f for f in facts if f.raw_ds_init]
    raw_init: bool | None = True if raw else (False if any(f.uses_accelerate or f.uses_hf_trainer for f in facts)
                                               else (False if facts else None))
    client_opt = any(f.ds_client_optimizer for f in raw)
    where = f"{raw[0].path}:{raw[0].ds_init_line}" if raw else ""
    for path, text, data in ds_files:
        findings += deepspeed_rules.lint_deepspeed(path, text, data, world_size=world, raw_init=raw_init,
                                                   client_optimizer=client_opt, init_where=where)
        half = deepspeed_rules.enabled(data.get("bf16")) or deepspeed_rules.enabled(data.get("fp16"))
        for f in raw:
            if half and f.float_inputs and not any(x.id == "half-config-float32-inputs" and x.file == f.path
                                                   for x in findings):
                findings.append(finding(
                    "half-config-float32-inputs", "warning", f.path, f.float_inputs[0],
                    f"{path} enables bf16/fp16, so the engine's weights are half precision, but this tensor is built "
                    "float32: 'mat1 and mat2 must have the same dtype, but got Float and BFloat16'",
                    "create inputs with dtype=torch.bfloat16 (or cast the batch: x.to(model_engine.dtype))",
                    "Gilbreth 7.5"))
    accel = next(((f.path, f.accelerator_grad_accum[0], str(f.accelerator_grad_accum[1])) for f in facts
                  if f.accelerator_grad_accum), None)
    ds_gas = next(((p, d.get("gradient_accumulation_steps")) for p, _, d in ds_files), None)
    for path, text, data in acc_files:
        findings += accelerate_rules.lint_accelerate(path, text, data, accelerator_grad_accum=accel, ds_gas=ds_gas)
    return sorted(findings, key=lambda f: (f.file, f.line_no, f.id))


def lint_paths(paths: Iterable[str | os.PathLike[str]], command: str | None = None) -> list[Check]:
    """Lint the files at ``paths`` together, plus an optional pasted launch ``command``.

    A file that cannot be read gives an ``input-unreadable`` error finding naming it (the CLI exits 2);
    the other files are still linted.

    Returns:
        The findings (:class:`~helpers.checks.Check`), sorted by file and line.
    """
    files: list[tuple[str, str]] = []
    bad: list[Check] = []
    for p in paths:
        path = os.fspath(p)
        try:
            with open(path, encoding="utf-8") as fh:
                files.append((path, fh.read()))
        except (OSError, UnicodeDecodeError) as exc:
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            bad.append(finding(UNREADABLE, "error", path, 0, f"cannot read {path}: {reason}",
                                    "check the path and permissions", "runbook lint"))
    return bad + lint_texts(files, command)


__all__ = ["RULES", "UNREADABLE", "lint_paths", "lint_texts"]
