"""Where the study keeps its files: one object names every directory and file name.

``dvc repro``, the ``modelupgrade`` commands and the Prefect flows read and write the same layout,
so each can pick up what another left. The flows use it under their work directory
(``StudyLayout(root=work_dir)``); the pipeline uses the project root::

    data/manifests/<dataset>.parquet        the dataset's manifest
    data/splits/<scenario>/<split>.parquet  old_train, new_train, query, gallery; gen<i>
    data/validation/                        Great Expectations reports
    models/<scenario>/<model>/              gen0, gen1-<strategy>; sequential: <strategy>/gen<i>
    embeddings/<scenario>/<model>/          <split>.npy of the same models, <split>_logits.npy
    heads/<scenario>/<head>-<strategy>/     a head between gen0 and gen1-<strategy>
    embeddings/<scenario>/<head>-<strategy>/ that head's outputs on the evaluation splits
    heads/<scenario>/adapters-<strategy>/<adapter>.<size>-<strategy>/
                                            a training-free adapter fitted on <size> pairs
    embeddings/<scenario>/adapters-<strategy>/<adapter>.<size>-<strategy>/  its outputs
    metrics/<scenario>/[<strategy>/]        evaluation and backfill tables
    plots/<scenario>/[<strategy>/]          their figures
    registry/<scenario>.json                what the register stage did
    reports/study/                          the report
    stores/demo/                            the demo gallery store

An upgrade chain (``modelupgrade.chain``, what the Prefect flows run) keeps the same trees under its
work directory, with gen0 shared by its chains (``models/sequential/gen0``), and a few files of its
own::

    data/proposed/sequential/               new split files while they are validated
    data/proposed/validation/               their validation reports
    registry/gen<i>.json                    what the cycle that trained gen<i> registered
    reports/                                one report per cycle, the lineage, the backfill
    store/                                  the gallery store kept on the chain's champion

Each tree of the study (splits, models, embeddings, heads, metrics, plots) may live elsewhere than
under ``root``, e.g. ``modelupgrade evaluate --metrics-root``: ``StudyLayout(metrics_root=...)``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

SEQUENTIAL = "sequential"
# A chain's refreshed gallery beside its model: embeddings/sequential/<strategy>/gen<i>-psi.
REFRESH_SUFFIX = "-psi"
OLD_MODEL = "gen0"
QUERY_SPLIT = "query"
GALLERY_SPLIT = "gallery"
EVALUATION_SPLITS = (QUERY_SPLIT, GALLERY_SPLIT)
OLD_TRAIN_SPLIT = "old_train"
NEW_TRAIN_SPLIT = "new_train"

# File names inside the directories above.
LOGITS_SUFFIX = "_logits"
CROSS_MODEL = "cross_model"  # .parquet, .csv, .json
SUMMARY = "summary"  # .json, .csv
BACKFILL_CURVES = "backfill_curves"  # .parquet, .csv (metrics); .png (plots)
BACKFILL_SUMMARY_FILE = "backfill_summary.json"
# Per query: each evaluated pair's AP, each backfill curve's areas (the claims' query bootstrap).
PER_QUERY_AP_FILE = "per_query_ap.parquet"
BACKFILL_PER_QUERY_FILE = "backfill_per_query.parquet"
BACKFILL_PLOTS_DIR = "backfill_plots"
HEATMAP_FILE = "cross_model_heatmap.png"
# A head's outputs beside its transformed query.npy / gallery.npy: FastFill's σ² per gallery item,
# and Seo et al.'s learnt new embedding ρ of the queries and of the gallery.
SIGMA2_FILE = "gallery_sigma2.npy"
RHO_QUERY_FILE = "rho_query.npy"
RHO_GALLERY_FILE = "rho_gallery.npy"


def embedding_file_name(split: str) -> str:
    """The file of a split's embeddings (or a head's outputs) in its directory: ``gallery.npy``."""
    return f"{split}.npy"


def model_name(generation: int, strategy: str | None = None) -> str:
    """A two-model scenario's name of a generation: ``gen0``, ``gen1-bct``."""
    return f"gen{generation}" if strategy is None else f"gen{generation}-{strategy}"


def new_model_name(strategy: str) -> str:
    """A two-model scenario's new model trained with ``strategy``: ``gen1-<strategy>``."""
    return model_name(1, strategy)


def head_name(head: str, strategy: str) -> str:
    """The directory name of a head paired with a strategy's new model: ``fct-independent``."""
    return f"{head}-{strategy}"


def adapter_group_name(strategy: str) -> str:
    """The directory that holds every training-free adapter fitted between gen0 and a strategy's
    new model (``adapters-independent``), under the heads and the embeddings of a scenario."""
    return head_name("adapters", strategy)


def adapter_name(adapter: str, sample_size: int | str) -> str:
    """A fitted adapter's head name: the entry of ``adapters.heads`` and its sample size,
    ``procrustes_query.n1000`` or ``procrustes_query.all``."""
    return f"{adapter}.{sample_size if sample_size == 'all' else f'n{sample_size}'}"


def snapshot_split(generation: int) -> str:
    """The sequential scenario's training snapshot of a generation: ``gen2``."""
    return f"gen{generation}"


def chain_model_name(strategy: str, generation: int) -> str:
    """A sequential chain's own model of a generation: ``bct/gen2`` (``bct/gen0`` unshared)."""
    return f"{strategy}/{snapshot_split(generation)}"


