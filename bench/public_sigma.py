"""What a public σ costs (issue 52): recollection and newton calibrated their noise on values
measured on the removed rows (Theorem 2 for those rows' own steps; the measured residual
gradient G), so σ itself said which rows left. Now σ comes from public values: Theorem 2 for
the worst m training samples, and a declared G_max. This measures, on digits (logistic
regression), for single-row and ten-row removals: the per-set σ each removal would have had
(before), the one public σ (now), and the release's test accuracy under each.

    .venv/bin/python -m bench.public_sigma [--trials 30]

Writes bench/results/public_sigma.json.
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import torch
from sklearn.datasets import load_digits

from app.privacy.gaussian import sigma_for
from bench.common import write_result
from maths.nets import FlatModel, build_net
from maths.training import accuracy
from methods.compute import RetainedData, fit
from methods.newton.compute import Newton
from methods.newton.maths import mean_gradient
from methods.newton.sensitivity import newton_sensitivity
from methods.recollection.replay import Replay
from tests.factories import model_spec, split_off

EPSILON, DELTA = 1.0, 1e-5
TRAINING = {"epochs": 20, "batch_size": 64, "learning_rate": 0.5, "seed": 0}


def digits() -> tuple[RetainedData, torch.Tensor, torch.Tensor]:
    X, y = load_digits(return_X_y=True)
    X = torch.tensor(X / 16.0, dtype=torch.float32)
    y = torch.tensor(y, dtype=torch.long)
    ids = list(range(len(y)))
    train, test = ids[:1500], ids[1500:]
    return RetainedData(train, X[train], y[train], [None] * len(train)), X[test], y[test]


def noised_accuracy(
    spec: object, state: dict, sigma: float, X: torch.Tensor, y: torch.Tensor, draws: int = 5
) -> float:
    """Mean test accuracy of state + N(0, σ²I) over a few draws."""
    net = FlatModel(build_net(spec.architecture, spec.n_features, spec.n_classes))  # type: ignore[attr-defined]
    w = net.vector(state)
    gen = torch.Generator().manual_seed(1)
    scores = []
    for _ in range(draws):
        noised = net.state(w + sigma * torch.randn(w.shape, generator=gen, dtype=w.dtype))
        scores.append(accuracy({"type": "logreg"}, noised, X, y, spec.n_classes))  # type: ignore[attr-defined]
    return float(np.mean(scores))


def summary(values: list[float]) -> dict[str, float]:
    a = np.asarray(values)
    return {"min": float(a.min()), "median": float(np.median(a)), "max": float(a.max())}


def recollection(data: RetainedData, X: torch.Tensor, y: torch.Tensor, trials: int) -> dict:
    spec = model_spec(
        {"type": "logreg"}, {"name": "recollection", "max_relative_noise": None}, 64, 10, TRAINING
    )
    trained = fit(spec, data)
    replay = Replay.of(trained.record)
    rng = np.random.default_rng(0)
    out: dict = {"n_train": len(data.y), "rho": replay.record.rho}
    for k in (1, 10):
        public = sigma_for(replay.worst_case(k), EPSILON, DELTA)
        before = [
            sigma_for(
                replay.sensitivity(rng.choice(data.sample_ids, k, replace=False).tolist()),
                EPSILON,
                DELTA,
            )
            for _ in range(trials)
        ]
        out[f"k={k}"] = {
            "sigma_before_per_set": summary(before),
            "sigma_now_public": public,
            "ratio_now_over_median_before": public / float(np.median(before)),
            "test_accuracy_noise_free": accuracy({"type": "logreg"}, trained.next_state, X, y, 10),
            "test_accuracy_at_median_before": noised_accuracy(
                spec, trained.next_state, float(np.median(before)), X, y
            ),
            "test_accuracy_at_public": noised_accuracy(spec, trained.next_state, public, X, y),
        }
    return out


def newton(data: RetainedData, X: torch.Tensor, y: torch.Tensor, trials: int) -> dict:
    options = {"name": "newton", "max_relative_noise": None, "C": 10.0, "lam": 1.0}
    spec = model_spec({"type": "logreg"}, options, 64, 10, {**TRAINING, "weight_decay": 1e-3})
    trained = fit(spec, data)
    method = Newton(spec)
    o = method.o
    net = FlatModel(build_net(spec.architecture, spec.n_features, spec.n_classes))
    w = net.vector(trained.next_state)
    d, rho = w.numel(), DELTA / 2
    rng = np.random.default_rng(0)
    measured = []
    for _ in range(trials):
        gone = rng.choice(data.sample_ids, 1, replace=False).tolist()
        _, retained = split_off(data, gone)
        g_all = float(mean_gradient(net, w, data.X, data.y, 1e-3).norm())
        g_r = float(mean_gradient(net, w, retained.X, retained.y, 1e-3).norm())
        measured.append(max(g_all, g_r))

    def sigma(G: float) -> float:
        delta = newton_sensitivity(o.C, o.M, o.L, o.lam, o.lam_min, G, d=d, rho=rho, s=o.depth)
        return sigma_for(delta, EPSILON, DELTA - rho)

    before = [sigma(G) for G in measured]
    public = sigma(o.G_max)
    return {
        "measured_G": summary(measured),
        "G_max_declared": o.G_max,
        "sigma_before_per_set": summary(before),
        "sigma_now_public": public,
        "ratio_now_over_median_before": public / float(np.median(before)),
        "test_accuracy_noise_free": accuracy({"type": "logreg"}, trained.next_state, X, y, 10),
        "test_accuracy_at_public": noised_accuracy(spec, trained.next_state, public, X, y),
        "sigma_sqrt_d_over_weight_norm": public * math.sqrt(d) / float(w.norm()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--trials", type=int, default=30)
    args = parser.parse_args()
    data, X, y = digits()
    result = {
        "target": {"epsilon": EPSILON, "delta": DELTA},
        "data": "sklearn digits, 1,500 train / 297 test, logistic regression",
        "recollection": recollection(data, X, y, args.trials),
        "newton": newton(data, X, y, args.trials),
    }
    print(write_result("public_sigma", result))


if __name__ == "__main__":
    main()
