"""helpers.launch_traps (render + known traps) and helpers.widgets (the command builder, driven without a browser)."""

from __future__ import annotations

import socket
import subprocess

import pytest

from helpers import envvars, hostinfo, launch_traps, widgets
from helpers.launch_traps import LaunchSpec


def ids(spec: LaunchSpec, **kw) -> list[str]:
    return [t.id for t in launch_traps.find_traps(spec, **kw)]


def test_a_plain_single_node_torchrun_has_no_trap():
    spec = LaunchSpec(nproc_per_node=2)
    assert launch_traps.render(spec) == "torchrun --nnodes=1 --nproc-per-node=2 --standalone train.py\n"
    assert ids(spec, check_port=True) == []


@pytest.mark.parametrize("spec, expected", [
    (LaunchSpec(nnodes=2, master_addr="n0", rdzv="standalone"), ["standalone-multinode"]),
    (LaunchSpec(nnodes=2, rdzv="static"), ["master-addr-missing"]),
    (LaunchSpec(nnodes=2, rdzv="static", master_addr="127.0.0.1"), ["master-addr-loopback"]),
    (LaunchSpec(kind="accelerate", nproc_per_node=2, master_port=29611, accelerate_cpu=True), ["accelerate-cpu-one-process"]),
    (LaunchSpec(kind="deepspeed", nproc_per_node=2), ["default-port-shared"]),
    (LaunchSpec(kind="deepspeed", nnodes=2, master_addr="n0"), ["deepspeed-ssh"]),
    (LaunchSpec(nproc_per_node=4, gpus_per_node=2), ["nproc-exceeds-gpus"]),
    (LaunchSpec(kind="sbatch", nnodes=2, rdzv="static", script="/tmp/train.py"), ["script-in-tmp"]),
    (LaunchSpec(kind="srun+torchrun", nnodes=2, rdzv="static", srun_ntasks_per_node=2), ["srun-tasks-per-node"]),
    (LaunchSpec(nnodes=2, rdzv="c10d", master_addr="n0", env={"GLOO_SOCKET_IFNAME": "lo"}), ["ifname-loopback"]),
    (LaunchSpec(env={"GLOO_SOCKET_IFNAME": "docker0"}), ["ifname-bridge"]),
    (LaunchSpec(env={"GLOO_SOCKET_IFNAME": "^docker0"}), ["gloo-nccl-syntax"]),
    (LaunchSpec(kind="sbatch", nnodes=2, rdzv="static", env={"NCCL_SOCKET_IFNAME": "ibp65s0"}), ["ifname-node-specific"]),
    (LaunchSpec(kind="sbatch", nnodes=2, rdzv="static", env={"NCCL_SOCKET_IFNAME": "^docker0"}), ["nccl-exclude-keeps-lo"]),
    (LaunchSpec(env={"NCCL_P2P_DISABLE": "1"}), ["single-node-net-transport"]),
    (LaunchSpec(env={"NCCL_NET_DISABLE": "1"}), ["nccl-net-disable-ignored"]),
    (LaunchSpec(kind="sbatch", nnodes=2, rdzv="static", env={"NCCL_IB_DISABLE": "1"}), ["multinode-ib-disabled"]),
    (LaunchSpec(env={"NCCL_ASYNC_ERROR_HANDLING": "1"}), ["deprecated-async-error-handling"]),
    (LaunchSpec(env={"TORCH_NCCL_ASYNC_ERROR_HANDLING": "0"}), ["async-error-handling-off"]),
])
def test_each_trap_fires_alone(spec, expected):
    assert ids(spec) == expected


@pytest.mark.parametrize("spec", [
    LaunchSpec(kind="sbatch", nnodes=2, rdzv="static", env={"NCCL_SOCKET_IFNAME": "ib"}),          # a prefix every node has
    LaunchSpec(kind="sbatch", nnodes=2, rdzv="static", env={"NCCL_SOCKET_IFNAME": "^docker0,lo"}),
    LaunchSpec(env={"GLOO_SOCKET_IFNAME": "lo"}),                                     # one node: Gilbreth §4.1
    LaunchSpec(kind="sbatch", nnodes=2, rdzv="static", env={"NCCL_P2P_DISABLE": "1"}),               # multi-node: not the §6.3 trap
    LaunchSpec(kind="deepspeed", nnodes=2, master_addr="n0", node_rank=1),            # --no_ssh form
])
def test_the_fixes_are_clean(spec):
    assert ids(spec) == []


