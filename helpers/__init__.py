"""distributed-runbook helpers: launch, bound and inspect multi-process PyTorch jobs.

Nothing is imported or run at import time; import the submodule you need
(``helpers.jobs``, ``helpers.busbw``, ``helpers.report``, ...).
"""

__version__ = "0.1.0"
