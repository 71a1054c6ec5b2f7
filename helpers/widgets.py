"""The command-builder widget: pick a launcher, type the job's shape, get the command and its traps live.

:class:`CommandBuilder` wraps ipywidgets controls around :func:`helpers.launch_traps.render` and
:func:`helpers.launch_traps.find_traps`: every keystroke in any field re-renders the command
(``torchrun``, ``accelerate launch``, ``deepspeed``, ``srun`` + ``torchrun`` or a whole ``sbatch``
script) and the list of known traps, FAILs first, each linked to the chapter section that
reproduces it (:data:`TRAP_SECTIONS`).  The form is grouped (job shape, rendezvous, script,
environment, SLURM) and shows only the fields the chosen launcher uses (:func:`visible_fields`);
the traps and the command sit beside it, traps first (a 45-line ``sbatch`` script scrolls in its own
box instead of pushing them below a 1280x800 screen), with a copy button; the command wraps only
between shell words (each word is one unbreakable span: ``--cpus-per-task`` never splits at a hyphen).
Each trap's sources are links, and its chapter link opens the section in the same JupyterLab
(``make lab`` exposes ``window.jupyterapp``; elsewhere it is a plain link).  A value out of range is shown as an
error under its field, never clamped; a bad environment line is named and skipped, the rest of the
command is still built.  The "paste to check" box reads an existing command or sbatch script
(:func:`helpers.launch_parse.parse`) and lists its traps; "edit in the form" loads it.

ipywidgets is imported when a builder is made, not at import time.  The state is readable
without a browser (``.spec()``, ``.command``, ``.traps``, ``.errors``), so tests and notebooks
assert on what the widget shows; ``tests/browser/test_command_builder.py`` drives it in Chromium.
"""

from __future__ import annotations

import html
import re
import shlex
from collections.abc import Mapping
from typing import Any

from helpers import envvars, launch_traps, launchers
from helpers.checks import Check
from helpers.launch_traps import LaunchSpec
from helpers.validate import positive_int, tcp_port

_COLOURS = {"FAIL": "#b00020", "WARN": "#8a6d00"}
SLURM_KINDS = ("srun+torchrun", "sbatch")
"""The launchers that start torchrun through SLURM (master address and node rank come from SLURM)."""

TRAP_SECTIONS: dict[str, tuple[str, str]] = {
    "standalone-multinode": ("01_launchers.ipynb", "D2 — --standalone on two nodes makes two jobs"),
    "master-addr-missing": ("01_launchers.ipynb", "D1 — No launcher, no contract"),
    "master-addr-loopback": ("06_multinode_network.ipynb", "MN1 — A node that never joins"),
    "node-rank-fixed": ("06_multinode_network.ipynb", "MN1 — A node that never joins"),
    "srun-export-none": ("06_multinode_network.ipynb", "MN1 — A node that never joins"),
    "master-addr-not-exported": ("08_slurm.ipynb", "5. Failure mode 4: variables that do not reach the ranks"),
    "nnodes-mismatch": ("08_slurm.ipynb", "7. Four launch-line mistakes that only show on two nodes"),
    "default-port-shared": ("01_launchers.ipynb", "D4 — Two jobs, one port"),
    "port-in-use": ("01_launchers.ipynb", "D4 — Two jobs, one port"),
    "nproc-exceeds-gpus": ("01_launchers.ipynb", "D3 — set_device(RANK): node 1's ranks point past the last GPU"),
    "accelerate-cpu-one-process": ("01_launchers.ipynb", "D5 — accelerate launch starts one process"),
    "deepspeed-ssh": ("01_launchers.ipynb", "D6 — The deepspeed launcher and its hostfile"),
    "script-in-tmp": ("01_launchers.ipynb", "The command builder"),
    "args-in-tmp": ("01_launchers.ipynb", "The command builder"),
    "srun-tasks-per-node": ("01_launchers.ipynb", "The command builder"),
    "gloo-nccl-syntax": ("06_multinode_network.ipynb", "MN2 — The wrong NIC"),
    "ifname-loopback": ("06_multinode_network.ipynb", "MN2 — The wrong NIC"),
    "ifname-bridge": ("06_multinode_network.ipynb", "MN2 — The wrong NIC"),
    "ifname-node-specific": ("06_multinode_network.ipynb", "MN2 — The wrong NIC"),
    "nccl-exclude-keeps-lo": ("06_multinode_network.ipynb", "MN2 — The wrong NIC"),
    "single-node-net-transport": ("06_multinode_network.ipynb", "The Gilbreth single-node hang: Init COMPLETE, then a timeout"),
    "nccl-net-disable-ignored": ("06_multinode_network.ipynb", "The Gilbreth single-node hang: Init COMPLETE, then a timeout"),
    "multinode-ib-disabled": ("06_multinode_network.ipynb", "The Gilbreth single-node hang: Init COMPLETE, then a timeout"),
    "deprecated-async-error-handling": ("06_multinode_network.ipynb", "MN3 — A dead or stalled peer, and the timeout that masks it"),
    "async-error-handling-off": ("06_multinode_network.ipynb", "MN3 — A dead or stalled peer, and the timeout that masks it"),
}
"""Trap id -> (notebook in ``notebooks/``, heading of the section that reproduces it, as rendered)."""


