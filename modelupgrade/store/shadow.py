"""Shadow evaluation before a cutover: does the store answer a labelled query sample at least as
well from the backfill's new space as from the old one?

Both spaces' vectors are still in the store after a backfill (a backfill writes the target space's
vectors beside the source's and never touches those), so the sample is scored twice with the
project's evaluator (``modelupgrade.evaluation.RetrievalEvaluator``): its new-model query vectors
against the items' vectors in the new space, its old-model ones against the items' vectors in the
old space, the gallery labels being the store's item labels. It scores the vectors the store holds
with the evaluator's exact ranking, so it judges the space, not an index's recall (which the status
reports on its own).

**Held-out queries, always.** A query that is itself a stored item would find its own vector first
in the space whose model embedded it and pass the gate trivially (top-1 1.0, no flips). So the
sample's items are taken out of the gallery it is scored against: every query is held out, and
the report says how many were stored items. A sample of stored items needs no model at all: its
old-space query vectors are read from the store's old space (the old model's vectors of those
items, which is how a dead old model is judged), and its new-space ones from the new space when
the backfill re-embedded them (``embed``) or took them from a table (``table``); a ψ backfill's
vectors are ψ(old), not the new model's queries, so it needs the new model or its query vectors.

The verdict is the registry's: the gate metric (``registry.gate_metric``, else
``evaluation.headline_metric``) must be at least as high in the new space as in the old, and the
registry's negative-flip gate (``registry.gates.max_negative_flip_rate``) must pass for the old
space's answers against the new space's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np

from modelupgrade.config import Params
from modelupgrade.errors import UserError
from modelupgrade.json_data import JsonObject, json_record
from modelupgrade.metrics import negative_flip_rate
from modelupgrade.registry.gates import GATES, GateCheck, GateInputs, GateReport
from modelupgrade.store.gallery import GalleryStore
from modelupgrade.store.schema import Backfill

# Backfill methods whose new-space vectors are the new model's own embeddings of each item.
_MODEL_VECTORS = ("embed", "table")


@dataclass(frozen=True)
class QuerySample:
    """A labelled query sample: row i of ``new`` and of ``old`` is the query with label
    ``labels[i]`` embedded in each space, and ``item_ids[i]`` its item id (held out of the gallery
    when it is a stored item). A side given as None is read from the store for the sample's items,
    which must then all be stored."""

    labels: np.ndarray
    new: np.ndarray | None
    old: np.ndarray | None
    source: str
    item_ids: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        count = len(self.labels)
        if count == 0:
            raise UserError(f"the shadow evaluation's query sample {self.source} has no rows")
        for side, vectors in (("new", self.new), ("old", self.old)):
            if vectors is None and self.item_ids is None:
                raise UserError(
                    f"the {side}-space query vectors of {self.source} are neither given nor "
                    "readable from the store without the sample's item ids"
                )
            if vectors is not None and len(vectors) != count:
                raise UserError(
                    f"{len(vectors)} {side}-space query vectors for the {count} queries of "
                    f"{self.source}",
                    hint="embed the query split row for row with each model",
                )
        if self.item_ids is not None and len(self.item_ids) != count:
            raise UserError(f"{len(self.item_ids)} item ids for the {count} queries")


@dataclass
class ShadowEvaluation:
    """The sample's scores in each space and the registry's verdict on them."""

    metric: str
    new_space: str
    old_space: str
    queries: int
    gallery: int
    new_metrics: dict[str, float]
    old_metrics: dict[str, float]
    negative_flip_rate: float
    checks: list[GateCheck] = field(default_factory=list)
    source: str = ""
    # Queries that are stored items, held out of the gallery they were scored against.
    held_out_stored_queries: int = 0
    # Where each side's query vectors came from: "given" (vectors or a model) or the space read.
    query_vectors: dict[str, str] = field(default_factory=dict)

    @property
    def passed(self) -> bool:
        return GateReport(self.checks).passed

    def summary(self) -> str:
        return GateReport(self.checks).summary()

    def as_dict(self) -> JsonObject:
        fields = json_record(self)  # each check too, as a dict of its fields
        checks, source = fields.pop("checks"), fields.pop("source")
        return {**fields, "passed": self.passed, "checks": checks, "source": source}


def shadow_evaluate(
    store: GalleryStore, backfill: Backfill, sample: QuerySample, params: Params
) -> ShadowEvaluation:
    """Score ``sample`` in ``backfill``'s target space and in its source space, its own items held
    out of the gallery (see the module)."""
    from modelupgrade.evaluation.retrieval import RetrievalEvaluator

    items = store.items()
    unlabelled = [item.item_id for item in items if item.label is None]
    if unlabelled:
        raise UserError(
            f"{len(unlabelled)} item(s) of the store carry no label, e.g. {unlabelled[0]!r}, so "
            "its answers cannot be scored",
            hint="the shadow evaluation needs a store ingested from a split parquet with a label "
            "column",
        )
    position = {item.item_id: row for row, item in enumerate(items)}
    stored = [position[i] for i in sample.item_ids or () if i in position]
    gallery = np.ones(len(items), dtype=bool)
    gallery[stored] = False
    if not gallery.any():
        raise UserError(
            "every item of the store is in the query sample: nothing is left to search",
            hint="take a sample of a few hundred items; it is held out of the gallery",
        )
    slots = np.fromiter((item.slot for item in items), dtype=np.int64, count=len(items))
    # Every item of a labelled store has a label (checked above).
    labels = np.fromiter((int(item.label) for item in items), np.int64, len(items))  # type: ignore[arg-type]
    evaluator = RetrievalEvaluator(
        params.evaluation, sample.labels, labels[gallery], leave_one_out=False
    )
    metric = params.registry.gate_metric or params.evaluation.headline_metric
    evaluator.require_metric(metric, "registry.gate_metric (else evaluation.headline_metric)")
    new_space, old_space = store.space(backfill.target_space), store.space(backfill.source_space)
    answers, origins = {}, {}
    sample_slots = [slots[position[i]] if i in position else None for i in sample.item_ids or ()]
    for side, spec, given in (("new", new_space, sample.new), ("old", old_space, sample.old)):
        queries, origins[side] = _query_vectors(store, backfill, spec, side, given, sample_slots)
        if queries.ndim != 2 or queries.shape[1] != spec.dim:
            raise UserError(
                f"the query vectors for space {spec.name!r} have shape {queries.shape}, the "
                f"space holds {spec.dim}-d vectors",
                hint=f"embed the queries with the model of {spec.name!r} ({spec.model_ref})",
            )
        answers[spec.name] = evaluator.evaluate(
            np.asarray(queries, np.float32), store.read_vectors(spec.name, slots[gallery])
        )
    new, old = answers[new_space.name], answers[old_space.name]
    if metric not in new.metrics or metric not in old.metrics:
        raise UserError(f"the evaluation did not compute {metric!r} on the query sample")
    new_score, old_score = float(new.metrics[metric]), float(old.metrics[metric])
    at_least = new_score >= old_score
    flips = negative_flip_rate(old.correct, new.correct)
    checks = [
        GateCheck(
            "shadow",
            at_least,
            new_score,
            old_score,
            f"M({new_space.name})={new_score:.4f} {'>=' if at_least else '<'} "
            f"M({old_space.name})={old_score:.4f} [{metric}]",
        ),
        GATES.get("negative_flips")().check(
            GateInputs(negative_flip_rate=flips, metric=metric), params.registry.gates
        ),
    ]
    return ShadowEvaluation(
        metric=metric,
        new_space=new_space.name,
        old_space=old_space.name,
        queries=len(sample.labels),
        gallery=int(gallery.sum()),
        new_metrics={k: float(v) for k, v in new.metrics.items()},
        old_metrics={k: float(v) for k, v in old.metrics.items()},
        negative_flip_rate=flips,
        checks=checks,
        source=sample.source,
        held_out_stored_queries=len(stored),
        query_vectors=origins,
    )


def _query_vectors(
    store: GalleryStore,
    backfill: Backfill,
    spec: Any,
    side: str,
    given: np.ndarray | None,
    sample_slots: list[int | None],
) -> tuple[np.ndarray, str]:
    """The sample's query vectors in ``spec``'s space, and where they came from: as given, or
    the store's vectors of the sample's items (``sample_slots``, None for an item it does not
    hold; see the module for when that is valid)."""
    if given is not None:
        return given, "given"
    missing = sum(slot is None for slot in sample_slots)
    if missing:
        raise UserError(
            f"the {side}-space query vectors are read from the store, but {missing} of the "
            f"{len(sample_slots)} queries are not stored items",
            hint=f"pass --{side}-model or --{side}-query-vectors, or sample stored items only",
        )
    if side == "new" and (backfill.method not in _MODEL_VECTORS or spec.form != "new"):
        raise UserError(
            f"space {spec.name!r} was filled by a {backfill.method} backfill ({spec.form} form): "
            "its stored vectors are not the new model's queries",
            hint="pass --new-model (it embeds the queries) or --new-query-vectors",
        )
    slots = np.array(sample_slots, dtype=np.int64)
    return store.read_vectors(spec.name, slots), f"the store's {spec.name!r} vectors"
