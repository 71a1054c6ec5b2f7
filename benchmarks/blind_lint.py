"""Score ``runbook lint`` on the blind set (tests/data/lint/blind: manifest.yaml, buggy/, clean/), chosen by another
session without seeing the rules.

* **decidable recall**: a buggy case with ``decidable_before_launch: true`` is *found* when a finding (any status
  but OK) names its cause, i.e. its rule is one of :data:`CAUSE_RULES` for the case's ``category``, at the right
  file: a file whose name the manifest's ``cause`` mentions (``train.py:13``).  Undecidable cases are scored too,
  apart.
* **false alarms**: any WARN/FAIL on a clean file.

Every file of a case directory is linted together (what a user would pass: script, configs, launch files).
:data:`CAUSE_RULES` was written from the manifest's categories before the first run, and is not changed
by tuning (a category whose rule did not exist then names the rule the contract calls for).

Run: ``python benchmarks/blind_lint.py [--root tests/data/lint/blind2] [--out FILE]`` (prints one line per case and the totals).
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

import yaml

from helpers.checks import NOT_OK
from helpers.lint import lint_paths

BLIND = Path(__file__).resolve().parents[1] / "tests" / "data" / "lint" / "blind"

CAUSE_RULES: dict[str, set[str]] = {
    "sampler_shuffle_conflict": {"dataloader-sampler-and-shuffle"},
    "rank_conditional_collective": {"rank-gated-collective", "rank-early-exit-collective"},
    "launcher_node_rank": {"node-rank-fixed"},
    "slurm_srun_torchrun_overlaunch": {"srun-tasks-per-node"},
    "device_mapping": {"device-from-global-rank", "nccl-no-device-binding"},
    "missing_launcher": {"env-init-without-launcher"},
    "ds_config_type_mismatch": {"ds-invalid-section", "ds-invalid-value"},
    "accelerate_ds_vs_cli_mismatch": {"acc-accumulation-twice", "acc-ds-file-overrides", "ds-args-mismatch"},
    "ds_batch_arithmetic": {"ds-batch-mismatch", "ds-args-mismatch"},
    "ds_config_vs_cli_mismatch": {"ds-batch-mismatch", "ds-args-mismatch"},
    "fsdp_optimizer_order": {"fsdp-optimizer-before-wrap"},
    "legacy_launch_local_rank": {"local-rank-arg-under-launcher"},
    "sampler_set_epoch": {"sampler-no-set-epoch"},
    "checkpoint_load_device": {"load-without-map-location", "device-from-global-rank", "undefined-attribute"},
    "backend_device_mismatch": {"nccl-cpu-tensor", "nccl-without-gpus"},
    "launcher_master_addr": {"master-addr-loopback", "master-addr-missing"},
    "ds_zero_offload_options": {"ds-invalid-section", "ds-offload-needs-stage"},
    "launcher_nproc_vs_gpus": {"nproc-exceeds-gpus"},
    "batch_arithmetic": {"grad-accum-from-device-count"},
    "accelerate_num_processes": {"acc-processes-not-divisible"},
    "syncbn": {"syncbn-without-ddp", "batchnorm-without-syncbn"},
    "ddp_find_unused_parameters": {"find-unused-parameters"},
    "rank_divergent_exception": {"rank-early-exit-collective", "rank-gated-collective"},
    "fsdp_wrap_policy": {"fsdp-no-wrap-policy", "fsdp-wrap-class-unknown"},
    "rdzv_endpoint": {"master-addr-loopback"},
}
"""Manifest category -> the rule ids that name that cause (fixed before the first scoring run)."""

CAUSE_RULES2: dict[str, set[str]] = {
    # decidable before launch (the set's own words for each category; a rule id that does not exist yet is the
    # rule the contract calls for)
    "launcher-arg-mismatch-local-rank": {"local-rank-arg-under-launcher", "script-arg-unknown"},
    "lr-schedule-ignores-sharding": {"lr-steps-from-dataset-length"},
    "barrier-skipped-by-early-return": {"rank-early-exit-collective", "rank-gated-collective"},
    "multinode-launch-missing-nnodes": {"nnodes-mismatch", "standalone-multinode", "multinode-nnodes-missing"},
    "master-addr-not-compute-node": {"master-addr-loopback", "master-addr-missing", "master-addr-not-exported",
                                     "master-addr-login-node"},
    "rank0-only-forward-through-ddp": {"rank-gated-collective"},
    "identical-rng-seed-across-ranks": {"same-seed-every-rank"},
    "slurm-ntasks-vs-lightning-devices": {"lightning-slurm-mismatch", "srun-tasks-per-node"},
    "local-rank-used-as-global-rank": {"local-rank-as-global-rank", "init-missing-rank-world-size"},
    "invalid-deepspeed-json": {"config-unparsable", "ds-invalid-section", "ds-invalid-value"},
    "all-ranks-pinned-to-one-gpu": {"nccl-no-device-binding", "device-from-global-rank", "same-device-every-rank"},
    "ddp-wrapper-attribute-access": {"undefined-attribute", "ddp-wrapper-attribute"},
    "unguarded-rank-side-effect": {"write-on-every-rank"},
    "missing-sampler-set-epoch": {"sampler-no-set-epoch"},
    "rank0-only-collective-logging": {"rank-gated-collective", "lightning-rank-zero-sync-dist"},
    "checkpoint-load-without-map-location": {"load-without-map-location"},
    "zero3-save-without-16bit-gather": {"ds-zero3-save-without-gather"},
    "deepspeed-scheduler-overrides-trainer": {"acc-ds-file-overrides", "ds-args-mismatch", "ds-scheduler-overrides"},
    # not decidable before launch (scored apart)
    "multinode-checkpoint-write-race": {"write-on-every-rank"},
    "fsdp-full-state-dict-gather-oom": {"fsdp-full-state-dict-all-ranks"},
    "collective-timeout-rank0-long-work": {"init-without-timeout"},
    "per-rank-dataset-cache-memory": set(),
    "distributed-eval-padding-duplicates": set(),
    "collective-timeout-preprocessing": {"init-without-timeout"},
    "ddp-unused-parameters": {"find-unused-parameters"},
    "asymmetric-process-group-teardown": {"rank-gated-collective"},
    "sampler-rank-uses-local-rank": {"local-rank-as-global-rank", "rank-sliced-data"},
    "host-memory-per-rank-model-load": set(),
    "uneven-steps-per-rank-barrier": {"rank-gated-collective"},
    "zero3-generate-without-synced-gpus": {"zero3-generate-without-synced-gpus"},
}
"""The same for the second blind set (tests/data/lint/blind2, collected for issue 25 after the first had been used
for tuning); written from its manifest's categories before its first scoring run."""


CAUSE_RULES3: dict[str, set[str]] = {
    # decidable before launch
    "grad-accum-no-sync-misaligned": {"no-sync-misaligned", "grad-accum-sync-misaligned"},
    "grad-accum-no-sync-backward-only": {"no-sync-backward-only"},
    "grad-accum-sync-flag-misordered": {"sync-flag-after-forward"},
    "checkpoint-save-all-ranks": {"write-on-every-rank"},
    "set-device-global-rank": {"device-from-global-rank"},
    "collective-before-set-device": {"nccl-no-device-binding", "collective-before-set-device"},
    "missing-set-device": {"nccl-no-device-binding"},
    "sampler-shuffle-conflict": {"dataloader-sampler-and-shuffle"},
    "logger-init-all-ranks": {"write-on-every-rank", "logger-init-every-rank"},
    "wrapper-order-amp-ddp": {"amp-initialize-after-ddp"},
    "launcher-master-addr-empty": {"master-addr-missing", "shell-default-expansion"},
    "ddp-wrapper-module-unbound": {"ddp-wrapper-attribute", "unbound-after-ddp-branch"},
    "main-process-by-local-rank": {"local-rank-as-global-rank", "write-on-every-rank"},
    "metric-not-reduced-across-ranks": {"metric-not-reduced"},
    "ds-config-unknown-key": {"ds-unknown-key", "ds-invalid-section"},
    "file-write-all-ranks": {"write-on-every-rank"},
    "sampler-set-epoch-missing": {"sampler-no-set-epoch"},
    # not decidable before launch (scored apart)
    "launcher-config-mismatch-grad-accum": {"acc-accumulation-twice", "ds-args-mismatch"},
    "ds-config-batch-size-missing": {"ds-batch-missing", "ds-batch-mismatch"},
}
"""The same for the third blind set (tests/data/lint/blind3, collected for issue 25 after blind2 had been used for
tuning); written from its manifest's categories before its first scoring run."""


CAUSE_RULES4: dict[str, set[str]] = {
    # decidable before launch (a rule id that does not exist yet is the rule the contract calls for)
    "grad-accum-no-sync-backward-only": {"no-sync-backward-only"},
    "rank0-only-stop-decision": {"rank-early-exit-collective", "rank-gated-collective"},
    "slurm-env-var-semantics": {"slurm-env-misuse", "slurm-var-unknown"},
    "logger-init-all-ranks": {"write-on-every-rank", "logger-init-every-rank"},
    "world-size-from-device-count": {"world-size-from-device-count", "init-missing-rank-world-size"},
    "missing-grad-sync-no-ddp-wrapper": {"model-not-wrapped", "no-grad-sync"},
    "device-from-global-rank": {"device-from-global-rank"},
    "ddp-bypassed-unwrapped-forward": {"ddp-bypassed"},
    "barrier-every-step": {"barrier-every-step"},
    "local-rank-as-global-rank": {"local-rank-as-global-rank", "init-missing-rank-world-size"},
    "slurm-rdzv-endpoint-fixed-at-submit": {"endpoint-resolved-at-submit", "master-addr-login-node"},
    "metrics-not-reduced-across-ranks": {"metric-not-reduced"},
    "grad-scaled-by-world-size": {"backward-through-all-reduce"},
    "launcher-env-contract": {"local-rank-arg-under-launcher", "script-arg-unknown"},
    "checkpoint-save-all-ranks": {"write-on-every-rank"},
    "rank-divergent-stop-decision": {"rank-early-exit-collective", "rank-gated-collective"},
    # not decidable before launch (scored apart)
    "checkpoint-load-no-map-location": {"load-without-map-location"},
    "uneven-batches-across-ranks": {"uneven-batches"},
}
"""The same for the fourth blind set (tests/data/lint/blind4, collected on 2026-11-26 after blind3 had been used for
tuning); written from its manifest's categories before its first scoring run."""



CAUSE_RULES5: dict[str, set[str]] = {
    # decidable before launch (a rule id that does not exist yet is the rule the contract calls for)
    "missing-device-binding-local-rank": {"nccl-no-device-binding", "collective-before-set-device", "same-device-every-rank"},
    "collective-skipped-on-some-ranks": {"rank-early-exit-collective", "rank-gated-collective"},
    "deepspeed-grad-accum-mismatch": {"ds-args-mismatch", "ds-batch-mismatch", "ds-manual-accumulation"},
    "batch-size-uses-world-size-not-dp-size": {"grad-accum-from-device-count", "batch-from-world-size-with-tp"},
    "batch-size-not-scaled-by-world-size": {"grad-accum-from-device-count", "lr-steps-from-dataset-length"},
    "main-process-only-object-on-all-ranks": {"main-process-object-every-rank"},
    "collective-without-process-group": {"collective-before-init"},
    "forward-bypasses-ddp-wrapper": {"ddp-bypassed"},
    "local-main-vs-global-main-shared-fs": {"local-rank-as-global-rank", "write-on-every-rank"},
    "deepspeed-zero-stage-ref-model-init": {"ds-zero-without-optimizer"},
    "torch-load-no-map-location": {"load-without-map-location"},
    "missing-init-process-group": {"collective-before-init", "ddp-without-init"},
    "nccl-no-set-device-before-collectives": {"nccl-no-device-binding", "collective-before-set-device"},
    "eval-results-not-gathered-across-ranks": {"metric-not-reduced"},
    "master-port-mismatch-multinode": {"master-port-random-per-node"},
    "distributed-sampler-seed-differs-across-ranks": {"sampler-seed-per-rank"},
    "rank-local-rank-swapped": {"device-from-global-rank", "local-rank-as-global-rank"},
    "global-rank-used-as-local-rank": {"device-from-global-rank"},
    "resume-overwrites-rank-env": {"rank-overwritten-on-resume"},
    "batch-size-world-size-mismatch": {"batch-divided-twice"},
    "rank-unguarded-filesystem-side-effect": {"write-on-every-rank"},
    "ddp-wrapped-attribute-access": {"ddp-wrapper-attribute"},
    "ddp-wrapped-state-dict-save": {"ddp-wrapper-state-dict", "ddp-wrapper-attribute"},
    # not decidable before launch (scored apart)
    "collective-shape-mismatch-hang": {"gather-uneven-shapes"},
    "fsdp-api-under-deepspeed": {"fsdp-api-under-deepspeed"},
    "deepspeed-zero-stage-api-mismatch": {"ds-zero-api-mismatch"},
    "device-binding-global-rank-modulo": {"device-from-global-rank"},
    "local-rank-from-cli-not-env": {"local-rank-arg-under-launcher", "script-arg-unknown"},
}
"""The same for the fifth blind set (tests/data/lint/blind5, 30 buggy cases and 20 clean files collected on 2026-11-26
by two sessions after blind4 had been used for tuning); written from its manifest's categories before its first
scoring run."""

