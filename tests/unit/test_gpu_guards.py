"""CPU-side guards of the GPU/NCCL path (issue 17, docs/gpu-path.md).

No GPU is lent to this project, so these tests pretend to be a GPU node where that is honest:
``torch.cuda.is_available``/``device_count`` are monkeypatched, and the tests read which backend
each chapter and ``runbook diagnose`` would choose, and which launcher argv and environment the
helpers would build.  Nothing here starts a rank; what NCCL itself does stays unverified on hardware.
"""

from __future__ import annotations

import ast
import io
import json
import re
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from helpers import cli, collective_trace, jobs, procs, slurm, tiers
from helpers.allocation import grades, local
from helpers.scenarios import fabric_check

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = ROOT / "notebooks"
SCENARIOS = ROOT / "helpers" / "scenarios"
CPU_TIER_CHAPTERS = ("02_ddp", "03_hangs", "04_fsdp", "05_deepspeed")


@pytest.fixture
def gpu_node(monkeypatch):
    """Pretend this process sees ``n`` CUDA GPUs (call the fixture's value with ``n``)."""

    def pretend(n: int) -> None:
        monkeypatch.setattr(torch.cuda, "is_available", lambda: n > 0)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: n)

    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    monkeypatch.delenv("SLURM_GPUS_ON_NODE", raising=False)
    return pretend


def _cells(chapter: str) -> list[dict]:
    return json.loads((NOTEBOOKS / f"{chapter}.ipynb").read_text())["cells"]


def _parameters(chapter: str) -> dict:
    cell = next(c for c in _cells(chapter) if "parameters" in c.get("metadata", {}).get("tags", []))
    values: dict = {}
    exec("".join(cell["source"]), {}, values)  # plain literals only (papermill overrides literals)
    return values


# --------------------------------------------------------------------------- chapters: which backend


@pytest.mark.parametrize("chapter", CPU_TIER_CHAPTERS)
def test_cpu_tier_stays_on_gloo_on_an_8_gpu_node(chapter, gpu_node, capsys):
    gpu_node(8)
    params = _parameters(chapter)
    assert params["BACKEND"] == "gloo"
    code = "".join("".join(c["source"]) for c in _cells(chapter) if c["cell_type"] == "code")
    nproc = re.search(r"jobs\.choose_backend\(BACKEND, (\w+)\)", code)
    assert nproc, "the chapter resolves BACKEND with jobs.choose_backend"
    n = params.get(nproc[1], 4) if not nproc[1].isdigit() else int(nproc[1])
    assert jobs.choose_backend(params["BACKEND"], n) == "gloo"
    # the same call with "auto" is what used to put the CPU tier on NCCL
    assert jobs.choose_backend("auto", n) == "nccl"


@pytest.mark.parametrize("chapter", ["03_hangs", "04_fsdp", "05_deepspeed"])
def test_nccl_lives_only_in_tagged_cells_and_no_silent_backend_skip(chapter):
    for i, cell in enumerate(_cells(chapter)):
        if cell["cell_type"] != "code":
            continue
        src = "".join(cell["source"])
        tags = cell.get("metadata", {}).get("tags", [])
        if '"nccl"' in src:
            assert any(t.startswith("tier-") for t in tags), f"{chapter} cell {i} runs NCCL untagged"
            assert src.lstrip().startswith("if tiers.have("), f"{chapter} cell {i}: a tagged cell opens with tiers.have"
        assert not re.search(r"^\s*if backend ==", src, re.M), f"{chapter} cell {i}: use tiers.backend_is (prints why)"


def test_backend_is_prints_the_reason(capsys):
    assert tiers.backend_is("gloo", "gloo", "x")
    assert capsys.readouterr().out == ""
    assert not tiers.backend_is("nccl", "gloo", "gloo's error text")
    assert "[SKIP backend-gloo] gloo's error text; this run uses nccl" in capsys.readouterr().out


