"""The one interface every unlearning method implements (DESIGN §7), and the values that
cross it: a method reads `UpdateInputs` and returns an immutable `Release`; it never touches
the database."""

from __future__ import annotations

import importlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal, Protocol, TypeVar

import torch

from app.core import shutdown
from app.core.jsontypes import JsonMap, JsonObject
from app.core.specs import ArchitectureSpec, PrivacyPolicy, TrainingConfig
from app.core.states import Guarantee, VersionKind
from app.privacy.lineage import LineageEvent
from maths.training import ProgressFn, train
from methods.shards import IN_PROCESS, ShardRunner, ShardTask, TakeFn
from methods.spec import MethodChoice, MethodSpec

ModelState = dict[str, torch.Tensor]


@dataclass(frozen=True)
class PrivacyTarget:
    epsilon: float
    delta: float


DEFAULT_TARGET = PrivacyTarget(PrivacyPolicy().epsilon, PrivacyPolicy().delta)


@dataclass(frozen=True)
class ModelSpec:
    """What a method needs to know about the model it serves."""

    architecture: ArchitectureSpec
    training: TrainingConfig
    method: MethodChoice  # the model's configured method (its training recipe)
    n_features: int
    n_classes: int
    vocabulary: tuple[str, ...] | None = None  # a text corpus's words, in feature order
    # The policy's per-release target: what a release made without a request (training's
    # noised topic model) is calibrated for, as every later release is by default.
    target: PrivacyTarget = DEFAULT_TARGET

    @property
    def aggregation(self) -> str:
        """How an ensemble's members vote (the method's hook); a single model ignores it."""
        return self.method.aggregation


Rows = tuple[list[int], torch.Tensor, torch.Tensor, list[str | None], list[str]]
"""A set of samples: ids, features, labels, subjects and external ids, row by row."""


class RowSource(Protocol):
    """Retained rows kept elsewhere (a resident session), drawn only when used."""

    def rows(self) -> Rows: ...

    def blocks(self, size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]: ...

    def head(self, count: int) -> tuple[torch.Tensor, torch.Tensor]: ...

    def ids(self) -> torch.Tensor: ...

    def take(self, at: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]: ...

    @property
    def device(self) -> torch.device: ...


def same_device(a: torch.device, b: torch.device) -> bool:
    """`cuda` and `cuda:0` are one device when no index tells them apart."""
    return a.type == b.type and (a.index is None or b.index is None or a.index == b.index)


