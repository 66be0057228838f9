"""One million samples on this machine, embedded.

A fresh embedded `lethe serve` (SQLite, its worker process) with the dataset limits raised to fit
(LETHE_MAX_DATASET_CELLS; the defaults refuse 256 M values): register
`{"builtin": "synthetic", "n_samples": N, "n_features": 256, "n_classes": 10,
"subject_size": 10000}`, train a convex_head model (λ = 1e-3, R = 20, β = 1e-3), then 20
sequential single-sample deletions and one deletion of a 10,000-sample subject, each timed
POST→certificate as the client sees it, with the update's own compute and its passes over the
retained rows from the version's metrics. Peak RSS of the API process and of its embedded
worker process, each phase, from /proc's VmHWM (the first deletion is profiled in the
worker). While the big dataset registers, a second client files a single-sample deletion every
half second against a small dataset (digits, an exact-retrain logreg) trained beforehand: how
long each POST waited for its 202 and for its certificate (the registration commits a chunk at
a time, so other writers are not locked out for its whole insert).

    .venv/bin/python -m bench.million [--n 1000000] [--deletions 20]

Writes bench/results/million.json.
"""

from __future__ import annotations

import argparse
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from app.client import Client
from bench.common import device_info, embedded_worker, ready, write_result
from bench.profile_request import busy_shares
from tests.support.cluster import Cluster

METHOD = {"name": "convex_head", "lam": 1e-3, "R": 20.0, "beta": 1e-3}
SUBJECT_SIZE = 10_000


def peak_rss_mib(pid: int) -> float | None:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return None


def rss_mib(pid: int) -> float | None:
    """The resident set now (VmRSS): what a phase leaves behind."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


def profiler(pid: int, out: Path) -> subprocess.Popen[bytes] | None:
    """py-spy sampling the server until SIGINT (a `bench` extra); None where it is missing."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        print("no py-spy: the first deletion is not profiled", flush=True)
        return None
    command = [spy, "record", "--pid", str(pid), "-r", "50", "--format", "raw", "--threads"]
    process = subprocess.Popen([*command, "-o", str(out)], stdout=subprocess.DEVNULL)
    time.sleep(1.0)  # attached before the request goes out
    return process


def gpu_memory_mib(pid: int) -> float | None:
    """The GPU memory the process holds now (nvidia-smi; None without a GPU or the tool)."""
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        return None
    used = [float(m) for p, m in (line.split(",") for line in out.splitlines()) if int(p) == pid]
    return sum(used) if used else None


def reset_peak(pid: int) -> None:
    """Start a new VmHWM window (Linux: writing 5 to clear_refs resets the peak RSS)."""
    Path(f"/proc/{pid}/clear_refs").write_text("5")


def timed_deletion(
    c: Client, dataset_id: int, model_id: int, samples: list[str], subjects: list[str]
) -> dict[str, Any]:
    t0 = time.perf_counter()
    done = c.wait_deletion(c.delete(dataset_id, samples, subjects).id)
    seconds = time.perf_counter() - t0
    assert done.status == "done", done
    version = c.model(model_id).current_version
    assert version is not None
    m = version.metrics
    return {
        "post_to_certificate_s": seconds,
        "compute_s": m.get("unlearn_seconds"),
        "method": m.get("method"),
        "n_removed": m.get("n_removed"),
        "gradient_passes": m.get("gradient_passes"),
        "hessian_passes": m.get("hessian_passes"),
        "rows_loaded": m.get("rows_loaded"),
        "test_accuracy": m.get("test_accuracy"),
    }


def deletions_during(
    c: Client, dataset_id: int, ids: list[str], stop: threading.Event
) -> list[dict[str, Any]]:
    """Single-sample deletions, one every half second until `stop`: time to the 202 and to
    the certificate, or the error the POST got."""
    rows: list[dict[str, Any]] = []
    for sample in ids:
        if stop.is_set():
            break
        t0 = time.perf_counter()
        try:
            request = c.delete(dataset_id, [sample])
        except Exception as exc:  # noqa: BLE001 - what a client would see, recorded
            rows.append({"error": f"{type(exc).__name__}: {exc}"[:300],
                         "waited_s": time.perf_counter() - t0})  # fmt: skip
            continue
        accepted = time.perf_counter() - t0
        done = c.wait_deletion(request.id)
        rows.append({"accepted_s": accepted, "post_to_certificate_s": time.perf_counter() - t0,
                     "status": done.status})  # fmt: skip
        time.sleep(0.5)
    return rows


