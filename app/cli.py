"""`lethe`: run the service and its workers, manage keys, and talk to a running service."""

from __future__ import annotations

import contextlib
import hashlib
import importlib
import json
import logging
import signal
import sys
import time
from pathlib import Path
from types import FrameType
from typing import Annotated, Any

import httpx
import typer
from pydantic import BaseModel
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table
from sqlalchemy.exc import OperationalError, ProgrammingError

from app.client import Client, LetheError, Unreachable
from app.core.jsontypes import JsonObject, as_object, optional_object
from app.core.states import FINISHED_TASK, append_settled
from app.core.wire import DeletionOut, ModelOut


class CliError(RuntimeError):
    """A routine failure: one line on stderr, exit 1 (a traceback only with --debug)."""


app = typer.Typer(help="Lethe: certified machine unlearning as a service.", no_args_is_help=True)
console = Console()
Url = Annotated[str | None, typer.Option(envvar="LETHE_URL", help="Service URL")]
Key = Annotated[str | None, typer.Option(envvar="LETHE_API_KEY", help="API key")]


def _client(url: str | None, key: str | None) -> Client:
    return Client(url, key)


def _show(data: Any) -> None:
    """Print JSON, or a wire model (or a list of them) as its JSON."""
    if isinstance(data, BaseModel):
        data = data.model_dump(mode="json")
    elif isinstance(data, list):
        data = [d.model_dump(mode="json") if isinstance(d, BaseModel) else d for d in data]
    console.print_json(json.dumps(data, default=str))


@app.command()
def serve(host: str = "127.0.0.1", port: int = 8000) -> None:
    """Start the API (embedded mode: SQLite file and a worker process of its own)."""
    from app.core.allocator import restart_scrubbing

    restart_scrubbing()  # every freed block overwritten: no erased id in free memory
    import uvicorn

    from app.core.settings import get_settings
    from app.main import create_app

    settings = get_settings()
    mode = (
        f"embedded (SQLite + worker {settings.embedded_worker})"
        if settings.embedded
        else "distributed (RQ)"
    )
    console.print(
        f"[bold]Lethe[/bold] on http://{host}:{port}  mode: {mode}\n"
        f"database: {settings.resolved_database_url}"
    )
    # asyncio's loop, not uvloop: uvloop reads every socket into one long-lived 256 KiB buffer,
    # which kept the last upload's and deletion's bytes (ids) after the erasure
    config = uvicorn.Config(
        create_app(settings), host=host, port=port, log_level="info", loop="asyncio"
    )
    server = _one_stop_server()(config)
    # uvicorn restores these once stopped and raises the signals it took again: the stop is
    # done by then, so the process ends 0 (not killed by its own signal, nor a traceback)
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, _stopped_already)
    with contextlib.suppress(KeyboardInterrupt):  # as uvicorn.run
        server.run()
    if not server.started:
        raise SystemExit(3)  # uvicorn's code for a failed start-up


def _stopped_already(signum: int, frame: FrameType | None) -> None:
    """A stop signal after uvicorn's own stop (its shutdown ran): nothing left to do."""


def _one_stop_server() -> type:
    import uvicorn

    class OneStop(uvicorn.Server):
        """A second Ctrl-C or SIGTERM while stopping is noted, not obeyed: uvicorn's "force
        quit" skipped the app's own shutdown (the worker's stop, the last checkpoint's
        publication), and the worker it left was restarted while the server exited. The
        stop is bounded: a worker puts its job back within STOP_SECONDS."""

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            if self.should_exit:
                logging.getLogger("uvicorn.error").info("stopping already (the worker first)")
                return
            super().handle_exit(sig, frame)

    return OneStop


@app.command()
def migrate() -> None:
    """Bring the database (LETHE_DATABASE_URL) to the newest schema."""
    from app.core.db.migrate import upgrade_to_head
    from app.core.settings import get_settings

    url = get_settings().resolved_database_url
    upgrade_to_head(url)
    console.print(f"migrated {url.split('@')[-1]} to head")
    _move_blobs()


def _move_blobs() -> None:
    from app.core.settings import get_settings
    from app.core.storage.blobs import blobs

    store = blobs(get_settings())
    moved = store.migrate()
    console.print(f"blobs: {moved} moved into the {store.store.location} store")


@app.command("create-key")
def create_key_cmd(
    role: Annotated[str, typer.Option(help="admin|requester|auditor|reader")], name: str = "cli key"
) -> None:
    """Create an API key directly in the database; prints the secret once."""
    from app.core.db.session import database
    from app.core.security import Role, create_key
    from app.core.settings import get_settings

    try:
        role_value = Role(role)
    except ValueError as exc:
        raise typer.BadParameter(f"role must be one of {[r.value for r in Role]}") from exc
    settings = get_settings()
    url = settings.resolved_database_url
    where = _database_description(settings)
    if url.startswith("sqlite:///") and not Path(url.removeprefix("sqlite:///")).exists():
        raise CliError(
            f"no Lethe database at {where}: start `lethe serve` once there, or set "
            "LETHE_DATA_DIR (embedded) or LETHE_DATABASE_URL to the service's database"
        )
    try:
        with database(url).write() as session:
            key, raw = create_key(session, role_value, name)
    except OperationalError as exc:
        raise CliError(f"cannot use the database at {where}: {_first_line(exc)}") from exc
    except ProgrammingError as exc:
        raise CliError(f"the database at {where} has no Lethe tables: run `lethe migrate`") from exc
    console.print(f"key {key.id} ({key.role}): {raw}")


