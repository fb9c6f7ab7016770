"""A teacher's scores as probabilities of the competition's classes, and their blend with the model's own.

The teacher scores the classes it knows (`species.ClassMap`); of the others it knows nothing. So:

    independent rows (a chunk of soundscape, a multi-label clip): each known class's probability is the
        sigmoid of its logit; a class the teacher lacks keeps the model's own probability
    one-label rows (a recording of one species): a softmax over the known classes' logits and one more, the
        `unknown_logit`, whose share -- "none of mine is calling" -- goes to the classes the teacher lacks, in
        the proportions the model gives them; without such classes, a softmax over the known ones
    the blend: (1 - weight) x the model's probabilities + weight x the teacher's, row by row; a row the teacher
        did not score (no audio for it, or the time limit) keeps the model's

`fit_unknown_logit` chooses that logit on the training recordings, whose labels say which of them the
teacher cannot name: the logit that best tells the two apart (balanced accuracy: the recordings of the
classes it lacks count as much as the others), the middle of the best range.
"""

from __future__ import annotations

import numpy as np

UNKNOWN_GRID = np.arange(-8.0, 8.0 + 1e-9, 0.25)


def fit_unknown_logit(file_logits: np.ndarray, truth: np.ndarray, known: np.ndarray) -> float | None:
    """The unknown logit for one-label rows: `file_logits` [files, classes] (the highest window logit of each
    class the teacher knows; the others are ignored), `truth` [files] each file's class, `known` [classes]
    which classes the teacher knows. None when it knows every class (no share to give) or no file is of a
    class it lacks."""
    known = np.asarray(known, dtype=bool)
    truth = np.asarray(truth)
    lacking_files = ~known[truth]
    if known.all() or not lacking_files.any() or lacking_files.all():
        return None
    scores = np.where(known[None, :], file_logits, -np.inf)
    best, guess = scores.max(axis=1), scores.argmax(axis=1)
    values = []
    for threshold in UNKNOWN_GRID:
        says_unknown = best < threshold
        right = np.where(lacking_files, says_unknown, ~says_unknown & (guess == truth))
        values.append(0.5 * right[lacking_files].mean() + 0.5 * right[~lacking_files].mean())
    values = np.asarray(values)
    top = np.flatnonzero(values >= values.max() - 1e-12)
    # The middle of the longest run of best thresholds: a plateau's edge is where one more file flips.
    runs = np.split(top, np.flatnonzero(np.diff(top) > 1) + 1)
    longest = max(runs, key=len)
    return float(UNKNOWN_GRID[longest].mean())


def teacher_probabilities(
    logits: np.ndarray, model_probs: np.ndarray, independent: bool, unknown_logit: float | None
) -> np.ndarray:
    """[rows, classes] the teacher's probabilities (module docstring): `logits` [rows, classes] NaN where the
    teacher has no output for the class; a row all NaN (not scored) stays NaN."""
    logits = np.asarray(logits, dtype=np.float64)
    known = np.isfinite(logits)
    if independent:
        return np.where(
            known,
            1.0 / (1.0 + np.exp(-np.clip(np.nan_to_num(logits), -15.0, 15.0))),
            np.where(known.any(axis=1, keepdims=True), model_probs, np.nan),
        )
    out = np.full(logits.shape, np.nan)
    for row in np.flatnonzero(known.any(axis=1)):
        mine = known[row]
        values = logits[row, mine]
        lacking = ~mine
        extra = [unknown_logit] if unknown_logit is not None and lacking.any() else []
        z = np.concatenate([values, extra])
        p = np.exp(z - z.max())
        p /= p.sum()
        out[row, mine] = p[: len(values)]
        out[row, lacking] = 0.0
        if extra:
            share = np.nan_to_num(model_probs[row, lacking])
            total = share.sum()
            out[row, lacking] = p[-1] * (
                share / total if total > 0 else np.full(lacking.sum(), 1.0 / lacking.sum())
            )
    return out


def blend(model_probs: np.ndarray, teacher_probs: np.ndarray, weight: float) -> np.ndarray:
    """(1 - weight) x the model's + weight x the teacher's, per row; rows the teacher did not score (NaN) keep
    the model's."""
    scored = np.isfinite(teacher_probs).all(axis=1, keepdims=True)
    return np.where(scored, (1.0 - weight) * model_probs + weight * np.nan_to_num(teacher_probs), model_probs)


__all__ = ["UNKNOWN_GRID", "blend", "fit_unknown_logit", "teacher_probabilities"]
