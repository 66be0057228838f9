"""The evaluation every method shares: accuracies, a membership-inference AUC, and the
distance to a retrained reference (DESIGN §8).

Forget-set metrics need the removed samples' features, which are erased when the update
commits, so they are computed inside the deletion job, before the commit.
"""

from __future__ import annotations

import numpy as np
import torch
from lethe_client.jsontypes import JsonObject
from lethe_client.specs import ArchitectureSpec
from sklearn.linear_model import LogisticRegression
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import StratifiedKFold, cross_val_predict
from torch import nn

from maths.nets import flat
from maths.training import accuracy, logits

Split = tuple[torch.Tensor, torch.Tensor]
Arch = ArchitectureSpec | JsonObject


@torch.no_grad()
def per_sample_losses(
    architecture: Arch,
    state: dict[str, torch.Tensor],
    X: torch.Tensor,
    y: torch.Tensor,
    n_classes: int,
    aggregation: str = "probabilities",
) -> np.ndarray:
    """Per-sample cross-entropy, computed on the device of X, returned on the host."""
    scores = logits(architecture, state, X, n_classes, aggregation).float()
    return nn.functional.cross_entropy(scores, y, reduction="none").cpu().numpy()


def membership_auc(forget_losses: np.ndarray, test_losses: np.ndarray) -> float | None:
    """AUC of a logistic regression on per-sample losses telling forget-set members (1) from
    held-out test samples (0), from out-of-fold predictions. 0.5 = no membership signal."""
    n_pos, n_neg = len(forget_losses), len(test_losses)
    if n_pos < 2 or n_neg < 2:
        return None
    features = np.log1p(np.concatenate([forget_losses, test_losses])).reshape(-1, 1)
    labels = np.concatenate([np.ones(n_pos), np.zeros(n_neg)])
    folds = StratifiedKFold(n_splits=min(5, n_pos, n_neg), shuffle=True, random_state=0)
    proba = cross_val_predict(
        LogisticRegression(class_weight="balanced"),
        features,
        labels,
        cv=folds,
        method="predict_proba",
    )[:, 1]
    return float(roc_auc_score(labels, proba))


def distance(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """‖a − b‖ in float64, on the device of `a`."""
    fa = flat(a).double()
    return float((fa - flat(b).double().to(fa.device)).norm())


def evaluate(
    architecture: Arch,
    n_classes: int,
    *,
    release: dict[str, torch.Tensor],
    noise_free: dict[str, torch.Tensor],
    original: dict[str, torch.Tensor],
    reference: dict[str, torch.Tensor] | None,
    forget: Split,
    retain: Split,
    test: Split,
    aggregation: str = "probabilities",
) -> JsonObject:
    """Accuracies and MIA AUC of the release (and the reference), and distances to it, over
    the released parameters (a noise-free state may hold method state beside them)."""
    noise_free = {k: noise_free[k] for k in release}
    original = {k: original[k] for k in release}
    reference = None if reference is None else {k: reference[k] for k in release}

    def acc(state: dict[str, torch.Tensor], data: Split) -> float | None:
        return accuracy(architecture, state, data[0], data[1], n_classes, aggregation)

    def auc(state: dict[str, torch.Tensor]) -> float | None:
        return membership_auc(
            per_sample_losses(architecture, state, forget[0], forget[1], n_classes, aggregation),
            per_sample_losses(architecture, state, test[0], test[1], n_classes, aggregation),
        )

    out: JsonObject = {
        "test_accuracy": acc(release, test),
        "forget_accuracy": acc(release, forget),
        "retain_accuracy": acc(release, retain),
        "mia_auc": auc(release),
        "noise_free": {
            "test_accuracy": acc(noise_free, test),
            "forget_accuracy": acc(noise_free, forget),
            "mia_auc": auc(noise_free),
        },
        "original": {"forget_accuracy": acc(original, forget), "mia_auc": auc(original)},
    }
    if reference is not None:
        out["reference"] = {
            "test_accuracy": acc(reference, test),
            "forget_accuracy": acc(reference, forget),
            "retain_accuracy": acc(reference, retain),
            "mia_auc": auc(reference),
            **_distances(reference, release, noise_free, original),
        }
    return out


def _distances(
    reference: dict[str, torch.Tensor],
    release: dict[str, torch.Tensor],
    noise_free: dict[str, torch.Tensor],
    original: dict[str, torch.Tensor],
) -> JsonObject:
    """How far the release, its noise-free state and the original model are from the
    retrained reference (the noise-free one relative to the original's)."""
    gap = distance(original, reference)
    to_noise_free = distance(noise_free, reference)
    return {
        "distance_release": distance(release, reference),
        "distance_noise_free": to_noise_free,
        "distance_original": gap,
        "relative_distance_noise_free": to_noise_free / gap if gap > 0 else None,
    }
