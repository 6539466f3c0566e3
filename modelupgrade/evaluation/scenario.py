"""Cross-model evaluation of one scenario from the study's files: matrix, heatmap, Δ↑ / Δ↓ / flips.

Two-model scenarios read ``<embeddings>/<sc>/gen0/`` and ``<embeddings>/<sc>/gen1-<strategy>/``
(``query.npy``, ``gallery.npy``), labels (and, for Revisited Oxford/Paris queries, their set and
easy/hard/junk ground truth: ``modelupgrade.evaluation.revisited``) from
``<splits>/<sc>/{query,gallery}.parquet``, and every head ``<heads>/<sc>/<head>-<strategy>/`` of
the evaluated strategies: a forward head maps the old gallery (ψ(old)), a reverse head maps the new
queries (ψ_rev(new)); pre-computed outputs under ``<embeddings>/<sc>/<head>-<strategy>/`` are used
when present. Training-free adapters lie one level deeper, in a group directory without a card
(``<heads>/<sc>/adapters-<strategy>/<adapter>.<size>-<strategy>/``, outputs likewise under the
embeddings); their rows are ``forward-adapter`` / ``reverse-adapter``, apart from the trained
heads'. Writes
``<metrics>/<sc>/cross_model.{parquet,csv,json}``, ``<metrics>/<sc>/summary.{json,csv}`` and
``<plots>/<sc>/cross_model_heatmap.png``.

The ``sequential`` scenario reads ``<embeddings>/sequential/<strategy>/gen<i>/`` for every
generation (generation 0 from ``<embeddings>/sequential/gen0/`` when the chains share it) and writes
the same files per strategy under ``<metrics>/sequential/<strategy>/`` with the compatibility-matrix
metrics (AC with < and ≤, AM, BC, FC) in its summary; a run over every strategy also writes
``<metrics>/sequential/summary.json``.

Every summary holds Δ↓ (``delta_down_pct``: model → percent) against the oracle strategy
(``evaluation.oracle_strategy``) when it is evaluated: of each new model against the oracle model
in a two-model scenario, of each generation against the oracle chain's same generation in the
sequential one. The registry's gates read Δ↓ from there and nowhere else.

The directories are those of a ``StudyLayout`` (``modelupgrade.layout``). The ``evaluate`` command
(the DVC stage, the ``modelupgrade`` subcommand and the flows' task) runs ``evaluate_scenario``.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from modelupgrade.config import Params
from modelupgrade.errors import UserError
from modelupgrade.evaluation import cross_model
from modelupgrade.evaluation.convergence import head_convergence, model_convergence
from modelupgrade.evaluation.retrieval import RetrievalEvaluator
from modelupgrade.evaluation.summary import (
    ChainEvaluation,
    GalleryRefresh,
    ScenarioEvaluation,
    SequentialEvaluation,
)
from modelupgrade.heads.card import HEAD_WEIGHTS_FILE, HeadCard
from modelupgrade.io import file_sha256, save_parquet, write_json, write_text
from modelupgrade.layout import (
    CROSS_MODEL,
    GALLERY_SPLIT,
    OLD_MODEL,
    PER_QUERY_AP_FILE,
    QUERY_SPLIT,
    REFRESH_SUFFIX,
    SEQUENTIAL,
    SUMMARY,
    StudyLayout,
    chain_model_name,
    chain_refresh_name,
    embedding_file_name,
    model_name,
)
from modelupgrade.runtime import describe_device, select_device

log = logging.getLogger(__name__)

# The files of an evaluation a person reads (the parquet table is the same matrix as the CSV).
REPORT_FILES = (f"{SUMMARY}.json", f"{SUMMARY}.csv", f"{CROSS_MODEL}.csv")


def new_model_name(strategy: str) -> str:
    """A two-model scenario's new model trained with ``strategy``: ``gen1-<strategy>``."""
    return model_name(1, strategy)


