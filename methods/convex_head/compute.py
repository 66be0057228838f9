"""convex_head: Newton removal on a strongly convex logistic head, certified by a measured shift
(Guo, Goldstein, Hannun & van der Maaten 2020, Algorithm 1 and Theorem 1, with the gradient
residual measured instead of bounded by constants).

Training solves the one-vs-rest objective to ‖∇F_D‖ ≤ tolerance (maths/convex.py). A removal
takes Newton steps on the retained objective from the noise-free state, measures
s = (‖∇F_{D_r}(w⁻)‖ + rounding) / λ ≥ ‖w⁻ − w*_r‖ in one float64 pass over the retained data,
and releases w⁻ + N(0, σ²I) with σ = β·z(ε, δ) when s ≤ β; otherwise it retrains exactly.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch

from app.core.states import Guarantee
from app.privacy.gaussian import epsilon_for
from app.privacy.lineage import gaussian_event
from app.privacy.plans import ReleasePlan
from maths import convex
from maths.training import ProgressFn
from methods.compute import (
    CertificateFields,
    Constant,
    ModelState,
    PublicInfeasible,
    Release,
    RetainedData,
    TargetInfeasible,
    Trained,
    UnlearningMethod,
    UpdateInputs,
    register,
    these_samples,
)
from methods.convex_head import removal
from methods.convex_head.spec import SPEC, ConvexHeadOptions
from methods.noise import add_gaussian, secure_generator

WEIGHT, BIAS = "1.weight", "1.bias"


class ShiftOverBudget(TargetInfeasible):
    """The measured shift exceeds β: the pipeline retrains exactly."""

    def __init__(self, shift: float, beta: float) -> None:
        # The value of s is a function of the removed rows: the reason, which the public
        # certificate carries, says only what the decision needs.
        super().__init__(f"the measured shift s exceeds the budget β = {beta:g}")
        self.shift = shift


def to_theta(state: ModelState) -> torch.Tensor:
    return torch.cat([state[WEIGHT].double(), state[BIAS].double().unsqueeze(1)], dim=1)


def to_state(theta: torch.Tensor) -> ModelState:
    return {WEIGHT: theta[:, :-1].contiguous().clone(), BIAS: theta[:, -1].contiguous().clone()}


@register
class ConvexHead(UnlearningMethod):
    spec = SPEC
    learns = True  # appended rows join the resident Hessian and gradient

    @property
    def options(self) -> ConvexHeadOptions:
        return self.model.method.options

    def problem(self, data: RetainedData) -> convex.Streamed:
        """The objective over `data`'s rows, streamed in float64 blocks from their float32."""
        o = self.options
        X, _ = data.head(1)
        features = math.prod(X.shape[1:])
        classes = self.model.n_classes
        return convex.Streamed(data.blocks, len(data), features, classes, o.R, o.lam, X.device)

    def train(self, data: RetainedData, progress: ProgressFn | None = None) -> Trained:
        """Full-batch L-BFGS then Newton polish, in float64, to ‖∇F_D(w)‖ ≤ tolerance; the
        resident state the first removal needs comes with it (`_solved`)."""
        start = time.perf_counter()
        solution, resident = self._solved(data)
        if progress is not None:
            progress(1, 1, float(solution.gradient_norm))
        metrics = {
            "train_seconds": time.perf_counter() - start,
            "n_train": len(data),
            "gradient_norm": solution.gradient_norm,
            "lbfgs_iterations": solution.iterations,
            "newton_polish_steps": solution.newton_steps,
            "weight_norm": float(torch.linalg.norm(solution.theta)),
        }
        state = to_state(solution.theta)
        return Trained(state, statistics=None, record={}, metrics=metrics, resident=resident)

    def _solved(self, data: RetainedData) -> tuple[convex.Solution, removal.Resident | None]:
        """The objective over `data`'s rows solved from a cold start (maths/convex.solve), its
        Newton polish preconditioned with the float64 anchor a removal needs
        (removal.anchor_at, in place of the float32 Hessian; the rows in their own order, so
        the solution is a function of the rows alone, in training and in the exact retrain
        alike) and its gradients measured as the resident state measures them: the state
        at the solution comes with it, with no Hessian or gradient pass after training or an
        exact retrain."""
        o = self.options
        problem = self.problem(data)
        anchors: list[removal.Anchor] = []
        last: list[removal.Resident] = []  # the state at the latest Θ measured

        def curvature(theta: torch.Tensor) -> torch.Tensor:
            anchors.append(removal.anchor_at(problem.blocks, len(data), theta, o.R, o.lam))
            return anchors[-1].H

        def measure(theta: torch.Tensor) -> torch.Tensor:
            at = removal.resident_at(anchors[-1], problem.blocks, len(data), theta, o.R, o.lam)
            last[:] = [at]
            return at.g

        solution = convex.solve(
            problem, o.tolerance, o.max_iterations, curvature=curvature, measure=measure
        )
        if not last:
            return solution, None
        resident = last[0]  # measured at the solution (convex.solve's last measure)
        return solution, replace(resident, rows=self._rows(data, resident.theta))

    def unlearn(self, inputs: UpdateInputs) -> Release:
        """Newton steps on the retained objective from the noise-free state, each bounded
        without a pass over the rows while the carried bound lasts (removal.py), and released
        with N(0, σ²I) once the bound on ‖∇F_{D_r}(w⁻)‖ is ≤ λβ."""
        start = time.perf_counter()
        o, plan = self.options, self._plan(inputs)
        if not plan.feasible:  # a function of the options and the target
            raise PublicInfeasible(plan.reason)
        resident, work = self._removal(inputs)
        shift = resident.bound / o.lam
        if shift > o.beta:
            raise ShiftOverBudget(shift, o.beta)
        facts = Bound(
            n_removed=len(inputs.removed.sample_ids),
            n_added=inputs.n_added,
            shift=shift,
            known=resident.known,
            slack=resident.b,
            before=work.before,
        )
        return self._released(inputs, resident.theta, facts, work, start, resident)

    def through_mechanism(self, inputs: UpdateInputs, exact: Release) -> Release:
        """The exact optimum on the retained rows released through the same Gaussian
        mechanism, with the same certificate: this is the very reference the
        certificate compares with, so its claim holds with room to spare, and the published
        output does not say that the measured bound ran over β. Its noise-free state starts
        the next update; the bound's constants (auditors only) are the retrain's measured
        gradient and its float64 rounding (read from the resident state the retrain left,
        else measured here)."""
        start = time.perf_counter()
        o = self.options
        theta = to_theta(exact.next_state)
        resident = exact.resident
        work = Work()
        if isinstance(resident, removal.Resident) and resident.describes(
            theta, len(inputs.retained), o.R, o.lam
        ):
            measured, slack = resident.known, resident.b
        else:
            problem = self.problem(inputs.retained)
            measured = float(torch.linalg.norm(convex.gradient(problem, theta)))
            slack = convex.rounding_bound(problem, theta)
            resident, work.gradient_passes = None, 2
        facts = Bound(
            n_removed=len(inputs.removed.sample_ids),
            n_added=inputs.n_added,
            shift=(measured + slack) / o.lam,
            known=measured,
            slack=slack,
            before=measured + slack,
        )
        return self._released(inputs, theta, facts, work, start, resident)

    def _plan(self, inputs: UpdateInputs) -> ReleasePlan:
        target = inputs.target
        return self.spec.plan(self.options, target.epsilon, target.delta)

    def _released(
        self,
        inputs: UpdateInputs,
        theta: torch.Tensor,
        facts: Bound,
        work: Work,
        start: float,
        resident: removal.Resident | None,
    ) -> Release:
        """Θ + N(0, σ²I) with σ = β·z(ε, δ), and its certificate: the same public fields
        whichever branch made Θ (the metrics that depend on the rows are auditors' only:
        app/core/services/models.PUBLIC_METRICS)."""
        o, target = self.options, inputs.target
        plan = self._plan(inputs)
        noise_free = to_state(theta)
        weights = add_gaussian(noise_free, plan.sigma, secure_generator())
        epsilon = epsilon_for(o.beta, plan.sigma, target.delta)
        return Release(
            next_state=noise_free,
            weights=weights,
            certificate=self._certificate(epsilon, plan.sigma, target.delta, facts),
            event=gaussian_event(plan.sigma, o.beta, epsilon, target.delta),
            statistics_to_delete=list(inputs.removed.sample_ids),
            metrics={
                "unlearn_seconds": time.perf_counter() - start,
                "sigma": plan.sigma,  # (s itself is for auditors: in the certificate only)
                "newton_steps": work.steps,
                "gradient_passes": work.gradient_passes,
                "hessian_passes": work.hessian_passes,
                "weight_norm": float(torch.linalg.norm(theta)),
                "expected_noise_norm": plan.sigma * float(theta.numel()) ** 0.5,
            },
            resident=resident,
        )

    def prepare(self, data: RetainedData, state: ModelState) -> removal.Resident:
        """The anchored Hessian at the trained state: the first removal then reads no row."""
        return self._anchored(data, to_theta(state))

    def export_resident(self, resident: object) -> dict[str, torch.Tensor] | None:
        """The anchor, the gradient and its bound as tensors (removal.exported)."""
        return removal.exported(resident) if isinstance(resident, removal.Resident) else None

    def import_resident(
        self, tensors: dict[str, torch.Tensor], data: RetainedData, state: ModelState
    ) -> removal.Resident | None:
        """The handed-over state when it describes `state` on `data`'s rows under these
        options (the successor's rows kept in float64 again when they fit); else None."""
        o, theta = self.options, to_theta(state)
        try:
            resident = removal.imported(tensors, theta.device)
        except (KeyError, ValueError, RuntimeError):  # not this method's tensors
            return None
        if not resident.describes(theta, len(data), o.R, o.lam):
            return None
        return replace(resident, rows=self._rows(data, theta))

    def _anchored(self, data: RetainedData, theta: torch.Tensor) -> removal.Resident:
        """The resident state anchored at Θ on `data`'s rows (one Hessian and one gradient
        pass), with the rows kept in float64 when they fit (removal.Rows)."""
        o = self.options
        rows = self._rows(data, theta)
        blocks = rows.blocks if rows is not None else self._blocks(data, theta)
        return replace(removal.anchored(blocks, len(data), theta, o.R, o.lam), rows=rows)

    def _rows(self, data: RetainedData, theta: torch.Tensor) -> removal.Rows | None:
        """`data`'s rows as one float64 (Z, T) with their sample ids, or None when they do
        not fit removal.ROWS_BYTES (then every pass streams them from float32)."""
        k, d = theta.shape
        n = len(data)
        if not removal.Rows.fit(n, d, k):
            return None
        Z = torch.empty(n, d, dtype=torch.float64, device=theta.device)
        T = torch.empty(n, k, dtype=torch.float64, device=theta.device)
        at = 0
        for X, y in data.blocks(convex.block_rows(theta.device)):
            block = self.problem_of(X.to(theta.device), y.to(theta.device))
            Z[at : at + block.n], T[at : at + block.n] = block.Z, block.T
            at += block.n
        return removal.Rows.of(Z, T, data.ids().to(theta.device))

    def _blocks(self, data: RetainedData, theta: torch.Tensor) -> removal.Blocks:
        """The rows as (Z, T) blocks on Θ's device."""

        def blocks() -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
            for X, y in data.blocks(convex.block_rows(theta.device)):
                problem = self.problem_of(X.to(theta.device), y.to(theta.device))
                yield problem.Z, problem.T

        return blocks

    def _removal(self, inputs: UpdateInputs) -> tuple[removal.Resident, Work]:
        """The state after the removal and its bound: the resident state downdated (O(k·d²))
         or anchored afresh (one Hessian pass); then Newton steps, measuring the gradient (one
         pass) when the carried bound exceeds λβ and re-anchoring when the anchor's drift is
         what keeps it there and measured steps would not reach λβ with a step to spare (a
         Hessian pass costs some 25 gradient passes at a million rows). Damped
        : a measured step that made the bound grow is rejected, and the next try
         re-anchors at the current point (a stale anchor's step can overshoot) or halves the
         step; the loop stops once a measurement's rounding floor alone exceeds λβ, which no
         step can go below."""
        o = self.options
        budget = o.lam * o.beta
        n = len(inputs.retained)
        theta = to_theta(inputs.state)
        work = Work()
        moved = self._moved(inputs)
        if moved is not None:
            state = moved
        else:
            state = self._anchored(inputs.retained, theta)
            work.hessian_passes += 1
            work.gradient_passes += 1
        rows = state.rows
        blocks = rows.blocks if rows is not None else self._blocks(inputs.retained, theta)
        work.before = state.bound

        def reanchored(at: removal.Resident) -> removal.Resident:
            work.hessian_passes += 1
            work.gradient_passes += 1
            return replace(removal.anchored(blocks, n, at.theta, o.R, o.lam), rows=rows)

        alpha = 1.0  # the step length: halved when a measured step made ‖∇F‖ grow
        while work.steps < o.newton_steps and state.bound > budget:
            stepped = removal.newton_step(state, alpha)
            work.steps += 1
            if stepped.bound <= budget:  # certified without a pass
                state = stepped
                break
            drift = stepped.last.drift if stepped.last is not None else 0.0
            tried = removal.measured(stepped, blocks)
            work.gradient_passes += 1
            stale = not torch.equal(state.anchor.theta, state.theta)
            if tried.bound < state.bound:  # the step lowered the measured bound: kept
                before, state, alpha = state.bound, tried, min(1.0, 2 * alpha)
                left = o.newton_steps - work.steps
                if (
                    drift > budget / 4
                    and work.hessian_passes < 2
                    and not removal.stale_steps_suffice(before, state.bound, budget, left)
                ):
                    state = reanchored(state)
            elif stale and work.hessian_passes < 2:  # rejected: a Hessian at this point
                state = reanchored(state)
            else:  # rejected: a shorter step along the same direction
                alpha /= 2
            if tried.b > budget:  # the measurement's rounding floor alone is over λβ
                break
        return state, work

    def _moved(self, inputs: UpdateInputs) -> removal.Resident | None:
        """The last update's resident state moved to `inputs`' retained rows: the removed rows
        taken out and the added ones put in, O(k·d²) a row, at the same Θ₀ and anchor; None
        when the worker holds none for the current state and rows."""
        o = self.options
        previous = inputs.resident
        removed = self.problem_of(inputs.removed.X, inputs.removed.y)
        theta = to_theta(inputs.state)
        before = len(inputs.retained) + removed.n - inputs.n_added
        if not isinstance(previous, removal.Resident) or not previous.describes(
            theta, before, o.R, o.lam
        ):
            return None
        state = previous
        if removed.n:
            state = removal.without(previous, removed.Z.to(theta), removed.T.to(theta))
            if previous.rows is not None:  # the removed rows leave the kept ones too
                gone = torch.as_tensor(inputs.removed.sample_ids, dtype=torch.int64)
                state = replace(state, rows=previous.rows.without(gone))
        if inputs.added is not None and inputs.n_added:
            state = self._learned(state, inputs.added, theta)
        return state

    def _learned(
        self, state: removal.Resident, added: RetainedData, theta: torch.Tensor
    ) -> removal.Resident:
        """The resident state with the appended rows added: the gradient,
        the anchor's Hessians and S updated exactly (O(k·d²) per class), the kept float64
        rows extended while they still fit."""
        joined = self.problem_of(added.X.to(theta.device), added.y.to(theta.device))
        state = removal.with_rows(state, joined.Z.to(theta), joined.T.to(theta))
        rows = state.rows
        if rows is not None:
            k, d = theta.shape
            ids = added.ids().to(theta.device)
            fits = removal.Rows.fit(state.m, d, k)
            rows = rows.with_rows(joined.Z.to(theta), joined.T.to(theta), ids) if fits else None
        return replace(state, rows=rows)

    def problem_of(self, X: torch.Tensor, y: torch.Tensor) -> convex.Problem:
        o = self.options
        return convex.Problem.of(X, y, self.model.n_classes, o.R, o.lam)

    def _certificate(
        self, epsilon: float, sigma: float, delta: float, facts: Bound
    ) -> CertificateFields:
        o = self.options
        which = (
            f"on the retained data with the {facts.n_added} appended samples learned"
            if facts.n_added and not facts.n_removed
            else f"without {these_samples(facts.n_removed)}"
            + (f" and with {facts.n_added} appended ones" if facts.n_added else "")
        )
        sentence = (
            f"(ε={epsilon:.4g}, δ={delta:.3g})-indistinguishable from the exact "
            f"optimum retrained {which}, released through the "
            f"same Gaussian mechanism: the objective is λ={o.lam:g}-strongly convex (λ applied "
            f"by Lethe, inputs clipped to ‖(x, 1)‖ ≤ R={o.R:g}), so ‖w⁻ − w*‖ ≤ s = B/λ "
            f"≤ β={o.beta:g}, where B bounds ‖∇F(w⁻)‖ on the retained data in float64 with its "
            "rounding: measured over every retained row, or carried from the last measurement "
            "by the exact downdate of the gradient and of a Hessian at an anchor, plus each "
            "Newton step's Lipschitz remainder (|ℓ‴| ≤ 1/(6√3), ‖z‖ ≤ R; Guo et al. 2020, "
            f"Theorem 1, with the data's second moment); σ = {sigma:.4g} (analytic Gaussian "
            "on Δ = β). No unverifiable constant is assumed. What is compared: this release "
            "against w*, the optimum retrained on the retained data, released through the same "
            "mechanism (Guo et al. 2020, Theorem 1); Lethe's own exact retrains and the first "
            "trained version are released without noise. When the bound cannot be brought "
            "to s ≤ β, the exact optimum retrained on the retained rows is released through "
            "this same mechanism with this same certificate (it is the reference itself), so "
            "the release does not say which branch ran; the branch, the values of s and the "
            "gradient norms, functions of the removed rows, go to auditors and admins only, "
            "committed to here."
        )
        return CertificateFields(
            guarantee=Guarantee.rigorous,
            epsilon=epsilon,
            delta=delta,
            sigma=sigma,
            sensitivity=o.beta,
            accountant="analytic Gaussian mechanism (Balle & Wang 2018) via dp-accounting",
            sentence=sentence,
            constants={
                "lambda": Constant(o.lam, "declared", "L2 regularisation, applied by Lethe"),
                "R": Constant(o.R, "declared", "bound on ‖(x, 1)‖, enforced by clipping"),
                "beta": Constant(o.beta, "declared", "shift budget (Δ of the mechanism)"),
                "logistic_third_derivative": Constant(
                    removal.LOGISTIC_THIRD,
                    "declared",
                    "max |ℓ‴| of the logistic loss, 1/(6√3) (analytic): the Lipschitz "
                    "constant of ℓ″ behind the carried remainder",
                ),
                "s": Constant(
                    facts.shift,
                    "measured",
                    "B / λ, B = gradient_norm + slack ≥ ‖∇F_{D_r}(w⁻)‖",
                    "auditors",
                    f"≤ β = {o.beta:g}",
                ),
                "gradient_norm": Constant(
                    facts.known,
                    "measured",
                    "‖g‖, g the gradient's known part (measured, or Newton's residual)",
                    "auditors",
                    "≤ λβ",
                ),
                "slack": Constant(
                    facts.slack,
                    "measured",
                    "bound on ‖∇F_{D_r}(w⁻) − g‖: float64 rounding and, since the last "
                    "measurement, the Lipschitz remainders and the anchor's Hessian mismatch",
                    "auditors",
                    "≤ λβ",
                ),
                "gradient_norm_before": Constant(
                    facts.before,
                    "measured",
                    "bound on ‖∇F_{D_r}(w)‖ at the state the update started from",
                    "auditors",
                ),
            },
            compares="release vs. the exact retrained optimum w*_r released through the same "
            "Gaussian mechanism (Guo et al. 2020, Theorem 1)",
        )

    def retrain(self, inputs: UpdateInputs) -> tuple[Trained, str]:
        """The exact retrain, solved from a cold start (zeros), as training solves: a function
        of the retained rows alone, bit for bit (warm-started from the noise-free
        state, two worlds with the same retained rows differed by 1e-10 while the certificate
        said ε = δ = 0). It leaves the resident state ready (`_solved`): the request after
        it makes no Hessian pass, and none runs beside it."""
        start = time.perf_counter()
        o = self.options
        solution, resident = self._solved(inputs.retained)
        metrics = {
            "train_seconds": time.perf_counter() - start,
            "n_train": len(inputs.retained),  # a count: .y would copy every row
            "gradient_norm": solution.gradient_norm,
            "lbfgs_iterations": solution.iterations,
            "warm_start": False,
            "weight_norm": float(torch.linalg.norm(solution.theta)),
        }
        how = (
            "solved the strongly convex objective from a cold start, as training does, to "
            f"‖∇F‖ = {solution.gradient_norm:.3g} (tolerance {o.tolerance:g}; its optimum is "
            f"unique, and this is within ‖∇F‖/λ = "
            f"{solution.gradient_norm / o.lam:.3g})"
        )
        return Trained(to_state(solution.theta), None, {}, metrics, resident=resident), how

    def reference(self, inputs: UpdateInputs, release: Release) -> ModelState:
        """The exact retrained optimum on the retained data."""
        return self.train(inputs.retained).state


@dataclass
class Work:
    """What one removal did: Newton steps and passes over the retained rows."""

    steps: int = 0
    gradient_passes: int = 0
    hessian_passes: int = 0
    before: float = 0.0


@dataclass(frozen=True)
class Bound:
    """The released state's bound, for the certificate."""

    n_removed: int
    n_added: int
    shift: float
    known: float
    slack: float
    before: float
