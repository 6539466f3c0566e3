"""The labelled sample a plan is measured on: its parts (``plan_sample``), each model's vectors of
them and its measured speed (``embed_sample``), and the timing of transforms."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch

from modelupgrade.config import Params
from modelupgrade.errors import UserError
from modelupgrade.evaluation import RetrievalEvaluator

# A transform is timed on this many vectors, a model on up to this many images, each at least
# TIMING_REPEATS times and for TIMING_SECONDS in all, so that one timer tick or one cold cache does
# not decide a cost that is multiplied by millions (``fastest_per_row``).
TIMING_ROWS, TIMING_IMAGES, TIMING_REPEATS, TIMING_SECONDS = 8192, 1024, 3, 0.5


@dataclass(frozen=True)
class PlanSample:
    """The sample's images split by use: the fitting part and the evaluated query and gallery
    rows, with the evaluator of the evaluated part."""

    fit: pd.DataFrame
    query: pd.DataFrame
    gallery: pd.DataFrame
    leave_one_out: bool
    evaluator: RetrievalEvaluator
    description: str


def check_model_dir(path: Path, what: str) -> Path:
    from modelupgrade.cards import CARD_FILE

    path = Path(path)
    if not (path / CARD_FILE).is_file():
        raise UserError(
            f"{what} {path} is not a model directory (no {CARD_FILE})",
            hint="pass a directory written by `modelupgrade train` or `modelupgrade adopt`",
        )
    return path


def read_labelled(path: Path, what: str) -> pd.DataFrame:
    """A split or manifest file with a label per image (and the item ids and image locations
    the pipeline's split files carry)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(f"{what} {path} does not exist", hint="pass a split or manifest parquet")
    frame = pd.read_parquet(path)
    missing = [c for c in ("item_id", "label") if c not in frame.columns]
    if missing or frame.empty:
        raise UserError(
            f"{what} {path} " + (f"has no {', '.join(missing)} column" if missing else "is empty"),
            hint="the sample must be labelled images: a split or manifest parquet with item_id, "
            "label and the image's path/index, as data/splits/<scenario>/*.parquet",
        )
    if frame["label"].isna().any():
        raise UserError(
            f"{what} {path}: {int(frame['label'].isna().sum())} images have no label",
            hint="label every image of the sample (the plan scores retrieval by label)",
        )
    return frame.reset_index(drop=True)


def plan_sample(
    params: Params,
    sample: Path,
    query: Path | None,
    gallery: Path | None,
    fit_fraction: float,
    device: torch.device,
) -> PlanSample:
    """Split the sample: with ``query`` and ``gallery`` the whole sample fits the adapters and
    those two files are evaluated (``evaluation.protocol``); without them a seeded ``fit_fraction``
    of the sample fits and the rest is evaluated leave-one-out, every image a query against the
    others, so that no adapter is scored on the pairs it was fitted on."""
    frame = read_labelled(sample, "the sample")
    if (query is None) != (gallery is None):
        raise UserError(
            "--query and --gallery go together",
            hint="pass both to evaluate on them, or neither to split the sample",
        )
    if query is not None and gallery is not None:
        read_labelled(query, "the query file")
        read_labelled(gallery, "the gallery file")
        evaluator = RetrievalEvaluator.from_split_files(params.evaluation, query, gallery, device)
        return PlanSample(
            fit=frame,
            query=pd.read_parquet(query).reset_index(drop=True),
            gallery=pd.read_parquet(gallery).reset_index(drop=True),
            leave_one_out=evaluator.leave_one_out,
            evaluator=evaluator,
            description=f"{Path(query).name} against {Path(gallery).name} "
            f"({evaluator.num_queries} queries, {evaluator.num_gallery} gallery images)",
        )
    if not 0 < fit_fraction < 1:
        raise UserError(
            f"--fit-fraction must be between 0 and 1, got {fit_fraction}",
            hint="the share of the sample the adapters are fitted on, e.g. 0.5",
        )
    order = np.random.default_rng(params.seed).permutation(len(frame))
    n_fit = round(fit_fraction * len(frame))
    if n_fit < 2 or len(frame) - n_fit < 2:
        raise UserError(
            f"the sample has {len(frame)} images: too few to fit adapters on {n_fit} and "
            f"evaluate on {len(frame) - n_fit}",
            hint="pass a larger sample (hundreds of labelled images or more)",
        )
    fit = frame.iloc[np.sort(order[:n_fit])].reset_index(drop=True)
    held_out = frame.iloc[np.sort(order[n_fit:])].reset_index(drop=True)
    labels = held_out["label"].to_numpy(np.int64)
    evaluator = RetrievalEvaluator(params.evaluation, labels, labels, True, device)
    return PlanSample(
        fit=fit,
        query=held_out,
        gallery=held_out,
        leave_one_out=True,
        evaluator=evaluator,
        description=f"{len(held_out)} held-out images of {Path(sample).name}, leave-one-out "
        f"(adapters fitted on the other {n_fit})",
    )


@dataclass(frozen=True)
class SampleEmbeddings:
    """A model's vectors of the sample's parts, and its measured seconds per image (None for an
    embeddings-only model, which only looks vectors up)."""

    fit: np.ndarray
    query: np.ndarray
    gallery: np.ndarray
    seconds_per_image: float | None


def embed_sample(
    params: Params, model_dir: Path, sample: PlanSample, device: torch.device
) -> SampleEmbeddings:
    """Embed the sample's parts with the model in ``model_dir`` and time its forward passes
    (``seconds_per_image``)."""
    from modelupgrade.models import embed, load_model, runs_on_images
    from modelupgrade.training.generation import load_split_images, split_item_ids

    model = load_model(model_dir, device)
    parts = [sample.fit, sample.query, sample.gallery]
    sizes = [len(p) for p in parts]
    seconds_per_image = None
    if runs_on_images(model):
        images = load_split_images(pd.concat(parts, ignore_index=True), params)
        batch = params.training.eval_batch_size
        vectors = embed(model, images, batch, device)
        block = images[: min(len(images), TIMING_IMAGES)]
        seconds_per_image = fastest_per_row(lambda: embed(model, block, batch, device), len(block))
    else:
        vectors = np.concatenate(
            [
                # An embeddings-only model (PrecomputedEmbeddings) looks its vectors up.
                model.lookup(split_item_ids(part, name), name).cpu().numpy()  # type: ignore[operator]
                for part, name in zip(parts, ("fit", "query", "gallery"), strict=True)
            ]
        )
    bounds = np.cumsum([0, *sizes])
    fit, query, gallery = (vectors[bounds[i] : bounds[i + 1]] for i in range(3))
    return SampleEmbeddings(fit, query, gallery, seconds_per_image)


def fastest_per_row(run: Callable[[], Any], rows: int) -> float:
    """Seconds per row of the fastest of ``TIMING_REPEATS`` timed calls of ``run`` (more while
    they add up to less than ``TIMING_SECONDS``), after an untimed one; ``run`` returns host
    arrays, so a GPU's work is finished when it returns. The fastest, not the mean:
    on a shared machine the other processes only ever add time, and a cost multiplied by
    millions should not carry a neighbour's burst."""
    run()
    times: list[float] = []
    while len(times) < TIMING_REPEATS or sum(times) < TIMING_SECONDS:
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return min(times) / rows


def seconds_per_vector(transform: Callable[[np.ndarray], np.ndarray], vectors: np.ndarray) -> float:
    """Seconds ``transform`` takes per vector, on the vectors tiled to ``TIMING_ROWS`` rows."""
    count = max(TIMING_ROWS, len(vectors))
    block = np.ascontiguousarray(np.resize(vectors, (count, *vectors.shape[1:])))
    return fastest_per_row(lambda: transform(block), count)
