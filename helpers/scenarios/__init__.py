"""Scripts that launchers execute as ranks (each runnable on its own with ``--help``).

They are run as files (``torchrun helpers/scenarios/x.py``) and import their shared code as
``from helpers.scenarios import _common`` (the project is installed editable, and the job
runner puts the project root first on every rank's ``PYTHONPATH``).  ``_common`` holds the
shared flags (``add_dist_args``: ``--backend``, ``--timeout-s``) and process-group set-up;
``_fsdp`` the FSDP model code of chapter 04.

Fixtures, not lessons: ``toy_job.py`` is the job runner's test job (ok / crash / hang / exit
modes; the runner's, the doctor's and the lab's tests, ``benchmarks/bench_runner.py``) and
``ddp_step.py`` the DDP step of the tracing-overhead benchmark (``benchmarks/bench_doctor.py``).  Every other script reproduces a chapter's seed.
"""
