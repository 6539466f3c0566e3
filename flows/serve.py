"""Serve the upgrade flow on its cron schedule and the backfill flow beside it.

    python -m flows.serve [--params params.yaml] [--work-dir runs/flows] [--training-pool gpu]

Deployments ``upgrade/scheduled`` on ``flows.upgrade_cron`` and ``backfill/champion-watch`` on
``flows.backfill_cron``; ``--training-pool POOL`` also deploys ``train-generation/gpu`` on that work
pool and has the upgrade runs train there. Schedules need a Prefect server (``prefect server
start``, ``PREFECT_API_URL`` set). The serving is ``modelupgrade.orchestration.serve_flows``'s;
this module hands it the flows.
"""

from __future__ import annotations

from flows.backfill import backfill
from flows.training import train_generation
from flows.upgrade import upgrade
from modelupgrade.cli.arguments import stage_main
from modelupgrade.orchestration import serve_flows

main = stage_main(serve_flows, upgrade=upgrade, backfill=backfill, training=train_generation)

if __name__ == "__main__":
    main()
