"""Erased stays erased under every spelling of an id (app/core/identity.py): a person erased by
subject stays out under their own sample ids, and near-variants of an erased id or subject
(Unicode forms, case, invisible characters, full-width digits, spaces, numbers typed or
written with zeros) are the same id wherever the dataset's rules say so."""

from __future__ import annotations

import io

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from app.core.identity import BadId, canonical
from tests.conftest import Api

SUBJECT = "Zoë-Müller-7731"  # NFC
NFD_SUBJECT = "Zoe\u0308-Mu\u0308ller-7731"


def people(n: int = 60, subject_column: bool = True, ids: list[str] | None = None) -> bytes:
    """Rows `zz-000`…; the first 12 are SUBJECT's."""
    ids = ids or [f"zz-{i:03d}" for i in range(n)]
    head = "id," + ("subject," if subject_column else "") + "label,f0,f1"
    rows = [head]
    for i, x in enumerate(ids):
        subject = SUBJECT if i < 12 else f"other-{i}"
        rows.append(
            f"{x}," + (f"{subject}," if subject_column else "") + f"{i % 2},{i * 0.5},{i % 3}"
        )
    return ("\n".join(rows) + "\n").encode()


def register(api: Api, data: bytes, name: str = "d.csv", **fields: str):
    form = {"label_column": "label", "id_column": "id", **fields}
    return api.post("/v1/datasets", files={"file": (name, data)}, data=form)


def erase(api: Api, dataset: int, **selector: list[str]) -> None:
    answer = api.post("/v1/deletions", json={"dataset_id": dataset, **selector})
    assert answer.status_code == 202 and answer.json()["status"] == "done", answer.text


@pytest.mark.parametrize("db_url", ["sqlite", "postgres"], indirect=True)
def test_a_person_erased_by_subject_stays_out_under_their_own_sample_ids(api: Api) -> None:
    first = register(api, people(), subject_column="subject")
    assert first.status_code == 201, first.text
    erase(api, first.json()["id"], subject_ids=[SUBJECT])
    assert api.get("/v1/suppressions", role="auditor").json()["sample_active"] == 12

    # next month's export dropped the subject column: the same 12 rows by id alone
    again = register(api, people(subject_column=False))
    assert again.status_code == 409, again.text
    details = again.json()["error"]["details"]
    assert details["rows"] == 12 and details["sample_ids"] == [f"zz-{i:03d}" for i in range(12)]
    skipped = register(api, people(subject_column=False), on_erased="skip")
    assert skipped.status_code == 201 and skipped.json()["skipped_erased"] == 12
    buf = io.BytesIO()
    np.savez(buf, X=np.ones((3, 2), np.float32), y=np.array([0, 1, 0]),
             ids=np.array(["zz-005", "new-1", "new-2"]))  # fmt: skip
    assert api.post("/v1/datasets", files={"file": ("d.npz", buf.getvalue())}).status_code == 409
    appended = api.post(
        f"/v1/datasets/{skipped.json()['id']}/samples",
        files={"file": ("more.csv", b"id,label,f0,f1\nzz-003,1,0.5,1\nfresh-1,0,1,2\n")},
        data={"label_column": "label", "id_column": "id"},
    )
    assert appended.status_code == 409, appended.text
    assert appended.json()["error"]["details"]["sample_ids"] == ["zz-003"]

    # the person consents again: their rows come back with them
    lifted = api.post("/v1/suppressions/lift", json={"subject_id": SUBJECT, "reason": "re-consent"})
    assert lifted.status_code == 200, lifted.text
    assert register(api, people(subject_column=False)).status_code == 201


# (what was erased, as a deletion named it) -> spellings of it a later upload may carry
SAMPLE_VARIANTS = {
    "zz-003": [" zz-003", "zz-003 ", "zz\u200b-003", "zz-\ufeff003", "zz-\uff10\uff10\uff13"],
}
SUBJECT_VARIANTS = {SUBJECT: [NFD_SUBJECT, f" {SUBJECT}", f"{SUBJECT}\u200d"]}


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)  # not a dialect's behaviour
def test_near_variants_of_an_erased_id_or_subject_are_refused(api: Api) -> None:
    first = register(api, people(), subject_column="subject")
    dataset = first.json()["id"]
    erase(api, dataset, sample_ids=["zz-003"])
    erase(api, dataset, subject_ids=[NFD_SUBJECT])  # the NFD form finds the NFC rows
    for erased, variants in SAMPLE_VARIANTS.items():
        for variant in variants:
            ids = [variant if x == erased else x for x in (f"q-{i}" for i in range(20))]
            ids[0] = variant
            data = people(20, subject_column=False, ids=[variant, *[f"q-{i}" for i in range(19)]])
            refused = register(api, data)
            assert refused.status_code == 409, (variant, refused.text)
    for variant in SUBJECT_VARIANTS[SUBJECT]:
        rows = ["id,subject,label,f0,f1"] + [
            f"v-{i},{variant if i == 0 else f'p-{i}'},{i % 2},{i},1" for i in range(20)
        ]
        refused = register(api, ("\n".join(rows) + "\n").encode(), subject_column="subject")
        assert refused.status_code == 409, (variant, refused.text)
        assert refused.json()["error"]["details"]["subjects"] == 1


