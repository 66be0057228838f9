"""The CLI's routine errors: one clear line on stderr and exit 1, a traceback only with
--debug; `create-key` finds the database the settings name."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import typer

from tests.support.cluster import Cluster

LETHE = [sys.executable, "-m", "app.launch"]
ROOT = Path(__file__).resolve().parents[2]


def lethe(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("LETHE_")}
    return subprocess.run(
        [*LETHE, *args],
        capture_output=True,
        text=True,
        env={**clean, **env},
        cwd=ROOT,
        timeout=120,
    )


def one_line_failure(result: subprocess.CompletedProcess[str], text: str) -> None:
    assert result.returncode == 1, result
    assert "Traceback" not in result.stderr and "╭" not in result.stderr, result.stderr
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("lethe: ") and text in lines[0], lines


def test_create_key_says_when_there_is_no_database(tmp_path: Path) -> None:
    result = lethe("create-key", "--role", "reader", LETHE_DATA_DIR=str(tmp_path))
    one_line_failure(result, f"no Lethe database at {tmp_path / 'lethe.db'}")


def test_an_unreachable_service_is_one_line_unless_debug() -> None:
    result = lethe("models", "get", "1", "--key", "k", LETHE_URL="http://127.0.0.1:9")
    one_line_failure(result, "cannot reach the service")
    debug = lethe("--debug", "models", "get", "1", "--key", "k", LETHE_URL="http://127.0.0.1:9")
    assert debug.returncode != 0 and "ConnectError" in debug.stderr


def test_a_witness_refuses_an_empty_or_malformed_log_key(tmp_path: Path) -> None:
    """compose with an empty LETHE_LOG_VKEY passed `--log ""`, and the witness
    crash-looped on a NoteError traceback; it refuses with one line that says what to set."""
    base = ["witness", "--name", "w.example/1", "--key-file", str(tmp_path / "w.key")]
    one_line_failure(lethe(*base, "--log", ""), "set LETHE_LOG_VKEY")
    one_line_failure(lethe(*base, "--log", "nonsense"), "is not a log's verifier key")


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[str, str, Path]]:
    with Cluster(tmp_path / "data", None, None) as cluster:
        yield cluster.start_api(), cluster.admin_key, tmp_path / "data"


@pytest.mark.integration
def test_api_errors_are_one_line_and_create_key_uses_the_data_dir(
    served: tuple[str, str, Path],
) -> None:
    url, admin, data_dir = served
    one_line_failure(lethe("models", "get", "1", "--key", "wrong", LETHE_URL=url), "401")
    one_line_failure(lethe("models", "get", "99", "--key", admin, LETHE_URL=url), "404")
    created = lethe("create-key", "--role", "reader", LETHE_DATA_DIR=str(data_dir))
    assert created.returncode == 0, created.stderr
    reader = created.stdout.split(": ")[-1].strip()
    one_line_failure(lethe("audit", "verify", "--key", reader, LETHE_URL=url), "403")


def test_method_options_parse_as_json_else_text() -> None:
    from app.cli import method_options

    assert method_options(["shards=8", "aggregation=vote", "evaluate=true"]) == {
        "shards": 8,
        "aggregation": "vote",
        "evaluate": True,
    }
    with pytest.raises(typer.BadParameter, match="KEY=VALUE"):
        method_options(["shards"])
    with pytest.raises(typer.BadParameter, match="finite"):  # was a traceback
        method_options(["shards=1e999"])


@pytest.mark.integration
@pytest.mark.long
def test_a_sharded_model_from_the_cli_and_its_deletion_cost(
    served: tuple[str, str, Path],
) -> None:
    url, admin, _ = served
    env = {"LETHE_URL": url, "LETHE_API_KEY": admin, "COLUMNS": "200"}  # no wrapped rows
    added = lethe("datasets", "add", "--builtin", "digits", **env)
    assert added.returncode == 0, added.stderr
    listed = lethe("datasets", "list", **env)  # the list, newest first
    assert listed.returncode == 0, listed.stderr
    assert "digits" in listed.stdout and "builtin:digits" in listed.stdout
    assert "ready" in listed.stdout and "1 of 1" in listed.stdout
    created = lethe(
        *("models", "create", "1", "--arch", "mlp", "--hidden", "16", "--epochs", "2"),
        *("--method", "sharded_retrain", "--option", "shards=3", "--option", "slices=2"),
        **env,
    )
    assert created.returncode == 0, created.stderr
    assert '"shards": 3' in created.stdout and '"status": "ready"' in created.stdout
    preview = lethe("privacy", "preview", "1", **env)
    assert preview.returncode == 0, preview.stderr
    assert "one deletion: sharded_retrain shards=3 slices=2" in preview.stdout
    assert "one deletion: retrain" in preview.stdout and "(measured)" in preview.stdout
    audited = lethe("models", "audit", "1", "--canaries", "200", "--seed", "3", **env)
    assert audited.returncode == 0, audited.stderr
    # SISA retrains the canaries' shards exactly: the joint test proves nothing (ε ≥ 0); with
    # 200 canaries on this small model the control may show no power either (inconclusive)
    assert "joint test: none (null p = 1)" in audited.stdout, audited.stdout
    assert "violated" not in audited.stdout


@pytest.mark.integration
@pytest.mark.long
def test_a_parquet_file_with_a_mapping_registers_as_a_job_from_the_cli(
    served: tuple[str, str, Path], tmp_path: Path
) -> None:
    """`lethe datasets add --file x.parquet` with a column mapping; past 10,000
    rows the API answers 202 and the command follows the job to its end."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    url, admin, _ = served
    X = np.random.default_rng(2).standard_normal((12_000, 3))
    table = pa.table(
        {"key": [f"k{i}" for i in range(12_000)], "target": (X[:, 0] > 0).astype(np.int64)}
        | {f"x{j}": X[:, j] for j in range(3)}
    )
    path = tmp_path / "big.parquet"
    pq.write_table(table, path, row_group_size=4096)
    env = {"LETHE_URL": url, "LETHE_API_KEY": admin, "COLUMNS": "200"}
    added = lethe(
        *("datasets", "add", "--file", str(path), "--label-column", "target"),
        *("--id-column", "key", "--feature-columns", "x2,x0"),
        **env,
    )
    assert added.returncode == 0, added.stderr
    assert '"status": "ready"' in added.stdout and '"n_samples": 12000' in added.stdout
    assert (
        '"source": "parquet"' in added.stdout and '"feature_shape": [\n    2\n  ]' in added.stdout
    )
    created = lethe(
        *("models", "create", "1", "--arch", "logreg", "--epochs", "1"),
        *("--method", "convex_head", "--option", "lam=0.01", "--option", "R=8"),
        **env,
    )
    assert created.returncode == 0, created.stderr
    model_id = created.stdout.split('"id": ')[1].split(",")[0]
    # 15,000 more rows as a job (202), then every model learns them
    more = tmp_path / "more.parquet"
    Y = np.random.default_rng(3).standard_normal((15_000, 3))
    pq.write_table(
        pa.table(
            {"key": [f"n{i}" for i in range(15_000)], "target": (Y[:, 0] > 0).astype(np.int64)}
            | {f"x{j}": Y[:, j] for j in range(3)}
        ),
        more,
        row_group_size=4096,
    )
    appended = lethe(
        *("datasets", "append", "1", str(more), "--label-column", "target"),
        *("--id-column", "key", "--feature-columns", "x2,x0"),
        **env,
    )
    assert appended.returncode == 0, appended.stderr
    assert "append 1: 15000 rows (ready)" in appended.stdout, appended.stdout
    row = next(line for line in appended.stdout.splitlines() if line.strip().startswith("│"))
    assert model_id in row and "done" in row, appended.stdout
    again = lethe(
        *("datasets", "append", "1", str(more), "--label-column", "target"),
        *("--id-column", "key", "--feature-columns", "x2,x0"),
        **env,
    )
    assert again.returncode == 1 and "duplicate_ids" in again.stderr, again.stderr
