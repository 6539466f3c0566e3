"""A backfill curve query by query: what the claims weigh a difference of curves against.

A curve's mAP at a point is the mean of its queries' APs (those with a positive), its top-1 the
mean of its queries' hits; so is every area under it. Kept per query, two curves of the same study
compare query by query, and resampling the queries (a bootstrap) says how much of a difference a
different draw of test queries would move, at one training seed. The same per-query values give a
dip of the curve its standard error: a dip that query sampling explains is no dip.

``backfill_per_query.parquet`` holds, for every curve and metric, each query's area under the curve
(both kinds the summary reports); the summary's conditions hold the largest dip's standard error.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import pandas as pd

from modelupgrade.backfill.engine import CurveResult

# The curve metrics kept per query.
PER_QUERY_METRICS = ("mAP", "top1")


def per_query_values(result: CurveResult) -> dict[str, np.ndarray]:
    """(queries × points) values whose column means are the curve: AP (NaN for a query without
    positives, left out of mAP) and top-1 hits (a query without positives a miss)."""
    return {
        "mAP": result.per_query.average_precision.astype(np.float64),
        "top1": result.per_query.correct_at(1).astype(np.float64),
    }


def mean_over_orders(per_order: Sequence[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    """The per-query values of the mean curve of several orders (a random policy's)."""
    return {
        metric: np.mean([values[metric] for values in per_order], axis=0) for metric in per_order[0]
    }


def largest_drop_se(values: np.ndarray) -> float:
    """The standard error, over the queries, of the curve's change between the two consecutive
    points where it drops most (or rises least, when it never drops): the spread of the per-query
    changes there over √queries. The query noise a dip of the curve is weighed against."""
    curve = np.nanmean(values, axis=0)
    drops = curve[:-1] - curve[1:]
    if drops.size == 0:
        return float("nan")
    i = int(np.argmax(drops))
    per_query = values[:, i] - values[:, i + 1]
    per_query = per_query[~np.isnan(per_query)]
    if per_query.size < 2:
        return float("nan")
    return float(per_query.std(ddof=1) / np.sqrt(per_query.size))


def per_query_aucs(t: np.ndarray, values: np.ndarray) -> dict[str, np.ndarray]:
    """Each query's area under its curve: the mean over the points (FastFill's) and the trapezoid
    rule over t (Seo et al.'s), as the summary's ``auc_mean`` and ``auc_trapezoid``."""
    t = np.asarray(t, dtype=np.float64)
    widths = t[1:] - t[:-1]
    return {
        "auc_mean": values.mean(axis=1),
        "auc_trapezoid": ((values[:, 1:] + values[:, :-1]) / 2.0 * widths).sum(axis=1),
    }


def per_query_table(
    strategy: str, policy: str, mode: str, t: np.ndarray, values: dict[str, np.ndarray]
) -> pd.DataFrame:
    """One curve's per-query areas as rows (strategy, policy, mode, metric, kind, query, value)."""
    parts = []
    for metric in PER_QUERY_METRICS:
        for kind, per_query in per_query_aucs(t, values[metric]).items():
            parts.append(
                pd.DataFrame(
                    {
                        "strategy": strategy,
                        "policy": policy,
                        "mode": mode,
                        "metric": metric,
                        "kind": kind,
                        "query": np.arange(len(per_query), dtype=np.int32),
                        "value": per_query,
                    }
                )
            )
    return pd.concat(parts, ignore_index=True)