def load_embeddings(path: Path, what: str) -> np.ndarray:
    if not path.is_file():
        raise UserError(f"{what} embeddings {path} do not exist", hint="run the embed stage first")
    array = np.load(path, allow_pickle=False)
    if array.ndim != 2:
        raise UserError(f"{path} must hold a 2-D (N, D) array, got shape {array.shape}")
    return np.ascontiguousarray(array, dtype=np.float32)


def load_model_sets(directory: Path, name: str) -> tuple[np.ndarray, np.ndarray]:
    return (
        load_embeddings(directory / embedding_file_name(QUERY_SPLIT), f"{name} query"),
        load_embeddings(directory / embedding_file_name(GALLERY_SPLIT), f"{name} gallery"),
    )


def head_strategy(head_dir: Path, card: HeadCard) -> str:
    name = card.name or ""
    prefix = f"{name}-"
    if not name or not head_dir.name.startswith(prefix):
        raise UserError(
            f"head directory {head_dir} is not named <head>-<strategy> after "
            f"its card name {name!r}",
            hint="train heads with stages.train_heads --out heads/<scenario>/<head>-<strategy>",
        )
    return head_dir.name[len(prefix) :]


def discover_heads(base: Path, requested: Sequence[str] | None) -> list[Path]:
    """The head directories under a scenario's ``base`` (``heads/<sc>``): those ``requested`` by
    name (a grouped adapter as ``<group>/<name>``), or every one with a card, directly under
    ``base`` or inside a group directory that has none (the adapter study's)."""
    if requested is not None:
        dirs = [base / name for name in requested]
        for d in dirs:
            if not (d / "card.json").is_file():
                raise UserError(
                    f"head {d} has no card.json", hint="train it first (stage train_heads)"
                )
        return dirs
    if not base.is_dir():
        return []
    found = []
    for path in sorted(p for p in base.glob("*") if p.is_dir() and not p.name.startswith(".")):
        if (path / "card.json").is_file():
            found.append(path)
        else:
            found += sorted(p for p in path.glob("*") if (p / "card.json").is_file())
    return found


def head_outputs(
    head_dir: Path,
    embeddings_dir: Path,
    old_gallery: np.ndarray,
    new_query: np.ndarray,
    device: Any,
    old_query: np.ndarray | None = None,
) -> tuple[str, np.ndarray]:
    """(direction, transformed vectors): ψ(old gallery) for forward heads,
    ψ_rev(new query) for reverse (a head that also reads the old query, SLERP, gets
    ``old_query``)."""
    from modelupgrade.heads import HEADS, apply, load_chain, load_head, read_head_card

    card = read_head_card(head_dir)
    direction = card.direction
    stored = embeddings_dir / embedding_file_name(
        GALLERY_SPLIT if direction == "forward" else QUERY_SPLIT
    )
    if stored.is_file():
        return direction, load_embeddings(stored, f"{head_dir.name} {direction}")
    if direction == "forward":
        return direction, load_chain(head_dir).apply(old_gallery, device=device)
    head, _ = load_head(head_dir)
    side = old_query if HEADS.get(card.kind).takes_old_embedding else None
    return direction, apply(head, new_query, side_info=side, device=device)


def write_outputs(
    result: Any,
    summary_rows: pd.DataFrame,
    summary: ScenarioEvaluation | ChainEvaluation,
    out_dir: Path,
    plot_path: Path,
    heatmap_metrics: Sequence[str],
    queries: Sequence[str],
    galleries: Sequence[str],
    title: str,
) -> None:
    save_parquet(out_dir / f"{CROSS_MODEL}.parquet", result.table)
    save_parquet(out_dir / PER_QUERY_AP_FILE, result.per_query_table())
    write_text(out_dir / f"{CROSS_MODEL}.csv", result.table.to_csv(index=False))
    write_json(
        out_dir / f"{CROSS_MODEL}.json",
        {
            "protocol": summary.protocol,
            "matrix": result.wide().to_dict(orient="records"),
            "search": {f"{q} -> {g}": info.get("search") for (q, g), info in result.info.items()},
        },
    )
    write_text(out_dir / f"{SUMMARY}.csv", summary_rows.to_csv(index=False))
    write_json(out_dir / f"{SUMMARY}.json", summary.as_dict())
    cross_model.write_heatmap(result, heatmap_metrics, plot_path, queries, galleries, title)


