"""Compute side of Lethe: training, unlearning methods and the jobs that run them (torch)."""
