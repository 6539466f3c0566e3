"""The data stages: scan the dataset into a manifest, cut it into splits, validate both.

Each function is one DVC stage (``prepare``, ``split``, ``validate``) and a task of the flows; its
signature and docstring are its command line (``modelupgrade.cli.arguments``). Paths left out are
the study's (``modelupgrade.layout``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from modelupgrade.config import Params
from modelupgrade.errors import UserError
from modelupgrade.json_data import JsonObject, json_record
from modelupgrade.layout import SEQUENTIAL, StudyLayout

if TYPE_CHECKING:
    from modelupgrade.data.validation import ValidationReport

log = logging.getLogger(__name__)


@dataclass
class Manifest:
    """A written manifest: where, and how many images of how many classes per source split."""

    path: Path
    images: int
    classes: int
    images_per_split: dict[str, int]

    def as_dict(self) -> JsonObject:
        return json_record(self)

    def describe(self) -> str:
        return (
            f"manifest {self.path}: {self.images} images, {self.classes} classes, "
            f"per source split {self.images_per_split}"
        )


def prepare(params: Params, out: Path | None = None) -> Manifest:
    """Scan the configured dataset into its manifest (one table for any format).

    Reads the ``dataset`` section of params.yaml; reads no pixels except to check array files.

    Args:
        params: the params file: its dataset section
        out: manifest parquet to write (default: data/manifests/<dataset.name>.parquet)
    """
    from modelupgrade.data import build_manifest
    from modelupgrade.io import save_parquet
    from modelupgrade.registry import track_stage

    out = out or StudyLayout().manifest(params.dataset.name)
    with track_stage("prepare", params, arguments={"out": out}) as stage:
        stage.log_params({"dataset": params.dataset})
        started = time.perf_counter()
        manifest = build_manifest(params.dataset)
        save_parquet(out, manifest)
        counts = {str(k): int(v) for k, v in manifest.groupby("source_split").size().items()}
        classes = int(manifest["label"].nunique())
        stage.log_metrics(
            {
                "images": len(manifest),
                "classes": classes,
                **{f"images.{split}": count for split, count in counts.items()},
            }
        )
    log.info(
        "manifest of %s (%s loader) -> %s in %.2f s",
        params.dataset.name,
        params.dataset.loader,
        out,
        time.perf_counter() - started,
    )
    return Manifest(Path(out), len(manifest), classes, counts)


@dataclass
class SplitFiles:
    """A written directory of split files and the size of each split."""

    name: str
    path: Path
    sizes: dict[str, dict[str, int]]

    def as_dict(self) -> JsonObject:
        return json_record(self)

    def describe(self) -> str:
        lines = [f"{self.name} -> {self.path}:"]
        lines += [
            f"  {split:<10} {size['images']} images, {size['classes']} classes"
            for split, size in self.sizes.items()
        ]
        return "\n".join(lines)


def split(
    params: Params,
    manifest: Path | None = None,
    out: Path | None = None,
    scenario: str | None = None,
    sequential: bool = False,
) -> SplitFiles:
    """Cut the manifest into a scenario's splits, or into sequential growing snapshots.

    A scenario directory gets old_train, new_train, query and gallery (.parquet, rows of the
    manifest) and split_info.json; the sequential directory gets gen0, gen1, ..., query and
    gallery. Reads seed, dataset (train_split, max_train_per_class), scenarios.<name>,
    evaluation_split and sequential. The same inputs and seed give byte-identical files.

    Args:
        params: the params file
        manifest: the manifest parquet (default: data/manifests/<dataset.name>.parquet)
        out: directory of split files to (re)write (default: data/splits/<scenario or sequential>)
        scenario: a key of 'scenarios' in params.yaml (or give --sequential)
        sequential: growing snapshots gen0, gen1, ... for sequential upgrades
    """
    from modelupgrade.data import (
        make_scenario_splits,
        make_sequential_snapshots,
        read_manifest,
        write_splits,
    )
    from modelupgrade.data.split_files import INFO_FILE
    from modelupgrade.registry import track_stage

    if (scenario is None) == (not sequential):
        raise UserError("give either --scenario NAME or --sequential (exactly one)")
    layout = StudyLayout()
    name = SEQUENTIAL if sequential else str(scenario)
    manifest = manifest or layout.manifest(params.dataset.name)
    out = out or layout.splits(name)
    asked = {"manifest": manifest, "out": out, "scenario": scenario, "sequential": sequential}
    with track_stage("split", params, run_name=f"split@{name}", arguments=asked) as stage:
        stage.set_tags({"scenario": name})
        setting = params.sequential if sequential else params.scenarios.get(name)
        stage.log_params(
            {
                "seed": params.seed,
                "dataset": params.dataset,
                "evaluation_split": params.evaluation_split,
                SEQUENTIAL if sequential else "scenario": setting,
            }
        )
        frame = read_manifest(manifest)
        started = time.perf_counter()
        if sequential:
            splits = make_sequential_snapshots(
                frame, params.sequential, params.dataset, params.evaluation_split, params.seed
            )
        else:
            splits = make_scenario_splits(
                frame, params.scenario(name), params.dataset, params.evaluation_split, params.seed
            )
        splits.info["name"] = name
        write_splits(out, splits)
        stage.log_metrics(splits.sizes())
        stage.log_artifact(Path(out) / INFO_FILE, "split")
    log.info("%s -> %s in %.2f s", name, out, time.perf_counter() - started)
    return SplitFiles(name, Path(out), splits.sizes())


@dataclass
class Validation:
    """The validation reports written, one per table."""

    reports: list[ValidationReport]
    out_dir: Path

    def as_dict(self) -> list[JsonObject]:
        return [r.to_dict() for r in self.reports]

    def describe(self) -> str:
        return "\n".join(
            f"{r.name}: {len(r.outcomes)} expectations, {len(r.failures)} failed "
            f"({self.out_dir / (r.name + '.json')})"
            for r in self.reports
        )


def validate(
    params: Params,
    manifest: Path | None = None,
    splits: Sequence[Path] = (),
    splits_root: Path | None = None,
    out_dir: Path | None = None,
) -> Validation:
    """Validate the manifest and split directories with Great Expectations; stop on bad data.

    Writes <out-dir>/<dataset.name>.json for the manifest and <out-dir>/<split dir name>.json for
    each split directory (all reports are written first), then fails naming every failed
    expectation. Reads dataset (root, train_split, min_images_per_class).

    Args:
        params: the params file: its dataset section
        manifest: the manifest parquet (default: data/manifests/<dataset.name>.parquet)
        splits: split directories to validate
        splits_root: also validate every split directory under this root (each holds
            split_info.json)
        out_dir: where the reports go (default: data/validation)
    """
    from modelupgrade.data.split_files import split_directories
    from modelupgrade.data.validation import failed_validation, validate_study_files
    from modelupgrade.io import write_json
    from modelupgrade.registry import track_stage

    layout = StudyLayout()
    manifest = manifest or layout.manifest(params.dataset.name)
    out_dir = out_dir or layout.validation
    split_dirs = [*splits, *(split_directories(splits_root) if splits_root else [])]
    asked = {"manifest": manifest, "splits": [str(d) for d in split_dirs], "out_dir": out_dir}
    with track_stage("validate", params, arguments=asked) as stage:
        stage.log_params({"dataset": params.dataset})
        started = time.perf_counter()
        reports = validate_study_files(params.dataset, manifest, split_dirs)
        for report in reports:
            report_path = Path(out_dir) / f"{report.name}.json"
            write_json(report_path, report.to_dict())
            # Logged before the verdict: the reports matter most when validation fails.
            stage.log_artifact(report_path, "validation")
            stage.log_metrics(
                {
                    f"{report.name}.expectations": len(report.outcomes),
                    f"{report.name}.failed": len(report.failures),
                }
            )
            log.info(
                "%s: %d expectations, %d failed, %.2f s",
                report.name,
                len(report.outcomes),
                len(report.failures),
                report.seconds["validate"],
            )
        log.info("validation finished in %.2f s", time.perf_counter() - started)
        failed_validation(reports, out_dir)
    return Validation(reports, Path(out_dir))
