"""The driver: parse a target, follow its imports through the project, collect findings; and the CLI."""

from __future__ import annotations

import argparse
import ast
import sys
from collections import deque
from collections.abc import Sequence
from pathlib import Path

from .findings import (
    DEFAULT_PACKAGES,
    RULE_SYNTAX,
    RULE_UNRESOLVED,
    RULE_XLA,
    Finding,
    SafetyError,
    SafetyReport,
    location,
)
from .project import Project
from .scanner import ImportEvent, Scanner, aliases_of, socket_names
from .sources import ShellCommand, Unit, notebook_units, parse_unit, script_units


def _display(path: Path) -> str:
    try:
        return str(path.resolve().relative_to(Path.cwd().resolve()))
    except ValueError:
        return str(path)


def analyse(
    path: str | Path, root: str | Path | None = None, packages: Sequence[str] = DEFAULT_PACKAGES
) -> SafetyReport:
    """Check one notebook or script and every project module it imports; see :func:`check_notebook`."""
    target = Path(path)
    if not target.is_file():
        raise FileNotFoundError(f"{target}: no such file")
    packages = tuple(packages) or DEFAULT_PACKAGES
    holds = (p for p in target.resolve().parents if any((p / n / "__init__.py").is_file() for n in packages))
    root_dir = Path(root) if root is not None else next(holds, Path.cwd())
    project = Project(root_dir.resolve(), packages)
    shown = _display(target)
    report = SafetyReport(shown)
    local_dirs = (Path.cwd(), root_dir, target.resolve().parent)

    notebook = target.suffix == ".ipynb"
    try:  # notebook_units reports its own decoding errors
        units = notebook_units(target) if notebook else script_units(target.read_text(encoding="utf-8"))
    except UnicodeDecodeError as exc:
        raise SafetyError(f"{target}: not UTF-8 text: {exc}") from exc
    context = None if notebook else project.module_name(target)

    # Parse every cell first: imports in one cell bind names used by calls in later cells.
    parsed: list[tuple[Unit, ast.Module, list[ShellCommand]]] = []
    for unit in units:
        try:
            tree, shells = parse_unit(unit, shown)
        except SyntaxError as exc:
            message = f"cannot parse ({exc.msg}); the checker cannot verify this code"
            line = (exc.lineno or 1) + unit.line_offset
            report.findings.append(Finding(shown, line, RULE_SYNTAX, message, unit.cell))
            continue
        parsed.append((unit, tree, shells))
    aliases = aliases_of([tree for _, tree, _ in parsed])
    sockets = frozenset().union(*(socket_names(tree, Scanner(aliases, ())) for _, tree, _ in parsed))

    # Breadth-first over the import graph, so each module's recorded chain is a shortest one.
    # A chain lists import sites: ("nb:cell 2 line 1", "pipeline.infer line 3", ...).
    queue: deque[tuple[str, tuple[str, ...]]] = deque()
    seen: set[str] = {context} if context is not None else set()

    def follow(
        events: list[ImportEvent],
        module: str | None,
        file: str,
        offset: int = 0,
        cell: int | None = None,
        chain: tuple[str, ...] = (),
    ) -> None:
        """Queue the project modules that the imports `events` of the target (`module` None) or of `module`
        execute; report those that must exist but are not found."""
        for event in events:
            line = event.line + offset
            site = f"{module} line {line}" if module else location(file, line, cell)
            for name, must_exist in project.resolve(event, module or context):
                if name in seen:
                    continue
                seen.add(name)
                if project.file(name) is not None:
                    queue.append((name, (*chain, site)))
                elif must_exist and not project.exists(name):  # else a namespace package: nothing to read
                    message = (
                        f"project module `{name}` is imported but not found under {project.root} "
                        "(pass --root); it could not be checked"
                    )
                    report.findings.append(
                        Finding(file, line, RULE_UNRESOLVED, message, cell, (*chain, site) if module else ())
                    )

    for unit, tree, shells in parsed:
        scan = Scanner(aliases, local_dirs, sockets).run(tree, shells)
        for line, rule, message in scan.problems:
            report.findings.append(Finding(shown, line + unit.line_offset, rule, message, unit.cell))
        follow(scan.imports, None, shown, unit.line_offset, unit.cell)

    while queue:
        module, chain = queue.popleft()
        file = project.file(module)
        assert file is not None  # only modules with a file are queued
        shown_file = _display(file)
        report.modules.append(module)
        try:
            tree = ast.parse(file.read_bytes(), shown_file)
        except (SyntaxError, ValueError) as exc:  # ValueError: null bytes on older Pythons
            line = getattr(exc, "lineno", None) or 1
            message = f"cannot parse {module} ({getattr(exc, 'msg', exc)}); the checker cannot verify it"
            report.findings.append(
                Finding(shown_file, line, RULE_SYNTAX, message, chain=(*chain, f"{module} line {line}"))
            )
            continue
        scan = Scanner(aliases_of([tree]), local_dirs).run(tree)
        for line, rule, message in scan.problems:
            if rule == RULE_XLA:  # guarded or not, the import is in the notebook's import graph
                message += f"; the notebook imports {module}, so move this out of its import graph"
            report.findings.append(
                Finding(shown_file, line, rule, message, chain=(*chain, f"{module} line {line}"))
            )
        follow(scan.imports, module, shown_file, chain=chain)

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
    status = 0
    for target in args.targets:
        try:
            report = analyse(target, args.root, args.packages or DEFAULT_PACKAGES)
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
