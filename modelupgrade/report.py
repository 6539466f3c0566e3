"""The study report: what `dvc repro` measured, as markdown and HTML a person reads.

The report is built from the files the evaluate and simulate_backfill stages write
(``metrics/<scenario>/summary.json``, ``backfill_summary.json``, ``metrics/sequential/<strategy>/
summary.json`` and the plots beside them); it computes nothing new. Its content is a list of
blocks (heading, paragraph, table, image) rendered twice, so the markdown and the HTML say the same.
"""

from __future__ import annotations

import html
import json
import math
import shutil
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from modelupgrade.config import Params
from modelupgrade.errors import UserError
from modelupgrade.io import atomic_path

SEQUENTIAL = "sequential"
OLD_MODEL = "gen0"


# --- blocks -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Heading:
    text: str
    level: int = 2


@dataclass(frozen=True)
class Paragraph:
    text: str


@dataclass(frozen=True)
class Table:
    columns: Sequence[str]
    rows: Sequence[Sequence[Any]]


@dataclass(frozen=True)
class Image:
    path: str  # relative to the report directory
    caption: str


Block = Heading | Paragraph | Table | Image


def _cell(value: Any) -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4f}"
    return str(value)


def render_markdown(title: str, blocks: Iterable[Block]) -> str:
    lines = [f"# {title}", ""]
    for block in blocks:
        if isinstance(block, Heading):
            lines += [f"{'#' * block.level} {block.text}", ""]
        elif isinstance(block, Paragraph):
            lines += [block.text, ""]
        elif isinstance(block, Table):
            lines.append("| " + " | ".join(block.columns) + " |")
            lines.append("|" + "---|" * len(block.columns))
            lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in block.rows]
            lines.append("")
        else:
            lines += [f"![{block.caption}]({block.path})", ""]
    return "\n".join(lines)


