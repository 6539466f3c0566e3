"""Where the flows keep their files, and the settings one flow run works with.

The work directory mirrors the DVC pipeline's sequential layout, so the commands find their inputs
under the names they expect::

    <work>/data/manifests/<dataset>.parquet       prepare
    <work>/data/splits/sequential/                split: gen0.parquet, gen1.parquet, ..., query, gallery
    <work>/data/validation/                       validate (Great Expectations reports)
    <work>/data/proposed/                         new split files while they are validated
    <work>/models/sequential/gen0                 the first generation, shared by every chain
    <work>/models/sequential/<strategy>/gen<i>    later generations (the Δ↓ oracle chain beside them)
    <work>/embeddings/sequential/...              the same names: query.npy, gallery.npy
    <work>/heads/sequential/<strategy>/gen<i>/    heads between gen<i-1> and gen<i>
    <work>/metrics/sequential/<strategy>/         evaluate (cross_model.*, summary.json); gates-gen<i>.json
    <work>/plots/sequential/<strategy>/           evaluate (the compatibility heatmap)
    <work>/registry/gen<i>.json                   register, one file per cycle
    <work>/reports/                               one report per cycle, the lineage report
    <work>/store/                                 the gallery store the backfill flow keeps on champion

Generation numbers are the registry's: the chain ``gen0 → <strategy>/gen1 → <strategy>/gen2 …``.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from pydantic import ValidationError

from modelupgrade.config import Params, SequentialParams
from modelupgrade.errors import UserError
from modelupgrade.layout import OLD_MODEL, SEQUENTIAL
from modelupgrade.plugins import load_params

FIRST_GENERATION_KEY = OLD_MODEL


@dataclass(frozen=True)
class WorkDir:
    root: Path
    dataset: str

    @property
    def manifest(self) -> Path:
        return self.root / "data" / "manifests" / f"{self.dataset}.parquet"

    @property
    def splits_root(self) -> Path:
        return self.root / "data" / "splits"

    @property
    def splits(self) -> Path:
        return self.splits_root / SEQUENTIAL

    @property
    def validation(self) -> Path:
        return self.root / "data" / "validation"

    @property
    def proposed_splits(self) -> Path:
        return self.root / "data" / "proposed" / SEQUENTIAL

    @property
    def proposed_validation(self) -> Path:
        return self.root / "data" / "proposed" / "validation"

    @property
    def models_root(self) -> Path:
        return self.root / "models"

    @property
    def embeddings_root(self) -> Path:
        return self.root / "embeddings"

    @property
    def heads_root(self) -> Path:
        return self.root / "heads"

    @property
    def metrics_root(self) -> Path:
        return self.root / "metrics"

    @property
    def plots_root(self) -> Path:
        return self.root / "plots"

    @property
    def reports(self) -> Path:
        return self.root / "reports"

    @property
    def store(self) -> Path:
        return self.root / "store"

    def snapshot(self, generation: int) -> Path:
        return self.splits / f"gen{generation}.parquet"

    def model(self, strategy: str, generation: int) -> Path:
        return self._generation_dir(self.models_root, strategy, generation)

    def embeddings(self, strategy: str, generation: int) -> Path:
        return self._generation_dir(self.embeddings_root, strategy, generation)

    def snapshot_embeddings(self, strategy: str, generation: int, snapshot_generation: int) -> Path:
        """Where a model's embeddings of a training snapshot go (the inputs of heads)."""
        return self.embeddings(strategy, generation) / f"gen{snapshot_generation}.npy"

    def heads(self, strategy: str, generation: int) -> Path:
        return self.heads_root / SEQUENTIAL / strategy / f"gen{generation}"

    def metrics(self, strategy: str) -> Path:
        return self.metrics_root / SEQUENTIAL / strategy

    def heatmap(self, strategy: str) -> Path:
        return self.plots_root / SEQUENTIAL / strategy / "cross_model_heatmap.png"

    def gate_metrics(self, generation: int) -> Path:
        return self.metrics_root / SEQUENTIAL / f"gates-gen{generation}.json"

    def registration(self, generation: int) -> Path:
        return self.root / "registry" / f"gen{generation}.json"

    @staticmethod
    def _generation_dir(root: Path, strategy: str, generation: int) -> Path:
        if generation == 0:
            return root / SEQUENTIAL / FIRST_GENERATION_KEY
        return root / SEQUENTIAL / strategy / f"gen{generation}"


