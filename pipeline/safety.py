"""Static submission-safety check for the Kaggle inference notebook.

The submission notebook runs with the internet off and without torch_xla, so this module
looks (without importing or executing anything) for:

* ``xla-import``: any import of ``torch_xla``, in the notebook or in any module of the
  project's own package(s) that the notebook imports, followed transitively;
* ``pip-online``: package installs that need an index (``pip install`` without ``--no-index``,
  also through ``pip.main``/``pip._internal``; ``conda``/``apt-get install``);
* ``download``: network access (urllib, requests, httpx, torch.hub, huggingface_hub,
  ``from_pretrained``/``from_hparams``/SpeechBrain ``fetch`` with a hub id, ``datasets.load_dataset``,
  raw sockets that connect, wget/curl, ``git clone``, ``kaggle ... download``);
* ``syntax-error`` / ``unresolved``: a file that cannot be parsed, or a project module that is
  imported but cannot be found -- in both cases safety cannot be established.

Usage: ``python -m pipeline check-safety notebooks/infer.ipynb [--root DIR] [--package NAME]``.
"""

from __future__ import annotations

import argparse
import ast
import json
import re
import shlex
import sys
from collections import deque
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from importlib.machinery import PathFinder
from pathlib import Path

RULE_XLA = "xla-import"
RULE_PIP = "pip-online"
RULE_DOWNLOAD = "download"
RULE_SYNTAX = "syntax-error"
RULE_UNRESOLVED = "unresolved"

DEFAULT_PACKAGES: tuple[str, ...] = ("pipeline",)


@dataclass(frozen=True)
class Finding:
    """One problem: where it is, which rule, and (for package modules) how the notebook reaches it."""

    path: str
    line: int
    rule: str
    message: str
    cell: int | None = None
    chain: tuple[str, ...] = ()

    @property
    def location(self) -> str:
        """``path:cell C line L`` for notebook cells, ``path:L`` for files."""
        if self.cell is not None:
            return f"{self.path}:cell {self.cell} line {self.line}"
        return f"{self.path}:{self.line}"

    def format(self) -> str:
        """The one-line form printed by the CLI: ``location: rule: message [via ...]``."""
        text = f"{self.location}: {self.rule}: {self.message}"
        if self.chain:
            text += " [imported via " + " -> ".join(self.chain) + "]"
        return text


@dataclass
class SafetyReport:
    """Findings for one target plus the project modules that were followed and checked."""

    target: str
    findings: list[Finding] = field(default_factory=list)
    modules: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.findings

    def summary(self) -> str:
        """The closing line of the CLI output."""
        if self.findings:
            n = len(self.findings)
            return f"check-safety: {n} problem{'s' if n != 1 else ''} in {self.target}"
        mods = f"{len(self.modules)} modules checked"
        if self.modules:
            mods += ": " + ", ".join(self.modules)
        return f"check-safety: {self.target} is submission-safe ({mods})"


class SafetyError(Exception):
    """The target cannot be read at all (not a notebook, invalid JSON, ...)."""


# ---------------------------------------------------------------------------------------------
# Source units: the pieces of Python a target consists of (notebook cells, script cells, modules)
# ---------------------------------------------------------------------------------------------


@dataclass
class _Unit:
    source: str
    cell: int | None  # 1-based position among all notebook cells; None for .py files
    line_offset: int  # added to cell-relative line numbers (percent scripts report file lines)
    commented_magics: bool  # jupytext percent scripts write magics as "# !pip ..."
    shell: bool = False  # a jupytext `# %% language="bash"` cell: every line is a commented command


@dataclass
class _Shell:
    line: int  # 1-based line within the unit
    command: str


_PERCENT_MARKER = re.compile(r"^\s*#\s?%%(?:\s|$)")
_PERCENT_NON_CODE = re.compile(r"\[(markdown|md|raw)\]")
_PERCENT_LANGUAGE = re.compile(r"""language=["']?(\w+)""")


def _notebook_units(path: Path) -> list[_Unit]:
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SafetyError(f"{path}: not a valid .ipynb (JSON) file: {exc}") from exc
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise SafetyError(f"{path}: not an nbformat 4 notebook (no 'cells' list)")
    units = []
    for index, cell in enumerate(nb["cells"], start=1):
        if not isinstance(cell, dict) or cell.get("cell_type") != "code":
            continue
        src = cell.get("source", "")
        if isinstance(src, list):
            src = "".join(src)
        units.append(_Unit(src, index, 0, False))
    return units