def _database_description(settings: Any) -> str:
    url = settings.resolved_database_url
    if url.startswith("sqlite:///"):
        return url.removeprefix("sqlite:///")
    return url.split("@")[-1]


def _stop_while_starting(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(0)


def _first_line(exc: BaseException) -> str:
    return str(getattr(exc, "orig", exc)).strip().splitlines()[0]


@app.command()
def worker(burst: bool = typer.Option(False, help="Exit when the queue is empty")) -> None:
    """Start one RQ worker (distributed mode; needs LETHE_REDIS_URL)."""
    # Until the RQ loop takes SIGTERM over, a stop ends the start-up at once (it holds no job).
    # In a container this process is PID 1, for which an unhandled SIGTERM is ignored: a
    # worker stopped while still starting waited out the engine's grace period.
    signal.signal(signal.SIGTERM, _stop_while_starting)
    # a process that re-executed itself to give way kept SIGTERM blocked (workers/worker.py):
    # one sent meanwhile is taken now
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})
    from app.core.db.session import database
    from app.core.services.restore import journal_of, verdict
    from app.core.settings import get_settings

    settings = get_settings()
    found = verdict(database(settings.resolved_database_url), journal_of(settings))
    if found.state == "behind":  # it would sign a second tree at a published size
        raise CliError(f"not starting: {found.reason}; run `lethe restore` first")
    importlib.import_module("workers.worker").run(burst=burst, settings=settings)


@app.command()
def restore(
    journal: Annotated[
        Path | None,
        typer.Option(
            help="the restore journal to use, where it is not in LETHE_JOURNAL_DIR (a database "
            "moved without it): copied into place"
        ),
    ] = None,
    new_deployment: Annotated[
        bool,
        typer.Option(
            help="this database is a copy that lives on alone: give it a new identity and a "
            "journal of its own (the original must not go on publishing)"
        ),
    ] = False,
) -> None:
    """After restoring the database from a backup (or moving it): put the log back as it was
    published (nothing re-signed), re-apply every erasure the backup predates and continue
    every id past the highest given. Run it with the service stopped, then start the
    service; it is ready once the erasures are done."""
    from app.core.db.migrate import upgrade_to_head
    from app.core.db.session import database
    from app.core.services.restore import adopt_journal, journal_of
    from app.core.services.restore import new_deployment as renew
    from app.core.services.restore import restore as run_restore
    from app.core.settings import get_settings
    from app.core.storage.crypto import keyring

    settings = get_settings()
    url = settings.resolved_database_url
    if settings.embedded:
        upgrade_to_head(url)
    db = database(url)
    if journal is not None and new_deployment:
        raise CliError("give --journal or --new-deployment, not both")
    if journal is not None:
        try:
            adopt_journal(db, settings.resolved_journal_dir, journal)
        except ValueError as exc:
            raise CliError(str(exc)) from exc
    if new_deployment:
        made = renew(db, settings.resolved_journal_dir)
        _show({"new_deployment": made.folder.name, "journal": str(made.folder)})
        return
    report = run_restore(db, keyring(settings), journal_of(settings))
    _show(report.as_json())


datasets = typer.Typer(help="Datasets")
models = typer.Typer(help="Models")
deletions = typer.Typer(help="Deletion requests")
audit = typer.Typer(help="Audit log")
storage = typer.Typer(help="The blob store (weights, noise-free states)")
privacy = typer.Typer(help="Privacy accounting")
app.add_typer(privacy, name="privacy")
app.add_typer(datasets, name="datasets")
app.add_typer(models, name="models")
app.add_typer(deletions, name="deletions")
app.add_typer(audit, name="audit")
app.add_typer(storage, name="storage")


@storage.command("migrate")
def storage_migrate() -> None:
    """Move every blob stored elsewhere (in the database, as older versions kept them, or in another
    backend) into the configured store (LETHE_BLOB_STORE), re-sealed under new data keys."""
    _move_blobs()


@storage.command("sweep")
def storage_sweep(
    grace_seconds: Annotated[
        float | None, typer.Option(help="default LETHE_BLOB_ORPHAN_GRACE_SECONDS")
    ] = None,
) -> None:
    """Delete objects no blob row references (a crash between a write and its commit)."""
    from app.core.settings import get_settings
    from app.core.storage.blobs import blobs

    settings = get_settings()
    grace = settings.blob_orphan_grace_seconds if grace_seconds is None else grace_seconds
    console.print(f"swept {blobs(settings).sweep(grace)} orphaned objects")


