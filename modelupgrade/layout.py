"""Where the study keeps its files: one object names every directory and file name.

``dvc repro``, the ``modelupgrade`` commands and the Prefect flows read and write the same layout,
so each can pick up what another left. The flows use it under their work directory
(``StudyLayout(root=work_dir)``); the pipeline uses the project root::

    data/manifests/<dataset>.parquet          the dataset's manifest
    data/splits/<scenario>/<split>.parquet    old_train, new_train, query, gallery (gen<i> for sequential)
    data/validation/                          Great Expectations reports
    models/<scenario>/<model>/                gen0, gen1-<strategy>; sequential: gen0, <strategy>/gen<i>
    embeddings/<scenario>/<model>/<split>.npy the same model names; <split>_logits.npy beside them
    heads/<scenario>/<head>-<strategy>/       a head between gen0 and gen1-<strategy>
    embeddings/<scenario>/<head>-<strategy>/  that head's outputs on the evaluation splits
    metrics/<scenario>/[<strategy>/]          evaluation and backfill tables (per strategy: sequential)
    plots/<scenario>/[<strategy>/]            their figures
    registry/<scenario>.json                  what the register stage did
    reports/study/                            the report
    stores/demo/                              the demo gallery store
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SEQUENTIAL = "sequential"
OLD_MODEL = "gen0"
EVALUATION_SPLITS = ("query", "gallery")
OLD_TRAIN_SPLIT = "old_train"
NEW_TRAIN_SPLIT = "new_train"

# File names inside the directories above.
LOGITS_SUFFIX = "_logits"
CROSS_MODEL = "cross_model"              # .parquet, .csv, .json
SUMMARY = "summary"                      # .json, .csv
BACKFILL_CURVES = "backfill_curves"      # .parquet, .csv (metrics); .png (plots)
BACKFILL_SUMMARY_FILE = "backfill_summary.json"
BACKFILL_PLOTS_DIR = "backfill_plots"
HEATMAP_FILE = "cross_model_heatmap.png"


def model_name(generation: int, strategy: str | None = None) -> str:
    """A two-model scenario's name of a generation: ``gen0``, ``gen1-bct``."""
    return f"gen{generation}" if strategy is None else f"gen{generation}-{strategy}"


def head_name(head: str, strategy: str) -> str:
    """The directory name of a head paired with a strategy's new model: ``fct-independent``."""
    return f"{head}-{strategy}"


def snapshot_split(generation: int) -> str:
    """The sequential scenario's training snapshot of a generation: ``gen2``."""
    return f"gen{generation}"


@dataclass(frozen=True)
class StudyLayout:
    root: Path = Path(".")

    def __post_init__(self) -> None:
        object.__setattr__(self, "root", Path(self.root))

    # ----- data -----------------------------------------------------------------------------
    def manifest(self, dataset: str) -> Path:
        return self.root / "data" / "manifests" / f"{dataset}.parquet"

    @property
    def splits_root(self) -> Path:
        return self.root / "data" / "splits"

    def splits(self, scenario: str) -> Path:
        return self.splits_root / scenario

    def split_file(self, scenario: str, split: str) -> Path:
        return self.splits(scenario) / f"{split}.parquet"

    @property
    def validation(self) -> Path:
        return self.root / "data" / "validation"

    # ----- models and embeddings ------------------------------------------------------------
    @property
    def models_root(self) -> Path:
        return self.root / "models"

    def model(self, scenario: str, name: str) -> Path:
        return self.models_root / scenario / name

    def sequential_model_name(self, strategy: str, generation: int) -> str:
        """``gen0`` (shared by every chain) or ``<strategy>/gen<i>``."""
        return OLD_MODEL if generation == 0 else f"{strategy}/{snapshot_split(generation)}"

    @property
    def embeddings_root(self) -> Path:
        return self.root / "embeddings"

    def embeddings(self, scenario: str, name: str) -> Path:
        return self.embeddings_root / scenario / name

    def embedding_file(self, scenario: str, name: str, split: str) -> Path:
        return self.embeddings(scenario, name) / f"{split}.npy"

    def logits_file(self, scenario: str, name: str, split: str) -> Path:
        return self.embeddings(scenario, name) / f"{split}{LOGITS_SUFFIX}.npy"

    # ----- heads ------------------------------------------------------------------------------
    @property
    def heads_root(self) -> Path:
        return self.root / "heads"

    def head(self, scenario: str, name: str) -> Path:
        return self.heads_root / scenario / name

    def head_outputs(self, scenario: str, name: str) -> Path:
        return self.embeddings(scenario, name)

    # ----- results ----------------------------------------------------------------------------
    @property
    def metrics_root(self) -> Path:
        return self.root / "metrics"

    def metrics(self, scenario: str, strategy: str | None = None) -> Path:
        base = self.metrics_root / scenario
        return base if strategy is None else base / strategy

    @property
    def plots_root(self) -> Path:
        return self.root / "plots"

    def plots(self, scenario: str, strategy: str | None = None) -> Path:
        base = self.plots_root / scenario
        return base if strategy is None else base / strategy

    def registration(self, scenario: str) -> Path:
        return self.root / "registry" / f"{scenario}.json"

    @property
    def report(self) -> Path:
        return self.root / "reports" / "study"

    @property
    def demo_store(self) -> Path:
        return self.root / "stores" / "demo"