def render_html(title: str, blocks: Iterable[Block]) -> str:
    esc = html.escape
    parts = [
        "<!DOCTYPE html>", '<html lang="en"><head><meta charset="utf-8">', f"<title>{esc(title)}</title>",
        "<style>body{font-family:sans-serif;max-width:72em;margin:2em auto;padding:0 1em}"
        "table{border-collapse:collapse;margin:1em 0}td,th{border:1px solid #bbb;padding:.25em .6em;"
        "text-align:right}th{background:#eee}td:first-child,th:first-child{text-align:left}"
        "img{max-width:100%}figcaption{color:#555}</style></head><body>", f"<h1>{esc(title)}</h1>",
    ]
    for block in blocks:
        if isinstance(block, Heading):
            parts.append(f"<h{block.level}>{esc(block.text)}</h{block.level}>")
        elif isinstance(block, Paragraph):
            parts.append(f"<p>{esc(block.text)}</p>")
        elif isinstance(block, Table):
            head = "".join(f"<th>{esc(c)}</th>" for c in block.columns)
            body = "".join("<tr>" + "".join(f"<td>{esc(_cell(v))}</td>" for v in row) + "</tr>" for row in block.rows)
            parts.append(f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>")
        else:
            parts.append(f'<figure><img src="{esc(block.path)}" alt="{esc(block.caption)}">'
                         f"<figcaption>{esc(block.caption)}</figcaption></figure>")
    parts.append("</body></html>")
    return "\n".join(parts)


# --- what the stages measured -------------------------------------------------------------------


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UserError(f"{path} does not exist", hint="run the evaluate and simulate_backfill stages first (dvc repro)")
    return json.loads(path.read_text(encoding="utf-8"))


@dataclass
class ScenarioResults:
    name: str
    evaluation: dict[str, Any]
    backfill: dict[str, Any] | None
    heatmap: Path | None
    curves_plot: Path | None
    curves: Any = None  # the tidy backfill_curves table (pandas), when simulated

    @property
    def metric(self) -> str:
        return str(self.evaluation["headline_metric"])

    def rows(self, strategy: str) -> list[dict[str, Any]]:
        return list(self.evaluation["strategies"].get(strategy, []))

    def value(self, strategy: str, comparison: str) -> float | None:
        values = [r["value"] for r in self.rows(strategy) if r["comparison"] == comparison]
        return max(values) if values else None

    def row(self, strategy: str, comparison: str) -> dict[str, Any] | None:
        return next((r for r in self.rows(strategy) if r["comparison"] == comparison), None)


@dataclass
class StudyResults:
    scenarios: list[ScenarioResults]
    sequential: dict[str, dict[str, Any]] = field(default_factory=dict)
    sequential_plots: dict[str, Path] = field(default_factory=dict)


def collect_results(params: Params, metrics_root: str | Path, plots_root: str | Path) -> StudyResults:
    metrics_root, plots_root = Path(metrics_root), Path(plots_root)
    scenarios = []
    for name in params.scenarios:
        backfill_path = metrics_root / name / "backfill_summary.json"
        heatmap = plots_root / name / "cross_model_heatmap.png"
        curves = plots_root / name / "backfill_curves.png"
        scenarios.append(ScenarioResults(
            name=name,
            evaluation=_read_json(metrics_root / name / "summary.json"),
            backfill=_read_json(backfill_path) if backfill_path.is_file() else None,
            heatmap=heatmap if heatmap.is_file() else None,
            curves_plot=curves if curves.is_file() else None,
            curves=pd.read_parquet(tidy) if (tidy := metrics_root / name / "backfill_curves.parquet").is_file() else None,
        ))
    study = StudyResults(scenarios)
    for strategy in params.sequential.strategies:
        summary = metrics_root / SEQUENTIAL / strategy / "summary.json"
        if summary.is_file():
            study.sequential[strategy] = _read_json(summary)
            plot = plots_root / SEQUENTIAL / strategy / "cross_model_heatmap.png"
            if plot.is_file():
                study.sequential_plots[strategy] = plot
    return study


# --- the papers' claims -------------------------------------------------------------------------


@dataclass(frozen=True)
class Claim:
    statement: str
    holds: bool | None  # None: this study has no evidence either way
    evidence: str


def _verdict(holds: bool | None) -> str:
    return {True: "holds", False: "does not hold", None: "not tested"}[holds]


def _fmt(value: float | None) -> str:
    return "–" if value is None else f"{value:.4f}"


def _all_or_none(checks: list[bool]) -> bool | None:
    return all(checks) if checks else None


def _curve_value(sc: ScenarioResults, strategy: str, policy: str, mode: str, t: float, metric: str = "mAP") -> float | None:
    if sc.curves is None:
        return None
    rows = sc.curves[(sc.curves.strategy == strategy) & (sc.curves.policy == policy) & (sc.curves["mode"] == mode)]
    rows = rows[(rows.t - t).abs() < 1e-9]
    return float(rows[metric].iloc[0]) if len(rows) else None


def _curve(sc: ScenarioResults, strategy: str, policy: str, mode: str) -> dict[str, Any] | None:
    return next((c for c in (sc.backfill or {}).get("curves", [])
                 if (c["strategy"], c["policy"], c["mode"]) == (strategy, policy, mode)), None)


def _claim(statement: str, checks: list[tuple[bool, str]], missing: str) -> Claim:
    return Claim(statement, _all_or_none([ok for ok, _ in checks]), "; ".join(text for _, text in checks) or missing)


def check_claims(study: StudyResults) -> list[Claim]:
    """Each of the papers' claims, checked wherever this study has the numbers for it."""
    compatible, loses, narrows, forward, reverse, monotone, sigma = [], [], [], [], [], [], []
    for sc in study.scenarios:
        old_self, oracle_self = sc.evaluation.get("old_self"), sc.evaluation.get("oracle_self")
        cross, bct_self = sc.value("bct", "backward"), sc.value("bct", "self")
        if cross is not None and old_self is not None:
            compatible.append((cross > old_self, f"{sc.name}: M(BCT, old) = {cross:.4f} vs M(old, old) = {old_self:.4f}"))
        if bct_self is not None and oracle_self is not None:
            loses.append((bct_self < oracle_self,
                          f"{sc.name}: M(BCT, BCT) = {bct_self:.4f} vs independent {oracle_self:.4f}"))
        bct, dmu = sc.row("bct", "self"), sc.row("dmu", "self")
        if bct is not None and dmu is not None:
            narrows.append((dmu["delta_down_pct"] < bct["delta_down_pct"],
                            f"{sc.name}: Δ↓ DMU {dmu['delta_down_pct']:.2f}% vs BCT {bct['delta_down_pct']:.2f}%"))
        for strategy in sc.evaluation["strategies"]:
            backward = sc.value(strategy, "backward")
            for row in sc.rows(strategy):
                if row["comparison"] != "forward-head" or backward is None or old_self is None:
                    continue
                # An incompatible (independent) new model is measured against old/old, as FCT does.
                incompatible = sc.evaluation.get("oracle") == row["query_set"]
                reference, label = (old_self, "M(old, old)") if incompatible else (backward, f"M({strategy}, old)")
                forward.append((row["value"] > reference,
                                f"{sc.name}: M({row['query_set']}, {row['gallery_set']}) = {row['value']:.4f} vs "
                                f"{label} = {reference:.4f}"))
        for variant in {c["strategy"] for c in (sc.backfill or {}).get("curves", []) if c["mode"] == "rank-merge-rqt"}:
            base = variant.split("-", 1)[1] if "-" in variant else variant
            with_head = _curve_value(sc, variant, "random", "rank-merge-rqt", 0.5)
            naive = _curve_value(sc, base, "random", "rank-merge", 0.5)
            if with_head is not None and naive is not None:
                reverse.append((with_head > naive, f"{sc.name}: {variant} rank merge at t = 0.5: mAP {with_head:.4f} "
                                                   f"vs naive two-model merge {naive:.4f}"))
        for curve in (sc.backfill or {}).get("curves", []):
            if curve["mode"] == "rank-merge" and curve["deployable"]:
                conditions = curve["conditions"]["mAP"]
                monotone.append((bool(conditions["monotone"]),
                                 f"{sc.name} {curve['strategy']}/{curve['policy']}: "
                                 + ("monotone" if conditions["monotone"] else f"largest drop {conditions['largest_drop']:.4f}")))
            if curve["policy"] == "fastfill-uncertainty" and curve["mode"] == "mixed":
                random_order = _curve(sc, curve["strategy"], "random", "mixed")
                if random_order is not None:
                    primary = sc.backfill.get("primary_auc", "auc_trapezoid")
                    ours, theirs = curve[primary]["mAP"], random_order[primary]["mAP"]
                    sigma.append((ours > theirs, f"{sc.name} {curve['strategy']}: AUC mAP σ² order {ours:.4f} vs "
                                                 f"random {theirs:.4f}"))
    return [
        _claim("BCT is backward compatible: M(φ_new^BCT, φ_old) > M(φ_old, φ_old).", compatible, "BCT was not evaluated"),
        _claim("BCT loses new-to-new accuracy against the independently trained new model.", loses,
               "BCT or the independent model was not evaluated"),
        _claim("DMU narrows BCT's new-to-new loss (smaller Δ↓).", narrows, "BCT or DMU was not evaluated"),
        _claim("Forward adapters ψ raise new-to-old retrieval: M(new, ψ(old)) above M(new, old) for compatible new "
               "models, and above M(old, old) for an independent one (FCT).", forward, "no forward head was evaluated"),
        _claim("Reverse query transforms (RQT/MCL) make rank merge beat the naive two-model merge at t = 0.5.", reverse,
               "no reverse transform was simulated"),
        _claim("Distance rank merge gives a monotone backfill curve (Seo et al.'s third condition, mAP).", monotone,
               "no rank-merge curve was simulated"),
        _claim("FastFill's σ² order backfills better than a random order for the same adapter (AUC of mAP).", sigma,
               "no FastFill adapter was simulated"),
    ]


# --- the document -------------------------------------------------------------------------------


def scenario_blocks(sc: ScenarioResults, images: dict[Path, str]) -> list[Block]:
    ev = sc.evaluation
    m = sc.metric
    blocks: list[Block] = [
        Heading(f"Scenario {sc.name}", 2),
        Paragraph(f"{m} over the {ev['protocol'].get('description', ev['protocol'].get('name', 'query-gallery'))} "
                  f"protocol. M(old, old) = {_fmt(ev.get('old_self'))}; the independently trained new model "
                  f"(the oracle of Δ↓) reaches M(new, new) = {_fmt(ev.get('oracle_self'))}.")
        if isinstance(ev.get("protocol"), dict) else
        Paragraph(f"M(old, old) = {_fmt(ev.get('old_self'))}; independent M(new, new) = {_fmt(ev.get('oracle_self'))}."),
    ]
    rows = []
    for strategy in ev["strategies"]:
        heads = [r for r in sc.rows(strategy) if r["comparison"] in ("forward-head", "reverse-head")]
        best_head = max(heads, key=lambda r: r["value"]) if heads else None
        self_row, backward = sc.row(strategy, "self"), sc.row(strategy, "backward")
        rows.append([
            strategy,
            self_row["value"] if self_row else None,
            backward["value"] if backward else None,
            best_head["value"] if best_head else None,
            (best_head["query_set"] if best_head["comparison"] == "reverse-head" else best_head["gallery_set"]) if best_head else None,
            max([r["delta_up_pct"] for r in [backward, best_head] if r], default=None),
            self_row["delta_down_pct"] if self_row else None,
            backward["negative_flip_rate"] if backward and "negative_flip_rate" in backward else None,
        ])
    blocks.append(Table(
        ["strategy", f"M(new, new)", f"M(new, old)", "M via best head", "head", "Δ↑ % (best)", "Δ↓ %",
         "flip rate (new, old)"], rows))
    if sc.heatmap is not None:
        blocks.append(Image(images[sc.heatmap], f"{sc.name}: every (query set, gallery set) pair"))
    if sc.backfill:
        blocks.append(Heading(f"Online backfilling ({sc.name})", 3))
        primary = sc.backfill.get("primary_auc", "auc_trapezoid")
        curve_rows = [
            [c["strategy"], c["policy"], c["mode"], c["deployable"], c["auc_trapezoid"]["mAP"], c["auc_mean"]["mAP"],
             c["conditions"]["mAP"]["starts_at_or_above_old"], c["conditions"]["mAP"]["ends_at_or_above_new"],
             c["conditions"]["mAP"]["monotone"]]
            for c in sorted(sc.backfill["curves"], key=lambda c: -c[primary]["mAP"])
        ]
        blocks.append(Paragraph(
            f"{len(curve_rows)} curves over {sc.backfill['gallery_size']} gallery items, {len(sc.backfill['grid']['t'])} "
            f"points; sorted by {primary.replace('_', ' ')} of mAP. Conditions are Seo et al.'s: the curve starts at "
            "or above M(old, old), ends at or above M(new, new), and never drops. The oracle order needs every "
            "new embedding and is an upper bound, not a deployable policy."))
        blocks.append(Table(["system", "policy", "serving mode", "deployable", "AUC mAP (trapezoid)", "AUC mAP (mean)",
                             "start ≥ old", "end ≥ new", "monotone"], curve_rows))
        if sc.curves_plot is not None:
            blocks.append(Image(images[sc.curves_plot], f"{sc.name}: backfill curves"))
    return blocks


def sequential_blocks(study: StudyResults, images: dict[Path, str]) -> list[Block]:
    if not study.sequential:
        return []
    blocks: list[Block] = [
        Heading("Sequential upgrades", 2),
        Paragraph("gen0 → gen1 → gen2 on growing data. M[i, j] = metric(queries of generation i, gallery of "
                  "generation j), j ≤ i. AC counts the off-diagonal pairs that beat the gallery generation's own "
                  "self-test (strict < and ≤); AM is the mean of the lower triangle; BC and FC as in the papers."),
    ]
    for strategy, summary in study.sequential.items():
        metric = summary["headline_metric"]
        compat = summary["compatibility"][metric]
        generations = compat["generations"]
        rows = [[q, *[compat["matrix"][i][j] if j <= i else None for j in range(len(generations))]]
                for i, q in enumerate(generations)]
        blocks.append(Heading(f"{strategy} ({metric})", 3))
        blocks.append(Table(["query \\ gallery", *generations], rows))
        scalars = {k: v for k, v in compat.items() if k not in ("matrix", "generations", "metric")}
        blocks.append(Table(list(scalars), [list(scalars.values())]))
        if strategy in study.sequential_plots:
            blocks.append(Image(images[study.sequential_plots[strategy]], f"sequential {strategy}: compatibility matrix"))
    return blocks


def claim_blocks(claims: Sequence[Claim]) -> list[Block]:
    return [
        Heading("Do the papers' claims hold here?", 2),
        Paragraph("Each claim is checked on every scenario where this study has the numbers; it holds only where "
                  "it holds on all of them. A small CPU study can contradict a paper: the verdicts say what this "
                  "run measured, nothing more."),
        Table(["claim", "verdict", "evidence"], [[c.statement, _verdict(c.holds), c.evidence] for c in claims]),
    ]


def metadata_blocks(metadata: dict[str, Any], stage_seconds: dict[str, float]) -> list[Block]:
    blocks: list[Block] = [Heading("Run metadata", 2), Table(["item", "value"], [[k, v] for k, v in metadata.items()])]
    if stage_seconds:
        rows = [[name, seconds] for name, seconds in sorted(stage_seconds.items())]
        blocks += [Paragraph(f"Wall time per stage (seconds, {sum(stage_seconds.values()):.0f} s in all), from the "
                             "stage runs in the MLflow store; a stage that DVC skipped shows its last run."),
                   Table(["stage", "seconds"], rows)]
    else:
        blocks.append(Paragraph("No stage wall times were found in the MLflow store."))
    return blocks


def write_report(
    study: StudyResults,
    metadata: dict[str, Any],
    stage_seconds: dict[str, float],
    out_dir: str | Path,
    title: str = "modelupgrade study",
) -> list[Path]:
    """Write ``report.md``, ``report.html`` and the plots they show into ``out_dir`` (atomically)."""
    out_dir = Path(out_dir)
    plots = [p for sc in study.scenarios for p in (sc.heatmap, sc.curves_plot) if p is not None]
    plots += list(study.sequential_plots.values())
    images = {p: f"plots/{p.parent.name}__{p.name}" if p.parent.name in study.sequential_plots
              else f"plots/{p.parent.name}_{p.name}" for p in plots}
    claims = check_claims(study)
    blocks: list[Block] = [
        Paragraph("The upgrade study of params.yaml: per scenario the papers' table (M(old, old), the independent "
                  "M(new, new), and per strategy M(new, new), M(new, old), M through its heads, Δ↑ and Δ↓ as the DMU "
                  "paper defines them), the online-backfilling curves, the sequential-upgrade matrices, and whether "
                  "the papers' claims hold on this data."),
        *claim_blocks(claims),
    ]
    for sc in study.scenarios:
        blocks += scenario_blocks(sc, images)
    blocks += sequential_blocks(study, images)
    blocks += metadata_blocks(metadata, stage_seconds)
    with atomic_path(out_dir) as tmp:
        (tmp / "plots").mkdir(parents=True)
        for source, name in images.items():
            shutil.copyfile(source, tmp / name)
        (tmp / "report.md").write_text(render_markdown(title, blocks), encoding="utf-8")
        (tmp / "report.html").write_text(render_html(title, blocks), encoding="utf-8")
        (tmp / "claims.json").write_text(json.dumps(
            [{"statement": c.statement, "holds": c.holds, "evidence": c.evidence} for c in claims], indent=2) + "\n",
            encoding="utf-8")
    return [out_dir / "report.md", out_dir / "report.html", out_dir / "claims.json"]


def stage_wall_times(tracker: Any) -> dict[str, float]:
    """Seconds of the latest finished run of every stage in the tracking store (name → seconds)."""
    runs = tracker.client.search_runs(
        [tracker.experiment_id], filter_string="attributes.status = 'FINISHED'", order_by=["attributes.start_time DESC"],
        max_results=5000,
    )
    seconds: dict[str, float] = {}
    for run in runs:
        stage = run.data.tags.get("stage")
        if stage and stage not in seconds and run.info.end_time:
            seconds[stage] = (run.info.end_time - run.info.start_time) / 1000.0
    return seconds
