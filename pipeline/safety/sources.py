"""The Python a target consists of: notebook cells, jupytext script cells, and IPython magics turned into
plain Python plus the shell commands they run."""

from __future__ import annotations

import ast
import json
import re
from dataclasses import dataclass
from pathlib import Path

from .findings import SafetyError


@dataclass
class Unit:
    source: str
    cell: int | None  # 1-based position among all notebook cells; None for .py files
    line_offset: int  # added to cell-relative line numbers (percent scripts report file lines)
    commented_magics: bool  # jupytext percent scripts write magics as "# !pip ..."
    shell: bool = False  # a jupytext `# %% language="bash"` cell: every line is a commented command


@dataclass
class ShellCommand:
    line: int  # 1-based line within the unit
    command: str


_PERCENT_MARKER = re.compile(r"^\s*#\s?%%(?:\s|$)")
_PERCENT_NON_CODE = re.compile(r"\[(markdown|md|raw)\]")
_PERCENT_LANGUAGE = re.compile(r"""language=["']?(\w+)""")


def notebook_units(path: Path) -> list[Unit]:
    try:
        nb = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise SafetyError(f"{path}: not a valid .ipynb (JSON) file: {exc}") from exc
    if not isinstance(nb, dict) or not isinstance(nb.get("cells"), list):
        raise SafetyError(f"{path}: not an nbformat 4 notebook (no 'cells' list)")
    # nbformat stores a cell's source as one string or a list of lines: "".join reads either.
    return [
        Unit("".join(cell.get("source", "")), index, 0, False)
        for index, cell in enumerate(nb["cells"], start=1)
        if isinstance(cell, dict) and cell.get("cell_type") == "code"
    ]


def script_units(text: str) -> list[Unit]:
    lines = text.splitlines(keepends=True)
    markers = [i for i, line in enumerate(lines) if _PERCENT_MARKER.match(line)]
    if not markers:
        # jupytext "light" scripts also comment out magics; plain modules must not get that treatment.
        light = re.search(r"^#\s+format_name: light\s*$", text, re.MULTILINE) is not None
        return [Unit(text, None, 0, light)]
    units = []
    if markers[0] > 0:  # jupytext treats text before the first marker (its header) as a cell
        units.append(Unit("".join(lines[: markers[0]]), None, 0, True))
    for start, end in zip(markers, [*markers[1:], len(lines)], strict=True):
        if _PERCENT_NON_CODE.search(lines[start]):
            continue
        language = _PERCENT_LANGUAGE.search(lines[start])
        shell = bool(language) and language.group(1) in ("bash", "sh", "shell", "zsh")
        if language and not shell and language.group(1) != "python":
            continue  # %%html, %%javascript ... cells: not executed as code
        # Keep the marker line (it is a comment) so ast line numbers map back with a fixed offset.
        units.append(Unit("".join(lines[start:end]), None, start, True, shell))
    return units


_SHELL_CELL_MAGICS = {"bash", "sh", "script", "system", "sx"}
_INERT_CELL_MAGICS = {
    "writefile",
    "file",
    "html",
    "HTML",
    "javascript",
    "js",
    "markdown",
    "latex",
    "svg",
    "md",
    "sql",
    "perl",
    "ruby",
    "error",
    "warn",
}
_PY_LINE_MAGICS = {"time", "timeit", "prun", "debug", "memit"}
_MAGIC_LINE = re.compile(r"^(?P<indent>[ \t]*)(?:[A-Za-z_][\w, \t]*=[ \t]*)?(?P<bang>!!?|%)(?P<body>.*)$")
_COMMENTED_MAGIC = re.compile(
    r"^(?P<indent>[ \t]*)#[ \t]?(?:[A-Za-z_][\w, \t]*=[ \t]*)?(?P<bang>!!?|%)(?P<body>\S.*)$"
)
_TIMEIT_OPTS = re.compile(r"^(?:-\w+(?:[ \t]+\d+)?[ \t]+)*")
_UNCOMMENT = re.compile(r"^[ \t]*#[ \t]?")  # jupytext's comment before a magic or a shell cell's line


