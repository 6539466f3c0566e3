"""Stage: simulate online backfilling for one scenario, every (strategy, policy, serving mode) curve.

    python -m stages.simulate_backfill --params params.yaml --scenario extended-data \
        --old embeddings/extended-data/gen0 \
        --variant bct=embeddings/extended-data/gen1-bct \
        --variant fastfill=embeddings/extended-data/gen1-independent \
        --array fastfill:forward_gallery=head_outputs/extended-data/fastfill/gallery_transform.npy \
        --array fastfill:sigma2=head_outputs/extended-data/fastfill/gallery_sigma2.npy \
        --old-logits embeddings/extended-data/gen0/gallery_logits.npy

An embedding directory holds ``query.npy`` and ``gallery.npy`` (rows in the split files' order).
``--variant NAME=DIR`` is one upgraded system ("strategy" in the outputs) with its new embeddings;
``--array NAME:FIELD=PATH`` adds a head output to it: FIELD is one of forward_gallery (ψ(φ_old(g))),
sigma2 (FastFill σ² per gallery item), reverse_query (ψ_rev(φ_new(q))), rho_query, rho_gallery,
rho_reverse_query (Seo et al.'s full method). ``--old-logits``: the old classifier's logits (or
probabilities) on the gallery split, for the confidence and entropy orders. Every configured
combination whose inputs are present runs; the others are listed as skipped in the summary.

Writes metrics/<sc>/backfill_curves.{parquet,csv} (tidy: strategy, policy, mode, deployable, t,
cutoff, top-k, mAP, [mAP@k], nfr, pfr), metrics/<sc>/backfill_summary.json (AUCs both ways, Seo et
al.'s conditions, end-point identities), metrics/<sc>/backfill_plots/<curve>.csv (for dvc plots)
and plots/<sc>/backfill_curves.png.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from modelupgrade.backfill.study import (
    ARRAY_FIELDS,
    backfill_inputs,
    output_dirs,
    parse_pairs,
    report_files,
    simulate_backfill,
    summary_metrics,
)
from modelupgrade.config import Params
from modelupgrade.errors import exit_on_user_error
from modelupgrade.plugins import load_params
from modelupgrade.registry import track_stage
from modelupgrade.runtime import setup_logging

# parse_pairs stays importable from the stage, where tests and scripts have looked for it.
__all__ = ["main", "parse_pairs", "run"]


def run(
    params: Params,
    scenario: str,
    old: str | Path,
    variants: dict[str, str],
    arrays: dict[str, dict[str, str]] | None = None,
    old_logits: str | Path | None = None,
    query_split: str | Path | None = None,
    gallery_split: str | Path | None = None,
    metrics_dir: str | Path | None = None,
    plots_dir: str | Path | None = None,
) -> dict[str, Any]:
    """Simulate every available combination; returns the summary written to backfill_summary.json."""
    asked = {"scenario": scenario, "old": old, "variants": variants, "arrays": arrays, "old_logits": old_logits,
             "query_split": query_split, "gallery_split": gallery_split}
    with track_stage("simulate_backfill", params, run_name=f"simulate_backfill@{scenario}", arguments=asked) as stage:
        stage.set_tags({"scenario": scenario})
        stage.log_params({"seed": params.seed, "backfill": params.backfill,
                          "evaluation.protocol": params.evaluation.protocol})
        summary = simulate_backfill(params, scenario, old, variants, arrays, old_logits, query_split, gallery_split,
                                    metrics_dir, plots_dir)
        stage.log_metrics(summary_metrics(summary))
        stage.log_artifacts(report_files(*output_dirs(scenario, metrics_dir, plots_dir)), "backfill")
    return summary


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m stages.simulate_backfill", description=__doc__.split("\n\n")[0])
    parser.add_argument("--params", default="params.yaml", help="params file (default: params.yaml)")
    parser.add_argument("--scenario", required=True, help="scenario name in params.yaml")
    parser.add_argument("--embeddings-root",
                        help="the pipeline's layout: compare every strategy and head of the scenario found "
                             "under <root>/<sc>/ (gen0, gen1-<strategy>, <head>-<strategy>) instead of "
                             "--old/--variant/--array/--old-logits")
    parser.add_argument("--old", help="old model's embedding directory (query.npy, gallery.npy)")
    parser.add_argument("--variant", action="append", default=[], metavar="NAME=DIR",
                        help="an upgraded system: its name and new-model embedding directory (repeatable)")
    parser.add_argument("--array", action="append", default=[], metavar="NAME:FIELD=PATH",
                        help=f"a head output for a variant; FIELD in {', '.join(ARRAY_FIELDS)} (repeatable)")
    parser.add_argument("--old-logits", help="old classifier logits or probabilities on the gallery split (.npy)")
    parser.add_argument("--query-split", help="query split parquet (default data/splits/<sc>/query.parquet)")
    parser.add_argument("--gallery-split", help="gallery split parquet (default data/splits/<sc>/gallery.parquet)")
    parser.add_argument("--metrics-dir", help="output directory (default metrics/<sc>)")
    parser.add_argument("--plots-dir", help="plot directory (default plots/<sc>)")
    return parser


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> None:
    args = build_parser().parse_args(argv)
    setup_logging()
    params = load_params(args.params)
    found = backfill_inputs(params, args.scenario, args.embeddings_root, args.old, args.variant, args.array,
                            args.old_logits)
    run(params, args.scenario, found.old, found.variants, found.arrays,
        old_logits=found.old_logits, query_split=args.query_split, gallery_split=args.gallery_split,
        metrics_dir=args.metrics_dir, plots_dir=args.plots_dir)


if __name__ == "__main__":
    main()
