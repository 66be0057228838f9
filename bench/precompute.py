"""Recollection precompute (issue 13, goal 4): time against its arithmetic floor, HVP
throughput, memory, and the largest n that precomputes in 10 minutes on this machine.

Training with recollection applies (H̄_t + λI) to every visited vector at every step, so its
arithmetic is Σ_t visited_t HVPs. The floor is that count divided by the best HVP throughput
measured on this machine (vectors per second, best over implementation and chunk size, in
isolation): `floor = Σ_t visited_t / throughput`. Two floors are reported:

- `floor_generic`: the best torch.func throughput (vmap over jvp of grad: what the code used
  before this change), and
- `floor`: the best throughput of any implementation (the closed forms of workers.curvature:
  the batch Hessian's low rank for logreg, the R-operator as batched GEMMs for the MLP), the
  floor the new code is held to. `gemm_floor` beside it: the HVP's FLOP count at this
  machine's measured float32 GEMM rate (what perfect GEMMs alone would take).

For each architecture (logreg and the MLP [64, 64] relu of app/specs.py, on digits-shaped
data: the 64 digits features and 10 classes; n ≤ 1,797 takes digits rows, larger n tiles
digits with N(0, 0.05²) jitter), the default training config (TrainingConfig(): 20 epochs,
batch 64, lr 0.1, weight decay 1e-4, seed 0) and recollection options (C = 10, q = 0.995,
10 ρ checks of 20 power iterations): the precompute time (train_recollection with recording,
the whole call, after a warm-up call) at several n, by the new code and by the old
(bench/precompute_baseline.py, the code before this change, verbatim), each in its own
subprocess so that its peak RSS is its own; the HVP throughput measured in the same
subprocess right after the run (the machine is shared: the floor of a run is taken under the
same load as the run); the vectors' memory n·d·4 bytes. Then the time model
t(n) = α·Σ_t visited_t(n) + β·steps(n) is fitted to the new code's runs, solved for
t = 600 s, and the n it gives is CONFIRMED by one real run (if that run overran because the
machine was busier than during the grid, once more at n scaled by √(600 s / its time); every
confirmation is recorded with its load average).

The machine has 2 cores shared with other work: the JSON records os.cpu_count(), the load
average before and after every run, torch's thread count, and OMP_WAIT_POLICY. Children run
with OMP_WAIT_POLICY=PASSIVE: with the default (spinning) policy and other processes on the
cores, every OpenMP region waits on a descheduled thread and the precompute ran 10–15× slower
(measured: `omp_wait_policy` in the JSON). `--omp-default` keeps the environment's policy.

    .venv/bin/python -m bench.precompute [--quick] [--no-confirm] [--no-baseline]
    .venv/bin/python -m bench.precompute --confirm logreg:19500   # one more confirmation run

Writes bench/results/precompute.json and bench/results/precompute.png.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

from app.specs import TrainingConfig
from bench.common import RESULTS, write_result
from methods.recollection.spec import RecollectionOptions

ARCHS: dict[str, dict[str, Any]] = {
    "logreg": {"type": "logreg"},
    "mlp": {"type": "mlp", "hidden": [64, 64], "activation": "relu"},
}
CONFIG = TrainingConfig()
OPTIONS = RecollectionOptions()
N_FEATURES, N_CLASSES = 64, 10
BUDGET_SECONDS = 600.0
BEFORE = RESULTS / "precompute_before.json"

GRIDS = {"logreg": [1437, 2874, 5748, 11496], "mlp": [359, 719, 1437, 2874]}
OLD_GRIDS = {"logreg": [719, 1437, 2874], "mlp": [359, 719, 1437]}
QUICK_GRIDS = {"logreg": [719, 1437, 2874], "mlp": [180, 359, 719]}
QUICK_OLD_GRIDS = {"logreg": [719], "mlp": [180]}
SWEEP: dict[str, dict[str, list[int]]] = {
    "logreg": {"func": [512, 2048, 4096], "closed": [128, 256, 512, 1024, 2048]},
    "mlp": {"func": [256, 1024, 2048], "closed": [64, 128, 256, 512, 1024]},
}


# ---- data and counts -------------------------------------------------------------------------


def digits_like(n: int, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    from sklearn.datasets import load_digits

    digits = load_digits()
    X = torch.tensor(digits.images / 16.0, dtype=torch.float32).reshape(-1, N_FEATURES)
    y = torch.tensor(digits.target)
    idx = torch.arange(n) % len(y)
    X, y = X[idx], y[idx]
    if n > len(digits.target):
        gen = torch.Generator().manual_seed(seed)
        X = X + 0.05 * torch.randn(X.shape, generator=gen)
    return X, y


def visited_sum(n: int, epochs: int, batch: int) -> tuple[int, int]:
    """(Σ_t visited_t, steps): the HVPs of one precompute without exclusions. In the first
    epoch step k finds k·|B| samples visited, afterwards all n."""
    per_epoch = math.ceil(n / batch)
    return batch * per_epoch * (per_epoch - 1) // 2 + (epochs - 1) * per_epoch * n, (
        epochs * per_epoch
    )


def layer_shapes(arch: str) -> list[tuple[int, int]]:
    widths = [N_FEATURES, *ARCHS[arch].get("hidden", []), N_CLASSES]
    return [(widths[i + 1], widths[i]) for i in range(len(widths) - 1)]


def dimension(arch: str) -> int:
    return sum(o * i + o for o, i in layer_shapes(arch))


def hvp_flops(arch: str, batch: int) -> int:
    """FLOPs of one HVP as the closed forms compute it: per Linear (out × in), the forward
    R-pass a·Vᵀ and the weight-gradient R-term R{δ}ᵀ·a, plus for every layer above the first
    R{a}·Wᵀ, δᵀ·R{a}, R{δ}·W and δ·V (logreg: the first two only: U = V·X̃ᵀ, Z·X̃)."""
    total = 0
    for layer, (out, inn) in enumerate(layer_shapes(arch)):
        inn += 1 if layer == 0 and arch == "logreg" else 0  # x̃ = (x, 1)
        total += batch * inn * out * (2 if layer == 0 else 6)
    return 2 * total


# ---- children: one measurement per process ---------------------------------------------------


def _peak_rss() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _best_time(fn: Any, reps: int = 3) -> float:
    fn()
    best = math.inf
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best


def throughput(arch: str, impl: str, chunk: int, m: int) -> float:
    """Vectors per second of (H̄ + λI) on m vectors at the seeded initial weights and the
    first digits batch. impl: `func` (torch.func), `closed` (hvp into a new block) or
    `descend` (the closed form's in-place update V ← V − η(H̄ + λI)V, what training runs)."""
    from maths.nets import FlatModel
    from maths.training import seeded_net
    from methods.recollection.curvature import ClipJacobian, curvature_for

    X, y = digits_like(CONFIG.batch_size)
    model = FlatModel(seeded_net(ARCHS[arch], N_FEATURES, N_CLASSES, CONFIG.seed))
    curv = curvature_for(
        ARCHS[arch], model, X, y, CONFIG.weight_decay, closed_form=impl != "func", chunk=chunk
    )
    step = curv.at(model.flat(), torch.arange(len(y)), len(y))
    V = torch.randn(m, curv.d, generator=torch.Generator().manual_seed(0))
    J = ClipJacobian(torch.zeros(curv.d), OPTIONS.C)  # unclipped: J = I

    def run() -> None:
        if impl == "descend":
            step.descend_(V, 1e-6, J)
        else:
            step.hvp(V)

    return m / _best_time(run)


def child_sweep(arch: str) -> dict[str, Any]:
    m = 8192 if arch == "logreg" else 1024
    rows = []
    for impl, chunks in SWEEP[arch].items():
        for chunk in chunks:
            for kind in ["descend", "closed"] if impl == "closed" else ["func"]:
                rows.append(
                    {
                        "impl": kind,
                        "chunk": chunk,
                        "vectors_per_s": throughput(arch, kind, chunk, m),
                    }
                )
    a = torch.randn(1024, 1024)
    gemm = 2 * 1024**3 / _best_time(lambda: a @ a)
    return {"arch": arch, "vectors": m, "rows": rows, "gemm_flops_per_s": gemm}


def child_precompute(arch: str, n: int, code: str) -> dict[str, Any]:
    if code == "new":
        from methods.recollection.maths import train_recollection
    else:
        from bench.precompute_baseline import train_recollection  # type: ignore[assignment]
    X, y = digits_like(n)
    # warm up torch (lazy imports, torch.func's first trace, thread pools) as a running worker
    # already has: a tiny recording run with the same architecture
    warm = CONFIG.model_copy(update={"epochs": 1})
    train_recollection(ARCHS[arch], warm, OPTIONS.C, OPTIONS.q, X[:128], y[:128], N_CLASSES)
    load_before = os.getloadavg()
    t0 = time.perf_counter()
    run = train_recollection(
        ARCHS[arch],
        CONFIG,
        OPTIONS.C,
        OPTIONS.q,
        X,
        y,
        N_CLASSES,
        rho_checks=OPTIONS.rho_checks,
        power_iterations=OPTIONS.power_iterations,
    )
    seconds = time.perf_counter() - t0
    load_after = os.getloadavg()
    assert run.vectors is not None
    d = int(run.vectors.shape[1])
    rss = _peak_rss()
    del run
    # the same machine state, right after: the HVP throughput this run could have had
    m = 4096 if arch == "logreg" else 512
    if code == "new":
        here = max(
            throughput(arch, "descend", c, m) for c in SWEEP[arch]["closed"][1:4]
        )  # around the default chunk
    else:
        here = max(throughput(arch, "func", c, m) for c in SWEEP[arch]["func"][1:])
    return {
        "arch": arch,
        "n": n,
        "code": code,
        "seconds": seconds,
        "d": d,
        "vectors_bytes": n * d * 4,
        "peak_rss_bytes": rss,
        "throughput_after_run": here,
        "load_before": load_before,
        "load_after": load_after,
        "threads": torch.get_num_threads(),
    }


def child(spec: dict[str, Any]) -> dict[str, Any]:
    if spec["task"] == "sweep":
        return child_sweep(spec["arch"])
    return child_precompute(spec["arch"], spec["n"], spec["code"])


# ---- the parent ------------------------------------------------------------------------------


def spawn(spec: dict[str, Any], env: dict[str, str], timeout: float) -> dict[str, Any] | None:
    """Run one measurement in a fresh interpreter; None when it ran past `timeout`."""
    cmd = [sys.executable, "-m", "bench.precompute", "--child", json.dumps(spec)]
    t0 = time.perf_counter()
    try:
        out = subprocess.run(
            cmd, env=env, capture_output=True, text=True, timeout=timeout, check=True
        )
    except subprocess.TimeoutExpired:
        print(f"  {spec} ran past {timeout:.0f} s", flush=True)
        return None
    except subprocess.CalledProcessError as exc:
        raise RuntimeError(f"{spec} failed:\n{exc.stderr[-3000:]}") from exc
    result = json.loads(out.stdout.strip().splitlines()[-1])
    result["wall_seconds"] = time.perf_counter() - t0
    print(f"  {json.dumps({k: v for k, v in result.items() if k != 'rows'})}", flush=True)
    return result


def fit(points: list[dict[str, Any]]) -> tuple[float, float]:
    """t ≈ α·Σvisited + β·steps, least squares in relative error, α, β ≥ 0."""
    S = np.array([p["visited_sum"] for p in points], dtype=float)
    T = np.array([p["steps"] for p in points], dtype=float)
    t = np.array([p["seconds"] for p in points])
    A = np.stack([S / t, T / t], 1)
    coef, *_ = np.linalg.lstsq(A, np.ones_like(t), rcond=None)
    if coef[1] < 0 or len(points) < 2:  # fall back to the HVP term alone
        coef = np.array([float(np.sum(S * t) / np.sum(S * S)), 0.0])
    return float(coef[0]), float(coef[1])


def predict(alpha: float, beta: float, n: int) -> float:
    S, T = visited_sum(n, CONFIG.epochs, CONFIG.batch_size)
    return alpha * S + beta * T


def largest_n(alpha: float, beta: float, budget: float, step: int) -> int:
    lo, hi = 1, 2
    while predict(alpha, beta, hi) <= budget:
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if predict(alpha, beta, mid) <= budget else (lo, mid)
    return max(step, lo // step * step)


def annotate(p: dict[str, Any], sweep_best: float, sweep_generic: float, flops: float) -> None:
    S, T = visited_sum(p["n"], CONFIG.epochs, CONFIG.batch_size)
    p["visited_sum"], p["steps"] = S, T
    p["hvp_flops"] = hvp_flops(p["arch"], CONFIG.batch_size)
    p["floor_seconds"] = S / max(sweep_best, p["throughput_after_run"])
    p["floor_generic_seconds"] = S / sweep_generic
    p["gemm_floor_seconds"] = S * p["hvp_flops"] / flops
    p["ratio_to_floor"] = p["seconds"] / p["floor_seconds"]
    p["ratio_to_floor_generic"] = p["seconds"] / p["floor_generic_seconds"]


def plot(result: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 3, figsize=(17, 5))
    for ax, arch in zip(axes[:2], result["architectures"], strict=False):
        r = result["architectures"][arch]
        new = sorted(r["new"], key=lambda p: p["n"])
        old = sorted(r["old"], key=lambda p: p["n"])
        ns = np.array([p["n"] for p in new])
        ax.loglog(ns, [p["seconds"] for p in new], "o-", label="new code (measured)")
        ax.loglog(ns, [p["floor_seconds"] for p in new], "s--", label="floor (best HVP rate)")
        ax.loglog(ns, [p["floor_generic_seconds"] for p in new], "^:", label="floor (torch.func)")
        ax.loglog(ns, [p["gemm_floor_seconds"] for p in new], "v:", label="GEMM-rate floor")
        if old:
            ax.loglog([p["n"] for p in old], [p["seconds"] for p in old], "x-", label="old code")
        before = r.get("before_change", [])
        if before:
            ax.loglog(
                [p["n"] for p in before],
                [p["seconds"] for p in before],
                "+",
                ms=10,
                label="old code, measured before the change",
            )
        grid = np.geomspace(ns.min(), max(ns.max(), r["largest_n_fit"]) * 1.1, 50).astype(int)
        ax.loglog(
            grid,
            [predict(r["fit"]["alpha"], r["fit"]["beta"], int(g)) for g in grid],
            "-",
            alpha=0.4,
            label="fit α·Σvisited + β·steps",
        )
        for i, conf in enumerate(r.get("confirmations", [])):
            label = "confirmation runs (load average beside)" if i == 0 else None
            ax.loglog([conf["n"]], [conf["seconds"]], "*", ms=16, color="k", label=label)
            ax.annotate(f"{conf['load_before'][0]:.1f}", (conf["n"], conf["seconds"]), fontsize=7)
        ax.axhline(BUDGET_SECONDS, color="grey", lw=0.8, ls="--")
        ax.set_title(f"{arch} (d = {r['d']}): precompute time vs n")
        ax.set_xlabel("n (training samples)")
        ax.set_ylabel("seconds")
        ax.legend(fontsize=7)
    ax = axes[2]
    for arch in result["architectures"]:
        r = result["architectures"][arch]
        pts = sorted(r["new"] + r.get("confirmations", []), key=lambda p: p["n"])
        sizes = [p["n"] for p in pts]
        ax.loglog(sizes, [p["vectors_bytes"] / 2**20 for p in pts], "o-", label=f"{arch}: n·d·4 B")
        ax.loglog(sizes, [p["peak_rss_bytes"] / 2**20 for p in pts], "s--", label=f"{arch}: RSS")
    ax.set_title("memory of the recorded vectors")
    ax.set_xlabel("n")
    ax.set_ylabel("MiB")
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def confirm(entry: dict[str, Any], arch: str, n: int, env: dict[str, str]) -> dict[str, Any] | None:
    """One real run at n, recorded in entry["confirmations"] (None when it ran past 40 min)."""
    print(f"{arch}: confirmation at n = {n}", flush=True)
    conf = spawn({"task": "run", "arch": arch, "n": n, "code": "new"}, env, 2400)
    if conf is None:
        entry["confirmations"].append({"n": n, "seconds": None, "note": "ran past 2400 s"})
        return None
    sweep = entry["throughput_sweep"]
    best, generic = entry["best_throughput"], entry["best_generic_throughput"]
    annotate(conf, best["vectors_per_s"], generic["vectors_per_s"], sweep["gemm_flops_per_s"])
    conf["within_budget"] = conf["seconds"] <= BUDGET_SECONDS
    entry["confirmations"].append(conf)
    within = [c["n"] for c in entry["confirmations"] if c.get("within_budget")]
    entry["largest_n_confirmed"] = max(within) if within else None
    return conf


def confirm_only(specs: str, env: dict[str, str]) -> None:
    """`--confirm logreg:19500,mlp:4000`: more confirmation runs, added to the existing JSON."""
    path = RESULTS / "precompute.json"
    result = json.loads(path.read_text())
    for entry in result["architectures"].values():  # JSON written before the list existed
        if "confirmation" in entry:
            entry.setdefault("confirmations", []).insert(0, entry.pop("confirmation"))
    for spec in specs.split(","):
        arch, n = spec.split(":")
        confirm(result["architectures"][arch], arch, int(n), env)
    result.setdefault("load_average_after_extra_confirmations", []).append(os.getloadavg())
    result = {k: v for k, v in result.items() if k not in ("machine", "measured_at")}
    write_result("precompute", result)
    plot(result, RESULTS / "precompute.png")
    print(f"updated {path}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--quick", action="store_true", help="smaller grids, no confirmation")
    parser.add_argument("--no-confirm", action="store_true")
    parser.add_argument("--no-baseline", action="store_true", help="skip the old code")
    parser.add_argument("--omp-default", action="store_true", help="keep OMP_WAIT_POLICY")
    parser.add_argument("--archs", default="logreg,mlp")
    parser.add_argument("--confirm", help="ARCH:N,…: only add confirmation runs to the JSON")
    args = parser.parse_args()
    if args.child:
        print(json.dumps(child(json.loads(args.child))))
        return
    env = dict(os.environ)
    if not args.omp_default:
        env["OMP_WAIT_POLICY"] = "PASSIVE"
    if args.confirm:
        confirm_only(args.confirm, env)
        return
    grids = QUICK_GRIDS if args.quick else GRIDS
    old_grids = QUICK_OLD_GRIDS if args.quick else OLD_GRIDS
    before = json.loads(BEFORE.read_text())["runs"] if BEFORE.exists() else []
    started = time.perf_counter()
    result: dict[str, Any] = {
        "config": CONFIG.model_dump(),
        "recollection_options": {
            "C": OPTIONS.C,
            "q": OPTIONS.q,
            "rho_checks": OPTIONS.rho_checks,
            "power_iterations": OPTIONS.power_iterations,
        },
        "data": "digits features (64) and classes (10); n > 1797 tiles digits + N(0, 0.05²)",
        "budget_seconds": BUDGET_SECONDS,
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "omp_wait_policy": env.get("OMP_WAIT_POLICY", "(unset: libgomp default)"),
        "load_average_start": os.getloadavg(),
        "architectures": {},
    }
    for arch in args.archs.split(","):
        print(f"{arch}: HVP throughput sweep", flush=True)
        sweep = spawn({"task": "sweep", "arch": arch}, env, 1200)
        assert sweep is not None
        best = max(sweep["rows"], key=lambda r: r["vectors_per_s"])
        generic = max(
            (r for r in sweep["rows"] if r["impl"] == "func"), key=lambda r: r["vectors_per_s"]
        )
        flops = sweep["gemm_flops_per_s"]
        entry: dict[str, Any] = {
            "d": dimension(arch),
            "hvp_flops_per_vector": hvp_flops(arch, CONFIG.batch_size),
            "throughput_sweep": sweep,
            "best_throughput": best,
            "best_generic_throughput": generic,
            "new": [],
            "old": [],
        }
        for code, ns in [
            ("new", grids[arch]),
            ("old", [] if args.no_baseline else old_grids[arch]),
        ]:
            for n in ns:
                print(f"{arch}: {code} code, n = {n}", flush=True)
                p = spawn({"task": "run", "arch": arch, "n": n, "code": code}, env, 1800)
                if p is not None:
                    annotate(p, best["vectors_per_s"], generic["vectors_per_s"], flops)
                    entry[code].append(p)
        entry["before_change"] = [
            {**b, "note": "measured before the change, default OMP policy, shared machine"}
            for b in before
            if b["arch"] == arch
        ]
        alpha, beta = fit(entry["new"])
        n10 = largest_n(alpha, beta, BUDGET_SECONDS, 100 if arch == "logreg" else 50)
        entry["fit"] = {"alpha": alpha, "beta": beta, "model": "t = α·Σ_t visited_t + β·steps"}
        entry["largest_n_fit"] = n10
        entry["largest_n_predicted_seconds"] = predict(alpha, beta, n10)
        entry["confirmations"] = []
        if not (args.quick or args.no_confirm):
            n = n10
            for _ in range(2):  # the fitted n; if the machine was busier, n rescaled once
                conf = confirm(entry, arch, n, env)
                if conf is None or conf["within_budget"]:
                    break
                n = int(n * math.sqrt(BUDGET_SECONDS / conf["seconds"])) // 100 * 100
        result["architectures"][arch] = entry
    if "logreg" in args.archs.split(",") and not args.quick and not args.omp_default:
        print("logreg n = 1437 with the default OMP wait policy", flush=True)
        default_env = {k: v for k, v in env.items() if k != "OMP_WAIT_POLICY"}
        spin = spawn({"task": "run", "arch": "logreg", "n": 1437, "code": "new"}, default_env, 300)
        passive = next(
            (p for p in result["architectures"]["logreg"]["new"] if p["n"] == 1437), None
        )
        result["omp_wait_policy_effect"] = {
            "logreg_n1437_default_policy_seconds": spin["seconds"] if spin else "> 300 s",
            "logreg_n1437_passive_seconds": passive["seconds"] if passive else None,
            "load_average": os.getloadavg(),
        }
    result["load_average_end"] = os.getloadavg()
    result["bench_seconds"] = time.perf_counter() - started
    path = write_result("precompute", result)
    plot(result, RESULTS / "precompute.png")
    print(f"wrote {path} and {RESULTS / 'precompute.png'}")


if __name__ == "__main__":
    main()
