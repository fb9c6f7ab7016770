"""The project: finding the package's modules on disk (never importing them)."""

from __future__ import annotations

import ast
import sys
from collections.abc import Sequence
from importlib.machinery import PathFinder
from pathlib import Path

from .scanner import ImportEvent


class Project:
    def __init__(self, root: Path, packages: Sequence[str]) -> None:
        self.root = root
        self.packages = tuple(packages)
        self.dirs = {name: path for name in self.packages if (path := self._locate(name)) is not None}

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
        return base.with_suffix(".py") if base.with_suffix(".py").is_file() and len(parts) > 1 else None

    def exists(self, module: str) -> bool:
        return self.file(module) is not None or self.is_package(module)

    def is_package(self, module: str) -> bool:
        parts = module.split(".")
        top = self.dirs.get(parts[0])
        return top is not None and top.joinpath(*parts[1:]).is_dir()

    def module_name(self, path: Path) -> str | None:
        """Dotted name of a file inside one of the packages (so a module can be a target)."""
        path = path.resolve()
        for name, top in self.dirs.items():
            if path.is_relative_to(top.resolve()):
                rel = path.relative_to(top.resolve()).with_suffix("")
                return ".".join([name, *rel.parts]).removesuffix(".__init__")
        return None

    def star_names(self, module: str) -> tuple[str, ...]:
        """Literal ``__all__`` of a package (a star import of a package imports those submodules)."""
        if (path := self.file(module)) is None:
            return ()
        try:
            tree = ast.parse(path.read_bytes())
        except (SyntaxError, ValueError):
            return ()
        for node in tree.body:
            if isinstance(node, ast.Assign) and "__all__" in (getattr(t, "id", None) for t in node.targets):
                try:
                    value = ast.literal_eval(node.value)
                except ValueError:
                    return ()
                return tuple(v for v in value if isinstance(v, str))
        return ()

    def resolve(self, event: ImportEvent, context: str | None) -> list[tuple[str, bool]]:
        """Project modules an import executes, parents first, as ``(name, must_exist)``."""
        if event.level:
            if context is None:
                return []
            parts = context.split(".") if self.is_package(context) else context.split(".")[:-1]
            parts = parts[: len(parts) - (event.level - 1)]  # each dot beyond the first goes up a package
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
        # `from pkg import x` imports the submodule x if there is one
        subs = (f"{base}.{name}" for name in names)
        return out + [(sub, False) for sub in subs if self.exists(sub)]