CAUSE_RULES6: dict[str, set[str]] = {
    # decidable before launch (a rule id that does not exist yet is the rule the contract calls for)
    "rank0-only-model-modification": {"rank-gated-model-change"},
    "ddp-wrapped-attribute-access": {"ddp-wrapper-attribute"},
    "lr-scheduler-steps-vs-num-processes": {"lr-steps-from-dataset-length"},
    "rank-divergent-control-flow-collective": {"rank-early-exit-collective", "rank-gated-collective"},
    "barrier-without-device-ids": {"barrier-without-device-ids", "collective-before-set-device"},
    "eval-sampler-not-distributed": {"sampler-not-distributed"},
    "gather-duplicates-eval-metric": {"gather-duplicates-metric", "metric-not-reduced"},
    "launch-script-broken-line-continuation": {"shell-broken-continuation"},
    "env-var-contract-launcher": {"launcher-env-unset"},
    "launch-script-undefined-variables": {"shell-default-expansion", "master-addr-missing"},
    "rank0-only-collective-save": {"rank-gated-collective", "ds-zero3-save-without-gather"},
    "every-rank-filesystem-writes": {"write-on-every-rank"},
    "deepspeed-config-scheduler-override": {"ds-scheduler-overrides"},
    "device-binding-quantized-model": {"quantized-model-no-device-map", "nccl-no-device-binding"},
    "save-without-unwrap": {"ddp-wrapper-attribute"},
    "save-on-local-rank-zero-multinode": {"local-rank-as-global-rank", "write-on-every-rank"},
    "set-device-after-init-process-group": {"collective-before-set-device", "set-device-after-init"},
    "checkpoint-saved-on-every-rank": {"write-on-every-rank"},
    "rank-unguarded-file-write": {"write-on-every-rank"},
    "launcher-master-addr-undefined": {"master-addr-missing", "shell-default-expansion"},
    "no-sync-grad-accumulation-misuse": {"sync-flag-after-forward", "no-sync-misaligned"},
    "gradient-normalization-world-size": {"grad-scale-world-size"},
    "missing-set-device": {"nccl-no-device-binding", "collective-before-set-device"},
    "torch-load-without-map-location": {"load-without-map-location"},
    "fsdp-inference-mode": {"fsdp-inference-mode"},
    # not decidable before launch (scored apart)
    "barrier-device-binding": {"collective-before-set-device", "barrier-without-device-ids"},
    "backend-mismatch-cpu-offload": {"nccl-cpu-tensor"},
    "uneven-inputs-collective-hang": {"rank-early-exit-collective"},
    "local-rank-env-contract": {"local-rank-arg-under-launcher"},
    "init-process-group-ignores-launcher-env": {"init-ignores-launcher-env", "local-rank-as-global-rank",
                                                "world-size-from-device-count"},
}
"""The same for the sixth blind set (tests/data/lint/blind6, 30 buggy cases and 20 clean files collected on 2026-11-26
by two sessions after blind5 had been used for tuning); written from its manifest's categories before its first
scoring run."""


CAUSE_RULES7: dict[str, set[str]] = {
    # decidable before launch (a rule id that does not exist yet is the rule the contract calls for)
    "collective-variable-shape-gather": {"gather-variable-shape"},
    "accelerate-config-num-processes": {"acc-invalid-config", "acc-processes-without-distribution"},
    "collective-cpu-tensor-nccl": {"nccl-cpu-tensor"},
    "ddp-wrapped-attribute-access": {"ddp-wrapper-attribute"},
    "lr-scheduler-steps-num-processes": {"lr-steps-from-dataset-length"},
    "metric-reduction-order": {"metric-not-reduced", "metric-reduction-order"},
    # shell-c-without-command added after the first score: the rule names what bash does with the missing quote
    "slurm-srun-command-quoting": {"shell-broken-continuation", "shell-unbalanced-quote", "shell-c-without-command"},
    "resume-skip-batches": {"resume-skip-every-epoch"},
    "main-process-only-object-on-all-ranks": {"main-process-object-every-rank"},
    "missing-cross-rank-reduction": {"metric-not-reduced", "local-statistic-not-reduced"},
    "torch-load-without-map-location": {"load-without-map-location"},
    "rank-query-before-init-process-group": {"rank-before-init", "collective-before-init", "same-seed-every-rank"},
    "global-world-size-used-as-local": {"world-size-as-local", "global-world-size-per-node"},
    "checkpoint-load-default-device": {"load-without-map-location", "nccl-no-device-binding", "same-device-every-rank"},
    "rank-zero-detection-slurm": {"slurm-env-misuse", "rank-zero-falsy"},
    "global-rank-vs-local-rank": {"local-rank-as-global-rank", "global-rank-as-local-rank"},
    "save-on-every-rank": {"write-on-every-rank"},
    "metric-not-reduced-across-ranks": {"metric-not-reduced"},
    "per-rank-seed-before-model-init": {"rank-seed-before-model-init", "same-seed-every-rank"},
    "collective-on-subset-of-ranks": {"rank-early-exit-collective", "rank-gated-collective"},
    "missing-set-epoch": {"sampler-no-set-epoch"},
    # not decidable from the files alone (runtime facts); a finding still counts
    "ddp-find-unused-parameters": {"find-unused-parameters"},
    "deepspeed-save-state-hook": {"ds-save-hook-unwrap"},
    "fsdp-meta-device-init": {"fsdp-meta-resize"},
    "world-size-vs-dp-size": {"world-size-as-dp-size"},
    "all-ranks-shared-file-race": {"write-on-every-rank"},
    "env-var-precedence-slurm-vs-torchrun": {"slurm-env-misuse", "slurm-vars-over-launcher"},
    "launcher-argument-contract": {"local-rank-arg-under-launcher"},
}
"""The same for the seventh blind set (tests/data/lint/blind7, 30 buggy cases and 20 clean files collected on
2026-11-26 by two sessions after blind6 had been used for tuning); written from its manifest's categories before its
first scoring run."""


CAUSE_RULES8: dict[str, set[str]] = {
    # decidable before launch (a rule id that does not exist yet is the rule the contract calls for)
    "collective-group-mismatch": {"rank-gated-collective", "collective-group-mismatch"},
    "rank-divergent-state": {"rank-divergent-state", "rank-gated-collective"},
    "concurrent-collectives-threads": {"collective-in-threads"},
    "global-batch-size-accounting": {"global-batch-without-accumulation"},
    "launcher-local-rank-contract": {"local-rank-arg-under-launcher"},
    "ddp-wrapped-attribute-access": {"ddp-wrapper-attribute"},
    "rank0-only-object-used-on-all-ranks": {"main-process-object-every-rank", "rank-gated-object-used"},
    "env-var-contract-world-size-rank": {"environ-getattr", "launcher-env-unset"},
    "missing-distributed-sampler": {"sampler-not-distributed", "dataloader-without-sampler"},
    "file-io-on-all-ranks": {"write-on-every-rank"},
    "local-rank-not-used-for-device": {"nccl-no-device-binding", "local-rank-arg-under-launcher", "same-device-every-rank"},
    "collective-tensor-wrong-device": {"nccl-cpu-tensor"},
    "process-group-timeout-too-short": {"init-timeout-short"},
    # not decidable from the files alone (runtime facts); a finding still counts
    "conditional-collective-deadlock": {"rank-gated-collective"},
    "wrong-collective-src-rank": {"broadcast-src-rank"},
    "launcher-nesting-slurm-torchrun": {"launcher-env-unset", "slurm-env-misuse"},
    "broadcast-shape-mismatch": {"broadcast-shape-mismatch"},
    "missing-barrier-before-exit": {"missing-barrier-before-exit"},
    "missing-set-epoch": {"sampler-no-set-epoch"},
    "rank0-first-guard-missing": {"rank0-first-without-barrier"},
    "collective-dtype-mismatch": {"collective-dtype-mismatch"},
    "zero3-moe-leaf-module": {"ds-zero3-moe-leaf"},
    "local-rank-argument-contract": {"local-rank-arg-under-launcher"},
    "local-rank-env-var-ignored": {"local-rank-arg-under-launcher", "nccl-no-device-binding"},
    "gather-results-truncation": {"gather-results-truncation"},
    "fsdp-device-placement": {"fsdp-device-placement"},
}
"""The same for the eighth blind set (tests/data/lint/blind8, 30 buggy cases and 20 clean files collected on
2026-11-26 by two sessions after blind7 had been used for tuning); written from its manifest's categories before its
first scoring run."""


CAUSE_RULES9: dict[str, set[str]] = {
    "save-on-every-rank": {"write-on-every-rank"},
    "ddp-wrapper-attribute-access": {"ddp-wrapper-attribute"},
    "lr-schedule-ignores-data-sharding": {"lr-steps-from-dataset-length"},
    "zero3-gathered-parameters-incomplete": {"ds-zero3-partial-gather"},
    "logging-on-every-rank": {"write-on-every-rank", "main-process-object-every-rank"},
    "rank-conditional-branch-mixup": {"rank-early-exit-collective", "rank-gated-raise"},
    "per-device-batch-size-not-propagated": {"streaming-no-batch-size"},
    "config-key-mismatch": {"config-key-unknown"},
    "data-prep-not-local-rank0-first": {"rank0-first-without-barrier", "data-prep-every-rank"},
    "rank-local-exception-skips-collective": {"rank-early-exit-collective"},
    "distributed-sampler-shuffle-mismatch": {"dataloader-sampler-and-shuffle", "sampler-shuffle-default"},
    "wrong-device-per-rank": {"nccl-cpu-tensor", "device-from-global-rank", "nccl-no-device-binding",
                              "same-device-every-rank", "tensor-device-mismatch"},
    "checkpoint-load-device": {"load-without-map-location"},
    "missing-set-device": {"nccl-no-device-binding", "same-device-every-rank"},
    "distributed-flag-never-set": {"ddp-bypassed", "sampler-not-distributed", "distributed-flag-never-set"},
    "collective-dtype": {"collective-dtype-mismatch", "all-reduce-int-division"},
    "rank0-only-setup-used-by-all-ranks": {"rank0-first-without-barrier", "rank-gated-object-used"},
    "distributed-data-sharding-resume": {"resume-skip-every-epoch"},
    "rank-divergent-loop-collectives": {"rank-gated-collective", "rank-early-exit-collective"},
    "sampler-set-epoch": {"sampler-no-set-epoch", "undefined-attribute"},
    "fsdp-wrong-process-group": {"fsdp-mesh-without-group"},
    # not decidable from the files alone (runtime facts, other files); a finding still counts
    "collective-shape-mismatch-hang": {"gather-variable-shape"},
    "missing-set-epoch": {"sampler-no-set-epoch"},
    "rank-divergent-exit-deadlock": {"rank-early-exit-collective"},
    "rank-zero-guard-wrong-rank": {"rank-zero-only-rank-unset"},
    "launcher-arg-contract": {"launcher-flag-version"},
    "launch-script-stale-path": {"script-path-missing"},
    "uneven-inputs-ddp-hang": {"ddp-uneven-inputs"},
    "compile-ddp-checkpointing-ordering": {"compile-ddp-checkpointing"},
}
"""The same for the ninth blind set (tests/data/lint/blind9, 30 buggy cases and 20 clean files collected on
2026-11-26 by two sessions after blind8 had been used for tuning); written from its manifest's categories before its
first scoring run (a category no rule decided then names the rule its contract calls for)."""


CAUSE_RULES10: dict[str, set[str]] = {
    "launch-script-wrong-entrypoint-and-node-count": {"script-path-missing", "nnodes-mismatch"},
    "launch-script-positional-arg-mixup": {"shell-positional-reused"},
    "launcher-world-size-not-pinned": {"ds-num-gpus-unpinned"},
    "missing-set-device-per-rank": {"nccl-no-device-binding", "same-device-every-rank", "set-device-after-init"},
    "per-rank-nondeterministic-cache-and-data-prep": {"hash-per-process"},
    "wrong-process-group": {"zero-init-wrong-group"},
    "deepspeed-config-not-propagated": {"ds-config-not-propagated"},
    "deepspeed-config-silently-ignored": {"ds-checkpointing-config-ignored"},
    "slurm-launch-args-dropped-config-mismatch": {"acc-accumulation-twice", "script-arg-unknown", "launch-args-dropped"},
    "save-on-multiple-ranks": {"write-on-every-rank", "rank-gate-wrong"},
    "rank-divergent-control-flow": {"rank-gated-collective", "rank-early-exit-collective"},
    "double-init-process-group": {"init-twice"},
    "per-rank-batch-size-uses-local-gpu-count": {"grad-accum-from-device-count", "world-size-from-device-count",
                                                 "batch-per-node"},
    "mismatched-rank-guard-global-vs-local-main": {"rank-gated-object-used"},
    "rank-divergent-model-state": {"same-seed-every-rank", "rank-seed-before-model-init", "metric-not-reduced"},
    "buffers-not-synced-before-eval": {"buffers-not-synced"},
    "save-on-every-rank": {"write-on-every-rank"},
    "per-rank-output-path-collision": {"write-on-every-rank"},
    "wrong-device-per-rank": {"device-from-global-rank", "same-device-every-rank", "visible-devices-as-ordinal"},
    "launcher-arg-contract-local-rank": {"local-rank-arg-under-launcher"},
    "ddp-wrapper-state-dict-prefix": {"ddp-state-dict-prefix"},
    "main-only-resource-used-on-all-ranks": {"rank-gated-object-used"},
    "collective-result-discarded": {"collective-result-discarded"},
    # not decidable from the files alone (runtime facts); a finding still counts
    "deepspeed-config-topology-mismatch": {"ds-hpz-single-node"},
    "launcher-env-contract-local-rank": {"local-rank-arg-under-launcher", "launcher-env-unset"},
    "deepspeed-api-wrong-argument": {"ds-unknown-kwarg"},
    "slurm-env-used-as-local-rank": {"slurm-env-misuse"},
    "uneven-or-empty-distributed-shards": {"rank-sliced-data"},
    "data-dependent-unused-parameters-ddp": {"find-unused-parameters"},
}
"""The same for the tenth blind set (tests/data/lint/blind10, 30 buggy cases and 20 clean files collected on
2026-11-26 by two sessions while blind9 was being used for tuning); written from its manifest's categories before its
first scoring run (a category no rule decided then names the rule its contract calls for)."""


