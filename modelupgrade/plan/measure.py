"""Every option measured on the sample (``measure_plan``): the old and the re-embedded gallery,
training-free adapters fitted on the sample, a compatible successor given or its training
estimated, each with its backfill curve."""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from modelupgrade.config import Params
from modelupgrade.config.heads import HeadParams
from modelupgrade.errors import UserError
from modelupgrade.evaluation import PairResult, RetrievalEvaluator
from modelupgrade.metrics import negative_flip_rate
from modelupgrade.plan.records import OptionMeasure, PlanMeasurements, duration
from modelupgrade.plan.sample import (
    PlanSample,
    SampleEmbeddings,
    check_model_dir,
    embed_sample,
    plan_sample,
    seconds_per_vector,
)
from modelupgrade.retrieval.distance import Distance

QUERY_ADAPTERS = ("procrustes_query", "affine_query", "residual_mlp_query")
GALLERY_ADAPTERS = ("procrustes", "affine", "residual_mlp")
DEFAULT_ADAPTERS = (*QUERY_ADAPTERS, *GALLERY_ADAPTERS)
# Images of the sample the compatible-training probe trains on for one epoch.
TRAINING_PROBE_IMAGES = 1024


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


def check_choices(
    adapters: Sequence[str],
    backfill_mode: str,
    backfill_policy: str,
    compatible_training_images: int | None,
) -> None:
    """Refuse adapters, a serving mode, an ordering policy or an image count the plan cannot
    use, before anything is measured."""
    from modelupgrade.ordering import ORDERINGS
    from modelupgrade.serving import SERVING_MODES

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


Curve = tuple[float | None, dict[str, list[float]] | None, str]


