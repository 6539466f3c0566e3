"""The study again at further training seeds: what the claims rest on, so that a verdict can weigh a
difference against the seeds' spread.

For each seed of ``replicates.seeds``, the scenarios listed under ``replicates.scenarios`` are run
as the DVC stages run them (train gen0 and the listed strategies, embedding the same splits; train
the listed heads and write their outputs; fit the training-free adapters; evaluate; simulate the
backfill where asked), with the same library calls, on the study's own splits. Only the results
are kept: ``<root>/seed-<seed>/metrics/<scenario>/`` holds what the study's ``metrics/<scenario>/``
holds, so ``modelupgrade.report`` reads a replicate as it reads the study. Models, embeddings and
heads are scratch, removed when the seed is done. The seeds run side by side, one process each,
sharing the machine's cores.
"""

from __future__ import annotations

import logging
import os
import shutil
from collections.abc import Callable
from concurrent.futures import ProcessPoolExecutor
from multiprocessing import get_context
from pathlib import Path
from typing import TYPE_CHECKING

from modelupgrade.config import Params, ScenarioParams
from modelupgrade.io import file_sha256, write_json
from modelupgrade.layout import (
    EVALUATION_SPLITS,
    NEW_TRAIN_SPLIT,
    OLD_MODEL,
    OLD_TRAIN_SPLIT,
    StudyLayout,
    head_name,
    model_name,
)

if TYPE_CHECKING:
    import torch

log = logging.getLogger(__name__)

REPLICATES_ROOT = Path("replicates")
# What the last run of the replicates did (also what keeps the stage's output directory non-empty
# when there is no further seed).
SEEDS_FILE = "seeds.json"
# Environment variables that size the thread pools of torch, FAISS and BLAS in a worker process;
# set before any of them is imported there.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


def replicate_dir(root: Path, seed: int) -> Path:
    return root / f"seed-{seed}"


def replicate_layout(root: Path, seed: int) -> StudyLayout:
    """Where a finished replicate's results are: ``<root>/seed-<seed>/metrics``."""
    return StudyLayout(root=replicate_dir(root, seed))


def replicate_params(params: Params, seed: int, cpu_threads: int | None = None) -> Params:
    """The study's params at ``seed``, cut down to what ``replicates.scenarios`` lists."""
    scenarios: dict[str, ScenarioParams] = {}
    for name, replicate in params.replicates.scenarios.items():
        scenario = params.scenarios[name]
        scenarios[name] = scenario.model_copy(
            update={
                "strategies": list(replicate.strategies),
                "heads": {head: scenario.heads[head] for head in replicate.heads},
            }
        )
    adapters = {
        name: strategy
        for name, strategy in params.adapters.scenarios.items()
        if name in scenarios and strategy in scenarios[name].strategies
    }
    raw = params.model_dump()
    raw.update(
        seed=seed,
        study={"scenarios": list(scenarios), "sequential": []},
        scenarios={name: scenario.model_dump() for name, scenario in scenarios.items()},
        sequential={**raw["sequential"], "strategies": [], "heads": {}},
        replicates={},
    )
    raw["adapters"]["scenarios"] = adapters
    wanted = params.replicates
    if wanted.policies:
        raw["backfill"]["policies"] = list(wanted.policies)
    if wanted.serving_modes:
        raw["backfill"]["serving_modes"] = list(wanted.serving_modes)
    if cpu_threads is not None:
        raw["training"]["cpu_threads"] = cpu_threads
    return Params.model_validate(raw)


