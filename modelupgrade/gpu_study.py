"""The study at GPU scale in one process, within a hard time limit: ``modelupgrade gpu-study``.

A lent GPU machine has PyTorch and the scientific stack but none of DVC, MLflow, Prefect, FAISS or
Great Expectations, and it is lent for minutes. This runner needs none of them: it reads params.yaml
with an overlay (``params/gpu-quick.yaml``), cuts the dataset into the scenarios' splits as the
split stage does (``make_scenario_splits``; the Great Expectations validation is left to the CPU
study, which validates the same code on the same data), then runs every training seed (the
overlay's ``seed`` first, then ``replicates.seeds``) through the replicate runner
(``modelupgrade.replicates.run_replicate``), i.e. through the library calls of the train,
train_heads, fit_adapters, evaluate and simulate_backfill stages. Its output is what
``modelupgrade.report`` reads::

    <out>/params.yaml                        the merged params the results were made with
    <out>/run.json                           the run record (``GpuStudyRun``)
    <out>/seed-<seed>/metrics/<scenario>/    what a replicate keeps, per finished seed

The time limit is hard and clean: a seed starts only if the longest seed so far fits in the time
left, and an alarm at the limit stops a seed under way, whose scratch is removed. What finished is
kept and the run record says why the run stopped; it is rewritten after every seed, so a process
killed from outside still leaves the record of the seeds it finished.
"""

from __future__ import annotations

import logging
import math
import os
import platform
import shutil
import signal
import time
import traceback
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

import yaml

from modelupgrade.config import Params, parse_params
from modelupgrade.errors import UserError
from modelupgrade.io import read_json, write_json
from modelupgrade.json_data import JsonObject, json_record, number_at
from modelupgrade.layout import OLD_MODEL, StudyLayout, head_name, model_name
from modelupgrade.overrides import merge
from modelupgrade.params import check_params
from modelupgrade.replicates import replicate_dir, run_replicate

log = logging.getLogger(__name__)

GPU_QUICK_OVERLAY = Path("params/gpu-quick.yaml")
RESULTS_ROOT = Path("results/gpu-quick")
RUN_FILE = "run.json"
PARAMS_FILE = "params.yaml"
SPLITS_DIR = ".splits"
# A seed starts only if this multiple of the longest seed so far fits in the time left.
SEED_MARGIN = 1.15


class TimeLimitReached(BaseException):
    """Raised by the alarm at the time limit. A BaseException, as KeyboardInterrupt is: no
    ``except Exception`` on the way may swallow it."""


@dataclass
class TrainedModel:
    """One model of a seed as its card records it."""

    scenario: str
    model: str
    images: int
    steps: int
    train_seconds: float
    images_per_second: float


@dataclass
class TrainedHead:
    scenario: str
    head: str
    steps: int
    seconds: float


@dataclass
class SeedRun:
    seed: int
    seconds: float
    models: list[TrainedModel] = field(default_factory=list)
    heads: list[TrainedHead] = field(default_factory=list)


@dataclass
class GpuStudyRun:
    """The run record (``run.json``): where and how the study ran, and how far it got."""

    profile: str
    device: str
    versions: dict[str, str]
    started: str
    time_limit_seconds: float
    seeds_planned: list[int]
    state: str = "running"
    wall_seconds: float = 0.0
    data_seconds: float = 0.0
    seeds: list[SeedRun] = field(default_factory=list)
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def seeds_finished(self) -> list[int]:
        return [run.seed for run in self.seeds]

    def as_dict(self) -> JsonObject:
        return {**json_record(self), "seeds_finished": [*self.seeds_finished]}

    @classmethod
    def read(cls, path: Path) -> GpuStudyRun:
        raw = dict(read_json(path))
        raw.pop("seeds_finished", None)
        seeds = [
            SeedRun(
                seed=run["seed"],
                seconds=run["seconds"],
                models=[TrainedModel(**m) for m in run.get("models", [])],
                heads=[TrainedHead(**h) for h in run.get("heads", [])],
            )
            for run in raw.pop("seeds", [])
        ]
        return cls(**raw, seeds=seeds)

    @property
    def exit_code(self) -> int:
        """Non-zero where no seed finished: nothing came of the run."""
        return 0 if self.seeds else 1

    @property
    def exit_message(self) -> str:
        return f"no seed of {self.seeds_planned} finished ({self.state})"

    def describe(self) -> str:
        lines = [
            (
                f"GPU study ({self.profile}) on {self.device}: {self.state}, "
                f"{self.wall_seconds:.0f} s of {self.time_limit_seconds:.0f} s"
            ),
            f"seeds finished: {self.seeds_finished or 'none'} of {self.seeds_planned}",
        ]
        for run in self.seeds:
            rate = [m.images_per_second for m in run.models]
            lines.append(
                f"  seed {run.seed}: {run.seconds:.0f} s, {len(run.models)} models "
                f"({min(rate, default=0):.0f}-{max(rate, default=0):.0f} images/s), "
                f"{len(run.heads)} heads"
            )
        lines += [f"  seed {seed} failed: {error}" for seed, error in self.failed.items()]
        return "\n".join(lines)


