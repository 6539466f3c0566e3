"""Flow ``backfill``: keep the gallery store on the registry's ``champion``.

    python -m flows.backfill [--params params.yaml] [--work-dir runs/flows] [--store DIR] [--json]

Compares the store's serving space with the champion of the flows' registered model. Without a
store it creates one serving the champion (the gallery with its champion vectors); when
``champion`` has moved (``modelupgrade promote``), it runs the real backfill
(``modelupgrade.store.follow``: chunked, crash-safe, resumable; the old vectors keep serving until
each item is re-embedded) and reports its progress as the ``backfill-progress`` artifact; when
they agree it does nothing. Served on ``flows.backfill_cron`` by ``python -m flows.serve``.
"""

from __future__ import annotations

from typing import Any

from prefect import flow

from flows.reports import publish_backfill_report
from flows.tasks import follow_champion
from modelupgrade.chain import load_chain
from modelupgrade.cli.arguments import stage_main
from modelupgrade.config import DEFAULT_PARAMS_FILE, ParamsFile
from modelupgrade.orchestration import with_retries
from modelupgrade.report.upgrade import BackfillOutcome


@flow(name="backfill")
def backfill(
    params_path: ParamsFile = DEFAULT_PARAMS_FILE,
    work_dir: str | None = None,
    store: str | None = None,
) -> dict[str, Any]:
    """Keep the gallery store on the champion: create it, backfill it, or leave it as it is.

    Args:
        params_path: the params file
        work_dir: the flows' work directory (default: flows.work_dir)
        store: gallery store directory (default: <work-dir>/store)
    """
    chain = load_chain(params_path, work_dir)
    outcome = with_retries(follow_champion, chain.params)(*chain.reference, store)
    if outcome["champion_version"] is not None:
        report = with_retries(publish_backfill_report, chain.params)(*chain.reference, outcome)
        outcome["report"] = report
    return outcome


main = stage_main(backfill, BackfillOutcome)

if __name__ == "__main__":
    main()
