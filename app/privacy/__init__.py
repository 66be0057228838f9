"""Every ε and δ Lethe reports comes from here: pure numpy/scipy plus Google's dp-accounting.

- gaussian: analytic Gaussian mechanism (Balle & Wang 2018), never the classical formula.
- rdp: Rényi-slope bounds D_α ≤ α·R converted to (ε, δ) with the slope counted.
- noisy_finetune: accountants of seed 002 (gradient clipping, model clipping, output
  perturbation).
- sensitivity: Δ of recollection (seed 003, Thm 2) and certified Newton (seed 004, Prop 4.1).
- lineage: typed release events, their composition (exact Gaussian, summed Rényi slopes or
  basic composition; dp-accounting's PLD as the cross-check) and the budget admission rule.

dp-accounting is imported where it is first used: it imports scipy.stats and scipy.signal (1.2 s
of CPU), which every process importing the method specs paid, among them each service's fork
server that parses uploads and computes no ε.
"""

from importlib.metadata import version

DP_ACCOUNTING_VERSION = version("dp-accounting")
