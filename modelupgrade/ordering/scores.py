"""Per-item ordering scores: what a policy ranks the gallery by, and what each value means.

A score kind is computed from what is known about a gallery item: the old classifier's output on its
stored vector, FastFill's σ² of ψ(stored vector), or — for the oracle only — its new vector. The
simulator computes scores from the study's arrays; the store computes them at ingest and records
their kind beside the values, so a policy can only ever read the score it was written for.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields

import numpy as np

from modelupgrade.errors import UserError


@dataclass(frozen=True)
class OrderingInputs:
    """What may be known about the ``n`` gallery items before (and, for the
    oracle, after) a backfill."""

    n: int
    old_logits: np.ndarray | None = None  # (n, C) old classifier logits on φ_old(g)
    old_probabilities: np.ndarray | None = None  # (n, C) or its softmax, when logits are absent
    sigma2: np.ndarray | None = None  # (n,) FastFill σ² of each stored old vector
    old_state_vectors: np.ndarray | None = None  # (n, d) what an un-backfilled item serves
    new_vectors: np.ndarray | None = None  # (n, d) φ_new(g): known only after backfilling
    # Whether ``old_state_vectors`` live in the new space: ψ(φ_old(g)), or φ_old(g) of a model
    # trained to be compatible. Across unrelated spaces ‖φ_new − φ_old‖ measures nothing.
    old_state_in_new_space: bool = False

    def present(self) -> set[str]:
        return {
            f.name
            for f in fields(self)
            if f.name not in ("n", "old_state_in_new_space") and getattr(self, f.name) is not None
        }

    def rows(self, name: str) -> np.ndarray:
        array = np.asarray(getattr(self, name))
        if len(array) != self.n:
            raise UserError(f"{name} has {len(array)} rows for {self.n} gallery items")
        return array

    def probabilities(self) -> np.ndarray:
        if self.old_probabilities is not None:
            return self.rows("old_probabilities").astype(np.float64)
        return softmax(self.rows("old_logits"))

    def score(self, kind: str) -> np.ndarray:
        """The ``kind`` score of every item, or a ``UserError`` naming what is missing."""
        score_kind = score_kind_of(kind)
        if not score_kind.available(self):
            raise UserError(
                f"the {kind!r} score needs {score_kind.needs_text()}, which is not available",
                hint=f"{kind}: {score_kind.meaning}",
            )
        values = np.asarray(score_kind.compute(self), dtype=np.float64).reshape(-1)
        if values.shape != (self.n,) or not np.isfinite(values).all():
            raise UserError(
                f"the {kind!r} score must be {self.n} finite numbers, got shape {values.shape}"
            )
        return values


def softmax(logits: np.ndarray) -> np.ndarray:
    logits = np.asarray(logits, dtype=np.float64)
    logits = logits - logits.max(axis=1, keepdims=True)
    exp = np.exp(logits)
    return exp / exp.sum(axis=1, keepdims=True)


def _entropy(inputs: OrderingInputs) -> np.ndarray:
    p = inputs.probabilities()
    return -(p * np.log(np.clip(p, 1e-300, None))).sum(axis=1)


def _width(vectors: np.ndarray | None) -> tuple[int, ...]:
    """The shape of one vector of ``vectors`` (none when there are none)."""
    return () if vectors is None else np.shape(vectors)[1:]


def _alignment_error(inputs: OrderingInputs) -> np.ndarray:
    new = inputs.rows("new_vectors").astype(np.float64)
    old = inputs.rows("old_state_vectors").astype(np.float64)
    if new.shape != old.shape:
        raise UserError(
            f"new vectors {new.shape} and old-state vectors {old.shape} differ in shape"
        )
    return np.linalg.norm(new - old, axis=1)


@dataclass(frozen=True)
class ScoreKind:
    name: str
    meaning: str
    # Alternatives: each inner tuple is one set of OrderingInputs fields that suffices.
    needs: tuple[tuple[str, ...], ...]
    compute: Callable[[OrderingInputs], np.ndarray]
    # Computable before the backfill (from stored vectors); False for the oracle's score.
    deployable: bool = True
    # A further condition on the inputs present (e.g. two arrays of one width).
    applies: Callable[[OrderingInputs], bool] | None = None

    def available(self, inputs: OrderingInputs) -> bool:
        present = inputs.present()
        found = any(set(option) <= present for option in self.needs)
        return found and (self.applies is None or self.applies(inputs))

    def needs_text(self) -> str:
        return " or ".join(" and ".join(option) for option in self.needs)


_CLASSIFIER = (("old_logits",), ("old_probabilities",))
SCORE_KINDS: dict[str, ScoreKind] = {
    kind.name: kind
    for kind in (
        ScoreKind(
            "old-confidence",
            "the old classifier's confidence (max softmax probability) on the stored vector",
            _CLASSIFIER,
            lambda inputs: inputs.probabilities().max(axis=1),
        ),
        ScoreKind(
            "old-entropy",
            "the entropy of the old classifier's softmax on the stored vector",
            _CLASSIFIER,
            _entropy,
        ),
        ScoreKind(
            "fastfill-sigma2",
            "FastFill's predicted uncertainty σ² of ψ(stored vector)",
            (("sigma2",),),
            lambda inputs: inputs.rows("sigma2"),
        ),
        ScoreKind(
            "alignment-error",
            "the distance between an item's new vector and the vector it serves before the "
            "backfill, both in the new space (ψ(old), or the old vector of a compatible model)",
            (("new_vectors", "old_state_vectors"),),
            _alignment_error,
            deployable=False,
            applies=lambda inputs: (
                inputs.old_state_in_new_space
                and _width(inputs.new_vectors) == _width(inputs.old_state_vectors)
            ),
        ),
    )
}


def score_kind_of(name: str) -> ScoreKind:
    try:
        return SCORE_KINDS[name]
    except KeyError:
        raise UserError(
            f"unknown ordering score {name!r}", hint=f"choose one of: {', '.join(SCORE_KINDS)}"
        ) from None
