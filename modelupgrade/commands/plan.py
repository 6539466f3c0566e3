"""Plan the upgrade of a gallery from an old model to a new one: ``modelupgrade plan``.

The library (``modelupgrade.plan``) measures every option on a labelled sample and costs it for
the gallery's size; this command writes the table (plan.json, plan.md, plan.csv), prints it and
records it as an MLflow run.
"""

from __future__ import annotations

import tempfile
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from modelupgrade.config import Params
from modelupgrade.json_data import JsonObject
from modelupgrade.plan import DEFAULT_ADAPTERS, PlanMeasurements, UpgradePlan
from modelupgrade.plan.steps import NextStep, PlanContext


@dataclass
class PlanWritten:
    """The plan, the commands that carry it out, and the files it was written to."""

    plan: UpgradePlan
    written: list[Path]
    steps: list[NextStep] = field(default_factory=list)
    steps_text: list[str] = field(default_factory=list)

    def as_dict(self) -> JsonObject:
        return {
            **self.plan.as_dict(),
            "next_commands": [step.command for step in self.steps],
            "written": [str(p) for p in self.written],
        }

    def describe(self) -> str:
        return "\n".join(
            [self.plan.markdown(), *self.steps_text, "", *(f"wrote {p}" for p in self.written)]
        )

    @classmethod
    def of(
        cls,
        measured: PlanMeasurements,
        gallery_size: int,
        tolerance_pct: float,
        context: PlanContext,
        heads: Path,
    ) -> PlanWritten:
        """The plan of ``measured`` for the gallery, its next steps, written to ``context.out``
        with the adapters saved in ``heads``."""
        from modelupgrade.plan import plan_table, write_plan
        from modelupgrade.plan.steps import next_steps, steps_markdown
        from modelupgrade.store.schema import DATABASE_FILE

        table = plan_table(measured, gallery_size, tolerance_pct)
        steps = next_steps(table, context)
        exists = (context.store / DATABASE_FILE).exists()
        text = ["", *steps_markdown(steps, exists, context, table)]
        commands = [step.command for step in steps]
        return cls(table, write_plan(table, context.out, heads, text, commands), steps, text)

    def log(self, stage: Any) -> None:
        """The plan as its MLflow run records it: the recommendation, each option's numbers,
        the files."""
        stage.set_tags({"recommendation": self.plan.recommendation.option})
        stage.log_metrics(
            {
                row.option: {
                    "M": row.M,
                    "negative_flip_rate": row.negative_flip_rate,
                    "one_time_seconds": row.one_time_seconds,
                    "backfill_auc": row.backfill_auc,
                }
                for row in self.plan.rows
            }
        )
        stage.log_artifacts([p for p in self.written if p.is_file()], "plan")


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
    store: Path | None = None,
) -> PlanWritten:
    """Plan an upgrade: each option's retrieval quality and cost for your gallery, and the pick.

    Measures on a labelled sample of images: keeping the old model; the new model with every
    gallery image re-embedded (timed on this machine); training-free query-side adapters (no
    backfill) and gallery-side adapters (stored vectors transformed, timed per vector); and
    compatible fine-tuning (scored when --compatible-model is given, else its training time
    estimated from a one-epoch probe, its quality left unknown). Each M is the headline metric of
    'evaluation' with its negative-flip rate against the old model, and a backfill curve where a
    backfill applies. Recommends the cheapest option (one-time compute) whose M is within
    --tolerance-pct of M(new, new) and above M(old, old); none: keep the old model. Each cost is
    timed in several rounds: the plan says how far they agreed and whether the machine was busy.
    Writes plan.json, plan.md and plan.csv to --out, every fitted adapter as a head directory
    under --out/heads, prints the commands that carry out the recommendation on the store, and
    logs them as an MLflow run.

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
        backfill_policy: ordering policy of the backfill curves (modelupgrade.ordering), and of
            the backfill the plan's next commands run
        store: the gallery store the printed commands act on (default: store.path)
    """
    # Every argument but the params, by name: the typed request the plan is made of.
    request = PlanRequest(**{name: value for name, value in locals().items() if name != "params"})
    return _plan_tracked(params, request)


@dataclass(frozen=True)
class PlanRequest:
    """``plan``'s arguments (see its docstring), the params file apart."""

    old: Path
    new: Path
    sample: Path
    gallery_size: int
    out: Path
    query: Path | None
    gallery: Path | None
    tolerance_pct: float
    fit_fraction: float
    compatible_model: Path | None
    compatible_architecture: str | None
    compatible_strategy: str
    compatible_training_images: int | None
    adapters: Sequence[str]
    backfill_mode: str
    backfill_policy: str
    store: Path | None

    def recorded(self) -> dict[str, object]:
        """The arguments as the plan's MLflow run records them."""
        names = ("old", "new", "sample", "gallery_size", "query", "gallery", "tolerance_pct")
        later = ("compatible_model", "backfill_mode", "backfill_policy", "out")
        return {name: getattr(self, name) for name in (*names, *later)}

    def measure(self, params: Params, heads_dir: Path) -> PlanMeasurements:
        """Every option measured on the sample, its fitted adapters saved in ``heads_dir``."""
        from modelupgrade.plan import measure_plan

        return measure_plan(
            params,
            self.old,
            self.new,
            self.sample,
            query=self.query,
            gallery=self.gallery,
            compatible_model=self.compatible_model,
            compatible_architecture=self.compatible_architecture,
            compatible_strategy=self.compatible_strategy,
            compatible_training_images=self.compatible_training_images,
            adapters=self.adapters,
            fit_fraction=self.fit_fraction,
            backfill_mode=self.backfill_mode,
            backfill_policy=self.backfill_policy,
            heads_dir=heads_dir,
        )

    def context(self, params: Params) -> PlanContext:
        """Where the plan's next commands read and write."""
        store = self.store or Path(params.store.path)
        where = (self.query or self.sample, store, self.out, self.compatible_model)
        return PlanContext(params.source, self.old, self.new, *where)


def _plan_tracked(params: Params, request: PlanRequest) -> PlanWritten:
    """Measure, cost and write the plan inside its MLflow run."""
    from modelupgrade.plan import check_plan_settings
    from modelupgrade.registry import track_stage

    check_plan_settings(request.gallery_size, request.tolerance_pct)
    run_name = f"plan@{request.out}"
    with track_stage("plan", params, run_name=run_name, arguments=request.recorded()) as stage:
        stage.log_params({"evaluation": params.evaluation, "adapters": list(request.adapters)})
        with tempfile.TemporaryDirectory(prefix="plan-heads-") as scratch:
            measured = request.measure(params, Path(scratch))
            written = PlanWritten.of(
                measured,
                request.gallery_size,
                request.tolerance_pct,
                request.context(params),
                Path(scratch),
            )
        written.log(stage)
    return written
