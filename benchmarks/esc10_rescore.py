"""ESC-10's kept fold models scored again, other ways, with torch fp32: inference choices paired on the same models.

    python -m benchmarks.esc10 --seeds 1 --keep /tmp/keep_s1      # trains the five folds and keeps them
    python -m benchmarks.esc10_rescore /tmp/keep_s1                  # per fold and mean, one line per fold

Each variant is a way a clip's 1 s window embeddings become its class scores (docs/measurements.md, "Scores
without the direction every clip shares"). It reads each kept fold's artifact, test clips and solution.csv,
and the training files for the training-mean variants and back ends (all of them, not the artifact's own 256-file
centre).
"""

from __future__ import annotations

import csv
import json
import sys
from pathlib import Path

import numpy as np
import torch
from scipy.signal import resample_poly

from pipeline.core.artifact import load_artifact
from pipeline.core.data import energy_weights, load_audio, windows

QUIET_DB = 40.0


def unit(x: torch.Tensor) -> torch.Tensor:
    return torch.nn.functional.normalize(x.float(), dim=-1)


def embed(model, wavs: np.ndarray) -> torch.Tensor:
    wavs_t, lens = torch.from_numpy(np.asarray(wavs, dtype=np.float32)), torch.ones(len(wavs))
    with torch.inference_mode():
        return unit(model.embed(model.features(wavs_t, lens), lens))


def clip_views(model, window: int, samples: np.ndarray) -> dict[str, torch.Tensor]:
    """Scores-to-be of one clip: each a [D] embedding, or [n, C]-ready window embeddings ('windows')."""
    tiled_windows, tiled_lens = windows(samples, window, 64, None, QUIET_DB)
    tiled = embed(model, tiled_windows)
    energy = torch.from_numpy(energy_weights(tiled_windows, tiled_lens))
    quarter_windows = windows(samples, window, 64, window // 4, QUIET_DB)[0]
    quarter = embed(model, quarter_windows)
    rms = np.sqrt(np.mean(np.square(quarter_windows.astype(np.float64)), axis=1))
    speeds = [tiled] + [
        embed(
            model, windows(resample_poly(samples, up, down).astype(np.float32), window, 64, None, QUIET_DB)[0]
        )
        for up, down in ((10, 9), (9, 10), (20, 19), (19, 20))
    ]
    return {
        "mean": unit(tiled.mean(0)),
        "energy_weighted": unit((tiled * energy[:, None]).sum(0)),
        "windows": tiled,
        "quarter_hop": unit(quarter.mean(0)),
        "quarter_hop_rms_weighted": unit(
            (quarter * torch.from_numpy(rms / rms.max()).float()[:, None]).sum(0)
        ),
        "speed_tta": unit(torch.cat(speeds).mean(0)),
        "whole_clip": embed(model, samples[None])[0],
        "two_second_windows": unit(embed(model, windows(samples, 2 * window, 64, None, QUIET_DB)[0]).mean(0)),
    }


def rescore_fold(run: Path) -> dict[str, float]:
    fold = run.name.split("-")[1]
    folder = run / f"fold{fold}"
    artifact = load_artifact(run / f"model{fold}")
    model, labels = artifact.model, artifact.labels
    centres = unit(model.class_centres())
    rate, window = model.config.sample_rate, artifact.window_samples
    truth = {row["id"]: row["label"] for row in csv.DictReader(open(folder / "solution.csv"))}
    views = [clip_views(model, window, load_audio(folder / row["path"], sample_rate=rate)[0])
             for row in csv.DictReader(open(folder / "test.csv"))]  # fmt: skip
    expected = list(truth.values())
    train_rows = list(csv.DictReader(open(folder / "train.csv")))
    trained = torch.stack([
        unit(embed(model, windows(load_audio(folder / row["path"], sample_rate=rate)[0], window, 64, None,
                                  QUIET_DB)[0]).mean(0))
        for row in train_rows
    ])  # fmt: skip
    train_labels = [row["label"] for row in train_rows]
    means = torch.stack([v["mean"] for v in views])

    def accuracy(embeddings: torch.Tensor, class_centres: torch.Tensor = centres) -> float:
        predicted = (unit(embeddings) @ unit(class_centres).T).argmax(1)
        return float(np.mean([labels[int(i)] == t for i, t in zip(predicted, expected, strict=True)]))

    window_scores = [v["windows"] @ centres.T for v in views]
    result = {name: accuracy(torch.stack([v[name] for v in views])) for name in views[0] if name != "windows"}
    result["mean_of_window_probabilities"] = float(np.mean([
        labels[int(torch.softmax(30 * s, -1).mean(0).argmax())] == t for s, t in zip(window_scores, expected, strict=True)
    ]))  # fmt: skip
    train_mean, test_mean = trained.mean(0), means.mean(0)
    result.update({
        "minus_training_mean": accuracy(means - train_mean),
        "minus_training_mean_centres_too": accuracy(means - train_mean, centres - train_mean),
        "minus_class_centres_mean": accuracy(means - centres.mean(0)),
        "minus_test_mean": accuracy(means - test_mean),
        "minus_half_test_mean": accuracy(means - 0.5 * test_mean),
        **backends(means - train_mean, trained - train_mean, train_labels, labels, centres - train_mean, expected),
        "minus_training_mean_energy_weighted": accuracy(torch.stack([v["energy_weighted"] for v in views])
                                                        - train_mean),
        "minus_training_mean_quarter_hop_rms": accuracy(torch.stack([v["quarter_hop_rms_weighted"] for v in views])
                                                        - train_mean),
        "training_mean_length": float(train_mean.norm()),
        "cosine_training_test_means": float(unit(train_mean) @ unit(test_mean)),
    })  # fmt: skip
    return result


def backends(
    test: torch.Tensor,
    train: torch.Tensor,
    train_labels: list[str],
    labels: list[str],
    centres: torch.Tensor,
    expected: list[str],
) -> dict[str, float]:
    """Speaker-ID back ends on centred embeddings: class means of the training files' own embeddings (instead of
    the classifier's weight rows), their average with the weight rows, and LDA (scikit-learn) fitted on them."""
    from sklearn.discriminant_analysis import LinearDiscriminantAnalysis

    index = {name: i for i, name in enumerate(labels)}
    y = np.array([index[name] for name in train_labels])
    class_means = torch.stack([unit(train[torch.from_numpy(y == c)].mean(0)) for c in range(len(labels))])

    def hits(predicted) -> float:
        return float(np.mean([labels[int(i)] == t for i, t in zip(predicted, expected, strict=True)]))

    lda = LinearDiscriminantAnalysis(solver="eigen", shrinkage="auto").fit(unit(train).numpy(), y)
    return {
        "centred_class_means": hits((unit(test) @ class_means.T).argmax(1)),
        "centred_class_means_and_weights": hits((unit(test) @ (class_means + unit(centres)).T).argmax(1)),
        "centred_lda": hits(lda.predict(unit(test).numpy())),
    }


def main(argv: list[str]) -> int:
    torch.set_num_threads(1)
    folds = {}
    for run in sorted(Path(argv[0]).glob("run*-*")):
        folds[run.name] = rescore_fold(run)
        print(run.name, json.dumps({k: round(v, 4) for k, v in folds[run.name].items()}), flush=True)
    names = next(iter(folds.values()))
    print("mean", json.dumps({n: round(float(np.mean([f[n] for f in folds.values()])), 4) for n in names}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