def _script_units(text: str) -> list[_Unit]:
    lines = text.splitlines(keepends=True)
    markers = [i for i, line in enumerate(lines) if _PERCENT_MARKER.match(line)]
    if not markers:
        # jupytext "light" scripts also comment out magics; plain modules must not get that treatment.
        light = re.search(r"^#\s+format_name: light\s*$", text, re.MULTILINE) is not None
        return [_Unit(text, None, 0, light)]
    units = []
    if markers[0] > 0:  # jupytext treats text before the first marker (its header) as a cell
        units.append(_Unit("".join(lines[: markers[0]]), None, 0, True))
    for k, start in enumerate(markers):
        end = markers[k + 1] if k + 1 < len(markers) else len(lines)
        if _PERCENT_NON_CODE.search(lines[start]):
            continue
        language = _PERCENT_LANGUAGE.search(lines[start])
        shell = bool(language) and language.group(1) in ("bash", "sh", "shell", "zsh")
        if language and not shell and language.group(1) != "python":
            continue  # %%html, %%javascript ... cells: not executed as code
        # Keep the marker line (it is a comment) so ast line numbers map back with a fixed offset.
        units.append(_Unit("".join(lines[start:end]), None, start, True, shell))
    return units


# ---------------------------------------------------------------------------------------------
# IPython magics -> plain Python + shell commands
# ---------------------------------------------------------------------------------------------

_SHELL_CELL_MAGICS = {"bash", "sh", "script", "system", "sx"}
_INERT_CELL_MAGICS = {
    "writefile", "file", "html", "HTML", "javascript", "js", "markdown", "latex", "svg", "md",
    "sql", "perl", "ruby", "error", "warn",
}  # fmt: skip
_PY_LINE_MAGICS = {"time", "timeit", "prun", "debug", "memit"}
_MAGIC_LINE = re.compile(r"^(?P<indent>[ \t]*)(?:[A-Za-z_][\w, \t]*=[ \t]*)?(?P<bang>!!?|%)(?P<body>.*)$")
_COMMENTED_MAGIC = re.compile(
    r"^(?P<indent>[ \t]*)#[ \t]?(?:[A-Za-z_][\w, \t]*=[ \t]*)?(?P<bang>!!?|%)(?P<body>\S.*)$"
)
_TIMEIT_OPTS = re.compile(r"^(?:-\w+(?:[ \t]+\d+)?[ \t]+)*")


def _strip_magics(source: str, commented: bool, raw: bool) -> tuple[str, list[_Shell]]:
    """Replace magic lines by ``pass`` (keeping line numbers) and collect their shell commands.

    ``raw`` handles real magics (``!pip``); ``commented`` handles jupytext's ``# !pip`` form.
    """
    lines = source.split("\n")
    shells: list[_Shell] = []
    first = next(
        (i for i, line in enumerate(lines) if line.strip() and not _PERCENT_MARKER.match(line)), None
    )
    if first is not None:
        head = lines[first].strip()
        if commented and head.startswith("#"):
            head = head[1:].lstrip()
        if head.startswith("%%"):
            match = re.match(r"^%%(\w+)(.*)$", head)
            if match:
                name, args = match.group(1), match.group(2).split()
                body = lines[first + 1 :]
                if commented:
                    body = [re.sub(r"^[ \t]*#[ \t]?", "", line) for line in body]
                lines[first] = ""
                if name in _SHELL_CELL_MAGICS and not (
                    name == "script" and args and Path(args[0]).name.startswith("python")
                ):
                    shells += _shell_lines(body, first + 2)
                    return "\n" * (len(lines) - 1), shells
                if name in _INERT_CELL_MAGICS:
                    return "\n" * (len(lines) - 1), shells
                # Python-bodied (and unknown) cell magics: analyse the body as Python.
    i = 0
    while i < len(lines):
        line = lines[i]
        match = (_MAGIC_LINE.match(line) if raw else None) or (
            _COMMENTED_MAGIC.match(line) if commented else None
        )
        if not match:
            i += 1
            continue
        indent, bang, body = match.group("indent"), match.group("bang"), match.group("body")
        start = i
        # A trailing backslash continues a shell command onto the next line.
        while body.endswith("\\") and i + 1 < len(lines):
            i += 1
            nxt = lines[i]
            if commented:
                nxt = re.sub(r"^[ \t]*#[ \t]?", "", nxt)
            body = body[:-1] + " " + nxt.strip()
            lines[i] = ""
        replacement = indent + "pass"
        if bang.startswith("!"):
            shells.append(_Shell(start + 1, body))
        else:
            name, _, rest = body.partition(" ")
            if name.startswith("%"):  # a stray cell magic not on the first line
                name = ""
            if name in ("pip", "conda", "mamba", "micromamba", "uv"):
                shells.append(_Shell(start + 1, f"{name} {rest}"))
            elif name in ("system", "sx", "sc"):
                shells.append(_Shell(start + 1, rest))
            elif name == "run" and rest.strip().startswith("-m"):
                shells.append(_Shell(start + 1, f"python {rest}"))
            elif name in _PY_LINE_MAGICS and rest.strip():
                # `%time import torch_xla` still executes the statement.
                replacement = indent + _TIMEIT_OPTS.sub("", rest.strip())
        lines[start] = replacement
        i += 1
    return "\n".join(lines), shells


