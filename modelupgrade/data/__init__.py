"""Datasets, manifests, upgrade scenarios and their validation.

Public API:
  build_manifest(dataset_params) -> DataFrame          (loader chosen by dataset.loader)
  load_images(frame, dataset_params) -> uint8 (N,C,H,W)
  make_scenario_splits(manifest, scenario, dataset, evaluation, seed) -> Splits
  make_sequential_snapshots(manifest, sequential, dataset, evaluation, seed) -> Splits
  with_supplied_snapshot(splits, generation, rows, source) -> Splits  (a user's next snapshot)
  read_splits(directory) / write_splits(directory, splits)
  Validator, validate_manifest, validate_splits  (Great Expectations; imported lazily)
"""

from modelupgrade.data.images import build_manifest, load_images
from modelupgrade.data.loaders import LOADERS, DatasetLoader, build_loader
from modelupgrade.data.manifest import MANIFEST_COLUMNS, make_manifest, read_manifest
from modelupgrade.data.scenarios import (
    EVALUATION_SPLITS,
    SCENARIO_KINDS,
    TRAINING_SPLITS,
    ScenarioKind,
    Splits,
    make_scenario_splits,
    make_sequential_snapshots,
    scenario_kind,
    with_supplied_snapshot,
)
from modelupgrade.data.split_files import read_splits, write_splits

__all__ = [
    "EVALUATION_SPLITS",
    "LOADERS",
    "MANIFEST_COLUMNS",
    "SCENARIO_KINDS",
    "TRAINING_SPLITS",
    "DatasetLoader",
    "ScenarioKind",
    "Splits",
    "build_loader",
    "build_manifest",
    "load_images",
    "make_manifest",
    "make_scenario_splits",
    "make_sequential_snapshots",
    "read_manifest",
    "read_splits",
    "scenario_kind",
    "with_supplied_snapshot",
    "write_splits",
]
