"""Ingress limits: no key, no body read; bodies counted while they stream; no zip bombs.

The streaming cases run against a real `lethe serve` (uvicorn): a chunked body has no
Content-Length to refuse up front, and only a real socket shows whether the server stopped
reading. The parsing cases run in process and measure the memory they take.
"""

from __future__ import annotations

import contextlib
import io
import time
import tracemalloc
import zipfile
from collections.abc import Iterator
from pathlib import Path

import httpx
import numpy as np
import pytest
from numpy.lib import format as npy_format

from app.core.errors import APIError
from app.core.formats.dataset_files import Limits, parse_csv, parse_npz
from app.core.settings import Settings
from tests.conftest import Api
from tests.support.cluster import Cluster

MiB = 1024 * 1024
SERVER_JSON_LIMIT = 64 * 1024
SERVER_CELLS_LIMIT = 100_000_000  # given, not derived: the refusals below do not move with RAM
SERVER_UPLOAD_LIMIT = 16_000_000  # room for issue 26's 8 MB text corpus


# ---- helpers ------------------------------------------------------------------------------


class Chunks:
    """A chunked request body that counts how much of itself the client got to send."""

    def __init__(self, total: int, chunk: int, head: bytes = b"", tail: bytes = b"") -> None:
        self.total, self.chunk, self.head, self.tail = total, chunk, head, tail
        self.sent = 0
        self.exhausted = False

    def __iter__(self) -> Iterator[bytes]:
        if self.head:
            yield self.head
        block = b" " * self.chunk
        while self.sent < self.total:
            yield block
            self.sent += len(block)
        if self.tail:
            yield self.tail
        self.exhausted = True


def multipart(total: int, chunk: int = 256 * 1024) -> tuple[Chunks, str]:
    boundary = "lethe-ingress-test"
    head = (
        f"--{boundary}\r\n"
        'Content-Disposition: form-data; name="file"; filename="big.npz"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode()
    tail = f"\r\n--{boundary}--\r\n".encode()
    return Chunks(total, chunk, head, tail), f"multipart/form-data; boundary={boundary}"


def npz_bytes(**arrays: np.ndarray) -> bytes:
    buf = io.BytesIO()
    np.savez(buf, **arrays)
    return buf.getvalue()


def npz_bomb(shape: tuple[int, ...], dtype: str = "|u1", y: np.ndarray | None = None) -> bytes:
    """An .npz whose X is `shape` zeros, written in chunks: never whole in memory."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        with zf.open("X.npy", "w", force_zip64=True) as fp:
            header = {"descr": dtype, "fortran_order": False, "shape": shape}
            npy_format.write_array_header_1_0(fp, header)
            left = int(np.prod(shape)) * np.dtype(dtype).itemsize
            zeros = bytes(4 * MiB)
            while left > 0:
                fp.write(zeros[: min(left, len(zeros))])
                left -= len(zeros)
        with zf.open("y.npy", "w") as fp:
            np.lib.format.write_array(fp, np.zeros(1, np.int64) if y is None else y)
    return buf.getvalue()


def peak_bytes(fn, *args, **kw):
    """fn's result (or the exception it raised) and the peak traced allocation during it."""
    tracemalloc.start()
    try:
        try:
            result: object = fn(*args, **kw)
        except Exception as exc:
            result = exc
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def vm_kb(pid: int, field: str) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    raise AssertionError(f"no {field} for {pid}")


# ---- a real server ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    with Cluster(
        tmp_path_factory.mktemp("ingress"),
        None,
        None,
        max_json_bytes=SERVER_JSON_LIMIT,
        max_upload_bytes=SERVER_UPLOAD_LIMIT,
        max_dataset_cells=SERVER_CELLS_LIMIT,
    ) as cluster:
        cluster.start_api()
        # uvicorn logs "startup complete" before it listens: wait for the socket
        deadline = time.monotonic() + 30
        while True:
            try:
                httpx.get(f"{cluster.url}/healthz", timeout=5).raise_for_status()
                break
            except httpx.TransportError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)
        yield cluster


def post_streaming(server: Cluster, path: str, body: Chunks, headers: dict[str, str]):
    """POST a chunked body; the server's peak RSS growth (kB) while it ran comes back too."""
    assert server.api is not None
    pid = server.api.pid
    with contextlib.suppress(OSError):  # reset the high-water mark, where the kernel lets us
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    before = vm_kb(pid, "VmHWM")
    start = time.monotonic()
    with httpx.Client(base_url=server.url, timeout=60) as client:
        response = client.post(path, content=iter(body), headers=headers)
    return response, time.monotonic() - start, vm_kb(pid, "VmHWM") - before


