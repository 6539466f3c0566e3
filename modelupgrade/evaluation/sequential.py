"""The sequential scenario's evaluation: per chain of ``sequential.strategies`` its compatibility
matrices over generations (AC with < and ≤, AM, BC, FC), Δ↓ of each generation against the oracle
chain's, and each upgrade's gallery refresh (BiCT's Table 6), written under
``<metrics>/sequential/<strategy>/``; a run over every chain also writes
``<metrics>/sequential/summary.json``."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pandas as pd

from modelupgrade.config import Params
from modelupgrade.errors import UserError
from modelupgrade.evaluation import cross_model
from modelupgrade.evaluation.head_sets import head_outputs
from modelupgrade.evaluation.retrieval import RetrievalEvaluator
from modelupgrade.evaluation.study_files import (
    load_embeddings,
    load_model_sets,
    scenario_evaluator,
    write_outputs,
)
from modelupgrade.evaluation.summary import (
    ChainEvaluation,
    Compatibility,
    GalleryRefresh,
    SequentialEvaluation,
)
from modelupgrade.io import write_json
from modelupgrade.layout import (
    GALLERY_SPLIT,
    OLD_MODEL,
    REFRESH_SUFFIX,
    SEQUENTIAL,
    SUMMARY,
    StudyLayout,
    chain_model_name,
    chain_refresh_name,
    model_name,
)
from modelupgrade.runtime import select_device


def evaluate_sequential(
    params: Params,
    layout: StudyLayout,
    strategies: Sequence[str] | None,
    generations: int | None = None,
    heads: Sequence[str] = (),
) -> SequentialEvaluation:
    """Compatibility matrices over generations, one per strategy of ``sequential.strategies``.

    ``generations`` chain models gen0..gen<N-1> are evaluated (default: one per snapshot of
    ``sequential.fractions``). When the oracle strategy (``evaluation.oracle_strategy``) is among
    the evaluated chains, each chain's summary holds Δ↓ of every generation against the oracle
    chain's same generation, as a two-model scenario's summary holds Δ↓ of its new models.
    ``heads`` (``<strategy>/gen<i>/<head>`` under ``<heads>/sequential/``, as the upgrade flow
    trains them) are searched as paths between generation i and i − 1: a generation whose
    dimension differs from its predecessor's reaches the older gallery only through them.
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
    headline: dict[str, Compatibility | None] = {}
    # The oracle chain first: every other chain's Δ↓ needs its self-tests.
    for strategy in sorted(strategies, key=lambda s: s != oracle):
        chain, scores = evaluate_chain(
            params, layout, evaluator, strategy, names, oracle, oracle_scores, heads
        )
        if strategy == oracle:
            oracle_scores = scores
        headline[strategy] = chain.headline
    out = SequentialEvaluation(
        protocol=evaluator.protocol_description(),
        strategies={strategy: headline[strategy] for strategy in strategies},
    )
    if every_strategy:
        # A run over some chains leaves the summary of all of them alone.
        write_json(layout.metrics(SEQUENTIAL) / f"{SUMMARY}.json", out.as_dict())
    return out


@dataclass
class ChainSets:
    """A chain's evaluation sets: each generation's query and gallery embeddings, and the
    gallery's states (F_0 = gen0's vectors, then each generation's refresh by its head)."""

    queries: dict[str, np.ndarray] = field(default_factory=dict)
    galleries: dict[str, np.ndarray] = field(default_factory=dict)
    states: list[str] = field(default_factory=list)

    def pairs(self, names: Sequence[str]) -> list[tuple[str, str]]:
        """Each generation's queries against every earlier (or its own) generation's gallery and
        gallery state, where the dimensions match."""
        return [
            (q, g)
            for i, q in enumerate(names)
            for g in [*names[: i + 1], *self.states[1 : i + 1]]
            if self.queries[q].shape[1] == self.galleries[g].shape[1]
        ]


