"""Recollection precompute on a GPU (issue 13, goals 3 and 4): the same recorded vectors on CPU
and on CUDA, and the precompute time on the GPU beside bench/precompute.py's CPU figures.

1. For logreg, the MLP [64, 64] relu and an MLP [16] tanh, with the closed-form curvature and
   with the generic torch.func path, unclipped (C = 10) and clipped (C = 0.05), with excluded
   samples: train_recollection on CPU and on CUDA (the same seed), the relative difference of
   the vectors and of the states, and ρ on both (every result must live on the GPU).
2. The precompute time on CUDA (digits-shaped data as in bench/precompute.py, the default
   config), with the default chunk sizes and with explicit ones, and the peak GPU memory.

Runs only where CUDA is available (the device machine: python3 there holds torch; pydantic is
carried as wheels):

    python3 -m bench.precompute_cuda

Writes bench/results/precompute-cuda.json (or $OUT/precompute-cuda.json where OUT is set).
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import torch

from methods.recollection.maths import train_recollection

ARCHS: dict[str, dict[str, Any]] = {
    "logreg": {"type": "logreg"},
    "mlp": {"type": "mlp", "hidden": [64, 64], "activation": "relu"},
    "mlp-tanh": {"type": "mlp", "hidden": [16], "activation": "tanh"},
}
CONFIG = {"epochs": 20, "batch_size": 64, "learning_rate": 0.1, "weight_decay": 1e-4, "seed": 0}
TIMED: list[tuple[str, int, int | None]] = [
    ("logreg", 1437, None),
    ("mlp", 1437, None),
    ("logreg", 11496, None),
    ("logreg", 40000, None),
    ("mlp", 5000, None),
    ("mlp", 11496, None),
]


def digits_like(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """bench/precompute.py's data (repeated here: that module imports the service's specs)."""
    from sklearn.datasets import load_digits

    digits = load_digits()
    X = torch.tensor(digits.images / 16.0, dtype=torch.float32).reshape(-1, 64)
    y = torch.tensor(digits.target)
    idx = torch.arange(n) % len(y)
    X, y = X[idx], y[idx]
    if n > len(digits.target):
        X = X + 0.05 * torch.randn(X.shape, generator=torch.Generator().manual_seed(0))
    return X, y


def same_on_both() -> list[dict[str, Any]]:
    cuda = torch.device("cuda")
    X, y = digits_like(300)
    exclude = torch.zeros(300, dtype=torch.bool)
    exclude[::7] = True
    config = {**CONFIG, "epochs": 3}
    rows = []
    for arch, spec in ARCHS.items():
        for closed in (True, False):
            for C in (10.0, 0.05):
                kw: dict[str, Any] = {"rho_checks": 2, "power_iterations": 5, "closed_form": closed}
                a = train_recollection(spec, config, C, 0.995, X, y, 10, exclude=exclude, **kw)
                b = train_recollection(
                    spec,
                    config,
                    C,
                    0.995,
                    X.to(cuda),
                    y.to(cuda),
                    10,
                    exclude=exclude.to(cuda),
                    **kw,
                )
                assert a.vectors is not None and b.vectors is not None
                assert b.vectors.device.type == "cuda"
                assert all(v.device.type == "cuda" for v in b.state.values())
                rel = float((b.vectors.cpu() - a.vectors).norm() / a.vectors.norm())
                state = max(
                    float((b.state[k].cpu() - a.state[k]).norm() / a.state[k].norm())
                    for k in a.state
                )
                rows.append(
                    {
                        "arch": arch,
                        "closed_form": closed,
                        "C": C,
                        "vectors_relative_difference": rel,
                        "state_relative_difference": state,
                        "rho_cpu": a.rho,
                        "rho_cuda": b.rho,
                        "clipped_steps": [a.clipped_steps, b.clipped_steps],
                    }
                )
                print(rows[-1], flush=True)
    return rows


def timed() -> list[dict[str, Any]]:
    cuda = torch.device("cuda")
    rows = []
    for arch, n, chunk in TIMED:
        X, y = digits_like(n)
        X, y = X.to(cuda), y.to(cuda)
        warm = {**CONFIG, "epochs": 1}
        train_recollection(ARCHS[arch], warm, 10.0, 0.995, X[:128], y[:128], 10, chunk=chunk)
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        t0 = time.perf_counter()
        run = train_recollection(ARCHS[arch], CONFIG, 10.0, 0.995, X, y, 10, chunk=chunk)
        torch.cuda.synchronize()
        seconds = time.perf_counter() - t0
        assert run.vectors is not None
        rows.append(
            {
                "arch": arch,
                "n": n,
                "chunk": chunk or "default",
                "seconds": seconds,
                "d": int(run.vectors.shape[1]),
                "vectors_bytes": run.vectors.numel() * 4,
                "peak_gpu_memory_bytes": torch.cuda.max_memory_allocated(),
            }
        )
        print(rows[-1], flush=True)
        del run
        torch.cuda.empty_cache()
    return rows


def main() -> None:
    if not torch.cuda.is_available():
        raise SystemExit("no CUDA device: run this on the device machine")
    result = {
        "torch": torch.__version__,
        "gpu": torch.cuda.get_device_name(0),
        "cpu_vs_cuda": same_on_both(),
        "cuda_precompute": timed(),
        "measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    out = Path(os.environ["OUT"]) if "OUT" in os.environ else Path(__file__).parent / "results"
    path = out / "precompute-cuda.json"
    path.write_text(json.dumps(result, indent=2))
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
