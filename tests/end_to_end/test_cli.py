import subprocess
import sys

from helpers import ROOT


def run_cli(*args):
    return subprocess.run([sys.executable, "-m", "pipeline", *args], cwd=ROOT, capture_output=True, text=True)


def test_synthetic_then_score_prints_accuracy_last(tmp_path):
    out = tmp_path / "data"
    made = run_cli("data", "synthetic", "--out", str(out), "--seed", "1")
    assert made.returncode == 0, made.stderr
    scored = run_cli(
        "score", "--submission", str(out / "solution.csv"), "--solution", str(out / "solution.csv")
    )
    assert scored.stdout.strip().splitlines()[-1] == "accuracy=1.0000"
    wrong = run_cli(
        "score", "--submission", str(out / "sample_submission.csv"), "--solution", str(out / "solution.csv")
    )
    value = float(wrong.stdout.strip().splitlines()[-1].split("=")[1])
    assert 0.0 <= value < 1.0


def test_check_safety_passes_on_the_infer_notebook():
    run = run_cli("check-safety", "notebooks/infer.ipynb")
    assert run.returncode == 0, run.stdout + run.stderr
    assert "submission-safe" in run.stdout


def test_score_is_exact_and_user_errors_are_one_line_with_exit_code_2(tmp_path):
    """Issue 14: score stripped spaces (0.6250 where exact is 0.5208) and printed tracebacks for user errors."""
    (tmp_path / "solution.csv").write_text("id,label\n1, spaced \n2,x\n")
    (tmp_path / "sub.csv").write_text("id,label\n1,spaced\n2,x\n")
    scored = run_cli(
        "score", "--submission", str(tmp_path / "sub.csv"), "--solution", str(tmp_path / "solution.csv")
    )
    assert scored.stdout.strip().splitlines()[-1] == "accuracy=0.5000"
    missing = run_cli(
        "score", "--submission", str(tmp_path / "nope.csv"), "--solution", str(tmp_path / "solution.csv")
    )
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    assert missing.stderr.startswith("error: ") and "nope.csv: file not found" in missing.stderr
    assert "competition folder" not in missing.stderr
    (tmp_path / "dup.csv").write_text("id,label\n1,a\n1,b\n")
    dup = run_cli(
        "score", "--submission", str(tmp_path / "dup.csv"), "--solution", str(tmp_path / "solution.csv")
    )
    assert (
        dup.returncode == 2 and len(dup.stderr.strip().splitlines()) == 1 and "duplicate id '1'" in dup.stderr
    )
