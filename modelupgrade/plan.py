"""An upgrade plan for a gallery: every way from the old model to the new one, measured on a
labelled sample of images and costed for the real gallery's size (``modelupgrade plan``).

The options, each scored with the project's evaluator (``RetrievalEvaluator``, the headline metric
of ``evaluation``) and its negative-flip rate against the old system (``metrics``):

* ``keep-old``: M(old, old), nothing to do;
* ``reembed``: M(new, new) after a full backfill: every gallery image embedded again by the new
  model, timed on this machine while the sample is embedded;
* ``query/<kind>``: a training-free query-side adapter (``procrustes_query``, ``affine_query``,
  ``residual_mlp_query``), M(ψ_rev(new query), old gallery): nothing is backfilled, every query
  pays the adapter;
* ``gallery/<kind>``: a gallery-side adapter (``procrustes``, ``affine``, ``residual_mlp``),
  M(new query, ψ(old gallery)): every stored vector transformed once, no image embedded;
* ``compatible``: a BCT-family successor. Given one (``compatible_model``), it is scored without a
  backfill, M(compatible, old), and after one, M(compatible, compatible). Without one it is listed
  with its training time estimated from a short training probe on this machine (``train_model``
  for one epoch on part of the sample) and no quality: it was not trained.

Adapters are fitted on paired embeddings of the sample's fitting part, as the study fits them
(``fit_head``). A plan is measured once (``measure_plan``: the expensive part) and costed for a
gallery size by ``plan_table``, a pure function, so the costs of another gallery size need no new
measurement.

**The recommendation rule** (``recommend``): among the measured options other than keeping the old
model, those whose M is within ``tolerance_pct`` percent of M(new, new) (M ≥ (1 − X/100) ·
M(new, new)) and above M(old, old) are eligible; the cheapest eligible one wins, cost being its
one-time compute (backfill time + adapter fitting or training time; a query adapter's per-query
overhead is reported, not ranked); costs within 10 % or 60 s of the cheapest count as equal
(timing noise, milliseconds of fitting), and the higher M among them wins. A compatible model
passed in is already trained: its training time is shown, not counted. With none eligible the old
model stays. The default X = 5 follows Drift-Adapter's report of 95–99 % of full re-indexing recall.
"""

from __future__ import annotations

import logging
import math
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np
import pandas as pd
import torch

from modelupgrade.config import Params
from modelupgrade.config.heads import HeadParams
from modelupgrade.errors import UserError
from modelupgrade.evaluation import PairResult, RetrievalEvaluator
from modelupgrade.io import atomic_path, write_json, write_text
from modelupgrade.metrics import negative_flip_rate
from modelupgrade.retrieval.distance import Distance

log = logging.getLogger(__name__)

PLAN_JSON, PLAN_MARKDOWN, PLAN_CSV = "plan.json", "plan.md", "plan.csv"
QUERY_ADAPTERS = ("procrustes_query", "affine_query", "residual_mlp_query")
GALLERY_ADAPTERS = ("procrustes", "affine", "residual_mlp")
DEFAULT_ADAPTERS = (*QUERY_ADAPTERS, *GALLERY_ADAPTERS)
OptionKind = Literal["keep", "reembed", "query-adapter", "gallery-adapter", "compatible"]
# A transform is timed on this many vectors, a model on up to this many images, each at least
# TIMING_REPEATS times and for TIMING_SECONDS in all, so that one timer tick or one cold cache does
# not decide a cost that is multiplied by millions (``fastest_per_row``).
TIMING_ROWS, TIMING_IMAGES, TIMING_REPEATS, TIMING_SECONDS = 8192, 1024, 3, 0.5
# One-time costs this close to the cheapest eligible option's count as equal (timing noise between
# two models of one architecture, milliseconds of fitting): among them the best M wins.
COST_TIE_FRACTION, COST_TIE_SECONDS = 0.10, 60.0
# Images of the sample the compatible-training probe trains on for one epoch.
TRAINING_PROBE_IMAGES = 1024


