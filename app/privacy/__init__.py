"""Every ε and δ Lethe reports comes from here: pure numpy/scipy plus Google's dp-accounting.

- gaussian: analytic Gaussian mechanism (Balle & Wang 2018), never the classical formula.
- rdp: Rényi-slope bounds D_α ≤ α·R converted to (ε, δ) with the slope counted.
- lineage: typed release events, their composition (exact Gaussian, summed Rényi slopes or
  basic composition; dp-accounting's PLD as the cross-check) and the budget admission rule.
- plans: what a mechanism's next release costs, computed without torch (the methods' specs,
  the workers and the API's preview use the same numbers).
- validate: the argument checks the accountants share (ε, δ, Δ, σ).
- audit_bounds: the lower bounds a privacy audit proves from its counts.

A method's own theorem (its sensitivity Δ or Rényi slope) lives with the method:
`methods/noisy_finetune/accountant.py` (seed 002), `methods/recollection/sensitivity.py`
(seed 003, Thm 2), `methods/newton/sensitivity.py` (seed 004, Prop 4.1); it feeds the
mechanisms here.

dp-accounting is imported where it is first used: it imports scipy.stats and scipy.signal (over a
second of CPU), which every process importing the method specs paid, among them each service's fork
server that parses uploads and computes no ε.
"""

from importlib.metadata import version

DP_ACCOUNTING_VERSION = version("dp-accounting")
