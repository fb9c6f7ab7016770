"""Training at real size: memory that does not grow with the data, decoding once, time to the first step,
throughput and data wait -- and, on paper, how many host cores keep a TPU v5e-8 fed.

    python -m benchmarks.scale [--quick] [--baseline COMMIT] [--out DIR]

Folders of 3 s synthetic speech clips at 8 kHz, WAV and FLAC alternating (`pipeline.demo_data.synthetic.folder_of_hours`),
of 1.7 h (2,040 clips) and 16.7 h (20,040 clips), made once under benchmarks/out/scale/. Each run is the train
notebook through papermill, as a user runs it, with `-p epochs 1` (cold cache) or 2 (warm: epoch 2 is the
steady state), measured as a whole process tree:

- peak private memory: RssAnon of papermill, the kernel and every process below it (DDP ranks, DataLoader
  workers, the decoding pool), sampled every 0.25 s and summed; memory maps (the audio cache) are file-backed
  and not counted, as the kernel can drop them;
- cache build time (cold) and reuse (warm), from the notebook's log;
- time from launching papermill to the end of the first training step (the history's `first_step_at`);
- steady samples/s and the share of step time spent waiting for data (epoch 2 of the history);
- the same with `-p accelerator cpu -p devices 2` (two gloo DDP ranks);
- the cold run's epoch-1 model through the infer notebook on the folder's test ids: peak private memory,
  wall time, and accuracy scored exactly against the folder's solution.csv.

`--baseline COMMIT` runs the same folders through another commit's notebook (a git worktree, its own pipeline
package first on PYTHONPATH): the in-memory loop this replaced, measured on the same machine in the same run.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks" / "out" / "scale"
SIZES_HOURS = (1.7, 16.7)
QUICK_HOURS = (0.1, 0.5)


def folder(hours: float) -> Path:
    from pipeline.demo_data.synthetic import folder_of_hours

    target = OUT / f"data-{hours:g}h"
    if not (target / "train.csv").is_file():
        started = time.perf_counter()
        folder_of_hours(target, hours, clip_seconds=3.0, n_speakers=50, sample_rates=(8000,),
                        formats=("wav", "flac"), overwrite=True)  # fmt: skip
        print(f"made {target} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return target


def rss_anon(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as handle:
            match = re.search(r"RssAnon:\s+(\d+) kB", handle.read())
        return int(match.group(1)) * 1024 if match else 0
    except OSError:
        return 0


def run_measured(argv: list[str], env: dict[str, str], cwd: Path, timeout: float = 3600) -> dict[str, Any]:
    """Run `argv`; its wall time, exit code, output, and the peak of its process tree's summed RssAnon."""
    import psutil

    launched = time.time()
    process = subprocess.Popen(
        argv, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    peak, done = [0], threading.Event()

    def sample() -> None:
        root = psutil.Process(process.pid)
        while not done.is_set():
            try:
                pids = [process.pid, *(child.pid for child in root.children(recursive=True))]
            except psutil.Error:
                pids = [process.pid]
            peak[0] = max(peak[0], sum(rss_anon(pid) for pid in pids))
            done.wait(0.25)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        output, _ = process.communicate(timeout=timeout)
    finally:
        done.set()
        sampler.join()
    return {"returncode": process.returncode, "seconds": time.time() - launched, "launched": launched,
            "peak_private_gb": round(peak[0] / 1e9, 3), "output": output}  # fmt: skip


def papermill(repo: Path, notebook: str, work: Path, params: dict[str, Any],
              env_extra: dict[str, str] | None = None) -> dict[str, Any]:  # fmt: skip
    """One papermill run of `notebook`, measured (run_measured); stops with its output if it fails."""
    argv = [str(Path(sys.executable).parent / "papermill"), str(repo / "notebooks" / notebook),
            str(work / f"{Path(notebook).stem}-{time.time_ns()}.ipynb"), "--log-output"]  # fmt: skip
    for name, value in params.items():
        argv += ["-p", name, str(value)]
    measured = run_measured(argv, {**os.environ, **(env_extra or {})}, repo)
    if measured["returncode"] != 0:
        raise RuntimeError(f"{notebook} failed: {measured['output'][-3000:]}")
    return measured


def train_notebook(repo: Path, data: Path, work: Path, epochs: int, devices: int | None = None,
                   cache: Path | None = None, env_extra: dict[str, str] | None = None,
                   keep: Path | None = None) -> dict[str, Any]:  # fmt: skip
    """Train through the notebook; the artifact is removed unless `keep` names where it goes."""
    artifact = keep or work / f"model-{time.time_ns()}"
    params = {
        "data_dir": data,
        "artifact_dir": artifact,
        "epochs": epochs,
        "accelerator": "cpu",
        "progress": False,
    }
    if devices:
        params["devices"] = devices
    if cache is not None:
        params["cache_dir"] = cache
    measured = papermill(repo, "train.ipynb", work, params, env_extra)
    history = json.loads((artifact / "manifest.json").read_text())["provenance"]["history"]
    built = re.search(r"audio cache: .* built in (\d+) s", measured["output"])
    result = {
        "peak_private_gb": measured["peak_private_gb"],
        "wall_s": round(measured["seconds"], 1),
        "cache_build_s": float(built.group(1)) if built else None,
        "cache_reused": "audio cache: reusing" in measured["output"],
        "best_val_accuracy": max((r.get("val_accuracy", 0) for r in history), default=None),
    }
    first = history[0]
    if "first_step_at" in first:
        result["launch_to_first_step_s"] = round(first["first_step_at"] - measured["launched"], 1)
    steady = history[-1]
    for key in ("samples_per_s", "data_wait_share", "step_ms", "data_wait_ms"):
        if key in steady:
            result[key] = steady[key]
    if len(history) > 1:  # the same measure for any version: one epoch of steps plus its validation
        result["epoch2_s"] = round(history[1]["seconds"] - history[0]["seconds"], 1)
    if keep is None:
        shutil.rmtree(artifact, ignore_errors=True)
    return result


def infer_notebook(data: Path, artifact: Path, work: Path) -> dict[str, Any]:
    """Predict the folder's test set through the infer notebook and score it exactly against solution.csv."""
    from pipeline.tooling.scoring import score_submission

    submission = work / f"submission-{time.time_ns()}.csv"
    params = {"data_dir": data, "artifact_dir": artifact, "submission_path": submission, "progress": False}
    measured = papermill(ROOT, "infer.ipynb", work, params)
    files = sum(1 for _ in open(data / "test.csv")) - 1
    return {"test_files": files, "peak_private_gb": measured["peak_private_gb"],
            "wall_s": round(measured["seconds"], 1), "files_per_s_incl_start": round(files / measured["seconds"], 1),
            "test_accuracy": round(score_submission(submission, data / "solution.csv")[1], 4)}  # fmt: skip


def host_feed_per_core(windows: int = 256) -> dict[str, float]:
    """Windows per second one core makes for a training step: crops from the cache, and crops + Fbank
    features (what XLA's workers do), timed on one thread in this process."""
    import numpy as np
    import torch

    from pipeline.core.model import Frontend
    from pipeline.training.batches import crops
    from pipeline.training.store import open_or_build, source_files

    torch.set_num_threads(1)
    data = folder(QUICK_HOURS[0])
    names = [line.split(",")[0] for line in (data / "train.csv").read_text().splitlines()[1:]]
    with tempfile.TemporaryDirectory() as cache:
        store = open_or_build(source_files(data, names), cache, log=lambda *_: None)
        items = np.arange(len(store)) % len(store)
        rng = np.random.default_rng(0)
        started = time.perf_counter()
        for _ in range(4):
            wavs, lens, _ = crops(store, rng.choice(items, windows), 16000, rng)
        crop_rate = 4 * windows / (time.perf_counter() - started)
        frontend = Frontend(80)
        started = time.perf_counter()
        with torch.no_grad():
            for _ in range(4):
                wavs, lens, _ = crops(store, rng.choice(items, windows), 16000, rng)
                frontend(wavs, lens)
        feature_rate = 4 * windows / (time.perf_counter() - started)
    return {"crop_windows_per_s": round(crop_rate), "crop_and_fbank_windows_per_s": round(feature_rate)}


def tpu_paper_estimate(feature_rate: float) -> dict[str, Any]:
    """Host cores a v5e-8 needs for the voxceleb preset at 128 windows per chip, from benchmarks/xla_step's
    figures: the device step, and the step as it runs today (the Python trace of ~0.1-0.2 s dominates)."""
    from benchmarks.xla_step import ASSUMED_UTILISATION, V5E_CHIP_BF16_FLOPS, train_flops_per_window

    device_s = 128 * train_flops_per_window() / (V5E_CHIP_BF16_FLOPS * ASSUMED_UTILISATION)
    rows = {}
    for name, step_s in (("device-bound step", device_s), ("trace-bound step (0.15 s)", 0.15)):
        needed = 8 * 128 / step_s
        rows[name] = {"step_ms": round(1000 * step_s, 1), "windows_per_s": round(needed),
                      "host_cores": round(needed / feature_rate, 1)}  # fmt: skip
    return rows


def run(quick: bool = False, baseline: str | None = None) -> dict[str, Any]:
    hours = QUICK_HOURS if quick else SIZES_HOURS
    results: dict[str, Any] = {"sizes_hours": list(hours)}
    OUT.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="scale-", dir=OUT) as tmp:
        work = Path(tmp)
        for size in hours:
            data = folder(size)
            cache = work / f"cache-{size:g}"
            row: dict[str, Any] = {"train_clips": sum(1 for _ in open(data / "train.csv")) - 1}
            artifact = work / f"model-{size:g}h-epoch1"
            row["cold_1p"] = train_notebook(ROOT, data, work, epochs=1, cache=cache, keep=artifact)
            row["infer"] = infer_notebook(data, artifact, work)  # the epoch-1 model on the folder's test ids
            row["warm_1p"] = train_notebook(ROOT, data, work, epochs=2, cache=cache)
            row["warm_2ranks"] = train_notebook(ROOT, data, work, epochs=2, devices=2, cache=cache)
            results[f"{size:g}h"] = row
            print(f"{size:g} h: {json.dumps(row)}", file=sys.stderr)
        if baseline:
            results["baseline"] = run_baseline(baseline, hours, work)
    small, large = (results[f"{h:g}h"] for h in hours)
    ratios = {}
    for mode in ("warm_1p", "warm_2ranks", "infer"):
        ratios[f"memory_{mode}"] = round(large[mode]["peak_private_gb"] / small[mode]["peak_private_gb"], 2)
    ratios["infer_seconds"] = round(large["infer"]["wall_s"] / small["infer"]["wall_s"], 2)
    ratios["infer_test_files"] = round(large["infer"]["test_files"] / small["infer"]["test_files"], 2)
    if baseline:
        base_large = results["baseline"][f"{hours[1]:g}h"]["1p"]
        ratios["epoch2_vs_baseline"] = round(large["warm_1p"]["epoch2_s"] / base_large["epoch2_s"], 2)
        ratios["memory_vs_baseline"] = round(
            large["warm_1p"]["peak_private_gb"] / base_large["peak_private_gb"], 2
        )
    results["ratios"] = ratios
    feed = host_feed_per_core()
    results["host_feed_per_core"] = feed
    results["tpu_v5e8_voxceleb_on_paper"] = tpu_paper_estimate(feed["crop_and_fbank_windows_per_s"])
    big = results[f"{hours[1]:g}h"]
    results["headline"] = (
        f"{hours[1]:g} h: peak private memory {big['warm_1p']['peak_private_gb']:.2f} GB (x{ratios['memory_warm_1p']} "
        f"the {hours[0]:g} h run), 2 ranks {big['warm_2ranks']['peak_private_gb']:.2f} GB "
        f"(x{ratios['memory_warm_2ranks']}); cache built in {big['cold_1p']['cache_build_s']} s, warm launch to "
        f"first step {big['warm_1p'].get('launch_to_first_step_s')} s; data wait "
        f"{big['warm_1p'].get('data_wait_share', 0):.1%}; epoch-1 model's test accuracy "
        f"{big['infer']['test_accuracy']:.4f}, inference memory x{ratios['memory_infer']} for "
        f"x{ratios['infer_test_files']} the test files"
    )  # fmt: skip
    return results


def run_baseline(commit: str, hours: tuple[float, ...], work: Path) -> dict[str, Any]:
    """The same folders through `commit`'s own notebook and package (it decodes every clip into RAM)."""
    tree = work / "baseline"
    subprocess.run(["git", "worktree", "add", "--detach", str(tree), commit], cwd=ROOT, check=True,
                   capture_output=True)  # fmt: skip
    try:
        env = {"PYTHONPATH": str(tree)}
        rows = {}
        for size in hours:
            rows[f"{size:g}h"] = {"1p": train_notebook(tree, folder(size), work, epochs=2, env_extra=env)}
        return {"commit": commit, **rows}
    finally:
        subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT, capture_output=True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    parser.add_argument(
        "--baseline", help="a commit to measure the same way (e.g. 8a49356, before the cache)"
    )
    args = parser.parse_args(argv)
    print(json.dumps(run(quick=args.quick, baseline=args.baseline), indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
