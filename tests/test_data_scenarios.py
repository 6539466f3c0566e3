"""Scenario and snapshot invariants as property tests over random seeds, sizes and fractions."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modelupgrade.config import ParamsError
from modelupgrade.config.data import EvaluationSplitParams, ScenarioParams, SequentialParams
from modelupgrade.data import (
    SCENARIO_KINDS,
    make_scenario_splits,
    make_sequential_snapshots,
    scenario_kind,
    write_splits,
)
from modelupgrade.data.manifest import image_keys
from modelupgrade.data.sampling import fraction_count
from modelupgrade.errors import UserError
from tests.data_fixtures import make_params, synthetic_manifest

DATASET = make_params("/nonexistent").dataset
EVALUATION = EvaluationSplitParams(queries_per_class=2)

class_sizes = st.lists(st.integers(min_value=2, max_value=25), min_size=2, max_size=8)
seeds = st.integers(min_value=0, max_value=2**31 - 1)
fractions = st.floats(min_value=0.05, max_value=0.95)
property_settings = settings(max_examples=25, deadline=None)


def ids(frame) -> set[str]:
    return set(frame["item_id"])


def classes(frame) -> set[int]:
    return set(frame["label"].tolist())


def split(
    kind: str, sizes: list[int], seed: int, fraction: float, dataset=DATASET, evaluation=EVALUATION
):
    manifest = synthetic_manifest(sizes)
    scenario = ScenarioParams(kind=kind, old_fraction=fraction, strategies=[])
    return manifest, make_scenario_splits(manifest, scenario, dataset, evaluation, seed)


def assert_evaluation_disjoint_from_training(splits) -> None:
    evaluation = set(image_keys(splits.frames["query"])) | set(image_keys(splits.frames["gallery"]))
    for name in ("old_train", "new_train"):
        assert not evaluation & set(image_keys(splits.frames[name]))
    assert not ids(splits.frames["query"]) & ids(splits.frames["gallery"])
    assert classes(splits.frames["query"]) <= classes(splits.frames["gallery"])


def extended_data(manifest, sizes, fraction, old, new):
    assert ids(new) == ids(manifest[manifest["source_split"] == "train"])
    assert ids(old) <= ids(new) and classes(old) == classes(new)
    per_class = old.groupby("label").size().reindex(range(len(sizes))).to_numpy()
    np.testing.assert_array_equal(per_class, fraction_count(np.array(sizes), fraction))


def open_data(manifest, sizes, fraction, old, new):
    assert not ids(old) & ids(new)
    assert len(old) + len(new) == sum(sizes)
    assert classes(old) == classes(new) == set(range(len(sizes)))


def extended_class(manifest, sizes, fraction, old, new):
    assert classes(old) < classes(new) and ids(old) <= ids(new)
    assert len(classes(old)) == fraction_count(len(sizes), fraction)
    # Whole classes: every image of a chosen class is in the old set.
    assert len(old) == sum(sizes[c] for c in classes(old))


def open_class(manifest, sizes, fraction, old, new):
    assert not classes(old) & classes(new)
    assert classes(old) | classes(new) == set(range(len(sizes)))
    assert len(old) + len(new) == sum(sizes)


@pytest.mark.parametrize(
    "kind,check",
    [
        ("extended-data", extended_data),
        ("open-data", open_data),
        ("extended-class", extended_class),
        ("open-class", open_class),
    ],
)
@property_settings
@given(sizes=class_sizes, seed=seeds, fraction=fractions)
def test_scenario_kind(kind, check, sizes, seed, fraction):
    manifest, s = split(kind, sizes, seed, fraction)
    check(manifest, sizes, fraction, s.frames["old_train"], s.frames["new_train"])
    assert_evaluation_disjoint_from_training(s)


@property_settings
@given(sizes=class_sizes, seed=seeds, fraction=fractions)
def test_identical_data_shares_the_old_set_of_the_data_scenarios(sizes, seed, fraction):
    _, identical = split("identical-data", sizes, seed, fraction)
    _, extended = split("extended-data", sizes, seed, fraction)
    assert identical.frames["old_train"].equals(identical.frames["new_train"])
    assert identical.frames["old_train"].equals(extended.frames["old_train"])
    assert_evaluation_disjoint_from_training(identical)


@settings(max_examples=10, deadline=None)
@given(
    kind=st.sampled_from(sorted(SCENARIO_KINDS)), sizes=class_sizes, seed=seeds, fraction=fractions
)
def test_same_seed_gives_byte_identical_files(kind, sizes, seed, fraction):
    with tempfile.TemporaryDirectory() as tmp:
        for attempt in ("a", "b"):
            write_splits(Path(tmp) / attempt, split(kind, sizes, seed, fraction)[1])
        for file in sorted((Path(tmp) / "a").iterdir()):
            assert file.read_bytes() == (Path(tmp) / "b" / file.name).read_bytes(), file.name


def test_another_seed_gives_another_split():
    _, first = split("open-data", [30] * 4, 1, 0.5)
    _, second = split("open-data", [30] * 4, 2, 0.5)
    assert ids(first.frames["old_train"]) != ids(second.frames["old_train"])


@property_settings
@given(
    sizes=class_sizes,
    seed=seeds,
    kind=st.sampled_from(["data", "class"]),
    steps=st.lists(st.floats(min_value=0.05, max_value=0.95), min_size=1, max_size=3, unique=True),
)
def test_sequential_snapshots_are_nested(sizes, seed, kind, steps):
    growing = [*sorted(steps), 1.0]
    sequential = SequentialParams(kind=kind, fractions=growing, strategies=[])
    snapshots = make_sequential_snapshots(
        synthetic_manifest(sizes), sequential, DATASET, EVALUATION, seed
    )
    generations = [snapshots.frames[f"gen{i}"] for i in range(len(growing))]
    for smaller, larger in itertools.pairwise(generations):
        assert ids(smaller) <= ids(larger)
        assert (
            classes(smaller) == classes(larger)
            if kind == "data"
            else classes(smaller) <= classes(larger)
        )
    assert len(generations[-1]) == sum(sizes)
    assert not set(image_keys(snapshots.frames["query"])) & set(image_keys(generations[-1]))


@property_settings
@given(sizes=class_sizes, seed=seeds, cap=st.integers(min_value=1, max_value=10))
def test_cap_per_class_applies_before_sampling(sizes, seed, cap):
    dataset = DATASET.model_copy(update={"max_train_per_class": cap})
    _, s = split("extended-data", sizes, seed, 0.5, dataset=dataset)
    per_class = s.frames["new_train"].groupby("label").size()
    assert (per_class == np.minimum(np.array(sizes), cap)).all()
    assert ids(s.frames["old_train"]) <= ids(s.frames["new_train"])


def test_evaluation_protocols():
    manifest = synthetic_manifest([10, 10, 10], test_per_class=6)
    sampled = make_scenario_splits(
        manifest,
        ScenarioParams(kind="open-data", strategies=[]),
        DATASET,
        EvaluationSplitParams(queries_per_class=2, gallery_per_class=3),
        0,
    )
    assert sampled.frames["query"].groupby("label").size().tolist() == [2, 2, 2]
    assert sampled.frames["gallery"].groupby("label").size().tolist() == [3, 3, 3]
    loo = make_scenario_splits(
        manifest,
        ScenarioParams(kind="open-data", strategies=[]),
        DATASET,
        EvaluationSplitParams(protocol="leave-one-out"),
        0,
    )
    assert loo.frames["query"].equals(loo.frames["gallery"]) and len(loo.frames["query"]) == 18
    holdout = make_scenario_splits(
        manifest,
        ScenarioParams(kind="extended-data", strategies=[]),
        DATASET,
        EvaluationSplitParams(holdout_fraction=0.2, queries_per_class=1),
        0,
    )
    assert set(holdout.frames["gallery"]["source_split"]) == {"train"}
    assert_evaluation_disjoint_from_training(holdout)
    assert len(holdout.frames["new_train"]) == 24


def test_unknown_scenario_is_a_user_error():
    params = make_params("/nonexistent")
    with pytest.raises(ParamsError, match="unknown scenario 'closed-data'"):
        params.scenario("closed-data")
    with pytest.raises(UserError, match="unknown scenario kind 'closed-data'"):
        scenario_kind("closed-data")


def test_missing_evaluation_split_is_a_user_error():
    manifest = synthetic_manifest([5, 5])
    with pytest.raises(UserError, match="no evaluation rows"):
        make_scenario_splits(
            manifest,
            ScenarioParams(kind="open-data", strategies=[]),
            DATASET,
            EvaluationSplitParams(source_split="val"),
            0,
        )