# ---------------------------------------------------------------- what is measured


@dataclass(frozen=True)
class OptionMeasure:
    """One option as measured on the sample: its quality and its unit costs on this machine.

    ``metrics`` is None for an option that was not run (compatible fine-tuning not trained).
    """

    name: str
    kind: OptionKind
    description: str
    metrics: dict[str, float] | None = None
    negative_flip_rate: float | None = None
    # One-time costs per gallery item: embedding one image, transforming one stored vector.
    seconds_per_image: float | None = None
    seconds_per_vector: float | None = None
    # Added to every query (a query-side adapter), measured per vector in batches.
    query_overhead_us: float | None = None
    # One-time: fitting the adapter (measured) or training the model (measured or estimated).
    training_seconds: float = 0.0
    training_note: str = ""
    backfill_auc: float | None = None
    backfill_curve: dict[str, list[float]] | None = None
    note: str = ""


@dataclass(frozen=True)
class PlanMeasurements:
    """Everything ``plan_table`` needs: the options and how they were measured."""

    metric: str
    options: list[OptionMeasure]
    device: str
    protocol: dict[str, Any]
    backfill: dict[str, Any]
    models: dict[str, str]

    def option(self, name: str) -> OptionMeasure:
        for option in self.options:
            if option.name == name:
                return option
        raise KeyError(name)


# ---------------------------------------------------------------- the table for a gallery size


@dataclass(frozen=True)
class PlanRow:
    """One option costed for the gallery: the table's row."""

    option: str
    kind: str
    description: str
    M: float | None
    delta_vs_old_pct: float | None
    of_new_new_pct: float | None
    negative_flip_rate: float | None
    images_to_embed: int
    vectors_to_transform: int
    backfill_seconds: float
    training_seconds: float
    one_time_seconds: float
    query_overhead_us: float | None
    backfill_auc: float | None
    note: str


@dataclass(frozen=True)
class Recommendation:
    option: str
    reason: str
    eligible: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class UpgradePlan:
    """The table for one gallery size, its recommendation, and what was measured."""

    gallery_size: int
    tolerance_pct: float
    metric: str
    rows: list[PlanRow]
    recommendation: Recommendation
    measurements: PlanMeasurements

    def row(self, option: str) -> PlanRow:
        for row in self.rows:
            if row.option == option:
                return row
        raise KeyError(option)

    def frame(self) -> pd.DataFrame:
        return pd.DataFrame([asdict(row) for row in self.rows])

    def as_dict(self) -> dict[str, Any]:
        return {
            "gallery_size": self.gallery_size,
            "tolerance_pct": self.tolerance_pct,
            "metric": self.metric,
            "device": self.measurements.device,
            "recommendation": asdict(self.recommendation),
            "rows": [asdict(row) for row in self.rows],
            "measurements": asdict(self.measurements),
        }

    def markdown(self) -> str:
        m = self.metric
        header = (
            f"| option | {m} | Δ vs old | of M(new,new) | neg. flips | images to re-embed | "
            "vectors to transform | backfill time | fit / training | per query | backfill AUC |"
        )
        lines = [
            f"# Upgrade plan for a gallery of {self.gallery_size:,} images",
            "",
            (
                f"Measured on {self.measurements.device}; {m} on "
                f"{self.measurements.protocol['description']}."
            ),
            "",
            header,
            "|" + "---|" * 11,
        ]
        for r in self.rows:
            lines.append(
                f"| {r.option} | {_number(r.M)} | {_percent(r.delta_vs_old_pct, signed=True)} | "
                f"{_percent(r.of_new_new_pct)} | {_number(r.negative_flip_rate)} | "
                f"{r.images_to_embed:,} | {r.vectors_to_transform:,} | "
                f"{duration(r.backfill_seconds)} | {duration(r.training_seconds)} | "
                f"{'' if r.query_overhead_us is None else f'{r.query_overhead_us:.2f} µs'} | "
                f"{_number(r.backfill_auc)} |"
            )
        lines += [
            "",
            f"**Recommended: {self.recommendation.option}.** {self.recommendation.reason}",
        ]
        notes = [f"- {r.option}: {r.note}" for r in self.rows if r.note]
        if notes:
            lines += ["", "Notes:", *notes]
        backfill = self.measurements.backfill
        lines += [
            "",
            (
                f"Backfill curves: {backfill['mode']} serving, {backfill['policy']} order, "
                f"{backfill['points']} points; AUC ({backfill['auc']}) of {backfill['metric']}."
            ),
        ]
        return "\n".join(lines) + "\n"