def test_fails_come_first():
    spec = LaunchSpec(nnodes=2, master_addr="n0", env={"NCCL_SOCKET_IFNAME": "ibp65s0", "GLOO_SOCKET_IFNAME": "lo"},
                      script="/tmp/x.py")
    severities = [t.status for t in launch_traps.find_traps(spec)]
    assert severities == sorted(severities, key=lambda s: s != "FAIL") and "WARN" in severities


def test_port_in_use_is_found_on_this_machine():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        trap = launch_traps.find_traps(LaunchSpec(rdzv="static", master_port=port), check_port=True)
        assert [t.id for t in trap] == ["port-in-use"] and str(port) in trap[0].title
    assert hostinfo.port_free(port)
    assert ids(LaunchSpec(rdzv="static", master_port=port), check_port=True) == []


def test_render_every_kind():
    assert "--rdzv-id=$JOB_ID --rdzv-backend=c10d --rdzv-endpoint=n0:29500" in launch_traps.render(
        LaunchSpec(nnodes=2, rdzv="c10d", master_addr="n0"))
    acc = launch_traps.render(LaunchSpec(kind="accelerate", nproc_per_node=2, accelerate_cpu=True))
    assert acc.startswith("accelerate launch --cpu") and "--multi_gpu" not in acc
    ds = launch_traps.render(LaunchSpec(kind="deepspeed", nnodes=2, master_addr="n0", node_rank=1))
    assert "--no_ssh --node_rank=1" in ds
    srun = launch_traps.render(LaunchSpec(kind="srun+torchrun", nnodes=2, rdzv="c10d", env={"NCCL_DEBUG": "INFO"}))
    assert "srun --nodes=2 --ntasks-per-node=1" in srun and "export NCCL_DEBUG=INFO" in srun
    sb = launch_traps.render(LaunchSpec(kind="sbatch", nnodes=2, rdzv="static", nproc_per_node=4))
    assert sb.startswith("#!/bin/bash") and subprocess.run(["bash", "-n"], input=sb, text=True).returncode == 0
    exported = launch_traps.render(LaunchSpec(env={"A": "x y", "B": None}))
    assert exported.startswith("export A='x y'\nunset B\n")


@pytest.mark.parametrize("spec, field", [
    (LaunchSpec(kind="mpirun"), "kind"), (LaunchSpec(rdzv="etcd"), "rdzv"), (LaunchSpec(nnodes=0), "nnodes"),
    (LaunchSpec(master_port=0), "master_port"), (LaunchSpec(gpus_per_node=-2), "gpus_per_node"),
    (LaunchSpec(script=""), "script"), (LaunchSpec(srun_ntasks_per_node=0), "srun_ntasks_per_node"),
])
def test_bad_spec_names_the_field(spec, field):
    with pytest.raises(ValueError, match=field):
        launch_traps.find_traps(spec)


def test_parse_lines_forms_and_errors():
    assert envvars.parse_lines("export A=1\nB='x y'\n# note\nunset C\n") == {"A": "1", "B": "x y", "C": None}
    with pytest.raises(ValueError, match="env line 2"):
        envvars.parse_lines("A=1\nA B\n")
    # A bare NAME used to mean "unset"; since issue 16 it is an error that says how to unset.
    with pytest.raises(ValueError, match=r"env line 2 .*unset NAME"):
        envvars.parse_lines("A=1\nD\n")


