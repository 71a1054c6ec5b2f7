"""helpers.memory: the ZeRO paper's numbers, DeepSpeed 0.19.8's own estimators, activations, the CLI."""

from __future__ import annotations

import pytest
import torch

from helpers import cli, memory
from helpers.scenarios import smoke_deepspeed

GB = 1e9


@pytest.mark.parametrize(("strategy", "published_gb"), [
    ("ddp", 120.0), ("zero1", 31.4), ("zero2", 16.6), ("zero3", 1.9),
])
def test_zero_paper_figure_1(strategy, published_gb):
    """Figure 1 of the ZeRO paper: Ψ = 7.5B, N_d = 64, K = 12 (mixed-precision Adam)."""
    est = memory.estimate(7_500_000_000, 64, strategy)
    assert round((est.total - est.grad_buckets) / GB, 1) == published_gb  # the paper leaves DDP's buckets out
    assert est.total == est.params + est.grads + est.optimizer_states + est.grad_buckets == sum(est.components().values())
    assert est.optimizer_states == est.master + est.moments


def test_components_and_formulas():
    psi, n = 1_000_000, 4
    ddp = memory.estimate(psi, n, "ddp")
    assert (ddp.params, ddp.grads, ddp.master, ddp.moments) == (2 * psi, 2 * psi, 4 * psi, 8 * psi)
    z1 = memory.estimate(psi, n, "zero1")
    assert z1.total == 4 * psi + 12 * psi // n and z1.formulas["total"] == "4Ψ + 12Ψ/N"
    z2 = memory.estimate(psi, n, "zero2")
    assert z2.total == 2 * psi + 14 * psi // n and z2.formulas["total"] == "2Ψ + 14Ψ/N"
    z3 = memory.estimate(psi, n, "zero3")
    assert z3.total == 16 * psi // n and z3.formulas["total"] == "16Ψ/N"
    assert memory.estimate(psi, n, "zero0").total == ddp.total - ddp.grad_buckets
    fp32 = memory.estimate(psi, 1, "ddp", precision="fp32")
    assert (fp32.params, fp32.grads, fp32.master, fp32.moments) == (4 * psi, 4 * psi, 0, 8 * psi)
    sgd = memory.estimate(psi, 1, "ddp", optimizer="sgd", bucket_view=True)
    assert sgd.moments == 4 * psi and sgd.total == 12 * psi
    # The fp32 gradients DeepSpeed builds for the step (measured in chapter 05): 4Ψ/N, 4Ψ at ZeRO-0, none for DDP.
    assert (z2.step_transient, memory.estimate(psi, n, "zero0").step_transient, ddp.step_transient) == (
        4 * psi // n, 4 * psi, 0)


def test_fsdp_layouts_match_zero_totals():
    psi, n = 8_000_000, 8
    full = memory.estimate(psi, n, "fsdp_full_shard")
    assert full.total == memory.estimate(psi, n, "zero3").total
    assert (full.params, full.grads, full.master) == (4 * psi // n, 4 * psi // n, 0)  # fp32 shards are the master
    sgo = memory.estimate(psi, n, "fsdp_shard_grad_op")
    assert sgo.total == full.total and sgo.compute_copy == 2 * psi
    assert memory.estimate(psi, n, "fsdp_no_shard").total == 16 * psi
    hybrid = memory.estimate(psi, 16, "fsdp_hybrid_shard", shard_size=8)
    assert hybrid.total == full.total  # sharded over the 8 ranks of a node, replicated across nodes


def test_offload_splits_device_and_host():
    psi, n = 1_000_000, 4
    z2 = memory.estimate(psi, n, "zero2", offload="cpu")
    assert z2.device_bytes == 2 * psi and z2.host_bytes == 16 * psi // n
    assert z2.total == z2.device_bytes + z2.host_bytes
    # ZeRO-3 with offload_optimizer keeps its bf16 gradient partition on the host as well (measured, D16).
    z3 = memory.estimate(psi, n, "zero3", offload="cpu")
    assert z3.device_bytes == 2 * psi // n and z3.host_bytes == 18 * psi // n and z3.grads == 6 * psi // n
    z3p = memory.estimate(psi, n, "zero3", offload="cpu+param")
    assert z3p.device_bytes == 0 and z3p.host_bytes == 20 * psi // n
    assert memory.estimate(psi, n, "zero2", offload="none").host_bytes == 0


@pytest.mark.parametrize(("kwargs", "field"), [
    ({"params": -1, "world_size": 2, "strategy": "zero2"}, "params"),
    ({"params": 1.5, "world_size": 2, "strategy": "zero2"}, "params"),
    ({"params": 10, "world_size": 0, "strategy": "zero2"}, "world_size"),
    ({"params": 10, "world_size": 2, "strategy": "zero4"}, "strategy"),
    ({"params": 10, "world_size": 2, "strategy": "zero2", "precision": "fp8"}, "precision"),
    ({"params": 10, "world_size": 2, "strategy": "zero2", "optimizer": "adagrad"}, "optimizer"),
    ({"params": 10, "world_size": 2, "strategy": "zero2", "offload": "nvme"}, "offload"),
    ({"params": 10, "world_size": 2, "strategy": "ddp", "offload": "cpu"}, "offload"),
    ({"params": 10, "world_size": 2, "strategy": "zero2", "offload": "cpu+param"}, "offload"),
    ({"params": 10, "world_size": 4, "strategy": "fsdp_hybrid_shard"}, "shard_size"),
    ({"params": 10, "world_size": 4, "strategy": "fsdp_hybrid_shard", "shard_size": 3}, "shard_size"),
    ({"params": 10, "world_size": 4, "strategy": "zero3", "shard_size": 2}, "shard_size"),
])
def test_bad_input_names_the_field(kwargs, field):
    with pytest.raises(ValueError, match=rf"^{field}="):
        memory.estimate(**kwargs)


# --- DeepSpeed 0.19.8's own estimators ------------------------------------------------------------
# deepspeed.runtime.zero.stage_1_and_2.estimate_zero2_model_states_mem_needs(_all_live/_all_cold) and
# deepspeed.runtime.zero.stage3.estimate_zero3_model_states_mem_needs(_all_live/_all_cold).

PSI, LARGEST, GPUS = 1_200_000_000, 50_000_000, 4


def test_deepspeed_zero2_gpu_estimate_adds_the_fp32_gradient_partition():
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    cpu, gpu = estimate_zero2_model_states_mem_needs(PSI, num_gpus_per_node=GPUS, num_nodes=1, cpu_offload=False)
    ours = memory.estimate(PSI, GPUS, "zero2")
    # DeepSpeed: 2Ψ + 18Ψ/N, its 18 = 2 (bf16 grads) + 4 (fp32 grads) + 4 (fp32 params) + 8 (Adam).
    # Ours: 2Ψ + 14Ψ/N in the model states, plus the 4Ψ/N fp32 gradient partition as step_transient.
    assert gpu == ours.total + ours.step_transient
    # Host RAM without offload: each process loads the fp32 model (4Ψ) once, times the 1.5 buffer factor.
    assert cpu == int(PSI * 4 * GPUS * 1.5)


def test_deepspeed_zero2_offload_estimate_is_ours_times_the_buffer_factor():
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs

    cpu, gpu = estimate_zero2_model_states_mem_needs(PSI, num_gpus_per_node=GPUS, num_nodes=1, cpu_offload=True)
    ours = memory.estimate(PSI, GPUS, "zero2", offload="cpu")
    assert gpu == ours.device_bytes  # the bf16 parameters, 2Ψ
    # DeepSpeed reports host RAM per node: Ψ x max(4 x GPUs, 16) x 1.5.  With <= 4 GPUs per node the
    # max() picks 16, i.e. our 16Ψ/N per rank x N ranks x the 1.5 buffer factor.
    assert cpu == int(ours.host_bytes * GPUS * 1.5)
    cpu8, _ = estimate_zero2_model_states_mem_needs(PSI, num_gpus_per_node=8, num_nodes=1, cpu_offload=True)
    ours8 = memory.estimate(PSI, 8, "zero2", offload="cpu")
    # With 8 GPUs DeepSpeed's max() picks 4 x 8 = 32: every process holding a full fp32 model at load time.
    assert cpu8 == int(PSI * 32 * 1.5) and cpu8 > ours8.host_bytes * 8 * 1.5


def test_deepspeed_zero3_gpu_estimate_omits_the_bf16_gradient_partition():
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    cpu, gpu, largest_mem = estimate_zero3_model_states_mem_needs(PSI, LARGEST, num_gpus_per_node=GPUS, num_nodes=1,
                                                                  cpu_offload=False, cpu_offload_params=False)
    ours = memory.estimate(PSI, GPUS, "zero3")
    assert largest_mem == 4 * LARGEST  # DeepSpeed's working set: one gathered layer, at 4 bytes per value
    # DeepSpeed: 18Ψ/N.  Measured on 0.19.8 (chapter 05, D16) inside the step: 2 (bf16 params) + 2 (bf16
    # gradient partition, grad_partitions_flat_buffer, kept) + 4 (fp32 grads) + 4 (master) + 8 (Adam) = 20Ψ/N.
    assert gpu - largest_mem == ours.total + ours.step_transient - 2 * PSI // GPUS


def test_deepspeed_zero3_offload_estimates():
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs

    cpu, gpu, largest_mem = estimate_zero3_model_states_mem_needs(PSI, LARGEST, num_gpus_per_node=GPUS, num_nodes=2,
                                                                  cpu_offload=True, cpu_offload_params=False)
    world = 2 * GPUS
    opt = memory.estimate(PSI, world, "zero3", offload="cpu")
    assert gpu == largest_mem + opt.device_bytes  # the bf16 parameter partition, 2Ψ/N, plus one layer
    # Host RAM per node: DeepSpeed 16Ψ/nodes x 1.5.  Ours per rank 18Ψ/N: 0.19.8 also puts the bf16 gradient
    # partition (2Ψ/N) on the host (stage3.py: self.device = cpu with offload_optimizer; measured in D16).
    per_node = opt.host_bytes * GPUS
    assert cpu == int((per_node - 2 * PSI // world * GPUS) * 1.5)
    cpu_p, gpu_p, _ = estimate_zero3_model_states_mem_needs(PSI, LARGEST, num_gpus_per_node=GPUS, num_nodes=2,
                                                            cpu_offload=True, cpu_offload_params=True)
    par = memory.estimate(PSI, world, "zero3", offload="cpu+param")
    assert gpu_p == largest_mem and par.device_bytes == 0
    assert cpu_p == int((par.host_bytes * GPUS - 2 * PSI // world * GPUS) * 1.5)  # DeepSpeed 18Ψ/nodes, ours 20


def test_deepspeed_all_live_estimators_run_and_count_like_params_of(capsys):
    from deepspeed.runtime.zero.stage3 import estimate_zero3_model_states_mem_needs_all_live
    from deepspeed.runtime.zero.stage3 import model_to_params as z3_model_to_params
    from deepspeed.runtime.zero.stage_1_and_2 import estimate_zero2_model_states_mem_needs_all_live, model_to_params

    model = smoke_deepspeed.make_model(256)
    assert model_to_params(model) == memory.params_of(model) == 1_575_168
    assert z3_model_to_params(model) == (1_575_168, 1024 * 1024 + 1024)
    estimate_zero2_model_states_mem_needs_all_live(model, num_gpus_per_node=2)
    estimate_zero3_model_states_mem_needs_all_live(model, num_gpus_per_node=2)
    out = capsys.readouterr().out
    assert out.count("per CPU  |  per GPU |   Options") == 2


def test_params_of_meta_model_and_deepspeeds_data_ptr_dedupe():
    with torch.device("meta"):
        meta = smoke_deepspeed.make_model(256)
    assert memory.params_of(meta) == 1_575_168
    # DeepSpeed dedupes shared parameters by data_ptr(), which is 0 for every meta tensor:
    # the six tensors collapse into the last one seen (the 256-element bias).
    from deepspeed.runtime.zero.stage_1_and_2 import model_to_params

    assert model_to_params(meta) == 256


def test_params_of_counts_tied_weights_once_and_trainable_only():
    emb = torch.nn.Embedding(100, 16)
    head = torch.nn.Linear(16, 100, bias=False)
    head.weight = emb.weight
    model = torch.nn.Sequential(emb, head)
    assert memory.params_of(model) == 1600
    emb.weight.requires_grad_(False)
    assert memory.params_of(model, trainable_only=True) == 0
    with pytest.raises(ValueError, match="^model="):
        memory.params_of(object())


# --- activations ------------------------------------------------------------------------------------

def saved_activation_bytes(model: torch.nn.Module, x: torch.Tensor) -> int:
    """Bytes of the tensors autograd saves for backward in ``model(x)``, parameters excluded."""
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        s = t.untyped_storage()
        if s.data_ptr() not in params:
            seen[s.data_ptr()] = s.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model(x)
    return sum(seen.values())


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_mlp_activation_formula_matches_autograd(dtype):
    h, b = 32, 5
    model = smoke_deepspeed.make_model(h).to(dtype)
    x = torch.randn(b, h, dtype=dtype)
    size = torch.finfo(dtype).bits // 8
    formula, value = memory.activation_bytes_formula("mlp", batch=b, bytes_per_value=size,
                                                     widths=[h, 4 * h, 4 * h, h])
    assert value == saved_activation_bytes(model, x) == b * size * 17 * h
    assert formula.endswith(f"= {value} B")


def test_transformer_activation_formula():
    # Korthikanti et al. 2022, eq. (1): s*b*h*(34 + 5*a*s/h) bytes per layer.
    formula, value = memory.activation_bytes_formula("transformer", batch=1, seq_len=2048, hidden=12288,
                                                     heads=96, layers=2)
    assert value == int(2 * 2048 * 12288 * (34 + 5 * 96 * 2048 / 12288))
    assert "34 + 5*a*s/h" in formula and "2205.05198" in formula
    with pytest.raises(ValueError, match="^heads="):
        memory.activation_bytes_formula("transformer", batch=1, seq_len=8, hidden=8, layers=1)
    with pytest.raises(ValueError, match="^kind="):
        memory.activation_bytes_formula("cnn", batch=1)
    with pytest.raises(ValueError, match="^batch="):
        memory.activation_bytes_formula("mlp", batch=0, widths=[2, 2])


# --- command line -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("text", "value"), [("1.3e9", 1_300_000_000), ("1.3B", 1_300_000_000),
                                             ("350M", 350_000_000), ("1,575,168", 1_575_168), ("7b", 7 * 10**9),
                                             ("8.3B", 8_300_000_000), ("7e9", 7 * 10**9), ("1.5M", 1_500_000),
                                             ("70 B", 70 * 10**9), ("1e15", 10**15)])
def test_parse_count(text, value):
    assert memory.parse_count(text) == value  # exact: 8.3B is not float(8.3) * 1e9 = 8,299,999,999.9...


@pytest.mark.parametrize(("text", "why"), [("1e400", "more than"), ("1e9999999999", "out of range"),
                                           ("2e15", "more than"), ("0", "at least 1"), ("0.5", "not a whole"),
                                           ("-3", "expected a count"), ("lots", "expected a count"), ("1.5e-7M", "not a whole")])
def test_parse_count_refuses_absurd_values_with_a_message(text, why):
    with pytest.raises(ValueError, match=r"^--params=") as exc:
        memory.parse_count(text)
    assert why in str(exc.value)


def test_ddp_gradient_buckets_in_the_estimate():
    """DDP adds a second copy of the gradients (its buckets) unless bucket_view; checked against a real DDP in
    tests/jobs/test_ddp_buckets.py (constructing one imports torch._dynamo: seconds, too slow for this layer)."""
    psi = 1_000_000
    mixed = memory.estimate(psi, 8, "ddp")
    assert mixed.total == 18 * psi and mixed.grad_buckets == mixed.grads == 2 * psi  # chapter 01's "18 bytes per parameter"
    assert mixed.formulas["total"] == "18Ψ (16Ψ + 2Ψ DDP buckets)"
    assert memory.estimate(psi, 8, "ddp", bucket_view=True).total == 16 * psi
    assert memory.estimate(psi, 8, "ddp", precision="fp32").total == 20 * psi  # torch.autocast: fp32 weights and grads
    with pytest.raises(ValueError, match="^bucket_view=True"):
        memory.estimate(psi, 2, "zero2", bucket_view=True)


def test_cli_table(capsys):
    assert cli.main(["estimate-memory", "--params", "1.3e9", "--world-size", "8", "--strategy", "zero2"]) == 0
    out = capsys.readouterr().out
    assert "2Ψ + 14Ψ/N" in out and "4,875,000,000" in out and "arxiv.org/abs/1910.02054" in out
    assert cli.main(["estimate-memory", "--params", "7B", "--world-size", "16", "--strategy", "all"]) == 0
    out = capsys.readouterr().out
    assert all(s in out for s in ("ddp", "zero1", "zero2", "zero3", "fsdp_full_shard"))
    assert cli.main(["estimate-memory", "--params", "1.3e9", "--world-size", "8", "--strategy", "zero3", "--offload", "cpu"]) == 0
    assert "host" in capsys.readouterr().out


def test_cli_bad_input(capsys):
    assert cli.main(["estimate-memory", "--params", "1.3e9", "--world-size", "8", "--strategy", "zero9"]) == 2
    assert "strategy='zero9'" in capsys.readouterr().err
    for argv in (["--params", "lots"], ["--params", "1e400"], ["--params", "8.3B", "--world-size", "0"],
                 ["--params", "8.3B", "--world-size", "1e30"], ["--params", "8.3B", "--gpu-memory", "lots"]):
        with pytest.raises(SystemExit) as exc:
            cli.main(["estimate-memory", *argv, *(["--world-size", "8"] if "--world-size" not in argv else [])])
        err = capsys.readouterr().err
        assert exc.value.code == 2 and len(err.splitlines()) == 1 and argv[-2] in err, err  # one line naming the flag


def test_cli_defaults_to_every_strategy_and_says_whether_it_fits(capsys):
    assert cli.main(["estimate-memory", "--params", "8.3B", "--world-size", "8", "--gpu-memory", "80GiB"]) == 0
    out = capsys.readouterr().out
    rows = {line.split()[0]: line for line in out.splitlines() if line.startswith("  ")}
    assert set(rows) >= {"ddp", "zero1", "zero2", "zero3", "fsdp_full_shard"}
    ddp, z3 = memory.estimate(8_300_000_000, 8, "ddp"), memory.estimate(8_300_000_000, 8, "zero3")
    assert "NO (" in rows["ddp"] and ddp.device_bytes > 80 * 2**30   # 18Ψ = 139 GiB does not fit in 80 GiB
    assert "fits (" in rows["zero3"] and z3.device_bytes + z3.step_transient < 80 * 2**30
    assert "18Ψ (16Ψ + 2Ψ DDP buckets)" in out and "80.00 GiB" in out


def test_cli_activation_estimate_needs_the_whole_shape(capsys):
    shape = ["--micro-batch", "1", "--seq-len", "2048", "--hidden", "4096", "--layers", "32", "--heads", "32"]
    assert cli.main(["estimate-memory", "--params", "7B", "--world-size", "8", "--strategy", "zero3", "--gpu-memory", "80", *shape]) == 0
    out = capsys.readouterr().out
    _, act = memory.activation_bytes_formula("transformer", batch=1, seq_len=2048, hidden=4096, heads=32, layers=32)
    assert f"{act} B" in out and memory.human_bytes(act) in out
    assert cli.main(["estimate-memory", "--params", "7B", "--world-size", "8", *shape[:4]]) == 2
    assert "--layers, --heads: the activation estimate needs all of" in capsys.readouterr().err


def test_runbook_cli_estimate_memory(capsys):
    from helpers import cli

    assert cli.main(["estimate-memory", "--params", "1.3e9", "--world-size", "8", "--strategy", "zero2"]) == 0
    assert "2Ψ + 14Ψ/N" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        cli.main(["estimate-memory", "--params", "x", "--world-size", "8", "--strategy", "zero2"])
    assert exc.value.code == 2 and "--params" in capsys.readouterr().err
