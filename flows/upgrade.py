"""Flow ``upgrade``: one upgrade cycle of the retrieval system's embedding model.

    python -m flows.upgrade [--params params.yaml] [--work-dir runs/flows] [--snapshot new.parquet]

Reads the chain and its ``champion`` from the registry; takes the next data snapshot (the next
growing slice of the dataset, or ``--snapshot``: manifest rows the user supplies, checked by the
validate stage); trains the next generation with ``flows.strategy`` and ``flows.heads`` (flow
``train-generation``, locally or on a GPU work pool); evaluates the chain's compatibility matrix,
which holds the new model's queries against the champion's gallery; registers the new version with
the register stage, which gates it against the champion and makes it ``candidate`` when it passes;
publishes the cycle's report (markdown) and metrics (table) as artifacts. The first cycle of an
empty registry trains gen0, which becomes champion. Every step is a command of
``modelupgrade.commands`` that ``dvc repro`` also runs; files are in the work directory (see
``flows.layout``).
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from typing import Any

from prefect import flow

from flows.layout import FlowSettings, load_settings
from flows.reports import publish_skipped_upgrade, publish_upgrade_report
from flows.tasks import (
    add_snapshot,
    commit_data,
    degradation_evidence,
    evaluate_chain,
    prepare_manifest,
    read_chain,
    register_chain,
    split_snapshots,
    validate_data,
    with_retries,
)
from flows.training import train_generation
from modelupgrade.errors import exit_on_user_error
from modelupgrade.runtime import setup_logging


@flow(name="upgrade")
def upgrade(
    params_path: str = "params.yaml",
    work_dir: str | None = None,
    snapshot: str | None = None,
    training_deployment: str | None = None,
) -> dict[str, Any]:
    settings = load_settings(params_path, work_dir)
    args = (str(settings.params_path), str(settings.work.root))

    def step(task):  # noqa: ANN001, ANN202 - a task with the retries of params.yaml
        return with_retries(task, settings.params)

    chain = step(read_chain)(*args)
    generation = chain["next_generation"]
    # New split files are proposed, validated, and only then used: data that failed an expectation
    # never reaches training, in this run or a later one.
    proposed = False
    if not (settings.work.splits / "split_info.json").is_file():
        step(prepare_manifest)(*args)
        step(split_snapshots)(*args)
        proposed = True
    if snapshot is not None:
        base = settings.work.proposed_splits if proposed else settings.work.splits
        step(add_snapshot)(*args, str(base), generation, snapshot)
        proposed = True
    if proposed:
        step(validate_data)(*args)
        step(commit_data)(*args)
    if not settings.work.snapshot(generation).is_file():
        return step(publish_skipped_upgrade)(*args, generation)

    train_remotely_or_here(settings, generation, training_deployment or settings.params.flows.training_deployment)
    step(evaluate_chain)(*args, generation + 1)
    gate_metrics = step(degradation_evidence)(*args, generation + 1)
    registration = step(register_chain)(*args, generation + 1, gate_metrics)
    return step(publish_upgrade_report)(*args, generation, registration)


def train_remotely_or_here(settings: FlowSettings, generation: int, deployment: str | None) -> None:
    parameters = {"generation": generation, "params_path": str(settings.params_path),
                  "work_dir": str(settings.work.root)}
    if deployment is None:
        train_generation(**parameters)
        return
    from prefect.deployments import run_deployment

    run = run_deployment(deployment, parameters=parameters, timeout=None)
    if run.state is None or not run.state.is_completed():
        state = run.state.name if run.state else "unknown"
        raise RuntimeError(
            f"training run {run.name!r} of deployment {deployment!r} ended {state}: "
            f"{run.state.message if run.state else ''}"
        )


def print_outcome(result: dict[str, Any]) -> None:
    if result["status"] == "skipped":
        print(f"gen{result['generation']}: no new data snapshot, nothing trained or registered")
        return
    print(f"registered {result['model_key']} as {result['registered_model']} v{result['version']} "
          f"(gates: {result['gates']}{', failed: ' + ', '.join(result['failed_gates']) if result['failed_gates'] else ''}"
          f"; aliases: {', '.join(result['aliases']) or 'none'})")
    print(f"report:   {result['report']}")
    print(f"MLflow:   {result['tracking_uri']}  (modelupgrade lineage --model {result['registered_model']})")


@exit_on_user_error
def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m flows.upgrade", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--params", default="params.yaml")
    parser.add_argument("--work-dir", help="where the flows keep their files (default: flows.work_dir)")
    parser.add_argument("--snapshot", help="manifest rows (parquet) to train the next generation on")
    parser.add_argument("--training-deployment", help="train on this deployment of train-generation (GPU pool)")
    args = parser.parse_args(argv)
    setup_logging()
    result = upgrade(args.params, args.work_dir, args.snapshot, args.training_deployment)
    print_outcome(result)


if __name__ == "__main__":
    main()