def revoked_key(server: Cluster) -> str:
    with server.client() as c:
        made = c.post("/v1/keys", json={"role": "requester"}).json()
        assert c.delete(f"/v1/keys/{made['id']}").status_code == 204
    return made["key"]


@pytest.mark.integration
@pytest.mark.parametrize("auth", ["none", "not-bearer", "unknown", "revoked"])
def test_a_chunked_body_without_a_valid_key_is_refused_unread(server: Cluster, auth: str) -> None:
    headers = {"Content-Type": "application/json"}
    if auth == "not-bearer":
        headers["Authorization"] = "Basic dXNlcjpwYXNz"
    elif auth == "unknown":
        headers["Authorization"] = "Bearer lethe_adm_not-a-key"
    elif auth == "revoked":
        headers["Authorization"] = f"Bearer {revoked_key(server)}"
    body = Chunks(total=128 * MiB, chunk=MiB)
    response, _, grew_kb = post_streaming(server, "/v1/deletions", body, headers)
    assert response.status_code == 401, response.text
    assert response.json()["error"]["code"] == "unauthorized"
    assert not body.exhausted and body.sent < 64 * MiB, body.sent
    assert grew_kb < 100 * 1024, f"server peak RSS grew {grew_kb} kB"


@pytest.mark.integration
def test_a_json_body_is_stopped_at_the_limit_while_it_streams(server: Cluster) -> None:
    headers = {"Authorization": f"Bearer {server.admin_key}", "Content-Type": "application/json"}
    body = Chunks(total=128 * MiB, chunk=64 * 1024)
    response, _, grew_kb = post_streaming(server, "/v1/deletions", body, headers)
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["code"] == "payload_too_large"
    assert error["details"]["limit_bytes"] == SERVER_JSON_LIMIT
    assert not body.exhausted and body.sent < 64 * MiB, body.sent
    assert grew_kb < 100 * 1024, f"server peak RSS grew {grew_kb} kB"

    # a declared Content-Length over the limit is refused before anything is read
    with server.client() as c:
        response = c.post("/v1/models", content=b" " * (SERVER_JSON_LIMIT + 1), headers=headers)
    assert response.status_code == 413 and response.json()["error"]["code"] == "payload_too_large"


@pytest.mark.integration
def test_a_chunked_upload_is_stopped_at_the_upload_limit(server: Cluster) -> None:
    body, ctype = multipart(total=256 * MiB)
    headers = {"Authorization": f"Bearer {server.admin_key}", "Content-Type": ctype}
    response, _, grew_kb = post_streaming(server, "/v1/datasets", body, headers)
    assert response.status_code == 413, response.text
    error = response.json()["error"]
    assert error["code"] == "payload_too_large"
    assert f"{SERVER_UPLOAD_LIMIT} bytes" in error["message"]
    assert not body.exhausted and body.sent < 64 * MiB, body.sent  # stopped early, by bytes
    assert grew_kb < 100 * 1024, f"server peak RSS grew {grew_kb} kB"


@pytest.mark.integration
def test_uploads_under_the_limit_still_work_chunked_or_not(server: Cluster) -> None:
    rng = np.random.default_rng(0)
    data = npz_bytes(X=rng.normal(size=(60, 4)), y=rng.integers(0, 2, size=60))
    with server.client() as c:
        plain = c.post("/v1/datasets", files={"file": ("d.npz", data)})
        assert plain.status_code == 201, plain.text
        # the same file as a chunked multipart body (no Content-Length)
        boundary = "lethe-small"
        parts = [
            f"--{boundary}\r\n".encode(),
            b'Content-Disposition: form-data; name="file"; filename="d.npz"\r\n\r\n',
            data,
            f"\r\n--{boundary}\r\n".encode(),
            b'Content-Disposition: form-data; name="name"\r\n\r\nchunked',
            f"\r\n--{boundary}--\r\n".encode(),
        ]
        chunked = c.post(
            "/v1/datasets",
            content=iter(parts),
            headers={"Content-Type": f"multipart/form-data; boundary={boundary}"},
        )
        assert chunked.status_code == 201, chunked.text
        assert chunked.json()["name"] == "chunked" and chunked.json()["n_samples"] == 60
        # an ordinary JSON body under the JSON limit, chunked
        deletion = c.post(
            "/v1/deletions",
            content=iter([b'{"dataset_id": ', str(plain.json()["id"]).encode(), b"}"]),
            headers={"Content-Type": "application/json"},
        )
        assert deletion.status_code != 413 and deletion.status_code != 401, deletion.text


