"""Which ground truth scores each query of an evaluation, and the Revisited Oxford/Paris scoring.

``EvaluationGroundTruth.from_splits`` is the one place that decides it, from the split files' rows:

- A query row that names a Revisited Oxford/Paris set in ``revisited_set`` (the GLDv2 loader
  writes it, with the protocol's ground truth as gallery item ids in ``gnd_easy`` / ``gnd_hard`` /
  ``gnd_junk``) is ranked against the gallery rows of that same set only: ROxford and RParis each
  have their own database, and a query never sees the other's. It is scored with
  ``metrics.revisitop_map`` (revisitop's ``compute_map``) under the Easy, Medium and Hard
  protocols (``metrics.revisitop_ground_truth``): junk items are removed from the ranking, never
  counted as negatives. Metrics are named ``<set>/<protocol>/mAP`` and ``<set>/<protocol>/mP@<k>``
  (k = 1, 5, 10), e.g. ``roxford5k/medium/mAP``.
- Every other query is scored by its label against the gallery rows of no revisited set. Without
  revisited rows (Fashion-MNIST, CIFAR, image folders: no ``revisited_set`` column) that is every
  query against the whole gallery, exactly as before.

For negative flips, a revisited query is right when a Medium positive (easy or hard) lies within
its first ``flip_k`` results once the Medium junk is removed.

The ranking is the full one (revisitop ranks the whole database), by the configured similarity,
ties broken towards the lower gallery row.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import cast

import numpy as np
import pandas as pd
import torch

from modelupgrade.data.manifest import GROUND_TRUTH_COLUMNS, REVISITED_SET_COLUMN
from modelupgrade.errors import UserError
from modelupgrade.json_data import JsonObject
from modelupgrade.metrics import REVISITOP_PROTOCOLS, revisitop_ground_truth, revisitop_map
from modelupgrade.metrics.benchmarks import RevisitopProtocol
from modelupgrade.metrics.ranking import query_block_size
from modelupgrade.retrieval.distance import Similarity, as_feature_tensor, prepare, score_block

REVISITOP_KAPPAS: tuple[int, ...] = (1, 5, 10)
# Negative flips of a revisited query are counted under this protocol.
FLIP_PROTOCOL = "medium"

Rows = np.ndarray | slice


@dataclass(frozen=True, eq=False)
class RevisitedSet:
    """One revisited set (``roxford5k``, ``rparis6k``): its queries, its own gallery, and per query
    the easy / hard / junk items as positions in that gallery."""

    name: str
    query_rows: np.ndarray  # rows of the query split, in split order
    gallery_rows: np.ndarray  # rows of the gallery split: the set's database
    easy: tuple[np.ndarray, ...]
    hard: tuple[np.ndarray, ...]
    junk: tuple[np.ndarray, ...]

    def ground_truth(self, protocol: str) -> list[dict[str, np.ndarray]]:
        """Per query {'ok', 'junk'} (gallery positions) under Easy, Medium or Hard."""
        chosen = cast(RevisitopProtocol, protocol)
        return revisitop_ground_truth(self.easy, self.hard, self.junk, chosen)

    def metric_names(self) -> list[str]:
        return [
            f"{self.name}/{protocol}/{metric}"
            for protocol in REVISITOP_PROTOCOLS
            for metric in ("mAP", *(f"mP@{k}" for k in REVISITOP_KAPPAS))
        ]

    def ranks(
        self,
        query: np.ndarray,
        gallery: np.ndarray,
        similarity: Similarity,
        memory_bytes: int,
        device: torch.device,
    ) -> np.ndarray:
        """(set gallery, set queries): the set's gallery positions per query, best first, as
        revisitop's ``ranks``; ``query`` and ``gallery`` are the whole splits' vectors."""
        q = prepare(as_feature_tensor(query[self.query_rows], "query features"), similarity)
        g = prepare(as_feature_tensor(gallery[self.gallery_rows], "gallery features"), similarity)
        if q.shape[1] != g.shape[1]:
            raise UserError(
                f"query features are {q.shape[1]}-d but gallery features are {g.shape[1]}-d",
                hint="compare embeddings of the same space (apply the transformation head first)",
            )
        g = g.to(device)
        ranks = np.empty((len(g), len(q)), dtype=np.int64)
        block = query_block_size(len(g), memory_bytes)
        for start in range(0, len(q), block):
            stop = min(start + block, len(q))
            scores = score_block(q[start:stop].to(device), g, similarity)
            order = torch.sort(scores, dim=1, descending=True, stable=True).indices
            ranks[:, start:stop] = order.cpu().numpy().T
        return ranks

    def score(
        self,
        query: np.ndarray,
        gallery: np.ndarray,
        *,
        similarity: Similarity,
        flip_k: int,
        memory_bytes: int,
        device: torch.device,
    ) -> tuple[dict[str, float], np.ndarray]:
        """(metrics, per set query: a Medium positive within the first ``flip_k`` results)."""
        ranks = self.ranks(query, gallery, similarity, memory_bytes, device)
        metrics: dict[str, float] = {}
        for protocol in REVISITOP_PROTOCOLS:
            mean_ap, mean_precision = revisitop_map(
                ranks, self.ground_truth(protocol), REVISITOP_KAPPAS
            )
            metrics[f"{self.name}/{protocol}/mAP"] = mean_ap
            for k, value in zip(REVISITOP_KAPPAS, mean_precision, strict=True):
                metrics[f"{self.name}/{protocol}/mP@{k}"] = float(value)
        correct = np.array(
            [
                _positive_within(ranks[:, i], entry["ok"], entry["junk"], flip_k)
                for i, entry in enumerate(self.ground_truth(FLIP_PROTOCOL))
            ],
            dtype=bool,
        )
        return metrics, correct


def _positive_within(ranking: np.ndarray, ok: np.ndarray, junk: np.ndarray, k: int) -> bool:
    kept = ranking[~np.isin(ranking, junk)]
    return bool(np.isin(kept[:k], ok).any())


@dataclass(frozen=True, eq=False)
class EvaluationGroundTruth:
    """How each query of an evaluation is scored: the revisited sets, and the query rows scored by
    label with the gallery rows they are ranked against (every row when there is no revisited set:
    ``slice(None)``)."""

    revisited: tuple[RevisitedSet, ...] = ()
    label_queries: Rows = field(default_factory=lambda: slice(None))
    label_gallery: Rows = field(default_factory=lambda: slice(None))

    @classmethod
    def from_splits(
        cls, query: pd.DataFrame, gallery: pd.DataFrame, leave_one_out: bool = False
    ) -> EvaluationGroundTruth:
        """Decide from the split files' rows (see the module docstring)."""
        has_truth = [c for c in GROUND_TRUTH_COLUMNS if c in query.columns]
        if REVISITED_SET_COLUMN not in query.columns:
            if has_truth:
                raise UserError(
                    f"the query split carries revisited ground truth ({', '.join(has_truth)}) but "
                    f"no {REVISITED_SET_COLUMN} column naming each query's set",
                    hint="re-run the prepare and split stages: the GLDv2 loader writes it",
                )
            return cls()
        query_sets = _set_names(query)
        names = list(dict.fromkeys(n for n in query_sets if n))
        if not names:
            return cls()
        missing = [c for c in GROUND_TRUTH_COLUMNS if c not in query.columns]
        if missing:
            raise UserError(
                f"the query split names revisited sets ({', '.join(names)}) but has no "
                f"{', '.join(missing)} column",
                hint="re-run the prepare and split stages: the GLDv2 loader writes them",
            )
        if leave_one_out:
            raise UserError(
                "revisited sets are scored with disjoint queries and gallery, not leave-one-out",
                hint="set evaluation.protocol to query-gallery or auto, and "
                "evaluation_split.protocol to predefined",
            )
        if REVISITED_SET_COLUMN not in gallery.columns:
            raise UserError(
                f"the query split names revisited sets but the gallery split has no "
                f"{REVISITED_SET_COLUMN} column: each set's gallery is unknown",
                hint="re-run the prepare and split stages: the GLDv2 loader writes it",
            )
        gallery_sets = _set_names(gallery)
        revisited = tuple(
            _revisited_set(name, query, gallery, query_sets, gallery_sets) for name in names
        )
        label_queries = np.flatnonzero(query_sets == "")
        label_gallery = np.flatnonzero(gallery_sets == "")
        if len(label_queries) and not len(label_gallery):
            raise UserError(
                f"{len(label_queries)} queries belong to no revisited set, but every gallery item "
                "does: they have nothing to be ranked against",
                hint="give them gallery items of no revisited set, or leave them out of the split",
            )
        return cls(revisited, label_queries, label_gallery)

    def metric_names(self) -> list[str]:
        return [name for s in self.revisited for name in s.metric_names()]

    def describe(self) -> JsonObject | None:
        if not self.revisited:
            return None
        return {
            "sets": {
                s.name: {"queries": len(s.query_rows), "gallery": len(s.gallery_rows)}
                for s in self.revisited
            },
            "metrics": (
                "revisitop compute_map per set on its own gallery, full ranking: trapezoid AP and "
                f"mP@{','.join(map(str, REVISITOP_KAPPAS))} under Easy (ok easy, junk junk+hard), "
                "Medium (ok easy+hard, junk junk), Hard (ok hard, junk junk+easy); junk removed "
                "from the ranking; queries without positives left out of a protocol's mean"
            ),
            "negative_flips": f"a {FLIP_PROTOCOL} positive in the top flip_k after junk removal",
        }


