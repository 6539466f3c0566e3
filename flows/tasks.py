"""The flows' Prefect tasks: each runs one command of ``modelupgrade.commands`` (what ``dvc repro``
runs) or reads the registry, and passes file paths and small JSON records between tasks, never
arrays or models.

Every task takes the params file and the work directory and rebuilds its settings from them, so a
task's inputs stay a few short strings: nothing big is hashed or serialised by Prefect, and caching
is off (``NO_CACHE``) because the stages' output files already are the cache. Transient failures (an
OSError, a locked database) are retried ``flows.retries`` times; a ``UserError`` is bad input that
would fail the same way again, so it is not.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from prefect import Task, task
from prefect.cache_policies import NO_CACHE

from flows.layout import SEQUENTIAL, FlowSettings, generation_of, load_settings, model_key
from modelupgrade.config import Params
from modelupgrade.errors import USER_ERRORS, UserError
from modelupgrade.io import file_sha256, write_json


def _retry_unless_user_error(task: Any, task_run: Any, state: Any) -> bool:
    try:
        state.result()
    except USER_ERRORS:
        return False
    except Exception:  # noqa: BLE001 - every other failure may be transient
        return True
    return True


def stage_task(name: str) -> Any:
    """``@task`` with the flows' conventions: no input hashing, no retry of bad input."""
    return task(name=name, cache_policy=NO_CACHE, retry_condition_fn=_retry_unless_user_error)


def with_retries(stage: Task, params: Params) -> Task:
    """``stage`` retrying as params.yaml says (``flows.retries`` after ``flows.retry_delay_seconds``)."""
    return stage.with_options(retries=params.flows.retries, retry_delay_seconds=params.flows.retry_delay_seconds)


# -- data ------------------------------------------------------------------------------------------


@stage_task("prepare")
def prepare_manifest(params_path: str, work_dir: str) -> str:
    from modelupgrade.commands.data import prepare

    settings = load_settings(params_path, work_dir)
    prepare(settings.params, settings.work.manifest)
    return str(settings.work.manifest)


@stage_task("split")
def split_snapshots(params_path: str, work_dir: str) -> str:
    """The planned growing snapshots and the evaluation splits, proposed until validated."""
    from modelupgrade.commands.data import split

    settings = load_settings(params_path, work_dir)
    work = settings.work
    split(settings.params, work.manifest, work.proposed_splits, sequential=True)
    return str(work.proposed_splits)


@stage_task("add-snapshot")
def add_snapshot(params_path: str, work_dir: str, base: str, generation: int, snapshot: str) -> str:
    """Propose the split files ``base`` with a user's snapshot as generation ``generation``'s training
    data; it replaces the planned slices from that generation on (they would not contain it)."""
    from modelupgrade.data import Splits, read_manifest, read_splits, write_splits

    settings = load_settings(params_path, work_dir)
    frame = read_manifest(snapshot)
    if frame.empty:
        raise UserError(f"the snapshot {snapshot} has no rows")
    current = read_splits(base)
    frames = {
        name: rows for name, rows in current.frames.items()
        if not (name.startswith("gen") and int(name[3:]) >= generation)
    }
    frames[f"gen{generation}"] = frame
    supplied = {**dict(current.info.get("supplied_snapshots") or {}), f"gen{generation}": str(Path(snapshot).resolve())}
    write_splits(settings.work.proposed_splits, Splits(frames, {**current.info, "supplied_snapshots": supplied}))
    return str(settings.work.proposed_splits)


@stage_task("validate")
def validate_data(params_path: str, work_dir: str) -> str:
    """Great Expectations over the manifest and the proposed split files; raises on a failed one."""
    from modelupgrade.commands.data import validate

    settings = load_settings(params_path, work_dir)
    work = settings.work
    validate(settings.params, work.manifest, [work.proposed_splits], out_dir=work.proposed_validation)
    return str(work.proposed_validation)


