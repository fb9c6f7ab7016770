"""Shell commands (magics, subprocess/os.system strings): online installs and downloads."""

from __future__ import annotations

import itertools
import re
import shlex

from .findings import RULE_DOWNLOAD, RULE_PIP

_PIP = re.compile(r"^pip(\d+(\.\d+)*)?$")
_PYTHON = re.compile(r"^(python(\d+(\.\d+)*)?|\{.*\})$")  # "{...}" is e.g. {sys.executable}
_WRAPPERS = {"sudo", "env", "time", "nohup", "exec", "command", "xargs", "nice"}
_SEPARATORS = {";", "&&", "||", "|", "&", "(", ")", ";;"}
_DOWNLOADERS = {"wget", "curl", "aria2c", "gdown", "axel"}


def _split_segments(command: str) -> list[list[str]]:
    """Tokenise a shell command and split it at ``;``, ``&&``, ``|`` ... into simple commands."""
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        tokens = list(lexer)
    except ValueError:  # unbalanced quotes: fall back to a rough split
        tokens = [t.strip("'\"") for t in re.split(r"\s+|(&&|\|\||;|\|)", command) if t]
    runs = itertools.groupby(tokens, key=lambda token: token in _SEPARATORS)
    return [list(segment) for separators, segment in runs if not separators]


def analyse_shell(command: str | list[str]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Return ``([(rule, message)], [("-m", module) | ("-c", code)])`` for one shell command.

    The second list holds the Python that the command runs, which the caller analyses too.
    """
    problems: list[tuple[str, str]] = []
    runs: list[tuple[str, str]] = []
    for tokens in [command] if isinstance(command, list) else _split_segments(command):
        _analyse_segment(tokens, problems, runs)
    return problems, runs


def _analyse_segment(tokens: list[str], problems: list[tuple[str, str]], runs: list[tuple[str, str]]) -> None:
    toks = list(tokens)
    while toks and (toks[0] in _WRAPPERS or re.match(r"^\w+=", toks[0]) or toks[0].startswith("-")):
        toks.pop(0)
    if not toks:
        return
    cmd = toks[0].rsplit("/", 1)[-1]
    text = " ".join(tokens)
    if cmd in ("bash", "sh", "zsh") and "-c" in toks[:-1]:
        for segment in _split_segments(toks[toks.index("-c") + 1]):
            _analyse_segment(segment, problems, runs)
        return

    online = f"`{text}` needs the internet (off in the submission)"
    pips = [
        i
        for i, t in enumerate(toks)
        if _PIP.match(t.rsplit("/", 1)[-1]) and (i == 0 or toks[i - 1] in ("-m", "uv"))
    ]
    if pips:
        rest = toks[pips[0] + 1 :]
        sub = next((t for t in rest if not t.startswith("-")), "")
        if sub in ("install", "download", "wheel") and "--no-index" not in rest:
            problems.append(
                (RULE_PIP, f"{online}; use `pip install --no-index --find-links /kaggle/input/<wheels> ...`")
            )
        return
    for flag in ("-m", "-c"):
        if _PYTHON.match(cmd) and flag in toks[:-1]:
            runs.append((flag, toks[toks.index(flag) + 1]))
            return
    sub = next((t for t in toks[1:] if not t.startswith("-")), "")
    if (
        cmd in ("conda", "mamba", "micromamba")
        and sub in ("install", "create", "update", "upgrade")
        and "--offline" not in toks
    ) or (cmd in ("apt", "apt-get") and sub == "install"):
        problems.append((RULE_PIP, online))
    elif cmd in _DOWNLOADERS or (
        cmd == "git"
        and (
            sub in ("clone", "pull", "fetch")
            or (sub in ("lfs", "submodule") and {"pull", "fetch", "update"} & set(toks))
        )
    ):
        problems.append((RULE_DOWNLOAD, f"`{text}` downloads from the network (off in the submission)"))
    elif cmd == "kaggle" and ("download" in toks or toks[1:3] == ["kernels", "output"]):
        problems.append(
            (RULE_DOWNLOAD, f"`{text}` downloads via the Kaggle API; attach the data as a notebook input")
        )
    elif cmd in ("huggingface-cli", "hf") and "download" in toks:
        problems.append((RULE_DOWNLOAD, f"`{text}` downloads from the Hugging Face Hub"))
