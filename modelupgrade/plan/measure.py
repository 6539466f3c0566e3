"""Every option measured on the sample (``measure_plan``): the old and the re-embedded gallery,
training-free adapters fitted on the sample, a compatible successor given or its training
estimated, each with its backfill curve."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from modelupgrade.config import Params
from modelupgrade.data.vector_table import is_vector_table
from modelupgrade.errors import UserError
from modelupgrade.evaluation import PairResult, RetrievalEvaluator
from modelupgrade.metrics import negative_flip_rate
from modelupgrade.plan.adapters import (
    DEFAULT_ADAPTERS,
    GALLERY_ADAPTERS,
    QUERY_ADAPTERS,
    FittedAdapter,
    adapter_head_name,
    check_adapters,
    fit_adapter,
)
from modelupgrade.plan.compatible import compatible_training_estimate
from modelupgrade.plan.curves import Curve, CurveSettings, backfill_curve_of
from modelupgrade.plan.records import MachineLoad, OptionMeasure, PlanMeasurements, duration
from modelupgrade.plan.sample import (
    PlanSample,
    SampleEmbeddings,
    check_model_dir,
    embed_sample,
    plan_sample,
    seconds_per_vector,
)

__all__ = [
    "DEFAULT_ADAPTERS",
    "GALLERY_ADAPTERS",
    "QUERY_ADAPTERS",
    "Measuring",
    "machine_load",
    "measure_plan",
]


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


@dataclass
class Measuring:
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
    # Where fitted adapters are saved as head directories (None: not saved).
    heads_dir: Path | None = None
    models: tuple[Path, Path] | None = None

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
            timing_spread=None if new.timing is None else new.timing.spread,
        )
        return [keep, reembed]

    def adapter(self, kind: str) -> OptionMeasure:
        """A training-free adapter of ``kind`` fitted on the sample's fitting pairs, saved as a
        head directory when the plan keeps its adapters."""
        from modelupgrade.heads.base import HEADS
        from modelupgrade.heads.inference import FrozenHead

        old, new = self.old_vectors, self.new_vectors
        query_side = kind in QUERY_ADAPTERS
        name = f"query/{kind.removesuffix('_query')}" if query_side else f"gallery/{kind}"
        blends_old_query = HEADS.get(kind).takes_old_embedding
        if blends_old_query and old.timing is None:
            return OptionMeasure(
                name,
                "query-adapter",
                f"query-side {kind}: needs the old model on every query",
                note="not measured: the old model cannot embed queries any more (embeddings only)",
            )
        fit_labels = self.parts.fit["label"].to_numpy(np.int64)
        fitted = fit_adapter(self.params, kind, old, new, fit_labels, self.device)
        frozen = FrozenHead(fitted.head, self.device)
        note = f"fitted on {len(self.parts.fit)} pairs in {duration(fitted.seconds)}."
        head = self.save(name, fitted)
        if query_side:
            return self._query_adapter(name, kind, frozen, fitted, note, head, blends_old_query)
        mapped = frozen.outputs(old.gallery)["transform"]
        metrics, flips = self.score(new.query, mapped)
        auc, points, curve_note = self.curve(new.query, mapped, True)
        timing = seconds_per_vector(lambda v: frozen.outputs(v)["transform"], old.gallery)
        return OptionMeasure(
            name,
            "gallery-adapter",
            f"gallery-side {kind}, vectors-only backfill: M(new query, ψ(old gallery))",
            metrics,
            flips,
            seconds_per_vector=timing.best,
            training_seconds=fitted.seconds,
            training_note=note,
            backfill_auc=auc,
            backfill_curve=points,
            note=curve_note,
            timing_spread=timing.spread,
            head=head,
        )

    def _query_adapter(
        self,
        name: str,
        kind: str,
        frozen: Any,
        fitted: FittedAdapter,
        note: str,
        head: str | None,
        blends_old_query: bool,
    ) -> OptionMeasure:
        """A query-side adapter: M(ψ_rev(new query), old gallery), and what it adds to a query
        (with SLERP, the old model's forward pass too)."""
        old, new = self.old_vectors, self.new_vectors
        side = old.query if blends_old_query else None
        mapped = frozen.outputs(new.query, side)["transform"]
        metrics, flips = self.score(mapped, old.gallery)

        def transform(queries: np.ndarray) -> np.ndarray:
            # Timed on the queries tiled to a block: the old queries tiled alike.
            blend = None if side is None else np.resize(side, (len(queries), side.shape[1]))
            return frozen.outputs(queries, blend)["transform"]

        timing = seconds_per_vector(transform, new.query)
        overhead = timing.best * 1e6
        if blends_old_query:
            assert old.seconds_per_image is not None  # checked by ``adapter``
            overhead += old.seconds_per_image * 1e6
            note += (
                f" Each query also runs the old model ({old.seconds_per_image * 1e6:.0f} µs a "
                "query, in the per-query cost): both models serve during the transition."
            )
        return OptionMeasure(
            name,
            "query-adapter",
            f"query-side {kind}, no backfill: M(ψ_rev(new query), old gallery)",
            metrics,
            flips,
            query_overhead_us=overhead,
            training_seconds=fitted.seconds,
            training_note=note,
            timing_spread=timing.spread,
            head=head,
        )

    def compatible(self, model_dir: Path) -> list[OptionMeasure]:
        """A trained compatible successor: without a backfill (its queries against the old gallery)
        and after a re-embedding backfill."""
        from modelupgrade.models import read_model_card

        card = read_model_card(model_dir)
        vectors = embed_sample(self.params, model_dir, self.parts, self.device)
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
        old_query_metrics, old_flips = self.score(vectors.query, self.old_vectors.gallery)
        metrics, flips = self.score(vectors.query, vectors.gallery)
        auc, points, note = self.curve(vectors.query, vectors.gallery, True)
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
                timing_spread=None if vectors.timing is None else vectors.timing.spread,
                training_note=trained,
                backfill_auc=auc,
                backfill_curve=points,
                note=note,
            ),
        ]

    def save(self, option: str, fitted: FittedAdapter) -> str | None:
        """Save ``fitted`` in ``heads_dir`` as a head directory named after ``option``; its name
        relative to the plan's directory (``heads/gallery-affine``), None when the plan keeps
        no adapters."""
        from modelupgrade.heads.persistence import save_head
        from modelupgrade.heads.pipeline import source_entry

        if self.heads_dir is None or self.models is None:
            return None
        name = adapter_head_name(option)
        old_model, new_model = self.models
        sources = {"old_model": source_entry(old_model), "new_model": source_entry(new_model)}
        save_head(
            fitted.head,
            self.heads_dir / Path(name).name,
            name=option,
            training=fitted.record,
            sources=sources,
        )
        return name


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
    heads_dir: Path | None = None,
) -> PlanMeasurements:
    """Measure every option on the sample (module docstring); ``plan_table`` costs them. The
    options' defaults are the ``plan`` command's (``modelupgrade.commands.plan``). Each fitted
    adapter is saved in ``heads_dir`` as a head directory (``adapter_head_name``)."""
    from modelupgrade.models import read_model_card
    from modelupgrade.runtime import describe_device

    old = check_model_dir(old, "the old model", vectors_allowed=True)
    new = check_model_dir(new, "the new model")
    if compatible_model is not None:
        compatible_model = check_model_dir(compatible_model, "the compatible model")
    check_choices(adapters, backfill_mode, backfill_policy, compatible_training_images)
    curves = (backfill_mode, backfill_policy)
    load_before = machine_load()
    measuring = _measuring(params, old, new, sample, (query, gallery), fit_fraction, curves)
    measuring.heads_dir, measuring.models = heads_dir, (old, new)
    options = measuring.baselines() + [measuring.adapter(kind) for kind in adapters]
    if compatible_model is not None:
        options += measuring.compatible(compatible_model)
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
        machine=MachineLoad(load_before.cores, load_before.load_before, machine_load().load_before),
    )


def machine_load() -> MachineLoad:
    """The 1-minute load average now, against the cores this process may use."""
    import os

    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else 0.0
    return MachineLoad(int(cores or 1), float(load), float(load))


def _measuring(
    params: Params,
    old: Path,
    new: Path,
    sample: Path,
    evaluated: tuple[Path | None, Path | None],
    fit_fraction: float,
    curves: tuple[str, str],
) -> Measuring:
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
    old_model = None if is_vector_table(old) else load_model(old)
    old_logits = (
        classifier_logits(old_model, old_vectors.gallery)
        if old_model is not None and getattr(old_model, "classifier", None) is not None
        else None
    )
    score = _Scorer(parts.evaluator)
    return Measuring(params, parts, old_vectors, new_vectors, score, settings, old_logits, device)
