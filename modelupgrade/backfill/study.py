"""Online-backfilling study of one scenario: every (strategy, policy, serving mode) curve.

An embedding directory holds ``query.npy`` and ``gallery.npy`` (rows in the split files' order). A
variant is one upgraded system ("strategy" in the outputs) with its new embeddings; a variant's
arrays are head outputs: forward_gallery (ψ(φ_old(g))), sigma2 (FastFill σ² per gallery item),
reverse_query (ψ_rev(φ_new(q))), rho_query, rho_gallery, rho_reverse_query (Seo et al.'s full
method). The old classifier's logits (or probabilities) on the gallery split feed the confidence
and entropy orders. Every configured combination whose inputs are present runs; the others are
listed as skipped in the summary.

Writes ``<metrics>/backfill_curves.{parquet,csv}`` (tidy: strategy, policy, mode, deployable,
permutations, t, cutoff, top-k, mAP, [mAP@k], nfr, pfr; a policy that draws its order from the
seed is the mean of ``backfill.random_permutations`` orders), ``<metrics>/backfill_summary.json``
(AUCs both ways, Seo et al.'s conditions, end-point identities),
``<metrics>/backfill_plots/<curve>.csv`` (for dvc plots)
and ``<plots>/backfill_curves.png`` (``modelupgrade.backfill.plots``: one panel per serving mode);
``<metrics>`` and ``<plots>`` default to ``metrics/<sc>`` and ``plots/<sc>``.

The ``simulate_backfill`` command (the DVC stage and the ``modelupgrade simulate-backfill``
subcommand) runs ``simulate_backfill``; the default directories are the study's
(``modelupgrade.layout``).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from modelupgrade.arrays import load_array
from modelupgrade.backfill.grid import BackfillGrid, fastfill_grid, uniform_grid
from modelupgrade.backfill.plots import plot_curves
from modelupgrade.backfill.summary import BackfillSummary, GridRecord
from modelupgrade.backfill.variant_curves import (
    ReferenceLevels,
    StudyArrays,
    VariantCurves,
    checked_rows,
    variant_curves,
)
from modelupgrade.backfill.variants import ScenarioVariants, scenario_variants
from modelupgrade.config import Params
from modelupgrade.errors import UserError
from modelupgrade.io import atomic_path, save_parquet, write_json, write_text
from modelupgrade.layout import (
    BACKFILL_CURVES,
    BACKFILL_PER_QUERY_FILE,
    BACKFILL_PLOTS_DIR,
    BACKFILL_SUMMARY_FILE,
    GALLERY_SPLIT,
    QUERY_SPLIT,
    StudyLayout,
    embedding_file_name,
)
from modelupgrade.ordering import ORDERINGS
from modelupgrade.retrieval.protocol import read_evaluation_splits
from modelupgrade.serving import SERVING_MODES

log = logging.getLogger(__name__)

ARRAY_FIELDS = (
    "forward_gallery",
    "sigma2",
    "reverse_query",
    "rho_query",
    "rho_gallery",
    "rho_reverse_query",
)
CURVES_FILE = f"{BACKFILL_CURVES}.parquet"
CURVES_CSV_FILE = f"{BACKFILL_CURVES}.csv"
PLOT_FILE = f"{BACKFILL_CURVES}.png"


def parse_pairs(items: Sequence[str], what: str) -> dict[str, str]:
    pairs: dict[str, str] = {}
    for item in items:
        name, sep, value = item.partition("=")
        if not sep or not name or not value:
            raise UserError(
                f"{what} {item!r} is not NAME=VALUE",
                hint=f"e.g. --{what} bct=embeddings/sc/gen1-bct",
            )
        if name in pairs:
            raise UserError(f"{what} {name!r} is given twice")
        pairs[name] = value
    return pairs


def parse_arrays(items: Sequence[str], variants: dict[str, str]) -> dict[str, dict[str, str]]:
    arrays: dict[str, dict[str, str]] = {name: {} for name in variants}
    for key, path in parse_pairs(items, "array").items():
        variant, sep, field = key.partition(":")
        if not sep or variant not in variants:
            raise UserError(
                f"--array {key!r} must be VARIANT:FIELD with a VARIANT given by --variant",
                hint=f"variants: {', '.join(variants) or 'none'}",
            )
        if field not in ARRAY_FIELDS:
            raise UserError(
                f"--array field {field!r} is unknown", hint=f"fields: {', '.join(ARRAY_FIELDS)}"
            )
        arrays[variant][field] = path
    return arrays


def _grid(params: Params, n: int) -> BackfillGrid:
    cfg = params.backfill
    return (
        fastfill_grid(cfg.fastfill_steps, n)
        if cfg.grid == "fastfill"
        else uniform_grid(cfg.points, n)
    )


def backfill_inputs(
    params: Params,
    scenario: str,
    embeddings_root: str | Path | None = None,
    old: str | Path | None = None,
    variant_items: Sequence[str] = (),
    array_items: Sequence[str] = (),
    old_logits: str | Path | None = None,
    compatible: Sequence[str] = (),
) -> ScenarioVariants:
    """The systems to compare: every strategy and head of the scenario found under
    ``<embeddings_root>/<sc>/`` (the study's layout), or the explicit ``old`` directory with
    ``NAME=DIR`` variants, ``NAME:FIELD=PATH`` arrays, the old model's logits and the names of
    the variants trained to be compatible with the old model."""
    if embeddings_root:
        if old or variant_items or array_items or old_logits or compatible:
            raise UserError(
                "--embeddings-root replaces --old, --variant, --array, --old-logits and "
                "--compatible",
                hint="give either the layout root or the explicit inputs",
            )
        return scenario_variants(params, scenario, StudyLayout(embeddings_root=embeddings_root))
    if not old:
        raise UserError(
            "--old is required without --embeddings-root",
            hint="pass --old DIR or --embeddings-root",
        )
    variants = parse_pairs(variant_items, "variant")
    unknown = sorted(set(compatible) - set(variants))
    if unknown:
        raise UserError(
            f"--compatible names {', '.join(unknown)}, which no --variant defines",
            hint=f"variants: {', '.join(variants) or 'none'}",
        )
    return ScenarioVariants(
        Path(old),
        variants,
        parse_arrays(array_items, variants),
        Path(old_logits) if old_logits else None,
        frozenset(compatible),
    )


def output_dirs(
    scenario: str,
    metrics_dir: str | Path | None = None,
    plots_dir: str | Path | None = None,
    layout: StudyLayout | None = None,
) -> tuple[Path, Path]:
    """Where a study writes its tables and its plot: the layout's ``metrics/<sc>`` and
    ``plots/<sc>`` unless given."""
    layout = layout or StudyLayout()
    return (
        Path(metrics_dir) if metrics_dir else layout.metrics(scenario),
        Path(plots_dir) if plots_dir else layout.plots(scenario),
    )


def read_study_arrays(
    params: Params,
    scenario: str,
    found: ScenarioVariants,
    query_split: str | Path | None,
    gallery_split: str | Path | None,
    layout: StudyLayout,
) -> StudyArrays:
    """The scenario's evaluation splits (``layout``'s unless given) and the old model's arrays of
    ``found``, each checked to have one row per item of its split."""
    splits = read_evaluation_splits(
        params.evaluation.protocol,
        query_split or layout.split_file(scenario, QUERY_SPLIT),
        gallery_split or layout.split_file(scenario, GALLERY_SPLIT),
    )
    leave_one_out, gallery_labels = splits.leave_one_out, splits.gallery_labels
    query_labels = gallery_labels if leave_one_out else splits.query_labels
    query_file = embedding_file_name(GALLERY_SPLIT if leave_one_out else QUERY_SPLIT)
    gallery_file = embedding_file_name(GALLERY_SPLIT)
    n, nq = len(gallery_labels), len(query_labels)
    old_dir = Path(found.old)
    old_query = checked_rows(
        load_array(old_dir / query_file, "old query embeddings"), nq, "old query embeddings"
    )
    old_gallery = checked_rows(
        load_array(old_dir / gallery_file, "old gallery embeddings"), n, "old gallery embeddings"
    )
    logits = (
        None
        if found.old_logits is None
        else checked_rows(load_array(found.old_logits, "old logits"), n, "old logits")
    )
    return StudyArrays(
        params=params,
        leave_one_out=leave_one_out,
        query_labels=query_labels,
        gallery_labels=gallery_labels,
        query_file=query_file,
        gallery_file=gallery_file,
        old_query=old_query,
        old_gallery=old_gallery,
        old_logits=logits,
        grid=_grid(params, n),
    )


def reference_levels(study: StudyArrays, variants: dict[str, str]) -> ReferenceLevels:
    """M(old, old), and M(new, new) of the oracle strategy's model when it is a variant: Seo et
    al.'s end condition (Eq. 7) compares with the independently trained new model."""
    reference = study.params.evaluation.oracle_strategy
    return ReferenceLevels(
        old_old=study.evaluate(study.old_query, study.old_gallery),
        new_new=study.evaluate(*study.new_embeddings(reference, Path(variants[reference])))
        if reference in variants
        else None,
    )