def _source(path: Path) -> dict[str, str]:
    return (
        {"path": str(path), "sha256": file_sha256(path)} if path.is_file() else {"path": str(path)}
    )


def scenario_evaluator(
    params: Params, layout: StudyLayout, scenario: str, device: Any
) -> RetrievalEvaluator:
    """The evaluator of a scenario's query and gallery split files (labels, protocol, and the
    revisited sets' ground truth where the rows carry it); it must compute the headline metric."""
    evaluator = RetrievalEvaluator.from_split_files(
        params.evaluation,
        layout.split_file(scenario, QUERY_SPLIT),
        layout.split_file(scenario, GALLERY_SPLIT),
        device,
    )
    evaluator.require_metric(params.evaluation.headline_metric, "evaluation.headline_metric")
    return evaluator


def evaluate_scenario(
    params: Params,
    scenario: str,
    layout: StudyLayout | None = None,
    strategies: Sequence[str] | None = None,
    heads: Sequence[str] | None = None,
    generations: int | None = None,
) -> ScenarioEvaluation | SequentialEvaluation:
    """Evaluate one scenario; returns the summary written to ``<metrics>/<sc>/summary.json``.

    The files are read from and written to ``layout`` (the project's by default). ``strategies``
    defaults to the scenario's in params.yaml, ``heads`` (directory names under ``<heads>/<sc>/``)
    to every head of the evaluated strategies, ``generations`` (sequential only) to one per
    snapshot of ``sequential.fractions``.
    """
    layout = layout or StudyLayout()
    if scenario == SEQUENTIAL:
        return evaluate_sequential(params, layout, strategies, generations)
    if generations is not None:
        raise UserError(
            f"{scenario} is a two-model scenario: it has no chain of generations to count",
            hint="give --generations with --scenario sequential only",
        )
    scenario_params = params.scenario(scenario)
    ev = params.evaluation
    strategies = list(strategies if strategies is not None else scenario_params.strategies)
    device = select_device(params.device)
    evaluator = scenario_evaluator(params, layout, scenario, device)

    query_sets: dict[str, np.ndarray] = {}
    gallery_sets: dict[str, np.ndarray] = {}
    sources: dict[str, Any] = {}
    for model in [OLD_MODEL, *(new_model_name(s) for s in strategies)]:
        query_sets[model], gallery_sets[model] = load_model_sets(
            layout.embeddings(scenario, model), model
        )
        sources[model] = {
            split: _source(layout.embedding_file(scenario, model, split))
            for split in (QUERY_SPLIT, GALLERY_SPLIT)
        }
    convergence = {
        model: record
        for model in query_sets
        if (record := model_convergence(layout.embeddings(scenario, model), ev.convergence))
    }

    from modelupgrade.heads import HEADS, read_head_card

    forward: dict[str, list[str]] = {s: [] for s in strategies}
    reverse: dict[str, list[str]] = {s: [] for s in strategies}
    forward_adapters: dict[str, list[str]] = {s: [] for s in strategies}
    reverse_adapters: dict[str, list[str]] = {s: [] for s in strategies}
    for head_dir in discover_heads(layout.heads(scenario), heads):
        card = read_head_card(head_dir)
        head_class = HEADS.get(card.kind)
        # A grouped adapter's outputs lie in the same group under the embeddings.
        relative = str(head_dir.relative_to(layout.heads(scenario)))
        strategy = head_strategy(head_dir, card)
        if strategy not in strategies:
            if heads is not None:
                raise UserError(
                    f"head {head_dir.name} belongs to strategy {strategy!r}, "
                    "which is not evaluated",
                    hint=f"evaluated strategies: {', '.join(strategies)}",
                )
            continue
        if card.side_info_dim and not head_class.takes_old_embedding:
            stored = layout.embedding_file(scenario, relative, GALLERY_SPLIT)
            if not stored.is_file():
                raise UserError(
                    f"head {head_dir.name} needs side information to transform the gallery",
                    hint=f"write its transformed gallery to {stored} (or leave "
                    "it out with --heads)",
                )
        new = new_model_name(strategy)
        direction, vectors = head_outputs(
            head_dir,
            layout.head_outputs(scenario, relative),
            gallery_sets[OLD_MODEL],
            query_sets[new],
            device,
            old_query=query_sets[OLD_MODEL],
        )
        convergence[head_dir.name] = head_convergence(
            card.training, ev.convergence, head_class.training_free, head_class.aligns
        )
        sources[head_dir.name] = {
            "card": _source(head_dir / "card.json"),
            "weights": _source(head_dir / HEAD_WEIGHTS_FILE),
            "direction": direction,
        }
        if head_class.training_free:
            # The report's adapter table names the kind and the number of pairs of each fit.
            sources[head_dir.name].update(
                kind=card.kind, sample_size=card.training.get("sample_size")
            )
        if direction == "forward":
            name = f"{head_dir.name}({OLD_MODEL})"
            gallery_sets[name] = vectors
            (forward_adapters if head_class.training_free else forward)[strategy].append(name)
        else:
            name = f"{head_dir.name}({new})"
            query_sets[name] = vectors
            (reverse_adapters if head_class.training_free else reverse)[strategy].append(name)

    # The oracle is the reference, not a candidate; it is compared only through its heads (FCT,
    # FastFill, RQT and MCL pair with the independent model), so their rows reach the summary.
    comparisons = [
        cross_model.StrategyComparisons(
            s,
            new_model_name(s),
            tuple(forward[s]),
            tuple(reverse[s]),
            tuple(forward_adapters[s]),
            tuple(reverse_adapters[s]),
        )
        for s in strategies
        if s != ev.oracle_strategy
        or forward[s]
        or reverse[s]
        or forward_adapters[s]
        or reverse_adapters[s]
    ]
    oracle = new_model_name(ev.oracle_strategy) if ev.oracle_strategy in strategies else None
    if oracle is None:
        log.warning("oracle strategy %r is not evaluated: Δ↓ is left empty", ev.oracle_strategy)
    # Training-free adapters (the adapter study fits many: kinds × directions × sample sizes) are
    # evaluated only where they serve, their queries against the old gallery and new queries
    # against their gallery, never in the all-pairs cross product, whose size they would square.
    adapter_sets = {a for s in strategies for a in (*forward_adapters[s], *reverse_adapters[s])}
    pairs = cross_model.essential_pairs(OLD_MODEL, comparisons, oracle)
    if ev.all_pairs:
        pairs = [
            *cross_model.all_compatible_pairs(
                {k: v for k, v in query_sets.items() if k not in adapter_sets},
                {k: v for k, v in gallery_sets.items() if k not in adapter_sets},
            ),
            *pairs,
        ]
    result = cross_model.cross_model_matrix(
        evaluator, query_sets, gallery_sets, pairs, reference=(OLD_MODEL, OLD_MODEL)
    )
    new_models = [c.new for c in comparisons] + ([oracle] if oracle else [])
    oracle_self = result.value(oracle, oracle, ev.headline_metric) if oracle else None
    degradation = (
        cross_model.delta_down(
            cross_model.self_scores(result, new_models, ev.headline_metric),
            dict.fromkeys(new_models, oracle_self),
        )
        if oracle_self is not None
        else {}
    )
    rows = cross_model.strategy_summary(
        result, OLD_MODEL, comparisons, degradation, ev.headline_metric
    )

    summary = ScenarioEvaluation(
        scenario=scenario,
        protocol={
            **evaluator.protocol_description(),
            "negative_flips": (
                f"top-{ev.flip_k} right under {OLD_MODEL}/{OLD_MODEL}, wrong under the pair; "
                "rate over all queries"
            ),
        },
        headline_metric=ev.headline_metric,
        old_model=OLD_MODEL,
        oracle=oracle,
        device=describe_device(device),
        strategies={
            s: rows[rows.strategy == s].drop(columns="strategy").to_dict(orient="records")
            for s in dict.fromkeys(rows.strategy)
        }
        if len(rows)
        else {},
        old_self=result.value(OLD_MODEL, OLD_MODEL, ev.headline_metric),
        oracle_self=oracle_self,
        # Δ↓ per model: the registry's gates read it here (``modelupgrade.registry.sources``).
        delta_down_pct=degradation,
        sources=sources,
        convergence=convergence,
    )
    write_outputs(
        result,
        rows,
        summary,
        layout.metrics(scenario),
        layout.heatmap(scenario),
        ev.heatmap_metrics,
        # The adapters' pairs are in the matrix files and the report's adapter table; in the
        # heatmap their rows and columns would be one cell each.
        [q for q in query_sets if q not in adapter_sets],
        [g for g in gallery_sets if g not in adapter_sets],
        f"{scenario}: M(query, gallery)",
    )
    for _, row in rows.iterrows():
        log.info(
            "%s %s %s/%s: %s=%.4f Δ↑=%.2f%% Δ↓=%.2f%% NFR=%.4f",
            row.strategy,
            row.comparison,
            row.query_set,
            row.gallery_set,
            row.metric,
            row.value,
            row.delta_up_pct,
            row.delta_down_pct,
            row[cross_model.NFR_METRIC],
        )
    return summary


