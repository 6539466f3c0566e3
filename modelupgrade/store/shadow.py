"""Shadow evaluation before a cutover: does the store answer a labelled query sample at least as
well from the backfill's new space as from the old one?

Both spaces' vectors are still in the store after a backfill (a backfill writes the target space's
vectors beside the source's and never touches those), so the sample is scored twice with the
project's evaluator (``modelupgrade.evaluation.RetrievalEvaluator``): its new-model query vectors
against every item's vector in the new space, its old-model ones against every item's vector in the
old space, the gallery labels being the store's item labels. It scores the vectors the store holds
with the evaluator's exact ranking, so it judges the space, not an index's recall (which the status
reports on its own).

The verdict is the registry's: the gate metric (``registry.gate_metric``, else
``evaluation.headline_metric``) must be at least as high in the new space as in the old, and the
registry's negative-flip gate (``registry.gates.max_negative_flip_rate``) must pass for the old
space's answers against the new space's.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from modelupgrade.config import Params
from modelupgrade.errors import UserError
from modelupgrade.metrics import negative_flip_rate
from modelupgrade.registry.gates import GATES, GateCheck, GateInputs, GateReport
from modelupgrade.store.gallery import GalleryStore
from modelupgrade.store.schema import Backfill


@dataclass(frozen=True)
class QuerySample:
    """A labelled query sample embedded in both spaces: row i of ``new`` and of ``old`` is the
    query with label ``labels[i]``."""

    labels: np.ndarray
    new: np.ndarray
    old: np.ndarray
    source: str

    def __post_init__(self) -> None:
        count = len(self.labels)
        if count == 0:
            raise UserError(f"the shadow evaluation's query sample {self.source} has no rows")
        if len(self.new) != count or len(self.old) != count:
            raise UserError(
                f"{len(self.new)} new-space and {len(self.old)} old-space query vectors for the "
                f"{count} queries of {self.source}",
                hint="embed the query split row for row with each model",
            )


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

    @property
    def passed(self) -> bool:
        return GateReport(self.checks).passed

    def summary(self) -> str:
        return GateReport(self.checks).summary()

    def as_dict(self) -> dict[str, Any]:
        fields = asdict(self)  # each check too, as a dict of its fields
        checks, source = fields.pop("checks"), fields.pop("source")
        return {**fields, "passed": self.passed, "checks": checks, "source": source}


def shadow_evaluate(
    store: GalleryStore, backfill: Backfill, sample: QuerySample, params: Params
) -> ShadowEvaluation:
    """Score ``sample`` in ``backfill``'s target space and in its source space (see the module)."""
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
    slots = np.fromiter((item.slot for item in items), dtype=np.int64, count=len(items))
    # Every item of a labelled store has a label (``labels`` is checked above).
    gallery_labels = np.fromiter((int(item.label) for item in items), np.int64, len(items))  # type: ignore[arg-type]
    evaluator = RetrievalEvaluator(
        params.evaluation, sample.labels, gallery_labels, leave_one_out=False
    )
    metric = params.registry.gate_metric or params.evaluation.headline_metric
    evaluator.require_metric(metric, "registry.gate_metric (else evaluation.headline_metric)")
    new_space, old_space = store.space(backfill.target_space), store.space(backfill.source_space)
    answers = {}
    for spec, queries in ((new_space, sample.new), (old_space, sample.old)):
        if queries.ndim != 2 or queries.shape[1] != spec.dim:
            raise UserError(
                f"the query vectors for space {spec.name!r} have shape {queries.shape}, the "
                f"space holds {spec.dim}-d vectors",
                hint=f"embed the queries with the model of {spec.name!r} ({spec.model_ref})",
            )
        answers[spec.name] = evaluator.evaluate(
            np.asarray(queries, np.float32), store.read_vectors(spec.name, slots)
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
        gallery=len(items),
        new_metrics={k: float(v) for k, v in new.metrics.items()},
        old_metrics={k: float(v) for k, v in old.metrics.items()},
        negative_flip_rate=flips,
        checks=checks,
        source=sample.source,
    )