def sparse_npz(**arrays: np.ndarray) -> bytes:
    """A scipy `save_npz` layout written by hand, so that it can hold what scipy would not."""
    valid = {
        "format": np.array("csr"),
        "shape": np.array([3, 4]),
        "data": np.array([1.0, 2.0, 1.0, 3.0]),
        "indices": np.array([0, 2, 1, 3], dtype=np.int32),
        "indptr": np.array([0, 2, 3, 4], dtype=np.int32),
    }
    return npz_bytes(**{**valid, **arrays})


@pytest.mark.integration
@pytest.mark.parametrize(
    "arrays",
    [
        {"indices": np.array([0, 2, 1, 10**9], dtype=np.int64)},  # the segfault
        {"indices": np.array([0, -2, 1, 3], dtype=np.int32)},
        {"indptr": np.array([0, 3, 2, 4], dtype=np.int32)},  # decreasing
        {"indptr": np.array([0, 2, 3, 9], dtype=np.int32)},  # past the values
        {"shape": np.array([3, 4, 5])},
        {"data": np.array([1 + 1j, 2, 1, 3])},
        {"data": np.array([1.0, np.nan, 1.0, 3.0])},
        {"format": np.array("coo")},
    ],
)
def test_a_malformed_sparse_npz_is_422_and_the_server_lives(server: Cluster, arrays) -> None:
    with server.client() as c:
        files = {"file": ("bad.npz", sparse_npz(**arrays))}
        response = c.post("/v1/datasets", files=files, data={"format": "sparse_npz"})
        assert response.status_code == 422, response.text
        assert response.json()["error"]["code"] in ("malformed_sparse", "malformed_npz")
        assert c.get("/healthz").status_code == 200
        fine = c.post(
            "/v1/datasets", files={"file": ("ok.npz", sparse_npz())}, data={"format": "sparse_npz"}
        )
        assert fine.status_code == 201, fine.text


@pytest.mark.integration
def test_a_text_csv_of_a_million_distinct_words_is_refused_in_bounded_memory(
    server: Cluster,
) -> None:
    """the vocabulary is counted and the size checked before the documents ×
    vocabulary matrix exists (an 8 MB file used to cost +3.5 GB before its 413)."""
    words = (f"w{i:x}".translate(str.maketrans("0123456789", "ghijklmnop")) for i in range(10**6))
    lines = ["text"] + [" ".join(next(words) for _ in range(10)) for _ in range(10**5)]
    body = "\n".join(lines).encode()
    assert 6_000_000 < len(body) < SERVER_UPLOAD_LIMIT
    assert server.api is not None
    pid = server.api.pid
    with contextlib.suppress(OSError):
        Path(f"/proc/{pid}/clear_refs").write_text("5")
    before = vm_kb(pid, "VmHWM")
    with server.client() as c:
        response = c.post(
            "/v1/datasets",
            files={"file": ("words.csv", body)},
            data={"format": "text_csv", "text_column": "text"},
        )
        assert response.status_code == 413, response.text
        assert response.json()["error"]["code"] in ("dataset_too_large", "too_many_features")
        assert c.get("/healthz").status_code == 200
    grew = vm_kb(pid, "VmHWM") - before
    print(f"server peak RSS growth: {grew} kB")  # the closing note's figure (pytest -s)
    assert grew < 256 * 1024, f"server peak RSS grew {grew} kB"


# ---- in process ---------------------------------------------------------------------------


@pytest.fixture
def settings(settings: Settings) -> Settings:
    return settings.model_copy(update={"max_json_bytes": 64 * 1024, "max_dataset_cells": 100_000})


def test_no_key_no_body_in_process(api: Api) -> None:
    response = api.client.post("/v1/deletions", json={"dataset_id": 1})
    assert response.status_code == 401 and response.json()["error"]["code"] == "unauthorized"
    response = api.client.post(
        "/v1/keys", json={"role": "admin"}, headers={"Authorization": "Bearer nope"}
    )
    assert response.status_code == 401
    assert response.json()["error"]["message"] == "invalid or revoked API key"
    # the role check stays with the route: a valid key of the wrong role is 403, not 401
    assert api.post("/v1/keys", role="reader", json={"role": "admin"}).status_code == 403
    # no body, no key: the route's own dependency answers
    assert api.client.delete("/v1/keys/1").status_code == 401
    assert api.client.get("/healthz").status_code == 200


def test_content_length_over_the_limits_in_process(api: Api) -> None:
    big = b" " * (64 * 1024 + 1)
    response = api.post("/v1/deletions", content=big, headers={"Content-Type": "application/json"})
    assert response.status_code == 413 and response.json()["error"]["code"] == "payload_too_large"
    # multipart on the upload route gets max_upload_bytes (2,000,000 here), JSON does not
    response = api.post("/v1/datasets", content=big, headers={"Content-Type": "application/json"})
    assert response.status_code == 413
    response = api.post("/v1/datasets", files={"file": ("d.npz", b"\0" * 2_100_000)})
    assert response.status_code == 413
    assert "2000000 bytes" in response.json()["error"]["message"]


