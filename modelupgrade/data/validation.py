"""Data validation with Great Expectations (GX Core 1.x, one ephemeral context per run).

Every manifest and split file passes these expectations before anything trains on it: no nulls,
labels inside the class set, paths that exist inside the data root (and open as images where a row
is one image file), no image shared between a training set and the evaluation sets, the scenario's
class coverage, and a minimum of images per class. A failure raises ``DataValidationError`` naming
the expectation, the column and a few offending rows. GX takes seconds to import, so it is imported
only when a ``Validator`` is built.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from modelupgrade.config.data import DatasetParams
from modelupgrade.data.manifest import (
    MANIFEST_COLUMNS,
    check_manifest_columns,
    image_keys,
    read_manifest,
)
from modelupgrade.data.scenarios import EVALUATION_SPLITS, Splits
from modelupgrade.data.split_files import read_splits
from modelupgrade.errors import DataValidationError
from modelupgrade.json_data import JsonObject, json_record

log = logging.getLogger(__name__)

EXAMPLES_SHOWN = 5


@dataclass
class ExpectationOutcome:
    table: str
    expectation: str
    column: str
    success: bool
    unexpected_count: int = 0
    examples: list[JsonObject] = field(default_factory=list)
    detail: str = ""

    def describe(self) -> str:
        shown = "; ".join(", ".join(f"{k}={v}" for k, v in e.items()) for e in self.examples)
        text = f"{self.table}: {self.expectation} on column {self.column!r} failed"
        if self.unexpected_count:
            text += f" ({self.unexpected_count} offending row(s)"
            text += f", e.g. {shown})" if shown else ")"
        if self.detail:
            text += f" [{self.detail}]"
        return text


@dataclass
class ValidationReport:
    name: str
    outcomes: list[ExpectationOutcome] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)

    @property
    def success(self) -> bool:
        return all(o.success for o in self.outcomes)

    @property
    def failures(self) -> list[ExpectationOutcome]:
        return [o for o in self.outcomes if not o.success]

    def to_dict(self) -> JsonObject:
        return {
            "name": self.name,
            "success": self.success,
            "expectations": len(self.outcomes),
            "failed": len(self.failures),
            "seconds": {k: round(v, 3) for k, v in self.seconds.items()},
            "results": [json_record(o) for o in self.outcomes],
        }

    def raise_if_failed(self) -> None:
        if self.success:
            return
        lines = [f"data validation of {self.name} failed ({len(self.failures)} expectation(s)):"]
        lines += [f"  - {f.describe()}" for f in self.failures]
        raise DataValidationError(
            "\n".join(lines),
            hint="fix the data or the split parameters; nothing downstream runs on it",
        )


def values_in(column: pd.Series, values: set[Any]) -> np.ndarray:
    """Whether each value of ``column`` is in ``values``, as a bool array.

    A set lookup per value: pandas' ``isin`` on an Arrow string column builds one Arrow scalar per
    member of ``values`` on every call, ~25× slower on the manifest's 70,000 paths.
    """
    return np.fromiter((value in values for value in column), dtype=bool, count=len(column))


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, float) and np.isnan(value):
        return None
    if isinstance(value, tuple):
        return [_plain(v) for v in value]
    return value


class Validator:
    """Owns the one GX context of a run; ``check`` validates a frame against expectations."""

    def __init__(self) -> None:
        os.environ.setdefault("GX_ANALYTICS_ENABLED", "false")
        started = time.perf_counter()
        import great_expectations as gx
        import great_expectations.expectations as gxe
        from great_expectations.data_context.types.base import ProgressBarsConfig

        imported = time.perf_counter()
        self.gx = gx
        self.expect = gxe
        self.context = gx.get_context(mode="ephemeral")
        self.context.variables.progress_bars = ProgressBarsConfig(globally=False)
        self.source = self.context.data_sources.add_pandas(name="modelupgrade")
        self.seconds = {
            "gx_import": imported - started,
            "gx_context": time.perf_counter() - imported,
            "validate": 0.0,
        }
        self._tables = 0

    def check(
        self, table: str, frame: pd.DataFrame, expectations: list[Any], id_column: str = "item_id"
    ) -> list[ExpectationOutcome]:
        started = time.perf_counter()
        self._tables += 1
        asset = self.source.add_dataframe_asset(name=f"table{self._tables}")
        batch = asset.add_batch_definition_whole_dataframe("whole")
        # Filled before the context holds it: a suite already in the context stores itself again
        # (deep copies, serialisation) on each expectation added. add_expectation drops an
        # expectation equal to one the suite has (e.g. a query's labels checked against the
        # gallery's classes when those are every class).
        suite = self.gx.ExpectationSuite(name=f"suite{self._tables}")
        for expectation in expectations:
            suite.add_expectation(expectation)
        suite = self.context.suites.add(suite)
        definition = self.context.validation_definitions.add(
            self.gx.ValidationDefinition(data=batch, suite=suite, name=f"validation{self._tables}")
        )
        result_format: dict[str, Any] = {"result_format": "SUMMARY", "partial_unexpected_count": 20}
        if id_column in frame.columns:
            result_format["unexpected_index_column_names"] = [id_column]
        result = definition.run(
            batch_parameters={"dataframe": frame.reset_index(drop=True)},
            result_format=result_format,
        )
        outcomes = [self._outcome(table, r) for r in result.results]
        self.seconds["validate"] += time.perf_counter() - started
        return outcomes

    @staticmethod
    def _outcome(table: str, result: Any) -> ExpectationOutcome:
        config = result.expectation_config
        kwargs = config.kwargs
        column = kwargs.get("column") or "/".join(
            str(kwargs[k]) for k in ("column_A", "column_B") if k in kwargs
        )
        details = dict(result.result or {})
        examples = [
            {k: _plain(v) for k, v in row.items()}
            for row in details.get("partial_unexpected_index_list", [])[:EXAMPLES_SHOWN]
        ]
        if not examples and details.get("partial_unexpected_list"):
            examples = [
                {"value": _plain(v)} for v in details["partial_unexpected_list"][:EXAMPLES_SHOWN]
            ]
        detail = ""
        if details.get("partial_missing_list"):
            missing = [_plain(v) for v in details["partial_missing_list"][:EXAMPLES_SHOWN]]
            detail = f"missing values: {missing}"
        if not result.success and not details:
            info = result.exception_info or {}
            messages = [v.get("exception_message") for v in info.values() if isinstance(v, dict)]
            messages += [info.get("exception_message")] if "exception_message" in info else []
            detail = (
                "; ".join(m for m in messages if m)
                or "column missing or expectation not computable"
            )
        return ExpectationOutcome(
            table=table,
            expectation=config.type,
            column=str(column),
            success=bool(result.success),
            unexpected_count=int(details.get("unexpected_count") or 0),
            examples=examples,
            detail=detail,
        )


def valid_paths(frame: pd.DataFrame, root: str | Path) -> list[str]:
    """The distinct paths of ``frame`` that exist and resolve inside ``root``."""
    root = Path(root).resolve()
    good = []
    for relative in frame["path"].dropna().astype(str).unique():
        full = (root / relative).resolve()
        if full.is_relative_to(root) and full.exists():
            good.append(relative)
    return good


@functools.cache
def _opens_as_image(path: Path, stamp: tuple[int, int]) -> bool:
    """Whether PIL opens ``path``; ``stamp`` (mtime, size) keys the cache, so that the manifest
    and every split directory validated in one run open each file once."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(path):  # reads the header only: cheap enough for every file
            return True
    except (UnidentifiedImageError, OSError, ValueError):
        return False