@datasets.command("list")
def datasets_list(
    status: str | None = typer.Option(None, help="registering or ready"),
    offset: int = 0,
    limit: int = 100,
    url: Url = None,
    key: Key = None,
) -> None:
    """The datasets, newest first."""
    page = _client(url, key).datasets(status=status, offset=offset, limit=limit)
    table = Table("id", "name", "kind", "source", "samples", "features", "classes", "status")
    for d in page.items:
        shape = "×".join(str(n) for n in d.feature_shape)
        table.add_row(
            str(d.id), d.name, d.kind, d.source, str(d.n_samples), shape, str(d.n_classes), d.status
        )
    console.print(table)
    console.print(f"{len(page.items)} of {page.total} (offset {page.offset})")


def _options(pairs: list[str]) -> dict[str, str]:
    """`--option KEY=VALUE` pairs as form fields."""
    bad = [p for p in pairs if "=" not in p]
    if bad:
        raise typer.BadParameter(f"options are KEY=VALUE, got {bad[0]!r}")
    return dict(p.split("=", 1) for p in pairs)


@datasets.command("formats")
def datasets_formats(url: Url = None, key: Key = None) -> None:
    """The data formats the server reads, with their suffixes and options (GET /v1/formats)."""
    for f in _client(url, key).get("/v1/formats"):
        suffixes = ", ".join(f["suffixes"]) or "by --format"
        options = ", ".join(f["options"].get("properties", {}))
        console.print(f"[bold]{f['name']}[/bold] ({suffixes}): {f['summary']}")
        console.print(f"  options: {options}")


@datasets.command("add")
def datasets_add(
    builtin: str | None = None,
    file: Path | None = None,
    name: str | None = None,
    label_column: str = "label",
    id_column: str | None = None,
    subject_column: str | None = None,
    split_column: str | None = None,
    feature_columns: str | None = typer.Option(None, help="comma-separated (csv, parquet)"),
    file_format: str | None = typer.Option(
        None, "--format", help="a format `lethe datasets formats` lists (default: the suffix's)"
    ),
    option: list[str] = typer.Option(
        [], "--option", "-o", help="a format's option as KEY=VALUE (GET /v1/formats lists them)"
    ),
    on_erased: str = typer.Option("refuse", help="rows of erased people: refuse or skip"),
    id_case: str = typer.Option("sensitive", help="sensitive, or insensitive: ids of any case"),
    numeric_ids: str | None = typer.Option(
        None, help="which ids are numbers (007 is 7): sample, subject or sample,subject"
    ),
    url: Url = None,
    key: Key = None,
) -> None:
    """Register a builtin (--builtin digits) or upload an .npz / CSV / Parquet file (--file),
    with its column mapping and its rules for ids."""
    c = _client(url, key)
    numbers = [n.strip() for n in (numeric_ids or "").split(",") if n.strip()]
    if builtin:
        spec: dict[str, Any] = {"builtin": builtin, "on_erased": on_erased}
        spec |= {"id_case": id_case, "numeric_ids": numbers} | ({"name": name} if name else {})
        _show(_registered(c, c.post("/v1/datasets", json=spec)))
    elif file:
        mapping = {
            "id_column": id_column,
            "subject_column": subject_column,
            "split_column": split_column,
            "feature_columns": feature_columns,
        }
        form = {"name": name or file.stem, "label_column": label_column, "on_erased": on_erased}
        form |= {"id_case": id_case, "numeric_ids": ",".join(numbers)}
        form |= {k: v for k, v in mapping.items() if v} | _options(option)
        if file_format:
            form["format"] = file_format
        with file.open("rb") as fh:
            _show(
                _registered(c, c.post("/v1/datasets", files={"file": (file.name, fh)}, data=form))
            )
    else:
        raise typer.BadParameter("give --builtin or --file")


@datasets.command("append")
def datasets_append(
    dataset: int,
    file: Path,
    id_column: str | None = None,
    label_column: str = "label",
    subject_column: str | None = None,
    split_column: str | None = None,
    feature_columns: str | None = typer.Option(None, help="comma-separated (csv, parquet)"),
    on_erased: str = typer.Option("refuse", help="rows of erased people: refuse or skip"),
    wait: bool = typer.Option(True, help="follow the models' learning of the rows"),
    url: Url = None,
    key: Key = None,
) -> None:
    """Append a file's rows to a ready dataset (ids of your own; a row's split is its column's
    or a keyed hash of its id); every model of the dataset then learns them."""
    c = _client(url, key)
    mapping = {
        "id_column": id_column,
        "subject_column": subject_column,
        "split_column": split_column,
        "feature_columns": feature_columns,
    }
    form = {"label_column": label_column, "on_erased": on_erased}
    form |= {k: v for k, v in mapping.items() if v}
    with file.open("rb") as fh:
        answer = c.post(
            f"/v1/datasets/{dataset}/samples", files={"file": (file.name, fh)}, data=form
        )
    path = f"/v1/datasets/{dataset}/appends/{answer['id']}"
    answer = _followed(c, answer, path, f"appending to dataset {dataset}")
    if wait:
        with Progress(console=console, transient=True) as bar:
            task = bar.add_task("models learning the rows", total=len(answer["learning"]) or None)
            while not append_settled(answer["status"], (t["status"] for t in answer["learning"])):
                finished = sum(t["status"] in FINISHED_TASK for t in answer["learning"])
                bar.update(task, completed=finished)
                answer = c.get(path, params={"wait": 2})  # a long poll: back when all learned
    table = Table("model", "learning", "version", "rows learned")
    for t in answer["learning"]:
        table.add_row(
            str(t["model_id"]), t["status"], str(t["version_id"] or ""), str(t["n_added"])
        )
    console.print(f"append {answer['id']}: {answer['n_samples']} rows ({answer['status']})")
    console.print(table)


