"""Exact retraining on the retained data with the model's own configuration and seed.

For a method that records statistics while training (recollection), the retrain records them
anew, so the next update starts from fresh, valid vectors.
"""

from __future__ import annotations

import time

from app.core.states import Guarantee, VersionKind
from methods.compute import (
    CertificateFields,
    ModelState,
    Release,
    UnlearningMethod,
    UpdateInputs,
    method_for,
    register,
    these_samples,
)
from methods.retrain.spec import SPEC


@register
class Retrain(UnlearningMethod):
    """ε = δ = 0: the output is distributed exactly as training without the removed samples."""

    spec = SPEC

    def unlearn(self, inputs: UpdateInputs) -> Release:
        start = time.perf_counter()
        retained = inputs.retained
        own = method_for(self.model.method.name, self.model, self.shards)
        if inputs.state:
            trained, how = own.retrain(inputs)
        else:  # the previous state could not be read back: from scratch
            trained, how = own.train(retained), "trained from scratch (no previous state)"
        n = len(inputs.removed.sample_ids)
        sentence = (
            f"Exact: {how} on the {len(retained)} retained "
            f"samples with the same configuration and seed, so the model is "
            f"(ε=0, δ=0)-indistinguishable from retraining without {these_samples(n)}."
        )
        cert = CertificateFields(
            guarantee=Guarantee.exact,
            epsilon=0.0,
            delta=0.0,
            sigma=0.0,
            sensitivity=0.0,
            accountant="none (exact retraining)",
            sentence=sentence,
            resets_lineage=True,
        )
        return Release(
            next_state=trained.next_state,
            weights=trained.state,
            certificate=cert,
            event=None,
            statistics_to_delete=list(inputs.removed.sample_ids),
            version_kind=VersionKind.retrained,
            metrics={**trained.metrics, "unlearn_seconds": time.perf_counter() - start},
            replace_statistics=trained.statistics,
            record=trained.record or None,
            resident=trained.resident,
        )

    def reference(self, inputs: UpdateInputs, release: Release) -> ModelState:
        """An exact retrain is its own reference."""
        return release.weights
