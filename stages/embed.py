"""Stage: embed the images of one or more split files with a trained model.

    python -m stages.embed --params params.yaml --model models/extended-data/gen1-bct \
        --split data/splits/extended-data/query.parquet data/splits/extended-data/gallery.parquet \
        --out-dir embeddings/extended-data/gen1-bct

writes ``<out-dir>/<split file stem>.npy`` (float32 (N, D), L2-normalised, rows in the split file's
order) for every split; ``--out file.npy`` names the output of a single split instead. The images of
all splits are decoded once, in one call.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from modelupgrade.config import Params
from modelupgrade.errors import exit_on_user_error
from modelupgrade.plugins import load_params
from modelupgrade.registry import track_stage
from modelupgrade.runtime import setup_logging
from modelupgrade.training.generation import embed_splits
# A name of this module that run() passes on: tests replace the image decoder here.
from modelupgrade.training.generation import load_split_images as load_images


def run(
    params: Params,
    model_dir: str | Path,
    splits: Sequence[str | Path],
    out: str | Path | None = None,
    out_dir: str | Path | None = None,
    logits: bool = False,
) -> list[Path]:
    """Embed every split with the model; returns the written paths.

    ``logits`` also writes ``<stem>_logits.npy`` beside each output: the model's classifier logits
    on its embeddings, which order the backfill by old-model confidence or entropy.
    """
    asked = {"model": model_dir, "splits": [str(s) for s in splits], "out": out, "out_dir": out_dir, "logits": logits}
    with track_stage("embed", params, run_name=f"embed@{model_dir}", arguments=asked) as stage:
        stage.log_params({"dataset": params.dataset, "training.eval_batch_size": params.training.eval_batch_size})
        written = embed_splits(params, model_dir, splits, out=out, out_dir=out_dir, logits=logits,
                               load_images=load_images)
        shapes = {path.stem: np.load(path, mmap_mode="r").shape for path in written}
        stage.log_metrics({f"{stem}.{name}": size for stem, shape in shapes.items()
                           for name, size in zip(("rows", "dim"), shape, strict=True)})
    return written


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--model", required=True, help="trained model directory")
    parser.add_argument("--split", nargs="+", required=True, help="split parquet file(s)")
    parser.add_argument("--out", help="output .npy (one split)")
    parser.add_argument("--out-dir", help="output directory: <out-dir>/<split stem>.npy per split")
    parser.add_argument("--logits", action="store_true",
                        help="also write <stem>_logits.npy: the classifier's logits (backfill ordering)")
    return parser


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    setup_logging()
    run(load_params(args.params), args.model, args.split, out=args.out, out_dir=args.out_dir, logits=args.logits)


if __name__ == "__main__":
    main()