def _followed(c: Client, answer: dict[str, Any], path: str, what: str) -> dict[str, Any]:
    """A job answered 202 (`registering`) followed with a progress bar of its rows to its
    end; a failure is printed and exits 1."""
    if answer.get("status") == "registering":
        with Progress(console=console, transient=True) as bar:
            task = bar.add_task(what, total=None)
            while answer["status"] == "registering":
                progress = answer.get("progress") or {}
                bar.update(
                    task,
                    completed=progress.get("rows_done", 0),
                    total=progress.get("rows_total") or None,
                )
                time.sleep(0.5)
                answer = c.get(path)
    if answer["status"] == "failed":
        console.print(f"[red]{what} failed:[/red] {answer['error']}")
        raise typer.Exit(1)
    return answer


def _registered(c: Client, answer: dict[str, Any]) -> dict[str, Any]:
    """The dataset once its registration is over: a registration answered 202 (a job) is
    followed with a progress bar of its rows."""
    path = f"/v1/datasets/{answer['id']}"
    return _followed(c, answer, path, f"registering dataset {answer['id']}")


@models.command("create")
def models_create(
    dataset: int,
    name: str = "model",
    arch: str = "logreg",
    hidden: str = "64,64",
    epochs: int = 20,
    batch_size: int = 64,
    lr: float = 0.1,
    method: str = "retrain",
    option: Annotated[
        list[str] | None,
        typer.Option(help="a method option as KEY=VALUE (repeatable), e.g. shards=8"),
    ] = None,
    wait: bool = True,
    url: Url = None,
    key: Key = None,
) -> None:
    """Create and train a model, with a progress bar while it trains."""
    options = method_options(option or [])
    c = _client(url, key)
    arch_spec: JsonObject = {"type": arch}
    if arch == "mlp":
        arch_spec["hidden"] = [int(h) for h in hidden.split(",")]
    model = c.create_model(
        {
            "name": name,
            "dataset_id": dataset,
            "architecture": arch_spec,
            "method": {"name": method, **options},
            "training": {"epochs": epochs, "batch_size": batch_size, "learning_rate": lr},
        }
    )
    if wait:
        model = train_with_progress(c, model.id, epochs)
    _show(model)


def method_options(pairs: list[str]) -> JsonObject:
    """`KEY=VALUE` pairs as method options; a value is JSON when it parses (8, 0.5, true),
    else a string (vote). The service validates them."""
    options: JsonObject = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name:
            raise typer.BadParameter(f"--option {pair!r}: write KEY=VALUE, e.g. shards=8")
        try:
            options[name] = json.loads(value)
        except ValueError:
            options[name] = value
        try:  # 1e999 parses as inf, which no JSON body can carry
            json.dumps(options[name], allow_nan=False)
        except ValueError as exc:
            message = f"--option {pair!r}: the value is not a finite number"
            raise typer.BadParameter(message) from exc
    return options


def train_with_progress(c: Client, model_id: int, epochs: int) -> ModelOut:
    with Progress(
        TextColumn("training model {task.fields[model]}"),
        BarColumn(),
        TextColumn("epoch {task.completed:.0f}/{task.total:.0f}"),
        TimeElapsedColumn(),
        console=console,
    ) as bar:
        task = bar.add_task("train", total=epochs, model=model_id)

        def on_progress(model: ModelOut) -> None:
            bar.update(task, completed=model.progress.epoch or 0)

        return c.wait_model(model_id, on_progress)


