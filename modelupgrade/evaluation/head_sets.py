"""The evaluation sets a scenario's heads and training-free adapters make: each head directory
found under ``<heads>/<sc>/`` (or named), its strategy, its outputs (ψ(old gallery) for a forward
head, ψ_rev(new query) for a reverse one; pre-computed ones read from the embeddings), its sources
and whether it trained."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from modelupgrade.arrays import mean_row_cosine
from modelupgrade.config.evaluation import ConvergenceGateParams
from modelupgrade.errors import UserError
from modelupgrade.evaluation import cross_model
from modelupgrade.evaluation.convergence import head_convergence
from modelupgrade.evaluation.study_files import (
    load_embeddings,
    source_entry,
)
from modelupgrade.evaluation.summary import Convergence
from modelupgrade.heads.card import HEAD_WEIGHTS_FILE, HeadCard
from modelupgrade.json_data import JsonObject, json_value
from modelupgrade.layout import (
    GALLERY_SPLIT,
    OLD_MODEL,
    QUERY_SPLIT,
    StudyLayout,
    embedding_file_name,
    new_model_name,
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


@dataclass
class EvaluationSets:
    """The vectors a scenario's evaluation searches with (query sets) and in (gallery sets), by
    name, where each came from (``sources``), and whether its model or head trained."""

    queries: dict[str, np.ndarray] = field(default_factory=dict)
    galleries: dict[str, np.ndarray] = field(default_factory=dict)
    sources: dict[str, JsonObject] = field(default_factory=dict)
    convergence: dict[str, Convergence] = field(default_factory=dict)


@dataclass
class StrategyHeads:
    """The evaluation sets one strategy's heads and adapters made: forward ones are gallery sets
    (ψ(old)), reverse ones query sets (ψ_rev(new))."""

    forward: list[str] = field(default_factory=list)
    reverse: list[str] = field(default_factory=list)
    forward_adapters: list[str] = field(default_factory=list)
    reverse_adapters: list[str] = field(default_factory=list)

    @property
    def adapters(self) -> list[str]:
        return [*self.forward_adapters, *self.reverse_adapters]

    @property
    def empty(self) -> bool:
        return not (self.forward or self.reverse or self.adapters)

    def add(self, name: str, direction: str, training_free: bool) -> None:
        if direction == "forward":
            (self.forward_adapters if training_free else self.forward).append(name)
        else:
            (self.reverse_adapters if training_free else self.reverse).append(name)

    def comparisons(self, strategy: str) -> cross_model.StrategyComparisons:
        return cross_model.StrategyComparisons(
            strategy,
            new_model_name(strategy),
            tuple(self.forward),
            tuple(self.reverse),
            tuple(self.forward_adapters),
            tuple(self.reverse_adapters),
        )


def add_heads(
    sets: EvaluationSets,
    layout: StudyLayout,
    scenario: str,
    strategies: Sequence[str],
    heads: Sequence[str] | None,
    gate: ConvergenceGateParams,
    device: Any,
) -> dict[str, StrategyHeads]:
    """Add to ``sets`` the outputs of the heads of the evaluated strategies (``heads`` by name, or
    every one found) and return, per strategy, the sets its heads made."""
    from modelupgrade.heads import HEADS, read_head_card

    heads_of = {s: StrategyHeads() for s in strategies}
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
            sets.galleries[OLD_MODEL],
            sets.queries[new],
            device,
            old_query=sets.queries[OLD_MODEL],
        )
        # Its alignment on this evaluation's images too, which it never trained on: ψ(old gallery)
        # against the new gallery, ψ_rev(new query) against the old query.
        target = sets.galleries.get(new) if direction == "forward" else sets.queries[OLD_MODEL]
        sets.convergence[head_dir.name] = head_convergence(
            card.training,
            gate,
            head_class.training_free,
            head_class.aligns,
            held_out_alignment=None if target is None else mean_row_cosine(vectors, target),
        )
        sets.sources[head_dir.name] = _head_sources(head_dir, card, direction)
        if direction == "forward":
            name = f"{head_dir.name}({OLD_MODEL})"
            sets.galleries[name] = vectors
        else:
            name = f"{head_dir.name}({new})"
            sets.queries[name] = vectors
        heads_of[strategy].add(name, direction, head_class.training_free)
    return heads_of


def _head_sources(head_dir: Path, card: HeadCard, direction: str) -> JsonObject:
    """A head's card and weights files with their hashes, its direction, and for a training-free
    adapter its kind and how many pairs it was fitted on (the report's adapter table)."""
    from modelupgrade.heads import HEADS

    sources: JsonObject = {
        "card": json_value(source_entry(head_dir / "card.json")),
        "weights": json_value(source_entry(head_dir / HEAD_WEIGHTS_FILE)),
        "direction": direction,
    }
    if HEADS.get(card.kind).training_free:
        sources.update(kind=card.kind, sample_size=card.training.get("sample_size"))
    return sources
