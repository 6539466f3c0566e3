"""Upgrade scenarios (old/new training sets), evaluation sets and growing sequential snapshots.

Definitions follow the unified table of the research digest (§4.3). Every split is a set of
manifest rows written in manifest order, so equal inputs and seed give byte-identical files.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import numpy as np
import pandas as pd

from modelupgrade.config.data import (
    DatasetParams,
    EvaluationSplitParams,
    ScenarioParams,
    SequentialParams,
)
from modelupgrade.data.manifest import check_manifest_columns
from modelupgrade.data.sampling import (
    cap_per_class,
    class_fraction_mask,
    fraction_count,
    image_fraction_mask,
    per_class_mask,
    ranks_within_class,
    row_keys,
)
from modelupgrade.errors import UserError
from modelupgrade.registry_util import Registry

TRAINING_SPLITS = ("old_train", "new_train")
EVALUATION_SPLITS = ("query", "gallery")

ClassRelation = Literal["same", "subset", "disjoint"]
ImageRelation = Literal["subset", "disjoint", "identical"]


class ScenarioSplitter(ABC):
    """Turns the training pool into the old and the new training set of one scenario kind."""

    registry_name: str
    # How the old set's classes relate to the new set's, and its images to the new set's images;
    # the validation checks exactly these relations.
    class_relation: ClassVar[ClassRelation]
    image_relation: ClassVar[ImageRelation]

    @abstractmethod
    def old_mask(self, pool: pd.DataFrame, fraction: float, seed: int) -> np.ndarray:
        """Rows of the pool in the old training set."""

    @abstractmethod
    def new_mask(self, old: np.ndarray) -> np.ndarray:
        """Rows of the pool in the new training set, given the old set's rows."""


SPLITTERS: Registry[ScenarioSplitter] = Registry("scenario kind")


@SPLITTERS.register("extended-data")
class ExtendedData(ScenarioSplitter):
    class_relation = "same"
    image_relation = "subset"

    def old_mask(self, pool: pd.DataFrame, fraction: float, seed: int) -> np.ndarray:
        return image_fraction_mask(pool, fraction, seed)

    def new_mask(self, old: np.ndarray) -> np.ndarray:
        return np.ones_like(old)


@SPLITTERS.register("open-data")
class OpenData(ScenarioSplitter):
    class_relation = "same"
    image_relation = "disjoint"

    def old_mask(self, pool: pd.DataFrame, fraction: float, seed: int) -> np.ndarray:
        return image_fraction_mask(pool, fraction, seed)

    def new_mask(self, old: np.ndarray) -> np.ndarray:
        return ~old


@SPLITTERS.register("extended-class")
class ExtendedClass(ScenarioSplitter):
    class_relation = "subset"
    image_relation = "subset"

    def old_mask(self, pool: pd.DataFrame, fraction: float, seed: int) -> np.ndarray:
        return class_fraction_mask(pool, fraction, seed)

    def new_mask(self, old: np.ndarray) -> np.ndarray:
        return np.ones_like(old)


@SPLITTERS.register("open-class")
class OpenClass(ScenarioSplitter):
    class_relation = "disjoint"
    image_relation = "disjoint"

    def old_mask(self, pool: pd.DataFrame, fraction: float, seed: int) -> np.ndarray:
        return class_fraction_mask(pool, fraction, seed)

    def new_mask(self, old: np.ndarray) -> np.ndarray:
        return ~old


@SPLITTERS.register("identical-data")
class IdenticalData(ScenarioSplitter):
    """Same data for both generations: the upgrade is the architecture or the objective."""

    class_relation = "same"
    image_relation = "identical"

    def old_mask(self, pool: pd.DataFrame, fraction: float, seed: int) -> np.ndarray:
        return image_fraction_mask(pool, fraction, seed)

    def new_mask(self, old: np.ndarray) -> np.ndarray:
        return old.copy()


@dataclass
class Splits:
    """Named frames of manifest rows, plus what produced them (written as split_info.json)."""

    frames: dict[str, pd.DataFrame]
    info: dict[str, object] = field(default_factory=dict)

    def sizes(self) -> dict[str, dict[str, int]]:
        return {
            name: {"images": int(len(f)), "classes": int(f["label"].nunique())}
            for name, f in self.frames.items()
        }


def _rows(frame: pd.DataFrame, mask: np.ndarray) -> pd.DataFrame:
    return frame[mask].reset_index(drop=True)


