"""sharded_retrain on in-memory inputs: the seeded, stable assignment; an
update equals training from scratch on the retained data bit for bit; only the affected
shards and checkpoints change; the ensemble's aggregation; the loader; the refusals."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch
from safetensors.torch import save as st_save

from app.core.errors import APIError
from app.core.specs import LogRegSpec, TrainingConfig, architecture_of
from app.core.states import Guarantee
from lethe.loader import load_model
from maths.ensemble import Ensemble, count_shards, linear_scorer, shard_prefix, shard_states
from maths.training import logits
from methods import method_of
from methods.compute import (
    ModelSpec,
    RetainedData,
    UpdateInputs,
    fit,
    method_for,
)
from methods.sharded_retrain import maths as sh
from methods.sharded_retrain.spec import expected_work_fraction
from methods.shards import ShardTask, decode_states, encode_states
from tests.support.factories import split_off, update_inputs
from workers.updates import compute

N, P, K = 240, 6, 3
TRAINING = TrainingConfig(epochs=4, batch_size=16, learning_rate=0.1, momentum=0.5, seed=7)
ARCH = {"type": "mlp", "hidden": [8]}


def data() -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    centers = torch.randn(K, P, generator=gen) * 2
    y = torch.arange(N) % K
    return centers[y] + torch.randn(N, P, generator=gen), y


IDS = list(range(1000, 1000 + N))
SUBJECTS: list[str | None] = [f"person{i % 40}" if i % 2 else None for i in range(N)]


def spec(shards: int = 4, slices: int = 3, aggregation: str = "probabilities") -> ModelSpec:
    method = method_of(
        {"name": "sharded_retrain", "shards": shards, "slices": slices, "aggregation": aggregation}
    )
    return ModelSpec(architecture_of(ARCH), TRAINING, method, P, K)


def subset(keep: list[int]) -> RetainedData:
    X, y = data()
    rows = torch.tensor([IDS.index(s) for s in keep])
    return RetainedData(keep, X[rows], y[rows], [SUBJECTS[IDS.index(s)] for s in keep])


def removal(model: ModelSpec, state: dict[str, torch.Tensor], gone: list[int]) -> UpdateInputs:
    removed, retained = split_off(subset(IDS), gone)
    return update_inputs(model, state, removed, retained, test=subset(IDS[:30]))


def identical(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> bool:
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.fixture(scope="module")
def trained():
    model = spec()
    return model, fit(model, subset(IDS))


# ---- the assignment ------------------------------------------------------------------------


def keys(ids: list[int]) -> list[str]:
    """The assignment keys of these samples as training draws them (subject, else content)."""
    data = subset(ids)
    return sh.assignment_keys(data.X, data.y, data.subjects, data.external_ids)


def test_assignment_is_seeded_stable_and_keeps_a_subject_together() -> None:
    full = sh.Assignment.draw(IDS, keys(IDS), 4, 3, seed=7)
    place = full.place()
    half = sh.Assignment.draw(IDS[::2], keys(IDS[::2]), 4, 3, seed=7)
    assert all(place[s] == where for s, where in half.place().items())  # nobody moves
    by_subject: dict[str, set[tuple[int, int]]] = {}
    for s, subject in zip(IDS, SUBJECTS, strict=True):
        if subject is not None:
            by_subject.setdefault(subject, set()).add(place[s])
    assert all(len(places) == 1 for places in by_subject.values())
    other = sh.Assignment.draw(IDS, keys(IDS), 4, 3, seed=8)
    assert not torch.equal(other.shard, full.shard)  # the seed matters
    counts = torch.bincount(full.shard, minlength=4)
    assert int(counts.min()) > N / 4 / 2  # no shard starved


def test_training_records_the_assignment_and_every_checkpoint(trained) -> None:
    model, result = trained
    assert count_shards(result.state) == 4 and not any(k.startswith("sisa.") for k in result.state)
    recorded = sh.Assignment.from_state(result.extra_state)
    assert recorded == sh.Assignment.draw(IDS, keys(IDS), 4, 3, seed=TRAINING.seed)
    stored = {k: v for k, v in result.extra_state.items() if k.startswith("sisa.assignment.")}
    assert stored[sh.ASSIGNMENT_SHARD].dtype == stored[sh.ASSIGNMENT_SLICE].dtype == torch.uint8
    wide = {k: v.long() for k, v in stored.items()}  # states stored before it was narrowed
    assert sh.Assignment.from_state(wide) == recorded
    for k in range(4):
        for j in (1, 2):
            assert any(n.startswith(sh.checkpoint_prefix(k, j)) for n in result.extra_state)
        assert not any(n.startswith(sh.checkpoint_prefix(k, 3)) for n in result.extra_state)
    summary = result.metrics["sisa"]
    assert summary["checkpoints"] == 8 and sum(summary["shard_sizes"]) == N
    assert 0 < summary["expected_work_fraction"] < 1 / 4 + 0.05


def test_training_reports_progress_in_epochs_of_work() -> None:
    """ "epoch k of E" as for one model: monotone, ending at E of E, one call per stage."""
    calls: list[tuple[int, int]] = []
    fit(spec(), subset(IDS), lambda epoch, epochs, _loss: calls.append((epoch, epochs)))
    assert len(calls) == 4 * 3 and all(total == TRAINING.epochs for _, total in calls)
    done = [epoch for epoch, _ in calls]
    assert done == sorted(done) and done[-1] == TRAINING.epochs and done[0] < TRAINING.epochs


# ---- exactness -----------------------------------------------------------------------------


def test_an_update_is_training_from_scratch_on_the_retained_data_bit_for_bit(trained) -> None:
    model, result = trained
    gone = [IDS[5], IDS[17], IDS[100]]
    release = method_for("sharded_retrain", model).unlearn(removal(model, result.next_state, gone))
    scratch = fit(model, subset([s for s in IDS if s not in gone]))
    assert identical(release.weights, scratch.state)
    assert identical(release.next_state, scratch.next_state)  # checkpoints and assignment too
    assert release.certificate.guarantee == Guarantee.exact
    assert release.certificate.epsilon == 0.0 and release.certificate.delta == 0.0


def test_only_the_affected_shards_and_later_checkpoints_change(trained) -> None:
    model, result = trained
    place = sh.Assignment.from_state(result.extra_state).place()
    late = next(s for s in IDS if place[s][1] == 2 and SUBJECTS[IDS.index(s)] is None)
    shard = place[late][0]
    release = method_for("sharded_retrain", model).unlearn(
        removal(model, result.next_state, [late])
    )
    before, after = shard_states(result.state, 4), shard_states(release.weights, 4)
    for k in range(4):
        assert identical(before[k], after[k]) == (k != shard)
    for k in range(4):  # the last slice only: both checkpoints predate it and are kept
        for j in (1, 2):
            prefix = sh.checkpoint_prefix(k, j)
            old = {n: v for n, v in result.next_state.items() if n.startswith(prefix)}
            new = {n: v for n, v in release.next_state.items() if n.startswith(prefix)}
            assert identical(old, new)
    details = release.certificate.details["sharding"]
    assert details["retrained"] == [{"shard": shard, "from_slice": 3, "removed": 1}]
    assert details["reused_shards"] == [k for k in range(4) if k != shard]
    assert 0 < details["work_fraction"] < 1 / 4


def test_a_subject_deletion_retrains_one_shard_from_its_slice(trained) -> None:
    model, result = trained
    place = sh.Assignment.from_state(result.extra_state).place()
    person = [s for s, who in zip(IDS, SUBJECTS, strict=True) if who == "person1"]
    (shard, slice_), *_ = {place[s] for s in person}
    release = method_for("sharded_retrain", model).unlearn(
        removal(model, result.next_state, person)
    )
    details = release.certificate.details["sharding"]
    assert details["retrained"] == [
        {"shard": shard, "from_slice": slice_ + 1, "removed": len(person)}
    ]
    for j in range(slice_ + 1, 3):  # the checkpoints that saw the subject were replaced
        prefix = sh.checkpoint_prefix(shard, j)
        old = {n: v for n, v in result.next_state.items() if n.startswith(prefix)}
        new = {n: v for n, v in release.next_state.items() if n.startswith(prefix)}
        assert not identical(old, new)
    assert release.next_state[sh.ASSIGNMENT_IDS].tolist() == [s for s in IDS if s not in person]


def test_coalesced_removals_share_one_retrain_per_shard(trained) -> None:
    model, result = trained
    place = sh.Assignment.from_state(result.extra_state).place()
    in_zero = [s for s in IDS if place[s][0] == 0][:5]
    release = method_for("sharded_retrain", model).unlearn(
        removal(model, result.next_state, in_zero)
    )
    details = release.certificate.details["sharding"]
    assert [r["shard"] for r in details["retrained"]] == [0]
    assert details["retrained"][0]["from_slice"] == min(place[s][1] for s in in_zero) + 1


def test_the_retrain_flag_gives_the_same_ensemble(trained) -> None:
    """A full retrain of every shard and the partial one are both exact: the same bits."""
    model, result = trained
    inputs = removal(model, result.next_state, [IDS[3], IDS[50]])
    partial = method_for("sharded_retrain", model).unlearn(inputs)
    full = compute(replace(inputs, method=method_of({"name": "retrain"}))).decision.release
    assert identical(partial.weights, full.weights)
    assert identical(partial.next_state, full.next_state)


def test_sequential_updates_equal_one_from_scratch(trained) -> None:
    model, result = trained
    state = result.next_state
    gone: list[int] = []
    for batch in ([IDS[1]], [IDS[60], IDS[61]], [IDS[200]]):
        gone += batch
        inputs = removal(model, state, batch)
        inputs = replace(inputs, retained=subset([s for s in IDS if s not in gone]))
        state = method_for("sharded_retrain", model).unlearn(inputs).next_state
    assert identical(state, fit(model, subset([s for s in IDS if s not in gone])).next_state)


# ---- the ensemble --------------------------------------------------------------------------


def test_aggregations() -> None:
    class Fixed(torch.nn.Module):
        def __init__(self, row: list[float]) -> None:
            super().__init__()
            self.row = torch.tensor([row]).log()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.row.expand(len(x), -1)

    members = [Fixed([0.6, 0.4, 0.0]), Fixed([0.6, 0.4, 0.0]), Fixed([0.0, 0.1, 0.9])]
    x = torch.zeros(2, 1)
    averaged = Ensemble(members, "probabilities")(x).exp()
    assert torch.allclose(averaged[0], torch.tensor([0.4, 0.3, 0.3]))
    voted = Ensemble(members, "vote")(x).exp()
    assert torch.allclose(voted.sum(1), torch.ones(2)) and voted[0].argmax() == 0
    tie = Ensemble([Fixed([0.9, 0.1, 0.0]), Fixed([0.0, 0.45, 0.55])], "vote")(x)
    assert tie[0].argmax() == 0  # one vote each: the averaged probability (0.45 > 0.325) wins
    with pytest.raises(ValueError, match="aggregation"):
        Ensemble(members, "median")


@pytest.mark.parametrize(
    "architecture",
    [{"type": "logreg"}, {"type": "logreg", "feature_norm": 2.0}, {"type": "mlp", "hidden": [6]}],
)
@pytest.mark.parametrize("aggregation", ["probabilities", "vote"])
def test_linear_members_are_scored_in_one_product_with_each_members_numbers(
    architecture: dict, aggregation: str
) -> None:
    """The ensemble gives what each member's own forward gives, and a logreg ensemble scored
    from its weights in one matrix product (flatten or clip, then one linear layer) too."""
    from maths.nets import build_net

    torch.manual_seed(3)
    members = [build_net(architecture_of(architecture), 12, 3) for _ in range(5)]
    x = torch.randn(40, 3, 4)
    ensemble = Ensemble(members, aggregation).train(False)
    with torch.no_grad():
        probs = torch.stack([m(x).softmax(-1) for m in members])
        mean = probs.mean(0)
        if aggregation == "probabilities":
            want = mean.log()
        else:
            votes = torch.nn.functional.one_hot(probs.argmax(-1), 3).sum(0).float()
            want = ((votes + mean) / 6).log()
        assert torch.allclose(ensemble(x), want, atol=1e-6)
        if architecture["type"] == "logreg":  # and from the released weights, no modules
            weights = {
                f"shard{k}.{name}": v
                for k, m in enumerate(members)
                for name, v in m.state_dict().items()
            }
            arch = architecture_of(architecture)
            assert isinstance(arch, LogRegSpec)
            score = linear_scorer(arch, weights, aggregation, torch.device("cpu"))
            assert torch.allclose(score(x), want, atol=1e-6)


def test_the_loader_rebuilds_the_ensemble(trained) -> None:
    model, result = trained
    X, _ = data()
    metadata = {
        "format": "lethe/1",
        "version": "1",
        "architecture": '{"type": "mlp", "hidden": [8]}',
        "n_features": str(P),
        "n_classes": str(K),
        "shards": "4",
        "aggregation": "vote",
    }
    loaded = load_model(st_save(result.state, metadata=metadata))
    assert isinstance(loaded.module, Ensemble) and len(loaded.module.members) == 4
    expected = logits(model.architecture, result.state, X, K, "vote")
    assert torch.equal(loaded.module(X), expected)


# ---- choosing and refusing -----------------------------------------------------------------


def test_expected_work_matches_the_balanced_formula() -> None:
    assert expected_work_fraction(1, 1) == 1.0
    assert expected_work_fraction(4, 1) == 0.25
    assert expected_work_fraction(1, 4) == pytest.approx(0.75)
    ids = list(range(20_000))
    assignment = sh.Assignment.draw(ids, [f"id:{i}" for i in ids], 4, 4, seed=0)
    setup = sh.ShardedSetup(architecture_of(ARCH), TRAINING, P, K, 4, 4)
    from methods.sharded_retrain.compute import _summary

    sizes = sh.stage_sizes(assignment, 4, 4)
    measured = _summary(setup, assignment, sizes)["expected_work_fraction"]
    assert measured == pytest.approx(expected_work_fraction(4, 4), rel=0.03)


@pytest.mark.parametrize(
    ("options", "arch", "n", "code"),
    [
        ({}, {"type": "topic_model"}, 1000, "sharding_needs_network"),
        ({"shards": 16, "slices": 8}, {"type": "logreg"}, 100, "too_few_samples_for_shards"),
    ],
)
def test_refusals(options: dict, arch: dict, n: int, code: str) -> None:
    choice = method_of({"name": "sharded_retrain", **options})
    with pytest.raises(APIError) as caught:
        choice.check_model(architecture_of(arch), n, 64)
    assert caught.value.code == code


def test_an_update_finds_each_shards_weights_and_checkpoints_by_prefix() -> None:
    """The state is split by prefix in one pass (`_parts`): every shard's weights and every
    checkpoint's tensors under its own prefix, two-digit shards and stages included, the
    assignment in none."""
    from methods.sharded_retrain.compute import _parts

    shards, slices = 12, 11
    state = {
        **{f"{shard_prefix(k)}{p}": torch.tensor([k]) for k in range(shards) for p in "ab"},
        **{
            f"{sh.checkpoint_prefix(k, j)}{p}": torch.tensor([k, j])
            for k in range(shards)
            for j in range(1, slices)
            for p in ("1.weight", "1.bias")
        },
        **sh.Assignment(torch.arange(5), torch.zeros(5), torch.zeros(5)).to_state(),
    }
    parts = _parts(state)
    want = {shard_prefix(k) for k in range(shards)} | {
        sh.checkpoint_prefix(k, j) for k in range(shards) for j in range(1, slices)
    }
    assert parts.keys() == want
    for prefix, tensors in parts.items():
        assert tensors and all(name.startswith(prefix) for name in tensors)
    assert sum(len(t) for t in parts.values()) == len(state) - 3


# ---- shard tasks run elsewhere ----------------------------------------------------------------


class Elsewhere:
    """A `ShardRunner` that runs each task as another worker does (workers/shards.py): from its
    encoded form, on rows taken by sample id, its states read back from their encoding."""

    def __init__(self, model: ModelSpec) -> None:
        self.setup = method_for("sharded_retrain", model).setup  # type: ignore[attr-defined]
        X, y = data()
        self.rows = {s: (X[i], y[i]) for i, s in enumerate(IDS)}
        self.tasks = 0

    def run(self, tasks, local):
        out = []
        for task in tasks:
            copy = ShardTask.decode(task.encode())
            assert copy.shard == task.shard and copy.from_stage == task.from_stage
            assert torch.equal(copy.sample_ids, task.sample_ids)
            X = torch.stack([self.rows[int(s)][0] for s in copy.sample_ids])
            y = torch.stack([self.rows[int(s)][1] for s in copy.sample_ids])
            states = sh.run_task(self.setup, copy, lambda at, X=X, y=y: (X[at], y[at]))
            out.append(decode_states(encode_states(states)))
            self.tasks += 1
        return out


def test_shards_run_elsewhere_from_their_encoded_tasks_give_the_same_bits(trained) -> None:
    model, here = trained
    elsewhere = Elsewhere(model)
    there = fit(model, subset(IDS), shards=elsewhere)
    assert elsewhere.tasks == 4 and identical(here.next_state, there.next_state)
    gone = [IDS[3], IDS[50], IDS[101], IDS[200]]  # several shards, some from a checkpoint
    local = method_for("sharded_retrain", model).unlearn(removal(model, here.next_state, gone))
    inputs = replace(removal(model, here.next_state, gone), shards=elsewhere)
    remote = method_for("sharded_retrain", model, elsewhere).unlearn(inputs)
    assert elsewhere.tasks > 5 and identical(local.next_state, remote.next_state)
