"""runbook lint rules tuned on the tenth blind set (tests/data/lint/blind10), each with its violation and its look-alike."""

from __future__ import annotations

import textwrap

from helpers.lint import lint_texts


def found(*files: tuple[str, str]) -> dict[str, list[str]]:
    """``{rule: [status, ...]}`` of the findings on ``files`` linted together."""
    out: dict[str, list[str]] = {}
    for f in lint_texts([(p, textwrap.dedent(t)) for p, t in files]):
        out.setdefault(f.id, []).append(f.status)
    return out


VISIBLE = """
import os
def init(args):
    local_rank = int(os.environ["LOCAL_RANK"])
    cuda_visible_devices = [int(i) for i in os.environ["CUDA_VISIBLE_DEVICES"].split(',')]
    {pick}
    args.device_id = device_id
"""


def test_a_gpu_number_from_cuda_visible_devices_used_as_the_device_index():
    """plemeri/InSPyReNet#6: CUDA renumbers the visible GPUs from 0."""
    assert found(("t.py", VISIBLE.replace("{pick}", "device_id = cuda_visible_devices[local_rank]")))[
        "visible-devices-as-ordinal"] == ["FAIL"]
    assert "visible-devices-as-ordinal" not in found(("t.py", VISIBLE.replace("{pick}", "device_id = local_rank")))
    shown = VISIBLE.replace("{pick}", "device_id = local_rank; physical = cuda_visible_devices[local_rank]")
    assert "visible-devices-as-ordinal" not in found(("t.py", shown))


COLLECT = """
import torch.distributed as dist
from mmengine.dist import collect_results
def evaluate(self, size, parts):
    if self.collect_device == 'cpu':
        results = collect_results(self.results, size, self.collect_device)
    else:
        {gpu}
    dist.all_gather(parts, self.tensor)
    return self.compute_metrics(results)
"""


def test_a_gathering_call_whose_result_is_thrown_away():
    """open-mmlab/mmengine#1208: collect_results(...) on a line of its own on the GPU path."""
    assert found(("t.py", COLLECT.replace("{gpu}", "collect_results(self.results, size, self.collect_device)")))[
        "collective-result-discarded"] == ["FAIL"]     # dist.all_gather fills `parts`: not reported
    kept = COLLECT.replace("{gpu}", "results = collect_results(self.results, size, self.collect_device)")
    assert "collective-result-discarded" not in found(("t.py", kept))
    acc = "from accelerate import Accelerator\naccelerator = Accelerator()\naccelerator.gather_for_metrics(preds)\n"
    assert found(("t.py", acc))["collective-result-discarded"] == ["FAIL"]


LEGACY = """
import argparse
# made for python -m torch.distributed.launch (use_env=False passes the local rank as an argument)
parser = argparse.ArgumentParser()
parser.add_argument({spelling}, type=int)
args = parser.parse_args()
"""


def test_a_parser_made_for_torch_distributed_launch_without_the_dashed_spelling():
    """speechbrain#1951: since PyTorch 2.0 the launcher passes --local-rank=N."""
    assert found(("t.py", LEGACY.replace("{spelling}", '"--local_rank"')))["local-rank-arg-under-launcher"] == ["FAIL"]
    both = LEGACY.replace("{spelling}", '"--local-rank", "--local_rank", dest="local_rank"')
    assert "local-rank-arg-under-launcher" not in found(("t.py", both))
    torchrun = LEGACY.replace("python -m torch.distributed.launch", "torchrun").replace("{spelling}", '"--local_rank"')
    assert "local-rank-arg-under-launcher" not in found(("t.py", torchrun))


K_DIFFUSION = """
from accelerate import Accelerator
def main():
    accelerator = Accelerator()
    if accelerator.is_main_process:
        metrics_log_file = open('metrics.csv', 'w')
    def evaluate(step):
        if accelerator.{reader}:
            print(step, file=metrics_log_file, flush=True)
    evaluate(0)
"""


def test_a_name_made_on_the_main_process_and_read_on_every_nodes_local_main():
    """crowsonkb/k-diffusion: the metrics file opened under is_main_process, written under is_local_main_process."""
    assert found(("t.py", K_DIFFUSION.replace("{reader}", "is_local_main_process")))["rank-gated-object-used"] == ["FAIL"]
    assert "rank-gated-object-used" not in found(("t.py", K_DIFFUSION.replace("{reader}", "is_main_process")))


def test_per_rank_paths_through_assignments_and_with_open_and_config_dumps_are_not_shared_writes():
    """dinov2's f"{name}.{rankstr()}.pth" opened with `with ... as f`; ijepa's yaml.dump(args, f) on every rank."""
    text = """
    import os, torch, yaml
    import torch.distributed as dist
    def save(data, name, save_dir, args):
        dist.init_process_group("nccl")
        basename = f"{name}.{rankstr()}.pth"
        save_file = os.path.join(save_dir, basename)
        with open(save_file, "wb") as f:
            torch.save(data, f)
        with open(os.path.join(save_dir, "params.yaml"), "w") as f:
            yaml.dump({dumped}, f)
    """
    assert "write-on-every-rank" not in found(("t.py", text.replace("{dumped}", "args")))
    assert found(("t.py", text.replace("{dumped}", "metrics")))["write-on-every-rank"] == ["WARN"]