def chain_sets(
    params: Params, layout: StudyLayout, strategy: str, names: Sequence[str]
) -> ChainSets:
    """The embeddings of a chain's generations ``names`` and, for a chain with heads, its
    refreshed galleries."""
    sets = ChainSets()
    for i, generation in enumerate(names):
        directory = layout.embeddings(SEQUENTIAL, chain_model_name(strategy, i))
        if i == 0 and not directory.is_dir():
            # One generation 0 shared by every chain (as the pipeline trains it).
            directory = layout.embeddings(SEQUENTIAL, OLD_MODEL)
        sets.queries[generation], sets.galleries[generation] = load_model_sets(
            directory, f"{strategy} {generation}"
        )
    # The chain's gallery after each generation's refresh by its head: F_0 = gen0's vectors.
    sets.states = [names[0]]
    if strategy in params.sequential.heads:
        for i, generation in enumerate(names[1:], start=1):
            refreshed = f"{generation}{REFRESH_SUFFIX}"
            sets.galleries[refreshed] = load_embeddings(
                layout.embedding_file(SEQUENTIAL, chain_refresh_name(strategy, i), GALLERY_SPLIT),
                f"{strategy} gallery refreshed at {generation}",
            )
            sets.states.append(refreshed)
    return sets


def add_chain_heads(
    sets: ChainSets,
    layout: StudyLayout,
    strategy: str,
    names: Sequence[str],
    heads: Sequence[str],
    device: Any,
) -> list[tuple[str, str]]:
    """The chain's heads among ``heads`` (``<strategy>/gen<i>/<head>``), each between generation
    i − 1 and i, added to ``sets``: a forward head's ψ(gallery of gen i − 1) as the gallery set
    ``<head>(gen<i-1>)``, a reverse head's ψ_rev(queries of gen i) as the query set
    ``<head>(gen<i>)``; returns the pairs that search through them (the registry reads such a
    set as a path between the two generations)."""
    pairs = []
    for name in heads:
        between, _, head = name.rpartition("/")
        generation = next(
            (i for i in range(1, len(names)) if between == chain_model_name(strategy, i)), None
        )
        if generation is None:
            continue  # another chain's head, or a generation not evaluated
        old, new = names[generation - 1], names[generation]
        direction, vectors = head_outputs(
            layout.head(SEQUENTIAL, name),
            layout.head_outputs(SEQUENTIAL, name),
            sets.galleries[old],
            sets.queries[new],
            device,
            old_query=sets.queries[old],
        )
        if direction == "forward":
            sets.galleries[f"{head}({old})"] = vectors
            pairs.append((new, f"{head}({old})"))
        else:
            sets.queries[f"{head}({new})"] = vectors
            pairs.append((f"{head}({new})", old))
    return pairs


def evaluate_chain(
    params: Params,
    layout: StudyLayout,
    evaluator: RetrievalEvaluator,
    strategy: str,
    names: Sequence[str],
    oracle: str | None,
    oracle_scores: dict[str, float],
    heads: Sequence[str] = (),
) -> tuple[ChainEvaluation, dict[str, float]]:
    """One chain's compatibility matrices, Δ↓ against ``oracle_scores`` (the oracle chain's
    self-tests) and gallery refreshes, written under ``<metrics>/sequential/<strategy>/``; returns
    its summary and its generations' self-test scores."""
    ev = params.evaluation
    sets = chain_sets(params, layout, strategy, names)
    device = select_device(params.device)
    through_heads = add_chain_heads(sets, layout, strategy, names, heads, device)
    result = cross_model.cross_model_matrix(
        evaluator,
        sets.queries,
        sets.galleries,
        [*sets.pairs(names), *through_heads],
        reference=(names[0], names[0]),
    )
    scores = cross_model.self_scores(result, names, ev.headline_metric)
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
        delta_down_pct=cross_model.delta_down(
            scores, scores if strategy == oracle else oracle_scores
        ),
        refreshes={
            metric: gallery_refreshes(result, names, sets.states, metric) for metric in compat
        },
    )
    rows = pd.DataFrame(
        [
            {"metric": m, **c.model_dump(exclude={"matrix", "generations"})}
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
        [*names, *(q for q, _ in through_heads if q not in names)],
        [*names, *sets.states[1:], *(g for _, g in through_heads if g not in names)],
        f"sequential / {strategy}: M(gen i, gen j)",
    )
    return summary, scores


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