def test_hybrid_agents_never_share_a_gpu(gpu_node, monkeypatch, capsys):
    gpu_node(8)
    assert tiers.agent_devices("nccl", 2, 2) == ("nccl", [{"CUDA_VISIBLE_DEVICES": "0,1"}, {"CUDA_VISIBLE_DEVICES": "2,3"}])
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    backend, env = tiers.agent_devices("nccl", 2, 2)
    assert backend == "nccl" and [e["CUDA_VISIBLE_DEVICES"] for e in env] == ["4,5", "6,7"]
    gpu_node(2)  # 2 GPUs for 2 agents x 2 ranks: NCCL would see "Duplicate GPU detected"
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES")
    assert tiers.agent_devices("nccl", 2, 2) == ("gloo", [{}, {}])
    assert "need 4 GPUs" in capsys.readouterr().out
    assert tiers.agent_devices("gloo", 2, 2) == ("gloo", [{}, {}])
    with pytest.raises(ValueError, match="agents"):
        tiers.agent_devices("nccl", 0, 2)


def test_chapter_04_hybrid_cell_uses_agent_devices():
    cell = next("".join(c["source"]) for c in _cells("04_fsdp") if "d13-hybrid-2nodes" in "".join(c["source"]))
    assert "tiers.agent_devices(backend, 2, NPROC)" in cell and "per_process_env=agent_env" in cell
    assert '"--backend", agent_backend' in cell


def test_chapter_05_deepspeed_launcher_cells_get_a_free_port():
    for cell in _cells("05_deepspeed"):
        src = "".join(cell["source"])
        if 'launcher="deepspeed"' in src:
            assert "hostinfo.free_port()" in src and "launcher_args=port" in src, src[:200]


def test_chapter_03_flight_recorder_cell_is_fresh_and_checks_dumps():
    src = next("".join(c["source"]) for c in _cells("03_hangs")
               if c["cell_type"] == "code" and "TORCH_NCCL_DUMP_ON_TIMEOUT" in "".join(c["source"]))
    assert "shutil.rmtree(fr_dir" in src and "rank_0" in src and "Watchdog caught collective operation timeout" in src
    assert "fr_trace" not in src  # no analysis promised that the cell does not run


# --------------------------------------------------------------------------- runbook diagnose: --nproc, backend


def test_default_nproc(gpu_node, monkeypatch):
    gpu_node(0)
    assert local.default_nproc({}) == 2
    assert local.default_nproc({"SLURM_GPUS_ON_NODE": "4"}) == 4
    gpu_node(8)
    assert local.default_nproc({}) == 8
    assert local.default_nproc({"SLURM_GPUS_ON_NODE": "4"}) == 4
    assert local.default_nproc({"SLURM_GPUS_ON_NODE": "junk"}) == 8


def test_runbook_diagnose_defaults_to_the_gpu_count(gpu_node, monkeypatch, tmp_path, capsys):
    import papermill

    seen: dict = {}

    def fake_execute(source, executed, *, parameters, **kw):
        seen.update(parameters)
        Path(parameters["REPORT_DIR"], "report.json").write_text(json.dumps({"checks": [], "status": "OK"}))

    monkeypatch.setattr(papermill, "execute_notebook", fake_execute)
    gpu_node(8)
    assert cli.main(["diagnose", "--out-dir", str(tmp_path)]) == 0
    assert seen["NPROC"] == 8 and seen["BACKEND"] == "auto"
    assert jobs.choose_backend(seen["BACKEND"], seen["NPROC"]) == "nccl"  # notebook 00's choice
    monkeypatch.setenv("SLURM_GPUS_ON_NODE", "4")
    cli.main(["diagnose", "--out-dir", str(tmp_path)])
    assert seen["NPROC"] == 4
    cli.main(["diagnose", "--out-dir", str(tmp_path), "--nproc", "3"])
    assert seen["NPROC"] == 3
    gpu_node(0)
    monkeypatch.delenv("SLURM_GPUS_ON_NODE")
    cli.main(["diagnose", "--out-dir", str(tmp_path)])
    assert seen["NPROC"] == 2
    seen.clear()
    with pytest.raises(SystemExit):  # an explicit 0 is refused, never replaced by the default
        cli.main(["diagnose", "--out-dir", str(tmp_path), "--nproc", "0"])
    assert seen == {}