def _set_names(frame: pd.DataFrame) -> np.ndarray:
    return frame[REVISITED_SET_COLUMN].fillna("").astype(str).to_numpy(dtype=object)


def _revisited_set(
    name: str,
    query: pd.DataFrame,
    gallery: pd.DataFrame,
    query_sets: np.ndarray,
    gallery_sets: np.ndarray,
) -> RevisitedSet:
    query_rows = np.flatnonzero(query_sets == name)
    gallery_rows = np.flatnonzero(gallery_sets == name)
    if not len(gallery_rows):
        raise UserError(
            f"the revisited set {name} has {len(query_rows)} queries but no gallery items",
            hint="the predefined split puts each set's database images in the gallery split",
        )
    position = {item: i for i, item in enumerate(gallery.item_id.to_numpy()[gallery_rows])}
    lists: dict[str, list[np.ndarray]] = {column: [] for column in GROUND_TRUTH_COLUMNS}
    for row in query_rows:
        for column in GROUND_TRUTH_COLUMNS:
            value = query[column].iat[row]
            ids = str(value).split() if isinstance(value, str) else []
            unknown = [i for i in ids if i not in position]
            if unknown:
                raise UserError(
                    f"{column} of query {query.item_id.iat[row]} names {unknown[0]}, which is not "
                    f"a gallery item of {name}"
                    + (f" ({len(unknown)} such ids)" if len(unknown) > 1 else ""),
                    hint="the ground truth must name gallery items of the query's own set; "
                    "re-run the prepare and split stages",
                )
            lists[column].append(np.array([position[i] for i in ids], dtype=np.int64))
    easy, hard, junk = (tuple(lists[c]) for c in GROUND_TRUTH_COLUMNS)
    return RevisitedSet(name, query_rows, gallery_rows, easy, hard, junk)


def rows_of(rows: Rows, count: int) -> int:
    """How many rows ``rows`` selects out of ``count``."""
    return count if isinstance(rows, slice) else len(rows)
