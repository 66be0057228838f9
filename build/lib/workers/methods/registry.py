"""The compute halves of the methods, registered by name beside their app/methods specs."""

from __future__ import annotations

from typing import TypeVar

from workers.methods.base import ModelSpec, UnlearningMethod

M = TypeVar("M", bound=type[UnlearningMethod])

_COMPUTE: dict[str, type[UnlearningMethod]] = {}


def register(cls: M) -> M:
    """Class decorator: make `cls` the compute half of the method named by its spec."""
    name = cls.spec.name
    if name in _COMPUTE:
        raise ValueError(f"compute for {name!r} is registered twice")
    _COMPUTE[name] = cls
    return cls


def compute_names() -> list[str]:
    return sorted(_COMPUTE)


def method_for(name: str, model: ModelSpec) -> UnlearningMethod:
    """The named method's compute half, bound to a model."""
    return _COMPUTE[name](model)