def test_smoke_03_uses_torchrun_and_torch_adam_without_a_toolkit(monkeypatch, tmp_path):
    calls: list[dict] = []

    def fake_run_job(script, args, **kw):
        out = Path(args[args.index("--out") + 1])
        out.write_text(json.dumps({"passed": True, "steps": 1, "steps_per_s": 1.0, "final_loss": 0.1,
                                   "peak_memory": {"bytes": 0}}))
        calls.append({"script": script, "args": list(args), **kw})
        return SimpleNamespace(ok=True, wall_s=1.0)

    monkeypatch.setattr(jobs, "run_job", fake_run_job)
    check, _ = local.run_smoke("03", tmp_path, nproc=8, backend="nccl", steps=1, hidden=8, batch=4,
                                     timeout_s=10, fused_adam=False)
    assert check.status == "OK"
    call = calls[-1]
    assert call["launcher"] == "torchrun" and call["nproc"] == 8 and not call.get("launcher_args")
    config = Path(call["args"][call["args"].index("--deepspeed-config") + 1])
    assert json.loads(config.read_text())["optimizer"]["params"]["torch_adam"] is True
    local.run_smoke("03", tmp_path, nproc=8, backend="nccl", steps=1, hidden=8, batch=4, timeout_s=10)
    assert calls[-1]["args"][calls[-1]["args"].index("--deepspeed-config") + 1].endswith("configs/ds_zero1_gpu.json")


def test_toolchain_is_graded_with_its_fix():
    assert local.check_toolchain("gloo", Path(".")) == []
    missing = grades.grade_toolchain("12.8", None, None)
    assert missing.status == "WARN" and "CUDA_HOME" in missing.title and "torch_adam" in missing.remediation
    assert "cuda/12.8" in missing.remediation
    mismatch = grades.grade_toolchain("12.8", "/usr/local/cuda", "11.8")
    assert mismatch.status == "WARN" and "does not match" in mismatch.title
    failed = grades.grade_toolchain("12.8", "/usr/local/cuda", "12.4", {"ok": False, "wall_s": 3, "log": "b.log",
                                                                            "error": "ninja: build stopped"})
    assert failed.status == "WARN" and "ninja" in failed.title and "b.log" in failed.remediation
    ok = grades.grade_toolchain("12.8", "/usr/local/cuda", "12.4", {"ok": True, "wall_s": 61.0, "log": "b.log"})
    assert ok.status == "OK" and "61 s" in ok.title
    assert grades.grade_toolchain(None, None, None).status == "WARN"


def test_deepspeed_trips_over_an_arch_specific_entry_and_the_stripped_list_passes(monkeypatch):
    """The H200 machine's image sets an arch list with 9.0a: DeepSpeed's own builder (this venv's) raises before any
    compile; the list strip_arch_suffixes gives passes the same code."""
    from deepspeed.ops.op_builder.fused_adam import FusedAdamBuilder

    builder = FusedAdamBuilder()
    builder.jit_mode = True
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", "8.0;9.0a")
    with pytest.raises(ValueError, match="'0a'"):
        builder.compute_capability_args()
    assert local.strip_arch_suffixes("8.0;9.0a") == "8.0;9.0"
    monkeypatch.setenv("TORCH_CUDA_ARCH_LIST", local.strip_arch_suffixes("8.0;9.0a"))
    builder.compute_capability_args()  # no exception
    assert local.strip_arch_suffixes("8.0 9.0a 10.0f+PTX 9.0") == "8.0;9.0;10.0+PTX"
    assert local.strip_arch_suffixes("8.0;9.0+PTX") is None and local.strip_arch_suffixes("") is None


