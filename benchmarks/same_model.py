"""Does a change leave training alone where it was meant to? The same tables, trained through the train notebook
at two commits with the same seed, compared tensor by tensor.

    python -m benchmarks.same_model --before COMMIT [--tables synthetic,fsdd,esc10,soundscapes] [--epochs 2]
                                    [--out FILE]

Each table is built once by today's code (`python -m pipeline data ...`, benchmarks/esc10.py's fold 1), then
`papermill notebooks/train.ipynb` runs on it from a worktree of COMMIT (its own `pipeline`, first on PYTHONPATH)
and from this checkout, with `epochs` fixed and every other parameter left to the notebook's defaults (the
soundscapes with BirdCLEF's table names and noise_dir), each side decoding into an audio cache of its own
(since 2026-11-30: before, the second side read the first side's cache, so decoding was compared only at
inference). Training on the CPU is deterministic in the seed, so a change that was not meant to touch a kind
of data must give bit-identical `model.safetensors`: then every accuracy measured on that kind before the
change still holds, without training it again. The config each run resolved (the artifact's provenance) is
compared too, so a changed `auto` shows even where the tensors agree.
Then each side's infer notebook predicts from its own artifact (on torch: the int8 race may pick either engine)
and the two submission files are compared byte for byte.

    synthetic     the embedded demo (make demo's table): short clips, 'other'
    fsdd          FSDD speakers (../shared/fsdd): speech, 'other'
    esc10         ESC-10's fold 1 as test (../shared/esc10): 'sound events', the 36-epoch recipe (here 2)
    soundscapes   FSDD speakers as species in BirdCLEF's layout, with unlabelled soundscapes: 3 members, PCEN
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import print_result
from benchmarks.scale import papermill

ROOT = Path(__file__).resolve().parents[1]
SHARED = ROOT.parent / "shared"
TABLES = ("synthetic", "fsdd", "esc10", "soundscapes")
BIRDCLEF = {"train_table": "train.csv", "path_column": "filename", "label_column": "primary_label",
            "audio_dir": "train_audio", "secondary_labels_column": "secondary_labels",
            "noise_dir": "train_soundscapes"}  # fmt: skip
# Provenance fields that name where things were, not how the model was trained.
PLACES = ("artifact_dir", "checkpoint_dir", "data_dir")


def build(name: str, out: Path) -> Path:
    """The table `name` as a competition folder under `out`, by today's code."""
    folder = out / name
    if name == "synthetic":
        from pipeline.demo_data.synthetic import make_synthetic_competition

        make_synthetic_competition(folder)
    elif name == "fsdd":
        from pipeline.demo_data.fsdd import make_fsdd_competition

        make_fsdd_competition(SHARED / "fsdd", folder, task="speaker")
    elif name == "esc10":
        from benchmarks.esc10 import make_fold_folder, scan

        make_fold_folder(scan(SHARED / "esc10"), 1, folder)
    elif name == "soundscapes":
        argv = ["--out", str(folder), "--fsdd", str(SHARED / "fsdd" / "recordings")]
        subprocess.run([sys.executable, "-m", "pipeline", "data", "soundscapes", *argv], check=True, cwd=ROOT)
    else:
        raise ValueError(f"table {name!r}: not one of {', '.join(TABLES)}")
    return folder


def notebook(code: Path, name: str, work: Path, params: dict[str, Any]) -> float:
    """`name` (train.ipynb, infer.ipynb) of the checkout at `code`, its `pipeline` first on PYTHONPATH; seconds."""
    return papermill(code, name, work, {**params, "progress": False}, {"PYTHONPATH": str(code)})["seconds"]


