"""An upgrade chain: one retrieval system's embedding model, upgraded one generation at a time.

The Prefect flows (``flows/``) run a chain one step at a time, each step a method here that runs a
command of ``modelupgrade.commands`` (what ``dvc repro`` runs) on the chain's files: propose,
validate and commit data snapshots; train a generation, the oracle beside it and the heads between
it and the generation before; evaluate the chain's compatibility matrix; register the new
generation gated against the champion; write the cycle's reports; keep the gallery store on the
champion.

The chain is set by params.yaml's ``flows`` section: its strategy (``flows.strategy``; a chain
keeps it), the heads trained in each cycle (``flows.heads``), its registered model
(``<flows.model_name>-sequential``, apart from the study's models) and its work directory
(``flows.work_dir``). The oracle strategy (``evaluation.oracle_strategy``) trains a chain of its
own beside it, whose generations give each generation's Δ↓.

The work directory has the study's layout (``StudyLayout(root=work_dir)``), so every command finds
its inputs under the names it expects. Generation numbers are the registry's: the chain is
``gen0 → <strategy>/gen1 → <strategy>/gen2 …``, gen0 shared with the oracle chain.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from modelupgrade.cards import CARD_FILE, verified_weights
from modelupgrade.commands.data import Manifest, SplitFiles, Validation, prepare, split, validate
from modelupgrade.commands.evaluation import Evaluation, evaluate
from modelupgrade.commands.heads import TrainedHead, train_heads
from modelupgrade.commands.registry import Registration, register
from modelupgrade.commands.results import WrittenFiles
from modelupgrade.commands.training import TrainedModel, embed, train
from modelupgrade.config import Params
from modelupgrade.data import read_manifest, read_splits, with_supplied_snapshot, write_splits
from modelupgrade.data.split_files import INFO_FILE
from modelupgrade.errors import UserError
from modelupgrade.io import atomic_path
from modelupgrade.json_data import JsonObject
from modelupgrade.layout import (
    EVALUATION_SPLITS,
    GALLERY_SPLIT,
    SEQUENTIAL,
    StudyLayout,
    chain_model_name,
    snapshot_split,
)
from modelupgrade.models import read_model_card
from modelupgrade.params import load_params
from modelupgrade.registry.chain import ChainChampion, ChainState, read_chain
from modelupgrade.registry.study import RegistrationSummary
from modelupgrade.registry.tracker import Tracker
from modelupgrade.registry.versions import ModelRegistry, registered_model_name
from modelupgrade.report.upgrade import (
    Chain,
    WrittenReport,
    write_backfill_report,
    write_lineage_report,
    write_skipped_upgrade_report,
    write_upgrade_report,
)
from modelupgrade.store.follow import FollowedModel, Progress, follow_model
from modelupgrade.training.generation import DEFAULT_ARCHITECTURE

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class UpgradeChain:
    """One chain as params.yaml sets it: its strategy, oracle, heads, registered model and files."""

    params_path: Path
    params: Params
    layout: StudyLayout  # of the work directory
    strategy: str
    # The strategy whose chain gives Δ↓ (evaluation.oracle_strategy), None when not trainable here.
    oracle: str | None
    heads: tuple[str, ...]
    registered_model: str

    @property
    def reference(self) -> tuple[str, str]:
        """The params file and the work directory, as text: what a task, or a flow run on another
        machine, loads this chain again from (``load_chain``)."""
        return str(self.params_path), str(self.layout.root)

    @property
    def evaluated_strategies(self) -> list[str]:
        return [self.strategy] + ([self.oracle] if self.oracle else [])

    # ----- files -------------------------------------------------------------------------------
    def model_dir(self, generation: int, strategy: str | None = None) -> Path:
        """The model of ``generation`` in ``strategy``'s chain (default: this chain's)."""
        name = self.layout.sequential_model_name(strategy or self.strategy, generation)
        return self.layout.model(SEQUENTIAL, name)

    def embeddings_dir(self, generation: int, strategy: str | None = None) -> Path:
        name = self.layout.sequential_model_name(strategy or self.strategy, generation)
        return self.layout.embeddings(SEQUENTIAL, name)

    def snapshot(self, generation: int) -> Path:
        """The training data of ``generation``."""
        return self.layout.split_file(SEQUENTIAL, snapshot_split(generation))

    def snapshot_embeddings(self, model_generation: int, snapshot_generation: int) -> Path:
        """A chain model's embeddings of a training snapshot (what a head trains on)."""
        name = self.layout.sequential_model_name(self.strategy, model_generation)
        return self.layout.embedding_file(SEQUENTIAL, name, snapshot_split(snapshot_generation))

    def head_dir(self, generation: int, head: str) -> Path:
        """Head ``head`` between the chain's generations ``generation - 1`` and ``generation``."""
        return self.layout.head(SEQUENTIAL, f"{chain_model_name(self.strategy, generation)}/{head}")

    def has_splits(self) -> bool:
        """Whether validated split files are in place (the first cycle proposes them)."""

        return (self.layout.splits(SEQUENTIAL) / INFO_FILE).is_file()

    def has_snapshot(self, generation: int) -> bool:
        return self.snapshot(generation).is_file()

    def check_length(self, generations: int) -> None:
        """Refuse a chain longer than ``sequential.fractions`` plans, or empty."""
        planned = len(self.params.sequential.fractions)
        if not 1 <= generations <= planned:
            raise UserError(
                f"--generations must lie in 1..{planned}: sequential.fractions plans {planned} "
                "growing snapshots",
                hint="list one fraction per generation under sequential.fractions in params.yaml",
            )

    # ----- registry ----------------------------------------------------------------------------
    def registry(self) -> ModelRegistry:

        return ModelRegistry(Tracker.from_params(self.params), self.registered_model)

    def state(self) -> ChainState:
        """The registered generations, the champion and the next generation (checked against the
        models in the work directory)."""
        return read_chain(self.registry(), self.strategy, self.layout)

    # ----- data --------------------------------------------------------------------------------
    def prepare(self) -> Manifest:

        return prepare(self.params, self.layout.manifest(self.params.dataset.name))

    def propose_splits(self) -> SplitFiles:
        """The planned growing snapshots and the evaluation splits, proposed until validated."""

        return split(
            self.params,
            self.layout.manifest(self.params.dataset.name),
            self.layout.proposed_splits(SEQUENTIAL),
            sequential=True,
        )

    def propose_snapshot(self, generation: int, snapshot: str, extend_proposal: bool) -> Path:
        """Propose the split files with the manifest rows ``snapshot`` as ``generation``'s training
        data (``modelupgrade.data.with_supplied_snapshot``), built on the split files in place or,
        with ``extend_proposal``, on those this cycle proposed already."""
        # Read through the package: the manifest reader is one, wherever it is called from.

        proposed = self.layout.proposed_splits(SEQUENTIAL)
        rows = read_manifest(snapshot)
        base = read_splits(proposed if extend_proposal else self.layout.splits(SEQUENTIAL))
        source = str(Path(snapshot).resolve())
        write_splits(proposed, with_supplied_snapshot(base, generation, rows, source))
        return proposed

    def validate_proposal(self) -> Validation:
        """Great Expectations over the manifest and the proposed split files;
        raises on a failure."""

        return validate(
            self.params,
            self.layout.manifest(self.params.dataset.name),
            [self.layout.proposed_splits(SEQUENTIAL)],
            out_dir=self.layout.proposed_validation,
        )

    def commit_proposal(self) -> Path:
        """Put the validated split files (and their reports) where training reads them."""

        pairs = (
            (self.layout.proposed_splits(SEQUENTIAL), self.layout.splits(SEQUENTIAL)),
            (self.layout.proposed_validation, self.layout.validation),
        )
        for proposed, final in pairs:
            with atomic_path(final) as tmp:
                shutil.copytree(proposed, tmp)
        shutil.rmtree(self.layout.proposals)
        return self.layout.splits(SEQUENTIAL)

    # ----- training ----------------------------------------------------------------------------
    def train(self, generation: int, strategy: str) -> TrainedModel:
        """Train ``strategy``'s model of ``generation`` on its snapshot against the chain's
        previous generation, then embed the evaluation splits with it."""

        return train(
            self.params,
            generation=generation,
            strategy=strategy if generation > 0 else None,
            old=self.model_dir(generation - 1) if generation > 0 else None,
            split=self.snapshot(generation),
            architecture=DEFAULT_ARCHITECTURE,
            out=self.model_dir(generation, strategy),
            progress=False,
            embed_split=[self.layout.split_file(SEQUENTIAL, s) for s in EVALUATION_SPLITS],
            embed_dir=self.embeddings_dir(generation, strategy),
        )

    def take_model(self, generation: int, new_model: str | Path) -> Path:
        """Take ``new_model`` (a model directory: adopted with ``modelupgrade adopt``, or trained
        elsewhere) as ``generation`` instead of training it, then embed the evaluation splits with
        it; the heads, evaluation, registration and store take it as they take a trained one.

        Checked first (``check_new_model``): a readable model card whose files are the ones it
        hashed; for a generation after gen0, a model that runs on images and whose embeddings have
        the previous generation's dimension, or, failing that, heads to map between the two."""

        source = Path(new_model).resolve()
        previous = self.model_dir(generation - 1) if generation > 0 else None
        files = check_new_model(source, previous, self.heads)
        target = self.model_dir(generation)
        # Written whole or not at all, as a trained generation is: the card and the files it
        # hashes (not whatever else lies in the source directory).
        with atomic_path(target) as tmp:
            tmp.mkdir(parents=True)
            for name in files:
                shutil.copyfile(source / name, tmp / name)
        embed(
            self.params,
            target,
            split=[self.layout.split_file(SEQUENTIAL, s) for s in EVALUATION_SPLITS],
            out_dir=self.embeddings_dir(generation),
        )
        return target

    def embed_snapshot(self, model_generation: int, snapshot_generation: int) -> WrittenFiles:

        return embed(
            self.params,
            self.model_dir(model_generation),
            split=[self.snapshot(snapshot_generation)],
            out=self.snapshot_embeddings(model_generation, snapshot_generation),
        )

    def train_head(self, generation: int, head: str) -> TrainedHead:
        """Head ``head`` between generations ``generation - 1`` and ``generation``, trained on the
        new snapshot's embeddings by both."""

        return train_heads(
            self.params,
            head,
            old_embeddings=self.snapshot_embeddings(generation - 1, generation),
            new_embeddings=self.snapshot_embeddings(generation, generation),
            labels=self.snapshot(generation),
            out=self.head_dir(generation, head),
            new_model=self.model_dir(generation),
            old_model=self.model_dir(generation - 1),
        )

    # ----- evaluation and registration ---------------------------------------------------------
    def evaluate(self, generations: int) -> Evaluation:
        """The compatibility matrix of the chain's first ``generations`` models, and of the oracle
        chain beside it: each generation's Δ↓."""

        return evaluate(
            self.params,
            SEQUENTIAL,
            root=self.layout.root,
            strategies=self.evaluated_strategies,
            generations=generations,
            heads=self.trained_heads(generations),
        )

    def trained_heads(self, generations: int) -> list[str]:
        """The heads this chain trained between its first ``generations`` models, as the
        evaluation names them (``<strategy>/gen<i>/<head>``): the paths between generations of
        different dimensions."""
        heads_root = self.layout.heads(SEQUENTIAL)
        return [
            self.head_dir(generation, head).relative_to(heads_root).as_posix()
            for generation in range(1, generations)
            for head in self.heads
            if self.head_dir(generation, head).is_dir()
        ]

    def register(self, generations: int) -> Registration:
        """Register the chain's first ``generations`` models, the newest gated against the
        champion on the evaluation's numbers."""

        layout = self.layout
        return register(
            self.params,
            SEQUENTIAL,
            layout.cycle_registration(generations - 1),
            root=layout.root,
            strategies=[self.strategy],
            generations=generations,
            model=self.registered_model,
        )

    # ----- reports -----------------------------------------------------------------------------
    def report_chain(self) -> Chain:
        """The chain as its reports see it: its registered model and its files."""

        return Chain(
            registry=self.registry(),
            strategy=self.strategy,
            metric=self.params.evaluation.headline_metric,
            metrics_dir=self.layout.metrics(SEQUENTIAL, self.strategy),
            heatmap=self.layout.heatmap(SEQUENTIAL, self.strategy),
            reports_dir=self.layout.reports,
        )

    def upgrade_report(self, generation: int, registration: Mapping[str, Any]) -> WrittenReport:
        """The report of the cycle that registered ``generation`` (``registration``: what
        ``register`` returned, as the flows pass it between tasks: ``as_dict()``)."""

        return write_upgrade_report(
            self.report_chain(),
            generation,
            self.layout.sequential_model_name(self.strategy, generation),
            RegistrationSummary.from_dict(registration),
            snapshot=self.snapshot(generation),
            registration_file=self.layout.cycle_registration(generation),
        )

    def skipped_upgrade_report(self, generation: int) -> WrittenReport:
        """The report of a cycle that found no data snapshot for ``generation``."""

        return write_skipped_upgrade_report(
            generation,
            self.layout.splits(SEQUENTIAL),
            len(self.params.sequential.fractions),
            self.layout.reports,
        )

    def lineage_report(self) -> WrittenReport:

        return write_lineage_report(self.report_chain())

    def backfill_report(self, outcome: JsonObject) -> WrittenReport:
        """The report of ``follow_champion``'s ``outcome`` (its ``as_dict()``)."""

        return write_backfill_report(outcome, self.layout.reports)

    # ----- the gallery store -------------------------------------------------------------------
    def follow_champion(
        self, store: str | Path | None = None, progress: Progress | None = None
    ) -> ChampionStore:
        """Keep the gallery store (default: the work directory's) on the champion: create it with
        the champion's gallery embeddings, or backfill it with the champion's model
        (``modelupgrade.store.follow``)."""

        store = Path(store) if store else self.layout.champion_store
        champion = self.state().champion
        if champion is None:
            return ChampionStore(store, None, None)
        name = self.layout.sequential_model_name(self.strategy, champion.generation)
        followed = follow_model(
            self.params,
            store,
            self.layout.model(SEQUENTIAL, name),
            items=self.layout.split_file(SEQUENTIAL, GALLERY_SPLIT),
            vectors=self.layout.embedding_file(SEQUENTIAL, name, GALLERY_SPLIT),
            progress=progress,
        )
        return ChampionStore(store, champion, followed)


