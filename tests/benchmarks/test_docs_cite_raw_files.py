"""Every raw file README.md and docs/measurements.md cite is in the repository: a figure's trace ends in a file."""

from __future__ import annotations

import itertools
import re

from benchmarks import ROOT

DOCS = ("README.md", "docs/measurements.md")
# `benchmarks/raw/x.json`, `raw/x.json`, `cpu/x_{0,1,2}_2cores.json`, `benchmarks/raw/suite_*.log`
CITED = re.compile(r"`((?:benchmarks/)?(?:raw|cpu|gpu)/[^`\s]+\.(?:json|log))`")


def expand(cited: str) -> list[str]:
    """`a_{0,1}_b` -> a_0_b, a_1_b (every brace group)."""
    parts = re.split(r"\{([^}]*)\}", cited)
    choices = [part.split(",") if k % 2 else [part] for k, part in enumerate(parts)]
    return ["".join(combo) for combo in itertools.product(*choices)]


def cited_files() -> list[tuple[str, str]]:
    found = []
    for doc in DOCS:
        for match in CITED.finditer((ROOT / doc).read_text()):
            if "<" not in match.group(1):  # `raw/<section>.json`: a pattern, not a file
                found += [(doc, name) for name in expand(match.group(1))]
    return found


def test_every_raw_file_the_docs_cite_is_in_the_repository():
    cited = cited_files()
    assert len(cited) > 50  # the pattern still finds the citations
    missing = [
        f"{doc} cites {name}"
        for doc, name in sorted(set(cited))
        if not list(ROOT.glob(name if name.startswith("benchmarks/") else f"benchmarks/{name}"))
    ]
    assert not missing, "not in the repository: " + "; ".join(missing)
