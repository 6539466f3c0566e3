"""Great Expectations validation: good data passes, and each failure mode is caught and named."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from modelupgrade.data import (
    Splits,
    build_manifest,
    make_scenario_splits,
    make_sequential_snapshots,
    write_splits,
)
from modelupgrade.data.validation import Validator, validate_manifest, validate_splits
from modelupgrade.errors import DataValidationError
from tests.data_fixtures import make_params, write_idx_dataset, write_params_yaml


@pytest.fixture(scope="module")
def validator() -> Validator:
    return Validator()


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    root = tmp_path_factory.mktemp("tiny-idx")
    write_idx_dataset(root, train=48, test=24, classes=4)
    params = make_params(root)
    return root, params, build_manifest(params.dataset)


def scenario(world, kind: str) -> Splits:
    _, params, manifest = world
    return make_scenario_splits(
        manifest, params.scenario(kind), params.dataset, params.evaluation_split, params.seed
    )


def run_splits(validator, world, splits: Splits, name: str = "s"):
    root, params, manifest = world
    return validate_splits(
        validator, manifest, splits, name, root, params.dataset.min_images_per_class, "train"
    )


def failed(report) -> list[tuple[str, str]]:
    return [(o.expectation, o.column) for o in report.failures]


def test_good_manifest_scenarios_and_snapshots_pass(validator, world):
    root, params, manifest = world
    assert validate_manifest(validator, manifest, root, 2, "train").success
    # extended-data and open-class pass in the stage test; the other kinds are checked here.
    for kind in ("open-data", "extended-class", "identical-data"):
        report = run_splits(validator, world, scenario(world, kind), kind)
        assert report.success, [f.describe() for f in report.failures]
    snapshots = make_sequential_snapshots(
        manifest, params.sequential, params.dataset, params.evaluation_split, 1
    )
    assert run_splits(validator, world, snapshots).success


def test_nulls_labels_outside_and_bad_paths_in_manifest(validator, world, tmp_path):
    root, _, manifest = world
    bad = manifest.copy()
    bad.loc[3, "class_name"] = None
    bad.loc[5, "label"] = 99
    bad.loc[7, "path"] = "../outside.gz"
    (root.parent / "outside.gz").write_bytes(b"x")
    bad.loc[8, "path"] = "missing.gz"
    report = validate_manifest(validator, bad, root, 2, "train")
    problems = failed(report)
    assert ("expect_column_values_to_not_be_null", "class_name") in problems
    assert ("expect_column_values_to_be_in_set", "label") in problems
    assert ("expect_column_values_to_be_in_set", "path_exists_inside_root") in problems
    path_failure = next(o for o in report.failures if o.column == "path_exists_inside_root")
    assert path_failure.unexpected_count == 2
    assert {e["item_id"] for e in path_failure.examples} == {
        bad.loc[7, "item_id"],
        bad.loc[8, "item_id"],
    }
    with pytest.raises(DataValidationError) as err:
        report.raise_if_failed()
    text = str(err.value)
    assert "expect_column_values_to_not_be_null on column 'class_name'" in text
    assert str(bad.loc[5, "item_id"]) in text


def test_duplicate_items_and_too_few_images_per_class(validator, world):
    root, _, manifest = world
    report = validate_manifest(validator, manifest, root, 50, "train")
    assert failed(report) == [("expect_column_values_to_be_between", "images_in_class")]
    assert report.failures[0].unexpected_count == 48
    duplicated = manifest.copy()
    duplicated.loc[1, "item_id"] = duplicated.loc[0, "item_id"]
    assert ("expect_column_values_to_be_unique", "item_id") in failed(
        validate_manifest(validator, duplicated, root, 2, "train")
    )


def test_image_shared_between_training_and_evaluation(validator, world):
    splits = scenario(world, "extended-data")
    leaked = splits.frames["gallery"].iloc[[0]]
    splits.frames["new_train"] = pd.concat([splits.frames["new_train"], leaked], ignore_index=True)
    report = run_splits(validator, world, splits)
    assert failed(report) == [("expect_column_values_to_be_in_set", "image_in_evaluation_sets")]
    assert report.failures[0].examples[0]["item_id"] == leaked.iloc[0]["item_id"]


def test_query_and_gallery_must_be_disjoint_unless_leave_one_out(validator, world):
    splits = scenario(world, "open-data")
    splits.frames["query"] = pd.concat(
        [splits.frames["query"], splits.frames["gallery"].iloc[[0]]], ignore_index=True
    )
    assert ("expect_column_values_to_be_in_set", "in_gallery") in failed(
        run_splits(validator, world, splits)
    )


def test_extended_class_old_classes_must_be_inside_new(validator, world):
    splits = scenario(world, "extended-class")
    old_classes = set(splits.frames["old_train"]["label"])
    splits.frames["new_train"] = splits.frames["new_train"][
        ~splits.frames["new_train"]["label"].isin(old_classes)
    ]
    problems = failed(run_splits(validator, world, splits))
    assert ("expect_column_values_to_be_in_set", "label") in problems


def test_open_class_sets_must_not_share_classes(validator, world):
    splits = scenario(world, "open-class")
    stolen = splits.frames["old_train"].iloc[[0]]
    splits.frames["old_train"] = splits.frames["old_train"].iloc[1:]
    splits.frames["new_train"] = pd.concat([splits.frames["new_train"], stolen], ignore_index=True)
    assert ("expect_column_values_to_not_be_in_set", "label") in failed(
        run_splits(validator, world, splits)
    )


def test_data_scenarios_need_the_same_classes(validator, world):
    splits = scenario(world, "open-data")
    old = splits.frames["old_train"]
    splits.frames["old_train"] = old[old["label"] != 3]
    report = run_splits(validator, world, splits)
    assert failed(report) == [("expect_column_distinct_values_to_equal_set", "label")]
    assert "missing values: [3]" in report.failures[0].detail


def test_split_rows_must_come_from_the_manifest(validator, world):
    splits = scenario(world, "extended-data")
    splits.frames["old_train"] = splits.frames["old_train"].assign(
        item_id=np.where(
            np.arange(len(splits.frames["old_train"])) == 0,
            "stranger",
            splits.frames["old_train"]["item_id"],
        )
    )
    assert ("expect_column_values_to_be_in_set", "in_manifest") in failed(
        run_splits(validator, world, splits)
    )


def test_validate_stage_writes_reports_and_exits_non_zero(world, tmp_path):
    from stages import validate

    _root, params, manifest = world
    manifest_path = tmp_path / "manifest.parquet"
    manifest.to_parquet(manifest_path, index=False)
    params_path = write_params_yaml(tmp_path / "params.yaml", params)
    splits = scenario(world, "open-class")
    splits.frames["new_train"] = pd.concat(
        [splits.frames["new_train"], splits.frames["old_train"].iloc[[0]]], ignore_index=True
    )
    write_splits(tmp_path / "splits" / "open-class", splits)
    good = scenario(world, "extended-data")
    write_splits(tmp_path / "splits" / "extended-data", good)
    out = tmp_path / "validation"
    argv = [
        "--params",
        str(params_path),
        "--manifest",
        str(manifest_path),
        "--out-dir",
        str(out),
        "--splits",
        str(tmp_path / "splits" / "open-class"),
        "--splits",
        str(tmp_path / "splits" / "extended-data"),
    ]
    with pytest.raises(SystemExit) as exit_info:
        validate.main(argv)
    assert exit_info.value.code != 0
    assert json.loads((out / "extended-data.json").read_text())["success"] is True
    assert json.loads((out / "tiny.json").read_text())["success"] is True
    report = json.loads((out / "open-class.json").read_text())
    assert report["success"] is False and set(report["seconds"]) == {
        "gx_import",
        "gx_context",
        "validate",
    }
    assert {r["column"] for r in report["results"] if not r["success"]} == {
        "label",
        "in_new_train",
        "images_in_class",
    }
