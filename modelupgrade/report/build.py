"""The study report: what ``dvc repro`` measured, as markdown and HTML a person reads.

What to use per scenario over the seeds (``lead``); the verdicts on the papers' claims, how they are
reached and the curves they compare (``claim_curves``); whether every model and head trained
(``fits``); the levels over the seeds and the settings against the papers; per scenario the papers'
table, the adapters, the cross-model heatmap and the backfill curves; the sequential compatibility
matrices; run metadata. Numbers as ``numbers`` writes them. Written with ``atomic_path``: a report
directory is either the old one or the complete new one.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Sequence
from pathlib import Path

from modelupgrade.backfill.summary import BackfillSummary
from modelupgrade.config import Params, params_hash
from modelupgrade.evaluation.summary import (
    BACKWARD,
    HEAD_COMPARISONS,
    SELF,
)
from modelupgrade.io import atomic_path
from modelupgrade.registry.provenance import dvc_data_hash, git_commit
from modelupgrade.report.adapters import adapter_blocks
from modelupgrade.report.claim_curves import write_claim_curves
from modelupgrade.report.claims import COMPARABLE_PAIR, DIP_Z, Claim, check_claims
from modelupgrade.report.document import (
    Block,
    Details,
    Heading,
    Image,
    Paragraph,
    Table,
    render_html,
    render_markdown,
)
from modelupgrade.report.fits import fit_blocks
from modelupgrade.report.gpu_scale import gpu_scale_blocks
from modelupgrade.report.lead import lead_blocks, scenario_runs
from modelupgrade.report.numbers import (
    M_DIGITS,
    PERCENT_DIGITS,
    PRECISION_RULE,
    fixed,
    p_value,
    spread,
)
from modelupgrade.report.results import CURVE_METRIC, ScenarioResults, StudyResults
from modelupgrade.report.statistics import ALPHA, MIN_SEEDS, PairedTest

M, PCT = M_DIGITS, PERCENT_DIGITS


def _fmt(value: float | None) -> str:
    return fixed(value, M_DIGITS)


def scenario_blocks(sc: ScenarioResults, images: dict[Path, str]) -> list[Block]:
    ev = sc.evaluation
    old_self, oracle_self = _fmt(ev.old_self), _fmt(ev.oracle_self)
    described = ev.protocol.get("description", ev.protocol.get("name", "query-gallery"))
    intro = Paragraph(
        f"{sc.metric} over the {described} protocol. M(old, old) = {old_self}; the "
        "independently trained new model (the oracle of Δ↓) reaches M(new, new) = "
        f"{oracle_self}."
    )
    blocks: list[Block] = [Heading(f"Scenario {sc.name}", 2), intro]
    rows = []
    for strategy in ev.strategies:
        heads = [r for r in sc.rows(strategy) if r.comparison in HEAD_COMPARISONS]
        best_head = max(heads, key=lambda r: r.value) if heads else None
        self_row, backward = sc.row(strategy, SELF), sc.row(strategy, BACKWARD)
        rows.append(
            [
                strategy,
                self_row.value if self_row else None,
                backward.value if backward else None,
                best_head.value if best_head else None,
                best_head.head_set if best_head else None,
                max([r.delta_up_pct for r in [backward, best_head] if r], default=None),
                self_row.delta_down_pct if self_row else None,
                backward.negative_flip_rate if backward else None,
            ]
        )
    columns = [
        "strategy",
        "M(new, new)",
        "M(new, old)",
        "M via best head",
        "head",
        "Δ↑ % (best)",
        "Δ↓ %",
        "flip rate (new, old)",
    ]
    blocks.append(Table(columns, rows, digits=(0, M, M, M, 0, PCT, PCT, M)))
    blocks += adapter_blocks(sc)
    if sc.heatmap is not None:
        blocks.append(Image(images[sc.heatmap], f"{sc.name}: every (query set, gallery set) pair"))
    if sc.backfill:
        blocks += backfill_blocks(sc, images)
    return blocks


def _reference_text(backfill: BackfillSummary) -> str:
    if backfill.reference_new_new is None:
        return "M(new, new) of an independently trained new model (not in this study: untested)"
    value = backfill.reference_new_new[CURVE_METRIC]
    return (
        f"M(new, new) of the independently trained new model ({backfill.reference_system}, "
        f"{CURVE_METRIC} {value:.3f})"
    )


def backfill_blocks(sc: ScenarioResults, images: dict[Path, str]) -> list[Block]:
    backfill, primary, metric = sc.backfill, sc.primary_auc, CURVE_METRIC
    assert backfill is not None
    curve_rows = []
    for c in sorted(backfill.curves, key=lambda c: -c.auc(primary)[metric]):
        conditions = c.conditions[metric]
        curve_rows.append(
            [
                c.strategy,
                c.policy,
                c.mode,
                c.deployable,
                c.auc_trapezoid[metric],
                c.auc_mean[metric],
                conditions.starts_at_or_above_old,
                conditions.ends_at_or_above_new,
                conditions.monotone,
            ]
        )
    blocks: list[Block] = [
        Heading(f"Online backfilling ({sc.name})", 3),
        Paragraph(
            f"{len(curve_rows)} curves over {backfill.gallery_size} gallery items, "
            f"{len(backfill.grid.t)} points; sorted by {primary.replace('_', ' ')} of "
            f"{metric}. Conditions are Seo et al.'s (Eqs. 6–8): the curve starts at or above "
            f"M(old, old), ends at or above {_reference_text(backfill)}, and never drops. The "
            "oracle order backfills first the items whose served vector lies farthest from their "
            "new vector, ‖φ_new − φ_old-state‖ (mixed index only): it reads every new embedding, "
            "so it is a reference, not a deployable policy and not an upper bound, and it is not "
            "FastFill's Cheating order (which ranks by the per-item training loss)."
        ),
        Table(
            [
                "system",
                "policy",
                "serving mode",
                "deployable",
                f"AUC {metric} (trapezoid)",
                f"AUC {metric} (mean)",
                "start ≥ old",
                "end ≥ new",
                "monotone",
            ],
            curve_rows,
            digits=M,
        ),
    ]
    if sc.curves_plot is not None:
        blocks.append(Image(images[sc.curves_plot], f"{sc.name}: backfill curves"))
    return blocks


def sequential_blocks(study: StudyResults, images: dict[Path, str]) -> list[Block]:
    if not study.sequential:
        return []
    blocks: list[Block] = [
        Heading("Sequential upgrades", 2),
        Paragraph(
            "gen0 → gen1 → gen2 on growing data. M[i, j] = metric(queries of generation i, "
            "gallery of generation j), j ≤ i. AC counts the off-diagonal pairs that beat the "
            "gallery generation's own self-test (strict < and ≤); AM is the mean of the lower "
            "triangle; BC and FC as in the papers."
        ),
    ]
    for strategy, summary in study.sequential.items():
        metric = summary.headline_metric
        compat = summary.compatibility[metric]
        generations = compat.generations
        rows = [
            [q, *[compat.matrix[i][j] if j <= i else None for j in range(len(generations))]]
            for i, q in enumerate(generations)
        ]
        blocks.append(Heading(f"{strategy} ({metric})", 3))
        blocks.append(Table(["query \\ gallery", *generations], rows, digits=M))
        scalars = dict(sorted(compat.numbers().items()))
        blocks.append(Table(list(scalars), [list(scalars.values())], digits=M))
        if strategy in study.sequential_plots:
            plot = images[study.sequential_plots[strategy]]
            blocks.append(Image(plot, f"sequential {strategy}: compatibility matrix"))
    refresh_rows = [
        [
            strategy,
            step.generation,
            step.current_gallery,
            step.on_current,
            step.refreshed_gallery,
            step.on_refreshed,
        ]
        for strategy, summary in study.sequential.items()
        for step in summary.refreshes.get(summary.headline_metric, [])
    ]
    if refresh_rows:
        blocks += [
            Heading("The gallery along each chain", 3),
            Paragraph(
                "As BiCT (Table 6) reads a sequential upgrade: generation i goes live and its "
                "queries search the gallery the chain holds (gen0's vectors, or F_{i−1} where a "
                "forward head refreshed it: M_BCT); a chain with a head then refreshes the gallery "
                "to F_i = ψ_i(…) without images and searches that (M_FCT)."
            ),
            Table(
                ["chain", "generation", "gallery held", "M on it", "refreshed to", "M on it"],
                refresh_rows,
                digits=M,
            ),
        ]
    return blocks


def seed_blocks(seeds: Sequence[StudyResults]) -> list[Block]:
    """Per scenario, the old and the independently trained new model's levels over the training
    seeds: whether the upgrade is an upgrade by more than a seed would change (a paired t-test of
    the gain, as the claims test theirs)."""
    if len(seeds) < 2 or not seeds[0].scenarios:
        return []
    rows, unclear = [], []
    for sc in seeds[0].scenarios:
        pairs = [
            (run.evaluation.old_self, run.evaluation.oracle_self)
            for run in scenario_runs(seeds, sc.name)
            if run.evaluation.oracle_self is not None
        ]
        gains = [new - old for old, new in pairs]
        test = PairedTest.of(gains)
        clear = test.n >= MIN_SEEDS and test.p < ALPHA and test.mean > 0
        if not clear:
            unclear.append(sc.name)
        rows.append(
            [
                sc.name,
                spread([old for old, _ in pairs]),
                spread([new for _, new in pairs]),
                spread(gains, sign=True),
                test.n,
                p_value(test.p),
                "yes" if clear else "no",
            ]
        )
    return [
        Heading("Across training seeds", 2),
        Paragraph(
            f"{seeds[0].scenarios[0].metric} of the old model and of the "
            "independently trained new model, mean ± standard deviation over the training seeds "
            "of each scenario (the study's own and the replicates', params.yaml replicates). An "
            f"upgrade is clear where a paired t-test of the new model's gain over the seeds gives "
            f"p < {ALPHA} (at least {MIN_SEEDS} seeds) and the gain is positive."
            + (
                f" Not clear here: {', '.join(unclear)}; a claim checked there compares a new "
                "model that is not better than the old one, which the papers' settings assume."
                if unclear
                else ""
            )
        ),
        Table(
            [
                "scenario",
                "M(old, old)",
                "independent M(new, new)",
                "gain",
                "seeds",
                "paired t, p",
                "clear upgrade",
            ],
            rows,
        ),
    ]


def settings_blocks(study: StudyResults) -> list[Block]:
    """Where the study's settings leave the papers', each with its reason."""
    if not study.settings:
        return []
    return [
        Heading("Settings against the papers", 2),
        Paragraph(
            "The settings of this study that differ from the papers' (params.yaml; the "
            "full-size study, params/gpu-full.yaml, keeps more of them), and why. Every claim "
            "above is checked under these settings."
        ),
        Table(
            ["setting", "papers", "this study", "why"],
            [[s.setting, s.paper, s.ours, s.reason] for s in study.settings],
        ),
    ]


def verdict_rule(seeds: int) -> list[Block]:
    """How a claim's verdict is reached: the statistics of ``modelupgrade.report.statistics``, the
    premises and the convergence gate of ``modelupgrade.report.claims``."""
    text = (
        "A check compares two numbers of the same training seed "
        "(M(BCT, old) against M(old, old), one backfill curve's area against another's), so its "
        f"margin, the difference in the direction the paper claims, is paired across the {seeds} "
        "seeds of this study (its own and the replicates'). A paired t-test (two-sided, n − 1 "
        f"degrees of freedom, at least {MIN_SEEDS} seeds) tests the mean margin against zero; "
        "Holm's step-down correction adjusts the p-values across a claim's checks, so that the "
        f"chance of any false verdict among them stays below α = {ALPHA}. A check holds where its "
        "adjusted p < α and the mean margin lies in the paper's direction; it fails only where "
        "adjusted p < α and the mean lies against it, so that its interval excludes the paper's "
        "direction; otherwise it is inconclusive. A claim fails where one of its checks fails, "
        "holds where every one holds, and is inconclusive otherwise. Beside the seeds' spread "
        "each check shows its query-bootstrap standard error: how far another draw of the same "
        "number of test queries would move the margin at one seed (the queries drawn again with "
        "replacement); a spread over seeds well above it says the training seed, not the query "
        "sample, moves the result. A dip of a backfill curve counts only beyond "
        f"{DIP_Z} of its query standard errors. Premises: a check whose paper assumes what a seed "
        "does not give (a backward-compatible new model for BiCT's and DMU's ψ; an old model "
        f"within {100 * COMPARABLE_PAIR:.0f} % of the new one's M for Drift-Adapter) leaves that "
        "seed out. The convergence gate: a seed whose model or head a check rests on failed the "
        "gate (see 'Did every model and head train?') is left out too, and a check with no seed "
        "left is 'not tested (anchor model did not converge)', never 'fails'."
    )
    return [Heading("How the verdicts are reached", 3), Paragraph(text)]


def claim_blocks(
    claims: Sequence[Claim], seeds: int = 1, curves: dict[str, str] | None = None
) -> list[Block]:
    """The claims table with how its verdicts are reached, each claim's evidence, and the curves
    the backfilling claims compare (``curves``: scenario → the figure's path in the report)."""
    rows = [
        [f"{i}. {c.statement}", c.source, c.paper, c.ours, c.verdict]
        for i, c in enumerate(claims, 1)
    ]
    blocks: list[Block] = [
        Heading("Do the papers' claims hold here?", 2),
        Paragraph(
            "Each claim is stated as narrowly as its paper states it, and checked only on the "
            "scenarios of its scope (the details below name them, with the metric and the "
            "protocol); a NaN number leaves a check not measured. The paper column gives the "
            "paper's own numbers (– where it shows figures only; the papers' models and data are "
            "far larger than this study's), ours the numbers compared here"
            + (
                " (mean ± sd over the seeds that tested them). "
                if seeds > 1
                else ". One training seed: no check can be tested, every verdict is open. "
            )
            + "A small CPU study can contradict a paper: the verdicts say what this run "
            "measured, nothing more."
        ),
        *verdict_rule(seeds),
        Table(["claim", "source", "paper", "ours", "verdict"], rows),
    ]
    for i, c in enumerate(claims, 1):
        scope = c.scope
        items = [
            f"Source: {c.source}.",
            f"Scope: {', '.join(scope.scenarios)}; {scope.metric}; {scope.protocol}.",
            f"Not checked elsewhere: {scope.elsewhere}.",
            f"Paper: {c.paper or 'no number (figures only)'}.",
            *(c.checked or [c.unchecked]),
            *(f"Outside the scope, not counted: {check.line}" for check in c.outside),
        ]
        blocks.append(Details(f"{i}. {c.statement} Verdict: {c.verdict}.", items))
    for scenario, path in (curves or {}).items():
        blocks += [
            Heading(f"The claims' curves ({scenario})", 3),
            Paragraph(
                "The backfill curves the claims above compare, each the mean over the seeds that "
                "simulated it with a band of ± one standard deviation (the legend gives the "
                "seeds), beside M(old, old): the random order is itself the mean of "
                "backfill.random_permutations orders at each seed."
            ),
            Image(path, f"{scenario}: the curves the claims compare, over the seeds"),
        ]
    return blocks


def metadata_blocks(metadata: dict[str, str], stage_seconds: dict[str, float]) -> list[Block]:
    blocks: list[Block] = [
        Heading("Run metadata", 2),
        Table(["item", "value"], [[k, v] for k, v in metadata.items()]),
    ]
    # The report stage's own run opens after the report is written, to log it: its time (the
    # last report's logging, milliseconds) is not a stage's wall time.
    stage_seconds = {name: s for name, s in stage_seconds.items() if name != "report"}
    if stage_seconds:
        rows = [[name, seconds] for name, seconds in sorted(stage_seconds.items())]
        blocks += [
            Paragraph(
                f"Wall time per stage (seconds, {sum(stage_seconds.values()):.0f} s in all), from "
                "the stage runs in the MLflow store; a stage that DVC skipped shows its last run."
            ),
            Table(["stage", "seconds"], rows, digits=1),
        ]
    else:
        blocks.append(Paragraph("No stage wall times were found in the MLflow store."))
    return blocks


def run_metadata(params: Params, study: StudyResults) -> dict[str, str]:
    """What the report says about the run: git commit, params and DVC data hashes, seeds, the
    device the evaluations ran on, the dataset."""
    devices = sorted({sc.evaluation.device for sc in study.scenarios if sc.evaluation.device})
    return {
        "git commit": git_commit(),
        "params hash": params_hash(params),
        "DVC data hash": dvc_data_hash(),
        "seed": f"{params.seed} (generation g trains with seed {params.seed} + g)",
        "replicate seeds": ", ".join(map(str, params.replicates.seeds)) or "none",
        "device": ", ".join(devices) or params.device,
        "dataset": f"{params.dataset.name} ({params.dataset.loader} loader, {params.dataset.root})",
    }


def write_report(
    study: StudyResults,
    metadata: dict[str, str],
    stage_seconds: dict[str, float],
    out_dir: str | Path,
    title: str = "modelupgrade study",
    replicates: Sequence[StudyResults] = (),
) -> list[Path]:
    """Write ``report.md``, ``report.html``, ``claims.json`` and the plots they show into
    ``out_dir`` (atomically)."""
    out_dir = Path(out_dir)
    plots = [p for sc in study.scenarios for p in (sc.heatmap, sc.curves_plot) if p is not None]
    plots += list(study.sequential_plots.values())
    # Plots of different scenarios share file names: the copies are named after their folder.
    images = {
        p: f"plots/{p.parent.name}__{p.name}"
        if p.parent.name in study.sequential_plots
        else f"plots/{p.parent.name}_{p.name}"
        for p in plots
    }
    seeds = [study, *replicates]
    claims = check_claims(study, replicates)
    verdicts = [c.as_dict() for c in claims]
    with atomic_path(out_dir) as tmp:
        (tmp / "plots").mkdir(parents=True)
        for source, name in images.items():
            shutil.copyfile(source, tmp / name)
        curves = {
            scenario: f"plots/{path.name}"
            for scenario, path in write_claim_curves(claims, seeds, tmp / "plots").items()
        }
        blocks: list[Block] = [
            Paragraph(
                "The upgrade study of params.yaml: per scenario the papers' table (M(old, old), "
                "the independent M(new, new), and per strategy M(new, new), M(new, old), M "
                "through its heads, Δ↑ and Δ↓ as the DMU paper defines them), the "
                "online-backfilling curves, the sequential-upgrade matrices, whether every model "
                "trained, and whether the papers' claims hold on this data. " + PRECISION_RULE
            ),
            *lead_blocks(seeds),
            *claim_blocks(claims, len(seeds), curves),
            *fit_blocks(seeds),
            *seed_blocks(seeds),
            *gpu_scale_blocks(seeds, claims),
            *settings_blocks(study),
        ]
        for sc in study.scenarios:
            blocks += scenario_blocks(sc, images)
        blocks += sequential_blocks(study, images)
        blocks += metadata_blocks(metadata, stage_seconds)
        (tmp / "report.md").write_text(render_markdown(title, blocks), encoding="utf-8")
        (tmp / "report.html").write_text(render_html(title, blocks), encoding="utf-8")
        (tmp / "claims.json").write_text(json.dumps(verdicts, indent=2) + "\n", encoding="utf-8")
    return [out_dir / "report.md", out_dir / "report.html", out_dir / "claims.json"]
