"""The OpenAPI document tells a client everything: a description on every
schema and field, examples on every request body, the Bearer scheme, and the error shape."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from app.core.settings import Settings
from app.main import create_app


@pytest.fixture(scope="module")
def spec(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    settings = Settings(data_dir=tmp_path_factory.mktemp("openapi"), bootstrap_admin_key=False)
    return create_app(settings).openapi()


def test_every_schema_and_field_is_described(spec: dict[str, Any]) -> None:
    schemas = spec["components"]["schemas"]
    assert [name for name, s in schemas.items() if not s.get("description")] == []
    undocumented = [
        f"{name}.{field}"
        for name, s in schemas.items()
        for field, f in (s.get("properties") or {}).items()
        if not f.get("description")
    ]
    assert undocumented == []


def test_every_request_body_has_examples(spec: dict[str, Any]) -> None:
    missing = [
        f"{method.upper()} {path} ({ctype})"
        for path, ops in spec["paths"].items()
        for method, op in ops.items()
        if "requestBody" in op
        for ctype, content in op["requestBody"]["content"].items()
        if "example" not in content and "examples" not in content
    ]
    assert missing == []


def test_keys_are_a_bearer_scheme_and_errors_have_one_shape(spec: dict[str, Any]) -> None:
    scheme = spec["components"]["securitySchemes"]["APIKey"]
    assert scheme["type"] == "http" and scheme["scheme"] == "bearer"
    secured = [
        (path, method)
        for path, ops in spec["paths"].items()
        for method, op in ops.items()
        if op.get("security")
    ]
    assert ("/v1/deletions", "post") in secured and ("/v1/models", "get") in secured
    for path, ops in spec["paths"].items():
        if path == "/readyz":  # its 503 is the readiness report itself, documented as such
            continue
        for method, op in ops.items():
            for code, response in op["responses"].items():
                if code.startswith(("4", "5")):
                    schema = response["content"]["application/json"]["schema"]
                    assert schema["required"] == ["error"], (path, method, code)


def test_the_schema_lists_every_method_and_its_options(spec: dict[str, Any]) -> None:
    from methods import method_names

    variants = spec["components"]["schemas"]["MethodConfig"]["oneOf"]
    names = {v["properties"]["name"]["const"] for v in variants}
    assert names == {"auto", *method_names()}  # auto: Lethe chooses (methods/auto.py)
    convex = next(v for v in variants if v["properties"]["name"]["const"] == "convex_head")
    assert {"lam", "R", "beta"} <= set(convex["properties"])


def test_docs_are_served_from_the_package(tmp_path: Path) -> None:
    from fastapi.testclient import TestClient

    app = create_app(Settings(data_dir=tmp_path, bootstrap_admin_key=False))
    with TestClient(app) as client:
        page = client.get("/docs").text
        assert "/docs/static/swagger-ui-bundle.js" in page and "cdn" not in page.lower()
        assert client.get("/docs/static/swagger-ui-bundle.js").status_code == 200
        assert "redoc.standalone.js" in client.get("/redoc").text