def run_replicates(
    params: Params, root: Path = REPLICATES_ROOT, splits_root: Path | None = None
) -> list[Path]:
    """Run every seed of ``replicates.seeds`` (side by side, ``replicates.workers`` at a time) and
    return the result directory of each, then ``seeds.json`` (the seeds run). A seed's results
    replace the last run's only once it has finished; directories of seeds no longer listed are
    removed. No seed: nothing runs (the study rests on its own seed)."""
    seeds = params.replicates.seeds
    splits_root = splits_root or StudyLayout().splits_root
    workers = max(1, min(params.replicates.workers, len(seeds)))
    threads = max(1, (os.cpu_count() or 1) // workers)
    root.mkdir(parents=True, exist_ok=True)
    if not seeds:
        log.info("replicates.seeds is empty: the study rests on its own seed alone")
        done = []
    elif workers == 1:
        done = [run_replicate(params, seed, root, splits_root, threads) for seed in seeds]
    else:
        with ProcessPoolExecutor(
            workers,
            mp_context=get_context("spawn"),
            initializer=_share_cores,
            initargs=(threads,),
        ) as pool:
            runs = [
                pool.submit(run_replicate, params, seed, root, splits_root, threads)
                for seed in seeds
            ]
            done = [run.result() for run in runs]
    kept = {path.name for path in done}
    for stale in root.glob("seed-*"):
        if stale.name not in kept:
            shutil.rmtree(stale)
    listing = root / SEEDS_FILE
    write_json(listing, {"seeds": list(seeds), "results": [path.name for path in done]})
    return [*done, listing]


def _share_cores(threads: int) -> None:
    for variable in THREAD_VARIABLES:
        os.environ[variable] = str(threads)
    # Idle OpenMP threads sleep instead of spinning: beside another busy process, spinning
    # threads take the cores from it (measured: 2-thread training at 204 images/s with spinning,
    # 1,155 without, on two loaded cores).
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")


def run_replicate(
    params: Params,
    seed: int,
    root: Path,
    splits_root: Path,
    cpu_threads: int | None = None,
    on_finished: Callable[[Params, StudyLayout], None] | None = None,
) -> Path:
    """One seed of the replicates: train, evaluate and simulate in a scratch tree, then keep its
    metrics as ``<root>/seed-<seed>``. ``on_finished`` reads the scratch tree (with the seed's
    params) before it goes: the GPU study's run record takes each model's training time there."""
    import torch

    from modelupgrade.runtime import select_device

    seeded = replicate_params(params, seed, cpu_threads)
    if cpu_threads is not None:
        torch.set_num_threads(cpu_threads)
    work = root / f".seed-{seed}.partial"
    shutil.rmtree(work, ignore_errors=True)
    layout = StudyLayout(root=work, splits_root=splits_root)
    device = select_device(seeded.device)
    # A model whose training inputs another scenario's model had (the same split file and
    # architecture, and no old model to train against: the old models and the independent new
    # models of the scenarios that share a split) comes out the same at one seed, weight for
    # weight: it is trained once and copied.
    trained: dict[tuple[str, ...], Path] = {}
    for scenario, setting in seeded.scenarios.items():
        log.info("replicate seed %d: training %s", seed, scenario)
        for strategy in (None, *setting.strategies):
            same = _shared_training(seeded, layout, scenario, strategy)
            model = layout.model(scenario, model_name(0 if strategy is None else 1, strategy))
            if same is not None and same in trained:
                _reuse(seeded, layout, scenario, trained[same], model, logits=strategy is None)
                continue
            _train(seeded, layout, scenario, strategy)
            if same is not None:
                trained[same] = model
        for head, strategy in setting.heads.items():
            _train_head(seeded, layout, scenario, head, strategy, device)
    simulated = {name for name, wanted in params.replicates.scenarios.items() if wanted.backfill}
    _evaluate(seeded, layout, device, simulated)
    if on_finished is not None:
        on_finished(seeded, layout)
    final = replicate_dir(root, seed)
    shutil.rmtree(final, ignore_errors=True)
    final.mkdir(parents=True)
    os.replace(layout.metrics_root, final / layout.metrics_root.name)
    shutil.rmtree(work)
    return final


def _train(params: Params, layout: StudyLayout, scenario: str, strategy: str | None) -> None:
    """One model as the train stage makes it, and its embeddings."""
    from modelupgrade.training.generation import training_arguments

    generation = 0 if strategy is None else 1
    out = layout.model(scenario, model_name(generation, strategy))
    job = training_arguments(
        params,
        out=out,
        generation=generation,
        scenario=scenario,
        strategy=strategy,
        old=None if strategy is None else layout.model(scenario, OLD_MODEL),
        progress=False,
        layout=layout,
    )
    job.train()
    _embed(params, layout, scenario, out, logits=strategy is None)


def _shared_training(
    params: Params, layout: StudyLayout, scenario: str, strategy: str | None
) -> tuple[str, ...] | None:
    """What makes a model of ``scenario`` the same as another scenario's at one seed (its split
    file's hash, its architecture, its strategy), or None where it trains against the scenario's
    own old model."""
    from modelupgrade.strategies import STRATEGIES

    setting = params.scenarios[scenario]
    if strategy is None:
        split, architecture = OLD_TRAIN_SPLIT, setting.old_architecture
    else:
        if STRATEGIES.get(params.strategies[strategy].kind).needs_old_model:
            return None
        split, architecture = NEW_TRAIN_SPLIT, setting.new_architecture
    return (file_sha256(layout.split_file(scenario, split)), architecture, strategy or "")


def _reuse(
    params: Params, layout: StudyLayout, scenario: str, trained: Path, out: Path, logits: bool
) -> None:
    """Another scenario's model, trained on the same inputs, as this scenario's: copied, then
    embedding this scenario's splits."""
    shutil.copytree(trained, out)
    _embed(params, layout, scenario, out, logits=logits)


def _embed(params: Params, layout: StudyLayout, scenario: str, model: Path, logits: bool) -> None:
    """The evaluation and training splits embedded as the train stage embeds them (with the
    classifier's logits for the old model, which order the backfill)."""
    from modelupgrade.training.generation import embed_splits

    splits = [layout.split_file(scenario, split) for split in EVALUATION_SPLITS]
    splits.append(layout.split_file(scenario, NEW_TRAIN_SPLIT))
    embed_splits(
        params, model, splits, out_dir=layout.embeddings(scenario, model.name), logits=logits
    )


def _train_head(
    params: Params,
    layout: StudyLayout,
    scenario: str,
    head: str,
    strategy: str,
    device: torch.device,
) -> None:
    """One head as the heads stage trains it, with its outputs on the evaluation embeddings."""
    from modelupgrade.heads import write_head_outputs
    from modelupgrade.heads.pipeline import train_and_save_head

    new = model_name(1, strategy)
    out = layout.head(scenario, head_name(head, strategy))
    train_and_save_head(
        params,
        head,
        layout.embedding_file(scenario, OLD_MODEL, NEW_TRAIN_SPLIT),
        layout.embedding_file(scenario, new, NEW_TRAIN_SPLIT),
        layout.split_file(scenario, NEW_TRAIN_SPLIT),
        out,
        new_model=layout.model(scenario, new),
        old_model=layout.model(scenario, OLD_MODEL),
    )
    write_head_outputs(
        out,
        layout.embeddings(scenario, OLD_MODEL),
        layout.embeddings(scenario, new),
        layout.head_outputs(scenario, head_name(head, strategy)),
        device=device,
    )


def _evaluate(
    params: Params, layout: StudyLayout, device: torch.device, simulated: set[str]
) -> None:
    """The adapters and evaluation of every scenario and the backfill simulation of those in
    ``simulated``, as their stages run them."""
    from modelupgrade.backfill.study import backfill_inputs, simulate_backfill
    from modelupgrade.evaluation.scenario import evaluate_scenario
    from modelupgrade.heads.adapter_study import fit_adapter_study

    for scenario in params.adapters.scenarios:
        fit_adapter_study(params, scenario, layout, device)
    for scenario in params.scenarios:
        evaluate_scenario(params, scenario, layout)
        if scenario not in simulated:
            continue
        simulate_backfill(
            params,
            scenario,
            backfill_inputs(params, scenario, layout.embeddings_root),
            metrics_dir=layout.metrics(scenario),
            plots_dir=layout.plots(scenario),
            layout=layout,
        )