@models.command("audit")
def models_audit(
    model_id: int,
    canaries: int = 1000,
    kind: Annotated[str, typer.Option(help="random|mislabelled|leverage (logreg)")] = "random",
    score: Annotated[str, typer.Option(help="loss|margin|weights (white-box)")] = "loss",
    confidence: float = 0.95,
    seed: int | None = None,
    url: Url = None,
    key: Key = None,
) -> None:
    """Audit the model's certificates with canaries (auditor or admin key) and wait for the
    verdict: the lower bounds on ε per canary against what the certificate implies."""
    c = _client(url, key)
    options = {"canaries": canaries, "kind": kind, "score": score, "confidence": confidence}
    started = c.start_audit(model_id, **options, **({"seed": seed} if seed is not None else {}))
    with console.status(f"audit {started.id}: queued") as shown:
        done = c.wait_audit(
            started.id, lambda a: shown.update(f"audit {a.id}: {a.stage or a.status}")
        )
    if done.result is None:
        console.print(f"audit {done.id} failed: {done.error}")
        raise typer.Exit(1)
    r = done.result
    table = Table("audit", "verdict", "audited", "certified ε", "proves ε ≥", "ceiling",
                  "control", "per canary: ε′", "one-run bound", "AUC")  # fmt: skip
    control = optional_object(r.get("control"))
    joint = optional_object(r.get("joint"))
    control_joint = optional_object(control.get("joint")) if control else None
    table.add_row(
        str(done.id),
        str(done.verdict),
        str(r.get("audited") or r.get("method")),
        _fmt(r.get("certified_epsilon")),
        _fmt(joint["epsilon"] if joint else None),
        _fmt(joint["ceiling"] if joint else None),
        _fmt(control_joint["epsilon"] if control_joint else None),
        _fmt(r.get("implied_epsilon")),
        _fmt(as_object(r["one_run"])["epsilon"]),
        _fmt(r.get("auc")),
    )
    if joint:
        console.print(f"joint test: {joint['statistic']} (null p = {_fmt(joint['p_null'])})")
    noise = optional_object(r.get("noise"))
    if noise:  # σ measured on the rows: calibrated on the reference
        console.print(
            f"σ {_fmt(noise.get('sigma'))} calibrated on {noise.get('calibrated_on')} "
            f"(on the shadow with its canaries: {_fmt(noise.get('sigma_on_the_shadow'))})"
        )
    console.print(table)


def _fmt(x: object) -> str:
    return f"{x:.3g}" if isinstance(x, int | float) else "-"


@models.command("get")
def models_get(model_id: int, url: Url = None, key: Key = None) -> None:
    _show(_client(url, key).model(model_id))


@models.command("versions")
def models_versions(model_id: int, url: Url = None, key: Key = None) -> None:
    table = Table("version", "kind", "test acc", "sha256", "weights")
    for v in _client(url, key).versions(model_id):
        acc = v.metrics.get("test_accuracy")
        table.add_row(
            str(v.number),
            v.kind,
            f"{acc:.4f}" if acc is not None else "-",
            v.weights_sha256[:16],
            "available" if v.weights_available else "erased (410)",
        )
    console.print(table)


@models.command("weights")
def models_weights(
    model_id: int, out: Path, version: int | None = None, url: Url = None, key: Key = None
) -> None:
    """Download released weights (safetensors) and check them against the ETag."""
    path = f"/v1/models/{model_id}" + (f"/versions/{version}" if version else "") + "/weights"
    response = _client(url, key).request("GET", path)
    out.write_bytes(response.content)
    ok = hashlib.sha256(response.content).hexdigest() == response.headers["etag"].strip('"')
    console.print(f"wrote {len(response.content)} bytes to {out}; sha256 matches ETag: {ok}")


@deletions.command("create")
def deletions_create(
    dataset: int,
    sample: Annotated[list[str] | None, typer.Option()] = None,
    subject: Annotated[list[str] | None, typer.Option()] = None,
    idempotency_key: str | None = None,
    wait: bool = True,
    url: Url = None,
    key: Key = None,
) -> None:
    """Ask for samples (--sample ID ...) or subjects (--subject ID ...) to be forgotten."""
    c = _client(url, key)
    req = c.delete(dataset, sample, subject, idempotency_key=idempotency_key)
    opening = req.opening
    if wait:
        with console.status(f"deletion {req.id}: {req.status}") as status:

            def on_progress(current: DeletionOut) -> None:
                models = ", ".join(
                    f"model {m.model_id} {m.status}" + (f" → v{m.version}" if m.version else "")
                    for m in current.models
                )
                status.update(f"deletion {current.id}: {current.status} ({models})")

            req = c.wait_deletion(req.id, on_progress=on_progress, poll=2.0)
    _show({**req.model_dump(mode="json"), "opening": opening})


@deletions.command("get")
def deletions_get(request_id: int, url: Url = None, key: Key = None) -> None:
    _show(_client(url, key).deletion(request_id))


@privacy.command("preview")
def privacy_preview(
    model: int,
    epsilon: float | None = None,
    delta: float | None = None,
    url: Url = None,
    key: Key = None,
) -> None:
    """Noise σ, feasibility and lineage budget of a model's next release."""
    p = _client(url, key).preview(model, epsilon, delta)
    table = Table("quantity", "value", title=f"model {model}: next release ({p.method})")
    lin = p.lineage
    for name, value in [
        ("target", f"ε={p.target.epsilon:g}, δ={p.target.delta:g}"),
        ("guarantee", p.guarantee),
        ("noise σ", f"{p.sigma:.6g}" if p.sigma is not None else "—"),
        ("sensitivity Δ", f"{p.sensitivity:.6g}" if p.sensitivity is not None else "—"),
        ("feasible", str(p.feasible)),
        (
            "lineage spent",
            f"ε={lin.spent_epsilon:.4g} of {lin.budget_epsilon:g} "
            f"(δ={lin.budget_delta:g}, {lin.releases_since_reset} releases)",
        ),
        ("after this release", f"ε={lin.epsilon_after_release:.4g}"),
        ("would retrain exactly", str(p.would_retrain_exactly)),
    ]:
        table.add_row(name, value)
    for cost in p.deletion_cost.methods if p.deletion_cost else []:
        options = " ".join(f"{k}={v}" for k, v in cost.options.items())
        seconds, share = cost.expected_compute_seconds, cost.fraction_of_full_retrain
        table.add_row(
            f"one deletion: {cost.method} {options}".strip(),
            (f"{seconds:.3g} s" if seconds is not None else "—")
            + (f", {share:.1%} of a full retrain" if share is not None else "")
            + f" ({cost.basis.split(':')[0]})",
        )
    console.print(table)


