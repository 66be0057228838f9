"""How the service grows with n (issue 13, goal 5).

Through the real embedded service (`lethe serve`: SQLite file + inline worker, one fresh
server per n), on the builtin synthetic dataset (`make_classification`, `--features` features,
`--classes` classes, split 80/20 by the service), for each n and each method's logistic-
regression model:

- dataset registration: POST /v1/datasets until it answers (the service builds, seals and
  commits every sample). A deletion fans out to every model of its dataset, so each method's
  model gets its own dataset (the same seed, so the same data): the registration is measured
  once per method and reported per method and as the median.
- training: POST /v1/models → status ready (the model's `train_seconds`, the worker's own
  figure, beside it).
- one single-sample deletion by the method: POST /v1/deletions → the request done (the
  client long-polls), then the certificate's method: what certified it (e.g. `retrain` when the
  method fell back to an exact retrain), its guarantee and ε. `--deletions` requests are run
  one after the other (the first is what a user waiting on one request sees; later ones
  find the worker's caches warm); the series use the first.
- exact retrain: a deletion with `"method": "retrain"` on the `retrain` model (the model's own
  SGD training on the retained data, same seed); `--exact-for` adds it for other models
  (convex_head: its own float64 solve, warm-started; recollection: re-recording, O(n²)).
- storage per model: the bytes it takes in lethe.db after training and after the deletions:
  its blobs (`model-<id>/…`: weights and noise-free state of every version), its versions'
  metrics JSON (the training record of `newton` lives there), and its share of the pages
  (sqlite's dbstat, indexes included) of `sample_statistics` (sealed per-sample vectors; their
  payload beside it) and of `model_samples`. The dataset's samples and their wrapped data keys
  are reported apart (their share of pages; shared by every model of a dataset).

The server's torch runs `--torch-threads` threads (LETHE_TORCH_THREADS, default 1; 0 keeps the
service default). On a machine whose cores other processes share, torch's default (one thread
per core) makes OpenMP regions wait on descheduled threads: on 2 shared cores one SGD epoch
took 7.8 s instead of 0.17 s, and identical training jobs 1.3 s to 82 s. One thread per worker
measures the service, not that contention. A tiny warm-up job runs first on each server.

Recollection's training precomputes one vector per sample, O(E·n²·d/B): it runs only where
n ≤ `--recollection-max` (default 10,000) and its model wait is capped by `--model-timeout`;
the JSON says what was skipped and why. Each series gets its growth exponent: the slope of
log(time) against log(n) by least squares over the sizes it has (null with fewer than two).

    .venv/bin/python -m bench.scale [--sizes 10000,30000,100000] [--methods retrain,...]
        [--recollection-max 10000] [--deletions 2] [--torch-threads 1] [--out scale]
    .venv/bin/python -m bench.scale --replot [--out scale]   # series and plot from the JSON

Writes bench/results/<out>.json and <out>.png (log-log: time vs n; storage vs n).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np

from app.client import Client, LetheError
from bench.cluster import Cluster
from bench.common import RESULTS, embedded_server, ready, write_result

TRAINING = {"epochs": 5, "batch_size": 128, "learning_rate": 0.1, "weight_decay": 5e-4, "seed": 0}
LOGREG = {"type": "logreg"}
PRIVACY = {"epsilon": 1.0, "delta": 1e-5}


def method_specs(R: float, newton_depth: int) -> dict[str, dict[str, Any]]:
    """Per method: what POST /v1/models gets besides name and dataset (the option sets of
    bench/device.py and bench/update_path.py)."""
    return {
        "retrain": {"method": {"name": "retrain"}},
        "output_perturbation": {
            "method": {"name": "output_perturbation", "C0": 1.0, "finetune_epochs": 1}
        },
        "noisy_finetune": {"method": {"name": "noisy_finetune", "T": 200, "batch_size": 64}},
        "newton": {
            "method": {
                "name": "newton",
                "depth": newton_depth,
                "chains": 10,
                "hvp_batch": 10,
                "max_relative_noise": None,
            }
        },
        "convex_head": {
            "architecture": {"type": "logreg", "feature_norm": R},
            "method": {"name": "convex_head", "lam": 1e-3, "R": R, "beta": 1e-3},
        },
        "recollection": {"method": {"name": "recollection", "max_relative_noise": None}},
    }


# ---- storage ---------------------------------------------------------------------------------


def _connect(db: Path) -> sqlite3.Connection:
    return sqlite3.connect(f"file:{db}?mode=ro", uri=True, timeout=60)


def table_pages(db: Path) -> dict[str, int]:
    """Bytes of pages per table and index (sqlite's dbstat, overflow pages included)."""
    with contextlib.closing(_connect(db)) as con:
        rows = con.execute("SELECT name, SUM(pgsize) FROM dbstat GROUP BY name").fetchall()
    return {name: int(size) for name, size in rows}


def _share(pages: dict[str, int], table: str, rows: int, total_rows: int) -> int:
    """`rows` of `total_rows`' share of a table's pages and its indexes' pages."""
    names = (table, f"ix_{table}_", f"sqlite_autoindex_{table}_")
    table_bytes = sum(v for k, v in pages.items() if k == table or k.startswith(names[1:]))
    return round(table_bytes * rows / total_rows) if total_rows else 0


def model_storage(db: Path, model_id: int) -> dict[str, Any]:
    """What one model takes in lethe.db: its blobs and versions' metrics (payload bytes), its
    per-sample statistics and its model_samples rows (their share of the tables' pages,
    indexes included; the statistics' payload beside it)."""
    pages = table_pages(db)
    with contextlib.closing(_connect(db)) as con:
        blobs_n, blobs_bytes = con.execute(
            "SELECT COUNT(*), COALESCE(SUM(LENGTH(data)), 0) FROM blobs WHERE key LIKE ?",
            (f"model-{model_id}/%",),
        ).fetchone()
        stats_n, stats_bytes = con.execute(
            "SELECT COUNT(*), COALESCE(SUM(LENGTH(vector)), 0) FROM sample_statistics "
            "WHERE model_id = ?",
            (model_id,),
        ).fetchone()
        stats_total = con.execute("SELECT COUNT(*) FROM sample_statistics").fetchone()[0]
        versions_n, metrics_bytes = con.execute(
            "SELECT COUNT(*), COALESCE(SUM(LENGTH(metrics)), 0) FROM model_versions "
            "WHERE model_id = ?",
            (model_id,),
        ).fetchone()
        ms_rows = con.execute(
            "SELECT COUNT(*) FROM model_samples WHERE model_id = ?", (model_id,)
        ).fetchone()[0]
        ms_total = con.execute("SELECT COUNT(*) FROM model_samples").fetchone()[0]
    ms_bytes = _share(pages, "model_samples", ms_rows, ms_total)
    stats_pages = _share(pages, "sample_statistics", stats_n, stats_total)
    return {
        "total_bytes": int(blobs_bytes + metrics_bytes + stats_pages + ms_bytes),
        "blobs": {"n": blobs_n, "bytes": int(blobs_bytes)},
        "sample_statistics": {
            "n": stats_n,
            "payload_bytes": int(stats_bytes),
            "bytes_share_of_pages": stats_pages,
        },
        "versions": {"n": versions_n, "metrics_json_bytes": int(metrics_bytes)},
        "model_samples": {"rows": ms_rows, "bytes_share_of_pages": ms_bytes},
    }


def dataset_storage(db: Path, dataset_id: int) -> dict[str, Any]:
    """The dataset's samples (sealed payloads; the share of `samples` pages and indexes) and
    their wrapped data keys (the share of `data_keys`): shared by all its models."""
    pages = table_pages(db)
    with contextlib.closing(_connect(db)) as con:
        n, payload, keys = con.execute(
            "SELECT COUNT(*), COALESCE(SUM(LENGTH(payload)), 0), COUNT(DISTINCT key_id) "
            "FROM samples WHERE dataset_id = ?",
            (dataset_id,),
        ).fetchone()
        n_total = con.execute("SELECT COUNT(*) FROM samples").fetchone()[0]
        keys_total = con.execute("SELECT COUNT(*) FROM data_keys").fetchone()[0]
    samples_pages = _share(pages, "samples", n, n_total)
    keys_pages = _share(pages, "data_keys", keys, keys_total)
    return {
        "samples": n,
        "payload_bytes": int(payload),
        "samples_bytes_share_of_pages": samples_pages,
        "data_keys": keys,
        "data_keys_bytes_share_of_pages": keys_pages,
        "total_bytes": samples_pages + keys_pages,
    }


# ---- one size --------------------------------------------------------------------------------


def train_ids(c: Client, dataset_id: int, k: int) -> list[str]:
    page = c.get(
        f"/v1/datasets/{dataset_id}/samples",
        params={"split": "train", "status": "active", "limit": k},
    )["items"]
    return [s["external_id"] for s in page]


def newest_metrics(c: Client, model_id: int) -> dict[str, Any]:
    versions = c.get(f"/v1/models/{model_id}/versions")
    newest = max(versions, key=lambda v: v["number"])
    return newest.get("metrics") or {}


SECONDS_KEYS = ("train_seconds", "unlearn_seconds", "n_train")


def delete_one(
    c: Client, dataset_id: int, model_id: int, sample: str, method: str | None
) -> dict[str, Any]:
    body: dict[str, Any] = {"dataset_id": dataset_id, "sample_ids": [sample]}
    if method:
        body["method"] = method
    t0 = time.perf_counter()
    done = c.wait_deletion(c.post("/v1/deletions", json=body)["id"]).model_dump(mode="json")
    seconds = time.perf_counter() - t0
    out: dict[str, Any] = {
        "requested_method": method,
        "post_to_done_s": seconds,
        "status": done["status"],
    }
    if done["status"] != "done" or not done["certificate_ids"]:
        out["error"] = done.get("error") or [m.get("error") for m in done.get("models", [])]
        return out
    cert = c.get(f"/v1/audit/certificates/{done['certificate_ids'][0]}")
    metrics = newest_metrics(c, model_id)
    out.update(
        certified_by=cert["method"],
        guarantee=cert.get("guarantee"),
        epsilon=cert.get("epsilon"),
        worker={k: metrics[k] for k in SECONDS_KEYS if k in metrics},
    )
    return out


def run_method(
    c: Client,
    db: Path,
    n: int,
    method: str,
    spec: dict[str, Any],
    args: argparse.Namespace,
) -> dict[str, Any]:
    out: dict[str, Any] = {"spec": spec}
    t0 = time.perf_counter()
    ds = ready(
        c,
        c.post(
            "/v1/datasets",
            json={
                "builtin": "synthetic",
                "n_samples": n,
                "n_features": args.features,
                "n_classes": args.classes,
            },
        ),
    )
    out["register_s"] = time.perf_counter() - t0
    out["dataset_id"] = ds["id"]
    body = {
        "name": f"scale-{method}-{n}",
        "dataset_id": ds["id"],
        "architecture": LOGREG,
        "training": TRAINING,
        "privacy": PRIVACY,
        **spec,
    }
    t0 = time.perf_counter()
    model = c.post("/v1/models", json=body)
    try:
        model = c.wait_model(model["id"], timeout=args.model_timeout).model_dump(mode="json")
    except TimeoutError:
        out["train_s"] = None
        out["skipped"] = f"training not ready after --model-timeout {args.model_timeout} s"
        return out
    out["train_s"] = time.perf_counter() - t0
    out["model_id"] = model["id"]
    if model["status"] != "ready":
        out["error"] = model.get("error")
        return out
    metrics = newest_metrics(c, model["id"])
    out["worker"] = {k: metrics[k] for k in SECONDS_KEYS if k in metrics}
    out["storage_after_training"] = model_storage(db, model["id"])
    out["dataset_storage"] = dataset_storage(db, ds["id"])
    exact = method == "retrain" or method in args.exact_for
    samples = train_ids(c, ds["id"], args.deletions + 1)
    own = None if method != "retrain" else "retrain"
    out["deletions"] = []
    for sample in samples[: args.deletions]:
        out["deletions"].append(delete_one(c, ds["id"], model["id"], sample, own))
        print(f"  n={n} {method}: deletion {out['deletions'][-1]}", flush=True)
    if exact and method != "retrain":
        out["exact_retrain"] = delete_one(c, ds["id"], model["id"], samples[-1], "retrain")
        print(f"  n={n} {method}: exact retrain {out['exact_retrain']}", flush=True)
    out["storage_after_deletions"] = model_storage(db, model["id"])
    return out


@contextlib.contextmanager
def server(data_dir: Path, torch_threads: int) -> Iterator[tuple[str, str]]:
    """`lethe serve` embedded, with LETHE_TORCH_THREADS when torch_threads > 0."""
    if torch_threads <= 0:
        with embedded_server(data_dir) as served:
            yield served
        return
    with Cluster(data_dir, None, None, torch_threads=torch_threads) as cluster:
        yield cluster.start_api(), cluster.admin_key


def warm_up(c: Client) -> float:
    """A tiny dataset, model and deletion first, so that no measured figure pays for the
    server's first job (imports, torch start-up). Its dataset and model are not counted."""
    t0 = time.perf_counter()
    ds = c.post(
        "/v1/datasets",
        json={"builtin": "synthetic", "n_samples": 500, "n_features": 20, "n_classes": 2},
    )
    model = c.post(
        "/v1/models",
        json={"name": "warm-up", "dataset_id": ds["id"], "architecture": LOGREG,
              "training": TRAINING},
    )  # fmt: skip
    c.wait_model(model["id"]).model_dump(mode="json")
    delete_one(c, ds["id"], model["id"], train_ids(c, ds["id"], 1)[0], None)
    return time.perf_counter() - t0


def run_size(n: int, methods: list[str], args: argparse.Namespace, tmp: Path) -> dict[str, Any]:
    specs = method_specs(args.R, args.newton_depth)
    result: dict[str, Any] = {"n": n, "methods": {}}
    started = time.perf_counter()
    result["load_average_before"] = os.getloadavg()
    with server(tmp / f"n{n}", args.torch_threads) as (url, key):
        c = Client(url, key, timeout=3600)
        db = tmp / f"n{n}" / "lethe.db"
        result["warmup_s"] = warm_up(c)
        for method in methods:
            if method == "recollection" and n > args.recollection_max:
                result["methods"][method] = {
                    "skipped": f"n = {n} > --recollection-max {args.recollection_max}: the "
                    "precompute is O(E·n²·d/B) (one vector per sample, updated every step)"
                }
                print(f"n={n} {method}: skipped", flush=True)
                continue
            if n in args.drop.get(method, ()):
                result["methods"][method] = {"skipped": args.drop_reason}
                print(f"n={n} {method}: skipped ({args.drop_reason})", flush=True)
                continue
            t0 = time.perf_counter()
            try:
                res = run_method(c, db, n, method, specs[method], args)
            except (LetheError, TimeoutError) as err:
                res = {"error": repr(err)}
            res["wall_s"] = time.perf_counter() - t0
            result["methods"][method] = res
            print(
                f"n={n} {method}: register {res.get('register_s')}, train {res.get('train_s')}, "
                f"wall {res['wall_s']:.1f} s",
                flush=True,
            )
        result["load_average_after"] = os.getloadavg()
        result["db_file_bytes"] = db.stat().st_size
        result["table_pages_bytes"] = table_pages(db)
    result["wall_s"] = time.perf_counter() - started
    return result


# ---- series, exponents, plot -----------------------------------------------------------------


def exponent(points: list[tuple[int, float]]) -> float | None:
    """Least-squares slope of log(y) against log(n)."""
    pts = [(x, y) for x, y in points if y is not None and y > 0]
    if len({x for x, _ in pts}) < 2:
        return None
    lx = np.log([x for x, _ in pts])
    ly = np.log([y for _, y in pts])
    return float(np.polyfit(lx, ly, 1)[0])


def series(sizes: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """name → {unit, points: [[n, value]], exponent}."""
    out: dict[str, dict[str, Any]] = {}

    def add(name: str, unit: str, n: int, value: float | None) -> None:
        if value is None:
            return
        out.setdefault(name, {"unit": unit, "points": []})["points"].append([n, value])

    for size in sizes:
        n = size["n"]
        regs = [m["register_s"] for m in size["methods"].values() if "register_s" in m]
        add("registration", "s", n, statistics.median(regs) if regs else None)
        for method, m in size["methods"].items():
            add(f"training {method}", "s", n, m.get("train_s"))
            add(f"training {method} (worker)", "s", n, m.get("worker", {}).get("train_seconds"))
            dels = m.get("deletions") or []
            if dels and "certified_by" in dels[0]:
                label = "exact retrain" if method == "retrain" else f"deletion {method}"
                add(label, "s", n, dels[0]["post_to_done_s"])
            if len(dels) > 1 and "certified_by" in dels[1]:
                label = "exact retrain" if method == "retrain" else f"deletion {method}"
                add(f"{label} (second)", "s", n, dels[1]["post_to_done_s"])
            ex = m.get("exact_retrain")
            if ex and "certified_by" in ex:
                add(f"exact retrain {method}", "s", n, ex["post_to_done_s"])
            if "storage_after_training" in m:
                add(f"storage {method}", "bytes", n, m["storage_after_training"]["total_bytes"])
                if method == "retrain":
                    samples = m["dataset_storage"]["total_bytes"]
                    add("storage dataset samples", "bytes", n, samples)
    for s in out.values():
        s["exponent"] = exponent([(x, y) for x, y in s["points"]])
    return out


COLORS = {
    "retrain": "tab:blue",
    "output_perturbation": "tab:orange",
    "noisy_finetune": "tab:green",
    "newton": "tab:red",
    "convex_head": "tab:purple",
    "recollection": "tab:brown",
}


def _style(name: str) -> tuple[str, str]:
    """(color, line style): one color per method; training dashed, exact retrain dotted,
    deletion solid; registration and the dataset's samples black."""
    method = name.split(" ")[-1]
    color = COLORS.get(method, "black")
    if name == "exact retrain":
        color = COLORS["retrain"]
    if name.startswith("training") or name == "registration":
        return color, "--"
    if name.startswith("exact retrain"):
        return color, ":"
    return color, "-"


def plot(all_series: dict[str, dict[str, Any]], path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_t, ax_s) = plt.subplots(1, 2, figsize=(15, 6.5))
    for name, s in sorted(all_series.items()):
        if name.endswith(("(second)", "(worker)")):  # in the JSON only
            continue
        xs = [p[0] for p in s["points"]]
        ys = [p[1] for p in s["points"]]
        ax = ax_s if s["unit"] == "bytes" else ax_t
        slope = s["exponent"]
        label = f"{name} (n^{slope:.2f})" if slope is not None else f"{name} (one size)"
        color, style = _style(name)
        ax.loglog(xs, ys, style, color=color, marker="o", label=label)
    ax_t.set_xlabel("n (dataset samples; 80% train)")
    ax_t.set_ylabel("seconds (POST → ready / done)")
    ax_t.set_title("time: training & registration (dashed), exact retrain (dotted), deletion")
    ax_s.set_xlabel("n (dataset samples; 80% train)")
    ax_s.set_ylabel("bytes in lethe.db after training")
    ax_s.set_title("storage per model (dataset samples: shared by a dataset's models)")
    for ax in (ax_t, ax_s):
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)


# ---- main ------------------------------------------------------------------------------------


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sizes", default="10000,30000,100000")
    parser.add_argument("--methods", default=",".join(method_specs(20.0, 1000)))
    parser.add_argument("--features", type=int, default=20)
    parser.add_argument("--classes", type=int, default=2)
    parser.add_argument("--R", type=float, default=20.0, help="convex_head feature bound")
    parser.add_argument("--newton-depth", type=int, default=1000)
    parser.add_argument("--deletions", type=int, default=2, help="per model, sequential")
    parser.add_argument(
        "--exact-for", default="convex_head", help="models that also get an exact retrain"
    )
    parser.add_argument("--recollection-max", type=int, default=10_000)
    parser.add_argument("--model-timeout", type=float, default=1800.0)
    parser.add_argument(
        "--drop",
        default="",
        help="METHOD:N[,METHOD:N...]: methods skipped at a size (record --drop-reason)",
    )
    parser.add_argument("--drop-reason", default="dropped to keep the run under ~25 minutes")
    parser.add_argument(
        "--torch-threads",
        type=int,
        default=1,
        help="LETHE_TORCH_THREADS for the server (0: the service default, torch's own)",
    )
    parser.add_argument("--out", default="scale")
    parser.add_argument("--replot", action="store_true", help="redraw the --out result")
    args = parser.parse_args()
    if args.replot:
        replot(args.out)
        return
    sizes = [int(s) for s in args.sizes.split(",") if s]
    methods = [m for m in args.methods.split(",") if m]
    unknown = set(methods) - set(method_specs(args.R, args.newton_depth))
    if unknown:
        parser.error(f"unknown methods {sorted(unknown)}")
    args.exact_for = {m for m in args.exact_for.split(",") if m}
    drop: dict[str, set[int]] = {}
    for item in filter(None, args.drop.split(",")):
        method, size = item.split(":")
        drop.setdefault(method, set()).add(int(size))
    args.drop = drop

    started = time.perf_counter()
    results: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory() as tmp:
        for n in sizes:
            results.append(run_size(n, methods, args, Path(tmp)))
    doc = {
        "what": "through the embedded service (lethe serve, SQLite, inline worker), per n: "
        "dataset registration, training, exact retrain, one single-sample deletion per "
        "method (POST → done; certified_by = the certificate's method), storage per model",
        "command": " ".join(["python -m bench.scale", *sys.argv[1:]]),
        "settings": {
            k: sorted(v) if isinstance(v, set) else v for k, v in vars(args).items() if k != "drop"
        }
        | {"drop": {k: sorted(v) for k, v in args.drop.items()}},
        "dataset": {
            "builtin": "synthetic",
            "n_features": args.features,
            "n_classes": args.classes,
            "test_fraction": 0.2,
        },
        "architecture": LOGREG,
        "training": TRAINING,
        "privacy": PRIVACY,
        "torch_threads": args.torch_threads or "service default (torch's own)",
        "deletions_per_model": args.deletions,
        "recollection_max": args.recollection_max,
        "model_timeout_s": args.model_timeout,
        "total_seconds": time.perf_counter() - started,
        "sizes": results,
    }
    doc["series"] = series(results)
    doc["exponents"] = {k: v["exponent"] for k, v in doc["series"].items()}
    finish(write_result(args.out, doc), doc)


def finish(path: Path, doc: dict[str, Any]) -> None:
    png = path.with_suffix(".png")
    ds = doc["dataset"]
    title = (
        f"Lethe embedded (SQLite, inline worker): synthetic × {ds['n_features']} features, "
        f"{ds['n_classes']} classes, logreg"
    )
    plot(doc["series"], png, title)
    print("wrote", path, "and", png)
    for name, s in sorted(doc["series"].items()):
        pts = ", ".join(f"{x}: {y:.3g}" for x, y in s["points"])
        slope = "-" if s["exponent"] is None else f"{s['exponent']:.2f}"
        print(f"{name:44s} exponent {slope:>5s}  [{pts}]")


def replot(name: str) -> None:
    """Recompute the series and exponents of an existing result and redraw its plot."""
    path = RESULTS / f"{name}.json"
    doc = json.loads(path.read_text())
    doc["series"] = series(doc["sizes"])
    doc["exponents"] = {k: v["exponent"] for k, v in doc["series"].items()}
    path.write_text(json.dumps(doc, indent=2))
    finish(path, doc)


if __name__ == "__main__":
    main()
