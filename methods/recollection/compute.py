"""Hessian-free recollection (seed 003): w_det ← w_det + Σ_{u∈U} a_u, released with Gaussian
noise calibrated by the analytic Gaussian mechanism on the Theorem 2 bound (note 003 §5,
unfolded sum) for the worst m training samples, m the count removed since the vectors were
recorded: σ is a function of the record and the count, not of which samples left.
An update that fails for a reason that depends on the rows releases the coupled retrain with
the same noise, the very reference the certificate compares with.

Conditional: it holds if the first-order remainder bound of Theorem 2 holds with the measured
ρ (power iteration on sampled batch Hessians of the trajectory; a heuristic estimate).
"""

from __future__ import annotations

import math
import time
from collections import defaultdict
from dataclasses import dataclass, replace

import torch

from app.core.states import Guarantee
from app.privacy.gaussian import epsilon_for, sigma_for
from app.privacy.lineage import gaussian_event
from maths.nets import FlatModel, build_net
from maths.training import ProgressFn
from methods.compute import (
    CertificateFields,
    Constant,
    ModelSpec,
    ModelState,
    PublicInfeasible,
    Release,
    RemovedSamples,
    RetainedData,
    StatisticsBlock,
    TargetInfeasible,
    Trained,
    UnlearningMethod,
    UpdateInputs,
    register,
    these_samples,
)
from methods.noise import check_relative_noise, draw_gaussian, secure_generator
from methods.recollection.maths import train_recollection
from methods.recollection.replay import Replay
from methods.recollection.spec import SPEC, RecollectionOptions, RecollectionRecord

KIND, SUBJECT_KIND = "recollection", "recollection_subject"


@dataclass(frozen=True)
class NoisePlan:
    """The release's noise from the record, the options, the target and the count alone."""

    removed_total: list[int]  # every sample removed since the vectors were recorded
    sensitivity: float  # Theorem 2 for the worst len(removed_total) samples
    sigma: float