@audit.command("verify")
def audit_verify(url: Url = None, key: Key = None) -> None:
    _show(_client(url, key).verify())


@audit.command("certificates")
def audit_certificates(model: int | None = None, url: Url = None, key: Key = None) -> None:
    _show(_client(url, key).certificates(model=model, limit=1000))


@audit.command("verify-receipt")
def audit_verify_receipt(
    receipt: Annotated[
        Path, typer.Argument(help="a .tlog-proof file, or a JSON receipt of a finished deletion")
    ],
    policy: Annotated[
        Path | None,
        typer.Option(help="for a .tlog-proof: lines `log <vkey>`, `witness <vkey>`, `quorum <n>`"),
    ] = None,
    keys: Annotated[
        Path | None, typer.Option(help="for a JSON receipt: GET /v1/audit/public-key, saved")
    ] = None,
    head: Annotated[Path | None, typer.Option(help="a newer head (GET /v1/audit/head)")] = None,
    consistency: Annotated[
        Path | None, typer.Option(help="GET /v1/audit/proof/consistency?first=M&second=N")
    ] = None,
    opening: Annotated[
        str | None, typer.Option(help="the `opening` your POST /v1/deletions answer carried")
    ] = None,
    sample_id: Annotated[
        list[str] | None,
        typer.Option("--id", help="a removed id (repeat: every id the certificate removed)"),
    ] = None,
) -> None:
    """Check a receipt offline, from files alone. A `.tlog-proof` (C2SP tlog-proof@v1): the
    checkpoint's log signature and the policy's quorum of witness cosignatures, and the
    certificate's inclusion. A JSON receipt: the head's signature, the inclusion, and (with
    --head and --consistency) that a newer head extends it. With --opening and --id: that
    the certificate removed exactly these ids."""
    from app.core.ledger.certificates import commitment_holds

    if (opening is None) != (not sample_id):
        raise CliError("--opening and --id go together")
    text = receipt.read_text()
    if text.startswith("c2sp.org/tlog-proof@v1\n"):
        entry = _verify_tlog_proof(text, policy)
    else:
        entry = _verify_json_receipt(text, keys, head, consistency)
    if opening is not None and sample_id:
        certificate = json.loads(entry)
        commitment = str(certificate.get("removed_ids_commitment", ""))
        if not commitment_holds(opening, list(sample_id), commitment):
            raise CliError("the certificate does not commit to these ids under this opening")
        console.print(f"committed: the certificate removed exactly these {len(sample_id)} ids")


def _verify_tlog_proof(text: str, policy: Path | None) -> str:
    from app.core.ledger.notes import NoteError
    from app.core.ledger.tiles import ProofPolicy, verify_tlog_proof

    if policy is None:
        raise CliError("a .tlog-proof is checked against a --policy file (log and witnesses)")
    try:
        proven = verify_tlog_proof(text, ProofPolicy.parse(policy.read_text()))
    except (NoteError, ValueError) as exc:
        raise CliError(f"receipt does not verify: {exc}") from exc
    witnessed = ", ".join(proven.cosigned_by) or "no witness"
    console.print(
        f"included: entry {proven.index} under the checkpoint of size {proven.checkpoint.size} "
        f"of {proven.checkpoint.origin}, cosigned by {witnessed}"
    )
    return proven.entry.decode()


def _verify_json_receipt(
    text: str, keys: Path | None, head: Path | None, consistency: Path | None
) -> str:
    from app.core.ledger.receipts import ReceiptError, verify_extension, verify_receipt

    if keys is None:
        raise CliError("a JSON receipt is checked against --keys (GET /v1/audit/public-key)")
    if (head is None) != (consistency is None):
        raise CliError("--head and --consistency go together: a head alone proves nothing")
    key_table = json.loads(keys.read_text())
    document = json.loads(text)
    try:
        old = verify_receipt(document, key_table)
        console.print(
            f"included: certificate leaf under the head of size {old['tree_size']} "
            f"signed by {old['key_id']}"
        )
        if head is not None and consistency is not None:
            newer = json.loads(head.read_text())
            verify_extension(old, newer, json.loads(consistency.read_text()), key_table)
            console.print(f"consistent: the head of size {newer['tree_size']} extends it")
    except ReceiptError as exc:
        raise CliError(f"receipt does not verify: {exc}") from exc
    return str(document["entry"])


