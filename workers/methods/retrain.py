"""Exact retraining on the retained data with the model's own configuration and seed.

For a method that records statistics while training (recollection), the retrain records them
anew, so the next update starts from fresh, valid vectors.
"""

from __future__ import annotations

import time

from workers.methods.base import (
    CertificateFields,
    ModelSpec,
    ModelState,
    PrivacyTarget,
    RemovedSamples,
    RetainedData,
    Update,
)


class Method:
    """ε = δ = 0: the output is distributed exactly as training without the removed samples."""

    name = "retrain"
    guarantee = "exact"
    needs_retained_data = True

    def __init__(self, spec: ModelSpec) -> None:
        self.spec = spec

    def unlearn(
        self,
        state: ModelState,
        removed: RemovedSamples,
        target: PrivacyTarget,
        data: RetainedData | None,
    ) -> Update:
        from workers.methods import fit

        assert data is not None, "retrain needs the retained data"
        start = time.perf_counter()
        trained = fit(self.spec, data)
        n = len(removed.sample_ids)
        sentence = (
            f"Exact: retrained from scratch on the {len(data.sample_ids)} retained "
            f"samples with the same configuration and seed, so the model is "
            f"(ε=0, δ=0)-indistinguishable from retraining without these {n} samples."
        )
        cert = CertificateFields(
            guarantee="exact",
            epsilon=0.0,
            delta=0.0,
            sigma=0.0,
            sensitivity=0.0,
            accountant="none (exact retraining)",
            sentence=sentence,
            resets_lineage=True,
        )
        return Update(
            next_state=trained.state,
            release=trained.state,
            certificate=cert,
            statistics_to_delete=list(removed.sample_ids),
            version_kind="retrained",
            metrics={**trained.metrics, "unlearn_seconds": time.perf_counter() - start},
            replace_statistics=trained.statistics,
            record=trained.record or None,
        )