@register
class Recollection(UnlearningMethod):
    spec = SPEC
    noise_from_rows = True  # σ on Theorem 2 with ρ measured on the training trajectory

    @property
    def options(self) -> RecollectionOptions:
        return self.model.method.options

    def _flat(self) -> FlatModel:
        return FlatModel(
            build_net(self.model.architecture, self.model.n_features, self.model.n_classes)
        )

    def train(self, data: RetainedData, progress: ProgressFn | None = None) -> Trained:
        """Train while recording every sample's recollection vector (Stage I + II online)."""
        o, cfg = self.options, self.model.training
        run = train_recollection(
            self.model.architecture,
            cfg,
            o.C,
            o.q,
            data.X,
            data.y,
            self.model.n_classes,
            record=True,
            rho_checks=o.rho_checks,
            power_iterations=o.power_iterations,
            progress=progress,
        )
        assert run.vectors is not None, "training was asked to record"
        d = int(run.vectors.shape[1])
        block, groups = self._block(run.vectors, data)
        record = RecollectionRecord(
            train_sample_ids=list(data.sample_ids),
            rho=run.rho,
            rho_trace=run.rho_trace,
            C=o.C,
            q=o.q,
            eta=cfg.learning_rate,
            epochs=cfg.epochs,
            batch_size=cfg.batch_size,
            seed=cfg.seed,
            weight_decay=cfg.weight_decay,
            steps=run.schedule.steps,
            clipped_steps=run.clipped_steps,
            precompute_seconds=run.seconds,
            d=d,
            storage_dtype=block.dtype,
            rows=len(block.sample_ids),
            subject_groups=groups,
            trained_norm=float(self._flat().vector(run.state).norm()),
        )
        rows, width = len(block.sample_ids), 2 if block.dtype == "float16" else 4
        metrics = {"train_seconds": run.seconds, "n_train": len(data.y), "statistics_rows": rows}
        metrics["statistics_bytes"] = rows * d * width
        return Trained(run.state, block, record.model_dump(mode="json"), metrics)

    def _block(
        self, vectors: torch.Tensor, data: RetainedData
    ) -> tuple[StatisticsBlock, dict[str, list[int]]]:
        """One row per sample, or one summed row per subject (additivity, Theorem 1)."""
        dtype = self.options.storage_dtype
        if not self.options.per_subject:
            return StatisticsBlock(
                KIND, list(data.sample_ids), [KIND] * len(data.sample_ids), vectors, dtype
            ), {}
        members: dict[str, list[int]] = defaultdict(list)
        for i, subject in enumerate(data.subjects):
            members[subject if subject is not None else f"\0{data.sample_ids[i]}"].append(i)
        ids: list[int] = []
        kinds: list[str] = []
        rows: list[torch.Tensor] = []
        groups: dict[str, list[int]] = {}
        for subject, idx in members.items():
            rep = min(data.sample_ids[i] for i in idx)
            ids.append(rep)
            rows.append(vectors[idx].sum(0))
            if subject.startswith("\0"):
                kinds.append(KIND)
            else:
                kinds.append(SUBJECT_KIND)
                groups[str(rep)] = sorted(data.sample_ids[i] for i in idx)
        return StatisticsBlock(KIND, ids, kinds, torch.stack(rows), dtype), groups

    def _sum_vectors(self, removed: RemovedSamples, record: RecollectionRecord) -> torch.Tensor:
        groups = record.subject_groups
        wanted = set(removed.sample_ids)
        covered: set[int] = set()
        total: torch.Tensor | None = None
        for sample_id, vector in removed.statistics.items():
            members = groups.get(str(sample_id), [sample_id])
            if not set(members) <= wanted:
                raise TargetInfeasible(
                    "a per-subject vector cannot remove only part of its "
                    f"subject (samples {sorted(set(members) - wanted)[:5]} "
                    "are not in this request)"
                )
            covered.update(members)
            total = vector.double() if total is None else total + vector.double()
        missing = wanted - covered
        if missing or total is None:
            raise TargetInfeasible(f"no recollection vector for samples {sorted(missing)[:5]}")
        return total

    def _replay(self, inputs: UpdateInputs) -> Replay:
        """The record's schedule as the last update left it, or replayed once per session."""
        if not inputs.record or inputs.record.get("method") != KIND:
            raise PublicInfeasible("this model has no recollection record")
        replay = inputs.resident
        if not isinstance(replay, Replay) or not replay.made_from(inputs.record):
            replay = Replay.of(inputs.record)  # O(n · epochs), once per session
        return replay

    def calibrated_sigma(self, inputs: UpdateInputs) -> float | None:
        try:
            return self._calibrated(inputs, self._replay(inputs))[2]
        except PublicInfeasible:
            return None

    def _calibrated(self, inputs: UpdateInputs, replay: Replay) -> tuple[list[int], float, float]:
        """Everything removed so far, Theorem 2's sensitivity for that many and σ: on
        `inputs.noise_record` when given (an audit's reference without the canaries),
        else on the model's own record."""
        removed, target = inputs.removed, inputs.target
        removed_total = sorted(set(removed.previously_removed) | set(removed.sample_ids))
        if inputs.noise_record is not None:
            replay = Replay.of(inputs.noise_record)
        try:
            sensitivity = replay.worst_case(len(removed_total))
        except KeyError as exc:
            raise PublicInfeasible(f"the record does not cover the removal: {exc}") from exc
        if not math.isfinite(sensitivity) or sensitivity <= 0:
            raise PublicInfeasible(
                f"the Theorem 2 bound is {sensitivity} (ρ={replay.record.rho:.4g})"
            )
        return removed_total, sensitivity, sigma_for(sensitivity, target.epsilon, target.delta)

    def plan(self, inputs: UpdateInputs, replay: Replay) -> NoisePlan:
        """σ on Theorem 2 for the worst m samples (`_calibrated`), and the public refusals
        (PublicInfeasible): σ over max_sigma, or σ√d over max_relative_noise times the
        trained weights' norm."""
        o = self.options
        removed_total, sensitivity, sigma = self._calibrated(inputs, replay)
        if o.max_sigma is not None and sigma > o.max_sigma:
            raise PublicInfeasible(
                f"σ={sigma:.4g} exceeds the configured max_sigma={o.max_sigma:g}"
            )
        record = replay.record
        if record.trained_norm is not None:
            try:
                check_relative_noise(
                    sigma, sensitivity, record.d, record.trained_norm, o.max_relative_noise
                )
            except TargetInfeasible as exc:  # σ and the trained norm are public
                raise PublicInfeasible(str(exc)) from exc
        return NoisePlan(removed_total, sensitivity, sigma)

    def unlearn(self, inputs: UpdateInputs) -> Release:
        start = time.perf_counter()
        replay = self._replay(inputs)
        plan = self.plan(inputs, replay)
        record = replay.record
        flat = self._flat()
        w_det = flat.vector(inputs.state).double()
        w_det = w_det + self._sum_vectors(inputs.removed, record)
        if record.trained_norm is None:  # a record from before the guard is private
            check_relative_noise(
                plan.sigma,
                plan.sensitivity,
                w_det.numel(),
                float(w_det.norm()),
                self.options.max_relative_noise,
            )
        release = self._released(inputs, record, plan, flat.state(w_det.float()), start)
        return replace(release, resident=replay)  # the next update's schedule, no replay

    def through_mechanism(self, inputs: UpdateInputs, exact: Release) -> Release:
        """The coupled retrain (the certificate's reference, note 003 §1.1) with the same
        noise and certificate; the exact retrain's freshly recorded vectors and
        state start the next update."""
        start = time.perf_counter()
        replay = self._replay(inputs)
        plan = self.plan(inputs, replay)
        coupled = self.reference(inputs, exact)
        release = self._released(inputs, replay.record, plan, coupled, start)
        return replace(
            release,
            next_state=exact.next_state,
            statistics_to_delete=exact.statistics_to_delete,
            replace_statistics=exact.replace_statistics,
            record=exact.record,
        )

    def _released(
        self,
        inputs: UpdateInputs,
        record: RecollectionRecord,
        plan: NoisePlan,
        noise_free: ModelState,
        start: float,
    ) -> Release:
        """noise_free + N(0, σ²I) with the plan's σ, and its certificate."""
        target = inputs.target
        flat = self._flat()
        w = flat.vector(noise_free).double()
        noise = plan.sigma * draw_gaussian(w.shape, secure_generator(), torch.float64, w.device)
        epsilon = epsilon_for(plan.sensitivity, plan.sigma, target.delta)
        n_total = len(plan.removed_total)
        return Release(
            next_state=noise_free,
            weights=flat.state((w + noise).float()),
            event=gaussian_event(plan.sigma, plan.sensitivity, epsilon, target.delta),
            certificate=self._certificate(
                record,
                epsilon,
                target.delta,
                plan.sigma,
                plan.sensitivity,
                len(inputs.removed.sample_ids),
                n_total,
            ),
            statistics_to_delete=list(inputs.removed.statistics),
            metrics={
                "unlearn_compute_seconds": time.perf_counter() - start,
                "sigma": plan.sigma,
                "sensitivity": plan.sensitivity,
                "removed_since_record": n_total,
            },
        )

    def _certificate(
        self,
        rec: RecollectionRecord,
        epsilon: float,
        delta: float,
        sigma: float,
        sensitivity: float,
        n: int,
        n_total: int,
    ) -> CertificateFields:
        rho_note = (
            f"ρ={rec.rho:.6g} measured by {self.options.power_iterations}-step "
            f"power iteration on {len(rec.rho_trace)} of {rec.steps} batch "
            "Hessians of the trajectory"
        )
        sentence = (
            f"(ε={epsilon:.4g}, δ={delta:.3g})-indistinguishable from retraining "
            f"without {these_samples(n)} (the coupled retrain: same batch order, "
            f"{n_total} samples removed since the vectors were recorded), plus the same "
            f"Gaussian noise σ={sigma:.4g} calibrated on the bound for the worst {n_total} "
            f"training samples, provided the first-order remainder bound of "
            f"seed 003 Theorem 2 holds with {rho_note}."
        )
        constants = {
            "rho": Constant(rec.rho, "measured", rho_note),
            "C": Constant(rec.C, "declared", "gradient clipping norm (enforced in training)"),
            "eta": Constant(rec.eta, "declared", "initial step size"),
            "q": Constant(rec.q, "declared", "per-step step-size decay"),
            "T": Constant(rec.steps, "measured", "SGD steps of the recorded trajectory"),
            "batch_size": Constant(rec.batch_size, "declared", "|B|, denominator kept"),
            "removed_since_record": Constant(
                n_total, "measured", "m in Theorem 2 (all removals since recording)"
            ),
        }
        return CertificateFields(
            guarantee=Guarantee.conditional,
            epsilon=epsilon,
            delta=delta,
            sigma=sigma,
            sensitivity=sensitivity,
            accountant="analytic Gaussian mechanism (Balle & Wang "
            "2018) on the seed 003 Theorem 2 bound (unfolded sum, note 003 §5) for the worst "
            "m training samples, m the count removed since recording",
            sentence=sentence,
            constants=constants,
            compares="release vs. the coupled retrain without all samples removed since "
            "recording, plus the same noise (seed 003 Definition 1)",
        )

    def reference(self, inputs: UpdateInputs, release: Release) -> ModelState:
        """The coupled retrain (note 003 §1.1): the recorded batch order without every sample
        removed since recording, the batch denominator kept."""
        if not inputs.record:
            return super().reference(inputs, release)
        order = RecollectionRecord.model_validate(inputs.record).train_sample_ids
        X, y, exclude = _in_record_order(order, inputs.retained, inputs.removed)
        return coupled_retrain(self.model, X, y, exclude)


