"""How large pipeline/ is at several commits, measured alike: each commit's pipeline/ laid out by today's
formatter, then counted as lines and as code lines, per folder.

    python -m benchmarks.code_size [--commits 8fb5cdf c0f3504 HEAD] [--out FILE]

Why: issue 49 holds pipeline/ to its size at filing (8fb5cdf), whose 314 `# fmt: skip` lines kept tables and
calls on one line each; since then ruff format owns the layout, so a plain `wc -l` mixes a layout change into the
comparison. Here every commit's files get the same layout first: `# fmt: skip` dropped, then `ruff format` with
this checkout's pyproject.toml. Code lines leave out blank lines, comments and docstrings (any string that stands
alone as a statement), so a longer explanation does not count as more code.
"""

from __future__ import annotations

import argparse
import io
import re
import subprocess
import sys
import tarfile
import tempfile
import tokenize
from pathlib import Path
from typing import Any

from benchmarks import print_result

ROOT = Path(__file__).resolve().parents[1]
# The commit issue 49 was filed at, the one that added the pretrained teachers (issue 50, part 1), and today.
DEFAULT_COMMITS = ("8fb5cdf", "c0f3504", "HEAD")
FMT_SKIP = re.compile(r"[ \t]*# fmt: skip")
# Tokens that start a statement: a string right after one of them is a docstring or a bare string.
STATEMENT_START = {tokenize.NEWLINE, tokenize.NL, tokenize.INDENT, tokenize.DEDENT, tokenize.ENCODING}
NOT_CODE = STATEMENT_START | {tokenize.COMMENT, tokenize.ENDMARKER}


def code_lines(source: str) -> int:
    """Lines that hold code: not blank, not only a comment, not part of a string standing alone as a statement."""
    lines: set[int] = set()
    previous = tokenize.NEWLINE
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type in NOT_CODE:
            previous = token.type if token.type in STATEMENT_START else previous
            continue
        standing_alone = token.type == tokenize.STRING and previous in STATEMENT_START
        if not standing_alone:
            lines.update(range(token.start[0], token.end[0] + 1))
        previous = token.type
    return len(lines)


def laid_out(commit: str, folder: str, scratch: Path, repo: Path = ROOT) -> Path:
    """`folder` of `commit`, extracted under `scratch` and formatted as this checkout formats it."""
    archive = subprocess.run(["git", "archive", commit, folder], cwd=repo, capture_output=True, check=True)
    with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
        tar.extractall(scratch, filter="data")
    for path in (scratch / folder).rglob("*.py"):
        path.write_text(FMT_SKIP.sub("", path.read_text(encoding="utf-8")), encoding="utf-8")
    config = repo / "pyproject.toml"
    subprocess.run(
        [sys.executable, "-m", "ruff", "format", "--quiet", "--config", str(config), str(scratch / folder)],
        check=True,
    )
    return scratch / folder


def measure(commit: str, folder: str = "pipeline", repo: Path = ROOT) -> dict[str, Any]:
    """Lines and code lines of `folder` at `commit`, in all and per subfolder (files at its top: "(top)")."""
    with tempfile.TemporaryDirectory() as scratch:
        tree = laid_out(commit, folder, Path(scratch), repo)
        by_folder: dict[str, dict[str, int]] = {}
        for path in sorted(tree.rglob("*.py")):
            parts = path.relative_to(tree).parts
            part = by_folder.setdefault(
                parts[0] if len(parts) > 1 else "(top)", {"lines": 0, "code_lines": 0}
            )
            source = path.read_text(encoding="utf-8")
            part["lines"] += len(source.splitlines())
            part["code_lines"] += code_lines(source)
    resolved = subprocess.run(
        ["git", "rev-parse", "--short", commit], cwd=repo, capture_output=True, text=True, check=True
    )
    return {
        "commit": resolved.stdout.strip(),
        "lines": sum(p["lines"] for p in by_folder.values()),
        "code_lines": sum(p["code_lines"] for p in by_folder.values()),
        "by_folder": dict(sorted(by_folder.items())),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--commits", nargs="+", default=list(DEFAULT_COMMITS))
    parser.add_argument("--out", type=Path, help="also write the result here (JSON)")
    args = parser.parse_args()
    sizes = {commit: measure(commit) for commit in args.commits}
    layout = "ruff format with this checkout's pyproject.toml, # fmt: skip dropped"
    print_result({"layout": layout, "sizes": sizes}, args.out)


if __name__ == "__main__":
    main()
