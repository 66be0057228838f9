"""A CSV's errors name the column and the row and never echo a cell (it may hold a person's
id); what is ambiguous (a column named twice, the label also a feature, an id holding a
control character) is refused, not guessed."""

from __future__ import annotations

import pytest

from tests.conftest import Api

pytestmark = pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)


def post(api: Api, csv: str, **fields: str):
    form = {"label_column": "label", "id_column": "id", **fields}
    return api.post("/v1/datasets", files={"file": ("d.csv", csv.encode())}, data=form)


@pytest.mark.parametrize(
    ("csv", "column", "row"),
    [
        ("id,x1,label\na,1,0\nb,person-0,1\n", "x1", 1),
        ("id,x1,label\na,nan,0\nb,1,1\n", "x1", 0),
        ("id,x1,label\na,1,0\nb,2,inf\n", "label", 1),
    ],
)
def test_a_bad_cell_is_located_and_not_echoed(api: Api, csv: str, column: str, row: int) -> None:
    answer = post(api, csv)
    assert answer.status_code == 422, answer.text
    error = answer.json()["error"]
    assert error["details"]["column"] == column and error["details"]["row"] == row
    assert "person-0" not in answer.text


def test_ambiguous_uploads_are_refused(api: Api) -> None:
    twice = post(api, "id,x1,x1,label\na,1,2,0\nb,3,4,1\n")
    assert twice.status_code == 422 and twice.json()["error"]["code"] == "duplicate_columns"
    label_feature = post(api, "id,x1,label\na,1,0\nb,2,1\n", feature_columns="x1,label")
    assert label_feature.status_code == 422, label_feature.text
    assert label_feature.json()["error"]["details"]["column"] == "label"
    nul = post(api, "id,x1,label\na\x00b,1,0\nc,2,1\n")
    assert nul.status_code == 422 and nul.json()["error"]["code"] == "bad_ids"