def unreadable_images(frame: pd.DataFrame, root: str | Path, paths: set[str]) -> set[str]:
    """The paths among ``paths`` that rows of ``frame`` read as one image each (index -1) but
    whose file is no image PIL can open; arrays of images (IDX, CIFAR) are checked by their
    loaders."""
    root = Path(root).resolve()
    files = frame.loc[frame["index"] == -1, "path"].dropna().astype(str).unique()
    unreadable = set()
    for relative in files:
        if relative in paths:
            stat = (root / relative).stat()
            if not _opens_as_image(root / relative, (stat.st_mtime_ns, stat.st_size)):
                unreadable.add(relative)
    return unreadable


def with_class_sizes(frame: pd.DataFrame) -> pd.DataFrame:
    """``frame`` plus ``images_in_class``: how many rows of the frame share each row's label."""
    return frame.assign(
        images_in_class=frame.groupby("label")["label"].transform("size").to_numpy()
    )


class DataChecks:
    """Builds the expectations of manifests and splits and runs them through one Validator.

    Row-membership checks against large sets (item ids, image keys, file paths) are computed with
    pandas into boolean columns that GX then checks: GX's own in-set expectations take tens of
    seconds on a value set of 70,000 ids, while a boolean column costs nothing. Label sets stay
    GX value sets (they hold one value per class).
    """

    def __init__(
        self,
        validator: Validator,
        manifest: pd.DataFrame,
        root: str | Path,
        min_images_per_class: int,
        train_split: str,
    ) -> None:
        self.v = validator
        self.manifest = manifest
        self.min_images = min_images_per_class
        self.train_split = train_split
        self.labels = list(range(int(manifest["class_name"].nunique())))
        first_names = manifest.drop_duplicates("label").set_index("label")["class_name"]
        self.class_name_of = first_names.astype(str).to_dict()
        self.paths = set(valid_paths(manifest, root))
        self.unreadable = unreadable_images(manifest, root, self.paths)
        self.item_ids = set(manifest["item_id"].astype(str))

    def with_row_checks(self, frame: pd.DataFrame) -> pd.DataFrame:
        expected_names = frame["label"].map(self.class_name_of)
        return frame.assign(
            label_matches_class_name=(expected_names == frame["class_name"]).to_numpy(dtype=bool),
            path_exists_inside_root=values_in(frame["path"], self.paths),
            image_file_readable=~values_in(frame["path"], self.unreadable),
            in_manifest=values_in(frame["item_id"], self.item_ids),
        )

    def row_expectations(self) -> list[Any]:
        x = self.v.expect
        return [
            *[x.ExpectColumnToExist(column=c) for c in MANIFEST_COLUMNS],
            *[x.ExpectColumnValuesToNotBeNull(column=c) for c in MANIFEST_COLUMNS],
            x.ExpectColumnValuesToBeUnique(column="item_id"),
            x.ExpectColumnValuesToBeInSet(column="label", value_set=self.labels),
            x.ExpectColumnValuesToBeInSet(column="label_matches_class_name", value_set=[True]),
            x.ExpectColumnValuesToBeInSet(column="path_exists_inside_root", value_set=[True]),
            x.ExpectColumnValuesToBeInSet(column="image_file_readable", value_set=[True]),
            x.ExpectColumnValuesToBeInSet(column="in_manifest", value_set=[True]),
            x.ExpectColumnValuesToBeBetween(column="index", min_value=-1),
        ]

    def class_size_expectation(self) -> Any:
        return self.v.expect.ExpectColumnValuesToBeBetween(
            column="images_in_class", min_value=self.min_images
        )

    def manifest_outcomes(self) -> list[ExpectationOutcome]:
        x = self.v.expect
        frame = self.manifest
        outcomes = self.v.check(
            "manifest",
            self.with_row_checks(frame),
            [
                *self.row_expectations(),
                x.ExpectColumnDistinctValuesToEqualSet(column="label", value_set=self.labels),
            ],
        )
        training = frame[frame["source_split"] == self.train_split]
        return outcomes + self.v.check(
            f"manifest[{self.train_split}]",
            with_class_sizes(training),
            [self.class_size_expectation()],
        )

    def split_outcomes(self, name: str, splits: Splits) -> list[ExpectationOutcome]:
        x = self.v.expect
        frames = splits.frames
        for split, frame in frames.items():
            check_manifest_columns(frame, f"split {name}/{split}")
        evaluation_keys = set().union(*(set(image_keys(frames[s])) for s in EVALUATION_SPLITS))
        outcomes: list[ExpectationOutcome] = []
        for split, frame in frames.items():
            columns, relations = self.relation_checks(split, splits)
            checked = self.with_row_checks(frame).assign(**columns)
            expectations = [*self.row_expectations(), *relations]
            if split not in EVALUATION_SPLITS:
                checked = with_class_sizes(checked).assign(
                    image_in_evaluation_sets=values_in(image_keys(frame), evaluation_keys)
                )
                expectations += [
                    x.ExpectColumnValuesToBeInSet(
                        column="image_in_evaluation_sets", value_set=[False]
                    ),
                    self.class_size_expectation(),
                ]
            outcomes += self.v.check(f"{name}/{split}", checked, expectations)
        return outcomes

    def relation_checks(
        self, split: str, splits: Splits
    ) -> tuple[dict[str, np.ndarray], list[Any]]:
        """Coverage and containment the scenario defines between its sets (from split_info).

        Returns derived boolean columns for ``split`` and the expectations over them and labels.
        """
        x = self.v.expect
        frames = splits.frames
        info = splits.info
        frame = frames[split]

        def classes(s: str) -> list[int]:
            return sorted(int(v) for v in frames[s]["label"].unique())

        def member_of(s: str) -> np.ndarray:
            return values_in(frame["item_id"], set(frames[s]["item_id"]))

        columns: dict[str, np.ndarray] = {}
        expectations: list[Any] = []
        if split == "query":
            expectations.append(
                x.ExpectColumnValuesToBeInSet(column="label", value_set=classes("gallery"))
            )
            columns["in_gallery"] = member_of("gallery")
            # Leave-one-out queries are the gallery; otherwise no query may sit in the gallery.
            in_gallery = info.get("protocol") == "leave-one-out"
            expectations.append(
                x.ExpectColumnValuesToBeInSet(column="in_gallery", value_set=[in_gallery])
            )
        if split == "old_train":
            relation = CLASS_RELATIONS.get(str(info.get("class_relation")))
            if relation is not None:
                expectations.append(relation(x, classes("new_train")))
            in_new = IMAGE_RELATIONS.get(str(info.get("image_relation")))
            if in_new is not None:
                columns["in_new_train"] = member_of("new_train")
                expectations.append(
                    x.ExpectColumnValuesToBeInSet(column="in_new_train", value_set=[in_new])
                )
            if info.get("image_relation") == "identical":
                expectations.append(x.ExpectTableRowCountToEqual(value=len(frames["new_train"])))
        generations = sorted((s for s in frames if s.startswith("gen")), key=lambda s: int(s[3:]))
        if split in generations[:-1]:
            following = generations[generations.index(split) + 1]
            columns[f"in_{following}"] = member_of(following)
            expectations.append(
                x.ExpectColumnValuesToBeInSet(column=f"in_{following}", value_set=[True])
            )
            grows_by_class = info.get("kind") == "sequential-class"
            relation = CLASS_RELATIONS["subset" if grows_by_class else "same"]
            expectations.append(relation(x, classes(following)))
        return columns, expectations


