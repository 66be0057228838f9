"""The formats over HTTP: `GET /v1/formats` lists the registry with each format's options, and
an upload's format and options are checked by it before anything is written."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from app.core import formats
from tests.conftest import Api

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
CSV = b"id,x1,x2,label\na,1,2,0\nb,3,4,1\nc,5,6,0\nd,7,8,1\n"


def test_the_formats_are_listed_with_their_options(api: Api) -> None:
    listed = api.get("/v1/formats", role="reader")
    assert listed.status_code == 200, listed.text
    by_name = {f["name"]: f for f in listed.json()}
    assert list(by_name) == formats.names()
    assert by_name["parquet"]["suffixes"] == [".parquet", ".pq"]
    assert "min_count" in by_name["text_csv"]["options"]["properties"]
    assert "feature_columns" in by_name["csv"]["options"]["properties"]
    assert api.client.get("/v1/formats").status_code == 401


@pytest.mark.parametrize(
    ("fields", "code", "named"),
    [({"format": "xml"}, "unknown_format", "parquet"),
     ({"seed": "seven"}, "invalid_request", "seed"),
     ({"test_fraction": "2"}, "invalid_request", "test_fraction"),
     ({"format": "text_csv", "min_count": "0"}, "invalid_request", "min_count")],
)  # fmt: skip
def test_a_bad_format_or_option_is_422_and_writes_nothing(
    api: Api, fields: dict[str, str], code: str, named: str
) -> None:
    answer = api.post("/v1/datasets", files={"file": ("d.csv", CSV)}, data=fields)
    assert answer.status_code == 422, answer.text
    assert answer.json()["error"]["code"] == code
    assert named in answer.json()["error"]["message"]
    assert api.get("/v1/datasets").json()["total"] == 0


def test_a_file_is_read_by_the_format_its_suffix_names(api: Api) -> None:
    table = pa.table(
        {"id": ["a", "b", "c", "d"], "x1": [1.0, 2.0, 3.0, 4.0], "label": [0, 1, 0, 1]}
    )
    buffer = io.BytesIO()
    pq.write_table(table, buffer)
    answer = api.post(
        "/v1/datasets", files={"file": ("rows.pq", buffer.getvalue())}, data={"id_column": "id"}
    )
    assert answer.status_code == 201, answer.text
    assert answer.json()["source"] == "parquet" and answer.json()["n_samples"] == 4