@pytest.mark.parametrize("db_url", ["sqlite"], indirect=True)
def test_case_and_numbers_follow_the_dataset_s_rules(api: Api) -> None:
    """`ZZ-003` is another id in a dataset where case matters, the same one where it does
    not; a Parquet id `7.0` or `"07"` against an erased `7` where ids are numbers."""
    first = register(api, people(), subject_column="subject", id_case="insensitive")
    assert first.status_code == 201 and first.json()["ids"]["id_case"] == "insensitive"
    erase(api, first.json()["id"], sample_ids=["ZZ-004"])  # any case finds it here
    upper = people(20, subject_column=False, ids=["ZZ-004", *[f"u-{i}" for i in range(19)]])
    assert register(api, upper).status_code == 409  # erased in any case: every case stays out
    sensitive = people(20, subject_column=False, ids=["zz-004", *[f"s-{i}" for i in range(19)]])
    assert register(api, sensitive).status_code == 409

    numbers = _parquet({"id": pa.array([7, 8, 9, 10], pa.int64())})
    typed = register(api, numbers, name="n.parquet", numeric_ids="sample")
    assert typed.status_code == 201, typed.text
    erase(api, typed.json()["id"], sample_ids=["007"])  # a number: 007 is 7
    for column in (pa.array([7.0, 1.5, 2.5, 3.5]), pa.array(["07", "11", "12", "13"])):
        again = register(api, _parquet({"id": column}), name="n.parquet", numeric_ids="sample")
        assert again.status_code == 409, again.text
    text_zeros = register(api, _parquet({"id": pa.array(["07", "a", "b", "c"])}), name="t.parquet")
    assert text_zeros.status_code == 201  # a text column keeps its zeros: "07" is not 7
    assert (
        register(
            api, _parquet({"id": pa.array(["7", "d", "e", "f"])}), name="t.parquet"
        ).status_code
        == 409
    )

    binary = _parquet({"id": pa.array([b"zz-003", b"b1", b"b2", b"b3"], pa.binary())})
    erase(api, first.json()["id"], sample_ids=["zz-003"])
    assert register(api, binary, name="b.parquet").status_code == 409  # bytes are their text


def _parquet(columns: dict[str, pa.Array]) -> bytes:
    n = len(next(iter(columns.values())))
    table = pa.table({**columns, "label": pa.array([i % 2 for i in range(n)]),
                      "f0": pa.array([float(i) for i in range(n)])})  # fmt: skip
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


@pytest.mark.parametrize(
    ("value", "numeric", "fold", "expected"),
    [
        ("zz-003", False, False, "zz-003"),
        (" zz-003 ", False, False, "zz-003"),
        ("zz\u200b-003", False, False, "zz-003"),
        ("zz-\uff10\uff10\uff13", False, False, "zz-003"),
        (NFD_SUBJECT, False, False, SUBJECT),
        ("ZZ-003", False, True, "zz-003"),
        ("Straße", False, True, "strasse"),
        (7, False, False, "7"),
        (7.0, False, False, "7"),
        (7.5, False, False, "7.5"),
        ("7.0", False, False, "7.0"),  # text: as written
        ("07", False, False, "07"),
        ("07", True, False, "7"),
        ("+7.00", True, False, "7"),
        ("4711.0", True, False, "4711"),
        (b"4711", False, False, "4711"),
    ],
)
def test_the_canonical_text_of_an_id(
    value: object, numeric: bool, fold: bool, expected: str
) -> None:
    assert canonical(value, numeric=numeric, fold=fold) == expected


@pytest.mark.parametrize(
    "value", ["", " ", "\u200b", "a\x00b", "tab\there", float("nan"), True, "x" * 201]
)
def test_an_id_without_a_canonical_text_is_refused(value: object) -> None:
    with pytest.raises(BadId):
        canonical(value)
    with pytest.raises(BadId):
        canonical("seven", numeric=True)
