"""The method socket: every method has both halves, workers import no web framework, and the
torch-free parameter layout matches the networks the workers build."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path
from typing import get_args

import pytest

from app.core.architectures import parameter_shapes
from app.core.specs import ArchitectureSpec, TrainingConfig, architecture_of
from maths.nets import build_net
from methods import get_method, method_names, method_of
from methods.compute import ModelSpec, compute_class, method_for

METHODS_DIR = Path(__file__).resolve().parents[2] / "methods"


def test_every_method_has_a_spec_and_a_compute_half() -> None:
    """One folder a method: each registered spec finds its compute half by the folder's name,
    and every folder under methods/ with a compute half is registered."""
    folders = sorted(p.parent.name for p in METHODS_DIR.glob("*/compute.py"))
    assert folders == method_names()
    for name in method_names():
        assert compute_class(name).spec is get_method(name)
    assert {"retrain", "recollection", "newton", "noisy_finetune", "output_perturbation"} <= set(
        method_names()
    )


@pytest.mark.parametrize("name", method_names())
def test_compute_half_is_bound_to_its_spec(name: str) -> None:
    spec = get_method(name)
    model = ModelSpec(
        architecture=architecture_of({"type": "logreg"}),
        training=TrainingConfig(),
        method=method_of({"name": name, **({"sigma": 1.0} if name == "noisy_finetune" else {})}),
        n_features=4,
        n_classes=3,
    )
    method = method_for(name, model)
    assert method.spec is spec
    assert spec.options.model_config.get("extra") == "forbid"


def test_no_generic_module_names_a_method() -> None:
    """What is a method's own reaches the pipeline, the preview, the cost table and the
    schemas through its spec's hooks: outside methods/, no module names a method (the exact
    retrain, every method's fallback, excepted) or imports one's package. An architecture type
    that shares its method's name (topic_head) is the architecture's, not the method's."""
    root = METHODS_DIR.parent
    architectures = {
        get_args(spec.model_fields["type"].annotation)[0] for spec in get_args(ArchitectureSpec)
    }
    named = [n for n in method_names() if n != "retrain" and n not in architectures]
    found = []
    for folder in ("app", "workers", "maths", "lethe"):
        for path in (root / folder).rglob("*.py"):
            text = path.read_text()
            for name in named:
                if f'"{name}"' in text or f"'{name}'" in text or f"methods.{name}" in text:
                    found.append(f"{path.relative_to(root)}: {name}")
    assert found == []


def test_unknown_method_names_the_known_ones() -> None:
    with pytest.raises(KeyError, match="available"):
        get_method("nope")


def test_worker_processes_import_no_web_framework() -> None:
    code = (
        "import sys, workers.jobs, workers.worker, workers.commit\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('fastapi', 'starlette'))\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


def test_the_api_process_imports_no_torch() -> None:
    """The API, the CLI and every method's spec load without torch: only a worker computes.
    Of the maths only its sizes (maths/blocks.py, constants) load, for the memory estimate."""
    code = (
        "import sys, app.main, app.cli, methods\n"
        "app.main.create_app\n"
        "sizes = {'maths', 'maths.blocks'}\n"
        "bad = sorted(m for m in sys.modules if m.split('.')[0] in ('torch', 'maths', 'workers')"
        " and m not in sizes)\n"
        "bad += sorted(m for m in sys.modules if m.endswith('.compute'))\n"
        "print(bad)\n"
        "sys.exit(1 if bad else 0)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize(
    "arch",
    [
        {"type": "logreg"},
        {"type": "mlp", "hidden": [7], "activation": "tanh"},
        {"type": "mlp", "hidden": [5, 3, 2], "activation": "gelu"},
        {"type": "random_features", "width": 9},
    ],
)
def test_parameter_layout_matches_the_built_network(arch: dict) -> None:
    """app/core/architectures.py mirrors maths/nets.py without torch; this pins them together."""
    net = build_net(arch, 6, 4)
    built = {k: list(v.shape) for k, v in net.state_dict().items()}
    assert built == parameter_shapes(arch, 6, 4)


def test_every_architecture_spec_has_a_registered_package() -> None:
    """Each type of the ArchitectureSpec union has its torch-free kind and its torch half
    (`build` for a network; a `load` for one that is not): no generic module names one."""
    import typing

    from app.core.specs import ArchitectureSpec
    from architectures import KINDS
    from architectures.nets import net_of

    types = {
        typing.get_args(c.model_fields["type"].annotation)[0]
        for c in typing.get_args(ArchitectureSpec)
    }
    assert types == set(KINDS)
    for name, kind in KINDS.items():
        half = net_of(type("Spec", (), {"type": name}))
        assert hasattr(half, "build") == kind.network, name
        assert kind.network or hasattr(half, "load"), name