def compare(before: Path, after: Path) -> dict[str, Any]:
    """Tensor by tensor, and the resolved configs."""
    import torch
    from safetensors.torch import load_file

    old, new = load_file(before / "model.safetensors"), load_file(after / "model.safetensors")
    shared = [k for k in old if k in new and old[k].shape == new[k].shape]
    largest = max((float((old[k].float() - new[k].float()).abs().max()) for k in shared), default=None)
    provenance = [json.loads((a / "manifest.json").read_text())["provenance"] for a in (before, after)]
    configs = [p.get("config", {}) for p in provenance]
    changed = {k: [configs[0].get(k), configs[1].get(k)] for k in sorted(set(configs[0]) | set(configs[1]))
               if configs[0].get(k) != configs[1].get(k) and k not in PLACES}  # fmt: skip
    return {
        "tensors": len(new),
        "bit_identical": old.keys() == new.keys() and all(torch.equal(old[k], new[k]) for k in old),
        "largest_difference": largest,
        "config_changed": changed,
        "data_kind_after": provenance[1].get("data_kind"),
    }


def run(before: str, tables: tuple[str, ...] = TABLES, epochs: int = 2) -> dict[str, Any]:
    commit = subprocess.run(["git", "rev-parse", "--short", before], cwd=ROOT, capture_output=True, text=True,
                            check=True).stdout.strip()  # fmt: skip
    results: dict[str, Any] = {}
    with tempfile.TemporaryDirectory(prefix="same-model-") as tmp:
        work = Path(tmp)
        worktree = work / "before"
        subprocess.run(["git", "worktree", "add", "--detach", str(worktree), commit], cwd=ROOT, check=True,
                       capture_output=True)  # fmt: skip
        try:
            for name in tables:
                data = build(name, work / "data")
                extra = BIRDCLEF if name == "soundscapes" else {}
                seconds = {}
                for side, code in (("before", worktree), ("after", ROOT)):
                    # A cache of each side's own: a shared one (the default folder) is built by the first side
                    # and read by the second, which would then never run its own decoding.
                    params = {"data_dir": data, "artifact_dir": work / side / name, "epochs": epochs,
                              "cache_dir": work / side / "audio-cache", **extra}  # fmt: skip
                    seconds[side] = round(notebook(code, "train.ipynb", work, params))
                results[name] = {**compare(work / "before" / name, work / "after" / name), "seconds": seconds}
                # Each side predicts from its own artifact with its own infer notebook.
                infer_extra = {"test_audio_dir": "test_soundscapes"} if name == "soundscapes" else {}
                written = {}
                for side, code in (("before", worktree), ("after", ROOT)):
                    out = work / side / f"{name}-submission.csv"
                    params = {"data_dir": data, "artifact_dir": work / side / name, "submission_path": out,
                              "engine": "torch", **infer_extra}  # fmt: skip
                    notebook(code, "infer.ipynb", work, params)
                    written[side] = out.read_bytes()
                results[name]["submission_identical"] = written["before"] == written["after"]
                results[name]["submission_rows"] = written["after"].count(b"\n") - 1
                print(f"{name}: bit-identical {results[name]['bit_identical']}, "
                      f"submission identical {results[name]['submission_identical']}", file=sys.stderr)  # fmt: skip
        finally:
            subprocess.run(
                ["git", "worktree", "remove", "--force", str(worktree)], cwd=ROOT, capture_output=True
            )
    return {"before": commit, "epochs": epochs, "tables": results,
            "headline": f"{sum(r['bit_identical'] for r in results.values())} of {len(results)} tables bit-identical "
                        f"to {commit}, {sum(r['submission_identical'] for r in results.values())} submissions "
                        f"byte-identical ({', '.join(results)})"}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.same_model", description=__doc__.split("\n")[0]
    )
    parser.add_argument("--before", required=True, help="the commit to compare with (a hash, a tag, HEAD~3)")
    parser.add_argument("--tables", default=",".join(TABLES))
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--out", type=Path, help="also write the result here (JSON)")
    args = parser.parse_args(argv)
    result = run(args.before, tuple(args.tables.split(",")), args.epochs)
    print_result(result, args.out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
