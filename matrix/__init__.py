"""The version matrix: `python -m matrix.run` (see matrix/run.py and pipeline/tooling/versions.py)."""