def _number(value: float | None) -> str:
    return "" if value is None or not math.isfinite(value) else f"{value:.4f}"


def _percent(value: float | None, signed: bool = False) -> str:
    if value is None or not math.isfinite(value):
        return ""
    return f"{value:+.1f}%" if signed else f"{value:.1f}%"


def duration(seconds: float) -> str:
    """A duration a person reads at a glance: µs to days."""
    if seconds == 0:
        return "0"
    for unit, size in (("d", 86400.0), ("h", 3600.0), ("min", 60.0), ("s", 1.0)):
        if seconds >= size:
            return f"{seconds / size:.3g} {unit}"
    return f"{seconds * 1e3:.3g} ms"


def check_plan_settings(gallery_size: int, tolerance_pct: float) -> None:
    if gallery_size <= 0:
        raise UserError(
            f"--gallery-size must be a positive number of images, got {gallery_size}",
            hint="pass the number of images your production gallery holds, e.g. 50000000",
        )
    if not 0 <= tolerance_pct < 100:
        raise UserError(
            f"--tolerance-pct must be in [0, 100), got {tolerance_pct}",
            hint="the share of M(new, new) an option may lose and still be recommended, e.g. 5",
        )


def plan_table(
    measurements: PlanMeasurements, gallery_size: int, tolerance_pct: float = 5.0
) -> UpgradePlan:
    """The plan for a gallery of ``gallery_size`` images: every option's costs, and the
    recommendation (module docstring)."""
    check_plan_settings(gallery_size, tolerance_pct)
    metric = measurements.metric
    old = measurements.option("keep-old").metrics
    new = measurements.option("reembed").metrics
    assert old is not None and new is not None
    m_old, m_new = old[metric], new[metric]
    rows = []
    for option in measurements.options:
        value = None if option.metrics is None else option.metrics[metric]
        images = gallery_size if option.seconds_per_image is not None else 0
        vectors = gallery_size if option.seconds_per_vector is not None else 0
        backfill = images * (option.seconds_per_image or 0.0) + vectors * (
            option.seconds_per_vector or 0.0
        )
        rows.append(
            PlanRow(
                option=option.name,
                kind=option.kind,
                description=option.description,
                M=value,
                delta_vs_old_pct=None
                if value is None or m_old == 0
                else (value - m_old) / m_old * 100,
                of_new_new_pct=None if value is None or m_new == 0 else value / m_new * 100,
                negative_flip_rate=option.negative_flip_rate,
                images_to_embed=images,
                vectors_to_transform=vectors,
                backfill_seconds=backfill,
                training_seconds=option.training_seconds,
                one_time_seconds=backfill + option.training_seconds,
                query_overhead_us=option.query_overhead_us,
                backfill_auc=option.backfill_auc,
                note=" ".join(p for p in (option.training_note, option.note) if p),
            )
        )
    recommendation = recommend(rows, metric, m_old, m_new, tolerance_pct)
    return UpgradePlan(gallery_size, tolerance_pct, metric, rows, recommendation, measurements)