def trap_link(trap_id: str) -> str | None:
    """The relative link (``01_launchers.ipynb#D4-—-Two-jobs,-one-port``) to the section of :data:`TRAP_SECTIONS`.

    JupyterLab gives each rendered Markdown heading the id "its text, spaces as ``-``".  None for an
    id the table does not list.
    """
    where = TRAP_SECTIONS.get(trap_id)
    return None if where is None else f"{where[0]}#{where[1].replace(' ', '-')}"


def visible_fields(kind: str, rdzv: str, nnodes: int) -> tuple[str, ...]:
    """The :class:`LaunchSpec` fields the ``kind`` launcher uses for this rendezvous form and node count.

    The form shows only these; :meth:`CommandBuilder.spec` resets the others to their defaults, so a
    hidden value never changes the command (the master address under ``srun``: ``scontrol`` gives it).

    Raises:
        ValueError: ``kind`` not in :data:`helpers.launch_traps.KINDS`.
    """
    if kind not in launch_traps.KINDS:
        raise ValueError(f"kind={kind!r}: accepted values are {', '.join(launch_traps.KINDS)}")
    slurm = kind in SLURM_KINDS
    multi = nnodes > 1
    shown = ["kind", "nnodes", "nproc_per_node", "gpus_per_node"]
    if kind == "torchrun" or slurm:
        shown.append("rdzv")
    if not slurm and (multi or (kind == "torchrun" and rdzv != "standalone")):
        shown.append("master_addr")
    if not (kind == "torchrun" and rdzv == "standalone"):
        shown.append("master_port")
    if multi and (kind in ("accelerate", "deepspeed") or (kind == "torchrun" and rdzv == "static")):
        shown.append("node_rank")
    shown += ["script", "script_args"]
    if kind == "accelerate":
        shown.append("accelerate_cpu")
    shown.append("env")
    if slurm:
        shown += ["srun_ntasks_per_node", "srun_export"]
    return tuple(shown)


_GROUPS = (
    ("job shape", ("kind", "nnodes", "nproc_per_node", "gpus_per_node")),
    ("rendezvous", ("rdzv", "master_addr", "master_port", "node_rank")),
    ("script", ("script", "script_args", "accelerate_cpu")),
    ("environment", ("env",)),
    ("SLURM", ("srun_ntasks_per_node", "srun_export")),
)
_LABELS = {"kind": "launcher", "nnodes": "nodes", "nproc_per_node": "ranks per node", "gpus_per_node": "GPUs per node",
           "rdzv": "rendezvous", "master_addr": "master address", "master_port": "master port", "node_rank": "node rank",
           "script": "script", "script_args": "script args", "accelerate_cpu": "accelerate --cpu", "env": "environment",
           "srun_ntasks_per_node": "srun tasks/node", "srun_export": "srun --export"}
_PLACEHOLDERS = {"gpus_per_node": "unknown", "master_addr": "node 0's hostname or IP", "master_port": "29500 (default)",
                 "node_rank": "0 (this node)", "script": "train.py", "script_args": "--config 'my run.yaml'",
                 "env": "NCCL_DEBUG=INFO\nunset NCCL_SOCKET_IFNAME"}