def simulate_backfill(
    params: Params,
    scenario: str,
    found: ScenarioVariants,
    query_split: str | Path | None = None,
    gallery_split: str | Path | None = None,
    metrics_dir: str | Path | None = None,
    plots_dir: str | Path | None = None,
    layout: StudyLayout | None = None,
) -> BackfillSummary:
    """Simulate every available combination of the systems ``found`` (``backfill_inputs``);
    returns the summary written to backfill_summary.json.

    Split files and output directories not given are the scenario's in ``layout`` (the project's
    by default). ``found.compatible`` names the variants whose new model was trained to be
    compared with the old vectors: with ψ, they are the systems whose old-state vectors live in
    the new space, which the oracle order needs."""
    params.scenario(scenario)
    if not found.variants:
        raise UserError(
            "no --variant given",
            hint="name at least one upgraded model: --variant bct=embeddings/...",
        )
    layout = layout or StudyLayout()
    study = read_study_arrays(params, scenario, found, query_split, gallery_split, layout)
    levels = reference_levels(study, found.variants)
    every = VariantCurves()
    for variant, new_dir in found.variants.items():
        arrays = found.arrays.get(variant, {})
        compatible = variant in found.compatible
        one = variant_curves(study, variant, Path(new_dir), arrays, compatible, levels)
        every.tables += one.tables
        every.per_query += one.per_query
        every.curves += one.curves
        every.skipped += one.skipped
    if not every.tables:
        raise UserError(
            "no (strategy, policy, serving mode) combination had the inputs it needs",
            hint="pass new embeddings with --variant and head outputs with --array",
        )
    summary = study_summary(scenario, study, levels, every)
    metrics_dir, plots_dir = output_dirs(scenario, metrics_dir, plots_dir, layout)
    write_study(metrics_dir, plots_dir, every, summary)
    return summary


