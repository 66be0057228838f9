"""Batched Hessian-vector products of one step's batch loss, for the recollection recursion.

At a step with batch B_t, of which `members` are the samples still trained on, the loss is

    L_t(w) = (1/|B_t|)·Σ_{i∈members} CE(f(w; x_i), y_i) + (λ/2)·‖w‖²

(the denominator is the full |B_t| even when members are excluded: the coupled retrain of
note 003 §1.1), and the recursion applies V ↦ V·(H̄_t + λI) to every recorded vector: the rows
of a matrix V (the Hessian is symmetric, so rows and columns are the same thing).

Three implementations, chosen by architecture (`curvature_for`):

- `LogRegCurvature`: multinomial logistic regression has a batch Hessian of rank ≤ |B|·c,
  H̄ = (1/|B_t|)·Σ_i (diag(p_i) − p_i p_iᵀ) ⊗ x̃_i x̃_iᵀ with x̃_i = (x_i, 1). With each vector held
  as a (c, f+1) matrix Θ = [W | b], a block of m vectors is one (m·c, f+1) matrix and
  V·H̄ = two thin GEMMs: U = V·X̃_Bᵀ, each sample's softmax Jacobian on U's columns, then U·X̃_B.
- `MLPCurvature`: Pearlmutter's R-operator written out for the Linear/activation stacks of
  `build_net` (forward R-pass, then the backward pass's R-pass), batched over the vectors with
  big GEMMs and batched matmuls; exact, including the σ'' terms of smooth activations.
- `FuncCurvature`: torch.func (vmap over jvp of grad), for any architecture.

Each works in an internal layout of the parameter vector (`to_internal` / `to_flat`, a fixed
permutation of coordinates): LogRegCurvature uses the row-major [W | b] layout so that a block of
vectors is one GEMM operand; the others use FlatModel's order. Every tensor lives on X's device.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Callable

import torch
from torch import nn
from torch.func import grad, jvp, vmap

from app.core.jsontypes import JsonObject
from app.core.specs import ArchitectureSpec, LogRegSpec, MLPSpec, architecture_of
from maths.nets import FlatModel

# Vectors per call, from a sweep on CPU and on a GPU (where larger chunks amortise kernel
# launches): the generic path, the logreg closed form, and the
# MLP R-operator's chunk·|B|·width floats per intermediate (256 vectors at |B| = width = 64).
FUNC_CHUNK = 2048
LOGREG_CHUNK = {"cpu": 1024, "cuda": 8192}
MLP_CHUNK_FLOATS = {"cpu": 1 << 20, "cuda": 1 << 24}

Rows = Callable[[torch.Tensor], torch.Tensor]


class ClipJacobian:
    """J of x ↦ x·min(1, C/‖x‖) at g, applied to rows of a matrix (g in the same layout)."""

    def __init__(self, g: torch.Tensor, C: float) -> None:
        norm = float(g.norm())
        self.identity = norm <= C
        self.scale = C / norm if not self.identity else 1.0
        self.ghat = g / norm if not self.identity else g

    def __call__(self, V: torch.Tensor) -> torch.Tensor:
        if self.identity:
            return V
        return self.scale * (V - (V @ self.ghat).unsqueeze(-1) * self.ghat)


def batch_loss_of(
    model: FlatModel, Xb: torch.Tensor, yb: torch.Tensor, size: int, lam: float
) -> Callable[[torch.Tensor], torch.Tensor]:
    """w ↦ (1/size)·Σ CE + (λ/2)‖w‖² over the members (Xb, yb); size is the full |B_t|."""

    def batch_loss(wv: torch.Tensor) -> torch.Tensor:
        ce = (
            nn.functional.cross_entropy(model.logits(wv, Xb), yb, reduction="sum")
            if len(yb)
            else wv.sum() * 0.0
        )
        return ce / size + 0.5 * lam * (wv @ wv)

    return batch_loss


class StepCurvature(ABC):
    """One step's operator: (H̄_t + λI) on rows, and the members' per-sample gradients."""

    chunk: int

    @abstractmethod
    def hvp(self, V: torch.Tensor) -> torch.Tensor:
        """(H̄_t + λI)·v for every row v of V (m, d), internal layout; V is not modified."""

    @abstractmethod
    def sample_grads(self) -> torch.Tensor:
        """(|members|, d): ∇_w CE(f(w; x_i), y_i) for each member, internal layout."""

    def descend_(self, V: torch.Tensor, eta: float, J: ClipJacobian) -> None:
        """V ← V − η·J·(H̄_t + λI)·V in place, in chunks (V contiguous)."""
        for s in range(0, len(V), self.chunk):
            block = V[s : s + self.chunk]
            block.sub_(J(self.hvp(block)), alpha=eta)


class Curvature(ABC):
    """Per architecture: the internal layout, and the step operator at (w, members, |B_t|)."""

    d: int
    flat_layout = True  # the internal layout is FlatModel's order

    def to_internal(self, v: torch.Tensor) -> torch.Tensor:
        return v

    def to_flat(self, v: torch.Tensor) -> torch.Tensor:
        return v

    @abstractmethod
    def at(self, w: torch.Tensor, rows: torch.Tensor, size: int) -> StepCurvature:
        """The operator at flat parameters w for the members X[rows], y[rows]."""


# ---- generic: torch.func ---------------------------------------------------------------------


class FuncCurvature(Curvature):
    """vmap over jvp of grad: forward-over-reverse HVPs for any architecture."""

    def __init__(
        self, model: FlatModel, X: torch.Tensor, y: torch.Tensor, lam: float, chunk: int
    ) -> None:
        self.model, self.X, self.y, self.lam, self.chunk = model, X, y, lam, chunk
        self.d = sum(model.numels)

        def ce_single(wv: torch.Tensor, x: torch.Tensor, t: torch.Tensor) -> torch.Tensor:
            return nn.functional.cross_entropy(model.logits(wv, x.unsqueeze(0)), t.unsqueeze(0))

        self.per_sample_grad = vmap(grad(ce_single), in_dims=(None, 0, 0))

    def at(self, w: torch.Tensor, rows: torch.Tensor, size: int) -> StepCurvature:
        return _FuncStep(self, w, self.X[rows], self.y[rows], size)


class _FuncStep(StepCurvature):
    def __init__(
        self, curv: FuncCurvature, w: torch.Tensor, Xb: torch.Tensor, yb: torch.Tensor, size: int
    ) -> None:
        self.curv, self.w, self.Xb, self.yb, self.chunk = curv, w, Xb, yb, curv.chunk
        grad_fn = grad(batch_loss_of(curv.model, Xb, yb, size, curv.lam))

        def hvp1(v: torch.Tensor) -> torch.Tensor:
            return jvp(grad_fn, (w,), (v,))[1]

        self._hvp = vmap(hvp1)

    def hvp(self, V: torch.Tensor) -> torch.Tensor:
        return torch.cat([self._hvp(V[s : s + self.chunk]) for s in range(0, len(V), self.chunk)])

    def sample_grads(self) -> torch.Tensor:
        return self.curv.per_sample_grad(self.w, self.Xb, self.yb)


# ---- logistic regression: the rank-|B| closed form -------------------------------------------


class LogRegCurvature(Curvature):
    """Multinomial logistic regression f(w; x) = W·φ(x) + b, φ the fixed first layer (flatten,
    or ClipFeatures). Internal layout: Θ = [W | b] row-major, (c, f+1) per vector (W alone,
    which is FlatModel's order already, for a Linear without bias)."""

    def __init__(
        self, net: nn.Module, X: torch.Tensor, y: torch.Tensor, lam: float, chunk: int
    ) -> None:
        first, linear = list(net.children())
        assert isinstance(linear, nn.Linear), "logreg is nn.Sequential(features, Linear)"
        self.c, self.f = linear.weight.shape
        self.bias = linear.bias is not None
        self.f1 = self.f + int(self.bias)
        self.flat_layout = not self.bias
        self.d = self.c * self.f1
        with torch.no_grad():
            feats = first(X).reshape(len(X), -1)
        # x̃ = (x, 1) with a bias, x without
        self.Xt = torch.cat([feats, torch.ones_like(feats[:, :1])], 1) if self.bias else feats
        self.y, self.lam, self.chunk = y, lam, chunk

    def to_internal(self, v: torch.Tensor) -> torch.Tensor:
        if not self.bias:
            return v
        lead, cf = v.shape[:-1], self.c * self.f
        W = v[..., :cf].reshape(*lead, self.c, self.f)
        return torch.cat([W, v[..., cf:].unsqueeze(-1)], -1).reshape(*lead, self.d)

    def to_flat(self, v: torch.Tensor) -> torch.Tensor:
        if not self.bias:
            return v
        lead = v.shape[:-1]
        T = v.reshape(*lead, self.c, self.f1)
        return torch.cat([T[..., : self.f].reshape(*lead, self.c * self.f), T[..., self.f]], -1)

    def at(self, w: torch.Tensor, rows: torch.Tensor, size: int) -> StepCurvature:
        return _LogRegStep(self, self.to_internal(w), rows, size)


class _LogRegStep(StepCurvature):
    def __init__(self, curv: LogRegCurvature, theta: torch.Tensor, rows: torch.Tensor, size: int):
        self.c, self.f1, self.lam, self.size = curv.c, curv.f1, curv.lam, size
        self.chunk = curv.chunk
        self.Xb = curv.Xt[rows]  # (B, f+1)
        self.yb = curv.y[rows]
        self.XbT = self.Xb.T.contiguous()
        theta = theta.reshape(self.c, self.f1)
        self.P = torch.softmax(self.Xb @ theta.T, 1)  # (B, c)
        self.Pt = self.P.T.contiguous()  # (c, B)

    def _softmax_jacobian(self, V: torch.Tensor) -> torch.Tensor:
        """Z (m·c, B): column j of each vector's U = Θ_v·X̃_Bᵀ times (diag p_j − p_j p_jᵀ)."""
        m, B = len(V), len(self.Xb)
        U = torch.mm(V.view(m * self.c, self.f1), self.XbT).view(m, self.c, B)
        U.mul_(self.Pt)  # p_j ⊙ u_j
        s = U.sum(1, keepdim=True)  # (m, 1, B): p_jᵀ u_j
        return U.addcmul_(self.Pt, s, value=-1.0).view(m * self.c, B)  # p_j ⊙ u_j − p_j·(p_jᵀu_j)

    def hvp(self, V: torch.Tensor) -> torch.Tensor:
        if len(self.Xb) == 0:
            return self.lam * V
        out = torch.empty_like(V)
        for s in range(0, len(V), self.chunk):
            block = V[s : s + self.chunk].contiguous()
            Z = self._softmax_jacobian(block)
            res = torch.addmm(
                block.view(-1, self.f1), Z, self.Xb, beta=self.lam, alpha=1.0 / self.size
            )
            out[s : s + len(block)] = res.view(len(block), -1)
        return out

    def descend_(self, V: torch.Tensor, eta: float, J: ClipJacobian) -> None:
        if not J.identity or len(self.Xb) == 0:
            super().descend_(V, eta, J)
            return
        # V ← (1 − ηλ)·V − (η/|B|)·Z·X̃_B, fused into one in-place GEMM per chunk
        for s in range(0, len(V), self.chunk):
            block = V[s : s + self.chunk]
            Z = self._softmax_jacobian(block)
            block.view(-1, self.f1).addmm_(
                Z, self.Xb, beta=1.0 - eta * self.lam, alpha=-eta / self.size
            )

    def sample_grads(self) -> torch.Tensor:
        G = self.P - nn.functional.one_hot(self.yb, self.c).to(self.P.dtype)  # (B, c)
        return (G.unsqueeze(2) * self.Xb.unsqueeze(1)).reshape(len(G), -1)


# ---- MLP: the R-operator written out ---------------------------------------------------------


def _activation_derivatives(
    act: nn.Module, z: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """(σ(z), σ'(z), σ''(z) or None where it vanishes) for build_net's activations."""
    if isinstance(act, nn.ReLU):
        return torch.relu(z), (z > 0).to(z.dtype), None
    if isinstance(act, nn.Tanh):
        t = torch.tanh(z)
        d1 = 1 - t * t
        return t, d1, -2 * t * d1
    if isinstance(act, nn.Sigmoid):
        s = torch.sigmoid(z)
        d1 = s * (1 - s)
        return s, d1, d1 * (1 - 2 * s)
    if isinstance(act, nn.GELU) and act.approximate == "none":
        phi = torch.exp(-0.5 * z * z) / math.sqrt(2 * math.pi)
        Phi = 0.5 * (1 + torch.erf(z / math.sqrt(2)))
        return z * Phi, Phi + z * phi, phi * (2 - z * z)
    raise TypeError(f"no closed-form derivatives for {type(act).__name__}")


def _supported_activation(act: nn.Module) -> bool:
    if isinstance(act, nn.GELU):
        return act.approximate == "none"
    return isinstance(act, nn.ReLU | nn.Tanh | nn.Sigmoid)


class MLPCurvature(Curvature):
    """nn.Sequential(Flatten, Linear, act, …, Linear): FlatModel order (W_1, b_1, W_2, …)."""

    def __init__(
        self, net: nn.Module, X: torch.Tensor, y: torch.Tensor, lam: float, chunk: int | None
    ) -> None:
        mods = list(net.children())
        self.linears = [m for m in mods[1::2] if isinstance(m, nn.Linear)]
        self.acts: list[nn.Module] = list(mods[2::2])
        self.X = X.reshape(len(X), -1)
        self.y, self.lam = y, lam
        self.shapes = [tuple(lin.weight.shape) for lin in self.linears]
        self.offsets: list[tuple[int, int, int]] = []  # (weight start, bias start, end)
        o = 0
        for out, inn in self.shapes:
            self.offsets.append((o, o + out * inn, o + out * inn + out))
            o += out * inn + out
        self.d = o
        self.width = max(max(s) for s in self.shapes)
        self.chunk = chunk
        self.chunk_floats = MLP_CHUNK_FLOATS.get(X.device.type, MLP_CHUNK_FLOATS["cpu"])

    @staticmethod
    def supports(net: nn.Module) -> bool:
        mods = list(net.children())
        return (
            len(mods) >= 2
            and isinstance(mods[0], nn.Flatten)
            and len(mods) % 2 == 0
            and all(isinstance(m, nn.Linear) and m.bias is not None for m in mods[1::2])
            and all(_supported_activation(m) for m in mods[2::2])
        )

    def at(self, w: torch.Tensor, rows: torch.Tensor, size: int) -> StepCurvature:
        return _MLPStep(self, w, rows, size)


class _MLPStep(StepCurvature):
    def __init__(self, curv: MLPCurvature, w: torch.Tensor, rows: torch.Tensor, size: int):
        self.curv, self.lam, self.size = curv, curv.lam, size
        B = len(rows)
        self.chunk = curv.chunk or max(16, curv.chunk_floats // max(1, B * curv.width))
        self.W = [w[s:e].view(sh) for (s, e, _), sh in zip(curv.offsets, curv.shapes, strict=True)]
        bias = [w[e:f] for (_, e, f) in curv.offsets]
        self.yb = curv.y[rows]
        a = curv.X[rows]
        self.a: list[torch.Tensor] = [a]  # inputs of each Linear
        self.d1: list[torch.Tensor] = []
        self.d2: list[torch.Tensor | None] = []
        L = len(self.W)
        for layer in range(L):
            z = torch.addmm(bias[layer], a, self.W[layer].T)
            if layer < L - 1:
                a, d1, d2 = _activation_derivatives(curv.acts[layer], z)
                self.a.append(a)
                self.d1.append(d1)
                self.d2.append(d2)
        self.P = torch.softmax(z, 1)
        Y = nn.functional.one_hot(self.yb, z.shape[1]).to(z.dtype)
        # backward pass: δ_l = ∂L/∂z_l (without λ), e_l = ∂L/∂a_l
        self.delta: list[torch.Tensor] = [torch.empty(0)] * L
        self.e: list[torch.Tensor] = [torch.empty(0)] * L
        delta = (self.P - Y) / size
        for layer in range(L - 1, -1, -1):
            self.delta[layer] = delta
            if layer > 0:
                e = delta @ self.W[layer]
                self.e[layer - 1] = e
                delta = self.d1[layer - 1] * e

    def hvp(self, V: torch.Tensor) -> torch.Tensor:
        if len(self.yb) == 0:
            return self.lam * V
        out = torch.empty_like(V)
        for s in range(0, len(V), self.chunk):
            self._rop(V[s : s + self.chunk], out[s : s + self.chunk])
        return out

    def _rop(self, V: torch.Tensor, out: torch.Tensor) -> None:
        """out ← R{∇L} along each row of V (Pearlmutter), plus λV."""
        curv, m, B = self.curv, len(V), len(self.yb)
        L = len(self.W)
        Vw = [
            V[:, s:e].view(m, *sh) if V.is_contiguous() else V[:, s:e].reshape(m, *sh)
            for (s, e, _), sh in zip(curv.offsets, curv.shapes, strict=True)
        ]
        Vb = [V[:, e:f] for (_, e, f) in curv.offsets]
        # forward R-pass: R{z_l} = R{a_{l-1}}·W_lᵀ + a_{l-1}·V_lᵀ + v_b, R{a_l} = σ'·R{z_l}
        Rz: list[torch.Tensor] = []
        Ra: list[torch.Tensor | None] = [None]  # R{a_0} = 0: the input is fixed
        for layer in range(L):
            r = torch.matmul(self.a[layer], Vw[layer].transpose(1, 2))  # (m, B, out)
            r += Vb[layer].unsqueeze(1)
            prev = Ra[layer]
            if prev is not None:
                r += torch.mm(prev.view(m * B, -1), self.W[layer].T).view(m, B, -1)
            Rz.append(r)
            if layer < L - 1:
                Ra.append(self.d1[layer] * r)
        # softmax Jacobian: R{δ_L} = (diag p − p pᵀ)·R{z_L} / |B|
        P = self.P
        r = Rz[-1]
        Rd = (r - (r * P).sum(-1, keepdim=True)).mul_(P).div_(self.size)
        for layer in range(L - 1, -1, -1):
            s, e, f = curv.offsets[layer]
            gW = torch.matmul(Rd.transpose(1, 2), self.a[layer])  # (m, out, in)
            prev = Ra[layer]
            if prev is not None:
                gW += torch.matmul(self.delta[layer].T, prev)
            out[:, s:e] = gW.view(m, -1)
            out[:, e:f] = Rd.sum(1)
            if layer > 0:
                Re = torch.mm(Rd.view(m * B, -1), self.W[layer]).view(m, B, -1)
                Re += torch.matmul(self.delta[layer], Vw[layer])
                Rd = Re.mul_(self.d1[layer - 1])
                d2 = self.d2[layer - 1]
                if d2 is not None:
                    Rd += (d2 * self.e[layer - 1]) * Rz[layer - 1]
        out.add_(V, alpha=self.lam)

    def sample_grads(self) -> torch.Tensor:
        """Per-sample gradients: δ_l of one sample (undo the 1/|B| scaling) times its a_{l-1}."""
        curv, B = self.curv, len(self.yb)
        out = torch.empty((B, curv.d), dtype=self.P.dtype, device=self.P.device)
        for layer, (s, e, f) in enumerate(curv.offsets):
            delta = self.delta[layer] * self.size
            out[:, s:e] = (delta.unsqueeze(2) * self.a[layer].unsqueeze(1)).reshape(B, -1)
            out[:, e:f] = delta
        return out


# ---- choice ----------------------------------------------------------------------------------


def curvature_for(
    architecture: ArchitectureSpec | JsonObject,
    model: FlatModel,
    X: torch.Tensor,
    y: torch.Tensor,
    lam: float,
    closed_form: bool = True,
    chunk: int | None = None,
) -> Curvature:
    """The fastest exact implementation for this architecture (closed_form=False: torch.func)."""
    arch = architecture_of(architecture)
    net = model.net
    if closed_form and isinstance(arch, LogRegSpec):
        default = LOGREG_CHUNK.get(X.device.type, LOGREG_CHUNK["cpu"])
        return LogRegCurvature(net, X, y, lam, chunk or default)
    if closed_form and isinstance(arch, MLPSpec) and MLPCurvature.supports(net):
        return MLPCurvature(net, X, y, lam, chunk)
    return FuncCurvature(model, X, y, lam, chunk or FUNC_CHUNK)