def test_synthetic_over_the_cell_cap_is_refused_before_it_is_built(api: Api) -> None:
    spec = {"builtin": "synthetic", "n_samples": 10_000, "n_features": 20}
    response = api.post("/v1/datasets", json=spec)
    assert response.status_code == 422, response.text
    error = response.json()["error"]
    assert error["code"] == "invalid_request" and "exceeds the limits" in error["message"]
    assert error["details"]["max_cells"] == 100_000
    ok = api.post("/v1/datasets", json={**spec, "n_samples": 1000, "n_features": 10})
    assert ok.status_code == 201, ok.text


def test_csv_over_the_cell_cap_is_413(api: Api) -> None:
    header = ",".join([f"f{i}" for i in range(200)] + ["label"])
    row = ",".join(["0"] * 200 + ["1"])
    data = "\n".join([header] + [row] * 600).encode()
    response = api.post("/v1/datasets", files={"file": ("d.csv", data)})
    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == "dataset_too_large"


def test_npz_bomb_through_the_api(api: Api) -> None:
    bomb = npz_bomb((1000, 200))  # 200,000 cells over the 100,000 of this app
    response = api.post("/v1/datasets", files={"file": ("bomb.npz", bomb)})
    assert response.status_code == 413, response.text
    assert response.json()["error"]["code"] == "dataset_too_large"


# ---- the .npz parser on its own ----------------------------------------------------------


@pytest.fixture(scope="module")
def big_bomb() -> bytes:
    # 12,800 x 8,192 uint8 zeros: 105 MB of X in about 100 kB of zip, over the default
    # 100M-cell cap; loaded and widened to float64 as before it peaked near 1 GB
    return npz_bomb((12_800, 8_192))


def test_npz_bomb_is_refused_from_its_header(big_bomb: bytes) -> None:
    assert len(big_bomb) < 2 * MiB
    result, peak = peak_bytes(parse_npz, big_bomb, 0, 0.2)
    assert isinstance(result, APIError), result
    assert (result.status, result.code) == (413, "dataset_too_large")
    assert peak < 16 * MiB, f"peak {peak / MiB:.0f} MiB"


def test_npz_limits_each_checked_before_loading() -> None:
    ok = npz_bytes(X=np.zeros((20, 3), np.float32), y=np.arange(20) % 2)
    assert len(parse_npz(ok, 0, 0.2).y) == 20

    def refused(data: bytes, limits: Limits) -> APIError:
        result, peak = peak_bytes(parse_npz, data, 0, 0.2, limits)
        assert isinstance(result, APIError), result
        assert peak < 16 * MiB
        return result

    error = refused(ok, Limits(max_npz_bytes=100))  # the zip's own sizes
    assert (error.status, error.code) == (413, "dataset_too_large")
    error = refused(npz_bomb((10, 70_000)), Limits())
    assert (error.status, error.code) == (413, "too_many_features")
    error = refused(npz_bomb((3_000_000, 1)), Limits())
    assert (error.status, error.code) == (413, "too_many_samples")
    # an aux array far longer than X (800 MB declared), refused from its header alone
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", compression=zipfile.ZIP_DEFLATED) as zf:
        with zf.open("X.npy", "w") as fp:
            np.lib.format.write_array(fp, np.zeros((4, 2)))
        with zf.open("y.npy", "w") as fp:
            np.lib.format.write_array(fp, np.zeros(4, np.int64))
        with zf.open("ids.npy", "w") as fp:
            header = {"descr": "<U200", "fortran_order": False, "shape": (1_000_000,)}
            npy_format.write_array_header_1_0(fp, header)
    error = refused(buf.getvalue(), Limits())
    assert (error.status, error.code) == (422, "bad_shape")
    # object arrays are refused from the header, pickle or not
    objects = io.BytesIO()
    np.savez(objects, X=np.array([[1, "a"]], dtype=object), y=np.zeros(1))
    error = refused(objects.getvalue(), Limits())
    assert (error.status, error.code) == (422, "malformed_npz")


def test_csv_cap_is_checked_before_building_arrays() -> None:
    data = ("a,b,label\n" + "1,2,0\n" * 50).encode()
    assert parse_csv(data, "label", None, None, None, 0, 0.2).X.shape == (50, 2)
    with pytest.raises(APIError) as caught:
        parse_csv(data, "label", None, None, None, 0, 0.2, Limits(max_cells=99))
    assert (caught.value.status, caught.value.code) == (413, "dataset_too_large")
