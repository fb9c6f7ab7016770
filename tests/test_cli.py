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