def _shell_lines(body: list[str], first_line: int) -> list[_Shell]:
    shells = []
    pending, start = "", first_line
    for offset, line in enumerate(body):
        if not pending:
            start = first_line + offset
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        command = pending + line
        pending = ""
        if command.strip() and not command.strip().startswith("#"):
            shells.append(_Shell(start, command))
    if pending.strip():
        shells.append(_Shell(start, pending))
    return shells


def _parse_unit(unit: _Unit, filename: str) -> tuple[ast.Module, list[_Shell]]:
    """Parse a cell/script, converting magics first; raises SyntaxError if nothing works."""
    shells: list[_Shell] = []
    source = unit.source
    if unit.shell:
        body = [re.sub(r"^[ \t]*#[ \t]?", "", line) for line in source.split("\n")[1:]]
        return ast.Module(body=[], type_ignores=[]), _shell_lines(body, 2)
    if unit.commented_magics:
        source, shells = _strip_magics(source, commented=True, raw=False)
    try:
        return ast.parse(source, filename), shells
    except SyntaxError as first_error:
        error = first_error
    # Real magics make the cell invalid Python; convert them line by line (keeps line numbers).
    converted, more = _strip_magics(source, commented=False, raw=True)
    try:
        return ast.parse(converted, filename), shells + more
    except SyntaxError:
        pass
    # Last resort: IPython's own transformer (line numbers may drift for multi-line magics).
    try:
        from IPython.core.inputtransformer2 import TransformerManager
    except ImportError:
        raise error from None
    try:
        return ast.parse(TransformerManager().transform_cell(source), filename), shells
    except (SyntaxError, ValueError):
        raise error from None


# ---------------------------------------------------------------------------------------------
# Shell command analysis (magics, subprocess/os.system strings)
# ---------------------------------------------------------------------------------------------

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
    segments: list[list[str]] = [[]]
    for token in tokens:
        if token in _SEPARATORS:
            segments.append([])
        else:
            segments[-1].append(token)
    return [s for s in segments if s]


def _analyse_shell(command: str | list[str]) -> tuple[list[tuple[str, str]], list[tuple[str, str]]]:
    """Return ``([(rule, message)], [("-m", module) | ("-c", code)])`` for one shell command.

    The second list holds the Python that the command runs, which the caller analyses too.
    """
    segments = [command] if isinstance(command, list) else _split_segments(command)
    problems: list[tuple[str, str]] = []
    runs: list[tuple[str, str]] = []
    for tokens in segments:
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
        sub_problems, sub_runs = _analyse_shell(toks[toks.index("-c") + 1])
        problems.extend(sub_problems)
        runs.extend(sub_runs)
        return

    pip_at = next(
        (
            i
            for i, t in enumerate(toks)
            if _PIP.match(t.rsplit("/", 1)[-1]) and (i == 0 or toks[i - 1] in ("-m", "uv"))
        ),
        None,
    )
    if pip_at is not None:
        rest = toks[pip_at + 1 :]
        sub = next((t for t in rest if not t.startswith("-")), "")
        if sub in ("install", "download", "wheel") and "--no-index" not in rest:
            problems.append(
                (
                    RULE_PIP,
                    f"`{text}` needs the internet (off in the submission); "
                    "use `pip install --no-index --find-links /kaggle/input/<wheels> ...`",
                )
            )
        return
    if _PYTHON.match(cmd) and "-m" in toks[:-1]:
        runs.append(("-m", toks[toks.index("-m") + 1]))
        return
    if _PYTHON.match(cmd) and "-c" in toks[:-1]:
        runs.append(("-c", toks[toks.index("-c") + 1]))
        return
    sub = next((t for t in toks[1:] if not t.startswith("-")), "")
    if cmd in ("conda", "mamba", "micromamba") and sub in ("install", "create", "update", "upgrade"):
        if "--offline" not in toks:
            problems.append((RULE_PIP, f"`{text}` needs the internet (off in the submission)"))
    elif cmd in ("apt", "apt-get") and sub == "install":
        problems.append((RULE_PIP, f"`{text}` needs the internet (off in the submission)"))
    elif cmd in _DOWNLOADERS:
        problems.append((RULE_DOWNLOAD, f"`{text}` downloads from the network (off in the submission)"))
    elif cmd == "git" and (
        sub in ("clone", "pull", "fetch")
        or (sub in ("lfs", "submodule") and {"pull", "fetch", "update"} & set(toks))
    ):
        problems.append((RULE_DOWNLOAD, f"`{text}` downloads from the network (off in the submission)"))
    elif cmd == "kaggle" and ("download" in toks or toks[1:3] == ["kernels", "output"]):
        problems.append(
            (RULE_DOWNLOAD, f"`{text}` downloads via the Kaggle API; attach the data as a notebook input")
        )
    elif cmd in ("huggingface-cli", "hf") and "download" in toks:
        problems.append((RULE_DOWNLOAD, f"`{text}` downloads from the Hugging Face Hub"))


