"""The flows' Prefect tasks: each is one call into the library, a step of the upgrade chain
(``modelupgrade.chain``, which runs the commands ``dvc repro`` runs), returning small JSON-able
values: file paths and records, never arrays or models.

Every task takes the params file and the work directory and loads the chain from them, so a task's
inputs stay a few short strings; ``modelupgrade.orchestration`` has the tasks' conventions (no
caching, no retry of bad input).
"""

from __future__ import annotations

from typing import Any

from modelupgrade.chain import load_chain
from modelupgrade.orchestration import flow_task, progress_artifact

# -- the chain and its data ------------------------------------------------------------------------


@flow_task("read-chain")
def read_chain(params_path: str, work_dir: str) -> dict[str, Any]:
    """The chain's registered generations, its champion and the next generation number."""
    return load_chain(params_path, work_dir).state().as_dict()


@flow_task("prepare")
def prepare_manifest(params_path: str, work_dir: str) -> dict[str, Any]:
    return load_chain(params_path, work_dir).prepare().as_dict()


@flow_task("split")
def split_snapshots(params_path: str, work_dir: str) -> dict[str, Any]:
    """The planned growing snapshots and the evaluation splits, proposed until validated."""
    return load_chain(params_path, work_dir).propose_splits().as_dict()


@flow_task("add-snapshot")
def add_snapshot(
    params_path: str, work_dir: str, generation: int, snapshot: str, extend_proposal: bool
) -> str:
    """Propose a user's snapshot as ``generation``'s training data."""
    return str(
        load_chain(params_path, work_dir).propose_snapshot(generation, snapshot, extend_proposal)
    )


@flow_task("validate")
def validate_data(params_path: str, work_dir: str) -> str:
    """Great Expectations over the manifest and the proposed split files; raises on a failed one."""
    return str(load_chain(params_path, work_dir).validate_proposal().out_dir)


@flow_task("commit-data")
def commit_data(params_path: str, work_dir: str) -> str:
    """Put the validated split files where training reads them."""
    return str(load_chain(params_path, work_dir).commit_proposal())


# -- training --------------------------------------------------------------------------------------


@flow_task("train")
def train_model(params_path: str, work_dir: str, generation: int, strategy: str) -> str:
    """``strategy``'s model of ``generation``, with its embeddings of the evaluation splits."""
    return str(load_chain(params_path, work_dir).train(generation, strategy).out)


@flow_task("take-model")
def take_model(params_path: str, work_dir: str, generation: int, new_model: str) -> str:
    """A model made outside the chain (adopted, or trained elsewhere) taken as ``generation``,
    checked, with its embeddings of the evaluation splits."""
    return str(load_chain(params_path, work_dir).take_model(generation, new_model))


@flow_task("embed-snapshot")
def embed_snapshot(
    params_path: str, work_dir: str, model_generation: int, snapshot_generation: int
) -> list[str]:
    """One chain model's embeddings of a training snapshot (what a head trains on)."""
    return (
        load_chain(params_path, work_dir)
        .embed_snapshot(model_generation, snapshot_generation)
        .as_dict()
    )


@flow_task("train-head")
def train_head(params_path: str, work_dir: str, generation: int, head: str) -> str:
    """Head ``head`` between the chain's generations ``generation - 1`` and ``generation``."""
    return str(load_chain(params_path, work_dir).train_head(generation, head).out)


# -- evaluation and registration -------------------------------------------------------------------


@flow_task("evaluate")
def evaluate_chain(params_path: str, work_dir: str, generations: int) -> str:
    """The compatibility matrix of the chain and of the oracle chain (each generation's Δ↓)."""
    return str(load_chain(params_path, work_dir).evaluate(generations).metrics_dir)


@flow_task("register")
def register_chain(params_path: str, work_dir: str, generations: int) -> dict[str, Any]:
    """Register the chain's generations, the new one gated against the champion."""
    return load_chain(params_path, work_dir).register(generations).as_dict()


# -- the gallery store -----------------------------------------------------------------------------


@flow_task("follow-champion")
def follow_champion(params_path: str, work_dir: str, store: str | None) -> dict[str, Any]:
    """Keep the gallery store on the champion, publishing a backfill's progress as the
    ``backfill-progress`` artifact."""
    return (
        load_chain(params_path, work_dir)
        .follow_champion(store, progress_artifact("backfill-progress"))
        .as_dict()
    )
