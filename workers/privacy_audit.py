"""The canary experiment of a privacy audit, with no database: a shadow of the
model's recipe, trained on the model's retained rows plus canaries, the canaries it included
removed through the model's own method and decision path, every canary scored.

Each of m canaries is independently, with probability ½, either never included or included
in the shadow's training and then removed in one coalesced update (`workers.updates.decide`:
the same method, fallbacks, lineage admission and certificate fields as a real request). The
release is scored on every canary; `app/privacy/audit_bounds.py` turns the scores and the
inclusion bits into lower bounds on ε. The shadow before the removal, scored the same way, is
the control: the same canaries included and never unlearned.

What the certificate implies for one canary's bit: the release is (ε, δ)-close to retraining
without every removed canary, and that retrain is one and the same release whatever the bits
(it sees the retained rows only), so two bit vectors give (2ε, (1 + e^ε)δ)
(`implied_per_canary`). Nothing of the experiment outlives it: the canaries, the shadow's
states and the scores are dropped when `run` returns; only aggregate figures come back.
"""

from __future__ import annotations

import math
import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from functools import partial
from typing import Literal

import numpy as np
import torch

from app.core.jsontypes import JsonObject, JsonValue
from app.core.specs import PrivacyPolicy
from app.core.states import Guarantee
from app.privacy.audit_bounds import (
    AuditBounds,
    Bound,
    JointBound,
    audit_scores,
    implied_per_canary,
)
from app.privacy.lineage import LineageEvent, compose_events
from maths.ensemble import count_shards
from maths.nets import build_net, parameters_of
from maths.training import logits
from methods import RETRAIN
from methods.compute import (
    CertificateFields,
    ModelSpec,
    ModelState,
    PrivacyTarget,
    Release,
    RemovedSamples,
    RetainedData,
    Trained,
    UnlearningMethod,
    UpdateInputs,
    fit,
    method_for,
)
from workers.updates import decide
from workers.values import Decision

CanaryKind = Literal["random", "mislabelled", "leverage"]
ScoreKind = Literal["loss", "margin", "weights"]
Stage = Callable[[str], None]


@dataclass(frozen=True)
class AuditOptions:
    canaries: int = 1000
    kind: CanaryKind = "random"
    score: ScoreKind = "loss"
    confidence: float = 0.95
    control: bool = True
    sequence: int = 1  # k: the canaries' removal, then k − 1 deletions of single rows


@dataclass(frozen=True)
class Canaries:
    X: torch.Tensor
    y: torch.Tensor
    included: np.ndarray  # bool: included in training, then removed


def make_canaries(
    options: AuditOptions,
    retained: RetainedData,
    test: RetainedData,
    n_classes: int,
    rng: np.random.Generator,
) -> Canaries:
    """m canaries and their inclusion bits. `random`: inputs drawn per feature from a normal
    with the retained rows' mean and spread, labels uniform; `mislabelled`: test-split rows
    (distinct, drawn at random), and beyond the test split's size training rows (
    a copy of a row with another label, which the shadow also holds with its own), each
    given a uniformly drawn wrong label; `leverage` (linear models): `high_leverage`."""
    m = options.canaries
    if options.kind == "leverage":
        X, y = high_leverage(retained, m, n_classes, rng)
        return Canaries(X, y, rng.random(m) < 0.5)
    if options.kind == "mislabelled":
        if len(test) + len(retained) < m:
            raise ValueError(
                f"{m} mislabelled canaries need as many rows; the data has "
                f"{len(test) + len(retained)}"
            )
        from_test = min(m, len(test))
        rows = torch.from_numpy(rng.choice(len(test), size=from_test, replace=False))
        X, y = test.X[rows].clone(), test.y[rows].clone()
        if from_test < m:  # the rest synthesised from training rows
            extra = torch.from_numpy(rng.choice(len(retained), size=m - from_test, replace=False))
            X_more, y_more = retained.take(extra)
            X, y = torch.cat([X, X_more.to(X)]), torch.cat([y, y_more.to(y.device)])
        shift = torch.from_numpy(rng.integers(1, n_classes, size=m))
        y = (y + shift) % n_classes
    else:
        sample = retained.head(min(len(retained), 50_000))[0].double()
        flat = sample.reshape(len(sample), -1)
        mean, spread = flat.mean(0), flat.std(0).clamp_min(1e-6)
        noise = torch.from_numpy(rng.standard_normal((m, flat.shape[1])))
        X = (mean + spread * noise).to(retained.X.dtype).reshape(m, *retained.X.shape[1:])
        y = torch.from_numpy(rng.integers(0, n_classes, size=m))
    return Canaries(X, y.long(), rng.random(m) < 0.5)


