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
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

from modelupgrade.arrays import load_array
from modelupgrade.backfill.engine import backfill_curves, mean_curve
from modelupgrade.backfill.grid import BackfillGrid, fastfill_grid, uniform_grid
from modelupgrade.backfill.per_query import (
    largest_drop_se,
    mean_over_orders,
    per_query_table,
    per_query_values,
)
from modelupgrade.backfill.plots import plot_curves
from modelupgrade.backfill.serving_arrays import ServingArrays
from modelupgrade.backfill.simulate import evaluate_state
from modelupgrade.backfill.summary import (
    BackfillSummary,
    CurveSummary,
    GridRecord,
    auc_mean,
    auc_trapezoid,
    check_conditions,
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
from modelupgrade.ordering import ORDERINGS, OrderingInputs, build_ordering
from modelupgrade.retrieval.protocol import read_evaluation_splits
from modelupgrade.serving import SERVING_MODES, build_serving_mode

log = logging.getLogger(__name__)

ARRAY_FIELDS = (
    "forward_gallery",
    "sigma2",
    "reverse_query",
    "rho_query",
    "rho_gallery",
    "rho_reverse_query",
)
QUERY_FIELDS = ("reverse_query", "rho_query", "rho_reverse_query")
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
    cfg = params.backfill
    old, variants, arrays = found.old, found.variants, found.arrays
    old_logits, compatible = found.old_logits, found.compatible
    if not variants:
        raise UserError(
            "no --variant given",
            hint="name at least one upgraded model: --variant bct=embeddings/...",
        )
    layout = layout or StudyLayout()
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
    self_index = np.arange(n) if leave_one_out else None

    def rows(array: np.ndarray, count: int, what: str) -> np.ndarray:
        if len(array) != count:
            raise UserError(
                f"{what} has {len(array)} rows but its split has {count}",
                hint="embeddings must be computed on the same split files, in their order",
            )
        return array

    old_dir = Path(old)
    old_query = rows(
        load_array(old_dir / query_file, "old query embeddings"), nq, "old query embeddings"
    )
    old_gallery = rows(
        load_array(old_dir / gallery_file, "old gallery embeddings"), n, "old gallery embeddings"
    )
    logits = (
        None if old_logits is None else rows(load_array(old_logits, "old logits"), n, "old logits")
    )
    grid = _grid(params, n)
    topk = tuple(sorted(set(cfg.topk)))
    memory = cfg.memory_mb * 1024 * 1024

    def evaluate(query: np.ndarray, gallery: np.ndarray) -> dict[str, float]:
        result = evaluate_state(
            query,
            gallery,
            gallery_labels,
            leave_one_out,
            cfg.distance,
            query_labels=query_labels,
            topk=topk,
            map_at_k=cfg.map_at_k,
            memory_bytes=memory,
        )
        return {
            k: float(v[0])
            for k, v in result.as_dict().items()
            if k not in ("t", "cutoff", "nfr", "pfr")
        }

    def new_embeddings(variant: str, new_dir: Path) -> tuple[np.ndarray, np.ndarray]:
        query = load_array(new_dir / query_file, f"{variant} query embeddings")
        gallery = load_array(new_dir / gallery_file, f"{variant} gallery embeddings")
        return rows(query, nq, "new query"), rows(gallery, n, "new gallery")

    old_old = evaluate(old_query, old_gallery)
    # Seo et al.'s end condition (Eq. 7) compares with the independently trained new model.
    reference_system = params.evaluation.oracle_strategy
    reference_new_new = (
        evaluate(*new_embeddings(reference_system, Path(variants[reference_system])))
        if reference_system in variants
        else None
    )
    records: list[pd.DataFrame] = []
    per_query_tables: list[pd.DataFrame] = []
    curves: list[CurveSummary] = []
    skipped: list[dict[str, str]] = []
    for variant, new_dir_name in variants.items():
        new_dir = Path(new_dir_name)
        extra = {
            field: load_array(path, f"{variant} {field}", ndim=None)
            for field, path in arrays.get(variant, {}).items()
        }
        for field, value in extra.items():
            rows(value, nq if field in QUERY_FIELDS else n, f"{variant} {field}")
        sigma2 = extra.pop("sigma2", None)
        new_query, new_gallery = new_embeddings(variant, new_dir)
        serving = ServingArrays(
            old_query=old_query,
            old_gallery=old_gallery,
            new_query=new_query,
            new_gallery=new_gallery,
        )
        serving = replace(serving, **extra)
        assert serving.new_query is not None and serving.new_gallery is not None
        new_new = evaluate(serving.new_query, serving.new_gallery)
        forms = serving.forms()
        mixed = build_serving_mode("mixed").plan(forms)
        inputs = OrderingInputs(
            n=n,
            old_logits=logits,
            sigma2=None if sigma2 is None else np.asarray(sigma2).reshape(-1),
            old_state_vectors=serving.systems(mixed).gallery_old_side,
            new_vectors=serving.new_gallery,
            old_state_in_new_space=mixed.old_part.gallery == "forward" or variant in compatible,
        )
        policies = {name: build_ordering(name) for name in cfg.policies}
        orderings_of = {
            name: [
                policy.order_items(inputs, params.seed + i)
                for i in range(cfg.random_permutations if policy.draws_from_seed else 1)
            ]
            for name, policy in policies.items()
            if policy.available(inputs)
        }
        modes = {name: build_serving_mode(name) for name in cfg.serving_modes}
        plans = {name: mode.try_plan(forms) for name, mode in modes.items()}
        curves_of, ends_of, per_query_of = {}, {}, {}
        for mode_name, plan in plans.items():
            served = [
                (name, orderings)
                for name, orderings in orderings_of.items()
                if plan is not None and policies[name].orders_for(mode_name)
            ]
            if plan is None or not served:
                continue
            systems = serving.systems(plan)
            # The single-system ends of this mode's curves, the same for every policy.
            ends_of[mode_name] = (
                evaluate(systems.query_old_side, systems.gallery_old_side),
                evaluate(systems.query_new_side, systems.gallery_new_side),
            )
            # Every order of every policy over this mode's systems, each query block ranked once.
            results = iter(
                backfill_curves(
                    systems,
                    query_labels,
                    gallery_labels,
                    [ordering for _, orderings in served for ordering in orderings],
                    grid.cutoffs,
                    grid.t,
                    self_index=self_index,
                    distance=cfg.distance,
                    topk=topk,
                    map_at_k=cfg.map_at_k,
                    memory_bytes=memory,
                )
            )
            for name, orderings in served:
                drawn = [next(results) for _ in orderings]
                curves_of[name, mode_name] = mean_curve([r.as_dict() for r in drawn])
                per_query_of[name, mode_name] = mean_over_orders(
                    [per_query_values(r) for r in drawn]
                )
        for policy_name, policy in policies.items():
            if policy_name not in orderings_of:
                skipped.append(
                    {"strategy": variant, "policy": policy_name, "reason": policy.description}
                )
                continue
            orderings = orderings_of[policy_name]
            for mode_name, mode in modes.items():
                refused = (
                    None
                    if policy.orders_for(mode_name)
                    else f"the {policy_name} order is meant for {policy.serving_modes} only"
                )
                if refused or plans[mode_name] is None:
                    skipped.append(
                        {
                            "strategy": variant,
                            "policy": policy_name,
                            "mode": mode_name,
                            "reason": refused or mode.description,
                        }
                    )
                    continue
                log.info(
                    "%s / %s / %s: %d points over %d items, %d order(s)",
                    variant,
                    policy_name,
                    mode_name,
                    len(grid),
                    n,
                    len(orderings),
                )
                values = curves_of[policy_name, mode_name]
                per_query = per_query_of[policy_name, mode_name]
                per_query_tables.append(
                    per_query_table(variant, policy_name, mode_name, values["t"], per_query)
                )
                table = pd.DataFrame(values)
                table.insert(0, "permutations", len(orderings))
                table.insert(0, "deployable", policy.deployable)
                table.insert(0, "mode", mode_name)
                table.insert(0, "policy", policy_name)
                table.insert(0, "strategy", variant)
                records.append(table)
                start, end = ends_of[mode_name]
                curves.append(
                    CurveSummary(
                        strategy=variant,
                        policy=policy_name,
                        mode=mode_name,
                        deployable=policy.deployable,
                        auc_mean={m: auc_mean(values[m]) for m in start},
                        auc_trapezoid={m: auc_trapezoid(values["t"], values[m]) for m in start},
                        conditions={
                            m: check_conditions(
                                values[m],
                                old_old[m],
                                None if reference_new_new is None else reference_new_new[m],
                                drop_se=largest_drop_se(per_query[m]),
                            )
                            for m in ("top1", "mAP")
                        },
                        start={m: float(values[m][0]) for m in start},
                        end={m: float(values[m][-1]) for m in start},
                        start_single_system=start,
                        end_single_system=end,
                        endpoints_match=all(
                            abs(values[m][0] - start[m]) < 1e-9
                            and abs(values[m][-1] - end[m]) < 1e-9
                            for m in start
                        ),
                        max_negative_flip_rate=float(values["nfr"].max()),
                        new_new=new_new,
                        permutations=len(orderings),
                    )
                )
    if not records:
        raise UserError(
            "no (strategy, policy, serving mode) combination had the inputs it needs",
            hint="pass new embeddings with --variant and head outputs with --array",
        )

    tidy = pd.concat(records, ignore_index=True)
    metrics_dir, plots_dir = output_dirs(scenario, metrics_dir, plots_dir, layout)
    save_parquet(metrics_dir / CURVES_FILE, tidy)
    save_parquet(
        metrics_dir / BACKFILL_PER_QUERY_FILE, pd.concat(per_query_tables, ignore_index=True)
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
    summary = BackfillSummary(
        scenario=scenario,
        protocol="leave-one-out" if leave_one_out else "query-gallery",
        distance=cfg.distance,
        grid=GridRecord(kind=cfg.grid, t=grid.t.tolist(), cutoffs=grid.cutoffs.tolist()),
        gallery_size=n,
        queries=nq,
        old_old=old_old,
        reference_system=reference_system if reference_new_new is not None else None,
        reference_new_new=reference_new_new,
        primary_auc=cfg.primary_auc,
        curves=curves,
        skipped=skipped,
        policies_known=ORDERINGS.names(),
        serving_modes_known=SERVING_MODES.names(),
    )
    write_json(metrics_dir / BACKFILL_SUMMARY_FILE, summary.as_dict())
    plot_curves(tidy, summary, plots_dir / PLOT_FILE)
    log.info(
        "%d curves written to %s (%d combinations skipped)", len(curves), metrics_dir, len(skipped)
    )
    return summary


def report_files(metrics_dir: Path, plots_dir: Path) -> list[Path]:
    """The files of a study that a person reads: the summary, the curves as CSV, the plot."""
    return [
        metrics_dir / BACKFILL_SUMMARY_FILE,
        metrics_dir / CURVES_CSV_FILE,
        plots_dir / PLOT_FILE,
    ]
