"""Stage: cut the manifest into a scenario's splits, or into sequential growing snapshots.

    python -m stages.split --params params.yaml --manifest data/manifests/fashion-mnist.parquet \
        --scenario extended-data --out data/splits/extended-data
    python -m stages.split --params params.yaml --manifest data/manifests/fashion-mnist.parquet \
        --sequential --out data/splits/sequential

A scenario directory gets old_train, new_train, query and gallery (.parquet, rows of the manifest)
and split_info.json; the sequential directory gets gen0, gen1, ..., query and gallery. Reads
``seed``, ``dataset`` (train_split, max_train_per_class), ``scenarios.<name>``, ``evaluation_split``
and ``sequential``. The same inputs and seed give byte-identical files.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Sequence
from pathlib import Path

from modelupgrade.data import (
    Splits,
    make_scenario_splits,
    make_sequential_snapshots,
    read_manifest,
    write_splits,
)
from modelupgrade.data.split_files import INFO_FILE
from modelupgrade.errors import UserError, exit_on_user_error
from modelupgrade.plugins import load_params
from modelupgrade.registry import track_stage
from modelupgrade.runtime import setup_logging

log = logging.getLogger("stages.split")


def run(
    params_path: str | Path,
    manifest_path: str | Path,
    out: str | Path,
    scenario: str | None = None,
    sequential: bool = False,
) -> Splits:
    if (scenario is None) == (not sequential):
        raise UserError("give either --scenario NAME or --sequential (exactly one)")
    params = load_params(params_path)
    name = "sequential" if sequential else scenario
    asked = {"manifest": manifest_path, "out": out, "scenario": scenario, "sequential": sequential}
    with track_stage("split", params, run_name=f"split@{name}", arguments=asked) as stage:
        stage.set_tags({"scenario": name})
        stage.log_params({"seed": params.seed, "dataset": params.dataset, "evaluation_split": params.evaluation_split,
                          "sequential" if sequential else "scenario":
                              params.sequential if sequential else params.scenarios.get(scenario)})
        manifest = read_manifest(manifest_path)
        started = time.perf_counter()
        if sequential:
            splits = make_sequential_snapshots(
                manifest, params.sequential, params.dataset, params.evaluation_split, params.seed
            )
        else:
            splits = make_scenario_splits(
                manifest, params.scenario(scenario), params.dataset, params.evaluation_split, params.seed
            )
        splits.info["name"] = name
        write_splits(out, splits)
        stage.log_metrics(splits.sizes())
        stage.log_artifact(Path(out) / INFO_FILE, "split")
    log.info("%s -> %s in %.2f s: %s", splits.info["name"], out, time.perf_counter() - started, splits.sizes())
    return splits


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stages.split", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--manifest", required=True)
    parser.add_argument("--out", required=True, help="directory of split files to (re)write")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--scenario", help="a key of 'scenarios' in params.yaml")
    which.add_argument("--sequential", action="store_true", help="growing snapshots gen0, gen1, ...")
    args = parser.parse_args(argv)
    setup_logging()
    run(args.params, args.manifest, args.out, scenario=args.scenario, sequential=args.sequential)


if __name__ == "__main__":
    main()