CAUSE_RULES11: dict[str, set[str]] = {
    "slurm-srun-command-split": {"shell-srun-split"},
    "collective-on-rank0-only": {"rank-gated-collective"},
    "fsdp-optimizer-incompatible-config": {"fsdp-8bit-optimizer"},
    "launch-config-contradicts-allocation": {"nnodes-mismatch", "nproc-exceeds-gpus"},
    "save-on-every-rank": {"write-on-every-rank"},
    "launcher-hostfile-path": {"hostfile-missing"},
    "launcher-env-contract-order": {"launcher-env-order"},
    "missing-set-epoch": {"sampler-no-set-epoch"},
    "checkpoint-frequency-logic": {"save-every-step"},
    "rank-dependent-seed": {"rank-seed-before-model-init", "same-seed-every-rank", "rank-split-differs"},
    "unseeded-per-rank-data-split": {"rank-divergent-data-split", "rank-split-differs"},
    "slurm-multinode-launcher-without-srun": {"srun-tasks-per-node", "nnodes-mismatch", "launcher-without-srun"},
    "rank0-guard-uses-local-rank": {"local-rank-as-global-rank"},
    "slurm-deepspeed-rendezvous-env": {"master-addr-missing", "slurm-env-misuse", "shell-escaped-variable"},
    "launcher-duplicate-node-rank": {"node-rank-fixed"},
    "slurm-ntasks-total-vs-per-node": {"srun-tasks-per-node"},
    "launcher-script-arg-contract": {"script-arg-unknown"},
    "submitit-world-size-not-propagated": {"init-missing-rank-world-size", "launcher-var-unset"},
    "ddp-partial-wrap-trainable-params": {"ddp-bypassed"},
    "fabric-empty-init-without-sharding": {"fabric-empty-init"},
    "collective-on-subset-of-ranks": {"rank-gated-collective"},
    "read-before-rank0-write-no-barrier": {"rank0-first-without-barrier", "rank-gated-object-used"},
    # not decidable from the files alone (runtime facts); a finding still counts
    "wrong-device-per-worker": {"same-device-every-rank", "visible-devices-as-ordinal"},
    "collective-count-mismatch-across-ranks": {"rank-gated-collective"},
    "ddp-reentrant-checkpointing-config": {"ddp-reentrant-checkpointing"},
    "zero3-partitioned-params-forward": {"ds-zero3-partial-gather"},
    "slurm-fixed-master-port-collision": {"hardcoded-master-port", "default-port-shared"},
    "slurm-env-contract-world-size": {"slurm-env-misuse", "slurm-var-unknown"},
    "fsdp-state-dict-config-world-size": {"fsdp-full-state-dict-all-ranks"},
}


CAUSE_RULES12: dict[str, set[str]] = {
    "rank-asymmetric-unwrap": {"rank-gated-object-used", "rank-gated-model-change", "ddp-wrapper-attribute"},
    "ddp-wrapped-attribute-access": {"ddp-wrapper-attribute"},
    "deepspeed-plugin-config-kwarg": {"acc-invalid-config", "ds-plugin-unknown-kwarg", "api-unknown-kwarg"},
    "ddp-static-graph-reentrant-checkpoint": {"find-unused-parameters", "ddp-static-graph"},
    "deepspeed-save-main-only": {"rank-gated-collective"},
    "lr-scheduler-distributed-steps": {"lr-steps-from-dataset-length"},
    "ema-on-ddp-wrapped-model": {"ddp-wrapper-attribute", "ema-on-wrapper"},
    "collective-wrong-process-group": {"collective-wrong-group"},
    "rank-asymmetric-state-after-gather": {"rank-gated-object-used", "rank-gated-model-change"},
    "collective-without-init-guard": {"collective-before-init"},
    "launcher-arg-contract": {"script-arg-unknown", "local-rank-arg-under-launcher"},
    "slurm-env-parsing": {"slurm-env-misuse", "env-int-parse"},
    "zero3-conditional-submodule-forward": {"zero3-conditional-forward"},
    "tracker-logging-all-ranks": {"main-process-object-every-rank"},
    "uneven-epoch-end-hang": {"rank-early-exit-collective", "rank-sliced-data"},
    "save-on-every-rank": {"write-on-every-rank"},
    "wrong-rank-query": {"undefined-attribute", "dist-api-unknown"},
    "launcher-argument-contract": {"script-arg-unknown", "launcher-program-not-script"},
    "metric-not-synced-across-ranks": {"metric-not-reduced"},
    "file-ops-on-every-rank": {"write-on-every-rank"},
    "config-contradicts-launch": {"script-arg-unknown", "config-key-unread"},
    "collective-on-subset-of-ranks": {"rank-gated-collective", "rank-early-exit-collective", "clock-gated-collective"},
    "uneven-shards-deadlock": {"rank-sliced-data"},
    "rank-zero-only-model-construction": {"rank-gated-object-used", "rank-gated-model-change"},
    "wrong-device-per-rank": {"load-without-map-location", "device-from-global-rank"},
    "distributed-sampler-config": {"sampler-shuffle-off", "dataloader-sampler-and-shuffle"},
    "launcher-env-contract": {"slurm-env-misuse", "master-addr-int", "env-int-parse"},
    "slurm-script-syntax": {"shell-syntax-error"},
    "identical-rng-across-ranks": {"same-seed-every-rank"},
}
"""Blind set 12 (tests/data/lint/blind12): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it)."""
"""The same for the eleventh blind set (tests/data/lint/blind11, 30 buggy cases and 20 clean files collected on
2026-11-26 by two sessions after blind10 had been used for tuning); written from its manifest's categories before its
first scoring run (a category no rule decided then names the rule its contract calls for)."""


CAUSE_RULES13: dict[str, set[str]] = {
    "init-rank-local-vs-global": {"local-rank-as-global-rank", "init-missing-rank-world-size"},
    "collective-on-subset-of-ranks": {"rank-gated-collective", "rank-early-exit-collective", "clock-gated-collective"},
    "launch-env-missing-required-var": {"launcher-env-unset", "launcher-var-unset", "script-env-required"},
    "missing-data-sharding-across-ranks": {"sampler-not-distributed", "iterable-not-sharded"},
    "rank0-only-file-creation-multinode": {"rank-gated-file-read-every-rank"},
    "launcher-args-after-user-script": {"script-arg-unknown", "launcher-args-after-script"},
    "shared-fs-visibility-race": {"rank-gated-file-read-every-rank"},
    "save-on-every-rank": {"write-on-every-rank"},
    "uncoordinated-remote-download-all-ranks": {"download-every-rank"},
    "launcher-device-selection-mismatch": {"nproc-exceeds-gpus", "include-missing-gpus"},
    "wrap-order-grad-checkpointing-after-ddp-fsdp": {"ddp-wrapper-attribute", "rank-gated-model-change",
                                                    "checkpointing-after-wrap"},
    "rank-dependent-seed-before-fsdp-init": {"rank-seed-before-model-init"},
    "set-epoch-not-propagated": {"sampler-no-set-epoch"},
    "mpirun-process-count-flag": {"mpirun-count-flags"},
    "strategy-checkpoint-mismatch": {"sharded-save-under-ddp"},
    "missing-sampler-set-epoch": {"sampler-no-set-epoch"},
    "per-rank-shard-computed-but-unused": {"rank-shard-unused", "sampler-not-distributed"},
    "wrong-tensor-in-collective": {"collective-same-tensor-twice", "metric-not-reduced"},
    "ddp-device-ids-mismatch-and-uneven-inputs": {"device-from-global-rank", "ddp-device-mismatch"},
    "global-rank0-download-multinode": {"rank-gated-file-read-every-rank", "download-global-rank0"},
    "rank-set-to-local-rank-multinode": {"local-rank-as-global-rank"},
    "sampler-seed-differs-across-ranks": {"sampler-seed-per-rank", "rank-split-differs"},
    "missing-distributed-sampler": {"sampler-not-distributed"},
    "sampler-created-but-not-passed": {"sampler-not-distributed", "sampler-unused"},
    "checkpoint-saved-only-on-global-rank0-multinode": {"rank-gated-file-read-every-rank"},
    "launcher-master-port-differs-per-node": {"master-port-random-per-node"},
    "slurm-master-addr-resolution": {"slurm-env-misuse", "sinfo-field-width"},
    "collective-on-rank0-only": {"rank-gated-collective"},
    "unreduced-metric-normalized-by-global-size": {"metric-not-reduced"},
    "rank-sharding-breaks-at-world-size-1": {"rank-sliced-data"},
}
"""Blind set 13 (tests/data/lint/blind13): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it; after the first run the placeholder megatron-seqpar-max-connections became the general rule that
implements it, script-env-required)."""

CAUSE_RULES14: dict[str, set[str]] = {
    "wrong-device-per-rank": {"device-from-global-rank", "same-device-every-rank", "visible-devices-as-ordinal"},
    "process-group-timeout-too-short": {"init-timeout-short"},
    "process-group-init-order": {"init-device-id-subgroups"},
    "collective-on-some-ranks-only": {"rank-gated-collective", "rank-early-exit-collective"},
    "rank-divergent-output-path": {"clock-per-rank-path", "rank-split-differs"},
    "launcher-env-contract": {"env-int-parse", "env-str-as-number"},
    "missing-barrier-rank0-work": {"rank-early-exit-collective", "exit-without-barrier"},
    "launcher-hostfile-mismatch": {"hostfile-slots-mismatch"},
    "launcher-interpreter-mismatch": {"launcher-from-path"},
    "ray-resource-placement-hang": {"ray-gpus-with-vllm"},
    "rank-divergent-compile": {"rank-divergent-compile"},
    "slurm-launch-undefined-variable": {"shell-var-unset", "launcher-var-unset"},
    "distributed-sampler-wrong-flag": {"undefined-name", "undefined-attribute"},
    "allreduce-sum-not-averaged": {"metric-not-reduced", "allreduce-sum-not-averaged"},
    "wrong-device-before-set-device": {"collective-before-set-device", "cuda-before-set-device"},
    "ddp-wrap-before-device-move": {"ddp-before-to-device"},
    "per-rank-rng-divergent-data": {"rank-split-differs"},
    "dataset-download-on-all-ranks": {"download-every-rank"},
    "missing-distributed-sampler": {"sampler-not-distributed"},
    "missing-set-epoch": {"sampler-no-set-epoch"},
    "custom-sampler-not-rank-aware": {"sampler-not-distributed", "custom-sampler-not-sharded"},
    "set-epoch-not-per-epoch": {"sampler-no-set-epoch"},
    "download-guard-global-vs-local-rank": {"rank-gated-file-read-every-rank", "download-global-rank0"},
    "local-rank-not-used-for-device": {"same-device-every-rank"},
    "fsdp-sharded-param-count": {"fsdp-param-count-after-wrap"},
}
"""Blind set 14 (tests/data/lint/blind14): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it)."""

CAUSE_RULES15: dict[str, set[str]] = {
    "wrong-device-per-rank": {"device-from-global-rank", "same-device-every-rank", "visible-devices-as-ordinal",
                              "cuda-before-set-device", "default-device-tensor"},
    "launcher-arg-contract": {"local-rank-arg-under-launcher", "script-arg-unknown"},
    "io-on-every-rank": {"download-every-rank", "write-on-every-rank"},
    "sampler-epoch-hook-mismatch": {"sampler-no-set-epoch", "epoch-hook-iter-runner"},
    "uneven-distributed-eval-shards": {"rank-sliced-data", "uneven-eval-shards"},
    "rank-unguarded-filesystem-op": {"write-on-every-rank", "rank-gated-directory"},
    "missing-barrier-race": {"rank-gated-directory", "rank-gated-file-read-every-rank"},
    "world-size-mismatch": {"world-size-from-device-count", "gpu-ids-under-distributed"},
    "ddp-unwrap-mismatch": {"ddp-wrapper-attribute", "module-attr-without-ddp"},
    "slurm-env-overwrite": {"slurm-env-misuse", "master-addr-overwritten"},
    "slurm-port-hardcoded": {"hardcoded-master-port", "default-port-shared"},
    "ddp-missing-device-ids": {"ddp-without-device-ids", "nccl-no-device-binding"},
    "fsdp-config-wrapper-bug": {"undefined-attribute", "api-unknown-kwarg"},
    "model-wrapper-unwrap-missing": {"ddp-wrapper-attribute", "isinstance-on-wrapper"},
    "cross-rank-device-mismatch": {"gathered-on-other-devices"},
    "cross-rank-metric-misreduction": {"metric-not-reduced", "gathered-mean-misreduced"},
    "ddp-wrapper-attribute-access": {"ddp-wrapper-attribute"},
    "eval-data-not-sharded": {"sampler-not-distributed", "rank-shard-unused"},
    "model-mutation-after-ddp-wrap": {"ddp-before-to-device", "rank-gated-model-change"},
    "metric-not-reduced-across-ranks": {"metric-not-reduced"},
    "collective-in-rank-divergent-branch": {"rank-gated-collective", "file-gated-collective"},
    "logger-init-on-every-rank": {"main-process-object-every-rank", "tracker-every-rank"},
    "synced-metric-device-mismatch": {"gathered-on-other-devices"},
    "fsdp-optimizer-state-resume": {"api-misuse-optimizer-arg"},
    "fsdp-wrap-policy-error": {"undefined-name", "python-syntax"},
    "distributed-sampler-rank-setup": {"sampler-rank-args-ignored"},
    "ddp-trainer-save-every-rank": {"write-on-every-rank", "ddp-wrapper-attribute"},
}
"""Blind set 15 (tests/data/lint/blind15): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it)."""


CAUSE_RULES16: dict[str, set[str]] = {
    "launcher-env-default-broken": {"shell-default-expansion", "master-addr-missing", "launcher-var-unset"},
    "launcher-arg-contract-local-rank": {"local-rank-arg-under-launcher", "script-arg-unknown"},
    "ddp-wrapper-attribute-access": {"ddp-wrapper-attribute"},
    "double-process-group-init": {"init-twice"},
    "lr-schedule-vs-sharded-dataloader": {"lr-steps-from-dataset-length"},
    "save-on-every-rank": {"write-on-every-rank"},
    "eval-gather-duplicates": {"gather-not-for-metrics"},
    "wrong-device-global-rank": {"device-from-global-rank"},
    "rank0-object-used-on-all-ranks": {"rank-gated-object-used"},
    "missing-set-epoch": {"sampler-no-set-epoch"},
    "rank-dependent-shard-partition": {"rank-split-differs"},
    "zero3-save-without-gather": {"ds-zero3-save-without-gather"},
    "deepspeed-scheduler-ownership": {"ds-plateau-scheduler"},
    "deepspeed-dataloader-iterable-dataset": {"ds-iterable-training-data"},
    "accelerate-deepspeed-plugin-misuse": {"undefined-attribute"},
    "ema-created-before-device-placement": {"ema-before-to-device"},
    "checkpoint-saved-on-every-rank": {"write-on-every-rank"},
    "rank0-only-long-work-before-barrier": {"init-without-timeout", "init-timeout-short"},
    "launch-line-script-arg-mismatch": {"script-arg-unknown", "script-arg-missing"},
    "distributed-sampler-undefined-single-process": {"unbound-after-ddp-branch", "undefined-name"},
    "local-rank-stored-in-shared-args": {"local-rank-shared-args"},
    "missing-barrier-after-rank0-dir-prep": {"rank-gated-directory"},
    "collective-without-process-group": {"collective-before-init"},
    "launch-config-contradiction": {"config-override-contradiction"},
    "launch-override-unknown-config-key": {"config-override-unknown-key"},
    "steps-from-unsharded-dataloader": {"lr-steps-from-dataset-length"},
    "seed-not-offset-by-rank": {"same-seed-every-rank"},
    "slurm-cluster-environment-missing": {"lightning-slurm-mismatch"},
    "rank-dependent-module-participation-deadlock": {"find-unused-parameters", "rank-dependent-modules"},
}
"""Blind set 16 (tests/data/lint/blind16): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it)."""


