"""``make lab``: JupyterLab on this machine's loopback, as root or as a user, with its files under ``build/``.

:func:`lab_argv` is the one command line (``make lab`` runs ``python -m helpers.labserver``, the
browser test starts the same), :func:`lab_env` the environment: JupyterLab's runtime files
(connection files, the server's ``jpserver-*.json``) and its workspaces live in ``build/jupyter/``,
not in ``~/.local/share``.  JupyterLab refuses to start as root (``Running as root is not
recommended. Use --allow-root to bypass.``), so ``--allow-root`` is passed exactly when the
effective user is root.  The server listens on 127.0.0.1 only: from a laptop, forward the port
over ssh (``ssh -N -L 8888:127.0.0.1:8888 user@host``) and open the URL it prints, token included.

Opening a chapter must not change it (issue 28): :data:`SETTING_OVERRIDES` turns autosave off (a
chapter is written only when you save it; ``git diff`` then shows no outputs anyway, through the
nbstripout filter of :mod:`helpers.nbclean`) and JupyterLab's news pop-up off (it covered the
builder's corner).  They are JupyterLab's documented default overrides (an ``overrides.json`` in
the application settings folder, https://jupyterlab.readthedocs.io/en/stable/user/directories.html),
written to ``build/jupyter/app-settings/``: your own settings still win.  The app is exposed as
``window.jupyterapp`` so that the command builder's chapter links open the section in this
JupyterLab (:func:`helpers.widgets.trap_html`) instead of a second one.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from helpers.validate import tcp_port

ROOT = Path(__file__).resolve().parent.parent
LAB_DIR = ROOT / "build" / "jupyter"
"""Where the runtime files and the workspaces of ``make lab`` go."""
DEFAULT_PORT = 8888
SETTING_OVERRIDES = {
    "@jupyterlab/docmanager-extension:plugin": {"autosave": False},
    "@jupyterlab/apputils-extension:notification": {"fetchNews": "false", "checkForUpdates": False},
}
"""JupyterLab settings ``make lab`` changes from JupyterLab's defaults (plugin id -> values)."""


def lab_argv(notebook_dir: str | os.PathLike[str] = ROOT / "notebooks", *, port: int = DEFAULT_PORT,
             lab_dir: str | os.PathLike[str] = LAB_DIR, extra: Sequence[str] = (), root: bool | None = None) -> list[str]:
    """The JupyterLab command line: loopback only, no browser, ``--allow-root`` only for root.

    Args:
        notebook_dir: the folder the file browser opens (``notebooks/``).
        port: the TCP port 1..65535 (JupyterLab tries the next ones when it is taken).
        lab_dir: folder for the workspaces (``<lab_dir>/workspaces``).
        extra: more options, appended (``--ServerApp.token=...``).
        root: whether to pass ``--allow-root``; default: the effective user is root.

    Raises:
        ValueError: ``port`` outside 1..65535.
    """
    tcp_port(port, "port")
    root = os.geteuid() == 0 if root is None else root
    return [sys.executable, "-m", "jupyterlab", "--no-browser", "--ip=127.0.0.1", f"--port={port}",
            f"--ServerApp.root_dir={Path(notebook_dir).resolve()}",
            f"--LabApp.workspaces_dir={Path(lab_dir).resolve() / 'workspaces'}",
            f"--LabApp.app_settings_dir={Path(lab_dir).resolve() / 'app-settings'}",
            "--LabApp.expose_app_in_browser=True",
            *(["--allow-root"] if root else []), *extra]


def write_overrides(lab_dir: str | os.PathLike[str] = LAB_DIR) -> Path:
    """Write :data:`SETTING_OVERRIDES` to ``<lab_dir>/app-settings/overrides.json`` (atomically); return its path."""
    from helpers.report import write_atomic

    return write_atomic(Path(lab_dir) / "app-settings" / "overrides.json", json.dumps(SETTING_OVERRIDES, indent=2) + "\n")


def lab_env(base: Mapping[str, str] | None = None, *, lab_dir: str | os.PathLike[str] = LAB_DIR,
            isolated: bool = False) -> dict[str, str]:
    """The server's environment: ``base`` (default ``os.environ``) with ``JUPYTER_RUNTIME_DIR`` in ``lab_dir``.

    ``PYTHONPATH`` gets the project root first, so the kernels import this checkout's ``helpers``.
    With ``isolated`` (the tests), ``JUPYTER_CONFIG_DIR`` and ``JUPYTER_DATA_DIR`` move into
    ``lab_dir`` too: no user configuration applies and nothing is written to ``~``; the kernel spec
    is still found in the interpreter's ``share/jupyter``.
    """
    env = dict(os.environ if base is None else base)
    lab = Path(lab_dir).resolve()
    names = ("runtime", "config", "data") if isolated else ("runtime",)
    for name in names:
        (lab / name).mkdir(parents=True, exist_ok=True)
        env[f"JUPYTER_{name.upper()}_DIR"] = str(lab / name)
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), *[p for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]])
    return env


def main(argv: Sequence[str] | None = None) -> int:
    """``python -m helpers.labserver [--port P] [--notebook-dir D] [-- extra JupyterLab options]``: exec JupyterLab.

    Prints how to reach it from a laptop, then replaces this process with JupyterLab (which prints
    the URL with its token).  Returns only when the exec fails (2).
    """
    p = argparse.ArgumentParser(prog="python -m helpers.labserver", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--port", type=int, default=int(os.environ.get("LAB_PORT", DEFAULT_PORT)))
    p.add_argument("--notebook-dir", default=str(ROOT / "notebooks"))
    p.add_argument("--lab-dir", default=str(LAB_DIR))
    p.add_argument("--isolated", action="store_true", help="config and data dirs in --lab-dir too (tests)")
    p.add_argument("extra", nargs="*", help="more JupyterLab options, after --")
    args = p.parse_args(argv)
    try:
        argv_lab = lab_argv(args.notebook_dir, port=args.port, lab_dir=args.lab_dir, extra=args.extra)
    except ValueError as exc:
        print(f"make lab: {exc}", file=sys.stderr)
        return 2
    env = lab_env(lab_dir=args.lab_dir, isolated=args.isolated)
    write_overrides(args.lab_dir)
    user = os.environ.get("USER") or "you"
    print(f"JupyterLab on 127.0.0.1:{args.port} (the next free port if taken){' as root (--allow-root)' if os.geteuid() == 0 else ''}.\n"
          f"From a laptop: ssh -N -L {args.port}:127.0.0.1:{args.port} {user}@{os.uname().nodename}  then open the "
          "http://127.0.0.1:...?token=... URL printed below.", flush=True)
    try:
        os.execve(argv_lab[0], argv_lab, env)
    except OSError as exc:
        print(f"make lab: cannot start JupyterLab: {exc}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
