"""LETHE_DEVICE (workers/device.py): resolving the setting, and every method's compute path
going through the device helpers. CI has no GPU, so the device-clean check runs on CPU with
the default device set to `meta`: a tensor the maths creates without following its inputs'
device lands on `meta` and the computation fails (meta tensors hold no data), while a
device-clean computation gives exactly the numbers of a plain run."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import replace
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from pydantic import ValidationError

import app.core.settings as app_settings
from app.core.specs import PrivacyPolicy, architecture_of
from app.privacy.lineage import gaussian_event
from methods import method_of, noise
from methods.compute import (
    ModelSpec,
    Release,
    RemovedSamples,
    RetainedData,
    UpdateInputs,
    fit,
)
from methods.convex_head import compute as convex_head
from methods.newton import compute as newton
from methods.noisy_finetune import compute as noisy_finetune
from methods.output_perturbation import compute as output_perturbation
from methods.recollection import compute as recollection_method
from tests.unit.test_compute import TRAINING, K, N, P, data, inputs_for
from workers import device as dev
from workers import training, updates, values, worker
from workers.context import JobContext
from workers.data import Arrays
from workers.resident import Sessions
from workers.updates import compute_on
from workers.values import Outcome

CPU = torch.device("cpu")

METHODS: dict[str, dict[str, Any]] = {
    "retrain": {"name": "retrain", "evaluate": True},
    "output_perturbation": {
        "name": "output_perturbation",
        "C0": 0.5,
        "finetune_epochs": 1,
        "evaluate": True,
    },
    "noisy_finetune": {"name": "noisy_finetune", "T": 5, "batch_size": 16, "evaluate": True},
    "noisy_finetune_model_clipping": {
        "name": "noisy_finetune",
        "T": 5,
        "batch_size": 16,
        "variant": "model_clipping",
    },
    "newton": {
        "name": "newton",
        "max_relative_noise": None,
        "depth": 20,
        "chains": 2,
        "hvp_batch": 16,
        "power_iterations": 5,
    },
    "convex_head": {
        "name": "convex_head",
        "lam": 1e-2,
        "R": 10.0,
        "beta": 1.0,
        "hessian_samples": 100,
        "tolerance": 1e-6,  # a quick solve: these tests compare devices, not accuracy
        "evaluate": True,
    },
    "recollection": {
        "name": "recollection",
        "max_relative_noise": None,
        "rho_checks": 1,
        "power_iterations": 5,
    },
    "minnorm": {"name": "minnorm", "evaluate": True},
    "minnorm_og": {"name": "minnorm_og", "epochs": 3, "descent_only_epochs": 1, "n_pert": 8},
    "sharded_retrain": {"name": "sharded_retrain", "shards": 3, "slices": 2, "evaluate": True},
}


@pytest.fixture
def cpu_settings(tmp_path) -> Iterator[app_settings.Settings]:
    """Settings with LETHE_DEVICE=cpu."""
    yield app_settings.Settings(data_dir=tmp_path, device="cpu")


@pytest.fixture
def seeded_noise(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Every method's secure generator replaced by seeded ones (1, 2, ... per run), so two
    runs of an update draw the same noise and batches."""
    count = [0]

    def seeded() -> torch.Generator:
        count[0] += 1
        return torch.Generator().manual_seed(count[0])

    for module in (
        noise,
        newton,
        noisy_finetune,
        output_perturbation,
        convex_head,
        recollection_method,
    ):
        monkeypatch.setattr(module, "secure_generator", seeded)
    return count


def update_inputs(name: str) -> UpdateInputs:
    """The trained model and a removal of three samples (test_compute's inputs)."""
    method = METHODS[name]
    if name == "convex_head":
        return inputs_for(method, architecture={"type": "logreg", "feature_norm": 10.0})
    if name == "minnorm":  # overparameterized: 256 random features for 150 samples
        return inputs_for(method, architecture={"type": "random_features", "width": 256})
    if name == "minnorm_og":
        heuristic = PrivacyPolicy(allow_heuristic=True)
        return inputs_for(method, policy=heuristic, architecture={"type": "mlp", "hidden": [16]})
    return inputs_for(method)


def release_tensors(outcome: Outcome) -> dict[str, torch.Tensor]:
    release = outcome.decision.release
    out = {f"weights/{k}": v for k, v in release.weights.items()}
    out |= {f"next_state/{k}": v for k, v in release.next_state.items()}
    if release.replace_statistics is not None:
        out["statistics"] = release.replace_statistics.vectors
    return out