def test_toolchain_names_the_arch_list_trap_and_the_build_that_proves_the_fix():
    first = {"ok": False, "wall_s": 5, "log": "b.log", "arch_list": "9.0a",
             "error": "ValueError: invalid literal for int() with base 10: '0a'"}
    fixed = grades.grade_toolchain("13.0", "/usr/local/cuda", "13.0",
                                   {**first, "retry": {"ok": True, "wall_s": 48.2, "log": "p.log", "arch_list": "9.0"}})
    assert fixed.status == "WARN" and "TORCH_CUDA_ARCH_LIST='9.0a'" in fixed.title and "built in 48 s" in fixed.title
    assert "export TORCH_CUDA_ARCH_LIST='9.0'" in fixed.remediation and "pull/8619" in fixed.source
    # the H100 run of make gpu-check: diagnose had built it already, so the retry only loaded it ("ninja: no work
    # to do") and its seconds are no build time
    reused = grades.grade_toolchain("13.0", "/usr/local/cuda", "13.0",
                                    {**first, "retry": {"ok": True, "wall_s": 4.2, "log": "p.log", "arch_list": "9.0",
                                                        "reused": True}})
    assert "loaded an earlier build in 4 s" in reused.title and "built in" not in reused.title
    still = grades.grade_toolchain("13.0", "/usr/local/cuda", "13.0",
                                   {**first, "retry": {"ok": False, "wall_s": 9, "log": "p.log", "arch_list": "9.0",
                                                       "error": "ninja: build stopped"}})
    assert still.status == "WARN" and "failed too: ninja" in still.title and "p.log" in still.remediation


def test_cpu_affinity_below_the_rank_count_is_a_warn():
    def records(cpus: int) -> list[dict]:
        return [{"hostname": "gpu-01", "torch": "2.13", "cpu_affinity": cpus,
                 "contract": {"RANK": str(i), "GROUP_RANK": "0"}} for i in range(4)]

    crowded = grades.grade_env(records(1))
    assert crowded.status == "WARN" and "fewer CPUs than ranks" in crowded.title
    assert crowded.values["cpu_affinity"] == {"gpu-01/node0": {"ranks": 4, "min_cpus": 1}}
    assert "--cpus-per-task" in crowded.remediation
    assert grades.grade_env(records(4)).status == "OK"


# --------------------------------------------------------------------------- launchers: argv and environment


def test_deepspeed_launcher_keeps_cuda_visible_devices(monkeypatch):
    monkeypatch.delenv("CUDA_VISIBLE_DEVICES", raising=False)
    [cmd] = jobs.launcher_argv("deepspeed", SCENARIOS / "toy_job.py", nproc=2)
    assert "--num_gpus=2" in cmd
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5,6,7")
    [cmd] = jobs.launcher_argv("deepspeed", SCENARIOS / "toy_job.py", nproc=2)
    assert "--include=localhost:4,5" in cmd and not any(a.startswith("--num_gpus") for a in cmd)
    with pytest.raises(ValueError, match="nproc=8"):
        jobs.launcher_argv("deepspeed", SCENARIOS / "toy_job.py", nproc=8)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "GPU-1f2e,GPU-3c4d")
    with pytest.raises(ValueError, match="CUDA_VISIBLE_DEVICES"):
        jobs.launcher_argv("deepspeed", SCENARIOS / "toy_job.py", nproc=2)
    [cmd] = jobs.launcher_argv("torchrun", SCENARIOS / "toy_job.py", nproc=2)  # torchrun leaves CVD alone
    assert "--standalone" in cmd