# ---------------------------------------------------------------------------------------------
# Python AST analysis
# ---------------------------------------------------------------------------------------------


@dataclass
class _ImportEvent:
    line: int
    module: str  # absolute, or the part after the dots for relative imports
    level: int = 0
    names: tuple[str, ...] = ()  # names of `from module import a, b`; ("*",) for star imports


@dataclass
class _Scan:
    imports: list[_ImportEvent] = field(default_factory=list)
    problems: list[tuple[int, str, str]] = field(default_factory=list)  # (line, rule, message)


def _is_xla(name: str | None) -> bool:
    return bool(name) and (name == "torch_xla" or name.startswith("torch_xla."))


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
    )


def _walk(node: ast.AST) -> Iterator[ast.AST]:
    """ast.walk in source order, skipping ``if TYPE_CHECKING:`` bodies (never run at runtime)."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.If) and _is_type_checking(child.test):
            for stmt in child.orelse:
                yield stmt
                yield from _walk(stmt)
            continue
        yield child
        yield from _walk(child)


def _aliases(trees: Sequence[ast.AST]) -> dict[str, str]:
    """Local name -> dotted module path, from all imports (flow-insensitive on purpose)."""
    table: dict[str, str] = {}
    for tree in trees:
        for node in _walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.asname:
                        table[alias.asname] = alias.name
                    else:
                        top = alias.name.split(".")[0]
                        table[top] = top
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    if alias.name != "*":
                        table[alias.asname or alias.name] = f"{node.module}.{alias.name}"
    return table


_SHELL_CALLS = {
    "subprocess.run",
    "subprocess.call",
    "subprocess.check_call",
    "subprocess.check_output",
    "subprocess.Popen",
    "subprocess.getoutput",
    "subprocess.getstatusoutput",
    "os.system",
    "os.popen",
    "get_ipython().system",
    "get_ipython().system_raw",
    "get_ipython().getoutput",
}
_DYNAMIC_IMPORTS = {"importlib.import_module", "importlib.__import__", "__import__"}
# Distinctive function names that download whatever module they come from.
_DOWNLOAD_NAMES = {
    "urlopen",
    "urlretrieve",
    "hf_hub_download",
    "snapshot_download",
    "cached_download",
    "load_state_dict_from_url",
    "download_url_to_file",
    "download_file",  # speechbrain.utils.data_utils
    "download_asset",  # torchaudio.utils
}
_DOWNLOAD_QUALNAMES = {
    "torch.hub.load",
    "torch.hub.list",
    "torch.hub.help",
    "torch.utils.model_zoo.load_url",
    "wget.download",
    "gdown.download",
    "gdown.download_folder",
    "pooch.retrieve",
    "http.client.HTTPConnection",
    "http.client.HTTPSConnection",
    "aiohttp.ClientSession",
    "urllib3.PoolManager",
    "urllib3.request",
    "socket.create_connection",
    "socket.socket().connect",
    "socket.socket().connect_ex",
    "ftplib.FTP",
    "ftplib.FTP_TLS",
}
# pip's Python entry points: `pip.main(["install", ...])` is a pip install like any other.
_PIP_API = {"pip.main", "pip._internal.main", "pip._internal.main.main", "pip._internal.cli.main.main"}
_REQUESTS_FUNCS = set("get post put patch delete head options request Session session".split())
_KAGGLE_API = re.compile(
    r"^((dataset|competition|competitions_data|model|model_instance|model_instance_version)s?_download\w*"
    r"|kernels?_output)$"
)
_HUB_METHODS = {"from_hparams", "from_pretrained", "foreign_class"}
_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*/[A-Za-z0-9][\w.-]*$")
_BARE_NAME = re.compile(r"^[A-Za-z0-9][\w.-]*$")
_URL = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://")
_DATASETS_LOCAL_BUILDERS = {"csv", "json", "parquet", "text", "arrow", "audiofolder", "imagefolder", "pandas"}


class _Scanner:
    """Collects imports and rule violations from one parsed target or module."""

    def __init__(
        self, aliases: dict[str, str], local_dirs: Sequence[Path], sockets: frozenset[str] = frozenset()
    ) -> None:
        self.aliases = aliases
        self.local_dirs = local_dirs
        self.scan = _Scan()
        # Names bound to socket.socket(...) anywhere in the target (cells share names), for `s.connect`.
        self.sockets: set[str] = set(sockets)

    def dotted(self, node: ast.AST) -> str | None:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            base = self.dotted(node.value)
            return f"{base}.{node.attr}" if base else None
        if isinstance(node, ast.Call):
            base = self.dotted(node.func)
            return f"{base}()" if base else None
        return None

    def run(self, tree: ast.AST, shells: Sequence[_Shell] = ()) -> _Scan:
        self.sockets |= _socket_names(tree, self)
        for shell in shells:
            self.shell(shell.line, shell.command)
        for node in _walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if _is_xla(alias.name):
                        self.xla(node.lineno, f"import {alias.name}")
                    self.scan.imports.append(_ImportEvent(node.lineno, alias.name))
            elif isinstance(node, ast.ImportFrom):
                if node.level == 0 and _is_xla(node.module):
                    self.xla(node.lineno, f"from {node.module} import ...")
                names = tuple(a.name for a in node.names)
                self.scan.imports.append(_ImportEvent(node.lineno, node.module or "", node.level, names))
            elif isinstance(node, ast.Call):
                self.call(node)
        return self.scan

    def problem(self, line: int, rule: str, message: str) -> None:
        self.scan.problems.append((line, rule, message))

    def xla(self, line: int, what: str) -> None:
        self.problem(line, RULE_XLA, f"`{what}`: torch_xla is not installed in the submission image")

    def shell(self, line: int, command: str | list[str]) -> None:
        problems, runs = _analyse_shell(command)
        for rule, message in problems:
            self.problem(line, rule, message)
        for kind, what in runs:
            if kind == "-m":
                # `python -m pkg` also runs pkg/__main__.py: import it like `from pkg import __main__`.
                self.scan.imports.append(_ImportEvent(line, what, 0, ("__main__",)))
                continue
            try:
                tree = ast.parse(what)
            except SyntaxError:
                continue  # not worth a finding: the command would fail loudly anyway
            sub = _Scanner(_aliases([tree]), self.local_dirs).run(tree)
            self.scan.problems += [(line, rule, message) for _, rule, message in sub.problems]
            self.scan.imports += [_ImportEvent(line, e.module, e.level, e.names) for e in sub.imports]

    def call(self, node: ast.Call) -> None:
        qual = self.dotted(node.func) or ""
        last = qual.rsplit(".", 1)[-1] if qual else ""
        if not last and isinstance(node.func, ast.Attribute):
            last = node.func.attr
        line = node.lineno
        args = node.args

        if qual in _DYNAMIC_IMPORTS and args and isinstance(args[0], ast.Constant):
            self.dynamic_import(node, args[0].value)
        elif qual in _SHELL_CALLS:
            command = args[0] if args else _keyword(node, "args") or _keyword(node, "cmd")
            tokens = _command_tokens(command, self) if command is not None else None
            if tokens is not None:
                self.shell(line, tokens)
        elif qual in _PIP_API and args:
            tokens = _command_tokens(args[0], self)
            if isinstance(tokens, list):
                self.shell(line, ["pip", *tokens])
        elif last in ("run_line_magic", "run_cell_magic") and len(args) >= 2:
            name, rest = _const_str(args[0]), _const_str(args[-1])
            if name is not None and rest is not None:
                if name in ("pip", "conda", "mamba"):
                    self.shell(line, f"{name} {rest}")
                elif name in ("system", "sx", "bash", "sh", "script"):
                    self.shell(line, rest)

        what = f"`{ast.unparse(node.func)}(...)`"
        offline = _const_true(_keyword(node, "local_files_only"))
        if last in _HUB_METHODS:
            source = _keyword(node, "source") or _keyword(node, "pretrained_model_name_or_path")
            source = source if source is not None else (args[0] if args else None)
            value = _const_str(source)
            if value is not None and not offline and self.looks_remote(value, bare=last == "from_pretrained"):
                self.problem(
                    line,
                    RULE_DOWNLOAD,
                    f"{what} with source {value!r} fetches from the model hub; pass a local directory "
                    "(e.g. an attached /kaggle/input dataset) instead",
                )
        elif last in _DOWNLOAD_NAMES or qual in _DOWNLOAD_QUALNAMES or _KAGGLE_API.match(last):
            # torch.hub.load(dir, name, source="local") is the offline way to use a hub repo.
            if not offline and _const_str(_keyword(node, "source")) != "local":
                self.download(line, what)
        elif (qual.startswith("requests.") and last in _REQUESTS_FUNCS) or qual.startswith("httpx."):
            self.download(line, what)
        elif (
            last in ("connect", "connect_ex")
            and isinstance(node.func, ast.Attribute)
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id in self.sockets
        ):
            self.download(line, what)
        elif qual.startswith("speechbrain.") and last == "fetch":
            # speechbrain.utils.fetching.fetch(filename, source, ...): a hub id or URL downloads.
            value = _const_str(_keyword(node, "source") or (args[1] if len(args) > 1 else None))
            if value is not None and self.looks_remote(value, bare=False):
                self.download(line, f"{what} with source {value!r}")
        elif qual.startswith("datasets.") and last == "load_dataset":
            value = _const_str(args[0]) if args else None
            if value is None or (
                value not in _DATASETS_LOCAL_BUILDERS and self.looks_remote(value, bare=True)
            ):
                self.download(line, what)
        elif last == "get_file" and "keras" in qual:
            self.download(line, what)
        elif _const_true(_keyword(node, "download")):
            self.download(line, f"{what} with download=True")

    def download(self, line: int, what: str) -> None:
        self.problem(
            line,
            RULE_DOWNLOAD,
            f"{what} downloads from the network (off in the submission); read from an attached input",
        )

    def dynamic_import(self, node: ast.Call, name: object) -> None:
        if not isinstance(name, str):
            return
        if _is_xla(name):
            self.xla(node.lineno, f"import_module({name!r})")
        if name.startswith("."):
            package = _const_str(_keyword(node, "package") or (node.args[1] if len(node.args) > 1 else None))
            if not package:
                return
            level = len(name) - len(name.lstrip("."))
            parts = package.split(".")
            parts = parts[: len(parts) - (level - 1)] if level > 1 else parts
            name = ".".join([*parts, name.lstrip(".")]).rstrip(".")
        self.scan.imports.append(_ImportEvent(node.lineno, name))

    def looks_remote(self, value: str, bare: bool) -> bool:
        """True for URLs and hub ids ("owner/name"; plain "name" too if ``bare``) not on disk."""
        if _URL.match(value):
            return True
        if not (_HUB_ID.match(value) or (bare and _BARE_NAME.match(value))):
            return False
        return not any((base / value).exists() for base in self.local_dirs)


def _keyword(node: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in node.keywords if k.arg == name), None)


def _const_str(node: ast.AST | None) -> str | None:
    return node.value if isinstance(node, ast.Constant) and isinstance(node.value, str) else None


def _const_true(node: ast.AST | None) -> bool:
    return isinstance(node, ast.Constant) and node.value is True


def _socket_names(tree: ast.AST, scanner: _Scanner) -> set[str]:
    """Names bound to a new socket (``s = socket.socket(...)``, ``with socket.socket() as s``)."""
    names = set()
    for node in _walk(tree):
        pairs: list[tuple[ast.expr, ast.expr | None]] = []
        if isinstance(node, ast.Assign):
            pairs = [(node.value, target) for target in node.targets]
        elif isinstance(node, (ast.With, ast.AsyncWith)):
            pairs = [(item.context_expr, item.optional_vars) for item in node.items]
        for value, target in pairs:
            if (
                isinstance(target, ast.Name)
                and isinstance(value, ast.Call)
                and scanner.dotted(value.func) in ("socket.socket", "socket.create_connection")
            ):
                names.add(target.id)
    return names


def _command_tokens(node: ast.AST, scanner: _Scanner) -> str | list[str] | None:
    """The command a subprocess/os.system call runs, as a string or an argv list."""

    def piece(part: ast.AST) -> str:
        text = _const_str(part)
        if text is not None:
            return text
        if isinstance(part, ast.FormattedValue):
            return piece(part.value)
        if scanner.dotted(part) == "sys.executable":
            return "python"
        if isinstance(part, ast.JoinedStr):
            return "".join(piece(v) for v in part.values)
        return "{}"

    if isinstance(node, (ast.List, ast.Tuple)):
        return [piece(e) for e in node.elts]
    if isinstance(node, ast.Call) and scanner.dotted(node.func) == "shlex.split" and node.args:
        return _command_tokens(node.args[0], scanner)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
        left, right = _command_tokens(node.left, scanner), _command_tokens(node.right, scanner)
        if isinstance(left, str) and isinstance(right, str):
            return left + right
        return None
    if isinstance(node, (ast.Constant, ast.JoinedStr)):
        text = piece(node)
        return None if text == "{}" else text
    return None


# ---------------------------------------------------------------------------------------------
# The project: finding package modules on disk
# ---------------------------------------------------------------------------------------------


class _Project:
    def __init__(self, root: Path, packages: Sequence[str]) -> None:
        self.root = root
        self.packages = tuple(packages)
        self.dirs: dict[str, Path] = {}
        for name in self.packages:
            found = self._locate(name)
            if found is not None:
                self.dirs[name] = found

    def _locate(self, name: str) -> Path | None:
        for base in (self.root, self.root / "src"):
            if (base / name / "__init__.py").is_file():
                return base / name
        # find_spec on the path-based finder only looks at the file system for a top-level
        # name (it never executes the package), unlike importing it.
        spec = PathFinder.find_spec(name, [p for p in sys.path if p])
        if spec is not None and spec.submodule_search_locations:
            return Path(next(iter(spec.submodule_search_locations)))
        return None

    def owns(self, module: str) -> bool:
        return module.split(".")[0] in self.packages

    def file(self, module: str) -> Path | None:
        """The source file of a project module (``__init__.py`` for packages), if on disk."""
        parts = module.split(".")
        top = self.dirs.get(parts[0])
        if top is None:
            return None
        base = top.joinpath(*parts[1:])
        if (base / "__init__.py").is_file():
            return base / "__init__.py"
        if base.with_suffix(".py").is_file() and len(parts) > 1:
            return base.with_suffix(".py")
        return None

    def exists(self, module: str) -> bool:
        parts = module.split(".")
        top = self.dirs.get(parts[0])
        return top is not None and (self.file(module) is not None or top.joinpath(*parts[1:]).is_dir())

    def is_package(self, module: str) -> bool:
        parts = module.split(".")
        top = self.dirs.get(parts[0])
        return top is not None and top.joinpath(*parts[1:]).is_dir()

    def module_name(self, path: Path) -> str | None:
        """Dotted name of a file inside one of the packages (so a module can be a target)."""
        path = path.resolve()
        for name, top in self.dirs.items():
            try:
                rel = path.relative_to(top.resolve())
            except ValueError:
                continue
            parts = [name, *rel.with_suffix("").parts]
            if parts[-1] == "__init__":
                parts.pop()
            return ".".join(parts)
        return None

    def star_names(self, module: str) -> tuple[str, ...]:
        """Literal ``__all__`` of a package (a star import of a package imports those submodules)."""
        path = self.file(module)
        if path is None:
            return ()
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError):
            return ()
        for node in tree.body:
            if isinstance(node, ast.Assign) and any(
                isinstance(t, ast.Name) and t.id == "__all__" for t in node.targets
            ):
                try:
                    value = ast.literal_eval(node.value)
                except ValueError:
                    return ()
                return tuple(v for v in value if isinstance(v, str))
        return ()

    def resolve(self, event: _ImportEvent, context: str | None) -> list[tuple[str, bool]]:
        """Project modules an import executes, parents first, as ``(name, must_exist)``."""
        if event.level:
            if context is None:
                return []
            parts = context.split(".") if self.is_package(context) else context.split(".")[:-1]
            if event.level > 1:
                parts = parts[: len(parts) - (event.level - 1)]
            if not parts:
                return []
            base = ".".join([*parts, event.module] if event.module else parts)
        else:
            base = event.module
        if not base or not self.owns(base):
            return []
        pieces = base.split(".")
        out = [(".".join(pieces[:k]), True) for k in range(1, len(pieces) + 1)]
        names = self.star_names(base) if event.names == ("*",) else event.names
        for name in names:
            sub = f"{base}.{name}"
            if self.exists(sub):  # `from pkg import x` imports the submodule x if there is one
                out.append((sub, False))
        return out


# ---------------------------------------------------------------------------------------------
# Driver
# ---------------------------------------------------------------------------------------------


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def _default_root(target: Path, packages: Sequence[str]) -> Path:
    for parent in target.resolve().parents:
        if any((parent / name / "__init__.py").is_file() for name in packages):
            return parent
    return Path.cwd()


def analyse(
    path: str | Path, root: str | Path | None = None, packages: Sequence[str] = DEFAULT_PACKAGES
) -> SafetyReport:
    """Check one notebook or script and every project module it imports; see :func:`check_notebook`."""
    target = Path(path)
    if not target.is_file():
        raise FileNotFoundError(f"{target}: no such file")
    packages = tuple(packages) or DEFAULT_PACKAGES
    root_dir = Path(root) if root is not None else _default_root(target, packages)
    project = _Project(root_dir.resolve(), packages)
    shown = _display(target)
    report = SafetyReport(shown)
    local_dirs = (Path.cwd(), root_dir, target.resolve().parent)

    if target.suffix == ".ipynb":
        units = _notebook_units(target)
        context = None
    else:
        try:
            units = _script_units(target.read_text(encoding="utf-8"))
        except UnicodeDecodeError as exc:
            raise SafetyError(f"{target}: not UTF-8 text: {exc}") from exc
        context = project.module_name(target)

    # Parse every cell first: imports in one cell bind names used by calls in later cells.
    parsed: list[tuple[_Unit, ast.Module, list[_Shell]]] = []
    for unit in units:
        try:
            tree, shells = _parse_unit(unit, shown)
        except SyntaxError as exc:
            report.findings.append(
                Finding(
                    shown,
                    (exc.lineno or 1) + unit.line_offset,
                    RULE_SYNTAX,
                    f"cannot parse ({exc.msg}); the checker cannot verify this code",
                    unit.cell,
                )
            )
            continue
        parsed.append((unit, tree, shells))
    aliases = _aliases([tree for _, tree, _ in parsed])
    sockets = frozenset().union(*(_socket_names(tree, _Scanner(aliases, ())) for _, tree, _ in parsed))

    # Breadth-first over the import graph, so each module's recorded chain is a shortest one.
    # A chain lists import sites: ("nb:cell 2 line 1", "pipeline.infer line 3", ...).
    queue: deque[tuple[str, tuple[str, ...]]] = deque()
    seen: set[str] = {context} if context is not None else set()

    def follow(
        events: list[_ImportEvent],
        ctx: str | None,
        site: Callable[[int], str],
        prefix: tuple[str, ...],
        locate: Callable[[int], tuple[str, int, int | None]],
    ) -> None:
        for event in events:
            for module, must_exist in project.resolve(event, ctx):
                if module in seen:
                    continue
                seen.add(module)
                chain = (*prefix, site(event.line))
                if project.file(module) is not None:
                    queue.append((module, chain))
                elif must_exist and not project.exists(module):
                    path, line, cell = locate(event.line)
                    report.findings.append(
                        Finding(
                            path,
                            line,
                            RULE_UNRESOLVED,
                            f"project module `{module}` is imported but not found under "
                            f"{project.root} (pass --root); it could not be checked",
                            cell,
                            chain if prefix else (),
                        )
                    )
                # else: a namespace package directory, nothing to read

    for unit, tree, shells in parsed:
        scan = _Scanner(aliases, local_dirs, sockets).run(tree, shells)

        def locate(line: int, unit: _Unit = unit) -> tuple[str, int, int | None]:
            return shown, line + unit.line_offset, unit.cell

        def site(line: int, unit: _Unit = unit) -> str:
            if unit.cell is not None:
                return f"{shown}:cell {unit.cell} line {line}"
            return f"{shown}:{line + unit.line_offset}"

        for line, rule, message in scan.problems:
            report.findings.append(Finding(shown, line + unit.line_offset, rule, message, unit.cell))
        follow(scan.imports, context, site, (), locate)

    while queue:
        module, chain = queue.popleft()
        file = project.file(module)
        assert file is not None  # only modules with a file are queued
        shown_file = _display(file)
        report.modules.append(module)

        def module_locate(line: int, shown_file: str = shown_file) -> tuple[str, int, int | None]:
            return shown_file, line, None

        def module_site(line: int, module: str = module) -> str:
            return f"{module} line {line}"

        try:
            tree = ast.parse(file.read_bytes(), shown_file)
        except (SyntaxError, ValueError) as exc:  # ValueError: null bytes on older Pythons
            line = getattr(exc, "lineno", None) or 1
            report.findings.append(
                Finding(
                    shown_file,
                    line,
                    RULE_SYNTAX,
                    f"cannot parse {module} ({getattr(exc, 'msg', exc)}); the checker cannot verify it",
                    chain=(*chain, module_site(line)),
                )
            )
            continue
        scan = _Scanner(_aliases([tree]), local_dirs).run(tree)
        for line, rule, message in scan.problems:
            if rule == RULE_XLA:  # guarded or not, the import is in the notebook's import graph
                message += f"; the notebook imports {module}, so move this out of its import graph"
            report.findings.append(
                Finding(shown_file, line, rule, message, chain=(*chain, module_site(line)))
            )
        follow(scan.imports, module, module_site, chain, module_locate)

    report.findings.sort(key=lambda f: (f.path != shown, f.path, f.cell or 0, f.line))
    return report


def check_notebook(
    path: str | Path, root: str | Path | None = None, packages: Sequence[str] = ("pipeline",)
) -> list[Finding]:
    """Return the submission-safety findings for a notebook (.ipynb) or script (.py).

    ``root`` is the project root holding the package(s) (default: the nearest parent of ``path``
    with one of ``packages``, else the cwd). Project modules are found on disk and parsed, never
    imported. Raises FileNotFoundError / SafetyError if the target cannot be read.
    """
    return analyse(path, root, packages).findings


def main(argv: list[str] | None = None) -> int:
    """CLI entry (args after ``check-safety``): 0 if safe, 1 if problems, 2 on usage errors."""
    parser = argparse.ArgumentParser(
        prog="python -m pipeline check-safety",
        description="Statically check a Kaggle submission notebook for torch_xla imports, online pip "
        "installs and network downloads, following the project package's imports.",
    )
    parser.add_argument("targets", nargs="+", metavar="NOTEBOOK", help=".ipynb notebook or .py script")
    parser.add_argument("--root", help="project root containing the package (default: auto-detect)")
    parser.add_argument(
        "--package",
        action="append",
        dest="packages",
        metavar="NAME",
        help="project package to follow (repeatable; default: pipeline)",
    )
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:  # argparse exits on --help / bad usage; callers want a return code
        return exc.code if isinstance(exc.code, int) else 2
    if args.root is not None and not Path(args.root).is_dir():
        print(f"check-safety: error: --root {args.root}: not a directory", file=sys.stderr)
        return 2
    packages = tuple(args.packages) if args.packages else DEFAULT_PACKAGES
    status = 0
    for target in args.targets:
        try:
            report = analyse(target, args.root, packages)
        except (FileNotFoundError, SafetyError, IsADirectoryError) as exc:
            print(f"check-safety: error: {exc}", file=sys.stderr)
            status = 2
            continue
        for finding in report.findings:
            print(finding.format())
        print(report.summary())
        if report.findings and status == 0:
            status = 1
    return status


if __name__ == "__main__":
    sys.exit(main())
