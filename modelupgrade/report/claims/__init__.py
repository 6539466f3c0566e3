"""Do the papers' claims hold here? A registry of eleven claims, each as narrow as its paper.

Each claim is one ``claim_entry`` (``building``): the statement, its source (paper, table or
section), its scope (the scenario kinds the paper reports it on, the metric, the protocol or
ordering), the paper's own numbers where it gives some, and a function that checks this study's
numbers on one scenario (``compatibility``, ``backfill``, ``adapters``; ``catalogue`` lists them).

A claim is judged on the scenarios of its scope only; checks outside its scope are shown in the
evidence and not counted. Each check is matched across the training seeds and tested (a paired
t-test, Holm's correction within the claim: ``modelupgrade.report.statistics``); a check whose
numbers include a NaN is not measured, one resting on a model that did not pass the convergence
gate or whose premise does not hold on a seed leaves that seed out. The strategies a claim is about
are found by their kind in params (``StudyResults.strategy_kinds``), the head systems of the
backfill study by the scenario's heads, the training-free adapters by their head kind (recorded in
the evaluation's sources), and the scenarios by their kind.
"""

from modelupgrade.report.claims.catalogue import CLAIMS, check_claims
from modelupgrade.report.claims.checks import Check, Claim, CurveRef, Scope, SeededCheck, Spread
from modelupgrade.report.claims.vocabulary import (
    ANCHOR_NOT_CONVERGED,
    COMPARABLE_PAIR,
    DIP_Z,
    DRIFT_ADAPTER_RECOVERY,
)

__all__ = [
    "ANCHOR_NOT_CONVERGED",
    "CLAIMS",
    "COMPARABLE_PAIR",
    "DIP_Z",
    "DRIFT_ADAPTER_RECOVERY",
    "Check",
    "Claim",
    "CurveRef",
    "Scope",
    "SeededCheck",
    "Spread",
    "check_claims",
]