def test_srun_lines_ask_for_cpus():
    text = slurm.srun_torchrun(2, 8, "train.py")
    srun_line = next(line for line in text.splitlines() if line.startswith("srun "))
    assert '--cpus-per-task="${SLURM_CPUS_PER_TASK:-8}"' in srun_line
    own = slurm.srun_torchrun(2, 8, "train.py", srun_args=["--cpus-per-task=4"])
    assert own.count("--cpus-per-task") == 1
    script = slurm.sbatch_script("t", 2, 4, "train.py", cpus_per_task=16)
    assert "#SBATCH --cpus-per-task=16" in script and '--cpus-per-task="${SLURM_CPUS_PER_TASK:-4}"' in script
    assert subprocess.run(["bash", "-n"], input=script, text=True, check=False).returncode == 0
    readme = (ROOT / "README.md").read_text()
    section = readme[readme.index("## On a GPU cluster"):readme.index("## Chapters")]
    commands = re.findall(r"`(srun [^`]*runbook[^`]*)`", section)
    assert commands and all("--cpus-per-task" in cmd for cmd in commands)


# --------------------------------------------------------------------------- traces, stacks, fabric


def test_collective_trace_waits_for_cuda_before_exit(monkeypatch):
    events: list[str] = []

    class FakeCudaTensor:
        is_cuda = True
        device = "cuda:3"
        shape = (4,)
        dtype = torch.float32

    class Stream:
        def synchronize(self) -> None:
            events.append("sync")

    fh = io.StringIO()
    monkeypatch.setattr(torch.cuda, "current_stream", lambda device: events.append(f"stream {device}") or Stream())
    monkeypatch.setitem(collective_trace._state, "file", fh)
    traced = collective_trace._wrap("all_reduce", lambda *a, **k: events.append("queued"))
    orig_write = collective_trace._write
    monkeypatch.setattr(collective_trace, "_write", lambda f, rec: (events.append(rec["phase"]), orig_write(f, rec)))
    traced(FakeCudaTensor())
    assert events == ["enter", "queued", "stream cuda:3", "sync", "exit"]
    events.clear()
    traced(FakeCudaTensor(), async_op=True)
    assert events == ["enter", "queued", "exit"] and '"async_op":true' in fh.getvalue()
    events.clear()
    traced(torch.ones(2))  # a CPU tensor (gloo): nothing to wait for
    assert events == ["enter", "queued", "exit"]


