"""Architectures built from a JSON spec (never from uploaded code); deterministic layers only."""

from __future__ import annotations

import torch
from lethe_client.jsontypes import JsonObject
from lethe_client.specs import ArchitectureSpec, architecture_of
from torch import nn
from torch.func import functional_call

from architectures import kind_of
from architectures.nets import net_of


def build_net(spec: ArchitectureSpec | JsonObject, n_features: int, n_classes: int) -> nn.Module:
    """The network of an architecture, built by its package (`architectures/<name>/net.py`);
    its parameter names and shapes are its `ArchitectureKind.parameter_shapes` (a test pins
    the two together).

    Always built on CPU, initialised by the CPU generator (the same initial weights whatever
    the worker's device); move it with `.to(device)`."""
    arch = architecture_of(spec)
    if not kind_of(arch).network:
        raise TypeError(f"{arch.type} is not a network: its method computes it")
    module: nn.Module = net_of(arch).build(arch, n_features, n_classes)
    return module


class ClipFeatures(nn.Module):
    """Flatten, then scale each row so that ‖(x, 1)‖ ≤ R: ‖x‖ ≤ √(R² − 1), the bias being
    the constant coordinate inside the bound (convex_head; Guo et al. 2020 assume ‖x‖ ≤ 1)."""

    def __init__(self, R: float) -> None:
        super().__init__()
        self.R = R
        self.radius = (R * R - 1.0) ** 0.5

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return clip_rows(x.flatten(1), self.radius)


def clip_rows(x: torch.Tensor, radius: float) -> torch.Tensor:
    """Rows scaled onto the ball of `radius` where they lie outside it."""
    norms = x.norm(dim=1, keepdim=True)
    return x * torch.clamp(radius / norms.clamp_min(1e-300), max=1.0)


def clipped_linear(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, radius: float
) -> torch.Tensor:
    """`linear(clip_rows(x, radius), weight, bias)` without the clipped copy of the rows:
    clipping scales a row, so it scales the row's product with the weights (the logits
    differ from the layer's by rounding only). Scoring an update's accuracies read the
    rows twice for the copy."""
    norms = torch.linalg.vector_norm(x, dim=1, keepdim=True)
    return torch.addcmul(bias, x @ weight.T, torch.clamp(radius / norms.clamp_min(1e-300), max=1.0))


def state_of(net: nn.Module) -> dict[str, torch.Tensor]:
    """A detached, contiguous copy of the parameters (safetensors-ready)."""
    return {k: v.detach().clone().contiguous() for k, v in net.state_dict().items()}


def parameters_of(net: nn.Module, state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """The entries of a noise-free state that are the network's own (a method may keep more
    beside them, such as minnorm's Gram inverse)."""
    own = net.state_dict().keys()
    return {k: v for k, v in state.items() if k in own}


def flat(state: dict[str, torch.Tensor]) -> torch.Tensor:
    return torch.cat([state[k].reshape(-1) for k in sorted(state)])


def weights_norm(state: dict[str, torch.Tensor]) -> float:
    """‖w‖ over every tensor of a released weights file, in float64."""
    total = sum(float(torch.sum(v.detach().double() ** 2)) for v in state.values())
    return total**0.5


class FlatModel:
    """A network seen as a function of one flat parameter vector (for torch.func). The
    network's own parameters only give names and shapes: `logits` runs on the device of `w`."""

    def __init__(self, net: nn.Module) -> None:
        self.net = net
        self.names = [k for k, _ in net.named_parameters()]
        self.shapes = [p.shape for _, p in net.named_parameters()]
        self.numels = [p.numel() for _, p in net.named_parameters()]

    def flat(self) -> torch.Tensor:
        return torch.cat([p.detach().reshape(-1) for p in self.net.parameters()])

    def vector(self, state: dict[str, torch.Tensor]) -> torch.Tensor:
        """A state dict as one vector in parameter order (the inverse of `state`)."""
        return torch.cat([state[n].reshape(-1) for n in self.names])

    def unflatten(self, w: torch.Tensor) -> dict[str, torch.Tensor]:
        return {
            n: c.reshape(s)
            for n, c, s in zip(self.names, torch.split(w, self.numels), self.shapes, strict=True)
        }

    def state(self, w: torch.Tensor) -> dict[str, torch.Tensor]:
        return {k: v.detach().clone().contiguous() for k, v in self.unflatten(w).items()}

    def logits(self, w: torch.Tensor, X: torch.Tensor) -> torch.Tensor:
        return functional_call(self.net, self.unflatten(w), (X,))
