"""Seed 000: the anchor-word topic model and its unlearning, on the paper's own
generative model (app/core/text.py: vocabulary 2,000, 20 topics, 50,000 documents of 100 words,
separability p = 0.05).

Measured with the compute halves (no service): learning time; one removal (1 and 10
documents) against retraining; the entrywise error of the released A against A* and against
the retrained A, at (ε, δ) = (1, 1e-5), calibrated with the declared constants and with those
estimated from the learned model; the capacity the bound gives; and, because the release is
useless at this size, the corpus size m at which σ for one removal falls below the typical
entry of A (1/n), by the same formula.

    .venv/bin/python -m bench.topic_models [--documents 50000]

Writes bench/results/topic_models.json and topic_models.png.
"""

from __future__ import annotations

import argparse
import math
import time
from typing import Any

import numpy as np
import torch

from app.core.text import synthetic_corpus
from app.privacy.gaussian import sigma_for
from bench.common import RESULTS, model_spec, update_inputs, write_result
from maths import topics as tp
from methods.anchor_topics import compute as anchor_topics
from methods.anchor_topics.compute import AnchorTopics
from methods.anchor_topics.spec import sensitivity
from methods.compute import PrivacyTarget, RemovedSamples, RetainedData
from methods.topic_head.spec import head_capacity

TARGET = PrivacyTarget(1.0, 1e-5)
DECLARED = {"c": 1.0, "a": 2.0, "gamma": 0.5, "p": 0.05, "eps0": 0.05}


def error(A: torch.Tensor, B: torch.Tensor) -> float:
    return float((A - B).abs().max())


def sigma_at(constants: dict[str, float], n: int, r: int, m: int, m_u: int) -> float:
    delta_a = sensitivity(
        constants["c"],
        constants["a"],
        constants["gamma"],
        constants["p"],
        constants["eps0"],
        n,
        r,
        m,
        m_u,
    )
    return sigma_for(delta_a * math.sqrt(2), TARGET.epsilon, TARGET.delta)


def useful_size(constants: dict[str, float], n: int, r: int) -> float:
    """The smallest m with σ(one removal) ≤ 1/n, by bisection on log m."""
    lo, hi = 1.0, 1e30
    if sigma_at(constants, n, r, int(hi), 1) > 1 / n:
        return math.inf
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        if sigma_at(constants, n, r, int(mid), 1) <= 1 / n:
            hi = mid
        else:
            lo = mid
    return hi


def run(documents: int, vocabulary: int, topics: int, length: int, p: float) -> dict[str, Any]:
    torch.set_num_threads(2)
    corpus = synthetic_corpus(vocabulary, topics, documents, length, p, seed=0)
    X = torch.from_numpy(corpus.counts)
    ids = list(range(documents))
    y = torch.zeros(documents, dtype=torch.long)
    arch = {"type": "topic_model", "topics": topics}
    results: dict[str, Any] = {
        "corpus": {
            "vocabulary": vocabulary,
            "topics": topics,
            "documents": documents,
            "length": length,
            "separability": p,
        },
    }
    for calibrate in ("declared", "estimated"):
        spec = model_spec(
            arch,
            {},
            {"name": "anchor_topics", **DECLARED, "calibrate_with": calibrate},
            vocabulary,
            1,
        )
        method = AnchorTopics(spec)
        start = time.perf_counter()
        trained = method.train(RetainedData(ids, X, y))
        learn_seconds = time.perf_counter() - start
        anchors = trained.next_state[anchor_topics.ANCHORS].tolist()
        truth = torch.from_numpy(corpus.A)[:, anchors]
        S, m = trained.next_state[anchor_topics.STATISTIC], documents
        noise_free = tp.recover_topics(S, m, anchors)
        row: dict[str, Any] = {
            "learn_seconds": learn_seconds,
            "anchors_correct": sorted(anchors) == sorted(corpus.anchors),
            "noise_free_error_vs_A_star": error(noise_free.A, truth),
            "estimates": trained.metrics["estimates"],
            "capacity": trained.metrics["deletion_capacity"],
            "removals": [],
        }
        for k in (1, 10):
            removed = RemovedSamples(ids[:k], X[:k], y[:k])
            kept = RetainedData(ids[k:], X[k:], y[k:])
            # Algorithm 1's work, timed without the capacity check (past it, `unlearn`
            # hands over to an exact retrain): subtract, re-solve, release.
            start = time.perf_counter()
            S_r, m_r = tp.cooccurrence_sum(removed.X)
            topics_r = tp.recover_topics(S - S_r, m - m_r, anchors)
            release_weights, calibration = method._release(topics_r, m, k, TARGET)
            update_seconds = time.perf_counter() - start
            start = time.perf_counter()
            retrained = method.train(kept)
            retrain_seconds = time.perf_counter() - start
            retrained_clean = tp.recover_topics(
                retrained.next_state[anchor_topics.STATISTIC],
                m - k,
                retrained.next_state[anchor_topics.ANCHORS].tolist(),
            )
            same_anchor = tp.recover_topics(tp.cooccurrence_sum(X[k:])[0], m - k, anchors)
            row["removals"].append(
                {
                    "removed": k,
                    "update_seconds": update_seconds,
                    "retrain_seconds": retrain_seconds,
                    "sigma": calibration["sigma"],
                    "released_error_vs_A_star": error(release_weights["A"], truth),
                    "released_error_vs_retrained": error(release_weights["A"], same_anchor.A),
                    "noise_free_error_vs_same_anchor_retrain": error(topics_r.A, same_anchor.A),
                    "retrained_anchors_unchanged": sorted(
                        retrained.next_state[anchor_topics.ANCHORS].tolist()
                    )
                    == sorted(anchors),
                    "retrained_noise_free_error_vs_A_star": error(
                        retrained_clean.A[:, _order(retrained, anchors)], truth
                    ),
                    "past_capacity": k > calibration["deletion_capacity"]["documents"],
                }
            )
            print(calibrate, row["removals"][-1], flush=True)
        constants = DECLARED if calibrate == "declared" else {**DECLARED, **row["estimates"]}
        row["sigma_one_removal"] = sigma_at(constants, vocabulary, topics, documents, 1)
        row["corpus_size_for_sigma_below_1_over_n"] = useful_size(constants, vocabulary, topics)
        row["sigma_by_corpus_size"] = [
            {"m": int(mm), "sigma": sigma_at(constants, vocabulary, topics, int(mm), 1)}
            for mm in np.logspace(4, 25, 43)
        ]
        results[calibrate] = row
    return results


