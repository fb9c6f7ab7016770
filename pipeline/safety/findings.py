"""What check-safety reports: the rules, one finding, the report for one target."""

from __future__ import annotations

from dataclasses import dataclass, field

RULE_XLA = "xla-import"
RULE_PIP = "pip-online"
RULE_DOWNLOAD = "download"
RULE_SYNTAX = "syntax-error"
RULE_UNRESOLVED = "unresolved"

DEFAULT_PACKAGES: tuple[str, ...] = ("pipeline",)


def location(path: str, line: int, cell: int | None = None) -> str:
    """``path:cell C line L`` for notebook cells, ``path:L`` for files."""
    return f"{path}:cell {cell} line {line}" if cell is not None else f"{path}:{line}"


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
        return location(self.path, self.line, self.cell)

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
        if n := len(self.findings):
            return f"check-safety: {n} problem{'s' if n != 1 else ''} in {self.target}"
        mods = f"{len(self.modules)} modules checked"
        if self.modules:
            mods += ": " + ", ".join(self.modules)
        return f"check-safety: {self.target} is submission-safe ({mods})"


class SafetyError(Exception):
    """The target cannot be read at all (not a notebook, invalid JSON, ...)."""