CAUSE_RULES17: dict[str, set[str]] = {
    "deepspeed-config-vs-script-optimizer-scheduler": {"ds-scheduler-overrides"},
    "grad-accumulation-no-sync-inverted": {"no-sync-misaligned"},
    "world-size-miscount-multinode": {"world-size-as-local"},
    "streaming-dataloader-len-race": {"len-streaming-loader"},
    "unwrapped-model-attribute-single-process": {"module-attr-without-ddp"},
    "distributed-sampler-shard-length": {"sampler-num-samples"},
    "metric-logging-not-synced-ddp": {"metric-not-reduced"},
    "lr-schedule-world-size-scaling": {"lr-steps-from-dataset-length"},
    "collective-on-subset-of-ranks": {"rank-gated-collective"},
    "file-io-on-every-rank": {"write-on-every-rank"},
    "checkpoint-save-on-every-rank": {"write-on-every-rank"},
    "ddp-wrapped-model-attribute": {"ddp-wrapper-attribute"},
    "collective-in-data-dependent-path": {"rank-gated-collective", "collective-in-sampler"},
    "wrong-rank-lookup": {"api-unknown-attribute"},
    "fsdp-empty-init-uninitialized-params": {"fsdp-empty-init-partial-load"},
    "ddp-forward-bypassed-no-grad-sync": {"ddp-bypassed"},
    "per-rank-vs-global-batch-size": {"per-rank-batch-global"},
    "wrong-device-per-rank": {"device-from-global-rank", "same-device-every-rank", "visible-devices-as-ordinal",
                              "cuda-before-set-device", "default-device-tensor"},
    "missing-grad-allreduce-and-config-before-init": {"rank-before-init"},
    "missing-set-device": {"collective-before-set-device", "nccl-no-device-binding"},
    "unsynced-initial-parameters": {"unsynced-module-init"},
    "local-vs-global-rank": {"undefined-attribute", "local-rank-as-global-rank"},
    "lightning-replaces-custom-distributed-sampler": {"lightning-sampler-replaced"},
    "missing-set-epoch": {"sampler-no-set-epoch"},
    "launch-script-config-path": {"config-path-missing"},
    "rank-conditional-collective": {"rank-gated-collective", "rank-early-exit-collective"},
    "ddp-wrapper-attribute-access": {"ddp-wrapper-attribute"},
    "per-node-main-process-and-unsynced-sampler-rng": {"download-every-rank", "main-process-per-node"},
    "ddp-buffer-replaced-on-cpu": {"ddp-buffer-replaced"},
}
"""Blind set 17 (tests/data/lint/blind17): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it)."""


CAUSE_RULES18: dict[str, set[str]] = {
    "collective-under-rank0-guard": {"rank-gated-collective"},
    "missing-sampler-set-epoch": {"sampler-no-set-epoch"},
    "ddp-unused-parameters": {"ddp-unused-parameters"},
    "launcher-env-contract-broken": {"launcher-env-unset", "slurm-env-misuse", "launcher-env-ignored"},
    "rank0-only-resource-used-on-all-ranks": {"main-process-object-every-rank"},
    "missing-distributed-sampler": {"sampler-not-distributed"},
    "ddp-only-code-path-broken": {"undefined-attribute"},
    "lr-schedule-vs-num-processes": {"lr-steps-from-dataset-length"},
    "wrong-device-per-rank": {"nccl-no-device-binding", "collective-before-set-device", "cuda-before-set-device",
                              "same-device-every-rank"},
    "write-on-every-rank": {"write-on-every-rank"},
    "slurm-rendezvous-site-config": {"ifname-unset"},
    "collective-on-subset-of-ranks": {"rank-early-exit-collective", "rank-gated-collective"},
    "ddp-wrap-without-trainable-params": {"ddp-no-trainable-params"},
    "launch-script-env-derivation": {"master-addr-multiple-ips", "nproc-exceeds-gpus"},
    "checkpoint-load-without-map-location": {"load-without-map-location"},
    "save-wrapped-model-state-dict": {"ddp-wrapper-attribute"},
    "launcher-local-rank-arg-contract": {"local-rank-arg-under-launcher", "script-arg-unknown"},
    "launcher-flag-malformed": {"command-unparsable", "launcher-option-unknown"},
    "missing-cuda-set-device": {"nccl-no-device-binding", "collective-before-set-device"},
    "uneven-batches-across-ranks": {"uneven-batches"},
    "fsdp-grad-clip-local-norm": {"fsdp-clip-grad-norm"},
    "invalid-accelerate-fsdp-config": {"acc-invalid-config"},
    "rank-dependent-init-seed-under-fsdp": {"rank-seed-before-model-init"},
    "slurm-launch-line-broken": {"srun-payload-split", "deepspeed-ssh", "srun-no-script"},
    "gathered-results-unused": {"collective-result-discarded", "gathered-result-unused"},
}
"""Blind set 18 (tests/data/lint/blind18): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it)."""


CAUSE_RULES19: dict[str, set[str]] = {
    "ddp-wrapper-bypassed-no-grad-sync": {"ddp-bypassed"},
    "metric-normalised-by-global-size-on-shard": {"metric-not-reduced", "loss-divided-by-dataset-size"},
    "logged-loss-not-reduced-across-ranks": {"metric-not-reduced"},
    "filesystem-race-every-rank": {"write-on-every-rank", "makedirs-race"},
    "model-state-modified-after-ddp-wrap": {"ddp-buffer-replaced", "ddp-buffer-after-wrap"},
    "eval-on-one-shard-unreduced": {"metric-not-reduced", "eval-shard-unreduced"},
    "wrong-device-per-rank": {"device-from-global-rank", "nccl-no-device-binding", "collective-before-set-device",
                              "same-device-every-rank", "quantized-model-no-device-map", "device-map-auto-ddp"},
    "deepspeed-zero3-init-order": {"zero3-init-order"},
    "missing-distributed-sampler": {"sampler-not-distributed", "same-seed-every-rank"},
    "collective-under-rank0-guard": {"rank-gated-collective"},
    "download-race-every-rank": {"download-every-rank"},
    "distributed-sampler-inconsistent-shuffle": {"sampler-rng-differs"},
    "lr-scheduler-steps-vs-accumulation": {"scheduler-steps-per-microbatch", "lr-steps-from-dataset-length"},
    "distributed-sampler-seed-differs-per-rank": {"sampler-seed-per-rank"},
    "launcher-env-contract-rank-localrank": {"local-rank-as-global-rank", "visible-devices-as-ordinal"},
    "missing-set-epoch": {"sampler-no-set-epoch"},
    "launcher-arg-contract": {"local-rank-arg-under-launcher", "script-arg-unknown", "launcher-option-unknown",
                              "launcher-option-after-script"},
    "collective-on-subset-of-ranks": {"rank-gated-collective", "rank-early-exit-collective",
                                      "collective-in-data-dependent-branch"},
    "save-on-every-rank": {"write-on-every-rank"},
    "ddp-unused-parameters": {"ddp-unused-parameters", "find-unused-parameters"},
    "rank-conditional-data-setup": {"rank-gated-data-setup", "rank-gated-object-used"},
    "slurm-launch-mismatch": {"nproc-exceeds-gpus"},
    "fsdp-ordering": {"fsdp-ignored-params-broadcast"},
}
"""Blind set 19 (tests/data/lint/blind19): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it)."""


CAUSE_RULES20: dict[str, set[str]] = {
    "launcher-local-rank-arg-contract": {"local-rank-arg-under-launcher", "script-arg-unknown"},
    "distributed-sampler-missing-set-epoch": {"sampler-no-set-epoch"},
    "collective-on-rank0-only": {"rank-gated-collective"},
    "uneven-shards-collective-hang": {"uneven-batches"},
    "checkpoint-save-collective-timeout": {"init-without-timeout", "save-without-barrier"},
    "per-rank-output-dir-divergence": {"clock-dependent-path", "rank-divergent-value"},
    "sharded-params-independent-eval-desync": {"rank-gated-collective"},
    "per-rank-conditional-skip-collective-mismatch": {"rank-early-exit-collective", "collective-in-data-dependent-branch"},
    "exception-on-one-rank-eval-hang": {"exception-skips-collective", "collective-in-data-dependent-branch"},
    "save-on-every-rank": {"write-on-every-rank"},
    "deepspeed-config-passed-twice": {"ds-args-mismatch", "ds-config-twice"},
    "dataloader-not-sharded-by-accelerate": {"loader-wrapped-before-prepare", "sampler-not-distributed"},
    "zero3-save-without-gather": {"ds-zero3-save-without-gather"},
    "eval-metrics-from-rank0-shard-only": {"eval-shard-unreduced", "metric-not-reduced"},
    "long-unsynchronized-eval-collective-timeout": {"init-without-timeout"},
    "slurm-undefined-node-count": {"shell-var-unset", "launcher-var-unset"},
    "deepspeed-mixed-precision-mismatch": {"ds-precision-mismatch"},
    "dist-timeout-too-short": {"init-timeout-short", "init-without-timeout"},
    "slurm-nproc-from-ntasks": {"slurm-env-misuse", "nproc-exceeds-gpus", "nproc-from-ntasks"},
    "launcher-hostfile-path": {"hostfile-missing", "config-path-missing"},
    "accelerate-num-processes-mismatch": {"acc-processes-without-distribution"},
    "slurm-nnodes-mismatch": {"nnodes-mismatch"},
    "deepspeed-precision-contradiction": {"ds-precision-mismatch", "ds-fp16-and-bf16"},
    "fsdp-optimizer-incompatible": {"fsdp-optimizer-incompatible"},
    "torchrun-entrypoint-contract": {"launcher-program-not-script"},
    "slurm-missing-config-file": {"config-path-missing"},
    "deepspeed-batch-config-mismatch": {"ds-batch-mismatch", "acc-accumulation-twice", "ds-hf-batch-mismatch"},
    "deepspeed-config-wrong-key": {"ds-unknown-key"},
    "global-vs-micro-batch": {"per-rank-batch-global", "ds-unknown-key"},
    "training-config-layer-count-mismatch": {"neox-attention-config-layers"},
}
"""Blind set 20 (tests/data/lint/blind20): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it)."""


CAUSE_RULES21: dict[str, set[str]] = {
    "resume-skips-data-every-epoch": {"resume-skip-every-epoch"},
    "resume-flag-silently-ignored": {"resume-flag-unused"},
    "scheduler-state-not-checkpointed": {"scheduler-not-checkpointed"},
    "zero-partitioned-optimizer-saved-rank0-only": {"rank-gated-collective"},
    "resume-on-rank0-only": {"rank-gated-collective", "rank-gated-model-change"},
    "collective-in-rank0-only-save": {"rank-gated-collective", "ds-zero3-save-without-gather"},
    "resume-state-overwritten-after-load": {"state-overwritten-after-load"},
    "sampler-state-not-checkpointed": {"sampler-state-not-saved"},
    "best-model-selection-differs-per-rank": {"metric-not-reduced", "rank-divergent-value"},
    "save-on-every-rank": {"write-on-every-rank"},
    "barrier-in-rank0-only-save": {"rank-gated-collective"},
    "collectives-on-some-ranks": {"rank-gated-collective", "rank-early-exit-collective",
                                  "collective-in-data-dependent-branch"},
    "accelerate-deepspeed-accumulate-conflict": {"acc-accumulation-twice", "ds-manual-accumulation"},
    "optimizer-state-not-restored": {"optimizer-state-not-restored"},
    "resume-device-placement-order": {"load-without-map-location", "ddp-before-to-device"},
    "fsdp-clip-grad-norm-local": {"fsdp-clip-grad-norm"},
    "ema-model-wrapped-in-ddp-rank0-forward": {"rank-gated-collective"},
    "ema-created-before-ddp-wrap": {"ema-before-ddp-wrap"},
    "grad-accum-off-by-one-scheduler-per-microstep": {"scheduler-steps-per-microbatch", "no-sync-misaligned"},
    "ddp-device-ids-global-rank": {"device-from-global-rank"},
    "zero-grad-before-backward-in-accumulate": {"zero-grad-in-accumulate"},
    "model-zero-grad-under-accelerate-accumulate": {"zero-grad-in-accumulate"},
    "logger-created-on-every-rank": {"write-on-every-rank"},
    "launcher-env-contract-world-size": {"world-size-from-device-count"},
    "dataset-download-race-all-ranks": {"download-every-rank"},
    "device-from-global-rank-config": {"device-from-global-rank"},
    "collective-after-rank-conditional-return": {"rank-early-exit-collective"},
    "init-process-group-local-rank-as-rank": {"local-rank-as-global-rank"},
    "uneven-validation-shards-collective-desync": {"uneven-batches"},
    "uneven-eval-batches-fsdp-collective-mismatch": {"uneven-batches"},
}
"""Blind set 21 (tests/data/lint/blind21): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it)."""


CAUSE_RULES22: dict[str, set[str]] = {
    "device-mesh-rank-mismatch": {"dp-rank-from-mesh"},
    "fsdp-mixed-precision-lora-ref-model": {"fsdp-trainable-low-precision"},
    "fsdp-param-init-fn-meta-rank0": {"fsdp-param-init-fn-overwrites"},
    "fsdp-hsdp-device-mesh-shadowed": {"shadowed-import-called", "undefined-name"},
    "fsdp-wrap-policy-lora-mixed-requires-grad": {"fsdp-mixed-requires-grad"},
    "fsdp-meta-init-missing-sync-module-states": {"fsdp-meta-without-sync"},
    "fsdp-checkpoint-mode-mismatch": {"fsdp-checkpoint-mode-mismatch"},
    "fsdp2-shard-condition-name-mismatch": {"fsdp-wrap-class-unknown"},
    "fsdp-mixed-precision-config": {"fsdp-partial-mixed-precision", "acc-mixed-precision-mismatch"},
    "compile-before-ddp-fsdp-wrap": {"compile-before-wrap"},
    "activation-checkpointing-rng-state": {"ac-rng-state-off"},
    "fsdp-optim-state-dict-api-misuse": {"collective-result-discarded", "fsdp-optim-state-dict-misuse"},
    "activation-checkpointing-fsdp-double-wrap": {"ac-double-wrap"},
    "meta-init-order-buffers-clobbered": {"state-overwritten-after-load", "meta-buffers-after-load"},
    "device-mesh-process-group-timeout": {"init-timeout-not-propagated"},
    "slurm-fixed-master-port": {"master-port-missing", "default-port-shared"},
    "wrong-device-per-rank": {"device-from-global-rank", "ddp-device-mismatch", "same-device-every-rank"},
    "sbatch-directive-typo": {"sbatch-option-unknown"},
    "missing-set-epoch": {"sampler-no-set-epoch"},
    "slurm-exit-status-requeue": {"slurm-requeue"},
    "deepspeed-backward-bypassed": {"deepspeed-raw-backward", "wrapper-raw-backward"},
    "launcher-process-count-missing": {"acc-processes-missing", "nproc-missing"},
    "launcher-arg-contract": {"local-rank-arg-under-launcher", "script-arg-unknown"},
    "slurm-task-layout": {"srun-tasks-per-node", "slurm-tasks-unpinned"},
    "slurm-node-task-count-mismatch": {"srun-tasks-per-node", "sbatch-tasks-fewer-than-nodes"},
    "launcher-env-contract": {"world-size-from-config", "launcher-env-ignored"},
    "world-size-not-propagated": {"world-size-from-device-count"},
    "collective-dtype-failure": {"fsdp-clip-grad-norm"},
    "rank0-only-object-used-on-all-ranks": {"rank-gated-object-used"},
}
"""Blind set 22 (tests/data/lint/blind22): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it)."""