_OPTIONAL_INTS = {"gpus_per_node": -1, "master_port": 0, "node_rank": -1}  # old sentinels for "unset", still accepted by set()
_INTS = ("nnodes", "nproc_per_node", "srun_ntasks_per_node", *_OPTIONAL_INTS)
_FIELD_AT_START = re.compile(r"^(?:env line \d+|([a-z_]+))")
_SLURM_NOTE = ("<small>SLURM gives the master address (<code>scontrol show hostnames | head -n 1</code>) and each node's "
               "rank (<code>$SLURM_NODEID</code>): no field for them.</small>")
_CSS = """<style>
.rb-builder .rb-group {border: 1px solid #ccc; border-radius: 4px; padding: 2px 6px 4px 6px; margin: 0 0 4px 0}
.rb-builder .rb-group-title {font-weight: bold; font-size: 12px; margin: 0}
.rb-builder .rb-field-error {color: #b00020; font-size: 12px; margin: -2px 0 2px 126px; line-height: 1.2}
.rb-out pre {white-space: pre-wrap; word-break: normal; overflow-wrap: normal; background: #f5f5f5; padding: 6px;
  margin: 2px 0; font-size: 12px; max-height: 330px; overflow: auto}
.rb-out pre .rb-w {white-space: pre}
.rb-out ul {margin: 2px 0; padding-left: 18px} .rb-out li {margin-bottom: 4px; font-size: 12px; line-height: 1.35}
.rb-out a {color: #1565c0; text-decoration: underline}
.rb-out .rb-copy {font-size: 12px; margin-left: 8px}
</style>"""