def chain_refresh_name(strategy: str, generation: int) -> str:
    """A sequential chain's gallery as its forward head refreshed it at a generation, F_i =
    ψ_i(… ψ_1(φ_0(g))): ``bict_sequential/gen2-psi`` (its head: the same name without -psi)."""
    return f"{chain_model_name(strategy, generation)}{REFRESH_SUFFIX}"


def chain_generation(name: str, strategy: str) -> int | None:
    """The generation a sequential model name (``gen0``, ``bct/gen2``) holds in ``strategy``'s
    chain, None for a name outside that chain (the inverse of ``sequential_model_name``)."""
    if name == OLD_MODEL:
        return 0
    prefix = f"{strategy}/gen"
    number = name[len(prefix) :]
    return int(number) if name.startswith(prefix) and number.isdigit() else None


def training_split(generation: int) -> str:
    """The split a two-model scenario's generation trains on: old_train for gen0, else new_train."""
    return OLD_TRAIN_SPLIT if generation == 0 else NEW_TRAIN_SPLIT


@dataclass(frozen=True, init=False)
class StudyLayout:
    """The study's paths under ``root``; a tree given explicitly replaces its default place."""

    root: Path
    splits_root: Path
    models_root: Path
    embeddings_root: Path
    heads_root: Path
    metrics_root: Path
    plots_root: Path

    def __init__(
        self,
        root: str | Path = ".",
        *,
        splits_root: str | Path | None = None,
        models_root: str | Path | None = None,
        embeddings_root: str | Path | None = None,
        heads_root: str | Path | None = None,
        metrics_root: str | Path | None = None,
        plots_root: str | Path | None = None,
    ) -> None:
        base = Path(root)
        trees = {
            "splits_root": (splits_root, base / "data" / "splits"),
            "models_root": (models_root, base / "models"),
            "embeddings_root": (embeddings_root, base / "embeddings"),
            "heads_root": (heads_root, base / "heads"),
            "metrics_root": (metrics_root, base / "metrics"),
            "plots_root": (plots_root, base / "plots"),
        }
        object.__setattr__(self, "root", base)
        for name, (given, default) in trees.items():
            object.__setattr__(self, name, default if given is None else Path(given))

    # ----- data -----------------------------------------------------------------------------
    def manifest(self, dataset: str) -> Path:
        return self.root / "data" / "manifests" / f"{dataset}.parquet"

    def splits(self, scenario: str) -> Path:
        return self.splits_root / scenario

    def split_file(self, scenario: str, split: str) -> Path:
        return self.splits(scenario) / f"{split}.parquet"

    @property
    def validation(self) -> Path:
        return self.root / "data" / "validation"

    @property
    def proposals(self) -> Path:
        """Split files and their reports that wait for validation before they are used."""
        return self.root / "data" / "proposed"

    def proposed_splits(self, scenario: str) -> Path:
        return self.proposals / scenario

    @property
    def proposed_validation(self) -> Path:
        return self.proposals / "validation"

    # ----- models and embeddings ------------------------------------------------------------
    def model(self, scenario: str, name: str) -> Path:
        return self.models_root / scenario / name

    def sequential_model_name(self, strategy: str, generation: int) -> str:
        """``gen0`` (shared by every chain) or ``<strategy>/gen<i>``."""
        return OLD_MODEL if generation == 0 else chain_model_name(strategy, generation)

    def embeddings(self, scenario: str, name: str) -> Path:
        return self.embeddings_root / scenario / name

    def embedding_file(self, scenario: str, name: str, split: str) -> Path:
        return self.embeddings(scenario, name) / embedding_file_name(split)

    def logits_file(self, scenario: str, name: str, split: str) -> Path:
        return logits_beside(self.embedding_file(scenario, name, split))

    # ----- heads ------------------------------------------------------------------------------
    def heads(self, scenario: str) -> Path:
        return self.heads_root / scenario

    def head(self, scenario: str, name: str) -> Path:
        return self.heads(scenario) / name

    def head_outputs(self, scenario: str, name: str) -> Path:
        return self.embeddings(scenario, name)

    # ----- results ----------------------------------------------------------------------------
    def metrics(self, scenario: str, strategy: str | None = None) -> Path:
        base = self.metrics_root / scenario
        return base if strategy is None else base / strategy

    def plots(self, scenario: str, strategy: str | None = None) -> Path:
        base = self.plots_root / scenario
        return base if strategy is None else base / strategy

    def heatmap(self, scenario: str, strategy: str | None = None) -> Path:
        return self.plots(scenario, strategy) / HEATMAP_FILE

    def registration(self, scenario: str) -> Path:
        return self.root / "registry" / f"{scenario}.json"

    def cycle_registration(self, generation: int) -> Path:
        """What the upgrade cycle that trained ``generation`` registered."""
        return self.root / "registry" / f"{snapshot_split(generation)}.json"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    @property
    def report(self) -> Path:
        return self.reports / "study"

    @property
    def demo_store(self) -> Path:
        return self.root / "stores" / "demo"

    @property
    def champion_store(self) -> Path:
        """The gallery store an upgrade chain keeps on its champion."""
        return self.root / "store"


def logits_beside(embeddings: Path) -> Path:
    """The classifier logits beside an embedding file: ``gallery.npy`` → ``gallery_logits.npy``."""
    return embeddings.with_name(f"{embeddings.stem}{LOGITS_SUFFIX}.npy")
