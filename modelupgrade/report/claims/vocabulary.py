"""The words the claims speak: the strategy, scenario, order and mode kinds they are about, and
the thresholds their papers set."""

from __future__ import annotations

# The strategy kinds (``strategies.<name>.kind``) the claims are about.
INDEPENDENT_KIND = "independent"
BCT_KIND = "bct"
DMU_KIND = "dmu"
# The scenario kinds (``scenarios.<name>.kind``) a claim's scope names.
EXTENDED_DATA = "extended-data"
OPEN_DATA = "open-data"
EXTENDED_CLASS = "extended-class"
OPEN_CLASS = "open-class"
IDENTICAL_DATA = "identical-data"
# Ordering policies and serving modes of the backfill study (``backfill.policies``,
# ``backfill.serving_modes``) the claims compare.
RANDOM_ORDER = "random"
OLD_CONFIDENCE_ORDER = "old-confidence"
UNCERTAINTY_ORDER = "fastfill-uncertainty"
MIXED = "mixed"
RANK_MERGE = "rank-merge"
FULL_RANK_MERGE = "rank-merge-full"
# The head kinds (``heads.<name>.kind``) FastFill's claims set against each other.
FCT_HEAD_KIND = "fct"
FASTFILL_HEAD_KIND = "fastfill"
# The training-free adapter kinds (head kinds, ``adapters.heads.<name>.kind``) the claims compare:
# Drift-Adapter's three on the query side, and SLERP.
DRIFT_ADAPTER_QUERY_KINDS = ("procrustes_query", "affine_query", "residual_mlp_query")
PROCRUSTES_QUERY_KIND = "procrustes_query"
SLERP_KIND = "slerp_query"
ALL_SCENARIO_KINDS = (EXTENDED_DATA, OPEN_DATA, EXTENDED_CLASS, OPEN_CLASS, IDENTICAL_DATA)
# Drift-Adapter's lower bound on the share of full re-indexing quality an adapter recovers.
DRIFT_ADAPTER_RECOVERY = 0.95
# Drift-Adapter's upgrades are between models of comparable quality (text encoders a few percent
# apart): its claim is tested where the old model reaches this share of the new one's M. Between a
# weak old model and a strong new one, a query-side adapter searching the old gallery is capped by
# that gallery whatever it does.
COMPARABLE_PAIR = 0.9
# Why a check's draw is left out of its test.
ANCHOR_NOT_CONVERGED = "anchor model did not converge"
# The backfill curves' metrics the claims read: mAP, and top-1 (Seo et al.'s CMC, FastFill's top1).
CURVE_METRICS = ("mAP", "top1")
# A dip of a backfill curve counts only beyond this many of its query standard errors (95 %).
DIP_Z = 1.96
# Float rounding allowed on top of a stated tolerance (a dip of exactly one query's worth, computed
# as a difference of two floats, may come out a hair above it).
ROUNDING = 1e-9
# The table shows up to this many of a claim's numbers; more are summarised ("5/6 hold; e.g. …").
SHOWN = 3
