"""Plan the upgrade of a gallery from an old model to a new one: ``modelupgrade plan``.

The library (``modelupgrade.plan``) measures every option on a labelled sample and costs it for
the gallery's size; this command writes the table (plan.json, plan.md, plan.csv), prints it and
records it as an MLflow run.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelupgrade.config import Params
from modelupgrade.plan import DEFAULT_ADAPTERS, UpgradePlan


@dataclass
class PlanWritten:
    """The plan and the files it was written to."""

    plan: UpgradePlan
    written: list[Path]

    def as_dict(self) -> dict[str, Any]:
        return {**self.plan.as_dict(), "written": [str(p) for p in self.written]}

    def describe(self) -> str:
        return "\n".join([self.plan.markdown(), *(f"wrote {p}" for p in self.written)])


def plan(
    params: Params,
    old: Path,
    new: Path,
    sample: Path,
    gallery_size: int,
    out: Path = Path("plans/upgrade"),
    query: Path | None = None,
    gallery: Path | None = None,
    tolerance_pct: float = 5.0,
    fit_fraction: float = 0.5,
    compatible_model: Path | None = None,
    compatible_architecture: str | None = None,
    compatible_strategy: str = "bct",
    compatible_training_images: int | None = None,
    adapters: Sequence[str] = DEFAULT_ADAPTERS,
    backfill_mode: str = "rank-merge",
    backfill_policy: str = "random",
) -> PlanWritten:
    """Plan an upgrade: each option's retrieval quality and cost for your gallery, and the pick.

    Measures on a labelled sample of images: keeping the old model; the new model with every
    gallery image re-embedded (timed on this machine); training-free query-side adapters (no
    backfill) and gallery-side adapters (stored vectors transformed, timed per vector); and
    compatible fine-tuning (scored when --compatible-model is given, else its training time
    estimated from a one-epoch probe, its quality left unknown). Each M is the headline metric of
    'evaluation' with its negative-flip rate against the old model, and a backfill curve where a
    backfill applies. Recommends the cheapest option (one-time compute) whose M is within
    --tolerance-pct of M(new, new) and above M(old, old); none: keep the old model. Writes
    plan.json, plan.md and plan.csv to --out and logs them as an MLflow run.

    Args:
        params: the params file: evaluation (metric), backfill (curve grid), adapters, training
        old: the model the gallery holds vectors of (models/<sc>/gen0, or `modelupgrade adopt`),
            or its vectors as a parquet of item_id and embedding when it cannot run any more
        new: the model to upgrade to (a trained generation, or an adopted model)
        sample: labelled images: a table (CSV or parquet) of item_id, label and path (each an
            image file, absolute or relative to the table's folder), or a split file; the
            adapters are fitted on it, and without --query/--gallery a part of it is evaluated
        gallery_size: images in the production gallery the costs are for, e.g. 50000000
        out: directory for plan.json, plan.md and plan.csv
        query: table of evaluation queries, as --sample (with --gallery; default: split the
            sample)
        gallery: table of the evaluation gallery, as --sample (with --query)
        tolerance_pct: how far below M(new, new), in percent, a recommended option may be
        fit_fraction: share of the sample the adapters are fitted on when it is split; the rest is
            evaluated leave-one-out
        compatible_model: an already trained compatible (BCT-family) successor of --old to score
        compatible_architecture: architecture of params.yaml whose compatible training time is
            estimated (default: the new model's own, when it was trained here)
        compatible_strategy: strategy of params.yaml the compatible training estimate runs
        compatible_training_images: images the compatible model would train on (default: the new
            model's training images, else the sample's)
        adapters: training-free adapter kinds to fit (query side: *_query)
        backfill_mode: serving mode of the backfill curves (modelupgrade.serving)
        backfill_policy: ordering policy of the backfill curves (modelupgrade.ordering)
    """
    from modelupgrade.plan import check_plan_settings, measure_plan, plan_table, write_plan
    from modelupgrade.registry import track_stage

    check_plan_settings(gallery_size, tolerance_pct)
    asked = {
        "old": old,
        "new": new,
        "sample": sample,
        "gallery_size": gallery_size,
        "query": query,
        "gallery": gallery,
        "tolerance_pct": tolerance_pct,
        "compatible_model": compatible_model,
        "backfill_mode": backfill_mode,
        "backfill_policy": backfill_policy,
        "out": out,
    }
    with track_stage("plan", params, run_name=f"plan@{out}", arguments=asked) as stage:
        stage.log_params({"evaluation": params.evaluation, "adapters": list(adapters)})
        measured = measure_plan(
            params,
            old,
            new,
            sample,
            query=query,
            gallery=gallery,
            compatible_model=compatible_model,
            compatible_architecture=compatible_architecture,
            compatible_strategy=compatible_strategy,
            compatible_training_images=compatible_training_images,
            adapters=adapters,
            fit_fraction=fit_fraction,
            backfill_mode=backfill_mode,
            backfill_policy=backfill_policy,
        )
        table = plan_table(measured, gallery_size, tolerance_pct)
        written = write_plan(table, out)
        stage.set_tags({"recommendation": table.recommendation.option})
        stage.log_metrics(
            {
                row.option: {
                    "M": row.M,
                    "negative_flip_rate": row.negative_flip_rate,
                    "one_time_seconds": row.one_time_seconds,
                    "backfill_auc": row.backfill_auc,
                }
                for row in table.rows
            }
        )
        stage.log_artifacts(written, "plan")
    return PlanWritten(table, written)