@stage_task("commit-data")
def commit_data(params_path: str, work_dir: str) -> str:
    """Put the validated split files (and their reports) where training reads them."""
    import shutil

    from modelupgrade.io import atomic_path

    work = load_settings(params_path, work_dir).work
    for proposed, final in ((work.proposed_splits, work.splits), (work.proposed_validation, work.validation)):
        with atomic_path(final) as tmp:
            shutil.copytree(proposed, tmp)
    shutil.rmtree(work.proposed_splits.parent)
    return str(work.splits)


# -- registry --------------------------------------------------------------------------------------


def open_registry(settings: FlowSettings) -> Any:
    from modelupgrade.registry import ModelRegistry, Tracker

    tracker = Tracker.from_params(settings.stage_params(1))
    return ModelRegistry(tracker, settings.registered_model)


@stage_task("read-chain")
def read_chain(params_path: str, work_dir: str) -> dict[str, Any]:
    """The registered generations of the flows' chain, its champion and the next generation number.

    Every registered generation must be the model in this work directory (same checkpoint): the
    next generation trains against them and the evaluation reads their embeddings.
    """
    from modelupgrade.models import WEIGHTS_FILE

    settings = load_settings(params_path, work_dir)
    registry = open_registry(settings)
    newest: dict[int, Any] = {}
    for version in registry.versions():
        generation = generation_of(version.model_key, settings.strategy)
        if generation is None:
            raise UserError(
                f"registered model {registry.name!r} holds {version.model_key!r} (v{version.version}), which is "
                f"not in the {settings.strategy!r} chain",
                hint="a chain keeps its strategy: set flows.strategy back, or flows.model_name to start a new one",
            )
        newest[generation] = version
    for generation, version in sorted(newest.items()):
        checkpoint = settings.work.model(settings.strategy, generation) / WEIGHTS_FILE
        if not checkpoint.is_file() or file_sha256(checkpoint) != version.tags.get("checkpoint_sha256"):
            raise UserError(
                f"{registry.name!r} v{version.version} ({version.model_key}) is not the model in {checkpoint.parent}",
                hint="run with the --work-dir that trained this chain, or set flows.model_name to start a new chain",
            )
    generations = sorted(newest)
    if generations != list(range(len(generations))):
        raise UserError(f"{registry.name!r} has generations {generations}, with gaps in the chain")
    champion = registry.champion()
    return {
        "registered_model": registry.name,
        "tracking_uri": registry.tracker.config.tracking_uri,
        "generations": generations,
        "next_generation": len(generations),
        "champion": None if champion is None else {
            "version": champion.version,
            "model_key": champion.model_key,
            "generation": generation_of(champion.model_key, settings.strategy),
        },
    }


# -- training --------------------------------------------------------------------------------------


@stage_task("train")
def train_model(params_path: str, work_dir: str, generation: int, strategy: str) -> str:
    """Train ``strategy``'s model of ``generation`` on its snapshot against the chain's previous
    generation, then embed the evaluation splits with it (the train stage's --embed-split)."""
    from modelupgrade.commands.training import train
    from modelupgrade.layout import EVALUATION_SPLITS, SEQUENTIAL, StudyLayout
    from modelupgrade.training.generation import DEFAULT_ARCHITECTURE

    settings = load_settings(params_path, work_dir)
    work = settings.work
    out = work.model(strategy, generation)
    evaluation = [StudyLayout(work.root).split_file(SEQUENTIAL, s) for s in EVALUATION_SPLITS]
    train(
        settings.params, generation=generation,
        strategy=strategy if generation > 0 else None,
        old=work.model(settings.strategy, generation - 1) if generation > 0 else None,
        split=work.snapshot(generation), architecture=DEFAULT_ARCHITECTURE, out=out, progress=False,
        embed_split=evaluation, embed_dir=work.embeddings(strategy, generation),
    )
    return str(out)


