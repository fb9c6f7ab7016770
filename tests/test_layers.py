"""The package's layers (README, design): every module imports only the layers below its own.

    core          imports nothing else of pipeline
    devices       core
    teachers      core (pretrained models that teach: never devices)
    training      core, devices, teachers (never inference)
    inference     core, devices, teachers (never training)
    rounds        training and inference (the train notebook's stage above both)
    tooling       anything below (never demo_data)
    demo_data     anything below (never tooling)
    safety        nothing else of pipeline (a stand-alone checker)
    pipeline/__main__.py (the CLI) and pipeline/model.py (old artifacts' class paths) sit on top; nothing
    imports pipeline.model.

Read from the source with ast (nothing is imported), imports inside functions and TYPE_CHECKING blocks included.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parents[1] / "pipeline"
RANK = {
    "core": 0,
    "devices": 1,
    "teachers": 1,
    "training": 2,
    "inference": 2,
    "rounds": 3,
    "tooling": 4,
    "demo_data": 4,
}
TOP = {"__main__", "__init__", "model"}  # modules directly in pipeline/


def layer(module: str) -> str:
    """The layer of a dotted module name under pipeline ("top" for pipeline/__main__.py and the like)."""
    parts = module.split(".")
    if len(parts) == 1 or parts[1] in TOP:
        return "top"
    return parts[1]


def imported_modules(path: Path) -> list[tuple[int, str]]:
    """(line, absolute module) of every pipeline import in the file; `from X import name` counts X.name when
    that is a module of its own."""
    relative = path.relative_to(PACKAGE.parent).with_suffix("")
    own = list(relative.parts)
    package = own[:-1]  # the package a relative import starts from (a package's own for __init__.py)
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found += [
                (node.lineno, alias.name) for alias in node.names if alias.name.split(".")[0] == "pipeline"
            ]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            if module.split(".")[0] != "pipeline":
                continue
            for alias in node.names:
                candidate = PACKAGE.parent.joinpath(*module.split("."), alias.name)
                is_module = candidate.with_suffix(".py").is_file() or (candidate / "__init__.py").is_file()
                found.append((node.lineno, f"{module}.{alias.name}" if is_module else module))
    return found


def violation(importer: str, imported: str) -> str | None:
    """Why `importer` may not import `imported`, or None."""
    mine, theirs = layer(importer), layer(imported)
    if imported == "pipeline.model" or imported.startswith("pipeline.model."):
        return "pipeline.model only keeps old artifacts' class paths: import pipeline.core.model"
    if mine == theirs or imported == "pipeline":
        return None
    if mine == "top":
        return None
    if mine == "safety" or theirs == "safety":
        return "pipeline.safety stands alone"
    if theirs == "top":
        return f"{theirs} is above every layer"
    if RANK[theirs] > RANK[mine]:
        return f"{theirs} is above {mine}"
    if RANK[theirs] == RANK[mine]:
        return f"{mine} and {theirs} are siblings: neither imports the other"
    return None


def modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def test_every_subpackage_has_a_layer():
    folders = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    assert folders == set(RANK) | {"safety"}


@pytest.mark.parametrize("path", modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_a_module_imports_only_layers_below_its_own(path):
    importer = ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts).removesuffix(".__init__")
    problems = [f"{path.relative_to(PACKAGE.parent)}:{line}: imports {imported} ({why})"
                for line, imported in imported_modules(path)
                if (why := violation(importer, imported))]  # fmt: skip
    assert not problems, "\n".join(problems)


def test_every_imported_module_is_in_the_tree():
    """An import of a module that moved must fail here, not be served by another copy of the package (an
    editable install of another checkout serves any module this tree lacks)."""
    missing = []
    for path in modules():
        for line, imported in imported_modules(path):
            target = PACKAGE.parent.joinpath(*imported.split("."))
            if not (target.with_suffix(".py").is_file() or (target / "__init__.py").is_file()):
                missing.append(f"{path.relative_to(PACKAGE.parent)}:{line}: {imported}")
    assert not missing, "\n".join(missing)


@pytest.mark.parametrize(
    ("importer", "imported"),
    [
        ("pipeline.core.windows", "pipeline.devices.launch"),
        ("pipeline.core.model", "pipeline.training.dataset"),
        ("pipeline.devices.policy", "pipeline.training.train"),
        ("pipeline.training.validation", "pipeline.inference.predict"),
        ("pipeline.inference.rows", "pipeline.training.dataset"),
        ("pipeline.training.train", "pipeline.tooling.notebook"),
        ("pipeline.tooling.doctor", "pipeline.demo_data.synthetic"),
        ("pipeline.inference.submission", "pipeline.model"),
        ("pipeline.core.config", "pipeline.__main__"),
        ("pipeline.safety.check", "pipeline.core.config"),
    ],
)
def test_the_rule_refuses_an_import_from_above_or_from_a_sibling(importer, imported):
    assert violation(importer, imported)


def test_an_import_from_above_is_found_in_the_source(tmp_path, monkeypatch):
    """The check reads real files: a core module that imports training, relatively and inside a function."""
    fake = tmp_path / "pipeline"
    (fake / "core").mkdir(parents=True)
    (fake / "training").mkdir()
    for folder in (fake, fake / "core", fake / "training"):
        (folder / "__init__.py").write_text("")
    (fake / "training" / "dataset.py").write_text("")
    bad = fake / "core" / "config.py"
    bad.write_text("def f():\n    from ..training import dataset\n    return dataset\n")
    monkeypatch.setattr(sys.modules[__name__], "PACKAGE", fake)
    assert imported_modules(bad) == [(2, "pipeline.training.dataset")]
    assert violation("pipeline.core.config", "pipeline.training.dataset") == "training is above core"


def module_name(path: Path) -> str:
    return ".".join(path.relative_to(PACKAGE.parent).with_suffix("").parts)


def test_the_infer_stage_has_no_import_cycle():
    """Issue 33: the infer stage reads in one direction (rows, runtime -> engines -> predict -> submission)."""
    inference = {module_name(p): p for p in (PACKAGE / "inference").glob("*.py")}
    edges = {
        name: {m for _, m in imported_modules(path) if m in inference} for name, path in inference.items()
    }
    for start in edges:
        seen, todo = set(), list(edges[start])
        while todo:
            current = todo.pop()
            assert current != start, f"{start} imports a module that imports it"
            if current not in seen:
                seen.add(current)
                todo += edges[current]


@pytest.mark.parametrize("path", sorted((PACKAGE / "inference").glob("*.py")), ids=lambda p: p.name)
def test_no_function_of_the_infer_stage_takes_more_than_six_positional_parameters(path):
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            positional = [
                a.arg for a in node.args.posonlyargs + node.args.args if a.arg not in ("self", "cls")
            ]
            assert len(positional) <= 6, f"{path.name}:{node.lineno} {node.name}({', '.join(positional)})"