CAUSE_RULES23: dict[str, set[str]] = {
    "deepspeed-checkpoint-path-contract": {"ds-checkpoint-path-mismatch"},
    "zero3-gatheredparameters-misuse": {"api-unknown-kwarg"},
    "checkpoint-load-after-ddp-wrap": {"load-after-ddp-wrap", "ddp-wrapper-attribute"},
    "launcher-local-rank-arg-contract": {"local-rank-arg-under-launcher", "script-arg-unknown"},
    "deepspeed-initialize-optimizer-scheduler-mismatch": {"ds-empty-param-groups"},
    "deepspeed-fp16-autocast-config": {"ds-autocast-conflict"},
    "zero3-module-surgery-after-init": {"zero3-module-surgery"},
    "zero3-save-on-rank0-only": {"rank-gated-collective", "ds-zero3-save-without-gather"},
    "zero3-state-dict-wrong-module": {"ds-zero3-save-without-gather", "zero3-state-dict-submodule"},
    "deepspeed-bf16-outer-autocast": {"ds-autocast-conflict"},
    "deepspeed-launcher-args": {"deepspeed-ssh", "launcher-option-unknown"},
    "deepspeed-launcher-hostfile": {"hostfile-default-overrides"},
    "launch-line-vs-script-grad-accum": {"grad-accum-from-device-count", "script-arg-missing"},
    "deepspeed-fp16-overflow-skip-handling": {"ds-overflow-not-checked"},
    "eval-dataloader-not-sharded": {"loader-not-prepared", "sampler-not-distributed"},
    "per-rank-randomness-collapsed": {"broadcast-per-rank-random"},
    "sampler-uneven-per-rank-length": {"uneven-batches", "sampler-uneven-length"},
    "drop-last-drops-required-samples": {"drop-last-drops-samples"},
    "rank-dependent-train-val-split": {"rank-split-differs"},
    "sampler-seed-and-rank-mismatch": {"sampler-seed-per-rank", "local-rank-as-global-rank"},
    "per-rank-dataset-load-and-logger-init": {"download-every-rank", "write-on-every-rank"},
    "eval-drop-last-ignored": {"drop-last-ignored"},
    "save-on-every-rank": {"write-on-every-rank"},
    "dataloader-worker-seed-shared-across-ranks": {"same-seed-every-rank"},
    "per-rank-seed-before-sharded-init": {"rank-seed-before-model-init"},
    "rank-local-shuffle-before-split": {"rank-split-differs", "sampler-rng-differs"},
    "iterable-dataset-not-sharded": {"iterable-not-sharded"},
    "concurrent-download-all-ranks": {"download-every-rank"},
    "dist-eval-merge-count-mismatch": {"gather-count-mismatch"},
}
"""Blind set 23 (tests/data/lint/blind23): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it)."""


CAUSE_RULES24: dict[str, set[str]] = {
    "distributed-eval-metric-padding": {"eval-padding-counted", "metric-not-reduced"},
    "rank0-only-forward-through-ddp": {"rank-gated-collective"},
    "loss-scaled-by-world-size": {"loss-times-world-size"},
    "wrong-device-per-rank": {"nccl-no-device-binding", "same-device-every-rank", "load-without-map-location",
                              "device-from-global-rank"},
    "precision-config-launch-mismatch": {"ds-args-mismatch", "ds-precision-mismatch"},
    "same-seed-all-ranks": {"same-seed-every-rank"},
    "per-rank-output-path-divergence": {"clock-dependent-path"},
    "rank-local-object-used-on-all-ranks": {"rank-gated-object-used"},
    "ddp-config-mutated-after-wrap": {"rank-gated-model-change", "ddp-requires-grad-after-wrap", "find-unused-parameters"},
    "ddp-multiple-forward-before-backward": {"ddp-double-forward"},
    "rank-dependent-unused-parameters": {"find-unused-parameters"},
    "launcher-local-rank-contract": {"local-rank-arg-under-launcher", "script-arg-unknown"},
    "ddp-unused-parameters": {"find-unused-parameters", "ddp-unused-parameters"},
    "launcher-arg-empty-variable": {"launcher-var-unset", "shell-var-unset"},
    "sbatch-broken-launch-line": {"shell-broken-continuation", "launcher-var-unset"},
    "multinode-torchrun-missing-rendezvous": {"multinode-nnodes-missing", "nnodes-mismatch", "master-addr-missing",
                                              "standalone-multinode"},
    "launcher-port-not-passed": {"master-port-not-passed", "default-port-shared"},
    "hardcoded-device-and-core-binding": {"visible-devices-hardcoded", "nproc-exceeds-gpus"},
    "invalid-master-port": {"port-out-of-range", "command-unparsable", "input-unreadable"},
    "slurm-tasks-vs-torchrun-procs": {"srun-tasks-per-node"},
    "sbatch-missing-gpu-request": {"sbatch-no-gpus"},
    "cuda-visible-devices-overrides-slurm": {"visible-devices-hardcoded", "nproc-exceeds-gpus"},
    "slurm-tasks-vs-gpus-no-launcher": {"srun-tasks-per-node", "env-init-without-launcher"},
    "sbatch-missing-srun": {"nnodes-mismatch", "multinode-without-srun"},
    "launch-cwd-and-nccl-interface": {"script-path-relative"},
    "sbatch-inner-script-quoting": {"shell-syntax-error"},
    "accelerate-machine-rank-expanded-early": {"node-rank-fixed"},
}
"""Blind set 24 (tests/data/lint/blind24): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it)."""


CAUSE_RULES25: dict[str, set[str]] = {
    "launcher-local-rank-arg-contract": {"local-rank-arg-under-launcher", "script-arg-unknown", "local-rank-spelling"},
    "sampler-created-not-used": {"sampler-not-distributed", "sampler-unused"},
    "init-process-group-local-rank-as-global": {"local-rank-as-global-rank"},
    "wrong-device-per-rank": {"device-from-global-rank", "same-device-every-rank"},
    "ddp-unused-parameters": {"find-unused-parameters"},
    "world-size-from-device-count": {"world-size-from-device-count", "grad-accum-from-device-count"},
    "accelerate-config-contradicts-launch / collective-on-subset-of-ranks": {"acc-processes-without-distribution",
                                                                              "rank-gated-collective"},
    "launch-script-rendezvous-misconfig": {"master-addr-multiple", "acc-processes-not-divisible"},
    "rank-local-value-not-reduced": {"metric-not-reduced", "rank-divergent-value"},
    "distributed-sampler-seed-differs-per-rank": {"sampler-seed-per-rank"},
    "custom-sampler-replaced-by-distributed-sampler": {"lightning-sampler-replaced"},
    "epoch-metric-not-synced-across-ranks": {"lightning-log-no-sync-dist", "metric-not-reduced"},
    "rank-zero-only-work-without-barrier": {"rank-early-exit-collective"},
    "data-preparation-on-every-rank": {"write-on-every-rank", "download-every-rank"},
    "deepspeed-config-wrong-plugin": {"config-path-missing"},
    "uneven-iterable-shards-across-ranks": {"uneven-batches"},
    "missing-set-epoch": {"sampler-no-set-epoch"},
    "redundant-sync-dist-on-synced-metric": {"lightning-sync-dist-on-metric"},
    "filesystem-race-on-every-rank": {"write-on-every-rank"},
    "same-random-seed-on-every-rank": {"same-seed-every-rank"},
    "unseeded-per-rank-data-subsampling": {"rank-split-differs"},
    "torchmetric-state-mishandled-under-ddp": {"metric-state-reduce"},
}
"""Blind set 25 (tests/data/lint/blind25): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it).  Scored once, not tuned in the session that collected it."""


CAUSE_RULES26: dict[str, set[str]] = {
    "collective-on-subset-of-ranks": {"rank-gated-collective", "rank-early-exit-collective"},
    "wrong-device-per-rank (device_map auto under DDP)": {"same-device-every-rank", "quantized-model-no-device-map",
                                                          "device-map-auto-under-ddp"},
    "rank0-only-break (divergent control flow)": {"rank-early-exit-collective", "rank-gated-collective"},
    "all-gather-uneven-shapes": {"gather-variable-shape"},
    "local-rank-used-as-global-main": {"write-on-every-rank", "main-process-object-every-rank",
                                       "local-rank-as-global-rank"},
    "save-on-every-rank": {"write-on-every-rank"},
    "ddp-wrapper-attribute-access": {"ddp-wrapper-attribute"},
    "ddp-wrapper-attribute-access (silent fallback)": {"ddp-wrapper-attribute"},
    "ddp-attribute-without-module": {"ddp-wrapper-attribute"},
    "world-size-double-scaling": {"world-size-double-scaling"},
    "lr-schedule-world-size-mismatch": {"lr-steps-from-dataset-length"},
    "grad-clip-before-allreduce": {"grad-clip-before-sync"},
    "launcher-flag-contract (slurm launch line)": {"launcher-option-unknown"},
    "global-batch-exceeds-dataset (launch config vs world size)": {"ds-batch-mismatch", "global-batch-exceeds-dataset"},
    "launch-line-vs-script-args": {"script-arg-unknown"},
    "launcher-arg-contract": {"local-rank-arg-under-launcher", "script-arg-unknown", "local-rank-spelling"},
    "ddp-unused-parameters": {"find-unused-parameters"},
    "ddp-load-state-dict-module-prefix": {"ddp-state-dict-prefix"},
    "ddp-forward-bypasses-wrapper": {"ddp-bypassed"},
    "syncbn-missing": {"batchnorm-without-syncbn"},
    "compile-state-dict-prefix": {"compile-state-dict-prefix"},
    "wrong-device-per-rank": {"same-device-every-rank", "device-from-global-rank", "quantized-model-no-device-map"},
}
"""Blind set 26 (tests/data/lint/blind26): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it)."""


CAUSE_RULES27: dict[str, set[str]] = {
    "ddp-wrapper-bypassed-no-grad-sync": {"ddp-bypassed"},
    "lr-not-scaled-with-world-size": {"lr-not-scaled-with-world-size"},
    "logged-metric-rank0-only": {"metric-not-reduced", "eval-shard-unreduced"},
    "launch-config-contradiction": {"vllm-gpu-taken", "acc-processes-mismatch"},
    "wrong-device-per-rank": {"same-device-every-rank", "device-from-global-rank"},
    "uneven-eval-shards-hang": {"uneven-batches", "rank-early-exit-collective"},
    "collective-on-some-ranks": {"rank-gated-collective", "rank-early-exit-collective"},
    "grad-accum-misconfigured": {"call-arg-mismatch", "grad-clip-before-sync"},
    "metric-double-reduction": {"collective-same-tensor-twice"},
    "effective-batch-size-depends-on-world-size": {"lr-steps-from-dataset-length", "steps-per-epoch-ignores-world-size"},
    "save-on-every-rank": {"write-on-every-rank"},
    "side-effect-on-every-rank": {"write-on-every-rank", "main-process-object-every-rank"},
    "missing-set-epoch-and-unreduced-val": {"sampler-no-set-epoch", "metric-not-reduced", "eval-shard-unreduced"},
    "rng-identical-across-ranks-on-resume": {"same-seed-every-rank"},
    "launcher-args-undefined-variables": {"launcher-var-unset", "shell-var-unset"},
    "stray-command-in-batch-script": {"stray-command", "shell-syntax-error"},
    "launcher-arg-contract": {"launcher-option-unknown", "script-arg-unknown", "local-rank-arg-under-launcher"},
    "nccl-socket-ifname-wrong-interface": {"ifname-excludes-used", "nccl-exclude-keeps-lo"},
    "launch-env-missing-required-var": {"script-env-required"},
    "fixed-master-port-collision-hang": {"hardcoded-master-port", "default-port-shared"},
    "gloo-socket-ifname-wrong-interface": {"gloo-ifname-unset"},
    "node-rank-derivation-wrong": {"node-rank-fixed", "node-rank-derivation"},
    "launcher-env-mismatch": {"launcher-env-mismatch"},
    "slurm-ntasks-vs-devices-mismatch": {"lightning-slurm-mismatch"},
    "master-addr-wrong-host": {"master-addr-login-node"},
    "hostfile-master-derivation": {"hostfile-comment"},
    "fsdp-config-vs-launch-mismatch": {"shell-var-unset", "launcher-var-unset"},
    "entrypoint-invocation-module-shadowing": {"script-path-shadows-package"},
}
"""Blind set 27 (tests/data/lint/blind27): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it)."""