def gpu_study_params(
    params_path: Path, overlays: Sequence[Path], dataset_root: Path | None = None
) -> Params:
    """params.yaml with each overlay merged over it in turn (and the dataset read from
    ``dataset_root`` where given), checked as params.yaml is."""
    merged: dict[str, Any] = {}
    for path in (params_path, *overlays):
        if not path.is_file():
            raise UserError(f"{path} does not exist", hint="run from the project root")
        layer = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        if not isinstance(layer, dict):
            raise UserError(f"{path} must hold a mapping at the top level")
        merged = merge(merged, layer)
    if dataset_root is not None:
        merged = merge(merged, {"dataset": {"root": str(dataset_root)}})
    source = overlays[-1] if overlays else params_path
    return check_params(parse_params(merged, source), source)


def study_seeds(params: Params) -> list[int]:
    """The training seeds, in the order they run: the study's own, then the replicates'."""
    return [params.seed, *params.replicates.seeds]


def write_study_splits(params: Params, splits_root: Path) -> None:
    """The split files of every scenario the replicates run, as the split stage writes them."""
    from modelupgrade.data import build_manifest, make_scenario_splits, write_splits

    manifest = build_manifest(params.dataset)
    for name in params.replicates.scenarios:
        splits = make_scenario_splits(
            manifest, params.scenario(name), params.dataset, params.evaluation_split, params.seed
        )
        splits.info["name"] = name
        write_splits(splits_root / name, splits)


def next_seed_fits(elapsed: float, limit: float, durations: list[float]) -> bool:
    """Whether another seed, as long as the longest so far (with a margin), ends within ``limit``
    seconds; the first seed starts whenever time is left."""
    return elapsed + SEED_MARGIN * max(durations, default=0.0) < limit


def trained_on(params: Params, layout: StudyLayout) -> tuple[list[TrainedModel], list[TrainedHead]]:
    """Each model's and head's training time, read from the cards in a seed's scratch tree."""
    from modelupgrade.heads.persistence import read_head_card
    from modelupgrade.models import read_model_card

    models, heads = [], []
    for scenario, setting in params.scenarios.items():
        for name in (OLD_MODEL, *(model_name(1, s) for s in setting.strategies)):
            card = read_model_card(layout.model(scenario, name))
            models.append(
                TrainedModel(
                    scenario=scenario,
                    model=name,
                    images=int(number_at(card.data, "images", 0)),
                    steps=int(card.fit["steps"]) if card.fit else len(card.history),
                    train_seconds=card.train_seconds or math.nan,
                    images_per_second=card.train_images_per_second or math.nan,
                )
            )
        for head, strategy in setting.heads.items():
            training = read_head_card(layout.head(scenario, head_name(head, strategy))).training
            heads.append(
                TrainedHead(
                    scenario=scenario,
                    head=head_name(head, strategy),
                    steps=int(number_at(training, "steps", 0)),
                    seconds=float(number_at(training, "seconds", math.nan)),
                )
            )
    return models, heads


@contextmanager
def alarm_at(deadline: float) -> Iterator[None]:
    """Raise ``TimeLimitReached`` in this (the main) thread at ``deadline`` (``time.monotonic``)."""

    def stop(signum: int, frame: FrameType | None) -> None:
        raise TimeLimitReached

    previous = signal.signal(signal.SIGALRM, stop)
    signal.setitimer(signal.ITIMER_REAL, max(deadline - time.monotonic(), 1e-3))
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def describe_machine(preference: str) -> tuple[str, dict[str, str]]:
    """The device the study trains on and the versions it ran with."""
    import torch

    from modelupgrade.runtime import describe_device, select_device

    versions = {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cuda": str(torch.version.cuda),
        "cudnn": str(torch.backends.cudnn.version()) if torch.backends.cudnn.is_available() else "",
        "cpu_cores": str(os.cpu_count()),
    }
    return describe_device(select_device(preference)), versions


