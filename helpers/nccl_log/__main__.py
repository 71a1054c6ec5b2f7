"""``python -m helpers.nccl_log FILE...``: the same as ``runbook nccl-log FILE...``."""

import sys

from helpers.nccl_log import main

sys.exit(main())
