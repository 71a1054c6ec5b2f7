"""helpers.launch_parse: a pasted command or sbatch script back into the LaunchSpec that rendered it.

The property (issue 16): for 1,000 random specs, spaces and quotes in the arguments and the
environment included, ``render`` -> ``shlex.split`` / ``parse`` gives the spec back
(:func:`launch_parse.canonical` of it: the defaults the command writes made explicit), and a spec
that cannot render raises ``ValueError`` naming the bad field.
"""

from __future__ import annotations

import dataclasses
import shlex

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from helpers import launch_parse, launch_traps
from helpers.launch_traps import KINDS, LaunchSpec
from helpers.launchers import RDZV_FORMS as RDZV

# Words users type: paths, flags, values with spaces, both quote kinds, shell metacharacters.
_CHARS = st.characters(codec="ascii", categories=("L", "N"), include_characters=" '\"-_=./:,@%+$*;&|<>()[]{}~!?#\\")
WORD = st.text(_CHARS, min_size=1, max_size=12)
SCRIPT = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_./ '\"-]{0,20}\.py", fullmatch=True).filter(lambda s: not s.startswith("/tmp/"))
ENV_NAME = st.from_regex(r"[A-Z_][A-Z0-9_]{0,10}", fullmatch=True).filter(lambda n: n not in ("MASTER_ADDR", "MASTER_PORT"))
ENV_VALUE = st.none() | st.text(st.characters(codec="ascii", categories=("L", "N"), include_characters=" '\"-_=./:,^"),
                                max_size=12)
HOST = st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z0-9]{1,5})?", fullmatch=True)


@st.composite
def specs(draw: st.DrawFn) -> LaunchSpec:
    """A LaunchSpec a user could type into the builder (valid field types, any combination)."""
    kind = draw(st.sampled_from(KINDS))
    nnodes = draw(st.integers(1, 16))
    return LaunchSpec(
        kind=kind, nnodes=nnodes, nproc_per_node=draw(st.integers(1, 16)), script=draw(SCRIPT),
        script_args=tuple(draw(st.lists(WORD, max_size=5))), rdzv=draw(st.sampled_from(RDZV)),
        master_addr=draw(st.none() | HOST), master_port=draw(st.none() | st.integers(1, 65535)),
        node_rank=draw(st.none() | st.integers(0, nnodes - 1)), env=draw(st.dictionaries(ENV_NAME, ENV_VALUE, max_size=4)),
        gpus_per_node=draw(st.none() | st.integers(0, 16)), accelerate_cpu=draw(st.booleans()),
        srun_ntasks_per_node=draw(st.integers(1, 4)), srun_export=draw(st.sampled_from(["ALL", "NONE", "ALL,NCCL_DEBUG"])))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much])
@given(specs())
def test_spec_render_parse_round_trip(spec: LaunchSpec) -> None:
    try:
        text = launch_traps.render(spec)
    except ValueError as exc:  # only the documented reasons, each naming its field
        assert any(f in str(exc) for f in ("master_addr", "rdzv")), exc
        return
    back = launch_parse.parse(text)
    want = launch_parse.canonical(spec)
    assert back == want, (text, {f.name: (getattr(want, f.name), getattr(back, f.name))
                                 for f in dataclasses.fields(LaunchSpec) if getattr(want, f.name) != getattr(back, f.name)})
    assert launch_traps.render(want) == text                   # canonical() loses nothing the command says
    assert launch_parse.canonical(want) == want
    if spec.kind not in ("srun+torchrun", "sbatch"):           # one shell line: shlex.split gives the argv back
        argv = shlex.split(text.splitlines()[-1])
        assert argv[argv.index(spec.script) + 1:] == list(spec.script_args)


BAD = {"kind": st.text(max_size=8).filter(lambda k: k not in KINDS), "rdzv": st.text(max_size=8).filter(lambda r: r not in RDZV),
       "nnodes": st.integers(-5, 0), "nproc_per_node": st.integers(-5, 0), "master_port": st.integers(65536, 10**6) | st.integers(-5, 0),
       "gpus_per_node": st.integers(-9, -1), "script": st.sampled_from(["", "  "]), "srun_ntasks_per_node": st.integers(-3, 0),
       "srun_export": st.sampled_from(["", "ALL NONE", "a;b"])}


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(specs(), st.sampled_from(sorted(BAD)), st.data())
def test_every_bad_field_is_named(spec: LaunchSpec, name: str, data: st.DataObject) -> None:
    bad = dataclasses.replace(spec, **{name: data.draw(BAD[name])})
    for call in (launch_traps.validate, launch_traps.find_traps, launch_traps.render, launch_parse.canonical):
        with pytest.raises(ValueError, match=name):
            call(bad)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=200))
def test_parse_never_crashes_on_random_text(text: str) -> None:
    try:
        launch_parse.parse(text)
    except ValueError:
        pass


@pytest.mark.parametrize("text, expected", [
    ("torchrun --standalone --nnodes=2 --nproc-per-node=8 train.py", {"rdzv": "standalone", "nnodes": 2}),
    ("export NCCL_SOCKET_IFNAME=docker0\ntorchrun --nnodes=2 --node-rank=0 --master-addr=n0 --master-port=29500 train.py",
     {"env": {"NCCL_SOCKET_IFNAME": "docker0"}, "master_addr": "n0"}),
    ("accelerate launch --cpu --num_processes=4 train.py", {"kind": "accelerate", "accelerate_cpu": True}),
])
def test_pasted_commands(text: str, expected: dict) -> None:
    spec = launch_parse.parse(text)
    assert {k: getattr(spec, k) for k in expected} == expected


def test_sbatch_without_gpu_request_is_a_cpu_job() -> None:
    spec = launch_traps.LaunchSpec(kind="sbatch", nnodes=2, gpus_per_node=0)
    assert launch_parse.parse(launch_traps.render(spec)).gpus_per_node == 0


def test_empty_text_is_named() -> None:
    with pytest.raises(ValueError, match="command: empty"):
        launch_parse.parse("  \n")


def test_quote_escaped_inside_a_single_quoted_payload_is_no_comment():
    """``'\\'' #'\\''`` in a ``bash -c '...'`` payload is a quoted argument " #", not a comment (found by the
    round-trip property above: the line tracker took the escaped quote for an opening one)."""
    spec = LaunchSpec(kind="srun+torchrun", nnodes=1, nproc_per_node=1, script="0.py", script_args=(" #",),
                      rdzv="standalone", srun_ntasks_per_node=1, srun_export="ALL")
    assert launch_parse.parse(launch_traps.render(spec)).script_args == (" #",)
    assert launch_parse.join_continuations('echo "a \\" # b"\n') == [(1, 'echo "a \\" # b"')]