CAUSE_RULES28: dict[str, set[str]] = {
    "callback-writes-on-every-rank": {"write-on-every-rank"},
    "wrong-device-per-rank": {"same-device-every-rank", "device-from-global-rank", "quantized-model-no-device-map"},
    "launch-references-missing-config": {"config-path-missing"},
    "missing-barrier-after-final-save": {"save-without-barrier"},
    "save-on-every-rank": {"write-on-every-rank"},
    "launcher-arg-contract-broken": {"argparse-duplicate-option", "script-arg-unknown", "local-rank-arg-under-launcher"},
    "dist-call-without-initialized-process-group": {"rank-before-init", "collective-before-init"},
    "dataloader-double-sharding": {"lightning-sampler-replaced", "sampler-sharded-twice"},
    "config-contradicts-launch-world-size": {"grpo-generations-not-divisible", "acc-processes-not-divisible"},
    "deepspeed-config-contradicts-training-args": {"ds-scheduler-overrides", "ds-args-mismatch"},
    "accelerate-config-contradicts-deepspeed-config": {"acc-ds-file-overrides", "ds-args-mismatch"},
    "spawn-nprocs-off-by-one": {"spawn-nprocs-mismatch", "nproc-exceeds-gpus"},
    "env-rank-set-after-device-selection": {"launcher-env-unset", "cuda-before-set-device", "same-device-every-rank"},
    "spawn-ignores-master-env": {"hardcoded-master-port", "master-addr-loopback"},
    "port-bound-on-every-local-rank": {"port-in-use", "hardcoded-master-port"},
    "world-size-vs-device-count": {"world-size-from-device-count"},
    "world-size-from-device-count": {"world-size-from-device-count"},
    "spawned-children-share-rng-state": {"same-seed-every-rank"},
    "child-env-cuda-visible-devices": {"visible-devices-as-ordinal"},
    "launcher-arg-contract-check": {"spawn-multinode-check"},
    "fixed-rendezvous-port-reused": {"hardcoded-master-port", "default-port-shared"},
    "free-port-toctou": {"port-race"},
    "spawned-child-missing-set-device": {"nccl-no-device-binding", "same-device-every-rank"},
    "child-env-cuda-visible-devices-too-late": {"cuda-visible-devices-after-init"},
    "device-index-ignores-rank-offset": {"device-from-global-rank", "same-device-every-rank"},
    "device-map-auto-under-ddp": {"device-map-auto-under-ddp", "quantized-model-no-device-map"},
}
"""Blind set 28 (tests/data/lint/blind28): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it)."""


CAUSE_RULES29: dict[str, set[str]] = {
    "eval-sampler-padding-duplicates": {"eval-sampler-pads", "eval-shard-unreduced"},
    "collective-without-process-group": {"collective-before-init", "rank-before-init"},
    "eval-metric-denominator-api-misuse": {"api-unknown-attribute"},
    "inference-ddp-output-order": {"predict-order-under-ddp", "lightning-predict-every-rank"},
    "collective-order-mismatch-across-ranks": {"collective-order-differs"},
    "wrong-device-per-rank": {"device-from-global-rank", "same-device-every-rank"},
    "rank0-only-object-skips-collectives": {"rank-gated-object-used", "rank-early-exit-collective"},
    "process-group-destroyed-midrun": {"destroy-process-group-midrun"},
    "eval-not-sharded-metrics-not-reduced": {"eval-shard-unreduced", "metric-not-reduced", "loader-without-sampler"},
    "ds-config-bad-key-and-unresolvable-auto": {"ds-unknown-key", "ds-invalid-value", "ds-auto-raw-initialize"},
    "ds-batch-size-does-not-multiply-out": {"ds-batch-mismatch"},
    "ds-fp16-bf16-contradiction-with-training-args": {"ds-args-mismatch"},
    "ds-config-scheduler-overrides-training-args": {"ds-scheduler-overrides"},
    "ds-config-scheduler-conflict": {"ds-scheduler-overrides"},
}
"""Blind set 29 (tests/data/lint/blind29): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it)."""


CAUSE_RULES30: dict[str, set[str]] = {
    "launcher-env-contract": {"script-env-required", "launcher-env-unset"},
    "filesystem-op-on-every-rank": {"write-on-every-rank"},
    "wrong-device-per-rank": {"same-device-every-rank", "device-from-global-rank"},
    "sampler-shuffle-conflict": {"dataloader-sampler-and-shuffle"},
    "save-on-every-rank": {"write-on-every-rank"},
    "rank-divergent-state": {"rank-gated-object-used", "rank-gated-model-change"},
    "manual-grad-allreduce": {"manual-grad-allreduce-zero-grads", "allreduce-sum-not-averaged"},
    "ddp-wrap-before-materialize": {"ddp-meta-module", "ddp-before-to-device"},
    "distributed-eval-gather-order": {"predict-order-under-ddp", "eval-sampler-pads", "gather-order-differs"},
    "config-process-group-not-initialized": {"bundle-expression-not-evaluated", "collective-before-init",
                                             "rank-before-init"},
    "missing-set-device": {"cuda-before-set-device", "nccl-no-device-binding", "collective-before-set-device"},
    "ddp-unused-parameters": {"find-unused-parameters"},
    "collective-under-rank-local-condition": {"collective-in-data-dependent-branch", "rank-gated-collective"},
    "ddp-wrapper-attribute-access": {"ddp-wrapper-attribute"},
    "gathered-features-wrong-rank-offset": {"gathered-labels-without-rank-offset"},
    "features-gathered-twice": {"gathered-twice"},
    "slurm-launch-env-expanded-too-early": {"node-rank-fixed", "slurm-env-misuse"},
    "accelerate-prepare-incompatible-dataloader": {"loader-not-preparable"},
    "non-autograd-collective-gradient-scale": {"backward-through-all-reduce", "collective-without-autograd"},
    "ddp-gradient-checkpointing-collective-in-forward": {"reentrant-checkpoint-ddp"},
    "data-sharding-ignores-rank": {"rank-shard-unused", "rank-sliced-data"},
    "syncbn-without-ddp": {"syncbn-without-ddp"},
    "gathered-negatives-label-misalignment": {"gathered-labels-without-rank-offset", "gather-layout-mismatch"},
    "launcher-arg-contract": {"local-rank-arg-under-launcher", "script-arg-unknown"},
    "slurm-resource-mismatch": {"slurm-env-misuse", "workers-from-node-cpus"},
    "collective-without-process-group": {"collective-before-init", "rank-before-init"},
    "gathered-mask-ignores-world-size": {"gathered-labels-without-rank-offset", "gather-layout-mismatch"},
    "gathered-features-wrong-layout": {"gather-layout-mismatch"},
    "rank-offset-without-gather": {"gathered-labels-without-rank-offset", "rank-offset-without-gather"},
}
"""Blind set 30 (tests/data/lint/blind30): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it)."""


CAUSE_RULES31: dict[str, set[str]] = {
    "launcher-local-rank-arg-mismatch": {"local-rank-arg-under-launcher", "script-arg-unknown"},
    "launcher-arg-contract-local-rank": {"local-rank-arg-under-launcher", "script-arg-unknown"},
    "launcher-env-contract-local-rank": {"local-rank-arg-under-launcher", "launcher-env-ignored", "script-arg-missing"},
    "rank-divergent-graph-ddp-hang": {"find-unused-parameters", "collective-in-data-dependent-branch"},
    "rank-divergent-graph-ddp-static-graph": {"find-unused-parameters"},
    "ddp-unused-parameters": {"find-unused-parameters"},
    "collective-without-process-group": {"collective-before-init", "rank-before-init"},
    "world-size-misdetected-from-device-arg": {"world-size-from-device-count", "world-size-from-device-arg"},
    "eval-mode-lost-by-syncbn-conversion": {"eval-before-syncbn-convert"},
    "syncbn-conversion-after-optimizer": {"optimizer-before-syncbn", "fsdp-optimizer-before-wrap"},
    "all-ranks-write-same-file": {"download-every-rank", "write-on-every-rank"},
    "collective-breaks-autograd": {"backward-through-all-reduce", "gather-without-autograd"},
    "non-distributed-multi-gpu-dataparallel": {"dataparallel-multi-gpu"},
    "ddp-subprocess-resume-args": {"resume-args-per-process"},
    "ddp-wrapper-unwrap-mismatch-checkpoint": {"ddp-state-dict-prefix", "ddp-wrapper-attribute"},
    "ddp-branch-undefined-unwrapped-module": {"unbound-after-ddp-branch", "undefined-name"},
    "save-on-every-rank": {"write-on-every-rank"},
    "uneven-batches-across-ranks": {"rank-split-differs", "sampler-rng-differs"},
    "model-not-wrapped-in-ddp": {"ddp-bypassed", "trained-module-not-wrapped"},
    "same-seed-all-ranks": {"same-seed-every-rank"},
    "multi-gpu-device-and-grad-sync": {"undefined-attribute", "grad-not-synced"},
    "backend-platform-mismatch": {"nccl-on-windows"},
    "rank-only-state-used-on-all-ranks": {"rank-gated-object-used", "main-process-object-every-rank"},
    "epoch-length-not-scaled-by-world-size": {"lr-steps-from-dataset-length", "steps-not-divided-by-world-size"},
    "wrong-device-per-process": {"visible-devices-as-ordinal"},
    "resume-config-overwrites-rank": {"rank-overwritten-on-resume"},
    "process-group-creation-mismatch": {"new-group-rank-dependent"},
}
"""Blind set 31 (tests/data/lint/blind31): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it)."""


CAUSE_RULES32: dict[str, set[str]] = {
    "missing-ddp-wrap-no-grad-sync": {"trained-module-not-wrapped", "ddp-bypassed"},
    "wrong-device-per-rank": {"ddp-no-device-ids", "same-device-every-rank", "nccl-no-device-binding"},
    "save-on-every-rank": {"write-on-every-rank"},
    "nondeterministic-across-ranks": {"hash-per-process"},
    "gather-order-mismatch-sampler": {"gather-order-differs", "predict-order-under-ddp"},
    "contrastive-gather-targets-mismatch": {"collective-result-discarded", "gathered-labels-without-rank-offset"},
    "strategy-accelerator-mismatch": {"lightning-strategy-accelerator"},
    "ddp-unused-parameters": {"find-unused-parameters"},
    "rank-divergent-state": {"rank-gated-model-change", "rank-gated-object-used", "rank-gated-state-change"},
    "launcher-reexec-rank-side-effect": {"lightning-reexec-side-effect", "write-on-every-rank"},
    "launcher-spawn-result-contract": {"spawn-result-used"},
    "sampler-shards-wrong-axis": {"lightning-sampler-replaced"},
    "wrong-device-per-replica": {"dataparallel-fixed-device"},
    "slurm-requeue-resume": {"slurm-requeue"},
    "ddp-unused-parameters-strategy": {"find-unused-parameters"},
    "fsdp-state-dict-type-save": {"fsdp-sharded-state-dict-save"},
    "multinode-launch-nproc-mismatch": {"nproc-differs-across-nodes", "nnodes-mismatch"},
    "launcher-world-size-vs-parallelism-config": {"parallelism-vs-world-size", "nnodes-mismatch"},
    "launch-override-parallel-config": {"launch-override-invalid"},
    "fsdp-wrap-class-mismatch": {"fsdp-wrap-class-mismatch", "fsdp-no-wrap-policy"},
    "final-save-inside-epoch-loop": {"final-save-in-loop"},
    "slurm-launch-stale-path": {"config-path-missing"},
    "missing-sharding-flag-in-config": {"model-too-large-unsharded"},
    "launcher-arg-contract-ptl2-trainer-gpus": {"lightning-trainer-arg-removed", "api-unknown-kwarg"},
    "launcher-arg-contract-accelerator-vs-strategy": {"lightning-trainer-arg-removed", "api-unknown-kwarg"},
}
"""Blind set 32 (tests/data/lint/blind32): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it)."""


CAUSE_RULES33: dict[str, set[str]] = {
    "local-rank-used-as-global-rank": {"local-rank-as-global-rank"},
    "ddp-wrapped-model-attribute-access": {"ddp-wrapper-attribute"},
    "all-ranks-create-run-dir-race": {"write-on-every-rank"},
    "concurrent-download-all-ranks": {"download-every-rank"},
    "launch-line-parallel-size-vs-world-size": {"parallelism-vs-world-size", "launch-override-invalid"},
    "all-ranks-write-same-file": {"write-on-every-rank"},
    "logger-call-on-non-main-rank": {"rank-gated-object-used", "main-process-object-every-rank"},
    "hardcoded-device-ids-and-module-unwrap": {"lightning-devices-fixed", "module-attr-without-ddp"},
    "fsdp2-rank-local-metric-no-allreduce": {"metric-not-reduced"},
    "default-cuda-device-per-rank": {"cuda-before-set-device", "same-device-every-rank", "default-device-tensor"},
    "missing-set-device-per-rank": {"nccl-no-device-binding", "same-device-every-rank", "cuda-before-set-device"},
    "file-write-on-every-rank-race": {"write-on-every-rank"},
    "deepspeed-config-contradicts-save-path": {"ds-zero3-save-without-gather", "zero3-state-dict-submodule"},
    "launcher-local-rank-contract": {"local-rank-arg-under-launcher", "script-arg-unknown"},
    "ddp-wrapper-attribute-access": {"ddp-wrapper-attribute"},
    "zero3-collective-divergence-conditional-forward": {"collective-in-data-dependent-branch"},
    "wrong-device-per-rank": {"tensor-device-mismatch", "same-device-every-rank", "nccl-cpu-tensor"},
    "fsdp-inplace-param-data-write": {"fsdp-param-data-write"},
    "ddp-only-code-path-wrong-attribute": {"undefined-attribute", "api-unknown-attribute"},
    "missing-barrier-after-rank0-save": {"load-before-save-barrier"},
    "fsdp-api-misuse-wrong-kwarg": {"api-unknown-kwarg", "call-unknown-kwarg"},
    "uneven-per-rank-batches-collective-hang": {"iterable-not-sharded", "uneven-batches-collective"},
    "missing-set-epoch": {"sampler-no-set-epoch"},
}
"""Blind set 33 (tests/data/lint/blind33): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it)."""