LEVERAGE_SHARE = 4  # the canaries lie in the span of the data's d / 4 least-varied directions


def high_leverage(
    retained: RetainedData, m: int, n_classes: int, rng: np.random.Generator
) -> tuple[torch.Tensor, torch.Tensor]:
    """m canaries a linear model cannot explain with its other rows: the
    retained rows' mean plus a random direction in the span of their least-varied principal
    directions, as far from the mean as a typical row, with a uniform label. A canary's
    influence on a linear model is H⁻¹∇ℓ; along directions the data barely cover H is
    smallest, so an imperfect removal leaves most of it behind."""
    sample = retained.head(min(len(retained), 50_000))[0].double()
    flat = sample.reshape(len(sample), -1)
    mean = flat.mean(0)
    centred = flat - mean
    d = flat.shape[1]
    _, vectors = torch.linalg.eigh(centred.T @ centred / max(len(flat) - 1, 1))
    low = vectors[:, : max(1, d // LEVERAGE_SHARE)]  # eigh sorts ascending
    coefficients = torch.from_numpy(rng.standard_normal((m, low.shape[1])))
    directions = coefficients @ low.T
    directions /= torch.linalg.vector_norm(directions, dim=1, keepdim=True).clamp_min(1e-12)
    radius = float(torch.linalg.vector_norm(centred, dim=1).median())
    X = (mean + radius * directions).to(retained.X.dtype).reshape(m, *retained.X.shape[1:])
    return X, torch.from_numpy(rng.integers(0, n_classes, size=m)).long()


def weight_scores(
    spec: ModelSpec, release: ModelState, reference: ModelState, canaries: Canaries
) -> np.ndarray:
    """The white-box statistic: the release's offset from a reference
    trained without any canary, projected on each canary's direction of fit −∇ℓ/‖∇ℓ‖ at the
    reference. For a release Θ + N(0, σ²I) this is, up to a monotone map, the log likelihood
    ratio of "Θ moved toward this canary" against "Θ is the reference" under the noise
    model; when the removal was exact every canary's score is the same N(0, σ²) whatever
    the bits. Needs one network (not an ensemble)."""
    base, directions = _directions_of_fit(spec, release, reference, canaries)
    offset = {k: release[k].detach().double() - v for k, v in base.items()}
    found = [
        torch.stack([(u * offset[k]).flatten(1).sum(1) for k, u in chunk.items()]).sum(0)
        for chunk in directions
    ]
    return torch.cat(found).numpy()


HESSIAN_PARAMETERS = 4096  # up to this many noised parameters the directions use H⁻¹


def joint_shift(
    spec: ModelSpec,
    release: ModelState,
    noise_free: ModelState,
    reference: ModelState,
    canaries: Canaries,
    sigma: float,
    retained: RetainedData,
    scored: ModelState | None = None,
) -> float | None:
    """The joint-shift statistic z = ⟨Θ̃ − Θ_ref, v⟩ / (σ‖v‖), v = Σ_i b_i·d_i the summed
    influence of the included canaries at the reference, d_i = −(H + λI)⁻¹∇ℓ_i (H the
    reference's Hessian on the retained rows, where the noised parameters are at most
    HESSIAN_PARAMETERS; else −∇ℓ_i), on the coordinates the release noised: the direction an
    update that leaves their pull behind moves Θ̃ in, together, which no single canary's
    score shows (Neyman–Pearson's for a mean shift of Σ b_i·d_i in Gaussian noise). Under the
    certificate's reference (Θ_ref + N(0, σ²I)) z is exactly N(0, 1) whatever the bits: v is
    fixed by Θ_ref, the retained rows and the bits. `scored`: the state to test (the
    control's), else the release. None where σ is 0, nothing was noised or v vanishes."""
    if sigma <= 0 or count_shards(release):
        return None
    net = build_net(spec.architecture, spec.n_features, spec.n_classes).double()
    base = {k: v.detach().double() for k, v in parameters_of(net, reference).items()}
    noised = {
        k: release[k] != noise_free[k]
        for k in base
        if k in release and k in noise_free and noise_free[k].shape == release[k].shape
    }
    keys = [k for k in base if k in noised and bool(noised[k].any())]
    if not keys:
        return None
    mask = torch.cat([noised[k].reshape(-1) for k in keys])
    grads = _flat_gradients(net, base, keys, canaries.X.double(), canaries.y)[:, mask]
    if int(mask.sum()) <= HESSIAN_PARAMETERS:
        hessian = _flat_hessian(net, base, keys, retained)[mask][:, mask]
        damping = 1e-3 * float(hessian.diagonal().mean().clamp_min(1e-12))
        hessian += (damping + spec.training.weight_decay) * torch.eye(
            len(hessian), dtype=hessian.dtype
        )
        grads = torch.linalg.solve(hessian, grads.T).T
    included = torch.from_numpy(canaries.included.astype(np.float64))
    v = -(included @ grads)
    state = release if scored is None else scored
    offset = torch.cat([(state[k].double() - base[k]).reshape(-1) for k in keys])[mask]
    norm = float(torch.linalg.vector_norm(v))
    return None if norm == 0 else float(offset @ v) / (sigma * norm)


def _flat_gradients(
    net: torch.nn.Module,
    base: dict[str, torch.Tensor],
    keys: list[str],
    X: torch.Tensor,
    y: torch.Tensor,
) -> torch.Tensor:
    """Each row's loss gradient at `base`, flattened over `keys` (m × p, float64)."""
    fixed = {k: v for k, v in base.items() if k not in keys}

    def loss(params: dict[str, torch.Tensor], x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
        out = torch.func.functional_call(net, {**fixed, **params}, (x.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(out, t.unsqueeze(0))

    gradient = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))
    own = {k: base[k] for k in keys}
    rows = []
    for start in range(0, len(X), 256):
        g = gradient(own, X[start : start + 256], y[start : start + 256])
        rows.append(torch.cat([g[k].flatten(1) for k in keys], dim=1))
    return torch.cat(rows)


def _flat_hessian(
    net: torch.nn.Module, base: dict[str, torch.Tensor], keys: list[str], data: RetainedData
) -> torch.Tensor:
    """The mean training loss's Hessian at `base` over `keys` on the retained rows (p × p)."""
    fixed = {k: v for k, v in base.items() if k not in keys}
    shapes = [(k, base[k].shape, base[k].numel()) for k in keys]
    X, y = data.X.double(), data.y

    def loss(theta: torch.Tensor) -> torch.Tensor:
        params, at = {}, 0
        for k, shape, size in shapes:
            params[k] = theta[at : at + size].reshape(shape)
            at += size
        out = torch.func.functional_call(net, {**fixed, **params}, (X,))
        return torch.nn.functional.cross_entropy(out, y)

    theta = torch.cat([base[k].reshape(-1) for k in keys])
    return torch.func.hessian(loss)(theta)


def _directions_of_fit(
    spec: ModelSpec,
    release: ModelState,
    reference: ModelState,
    canaries: Canaries,
) -> tuple[dict[str, torch.Tensor], list[dict[str, torch.Tensor]]]:
    """The reference's parameters (float64) and, 256 canaries at a time, each canary's unit
    direction of fit −∇ℓ/‖∇ℓ‖ at the reference."""
    if count_shards(release):
        raise ValueError("the weights score needs one network, not an ensemble")
    net = build_net(spec.architecture, spec.n_features, spec.n_classes)
    base = {k: v.detach().double() for k, v in parameters_of(net, reference).items()}
    net = net.double()

    def loss(params: dict[str, torch.Tensor], x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        out = torch.func.functional_call(net, params, (x.unsqueeze(0),))
        return torch.nn.functional.cross_entropy(out, y.unsqueeze(0))

    gradients = torch.func.vmap(torch.func.grad(loss), in_dims=(None, 0, 0))
    chunks = []
    X = canaries.X.double()
    for start in range(0, len(X), 256):
        grads = gradients(base, X[start : start + 256], canaries.y[start : start + 256])
        norm = torch.sqrt(sum((g * g).flatten(1).sum(1) for g in grads.values()))
        scale = norm.clamp_min(1e-300)
        chunks.append({k: -g / scale.reshape(-1, *([1] * (g.dim() - 1))) for k, g in grads.items()})
    return base, chunks


@torch.no_grad()
def scores(spec: ModelSpec, state: ModelState, canaries: Canaries, kind: ScoreKind) -> np.ndarray:
    """Higher means "the release fits this canary": −loss, or the logit margin of the
    canary's label over the best other class."""
    out = logits(spec.architecture, state, canaries.X, spec.n_classes, spec.aggregation).double()
    y = canaries.y
    if kind == "loss":
        return -torch.nn.functional.cross_entropy(out, y, reduction="none").numpy()
    own = out.gather(1, y.unsqueeze(1)).squeeze(1)
    others = out.scatter(1, y.unsqueeze(1), -math.inf).max(1).values
    return (own - others).numpy()


@dataclass(frozen=True)
class AuditRun:
    """What one audit found: the certificate it audited, the bounds, the control's."""

    method: str  # what made the release (the configured method, or `retrain` on fallback)
    fallback_reason: str | None
    guarantee: str
    certified_epsilon: float | None
    certified_delta: float | None
    implied_epsilon: float | None
    implied_delta: float | None
    audit_delta: float  # the δ the bounds were computed at
    bounds: AuditBounds
    control: AuditBounds | None
    included: int
    seconds: dict[str, JsonValue]
    # how σ was calibrated when the method measures it on the rows
    noise: JsonObject | None = None
    # a lineage audit's releases in order (one: the canaries' removal alone)
    releases: list[JsonObject] = field(default_factory=list)
    # the control's joint bound under each score the model allows
    power: dict[str, float] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        """From the joint test of the certificate's own (ε, δ): violated when its
        lower bound exceeds the certified ε; inconclusive when not even a perfect attack with
        these canaries could exceed it, or when the control (the canaries never unlearned)
        does not exceed it either: the audit has no power on this model; uncertified when the
        release claims nothing (guarantee `none`); else consistent."""
        joint = self.bounds.joint
        claim = self.certified_epsilon
        if claim is None or joint is None:
            return "uncertified"
        if joint.epsilon > claim:
            return "violated"
        control = self.control.joint if self.control is not None else None
        if joint.ceiling <= claim or (control is not None and control.epsilon <= claim):
            return "inconclusive"
        return "consistent"

    @property
    def audited(self) -> str:
        """What made the release the audit scored, in words: a fallback's is the exact retrain
        (the audit then says nothing of the configured method's own update)."""
        if self.method == RETRAIN and self.fallback_reason:
            return f"the exact retrain (the method fell back: {self.fallback_reason})"
        if self.fallback_reason:  # the retrain released through the method's mechanism
            return f"{self.method}, its exact retrain released through its mechanism"
        return self.method

    def document(self) -> JsonObject:
        """The audit's result as published: aggregate figures only, no canary or score."""
        return {
            "method": self.method,
            "audited": self.audited,
            "fallback_reason": self.fallback_reason,
            "guarantee": self.guarantee,
            "certified_epsilon": self.certified_epsilon,
            "certified_delta": self.certified_delta,
            "implied_epsilon": self.implied_epsilon,
            "implied_delta": self.implied_delta,
            "audit_delta": self.audit_delta,
            "verdict": self.verdict,
            "joint": _joint(self.bounds.joint),
            "one_run": _bound(self.bounds.one_run),
            "fdp": _bound(self.bounds.fdp),
            "ceiling_one_run": self.bounds.ceiling_one_run,
            "ceiling_fdp": self.bounds.ceiling_fdp,
            "auc": self.bounds.auc,
            "rules_tested": self.bounds.rules_tested,
            "control": None
            if self.control is None
            else {
                "joint": _joint(self.control.joint),
                "one_run": _bound(self.control.one_run),
                "fdp": _bound(self.control.fdp),
                "auc": self.control.auc,
            },
            "canaries_included": self.included,
            "control_power": dict(self.power),
            "strongest_score": max(self.power, key=self.power.__getitem__) if self.power else None,
            "sequence": max(1, len(self.releases)),
            "releases": list(self.releases),
            "noise": self.noise,
            "seconds": dict(self.seconds),
        }


def _joint(j: JointBound | None) -> JsonObject | None:
    """The joint test's figures: the bound on the certificate's own ε, the statistic that
    proved it, its null p-value, the ceiling, how many statistics shared α."""
    if j is None:
        return None
    return {
        "epsilon": j.epsilon,
        "statistic": j.statistic,
        "p_null": math.exp(j.log_p_null),
        "log_p_null": j.log_p_null,
        "ceiling": j.ceiling,
        "statistics": j.statistics,
        "level": j.level,
    }


def _bound(b: Bound) -> JsonObject:
    return {
        "epsilon": b.epsilon,
        "guesses": b.guesses,
        "right": b.right,
        "rule": None
        if b.rule is None
        else {"positive": b.rule.positive, "negative": b.rule.negative},
    }


def run(
    spec: ModelSpec,
    policy: PrivacyPolicy,
    retained: RetainedData,
    test: RetainedData,
    options: AuditOptions,
    stage: Stage | None = None,
    seed: int | None = None,
) -> AuditRun:
    """Train the shadow, remove its included canaries, score, bound (module docstring)."""
    say = stage or (lambda _: None)
    rng = np.random.default_rng(seed if seed is not None else secrets.randbits(128))
    clock: dict[str, JsonValue] = {}
    started = time.perf_counter()
    canaries = make_canaries(options, retained, test, spec.n_classes, rng)
    inc = torch.from_numpy(np.flatnonzero(canaries.included))
    first = max(retained.sample_ids, default=0) + 1
    ids = list(range(first, first + len(inc)))
    shadow_data = _with_canaries(retained, canaries, inc, ids)
    method = method_for(spec.method.name, spec)
    reference = _reference(spec, retained, options, method, say, clock)
    scored = partial(_score, spec, options, canaries, reference)
    say("training the shadow")
    t0 = time.perf_counter()
    trained = fit(spec, shadow_data)
    clock["train"] = time.perf_counter() - t0
    control = scored(trained.state) if options.control else None
    say("removing the canaries")
    t0 = time.perf_counter()
    removed = RemovedSamples(ids, canaries.X[inc], canaries.y[inc], _vectors(trained, ids))
    resident = trained.resident
    if resident is None:  # not made while training
        resident = method.prepare(shadow_data, trained.next_state)
    inputs = _removal(spec, policy, trained, removed, retained, test, resident)
    noise: JsonObject | None = None
    if method.noise_from_rows and reference is not None:
        inputs, noise = _calibrated_on_reference(method, inputs, reference)
    decisions = [decide(inputs)]
    if options.sequence > 1:
        say(f"{options.sequence - 1} more deletions in sequence")
        later = _LaterDeletions(spec, policy, method, trained, reference, test, ids)
        decisions += later.run(decisions[0], retained, options.sequence - 1, rng)
    clock["unlearn"] = time.perf_counter() - t0
    say("scoring the canaries")
    opening, cert = decisions[0].release, _sequence_certificate(decisions, policy)
    shift = partial(_shift, spec, opening, reference, canaries, cert.sigma, retained)
    # the sequence's scores: each canary's mean over its releases
    found = np.mean([scored(d.release.weights) for d in decisions], axis=0)
    bounds = _audited(cert, policy, options, canaries, found, rng, shift())
    control_bounds = (
        None
        if control is None
        else _audited(cert, policy, options, canaries, control, rng, shift(trained.state))
    )
    power = (
        _control_power(spec, cert, policy, options, canaries, trained, reference, rng)
        if options.control
        else {}
    )
    clock["total"] = time.perf_counter() - started
    result = _result(decisions[-1], policy, bounds, control_bounds, canaries, clock, noise, cert)
    return replace(result, releases=[_release_view(d) for d in decisions], power=power)


def _control_power(
    spec: ModelSpec,
    cert: CertificateFields,
    policy: PrivacyPolicy,
    options: AuditOptions,
    canaries: Canaries,
    trained: Trained,
    reference: Trained | None,
    rng: np.random.Generator,
) -> dict[str, float]:
    """The control's joint bound under every score this model allows (weights: one network
    with a reference): which attack can see inclusion here at all, to choose the score by
    power rather than by name."""
    found: dict[str, float] = {}
    kinds: list[ScoreKind] = ["loss", "margin"]
    if reference is not None and not count_shards(trained.state):
        kinds.append("weights")
    for kind in kinds:
        chosen = replace(options, score=kind)
        control = _score(spec, chosen, canaries, reference, trained.state)
        joint = _audited(cert, policy, chosen, canaries, control, rng).joint
        found[kind] = joint.epsilon if joint is not None else 0.0
    return found


@dataclass(frozen=True)
class _LaterDeletions:
    """A lineage's later requests after the canaries' removal, each of one retained row drawn
    independently of the bits: every release's reference (the retrain without all canaries
    and the rows dropped so far) is then one and the same whatever the bits, so the whole
    sequence is tested against the composition of its releases (`_sequence_certificate`)."""

    spec: ModelSpec
    policy: PrivacyPolicy
    method: UnlearningMethod
    trained: Trained
    reference: Trained | None
    test: RetainedData
    canary_ids: list[int]

    def run(
        self, first: Decision, retained: RetainedData, count: int, rng: np.random.Generator
    ) -> list[Decision]:
        decisions, history, kept = [first], _history_after([], first), retained
        removed_so_far = list(self.canary_ids)
        for _ in range(count):
            at = int(rng.integers(len(kept)))
            drop = kept.sample_ids[at]
            removed = RemovedSamples(
                [drop],
                kept.X[at : at + 1],
                kept.y[at : at + 1],
                _vectors(self.trained, [drop]),
                previously_removed=list(removed_so_far),
            )
            remaining = _without(kept, at)
            state = decisions[-1].release.next_state
            resident = self.method.prepare(kept, state)
            inputs = replace(
                _removal(self.spec, self.policy, self.trained, removed, remaining, self.test,
                         resident),
                state=state,
                history=history,
            )  # fmt: skip
            if self.method.noise_from_rows and self.reference is not None:
                inputs = _calibrated_on_reference(self.method, inputs, self.reference)[0]
            decision = decide(inputs)
            decisions.append(decision)
            history = _history_after(history, decision)
            kept, removed_so_far = remaining, [*removed_so_far, drop]
        return decisions[1:]


def _history_after(history: list[LineageEvent], decision: Decision) -> list[LineageEvent]:
    """The lineage once `decision` is released: reset by an exact release."""
    release = decision.release
    if release.event is None or release.certificate.resets_lineage:
        return []
    return [*history, release.event]


def _without(data: RetainedData, at: int) -> RetainedData:
    """`data` less its row `at`."""
    keep = [i for i in range(len(data)) if i != at]
    rows = torch.tensor(keep, dtype=torch.int64)
    subjects, external = data.subjects, data.external_ids
    return RetainedData(
        [data.sample_ids[i] for i in keep],
        data.X[rows],
        data.y[rows],
        [subjects[i] for i in keep] if subjects else [],
        [external[i] for i in keep] if external else [],
    )


def _sequence_certificate(decisions: list[Decision], policy: PrivacyPolicy) -> CertificateFields:
    """What a sequence of releases claims together: one release's own certificate; for
    several, the composition of their noisy releases at the lineage's δ
    (`app/privacy/lineage.compose_events`), with the weakest of their guarantees."""
    last = decisions[-1].release.certificate
    if len(decisions) == 1:
        return last
    events = [d.release.event for d in decisions if d.release.event is not None]
    if not events:
        return replace(last, guarantee=Guarantee.exact, epsilon=0.0, delta=0.0)
    spent = compose_events(events, policy.lineage_delta)
    guarantees = {d.release.certificate.guarantee for d in decisions}
    weakest = next(
        g for g in (Guarantee.none, Guarantee.conditional, Guarantee.rigorous) if g in guarantees
    )
    claim = None if weakest == Guarantee.none else spent
    return replace(
        decisions[0].release.certificate,
        guarantee=weakest,
        epsilon=None if claim is None else claim.epsilon,
        delta=None if claim is None else claim.delta,
        accountant=spent.accountant,
    )


def _release_view(decision: Decision) -> JsonObject:
    """One release of the audited sequence, as the result lists it."""
    cert = decision.release.certificate
    return {
        "method": decision.method,
        "guarantee": str(cert.guarantee),
        "epsilon": cert.epsilon,
        "delta": cert.delta,
    }


def _shift(
    spec: ModelSpec,
    release: Release,
    reference: Trained | None,
    canaries: Canaries,
    sigma: float,
    retained: RetainedData,
    scored: ModelState | None = None,
) -> float | None:
    """The joint-shift z of the release (or of `scored`, the control), where it applies: a
    noisy release of one network, a reference trained without canaries."""
    if reference is None or not math.isfinite(sigma) or sigma <= 0:
        return None
    return joint_shift(
        spec,
        release.weights,
        release.next_state,
        reference.state,
        canaries,
        sigma,
        retained,
        scored,
    )


def _reference(
    spec: ModelSpec,
    retained: RetainedData,
    options: AuditOptions,
    method: UnlearningMethod,
    say: Stage,
    clock: dict[str, JsonValue],
) -> Trained | None:
    """The model trained without any canary, where the scores, the noise or the joint shift
    (a noisy method's release of one network) need one: one and the same whatever the bits."""
    noisy = method.spec.guarantee in (Guarantee.rigorous, Guarantee.conditional)
    one_network = spec.method.spec.aggregation is None
    if options.score != "weights" and not method.noise_from_rows and not (noisy and one_network):
        return None
    say("training the reference without canaries")
    t0 = time.perf_counter()
    reference = fit(spec, retained)
    clock["reference"] = time.perf_counter() - t0
    return reference


def _score(
    spec: ModelSpec,
    options: AuditOptions,
    canaries: Canaries,
    reference: Trained | None,
    state: ModelState,
) -> np.ndarray:
    """The canaries' scores on `state`: higher means more likely included."""
    if options.score == "weights":
        assert reference is not None
        return weight_scores(spec, state, reference.state, canaries)
    return scores(spec, state, canaries, options.score)


def _removal(
    spec: ModelSpec,
    policy: PrivacyPolicy,
    trained: Trained,
    removed: RemovedSamples,
    retained: RetainedData,
    test: RetainedData,
    resident: object,
) -> UpdateInputs:
    """The update that removes the included canaries from the shadow, as a deletion's is."""
    return UpdateInputs(
        model_id=0,
        spec=spec,
        method=spec.method,
        policy=policy,
        target=PrivacyTarget(policy.epsilon, policy.delta),
        state=trained.next_state,
        removed=removed,
        retained=retained,
        test=test,
        history=[],
        record=trained.record,
        resident=resident,
    )


def _result(
    decision: Decision,
    policy: PrivacyPolicy,
    bounds: AuditBounds,
    control: AuditBounds | None,
    canaries: Canaries,
    clock: dict[str, JsonValue],
    noise: JsonObject | None,
    cert: CertificateFields,
) -> AuditRun:
    exact = cert.guarantee == Guarantee.exact
    implied = _implied(cert)
    return AuditRun(
        method=decision.method,
        fallback_reason=getattr(decision, "reason", None) or getattr(decision, "branch", None),
        guarantee=str(cert.guarantee),
        certified_epsilon=0.0 if exact else cert.epsilon,
        certified_delta=0.0 if exact else cert.delta,
        implied_epsilon=None if implied is None else implied[0],
        implied_delta=None if implied is None else implied[1],
        audit_delta=_audit_delta(cert, policy),
        bounds=bounds,
        control=control,
        included=int(canaries.included.sum()),
        seconds=clock,
        noise=noise,
    )


def _with_canaries(
    retained: RetainedData, canaries: Canaries, inc: torch.Tensor, ids: list[int]
) -> RetainedData:
    """The shadow's training rows: the retained ones and the included canaries."""
    return RetainedData(
        [*retained.sample_ids, *ids],
        torch.cat([retained.X, canaries.X[inc]]),
        torch.cat([retained.y, canaries.y[inc]]),
        [*retained.subjects, *([None] * len(ids))] if retained.subjects else [],
        [*retained.external_ids, *(f"canary-{i}" for i in ids)] if retained.external_ids else [],
    )


def _vectors(trained: Trained, ids: list[int]) -> dict[int, torch.Tensor]:
    """The per-sample statistics the shadow's training recorded for the canaries `ids`."""
    stats = trained.statistics
    vectors = {s: stats.vectors[i] for i, s in enumerate(stats.sample_ids)} if stats else {}
    return {s: vectors[s] for s in ids if s in vectors}


def _calibrated_on_reference(
    method: UnlearningMethod, inputs: UpdateInputs, reference: Trained
) -> tuple[UpdateInputs, JsonObject]:
    """σ calibrated on the reference's measured constants: a function of the count of
    included canaries alone, which the joint test's nulls allow (audit_bounds)."""
    calibrated = replace(inputs, noise_record=reference.record)
    noise: JsonObject = {
        "calibrated_on": "the retained rows without canaries (the certificate's reference)",
        "sigma": method.calibrated_sigma(calibrated),
        "sigma_on_the_shadow": method.calibrated_sigma(inputs),
    }
    return calibrated, noise


def _implied(cert: CertificateFields) -> tuple[float, float] | None:
    """The (ε′, δ′) the certificate implies per canary (None: a heuristic claims none)."""
    if cert.guarantee == Guarantee.exact:
        return (0.0, 0.0)
    if cert.epsilon is None or cert.delta is None:
        return None
    return implied_per_canary(cert.epsilon, cert.delta)


def _audit_delta(cert: CertificateFields, policy: PrivacyPolicy) -> float:
    """The δ the per-canary bounds are at: δ = 0 (exact) is tested at the policy's δ
    (rejecting (0, δ) rejects (0, 0) too)."""
    implied = _implied(cert)
    return implied[1] if implied is not None and implied[1] > 0 else policy.delta


def _audited(
    cert: CertificateFields,
    policy: PrivacyPolicy,
    options: AuditOptions,
    canaries: Canaries,
    found: np.ndarray,
    rng: np.random.Generator,
    shift: float | None = None,
) -> AuditBounds:
    """The bounds of one set of scores (and the joint shift, where it applies); the joint
    test is of the certificate's own δ (0 for an exact release)."""
    bad = int((~np.isfinite(found)).sum())
    if bad:
        raise ValueError(
            f"{bad} of {len(found)} canary scores are not finite: the release's weights "
            f"overflow the {options.score} score (its σ = {cert.sigma:.3g}, a release drowned "
            "in noise; the policy's max_relative_noise replaces such a release by the exact "
            "retrain)"
        )
    exact = cert.guarantee == Guarantee.exact
    claimed_delta = 0.0 if exact else (cert.delta if cert.delta is not None else policy.delta)
    delta = _audit_delta(cert, policy)
    return audit_scores(
        found, canaries.included, delta, options.confidence, claimed_delta, rng, shift
    )