def _in_record_order(
    order: list[int], retained: RetainedData, removed: RemovedSamples
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Features and labels in the record's order, on the device of the retained data; rows no
    longer held (erased, or removed now) are zeros and excluded."""
    rows = {s: i for i, s in enumerate(retained.sample_ids)}
    device = retained.X.device
    X = torch.zeros((len(order), *retained.X.shape[1:]), dtype=retained.X.dtype, device=device)
    y = torch.zeros(len(order), dtype=torch.long, device=device)
    exclude = torch.ones(len(order), dtype=torch.bool, device=device)
    held = [(i, rows[s]) for i, s in enumerate(order) if s in rows]
    if held:
        to = torch.tensor([i for i, _ in held], dtype=torch.long, device=device)
        source = torch.tensor([r for _, r in held], dtype=torch.long, device=device)
        X[to], y[to], exclude[to] = retained.X[source], retained.y[source], False
    return X, y, exclude


def coupled_retrain(
    spec: ModelSpec, X: torch.Tensor, y: torch.Tensor, exclude: torch.Tensor
) -> ModelState:
    """Note 003 §1.1: replay the recorded batch order without the excluded samples, keeping
    the batch denominator |B|. X, y are in the record's training order."""
    o: RecollectionOptions = spec.method.options
    return train_recollection(
        spec.architecture,
        spec.training,
        o.C,
        o.q,
        X,
        y,
        spec.n_classes,
        record=False,
        exclude=exclude,
        rho_checks=1,
        power_iterations=5,
    ).state
