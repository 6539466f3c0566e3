"""Metrics of public benchmarks, each exactly as its reference implementation computes it.

- ``gldv2_map_at_k``: Google Landmarks v2 retrieval mAP@100 (DELF ``MeanAveragePrecision``).
- ``revisitop_map``: Revisited Oxford/Paris mAP and mP@k (revisitop ``compute_map``).
- ``tar_at_far``: IJB-C 1:1 verification TAR@FAR (insightface ``ijb_11.py`` row rule).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, Literal

import numpy as np

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
    easy: Sequence[Sequence[int]],
    hard: Sequence[Sequence[int]],
    junk: Sequence[Sequence[int]],
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
    for e, h, j in zip(easy, hard, junk, strict=True):
        e, h, j = (np.asarray(x, dtype=np.int64).ravel() for x in (e, h, j))
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
    gnd: Sequence[Mapping[str, Sequence[int]]],
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
    order = np.argsort(scores, kind="mergesort")[::-1]
    sorted_scores = scores[order]
    sorted_positive = positive[order].astype(np.float64)
    threshold_index = np.r_[np.flatnonzero(np.diff(sorted_scores)), len(sorted_scores) - 1]
    tps = np.cumsum(sorted_positive)[threshold_index]
    fps = 1 + threshold_index - tps
    thresholds = sorted_scores[threshold_index]
    if drop_intermediate and len(fps) > 2:
        keep = np.flatnonzero(np.r_[True, np.logical_or(np.diff(fps, 2), np.diff(tps, 2)), True])
        fps, tps, thresholds = fps[keep], tps[keep], thresholds[keep]
    tps = np.r_[0.0, tps]
    fps = np.r_[0.0, fps]
    thresholds = np.r_[np.inf, thresholds]
    return fps / fps[-1], tps / tps[-1], thresholds


def tar_at_far(scores: np.ndarray, labels: np.ndarray, fars: Sequence[float]) -> np.ndarray:
    """TAR at each target FAR, IJB-C style (insightface ``ijb_11.py``).

    On the ROC, take the point whose FAR is nearest to the target and report its TAR; no
    interpolation. Ties go to the higher FAR, then to the higher TAR.
    """
    fpr, tpr, _ = roc_curve(labels, scores)
    fpr, tpr = fpr[::-1], tpr[::-1]
    result = []
    for far in np.asarray(fars, dtype=np.float64).ravel():
        # argmin returns the first minimum: in the reversed curve that is the highest FAR/TAR.
        result.append(tpr[int(np.argmin(np.abs(fpr - far)))])
    return np.asarray(result, dtype=np.float64)