def clear_results(out: Path) -> None:
    """Remove a previous run's results from ``out`` (other files there, a README, stay)."""
    for stale in [*out.glob("seed-*"), *out.glob(".seed-*"), out / SPLITS_DIR]:
        shutil.rmtree(stale, ignore_errors=True)
    for name in (RUN_FILE, PARAMS_FILE):
        (out / name).unlink(missing_ok=True)


def run_gpu_study(
    params: Params, out: Path, time_limit: float, profile: str = str(GPU_QUICK_OVERLAY)
) -> GpuStudyRun:
    """Every seed of the study that fits in ``time_limit`` seconds, results under ``out``."""
    started = time.monotonic()
    deadline = started + time_limit
    device, versions = describe_machine(params.device)
    seeds = study_seeds(params)
    record = GpuStudyRun(
        profile=profile,
        device=device,
        versions=versions,
        started=datetime.now(UTC).isoformat(timespec="seconds"),
        time_limit_seconds=time_limit,
        seeds_planned=seeds,
    )
    out.mkdir(parents=True, exist_ok=True)
    clear_results(out)
    (out / PARAMS_FILE).write_text(
        yaml.safe_dump(params.model_dump(mode="json"), sort_keys=False), encoding="utf-8"
    )
    splits_root = out / SPLITS_DIR

    def save(state: str) -> None:
        record.state = state
        record.wall_seconds = round(time.monotonic() - started, 1)
        write_json(out / RUN_FILE, record.as_dict())

    log.info("GPU study on %s: seeds %s within %.0f s", device, seeds, time_limit)
    try:
        with alarm_at(deadline):
            write_study_splits(params, splits_root)
            record.data_seconds = round(time.monotonic() - started, 1)
            save("running")
            for seed in seeds:
                durations = [run.seconds for run in record.seeds]
                if not next_seed_fits(time.monotonic() - started, time_limit, durations):
                    save(f"stopped before seed {seed}: it would not end within the time limit")
                    break
                record.seeds += _run_seed(params, seed, out, splits_root, record)
                save("running")
            else:
                failed = len(record.failed)
                save(
                    f"finished, {failed} seed{'s' * (failed > 1)} failed" if failed else "finished"
                )
    except TimeLimitReached:
        save(f"stopped at the time limit ({time_limit:.0f} s) during seed {_current(record)}")
    finally:
        for scratch in [*out.glob(".seed-*"), splits_root]:
            shutil.rmtree(scratch, ignore_errors=True)
    log.info("GPU study: %s", record.describe())
    return record


def _current(record: GpuStudyRun) -> int | str:
    done = set(record.seeds_finished) | {int(seed) for seed in record.failed}
    pending = [seed for seed in record.seeds_planned if seed not in done]
    return pending[0] if pending else "none"


def _run_seed(
    params: Params, seed: int, out: Path, splits_root: Path, record: GpuStudyRun
) -> list[SeedRun]:
    """One seed through the replicate runner: its record, or none where it failed (the error is
    recorded and the next seed runs)."""
    began = time.monotonic()
    trained: list[tuple[list[TrainedModel], list[TrainedHead]]] = []
    log.info("GPU study: seed %d", seed)
    try:
        run_replicate(
            params,
            seed,
            out,
            splits_root,
            on_finished=lambda seeded, layout: trained.append(trained_on(seeded, layout)),
        )
    except Exception as err:  # noqa: BLE001 - one seed's failure must not lose the others
        log.error("seed %d failed:\n%s", seed, traceback.format_exc())
        record.failed[str(seed)] = f"{type(err).__name__}: {err}"
        shutil.rmtree(replicate_dir(out, seed), ignore_errors=True)
        return []
    models, heads = trained[0]
    return [SeedRun(seed, round(time.monotonic() - began, 1), models, heads)]


def read_run(root: Path) -> tuple[GpuStudyRun, Params] | None:
    """A GPU run's record and the params it ran with, None where ``root`` holds none."""
    if not (root / RUN_FILE).is_file():
        return None
    raw: Mapping[str, Any] = yaml.safe_load((root / PARAMS_FILE).read_text(encoding="utf-8"))
    return GpuStudyRun.read(root / RUN_FILE), parse_params(dict(raw), root / PARAMS_FILE)
