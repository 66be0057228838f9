"""The image and the compose file (no Docker engine runs here, so they are checked as files),
and the package a non-editable install builds."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

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
    subprocess.run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-q",
            "-w",
            str(tmp_path),
            str(source),
        ],
        check=True,
        timeout=300,
    )
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
