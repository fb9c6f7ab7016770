"""Python AST analysis of one target or module: imports, torch_xla, installs, downloads."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from .findings import RULE_DOWNLOAD, RULE_XLA
from .shell import analyse_shell
from .sources import ShellCommand


@dataclass
class ImportEvent:
    line: int
    module: str  # absolute, or the part after the dots for relative imports
    level: int = 0
    names: tuple[str, ...] = ()  # names of `from module import a, b`; ("*",) for star imports


def _is_xla(name: str | None) -> bool:
    return bool(name) and (name == "torch_xla" or name.startswith("torch_xla."))


def _is_type_checking(test: ast.expr) -> bool:
    return "TYPE_CHECKING" in (getattr(test, "id", None), getattr(test, "attr", None))  # Name, Attribute


def _walk(node: ast.AST) -> Iterator[ast.AST]:
    """ast.walk in source order, skipping ``if TYPE_CHECKING:`` bodies (never run at runtime)."""
    for child in ast.iter_child_nodes(node):
        type_checking = isinstance(child, ast.If) and _is_type_checking(child.test)
        for item in child.orelse if type_checking else [child]:  # only the else branch of a TYPE_CHECKING if
            yield item
            yield from _walk(item)


def aliases_of(trees: Sequence[ast.AST]) -> dict[str, str]:
    """Local name -> dotted module path, from all imports (flow-insensitive on purpose)."""
    table: dict[str, str] = {}
    for tree in trees:
        for node in _walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:  # `import a.b` binds a; `import a.b as c` binds c to a.b
                    top = alias.name.split(".")[0]
                    table[alias.asname or top] = alias.name if alias.asname else top
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
# Distinctive function names that download whatever module they come from (download_file: speechbrain's
# data_utils; download_asset: torchaudio.utils).
_DOWNLOAD_NAMES = {
    "urlopen",
    "urlretrieve",
    "hf_hub_download",
    "snapshot_download",
    "cached_download",
    "load_state_dict_from_url",
    "download_url_to_file",
    "download_file",
    "download_asset",
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


class Scanner:
    """Collects imports and rule violations (line, rule, message) from one parsed target or module."""

    def __init__(
        self, aliases: dict[str, str], local_dirs: Sequence[Path], sockets: frozenset[str] = frozenset()
    ) -> None:
        self.aliases = aliases
        self.local_dirs = local_dirs
        self.imports: list[ImportEvent] = []
        self.problems: list[tuple[int, str, str]] = []
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

    def run(self, tree: ast.AST, shells: Sequence[ShellCommand] = ()) -> Scanner:
        self.sockets |= socket_names(tree, self)
        for shell in shells:
            self.shell(shell.line, shell.command)
        for node in _walk(tree):
            if isinstance(node, ast.Import):
                for alias in node.names:
                    if _is_xla(alias.name):
                        self.xla(node.lineno, f"import {alias.name}")
                    self.imports.append(ImportEvent(node.lineno, alias.name))
            elif isinstance(node, ast.ImportFrom):
                if node.level == 0 and _is_xla(node.module):
                    self.xla(node.lineno, f"from {node.module} import ...")
                names = tuple(a.name for a in node.names)
                self.imports.append(ImportEvent(node.lineno, node.module or "", node.level, names))
            elif isinstance(node, ast.Call):
                self.call(node)
        return self

    def xla(self, line: int, what: str) -> None:
        self.problems.append(
            (line, RULE_XLA, f"`{what}`: torch_xla is not installed in the submission image")
        )

    def shell(self, line: int, command: str | list[str]) -> None:
        problems, runs = analyse_shell(command)
        self.problems += [(line, rule, message) for rule, message in problems]
        for kind, what in runs:
            if kind == "-m":
                # `python -m pkg` also runs pkg/__main__.py: import it like `from pkg import __main__`.
                self.imports.append(ImportEvent(line, what, 0, ("__main__",)))
                continue
            try:
                tree = ast.parse(what)
            except SyntaxError:
                continue  # not worth a finding: the command would fail loudly anyway
            sub = Scanner(aliases_of([tree]), self.local_dirs).run(tree)
            self.problems += [(line, rule, message) for _, rule, message in sub.problems]
            self.imports += [ImportEvent(line, e.module, e.level, e.names) for e in sub.imports]

    def call(self, node: ast.Call) -> None:
        qual = self.dotted(node.func) or ""
        last = qual.rsplit(".", 1)[-1] or getattr(node.func, "attr", "")  # `x[0].connect`: no dotted name
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
            value = _const_str(source or (args[0] if args else None))
            if value is not None and not offline and self.looks_remote(value, bare=last == "from_pretrained"):
                message = (
                    f"{what} with source {value!r} fetches from the model hub; pass a local directory "
                    "(e.g. an attached /kaggle/input dataset) instead"
                )
                self.problems.append((line, RULE_DOWNLOAD, message))
        elif last in _DOWNLOAD_NAMES or qual in _DOWNLOAD_QUALNAMES or _KAGGLE_API.match(last):
            # torch.hub.load(dir, name, source="local") is the offline way to use a hub repo.
            if not offline and _const_str(_keyword(node, "source")) != "local":
                self.download(line, what)
        elif (
            (qual.startswith("requests.") and last in _REQUESTS_FUNCS)
            or qual.startswith("httpx.")
            or (last == "get_file" and "keras" in qual)
            or (
                last in ("connect", "connect_ex")
                and isinstance(node.func, ast.Attribute)
                and isinstance(node.func.value, ast.Name)
                and node.func.value.id in self.sockets
            )
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
        elif _const_true(_keyword(node, "download")):
            self.download(line, f"{what} with download=True")

    def download(self, line: int, what: str) -> None:
        message = f"{what} downloads from the network (off in the submission); read from an attached input"
        self.problems.append((line, RULE_DOWNLOAD, message))

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
            parts = parts[: len(parts) - (level - 1)]
            name = ".".join([*parts, name.lstrip(".")]).rstrip(".")
        self.imports.append(ImportEvent(node.lineno, name))

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


def socket_names(tree: ast.AST, scanner: Scanner) -> set[str]:
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


def _command_tokens(node: ast.AST, scanner: Scanner) -> str | list[str] | None:
    """The command a subprocess/os.system call runs, as a string or an argv list."""

    def piece(part: ast.AST) -> str:
        if (text := _const_str(part)) is not None:
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
        return left + right if isinstance(left, str) and isinstance(right, str) else None
    if isinstance(node, (ast.Constant, ast.JoinedStr)) and (text := piece(node)) != "{}":
        return text
    return None