def partition_pools(
    manifest: pd.DataFrame,
    dataset: DatasetParams,
    evaluation: EvaluationSplitParams,
    seed: int,
) -> tuple[pd.DataFrame, pd.DataFrame]:
    """(training pool, evaluation pool): disjoint rows of the manifest, in manifest order."""
    check_manifest_columns(manifest, "the manifest")
    manifest = manifest.reset_index(drop=True)
    train = manifest[manifest["source_split"] == dataset.train_split]
    if train.empty:
        found = sorted(manifest["source_split"].unique())
        raise UserError(
            f"the manifest has no rows with source_split {dataset.train_split!r} (it has {found})",
            hint="set dataset.train_split in params.yaml",
        )
    if evaluation.protocol == "predefined":
        pool = manifest[manifest["source_split"].isin(EVALUATION_SPLITS)]
    elif evaluation.holdout_fraction is not None:
        keys = row_keys(seed, "holdout", len(train))
        labels = train["label"].to_numpy(dtype=np.int64)
        counts = np.bincount(labels, minlength=int(labels.max()) + 1)
        held_out = per_class_mask(labels, keys, fraction_count(counts, evaluation.holdout_fraction))
        pool, train = train[held_out], train[~held_out]
    else:
        pool = manifest[manifest["source_split"] == evaluation.source_split]
    if pool.empty:
        found = sorted(manifest["source_split"].unique())
        raise UserError(
            f"the manifest has no evaluation rows for protocol {evaluation.protocol!r} "
            f"(source splits present: {found})",
            hint="set evaluation_split.source_split, or evaluation_split.holdout_fraction to carve "
            "a held-out set out of the training split",
        )
    training_pool = cap_per_class(train, dataset.max_train_per_class, seed)
    return training_pool.reset_index(drop=True), pool.reset_index(drop=True)


def evaluation_sets(
    pool: pd.DataFrame, evaluation: EvaluationSplitParams, seed: int
) -> dict[str, pd.DataFrame]:
    """Query and gallery from the evaluation pool, per the configured protocol."""
    if evaluation.protocol == "predefined":
        return {name: _rows(pool, (pool["source_split"] == name).to_numpy()) for name in EVALUATION_SPLITS}
    labels = pool["label"].to_numpy(dtype=np.int64)
    counts = np.bincount(labels, minlength=int(labels.max()) + 1)
    ranks = ranks_within_class(labels, row_keys(seed, "queries", len(pool)))
    if evaluation.protocol == "leave-one-out":
        cap = evaluation.gallery_per_class
        gallery = ranks < (cap if cap is not None else np.iinfo(np.int64).max)
        return {"query": _rows(pool, gallery), "gallery": _rows(pool, gallery)}
    # A class with a single image cannot have a query with a positive: it only feeds the gallery.
    queries_per_class = np.minimum(evaluation.queries_per_class, np.maximum(counts - 1, 0))
    query = ranks < queries_per_class[labels]
    gallery = ~query
    if evaluation.gallery_per_class is not None:
        gallery &= ranks < queries_per_class[labels] + evaluation.gallery_per_class
    return {"query": _rows(pool, query), "gallery": _rows(pool, gallery)}


def make_scenario_splits(
    manifest: pd.DataFrame,
    scenario: ScenarioParams,
    dataset: DatasetParams,
    evaluation: EvaluationSplitParams,
    seed: int,
) -> Splits:
    """old_train, new_train, query and gallery of one scenario."""
    splitter = SPLITTERS.get(scenario.kind)()
    pool, eval_pool = partition_pools(manifest, dataset, evaluation, seed)
    old = splitter.old_mask(pool, scenario.old_fraction, seed)
    frames = {
        "old_train": _rows(pool, old),
        "new_train": _rows(pool, splitter.new_mask(old)),
        **evaluation_sets(eval_pool, evaluation, seed),
    }
    info = {
        "kind": scenario.kind,
        "old_fraction": scenario.old_fraction,
        "seed": seed,
        "protocol": evaluation.protocol,
        "class_relation": splitter.class_relation,
        "image_relation": splitter.image_relation,
        "max_train_per_class": dataset.max_train_per_class,
    }
    return Splits(frames, info)


# Growing by images keeps every class from gen0 on; growing by classes adds whole classes.
SNAPSHOT_MASKS = {"data": image_fraction_mask, "class": class_fraction_mask}


def make_sequential_snapshots(
    manifest: pd.DataFrame,
    sequential: SequentialParams,
    dataset: DatasetParams,
    evaluation: EvaluationSplitParams,
    seed: int,
) -> Splits:
    """gen0, gen1, ... (nested growing training sets) plus the shared query and gallery."""
    pool, eval_pool = partition_pools(manifest, dataset, evaluation, seed)
    frames = {
        f"gen{i}": _rows(pool, SNAPSHOT_MASKS[sequential.kind](pool, fraction, seed))
        for i, fraction in enumerate(sequential.fractions)
    }
    frames.update(evaluation_sets(eval_pool, evaluation, seed))
    info = {
        "kind": f"sequential-{sequential.kind}",
        "fractions": list(sequential.fractions),
        "seed": seed,
        "protocol": evaluation.protocol,
        "max_train_per_class": dataset.max_train_per_class,
    }
    return Splits(frames, info)