def recommend(
    rows: Sequence[PlanRow], metric: str, m_old: float, m_new: float, tolerance_pct: float
) -> Recommendation:
    """The cheapest measured option within ``tolerance_pct`` % of M(new, new) and above
    M(old, old), the best M among those as cheap as it; the old model when there is none
    (module docstring)."""
    floor = (1 - tolerance_pct / 100) * m_new
    candidates = [r for r in rows if r.kind != "keep" and r.M is not None]
    eligible = [r for r in candidates if r.M is not None and r.M >= floor and r.M > m_old]
    if not eligible:
        return Recommendation(
            "keep-old",
            f"no option beats keeping the old model ({metric} {m_old:.4f}) while staying within "
            f"{tolerance_pct:g}% of re-embedding ({m_new:.4f}); the upgrade is not worth its cost "
            "on this sample.",
        )
    cheapest = min(r.one_time_seconds for r in eligible)
    margin = max(COST_TIE_FRACTION * cheapest, COST_TIE_SECONDS)
    tied = [r for r in eligible if r.one_time_seconds <= cheapest + margin]
    best = max(tied, key=lambda r: (r.M or 0.0, -r.one_time_seconds))
    assert best.M is not None
    reason = (
        f"the cheapest option (one-time {duration(best.one_time_seconds)}) whose {metric} "
        f"{best.M:.4f} is within {tolerance_pct:g}% of re-embedding's {m_new:.4f} "
        f"({best.M / m_new * 100:.1f}% of it) and above the old model's {m_old:.4f} "
        f"({(best.M - m_old) / m_old * 100:+.1f}%)."
    )
    if len(tied) > 1:
        others = ", ".join(f"{r.option} ({r.M:.4f})" for r in tied if r is not best)
        reason += (
            f" As cheap (within {COST_TIE_FRACTION:.0%} or {COST_TIE_SECONDS:g} s) but lower "
            f"{metric}: {others}."
        )
    below = [
        r for r in candidates if r.one_time_seconds < best.one_time_seconds and r not in eligible
    ]
    if below:
        shown = ", ".join(
            f"{r.option} ({metric} {r.M:.4f}, {_percent(r.M / m_new * 100 if m_new else None)} "
            "of re-embedding)"
            for r in below
            if r.M is not None
        )
        reason += f" Cheaper but below the bar: {shown}."
    if best.query_overhead_us is not None:
        reason += f" Every query pays the adapter: {best.query_overhead_us:.2f} µs."
    return Recommendation(best.option, reason, [r.option for r in eligible])


# ---------------------------------------------------------------- the sample


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


# ---------------------------------------------------------------- embedding and timing


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


# ---------------------------------------------------------------- the options


@dataclass
class _Scorer:
    """Scores (query, gallery) vectors with the evaluator, flips counted against old/old."""

    evaluator: RetrievalEvaluator
    old_correct: np.ndarray | None = None

    def __call__(self, query: np.ndarray, gallery: np.ndarray) -> tuple[dict[str, float], float]:
        result: PairResult = self.evaluator.evaluate(query, gallery)
        if self.old_correct is None:
            self.old_correct = result.correct
        return dict(result.metrics), negative_flip_rate(self.old_correct, result.correct)


def adapter_entry(params: Params, kind: str) -> HeadParams:
    """The study's ``adapters.heads`` entry of this kind when params.yaml has one (its options
    and training), else the kind's own defaults."""
    for entry in params.adapters.heads.values():
        if entry.kind == kind:
            return entry
    return HeadParams(kind=kind)


def check_adapters(kinds: Sequence[str]) -> None:
    from modelupgrade.heads.base import HEADS

    for kind in kinds:
        if kind not in DEFAULT_ADAPTERS:
            known = ", ".join(DEFAULT_ADAPTERS)
            if kind in HEADS.names() and getattr(HEADS.get(kind), "takes_old_embedding", False):
                why = "it runs the old model on every query"
            else:
                why = "the plan fits training-free adapters only"
            raise UserError(f"--adapters names {kind!r}: {why}", hint=f"pick from: {known}")


