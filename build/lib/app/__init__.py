"""Lethe: certified machine unlearning as a service (HTTP layer; imports no torch)."""
