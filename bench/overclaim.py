"""Issue 25's two numeric claims, before and after, side by side in one run.

1. minnorm with linearly dependent retained rows (mislabelled duplicates): the relative
   distance of the release from an independent min-norm least-squares solve on the retained
   rows (numpy's pinv), for the old route (θ projected onto the retained span: a fresh solve
   on the retained *predictions*) and for the release Lethe makes now (a solve on the retained
   *labels*), with the certificate each carries.
2. The removed-ids digest: hashing 1,437 candidate ids (the digits builtin's) against the old
   salted sha256, whose salt sat in the certificate, against the HMAC commitment now, whose
   key (the opening) only the requester holds: ids recovered and the time taken.

    .venv/bin/python -m bench.overclaim

Writes bench/results/overclaim.json.
"""

from __future__ import annotations

import hashlib
import secrets
import time
from typing import Any

import numpy as np
import torch

from bench.common import model_spec, update_inputs, write_result


def dependent_rows(duplicates: int, removed: int) -> dict[str, Any]:
    """40 independent rows (p = 200) and `duplicates` copies of the first ones with other
    labels; `removed` of the copies are deleted, the rest stay (the rows stay dependent)."""
    from methods.compute import PrivacyTarget, RemovedSamples, RetainedData, fit
    from methods.minnorm import maths as mn
    from workers.updates import compute

    gen = torch.Generator().manual_seed(3)
    X = torch.randn(40, 200, generator=gen)
    y = torch.arange(40) % 4
    X, y = torch.cat([X, X[:duplicates]]), torch.cat([y, (y[:duplicates] + 1) % 4])
    ids = list(range(len(y)))
    spec = model_spec({"type": "logreg"}, {}, {"name": "minnorm"}, 200, 4)
    trained = fit(spec, RetainedData(ids, X, y))
    gone = list(range(40, 40 + removed))
    keep = [i for i in ids if i not in gone]
    inputs = update_inputs(
        spec,
        trained.next_state,
        RemovedSamples(gone, X[gone], y[gone]),
        RetainedData(keep, X[keep], y[keep]),
        PrivacyTarget(1.0, 1e-5),
    )
    release = compute(inputs).decision.release
    phi = mn.with_bias(X[keep])
    expected = (np.linalg.pinv(phi.numpy(), rcond=1e-10) @ np.eye(4)[y[keep].numpy()]).T

    def theta(state: dict[str, torch.Tensor]) -> torch.Tensor:
        return torch.cat([state["1.weight"].double(), state["1.bias"].double().unsqueeze(1)], 1)

    projected = mn.fit(phi, phi @ theta(trained.state).T, 1e-12).theta  # the old route
    scale = float(np.linalg.norm(expected))

    def distance(t: torch.Tensor) -> float:
        return float(np.linalg.norm(t.numpy() - expected)) / scale

    row = mn.with_bias(X[:1])  # row 0, whose mislabelled duplicate (row 40) was removed

    def outputs(t: torch.Tensor) -> list[float]:
        return [round(v, 6) for v in (row @ t.T).tolist()[0]]

    return {
        "rows": len(y),
        "retained_rank": int(np.linalg.matrix_rank(phi.numpy())),
        "retained_rows": len(keep),
        "duplicates": duplicates,
        "removed": removed,
        "old_projection_distance": distance(projected),
        "release_distance": distance(theta(release.weights)),
        "release_guarantee": str(release.certificate.guarantee),
        "release_route": release.metrics.get("route"),
        "row_0_outputs": {
            "retrain": outputs(torch.from_numpy(expected)),
            "old_projection": outputs(projected),
            "release": outputs(theta(release.weights)),
        },
    }


def digest_attack() -> dict[str, Any]:
    from sklearn.datasets import load_digits

    from app.ledger.certificates import removed_ids_commitment

    candidates = [str(i) for i in range(len(load_digits().target))]
    removed = sorted(secrets.SystemRandom().sample(candidates, 20))
    results: dict[str, Any] = {"candidates": len(candidates), "removed": len(removed)}
    salt = secrets.token_hex(16)  # old: published beside its digest
    start = time.perf_counter()
    per_id = {r: hashlib.sha256(f"{salt}\n{r}".encode()).hexdigest() for r in removed}
    found = [
        c
        for c in candidates
        if hashlib.sha256(f"{salt}\n{c}".encode()).hexdigest() in per_id.values()
    ]
    results["old_salted_sha256"] = {
        "recovered": len(found),
        "seconds": time.perf_counter() - start,
        "note": "one removed id per certificate (the common single-id request): hashing every "
        "candidate with the published salt finds it",
    }
    opening = secrets.token_bytes(32)  # new: held by the requester alone
    published = {r: removed_ids_commitment(opening, [r]) for r in removed}
    start = time.perf_counter()
    guesses = [secrets.token_bytes(32) for _ in range(100)] + [b"", salt.encode()]
    hits = sum(
        removed_ids_commitment(g, [c]) in published.values() for g in guesses for c in candidates
    )
    results["hmac_commitment"] = {
        "recovered": hits,
        "seconds": time.perf_counter() - start,
        "guessed_keys": len(guesses),
        "note": "without the 256-bit opening every candidate is equally likely",
    }
    return results


def main() -> None:
    result = {
        "minnorm_dependent_rows": [
            dependent_rows(3, 1),
            dependent_rows(5, 3),
            dependent_rows(3, 3),
        ],
        "removed_ids": digest_attack(),
    }
    path = write_result("overclaim", result)
    print(path.read_text())


if __name__ == "__main__":
    main()
