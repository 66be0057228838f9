"""The analytic Gaussian's ε for a noise multiplier (Balle & Wang 2018, Thm 8), as a lineage
composition solves it once per deletion: dp-accounting's `get_epsilon_gaussian` against
`app.privacy.gaussian.epsilon_of`, on the same multipliers, side by side in one run, with the
largest difference between them.

    .venv/bin/python -m bench.epsilon_solve [--multipliers 300] [--delta 1e-5]

Writes bench/results/epsilon_solve.json.
"""

from __future__ import annotations

import argparse
import time

import numpy as np
from dp_accounting import get_epsilon_gaussian

from app.privacy.gaussian import epsilon_of
from bench.common import write_result


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--multipliers", type=int, default=300)
    parser.add_argument("--delta", type=float, default=1e-5)
    args = parser.parse_args()
    # what a lineage of k releases at z ≈ 3.73 (ε = 1 each) composes to: z/√k
    zs = [float(z) for z in 3.73 / np.sqrt(np.arange(1, args.multipliers + 1))]
    timings: dict[str, float] = {}
    values: dict[str, list[float]] = {}
    for name, solve in (("dp_accounting", get_epsilon_gaussian), ("app_privacy", epsilon_of)):
        start = time.perf_counter()
        values[name] = [float(solve(z, args.delta)) for z in zs]
        timings[name] = (time.perf_counter() - start) * 1000 / len(zs)
    gap = max(
        abs(a - b) / max(1.0, b)
        for a, b in zip(values["app_privacy"], values["dp_accounting"], strict=True)
    )
    result = {
        "delta": args.delta,
        "multipliers": len(zs),
        "ms_per_solve": timings,
        "largest_relative_difference": gap,
        "epsilon_range": [min(values["dp_accounting"]), max(values["dp_accounting"])],
    }
    print(result)
    write_result("epsilon_solve", result)


if __name__ == "__main__":
    main()