# Class coverage of the old training set against the new one's classes.
CLASS_RELATIONS = {
    "same": lambda x, new: x.ExpectColumnDistinctValuesToEqualSet(column="label", value_set=new),
    "subset": lambda x, new: x.ExpectColumnValuesToBeInSet(column="label", value_set=new),
    "disjoint": lambda x, new: x.ExpectColumnValuesToNotBeInSet(column="label", value_set=new),
}

# Whether every old training image must (True) or must not (False) be in the new training set.
IMAGE_RELATIONS = {"subset": True, "identical": True, "disjoint": False}


def validate_manifest(
    validator: Validator,
    manifest: pd.DataFrame,
    root: str | Path,
    min_images_per_class: int,
    train_split: str,
    name: str = "manifest",
) -> ValidationReport:
    started = validator.seconds["validate"]
    checks = DataChecks(validator, manifest, root, min_images_per_class, train_split)
    return _report(name, checks.manifest_outcomes(), validator, started)


def validate_splits(
    validator: Validator,
    manifest: pd.DataFrame,
    splits: Splits,
    name: str,
    root: str | Path,
    min_images_per_class: int,
    train_split: str,
) -> ValidationReport:
    started = validator.seconds["validate"]
    checks = DataChecks(validator, manifest, root, min_images_per_class, train_split)
    return _report(name, checks.split_outcomes(name, splits), validator, started)


