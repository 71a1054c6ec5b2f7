"""runbook lint changes made on the forty-second blind set (tests/data/lint/blind42), each with its violation and its
look-alike."""

from __future__ import annotations

import textwrap

from helpers.lint import lint_texts


def findings(*files: tuple[str, str]) -> list[tuple[str, str]]:
    return [(f.id, f.status) for f in lint_texts([(n, textwrap.dedent(t)) for n, t in files])]


def ids(*files: tuple[str, str]) -> list[str]:
    return [i for i, status in findings(*files) if status != "OK"]


def test_model_frozen_by_a_helper_then_wrapped():
    """torchdistill: module_util.freeze_module_params(teacher) then DistributedDataParallel(teacher); a helper that
    freezes some layers only (freeze_transformer_layers) is not this."""
    src = """
    import torch
    from torch.nn.parallel import DistributedDataParallel

    def main(teacher, student, device_ids):
        torch.distributed.init_process_group("nccl")
        {freeze}
        teacher = DistributedDataParallel(teacher, device_ids=device_ids)
        student = DistributedDataParallel(student, device_ids=device_ids)
    """
    assert "ddp-no-trainable-params" in ids(("train.py", src.replace("{freeze}", "module_util.freeze_module_params(teacher)")))
    assert "ddp-no-trainable-params" in ids(("train.py", src.replace("{freeze}", "teacher.freeze()")))
    assert "ddp-no-trainable-params" not in ids(("train.py", src.replace("{freeze}", "freeze_transformer_layers(teacher, 4)")))


def test_training_loop_left_on_this_ranks_nan_loss():
    """torchdistill: `if torch.isnan(loss) or torch.isinf(loss): break` after the step, in a DDP script; a loss reduced
    across ranks before the test (DETR's reduce_dict), or a sys.exit, is not this."""
    src = """
    import sys
    import torch
    from torch.nn.parallel import DistributedDataParallel

    def train(model, loader, optimizer):
        model = DistributedDataParallel(model)
        for x, y in loader:
            loss = model(x, y)
            {reduce}
            loss.backward()
            optimizer.step()
            if torch.isnan(loss) or torch.isinf(loss):
                {leave}
    """
    assert "collective-in-data-dependent-branch" in ids(("train.py", src.replace("{reduce}", "pass").replace("{leave}", "break")))
    assert "collective-in-data-dependent-branch" not in ids(("train.py", src.replace(
        "{reduce}", "loss = reduce_dict(loss)").replace("{leave}", "break")))
    assert "collective-in-data-dependent-branch" not in ids(("train.py", src.replace("{reduce}", "pass").replace(
        "{leave}", "sys.exit(1)")))


def test_to_a_device_named_cuda_before_set_device():
    """SageMaker's smddp MNIST: device = torch.device("cuda"); DDP(Net().to(device)); then set_device(local_rank)."""
    src = """
    import torch
    from torch.nn.parallel import DistributedDataParallel as DDP

    def main(local_rank):
        torch.distributed.init_process_group("nccl")
        device = torch.device({dev})
        {first}
        model = DDP(Net().to(device))
        torch.cuda.set_device(local_rank)
    """
    assert "cuda-before-set-device" in ids(("train.py", src.replace("{dev}", '"cuda"').replace("{first}", "pass")))
    assert "cuda-before-set-device" not in ids(("train.py", src.replace("{dev}", '"cuda", local_rank')
                                                .replace("{first}", "pass")))


def test_launcher_variables_overwritten_at_import():
    """CoreWeave's finetuner: RANK=0, LOCAL_RANK=0, WORLD_SIZE=1 set at import under no test; guarded by `if "RANK"
    not in os.environ`, or one variable alone, is not this."""
    src = """
    import os
    {block}
    import deepspeed
    """
    fixed = 'os.environ["RANK"] = "0"\nos.environ["LOCAL_RANK"] = "0"\nos.environ["WORLD_SIZE"] = "1"'
    assert "launcher-env-ignored" in ids(("finetuner.py", src.replace("{block}", fixed.replace("\n", "\n    "))))
    guarded = 'if "RANK" not in os.environ:\n        ' + fixed.replace("\n", "\n        ")
    assert "launcher-env-ignored" not in ids(("finetuner.py", src.replace("{block}", guarded)))
    assert "launcher-env-ignored" not in ids(("finetuner.py", src.replace("{block}", 'os.environ["LOCAL_RANK"] = "0"')))


def test_standard_library_function_that_does_not_exist():
    """SageMaker's MNIST: os.join(args.model_dir, "model.pt") on rank 0's save path; os.path.join is fine."""
    src = """
    import os
    import torch

    def save(model, model_dir, rank):
        if rank == 0:
            torch.save(model.state_dict(), {path})
    """
    assert "api-unknown-attribute" in ids(("train.py", src.replace("{path}", 'os.join(model_dir, "model.pt")')))
    assert "api-unknown-attribute" not in ids(("train.py", src.replace("{path}", 'os.path.join(model_dir, "model.pt")')))


def test_sagemaker_accelerate_config_read_by_its_own_class():
    """hf-notebooks: compute_environment AMAZON_SAGEMAKER with its SageMaker keys (ec2_instance_type, iam_role_name...)
    is SageMakerConfig's, as accelerate launch reads it; the same keys in a local config are unknown keys."""
    sm = ("compute_environment: AMAZON_SAGEMAKER\ndistributed_type: DATA_PARALLEL\nec2_instance_type: ml.p3.16xlarge\n"
          "iam_role_name: role\nmixed_precision: fp16\nnum_machines: 1\nregion: us-east-1\nuse_cpu: false\n")
    assert "acc-invalid-config" not in ids(("accelerate_config.yaml", sm))
    local = sm.replace("AMAZON_SAGEMAKER", "LOCAL_MACHINE").replace("DATA_PARALLEL", "MULTI_GPU")
    assert "acc-invalid-config" in ids(("accelerate_config.yaml", local))


def test_download_inside_a_file_lock():
    """KubeRay's Ray Train MNIST: datasets downloaded inside `with FileLock(...)` (the processes take turns); the same
    download outside it, in a DDP script, is still every rank's."""
    src = """
    import os
    import torch
    from filelock import FileLock
    from torchvision import datasets

    def loaders():
        {open}
            data = datasets.FashionMNIST(root="~/data", train=True, download=True)
        return data

    def train():
        torch.distributed.init_process_group("nccl")
        model = torch.nn.parallel.DistributedDataParallel(Net())
        loaders()
    """
    assert "download-every-rank" not in ids(("train.py", src.replace("{open}", 'with FileLock(os.path.expanduser("~/data.lock")):')))
    assert "download-every-rank" in ids(("train.py", src.replace("{open}", "if True:")))