@dataclass
class _Measuring:
    """The sample, both models' vectors of it and how options are scored: what measuring each
    option needs."""

    params: Params
    parts: PlanSample
    old_vectors: SampleEmbeddings
    new_vectors: SampleEmbeddings
    score: _Scorer
    settings: CurveSettings
    old_logits: np.ndarray | None
    device: torch.device

    def curve(self, new_query: np.ndarray, new_gallery: np.ndarray, compatible: bool) -> Curve:
        return backfill_curve_of(
            self.settings,
            self.parts,
            self.old_vectors.query,
            self.old_vectors.gallery,
            new_query,
            new_gallery,
            self.old_logits,
            compatible,
        )

    def baselines(self) -> list[OptionMeasure]:
        """Keeping the old model, and re-embedding the whole gallery with the new one."""
        old, new = self.old_vectors, self.new_vectors
        metrics, flips = self.score(old.query, old.gallery)
        keep = OptionMeasure("keep-old", "keep", "keep the old model: M(old, old)", metrics, flips)
        metrics, flips = self.score(new.query, new.gallery)
        auc, points, note = self.curve(new.query, new.gallery, False)
        reembed = OptionMeasure(
            "reembed",
            "reembed",
            "new model, every gallery image re-embedded: M(new, new)",
            metrics,
            flips,
            seconds_per_image=new.seconds_per_image,
            backfill_auc=auc,
            backfill_curve=points,
            note=note,
        )
        return [keep, reembed]

    def adapter(self, kind: str) -> OptionMeasure:
        """A training-free adapter of ``kind`` fitted on the sample's fitting pairs."""
        from modelupgrade.heads.inference import FrozenHead

        old, new = self.old_vectors, self.new_vectors
        fit_labels = self.parts.fit["label"].to_numpy(np.int64)
        head, fit_seconds = fit_adapter(self.params, kind, old, new, fit_labels, self.device)
        frozen = FrozenHead(head, self.device)

        def transform(vectors: np.ndarray) -> np.ndarray:
            return frozen.outputs(vectors)["transform"]

        fitted = f"fitted on {len(self.parts.fit)} pairs in {duration(fit_seconds)}."
        if kind in QUERY_ADAPTERS:
            metrics, flips = self.score(transform(new.query), old.gallery)
            return OptionMeasure(
                f"query/{kind.removesuffix('_query')}",
                "query-adapter",
                f"query-side {kind}, no backfill: M(ψ_rev(new query), old gallery)",
                metrics,
                flips,
                query_overhead_us=seconds_per_vector(transform, new.query) * 1e6,
                training_seconds=fit_seconds,
                training_note=fitted,
            )
        mapped = transform(old.gallery)
        metrics, flips = self.score(new.query, mapped)
        auc, points, note = self.curve(new.query, mapped, True)
        return OptionMeasure(
            f"gallery/{kind}",
            "gallery-adapter",
            f"gallery-side {kind}, vectors-only backfill: M(new query, ψ(old gallery))",
            metrics,
            flips,
            seconds_per_vector=seconds_per_vector(transform, old.gallery),
            training_seconds=fit_seconds,
            training_note=fitted,
            backfill_auc=auc,
            backfill_curve=points,
            note=note,
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
    from modelupgrade.models import read_model_card
    from modelupgrade.runtime import describe_device

    old, new = check_model_dir(old, "the old model"), check_model_dir(new, "the new model")
    if compatible_model is not None:
        compatible_model = check_model_dir(compatible_model, "the compatible model")
    check_choices(adapters, backfill_mode, backfill_policy, compatible_training_images)
    curves = (backfill_mode, backfill_policy)
    measuring = _measuring(params, old, new, sample, (query, gallery), fit_fraction, curves)
    options = measuring.baselines() + [measuring.adapter(kind) for kind in adapters]
    if compatible_model is not None:
        options += _compatible_options(measuring, compatible_model)
    else:
        seconds, how = compatible_training_estimate(
            params,
            old,
            read_model_card(new),
            compatible_architecture,
            compatible_strategy,
            measuring.parts,
            compatible_training_images,
            measuring.device,
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
    parts = measuring.parts
    return PlanMeasurements(
        metric=measuring.settings.metric,
        options=options,
        device=describe_device(measuring.device),
        protocol={
            "description": parts.description,
            "leave_one_out": parts.leave_one_out,
            "fit_pairs": len(parts.fit),
            "queries": len(parts.query),
            "gallery": len(parts.gallery),
            "evaluation": parts.evaluator.protocol_description(),
        },
        backfill=measuring.settings.describe(),
        models={
            "old": str(old),
            "new": str(new),
            **({"compatible": str(compatible_model)} if compatible_model else {}),
        },
    )


def _measuring(
    params: Params,
    old: Path,
    new: Path,
    sample: Path,
    evaluated: tuple[Path | None, Path | None],
    fit_fraction: float,
    curves: tuple[str, str],
) -> _Measuring:
    """The sample split (``evaluated``: the query and gallery files, if given), embedded by both
    models, and the scorer and the curves' settings (``curves``: serving mode, ordering)."""
    from modelupgrade.models import classifier_logits, load_model
    from modelupgrade.runtime import select_device
    from modelupgrade.training.generation import apply_cpu_threads

    device = select_device(params.device)
    apply_cpu_threads(params)
    parts = plan_sample(params, sample, *evaluated, fit_fraction, device)
    metric = params.evaluation.headline_metric
    parts.evaluator.require_metric(metric, "evaluation.headline_metric")
    old_vectors = embed_sample(params, old, parts, device)
    new_vectors = embed_sample(params, new, parts, device)
    if new_vectors.seconds_per_image is None:
        raise UserError(
            f"the new model {new} is embeddings-only: it cannot re-embed the gallery",
            hint="adopt the new model from its weights (timm, torchvision or TorchScript)",
        )
    cfg = params.backfill
    settings = CurveSettings(
        mode=curves[0],
        policy=curves[1],
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
    score = _Scorer(parts.evaluator)
    return _Measuring(params, parts, old_vectors, new_vectors, score, settings, old_logits, device)


def _compatible_options(measuring: _Measuring, model_dir: Path) -> list[OptionMeasure]:
    """A trained compatible successor: without a backfill (its queries against the old gallery)
    and after a re-embedding backfill."""
    from modelupgrade.models import read_model_card

    card = read_model_card(model_dir)
    vectors = embed_sample(measuring.params, model_dir, measuring.parts, measuring.device)
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
    old_query_metrics, old_flips = measuring.score(vectors.query, measuring.old_vectors.gallery)
    metrics, flips = measuring.score(vectors.query, vectors.gallery)
    auc, points, note = measuring.curve(vectors.query, vectors.gallery, True)
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