class CommandBuilder:
    """An ipywidgets form that builds a launch command and flags its traps as you type.

    Args:
        check_port: also check that the rendezvous port is free on this machine (D4); off by
            default so the widget never depends on what else runs here.
        **initial: starting values, any :class:`helpers.launch_traps.LaunchSpec` field
            (``env`` may be a dict or ``KEY=VALUE`` text, ``script_args`` a sequence or shell text).

    Attributes:
        widget: the ``ipywidgets.Box`` to display (form on the left, command, traps and the paste
            box on the right).
        controls: field name -> its ipywidgets control (what :meth:`set` types into).
        command: the rendered command or script ("" while a field is invalid).
        traps: the :class:`~helpers.checks.Check` list for the current input.
        errors: field name (``env`` for an environment line) -> the ``ValueError`` message shown under it.
        error: every message of ``errors`` in one string ("" when the input is valid).
        pasted: the :class:`LaunchSpec` read from the paste box (None when empty or unreadable).
        pasted_traps: its traps.

    Raises:
        ValueError: an ``initial`` key is not a LaunchSpec field.
    """

    def __init__(self, *, check_port: bool = False, **initial: Any) -> None:
        import ipywidgets as w

        unknown = set(initial) - set(LaunchSpec.__dataclass_fields__)
        if unknown:
            raise ValueError(f"{sorted(unknown)}: not LaunchSpec fields; accepted: "
                             f"{', '.join(LaunchSpec.__dataclass_fields__)}")
        self.check_port = check_port
        self.command, self.traps, self.errors, self.error = "", [], {}, ""
        self.pasted: LaunchSpec | None = None
        self.pasted_traps: list[Check] = []
        self._hold = False
        style = {"description_width": "120px"}
        wide = w.Layout(width="430px")
        self.controls: dict[str, Any] = {}
        for name in LaunchSpec.__dataclass_fields__:
            label = _LABELS[name]
            if name == "kind":
                c = w.Dropdown(options=launch_traps.KINDS, description=label, style=style, layout=wide)
            elif name == "rdzv":
                c = w.Dropdown(options=launchers.RDZV_FORMS, description=label, style=style, layout=wide)
            elif name == "accelerate_cpu":
                c = w.Checkbox(description=label, indent=True, style=style)
            elif name == "env":
                c = w.Textarea(description=label, placeholder=_PLACEHOLDERS["env"], continuous_update=True, style=style,
                               layout=w.Layout(width="430px", height="64px"))
            else:
                c = w.Text(description=label, placeholder=_PLACEHOLDERS.get(name, ""), continuous_update=True,
                           style=style, layout=wide)
            c.add_class(f"rb-field-{name}")
            self.controls[name] = c
        self._field_errors = {name: w.HTML(layout=w.Layout(display="none")) for name in self.controls}
        for name, label in self._field_errors.items():
            label.add_class("rb-field-error")
            label.add_class(f"rb-error-{name}")
        self._rows = {name: w.VBox([self.controls[name], self._field_errors[name]],
                                   layout=w.Layout(margin="0", overflow="visible")) for name in self.controls}
        self._group_boxes: dict[str, Any] = {}
        for title, names in _GROUPS:
            head = w.HTML(f"<div class='rb-group-title'>{title}</div>")
            extra = [w.HTML(_SLURM_NOTE)] if title == "SLURM" else []
            box = w.VBox([head, *(self._rows[n] for n in names), *extra])
            box.add_class("rb-group")
            self._group_boxes[title] = box
        form = w.VBox([w.HTML(_CSS), *self._group_boxes.values()], layout=w.Layout(width="455px", flex="0 0 455px"))
        self.output = w.HTML()
        self.output.add_class("rb-output")
        self.paste = w.Textarea(placeholder="paste to check: a torchrun / accelerate launch / deepspeed / srun command, "
                                "or a whole sbatch script", continuous_update=True,
                                layout=w.Layout(width="98%", height="70px"))
        self.paste.add_class("rb-paste")
        self.paste_output = w.HTML()
        self.paste_output.add_class("rb-paste-result")
        self.load_button = w.Button(description="edit in the form", disabled=True, icon="arrow-left",
                                    tooltip="load the pasted command into the form", layout=w.Layout(width="160px"))
        self.load_button.add_class("rb-load")
        right = w.VBox([self.output, w.HTML("<b>Paste to check</b>"), self.paste, self.load_button, self.paste_output],
                       layout=w.Layout(flex="1 1 auto", min_width="0", margin="0 0 0 12px"))
        self.widget = w.HBox([form, right], layout=w.Layout(width="100%", align_items="flex-start"))
        self.widget.add_class("rb-builder")
        self.load(LaunchSpec(**{k: v for k, v in initial.items() if k not in ("env", "script_args")}), _raw=initial)
        for control in self.controls.values():
            control.observe(self._update, names="value")
        self.paste.observe(self._check_paste, names="value")
        self.load_button.on_click(lambda _: self.pasted and self.load(self.pasted))
        self._update()

    # ------------------------------------------------------------------ state in, state out

    def load(self, spec: LaunchSpec, _raw: Mapping[str, Any] | None = None) -> CommandBuilder:
        """Show ``spec`` in the form (every field); returns self.

        A SLURM form with ``rdzv="standalone"`` (the :class:`LaunchSpec` default) shows ``static``: what
        :func:`helpers.launch_traps.render` writes for it.
        """
        values: dict[str, Any] = {name: getattr(spec, name) for name in LaunchSpec.__dataclass_fields__}
        values.update(_raw or {})
        if values["kind"] in SLURM_KINDS and values["rdzv"] == "standalone":
            values["rdzv"] = "static"
        return self.set(**values)

    def set(self, **values: Any) -> CommandBuilder:
        """Set controls as a user would (``builder.set(nnodes=2, master_addr="localhost")``); returns self.

        Numbers may be given as ints or text; ``None`` (or the old sentinels -1 / 0 of the optional
        number fields) empties a field; ``env`` takes a dict or lines, ``script_args`` a sequence or
        shell text.  The command is rebuilt once, after all values are set.

        Raises:
            ValueError: a key that is not a control, naming the accepted ones; a ``kind`` or ``rdzv``
                value the dropdown does not offer, naming the accepted values.
        """
        for key in values:
            if key not in self.controls:
                raise ValueError(f"{key!r}: not a control; accepted: {', '.join(self.controls)}")
        self._hold = True
        try:
            for key in sorted(values, key=lambda k: k != "kind"):  # kind first: it decides the rdzv options
                value = values[key]
                if key == "kind":
                    if value not in launch_traps.KINDS:
                        raise ValueError(f"kind={value!r}: accepted values are {', '.join(launch_traps.KINDS)}")
                    self.controls["kind"].value = value
                    self._sync_rdzv_options()
                elif key == "rdzv":
                    options = self.controls["rdzv"].options
                    if value not in options:
                        raise ValueError(f"rdzv={value!r}: accepted values for {self.controls['kind'].value} are "
                                         f"{', '.join(options)}")
                    self.controls["rdzv"].value = value
                else:
                    self.controls[key].value = _as_text(key, value)
        finally:
            self._hold = False
        self._update()
        return self

    def _read(self) -> tuple[dict[str, Any], dict[str, str]]:
        """The fields as typed, converted; and field -> error message for those that are not valid."""
        c = {k: v.value for k, v in self.controls.items()}
        fields: dict[str, Any] = {"kind": c["kind"], "rdzv": c["rdzv"], "accelerate_cpu": c["accelerate_cpu"],
                                  "master_addr": c["master_addr"].strip() or None, "script": c["script"].strip(),
                                  "srun_export": c["srun_export"].strip()}
        errors: dict[str, str] = {}
        for name in _INTS:
            text = c[name].strip()
            if not text and name in _OPTIONAL_INTS:
                fields[name] = None
                continue
            try:
                value = int(text)
            except ValueError:
                value = text
            try:
                if name == "master_port":
                    fields[name] = tcp_port(value, name)
                else:
                    fields[name] = positive_int(value, name, 0 if name in ("gpus_per_node", "node_rank") else 1)
            except ValueError as exc:
                errors[name] = str(exc)
        try:
            fields["script_args"] = tuple(shlex.split(c["script_args"]))
        except ValueError as exc:
            errors["script_args"] = f"script_args={c['script_args']!r}: {exc} (quote as in a shell: 'a b' or \"a b\")"
        env: dict[str, str | None] = {}
        bad = []
        for number, raw in enumerate(c["env"].splitlines(), 1):
            try:
                parsed = envvars.parse_line(raw, number)
            except ValueError as exc:
                bad.append(f"{exc} (skipped)")
                continue
            if parsed is not None:
                env[parsed[0]] = parsed[1]
        fields["env"] = env
        if bad:
            errors["env"] = "; ".join(bad)
        if not fields["script"]:
            errors["script"] = "script: the training script's path is required"
        return fields, errors

    def spec(self) -> LaunchSpec:
        """The :class:`LaunchSpec` the visible controls describe now (hidden fields at their defaults).

        Environment lines that do not parse are left out (see :attr:`errors`).

        Raises:
            ValueError: the first field whose value is not valid, named (``master_port=99999: must be ...``).
        """
        fields, errors = self._read()
        shown = visible_fields(fields["kind"], fields["rdzv"], fields.get("nnodes", 1))
        blocking = [v for k, v in errors.items() if k != "env" and k in shown]
        if blocking:
            raise ValueError(blocking[0])
        defaults = LaunchSpec()
        return LaunchSpec(**{k: (v if k in shown else getattr(defaults, k)) for k, v in fields.items()})

    def trap_ids(self) -> list[str]:
        """The ids of the current traps, in display order."""
        return [t.id for t in self.traps]

    # ------------------------------------------------------------------ updates

    def _sync_rdzv_options(self) -> None:
        rdzv = self.controls["rdzv"]
        options = ("static", "c10d") if self.controls["kind"].value in SLURM_KINDS else launchers.RDZV_FORMS
        if tuple(rdzv.options) != options:
            current = rdzv.value
            rdzv.options = options  # may reset the value: take it back, or the first option
            rdzv.value = current if current in options else options[0]

    def _update(self, change: Any = None) -> None:
        if self._hold:
            return
        if change is not None and change["owner"] is self.controls["kind"]:
            self._hold = True
            try:
                self._sync_rdzv_options()
            finally:
                self._hold = False
        self.command, self.traps = "", []
        fields, errors = self._read()
        shown = visible_fields(fields["kind"], fields["rdzv"], fields.get("nnodes", 1))
        for name, row in self._rows.items():
            row.layout.display = "" if name in shown else "none"
        self._group_boxes["SLURM"].layout.display = "" if fields["kind"] in SLURM_KINDS else "none"
        self._group_boxes["rendezvous"].layout.display = "" if set(shown) & {"rdzv", "master_addr", "master_port",
                                                                            "node_rank"} else "none"
        errors = {k: v for k, v in errors.items() if k in shown}
        if not set(errors) - {"env"}:
            try:
                spec = self.spec()
                self.traps = launch_traps.find_traps(spec, check_port=self.check_port)
                self.command = launch_traps.render(spec)  # may still lack a field (master_addr): traps say why
            except ValueError as exc:
                m = _FIELD_AT_START.match(str(exc))
                field = m.group(1) if m and m.group(1) in self.controls else "kind"
                errors[field] = str(exc)
        self.errors = errors
        self.error = "; ".join(errors.values())
        for name, label in self._field_errors.items():
            message = errors.get(name, "")
            label.value = html.escape(message)
            label.layout.display = "" if message else "none"
        self.output.value = self.html()

    def html(self) -> str:
        """The output pane: the input errors, the command in a ``<pre>`` block with a copy button, one line per trap."""
        error = "".join(f"<p style='color:{_COLOURS['FAIL']};margin:2px 0'><b>input error:</b> {html.escape(m)}</p>"
                        for m in self.errors.values())
        copy = ("<button class='rb-copy' title='copy the command' onclick=\"const t=this.closest('.rb-out')"
                ".querySelector('pre').textContent; (navigator.clipboard ? navigator.clipboard.writeText(t) : "
                "Promise.reject()).then(() => {this.textContent='copied'}, () => {const r=document.createRange(); "
                "r.selectNodeContents(this.closest('.rb-out').querySelector('pre')); const s=getSelection(); "
                "s.removeAllRanges(); s.addRange(r); this.textContent='selected: Ctrl+C'})\">copy</button>")
        command = (f"<div><b>command</b>{copy}</div><pre>{command_html(self.command)}</pre>" if self.command
                   else "<div><b>command</b>: fix the field marked in red</div>")
        traps = "".join(trap_html(t) for t in self.traps) or ("" if self.error else "<li>no known trap</li>")
        return f"<div class='rb-out'>{error}<b>traps</b><ul class='rb-traps'>{traps}</ul>{command}</div>"

    def _check_paste(self, *_: object) -> None:
        from helpers import launch_parse, script_traps

        text = self.paste.value
        self.pasted, self.pasted_traps = None, []
        if not text.strip():
            self.paste_output.value, self.load_button.disabled = "", True
            return
        try:
            self.pasted, self.pasted_traps = script_traps.check_text(text)
        except ValueError as exc:
            self.pasted = None
            self.paste_output.value = (f"<div class='rb-out'><p style='color:{_COLOURS['FAIL']}'><b>cannot read it:</b> "
                                       f"{html.escape(str(exc))}</p></div>")
            self.load_button.disabled = True
            return
        summary = (launch_parse.describe(self.pasted) if self.pasted is not None else
                   "no launch line this parser reads (srun, torchrun, accelerate launch, deepspeed); the script's "
                   "text traps:")
        traps = "".join(trap_html(t) for t in self.pasted_traps) or "<li>no known trap</li>"
        self.paste_output.value = (f"<div class='rb-out'><div class='rb-pasted'><b>read as:</b> {html.escape(summary)}</div>"
                                   f"<ul class='rb-traps'>{traps}</ul></div>")
        self.load_button.disabled = self.pasted is None  # nothing to load into the builder


