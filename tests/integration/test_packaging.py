"""The image and the compose file (no Docker engine runs here, so they are checked as files),
and the package a non-editable install builds."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
LONG_RUNNING = ("postgres", "redis", "s3", "witness", "api", "worker")


def test_compose_services_restart_and_report_health() -> None:
    compose = yaml.safe_load((ROOT / "docker-compose.yml").read_text())
    services = compose["services"]
    for name in LONG_RUNNING:
        assert services[name]["restart"] == "unless-stopped", name
        assert services[name]["healthcheck"]["test"], name
    assert "restart" not in services["migrate"]  # runs once
    for name in ("api", "worker"):
        needs = services[name]["depends_on"]
        assert needs["migrate"]["condition"] == "service_completed_successfully"
        assert needs["redis"]["condition"] == "service_healthy"
    worker_env = services["worker"]["environment"]
    assert worker_env["LETHE_TORCH_THREADS"] == "1"
    assert worker_env["LETHE_DATABASE_URL"] == services["api"]["environment"]["LETHE_DATABASE_URL"]
    assert "9100" in " ".join(services["worker"]["healthcheck"]["test"])
    assert "lethe_adm_" in (ROOT / "docker-compose.yml").read_text()  # how to read the key
    for name in ("migrate", "api", "worker"):  # blobs in the compose's S3 service, one bucket
        env = services[name]["environment"]
        assert env["LETHE_BLOB_STORE"] == "s3" and env["LETHE_S3_BUCKET"] == "lethe"
        assert env["LETHE_S3_ENDPOINT_URL"] == "http://s3:8333"
    assert services["migrate"]["depends_on"]["s3"]["condition"] == "service_healthy"
    assert services["s3"]["command"] == ["s3"]  # deploy/services/entry.sh: SeaweedFS's S3
    for name in ("postgres", "redis", "s3"):  # built from Debian's packages, not pulled
        assert services[name]["build"]["context"] == "deploy/services", name
    # the API on loopback unless LETHE_BIND says otherwise (scripts/compose-up)
    assert services["api"]["ports"] == ["${LETHE_BIND:-127.0.0.1}:${LETHE_PORT:-8000}:8000"]
    witnesses = services["api"]["environment"]["LETHE_LOG_WITNESSES"]  # the log asks its witness
    assert (
        witnesses.startswith('["http://witness:8100 ')
        and "8100" in services["witness"]["command"][-1]
    )


def test_the_image_runs_unprivileged_with_dependencies_in_their_own_layer() -> None:
    lines = [ln.strip() for ln in (ROOT / "Dockerfile").read_text().splitlines()]
    instructions = [ln for ln in lines if re.match(r"^[A-Z]+ ", ln)]
    users = [ln for ln in instructions if ln.startswith("USER ")]
    assert users and users[-1] != "USER root"
    assert any(ln.startswith("HEALTHCHECK ") for ln in instructions)
    first_code = next(i for i, ln in enumerate(instructions) if ln.startswith("COPY app"))
    deps = next(i for i, ln in enumerate(instructions) if "tomllib" in ln)
    assert deps < first_code  # a code change does not reinstall the dependencies
    assert not any("pip install -e" in ln for ln in instructions)
    ignored = (ROOT / ".dockerignore").read_text().split()
    assert {".git", ".venv", "tests"} <= set(ignored)


def test_a_built_wheel_carries_the_dashboard_and_the_loader(tmp_path: Path) -> None:
    source = tmp_path / "source"  # a copy: setuptools writes build/ beside the sources
    for name in ("app", "workers", "methods", "maths", "lethe", "migrations"):
        shutil.copytree(ROOT / name, source / name, ignore=shutil.ignore_patterns("__pycache__"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, source / name)
    built = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-v",
         "-w", str(tmp_path), str(source)],
        check=True, timeout=300, capture_output=True, text=True,
    )  # fmt: skip
    assert "would be ignored" not in built.stdout + built.stderr  # no packaging warning
    wheel = next(tmp_path.glob("lethe_unlearning-*.whl"))  # the distribution's name
    names = set(zipfile.ZipFile(wheel).namelist())
    assert {"app/ui/index.html", "app/ui/app.js", "app/ui/app.css"} <= names
    assert "lethe/loader.py" in names
    # Alembic's scripts ship in the wheel: an installed Lethe migrates its database (the
    # image's first start failed on a path outside site-packages before); a
    # top-level folder of the source tree again
    assert {
        "migrations/__init__.py",
        "migrations/env.py",
        "migrations/script.py.mako",
        "migrations/versions/0001_initial_schema.py",
    } <= names


@pytest.mark.parametrize(
    ("env", "shown"),
    [
        ({}, "http://127.0.0.1:8000"),
        ({"LETHE_PORT": "18410"}, "http://127.0.0.1:18410"),
        ({"LETHE_PORT": "127.0.0.1:18410"}, "http://127.0.0.1:18410"),  # was 127.0.0.1:127…
        ({"LETHE_BIND": "0.0.0.0"}, "http://127.0.0.1:8000 (and every interface of this host)"),
    ],
)
def test_compose_up_says_where_the_api_listens(env: dict[str, str], shown: str) -> None:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LETHE_")}
    said = subprocess.run(
        ["bash", str(ROOT / "scripts" / "compose-address")],
        env={**clean, **env}, capture_output=True, text=True, check=True,
    )  # fmt: skip
    assert said.stdout.strip() == shown