def fit_adapter(
    params: Params,
    kind: str,
    old: SampleEmbeddings,
    new: SampleEmbeddings,
    labels: np.ndarray,
    device: torch.device,
) -> tuple[Any, float]:
    """(the adapter of ``kind`` fitted on the sample's fitting pairs, its fitting seconds)."""
    from modelupgrade.heads.base import EmbeddingPairs, build_head, head_dims
    from modelupgrade.heads.training import fit_head, resolve_training
    from modelupgrade.runtime import seed_everything

    entry = adapter_entry(params, kind)
    training = resolve_training(entry)
    in_dim, out_dim = head_dims(kind, old.fit.shape[1], new.fit.shape[1])
    seed_everything(params.seed)
    head = build_head(
        kind, in_dim, out_dim, training.hidden_dim, training.depth, options=entry.options
    )
    pairs = EmbeddingPairs(old.fit, new.fit, labels)
    result = fit_head(head, pairs, training, device=device, seed=params.seed)
    return head.cpu().eval(), result.seconds


@dataclass(frozen=True)
class CurveSettings:
    """How the backfill curves are drawn: serving mode, ordering policy, grid, AUC."""

    mode: str
    policy: str
    metric: str
    points: int
    auc: str
    distance: Distance
    seed: int
    topk: tuple[int, ...]

    def describe(self) -> dict[str, Any]:
        """The settings that shape the curve (the seed and top-k do not)."""
        return {k: v for k, v in asdict(self).items() if k not in ("seed", "topk")}


def backfill_curve_of(
    settings: CurveSettings,
    sample: PlanSample,
    old_query: np.ndarray,
    old_gallery: np.ndarray,
    new_query: np.ndarray,
    new_gallery: np.ndarray,
    old_logits: np.ndarray | None,
    compatible: bool,
) -> tuple[float | None, dict[str, list[float]] | None, str]:
    """(AUC, curve, note) of a gallery moving from ``old_gallery`` to ``new_gallery`` rows under
    the chosen serving mode and order (the study's simulator); no curve when the mode cannot
    serve this system, with the reason."""
    from modelupgrade.backfill import ServingArrays, auc_mean, auc_trapezoid, backfill_curve
    from modelupgrade.backfill.grid import uniform_grid
    from modelupgrade.ordering import OrderingInputs, build_ordering
    from modelupgrade.serving import build_serving_mode

    n = len(sample.gallery)
    serving = ServingArrays(
        old_query=old_query, old_gallery=old_gallery, new_query=new_query, new_gallery=new_gallery
    )
    mode = build_serving_mode(settings.mode)
    plan = mode.try_plan(serving.forms())
    if plan is None:
        return None, None, f"no backfill curve: {mode.description}"
    policy = build_ordering(settings.policy)
    inputs = OrderingInputs(
        n=n,
        old_logits=old_logits,
        old_state_vectors=old_gallery,
        new_vectors=new_gallery,
        old_state_in_new_space=compatible,
    )
    if not policy.available(inputs):
        return (
            None,
            None,
            f"no backfill curve: the {settings.policy} order needs {policy.description}",
        )
    grid = uniform_grid(settings.points, n)
    query_labels = sample.query["label"].to_numpy(np.int64)
    gallery_labels = sample.gallery["label"].to_numpy(np.int64)
    curve = backfill_curve(
        serving.systems(plan),
        query_labels,
        gallery_labels,
        policy.order_items(inputs, settings.seed),
        grid.cutoffs,
        grid.t,
        self_index=np.arange(n) if sample.leave_one_out else None,
        distance=settings.distance,
        topk=settings.topk,
    )
    values = curve.as_dict()
    metric = settings.metric if settings.metric in values else "top1"
    series = np.asarray(values[metric], dtype=np.float64)
    auc = auc_mean(series) if settings.auc == "auc_mean" else auc_trapezoid(curve.t, series)
    shown = {"t": [float(t) for t in curve.t], metric: series.tolist()}
    return float(auc), shown, ""


