"""The MLflow side of the copy: a version becomes a run in the `lethe` experiment
holding its safetensors weights as the artifact `weights/model.safetensors`, and a version of
the registered model `<prefix><model id>` made from that artifact, tagged with what Lethe
certified; the alias `current` follows Lethe's current version. A purged version's artifact
is deleted through the tracking server (its run and model version stay, tagged
`lethe.purged`, so MLflow's history matches Lethe's chain). Registering is idempotent: a
version already in MLflow (found by its `lethe.version_id` tag, after a crash between the
upload and Lethe's commit) is reused, not made twice.

MLflow is imported only here and only when configured (the optional `mlflow` extra,
`mlflow-skinny`: its client and the artifact proxy are all this needs)."""

from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ARTIFACT_DIR = "weights"
REQUEST_SECONDS = 30  # one HTTP call to MLflow (an artifact upload included) at most
ARTIFACT_FILE = "model.safetensors"
ALIAS = "current"
VERSION_TAG = "lethe.version_id"


@dataclass(frozen=True)
class VersionCopy:
    """What MLflow gets of one Lethe version: its weights, its tags and whether it is the
    model's current version (then the alias moves to it)."""

    version_id: int
    model_id: int
    model_name: str
    number: int
    weights: bytes
    tags: dict[str, str]
    current: bool


@dataclass(frozen=True)
class Registered:
    """Where a version sits in MLflow."""

    registered_model: str
    mlflow_version: str
    run_id: str
    artifact_uri: str


class MlflowRegistry:
    """A client of one MLflow tracking server and registry (the same URI)."""

    def __init__(self, tracking_uri: str, experiment: str, prefix: str) -> None:
        # MLflow's client retries a refused call 7 times with back-off inside one call (about
        # a minute, 120 s per request): an outage then looked like a pending copy with no
        # attempt and no error. Lethe retries itself, counted, with its own back-off
        # (sync.failed); an operator's own settings of these win.
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
        os.environ.setdefault("MLFLOW_HTTP_REQUEST_TIMEOUT", str(REQUEST_SECONDS))
        from mlflow.tracking import MlflowClient  # the optional extra, imported when used

        self.uri, self.experiment, self.prefix = tracking_uri, experiment, prefix
        self.client = MlflowClient(tracking_uri=tracking_uri, registry_uri=tracking_uri)
        self._experiment_id: str | None = None

    def name_of(self, model_id: int) -> str:
        return f"{self.prefix}{model_id}"

    def register(self, copy: VersionCopy) -> Registered:
        """Upload `copy`'s weights and make its model version (or find the one a previous
        attempt made), and move the alias `current` to it when it is Lethe's current one."""
        name = self.name_of(copy.model_id)
        self._ensure_model(name, copy)
        found = self.find(copy.model_id, copy.version_id)
        if found is None:
            run = self.client.create_run(
                self._experiment(), tags=copy.tags, run_name=f"{name}-v{copy.number}"
            )
            with tempfile.TemporaryDirectory(prefix="lethe-mlflow-") as scratch:
                path = Path(scratch) / ARTIFACT_FILE
                path.write_bytes(copy.weights)
                self.client.log_artifact(run.info.run_id, str(path), ARTIFACT_DIR)
            made = self.client.create_model_version(
                name,
                f"{run.info.artifact_uri}/{ARTIFACT_DIR}",
                run.info.run_id,
                tags=copy.tags,
                description=f"Lethe model {copy.model_id} ({copy.model_name}), "
                f"version {copy.number}",
                await_creation_for=0,  # the open-source registry makes it READY at once
            )
            self.client.set_terminated(run.info.run_id)
            found = Registered(name, str(made.version), run.info.run_id, run.info.artifact_uri)
        if copy.current:
            self.client.set_registered_model_alias(name, ALIAS, found.mlflow_version)
        return found

    def find(self, model_id: int, version_id: int) -> Registered | None:
        """The MLflow version made for Lethe's version `version_id`, if any."""
        name = self.name_of(model_id)
        hits = self.client.search_model_versions(
            f"name='{name}' and tags.`{VERSION_TAG}`='{version_id}'"
        )
        if not hits:
            return None
        hit = hits[0]
        run_id = str(hit.run_id)
        return Registered(
            name, str(hit.version), run_id, self.client.get_run(run_id).info.artifact_uri
        )

    def purge(self, where: Registered, purged_at: str) -> None:
        """Delete the version's weights from MLflow's artifact store (through the tracking
        server) and tag the model version and run as purged."""
        from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

        repo = get_artifact_repository(where.artifact_uri, tracking_uri=self.uri)
        if repo.list_artifacts(ARTIFACT_DIR):
            repo.delete_artifacts(ARTIFACT_DIR)
        self.client.set_model_version_tag(
            where.registered_model, where.mlflow_version, "lethe.purged", purged_at
        )
        self.client.set_tag(where.run_id, "lethe.purged", purged_at)

    def _ensure_model(self, name: str, copy: VersionCopy) -> None:
        from mlflow.exceptions import MlflowException

        try:
            self.client.create_registered_model(
                name,
                tags={"lethe.model_id": str(copy.model_id)},
                description=f"Lethe model {copy.model_id} ({copy.model_name}): every version "
                "Lethe publishes, certified unlearning included; purged versions keep their "
                "tags and lose their weights.",
            )
        except MlflowException as exc:
            if exc.error_code != "RESOURCE_ALREADY_EXISTS":
                raise

    def _experiment(self) -> str:
        if self._experiment_id is None:
            found: Any = self.client.get_experiment_by_name(self.experiment)
            if found is None:
                try:
                    self._experiment_id = self.client.create_experiment(self.experiment)
                    return self._experiment_id
                except Exception:  # another API process made it first
                    found = self.client.get_experiment_by_name(self.experiment)
                    if found is None:
                        raise
            self._experiment_id = str(found.experiment_id)
        return self._experiment_id