def _strip_magics(source: str, commented: bool) -> tuple[str, list[ShellCommand]]:
    """Replace magic lines by ``pass`` (keeping line numbers) and collect their shell commands: real magics
    (``!pip``), or with ``commented`` jupytext's ``# !pip`` form."""
    lines = source.split("\n")
    shells: list[ShellCommand] = []
    first = next(
        (i for i, line in enumerate(lines) if line.strip() and not _PERCENT_MARKER.match(line)), None
    )
    if first is not None:
        head = lines[first].strip()
        if commented and head.startswith("#"):
            head = head[1:].lstrip()
        if match := re.match(r"^%%(\w+)(.*)$", head):
            name, args = match.group(1), match.group(2).split()
            shell = name in _SHELL_CELL_MAGICS and not (
                name == "script" and args and Path(args[0]).name.startswith("python")
            )
            if shell or name in _INERT_CELL_MAGICS:
                body = [_UNCOMMENT.sub("", line) if commented else line for line in lines[first + 1 :]]
                return "\n" * (len(lines) - 1), _shell_lines(body, first + 2) if shell else []
            lines[first] = ""  # Python-bodied (and unknown) cell magics: analyse the body as Python.
    magic = _COMMENTED_MAGIC if commented else _MAGIC_LINE
    i = 0
    while i < len(lines):
        if not (match := magic.match(lines[i])):
            i += 1
            continue
        indent, bang, body = match.group("indent"), match.group("bang"), match.group("body")
        start = i
        # A trailing backslash continues a shell command onto the next line.
        while body.endswith("\\") and i + 1 < len(lines):
            i += 1
            nxt = _UNCOMMENT.sub("", lines[i]) if commented else lines[i]
            body = body[:-1] + " " + nxt.strip()
            lines[i] = ""
        replacement = indent + "pass"
        if bang.startswith("!"):
            shells.append(ShellCommand(start + 1, body))
        else:
            name, _, rest = body.partition(" ")  # a stray cell magic (name "%bash") matches none below
            if name in ("pip", "conda", "mamba", "micromamba", "uv"):
                shells.append(ShellCommand(start + 1, f"{name} {rest}"))
            elif name in ("system", "sx", "sc"):
                shells.append(ShellCommand(start + 1, rest))
            elif name == "run" and rest.strip().startswith("-m"):
                shells.append(ShellCommand(start + 1, f"python {rest}"))
            elif name in _PY_LINE_MAGICS and rest.strip():
                # `%time import torch_xla` still executes the statement.
                replacement = indent + _TIMEIT_OPTS.sub("", rest.strip())
        lines[start] = replacement
        i += 1
    return "\n".join(lines), shells


def _shell_lines(body: list[str], first_line: int) -> list[ShellCommand]:
    shells = []
    pending, start = "", first_line
    for offset, line in enumerate(body):
        if not pending:
            start = first_line + offset
        if line.rstrip().endswith("\\"):
            pending += line.rstrip()[:-1] + " "
            continue
        command, pending = pending + line, ""
        if command.strip() and not command.strip().startswith("#"):
            shells.append(ShellCommand(start, command))
    if pending.strip():
        shells.append(ShellCommand(start, pending))
    return shells


def parse_unit(unit: Unit, filename: str) -> tuple[ast.Module, list[ShellCommand]]:
    """Parse a cell/script, converting magics first; raises SyntaxError if nothing works."""
    shells: list[ShellCommand] = []
    source = unit.source
    if unit.shell:
        body = [_UNCOMMENT.sub("", line) for line in source.split("\n")[1:]]
        return ast.Module(body=[], type_ignores=[]), _shell_lines(body, 2)
    if unit.commented_magics:
        source, shells = _strip_magics(source, commented=True)
    try:
        return ast.parse(source, filename), shells
    except SyntaxError as first_error:
        error = first_error
    # Real magics make the cell invalid Python; convert them line by line (keeps line numbers).
    converted, more = _strip_magics(source, commented=False)
    try:
        return ast.parse(converted, filename), shells + more
    except SyntaxError:
        pass
    # Last resort: IPython's own transformer (line numbers may drift for multi-line magics).
    try:
        from IPython.core.inputtransformer2 import TransformerManager

        return ast.parse(TransformerManager().transform_cell(source), filename), shells
    except (ImportError, SyntaxError, ValueError):
        raise error from None