@dataclass
class ChampionStore:
    """What keeping the store on the champion did; nothing when there is no champion yet."""

    store: Path
    champion: ChainChampion | None
    followed: FollowedModel | None

    def as_dict(self) -> JsonObject:
        if self.champion is None or self.followed is None:
            return {
                "store": str(self.store),
                "champion_version": None,
                "champion_key": None,
                "outcome": "no champion yet: nothing to serve",
            }
        return {
            "store": str(self.store),
            "champion_version": self.champion.version,
            "champion_key": self.champion.model_key,
            **self.followed.as_dict(),
        }


def check_new_model(model_dir: Path, previous: Path | None, heads: Sequence[str] = ()) -> list[str]:
    """The files of the model directory ``model_dir`` (its card first), after checking that it can
    become the chain's generation after ``previous`` (None: it becomes gen0): its card is a model
    card and every file it hashes is there unchanged; a later generation must embed images (new
    queries, the backfill) and have ``previous``'s embedding dimension, unless ``heads`` (the
    chain's heads, trained between the two) map between the spaces."""

    if not model_dir.is_dir():
        raise UserError(
            f"new model {model_dir} is not a directory",
            hint="give the directory `modelupgrade adopt --out DIR` (or train) wrote",
        )
    card = read_model_card(model_dir)
    for name in card.weights_sha256:
        verified_weights(model_dir, card, name)
    if previous is None:
        return [CARD_FILE, *sorted(card.weights_sha256)]
    if card.adopted is not None and not card.adopted.runs_on_images:
        raise UserError(
            f"new model {model_dir} is embeddings-only: a new generation must embed new queries "
            "and backfill the gallery",
            hint="adopt the new model from its weights or TorchScript file; an embeddings-only "
            "model can only be the chain's gen0",
        )
    old_dim = read_model_card(previous).embedding_dim
    if card.embedding_dim != old_dim and not heads:
        raise UserError(
            f"new model {model_dir} gives {card.embedding_dim}-dimensional embeddings and the "
            f"chain's previous generation ({previous}) {old_dim}-dimensional ones: its queries "
            "cannot search the stored gallery, and flows.heads names no head to map between them",
            hint=f"adopt a model with {old_dim}-dimensional embeddings, or list a head (e.g. a "
            "training-free adapter) under flows.heads",
        )
    if card.embedding_dim != old_dim:
        log.warning(
            "new model %s (%d-d) reaches the %d-d gallery of %s only through the heads %s",
            model_dir,
            card.embedding_dim,
            old_dim,
            previous,
            ", ".join(heads),
        )
    return [CARD_FILE, *sorted(card.weights_sha256)]


