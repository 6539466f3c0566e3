"""How the Prefect flows (``flows/``) run the library: task conventions and retries, progress
artifacts, training on a deployment, and serving the flows on their schedules.

A flow module holds only flows, tasks (each one call into the library) and its ``main``; the
Prefect plumbing they share is here. Tasks take a few short strings (the params file, the work
directory) and load what they need from them, so nothing big is hashed or serialised by Prefect;
caching is off (``NO_CACHE``) because the commands' output files already are the cache. Transient
failures (an OSError, a locked database) are retried ``flows.retries`` times; a ``UserError`` is bad
input that would fail the same way again, so it is not.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast
from uuid import UUID

from prefect import Flow, Task, task
from prefect.cache_policies import NO_CACHE

from modelupgrade.config import DEFAULT_PARAMS_FILE, Params, ParamsFile
from modelupgrade.errors import USER_ERRORS, UserError

if TYPE_CHECKING:
    from modelupgrade.chain import UpgradeChain

# The deployments ``serve_flows`` creates: <flow name>/<deployment name>.
UPGRADE_DEPLOYMENT = "scheduled"
BACKFILL_DEPLOYMENT = "champion-watch"
TRAINING_DEPLOYMENT = "gpu"


def retry_unless_user_error(task: Any, task_run: Any, state: Any) -> bool:
    """A task's retry condition: retry anything but bad input."""
    try:
        state.result()
    except USER_ERRORS:
        return False
    except Exception:  # noqa: BLE001 - every other failure may be transient
        return True
    return True


def flow_task(name: str) -> Callable[[Callable[..., Any]], Task]:
    """``@task`` with the flows' conventions: no input hashing, no retry of bad input."""
    return task(name=name, cache_policy=NO_CACHE, retry_condition_fn=retry_unless_user_error)


def with_retries(stage: Task, params: Params) -> Task:
    """``stage`` retrying as params.yaml says (``flows.retries`` after
    ``flows.retry_delay_seconds``)."""
    return stage.with_options(
        retries=params.flows.retries, retry_delay_seconds=params.flows.retry_delay_seconds
    )


def progress_artifact(key: str) -> Callable[[str, float], None]:
    """A progress callback (``modelupgrade.store.follow.Progress``) that shows each piece of work
    it hears of as a Prefect progress artifact under ``key``, updated as the work goes on."""
    from prefect.artifacts import create_progress_artifact, update_progress_artifact

    # Each piece of work described so far with its artifact, the one shown now last.
    shown: list[tuple[str, UUID]] = []

    def report(described: str, fraction: float) -> None:
        if not shown or shown[-1][0] != described:
            artifact = create_progress_artifact(0.0, key=key, description=described)
            # Called synchronously, Prefect's sync-or-async wrapper returns the id, not a coroutine.
            assert isinstance(artifact, UUID)
            shown.append((described, artifact))
        update_progress_artifact(shown[-1][1], 100.0 * fraction)

    return report


def run_on_deployment(deployment: str, parameters: dict[str, Any]) -> None:
    """Run a flow on its deployment (``<flow>/<deployment>``, e.g. on a GPU work pool) and wait;
    a run that does not complete raises."""
    from prefect.client.schemas.objects import FlowRun
    from prefect.deployments import run_deployment

    # Called synchronously, Prefect's sync-or-async wrapper returns the run, not a coroutine.
    run = cast(FlowRun, run_deployment(deployment, parameters=parameters, timeout=None))
    if run.state is None or not run.state.is_completed():
        state = run.state.name if run.state else "unknown"
        raise RuntimeError(
            f"training run {run.name!r} of deployment {deployment!r} ended {state}: "
            f"{run.state.message if run.state else ''}"
        )