def _as_text(key: str, value: Any) -> Any:
    """A value for ``set``/``load`` as the control holds it (text for the text fields)."""
    if key == "accelerate_cpu":
        return bool(value)
    if key == "env":
        if isinstance(value, str):
            return value
        return "\n".join(line.removeprefix("export ") for line in envvars.shell_lines(value or {}))
    if key == "script_args":
        return value if isinstance(value, str) else shlex.join(str(a) for a in value)
    if key in _OPTIONAL_INTS and (value is None or value == _OPTIONAL_INTS[key]):
        return ""
    return "" if value is None else str(value)


def command_html(command: str) -> str:
    """The command as HTML for a ``pre-wrap`` box: each shell word in an unbreakable ``<span class='rb-w'>``.

    Lines then wrap only at the spaces between words, never inside ``--cpus-per-task`` at a hyphen
    (where browsers otherwise may break); the text content is exactly ``command`` (what the copy
    button copies).
    """
    return "".join(f"<span class='rb-w'>{html.escape(part)}</span>" if part and not part.isspace() else part
                   for part in re.split(r"(\s+)", command))


_URL = re.compile(r"https?://[^\s,;()<>'\"]+")
# The chapter link: in make lab's JupyterLab (window.jupyterapp) the notebook next to this one opens in the same
# window (docmanager:open) and scrolls to the heading with the notebook's own setFragment("#heading=ID"), what a
# Markdown link "other.ipynb#heading" does.  A notebook that was not open yet lays out its cells (windowed) after it
# is revealed and may scroll back to its top, so the call is repeated every 0.5 s until the heading sits at the top
# of the panel (10 s at most).  Elsewhere (no window.jupyterapp) the href opens the chapter in a new tab.
_OPEN_IN_LAB = ("const app=window.jupyterapp; if(!app) return true; const w0=app.shell.currentWidget; "
                "const cur=(w0&&w0.context)?w0.context.path:''; const dir=cur.includes('/')?cur.slice(0,cur.lastIndexOf('/')+1):''; "
                "const id=this.dataset.heading; app.commands.execute('docmanager:open',{path:dir+this.dataset.path})"
                ".then(w=>{if(!w||!w.setFragment) return; let n=0; const sel='[data-jupyter-id=\\''+CSS.escape(id)+'\\'],"
                "[id=\\''+CSS.escape(id)+'\\']'; const tick=()=>Promise.resolve(w.setFragment('#heading='+id)).then(()=>{"
                "const h=w.node.querySelector(sel); const top=w.content.node.getBoundingClientRect().top; "
                "const y=h?h.getBoundingClientRect().top-top:-1; if((y<0||y>200)&&++n<20) setTimeout(tick,500);}); "
                "w.context.ready.then(tick);}); return false;")