def load_chain(params_path: str | Path, work_dir: str | Path | None = None) -> UpgradeChain:
    """The chain params.yaml sets, in ``work_dir`` (default: ``flows.work_dir``), after checking
    the ``flows`` section's references to the other sections."""
    params_path = Path(params_path).resolve()
    params = load_params(params_path)
    flows = params.flows
    if flows.strategy not in params.strategies:
        raise UserError(
            f"flows.strategy is {flows.strategy!r}, which is not defined under 'strategies'",
            hint=f"defined: {', '.join(params.strategies)}",
        )
    unknown = [h for h in flows.heads if h not in params.heads]
    if unknown:
        raise UserError(
            f"flows.heads names {unknown}, not defined under 'heads'",
            hint=f"defined: {', '.join(params.heads) or 'none'}",
        )
    oracle: str | None = params.evaluation.oracle_strategy
    if oracle == flows.strategy or oracle not in params.strategies:
        oracle = None
    root = Path(work_dir if work_dir is not None else flows.work_dir).resolve()
    return UpgradeChain(
        params_path=params_path,
        params=params,
        layout=StudyLayout(root),
        strategy=flows.strategy,
        oracle=oracle,
        heads=tuple(flows.heads),
        registered_model=registered_model_name(
            flows.model_name or f"{params.registry.model_name}-flows", SEQUENTIAL
        ),
    )