def head(documents: int, vocabulary: int, topics: int, length: int, p: float) -> dict[str, Any]:
    """The downstream head (Algorithm 2) on the corpus's dominant-topic labels: 80/20 split,
    one removed document; accuracy of the release with the bound's σ_v, of the same update
    without noise, and of the head retrained from scratch. The capacity check is bypassed here
    (it would hand every request to an exact retrain) to show what the release would be."""
    from maths.training import accuracy
    from methods.topic_head import compute as topic_head
    from methods.topic_head.compute import TopicHead

    corpus = synthetic_corpus(vocabulary, topics, documents, length, p, seed=0)
    X, y = torch.from_numpy(corpus.counts), torch.from_numpy(corpus.labels)
    cut = int(0.8 * documents)
    train_ids, test = list(range(cut)), RetainedData(list(range(cut, documents)), X[cut:], y[cut:])
    arch = {"type": "topic_head", "base_model": 1, "topics": topics}
    spec = model_spec(arch, {}, {"name": "topic_head"}, vocabulary, int(y.max()) + 1)
    method = TopicHead(spec)
    start = time.perf_counter()
    trained = method.train(RetainedData(train_ids, X[:cut], y[:cut]))
    train_seconds = time.perf_counter() - start
    k = spec.n_classes

    def acc(state: dict[str, torch.Tensor]) -> float | None:
        return accuracy(arch, state, test.X, test.y, k)

    removed = RemovedSamples([0], X[:1], y[:1])
    kept = RetainedData(train_ids[1:], X[1:cut], y[1:cut])
    inputs = update_inputs(spec, trained.next_state, removed, kept, TARGET, test=test)
    unlimited = {"noise_term": 1e30, "bias_term": 1e30, "anchor_stability": 1e30, "documents": 1e30}
    original = (topic_head.head_capacity, topic_head.NOISE)
    topic_head.head_capacity = lambda *args, **kw: unlimited  # type: ignore[assignment]
    try:
        topic_head.NOISE = False
        noise_free = method.unlearn(inputs)
        topic_head.NOISE = True
        start = time.perf_counter()
        release = method.unlearn(inputs)
        update_seconds = time.perf_counter() - start
    finally:
        topic_head.head_capacity, topic_head.NOISE = original
    start = time.perf_counter()
    retrained = method.train(kept)
    retrain_seconds = time.perf_counter() - start
    return {
        "classes": k,
        "train_seconds": train_seconds,
        "test_accuracy_trained": acc(trained.state),
        "update_seconds": update_seconds,
        "retrain_seconds": retrain_seconds,
        "sigma_v": release.metrics["sigma"],
        "test_accuracy_released": acc(release.weights),
        "test_accuracy_update_without_noise": acc(noise_free.weights),
        "test_accuracy_retrained": acc(retrained.state),
        "capacity_bypassed": True,
        "capacity_with_the_declared_constants": head_capacity(
            1.0,
            2.0,
            0.5,
            0.05,
            0.05,
            1 / (2.0 * topics),
            vocabulary,
            topics,
            cut,
            TARGET.epsilon,
            TARGET.delta,
        ),
    }


def _order(trained: Any, anchors: list[int]) -> list[int]:
    """Column order of a retrained model matching `anchors` (retrains may list them
    differently)."""
    found = trained.next_state[anchor_topics.ANCHORS].tolist()
    return [found.index(a) if a in found else 0 for a in anchors]


def plot(result: dict[str, Any]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    n = result["corpus"]["vocabulary"]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    for calibrate in ("declared", "estimated"):
        curve = result[calibrate]["sigma_by_corpus_size"]
        ax.loglog([c["m"] for c in curve], [c["sigma"] for c in curve], label=f"σ, {calibrate}")
    ax.axhline(1 / n, color="k", ls="--", label="1/n: a typical entry of A")
    ax.axvline(result["corpus"]["documents"], color="grey", ls=":", label="this corpus")
    ax.set_xlabel("documents m")
    ax.set_ylabel("σ of ν_A for one removal at (1, 1e-5)")
    ax.set_title("seed 000's bound: noise against corpus size")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / "topic_models.png", dpi=120)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--documents", type=int, default=50_000)
    parser.add_argument("--vocabulary", type=int, default=2000)
    parser.add_argument("--topics", type=int, default=20)
    parser.add_argument("--length", type=int, default=100)
    parser.add_argument("--separability", type=float, default=0.05)
    args = parser.parse_args()
    result = run(args.documents, args.vocabulary, args.topics, args.length, args.separability)
    result["head"] = head(
        args.documents, args.vocabulary, args.topics, args.length, args.separability
    )
    print("head", result["head"])
    path = write_result("topic_models", result)
    plot(result)
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
