"""Flow ``upgrade``: one upgrade cycle of the retrieval system's embedding model.

    python -m flows.upgrade [--params params.yaml] [--work-dir runs/flows] [--snapshot new.parquet]
                            [--new-model models/adopted]
                            [--training-deployment train-generation/gpu] [--json]

Reads the chain and its ``champion`` from the registry; takes the next data snapshot (the next
growing slice of the dataset, or ``--snapshot``: manifest rows the user supplies, checked by the
validate stage); trains the next generation with ``flows.strategy`` and ``flows.heads`` (flow
``train-generation``, locally or on a GPU work pool), or with ``--new-model`` takes a model made
elsewhere (``modelupgrade adopt``) as that generation and trains only the oracle and the heads;
evaluates the chain's compatibility matrix,
which holds the new model's queries against the champion's gallery, and Δ↓ against the oracle
chain; registers the new version, gated against the champion (``candidate`` when it passes);
publishes the cycle's report (markdown) and metrics (table) as artifacts. The first cycle of an
empty registry trains gen0, which becomes champion. Every step is a step of
``modelupgrade.chain``, which runs the commands ``dvc repro`` runs.
"""

from __future__ import annotations

from typing import Any

from prefect import Task, flow

from flows.reports import publish_skipped_upgrade, publish_upgrade_report
from flows.tasks import (
    add_snapshot,
    commit_data,
    evaluate_chain,
    prepare_manifest,
    read_chain,
    register_chain,
    split_snapshots,
    validate_data,
)
from flows.training import train_generation
from modelupgrade.chain import load_chain
from modelupgrade.cli.arguments import stage_main
from modelupgrade.config import DEFAULT_PARAMS_FILE, ParamsFile
from modelupgrade.orchestration import run_on_deployment, with_retries
from modelupgrade.report.upgrade import CycleOutcome


@flow(name="upgrade")
def upgrade(
    params_path: ParamsFile = DEFAULT_PARAMS_FILE,
    work_dir: str | None = None,
    snapshot: str | None = None,
    training_deployment: str | None = None,
    new_model: str | None = None,
) -> dict[str, Any]:
    """One upgrade cycle: next data snapshot, validate, train, evaluate against the champion,
    gate, register.

    Args:
        params_path: the params file
        work_dir: where the flows keep their files (default: flows.work_dir)
        snapshot: manifest rows (parquet) to train the next generation on
        training_deployment: train on this deployment of train-generation (a GPU pool; default:
            flows.training_deployment, else here)
        new_model: a model directory made elsewhere (`modelupgrade adopt --out DIR`) to take as
            the next generation instead of training one (on an empty registry: gen0, the
            production model)
    """
    chain = load_chain(params_path, work_dir)
    args = chain.reference

    def step(task: Task) -> Task:  # a task with the retries of params.yaml
        return with_retries(task, chain.params)

    generation = step(read_chain)(*args)["next_generation"]
    # New split files are proposed, validated, and only then used: data that failed an expectation
    # never reaches training, in this run or a later one.
    proposed = False
    if not chain.has_splits():
        step(prepare_manifest)(*args)
        step(split_snapshots)(*args)
        proposed = True
    if snapshot is not None:
        step(add_snapshot)(*args, generation, snapshot, proposed)
        proposed = True
    if proposed:
        step(validate_data)(*args)
        step(commit_data)(*args)
    if not chain.has_snapshot(generation):
        return step(publish_skipped_upgrade)(*args, generation)

    training = {"generation": generation, "params_path": args[0], "work_dir": args[1]}
    if new_model is not None:
        training["new_model"] = new_model
    deployment = training_deployment or chain.params.flows.training_deployment
    if deployment is None:
        train_generation(**training)
    else:
        run_on_deployment(deployment, training)
    step(evaluate_chain)(*args, generation + 1)
    registration = step(register_chain)(*args, generation + 1)
    return step(publish_upgrade_report)(*args, generation, registration)


main = stage_main(upgrade, CycleOutcome)

if __name__ == "__main__":
    main()
