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
import logging
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pandas as pd

from modelupgrade.config import Params, load_params
from modelupgrade.errors import UserError, exit_on_user_error
from modelupgrade.io import save_npy
from modelupgrade.models import classifier_logits, embed, load_model
from modelupgrade.runtime import select_device, setup_logging
from stages.train import apply_cpu_threads, load_images, read_split

log = logging.getLogger("stages.embed")


def output_paths(splits: Sequence[str | Path], out: str | Path | None, out_dir: str | Path | None) -> list[Path]:
    if (out is None) == (out_dir is None):
        raise UserError("pass exactly one of --out (one split) and --out-dir")
    if out is not None:
        if len(splits) != 1:
            raise UserError(f"--out names one file but {len(splits)} splits were given", hint="use --out-dir")
        return [Path(out)]
    stems = [Path(s).stem for s in splits]
    if len(set(stems)) != len(stems):
        raise UserError(f"split files share a name ({', '.join(stems)}); their outputs would collide")
    return [Path(out_dir) / f"{stem}.npy" for stem in stems]


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
    if not splits:
        raise UserError("no split given", hint="pass --split <parquet> [...]")
    targets = output_paths(splits, out, out_dir)
    device = select_device(params.device)
    apply_cpu_threads(params)
    model = load_model(model_dir, device)
    frames = [read_split(s) for s in splits]
    images = load_images(pd.concat(frames, ignore_index=True), params)
    embeddings = embed(model, images, params.training.eval_batch_size, device)
    written = list(targets)
    start = 0
    for frame, target, split in zip(frames, targets, splits):
        part = np.ascontiguousarray(embeddings[start : start + len(frame)])
        start += len(frame)
        save_npy(target, part)
        log.info("embedded %s with %s: %s → %s", split, model_dir, part.shape, target)
        if logits:
            logits_path = target.with_name(f"{target.stem}_logits.npy")
            save_npy(logits_path, classifier_logits(model, part))
            written.append(logits_path)
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