def sources_html(source: str) -> str:
    """A trap's ``source`` text (``Gilbreth 8.12 (https://..., https://...); MN2 (https://...)``) with each URL a link.

    The link text is the URL's host (``docs.nvidia.com``); the ids stay text (``docs/sources.md`` explains them).
    """
    out, last = [], 0
    for m in _URL.finditer(source):
        url = m.group(0)
        host = url.split("/")[2]
        out += [html.escape(source[last:m.start()]),
                f"<a href='{html.escape(url)}' target='_blank' rel='noopener' title='{html.escape(url)}'>{html.escape(host)}</a>"]
        last = m.end()
    out.append(html.escape(source[last:]))
    return "".join(out)


def trap_html(t: Check) -> str:
    """One ``<li>`` for a trap: severity, id, field, message, fix, its sources as links and the chapter link."""
    link = trap_link(t.id)
    where = ""
    if link:
        notebook, heading = TRAP_SECTIONS[t.id]
        where = (f" <a class='rb-chapter' href='{html.escape(link)}' target='_blank' data-path='{html.escape(notebook)}' "
                 f"data-heading='{html.escape(link.split('#', 1)[1])}' onclick=\"{_OPEN_IN_LAB}\" "
                 f"title='the section that reproduces it'>chapter {notebook[:2]}: {html.escape(heading.split(' — ')[0])}</a>")
    return (f"<li class='rb-trap' data-trap='{html.escape(t.id)}'><b style='color:{_COLOURS[t.status]}'>{t.status}</b> "
            f"<code>{html.escape(t.id)}</code> ({html.escape(t.field)}): {html.escape(t.title)} &rarr; "
            f"<i>{html.escape(t.remediation)}</i> <small class='rb-sources'>[{sources_html(t.source)}]</small>{where}</li>")


def command_builder(**initial: Any) -> CommandBuilder:
    """A :class:`CommandBuilder` with ``initial`` values; display ``.widget`` in a notebook.

    Raises:
        ValueError: as :class:`CommandBuilder`.
    """
    return CommandBuilder(**initial)
