"""Pure parts of the allocation check across nodes: pair rounds, SLURM's errors, the pair matrix verdict, the drain list, parameters."""

from __future__ import annotations

import importlib.util
import itertools
import subprocess
from pathlib import Path

import pytest
from support import ROOT, SCENARIOS

from helpers import slurm
from helpers.allocation import across, grades
from helpers.allocation import params as notebook_params
from helpers.checks import Check


def _round_robin():
    spec = importlib.util.spec_from_file_location("allocation_job", SCENARIOS / "allocation_job.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod.round_robin


@pytest.mark.parametrize("n", [2, 3, 4, 5, 8, 16])
def test_round_robin_covers_every_pair_once_in_disjoint_rounds(n):
    rounds = _round_robin()(n)
    pairs = [p for r in rounds for p in r]
    assert sorted(pairs) == list(itertools.combinations(range(n), 2))
    for r in rounds:
        nodes = [x for p in r for x in p]
        assert len(nodes) == len(set(nodes))
    assert len(rounds) == (n - 1 if n % 2 == 0 else n)
    assert len(_round_robin()(n, max_rounds=1)) == 1


def test_slurm_errors_name_the_node():
    text = ("srun: error: Task launch for StepId=12.0 failed on node node2: Connection timed out\n"
            "srun: error: Application launch failed: Connection timed out\n")
    errs = across.slurm_errors(text)
    assert errs[0] == {"line": "Task launch for StepId=12.0 failed on node node2: Connection timed out", "node": "node2",
                       "kind": "unreachable"}
    refused = across.step_failure("node.step.node0", "node0", subprocess.CompletedProcess(
        [], 1, "", "srun: error: Unable to create step for job 1: More processors requested than permitted\n"), 30)
    assert refused.faulty == [] and "not a node fault" in refused.remediation
    proc = subprocess.CompletedProcess([], 1, "", text)
    check = across.step_failure("node.step.node2", "node2", proc, 30)
    assert check.status == "FAIL" and check.faulty == ["node2"] and "Connection timed out" in check.title
    assert "network or daemon fault on that node" in check.remediation


def test_pairs_name_the_slow_node_or_the_link():
    good = 0.1
    nodes = ["n0", "n1", "n2", "n3"]
    m = {a: {b: good for b in nodes if b != a} for a in nodes}
    assert grades.grade_pairs(m).status == "OK"
    slow_node = {a: {b: (0.01 if "n2" in (a, b) else good) for b in nodes if b != a} for a in nodes}
    c = grades.grade_pairs(slow_node)
    assert c.status == "WARN" and c.faulty == ["n2"] and "slow node(s) n2" in c.title
    slow_link = {a: {b: (0.01 if {a, b} == {"n0", "n1"} else good) for b in nodes if b != a} for a in nodes}
    c = grades.grade_pairs(slow_link)
    assert c.status == "WARN" and c.faulty == [] and "slow link(s): n0-n1" in c.title
    two = {"a": {"b": 0.001}, "b": {"a": 0.001}}
    assert grades.grade_pairs(two, 1.25, 0.01).status == "WARN"  # one pair: only the envelope can judge
    assert grades.grade_pairs(two, 0.05, 0.01).status == "OK"


def test_drain_list_and_login_node():
    checks = [Check("a", "x", "FAIL", faulty=["node3"]), Check("b", "y", "WARN", node="node1"), Check("c", "z", "OK", node="node0")]
    assert across.drain_list(checks) == {"fail": ["node3"], "warn": ["node1"], "nodes": ["node3", "node1"],
                                             "exclude": "--exclude=node3,node1"}
    assert across.host_check(["node0", "node1"], "login1").status == "WARN"
    assert across.host_check(["node0", "node1"], "node0.cluster").status == "OK"


@pytest.mark.parametrize("params, field", [({"MAX_BYTES": -5}, "MAX_BYTES"), ({"NPROC": 0}, "NPROC"),
                                           ({"MIN_BYTES": 1024, "MAX_BYTES": 512}, "MAX_BYTES"),
                                           ({"RUN_SMOKE": "04"}, "RUN_SMOKE"), ({"MULTI_STEPS": "jobs"}, "MULTI_STEPS"),
                                           ({"JOIN_TIMEOUT_S": 0}, "JOIN_TIMEOUT_S"), ({"MASTER_PORT": 70000}, "MASTER_PORT")])
def test_bad_parameters_name_the_field(params, field):
    with pytest.raises(ValueError, match=field):
        notebook_params.validate(params)


def test_notebook_parameters_are_known():
    defaults = notebook_params.notebook_defaults(ROOT / "notebooks" / "00_allocation_check.ipynb")
    notebook_params.validate(defaults, defaults)
    with pytest.raises(ValueError, match="FOO: not a parameter"):
        notebook_params.validate({"FOO": 1}, defaults)


def test_cli_refuses_a_bad_parameter_before_any_job(capsys):
    from helpers import cli

    assert cli.main(["diagnose", "-p", "MAX_BYTES", "-5"]) == 2
    assert "MAX_BYTES=-5: must be an integer >= 4" in capsys.readouterr().err


def test_sbatch_defaults_fit_a_cpu_cluster():
    text = slurm.sbatch_script("cpu", 2, 2, "train.py")
    active = [ln for ln in text.splitlines() if ln.startswith("#SBATCH")]
    assert not any("--gpus" in ln or "--partition" in ln or "--account" in ln for ln in active)
    assert "#SBATCH --cpus-per-task=2" in active and "#SBATCH --output=%x_%j.out" in active
    assert any(ln.startswith("##SBATCH --gpus-per-node=2") and "# EDIT" in ln for ln in text.splitlines())
    logs = slurm.sbatch_script("cpu", 2, 2, "train.py", log_dir="logs")
    assert "mkdir -p logs && sbatch" in logs and "#SBATCH --output=logs/%x_%j.out" in logs


def test_allocation_check_sbatch_template():
    path = ROOT / "configs" / "slurm" / "allocation_check.sbatch"
    text = path.read_text()
    assert subprocess.run(["bash", "-n", str(path)], capture_output=True).returncode == 0
    assert "sbatch --nodes=4 configs/slurm/allocation_check.sbatch" in text and "set -euo pipefail" in text
    assert "# EDIT" in text and "# export NCCL_DEBUG=INFO" in text
    # the same header rules as slurm.sbatch_script: one task per node, output in the submit dir, the toggles it renders
    rendered = slurm.sbatch_script("allocation-check", 2, 1, "x.py")
    for line in ("#SBATCH --ntasks-per-node=1", "#SBATCH --output=%x_%j.out", 'cd "$SLURM_SUBMIT_DIR"'):
        assert line in rendered and line in text, line
    for var, _ in slurm.NCCL_TOGGLES:
        assert f"# export {var}" in text and f"# export {var}" in rendered


def test_culprits_are_the_nodes_that_never_started():
    nodes = ["node0", "node1"]
    started = {("node0", 0), ("node0", 1)}
    assert across.culprits(nodes, 2, {"node0"}, set(), set()) == ["node1"]  # node0 waits in torchrun's rendezvous
    assert across.culprits(nodes, 2, set(nodes), started, set()) == ["node1"]
    assert across.culprits(nodes, 2, set(nodes), started | {("node1", 0), ("node1", 1)}, {("node0", 0), ("node0", 1)}) == ["node1"]
    assert across.culprits(nodes, 2, set(), set(), set()) == []


def test_preflight_reports_slurms_own_launch_error():
    from helpers import preflight

    err = ("srun: error: Task launch for StepId=5.0 failed on node node2: Connection timed out\n"
           "srun: error: Application launch failed: Connection timed out\nsrun: Job step aborted\n")

    class Refusing(slurm.SlurmClient):
        def on_node(self, node, argv, timeout_s):
            return subprocess.CompletedProcess(argv, 1, "", err)

    checks = preflight.run_preflight(["node0", "node2"], Refusing(), {})
    c = next(c for c in checks if c.id == "net.node.node2")
    assert c.status == "FAIL" and "Task launch for StepId=5.0 failed on node node2: Connection timed out" in c.title
    assert c.faulty == ["node2"] and "network or daemon fault on that node" in c.remediation


def test_preflight_reads_the_allocation_by_default(monkeypatch, capsys):
    from helpers import cli, preflight
    from helpers.allocation import local

    seen = {}
    monkeypatch.setattr(local, "allocation_nodes", lambda nodes="", environ=None: ["gpu-01", "gpu-02"])

    def fake(nodes, runner, env, **kw):
        seen["nodes"] = nodes
        return [Check("net.node.gpu-01", "fine", "OK", node="gpu-01")]

    monkeypatch.setattr(preflight, "run_preflight", fake)
    assert cli.main(["preflight"]) == 0
    assert seen["nodes"] == ["gpu-01", "gpu-02"]


def _rec(host, rank, env):
    return {"hostname": host, "contract": {"RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1",
                                           "GROUP_RANK": str(rank), "MASTER_ADDR": "node0", "MASTER_PORT": "29500"},
            "dist_world_size": 2, "env": {"SLURM_NODEID": str(rank), **env}, "backend": "gloo", "torch": "2"}


def test_env_diff_names_the_odd_node_rank0_breaks_ties():
    data = {"world_size": 2, "correctness": [], "records": [_rec("node0", 0, {}), _rec("node1", 1, {"NCCL_ALGO": "Ring"})]}
    contract, env, _ = grades.grade_job(data, ["node0", "node1"], 1)
    assert contract.status == "OK" and env.status == "FAIL" and env.faulty == ["node1"]
    data["records"] = [_rec("node0", 0, {"NCCL_IB_DISABLE": "1"}), _rec("node1", 1, {})]  # lost on the other node
    assert grades.grade_job(data, ["node0", "node1"], 1)[1].faulty == ["node1"]
    data["records"][1]["contract"]["GROUP_RANK"] = "0"
    assert grades.grade_job(data, ["node0", "node1"], 1)[0].status == "FAIL"


def _gpu_envelope(name: str, intra_gbps: float) -> list[Check]:
    """grade_envelope on a 2-node run whose intra-node all_reduce (2 ranks) settles at ``intra_gbps``."""
    sizes = [2 ** k for k in range(20, 28)]
    rows = [{"op": "all_reduce", "bytes": b, "time_s": b / (intra_gbps * 1e9), "ranks": 2} for b in sizes]
    data = {"records": [{"gpu": {"name": name}}], "inter": rows, "intra": {"node0": rows, "node1": rows}}
    reports = {"node0": {"nic_mbps": 100000}, "node1": {"nic_mbps": 100000}}
    return [c for c in grades.grade_envelope(data, reports) if c.id.startswith("envelope.intra")]


def test_inter_node_expectation_is_the_maintainers_figure_per_nic():
    """~12 / 24 / 48 GB/s all_reduce busbw per 100 / 200 / 400 Gb/s NIC (NCCL maintainers), times the node's NICs."""
    ports = [{"device": f"mlx5_{i}", "port": "1", "rate_gbps": 400.0, "link_layer": "InfiniBand"} for i in range(8)]
    assert grades.nic_expectation({"rdma_ports": ports})[0] == 8 * 48.0
    assert grades.nic_expectation({"rdma_ports": ports[:1] + [dict(ports[1], rate_gbps=200.0)]})[0] == 72.0
    assert grades.nic_expectation({"nic_mbps": 100000, "iface": "eth0"})[0] == 12.0  # no RDMA: 0.12 GB/s per Gb/s
    assert grades.nic_expectation({})[0] is None
    rows = [{"op": "all_reduce", "bytes": b, "time_s": b / 380e9, "ranks": 16} for b in [2 ** k for k in range(20, 28)]]
    data = {"records": [{"gpu": {"name": "NVIDIA H100 80GB HBM3"}}], "inter": rows, "intra": {}}
    inter = grades.grade_envelope(data, {"a": {"rdma_ports": ports}, "b": {"rdma_ports": ports}})[0]
    assert inter.id == "envelope.inter" and inter.values["expected_GBps"] == 384.0
    assert inter.values["scope"] == "inter-node" and inter.status == "OK" and "issues/267" in inter.source


def test_gpu_envelope_matches_the_exact_model_and_form_factor():
    # 20 GB/s: a healthy PCIe 4.0 pair, a broken NVLink on SXM
    assert {c.status for c in _gpu_envelope("NVIDIA A100 80GB PCIe", 20.0)} == {"OK"}
    sxm = _gpu_envelope("NVIDIA A100-SXM4-80GB", 20.0)
    assert {c.status for c in sxm} == {"FAIL"} and across.drain_list(sxm)["nodes"] == ["node0", "node1"]
    expected = 300.0 * 370 / 450  # NVLink 3 per direction x NCCL's effective share (sjeaugey, nccl-tests#212)
    assert sxm[0].values["expected_GBps"] == round(expected, 1) and "nccl-tests/issues/212" in sxm[0].source
    # graded against what a healthy node reaches: OK from 0.9 of it, WARN from 0.75, FAIL below (issue 22)
    for frac, status in ((0.95, "OK"), (0.9, "OK"), (0.8, "WARN"), (0.7, "FAIL")):
        got = _gpu_envelope("NVIDIA H100 80GB HBM3", frac * 450 * 370 / 450)
        assert {c.status for c in got} == {status}, (frac, got[0].title)
        assert got[0].values["scope"] == "intra-node" and got[0].values["ratio"] == round(frac, 3)
    assert grades.gpu_link("NVIDIA H100 NVL")[0] == "NVL" and grades.gpu_link("A100") is None
    unknown = _gpu_envelope("NVIDIA GB200", 20.0)  # not in the table: reported, not graded, never drained
    assert {c.status for c in unknown} == {"INFO"} and across.drain_list(unknown)["nodes"] == []
    assert "not in GPU_LINKS" in unknown[0].title


def test_cpu_bandwidth_on_a_contended_host_is_not_graded():
    """gloo's plateau below the OK ratio: WARN on a quiet host, INFO (not graded) when PSI says the CPUs were contended;
    a figure at or above the OK ratio stays OK either way, and GPU figures never take the contention into account."""
    low = 0.2 * 1.0  # 20 % of the expected 1 GB/s: below grades.CPU_GOOD_RATIO, above CPU_WARN_RATIO
    quiet = grades.grade_expected("collectives.bandwidth", low, 1.0, "src", "intra-node", cpu=True, contention=0.1)
    assert quiet.status == "WARN" and quiet.values["cpu_contention"] == 0.1
    busy = grades.grade_expected("collectives.bandwidth", low, 1.0, "src", "intra-node", cpu=True, contention=0.6)
    assert busy.status == "INFO" and "not graded" in busy.title and "60%" in busy.title and busy.values["not_graded"]
    assert "psi" in busy.source and busy.remediation
    assert grades.grade_expected("x", 0.05, 1.0, "s", "intra-node", cpu=True, contention=None).status == "FAIL"
    assert grades.grade_expected("x", 0.9, 1.0, "s", "intra-node", cpu=True, contention=0.9).status == "OK"
    assert grades.grade_expected("x", 0.5, 1.0, "s", "intra-node", cpu=False, contention=0.9).status == "FAIL"


def test_cpu_envelope_does_not_grade_a_contended_node():
    """Across nodes on gloo: each node's intra-node plateau is graded against its own memory copy unless the job's
    PSI reading on that node says its CPUs were contended; the inter-node figure takes the busiest node's reading."""
    sizes = [2 ** k for k in range(20, 28)]
    rows = [{"op": "all_reduce", "bytes": b, "time_s": b / 0.2e9, "ranks": 2} for b in sizes]  # 0.2 GB/s plateau
    data = {"records": [{"gpu": None}], "inter": rows, "intra": {"node0": rows, "node1": rows},
            "cpu_contention": {"node0": 0.8, "node1": 0.05}}
    reports = {n: {"nic_mbps": 10000, "memcpy_GBps": 10.0} for n in ("node0", "node1")}  # expected 1.17 GB/s intra
    by_id = {c.id: c for c in grades.grade_envelope(data, reports)}
    assert by_id["envelope.intra.node0"].status == "INFO" and by_id["envelope.intra.node0"].values["cpu_contention"] == 0.8
    assert by_id["envelope.intra.node1"].status in ("WARN", "FAIL") and not by_id["envelope.intra.node1"].values.get(
        "not_graded")
    assert by_id["envelope.inter"].values["cpu_contention"] == 0.8
    del data["cpu_contention"]  # a job from before the reading: graded as before
    assert {c.status for c in grades.grade_envelope(data, reports) if c.id.startswith("envelope.intra")} <= {"WARN", "FAIL"}


class _BlockedNodeClient:
    """A SlurmClient stand-in whose 'job' is a shell: node0's task leaves its marker, node1's is blocked (a node
    profile that sleeps) and writes its marker only while it is being killed, as bash did in a loaded CI run."""

    in_allocation = True

    def __init__(self, ranks: Path) -> None:
        self.ranks = ranks

    def popen(self, argv, log, env=None):
        script = (f"touch {self.ranks}/task-node0; trap 'touch {self.ranks}/task-node1; exit 143' TERM; "
                  "sleep 30 & wait")
        with open(log, "w") as fh:
            return subprocess.Popen(["bash", "-c", script], stdout=fh, stderr=subprocess.STDOUT, start_new_session=True)


def test_the_node_blamed_is_the_one_without_a_marker_at_the_deadline(tmp_path):
    """A marker written during the teardown does not make a blocked node look started (across.run_job_across)."""
    out = tmp_path / "job"
    run = across.run_job_across(_BlockedNodeClient(out / "ranks"), "t", ["node0", "node1"], out, join_timeout_s=1.0)
    assert (out / "ranks" / "task-node1").exists()  # written while it was killed
    assert run["stopped"].startswith("not every node joined") and run["missing"] == ["node1"], run