def model_key(strategy: str, generation: int) -> str:
    """The registry's name of a chain generation (as the register stage names it)."""
    return FIRST_GENERATION_KEY if generation == 0 else f"{strategy}/gen{generation}"


def generation_of(key: str, strategy: str) -> int | None:
    """The generation a registry model key names in ``strategy``'s chain, None for other keys."""
    if key == FIRST_GENERATION_KEY:
        return 0
    prefix = f"{strategy}/gen"
    if key.startswith(prefix) and key[len(prefix):].isdigit():
        return int(key[len(prefix):])
    return None


@dataclass(frozen=True)
class FlowSettings:
    """One flow run's view of params.yaml: the chain's strategy, its oracle, its registry name."""

    params_path: Path
    params: Params
    work: WorkDir
    strategy: str
    # The strategy whose models give Δ↓ (evaluation.oracle_strategy), None when not trainable here.
    oracle: str | None
    heads: tuple[str, ...]
    model_name: str

    @property
    def registered_model(self) -> str:
        from modelupgrade.registry import registered_model_name

        return registered_model_name(self.model_name, SEQUENTIAL)

    @property
    def evaluated_strategies(self) -> list[str]:
        return [self.strategy] + ([self.oracle] if self.oracle else [])

    def stage_params(self, generations: int) -> Params:
        """The params the evaluate and register stages see for a chain of ``generations`` models.

        Both stages count a chain's generations from ``sequential.fractions``; the fractions given
        here are each snapshot's share of the newest one, so a snapshot the user supplied counts too.
        """
        if generations == 1:
            # SequentialParams plans upgrades, so it asks for two snapshots; a chain of one is gen0.
            sequential = self.params.sequential.model_copy(update={"fractions": [1.0], "strategies": [self.strategy]})
        else:
            sizes = [_row_count(self.work.snapshot(g)) for g in range(generations)]
            try:
                sequential = SequentialParams(
                    kind=self.params.sequential.kind,
                    fractions=[size / sizes[-1] for size in sizes],
                    strategies=[self.strategy],
                )
            except ValidationError as err:
                raise UserError(
                    f"the data snapshots gen0..gen{generations - 1} in {self.work.splits} do not grow "
                    f"({sizes} images): {err.errors()[0]['msg']}",
                    hint="each generation trains on more data than the one before it",
                ) from None
        registry = self.params.registry.model_copy(update={"model_name": self.model_name})
        return self.params.model_copy(update={"sequential": sequential, "registry": registry})


def load_settings(params_path: str | Path, work_dir: str | Path | None = None) -> FlowSettings:
    """Read params.yaml and check the ``flows`` section's references to other sections."""
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
    oracle = params.evaluation.oracle_strategy
    if oracle == flows.strategy or oracle not in params.strategies:
        oracle = None
    root = Path(work_dir if work_dir is not None else flows.work_dir).resolve()
    return FlowSettings(
        params_path=params_path,
        params=params,
        work=WorkDir(root, params.dataset.name),
        strategy=flows.strategy,
        oracle=oracle,
        heads=tuple(flows.heads),
        model_name=flows.model_name or f"{params.registry.model_name}-flows",
    )


def _row_count(path: Path) -> int:
    import pyarrow.parquet as pq

    if not path.is_file():
        raise UserError(f"data snapshot {path} does not exist", hint="the cycle that trains on it prepares it")
    return pq.ParquetFile(path).metadata.num_rows
