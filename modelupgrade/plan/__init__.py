"""An upgrade plan for a gallery: every way from the old model to the new one, measured on a
labelled sample of images and costed for the real gallery's size (``modelupgrade plan``).

The options, each scored with the project's evaluator (``RetrievalEvaluator``, the headline metric
of ``evaluation``) and its negative-flip rate against the old system (``metrics``):

* ``keep-old``: M(old, old), nothing to do;
* ``reembed``: M(new, new) after a full backfill: every gallery image embedded again by the new
  model, timed on this machine while the sample is embedded;
* ``query/<kind>``: a training-free query-side adapter (``procrustes_query``, ``affine_query``,
  ``residual_mlp_query``), M(ψ_rev(new query), old gallery): nothing is backfilled, every query
  pays the adapter;
* ``gallery/<kind>``: a gallery-side adapter (``procrustes``, ``affine``, ``residual_mlp``),
  M(new query, ψ(old gallery)): every stored vector transformed once, no image embedded;
* ``compatible``: a BCT-family successor. Given one (``compatible_model``), it is scored without a
  backfill, M(compatible, old), and after one, M(compatible, compatible). Without one it is listed
  with its training time estimated from a short training probe on this machine (``train_model``
  for one epoch on part of the sample) and no quality: it was not trained.

Adapters are fitted on paired embeddings of the sample's fitting part, as the study fits them
(``fit_head``). A plan is measured once (``measure_plan``: the expensive part) and costed for a
gallery size by ``plan_table``, a pure function, so the costs of another gallery size need no new
measurement.

**The recommendation rule** (``recommend``): among the measured options other than keeping the old
model, those whose M is within ``tolerance_pct`` percent of M(new, new) (M ≥ (1 − X/100) ·
M(new, new)) and above M(old, old) are eligible; the cheapest eligible one wins, cost being its
one-time compute (backfill time + adapter fitting or training time; a query adapter's per-query
overhead is reported, not ranked); costs within 10 % or 60 s of the cheapest count as equal
(timing noise, milliseconds of fitting), and the higher M among them wins. A compatible model
passed in is already trained: its training time is shown, not counted. With none eligible the old
model stays. The default X = 5 follows Drift-Adapter's report of 95–99 % of full re-indexing recall.
"""

from modelupgrade.plan.measure import (
    DEFAULT_ADAPTERS,
    GALLERY_ADAPTERS,
    QUERY_ADAPTERS,
    measure_plan,
)
from modelupgrade.plan.recommend import recommend
from modelupgrade.plan.records import (
    OptionMeasure,
    PlanMeasurements,
    PlanRow,
    Recommendation,
    UpgradePlan,
)
from modelupgrade.plan.sample import PlanSample, plan_sample
from modelupgrade.plan.table import check_plan_settings, plan_table, write_plan

__all__ = [
    "DEFAULT_ADAPTERS",
    "GALLERY_ADAPTERS",
    "QUERY_ADAPTERS",
    "OptionMeasure",
    "PlanMeasurements",
    "PlanRow",
    "PlanSample",
    "Recommendation",
    "UpgradePlan",
    "check_plan_settings",
    "measure_plan",
    "plan_sample",
    "plan_table",
    "recommend",
    "write_plan",
]