def study_summary(
    scenario: str, study: StudyArrays, levels: ReferenceLevels, every: VariantCurves
) -> BackfillSummary:
    """The study's summary (``backfill_summary.json``): its setting, the reference levels, every
    curve's summary and every combination skipped."""
    cfg = study.params.backfill
    return BackfillSummary(
        scenario=scenario,
        protocol="leave-one-out" if study.leave_one_out else "query-gallery",
        distance=cfg.distance,
        grid=GridRecord(
            kind=cfg.grid, t=study.grid.t.tolist(), cutoffs=study.grid.cutoffs.tolist()
        ),
        gallery_size=study.n,
        queries=study.nq,
        old_old=levels.old_old,
        reference_system=study.params.evaluation.oracle_strategy
        if levels.new_new is not None
        else None,
        reference_new_new=levels.new_new,
        primary_auc=cfg.primary_auc,
        curves=every.curves,
        skipped=every.skipped,
        policies_known=ORDERINGS.names(),
        serving_modes_known=SERVING_MODES.names(),
    )


def write_study(
    metrics_dir: Path, plots_dir: Path, every: VariantCurves, summary: BackfillSummary
) -> None:
    """The study's files: the tidy curves (parquet, CSV), their per-query areas, one CSV per curve
    for dvc plots, the summary and the figure."""
    tidy = pd.concat(every.tables, ignore_index=True)
    save_parquet(metrics_dir / CURVES_FILE, tidy)
    save_parquet(
        metrics_dir / BACKFILL_PER_QUERY_FILE, pd.concat(every.per_query, ignore_index=True)
    )
    write_text(metrics_dir / CURVES_CSV_FILE, tidy.to_csv(index=False))
    with atomic_path(metrics_dir / BACKFILL_PLOTS_DIR) as tmp:
        tmp.mkdir()
        for (strategy, policy, mode), part in tidy.groupby(
            ["strategy", "policy", "mode"], sort=False
        ):
            part.drop(columns=["strategy", "policy", "mode", "deployable", "permutations"]).to_csv(
                tmp / f"{strategy}__{policy}__{mode}.csv", index=False
            )
    write_json(metrics_dir / BACKFILL_SUMMARY_FILE, summary.as_dict())
    plot_curves(tidy, summary, plots_dir / PLOT_FILE)
    log.info(
        "%d curves written to %s (%d combinations skipped)",
        len(summary.curves),
        metrics_dir,
        len(summary.skipped),
    )


def report_files(metrics_dir: Path, plots_dir: Path) -> list[Path]:
    """The files of a study that a person reads: the summary, the curves as CSV, the plot."""
    return [
        metrics_dir / BACKFILL_SUMMARY_FILE,
        metrics_dir / CURVES_CSV_FILE,
        plots_dir / PLOT_FILE,
    ]
