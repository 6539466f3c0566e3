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
from modelupgrade.data.vector_table import is_vector_table, read_vector_table
from modelupgrade.errors import UserError
from modelupgrade.evaluation import RetrievalEvaluator

# A transform is timed on this many vectors, a model on up to this many images, in rounds of at
# least TIMING_SECONDS each, so that one timer tick or one cold cache does not decide a cost that
# is multiplied by millions (``timed_per_row``).
TIMING_ROWS, TIMING_IMAGES, TIMING_SECONDS = 8192, 1024, 0.2


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


def check_model_dir(path: Path, what: str, vectors_allowed: bool = False) -> Path:
    """``path`` when it is a model directory (or, with ``vectors_allowed``, a vector table of
    ``item_id`` and ``embedding``: an old model that cannot run any more)."""
    from modelupgrade.cards import CARD_FILE

    path = Path(path)
    if vectors_allowed and is_vector_table(path):
        return path
    if not (path / CARD_FILE).is_file():
        raise UserError(
            f"{what} {path} is not a model directory (no {CARD_FILE})"
            + (" nor a vector table" if vectors_allowed else ""),
            hint="pass a directory written by `modelupgrade train` or `modelupgrade adopt`"
            + (", or a parquet of item_id and embedding" if vectors_allowed else ""),
        )
    return path


def read_labelled(path: Path, what: str) -> pd.DataFrame:
    """Labelled images: a plain table (item_id, label, path; paths anywhere) or a split file
    (``modelupgrade.data.image_table``)."""
    from modelupgrade.data.image_table import read_labelled_images

    return read_labelled_images(path, what)


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
        query_rows = read_labelled(query, "the query file")
        gallery_rows = read_labelled(gallery, "the gallery file")
        evaluator = RetrievalEvaluator.from_frames(
            params.evaluation, query_rows, gallery_rows, device
        )
        return PlanSample(
            fit=frame,
            query=query_rows,
            gallery=gallery_rows,
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
    timing: Timing | None

    @property
    def seconds_per_image(self) -> float | None:
        return None if self.timing is None else self.timing.best


def embed_sample(
    params: Params, model_dir: Path, sample: PlanSample, device: torch.device
) -> SampleEmbeddings:
    """Embed the sample's parts with the model in ``model_dir`` and time its forward passes
    (``seconds_per_image``); a vector table (an old model that cannot run) is looked up."""
    from modelupgrade.models import embed, load_model, runs_on_images
    from modelupgrade.training.generation import load_split_images, split_item_ids

    parts = [sample.fit, sample.query, sample.gallery]
    names = ("fit", "query", "gallery")
    sizes = [len(p) for p in parts]
    bounds = np.cumsum([0, *sizes])
    if is_vector_table(model_dir):
        table = read_vector_table(model_dir, "the old model's vector table")
        looked_up = np.concatenate(
            [
                table.vectors_of(split_item_ids(part, name), f"the sample's {name} part")
                for part, name in zip(parts, names, strict=True)
            ]
        )
        looked_up /= np.maximum(np.linalg.norm(looked_up, axis=1, keepdims=True), 1e-12)
        fit, query, gallery = (looked_up[bounds[i] : bounds[i + 1]] for i in range(3))
        return SampleEmbeddings(fit, query, gallery, None)
    model = load_model(model_dir, device)
    timing = None
    if runs_on_images(model):
        images = load_split_images(pd.concat(parts, ignore_index=True), params)
        batch = params.training.eval_batch_size
        vectors = embed(model, images, batch, device)
        block = images[: min(len(images), TIMING_IMAGES)]
        timing = timed_per_row(lambda: embed(model, block, batch, device), len(block))
    else:
        vectors = np.concatenate(
            [
                # An embeddings-only model (PrecomputedEmbeddings) looks its vectors up.
                model.lookup(split_item_ids(part, name), name).cpu().numpy()  # type: ignore[operator]
                for part, name in zip(parts, names, strict=True)
            ]
        )
    fit, query, gallery = (vectors[bounds[i] : bounds[i + 1]] for i in range(3))
    return SampleEmbeddings(fit, query, gallery, timing)


@dataclass(frozen=True)
class Timing:
    """Seconds per row of a cost, timed in ``TIMING_ROUNDS`` rounds: the fastest round's
    (``best``, what the plan costs with) and every round's, whose spread says how stable the
    estimate is on this machine now."""

    best: float
    rounds: tuple[float, ...]

    @property
    def spread(self) -> float:
        """The slowest round over the fastest (1.0: every round alike)."""
        return max(self.rounds) / self.best if self.best > 0 else 1.0


# Rounds a cost is timed in: each at least one call and TIMING_SECONDS long; the rounds' fastest
# calls are compared to say how stable the cost is.
TIMING_ROUNDS = 3


def timed_per_row(run: Callable[[], Any], rows: int) -> Timing:
    """Seconds per row of ``run``: after an untimed call, ``TIMING_ROUNDS`` rounds of timed calls
    (each round at least one call, more while it is shorter than ``TIMING_SECONDS``); ``run``
    returns host arrays, so a GPU's work is finished when it returns. The cost is the fastest
    call, not the mean: on a shared machine the other processes only ever add time, and a cost
    multiplied by millions should not carry a neighbour's burst; the rounds' spread says how
    much they added."""
    run()
    rounds = []
    for _ in range(TIMING_ROUNDS):
        times: list[float] = []
        while not times or sum(times) < TIMING_SECONDS:
            started = time.perf_counter()
            run()
            times.append(time.perf_counter() - started)
        rounds.append(min(times) / rows)
    return Timing(min(rounds), tuple(rounds))


def fastest_per_row(run: Callable[[], Any], rows: int) -> float:
    """Seconds per row of ``run``'s fastest call (``timed_per_row``)."""
    return timed_per_row(run, rows).best


def seconds_per_vector(
    transform: Callable[[np.ndarray], np.ndarray], vectors: np.ndarray
) -> Timing:
    """Seconds ``transform`` takes per vector, on the vectors tiled to ``TIMING_ROWS`` rows."""
    count = max(TIMING_ROWS, len(vectors))
    block = np.ascontiguousarray(np.resize(vectors, (count, *vectors.shape[1:])))
    return timed_per_row(lambda: transform(block), count)
