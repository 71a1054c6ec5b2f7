"""The command-builder widget: pick a launcher, type the job's shape, get the command and its traps live.

:class:`CommandBuilder` wraps ipywidgets controls around :func:`helpers.launch_traps.render` and
:func:`helpers.launch_traps.find_traps`: every change re-renders the command (``torchrun``,
``accelerate launch``, ``deepspeed``, ``srun`` + ``torchrun`` or a whole ``sbatch`` script) and the
list of known traps, FAILs first.  Bad input (an env line that is not ``KEY=VALUE``, a missing
master address) is shown as an error naming the field, never raised into the notebook.

ipywidgets is imported when a builder is made, not at import time.  The state is readable
without a browser (``.spec()``, ``.command``, ``.traps``, ``.error``), so tests and notebooks
assert on what the widget shows.
"""

from __future__ import annotations

import html
from typing import Any

from helpers import launch_traps
from helpers.launch_traps import LaunchSpec, Trap

_COLOURS = {"FAIL": "#b00020", "WARN": "#8a6d00"}


class CommandBuilder:
    """An ipywidgets form that builds a launch command and flags its traps as you type.

    Args:
        check_port: also check that the rendezvous port is free on this machine (D4); off by
            default so the widget never depends on what else runs here.
        **initial: starting values, any :class:`helpers.launch_traps.LaunchSpec` field
            (``env`` may be a dict or ``KEY=VALUE`` text).

    Attributes:
        widget: the ``ipywidgets.VBox`` to display.
        command: the rendered command or script ("" while the input is invalid).
        traps: the :class:`Trap` list for the current input.
        error: the ``ValueError`` message for invalid or incomplete input, else "" (the traps
            are still listed when only the command could not be built).

    Raises:
        ValueError: an ``initial`` key is not a LaunchSpec field.
    """

    def __init__(self, *, check_port: bool = False, **initial: Any) -> None:
        import ipywidgets as w

        unknown = set(initial) - set(LaunchSpec.__dataclass_fields__)
        if unknown:
            raise ValueError(f"{sorted(unknown)}: not LaunchSpec fields; accepted: "
                             f"{', '.join(LaunchSpec.__dataclass_fields__)}")
        start = LaunchSpec(**{k: v for k, v in initial.items() if k != "env"})
        env = initial.get("env", {})
        env_text = env if isinstance(env, str) else "\n".join(
            f"unset {k}" if v is None else f"{k}={v}" for k, v in env.items())
        self.check_port = check_port
        style = {"description_width": "180px"}
        self.controls: dict[str, Any] = {
            "kind": w.Dropdown(options=launch_traps.KINDS, value=start.kind, description="launcher", style=style),
            "nnodes": w.BoundedIntText(value=start.nnodes, min=1, max=4096, description="nodes", style=style),
            "nproc_per_node": w.BoundedIntText(value=start.nproc_per_node, min=1, max=1024,
                                               description="ranks per node", style=style),
            "gpus_per_node": w.BoundedIntText(value=-1 if start.gpus_per_node is None else start.gpus_per_node, min=-1,
                                              max=1024, description="GPUs per node (-1: unknown)", style=style),
            "rdzv": w.Dropdown(options=launch_traps.RDZV, value=start.rdzv, description="rendezvous", style=style),
            "master_addr": w.Text(value=start.master_addr or "", description="master address", style=style),
            "master_port": w.BoundedIntText(value=start.master_port or 0, min=0, max=65535,
                                            description="master port (0: default)", style=style),
            "node_rank": w.BoundedIntText(value=-1 if start.node_rank is None else start.node_rank, min=-1, max=4095,
                                          description="node rank (-1: none)", style=style),
            "script": w.Text(value=start.script, description="script", style=style),
            "script_args": w.Text(value=" ".join(start.script_args), description="script args", style=style),
            "accelerate_cpu": w.Checkbox(value=start.accelerate_cpu, description="accelerate --cpu"),
            "srun_ntasks_per_node": w.BoundedIntText(value=start.srun_ntasks_per_node, min=1, max=1024,
                                                     description="srun tasks per node", style=style),
            "env": w.Textarea(value=env_text, description="environment", placeholder="NCCL_DEBUG=INFO\nunset NCCL_SOCKET_IFNAME",
                              style=style, layout=w.Layout(width="520px", height="90px")),
        }
        self.output = w.HTML()
        self.widget = w.VBox([*self.controls.values(), self.output])
        for control in self.controls.values():
            control.observe(self._update, names="value")
        self._update()

    def spec(self) -> LaunchSpec:
        """The :class:`LaunchSpec` the controls describe now.

        Raises:
            ValueError: an ``env`` line is not ``KEY=VALUE`` / ``unset KEY`` (names the line).
        """
        c = {k: v.value for k, v in self.controls.items()}
        return LaunchSpec(kind=c["kind"], nnodes=c["nnodes"], nproc_per_node=c["nproc_per_node"],
                          script=c["script"], script_args=tuple(c["script_args"].split()), rdzv=c["rdzv"],
                          master_addr=c["master_addr"].strip() or None, master_port=c["master_port"] or None,
                          node_rank=None if c["node_rank"] < 0 else c["node_rank"],
                          env=launch_traps.parse_env(c["env"]),
                          gpus_per_node=None if c["gpus_per_node"] < 0 else c["gpus_per_node"],
                          accelerate_cpu=c["accelerate_cpu"], srun_ntasks_per_node=c["srun_ntasks_per_node"])

    def set(self, **values: Any) -> "CommandBuilder":
        """Set controls as a user would (``builder.set(nnodes=2, master_addr="localhost")``); returns self.

        Raises:
            ValueError: a key that is not a control, naming the accepted ones.
        """
        for key, value in values.items():
            if key not in self.controls:
                raise ValueError(f"{key!r}: not a control; accepted: {', '.join(self.controls)}")
            self.controls[key].value = value
        return self

    def trap_ids(self) -> list[str]:
        """The ids of the current traps, in display order."""
        return [t.id for t in self.traps]

    def _update(self, *_: object) -> None:
        self.command, self.traps, self.error = "", [], ""
        try:
            spec = self.spec()
            self.traps = launch_traps.find_traps(spec, check_port=self.check_port)
            self.command = launch_traps.render(spec)  # may still lack a field (master_addr): traps say why
        except ValueError as exc:
            self.error = str(exc)
        self.output.value = self.html()

    def html(self) -> str:
        """The output pane: the command in a ``<pre>`` block, then one line per trap (or the input error)."""
        error = (f"<p style='color:{_COLOURS['FAIL']}'><b>input error:</b> {html.escape(self.error)}</p>"
                 if self.error else "")
        command = f"<pre>{html.escape(self.command)}</pre>" if self.command else ""
        traps = "".join(_trap_html(t) for t in self.traps) or ("" if self.error else "<li>no known trap</li>")
        return f"{error}{command}<ul>{traps}</ul>"


def _trap_html(t: Trap) -> str:
    return (f"<li><b style='color:{_COLOURS[t.severity]}'>{t.severity}</b> <code>{html.escape(t.id)}</code> "
            f"({html.escape(t.field)}): {html.escape(t.message)} &rarr; <i>{html.escape(t.fix)}</i> "
            f"<small>[{html.escape(t.source)}]</small></li>")


def command_builder(**initial: Any) -> CommandBuilder:
    """A :class:`CommandBuilder` with ``initial`` values; display ``.widget`` in a notebook.

    Raises:
        ValueError: as :class:`CommandBuilder`.
    """
    return CommandBuilder(**initial)