class RetainedData:
    """Samples as tensors, rows in `sample_ids` order, with what the data says of each: its
    subject and its external id (the upload's `ids`, or its row number in the file).

    Given as arrays, or `deferred` to a resident session: then nothing is copied until a
    field is read, and a method that needs only the count, the first rows or blocks of rows
    (convex_head's removal) never copies the retained set."""

    def __init__(
        self,
        sample_ids: list[int],
        X: torch.Tensor,
        y: torch.Tensor,
        subjects: list[str | None] | None = None,
        external_ids: list[str] | None = None,
    ) -> None:
        self._count = len(y)
        self._source: RowSource | None = None
        self._rows: Rows | None = (  # the lists as given: no copy (a test split is long)
            sample_ids,
            X,
            y,
            subjects if subjects is not None else [],
            external_ids if external_ids is not None else [],
        )

    @classmethod
    def deferred(cls, count: int, source: RowSource) -> RetainedData:
        data = cls.__new__(cls)
        data._count, data._source, data._rows = count, source, None
        return data

    def _all(self) -> Rows:
        if self._rows is None:
            assert self._source is not None
            self._rows = self._source.rows()
        return self._rows

    @property
    def sample_ids(self) -> list[int]:
        if self._rows is None and self._source is not None:  # the ids only, not the rows
            return self._source.ids().tolist()
        return self._all()[0]

    @property
    def X(self) -> torch.Tensor:
        return self._all()[1]

    @property
    def y(self) -> torch.Tensor:
        return self._all()[2]

    @property
    def subjects(self) -> list[str | None]:
        return self._all()[3]

    @property
    def external_ids(self) -> list[str]:
        return self._all()[4]

    def __len__(self) -> int:
        return self._count

    def blocks(self, size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """(X, y) in consecutive blocks of at most `size` rows, in row order."""
        if self._rows is None and self._source is not None:
            yield from self._source.blocks(size)
            return
        _, X, y, _, _ = self._all()
        for start in range(0, self._count, size):
            yield X[start : start + size], y[start : start + size]

    def head(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(X, y) of the first `count` rows."""
        if self._rows is None and self._source is not None:
            return self._source.head(count)
        _, X, y, _, _ = self._all()
        return X[:count], y[:count]

    def ids(self) -> torch.Tensor:
        """The sample ids as an int64 CPU tensor, without drawing the rows themselves."""
        if self._rows is None and self._source is not None:
            return self._source.ids()
        return torch.as_tensor(self._all()[0], dtype=torch.int64, device="cpu")

    def take(self, at: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(X, y) of the rows at positions `at` (row order), copying only those rows."""
        if self._rows is None and self._source is not None:
            return self._source.take(at)
        _, X, y, _, _ = self._all()
        return X[at.to(X.device)], y[at.to(y.device)]

    def to(self, device: torch.device) -> RetainedData:
        """The same rows with their tensors on `device` (deferred rows stay deferred when their
        session lives there: a worker keeps its sessions on its own device)."""
        if (
            self._rows is None
            and self._source is not None
            and same_device(self._source.device, device)
        ):
            return self
        ids, X, y, subjects, external_ids = self._all()
        return RetainedData(ids, X.to(device), y.to(device), subjects, external_ids)


class Joined:
    """Two sets of rows as one (a RowSource): a model's retained rows, then the rows an
    append adds, neither copied until a method reads them whole."""

    def __init__(self, first: RetainedData, second: RetainedData) -> None:
        self.first, self.second = first, second

    def rows(self) -> Rows:
        a, b = self.first, self.second
        return (
            [*a.sample_ids, *b.sample_ids],
            torch.cat([a.X, b.X.to(a.X)]),
            torch.cat([a.y, b.y.to(a.y.device)]),
            [*a.subjects, *b.subjects],
            [*a.external_ids, *b.external_ids],
        )

    def blocks(self, size: int) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        yield from self.first.blocks(size)
        device = self.device
        for X, y in self.second.blocks(size):
            yield X.to(device), y.to(device)

    def head(self, count: int) -> tuple[torch.Tensor, torch.Tensor]:
        X, y = self.first.head(count)
        if len(y) >= count or not len(self.second):
            return X, y
        X2, y2 = self.second.head(count - len(y))
        return torch.cat([X, X2.to(X)]), torch.cat([y, y2.to(y.device)])

    def ids(self) -> torch.Tensor:
        return torch.cat([self.first.ids(), self.second.ids()])

    def take(self, at: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The rows at positions `at`, in that order (any order, repeats allowed)."""
        n = len(self.first)
        at = at.cpu()
        mine = at < n
        X1, y1 = self.first.take(at[mine])
        X2, y2 = self.second.take(at[~mine] - n)
        X = torch.empty((len(at), *X1.shape[1:]), dtype=X1.dtype, device=X1.device)
        y = torch.empty(len(at), dtype=y1.dtype, device=y1.device)
        X[mine.to(X.device)], y[mine.to(y.device)] = X1, y1
        X[(~mine).to(X.device)], y[(~mine).to(y.device)] = X2.to(X), y2.to(y)
        return X, y

    @property
    def device(self) -> torch.device:
        X, _ = self.first.head(1)
        return X.device


def joined(first: RetainedData, second: RetainedData) -> RetainedData:
    """`first`'s rows then `second`'s, deferred: nothing is copied until read whole."""
    return RetainedData.deferred(len(first) + len(second), Joined(first, second))


@dataclass(frozen=True)
class RemovedSamples:
    sample_ids: list[int]
    X: torch.Tensor
    y: torch.Tensor
    statistics: dict[int, torch.Tensor] = field(default_factory=dict)  # sample id -> vector
    previously_removed: list[int] = field(default_factory=list)  # since the record was made


@dataclass(frozen=True)
class UpdateInputs:
    """Everything one coalesced update needs, read in one short transaction (DESIGN §6)."""

    model_id: int
    spec: ModelSpec
    method: MethodChoice  # the method to apply: the model's, or `retrain` when asked for
    policy: PrivacyPolicy
    target: PrivacyTarget
    state: ModelState  # the current noise-free state
    removed: RemovedSamples
    retained: RetainedData
    test: RetainedData
    history: list[LineageEvent]  # noisy releases since the last exact retrain
    record: JsonMap | None = None  # what training recorded for the statistics in use
    # What this method kept in the worker after the model's last update (its release's
    # `resident`), when the worker's session is at the current version; else None.
    resident: object | None = None
    # Rows appended since the last version: already in `retained` (after its
    # earlier rows); a method that does not `learn` them is answered by the exact retrain.
    added: RetainedData | None = None
    # What a method whose σ is measured on the rows calibrates it on, instead of `record`
    # (`noise_from_rows`): a privacy audit's reference trained without the canaries.
    # None: the model's own record.
    noise_record: JsonMap | None = None
    # The norm of the model's last noise-free version's weights (trained, imported or an exact
    # release), which anyone may download: the utility floor's scale. None: not known.
    public_norm: float | None = None
    # Where a sharded method runs its shards: across the worker pool in distributed mode
    # (workers/shards.py); None: here.
    shards: ShardRunner | None = None

    @property
    def n_added(self) -> int:
        return len(self.added) if self.added is not None else 0


def these_samples(n: int) -> str:
    """How a certificate's sentence names the removed rows: "this sample" or "these n
    samples" ("these 1 samples")."""
    return "this sample" if n == 1 else f"these {n} samples"


@dataclass(frozen=True)
class StatisticsBlock:
    """Per-sample (or per-subject) vectors to store; row i belongs to `sample_ids[i]`."""

    kind: str
    sample_ids: list[int]
    kinds: list[str]
    vectors: torch.Tensor
    dtype: str = "float32"


@dataclass(frozen=True)
class Trained:
    """What training produced: the state, per-sample statistics and the training record."""

    state: ModelState
    statistics: StatisticsBlock | None
    record: JsonMap
    metrics: JsonMap = field(default_factory=dict)
    # Method state kept beside the parameters in the noise-free state (never downloadable,
    # purged with its version): minnorm's Gram inverse. Keys never collide with a layer's.
    extra_state: ModelState = field(default_factory=dict)
    # The method's resident state for `state` on the rows trained on, where solving made it
    # on the way (convex_head's anchor: its Newton polish needs one); None: `prepare` makes it.
    resident: object | None = None

    @property
    def next_state(self) -> ModelState:
        return {**self.state, **self.extra_state}


@dataclass(frozen=True)
class Constant:
    """A number a certificate relies on, and whether it was measured or declared."""

    value: float
    source: Literal["measured", "declared"]
    meaning: str
    # "auditors": a function of the removed data (convex_head's s): the log's body carries a
    # salted commitment and `public` (what the decision needs) instead of the value.
    disclosure: Literal["public", "auditors"] = "public"
    public: str | None = None


class TargetInfeasible(RuntimeError):
    """The method cannot meet the target; the pipeline retrains exactly instead. Unless it is
    a `PublicInfeasible`, the reason is taken to depend on the removed rows: a method that
    can (`through_mechanism`) then releases the retrain through its own mechanism."""


class PublicInfeasible(TargetInfeasible):
    """The target cannot be met for a reason that is a function of public values only (the
    options, the target, the counts of removed rows, the public lineage): the exact retrain
    it leads to, noise-free and resetting the lineage, reveals nothing of which rows left."""


@dataclass(frozen=True)
class CertificateFields:
    """A method's own statement about its release; the pipeline adds the lineage."""

    guarantee: Guarantee
    epsilon: float | None  # None: a heuristic (guarantee `none`) makes no claim
    delta: float | None
    sigma: float
    sensitivity: float
    accountant: str
    sentence: str
    constants: dict[str, Constant] = field(default_factory=dict)
    compares: str = "the released model vs. retraining without the removed samples"
    resets_lineage: bool = False
    details: JsonMap | None = None  # method-specific facts, kept in the certificate


@dataclass(frozen=True)
class Release:
    """One update's result, never patched afterwards."""

    next_state: ModelState  # noise-free; starts the next update; never downloadable
    weights: ModelState  # what users download
    certificate: CertificateFields
    event: LineageEvent | None  # the release as a lineage event; None: no noise (exact)
    statistics_to_delete: list[int]  # sample ids whose per-sample rows this update consumed
    version_kind: VersionKind = VersionKind.unlearned
    metrics: JsonMap = field(default_factory=dict)
    replace_statistics: StatisticsBlock | None = None  # a retrain re-records everything
    record: JsonMap | None = None  # the new training record, if statistics changed
    # What the method keeps in the worker for the model's next update: valid for
    # `next_state` on the retained rows; kept only once the release commits.
    resident: object | None = None


class UnlearningMethod:
    """Base of every compute half. Subclasses set `spec` (the app half), implement `unlearn`,
    and may override `train` (to record or constrain training) and `reference` (what an
    evaluation compares a release with)."""

    spec: ClassVar[MethodSpec[Any]]
    # Whether `unlearn` also learns `inputs.added` with its own update;
    # else an update that adds rows is the exact retrain on the new set, declared as such.
    learns: ClassVar[bool] = False
    # Whether σ is calibrated on constants measured on the training rows (recollection's ρ):
    # a privacy audit then calibrates it on a reference trained without the canaries
    # (`UpdateInputs.noise_record`), as the certificate's reference would.
    noise_from_rows: ClassVar[bool] = False

    def __init__(self, model: ModelSpec, shards: ShardRunner | None = None) -> None:
        self.model = model
        self.shards: ShardRunner = shards or IN_PROCESS  # where a sharded method's shards run

    def unlearn(self, inputs: UpdateInputs) -> Release:
        raise NotImplementedError

    def calibrated_sigma(self, inputs: UpdateInputs) -> float | None:
        """The σ an update of `inputs` would draw, for a method with `noise_from_rows` (an
        audit reports it on its reference and on its shadow); None where σ is public or the
        update cannot be calibrated."""
        return None

    def through_mechanism(self, inputs: UpdateInputs, exact: Release) -> Release | None:
        """The exact retrain `exact` released through this method's own mechanism, with the
        certificate its releases carry: when the method could not release for a
        reason that depends on the removed rows, the published output is then distributed
        as the reference its certificate compares with (the retrain through the mechanism),
        so it does not reveal the branch. None (the default): the method cannot, and its
        fallback is the public exact retrain."""
        return None

    def prepare(self, data: RetainedData, state: ModelState) -> object | None:
        """What the method keeps resident for the model's first update, made after training
        and before the version commits (UpdateInputs.resident); None: nothing (the default)."""
        return None

    def export_resident(self, resident: object) -> dict[str, torch.Tensor] | None:
        """`prepare`'s resident state as tensors, rows left out, for the process that replaces
        this one after an erasure (workers/recycle.py); None: the successor prepares anew."""
        return None

    def import_resident(
        self, tensors: dict[str, torch.Tensor], data: RetainedData, state: ModelState
    ) -> object | None:
        """`export_resident`'s tensors as the resident state of `state` on `data`, or None
        when they describe another state (the successor then prepares anew)."""
        return None

    def run_shard_task(self, task: ShardTask, take: TakeFn) -> list[ModelState]:
        """A shard task of this method's, on the rows `take` draws (a helper worker runs one
        another worker's update handed it: workers/shards.py). Only a sharded method has them."""
        raise NotImplementedError(f"{self.spec.name} has no shard tasks")

    def projection_radius(self) -> float | None:
        """The ball ‖w‖ ≤ C that training projects onto after every step (None: none)."""
        return None

    def train(self, data: RetainedData, progress: ProgressFn | None = None) -> Trained:
        """Seeded SGD (projected when `projection_radius` says so); methods that record
        during training override this."""
        start = time.perf_counter()
        radius = self.projection_radius()
        m = self.model
        state = train(
            m.architecture,
            m.training,
            data.X,
            data.y,
            m.n_classes,
            progress,
            project_radius=radius,
            interrupt=shutdown.check,
            row_order=canonical_order(data),
        )
        metrics: JsonObject = {
            "train_seconds": time.perf_counter() - start,
            "n_train": len(data.y),
        }
        if radius is not None:
            metrics["projection_radius"] = radius
        return Trained(state=state, statistics=None, record={}, metrics=metrics)

    def retrain(self, inputs: UpdateInputs) -> tuple[Trained, str]:
        """The exact retrain on the retained data, and how it was made (for the certificate):
        by default training from scratch with the same configuration and seed."""
        return self.train(inputs.retained), "retrained from scratch"

    def reference(self, inputs: UpdateInputs, release: Release) -> ModelState:
        """The retrained model an evaluation compares the release with: seeded retraining
        on the retained data."""
        m = self.model
        retained = inputs.retained
        return train(
            m.architecture,
            m.training,
            retained.X,
            retained.y,
            m.n_classes,
            interrupt=shutdown.check,
            row_order=canonical_order(retained),
        )


def canonical_order(data: RetainedData) -> torch.Tensor | None:
    """The rows' positions sorted by their external ids: one order for one set of rows,
    whatever order they arrived in (sample ids follow arrival: registrations, appends and
    deletions reorder them), so that an exact retrain is the same bits for the same rows.
    None where the ids are not known for every row (the order as given)."""
    ids = data.external_ids
    if len(ids) != len(data) or not all(ids):
        return None
    order = sorted(range(len(ids)), key=ids.__getitem__)
    return torch.tensor(order, dtype=torch.int64, device="cpu")  # the shuffles are on the CPU


def canonical_rank(data: RetainedData) -> torch.Tensor | None:
    """Each row's place in `canonical_order` (its inverse), None where that is None."""
    order = canonical_order(data)
    if order is None:
        return None
    rank = torch.empty_like(order)
    rank[order] = torch.arange(len(order), dtype=order.dtype)
    return rank


M = TypeVar("M", bound=type[UnlearningMethod])

_COMPUTE: dict[str, type[UnlearningMethod]] = {}


def register(cls: M) -> M:
    """Class decorator: make `cls` the compute half of the method its spec names."""
    name = cls.spec.name
    if name in _COMPUTE:
        raise ValueError(f"compute for {name!r} is registered twice")
    _COMPUTE[name] = cls
    return cls


def compute_class(name: str) -> type[UnlearningMethod]:
    """The compute half of the method `name`: `methods/<name>/compute.py`, imported on first
    use (so a process that never computes never imports torch through the registry)."""
    if name not in _COMPUTE:
        importlib.import_module(f"methods.{name}.compute")
    return _COMPUTE[name]


def method_for(name: str, model: ModelSpec, shards: ShardRunner | None = None) -> UnlearningMethod:
    """The named method's compute half, bound to a model (`shards`: where a sharded method
    runs its shards; None: here)."""
    return compute_class(name)(model, shards)


def fit(
    model: ModelSpec,
    data: RetainedData,
    progress: ProgressFn | None = None,
    shards: ShardRunner | None = None,
) -> Trained:
    """Train as the model's method requires (recording or constraining where it must)."""
    return method_for(model.method.name, model, shards).train(data, progress)
