"""Flow ``backfill``: keep the gallery store on the registry's ``champion``.

    python -m flows.backfill [--params params.yaml] [--work-dir runs/flows] [--store DIR]

Compares the store's serving space with the champion of the flows' registered model. Without a store
it creates one serving the champion (the gallery with its champion vectors); when ``champion`` has
moved (``modelupgrade promote``), it runs the real backfill (``modelupgrade.store``: chunked,
crash-safe, resumable; the old vectors keep serving until each item is re-embedded) and reports
its progress as the ``backfill-progress`` artifact; when they agree it does nothing. Served on
``flows.backfill_cron`` by ``python -m flows.serve``.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from prefect import flow

from flows.gallery_tasks import backfill_store, create_store, store_state
from flows.layout import load_settings
from flows.reports import publish_backfill_report
from flows.tasks import read_chain, with_retries
from modelupgrade.errors import exit_on_user_error
from modelupgrade.runtime import setup_logging


@flow(name="backfill")
def backfill(params_path: str = "params.yaml", work_dir: str | None = None, store: str | None = None) -> dict[str, Any]:
    settings = load_settings(params_path, work_dir)
    args = (str(settings.params_path), str(settings.work.root))
    store = str(store or settings.work.store)

    def step(task):  # noqa: ANN001, ANN202 - a task with the retries of params.yaml
        return with_retries(task, settings.params)

    chain = step(read_chain)(*args)
    champion = chain["champion"]
    if champion is None:
        return {"outcome": "no champion yet: nothing to serve", "store": store}
    champion_space = settings.work.model(settings.strategy, champion["generation"]).name
    summary: dict[str, Any] = {"store": store, "champion_version": champion["version"],
                               "champion_key": champion["model_key"]}
    state = step(store_state)(store)
    if state is None:
        state = step(create_store)(*args, store, champion["generation"])
        summary.update(outcome=f"created, serving {champion_space}", store_status=state)
    elif state["serving_space"] == champion_space and not _running(state):
        summary.update(outcome=f"up to date, serving {champion_space}", store_status=state)
    else:
        result = step(backfill_store)(*args, store, champion["generation"])
        outcome = (f"backfilled {result['source_space']} → {champion_space}"
                   if result["backfill"]["status"] == "complete"
                   else f"backfill to {champion_space} {result['backfill']['status']}; the next run resumes it")
        summary.update(outcome=outcome, **result)
    summary["report"] = step(publish_backfill_report)(*args, summary)
    return summary


def _running(state: dict[str, Any]) -> bool:
    return bool(state.get("backfill")) and state["backfill"]["status"] == "running"


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flows.backfill", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--work-dir", help="the flows' work directory (default: flows.work_dir)")
    parser.add_argument("--store", help="gallery store directory (default: <work-dir>/store)")
    args = parser.parse_args(argv)
    setup_logging()
    summary = backfill(args.params, args.work_dir, args.store)
    print(f"store {summary['store']}: {summary['outcome']}")
    if "report" in summary:
        print(f"report: {summary['report']}")


if __name__ == "__main__":
    main()
