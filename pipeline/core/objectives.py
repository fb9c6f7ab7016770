"""What the classifier learns: one class per clip (AAM softmax) or several (an independent sigmoid per class).

All three objectives score the same thing, the cosine between an embedding and each class centre times the
scale (SpeechBrain's cosine `Classifier`, so the artifact still loads in its EncoderClassifier):

    aam    additive angular margin softmax (ArcFace), SpeechBrain's speaker objective: the clip's one class
           against all others. Probabilities: softmax(scale * cosine). Blended crops (training/augment.py)
           bring soft targets t: each class gets the fraction t of the margin and the cross-entropy is taken
           against t, which is the one-hot loss again when t is one class.
    bce    binary cross-entropy per class: any number of classes per clip (secondary labels, mixed crops,
           soundscape chunks with several species or none). The margin moves positives' logits down and
           negatives' up, `scale * (cos - margin)` and `scale * (cos + margin)` (a soft target t interpolates:
           `scale * (cos - margin * (2t - 1))`), as AAM's margin does for its one class.
           Probabilities: sigmoid(scale * cosine), independent per class.
    focal  bce weighted by (1 - p_t)^2 (Lin et al., 2017): easy negatives -- most of the classes of most clips
           -- count less.

Losses are summed over classes and averaged over the batch, so their size does not shrink with the class
count and the learning rates the batch scaling derives keep their meaning.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

OBJECTIVES = ("aam", "bce", "focal")
FOCAL_GAMMA = 2.0

Loss = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]


def is_multi_label(objective: str) -> bool:
    return objective != "aam"


@functools.cache
def make_loss(objective: str, margin: float, scale: float) -> Loss:
    """loss(cosine scores [B, C], targets) -> scalar, in fp32 whatever autocast says: targets are class
    indices [B] for aam, else [B, C] in [0, 1] (aam: soft targets, rows summing to 1). Cached, and stateless:
    training asks for it every epoch, and the XLA step traced once is keyed on it (devices/xla_traced.py)."""
    if objective == "aam":
        from speechbrain.nnet.losses import AdditiveAngularMargin, LogSoftmaxWrapper

        angular = AdditiveAngularMargin(margin=margin, scale=scale)
        wrapped = LogSoftmaxWrapper(angular)

        def aam(cosines: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
            if targets.ndim == 2:  # soft targets [B, C]: SpeechBrain's margin takes them as they are
                targets = targets.float()
                if cosines.ndim == 3:
                    targets = targets.unsqueeze(1).expand_as(cosines)
                logits = angular(cosines.float().flatten(0, -2), targets.flatten(0, -2))
                loss = -(targets.flatten(0, -2) * torch.log_softmax(logits, dim=-1)).sum(dim=-1)
                return loss.reshape(len(cosines), -1).sum(dim=1).mean()  # members' losses summed
            # SpeechBrain's wrapper wants [B, 1, C] scores and [B, 1] targets; it averages over its rows.
            members = cosines.shape[1] if cosines.ndim == 3 else 1
            rows = cosines.float().reshape(-1, 1, cosines.shape[-1])
            return members * wrapped(rows, targets.repeat_interleave(members).unsqueeze(1))

        return aam
    if objective not in OBJECTIVES:
        raise ValueError(f"objective {objective!r} is not one of {OBJECTIVES}")
    gamma = FOCAL_GAMMA if objective == "focal" else 0.0

    def multi_label(cosines: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        targets = targets.float()
        if cosines.ndim == 3:  # [B, members, C]: every member against the same targets, losses summed
            targets = targets.unsqueeze(1).expand_as(cosines)
        logits = scale * (cosines.float() - margin * (2 * targets - 1))
        loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, targets, reduction="none")
        if gamma:
            p = torch.sigmoid(logits)
            p_true = p * targets + (1 - p) * (1 - targets)
            loss = loss * (1 - p_true) ** gamma
        return loss.flatten(1).sum(dim=1).mean()

    return multi_label


def validation_loss(objective: str, cosines: torch.Tensor, truth: torch.Tensor, scale: float) -> torch.Tensor:
    """Per-row loss of held-out scores, without margin: softmax cross-entropy against the first true class, or
    the summed binary cross-entropy of independent probabilities."""
    logits = scale * cosines.double()
    if objective == "aam":
        return torch.nn.functional.cross_entropy(logits, truth.argmax(dim=1), reduction="none")
    loss = torch.nn.functional.binary_cross_entropy_with_logits(logits, truth.double(), reduction="none")
    return loss.sum(dim=1)


def probabilities(cosines: torch.Tensor, scale: float, independent: bool) -> torch.Tensor:
    """Class probabilities of cosine scores [..., C]: independent sigmoids, or a softmax over the classes."""
    logits = scale * cosines
    return torch.sigmoid(logits) if independent else torch.softmax(logits, dim=-1)


__all__ = ["OBJECTIVES", "is_multi_label", "make_loss", "probabilities", "validation_loss"]