def compatible_training_estimate(
    params: Params,
    old_dir: Path,
    new_card: Any,
    architecture: str | None,
    strategy: str,
    sample: PlanSample,
    training_images: int | None,
    device: torch.device,
) -> tuple[float | None, str]:
    """(estimated training seconds, how it was estimated) of a compatible successor: a one-epoch
    probe of ``train_model`` under ``strategy`` on part of the sample times this machine's
    training throughput, scaled to ``params.training.epochs`` over ``training_images`` (default:
    the images the new model was trained on, else the sample's)."""
    from modelupgrade.training import train_model
    from modelupgrade.training.generation import load_split_images

    if strategy not in params.strategies:
        raise UserError(
            f"--compatible-strategy {strategy!r} is not a strategy of params.yaml",
            hint=f"strategies: {', '.join(params.strategies) or 'none'}",
        )
    if architecture is not None:
        if architecture not in params.architectures:
            raise UserError(
                f"--compatible-architecture {architecture!r} is not an architecture of params.yaml",
                hint=f"architectures: {', '.join(params.architectures)}",
            )
        arch, arch_name = params.architectures[architecture], architecture
    elif new_card.architecture is not None:
        arch, arch_name = new_card.architecture, new_card.architecture_name or "new"
    else:
        return None, (
            "training time not measured: the new model was adopted, so no architecture to "
            "fine-tune is known (pass --compatible-architecture NAME)."
        )
    probe = sample.fit.iloc[: min(len(sample.fit), TRAINING_PROBE_IMAGES)].reset_index(drop=True)
    images = load_split_images(probe, params)
    labels = torch.from_numpy(probe["label"].to_numpy(np.int64, copy=True))
    training = params.training.model_copy(update={"epochs": 1})
    with tempfile.TemporaryDirectory(prefix="plan-probe-") as scratch:
        card = train_model(
            architecture=arch,
            architecture_name=arch_name,
            training=training,
            images=images,
            labels=labels,
            out_dir=Path(scratch) / "probe",
            generation=1,
            seed=params.seed,
            device=device,
            strategy_name=strategy,
            strategy_params=params.strategies[strategy],
            old_model_dir=old_dir,
            data={"split": "plan probe"},
            resume_dir=Path(scratch) / "resume",
            progress=False,
            item_ids=probe["item_id"].astype(str).tolist(),
        )
    # train_model returns the card it saved (a ModelCard; a dict where a test stands in for it).
    rate = (
        card["train_images_per_second"] if isinstance(card, dict) else card.train_images_per_second
    )
    assert rate is not None, "train_model's card records its training speed"
    count = training_images or int(new_card.data.get("images") or len(sample.fit))
    epochs = params.training.epochs
    seconds = epochs * count / rate
    return seconds, (
        f"not trained: {strategy} training estimated at {rate:.0f} images/s (a 1-epoch probe on "
        f"{len(probe)} sample images), {epochs} epochs × {count:,} images; quality unknown until "
        "it is trained (pass --compatible-model DIR)."
    )


