"""Stage: scan the configured dataset into its manifest (one table for any format).

    python -m stages.prepare --params params.yaml --out data/manifests/fashion-mnist.parquet

Reads the ``dataset`` section of params.yaml; reads no pixels except to check array files.
"""

from __future__ import annotations

import argparse
import logging
import time
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from modelupgrade.data import build_manifest
from modelupgrade.errors import exit_on_user_error
from modelupgrade.io import save_parquet
from modelupgrade.plugins import load_params
from modelupgrade.registry import track_stage
from modelupgrade.runtime import setup_logging

log = logging.getLogger("stages.prepare")


def run(params_path: str | Path, out: str | Path) -> pd.DataFrame:
    params = load_params(params_path)
    with track_stage("prepare", params, arguments={"out": out}) as stage:
        stage.log_params({"dataset": params.dataset})
        started = time.perf_counter()
        manifest = build_manifest(params.dataset)
        save_parquet(out, manifest)
        counts = manifest.groupby("source_split").size().to_dict()
        stage.log_metrics({"images": len(manifest), "classes": manifest["label"].nunique(),
                           **{f"images.{split}": count for split, count in counts.items()}})
    log.info(
        "manifest of %s (%s loader): %d images, %d classes, per source split %s -> %s in %.2f s",
        params.dataset.name, params.dataset.loader, len(manifest), manifest["label"].nunique(),
        counts, out, time.perf_counter() - started,
    )
    return manifest


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m stages.prepare", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--out", required=True, help="manifest parquet to write")
    args = parser.parse_args(argv)
    setup_logging()
    run(args.params, args.out)


if __name__ == "__main__":
    main()
