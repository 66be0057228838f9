"""The client as its own distribution: `clients/python` builds a wheel that
depends on httpx and pydantic only; installed into a fresh virtual environment without torch
it files a deletion against a real `lethe serve`, waits for its certificate and reads it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from pathlib import Path

import pytest

from tests.support.cluster import Cluster

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
TRAINING = {"epochs": 2, "batch_size": 64, "learning_rate": 0.1, "seed": 0}


def _run(*args: str | Path, cwd: Path | None = None) -> str:
    done = subprocess.run(
        [str(a) for a in args], capture_output=True, text=True, cwd=cwd, timeout=600
    )
    assert done.returncode == 0, f"{args}: {done.stdout}\n{done.stderr}"
    return done.stdout


@pytest.fixture(scope="module")
def client_venv(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, Path]]:
    """The wheel built from clients/python, installed into a fresh venv (its two
    dependencies from the package index; nothing else)."""
    where = tmp_path_factory.mktemp("client")
    # built with this environment's setuptools (the backend the client's pyproject names),
    # not in an isolated environment made for it; the venv gets no pip of its own, this
    # environment's pip installs into it: 48 s and 42 s of the two tests' setup under the
    # suite, most of it making and filling those two throwaway environments
    _run(sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q",
         "-w", where / "dist", ROOT / "clients" / "python")  # fmt: skip
    (wheel,) = (where / "dist").glob("lethe_unlearning_client-*.whl")
    _run(sys.executable, "-m", "venv", "--without-pip", where / "venv")
    python = where / "venv" / "bin" / "python"
    _run(sys.executable, "-m", "pip", "--python", python, "install", "-q",
         "--disable-pip-version-check", wheel)  # fmt: skip
    yield wheel, python


@pytest.mark.long
def test_the_wheel_holds_the_client_and_needs_httpx_and_pydantic_only(
    client_venv: tuple[Path, Path],
) -> None:
    wheel, python = client_venv
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        (meta,) = [n for n in names if n.endswith(".dist-info/METADATA")]
        metadata = Parser().parsestr(z.read(meta).decode())
    packages = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert packages == {"lethe_client"}  # no server code
    assert {"lethe_client/py.typed", "lethe_client/wire.py", "lethe_client/client.py"} <= set(names)
    requires = sorted(r.split(">")[0].split("=")[0] for r in metadata.get_all("Requires-Dist"))
    assert requires == ["httpx", "pydantic"]
    for module in ("torch", "app", "fastapi"):  # run outside the checkout: only the venv counts
        found = subprocess.run(
            [python, "-c", f"import {module}"], capture_output=True, text=True, cwd=python.parent
        )
        assert found.returncode != 0 and f"No module named '{module}'" in found.stderr


def test_the_installed_client_files_a_deletion_against_lethe_serve(
    client_venv: tuple[Path, Path], tmp_path: Path
) -> None:
    """The server here is this checkout's `lethe serve`; the client is the installed wheel,
    in a venv where torch cannot be imported."""
    _, python = client_venv
    with Cluster(tmp_path / "data", None, None) as cluster:
        url = cluster.start_api()
        script = textwrap.dedent(
            f"""
            import json, sys
            import lethe_client
            from lethe_client import Client, NotFound
            from lethe_client.wire import CertificateOut, DeletionOut
            assert "torch" not in sys.modules
            with Client({url!r}, {cluster.admin_key!r}) as c:
                ds = c.register_builtin("digits")
                model = c.create_model(
                    {{"name": "m", "dataset_id": ds.id, "training": {TRAINING!r}}}
                )
                c.wait_model(model.id)
                who = c.samples(ds.id, split="train", limit=1).items[0].external_id
                requester = c.create_key("requester")
                with Client({url!r}, requester.key) as r:
                    request = r.delete(ds.id, [who], idempotency_key="distribution-1")
                    done = r.wait_deletion(request.id)
                assert isinstance(done, DeletionOut)
                certificate = c.certificate(done.certificate_ids[0])
                assert isinstance(certificate, CertificateOut)
                try:
                    c.model(999)
                    missing = None
                except NotFound as e:
                    missing = e.code
                print(json.dumps({{
                    "module": lethe_client.__file__,
                    "status": done.status,
                    "certificates": done.certificate_ids,
                    "guarantee": certificate.guarantee,
                    "missing": missing,
                    "torch": "torch" in sys.modules,
                }}))
            """
        )
        out = json.loads(_run(python, "-c", script, cwd=tmp_path).strip().splitlines()[-1])
    assert "venv" in out["module"] and str(ROOT) not in out["module"]  # the installed wheel
    assert out["status"] == "done" and len(out["certificates"]) == 1
    assert out["guarantee"] == "exact" and out["missing"] == "model_not_found"
    assert out["torch"] is False