@audit.command("monitor")
def audit_monitor(
    url: Annotated[str, typer.Argument(help="the log's URL prefix, e.g. https://host/log")],
    policy: Annotated[
        Path, typer.Option(help="lines `log <vkey>`, `witness <vkey>`, `quorum <n>`")
    ],
    state: Annotated[Path, typer.Option(help="where the last checked checkpoint is kept")],
    every: Annotated[float, typer.Option(help="seconds between checks")] = 60.0,
    once: Annotated[bool, typer.Option(help="check once and exit")] = False,
) -> None:
    """Follow a log's checkpoints from a saved state, with no API key: each new checkpoint
    must carry the policy's signatures and extend the last one checked (a consistency proof
    computed from the public tiles). Exits 1 on an inconsistency."""

    from app.core.ledger import notes
    from app.core.ledger.tiles import ProofPolicy, check_extension

    trust = ProofPolicy.parse(policy.read_text())
    base = url.rstrip("/")

    def fetch(path: str) -> bytes:
        answer = httpx.get(f"{base}/{path}", timeout=30)
        answer.raise_for_status()
        return answer.content

    while True:
        note = fetch("checkpoint").decode()
        try:
            opened = notes.open_note(note, [trust.log, *trust.witnesses])
            cosigned = [n for n in opened.signed_by if n != trust.log.name]
            if trust.log.name not in opened.signed_by or len(cosigned) < trust.quorum:
                raise notes.NoteError("the checkpoint lacks the policy's signatures")
            new = notes.Checkpoint.parse(opened.text)
            old = (
                notes.Checkpoint.parse(notes.split(state.read_text())[0])
                if state.exists()
                else notes.Checkpoint(new.origin, 0, b"")
            )
            check_extension(old, new, fetch)
        except notes.NoteError as exc:
            console.print(f"[red]inconsistent:[/red] {exc}")
            raise typer.Exit(1) from exc
        if new.size != old.size or not state.exists():
            state.write_text(note)
        console.print(f"consistent: {new.origin} at size {new.size}")
        if once:
            return
        time.sleep(every)


@app.command()
def witness(
    name: Annotated[str, typer.Option(help="the witness's key name, e.g. witness.example/w1")],
    key_file: Annotated[Path, typer.Option(help="its Ed25519 seed (created 0600 if missing)")],
    log: Annotated[list[str], typer.Option(help="a log's vkey it witnesses (repeat)")] = [],  # noqa: B006
    state: Annotated[
        Path, typer.Option(help="the JSON file of the checkpoints it cosigned")
    ] = Path("witness-state.json"),
    host: str = "127.0.0.1",
    port: int = 8100,
    print_vkey: Annotated[bool, typer.Option(help="print its vkey and exit")] = False,
) -> None:
    """Run a C2SP tlog-witness: POST /add-checkpoint cosigns checkpoints that extend the last
    one it cosigned for that log; GET /vkey gives its cosignature verifier key."""
    import uvicorn
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from app.core.ledger.notes import witness_verifier
    from app.core.storage.crypto import secret_at
    from app.witness import create_witness_app

    key = Ed25519PrivateKey.from_private_bytes(secret_at(key_file))
    if print_vkey:
        print(witness_verifier(name, key.public_key()).vkey)
        return
    if not log:
        raise CliError("name at least one --log <vkey> to witness")
    app_ = create_witness_app(name, key, [_log_verifier(v) for v in log], state)
    uvicorn.run(app_, host=host, port=port, log_level="warning")


def _log_verifier(vkey: str) -> Any:
    """A --log value as a verifier key, or a CliError that says what to pass (an
    empty LETHE_LOG_VKEY in compose crash-looped on a NoteError traceback)."""
    from app.core.ledger.notes import NoteError, Verifier

    if not vkey.strip():
        raise CliError(
            "--log is empty: pass the log's verifier key (compose: set LETHE_LOG_VKEY to what "
            "`lethe audit vkey` prints on the API's machine)"
        )
    try:
        return Verifier.parse(vkey.strip())
    except NoteError as exc:
        raise CliError(f"--log {vkey[:80]!r} is not a log's verifier key: {exc}") from exc


@audit.command("vkey")
def audit_vkey() -> None:
    """Print the log's verifier key (as GET /log/vkey serves it) from this machine's settings
    (LETHE_AUDIT_SIGNING_KEY or its file, LETHE_LOG_ORIGIN): what witnesses and policies pin."""
    from app.core.ledger.notes import log_verifier
    from app.core.ledger.transparency import signing_key
    from app.core.settings import get_settings

    settings = get_settings()
    print(log_verifier(settings.log_origin, signing_key(settings).public_key()).vkey)


@audit.command("rotate-key")
def audit_rotate_key() -> None:
    """Retire the audit signing key (its public key stays listed) and create a new one; then
    restart the API and the workers."""
    from app.core.ledger.transparency import rotate
    from app.core.settings import get_settings

    old, new = rotate(get_settings())
    console.print(f"retired {old}; new signing key {new}")