def serve_flows(
    params_path: ParamsFile = DEFAULT_PARAMS_FILE,
    work_dir: str | None = None,
    training_pool: str | None = None,
    *,
    upgrade: Flow,
    backfill: Flow,
    training: Flow,
) -> None:
    """Serve the upgrade flow on its cron schedule and the backfill flow beside it.

    Deployments: upgrade/scheduled on flows.upgrade_cron (one upgrade cycle per run) and
    backfill/champion-watch on flows.backfill_cron (re-embeds the gallery store when champion has
    moved), each at most one run at a time; this process runs them until it is stopped (Ctrl-C
    pauses their schedules). Schedules need a Prefect server, not the temporary one a plain flow
    run starts:

        prefect server start                                   # UI on http://127.0.0.1:4200
        prefect config set PREFECT_API_URL=http://127.0.0.1:4200/api

    Args:
        params_path: the params file
        work_dir: where the flows keep their files (default: flows.work_dir)
        training_pool: also deploy train-generation/gpu on this work pool (a process pool on a GPU
            machine with this checkout at the same path) and have the upgrade runs train there
        upgrade: the upgrade flow
        backfill: the backfill flow
        training: the train-generation flow
    """
    from prefect import serve

    from modelupgrade.chain import load_chain

    chain = load_chain(params_path, work_dir)
    url = _require_server()
    flows = chain.params.flows
    deployment = (
        _deploy_training(training, training_pool) if training_pool else flows.training_deployment
    )
    deployments = _deployments(chain, deployment, upgrade, backfill)
    print(
        f"serving on {url}: upgrade/{UPGRADE_DEPLOYMENT} ({flows.upgrade_cron}), "
        f"backfill/{BACKFILL_DEPLOYMENT} ({flows.backfill_cron}); work dir {chain.layout.root}"
        + (f"; training on {deployment}" if deployment else ""),
        flush=True,
    )
    serve(*deployments)


def _deployments(
    chain: UpgradeChain, training_deployment: str | None, upgrade: Flow, backfill: Flow
) -> list[Any]:
    from pydantic import ValidationError

    flows = chain.params.flows
    params_path, work_dir = chain.reference
    where = {"params_path": params_path, "work_dir": work_dir}
    try:
        return [
            upgrade.to_deployment(
                name=UPGRADE_DEPLOYMENT,
                cron=flows.upgrade_cron,
                concurrency_limit=1,
                parameters={**where, "training_deployment": training_deployment},
                description=f"One upgrade cycle of {chain.registered_model} ({chain.strategy}).",
                tags=["modelupgrade"],
            ),
            backfill.to_deployment(
                name=BACKFILL_DEPLOYMENT,
                cron=flows.backfill_cron,
                concurrency_limit=1,
                parameters=where,
                description=f"Keep the gallery store {chain.layout.champion_store} on the "
                f"champion of {chain.registered_model}.",
                tags=["modelupgrade"],
            ),
        ]
    except ValidationError as err:
        raise UserError(
            f"flows.upgrade_cron / flows.backfill_cron: {err.errors()[0]['msg']}"
        ) from None


def _deploy_training(training: Flow, pool: str) -> str:
    """Deploy ``training`` on the work pool ``pool``; returns the deployment's name."""
    from prefect.deployments.runner import EntrypointType

    # The checkout holding the flows: the worker imports them by module path from there, so no
    # image or code upload is needed.
    checkout = Path(inspect.getfile(training.fn)).resolve().parents[1]
    try:
        training.deploy(
            name=TRAINING_DEPLOYMENT,
            work_pool_name=pool,
            entrypoint_type=EntrypointType.MODULE_PATH,
            job_variables={"working_dir": str(checkout)},
            build=False,
            push=False,
            print_next_steps=False,
        )
    except (ValueError, RuntimeError) as err:
        raise UserError(
            f"could not deploy train-generation on work pool {pool!r}: {err}",
            hint=f"create it first: prefect work-pool create {pool} --type process",
        ) from None
    return f"{training.name}/{TRAINING_DEPLOYMENT}"


def _require_server() -> str:
    from prefect.settings import get_current_settings

    url = get_current_settings().api.url
    if not url:
        raise UserError(
            "PREFECT_API_URL is not set: schedules do not run on the temporary server of a plain "
            "flow run",
            hint="run `prefect server start`, then `prefect config set "
            "PREFECT_API_URL=http://127.0.0.1:4200/api`",
        )
    return str(url)