def measure_plan(
    params: Params,
    old: Path,
    new: Path,
    sample: Path,
    *,
    query: Path | None,
    gallery: Path | None,
    compatible_model: Path | None,
    compatible_architecture: str | None,
    compatible_strategy: str,
    compatible_training_images: int | None,
    adapters: Sequence[str],
    fit_fraction: float,
    backfill_mode: str,
    backfill_policy: str,
) -> PlanMeasurements:
    """Measure every option on the sample (module docstring); ``plan_table`` costs them. The
    options' defaults are the ``plan`` command's (``modelupgrade.commands.plan``)."""
    from modelupgrade.heads.inference import FrozenHead
    from modelupgrade.models import classifier_logits, load_model, read_model_card
    from modelupgrade.ordering import ORDERINGS
    from modelupgrade.runtime import describe_device, select_device
    from modelupgrade.serving import SERVING_MODES
    from modelupgrade.training.generation import apply_cpu_threads

    old, new = check_model_dir(old, "the old model"), check_model_dir(new, "the new model")
    if compatible_model is not None:
        compatible_model = check_model_dir(compatible_model, "the compatible model")
    check_adapters(adapters)
    for name, registry, what in (
        (backfill_mode, SERVING_MODES, "--backfill-mode"),
        (backfill_policy, ORDERINGS, "--backfill-policy"),
    ):
        if name not in registry.names():
            raise UserError(
                f"{what} {name!r} is unknown", hint=f"known: {', '.join(registry.names())}"
            )
    if compatible_training_images is not None and compatible_training_images < 1:
        raise UserError(
            f"--compatible-training-images must be ≥ 1, got {compatible_training_images}"
        )
    device = select_device(params.device)
    apply_cpu_threads(params)
    parts = plan_sample(params, sample, query, gallery, fit_fraction, device)
    metric = params.evaluation.headline_metric
    parts.evaluator.require_metric(metric, "evaluation.headline_metric")

    old_vectors = embed_sample(params, old, parts, device)
    new_vectors = embed_sample(params, new, parts, device)
    if new_vectors.seconds_per_image is None:
        raise UserError(
            f"the new model {new} is embeddings-only: it cannot re-embed the gallery",
            hint="adopt the new model from its weights (timm, torchvision or TorchScript)",
        )
    fit_labels = parts.fit["label"].to_numpy(np.int64)
    score = _Scorer(parts.evaluator)
    cfg = params.backfill
    settings = CurveSettings(
        mode=backfill_mode,
        policy=backfill_policy,
        metric=metric,
        points=cfg.points,
        auc=cfg.primary_auc,
        distance=cfg.distance,
        seed=params.seed,
        topk=tuple(sorted(set(cfg.topk))),
    )
    old_model = load_model(old)
    old_logits = (
        classifier_logits(old_model, old_vectors.gallery)
        if getattr(old_model, "classifier", None) is not None
        else None
    )

    def curve(
        new_query: np.ndarray, new_gallery: np.ndarray, compatible: bool
    ) -> tuple[float | None, dict[str, list[float]] | None, str]:
        return backfill_curve_of(
            settings,
            parts,
            old_vectors.query,
            old_vectors.gallery,
            new_query,
            new_gallery,
            old_logits,
            compatible,
        )

    options: list[OptionMeasure] = []
    metrics, flips = score(old_vectors.query, old_vectors.gallery)
    options.append(
        OptionMeasure("keep-old", "keep", "keep the old model: M(old, old)", metrics, flips)
    )
    metrics, flips = score(new_vectors.query, new_vectors.gallery)
    auc, points, note = curve(new_vectors.query, new_vectors.gallery, False)
    options.append(
        OptionMeasure(
            "reembed",
            "reembed",
            "new model, every gallery image re-embedded: M(new, new)",
            metrics,
            flips,
            seconds_per_image=new_vectors.seconds_per_image,
            backfill_auc=auc,
            backfill_curve=points,
            note=note,
        )
    )
    for kind in adapters:
        head, fit_seconds = fit_adapter(params, kind, old_vectors, new_vectors, fit_labels, device)
        frozen = FrozenHead(head, device)

        def transform(vectors: np.ndarray, frozen: FrozenHead = frozen) -> np.ndarray:
            return frozen.outputs(vectors)["transform"]

        fitted = f"fitted on {len(parts.fit)} pairs in {duration(fit_seconds)}."
        if kind in QUERY_ADAPTERS:
            mapped = transform(new_vectors.query)
            metrics, flips = score(mapped, old_vectors.gallery)
            per_vector = seconds_per_vector(transform, new_vectors.query)
            options.append(
                OptionMeasure(
                    f"query/{kind.removesuffix('_query')}",
                    "query-adapter",
                    f"query-side {kind}, no backfill: M(ψ_rev(new query), old gallery)",
                    metrics,
                    flips,
                    query_overhead_us=per_vector * 1e6,
                    training_seconds=fit_seconds,
                    training_note=fitted,
                )
            )
        else:
            mapped = transform(old_vectors.gallery)
            metrics, flips = score(new_vectors.query, mapped)
            auc, points, note = curve(new_vectors.query, mapped, True)
            options.append(
                OptionMeasure(
                    f"gallery/{kind}",
                    "gallery-adapter",
                    f"gallery-side {kind}, vectors-only backfill: M(new query, ψ(old gallery))",
                    metrics,
                    flips,
                    seconds_per_vector=seconds_per_vector(transform, old_vectors.gallery),
                    training_seconds=fit_seconds,
                    training_note=fitted,
                    backfill_auc=auc,
                    backfill_curve=points,
                    note=note,
                )
            )
    if compatible_model is not None:
        options.extend(
            _compatible_options(
                params, compatible_model, parts, old_vectors.gallery, device, score, curve
            )
        )
    else:
        seconds, how = compatible_training_estimate(
            params,
            old,
            read_model_card(new),
            compatible_architecture,
            compatible_strategy,
            parts,
            compatible_training_images,
            device,
        )
        options.append(
            OptionMeasure(
                "compatible",
                "compatible",
                f"compatible fine-tuning ({compatible_strategy}), not trained",
                training_seconds=seconds or 0.0,
                training_note=how,
            )
        )
    return PlanMeasurements(
        metric=metric,
        options=options,
        device=describe_device(device),
        protocol={
            "description": parts.description,
            "leave_one_out": parts.leave_one_out,
            "fit_pairs": len(parts.fit),
            "queries": len(parts.query),
            "gallery": len(parts.gallery),
            "evaluation": parts.evaluator.protocol_description(),
        },
        backfill=settings.describe(),
        models={
            "old": str(old),
            "new": str(new),
            **({"compatible": str(compatible_model)} if compatible_model else {}),
        },
    )


