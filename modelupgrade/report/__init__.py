"""Reports people read: the study report and the flows' upgrade, lineage and backfill reports.

``document`` holds the blocks and the one markdown/HTML renderer every report is written with;
``results`` reads back what the study measured, ``claims`` checks the papers' claims on it, and
``build`` writes the study report (with ``lead``, ``fits``, ``claim_curves`` and ``numbers``).
``upgrade`` writes what an automated upgrade tells people (one cycle, a chain's lineage, a gallery
backfill), which the Prefect flows publish.
"""

from modelupgrade.report.build import run_metadata, write_report
from modelupgrade.report.claims import Claim, check_claims
from modelupgrade.report.results import (
    ScenarioResults,
    StudyResults,
    collect_replicates,
    collect_results,
)

__all__ = [
    "Claim",
    "ScenarioResults",
    "StudyResults",
    "check_claims",
    "collect_replicates",
    "collect_results",
    "run_metadata",
    "write_report",
]