def test_widget_updates_as_the_user_types():
    b = widgets.command_builder(nproc_per_node=2)
    assert b.command.startswith("torchrun --nnodes=1 --nproc-per-node=2 --standalone") and b.traps == []
    b.set(nnodes=2)                                   # still --standalone: the D2 trap, and no master address
    assert b.trap_ids() == ["standalone-multinode", "master-addr-missing"]
    assert "standalone-multinode" in b.output.value and "FAIL" in b.output.value
    b.set(rdzv="static", master_addr="localhost")
    assert b.trap_ids() == ["master-addr-loopback"]
    b.set(master_addr="node0")
    assert b.trap_ids() == [] and "--node-rank=0 --master-addr=node0" in b.command
    b.set(env="NCCL_SOCKET_IFNAME=ibp65s0")
    assert b.trap_ids() == ["ifname-node-specific"]
    b.set(env="NCCL SOCKET")                          # bad input: shown next to the field, never raised; the
    assert "env line 1" in b.errors["env"] and "input error" in b.output.value  # command is still built (issue 16)
    assert b.command.startswith("torchrun --nnodes=2") and "NCCL" not in b.command
    b.set(env="", kind="sbatch")
    assert b.command.startswith("#!/bin/bash") and "&lt;" not in b.output.value.split("<pre>")[0]
    with pytest.raises(ValueError, match="not a control"):
        b.set(nodes=3)
    with pytest.raises(ValueError, match="not LaunchSpec fields"):
        widgets.command_builder(world_size=8)


def test_widget_shows_out_of_range_values_as_errors_never_clamps():
    b = widgets.command_builder(kind="torchrun", rdzv="static", nproc_per_node=2)
    b.set(master_port="99999")
    assert b.errors == {"master_port": "master_port=99999: must be an integer in 1..65535"} and b.command == ""
    assert b._field_errors["master_port"].layout.display == "" and "99999" in b._field_errors["master_port"].value
    b.set(master_port="", nnodes="0")
    assert list(b.errors) == ["nnodes"] and "nnodes=0" in b.errors["nnodes"]
    b.set(nnodes=2, master_addr="n0", node_rank=5)    # past the last node: named by the launcher's own check
    assert "node_rank=5" in b.errors["node_rank"]


def test_widget_shows_only_the_fields_the_launcher_uses():
    b = widgets.command_builder(nnodes=2, master_addr="typed-but-unused")
    b.set(kind="srun+torchrun")
    assert b.controls["rdzv"].options == ("static", "c10d") and b.controls["rdzv"].value == "static"
    assert b._rows["master_addr"].layout.display == "none" and b.spec().master_addr is None
    assert "typed-but-unused" not in b.command and "--ntasks-per-node=1" in b.command
    assert widgets.command_builder(kind="sbatch").controls["rdzv"].value == "static"  # the default rdzv, as rendered
    b.set(kind="accelerate")
    assert b._rows["accelerate_cpu"].layout.display == "" and b._rows["srun_ntasks_per_node"].layout.display == "none"


def test_widget_paste_to_check_and_trap_links():
    b = widgets.command_builder()
    b.paste.value = "export NCCL_SOCKET_IFNAME=docker0\ntorchrun --standalone --nnodes=2 --nproc-per-node=8 train.py"
    assert [t.id for t in b.pasted_traps] == ["standalone-multinode", "master-addr-missing", "ifname-bridge"]
    assert "01_launchers.ipynb#D2-—---standalone-on-two-nodes-makes-two-jobs" in b.paste_output.value
    b.load_button.click()
    assert b.spec().nnodes == 2 and b.trap_ids()[0] == "standalone-multinode"
    b.paste.value = "echo hello"
    assert b.pasted is None and "no launcher found" in b.paste_output.value
    assert all(widgets.trap_link(i) for i in widgets.TRAP_SECTIONS)


def test_every_trap_links_to_a_section_that_exists():
    import json
    import re
    from pathlib import Path

    ids = set(re.findall(r'trap\("([a-z0-9-]+)"', Path(launch_traps.__file__).read_text()))
    assert ids <= set(widgets.TRAP_SECTIONS), ids - set(widgets.TRAP_SECTIONS)
    for notebook, heading in widgets.TRAP_SECTIONS.values():
        cells = json.loads((Path(__file__).parents[2] / "notebooks" / notebook).read_text())["cells"]
        headings = {line.lstrip("#").strip().replace("`", "") for c in cells if c["cell_type"] == "markdown"
                    for line in "".join(c["source"]).splitlines() if line.startswith("#")}
        assert heading in headings, (notebook, heading)
