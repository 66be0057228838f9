"""Lethe's Python API for people who download models: `load_model` rebuilds the torch module
from a released safetensors file (its metadata names the architecture), without pickle."""

from lethe.loader import LoadedModel, load_model, read_metadata

__all__ = ["LoadedModel", "load_model", "read_metadata"]