def _report(
    name: str, outcomes: list[ExpectationOutcome], validator: Validator, validate_started: float
) -> ValidationReport:
    seconds = {
        "gx_import": validator.seconds["gx_import"],
        "gx_context": validator.seconds["gx_context"],
        "validate": validator.seconds["validate"] - validate_started,
    }
    return ValidationReport(name, outcomes, seconds)


def validate_study_files(
    dataset: DatasetParams, manifest_path: str | Path, split_dirs: Sequence[str | Path]
) -> list[ValidationReport]:
    """The manifest's report (named after the dataset), then one per split directory (named after
    the directory), all from one GX context (GX takes seconds to start)."""
    manifest = read_manifest(manifest_path)
    splits = [(Path(d).name, read_splits(d)) for d in split_dirs]
    validator = Validator()
    log.info(
        "Great Expectations: import %.2f s, context %.2f s",
        validator.seconds["gx_import"],
        validator.seconds["gx_context"],
    )
    # What every table is checked against: the image root, the class minimum, the training split.
    shared = (dataset.root, dataset.min_images_per_class, dataset.train_split)
    reports = [validate_manifest(validator, manifest, *shared, name=dataset.name)]
    reports += [validate_splits(validator, manifest, s, name, *shared) for name, s in splits]
    return reports


def failed_validation(reports: Sequence[ValidationReport], where: str | Path) -> None:
    """Raise one ``DataValidationError`` naming every failed expectation of ``reports`` (whose
    files are in ``where``); nothing when all passed."""
    messages = []
    for report in reports:
        try:
            report.raise_if_failed()
        except DataValidationError as err:
            messages.append(err.message)
    if messages:
        raise DataValidationError(
            "\n".join(messages),
            hint=f"reports in {where}; fix the data or the split parameters, "
            "nothing downstream runs",
        )
