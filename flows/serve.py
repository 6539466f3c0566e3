"""Serve the upgrade flow on its cron schedule and the backfill flow beside it.

    python -m flows.serve [--params params.yaml] [--work-dir runs/flows] [--training-pool gpu]

Deployments: ``upgrade/scheduled`` on ``flows.upgrade_cron`` (one upgrade cycle per run) and
``backfill/champion-watch`` on ``flows.backfill_cron`` (re-embeds the gallery store when champion has
moved), each at most one run at a time; this process runs them until it is stopped (Ctrl-C pauses
their schedules). Schedules need a Prefect server, not the temporary one a plain flow run starts::

    prefect server start                                          # UI on http://127.0.0.1:4200
    prefect config set PREFECT_API_URL=http://127.0.0.1:4200/api

``--training-pool POOL`` also deploys ``train-generation/gpu`` on that work pool (a process pool on a
GPU machine with this checkout at the same path) and has the upgrade runs train there.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from flows.backfill import backfill
from flows.layout import FlowSettings, load_settings
from flows.training import train_generation
from flows.upgrade import upgrade
from modelupgrade.errors import UserError, exit_on_user_error
from modelupgrade.runtime import setup_logging

PROJECT_ROOT = Path(__file__).resolve().parents[1]
UPGRADE_DEPLOYMENT = "scheduled"
BACKFILL_DEPLOYMENT = "champion-watch"
TRAINING_DEPLOYMENT = "gpu"


def build_deployments(settings: FlowSettings, training_deployment: str | None) -> list[Any]:
    from pydantic import ValidationError

    flows = settings.params.flows
    where = {"params_path": str(settings.params_path), "work_dir": str(settings.work.root)}
    try:
        return [
            upgrade.to_deployment(
                name=UPGRADE_DEPLOYMENT, cron=flows.upgrade_cron, concurrency_limit=1,
                parameters={**where, "training_deployment": training_deployment},
                description=f"One upgrade cycle of {settings.registered_model} ({settings.strategy}).",
                tags=["modelupgrade"],
            ),
            backfill.to_deployment(
                name=BACKFILL_DEPLOYMENT, cron=flows.backfill_cron, concurrency_limit=1, parameters=where,
                description=f"Keep the gallery store {settings.work.store} on the champion of "
                            f"{settings.registered_model}.",
                tags=["modelupgrade"],
            ),
        ]
    except ValidationError as err:
        raise UserError(f"flows.upgrade_cron / flows.backfill_cron: {err.errors()[0]['msg']}") from None


def deploy_training(pool: str) -> str:
    """Deploy ``train-generation`` on the work pool ``pool``; returns the deployment's name."""
    from prefect.deployments.runner import EntrypointType

    try:
        train_generation.deploy(
            name=TRAINING_DEPLOYMENT, work_pool_name=pool,
            # Imported by module path from the checkout, so no image or code upload is needed.
            entrypoint_type=EntrypointType.MODULE_PATH,
            job_variables={"working_dir": str(PROJECT_ROOT)},
            build=False, push=False, print_next_steps=False,
        )
    except (ValueError, RuntimeError) as err:
        raise UserError(
            f"could not deploy train-generation on work pool {pool!r}: {err}",
            hint=f"create it first: prefect work-pool create {pool} --type process",
        ) from None
    return f"{train_generation.name}/{TRAINING_DEPLOYMENT}"


def require_server() -> str:
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    if not url:
        raise UserError(
            "PREFECT_API_URL is not set: schedules do not run on the temporary server of a plain flow run",
            hint="run `prefect server start`, then `prefect config set PREFECT_API_URL=http://127.0.0.1:4200/api`",
        )
    return str(url)


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> None:
    from prefect import serve

    parser = argparse.ArgumentParser(prog="python -m flows.serve", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--work-dir", help="where the flows keep their files (default: flows.work_dir)")
    parser.add_argument("--training-pool", help="deploy train-generation on this (GPU) work pool and train there")
    args = parser.parse_args(argv)
    setup_logging()
    settings = load_settings(args.params, args.work_dir)
    url = require_server()
    training = deploy_training(args.training_pool) if args.training_pool else settings.params.flows.training_deployment
    deployments = build_deployments(settings, training)
    print(f"serving on {url}: upgrade/{UPGRADE_DEPLOYMENT} ({settings.params.flows.upgrade_cron}), "
          f"backfill/{BACKFILL_DEPLOYMENT} ({settings.params.flows.backfill_cron}); work dir {settings.work.root}"
          + (f"; training on {training}" if training else ""), flush=True)
    serve(*deployments)


if __name__ == "__main__":
    main()
