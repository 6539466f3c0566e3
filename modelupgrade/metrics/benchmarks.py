"""Metrics of public benchmarks, each exactly as its reference implementation computes it.

- ``gldv2_map_at_k``: Google Landmarks v2 retrieval mAP@100 (DELF ``MeanAveragePrecision``).
- ``revisitop_map``: Revisited Oxford/Paris mAP and mP@k (revisitop ``compute_map``).
- ``tar_at_far``: IJB-C 1:1 verification TAR@FAR (insightface ``ijb_11.py`` row rule).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np
from numpy.typing import ArrayLike

from modelupgrade.errors import UserError
from modelupgrade.metrics.ranking import truncated_average_precision

RevisitopProtocol = Literal["easy", "medium", "hard"]
REVISITOP_PROTOCOLS: tuple[str, ...] = ("easy", "medium", "hard")


# --------------------------------------------------------------------------------------- GLDv2
def gldv2_map_at_k(
    predictions: Sequence[Sequence[Any] | np.ndarray | None],
    ground_truth: Sequence[Sequence[Any] | np.ndarray],
    k: int = 100,
) -> float:
    """GLDv2 retrieval mAP@k (Kaggle / DELF definition).

    ``predictions[q]``: ranked index ids submitted for query q (empty or None = nothing submitted);
    ``ground_truth[q]``: the relevant index ids. AP@k = (1 / min(|gt|, k)) Σ_{i ≤ k} P(i)·rel(i),
    where a repeated id keeps its position but never counts as a hit twice; the mean runs over ALL
    queries, so a query without predictions contributes AP 0.
    """
    if k < 1:
        raise UserError(f"k must be ≥ 1, got {k}")
    if len(predictions) != len(ground_truth):
        raise UserError(
            f"{len(predictions)} prediction lists for {len(ground_truth)} ground-truth lists",
            hint="give one (possibly empty) prediction list per query, in ground-truth order",
        )
    if not len(ground_truth):
        raise UserError("gldv2_map_at_k needs at least one query")
    hits = np.zeros((len(ground_truth), k), dtype=bool)
    num_relevant = np.zeros(len(ground_truth), dtype=np.int64)
    for q, (predicted, relevant) in enumerate(zip(predictions, ground_truth, strict=True)):
        relevant = np.asarray(relevant).ravel()
        num_relevant[q] = len(relevant)
        if predicted is None:
            continue
        ranked = np.asarray(predicted).ravel()[:k]
        if not len(ranked):
            continue
        _, first = np.unique(ranked, return_index=True)
        first_occurrence = np.zeros(len(ranked), dtype=bool)
        first_occurrence[first] = True
        hits[q, : len(ranked)] = first_occurrence & np.isin(ranked, relevant)
    if bool((num_relevant == 0).any()):
        raise UserError(
            f"{int((num_relevant == 0).sum())} queries have no ground-truth ids",
            hint="GLDv2 scores only queries with relevant index images; drop the "
            "'Ignored' ones first",
        )
    return float(truncated_average_precision(hits, num_relevant, k).mean())


def gldv2_inputs_from_padded(
    predictions: np.ndarray,
    ground_truth: np.ndarray,
    has_prediction: np.ndarray | None = None,
    pad: int = -1,
) -> tuple[list[np.ndarray], list[np.ndarray]]:
    """Lists for ``gldv2_map_at_k`` from padded (nq, k) / (nq, m) arrays (``pad`` marks no id)."""
    predictions = np.asarray(predictions)
    ground_truth = np.asarray(ground_truth)
    if has_prediction is None:
        has_prediction = np.ones(len(predictions), dtype=bool)
    preds = [
        row[row != pad] if submitted else row[:0]
        for row, submitted in zip(predictions, has_prediction, strict=True)
    ]
    gts = [row[row != pad] for row in ground_truth]
    return preds, gts


# ------------------------------------------------------------------------------------ revisitop
def revisitop_ground_truth(
    easy: Sequence[ArrayLike],
    hard: Sequence[ArrayLike],
    junk: Sequence[ArrayLike],
    protocol: RevisitopProtocol,
) -> list[dict[str, np.ndarray]]:
    """Per-query {'ok', 'junk'} for the Easy, Medium or Hard protocol of ROxford/RParis.

    Easy: ok = easy, junk = junk ∪ hard. Medium: ok = easy ∪ hard, junk = junk.
    Hard: ok = hard, junk = junk ∪ easy.
    """
    if protocol not in REVISITOP_PROTOCOLS:
        raise UserError(f"unknown revisitop protocol {protocol!r}", hint="use easy, medium or hard")
    if not len(easy) == len(hard) == len(junk):
        raise UserError(
            f"easy/hard/junk lists differ in length: {len(easy)}, {len(hard)}, {len(junk)}"
        )
    gnd = []
    for lists in zip(easy, hard, junk, strict=True):
        e, h, j = (np.asarray(x, dtype=np.int64).ravel() for x in lists)
        ok, bad = {
            "easy": (e, np.concatenate([j, h])),
            "medium": (np.concatenate([e, h]), j),
            "hard": (h, np.concatenate([j, e])),
        }[protocol]
        gnd.append({"ok": ok, "junk": bad})
    return gnd


def revisitop_average_precision(positions: np.ndarray, num_positives: int) -> float:
    """Trapezoid AP of revisitop: positives at sorted 0-based ``positions``
    (junk already removed)."""
    positions = np.asarray(positions, dtype=np.float64)
    if num_positives <= 0 or not len(positions):
        return 0.0
    j = np.arange(len(positions), dtype=np.float64)
    precision_before = np.where(positions == 0, 1.0, j / np.where(positions == 0, 1.0, positions))
    precision_after = (j + 1) / (positions + 1)
    return float(((precision_before + precision_after) / 2.0).sum() / num_positives)


def revisitop_map(
    ranks: np.ndarray,
    gnd: Sequence[Mapping[str, ArrayLike]],
    kappas: Sequence[int] = (1, 5, 10),
) -> tuple[float, np.ndarray]:
    """(mAP, mP@kappas) exactly as revisitop ``compute_map``.

    ``ranks`` (gallery, queries): gallery indices per query, best first. ``gnd[q]`` holds 'ok'
    (positives) and optionally 'junk' (removed from the ranking before scoring). Queries without
    positives are left out of both means.
    """
    ranks = np.asarray(ranks)
    if ranks.ndim != 2:
        raise UserError(f"ranks must be 2-D (gallery, queries), got shape {ranks.shape}")
    if ranks.shape[1] != len(gnd):
        raise UserError(
            f"ranks hold {ranks.shape[1]} queries (columns) but gnd has {len(gnd)} entries",
            hint="ranks is shaped (gallery, queries) like revisitop's; transpose a "
            "(queries, gallery) array",
        )
    kappas = [int(k) for k in kappas]
    aps, precisions = [], []
    for q, entry in enumerate(gnd):
        ok = np.asarray(entry["ok"], dtype=np.int64).ravel()
        junk = np.asarray(entry.get("junk", ()), dtype=np.int64).ravel()
        if not len(ok):
            continue
        column = ranks[:, q]
        positions = np.flatnonzero(np.isin(column, ok))
        junk_positions = np.flatnonzero(np.isin(column, junk))
        # Each positive moves up by the number of junk items ranked before it.
        positions = positions - np.searchsorted(junk_positions, positions)
        aps.append(revisitop_average_precision(positions, len(ok)))
        one_based = positions + 1
        row = []
        for kappa in kappas:
            if not len(one_based):
                row.append(0.0)
                continue
            cutoff = min(int(one_based.max()), kappa)
            row.append(float((one_based <= cutoff).sum() / cutoff))
        precisions.append(row)
    if not aps:
        return float("nan"), np.full(len(kappas), np.nan)
    return float(np.mean(aps)), np.asarray(precisions, dtype=np.float64).mean(axis=0)


# ----------------------------------------------------------------------------------- TAR@FAR
def roc_curve(
    labels: np.ndarray, scores: np.ndarray, drop_intermediate: bool = True
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(fpr, tpr, thresholds) as scikit-learn's ``roc_curve`` returns them with its defaults.

    Thresholds are the distinct scores, descending, after a leading +inf; with
    ``drop_intermediate`` the points collinear with both neighbours are dropped.
    """
    labels = np.asarray(labels).ravel()
    scores = np.asarray(scores, dtype=np.float64).ravel()
    if labels.shape != scores.shape:
        raise UserError(f"{len(labels)} labels for {len(scores)} scores")
    positive = labels == 1
    if not set(np.unique(labels).tolist()) <= {0, 1}:
        raise UserError("labels must be 0 (different identity) or 1 (same identity)")
    if not positive.any() or positive.all():
        raise UserError("ROC needs both genuine (label 1) and impostor (label 0) pairs")
    if np.isnan(scores).any():
        # As scikit-learn refuses them: a NaN has no place in the order of thresholds.
        raise UserError(f"{int(np.isnan(scores).sum())} scores are NaN")
    fps, tps, thresholds = _roc_counts(scores, positive, drop_intermediate)
    return fps / fps[-1], tps / tps[-1], thresholds