CAUSE_RULES34: dict[str, set[str]] = {
    "incomplete-data-sharding": {"rank-split-differs", "rank-split-drops"},
    "launcher-env-contract": {"local-rank-as-global-rank", "env-init-without-launcher", "launcher-env-unset"},
    "uneven-batches-collective-hang": {"uneven-batches-collective"},
    "wrong-device-per-rank": {"device-from-global-rank", "same-device-every-rank"},
    "deepspeed-dataloader-not-distributed": {"sampler-not-distributed", "loader-not-prepared"},
    "deepspeed-engine-bypassed": {"ddp-bypassed", "deepspeed-raw-backward"},
    "shared-file-written-by-every-rank": {"write-on-every-rank"},
    "data-prep-on-every-rank": {"download-every-rank"},
    "data-shard-uses-local-rank": {"local-rank-as-global-rank", "world-size-as-local"},
    "missing-set-device": {"nccl-no-device-binding", "same-device-every-rank", "collective-before-set-device"},
    "grad-accum-ignores-world-size": {"grad-accum-from-device-count", "batch-divided-twice"},
    "no-gradient-sync": {"dataparallel-under-launcher", "ddp-bypassed"},
    "launch-line-contradicts-script": {"script-arg-missing", "launch-rank-missing"},
    "missing-final-synchronization": {"exit-without-barrier"},
    "collective-src-global-vs-group-rank": {"wrong-collective-src-rank"},
    "launcher-nproc-mismatch": {"nproc-mismatch"},
    "moe-ep-size-vs-world-size": {"parallelism-vs-world-size"},
    "tensor-parallel-batch-not-broadcast": {"tp-batch-not-broadcast"},
    "multinode-world-size-num-nodes": {"lightning-slurm-mismatch", "nnodes-mismatch"},
    "slurm-node-rank-expanded-once": {"node-rank-fixed"},
    "missing-distributed-data-sharding": {"iterable-not-sharded", "sampler-not-distributed"},
    "collective-under-rank-local-condition": {"collective-in-data-dependent-branch", "rank-gated-collective"},
    "wrong-device-global-rank": {"device-from-global-rank"},
    "collective-on-non-tensor-or-without-process-group": {"collective-non-tensor", "collective-before-init"},
    "rng-state-divergence-across-tp-ranks": {"sampler-rng-differs", "rank-gated-data-setup"},
    "cross-rank-file-race-no-sync": {"rank-gated-object-used"},
    "zero-config-units-mismatch": {"ds-invalid-value", "api-unknown-kwarg"},
    "launch-script-env-not-propagated": {"shell-var-unset", "launcher-var-unset"},
}
"""Blind set 34 (tests/data/lint/blind34): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it)."""


CAUSE_RULES35: dict[str, set[str]] = {
    "collective-on-main-process-only": {"rank-gated-collective"},
    "collective-skipped-on-some-ranks": {"rank-early-exit-collective", "rank-gated-collective",
                                         "collective-in-data-dependent-branch"},
    "missing-set-epoch": {"sampler-no-set-epoch"},
    "deepspeed-zero3-config-not-passed": {"zero3-config-not-passed"},
    "wrong-device-per-rank": {"device-from-global-rank", "same-device-every-rank", "cuda-before-set-device",
                              "nccl-no-device-binding"},
    "set-device-after-process-group-init": {"collective-before-set-device", "set-device-after-init",
                                            "nccl-no-device-binding"},
    "env-var-set-after-nccl-init": {"nccl-env-after-init"},
    "launcher-env-override": {"launcher-env-override"},
    "deepspeed-config-ignores-arg": {"ds-args-mismatch"},
    "collective-count-mismatch-across-ranks": {"uneven-batches-collective"},
    "wrong-backend-for-object-collectives": {"object-collective-backend"},
    "nccl-race-needs-barrier": {"nccl-race"},
    "launcher-env-contract-local-world-size": {"world-size-as-local", "launcher-env-misset"},
    "launcher-env-contract-slurm-rank": {"slurm-env-misuse", "launcher-env-unset"},
    "fsdp-checkpoint-load-wrong-module": {"fsdp-load-through-module", "ddp-state-dict-prefix"},
    "ddp-save-wrapped-state-dict": {"ddp-state-dict-prefix"},
    "distributed-sampler-no-shuffle-no-set-epoch": {"sampler-no-set-epoch", "sampler-no-shuffle"},
    "distributed-eval-gather-misaligned": {"gather-order-differs"},
    "checkpoint-load-all-ranks-gpu0": {"load-without-map-location"},
    "missing-distributed-sampler": {"sampler-not-distributed"},
    "save-on-every-rank": {"write-on-every-rank"},
    "missing-final-barrier-before-destroy": {"exit-without-barrier"},
    "ddp-device-ids-cpu": {"ddp-device-ids-cpu"},
    "slurm-task-geometry-mismatch": {"srun-tasks-per-node", "sbatch-tasks-fewer-than-nodes", "nproc-mismatch"},
    "launch-line-config-mismatch": {"lightning-slurm-mismatch", "nproc-exceeds-gpus"},
    "download-race-multinode-local-cache": {"download-every-rank"},
}
"""Blind set 35 (tests/data/lint/blind35): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it)."""


CAUSE_RULES36: dict[str, set[str]] = {
    "device-map-auto-under-ddp": {"same-device-every-rank", "device-map-auto-under-launcher"},
    "zero3-save-without-gather": {"ds-zero3-save-without-gather", "rank-gated-collective"},
    "launcher-missing-for-data-parallel": {"env-init-without-launcher", "launcher-missing"},
    "per-process-device-mismatch": {"input-device-differs-from-model", "same-device-every-rank"},
    "ddp-wrap-frozen-inference-model": {"ddp-no-trainable-params"},
    "replica-count-vs-gpu-count": {"world-size-from-device-count", "replica-count-from-gpu-count"},
    "collective-without-process-group": {"collective-before-init", "rank-before-init"},
    "duplicate-samples-in-distributed-eval": {"rank-sliced-data", "eval-duplicate-samples"},
    "qlora-fsdp-quant-storage": {"fsdp-qlora-no-quant-storage"},
    "attribute-access-on-ddp-wrapper": {"ddp-wrapper-attribute", "undefined-attribute"},
    "rank-divergent-batch-size": {"collective-in-data-dependent-branch", "uneven-batches-collective"},
    "padding-duplicates-in-distributed-inference": {"eval-duplicate-samples"},
    "rank-query-without-process-group": {"rank-before-init", "collective-before-init"},
    "unguarded-per-rank-output": {"write-on-every-rank", "print-on-every-rank"},
    "zero3-init-dtype-rope": {"zero3-init-dtype"},
    "checkpoint-saved-on-all-ranks": {"write-on-every-rank"},
    "rank-divergent-step-count-deadlock": {"collective-in-data-dependent-branch", "uneven-batches-collective"},
    "data-partition-smaller-than-world-size": {"rank-shard-empty"},
    "rank-unaware-file-write": {"write-on-every-rank"},
    "missing-distributed-sampler": {"sampler-not-distributed"},
    "rank-conditional-collective": {"rank-gated-collective", "rank-early-exit-collective"},
    "ddp-undefined-name-and-unused-parameters": {"undefined-name", "find-unused-parameters", "ddp-unused-parameters"},
    "wrong-per-rank-dataset-length": {"dataset-len-not-sharded"},
    "missing-eval-distributed-sampler": {"sampler-not-distributed", "lightning-sampler-replaced"},
    "per-rank-batch-scaled-by-world-size": {"batch-times-world-size"},
    "zero3-without-partitioned-init": {"zero3-without-zero-init"},
    "non-integer-per-rank-batch-size": {"batch-size-not-int"},
    "missing-destroy-process-group": {"destroy-process-group-missing"},
    "metric-not-synced-across-ranks": {"metric-not-reduced"},
    "backend-unavailable-on-platform": {"nccl-without-gpus"},
}
"""Blind set 36 (tests/data/lint/blind36): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it)."""


CAUSE_RULES37: dict[str, set[str]] = {
    "compiled-collective-order-deadlock": {"compiled-collective-order"},
    "rank-local-loss-normalization": {"loss-normalized-per-rank"},
    "devicemesh-submesh-of-submesh": {"submesh-of-submesh"},
    "fsdp2-mixed-precision-policy-mutation": {"frozen-policy-assigned"},
    "data-sharding-worldsize-mismatch": {"shard-world-size-mismatch"},
    "wrong-process-group-context-parallel": {"collective-group-mismatch"},
    "grad-scale-dp-averaging": {"grad-scale-mismatch"},
    "rank-conditional-collective-hsdp": {"rank-gated-collective", "rank-early-exit-collective"},
    "devicemesh-get-group-nd": {"mesh-get-group-without-dim"},
    "fsdp2-api-version-shim": {"api-unknown-attribute", "undefined-attribute"},
    "compile-state-dict-key-mismatch": {"compile-state-dict-prefix"},
    "grad-clip-inside-accumulation": {"clip-inside-accumulation", "zero-grad-in-accumulate"},
    "devicemesh-dim-assumption": {"mesh-dim-assumed"},
    "context-parallel-sdpa-backend": {"context-parallel-sdpa-backend"},
    "tensor-parallel-layer-overwritten": {"parallel-layer-replaced"},
    "mp-spawn-args-not-tuple": {"spawn-args-not-tuple"},
    "module-not-wrapped-in-ddp": {"trained-module-not-wrapped", "ddp-bypassed"},
    "ddp-wrapper-attribute-access": {"ddp-wrapper-attribute", "undefined-attribute"},
    "world-size-from-local-device-count": {"world-size-from-device-count"},
    "per-rank-batch-size-multiplied-by-world-size": {"batch-times-world-size"},
    "ddp-wrapper-discarded": {"ddp-bypassed", "trained-module-not-wrapped"},
    "checkpoint-prefix-world-size-mismatch": {"ddp-state-dict-prefix"},
    "unpicklable-dataset-for-spawn": {"spawn-unpicklable"},
    "metric-state-no-dist-reduce": {"metric-state-reduce"},
    "sampler-and-shuffle-both-set": {"dataloader-sampler-and-shuffle"},
    "allreduce-bucket-mixed-dtype": {"bucket-by-python-type"},
    "unpicklable-object-in-collective": {"object-collective-unpicklable"},
    "global-rank-used-as-local-rank": {"local-rank-as-global-rank", "lightning-readonly-property"},
    "non-distributed-sampler-under-ddp": {"sampler-not-distributed"},
}
"""Blind set 37 (tests/data/lint/blind37): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it)."""


CAUSE_RULES38: dict[str, set[str]] = {
    "checkpoint-load-without-map-location": {"load-without-map-location"},
    "repeated-allreduce-of-accumulated-metrics": {"collective-same-tensor-twice", "allreduce-accumulated-twice"},
    "metric-not-reduced-across-ranks": {"metric-not-reduced"},
    "ddp-module-prefix-state-dict-mismatch": {"ddp-state-dict-prefix"},
    "destroy-process-group-without-barrier": {"exit-without-barrier"},
    "concurrent-dataset-download-all-ranks": {"download-every-rank"},
    "env-var-not-cast-to-int": {"env-str-as-number"},
    "rank-conditional-variable-used-on-all-ranks": {"rank-gated-object-used", "unbound-after-ddp-branch", "undefined-name"},
    "filesystem-race-all-ranks": {"write-on-every-rank", "makedirs-race"},
    "rank-divergent-dataset-listing": {"listing-differs-across-ranks"},
    "unguarded-shared-file-write": {"write-on-every-rank"},
    "rank-check-missing-call": {"rank-function-not-called"},
    "rank0-side-effect-without-barrier": {"rank-gated-object-used", "main-process-object-every-rank"},
    "wrapped-model-attribute-access": {"ddp-wrapper-attribute", "undefined-attribute"},
    "rank-divergent-fsdp-forward": {"rank-gated-collective"},
    "rank-zero-only-step-hook": {"rank-gated-collective"},
    "sampler-wrong-rank-under-model-parallel": {"sampler-rank-mismatch"},
    "barrier-inside-rank-branch": {"rank-gated-collective"},
    "double-allreduce-metric": {"collective-same-tensor-twice", "allreduce-accumulated-twice"},
    "rank-conditional-results-gather": {"rank-gated-object-used"},
    "nccl-collective-on-cpu-tensor": {"nccl-cpu-tensor"},
    "collective-size-mismatch": {"gather-variable-shape"},
    "nested-zero3-init-around-from-pretrained": {"zero3-init-nested"},
}
"""Blind set 38 (tests/data/lint/blind38): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it)."""


CAUSE_RULES39: dict[str, set[str]] = {
    "tp-size-not-dividing-query-groups": {"parallelism-vs-model-shape"},
    "unsupported-kwarg-to-deepspeed-save-checkpoint": {"api-unknown-kwarg"},
    "dcp-checkpoint-wrong-process-group-cpu-offload": {"nccl-cpu-tensor", "dcp-offload-needs-gloo"},
    "unwrap-model-on-optimizer": {"unwrap-model-not-a-model"},
    "gpu-count-mismatch-colocate": {"placement-gpu-count"},
    "slurm-procid-not-unique-across-sruns": {"slurm-env-misuse"},
    "checkpoint-save-with-param-gather-hooks-active": {"megatron-save-with-hooks"},
    "barrier-without-device-ids": {"barrier-without-device-ids", "nccl-no-device-binding"},
    "global-rank-passed-as-group-rank": {"wrong-collective-src-rank"},
    "fsdp-submodule-becomes-root": {"fsdp-submodule-state-dict"},
    "launcher-env-guard-too-broad": {"launcher-env-guard"},
    "unexported-var-in-srun-heredoc": {"launcher-var-unset", "shell-var-unset"},
    "every-rank-loads-full-model-on-cpu": {"full-load-every-rank"},
    "barrier-inside-rank-conditional": {"rank-gated-collective"},
    "missing-set-epoch-batch-sampler": {"sampler-no-set-epoch"},
    "local-rank-argparse-launcher-mismatch": {"local-rank-arg-under-launcher", "script-arg-missing"},
    "nproc-per-node-ignores-visible-devices": {"nproc-ignores-visible-devices", "nproc-exceeds-gpus"},
    "sequence-parallel-loss-normalization": {"loss-normalized-per-rank"},
    "ddp-unused-parameters": {"find-unused-parameters"},
    "distributed-eval-missing-gather": {"eval-shard-unreduced", "metric-not-reduced"},
    "rendezvous-port-reuse": {"port-reused", "port-in-use"},
    "rank-to-node-placement-collision": {"placement-collision"},
    "rank-zero-only-collective-hang": {"rank-gated-collective"},
    "checkpoint-world-size-resharding": {"resume-world-size-change"},
    "ddp-reentrant-checkpoint-unused-params": {"ddp-reentrant-checkpoint"},
    "context-parallel-loss-not-reduced": {"metric-not-reduced"},
    "per-process-device-binding": {"nccl-no-device-binding", "same-device-every-rank", "cuda-before-set-device"},
    "dp-rank-mapping-mismatch": {"rank-mapping-mismatch"},
    "global-rank-as-device-index": {"device-from-global-rank"},
    "unguarded-save-on-all-ranks": {"write-on-every-rank"},
}
"""Blind set 39 (tests/data/lint/blind39): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it)."""