@audit.command("export")
def audit_export(out: Path, url: Url = None, key: Key = None) -> None:
    out.write_bytes(_client(url, key).export())
    console.print(f"wrote {out}; verify with: python3 scripts/verify_audit.py {out}")


@app.command()
def demo(url: Url = None, key: Key = None, epochs: int = 20) -> None:
    """Walk through the whole story against a running service, printing each step."""
    c = _client(url, key)
    try:
        _demo(c, epochs)
    except LetheError as exc:
        console.print(f"[red]demo failed:[/red] {exc}")
        raise typer.Exit(1) from exc


def _step(n: int, text: str) -> None:
    console.rule(f"[bold]{n}. {text}")


def _demo(c: Client, epochs: int) -> None:
    _step(1, "service health")
    _show(c.get("/readyz"))
    _step(2, "register scikit-learn's digits (1,797 8x8 images, seeded 80/20 split)")
    ds = c.register_builtin("digits")
    _show(ds)
    _step(3, "create an MLP (64-64) with the exact `retrain` method; train it")
    model = c.create_model(
        {
            "name": "digits-mlp",
            "dataset_id": ds.id,
            "architecture": {"type": "mlp", "hidden": [64, 64], "activation": "relu"},
            "training": {"epochs": epochs, "batch_size": 64, "learning_rate": 0.1},
            "method": {"name": "retrain"},
        }
    )
    model = train_with_progress(c, model.id, epochs)
    v1 = model.current_version
    assert v1 is not None, model.error
    console.print(f"version {v1.number}: test accuracy {v1.metrics['test_accuracy']:.4f}")
    _step(4, "download the released weights; the ETag is their sha256")
    r = c.request("GET", f"/v1/models/{model.id}/weights")
    console.print(
        f"{len(r.content)} bytes, ETag {r.headers['etag']}, sha256 ok: "
        f"{hashlib.sha256(r.content).hexdigest() == r.headers['etag'].strip(chr(34))}"
    )
    _step(5, "a data subject asks to be forgotten: delete 3 training samples")
    train_ids = [s.external_id or "" for s in c.samples(ds.id, split="train", limit=3).items]
    req = c.delete(ds.id, train_ids)
    console.print(f"request {req.id} accepted ({req.status}) for samples {train_ids}")
    with console.status("retraining without them"):
        req = c.wait_deletion(req.id)
    _show(req)
    _step(6, "the certificate in the audit log")
    cert = c.certificate(req.certificate_ids[0])
    console.print(f"[green]{getattr(cert, 'sentence', '')}[/green]")
    console.print(
        f"ε={_number(cert.epsilon)} δ={_number(cert.delta)} guarantee={cert.guarantee} "
        f"v{cert.from_version} → v{cert.to_version}"
    )
    _step(7, "version 1 was trained on erased data: its weights are gone")
    try:
        c.weights(model.id, 1)
        console.print("[red]version 1 weights still served![/red]")
    except LetheError as exc:
        console.print(f"GET version 1 weights → {exc}")
    erased = c.samples(ds.id, status="erased")
    console.print(f"erased samples in the dataset: {erased.total}")
    _step(8, "the auditor verifies the hash chain")
    _show(c.verify())


def main() -> None:
    """The `lethe` entry point: routine errors (the API's own, an unreachable service, a
    missing file or database) print one line and exit 1; `--debug` shows the traceback."""
    debug = "--debug" in sys.argv
    if debug:
        sys.argv.remove("--debug")
    try:
        app()
    except Exception as exc:  # noqa: BLE001 - classified below; anything else re-raises
        message = _routine(exc)
        if debug or message is None:
            raise
        print(f"lethe: {message}", file=sys.stderr)
        raise SystemExit(1) from None


def _number(x: float | None) -> str:
    """A certificate's ε or δ as a reader wants it: 6 significant figures (a composed ε
    comes out as 1.000000000001)."""
    return "—" if x is None else f"{x:.6g}"


def _routine(exc: BaseException) -> str | None:
    """One line for the failures a user meets in routine use, else None."""
    if isinstance(exc, CliError):
        return str(exc)
    cause = exc.__cause__ if isinstance(exc, Unreachable) else exc  # the transport's failure
    if isinstance(cause, httpx.ConnectError | httpx.ConnectTimeout):
        return f"cannot reach the service ({cause}); is `lethe serve` running? (LETHE_URL)"
    if isinstance(cause, httpx.TimeoutException):
        return f"the service did not answer in time ({cause})"
    if isinstance(exc, Unreachable):
        return f"cannot reach the service ({exc.message})"
    if isinstance(exc, LetheError):
        return f"the service answered {exc}"
    if isinstance(exc, FileNotFoundError | IsADirectoryError | PermissionError):
        return str(exc)
    if isinstance(exc, OperationalError):
        return f"cannot use the database: {_first_line(exc)}"
    return None


if __name__ == "__main__":
    main()