def _compatible_options(
    params: Params,
    model_dir: Path,
    parts: PlanSample,
    old_gallery: np.ndarray,
    device: torch.device,
    score: _Scorer,
    curve: Callable[..., tuple[float | None, dict[str, list[float]] | None, str]],
) -> list[OptionMeasure]:
    """A trained compatible successor: without a backfill (its queries against the old gallery)
    and after a re-embedding backfill."""
    from modelupgrade.models import read_model_card

    card = read_model_card(model_dir)
    vectors = embed_sample(params, model_dir, parts, device)
    if vectors.seconds_per_image is None:
        raise UserError(
            f"the compatible model {model_dir} is embeddings-only: it cannot embed queries",
            hint="pass a model trained with `modelupgrade train --strategy ...`",
        )
    # Already trained: what it took is shown, not counted, as for the new model itself.
    trained = (
        f"already trained, in {duration(card.train_seconds)} on "
        f"{card.device or 'an unrecorded device'} (its card)."
        if card.train_seconds is not None
        else "already trained (its card records no training time)."
    )
    old_query_metrics, old_flips = score(vectors.query, old_gallery)
    metrics, flips = score(vectors.query, vectors.gallery)
    auc, points, note = curve(vectors.query, vectors.gallery, True)
    return [
        OptionMeasure(
            "compatible",
            "compatible",
            "compatible model, no backfill: M(compatible, old gallery)",
            old_query_metrics,
            old_flips,
            training_note=trained,
        ),
        OptionMeasure(
            "compatible/backfill",
            "compatible",
            "compatible model, every gallery image re-embedded: M(compatible, compatible)",
            metrics,
            flips,
            seconds_per_image=vectors.seconds_per_image,
            training_note=trained,
            backfill_auc=auc,
            backfill_curve=points,
            note=note,
        ),
    ]


def write_plan(plan: UpgradePlan, out: Path) -> list[Path]:
    """plan.json, plan.md and plan.csv in ``out``, the directory written whole or not at all."""
    out = Path(out)
    with atomic_path(out) as tmp:
        tmp.mkdir()
        write_json(tmp / PLAN_JSON, plan.as_dict())
        write_text(tmp / PLAN_MARKDOWN, plan.markdown())
        write_text(tmp / PLAN_CSV, plan.frame().to_csv(index=False))
    return [out / PLAN_JSON, out / PLAN_MARKDOWN, out / PLAN_CSV]