@stage_task("embed-snapshot")
def embed_snapshot(params_path: str, work_dir: str, model_generation: int, snapshot_generation: int) -> str:
    """One chain model's embeddings of a training snapshot (what a head trains on)."""
    from modelupgrade.commands.training import embed

    settings = load_settings(params_path, work_dir)
    work = settings.work
    out = work.snapshot_embeddings(settings.strategy, model_generation, snapshot_generation)
    embed(settings.params, work.model(settings.strategy, model_generation),
          split=[work.snapshot(snapshot_generation)], out=out)
    return str(out)


@stage_task("train-head")
def train_head(params_path: str, work_dir: str, generation: int, head: str) -> str:
    """Head ``head`` between the chain's generations ``generation - 1`` and ``generation``."""
    from modelupgrade.commands.heads import train_heads

    settings = load_settings(params_path, work_dir)
    work, strategy = settings.work, settings.strategy
    out = work.heads(strategy, generation) / head
    train_heads(
        settings.params, head,
        old_embeddings=work.snapshot_embeddings(strategy, generation - 1, generation),
        new_embeddings=work.snapshot_embeddings(strategy, generation, generation),
        labels=work.snapshot(generation), out=out,
        new_model=work.model(strategy, generation), old_model=work.model(strategy, generation - 1),
    )
    return str(out)


# -- evaluation and registration -------------------------------------------------------------------


@stage_task("evaluate")
def evaluate_chain(params_path: str, work_dir: str, generations: int) -> str:
    """The compatibility matrix of the chain (and of the oracle chain, for Δ↓)."""
    from modelupgrade.commands.evaluation import evaluate

    settings = load_settings(params_path, work_dir)
    work = settings.work
    evaluate(
        settings.stage_params(generations), SEQUENTIAL, embeddings_root=work.embeddings_root,
        splits_root=work.splits_root, heads_root=work.heads_root, metrics_root=work.metrics_root,
        plots_root=work.plots_root, strategies=settings.evaluated_strategies,
    )
    return str(work.metrics(settings.strategy) / "summary.json")


@stage_task("degradation")
def degradation_evidence(params_path: str, work_dir: str, generations: int) -> str | None:
    """Δ↓ of every chain generation against the oracle's model of the same generation, as the
    register stage's --gate-metrics file; None without an oracle (the gate then reports it unmeasured)."""
    import pandas as pd

    from modelupgrade.metrics import degradation

    settings = load_settings(params_path, work_dir)
    if settings.oracle is None:
        return None
    params = settings.params
    metric = params.registry.gate_metric or params.evaluation.headline_metric
    ours = _self_scores(pd.read_parquet(settings.work.metrics(settings.strategy) / "cross_model.parquet"), metric)
    oracle = _self_scores(pd.read_parquet(settings.work.metrics(settings.oracle) / "cross_model.parquet"), metric)
    models: dict[str, dict[str, float]] = {}
    for generation in range(1, generations):
        name = f"gen{generation}"
        value = degradation(ours[name], oracle[name])
        if value == value:  # NaN (an oracle scoring 0) stays unmeasured
            models[model_key(settings.strategy, generation)] = {"degradation_pct": value}
    out = settings.work.gate_metrics(generations - 1)
    write_json(out, {"metric": metric, "models": models})
    return str(out)


def _self_scores(table: Any, metric: str) -> dict[str, float]:
    rows = table[(table.query_set == table.gallery_set) & (table.metric == metric)]
    return {str(r.query_set): float(r.value) for r in rows.itertuples()}


@stage_task("register")
def register_chain(params_path: str, work_dir: str, generations: int, gate_metrics: str | None) -> dict[str, Any]:
    """Register the chain's generations (the new one gated against champion) as the register stage does."""
    from modelupgrade.commands.registry import register

    settings = load_settings(params_path, work_dir)
    work = settings.work
    return register(
        settings.stage_params(generations), SEQUENTIAL, work.registration(generations - 1),
        models_root=work.models_root, heads_root=work.heads_root, splits_root=work.splits_root,
        metrics_root=work.metrics_root,
        gate_metrics=Path(gate_metrics) if gate_metrics else None,
    ).summary