def test_collective_trace_sets_blocking_wait_before_init(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCH_NCCL_BLOCKING_WAIT", raising=False)
    try:
        collective_trace.enable(tmp_path, rank=0)
        import os

        assert os.environ["TORCH_NCCL_BLOCKING_WAIT"] == "1"
    finally:
        collective_trace.disable()


def test_ptrace_refusal_names_cause_and_fix(tmp_path):
    scope = tmp_path / "ptrace_scope"
    scope.write_text("1\n")
    hint = procs.ptrace_hint("Error: Operation not permitted (os error 1)", str(scope))
    assert "ptrace_scope=1" in hint and "CAP_SYS_PTRACE" in hint and "sudo" in hint
    assert procs.ptrace_hint("Error: No such process", str(scope)) == ""


def test_fabric_manager_outside_the_host_is_not_a_fail():
    smi_q = "\n".join(f"GPU 0000000{i}:00.0\n    Fabric\n        State : Completed\n        Status : Success"
                      for i in range(4))
    records = {r["id"]: r for r in fabric_check.grade("570.86", 0, "inactive", "", smi_q)}
    assert records["fabric.gpu"]["status"] == "OK"
    assert records["fabric.service"]["status"] == "WARN" and "runs elsewhere" in records["fabric.service"]["title"]
    assert records["fabric.version"]["status"] == "WARN"
    stuck = smi_q.replace("Completed", "In Progress", 1)
    records = {r["id"]: r for r in fabric_check.grade("570.86", 4, "inactive", "", stuck)}
    assert records["fabric.service"]["status"] == "FAIL" and records["fabric.gpu"]["status"] == "FAIL"


def test_smoke_peaks_are_read_before_the_reload():
    for name, reload in (("smoke_single", "fresh_model.load_state_dict("), ("smoke_ddp", "fresh_model.load_state_dict("),
                         ("smoke_deepspeed", "= engine.load_checkpoint(")):
        text = (SCENARIOS / f"{name}.py").read_text()
        assert text.count("_common.peak_memory(device)") == 1, name
        assert text.index("_common.peak_memory(device)") < text.index(reload), name


# --------------------------------------------------------------------------- scenarios: collective tensors

FACTORIES = {"tensor", "zeros", "ones", "full", "empty", "arange", "randn", "rand", "randint", "as_tensor", "linspace"}
TENSOR_COLLECTIVES = set(collective_trace.OPS) - {"barrier", "monitored_barrier", "all_gather_object",
                                                 "broadcast_object_list", "gather_object", "scatter_object_list"}


def _device_taken(call: ast.AST) -> bool:
    """A factory call with ``device=<not "cpu">``, or any expression moved with ``.to(...)``/``.cuda()``."""
    if isinstance(call, ast.Call) and isinstance(call.func, ast.Attribute) and call.func.attr in ("to", "cuda"):
        return True
    if isinstance(call, ast.Call):
        for kw in call.keywords:
            if kw.arg == "device":
                return not (isinstance(kw.value, ast.Constant) and kw.value.value == "cpu")
    return False


def _is_factory(node: ast.AST) -> bool:
    return (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr in FACTORIES
            and isinstance(node.func.value, ast.Name) and node.func.value.id == "torch")


def cpu_tensor_collectives(source: str, filename: str = "<src>") -> tuple[list[str], int]:
    """Collectives whose tensor comes from a torch factory that did not take a device.

    The practical patterns of helpers/scenarios: ``x = torch.<factory>(...)`` then
    ``dist.<op>(x, ...)`` somewhere in the same top-level function (nested functions included),
    or the factory call as the argument itself.  A factory with ``device=...`` (the rank's
    ``device``, ``engine.device``...) or a ``.to(...)`` passes; ``device="cpu"`` does not (an NCCL
    group has no CPU backend: ``Backend.backend_capability["nccl"] == ["cuda"]``).

    Returns:
        ``(["file:line: dist.op(name)" ...], number of tensor collectives examined)``.
    """
    tree = ast.parse(source)
    problems, examined = [], 0
    for func in [n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))]:
        made: dict[str, list[ast.AST]] = {}
        for node in ast.walk(func):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    if isinstance(target, ast.Name):
                        made.setdefault(target.id, []).append(node.value)
        for node in ast.walk(func):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                    and isinstance(node.func.value, ast.Name) and node.func.value.id == "dist"
                    and node.func.attr in TENSOR_COLLECTIVES and node.args):
                continue
            examined += 1
            arg = node.args[0]
            sources = made.get(arg.id, []) if isinstance(arg, ast.Name) else [arg]
            for value in sources:
                if _is_factory(value) and not _device_taken(value):
                    problems.append(f"{filename}:{node.lineno}: dist.{node.func.attr}({ast.unparse(arg)})")
    return problems, examined


def test_the_guard_catches_a_cpu_flag_on_an_nccl_group():
    bad = "def main(engine):\n    flag = torch.tensor([1])\n    dist.broadcast(flag, src=0)\n"
    assert cpu_tensor_collectives(bad)[0] == ["<src>:3: dist.broadcast(flag)"]
    cpu = "def main():\n    dist.all_reduce(torch.ones(1, device='cpu'))\n"
    assert cpu_tensor_collectives(cpu)[0]
    good = ("def main(engine, device):\n    flag = torch.tensor([1], device=engine.device)\n    dist.broadcast(flag, src=0)\n"
            "    x = torch.ones(2).to(device)\n    dist.all_reduce(x)\n")
    assert cpu_tensor_collectives(good) == ([], 2)


def test_no_scenario_builds_a_collective_tensor_without_the_rank_device():
    problems, examined = [], 0
    for path in sorted(SCENARIOS.glob("*.py")):
        found, n = cpu_tensor_collectives(path.read_text(), path.name)
        problems += found
        examined += n
    assert examined >= 20  # 22 today: the guard really looks at the scenarios' collectives
    assert problems == []


if __name__ == "__main__":
    sys.exit(pytest.main([__file__, "-q"]))
