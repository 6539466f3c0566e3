"""Upgrade scenarios (old/new training sets), evaluation sets and growing sequential snapshots.

Definitions follow the unified table of the research digest (§4.3). Every split is a set of
manifest rows written in manifest order, so equal inputs and seed give byte-identical files.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

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

TRAINING_SPLITS = ("old_train", "new_train")
EVALUATION_SPLITS = ("query", "gallery")

ClassRelation = Literal["same", "subset", "disjoint"]
ImageRelation = Literal["subset", "disjoint", "identical"]


# What the old training set is drawn as: a fraction of each class's images, or a fraction of the
# classes with all their images; and what the new set is: the whole pool, the rest of it, or the
# old set itself.
OldSet = Literal["images", "classes"]
NewSet = Literal["everything", "the rest", "the same"]
_OLD_SETS = {"images": image_fraction_mask, "classes": class_fraction_mask}
_NEW_SETS = {
    "everything": lambda old: np.ones_like(old),
    "the rest": lambda old: ~old,
    "the same": lambda old: old.copy(),
}


@dataclass(frozen=True)
class ScenarioKind:
    """An upgrade scenario: how the old and the new training sets are drawn from the pool."""

    name: str
    old_set: OldSet
    new_set: NewSet
    description: str

    def old_mask(self, pool: pd.DataFrame, fraction: float, seed: int) -> np.ndarray:
        """Rows of the pool in the old training set."""
        return _OLD_SETS[self.old_set](pool, fraction, seed)

    def new_mask(self, old: np.ndarray) -> np.ndarray:
        """Rows of the pool in the new training set, given the old set's rows."""
        return _NEW_SETS[self.new_set](old)

    # How the old set's classes relate to the new set's, and its images to the new set's images;
    # the data validation checks exactly these relations.
    @property
    def class_relation(self) -> ClassRelation:
        if self.old_set == "images":
            return "same"
        return "disjoint" if self.new_set == "the rest" else "subset"

    @property
    def image_relation(self) -> ImageRelation:
        relation: dict[str, ImageRelation] = {
            "everything": "subset",
            "the rest": "disjoint",
            "the same": "identical",
        }
        return relation[self.new_set]


SCENARIO_KINDS: dict[str, ScenarioKind] = {
    kind.name: kind
    for kind in (
        ScenarioKind("extended-data", "images", "everything", "more images of the same classes"),
        ScenarioKind("open-data", "images", "the rest", "other images of the same classes"),
        ScenarioKind("extended-class", "classes", "everything", "more classes, the old included"),
        ScenarioKind("open-class", "classes", "the rest", "other classes only"),
        ScenarioKind("identical-data", "images", "the same", "same data, new model or loss"),
    )
}


def scenario_kind(name: str) -> ScenarioKind:
    try:
        return SCENARIO_KINDS[name]
    except KeyError:
        raise UserError(
            f"unknown scenario kind {name!r}",
            hint=f"choose one of: {', '.join(sorted(SCENARIO_KINDS))}",
        ) from None


@dataclass
class Splits:
    """Named frames of manifest rows, plus what produced them (written as split_info.json)."""

    frames: dict[str, pd.DataFrame]
    info: dict[str, object] = field(default_factory=dict)

    def sizes(self) -> dict[str, dict[str, int]]:
        return {
            name: {"images": len(f), "classes": int(f["label"].nunique())}
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
        return {
            name: _rows(pool, (pool["source_split"] == name).to_numpy())
            for name in EVALUATION_SPLITS
        }
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
    splitter = scenario_kind(scenario.kind)
    pool, eval_pool = partition_pools(manifest, dataset, evaluation, seed)
    old = splitter.old_mask(pool, scenario.old_fraction, seed)
    frames = {
        "old_train": _rows(pool, old),
        "new_train": _rows(pool, splitter.new_mask(old)),
        **evaluation_sets(eval_pool, evaluation, seed),
    }
    info: dict[str, object] = {
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


def with_supplied_snapshot(
    splits: Splits, generation: int, snapshot: pd.DataFrame, source: str
) -> Splits:
    """Sequential ``splits`` with ``snapshot`` (manifest rows from ``source``) as the training
    data of generation ``generation``. It replaces the planned slices from that generation on
    (they would not contain it), and like them it must be larger than the generation before it:
    each generation trains on more data than the one it upgrades."""
    name = f"gen{generation}"
    if snapshot.empty:
        raise UserError(f"the snapshot {source} has no rows")
    check_manifest_columns(snapshot, source)
    previous = splits.frames.get(f"gen{generation - 1}") if generation > 0 else None
    if previous is not None and len(snapshot) <= len(previous):
        raise UserError(
            f"the snapshot {source} has {len(snapshot)} images, not more than the "
            f"{len(previous)} of gen{generation - 1}",
            hint="each generation trains on more data than the one before it",
        )
    frames = {
        key: rows
        for key, rows in splits.frames.items()
        if not (key.startswith("gen") and int(key[3:]) >= generation)
    }
    frames[name] = snapshot
    earlier = splits.info.get("supplied_snapshots") or {}
    assert isinstance(earlier, dict)  # name → source, as this function writes it
    supplied = {**earlier, name: source}
    return Splits(frames, {**splits.info, "supplied_snapshots": supplied})
