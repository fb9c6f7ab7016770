"""benchmarks/code_size.py: code lines leave out what explains the code, and two layouts of the same code measure
alike (what makes sizes before and after `# fmt: skip` was dropped comparable)."""

from __future__ import annotations

import subprocess

from benchmarks.code_size import code_lines, measure

SOURCE = '''"""A module docstring
over two lines."""

import os  # a comment after code counts as code

# a comment alone


def f(x):
    """A docstring."""
    text = """a string that is assigned
    is code"""
    return os.path.join(x, text)
'''


def test_code_lines_leave_out_blank_lines_comments_and_docstrings():
    assert code_lines(SOURCE) == 5  # import, def, the assignment's two lines, return


def test_two_layouts_of_the_same_code_measure_alike(tmp_path):
    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=tmp_path, check=True, capture_output=True, text=True)
        return done.stdout.strip()

    git("init", "-q")
    (tmp_path / "pyproject.toml").write_text("[tool.ruff]\nline-length = 40\n")
    package = tmp_path / "pkg" / "sub"
    package.mkdir(parents=True)
    one_line = "TABLE = {'a': 1, 'b': 2, 'c': 3, 'd': 4, 'e': 5}  # fmt: skip\n"
    (package / "m.py").write_text(one_line)
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one line")
    first = measure("HEAD", "pkg", repo=tmp_path)
    laid_out = "".join(["TABLE = {\n", *(f'    "{k}": {v},\n' for v, k in enumerate("abcde", 1)), "}\n"])
    (package / "m.py").write_text(laid_out)
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-am", "laid out")
    second = measure("HEAD", "pkg", repo=tmp_path)
    assert first["lines"] == second["lines"] == 7 and first["code_lines"] == second["code_lines"] == 7
    assert (
        first["by_folder"] == {"sub": {"lines": 7, "code_lines": 7}} and first["commit"] != second["commit"]
    )
    assert (package / "m.py").read_text() == laid_out  # the checkout itself is left as it was
