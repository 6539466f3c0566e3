"""Reports people read: the study report and the flows' upgrade, lineage and backfill reports.

``document`` holds the blocks and the one markdown/HTML renderer every report is written with;
``results`` reads back what the study measured, ``claims`` checks the papers' claims on it, and
``build`` writes the study report. ``upgrade`` writes what an automated upgrade tells people
(one cycle, a chain's lineage, a gallery backfill), which the Prefect flows publish.
"""

from modelupgrade.report.build import run_metadata, write_report
from modelupgrade.report.claims import Claim, check_claims
from modelupgrade.report.document import (
    Block,
    BulletList,
    CodeBlock,
    Heading,
    Image,
    Paragraph,
    Table,
    render_html,
    render_markdown,
)
from modelupgrade.report.results import ScenarioResults, StudyResults, collect_results

__all__ = [
    "Block",
    "BulletList",
    "Claim",
    "CodeBlock",
    "Heading",
    "Image",
    "Paragraph",
    "ScenarioResults",
    "StudyResults",
    "Table",
    "check_claims",
    "collect_results",
    "render_html",
    "render_markdown",
    "run_metadata",
    "write_report",
]