def untimed(metrics: dict[str, Any]) -> dict[str, Any]:
    """Metrics without the seconds things took (the update's, its evaluation's)."""
    out = {k: v for k, v in metrics.items() if k != "unlearn_seconds"}
    if "evaluation" in out:
        out["evaluation"] = {k: v for k, v in out["evaluation"].items() if k != "seconds"}
    return out


# ---- the setting ---------------------------------------------------------------------------


def test_cpu_resolves_to_the_cpu() -> None:
    assert dev.resolve_device("cpu") == CPU


def test_auto_takes_the_gpu_only_when_torch_sees_one() -> None:
    expected = "cuda" if torch.cuda.is_available() else "cpu"
    assert dev.resolve_device("auto").type == expected


def test_cuda_without_a_gpu_is_a_clear_error() -> None:
    if torch.cuda.is_available():
        assert dev.resolve_device("cuda").type == "cuda"
        return
    with pytest.raises(dev.DeviceUnavailable, match="LETHE_DEVICE=cuda.*no CUDA device"):
        dev.resolve_device("cuda")


def test_an_unknown_device_is_refused() -> None:
    with pytest.raises(dev.DeviceUnavailable, match="unknown LETHE_DEVICE='tpu'"):
        dev.resolve_device("tpu")


def test_the_setting_is_read_from_lethe_device(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    assert app_settings.Settings(data_dir=tmp_path).device == "auto"
    monkeypatch.setenv("LETHE_DEVICE", "cpu")
    assert app_settings.Settings(data_dir=tmp_path).device == "cpu"
    monkeypatch.setenv("LETHE_DEVICE", "tpu")
    with pytest.raises(ValidationError, match="device"):
        app_settings.Settings(data_dir=tmp_path)


def test_jobs_and_the_worker_resolve_the_device_before_any_work(tmp_path) -> None:
    """A job's context gives the settings' device; LETHE_DEVICE=cuda on a machine without a
    GPU stops the job (before it claims anything) and `lethe worker` at start, naming the
    setting."""
    assert JobContext.build(app_settings.Settings(data_dir=tmp_path, device="cpu")).device() == CPU
    cuda = app_settings.Settings(
        data_dir=tmp_path, device="cuda", redis_url="redis://127.0.0.1:1/0"
    )
    if torch.cuda.is_available():
        assert JobContext.build(cuda).device().type == "cuda"
        return
    with pytest.raises(dev.DeviceUnavailable, match="LETHE_DEVICE=cuda"):
        JobContext.build(cuda).device()
    with pytest.raises(SystemExit, match="lethe worker: LETHE_DEVICE=cuda"):
        worker.run(burst=True, settings=cuda)


# ---- the helpers ---------------------------------------------------------------------------


def test_inputs_move_and_results_come_back_to_cpu() -> None:
    X = torch.randn(4, 3)
    inputs = replace(
        inputs_for({"name": "retrain"}),
        removed=RemovedSamples([1], X[:1], torch.tensor([0]), {1: torch.ones(5)}),
    )
    meta = torch.device("meta")
    moved = dev.inputs_to(inputs, meta)
    tensors = [
        *moved.state.values(),
        moved.removed.X,
        moved.removed.y,
        *moved.removed.statistics.values(),
        moved.retained.X,
        moved.retained.y,
        moved.test.X,
        moved.test.y,
    ]
    assert tensors and all(t.device == meta for t in tensors)
    assert moved.retained.sample_ids == inputs.retained.sample_ids  # only tensors move
    assert dev.inputs_to(inputs, CPU).retained.X is inputs.retained.X  # no copy in place
    on_cpu = dev.state_to_cpu({"w": torch.ones(2, 3).t()})
    assert on_cpu["w"].device == CPU and on_cpu["w"].is_contiguous()  # safetensors-ready


# ---- every method through the helpers, device-clean ----------------------------------------


@pytest.mark.parametrize("name", sorted(METHODS))
def test_each_method_computes_on_the_settings_device(
    name: str,
    cpu_settings: app_settings.Settings,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """`compute_on` with the settings' device (the job's `compute_storing` moves them the
    same way): the method sees inputs moved there by the helper, and the release it hands
    back for committing is on CPU."""
    inputs = update_inputs(name)
    seen: list[UpdateInputs] = []
    plain = updates.compute

    def spy(moved: UpdateInputs) -> Outcome:
        seen.append(moved)
        return plain(moved)

    monkeypatch.setattr(updates, "compute", spy)
    device = dev.worker_device(cpu_settings)
    assert device == CPU
    outcome = compute_on(inputs, device)
    assert len(seen) == 1 and seen[0] is not inputs  # moved by inputs_to, not passed through
    assert seen[0].retained.X.device == device and seen[0].state
    assert all(v.device == device for v in seen[0].state.values())
    decision = outcome.decision
    assert decision.method == METHODS[name]["name"], getattr(decision, "reason", "")
    tensors = release_tensors(outcome)
    assert all(t.device == CPU for t in tensors.values())
    assert all(bool(torch.isfinite(t).all()) for t in tensors.values())
    assert outcome.metrics["n_removed"] == 3


@pytest.mark.parametrize("name", ["output_perturbation", "convex_head", "sharded_retrain"])
def test_the_job_stores_the_release_while_measuring_it_with_the_same_outcome(
    name: str, cpu_settings: app_settings.Settings, seeded_noise: list[int]
) -> None:
    """`compute_storing` (what the job runs) hands the CPU release to `store` on another
    thread while the metrics are measured, and gives the outcome `compute_on` gives."""
    inputs = update_inputs(name)
    seeded_noise[0] = 0
    expected = compute_on(inputs, dev.worker_device(cpu_settings))
    seen: list[tuple[int, dict[str, torch.Tensor]]] = []
    main = threading.get_ident()

    def store(release: Release) -> str:
        seen.append((threading.get_ident(), {**release.weights, **release.next_state}))
        return "stored"

    seeded_noise[0] = 0
    outcome, stored = updates.compute_storing(
        inputs, dev.worker_device(cpu_settings), store, lambda _: pytest.fail("nothing to discard")
    )
    assert stored == "stored" and len(seen) == 1 and seen[0][0] != main
    assert all(t.device == CPU for t in seen[0][1].values())
    got, want = release_tensors(outcome), release_tensors(expected)
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in got)
    assert untimed(outcome.metrics) == untimed(expected.metrics)


def test_what_was_stored_is_discarded_when_measuring_fails(
    cpu_settings: app_settings.Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A failure after the release was handed to the store leaves no blob behind: the job's
    `discard` gets what `store` returned, and the failure propagates."""
    discarded: list[str] = []

    def broken(*args: Any) -> dict[str, Any]:
        raise RuntimeError("the accuracies failed")

    monkeypatch.setattr(updates, "_accuracies", broken)
    with pytest.raises(RuntimeError, match="accuracies failed"):
        updates.compute_storing(
            update_inputs("output_perturbation"),
            dev.worker_device(cpu_settings),
            lambda release: "blob-keys",
            discarded.append,
        )
    assert discarded == ["blob-keys"]


@pytest.mark.parametrize("name", sorted(set(METHODS) - {"recollection"}))
def test_each_method_is_device_clean_with_unchanged_numbers(
    name: str, cpu_settings: app_settings.Settings, seeded_noise: list[int]
) -> None:
    """With `meta` as torch's default device, a tensor created without the inputs' device
    holds no data and the update fails; a device-clean update gives bit for bit the release
    and the evaluation of a plain run. (recollection's training maths,
    methods/recollection/maths.py, is checked by its own tests.)"""
    inputs = update_inputs(name)
    seeded_noise[0] = 0
    expected = updates.compute(inputs)
    seeded_noise[0] = 0
    with torch.device("meta"):
        outcome = compute_on(inputs, dev.worker_device(cpu_settings))
    assert outcome.decision.method == expected.decision.method
    got, want = release_tensors(outcome), release_tensors(expected)
    assert got.keys() == want.keys()
    for key, tensor in got.items():
        assert tensor.device == CPU, key
        assert torch.equal(tensor, want[key]), key
    if "evaluation" in expected.metrics:
        evaluation = {k: v for k, v in outcome.metrics["evaluation"].items() if k != "seconds"}
        assert evaluation == {
            k: v for k, v in expected.metrics["evaluation"].items() if k != "seconds"
        }


def test_a_lineage_fallback_retrains_on_the_device(cpu_settings: app_settings.Settings) -> None:
    """The exact retrain the pipeline falls back to runs on the device too."""
    spent = [gaussian_event(1.0, 1.0, 1.0, 1e-5)] * 50
    inputs = inputs_for({"name": "output_perturbation"}, history=spent)
    with torch.device("meta"):
        outcome = compute_on(inputs, dev.worker_device(cpu_settings))
    assert outcome.decision.method == "retrain"
    assert all(t.device == CPU for t in release_tensors(outcome).values())


@pytest.mark.parametrize(
    "name", ["retrain", "output_perturbation", "noisy_finetune", "newton", "convex_head"]
)
def test_training_jobs_train_on_the_device_and_return_cpu_states(
    name: str, cpu_settings: app_settings.Settings
) -> None:
    """`train_model`'s compute: inputs moved to the device, the state back on CPU, the same
    numbers as training the plain way (and device-clean: meta is the default device)."""
    X, y = data()
    ids = list(range(N))
    method = METHODS[name]
    arch = (
        {"type": "logreg", "feature_norm": 10.0}
        if name == "convex_head"
        else {"type": "mlp", "hidden": [16]}
    )
    spec = ModelSpec(architecture_of(arch), TRAINING, method_of(method), P, K)
    arrays = Arrays(ids, [str(i) for i in ids], X, y, [None] * N)
    inputs = values.TrainingInputs(spec, arrays, arrays, None, None)
    losses: list[float] = []
    device = dev.worker_device(cpu_settings)
    with torch.device("meta"):
        trained, metrics = training._train(inputs, lambda e, E, loss: losses.append(loss), device)
    expected = fit(spec, RetainedData(ids, X, y, None, arrays.external_ids))  # their order
    assert trained.state.keys() == expected.state.keys()
    for key, tensor in trained.state.items():
        assert tensor.device == CPU and torch.equal(tensor, expected.state[key]), key
    assert losses and all(isinstance(v, float) for v in losses)
    assert 0.0 <= metrics["train_accuracy"] <= 1.0 and metrics["test_accuracy"] is not None


def test_recollection_training_returns_cpu_statistics(
    cpu_settings: app_settings.Settings,
) -> None:
    """The per-sample statistics come back on CPU, ready to be sealed (workers/statistics.py)."""
    X, y = data()
    ids = list(range(N))
    spec = ModelSpec(
        architecture_of({"type": "logreg"}),
        TRAINING,
        method_of(METHODS["recollection"]),
        P,
        K,
    )
    arrays = Arrays(ids, [str(i) for i in ids], X, y, [None] * N)
    inputs = values.TrainingInputs(spec, arrays, arrays, None, None)
    trained, _ = training._train(inputs, lambda *_: None, dev.worker_device(cpu_settings))
    assert trained.statistics is not None
    assert trained.statistics.vectors.device == CPU
    assert trained.statistics.vectors.shape == (N, (P + 1) * K)
    assert all(v.device == CPU for v in trained.state.values())


def test_the_resident_state_is_prepared_where_the_updates_compute(
    cpu_settings: app_settings.Settings, monkeypatch: pytest.MonkeyPatch
) -> None:
    """After training, the method prepares its resident state (convex_head's anchored
    Hessians) from the session's rows on the worker's device, with the state moved there: made
    on the CPU, a GPU worker's first update failed on it and fell back to an exact retrain.
    `meta` stands in for the GPU."""
    X, y = data()
    ids = list(range(N))
    spec = ModelSpec(
        architecture_of({"type": "logreg", "feature_norm": 10.0}),
        TRAINING,
        method_of(METHODS["convex_head"]),
        P,
        K,
    )
    arrays = Arrays(ids, [str(i) for i in ids], X, y, [None] * N)
    inputs = values.TrainingInputs(spec, arrays, arrays, None, None)
    trained, _ = training._train(inputs, lambda *_: None, CPU)
    seen: dict[str, Any] = {}

    class Recording:
        def prepare(self, data: RetainedData, state: dict[str, torch.Tensor]) -> str:
            seen["rows"], seen["state"] = data.X.device, {v.device for v in state.values()}
            return "resident"

    class Writes:  # the progress write ("preparing") goes nowhere
        @contextmanager
        def write(self, durable: bool = True) -> Iterator[Any]:
            yield SimpleNamespace(execute=lambda *args, **kwargs: None)

    monkeypatch.setattr(training, "method_for", lambda name, spec: Recording())
    meta = torch.device("meta")
    rows = dev.arrays_to(arrays, meta)
    ctx = SimpleNamespace(db=Writes(), resident_sessions=lambda: Sessions(2))
    prepared = training._prepare_resident(ctx, 1, inputs, rows, trained, CPU)  # type: ignore[arg-type]
    assert seen == {"rows": meta, "state": {meta}}
    assert prepared is not None and prepared.method_state == "resident"
    assert all(v.device == CPU for v in prepared.state.values())  # the session's state: CPU
    # trained where the rows are: the state its solve made is kept, nothing prepared again
    seen.clear()
    here = training._prepare_resident(ctx, 1, inputs, arrays, trained, CPU)  # type: ignore[arg-type]
    assert seen == {} and here is not None and here.method_state is trained.resident
    assert trained.resident is not None
