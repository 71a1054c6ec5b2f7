"""DDP's gradient buckets, read from a real ``DistributedDataParallel``: what ``helpers.memory`` adds for ``ddp``.

A world-size-1 gloo group in this process (a FileStore in a temp dir); DDP's logging data lists the
bytes of each bucket it allocated.  Here, not in tests/unit: constructing a DDP imports torch._dynamo
(seconds on these machines).
"""

from __future__ import annotations

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

from helpers import memory


def test_ddp_buckets_are_a_second_copy_of_the_gradients(tmp_path):
    """DDP's buckets are one more copy of the gradients unless gradient_as_bucket_view=True (issue 29 point 9).

    Read from a real ``DistributedDataParallel`` (world size 1, gloo): its logging data lists the bucket sizes
    it allocated; their sum is the model's gradient bytes, which is what the estimate adds.
    """
    model = torch.nn.Sequential(torch.nn.Linear(300, 200), torch.nn.GELU(), torch.nn.Linear(200, 10))
    psi = memory.params_of(model)
    store = dist.FileStore(str(tmp_path / "store"), 1)
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        ddp = DistributedDataParallel(model)
        logged = ddp._get_ddp_logging_data()  # "bucket_sizes": the bytes of each bucket, "440" or "1048576, 2000"
        bucket_bytes = sum(int(size) for size in str(logged["bucket_sizes"]).split(","))
        assert logged["gradient_as_bucket_view"] == 0
    finally:
        dist.destroy_process_group()
    est = memory.estimate(psi, 1, "ddp", precision="fp32")
    assert bucket_bytes == 4 * psi == est.grad_buckets == est.grads
    assert est.total == 20 * psi and est.formulas["total"].startswith("20Ψ")