def gallery_refreshes(
    result: Any, names: Sequence[str], states: Sequence[str], metric: str
) -> list[GalleryRefresh]:
    """Each generation i ≥ 1 on the gallery the chain held when it went live, and on the one its
    head refreshed (``states``: F_0 … F_n, or gen0 alone for a chain without heads)."""
    refreshes = []
    for i, query in enumerate(names[1:], start=1):
        current = states[min(i - 1, len(states) - 1)]
        refreshed = states[i] if i < len(states) else None
        refreshes.append(
            GalleryRefresh(
                generation=i,
                current_gallery=current,
                on_current=result.value(query, current, metric),
                refreshed_gallery=refreshed,
                on_refreshed=None if refreshed is None else result.value(query, refreshed, metric),
            )
        )
    return refreshes


def evaluate_sequential(
    params: Params,
    layout: StudyLayout,
    strategies: Sequence[str] | None,
    generations: int | None = None,
) -> SequentialEvaluation:
    """Compatibility matrices over generations, one per strategy of ``sequential.strategies``.

    ``generations`` chain models gen0..gen<N-1> are evaluated (default: one per snapshot of
    ``sequential.fractions``). When the oracle strategy (``evaluation.oracle_strategy``) is among
    the evaluated chains, each chain's summary holds Δ↓ of every generation against the oracle
    chain's same generation, as a two-model scenario's summary holds Δ↓ of its new models.
    """
    ev = params.evaluation
    every_strategy = strategies is None
    strategies = list(strategies if strategies is not None else params.sequential.strategies)
    count = len(params.sequential.fractions) if generations is None else generations
    if count < 1:
        raise UserError(f"a chain has at least one generation (gen0), not {count}")
    names = [model_name(i) for i in range(count)]
    device = select_device(params.device)
    evaluator = scenario_evaluator(params, layout, SEQUENTIAL, device)
    oracle = ev.oracle_strategy if ev.oracle_strategy in strategies else None
    oracle_scores: dict[str, float] = {}
    headline: dict[str, Any] = {}
    # The oracle chain first: every other chain's Δ↓ needs its self-tests.
    for strategy in sorted(strategies, key=lambda s: s != oracle):
        query_sets, gallery_sets = {}, {}
        for i, generation in enumerate(names):
            directory = layout.embeddings(SEQUENTIAL, chain_model_name(strategy, i))
            if i == 0 and not directory.is_dir():
                # One generation 0 shared by every chain (as the pipeline trains it).
                directory = layout.embeddings(SEQUENTIAL, OLD_MODEL)
            query_sets[generation], gallery_sets[generation] = load_model_sets(
                directory, f"{strategy} {generation}"
            )
        # The chain's gallery after each generation's refresh by its head: F_0 = gen0's vectors.
        states = [names[0]]
        if strategy in params.sequential.heads:
            for i, generation in enumerate(names[1:], start=1):
                refreshed = f"{generation}{REFRESH_SUFFIX}"
                gallery_sets[refreshed] = load_embeddings(
                    layout.embedding_file(
                        SEQUENTIAL, chain_refresh_name(strategy, i), GALLERY_SPLIT
                    ),
                    f"{strategy} gallery refreshed at {generation}",
                )
                states.append(refreshed)
        galleries = [*names, *states[1:]]
        pairs = [
            (q, g)
            for i, q in enumerate(names)
            for g in [*names[: i + 1], *states[1 : i + 1]]
            if query_sets[q].shape[1] == gallery_sets[g].shape[1]
        ]
        result = cross_model.cross_model_matrix(
            evaluator, query_sets, gallery_sets, pairs, reference=(names[0], names[0])
        )
        scores = cross_model.self_scores(result, names, ev.headline_metric)
        if strategy == oracle:
            oracle_scores = scores
        compat = {
            metric: cross_model.sequential_summary(result, names, metric)
            for metric in sorted(set(result.table.metric))
            if metric != cross_model.NFR_METRIC
        }
        summary = ChainEvaluation(
            strategy=strategy,
            protocol=evaluator.protocol_description(),
            headline_metric=ev.headline_metric,
            compatibility=compat,
            oracle=oracle,
            # Δ↓ per generation: the registry's gates read it here
            # (``modelupgrade.registry.sources``).
            delta_down_pct=cross_model.delta_down(scores, oracle_scores),
            refreshes={
                metric: gallery_refreshes(result, names, states, metric) for metric in compat
            },
        )
        rows = pd.DataFrame(
            [
                {
                    "metric": m,
                    **c.model_dump(exclude={"matrix", "generations"}),
                }
                for m, c in compat.items()
            ]
        )
        write_outputs(
            result,
            rows,
            summary,
            layout.metrics(SEQUENTIAL, strategy),
            layout.heatmap(SEQUENTIAL, strategy),
            ev.heatmap_metrics,
            names,
            galleries,
            f"sequential / {strategy}: M(gen i, gen j)",
        )
        headline[strategy] = compat.get(ev.headline_metric)
    out = SequentialEvaluation(
        protocol=evaluator.protocol_description(),
        strategies={strategy: headline[strategy] for strategy in strategies},
    )
    if every_strategy:
        # A run over some chains leaves the summary of all of them alone.
        write_json(layout.metrics(SEQUENTIAL) / f"{SUMMARY}.json", out.as_dict())
    return out


def report_files(
    summary: ScenarioEvaluation | SequentialEvaluation, layout: StudyLayout
) -> dict[str, list[Path]]:
    """The files of an evaluation that a person reads (summaries, the matrix as CSV, the heatmaps),
    by the folder they go to among a run's artifacts: ``evaluation``, or ``evaluation/<strategy>``
    for the sequential scenario's chains."""
    scenario = summary.scenario
    parts = [None] if scenario != SEQUENTIAL else list(summary.strategies)
    return {
        "evaluation" if part is None else f"evaluation/{part}": [
            *(layout.metrics(scenario, part) / name for name in REPORT_FILES),
            layout.heatmap(scenario, part),
        ]
        for part in parts
    }