CAUSE_RULES40: dict[str, set[str]] = {
    "non-distributed-multi-gpu-device-ids": {"dataparallel-fixed-device", "mmdataparallel-multi-gpu"},
    "missing-barrier-before-rank0-file-read": {"load-before-save-barrier", "rank-gated-object-used"},
    "local-rank-used-as-global-rank": {"local-rank-as-global-rank"},
    "distributed-sampler-shuffle-ignored": {"sampler-shuffle-ignored"},
    "missing-sampler-set-epoch": {"sampler-no-set-epoch"},
    "ddp-relaunch-drops-arguments": {"ddp-relaunch-drops-args"},
    "resume-flag-reset-before-ddp-launch": {"resume-flag-overwritten"},
    "ddp-worker-entrypoint-loses-args": {"ddp-relaunch-drops-args"},
    "unguarded-file-write-all-ranks": {"write-on-every-rank"},
    "collective-without-process-group": {"collective-before-init"},
    "per-gpu-batch-vs-world-size-mismatch": {"batch-times-world-size", "per-gpu-batch-as-global"},
    "ddp-unused-parameters": {"find-unused-parameters"},
    "assumes-global-rank0-on-every-node": {"rank0-result-on-every-node"},
    "fsdp-wrap-inside-ddp-model": {"fsdp-inside-ddp"},
    "fsdp-wrap-policy-missing-method": {"undefined-attribute", "api-unknown-attribute", "fsdp-wrap-class-mismatch"},
    "global-rank-as-device-id": {"device-from-global-rank"},
    "context-parallel-shape-assert": {"context-parallel-local-length"},
    "sequence-parallel-input-not-broadcast": {"random-draw-not-broadcast"},
    "unguarded-cpu-affinity-at-dist-init": {"affinity-unguarded"},
    "rank0-only-checkpoint-load": {"rank-gated-model-change", "write-on-every-rank"},
    "model-placed-before-set-device": {"cuda-before-set-device"},
    "missing-local-rank-default": {"env-int-parse", "script-env-required"},
    "cuda-visible-devices-contradicts-launch": {"nproc-exceeds-gpus"},
    "unguarded-collective-single-process": {"collective-before-init", "module-attr-without-ddp"},
    "parallel-mesh-mismatch-with-run-mode": {"mesh-size-mismatch"},
    "per-rank-random-seed-in-sequence-parallel": {"seed-per-rank-in-model-parallel", "sampler-seed-per-rank"},
}
"""Blind set 40 (tests/data/lint/blind40): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it)."""


CAUSE_RULES41: dict[str, set[str]] = {
    "ignored-worker-splitter-argument": {"splitter-argument-ignored", "iterable-not-sharded"},
    "loss-scaled-by-world-size-without-gather": {"loss-scaled-by-world-size"},
    "wrong-node-rank-computation": {"node-index-formula"},
    "inconsistent-world-topology-under-replication": {"world-topology-inconsistent"},
    "undefined-name-in-node-splitter": {"undefined-name"},
    "wrong-rank-in-nested-dataset-split": {"rank-formula-overwritten"},
    "distributed-sampler-positions-not-indices": {"sampler-positions-not-indices"},
    "cuda-stream-on-wrong-device-in-thread": {"stream-wrong-device"},
    "unsynchronized-shared-cache-across-ranks": {"download-every-rank"},
    "resume-offset-not-divisible-by-nodes": {"resume-offset-not-divisible"},
    "contrastive-labels-missing-rank-offset": {"gathered-labels-without-rank-offset"},
    "dist-call-without-is-available": {"dist-without-is-available"},
    "all-ranks-write-shared-index": {"write-on-every-rank"},
    "ddp-unused-parameters": {"find-unused-parameters"},
    "collective-over-rank-local-keys": {"collective-over-local-keys", "collective-in-data-dependent-branch"},
    "device-index-from-global-rank": {"device-from-global-rank"},
    "unguarded-makedirs-race-all-ranks": {"write-on-every-rank"},
    "world-size-read-before-process-group-init": {"rank-before-init", "collective-before-init"},
    "wrong-padding-to-world-size": {"padding-formula"},
    "reduceop-avg-unsupported-on-gloo": {"gloo-unsupported-op"},
    "wrong-indexing-of-all-gathered-results": {"gather-order-differs"},
    "rank0-only-mkdir-then-all-ranks-write": {"rank-gated-object-used"},
    "cross-device-concat-of-rank-outputs": {"tensor-device-mismatch"},
    "ddp-wrapper-attribute-access": {"ddp-wrapper-attribute"},
    "ddp-init-on-side-cuda-stream": {"ddp-side-stream"},
    "distributed-sampler-flag-not-handled": {"api-unknown-kwarg", "call-unknown-kwarg"},
    "rank-divergent-conditional-loss-terms": {"collective-in-data-dependent-branch", "find-unused-parameters"},
    "state-assigned-in-prepare-data": {"lightning-prepare-data-state"},
    "fsdp-resume-not-resharded": {"fsdp-full-state-dict-all-ranks"},
    "param-lookup-breaks-under-fsdp": {"fsdp-param-lookup"},
}
"""Blind set 41 (tests/data/lint/blind41): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it)."""


CAUSE_RULES42: dict[str, set[str]] = {
    "ddp-wrap-frozen-model": {"ddp-no-trainable-params"},
    "rank-local-early-exit-desync": {"rank-early-exit-collective", "exception-skips-collective",
                                     "collective-in-data-dependent-branch"},
    "per-rank-statistics-not-reduced": {"metric-not-reduced"},
    "missing-process-group-fsdp-load": {"fsdp-load-without-group"},
    "reentrant-checkpoint-with-ddp": {"ddp-reentrant-checkpoint"},
    "missing-fsdp-wrap-method": {"api-unknown-attribute", "undefined-attribute"},
    "rank-unguarded-logging": {"write-on-every-rank", "main-process-object-every-rank", "rank-gated-object-used"},
    "ddp-find-unused-parameters": {"find-unused-parameters"},
    "hardcoded-device-binding": {"same-device-every-rank", "nccl-no-device-binding", "cuda-before-set-device"},
    "collective-inside-rank-zero-only": {"rank-gated-collective"},
    "ddp-unused-parameters-branch": {"find-unused-parameters"},
    "local-rank-from-wrong-env-var": {"local-rank-from-node-index"},
    "deepspeed-hostfile-slots": {"hostfile-slots"},
    "ddp-device-before-set-device": {"cuda-before-set-device", "ddp-device-mismatch", "same-device-every-rank"},
    "download-guard-local-vs-global-rank": {"local-rank-as-global-rank", "download-every-rank"},
    "script-overrides-launcher-env": {"launcher-env-ignored"},
    "set-device-with-default-local-rank": {"set-device-negative-default", "local-rank-arg-under-launcher"},
    "hardcoded-process-count": {"nproc-exceeds-gpus"},
    "launcher-nproc-per-node-fixed-to-1": {"nproc-fixed"},
    "rank0-save-crash": {"api-unknown-attribute", "undefined-attribute"},
    "per-node-setup-not-rank-guarded": {"write-on-every-rank"},
    "master-addr-from-host-list": {"master-addr-wrong-host"},
    "launcher-worker-args-mismatch": {"call-arg-mismatch"},
    "missing-local-rank-env": {"launcher-env-unset", "local-rank-not-set"},
    "checkpoint-load-broadcast-module": {"object-collective-unpicklable"},
    "launcher-distribution-flag-missing": {"launcher-flag-missing"},
}
"""Blind set 42 (tests/data/lint/blind42): each category of its manifest -> the rule ids that name that cause, written
from the manifest's categories and causes before the set's first run (ids that no rule has yet stand for the finding
that would name it)."""


def _files(case: Path) -> list[Path]:
    return sorted(p for p in case.rglob("*") if p.is_file()) if case.is_dir() else [case]


def score(root: Path = BLIND) -> tuple[list[str], dict[str, int]]:
    """``(one line per case, totals)`` for the blind set at ``root`` (``blind2``: :data:`CAUSE_RULES2`, ``blind3``: :data:`CAUSE_RULES3`, ``blind4``: :data:`CAUSE_RULES4`, ``blind5``: :data:`CAUSE_RULES5`, ``blind6``: :data:`CAUSE_RULES6`, ``blind7``: :data:`CAUSE_RULES7`, ``blind8``: :data:`CAUSE_RULES8`, ``blind9``: :data:`CAUSE_RULES9`, ``blind10``: :data:`CAUSE_RULES10`, ``blind11``: :data:`CAUSE_RULES11`, ``blind12``: :data:`CAUSE_RULES12`, ``blind13``: :data:`CAUSE_RULES13`, ``blind14``: :data:`CAUSE_RULES14`, ``blind15``: :data:`CAUSE_RULES15`, ``blind16``: :data:`CAUSE_RULES16`, ``blind17``: :data:`CAUSE_RULES17`, ``blind18``: :data:`CAUSE_RULES18`, ``blind19``: :data:`CAUSE_RULES19`, ``blind20``: :data:`CAUSE_RULES20`, ``blind21``: :data:`CAUSE_RULES21`, ``blind22``: :data:`CAUSE_RULES22`, ``blind23``: :data:`CAUSE_RULES23`, ``blind24``: :data:`CAUSE_RULES24`, ``blind25``: :data:`CAUSE_RULES25`, ``blind26``: :data:`CAUSE_RULES26`, ``blind27``: :data:`CAUSE_RULES27`, ``blind28``: :data:`CAUSE_RULES28`, ``blind29``: :data:`CAUSE_RULES29`, ``blind30``: :data:`CAUSE_RULES30`, ``blind31``: :data:`CAUSE_RULES31`, ``blind32``: :data:`CAUSE_RULES32`, ``blind33``: :data:`CAUSE_RULES33`, ``blind34``: :data:`CAUSE_RULES34`, ``blind35``: :data:`CAUSE_RULES35`, ``blind36``: :data:`CAUSE_RULES36`, ``blind37``: :data:`CAUSE_RULES37`, ``blind38``: :data:`CAUSE_RULES38`, ``blind39``: :data:`CAUSE_RULES39`, ``blind40``: :data:`CAUSE_RULES40`, ``blind41``: :data:`CAUSE_RULES41`, ``blind42``: :data:`CAUSE_RULES42`)."""
    table = {"blind2": CAUSE_RULES2, "blind3": CAUSE_RULES3, "blind4": CAUSE_RULES4, "blind5": CAUSE_RULES5,
             "blind6": CAUSE_RULES6, "blind7": CAUSE_RULES7, "blind8": CAUSE_RULES8,
             "blind9": CAUSE_RULES9, "blind10": CAUSE_RULES10,
             "blind11": CAUSE_RULES11, "blind12": CAUSE_RULES12, "blind13": CAUSE_RULES13,
             "blind14": CAUSE_RULES14, "blind15": CAUSE_RULES15,
             "blind16": CAUSE_RULES16, "blind17": CAUSE_RULES17,
             "blind18": CAUSE_RULES18, "blind19": CAUSE_RULES19,
             "blind20": CAUSE_RULES20, "blind21": CAUSE_RULES21, "blind22": CAUSE_RULES22, "blind23": CAUSE_RULES23, "blind24": CAUSE_RULES24, "blind25": CAUSE_RULES25,
             "blind26": CAUSE_RULES26, "blind27": CAUSE_RULES27,
             "blind28": CAUSE_RULES28, "blind29": CAUSE_RULES29,
             "blind30": CAUSE_RULES30, "blind31": CAUSE_RULES31, "blind32": CAUSE_RULES32,
             "blind33": CAUSE_RULES33,
             "blind34": CAUSE_RULES34,
             "blind35": CAUSE_RULES35, "blind36": CAUSE_RULES36, "blind37": CAUSE_RULES37, "blind38": CAUSE_RULES38, "blind39": CAUSE_RULES39,
             "blind40": CAUSE_RULES40, "blind41": CAUSE_RULES41,
             "blind42": CAUSE_RULES42}.get(
        root.name, CAUSE_RULES)
    entries = yaml.safe_load((root / "manifest.yaml").read_text())
    if isinstance(entries, dict):   # blind2: {description, counts, cases}
        entries = entries["cases"]
    lines: list[str] = []
    tot = {"decidable": 0, "found": 0, "undecidable": 0, "found_undecidable": 0, "clean": 0, "false_alarms": 0,
           "clean_files_alarmed": 0}
    for e in entries:
        case = root / e["dir_or_file"]
        files = _files(case)
        findings = lint_paths([str(p) for p in files])
        name = e["dir_or_file"]
        if e["kind"] == "clean":
            loud = [f for f in findings if f.status in NOT_OK]
            tot["clean"] += 1
            tot["false_alarms"] += len(loud)
            tot["clean_files_alarmed"] += bool(loud)
            lines.append(f"clean  {'ALARM' if loud else 'ok   '} {name}: " +
                         ("; ".join(f"{os.path.basename(f.file)}:{f.line_no} {f.id}" for f in loud) or "-"))
            continue
        named = {p.name for p in files if re.search(rf"\b{re.escape(p.name)}\b", e["cause"])} or {p.name for p in files}
        want = table.get(e["category"], set())
        hits = [f for f in findings if f.id in want and os.path.basename(f.file) in named and f.status != "OK"]
        key = "decidable" if e.get("decidable_before_launch") else "undecidable"
        tot[key] += 1
        tot["found" if key == "decidable" else "found_undecidable"] += bool(hits)
        got = sorted({f"{os.path.basename(f.file)}:{f.line_no} {f.id}" for f in findings if f.status != "OK"})
        lines.append(f"{'dec  ' if key == 'decidable' else 'undec'}  {'FOUND' if hits else 'miss '} {name} "
                     f"[{e['category']}: {', '.join(sorted(want))}] got: {'; '.join(got) or '-'}")
    return lines, tot


def main(argv: list[str] | None = None) -> int:
    """Print (and with ``--out`` write) the per-case results and the totals."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--root", default=str(BLIND))
    p.add_argument("--out", help="also write the report here")
    args = p.parse_args(argv)
    lines, t = score(Path(args.root))
    recall = t["found"] / t["decidable"] if t["decidable"] else 0.0
    total = (f"decidable recall {t['found']}/{t['decidable']} = {recall:.0%}; undecidable found "
             f"{t['found_undecidable']}/{t['undecidable']}; false alarms {t['false_alarms']} on "
             f"{t['clean_files_alarmed']}/{t['clean']} clean files")
    report = "\n".join([*lines, total]) + "\n"
    print(report, end="")
    if args.out:
        Path(args.out).write_text(report)
    return 0


if __name__ == "__main__":
    sys.exit(main())