def _roc_counts(
    scores: np.ndarray, positive: np.ndarray, drop_intermediate: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(false positives, true positives, thresholds) of ``roc_curve``, as float64 counts, with
    the leading (0, 0, +inf) point."""
    # Any order of tied scores gives the same counts (they are read at the end of each run of
    # ties), so the faster unstable sort serves.
    order = np.argsort(-scores)
    sorted_scores = scores[order]
    sorted_positive = positive[order].astype(np.float64)
    threshold_index = np.r_[np.flatnonzero(np.diff(sorted_scores)), len(sorted_scores) - 1]
    tps = np.cumsum(sorted_positive)[threshold_index]
    fps = 1 + threshold_index - tps
    thresholds = sorted_scores[threshold_index]
    if drop_intermediate and len(fps) > 2:
        keep = np.flatnonzero(np.r_[True, np.logical_or(np.diff(fps, 2), np.diff(tps, 2)), True])
        fps, tps, thresholds = fps[keep], tps[keep], thresholds[keep]
    return np.r_[0.0, fps], np.r_[0.0, tps], np.r_[np.inf, thresholds]


def tar_at_far(scores: np.ndarray, labels: np.ndarray, fars: Sequence[float]) -> np.ndarray:
    """TAR at each target FAR, IJB-C style (insightface ``ijb_11.py``).

    On the ROC, take the point whose FAR is nearest to the target and report its TAR; no
    interpolation. Ties go to the higher FAR, then to the higher TAR.
    """
    fpr, tpr, _ = roc_curve(labels, scores)
    return _tar_nearest_far(fpr, tpr, fars)


def _tar_nearest_far(fpr: np.ndarray, tpr: np.ndarray, fars: ArrayLike) -> np.ndarray:
    fpr, tpr = fpr[::-1], tpr[::-1]
    result = []
    for far in np.asarray(fars, dtype=np.float64).ravel():
        # argmin returns the first minimum: in the reversed curve that is the highest FAR/TAR.
        result.append(tpr[int(np.argmin(np.abs(fpr - far)))])
    return np.asarray(result, dtype=np.float64)


class TarAtFarAccumulator:
    """``tar_at_far`` of trials streamed block by block, keeping only the high-scoring ones.

    The result equals ``tar_at_far`` on all the trials exactly, without sorting them all. Why
    that is enough: the ROC always holds the point FAR 0, so the point nearest to a target FAR f
    lies at FAR ≤ 2f, i.e. at most ``⌊2f·N⌋`` of the N impostors score at or above its threshold.
    Every such point is settled by the trials scoring at least τ, the ``(⌊2f·N⌋ + 2)``-th best
    impostor score: τ's own threshold is the right-hand neighbour that decides whether the last
    of them is dropped as collinear, and τ's point itself lies beyond FAR 2f (by at least one
    impostor, one more than needed, so float rounding of the FARs cannot make it a tie), so it
    never wins. Lower-scoring trials are only counted.

    ``num_impostors`` (N) must be known before the first block, since it sets how many impostor
    scores to keep; ``result`` checks that the blocks added up to it.
    """

    def __init__(self, fars: Sequence[float], num_impostors: int) -> None:
        self.fars = np.asarray(fars, dtype=np.float64).ravel()
        if not len(self.fars) or not bool(((self.fars > 0) & (self.fars < 1)).all()):
            raise UserError(f"target FARs must lie strictly between 0 and 1, got {fars!r}")
        if num_impostors < 0:
            raise UserError(f"num_impostors must be ≥ 0, got {num_impostors}")
        self.num_impostors = int(num_impostors)
        # τ's rank among the impostors; the largest FAR needs the most of them.
        self.keep_impostors = int(np.floor(2.0 * self.fars.max() * self.num_impostors)) + 2
        # A numpy scalar of the kept scores' dtype: compared with a block of another float dtype
        # it promotes rather than rounds (a Python float would be cast to float32).
        self.cutoff: np.floating = np.float32(-np.inf)
        self.impostors: np.ndarray = np.empty(0, dtype=np.float32)
        self.genuines: np.ndarray = np.empty(0, dtype=np.float32)
        self.seen_impostors = 0
        self.seen_genuines = 0

    def add(self, genuine_scores: np.ndarray, impostor_scores: np.ndarray) -> None:
        """Add one block of trials: the scores of same-identity and different-identity pairs."""
        # Scores keep their dtype: float32 orders and ties exactly as its float64 image does, and
        # the selection below runs at half the memory traffic.
        genuine_scores = np.asarray(genuine_scores).ravel()
        impostor_scores = np.asarray(impostor_scores).ravel()
        if np.isnan(genuine_scores).any() or np.isnan(impostor_scores).any():
            raise UserError("verification scores contain NaN")
        self.seen_genuines += len(genuine_scores)
        self.seen_impostors += len(impostor_scores)
        above_cutoff = impostor_scores[impostor_scores >= self.cutoff]
        impostors = np.concatenate([self.impostors, above_cutoff])
        if len(impostors) > self.keep_impostors:
            # τ only rises as blocks arrive, so a score below today's τ is below the final one.
            kth = len(impostors) - self.keep_impostors
            self.cutoff = np.partition(impostors, kth)[kth]
            impostors = impostors[impostors >= self.cutoff]
        self.impostors = impostors
        genuines = np.concatenate([self.genuines, genuine_scores[genuine_scores >= self.cutoff]])
        self.genuines = genuines[genuines >= self.cutoff]

    def result(self) -> np.ndarray:
        """TAR at each FAR; NaN where the trials hold no genuine or no impostor pair (TAR or FAR
        undefined)."""
        if self.seen_impostors != self.num_impostors:
            raise UserError(
                f"{self.seen_impostors} impostor trials were added, {self.num_impostors} announced",
                hint="announce the number of different-identity pairs of all blocks together",
            )
        if not self.seen_genuines or not self.num_impostors:
            return np.full(len(self.fars), np.nan)
        scores = np.concatenate([self.genuines, self.impostors]).astype(np.float64)
        positive = np.r_[np.ones(len(self.genuines), bool), np.zeros(len(self.impostors), bool)]
        fps, tps, _ = _roc_counts(scores, positive, drop_intermediate=True)
        # Normalised by all trials: the kept ones are the top of the full ranking, whose ROC
        # prefix they reproduce count for count.
        return _tar_nearest_far(
            fps / float(self.num_impostors), tps / float(self.seen_genuines), self.fars
        )