def small_model(c: Client) -> tuple[int, list[str]]:
    """digits with a ready exact-retrain logreg; its dataset id and 400 training sample ids."""
    ds = c.post("/v1/datasets", json={"builtin": "digits"})
    spec = {"name": "beside", "dataset_id": ds["id"], "architecture": {"type": "logreg"},
            "method": {"name": "retrain"}}  # fmt: skip
    model = c.wait_model(c.create_model(spec).id)
    assert model.status == "ready", model
    page = c.get(f"/v1/datasets/{ds['id']}/samples", params={"split": "train", "limit": 400})
    return ds["id"], [item["external_id"] for item in page["items"]]


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--deletions", type=int, default=20)
    parser.add_argument("--out", default="million", help="bench/results/<out>.json")
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu", help="LETHE_DEVICE")
    parser.add_argument(
        "--embedded-worker",
        choices=["process", "thread"],
        default="process",
        help="LETHE_EMBEDDED_WORKER (thread: as before issue 28's goal 5, for comparison)",
    )
    args = parser.parse_args()
    n = args.n
    with tempfile.TemporaryDirectory(prefix="lethe-million-") as tmp:
        cluster = Cluster(
            Path(tmp),
            None,
            None,
            max_dataset_cells=n * 256,
            max_dataset_samples=n,
            job_timeout_seconds=7200,
            device=args.device,
            embedded_worker=args.embedded_worker,
        )
        with cluster:
            c = Client(cluster.start_api(), cluster.admin_key, timeout=7200)
            assert cluster.api is not None
            beside, beside_ids = small_model(c)
            stop, during = threading.Event(), []
            other = Client(c.url, cluster.admin_key, timeout=600)
            thread = threading.Thread(
                target=lambda: during.extend(deletions_during(other, beside, beside_ids, stop))
            )
            t0 = time.perf_counter()
            thread.start()
            body = {"builtin": "synthetic", "n_samples": n, "n_features": 256,
                    "n_classes": 10, "subject_size": SUBJECT_SIZE}  # fmt: skip
            ds = ready(c, c.post("/v1/datasets", json=body))
            register_s = time.perf_counter() - t0
            stop.set()
            thread.join()
            accepted = [r["accepted_s"] for r in during if "accepted_s" in r]
            print("deletions during registration:", len(during), "accepted p50",
                  statistics.median(accepted) if accepted else None, "max",
                  max(accepted, default=None), "errors",
                  sum("error" in r for r in during), flush=True)  # fmt: skip
            pid = cluster.api.pid
            worker = embedded_worker(pid)
            watched = {"api": pid, **({"worker": worker} if worker is not None else {})}

            def peaks() -> dict[str, float | None]:
                """Each process's peak RSS since the last call, which starts a new window."""
                found = {name: peak_rss_mib(p) for name, p in watched.items()}
                for p in watched.values():
                    reset_peak(p)
                return found

            def now() -> dict[str, float | None]:
                return {name: rss_mib(p) for name, p in watched.items()}

            phase_peaks = {"register": peaks()}
            after = {"register": now()}
            print("registered", n, "in", round(register_s, 1), "s", flush=True)
            t0 = time.perf_counter()
            spec = {"name": "million", "dataset_id": ds["id"],
                    "architecture": {"type": "logreg", "feature_norm": METHOD["R"]},
                    "method": METHOD}  # fmt: skip
            model = c.wait_model(c.create_model(spec).id)
            train_s = time.perf_counter() - t0
            assert model.status == "ready", model
            phase_peaks["train"] = peaks()
            after["train"] = now()
            version = model.current_version
            assert version is not None
            print("trained in", round(train_s, 1), "s", flush=True)
            page = c.get(f"/v1/datasets/{ds['id']}/samples",
                         params={"split": "train", "limit": args.deletions,
                                 "offset": SUBJECT_SIZE * 3})  # fmt: skip
            singles = []
            first_profile = None
            for item in page["items"]:
                spy = profiler(worker or pid, Path(tmp) / "first.txt") if not singles else None
                row = timed_deletion(c, ds["id"], model.id, [item["external_id"]], [])
                if spy is not None:  # where the first deletion's time goes
                    spy.send_signal(signal.SIGINT)
                    spy.wait(timeout=120)
                    first_profile = busy_shares(Path(tmp) / "first.txt")[1][:40]
                    for name, share in first_profile[:25]:
                        print(f"{share:6.1%} {name}", flush=True)
                singles.append(row)
                print(row, flush=True)
                if len(singles) == 1:
                    phase_peaks["first_deletion"] = peaks()
            phase_peaks["single_deletions"] = peaks()
            after["single_deletions"] = now()
            subject = timed_deletion(c, ds["id"], model.id, [], ["subject-0"])
            print("subject", subject, flush=True)
            phase_peaks["subject_deletion"] = peaks()
            after["subject_deletion"] = now()
            print("peaks", phase_peaks, flush=True)
            gpu_mib = gpu_memory_mib(worker or pid) if args.device == "cuda" else None
            warm = [r["post_to_certificate_s"] for r in singles[1:]]
            result = {
                "n_samples": n,
                "device": device_info(args.device),
                "embedded_worker": args.embedded_worker,
                "n_train": version.n_train,
                "register_s": register_s,
                "train_s": train_s,
                "train_metrics": {
                    k: version.metrics.get(k)
                    for k in (
                        "train_seconds",
                        "lbfgs_iterations",
                        "gradient_norm",
                        "test_accuracy",
                    )  # fmt: skip
                },
                "first_deletion": singles[0],
                "single_post_to_certificate_p50_s": statistics.median(warm) if warm else None,
                "single_compute_p50_s": statistics.median(
                    [float(r["compute_s"] or 0.0) for r in singles[1:]]
                )
                if warm
                else None,
                "subject_deletion": subject,
                "peak_rss_mib_by_phase": phase_peaks,
                # each process's highest peak; `sum`: the highest phase's sum of the two
                "peak_rss_mib": {
                    **{
                        name: max(phase.get(name) or 0.0 for phase in phase_peaks.values())
                        for name in watched
                    },
                    "sum": max(
                        sum(v or 0.0 for v in phase.values()) for phase in phase_peaks.values()
                    ),
                },
                "rss_after_phase_mib": after,
                "gpu_memory_mib_after": gpu_mib,
                "float32_data_mib": n * 256 * 4 / 2**20,
                "deletions": singles,
                "deletions_during_registration": {
                    "filed": len(during),
                    "errors": sum("error" in r for r in during),
                    "accepted_p50_s": statistics.median(accepted) if accepted else None,
                    "accepted_max_s": max(accepted, default=None),
                    "post_to_certificate_p50_s": statistics.median(
                        [r["post_to_certificate_s"] for r in during if "accepted_s" in r]
                    )
                    if accepted
                    else None,
                    "rows": during,
                },
                "first_deletion_profile": first_profile,
            }
    write_result(args.out, result)


if __name__ == "__main__":
    main()
