"""Stage: validate the manifest and split directories with Great Expectations; stop on bad data.

    python -m stages.validate --params params.yaml \
        --manifest data/manifests/fashion-mnist.parquet \
        --splits data/splits/extended-data --splits data/splits/sequential \
        --out-dir data/validation

Writes <out-dir>/<dataset.name>.json for the manifest and <out-dir>/<split dir name>.json for each
split directory (all reports are written first), then exits non-zero naming every failed
expectation. One GX context serves the whole run (GX takes seconds to import). Reads ``dataset``
(root, train_split, min_images_per_class).
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Sequence
from pathlib import Path

from modelupgrade.data import read_manifest, read_splits
from modelupgrade.data.validation import ValidationReport, Validator, validate_manifest, validate_splits
from modelupgrade.data.split_files import INFO_FILE
from modelupgrade.errors import DataValidationError, UserError, exit_on_user_error
from modelupgrade.io import write_json
from modelupgrade.plugins import load_params
from modelupgrade.registry import track_stage
from modelupgrade.runtime import setup_logging

log = logging.getLogger("stages.validate")


def run(
    params_path: str | Path,
    manifest_path: str | Path,
    split_dirs: Sequence[str | Path],
    out_dir: str | Path,
) -> list[ValidationReport]:
    params = load_params(params_path)
    dataset = params.dataset
    asked = {"manifest": manifest_path, "splits": [str(d) for d in split_dirs], "out_dir": out_dir}
    with track_stage("validate", params, arguments=asked) as stage:
        stage.log_params({"dataset": dataset})
        manifest = read_manifest(manifest_path)
        splits = [(Path(d).name, read_splits(d)) for d in split_dirs]
        started = time.perf_counter()
        validator = Validator()
        log.info("Great Expectations: import %.2f s, context %.2f s",
                 validator.seconds["gx_import"], validator.seconds["gx_context"])
        shared = {"root": dataset.root, "min_images_per_class": dataset.min_images_per_class,
                  "train_split": dataset.train_split}
        reports = [validate_manifest(validator, manifest, name=dataset.name, **shared)]
        reports += [validate_splits(validator, manifest, s, name=name, **shared) for name, s in splits]
        for report in reports:
            report_path = Path(out_dir) / f"{report.name}.json"
            write_json(report_path, report.to_dict())
            # Logged before the verdict: the reports matter most when validation fails.
            stage.log_artifact(report_path, "validation")
            stage.log_metrics({f"{report.name}.expectations": len(report.outcomes),
                               f"{report.name}.failed": len(report.failures)})
            log.info("%s: %d expectations, %d failed, %.2f s", report.name, len(report.outcomes),
                     len(report.failures), report.seconds["validate"])
        log.info("validation finished in %.2f s", time.perf_counter() - started)
        failed = [r for r in reports if not r.success]
        if failed:
            messages = []
            for report in failed:
                try:
                    report.raise_if_failed()
                except DataValidationError as err:
                    messages.append(err.message)
            raise DataValidationError(
                "\n".join(messages),
                hint=f"reports in {out_dir}; fix the data or the split parameters, nothing downstream runs",
            )
    return reports


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stages.validate", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--splits", action="append", default=[], help="a split directory (repeatable)")
    parser.add_argument("--splits-root",
                        help="validate every split directory under this root (each holds split_info.json)")
    parser.add_argument("--out-dir", default="data/validation")
    args = parser.parse_args(argv)
    setup_logging()
    split_dirs = list(args.splits)
    if args.splits_root:
        root = Path(args.splits_root)
        if not root.is_dir():
            raise UserError(f"--splits-root {root} is not a directory", hint="run the split stage first")
        split_dirs += sorted(str(d) for d in root.iterdir() if (d / INFO_FILE).is_file())
    run(args.params, args.manifest, split_dirs, args.out_dir)


if __name__ == "__main__":
    main()
